//! `hcabench run <app>`: a DSM application (guest-kmod/apps) on a fresh cluster, booted
//! through the launcher on the backend the user chose, with the cluster file's guests,
//! capture and fault plan. The DSM module opens on every node's HCA (or on SoftRoCE, to show
//! it is a plain verbs consumer), the harness connects the mesh, the application's processes
//! start together, and node 1 checks the result against a sequential run.

use std::fmt;
use std::time::{Duration, Instant};

use cluster::agent::Agent;
use cluster::dsm::{app_command, configure, connect_mesh, run_app, AppResult, DsmError};
use cluster::udsm::{run_app_user, Service};
use cluster::Backend;

use crate::config::ClusterConfig;
use crate::error::UsageError;
use crate::session::{BenchError, Session, Shape};

/// What `hcabench run` runs; the doc comments are the help text.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Job {
    /// The HCA probe of every node of the running cluster (booting one if none is up)
    Probe,
    /// Red-black SOR on a grid, row bands per node
    Sor,
    /// Integer sort (ranking), histogram under a DSM lock
    Is,
    /// LU decomposition, a barrier per pivot
    Lu,
    /// Travelling salesman, branch and bound from a shared job counter
    Tsp,
    /// Direct n-body steps, double-buffered positions
    Nbody,
    /// N-body with write sharing (the paper's NbodyW): every pair once, forces added into
    /// shared blocks under DSM locks
    Nbodyw,
    /// Water molecules after SPLASH-2's water-nsquared: bonds, and Lennard-Jones and
    /// Coulomb within a cutoff, pair forces added into shared blocks under DSM locks
    Water,
    /// Barnes-Hut after SPLASH-2's barnes: an octree built in shared memory each step,
    /// a DSM lock per cell
    Barnes,
}

impl Job {
    /// The name the guest's program and the command line use.
    pub fn name(self) -> String {
        crate::session::value_name(&self)
    }

