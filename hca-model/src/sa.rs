//! The fabric's subnet administrator (IBA volume 1, chapter 15): the fabric is the subnet
//! manager, and answers SA queries that guests send to [`SM_LID`] through their GSI QP (QP1)
//! as a real SA would, so that the kernel's own `ib_sa` consumers (IPoIB, rdma_cm) find paths
//! and join multicast groups.
//!
//! What it answers, each with the status a real SA gives when it cannot:
//! - ClassPortInfo Get;
//! - PathRecord Get (by DGID or DLID, from SGID or SLID or the asker; P_Key, and the MTU, rate
//!   and packet-lifetime selectors honoured);
//! - MCMemberRecord Set (join, creating the group and its MLID when the request carries what
//!   a group needs), Delete (leave; a group with no members goes, except the IPoIB broadcast
//!   group of the default partition, which exists from the start as OpenSM creates it), Get;
//! - NodeRecord Get (by LID or node GUID).
//!
//! Every answer fits one MAD. Queries the SA does not serve (GetTable, which needs RMPP;
//! PortInfoRecord, ServiceRecord, InformInfo) get "method/attribute not supported" rather
//! than silence, so a caller never waits out its timeout.
//!
//! MADs are big-endian on the wire; offsets below are bytes from the MAD's start.

use std::collections::BTreeMap;

use crate::abi::GSI_QKEY;
use crate::fabric::Lid;
use crate::packet::{Packet, Payload, UD_SEND_ONLY};

/// The SM's (and SA's) LID: the highest unicast LID, clear of the nodes' 1, 2, ...
pub const SM_LID: Lid = 0xbfff;
/// A MAD is 256 bytes on a GSI QP.
pub const MAD_SIZE: usize = 256;
/// The subnet prefix every port's GID starts with (link-local).
pub const SUBNET_PREFIX: u64 = 0xfe80_0000_0000_0000;
/// The first multicast LID.
pub const MLID_BASE: Lid = 0xc000;

/// Management class of the SA, and its class version.
const CLASS_SUBN_ADM: u8 = 0x03;
const SA_CLASS_VERSION: u8 = 2;

const METHOD_GET: u8 = 0x01;
const METHOD_SET: u8 = 0x02;
const METHOD_GET_RESP: u8 = 0x81;
const METHOD_DELETE: u8 = 0x15;
const METHOD_DELETE_RESP: u8 = 0x95;

const ATTR_CLASS_PORT_INFO: u16 = 0x0001;
const ATTR_PATH_RECORD: u16 = 0x0035;
const ATTR_MCMEMBER_RECORD: u16 = 0x0038;
const ATTR_NODE_RECORD: u16 = 0x0011;

/// NodeRecord component mask bits (IBA 15.2.5.2): the LID, or NodeInfo's node GUID.
mod nr {
    pub const LID: u64 = 1 << 0;
    pub const NODE_GUID: u64 = 1 << 7;
}

/// MAD status: common codes (bits 2-4) and SA codes (bits 8-14).
pub mod status {
    pub const BAD_VERSION: u16 = 1 << 2;
    pub const METHOD_UNSUPPORTED: u16 = 2 << 2;
    pub const METHOD_ATTR_UNSUPPORTED: u16 = 3 << 2;
    pub const INVALID_FIELD: u16 = 7 << 2;
    pub const NO_RESOURCES: u16 = 1 << 8;
    pub const REQ_INVALID: u16 = 2 << 8;
    pub const NO_RECORDS: u16 = 3 << 8;
    pub const INVALID_GID: u16 = 5 << 8;
    pub const INSUFFICIENT_COMPONENTS: u16 = 6 << 8;
}

/// Where the SA header and data sit in a MAD.
const COMP_MASK_OFFSET: usize = 48;
const DATA_OFFSET: usize = 56;

/// IB MTU enums (1: 256 .. 5: 4096) and rate enums, as path and group records carry them.
const MTU_4096: u8 = 5;
const MTU_2048: u8 = 4;
/// 4x QDR, 40 Gb/s.
const RATE_40G: u8 = 7;
/// 10 Gb/s (OpenSM's default for IPoIB groups).
const RATE_10G: u8 = 3;
/// 4.096 us * 2^18: about one second, the SA's answer time and a path's packet lifetime.
const LIFE_TIME: u8 = 18;
const DEFAULT_PKEY: u16 = 0xffff;

/// The IPoIB broadcast group of the default partition (RFC 4391), with OpenSM's defaults.
pub const IPOIB_BROADCAST_MGID: [u8; 16] = [
    0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
];
const IPOIB_QKEY: u32 = 0x0000_000b;

