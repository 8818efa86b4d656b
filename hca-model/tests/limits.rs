//! What one guest's send queue can make the device hold is bounded: no more WRs in flight
//! than its send queue has slots (however far a hostile guest moves its producer index),
//! no more READs/atomics in flight than `max_rd_atomic`, and no more host memory for
//! requests in flight than `MAX_IN_FLIGHT_BYTES` (plus one WR). A send queue that reaches
//! a limit waits, and goes on as WRs complete.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::{Fabric, LinkDir, LinkHook, LinkId, Verdict, WR_FIXED_BYTES, WR_SLOT_BYTES};
use hca_test_driver::*;

/// Drops everything one port sends while `on` (its peer hears nothing back).
struct Mute {
    lid: u16,
    on: AtomicBool,
}

impl LinkHook for Mute {
    fn on_packet(&self, link: LinkId, _now: u64, _pkt: &mut Packet) -> Verdict {
        if self.on.load(Relaxed) && link.dir == LinkDir::Up && link.lid == self.lid {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }
}

fn mute(fabric: &Fabric, lid: u16) -> Arc<Mute> {
    let m = Arc::new(Mute {
        lid,
        on: true.into(),
    });
    fabric.set_hook(Some(m.clone()));
    m
}

#[test]
fn test_a_producer_index_run_ahead_never_puts_more_wrs_in_flight_than_the_queue_holds() {
    let mut p = Pair::new(3);
    // B answers nothing: every SEND stays in flight.
    mute(&p.fabric, p.b.lid());
    let src = p.a.alloc(64, 64);
    let size = 1usize << p.qa.sq_log;
    // A hostile guest rings its producer index three queues ahead, reusing every slot.
    for i in 0..3 * size {
        let w = HcaSendWqe {
            wr_id: i as u64,
            opcode: WR_SEND as u8,
            ..Default::default()
        };
        p.a.post_send(&mut p.qa, w, &[sge(src, 64, p.key_a)]);
    }
    let (wrs, _) = p.a.hca.in_flight();
    assert_eq!(wrs, size, "one queue's worth in flight");
    assert_eq!(p.a.hca.stats().wqes, size as u64, "the rest wait");
}

#[test]
fn test_reads_beyond_max_rd_atomic_wait_for_responses_then_all_complete() {
    let mut p = Pair::new(3); // the pair's QPs have max_rd_atomic 4
    let m = mute(&p.fabric, p.b.lid());
    let src = p.b.alloc(8 * 256, 64);
    p.b.write(src, &pattern(8 * 256, 5));
    let dst = p.a.alloc(8 * 256, 64);
    for i in 0..8u64 {
        let w = HcaSendWqe {
            wr_id: i,
            opcode: WR_RDMA_READ as u8,
            flags: WQE_SIGNALED as u8,
            remote_addr: src + i * 256,
            rkey: p.key_b,
            ..Default::default()
        };
        p.a.post_send(&mut p.qa, w, &[sge(dst + i * 256, 256, p.key_a)]);
    }
    assert_eq!(p.a.hca.in_flight().0, 4, "four READs out, four wait");
    // Responses flow again (the timer resends the lost ones): every READ completes.
    m.on.store(false, Relaxed);
    let mut done = Vec::new();
    for _ in 0..50 {
        p.fabric.advance(Duration::from_millis(20));
        done.extend(p.a.drain_cq(&mut p.cq_a));
        if done.len() == 8 {
            break;
        }
    }
    assert_eq!(done.len(), 8, "{done:?}");
    assert!(done.iter().all(|c| u32::from(c.status) == WC_SUCCESS));
    assert_eq!(p.a.read(dst, 8 * 256), pattern(8 * 256, 5));
}

/// 512 SENDs of 64 MiB, each gathered from one page (16K records, 256 KiB of host memory
/// each), posted to `qa`; returns (WRs posted, host bytes one WR holds).
fn post_big_sends(p: &mut Pair, qa: &mut QpH, lkey: u32, iova: u64, npages: u64) -> usize {
    let posted = 512usize; // 128 MiB of records if all were in flight
    for i in 0..posted {
        let w = HcaSendWqe {
            wr_id: i as u64,
            opcode: WR_SEND as u8,
            ..Default::default()
        };
        p.a.post_send(qa, w, &[sge(iova, (npages * 4096) as u32, lkey)]);
    }
    posted
}

#[test]
fn test_host_memory_for_requests_in_flight_is_bounded_per_device() {
    // B posts no receives: its RNR NAKs keep every SEND in flight (rnr_retry 7: forever).
    let mut p = Pair::new(3);
    // A send queue of 1024 slots, so that its window is no bound here.
    let (mut qa, _qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 10, 0);
    let npages = 16384u64;
    let (lkey, iova) = p.a.repeated_page_mr(p.pd_a, npages);
    let per_wr = npages as usize * 16;
    let posted = post_big_sends(&mut p, &mut qa, lkey, iova, npages);
    let (wrs, bytes) = p.a.hca.in_flight();
    assert!(
        bytes <= MAX_IN_FLIGHT_BYTES + per_wr,
        "{bytes} bytes held for {wrs} WRs"
    );
    assert!(wrs < posted, "the rest wait: {wrs}");
    assert!(
        bytes >= MAX_IN_FLIGHT_BYTES / 2,
        "and the bound is not tiny: {bytes}"
    );
}

#[test]
fn test_a_host_sets_the_bound_per_device() {
    // As above with a budget of 8 MiB (a cluster file's `device_memory_mib = 8`).
    let mut p = Pair::new(3);
    p.a.hca.set_in_flight_budget(8 << 20);
    let (mut qa, _qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 10, 0);
    let npages = 16384u64;
    let (lkey, iova) = p.a.repeated_page_mr(p.pd_a, npages);
    let per_wr = npages as usize * 16;
    post_big_sends(&mut p, &mut qa, lkey, iova, npages);
    let (wrs, bytes) = p.a.hca.in_flight();
    assert!(
        bytes <= (8 << 20) + per_wr,
        "{bytes} bytes held for {wrs} WRs"
    );
    assert!(bytes >= 4 << 20, "{bytes} bytes held for {wrs} WRs");
    // Below the least a host may set, the least holds.
    p.b.hca.set_in_flight_budget(1);
    let (mut qb2, _qa2) = {
        let (x, y) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 10, 0);
        (y, x)
    };
    let (lkey_b, iova_b) = p.b.repeated_page_mr(p.pd_b, npages);
    for i in 0..64u64 {
        let w = HcaSendWqe {
            wr_id: i,
            opcode: WR_SEND as u8,
            ..Default::default()
        };
        p.b.post_send(&mut qb2, w, &[sge(iova_b, (npages * 4096) as u32, lkey_b)]);
    }
    let (_, bytes) = p.b.hca.in_flight();
    assert!(
        (MIN_IN_FLIGHT_BYTES..=MIN_IN_FLIGHT_BYTES + per_wr).contains(&bytes),
        "{bytes}"
    );
}

