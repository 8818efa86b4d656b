//! The RC transport under loss, in virtual time (a manual-clock fabric): resends keep data
//! intact and every WR completes exactly once; retries run out into the IB error status
//! within the bound the QP's attributes give; a link that flaps costs time, not data; RNR
//! NAKs wait for a receive WQE, or run out.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::faults::{FaultHook, FaultPlan};
use hca_model::packet::{
    Packet, AETH_ACK, RC_ACK, RC_READ_REQUEST, RC_READ_RESP_FIRST, RC_READ_RESP_LAST,
    RC_READ_RESP_ONLY, RC_SEND_ONLY,
};
use hca_model::reliability::ack_timeout_ns;
use hca_model::{Fabric, HcaStats, LinkDir, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

/// Drops each packet with probability `per_mille`/1000 (a seeded xorshift), or every packet
/// while `down`; `acks_only` limits the drops to ACKs.
struct Lossy {
    state: AtomicU64,
    per_mille: u64,
    down: AtomicBool,
    acks_only: bool,
    dropped: AtomicU64,
}

impl Lossy {
    fn new(seed: u64, per_mille: u64) -> Arc<Self> {
        Arc::new(Self {
            state: AtomicU64::new(seed | 1),
            per_mille,
            down: AtomicBool::new(false),
            acks_only: false,
            dropped: AtomicU64::new(0),
        })
    }

    fn next(&self) -> u64 {
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.store(x, Ordering::Relaxed);
        x
    }
}

impl LinkHook for Lossy {
    fn on_packet(&self, link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        // Each packet is judged once, on its way up.
        if link.dir != LinkDir::Up || (self.acks_only && pkt.opcode != RC_ACK) {
            return Verdict::Pass;
        }
        if self.down.load(Ordering::Relaxed) || self.next() % 1000 < self.per_mille {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Verdict::Drop;
        }
        Verdict::Pass
    }
}

const MS: Duration = Duration::from_millis(1);
/// IB path MTU code 3: 1024-byte packets.
const MTU_1024: u8 = 3;

/// Advances virtual time a millisecond at a time until `cq` has given `n` CQEs or
/// `limit` passes; the CQEs and the virtual time it took.
fn collect(
    fabric: &Fabric,
    d: &mut Driver,
    cq: &mut CqH,
    n: usize,
    limit: Duration,
) -> (Vec<HcaCqe>, Duration) {
    let start = fabric.now_ns();
    let mut got = d.drain_cq(cq);
    while got.len() < n && fabric.now_ns() - start < limit.as_nanos() as u64 {
        fabric.advance(MS);
        got.extend(d.drain_cq(cq));
    }
    (got, Duration::from_nanos(fabric.now_ns() - start))
}

/// Polls `cq` on the real clock until it gave `n` CQEs or `limit` passed.
fn collect_real(
    d: &mut Driver,
    cq: &mut CqH,
    n: usize,
    limit: Duration,
) -> (Vec<HcaCqe>, Duration) {
    let start = std::time::Instant::now();
    let mut got = d.drain_cq(cq);
    while got.len() < n && start.elapsed() < limit {
        std::thread::sleep(Duration::from_micros(200));
        got.extend(d.drain_cq(cq));
    }
    (got, start.elapsed())
}

/// A workload of every RC operation: 8 KiB writes (8 packets at MTU 1024), sends of 3 KiB
/// into posted receives, 8 KiB reads, and fetch-and-adds on one counter; all must complete
/// successfully, once each, with the bytes and the counter exact.
fn mixed_workload_survives(per_mille: u64, seed: u64, acks_only: bool) -> u64 {
    let hook = Lossy::new(seed, per_mille);
    let hook = Arc::new(Lossy {
        acks_only,
        ..Arc::into_inner(hook).unwrap()
    });
    let label = format!(
        "{per_mille}/1000 loss{}",
        if acks_only { " (ACKs only)" } else { "" }
    );
    let stats = mixed_workload(hook.clone(), &label);
    let dropped = hook.dropped.load(Ordering::Relaxed);
    println!("{label}: {dropped} packets dropped");
    assert!(
        dropped > 0 && stats.retransmits > 0,
        "the test must lose packets to mean anything"
    );
    dropped
}

/// Runs the mixed workload with `hook` on the fabric; A's counters.
fn mixed_workload(hook: Arc<dyn LinkHook>, label: &str) -> HcaStats {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (8, 7, 7));
    fabric.set_hook(Some(hook));
    const ROUNDS: u64 = 12;
    const LEN: u32 = 8192;
    let counter = p.b.alloc(8, 8);
    p.b.write(counter, &0u64.to_le_bytes());
    let mut expect_a = 0;
    let mut checks = Vec::new();
    for r in 0..ROUNDS {
        let seed = r as u8;
        let src = p.a.alloc(u64::from(LEN), 64);
        let dst = p.b.alloc(u64::from(LEN), 64);
        p.a.write(src, &pattern(LEN as usize, seed));
        let mut w = send_wr(r * 10, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, p.key_b);
        p.a.post_send(&mut p.qa, w, &[sge(src, LEN, p.key_a)]);
        checks.push((dst, pattern(LEN as usize, seed), true));

        let msg = p.a.alloc(3072, 64);
        let rbuf = p.b.alloc(3072, 64);
        p.a.write(msg, &pattern(3072, seed ^ 0x55));
        p.b.post_recv(&mut p.qb, r, &[sge(rbuf, 3072, p.key_b)]);
        p.a.post_send(
            &mut p.qa,
            send_wr(r * 10 + 1, WR_SEND, WQE_SIGNALED),
            &[sge(msg, 3072, p.key_a)],
        );
        checks.push((rbuf, pattern(3072, seed ^ 0x55), true));

        let remote = p.b.alloc(u64::from(LEN), 64);
        let local = p.a.alloc(u64::from(LEN), 64);
        p.b.write(remote, &pattern(LEN as usize, seed ^ 0xaa));
        let mut rd = send_wr(r * 10 + 2, WR_RDMA_READ, WQE_SIGNALED);
        (rd.remote_addr, rd.rkey) = (remote, p.key_b);
        p.a.post_send(&mut p.qa, rd, &[sge(local, LEN, p.key_a)]);
        checks.push((local, pattern(LEN as usize, seed ^ 0xaa), false));

        let old = p.a.alloc(8, 8);
        let mut fa = send_wr(r * 10 + 3, WR_ATOMIC_FETCH_ADD, WQE_SIGNALED);
        (fa.remote_addr, fa.rkey, fa.compare_add) = (counter, p.key_b, 1);
        p.a.post_send(&mut p.qa, fa, &[sge(old, 8, p.key_a)]);
        expect_a += 4;
    }
    let (ca, t) = collect(
        &fabric,
        &mut p.a,
        &mut p.cq_a,
        expect_a,
        Duration::from_secs(60),
    );
    let cb = p.b.drain_cq(&mut p.cq_b);
    let bad: Vec<_> = ca.iter().chain(&cb).filter(|c| c.status != 0).collect();
    assert!(bad.is_empty(), "{label}: error completions {bad:?}");
    assert_eq!(ca.len(), expect_a, "{label}: requester CQEs after {t:?}");
    assert_eq!(
        cb.len(),
        ROUNDS as usize,
        "one receive CQE per send, no duplicates"
    );
    let mut ids: Vec<u64> = ca.iter().map(|c| c.wr_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), expect_a, "every WR completed exactly once");
    for (at, want, on_b) in checks {
        let got = if on_b {
            p.b.read(at, want.len())
        } else {
            p.a.read(at, want.len())
        };
        assert!(got == want, "{label}: data at {at:#x} differs");
    }
    let c = u64::from_le_bytes(p.b.read(counter, 8).try_into().unwrap());
    assert_eq!(c, ROUNDS, "each fetch-and-add executed exactly once");
    let stats = p.a.hca.stats();
    println!(
        "{label}: {} resent, {} sequence NAKs, B saw {} duplicates and {} bad ICRCs; done \
         in {t:?} of virtual time",
        stats.retransmits,
        stats.seq_naks,
        p.b.hca.stats().duplicates,
        p.b.hca.stats().icrc_errors
    );
    stats
}