/// PathRecord component mask bits (IBA 15.2.5.16).
mod pr {
    pub const DGID: u64 = 1 << 2;
    pub const SGID: u64 = 1 << 3;
    pub const DLID: u64 = 1 << 4;
    pub const SLID: u64 = 1 << 5;
    pub const PKEY: u64 = 1 << 13;
    pub const MTU_SELECTOR: u64 = 1 << 16;
    pub const MTU: u64 = 1 << 17;
    pub const RATE_SELECTOR: u64 = 1 << 18;
    pub const RATE: u64 = 1 << 19;
    pub const LIFE_SELECTOR: u64 = 1 << 20;
    pub const LIFE: u64 = 1 << 21;
}

/// MCMemberRecord component mask bits (IBA 15.2.5.17).
mod mc {
    pub const MGID: u64 = 1 << 0;
    pub const PORT_GID: u64 = 1 << 1;
    pub const QKEY: u64 = 1 << 2;
    pub const MTU_SELECTOR: u64 = 1 << 4;
    pub const MTU: u64 = 1 << 5;
    pub const TCLASS: u64 = 1 << 6;
    pub const PKEY: u64 = 1 << 7;
    pub const RATE_SELECTOR: u64 = 1 << 8;
    pub const RATE: u64 = 1 << 9;
    pub const SL: u64 = 1 << 12;
    pub const FLOW_LABEL: u64 = 1 << 13;
    pub const JOIN_STATE: u64 = 1 << 16;
    /// What a join must give to create a group (IBA o15-0.2.?: Q_Key, P_Key, SL, FlowLabel,
    /// TClass and JoinState).
    pub const CREATE: u64 = QKEY | PKEY | SL | FLOW_LABEL | TCLASS | JOIN_STATE;
}

/// The port GID of the port whose GUID is `guid`.
pub fn port_gid(guid: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&SUBNET_PREFIX.to_be_bytes());
    g[8..].copy_from_slice(&guid.to_be_bytes());
    g
}

/// The GUID in a link-local GID of this subnet.
fn gid_guid(gid: &[u8; 16]) -> Option<u64> {
    let prefix = u64::from_be_bytes(gid[..8].try_into().unwrap());
    (prefix == SUBNET_PREFIX).then(|| u64::from_be_bytes(gid[8..].try_into().unwrap()))
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

fn gid_at(b: &[u8], at: usize) -> [u8; 16] {
    b[at..at + 16].try_into().unwrap()
}

/// What the SA needs to know about the fabric's ports.
pub trait Ports {
    /// The LID of the port with this GUID, if it is on the fabric.
    fn lid_of(&self, guid: u64) -> Option<Lid>;
    /// The GUID of the port at `lid`, if there is one.
    fn guid_of(&self, lid: Lid) -> Option<u64>;
}

/// A multicast group the SA manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub mgid: [u8; 16],
    pub mlid: Lid,
    pub qkey: u32,
    pub pkey: u16,
    pub mtu: u8,
    pub rate: u8,
    pub sl: u8,
    pub flow_label: u32,
    pub tclass: u8,
    /// Members by port GUID, with their JoinState bits (full, non, send-only).
    pub members: BTreeMap<u64, u8>,
    /// Kept with no members (the partition's IPoIB broadcast group).
    pub permanent: bool,
}

/// The SA's state: its multicast groups.
#[derive(Debug)]
pub struct SubnetAdmin {
    groups: BTreeMap<[u8; 16], Group>,
    next_mlid: Lid,
    /// MGIDs the SA assigned to joins that asked for one.
    next_mgid: u64,
}

impl Default for SubnetAdmin {
    fn default() -> Self {
        Self::new()
    }
}

/// One decoded SA request.
struct Request<'a> {
    mad: &'a [u8],
    method: u8,
    attr: u16,
    comp_mask: u64,
}

impl Request<'_> {
    fn data(&self) -> &[u8] {
        &self.mad[DATA_OFFSET..]
    }
    fn has(&self, bits: u64) -> bool {
        self.comp_mask & bits == bits
    }
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

impl SubnetAdmin {
    /// The SA as the subnet comes up: the default partition's IPoIB broadcast group exists.
    pub fn new() -> Self {
        let mut sa = Self {
            groups: BTreeMap::new(),
            next_mlid: MLID_BASE,
            next_mgid: 1,
        };
        let mlid = sa.alloc_mlid().expect("a fresh SA has MLIDs");
        sa.groups.insert(
            IPOIB_BROADCAST_MGID,
            Group {
                mgid: IPOIB_BROADCAST_MGID,
                mlid,
                qkey: IPOIB_QKEY,
                pkey: DEFAULT_PKEY,
                mtu: MTU_2048,
                rate: RATE_10G,
                sl: 0,
                flow_label: 0,
                tclass: 0,
                members: BTreeMap::new(),
                permanent: true,
            },
        );
        sa
    }

