//! The SA's records of the subnet's structure (IBA 15.2.5), derived from the fabric as its
//! switch's and ports' SMPs show it (`sm.rs`), so that `saquery` and the SMPs agree:
//! SMInfoRecord, SwitchInfoRecord, LinkRecord, LinearForwardingTableRecord,
//! MulticastForwardingTableRecord, GUIDInfoRecord, P_KeyTableRecord, SL2VLTableRecord and
//! VLArbitrationTableRecord. (InformInfoRecord is `inform.rs`'s.)
//!
//! The subnet: one switch at [`SM_LID`] whose port n links the port at LID n (port 1 of a
//! one-port channel adapter); its management port 0 has the switch's LID and the SM. Every
//! port has one data VL (VLCap VL0), so every SL maps to VL0 and no port has VL arbitration
//! tables (PortInfo's VLArbitrationHighCap and LowCap are 0): a VLArbitrationTableRecord
//! query finds none, as OpenSM's finds none on such ports.

use super::groups::{Group, MLID_COUNT};
use super::sm::{num_ports, SM_GUID};
use super::{be16, be64, status, Found, Ports, Request, MLID_BASE, SM_LID};
use crate::abi::Lid;

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

/// Block `block` of the switch's linear forwarding table: LID n leaves by port n, the
/// switch's own LID by port 0, a LID with no port behind it by none (0xff). None past the
/// table's top.
pub(super) fn lft_block(ports: &dyn Ports, block: u32) -> Option<[u8; 64]> {
    let first = block
        .checked_mul(LFT_BLOCK)
        .filter(|&f| f <= u32::from(SM_LID))?;
    let n = num_ports(ports);
    let mut out = [0xffu8; 64];
    for (o, lid) in out.iter_mut().zip(first..) {
        *o = match Lid::try_from(lid) {
            Ok(SM_LID) => 0,
            Ok(lid) => u8::try_from(lid)
                .ok()
                .filter(|&p| p >= 1 && p <= n && ports.guid_of(lid).is_some())
                .unwrap_or(0xff),
            Err(_) => 0xff,
        };
    }
    Some(out)
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

/// SwitchInfoRecord: the one switch.
pub(super) fn switch_infos(req: &Request) -> Result<Found, u16> {
    let mut rows = Vec::new();
    if Template(req).u16_at(cm::LID, 0, SM_LID) {
        let mut r = [0u8; SWITCH_INFO_SIZE];
        r[0..2].copy_from_slice(&SM_LID.to_be_bytes());
        r[4..24].copy_from_slice(&switch_info());
        rows.push(r.to_vec());
    }
    records(SWITCH_INFO_SIZE, rows)
}

/// The ports whose links are up, by LID (each port 1 of its node, on switch port LID).
fn linked(ports: &dyn Ports) -> Vec<Lid> {
    let n = Lid::from(num_ports(ports));
    ports
        .lids()
        .into_iter()
        .filter(|&l| l <= n && ports.link_up(l))
        .collect()
}

/// LinkRecord: each link whose state is up, from each end (a node's port 1 to the
/// switch's port LID, and back).
pub(super) fn links(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let mut rows = Vec::new();
    for lid in linked(ports) {
        let port = lid as u8;
        for (from, from_port, to_port, to) in [(lid, 1, port, SM_LID), (SM_LID, port, 1, lid)] {
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
    }
    records(LINK_SIZE, rows)
}

/// LinearForwardingTableRecord: the switch's table, a block of 64 LIDs each, up to its top
/// (the switch's own LID).
pub(super) fn lfts(req: &Request, ports: &dyn Ports) -> Result<Found, u16> {
    let t = Template(req);
    let mut rows = Vec::new();
    if t.u16_at(cm::LID, 0, SM_LID) {
        let blocks: Vec<u32> = if req.has(cm::BLOCK_1) {
            vec![u32::from(be16(req.data(), 2))]
        } else {
            (0..=u32::from(SM_LID) / LFT_BLOCK).collect()
        };
        for block in blocks {
            let Some(table) = lft_block(ports, block) else {
                continue;
            };
            let mut r = [0u8; BLOCK_RECORD_SIZE];
            r[0..2].copy_from_slice(&SM_LID.to_be_bytes());
            r[2..4].copy_from_slice(&(block as u16).to_be_bytes());
            r[8..72].copy_from_slice(&table);
            rows.push(r.to_vec());
        }
    }
    records(BLOCK_RECORD_SIZE, rows)
}

/// Whether the port at `lid` is where group `g`'s packets go: a full or non-member (a
/// send-only member only sends to it).
fn receives(g: &Group, lid: Lid, ports: &dyn Ports) -> bool {
    g.members
        .iter()
        .any(|(&guid, &join)| join & 0x3 != 0 && ports.lid_of(guid) == Some(lid))
}

/// MulticastForwardingTableRecord: the switch's table for the blocks of 32 MLIDs that hold
/// a group, each position (16 ports) of it: the ports of the group's members that receive.
pub(super) fn mfts<'a>(
    req: &Request,
    groups: impl Iterator<Item = &'a Group>,
    ports: &dyn Ports,
) -> Result<Found, u16> {
    let t = Template(req);
    if !t.u16_at(cm::LID, 0, SM_LID) {
        return records(BLOCK_RECORD_SIZE, Vec::new());
    }
    let d = req.data();
    let (want_block, want_pos) = (be16(d, 2) & 0x1ff, (be16(d, 2) >> 12) as u8);
    let groups: Vec<&Group> = groups.collect();
    let mut blocks: Vec<u16> = groups
        .iter()
        .map(|g| (g.mlid - MLID_BASE) / MFT_BLOCK)
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    let n = num_ports(ports);
    let mut rows = Vec::new();
    for block in blocks {
        if req.has(cm::MFT_BLOCK) && block != want_block {
            continue;
        }
        for pos in 0..=n / MFT_PORTS {
            if req.has(cm::MFT_POSITION) && pos != want_pos {
                continue;
            }
            let mut r = [0u8; BLOCK_RECORD_SIZE];
            r[0..2].copy_from_slice(&SM_LID.to_be_bytes());
            r[2..4].copy_from_slice(&(u16::from(pos) << 12 | block).to_be_bytes());
            for g in &groups {
                let at = g.mlid - MLID_BASE;
                if at / MFT_BLOCK != block {
                    continue;
                }
                let mut mask = 0u16;
                for bit in 0..MFT_PORTS {
                    let port = pos * MFT_PORTS + bit;
                    if port >= 1 && port <= n && receives(g, Lid::from(port), ports) {
                        mask |= 1 << bit;
                    }
                }
                put(
                    &mut r,
                    8 + usize::from(at % MFT_BLOCK) * 2,
                    &mask.to_be_bytes(),
                );
            }
            rows.push(r.to_vec());
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
    all.push((SM_LID, SM_GUID));
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
        let (port, table) = if lid == SM_LID {
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
    let switch_ports: Vec<u8> = std::iter::once(0)
        .chain(linked(ports).into_iter().map(|l| l as u8))
        .collect();
    for &i in &switch_ports {
        keys.extend(switch_ports.iter().map(|&o| (SM_LID, i, o)));
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
