//! A subnet managed by a user's SM (OpenSM in a guest) instead of the fabric's own: the
//! fabric then runs no SM and no SA (SA queries go to wherever the user's SM told the
//! ports its SA is), the HCA ports come up in INIT and wait for that SM, and the switch
//! forwards by the tables it set (`sa::switch_tables`): a data packet passes only ACTIVE
//! ports, unicast by the LFT, multicast by the MFT. Subnet management packets (QP0) pass
//! whatever the ports' states, as they must for an SM to bring them up.
//!
//! Only the default single switch takes a user's SM (its port n links LID n).

use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::{Arc, RwLock};

use super::{DropReason, Fabric, Lid, LinkHook};
use crate::abi::SMI_QPN;
use crate::packet::Packet;
use crate::sa::switch_tables::SwitchTables;
use crate::subnet::Peer;
use crate::sync::UnpoisonedRw;

/// A user's SM cannot manage this subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UserSmError {
    /// It has several switches (a user's SM manages only the default single switch).
    #[error("a subnet manager in a guest manages only the default single switch (this subnet has several)")]
    Switches,
    /// Ports are attached already: they came up under the fabric's own SM.
    #[error("the subnet manager must be chosen before any node attaches")]
    PortsAttached,
}

impl Fabric {
    /// Hands the subnet to a user's SM (`sm = "guest"`): set before any port attaches.
    pub fn set_guest_sm(&self) -> Result<(), UserSmError> {
        if self.routed() || self.subnet().switches().len() > 1 {
            return Err(UserSmError::Switches);
        }
        let attached = self.inner.ports.read_unpoisoned().iter().flatten().count();
        if attached > 0 {
            return Err(UserSmError::PortsAttached);
        }
        self.inner.guest_sm.store(true, Release);
        Ok(())
    }

    /// Whether a user's SM manages the subnet (see the module's words).
    #[inline]
    pub fn guest_sm(&self) -> bool {
        self.inner.guest_sm.load(Acquire)
    }

    /// What the user's SM set in the switch, under one (for `hcabench fabric`).
    pub fn user_sm_tables(&self) -> Option<SwitchTables> {
        self.user_tables().map(|t| t.read_unpoisoned().clone())
    }

    /// The switch's tables as the user's SM set them, under one.
    pub(super) fn user_tables(&self) -> Option<&RwLock<SwitchTables>> {
        self.guest_sm().then_some(&self.inner.switch_tables)
    }

    /// The link of the HCA port at `lid` went down or came back: its switch port starts
    /// again from INIT, as a real one does, until the SM finds it.
    pub(crate) fn user_sm_link_changed(&self, lid: Lid) {
        if let Some(t) = self.user_tables() {
            if let Some((_, p)) = self.subnet().attachment(lid) {
                t.write_unpoisoned().port_reset(p);
            }
        }
    }

    /// The HCA ports at the switch ports the user's SM set Down: their links retrain, and
    /// each starts again from INIT, as its switch port did. Called with no lock held (the
    /// ports take their devices' locks).
    pub(super) fn retrain_set_down(&self) {
        let Some(t) = self.user_tables() else {
            return;
        };
        let ports = t.write_unpoisoned().take_retrained();
        let subnet = self.subnet();
        for p in ports {
            if let Peer::Hca(lid) = subnet.peer(0, p) {
                if let Some(sink) = self.port(lid) {
                    sink.link_changed(false);
                    sink.link_changed(true);
                }
            }
        }
    }

    /// Forwards a packet that passed its uplink by the user's SM's tables.
    pub(super) fn switch_by_tables(
        &self,
        pkt: Packet,
        hook: Option<&Arc<dyn LinkHook>>,
        more: bool,
    ) {
        let subnet = self.subnet();
        let Some(t) = self.user_tables() else {
            return;
        };
        // Subnet management reaches every port (directed routes are the agents' to walk).
        if pkt.dest_qpn == SMI_QPN && !pkt.is_multicast() {
            let lid = pkt.dlid;
            return self.down_and_deliver(pkt, lid, hook, more);
        }
        let ingress = subnet.attachment(pkt.slid).map(|(_, p)| p);
        let outs: Vec<Lid> = {
            let t = t.read_unpoisoned();
            // A port the SM has not made ACTIVE passes no data (a switch's own LID, port 0,
            // has no link of its own).
            if ingress.is_some_and(|p| !t.active(p)) {
                drop(t);
                return self.bounce(pkt, DropReason::Unrouted);
            }
            let hca = |p: u8| match subnet.peer(0, p) {
                Peer::Hca(lid) if t.active(p) => Some(lid),
                _ => None,
            };
            if pkt.is_multicast() {
                t.mcast_ports(pkt.dlid)
                    .into_iter()
                    .filter_map(hca)
                    .collect()
            } else {
                match t.out_port(pkt.dlid) {
                    // The switch's own LID: its management port (the PMA).
                    Some(0) if subnet.switch_at(pkt.dlid) == Some(0) => vec![pkt.dlid],
                    Some(p) => hca(p).filter(|&l| l == pkt.dlid).into_iter().collect(),
                    None => Vec::new(),
                }
            }
        };
        let Some((&last, rest)) = outs.split_last() else {
            return self.bounce(pkt, DropReason::Unrouted);
        };
        for &lid in rest {
            self.down_and_deliver(pkt.clone(), lid, hook, false);
        }
        self.down_and_deliver(pkt, last, hook, more);
    }
}
