//! Inter-switch links, watched as a node's link is: counters each way (each switch's PMA
//! shows them at the link's port), the link hook's decisions on every packet routed by
//! LID across one (dropped, duplicated, corrupted, delayed), and the hook's down windows,
//! which cut the link as `hcabench link down` does.
//!
//! A packet's way through this host's switches is walked one switch at a time
//! ([`Subnet::step`]), so that each link it crosses counts it and may keep it. A link to
//! another host is counted on each side: sent by the host it leaves, received (and judged
//! by the hook) by the host it enters, so one fault plan loaded on every host judges each
//! packet once. Directed-route SMPs find their way in the switches' agents and are counted
//! only where they cross hosts; the hook leaves them alone (the SM's sweep is not a test
//! subject here).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::link::Stage;
use super::remote::Via;
use super::{DropReason, Fabric, Lid, LinkHook, Verdict};
use crate::packet::Packet;
use crate::subnet::{Step, Stop, Subnet, SwitchLink};
use crate::sync::{Unpoisoned, UnpoisonedRw};

/// Where a packet's walk through this host's switches heads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Toward {
    /// The port or switch at this LID: a unicast packet's DLID, or the SM's switch for a
    /// group's packet on its way to the SM's host (which holds the groups).
    Lid(Lid),
    /// A group's copies for these members (one member: a copy for its port; several:
    /// all beyond one link, to another switch of this host or to another host, parted
    /// again at the switch it reaches).
    Members(Arc<[Lid]>),
}

impl Toward {
    /// The LID the walk follows the tables to.
    fn lid(&self) -> Lid {
        match self {
            Toward::Lid(l) => *l,
            Toward::Members(m) => m.first().copied().unwrap_or(0),
        }
    }

    /// The members a frame to another host names (none: it routes by its DLID there).
    fn members(&self) -> &[Lid] {
        match self {
            Toward::Lid(_) => &[],
            Toward::Members(m) => m,
        }
    }
}

/// One way of an inter-switch link, as this host saw it: packets (and their octets) the
/// switch at its start sent in, those the switch at its end took, and those lost between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchLinkStats {
    /// Packets sent into the link (MTU packets: a train counts each).
    pub xmit_pkts: u64,
    /// Their octets, headers included (as PortXmitData counts them, times 4).
    pub xmit_bytes: u64,
    /// Of `xmit_pkts`, those for a multicast group.
    pub mcast_xmit_pkts: u64,
    /// Packets that came out at the far end.
    pub rcv_pkts: u64,
    /// Their octets.
    pub rcv_bytes: u64,
    /// Of `rcv_pkts`, those for a multicast group.
    pub mcast_rcv_pkts: u64,
    /// Packets lost on the way: dropped by the hook, or sent into it while it was down.
    /// On a link between hosts, the host the way leads into counts what its hook
    /// dropped, and the host it leaves what went into it while down.
    pub discards: u64,
    /// How many times the link went down (both ways count each).
    pub downed: u64,
}

#[derive(Default)]
struct Way {
    xmit_pkts: AtomicU64,
    xmit_bytes: AtomicU64,
    mcast_xmit_pkts: AtomicU64,
    rcv_pkts: AtomicU64,
    rcv_bytes: AtomicU64,
    mcast_rcv_pkts: AtomicU64,
    discards: AtomicU64,
}

/// The counters of one link: [back, forward], and its downs.
#[derive(Default)]
pub(super) struct Trunk {
    ways: [Way; 2],
    downed: AtomicU64,
}

/// Fresh counters for `links` links.
pub(super) fn trunks(links: usize) -> Vec<Trunk> {
    (0..links).map(|_| Trunk::default()).collect()
}

