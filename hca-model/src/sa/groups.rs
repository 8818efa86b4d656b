//! Multicast groups as the SA keeps them (MCMemberRecord, IBA 15.2.5.17): a join creates a
//! group and its MLID when the request carries what a group needs, a leave takes a member
//! out, and a group goes with its last member, except the IPoIB broadcast group of the
//! default partition, which exists from the start as OpenSM creates it.
//!
//! Bounded: MLIDs come from a range of 0x3fff, and one port may be a member of at most
//! [`MAX_GROUPS_PER_PORT`] groups, so one guest cannot take every MLID.

use std::collections::BTreeMap;

use super::{
    be16, be32, gid_at, gid_guid, meets, select, status, Found, Ports, Request, DEFAULT_PKEY,
    IPOIB_BROADCAST_MGID, IPOIB_QKEY, MLID_BASE, MTU_2048, MTU_4096, RATE_10G, RATE_40G,
};
use crate::abi::Lid;

/// The most groups one port may belong to.
pub const MAX_GROUPS_PER_PORT: usize = 512;
/// How many multicast LIDs there are (0xc000..0xfffe).
pub(super) const MLID_COUNT: Lid = 0x3fff;
/// An MCMemberRecord is 52 bytes; tables carry it in 56.
const RECORD_SIZE: usize = 56;

/// MCMemberRecord component mask bits (IBA 15.2.5.17).
pub(super) mod mc {
    pub const MGID: u64 = 1 << 0;
    pub const PORT_GID: u64 = 1 << 1;
    pub const QKEY: u64 = 1 << 2;
    pub const MLID: u64 = 1 << 3;
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

/// A multicast group the SA manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The group's MGID.
    pub mgid: [u8; 16],
    /// The multicast LID packets to the group carry.
    pub mlid: Lid,
    /// The Q_Key its members' UD QPs use.
    pub qkey: u32,
    /// The P_Key of its partition.
    pub pkey: u16,
    /// Its MTU (IB's enum: 5 is 4096 bytes).
    pub mtu: u8,
    /// Its rate (IB's enum).
    pub rate: u8,
    /// Its service level.
    pub sl: u8,
    /// Its flow label.
    pub flow_label: u32,
    /// Its traffic class.
    pub tclass: u8,
    /// Members by port GUID, with their JoinState bits (full, non, send-only).
    pub members: BTreeMap<u64, u8>,
    /// Kept with no members (the partition's IPoIB broadcast group).
    pub permanent: bool,
}

/// The SA's groups, by MGID.
#[derive(Debug)]
pub(super) struct Groups {
    by_mgid: BTreeMap<[u8; 16], Group>,
    next_mlid: Lid,
    /// MGIDs the SA assigned to joins that asked for one.
    next_mgid: u64,
}

impl Default for Groups {
    fn default() -> Self {
        let mut groups = Self {
            by_mgid: BTreeMap::new(),
            next_mlid: MLID_BASE,
            next_mgid: 1,
        };
        groups.add_broadcast(DEFAULT_PKEY);
        groups
    }
}

/// The IPoIB broadcast MGID of the partition with P_Key `pkey` (RFC 4391: the P_Key, full
/// bit set, at bytes 4 and 5).
pub fn ipoib_broadcast_mgid(pkey: u16) -> [u8; 16] {
    let mut mgid = IPOIB_BROADCAST_MGID;
    let full = pkey | crate::partition::FULL_MEMBER;
    mgid[4..6].copy_from_slice(&full.to_be_bytes());
    mgid
}

impl Groups {
    /// A partition's IPoIB broadcast group, which the SA keeps while the partition lasts.
    fn add_broadcast(&mut self, pkey: u16) {
        let mgid = ipoib_broadcast_mgid(pkey);
        if self.by_mgid.contains_key(&mgid) {
            return;
        }
        let Some(mlid) = self.alloc_mlid() else {
            return;
        };
        self.by_mgid.insert(
            mgid,
            Group {
                mgid,
                mlid,
                qkey: IPOIB_QKEY,
                pkey: pkey | crate::partition::FULL_MEMBER,
                mtu: MTU_2048,
                rate: RATE_10G,
                sl: 0,
                flow_label: 0,
                tclass: 0,
                members: BTreeMap::new(),
                permanent: true,
            },
        );
    }

