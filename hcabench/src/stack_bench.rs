//! `hcabench bench stack`: the Linux cluster study's comparison of communication layers on
//! one pair of guests in one run: a one-byte ping-pong (mean and median round trip) and
//! bandwidth by message size for kernel verbs, user-level verbs, TCP on ib0 (IPoIB in
//! datagram and in connected mode), TIPC over ib0, RDS, TCP on the guests' virtio-net link
//! and, with `--mpi`, MPI over UCX on hcab0 and over TCP on ib0 (NetPIPE), each with its
//! ratio to kernel verbs. Every figure is measured in the run, by a tool that checks the
//! data where it can; a layer that fails stops the bench with what its guests said.

use std::time::Duration;

use cluster::mpi::{self, Job, Mpi};
use cluster::verbs::{Mode, Testbed};
use cluster::Backend;

use crate::config::ClusterConfig;
use crate::error::UsageError;
use crate::session::{BenchError, Session, Shape};

const T: Duration = Duration::from_secs(600);
/// The port rds-echo's server binds on node 2's ib0 address.
const RDS_PORT: u16 = 18634;
/// The TIPC instance node 2's `tipc-echo serve` binds (its services are {18888..18890, 2}).
const TIPC_INSTANCE: u32 = 2;
/// RDS messages in flight in the bandwidth cells.
const RDS_WINDOW: u64 = 8;
/// Node 2's addresses: IPoIB (ib0) and virtio-net (eth0).
const IB0: &str = "10.78.0.2";
const ETH0: &str = "10.77.0.2";

/// What `bench stack` measures, and on what guests.
#[derive(Clone, Debug)]
pub struct StackBench {
    pub cfg: ClusterConfig,
    pub boot_timeout: Duration,
    pub keep: bool,
    /// Round trips per latency cell.
    pub rounds: u64,
    /// Message sizes of the bandwidth table, in bytes.
    pub sizes: Vec<u32>,
    /// Bytes per bandwidth cell (at least 10 messages of each size).
    pub bw_bytes: u64,
    /// MPI's rows too (NetPIPE under MPICH; needs its packages on the guests' disk).
    pub mpi: bool,
}

impl StackBench {
    /// Messages of `size` per bandwidth cell.
    pub fn count(&self, size: u32) -> u64 {
        (self.bw_bytes / u64::from(size.max(1))).max(10)
    }
}

/// Refuses what the bench cannot measure, before anything boots.
pub fn check(b: &StackBench) -> Result<(), UsageError> {
    if !(10..=100_000).contains(&b.rounds) {
        return Err(UsageError::OutOfRange {
            what: "--rounds",
            value: b.rounds,
            range: "10..=100000",
        });
    }
    if b.sizes.is_empty() {
        return Err(UsageError::Empty("--sizes"));
    }
    if let Some(&s) = b.sizes.iter().find(|&&s| s == 0 || s > 1 << 20) {
        return Err(UsageError::OutOfRange {
            what: "bandwidth size",
            value: s.into(),
            range: "1..=1048576",
        });
    }
    if !(1..=256 << 20).contains(&b.bw_bytes) {
        return Err(UsageError::OutOfRange {
            what: "--bw-bytes",
            value: b.bw_bytes,
            range: "1..=268435456",
        });
    }
    Ok(())
}

/// The cluster `--mpi` needs: MPICH and NetPIPE on the guests' userland disk (built now,
/// with progress, if it is not yet), and 512 MiB per guest or more, as UCX and MPICH want.
pub fn with_mpi(cfg: &mut ClusterConfig) -> Result<(), cluster::ImageError> {
    for p in MPI_PACKAGES {
        if !cfg.packages.iter().any(|q| q == p) {
            cfg.packages.push(p.to_string());
        }
    }
    cfg.memory_mib = cfg.memory_mib.max(512);
    for m in cfg.node_memory_mib.values_mut() {
        *m = (*m).max(512);
    }
    cfg.build_image().map(|_| ())
}

/// Debian's packages `--mpi` puts on the guests.
pub const MPI_PACKAGES: [&str; 2] = ["mpich", "netpipe-mpich2"];

/// The layers, in the tables' order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    KernelVerbs,
    UserVerbs,
    MpiUcx,
    MpiTcp,
    TcpDatagram,
    TcpConnected,
    TipcRdm,
    TipcStream,
    Rds,
    TcpEth,
}

