//! The fabric's per-link hook: it sees every MTU-sized packet, may rewrite or drop it, and
//! the transport reacts as IB's would.

use std::sync::{Arc, Mutex};

use hca_model::abi::*;
use hca_model::packet::*;
use hca_model::{Fabric, LinkDir, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

/// Records (link, opcode, psn, payload length) of every packet, and can drop or own them.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(LinkId, u8, u32, u32)>>,
    drop_nth: Option<usize>,
    materialize: bool,
}

impl LinkHook for Recorder {
    fn on_packet(&self, link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        let mut seen = self.seen.lock().unwrap();
        seen.push((link, pkt.opcode, pkt.psn, pkt.payload.len()));
        if self.materialize {
            pkt.payload.make_owned().unwrap();
        }
        if Some(seen.len()) == self.drop_nth {
            return Verdict::Drop;
        }
        Verdict::Pass
    }
}

fn ups(r: &Recorder, lid: u16) -> Vec<(u8, u32, u32)> {
    r.seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(l, ..)| l.dir == LinkDir::Up && l.lid == lid)
        .map(|&(_, op, psn, len)| (op, psn, len))
        .collect()
}

#[test]
fn test_hook_sees_each_mtu_packet_of_a_message_on_both_links() {
    let mut p = Pair::new(3); // 1024-byte MTU
    let rec = Arc::new(Recorder::default());
    p.fabric.set_hook(Some(rec.clone()));
    let src = p.a.alloc(3000, 8);
    let dst = p.b.alloc(3000, 8);
    p.a.write(src, &pattern(3000, 4));
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 3000, p.key_b)]);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND_IMM, WQE_SIGNALED),
        &[sge(src, 3000, p.key_a)],
    );
    assert_eq!(
        ups(&rec, p.a.lid()),
        vec![
            (RC_SEND_FIRST, 100, 1024),
            (RC_SEND_MIDDLE, 101, 1024),
            (RC_SEND_LAST_IMM, 102, 952)
        ]
    );
    assert_eq!(
        ups(&rec, p.b.lid()),
        vec![(RC_ACK, 102, 0)],
        "one ACK per message"
    );
    let downs = rec
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(l, ..)| l.dir == LinkDir::Down)
        .count();
    assert_eq!(downs, 4, "every packet crosses the destination's link too");
    assert_eq!(p.b.read(dst, 3000), pattern(3000, 4));
    assert_eq!(p.a.drain_cq(&mut p.cq_a).len(), 1);
}

#[test]
fn test_read_responses_cross_the_hook_packet_by_packet() {
    let mut p = Pair::new(1); // 256-byte MTU
    let rec = Arc::new(Recorder {
        materialize: true, // and the data survives being copied onto the "wire"
        ..Default::default()
    });
    p.fabric.set_hook(Some(rec.clone()));
    let remote = p.b.alloc(700, 8);
    let local = p.a.alloc(700, 8);
    p.b.write(remote, &pattern(700, 6));
    let mut wr = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
    wr.remote_addr = remote;
    wr.rkey = p.key_b;
    p.a.post_send(&mut p.qa, wr, &[sge(local, 700, p.key_a)]);
    assert_eq!(
        ups(&rec, p.b.lid()),
        vec![
            (RC_READ_RESP_FIRST, 100, 256),
            (RC_READ_RESP_MIDDLE, 101, 256),
            (RC_READ_RESP_LAST, 102, 188)
        ]
    );
    assert_eq!(p.a.read(local, 700), pattern(700, 6));
    assert_eq!(u32::from(p.a.drain_cq(&mut p.cq_a)[0].status), WC_SUCCESS);
}

#[test]
fn test_a_dropped_packet_is_resent_after_the_timeout_and_the_wr_succeeds() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), 3, ALL_ACCESS, DEFAULT_RTS);
    let rec = Arc::new(Recorder {
        drop_nth: Some(2),
        ..Default::default()
    });
    p.fabric.set_hook(Some(rec.clone()));
    let src = p.a.alloc(4000, 8);
    p.a.write(src, &pattern(4000, 2));
    let mut wr = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    wr.remote_addr = p.b.alloc(4000, 8);
    wr.rkey = p.key_b;
    p.a.post_send(&mut p.qa, wr, &[sge(src, 4000, p.key_a)]);
    // The third packet arrives early: one sequence NAK, and the rest is resent at once.
    assert_eq!(u32::from(p.a.drain_cq(&mut p.cq_a)[0].status), WC_SUCCESS);
    assert_eq!(p.b.read(wr.remote_addr, 4000), pattern(4000, 2));
    assert_eq!(p.fabric.stats().hook_dropped, 1);
    assert_eq!(p.a.hca.stats().seq_naks, 1);
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_RTS);
}

#[test]
fn test_receive_consumed_by_a_half_received_message_is_flushed_on_error() {
    // 256-byte MTU: 1000 bytes are 4 packets. A manual clock: no resend comes.
    let mut p = Pair::build(Fabric::with_manual_clock(), 1, ALL_ACCESS, DEFAULT_RTS);
    let rec = Arc::new(Recorder {
        drop_nth: Some(7), // the LAST packet, on its way up from A (each is seen up, down)
        ..Default::default()
    });
    p.fabric.set_hook(Some(rec));
    let (src, dst) = (p.a.alloc(1000, 8), p.b.alloc(1000, 8));
    p.b.post_recv(&mut p.qb, 42, &[sge(dst, 1000, p.key_b)]);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, 0),
        &[sge(src, 1000, p.key_a)],
    );
    assert!(p.b.drain_cq(&mut p.cq_b).is_empty(), "message incomplete");
    p.b.to_error(p.qb.qpn);
    let c = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, u32::from(c[0].status)), (42, WC_WR_FLUSH_ERR));
}