#[test]
fn test_one_percent_loss_is_invisible_to_the_consumer() {
    for seed in [1, 2, 3] {
        mixed_workload_survives(10, seed, false);
    }
}

#[test]
fn test_ten_percent_loss_is_invisible_to_the_consumer() {
    for seed in [4, 5] {
        mixed_workload_survives(100, seed, false);
    }
}

#[test]
fn test_lost_acks_make_duplicates_that_are_not_executed_twice() {
    mixed_workload_survives(300, 6, true);
}

/// With the peer unreachable from the start, the WR fails with RETRY_EXC_ERR after
/// retry_cnt + 1 timeouts, each seen at the fabric tick after it expires, and the QP is in
/// ERR.
#[test]
fn test_retries_run_out_into_an_error_completion_within_the_bound() {
    for (timeout, retry_cnt) in [(10u8, 3u8), (12, 7), (8, 0)] {
        let fabric = Fabric::with_manual_clock();
        let mut p = Pair::build(
            fabric.clone(),
            MTU_1024,
            ALL_ACCESS,
            (timeout, retry_cnt, 7),
        );
        let hook = Lossy::new(1, 0);
        hook.down.store(true, Ordering::Relaxed);
        fabric.set_hook(Some(hook));
        let src = p.a.alloc(4096, 64);
        let dst = p.b.alloc(4096, 64);
        let mut w = send_wr(9, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, p.key_b);
        p.a.post_send(&mut p.qa, w, &[sge(src, 4096, p.key_a)]);
        let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_secs(30));
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].wr_id, u32::from(c[0].status)), (9, WC_RETRY_EXC_ERR));
        let tries = u64::from(retry_cnt) + 1;
        let at_least = ack_timeout_ns(timeout).unwrap() * tries;
        let at_most = (ack_timeout_ns(timeout).unwrap() + MS.as_nanos() as u64) * tries;
        let t = t.as_nanos() as u64;
        assert!(
            (at_least..=at_most).contains(&t),
            "timeout {timeout}, retry_cnt {retry_cnt}: failed after {t} ns, not in \
             [{at_least}, {at_most}] ns"
        );
        assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
        assert_eq!(p.a.hca.stats().retransmits, u64::from(retry_cnt));
    }
}

