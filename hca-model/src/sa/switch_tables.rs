//! What a user's subnet manager (OpenSM in a guest: `Fabric::set_guest_sm`) sets in a
//! switch through its SMA: the linear and multicast forwarding tables, SwitchInfo's
//! LinearFDBTop and LifeTimeValue, each external port's state (INIT, ARMED, ACTIVE), and
//! the management port's SM LID and M_Key. The fabric then forwards by these tables as a
//! switch does: nothing but subnet management passes a port the SM has not made ACTIVE,
//! a unicast packet goes out of the port its LID's entry names, and a multicast one out of
//! every port its MLID's mask names.
//!
//! Every Set is checked whole before it changes anything; what the switch cannot hold
//! (a LID past its table, a port it lacks) is refused with the SMP status a switch gives.
//! The tables are bounded by the switch's capabilities (LinearFDBCap, MulticastFDBCap).
//! Each switch of a subnet has tables of its own.

use std::collections::BTreeMap;

use super::{be16, status, MLID_BASE, SM_LID};
use crate::abi::Lid;

/// An LFT entry or MFT port that names no port.
pub const NO_PORT: u8 = 0xff;
/// LIDs a linear forwarding table block holds.
const LFT_BLOCK: usize = 64;
/// MLIDs a multicast forwarding table block holds, each a 16-port mask.
const MFT_BLOCK: usize = 32;
/// Port-mask positions: 16 ports each, up to the most ports a switch has.
const MFT_POSITIONS: usize = 16;
/// The MLIDs the switch forwards (MulticastFDBCap, as SwitchInfo says).
pub const MFT_CAP: usize = super::groups::MLID_COUNT as usize;

/// PortInfo offsets (IBA 14.2.5.6).
const PI_MKEY: usize = 0;
const PI_LID: usize = 16;
const PI_SM_LID: usize = 18;
const PI_STATE: usize = 32;
/// M_KeyProtectBits (top two bits).
const PI_PROT: usize = 34;
/// SwitchInfo offsets (IBA 14.2.5.4).
const SI_LFT_TOP: usize = 6;
const SI_LIFE: usize = 11;
/// SwitchInfo byte 11: PortStateChange.
const PORT_STATE_CHANGE: u8 = 0x04;

const INIT: u8 = 2;
const ARMED: u8 = 3;
const ACTIVE: u8 = 4;

/// The switch as a user's SM set it.
#[derive(Clone, Debug, Default)]
pub struct SwitchTables {
    /// The port for each LID up to LinearFDBTop.
    lft: Vec<u8>,
    /// LinearFDBTop.
    top: Lid,
    /// The port mask of each MLID the SM set (bit p of position p / 16: port p).
    mft: BTreeMap<Lid, [u16; MFT_POSITIONS]>,
    /// Each external port's state (INIT until the SM arms and activates it).
    states: Vec<u8>,
    /// SwitchInfo: LifeTimeValue's five bits, in the byte's top.
    life: u8,
    /// SwitchInfo's PortStateChange: a port's link went down or came back since the SM
    /// last cleared it (OpenSM's light sweep reads it and sweeps again).
    state_change: bool,
    /// The management port's MasterSMLID, M_Key and M_KeyProtectBits.
    sm_lid: Lid,
    mkey: u64,
    mkey_prot: u8,
    /// External ports the SM set Down since the fabric last looked: their links retrain,
    /// and the HCA at the other end starts from INIT too.
    retrained: Vec<u8>,
    /// Traps sent (their TIDs count them).
    traps: u64,
}

impl SwitchTables {
    /// The port the switch forwards unicast `dlid` to (0: its own management port).
    pub fn out_port(&self, dlid: Lid) -> Option<u8> {
        if dlid > self.top {
            return None;
        }
        (self.lft.get(usize::from(dlid)).copied()).filter(|&p| p != NO_PORT)
    }

    /// Whether an SMP with M_Key `smp_mkey` reaches the switch's agent (IBA 14.2.4.1):
    /// every SMP while the switch has no M_Key; then a Set only with it, and a Get without
    /// it only while the protection is below 2. One that does not gets no answer.
    pub fn admits(&self, smp_mkey: u64, set: bool) -> bool {
        self.mkey == 0 || smp_mkey == self.mkey || (!set && self.mkey_prot < 2)
    }

