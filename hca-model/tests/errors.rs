//! Every error path: protection, lengths, states, overflow, broken indices, bad commands.

use hca_model::abi::*;
use hca_model::packet::{Packet, Payload, Reth, RC_WRITE_ONLY};
use hca_model::Fabric;
use hca_test_driver::*;

fn status(c: &HcaCqe) -> u32 {
    u32::from(c.status)
}

fn write_wr(remote_addr: u64, rkey: u32) -> HcaSendWqe {
    let mut wr = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    wr
}

#[test]
fn test_bad_lkey_fails_locally_and_later_wrs_are_flushed() {
    let mut p = Pair::new(5);
    let src = p.a.alloc(8, 8);
    // Unsignaled, yet an error always completes.
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, 0),
        &[sge(src, 8, 0xdead_0002)],
    );
    p.a.post_send(&mut p.qa, send_wr(2, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].wr_id, status(&c[0])), (1, WC_LOC_PROT_ERR));
    assert_eq!((c[1].wr_id, status(&c[1])), (2, WC_WR_FLUSH_ERR));
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
}

#[test]
fn test_lkey_of_another_pd_is_a_protection_error() {
    let mut p = Pair::new(5);
    let other_pd = p.a.alloc_pd();
    let foreign = p.a.reg_dma_mr(other_pd, ALL_ACCESS);
    let src = p.a.alloc(8, 8);
    p.a.post_send(&mut p.qa, send_wr(1, WR_SEND, 0), &[sge(src, 8, foreign)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_LOC_PROT_ERR);
}

#[test]
fn test_sge_outside_guest_memory_is_a_protection_error() {
    let mut p = Pair::new(5);
    for addr in [64 * MIB, u64::MAX - 3, 8 * MIB - 4] {
        let mut p2 = Pair::new(5);
        p2.a.post_send(
            &mut p2.qa,
            send_wr(1, WR_SEND, 0),
            &[sge(addr, 8, LOCAL_DMA_LKEY)],
        );
        assert_eq!(
            status(&p2.a.drain_cq(&mut p2.cq_a)[0]),
            WC_LOC_PROT_ERR,
            "addr {addr:#x}"
        );
    }
    // And through a registered MR, past its end.
    let buf = p.a.alloc(4096, 4096);
    let key = p.a.reg_mr(p.pd_a, buf, 4096, ACCESS_LOCAL_WRITE);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, 0),
        &[sge(buf + 4000, 200, key)],
    );
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_LOC_PROT_ERR);
}

#[test]
fn test_bad_rkey_gives_remote_access_error_and_both_qps_go_to_error() {
    let mut p = Pair::new(5);
    let src = p.a.alloc(8, 8);
    let dst = p.b.alloc(8, 8);
    p.a.post_send(
        &mut p.qa,
        write_wr(dst, 0x0bad_0003),
        &[sge(src, 8, p.key_a)],
    );
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(status(&c[0]), WC_REM_ACCESS_ERR);
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
    assert_eq!(p.b.qp_state(p.qb.qpn), QPS_ERR);
    let ev = p.b.drain_eq(VEC_ASYNC);
    assert!(ev
        .iter()
        .any(|e| u32::from(e.event_type) == EV_QP_ACCESS_ERR && e.param == p.qb.qpn));
}

