//! The background process behind `hcabench up`: under the QEMU backend it owns the device
//! server and the guests' QEMU processes; under the KVM backend it runs every guest and HCA
//! itself (one fabric in its process). It records the nodes in the run directory and tears
//! everything down on SIGTERM or SIGINT (`hcabench down`).

use std::io;
use std::time::Duration;

use device_server::qemu::{Guest, GuestSpec, Image};
use device_server::{DeviceServer, NodeConfig};

use crate::config::{Backend, ClusterConfig, Host};
use crate::control::Control;
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

/// Which backend `auto` means here, and why; `kvm` where KVM cannot run Linux is an error.
pub fn choose_backend(requested: Backend) -> Result<(Host, String), String> {
    use hcabench::kvm::{check_kvm, KvmCheck};
    match requested {
        Backend::Qemu => Ok((Host::Qemu, "asked for".into())),
        Backend::Kvm => match check_kvm() {
            KvmCheck::Usable => Ok((Host::Kvm, "asked for".into())),
            KvmCheck::Unusable(why) => Err(format!(
                "backend kvm: KVM cannot run a Linux guest here ({why}); use --backend qemu \
                 or auto"
            )),
        },
        Backend::Auto => Ok(match check_kvm() {
            KvmCheck::Usable => (
                Host::Kvm,
                "auto: KVM runs guests at native speed here, so hcabench's own VMM".into(),
            ),
            KvmCheck::Unusable(why) => (
                Host::Qemu,
                format!("auto: KVM cannot run a Linux guest here ({why}), so QEMU with TCG"),
            ),
        }),
    }
}

/// What to tell a user whose guest did not reach userspace under hcabench's VMM in time:
/// what happened, then what to do.
pub fn kvm_boot_advice(err: &str, timeout: Duration) -> String {
    format!(
        "{err}\n\nhcabench's VMM (KVM) did not bring this guest to userspace (it stopped, or \
         the {}s limit passed). \
         Linux needs a few seconds there on hardware KVM; nested or heavily loaded KVM can be \
         far slower. What to do: run the same command with --backend qemu (QEMU, which needs \
         no KVM), or give KVM longer with --timeout; the kernel's own lines above show where \
         it stopped (add kernel_args = \"earlyprintk=serial,ttyS0\" to a cluster file for \
         the earliest ones).",
        timeout.as_secs()
    )
}

