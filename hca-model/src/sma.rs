//! What a subnet manager sets in the port: the device's side of its SMA's Sets
//! (`CMD_SMP_SET`). The port's agent runs in its driver (guest-kmod/hca_ib/sma.c), as an
//! HCA's firmware runs it; it hands a Set of PortInfo or P_KeyTable here, where the port
//! keeps what an SM may change: its state past INIT, its SM's LID and SL, its M_Key and
//! its protection, SubnetTimeOut. The fabric's own SM sets none of it (the port is ACTIVE
//! as it attaches); a user's SM in a guest (`Fabric::set_guest_sm`) brings a port from
//! INIT through ARMED to ACTIVE with these Sets.
//!
//! Offsets are bytes of the PortInfo attribute (IBA 14.2.5.6), big-endian on the wire.

use crate::abi::{
    HcaCmdSmpSet, Lid, PKEY_TABLE_LEN, PORT_ACTIVE, PORT_ARMED, PORT_DOWN, PORT_INIT,
};
use crate::sa::{be16, be64};
use crate::status::CmdError;

/// The SMP attributes a Set may name (IBA 14.2.5).
pub const ATTR_PORT_INFO: u16 = 0x0015;
/// P_KeyTable.
pub const ATTR_PKEY_TABLE: u16 = 0x0016;

const MKEY: usize = 0;
const GID_PREFIX: usize = 8;
const LID: usize = 16;
const MASTER_SM_LID: usize = 18;
const MKEY_LEASE: usize = 26;
/// LinkSpeedSupported (high nibble), PortState (low).
const PORT_STATE: usize = 32;
/// M_KeyProtectBits (top two bits), LMC (low three).
const PROT_LMC: usize = 34;
/// NeighborMTU (high nibble), MasterSMSL (low).
const MTU_SMSL: usize = 36;
/// OperationalVLs (high nibble).
const OP_VLS: usize = 43;
/// ClientReregister (top bit), SubnetTimeOut (low five).
const REREG_TIMEOUT: usize = 51;

/// The most unicast LID.
const MAX_UNICAST_LID: Lid = 0xbfff;
/// NeighborMTU at most 4096 (`MTU_4096`).
const MAX_MTU: u8 = 5;

/// What a subnet manager set in the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortMgmt {
    /// `PORT_INIT`, `PORT_ARMED` or `PORT_ACTIVE`, while the link is up.
    pub state: u32,
    /// MasterSMLID: where the port's SA queries go.
    pub sm_lid: Lid,
    /// MasterSMSL.
    pub sm_sl: u8,
    /// The port's M_Key (0: none).
    pub mkey: u64,
    /// M_KeyProtectBits.
    pub mkey_prot: u8,
    /// M_KeyLeasePeriod (seconds).
    pub mkey_lease: u16,
    /// SubnetTimeOut.
    pub subnet_timeout: u8,
    /// The GID prefix.
    pub gid_prefix: u64,
}

impl PortMgmt {
    /// A port configured by the fabric's own SM: ACTIVE, its SA at `sm_lid`.
    pub fn by_fabric(sm_lid: Lid) -> Self {
        Self {
            state: PORT_ACTIVE,
            sm_lid,
            ..Self::waiting()
        }
    }

    /// A port whose link came up, waiting for a subnet manager.
    pub fn waiting() -> Self {
        Self {
            state: PORT_INIT,
            sm_lid: 0,
            sm_sl: 0,
            mkey: 0,
            mkey_prot: 0,
            mkey_lease: 0,
            subnet_timeout: 18,
            gid_prefix: crate::sa::SUBNET_PREFIX,
        }
    }
}

impl Default for PortMgmt {
    fn default() -> Self {
        Self::by_fabric(0)
    }
}

/// What a Set changed, for the events the driver gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// The SM's LID or SL.
    pub sm: bool,
    /// ClientReregister was set.
    pub rereg: bool,
    /// The port became ACTIVE (Some(true)) or left it (Some(false)).
    pub active: Option<bool>,
    /// The P_Key table.
    pub pkeys: bool,
    /// PortState Down: the link retrained (its switch port starts from INIT too).
    pub retrained: bool,
}

