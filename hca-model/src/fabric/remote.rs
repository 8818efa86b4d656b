//! A subnet that spans hosts: several hcabench processes, each with some of the subnet's
//! switches (see [`Topology::on_hosts`]), joined by inter-switch links that cross the
//! network as datagrams ([`crate::wire`]). The host with the first switch runs the SM and
//! the SA.
//!
//! Every host keeps the whole topology and computes min-hop tables itself from the same
//! view of the links (where several ports lead equally near, hosts may pick differently:
//! every pick is one hop nearer, so no way loops once the views agree; a hop count in
//! each frame bounds the moments they do not). Each host announces, several times a
//! second, its side of the links at its switches and the HCA ports it has (what an SM's
//! sweep would learn from their SMAs), and a link is up where both its ends' hosts have
//! it up and are heard from. A packet walks this host's switches; where its way leaves
//! over an inter-host link it goes to the host at the far end, which walks it on from the
//! switch and port the link reaches there. Multicast goes to the SM's host, which holds
//! the groups, and comes back as one frame over each link toward members beyond it, naming
//! them (each host on the way delivers to its own members and sends one frame on per link,
//! as switches' multicast tables send one copy out of each port).
//!
//! What a peer host sends is checked: a packet may come only over a link that host ends,
//! an announcement may name only ports and links at that host's switches; anything else
//! is refused and counted.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::switch_links::Toward;
use super::{DropReason, Fabric, Lid, LinkHook};
use crate::packet::Packet;
use crate::sa::sm::{Out, PERMISSIVE_LID};
use crate::sa::{Ports, SM_LID};
use crate::subnet::{Stop, Subnet, SwitchLink, Topology};
use crate::sync::{Unpoisoned, UnpoisonedRw};
use crate::wire::{self, Frame, PortAd, WireError};

/// Where a host's datagrams go: the network between hcabench hosts.
pub trait RemoteHosts: Send + Sync {
    /// Sends datagram `frame` to host `host`. Best effort, as UDP: a datagram lost is a
    /// packet a lossy link lost.
    fn send(&self, host: u16, frame: Vec<u8>);
}

/// Why a datagram from a peer host was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum RemoteError {
    /// Not a frame.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A packet over a link that does not join the sender's switch to this host's.
    #[error("host {host} sent a packet over link {link}, which does not join it to this host")]
    NotItsLink {
        /// The sender.
        host: u16,
        /// The link it named.
        link: u16,
    },
    /// A packet whose source, or whose members, cannot have come from the sender: a
    /// port or switch of this host, or members named for a unicast packet or that are no
    /// HCA ports.
    #[error(
        "host {host} sent a packet from LID {slid} (to {dlid}, {members} members named), \
         which it cannot have"
    )]
    Spoofed {
        /// The sender.
        host: u16,
        /// What the packet said.
        slid: Lid,
        /// See `slid`.
        dlid: Lid,
        /// How many members the frame named.
        members: usize,
    },
    /// An announcement from a host for another, or of a port or link not at its switches.
    #[error("host {host} announced {what}, which is not its own")]
    NotItsOwn {
        /// The sender.
        host: u16,
        /// What it announced.
        what: String,
    },
}

/// What this host knows of the others.
#[derive(Default)]
pub(super) struct Hosts {
    /// By host index: heard from lately (this host counts as alive).
    alive: BTreeMap<u16, bool>,
    /// This host's side of each link (by index): up unless cut here.
    admin_up: Vec<bool>,
    /// Links at this host's switches that the fault hook has down (`switch_links.rs`).
    pub(super) fault_down: Vec<bool>,
    /// (link, host): that host's side of a link at its switches, as it last announced.
    reported: BTreeMap<(u16, u16), bool>,
    /// Announcements sent.
    seq: u32,
    /// By host: the sequence number of its last announcement taken.
    heard_seq: BTreeMap<u16, u32>,
}

/// Where a packet on its way through this host came from: another host (the link it
/// arrived by, and the inter-host links it had crossed), or this host's own port.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Via {
    hops: u8,
    link: Option<usize>,
    /// Inter-switch links crossed on this host so far: a walk ends past as many as the
    /// subnet has switches, however often a hook held it (tables that loop, a user's SM's).
    pub(super) steps: u32,
    /// A copy the link hook made: its walk makes no copies of its own.
    pub(super) copy: bool,
}

