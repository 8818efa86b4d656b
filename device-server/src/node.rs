//! One node: its unix socket, the QEMU guest connected to it, and that guest's HCA.
//!
//! A node thread waits (epoll) on its listening socket, a stop eventfd and, while a guest is
//! connected, on the guest's socket; the guest's doorbell eventfds have a
//! [`DoorbellPump`] of their own. Each connection is a
//! fresh device (a guest that reboots gets a reset HCA) at the node's fixed LID. A guest that
//! goes away takes only its own HCA off the fabric: peers' packets to it fail, the server and
//! the other nodes go on.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hca_model::abi::NUM_VECTORS;
use hca_model::sync::Unpoisoned;
use hca_model::{DeviceMemory, DoorbellPump, Fabric, Hca, InterruptSink, Lid};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::guest_ram::QemuRam;
use crate::ivshmem::{greet, Greeting};
use crate::memfd;
use crate::ServerError;

/// The ivshmem peer ids this server hands out on every node's socket.
pub const DEVICE_PEER: u16 = 0;
pub const GUEST_PEER: u16 = 1;

/// How to reach one node's guest.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// A name for logs ("node1").
    pub name: String,
    /// The LID its HCA's port takes on the fabric.
    pub lid: u16,
    /// The unix socket QEMU's `-chardev socket,path=` connects to.
    pub socket: PathBuf,
    /// What backs the guest's RAM.
    pub ram: RamBacking,
    pub ram_size: u64,
    /// Host memory the node's HCA may hold for requests in flight
    /// (`Hca::set_in_flight_budget`; `MAX_IN_FLIGHT_BYTES` by default).
    pub in_flight_budget: usize,
}

/// The memory behind a QEMU guest's RAM, which QEMU and the server both map.
#[derive(Clone, Debug)]
pub enum RamBacking {
    /// A sealed memfd the server's user made ([`crate::memfd::guest_ram`]): QEMU maps it
    /// through `/proc/self/fd/N` (`memory-backend-file,mem-path=`, the fd inherited). No
    /// one can resize it, and no file of guest memory lies in the run directory.
    Memfd(Arc<File>),
    /// A file QEMU creates and sizes (`memory-backend-file,share=on,mem-path=PATH`), mapped
    /// once it exists at its full size. A file anyone can truncate: for a QEMU started
    /// elsewhere.
    Path(PathBuf),
}

impl NodeConfig {
    /// Where node `name` of a cluster in `dir` listens for its guest's QEMU.
    pub fn cluster_socket(dir: &std::path::Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.sock"))
    }

    /// One node per entry of `ram_sizes` (its RAM in bytes), named node1.., each with its
    /// socket (nodeK.sock) in `dir` and its RAM a sealed memfd: the layout every cluster
    /// uses.
    pub fn cluster(dir: &std::path::Path, ram_sizes: &[u64]) -> io::Result<Vec<Self>> {
        Self::cluster_from(dir, 1, ram_sizes)
    }

    /// Like [`NodeConfig::cluster`], the first node being node`first` at LID `first`
    /// (this host's nodes of a cluster that spans hosts).
    pub fn cluster_from(
        dir: &std::path::Path,
        first: u16,
        ram_sizes: &[u64],
    ) -> io::Result<Vec<Self>> {
        (first..)
            .zip(ram_sizes)
            .map(|(i, &ram_size)| {
                let name = format!("node{i}");
                Ok(NodeConfig {
                    lid: i,
                    socket: Self::cluster_socket(dir, &name),
                    ram: RamBacking::Memfd(Arc::new(memfd::guest_ram(&name, ram_size)?)),
                    name,
                    ram_size,
                    in_flight_budget: hca_model::abi::MAX_IN_FLIGHT_BYTES,
                })
            })
            .collect()
    }
}

/// Raises a guest's MSI-X vector by writing the eventfd QEMU waits on.
struct GuestIrqs(Vec<EventFd>);

impl InterruptSink for GuestIrqs {
    fn raise(&self, vector: u32) {
        if let Some(e) = self.0.get(vector as usize) {
            let _ = e.write(1);
        }
    }
}

/// A connected guest and the device made for it.
struct Session {
    stream: UnixStream,
    hca: Hca,
    /// Stops (and is waited for) before the HCA leaves the fabric.
    pump: Option<DoorbellPump>,
}

/// Epoll tokens.
const TOKEN_LISTEN: u64 = 0;
const TOKEN_STOP: u64 = 1;
const TOKEN_GUEST: u64 = 2;

pub(crate) struct NodeThread {
    pub cfg: NodeConfig,
    pub lid: Lid,
    pub fabric: Fabric,
    pub listener: UnixListener,
    pub stop: EventFd,
    /// The current guest's HCA, for status and tests.
    pub current: Arc<Mutex<Option<Hca>>>,
    /// The QPN the last guest's HCA would have handed out next: a new one (a replug) goes
    /// on from there (see `Hca::continue_qpns_from`).
    pub next_qpn: std::sync::atomic::AtomicU32,
}