/// The fabric holding a port's packets (here an item for it that no pump moves, as a
/// queue a loaded host moves slowly leaves them) is the fabric's stall, not the peer's
/// silence: the port's ACK timers count a sixteenth of it, so that the retries last 16
/// times as long, and a lost packet still times out while the hold never ends.
#[test]
fn test_a_port_the_fabric_holds_spends_its_retries_sixteen_times_slower() {
    const TIMEOUT: u8 = 10;
    const RETRY_CNT: u8 = 3;
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(
        fabric.clone(),
        MTU_1024,
        ALL_ACCESS,
        (TIMEOUT, RETRY_CNT, 7),
    );
    let hook = Lossy::new(1, 0);
    hook.down.store(true, Ordering::Relaxed);
    fabric.set_hook(Some(hook));
    // After the tick that moves the SA's Reports of the ports' arrival, an item from port
    // A, queued from a thread that never pumps, for a LID no port has: it waits for good.
    // (A thread's pump serves the lanes it queued for, so the test runs on one that never
    // did.)
    fabric.advance(MS);
    let (la, nowhere) = (p.a.lid(), p.a.lid().max(p.b.lid()) + 1);
    let f = fabric.clone();
    std::thread::spawn(move || {
        f.enqueue(Packet {
            dlid: nowhere,
            slid: la,
            opcode: RC_SEND_ONLY,
            ..Packet::default()
        })
    })
    .join()
    .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let src = p.a.alloc(4096, 64);
            let dst = p.b.alloc(4096, 64);
            let mut w = send_wr(9, WR_RDMA_WRITE, WQE_SIGNALED);
            (w.remote_addr, w.rkey) = (dst, p.key_b);
            p.a.post_send(&mut p.qa, w, &[sge(src, 4096, p.key_a)]);
            let unheld = ack_timeout_ns(TIMEOUT).unwrap() * (u64::from(RETRY_CNT) + 1);
            let (c, t) = collect(
                &fabric,
                &mut p.a,
                &mut p.cq_a,
                1,
                Duration::from_nanos(8 * unheld),
            );
            assert!(
                c.is_empty(),
                "retries spent in {t:?} of the fabric holding the port"
            );
            assert_eq!(fabric.backlog(), 1, "the item still waits");
            assert!(p.a.hca.stats().retransmits <= u64::from(RETRY_CNT) / 2);
            let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_secs(30));
            assert_eq!(c.len(), 1, "a hold that never ends still times out");
            assert_eq!((c[0].wr_id, u32::from(c[0].status)), (9, WC_RETRY_EXC_ERR));
            let t = t.as_nanos() as u64 + 8 * unheld;
            let ticks = MS.as_nanos() as u64 * 16 * (u64::from(RETRY_CNT) + 1);
            assert!(
                (16 * unheld..=16 * unheld + ticks).contains(&t),
                "failed after {t} ns, not 16 x {unheld} ns"
            );
            assert_eq!(p.a.hca.stats().retransmits, u64::from(RETRY_CNT));
        });
    });
}

/// A link down for less than the retry budget: the WRs wait, then complete with the data.
#[test]
fn test_a_link_flap_costs_time_not_data() {
    let fabric = Fabric::with_manual_clock();
    // timeout 12 (16.8 ms) x 8 tries = 134 ms of budget; the link is down 60 ms.
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (12, 7, 7));
    let hook = Lossy::new(1, 0);
    fabric.set_hook(Some(hook.clone()));
    hook.down.store(true, Ordering::Relaxed);
    let src = p.a.alloc(16384, 64);
    let dst = p.b.alloc(16384, 64);
    p.a.write(src, &pattern(16384, 3));
    for i in 0..4u64 {
        let mut w = send_wr(i, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst + i * 4096, p.key_b);
        p.a.post_send(&mut p.qa, w, &[sge(src + i * 4096, 4096, p.key_a)]);
    }
    let (c, _) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_millis(60));
    assert!(c.is_empty(), "nothing completes while the link is down");
    hook.down.store(false, Ordering::Relaxed);
    let (c, _) = collect(
        &fabric,
        &mut p.a,
        &mut p.cq_a,
        4,
        Duration::from_millis(200),
    );
    assert_eq!(c.iter().filter(|c| c.status == 0).count(), 4, "{c:?}");
    assert_eq!(p.b.read(dst, 16384), pattern(16384, 3));
}

/// rnr_retry 7: the send waits (one RNR NAK per min_rnr_timer) until a receive is posted.
#[test]
fn test_rnr_waits_for_a_receive_to_be_posted() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 7));
    let src = p.a.alloc(2048, 64);
    p.a.write(src, &pattern(2048, 9));
    p.a.post_send(
        &mut p.qa,
        send_wr(5, WR_SEND, WQE_SIGNALED),
        &[sge(src, 2048, p.key_a)],
    );
    let (c, _) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_millis(20));
    assert!(c.is_empty(), "no receive, no completion: {c:?}");
    let naks = p.a.hca.stats().rnr_naks;
    // min_rnr_timer 12 = 0.64 ms between tries: about one per 1 ms tick.
    assert!(naks >= 10, "{naks} RNR NAKs in 20 ms");
    let dst = p.b.alloc(2048, 64);
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 2048, p.key_b)]);
    let (c, _) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_millis(10));
    assert_eq!((c.len(), u32::from(c[0].status)), (1, WC_SUCCESS));
    assert_eq!(p.b.read(dst, 2048), pattern(2048, 9));
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 1);
}

/// rnr_retry 3: the fourth RNR NAK ends the WR with RNR_RETRY_EXC_ERR.
#[test]
fn test_rnr_retries_run_out() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 3));
    let src = p.a.alloc(64, 64);
    p.a.post_send(
        &mut p.qa,
        send_wr(5, WR_SEND, WQE_SIGNALED),
        &[sge(src, 64, p.key_a)],
    );
    let (c, _) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_millis(50));
    assert_eq!((c.len(), u32::from(c[0].status)), (1, WC_RNR_RETRY_EXC_ERR));
    assert_eq!(p.a.hca.stats().rnr_naks, 4);
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
    assert_eq!(
        p.b.qp_state(p.qb.qpn),
        QPS_RTS,
        "RNR leaves the responder alone"
    );
}

