//! `hcabench bench perftest`: user-level verbs as users measure them. Debian's perftest
//! (ib_send_lat, ib_write_lat, ib_read_lat, ib_write_bw, ib_read_bw, ib_atomic_bw) between
//! two guests, over hcab0 through libhcab (kernel bypass) and over SoftRoCE (rxe0, through
//! Debian's librxe) in the same run, with ratios; and beside them the kernel's own RC round
//! trip with polled completions (`bench verbs`' poll row) on the same guests, which a
//! user-level round trip should match when posting and polling make no system call.

use std::time::Duration;

use cluster::verbs::{Mode, Testbed};
use cluster::Backend;

use crate::bench::VerbsBench;
use crate::session::{BenchError, Shape};

const T: Duration = Duration::from_secs(600);

/// One perftest run: the tool, its message size and its iterations.
#[derive(Clone, Copy)]
struct Test {
    tool: &'static str,
    size: u32,
    iters: u64,
}

impl Test {
    fn is_latency(self) -> bool {
        self.tool.ends_with("_lat")
    }
}

/// What a run gave: latency (t_avg, us; for ib_send_lat half a round trip) or bandwidth
/// (BW average, MB/s).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Figure(f64);

/// perftest's result row for `size`: the line whose first field is the size and that has at
/// least five numeric fields. Latency rows are `#bytes #iterations t_min t_max t_typical
/// t_avg ...` (t_avg: field 5); bandwidth rows `#bytes #iterations BW_peak BW_average
/// MsgRate` (BW average: field 3).
fn parse(out: &str, t: Test) -> Option<Figure> {
    let col = if t.is_latency() { 5 } else { 3 };
    out.lines().find_map(|l| {
        let f: Vec<f64> = l.split_whitespace().map_while(|w| w.parse().ok()).collect();
        (f.len() >= 5 && f[0] == f64::from(t.size))
            .then(|| f.get(col).copied().map(Figure))
            .flatten()
    })
}

/// perftest's command line for `dev` (the GID index SoftRoCE needs for its IPv4 GID).
fn command(t: Test, dev: &str, gid: Option<u32>) -> String {
    let mut c = format!("{} -d {dev} -i 1 -s {} -n {}", t.tool, t.size, t.iters);
    if let Some(g) = gid {
        c.push_str(&format!(" -x {g}"));
    }
    if t.tool == "ib_atomic_bw" {
        // Atomics are 8 bytes whatever -s says; perftest refuses another size.
        c = format!("{} -d {dev} -i 1 -n {}", t.tool, t.iters);
        if let Some(g) = gid {
            c.push_str(&format!(" -x {g}"));
        }
    }
    c
}

/// Runs `t` with guest 1 serving and guest 0 connecting to `server_ip` (perftest meets
/// over TCP port 18515 to trade QP numbers, then runs on `dev`).
fn run_one(
    tb: &mut Testbed,
    t: Test,
    dev: &str,
    gid: Option<u32>,
    server_ip: &str,
) -> Result<Figure, BenchError> {
    let cmd = command(t, dev, gid);
    let size = if t.tool == "ib_atomic_bw" { 8 } else { t.size };
    // perftest times with the TSC and gives up when the TSC and the wall clock do not keep
    // step (a vCPU under TCG on a loaded host): that run says nothing, and is run again.
    let mut attempt = 0;
    loop {
        attempt += 1;
        tb.agents[1].run(&format!("{cmd} > /tmp/perftest.log 2>&1 &"), T)?;
        // The server needs a moment to listen; the client does not retry.
        let out = tb.agents[0].run(&format!("sleep 1; {cmd} {server_ip} 2>&1"), T)?;
        let server = tb.agents[1].run("sleep 0.5; cat /tmp/perftest.log", T)?;
        if let Some(f) = parse(&out, Test { size, ..t }) {
            return Ok(f);
        }
        let clock = "Correlation coefficient r^2";
        if attempt == 3 || !(out.contains(clock) || server.contains(clock)) {
            return Err(BenchError::NoRow {
                dev: dev.to_string(),
                cmd: format!("{cmd} {server_ip}"),
                output: out,
                server,
            });
        }
        println!(
            "  ({dev}: {}: perftest's clock calibration failed; again)",
            t.tool
        );
    }
}

/// The rows: (test, hcab0, rxe0).
type Rows = Vec<(Test, Figure, Figure)>;

