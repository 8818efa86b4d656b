//! Every verb through the Rust test driver, on two and more HCAs sharing one fabric.

use hca_model::abi::*;
use hca_model::Fabric;
use hca_test_driver::*;

#[test]
fn test_bar2_header_identifies_the_hca_and_its_lid() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let b = Driver::new(Some(&fabric), 4);
    let info: HcaDevInfo = a.hca.bar2().read_obj(BAR2_INFO_OFFSET);
    assert_eq!(info.signature, SIGNATURE);
    assert_eq!(info.abi_version, ABI_VERSION);
    assert_eq!((info.lid, u32::from(info.port_state)), (1, PORT_ACTIVE));
    assert_eq!(b.lid(), 2, "the fabric hands out LIDs in attach order");
    a.hca.set_doorbell_peer(7);
    let info: HcaDevInfo = a.hca.bar2().read_obj(BAR2_INFO_OFFSET);
    assert_eq!(
        info.doorbell_peer, 7,
        "the guest learns the device's peer id from BAR2"
    );
    let ev = a.drain_eq(VEC_ASYNC);
    assert_eq!(u32::from(ev[0].event_type), EV_PORT_ACTIVE);
    assert!(a.irq.get(VEC_ASYNC) >= 1);

    let (st, out) = a.cmd_raw(CMD_QUERY_PORT, &[], 0);
    assert_eq!(st, CMD_OK);
    let port: HcaPortAttr = decode(&out);
    assert_eq!((port.lid, u32::from(port.state)), (1, PORT_ACTIVE));
    let (st, out) = a.cmd_raw(CMD_QUERY_DEVICE, &[], 0);
    assert_eq!(st, CMD_OK);
    let dev: HcaDeviceAttr = decode(&out);
    assert_eq!((dev.max_qp, dev.local_dma_lkey), (MAX_QP, LOCAL_DMA_LKEY));
}

#[test]
fn test_port_is_down_until_attached() {
    let a = Driver::new(None, 4);
    let info: HcaDevInfo = a.hca.bar2().read_obj(BAR2_INFO_OFFSET);
    assert_eq!((info.lid, u32::from(info.port_state)), (0, PORT_DOWN));
}

#[test]
fn test_command_with_event_flag_raises_vector_0() {
    let mut a = Driver::new(None, 4);
    let (st, _) = a.cmd_raw(CMD_ALLOC_PD, &[], CMD_FLAG_EVENT);
    assert_eq!(st, CMD_OK);
    let ev = a.drain_eq(VEC_ASYNC);
    assert_eq!(ev.len(), 1);
    assert_eq!(u32::from(ev[0].event_type), EV_CMD_DONE);
    assert_eq!(ev[0].data, CMD_OK);
    assert_eq!(a.irq.get(VEC_ASYNC), 1);
}

/// Sends `len` bytes A -> B and checks data and both CQEs.
fn send_and_check(mtu: u8, len: usize, with_imm: bool) {
    let mut p = Pair::new(mtu);
    let src = p.a.alloc(len as u64 + 1, 64);
    let dst = p.b.alloc(len as u64 + 64, 64);
    let data = pattern(len, 3);
    p.a.write(src, &data);
    p.b.post_recv(&mut p.qb, 77, &[sge(dst, len as u32 + 64, p.key_b)]);
    let mut wr = send_wr(
        11,
        if with_imm { WR_SEND_IMM } else { WR_SEND },
        WQE_SIGNALED,
    );
    wr.imm = 0xfeed_f00d;
    p.a.post_send(&mut p.qa, wr, &[sge(src, len as u32, p.key_a)]);

    let rc = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(rc.len(), 1);
    let r = rc[0];
    assert_eq!(
        (r.wr_id, u32::from(r.status), u32::from(r.opcode)),
        (77, WC_SUCCESS, CQE_OP_RECV)
    );
    assert_eq!(r.byte_len as usize, len);
    assert_eq!((r.src_qp, r.slid, r.qpn), (p.qa.qpn, p.a.lid(), p.qb.qpn));
    assert_eq!(r.imm, if with_imm { 0xfeed_f00d } else { 0 });
    assert_eq!(u32::from(r.flags) & CQE_FLAG_IMM != 0, with_imm);
    assert_eq!(p.b.read(dst, len), data);
    let sc = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(sc.len(), 1);
    assert_eq!((sc[0].wr_id, u32::from(sc[0].status)), (11, WC_SUCCESS));
    assert_eq!(u32::from(sc[0].opcode), CQE_OP_SEND);
}

#[test]
fn test_send_recv_delivers_data_at_every_size_and_mtu() {
    for (mtu, len) in [(5, 8), (5, 4096), (1, 257), (3, 10_000), (5, 0), (2, 1)] {
        send_and_check(mtu, len, false);
    }
}

#[test]
fn test_send_with_immediate_carries_the_immediate() {
    send_and_check(5, 100, true);
    send_and_check(1, 1000, true);
}

#[test]
fn test_send_scatters_into_several_receive_sges_and_gathers_from_several_send_sges() {
    let mut p = Pair::new(1); // 256-byte packets, so pieces and packets cut differently
    let s1 = p.a.alloc(300, 8);
    let s2 = p.a.alloc(500, 8);
    let (d1, d2, d3) = (p.b.alloc(100, 8), p.b.alloc(100, 8), p.b.alloc(1000, 8));
    let data = pattern(800, 9);
    p.a.write(s1, &data[..300]);
    p.a.write(s2, &data[300..]);
    let kb = p.key_b;
    p.b.post_recv(
        &mut p.qb,
        1,
        &[sge(d1, 100, kb), sge(d2, 100, kb), sge(d3, 1000, kb)],
    );
    let ka = p.key_a;
    p.a.post_send(
        &mut p.qa,
        send_wr(2, WR_SEND, WQE_SIGNALED),
        &[sge(s1, 300, ka), sge(s2, 500, ka)],
    );
    assert_eq!(p.b.drain_cq(&mut p.cq_b)[0].byte_len, 800);
    let mut got = p.b.read(d1, 100);
    got.extend(p.b.read(d2, 100));
    got.extend(p.b.read(d3, 600));
    assert_eq!(got, data);
}

#[test]
fn test_small_messages_gathered_from_several_sges_arrive_whole() {
    // Small payloads travel inside the packet, read when the WR is sent; sizes on both
    // sides of that limit, gathered from three SGEs, by SEND and by RDMA WRITE.
    let mut p = Pair::new(5);
    let src = p.a.alloc(64, 8);
    let (dst, wdst) = (p.b.alloc(64, 8), p.b.alloc(64, 8));
    let wkey =
        p.b.reg_mr(p.pd_b, wdst, 64, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    for len in 0..=20u32 {
        let data = pattern(len as usize, len as u8);
        p.a.write(src, &data);
        // Three pieces, the first two a third each, apart in memory.
        let (a, b) = (len / 3, len / 3);
        let ka = p.key_a;
        let parts = [
            sge(src, a, ka),
            sge(src + 24, b, ka),
            sge(src + 48, len - a - b, ka),
        ];
        p.a.write(src + 24, &data[a as usize..(a + b) as usize]);
        p.a.write(src + 48, &data[(a + b) as usize..]);
        p.b.write(dst, &[0xee; 64]);
        p.b.post_recv(&mut p.qb, u64::from(len), &[sge(dst, 64, p.key_b)]);
        p.a.post_send(&mut p.qa, send_wr(1, WR_SEND, WQE_SIGNALED), &parts);
        let r = p.b.drain_cq(&mut p.cq_b);
        assert_eq!((r.len(), r[0].byte_len), (1, len), "SEND of {len}");
        assert_eq!(p.b.read(dst, len as usize), data, "SEND of {len}");
        assert_eq!(p.b.read(dst + u64::from(len), 1), [0xee], "SEND of {len}");

        p.b.write(wdst, &[0xee; 64]);
        let mut wr = send_wr(2, WR_RDMA_WRITE, WQE_SIGNALED);
        (wr.remote_addr, wr.rkey) = (wdst, wkey);
        p.a.post_send(&mut p.qa, wr, &parts);
        let done = p.a.drain_statuses(&mut p.cq_a);
        assert_eq!(done, [(1, WC_SUCCESS), (2, WC_SUCCESS)], "len {len}");
        assert_eq!(p.b.read(wdst, len as usize), data, "WRITE of {len}");
        assert_eq!(p.b.read(wdst + u64::from(len), 1), [0xee], "WRITE of {len}");
    }
}

#[test]
fn test_inline_send_needs_no_lkey() {
    let mut p = Pair::new(5);
    let dst = p.b.alloc(64, 8);
    p.b.post_recv(&mut p.qb, 5, &[sge(dst, 64, p.key_b)]);
    let mut wr = send_wr(6, WR_SEND, WQE_SIGNALED | WQE_INLINE);
    wr.inline_len = 13;
    p.a.write_send(&mut p.qa, &wr, &[], b"inline hello!");
    p.a.ring_sq(&p.qa);
    assert_eq!(p.b.drain_cq(&mut p.cq_b)[0].byte_len, 13);
    assert_eq!(p.b.read(dst, 13), b"inline hello!");
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 1);
}