#[test]
fn test_a_restarted_node_takes_its_old_lid_and_peers_reach_it_again() {
    let mut p = Pair::new(5);
    let lid_b = p.b.lid();
    assert!(
        p.b.hca.attach_at(&p.fabric, p.a.lid()).is_err(),
        "a live port's LID is not handed out twice"
    );
    // A talks to B (over another QP pair) before B's guest reboots; the old device stays
    // alive (held here) after it leaves the fabric: nothing may reach it there.
    let (mut qa2, mut qb2) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 2, 0);
    let (src0, dst0) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.b.post_recv(&mut qb2, 0, &[sge(dst0, 8, p.key_b)]);
    let wr = send_wr(0, WR_SEND, WQE_SIGNALED);
    p.a.post_send(&mut qa2, wr, &[sge(src0, 8, p.key_a)]);
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(0, WC_SUCCESS)]);
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![(0, WC_SUCCESS)]);
    p.b.hca.detach();
    // B's guest reboots: a fresh device on the same LID, QPs set up again.
    let mut b = Driver::new(None, 8);
    b.hca.attach_at(&p.fabric, lid_b).unwrap();
    assert_eq!(b.lid(), lid_b);
    let pd = b.alloc_pd();
    let key = b.reg_dma_mr(pd, ALL_ACCESS);
    let mut cq = b.create_cq(4);
    let mut qb = b.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    b.bring_up_rc(qb.qpn, p.a.lid(), p.qa.qpn, ALL_ACCESS, 5);
    // A's old QP pointed at the same QPN, which the fresh device hands out again.
    assert_eq!(qb.qpn, p.qb.qpn);
    let (src, dst) = (p.a.alloc(8, 8), b.alloc(8, 8));
    p.a.write(src, b"rebooted");
    b.post_recv(&mut qb, 1, &[sge(dst, 8, key)]);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(b.drain_cq(&mut cq).len(), 1);
    assert_eq!(b.read(dst, 8), b"rebooted");
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(1, WC_SUCCESS)]);
    assert!(
        p.b.drain_cq(&mut p.cq_b).is_empty(),
        "the old device got nothing"
    );
}

/// Records the sender and opcode of every packet as it enters the fabric; the first time a
/// packet from `trigger` passes, rings the doorbell it holds (another guest's send queue).
struct RingOnFirst {
    trigger: u16,
    ring: Mutex<Option<(hca_model::Hca, u32, u32)>>,
    seen: Mutex<Vec<(u16, u8)>>,
}

impl hca_model::PacketTap for RingOnFirst {
    fn on_wire(&self, _now_ns: u64, pkt: &Packet) {
        self.seen.lock().unwrap().push((pkt.slid, pkt.opcode));
        if pkt.slid != self.trigger {
            return;
        }
        if let Some((hca, qpn, pi)) = self.ring.lock().unwrap().take() {
            hca.bar2().store_u32(BAR2_QP_DB_OFFSET + qpn * 8, pi);
            // (Ring 1: the other guest's driver on another CPU than its main thread's.)
            name_in_ring(hca.bar2(), BAR2_SQ_RING_OFFSET + SQ_RING_STRIDE, qpn);
            hca.doorbell(DB_SQ);
        }
    }
}

impl RingOnFirst {
    /// How many of `flood`'s packets entered the fabric before `victim`'s SEND, and all
    /// that entered.
    fn sent_before(&self, victim: u16, flood: u16) -> (usize, Vec<(u16, u8)>) {
        let seen = self.seen.lock().unwrap().clone();
        let at = seen
            .iter()
            .position(|&(slid, op)| slid == victim && op == RC_SEND_ONLY)
            .expect("the victim's SEND went out");
        let n = seen[..at]
            .iter()
            .filter(|&&(slid, _)| slid == flood)
            .count();
        (n, seen)
    }
}

/// Writes 16 one-packet RDMA WRITEs from A to B on `p`'s QP, not rung yet.
fn write_flood(p: &mut Pair) {
    let (src, dst) = (p.a.alloc(4096, 4096), p.b.alloc(4096, 4096));
    for i in 0..16 {
        let mut wr = send_wr(i, WR_RDMA_WRITE, WQE_SIGNALED);
        wr.num_sge = 1;
        (wr.remote_addr, wr.rkey) = (dst, p.key_b);
        p.a.write_send(&mut p.qa, &wr, &[sge(src, 4096, p.key_a)], &[]);
    }
}

#[test]
fn test_a_flood_already_queued_delays_another_senders_packet_by_one_item_not_by_the_flood() {
    let fabric = Fabric::with_manual_clock();
    let mut flood = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    let mut victim = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    // The flood: 16 one-packet RDMA WRITEs queued at once by one doorbell.
    write_flood(&mut flood);
    // The victim's SEND, rung while the flood's first packet is on the wire: its packet
    // is queued behind the other 15.
    let (vsrc, vdst) = (victim.a.alloc(8, 8), victim.b.alloc(8, 8));
    victim
        .b
        .post_recv(&mut victim.qb, 1, &[sge(vdst, 8, victim.key_b)]);
    let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
    wr.num_sge = 1;
    victim
        .a
        .write_send(&mut victim.qa, &wr, &[sge(vsrc, 8, victim.key_a)], &[]);
    let tap = Arc::new(RingOnFirst {
        trigger: flood.a.lid(),
        ring: Mutex::new(Some((victim.a.hca.clone(), victim.qa.qpn, victim.qa.sq_pi))),
        seen: Mutex::default(),
    });
    fabric.set_tap(Some(tap.clone()));
    flood.a.ring_sq(&flood.qa);
    fabric.set_tap(None);

    let (flood_before, seen) = tap.sent_before(victim.a.lid(), flood.a.lid());
    // The first flood packet was on the wire when the victim rang; one more may go first
    // (turns alternate), not the other 14.
    assert!(
        flood_before <= 2,
        "{flood_before} flood packets went first: {seen:?}"
    );
    let c = victim
        .a
        .poll_cq(&mut victim.cq_a)
        .expect("the victim's SEND completed");
    assert_eq!(u32::from(c.status), WC_SUCCESS);
    let done = (0..16)
        .filter(|_| flood.a.poll_cq(&mut flood.cq_a).is_some())
        .count();
    assert_eq!(done, 16, "the flood completed too");
}