/// A shared byte buffer for a fault log.
#[derive(Clone, Default)]
struct LogBuf(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const PLAN: &str = "
seed = 11
[[link]]
drop = 0.01
duplicate = 0.01
reorder = 0.01
corrupt = 0.005
jitter_us = 300
";

fn run_plan(text: &str) -> (String, hca_model::faults::FaultCounts, HcaStats) {
    let log = LogBuf::default();
    let hook = Arc::new(FaultHook::new(
        FaultPlan::parse(text).unwrap(),
        Some(Box::new(log.clone())),
    ));
    let stats = mixed_workload(hook.clone(), "fault plan");
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    (text, hook.counts(), stats)
}

/// Every kind of link fault at once: the consumer sees nothing but time; each decision is
/// one JSON line; the same seed gives the same decisions, another seed others.
#[test]
fn test_a_seeded_fault_plan_is_invisible_to_the_consumer_and_replays() {
    let (log1, counts, stats) = run_plan(PLAN);
    println!("{counts:?}");
    assert!(counts.dropped > 0 && counts.duplicated > 0 && counts.reordered > 0);
    assert!(counts.corrupted > 0 && counts.delayed > 0);
    assert!(stats.retransmits > 0);
    assert_eq!(log1.lines().count() as u64, counts.total());
    let first = log1.lines().next().unwrap();
    assert!(
        first.starts_with("{\"t_ns\":") && first.contains("\"fault\":\""),
        "{first}"
    );
    // Every line is a JSON object a log tool can read: where, which packet, what.
    for line in log1.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        assert!(v["t_ns"].is_u64() && v["fault"].is_string(), "{line}");
        assert!(
            v["link"].as_str().is_some_and(|l| l.starts_with("lid")),
            "{line}"
        );
        assert!(v["psn"].is_u64() && v["opcode"].is_u64(), "{line}");
        assert_eq!(v["fault"] == "delay", v["delay_ns"].is_u64(), "{line}");
    }
    let (log2, counts2, _) = run_plan(PLAN);
    assert_eq!(counts, counts2);
    assert!(log1 == log2, "the same seed must replay the same decisions");
    let (log3, _, _) = run_plan(&PLAN.replace("seed = 11", "seed = 12"));
    assert!(log1 != log3, "another seed, other decisions");
}

/// A scheduled link-down window shorter than the retry budget (timeout 8 is ~1 ms, and
/// a timeout is seen at the next 1 ms tick: 8 tries last ~16 ms): the WRs wait it out.
#[test]
fn test_a_planned_link_flap_is_ridden_out() {
    let plan = "[[link]]\nlid = 2\ndown = [[0.0, 10.0]]\n";
    let hook = Arc::new(FaultHook::new(FaultPlan::parse(plan).unwrap(), None));
    let stats = mixed_workload(hook.clone(), "link down 10 ms");
    assert!(hook.counts().link_down > 0 && stats.retransmits > 0);
}

/// Drops the first packet on its way up whose opcode is in the range, once.
struct DropFirst(std::ops::RangeInclusive<u8>, AtomicBool);

impl DropFirst {
    /// The first read response of any kind.
    fn read_response() -> Arc<Self> {
        Arc::new(Self(
            RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY,
            AtomicBool::new(false),
        ))
    }

    /// The first READ_RESP_LAST: a multi-packet read's last response.
    fn last_read_response() -> Arc<Self> {
        Arc::new(Self(
            RC_READ_RESP_LAST..=RC_READ_RESP_LAST,
            AtomicBool::new(false),
        ))
    }
}

impl LinkHook for DropFirst {
    fn on_packet(&self, link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        let hit = self.0.contains(&pkt.opcode);
        if link.dir == LinkDir::Up && hit && !self.1.swap(true, Ordering::Relaxed) {
            return Verdict::Drop;
        }
        Verdict::Pass
    }
}

/// Sends a copy of the first READ request right behind it, and holds that copy back on its
/// way down for `hold_ns`: a duplicate that reaches the responder long after the read was
/// done (a link that duplicated the packet, a switch queue that kept it).
struct LateDuplicateRead {
    hold_ns: u64,
    copied: AtomicBool,
    seen_down: AtomicU32,
}

impl LinkHook for LateDuplicateRead {
    fn on_packet(&self, link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        if pkt.opcode != RC_READ_REQUEST {
            return Verdict::Pass;
        }
        if link.dir == LinkDir::Up {
            if !self.copied.swap(true, Ordering::Relaxed) {
                return Verdict::Duplicate;
            }
        } else if self.seen_down.fetch_add(1, Ordering::Relaxed) == 1 {
            return Verdict::Delay(self.hold_ns);
        }
        Verdict::Pass
    }
}