#[test]
fn test_rdma_write_places_data_without_consuming_a_receive() {
    for (mtu, len) in [(5usize, 4096usize), (5, 65536), (3, 3000), (5, 1)] {
        let mut p = Pair::new(mtu as u8);
        let src = p.a.alloc(len as u64, 64);
        let dst = p.b.alloc(len as u64, 4096);
        let rkey = p.b.reg_mr(
            p.pd_b,
            dst,
            len as u64,
            ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
        );
        let data = pattern(len, 1);
        p.a.write(src, &data);
        let mut wr = send_wr(21, WR_RDMA_WRITE, WQE_SIGNALED);
        wr.remote_addr = dst;
        wr.rkey = rkey;
        p.a.post_send(&mut p.qa, wr, &[sge(src, len as u32, p.key_a)]);
        let c = p.a.drain_cq(&mut p.cq_a);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (u32::from(c[0].status), u32::from(c[0].opcode)),
            (WC_SUCCESS, CQE_OP_RDMA_WRITE)
        );
        assert_eq!(p.b.read(dst, len), data, "mtu {mtu} len {len}");
        assert!(p.b.drain_cq(&mut p.cq_b).is_empty());
    }
}

#[test]
fn test_rdma_write_crosses_guest_memory_regions() {
    // Driver memory is two regions split at the middle (4 MiB of 8): straddle both sides.
    let mut p = Pair::new(5);
    let len = 3 * 4096;
    let src = 4 * MIB - 5000;
    let dst = 4 * MIB - 7000;
    let data = pattern(len, 42);
    p.a.write(src, &data);
    let mut wr = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    wr.remote_addr = dst;
    wr.rkey = p.key_b;
    p.a.post_send(&mut p.qa, wr, &[sge(src, len as u32, p.key_a)]);
    assert_eq!(u32::from(p.a.drain_cq(&mut p.cq_a)[0].status), WC_SUCCESS);
    assert_eq!(p.b.read(dst, len), data);
}

#[test]
fn test_rdma_write_with_immediate_consumes_a_receive_and_reports_length() {
    let mut p = Pair::new(2);
    let src = p.a.alloc(2000, 64);
    let dst = p.b.alloc(2000, 64);
    p.a.write(src, &pattern(2000, 5));
    p.b.post_recv(&mut p.qb, 99, &[]);
    let mut wr = send_wr(1, WR_RDMA_WRITE_IMM, 0);
    wr.remote_addr = dst;
    wr.rkey = p.key_b;
    wr.imm = 1234;
    p.a.post_send(&mut p.qa, wr, &[sge(src, 2000, p.key_a)]);
    let r = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(r.len(), 1);
    assert_eq!(u32::from(r[0].opcode), CQE_OP_RECV_RDMA_IMM);
    assert_eq!((r[0].wr_id, r[0].imm, r[0].byte_len), (99, 1234, 2000));
    assert_eq!(p.b.read(dst, 2000), pattern(2000, 5));
    assert!(
        p.a.drain_cq(&mut p.cq_a).is_empty(),
        "the WR was unsignaled"
    );
}

#[test]
fn test_rdma_read_fetches_remote_data() {
    for (mtu, len) in [(5u8, 64u32), (1, 1000), (5, 100_000), (5, 0)] {
        let mut p = Pair::new(mtu);
        let remote = p.b.alloc(u64::from(len) + 1, 64);
        let local = p.a.alloc(u64::from(len) + 1, 64);
        p.b.write(remote, &pattern(len as usize, 8));
        let mut wr = send_wr(31, WR_RDMA_READ, WQE_SIGNALED);
        wr.remote_addr = remote;
        wr.rkey = p.key_b;
        p.a.post_send(&mut p.qa, wr, &[sge(local, len, p.key_a)]);
        let c = p.a.drain_cq(&mut p.cq_a);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (
                u32::from(c[0].status),
                u32::from(c[0].opcode),
                c[0].byte_len
            ),
            (WC_SUCCESS, CQE_OP_RDMA_READ, len)
        );
        assert_eq!(p.a.read(local, len as usize), pattern(len as usize, 8));
    }
}

#[test]
fn test_atomics_compare_swap_and_fetch_add() {
    let mut p = Pair::new(5);
    let remote = p.b.alloc(8, 8);
    let local = p.a.alloc(16, 8);
    p.b.write(remote, &40u64.to_le_bytes());
    let mut wr = send_wr(1, WR_ATOMIC_FETCH_ADD, WQE_SIGNALED);
    wr.remote_addr = remote;
    wr.rkey = p.key_b;
    wr.compare_add = 2;
    p.a.post_send(&mut p.qa, wr, &[sge(local, 8, p.key_a)]);
    let mut wr = send_wr(2, WR_ATOMIC_CMP_SWP, WQE_SIGNALED);
    wr.remote_addr = remote;
    wr.rkey = p.key_b;
    wr.compare_add = 42;
    wr.swap = 7;
    p.a.post_send(&mut p.qa, wr, &[sge(local + 8, 8, p.key_a)]);
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(c.len(), 2);
    assert_eq!(u32::from(c[0].opcode), CQE_OP_FETCH_ADD);
    assert_eq!(u32::from(c[1].opcode), CQE_OP_COMP_SWAP);
    assert_eq!(p.a.read(local, 8), 40u64.to_le_bytes());
    assert_eq!(p.a.read(local + 8, 8), 42u64.to_le_bytes());
    assert_eq!(p.b.read(remote, 8), 7u64.to_le_bytes());
}

/// ATOMIC WRITE (IBTA 1.5): the WQE's 8 bytes land at an aligned address under an rkey that
/// allows remote write; a misaligned address is an invalid request, a key without remote
/// write a remote access error.
#[test]
fn test_atomic_write_stores_its_eight_bytes_where_the_key_allows() {
    let bytes = *b"8 bytes!";
    let cases = [
        (0, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE, WC_SUCCESS),
        (
            4,
            ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
            WC_REM_INV_REQ_ERR,
        ),
        (0, ACCESS_REMOTE_READ, WC_REM_ACCESS_ERR),
    ];
    for (misalign, access, want) in cases {
        let mut p = Pair::new(5);
        let remote = p.b.alloc(64, 64);
        let rkey = p.b.reg_mr(p.pd_b, remote, 64, access);
        let mut wr = send_wr(1, WR_ATOMIC_WRITE, WQE_SIGNALED);
        (wr.remote_addr, wr.rkey) = (remote + 8 + misalign, rkey);
        wr.compare_add = u64::from_le_bytes(bytes);
        p.a.post_send(&mut p.qa, wr, &[]);
        let c = p.a.drain_cq(&mut p.cq_a);
        assert_eq!(
            u32::from(c[0].status),
            want,
            "access {access:#x}, +{misalign}"
        );
        if want == WC_SUCCESS {
            assert_eq!(u32::from(c[0].opcode), CQE_OP_ATOMIC_WRITE);
            assert_eq!(p.b.read(remote + 8, 8), bytes);
        } else {
            assert_eq!(p.b.read(remote, 64), vec![0; 64]);
        }
    }
}

