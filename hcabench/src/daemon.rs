//! The background process behind `hcabench up`: it boots the cluster through the launcher
//! (`cluster::Cluster`: QEMU guests with the device server, or every guest and HCA in its
//! own VMM), records the nodes in the run directory, carries out the fault plan's and
//! `hcabench fault`'s node kills, notes guests that stop, and tears everything down on
//! SIGTERM or SIGINT (`hcabench down`).

use std::io;

use cluster::{Backend, BackendError, BootError, Cluster, ClusterSpec, ImageError};

use crate::config::{ClusterConfig, ConfigError};
use crate::control::{Control, ControlError};
use crate::faultrun::FaultRunError;
use crate::rundir::{ClusterState, NodeState, RunDir};

/// Blocks SIGTERM and SIGINT in this thread (and the threads it starts), so that
/// [`wait_for_stop`] receives them.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it before use and
    // pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// A stop signal within `d`, or None.
fn wait_for_stop_timeout(set: &libc::sigset_t, d: std::time::Duration) -> Option<i32> {
    let t = libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` was initialised by block_stop_signals; a null siginfo is allowed.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &t) };
    (sig > 0).then_some(sig)
}

/// How often the daemon looks for nodes to kill and guests that stopped.
const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Which backend the cluster file asks for means here, and why; `kvm` where KVM cannot run
/// Linux is an error.
pub fn choose_backend(cfg: &ClusterConfig) -> Result<(Backend, String), BackendError> {
    cluster::backend::choose(cfg.backend.request())
}

/// Why the daemon could not bring up, or keep, its cluster.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Faults(#[from] FaultRunError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("cannot write {}: {source}", .path.display())]
    State {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The cluster's fault plan and capture on `fabric`, if it has them, and the control
/// socket for live faults; the log and report of an earlier run go.
fn attach_fabric_tools(
    run: &RunDir,
    cfg: &ClusterConfig,
    backend: Backend,
    fabric: &hca_model::Fabric,
) -> Result<std::sync::Arc<Control>, DaemonError> {
    use crate::faultrun::{attach, attach_capture, LOG, REPORT};
    let _ = std::fs::remove_file(run.path(REPORT));
    let _ = std::fs::remove_file(run.path(LOG));
    if let Some(path) = &cfg.capture {
        attach_capture(path, cfg.capture_format, fabric)?;
    }
    let hook = cfg
        .faults
        .as_ref()
        .map(|p| attach(&run.path(LOG), p, fabric))
        .transpose()?;
    // QEMU guests have monitors for PCI hot-plug; hcabench's VMM has no hot-plug.
    let hotplug = (backend == Backend::Qemu).then(|| run.dir().to_path_buf());
    let control = Control::new(fabric.clone(), hook, run.path(LOG), cfg.nodes, hotplug);
    control.serve(&run.path(crate::control::SOCKET))?;
    Ok(control)
}

/// Ends a fault run: the report written, the control socket gone.
fn finish_faults(run: &RunDir, control: &Control, hcas: &[hca_model::Hca]) {
    if let Some(h) = control.hook() {
        crate::faultrun::finish(run, &h, hcas);
    }
    let _ = std::fs::remove_file(run.path(crate::control::SOCKET));
}

/// Marks a killed node's console log so that `status` and `up` see it dead.
fn note_killed(node: &NodeState) {
    eprintln!("daemon: {}: killed by the fault plan", node.name);
    append(
        &node.console_log,
        &format!("\n{GUEST_STOPPED} killed by the fault plan\n"),
    );
}

/// The line the daemon appends to a node's console log when its guest stops (QEMU exited, a vCPU
/// failed, the guest shut down); `hcabench up` and `status` look for it.
pub const GUEST_STOPPED: &str = "[hcabench] guest stopped:";

pub fn run(run: &RunDir, cfg: &ClusterConfig) -> Result<(), DaemonError> {
    let signals = block_stop_signals();
    let (backend, why) = choose_backend(cfg)?;
    eprintln!("daemon: backend {backend} ({why})");
    let image = cfg.image()?;
    let spec = ClusterSpec {
        vfio: cfg.vfio.clone(),
        ..cfg.spec(backend, image.clone(), run.dir().to_path_buf(), cfg.nodes)
    };
    let mut cluster = Cluster::boot(&spec, &mut |m| eprintln!("daemon: {m}"))?;
    let control = attach_fabric_tools(run, cfg, backend, cluster.fabric())?;
    // SAFETY: getpid has no preconditions.
    let daemon_pid = unsafe { libc::getpid() } as u32;
    let mut state = ClusterState {
        daemon_pid,
        backend: backend.to_string(),
        kernel: image.kernel_version.clone(),
        config: cfg.clone(),
        // This host's nodes (all of them, unless the cluster spans hosts): node i at LID
        // i + 1, the j-th the cluster booted.
        nodes: (spec.local_nodes().enumerate())
            .map(|(j, i)| NodeState {
                name: ClusterSpec::node_name(i),
                lid: (i + 1) as u16,
                // A QEMU guest is its own process; the VMM's guests live in this one.
                pid: cluster.node(j).pid().unwrap_or(daemon_pid),
                console_log: spec.console_log(i),
                console_socket: spec.console_socket(i).unwrap_or_default(),
                agent_socket: spec.agent_socket(i).unwrap_or_default(),
            })
            .collect(),
    };
    run.write_state(&state)
        .map_err(|source| DaemonError::State {
            path: run.state_file(),
            source,
        })?;
    eprintln!("daemon: {} guests started", cluster.len());

    let adapter_events = AdapterEvents::start(&control);
    let mut crash_boots = vec![0; cluster.len()];
    let sig = loop {
        if let Some(sig) = wait_for_stop_timeout(&signals, POLL) {
            break sig;
        }
        // A killed guest's HCA leaves the fabric, so peers' packets to it go nowhere.
        let first = spec.local_nodes().start;
        for i in control.due_kills() {
            // (A node another host runs is that host's to kill.)
            let Some(j) = i.checked_sub(first).filter(|&j| j < cluster.len()) else {
                continue;
            };
            if cluster.kill(j) {
                note_killed(&state.nodes[j]);
            }
        }
        for (i, why) in cluster.newly_stopped() {
            // A kernel that crashed on its way up (boot luck under TCG) gets another boot.
            if crash_boots[i] < cluster::BOOT_RETRIES {
                crash_boots[i] += 1;
                if cluster.boot_again_if_crashed(i, crash_boots[i]) {
                    state.nodes[i].pid = cluster.node(i).pid().unwrap_or(daemon_pid);
                    if let Err(e) = run.write_state(&state) {
                        eprintln!("daemon: cannot update {}: {e}", run.state_file().display());
                    }
                    continue;
                }
            }
            let n = &state.nodes[i];
            eprintln!("daemon: {}: guest stopped: {why}", n.name);
            append(&n.console_log, &format!("\n{GUEST_STOPPED} {why}\n"));
        }
    };
    eprintln!("daemon: signal {sig}, stopping");
    drop(adapter_events);
    let hcas = cluster.hcas();
    cluster.kill_all();
    finish_faults(run, &control, &hcas);
    // Console logs and daemon.log stay for post-mortems; sockets go.
    drop(cluster);
    let _ = std::fs::remove_file(run.state_file());
    Ok(())
}

/// The fault plan's adapter events, on a thread of their own: a hot-unplug waits for its
/// guest to release the device (up to `hotplug::RELEASE_TIMEOUT`), which must not hold up
/// the daemon's loop (kills, stopped guests, signals). The events keep their order.
struct AdapterEvents {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AdapterEvents {
    fn start(control: &std::sync::Arc<Control>) -> AdapterEvents {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, control) = (stop.clone(), control.clone());
        let thread = std::thread::Builder::new()
            .name("adapter-events".into())
            .spawn(move || {
                while !flag.load(Relaxed) {
                    for (lid, event, done) in control.planned_adapter_events() {
                        let name = event.name();
                        match done {
                            Ok(()) => eprintln!(
                                "daemon: node{lid}'s adapter: {name}, as the fault plan says"
                            ),
                            Err(e) => eprintln!(
                                "daemon: node{lid}'s adapter: the plan's {name} failed: {e}"
                            ),
                        }
                    }
                    std::thread::sleep(POLL);
                }
            });
        if let Err(e) = &thread {
            eprintln!("daemon: no thread for the fault plan's adapter events: {e}");
        }
        AdapterEvents {
            stop,
            thread: thread.ok(),
        }
    }
}

impl Drop for AdapterEvents {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn append(path: &std::path::Path, line: &str) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Starts the daemon as a background process in its own process group, logging to
/// daemon.log in the run directory.
pub fn spawn(run: &RunDir, config_file: &std::path::Path) -> io::Result<u32> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(run.path("daemon.log"))?;
    let child = std::process::Command::new(std::env::current_exe()?)
        .arg("--run-dir")
        .arg(run.dir())
        .arg("daemon")
        .arg("--config")
        .arg(config_file)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    Ok(child.id())
}
