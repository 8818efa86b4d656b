//! Links, and what watches them: the hook that may change, drop, copy or hold a packet on
//! each link, the tap that sees every packet once, and the path a packet takes across its
//! uplink and downlink while either is attached.

use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Release},
};
use std::sync::{Arc, RwLock};

use super::{DropReason, Fabric, Lid, PacketSink};
use crate::packet::Packet;
use crate::subnet::SwitchLink;
use crate::sync::{Unpoisoned, UnpoisonedRw};

/// Which way a packet crosses a port's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkDir {
    /// From the port's HCA into the switch.
    Up,
    /// From the switch to the port's HCA.
    Down,
}

/// A link: the port at one end (the switch is at the other) and the direction of travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinkId {
    /// The LID of the port at the link's end.
    pub lid: Lid,
    /// Which way the packet crosses it.
    pub dir: LinkDir,
}

/// The hook's decision for one packet on one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Goes on unchanged (or as the hook changed it).
    Pass,
    /// Lost: its sender hears of it as a drop by the hook.
    Drop,
    /// Goes on, and a copy right behind it.
    Duplicate,
    /// Held for this many nanoseconds of fabric time, then goes on (later packets overtake
    /// it: reordering).
    Delay(u64),
}

/// Where a held packet resumes.
#[derive(Clone, PartialEq, Eq)]
pub(super) enum Stage {
    /// It passed its uplink: route it, then the downlink.
    Routed,
    /// It passed the downlink of the port at this LID: deliver it there (a multicast
    /// packet's copies each go to their own port).
    Arrived(Lid),
    /// It crossed an inter-switch link into this host's switch `sw`: walk it on.
    Entered {
        sw: usize,
        toward: super::switch_links::Toward,
        via: super::remote::Via,
    },
    /// A multicast packet under a user's SM crossed an inter-switch link into switch
    /// `at.0` by port `at.1`: flood it on by the MFTs, as `flood` goes.
    Flooded {
        at: (usize, u8),
        flood: super::user_sm::Flood,
    },
}

/// Sees (and may change, drop, copy or hold) every packet on every link; `now_ns` is the
/// fabric's clock.
pub trait LinkHook: Send + Sync {
    /// Decides what happens to `pkt` on `link` at fabric time `now_ns`; it may change the packet (corrupt it) too.
    fn on_packet(&self, link: LinkId, now_ns: u64, pkt: &mut Packet) -> Verdict;
    /// Whether the link of the port at `lid` is up (its port is ACTIVE) at `now_ns`.
    fn link_up(&self, _lid: Lid, _now_ns: u64) -> bool {
        true
    }
    /// Decides what happens to `pkt` (routed by LID) crossing inter-switch link `link`
    /// that way at `now_ns`, as [`LinkHook::on_packet`] for a node's link. On a subnet
    /// that spans hosts, the host the packet crosses into decides.
    fn on_switch_link(&self, _link: SwitchLink, _now_ns: u64, _pkt: &mut Packet) -> Verdict {
        Verdict::Pass
    }
    /// Whether inter-switch link `link` (its index) is up at `now_ns`: down, it is cut as
    /// `hcabench link down` cuts it (the SM routes round it at its next sweep).
    fn switch_link_up(&self, _link: usize, _now_ns: u64) -> bool {
        true
    }
}

/// Sees every packet once, as its sender put it on its uplink, before any hook: a capture.
pub trait PacketTap: Send + Sync {
    /// Sees `pkt` as its sender put it on its uplink at fabric time `now_ns`.
    fn on_wire(&self, now_ns: u64, pkt: &Packet);
}

/// Something attached to the fabric at run time (a hook, a tap), swapped under traffic.
/// Asked for on every packet, WQE and CQE: when nothing is attached (the usual case) the
/// answer comes from one atomic load, without the lock.
pub(super) struct Attachment<T: ?Sized> {
    slot: RwLock<Option<Arc<T>>>,
    present: AtomicBool,
}

impl<T: ?Sized> Default for Attachment<T> {
    fn default() -> Self {
        Self {
            slot: RwLock::new(None),
            present: AtomicBool::new(false),
        }
    }
}

impl<T: ?Sized> Attachment<T> {
    pub(super) fn set(&self, v: Option<Arc<T>>) {
        let mut slot = self.slot.write_unpoisoned();
        self.present.store(v.is_some(), Release);
        *slot = v;
    }

    /// Whether something is attached (one atomic load).
    pub(super) fn is_set(&self) -> bool {
        self.present.load(Acquire)
    }

    pub(super) fn get(&self) -> Option<Arc<T>> {
        if !self.is_set() {
            return None;
        }
        self.slot.read_unpoisoned().clone()
    }
}

impl Fabric {
    /// Tells ports whose link the hook took down or brought back up (a link-down window, a
    /// live link-down): their port state follows, as a real port's does.
    /// Returns whether it queued Reports of the change for the SA's trap subscribers.
    pub(super) fn follow_links(
        &self,
        ports: &[(Lid, Arc<dyn PacketSink>)],
        hook: Option<&Arc<dyn LinkHook>>,
        now: u64,
    ) -> bool {
        let mut changed = Vec::new();
        {
            let mut down = self.inner.links_down.lock_unpoisoned();
            for (lid, p) in ports {
                let up = hook.is_none_or(|h| h.link_up(*lid, now));
                let was_up = !down.contains(lid);
                if up != was_up {
                    if up {
                        down.retain(|l| l != lid);
                    } else {
                        down.push(*lid);
                    }
                    changed.push((*lid, p.clone(), up));
                }
            }
        }
        let mut reports = Vec::new();
        for (lid, p, up) in changed {
            self.user_sm_link_changed(lid);
            p.link_changed(up);
            let mut sa = self.inner.sa.sa.lock_unpoisoned();
            reports.extend(sa.port_changed(lid, up, self));
        }
        let any = !reports.is_empty();
        for r in reports {
            self.enqueue(r);
        }
        any
    }