impl Layer {
    pub const ALL: [Layer; 10] = [
        Layer::KernelVerbs,
        Layer::UserVerbs,
        Layer::MpiUcx,
        Layer::MpiTcp,
        Layer::TcpDatagram,
        Layer::TcpConnected,
        Layer::TipcRdm,
        Layer::TipcStream,
        Layer::Rds,
        Layer::TcpEth,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layer::KernelVerbs => "kernel verbs",
            Layer::UserVerbs => "user verbs",
            Layer::MpiUcx => "MPI / UCX",
            Layer::MpiTcp => "MPI / TCP ib0",
            Layer::TcpDatagram => "TCP ib0 datagram",
            Layer::TcpConnected => "TCP ib0 connected",
            Layer::TipcRdm => "TIPC RDM",
            Layer::TipcStream => "TIPC stream",
            Layer::Rds => "RDS",
            Layer::TcpEth => "TCP virtio-net",
        }
    }

    /// How its ping-pong is measured (the latency table's legend).
    pub fn latency_how(self) -> &'static str {
        match self {
            Layer::KernelVerbs => {
                "vbench RC SEND, 8 B (its smallest), both sides polling, data checked"
            }
            Layer::UserVerbs => {
                "perftest ib_send_lat -s 1 on hcab0 (libhcab); 2 x t_avg, 2 x t_typical"
            }
            Layer::MpiUcx => {
                "NetPIPE (NPmpich2), 1 B, MPICH over UCX on hcab0; 2 x its time (mean only)"
            }
            Layer::MpiTcp => "NetPIPE, 1 B, MPICH over UCX's tcp transport on ib0 (datagram mode)",
            Layer::TcpDatagram => {
                "tipc-echo lat tcp: 1 B over TCP (TCP_NODELAY), IPoIB datagram mode"
            }
            Layer::TcpConnected => "the same, IPoIB connected mode (RC, MTU 65520)",
            Layer::TipcRdm => {
                "tipc-echo lat rdm: 1 B over a TIPC reliable-datagram socket, bearer ib0"
            }
            Layer::TipcStream => "tipc-echo lat stream: 1 B over a TIPC stream socket",
            Layer::Rds => {
                "rds-echo lat: 1 B RDS message (rds_rdma, RC through rdma_cm), echo checked"
            }
            Layer::TcpEth => "tipc-echo lat tcp over the guests' virtio-net link (eth0)",
        }
    }

    /// How its bandwidth is measured (the bandwidth table's legend), if it is.
    pub fn bandwidth_how(self) -> Option<&'static str> {
        Some(match self {
            Layer::KernelVerbs => "vbench RDMA WRITE, 16 in flight, polled; bytes checked after",
            Layer::UserVerbs => "perftest ib_write_bw -s SIZE on hcab0: BW average",
            Layer::MpiUcx => "NetPIPE's bandwidth at SIZE (MPICH over UCX on hcab0)",
            Layer::MpiTcp => "NetPIPE's bandwidth at SIZE (UCX tcp on ib0)",
            Layer::TcpDatagram => {
                "tipc-echo bw tcp: writes of SIZE to a sink that checks every byte; IPoIB datagram"
            }
            Layer::TcpConnected => "the same, IPoIB connected mode",
            Layer::TipcRdm => return None,
            Layer::TipcStream => "tipc-echo bw stream: the same over a TIPC stream socket",
            Layer::Rds => {
                "rds-echo ping, 8 messages of SIZE in flight, each echoed back and checked: \
                 one direction's payload rate"
            }
            Layer::TcpEth => "tipc-echo bw tcp over virtio-net (eth0)",
        })
    }
}

/// A one-byte ping-pong's round trip, in microseconds (median: None where the tool gives
/// only a mean).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    pub mean_us: f64,
    pub median_us: Option<f64>,
}

/// One layer's figures: its latency and its bandwidth per size (MB/s, 10^6 bytes/s), in
/// the bench's size order.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub layer: Layer,
    pub latency: Latency,
    pub bandwidth: Vec<Option<f64>>,
}

/// `x / base`, where both are measured and the base is not zero.
pub fn ratio(x: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (x, base) {
        (Some(x), Some(b)) if b > 0.0 && x.is_finite() && b.is_finite() => Some(x / b),
        _ => None,
    }
}

