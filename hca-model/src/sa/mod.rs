//! The fabric's subnet administrator (IBA volume 1, chapter 15): the fabric is the subnet
//! manager, and answers SA queries that guests send to [`SM_LID`] through their GSI QP (QP1)
//! as a real SA would, so that the kernel's own `ib_sa` consumers (IPoIB, rdma_cm) and
//! user-space tools over `ib_umad` (saquery, srp_daemon) find what they ask for.
//!
//! What it answers, each with the status a real SA gives when it cannot:
//! - ClassPortInfo Get;
//! - PathRecord Get and GetTable (by DGID or DLID, from SGID or SLID or, for a Get, the
//!   asker; P_Key, and the MTU, rate and packet-lifetime selectors honoured), and
//!   MultiPathRecord GetMulti (the paths between several SGIDs and DGIDs at once, sent
//!   as a one-segment RMPP request and answered as a transfer);
//! - MCMemberRecord Set (join), Delete (leave), Get and GetTable (`groups.rs`);
//! - NodeRecord and PortInfoRecord Get and GetTable (`records.rs`);
//! - ServiceRecord Set, Get, GetTable and Delete (`services.rs`);
//! - InformInfo Set: subscriptions to traps 64 and 65 (a port's GID in and out of service),
//!   which the SA reports when a port's link comes up or goes down, or a node joins or
//!   leaves the fabric, and InformInfoRecord Get and GetTable: the subscriptions
//!   (`inform.rs`);
//! - the records of the subnet's structure, Get and GetTable, as the switch's SMPs show it:
//!   SMInfoRecord, SwitchInfoRecord, LinkRecord, LinearForwardingTableRecord,
//!   MulticastForwardingTableRecord, GUIDInfoRecord, P_KeyTableRecord, SL2VLTableRecord and
//!   VLArbitrationTableRecord (`topology.rs`). With NodeRecord and PortInfoRecord (which
//!   list the switch too) that is every record Debian's `saquery` asks for.
//!
//! The fabric's node answers subnet management packets on QP0 ([`sm`]): a switch linking
//! every port, with the SM (SMInfo) at the same LID. Its Performance Management Agent
//! ([`pma`]) answers on QP1 with the switch ports' counters.
//!
//! A GetTable answer goes back as an RMPP transfer (`rmpp.rs`), as ib_mad expects; a Get
//! that matches more than one record gets "too many records", one that matches none "no
//! records". Unsupported queries get "method/attribute not supported" rather than silence,
//! so a caller never waits out its timeout.
//!
//! Everything the SA keeps is bounded, whatever guests send: groups by the MLID range,
//! service records, subscriptions and RMPP transfers by the limits in their modules, and a
//! table by [`MAX_TABLE_RECORDS`].
//!
//! MADs are big-endian on the wire; offsets below are bytes from the MAD's start.

mod groups;
mod inform;
pub mod mad;
pub mod pma;
mod records;
mod rmpp;
mod services;
pub mod sm;
pub mod switch_tables;
#[cfg(test)]
mod tests;
mod topology;

pub use groups::Group;
pub use mad::{status, MAD_SIZE};

use crate::abi::Lid;
use crate::abi::{GSI_QKEY, GSI_QPN, SMI_QPN};
use crate::packet::{Packet, Payload};
use mad::{at, attr, class, method, SA_CLASS_VERSION};

/// The SM's (and SA's) LID: the highest unicast LID, clear of the nodes' 1, 2, ...
pub const SM_LID: Lid = 0xbfff;
/// The subnet prefix every port's GID starts with (link-local).
pub const SUBNET_PREFIX: u64 = 0xfe80_0000_0000_0000;
/// The first multicast LID.
pub const MLID_BASE: Lid = 0xc000;
/// The most records one GetTable answer carries: every path of a 64-node fabric (the most
/// hcabench boots; 256 KiB of path records); a query that matches more gets "no resources".
pub const MAX_TABLE_RECORDS: usize = 4096;

/// IB MTU enums (1: 256 .. 5: 4096) and rate enums, as path and group records carry them.
const MTU_4096: u8 = 5;
const MTU_2048: u8 = 4;
/// 4x QDR, 40 Gb/s.
const RATE_40G: u8 = 7;
/// 10 Gb/s (OpenSM's default for IPoIB groups).
const RATE_10G: u8 = 3;
/// 4.096 us * 2^18: about one second, the SA's answer time (RespTimeValue, SubnetTimeOut).
const RESP_TIME: u8 = 18;
/// The packet lifetime paths and groups get unless the fabric is told otherwise: OpenSM's
/// default (`packet_life_time 0x12`), 4.096 us * 2^18, about 1.07 s. ib_cm gives a
/// connection's QPs a local ACK timeout one step longer (about 2.1 s), so it sets how long a
/// lost packet stalls an RC connection.
pub const DEFAULT_PACKET_LIFE: u8 = 18;
/// The largest packet lifetime: ib_cm adds one to it for a QP's 5-bit ACK timeout (31 at
/// most, about 2.4 hours).
pub const MAX_PACKET_LIFE: u8 = 30;
const DEFAULT_PKEY: u16 = 0xffff;