#[test]
fn test_every_wr_counts_its_fixed_share_and_long_gather_lists_their_records() {
    // B posts no receives: its RNR NAKs keep each SEND in flight.
    let mut p = Pair::new(3);
    let (mut qa, _qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 10, 0);
    // One contiguous piece: the WR's fixed share alone.
    let buf = p.a.alloc(8192, 4096);
    let one = sge(buf, 8192, LOCAL_DMA_LKEY);
    p.a.post_send(&mut qa, send_wr(1, WR_SEND, 0), &[one]);
    assert_eq!(p.a.hca.in_flight(), (1, WR_FIXED_BYTES));
    // Three pages that are not contiguous: three 16-byte records on the heap.
    let (lkey, iova) = p.a.repeated_page_mr(p.pd_a, 3);
    let three = sge(iova, 3 * 4096, lkey);
    p.a.post_send(&mut qa, send_wr(2, WR_SEND, 0), &[three]);
    assert_eq!(p.a.hca.in_flight(), (2, 2 * WR_FIXED_BYTES + 3 * 16));
}

#[test]
fn test_memory_a_qp_held_returns_to_the_device_when_it_fails_or_goes() {
    let mut p = Pair::new(3);
    let npages = 16384u64;
    let (lkey, iova) = p.a.repeated_page_mr(p.pd_a, npages);
    let cqs = (p.cq_a.cqn, p.cq_b.cqn);
    // A QP that fills the device's bound, then goes to ERR (its WRs flushed).
    let (mut q1, _) = p.connect_more(cqs, 10, 0);
    post_big_sends(&mut p, &mut q1, lkey, iova, npages);
    assert!(p.a.hca.in_flight().1 >= MAX_IN_FLIGHT_BYTES / 2);
    p.a.to_error(q1.qpn);
    assert_eq!(p.a.hca.in_flight(), (0, 0), "ERR flushed what it held");
    // Another fills it again and is destroyed with its WRs in flight.
    let (mut q2, _) = p.connect_more(cqs, 10, 0);
    post_big_sends(&mut p, &mut q2, lkey, iova, npages);
    assert!(p.a.hca.in_flight().1 >= MAX_IN_FLIGHT_BYTES / 2);
    let h = HcaCmdHandle {
        handle: q2.qpn,
        rsvd: 0,
    };
    assert_eq!(p.a.cmd(CMD_DESTROY_QP, &h).0, CMD_OK);
    assert_eq!(p.a.hca.in_flight(), (0, 0), "a destroyed QP holds nothing");
    // The device's room is whole again: a third QP gets as far as the first did.
    let (mut q3, _) = p.connect_more(cqs, 10, 0);
    post_big_sends(&mut p, &mut q3, lkey, iova, npages);
    assert!(p.a.hca.in_flight().1 >= MAX_IN_FLIGHT_BYTES / 2);
}

