//! Unreliable connected QPs: RC's SENDs and WRITEs to one peer, never acknowledged or sent
//! again. A WR completes as it goes out (its bytes copied then); what the responder cannot
//! take is dropped with the rest of its message, and both QPs go on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::{LinkDir, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

const MTU_256: u8 = 1;
const MTU_4096: u8 = 5;

/// A UC pair whose QPs let peers write.
fn uc_pair(mtu: u8) -> Pair {
    Pair::uc(mtu, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE)
}

/// One WR from A: `opcode` over `src` (A's) of `len` bytes, to `remote` (B's) for a WRITE.
fn post(p: &mut Pair, wr_id: u64, opcode: u32, src: u64, len: u32, remote: (u64, u32)) {
    let mut wr = send_wr(wr_id, opcode, WQE_SIGNALED);
    wr.imm = 0x1234_5678;
    (wr.remote_addr, wr.rkey) = remote;
    let key = p.key_a;
    p.a.post_send(&mut p.qa, wr, &[sge(src, len, key)]);
}

fn statuses(d: &mut Driver, cq: &mut CqH) -> Vec<(u64, u32, u32)> {
    d.drain_cq(cq)
        .iter()
        .map(|c| (c.wr_id, u32::from(c.status), u32::from(c.opcode)))
        .collect()
}

#[test]
fn test_uc_sends_and_writes_arrive_whole_at_every_size_and_mtu() {
    for (mtu, len) in [
        (MTU_4096, 8usize),
        (MTU_4096, 65536),
        (MTU_256, 1000),
        (3, 0),
    ] {
        let mut p = uc_pair(mtu);
        let kb = p.key_b;
        let src = p.a.alloc(len as u64 + 1, 64);
        let dst = p.b.alloc(2 * len as u64 + 64, 64);
        let data = pattern(len, 9);
        p.a.write(src, &data);
        for (i, op) in [WR_SEND, WR_SEND_IMM, WR_RDMA_WRITE, WR_RDMA_WRITE_IMM]
            .into_iter()
            .enumerate()
        {
            let at = dst + (i as u64 % 2) * len as u64;
            p.b.write(at, &vec![0; len]);
            p.b.post_recv(&mut p.qb, 70 + i as u64, &[sge(at, len as u32, p.key_b)]);
            post(&mut p, i as u64, op, src, len as u32, (at, kb));
            let want_op = match op {
                WR_SEND | WR_SEND_IMM => CQE_OP_SEND,
                _ => CQE_OP_RDMA_WRITE,
            };
            assert_eq!(
                statuses(&mut p.a, &mut p.cq_a),
                [(i as u64, WC_SUCCESS, want_op)]
            );
            let got = p.b.drain_cq(&mut p.cq_b);
            assert_eq!(p.b.read(at, len), data, "mtu {mtu}, {len} bytes, op {op}");
            match op {
                // A plain WRITE takes no receive WQE: the one posted for it is the next's.
                WR_RDMA_WRITE => assert!(got.is_empty()),
                _ => {
                    let r = got[0];
                    let imm = op != WR_SEND;
                    assert_eq!(got.len(), 1);
                    assert_eq!(u32::from(r.status), WC_SUCCESS);
                    assert_eq!(r.byte_len as usize, len);
                    assert_eq!(u32::from(r.flags) & CQE_FLAG_IMM != 0, imm);
                    assert_eq!(r.imm, if imm { 0x1234_5678 } else { 0 });
                    assert_eq!((r.src_qp, r.qpn), (p.qa.qpn, p.qb.qpn));
                }
            }
            if op == WR_RDMA_WRITE {
                // Its receive WQE is used by the WRITE with immediate next.
                p.b.post_recv(&mut p.qb, 99, &[]);
            }
        }
    }
}

/// Holds every UC packet on its way up for a millisecond of fabric time.
struct Slow;

impl LinkHook for Slow {
    fn on_packet(&self, link: LinkId, _now_ns: u64, _pkt: &mut Packet) -> Verdict {
        match link.dir {
            LinkDir::Up => Verdict::Delay(1_000_000),
            _ => Verdict::Pass,
        }
    }
}