/// Checks the SMP's M_Key against the port's (IBA 14.2.4.1: a port with a non-zero M_Key
/// takes a Set only with that key).
fn check_mkey(port: &PortMgmt, smp: &HcaCmdSmpSet) -> Result<(), CmdError> {
    if port.mkey != 0 && smp.mkey != port.mkey {
        return Err(CmdError::BadKey);
    }
    Ok(())
}

/// A PortInfo Set to the port at `lid`: every field checked before any changes, so a
/// refused Set leaves the port as it was.
pub fn set_port_info(
    port: &mut PortMgmt,
    lid: Lid,
    smp: &HcaCmdSmpSet,
) -> Result<Changed, CmdError> {
    check_mkey(port, smp)?;
    let d = &smp.data;
    // One port, numbered 1 (0 names the port the SMP came in by).
    if smp.attr_mod > 1 {
        return Err(CmdError::BadParam);
    }
    let new_lid = be16(d, LID);
    // The port's LID is where the fabric reaches it: an SM may confirm it, not move it.
    if new_lid != 0 && new_lid != lid {
        return Err(CmdError::BadParam);
    }
    let sm_lid = be16(d, MASTER_SM_LID);
    if sm_lid > MAX_UNICAST_LID {
        return Err(CmdError::BadParam);
    }
    // One LID a port: LMC 0.
    if d[PROT_LMC] & 0x7 != 0 {
        return Err(CmdError::BadParam);
    }
    if d[MTU_SMSL] >> 4 > MAX_MTU || d[OP_VLS] >> 4 > 1 {
        return Err(CmdError::BadParam);
    }
    // The port's GIDs are link-local: the SM may confirm the prefix, not change it.
    let prefix = be64(d, GID_PREFIX);
    if prefix != 0 && prefix != crate::sa::SUBNET_PREFIX {
        return Err(CmdError::BadParam);
    }
    let state = match u32::from(d[PORT_STATE] & 0xf) {
        0 => port.state,
        // Down: the link retrains, and the port starts again from INIT.
        PORT_DOWN => PORT_INIT,
        PORT_ARMED if matches!(port.state, PORT_INIT | PORT_ARMED) => PORT_ARMED,
        PORT_ACTIVE if matches!(port.state, PORT_ARMED | PORT_ACTIVE) => PORT_ACTIVE,
        _ => return Err(CmdError::BadParam),
    };
    let sm_sl = d[MTU_SMSL] & 0xf;
    let mut changed = Changed {
        sm: sm_lid != port.sm_lid || sm_sl != port.sm_sl,
        rereg: d[REREG_TIMEOUT] & 0x80 != 0,
        retrained: u32::from(d[PORT_STATE] & 0xf) == PORT_DOWN,
        ..Changed::default()
    };
    if (state == PORT_ACTIVE) != (port.state == PORT_ACTIVE) {
        changed.active = Some(state == PORT_ACTIVE);
    }
    *port = PortMgmt {
        state,
        sm_lid,
        sm_sl,
        mkey: be64(d, MKEY),
        mkey_prot: d[PROT_LMC] >> 6,
        mkey_lease: be16(d, MKEY_LEASE),
        subnet_timeout: d[REREG_TIMEOUT] & 0x1f,
        gid_prefix: crate::sa::SUBNET_PREFIX,
    };
    Ok(changed)
}