/// A READ request duplicated on the way and delivered again after the read completed and
/// the responder deregistered the MR: the responder answers the duplicate with a remote
/// access NAK, which names a PSN the requester finished with. The requester ignores it (it
/// is outside its window of outstanding requests); before, the WR at the front of its
/// send queue then (an unrelated SEND waiting for the peer's receive) failed with
/// REM_ACCESS_ERR and the QP went to ERR. Debian's ib_srpt saw exactly this under a
/// link's reordering and duplication: "RDMA_READ ... failed with status 10", and SRP
/// reconnected.
#[test]
fn test_a_nak_for_a_request_already_done_is_ignored() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 7));
    let hold_ns = 5_000_000;
    fabric.set_hook(Some(Arc::new(LateDuplicateRead {
        hold_ns,
        copied: AtomicBool::new(false),
        seen_down: 0.into(),
    })));
    let remote = p.b.alloc(4096, 64);
    let key = p.b.reg_mr(p.pd_b, remote, 4096, ALL_ACCESS);
    let local = p.a.alloc(4096, 64);
    p.b.write(remote, &pattern(4096, 8));
    let mut rd = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
    (rd.remote_addr, rd.rkey) = (remote, key);
    p.a.post_send(&mut p.qa, rd, &[sge(local, 4096, p.key_a)]);
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(c.len(), 1, "the read is done at once");
    assert_eq!((c[0].wr_id, c[0].status), (1, 0));
    assert_eq!(p.a.read(local, 4096), pattern(4096, 8));
    // The responder's consumer lets go of the memory it exposed.
    let h = HcaCmdHandle {
        handle: key,
        rsvd: 0,
    };
    assert_eq!(p.b.cmd(CMD_DEREG_MR, &h).0, CMD_OK);
    // A SEND that waits for the peer's receive (RNR) is at the front when the duplicate
    // reaches the responder.
    let msg = p.a.alloc(64, 64);
    let mut send = send_wr(2, WR_SEND, WQE_SIGNALED);
    send.num_sge = 1;
    p.a.post_send(&mut p.qa, send, &[sge(msg, 64, p.key_a)]);
    fabric.advance(Duration::from_nanos(hold_ns + 1_000_000));
    assert_eq!(p.b.hca.stats().duplicates, 1, "the late copy arrived");
    let early = p.a.drain_cq(&mut p.cq_a);
    assert!(
        early.is_empty(),
        "nothing failed on the stale NAK: {early:?}"
    );
    let rbuf = p.b.alloc(64, 64);
    p.b.post_recv(&mut p.qb, 9, &[sge(rbuf, 64, p.key_b)]);
    let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_secs(2));
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        [(2, 0)],
        "the SEND completes once the receive is there ({t:?})"
    );
}

/// A read whose last response is lost, with another read behind it: the next read's
/// responses show the loss (responses come in order), so the first is asked again from its
/// missing PSN at once, as a gap inside one read is, not after the QP's timeout. (RDS
/// splits a large RDMA READ into such runs of READ WRs.)
#[test]
fn test_a_lost_last_read_response_is_asked_again_when_the_next_reads_arrive() {
    let fabric = Fabric::with_manual_clock();
    // timeout 14: ~67 ms; both reads must finish long before that.
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 7));
    fabric.set_hook(Some(DropFirst::last_read_response()));
    let remote = p.b.alloc(16384, 64);
    let local = p.a.alloc(16384, 64);
    p.b.write(remote, &pattern(16384, 6));
    for i in 0..2u64 {
        let mut rd = send_wr(i, WR_RDMA_READ, WQE_SIGNALED);
        (rd.remote_addr, rd.rkey) = (remote + i * 8192, p.key_b);
        p.a.post_send(&mut p.qa, rd, &[sge(local + i * 8192, 8192, p.key_a)]);
    }
    let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 2, Duration::from_millis(20));
    assert_eq!(
        c.len(),
        2,
        "both done before the 67 ms timeout (after {t:?})"
    );
    assert!(c.iter().all(|c| c.status == 0), "{c:?}");
    assert_eq!(p.a.read(local, 16384), pattern(16384, 6));
    let st = p.a.hca.stats();
    assert_eq!(st.read_gaps, 1, "one gap, asked once: {st:?}");
}

/// A read whose last response is lost, with a SEND behind it: the SEND's ACK names a PSN
/// past the read, which IB takes as an implied NAK: the read is asked again at once.
#[test]
fn test_an_ack_past_a_read_missing_its_last_response_asks_again_at_once() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 7));
    fabric.set_hook(Some(DropFirst::last_read_response()));
    let remote = p.b.alloc(8192, 64);
    let local = p.a.alloc(8192, 64);
    let (msg, rbuf) = (p.a.alloc(64, 64), p.b.alloc(64, 64));
    p.b.write(remote, &pattern(8192, 3));
    let mut rd = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
    (rd.remote_addr, rd.rkey) = (remote, p.key_b);
    p.a.post_send(&mut p.qa, rd, &[sge(local, 8192, p.key_a)]);
    p.b.post_recv(&mut p.qb, 9, &[sge(rbuf, 64, p.key_b)]);
    let mut send = send_wr(2, WR_SEND, WQE_SIGNALED);
    send.num_sge = 1;
    p.a.post_send(&mut p.qa, send, &[sge(msg, 64, p.key_a)]);
    let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 2, Duration::from_millis(20));
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        [(1, 0), (2, 0)],
        "both done in order before the 67 ms timeout ({t:?})"
    );
    assert_eq!(p.a.read(local, 8192), pattern(8192, 3));
    assert_eq!(p.a.hca.stats().read_gaps, 1);
}

/// A lost read response shows as a gap when the next one arrives: the read is asked again
/// from the missing PSN at once (as IB's requester does), not after the QP's timeout.
#[test]
fn test_a_read_response_gap_is_asked_again_at_once() {
    let fabric = Fabric::with_manual_clock();
    // timeout 14: ~67 ms; the read must finish long before that.
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 7));
    fabric.set_hook(Some(DropFirst::read_response()));
    let remote = p.b.alloc(8192, 64);
    let local = p.a.alloc(8192, 64);
    p.b.write(remote, &pattern(8192, 4));
    let mut rd = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
    (rd.remote_addr, rd.rkey) = (remote, p.key_b);
    p.a.post_send(&mut p.qa, rd, &[sge(local, 8192, p.key_a)]);
    let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_millis(60));
    assert_eq!(c.len(), 1, "done before the 67 ms timeout (after {t:?})");
    assert_eq!(c[0].status, 0);
    assert_eq!(p.a.read(local, 8192), pattern(8192, 4));
    let st = p.a.hca.stats();
    assert_eq!(st.read_gaps, 1, "one gap, asked once: {st:?}");
    assert_eq!(st.retransmits, 1, "one read request again");
}

/// Drops every positive ACK (NAKs pass).
struct DropAcks;