#[test]
fn test_rkey_checks_pd_access_rights_bounds_and_qp_permission() {
    type Setup = fn(&mut Pair, u64) -> (u64, u32);
    let cases: [(&str, Setup); 5] = [
        ("other PD", |p, dst| {
            let pd = p.b.alloc_pd();
            (dst, p.b.reg_mr(pd, dst, 4096, ALL_ACCESS))
        }),
        ("no REMOTE_WRITE", |p, dst| {
            let pd = p.pd_b;
            (
                dst,
                p.b.reg_mr(pd, dst, 4096, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ),
            )
        }),
        ("past the end", |p, dst| {
            let pd = p.pd_b;
            (dst + 4090, p.b.reg_mr(pd, dst, 4096, ALL_ACCESS))
        }),
        ("before the start", |p, dst| {
            let pd = p.pd_b;
            (dst - 8, p.b.reg_mr(pd, dst, 4096, ALL_ACCESS))
        }),
        ("deregistered", |p, dst| {
            let pd = p.pd_b;
            let k = p.b.reg_mr(pd, dst, 4096, ALL_ACCESS);
            let (st, _) = p.b.cmd(CMD_DEREG_MR, &HcaCmdHandle { handle: k, rsvd: 0 });
            assert_eq!(st, CMD_OK);
            (dst, k)
        }),
    ];
    for (name, setup) in cases {
        let mut p = Pair::new(5);
        let src = p.a.alloc(64, 8);
        let dst = p.b.alloc(8192, 4096);
        let (addr, rkey) = setup(&mut p, dst);
        p.b.write(dst, &[0x5a; 4096]);
        p.a.post_send(&mut p.qa, write_wr(addr, rkey), &[sge(src, 64, p.key_a)]);
        assert_eq!(
            status(&p.a.drain_cq(&mut p.cq_a)[0]),
            WC_REM_ACCESS_ERR,
            "{name}"
        );
        assert_eq!(
            p.b.read(dst, 4096),
            vec![0x5a; 4096],
            "{name}: nothing written"
        );
    }
    // The responder QP itself must allow remote writes.
    let mut p = Pair::with_access(5, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.post_send(&mut p.qa, write_wr(dst, p.key_b), &[sge(src, 8, p.key_a)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_ACCESS_ERR);
}

#[test]
fn test_zero_length_rdma_checks_no_rkey_but_the_qps_rights() {
    // IBA C9-88: a zero-length RDMA WRITE or READ needs no valid R_Key or VA. ib_srpt
    // posts one (rkey 0, address 0) once a channel is up, and tears the channel down if
    // it fails.
    let mut p = Pair::new(5);
    let local = p.a.alloc(64, 8);
    for (op, name) in [(WR_RDMA_WRITE, "WRITE"), (WR_RDMA_READ, "READ")] {
        let mut wr = send_wr(1, op, WQE_SIGNALED);
        (wr.remote_addr, wr.rkey) = (0, 0);
        p.a.post_send(&mut p.qa, wr, &[]);
        let c = p.a.drain_cq(&mut p.cq_a);
        assert_eq!(status(&c[0]), WC_SUCCESS, "zero-length {name}");
        assert_eq!(
            p.b.qp_state(p.qb.qpn),
            QPS_RTS,
            "after a zero-length {name}"
        );
    }
    // One byte through the same key is refused: the check is skipped for zero only.
    p.a.post_send(&mut p.qa, write_wr(0, 0), &[sge(local, 1, p.key_a)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_ACCESS_ERR);
    // A responder QP that allows no remote writes refuses even a zero-length one.
    let mut p = Pair::with_access(5, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ);
    p.a.post_send(&mut p.qa, write_wr(0, 0), &[]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_ACCESS_ERR);
}

#[test]
fn test_rdma_read_needs_remote_read_rights() {
    let mut p = Pair::new(5);
    let remote = p.b.alloc(4096, 4096);
    let rkey = p.b.reg_mr(
        p.pd_b,
        remote,
        4096,
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
    );
    let local = p.a.alloc(64, 8);
    let mut wr = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
    wr.remote_addr = remote;
    wr.rkey = rkey;
    p.a.post_send(&mut p.qa, wr, &[sge(local, 64, p.key_a)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_ACCESS_ERR);
}

#[test]
fn test_rdma_read_into_read_only_local_mr_is_a_protection_error() {
    let mut p = Pair::new(5);
    let local = p.a.alloc(4096, 4096);
    let ro = p.a.reg_mr(p.pd_a, local, 4096, 0);
    let mut wr = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
    wr.remote_addr = p.b.alloc(64, 8);
    wr.rkey = p.key_b;
    p.a.post_send(&mut p.qa, wr, &[sge(local, 64, ro)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_LOC_PROT_ERR);
}

#[test]
fn test_misaligned_atomic_is_an_invalid_request() {
    let mut p = Pair::new(5);
    let local = p.a.alloc(8, 8);
    let mut wr = send_wr(1, WR_ATOMIC_FETCH_ADD, WQE_SIGNALED);
    wr.remote_addr = p.b.alloc(16, 8) + 4;
    wr.rkey = p.key_b;
    p.a.post_send(&mut p.qa, wr, &[sge(local, 8, p.key_a)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_INV_REQ_ERR);
}

#[test]
fn test_receive_buffer_too_small_fails_both_sides() {
    let mut p = Pair::new(1);
    let src = p.a.alloc(1000, 8);
    let dst = p.b.alloc(100, 8);
    p.b.post_recv(&mut p.qb, 7, &[sge(dst, 100, p.key_b)]);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, 1000, p.key_a)],
    );
    let r = p.b.drain_cq(&mut p.cq_b);
    assert_eq!((r[0].wr_id, status(&r[0])), (7, WC_LOC_LEN_ERR));
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_INV_REQ_ERR);
    assert_eq!(p.b.qp_state(p.qb.qpn), QPS_ERR);
}

#[test]
fn test_receive_with_bad_lkey_is_a_remote_operational_error() {
    let mut p = Pair::new(5);
    let src = p.a.alloc(8, 8);
    let dst = p.b.alloc(8, 8);
    p.b.post_recv(&mut p.qb, 7, &[sge(dst, 8, 0x7777_0005)]);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(status(&p.b.drain_cq(&mut p.cq_b)[0]), WC_LOC_PROT_ERR);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_REM_OP_ERR);
}

/// With rnr_retry 0 the first RNR NAK ends the WR (the retrying kinds are in
/// reliability.rs).
#[test]
fn test_send_with_no_receive_posted_is_receiver_not_ready() {
    let mut p = Pair::build(Fabric::with_manual_clock(), 5, ALL_ACCESS, (14, 7, 0));
    let src = p.a.alloc(8, 8);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_RNR_RETRY_EXC_ERR);
    assert_eq!(
        p.b.qp_state(p.qb.qpn),
        QPS_RTS,
        "RNR leaves the responder alone"
    );
}