#[test]
fn test_pairs_on_threads_of_their_own_and_a_flood_all_deliver_in_order() {
    let fabric = Fabric::with_manual_clock();
    let mut pairs: Vec<Pair> = (0..4)
        .map(|_| Pair::build(fabric.clone(), MTU_256 as u8, ALL_ACCESS, DEFAULT_RTS))
        .collect();
    let mut flood = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    let (src, dst) = (flood.a.alloc(64 << 10, 4096), flood.b.alloc(64 << 10, 4096));
    flood.a.write(src, &pattern(64 << 10, 7));
    std::thread::scope(|s| {
        let workers: Vec<_> = pairs
            .iter_mut()
            .map(|p| s.spawn(|| p.sends_in_order(250)))
            .collect();
        s.spawn(|| {
            for _ in 0..64 {
                let mut wr = send_wr(0, WR_RDMA_WRITE, WQE_SIGNALED);
                wr.num_sge = 1;
                (wr.remote_addr, wr.rkey) = (dst, flood.key_b);
                flood
                    .a
                    .post_send(&mut flood.qa, wr, &[sge(src, 64 << 10, flood.key_a)]);
                while flood.a.poll_cq(&mut flood.cq_a).is_none() {
                    std::thread::yield_now();
                }
            }
        });
        for w in workers {
            w.join().expect("a pair's thread");
        }
    });
    assert_eq!(flood.b.read(dst, 64 << 10), pattern(64 << 10, 7));
    assert_eq!(fabric.backlog(), 0, "nothing left queued");
}

/// A third node C with an RC QP connected to a new QP on `p`'s node B, which reports to
/// B's CQ `b_cq`; C's own CQ has `2^cq_log` entries.
struct ThirdNode {
    d: Driver,
    lid: u16,
    key: u32,
    cq: CqH,
    qp: QpH,
    qp_b: QpH,
}

impl ThirdNode {
    fn connect(p: &mut Pair, b_cq: u32, cq_log: u32) -> Self {
        let mut d = Driver::new(Some(&p.fabric), 4);
        let pd = d.alloc_pd();
        let key = d.reg_dma_mr(pd, ALL_ACCESS);
        let cq = d.create_cq(cq_log);
        let qp = d.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
        let qp_b = p.b.create_qp(QPT_RC, p.pd_b, b_cq, b_cq);
        let (lb, lid) = (p.b.lid(), d.lid());
        d.bring_up_rc(qp.qpn, lb, qp_b.qpn, ALL_ACCESS, MTU_4096 as u8);
        p.b.bring_up_rc(qp_b.qpn, lid, qp.qpn, ALL_ACCESS, MTU_4096 as u8);
        Self {
            d,
            lid,
            key,
            cq,
            qp,
            qp_b,
        }
    }
}

#[test]
fn test_a_flood_to_the_same_port_delays_another_senders_packet_there_by_one_item() {
    // A floods B; C, a third node, sends B one SEND while the flood is on the wire: B's
    // queue serves its sources in turn.
    let mut p = Pair::new(MTU_4096 as u8);
    let cq_bc = p.b.create_cq(6);
    let mut c = ThirdNode::connect(&mut p, cq_bc.cqn, 6);
    let (mut cq_c, mut qc, mut qbc, key_c) = (c.cq, c.qp, c.qp_b, c.key);
    let (c, lc) = (&mut c.d, c.lid);

    write_flood(&mut p);
    let (csrc, bdst) = (c.alloc(8, 8), p.b.alloc(8, 8));
    p.b.post_recv(&mut qbc, 1, &[sge(bdst, 8, p.key_b)]);
    let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
    wr.num_sge = 1;
    c.write_send(&mut qc, &wr, &[sge(csrc, 8, key_c)], &[]);
    let tap = Arc::new(RingOnFirst {
        trigger: p.a.lid(),
        ring: Mutex::new(Some((c.hca.clone(), qc.qpn, qc.sq_pi))),
        seen: Mutex::default(),
    });
    p.fabric.set_tap(Some(tap.clone()));
    p.a.ring_sq(&p.qa);
    p.fabric.set_tap(None);

    let (flood_before, seen) = tap.sent_before(lc, p.a.lid());
    assert!(
        flood_before <= 2,
        "{flood_before} flood packets went first: {seen:?}"
    );
    let done = c.drain_cq(&mut cq_c);
    assert_eq!(done.len(), 1);
    assert_eq!(u32::from(done[0].status), WC_SUCCESS);
}

/// A port whose first delivery panics (a device bug), then counts what it gets.
struct PanicsOnce {
    panicked: std::sync::atomic::AtomicBool,
    got: std::sync::atomic::AtomicUsize,
}

