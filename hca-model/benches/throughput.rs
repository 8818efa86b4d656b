//! Model throughput, measured side by side in one run:
//! - RDMA WRITE of 4 KiB, 64 KiB and 1 MiB between two guest memories, as a ratio to a plain
//!   memcpy of the same size: one WRITE at a time (post, ring, poll its completion), and 16
//!   per doorbell (as a bandwidth test keeps a window in flight); rounds of the three
//!   alternate, the best round of each is kept;
//! - RDMA READ of 4 KiB, 64 KiB, 1 MiB and 64 MiB (longer than the 16 MiB a responder's turn
//!   makes of a response), one at a time, as a ratio to a memcpy of the same size;
//! - 8-byte SEND message rate on one core, doorbell to CQE on both sides (on the virtual
//!   clock the tests use, and at one WR per doorbell also on the real clock the device
//!   server and the VMM run, whose readings cost);
//! - fairness: one pair's 8-byte SEND round-trip rate alone, and while another pair on the
//!   same fabric floods it with 64 KiB RDMA WRITEs from another thread;
//! - scale: the 8-byte SEND rate with many other QPs connected and idle;
//! - cores: pairs sending 8-byte SENDs each on a thread of its own, all on one fabric, beside
//!   the same pairs each on a fabric of its own (what sharing the fabric costs: as a device
//!   server or VMM runs several guests, a thread each).
//!
//! Run: `cargo bench -p hca-model --bench throughput` (add `-- --quick` for a short run, and
//! `write`, `read`, `send`, `fair`, `scale` or `cores` for one part; `write64k`, `read64m`
//! or `send1` for one row).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hca_model::abi::*;
use hca_model::Fabric;
use hca_test_driver::*;
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// Times `op` over `iters` iterations, `rounds` times, returning the best time per iteration.
fn best_of(rounds: usize, iters: usize, mut op: impl FnMut()) -> Duration {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                op();
            }
            t.elapsed() / iters as u32
        })
        .min()
        .unwrap()
}

/// WRITEs a bandwidth run posts per doorbell (as `ib_write_bw` keeps WRs in flight).
const WRITES_IN_FLIGHT: usize = 16;

/// `sizes`: which of 4 KiB, 64 KiB and 1 MiB to run (for a profiler: `write4k`, `write64k`,
/// `write1m`).
fn rdma_write_vs_memcpy(quick: bool, sizes: &[bool; 3]) {
    println!("RDMA WRITE between two guest memories vs memcpy (best round per side)");
    println!(
        "{:>8} {:>12} {:>12} {:>12} {:>8} {:>14} {:>8}",
        "size",
        "memcpy",
        "rdma write",
        "write GB/s",
        "ratio",
        format!("{WRITES_IN_FLIGHT}/doorbell"),
        "ratio"
    );
    let all = [4 << 10, 64 << 10, 1 << 20];
    for size in (all.into_iter().zip(sizes))
        .filter(|(_, &on)| on)
        .map(|(size, _)| size)
    {
        let mut p = Pair::new(MTU_4096 as u8);
        let src = p.a.alloc(size as u64, 4096);
        let dst = p.b.alloc(size as u64, 4096);
        p.a.write(src, &pattern(size, 1));
        let iters = if quick { 20 } else { (64 << 20) / size };
        let rounds = if quick { 3 } else { 9 };

        // The baseline: one memcpy from A's guest memory into B's, same addresses.
        let (mem_a, mem_b) = (p.a.mem.clone(), p.b.mem.clone());
        let src_slice = mem_a.get_slice(GuestAddress(src), size).unwrap();
        let dst_slice = mem_b.get_slice(GuestAddress(dst), size).unwrap();
        let (mut best_copy, mut best_write) = (Duration::MAX, Duration::MAX);
        let mut best_batch = Duration::MAX;
        let (key_a, key_b) = (p.key_a, p.key_b);
        let mut wr = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
        wr.remote_addr = dst;
        wr.rkey = key_b;
        wr.num_sge = 1;
        let sges = [sge(src, size as u32, key_a)];
        for _ in 0..rounds {
            // Alternate the three so that all see the same machine state.
            best_copy = best_copy.min(best_of(1, iters, || {
                black_box(&src_slice).copy_to_volatile_slice(black_box(dst_slice));
            }));
            // One WRITE at a time: the time to its completion.
            best_write = best_write.min(best_of(1, iters, || {
                p.a.post_send(&mut p.qa, wr, &sges);
                let c = p.a.poll_cq(&mut p.cq_a).expect("write completed");
                assert_eq!(u32::from(c.status), WC_SUCCESS);
            }));
            // A window of WRITEs per doorbell, as a bandwidth test keeps them in flight.
            let batches = iters.div_ceil(WRITES_IN_FLIGHT);
            let per_batch = best_of(1, batches, || {
                for _ in 0..WRITES_IN_FLIGHT {
                    p.a.write_send(&mut p.qa, &wr, &sges, &[]);
                }
                p.a.ring_sq(&p.qa);
                for _ in 0..WRITES_IN_FLIGHT {
                    let c = p.a.poll_cq(&mut p.cq_a).expect("write completed");
                    assert_eq!(u32::from(c.status), WC_SUCCESS);
                }
            });
            best_batch = best_batch.min(per_batch / WRITES_IN_FLIGHT as u32);
        }
        assert_eq!(p.b.read(dst, size), pattern(size, 1));
        let gbps = size as f64 / best_write.as_secs_f64() / 1e9;
        println!(
            "{:>8} {:>10.2?} {:>12.2?} {:>12.2} {:>7.2}x {:>14.2?} {:>7.2}x",
            fmt_size(size),
            best_copy,
            best_write,
            gbps,
            best_copy.as_secs_f64() / best_write.as_secs_f64(),
            best_batch,
            best_copy.as_secs_f64() / best_batch.as_secs_f64()
        );
    }
}

