//! Boots an N-node cluster (TCG) and prints when each node's init was ready, its
//! in-guest doorbell -> MSI-X round trips and its console's marked lines, then shuts down.
//!
//! `cargo run --release -p e2e --example boot_time -- [NODES]` (default 2)

use std::process::ExitCode;
use std::time::Instant;

use cluster::console_protocol::{PREFIX, PROBE, READY};
use e2e::{prerequisites, Cluster, BOOT_TIMEOUT};

fn main() -> ExitCode {
    let nodes: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 2,
        Some(Ok(n)) if (1..=16).contains(&n) => n,
        _ => {
            eprintln!("usage: boot_time [NODES (1..=16)]");
            return ExitCode::from(2);
        }
    };
    let image = match prerequisites() {
        Ok(i) => i,
        Err(why) => {
            eprintln!("boot_time: {why}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "booting {nodes} guests ({}) under TCG",
        image.kernel_version
    );
    let t0 = Instant::now();
    let mut c = Cluster::start("boot-time", &image, nodes, 256, "shell");
    for g in c.nodes_mut() {
        match g.wait_line(READY, BOOT_TIMEOUT) {
            Ok((_, at)) => {
                let rtt = g
                    .wait_line(&format!("{PROBE} doorbell-irq"), BOOT_TIMEOUT)
                    .map(|(l, _)| l.replace(&format!("{PROBE} doorbell-irq "), ""))
                    .unwrap_or_default();
                println!("  {}: ready {at:.2?} after start; {rtt}", g.name());
                for line in g.console_lines().iter().filter(|l| l.starts_with(PREFIX)) {
                    println!("      {line}");
                }
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "all {nodes} ready {:.2?} after the first QEMU started",
        t0.elapsed()
    );
    ExitCode::SUCCESS
}