impl Hosts {
    /// Whether this host has its side of link `k` up: not cut, not down by the hook.
    fn side_up(&self, k: usize) -> bool {
        self.admin_up.get(k) == Some(&true) && self.fault_down.get(k) != Some(&true)
    }
}

impl Via {
    /// Whether it came from another host.
    pub(super) fn is_remote(&self) -> bool {
        self.link.is_some()
    }

    /// Sent from a port or switch of this host.
    pub(super) const HERE: Via = Via {
        hops: 0,
        link: None,
        steps: 0,
        copy: false,
    };

    /// The same, for a copy the link hook made (see `copy`).
    pub(super) fn copied(self) -> Via {
        Via { copy: true, ..self }
    }

    /// Come in over inter-host link `link`, past `hops` of them.
    fn across(link: usize, hops: u8) -> Via {
        Via {
            hops,
            link: Some(link),
            ..Via::HERE
        }
    }
}

/// Inter-host traffic counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Packet frames sent and received.
    pub frames_out: u64,
    /// See `frames_out`.
    pub frames_in: u64,
    /// Their bytes.
    pub bytes_out: u64,
    /// See `bytes_out`.
    pub bytes_in: u64,
    /// Datagrams refused (malformed, or not the sender's to send).
    pub refused: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    frames_out: std::sync::atomic::AtomicU64,
    frames_in: std::sync::atomic::AtomicU64,
    bytes_out: std::sync::atomic::AtomicU64,
    bytes_in: std::sync::atomic::AtomicU64,
    refused: std::sync::atomic::AtomicU64,
}

impl Fabric {
    /// Cables the subnet as `topology`, seen from host `here` (its switches are this
    /// fabric's; see the module's words). Set it before guests attach.
    pub fn set_topology_on(&self, topology: Topology, here: u16) {
        let links = topology.links().len();
        let routed = !topology.is_single();
        let subnet = Subnet::new_on(topology, here, &self.lids());
        if self.guest_sm() {
            // (Cabled again under a user's SM: its switches start with nothing set.)
            let n = subnet.switches().len().max(1);
            *self.inner.switch_tables.write_unpoisoned() = vec![Default::default(); n];
        }
        *self.inner.subnet.write_unpoisoned() = Arc::new(subnet);
        {
            let mut h = self.inner.hosts.lock_unpoisoned();
            *h = Hosts {
                admin_up: vec![true; links],
                fault_down: vec![false; links],
                ..Hosts::default()
            };
            h.alive.insert(here, true);
        }
        self.inner.routed.store(routed, Relaxed);
        self.settle_links();
        // (Links to hosts not heard from yet start down: no down to count.)
        *self.inner.trunks.write_unpoisoned() = super::switch_links::trunks(links);
        self.sweep();
    }

    /// Sets (or, with None, removes) where datagrams for other hosts go.
    pub fn set_remote(&self, remote: Option<Arc<dyn RemoteHosts>>) {
        self.inner.remote.set(remote);
    }

    /// The inter-host counters so far.
    pub fn remote_stats(&self) -> RemoteStats {
        let c = &self.inner.remote_counters;
        RemoteStats {
            frames_out: c.frames_out.load(Relaxed),
            frames_in: c.frames_in.load(Relaxed),
            bytes_out: c.bytes_out.load(Relaxed),
            bytes_in: c.bytes_in.load(Relaxed),
            refused: c.refused.load(Relaxed),
        }
    }

    /// This host's side of inter-switch link `link`: cut here, or restored. None if the
    /// subnet has no such link.
    pub(super) fn set_admin_link(&self, link: usize, up: bool) -> Option<()> {
        {
            let mut h = self.inner.hosts.lock_unpoisoned();
            *h.admin_up.get_mut(link)? = up;
        }
        self.settle_links();
        Some(())
    }

