//! What a hostile guest makes the host hold, measured: the heap bytes live in this process
//! (a counting global allocator, so the device model's every allocation is seen) and its
//! resident set, before the attack, at its peak and after the guest destroyed what it made.
//! Each pattern is one that drove a device server's memory to gigabytes (issue 49): many
//! connected RC QPs with full send windows that are never acknowledged, huge SENDs in an
//! endless RNR loop, UD datagrams fanned out of many QPs into a fabric that lags, and huge
//! RDMA READs of a peer's memory on many QPs at once.
//!
//! `HCAB_MEM_REPORT=1` prints each pattern's numbers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::sync::Unpoisoned;
use hca_model::{
    Fabric, LinkDir, LinkHook, LinkId, Verdict, INBOUND_WINDOW_RECORDS, WINDOW_FLOOR, WR_SLOT_BYTES,
};
use hca_test_driver::*;

/// The system allocator, counting the bytes live and the most there were.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator with the caller's own arguments; the
// counts are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            PEAK.fetch_max(LIVE.fetch_add(l.size(), Relaxed) + l.size(), Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            PEAK.fetch_max(LIVE.fetch_add(l.size(), Relaxed) + l.size(), Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator with layout `l`.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` came from this allocator with layout `l`.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Relaxed);
            PEAK.fetch_max(LIVE.fetch_add(new, Relaxed) + new, Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One pattern at a time: the counts are process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

fn rss() -> usize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Heap and RSS at one moment.
#[derive(Clone, Copy, Debug)]
struct Sample {
    heap: usize,
    rss: usize,
}

fn sample() -> Sample {
    Sample {
        heap: LIVE.load(Relaxed),
        rss: rss(),
    }
}

/// What a pattern made the process hold: before, at its peak (heap: the allocator's most;
/// RSS: when sampled), and after its guest destroyed its QPs.
struct Report {
    name: &'static str,
    before: Sample,
    peak_heap: usize,
    peak_rss: usize,
    after: Sample,
    /// RSS after the allocator gave its free memory back (`malloc_trim`).
    trimmed: usize,
}

extern "C" {
    /// glibc: gives free heap memory back to the operating system.
    fn malloc_trim(pad: usize) -> i32;
    /// glibc: sets an allocator parameter.
    fn mallopt(param: i32, value: i32) -> i32;
}

/// glibc's `M_MMAP_THRESHOLD`.
const M_MMAP_THRESHOLD: i32 = -3;

/// The allocator as the device server sets it (`device_server::trim::tune`): blocks of
/// 128 KiB and more (a long window's queues, a long message's records) are mapped each on
/// their own, and unmapped when freed, rather than carved out of a heap that small blocks
/// allocated meanwhile then pin (glibc's default threshold rises to 32 MiB as such blocks
/// are freed: measured here, a run of QPs each filling a window of 4096 WRs left 30 MiB
/// resident that `malloc_trim` could not give back).
fn allocator_as_the_server_sets_it() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: mallopt takes two integers and changes only the allocator's parameters.
    ONCE.call_once(|| unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 << 10);
    });
}

/// The RSS once the allocator has given back what it can.
fn trimmed_rss() -> usize {
    // SAFETY: malloc_trim takes a byte count and touches only the allocator's own state.
    unsafe { malloc_trim(0) };
    rss()
}

impl Report {
    fn start(name: &'static str) -> Self {
        allocator_as_the_server_sets_it();
        let before = sample();
        PEAK.store(before.heap, Relaxed);
        Self {
            name,
            before,
            peak_heap: before.heap,
            peak_rss: before.rss,
            after: before,
            trimmed: before.rss,
        }
    }

    fn note(&mut self) {
        self.peak_rss = self.peak_rss.max(rss());
        self.peak_heap = self.peak_heap.max(PEAK.load(Relaxed));
    }

