//! The SA's records of the subnet's structure (IBA 15.2.5), derived from the fabric as its
//! switch's and ports' SMPs show it (`sm.rs`), so that `saquery` and the SMPs agree:
//! SMInfoRecord, SwitchInfoRecord, LinkRecord, LinearForwardingTableRecord,
//! MulticastForwardingTableRecord, GUIDInfoRecord, P_KeyTableRecord, SL2VLTableRecord and
//! VLArbitrationTableRecord. (InformInfoRecord is `inform.rs`'s.)
//!
//! The subnet: its switches as the SM's last sweep left them (`crate::subnet`; by default
//! one at [`SM_LID`] whose port n links the port at LID n); each switch's management port
//! 0 has its LID, the first's the SM. Every
//! port has one data VL (VLCap VL0), so every SL maps to VL0 and no port has VL arbitration
//! tables (PortInfo's VLArbitrationHighCap and LowCap are 0): a VLArbitrationTableRecord
//! query finds none, as OpenSM's finds none on such ports.

use super::groups::{Group, MLID_COUNT};
use super::sm::SM_GUID;
use super::{be16, be64, status, Found, Ports, Request, MLID_BASE, SM_LID};
use crate::abi::Lid;
use crate::subnet::Peer;

/// Component mask bits of the records below (IBA 15.2.5; infiniband-diags' names).
pub(super) mod cm {
    pub const LID: u64 = 1 << 0;
    /// LinkRecord.
    pub const FROM_LID: u64 = 1 << 0;
    pub const FROM_PORT: u64 = 1 << 1;
    pub const TO_PORT: u64 = 1 << 2;
    pub const TO_LID: u64 = 1 << 3;
    /// LinearForwardingTableRecord, GUIDInfoRecord: the block.
    pub const BLOCK_1: u64 = 1 << 1;
    /// MulticastForwardingTableRecord.
    pub const MFT_POSITION: u64 = 1 << 1;
    pub const MFT_BLOCK: u64 = 1 << 3;
    /// P_KeyTableRecord.
    pub const PKEY_BLOCK: u64 = 1 << 1;
    pub const PKEY_PORT: u64 = 1 << 2;
    /// SL2VLTableRecord.
    pub const IN_PORT: u64 = 1 << 1;
    pub const OUT_PORT: u64 = 1 << 2;
    /// SMInfoRecord.
    pub const SM_GUID: u64 = 1 << 2;
    /// VLArbitrationTableRecord.
    pub const VLARB_BLOCK: u64 = 1 << 2;
}

const LINK_SIZE: usize = 8;
const SM_INFO_SIZE: usize = 32;
const SWITCH_INFO_SIZE: usize = 24;
/// LFT, MFT, GUIDInfo, P_KeyTable records: an 8-byte key and 64 bytes of table.
const BLOCK_RECORD_SIZE: usize = 72;
const SL2VL_SIZE: usize = 16;
const VLARB_SIZE: usize = 72;

/// SMInfo's SMState for the master SM (priority 0).
pub(super) const SM_STATE_MASTER: u8 = 3;
/// LIDs per LinearForwardingTable block, MLIDs per MulticastForwardingTable block, ports
/// per MulticastForwardingTable position.
const LFT_BLOCK: u32 = 64;
const MFT_BLOCK: u16 = 32;
const MFT_PORTS: u8 = 16;

/// What a query's record names: `want(bit, value)` holds when the query does not name the
/// field or names this value.
struct Template<'a>(&'a Request<'a>);

impl Template<'_> {
    fn u8_at(&self, bit: u64, at: usize, have: u8) -> bool {
        !self.0.has(bit) || self.0.data().get(at) == Some(&have)
    }
    fn u16_at(&self, bit: u64, at: usize, have: u16) -> bool {
        !self.0.has(bit) || be16(self.0.data(), at) == have
    }
}

fn records(size: usize, rows: Vec<Vec<u8>>) -> Result<Found, u16> {
    Ok(Found::Records { size, rows })
}

/// Writes `bytes` at `at` in `buf` (what does not fit is left out).
fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    for (d, b) in buf.iter_mut().skip(at).zip(bytes) {
        *d = *b;
    }
}