impl hca_model::fabric::PacketSink for PanicsOnce {
    fn deliver(&self, _pkt: Packet) -> Result<(), hca_model::fabric::Rejected> {
        use std::sync::atomic::Ordering::SeqCst;
        if !self.panicked.swap(true, SeqCst) {
            panic!("a device bug");
        }
        self.got.fetch_add(1, SeqCst);
        Ok(())
    }

    fn undeliverable(&self, _pkt: Packet, _why: hca_model::fabric::DropReason) {}
}

#[test]
fn test_a_delivery_that_panics_leaves_its_port_reachable() {
    use std::sync::atomic::Ordering::SeqCst;
    let fabric = Fabric::with_manual_clock();
    let port = Arc::new(PanicsOnce {
        panicked: Default::default(),
        got: Default::default(),
    });
    let sink: Arc<dyn hca_model::fabric::PacketSink> = port.clone();
    let lid = fabric.attach(Arc::downgrade(&sink));
    let packet = || Packet {
        slid: 7,
        dlid: lid,
        opcode: RC_SEND_ONLY,
        count: 1,
        ..Default::default()
    };
    let f = fabric.clone();
    let hit = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        f.enqueue(packet());
        f.pump();
    }));
    assert!(hit.is_err(), "the first delivery panicked");
    // The same thread, and the same port, go on.
    fabric.enqueue(packet());
    fabric.pump();
    assert_eq!(port.got.load(SeqCst), 1, "the next packet arrived");
    assert_eq!(fabric.backlog(), 0);
}

/// Holds the first packet from the port at `lid` on its uplink until released (or, at
/// the latest, until `patience` has passed: then it says so).
struct HoldFirst {
    lid: u16,
    released: Mutex<bool>,
    wake: std::sync::Condvar,
    held: std::sync::atomic::AtomicBool,
    patience: std::time::Duration,
    ran_out: std::sync::atomic::AtomicBool,
}

impl HoldFirst {
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.wake.notify_all();
    }
}

impl LinkHook for HoldFirst {
    fn on_packet(&self, link: LinkId, _now_ns: u64, _pkt: &mut Packet) -> Verdict {
        use std::sync::atomic::Ordering::Relaxed;
        if link.lid != self.lid || link.dir != LinkDir::Up || self.held.swap(true, Relaxed) {
            return Verdict::Pass;
        }
        let released = self.released.lock().unwrap();
        let (released, wait) = self
            .wake
            .wait_timeout_while(released, self.patience, |r| !*r)
            .unwrap();
        drop(released);
        self.ran_out.store(wait.timed_out(), Relaxed);
        Verdict::Pass
    }
}

#[test]
fn test_a_datagram_flood_past_the_backlog_bound_does_not_hold_up_a_victim() {
    use std::sync::atomic::Ordering::Relaxed;
    // A queues 32K datagrams to C with one doorbell (two UD QPs of 16K slots, one turn):
    // more than the fabric's backlog bound, and they stay queued (the hook holds A's first
    // one on the wire). A victim pair's SEND round trips must go on meanwhile: the bound
    // holds back the sender that exceeds it, not everyone on the fabric.
    let fabric = Fabric::with_manual_clock();
    let mut victim = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    let mut a = Driver::new(Some(&fabric), 24);
    let mut c = Driver::new(Some(&fabric), 4);
    let (pd_a, pd_c) = (a.alloc_pd(), c.alloc_pd());
    let (cq_a, cq_c) = (a.create_cq(6), c.create_cq(6));
    let mut floods: Vec<QpH> = (0..2)
        .map(|_| {
            let q = a
                .try_create_qp(QPT_UD, pd_a, (cq_a.cqn, cq_a.cqn), (MAX_QP_LOG_WR, 0), 0)
                .expect("UD QP");
            a.bring_up_ud(q.qpn, 7, false);
            q
        })
        .collect();
    let uc = c.create_qp(QPT_UD, pd_c, cq_c.cqn, cq_c.cqn);
    c.bring_up_ud(uc.qpn, 7, false); // no receives posted: C drops what arrives
    let src = a.alloc(64, 64);
    for q in floods.iter_mut() {
        for _ in 0..1 << MAX_QP_LOG_WR {
            let w = ud_send_wr(c.lid(), uc.qpn, 7);
            a.write_send(q, &w, &[sge(src, 64, LOCAL_DMA_LKEY)], &[]);
        }
    }
    let hold = Arc::new(HoldFirst {
        lid: a.lid(),
        released: Mutex::new(false),
        wake: Default::default(),
        held: false.into(),
        patience: std::time::Duration::from_secs(10),
        ran_out: false.into(),
    });
    fabric.set_hook(Some(hold.clone()));
    for q in &floods {
        a.hca
            .bar2()
            .store_u32(BAR2_QP_DB_OFFSET + q.qpn * 8, q.sq_pi);
        name_in_ring(a.hca.bar2(), BAR2_SQ_RING_OFFSET, q.qpn);
    }
    let wait_for = |what: &str, cond: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "never saw {what}");
            std::thread::yield_now();
        }
    };
    std::thread::scope(|s| {
        // A rings from two threads (as its guest's vCPUs may): the first one's turn queues
        // 16K datagrams and its pump stops on the held one; the second's turn queues the
        // rest, and that thread waits (A is past its bound).
        let (h1, h2) = (a.hca.clone(), a.hca.clone());
        s.spawn(move || h1.doorbell(DB_SQ));
        wait_for("A's first datagram on the wire", &|| {
            hold.held.load(Relaxed)
        });
        s.spawn(move || h2.doorbell(DB_SQ));
        let over = || fabric.backlog() > hca_model::fabric::MAX_BACKLOG;
        wait_for("A past the backlog bound", &over);
        victim.sends_in_order(50);
        hold.release();
    });
    assert!(
        !hold.ran_out.load(Relaxed),
        "the victim's round trips waited for the attacker's backlog"
    );
    fabric.set_hook(None);
    fabric.pump();
    assert_eq!(fabric.backlog(), 0);
}