/// Fast registrations of 64K pages each: one doorbell's worth is 4M page-list reads, which
/// the device does over many turns of its lock, never in one.
#[test]
fn test_a_long_send_queue_is_worked_through_in_bounded_turns() {
    let mut p = Pair::new(3);
    let (mut qa, _qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 7, 0);
    let npages = 65536u32;
    let frmr =
        p.a.try_reg_mr(&HcaCmdRegMr {
            pdn: p.pd_a,
            npages,
            flags: MR_FLAG_FAST_REG,
            ..Default::default()
        })
        .expect("fast-reg MR");
    let page = p.a.alloc(4096, 4096);
    let list = p.a.alloc(u64::from(npages) * 8, 8);
    for i in 0..u64::from(npages) {
        p.a.write(list + i * 8, &page.to_le_bytes());
    }
    let before = p.a.hca.stats();
    for i in 0..64u64 {
        p.a.write_reg_mr(
            &mut qa,
            HcaRegMrWqe {
                wr_id: i,
                access: ACCESS_LOCAL_WRITE,
                iova: 0x1000_0000,
                key: frmr,
                npages,
                length: u64::from(npages) * 4096,
                page_list: list,
                page_shift: 12,
                ..Default::default()
            },
        );
    }
    p.a.ring_sq(&qa);
    let after = p.a.hca.stats();
    assert_eq!(
        after.wqes - before.wqes,
        64,
        "all done by the time the doorbell returns"
    );
    assert!(
        after.extra_turns - before.extra_turns >= 32,
        "4M page reads in turns of 64K units: {} extra turns",
        after.extra_turns - before.extra_turns
    );
}

/// Slows every delivery down (as a busy receiver would), and notes the longest queue seen.
struct Slow {
    fabric: Fabric,
    peak: std::sync::atomic::AtomicUsize,
}

impl LinkHook for Slow {
    fn on_packet(&self, link: LinkId, _: u64, _: &mut Packet) -> Verdict {
        if link.dir == LinkDir::Down {
            self.peak.fetch_max(self.fabric.backlog(), Relaxed);
            std::thread::sleep(Duration::from_micros(20));
        }
        Verdict::Pass
    }
}