    /// Whether host `host` is heard from (the caller times the announcements out): a host
    /// gone takes its ports and the links to it down.
    pub fn set_host_alive(&self, host: u16, alive: bool) {
        let here = self.subnet().here();
        if host == here {
            return;
        }
        let changed = {
            let mut h = self.inner.hosts.lock_unpoisoned();
            if !alive {
                // Whatever it says next starts afresh (it may have started again).
                h.heard_seq.remove(&host);
            }
            h.alive.insert(host, alive) != Some(alive)
        };
        if !changed {
            return;
        }
        log::info!(
            "subnet: host {host} {}",
            if alive { "joined" } else { "is gone" }
        );
        if !alive {
            // Reported while the SA still knows their GIDs, then forgotten.
            let gone: Vec<Lid> = (self.inner.remote_ports.read_unpoisoned().iter())
                .filter(|(_, (h, _))| *h == host)
                .map(|(&l, _)| l)
                .collect();
            for &l in &gone {
                self.report_port(l, false);
            }
            let mut ports = self.inner.remote_ports.write_unpoisoned();
            let mut guids = self.inner.guids.write_unpoisoned();
            for l in &gone {
                if let Some((_, p)) = ports.remove(l) {
                    guids.remove(&p.guid);
                }
            }
        }
        self.settle_links();
        self.inner.sweep_due.store(true, Relaxed);
    }

    /// The announcement this host sends the others (see the module's words).
    pub fn announcement(&self) -> Vec<u8> {
        let subnet = self.subnet();
        let here = subnet.here();
        let links: Vec<(u16, bool)> = {
            let mut h = self.inner.hosts.lock_unpoisoned();
            h.seq = h.seq.wrapping_add(1);
            (0..subnet.topology().links().len())
                .filter(|&k| ends_on(&subnet, k, here))
                .map(|k| (k as u16, h.side_up(k)))
                .collect()
        };
        let seq = self.inner.hosts.lock_unpoisoned().seq;
        let n_ports = self.local_lids().len();
        if n_ports > wire::MAX_ANNOUNCED {
            log::error!(
                "subnet: this host has {n_ports} ports, an announcement carries {}: the \
                 others will not hear of them",
                wire::MAX_ANNOUNCED
            );
        }
        let ports: Vec<PortAd> = (self.local_lids().into_iter())
            .filter_map(|lid| {
                let p = self.port(lid)?;
                Some(PortAd {
                    lid,
                    guid: p.port_guid()?,
                    caps: p.capability_mask(),
                    up: Ports::link_up(self, lid),
                })
            })
            .collect();
        let frame = Frame::Announce {
            host: here,
            seq,
            links,
            ports,
        };
        wire::encode(&frame).unwrap_or_default()
    }

    /// Takes datagram `d` from host `from` (the caller knows the sender by its address):
    /// a packet walks on from where its link reaches this host; an announcement updates
    /// what this host knows of the sender.
    pub fn receive(&self, from: u16, d: &[u8]) -> Result<(), RemoteError> {
        let result = match wire::decode(d) {
            Ok(Frame::Packet {
                link,
                hops,
                members,
                bounce,
                pkt,
            }) => self.arrive(from, (link, hops, members, bounce), pkt, d.len()),
            Ok(Frame::Announce {
                host,
                seq,
                links,
                ports,
            }) => self.heard(from, host, seq, &links, &ports),
            Err(e) => Err(e.into()),
        };
        if result.is_err() {
            self.inner.remote_counters.refused.fetch_add(1, Relaxed);
        }
        // What the deliveries made here queued (ACKs, the SA's answers): the receiving
        // thread moves its own, not every lane's.
        self.pump_own();
        result
    }

