//! Multicast on the device side: which UD QPs are attached to which groups (ATTACH_MCAST,
//! DETACH_MCAST), and a group's datagram handed to each of them. Which ports a group's
//! packets reach is the fabric's business (the subnet administrator's members).

use crate::abi::*;
use crate::hca::{Device, HcaState};
use crate::packet::Grh;
use crate::status::CmdError;

/// One QP attached to one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attachment {
    pub mgid: [u8; 16],
    pub mlid: u16,
    pub qpn: u32,
}

impl HcaState {
    fn mcast_target(&self, c: &HcaCmdMcast) -> Result<Attachment, CmdError> {
        let mlid = u32::from(c.mlid);
        if !(MCAST_LID_FIRST..0xffff).contains(&mlid) || c.mgid[0] != 0xff {
            return Err(CmdError::BadParam);
        }
        let qp = self.qps.get(c.qpn).ok_or(CmdError::BadHandle)?;
        if qp.qp_type != QPT_UD {
            return Err(CmdError::BadParam);
        }
        Ok(Attachment {
            mgid: c.mgid,
            mlid: c.mlid,
            qpn: c.qpn,
        })
    }

    pub(crate) fn cmd_attach_mcast(&mut self, c: &HcaCmdMcast) -> Result<(), CmdError> {
        let a = self.mcast_target(c)?;
        let mcast = &mut self.dev.mcast;
        if mcast.contains(&a) {
            return Err(CmdError::Busy);
        }
        if mcast.len() >= MAX_MCAST_ATTACH as usize {
            return Err(CmdError::NoResources);
        }
        mcast.push(a);
        Ok(())
    }

    pub(crate) fn cmd_detach_mcast(&mut self, c: &HcaCmdMcast) -> Result<(), CmdError> {
        let a = self.mcast_target(c)?;
        let mcast = &mut self.dev.mcast;
        let at = mcast
            .iter()
            .position(|x| *x == a)
            .ok_or(CmdError::BadParam)?;
        mcast.swap_remove(at);
        Ok(())
    }
}

impl Device {
    /// A destroyed QP leaves every group.
    pub(crate) fn detach_qp(&mut self, qpn: u32) {
        self.mcast.retain(|a| a.qpn != qpn);
    }

    /// The GRH a datagram to `dlid` carries: one for a multicast LID (this port's GID to the
    /// group's MGID, as the subnet administrator knows it), none for a unicast one.
    pub(crate) fn multicast_grh(&self, dlid: u16) -> Option<Grh> {
        if !(MCAST_LID_FIRST..0xffff).contains(&u32::from(dlid)) {
            return None;
        }
        let dgid = self
            .fabric
            .as_ref()
            .and_then(|f| f.with_sa(|sa| sa.group_by_mlid(dlid).map(|g| g.mgid)))
            .unwrap_or_default();
        Some(Grh {
            sgid: crate::sa::port_gid(self.node_guid),
            dgid,
        })
    }

    /// The QPs attached to the group at `mlid`.
    pub(crate) fn attached(&self, mlid: u16) -> Vec<u32> {
        let mut q: Vec<u32> = self
            .mcast
            .iter()
            .filter(|a| a.mlid == mlid)
            .map(|a| a.qpn)
            .collect();
        // One QP may be attached under two MGIDs that share the MLID: it gets one copy.
        q.sort_unstable();
        q.dedup();
        q
    }
}
