//! A subnet managed by a user's SM (OpenSM in a guest) instead of the fabric's own: the
//! fabric then runs no SM and no SA (SA queries go to wherever the user's SM told the
//! ports its SA is), the HCA ports come up in INIT and wait for that SM, and each switch
//! forwards by the tables the SM set in it (`sa::switch_tables`): a data packet passes only
//! ports the SM made ACTIVE, unicast switch by switch by each one's LFT (over the
//! inter-switch links, counted and judged by the link hook as under the fabric's SM),
//! multicast by each one's MFT, never back out of the port it came in by. A port whose link
//! goes down or comes back starts again from INIT, and its switch sends the SM trap 128.
//! Subnet management packets (QP0) pass whatever the ports' states, as they must for an SM
//! to bring them up.
//!
//! Any subnet of this host's switches takes a user's SM; not one that spans hosts (the
//! other hosts' switches are theirs to program).

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, RwLock};

use super::link::Stage;
use super::remote::Via;
use super::switch_links::Toward;
use super::{DropReason, Fabric, Lid, LinkHook};
use crate::abi::SMI_QPN;
use crate::packet::Packet;
use crate::sa::sm::PERMISSIVE_LID;
use crate::sa::switch_tables::SwitchTables;
use crate::subnet::{Peer, Step, Stop, Subnet};
use crate::sync::UnpoisonedRw;

/// A user's SM cannot manage this subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UserSmError {
    /// It spans hosts (a user's SM manages the switches of one host).
    #[error(
        "a subnet manager in a guest manages the switches of one host (this subnet spans hosts)"
    )]
    Hosts,
    /// Ports are attached already: they came up under the fabric's own SM.
    #[error("the subnet manager must be chosen before any node attaches")]
    PortsAttached,
}

/// What the user's SM set in each switch, by switch index.
pub(crate) type UserTables = RwLock<Vec<SwitchTables>>;

impl Fabric {
    /// Hands the subnet to a user's SM (`sm = "guest"`): set before any port attaches, after
    /// the topology.
    pub fn set_guest_sm(&self) -> Result<(), UserSmError> {
        let subnet = self.subnet();
        if subnet.topology().spans_hosts() {
            return Err(UserSmError::Hosts);
        }
        let attached = self.inner.ports.read_unpoisoned().iter().flatten().count();
        if attached > 0 {
            return Err(UserSmError::PortsAttached);
        }
        let switches = subnet.switches().len().max(1);
        *self.inner.switch_tables.write_unpoisoned() = vec![SwitchTables::default(); switches];
        self.inner.guest_sm.store(true, Release);
        Ok(())
    }

    /// Whether a user's SM manages the subnet (see the module's words).
    #[inline]
    pub fn guest_sm(&self) -> bool {
        self.inner.guest_sm.load(Acquire)
    }

    /// What the user's SM set in switch `sw` (0: the first), under one (for `hcabench
    /// fabric`).
    pub fn user_sm_tables(&self, sw: usize) -> Option<SwitchTables> {
        let t = self.user_tables()?.read_unpoisoned();
        t.get(sw).cloned()
    }

    /// The switches' tables as the user's SM set them, under one.
    pub(super) fn user_tables(&self) -> Option<&UserTables> {
        self.guest_sm().then_some(&self.inner.switch_tables)
    }

    /// The link of the HCA port at `lid` went down or came back: its switch port starts
    /// again from INIT, as a real one does, until the SM finds it.
    pub(crate) fn user_sm_link_changed(&self, lid: Lid) {
        if let Some((sw, p)) = self.subnet().attachment(lid) {
            self.user_sm_ports_changed(&[(sw, p)]);
        }
    }

    /// Inter-switch link `link` went down or came back: the ports at both its ends start
    /// again from INIT.
    pub(super) fn user_sm_switch_link_changed(&self, link: usize) {
        if let Some((a, b)) = self.subnet().link_ends(link) {
            self.user_sm_ports_changed(&[a, b]);
        }
    }