impl Fabric {
    /// What crossed inter-switch link `link` that way, as this host counted it (see the
    /// module's words); None if the subnet has no such link.
    pub fn switch_link_stats(&self, link: SwitchLink) -> Option<SwitchLinkStats> {
        let trunks = self.inner.trunks.read_unpoisoned();
        let t = trunks.get(link.link)?;
        let w = t.ways.get(usize::from(link.forward))?;
        Some(SwitchLinkStats {
            xmit_pkts: w.xmit_pkts.load(Relaxed),
            xmit_bytes: w.xmit_bytes.load(Relaxed),
            mcast_xmit_pkts: w.mcast_xmit_pkts.load(Relaxed),
            rcv_pkts: w.rcv_pkts.load(Relaxed),
            rcv_bytes: w.rcv_bytes.load(Relaxed),
            mcast_rcv_pkts: w.mcast_rcv_pkts.load(Relaxed),
            discards: w.discards.load(Relaxed),
            downed: t.downed.load(Relaxed),
        })
    }

    fn with_way(&self, link: SwitchLink, f: impl FnOnce(&Way)) {
        let trunks = self.inner.trunks.read_unpoisoned();
        if let Some(w) = trunks
            .get(link.link)
            .and_then(|t| t.ways.get(usize::from(link.forward)))
        {
            f(w);
        }
    }

    /// `pkt` goes into `link` that way.
    pub(super) fn count_sent(&self, link: SwitchLink, pkt: &Packet) {
        let (n, bytes, mc) = (u64::from(pkt.span()), pkt.wire_bytes(), pkt.is_multicast());
        self.with_way(link, |w| {
            w.xmit_pkts.fetch_add(n, Relaxed);
            w.xmit_bytes.fetch_add(bytes, Relaxed);
            if mc {
                w.mcast_xmit_pkts.fetch_add(n, Relaxed);
            }
        });
    }

    /// `pkt` came out of `link` at its far end.
    pub(super) fn count_received(&self, link: SwitchLink, pkt: &Packet) {
        let (n, bytes, mc) = (u64::from(pkt.span()), pkt.wire_bytes(), pkt.is_multicast());
        self.with_way(link, |w| {
            w.rcv_pkts.fetch_add(n, Relaxed);
            w.rcv_bytes.fetch_add(bytes, Relaxed);
            if mc {
                w.mcast_rcv_pkts.fetch_add(n, Relaxed);
            }
        });
    }

    /// `pkt` was lost in `link`.
    pub(super) fn count_discarded(&self, link: SwitchLink, pkt: &Packet) {
        let n = u64::from(pkt.span());
        self.with_way(link, |w| {
            w.discards.fetch_add(n, Relaxed);
        });
    }

    /// Link `link` went down.
    pub(super) fn count_downed(&self, link: usize) {
        if let Some(t) = self.inner.trunks.read_unpoisoned().get(link) {
            t.downed.fetch_add(1, Relaxed);
        }
    }

    /// `pkt` comes out of `link` (sent in, and counted so, by whoever sent it): the hook
    /// decides, and the counters follow. None if it stops here (lost, or held to resume
    /// at `resume`), else whether a duplicate follows it. A copy the hook made earlier
    /// (`copy`) is not copied again: copies of copies on every crossing would grow
    /// without bound (the plan's log counts that one duplicated all the same).
    pub(super) fn cross(
        &self,
        link: SwitchLink,
        pkt: &mut Packet,
        hook: Option<&Arc<dyn LinkHook>>,
        (resume, copy): (Stage, bool),
    ) -> Option<bool> {
        let verdict = match hook {
            Some(h) if pkt.dlid != crate::sa::sm::PERMISSIVE_LID => {
                h.on_switch_link(link, self.now_ns(), pkt)
            }
            _ => Verdict::Pass,
        };
        match verdict {
            Verdict::Pass => {
                self.count_received(link, pkt);
                Some(false)
            }
            Verdict::Duplicate if copy => {
                self.count_received(link, pkt);
                Some(false)
            }
            Verdict::Duplicate => {
                self.count_received(link, pkt);
                self.count_received(link, pkt);
                Some(true)
            }
            Verdict::Drop => {
                self.count_discarded(link, pkt);
                // As on a node's link, the sender's transport finds out by its timer.
                self.inner.stats.hook_dropped.fetch_add(1, Relaxed);
                None
            }
            Verdict::Delay(ns) => {
                self.count_received(link, pkt);
                let due = self.now_ns().saturating_add(ns);
                let mut held = self.inner.held.lock_unpoisoned();
                held.push((due, resume, std::mem::take(pkt)));
                None
            }
        }
    }