impl LinkHook for DropAcks {
    fn on_packet(&self, _link: LinkId, _now_ns: u64, pkt: &mut Packet) -> Verdict {
        if pkt.opcode == RC_ACK && pkt.aeth.is_some_and(|(s, _)| s == AETH_ACK) {
            return Verdict::Drop;
        }
        Verdict::Pass
    }
}

#[test]
fn test_a_fatal_nak_acknowledges_the_messages_before_it() {
    // A NAK acknowledges every request before the one it names (IB): with the first SEND's
    // ACK lost, the NAK for the second still completes the first, and fails only the second.
    let mut p = Pair::new(5);
    p.fabric.set_hook(Some(Arc::new(DropAcks)));
    let (src, dst) = (p.a.alloc(16, 8), p.b.alloc(32, 8));
    p.b.post_recv(&mut p.qb, 0, &[sge(dst, 16, p.key_b)]);
    p.b.post_recv(&mut p.qb, 1, &[sge(dst + 16, 4, p.key_b)]); // too small
    for i in 0..2 {
        let wr = send_wr(i, WR_SEND, WQE_SIGNALED);
        p.a.post_send(&mut p.qa, wr, &[sge(src, 16, p.key_a)]);
    }
    let sent: Vec<(u64, u32)> =
        p.a.drain_cq(&mut p.cq_a)
            .iter()
            .map(|c| (c.wr_id, u32::from(c.status)))
            .collect();
    assert_eq!(sent, [(0, WC_SUCCESS), (1, WC_REM_INV_REQ_ERR)]);
}

/// Drops the SEND packets it is told to by their order on the wire (the first is 0), and
/// notes when each SEND packet went up, by PSN.
struct DropSends {
    drop: Vec<usize>,
    seen: std::sync::Mutex<Vec<(u32, u64)>>,
}

impl LinkHook for DropSends {
    fn on_packet(&self, link: LinkId, now_ns: u64, pkt: &mut Packet) -> Verdict {
        if link.dir != LinkDir::Up || pkt.opcode != RC_SEND_ONLY {
            return Verdict::Pass;
        }
        let mut seen = self.seen.lock().unwrap();
        seen.push((pkt.psn, now_ns));
        if self.drop.contains(&(seen.len() - 1)) {
            return Verdict::Drop;
        }
        Verdict::Pass
    }
}

/// On the real clock (as the device server and the VMM run it) an ACK timer is started
/// without reading the clock, from the fabric's next tick: a lost SEND is still sent again,
/// and never before the QP's timeout has passed since it was sent. Both ways a timer
/// starts: armed by a SEND on an idle QP, and restarted by an ACK that leaves a SEND
/// outstanding.
#[test]
fn test_on_the_real_clock_a_lost_send_is_sent_again_after_its_timeout() {
    const TIMEOUT: u8 = 10; // 4.2 ms: longer than a tick or two
    let fabric = Fabric::new();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (TIMEOUT, 7, 7));
    // Sends 0 (dropped) and 1 (again); then 2, 3 (dropped) and 4 (3 again).
    let hook = Arc::new(DropSends {
        drop: vec![0, 3],
        seen: Default::default(),
    });
    fabric.set_hook(Some(hook.clone()));
    let src = p.a.alloc(64, 64);
    p.a.write(src, &pattern(64, 5));
    let dst = p.b.alloc(3 * 64, 64);
    for i in 0..3u64 {
        p.b.post_recv(&mut p.qb, i, &[sge(dst + i * 64, 64, p.key_b)]);
    }
    let wait_for =
        |p: &mut Pair, n: usize| collect_real(&mut p.a, &mut p.cq_a, n, Duration::from_secs(10)).0;
    // Armed: one SEND on an idle QP.
    p.a.post_send(
        &mut p.qa,
        send_wr(0, WR_SEND, WQE_SIGNALED),
        &[sge(src, 64, p.key_a)],
    );
    let c = wait_for(&mut p, 1);
    assert_eq!(c.len(), 1, "the lost SEND completes once sent again");
    // Restarted: two SENDs in one doorbell; the first one's ACK restarts the timer for the
    // second, which was lost.
    for i in 1..3u64 {
        let mut w = send_wr(i, WR_SEND, WQE_SIGNALED);
        w.num_sge = 1;
        p.a.write_send(&mut p.qa, &w, &[sge(src, 64, p.key_a)], &[]);
    }
    p.a.ring_sq(&p.qa);
    let c2 = wait_for(&mut p, 2);
    let all: Vec<_> = c.iter().chain(&c2).map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(all, [(0, 0), (1, 0), (2, 0)]);
    assert_eq!(p.b.drain_cq(&mut p.cq_b).len(), 3, "each delivered once");
    assert_eq!(p.b.read(dst + 128, 64), pattern(64, 5));
    assert_eq!(p.a.hca.stats().retransmits, 2);
    let seen = hook.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 5, "{seen:?}");
    let timeout = ack_timeout_ns(TIMEOUT).unwrap();
    for (lost, again) in [(0, 1), (3, 4)] {
        let ((psn, sent), (psn2, resent)) = (seen[lost], seen[again]);
        assert_eq!(psn, psn2, "send {again} is send {lost} again: {seen:?}");
        assert!(
            resent - sent >= timeout,
            "sent again {} ns after it was sent, before the {timeout} ns timeout",
            resent - sent
        );
    }
}

