//! The QEMU guests' shared Ethernet segment, for SoftRoCE (rdma_rxe) and for comparisons
//! with IPoIB: one virtio-net NIC per guest, all on one learning switch.
//!
//! Each guest's NIC is a QEMU `dgram` netdev: it sends every frame as one UDP datagram from
//! a port of 127.0.0.1 of its own to the hub's port, and takes what arrives on its port.
//! The hub, a thread of the process that holds the cluster, learns which guest each source
//! MAC address is behind, and sends a frame to the guest its destination is behind, or to
//! every other guest when that is not known yet or the frame is a broadcast or multicast
//! one. Loopback only: no bridge, no tap device, no root.
//!
//! Datagrams, not a stream: over QEMU 7.2's `-netdev stream` a guest's link died for good
//! under SoftRoCE's load (a transmit queue timed out in both guests at once, twice in about
//! 55 runs of `tests/verbs.rs` on a 2-core host), because a stream makes each QEMU's
//! sending wait for its peer's reading. UDP never waits: a frame for which a socket has no
//! room is dropped, as on a real Ethernet, and RoCE and TCP recover from that.
//!
//! Hostile guests: the hub takes datagrams only from the guests' own ports, and its table of
//! addresses is bounded ([`MAX_ADDRESSES`]; a guest that makes up more only makes the hub
//! flood, as a switch whose table is full does).

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The most source addresses the hub remembers.
pub const MAX_ADDRESSES: usize = 4096;

/// The largest frame a guest's NIC sends (its MTU is at most 9000; a jumbo frame's
/// headers fit): a datagram of more is cut to this.
const MAX_FRAME: usize = 65536;

/// How often the hub's thread looks whether the cluster is gone.
const POLL: Duration = Duration::from_millis(100);

/// The guests' shared segment: the hub's port and each guest's.
pub struct EthernetHub {
    port: u16,
    guests: Vec<u16>,
    stats: Arc<HubStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the hub moved.
#[derive(Debug, Default)]
pub struct HubStats {
    /// Frames sent to one guest, whose address the hub knew.
    pub switched: AtomicU64,
    /// Frames sent to every other guest (broadcast, multicast, or an unknown address).
    pub flooded: AtomicU64,
    /// Datagrams not from a guest's port, or too short to be a frame.
    pub refused: AtomicU64,
    /// Source addresses the hub knows now.
    pub addresses: AtomicU64,
}

impl EthernetHub {
    /// A hub for `guests` guests, with a port of 127.0.0.1 picked for each (free a moment
    /// ago: the kernel picks them, and lets them go for QEMU to bind).
    pub fn start(guests: usize) -> io::Result<EthernetHub> {
        let socket = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        socket.set_read_timeout(Some(POLL))?;
        let port = socket.local_addr()?.port();
        let picked: Vec<UdpSocket> = (0..guests)
            .map(|_| UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)))
            .collect::<io::Result<_>>()?;
        let ports = picked
            .iter()
            .map(|s| Ok(s.local_addr()?.port()))
            .collect::<io::Result<Vec<u16>>>()?;
        drop(picked);
        let stats = Arc::new(HubStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let switch = Switch {
            socket,
            guests: ports.clone(),
            table: HashMap::new(),
            stats: stats.clone(),
        };
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ethernet-hub".into())
            .spawn(move || switch.run(&flag))?;
        Ok(EthernetHub {
            port,
            guests: ports,
            stats,
            stop,
            thread: Some(thread),
        })
    }

    /// The port the guests send their frames to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Guest `i`'s port.
    pub fn guest_port(&self, i: usize) -> Option<u16> {
        self.guests.get(i).copied()
    }

    pub fn stats(&self) -> &HubStats {
        &self.stats
    }
}

