//! Starting QEMU guests wired to a device server, and reading their consoles.
//!
//! Each guest boots the image `images/build.py` made (the ELF vmlinux through PVH, the
//! initramfs), has its RAM in a shared file the device server maps, and its HCA as an
//! ivshmem-doorbell device on the node's socket. Its serial console goes to a log file; the
//! guest's init prints lines of [`crate::console_protocol`] that callers wait for.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hca_model::abi::NUM_VECTORS;

use crate::NodeConfig;

pub const QEMU: &str = "qemu-system-x86_64";

/// A built guest image.
#[derive(Clone, Debug)]
pub struct Image {
    pub kernel_version: String,
    pub vmlinux: PathBuf,
    /// Debian's compressed kernel as shipped (the KVM backend boots it).
    pub bzimage: PathBuf,
    pub initramfs: PathBuf,
}

impl Image {
    /// The image `images/build.py` last built under `dir` (default target/images).
    pub fn find(dir: &Path) -> Result<Image, String> {
        let how = "build it with: python3 images/build.py";
        let ver = fs::read_to_string(dir.join("current"))
            .map_err(|_| format!("no guest image in {} ({how})", dir.display()))?;
        let ver = ver.trim().to_string();
        let img = Image {
            vmlinux: dir.join(&ver).join("vmlinux"),
            bzimage: dir.join(&ver).join("bzImage"),
            initramfs: dir.join(&ver).join("initramfs.cpio.gz"),
            kernel_version: ver,
        };
        if !img.vmlinux.exists() || !img.bzimage.exists() || !img.initramfs.exists() {
            return Err(format!(
                "guest image {} is incomplete ({how})",
                img.kernel_version
            ));
        }
        Ok(img)
    }
}

/// Whether QEMU can be run here; the error says how to install it.
pub fn qemu_available() -> Result<(), String> {
    match Command::new(QEMU).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(format!(
            "{QEMU} not found: install it with `sudo apt-get install -y qemu-system-x86`"
        )),
    }
}

/// A guest's kernel command line: the serial console, node identity and job for its init
/// (images/init.sh), then `extra`. The same under every backend.
pub fn kernel_cmdline(node: &str, cmd: &str, extra: &str) -> String {
    format!("console=ttyS0 panic=-1 hcabench.node={node} hcabench.cmd={cmd} {extra}")
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
    /// `hcabench.cmd=` for the guest's init.
    pub cmd: String,
    /// More kernel command-line parameters (may be empty).
    pub kernel_args: String,
    /// A virtio-net NIC on a unix stream socket shared with one other guest (for SoftRoCE).
    pub net: Option<NetSpec>,
}

/// One end of a point-to-point Ethernet link between two guests: a unix stream socket that
/// one guest listens on and the other connects to (loopback only, no bridge, no root).
#[derive(Clone, Debug)]
pub struct NetSpec {
    pub socket: PathBuf,
    pub listen: bool,
    pub mac: String,
}

impl GuestSpec {
    pub fn command(&self) -> Command {
        let n = &self.node;
        let mib = n.ram_size >> 20;
        let mut c = Command::new(QEMU);
        let accel = if self.kvm { "kvm" } else { "tcg" };
        c.args(["-machine", &format!("q35,accel={accel},memory-backend=ram")])
            .args(["-cpu", if self.kvm { "host" } else { "max" }])
            .args(["-smp", &self.vcpus.to_string(), "-m", &format!("{mib}M")])
            .args(["-nodefaults", "-no-reboot", "-display", "none"])
            .args([
                "-object",
                &format!(
                    "memory-backend-file,id=ram,size={mib}M,mem-path={},share=on",
                    n.ram_path.display()
                ),
            ])
            .args([
                "-chardev",
                &format!("socket,path={},id=hca", n.socket.display()),
            ])
            .args([
                "-device",
                &format!("ivshmem-doorbell,chardev=hca,vectors={NUM_VECTORS}"),
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
        if let Some(net) = &self.net {
            c.args([
                "-netdev",
                &format!(
                    "stream,id=net0,server={},addr.type=unix,addr.path={}",
                    if net.listen { "on" } else { "off" },
                    net.socket.display()
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

/// The newline-terminated lines of `text`, without their line ends.
pub fn complete_lines(text: &str) -> Vec<String> {
    let done = text.rfind('\n').map_or("", |end| &text[..end]);
    done.lines().map(|l| l.trim_end().to_string()).collect()
}

/// A booted guest, whatever hosts it (a QEMU process, or a VM in hcabench's own VMM): what
/// the harness needs of it.
pub trait BootedGuest: Send {
    fn name(&self) -> &str;
    /// The serial console so far.
    fn console(&self) -> String;
    /// The console's complete lines so far.
    fn console_lines(&self) -> Vec<String> {
        complete_lines(&self.console())
    }
    /// Waits for a console line starting with `prefix`; returns it and when it came (time
    /// since the guest started). Fails on timeout or if the guest stops first.
    fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<(String, Duration), String>;
    /// The guest's own host process, where it has one (QEMU's).
    fn pid(&self) -> Option<u32>;
    fn is_running(&mut self) -> bool;
    /// Stops the guest at once (as a crash would); its HCA leaves the fabric.
    fn kill(&mut self);
    /// The guest's HCA where the guest's host holds it (None: the device server does).
    fn hca(&self) -> Option<hca_model::Hca> {
        None
    }
}

/// Polls `console` until a complete line starts with `prefix` (the line), `stopped` says
/// why the guest stopped, or `timeout` passes; `who` and `host` name the guest in errors.
pub fn wait_for_line(
    who: &str,
    host: &str,
    prefix: &str,
    timeout: Duration,
    console: &dyn Fn() -> String,
    stopped: &mut dyn FnMut() -> Option<String>,
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(l) = complete_lines(&console())
            .into_iter()
            .find(|l| l.starts_with(prefix))
        {
            return Ok(l);
        }
        if let Some(why) = stopped() {
            return Err(format!(
                "{who}: {host} stopped before `{prefix}`: {why}; console:\n{}",
                console()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{who}: no `{prefix}` on the console within {timeout:?} ({host}); console so \
                 far:\n{}",
                console()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running QEMU guest.
pub struct Guest {
    pub name: String,
    child: Child,
    console: PathBuf,
    started: Instant,
}

impl Guest {
    pub fn spawn(spec: &GuestSpec) -> io::Result<Guest> {
        let _ = fs::remove_file(&spec.console_log);
        let child = spec
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        Ok(Guest {
            name: spec.node.name.clone(),
            child,
            console: spec.console_log.clone(),
            started: Instant::now(),
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
    ) -> Result<(String, Duration), String> {
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

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stops the guest at once (as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl BootedGuest for Guest {
    fn name(&self) -> &str {
        &self.name
    }

    fn console(&self) -> String {
        Guest::console(self)
    }

    fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Result<(String, Duration), String> {
        Guest::wait_line(self, prefix, timeout)
    }

    fn pid(&self) -> Option<u32> {
        Some(Guest::pid(self))
    }

    fn is_running(&mut self) -> bool {
        Guest::is_running(self)
    }

    fn kill(&mut self) {
        Guest::kill(self)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_line_still_being_written_is_not_a_line_yet() {
        assert_eq!(
            complete_lines("a\nHCABENCH-PROBE HCA found lid=1 por"),
            vec!["a"]
        );
        assert_eq!(complete_lines("a\r\nb\n"), vec!["a", "b"]);
        assert!(complete_lines("no newline").is_empty());
    }
}