    /// Sets (or, with None, removes) the hook that sees every packet on every link; may change under traffic.
    pub fn set_hook(&self, hook: Option<Arc<dyn LinkHook>>) {
        self.inner.hook.set(hook);
    }

    /// Sets (or, with None, removes) the tap that sees every packet once (a capture).
    pub fn set_tap(&self, tap: Option<Arc<dyn PacketTap>>) {
        self.inner.tap.set(tap);
    }

    pub(super) fn hook(&self) -> Option<Arc<dyn LinkHook>> {
        self.inner.hook.get()
    }

    pub(super) fn tap(&self) -> Option<Arc<dyn PacketTap>> {
        self.inner.tap.get()
    }

    /// No hook or tap is attached: nothing sees packets between the queue and their port.
    /// (A multi-switch subnet's route check is on that way too: see `routing.rs`.)
    pub(super) fn unwatched(&self) -> bool {
        !self.inner.hook.is_set() && !self.inner.tap.is_set() && !self.routed() && !self.guest_sm()
    }

    pub(super) fn forward_one(
        &self,
        mut pkt: Packet,
        hook: Option<&Arc<dyn LinkHook>>,
        more: bool,
    ) {
        let up = LinkId {
            lid: pkt.slid,
            dir: LinkDir::Up,
        };
        if let Some(copy) = self.judge(hook, up, &mut pkt, Stage::Routed) {
            let dup = copy.then(|| pkt.clone());
            self.resume(pkt, Stage::Routed, hook, more && dup.is_none());
            if let Some(d) = dup {
                self.resume(d, Stage::Routed, hook, false);
            }
        }
    }

    /// Runs the hook on one link: None if the packet stops here (dropped or held), else
    /// whether a duplicate follows it.
    fn judge(
        &self,
        hook: Option<&Arc<dyn LinkHook>>,
        link: LinkId,
        pkt: &mut Packet,
        resume: Stage,
    ) -> Option<bool> {
        let Some(h) = hook else {
            return Some(false);
        };
        let now = self.now_ns();
        match h.on_packet(link, now, pkt) {
            Verdict::Pass => Some(false),
            Verdict::Duplicate => Some(true),
            Verdict::Drop => {
                self.bounce(std::mem::take(pkt), DropReason::Hook);
                None
            }
            Verdict::Delay(ns) => {
                let due = now.saturating_add(ns);
                let mut held = self.inner.held.lock_unpoisoned();
                held.push((due, resume, std::mem::take(pkt)));
                None
            }
        }
    }

    /// Takes a packet on from `stage`: route and downlink, or delivery.
    pub(super) fn resume(
        &self,
        pkt: Packet,
        stage: Stage,
        hook: Option<&Arc<dyn LinkHook>>,
        more: bool,
    ) {
        match stage {
            Stage::Arrived(lid) => match self.port(lid) {
                Some(dst) => self.deliver(&dst, pkt, false),
                None => self.bounce(pkt, DropReason::NoRoute),
            },
            Stage::Entered { sw, toward, via } => {
                let subnet = self.subnet();
                self.walk_from(&subnet, pkt, (sw, toward), hook, via);
            }
            Stage::Flooded { at, flood } => {
                let subnet = self.subnet();
                self.flood_by_tables(&subnet, pkt, at, flood, hook);
            }
            Stage::Routed if self.guest_sm() => self.switch_by_tables(pkt, hook, more),
            Stage::Routed if self.routed() => self.route(pkt, hook, more),
            Stage::Routed if pkt.is_multicast() => {
                // To every member port the SA lists, the sender's own included.
                let members = self.with_sa(|sa| {
                    sa.group_by_mlid(pkt.dlid)
                        .map(|g| g.members.keys().copied().collect::<Vec<u64>>())
                        .unwrap_or_default()
                });
                let lids: Vec<Lid> = members
                    .into_iter()
                    .filter_map(|guid| crate::sa::Ports::lid_of(self, guid))
                    .collect();
                if lids.is_empty() {
                    return self.bounce(pkt, DropReason::NoRoute);
                }
                for lid in lids {
                    self.down_and_deliver(pkt.clone(), lid, hook, false);
                }
            }
            Stage::Routed => {
                let lid = pkt.dlid;
                self.down_and_deliver(pkt, lid, hook, more);
            }
        }
    }

    /// The downlink of the port at `lid`, then delivery there.
    pub(super) fn down_and_deliver(
        &self,
        mut pkt: Packet,
        lid: Lid,
        hook: Option<&Arc<dyn LinkHook>>,
        more: bool,
    ) {
        let Some(dst) = self.port(lid) else {
            return self.bounce(pkt, DropReason::NoRoute);
        };
        let down = LinkId {
            lid,
            dir: LinkDir::Down,
        };
        match self.judge(hook, down, &mut pkt, Stage::Arrived(lid)) {
            None => return,
            Some(true) => {
                self.deliver(&dst, pkt.clone(), false);
                return self.deliver(&dst, pkt, false);
            }
            Some(false) => {}
        }
        self.deliver(&dst, pkt, more);
    }
}