/// A size as people write it: 1 KiB, 64 KiB, 1 MiB, 100 B.
pub fn size_name(size: u32) -> String {
    if size >= 1 << 20 && size % (1 << 20) == 0 {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size % (1 << 10) == 0 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.decimals$}"))
}

/// The latency table: a row per layer, ratios of mean and median to kernel verbs'.
pub fn latency_table(rows: &[Row], rounds: u64) -> String {
    let base = rows.iter().find(|r| r.layer == Layer::KernelVerbs);
    let mut s = format!(
        "one-byte ping-pong, round trip in us, {rounds} round trips per layer (after a \
         warm-up); ratio: this layer's / kernel verbs' (above 1: slower)\n"
    );
    s += &format!(
        "{:<18} {:>10} {:>10} {:>12} {:>12}\n",
        "layer", "mean", "median", "ratio mean", "ratio median"
    );
    for r in rows {
        let mean = ratio(Some(r.latency.mean_us), base.map(|b| b.latency.mean_us));
        let median = ratio(r.latency.median_us, base.and_then(|b| b.latency.median_us));
        s += &format!(
            "{:<18} {:>10.1} {:>10} {:>12} {:>12}\n",
            r.layer.name(),
            r.latency.mean_us,
            cell(r.latency.median_us, 1),
            cell(mean, 2),
            cell(median, 2)
        );
    }
    s
}

/// The bandwidth table: a row per layer that has one, MB/s at each size, and each size's
/// ratio to kernel verbs'.
pub fn bandwidth_table(rows: &[Row], sizes: &[u32]) -> String {
    let base = rows.iter().find(|r| r.layer == Layer::KernelVerbs);
    let mut s = "bandwidth by message size, MB/s (10^6 bytes/s), and in brackets the ratio \
                 to kernel verbs' (below 1: slower)\n"
        .to_string();
    s += &format!("{:<18}", "layer");
    for &size in sizes {
        s += &format!(" {:>18}", size_name(size));
    }
    s += "\n";
    for r in rows.iter().filter(|r| r.layer.bandwidth_how().is_some()) {
        s += &format!("{:<18}", r.layer.name());
        for (i, v) in r.bandwidth.iter().enumerate() {
            let b = base.and_then(|b| b.bandwidth.get(i).copied().flatten());
            let c = match (v, ratio(*v, b)) {
                (Some(v), Some(q)) => format!("{v:.1} ({q:.2})"),
                (Some(v), None) => format!("{v:.1}"),
                (None, _) => "-".to_string(),
            };
            s += &format!(" {c:>18}");
        }
        s += "\n";
    }
    s
}

/// The legend: what each row measured.
pub fn legend(rows: &[Row]) -> String {
    let mut s = "what each row measures:\n".to_string();
    for r in rows {
        s += &format!(
            "  {:<18} latency: {}\n",
            r.layer.name(),
            r.layer.latency_how()
        );
        if let Some(b) = r.layer.bandwidth_how() {
            s += &format!("  {:<18} bandwidth: {b}\n", "");
        }
    }
    s
}

/// `key=value` of a `LAT `/`BW ` line (tipc-echo's and rds-echo's), as a number.
fn field(out: &str, prefix: &str, key: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.starts_with(prefix))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?
        .parse()
        .ok()
}

/// The round trip a `LAT ` line gives.
pub fn parse_lat(out: &str) -> Option<Latency> {
    Some(Latency {
        mean_us: field(out, "LAT ", "rtt_mean_us")?,
        median_us: Some(field(out, "LAT ", "rtt_median_us")?),
    })
}

/// The MB/s of a `BW ` line, if it says every byte was checked.
pub fn parse_bw(out: &str) -> Option<f64> {
    (field(out, "BW ", "checked")? == 1.0).then_some(())?;
    field(out, "BW ", "mb_s")
}

/// perftest's result row for `size`: (field 3, field 4, field 5) of the row whose first
/// field is the size and that has five or more numbers. Latency rows: `#bytes #iterations
/// t_min t_max t_typical t_avg ...`; bandwidth rows: `#bytes #iterations BW_peak
/// BW_average MsgRate`.
fn perftest_row(out: &str, size: u32) -> Option<Vec<f64>> {
    out.lines().find_map(|l| {
        let f: Vec<f64> = l.split_whitespace().map_while(|w| w.parse().ok()).collect();
        (f.len() >= 5 && f[0] == f64::from(size)).then_some(f)
    })
}

