//! A virtio network device (virtio 1.1 §5.1) on the cluster's Ethernet segment: what a
//! QEMU guest's virtio-net NIC is on the segment's hub (`cluster::ethernet`), for
//! hcabench's VMM, so that SoftRoCE and TCP over Ethernet run on its guests too.
//!
//! Two queues (receive 0, transmit 1), the MAC address in the config space, no offloads:
//! each frame whole in one chain, behind a 12-byte `virtio_net_hdr_v1` with nothing set in
//! it. A frame goes to the hub as one UDP datagram from the NIC's port of 127.0.0.1 (a
//! socket connected to the hub's, so that only the hub's datagrams come in), and the frames
//! the hub sends arrive the same way: [`Receiver`] waits for them on a thread of its own
//! and hands each to the device under the transport's lock, which puts it into the next
//! receive buffer the driver posted and interrupts.
//!
//! Threat model: the guest driver is hostile. The `virtio-queue` crate walks its chains
//! (bounded by the queue size, over 4 GiB refused); a transmitted frame is at most
//! [`MAX_FRAME`] bytes (longer ones are dropped, counted), read through one buffer the
//! device keeps; a receive buffer too small for a frame and its header is returned with
//! nothing written (Linux drops it, as it does a runt); frames waiting for receive buffers
//! are at most [`RX_BACKLOG`] (the oldest goes, as a NIC's ring overflows). Nothing here
//! panics on guest input, and what the device holds is bounded.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MAC;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vm_superio::Trigger;

use crate::virtio_mmio::{MmioTransport, VirtioDevice};
use hca_model::sync::Unpoisoned;

/// Each queue's size (descriptors).
pub const QUEUE_SIZE: u16 = 256;
/// The receive and transmit queues' indices.
pub const RX: u32 = 0;
pub const TX: u32 = 1;
/// `struct virtio_net_hdr_v1`: what precedes every frame in a chain.
const HDR: usize = 12;
/// The longest frame the device moves (a datagram's most, as the hub's).
pub const MAX_FRAME: usize = 65536 - HDR;
/// Frames that wait for the driver's receive buffers, at most.
pub const RX_BACKLOG: usize = 256;

/// Where the NIC sits on the segment: its address and ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NicConfig {
    pub mac: [u8; 6],
    /// The NIC's own port of 127.0.0.1.
    pub port: u16,
    /// The hub's.
    pub hub_port: u16,
}

/// What the NIC moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub received: u64,
    /// Frames too long to send, lost for want of receive buffers, or too long for one.
    pub dropped: u64,
}

/// The device: its socket on the segment, the frames waiting for receive buffers, and a
/// buffer for the frame being sent.
pub struct Net {
    cfg: NicConfig,
    socket: UdpSocket,
    backlog: VecDeque<Vec<u8>>,
    buf: Vec<u8>,
    stats: NetStats,
}

