//! Shared receive queues: several QPs take their receives from one ring, in post order;
//! an empty SRQ is RNR for RC, not an error; the limit event fires once below the limit;
//! a QP leaving for ERR says so (Last WQE Reached) and leaves the SRQ's receives to the
//! others; a broken producer index breaks that SRQ only; commands check every handle.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::packet::{Packet, RC_SEND_FIRST};
use hca_model::{Fabric, LinkDir, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

const MS: Duration = Duration::from_millis(1);

/// A pair whose B side has an SRQ (`1 << log` WQEs, limit `limit`) and `n` RC QPs on it,
/// each connected to a QP of its own on A (A's first is the pair's own `qa`).
struct SrqBench {
    p: Pair,
    srq: SrqH,
    /// (A's QP, B's QP on the SRQ)
    links: Vec<(QpH, QpH)>,
}

impl SrqBench {
    fn new(n: usize, log: u32, limit: u32) -> Self {
        Self::with_mtu(n, log, limit, MTU_4096 as u8)
    }

    fn with_mtu(n: usize, log: u32, limit: u32, mtu: u8) -> Self {
        let mut p = Pair::build(Fabric::with_manual_clock(), mtu, ALL_ACCESS, DEFAULT_RTS);
        let srq = p.b.try_create_srq(p.pd_b, log, limit).expect("create SRQ");
        let mut links = Vec::new();
        for _ in 0..n {
            let qa =
                p.a.try_create_qp(QPT_RC, p.pd_a, (p.cq_a.cqn, p.cq_a.cqn), (6, 6), 0)
                    .unwrap();
            let qb =
                p.b.try_create_qp_on_srq(QPT_RC, p.pd_b, (p.cq_b.cqn, p.cq_b.cqn), srq.srqn)
                    .unwrap();
            let (la, lb) = (p.a.lid(), p.b.lid());
            p.a.bring_up_rc(qa.qpn, lb, qb.qpn, ALL_ACCESS, mtu);
            p.b.bring_up_rc(qb.qpn, la, qa.qpn, ALL_ACCESS, mtu);
            links.push((qa, qb));
        }
        Self { p, srq, links }
    }

    /// Posts a receive of 64 bytes at a fresh buffer on B; returns the buffer.
    fn post(&mut self, wr_id: u64) -> u64 {
        let dst = self.p.b.alloc(64, 64);
        let key = self.p.key_b;
        self.p
            .b
            .post_srq_recv(&mut self.srq, wr_id, &[sge(dst, 64, key)]);
        dst
    }

    /// SENDs `bytes` from A over link `i`.
    fn send(&mut self, i: usize, wr_id: u64, bytes: &[u8]) {
        let src = self.p.a.alloc(64, 64);
        self.p.a.write(src, bytes);
        let key = self.p.key_a;
        let qa = &mut self.links[i].0;
        self.p.a.post_send(
            qa,
            send_wr(wr_id, WR_SEND, WQE_SIGNALED),
            &[sge(src, bytes.len() as u32, key)],
        );
    }

    fn events(&mut self) -> Vec<(u32, u32, u32)> {
        self.p
            .b
            .drain_eq(VEC_ASYNC)
            .iter()
            .filter(|e| {
                !matches!(
                    u32::from(e.event_type),
                    EV_CMD_DONE | EV_PORT_ACTIVE | EV_PORT_DOWN
                )
            })
            .map(|e| (u32::from(e.event_type), e.param, e.data))
            .collect()
    }
}

#[test]
fn test_qps_on_one_srq_take_its_receives_in_post_order() {
    let mut t = SrqBench::new(2, 4, 0);
    let bufs: Vec<u64> = (0..4).map(|k| t.post(100 + k)).collect();
    t.send(0, 1, b"first, on link 0");
    t.send(1, 2, b"second, on link 1");
    t.send(0, 3, b"third, on link 0");
    let cqes = t.p.b.drain_cq(&mut t.p.cq_b);
    let got: Vec<(u64, u32, u32)> = cqes
        .iter()
        .map(|c| (c.wr_id, c.qpn, u32::from(c.status)))
        .collect();
    let (q0, q1) = (t.links[0].1.qpn, t.links[1].1.qpn);
    assert_eq!(
        got,
        vec![
            (100, q0, WC_SUCCESS),
            (101, q1, WC_SUCCESS),
            (102, q0, WC_SUCCESS)
        ]
    );
    assert_eq!(t.p.b.read(bufs[0], 16), b"first, on link 0");
    assert_eq!(t.p.b.read(bufs[1], 17), b"second, on link 1");
    assert_eq!(t.p.b.read(bufs[2], 16), b"third, on link 0");
    assert_eq!(cqes[1].byte_len, 17);
    // The fourth receive is still posted: the next SEND, on either QP, lands in it.
    t.send(1, 4, b"fourth");
    let c = t.p.b.drain_cq(&mut t.p.cq_b);
    assert_eq!((c.len(), c[0].wr_id, c[0].qpn), (1, 103, q1));
    assert_eq!(t.p.b.read(bufs[3], 6), b"fourth");
    assert!(t.events().is_empty(), "no event without a limit");
}

#[test]
fn test_an_empty_srq_is_rnr_until_a_receive_is_posted() {
    let mut t = SrqBench::new(1, 4, 0);
    t.send(0, 7, b"waits for a receive");
    for _ in 0..20 {
        t.p.fabric.advance(MS);
    }
    assert!(t.p.a.drain_cq(&mut t.p.cq_a).is_empty());
    assert!(t.p.a.hca.stats().rnr_naks >= 5, "{:?}", t.p.a.hca.stats());
    let buf = t.post(1);
    let mut sent = Vec::new();
    for _ in 0..20 {
        t.p.fabric.advance(MS);
        sent.extend(t.p.a.drain_cq(&mut t.p.cq_a));
    }
    assert_eq!(sent.len(), 1);
    assert_eq!(u32::from(sent[0].status), WC_SUCCESS);
    assert_eq!(t.p.b.read(buf, 19), b"waits for a receive");
    assert_eq!(t.p.b.qp_state(t.links[0].1.qpn), QPS_RTS);
}

#[test]
fn test_the_limit_event_fires_once_below_the_limit_and_can_be_rearmed() {
    let mut t = SrqBench::new(1, 4, 2);
    let srqn = t.srq.srqn;
    for k in 0..4 {
        t.post(k);
    }
    t.send(0, 1, b"a"); // 3 left
    t.send(0, 2, b"b"); // 2 left: not below 2
    assert!(t.events().is_empty());
    t.send(0, 3, b"c"); // 1 left
    assert_eq!(t.events(), vec![(EV_SRQ_LIMIT, srqn, 0)]);
    let query = |t: &mut SrqBench| {
        let (st, out) = t.p.b.cmd(
            CMD_QUERY_SRQ,
            &HcaCmdHandle {
                handle: srqn,
                rsvd: 0,
            },
        );
        assert_eq!(st, CMD_OK);
        decode::<HcaCmdSrqLimit>(&out).limit
    };
    assert_eq!(query(&mut t), 0, "the event disarmed it");
    t.send(0, 4, b"d"); // 0 left, disarmed: no second event
    assert!(t.events().is_empty());
    assert_eq!(t.p.b.drain_cq(&mut t.p.cq_b).len(), 4);
    // Re-armed at 2 with nothing posted: the next take below it fires again.
    let arm = HcaCmdSrqLimit { srqn, limit: 2 };
    assert_eq!(t.p.b.cmd(CMD_MODIFY_SRQ, &arm).0, CMD_OK);
    assert_eq!(query(&mut t), 2);
    for k in 10..13 {
        t.post(k);
    }
    t.send(0, 5, b"e"); // 2 left
    assert!(t.events().is_empty());
    t.send(0, 6, b"f"); // 1 left
    assert_eq!(t.events(), vec![(EV_SRQ_LIMIT, srqn, 0)]);
    let too_high = HcaCmdSrqLimit { srqn, limit: 17 };
    assert_eq!(t.p.b.cmd(CMD_MODIFY_SRQ, &too_high).0, CMD_BAD_PARAM);
}

#[test]
fn test_a_qp_leaving_for_err_says_last_wqe_and_leaves_the_receives_to_the_others() {
    let mut t = SrqBench::new(2, 4, 0);
    let bufs: Vec<u64> = (0..3).map(|k| t.post(k)).collect();
    let q0 = t.links[0].1.qpn;
    t.p.b.to_error(q0);
    assert_eq!(t.events(), vec![(EV_QP_LAST_WQE, q0, 0)]);
    assert!(
        t.p.b.drain_cq(&mut t.p.cq_b).is_empty(),
        "the SRQ's receives are not flushed with the QP"
    );
    // Modifying it to ERR again says nothing new.
    t.p.b.to_error(q0);
    assert!(t.events().is_empty());
    t.send(1, 9, b"to the other QP");
    let c = t.p.b.drain_cq(&mut t.p.cq_b);
    assert_eq!((c.len(), c[0].wr_id, c[0].qpn), (1, 0, t.links[1].1.qpn));
    assert_eq!(t.p.b.read(bufs[0], 15), b"to the other QP");
}

#[test]
fn test_a_broken_producer_index_breaks_that_srq_only() {
    let mut t = SrqBench::new(1, 2, 0);
    // A second SRQ, with a QP of its own, on the same device.
    let mut other = t.p.b.try_create_srq(t.p.pd_b, 2, 0).unwrap();
    let qa2 =
        t.p.a
            .try_create_qp(QPT_RC, t.p.pd_a, (t.p.cq_a.cqn, t.p.cq_a.cqn), (6, 6), 0)
            .unwrap();
    let qb2 =
        t.p.b
            .try_create_qp_on_srq(QPT_RC, t.p.pd_b, (t.p.cq_b.cqn, t.p.cq_b.cqn), other.srqn)
            .unwrap();
    let (la, lb) = (t.p.a.lid(), t.p.b.lid());
    t.p.a
        .bring_up_rc(qa2.qpn, lb, qb2.qpn, ALL_ACCESS, MTU_4096 as u8);
    t.p.b
        .bring_up_rc(qb2.qpn, la, qa2.qpn, ALL_ACCESS, MTU_4096 as u8);
    t.links.push((qa2, qb2));

    // The driver claims 5 posted on a ring of 4.
    let srqn = t.srq.srqn;
    t.p.b.hca.bar2().store_u32(BAR2_SRQ_DB_OFFSET + srqn * 8, 5);
    t.send(0, 1, b"x");
    let q0 = t.links[0].1.qpn;
    assert_eq!(
        t.events(),
        vec![(EV_SRQ_ERR, srqn, ERR_WQ_INDEX), (EV_QP_LAST_WQE, q0, 0)]
    );
    assert_eq!(t.p.b.qp_state(q0), QPS_ERR);
    let arm = HcaCmdSrqLimit { srqn, limit: 1 };
    assert_eq!(t.p.b.cmd(CMD_MODIFY_SRQ, &arm).0, CMD_BAD_STATE);
    let cqn = t.p.cq_b.cqn;
    assert_eq!(
        t.p.b
            .try_create_qp_on_srq(QPT_RC, t.p.pd_b, (cqn, cqn), srqn)
            .err(),
        Some(CMD_BAD_STATE),
        "no new QP on a broken SRQ"
    );

    // The other SRQ and its QP carry on.
    let dst = t.p.b.alloc(64, 64);
    let key = t.p.key_b;
    t.p.b.post_srq_recv(&mut other, 42, &[sge(dst, 64, key)]);
    t.send(1, 2, b"still fine");
    let c: Vec<_> =
        t.p.b
            .drain_cq(&mut t.p.cq_b)
            .into_iter()
            .filter(|c| c.qpn == t.links[1].1.qpn)
            .collect();
    assert_eq!(
        (c.len(), c[0].wr_id, u32::from(c[0].status)),
        (1, 42, WC_SUCCESS)
    );
    assert_eq!(t.p.b.read(dst, 10), b"still fine");
}

#[test]
fn test_a_too_long_datagram_leaves_the_srq_wqe_for_the_next() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 8);
    let mut b = Driver::new(Some(&fabric), 8);
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    let (mut cq_a, mut cq_b) = (a.create_cq(6), b.create_cq(6));
    let key_a = a.reg_dma_mr(pd_a, ALL_ACCESS);
    let key_b = b.reg_dma_mr(pd_b, ALL_ACCESS);
    let mut srq = b.try_create_srq(pd_b, 3, 0).unwrap();
    let mut qa = a.create_qp(QPT_UD, pd_a, cq_a.cqn, cq_a.cqn);
    let qb = b
        .try_create_qp_on_srq(QPT_UD, pd_b, (cq_b.cqn, cq_b.cqn), srq.srqn)
        .unwrap();
    a.bring_up_ud(qa.qpn, 0x1111, false);
    b.bring_up_ud(qb.qpn, 0x1111, false);
    // Room for the GRH and 100 bytes.
    let dst = b.alloc(256, 64);
    b.post_srq_recv(&mut srq, 5, &[sge(dst, UD_GRH_BYTES + 100, key_b)]);
    let src = a.alloc(512, 64);
    a.write(src, &pattern(512, 4));
    let ud = |wr_id: u64| HcaSendWqe {
        wr_id,
        flags: WQE_SIGNALED as u8,
        ..ud_send_wr(b.lid(), qb.qpn, 0x1111)
    };
    a.post_send(&mut qa, ud(1), &[sge(src, 300, key_a)]);
    a.post_send(&mut qa, ud(2), &[sge(src, 100, key_a)]);
    fabric.advance(MS);
    assert_eq!(a.drain_cq(&mut cq_a).len(), 2);
    let c = b.drain_cq(&mut cq_b);
    assert_eq!(
        (c.len(), c[0].wr_id, c[0].byte_len),
        (1, 5, UD_GRH_BYTES + 100)
    );
    assert_eq!(b.read(dst + u64::from(UD_GRH_BYTES), 100), pattern(100, 4));
    assert_eq!(
        b.qp_state(qb.qpn),
        QPS_RTS,
        "a remote sender never breaks the QP"
    );
}