    /// The links at these (switch, port)s went down or came back: each port starts again
    /// from INIT, and each switch whose SM the user's SM told it sends that SM trap 128,
    /// so that it sweeps at once rather than at its next light sweep: one trap for each
    /// change, whatever the SM did with the last (OpenSM may read a port, clear the
    /// switch's PortStateChange later in the same sweep, and so miss a change between the
    /// two that sent no trap of its own).
    fn user_sm_ports_changed(&self, ports: &[(usize, u8)]) {
        let Some(t) = self.user_tables() else {
            return;
        };
        let subnet = self.subnet();
        let mut traps = Vec::new();
        {
            let mut t = t.write_unpoisoned();
            for &(sw, p) in ports {
                if let Some(s) = t.get_mut(sw) {
                    s.port_reset(p);
                    // (Not into a cut: a switch the cut leaves apart from its SM tells it
                    // nothing.)
                    let sm_at = subnet.entry(s.sm_lid()).map(|(at, _)| at);
                    let lid = subnet.switch(sw).map(|s| s.lid);
                    let Some(lid) = lid.filter(|_| sm_at.is_some_and(|at| subnet.joined(sw, at)))
                    else {
                        continue;
                    };
                    if let Some((sm, mkey, tid)) = s.next_trap() {
                        traps.push(crate::sa::sm::trap_128(lid, sm, mkey, tid));
                    }
                }
            }
        }
        if !traps.is_empty() {
            for trap in traps {
                self.enqueue(trap);
            }
            self.inner.reports_waiting.store(true, Relaxed);
        }
    }