pub fn run(b: &VerbsBench, backend: Backend) -> Result<(), BenchError> {
    println!(
        "booting 2 {} guests with the hcabench HCA and a virtio-net NIC (SoftRoCE's)",
        backend.describe()
    );
    let shape = Shape {
        what: "bench-perftest",
        nodes: 2,
        link: true,
    };
    let mut s = crate::bench::boot(b, backend, shape)?;
    let tb = &mut s.tb;
    tb.ipoib_up()?;
    tb.rxe_up()?;
    s.start_fabric_tools()?;
    let tb = &mut s.tb;
    let lat = b.iters.clamp(10, 100_000);
    let bw = (b.bw_bytes / 65536).clamp(10, 100_000);
    let tests = [
        Test {
            tool: "ib_send_lat",
            size: 8,
            iters: lat,
        },
        Test {
            tool: "ib_write_lat",
            size: 8,
            iters: lat,
        },
        Test {
            tool: "ib_read_lat",
            size: 8,
            iters: lat,
        },
        Test {
            tool: "ib_write_bw",
            size: 65536,
            iters: bw,
        },
        Test {
            tool: "ib_read_bw",
            size: 65536,
            iters: bw,
        },
        Test {
            tool: "ib_atomic_bw",
            size: 8,
            iters: lat,
        },
    ];
    let mut rows: Rows = Vec::new();
    for t in tests {
        let h = run_one(tb, t, "hcab0", None, "10.78.0.2")?;
        // rxe0's GID 1 is eth0's IPv4 address (RoCEv2); the peer meets over eth0.
        let r = run_one(tb, t, "rxe0", Some(1), "10.77.0.2")?;
        println!(
            "  {:<13} {:>6} B  hcab0 {:>10.2}  rxe0 {:>10.2}",
            t.tool, t.size, h.0, r.0
        );
        rows.push((t, h, r));
    }
    // The kernel's round trip on the same guests: vbench, both sides polling.
    tb.connect("hcab0")?;
    let k = tb.ping(Mode::Poll, 8, lat, true)?;
    if k.errors + k.server_errors > 0 || k.done != lat {
        return Err(BenchError::KernelPing {
            done: k.done,
            iters: lat,
            errors: k.errors + k.server_errors,
        });
    }
    print_table(&rows, k.rtt_avg_ns as f64 / 1e3);
    s.print_fault_report();
    Ok(())
}

fn print_table(rows: &Rows, kernel_rtt_us: f64) {
    println!();
    println!(
        "perftest between two guests: latency t_avg in us (ib_send_lat: half a round trip), \
         bandwidth in MB/s (10^6 bytes/s)"
    );
    println!(
        "{:<14} {:>8} {:>12} {:>12} {:>16}",
        "test", "bytes", "hcab0", "rxe0", "hcab0 vs rxe0"
    );
    for (t, h, r) in rows {
        let (rx, ratio) = if r.0 > 0.0 {
            let ratio = if t.is_latency() {
                format!("{:.3}x latency", h.0 / r.0)
            } else {
                format!("{:.1}x bandwidth", h.0 / r.0)
            };
            (format!("{:.2}", r.0), ratio)
        } else {
            ("-".into(), "-".into())
        };
        println!(
            "{:<14} {:>8} {:>12.2} {:>12} {:>16}",
            t.tool, t.size, h.0, rx, ratio
        );
    }
    if let Some((_, h, _)) = rows.iter().find(|(t, _, _)| t.tool == "ib_send_lat") {
        let user_rtt = 2.0 * h.0;
        println!();
        println!(
            "round trip, 8 bytes, polled: user level (ib_send_lat x2) {user_rtt:.2} us, \
             kernel (vbench poll) {kernel_rtt_us:.2} us: {:.2}x",
            user_rtt / kernel_rtt_us.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: &str = "\
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 8       1000          10.21          95.33        11.02                12.50             3.10            30.00                   95.33  
---------------------------------------------------------------------------------------
";
    const BW: &str = "\
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      1000             812.34             790.12               0.012056
";

    #[test]
    fn test_parses_latency_and_bandwidth_rows() {
        let lat = Test {
            tool: "ib_send_lat",
            size: 8,
            iters: 1000,
        };
        assert_eq!(parse(LAT, lat), Some(Figure(12.5)));
        let bw = Test {
            tool: "ib_write_bw",
            size: 65536,
            iters: 1000,
        };
        assert_eq!(parse(BW, bw), Some(Figure(790.12)));
        assert_eq!(parse(BW, Test { size: 4096, ..bw }), None, "another size");
        assert_eq!(parse("Couldn't connect to 10.78.0.2:18515", lat), None);
    }

    #[test]
    fn test_command_names_device_size_and_gid() {
        let t = Test {
            tool: "ib_write_bw",
            size: 65536,
            iters: 100,
        };
        assert_eq!(
            command(t, "rxe0", Some(1)),
            "ib_write_bw -d rxe0 -i 1 -s 65536 -n 100 -x 1"
        );
        let a = Test {
            tool: "ib_atomic_bw",
            ..t
        };
        assert_eq!(
            command(a, "hcab0", None),
            "ib_atomic_bw -d hcab0 -i 1 -n 100"
        );
    }
}