/// A guest that floods datagrams faster than the fabric moves them waits for it: the queue
/// never holds much more than MAX_BACKLOG items.
#[test]
fn test_a_datagram_flood_waits_for_the_fabric_instead_of_growing_its_queue() {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 8);
    let mut b = Driver::new(Some(&fabric), 8);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(12), b.create_cq(6));
    let mut ua = a
        .try_create_qp(QPT_UD, pa, (ca.cqn, ca.cqn), (12, 6), 0)
        .expect("UD QP");
    let ub = b.create_qp(QPT_UD, pb, cb.cqn, cb.cqn);
    a.bring_up_ud(ua.qpn, 7, false);
    b.bring_up_ud(ub.qpn, 7, false);
    let slow = Arc::new(Slow {
        fabric: fabric.clone(),
        peak: 0.into(),
    });
    fabric.set_hook(Some(slow.clone()));
    // Another sender keeps the fabric busy (it pumps, slowly) while A floods.
    let started = Arc::new(AtomicBool::new(false));
    let busy = {
        let (f, started) = (fabric.clone(), started.clone());
        let lid = b.lid();
        std::thread::spawn(move || {
            for _ in 0..2000 {
                f.enqueue(Packet {
                    slid: 1,
                    dlid: lid,
                    opcode: hca_model::packet::UD_SEND_ONLY,
                    dest_qpn: 0xffff,
                    ..Default::default()
                });
            }
            started.store(true, Relaxed);
            f.pump();
        })
    };
    while !started.load(Relaxed) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(2));
    let src = a.alloc(64, 64);
    let size = 1usize << 12;
    let mut sent = 0;
    for _ in 0..10 {
        for _ in 0..size {
            let w = ud_send_wr(b.lid(), ub.qpn, 7);
            a.write_send(&mut ua, &w, &[sge(src, 64, LOCAL_DMA_LKEY)], &[]);
            sent += 1;
        }
        a.ring_sq(&ua);
    }
    busy.join().unwrap();
    fabric.pump();
    let peak = slow.peak.load(Relaxed);
    assert!(sent >= 40000);
    assert!(
        peak <= hca_model::fabric::MAX_BACKLOG + size + 200,
        "the queue reached {peak} items"
    );
}

/// A long message crosses the fabric in pieces of about 1 MiB (the fabric and the peer take
/// one piece at a time), and arrives whole and intact, with one completion.
#[test]
fn test_a_long_message_moves_in_pieces_and_arrives_whole() {
    let fabric = Fabric::with_manual_clock();
    let p = Pair::build_with_memory(fabric.clone(), 24, 5, ALL_ACCESS, DEFAULT_RTS);
    let Pair {
        mut a,
        mut b,
        mut cq_a,
        mut qa,
        key_a: ka,
        key_b: kb,
        ..
    } = p;
    let len = 8u64 << 20;
    let (src, dst) = (a.alloc(len, 4096), b.alloc(len, 4096));
    a.write(src, &pattern(len as usize, 11));
    let before = fabric.stats().delivered;
    let w = HcaSendWqe {
        wr_id: 1,
        opcode: WR_RDMA_WRITE as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr: dst,
        rkey: kb,
        ..Default::default()
    };
    a.post_send(&mut qa, w, &[sge(src, len as u32, ka)]);
    let c = a.drain_cq(&mut cq_a);
    assert_eq!((c.len(), u32::from(c[0].status)), (1, WC_SUCCESS));
    // Eight 1 MiB pieces, and the ACK.
    assert_eq!(fabric.stats().delivered - before, 9);
    assert_eq!(b.read(dst, len as usize), pattern(len as usize, 11));
}

#[test]
fn test_many_floods_at_once_bound_the_fabric_queue_in_all() {
    // Nine sources each leave just under the per-port bound queued for C (raw packets from
    // LIDs no HCA holds, which C refuses; queued by another thread, which leaves them): more
    // than the fabric's total bound. The next device turn to end, A's, whose own traffic
    // goes elsewhere, waits (pumping) until the queue is back within it.
    use hca_model::fabric::{MAX_BACKLOG, MAX_TOTAL_BACKLOG};
    let mut p = Pair::new(3);
    let c = Driver::new(Some(&p.fabric), 4);
    let (fabric, dlid) = (p.fabric.clone(), c.lid());
    std::thread::spawn(move || {
        for src in 0..9u16 {
            for _ in 0..MAX_BACKLOG - 1 {
                fabric.enqueue(Packet {
                    slid: 100 + src,
                    dlid,
                    opcode: hca_model::packet::UD_SEND_ONLY,
                    dest_qpn: 0xffff,
                    ..Default::default()
                });
            }
        }
    })
    .join()
    .unwrap();
    assert!(p.fabric.backlog() > MAX_TOTAL_BACKLOG);
    let src = p.a.alloc(8, 8);
    let key = p.key_a;
    p.a.post_send(&mut p.qa, send_wr(1, WR_RDMA_WRITE, 0), &[sge(src, 8, key)]);
    let left = p.fabric.backlog();
    assert!(left <= MAX_TOTAL_BACKLOG, "{left} items still queued");
}