/// The IPoIB broadcast group of the default partition (RFC 4391), with OpenSM's defaults.
pub const IPOIB_BROADCAST_MGID: [u8; 16] = [
    0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];
/// The IPv4 broadcast group's Q_Key (OpenSM's default).
const IPOIB_QKEY: u32 = 0x0000_000b;

/// The port GID of the port whose GUID is `guid`.
pub fn port_gid(guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&SUBNET_PREFIX.to_be_bytes());
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}

/// The GUID in a link-local GID of this subnet.
fn gid_guid(gid: &[u8; 16]) -> Option<u64> {
    (be64(gid, 0) == SUBNET_PREFIX).then(|| be64(gid, 8))
}

// Readers of fixed offsets inside a MAD, which is always MAD_SIZE bytes by the time any
// handler sees it (`answer` takes it as an array); past the end they read zeros.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u16::from_be_bytes)
}

fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}

pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    u64::from(be32(b, at)) << 32 | u64::from(be32(b, at + 4))
}

fn gid_at(b: &[u8], at: usize) -> [u8; 16] {
    b.get(at..at + 16)
        .and_then(|s| s.try_into().ok())
        .unwrap_or_default()
}

/// What the SA needs to know about the fabric's ports.
pub trait Ports {
    /// The LID of the port with this GUID, if it is on the fabric.
    fn lid_of(&self, guid: u64) -> Option<Lid>;
    /// The GUID of the port at `lid`, if there is one.
    fn guid_of(&self, lid: Lid) -> Option<u64>;
    /// The LIDs of every port on the fabric, ascending.
    fn lids(&self) -> Vec<Lid>;
    /// Whether the port at `lid` has its link up.
    fn link_up(&self, lid: Lid) -> bool;
    /// The capability bits the port at `lid` advertises (PortInfo:CapabilityMask).
    fn capability_mask(&self, lid: Lid) -> u32;
    /// The P_Key table of the port at `lid` (see `crate::partition`).
    fn pkeys(&self, _lid: Lid) -> crate::partition::PKeyTable {
        crate::partition::default_table()
    }
    /// The fabric's clock, in nanoseconds (service leases run on it).
    fn now_ns(&self) -> u64;
    /// The counters of the port at `lid` (`CTR_*` order), for the switch's PMA ([`pma`]).
    /// Reading them takes the port's device lock.
    fn counters(&self, _lid: Lid) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        None
    }
    /// What crossed inter-switch link `link` that way, for the switches' PMAs.
    fn switch_link_stats(
        &self,
        _link: crate::subnet::SwitchLink,
    ) -> Option<crate::fabric::SwitchLinkStats> {
        None
    }
    /// The switches' tables as a user's SM set them (by switch index), while one manages
    /// the subnet (`switch_tables.rs`); None while the fabric is the SM.
    fn switch_tables(&self) -> Option<&std::sync::RwLock<Vec<switch_tables::SwitchTables>>> {
        None
    }
    /// The switches and their routes as the SM's last sweep left them (by default the one
    /// switch whose port n links LID n).
    fn subnet(&self) -> std::sync::Arc<crate::subnet::Subnet> {
        let single = crate::subnet::Topology::single();
        std::sync::Arc::new(crate::subnet::Subnet::new(single, &self.lids()))
    }
}

/// A port and QP that MADs come from and go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Peer {
    lid: Lid,
    qpn: u32,
}

/// One decoded SA request.
struct Request<'a> {
    mad: &'a [u8; MAD_SIZE],
    method: u8,
    attr: u16,
    comp_mask: u64,
    from: Peer,
}

impl Request<'_> {
    /// The record the request carries (its template).
    fn data(&self) -> &[u8; MAD_SIZE - at::SA_DATA] {
        let (_, data) = self.mad.split_at(at::SA_DATA);
        data.try_into().unwrap_or(&[0; MAD_SIZE - at::SA_DATA])
    }
    fn has(&self, bits: u64) -> bool {
        self.comp_mask & bits == bits
    }
    /// Whether the answer is every record that matches, as an RMPP transfer (GetTable,
    /// GetMulti).
    fn is_table(&self) -> bool {
        self.method == method::GET_TABLE || self.method == method::GET_MULTI
    }
}

