//! `hcabench bench apps`: the analogue of the paper's Table 2 and its section 5.1
//! comparison. For each node count it boots one cluster (guests with as many vCPUs as the
//! most threads asked for), and for each application, thread count, load setting and
//! protocol mode it opens a fresh DSM session, runs the application (verified against a
//! sequential run on node 1) and records its time, faults and messages. The table gives
//! each mode's time and its ratio to the first mode's: by default workqueue/irq,
//! user-sim/irq and user/irq (the paper: the kernel handler up to 23% better than the
//! user-level simulation, more under load; `user` is a real user-level DSM over
//! libibverbs, which the paper could not measure), and the speedup over the sequential run
//! where the host has a core for every guest vCPU. The user-level modes open no kernel
//! DSM session: each application process connects its own mesh ([`cluster::udsm`]).
//!
//! Load, as the paper ran it: one CPU-bound process per guest beside the application.

use std::time::{Duration, Instant};

use cluster::dsm::{app_command, close_all, configure, connect_mesh, AppResult};
use cluster::Backend;

use crate::config::ClusterConfig;
use crate::dsmrun::{self, Job, Mode};
use crate::error::UsageError;
use crate::session::{BenchError, Session, Shape};

/// The sizes `bench apps` runs each application at (the e2e tests' sizes: seconds each on
/// a 2-core host; `hcabench run` takes any size).
pub fn bench_args(app: Job) -> &'static [&'static str] {
    match app {
        Job::Sor => &["130", "1024", "8"],
        Job::Is => &["65536", "1024", "2"],
        Job::Lu => &["128"],
        Job::Tsp => &["9"],
        Job::Nbody => &["192", "3"],
        Job::Nbodyw => &["128", "3"],
        Job::Water => &["64", "3"],
        Job::Barnes => &["192", "2"],
        Job::Probe => &[],
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Load {
    /// Idle guests
    Off,
    /// One CPU-bound process per guest beside the application
    On,
    /// Both, one after the other
    Both,
}

pub struct AppsBench {
    pub cfg: ClusterConfig,
    pub boot_timeout: Duration,
    pub keep: bool,
    pub apps: Vec<Job>,
    pub nodes: Vec<usize>,
    pub threads: Vec<u32>,
    pub modes: Vec<Mode>,
    pub load: Load,
}

/// One measured cell; `res` is empty when the run failed.
struct Cell {
    app: Job,
    nodes: usize,
    threads: u32,
    load: bool,
    res: Vec<AppResult>,
}

impl Cell {
    fn ok(&self) -> bool {
        !self.res.is_empty()
    }
    fn time_ms(&self) -> f64 {
        self.res.iter().map(|r| r.time_ms).fold(0.0, f64::max)
    }
    fn faults(&self) -> u64 {
        self.res
            .iter()
            .map(|r| r.read_faults + r.write_faults)
            .sum()
    }
    fn msgs(&self) -> u64 {
        self.res.iter().map(|r| r.msgs).sum()
    }
}

pub fn check(b: &AppsBench) -> Result<(), UsageError> {
    if b.apps.is_empty() || b.nodes.is_empty() || b.threads.is_empty() || b.modes.is_empty() {
        return Err(UsageError::AppsNeedValues);
    }
    if let Some(a) = b.apps.iter().find(|&&a| a == Job::Probe) {
        return Err(UsageError::NotAnApp(format!("{a:?}")));
    }
    if let Some(&n) = b.nodes.iter().find(|&&n| !(2..=16).contains(&n)) {
        return Err(UsageError::OutOfRange {
            what: "--app-nodes",
            value: n as u64,
            range: "2..=16",
        });
    }
    if let Some(&t) = b.threads.iter().find(|&&t| !(1..=16).contains(&t)) {
        return Err(UsageError::OutOfRange {
            what: "--threads",
            value: t.into(),
            range: "1..=16",
        });
    }
    Ok(())
}

/// A CPU-bound process in every guest (a shell busy loop); its pids, to stop it.
fn start_load(s: &mut Session) -> Result<Vec<String>, BenchError> {
    let t = Duration::from_secs(60);
    let mut pids = Vec::new();
    for a in s.tb.agents.iter_mut() {
        let out = a.run(
            "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo LOADPID=$!",
            t,
        )?;
        let pid = out
            .lines()
            .find_map(|l| l.strip_prefix("LOADPID="))
            .ok_or_else(|| BenchError::NoLoad {
                node: a.name.clone(),
                output: out.clone(),
            })?;
        pids.push(pid.trim().to_string());
    }
    Ok(pids)
}

fn stop_load(s: &mut Session, pids: &[String]) -> Result<(), BenchError> {
    let t = Duration::from_secs(60);
    for (a, pid) in s.tb.agents.iter_mut().zip(pids) {
        a.run(&format!("kill {pid}"), t)?;
    }
    Ok(())
}

/// One application run in a fresh session; an error unless node 1 verified it.
fn run_cell(
    s: &mut Session,
    app: Job,
    threads: u32,
    mode: Mode,
    load: bool,
) -> Result<Vec<AppResult>, BenchError> {
    close_all(&mut s.tb.agents)?;
    if let Some(config) = mode.config() {
        connect_mesh(&mut s.tb.agents, "hcab0")?;
        configure(&mut s.tb.agents, &config)?;
    }
    let args: Vec<String> = bench_args(app).iter().map(|a| a.to_string()).collect();
    let cmd = app_command(&app.name(), &args, threads);
    let pids = if load { start_load(s)? } else { Vec::new() };
    let res = dsmrun::run_in_mode(
        &mut s.tb.agents,
        &cmd,
        "hcab0",
        mode,
        Duration::from_secs(900),
    );
    if load {
        stop_load(s, &pids)?;
    }
    let res = res?;
    match res.iter().find_map(|r| r.verified) {
        Some(true) => Ok(res),
        Some(false) => Err(BenchError::Differs(format!("`{cmd}` ({mode})"))),
        None => Err(BenchError::Unverified(format!("`{cmd}` ({mode})"))),
    }
}

pub fn run(b: &AppsBench, backend: Backend) -> Result<(), BenchError> {
    check(b)?;
    let vcpus = b
        .cfg
        .vcpus
        .max(b.threads.iter().copied().max().unwrap_or(1));
    let loads: &[bool] = match b.load {
        Load::Off => &[false],
        Load::On => &[true],
        Load::Both => &[false, true],
    };
    let total = b.nodes.len() * b.apps.len() * b.threads.len() * loads.len() * b.modes.len();
    let started = Instant::now();
    let mut cells = Vec::new();
    let mut failures = Vec::new();
    for &nodes in &b.nodes {
        println!(
            "booting {nodes} {} guests ({vcpus} vCPU each)",
            backend.describe()
        );
        let mut cfg = b.cfg.clone();
        cfg.vcpus = vcpus;
        let shape = Shape {
            what: "bench-apps",
            nodes,
            link: false,
        };
        let mut s = Session::boot(&cfg, backend, shape, b.boot_timeout, b.keep, &mut |m| {
            println!("  {m}")
        })?;
        s.start_fabric_tools()?;
        for &app in &b.apps {
            for &threads in &b.threads {
                for &load in loads {
                    for &mode in &b.modes {
                        // A failed run is reported and the table goes on (a fresh session
                        // follows); the command fails at the end.
                        let res = run_cell(&mut s, app, threads, mode, load);
                        let what = format!(
                            "[{}/{total}] {} on {nodes}x{threads}{} in {mode}",
                            cells.len() + 1,
                            app.name(),
                            if load { " under load" } else { "" },
                        );
                        let res = match res {
                            Ok(res) => res,
                            Err(e) => {
                                println!("  {what}: FAILED: {e}");
                                failures.push(format!("{what}: {e}"));
                                Vec::new()
                            }
                        };
                        let cell = Cell {
                            app,
                            nodes,
                            threads,
                            load,
                            res,
                        };
                        if cell.ok() {
                            println!(
                                "  {what}: {:.1} ms, verified ({:.0?} so far)",
                                cell.time_ms(),
                                started.elapsed()
                            );
                        }
                        cells.push(cell);
                    }
                }
            }
        }
    }
    print_table(b, &cells, vcpus);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(BenchError::Runs {
            failed: failures.len(),
            total,
            failures,
        })
    }
}

/// Why a row shows no speedup.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NoSpeedup {
    Failed,
    Load,
    /// The guests' vCPUs outnumber the host's cores.
    SharedCores,
    NoSequential,
}