    fn end(&mut self) {
        self.note();
        self.after = sample();
        self.trimmed = trimmed_rss();
        if std::env::var_os("HCAB_MEM_REPORT").is_some() {
            let m = |b: usize| b as f64 / (1 << 20) as f64;
            eprintln!(
                "{:<28} heap {:>8.1} -> peak {:>8.1} -> after {:>8.1} MiB (+{:.1}); \
                 rss {:>8.1} -> peak {:>8.1} -> after {:>8.1} (trimmed {:>8.1}) MiB",
                self.name,
                m(self.before.heap),
                m(self.peak_heap),
                m(self.after.heap),
                m(self.peak_heap.saturating_sub(self.before.heap)),
                m(self.before.rss),
                m(self.peak_rss),
                m(self.after.rss),
                m(self.trimmed),
            );
        }
    }

    /// The most the pattern added to the heap.
    fn grew(&self) -> usize {
        self.peak_heap.saturating_sub(self.before.heap)
    }

    fn kept(&self) -> usize {
        self.after.heap.saturating_sub(self.before.heap)
    }

    /// The pattern's heap and resident set stayed within `BUDGET` at its peak, and came
    /// back (the RSS once the allocator gave back what was freed) within a few MiB.
    fn check(&self) {
        let (grew, kept) = (self.grew(), self.kept());
        assert!(grew <= BUDGET, "{}: the heap grew {grew}", self.name);
        assert!(kept <= 4 << 20, "{}: the heap kept {kept}", self.name);
        let rss_grew = self.peak_rss.saturating_sub(self.before.rss);
        assert!(rss_grew <= BUDGET, "{}: the RSS grew {rss_grew}", self.name);
        let rss_kept = self.trimmed.saturating_sub(self.before.rss);
        assert!(
            rss_kept <= 8 << 20,
            "{}: the RSS kept {rss_kept}",
            self.name
        );
    }
}

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

fn destroy_qp<P: Port>(d: &mut Driver<P>, qpn: u32) {
    let h = HcaCmdHandle {
        handle: qpn,
        rsvd: 0,
    };
    assert_eq!(d.cmd(CMD_DESTROY_QP, &h).0, CMD_OK);
}

/// Touches every page of a guest's RAM, so that the resident set counts it from the start.
fn touch(d: &Driver, mib: u64) {
    let zero = vec![0u8; 1 << 20];
    for i in 0..mib {
        d.write(i << 20, &zero);
    }
}

/// The budget a device's hostile guest may make the host hold: the in-flight bound, and
/// room for its objects' fixed state.
const BUDGET: usize = 2 * MAX_IN_FLIGHT_BYTES;