#[test]
fn test_a_qp_with_nothing_in_flight_waits_at_the_device_bound_and_goes_on_when_it_frees() {
    // B posts no receives: the first QP's big SENDs stay in flight (RNR, retried forever)
    // and fill the device's bound.
    let mut p = Pair::new(3);
    let npages = 16384u64;
    let (lkey, iova) = p.a.repeated_page_mr(p.pd_a, npages);
    // Its own CQ, with room for all it flushes.
    let big_cq = p.a.create_cq(10);
    let (mut q1, _) = p.connect_more((big_cq.cqn, p.cq_b.cqn), 10, 0);
    post_big_sends(&mut p, &mut q1, lkey, iova, npages);
    assert!(p.a.hca.in_flight().1 >= MAX_IN_FLIGHT_BYTES);
    // Another QP, holding nothing, waits too: one WR more per QP would take a device
    // with many QPs far past its bound.
    let (wrs, _) = p.a.hca.in_flight();
    let (src, dst) = (p.a.alloc(64, 64), p.b.alloc(64, 64));
    let w = HcaSendWqe {
        wr_id: 77,
        opcode: WR_RDMA_WRITE as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr: dst,
        rkey: p.key_b,
        ..Default::default()
    };
    let key = p.key_a;
    p.a.write(src, &pattern(64, 9));
    p.a.post_send(&mut p.qa, w, &[sge(src, 64, key)]);
    assert_eq!(p.a.hca.in_flight().0, wrs, "the WRITE waits");
    // The first QP fails: what it held is the device's again, and the waiting WRITE goes
    // on by itself (no doorbell rung).
    p.a.to_error(q1.qpn);
    let qpn = p.qa.qpn;
    let done: Vec<_> =
        p.a.drain_cq(&mut p.cq_a)
            .into_iter()
            .filter(|c| c.qpn == qpn)
            .map(|c| (c.wr_id, u32::from(c.status)))
            .collect();
    assert_eq!(done, [(77, WC_SUCCESS)]);
    assert_eq!(p.b.read(dst, 64), pattern(64, 9));
}

#[test]
fn test_a_full_window_counts_its_queues_room_and_gives_it_back_as_its_wrs_complete() {
    // B posts no receives at first: its RNR NAKs keep every SEND of a full window in
    // flight (rnr_retry 7: forever).
    let mut p = Pair::new(3);
    let log = 12u32;
    let (mut qa, mut qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), log, 0);
    let n = 1usize << log;
    for i in 0..n {
        p.a.write_send(&mut qa, &send_wr(i as u64, WR_SEND, 0), &[], &[]);
    }
    p.a.ring_sq(&qa);
    let (wrs, bytes) = p.a.hca.in_flight();
    assert_eq!(wrs, n);
    // Each WR's share, and the queues' room for them: at least a slot per WR, at most
    // twice that (the queues grow by doubling).
    assert!(bytes >= n * WR_FIXED_BYTES, "{bytes}");
    assert!(bytes <= n * WR_FIXED_BYTES + n * WR_SLOT_BYTES, "{bytes}");
    // B takes them all now: every WR completes, and the room goes with them.
    for i in 0..n {
        p.b.post_recv(&mut qb, i as u64, &[]);
    }
    for _ in 0..50 {
        p.fabric.advance(Duration::from_millis(20));
        if p.a.hca.in_flight().0 == 0 {
            break;
        }
    }
    assert_eq!(
        p.a.hca.in_flight(),
        (0, 0),
        "nothing held once all completed"
    );
    let st = p.b.hca.stats();
    assert_eq!(st.cqes + st.cqes_lost, n as u64, "B received every one");
}