/// What a handler found for a query.
enum Found {
    /// The records that match a Get or GetTable, each `size` bytes (a multiple of 8, so
    /// the SA header's AttributeOffset can count them).
    Records { size: usize, rows: Vec<Vec<u8>> },
    /// The one record a Set or Delete answers with.
    One(Vec<u8>),
}

/// A selector (0: greater than, 1: less than, 2: exactly, 3: largest available) over
/// `value`, against the most the fabric offers (`max`; every enum value from 1 up to it
/// works): the best value that meets it, or None.
fn select(selector: u8, value: u8, max: u8) -> Option<u8> {
    match selector {
        0 => (value < max).then_some(max),
        1 => (value > 1).then(|| (value - 1).min(max)),
        2 => (1..=max).contains(&value).then_some(value),
        _ => Some(max),
    }
}

/// Whether `have` meets selector `selector` over `value`.
fn meets(selector: u8, value: u8, have: u8) -> bool {
    match selector {
        0 => have > value,
        1 => have < value,
        2 => have == value,
        _ => true,
    }
}

/// The SA's state: multicast groups, service records, trap subscriptions and the RMPP
/// transfers under way.
#[derive(Debug)]
pub struct SubnetAdmin {
    groups: groups::Groups,
    services: services::Services,
    informs: inform::Subscriptions,
    transfers: rmpp::Transfers,
    /// Transaction IDs of the SA's own requests (Reports).
    next_tid: u64,
    /// The PacketLifeTime of every path and group (see [`DEFAULT_PACKET_LIFE`]).
    packet_life: u8,
    /// MADs answered, the SM's activity count ([`sm`]).
    activity: u32,
}

impl Default for SubnetAdmin {
    fn default() -> Self {
        Self {
            groups: Default::default(),
            services: Default::default(),
            informs: Default::default(),
            transfers: Default::default(),
            next_tid: 0,
            packet_life: DEFAULT_PACKET_LIFE,
            activity: 0,
        }
    }
}

impl SubnetAdmin {
    /// The SA as the subnet comes up: the default partition's IPoIB broadcast group exists.
    pub fn new() -> Self {
        Self::default()
    }

    /// The PacketLifeTime the SA gives paths and groups (4.096 us * 2^life).
    pub fn packet_life(&self) -> u8 {
        self.packet_life
    }

    /// Sets the PacketLifeTime of the paths and groups the SA hands out from now on (an
    /// OpenSM's `packet_life_time`); None (changing nothing) past [`MAX_PACKET_LIFE`].
    pub fn set_packet_life(&mut self, life: u8) -> Option<()> {
        (life <= MAX_PACKET_LIFE).then(|| self.packet_life = life)
    }