fn scale() -> usize {
    std::env::var("HCAB_MEM_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[test]
fn test_many_rc_qps_with_unacknowledged_windows_stay_within_the_budget() {
    let _one = SERIAL.lock_unpoisoned();
    let fabric = Fabric::with_manual_clock();
    // 256 QPs (times the scale, up to 1000) with send queues of 2^12 slots: 1M WRs
    // posted.
    let (nqp, sq_log) = ((256 * scale()).min(1000), 12u32);
    let mib = 64 + (nqp as u64 * (1 << (sq_log + 9))) / (1 << 20);
    let mut a = Driver::new(Some(&fabric), mib);
    let mut b = Driver::new(Some(&fabric), 64);
    touch(&a, mib);
    touch(&b, 64);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(12), b.create_cq(12));
    let src = a.alloc(4096, 4096);
    let dst = b.alloc(4096, 4096);
    let kb = b.reg_dma_mr(pb, ALL_ACCESS);
    // B's ACKs never come back.
    let m = Arc::new(Mute {
        lid: b.lid(),
        on: true.into(),
    });
    fabric.set_hook(Some(m.clone()));
    let mut r = Report::start("rc windows unacknowledged");
    let mut qps = Vec::new();
    for _ in 0..nqp {
        let mut qa = a
            .try_create_qp(QPT_RC, pa, (ca.cqn, ca.cqn), (sq_log, 0), 0)
            .expect("QP");
        let qb = b
            .try_create_qp(QPT_RC, pb, (cb.cqn, cb.cqn), (0, 0), 0)
            .expect("QP");
        a.bring_up_rc(qa.qpn, b.lid(), qb.qpn, ALL_ACCESS, MTU_4096 as u8);
        b.bring_up_rc(qb.qpn, a.lid(), qa.qpn, ALL_ACCESS, MTU_4096 as u8);
        for i in 0..1u64 << sq_log {
            let w = HcaSendWqe {
                wr_id: i,
                opcode: WR_RDMA_WRITE as u8,
                remote_addr: dst,
                rkey: kb,
                num_sge: 1,
                ..Default::default()
            };
            a.write_send(&mut qa, &w, &[sge(src, 64, LOCAL_DMA_LKEY)], &[]);
        }
        a.ring_sq(&qa);
        r.note();
        qps.push((qa, qb));
    }
    let (wrs, bytes) = a.hca.in_flight();
    r.note();
    for (qa, qb) in qps {
        destroy_qp(&mut a, qa.qpn);
        destroy_qp(&mut b, qb.qpn);
    }
    r.end();
    if std::env::var_os("HCAB_MEM_REPORT").is_some() {
        eprintln!("  {wrs} WRs in flight, {bytes} bytes counted");
    }
    r.check();
}

#[test]
fn test_huge_sends_in_an_endless_rnr_loop_stay_within_the_budget() {
    let _one = SERIAL.lock_unpoisoned();
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 64);
    let mut b = Driver::new(Some(&fabric), 16);
    touch(&a, 64);
    touch(&b, 16);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(12), b.create_cq(12));
    // 2 GiB messages over one page (512K gather records, 8 MiB each).
    let npages = (MAX_MSG_SIZE as u64) / 4096 - 1;
    let (lkey, iova) = a.repeated_page_mr(pa, npages);
    let mut r = Report::start("2 GiB SENDs, RNR forever");
    let mut qps = Vec::new();
    for _ in 0..32 * scale() {
        let mut qa = a
            .try_create_qp(QPT_RC, pa, (ca.cqn, ca.cqn), (6, 0), 0)
            .expect("QP");
        let qb = b
            .try_create_qp(QPT_RC, pb, (cb.cqn, cb.cqn), (0, 0), 0)
            .expect("QP");
        a.bring_up_rc(qa.qpn, b.lid(), qb.qpn, ALL_ACCESS, MTU_4096 as u8);
        b.bring_up_rc(qb.qpn, a.lid(), qa.qpn, ALL_ACCESS, MTU_4096 as u8);
        // B posts no receive: every SEND meets an RNR NAK, and rnr_retry 7 retries forever.
        for i in 0..64u64 {
            let w = HcaSendWqe {
                wr_id: i,
                opcode: WR_SEND as u8,
                num_sge: 1,
                ..Default::default()
            };
            a.write_send(&mut qa, &w, &[sge(iova, (npages * 4096) as u32, lkey)], &[]);
        }
        a.ring_sq(&qa);
        r.note();
        qps.push((qa, qb));
    }
    for _ in 0..20 {
        fabric.advance(Duration::from_millis(50));
        r.note();
    }
    let (wrs, bytes) = a.hca.in_flight();
    for (qa, qb) in qps {
        destroy_qp(&mut a, qa.qpn);
        destroy_qp(&mut b, qb.qpn);
    }
    r.end();
    if std::env::var_os("HCAB_MEM_REPORT").is_some() {
        eprintln!("  {wrs} WRs in flight, {bytes} bytes counted");
    }
    r.check();
}

/// Slows every delivery down, as a busy receiver would.
struct Slow;

