//! PCI hot-unplug and hot-plug of a QEMU guest's HCA (`hcabench fault NODE unplug|replug`),
//! through the guest's QMP monitor.
//!
//! The HCA (QEMU's ivshmem-doorbell) sits on a PCIe root port of its own, where q35's ACPI
//! hot-plug reaches it: `device_del` asks the guest's kernel to let it go (hca_ib's remove
//! runs, as for any unplugged adapter) and QEMU says `DEVICE_DELETED` once it did. Then
//! the device's link to the device server closes, which ends the HCA's session there: its
//! port leaves the fabric, as an unplugged adapter's does. `replug` connects a new link,
//! for which the device server makes a new HCA at the same LID, and plugs a new device
//! into the same slot; the guest's kernel probes it.
//!
//! QEMU 7.2's ivshmem, without KVM's irqfds, watches its interrupt eventfds with fd handlers
//! that its unplug leaves registered after closing the fds: a later fd that takes one of
//! those numbers and becomes readable runs the freed device's handler, and QEMU dies
//! (SIGSEGV in `object_dynamic_cast_assert` from `aio_dispatch`; seen here on replugs, the
//! new link's socket or eventfds having taken those numbers). So `unplug` fills every number
//! the device freed with a pipe end QEMU holds both ends of (QMP `add-fd`), which never
//! becomes readable: the stale handlers stay, harmless, and the new device's fds take other
//! numbers. It finds the freed numbers in QEMU's `/proc/PID/fd`, QEMU's pid being the peer
//! of the monitor socket. One session per guest is kept from the first request on
//! ([`Monitor`]).

use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// QEMU's ids of the HCA's device, its root port and its link to the device server.
pub const HCA_DEVICE: &str = "hca0";
pub const HCA_PORT: &str = "hcaport";
pub const HCA_CHARDEV: &str = "hca";

/// How long `unplug` waits for the guest to release the device. ACPI hot-plug takes a TCG
/// guest well under a second; a guest whose kernel hangs in its driver's remove never
/// releases it.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// At most this many pipes fill the numbers an unplug freed (the device holds about ten).
const MAX_FILL_PIPES: usize = 64;

/// Where node `name` of a cluster in `dir` has its QEMU monitor.
pub fn qmp_socket(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.qmp"))
}

/// Where node `name` of a cluster in `dir` links its HCA to the device server.
pub fn hca_socket(dir: &Path, name: &str) -> PathBuf {
    device_server::NodeConfig::cluster_socket(dir, name)
}

/// Why a hot-plug request failed.
#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    /// The guest has no QEMU monitor (hcabench's VMM has no PCI hot-plug).
    #[error("{node} has no QEMU monitor: PCI hot-plug needs the qemu backend")]
    Unsupported { node: String },
    #[error("cannot reach {node}'s QEMU monitor at {}: {source}", .path.display())]
    Connect {
        node: String,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{node}'s QEMU monitor: {source}")]
    Io { node: String, source: io::Error },
    #[error("{node}'s QEMU monitor refused {command}: {desc}")]
    Refused {
        node: String,
        command: &'static str,
        desc: String,
    },
    #[error("{node}'s guest refused to release its HCA (QEMU: DEVICE_UNPLUG_GUEST_ERROR)")]
    GuestRefused { node: String },
    #[error("{node}'s HCA is unplugged already")]
    Unplugged { node: String },
    #[error("{node}'s HCA is plugged in already")]
    Plugged { node: String },
    #[error(
        "{node}'s guest did not release its HCA in {} s (its kernel ejects it through ACPI \
         PCI hot-plug; is it hung in a driver's remove?)",
        RELEASE_TIMEOUT.as_secs()
    )]
    NotReleased { node: String },
}

/// One QMP session: commands in, replies and events out, a line each.
struct Qmp {
    node: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// DEVICE_DELETED events read while waiting for a command's reply.
    deleted: Vec<Value>,
    /// The id of the last command sent: a reply to an earlier one (whose wait timed out)
    /// is skipped, so the session outlives a timeout.
    id: u64,
    /// QEMU's pid: the monitor socket's peer.
    pid: Option<i32>,
}