/// ib_send_lat's row: its t_avg and t_typical are half a round trip.
pub fn parse_send_lat(out: &str, size: u32) -> Option<Latency> {
    let f = perftest_row(out, size)?;
    Some(Latency {
        mean_us: 2.0 * *f.get(5)?,
        median_us: Some(2.0 * *f.get(4)?),
    })
}

/// ib_write_bw's BW average.
pub fn parse_write_bw(out: &str, size: u32) -> Option<f64> {
    perftest_row(out, size)?.get(3).copied()
}

/// rds-echo ping's `N x LEN bytes verified, window W, U us per message`: LEN / U, in MB/s.
pub fn parse_rds_bw(out: &str, size: u32) -> Option<f64> {
    let line = out
        .lines()
        .find(|l| l.contains(&format!(" x {size} bytes verified")))?;
    let us: f64 = line
        .split(", ")
        .find_map(|p| p.strip_suffix(" us per message"))?
        .trim()
        .parse()
        .ok()?;
    (us > 0.0).then(|| f64::from(size) / us)
}

/// NetPIPE's output file: `bytes Mbps seconds` per line, seconds being half a round trip
/// (NetPIPE's own mean over its repetitions). (half round trip in us, MB/s) at `size`.
pub fn parse_netpipe(out: &str, size: u32) -> Option<(f64, f64)> {
    out.lines().find_map(|l| {
        let f: Vec<f64> = l
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        (f.len() >= 3 && f[0] == f64::from(size)).then(|| (f[2] * 1e6, f[1] / 8.0))
    })
}

/// A layer that gave no figure: its command, what it printed and what the server logged.
fn failed(layer: Layer, cmd: &str, output: String, server: String) -> BenchError {
    BenchError::NoRow {
        dev: layer.name().to_string(),
        cmd: cmd.to_string(),
        output,
        server,
    }
}

/// Runs `cmd` on node 1; when it fails, the error carries node 2's `log` (a server's).
fn client(tb: &mut Testbed, layer: Layer, cmd: &str, log: &str) -> Result<String, BenchError> {
    match tb.agents[0].status(cmd, T)? {
        (0, out) => Ok(out),
        (status, out) => {
            let server = server_log(tb, log);
            Err(failed(
                layer,
                cmd,
                format!("(exit {status}) {}", out.trim_end()),
                server,
            ))
        }
    }
}

fn server_log(tb: &mut Testbed, log: &str) -> String {
    if log.is_empty() {
        return String::new();
    }
    tb.agents[1]
        .run(&format!("cat {log}; dmesg | tail -5"), T)
        .unwrap_or_else(|e| format!("(node2 did not answer: {e})"))
}

fn say_latency(layer: Layer, l: &Latency) {
    println!(
        "  {:<18} round trip  mean {:>9.1} us  median {:>9} us",
        layer.name(),
        l.mean_us,
        cell(l.median_us, 1)
    );
}

fn say_bandwidth(layer: Layer, size: u32, mb_s: f64) {
    println!(
        "  {:<18} {:>8}  {:>10.1} MB/s",
        layer.name(),
        size_name(size),
        mb_s
    );
}

/// Kernel verbs: vbench over hcab0 (RC, polled, data checked).
fn kernel_verbs(tb: &mut Testbed, b: &StackBench) -> Result<Row, BenchError> {
    let layer = Layer::KernelVerbs;
    tb.connect("hcab0")?;
    let p = tb.ping(Mode::Poll, 8, b.rounds, true)?;
    if p.done != b.rounds || p.errors + p.server_errors > 0 {
        return Err(BenchError::KernelPing {
            done: p.done,
            iters: b.rounds,
            errors: p.errors + p.server_errors,
        });
    }
    let latency = Latency {
        mean_us: p.rtt_avg_ns as f64 / 1e3,
        median_us: Some(p.rtt_median_ns as f64 / 1e3),
    };
    say_latency(layer, &latency);
    let mut bandwidth = Vec::new();
    for &size in &b.sizes {
        let r = tb.bw(false, size, b.count(size))?;
        if r.errors > 0 {
            return Err(BenchError::DataErrors(r.errors));
        }
        say_bandwidth(layer, size, r.mb_per_s);
        bandwidth.push(Some(r.mb_per_s));
    }
    Ok(Row {
        layer,
        latency,
        bandwidth,
    })
}