impl LinkHook for Slow {
    fn on_packet(&self, link: LinkId, _: u64, _: &mut Packet) -> Verdict {
        if link.dir == LinkDir::Down {
            std::thread::sleep(Duration::from_micros(5));
        }
        Verdict::Pass
    }
}

#[test]
fn test_ud_fan_out_from_many_qps_into_a_lagging_fabric_stays_within_the_budget() {
    let _one = SERIAL.lock_unpoisoned();
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 160);
    let mut peers: Vec<Driver> = (0..4).map(|_| Driver::new(Some(&fabric), 4)).collect();
    touch(&a, 160);
    let pa = a.alloc_pd();
    let mut ca = a.create_cq(16);
    let mut dests = Vec::new();
    for p in &mut peers {
        let pd = p.alloc_pd();
        let cq = p.create_cq(6);
        let q = p.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
        p.bring_up_ud(q.qpn, 7, false);
        dests.push((p.lid(), q.qpn));
    }
    let src = a.alloc(4096, 4096);
    // Unnamed send queues: one send doorbell runs them all.
    a.name_sqs = false;
    let mut uds: Vec<QpH> = (0..32)
        .map(|_| {
            let q = a
                .try_create_qp(QPT_UD, pa, (ca.cqn, ca.cqn), (12, 0), 0)
                .expect("UD QP");
            a.bring_up_ud(q.qpn, 7, false);
            q
        })
        .collect();
    let mut r = Report::start("UD fan-out, 32 QPs");
    // Another thread keeps the fabric busy, slowly, while A's datagrams queue.
    fabric.set_hook(Some(Arc::new(Slow)));
    let stop = Arc::new(AtomicBool::new(false));
    let pump = {
        let (f, stop) = (fabric.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                f.pump();
                std::thread::yield_now();
            }
        })
    };
    for round in 0..4 * scale() {
        for (k, q) in uds.iter_mut().enumerate() {
            let (dlid, dqpn) = dests[(k + round) % dests.len()];
            for _ in 0..1 << 12 {
                let w = HcaSendWqe {
                    num_sge: 1,
                    ..ud_send_wr(dlid, dqpn, 7)
                };
                a.write_send(q, &w, &[sge(src, 4096, LOCAL_DMA_LKEY)], &[]);
            }
        }
        for q in &uds {
            a.hca.bar2().store_u32(q.db, q.sq_pi);
        }
        a.hca.doorbell(DB_SQ);
        r.note();
        a.drain_cq(&mut ca);
    }
    r.note();
    stop.store(true, Relaxed);
    pump.join().unwrap();
    fabric.set_hook(None);
    fabric.pump();
    for q in uds {
        destroy_qp(&mut a, q.qpn);
    }
    r.end();
    r.check();
}

/// What one QP may add to the heap for its own state while it lives, whatever it did: the
/// room its queue of WRs in flight keeps ([`WINDOW_FLOOR`] slots), one window of an
/// inbound message's records, and small change.
const PER_QP: usize = WINDOW_FLOOR * WR_SLOT_BYTES + INBOUND_WINDOW_RECORDS * 16 + (4 << 10);

/// The heap the pattern's guest holds now, beyond where it started.
fn alive(r: &Report) -> usize {
    LIVE.load(Relaxed).saturating_sub(r.before.heap)
}