    /// A packet frame from host `from`: (its link, hops, members, bounce).
    fn arrive(
        &self,
        from: u16,
        (link, hops, members, bounce): (u16, u8, Vec<Lid>, bool),
        pkt: Packet,
        bytes: usize,
    ) -> Result<(), RemoteError> {
        let subnet = self.subnet();
        let refuse = RemoteError::NotItsLink { host: from, link };
        let ((a, pa), (b, pb)) = subnet.link_ends(usize::from(link)).ok_or(refuse.clone())?;
        let host = |sw| subnet.topology().host_of(sw);
        let at = if subnet.is_local(a) && host(b) == from && from != subnet.here() {
            (a, pa)
        } else if subnet.is_local(b) && host(a) == from && from != subnet.here() {
            (b, pb)
        } else {
            return Err(refuse);
        };
        if bounce {
            return self.bounced_back(&subnet, from, at, (link, hops), pkt, bytes);
        }
        // A packet from one of this host's ports or switches never comes from outside,
        // and only a group's packet names members (HCA ports).
        let here_lid = subnet.host_of_lid(pkt.slid) == Some(subnet.here())
            || subnet
                .switch_at(pkt.slid)
                .is_some_and(|sw| subnet.is_local(sw));
        // (But a group's packet from a port here comes back from the SM's host, or
        // through the hosts between, as copies for the members here: over the link
        // toward the SM's switch, never to the SM's host itself.)
        let toward_sm = matches!(
            subnet.next_stop_from(at.0, at.1, SM_LID),
            Stop::Remote { link: l } if l == usize::from(link)
        );
        let sm_copy = pkt.is_multicast()
            && !subnet.is_local(0)
            && (from == subnet.topology().host_of(0) || (!members.is_empty() && toward_sm));
        // Members are HCA ports of the subnet beyond this link, not back over it.
        let bad_members = !members.is_empty()
            && (!pkt.is_multicast()
                || (members.iter()).any(|&m| {
                    m == 0
                        || m > crate::subnet::MAX_HCA_LID
                        || subnet.attachment(m).is_none()
                        || subnet.next_stop_from(at.0, at.1, m)
                            == (Stop::Remote {
                                link: usize::from(link),
                            })
                }));
        if (here_lid && !sm_copy) || bad_members {
            return Err(RemoteError::Spoofed {
                host: from,
                slid: pkt.slid,
                dlid: pkt.dlid,
                members: members.len(),
            });
        }
        let c = &self.inner.remote_counters;
        c.frames_in.fetch_add(1, Relaxed);
        c.bytes_in.fetch_add(bytes as u64, Relaxed);
        let way = Self::way_in(&subnet, usize::from(link), at.0);
        if subnet.link_up(usize::from(link)) != Some(true) {
            self.count_discarded(way, &pkt);
            self.lose(pkt);
            return Ok(());
        }
        let via = Via::across(usize::from(link), hops);
        let hook = self.hook();
        let hook = hook.as_ref();
        let mut pkt = pkt;
        // This host's capture sees what came from the others too, once each, before the
        // hook (as it sees its own ports' packets); a group's packet once per frame that
        // brings it (but one its own port sent, which it saw leave).
        if let Some(t) = self.tap().filter(|_| !(here_lid && sm_copy)) {
            t.on_wire(self.now_ns(), &pkt);
        }
        // Where it goes on from: a group's copies to the members named, a group's packet
        // on to the SM's host or its members, anything else toward its DLID.
        let toward = if members.is_empty() {
            Toward::Lid(pkt.dlid)
        } else {
            Toward::Members(members.into())
        };
        let resume = super::link::Stage::Entered {
            sw: at.0,
            toward: toward.clone(),
            via,
        };
        match self.cross(way, &mut pkt, hook, (resume, false)) {
            None => return Ok(()),
            Some(true) => {
                let dup = (at.0, toward.clone());
                self.walk_from(&subnet, pkt.clone(), dup, hook, via.copied())
            }
            Some(false) => {}
        }
        if pkt.dlid == PERMISSIVE_LID {
            // A directed route going on through this host's switches.
            let out = {
                let mut sa = self.inner.sa.sa.lock_unpoisoned();
                sa.answer_smp(&pkt, Some(at), self)
            };
            self.smp_out(out);
        } else {
            self.walk_from(&subnet, pkt, (at.0, toward), hook, via);
        }
        Ok(())
    }

    /// Which way a packet that came over `link` into local switch `sw` crossed it.
    fn way_in(subnet: &Subnet, link: usize, sw: usize) -> SwitchLink {
        let forward = (subnet.topology().links().get(link)).is_some_and(|&(a, _)| a != sw);
        SwitchLink { link, forward }
    }

    /// Walks a packet that entered local switch `sw` on (see [`Fabric::walk`]): a
    /// group's packet (toward its MLID) goes to [`Fabric::multicast`], a group's copies
    /// for several members part at `sw` ([`Fabric::fan_out`]).
    pub(super) fn walk_from(
        &self,
        subnet: &Subnet,
        pkt: Packet,
        (sw, toward): (usize, Toward),
        hook: Option<&Arc<dyn LinkHook>>,
        via: Via,
    ) {
        match toward {
            Toward::Lid(l) if pkt.is_multicast() && l == pkt.dlid => {
                self.multicast(subnet, pkt, (sw, 0), hook, via)
            }
            Toward::Members(m) if m.len() > 1 => self.fan_out(subnet, pkt, sw, &m, hook, via),
            toward => self.walk(subnet, pkt, (sw, toward), hook, false, via),
        }
    }