/// Masked atomics (as RDS posts every atomic): a compare-and-swap that compares and swaps
/// only some bits, one whose compared bits differ, and a fetch-and-add of eight byte-wide
/// counters whose carries stay in their bytes; each result buffer gets the value before.
#[test]
fn test_masked_atomics_compare_and_add_only_within_their_masks() {
    let mut p = Pair::new(5);
    let remote = p.b.alloc(16, 8);
    let local = p.a.alloc(24, 8);
    p.b.write(remote, &0x1234_5678_0000_00aau64.to_le_bytes());
    p.b.write(remote + 8, &0x00ff_0102_0304_0506u64.to_le_bytes());
    // Equal under the high half, unequal below it; only the low byte is swapped.
    let mut cs = masked_atomic_wr(1, WR_MASKED_CMP_SWP, remote, p.key_b);
    (cs.compare_add, cs.compare_add_mask) = (0x1234_5678_ffff_ffff, !0 << 32);
    (cs.swap, cs.swap_mask) = (0xffff_ffff_ffff_ff55, 0xff);
    p.a.post_send(&mut p.qa, as_send_wqe(&cs), &[sge(local, 8, p.key_a)]);
    // A compared bit differs now: nothing is swapped.
    cs.wr_id = 2;
    cs.compare_add = 0x1234_5679_0000_0000;
    p.a.post_send(&mut p.qa, as_send_wqe(&cs), &[sge(local + 8, 8, p.key_a)]);
    let mut fa = masked_atomic_wr(3, WR_MASKED_FETCH_ADD, remote + 8, p.key_b);
    (fa.compare_add, fa.compare_add_mask) = (0x0101_0101_0101_0101, 0x8080_8080_8080_8080);
    p.a.post_send(&mut p.qa, as_send_wqe(&fa), &[sge(local + 16, 8, p.key_a)]);
    let c = p.a.drain_cq(&mut p.cq_a);
    let got: Vec<_> = c
        .iter()
        .map(|c| {
            (
                c.wr_id,
                u32::from(c.status),
                u32::from(c.opcode),
                c.byte_len,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, WC_SUCCESS, CQE_OP_MASKED_COMP_SWAP, 8),
            (2, WC_SUCCESS, CQE_OP_MASKED_COMP_SWAP, 8),
            (3, WC_SUCCESS, CQE_OP_MASKED_FETCH_ADD, 8),
        ]
    );
    let word = |d: &mut hca_test_driver::Driver<_>, at| {
        u64::from_le_bytes(d.read(at, 8).try_into().unwrap())
    };
    assert_eq!(word(&mut p.a, local), 0x1234_5678_0000_00aa);
    assert_eq!(word(&mut p.a, local + 8), 0x1234_5678_0000_0055);
    assert_eq!(word(&mut p.b, remote), 0x1234_5678_0000_0055);
    assert_eq!(word(&mut p.a, local + 16), 0x00ff_0102_0304_0506);
    assert_eq!(word(&mut p.b, remote + 8), 0x0100_0203_0405_0607);
}

#[test]
fn test_fenced_send_waits_for_the_read_before_it() {
    let mut p = Pair::new(5);
    let remote = p.b.alloc(8, 8);
    let local = p.a.alloc(8, 8);
    let dst = p.b.alloc(8, 8);
    p.b.write(remote, &0x1122_3344_5566_7788u64.to_le_bytes());
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
    let mut rd = send_wr(1, WR_RDMA_READ, 0);
    rd.remote_addr = remote;
    rd.rkey = p.key_b;
    rd.num_sge = 1;
    p.a.write_send(&mut p.qa, &rd, &[sge(local, 8, p.key_a)], &[]);
    let mut sd = send_wr(2, WR_SEND, WQE_SIGNALED | WQE_FENCE);
    sd.num_sge = 1;
    p.a.write_send(&mut p.qa, &sd, &[sge(local, 8, p.key_a)], &[]);
    p.a.ring_sq(&p.qa);
    // The send carried what the read fetched: it did not leave before the read finished.
    assert_eq!(p.b.read(dst, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 1);
}

#[test]
fn test_many_qps_share_one_cq() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 8);
    let mut b = Driver::new(Some(&fabric), 8);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ka, kb) = (a.reg_dma_mr(pa, ALL_ACCESS), b.reg_dma_mr(pb, ALL_ACCESS));
    let mut cqa = a.create_cq(8);
    let mut cqb = b.create_cq(8);
    let mut pairs = Vec::new();
    for _ in 0..8 {
        let qa = a.create_qp(QPT_RC, pa, cqa.cqn, cqa.cqn);
        let qb = b.create_qp(QPT_RC, pb, cqb.cqn, cqb.cqn);
        let (la, lb) = (a.lid(), b.lid());
        a.bring_up_rc(qa.qpn, lb, qb.qpn, ALL_ACCESS, 5);
        b.bring_up_rc(qb.qpn, la, qa.qpn, ALL_ACCESS, 5);
        pairs.push((qa, qb));
    }
    let buf = a.alloc(8, 8);
    for (i, (qa, qb)) in pairs.iter_mut().enumerate() {
        let dst = b.alloc(8, 8);
        b.post_recv(qb, i as u64, &[sge(dst, 8, kb)]);
        a.write(buf, &(i as u64).to_le_bytes());
        a.post_send(
            qa,
            send_wr(100 + i as u64, WR_SEND, WQE_SIGNALED),
            &[sge(buf, 8, ka)],
        );
    }
    let recvs = b.drain_cq(&mut cqb);
    assert_eq!(recvs.len(), 8);
    let mut qpns: Vec<u32> = recvs.iter().map(|c| c.qpn).collect();
    qpns.dedup();
    assert_eq!(qpns.len(), 8, "each CQE names its own QP");
    assert_eq!(a.drain_cq(&mut cqa).len(), 8);
}

#[test]
fn test_resize_cq_moves_unpolled_cqes_in_order_and_goes_on_in_the_new_ring() {
    let mut p = Pair::new(5);
    let mut cq = p.b.create_cq(2);
    let (mut qa, mut qb) = p.connect_more((p.cq_a.cqn, cq.cqn), 4, 0);
    let buf = p.a.alloc(8, 8);
    let sink = p.b.alloc(8 * 64, 8);
    let mut send = |p: &mut Pair, qb: &mut QpH, i: u64| {
        p.b.post_recv(qb, i, &[sge(sink + 8 * i, 8, p.key_b)]);
        p.a.write(buf, &i.to_le_bytes());
        p.a.post_send(&mut qa, send_wr(i, WR_SEND, 0), &[sge(buf, 8, p.key_a)]);
    };
    for i in 0..3 {
        send(&mut p, &mut qb, i);
    }
    assert_eq!(p.b.poll_cq(&mut cq).map(|c| c.wr_id), Some(0));
    // Two unpolled CQEs do not fit in a ring of one: refused, and the CQ goes on as it was.
    assert_eq!(p.b.resize_cq(&mut cq, 0), CMD_BAD_PARAM);
    let old_ring = (cq.ring, p.b.read(cq.ring, 32 << cq.log));
    assert_eq!(p.b.resize_cq(&mut cq, 4), CMD_OK);
    // The new ring holds 16: the two moved and 14 new ones fill it.
    for i in 3..17 {
        send(&mut p, &mut qb, i);
    }
    let ids: Vec<u64> = p.b.drain_cq(&mut cq).iter().map(|c| c.wr_id).collect();
    assert_eq!(
        ids,
        (1..17).collect::<Vec<_>>(),
        "moved CQEs first, then new ones"
    );
    assert_eq!(
        p.b.read(old_ring.0, old_ring.1.len()),
        old_ring.1,
        "old ring untouched"
    );
    // Smaller again, with three CQEs waiting.
    for i in 17..20 {
        send(&mut p, &mut qb, i);
    }
    assert_eq!(p.b.resize_cq(&mut cq, 2), CMD_OK);
    let ids: Vec<u64> = p.b.drain_cq(&mut cq).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [17, 18, 19]);
    for i in 20..23 {
        send(&mut p, &mut qb, i);
        assert_eq!(p.b.poll_cq(&mut cq).map(|c| c.wr_id), Some(i));
    }
    for i in 0..23 {
        assert_eq!(p.b.read(sink + 8 * i, 8), i.to_le_bytes());
    }
}