/// An RC SEND of 8 bytes from `p`'s node A (QP `src_qpn`) to B's QP `dest_qpn`, as A's
/// requester would put it on the wire.
fn raw_send(p: &Pair, src_qpn: u32, dest_qpn: u32, psn: u32) -> Packet {
    Packet {
        slid: p.a.lid(),
        dlid: p.b.lid(),
        opcode: RC_SEND_ONLY,
        src_qpn,
        dest_qpn,
        psn,
        payload: Payload::Bytes(b"8 bytes!".to_vec()),
        count: 1,
        mtu: 4096,
        ..Default::default()
    }
}

#[test]
fn test_a_qps_ack_never_waits_behind_another_qps_packets() {
    // The responder holds an ACK only while the next packet queued for its port continues
    // the same stream (the same sender QP to the same QP): interleaved streams are each
    // ACKed at once, a stream's run of packets once at its end.
    let mut p = Pair::new(5);
    let (qa2, mut qb2) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 4, 0);
    let buf = p.b.alloc(64, 8);
    for i in 0..4 {
        p.b.post_recv(&mut p.qb, i, &[sge(buf + 8 * i, 8, p.key_b)]);
    }
    p.b.post_recv(&mut qb2, 9, &[sge(buf + 32, 8, p.key_b)]);
    let (q1, q2) = ((p.qa.qpn, p.qb.qpn), (qa2.qpn, qb2.qpn));

    let before = p.fabric.stats().delivered;
    for (src, dst, psn) in [(q1.0, q1.1, 100), (q2.0, q2.1, 100), (q1.0, q1.1, 101)] {
        p.fabric.enqueue(raw_send(&p, src, dst, psn));
    }
    p.fabric.pump();
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 3);
    assert_eq!(
        p.fabric.stats().delivered - before,
        6,
        "three requests, each ACKed: none continues the stream before it"
    );

    let before = p.fabric.stats().delivered;
    for psn in [102, 103] {
        p.fabric.enqueue(raw_send(&p, q1.0, q1.1, psn));
    }
    p.fabric.pump();
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 2);
    assert_eq!(
        p.fabric.stats().delivered - before,
        3,
        "two requests of one stream, one ACK"
    );
}

#[test]
fn test_a_long_run_of_one_stream_crosses_in_bursts_with_one_ack() {
    // The pump hands a port a stream's packets in bursts of a bounded size; the ACK the
    // responder holds carries over from one burst to the next while the stream goes on, and
    // every message arrives once and in order.
    let mut p = Pair::new(5);
    let mut cq = p.b.create_cq(7);
    let (qa2, mut qb2) = p.connect_more((p.cq_a.cqn, cq.cqn), 6, 0);
    let buf = p.b.alloc(8 * 40, 8);
    for i in 0..40 {
        p.b.post_recv(&mut qb2, i, &[sge(buf + 8 * i, 8, p.key_b)]);
    }
    let before = p.fabric.stats().delivered;
    for psn in 100..140 {
        p.fabric.enqueue(raw_send(&p, qa2.qpn, qb2.qpn, psn));
    }
    p.fabric.pump();
    let got: Vec<(u64, u32)> = p.b.drain_statuses(&mut cq);
    let want: Vec<(u64, u32)> = (0..40).map(|i| (i, WC_SUCCESS)).collect();
    assert_eq!(got, want);
    assert_eq!(
        p.fabric.stats().delivered - before,
        41,
        "forty requests of one stream, one ACK"
    );
}

#[test]
fn test_a_burst_its_port_refuses_goes_back_packet_by_packet() {
    // B's QP is reset: every packet of the run is refused and bounced to A, none counted
    // as delivered; A's QP fails its front WR and flushes the rest.
    let mut p = Pair::new(5);
    let attr = HcaQpAttr {
        state: QPS_RESET as u8,
        ..Default::default()
    };
    assert_eq!(p.b.modify_qp(p.qb.qpn, QP_ATTR_STATE, attr), 0);
    let src = p.a.alloc(8, 8);
    let (delivered, rejected) = (p.fabric.stats().delivered, p.fabric.stats().rejected);
    let from = sge(src, 8, p.key_a);
    p.sends_at_once(20, from);
    let statuses = p.a.drain_statuses(&mut p.cq_a);
    assert_eq!(statuses.len(), 20);
    assert_eq!(statuses[0], (0, WC_RETRY_EXC_ERR));
    assert!(statuses[1..].iter().all(|s| s.1 == WC_WR_FLUSH_ERR));
    assert_eq!(p.fabric.stats().rejected - rejected, 20);
    assert_eq!(p.fabric.stats().delivered, delivered);
}