/// SMInfo (IBA 14.2.5.13) of the fabric's SM: its GUID, no SM_Key, ActCount `activity`,
/// priority 0, master.
pub(super) fn sm_info(activity: u32) -> [u8; 21] {
    let mut s = [0u8; 21];
    s[0..8].copy_from_slice(&SM_GUID.to_be_bytes());
    s[16..20].copy_from_slice(&activity.to_be_bytes());
    s[20] = SM_STATE_MASTER;
    s
}

/// SwitchInfo (IBA 14.2.5.4) of the fabric's switch: a linear table for every unicast LID,
/// the highest in use its own; every multicast LID; no random table, no partition
/// enforcement.
pub(super) fn switch_info() -> [u8; 20] {
    let mut s = [0u8; 20];
    s[0..2].copy_from_slice(&0xc000u16.to_be_bytes()); // LinearFDBCap
    s[4..6].copy_from_slice(&MLID_COUNT.to_be_bytes()); // MulticastFDBCap
    s[6..8].copy_from_slice(&SM_LID.to_be_bytes()); // LinearFDBTop
    s
}

/// SMInfoRecord: the one SM, at the switch's LID.
pub(super) fn sm_infos(req: &Request, activity: u32) -> Result<Found, u16> {
    let t = Template(req);
    let mut rows = Vec::new();
    if t.u16_at(cm::LID, 0, SM_LID) && (!req.has(cm::SM_GUID) || be64(req.data(), 4) == SM_GUID) {
        let mut r = [0u8; SM_INFO_SIZE];
        r[0..2].copy_from_slice(&SM_LID.to_be_bytes());
        r[4..25].copy_from_slice(&sm_info(activity));
        rows.push(r.to_vec());
    }
    records(SM_INFO_SIZE, rows)
}

/// SwitchInfoRecord: every switch.
pub(super) fn switch_infos(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let rows = (ports.subnet().switches().iter())
        .filter(|sw| t.u16_at(cm::LID, 0, sw.lid))
        .map(|sw| {
            let mut r = [0u8; SWITCH_INFO_SIZE];
            r[0..2].copy_from_slice(&sw.lid.to_be_bytes());
            r[4..24].copy_from_slice(&switch_info());
            r.to_vec()
        })
        .collect();
    records(SWITCH_INFO_SIZE, rows)
}

/// Every link whose state is up, from each end: (from LID, from port, to port, to LID),
/// a switch's ports by their switch's LID and an HCA's port 1 by its own.
fn linked(ports: &dyn Ports) -> Vec<(Lid, u8, u8, Lid)> {
    let subnet = ports.subnet();
    let mut out = Vec::new();
    for (i, sw) in subnet.switches().iter().enumerate() {
        for p in 1..=sw.num_ports {
            if !super::sm::port_up(&subnet, ports, i, p) {
                continue;
            }
            match sw.peer(p) {
                Peer::Hca(lid) => {
                    out.push((lid, 1, p, sw.lid));
                    out.push((sw.lid, p, 1, lid));
                }
                Peer::Switch {
                    sw: other, port, ..
                } => {
                    if let Some(o) = subnet.switch(other) {
                        out.push((sw.lid, p, port, o.lid));
                    }
                }
                Peer::None => {}
            }
        }
    }
    out
}

/// LinkRecord: each link whose state is up, from each end.
pub(super) fn links(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let mut rows = Vec::new();
    for (from, from_port, to_port, to) in linked(ports) {
        let wanted = t.u16_at(cm::FROM_LID, 0, from)
            && t.u8_at(cm::FROM_PORT, 2, from_port)
            && t.u8_at(cm::TO_PORT, 3, to_port)
            && t.u16_at(cm::TO_LID, 4, to);
        if wanted {
            let mut r = [0u8; LINK_SIZE];
            r[0..2].copy_from_slice(&from.to_be_bytes());
            r[2] = from_port;
            r[3] = to_port;
            r[4..6].copy_from_slice(&to.to_be_bytes());
            rows.push(r.to_vec());
        }
    }
    records(LINK_SIZE, rows)
}