    /// The partitions beside the default are `pkeys`: see `SubnetAdmin::set_partitions`.
    pub(super) fn partition_broadcasts(&mut self, pkeys: &[u16]) {
        let keep: Vec<[u8; 16]> = std::iter::once(DEFAULT_PKEY)
            .chain(pkeys.iter().copied())
            .map(ipoib_broadcast_mgid)
            .collect();
        self.by_mgid.retain(|mgid, g| {
            // (A partition's broadcast MGID is the default's with its P_Key in it.)
            let broadcast = *mgid == ipoib_broadcast_mgid(u16::from_be_bytes([mgid[4], mgid[5]]));
            !(g.permanent && broadcast) || keep.contains(mgid)
        });
        for &k in pkeys {
            self.add_broadcast(k);
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Group> {
        self.by_mgid.values()
    }

    pub(super) fn by_mlid(&self, mlid: Lid) -> Option<&Group> {
        self.by_mgid.values().find(|g| g.mlid == mlid)
    }

    fn alloc_mlid(&mut self) -> Option<Lid> {
        let used: std::collections::BTreeSet<Lid> = self.by_mgid.values().map(|g| g.mlid).collect();
        (0..MLID_COUNT)
            .map(|i| MLID_BASE + (self.next_mlid - MLID_BASE + i) % MLID_COUNT)
            .find(|l| !used.contains(l))
            .inspect(|&l| self.next_mlid = l + 1)
    }

    /// MCMemberRecord Set: `req`'s port joins (and may create) a group.
    pub(super) fn join(
        &mut self,
        req: &Request,
        ports: &dyn Ports,
        life: u8,
    ) -> Result<Found, u16> {
        let d = req.data();
        if !req.has(mc::PORT_GID | mc::JOIN_STATE) {
            return Err(status::INSUFFICIENT_COMPONENTS);
        }
        let port_gid = gid_at(d, 16);
        let Some(guid) = gid_guid(&port_gid).filter(|&g| ports.lid_of(g).is_some()) else {
            return Err(status::INVALID_GID);
        };
        let join_state = d[48] & 0x0f;
        if join_state == 0 {
            return Err(status::REQ_INVALID);
        }
        let mut mgid = if req.has(mc::MGID) {
            gid_at(d, 0)
        } else {
            [0; 16]
        };
        let joined = self
            .by_mgid
            .values()
            .filter(|g| g.members.contains_key(&guid))
            .count();
        let already = self
            .by_mgid
            .get(&mgid)
            .is_some_and(|g| g.members.contains_key(&guid));
        if joined >= MAX_GROUPS_PER_PORT && !already {
            return Err(status::NO_RESOURCES);
        }
        if mgid == [0; 16] {
            // The SA picks an MGID in the IBA's SA-assigned range (ff1x:a01b::/...).
            mgid = [0xff, 0x12, 0xa0, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            mgid[8..].copy_from_slice(&self.next_mgid.to_be_bytes());
            self.next_mgid += 1;
        } else if mgid[0] != 0xff {
            return Err(status::INVALID_GID);
        }
        // A group lies in one partition: only its members may make it or join it.
        let lid = ports.lid_of(guid).ok_or(status::INVALID_GID)?;
        let pkey = match self.by_mgid.get(&mgid) {
            Some(g) => g.pkey,
            None if req.has(mc::PKEY) => be16(d, 40),
            None => return Err(status::REQ_INVALID),
        };
        if super::records::member_entry(&ports.pkeys(lid), pkey).is_none() {
            return Err(status::REQ_INVALID);
        }
        if !self.by_mgid.contains_key(&mgid) {
            let group = self.create(req, mgid)?;
            self.by_mgid.insert(mgid, group);
        }
        let g = self.by_mgid.get_mut(&mgid).ok_or(status::NO_RESOURCES)?;
        // A join must agree with the group on what it names.
        if (req.has(mc::QKEY) && be32(d, 32) != g.qkey)
            || (req.has(mc::PKEY) && be16(d, 40) != g.pkey)
        {
            return Err(status::REQ_INVALID);
        }
        // The group's MTU must meet the member's selector (IPoIB asks for exactly the
        // broadcast group's).
        if req.has(mc::MTU_SELECTOR | mc::MTU) && !meets(d[38] >> 6, d[38] & 0x3f, g.mtu) {
            return Err(status::REQ_INVALID);
        }
        let state = {
            let s = g.members.entry(guid).or_insert(0);
            *s |= join_state;
            *s
        };
        Ok(Found::One(member_record(g, &port_gid, state, life)))
    }

    /// A new group as a join describes it (the join has not been admitted yet).
    fn create(&mut self, req: &Request, mgid: [u8; 16]) -> Result<Group, u16> {
        let d = req.data();
        if !req.has(mc::CREATE) {
            // No such group, and not enough to make one.
            return Err(status::REQ_INVALID);
        }
        let mtu = if req.has(mc::MTU_SELECTOR | mc::MTU) {
            select(d[38] >> 6, d[38] & 0x3f, MTU_4096).ok_or(status::REQ_INVALID)?
        } else {
            MTU_4096
        };
        let rate = if req.has(mc::RATE_SELECTOR | mc::RATE) {
            select(d[42] >> 6, d[42] & 0x3f, RATE_40G).ok_or(status::REQ_INVALID)?
        } else {
            RATE_40G
        };
        let mlid = self.alloc_mlid().ok_or(status::NO_RESOURCES)?;
        let sl_flow_hop = be32(d, 44);
        Ok(Group {
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
        })
    }

    /// MCMemberRecord Delete: `req`'s port leaves the JoinState bits it names.
    pub(super) fn leave(&mut self, req: &Request, life: u8) -> Result<Found, u16> {
        let d = req.data();
        if !req.has(mc::MGID | mc::PORT_GID | mc::JOIN_STATE) {
            return Err(status::INSUFFICIENT_COMPONENTS);
        }
        let (mgid, port_gid) = (gid_at(d, 0), gid_at(d, 16));
        let guid = gid_guid(&port_gid).ok_or(status::INVALID_GID)?;
        let g = self.by_mgid.get_mut(&mgid).ok_or(status::NO_RECORDS)?;
        let state = g.members.get_mut(&guid).ok_or(status::NO_RECORDS)?;
        *state &= !(d[48] & 0x0f);
        let left = *state;
        let rec = member_record(g, &port_gid, left, life);
        if left == 0 {
            g.members.remove(&guid);
        }
        if g.members.is_empty() && !g.permanent {
            self.by_mgid.remove(&mgid);
        }
        Ok(Found::One(rec))
    }

    /// MCMemberRecord Get/GetTable. With a port GID, the records of that port's
    /// memberships; otherwise a GetTable lists every member of every matching group (a
    /// group with none as one record with a zero port GID), and a Get the group itself.
    pub(super) fn find(&self, req: &Request, life: u8) -> Found {
        let d = req.data();
        let groups = self.by_mgid.values().filter(|g| {
            (!req.has(mc::MGID) || g.mgid == gid_at(d, 0))
                && (!req.has(mc::MLID) || g.mlid == be16(d, 36))
                && (!req.has(mc::QKEY) || g.qkey == be32(d, 32))
                && (!req.has(mc::PKEY) || g.pkey == be16(d, 40))
        });
        let mut rows = Vec::new();
        for g in groups {
            if req.has(mc::PORT_GID) {
                let port_gid = gid_at(d, 16);
                let state = gid_guid(&port_gid).and_then(|guid| g.members.get(&guid));
                if let Some(&state) = state {
                    rows.push(member_record(g, &port_gid, state, life));
                }
            } else if req.is_table() && !g.members.is_empty() {
                for (&guid, &state) in &g.members {
                    rows.push(member_record(g, &super::port_gid(guid), state, life));
                }
            } else {
                rows.push(member_record(g, &[0; 16], 0, life));
            }
        }
        Found::Records {
            size: RECORD_SIZE,
            rows,
        }
    }
}

/// An MCMemberRecord of group `g` for the member `port_gid` in `join_state`; the
/// subnet's packet lifetime is `life`.
fn member_record(g: &Group, port_gid: &[u8; 16], join_state: u8, life: u8) -> Vec<u8> {
    let mut out = [0u8; 52];
    out[0..16].copy_from_slice(&g.mgid);
    out[16..32].copy_from_slice(port_gid);
    out[32..36].copy_from_slice(&g.qkey.to_be_bytes());
    out[36..38].copy_from_slice(&g.mlid.to_be_bytes());
    out[38] = 2 << 6 | g.mtu;
    out[39] = g.tclass;
    out[40..42].copy_from_slice(&g.pkey.to_be_bytes());
    out[42] = 2 << 6 | g.rate;
    out[43] = 2 << 6 | life;
    let sl_flow_hop = u32::from(g.sl) << 28 | g.flow_label << 8;
    out[44..48].copy_from_slice(&sl_flow_hop.to_be_bytes());
    // Scope: link-local (2), as IPoIB's groups are.
    out[48] = 2 << 4 | join_state;
    out.to_vec()
}