/// Holds up the first ACK from `from` on its way up until `go` has been run (on the
/// pumping thread, while the ACK's lane is claimed for it).
struct HoldFirstAck {
    from: u16,
    go: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl LinkHook for HoldFirstAck {
    fn on_packet(&self, link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        if link.dir == LinkDir::Up && pkt.opcode == RC_ACK && pkt.slid == self.from {
            if let Some(go) = self.go.lock().unwrap().take() {
                go();
            }
        }
        Verdict::Pass
    }
}

/// A port's ACK sent inside a pump goes to that pump directly, its lane claimed for it;
/// a packet another thread queues for the same port meanwhile (and leaves to the claim's
/// holder) is still delivered, by that holder, though the other thread never pumps again.
#[test]
fn test_a_packet_queued_behind_an_ack_handed_to_another_threads_pump_is_delivered() {
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    // C writes into A's memory over a QP of its own.
    let mut c = Driver::new(Some(&fabric), 4);
    let pd_c = c.alloc_pd();
    let mut cq_c = c.create_cq(4);
    let mut qc = c.create_qp(QPT_RC, pd_c, cq_c.cqn, cq_c.cqn);
    let qa2 = p.a.create_qp(QPT_RC, p.pd_a, p.cq_a.cqn, p.cq_a.cqn);
    let mtu = MTU_4096 as u8;
    p.a.bring_up_rc(qa2.qpn, c.lid(), qc.qpn, ALL_ACCESS, mtu);
    c.bring_up_rc(qc.qpn, p.a.lid(), qa2.qpn, ALL_ACCESS, mtu);
    let key_c = c.reg_dma_mr(pd_c, ALL_ACCESS);
    let src = c.alloc(64, 64);
    c.write(src, &pattern(64, 9));
    let dst = p.a.alloc(64, 64);
    let key_a = p.key_a;

    let (posted_tx, posted_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    fabric.set_hook(Some(Arc::new(HoldFirstAck {
        from: p.b.lid(),
        go: Mutex::new(Some(Box::new(move || {
            go_tx.send(()).unwrap();
            posted_rx.recv().unwrap();
        }))),
    })));
    let writer = std::thread::spawn(move || {
        go_rx.recv().unwrap();
        let mut w = send_wr(7, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, key_a);
        c.post_send(&mut qc, w, &[sge(src, 64, key_c)]);
        posted_tx.send(()).unwrap();
        // This thread does nothing more that would move the fabric.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(cqe) = c.poll_cq(&mut cq_c) {
                return Some(cqe);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    });
    // A SEND from A to B: B's ACK, sent inside this thread's pump, is held up by the hook
    // while C's WRITE to A is queued behind it.
    let rbuf = p.b.alloc(8, 8);
    p.b.post_recv(&mut p.qb, 1, &[sge(rbuf, 8, p.key_b)]);
    let sbuf = p.a.alloc(8, 8);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(sbuf, 8, p.key_a)],
    );
    let done = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(done.len(), 1, "the SEND completed");
    let cqe = writer.join().unwrap().expect("C's WRITE completed");
    assert_eq!((cqe.wr_id, cqe.status), (7, 0));
    assert_eq!(p.a.read(dst, 64), pattern(64, 9));
    assert_eq!(fabric.backlog(), 0, "nothing left queued");
}

/// A port whose first delivery answers another port (inside the pump: the answer is handed
/// to that pump) and then panics (a device bug); it counts what it gets.
struct AnswersThenPanics {
    fabric: Fabric,
    answer_to: u16,
    panicked: std::sync::atomic::AtomicBool,
}

impl hca_model::fabric::PacketSink for AnswersThenPanics {
    fn deliver(&self, pkt: Packet) -> Result<(), hca_model::fabric::Rejected> {
        use std::sync::atomic::Ordering::SeqCst;
        if !self.panicked.swap(true, SeqCst) {
            self.fabric.enqueue(Packet {
                slid: pkt.dlid,
                dlid: self.answer_to,
                opcode: RC_SEND_ONLY,
                count: 1,
                ..Default::default()
            });
            panic!("a device bug");
        }
        Ok(())
    }

    fn undeliverable(&self, _pkt: Packet, _why: hca_model::fabric::DropReason) {}
}

#[test]
fn test_an_answer_handed_to_a_pump_whose_delivery_panics_is_still_delivered() {
    // The delivery's answer goes to a lane nobody is delivering, so it is handed to the
    // pump, not queued; the delivery then panics, on a thread that ends. The answer must
    // go back to its lane and reach its port, and that lane stay open to everyone.
    use std::sync::atomic::Ordering::SeqCst;
    let fabric = Fabric::with_manual_clock();
    let other = Arc::new(PanicsOnce {
        panicked: true.into(), // counts only
        got: Default::default(),
    });
    let other_sink: Arc<dyn hca_model::fabric::PacketSink> = other.clone();
    let other_lid = fabric.attach(Arc::downgrade(&other_sink));
    let answering: Arc<dyn hca_model::fabric::PacketSink> = Arc::new(AnswersThenPanics {
        fabric: fabric.clone(),
        answer_to: other_lid,
        panicked: Default::default(),
    });
    let lid = fabric.attach(Arc::downgrade(&answering));
    let f = fabric.clone();
    let died = std::thread::spawn(move || {
        f.enqueue(Packet {
            slid: 7,
            dlid: lid,
            opcode: RC_SEND_ONLY,
            count: 1,
            ..Default::default()
        });
        f.pump();
    })
    .join();
    assert!(died.is_err(), "the delivery panicked");
    fabric.pump();
    assert_eq!(other.got.load(SeqCst), 1, "the answer arrived");
    assert_eq!(fabric.backlog(), 0);
}

/// Rings a SEND written on another node (not rung yet) when the first CQE is written on
/// the port at `at`: inside that port's turn, which a cut-through runs on the sender's
/// thread.
struct RingOnFirstCqe {
    at: u16,
    ring: Mutex<Option<(hca_model::Hca, u32, u32)>>,
}

