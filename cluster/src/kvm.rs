//! Linux guests in hcabench's own VMM (the `vmm` crate): one [`vmm::machine::Machine`] per
//! node, every machine of a cluster in this process with its HCA on one fabric.

use std::path::PathBuf;
use std::time::Duration;

use hca_model::{Fabric, Hca};
use vmm::linux::LinuxBoot;
use vmm::machine::{DiskConfig, Machine, MachineConfig};

use crate::node::{wait_for_line, Node, WaitError};
use crate::qemu::kernel_cmdline;
use crate::{Image, StartError, USERLAND_SERIAL};

/// One node's guest under the VMM.
pub struct KvmNodeSpec<'a> {
    pub name: &'a str,
    pub lid: hca_model::Lid,
    pub ram_mib: u64,
    pub vcpus: u32,
    /// `hcabench.cmd=` for the guest's init (`shell`, `agent`).
    pub cmd: &'a str,
    pub kernel_args: &'a str,
    pub console_log: PathBuf,
    pub console_socket: Option<PathBuf>,
    /// The second serial port's (COM2, the guest's ttyS1) socket: `hcabench exec`'s channel.
    pub agent_socket: Option<PathBuf>,
    /// Host PCI functions passed through (the `vfio` feature).
    pub vfio: Vec<PathBuf>,
    /// What its HCA may hold for requests in flight, bytes.
    pub in_flight_budget: usize,
    /// Its NIC on the cluster's Ethernet segment, if the guests have NICs.
    pub nic: Option<vmm::virtio_net::NicConfig>,
}

/// One running machine.
pub struct KvmNode {
    name: String,
    machine: Machine,
    stopped: Option<String>,
}

impl KvmNode {
    /// Builds the node's machine on `fabric` (with the image's userland disk, where it has
    /// one, as a read-only virtio disk), loads the guest image's kernel and initramfs with
    /// the node's command line, and starts its vCPUs.
    pub fn start(
        kvm: &kvm_ioctls::Kvm,
        image: &Image,
        node: KvmNodeSpec,
        fabric: &Fabric,
    ) -> Result<KvmNode, StartError> {
        let vcpus = u8::try_from(node.vcpus).map_err(|_| StartError::Vcpus(node.vcpus))?;
        let mut machine = Machine::new(
            kvm,
            MachineConfig {
                name: node.name.to_string(),
                lid: node.lid,
                ram_bytes: (node.ram_mib << 20) as usize,
                vcpus,
                serial_log: Some(node.console_log),
                console_socket: node.console_socket,
                agent_socket: node.agent_socket,
                vfio: node.vfio,
                disks: (image.userland.iter())
                    .map(|path| DiskConfig {
                        path: path.clone(),
                        serial: USERLAND_SERIAL.to_string(),
                    })
                    .collect(),
                nic: node.nic,
            },
            fabric,
        )?;
        machine.hca().set_in_flight_budget(node.in_flight_budget);
        machine.load_linux(&LinuxBoot {
            kernel: image.bzimage.clone(),
            initramfs: Some(image.initramfs.clone()),
            cmdline: kernel_cmdline(node.name, node.cmd, node.kernel_args),
        })?;
        machine.start()?;
        Ok(KvmNode {
            name: node.name.to_string(),
            machine,
            stopped: None,
        })
    }
}

/// Why the guest stopped on its own, if it did (the vCPU's error); remembered in `stopped`.
fn check_stopped<'a>(machine: &mut Machine, stopped: &'a mut Option<String>) -> Option<&'a str> {
    if stopped.is_none() && !machine.running() {
        *stopped = Some(match machine.stop() {
            Ok(o) => format!("it stopped (exit code {:?})", o.exit_code),
            Err(e) => e.to_string().lines().next().unwrap_or_default().to_string(),
        });
    }
    stopped.as_deref()
}

impl Node for KvmNode {
    fn name(&self) -> &str {
        &self.name
    }

    fn console(&self) -> String {
        self.machine.serial_text()
    }

    fn wait_line(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<(String, Duration), WaitError> {
        let (machine, stopped) = (&mut self.machine, &mut self.stopped);
        let console = machine.serial_reader();
        let mut why = || check_stopped(machine, stopped).map(str::to_string);
        let line = wait_for_line(&self.name, "KVM guest", prefix, timeout, &console, &mut why)?;
        Ok((line, self.machine.uptime()))
    }

    fn pid(&self) -> Option<u32> {
        None
    }

    fn stopped(&mut self) -> Option<String> {
        check_stopped(&mut self.machine, &mut self.stopped).map(str::to_string)
    }

    fn kill(&mut self) {
        if self.stopped.is_none() {
            let _ = self.machine.stop();
            self.stopped = Some("killed".into());
        }
        self.machine.hca().detach();
    }

    fn hca(&self) -> Option<Hca> {
        self.stopped.is_none().then(|| self.machine.hca().clone())
    }
}