/// A P_KeyTable Set: block 0 holds the port's 16 entries; the block's other 16 must be
/// empty (the port has no room for them).
pub fn set_pkey_table(
    port: &PortMgmt,
    table: &mut crate::partition::PKeyTable,
    smp: &HcaCmdSmpSet,
) -> Result<Changed, CmdError> {
    check_mkey(port, smp)?;
    if smp.attr_mod & 0xffff != 0 {
        return Err(CmdError::BadParam);
    }
    let mut new = [0u16; PKEY_TABLE_LEN];
    for (i, slot) in (0..32).map(|i| be16(&smp.data, 2 * i)).enumerate() {
        match new.get_mut(i) {
            Some(e) => *e = slot,
            None if slot & 0x7fff != 0 => return Err(CmdError::BadParam),
            None => {}
        }
    }
    let changed = new != *table;
    *table = new;
    Ok(Changed {
        pkeys: changed,
        ..Changed::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smp(f: impl FnOnce(&mut [u8; 64])) -> HcaCmdSmpSet {
        let mut s = HcaCmdSmpSet {
            attr_id: ATTR_PORT_INFO,
            attr_mod: 1,
            ..Default::default()
        };
        s.data[LID..LID + 2].copy_from_slice(&7u16.to_be_bytes());
        f(&mut s.data);
        s
    }

    #[test]
    fn test_a_port_goes_from_init_through_armed_to_active_only() {
        let mut p = PortMgmt::waiting();
        let active = smp(|d| d[PORT_STATE] = PORT_ACTIVE as u8);
        assert_eq!(set_port_info(&mut p, 7, &active), Err(CmdError::BadParam));
        assert_eq!(p.state, PORT_INIT);
        let armed = smp(|d| {
            d[PORT_STATE] = PORT_ARMED as u8;
            d[MASTER_SM_LID..MASTER_SM_LID + 2].copy_from_slice(&3u16.to_be_bytes());
        });
        let c = set_port_info(&mut p, 7, &armed).unwrap();
        assert!(c.sm && c.active.is_none());
        assert_eq!((p.state, p.sm_lid), (PORT_ARMED, 3));
        let c = set_port_info(&mut p, 7, &active).unwrap();
        assert_eq!(c.active, Some(true));
        assert_eq!(p.state, PORT_ACTIVE);
        // Down: the link retrains and the port waits in INIT again.
        let down = smp(|d| d[PORT_STATE] = PORT_DOWN as u8);
        assert_eq!(set_port_info(&mut p, 7, &down).unwrap().active, Some(false));
        assert_eq!(p.state, PORT_INIT);
    }

    #[test]
    fn test_what_the_port_cannot_take_is_refused_whole() {
        let mut p = PortMgmt::waiting();
        let before = p;
        for bad in [
            smp(|d| d[LID..LID + 2].copy_from_slice(&8u16.to_be_bytes())),
            smp(|d| d[PROT_LMC] = 1),
            smp(|d| d[MTU_SMSL] = 6 << 4),
            smp(|d| d[MASTER_SM_LID..MASTER_SM_LID + 2].copy_from_slice(&0xc000u16.to_be_bytes())),
            smp(|d| d[PORT_STATE] = PORT_INIT as u8),
            smp(|d| d[OP_VLS] = 2 << 4),
            smp(|d| d[GID_PREFIX] = 0xfe),
        ] {
            assert_eq!(set_port_info(&mut p, 7, &bad), Err(CmdError::BadParam));
            assert_eq!(p, before);
        }
    }

    #[test]
    fn test_a_port_with_an_mkey_takes_sets_only_with_it() {
        let mut p = PortMgmt::waiting();
        let key = 0x1122_3344_5566_7788u64;
        set_port_info(
            &mut p,
            7,
            &smp(|d| d[..8].copy_from_slice(&key.to_be_bytes())),
        )
        .unwrap();
        assert_eq!(p.mkey, key);
        let armed = smp(|d| d[PORT_STATE] = PORT_ARMED as u8);
        assert_eq!(set_port_info(&mut p, 7, &armed), Err(CmdError::BadKey));
        let mut table = crate::partition::default_table();
        let mut pk = HcaCmdSmpSet {
            attr_id: ATTR_PKEY_TABLE,
            ..Default::default()
        };
        assert_eq!(set_pkey_table(&p, &mut table, &pk), Err(CmdError::BadKey));
        pk.mkey = key;
        pk.data[..2].copy_from_slice(&0xffffu16.to_be_bytes());
        pk.data[2..4].copy_from_slice(&0x8001u16.to_be_bytes());
        assert!(set_pkey_table(&p, &mut table, &pk).unwrap().pkeys);
        assert_eq!(table[..2], [0xffff, 0x8001]);
        // An entry past the port's 16 does not fit.
        pk.data[40..42].copy_from_slice(&0x8002u16.to_be_bytes());
        assert_eq!(set_pkey_table(&p, &mut table, &pk), Err(CmdError::BadParam));
        let mut armed = armed;
        armed.mkey = key;
        set_port_info(&mut p, 7, &armed).unwrap();
        assert_eq!(p.state, PORT_ARMED);
    }
}
