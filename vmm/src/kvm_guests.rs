//! Linux guests in hcabench's own VMM for the harness: N machines in this process on one
//! fabric, each booted with the agent job and its console on a socket, behind
//! [`BootedGuest`], so that the verbs and DSM harness ([`Testbed`]) drives them exactly as it
//! drives QEMU guests.

use std::path::PathBuf;
use std::time::Duration;

use device_server::qemu::{kernel_cmdline, wait_for_line, BootedGuest, Image};
use device_server::verbs::Testbed;
use hca_model::{Fabric, Hca};

use crate::kvm::linux::LinuxBoot;
use crate::kvm::machine::{Machine, MachineConfig};

/// One node's guest under the VMM.
pub struct NodeSpec<'a> {
    pub name: &'a str,
    pub lid: hca_model::Lid,
    pub ram_mib: u64,
    pub vcpus: u32,
    /// `hcabench.cmd=` for the guest's init (`shell`, `agent`).
    pub cmd: &'a str,
    pub kernel_args: &'a str,
    pub console_log: PathBuf,
    pub console_socket: PathBuf,
    /// Host PCI functions passed through (the `vfio` feature).
    pub vfio: Vec<PathBuf>,
}

/// Builds the node's machine on `fabric`, loads the guest image's kernel and initramfs with
/// the node's command line, and starts its vCPUs: every KVM cluster starts its guests here.
pub fn start_node(
    kvm: &kvm_ioctls::Kvm,
    image: &Image,
    node: NodeSpec,
    fabric: &Fabric,
) -> Result<Machine, String> {
    let vcpus = u8::try_from(node.vcpus).map_err(|_| format!("{} vCPUs: too many", node.vcpus))?;
    let mut machine = Machine::new(
        kvm,
        MachineConfig {
            name: node.name.to_string(),
            lid: node.lid,
            ram_bytes: (node.ram_mib << 20) as usize,
            vcpus,
            serial_log: Some(node.console_log),
            console_socket: Some(node.console_socket),
            vfio: node.vfio,
        },
        fabric,
    )?;
    machine.load_linux(&LinuxBoot {
        kernel: image.bzimage.clone(),
        initramfs: Some(image.initramfs.clone()),
        cmdline: kernel_cmdline(node.name, node.cmd, node.kernel_args),
    })?;
    machine.start()?;
    Ok(machine)
}

/// How many guests and of what size.
#[derive(Clone, Debug)]
pub struct KvmShape {
    pub nodes: usize,
    pub ram_mib: u64,
    pub vcpus: u32,
    /// Appended to each guest's kernel command line.
    pub kernel_args: String,
}

/// One running machine.
pub struct KvmGuest {
    name: String,
    machine: Machine,
    stopped: Option<String>,
}

/// Why the guest stopped on its own, if it did (the vCPU's error); remembered in `stopped`.
fn check_stopped<'a>(machine: &mut Machine, stopped: &'a mut Option<String>) -> Option<&'a str> {
    if stopped.is_none() && !machine.running() {
        *stopped = Some(match machine.stop() {
            Ok(o) => format!("it stopped (exit code {:?})", o.exit_code),
            Err(e) => e.lines().next().unwrap_or_default().to_string(),
        });
    }
    stopped.as_deref()
}

impl BootedGuest for KvmGuest {
    fn name(&self) -> &str {
        &self.name
    }

    fn console(&self) -> String {
        self.machine.serial_text()
    }

    fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<(String, Duration), String> {
        let (machine, stopped) = (&mut self.machine, &mut self.stopped);
        let console = machine.serial_reader();
        let mut why = || check_stopped(machine, stopped).map(str::to_string);
        let line = wait_for_line(&self.name, "KVM guest", prefix, timeout, &console, &mut why)?;
        Ok((line, self.machine.uptime()))
    }

    fn pid(&self) -> Option<u32> {
        None
    }

    fn is_running(&mut self) -> bool {
        check_stopped(&mut self.machine, &mut self.stopped).is_none()
    }

    fn kill(&mut self) {
        if self.stopped.is_none() {
            let _ = self.machine.stop();
            self.stopped = Some("killed".into());
        }
        self.machine.hca().detach();
    }

    fn hca(&self) -> Option<Hca> {
        Some(self.machine.hca().clone())
    }
}

/// Boots `shape.nodes` Linux guests (node1, node2, ...) in this process on `fabric`, their
/// consoles logged to `dir/<node>.console` and served on `dir/<node>.serial`, and connects to
/// their shells.
pub fn boot(
    kvm: &kvm_ioctls::Kvm,
    image: &Image,
    dir: PathBuf,
    shape: &KvmShape,
    fabric: &Fabric,
    boot_timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Testbed, String> {
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut guests: Vec<Box<dyn BootedGuest>> = Vec::new();
    for i in 0..shape.nodes {
        let name = format!("node{}", i + 1);
        progress(&format!("starting {name} (hcabench's VMM)"));
        let node = NodeSpec {
            name: &name,
            lid: (i + 1) as u16,
            ram_mib: shape.ram_mib,
            vcpus: shape.vcpus,
            cmd: "agent",
            kernel_args: &shape.kernel_args,
            console_log: dir.join(format!("{name}.console")),
            console_socket: dir.join(format!("{name}.serial")),
            vfio: Vec::new(),
        };
        let machine = start_node(kvm, image, node, fabric)?;
        guests.push(Box::new(KvmGuest {
            name,
            machine,
            stopped: None,
        }));
    }
    Testbed::from_guests(guests, dir, Some(fabric.clone()), boot_timeout, progress)
}