    /// Every multicast group the SA holds.
    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter()
    }

    /// The partitions beside the default are these (P_Keys): each gets its IPoIB broadcast
    /// group, made by the SA as OpenSM makes one for a partition with its `ipoib` flag
    /// (IPoIB joins it and does not create it); a partition gone takes its group along.
    pub fn set_partitions(&mut self, pkeys: &[u16]) {
        self.groups.partition_broadcasts(pkeys);
    }

    /// The group with multicast LID `mlid`.
    pub fn group_by_mlid(&self, mlid: Lid) -> Option<&Group> {
        self.groups.by_mlid(mlid)
    }

    /// How many service records and trap subscriptions the SA holds.
    pub fn registrations(&self) -> (usize, usize) {
        (self.services.len(), self.informs.len())
    }

    /// Answers a packet sent to the SA's QP1, or an SMP to the SM's QP0 ([`sm`]): the
    /// packets that go back (none for an RMPP acknowledgement that ends a transfer, or a
    /// response to the SA's Report). None for what is not the SA's or SM's (not an SA MAD
    /// for QP1, or a response the SA did not ask for).
    pub fn answer(&mut self, pkt: &Packet, ports: &dyn Ports) -> Option<Vec<Packet>> {
        if pkt.dest_qpn == SMI_QPN {
            return match self.answer_smp(pkt, None, ports)? {
                sm::Out::To(p) => Some(vec![p]),
                sm::Out::Across { .. } => None,
            };
        }
        let out = self.answer_gsi(pkt, ports);
        if out.is_some() {
            self.activity = self.activity.wrapping_add(1);
        }
        out
    }

    /// Answers an SMP to the switches ([`sm`]): from a port of this host, or (`at`: the
    /// local switch and port it came into) over an inter-host link.
    pub fn answer_smp(
        &mut self,
        pkt: &Packet,
        at: Option<(usize, u8)>,
        ports: &dyn Ports,
    ) -> Option<sm::Out> {
        let out = match at {
            None => sm::answer(pkt, self.activity, ports),
            Some(at) => sm::answer_arrived(pkt, at, self.activity, ports),
        };
        if out.is_some() {
            self.activity = self.activity.wrapping_add(1);
        }
        out
    }

    fn answer_gsi(&mut self, pkt: &Packet, ports: &dyn Ports) -> Option<Vec<Packet>> {
        let Payload::Bytes(mad) = &pkt.payload else {
            return None;
        };
        // Exactly one MAD: its fields are read at fixed offsets below.
        let Some(Ok(mad)) = mad.get(..MAD_SIZE).map(<&[u8; MAD_SIZE]>::try_from) else {
            return None;
        };
        if pkt.dest_qpn != GSI_QPN || pkt.qkey != GSI_QKEY || mad[1] != class::SUBN_ADM {
            return None;
        }
        let from = Peer {
            lid: pkt.slid,
            qpn: pkt.src_qpn,
        };
        let mut out = Vec::new();
        match rmpp::Header::of(mad) {
            // An acknowledgement, stop or abort of one of the SA's own transfers.
            Some(h) if h.kind != rmpp::DATA => {
                let more = self.transfers.control(from, be64(mad, 8), &h);
                return Some(more.into_iter().map(|m| to(from, m)).collect());
            }
            // A request sent as an RMPP transfer: the SA takes one-segment requests (every
            // SA record fits one) and acknowledges them as the receiver does.
            Some(h) => {
                if !h.is_single() {
                    let mut refuse = *mad;
                    rmpp::abort(&mut refuse);
                    return Some(vec![to(from, refuse.to_vec())]);
                }
                out.push(to(from, rmpp::ack_of(mad)));
            }
            None => {}
        }
        if mad[3] & method::RESP != 0 {
            // A subscriber's ReportResp ends nothing the SA waits for (it sends a Report
            // once); any other response is not the SA's to take.
            return (mad[3] == method::REPORT | method::RESP).then_some(out);
        }
        let req = Request {
            mad,
            method: mad[3],
            attr: be16(mad, 16),
            comp_mask: be64(mad, at::SA_COMP_MASK),
            from,
        };
        let mut resp: [u8; MAD_SIZE] = *mad;
        // The answer is never an RMPP segment unless `rmpp` makes it one.
        resp[24..36].fill(0);
        let reply = if matches!(
            req.method,
            method::DELETE | method::GET_TABLE | method::GET_MULTI
        ) {
            req.method | method::RESP
        } else {
            method::GET | method::RESP
        };
        resp[3] = reply;
        let found = if mad[0] != 1 || mad[2] != SA_CLASS_VERSION {
            Err(status::BAD_VERSION)
        } else {
            self.handle(&req, ports)
        };
        match found {
            Err(st) => {
                resp[4..6].copy_from_slice(&st.to_be_bytes());
                out.push(to(from, resp.to_vec()));
            }
            Ok(Found::One(rec)) => {
                put_data(&mut resp, &rec);
                out.push(to(from, resp.to_vec()));
            }
            Ok(Found::Records { size, rows }) if req.is_table() => {
                if rows.len() > MAX_TABLE_RECORDS {
                    resp[4..6].copy_from_slice(&status::NO_RESOURCES.to_be_bytes());
                    out.push(to(from, resp.to_vec()));
                } else {
                    resp[at::SA_ATTR_OFFSET..at::SA_ATTR_OFFSET + 2]
                        .copy_from_slice(&((size / 8) as u16).to_be_bytes());
                    let mut data = Vec::with_capacity(size * rows.len());
                    for r in &rows {
                        data.extend_from_slice(r);
                        data.resize(data.len() + size - r.len().min(size), 0);
                    }
                    let first = self.transfers.start(from, &resp, &data);
                    out.extend(first.into_iter().map(|m| to(from, m)));
                }
            }
            Ok(Found::Records { size, rows }) => {
                let st = match rows.as_slice() {
                    [one] => {
                        put_data(&mut resp, one);
                        resp[at::SA_ATTR_OFFSET..at::SA_ATTR_OFFSET + 2]
                            .copy_from_slice(&((size / 8) as u16).to_be_bytes());
                        0
                    }
                    [] => status::NO_RECORDS,
                    _ => status::TOO_MANY_RECORDS,
                };
                resp[4..6].copy_from_slice(&st.to_be_bytes());
                out.push(to(from, resp.to_vec()));
            }
        }
        Some(out)
    }

    /// The Reports that a port coming into service (trap 64: its link up, or its node on the
    /// fabric) or going out of it (trap 65) sends to the subscribers of that trap.
    pub fn port_changed(&mut self, lid: Lid, up: bool, ports: &dyn Ports) -> Vec<Packet> {
        let Some(guid) = ports.guid_of(lid) else {
            return Vec::new();
        };
        let trap = if up {
            inform::TRAP_GID_IN_SERVICE
        } else {
            inform::TRAP_GID_OUT_OF_SERVICE
        };
        let mut out = Vec::new();
        for sub in self.informs.subscribers(trap, lid) {
            self.next_tid += 1;
            let mad = inform::report(self.next_tid, trap, &port_gid(guid));
            out.push(to(sub, mad));
        }
        out
    }

    fn handle(&mut self, req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
        use method::*;
        match (req.method, req.attr) {
            (GET, attr::CLASS_PORT_INFO) => Ok(Found::One(records::class_port_info())),
            (GET | GET_TABLE, attr::sa::PATH_RECORD) => {
                records::paths(req, ports, self.packet_life)
            }
            (GET_MULTI, attr::sa::MULTIPATH_RECORD) => {
                records::multipaths(req, ports, self.packet_life)
            }
            (GET | GET_TABLE, attr::sa::NODE_RECORD) => records::nodes(req, ports),
            (GET | GET_TABLE, attr::sa::PORT_INFO_RECORD) => records::port_infos(req, ports),
            (SET, attr::sa::MCMEMBER_RECORD) => self.groups.join(req, ports, self.packet_life),
            (DELETE, attr::sa::MCMEMBER_RECORD) => self.groups.leave(req, self.packet_life),
            (GET | GET_TABLE, attr::sa::MCMEMBER_RECORD) => {
                Ok(self.groups.find(req, self.packet_life))
            }
            (SET, attr::sa::SERVICE_RECORD) => self.services.set(req, ports),
            (DELETE, attr::sa::SERVICE_RECORD) => self.services.delete(req, ports.now_ns()),
            (GET | GET_TABLE, attr::sa::SERVICE_RECORD) => {
                Ok(self.services.find(req, ports.now_ns()))
            }
            (SET, attr::INFORM_INFO) => self.informs.set(req, ports),
            (GET | GET_TABLE, attr::sa::INFORM_INFO_RECORD) => self.informs.records(req, ports),
            (GET | GET_TABLE, attr::sa::SM_INFO_RECORD) => topology::sm_infos(req, self.activity),
            (GET | GET_TABLE, attr::sa::SWITCH_INFO_RECORD) => topology::switch_infos(req, ports),
            (GET | GET_TABLE, attr::sa::LINK_RECORD) => topology::links(req, ports),
            (GET | GET_TABLE, attr::sa::LFT_RECORD) => topology::lfts(req, ports),
            (GET | GET_TABLE, attr::sa::MFT_RECORD) => {
                topology::mfts(req, self.groups.iter(), ports)
            }
            (GET | GET_TABLE, attr::sa::GUID_INFO_RECORD) => topology::guid_infos(req, ports),
            (GET | GET_TABLE, attr::sa::PKEY_TABLE_RECORD) => topology::pkey_tables(req, ports),
            (GET | GET_TABLE, attr::sa::SL2VL_TABLE_RECORD) => topology::sl2vl_tables(req, ports),
            (GET | GET_TABLE, attr::sa::VLARB_TABLE_RECORD) => topology::vlarb_tables(req),
            (GET | SET | GET_TABLE | GET_MULTI | DELETE, _) => Err(status::METHOD_ATTR_UNSUPPORTED),
            _ => Err(status::METHOD_UNSUPPORTED),
        }
    }
}

/// Writes `rec` as the data of `mad`, clearing the rest of the data area.
fn put_data(mad: &mut [u8; MAD_SIZE], rec: &[u8]) {
    let (_, data) = mad.split_at_mut(at::SA_DATA);
    data.fill(0);
    for (d, r) in data.iter_mut().zip(rec) {
        *d = *r;
    }
}

/// A MAD from the SA's QP1 to `peer`.
fn to(peer: Peer, mad: Vec<u8>) -> Packet {
    mad::on_gsi(SM_LID, GSI_QPN, peer.lid, peer.qpn, mad)
}