/// A resize counts the CQEs of sends posted and named before it even when their send
/// doorbell has not reached the device yet (doorbells of different classes travel apart):
/// rdma-core's test_resize_cq posts UD sends (complete once sent) and at once shrinks the
/// CQ below them.
#[test]
fn test_resize_cq_counts_the_completions_of_work_rung_before_it() {
    let mut p = Pair::new(5);
    let mut cq = p.a.create_cq(3);
    let mut ua = p.a.create_qp(QPT_UD, p.pd_a, cq.cqn, cq.cqn);
    p.a.bring_up_ud(ua.qpn, 0x1111, false);
    let buf = p.a.alloc(64, 64);
    for i in 0..3 {
        let mut wqe = send_wr(i, WR_SEND, WQE_SIGNALED);
        (wqe.ud_dlid, wqe.ud_remote_qpn, wqe.ud_qkey) = (p.b.lid(), 0x77, 0x1111);
        p.a.write_send(&mut ua, &wqe, &[sge(buf, 64, p.key_a)], &[]);
    }
    // The producer index and the ring's name are written; the doorbell is still on its way.
    p.a.hca.bar2().store_u32(ua.db, ua.sq_pi);
    if let Some(ring) = ua.ring {
        name_in_ring(p.a.hca.bar2(), ring, ua.qpn);
    }
    assert_eq!(
        p.a.resize_cq(&mut cq, 0),
        CMD_BAD_PARAM,
        "3 CQEs in a ring of 1"
    );
    let done: Vec<u64> = p.a.drain_cq(&mut cq).iter().map(|c| c.wr_id).collect();
    assert_eq!(done, [0, 1, 2]);
}

#[test]
fn test_resize_cq_refuses_a_bad_handle_size_or_ring() {
    let mut d = Driver::new(None, 8);
    let mut cq = d.create_cq(3);
    let mut bad = CqH {
        cqn: 999,
        ..d.create_cq(1)
    };
    assert_eq!(d.resize_cq(&mut bad, 3), CMD_BAD_HANDLE);
    assert_eq!(d.resize_cq(&mut cq, MAX_CQ_LOG_CQE + 1), CMD_BAD_PARAM);
    let a = HcaCmdResizeCq {
        ring_addr: u64::MAX - 4095,
        cqn: cq.cqn,
        log_entries: 3,
    };
    assert_eq!(d.cmd(CMD_RESIZE_CQ, &a).0, CMD_BAD_ADDRESS);
    assert_eq!(d.resize_cq(&mut cq, 5), CMD_OK);
}

#[test]
fn test_unsignaled_sends_with_an_occasional_signaled_one() {
    // The paper's section 3.1: unsignaled sends, one signaled WR in 16 reclaims the ring.
    let mut p = Pair::new(5);
    let (mut qa, mut qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 4, 0);
    let buf = p.a.alloc(8, 8);
    let sink = p.b.alloc(8 * 200, 8);
    let mut signaled_seen = 0;
    let mut received = 0;
    for i in 0..200u64 {
        p.b.post_recv(&mut qb, i, &[sge(sink + 8 * i, 8, p.key_b)]);
        p.a.write(buf, &i.to_le_bytes());
        let flags = if i % 16 == 15 { WQE_SIGNALED } else { 0 };
        p.a.post_send(&mut qa, send_wr(i, WR_SEND, flags), &[sge(buf, 8, p.key_a)]);
        signaled_seen += p.a.drain_cq(&mut p.cq_a).len();
        received += p.b.drain_cq(&mut p.cq_b).len();
    }
    assert_eq!(signaled_seen, 200 / 16);
    assert_eq!(received, 200);
    for i in 0..200u64 {
        assert_eq!(p.b.read(sink + 8 * i, 8), i.to_le_bytes());
    }
}

#[test]
fn test_sig_all_qp_completes_every_wr() {
    let mut p = Pair::new(5);
    let (mut qa, _qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 4, QP_FLAG_SIG_ALL);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    for i in 0..3 {
        let mut wr = send_wr(i, WR_RDMA_WRITE, 0);
        wr.remote_addr = dst;
        wr.rkey = p.key_b;
        p.a.post_send(&mut qa, wr, &[sge(src, 8, p.key_a)]);
    }
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 3);
}

/// Two ports on one fabric, each with a PD, a CQ and its QP of `qp_type` (QP0 or QP1),
/// which must get its fixed number, up with `qkey`.
struct Ports {
    fabric: Fabric,
    a: Driver,
    b: Driver,
    pds: (u32, u32),
    cqa: CqH,
    cqb: CqH,
    qa: QpH,
    qb: QpH,
}

fn management_qps(qp_type: u32, qpn: u32, qkey: u32) -> Ports {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let mut b = Driver::new(Some(&fabric), 4);
    let pds = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(6), b.create_cq(6));
    let qa = a.create_qp(qp_type, pds.0, cqa.cqn, cqa.cqn);
    let qb = b.create_qp(qp_type, pds.1, cqb.cqn, cqb.cqn);
    assert_eq!((qa.qpn, qb.qpn), (qpn, qpn));
    a.bring_up_ud(qa.qpn, qkey, true);
    b.bring_up_ud(qb.qpn, qkey, true);
    Ports {
        fabric,
        a,
        b,
        pds,
        cqa,
        cqb,
        qa,
        qb,
    }
}

#[test]
fn test_ud_send_to_gsi_qp_has_grh_room_and_source() {
    let Ports {
        mut a,
        mut b,
        mut cqa,
        mut cqb,
        qa: mut ga,
        qb: mut gb,
        ..
    } = management_qps(QPT_GSI, GSI_QPN, GSI_QKEY);
    let rbuf = b.alloc(40 + 256, 64);
    b.write(rbuf, &[0xaa; 40]);
    b.post_recv(&mut gb, 3, &[sge(rbuf, 40 + 256, LOCAL_DMA_LKEY)]);
    let mad = pattern(256, 77);
    let sbuf = a.alloc(256, 64);
    a.write(sbuf, &mad);
    let mut wr = send_wr(4, WR_SEND, WQE_SIGNALED);
    wr.ud_dlid = b.lid();
    wr.ud_remote_qpn = GSI_QPN;
    wr.ud_qkey = GSI_QKEY;
    a.post_send(&mut ga, wr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let r = b.drain_cq(&mut cqb);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].byte_len, r[0].src_qp, r[0].slid),
        (296, GSI_QPN, a.lid())
    );
    assert_eq!(b.read(rbuf, 40), vec![0u8; 40]);
    assert_eq!(b.read(rbuf + 40, 256), mad);
    assert_eq!(a.drain_cq(&mut cqa).len(), 1);
}

/// An SMP's size.
const MAD_SIZE_SMP: usize = 256;