/// Long messages under 1% loss (as a 1 MiB RDS RDMA or NVMe-oF transfer meets it): 512
/// packets each, so nearly every try of a whole message loses one. Each loss is mended
/// from the missing packet on; the retry budget (7, as rdma_cm sets it) is for lack of
/// progress, and a message whose packets keep being acknowledged never runs it out.
#[test]
fn test_megabyte_messages_under_one_percent_loss_complete() {
    const LEN: u32 = 1 << 20;
    const MTU_2048: u8 = 4;
    for seed in [1u64, 2, 3, 4] {
        let fabric = Fabric::with_manual_clock();
        let mut p = Pair::build(fabric.clone(), MTU_2048, ALL_ACCESS, (14, 7, 7));
        let hook = Lossy::new(seed, 10);
        fabric.set_hook(Some(hook.clone()));
        let src = p.a.alloc(u64::from(LEN), 4096);
        let dst = p.b.alloc(u64::from(LEN), 4096);
        let remote = p.b.alloc(u64::from(LEN), 4096);
        let local = p.a.alloc(u64::from(LEN), 4096);
        p.a.write(src, &pattern(LEN as usize, 7));
        p.b.write(remote, &pattern(LEN as usize, 9));
        for r in 0..4u64 {
            let mut w = send_wr(r * 2, WR_RDMA_WRITE, WQE_SIGNALED);
            (w.remote_addr, w.rkey) = (dst, p.key_b);
            p.a.post_send(&mut p.qa, w, &[sge(src, LEN, p.key_a)]);
            let mut rd = send_wr(r * 2 + 1, WR_RDMA_READ, WQE_SIGNALED);
            (rd.remote_addr, rd.rkey) = (remote, p.key_b);
            p.a.post_send(&mut p.qa, rd, &[sge(local, LEN, p.key_a)]);
        }
        let expect = [
            (dst, pattern(LEN as usize, 7), true),
            (local, pattern(LEN as usize, 9), false),
        ];
        let (c, t) = collect(&fabric, &mut p.a, &mut p.cq_a, 8, Duration::from_secs(60));
        let s = p.a.hca.stats();
        let got: Vec<_> = c.iter().map(|c| (c.wr_id, u32::from(c.status))).collect();
        assert_eq!(
            got,
            (0..8).map(|i| (i, WC_SUCCESS)).collect::<Vec<_>>(),
            "seed {seed}: after {t:?}, {} dropped, {} resent, {} sequence NAKs, {} read gaps",
            hook.dropped.load(Ordering::Relaxed),
            s.retransmits,
            s.seq_naks,
            s.read_gaps
        );
        for (at, want, on_b) in expect {
            let d = if on_b { &mut p.b } else { &mut p.a };
            assert!(
                d.read(at, want.len()) == want,
                "seed {seed}: data at {at:#x}"
            );
        }
        println!(
            "seed {seed}: {} dropped, {} resent, {} sequence NAKs, {} read gaps, {t:?}",
            hook.dropped.load(Ordering::Relaxed),
            s.retransmits,
            s.seq_naks,
            s.read_gaps
        );
    }
}

/// What RDS makes of a 1 MiB RDMA READ: sixteen 64 KiB READ WRs in flight at once, and the
/// region read refilled between rounds. Under 1% loss every round's bytes must be that
/// round's, whole: a response lost anywhere is asked for again, never skipped, and no
/// answer to an earlier round's request lands in a later round's buffer.
#[test]
fn test_rounds_of_many_reads_in_flight_under_loss_read_each_rounds_bytes() {
    const WRS: u64 = 16;
    const LEN: u32 = 64 << 10;
    const MTU_2048: u8 = 4;
    for seed in [1u64, 2, 3, 4, 5, 6] {
        let fabric = Fabric::with_manual_clock();
        let mut p = Pair::build(fabric.clone(), MTU_2048, ALL_ACCESS, (14, 7, 7));
        let hook = Lossy::new(seed, 10);
        fabric.set_hook(Some(hook.clone()));
        let total = WRS * u64::from(LEN);
        let remote = p.b.alloc(total, 4096);
        let local = p.a.alloc(total, 4096);
        for round in 0..6u8 {
            p.b.write(remote, &pattern(total as usize, round));
            for i in 0..WRS {
                let mut rd = send_wr(u64::from(round) * 100 + i, WR_RDMA_READ, WQE_SIGNALED);
                (rd.remote_addr, rd.rkey) = (remote + i * u64::from(LEN), p.key_b);
                let at = local + i * u64::from(LEN);
                p.a.post_send(&mut p.qa, rd, &[sge(at, LEN, p.key_a)]);
            }
            let (c, t) = collect(
                &fabric,
                &mut p.a,
                &mut p.cq_a,
                WRS as usize,
                Duration::from_secs(60),
            );
            let bad: Vec<_> = c.iter().filter(|c| c.status != 0).collect();
            assert!(
                c.len() == WRS as usize && bad.is_empty(),
                "seed {seed} round {round}: {} CQEs after {t:?}, errors {bad:?}",
                c.len()
            );
            let got = p.a.read(local, total as usize);
            let want = pattern(total as usize, round);
            let first_bad = got.iter().zip(&want).position(|(g, w)| g != w);
            let s = p.a.hca.stats();
            assert!(
                first_bad.is_none(),
                "seed {seed} round {round}: byte {first_bad:?} differs ({} dropped, {} \
                 resent, {} read gaps)",
                hook.dropped.load(Ordering::Relaxed),
                s.retransmits,
                s.read_gaps
            );
        }
    }
}