/// LinearForwardingTableRecord: each switch's table, a block of 64 LIDs each, up to its
/// top (the SM's switch's LID).
pub(super) fn lfts(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let subnet = ports.subnet();
    let mut rows = Vec::new();
    for (i, sw) in subnet.switches().iter().enumerate() {
        if !t.u16_at(cm::LID, 0, sw.lid) {
            continue;
        }
        let blocks: Vec<u32> = if req.has(cm::BLOCK_1) {
            vec![u32::from(be16(req.data(), 2))]
        } else {
            (0..=u32::from(SM_LID) / LFT_BLOCK).collect()
        };
        for block in blocks {
            let Some(table) = subnet.lft_block(i, block) else {
                continue;
            };
            let mut r = [0u8; BLOCK_RECORD_SIZE];
            r[0..2].copy_from_slice(&sw.lid.to_be_bytes());
            r[2..4].copy_from_slice(&(block as u16).to_be_bytes());
            r[8..72].copy_from_slice(&table);
            rows.push(r.to_vec());
            // Past the most a table carries the SA refuses it: no need to make the rest
            // (256 switches' tables are 196,000 blocks).
            if rows.len() > super::MAX_TABLE_RECORDS {
                return records(BLOCK_RECORD_SIZE, rows);
            }
        }
    }
    records(BLOCK_RECORD_SIZE, rows)
}

/// The LIDs of group `g`'s members that receive its packets (full and non-members; a
/// send-only member only sends).
fn receivers(g: &Group, ports: &dyn Ports) -> Vec<Lid> {
    (g.members.iter())
        .filter(|(_, &join)| join & 0x3 != 0)
        .filter_map(|(&guid, _)| ports.lid_of(guid))
        .collect()
}

/// MulticastForwardingTableRecord: each switch's table for the blocks of 32 MLIDs that
/// hold a group, each position (16 ports) of it: the ports toward the group's members
/// that receive.
pub(super) fn mfts<'a>(
    req: &Request,
    groups: impl Iterator<Item = &'a Group>,
    ports: &dyn Ports,
) -> Result<Found, u16> {
    let t = Template(req);
    let subnet = ports.subnet();
    let d = req.data();
    let (want_block, want_pos) = (be16(d, 2) & 0x1ff, (be16(d, 2) >> 12) as u8);
    let groups: Vec<(&Group, Vec<Lid>)> = groups.map(|g| (g, receivers(g, ports))).collect();
    let mut blocks: Vec<u16> = groups
        .iter()
        .map(|(g, _)| (g.mlid - MLID_BASE) / MFT_BLOCK)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    let mut rows = Vec::new();
    for (i, sw) in subnet.switches().iter().enumerate() {
        if !t.u16_at(cm::LID, 0, sw.lid) {
            continue;
        }
        let masks: Vec<(u16, Vec<u8>)> = (groups.iter())
            .map(|(g, lids)| (g.mlid - MLID_BASE, subnet.mft_ports(i, lids)))
            .collect();
        for &block in &blocks {
            if req.has(cm::MFT_BLOCK) && block != want_block {
                continue;
            }
            for pos in 0..=sw.num_ports / MFT_PORTS {
                if req.has(cm::MFT_POSITION) && pos != want_pos {
                    continue;
                }
                let mut r = [0u8; BLOCK_RECORD_SIZE];
                r[0..2].copy_from_slice(&sw.lid.to_be_bytes());
                r[2..4].copy_from_slice(&(u16::from(pos) << 12 | block).to_be_bytes());
                for (at, out) in masks.iter().filter(|(at, _)| at / MFT_BLOCK == block) {
                    let mask = (out.iter())
                        .filter(|&&p| p / MFT_PORTS == pos)
                        .fold(0u16, |m, &p| m | 1 << (p % MFT_PORTS));
                    put(
                        &mut r,
                        8 + usize::from(at % MFT_BLOCK) * 2,
                        &mask.to_be_bytes(),
                    );
                }
                rows.push(r.to_vec());
            }
        }
    }
    records(BLOCK_RECORD_SIZE, rows)
}