    /// The external ports the SM set Down since the last call.
    pub fn take_retrained(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.retrained)
    }

    /// The ports the switch forwards multicast `mlid` to.
    pub fn mcast_ports(&self, mlid: Lid) -> Vec<u8> {
        let Some(mask) = self.mft.get(&mlid) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (pos, bits) in mask.iter().enumerate() {
            for b in 0..16 {
                if bits & (1 << b) != 0 {
                    out.push((pos * 16 + b) as u8);
                }
            }
        }
        out
    }

    /// Whether external port `p` is ACTIVE (data passes it).
    pub fn active(&self, p: u8) -> bool {
        self.state(p) == ACTIVE
    }

    fn state(&self, p: u8) -> u8 {
        self.states.get(usize::from(p)).copied().unwrap_or(INIT)
    }

    /// External port `p`'s link went down or came back: it starts again from INIT.
    pub fn port_reset(&mut self, p: u8) {
        if let Some(s) = self.states.get_mut(usize::from(p)) {
            *s = INIT;
        }
        self.state_change = true;
    }

    /// Where a trap goes and what it carries, counted as sent: the SM's LID, the
    /// switch's M_Key and the trap's TID. None before an SM set the SM LID.
    pub fn next_trap(&mut self) -> Option<(Lid, u64, u64)> {
        if self.sm_lid == 0 {
            return None;
        }
        self.traps += 1;
        Some((self.sm_lid, self.mkey, self.traps))
    }

    /// LinearFDBTop: the highest LID the SM gave the table.
    pub fn top(&self) -> Lid {
        self.top
    }

    /// How many MLIDs forward to some port.
    pub fn mlids(&self) -> usize {
        self.mft.len()
    }

    /// The management port's MasterSMLID (0 before a user's SM set it).
    pub fn sm_lid(&self) -> Lid {
        self.sm_lid
    }

    /// The PortState a Get of port `p`'s PortInfo shows, while its link is up.
    pub fn port_state(&self, p: u8) -> u8 {
        if p == 0 {
            ACTIVE
        } else {
            self.state(p)
        }
    }

    /// SwitchInfo as a Get shows it: `base` (the switch's capabilities) with what the SM
    /// set.
    pub fn switch_info(&self, mut base: [u8; 20]) -> [u8; 20] {
        base[SI_LFT_TOP..SI_LFT_TOP + 2].copy_from_slice(&self.top.to_be_bytes());
        base[SI_LIFE] = self.life | (u8::from(self.state_change) * PORT_STATE_CHANGE);
        base
    }

    /// LFT block `block` as a Get shows it.
    pub fn lft_block(&self, block: u32) -> Option<[u8; LFT_BLOCK]> {
        let first = usize::try_from(block).ok()?.checked_mul(LFT_BLOCK)?;
        if first > usize::from(SM_LID) {
            return None;
        }
        let mut out = [NO_PORT; LFT_BLOCK];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.lft.get(first + i).copied().unwrap_or(NO_PORT);
        }
        Some(out)
    }

    /// MFT block (attribute modifier `attr_mod`: position in bits 28-31, block in 0-8) as a
    /// Get shows it.
    pub fn mft_block(&self, attr_mod: u32) -> Option<[u8; 64]> {
        let (first, pos) = mft_place(attr_mod)?;
        let mut out = [0u8; 64];
        for (i, pair) in out.chunks_exact_mut(2).enumerate() {
            let mlid = first + i as Lid;
            let mask = (self.mft.get(&mlid)).map_or(0, |m| m.get(pos).copied().unwrap_or(0));
            pair.copy_from_slice(&mask.to_be_bytes());
        }
        Some(out)
    }

    /// A Set of SwitchInfo: LinearFDBTop (at most the LFT's capacity) and LifeTimeValue.
    pub fn set_switch_info(&mut self, data: &[u8]) -> Result<(), u16> {
        let top = be16(data, SI_LFT_TOP);
        if top > SM_LID {
            return Err(status::INVALID_FIELD);
        }
        self.top = top;
        self.lft.resize(usize::from(top) + 1, NO_PORT);
        let life = data.get(SI_LIFE).copied().unwrap_or(0);
        self.life = life & 0xf8;
        // Written as 1, PortStateChange clears (IBA 14.2.5.4).
        if life & PORT_STATE_CHANGE != 0 {
            self.state_change = false;
        }
        Ok(())
    }

    /// A Set of LFT block `block`: each entry a port of the switch's `num_ports` (or none).
    pub fn set_lft_block(&mut self, block: u32, data: &[u8], num_ports: u8) -> Result<(), u16> {
        let first = usize::try_from(block)
            .ok()
            .and_then(|b| b.checked_mul(LFT_BLOCK))
            .filter(|&f| f <= usize::from(SM_LID))
            .ok_or(status::INVALID_FIELD)?;
        let entries = data.get(..LFT_BLOCK).ok_or(status::INVALID_FIELD)?;
        if entries.iter().any(|&p| p != NO_PORT && p > num_ports) {
            return Err(status::INVALID_FIELD);
        }
        let end = (first + LFT_BLOCK).min(usize::from(SM_LID) + 1);
        if self.lft.len() < end {
            self.lft.resize(end, NO_PORT);
        }
        for (slot, &p) in self
            .lft
            .iter_mut()
            .skip(first)
            .take(end - first)
            .zip(entries)
        {
            *slot = p;
        }
        Ok(())
    }

    /// A Set of an MFT block: masks of ports the switch has.
    pub fn set_mft_block(&mut self, attr_mod: u32, data: &[u8], num_ports: u8) -> Result<(), u16> {
        let (first, pos) = mft_place(attr_mod).ok_or(status::INVALID_FIELD)?;
        let has = |bit: usize| pos * 16 + bit <= usize::from(num_ports);
        let masks: Vec<u16> = (0..MFT_BLOCK).map(|i| be16(data, 2 * i)).collect();
        if masks
            .iter()
            .any(|m| (0..16).any(|b| m & (1 << b) != 0 && !has(b)))
        {
            return Err(status::INVALID_FIELD);
        }
        for (i, m) in masks.into_iter().enumerate() {
            let mlid = first + i as Lid;
            let entry = self.mft.entry(mlid).or_insert([0; MFT_POSITIONS]);
            if let Some(e) = entry.get_mut(pos) {
                *e = m;
            }
            if entry.iter().all(|&b| b == 0) {
                self.mft.remove(&mlid);
            }
        }
        Ok(())
    }

    /// A Set of port `p`'s PortInfo (`own_lid`: the switch's LID, which port 0 keeps):
    /// the management port takes the SM's LID and an M_Key with its protection, an
    /// external port a new state (ARMED from INIT, ACTIVE from ARMED, DOWN back to INIT,
    /// retraining its link). The caller checked the M_Key ([`SwitchTables::admits`]).
    pub fn set_port_info(
        &mut self,
        p: u8,
        data: &[u8],
        own_lid: Lid,
        num_ports: u8,
    ) -> Result<(), u16> {
        if p > num_ports {
            return Err(status::INVALID_FIELD);
        }
        if p == 0 {
            let lid = be16(data, PI_LID);
            if lid != 0 && lid != own_lid {
                return Err(status::INVALID_FIELD);
            }
            let sm_lid = be16(data, PI_SM_LID);
            if sm_lid > SM_LID {
                return Err(status::INVALID_FIELD);
            }
            self.sm_lid = sm_lid;
            self.mkey = u64::from(be16(data, PI_MKEY)) << 48
                | u64::from(be16(data, PI_MKEY + 2)) << 32
                | u64::from(be16(data, PI_MKEY + 4)) << 16
                | u64::from(be16(data, PI_MKEY + 6));
            self.mkey_prot = data.get(PI_PROT).copied().unwrap_or(0) >> 6;
            return Ok(());
        }
        let now = self.state(p);
        let next = match data.get(PI_STATE).copied().unwrap_or(0) & 0xf {
            0 => now,
            1 => {
                if !self.retrained.contains(&p) {
                    self.retrained.push(p);
                }
                self.state_change = true;
                INIT
            }
            ARMED if matches!(now, INIT | ARMED) => ARMED,
            ACTIVE if matches!(now, ARMED | ACTIVE) => ACTIVE,
            _ => return Err(status::INVALID_FIELD),
        };
        if self.states.len() <= usize::from(p) {
            self.states.resize(usize::from(p) + 1, INIT);
        }
        if let Some(s) = self.states.get_mut(usize::from(p)) {
            *s = next;
        }
        Ok(())
    }
}

