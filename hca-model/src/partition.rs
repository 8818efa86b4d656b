//! Partitions (IBA 10.9): which ports may talk. Each port has a table of P_Keys that the
//! subnet manager (here the fabric, from the cluster's configuration) sets; a QP sends in
//! the partition of one entry (its P_Key index) and every packet carries that P_Key in its
//! BTH. A receiving port takes a packet for a QP only if the packet's P_Key matches the
//! one at the QP's index (any entry of the table, for QP1), and drops it otherwise,
//! counting a P_Key violation. A guest picks only an index into its own port's table: it
//! cannot send in a partition the fabric did not give its port.
//!
//! A P_Key's low 15 bits name the partition; its top bit says full (1) or limited (0)
//! membership. Two limited members of one partition may not talk to each other; a full
//! member talks to both.

use crate::abi::Lid;

/// The default partition, every port a full member of it, at index 0 of every table.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Entries in a port's P_Key table (`pkey_tbl_len`).
pub const PKEY_TABLE_LEN: usize = 16;
/// The membership bit: full member when set.
pub const FULL_MEMBER: u16 = 0x8000;

/// A port's P_Keys; entry 0 is the default partition, an entry of 0 is empty.
pub type PKeyTable = [u16; PKEY_TABLE_LEN];

/// Whether a packet with P_Key `pkt` may reach a QP whose P_Key is `mine`: the same
/// partition (never the invalid partition 0), and not both limited members.
pub fn pkeys_match(pkt: u16, mine: u16) -> bool {
    let (a, b) = (pkt & !FULL_MEMBER, mine & !FULL_MEMBER);
    a != 0 && a == b && (pkt | mine) & FULL_MEMBER != 0
}

/// The first entry of `table` that admits a packet with P_Key `pkt` (QP1's check, and
/// the index its receive reports).
pub fn entry_admitting(table: &PKeyTable, pkt: u16) -> Option<usize> {
    table.iter().position(|&k| pkeys_match(pkt, k))
}

/// Whether any entry of `table` admits a packet with P_Key `pkt`.
pub fn table_admits(table: &PKeyTable, pkt: u16) -> bool {
    entry_admitting(table, pkt).is_some()
}

/// One partition beside the default: its P_Key (the membership bit is each port's own)
/// and the LIDs of its full and its limited members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    /// The partition's P_Key (its low 15 bits; the membership bit is each port's own).
    pub pkey: u16,
    /// LIDs of the full members: they talk to every member.
    pub members: Vec<Lid>,
    /// LIDs of the limited members: they talk to full members only.
    pub limited: Vec<Lid>,
}

/// Why a set of partitions cannot be a subnet's.
#[derive(Debug, PartialEq, Eq)]
pub enum PartitionError {
    /// A P_Key whose partition is 0 (invalid) or the default's (0x7fff).
    Reserved(u16),
    /// Two partitions with the same low 15 bits.
    Twice(u16),
    /// A port in more partitions than its table holds beside the default.
    TooMany(Lid),
}

impl std::fmt::Display for PartitionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PartitionError::Reserved(k) => write!(
                f,
                "P_Key {k:#06x}: partition 0 is invalid and 0x7fff is the default's"
            ),
            PartitionError::Twice(k) => write!(f, "partition {:#06x} given twice", k & 0x7fff),
            PartitionError::TooMany(lid) => write!(
                f,
                "LID {lid} is in more than {} partitions beside the default",
                PKEY_TABLE_LEN - 1
            ),
        }
    }
}

impl std::error::Error for PartitionError {}

/// Every port's table under `parts`, for the LIDs they name: the default partition at
/// index 0, then the port's partitions in the order given.
pub fn tables(parts: &[Partition]) -> Result<Vec<(Lid, PKeyTable)>, PartitionError> {
    let mut seen = Vec::new();
    let mut out: Vec<(Lid, PKeyTable, usize)> = Vec::new();
    for p in parts {
        let id = p.pkey & !FULL_MEMBER;
        if id == 0 || id == DEFAULT_PKEY & !FULL_MEMBER {
            return Err(PartitionError::Reserved(p.pkey));
        }
        if seen.contains(&id) {
            return Err(PartitionError::Twice(p.pkey));
        }
        seen.push(id);
        let full = p.members.iter().map(|&l| (l, id | FULL_MEMBER));
        for (lid, pkey) in full.chain(p.limited.iter().map(|&l| (l, id))) {
            let at = match out.iter().position(|(l, _, _)| *l == lid) {
                Some(i) => i,
                None => {
                    out.push((lid, default_table(), 1));
                    out.len() - 1
                }
            };
            let Some((_, table, used)) = out.get_mut(at) else {
                continue;
            };
            if table.iter().any(|&k| k != 0 && k & !FULL_MEMBER == id) {
                continue; // named twice: its first membership stands
            }
            let Some(slot) = table.get_mut(*used) else {
                return Err(PartitionError::TooMany(lid));
            };
            *slot = pkey;
            *used += 1;
        }
    }
    Ok(out.into_iter().map(|(l, t, _)| (l, t)).collect())
}

/// A port in no partition beside the default.
pub fn default_table() -> PKeyTable {
    let mut t = [0; PKEY_TABLE_LEN];
    t[0] = DEFAULT_PKEY;
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_full_members_talk_to_all_limited_members_only_to_full_ones() {
        assert!(pkeys_match(0x8001, 0x8001));
        assert!(pkeys_match(0x0001, 0x8001));
        assert!(pkeys_match(0x8001, 0x0001));
        assert!(!pkeys_match(0x0001, 0x0001), "two limited members");
        assert!(!pkeys_match(0x8001, 0x8002), "another partition");
        assert!(!pkeys_match(0x8000, 0x8000), "partition 0 is invalid");
        assert!(!pkeys_match(0, DEFAULT_PKEY), "an empty entry");
        assert!(pkeys_match(DEFAULT_PKEY, DEFAULT_PKEY));
        assert!(pkeys_match(0x7fff, DEFAULT_PKEY));
    }

    #[test]
    fn test_tables_put_the_default_first_and_refuse_what_a_subnet_cannot_have() {
        let t = tables(&[
            Partition {
                pkey: 0x8001,
                members: vec![1, 2],
                limited: vec![],
            },
            Partition {
                pkey: 0x0002,
                members: vec![],
                limited: vec![2],
            },
        ])
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].0, 1);
        assert_eq!(&t[0].1[..3], &[DEFAULT_PKEY, 0x8001, 0]);
        assert_eq!(&t[1].1[..3], &[DEFAULT_PKEY, 0x8001, 0x0002]);
        assert!(table_admits(&t[1].1, 0x8002));
        assert!(!table_admits(&t[0].1, 0x8002));
        let one = |pkey, lid| Partition {
            pkey,
            members: vec![lid],
            limited: vec![],
        };
        assert_eq!(
            tables(&[one(0x7fff, 1)]),
            Err(PartitionError::Reserved(0x7fff))
        );
        assert_eq!(
            tables(&[one(0x8000, 1)]),
            Err(PartitionError::Reserved(0x8000))
        );
        let twice = [one(0x8003, 1), one(0x0003, 2)];
        assert_eq!(tables(&twice), Err(PartitionError::Twice(0x0003)));
        let many: Vec<Partition> = (1..=16).map(|k| one(0x8000 | k, 5)).collect();
        assert_eq!(tables(&many), Err(PartitionError::TooMany(5)));
        assert!(tables(&many[..15]).is_ok());
    }
}