/// One perftest run, node 2 serving and node 1 connecting over ib0: its output. perftest
/// gives up when its TSC calibration fails (a vCPU under TCG on a loaded host): that run is
/// run again, twice at most.
fn perftest(tb: &mut Testbed, layer: Layer, cmd: &str) -> Result<String, BenchError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        tb.agents[1].run(&format!("{cmd} > /tmp/perftest.log 2>&1 &"), T)?;
        // The server needs a moment to listen; the client does not retry.
        let (status, out) = tb.agents[0].status(&format!("sleep 1; {cmd} {IB0} 2>&1"), T)?;
        let server = tb.agents[1].run("sleep 0.5; cat /tmp/perftest.log", T)?;
        if status == 0 {
            return Ok(out);
        }
        let clock = "Correlation coefficient r^2";
        if attempt == 3 || !(out.contains(clock) || server.contains(clock)) {
            return Err(failed(layer, cmd, out, server));
        }
        println!("  ({cmd}: perftest's clock calibration failed; again)");
    }
}

/// User-level verbs: Debian's perftest over hcab0 through libhcab.
fn user_verbs(tb: &mut Testbed, b: &StackBench) -> Result<Row, BenchError> {
    let layer = Layer::UserVerbs;
    let cmd = format!("ib_send_lat -d hcab0 -i 1 -s 1 -n {}", b.rounds.max(10));
    let out = perftest(tb, layer, &cmd)?;
    let latency = parse_send_lat(&out, 1).ok_or_else(|| failed(layer, &cmd, out, String::new()))?;
    say_latency(layer, &latency);
    let mut bandwidth = Vec::new();
    for &size in &b.sizes {
        let cmd = format!("ib_write_bw -d hcab0 -i 1 -s {size} -n {}", b.count(size));
        let out = perftest(tb, layer, &cmd)?;
        let bw =
            parse_write_bw(&out, size).ok_or_else(|| failed(layer, &cmd, out, String::new()))?;
        say_bandwidth(layer, size, bw);
        bandwidth.push(Some(bw));
    }
    Ok(Row {
        layer,
        latency,
        bandwidth,
    })
}

/// A `tipc-echo lat MODE TARGET` / `tipc-echo bw MODE TARGET` layer against node 2's
/// `tipc-echo serve` (TCP to `target`'s address, or TIPC to its instance).
fn tipc_echo(
    tb: &mut Testbed,
    b: &StackBench,
    layer: Layer,
    mode: &str,
    target: &str,
) -> Result<Row, BenchError> {
    let log = "/tmp/tipc-serve.log";
    let cmd = format!("tipc-echo lat {mode} {target} {}", b.rounds);
    let out = client(tb, layer, &cmd, log)?;
    let latency = parse_lat(&out).ok_or_else(|| failed(layer, &cmd, out, String::new()))?;
    say_latency(layer, &latency);
    let mut bandwidth = Vec::new();
    if layer.bandwidth_how().is_some() {
        for &size in &b.sizes {
            let bytes = b.count(size) * u64::from(size);
            let cmd = format!("tipc-echo bw {mode} {target} {size} {bytes}");
            let out = client(tb, layer, &cmd, log)?;
            let bw = parse_bw(&out).ok_or_else(|| failed(layer, &cmd, out, String::new()))?;
            say_bandwidth(layer, size, bw);
            bandwidth.push(Some(bw));
        }
    } else {
        bandwidth.resize(b.sizes.len(), None);
    }
    Ok(Row {
        layer,
        latency,
        bandwidth,
    })
}

/// RDS over hcab0 (rds_rdma), node 1 to node 2's rds-echo server.
fn rds(tb: &mut Testbed, b: &StackBench) -> Result<Row, BenchError> {
    let layer = Layer::Rds;
    let log = "/tmp/rds-serve.log";
    let ends = format!("10.78.0.1 {IB0} {RDS_PORT}");
    let cmd = format!("rds-echo lat {ends} {}", b.rounds);
    let out = client(tb, layer, &cmd, log)?;
    let latency = parse_lat(&out).ok_or_else(|| failed(layer, &cmd, out, String::new()))?;
    say_latency(layer, &latency);
    let mut bandwidth = Vec::new();
    for &size in &b.sizes {
        let count = b.count(size);
        let cmd = format!(
            "rds-echo ping {ends} {count} {} {size}",
            RDS_WINDOW.min(count)
        );
        let out = client(tb, layer, &cmd, log)?;
        let bw = parse_rds_bw(&out, size).ok_or_else(|| failed(layer, &cmd, out, String::new()))?;
        say_bandwidth(layer, size, bw);
        bandwidth.push(Some(bw));
    }
    Ok(Row {
        layer,
        latency,
        bandwidth,
    })
}