impl Net {
    /// A NIC on `cfg`'s port, sending to its hub.
    pub fn new(cfg: NicConfig) -> io::Result<Net> {
        let socket = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, cfg.port))?;
        socket
            .connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, cfg.hub_port))
            .map_err(|e| match e.kind() {
                io::ErrorKind::NetworkUnreachable => io::Error::new(
                    e.kind(),
                    format!("{e}: the hub is on 127.0.0.1; is the loopback interface up?"),
                ),
                _ => e,
            })?;
        Ok(Net {
            cfg,
            socket,
            backlog: VecDeque::new(),
            buf: vec![0; HDR + MAX_FRAME],
            stats: NetStats::default(),
        })
    }

    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// A frame from the segment, for the next receive buffer.
    pub fn arrived(&mut self, frame: &[u8]) {
        if self.backlog.len() >= RX_BACKLOG {
            self.backlog.pop_front();
            self.stats.dropped += 1;
        }
        self.backlog.push_back(frame.to_vec());
    }

    /// Sends the frame in one transmit chain (after its header); the used length is 0.
    fn transmit(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) {
        let Ok(mut reader) = chain.reader(mem) else {
            return;
        };
        let len = reader.available_bytes();
        if len > self.buf.len() || len < HDR {
            self.stats.dropped += 1;
            return;
        }
        let Some(buf) = self.buf.get_mut(..len) else {
            return;
        };
        if reader.read_exact(buf).is_err() {
            return;
        }
        // A frame the hub has no room for is lost, as on an Ethernet.
        match buf.get(HDR..).map(|frame| self.socket.send(frame)) {
            Some(Ok(_)) => self.stats.sent += 1,
            _ => self.stats.dropped += 1,
        }
    }

    /// Puts the waiting frames into the receive buffers posted; whether any was used.
    fn receive(&mut self, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool {
        let mut used = false;
        while !self.backlog.is_empty() {
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                break;
            };
            let head = chain.head_index();
            let frame = self.backlog.pop_front().unwrap_or_default();
            let len = match chain.writer(mem) {
                Ok(mut w) if w.available_bytes() >= HDR + frame.len() => {
                    // num_buffers 1 (at byte 10), nothing else set.
                    let mut hdr = [0u8; HDR];
                    hdr[10] = 1;
                    match w.write_all(&hdr).and_then(|()| w.write_all(&frame)) {
                        Ok(()) => {
                            self.stats.received += 1;
                            (HDR + frame.len()) as u32
                        }
                        Err(_) => 0,
                    }
                }
                _ => {
                    self.stats.dropped += 1;
                    0
                }
            };
            if queue.add_used(mem, head, len).is_err() {
                break;
            }
            used = true;
        }
        used
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    /// `struct virtio_net_config`: the MAC address; nothing else is offered.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset.checked_add(i as u64);
            *b = at
                .and_then(|a| self.cfg.mac.get(usize::try_from(a).ok()?))
                .copied()
                .unwrap_or(0);
        }
    }

    fn process_queue(&mut self, index: usize, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool {
        if index == RX as usize {
            return self.receive(queue, mem);
        }
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            self.transmit(mem, chain);
            if queue.add_used(mem, head, 0).is_err() {
                break;
            }
            used = true;
        }
        used
    }
}

/// How often the receiving thread looks whether its machine stopped.
const POLL: Duration = Duration::from_millis(100);