/// QP0 carries subnet management packets (smpquery, perfquery and ib_mad's SMA replies):
/// one per port at QPN 0; what one port's QP0 sends reaches another's QP0 whatever its
/// Q_Key, and only QP0 takes it; a datagram from any other QP to QPN 0 is dropped.
#[test]
fn test_smps_go_from_qp0_to_qp0_only() {
    // ib_mad brings QP0 up with Q_Key 0.
    let Ports {
        fabric,
        mut a,
        mut b,
        pds: (pa, pb),
        mut cqa,
        mut cqb,
        qa: mut sa,
        qb: mut sb,
    } = management_qps(QPT_SMI, SMI_QPN, 0);
    assert_eq!(
        a.try_create_qp(QPT_SMI, pa, (cqa.cqn, cqa.cqn), (6, 6), 0)
            .err(),
        Some(CMD_BUSY),
        "one QP0 per port"
    );
    let mut ua = a.create_qp(QPT_UD, pa, cqa.cqn, cqa.cqn);
    let mut ub = b.create_qp(QPT_UD, pb, cqb.cqn, cqb.cqn);
    a.bring_up_ud(ua.qpn, 0x1111, false);
    b.bring_up_ud(ub.qpn, 0x1111, false);
    let (rbuf, ubuf) = (b.alloc(40 + 256, 64), b.alloc(40 + 256, 64));
    b.post_recv(&mut sb, 7, &[sge(rbuf, 40 + 256, LOCAL_DMA_LKEY)]);
    b.post_recv(&mut ub, 8, &[sge(ubuf, 40 + 256, LOCAL_DMA_LKEY)]);
    let smp = pattern(256, 5);
    let sbuf = a.alloc(256, 64);
    a.write(sbuf, &smp);
    let b_lid = b.lid();
    let to = |qpn: u32, qkey: u32| {
        let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
        (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (b_lid, qpn, qkey);
        wr
    };
    // A UD QP's datagram to QPN 0, with QP0's Q_Key or any: dropped.
    for qkey in [0, 0x1111] {
        a.post_send(
            &mut ua,
            to(SMI_QPN, qkey),
            &[sge(sbuf, 256, LOCAL_DMA_LKEY)],
        );
    }
    // QP0's packet to a UD QP whose Q_Key it names: dropped too.
    a.post_send(
        &mut sa,
        to(ub.qpn, 0x1111),
        &[sge(sbuf, 256, LOCAL_DMA_LKEY)],
    );
    assert!(b.drain_cq(&mut cqb).is_empty());
    assert_eq!(b.hca.stats().ud_dropped, 3);
    // QP0 to QP0, whatever Q_Key the WR names.
    a.post_send(
        &mut sa,
        to(SMI_QPN, 0x4242),
        &[sge(sbuf, 256, LOCAL_DMA_LKEY)],
    );
    let r = b.drain_cq(&mut cqb);
    assert_eq!(r.len(), 1);
    assert_eq!(
        (r[0].wr_id, r[0].qpn, r[0].src_qp, r[0].slid, r[0].byte_len),
        (7, SMI_QPN, SMI_QPN, a.lid(), 296)
    );
    assert_eq!(b.read(rbuf + 40, 256), smp);
    // A directed-route SMP goes to the permissive LID: the fabric's switch takes it, and
    // sends it on by the port its path names (here B's: switch port n links LID n), with
    // the port it came in on in its return path.
    let mut path = vec![0u8; MAD_SIZE_SMP];
    (path[0], path[1], path[2], path[3], path[6], path[7]) = (1, 0x81, 1, 0x01, 1, 2);
    path[32..36].copy_from_slice(&[0xff; 4]);
    (path[128], path[129], path[130]) = (0, 1, b_lid as u8);
    a.write(sbuf, &path);
    b.post_recv(&mut sb, 9, &[sge(rbuf, 40 + 256, LOCAL_DMA_LKEY)]);
    let mut dr = to(SMI_QPN, 0);
    dr.ud_dlid = 0xffff;
    a.post_send(&mut sa, dr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let r = b.drain_cq(&mut cqb);
    assert_eq!((r.len(), r[0].wr_id, r[0].src_qp), (1, 9, SMI_QPN));
    let got = b.read(rbuf + 40, 256);
    assert_eq!((got[6], got[7], got[192 + 1]), (2, 2, a.lid() as u8));
    // What is not a directed-route SMP goes nowhere from there.
    a.write(sbuf, &smp);
    a.post_send(&mut sa, dr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    assert!(b.drain_cq(&mut cqb).is_empty());
    assert_eq!(fabric.stats().rejected, 1);
    let sent = a.drain_cq(&mut cqa);
    assert_eq!(sent.len(), 6, "every send completes");
    assert!(sent.iter().all(|c| u32::from(c.status) == WC_SUCCESS));
}

#[test]
fn test_ud_with_wrong_qkey_is_dropped_and_counted() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let mut b = Driver::new(Some(&fabric), 4);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let cqa = a.create_cq(6);
    let mut cqb = b.create_cq(6);
    let mut ua = a.create_qp(QPT_UD, pa, cqa.cqn, cqa.cqn);
    let mut ub = b.create_qp(QPT_UD, pb, cqb.cqn, cqb.cqn);
    a.bring_up_ud(ua.qpn, 0x1111, false);
    b.bring_up_ud(ub.qpn, 0x2222, false);
    let rbuf = b.alloc(100, 8);
    b.post_recv(&mut ub, 1, &[sge(rbuf, 100, LOCAL_DMA_LKEY)]);
    let mut wr = send_wr(1, WR_SEND, 0);
    wr.ud_dlid = b.lid();
    wr.ud_remote_qpn = ub.qpn;
    wr.ud_qkey = 0x8000_0000; // "use my QP's Q_Key": 0x1111, which B does not accept
    let sbuf = a.alloc(8, 8);
    a.post_send(&mut ua, wr, &[sge(sbuf, 8, LOCAL_DMA_LKEY)]);
    assert!(b.drain_cq(&mut cqb).is_empty());
    assert_eq!(b.hca.stats().ud_dropped, 1);
    wr.ud_qkey = 0x2222;
    a.post_send(&mut ua, wr, &[sge(sbuf, 8, LOCAL_DMA_LKEY)]);
    assert_eq!(b.drain_cq(&mut cqb).len(), 1);
}

/// A destroyed QP's number is not the next QP's: a datagram meant for the old QP (a peer
/// that has not heard it is gone, or a packet that was in flight) must not land in a new QP
/// that a consumer made with the same Q_Key, as it would if the device gave the number back
/// at once. The number comes back once every other free one has been handed out.
#[test]
fn test_a_destroyed_qps_number_is_not_the_next_qps() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    // Room for a full round of QPs' rings (the test driver never frees guest memory).
    let mut b = Driver::new(Some(&fabric), 64);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let cqa = a.create_cq(6);
    let mut cqb = b.create_cq(6);
    let mut ua = a.create_qp(QPT_UD, pa, cqa.cqn, cqa.cqn);
    let old = b.create_qp(QPT_UD, pb, cqb.cqn, cqb.cqn);
    a.bring_up_ud(ua.qpn, 0x1111, false);
    b.bring_up_ud(old.qpn, 0x1111, false);
    let mut wr = send_wr(1, WR_SEND, 0);
    wr.ud_dlid = b.lid();
    wr.ud_remote_qpn = old.qpn;
    wr.ud_qkey = 0x1111;
    let h = |handle| HcaCmdHandle { handle, rsvd: 0 };
    assert_eq!(b.cmd(CMD_DESTROY_QP, &h(old.qpn)).0, CMD_OK);
    let mut new = b.create_qp(QPT_UD, pb, cqb.cqn, cqb.cqn);
    assert_ne!(
        new.qpn, old.qpn,
        "the number is not handed out again at once"
    );
    b.bring_up_ud(new.qpn, 0x1111, false);
    let rbuf = b.alloc(100, 8);
    b.post_recv(&mut new, 1, &[sge(rbuf, 100, LOCAL_DMA_LKEY)]);
    let sbuf = a.alloc(8, 8);
    a.post_send(&mut ua, wr, &[sge(sbuf, 8, LOCAL_DMA_LKEY)]);
    assert!(
        b.drain_cq(&mut cqb).is_empty(),
        "the old QP's datagram reached the new QP"
    );
    // Round the whole space: the old number comes back after every other free one.
    let mut seen = vec![new.qpn];
    loop {
        let q = b.create_qp(QPT_UD, pb, cqb.cqn, cqb.cqn);
        assert_eq!(b.cmd(CMD_DESTROY_QP, &h(q.qpn)).0, CMD_OK);
        if q.qpn == old.qpn {
            break;
        }
        assert!(!seen.contains(&q.qpn), "QPN {} came back early", q.qpn);
        assert!(
            seen.len() < MAX_QP as usize,
            "QPN {} never came back",
            old.qpn
        );
        seen.push(q.qpn);
    }
    // Every number from 2 up but the old one: the new QP's (still held), then each one
    // created and destroyed here.
    assert_eq!(seen.len(), MAX_QP as usize - 3);
}

#[test]
fn test_armed_cq_raises_its_vector_once_per_arm() {
    let mut p = Pair::new(5);
    let dst = p.b.alloc(64, 8);
    let src = p.a.alloc(8, 8);
    let v = VEC_COMP_FIRST;
    let before = p.b.irq.get(v);
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
    p.a.post_send(&mut p.qa, send_wr(1, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    assert_eq!(p.b.irq.get(v), before, "not armed: no interrupt");
    p.b.drain_cq(&mut p.cq_b);

    p.b.arm_cq(&mut p.cq_b, false);
    for i in 0..3 {
        p.b.post_recv(&mut p.qb, i, &[sge(dst, 8, p.key_b)]);
        p.a.post_send(&mut p.qa, send_wr(i, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    }
    assert_eq!(
        p.b.irq.get(v),
        before + 1,
        "one-shot: one interrupt for three CQEs"
    );
    let ev = p.b.drain_eq(v);
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (u32::from(ev[0].event_type), ev[0].param),
        (EV_COMPLETION, p.cq_b.cqn)
    );
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 3);
}

#[test]
fn test_arming_a_cq_that_holds_unconsumed_cqes_fires_at_once() {
    // A CQE that lands between the driver's last poll and its arm must not be a lost
    // wake-up: the arm sees the driver's consumer index behind the producer and fires.
    let mut p = Pair::new(5);
    let dst = p.b.alloc(64, 8);
    let src = p.a.alloc(8, 8);
    let v = VEC_COMP_FIRST;
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
    p.a.post_send(&mut p.qa, send_wr(1, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    let before = p.b.irq.get(v);
    p.b.arm_cq(&mut p.cq_b, false);
    assert_eq!(p.b.irq.get(v), before + 1, "unconsumed CQE: the arm fires");
    assert_eq!(p.b.drain_eq(v).len(), 1);
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 1);
    // Consumed and published: a new arm waits for the next CQE.
    p.b.arm_cq(&mut p.cq_b, false);
    assert_eq!(p.b.irq.get(v), before + 1, "empty CQ: the arm waits");
    p.b.post_recv(&mut p.qb, 2, &[sge(dst, 8, p.key_b)]);
    p.a.post_send(&mut p.qa, send_wr(2, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    assert_eq!(p.b.irq.get(v), before + 2);
}

#[test]
fn test_solicited_only_arm_ignores_unsolicited_completions() {
    let mut p = Pair::new(5);
    let dst = p.b.alloc(64, 8);
    let src = p.a.alloc(8, 8);
    p.b.arm_cq(&mut p.cq_b, true);
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
    p.a.post_send(&mut p.qa, send_wr(1, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    assert!(p.b.drain_eq(VEC_COMP_FIRST).is_empty());
    p.b.post_recv(&mut p.qb, 2, &[sge(dst, 8, p.key_b)]);
    p.a.post_send(
        &mut p.qa,
        send_wr(2, WR_SEND, WQE_SOLICITED),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(p.b.drain_eq(VEC_COMP_FIRST).len(), 1);
}

#[test]
fn test_cq_on_another_vector_raises_that_vector() {
    let mut a = Driver::new(None, 4);
    let cq = a.try_create_cq(4, 3).unwrap();
    let pd = a.alloc_pd();
    // A loopback-free way to get a CQE: a QP moved to ERR flushes a posted receive.
    let mut qp = a.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    let mut cq = cq;
    a.arm_cq(&mut cq, false);
    a.post_recv(&mut qp, 5, &[]);
    a.to_error(qp.qpn);
    assert_eq!(a.irq.get(3), 1);
    let c = a.drain_cq(&mut cq);
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (5, WC_WR_FLUSH_ERR));
}

#[test]
fn test_four_nodes_all_to_all_over_one_fabric() {
    let fabric = Fabric::with_manual_clock();
    let mut nodes: Vec<Driver> = (0..4).map(|_| Driver::new(Some(&fabric), 8)).collect();
    let mut pds = Vec::new();
    let mut keys = Vec::new();
    let mut cqs = Vec::new();
    for n in nodes.iter_mut() {
        let pd = n.alloc_pd();
        keys.push(n.reg_dma_mr(pd, ALL_ACCESS));
        cqs.push(n.create_cq(8));
        pds.push(pd);
    }
    // qps[i][j]: node i's QP to node j.
    let mut qps: Vec<Vec<Option<QpH>>> = vec![vec![None; 4]; 4];
    for (i, row) in qps.iter_mut().enumerate() {
        for (j, slot) in row.iter_mut().enumerate() {
            if i != j {
                let (pd, cqn) = (pds[i], cqs[i].cqn);
                *slot = Some(nodes[i].create_qp(QPT_RC, pd, cqn, cqn));
            }
        }
    }
    for i in 0..4 {
        for j in 0..4 {
            if i != j {
                let peer = qps[j][i].as_ref().unwrap().qpn;
                let lid = nodes[j].lid();
                let qpn = qps[i][j].as_ref().unwrap().qpn;
                nodes[i].bring_up_rc(qpn, lid, peer, ALL_ACCESS, 5);
            }
        }
    }
    // Every node writes its id into a slot of every other node's array by RDMA WRITE.
    let arrays: Vec<u64> = nodes.iter_mut().map(|n| n.alloc(64, 64)).collect();
    for i in 0..4 {
        let src = nodes[i].alloc(8, 8);
        nodes[i].write(src, &(0xa0 + i as u64).to_le_bytes());
        for j in 0..4 {
            if i == j {
                continue;
            }
            let mut wr = send_wr(j as u64, WR_RDMA_WRITE, WQE_SIGNALED);
            wr.remote_addr = arrays[j] + 8 * i as u64;
            wr.rkey = keys[j];
            let key = keys[i];
            let mut q = qps[i][j].take().unwrap();
            nodes[i].post_send(&mut q, wr, &[sge(src, 8, key)]);
            qps[i][j] = Some(q);
        }
    }
    for j in 0..4 {
        let done = nodes[j].drain_cq(&mut cqs[j]);
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|c| u32::from(c.status) == WC_SUCCESS));
        for i in 0..4 {
            if i != j {
                assert_eq!(
                    nodes[j].read(arrays[j] + 8 * i as u64, 8),
                    (0xa0 + i as u64).to_le_bytes()
                );
            }
        }
    }
    assert_eq!(fabric.stats().no_route + fabric.stats().rejected, 0);
}

#[test]
fn test_loopback_qps_on_one_hca() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let pd = a.alloc_pd();
    let key = a.reg_dma_mr(pd, ALL_ACCESS);
    let mut cq = a.create_cq(6);
    let mut q1 = a.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    let mut q2 = a.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    let lid = a.lid();
    a.bring_up_rc(q1.qpn, lid, q2.qpn, ALL_ACCESS, 5);
    a.bring_up_rc(q2.qpn, lid, q1.qpn, ALL_ACCESS, 5);
    let (src, dst) = (a.alloc(16, 8), a.alloc(16, 8));
    a.write(src, b"loopback message");
    a.post_recv(&mut q2, 1, &[sge(dst, 16, key)]);
    a.post_send(
        &mut q1,
        send_wr(2, WR_SEND, WQE_SIGNALED),
        &[sge(src, 16, key)],
    );
    assert_eq!(a.drain_cq(&mut cq).len(), 2);
    assert_eq!(a.read(dst, 16), b"loopback message");
}

#[test]
fn test_a_send_doorbell_finds_work_after_any_change_to_a_qp_since_its_last_scan() {
    // A send doorbell passes over QPs on what its last scan noted of them; whatever has
    // changed a QP since (a command, a delivery) must make the next scan look again.
    let mut p = Pair::new(5);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.write(src, &7u64.to_le_bytes());
    let write = |wr_id| HcaSendWqe {
        remote_addr: dst,
        rkey: p.key_b,
        num_sge: 1,
        ..send_wr(wr_id, WR_RDMA_WRITE, WQE_SIGNALED)
    };
    for i in 0..3 {
        p.a.post_send(&mut p.qa, write(i), &[sge(src, 8, p.key_a)]);
    }
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 3);

    // Reset and reconnect both ends: A's consumer index is 0 again, and three WQEs rung
    // at once bring its producer index to 3, what the scan last saw with nothing to do.
    let reset = HcaQpAttr::default();
    for (d, q) in [(&mut p.a, &mut p.qa), (&mut p.b, &mut p.qb)] {
        assert_eq!(d.modify_qp(q.qpn, QP_ATTR_STATE, reset), CMD_OK);
        (q.sq_pi, q.rq_pi) = (0, 0);
    }
    let (la, lb) = (p.a.lid(), p.b.lid());
    p.a.bring_up_rc(p.qa.qpn, lb, p.qb.qpn, ALL_ACCESS, 5);
    p.b.bring_up_rc(p.qb.qpn, la, p.qa.qpn, ALL_ACCESS, 5);
    for i in 10..13 {
        p.a.write_send(&mut p.qa, &write(i), &[sge(src, 8, p.key_a)], &[]);
    }
    p.a.ring_sq(&p.qa);
    let c = p.a.drain_cq(&mut p.cq_a);
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [10, 11, 12], "the reconnected QP's WQEs run");

    // A QP scanned while it could not send (just created, in RESET: another QP's doorbell
    // rang) sends once it is brought to RTS.
    let mut cq2 = p.a.create_cq(4);
    let mut q2 = p.a.create_qp(QPT_RC, p.pd_a, cq2.cqn, cq2.cqn);
    let q2b = p.b.create_qp(QPT_RC, p.pd_b, p.cq_b.cqn, p.cq_b.cqn);
    p.a.post_send(&mut p.qa, write(20), &[sge(src, 8, p.key_a)]);
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 1);
    p.a.bring_up_rc(q2.qpn, lb, q2b.qpn, ALL_ACCESS, 5);
    p.b.bring_up_rc(q2b.qpn, la, q2.qpn, ALL_ACCESS, 5);
    p.a.post_send(&mut q2, write(21), &[sge(src, 8, p.key_a)]);
    let c = p.a.drain_cq(&mut cq2);
    assert_eq!(
        (c.len(), c[0].wr_id, u32::from(c[0].status)),
        (1, 21, WC_SUCCESS)
    );
}

#[test]
fn test_a_burst_of_sends_is_acknowledged_once_and_every_wr_completes() {
    // Sixteen SENDs rung with one doorbell arrive as a burst: the responder ACKs the last,
    // which covers the others (IB lets ACKs coalesce), and every WR completes in order.
    let mut p = Pair::new(5);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(16 * 8, 8));
    p.a.write(src, b"burst!!!");
    for i in 0..16 {
        p.b.post_recv(&mut p.qb, i, &[sge(dst + 8 * i, 8, p.key_b)]);
    }
    let before = p.fabric.stats().delivered;
    let from = sge(src, 8, p.key_a);
    p.sends_at_once(16, from);
    let sent = p.a.drain_statuses(&mut p.cq_a);
    let want: Vec<(u64, u32)> = (0..16).map(|i| (i, WC_SUCCESS)).collect();
    assert_eq!(sent, want);
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 16);
    assert_eq!(p.b.read(dst + 8 * 15, 8), b"burst!!!");
    assert_eq!(
        p.fabric.stats().delivered - before,
        17,
        "16 requests and one ACK crossed the fabric"
    );

    // One SEND alone is ACKed at once.
    p.b.post_recv(&mut p.qb, 16, &[sge(dst, 8, p.key_b)]);
    let before = p.fabric.stats().delivered;
    p.a.post_send(
        &mut p.qa,
        send_wr(16, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 1);
    assert_eq!(p.fabric.stats().delivered - before, 2);
}

#[test]
fn test_a_nak_inside_a_burst_follows_the_ack_it_held() {
    // The third of four SENDs rung at once finds a receive too small: the two before it
    // were ACKed (held while the burst went on), so they complete; the third fails, the
    // fourth is flushed.
    let mut p = Pair::new(5);
    let (src, dst) = (p.a.alloc(16, 8), p.b.alloc(64, 8));
    for (i, len) in [(0u64, 16u32), (1, 16), (2, 4), (3, 16)] {
        p.b.post_recv(&mut p.qb, i, &[sge(dst + 16 * i, len, p.key_b)]);
    }
    let from = sge(src, 16, p.key_a);
    p.sends_at_once(4, from);
    let sent = p.a.drain_statuses(&mut p.cq_a);
    assert_eq!(
        sent,
        [
            (0, WC_SUCCESS),
            (1, WC_SUCCESS),
            (2, WC_REM_INV_REQ_ERR),
            (3, WC_WR_FLUSH_ERR)
        ]
    );
}

#[test]
fn test_reset_then_reconnect_works_again() {
    let mut p = Pair::new(5);
    let reset = HcaQpAttr::default();
    assert_eq!(p.a.modify_qp(p.qa.qpn, QP_ATTR_STATE, reset), CMD_OK);
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_RESET);
    p.qa.sq_pi = 0;
    p.qa.rq_pi = 0;
    let lb = p.b.lid();
    p.a.bring_up_rc(p.qa.qpn, lb, p.qb.qpn, ALL_ACCESS, 5);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.write(src, &5u64.to_le_bytes());
    let mut wr = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    wr.remote_addr = dst;
    wr.rkey = p.key_b;
    p.a.post_send(&mut p.qa, wr, &[sge(src, 8, p.key_a)]);
    assert_eq!(u32::from(p.a.drain_cq(&mut p.cq_a)[0].status), WC_SUCCESS);
    assert_eq!(p.b.read(dst, 8), 5u64.to_le_bytes());
}

