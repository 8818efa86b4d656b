//! `hcabench run <app>`: a DSM application (guest-kmod/apps) on a fresh cluster, booted
//! through the launcher on the backend the user chose. The DSM module opens on every node's HCA (or on SoftRoCE, to show it is a plain
//! verbs consumer), the harness connects the mesh, the application's processes start
//! together, and node 1 checks the result against a sequential run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cluster::dsm::{connect_mesh, run_app, AppResult};
use cluster::verbs::Testbed;
use cluster::{Backend, ClusterSpec, Image};
use hca_model::faults::FaultHook;

/// The applications, with what they compute.
pub const APPS: [(&str, &str); 5] = [
    ("sor", "red-black SOR on a grid, row bands per node"),
    ("is", "integer sort (ranking), histogram under a DSM lock"),
    ("lu", "LU decomposition, a barrier per pivot"),
    (
        "tsp",
        "travelling salesman, branch and bound from a shared job counter",
    ),
    ("nbody", "direct n-body steps, double-buffered positions"),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Transport {
    /// The hcabench HCA (hcab0)
    Hca,
    /// SoftRoCE (rdma_rxe over a virtio-net link; 2 nodes)
    Rxe,
}

pub struct RunOpts {
    pub app: String,
    pub nodes: usize,
    /// The backend `daemon::choose_backend` picked, and the guests' size.
    pub backend: Backend,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub kernel_args: String,
    pub transport: Transport,
    pub args: Vec<String>,
    pub image_dir: PathBuf,
    pub boot_timeout: Duration,
    pub keep: bool,
    /// A fault plan for the fabric while the application runs (hcab0 only).
    pub faults: Option<PathBuf>,
    /// A pcap file for the fabric's packets while the application runs (hcab0 only).
    pub capture: Option<(PathBuf, crate::config::CaptureFormat)>,
}

pub fn check(o: &RunOpts) -> Result<(), String> {
    if !APPS.iter().any(|(a, _)| *a == o.app) {
        let names: Vec<_> = APPS.iter().map(|(a, _)| *a).collect();
        return Err(format!(
            "unknown job `{}`; available: probe, {}",
            o.app,
            names.join(", ")
        ));
    }
    if !(2..=16).contains(&o.nodes) {
        return Err(format!("--nodes {} is outside 2..=16", o.nodes));
    }
    if o.transport == Transport::Rxe && o.nodes != 2 {
        return Err("--transport rxe runs on exactly 2 nodes (one virtio-net link)".into());
    }
    if o.transport == Transport::Rxe && o.backend == Backend::Kvm {
        return Err(
            "--transport rxe needs the qemu backend: hcabench's VMM gives its guests \
                    no NIC for SoftRoCE (add --backend qemu)"
                .into(),
        );
    }
    if (o.faults.is_some() || o.capture.is_some()) && o.transport == Transport::Rxe {
        return Err(
            "--faults and --capture act on hcabench's fabric, not on SoftRoCE's network".into(),
        );
    }
    if let Some(f) = &o.faults {
        crate::faultrun::load_plan(f)?;
    }
    if let Some(a) = o.args.iter().find(|a| a.parse::<u64>().is_err()) {
        return Err(format!("application argument `{a}` is not a number"));
    }
    Ok(())
}

/// Boots the cluster and opens the DSM on every node; the device name used.
pub fn boot_dsm(
    o: &RunOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<(Testbed, &'static str), String> {
    let image = Image::find(&o.image_dir)?;
    let dir = std::env::temp_dir().join(format!("hcabench-run-{}", std::process::id()));
    let rxe = o.transport == Transport::Rxe;
    let spec = ClusterSpec {
        ram_mib: o.memory_mib,
        vcpus: o.vcpus,
        kernel_args: o.kernel_args.clone(),
        link: rxe,
        ..ClusterSpec::new(o.backend, image, dir.clone(), o.nodes)
    };
    let mut tb = Testbed::boot(&spec, o.boot_timeout, progress).map_err(|e| match o.backend {
        Backend::Kvm => cluster::backend::kvm_boot_advice(&e, o.boot_timeout),
        Backend::Qemu => e,
    })?;
    if o.keep {
        tb.keep_dir();
        progress(&format!("keeping {} (consoles)", dir.display()));
    }
    let dev = if rxe {
        tb.rxe_up()?;
        "rxe0"
    } else {
        "hcab0"
    };
    connect_mesh(&mut tb.agents, dev)?;
    progress(&format!(
        "DSM open on {dev} on every node, RC mesh connected"
    ));
    Ok((tb, dev))
}

/// Runs `cmd` on every node while carrying out the plan's node kills (polled every 100 ms
/// on this thread while the application runs on another). A killed node's HCA leaves the
/// fabric, and the application fails on every node: the DSM has no recovery (a peer's lost
/// WR makes it dead, and its waiting faults SIGBUS).
fn run_with_kills(
    tb: &mut Testbed,
    cmd: &str,
    hook: Option<&FaultHook>,
) -> Result<Vec<AppResult>, String> {
    let timeout = Duration::from_secs(900);
    let Some(hook) = hook else {
        return run_app(&mut tb.agents, cmd, timeout);
    };
    let (agents, cluster) = (&mut tb.agents, &mut tb.cluster);
    std::thread::scope(|s| {
        let app = s.spawn(|| run_app(agents, cmd, timeout));
        while !app.is_finished() {
            for lid in hook.due_kills(cluster.fabric().now_ns()) {
                let i = usize::from(lid).wrapping_sub(1);
                if cluster.kill(i) {
                    println!("  node{lid} killed by the fault plan");
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        app.join()
            .unwrap_or_else(|_| Err("the application's driver thread panicked".into()))
    })
}

pub fn run(o: &RunOpts) -> Result<(), String> {
    check(o)?;
    let started = Instant::now();
    let host = o.backend.describe();
    println!(
        "booting {} {host} guests for `{}` ({})",
        o.nodes,
        o.app,
        APPS.iter()
            .find(|(a, _)| *a == o.app)
            .map(|x| x.1)
            .unwrap_or("")
    );
    let (mut tb, dev) = boot_dsm(o, &mut |m| println!("  {m}"))?;
    // The plan starts with the application (boot and connection setup run clean); its
    // log stays in the run's directory.
    if o.faults.is_some() {
        tb.keep_dir();
    }
    let faults = match &o.faults {
        Some(plan) => {
            let log = tb.dir.join(crate::faultrun::LOG);
            Some(crate::faultrun::attach(&log, plan, tb.fabric())?)
        }
        None => None,
    };
    if let Some((path, format)) = &o.capture {
        crate::faultrun::attach_capture(path, *format, tb.fabric())?;
    }
    let cmd = std::iter::once(o.app.clone())
        .chain(o.args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "  running `{cmd}` on every node ({:.1?} so far)",
        started.elapsed()
    );
    let hcas = tb.cluster.hcas();
    let res = run_with_kills(&mut tb, &cmd, faults.as_deref());
    if let Ok(r) = &res {
        print_results(&o.app, dev, r);
    }
    // The report comes whether or not the application survived the plan.
    if let Some(h) = &faults {
        print!("{}", crate::faultrun::report(h, &hcas));
    }
    let res = res.map_err(|e| match &faults {
        Some(h) if h.counts().nodes_killed > 0 => format!(
            "{e}\n(the fault plan killed a node: the DSM cannot go on without one, so its \
             peers' faults and calls fail)"
        ),
        _ => e,
    })?;
    // With a plan the directory stays for its fault log; the cluster removes the guests'
    // RAM files and sockets when it goes.
    match res.iter().find_map(|r| r.verified) {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "{}: the DSM result differs from the sequential run",
            o.app
        )),
        None => Err(format!("{}: no node verified the result", o.app)),
    }
}

pub fn print_results(app: &str, dev: &str, res: &[AppResult]) {
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
    if let Some(seq) = res.iter().find_map(|r| r.seq_ms) {
        println!(
            "sequential run on node 1 (private memory): {seq:.1} ms; DSM speedup {:.2} \
             (the guests share this host's CPUs: speedups need one host core per guest)",
            seq / time.max(1e-3)
        );
    }
}