/// The thread that takes the hub's datagrams to a NIC.
pub struct Receiver {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Receives for the NIC behind `transport` until dropped.
    pub fn start<T: Trigger + Send + 'static>(
        name: &str,
        transport: Arc<Mutex<MmioTransport<Net, T>>>,
    ) -> io::Result<Receiver> {
        let socket = transport.lock_unpoisoned().device().socket.try_clone()?;
        socket.set_read_timeout(Some(POLL))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-net"))
            .spawn(move || {
                let mut buf = vec![0u8; MAX_FRAME];
                while !flag.load(Relaxed) {
                    match socket.recv(&mut buf) {
                        Ok(n) => {
                            let mut t = transport.lock_unpoisoned();
                            if let Some(frame) = buf.get(..n) {
                                t.device_mut().arrived(frame);
                            }
                            t.serve_queue(RX);
                        }
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) => {}
                        // The hub gone for a moment (its port unreachable): go on.
                        Err(_) => std::thread::sleep(POLL),
                    }
                }
            })?;
        Ok(Receiver {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    const BUF: u64 = 0x10_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap()
    }

    /// A NIC and a socket playing its hub.
    fn nic() -> (Net, UdpSocket) {
        let hub = UdpSocket::bind("127.0.0.1:0").unwrap();
        hub.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = NicConfig {
            mac: [0x52, 0x54, 0, 0x12, 0x34, 1],
            port,
            hub_port: hub.local_addr().unwrap().port(),
        };
        (Net::new(cfg).unwrap(), hub)
    }

    /// Posts chains of one descriptor each (`(len, flags)` at BUF, BUF + 64 KiB, ...) on
    /// queue `index` and runs the device; the used elements' lengths.
    fn run(net: &mut Net, mem: &GuestMemoryMmap, index: usize, chains: &[(u32, u32)]) -> Vec<u32> {
        let vq = MockSplitQueue::create(mem, GuestAddress(0x1000), QUEUE_SIZE);
        for (i, &(len, flags)) in chains.iter().enumerate() {
            let d = Descriptor::new(BUF + i as u64 * 0x1_0000, len, flags as u16, 0);
            vq.desc_table()
                .store(i as u16, RawDescriptor::from(d))
                .unwrap();
            vq.avail().ring().ref_at(i).unwrap().store(i as u16);
        }
        vq.avail().idx().store(chains.len() as u16);
        let mut q: Queue = vq.create_queue().unwrap();
        net.process_queue(index, &mut q, mem);
        (0..vq.used().idx().load())
            .map(|i| {
                vq.used()
                    .ring()
                    .ref_at(usize::from(i))
                    .unwrap()
                    .load()
                    .len()
            })
            .collect()
    }

    #[test]
    fn test_the_config_space_holds_the_mac_address() {
        let (net, _) = nic();
        let mut c = [0xffu8; 8];
        net.read_config(0, &mut c);
        assert_eq!(c, [0x52, 0x54, 0, 0x12, 0x34, 1, 0, 0]);
        let mut tail = [0xffu8; 2];
        net.read_config(u64::MAX, &mut tail);
        assert_eq!(tail, [0, 0]);
        assert_eq!(net.features() >> VIRTIO_NET_F_MAC & 1, 1);
    }

    #[test]
    fn test_a_transmitted_frame_reaches_the_hub_without_its_header() {
        let (mut net, hub) = nic();
        let m = mem();
        let frame: Vec<u8> = (0..100u8).collect();
        let mut chain = vec![0u8; HDR];
        chain.extend_from_slice(&frame);
        m.write_slice(&chain, GuestAddress(BUF)).unwrap();
        assert_eq!(
            run(&mut net, &m, TX as usize, &[(chain.len() as u32, 0)]),
            [0]
        );
        let mut got = [0u8; 200];
        let n = hub.recv(&mut got).unwrap();
        assert_eq!(got[..n], frame[..]);
        // A chain shorter than the header carries no frame.
        assert_eq!(run(&mut net, &m, TX as usize, &[(4, 0)]), [0]);
        assert_eq!(
            net.stats(),
            NetStats {
                sent: 1,
                received: 0,
                dropped: 1
            }
        );
    }

    #[test]
    fn test_a_received_frame_fills_the_next_buffer_behind_its_header() {
        let (mut net, _) = nic();
        let m = mem();
        net.arrived(b"frame one");
        net.arrived(&[7u8; 3000]);
        // A buffer of 1526 bytes takes the first; the second does not fit the next one of
        // 1526 and is dropped; a third buffer waits for the next frame.
        let lens = run(&mut net, &m, RX as usize, &[(1526, VRING_DESC_F_WRITE); 3]);
        assert_eq!(lens, [(HDR + 9) as u32, 0]);
        let mut got = [0u8; HDR + 9];
        m.read_slice(&mut got, GuestAddress(BUF)).unwrap();
        assert_eq!(got[10], 1, "num_buffers");
        assert_eq!(&got[HDR..], b"frame one");
        assert_eq!(
            net.stats(),
            NetStats {
                sent: 0,
                received: 1,
                dropped: 1
            }
        );
        // A device-readable buffer cannot take one either.
        net.arrived(b"x");
        assert_eq!(run(&mut net, &m, RX as usize, &[(1526, 0)]), [0]);
    }

    #[test]
    fn test_frames_waiting_for_buffers_are_bounded() {
        let (mut net, _) = nic();
        for i in 0..RX_BACKLOG + 5 {
            net.arrived(&[i as u8; 20]);
        }
        assert_eq!(net.backlog.len(), RX_BACKLOG);
        assert_eq!(net.stats().dropped, 5);
        // The oldest went: the first buffer gets frame 5.
        let m = mem();
        run(&mut net, &m, RX as usize, &[(100, VRING_DESC_F_WRITE)]);
        let mut b = [0u8; 1];
        m.read_slice(&mut b, GuestAddress(BUF + HDR as u64))
            .unwrap();
        assert_eq!(b[0], 5);
    }
}