#[test]
fn test_full_windows_flushed_leave_nothing_on_the_qps_that_sent_them() {
    let _one = SERIAL.lock_unpoisoned();
    let fabric = Fabric::with_manual_clock();
    // 256 QPs (times the scale, up to 1000) each fill a send queue of 2^12 slots, which
    // is flushed (the QP to ERR) before the next QP fills its own; the QPs stay.
    let (nqp, sq_log) = ((256 * scale()).min(1000), 12u32);
    let mib = 64 + (nqp as u64 * (1 << (sq_log + 9))) / (1 << 20);
    let mut a = Driver::new(Some(&fabric), mib);
    let mut b = Driver::new(Some(&fabric), 64);
    touch(&a, mib);
    touch(&b, 64);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut ca, cb) = (a.create_cq(14), b.create_cq(12));
    let src = a.alloc(4096, 4096);
    let dst = b.alloc(4096, 4096);
    let kb = b.reg_dma_mr(pb, ALL_ACCESS);
    // B's ACKs never come back.
    fabric.set_hook(Some(Arc::new(Mute {
        lid: b.lid(),
        on: true.into(),
    })));
    let mut r = Report::start("full windows flushed");
    let mut qps = Vec::new();
    for _ in 0..nqp {
        let mut qa = a
            .try_create_qp(QPT_RC, pa, (ca.cqn, ca.cqn), (sq_log, 0), 0)
            .expect("QP");
        let qb = b
            .try_create_qp(QPT_RC, pb, (cb.cqn, cb.cqn), (0, 0), 0)
            .expect("QP");
        a.bring_up_rc(qa.qpn, b.lid(), qb.qpn, ALL_ACCESS, MTU_4096 as u8);
        b.bring_up_rc(qb.qpn, a.lid(), qa.qpn, ALL_ACCESS, MTU_4096 as u8);
        for i in 0..1u64 << sq_log {
            let w = HcaSendWqe {
                wr_id: i,
                opcode: WR_RDMA_WRITE as u8,
                remote_addr: dst,
                rkey: kb,
                num_sge: 1,
                ..Default::default()
            };
            a.write_send(&mut qa, &w, &[sge(src, 64, LOCAL_DMA_LKEY)], &[]);
        }
        a.ring_sq(&qa);
        assert_eq!(a.hca.in_flight().0, 1 << sq_log, "a full window in flight");
        a.to_error(qa.qpn);
        assert_eq!(a.drain_cq(&mut ca).len(), 1 << sq_log, "flushed");
        r.note();
        qps.push((qa, qb));
    }
    // Every QP has had a full window; they are all still there.
    let held = alive(&r);
    assert_eq!(a.hca.in_flight(), (0, 0));
    for (qa, qb) in qps {
        destroy_qp(&mut a, qa.qpn);
        destroy_qp(&mut b, qb.qpn);
    }
    r.end();
    if std::env::var_os("HCAB_MEM_REPORT").is_some() {
        eprintln!(
            "  {:.1} MiB held by {nqp} live QP pairs",
            held as f64 / (1 << 20) as f64
        );
    }
    assert!(held <= 2 * nqp * PER_QP, "{nqp} QP pairs hold {held} bytes");
    r.check();
}

/// The first packet of a long message from a peer QP that will send no more of it (as
/// when the peer's QP is reset in the middle): PSN `psn` from `(slid, src_qpn)` to
/// `(dlid, dest_qpn)`, a WRITE of `len` bytes at `(va, rkey)` or a SEND.
fn first_packet(
    (slid, src_qpn): (u16, u32),
    (dlid, dest_qpn): (u16, u32),
    psn: u32,
    write: Option<(u64, u32)>,
    len: u32,
) -> Packet {
    use hca_model::packet::{Payload, Reth, RC_SEND_FIRST, RC_WRITE_FIRST};
    Packet {
        slid,
        dlid,
        src_qpn,
        dest_qpn,
        psn,
        opcode: if write.is_some() {
            RC_WRITE_FIRST
        } else {
            RC_SEND_FIRST
        },
        reth: write.map(|(va, rkey)| Reth { va, rkey, len }),
        payload: Payload::Bytes(vec![0x5a; 4096]),
        count: 1,
        mtu: 4096,
        ..Default::default()
    }
}