#[test]
fn test_srq_commands_check_every_handle_and_bound() {
    let fabric = Fabric::with_manual_clock();
    let mut b = Driver::new(Some(&fabric), 8);
    let pd = b.alloc_pd();
    let cq = b.create_cq(4);
    assert_eq!(b.try_create_srq(pd + 1, 4, 0).err(), Some(CMD_BAD_HANDLE));
    assert_eq!(b.try_create_srq(pd, 4, 17).err(), Some(CMD_BAD_PARAM));
    let far = HcaCmdCreateSrq {
        ring_addr: 8 * MIB - 64,
        pdn: pd,
        log_entries: 4,
        wqe_shift: 8,
        ..Default::default()
    };
    assert_eq!(b.cmd(CMD_CREATE_SRQ, &far).0, CMD_BAD_ADDRESS);
    let near = HcaCmdCreateSrq {
        ring_addr: 0x1000,
        ..far
    };
    let too_deep = HcaCmdCreateSrq {
        log_entries: MAX_SRQ_LOG_WR as u8 + 1,
        ..near
    };
    assert_eq!(b.cmd(CMD_CREATE_SRQ, &too_deep).0, CMD_BAD_PARAM);
    for wqe_shift in [MIN_RQ_WQE_SHIFT - 1, MAX_RQ_WQE_SHIFT + 1] {
        let stride = HcaCmdCreateSrq {
            wqe_shift: wqe_shift as u8,
            ..near
        };
        assert_eq!(b.cmd(CMD_CREATE_SRQ, &stride).0, CMD_BAD_PARAM);
    }

    let srq = b.try_create_srq(pd, 4, 0).unwrap();
    assert_eq!(
        b.try_create_qp_on_srq(QPT_RC, pd, (cq.cqn, cq.cqn), srq.srqn + 1)
            .err(),
        Some(CMD_BAD_HANDLE)
    );
    let qp = b
        .try_create_qp_on_srq(QPT_RC, pd, (cq.cqn, cq.cqn), srq.srqn)
        .unwrap();
    let h = |handle| HcaCmdHandle { handle, rsvd: 0 };
    assert_eq!(b.cmd(CMD_DESTROY_SRQ, &h(srq.srqn)).0, CMD_BUSY);
    assert_eq!(b.cmd(CMD_DEALLOC_PD, &h(pd)).0, CMD_BUSY);
    assert_eq!(b.cmd(CMD_DESTROY_QP, &h(qp.qpn)).0, CMD_OK);
    assert_eq!(b.cmd(CMD_DESTROY_SRQ, &h(srq.srqn)).0, CMD_OK);
    assert_eq!(b.cmd(CMD_DESTROY_SRQ, &h(srq.srqn)).0, CMD_BAD_HANDLE);
    assert_eq!(b.cmd(CMD_QUERY_SRQ, &h(srq.srqn)).0, CMD_BAD_HANDLE);
    let arm = HcaCmdSrqLimit {
        srqn: srq.srqn,
        limit: 1,
    };
    assert_eq!(b.cmd(CMD_MODIFY_SRQ, &arm).0, CMD_BAD_HANDLE);

    // The table holds MAX_SRQ - 1 (SRQN 0 is never handed out), then says so.
    let made: Vec<SrqH> = (1..MAX_SRQ)
        .map(|_| b.try_create_srq(pd, 0, 0).unwrap())
        .collect();
    assert_eq!(b.try_create_srq(pd, 0, 0).err(), Some(CMD_NO_RESOURCES));
    for s in &made {
        assert_eq!(b.cmd(CMD_DESTROY_SRQ, &h(s.srqn)).0, CMD_OK);
    }
    assert_eq!(b.cmd(CMD_DEALLOC_PD, &h(pd)).0, CMD_OK);
}