    /// Walks a packet on from local switch `sw` toward `toward`, link by link (see the
    /// module's words). A group's copies for several members (all leaving this host by
    /// one link) go toward the first, and leave as one frame naming them all.
    pub(super) fn walk(
        &self,
        subnet: &Subnet,
        mut pkt: Packet,
        (mut sw, toward): (usize, Toward),
        hook: Option<&Arc<dyn LinkHook>>,
        more: bool,
        mut via: Via,
    ) {
        let target = toward.lid();
        let tables = self.user_tables();
        let limit = u32::try_from(subnet.switches().len()).unwrap_or(u32::MAX);
        let start = via.steps;
        while via.steps <= limit {
            // A group's copy for several members, one switch on: their ways may part here.
            if let Toward::Members(m) = &toward {
                if m.len() > 1 && via.steps > start {
                    return self.fan_out(subnet, pkt, sw, m, hook, via);
                }
            }
            let step = match tables {
                Some(t) => {
                    let vl15 = pkt.dest_qpn == crate::abi::SMI_QPN;
                    self.table_step(t, subnet, (sw, target), vl15)
                }
                None => subnet.step(sw, target),
            };
            match step {
                Step::Stop(Stop::Hca(l)) => {
                    if let Toward::Members(m) = &toward {
                        if m.len() > 1 {
                            // (Only were the tables to lead several members' copies to
                            // one port: they part here.)
                            return self.fan_out(subnet, pkt, sw, m, hook, via);
                        }
                    }
                    return self.down_and_deliver(pkt, l, hook, more);
                }
                Step::Stop(Stop::Switch(_)) => {
                    return self.down_and_deliver(pkt, target, hook, more)
                }
                Step::Stop(Stop::Remote { link }) => {
                    return self.send_remote(subnet, link, toward.members(), pkt, via)
                }
                Step::Stop(Stop::Lost) if !pkt.is_multicast() && self.port_gone(subnet, target) => {
                    return if via.is_remote() {
                        // Back toward its sender from here, over the link it came by.
                        self.refuse_from(subnet, sw, pkt, via)
                    } else {
                        self.bounce(pkt, DropReason::NoRoute)
                    };
                }
                Step::Stop(Stop::Lost) if via.is_remote() || pkt.is_multicast() => {
                    return self.lose(pkt)
                }
                Step::Stop(Stop::Lost) => return self.bounce(pkt, DropReason::Unrouted),
                Step::Down(link) => {
                    // Sent into a link that is down (cut, or its far host gone): lost
                    // there, as on the way lost where no table leads on.
                    self.count_sent(link, &pkt);
                    self.count_discarded(link, &pkt);
                    return if via.is_remote() || pkt.is_multicast() {
                        self.lose(pkt)
                    } else {
                        self.bounce(pkt, DropReason::Unrouted)
                    };
                }
                Step::Cross { link, to } => {
                    via.steps += 1;
                    self.count_sent(link, &pkt);
                    let resume = Stage::Entered {
                        sw: to.0,
                        toward: toward.clone(),
                        via,
                    };
                    match self.cross(link, &mut pkt, hook, (resume, via.copy)) {
                        None => return,
                        Some(true) => {
                            // (From where it entered: a copy for several members parts
                            // there, as the first does below.)
                            let dup = (to.0, toward.clone());
                            self.walk_from(subnet, pkt.clone(), dup, hook, via.copied())
                        }
                        Some(false) => {}
                    }
                    sw = to.0;
                }
            }
        }
        self.lose(pkt)
    }

