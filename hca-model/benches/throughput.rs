//! Model throughput, measured side by side in one run:
//! - RDMA WRITE of 4 KiB, 64 KiB and 1 MiB between two guest memories, as a ratio to a plain
//!   memcpy of the same size (rounds of the two alternate, best round of each is kept);
//! - 8-byte SEND message rate on one core, doorbell to CQE on both sides.
//!
//! Run: `cargo bench -p hca-model --bench throughput` (add `-- --quick` for a short run).

use std::hint::black_box;
use std::time::{Duration, Instant};

use hca_model::abi::*;
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

fn rdma_write_vs_memcpy(quick: bool) {
    println!("RDMA WRITE between two guest memories vs memcpy (best round per side)");
    println!(
        "{:>8} {:>12} {:>12} {:>12} {:>8}",
        "size", "memcpy", "rdma write", "write GB/s", "ratio"
    );
    for size in [4 << 10, 64 << 10, 1 << 20] {
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
        let (key_a, key_b) = (p.key_a, p.key_b);
        for _ in 0..rounds {
            // Alternate the two so that both see the same machine state.
            best_copy = best_copy.min(best_of(1, iters, || {
                black_box(&src_slice).copy_to_volatile_slice(black_box(dst_slice));
            }));
            best_write = best_write.min(best_of(1, iters, || {
                let mut wr = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
                wr.remote_addr = dst;
                wr.rkey = key_b;
                p.a.post_send(&mut p.qa, wr, &[sge(src, size as u32, key_a)]);
                let c = p.a.poll_cq(&mut p.cq_a).expect("write completed");
                assert_eq!(u32::from(c.status), WC_SUCCESS);
            }));
        }
        assert_eq!(p.b.read(dst, size), pattern(size, 1));
        let gbps = size as f64 / best_write.as_secs_f64() / 1e9;
        println!(
            "{:>8} {:>10.2?} {:>12.2?} {:>12.2} {:>7.2}x",
            fmt_size(size),
            best_copy,
            best_write,
            gbps,
            best_copy.as_secs_f64() / best_write.as_secs_f64()
        );
    }
}

fn send_rate(quick: bool) {
    println!();
    println!("8-byte SEND, one core, doorbell to CQE on both sides (every WR signaled)");
    println!("{:>14} {:>14} {:>12}", "WRs/doorbell", "msgs/s", "ns/msg");
    for batch in [1usize, 16] {
        let mut p = Pair::new(MTU_4096 as u8);
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
        println!(
            "{:>14} {:>14.0} {:>12.0}",
            batch,
            total as f64 / el.as_secs_f64(),
            el.as_nanos() as f64 / total as f64
        );
    }
    println!("(each message also costs the test driver's posting and polling, measured in)");
}

fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    rdma_write_vs_memcpy(quick);
    send_rate(quick);
}