/// The row's DSM speedup, where it compares like with like: not where guests share cores
/// (with each other or with the load).
fn speedup(c: &Cell, cores: usize, vcpus: u32) -> Result<f64, NoSpeedup> {
    if !c.ok() {
        return Err(NoSpeedup::Failed);
    }
    if c.load {
        return Err(NoSpeedup::Load);
    }
    if dsmrun::shares_cores(c.nodes, vcpus, cores) {
        return Err(NoSpeedup::SharedCores);
    }
    dsmrun::speedup_of(&c.res).ok_or(NoSpeedup::NoSequential)
}

fn print_table(b: &AppsBench, cells: &[Cell], vcpus: u32) {
    let cores = dsmrun::host_cores();
    println!();
    println!(
        "DSM applications, every result verified against a sequential run; time in ms \
         (slowest node), faults and messages summed over nodes, in the first mode's run"
    );
    let mut head = format!("{:<7} {:>5} {:>3} {:>4}", "app", "nodes", "thr", "load");
    for m in &b.modes {
        head += &format!(" {:>10}", format!("{m} ms"));
    }
    for m in b.modes.iter().skip(1) {
        head += &format!(" {:>13}", format!("{m}/{}", b.modes[0]));
    }
    head += &format!(" {:>8} {:>8} {:>8}", "faults", "msgs", "speedup");
    println!("{head}");
    let mut left_out = Vec::new();
    for group in cells.chunks(b.modes.len()) {
        let first = &group[0];
        let mut row = format!(
            "{:<7} {:>5} {:>3} {:>4}",
            first.app.name(),
            first.nodes,
            first.threads,
            if first.load { "yes" } else { "no" }
        );
        for c in group {
            row += &if c.ok() {
                format!(" {:>10.1}", c.time_ms())
            } else {
                format!(" {:>10}", "FAILED")
            };
        }
        for c in group.iter().skip(1) {
            row += &if c.ok() && first.ok() {
                format!(" {:>13.2}", c.time_ms() / first.time_ms().max(1e-3))
            } else {
                format!(" {:>13}", "-")
            };
        }
        let speedup = match speedup(first, cores, vcpus) {
            Ok(x) => format!("{x:.2}"),
            Err(why) => {
                left_out.push((why, first.nodes));
                "-".to_string()
            }
        };
        row += &format!(" {:>8} {:>8} {:>8}", first.faults(), first.msgs(), speedup);
        println!("{row}");
    }
    let mut why: Vec<String> = Vec::new();
    for reason in [
        NoSpeedup::Failed,
        NoSpeedup::Load,
        NoSpeedup::SharedCores,
        NoSpeedup::NoSequential,
    ] {
        let Some(most) = left_out
            .iter()
            .filter(|(r, _)| *r == reason)
            .map(|(_, n)| *n)
            .max()
        else {
            continue;
        };
        why.push(match reason {
            NoSpeedup::Failed => "a failed run".into(),
            NoSpeedup::Load => "a run under load (the guests share cores with it)".into(),
            NoSpeedup::SharedCores => format!(
                "more guest vCPUs than host cores ({} here; {most} nodes x {vcpus} vCPUs = \
                 {}: the guests share cores)",
                dsmrun::cores_phrase(cores),
                most * vcpus as usize
            ),
            NoSpeedup::NoSequential => "an application that reported no sequential time".into(),
        });
    }
    if !why.is_empty() {
        println!(
            "speedup (the sequential run on node 1 over the slowest node's time) left out for {}",
            why.join("; ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(nodes: usize, load: bool, seq_ms: Option<f64>, ran: bool) -> Cell {
        let res = (1..=nodes as u32)
            .filter(|_| ran)
            .map(|node| AppResult {
                node,
                verified: Some(true),
                time_ms: 100.0 + f64::from(node),
                read_faults: 0,
                write_faults: 0,
                msgs: 0,
                msg_bytes: 0,
                data_bytes: 0,
                read_fault_us: 0.0,
                write_fault_us: 0.0,
                irq: 0,
                process: 0,
                seq_ms: if node == 1 { seq_ms } else { None },
                line: String::new(),
            })
            .collect();
        Cell {
            app: Job::Sor,
            nodes,
            threads: 1,
            load,
            res,
        }
    }

    #[test]
    fn test_speedup_is_the_sequential_time_over_the_slowest_node() {
        // 8 nodes x 2 vCPUs on 16 cores: every vCPU has a core; the slowest node took 108 ms.
        let s = speedup(&cell(8, false, Some(540.0), true), 16, 2).unwrap();
        assert!((s - 5.0).abs() < 1e-9, "{s}");
    }

    #[test]
    fn test_speedup_left_out_says_why() {
        assert_eq!(
            speedup(&cell(8, false, Some(540.0), true), 8, 2),
            Err(NoSpeedup::SharedCores)
        );
        assert_eq!(
            speedup(&cell(2, true, Some(540.0), true), 16, 1),
            Err(NoSpeedup::Load)
        );
        assert_eq!(
            speedup(&cell(2, false, None, false), 16, 1),
            Err(NoSpeedup::Failed)
        );
        // A verified run whose application timed no sequential run is not blamed on the cores.
        assert_eq!(
            speedup(&cell(2, false, None, true), 16, 1),
            Err(NoSpeedup::NoSequential)
        );
    }
}
