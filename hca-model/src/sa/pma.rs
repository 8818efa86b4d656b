//! The switches' Performance Management Agent (IBA 16.1): Performance Management MADs sent
//! to a switch's LID on QP1 ([`SM_LID`](super::SM_LID) for the first, or only, switch) get
//! that switch's ports' counters, as a managed switch's PMA gives them, so that `perfquery
//! 49151 N` and `ibqueryerrors` read the switches too.
//!
//! A port that links a node's port counts that link, seen from the switch's end: what the
//! node's port sent, the switch port received, and the other way round. The node's port
//! keeps them (its `CTR_*` counters, which its own PMA shows too); packets the switch could
//! not route (no port has their LID) are the switch port's PortRcvSwitchRelayErrors. A
//! port that links another switch counts what the fabric counted on that inter-switch link
//! each way (`fabric/switch_links.rs`): packets lost on it are PortXmitDiscards at the end
//! that sent them and PortRcvErrors at the end they were going to, each as far as this
//! host counted them (on a link between hosts, the host a packet goes into judges it and
//! counts its loss; the host it leaves counts what went into the link while down). Port 0
//! (the switch's management port) and ports linking nothing count nothing.
//!
//! Answered: ClassPortInfo Get; PortCounters and PortCountersExtended Get and Set (a Set
//! resets the counters its CounterSelect names); PortSelect 0xff (AllPortSelect, which
//! ClassPortInfo advertises) sums or resets every port. A reset keeps a base per port and
//! field here, which later reads subtract, as the nodes' PMAs do; the node's own counters
//! never go back. Anything else gets "method/attribute not supported", a PortSelect past the
//! switch's ports "invalid field".
//!
//! The counters are read from the devices, so this agent must never run under a device's
//! lock or under the SA's (a port attaching takes its device's lock, then the SA's): the
//! fabric's SA port calls it with neither held (`fabric/sa_port.rs`).

use super::mad::method::{GET, GET_RESP, RESP, SET};
use super::mad::{at, attr, class, PERF_CLASS_VERSION};
use super::{be16, status, to, Peer, Ports, MAD_SIZE};
use crate::abi::{self, COUNTERS_LEN, GSI_QKEY, GSI_QPN};
use crate::fabric::SwitchLinkStats;
use crate::packet::{Packet, Payload};
use crate::subnet::{self, Subnet, SwitchLink};
use std::collections::hash_map::{Entry, HashMap};

/// PortSelect, in PortCounters and PortCountersExtended.
const PORT_SELECT: usize = at::DATA + 1;
const COUNTER_SELECT: usize = at::DATA + 2;
/// PortSelect naming every port at once.
const ALL_PORTS: u8 = 0xff;

/// ClassPortInfo:CapabilityMask: AllPortSelect and PortCountersExtended
/// (IsExtendedWidthSupported).
const CAP_ALL_PORT_SELECT: u16 = 1 << 8;
const CAP_EXTENDED_WIDTH: u16 = 1 << 9;
/// RespTimeValue, as the SA's: 4.096 us * 2^18, about a second.
const RESP_TIME: u32 = 18;

/// The fields the agent counts, for one switch port (indices into [`Fields`]).
mod field {
    pub const XMIT_DATA: usize = 0;
    pub const RCV_DATA: usize = 1;
    pub const XMIT_PKTS: usize = 2;
    pub const RCV_PKTS: usize = 3;
    pub const UNI_XMIT_PKTS: usize = 4;
    pub const UNI_RCV_PKTS: usize = 5;
    pub const MC_XMIT_PKTS: usize = 6;
    pub const MC_RCV_PKTS: usize = 7;
    pub const LINK_DOWNED: usize = 8;
    pub const RELAY_ERRORS: usize = 9;
    pub const XMIT_DISCARDS: usize = 10;
    pub const RCV_ERRORS: usize = 11;
    pub const COUNT: usize = 12;
}

type Fields = [u64; field::COUNT];

/// PortCounters' CounterSelect bits (IBA 16.1.3.5) for the fields it carries that count.
const SELECT: [(u16, usize); 8] = [
    (1 << 2, field::LINK_DOWNED),
    (1 << 3, field::RCV_ERRORS),
    (1 << 5, field::RELAY_ERRORS),
    (1 << 6, field::XMIT_DISCARDS),
    (1 << 12, field::XMIT_DATA),
    (1 << 13, field::RCV_DATA),
    (1 << 14, field::XMIT_PKTS),
    (1 << 15, field::RCV_PKTS),
];