#[test]
fn test_peer_gone_from_fabric_gives_retry_exceeded() {
    let mut p = Pair::new(5);
    let src = p.a.alloc(8, 8);
    p.b.hca.detach();
    p.a.post_send(
        &mut p.qa,
        write_wr(0x1000, p.key_b),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_RETRY_EXC_ERR);
    assert_eq!(p.fabric.stats().no_route, 1);
}

#[test]
fn test_packet_to_a_destroyed_qp_gives_retry_exceeded() {
    let mut p = Pair::new(5);
    let (st, _) = p.b.cmd(
        CMD_DESTROY_QP,
        &HcaCmdHandle {
            handle: p.qb.qpn,
            rsvd: 0,
        },
    );
    assert_eq!(st, CMD_OK);
    let src = p.a.alloc(8, 8);
    p.a.post_send(
        &mut p.qa,
        write_wr(0x1000, p.key_b),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_RETRY_EXC_ERR);
}

#[test]
fn test_unknown_wr_opcode_and_too_many_sges_are_local_qp_errors() {
    let mut p = Pair::new(5);
    let src = p.a.alloc(8, 8);
    p.a.post_send(&mut p.qa, send_wr(1, 0x7f, 0), &[sge(src, 8, p.key_a)]);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_LOC_QP_OP_ERR);

    let mut p = Pair::new(5);
    let mut wr = send_wr(1, WR_SEND, 0);
    wr.num_sge = 200;
    p.a.write_send(&mut p.qa, &wr, &[], &[]);
    p.a.ring_sq(&p.qa);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_LOC_QP_OP_ERR);

    let mut p = Pair::new(5);
    let mut wr = send_wr(1, WR_SEND, WQE_INLINE);
    wr.inline_len = 4000;
    p.a.write_send(&mut p.qa, &wr, &[], &[]);
    p.a.ring_sq(&p.qa);
    assert_eq!(status(&p.a.drain_cq(&mut p.cq_a)[0]), WC_LOC_QP_OP_ERR);
}