impl hca_model::AdapterHook for RingOnFirstCqe {
    fn cqe(&self, lid: u16, _cqn: u32, _now_ns: u64) -> bool {
        if lid == self.at {
            if let Some((hca, qpn, pi)) = self.ring.lock().unwrap().take() {
                hca.bar2().store_u32(BAR2_QP_DB_OFFSET + qpn * 8, pi);
                name_in_ring(hca.bar2(), BAR2_SQ_RING_OFFSET + SQ_RING_STRIDE, qpn);
                hca.doorbell(DB_SQ);
            }
        }
        false
    }
}

#[test]
fn test_a_turn_hands_a_free_port_one_burst_and_another_senders_packet_goes_next() {
    // With nothing on the links, A's doorbell turn hands what it sent to B itself (a
    // cut-through), but one burst at a time: C's SEND, rung while B takes A's first burst
    // of 64 one-packet WRITE_IMMs, reaches B right after that burst, not after all 64.
    let mut p = Pair::new(MTU_4096 as u8);
    // B's QP for C reports to the same CQ as the QP A writes to: its order is B's.
    let cq_b = p.cq_b.cqn;
    let mut c = ThirdNode::connect(&mut p, cq_b, 4);
    let (mut cq_c, mut qc, mut qbc, key_c) = (c.cq, c.qp, c.qp_b, c.key);
    let (c, lb) = (&mut c.d, p.b.lid());

    let n = 64u64;
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8 * n, 8));
    for i in 0..n {
        p.b.post_recv(&mut p.qb, i, &[]);
    }
    let (csrc, cdst) = (c.alloc(8, 8), p.b.alloc(8, 8));
    p.b.post_recv(&mut qbc, 1000, &[sge(cdst, 8, p.key_b)]);
    let mut wr = send_wr(7, WR_SEND, WQE_SIGNALED);
    wr.num_sge = 1;
    c.write_send(&mut qc, &wr, &[sge(csrc, 8, key_c)], &[]);
    for i in 0..n {
        let mut wr = send_wr(i, WR_RDMA_WRITE_IMM, WQE_SIGNALED);
        (wr.num_sge, wr.remote_addr, wr.rkey, wr.imm) = (1, dst + 8 * i, p.key_b, i as u32);
        p.a.write_send(&mut p.qa, &wr, &[sge(src, 8, p.key_a)], &[]);
    }
    p.fabric.set_adapter_hook(Some(Arc::new(RingOnFirstCqe {
        at: lb,
        ring: Mutex::new(Some((c.hca.clone(), qc.qpn, qc.sq_pi))),
    })));
    p.a.ring_sq(&p.qa);
    p.fabric.set_adapter_hook(None);

    let order: Vec<u64> = p.b.drain_cq(&mut p.cq_b).iter().map(|e| e.wr_id).collect();
    assert_eq!(
        order.len() as u64,
        n + 1,
        "every message arrived: {order:?}"
    );
    let at = order
        .iter()
        .position(|&w| w == 1000)
        .expect("C's SEND arrived");
    // A burst is at most 16 packets; one more may go first as the sources take turns.
    assert!(
        at <= 17,
        "{at} of A's messages reached B before C's: {order:?}"
    );
    let own: Vec<u64> = order.into_iter().filter(|&w| w != 1000).collect();
    assert_eq!(own, (0..n).collect::<Vec<_>>(), "A's arrived in order");
    let sent = p.a.drain_statuses(&mut p.cq_a);
    assert_eq!(sent, (0..n).map(|i| (i, WC_SUCCESS)).collect::<Vec<_>>());
    assert_eq!(c.drain_statuses(&mut cq_c), vec![(7, WC_SUCCESS)]);
    assert_eq!(p.fabric.backlog(), 0, "nothing left queued");
}

/// A second driver for `d`'s device and memory, allocating from a block of `d`'s that `d`
/// leaves alone: another guest thread's view of the same node. It issues its own commands
/// from here on; `d` must issue none.
fn second_view(d: &mut Driver, size: u64) -> Driver {
    let block = d.alloc(size, 4096);
    let mut v = Driver::with_port(d.hca.clone(), d.mem.clone());
    v.alloc(block - 0x1000, 1);
    v
}

#[test]
fn test_two_nodes_sending_to_each_other_from_two_threads_deliver_everything_in_order() {
    // A sends to B on one thread while B sends to A on another: each doorbell's turn holds
    // its own device and hands its packets to the other if that one is free, else queues
    // them. Neither waits for the other (no deadlock), and every SEND arrives once, intact
    // and in order, both ways.
    let mut p = Pair::new(MTU_4096 as u8);
    let (mut a2, mut b2) = (
        second_view(&mut p.a, 2 * MIB),
        second_view(&mut p.b, 2 * MIB),
    );
    let (pd_a, pd_b) = (a2.alloc_pd(), b2.alloc_pd());
    let (key_a, key_b) = (
        a2.reg_dma_mr(pd_a, ALL_ACCESS),
        b2.reg_dma_mr(pd_b, ALL_ACCESS),
    );
    let (cq_a, cq_b) = (a2.create_cq(6), b2.create_cq(6));
    let qa = a2.create_qp(QPT_RC, pd_a, cq_a.cqn, cq_a.cqn);
    let qb = b2.create_qp(QPT_RC, pd_b, cq_b.cqn, cq_b.cqn);
    let (la, lb) = (p.a.lid(), p.b.lid());
    b2.bring_up_rc(qb.qpn, la, qa.qpn, ALL_ACCESS, MTU_4096 as u8);
    a2.bring_up_rc(qa.qpn, lb, qb.qpn, ALL_ACCESS, MTU_4096 as u8);
    // B to A: B's view sends, A's receives.
    let mut back = Pair {
        fabric: p.fabric.clone(),
        a: b2,
        b: a2,
        pd_a: pd_b,
        pd_b: pd_a,
        cq_a: cq_b,
        cq_b: cq_a,
        qa: qb,
        qb: qa,
        key_a: key_b,
        key_b: key_a,
    };
    std::thread::scope(|s| {
        s.spawn(|| p.sends_in_order(1000));
        s.spawn(|| back.sends_in_order(1000));
    });
    assert_eq!(p.fabric.backlog(), 0, "nothing left queued");
}

