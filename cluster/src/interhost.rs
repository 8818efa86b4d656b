//! The network between hcabench hosts: one UDP socket per host, over which the fabric's
//! inter-host links carry their frames (`hca_model::wire`), and each host announces
//! itself to every other host every [`ANNOUNCE_EVERY`]. A host not heard from for
//! [`DEAD_AFTER`] is gone: the links to it go down and its ports out of service (see
//! `hca_model::fabric`'s `remote.rs`), until it is heard from again.
//!
//! A datagram is taken only from an address the cluster file names; from anywhere else it
//! is dropped and counted. What a named host sends is checked again by the fabric.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hca_model::fabric::RemoteHosts;
use hca_model::Fabric;

/// How often a host announces itself.
pub const ANNOUNCE_EVERY: Duration = Duration::from_millis(100);
/// How long a host may go unheard before the others take it for gone: ten announcements.
pub const DEAD_AFTER: Duration = Duration::from_secs(1);
/// The largest datagram: an IB packet of a 4 KiB MTU and its headers fit with room.
const MAX_DATAGRAM: usize = 65_536;

/// This host on the network between hosts; dropping it leaves the network (the others
/// then find it gone).
pub struct Interhost {
    fabric: Fabric,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counts: Arc<Counts>,
    local: SocketAddr,
}

/// What the network did.
#[derive(Default)]
struct Counts {
    /// Datagrams from addresses no host has.
    strangers: AtomicU64,
    /// Datagrams the fabric refused.
    refused: AtomicU64,
    /// Datagrams that could not be sent.
    send_errors: AtomicU64,
}

/// Sends the fabric's datagrams.
struct Sender {
    socket: UdpSocket,
    hosts: Vec<SocketAddr>,
    counts: Arc<Counts>,
}

impl RemoteHosts for Sender {
    fn send(&self, host: u16, frame: Vec<u8>) {
        let Some(to) = self.hosts.get(usize::from(host)) else {
            return;
        };
        if let Err(e) = self.socket.send_to(&frame, to) {
            // A full socket buffer or an unreachable host: a datagram lost, as on a link.
            if self.counts.send_errors.fetch_add(1, Relaxed) == 0 {
                log::warn!("interhost: sending to host {host} ({to}): {e}");
            }
        }
    }
}

impl Interhost {
    /// Joins `fabric`, as host `here`, to the hosts at `hosts` (every host's address, this
    /// one's included, in host order): binds this host's address and starts announcing.
    pub fn join(fabric: &Fabric, here: u16, hosts: &[SocketAddr]) -> io::Result<Interhost> {
        let addr = hosts.get(usize::from(here)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no address for host {here}"),
            )
        })?;
        let socket = UdpSocket::bind(addr)?;
        Self::with_socket(fabric, here, socket, hosts)
    }

    /// Like [`Interhost::join`], on a socket already bound to this host's address.
    pub fn with_socket(
        fabric: &Fabric,
        here: u16,
        socket: UdpSocket,
        hosts: &[SocketAddr],
    ) -> io::Result<Interhost> {
        socket.set_read_timeout(Some(ANNOUNCE_EVERY))?;
        let local = socket.local_addr()?;
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let heard: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; hosts.len()]));
        fabric.set_remote(Some(Arc::new(Sender {
            socket: socket.try_clone()?,
            hosts: hosts.to_vec(),
            counts: counts.clone(),
        })));
        // Announcements go from the listening address too, so that the others know the
        // sender by it.
        let announcing = socket.try_clone()?;
        let receiver = {
            let (fabric, stop, heard, counts) =
                (fabric.clone(), stop.clone(), heard.clone(), counts.clone());
            let hosts = hosts.to_vec();
            std::thread::Builder::new()
                .name("interhost-rx".into())
                .spawn(move || receive(&fabric, &socket, &hosts, here, &stop, &heard, &counts))?
        };
        let announcer = {
            let (fabric, stop, heard) = (fabric.clone(), stop.clone(), heard.clone());
            let sender = Sender {
                socket: announcing,
                hosts: hosts.to_vec(),
                counts: counts.clone(),
            };
            std::thread::Builder::new()
                .name("interhost-announce".into())
                .spawn(move || announce(&fabric, &sender, here, &stop, &heard))?
        };
        Ok(Interhost {
            fabric: fabric.clone(),
            stop,
            threads: vec![receiver, announcer],
            counts,
            local,
        })
    }

    /// The address this host listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Datagrams dropped for coming from no host's address, and refused by the fabric.
    pub fn dropped(&self) -> (u64, u64) {
        (
            self.counts.strangers.load(Relaxed),
            self.counts.refused.load(Relaxed),
        )
    }
}

impl Drop for Interhost {
    fn drop(&mut self) {
        // Nothing more goes out: a host that left sends nothing the others take for life.
        self.fabric.set_remote(None);
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn receive(
    fabric: &Fabric,
    socket: &UdpSocket,
    hosts: &[SocketAddr],
    here: u16,
    stop: &AtomicBool,
    heard: &Mutex<Vec<Option<Instant>>>,
    counts: &Counts,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    while !stop.load(Relaxed) {
        let (n, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) => {
                // ICMP port unreachable from a host not up yet shows here on Linux.
                log::debug!("interhost: receive: {e}");
                continue;
            }
        };
        let host = hosts
            .iter()
            .position(|h| *h == from)
            .filter(|&h| h != usize::from(here));
        let Some(host) = host else {
            counts.strangers.fetch_add(1, Relaxed);
            continue;
        };
        match fabric.receive(host as u16, buf.get(..n).unwrap_or_default()) {
            // Only what the fabric took says the host is alive.
            Ok(()) => {
                let mut heard = heard.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(t) = heard.get_mut(host) {
                    *t = Some(Instant::now());
                }
            }
            Err(e) => {
                if counts.refused.fetch_add(1, Relaxed) == 0 {
                    log::warn!("interhost: from host {host} ({from}): {e}");
                }
            }
        }
    }
}

/// Announces this host every [`ANNOUNCE_EVERY`], and takes a host heard from no more for
/// gone.
fn announce(
    fabric: &Fabric,
    sender: &Sender,
    here: u16,
    stop: &AtomicBool,
    heard: &Mutex<Vec<Option<Instant>>>,
) {
    let mut gone = vec![false; sender.hosts.len()];
    while !stop.load(Relaxed) {
        let a = fabric.announcement();
        for h in 0..sender.hosts.len() as u16 {
            if h != here {
                sender.send(h, a.clone());
            }
        }
        let last: Vec<Option<Instant>> = heard.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (h, t) in last.into_iter().enumerate() {
            let silent = t.is_none_or(|t| t.elapsed() > DEAD_AFTER);
            if h == usize::from(here) {
                continue;
            }
            if let Some(g) = gone.get_mut(h) {
                // (A host never heard from is not "gone": it has not come yet.)
                if silent && t.is_some() && !*g {
                    fabric.set_host_alive(h as u16, false);
                }
                *g = silent && t.is_some();
            }
        }
        std::thread::sleep(ANNOUNCE_EVERY);
    }
}
