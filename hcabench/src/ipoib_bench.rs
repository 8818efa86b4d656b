//! `hcabench bench ipoib`: what a user gets from IP over the emulated InfiniBand fabric.
//! Two guests run Debian's IPoIB on hcab0, first in datagram mode, then in connected mode
//! (RC connections through ib_cm, MTU 65520); under QEMU the same two guests also have a
//! virtio-net link, the network a user would have without hcabench. For each: ping round
//! trips and a TCP transfer (busybox httpd to wget) whose bytes are checked, side by side,
//! with ratios against virtio-net.

use std::time::Duration;

use cluster::verbs::Testbed;
use cluster::Backend;

use crate::bench::{elapsed, random_blob, timed, VerbsBench};
use crate::session::{BenchError, Shape};

const T: Duration = Duration::from_secs(600);
const PORT: u16 = 8080;

/// One transport's figures.
struct Row {
    name: &'static str,
    ping_avg_us: f64,
    /// Pings answered of those sent.
    ping_received: u64,
    pings: u64,
    tcp_mb_s: f64,
}

/// How many pings busybox ping says were answered (`N packets received`).
fn received(out: &str) -> Option<u64> {
    let line = out.lines().find(|l| l.contains("packets received"))?;
    let before = line.split(" packets received").next()?;
    before.rsplit(' ').next()?.parse().ok()
}

/// The average of busybox ping's summary (`round-trip min/avg/max = a/b/c ms`), in us.
fn ping_avg_us(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains("min/avg/max"))?;
    let nums = line.split('=').nth(1)?.trim().trim_end_matches("ms").trim();
    let avg: f64 = nums.split('/').nth(1)?.parse().ok()?;
    Some(avg * 1e3)
}

fn measure(
    tb: &mut Testbed,
    name: &'static str,
    server_ip: &str,
    pings: u64,
    sum: &str,
    bytes: u64,
) -> Result<Row, BenchError> {
    // Warm-up: the neighbour's address, its path from the SA and, in connected mode, the RC
    // connection are set up by the first packets, which IPoIB may drop while it waits.
    tb.agents[0].run(&format!("ping -q -c 3 -W 5 {server_ip} > /dev/null"), T)?;
    let out = tb.agents[0].run(&format!("ping -q -c {pings} -i 0.01 -W 5 {server_ip}"), T)?;
    // A lost ping is a figure (printed), not a failure; no answer at all is.
    let received = received(&out).unwrap_or(0);
    if received == 0 {
        return Err(BenchError::NoPing {
            name: name.to_string(),
            output: out,
        });
    }
    let ping_avg_us = ping_avg_us(&out).ok_or_else(|| BenchError::NoPingSummary {
        name: name.to_string(),
        output: out.clone(),
    })?;
    let fetch = format!(
        "rm -f /tmp/got; wget -q -O /tmp/got http://{server_ip}:{PORT}/blob && md5sum /tmp/got"
    );
    let out = tb.agents[0].run(&timed(&fetch), T)?;
    if !out.contains(sum) {
        return Err(BenchError::Changed {
            name: name.to_string(),
            what: "the TCP transfer arrived",
            output: out,
        });
    }
    let secs = elapsed(&out).ok_or_else(|| BenchError::NoTiming {
        name: name.to_string(),
        output: out.clone(),
    })?;
    let row = Row {
        name,
        ping_avg_us,
        ping_received: received,
        pings,
        tcp_mb_s: bytes as f64 / 1e6 / secs.max(0.01),
    };
    println!(
        "  {name:<22} ping {:>9.1} us   TCP {:>8.1} MB/s",
        row.ping_avg_us, row.tcp_mb_s
    );
    Ok(row)
}

pub fn run(b: &VerbsBench, backend: Backend) -> Result<(), BenchError> {
    println!(
        "booting 2 {} guests with the hcabench HCA and a virtio-net NIC",
        backend.describe()
    );
    let shape = Shape {
        what: "bench-ipoib",
        nodes: 2,
        link: true,
    };
    let mut s = crate::bench::boot(b, backend, shape)?;
    let tb = &mut s.tb;
    tb.ipoib_up()?;
    // eth0 at 10.77.0.k, as SoftRoCE's bench uses it.
    tb.rxe_up()?;
    s.start_fabric_tools()?;
    let tb = &mut s.tb;
    let mib = (b.bw_bytes >> 20).max(1);
    let bytes = mib << 20;
    let sum = random_blob(tb, 1, mib)?;
    tb.agents[1].run(&format!("httpd -p {PORT} -h /tmp"), T)?;
    let pings = b.iters.clamp(1, 1000);
    println!("{pings} pings and {mib} MiB over TCP per transport");
    let mut rows = vec![measure(
        tb,
        "eth0 (virtio-net)",
        "10.77.0.2",
        pings,
        &sum,
        bytes,
    )?];
    rows.push(measure(
        tb,
        "ib0 datagram",
        "10.78.0.2",
        pings,
        &sum,
        bytes,
    )?);
    for a in tb.agents.iter_mut() {
        a.run(
            "echo connected > /sys/class/net/ib0/mode && ip link set ib0 mtu 65520",
            T,
        )?;
    }
    rows.push(measure(
        tb,
        "ib0 connected",
        "10.78.0.2",
        pings,
        &sum,
        bytes,
    )?);
    print_table(&rows);
    s.print_fault_report();
    Ok(())
}

/// rows[0] is eth0's, the baseline of the ratios.
fn print_table(rows: &[Row]) {
    println!();
    println!("IP between two guests: ping round trip (mean) and TCP throughput (one wget)");
    println!(
        "{:<22} {:>14} {:>10} {:>12} {:>16} {:>14}",
        "transport", "ping us", "answered", "TCP MB/s", "ping vs eth0", "TCP vs eth0"
    );
    let e = &rows[0];
    for r in rows {
        let p = r.ping_avg_us / e.ping_avg_us.max(1e-3);
        let t = r.tcp_mb_s / e.tcp_mb_s.max(1e-3);
        println!(
            "{:<22} {:>14.1} {:>10} {:>12.1} {:>16.2} {:>14.2}",
            r.name,
            r.ping_avg_us,
            format!("{}/{}", r.ping_received, r.pings),
            r.tcp_mb_s,
            p,
            t
        );
    }
    println!("(ping ratio below 1 and TCP ratio above 1: IPoIB on hcab0 is the faster)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_busybox_ping_summary_is_read() {
        let out = "--- 10.78.0.2 ping statistics ---\n3 packets transmitted, 3 packets \
                   received, 0% packet loss\nround-trip min/avg/max = 2.899/10.521/24.449 ms\n";
        assert_eq!(ping_avg_us(out), Some(10_521.0));
        assert_eq!(ping_avg_us("no summary"), None);
        assert_eq!(received(out), Some(3));
        assert_eq!(
            received("20 packets transmitted, 17 packets received, 15% loss"),
            Some(17)
        );
    }
}