/// Sets its flag when dropped: threads that loop until it is set stop even when the
/// test's own thread fails.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn test_doorbells_rung_from_two_threads_never_let_a_packet_overtake_another() {
    // A guest's vCPUs ring its send doorbell at once: whichever turn finds a WQE sends
    // it, and each turn hands its packets to B itself unless something of A's is still on
    // its way there. On a lossless fabric no packet of a stream ever overtakes another:
    // B never sees a PSN out of order (no sequence NAK, no duplicate) and A resends
    // nothing.
    // B's own doorbells keep its device busy now and then: A's turns find it taken and
    // queue their packets, which later turns must not overtake.
    let mut p = Pair::new(MTU_4096 as u8);
    let (hca_a, hca_b, qpn_a) = (p.a.hca.clone(), p.b.hca.clone(), p.qa.qpn);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for hca in [&hca_a, &hca_b] {
            let stop = &stop;
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    hca.doorbell(DB_SQ);
                }
            });
        }
        let _stop = StopOnDrop(&stop);
        p.sends_in_order(1000);
    });
    let (a, b) = (p.a.hca.stats(), p.b.hca.stats());
    assert_eq!(
        (a.retransmits, b.seq_naks, b.duplicates),
        (0, 0, 0),
        "QP {qpn_a}'s packets reached B in order"
    );
    assert_eq!(p.fabric.backlog(), 0, "nothing left queued");
}

#[test]
fn test_a_turn_never_hands_over_a_packet_ahead_of_its_own_still_queued_for_that_port() {
    // A packet of A's waits in B's queue (as when B was busy at A's last turn); A's next
    // turn must queue its own behind it, not hand it to B first. (A has sent to B
    // before, over another QP pair: its turns know B's port.)
    let mut p = Pair::new(MTU_4096 as u8);
    let (mut qa2, mut qb2) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 2, 0);
    let buf = p.b.alloc(24, 8);
    p.b.post_recv(&mut qb2, 0, &[sge(buf + 16, 8, p.key_b)]);
    let src = p.a.alloc(8, 8);
    p.a.post_send(
        &mut qa2,
        send_wr(0, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![(0, WC_SUCCESS)]);

    p.b.post_recv(&mut p.qb, 1, &[sge(buf, 8, p.key_b)]);
    p.b.post_recv(&mut p.qb, 2, &[sge(buf + 8, 8, p.key_b)]);
    // The next PSN of A's QP, queued: "8 bytes!" (see raw_send).
    let psn = p.a.query_qp(p.qa.qpn).sq_psn;
    p.fabric.enqueue(raw_send(&p, p.qa.qpn, p.qb.qpn, psn));
    p.a.write(src, b"the next");
    p.a.post_send(
        &mut p.qa,
        send_wr(9, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, p.key_a)],
    );
    // A's own SEND has the same PSN: whichever arrives second is a duplicate, not placed.
    assert_eq!(
        p.b.read(buf, 8),
        b"8 bytes!",
        "the queued packet went first"
    );
    assert_eq!(p.b.hca.stats().duplicates, 1);
    assert_eq!(p.fabric.backlog(), 0);
}

#[test]
fn test_a_doorbell_past_what_one_turn_hands_over_queues_the_rest_in_order() {
    // One doorbell with 600 one-packet SENDs: the turn hands at most 256 packets to B
    // itself (see fabric.rs, CUT_PACKETS), and the rest crosses the queue behind them:
    // every message arrives once, in order, with its own bytes, and none is resent.
    let mut p = Pair::new(MTU_4096 as u8);
    let (mut cq_a, mut cq_b) = (p.a.create_cq(10), p.b.create_cq(10));
    let (mut qa, mut qb) = p.connect_more((cq_a.cqn, cq_b.cqn), 10, 0);
    let n = 600u64;
    let (src, dst) = (p.a.alloc(8 * n, 8), p.b.alloc(8 * n, 8));
    for i in 0..n {
        p.b.post_recv(&mut qb, i, &[sge(dst + 8 * i, 8, p.key_b)]);
        p.a.write(src + 8 * i, &i.to_le_bytes());
        let wr = HcaSendWqe {
            num_sge: 1,
            ..send_wr(i, WR_SEND, WQE_SIGNALED)
        };
        p.a.write_send(&mut qa, &wr, &[sge(src + 8 * i, 8, p.key_a)], &[]);
    }
    p.a.ring_sq(&qa);
    let all: Vec<(u64, u32)> = (0..n).map(|i| (i, WC_SUCCESS)).collect();
    assert_eq!(
        p.b.drain_statuses(&mut cq_b),
        all,
        "received once each, in order"
    );
    for i in 0..n {
        assert_eq!(
            p.b.read(dst + 8 * i, 8),
            i.to_le_bytes(),
            "SEND {i}'s bytes"
        );
    }
    assert_eq!(p.a.drain_statuses(&mut cq_a), all);
    let (a, b) = (p.a.hca.stats(), p.b.hca.stats());
    assert_eq!((a.retransmits, b.seq_naks, b.duplicates), (0, 0, 0));
    assert_eq!(p.fabric.backlog(), 0, "nothing left queued");
}