    /// A multicast packet that entered local switch `at.0` by `at.1`: on the SM's host, a
    /// copy to every member port the SA lists (this host's delivered, the others' sent
    /// toward them, each for its member); elsewhere, on toward the SM's switch.
    pub(super) fn multicast(
        &self,
        subnet: &Subnet,
        pkt: Packet,
        at: (usize, u8),
        hook: Option<&Arc<dyn LinkHook>>,
        via: Via,
    ) {
        if !subnet.is_local(0) {
            return self.walk(subnet, pkt, (at.0, Toward::Lid(SM_LID)), hook, false, via);
        }
        let members = self.with_sa(|sa| {
            sa.group_by_mlid(pkt.dlid)
                .map(|g| g.members.keys().copied().collect::<Vec<u64>>())
                .unwrap_or_default()
        });
        let lids: Vec<Lid> = (members.into_iter())
            .filter_map(|guid| Ports::lid_of(self, guid))
            .collect();
        if lids.is_empty() {
            return self.bounce(pkt, DropReason::NoRoute);
        }
        // The copies start afresh from here: the way to the SM's host and the way back
        // are each bounded by the hop limit, not both together.
        let via = Via { hops: 0, ..via };
        self.fan_out(subnet, pkt, at.0, &lids, hook, via);
    }

    /// Where an SMP answer from the switches goes.
    pub(super) fn smp_out(&self, out: Option<Out>) {
        match out {
            Some(Out::To(p)) => self.enqueue(p),
            Some(Out::Across { link, pkt }) => {
                let subnet = self.subnet();
                self.send_remote(&subnet, link, &[], pkt, Via::HERE);
            }
            None => {}
        }
    }

    /// Sends `pkt` over inter-host link `link`, a frame per MTU packet; `members`: the
    /// group members beyond the link it is for (a group's copies), or none. Not back over
    /// the link it came by (but a group's copies), and not
    /// past as many inter-host links as the subnet has switches: hosts' tables disagree
    /// for a moment after a link changes (each sweeps on its own tick), and a packet must
    /// not go round between them meanwhile.
    pub(super) fn send_remote(
        &self,
        subnet: &Subnet,
        link: usize,
        members: &[Lid],
        pkt: Packet,
        via: Via,
    ) {
        self.send_across(subnet, link, (members, false), pkt, via);
    }

    /// [`Fabric::send_remote`], `bounce` saying the packet goes back to its sender.
    fn send_across(
        &self,
        subnet: &Subnet,
        link: usize,
        (members, bounce): (&[Lid], bool),
        pkt: Packet,
        via: Via,
    ) {
        let most = subnet.switches().len().min(usize::from(u8::MAX));
        // (A multicast copy may go back the way the group's packet came: a member beyond.)
        let back = via.link == Some(link) && !pkt.is_multicast();
        if back || usize::from(via.hops) >= most {
            return self.lose(pkt);
        }
        let Some(remote) = self.inner.remote.get() else {
            return self.lose(pkt);
        };
        let Some(((a, _), (b, _))) = subnet.link_ends(link) else {
            return self.lose(pkt);
        };
        let host = |sw| subnet.topology().host_of(sw);
        let (near, far) = if subnet.is_local(a) {
            (a, host(b))
        } else {
            (b, host(a))
        };
        if let Some(way) = subnet.leaving(near, link) {
            self.count_sent(way, &pkt);
        }
        let c = &self.inner.remote_counters;
        for p in pkt.packets() {
            let frame = Frame::Packet {
                link: link as u16,
                hops: via.hops.saturating_add(1),
                members: members.to_vec(),
                bounce,
                pkt: p,
            };
            match wire::encode(&frame) {
                Ok(d) => {
                    c.frames_out.fetch_add(1, Relaxed);
                    c.bytes_out.fetch_add(d.len() as u64, Relaxed);
                    remote.send(far, d);
                }
                Err(e) => log::debug!("subnet: a packet for link {link} not sent: {e}"),
            }
        }
    }

    /// A packet from a port on another host that a port here refused (no such QP, ...):
    /// back to its sender's host, headers only, as a refusal on one host goes back to its
    /// sender (whose RC QP then fails at once, not after its retries).
    pub(super) fn bounce_across(&self, pkt: Packet) {
        let subnet = self.subnet();
        if let Stop::Remote { link } = subnet.next_stop(pkt.dlid, pkt.slid) {
            self.send_across(&subnet, link, (&[], true), pkt, Via::HERE);
        }
    }

