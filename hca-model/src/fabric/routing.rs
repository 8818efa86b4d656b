//! The fabric's subnet: its switches and the routes the SM programs over them (see
//! [`crate::subnet`]), and what a packet's route decides.
//!
//! On the default single switch every port reaches every other, and packets take the
//! queue's fast paths. On a subnet of several switches the fabric is "routed": every
//! packet passes the route check on its way between uplink and downlink (so it takes the
//! path a hook would, without the cut-through), and one whose route crosses a cut
//! inter-switch link, or that a switch's table has no port for, is lost as NoRoute.
//!
//! The SM sweeps when a port joins or leaves the fabric, and one tick after an
//! inter-switch link goes down or comes up (until then the tables of the last sweep
//! stand, and packets routed over a cut link are lost). A sweep that finds an HCA port
//! cut off from the SM, or back, reports its GID out of or into service (traps 65 and
//! 64) to the SA's subscribers.

use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;

use super::remote::Via;
use super::switch_links::Toward;
use super::{DropReason, Fabric, Lid, LinkHook};
use crate::packet::Packet;
use crate::sa::sm::PERMISSIVE_LID;
use crate::sa::{Ports, SM_LID};
use crate::subnet::{Subnet, Topology};
use crate::sync::{Unpoisoned, UnpoisonedRw};

impl Fabric {
    /// Cables the subnet as `topology` (the default: one switch). Set it before guests
    /// attach; the SM sweeps it at once.
    pub fn set_topology(&self, topology: Topology) {
        self.set_topology_on(topology, 0);
    }

    /// The subnet as the SM's last sweep left it, with its links as they are now.
    pub fn subnet(&self) -> Arc<Subnet> {
        self.inner.subnet.read_unpoisoned().clone()
    }

    /// Whether packets follow a multi-switch subnet's tables (see the module's words).
    #[inline]
    pub(super) fn routed(&self) -> bool {
        self.inner.routed.load(Acquire)
    }

    /// Takes inter-switch link `link` down (a cut cable) or brings it back up: packets
    /// routed over it are lost from now, and the SM sweeps at the next tick. None if the
    /// subnet has no such link.
    /// On a subnet that spans hosts, this host's side of the link (see `remote.rs`).
    pub fn set_switch_link(&self, link: usize, up: bool) -> Option<()> {
        self.set_admin_link(link, up)
    }

    /// Takes a packet that passed its uplink on through the switches (a routed fabric's):
    /// to its port on this host, to another host, or lost. Directed-route SMPs (a
    /// permissive LID) find their way hop by hop in the switches' agents (`sa::sm`), which
    /// check each link they cross.
    pub(super) fn route(&self, pkt: Packet, hook: Option<&Arc<dyn LinkHook>>, more: bool) {
        if pkt.slid == PERMISSIVE_LID || pkt.dlid == PERMISSIVE_LID {
            let lid = pkt.dlid;
            return self.down_and_deliver(pkt, lid, hook, more);
        }
        let subnet = self.subnet();
        let Some(at) = subnet
            .entry(pkt.slid)
            .filter(|&(sw, _)| subnet.is_local(sw))
        else {
            return self.bounce(pkt, DropReason::Unrouted);
        };
        if pkt.is_multicast() {
            self.multicast(&subnet, pkt, at, hook, Via::HERE);
        } else {
            let toward = Toward::Lid(pkt.dlid);
            self.walk(&subnet, pkt, (at.0, toward), hook, more, Via::HERE);
        }
    }

    /// The SM saw the port at `lid` come (`here`) or go: the switches' tables follow for
    /// that LID alone (see [`Subnet::sweep_lid`]).
    pub(super) fn sweep_lid(&self, lid: Lid, here: bool) {
        if !self.routed() {
            // The single switch's ports follow the LIDs: a sweep of a few ports.
            self.sweep();
            return;
        }
        let mut s = self.inner.subnet.write_unpoisoned();
        Arc::make_mut(&mut s).sweep_lid(lid, here);
    }

    /// Runs a sweep the last tick left due (a link changed).
    pub(super) fn sweep_if_due(&self) -> bool {
        self.inner.sweep_due.swap(false, Acquire) && self.sweep()
    }

    /// The SM sweeps: reprograms every switch's table over the links up now, and reports
    /// HCA ports it lost or found again to the SA's subscribers. Returns whether it queued
    /// Reports.
    pub(super) fn sweep(&self) -> bool {
        let (lids, subnet) = {
            // The ports read under the subnet's lock: a port that attaches meanwhile routes
            // its LID after this sweep, not before it (where the sweep would undo it).
            let mut s = self.inner.subnet.write_unpoisoned();
            let lids = self.lids();
            let mut swept = Subnet::clone(&s);
            swept.sweep(&lids);
            let swept = Arc::new(swept);
            *s = swept.clone();
            (lids, swept)
        };
        if !self.routed() {
            return false;
        }
        let cut_off: Vec<Lid> = (lids.iter().copied())
            .filter(|&l| !(subnet.reaches(SM_LID, l) && subnet.reaches(l, SM_LID)))
            .collect();
        let (lost, found) = {
            let mut was = self.inner.cut_off.lock_unpoisoned();
            let lost: Vec<Lid> = (cut_off.iter().copied())
                .filter(|l| !was.contains(l))
                .collect();
            let found: Vec<Lid> = (was.iter().copied())
                .filter(|l| !cut_off.contains(l) && lids.contains(l))
                .collect();
            *was = cut_off;
            (lost, found)
        };
        let mut queued = false;
        for (lid, up) in
            (lost.into_iter().map(|l| (l, false))).chain(found.into_iter().map(|l| (l, true)))
        {
            log::info!(
                "subnet: the SM {} the port at LID {lid}",
                if up { "reaches again" } else { "lost" }
            );
            self.report_port(lid, up);
            queued = true;
        }
        if queued {
            self.inner.reports_waiting.store(true, Relaxed);
        }
        queued
    }
}
