//! A model-level cluster: N emulated HCAs on one fabric, each driven by the Rust test driver
//! (no VM), connected all-to-all with RC QPs that share one CQ per node, running the paper's
//! communication pattern: 8-byte control SENDs, unsignaled but for one in 16, and page-sized
//! RDMA WRITEs for data. Every byte is verified; per-node device statistics are printed.
//!
//! `cargo run --release -p hca-model --example cluster -- [--nodes N] [--rounds R]`

use std::process::ExitCode;
use std::time::Instant;

use hca_model::abi::*;
use hca_model::Fabric;
use hca_test_driver::*;

const BLOCK: u64 = 64 << 10;

struct Node {
    d: Driver,
    pd: u32,
    key: u32,
    cq: CqH,
    /// qps[j]: this node's QP to node j.
    qps: Vec<Option<QpH>>,
    /// Where peers' RDMA WRITEs and SENDs land: one block and one 8-byte slot per peer.
    blocks: u64,
    slots: u64,
}

fn usage() -> ExitCode {
    eprintln!("usage: cluster [--nodes N (2..=16, default 4)] [--rounds R (default 200)]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut nodes, mut rounds) = (4usize, 200u64);
    while let Some(a) = args.next() {
        let v = args.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--nodes", Some(n)) if (2..=16).contains(&n) => nodes = n as usize,
            ("--rounds", Some(r)) if r > 0 => rounds = r,
            _ => return usage(),
        }
    }
    println!("hcabench model cluster: {nodes} HCAs on one fabric, {rounds} rounds all-to-all");
    let start = Instant::now();
    let fabric = Fabric::new();
    let mut cluster: Vec<Node> = (0..nodes)
        .map(|_| {
            let mut d = Driver::new(Some(&fabric), 32);
            let pd = d.alloc_pd();
            let key = d.reg_dma_mr(pd, ALL_ACCESS);
            let cq = d.create_cq(12);
            let qps = (0..nodes).map(|_| None).collect();
            let blocks = d.alloc(BLOCK * nodes as u64, 4096);
            let slots = d.alloc(8 * nodes as u64, 8);
            Node {
                d,
                pd,
                key,
                cq,
                qps,
                blocks,
                slots,
            }
        })
        .collect();
    connect_all(&mut cluster, nodes);
    println!(
        "  fabric up: LIDs 1..={nodes}, {} RC QPs",
        nodes * (nodes - 1)
    );

    let mut failures = 0;
    for round in 0..rounds {
        for i in 0..nodes {
            for j in 0..nodes {
                if i != j {
                    exchange(&mut cluster, i, j, round);
                }
            }
        }
        // Every node reaps its one shared CQ each round, as the DSM's handler would.
        for node in cluster.iter_mut() {
            let done = node.d.drain_cq(&mut node.cq);
            failures += done
                .iter()
                .filter(|e| u32::from(e.status) != WC_SUCCESS)
                .count();
        }
    }
    failures += verify(&mut cluster, rounds);
    print_stats(&cluster, &fabric, start);
    if failures == 0 {
        println!("result: OK, every SEND and RDMA WRITE arrived intact");
        ExitCode::SUCCESS
    } else {
        println!("result: FAILED, {failures} mismatches");
        ExitCode::FAILURE
    }
}

fn connect_all(c: &mut [Node], n: usize) {
    for (i, node) in c.iter_mut().enumerate() {
        let (pd, cqn) = (node.pd, node.cq.cqn);
        for j in 0..n {
            if i != j {
                let qp = node
                    .d
                    .try_create_qp(QPT_RC, pd, (cqn, cqn), (8, 8), 0)
                    .expect("create QP");
                node.qps[j] = Some(qp);
            }
        }
    }
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let peer_qpn = c[j].qps[i].as_ref().map(|q| q.qpn).unwrap_or(0);
                let lid = c[j].d.lid();
                let qpn = c[i].qps[j].as_ref().map(|q| q.qpn).unwrap_or(0);
                c[i].d
                    .bring_up_rc(qpn, lid, peer_qpn, ALL_ACCESS, MTU_4096 as u8);
            }
        }
    }
}

/// Node i writes a block into j's memory, then sends j an 8-byte "page ready" message.
fn exchange(c: &mut [Node], i: usize, j: usize, round: u64) {
    let (dst_block, dst_slot, key_j) = (
        c[j].blocks + BLOCK * i as u64,
        c[j].slots + 8 * i as u64,
        c[j].key,
    );
    let mut qj = c[j].qps[i].take().expect("QP");
    c[j].d.post_recv(&mut qj, round, &[sge(dst_slot, 8, key_j)]);
    c[j].qps[i] = Some(qj);

    let node = &mut c[i];
    let src = node.blocks + BLOCK * i as u64; // i's own block slot is free: use it as source
    node.d
        .write(src, &pattern(BLOCK as usize, (round as u8) ^ (i as u8)));
    let msg = node.slots + 8 * i as u64;
    node.d.write(msg, &(round << 8 | i as u64).to_le_bytes());
    let mut q = node.qps[j].take().expect("QP");
    let mut wr = send_wr(round, WR_RDMA_WRITE, 0);
    wr.remote_addr = dst_block;
    wr.rkey = key_j;
    let key = node.key;
    node.d.post_send(&mut q, wr, &[sge(src, BLOCK as u32, key)]);
    let flags = if round % 16 == 15 { WQE_SIGNALED } else { 0 };
    node.d
        .post_send(&mut q, send_wr(round, WR_SEND, flags), &[sge(msg, 8, key)]);
    node.qps[j] = Some(q);
}

/// Checks that the last round's block and message from every peer are in place.
fn verify(c: &mut [Node], rounds: u64) -> usize {
    let last = rounds - 1;
    let n = c.len();
    let mut bad = 0;
    for (j, node) in c.iter_mut().enumerate() {
        for i in (0..n).filter(|&i| i != j) {
            let block = node.d.read(node.blocks + BLOCK * i as u64, BLOCK as usize);
            bad += usize::from(block != pattern(BLOCK as usize, (last as u8) ^ (i as u8)));
            let slot = node.d.read(node.slots + 8 * i as u64, 8);
            bad += usize::from(slot != (last << 8 | i as u64).to_le_bytes());
        }
    }
    bad
}

fn print_stats(c: &[Node], fabric: &Fabric, start: Instant) {
    println!(
        "  {:>5} {:>4} {:>9} {:>9} {:>11} {:>11} {:>12}",
        "node", "LID", "WQEs", "CQEs", "pkts out", "pkts in", "MiB out"
    );
    for (i, n) in c.iter().enumerate() {
        let s = n.d.hca.stats();
        println!(
            "  {:>5} {:>4} {:>9} {:>9} {:>11} {:>11} {:>12.1}",
            format!("node{}", i + 1),
            n.d.lid(),
            s.wqes,
            s.cqes,
            s.packets_out,
            s.packets_in,
            s.bytes_out as f64 / (1 << 20) as f64
        );
    }
    let f = fabric.stats();
    println!(
        "  fabric: {} delivered, {} without route, {} rejected; {:.2?} in all",
        f.delivered,
        f.no_route,
        f.rejected,
        start.elapsed()
    );
}