impl NodeThread {
    pub fn run(self) -> Result<(), ServerError> {
        let epoll = Epoll::new().map_err(ServerError::Epoll)?;
        let add = |fd: RawFd, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(ServerError::Epoll)
        };
        add(self.listener.as_raw_fd(), TOKEN_LISTEN)?;
        add(self.stop.as_raw_fd(), TOKEN_STOP)?;
        let mut session: Option<Session> = None;
        let mut events = vec![EpollEvent::default(); 16];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ServerError::Epoll(e)),
            };
            for ev in events.iter().take(n) {
                match ev.data() {
                    TOKEN_STOP => {
                        if let Some(s) = session.take() {
                            self.end(&epoll, s);
                        }
                        return Ok(());
                    }
                    TOKEN_LISTEN => self.accept(&epoll, &mut session),
                    TOKEN_GUEST if self.guest_gone(&session) => {
                        if let Some(s) = session.take() {
                            self.end(&epoll, s);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn accept(&self, epoll: &Epoll, session: &mut Option<Session>) {
        let stream = match self.listener.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                log::warn!("{}: accept failed: {e}", self.cfg.name);
                return;
            }
        };
        // A guest that was stopped and started again (a reboot after a crash) may connect
        // before this loop heard the old one hang up.
        if self.guest_gone(session) {
            if let Some(s) = session.take() {
                self.end(epoll, s);
            }
        }
        if session.is_some() {
            log::warn!(
                "{}: a second guest connected to {}; one guest per node, refused",
                self.cfg.name,
                self.cfg.socket.display()
            );
            return;
        }
        match self.start(stream) {
            Ok(s) => {
                let ok = epoll
                    .ctl(
                        ControlOperation::Add,
                        s.stream.as_raw_fd(),
                        EpollEvent::new(EventSet::IN | EventSet::READ_HANG_UP, TOKEN_GUEST),
                    )
                    .is_ok();
                if ok {
                    log::info!(
                        "{}: guest connected, HCA up at LID {}",
                        self.cfg.name,
                        self.lid
                    );
                    *session = Some(s);
                } else {
                    log::warn!("{}: cannot watch the new guest's fds", self.cfg.name);
                    self.end(epoll, s);
                }
            }
            Err(e) => log::warn!("{}: cannot set up the guest: {e}", self.cfg.name),
        }
    }

    /// Makes a fresh device for a new guest and greets the guest's QEMU.
    fn start(&self, stream: UnixStream) -> io::Result<Session> {
        let bar2_file = memfd::create(&format!("hcabench-bar2-{}", self.cfg.name))?;
        let bar2 = DeviceMemory::from_file(bar2_file.try_clone()?).map_err(io::Error::other)?;
        // Its size is fixed from here: a guest's QEMU (or anyone it hands the fd to) cannot
        // truncate it under the device's mapping (that would be SIGBUS in this server).
        memfd::seal_size(&bar2_file)?;
        let vectors = NUM_VECTORS as usize;
        let doorbells = (0..vectors)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        let irqs = (0..vectors)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<io::Result<Vec<_>>>()?;
        let own: Vec<RawFd> = irqs.iter().map(|e| e.as_raw_fd()).collect();
        let device: Vec<RawFd> = doorbells.iter().map(|e| e.as_raw_fd()).collect();
        let ram = Arc::new(QemuRam::new(self.cfg.ram.clone(), self.cfg.ram_size));
        let guid = hca_model::abi::node_guid(self.lid);
        let hca = Hca::with_dma(ram, bar2, Arc::new(GuestIrqs(irqs)), guid);
        hca.set_doorbell_peer(u32::from(DEVICE_PEER));
        hca.set_in_flight_budget(self.cfg.in_flight_budget);
        let next_qpn = self.next_qpn.load(std::sync::atomic::Ordering::Relaxed);
        if next_qpn != 0 {
            hca.continue_qpns_from(next_qpn);
        }
        hca.attach_at(&self.fabric, self.lid)
            .map_err(io::Error::other)?;
        let greeting = Greeting {
            client_id: GUEST_PEER,
            shm: &bar2_file,
            peers: &[(DEVICE_PEER, device)],
            own: &own,
        };
        if let Err(e) = greet(&stream, &greeting).and_then(|()| stream.set_nonblocking(true)) {
            hca.detach();
            return Err(e);
        }
        let pump = match DoorbellPump::start(&self.cfg.name, hca.clone(), doorbells) {
            Ok(p) => p,
            Err(e) => {
                hca.detach();
                return Err(e);
            }
        };
        *self.current.lock_unpoisoned() = Some(hca.clone());
        Ok(Session {
            stream,
            hca,
            pump: Some(pump),
        })
    }

    /// QEMU never writes to the socket: readable means it closed. (The socket is
    /// non-blocking from the end of the greeting on.)
    fn guest_gone(&self, session: &Option<Session>) -> bool {
        let Some(s) = session else {
            return false;
        };
        let mut b = [0u8; 64];
        match (&s.stream).read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    fn end(&self, epoll: &Epoll, mut s: Session) {
        let _ = epoll.ctl(
            ControlOperation::Delete,
            s.stream.as_raw_fd(),
            EpollEvent::default(),
        );
        drop(s.pump.take());
        self.next_qpn
            .store(s.hca.next_qpn(), std::sync::atomic::Ordering::Relaxed);
        s.hca.detach();
        *self.current.lock_unpoisoned() = None;
        log::info!(
            "{}: guest gone, HCA at LID {} off the fabric",
            self.cfg.name,
            self.lid
        );
    }
}