/// A UC WR completes when it is sent, before its packets arrive: the buffer is then the
/// consumer's to write, and the peer still gets the bytes that were posted. The device
/// holds the copy, charged to its bound, until the packets are taken.
#[test]
fn test_a_uc_wr_completes_as_sent_and_its_peer_gets_the_bytes_posted() {
    let mut p = uc_pair(MTU_4096);
    p.fabric.set_hook(Some(Arc::new(Slow)));
    let len = 20_000;
    let src = p.a.alloc(len as u64, 64);
    let dst = p.b.alloc(len as u64, 64);
    p.a.write(src, &pattern(len, 4));
    p.b.post_recv(&mut p.qb, 5, &[sge(dst, len as u32, p.key_b)]);
    post(&mut p, 1, WR_SEND, src, len as u32, (0, 0));
    assert_eq!(
        statuses(&mut p.a, &mut p.cq_a),
        [(1, WC_SUCCESS, CQE_OP_SEND)]
    );
    assert!(p.b.drain_cq(&mut p.cq_b).is_empty(), "still on the wire");
    let (_, held) = p.a.hca.in_flight();
    assert!(held >= len, "the copy is charged: {held} bytes");
    p.a.write(src, &pattern(len, 200));
    p.fabric.advance(Duration::from_millis(3));
    assert_eq!(
        statuses(&mut p.b, &mut p.cq_b),
        [(5, WC_SUCCESS, CQE_OP_RECV)]
    );
    assert_eq!(p.b.read(dst, len), pattern(len, 4));
    assert_eq!(
        p.a.hca.in_flight(),
        (0, 0),
        "the copy went with its packets"
    );
}

/// Drops the UC packets it is told to by their order on the wire (the first is 0).
struct DropNth {
    drop: Vec<usize>,
    seen: AtomicUsize,
}

impl LinkHook for DropNth {
    fn on_packet(&self, link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        if link.dir != LinkDir::Up || !pkt.uc {
            return Verdict::Pass;
        }
        let n = self.seen.fetch_add(1, Ordering::Relaxed);
        if self.drop.contains(&n) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }
}

/// A lost packet loses its message and only that: the receive WQE it had taken goes to
/// the next message, no one resends, and both QPs stay in RTS.
#[test]
fn test_a_lost_packet_drops_its_message_and_the_next_one_arrives() {
    let mut p = uc_pair(MTU_256);
    // Three packets each: the second message's middle one is lost.
    let hook = Arc::new(DropNth {
        drop: vec![4],
        seen: AtomicUsize::new(0),
    });
    p.fabric.set_hook(Some(hook));
    let len = 700u32;
    let src = p.a.alloc(3 * len as u64, 64);
    let dst = p.b.alloc(3 * len as u64, 64);
    for m in 0..3u64 {
        p.a.write(src + m * len as u64, &pattern(len as usize, m as u8 + 1));
        let at = dst + m * len as u64;
        p.b.post_recv(&mut p.qb, 10 + m, &[sge(at, len, p.key_b)]);
    }
    for m in 0..3u64 {
        post(&mut p, m, WR_SEND, src + m * len as u64, len, (0, 0));
    }
    let sent: Vec<u32> = statuses(&mut p.a, &mut p.cq_a)
        .iter()
        .map(|s| s.1)
        .collect();
    assert_eq!(sent, [WC_SUCCESS; 3], "the sender never hears of the loss");
    let got = p.b.drain_cq(&mut p.cq_b);
    let ids: Vec<(u64, u32)> = got.iter().map(|c| (c.wr_id, c.byte_len)).collect();
    assert_eq!(
        ids,
        [(10, len), (11, len)],
        "message 1 lost; message 2 in its WQE"
    );
    assert_eq!(p.b.read(dst, len as usize), pattern(len as usize, 1));
    assert_eq!(
        p.b.read(dst + len as u64, len as usize),
        pattern(len as usize, 3)
    );
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_RTS);
    assert_eq!(p.b.qp_state(p.qb.qpn), QPS_RTS);
    assert!(p.b.hca.stats().uc_dropped > 0);
}

/// What RC would NAK (and fail the QP for) UC drops: a SEND with no receive WQE, a WRITE
/// with a bad rkey, a SEND too long for its WQE. The next good message arrives.
#[test]
fn test_the_responder_drops_what_it_cannot_take_and_goes_on() {
    let mut p = uc_pair(MTU_4096);
    let kb = p.key_b;
    let src = p.a.alloc(256, 64);
    let dst = p.b.alloc(256, 64);
    p.a.write(src, &pattern(256, 7));
    // No receive WQE.
    post(&mut p, 1, WR_SEND, src, 64, (0, 0));
    // An rkey that is not one.
    post(&mut p, 2, WR_RDMA_WRITE, src, 64, (dst, kb ^ 0x100));
    // Longer than the WQE it finds: the WQE goes to the next message.
    p.b.post_recv(&mut p.qb, 30, &[sge(dst, 64, p.key_b)]);
    post(&mut p, 3, WR_SEND, src, 128, (0, 0));
    post(&mut p, 4, WR_SEND, src, 64, (0, 0));
    let sent: Vec<u32> = statuses(&mut p.a, &mut p.cq_a)
        .iter()
        .map(|s| s.1)
        .collect();
    assert_eq!(sent, [WC_SUCCESS; 4]);
    assert_eq!(
        statuses(&mut p.b, &mut p.cq_b),
        [(30, WC_SUCCESS, CQE_OP_RECV)]
    );
    assert_eq!(p.b.read(dst, 64), pattern(64, 7));
    assert_eq!(p.b.qp_state(p.qb.qpn), QPS_RTS);
    assert_eq!(p.b.hca.stats().uc_dropped, 3);
}