#[test]
fn test_ud_message_over_mtu_is_a_length_error() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 4);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(4);
    let mut ud = a.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    a.bring_up_ud(ud.qpn, 1, false);
    let buf = a.alloc(8192, 8);
    let mut wr = send_wr(1, WR_SEND, 0);
    wr.ud_dlid = 1;
    wr.ud_remote_qpn = 2;
    a.post_send(&mut ud, wr, &[sge(buf, 5000, LOCAL_DMA_LKEY)]);
    assert_eq!(status(&a.drain_cq(&mut cq)[0]), WC_LOC_LEN_ERR);
}

#[test]
fn test_cq_overflow_raises_async_event_and_counts_lost_cqes() {
    let mut p = Pair::new(5);
    let mut small = p.b.create_cq(2); // 4 entries
    let (mut qa, mut q) = p.connect_more((p.cq_a.cqn, small.cqn), 6, 0);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    for i in 0..6 {
        p.b.post_recv(&mut q, i, &[sge(dst, 8, p.key_b)]);
        p.a.post_send(&mut qa, send_wr(i, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    }
    let ev = p.b.drain_eq(VEC_ASYNC);
    let cq_err = ev
        .iter()
        .find(|e| u32::from(e.event_type) == EV_CQ_ERR)
        .expect("EV_CQ_ERR posted");
    assert_eq!((cq_err.param, cq_err.data), (small.cqn, ERR_CQ_OVERFLOW));
    assert_eq!(
        p.b.drain_cq(&mut small).len(),
        4,
        "the four that fit are intact"
    );
    assert_eq!(p.b.hca.stats().cqes_lost, 2);
}

#[test]
fn test_producer_index_beyond_ring_is_fatal_for_that_qp_only() {
    let mut p = Pair::new(5);
    let (mut other, mut peer) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 6, 0);

    p.qa.sq_pi = 1_000_000;
    p.a.ring_sq(&p.qa);
    let ev = p.a.drain_eq(VEC_ASYNC);
    assert!(ev.iter().any(|e| u32::from(e.event_type) == EV_QP_FATAL
        && e.param == p.qa.qpn
        && e.data == ERR_WQ_INDEX));
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);

    // The other QP on the same HCA keeps working.
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.write(src, &9u64.to_le_bytes());
    p.b.post_recv(&mut peer, 1, &[sge(dst, 8, p.key_b)]);
    p.a.post_send(
        &mut other,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    assert!(p
        .a
        .drain_cq(&mut p.cq_a)
        .iter()
        .any(|c| c.qpn == other.qpn && status(c) == WC_SUCCESS));
    assert_eq!(p.b.read(dst, 8), 9u64.to_le_bytes());
}

#[test]
fn test_commands_reject_bad_opcodes_handles_and_busy_resources() {
    let mut a = Driver::new(None, 4);
    assert_eq!(a.cmd_raw(0xee, &[], 0).0, CMD_BAD_OPCODE);
    let h = |handle| HcaCmdHandle { handle, rsvd: 0 };
    assert_eq!(a.cmd(CMD_DEALLOC_PD, &h(5)).0, CMD_BAD_HANDLE);
    assert_eq!(a.cmd(CMD_DESTROY_CQ, &h(999_999)).0, CMD_BAD_HANDLE);
    assert_eq!(a.cmd(CMD_DESTROY_QP, &h(0)).0, CMD_BAD_HANDLE);
    assert_eq!(a.cmd(CMD_DEREG_MR, &h(u32::MAX)).0, CMD_BAD_HANDLE);
    assert_eq!(a.cmd(CMD_QUERY_QP, &h(77)).0, CMD_BAD_HANDLE);

    let pd = a.alloc_pd();
    let cq = a.create_cq(4);
    let qp = a.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    assert_eq!(a.cmd(CMD_DEALLOC_PD, &h(pd)).0, CMD_BUSY);
    assert_eq!(a.cmd(CMD_DESTROY_CQ, &h(cq.cqn)).0, CMD_BUSY);
    assert_eq!(a.cmd(CMD_DESTROY_QP, &h(qp.qpn)).0, CMD_OK);
    assert_eq!(a.cmd(CMD_DESTROY_CQ, &h(cq.cqn)).0, CMD_OK);
    assert_eq!(a.cmd(CMD_DEALLOC_PD, &h(pd)).0, CMD_OK);
}

#[test]
fn test_create_commands_check_shapes_and_addresses() {
    let mut a = Driver::new(None, 16);
    let pd = a.alloc_pd();
    assert_eq!(
        a.try_create_cq(MAX_CQ_LOG_CQE + 1, 1).err(),
        Some(CMD_BAD_PARAM)
    );
    assert_eq!(
        a.try_create_cq(4, 0).err(),
        Some(CMD_BAD_PARAM),
        "vector 0 is async only"
    );
    assert_eq!(a.try_create_cq(4, NUM_VECTORS).err(), Some(CMD_BAD_PARAM));
    let bad_ring = HcaCmdCreateCq {
        ring_addr: 100 * MIB,
        log_entries: 4,
        vector: 1,
        ..Default::default()
    };
    assert_eq!(a.cmd(CMD_CREATE_CQ, &bad_ring).0, CMD_BAD_ADDRESS);
    let cq = a.create_cq(4);
    assert_eq!(
        a.try_create_qp(9, pd, (cq.cqn, cq.cqn), (4, 4), 0).err(),
        Some(CMD_BAD_PARAM)
    );
    assert_eq!(
        a.try_create_qp(QPT_RC, pd + 1, (cq.cqn, cq.cqn), (4, 4), 0)
            .err(),
        Some(CMD_BAD_HANDLE)
    );
    let qp_far = HcaCmdCreateQp {
        sq_addr: 16 * MIB - 64,
        rq_addr: 0x1000,
        pdn: pd,
        send_cqn: cq.cqn,
        recv_cqn: cq.cqn,
        qp_type: QPT_RC,
        sq_log_entries: 4,
        sq_wqe_shift: 6,
        rq_log_entries: 4,
        rq_wqe_shift: 4,
        ..Default::default()
    };
    assert_eq!(a.cmd(CMD_CREATE_QP, &qp_far).0, CMD_BAD_ADDRESS);
    let too_deep = HcaCmdCreateQp {
        sq_addr: 0x1000,
        sq_log_entries: MAX_QP_LOG_WR as u8 + 1,
        ..qp_far
    };
    assert_eq!(a.cmd(CMD_CREATE_QP, &too_deep).0, CMD_BAD_PARAM);
    let bad_stride = HcaCmdCreateQp {
        sq_addr: 0x1000,
        sq_wqe_shift: MAX_SQ_WQE_SHIFT as u8 + 1,
        ..qp_far
    };
    assert_eq!(a.cmd(CMD_CREATE_QP, &bad_stride).0, CMD_BAD_PARAM);
    a.create_qp(QPT_GSI, pd, cq.cqn, cq.cqn);
    assert_eq!(
        a.try_create_qp(QPT_GSI, pd, (cq.cqn, cq.cqn), (4, 4), 0)
            .err(),
        Some(CMD_BUSY),
        "one GSI QP per port"
    );
}

#[test]
fn test_qp_table_full_is_no_resources() {
    let mut a = Driver::new(None, 64);
    let pd = a.alloc_pd();
    let cq = a.create_cq(4);
    let mut made = 0;
    loop {
        match a.try_create_qp(QPT_UD, pd, (cq.cqn, cq.cqn), (0, 0), 0) {
            Ok(_) => made += 1,
            Err(e) => {
                assert_eq!(e, CMD_NO_RESOURCES);
                break;
            }
        }
    }
    assert_eq!(made, MAX_QP - 2, "QPN 0 and 1 are reserved");
}

#[test]
fn test_mr_registration_checks_rights_page_lists_and_addresses() {
    let mut a = Driver::new(None, 4);
    let pd = a.alloc_pd();
    let buf = a.alloc(8192, 4096);
    let list = a.alloc(16, 8);
    a.write(list, &buf.to_le_bytes());
    a.write(list + 8, &(buf + 4096).to_le_bytes());
    let good = HcaCmdRegMr {
        iova: 0x7000_0000,
        length: 8192,
        page_list: list,
        pdn: pd,
        access: ACCESS_LOCAL_WRITE,
        npages: 2,
        page_shift: 12,
        ..Default::default()
    };
    assert!(a.try_reg_mr(&good).is_ok());
    let cases = [
        (
            "remote write without local write",
            HcaCmdRegMr {
                access: ACCESS_REMOTE_WRITE,
                ..good
            },
            CMD_BAD_PARAM,
        ),
        (
            "unknown access bit",
            HcaCmdRegMr {
                access: 0x100,
                ..good
            },
            CMD_BAD_PARAM,
        ),
        (
            "too long for its pages",
            HcaCmdRegMr {
                length: 8193,
                ..good
            },
            CMD_BAD_PARAM,
        ),
        (
            "page shift too small",
            HcaCmdRegMr {
                page_shift: 11,
                ..good
            },
            CMD_BAD_PARAM,
        ),
        ("no pages", HcaCmdRegMr { npages: 0, ..good }, CMD_BAD_PARAM),
        (
            "huge page list",
            HcaCmdRegMr {
                npages: MAX_MR_PAGES + 1,
                ..good
            },
            CMD_BAD_PARAM,
        ),
        (
            "list outside memory",
            HcaCmdRegMr {
                page_list: 1 << 40,
                ..good
            },
            CMD_BAD_ADDRESS,
        ),
        ("bad pd", HcaCmdRegMr { pdn: 999, ..good }, CMD_BAD_HANDLE),
        (
            "unknown flag",
            HcaCmdRegMr { flags: 4, ..good },
            CMD_BAD_PARAM,
        ),
    ];
    for (name, mr, want) in cases {
        assert_eq!(a.try_reg_mr(&mr).err(), Some(want), "{name}");
    }
    // A page that lies outside guest memory, or is misaligned.
    a.write(list + 8, &(64 * MIB).to_le_bytes());
    assert_eq!(a.try_reg_mr(&good).err(), Some(CMD_BAD_ADDRESS));
    a.write(list + 8, &(buf + 100).to_le_bytes());
    assert_eq!(a.try_reg_mr(&good).err(), Some(CMD_BAD_ADDRESS));
}

#[test]
fn test_modify_qp_follows_the_ib_state_rules() {
    let mut a = Driver::new(None, 4);
    let pd = a.alloc_pd();
    let cq = a.create_cq(4);
    let qp = a.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    let to = |s: u32| HcaQpAttr {
        state: s as u8,
        port_num: 1,
        ..Default::default()
    };
    assert_eq!(
        a.modify_qp(qp.qpn, QP_ATTR_STATE, to(QPS_RTS)),
        CMD_BAD_STATE
    );
    assert_eq!(
        a.modify_qp(qp.qpn, QP_ATTR_STATE, to(QPS_INIT)),
        CMD_BAD_PARAM,
        "INIT needs port, pkey, access"
    );
    let m = QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS;
    let mut bad_port = to(QPS_INIT);
    bad_port.port_num = 2;
    assert_eq!(a.modify_qp(qp.qpn, m, bad_port), CMD_BAD_PARAM);
    assert_eq!(
        a.modify_qp(qp.qpn, m | QP_ATTR_QKEY, to(QPS_INIT)),
        CMD_BAD_PARAM,
        "Q_Key is not an RC attribute"
    );
    assert_eq!(a.modify_qp(qp.qpn, m, to(QPS_INIT)), CMD_OK);
    let mut stale = to(QPS_INIT);
    stale.cur_state = QPS_RESET as u8;
    assert_eq!(
        a.modify_qp(qp.qpn, QP_ATTR_STATE | QP_ATTR_CUR_STATE, stale),
        CMD_BAD_STATE
    );
    let mut rtr = to(QPS_RTR);
    rtr.dlid = 1;
    rtr.path_mtu = 9;
    let rtr_mask = RC_RTR_MASK;
    assert_eq!(
        a.modify_qp(qp.qpn, rtr_mask, rtr),
        CMD_BAD_PARAM,
        "MTU out of range"
    );
    rtr.path_mtu = 5;
    rtr.rq_psn = 1 << 24;
    assert_eq!(
        a.modify_qp(qp.qpn, rtr_mask, rtr),
        CMD_BAD_PARAM,
        "PSN is 24 bits"
    );
    rtr.rq_psn = 0;
    assert_eq!(a.modify_qp(qp.qpn, rtr_mask, rtr), CMD_OK);
    assert_eq!(a.qp_state(qp.qpn), QPS_RTR);
    assert_eq!(a.modify_qp(qp.qpn, QP_ATTR_STATE, to(QPS_ERR)), CMD_OK);
    assert_eq!(
        a.modify_qp(qp.qpn, QP_ATTR_STATE, to(QPS_RTS)),
        CMD_BAD_STATE
    );
    assert_eq!(a.modify_qp(qp.qpn, QP_ATTR_STATE, to(QPS_RESET)), CMD_OK);
}

#[test]
fn test_wrs_posted_to_an_error_qp_are_flushed() {
    let mut p = Pair::new(5);
    p.a.to_error(p.qa.qpn);
    let buf = p.a.alloc(8, 8);
    p.a.post_send(
        &mut p.qa,
        send_wr(10, WR_RDMA_WRITE, 0),
        &[sge(buf, 8, p.key_a)],
    );
    p.a.post_recv(&mut p.qa, 11, &[sge(buf, 8, p.key_a)]);
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(c.len(), 2);
    assert_eq!(
        (c[0].wr_id, status(&c[0]), u32::from(c[0].opcode)),
        (10, WC_WR_FLUSH_ERR, CQE_OP_RDMA_WRITE)
    );
    assert_eq!(
        (c[1].wr_id, status(&c[1]), u32::from(c[1].opcode)),
        (11, WC_WR_FLUSH_ERR, CQE_OP_RECV)
    );
}

#[test]
fn test_receives_posted_while_another_thread_moves_the_qp_to_err_are_all_flushed() {
    // A receive doorbell with no QP in ERR takes no turn of the device lock. One racing
    // with its QP's move to ERR (here on A's thread, which delivers the WRITE that B
    // refuses) must still see its receive flushed: each of B's receives completes.
    for round in 0..200u64 {
        let mut p = Pair::new(5);
        let (buf_a, buf_b) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
        let (key_a, key_b) = (p.key_a, p.key_b);
        let Pair { a, b, qa, qb, .. } = &mut p;
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..6 {
                    b.post_recv(qb, i, &[sge(buf_b, 8, key_b)]);
                    if i == round % 6 {
                        std::thread::yield_now();
                    }
                }
            });
            let mut w = send_wr(100, WR_RDMA_WRITE, WQE_SIGNALED);
            (w.remote_addr, w.rkey) = (buf_b, key_b ^ 0x100); // no such MR
            a.post_send(qa, w, &[sge(buf_a, 8, key_a)]);
        });
        assert_eq!(p.b.qp_state(p.qb.qpn), QPS_ERR);
        let got = p.b.drain_statuses(&mut p.cq_b);
        let flushed: Vec<(u64, u32)> = (0..6).map(|i| (i, WC_WR_FLUSH_ERR)).collect();
        assert_eq!(got, flushed, "round {round}");
    }
}