    /// A packet from another host for a port gone beyond this one (a host between, whose
    /// tables no longer lead to it): back toward its sender from local switch `sw`, as the
    /// port's own host would send it.
    pub(super) fn refuse_from(&self, subnet: &Subnet, sw: usize, pkt: Packet, via: Via) {
        match subnet.next_stop_from(sw, 0, pkt.slid) {
            // (Back over the link it came by: a refusal may.)
            Stop::Remote { link } => {
                let via = Via {
                    hops: via.hops,
                    ..Via::HERE
                };
                self.send_across(subnet, link, (&[], true), pkt, via)
            }
            _ => self.lose(pkt),
        }
    }

    /// A refusal coming back over `link` to a port here, or through this host to one
    /// beyond: the refusing port is not this host's.
    fn bounced_back(
        &self,
        subnet: &Subnet,
        from: u16,
        at: (usize, u8),
        (link, hops): (u16, u8),
        pkt: Packet,
        bytes: usize,
    ) -> Result<(), RemoteError> {
        if subnet
            .host_of_lid(pkt.dlid)
            .is_none_or(|h| h == subnet.here())
        {
            return Err(RemoteError::Spoofed {
                host: from,
                slid: pkt.slid,
                dlid: pkt.dlid,
                members: 0,
            });
        }
        let c = &self.inner.remote_counters;
        c.frames_in.fetch_add(1, Relaxed);
        c.bytes_in.fetch_add(bytes as u64, Relaxed);
        self.count_received(Self::way_in(subnet, usize::from(link), at.0), &pkt);
        if subnet.host_of_lid(pkt.slid) == Some(subnet.here()) {
            self.bounce(pkt, DropReason::Rejected);
            return Ok(());
        }
        let via = Via::across(usize::from(link), hops);
        match subnet.next_stop_from(at.0, at.1, pkt.slid) {
            Stop::Remote { link } => self.send_across(subnet, link, (&[], true), pkt, via),
            _ => self.lose(pkt),
        }
        Ok(())
    }

    /// A packet lost between switches, its sender not told (as a lossy link's).
    pub(super) fn lose(&self, _pkt: Packet) {
        self.inner.stats.unrouted.fetch_add(1, Relaxed);
    }

    /// Host `from`'s announcement: its ports and its side of its links.
    fn heard(
        &self,
        from: u16,
        host: u16,
        seq: u32,
        links: &[(u16, bool)],
        ports: &[PortAd],
    ) -> Result<(), RemoteError> {
        let subnet = self.subnet();
        let not_own = |what: String| RemoteError::NotItsOwn { host: from, what };
        if host != from || from == subnet.here() {
            return Err(not_own(format!("host {host}")));
        }
        // Each LID and GUID once.
        for (i, p) in ports.iter().enumerate() {
            let before = ports.get(..i).unwrap_or_default();
            if before.iter().any(|q| q.lid == p.lid || q.guid == p.guid) {
                return Err(not_own(format!("the port at LID {} twice", p.lid)));
            }
        }
        for &(k, _) in links {
            if !ends_on(&subnet, usize::from(k), from) {
                return Err(not_own(format!("link {k}")));
            }
        }
        for p in ports {
            if subnet.host_of_lid(p.lid) != Some(from) || subnet.switch_at(p.lid).is_some() {
                return Err(not_own(format!("the port at LID {}", p.lid)));
            }
            // A GUID another port has (here, or on a third host) is not the sender's to
            // claim: the SA would take that port's GID for the sender's.
            let claimed = self.indexed_lid(p.guid).filter(|&l| l != p.lid);
            if claimed.is_some_and(|l| subnet.host_of_lid(l) != Some(from)) {
                return Err(not_own(format!("port GUID {:#x}", p.guid)));
            }
        }
        {
            let mut h = self.inner.hosts.lock_unpoisoned();
            // An announcement older than one taken is stale (datagrams may be reordered);
            // one far older is a host that started again.
            if let Some(&last) = h.heard_seq.get(&from) {
                let newer = seq.wrapping_sub(last);
                if newer == 0 || newer > u32::MAX / 2 && last.wrapping_sub(seq) < 1 << 16 {
                    return Ok(());
                }
            }
            h.heard_seq.insert(from, seq);
            for &(k, up) in links {
                h.reported.insert((k, from), up);
            }
        }
        // Its ports: those gone or down are reported out of service (while the SA still
        // knows their GIDs), new ones and ones back up into it. (Taken before the host
        // counts as heard: a port of a host heard from but not announced is gone.)
        let old: Vec<(Lid, PortAd)> = (self.inner.remote_ports.read_unpoisoned().iter())
            .filter(|(_, (h, _))| *h == from)
            .map(|(&l, &(_, p))| (l, p))
            .collect();
        let up_before = |lid: Lid| old.iter().any(|(l, o)| *l == lid && o.up);
        let went: Vec<Lid> = (old.iter())
            .filter(|(l, o)| o.up && !ports.iter().any(|p| p.lid == *l && p.up))
            .map(|&(l, _)| l)
            .collect();
        let came: Vec<Lid> = (ports.iter())
            .filter(|p| p.up && !up_before(p.lid))
            .map(|p| p.lid)
            .collect();
        let changed = !came.is_empty()
            || old.len() != ports.len()
            || !ports.iter().all(|p| old.iter().any(|(_, o)| o == p));
        for &l in &went {
            self.report_port(l, false);
        }
        if changed {
            let mut have = self.inner.remote_ports.write_unpoisoned();
            let mut guids = self.inner.guids.write_unpoisoned();
            for (l, _) in &old {
                have.remove(l);
            }
            // Every GUID the sender's ports had goes, whatever it said before.
            guids.retain(|_, l| subnet.host_of_lid(*l) != Some(from));
            for p in ports {
                have.insert(p.lid, (from, *p));
                guids.insert(p.guid, p.lid);
            }
        }
        self.set_host_alive(from, true);
        for &l in &came {
            self.report_port(l, true);
        }
        if self.settle_links() || changed {
            self.inner.sweep_due.store(true, Relaxed);
        }
        Ok(())
    }