/// UC has no READs, atomics or SEND with Invalidate: such a WR fails locally.
#[test]
fn test_reads_atomics_and_send_with_invalidate_fail_on_uc() {
    for op in [WR_RDMA_READ, WR_ATOMIC_FETCH_ADD, WR_SEND_INV] {
        let mut p = uc_pair(MTU_4096);
        let kb = p.key_b;
        let src = p.a.alloc(64, 64);
        post(&mut p, 1, op, src, 8, (0x1000, kb));
        let s = statuses(&mut p.a, &mut p.cq_a);
        assert_eq!((s[0].0, s[0].1), (1, WC_LOC_QP_OP_ERR), "op {op}");
        assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
    }
}

/// The copy a UC WR needs counts against the device's bound: one larger than the whole
/// bound fails with a length error; one within it goes.
#[test]
fn test_a_uc_message_over_the_devices_bound_fails_and_one_within_goes() {
    let mut p = uc_pair(MTU_4096);
    let kb = p.key_b;
    p.a.hca.set_in_flight_budget(MIN_IN_FLIGHT_BYTES);
    let big = MIN_IN_FLIGHT_BYTES as u32 + 4096;
    let src = p.a.alloc(u64::from(big), 4096);
    let dst = p.b.alloc(u64::from(big), 4096);
    post(&mut p, 1, WR_RDMA_WRITE, src, big, (dst, kb));
    assert_eq!(statuses(&mut p.a, &mut p.cq_a)[0].1, WC_LOC_LEN_ERR);

    let mut p = uc_pair(MTU_4096);
    let kb = p.key_b;
    p.a.hca.set_in_flight_budget(MIN_IN_FLIGHT_BYTES);
    let len = 1 << 20;
    let src = p.a.alloc(len as u64, 4096);
    let dst = p.b.alloc(len as u64, 4096);
    p.a.write(src, &pattern(len, 8));
    post(&mut p, 1, WR_RDMA_WRITE, src, len as u32, (dst, kb));
    assert_eq!(statuses(&mut p.a, &mut p.cq_a)[0].1, WC_SUCCESS);
    assert_eq!(p.b.read(dst, len), pattern(len, 8));
}

/// UC's transitions take only what UC has: an RC-only attribute (the ACK timeout) is
/// refused.
#[test]
fn test_uc_qps_refuse_rc_only_attributes() {
    let fabric = hca_model::Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 8);
    let pd = a.alloc_pd();
    let cq = a.create_cq(4);
    let q = a.create_qp(QPT_UC, pd, cq.cqn, cq.cqn);
    let init = HcaQpAttr {
        state: QPS_INIT as u8,
        port_num: 1,
        access_flags: ACCESS_REMOTE_WRITE,
        ..Default::default()
    };
    let m = QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS;
    assert_eq!(a.modify_qp(q.qpn, m, init), CMD_OK);
    let rtr = HcaQpAttr {
        state: QPS_RTR as u8,
        dlid: 1,
        dest_qpn: 5,
        path_mtu: MTU_4096,
        max_dest_rd_atomic: 1,
        ..Default::default()
    };
    let m = QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_PATH_MTU | QP_ATTR_DEST_QPN | QP_ATTR_RQ_PSN;
    assert_eq!(
        a.modify_qp(q.qpn, m | QP_ATTR_MAX_DEST_RD_ATOMIC, rtr),
        CMD_BAD_PARAM
    );
    assert_eq!(a.modify_qp(q.qpn, m, rtr), CMD_OK);
    let rts = HcaQpAttr {
        state: QPS_RTS as u8,
        timeout: 14,
        ..Default::default()
    };
    let m = QP_ATTR_STATE | QP_ATTR_SQ_PSN;
    assert_eq!(a.modify_qp(q.qpn, m | QP_ATTR_TIMEOUT, rts), CMD_BAD_PARAM);
    assert_eq!(a.modify_qp(q.qpn, m, rts), CMD_OK);
    assert_eq!(a.query_qp(q.qpn).qp_type, QPT_UC as u8);
}