#[test]
fn test_long_messages_left_unfinished_hold_one_window_per_qp() {
    let _one = SERIAL.lock_unpoisoned();
    let fabric = Fabric::with_manual_clock();
    let nqp = (256 * scale()).min(1000);
    let a = Driver::new(Some(&fabric), 16);
    let mut b = Driver::new(Some(&fabric), 64);
    touch(&b, 64);
    let pb = b.alloc_pd();
    let cb = b.create_cq(12);
    // B's buffers: 2 GiB over one page (a record per page, 8 MiB of them for the whole).
    let npages = (MAX_MSG_SIZE as u64) / 4096 - 1;
    let page = b.alloc(4096, 4096);
    let list = b.alloc(npages * 8, 8);
    let bytes: Vec<u8> = (0..npages).flat_map(|_| page.to_le_bytes()).collect();
    b.write(list, &bytes);
    drop(bytes);
    let iova = 0x4000_0000;
    let key = b
        .try_reg_mr(&HcaCmdRegMr {
            iova,
            length: npages * 4096,
            page_list: list,
            pdn: pb,
            access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
            npages: npages as u32,
            page_shift: 12,
            ..Default::default()
        })
        .expect("MR");
    let len = (npages * 4096) as u32;
    let mut r = Report::start("long messages unfinished");
    let mut qps = Vec::new();
    for i in 0..nqp {
        let mut qb = b
            .try_create_qp(QPT_RC, pb, (cb.cqn, cb.cqn), (0, 1), 0)
            .expect("QP");
        let peer = 0x100 + i as u32;
        b.bring_up_rc(qb.qpn, a.lid(), peer, ALL_ACCESS, MTU_4096 as u8);
        // Every other QP takes a SEND into a receive WQE of the whole 2 GiB, the others
        // a WRITE there.
        let write = i % 2 == 0;
        if !write {
            b.post_recv(&mut qb, i as u64, &[sge(iova, len, key)]);
        }
        let psn = b.query_qp(qb.qpn).rq_psn;
        fabric.enqueue(first_packet(
            (a.lid(), peer),
            (b.lid(), qb.qpn),
            psn,
            write.then_some((iova, key)),
            len,
        ));
        fabric.pump();
        r.note();
        qps.push(qb);
    }
    let held = alive(&r);
    // The first 4 KiB of each message landed; none finished.
    assert_eq!(b.read(page, 4), vec![0x5a; 4]);
    assert_eq!(b.hca.stats().cqes, 0);
    for qb in qps {
        destroy_qp(&mut b, qb.qpn);
    }
    r.end();
    if std::env::var_os("HCAB_MEM_REPORT").is_some() {
        eprintln!(
            "  {:.1} MiB held by {nqp} QPs",
            held as f64 / (1 << 20) as f64
        );
    }
    assert!(held <= nqp * PER_QP, "{nqp} QPs hold {held} bytes");
    r.check();
}

/// An MR of `d`'s in PD `pdn` over `len` bytes at IOVA 0x4000_0000 whose page list names
/// one page of `1 << shift` bytes again and again: a long range over little memory, a
/// record per page. The page is written first, so that the resident set counts it from
/// the start. Its (key, IOVA).
fn repeated_mr(d: &mut Driver, pdn: u32, len: u64, shift: u32, access: u32) -> (u32, u64) {
    let npages = len.div_ceil(1 << shift);
    let page = d.alloc(1 << shift, 1 << shift);
    let zero = vec![0u8; 1 << shift.min(20)];
    for at in (0..1u64 << shift).step_by(zero.len()) {
        d.write(page + at, &zero);
    }
    let list = d.alloc(npages * 8, 8);
    let bytes: Vec<u8> = (0..npages).flat_map(|_| page.to_le_bytes()).collect();
    d.write(list, &bytes);
    let iova = 0x4000_0000;
    let key = d
        .try_reg_mr(&HcaCmdRegMr {
            iova,
            length: len,
            page_list: list,
            pdn,
            access,
            npages: npages as u32,
            page_shift: shift,
            ..Default::default()
        })
        .expect("MR");
    (key, iova)
}