    /// The ports the user's SM set Down: their links retrain, and the port at the other
    /// end starts again from INIT too (an HCA's, through its device; a switch's, in its
    /// table). Called with no lock held (the ports take their devices' locks).
    pub(super) fn retrain_set_down(&self) {
        let Some(t) = self.user_tables() else {
            return;
        };
        let subnet = self.subnet();
        let mut hcas = Vec::new();
        {
            let mut t = t.write_unpoisoned();
            let downed: Vec<(usize, u8)> = (t.iter_mut().enumerate())
                .flat_map(|(sw, s)| s.take_retrained().into_iter().map(move |p| (sw, p)))
                .collect();
            for (sw, p) in downed {
                match subnet.peer(sw, p) {
                    Peer::Hca(lid) => hcas.push(lid),
                    Peer::Switch { sw: far, port, .. } => {
                        if let Some(s) = t.get_mut(far) {
                            s.port_reset(port);
                        }
                    }
                    Peer::None => {}
                }
            }
        }
        for lid in hcas {
            if let Some(sink) = self.port(lid) {
                sink.link_changed(false);
                sink.link_changed(true);
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
        // Directed routes are the switches' agents' to walk, hop by hop.
        if pkt.slid == PERMISSIVE_LID || pkt.dlid == PERMISSIVE_LID {
            let lid = pkt.dlid;
            return self.down_and_deliver(pkt, lid, hook, more);
        }
        let subnet = self.subnet();
        let Some((sw, port)) = subnet
            .entry(pkt.slid)
            .filter(|&(sw, _)| subnet.is_local(sw))
        else {
            return self.bounce(pkt, DropReason::Unrouted);
        };
        // A port the SM has not made ACTIVE passes no data (a switch's own LID, port 0,
        // has no link of its own); subnet management passes it (see `table_step`).
        if port != 0 && pkt.dest_qpn != SMI_QPN && !self.table_port_active(sw, port) {
            return self.bounce(pkt, DropReason::Unrouted);
        }
        if pkt.is_multicast() {
            let flood = Flood::new(subnet.switches().len(), sw);
            return self.flood_by_tables(&subnet, pkt, (sw, port), flood, hook);
        }
        let toward = Toward::Lid(pkt.dlid);
        self.walk(&subnet, pkt, (sw, toward), hook, more, Via::HERE);
    }

    /// Whether the user's SM made port `p` of switch `sw` ACTIVE.
    fn table_port_active(&self, sw: usize, p: u8) -> bool {
        (self.user_tables())
            .is_some_and(|t| t.read_unpoisoned().get(sw).is_some_and(|s| s.active(p)))
    }

    /// Where switch `sw` sends unicast `dlid` by the user's SM's LFT (see
    /// [`Subnet::step`]): a port the SM made ACTIVE, into an HCA port or a link whose far
    /// port it made ACTIVE too; anything else is lost. Subnet management (`vl15`: a
    /// LID-routed SMP) follows the LFT through ports in any state but a link down, as it
    /// must for an SM to bring them up.
    pub(super) fn table_step(
        &self,
        t: &UserTables,
        subnet: &Subnet,
        (sw, dlid): (usize, Lid),
        vl15: bool,
    ) -> Step {
        let t = t.read_unpoisoned();
        let Some(here) = t.get(sw) else {
            return Step::Stop(Stop::Lost);
        };
        let passes = |s: Option<&SwitchTables>, p: u8| vl15 || s.is_some_and(|s| s.active(p));
        match here.out_port(dlid) {
            Some(0) if subnet.switch_at(dlid) == Some(sw) => Step::Stop(Stop::Switch(sw)),
            Some(p) if p != 0 && passes(Some(here), p) => match subnet.step_out(sw, dlid, p) {
                Step::Cross { to, .. } if !passes(t.get(to.0), to.1) => Step::Stop(Stop::Lost),
                step => step,
            },
            _ => Step::Stop(Stop::Lost),
        }
    }

    /// A multicast packet at switch `at.0`, come in by port `at.1`: a copy out of every
    /// ACTIVE port its MLID's MFT entry names, but back into the link it came by (a copy
    /// for its own sender's port goes, as the fabric's SM sends it: the HCA takes its own
    /// copy). Each switch floods it once, whatever loops an SM's tables make and however a
    /// hook holds or copies it on the links: a copy crosses into a switch only if it is
    /// the first of the flood's to claim it.
    pub(super) fn flood_by_tables(
        &self,
        subnet: &Subnet,
        pkt: Packet,
        at: (usize, u8),
        flood: Flood,
        hook: Option<&Arc<dyn LinkHook>>,
    ) {
        let Some(t) = self.user_tables() else {
            return;
        };
        let mut queue = std::collections::VecDeque::from([at]);
        let mut hcas = Vec::new();
        while let Some((sw, port_in)) = queue.pop_front() {
            let outs: Vec<(u8, Peer, bool)> = {
                let t = t.read_unpoisoned();
                let Some(here) = t.get(sw) else {
                    continue;
                };
                (here.mcast_ports(pkt.dlid).into_iter())
                    .filter(|&p| p != 0 && here.active(p))
                    .map(|p| {
                        let peer = subnet.peer(sw, p);
                        let far_active = match peer {
                            Peer::Switch { sw: far, port, .. } => {
                                t.get(far).is_some_and(|s| s.active(port))
                            }
                            _ => true,
                        };
                        (p, peer, far_active)
                    })
                    .collect()
            };
            for (p, peer, far_active) in outs {
                match peer {
                    Peer::Hca(lid) => hcas.push(lid),
                    Peer::Switch { sw: far, port, .. } if p != port_in && far_active => {
                        if !flood.claim(far) {
                            continue;
                        }
                        let mut copy = pkt.clone();
                        match subnet.step_out(sw, pkt.dlid, p) {
                            Step::Cross { link, .. } => {
                                self.count_sent(link, &copy);
                                let resume = Stage::Flooded {
                                    at: (far, port),
                                    flood: flood.clone(),
                                };
                                let crossed = self.cross(link, &mut copy, hook, (resume, false));
                                let copies = match crossed {
                                    None => 0,
                                    Some(false) => 1,
                                    // (The hook's copy floods the far switch's ports too;
                                    // the switches beyond it are the first's.)
                                    Some(true) => 2,
                                };
                                for _ in 0..copies {
                                    queue.push_back((far, port));
                                }
                            }
                            Step::Down(link) => {
                                self.count_sent(link, &copy);
                                self.count_discarded(link, &copy);
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
        }
        let Some((&last, rest)) = hcas.split_last() else {
            return self.lose(pkt);
        };
        for &lid in rest {
            self.down_and_deliver(pkt.clone(), lid, hook, false);
        }
        self.down_and_deliver(pkt, last, hook, false);
    }
}

/// The switches a group's packet flooding under a user's SM has reached, shared by all its
/// copies (those a hook holds or copies on a link too).
#[derive(Clone)]
pub(super) struct Flood(Arc<[AtomicBool]>);

impl Flood {
    /// A flood over `switches` switches, from switch `from`.
    fn new(switches: usize, from: usize) -> Flood {
        let f = Flood((0..switches).map(|_| AtomicBool::new(false)).collect());
        f.claim(from);
        f
    }

    /// Whether switch `sw` is the flood's now, and was not before.
    fn claim(&self, sw: usize) -> bool {
        self.0.get(sw).is_some_and(|b| !b.swap(true, Relaxed))
    }
}

impl PartialEq for Flood {
    fn eq(&self, other: &Flood) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Flood {}