    /// Works out which links are up from every host's side and whether the hosts are
    /// heard from, and takes the subnet's links there: whether any changed (the SM then
    /// sweeps at the next tick).
    pub(super) fn settle_links(&self) -> bool {
        let subnet = self.subnet();
        let here = subnet.here();
        let wanted: Vec<bool> = {
            let h = self.inner.hosts.lock_unpoisoned();
            (0..subnet.topology().links().len())
                .map(|k| {
                    let Some(((a, _), (b, _))) = subnet.link_ends(k) else {
                        return false;
                    };
                    [a, b].into_iter().all(|sw| {
                        let host = subnet.topology().host_of(sw);
                        if host == here {
                            h.side_up(k)
                        } else {
                            h.alive.get(&host) == Some(&true)
                                && h.reported.get(&(k as u16, host)) != Some(&false)
                        }
                    })
                })
                .collect()
        };
        let mut flipped = Vec::new();
        let mut s = self.inner.subnet.write_unpoisoned();
        for (k, up) in wanted.into_iter().enumerate() {
            if s.link_up(k) != Some(up) {
                if let Some(next) = s.with_link(k, up) {
                    *s = Arc::new(next);
                    flipped.push((k, up));
                }
            }
        }
        drop(s);
        let changed = !flipped.is_empty();
        for (k, up) in flipped {
            if !up {
                self.count_downed(k);
            }
            self.user_sm_switch_link_changed(k);
        }
        if changed {
            self.inner.sweep_due.store(true, Relaxed);
        }
        changed
    }

    /// Whether host `host` is heard from now.
    pub(super) fn host_heard(&self, host: u16) -> bool {
        self.inner.hosts.lock_unpoisoned().alive.get(&host) == Some(&true)
    }

    /// The LIDs of this host's attached ports.
    pub(super) fn local_lids(&self) -> Vec<Lid> {
        let ports = self.inner.ports.read_unpoisoned();
        (ports.iter().enumerate())
            .filter_map(|(lid, p)| {
                let sink = p.as_ref()?.upgrade()?;
                sink.port_guid().map(|_| lid as Lid)
            })
            .collect()
    }

    /// A port another host announced, as it did.
    pub(super) fn remote_port(&self, lid: Lid) -> Option<PortAd> {
        (self.inner.remote_ports.read_unpoisoned())
            .get(&lid)
            .map(|&(_, p)| p)
    }
}

/// Whether link `k` has an end at a switch of host `host`.
fn ends_on(subnet: &Subnet, k: usize, host: u16) -> bool {
    subnet.link_ends(k).is_some_and(|((a, _), (b, _))| {
        subnet.topology().host_of(a) == host || subnet.topology().host_of(b) == host
    })
}