/// The first MLID and the mask position an MFT attribute modifier names.
fn mft_place(attr_mod: u32) -> Option<(Lid, usize)> {
    let pos = (attr_mod >> 28) as usize;
    let block = (attr_mod & 0x1ff) as usize;
    let first = block * MFT_BLOCK;
    (pos < MFT_POSITIONS && first < MFT_CAP).then(|| (MLID_BASE + first as Lid, pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_lft_blocks_set_and_read_back_and_bad_ports_are_refused() {
        let mut t = SwitchTables::default();
        let mut si = [0u8; 20];
        si[SI_LFT_TOP..SI_LFT_TOP + 2].copy_from_slice(&70u16.to_be_bytes());
        t.set_switch_info(&si).unwrap();
        let mut block = [NO_PORT; 64];
        block[1] = 1;
        block[2] = 2;
        t.set_lft_block(0, &block, 3).unwrap();
        assert_eq!(
            (t.out_port(1), t.out_port(2), t.out_port(3)),
            (Some(1), Some(2), None)
        );
        // Past LinearFDBTop (70) nothing is forwarded, whatever a block set.
        let mut far = [NO_PORT; 64];
        far[6] = 1;
        far[10] = 1;
        t.set_lft_block(1, &far, 3).unwrap();
        assert_eq!((t.out_port(64 + 6), t.out_port(64 + 10)), (Some(1), None));
        block[5] = 4;
        assert_eq!(t.set_lft_block(0, &block, 3), Err(status::INVALID_FIELD));
        assert_eq!(t.out_port(5), None);
        assert_eq!(
            t.set_lft_block(768, &[0; 64], 3),
            Err(status::INVALID_FIELD)
        );
        assert_eq!(t.lft_block(0).unwrap()[2], 2);
        assert_eq!(t.switch_info([0; 20])[SI_LFT_TOP + 1], 70);
        // A port's link went: PortStateChange until the SM writes it back.
        t.port_reset(2);
        assert_eq!(
            t.switch_info([0; 20])[SI_LIFE] & PORT_STATE_CHANGE,
            PORT_STATE_CHANGE
        );
        si[SI_LIFE] = PORT_STATE_CHANGE;
        t.set_switch_info(&si).unwrap();
        assert_eq!(t.switch_info([0; 20])[SI_LIFE] & PORT_STATE_CHANGE, 0);
    }

    #[test]
    fn test_mft_masks_name_ports_by_position() {
        let mut t = SwitchTables::default();
        let mut data = [0u8; 64];
        data[2..4].copy_from_slice(&0b1010u16.to_be_bytes()); // MLID 0xc001: ports 1, 3
        t.set_mft_block(0, &data, 20).unwrap();
        data[2..4].copy_from_slice(&0b1u16.to_be_bytes()); // position 1: port 16
        t.set_mft_block(1 << 28, &data, 20).unwrap();
        assert_eq!(t.mcast_ports(0xc001), vec![1, 3, 16]);
        data[2..4].copy_from_slice(&0b1000_0000u16.to_be_bytes()); // port 23 > 20
        assert_eq!(
            t.set_mft_block(1 << 28, &data, 20),
            Err(status::INVALID_FIELD)
        );
        assert_eq!(t.mft_block(0).unwrap()[3], 0b1010);
        assert!(t.mcast_ports(0xc002).is_empty());
    }

    #[test]
    fn test_ports_go_init_armed_active_and_port0_keeps_its_lid() {
        let mut t = SwitchTables::default();
        let pi = |state: u8| {
            let mut d = [0u8; 64];
            d[PI_STATE] = state;
            d
        };
        assert_eq!(
            t.set_port_info(1, &pi(ACTIVE), SM_LID, 2),
            Err(status::INVALID_FIELD)
        );
        t.set_port_info(1, &pi(ARMED), SM_LID, 2).unwrap();
        assert!(!t.active(1));
        t.set_port_info(1, &pi(ACTIVE), SM_LID, 2).unwrap();
        assert!(t.active(1) && !t.active(2));
        let mut p0 = [0u8; 64];
        p0[PI_LID..PI_LID + 2].copy_from_slice(&5u16.to_be_bytes());
        assert_eq!(
            t.set_port_info(0, &p0, SM_LID, 2),
            Err(status::INVALID_FIELD)
        );
        p0[PI_LID..PI_LID + 2].copy_from_slice(&SM_LID.to_be_bytes());
        p0[PI_SM_LID..PI_SM_LID + 2].copy_from_slice(&1u16.to_be_bytes());
        p0[7] = 9; // M_Key 9, protection 1: Gets without it pass, Sets do not
        p0[PI_PROT] = 1 << 6;
        assert!(t.admits(0, true));
        t.set_port_info(0, &p0, SM_LID, 2).unwrap();
        assert_eq!(t.sm_lid(), 1);
        assert!(!t.admits(0, true) && t.admits(0, false) && t.admits(9, true));
        p0[PI_PROT] = 2 << 6;
        t.set_port_info(0, &p0, SM_LID, 2).unwrap();
        assert!(!t.admits(0, false) && t.admits(9, false));
        // Down retrains the link: INIT, and the HCA at its end is told.
        t.set_port_info(1, &pi(1), SM_LID, 2).unwrap();
        assert!(!t.active(1));
        assert_eq!(t.take_retrained(), [1]);
        assert!(t.take_retrained().is_empty());
    }
}
