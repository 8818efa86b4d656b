//! Datagrams from peer hosts, as anyone who can reach a host's inter-host port may send
//! them (`hca_model::wire`, `Fabric::receive`): frames built from fuzzed fields (packets
//! with any members, hops, links and headers; announcements of any ports and links) and
//! raw bytes, between ticks, into host 1 of a three-host ring with a guest of its own.
//! Never a panic, and what host 1 sends on stays bounded by what it was sent (no frame
//! makes it flood the others, whatever members or hops it names).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use hca_model::fabric::RemoteHosts;
use hca_model::packet::{Packet, Payload};
use hca_model::subnet::{SwitchSpec, Topology};
use hca_model::wire::{self, Frame, PortAd};
use hca_model::Fabric;
use hca_test_driver::Driver;

/// At most this many datagrams an input: enough for any sequence of announcements,
/// packets and ticks to matter.
const MAX_DATAGRAMS: usize = 256;
/// Frames host 1 may send for each datagram it took, beyond its own announcements: a
/// group's copies go out once per link (3), an SA answer is a few MTU packets.
const MOST_OUT_PER_IN: u64 = 64;

#[derive(Arbitrary, Debug)]
pub enum Datagram {
    /// Any bytes.
    Raw { from: u8, bytes: Vec<u8> },
    /// A packet frame from fuzzed fields.
    Packet {
        from: u8,
        link: u8,
        hops: u8,
        members: Vec<u16>,
        bounce: bool,
        slid: u16,
        dlid: u16,
        opcode: u8,
        dest_qpn: u32,
        len: u8,
        corrupt: bool,
    },
    /// An announcement from fuzzed fields.
    Announce {
        from: u8,
        host: u8,
        seq: u32,
        links: Vec<(u8, bool)>,
        ports: Vec<(u16, u64, bool)>,
    },
    /// A millisecond of fabric time.
    Tick,
}

pub type Input = Vec<Datagram>;

/// Counts what host 1 sends the others.
#[derive(Default)]
struct Sent(AtomicU64);

impl RemoteHosts for Sent {
    fn send(&self, _host: u16, _frame: Vec<u8>) {
        self.0.fetch_add(1, Relaxed);
    }
}

fn ring() -> Topology {
    let sw = |name: &str, hcas: &[u16]| SwitchSpec {
        name: name.into(),
        hcas: hcas.to_vec(),
    };
    Topology::new(
        vec![sw("s0", &[1, 2]), sw("s1", &[3, 4]), sw("s2", &[5])],
        vec![(0, 1), (1, 2), (2, 0)],
    )
    .and_then(|t| t.on_hosts(vec![0, 1, 2]))
    .expect("a ring of three hosts")
}

pub fn run(input: Input) {
    let fabric = Fabric::with_manual_clock();
    fabric.set_topology_on(ring(), 1);
    let sent = Arc::new(Sent::default());
    fabric.set_remote(Some(sent.clone()));
    let guest = Driver::new(None, 8);
    guest.hca.attach_at(&fabric, 3).expect("LID 3 is host 1's");
    for d in input.into_iter().take(MAX_DATAGRAMS) {
        let (from, bytes) = match d {
            Datagram::Raw { from, bytes } => (from, bytes),
            Datagram::Packet {
                from,
                link,
                hops,
                members,
                bounce,
                slid,
                dlid,
                opcode,
                dest_qpn,
                len,
                corrupt,
            } => {
                let pkt = Packet {
                    slid,
                    dlid,
                    opcode,
                    dest_qpn: dest_qpn & 0x00ff_ffff,
                    count: 1,
                    corrupt,
                    payload: Payload::Bytes(vec![0x5a; usize::from(len)]),
                    ..Default::default()
                };
                let frame = Frame::Packet {
                    link: u16::from(link % 4),
                    hops,
                    members,
                    bounce,
                    pkt,
                };
                let Ok(bytes) = wire::encode(&frame) else {
                    continue;
                };
                (from, bytes)
            }
            Datagram::Announce {
                from,
                host,
                seq,
                links,
                ports,
            } => {
                let frame = Frame::Announce {
                    host: u16::from(host % 4),
                    seq,
                    links: (links.into_iter())
                        .map(|(l, up)| (u16::from(l % 4), up))
                        .collect(),
                    ports: (ports.into_iter())
                        .map(|(lid, guid, up)| PortAd {
                            lid,
                            guid,
                            caps: 0,
                            up,
                        })
                        .collect(),
                };
                let Ok(bytes) = wire::encode(&frame) else {
                    continue;
                };
                (from, bytes)
            }
            Datagram::Tick => {
                fabric.advance(Duration::from_millis(1));
                continue;
            }
        };
        let before = sent.0.load(Relaxed);
        let _ = fabric.receive(u16::from(from % 4), &bytes);
        let out = sent.0.load(Relaxed) - before;
        assert!(out <= MOST_OUT_PER_IN, "{out} frames sent for one taken");
    }
}