#[test]
fn test_a_qp_reset_out_of_error_keeps_its_new_receives() {
    // A receive doorbell flushes the receives of QPs in ERR only: one brought back from
    // ERR through RESET takes messages into its receives again.
    let mut p = Pair::new(5);
    let to = |s: u32| HcaQpAttr {
        state: s as u8,
        ..Default::default()
    };
    let buf = p.b.alloc(8, 8);
    assert_eq!(p.b.modify_qp(p.qb.qpn, QP_ATTR_STATE, to(QPS_ERR)), CMD_OK);
    p.b.post_recv(&mut p.qb, 1, &[sge(buf, 8, p.key_b)]);
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!((c.len(), status(&c[0])), (1, WC_WR_FLUSH_ERR));

    assert_eq!(
        p.b.modify_qp(p.qb.qpn, QP_ATTR_STATE, to(QPS_RESET)),
        CMD_OK
    );
    (p.qb.sq_pi, p.qb.rq_pi) = (0, 0);
    let la = p.a.lid();
    p.b.bring_up_rc(p.qb.qpn, la, p.qa.qpn, ALL_ACCESS, 5);
    p.b.post_recv(&mut p.qb, 2, &[sge(buf, 8, p.key_b)]);
    assert!(
        p.b.drain_cq(&mut p.cq_b).is_empty(),
        "a live QP's receive waits"
    );

    let src = p.a.alloc(8, 8);
    p.a.write(src, b"intact!!");
    p.a.post_send(&mut p.qa, send_wr(3, WR_SEND, 0), &[sge(src, 8, p.key_a)]);
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!((c.len(), c[0].wr_id, status(&c[0])), (1, 2, WC_SUCCESS));
    assert_eq!(p.b.read(buf, 8), b"intact!!");
}