/// Runs NetPIPE (NPmpich2) between the two guests under MPICH with `env`; its output file.
fn netpipe(
    tb: &mut Testbed,
    layer: Layer,
    args: &str,
    env: &[(&str, &str)],
) -> Result<String, BenchError> {
    let program: Vec<String> = format!("NPmpich2 {args} -o /tmp/np.out")
        .split_whitespace()
        .map(String::from)
        .collect();
    let job = Job {
        mpi: Mpi::Mpich,
        ranks: 2,
        program: program.clone(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        secs: 120,
    };
    let mut said = Vec::new();
    let cmd = program.join(" ");
    let outcome = mpi::run(&mut tb.agents, &job, &mut |l| said.push(l.to_string()))
        .map_err(|e| failed(layer, &cmd, e.to_string(), said.join("\n")))?;
    if outcome.status != Some(0) {
        let said = said.join("\n");
        return Err(failed(
            layer,
            &cmd,
            format!("(status {:?})", outcome.status),
            said,
        ));
    }
    Ok(tb.agents[0].run("cat /tmp/np.out", T)?)
}

/// MPI over UCX on hcab0, or over UCX's TCP on ib0: NetPIPE's 1-byte time and its
/// bandwidth at each size (one NetPIPE run per size, no perturbation).
fn mpi_layer(tb: &mut Testbed, b: &StackBench, layer: Layer) -> Result<Row, BenchError> {
    let env: &[(&str, &str)] = if layer == Layer::MpiTcp {
        &[("UCX_TLS", "tcp,self"), ("UCX_NET_DEVICES", "ib0")]
    } else {
        &[]
    };
    let out = netpipe(tb, layer, "-l 1 -u 1 -p 0", env)?;
    let (half, _) = parse_netpipe(&out, 1)
        .ok_or_else(|| failed(layer, "NPmpich2 -l 1 -u 1", out, String::new()))?;
    let latency = Latency {
        mean_us: 2.0 * half,
        median_us: None,
    };
    say_latency(layer, &latency);
    let mut bandwidth = Vec::new();
    for &size in &b.sizes {
        let args = format!("-l {size} -u {size} -p 0");
        let out = netpipe(tb, layer, &args, env)?;
        let (_, bw) = parse_netpipe(&out, size)
            .ok_or_else(|| failed(layer, &format!("NPmpich2 {args}"), out, String::new()))?;
        say_bandwidth(layer, size, bw);
        bandwidth.push(Some(bw));
    }
    Ok(Row {
        layer,
        latency,
        bandwidth,
    })
}

pub fn run(b: &StackBench, backend: Backend) -> Result<(), BenchError> {
    let started = std::time::Instant::now();
    println!(
        "booting 2 {} guests with the hcabench HCA and a virtio-net NIC",
        backend.describe()
    );
    let shape = Shape {
        what: "bench-stack",
        nodes: 2,
        link: true,
    };
    let mut s = Session::boot(&b.cfg, backend, shape, b.boot_timeout, b.keep, &mut |m| {
        println!("  {m}")
    })?;
    let tb = &mut s.tb;
    println!("setting up: IPoIB, TIPC, RDS, eth0");
    tb.ipoib_up()?;
    for (i, a) in tb.agents.iter_mut().enumerate() {
        // The NIC alone (rxe-up's first steps, no rxe0): eth0 at 10.77.0.k.
        a.run(
            &format!(
                "modload rxe && for i in $(seq 50); do [ -e /sys/class/net/eth0 ] && \
                 break; sleep 0.1; done; ip link set lo up && ip link set eth0 up && \
                 ip addr add 10.77.0.{}/24 dev eth0",
                i + 1
            ),
            T,
        )?;
    }
    for a in tb.agents.iter_mut() {
        a.run("tipc-up && rds-up", T)?;
        if b.mpi {
            // MPICH and NetPIPE are on the userland disk: under /usr from now on.
            a.run("userland-up", T)?;
        }
    }
    tb.agents[1].run(
        &format!(
            "tipc-echo serve {TIPC_INSTANCE} > /tmp/tipc-serve.log 2>&1 & \
             rds-echo serve {IB0} {RDS_PORT} > /tmp/rds-serve.log 2>&1 & sleep 1"
        ),
        T,
    )?;
    // The first packets over eth0 wait for ARP.
    tb.agents[0].run(&format!("ping -q -c 2 -W 5 {ETH0} > /dev/null"), T)?;
    tb.agents[0].run(&format!("ping -q -c 3 -W 5 {IB0} > /dev/null"), T)?;
    s.start_fabric_tools()?;
    let tb = &mut s.tb;
    println!(
        "measuring: {} round trips per layer; bandwidth at {} ({} MiB or 10 messages per cell)",
        b.rounds,
        b.sizes
            .iter()
            .map(|&z| size_name(z))
            .collect::<Vec<_>>()
            .join(", "),
        b.bw_bytes as f64 / f64::from(1u32 << 20)
    );
    let mut rows = vec![kernel_verbs(tb, b)?, user_verbs(tb, b)?];
    if b.mpi {
        rows.push(mpi_layer(tb, b, Layer::MpiUcx)?);
        rows.push(mpi_layer(tb, b, Layer::MpiTcp)?);
    }
    rows.push(tipc_echo(tb, b, Layer::TcpDatagram, "tcp", IB0)?);
    let instance = TIPC_INSTANCE.to_string();
    rows.push(tipc_echo(tb, b, Layer::TipcRdm, "rdm", &instance)?);
    rows.push(tipc_echo(tb, b, Layer::TipcStream, "stream", &instance)?);
    rows.push(rds(tb, b)?);
    rows.push(tipc_echo(tb, b, Layer::TcpEth, "tcp", ETH0)?);
    // Connected mode last: it changes ib0's MTU, under TIPC's bearer too.
    for a in tb.agents.iter_mut() {
        a.run(
            "echo connected > /sys/class/net/ib0/mode && ip link set ib0 mtu 65520",
            T,
        )?;
    }
    tb.agents[0].run(&format!("ping -q -c 3 -W 5 {IB0} > /dev/null"), T)?;
    rows.push(tipc_echo(tb, b, Layer::TcpConnected, "tcp", IB0)?);
    rows.sort_by_key(|r| Layer::ALL.iter().position(|&l| l == r.layer));
    println!();
    print!("{}", latency_table(&rows, b.rounds));
    println!();
    print!("{}", bandwidth_table(&rows, &b.sizes));
    println!();
    print!("{}", legend(&rows));
    if !b.mpi {
        println!("  (MPI's rows: with --mpi)");
    }
    s.print_fault_report();
    println!("total {:.1?}", started.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(layer: Layer, mean: f64, median: Option<f64>, bw: &[Option<f64>]) -> Row {
        Row {
            layer,
            latency: Latency {
                mean_us: mean,
                median_us: median,
            },
            bandwidth: bw.to_vec(),
        }
    }

    #[test]
    fn test_ratios_need_both_figures_and_a_nonzero_base() {
        assert_eq!(ratio(Some(30.0), Some(10.0)), Some(3.0));
        assert_eq!(ratio(None, Some(10.0)), None);
        assert_eq!(ratio(Some(3.0), None), None);
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(Some(f64::NAN), Some(1.0)), None);
    }

    #[test]
    fn test_sizes_are_named_as_people_write_them() {
        assert_eq!(size_name(1024), "1 KiB");
        assert_eq!(size_name(65536), "64 KiB");
        assert_eq!(size_name(1 << 20), "1 MiB");
        assert_eq!(size_name(1000), "1000 B");
        assert_eq!(size_name(1536), "1536 B");
    }

    #[test]
    fn test_tables_show_every_row_with_ratios_to_kernel_verbs() {
        let rows = vec![
            row(
                Layer::KernelVerbs,
                20.0,
                Some(18.0),
                &[Some(100.0), Some(400.0)],
            ),
            row(
                Layer::UserVerbs,
                10.0,
                Some(9.0),
                &[Some(50.0), Some(800.0)],
            ),
            row(Layer::TipcRdm, 300.0, Some(270.0), &[None, None]),
            row(Layer::Rds, 100.0, None, &[Some(25.0), Some(0.0)]),
        ];
        let lat = latency_table(&rows, 500);
        assert!(lat.contains("500 round trips"), "{lat}");
        let line = |t: &str, name: &str| {
            t.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name} row in\n{t}"))
                .split_whitespace()
                .skip(name.split_whitespace().count())
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(line(&lat, "kernel verbs"), ["20.0", "18.0", "1.00", "1.00"]);
        assert_eq!(line(&lat, "user verbs"), ["10.0", "9.0", "0.50", "0.50"]);
        assert_eq!(line(&lat, "TIPC RDM"), ["300.0", "270.0", "15.00", "15.00"]);
        assert_eq!(line(&lat, "RDS"), ["100.0", "-", "5.00", "-"]);
        let bw = bandwidth_table(&rows, &[1024, 1 << 20]);
        let head = bw.lines().nth(1).unwrap();
        assert!(head.contains("1 KiB") && head.contains("1 MiB"), "{bw}");
        assert_eq!(
            line(&bw, "user verbs"),
            ["50.0", "(0.50)", "800.0", "(2.00)"]
        );
        assert_eq!(line(&bw, "RDS"), ["25.0", "(0.25)", "0.0", "(0.00)"]);
        assert!(!bw.contains("TIPC RDM"), "RDM has no bandwidth row: {bw}");
        let legend = legend(&rows);
        assert!(legend.contains("ib_send_lat") && legend.contains("rds-echo"));
    }

    #[test]
    fn test_tools_lines_are_read() {
        let lat = "tipc-echo: x\nLAT mode=tcp rounds=100 rtt_mean_us=312.5 rtt_median_us=290.0 \
                   oneway_mean_us=156.2 oneway_median_us=145.0\n";
        assert_eq!(
            parse_lat(lat),
            Some(Latency {
                mean_us: 312.5,
                median_us: Some(290.0)
            })
        );
        assert_eq!(parse_lat("LAT mode=tcp rounds=100"), None);
        let bw = "BW mode=stream size=65536 bytes=4194304 secs=0.2 mb_s=20.97 checked=1\n";
        assert_eq!(parse_bw(bw), Some(20.97));
        assert_eq!(parse_bw(&bw.replace("checked=1", "checked=0")), None);
        let rds = "rds-echo: 16 x 65536 bytes verified, window 8, 512.0 us per message\n\
                   rds-echo: 16 messages, 1048576 bytes, every echo verified\n";
        assert_eq!(parse_rds_bw(rds, 65536), Some(128.0));
        assert_eq!(parse_rds_bw(rds, 1024), None);
        let np = "       1   0.087654   0.00008703\n   65536  1200.5   0.00043672\n";
        let (half, mb) = parse_netpipe(np, 1).unwrap();
        assert!((half - 87.03).abs() < 1e-6 && (mb - 0.087654 / 8.0).abs() < 1e-12);
        assert_eq!(parse_netpipe(np, 65536).map(|x| x.1), Some(1200.5 / 8.0));
        assert_eq!(parse_netpipe(np, 1024), None);
    }

    #[test]
    fn test_perftest_rows_are_read() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                   t_avg[usec]    t_stdev[usec]\n 1       1000          10.21          95.33   \
                   11.00                12.50             3.10\n";
        assert_eq!(
            parse_send_lat(lat, 1),
            Some(Latency {
                mean_us: 25.0,
                median_us: Some(22.0)
            })
        );
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   \
                  MsgRate[Mpps]\n 65536      1000             812.34             790.12    \
                  0.012056\n";
        assert_eq!(parse_write_bw(bw, 65536), Some(790.12));
        assert_eq!(parse_write_bw(bw, 1024), None);
    }

    #[test]
    fn test_each_cell_moves_the_bytes_asked_or_ten_messages() {
        let b = StackBench {
            cfg: ClusterConfig::default(),
            boot_timeout: Duration::from_secs(1),
            keep: false,
            rounds: 10,
            sizes: vec![],
            bw_bytes: 1 << 20,
            mpi: false,
        };
        assert_eq!(b.count(1024), 1024);
        assert_eq!(b.count(1 << 20), 10);
    }
}