impl Qmp {
    fn connect(node: &str, path: &Path) -> Result<Qmp, HotplugError> {
        let stream = UnixStream::connect(path).map_err(|source| HotplugError::Connect {
            node: node.to_string(),
            path: path.to_path_buf(),
            source,
        })?;
        let io = |source| HotplugError::Io {
            node: node.to_string(),
            source,
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        let pid = crate::peer_cred(&stream).map(|c| c.pid).filter(|&p| p > 0);
        let mut q = Qmp {
            node: node.to_string(),
            reader: BufReader::new(stream.try_clone().map_err(io)?),
            writer: stream,
            deleted: Vec::new(),
            id: 0,
            pid,
        };
        q.read()?; // the greeting
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn io(&self, source: io::Error) -> HotplugError {
        HotplugError::Io {
            node: self.node.clone(),
            source,
        }
    }

    fn read(&mut self) -> Result<Value, HotplugError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(self.io(io::ErrorKind::UnexpectedEof.into())),
            Ok(_) => serde_json::from_str(&line).map_err(|e| self.io(io::Error::other(e))),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Runs `command`; its `return` value, or `Refused` with QEMU's words.
    fn execute(&mut self, command: &'static str, args: Value) -> Result<Value, HotplugError> {
        self.id += 1;
        let msg = json!({ "execute": command, "arguments": args, "id": self.id });
        writeln!(self.writer, "{msg}").map_err(|e| self.io(e))?;
        self.reply(command)
    }

    /// Runs `command` with `fd` passed alongside it (SCM_RIGHTS), as `add-fd` takes one.
    fn execute_with_fd(&mut self, command: &'static str, fd: RawFd) -> Result<Value, HotplugError> {
        self.id += 1;
        let msg = format!("{}\n", json!({ "execute": command, "id": self.id }));
        let sent = self
            .writer
            .send_with_fds(&[msg.as_bytes()], &[fd])
            .map_err(|e| self.io(io::Error::from_raw_os_error(e.errno())))?;
        if sent != msg.len() {
            self.writer
                .write_all(&msg.as_bytes()[sent..])
                .map_err(|e| self.io(e))?;
        }
        self.reply(command)
    }

    /// The reply to the last command sent.
    fn reply(&mut self, command: &'static str) -> Result<Value, HotplugError> {
        loop {
            let v = self.read()?;
            if v.get("event").is_none() && v["id"] != self.id {
                continue; // the late reply to an earlier command
            }
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let desc = e["desc"].as_str().unwrap_or("no reason given").to_string();
                return Err(HotplugError::Refused {
                    node: self.node.clone(),
                    command,
                    desc,
                });
            }
            if matches!(
                v["event"].as_str(),
                Some("DEVICE_DELETED" | "DEVICE_UNPLUG_GUEST_ERROR")
            ) {
                self.deleted.push(v);
            }
        }
    }

    /// Waits until QEMU says it deleted device `id`, or `timeout` passed: whether it did.
    fn wait_deleted(&mut self, id: &str, timeout: Duration) -> Result<bool, HotplugError> {
        let about = |v: &Value, event: &str| v["event"] == event && v["data"]["device"] == id;
        let refused = |node: &str| HotplugError::GuestRefused {
            node: node.to_string(),
        };
        for v in std::mem::take(&mut self.deleted) {
            if about(&v, "DEVICE_DELETED") {
                return Ok(true);
            }
            if about(&v, "DEVICE_UNPLUG_GUEST_ERROR") {
                return Err(refused(&self.node));
            }
        }
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            match self.read() {
                Ok(v) if about(&v, "DEVICE_DELETED") => return Ok(true),
                Ok(v) if about(&v, "DEVICE_UNPLUG_GUEST_ERROR") => return Err(refused(&self.node)),
                Ok(_) => {}
                Err(HotplugError::Io { source, .. })
                    if matches!(
                        source.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

/// A guest's QEMU monitor, connected at the first request and kept (see the module's
/// words on why).
pub struct Monitor {
    node: String,
    path: PathBuf,
    session: Option<Qmp>,
}

impl Monitor {
    pub fn new(node: &str, path: PathBuf) -> Monitor {
        Monitor {
            node: node.to_string(),
            path,
            session: None,
        }
    }

    fn session(&mut self) -> Result<&mut Qmp, HotplugError> {
        if self.session.is_none() {
            self.session = Some(Qmp::connect(&self.node, &self.path)?);
        }
        Ok(self.session.as_mut().expect("connected above"))
    }

    /// Runs `f` on the session; a session that broke (not one that timed out: replies
    /// carry ids) is dropped, for the next request to connect anew.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut Qmp) -> Result<T, HotplugError>,
    ) -> Result<T, HotplugError> {
        let r = f(self.session()?);
        if let Err(HotplugError::Io { source, .. }) = &r {
            let timed_out = matches!(
                source.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            );
            if !timed_out {
                self.session = None;
            }
        }
        r
    }

    /// Unplugs the HCA; returns once the guest released it and its port left the fabric.
    pub fn unplug_hca(&mut self) -> Result<(), HotplugError> {
        let node = self.node.clone();
        self.with(|q| unplug(&node, q))
    }

    /// Plugs a new HCA into the slot, linked to the device server at `hca_socket`, with
    /// `vectors` MSI-X vectors; the guest's kernel probes it.
    pub fn replug_hca(&mut self, hca_socket: &Path, vectors: u32) -> Result<(), HotplugError> {
        let node = self.node.clone();
        self.with(|q| replug(&node, q, hca_socket, vectors))
    }
}

/// The fd numbers process `pid` has open, if they can be read.
fn open_fds(pid: Option<i32>) -> Option<BTreeSet<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{}/fd", pid?)).ok()?;
    Some(
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
    )
}

/// A pipe, both ends close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two fds pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded: both are open fds that nothing else owns.
    Ok(unsafe {
        use std::os::fd::FromRawFd;
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    })
}

/// Fills the fd numbers in `freed` that QEMU has not reused with pipe ends it holds both
/// ends of (the module's words say why). Each `add-fd` takes QEMU's lowest free number.
fn fill_freed(q: &mut Qmp, freed: &BTreeSet<i32>) -> Result<(), HotplugError> {
    for _ in 0..MAX_FILL_PIPES {
        let open = open_fds(q.pid).unwrap_or_default();
        if freed.iter().all(|n| open.contains(n)) {
            return Ok(());
        }
        let (r, w) = pipe().map_err(|e| q.io(e))?;
        q.execute_with_fd("add-fd", r.as_raw_fd())?;
        q.execute_with_fd("add-fd", w.as_raw_fd())?;
    }
    log::warn!(
        "{}: QEMU's fds the unplug freed are not all filled after {MAX_FILL_PIPES} pipes",
        q.node
    );
    Ok(())
}

fn unplug(node: &str, q: &mut Qmp) -> Result<(), HotplugError> {
    q.deleted.clear();
    let before = open_fds(q.pid);
    match q.execute("device_del", json!({ "id": HCA_DEVICE })) {
        // Gone already; its link too, unless an unplug that gave up waiting left it.
        Err(HotplugError::Refused { desc, .. }) if desc.contains("not found") => {
            return match q.execute("chardev-remove", json!({ "id": HCA_CHARDEV })) {
                Ok(_) => Ok(()),
                Err(_) => Err(HotplugError::Unplugged {
                    node: node.to_string(),
                }),
            };
        }
        r => r?,
    };
    if !q.wait_deleted(HCA_DEVICE, RELEASE_TIMEOUT)? {
        return Err(HotplugError::NotReleased {
            node: node.to_string(),
        });
    }
    q.execute("chardev-remove", json!({ "id": HCA_CHARDEV }))?;
    match (before, open_fds(q.pid)) {
        (Some(before), Some(after)) => fill_freed(q, &before.difference(&after).copied().collect()),
        _ => {
            log::warn!("{node}: cannot read QEMU's fds: its next replug may crash QEMU 7.2");
            Ok(())
        }
    }
}

fn replug(node: &str, q: &mut Qmp, hca_socket: &Path, vectors: u32) -> Result<(), HotplugError> {
    let link = json!({
        "id": HCA_CHARDEV,
        "backend": { "type": "socket", "data": {
            "addr": { "type": "unix", "data": { "path": hca_socket } },
            "server": false,
        }},
    });
    match q.execute("chardev-add", link) {
        Err(HotplugError::Refused { desc, .. }) if desc.contains("already") => {
            return Err(HotplugError::Plugged {
                node: node.to_string(),
            })
        }
        r => r?,
    };
    let device = json!({
        "driver": "ivshmem-doorbell",
        "chardev": HCA_CHARDEV,
        "vectors": vectors,
        "bus": HCA_PORT,
        "id": HCA_DEVICE,
    });
    if let Err(e) = q.execute("device_add", device) {
        // No device took the link: close it, so the device server's HCA goes again.
        let _ = q.execute("chardev-remove", json!({ "id": HCA_CHARDEV }));
        return Err(e);
    }
    Ok(())
}
