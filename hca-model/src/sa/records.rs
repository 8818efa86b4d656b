//! The records the SA derives from the fabric itself, with nothing stored: ClassPortInfo,
//! PathRecord, NodeRecord and PortInfoRecord. The subnet is one switch: every port reaches
//! every other in one hop, at 4x QDR with a 4096-byte MTU. Node and port records list the
//! switch (at [`SM_LID`]) as well as the nodes, as its SMPs show it (`sm.rs`).

use super::{
    be16, be32, be64, gid_at, gid_guid, port_gid, select, status, Found, Ports, Request,
    DEFAULT_PKEY, MTU_4096, RATE_40G, RESP_TIME, SA_CLASS_VERSION, SM_LID, SUBNET_PREFIX,
};
use crate::abi::Lid;
use crate::partition::{pkeys_match, PKeyTable};

/// PathRecord component mask bits (IBA 15.2.5.16).
pub(super) mod pr {
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

/// NodeRecord component mask bits (IBA 15.2.5.2): the LID, NodeInfo's node and port GUIDs.
pub(super) mod nr {
    pub const LID: u64 = 1 << 0;
    pub const NODE_GUID: u64 = 1 << 7;
    pub const PORT_GUID: u64 = 1 << 8;
}

/// PortInfoRecord component mask bits (IBA 15.2.5.3): the port's LID and number, and
/// PortInfo's CapabilityMask (srp_daemon finds targets by IsDeviceManagementSupported).
pub(super) mod pir {
    pub const LID: u64 = 1 << 0;
    pub const PORT_NUM: u64 = 1 << 1;
    pub const CAPABILITY_MASK: u64 = 1 << 7;
}

const PATH_SIZE: usize = 64;
/// A NodeRecord is 108 bytes, carried in 112; a PortInfoRecord 68, in 72.
const NODE_SIZE: usize = 112;
const PORT_INFO_SIZE: usize = 72;

/// ClassPortInfo: the SA's versions and its answer time; no redirection.
pub(super) fn class_port_info() -> Vec<u8> {
    let mut out = [0u8; 72];
    out[0] = 1; // BaseVersion
    out[1] = SA_CLASS_VERSION;
    // CapabilityMask: IsTrapSupported (bit 0; InformInfo subscriptions are served) and
    // IsMultiPathSupported (bit 10: MultiPathRecord GetMulti; TraceRecord, which the bit
    // names too, is not served, as OpenSM serves none and sets it).
    out[2..4].copy_from_slice(&(1u16 | 1 << 10).to_be_bytes());
    // CapabilityMask2 (27 bits) | RespTimeValue (5 bits).
    out[4..8].copy_from_slice(&u32::from(RESP_TIME).to_be_bytes());
    out.to_vec()
}

/// The LIDs a record names: one, none (an unknown GID) or, unnamed, `all`.
fn named_lid(
    req: &Request,
    gid_bit: u64,
    gid_at_: usize,
    lid_bit: u64,
    lid_at: usize,
    ports: &dyn Ports,
) -> Option<Option<Lid>> {
    let d = req.data();
    if req.has(gid_bit) {
        Some(gid_guid(&gid_at(d, gid_at_)).and_then(|g| ports.lid_of(g)))
    } else if req.has(lid_bit) {
        Some(Some(be16(d, lid_at)))
    } else {
        None
    }
}

/// The entry of `table` in the partition of P_Key `pkey` (either membership), if any.
pub(super) fn member_entry(table: &PKeyTable, pkey: u16) -> Option<u16> {
    let id = pkey & 0x7fff;
    table.iter().copied().find(|&k| k != 0 && k & 0x7fff == id)
}

/// PathRecord Get/GetTable: paths from the sources (SGID, SLID; unnamed, the asker for a
/// Get and every port for a GetTable) to the destinations (DGID, DLID; unnamed, every port
/// for a GetTable; a Get must name one). Every path has PacketLifeTime `packet_life` (a
/// query's lifetime selector may ask for less, as for the MTU and rate).
pub(super) fn paths(req: &Request, ports: &dyn Ports, packet_life: u8) -> Result<Found, u16> {
    let d = req.data();
    // (Every port is listed only for a table that names no end: a query for one path
    // costs the same on a subnet of thousands of ports as on one of two.)
    let dsts = match named_lid(req, pr::DGID, 8, pr::DLID, 40, ports) {
        Some(one) => one.into_iter().collect(),
        None if req.is_table() => ports.lids(),
        None => return Err(status::INSUFFICIENT_COMPONENTS),
    };
    let srcs: Vec<Lid> = match named_lid(req, pr::SGID, 24, pr::SLID, 42, ports) {
        Some(one) => one.into_iter().collect(),
        None if req.is_table() => ports.lids(),
        None => vec![req.from.lid],
    };
    let q = PathQuery {
        subnet: ports.subnet(),
        service_id: d
            .get(0..8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or_default(),
        pkey: req.has(pr::PKEY).then(|| be16(d, 50)),
        mtu: req.has(pr::MTU_SELECTOR | pr::MTU).then_some(d[54]),
        rate: req.has(pr::RATE_SELECTOR | pr::RATE).then_some(d[55]),
        life: req.has(pr::LIFE_SELECTOR | pr::LIFE).then_some(d[56]),
    };
    let mut rows = Vec::new();
    'all: for &src in &srcs {
        for &dst in &dsts {
            rows.extend(q.path(src, dst, ports, packet_life));
            if rows.len() > super::MAX_TABLE_RECORDS {
                // Enough to refuse; the SA answers "no resources".
                break 'all;
            }
        }
    }
    Ok(Found::Records {
        size: PATH_SIZE,
        rows,
    })
}

/// What a PathRecord or MultiPathRecord query asks of its paths: a partition (the
/// default's if None) and selector bytes (selector in the top two bits) for the MTU, rate
/// and PacketLifeTime.
struct PathQuery {
    /// The switches and routes, as the SM's last sweep left them.
    subnet: std::sync::Arc<crate::subnet::Subnet>,
    service_id: [u8; 8],
    pkey: Option<u16>,
    mtu: Option<u8>,
    rate: Option<u8>,
    life: Option<u8>,
}

impl PathQuery {
    /// The PathRecord from the port at `src` to the one at `dst`, if there is a path that
    /// meets the query: both ends on the fabric, the switches' tables leading there and
    /// back from ports the SM reaches, both in the partition (one a full member), and
    /// what the selectors ask available. Every path has PacketLifeTime `packet_life` (its
    /// selector may ask for less).
    fn path(&self, src: Lid, dst: Lid, ports: &dyn Ports, packet_life: u8) -> Option<Vec<u8>> {
        let pick = |sel: Option<u8>, have: u8| match sel {
            Some(byte) => select(byte >> 6, byte & 0x3f, have),
            None => Some(have),
        };
        let mtu = pick(self.mtu, MTU_4096)?;
        let rate = pick(self.rate, RATE_40G)?;
        let life = pick(self.life, packet_life)?;
        let sguid = ports.guid_of(src)?;
        let dguid = ports.guid_of(dst)?;
        // A path lies in one partition: the P_Key asked for (the default's when none is),
        // of which both ends must be members, one of them full (see `crate::partition`).
        let want = self.pkey.unwrap_or(DEFAULT_PKEY);
        let pkey = member_entry(&ports.pkeys(src), want)?;
        let theirs = member_entry(&ports.pkeys(dst), want)?;
        if !pkeys_match(pkey, theirs) {
            return None;
        }
        let subnet = &self.subnet;
        let hops = subnet.hops(src, dst)?;
        if !(subnet.reaches(dst, src) && sm_reaches(subnet, src) && sm_reaches(subnet, dst)) {
            return None;
        }
        let mut out = [0u8; PATH_SIZE];
        out[0..8].copy_from_slice(&self.service_id); // ServiceID, as asked
        out[8..24].copy_from_slice(&port_gid(dguid));
        out[24..40].copy_from_slice(&port_gid(sguid));
        out[40..42].copy_from_slice(&dst.to_be_bytes());
        out[42..44].copy_from_slice(&src.to_be_bytes());
        // RawTraffic 0, FlowLabel 0, HopLimit 0: one subnet, no GRH needed.
        out[49] = 0x80 | 1; // reversible, one path
        out[50..52].copy_from_slice(&pkey.to_be_bytes());
        out[54] = 2 << 6 | mtu;
        out[55] = 2 << 6 | rate;
        let life = if self.life.is_some() {
            life
        } else {
            path_life(life, hops)
        };
        out[56] = 2 << 6 | life;
        Some(out.to_vec())
    }
}

/// MultiPathRecord component mask bits (IBA 15.2.5.20).
mod mpr {
    pub const PKEY: u64 = 1 << 7;
    pub const MTU_SELECTOR: u64 = 1 << 10;
    pub const MTU: u64 = 1 << 11;
    pub const RATE_SELECTOR: u64 = 1 << 12;
    pub const RATE: u64 = 1 << 13;
    pub const LIFE_SELECTOR: u64 = 1 << 14;
    pub const LIFE: u64 = 1 << 15;
    pub const SGID_COUNT: u64 = 1 << 19;
    pub const DGID_COUNT: u64 = 1 << 20;
}

/// The most GIDs a MultiPathRecord carries in one MAD (after its 24-byte head).
pub(super) const MULTIPATH_MAX_GIDS: usize = 11;

/// MultiPathRecord GetMulti: the paths from each of its SGIDs to each of its DGIDs (one a
/// pair: every port has one LID), as PathRecords, with the partition and the MTU, rate and
/// lifetime selectors of a PathRecord query. It must count both kinds of GID (at most
/// [`MULTIPATH_MAX_GIDS`] in all); a GID of no port on the subnet is "invalid GID".
pub(super) fn multipaths(req: &Request, ports: &dyn Ports, packet_life: u8) -> Result<Found, u16> {
    let d = req.data();
    if !req.has(mpr::SGID_COUNT | mpr::DGID_COUNT) {
        return Err(status::INSUFFICIENT_COMPONENTS);
    }
    let (ns, nd) = (usize::from(d[15]), usize::from(d[16]));
    if ns == 0 || nd == 0 || ns + nd > MULTIPATH_MAX_GIDS {
        return Err(status::REQ_INVALID);
    }
    let lids = (0..ns + nd)
        .map(|i| {
            let gid = gid_at(d, 24 + 16 * i);
            gid_guid(&gid)
                .and_then(|g| ports.lid_of(g))
                .ok_or(status::INVALID_GID)
        })
        .collect::<Result<Vec<Lid>, u16>>()?;
    let (srcs, dsts) = lids.split_at(ns);
    let q = PathQuery {
        subnet: ports.subnet(),
        service_id: [0; 8],
        pkey: req.has(mpr::PKEY).then(|| be16(d, 6)),
        mtu: req.has(mpr::MTU_SELECTOR | mpr::MTU).then_some(d[10]),
        rate: req.has(mpr::RATE_SELECTOR | mpr::RATE).then_some(d[11]),
        life: req.has(mpr::LIFE_SELECTOR | mpr::LIFE).then_some(d[12]),
    };
    let rows = (srcs.iter())
        .flat_map(|&s| dsts.iter().map(move |&t| (s, t)))
        .filter_map(|(s, t)| q.path(s, t, ports, packet_life))
        .collect();
    Ok(Found::Records {
        size: PATH_SIZE,
        rows,
    })
}

/// A path's PacketLifeTime across `hops` switches: the subnet's (one switch's) doubled for
/// each doubling of the switches a packet waits in, so that an ACK timeout derived from it
/// (ib_cm's) covers the longer path; never past [`super::MAX_PACKET_LIFE`]. (A query
/// that selects a lifetime gets what it selected.)
fn path_life(life: u8, hops: usize) -> u8 {
    let extra = usize::BITS - hops.saturating_sub(1).leading_zeros();
    life.saturating_add(extra as u8)
        .min(super::MAX_PACKET_LIFE)
        .max(life)
}

/// Whether the SM reaches the port at `lid` and hears back from it (on a subnet of several
/// switches a cut may part some from it).
fn sm_reaches(subnet: &crate::subnet::Subnet, lid: Lid) -> bool {
    subnet.reaches(SM_LID, lid) && subnet.reaches(lid, SM_LID)
}

/// The nodes a NodeRecord or PortInfoRecord query names by LID, or all of them (the
/// switches last, the SM's first), with their GUIDs.
fn ports_named(req: &Request, lid_bit: u64, ports: &dyn Ports) -> Vec<(Lid, u64)> {
    let subnet = ports.subnet();
    let mut all: Vec<(Lid, u64)> = (ports.lids().into_iter())
        .filter_map(|l| Some((l, ports.guid_of(l)?)))
        .collect();
    all.extend(subnet.switches().iter().map(|s| (s.lid, s.guid)));
    // What the SM's last sweep could not reach is not in its tables.
    all.retain(|&(l, _)| sm_reaches(&subnet, l));
    if req.has(lid_bit) {
        let want = be16(req.data(), 0);
        all.retain(|&(l, _)| l == want);
    }
    all
}

/// NodeRecord Get/GetTable, by LID, node GUID or port GUID: the node's NodeInfo (one port,
/// a channel adapter) and a NodeDescription naming it.
pub(super) fn nodes(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let d = req.data();
    let rows = ports_named(req, nr::LID, ports)
        .into_iter()
        .filter(|&(_, guid)| {
            (!req.has(nr::NODE_GUID) || be64(d, 4 + 12) == guid)
                && (!req.has(nr::PORT_GUID) || be64(d, 4 + 20) == guid)
        })
        .map(|(lid, guid)| node_record(lid, guid, ports))
        .collect();
    Ok(Found::Records {
        size: NODE_SIZE,
        rows,
    })
}

fn node_record(lid: Lid, guid: u64, ports: &dyn Ports) -> Vec<u8> {
    let mut out = [0u8; 108];
    out[0..2].copy_from_slice(&lid.to_be_bytes());
    // NodeInfo at 4: a channel adapter of one port, seen from that port; the switch, as
    // its management port sees it.
    let subnet = ports.subnet();
    let (info, desc) = if let Some(sw) = subnet.switch_at(lid).and_then(|i| subnet.switch(i)) {
        let info = node_info(NODE_SWITCH, sw.num_ports, guid, 16, 0);
        (info, super::sm::node_desc(sw))
    } else {
        (
            node_info(NODE_CA, 1, guid, 1, 1),
            format!("hcabench HCA, LID {lid}"),
        )
    };
    out[4..44].copy_from_slice(&info);
    for (o, b) in out[44..].iter_mut().zip(desc.as_bytes()) {
        *o = *b;
    }
    out.to_vec()
}

/// PortInfoRecord Get/GetTable, by LID and port number (a CA's only port is 1, which 0
/// names too; the switch's are 0 to n) and by capability bits (a port matches when it has
/// every bit asked for).
pub(super) fn port_infos(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let d = req.data();
    // CapabilityMask sits at PortInfo offset 20, after the record's 4-byte key.
    let want_caps = if req.has(pir::CAPABILITY_MASK) {
        be32(d, 4 + 20)
    } else {
        0
    };
    let mut rows = Vec::new();
    let subnet = ports.subnet();
    for (lid, _) in ports_named(req, pir::LID, ports) {
        if let Some(sw) = subnet.switch_at(lid) {
            let n = subnet.switch(sw).map_or(0, |s| s.num_ports);
            for port in 0..=n {
                if req.has(pir::PORT_NUM) && d[2] != port {
                    continue;
                }
                let info = super::sm::switch_port_info(&subnet, ports, sw, port, port);
                if be32(&info, 20) & want_caps == want_caps {
                    let mut r = [0u8; 68];
                    r[0..2].copy_from_slice(&lid.to_be_bytes());
                    r[2] = port;
                    r[4..68].copy_from_slice(&info);
                    rows.push(r.to_vec());
                }
            }
            continue;
        }
        let caps = ports.capability_mask(lid);
        if (!req.has(pir::PORT_NUM) || d[2] <= 1) && caps & want_caps == want_caps {
            rows.push(port_info_record(lid, caps, ports.link_up(lid)));
        }
    }
    Ok(Found::Records {
        size: PORT_INFO_SIZE,
        rows,
    })
}

/// A PortInfoRecord: EndPortLID, PortNum, then PortInfo as the CA port at `lid` reports
/// it (a link down: Disabled).
fn port_info_record(lid: Lid, caps: u32, up: bool) -> Vec<u8> {
    let mut out = [0u8; 68];
    out[0..2].copy_from_slice(&lid.to_be_bytes());
    out[2] = 1;
    let link = if up {
        LINK_UP
    } else {
        (PORT_DOWN, PHYS_DISABLED)
    };
    out[4..68].copy_from_slice(&port_info(lid, SM_LID, caps, 1, link));
    out.to_vec()
}

/// NodeType of a channel adapter and of a switch.
pub(super) const NODE_CA: u8 = 1;
pub(super) const NODE_SWITCH: u8 = 2;

/// NodeInfo (IBA 14.2.5.3) of a node of this fabric: one GUID for its system, node and
/// port (0), the device and vendor IDs of the ABI, asked from its port `local_port`.
pub(super) fn node_info(
    node_type: u8,
    num_ports: u8,
    guid: u64,
    partition_cap: u16,
    local_port: u8,
) -> [u8; 40] {
    let mut ni = [0u8; 40];
    ni[..4].copy_from_slice(&[1, 1, node_type, num_ports]); // versions, type, ports
    ni[4..12].copy_from_slice(&guid.to_be_bytes()); // SystemImageGUID
    ni[12..20].copy_from_slice(&guid.to_be_bytes()); // NodeGUID
    ni[20..28].copy_from_slice(&guid.to_be_bytes()); // PortGUID
    ni[28..30].copy_from_slice(&partition_cap.to_be_bytes());
    ni[30..32].copy_from_slice(&(crate::abi::PCI_DEVICE_HCABENCH as u16).to_be_bytes());
    ni[32..36].copy_from_slice(&crate::abi::ABI_VERSION.to_be_bytes()); // Revision
    ni[36] = local_port;
    let vendor = crate::abi::PCI_VENDOR_HCABENCH;
    ni[37..40].copy_from_slice(&vendor.to_be_bytes()[1..]);
    ni
}

/// PortState and PortPhysicalState: Active and LinkUp; Down, Polling (no link partner) or
/// Disabled (its link taken down).
pub(super) const LINK_UP: (u8, u8) = (4, 5);
pub(super) const PORT_DOWN: u8 = 1;
pub(super) const PHYS_POLLING: u8 = 2;
pub(super) const PHYS_DISABLED: u8 = 3;

/// PortInfo (IBA 14.2.5.6) of a 4x QDR port of this fabric: its LID (0 for a switch's
/// external port), its SM's LID, capability bits and number, and `(PortState,
/// PortPhysicalState)`.
pub(super) fn port_info(
    lid: Lid,
    sm_lid: Lid,
    caps: u32,
    local_port: u8,
    (state, phys): (u8, u8),
) -> [u8; 64] {
    let mut pi = [0u8; 64];
    pi[8..16].copy_from_slice(&SUBNET_PREFIX.to_be_bytes()); // GidPrefix
    pi[16..18].copy_from_slice(&lid.to_be_bytes()); // LID
    pi[18..20].copy_from_slice(&sm_lid.to_be_bytes()); // MasterSMLID
    pi[20..24].copy_from_slice(&caps.to_be_bytes()); // CapabilityMask
    pi[28] = local_port;
    pi[29] = 2; // LinkWidthEnabled: 4x
    pi[30] = 3; // LinkWidthSupported: 1x, 4x
    pi[31] = 2; // LinkWidthActive
    pi[32] = 0x7 << 4 | state; // LinkSpeedSupported (SDR..QDR) | PortState
    pi[33] = phys << 4 | PHYS_POLLING; // PortPhysicalState | LinkDownDefaultState
    pi[35] = 0x4 << 4 | 0x7; // LinkSpeedActive QDR | LinkSpeedEnabled
    pi[36] = 5 << 4; // NeighborMTU 4096 | MasterSMSL 0
    pi[37] = 1 << 4; // VLCap: VL0
    pi[41] = 5; // InitTypeReply 0 | MTUCap 4096
    pi[43] = 1 << 4; // OperationalVLs: VL0
    pi[51] = RESP_TIME; // SubnetTimeOut
    pi[52] = RESP_TIME; // RespTimeValue
    pi
}