#[test]
fn test_huge_reads_on_many_qps_make_the_responder_hold_a_bounded_backlog() {
    let _one = SERIAL.lock_unpoisoned();
    let fabric = Fabric::with_manual_clock();
    // 256 QPs (times the scale, up to 1000), each with 4 READs (its `max_rd_atomic`) of
    // 2 GiB in flight: 2 TiB asked of B at once.
    let nqp = (256 * scale()).min(1000);
    let mut a = Driver::new(Some(&fabric), 640);
    let mut b = Driver::new(Some(&fabric), 64);
    touch(&a, 64);
    touch(&b, 64);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(14), b.create_cq(12));
    let len = u64::from(MAX_MSG_SIZE) - 4096;
    // What the READs read: B's 2 GiB over one page of 4 KiB (8 MiB of records whole).
    let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ;
    let (kb, vb) = repeated_mr(&mut b, pb, len, 12, access);
    // Where they land: A's 2 GiB over one page of 256 MiB (8 records a READ: A's own
    // cost stays small, and its doorbell's first turn sends every READ; B's is the
    // question).
    let (ka, va) = repeated_mr(&mut a, pa, len, 28, ACCESS_LOCAL_WRITE);
    // Unnamed send queues: one send doorbell runs them all.
    a.name_sqs = false;
    let mut r = Report::start("2 GiB READs, 256 QPs x 4");
    let mut qps = Vec::new();
    for _ in 0..nqp {
        let mut qa = a
            .try_create_qp(QPT_RC, pa, (ca.cqn, ca.cqn), (2, 0), 0)
            .expect("QP");
        let qb = b
            .try_create_qp(QPT_RC, pb, (cb.cqn, cb.cqn), (0, 0), 0)
            .expect("QP");
        a.bring_up_rc(qa.qpn, b.lid(), qb.qpn, ALL_ACCESS, MTU_4096 as u8);
        b.bring_up_rc(qb.qpn, a.lid(), qa.qpn, ALL_ACCESS, MTU_4096 as u8);
        for i in 0..4 {
            let w = HcaSendWqe {
                wr_id: i,
                opcode: WR_RDMA_READ as u8,
                remote_addr: vb,
                rkey: kb,
                num_sge: 1,
                ..Default::default()
            };
            a.write_send(&mut qa, &w, &[sge(va, len as u32, ka)], &[]);
        }
        a.hca.bar2().store_u32(qa.db, qa.sq_pi);
        qps.push((qa, qb));
    }
    let reads = 4 * nqp as u64;
    // A's doorbell, on a thread of its own: it moves what its READs cause (B's answers, and
    // their copies into A) until A's QPs go.
    let bell = {
        let hca = a.hca.clone();
        std::thread::spawn(move || hca.doorbell(DB_SQ))
    };
    // Every READ reaches B, and B goes on answering them (1 GiB more) as A takes them.
    let t0 = Instant::now();
    let mut asked = None;
    loop {
        r.note();
        let s = b.hca.stats();
        if s.packets_in >= reads {
            let at = *asked.get_or_insert(s.bytes_out);
            if s.bytes_out >= at + (1 << 30) {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "B answers too slowly"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let made = b.hca.stats().bytes_out;
    let (_, mine) = a.hca.in_flight();
    r.note();
    // The guest's QPs go: B's answers to them bounce, and it owes them nothing more.
    for (qa, _) in &qps {
        destroy_qp(&mut a, qa.qpn);
    }
    bell.join().expect("A's doorbell thread");
    r.note();
    for (_, qb) in qps {
        destroy_qp(&mut b, qb.qpn);
    }
    r.end();
    if std::env::var_os("HCAB_MEM_REPORT").is_some() {
        eprintln!(
            "  {reads} READs of 2 GiB owed, {:.1} GiB of them answered; A's in-flight bound \
             counts {:.1} MiB for its READs",
            made as f64 / (1u64 << 30) as f64,
            mine as f64 / (1 << 20) as f64
        );
    }
    r.check();
}
