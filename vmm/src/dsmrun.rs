//! `hcabench run <app>`: a DSM application (guest-kmod/apps) on a fresh cluster of QEMU
//! guests. The DSM module opens on every node's HCA (or on SoftRoCE, to show it is a plain
//! verbs consumer), the harness connects the mesh, the application's processes start
//! together, and node 1 checks the result against a sequential run.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use device_server::dsm::{connect_mesh, run_app, AppResult};
use device_server::qemu::{qemu_available, Image};
use device_server::verbs::{QemuShape, Testbed};
use hca_model::faults::FaultHook;

use crate::config::Host;
use hcabench::kvm_guests::{self, KvmShape};

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
    pub backend: Host,
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
    if o.transport == Transport::Rxe && o.backend == Host::Kvm {
        return Err(
            "--transport rxe needs the qemu backend: hcabench's VMM gives its guests \
                    no NIC for SoftRoCE (add --backend qemu)"
                .into(),
        );
    }
    if o.backend == Host::Kvm {
        if let Some(f) = &o.faults {
            if !crate::faultrun::load_plan(f)?.nodes.is_empty() {
                return Err(format!(
                    "{}: node kills in `run` need the qemu backend (`hcabench up --backend \
                     kvm --faults` runs them)",
                    f.display()
                ));
            }
        }
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
    let mut tb = match o.backend {
        Host::Qemu => {
            qemu_available()?;
            let shape = QemuShape {
                nodes: o.nodes,
                link: rxe,
                ram_mib: o.memory_mib,
                vcpus: o.vcpus,
                kvm: false,
            };
            Testbed::boot_qemu(&image, dir.clone(), shape, o.boot_timeout, progress)?
        }
        Host::Kvm => {
            let kvm = kvm_ioctls::Kvm::new().map_err(|e| format!("/dev/kvm: {e}"))?;
            let shape = KvmShape {
                nodes: o.nodes,
                ram_mib: o.memory_mib,
                vcpus: o.vcpus,
                kernel_args: o.kernel_args.clone(),
            };
            let fabric = hca_model::Fabric::new();
            let tb = kvm_guests::boot(
                &kvm,
                &image,
                dir.clone(),
                &shape,
                &fabric,
                o.boot_timeout,
                progress,
            );
            tb.map_err(|e| crate::daemon::kvm_boot_advice(&e, o.boot_timeout))?
        }
    };
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

/// Stops the guests a fault plan kills while an application runs (a thread polling the
/// plan every 100 ms; it ends when dropped). A killed guest's QEMU goes, the device server
/// takes its HCA off the fabric, and the application fails on every node: the DSM has no
/// recovery (a peer's lost WR makes it dead, and its waiting faults SIGBUS).
struct NodeKiller {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NodeKiller {
    fn start(hook: Arc<FaultHook>, fabric: hca_model::Fabric, pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                for lid in hook.due_kills(fabric.now_ns()) {
                    let Some(&pid) = pids.get(usize::from(lid).wrapping_sub(1)) else {
                        continue;
                    };
                    println!("  node{lid} killed by the fault plan");
                    // SAFETY: kill only signals the QEMU process this run started.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for NodeKiller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn run(o: &RunOpts) -> Result<(), String> {
    check(o)?;
    let started = Instant::now();
    let host = match o.backend {
        Host::Qemu => "QEMU (TCG)",
        Host::Kvm => "KVM (hcabench's VMM)",
    };
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
    let faults = match (&o.faults, tb.fabric()) {
        (Some(plan), Some(fabric)) => {
            let log = tb.dir.join(crate::faultrun::LOG);
            Some(crate::faultrun::attach(&log, plan, fabric)?)
        }
        _ => None,
    };
    if let (Some((path, format)), Some(fabric)) = (&o.capture, tb.fabric()) {
        crate::faultrun::attach_capture(path, *format, fabric)?;
    }
    let cmd = std::iter::once(o.app.clone())
        .chain(o.args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "  running `{cmd}` on every node ({:.1?} so far)",
        started.elapsed()
    );
    let killer = match (&faults, tb.server.as_ref()) {
        (Some(h), Some(server)) => {
            let pids: Vec<u32> = tb.guests.iter().filter_map(|g| g.pid()).collect();
            Some(NodeKiller::start(h.clone(), server.fabric().clone(), pids))
        }
        _ => None,
    };
    let res = run_app(&mut tb.agents, &cmd, Duration::from_secs(900));
    drop(killer);
    if let Ok(r) = &res {
        print_results(&o.app, dev, r);
    }
    // The report comes whether or not the application survived the plan.
    if let Some(h) = &faults {
        let hcas: Vec<_> = (0..o.nodes).filter_map(|i| tb.hca(i)).collect();
        print!("{}", crate::faultrun::report(h, &hcas));
    }
    let res = res.map_err(|e| match &faults {
        Some(h) if h.counts().nodes_killed > 0 => format!(
            "{e}\n(the fault plan killed a node: the DSM cannot go on without one, so its \
             peers' faults and calls fail)"
        ),
        _ => e,
    })?;
    if faults.is_some() && !o.keep {
        // The directory stays for its fault log, not for the guests' RAM files.
        drop(tb.guests.drain(..));
        for e in std::fs::read_dir(&tb.dir).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "ram") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
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