/// `sizes`: which of 4 KiB, 64 KiB, 1 MiB and 64 MiB to run (for a profiler: `read4k`,
/// `read64k`, `read1m`, `read64m`).
fn rdma_read_vs_memcpy(quick: bool, sizes: &[bool; 4]) {
    println!();
    println!("RDMA READ between two guest memories vs memcpy, one at a time (best round per side)");
    println!(
        "{:>8} {:>12} {:>12} {:>12} {:>8}",
        "size", "memcpy", "rdma read", "read GB/s", "ratio"
    );
    let all = [4 << 10, 64 << 10, 1 << 20, 64 << 20];
    for size in (all.into_iter().zip(sizes))
        .filter(|(_, &on)| on)
        .map(|(size, _)| size)
    {
        let mib = 16 + 2 * (size as u64 >> 20);
        let fabric = Fabric::with_manual_clock();
        let mut p = Pair::build_with_memory(fabric, mib, MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
        let src = p.b.alloc(size as u64, 4096);
        let dst = p.a.alloc(size as u64, 4096);
        p.b.write(src, &pattern(size, 2));
        let iters = if quick { 4 } else { ((64 << 20) / size).max(8) };
        let rounds = if quick { 3 } else { 9 };
        let (mem_a, mem_b) = (p.a.mem.clone(), p.b.mem.clone());
        let src_slice = mem_b.get_slice(GuestAddress(src), size).unwrap();
        let dst_slice = mem_a.get_slice(GuestAddress(dst), size).unwrap();
        let (mut best_copy, mut best_read) = (Duration::MAX, Duration::MAX);
        let mut wr = send_wr(1, WR_RDMA_READ, WQE_SIGNALED);
        (wr.remote_addr, wr.rkey) = (src, p.key_b);
        let sges = [sge(dst, size as u32, p.key_a)];
        for _ in 0..rounds {
            best_copy = best_copy.min(best_of(1, iters, || {
                black_box(&src_slice).copy_to_volatile_slice(black_box(dst_slice));
            }));
            best_read = best_read.min(best_of(1, iters, || {
                p.a.post_send(&mut p.qa, wr, &sges);
                let c = p.a.poll_cq(&mut p.cq_a).expect("read completed");
                assert_eq!(u32::from(c.status), WC_SUCCESS);
            }));
        }
        assert!(p.a.read(dst, size) == pattern(size, 2));
        println!(
            "{:>8} {:>10.2?} {:>12.2?} {:>12.2} {:>7.2}x",
            fmt_size(size),
            best_copy,
            best_read,
            size as f64 / best_read.as_secs_f64() / 1e9,
            best_copy.as_secs_f64() / best_read.as_secs_f64()
        );
    }
}

/// `rows`: which of the rows to run (for a profiler: `send1`, `send16`, `send1real`).
fn send_rate(quick: bool, rows: &[bool; 3]) {
    println!();
    println!("8-byte SEND, one core, doorbell to CQE on both sides (every WR signaled)");
    println!("{:>14} {:>14} {:>12}", "WRs/doorbell", "msgs/s", "ns/msg");
    // The last row on a fabric with the real clock (as the device server and the VMM run
    // it), whose readings the engine pays for when it arms and restarts timers.
    let all = [(1usize, false), (16, false), (1, true)];
    for (batch, real_clock) in (all.into_iter().zip(rows))
        .filter(|(_, &on)| on)
        .map(|(row, _)| row)
    {
        let mut p = if real_clock {
            Pair::build(Fabric::new(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS)
        } else {
            Pair::new(MTU_4096 as u8)
        };
        let (mut qa, mut qb) = p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 6, 0);
        let src = p.a.alloc(8, 8);
        let dst = p.b.alloc(8, 8);
        let (key_a, key_b) = (p.key_a, p.key_b);
        let total = if quick { 20_000 } else { 400_000 };
        let mut sent = 0usize;
        let start = Instant::now();
        while sent < total {
            for _ in 0..batch {
                p.b.post_recv(&mut qb, sent as u64, &[sge(dst, 8, key_b)]);
            }
            for i in 0..batch {
                let mut wr = send_wr(i as u64, WR_SEND, WQE_SIGNALED);
                wr.num_sge = 1;
                p.a.write_send(&mut qa, &wr, &[sge(src, 8, key_a)], &[]);
            }
            p.a.ring_sq(&qa);
            let mut got = (0, 0);
            while got != (batch, batch) {
                got.0 += usize::from(p.a.poll_cq(&mut p.cq_a).is_some());
                got.1 += usize::from(p.b.poll_cq(&mut p.cq_b).is_some());
            }
            sent += batch;
        }
        let el = start.elapsed();
        let label = if real_clock {
            format!("{batch}, real clock")
        } else {
            batch.to_string()
        };
        println!(
            "{:>14} {:>14.0} {:>12.0}",
            label,
            total as f64 / el.as_secs_f64(),
            el.as_nanos() as f64 / total as f64
        );
    }
    println!("(each message also costs the test driver's posting and polling, measured in)");
}

/// 8-byte SENDs one per doorbell (as [`ping_for`] sends them), with `idle` more connected
/// QPs on each device: a send doorbell does not name its QP, so the device looks at every
/// live one. Prints the rate and the cost per message.
fn send_rate_among(idle: usize, quick: bool) {
    let mut p = Pair::new(MTU_4096 as u8);
    for _ in 0..idle {
        p.connect_more((p.cq_a.cqn, p.cq_b.cqn), 2, 0);
    }
    let dur = Duration::from_millis(if quick { 300 } else { 2000 });
    let rate = ping_for(&mut p, dur) as f64 / dur.as_secs_f64();
    println!("{:>14} {:>14.0} {:>12.0}", idle, rate, 1e9 / rate);
}

fn scale(quick: bool) {
    println!();
    println!("8-byte SEND, 1 WR/doorbell, with other connected QPs idle on both devices");
    println!("{:>14} {:>14} {:>12}", "idle QPs", "msgs/s", "ns/msg");
    for idle in [0, 64, 512] {
        send_rate_among(idle, quick);
    }
}

/// 8-byte SENDs, one at a time, from `p.a` to `p.b` until `stop`: how many completed.
fn ping_for(p: &mut Pair, dur: Duration) -> u64 {
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    let (key_a, key_b) = (p.key_a, p.key_b);
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < dur {
        for _ in 0..64 {
            p.b.post_recv(&mut p.qb, n, &[sge(dst, 8, key_b)]);
            let mut wr = send_wr(n, WR_SEND, WQE_SIGNALED);
            wr.num_sge = 1;
            p.a.post_send(&mut p.qa, wr, &[sge(src, 8, key_a)]);
            let mut got = (false, false);
            while got != (true, true) {
                got.0 |= p.a.poll_cq(&mut p.cq_a).is_some();
                got.1 |= p.b.poll_cq(&mut p.cq_b).is_some();
            }
            n += 1;
        }
    }
    n
}

fn fairness(quick: bool) {
    println!();
    println!(
        "fairness: one pair's 8-byte SEND round trips alone and while another pair on the \
         same fabric floods 64 KiB RDMA WRITEs (16 per doorbell) from a second thread"
    );
    let dur = Duration::from_millis(if quick { 300 } else { 2000 });
    let fabric = Fabric::with_manual_clock();
    let mut victim = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    let mut flood = Pair::build(fabric, MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS);
    let alone = ping_for(&mut victim, dur) as f64 / dur.as_secs_f64();
    let size = 64u32 << 10;
    let (src, dst) = (
        flood.a.alloc(size.into(), 4096),
        flood.b.alloc(size.into(), 4096),
    );
    let stop = AtomicBool::new(false);
    let (under, flood_bytes, flood_secs) = std::thread::scope(|s| {
        let f = s.spawn(|| {
            let (key_a, key_b) = (flood.key_a, flood.key_b);
            let (t, mut bytes) = (Instant::now(), 0u64);
            while !stop.load(Relaxed) {
                for i in 0..16 {
                    let mut wr = send_wr(i, WR_RDMA_WRITE, WQE_SIGNALED);
                    wr.num_sge = 1;
                    (wr.remote_addr, wr.rkey) = (dst, key_b);
                    flood
                        .a
                        .write_send(&mut flood.qa, &wr, &[sge(src, size, key_a)], &[]);
                }
                flood.a.ring_sq(&flood.qa);
                let mut got = 0;
                while got < 16 {
                    got += usize::from(flood.a.poll_cq(&mut flood.cq_a).is_some());
                }
                bytes += 16 * u64::from(size);
            }
            (bytes, t.elapsed().as_secs_f64())
        });
        // The flood first, then the victim's measured window.
        std::thread::sleep(Duration::from_millis(50));
        let n = ping_for(&mut victim, dur);
        stop.store(true, Relaxed);
        let (bytes, secs) = f.join().expect("flood thread");
        (n as f64 / dur.as_secs_f64(), bytes, secs)
    });
    println!(
        "{:>16} {:>18} {:>8} {:>14}",
        "victim alone/s", "victim flooded/s", "ratio", "flood GB/s"
    );
    println!(
        "{:>16.0} {:>18.0} {:>7.2}x {:>14.2}",
        alone,
        under,
        under / alone,
        flood_bytes as f64 / flood_secs / 1e9
    );
    println!("(a fair fabric keeps the ratio near the victim's share of the host's cores)");
}

/// Pairs on one fabric, one thread each: the aggregate 8-byte SEND rate (1 WR/doorbell),
/// beside the same pairs each on a fabric of its own (nothing shared between threads).
fn cores(quick: bool) {
    println!();
    println!("8-byte SEND, 1 WR/doorbell, pairs on threads of their own: one fabric vs one each");
    println!(
        "{:>8} {:>16} {:>16} {:>8}",
        "pairs", "one fabric", "own fabrics", "ratio"
    );
    let dur = Duration::from_millis(if quick { 300 } else { 2000 });
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    for n in [1, 2, 4, 8, 16].into_iter().filter(|&n| n <= threads) {
        let run = |shared: bool| {
            let fabric = Fabric::with_manual_clock();
            let mut pairs: Vec<Pair> = (0..n)
                .map(|_| {
                    let f = if shared {
                        fabric.clone()
                    } else {
                        Fabric::with_manual_clock()
                    };
                    Pair::build(f, MTU_4096 as u8, ALL_ACCESS, DEFAULT_RTS)
                })
                .collect();
            std::thread::scope(|s| {
                let hs: Vec<_> = pairs
                    .iter_mut()
                    .map(|p| s.spawn(|| ping_for(p, dur)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().expect("pair thread"))
                    .sum::<u64>()
            }) as f64
                / dur.as_secs_f64()
        };
        let (one, own) = (run(true), run(false));
        println!("{:>8} {:>16.0} {:>16.0} {:>7.2}x", n, one, own, one / own);
    }
}

fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // Names pick parts (for a profiler); none means all. Cargo's own flags are ignored.
    let parts: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let want = |p: &str| parts.is_empty() || parts.contains(&p);
    let sizes = ["write4k", "write64k", "write1m"].map(|s| want("write") || parts.contains(&s));
    if sizes.contains(&true) {
        rdma_write_vs_memcpy(quick, &sizes);
    }
    let sizes =
        ["read4k", "read64k", "read1m", "read64m"].map(|s| want("read") || parts.contains(&s));
    if sizes.contains(&true) {
        rdma_read_vs_memcpy(quick, &sizes);
    }
    let rows = ["send1", "send16", "send1real"].map(|r| want("send") || parts.contains(&r));
    if rows.contains(&true) {
        send_rate(quick, &rows);
    }
    if want("fair") {
        fairness(quick);
    }
    if want("scale") {
        scale(quick);
    }
    if want("cores") {
        cores(quick);
    }
}