#[test]
fn test_repeated_doorbell_does_not_rerun_a_command() {
    let mut a = Driver::new(None, 4);
    a.alloc_pd();
    a.hca.doorbell(DB_CMD);
    a.hca.doorbell(DB_CMD);
    assert_eq!(a.hca.stats().commands, 1);
    assert_eq!(a.alloc_pd(), 2);
}

#[test]
fn test_send_while_port_down_gives_retry_exceeded() {
    let mut a = Driver::new(None, 4);
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(4);
    let mut qp = a.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    a.bring_up_rc(qp.qpn, 2, 2, ALL_ACCESS, 5);
    let buf = a.alloc(8, 8);
    a.post_send(
        &mut qp,
        send_wr(1, WR_SEND, 0),
        &[sge(buf, 8, LOCAL_DMA_LKEY)],
    );
    let c = a.drain_cq(&mut cq);
    assert_eq!((c.len(), status(&c[0])), (1, WC_RETRY_EXC_ERR));
    assert_eq!(a.qp_state(qp.qpn), QPS_ERR);
}

#[test]
fn test_write_whose_payload_is_not_its_reth_length_places_nothing() {
    // A peer's RDMA WRITE ONLY whose payload is shorter, or longer, than the length its
    // RETH names is an invalid request: NAKed, the responder's QP to ERR, and not a byte
    // of it in the responder's memory (a short one used to be copied first, then NAKed).
    for payload_len in [32usize, 96] {
        let mut p = Pair::new(5);
        let dst = p.b.alloc(128, 8);
        let psn = p.b.query_qp(p.qb.qpn).rq_psn;
        p.fabric.enqueue(Packet {
            slid: p.a.lid(),
            dlid: p.b.lid(),
            opcode: RC_WRITE_ONLY,
            dest_qpn: p.qb.qpn,
            src_qpn: p.qa.qpn,
            psn,
            reth: Some(Reth {
                va: dst,
                rkey: p.key_b,
                len: 64,
            }),
            payload: Payload::Bytes(vec![0xab; payload_len]),
            count: 1,
            mtu: 4096,
            ..Default::default()
        });
        p.fabric.pump();
        assert_eq!(p.b.qp_state(p.qb.qpn), QPS_ERR, "{payload_len} bytes");
        assert_eq!(p.b.read(dst, 128), vec![0; 128], "{payload_len} bytes");
    }
}
