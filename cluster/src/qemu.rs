//! Starting QEMU guests wired to a device server, and reading their consoles.
//!
//! Each guest boots the image `images/build.py` made (the ELF vmlinux through PVH, the
//! initramfs), has its RAM in a sealed memfd the device server maps too, and its HCA as an
//! ivshmem-doorbell device on the node's socket. Its serial console goes to a log file; the
//! guest's init prints lines of [`crate::console_protocol`] that callers wait for.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use device_server::{NodeConfig, RamBacking};
use hca_model::abi::NUM_VECTORS;

use crate::hotplug::{HotplugError, Monitor, HCA_CHARDEV, HCA_DEVICE, HCA_PORT};
use crate::node::{complete_lines, wait_for_line, Node, WaitError};
use crate::{Image, USERLAND_SERIAL};

pub const QEMU: &str = "qemu-system-x86_64";

/// The CPU a TCG guest gets: QEMU's `max`, less ERMS and FSRM. With them, the kernel clears
/// and copies pages with `rep stosb`/`rep movsb`, which TCG runs one byte per iteration; without
/// them it takes its `rep stosq` and unrolled variants. Measured on the 2-core host: the
/// kernel reaches init 12% sooner (1.83 s against 2.07 s of guest time, a lone guest), and 8
/// guests are up in 17.7-22.2 s against 21.6-24.9 s (five runs each, alternating).
pub const TCG_CPU: &str = "max,-erms,-fsrm";

/// Whether QEMU can be run here.
pub fn qemu_available() -> Result<(), crate::BackendError> {
    match Command::new(QEMU).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(crate::BackendError::NoQemu),
    }
}

/// A guest's kernel command line: the serial console, node identity and job for its init
/// (images/init.sh), then `extra`. The same under every backend. `no_timer_check`: Linux
/// checks at boot that its timer interrupt arrives within a few ticks of its vCPU's time,
/// which vCPUs starved by many guests on few cores miss (6 of 64 TCG guests booting at
/// once on 2 cores here), and then panics ("IO-APIC + timer doesn't work!"); a virtual
/// machine's timer works, late. `cryptomgr.notests`: the kernel's crypto self-tests cost a
/// TCG guest about 0.3 s of a 4 s boot (8 guests booting on 2 cores: about 1 s); `extra`
/// comes later, so `cryptomgr.notests=0` in a cluster file's `kernel_args` runs them.
pub fn kernel_cmdline(node: &str, cmd: &str, extra: &str) -> String {
    format!(
        "console=ttyS0 panic=-1 no_timer_check cryptomgr.notests=1 \
         hcabench.node={node} hcabench.cmd={cmd} {extra}"
    )
    .trim_end()
    .to_string()
}

/// How to boot one node's guest.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    pub node: NodeConfig,
    pub image: Image,
    pub vcpus: u32,
    /// Use KVM instead of TCG (only where KVM can run a Linux guest).
    pub kvm: bool,
    pub console_log: PathBuf,
    /// A unix socket a user can attach to the serial console through (`hcabench console`).
    pub console_socket: Option<PathBuf>,
    /// The second serial port's socket (the guest's ttyS1): the shell job's command
    /// channel for `hcabench exec` and `cp` ([`crate::agent`]), so the console stays the
    /// user's.
    pub agent_socket: Option<PathBuf>,
    /// `hcabench.cmd=` for the guest's init.
    pub cmd: String,
    /// More kernel command-line parameters (may be empty).
    pub kernel_args: String,
    /// A virtio-net NIC on the guests' Ethernet segment (for SoftRoCE).
    pub net: Option<NetSpec>,
    /// QEMU's QMP monitor on this socket, for the HCA's hot-unplug and hot-plug
    /// ([`crate::hotplug`]).
    pub qmp_socket: Option<PathBuf>,
}