/// Lets a message's first packet through and drops the rest (counting the drops).
struct FirstOnly(AtomicU32);

impl LinkHook for FirstOnly {
    fn on_packet(&self, _: LinkId, _: u64, pkt: &mut Packet) -> Verdict {
        if pkt.opcode == RC_SEND_FIRST {
            Verdict::Pass
        } else {
            self.0.fetch_add(1, Ordering::Relaxed);
            Verdict::Drop
        }
    }
}

/// A QP destroyed (or reset) in the middle of a message it took an SRQ receive for hands
/// the receive back flushed: its slot must come back to the SRQ's owner.
#[test]
fn test_a_half_received_message_completes_its_srq_receive_when_the_qp_goes() {
    for reset in [false, true] {
        let mut t = SrqBench::with_mtu(1, 4, 0, 1);
        let dst = t.p.b.alloc(1024, 64);
        let key_b = t.p.key_b;
        t.p.b
            .post_srq_recv(&mut t.srq, 77, &[sge(dst, 1024, key_b)]);
        let src = t.p.a.alloc(1024, 64);
        let key = t.p.key_a;
        t.p.fabric
            .set_hook(Some(Arc::new(FirstOnly(AtomicU32::new(0)))));
        // 1024 bytes at MTU 256: the first of four packets arrives.
        let qa = &mut t.links[0].0;
        t.p.a.post_send(
            qa,
            send_wr(1, WR_SEND, WQE_SIGNALED),
            &[sge(src, 1024, key)],
        );
        t.p.fabric.advance(MS);
        let early = t.p.b.drain_cq(&mut t.p.cq_b);
        assert!(early.is_empty(), "half received: {early:?}");
        let qpn = t.links[0].1.qpn;
        let h = HcaCmdHandle {
            handle: qpn,
            rsvd: 0,
        };
        if reset {
            let attr = HcaQpAttr {
                state: QPS_RESET as u8,
                ..Default::default()
            };
            assert_eq!(t.p.b.modify_qp(qpn, QP_ATTR_STATE, attr), CMD_OK);
        } else {
            assert_eq!(t.p.b.cmd(CMD_DESTROY_QP, &h).0, CMD_OK);
        }
        let c = t.p.b.drain_cq(&mut t.p.cq_b);
        let got: Vec<(u64, u32, u32)> = c
            .iter()
            .map(|c| (c.wr_id, c.qpn, u32::from(c.status)))
            .collect();
        assert_eq!(got, vec![(77, qpn, WC_WR_FLUSH_ERR)], "reset: {reset}");
        t.p.fabric.set_hook(None);
    }
}