/// The switch port's view of the link to a node port with counters `c` (`CTR_*` order).
fn from_node(c: &[u64; COUNTERS_LEN as usize]) -> Fields {
    let at = |i: u32| c.get(i as usize).copied().unwrap_or(0);
    let mut f = [0; field::COUNT];
    // Data counts in units of 4 octets.
    f[field::XMIT_DATA] = at(abi::CTR_RX_OCTETS) / 4;
    f[field::RCV_DATA] = at(abi::CTR_TX_OCTETS) / 4;
    f[field::XMIT_PKTS] = at(abi::CTR_RX_PACKETS);
    f[field::RCV_PKTS] = at(abi::CTR_TX_PACKETS);
    f[field::MC_XMIT_PKTS] = at(abi::CTR_RX_MCAST_PACKETS);
    f[field::MC_RCV_PKTS] = at(abi::CTR_TX_MCAST_PACKETS);
    f[field::UNI_XMIT_PKTS] = f[field::XMIT_PKTS].saturating_sub(f[field::MC_XMIT_PKTS]);
    f[field::UNI_RCV_PKTS] = f[field::RCV_PKTS].saturating_sub(f[field::MC_RCV_PKTS]);
    f[field::LINK_DOWNED] = at(abi::CTR_LINK_DOWNED);
    f[field::RELAY_ERRORS] = at(abi::CTR_TX_DISCARDS);
    f
}

/// The switch port's view of an inter-switch link: `out` the way it sends into, `into`
/// the way it receives from.
fn from_link(out: &SwitchLinkStats, into: &SwitchLinkStats) -> Fields {
    let mut f = [0; field::COUNT];
    f[field::XMIT_DATA] = out.xmit_bytes / 4;
    f[field::RCV_DATA] = into.rcv_bytes / 4;
    f[field::XMIT_PKTS] = out.xmit_pkts;
    f[field::RCV_PKTS] = into.rcv_pkts;
    f[field::MC_XMIT_PKTS] = out.mcast_xmit_pkts;
    f[field::MC_RCV_PKTS] = into.mcast_rcv_pkts;
    f[field::UNI_XMIT_PKTS] = out.xmit_pkts.saturating_sub(out.mcast_xmit_pkts);
    f[field::UNI_RCV_PKTS] = into.rcv_pkts.saturating_sub(into.mcast_rcv_pkts);
    f[field::LINK_DOWNED] = out.downed;
    f[field::XMIT_DISCARDS] = out.discards;
    f[field::RCV_ERRORS] = into.discards;
    f
}

/// The PMAs' state: the bases that resets left, per switch port.
#[derive(Debug, Default)]
pub struct Agent {
    /// By (switch, port): what the port linked when reset (a node port's GUID, or an
    /// inter-switch link), and the bases. A base from another node (one that left, and
    /// another took its LID) no longer applies.
    bases: HashMap<(usize, u8), (Linked, Fields)>,
}

/// What a switch port linked when its counters were reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Linked {
    Node(u64),
    Switch(usize),
}

impl Agent {
    /// The answer to `pkt`, if it is a Performance Management MAD for a switch of this
    /// host (on QP1, to its LID); None for anything else, and for a response.
    pub fn answer(&mut self, pkt: &Packet, ports: &dyn Ports) -> Option<Packet> {
        let Payload::Bytes(b) = &pkt.payload else {
            return None;
        };
        let subnet = ports.subnet();
        let sw = subnet
            .switch_at(pkt.dlid)
            .filter(|&sw| subnet.is_local(sw))?;
        let mad: &[u8; MAD_SIZE] = b.get(..MAD_SIZE)?.try_into().ok()?;
        if pkt.dest_qpn != GSI_QPN || pkt.qkey != GSI_QKEY || mad[1] != class::PERF_MGMT {
            return None;
        }
        let (get, set) = (mad[3] == GET, mad[3] == SET);
        if mad[3] & RESP != 0 {
            return None;
        }
        let mut resp = *mad;
        resp[3] = GET_RESP;
        let st = if mad[0] != 1 || mad[2] != PERF_CLASS_VERSION {
            status::BAD_VERSION
        } else if !(get || set) {
            status::METHOD_UNSUPPORTED
        } else {
            self.attribute(&mut resp, set, (&subnet, sw), ports)
        };
        resp[4..6].copy_from_slice(&st.to_be_bytes());
        let from = Peer {
            lid: pkt.slid,
            qpn: pkt.src_qpn,
        };
        // From the switch asked, so that its tables route the answer back.
        let mut answer = to(from, resp.to_vec());
        answer.slid = pkt.dlid;
        Some(answer)
    }

    /// Fills in the attribute's data; the MAD status.
    fn attribute(
        &mut self,
        mad: &mut [u8; MAD_SIZE],
        set: bool,
        at: (&Subnet, usize),
        ports: &dyn Ports,
    ) -> u16 {
        match (be16(mad, 16), set) {
            (attr::CLASS_PORT_INFO, false) => {
                mad[at::DATA..].fill(0);
                mad[at::DATA] = 1; // BaseVersion
                mad[at::DATA + 1] = PERF_CLASS_VERSION;
                let cap = CAP_ALL_PORT_SELECT | CAP_EXTENDED_WIDTH;
                put(mad, at::DATA + 2, &cap.to_be_bytes());
                put(mad, at::DATA + 4, &RESP_TIME.to_be_bytes());
                0
            }
            (attr::pma::PORT_COUNTERS, _) => self.counters(mad, (false, set), at, ports),
            (attr::pma::PORT_COUNTERS_EXT, _) => self.counters(mad, (true, set), at, ports),
            _ => status::METHOD_ATTR_UNSUPPORTED,
        }
    }