/// A guest's NIC on the guests' Ethernet segment ([`crate::ethernet`]): UDP datagrams from
/// its port of 127.0.0.1 to the segment's hub, one frame each.
#[derive(Clone, Debug)]
pub struct NetSpec {
    /// The guest's own port.
    pub local_port: u16,
    /// The hub's.
    pub remote_port: u16,
    pub mac: String,
}

impl GuestSpec {
    pub fn command(&self) -> Command {
        let n = &self.node;
        let mib = n.ram_size >> 20;
        let mut c = Command::new(QEMU);
        let accel = if self.kvm { "kvm" } else { "tcg" };
        let mem_path = match &n.ram {
            RamBacking::Memfd(f) => {
                let fd = f.as_raw_fd();
                // SAFETY: the closure runs in the child between fork and exec and calls
                // only fcntl, which is async-signal-safe; `fd` stays open in the parent
                // (the spec holds the file) until spawn returns.
                unsafe {
                    c.pre_exec(move || {
                        // The memfd is close-on-exec so that no other child gets it; this
                        // child's QEMU keeps it, and opens it as its RAM.
                        if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                PathBuf::from(format!("/proc/self/fd/{fd}"))
            }
            RamBacking::Path(p) => p.clone(),
        };
        c.args(["-machine", &format!("q35,accel={accel},memory-backend=ram")])
            .args(["-cpu", if self.kvm { "host" } else { TCG_CPU }])
            .args(["-smp", &self.vcpus.to_string(), "-m", &format!("{mib}M")])
            .args(["-nodefaults", "-no-reboot", "-display", "none"])
            .args([
                "-object",
                &format!(
                    "memory-backend-file,id=ram,size={mib}M,mem-path={},share=on",
                    mem_path.display()
                ),
            ])
            // The HCA on a PCIe root port of its own: a slot ACPI hot-plug reaches.
            .args([
                "-device",
                &format!("pcie-root-port,id={HCA_PORT},chassis=1,slot=1"),
            ])
            .args([
                "-chardev",
                &format!("socket,path={},id={HCA_CHARDEV}", n.socket.display()),
            ])
            .args([
                "-device",
                &format!(
                    "ivshmem-doorbell,chardev={HCA_CHARDEV},vectors={NUM_VECTORS},\
                     bus={HCA_PORT},id={HCA_DEVICE}"
                ),
            ])
            .arg("-kernel")
            .arg(&self.image.vmlinux)
            .arg("-initrd")
            .arg(&self.image.initramfs)
            .args([
                "-append",
                &kernel_cmdline(&n.name, &self.cmd, &self.kernel_args),
            ])
            .args([
                "-chardev",
                &self.serial_chardev(),
                "-serial",
                "chardev:serial",
            ]);
        // The second -serial is the second ISA UART: COM2, 0x2f8, IRQ 3 (ttyS1). Every
        // guest has it, as under hcabench's VMM; without a socket it leads nowhere.
        let agent = match &self.agent_socket {
            Some(sock) => format!("socket,id=agent,path={},server=on,wait=off", sock.display()),
            None => "null,id=agent".to_string(),
        };
        c.args(["-chardev", &agent, "-serial", "chardev:agent"]);
        // Every guest of the cluster reads the same file: read-only, so QEMU takes a shared
        // lock, and the host's page cache holds it once.
        if let Some(disk) = &self.image.userland {
            c.args([
                "-drive",
                &format!(
                    "file={},if=none,id=userland,format=raw,readonly=on",
                    // QEMU's option syntax: a comma in a value is written twice.
                    disk.display().to_string().replace(',', ",,")
                ),
                "-device",
                &format!("virtio-blk-pci,drive=userland,serial={USERLAND_SERIAL}"),
            ]);
        }
        if let Some(qmp) = &self.qmp_socket {
            c.args([
                "-qmp",
                &format!("unix:{},server=on,wait=off", qmp.display()),
            ]);
        }
        if let Some(net) = &self.net {
            c.args([
                "-netdev",
                &format!(
                    "dgram,id=net0,local.type=inet,local.host=127.0.0.1,local.port={},\
                     remote.type=inet,remote.host=127.0.0.1,remote.port={}",
                    net.local_port, net.remote_port
                ),
                "-device",
                &format!("virtio-net-pci,netdev=net0,mac={}", net.mac),
            ]);
        }
        c
    }

    /// The serial console: always logged to `console_log`; also a socket when asked for.
    fn serial_chardev(&self) -> String {
        let log = self.console_log.display();
        match &self.console_socket {
            Some(sock) => format!(
                "socket,id=serial,path={},server=on,wait=off,logfile={log}",
                sock.display()
            ),
            None => format!("file,id=serial,path={log}"),
        }
    }
}

/// A running QEMU guest.
pub struct QemuNode {
    pub name: String,
    /// How it was started, to start it again ([`Node::boot_again`]).
    spec: GuestSpec,
    child: Child,
    console: PathBuf,
    started: Instant,
    monitor: Option<Monitor>,
    hca_socket: PathBuf,
}

impl QemuNode {
    pub fn spawn(spec: &GuestSpec) -> io::Result<QemuNode> {
        let _ = fs::remove_file(&spec.console_log);
        let child = spec
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(QemuNode {
            name: spec.node.name.clone(),
            spec: spec.clone(),
            child,
            console: spec.console_log.clone(),
            started: Instant::now(),
            monitor: (spec.qmp_socket.clone()).map(|p| Monitor::new(&spec.node.name, p)),
            hca_socket: spec.node.socket.clone(),
        })
    }

    /// The console so far.
    pub fn console(&self) -> String {
        fs::read(&self.console)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The console's complete lines so far: QEMU may be half-way through writing the last.
    pub fn console_lines(&self) -> Vec<String> {
        complete_lines(&self.console())
    }

    /// Waits for a console line starting with `prefix`; returns it and when it came (time
    /// since spawn). Fails on timeout or if QEMU exits first, with QEMU's own words.
    pub fn wait_line(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<(String, Duration), WaitError> {
        let (child, path) = (&mut self.child, &self.console);
        let console = || {
            fs::read(path)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let mut stopped = || {
            let status = child.try_wait().ok().flatten()?;
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = io::Read::read_to_string(&mut e, &mut err);
            }
            Some(format!("QEMU exited ({status}): {}", err.trim()))
        };
        let line = wait_for_line(&self.name, "QEMU", prefix, timeout, &console, &mut stopped)?;
        Ok((line, self.started.elapsed()))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the guest at once (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node for QemuNode {
    fn name(&self) -> &str {
        &self.name
    }

    fn console(&self) -> String {
        QemuNode::console(self)
    }

    fn wait_line(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<(String, Duration), WaitError> {
        QemuNode::wait_line(self, prefix, timeout)
    }

    fn pid(&self) -> Option<u32> {
        Some(QemuNode::pid(self))
    }

    fn stopped(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        Some(format!("QEMU exited ({status})"))
    }

    fn unplug_hca(&mut self) -> Result<(), HotplugError> {
        match &mut self.monitor {
            Some(m) => m.unplug_hca(),
            None => Err(HotplugError::Unsupported {
                node: self.name.clone(),
            }),
        }
    }

    fn replug_hca(&mut self) -> Result<(), HotplugError> {
        match &mut self.monitor {
            Some(m) => m.replug_hca(&self.hca_socket, NUM_VECTORS),
            None => Err(HotplugError::Unsupported {
                node: self.name.clone(),
            }),
        }
    }

    fn kill(&mut self) {
        QemuNode::kill(self)
    }

    fn boot_again(&mut self, attempt: u32) -> io::Result<Option<PathBuf>> {
        self.kill();
        let mut kept = self.console.clone().into_os_string();
        kept.push(format!(".crash{attempt}"));
        let kept = PathBuf::from(kept);
        fs::rename(&self.console, &kept)?;
        *self = QemuNode::spawn(&self.spec)?;
        Ok(Some(kept))
    }
}

impl Drop for QemuNode {
    fn drop(&mut self) {
        self.kill();
    }
}