/// RDS's shape of a 1 MiB RDMA READ: 32 READ WRs of eight 4 KiB pages each (scattered,
/// one SGE a page), only the last signaled, then a SEND; the region refilled each round.
/// Under 1% loss the completion must mean every byte of that round arrived.
fn rds_shaped_reads(real_clock: bool, timeout: u8, seeds: std::ops::RangeInclusive<u64>) {
    const WRS: u64 = 32;
    const PAGES: u64 = 8;
    const MTU_2048: u8 = 4;
    let page = 4096u64;
    for seed in seeds.clone() {
        let fabric = if real_clock {
            Fabric::new()
        } else {
            Fabric::with_manual_clock()
        };
        let mut p = Pair::build(fabric.clone(), MTU_2048, ALL_ACCESS, (timeout, 7, 7));
        // The CLI's fault plan: each packet judged on its way up and again on its way down.
        let plan = FaultPlan::parse(&format!("seed = {seed}\n[[link]]\ndrop = 0.01\n")).unwrap();
        let hook = Arc::new(FaultHook::new(plan, None));
        fabric.set_hook(Some(hook.clone()));
        let total = WRS * PAGES * page;
        let remote = p.b.alloc(total, 4096);
        // The local pages in reverse order: no two SGEs of a WR are adjacent.
        let base = p.a.alloc(total, 4096);
        let local_page = |k: u64| base + (WRS * PAGES - 1 - k) * page;
        let msg = p.a.alloc(64, 64);
        let rbuf = p.b.alloc(64, 64);
        for round in 0..4u8 {
            p.b.write(remote, &pattern(total as usize, round));
            p.a.write(base, &vec![0u8; total as usize]);
            for i in 0..WRS {
                let last = i == WRS - 1;
                let flags = if last { WQE_SIGNALED } else { 0 };
                let mut rd = send_wr(u64::from(round) * 100 + i, WR_RDMA_READ, flags);
                (rd.remote_addr, rd.rkey) = (remote + i * PAGES * page, p.key_b);
                let sges: Vec<_> = (0..PAGES)
                    .map(|j| sge(local_page(i * PAGES + j), page as u32, p.key_a))
                    .collect();
                p.a.post_send(&mut p.qa, rd, &sges);
            }
            p.b.post_recv(&mut p.qb, u64::from(round), &[sge(rbuf, 64, p.key_b)]);
            p.a.post_send(
                &mut p.qa,
                send_wr(u64::from(round) * 100 + 99, WR_SEND, WQE_SIGNALED),
                &[sge(msg, 64, p.key_a)],
            );
            let (c, t) = if real_clock {
                collect_real(&mut p.a, &mut p.cq_a, 2, Duration::from_secs(30))
            } else {
                collect(&fabric, &mut p.a, &mut p.cq_a, 2, Duration::from_secs(60))
            };
            let bad: Vec<_> = c.iter().filter(|c| c.status != 0).collect();
            assert!(
                c.len() == 2 && bad.is_empty(),
                "seed {seed} round {round}: {} CQEs after {t:?}, errors {bad:?}",
                c.len()
            );
            let want = pattern(total as usize, round);
            for k in 0..WRS * PAGES {
                let got = p.a.read(local_page(k), page as usize);
                let off = (k * page) as usize;
                if got[..] != want[off..off + page as usize] {
                    let s = p.a.hca.stats();
                    panic!(
                        "seed {seed} round {round}: page {k} (byte {off}) differs ({} dropped, \
                         {} resent, {} read gaps)",
                        hook.counts().dropped,
                        s.retransmits,
                        s.read_gaps
                    );
                }
            }
        }
    }
}

#[test]
fn test_rds_shaped_reads_under_loss_complete_only_with_every_byte() {
    rds_shaped_reads(false, 14, 1..=8);
}

/// The same on the real clock with a short timeout (16.8 ms): timers fire while responses
/// are still arriving, as they do in the device server.
#[test]
fn test_rds_shaped_reads_under_loss_on_the_real_clock() {
    rds_shaped_reads(true, 12, 1..=4);
}

/// A QP's responder side refuses a bad RDMA WRITE while its own SENDs wait for the peer's
/// receives (RNR): the QP goes to ERR and each of its WRs completes exactly once, flushed,
/// the unsignaled one too (as ib_drain_qp relies on), and nothing more comes as the RNR
/// timer runs out or the peer posts receives. ib_srp's teardown calls whatever a
/// completion's wr_id points at: a second CQE for a WR the consumer has retired is a crash.
#[test]
fn test_a_qp_killed_by_its_responder_side_flushes_each_waiting_wr_once() {
    let fabric = Fabric::with_manual_clock();
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (14, 7, 7));
    let src = p.a.alloc(64, 64);
    for (wr_id, flags) in [(1, WQE_SIGNALED), (2, 0), (3, WQE_SIGNALED)] {
        p.a.post_send(
            &mut p.qa,
            send_wr(wr_id, WR_SEND, flags),
            &[sge(src, 64, p.key_a)],
        );
    }
    let (c, _) = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_millis(5));
    assert!(c.is_empty(), "the SENDs wait for receives: {c:?}");
    // B writes through a key A never issued: A's responder side refuses it.
    let b_src = p.b.alloc(8, 8);
    let mut wr = send_wr(9, WR_RDMA_WRITE, WQE_SIGNALED);
    (wr.remote_addr, wr.rkey) = (src, 0x0bad_0003);
    p.b.post_send(&mut p.qb, wr, &[sge(b_src, 8, p.key_b)]);
    assert_eq!(p.a.qp_state(p.qa.qpn), QPS_ERR);
    let dst = p.b.alloc(64, 64);
    for i in 0..3 {
        p.b.post_recv(&mut p.qb, 100 + i, &[sge(dst, 64, p.key_b)]);
    }
    let (c, _) = collect(
        &fabric,
        &mut p.a,
        &mut p.cq_a,
        4,
        Duration::from_millis(100),
    );
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [1, 2, 3], "each WR once, in order: {c:?}");
    assert!(
        c.iter().all(|c| u32::from(c.status) == WC_WR_FLUSH_ERR),
        "{c:?}"
    );
}