    /// PortCounters (or, `ext`, PortCountersExtended) of the port the MAD selects, after
    /// the resets a Set asks for.
    fn counters(
        &mut self,
        mad: &mut [u8; MAD_SIZE],
        (ext, set): (bool, bool),
        (subnet, sw): (&Subnet, usize),
        ports: &dyn Ports,
    ) -> u16 {
        let num_ports = subnet.switch(sw).map_or(0, |s| s.num_ports);
        let port = mad[PORT_SELECT];
        let select = be16(mad, COUNTER_SELECT);
        let chosen: Vec<u8> = match port {
            ALL_PORTS => (0..=num_ports).collect(),
            p if p <= num_ports => vec![p],
            _ => return status::INVALID_FIELD,
        };
        let reset: Vec<usize> = match (set, ext) {
            (false, _) => Vec::new(),
            // PortCountersExtended: bits 0-7 name its eight fields, in order.
            (true, true) => (0..8).filter(|i| select & (1 << i) != 0).collect(),
            (true, false) => SELECT
                .iter()
                .filter(|(bit, _)| select & bit != 0)
                .map(|&(_, f)| f)
                .collect(),
        };
        let mut sum = [0u64; field::COUNT];
        for p in chosen {
            let f = self.read((subnet, sw, p), &reset, ports);
            for (s, v) in sum.iter_mut().zip(f) {
                *s = s.saturating_add(v);
            }
        }
        // PortSelect and CounterSelect stay; everything after them is ours.
        mad[at::DATA + 4..].fill(0);
        if ext {
            for (i, v) in sum.iter().take(8).enumerate() {
                put(mad, at::DATA + 8 + 8 * i, &v.to_be_bytes());
            }
        } else {
            let sat = |v: u64, max: u64| v.min(max);
            mad[at::DATA + 7] = sat(sum[field::LINK_DOWNED], 0xff) as u8;
            let relay = sat(sum[field::RELAY_ERRORS], 0xffff) as u16;
            put(mad, at::DATA + 12, &relay.to_be_bytes());
            let discards = sat(sum[field::XMIT_DISCARDS], 0xffff) as u16;
            put(mad, at::DATA + 14, &discards.to_be_bytes());
            let rcv_errors = sat(sum[field::RCV_ERRORS], 0xffff) as u16;
            put(mad, at::DATA + 8, &rcv_errors.to_be_bytes());
            for (off, f) in [
                (24, sum[field::XMIT_DATA]),
                (28, sum[field::RCV_DATA]),
                (32, sum[field::XMIT_PKTS]),
                (36, sum[field::RCV_PKTS]),
            ] {
                let v = sat(f, u64::from(u32::MAX)) as u32;
                put(mad, at::DATA + off, &v.to_be_bytes());
            }
        }
        0
    }

    /// Port `p` of switch `sw`: its fields less their bases; the fields in `reset` start
    /// again from 0.
    fn read(
        &mut self,
        (subnet, sw, p): (&Subnet, usize, u8),
        reset: &[usize],
        ports: &dyn Ports,
    ) -> Fields {
        let (linked, raw) = match subnet.peer(sw, p) {
            subnet::Peer::Hca(lid) if p != 0 => {
                let Some(guid) = ports.guid_of(lid) else {
                    return [0; field::COUNT];
                };
                let raw = ports
                    .counters(lid)
                    .map_or([0; field::COUNT], |c| from_node(&c));
                (Linked::Node(guid), raw)
            }
            subnet::Peer::Switch { link, .. } => {
                let Some(out) = subnet.leaving(sw, link) else {
                    return [0; field::COUNT];
                };
                let into = SwitchLink {
                    link,
                    forward: !out.forward,
                };
                let stats = |l| ports.switch_link_stats(l).unwrap_or_default();
                (Linked::Switch(link), from_link(&stats(out), &stats(into)))
            }
            _ => return [0; field::COUNT],
        };
        let base = match self.bases.entry((sw, p)) {
            Entry::Occupied(e) if e.get().0 == linked => &mut e.into_mut().1,
            Entry::Occupied(e) => {
                let slot = e.into_mut();
                *slot = (linked, [0; field::COUNT]);
                &mut slot.1
            }
            Entry::Vacant(e) => &mut e.insert((linked, [0; field::COUNT])).1,
        };
        for (f, (b, r)) in base.iter_mut().zip(raw).enumerate() {
            if reset.contains(&f) {
                *b = r;
            }
        }
        std::array::from_fn(|f| {
            let (r, b) = (raw.get(f), base.get(f));
            r.zip(b).map_or(0, |(r, b)| r.saturating_sub(*b))
        })
    }
}

/// Writes `bytes` into the MAD at `at` (offsets here are constants inside it).
fn put(mad: &mut [u8; MAD_SIZE], at: usize, bytes: &[u8]) {
    if let Some(d) = mad.get_mut(at..at + bytes.len()) {
        d.copy_from_slice(bytes);
    }
}
