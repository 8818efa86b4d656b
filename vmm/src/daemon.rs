//! The background process behind `hcabench up`: it owns the device server and the guests'
//! QEMU processes, records them in the run directory, and tears everything down on SIGTERM
//! or SIGINT (`hcabench down`).

use std::io;

use device_server::qemu::{Guest, GuestSpec, Image};
use device_server::{DeviceServer, NodeConfig};

use crate::config::{Backend, ClusterConfig};
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

fn wait_for_stop(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was initialised by block_stop_signals and `sig` is a valid out pointer.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

/// Which backend `auto` means here, and why.
pub fn choose_backend(requested: Backend) -> Result<(&'static str, String), String> {
    match requested {
        Backend::Qemu => Ok(("qemu", "asked for".into())),
        Backend::Auto => Ok((
            "qemu",
            match hcabench::kvm::check_kvm() {
                hcabench::kvm::KvmCheck::Usable => "auto: KVM is usable here, but the rust-vmm \
                     backend cannot boot Linux yet (issue 6), so QEMU with TCG"
                    .into(),
                hcabench::kvm::KvmCheck::Unusable(why) => {
                    format!("auto: KVM cannot run a Linux guest here ({why}), so QEMU with TCG")
                }
            },
        )),
        Backend::Kvm => Err(
            "backend \"kvm\": the rust-vmm VMM runs only its bare-metal test \
             guest so far (no Linux boot yet); use backend = \"qemu\" or \"auto\""
                .into(),
        ),
    }
}

pub fn run(run: &RunDir, cfg: &ClusterConfig) -> Result<(), String> {
    let signals = block_stop_signals();
    let (backend, why) = choose_backend(cfg.backend)?;
    eprintln!("daemon: backend {backend} ({why})");
    let image = Image::find(&cfg.image_dir)?;
    let nodes = NodeConfig::cluster(run.dir(), cfg.nodes, cfg.memory_mib << 20);
    for n in &nodes {
        let _ = std::fs::remove_file(&n.socket);
    }
    let server = DeviceServer::start(nodes.clone()).map_err(|e| e.to_string())?;
    let mut guests = Vec::new();
    let mut state = ClusterState {
        // SAFETY: getpid has no preconditions.
        daemon_pid: unsafe { libc::getpid() } as u32,
        backend: backend.into(),
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
            net: None,
        };
        let g = Guest::spawn(&spec).map_err(|e| format!("cannot start QEMU: {e}"))?;
        state.nodes.push(NodeState {
            name: node.name.clone(),
            lid: (i + 1) as u16,
            qemu_pid: g.pid(),
            console_log: spec.console_log.clone(),
            console_socket: spec.console_socket.clone().unwrap_or_default(),
        });
        guests.push(g);
    }
    run.write_state(&state)
        .map_err(|e| format!("cannot write {}: {e}", run.state_file().display()))?;
    eprintln!("daemon: {} guests started", guests.len());

    let sig = wait_for_stop(&signals);
    eprintln!("daemon: signal {sig}, stopping");
    for g in &mut guests {
        g.kill();
    }
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