/// The fabric's nodes as (LID, port GUID): the switch (its port 0) and every node's port.
fn every_port(ports: &dyn Ports) -> Vec<(Lid, u64)> {
    let mut all: Vec<(Lid, u64)> = ports
        .lids()
        .into_iter()
        .filter_map(|l| Some((l, ports.guid_of(l)?)))
        .collect();
    all.extend(ports.subnet().switches().iter().map(|s| (s.lid, s.guid)));
    all
}

/// GUIDInfoRecord: each port's GUID table, one block of 8: its port GUID first, no alias
/// GUIDs.
pub(super) fn guid_infos(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let rows = every_port(ports)
        .into_iter()
        .filter(|&(lid, _)| t.u16_at(cm::LID, 0, lid) && t.u8_at(cm::BLOCK_1, 2, 0))
        .map(|(lid, guid)| {
            let mut r = [0u8; BLOCK_RECORD_SIZE];
            r[0..2].copy_from_slice(&lid.to_be_bytes());
            r[8..16].copy_from_slice(&guid.to_be_bytes());
            r.to_vec()
        })
        .collect();
    records(BLOCK_RECORD_SIZE, rows)
}

/// P_KeyTableRecord: block 0 of each node port's P_Key table (the fabric's SM set it: see
/// `crate::partition`), and of the switch's management port (the default partition); the
/// switch's external ports enforce no partitions and have none.
pub(super) fn pkey_tables(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let mut rows = Vec::new();
    for (lid, _) in every_port(ports) {
        let (port, table) = if lid > crate::subnet::MAX_HCA_LID {
            (0, crate::partition::default_table())
        } else {
            (1, ports.pkeys(lid))
        };
        if !(t.u16_at(cm::LID, 0, lid)
            && t.u16_at(cm::PKEY_BLOCK, 2, 0)
            && t.u8_at(cm::PKEY_PORT, 4, port))
        {
            continue;
        }
        let mut r = [0u8; BLOCK_RECORD_SIZE];
        r[0..2].copy_from_slice(&lid.to_be_bytes());
        r[4] = port;
        for (i, k) in table.iter().enumerate() {
            put(&mut r, 8 + 2 * i, &k.to_be_bytes());
        }
        rows.push(r.to_vec());
    }
    records(BLOCK_RECORD_SIZE, rows)
}

/// SL2VLTableRecord: every SL to VL0, for each node's port and for each pair of the
/// switch's ports in use (its port 0 and the ports whose links are up).
pub(super) fn sl2vl_tables(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let mut keys: Vec<(Lid, u8, u8)> = ports
        .lids()
        .into_iter()
        .filter(|&l| ports.guid_of(l).is_some())
        .map(|l| (l, 0, 0))
        .collect();
    let subnet = ports.subnet();
    for (i, sw) in subnet.switches().iter().enumerate() {
        let used: Vec<u8> = std::iter::once(0)
            .chain((1..=sw.num_ports).filter(|&p| super::sm::port_up(&subnet, ports, i, p)))
            .collect();
        for &p in &used {
            keys.extend(used.iter().map(|&o| (sw.lid, p, o)));
        }
        if keys.len() > super::MAX_TABLE_RECORDS && !req.has(cm::LID) {
            break;
        }
    }
    let rows = keys
        .into_iter()
        .filter(|&(lid, i, o)| {
            t.u16_at(cm::LID, 0, lid) && t.u8_at(cm::IN_PORT, 2, i) && t.u8_at(cm::OUT_PORT, 3, o)
        })
        .map(|(lid, i, o)| {
            let mut r = [0u8; SL2VL_SIZE];
            r[0..2].copy_from_slice(&lid.to_be_bytes());
            (r[2], r[3]) = (i, o);
            r.to_vec()
        })
        .collect();
    records(SL2VL_SIZE, rows)
}

/// VLArbitrationTableRecord: none (the module's words say why). A query for a block that
/// no port can have (blocks are 1 to 4) is an invalid one.
pub(super) fn vlarb_tables(req: &Request) -> Result<Found, u16> {
    if req.has(cm::VLARB_BLOCK) && !(1..=4).contains(&req.data()[3]) {
        return Err(status::REQ_INVALID);
    }
    records(VLARB_SIZE, Vec::new())
}