/// Allocates a fast-registration MR for `npages` pages on p's B side (ib_alloc_mr).
fn fast_reg_mr(p: &mut Pair, npages: u32) -> u32 {
    let pdn = p.pd_b;
    p.b.try_reg_mr(&HcaCmdRegMr {
        pdn,
        npages,
        flags: MR_FLAG_FAST_REG,
        ..Default::default()
    })
    .expect("fast-reg MR")
}

/// A fast-registration MR as ib_alloc_mr + IB_WR_REG_MR use it: nothing reachable before the
/// WR, then the mapped pages (scattered, not contiguous) with the rights and key the WR gave.
#[test]
fn test_fast_registration_maps_scattered_pages_under_the_new_key() {
    let mut p = Pair::new(5);
    let frmr = fast_reg_mr(&mut p, 4);
    let src = p.a.alloc(3 * 4096, 4096);
    p.a.write(src, &pattern(3 * 4096, 9));
    let rdma = |p: &mut Pair, rkey: u32, wr_id: u64| {
        let w = HcaSendWqe {
            wr_id,
            opcode: WR_RDMA_WRITE as u8,
            flags: WQE_SIGNALED as u8,
            remote_addr: 0x10_0000 + 100,
            rkey,
            ..Default::default()
        };
        p.a.post_send(&mut p.qa, w, &[sge(src, 3 * 4096, p.key_a)]);
        p.a.drain_cq(&mut p.cq_a)
    };
    // Before WR_REG_MR the key reaches nothing.
    let c = rdma(&mut p, frmr, 1);
    assert_eq!(u32::from(c[0].status), WC_REM_ACCESS_ERR);
    let mut p = Pair::new(5);
    let frmr = fast_reg_mr(&mut p, 4);
    p.a.write(src, &pattern(3 * 4096, 9));
    // Four pages in reverse order, so the mapping is visibly not contiguous.
    let pages: Vec<u64> = (0..4).map(|_| p.b.alloc(4096, 4096)).rev().collect();
    let list = p.b.alloc(32, 8);
    for (i, pg) in pages.iter().enumerate() {
        p.b.write(list + 8 * i as u64, &pg.to_le_bytes());
    }
    let new_key = (frmr & !0xff) | 0x42;
    p.b.post_reg_mr(
        &mut p.qb,
        HcaRegMrWqe {
            wr_id: 7,
            flags: WQE_SIGNALED as u8,
            access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
            iova: 0x10_0000,
            key: new_key,
            npages: 4,
            length: 4 * 4096,
            page_list: list,
            page_shift: 12,
            ..Default::default()
        },
    );
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(
        (c[0].wr_id, u32::from(c[0].opcode), u32::from(c[0].status)),
        (7, CQE_OP_REG_MR, WC_SUCCESS)
    );
    // The old key is stale; the new one writes through the page list.
    let c = rdma(&mut p, new_key, 2);
    assert_eq!(u32::from(c[0].status), WC_SUCCESS, "{c:?}");
    let want = pattern(3 * 4096, 9);
    let mut got = Vec::new();
    let mut off = 100usize;
    while got.len() < want.len() {
        let page = pages[off / 4096];
        let n = (4096 - off % 4096).min(want.len() - got.len());
        got.extend(p.b.read(page + (off % 4096) as u64, n));
        off += n;
    }
    assert_eq!(got, want);
}