    pub fn groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.values()
    }

    /// The group with multicast LID `mlid`.
    pub fn group_by_mlid(&self, mlid: Lid) -> Option<&Group> {
        self.groups.values().find(|g| g.mlid == mlid)
    }

    fn alloc_mlid(&mut self) -> Option<Lid> {
        let used: Vec<Lid> = self.groups.values().map(|g| g.mlid).collect();
        (0..0x3fff)
            .map(|i| MLID_BASE + (self.next_mlid - MLID_BASE + i) % 0x3fff)
            .find(|l| !used.contains(l))
            .inspect(|&l| self.next_mlid = l + 1)
    }

    /// Answers a packet sent to the SA's QP1; None for what no SA answers (not a MAD for
    /// the SA's QP, or a response).
    pub fn answer(&mut self, pkt: &Packet, ports: &dyn Ports) -> Option<Packet> {
        let Payload::Bytes(mad) = &pkt.payload else {
            return None;
        };
        if pkt.dest_qpn != crate::abi::GSI_QPN
            || pkt.qkey != GSI_QKEY
            || mad.len() < MAD_SIZE
            || mad[1] != CLASS_SUBN_ADM
            || mad[3] & 0x80 != 0
        {
            return None;
        }
        let mut resp = mad[..MAD_SIZE].to_vec();
        let (method, st) = self.handle(&mad[..MAD_SIZE], pkt.slid, ports, &mut resp);
        resp[3] = method;
        resp[4..6].copy_from_slice(&st.to_be_bytes());
        // RMPP header: a single-MAD answer is not an RMPP transfer.
        resp[24..36].fill(0);
        // The SA answers within its RespTimeValue; this is ib_mad's "no RMPP" answer.
        Some(Packet {
            slid: SM_LID,
            dlid: pkt.slid,
            opcode: UD_SEND_ONLY,
            dest_qpn: pkt.src_qpn,
            src_qpn: crate::abi::GSI_QPN,
            qkey: GSI_QKEY,
            payload: Payload::Bytes(resp),
            ..Default::default()
        })
    }

    /// Fills `resp`'s data; returns the response method and status.
    fn handle(&mut self, mad: &[u8], from: Lid, ports: &dyn Ports, resp: &mut [u8]) -> (u8, u16) {
        let req = Request {
            mad,
            method: mad[3],
            attr: be16(mad, 16),
            comp_mask: be64(mad, COMP_MASK_OFFSET),
        };
        let reply = match req.method {
            METHOD_DELETE => METHOD_DELETE_RESP,
            _ => METHOD_GET_RESP,
        };
        if mad[0] != 1 || mad[2] != SA_CLASS_VERSION {
            return (reply, status::BAD_VERSION);
        }
        let data = &mut resp[DATA_OFFSET..];
        let st = match (req.method, req.attr) {
            (METHOD_GET, ATTR_CLASS_PORT_INFO) => {
                class_port_info(data);
                0
            }
            (METHOD_GET, ATTR_PATH_RECORD) => path_record(&req, from, ports, data),
            (METHOD_SET, ATTR_MCMEMBER_RECORD) => self.join(&req, ports, data),
            (METHOD_DELETE, ATTR_MCMEMBER_RECORD) => self.leave(&req, data),
            (METHOD_GET, ATTR_MCMEMBER_RECORD) => self.get_group(&req, data),
            (METHOD_GET, ATTR_NODE_RECORD) => node_record(&req, ports, data),
            (METHOD_GET | METHOD_SET | METHOD_DELETE, _) => status::METHOD_ATTR_UNSUPPORTED,
            _ => status::METHOD_UNSUPPORTED,
        };
        (reply, st)
    }

    fn join(&mut self, req: &Request, ports: &dyn Ports, out: &mut [u8]) -> u16 {
        let d = req.data();
        if !req.has(mc::PORT_GID | mc::JOIN_STATE) {
            return status::INSUFFICIENT_COMPONENTS;
        }
        let port_gid = gid_at(d, 16);
        let Some(guid) = gid_guid(&port_gid).filter(|&g| ports.lid_of(g).is_some()) else {
            return status::INVALID_GID;
        };
        let join_state = d[48] & 0x0f;
        if join_state == 0 {
            return status::REQ_INVALID;
        }
        let mut mgid = if req.has(mc::MGID) {
            gid_at(d, 0)
        } else {
            [0; 16]
        };
        if mgid == [0; 16] {
            // The SA picks an MGID in the IBA's SA-assigned range (ff1x:a01b::/...).
            mgid = [0xff, 0x12, 0xa0, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            mgid[8..].copy_from_slice(&self.next_mgid.to_be_bytes());
            self.next_mgid += 1;
        } else if mgid[0] != 0xff {
            return status::INVALID_GID;
        }
        if !self.groups.contains_key(&mgid) {
            if !req.has(mc::CREATE) {
                // No such group, and not enough to make one.
                return status::REQ_INVALID;
            }
            let Some(mlid) = self.alloc_mlid() else {
                return status::NO_RESOURCES;
            };
            let mtu = if req.has(mc::MTU_SELECTOR | mc::MTU) {
                match select(d[38] >> 6, d[38] & 0x3f, MTU_4096) {
                    Some(m) => m,
                    None => return status::REQ_INVALID,
                }
            } else {
                MTU_4096
            };
            let rate = if req.has(mc::RATE_SELECTOR | mc::RATE) {
                match select(d[42] >> 6, d[42] & 0x3f, RATE_40G) {
                    Some(r) => r,
                    None => return status::REQ_INVALID,
                }
            } else {
                RATE_40G
            };
            let sl_flow_hop = be32(d, 44);
            self.groups.insert(
                mgid,
                Group {
                    mgid,
                    mlid,
                    qkey: be32(d, 32),
                    pkey: be16(d, 40),
                    mtu,
                    rate,
                    sl: (sl_flow_hop >> 28) as u8,
                    flow_label: (sl_flow_hop >> 8) & 0xf_ffff,
                    tclass: d[39],
                    members: BTreeMap::new(),
                    permanent: false,
                },
            );
        }
        let g = self.groups.get_mut(&mgid).expect("found or made above");
        // A join must agree with the group on what it names.
        if (req.has(mc::QKEY) && be32(d, 32) != g.qkey)
            || (req.has(mc::PKEY) && be16(d, 40) != g.pkey)
        {
            return status::REQ_INVALID;
        }
        // The group's MTU must meet the member's selector (IPoIB asks for exactly the
        // broadcast group's).
        if req.has(mc::MTU_SELECTOR | mc::MTU) && !meets(d[38] >> 6, d[38] & 0x3f, g.mtu) {
            return status::REQ_INVALID;
        }
        *g.members.entry(guid).or_insert(0) |= join_state;
        let state = g.members[&guid];
        write_member(out, g, &port_gid, state);
        0
    }

    fn leave(&mut self, req: &Request, out: &mut [u8]) -> u16 {
        let d = req.data();
        if !req.has(mc::MGID | mc::PORT_GID | mc::JOIN_STATE) {
            return status::INSUFFICIENT_COMPONENTS;
        }
        let (mgid, port_gid) = (gid_at(d, 0), gid_at(d, 16));
        let Some(guid) = gid_guid(&port_gid) else {
            return status::INVALID_GID;
        };
        let Some(g) = self.groups.get_mut(&mgid) else {
            return status::NO_RECORDS;
        };
        let Some(state) = g.members.get_mut(&guid) else {
            return status::NO_RECORDS;
        };
        *state &= !(d[48] & 0x0f);
        let left = *state;
        write_member(out, g, &port_gid, left);
        if left == 0 {
            g.members.remove(&guid);
        }
        if g.members.is_empty() && !g.permanent {
            self.groups.remove(&mgid);
        }
        0
    }

    fn get_group(&self, req: &Request, out: &mut [u8]) -> u16 {
        let d = req.data();
        let found = if req.has(mc::MGID) {
            self.groups.get(&gid_at(d, 0))
        } else {
            let mlid = be16(d, 36);
            self.groups.values().find(|g| g.mlid == mlid)
        };
        match found {
            Some(g) => {
                write_member(out, g, &[0; 16], 0);
                0
            }
            None => status::NO_RECORDS,
        }
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

/// An MCMemberRecord of group `g` for the member `port_gid` in `join_state`.
fn write_member(out: &mut [u8], g: &Group, port_gid: &[u8; 16], join_state: u8) {
    out[..52].fill(0);
    out[0..16].copy_from_slice(&g.mgid);
    out[16..32].copy_from_slice(port_gid);
    out[32..36].copy_from_slice(&g.qkey.to_be_bytes());
    out[36..38].copy_from_slice(&g.mlid.to_be_bytes());
    out[38] = 2 << 6 | g.mtu;
    out[39] = g.tclass;
    out[40..42].copy_from_slice(&g.pkey.to_be_bytes());
    out[42] = 2 << 6 | g.rate;
    out[43] = 2 << 6 | LIFE_TIME;
    let sl_flow_hop = u32::from(g.sl) << 28 | g.flow_label << 8;
    out[44..48].copy_from_slice(&sl_flow_hop.to_be_bytes());
    // Scope: link-local (2), as IPoIB's groups are.
    out[48] = 2 << 4 | join_state;
}

/// A NodeRecord Get, by LID or by node GUID: the node's NodeInfo (one port, a channel
/// adapter) and a NodeDescription naming it.
fn node_record(req: &Request, ports: &dyn Ports, out: &mut [u8]) -> u16 {
    let d = req.data();
    let lid = if req.has(nr::LID) {
        be16(d, 0)
    } else if req.has(nr::NODE_GUID) {
        match ports.lid_of(be64(d, 4 + 12)) {
            Some(l) => l,
            None => return status::NO_RECORDS,
        }
    } else {
        // A Get names one record; all nodes is a GetTable.
        return status::INSUFFICIENT_COMPONENTS;
    };
    let Some(guid) = ports.guid_of(lid) else {
        return status::NO_RECORDS;
    };
    out[..108].fill(0);
    out[0..2].copy_from_slice(&lid.to_be_bytes());
    // NodeInfo (40 bytes at 4): versions, type CA (1), one port, the GUIDs, 64 P_Keys'
    // room, the device and vendor IDs of the ABI, port 1.
    let ni = &mut out[4..44];
    ni[0] = 1; // BaseVersion
    ni[1] = 1; // ClassVersion
    ni[2] = 1; // NodeType: channel adapter
    ni[3] = 1; // NumPorts
    ni[4..12].copy_from_slice(&guid.to_be_bytes()); // SystemImageGUID
    ni[12..20].copy_from_slice(&guid.to_be_bytes()); // NodeGUID
    ni[20..28].copy_from_slice(&guid.to_be_bytes()); // PortGUID
    ni[28..30].copy_from_slice(&1u16.to_be_bytes()); // PartitionCap
    ni[30..32].copy_from_slice(&(crate::abi::PCI_DEVICE_HCABENCH as u16).to_be_bytes());
    ni[32..36].copy_from_slice(&crate::abi::ABI_VERSION.to_be_bytes()); // Revision
    ni[36] = 1; // LocalPortNum
    let vendor = crate::abi::PCI_VENDOR_HCABENCH;
    ni[37..40].copy_from_slice(&vendor.to_be_bytes()[1..]);
    let desc = format!("hcabench HCA, LID {lid}");
    out[44..44 + desc.len()].copy_from_slice(desc.as_bytes());
    0
}

/// ClassPortInfo: the SA's versions and its answer time; no redirection, no traps.
fn class_port_info(out: &mut [u8]) {
    out[..72].fill(0);
    out[0] = 1; // BaseVersion
    out[1] = SA_CLASS_VERSION;
    // CapabilityMask: none of the optional SA features (IsSubnetOptionalRecordsSupported...).
    out[2..4].copy_from_slice(&0u16.to_be_bytes());
    // CapabilityMask2 (27 bits) | RespTimeValue (5 bits).
    out[4..8].copy_from_slice(&u32::from(LIFE_TIME).to_be_bytes());
}

/// A PathRecord Get: the path from the source (SGID, SLID, or the asker) to the destination
/// (DGID or DLID) on this one-switch subnet.
fn path_record(req: &Request, from: Lid, ports: &dyn Ports, out: &mut [u8]) -> u16 {
    let d = req.data();
    let dst = if req.has(pr::DGID) {
        match gid_guid(&gid_at(d, 8)).and_then(|g| ports.lid_of(g)) {
            Some(l) => l,
            None => return status::NO_RECORDS,
        }
    } else if req.has(pr::DLID) {
        be16(d, 40)
    } else {
        return status::INSUFFICIENT_COMPONENTS;
    };
    let src = if req.has(pr::SGID) {
        match gid_guid(&gid_at(d, 24)).and_then(|g| ports.lid_of(g)) {
            Some(l) => l,
            None => return status::NO_RECORDS,
        }
    } else if req.has(pr::SLID) {
        be16(d, 42)
    } else {
        from
    };
    let (Some(dguid), Some(sguid)) = (ports.guid_of(dst), ports.guid_of(src)) else {
        return status::NO_RECORDS;
    };
    if req.has(pr::PKEY) && be16(d, 50) & 0x7fff != DEFAULT_PKEY & 0x7fff {
        return status::NO_RECORDS;
    }
    let pick = |sel_bit: u64, val_bit: u64, byte: u8, have: u8| {
        if req.has(sel_bit | val_bit) {
            select(byte >> 6, byte & 0x3f, have)
        } else {
            Some(have)
        }
    };
    let (Some(mtu), Some(rate), Some(life)) = (
        pick(pr::MTU_SELECTOR, pr::MTU, d[54], MTU_4096),
        pick(pr::RATE_SELECTOR, pr::RATE, d[55], RATE_40G),
        pick(pr::LIFE_SELECTOR, pr::LIFE, d[56], LIFE_TIME),
    ) else {
        return status::NO_RECORDS;
    };
    out[..64].fill(0);
    out[0..8].copy_from_slice(&d[0..8]); // ServiceID, as asked
    out[8..24].copy_from_slice(&port_gid(dguid));
    out[24..40].copy_from_slice(&port_gid(sguid));
    out[40..42].copy_from_slice(&dst.to_be_bytes());
    out[42..44].copy_from_slice(&src.to_be_bytes());
    // RawTraffic 0, FlowLabel 0, HopLimit 0: one subnet, no GRH needed.
    out[49] = 0x80 | 1; // reversible, one path
    out[50..52].copy_from_slice(&DEFAULT_PKEY.to_be_bytes());
    out[54] = 2 << 6 | mtu;
    out[55] = 2 << 6 | rate;
    out[56] = 2 << 6 | life;
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes 1..=n with the GUIDs hca_model::abi gives them.
    struct Nodes(Lid);

    impl Ports for Nodes {
        fn lid_of(&self, guid: u64) -> Option<Lid> {
            (1..=self.0).find(|&l| crate::abi::node_guid(l) == guid)
        }
        fn guid_of(&self, lid: Lid) -> Option<u64> {
            (1..=self.0)
                .contains(&lid)
                .then(|| crate::abi::node_guid(lid))
        }
    }

    const THREE_NODES: Nodes = Nodes(3);

    fn mad(method: u8, attr: u16, comp_mask: u64, data: &[u8]) -> Packet {
        let mut m = vec![0u8; MAD_SIZE];
        m[0] = 1;
        m[1] = CLASS_SUBN_ADM;
        m[2] = SA_CLASS_VERSION;
        m[3] = method;
        m[8..16].copy_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        m[COMP_MASK_OFFSET..DATA_OFFSET].copy_from_slice(&comp_mask.to_be_bytes());
        m[DATA_OFFSET..DATA_OFFSET + data.len()].copy_from_slice(data);
        Packet {
            slid: 2,
            dlid: SM_LID,
            opcode: UD_SEND_ONLY,
            dest_qpn: 1,
            src_qpn: 1,
            qkey: GSI_QKEY,
            payload: Payload::Bytes(m),
            ..Default::default()
        }
    }

    /// (method, status, data) of the answer.
    fn ask(sa: &mut SubnetAdmin, p: &Packet) -> (u8, u16, Vec<u8>) {
        let r = sa.answer(p, &THREE_NODES).expect("an answer");
        assert_eq!(
            (r.dlid, r.slid, r.dest_qpn, r.qkey),
            (2, SM_LID, 1, GSI_QKEY)
        );
        let Payload::Bytes(b) = r.payload else {
            panic!("bytes")
        };
        assert_eq!(b.len(), MAD_SIZE);
        assert_eq!(be64(&b, 8), 0x1234_5678_9abc_def0, "the TID comes back");
        (b[3], be16(&b, 4), b[DATA_OFFSET..].to_vec())
    }

    fn gid(lid: Lid) -> [u8; 16] {
        port_gid(crate::abi::node_guid(lid))
    }

    #[test]
    fn test_a_path_record_by_dgid_names_both_ends_and_honours_selectors() {
        let mut sa = SubnetAdmin::new();
        let mut d = [0u8; 64];
        d[8..24].copy_from_slice(&gid(3));
        let (m, st, r) = ask(&mut sa, &mad(METHOD_GET, ATTR_PATH_RECORD, pr::DGID, &d));
        assert_eq!((m, st), (METHOD_GET_RESP, 0));
        assert_eq!(r[8..24], gid(3));
        assert_eq!(r[24..40], gid(2), "from the asker");
        assert_eq!((be16(&r, 40), be16(&r, 42)), (3, 2));
        assert_eq!((be16(&r, 50), r[54] & 0x3f), (0xffff, MTU_4096));
        // MTU exactly 2048: a 4096 path carries that too.
        d[54] = 2 << 6 | MTU_2048;
        let exact = pr::DGID | pr::MTU_SELECTOR | pr::MTU;
        let (_, st, r) = ask(&mut sa, &mad(METHOD_GET, ATTR_PATH_RECORD, exact, &d));
        assert_eq!((st, r[54] & 0x3f), (0, MTU_2048));
        // Greater than 2048: 4096 will do; greater than 4096 nothing does.
        d[54] = MTU_2048;
        let (_, st, r) = ask(&mut sa, &mad(METHOD_GET, ATTR_PATH_RECORD, exact, &d));
        assert_eq!((st, r[54] & 0x3f), (0, MTU_4096));
        d[54] = MTU_4096;
        let (_, st, _) = ask(&mut sa, &mad(METHOD_GET, ATTR_PATH_RECORD, exact, &d));
        assert_eq!(st, status::NO_RECORDS);
        // An unknown GID has no path; a query naming no destination is incomplete.
        d[8..24].copy_from_slice(&gid(9));
        let (_, st, _) = ask(&mut sa, &mad(METHOD_GET, ATTR_PATH_RECORD, pr::DGID, &d));
        assert_eq!(st, status::NO_RECORDS);
        let (_, st, _) = ask(&mut sa, &mad(METHOD_GET, ATTR_PATH_RECORD, 0, &d));
        assert_eq!(st, status::INSUFFICIENT_COMPONENTS);
        // By DLID and SLID.
        let mut d = [0u8; 64];
        d[40..42].copy_from_slice(&1u16.to_be_bytes());
        d[42..44].copy_from_slice(&3u16.to_be_bytes());
        let (_, st, r) = ask(
            &mut sa,
            &mad(METHOD_GET, ATTR_PATH_RECORD, pr::DLID | pr::SLID, &d),
        );
        assert_eq!((st, r[24..40].to_vec()), (0, gid(3).to_vec()));
    }

    fn member(mgid: [u8; 16], lid: Lid, join: u8) -> [u8; 52] {
        let mut d = [0u8; 52];
        d[0..16].copy_from_slice(&mgid);
        d[16..32].copy_from_slice(&gid(lid));
        d[40..42].copy_from_slice(&0xffffu16.to_be_bytes());
        d[48] = join;
        d
    }

    #[test]
    fn test_ipoib_joins_the_broadcast_group_that_exists_from_the_start() {
        let mut sa = SubnetAdmin::new();
        let d = member(IPOIB_BROADCAST_MGID, 2, 1);
        let mask = mc::MGID | mc::PORT_GID | mc::PKEY | mc::JOIN_STATE;
        let (m, st, r) = ask(&mut sa, &mad(METHOD_SET, ATTR_MCMEMBER_RECORD, mask, &d));
        assert_eq!((m, st), (METHOD_GET_RESP, 0));
        assert_eq!(r[0..16], IPOIB_BROADCAST_MGID);
        assert_eq!(be32(&r, 32), IPOIB_QKEY);
        assert_eq!(be16(&r, 36), MLID_BASE);
        assert_eq!((r[38] & 0x3f, r[48] & 0xf), (MTU_2048, 1));
        // Leaving keeps the permanent group.
        let (m, st, _) = ask(&mut sa, &mad(METHOD_DELETE, ATTR_MCMEMBER_RECORD, mask, &d));
        assert_eq!((m, st), (METHOD_DELETE_RESP, 0));
        assert!(sa.group_by_mlid(MLID_BASE).unwrap().members.is_empty());
    }

    #[test]
    fn test_a_group_is_created_by_a_full_join_and_goes_with_its_last_member() {
        let mut sa = SubnetAdmin::new();
        let mgid = [
            0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        let partial = mc::MGID | mc::PORT_GID | mc::JOIN_STATE;
        let mut d = member(mgid, 2, 1);
        let (_, st, _) = ask(&mut sa, &mad(METHOD_SET, ATTR_MCMEMBER_RECORD, partial, &d));
        assert_eq!(
            st,
            status::REQ_INVALID,
            "no group, and not enough to create one"
        );
        d[32..36].copy_from_slice(&IPOIB_QKEY.to_be_bytes());
        let full = partial | mc::CREATE;
        let (_, st, r) = ask(&mut sa, &mad(METHOD_SET, ATTR_MCMEMBER_RECORD, full, &d));
        assert_eq!(st, 0);
        let mlid = be16(&r, 36);
        assert!(mlid > MLID_BASE, "a new MLID");
        let d3 = member(mgid, 3, 1);
        let (_, st, r) = ask(
            &mut sa,
            &mad(METHOD_SET, ATTR_MCMEMBER_RECORD, partial, &d3),
        );
        assert_eq!(
            (st, be16(&r, 36)),
            (0, mlid),
            "the second member joins the group"
        );
        assert_eq!(sa.group_by_mlid(mlid).unwrap().members.len(), 2);
        // Get by MGID.
        let (_, st, r) = ask(
            &mut sa,
            &mad(METHOD_GET, ATTR_MCMEMBER_RECORD, mc::MGID, &d),
        );
        assert_eq!((st, be16(&r, 36)), (0, mlid));
        for x in [&d, &d3] {
            let (_, st, _) = ask(
                &mut sa,
                &mad(METHOD_DELETE, ATTR_MCMEMBER_RECORD, partial, x),
            );
            assert_eq!(st, 0);
        }
        assert!(
            sa.group_by_mlid(mlid).is_none(),
            "the group went with its last member"
        );
        let (_, st, _) = ask(
            &mut sa,
            &mad(METHOD_DELETE, ATTR_MCMEMBER_RECORD, partial, &d),
        );
        assert_eq!(st, status::NO_RECORDS);
        // A stranger's GID cannot join.
        let stranger = member(IPOIB_BROADCAST_MGID, 9, 1);
        let (_, st, _) = ask(
            &mut sa,
            &mad(METHOD_SET, ATTR_MCMEMBER_RECORD, partial, &stranger),
        );
        assert_eq!(st, status::INVALID_GID);
    }

    #[test]
    fn test_a_node_record_by_lid_or_guid_describes_the_node() {
        let mut sa = SubnetAdmin::new();
        let mut d = [0u8; 108];
        d[0..2].copy_from_slice(&3u16.to_be_bytes());
        let (m, st, r) = ask(&mut sa, &mad(METHOD_GET, ATTR_NODE_RECORD, nr::LID, &d));
        assert_eq!((m, st), (METHOD_GET_RESP, 0));
        assert_eq!(be16(&r, 0), 3);
        assert_eq!(
            (r[4 + 2], r[4 + 3]),
            (1, 1),
            "a channel adapter with one port"
        );
        assert_eq!(be64(&r, 4 + 12), crate::abi::node_guid(3));
        assert!(r[44..108].starts_with(b"hcabench HCA, LID 3"));
        let mut d = [0u8; 108];
        d[16..24].copy_from_slice(&crate::abi::node_guid(2).to_be_bytes());
        let (_, st, r) = ask(
            &mut sa,
            &mad(METHOD_GET, ATTR_NODE_RECORD, nr::NODE_GUID, &d),
        );
        assert_eq!((st, be16(&r, 0)), (0, 2));
        d[0..2].copy_from_slice(&9u16.to_be_bytes());
        let (_, st, _) = ask(&mut sa, &mad(METHOD_GET, ATTR_NODE_RECORD, nr::LID, &d));
        assert_eq!(st, status::NO_RECORDS);
        let (_, st, _) = ask(&mut sa, &mad(METHOD_GET, ATTR_NODE_RECORD, 0, &d));
        assert_eq!(st, status::INSUFFICIENT_COMPONENTS);
    }

    /// Sixteen ports, joining and leaving eight groups in a seeded order: the SA's members
    /// are exactly the joins not yet left, and groups go with their last member.
    #[test]
    fn test_many_members_join_and_leave_many_groups() {
        let sixteen = Nodes(16);
        let mut sa = SubnetAdmin::new();
        let mgid = |g: u8| {
            [
                0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, g,
            ]
        };
        let mut want: std::collections::BTreeSet<(u8, Lid)> = Default::default();
        let mut x = 0x2545_f491_u32;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let (g, lid) = ((x % 8) as u8, (x >> 8) as u16 % 16 + 1);
            let mut d = member(mgid(g), 1, 1);
            d[16..32].copy_from_slice(&gid(lid));
            d[32..36].copy_from_slice(&IPOIB_QKEY.to_be_bytes());
            let joined = want.contains(&(g, lid));
            let (method, mask) = if joined {
                (METHOD_DELETE, mc::MGID | mc::PORT_GID | mc::JOIN_STATE)
            } else {
                (METHOD_SET, mc::MGID | mc::PORT_GID | mc::CREATE)
            };
            let p = Packet {
                slid: lid,
                ..mad(method, ATTR_MCMEMBER_RECORD, mask, &d)
            };
            let r = sa.answer(&p, &sixteen).unwrap();
            let Payload::Bytes(b) = r.payload else {
                panic!()
            };
            assert_eq!(be16(&b, 4), 0, "{method:#x} of node{lid} in group {g}");
            if joined {
                want.remove(&(g, lid));
            } else {
                want.insert((g, lid));
            }
        }
        let mut have: std::collections::BTreeSet<(u8, Lid)> = Default::default();
        for grp in sa.groups().filter(|grp| !grp.permanent) {
            assert!(!grp.members.is_empty(), "an empty group was kept");
            for guid in grp.members.keys() {
                have.insert((grp.mgid[15], sixteen.lid_of(*guid).unwrap()));
            }
        }
        assert_eq!(have, want);
        let mlids: std::collections::BTreeSet<Lid> = sa.groups().map(|g| g.mlid).collect();
        assert_eq!(mlids.len(), sa.groups().count(), "every group its own MLID");
    }

    #[test]
    fn test_bad_and_unsupported_queries_get_a_status_never_silence() {
        let mut sa = SubnetAdmin::new();
        let (_, st, r) = ask(&mut sa, &mad(METHOD_GET, ATTR_CLASS_PORT_INFO, 0, &[]));
        assert_eq!((st, r[1], be32(&r, 4) & 0x1f), (0, 2, u32::from(LIFE_TIME)));
        let (_, st, _) = ask(&mut sa, &mad(METHOD_GET, 0x0031, 0, &[]));
        assert_eq!(st, status::METHOD_ATTR_UNSUPPORTED, "ServiceRecord");
        let (_, st, _) = ask(&mut sa, &mad(0x07, ATTR_PATH_RECORD, 0, &[]));
        assert_eq!(st, status::METHOD_UNSUPPORTED);
        let mut p = mad(METHOD_GET, ATTR_CLASS_PORT_INFO, 0, &[]);
        if let Payload::Bytes(b) = &mut p.payload {
            b[2] = 9;
        }
        assert_eq!(ask(&mut sa, &p).1, status::BAD_VERSION);
        // Not for the SA: another class, a response, the wrong Q_Key, a short MAD.
        let mut other = mad(METHOD_GET, ATTR_CLASS_PORT_INFO, 0, &[]);
        if let Payload::Bytes(b) = &mut other.payload {
            b[1] = 0x07;
        }
        assert!(sa.answer(&other, &THREE_NODES).is_none());
        let mut resp = mad(METHOD_GET_RESP, ATTR_CLASS_PORT_INFO, 0, &[]);
        assert!(sa.answer(&resp, &THREE_NODES).is_none());
        resp = mad(METHOD_GET, ATTR_CLASS_PORT_INFO, 0, &[]);
        resp.qkey = 0;
        assert!(sa.answer(&resp, &THREE_NODES).is_none());
        resp.qkey = GSI_QKEY;
        resp.payload = Payload::Bytes(vec![1, 3, 2, 1]);
        assert!(sa.answer(&resp, &THREE_NODES).is_none());
    }
}