    /// Whether no port has `lid` any more though the cabling puts one there (its node
    /// killed, its HCA unplugged): the SM's sweep took it out of the tables, and a packet
    /// for it is refused at once (NoRoute: its sender's RC fails without waiting out its
    /// retries, here or on another host), as on one switch. A port on a host not heard
    /// from is not gone but cut off, as behind a cut link: the host may be back within
    /// its peers' retries.
    fn port_gone(&self, subnet: &Subnet, lid: Lid) -> bool {
        if lid > crate::subnet::MAX_HCA_LID {
            return false; // A switch is cut off, never gone.
        }
        match subnet.host_of_lid(lid) {
            Some(h) if h == subnet.here() => self.port(lid).is_none(),
            Some(h) => self.host_heard(h) && self.remote_port(lid).is_none(),
            None => false,
        }
    }

    /// A group's packet at local switch `sw`, for `members`: one copy out of each port
    /// the members' ways leave by, as a switch's multicast table sends it: a copy to each
    /// member's port here, one over each link to another switch of this host for the
    /// members beyond it (which parts them again there), and one frame over each link to
    /// another host for the members beyond that.
    pub(super) fn fan_out(
        &self,
        subnet: &Subnet,
        pkt: Packet,
        sw: usize,
        members: &[Lid],
        hook: Option<&Arc<dyn LinkHook>>,
        via: Via,
    ) {
        let mut beyond: BTreeMap<usize, Vec<Lid>> = BTreeMap::new();
        let mut across: BTreeMap<usize, Vec<Lid>> = BTreeMap::new();
        // (Only under the fabric's SM: its tables part the members.)
        debug_assert!(self.user_tables().is_none());
        for &lid in members {
            match subnet.step(sw, lid) {
                Step::Stop(Stop::Remote { link }) => beyond.entry(link).or_default().push(lid),
                // Into a link up or down: one copy for all beyond it (a link down counts
                // it lost once).
                Step::Cross { link, .. } | Step::Down(link) => {
                    across.entry(link.link).or_default().push(lid)
                }
                // Here, or lost on the way (a link down counts it): a copy of its own.
                _ => {
                    let one = (sw, Toward::Members(Arc::from([lid])));
                    self.walk(subnet, pkt.clone(), one, hook, false, via);
                }
            }
        }
        for lids in across.values() {
            let toward = (sw, Toward::Members(Arc::from(lids.as_slice())));
            self.walk(subnet, pkt.clone(), toward, hook, false, via);
        }
        for lids in beyond.values() {
            for some in lids.chunks(crate::wire::MAX_MEMBERS) {
                let toward = (sw, Toward::Members(Arc::from(some)));
                self.walk(subnet, pkt.clone(), toward, hook, false, via);
            }
        }
    }

    /// Follows the hook's down windows on the links at this host's switches: a link the
    /// hook has down is cut (and restored) as `hcabench link` does. Whether any changed.
    pub(super) fn follow_switch_links(&self, hook: Option<&Arc<dyn LinkHook>>, now: u64) -> bool {
        if !self.routed() {
            return false;
        }
        let subnet = self.subnet();
        let changed = {
            let mut h = self.inner.hosts.lock_unpoisoned();
            if hook.is_none() && !h.fault_down.iter().any(|&d| d) {
                return false;
            }
            let mut changed = false;
            for (k, down) in h.fault_down.iter_mut().enumerate() {
                let here = subnet
                    .link_ends(k)
                    .is_some_and(|((a, _), (b, _))| subnet.is_local(a) || subnet.is_local(b));
                let want = here && hook.is_some_and(|h| !h.switch_link_up(k, now));
                if *down != want {
                    log::info!(
                        "subnet: the fault plan takes link {} {}",
                        k + 1,
                        if want { "down" } else { "back up" }
                    );
                    *down = want;
                    changed = true;
                }
            }
            changed
        };
        changed && self.settle_links()
    }
}