#[test]
fn test_fast_registration_rejects_a_foreign_or_oversized_mapping() {
    let mut p = Pair::new(5);
    let frmr = fast_reg_mr(&mut p, 2);
    let list = p.b.alloc(32, 8);
    let pg = p.b.alloc(4096, 4096);
    for i in 0..4u64 {
        p.b.write(list + 8 * i, &pg.to_le_bytes());
    }
    // More pages than the MR was allocated for: a local protection error, QP to ERR.
    p.b.post_reg_mr(
        &mut p.qb,
        HcaRegMrWqe {
            wr_id: 1,
            flags: WQE_SIGNALED as u8,
            access: ACCESS_LOCAL_WRITE,
            key: frmr,
            npages: 4,
            length: 4 * 4096,
            page_list: list,
            page_shift: 12,
            ..Default::default()
        },
    );
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(
        (u32::from(c[0].opcode), u32::from(c[0].status)),
        (CQE_OP_REG_MR, WC_LOC_PROT_ERR)
    );
    // An ordinary MR's key is no fast-registration MR.
    let mut p = Pair::new(5);
    p.b.post_reg_mr(
        &mut p.qb,
        HcaRegMrWqe {
            wr_id: 2,
            access: ACCESS_LOCAL_WRITE,
            key: p.key_b,
            npages: 1,
            length: 4096,
            page_list: list,
            page_shift: 12,
            ..Default::default()
        },
    );
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(u32::from(c[0].status), WC_LOC_PROT_ERR);
}