/// Drops and duplicates packets on their way up by a seeded xorshift: 5% each.
struct Chaos(AtomicU64);

impl LinkHook for Chaos {
    fn on_packet(&self, link: LinkId, _: u64, _: &mut Packet) -> Verdict {
        if link.dir != LinkDir::Up {
            return Verdict::Pass;
        }
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0.store(x, Ordering::Relaxed);
        match x % 100 {
            0..=4 => Verdict::Drop,
            5..=9 => Verdict::Duplicate,
            _ => Verdict::Pass,
        }
    }
}

/// Under drops and duplicates, every SEND on every QP lands once, intact, in its own SRQ
/// receive: a resent or duplicated request takes no second WQE.
#[test]
fn test_resends_and_duplicates_take_no_second_srq_receive() {
    let mut t = SrqBench::with_mtu(2, 6, 0, 3);
    t.p.fabric
        .set_hook(Some(Arc::new(Chaos(AtomicU64::new(0x9e37_79b9_7f4a_7c15)))));
    let n = 40u64;
    let mut bufs = Vec::new();
    for k in 0..n {
        let dst = t.p.b.alloc(4096, 64);
        let key = t.p.key_b;
        t.p.b.post_srq_recv(&mut t.srq, k, &[sge(dst, 4096, key)]);
        bufs.push(dst);
    }
    // Sizes from 1 to 3 packets at MTU 1024, alternating QPs.
    let sizes: Vec<usize> = (0..n as usize).map(|k| 100 + (k * 977) % 3000).collect();
    for (k, &len) in sizes.iter().enumerate() {
        let src = t.p.a.alloc(4096, 64);
        t.p.a.write(src, &pattern(len, k as u8));
        let key = t.p.key_a;
        let qa = &mut t.links[k % 2].0;
        t.p.a.post_send(
            qa,
            send_wr(k as u64, WR_SEND, WQE_SIGNALED),
            &[sge(src, len as u32, key)],
        );
    }
    let (mut sent, mut got) = (Vec::new(), Vec::new());
    for _ in 0..2000 {
        t.p.fabric.advance(MS);
        sent.extend(t.p.a.drain_cq(&mut t.p.cq_a));
        got.extend(t.p.b.drain_cq(&mut t.p.cq_b));
        if sent.len() == n as usize && got.len() == n as usize {
            break;
        }
    }
    t.p.fabric.set_hook(None);
    assert_eq!(sent.len(), n as usize, "{:?}", t.p.a.hca.stats());
    assert!(sent.iter().all(|c| u32::from(c.status) == WC_SUCCESS));
    assert_eq!(got.len(), n as usize, "one receive per message, no more");
    // Each QP's messages land in order; the SRQ's WQEs went in order of arrival.
    let mut wr_ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    wr_ids.sort_unstable();
    assert_eq!(wr_ids, (0..n).collect::<Vec<_>>());
    let mut seen = [0usize; 2];
    for c in &got {
        assert_eq!(u32::from(c.status), WC_SUCCESS);
        let link = usize::from(c.qpn == t.links[1].1.qpn);
        // The link's `seen[link]`-th message is message 2 * seen + link.
        let k = 2 * seen[link] + link;
        seen[link] += 1;
        assert_eq!(c.byte_len as usize, sizes[k]);
        let buf = bufs[c.wr_id as usize];
        assert_eq!(
            t.p.b.read(buf, sizes[k]),
            pattern(sizes[k], k as u8),
            "message {k}"
        );
    }
    let s = t.p.a.hca.stats();
    assert!(s.retransmits > 0, "the hook dropped nothing: {s:?}");
    assert!(t.p.b.hca.stats().duplicates > 0, "{:?}", t.p.b.hca.stats());
}