    /// What it computes (its help line).
    pub fn about(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .and_then(|v| v.get_help().map(|h| h.to_string()))
            .unwrap_or_default()
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Transport {
    /// The hcabench HCA (hcab0)
    Hca,
    /// SoftRoCE (rdma_rxe over the guests' virtio-net NICs, on one Ethernet segment)
    Rxe,
}

/// Where the DSM protocol handles its messages (the paper's section 5.1 comparison).
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Mode {
    /// In the completion handler (interrupt context): the paper's kernel/IB
    Irq,
    /// In a kernel workqueue (the paper's task queue)
    Workqueue,
    /// The paper's simulation of a user-level DSM
    UserSim,
    /// A real user-level DSM: the protocol in the application's process over libibverbs,
    /// its service thread asleep on a completion channel
    User,
    /// The same, its service thread polling the CQ
    UserPoll,
}

impl Mode {
    /// The `dsmctl config` arguments that select it; None for the user-level modes, which
    /// do not use the kernel DSM.
    pub fn config(self) -> Option<String> {
        let handler = match self {
            Mode::Irq => "irq",
            Mode::Workqueue => "process",
            Mode::UserSim => "user-sim",
            Mode::User | Mode::UserPoll => return None,
        };
        Some(format!("handler={handler} readfault=write"))
    }

    /// The user-level DSM's service thread, for the modes that run it.
    pub fn user_level(self) -> Option<Service> {
        match self {
            Mode::User => Some(Service::Channel),
            Mode::UserPoll => Some(Service::Poll),
            _ => None,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Irq => "irq",
            Mode::Workqueue => "workqueue",
            Mode::UserSim => "user-sim",
            Mode::User => "user",
            Mode::UserPoll => "user-poll",
        })
    }
}

/// How an application runs on each node: its threads and the protocol's handling mode.
#[derive(Clone, Copy, Debug)]
pub struct AppShape {
    pub threads: u32,
    pub mode: Mode,
}

pub struct RunOpts {
    /// A DSM application (not `probe`).
    pub app: Job,
    /// The cluster file with the command's flags over it (nodes, faults, capture, image).
    pub cfg: ClusterConfig,
    /// The backend `daemon::choose_backend` picked.
    pub backend: Backend,
    pub transport: Transport,
    pub shape: AppShape,
    pub args: Vec<String>,
    pub boot_timeout: Duration,
    pub keep: bool,
}

pub fn check(o: &RunOpts) -> Result<(), UsageError> {
    if o.app == Job::Probe {
        return Err(UsageError::Probe);
    }
    if !(2..=16).contains(&o.cfg.nodes) {
        return Err(UsageError::OutOfRange {
            what: "--nodes",
            value: o.cfg.nodes as u64,
            range: "2..=16",
        });
    }
    let rxe = o.transport == Transport::Rxe;
    if (o.cfg.faults.is_some() || o.cfg.capture.is_some()) && rxe {
        return Err(UsageError::RxeFabricTools);
    }
    if !(1..=16).contains(&o.shape.threads) {
        return Err(UsageError::OutOfRange {
            what: "--threads",
            value: o.shape.threads.into(),
            range: "1..=16",
        });
    }
    if let Some(a) = o.args.iter().find(|a| a.parse::<u64>().is_err()) {
        return Err(UsageError::AppArg(a.clone()));
    }
    Ok(())
}

/// Boots the cluster and opens the DSM on every node; the device name used.
pub fn boot_dsm(
    o: &RunOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<(Session, &'static str), BenchError> {
    let rxe = o.transport == Transport::Rxe;
    let shape = Shape {
        what: "run",
        nodes: o.cfg.nodes,
        link: rxe,
    };
    let mut s = Session::boot(&o.cfg, o.backend, shape, o.boot_timeout, o.keep, progress)?;
    let dev = if rxe {
        s.tb.rxe_up()?;
        "rxe0"
    } else {
        "hcab0"
    };
    match o.shape.mode.config() {
        Some(config) => {
            connect_mesh(&mut s.tb.agents, dev)?;
            configure(&mut s.tb.agents, &config)?;
            progress(&format!(
                "DSM open on {dev} on every node, RC mesh connected, protocol in {} mode",
                o.shape.mode
            ));
        }
        None => progress(&format!(
            "user-level DSM ({}): each application process connects its own RC mesh on {dev}",
            o.shape.mode
        )),
    }
    Ok((s, dev))
}

/// Runs a DSM application in `mode`: on the kernel DSM the harness opened, or on the
/// user-level one, whose processes the harness connects as they start.
pub fn run_in_mode(
    agents: &mut [Agent],
    cmd: &str,
    dev: &str,
    mode: Mode,
    timeout: Duration,
) -> Result<Vec<AppResult>, DsmError> {
    match mode.user_level() {
        Some(service) => run_app_user(agents, cmd, dev, service, timeout),
        None => run_app(agents, cmd, timeout),
    }
}

pub fn run(o: &RunOpts) -> Result<(), BenchError> {
    check(o)?;
    let started = Instant::now();
    let app = o.app.name();
    println!(
        "booting {} {} guests ({} vCPU each) for `{app}` ({}), {} thread(s) per node",
        o.cfg.nodes,
        o.backend.describe(),
        o.cfg.vcpus,
        o.app.about(),
        o.shape.threads
    );
    let (mut s, dev) = boot_dsm(o, &mut |m| println!("  {m}"))?;
    // The plan and capture start with the application (boot and connection setup run
    // clean).
    s.start_fabric_tools()?;
    let cmd = app_command(&app, &o.args, o.shape.threads);
    println!(
        "  running `{cmd}` on every node ({:.1?} so far)",
        started.elapsed()
    );
    let hcas = s.tb.cluster.hcas();
    let timeout = Duration::from_secs(900);
    let mode = o.shape.mode;
    let res = s.with_kills(|agents| run_in_mode(agents, &cmd, dev, mode, timeout));
    if let Ok(r) = &res {
        print_results(&app, dev, r, o.cfg.vcpus);
    }
    // The report comes whether or not the application survived the plan.
    if let Some(h) = s.faults() {
        print!("{}", crate::faultrun::report(h, &hcas));
    }
    let res = res.map_err(|e| match s.faults() {
        Some(h) if h.counts().nodes_killed > 0 => BenchError::NodeKilled(Box::new(e)),
        _ => e,
    })?;
    // With a plan the directory stays for its fault log; the cluster removes the guests'
    // sockets when it goes.
    match res.iter().find_map(|r| r.verified) {
        Some(true) => Ok(()),
        Some(false) => Err(BenchError::Differs(format!("{app} (DSM)"))),
        None => Err(BenchError::Unverified(app)),
    }
}

/// The host cores this process may use (its CPU affinity counted).
pub fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether `nodes` guests of `vcpus` vCPUs each outnumber `cores`: the guests then share
/// cores, and a node's time is not comparable with one guest's sequential run.
pub fn shares_cores(nodes: usize, vcpus: u32, cores: usize) -> bool {
    nodes * vcpus as usize > cores
}

/// The DSM speedup: node 1's sequential run over the slowest node's time, if the
/// application timed a sequential run.
pub fn speedup_of(res: &[AppResult]) -> Option<f64> {
    let seq = res.iter().find_map(|r| r.seq_ms)?;
    Some(seq / res.iter().map(|r| r.time_ms).fold(0.0, f64::max).max(1e-3))
}

/// "1 core", "16 cores".
pub fn cores_phrase(n: usize) -> String {
    if n == 1 {
        "1 core".into()
    } else {
        format!("{n} cores")
    }
}

/// The per-node table and the totals; `vcpus`: each guest's.
pub fn print_results(app: &str, dev: &str, res: &[AppResult], vcpus: u32) {
    println!();
    println!(
        "{:<6} {:>9} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10} {:>12}",
        "node",
        "time_ms",
        "rfaults",
        "wfaults",
        "msgs",
        "data_KiB",
        "rfault_us",
        "wfault_us",
        "irq/process"
    );
    for r in res {
        println!(
            "node{:<2} {:>9.1} {:>8} {:>8} {:>8} {:>10} {:>10.1} {:>10.1} {:>12}",
            r.node,
            r.time_ms,
            r.read_faults,
            r.write_faults,
            r.msgs,
            r.data_bytes / 1024,
            r.read_fault_us,
            r.write_fault_us,
            format!("{}/{}", r.irq, r.process)
        );
    }
    let time = res.iter().map(|r| r.time_ms).fold(0.0, f64::max);
    let sum = |f: fn(&AppResult) -> u64| res.iter().map(f).sum::<u64>();
    let verdict = match res.iter().find_map(|r| r.verified) {
        Some(true) => "verified against a sequential run",
        Some(false) => "DIFFERS from the sequential run",
        None => "not verified",
    };
    println!(
        "{app} on {} nodes over {dev}: {verdict}; time {time:.1} ms; faults {} read + {} write; \
         {} messages ({} KiB); {} KiB page data",
        res.len(),
        sum(|r| r.read_faults),
        sum(|r| r.write_faults),
        sum(|r| r.msgs),
        sum(|r| r.msg_bytes) / 1024,
        sum(|r| r.data_bytes) / 1024
    );
    if let (Some(seq), Some(speedup)) = (res.iter().find_map(|r| r.seq_ms), speedup_of(res)) {
        let cores = host_cores();
        let shared = if shares_cores(res.len(), vcpus, cores) {
            format!(
                " (the guests' {} vCPUs share the {} this process may use: a speedup needs a \
                 host core per guest vCPU)",
                res.len() * vcpus as usize,
                cores_phrase(cores)
            )
        } else {
            String::new()
        };
        println!(
            "sequential run on node 1 (private memory): {seq:.1} ms; DSM speedup \
             {speedup:.2}{shared}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_user_level_modes_open_no_kernel_session_and_name_their_service() {
        assert_eq!(Mode::User.config(), None);
        assert_eq!(Mode::UserPoll.config(), None);
        assert_eq!(Mode::User.user_level(), Some(Service::Channel));
        assert_eq!(Mode::UserPoll.user_level(), Some(Service::Poll));
        assert_eq!(Service::Poll.dsm_mode(), "user-poll");
    }

    #[test]
    fn test_kernel_modes_configure_the_module() {
        assert_eq!(
            Mode::Irq.config().as_deref(),
            Some("handler=irq readfault=write")
        );
        assert_eq!(
            Mode::UserSim.config().as_deref(),
            Some("handler=user-sim readfault=write")
        );
        assert_eq!(Mode::Workqueue.user_level(), None);
    }

    #[test]
    fn test_modes_print_as_the_command_line_names_them() {
        for m in [
            Mode::Irq,
            Mode::Workqueue,
            Mode::UserSim,
            Mode::User,
            Mode::UserPoll,
        ] {
            assert_eq!(m.to_string(), crate::session::value_name(&m));
        }
    }
}