/// Maps a one-page fast-registration MR on b at iova 0x20_0000 for remote writes, under the
/// key tag `tag`; returns the key.
fn map_frmr(p: &mut Pair, tag: u32) -> u32 {
    let frmr = fast_reg_mr(p, 1);
    let page = p.b.alloc(4096, 4096);
    let list = p.b.alloc(8, 8);
    p.b.write(list, &page.to_le_bytes());
    let key = (frmr & !0xff) | tag;
    p.b.post_reg_mr(
        &mut p.qb,
        HcaRegMrWqe {
            wr_id: 1,
            flags: WQE_SIGNALED as u8,
            access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
            iova: 0x20_0000,
            key,
            npages: 1,
            length: 4096,
            page_list: list,
            page_shift: 12,
            ..Default::default()
        },
    );
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(u32::from(c[0].status), WC_SUCCESS);
    key
}

/// An RDMA WRITE from a to b's iova 0x20_0000 under `rkey`: its completion status.
fn write_to(p: &mut Pair, rkey: u32) -> u32 {
    let src = p.a.alloc(64, 64);
    let w = HcaSendWqe {
        wr_id: 9,
        opcode: WR_RDMA_WRITE as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr: 0x20_0000,
        rkey,
        ..Default::default()
    };
    p.a.post_send(&mut p.qa, w, &[sge(src, 64, p.key_a)]);
    u32::from(p.a.drain_cq(&mut p.cq_a)[0].status)
}

/// A SEND from a naming `rkey` for b to invalidate: (a's status, b's receive CQE).
fn send_inv(p: &mut Pair, rkey: u32) -> (u32, HcaCqe) {
    let rbuf = p.b.alloc(64, 64);
    p.b.post_recv(&mut p.qb, 5, &[sge(rbuf, 64, p.key_b)]);
    let src = p.a.alloc(16, 64);
    let w = HcaSendWqe {
        wr_id: 4,
        opcode: WR_SEND_INV as u8,
        flags: WQE_SIGNALED as u8,
        imm: rkey,
        ..Default::default()
    };
    p.a.post_send(&mut p.qa, w, &[sge(src, 16, p.key_a)]);
    let a = p.a.drain_cq(&mut p.cq_a);
    let b = p.b.drain_cq(&mut p.cq_b);
    (u32::from(a[0].status), b[0])
}

/// What NVMe-oF, NFS/RDMA and SRP do with a fast-registered MR once an I/O is done: the
/// target's SEND with Invalidate, or the host's own LOCAL_INV, revokes the key, and no
/// remote access reaches the pages after that.
#[test]
fn test_a_send_with_invalidate_or_a_local_invalidate_revokes_a_fast_registered_key() {
    let mut p = Pair::new(5);
    let key = map_frmr(&mut p, 0x11);
    assert_eq!(write_to(&mut p, key), WC_SUCCESS);
    let (st, recv) = send_inv(&mut p, key);
    assert_eq!(st, WC_SUCCESS);
    assert_eq!(
        (
            u32::from(recv.status),
            u32::from(recv.opcode),
            recv.byte_len
        ),
        (WC_SUCCESS, CQE_OP_RECV, 16)
    );
    assert_ne!(u32::from(recv.flags) & CQE_FLAG_INV, 0, "{recv:?}");
    assert_eq!(recv.imm, key, "the invalidated rkey");
    assert_eq!(write_to(&mut p, key), WC_REM_ACCESS_ERR, "revoked");

    let mut p = Pair::new(5);
    let key = map_frmr(&mut p, 0x12);
    let w = HcaSendWqe {
        wr_id: 3,
        opcode: WR_LOCAL_INV as u8,
        flags: WQE_SIGNALED as u8,
        imm: key,
        ..Default::default()
    };
    p.b.post_send(&mut p.qb, w, &[]);
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(
        (c[0].wr_id, u32::from(c[0].opcode), u32::from(c[0].status)),
        (3, CQE_OP_LOCAL_INV, WC_SUCCESS)
    );
    assert_eq!(write_to(&mut p, key), WC_REM_ACCESS_ERR, "revoked");
}

/// Only a fast-registration MR of the QP's PD, under its current key, can be invalidated.
#[test]
fn test_invalidating_an_ordinary_or_stale_key_is_an_error() {
    let mut p = Pair::new(5);
    let key_b = p.key_b;
    let (st, recv) = send_inv(&mut p, key_b);
    assert_eq!(st, WC_REM_INV_REQ_ERR);
    assert_eq!(u32::from(recv.status), WC_REM_INV_REQ_ERR);

    let mut p = Pair::new(5);
    let key = map_frmr(&mut p, 0x13);
    let w = HcaSendWqe {
        wr_id: 3,
        opcode: WR_LOCAL_INV as u8,
        flags: WQE_SIGNALED as u8,
        imm: key ^ 1, // a stale tag
        ..Default::default()
    };
    p.b.post_send(&mut p.qb, w, &[]);
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(u32::from(c[0].status), WC_LOC_PROT_ERR);
}