/// The cluster's fault plan and capture on `fabric`, if it has them, and the control
/// socket for live faults; the log and report of an earlier run go.
fn attach_fabric_tools(
    run: &RunDir,
    cfg: &ClusterConfig,
    fabric: &hca_model::Fabric,
) -> Result<std::sync::Arc<Control>, String> {
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
    let control = Control::new(fabric.clone(), hook, run.path(LOG), cfg.nodes);
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

/// The line the KVM daemon appends to a node's console log when its guest stops (a vCPU
/// failed, the guest shut down); `hcabench up` and `status` look for it.
pub const GUEST_STOPPED: &str = "[hcabench] guest stopped:";

pub fn run(run: &RunDir, cfg: &ClusterConfig) -> Result<(), String> {
    let signals = block_stop_signals();
    let (backend, why) = choose_backend(cfg.backend)?;
    eprintln!("daemon: backend {backend} ({why})");
    let image = Image::find(&cfg.image_dir)?;
    if backend == Host::Kvm {
        return run_kvm(run, cfg, &image, &signals);
    }
    let nodes = NodeConfig::cluster(run.dir(), cfg.nodes, cfg.memory_mib << 20);
    for n in &nodes {
        let _ = std::fs::remove_file(&n.socket);
    }
    let server = DeviceServer::start(nodes.clone()).map_err(|e| e.to_string())?;
    let control = attach_fabric_tools(run, cfg, server.fabric())?;
    let mut guests = Vec::new();
    let mut state = ClusterState {
        // SAFETY: getpid has no preconditions.
        daemon_pid: unsafe { libc::getpid() } as u32,
        backend: backend.to_string(),
        kernel: image.kernel_version.clone(),
        config: cfg.clone(),
        nodes: Vec::new(),
    };
    for (i, node) in nodes.iter().enumerate() {
        let spec = GuestSpec {
            node: node.clone(),
            image: image.clone(),
            vcpus: cfg.vcpus,
            kvm: false,
            console_log: run.path(&format!("{}.console", node.name)),
            console_socket: Some(run.path(&format!("{}.serial", node.name))),
            cmd: "shell".into(),
            kernel_args: cfg.kernel_args.clone(),
            net: None,
        };
        let g = Guest::spawn(&spec).map_err(|e| format!("cannot start QEMU: {e}"))?;
        state.nodes.push(NodeState {
            name: node.name.clone(),
            lid: (i + 1) as u16,
            pid: g.pid(),
            console_log: spec.console_log.clone(),
            console_socket: spec.console_socket.clone().unwrap_or_default(),
        });
        guests.push(g);
    }
    run.write_state(&state)
        .map_err(|e| format!("cannot write {}: {e}", run.state_file().display()))?;
    eprintln!("daemon: {} guests started", guests.len());

    let sig = loop {
        if let Some(sig) = wait_for_stop_timeout(&signals, POLL) {
            break sig;
        }
        // A killed guest's QEMU goes; the device server sees its socket close and takes
        // the HCA off the fabric, so peers' packets to it go nowhere.
        for i in control.due_kills() {
            guests[i].kill();
            note_killed(&state.nodes[i]);
        }
    };
    eprintln!("daemon: signal {sig}, stopping");
    for g in &mut guests {
        g.kill();
    }
    let hcas: Vec<_> = (0..nodes.len()).filter_map(|i| server.hca(i)).collect();
    finish_faults(run, &control, &hcas);
    let _ = server.shutdown();
    let _ = std::fs::remove_file(run.state_file());
    // Console logs and daemon.log stay for post-mortems; sockets and RAM files go.
    for n in &nodes {
        let _ = std::fs::remove_file(&n.ram_path);
    }
    for n in &state.nodes {
        let _ = std::fs::remove_file(&n.console_socket);
    }
    Ok(())
}

/// The KVM backend: a machine per node, all on one fabric in this process.
fn run_kvm(
    run: &RunDir,
    cfg: &ClusterConfig,
    image: &Image,
    signals: &libc::sigset_t,
) -> Result<(), String> {
    use hcabench::kvm_guests::{start_node, NodeSpec};
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| format!("/dev/kvm: {e}"))?;
    let fabric = hca_model::Fabric::new();
    let control = attach_fabric_tools(run, cfg, &fabric)?;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let mut state = ClusterState {
        daemon_pid: pid,
        backend: Host::Kvm.to_string(),
        kernel: image.kernel_version.clone(),
        config: cfg.clone(),
        nodes: Vec::new(),
    };
    let mut machines = Vec::new();
    for i in 0..cfg.nodes {
        let name = format!("node{}", i + 1);
        let node = NodeState {
            name: name.clone(),
            lid: (i + 1) as u16,
            pid,
            console_log: run.path(&format!("{name}.console")),
            console_socket: run.path(&format!("{name}.serial")),
        };
        let spec = NodeSpec {
            name: &name,
            lid: node.lid,
            ram_mib: cfg.memory_mib,
            vcpus: cfg.vcpus,
            cmd: "shell",
            kernel_args: &cfg.kernel_args,
            console_log: node.console_log.clone(),
            console_socket: node.console_socket.clone(),
            vfio: cfg.vfio.get(&name).cloned().into_iter().collect(),
        };
        machines.push(start_node(&kvm, image, spec, &fabric)?);
        state.nodes.push(node);
    }
    run.write_state(&state)
        .map_err(|e| format!("cannot write {}: {e}", run.state_file().display()))?;
    eprintln!("daemon: {} KVM guests started", machines.len());
    let mut reported = vec![false; machines.len()];
    let sig = loop {
        if let Some(sig) = wait_for_stop_timeout(signals, POLL) {
            break sig;
        }
        for i in control.due_kills() {
            if !reported[i] {
                reported[i] = true;
                let _ = machines[i].stop();
                machines[i].hca().detach();
                note_killed(&state.nodes[i]);
            }
        }
        for ((m, n), done) in machines.iter_mut().zip(&state.nodes).zip(&mut reported) {
            if !*done && !m.running() {
                *done = true;
                let why = match m.stop() {
                    Ok(o) => format!("exit code {:?}", o.exit_code),
                    Err(e) => e.lines().next().unwrap_or_default().to_string(),
                };
                eprintln!("daemon: {}: guest stopped: {why}", n.name);
                append(&n.console_log, &format!("\n{GUEST_STOPPED} {why}\n"));
            }
        }
    };
    eprintln!("daemon: signal {sig}, stopping");
    let hcas: Vec<_> = machines.iter().map(|m| m.hca().clone()).collect();
    finish_faults(run, &control, &hcas);
    drop(machines);
    let _ = std::fs::remove_file(run.state_file());
    for n in &state.nodes {
        let _ = std::fs::remove_file(&n.console_socket);
    }
    Ok(())
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