impl Drop for EthernetHub {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The hub's thread: its socket, the guests' ports and what it learned.
struct Switch {
    socket: UdpSocket,
    guests: Vec<u16>,
    /// Source MAC address -> the guest it came from.
    table: HashMap<[u8; 6], usize>,
    stats: Arc<HubStats>,
}

impl Switch {
    fn run(mut self, stop: &AtomicBool) {
        let mut buf = vec![0u8; MAX_FRAME];
        while !stop.load(Relaxed) {
            match self.socket.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let from = match from {
                        std::net::SocketAddr::V4(a) if *a.ip() == Ipv4Addr::LOCALHOST => {
                            self.guests.iter().position(|&p| p == a.port())
                        }
                        _ => None,
                    };
                    match (from, buf.get(..n)) {
                        (Some(from), Some(frame)) if n >= 14 => self.forward(from, frame),
                        _ => {
                            self.stats.refused.fetch_add(1, Relaxed);
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                // A guest that is not up yet makes the kernel report its port unreachable
                // here at times: nothing to do but go on.
                Err(_) => {}
            }
        }
    }

    /// Sends `frame`, from guest `from`, on to where its destination is.
    fn forward(&mut self, from: usize, frame: &[u8]) {
        let (Some(dst), Some(src)) = (mac(frame, 0), mac(frame, 6)) else {
            return;
        };
        if src[0] & 1 == 0 {
            if self.table.len() >= MAX_ADDRESSES && !self.table.contains_key(&src) {
                self.table.clear();
            }
            self.table.insert(src, from);
            self.stats.addresses.store(self.table.len() as u64, Relaxed);
        }
        let to = if dst[0] & 1 == 0 {
            self.table.get(&dst).copied()
        } else {
            None
        };
        match to {
            Some(to) if to == from => {} // its own: a switch does not send it back
            Some(to) => {
                self.stats.switched.fetch_add(1, Relaxed);
                self.send(to, frame);
            }
            None => {
                self.stats.flooded.fetch_add(1, Relaxed);
                for to in (0..self.guests.len()).filter(|&g| g != from) {
                    self.send(to, frame);
                }
            }
        }
    }

    fn send(&self, to: usize, frame: &[u8]) {
        if let Some(&port) = self.guests.get(to) {
            // A frame a guest has no room for is lost, as on an Ethernet.
            let _ = self
                .socket
                .send_to(frame, SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        }
    }
}

/// The MAC address at byte `at` of `frame`.
fn mac(frame: &[u8], at: usize) -> Option<[u8; 6]> {
    frame.get(at..at + 6)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's NIC: its port, sending to the hub.
    fn nic(hub: &EthernetHub, i: usize) -> UdpSocket {
        let s = UdpSocket::bind(("127.0.0.1", hub.guest_port(i).unwrap())).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s.connect(("127.0.0.1", hub.port())).unwrap();
        s
    }

    fn frame(dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
        let mut f = dst.to_vec();
        f.extend_from_slice(&src);
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(payload);
        f
    }

    fn got(s: &UdpSocket) -> Option<Vec<u8>> {
        let mut b = [0u8; 2048];
        let n = s.recv(&mut b).ok()?;
        Some(b[..n].to_vec())
    }

    const BROADCAST: [u8; 6] = [0xff; 6];
    fn addr(i: u8) -> [u8; 6] {
        [0x52, 0x54, 0, 0x12, 0x34, i]
    }

    #[test]
    fn test_a_broadcast_reaches_every_other_guest_and_a_learned_address_only_its_own() {
        let hub = EthernetHub::start(3).unwrap();
        let nics: Vec<UdpSocket> = (0..3).map(|i| nic(&hub, i)).collect();
        // Guest 0 asks everyone (an ARP request): 1 and 2 get it, 0 does not.
        let hello = frame(BROADCAST, addr(1), b"who has");
        nics[0].send(&hello).unwrap();
        assert_eq!(got(&nics[1]), Some(hello.clone()));
        assert_eq!(got(&nics[2]), Some(hello.clone()));
        assert_eq!(got(&nics[0]), None, "not back to its sender");
        // Guest 2 answers guest 0, whose address the hub learned: only 0 gets it.
        let answer = frame(addr(1), addr(3), b"is at");
        nics[2].send(&answer).unwrap();
        assert_eq!(got(&nics[0]), Some(answer));
        assert_eq!(got(&nics[1]), None, "switched, not flooded");
        // Guest 1's address is not known yet: a frame to it floods.
        nics[0].send(&frame(addr(2), addr(1), b"?")).unwrap();
        assert!(got(&nics[1]).is_some() && got(&nics[2]).is_some());
        let s = hub.stats();
        assert_eq!((s.switched.load(Relaxed), s.flooded.load(Relaxed)), (1, 2));
    }

    #[test]
    fn test_the_hub_takes_frames_from_the_guests_ports_only() {
        let hub = EthernetHub::start(2).unwrap();
        let nics: Vec<UdpSocket> = (0..2).map(|i| nic(&hub, i)).collect();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger
            .send_to(&frame(BROADCAST, addr(9), b"x"), ("127.0.0.1", hub.port()))
            .unwrap();
        // A runt from a guest is no frame either.
        nics[0].send(&[1, 2, 3]).unwrap();
        assert_eq!(got(&nics[0]), None);
        assert_eq!(got(&nics[1]), None);
        assert_eq!(hub.stats().refused.load(Relaxed), 2);
    }

    #[test]
    fn test_made_up_addresses_fill_a_bounded_table() {
        let hub = EthernetHub::start(2).unwrap();
        let nics: Vec<UdpSocket> = (0..2).map(|i| nic(&hub, i)).collect();
        let mut most = 0;
        for i in 0..(MAX_ADDRESSES + 10) as u32 {
            let [_, a, b, c] = i.to_be_bytes();
            nics[0]
                .send(&frame(BROADCAST, [2, 0, 0, a, b, c], b""))
                .unwrap();
            // One at a time, so that none is lost on the way: the hub learned each.
            assert!(got(&nics[1]).is_some(), "frame {i} flooded");
            most = most.max(hub.stats().addresses.load(Relaxed));
        }
        assert_eq!(most, MAX_ADDRESSES as u64);
        assert!(hub.stats().addresses.load(Relaxed) <= 10 + 1);
    }
}
