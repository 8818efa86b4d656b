//! The subnet's structure and its routes: the switches, the switch port each HCA port hangs
//! on, the links between switches, and the linear forwarding tables the SM programs over
//! them.
//!
//! A [`Topology`] is the cabling a cluster file describes; a [`Subnet`] is what the SM's
//! last sweep made of it: the switches' LIDs, which inter-switch links are up, and each
//! switch's forwarding table. Routing is min-hop, and where several ports lead equally
//! far the LIDs are spread over them (the least-loaded port takes the next LID), as
//! OpenSM's `minhop` engine does. Switch `i` has LID [`SM_LID`]` - i` and GUID
//! `node_guid(lid)`; switch 0 carries the SM behind its management port 0.
//!
//! The default topology is one switch whose port n links the port at LID n (the fabric
//! had nothing else before): its tables route LID n out of port n.
//!
//! A link cut takes effect at once (packets whose route crosses it are lost, as on a cut
//! cable), while the tables stay as the last sweep left them until the SM sweeps again
//! ([`Subnet::with_link`] then [`Subnet::sweep`]): the window a real subnet has between a
//! link failing and its SM routing around it.

use std::collections::VecDeque;

use crate::abi::{node_guid, Lid};
use crate::sa::SM_LID;

/// The most switches a subnet has (their LIDs sit below [`SM_LID`]).
pub const MAX_SWITCHES: usize = 256;
/// The most ports a switch has (IBA: 254; 255 is no port).
pub const MAX_SWITCH_PORTS: usize = 254;
/// A forwarding table's "no port" (an unreachable LID).
pub const NO_PORT: u8 = 0xff;
/// The highest LID an HCA port may have on a multi-switch subnet: below every switch's.
pub const MAX_HCA_LID: Lid = SM_LID - MAX_SWITCHES as Lid;

/// One switch of a topology: its name and the LIDs of the HCA ports on its ports 1, 2, ...
/// in order (its links to other switches take the ports after those).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchSpec {
    /// What `ibnetdiscover` shows after "hcabench switch".
    pub name: String,
    /// The HCA ports cabled to this switch, by LID.
    pub hcas: Vec<Lid>,
}

/// A subnet's cabling. The default (no switches named) is the one switch of old.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    switches: Vec<SwitchSpec>,
    /// Inter-switch links, as pairs of indices into `switches`.
    links: Vec<(usize, usize)>,
    /// The host each switch is on (empty: all on one).
    hosts: Vec<u16>,
}

/// Why a topology cannot be cabled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologyError {
    /// No switch named.
    #[error("a topology needs at least one switch")]
    NoSwitch,
    /// More than [`MAX_SWITCHES`].
    #[error("{0} switches: at most {MAX_SWITCHES}")]
    TooManySwitches(usize),
    /// Two switches share a name.
    #[error("two switches are named {0:?}")]
    NameTwice(String),
    /// One LID on two switch ports.
    #[error("LID {0} is on more than one switch port")]
    LidTwice(Lid),
    /// A LID no HCA port can have.
    #[error("LID {0} cannot be an HCA port's (1 to {MAX_HCA_LID})")]
    BadLid(Lid),
    /// A link to a switch not named.
    #[error("link {0} names a switch that does not exist")]
    BadLink(usize),
    /// A link from a switch to itself.
    #[error("link {0} joins a switch to itself")]
    SelfLink(usize),
    /// More ports than a switch has.
    #[error("switch {0:?} needs {1} ports: at most {MAX_SWITCH_PORTS}")]
    TooManyPorts(String, usize),
    /// A switch the SM cannot reach.
    #[error("switch {0:?} is not linked to the SM's switch (the first)")]
    Disconnected(String),
    /// Hosts not given one per switch.
    #[error("{0} hosts named for {1} switches")]
    Hosts(usize, usize),
}

impl Topology {
    /// A topology of these switches and inter-switch links (pairs of switch indices; two
    /// switches may have several links). Every switch must be reachable from the first,
    /// which runs the SM.
    pub fn new(
        switches: Vec<SwitchSpec>,
        links: Vec<(usize, usize)>,
    ) -> Result<Self, TopologyError> {
        let n = switches.len();
        if n == 0 {
            return Err(TopologyError::NoSwitch);
        }
        if n > MAX_SWITCHES {
            return Err(TopologyError::TooManySwitches(n));
        }
        let mut names: Vec<&str> = switches.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w.first() == w.get(1)) {
            let name = w.first().copied().unwrap_or_default();
            return Err(TopologyError::NameTwice(name.to_string()));
        }
        let mut lids: Vec<Lid> = switches
            .iter()
            .flat_map(|s| s.hcas.iter().copied())
            .collect();
        if let Some(&l) = lids.iter().find(|&&l| l == 0 || l > MAX_HCA_LID) {
            return Err(TopologyError::BadLid(l));
        }
        lids.sort_unstable();
        if let Some(w) = lids.windows(2).find(|w| w.first() == w.get(1)) {
            return Err(TopologyError::LidTwice(w.first().copied().unwrap_or(0)));
        }
        let mut ports = vec![0usize; n];
        for (i, &(a, b)) in links.iter().enumerate() {
            if a >= n || b >= n {
                return Err(TopologyError::BadLink(i));
            }
            if a == b {
                return Err(TopologyError::SelfLink(i));
            }
            for s in [a, b] {
                if let Some(p) = ports.get_mut(s) {
                    *p += 1;
                }
            }
        }
        for (s, &isl) in switches.iter().zip(&ports) {
            let need = s.hcas.len() + isl;
            if need > MAX_SWITCH_PORTS {
                return Err(TopologyError::TooManyPorts(s.name.clone(), need));
            }
        }
        let t = Self {
            switches,
            links,
            hosts: Vec::new(),
        };
        let dist = t.distances(&vec![true; t.links.len()]);
        let from_sm = dist.first().cloned().unwrap_or_default();
        if let Some((s, _)) = (t.switches.iter().zip(&from_sm)).find(|(_, d)| d.is_none()) {
            return Err(TopologyError::Disconnected(s.name.clone()));
        }
        Ok(t)
    }

    /// The topology with its switches on hosts: `hosts[i]` is switch i's (hcabench
    /// processes joined by inter-host links; the links between switches of different
    /// hosts cross the network, see [`crate::wire`]). The first switch's host runs the SM.
    pub fn on_hosts(mut self, hosts: Vec<u16>) -> Result<Self, TopologyError> {
        if hosts.len() != self.switches.len() {
            return Err(TopologyError::Hosts(hosts.len(), self.switches.len()));
        }
        self.hosts = hosts;
        Ok(self)
    }

    /// The host switch `sw` is on.
    pub fn host_of(&self, sw: usize) -> u16 {
        self.hosts.get(sw).copied().unwrap_or(0)
    }

    /// Whether some switches are on another host than others.
    pub fn spans_hosts(&self) -> bool {
        self.hosts.windows(2).any(|w| w.first() != w.get(1))
    }

    /// The one switch of old: port n links LID n.
    pub fn single() -> Self {
        Self::default()
    }

    /// Whether this is the default single switch.
    pub fn is_single(&self) -> bool {
        self.switches.is_empty()
    }

    /// The switches as named.
    pub fn switches(&self) -> &[SwitchSpec] {
        &self.switches
    }

    /// The inter-switch links, as pairs of switch indices.
    pub fn links(&self) -> &[(usize, usize)] {
        &self.links
    }

    /// The port of switch `sw` that link `link` takes: after the switch's HCA ports, one
    /// per link it ends, in the links' order.
    fn link_port(&self, sw: usize, link: usize) -> Option<u8> {
        let hcas = self.switches.get(sw)?.hcas.len();
        let before = (self.links.iter().take(link))
            .filter(|&&(a, b)| a == sw || b == sw)
            .count();
        u8::try_from(hcas + before + 1).ok()
    }

    /// Hops between every pair of switches over the links that are up (None: no path).
    fn distances(&self, up: &[bool]) -> Vec<Vec<Option<u8>>> {
        let n = self.switches.len();
        let mut adj = vec![Vec::new(); n];
        for (&(a, b), _) in self.links.iter().zip(up).filter(|(_, &u)| u) {
            if let Some(v) = adj.get_mut(a) {
                v.push(b);
            }
            if let Some(v) = adj.get_mut(b) {
                v.push(a);
            }
        }
        (0..n)
            .map(|from| {
                let mut d = vec![None; n];
                let mut q = VecDeque::from([from]);
                if let Some(x) = d.get_mut(from) {
                    *x = Some(0u8);
                }
                while let Some(s) = q.pop_front() {
                    let here = d.get(s).copied().flatten().unwrap_or(0);
                    for &t in adj.get(s).map(Vec::as_slice).unwrap_or_default() {
                        if let Some(x) = d.get_mut(t).filter(|x| x.is_none()) {
                            *x = Some(here.saturating_add(1));
                            q.push_back(t);
                        }
                    }
                }
                d
            })
            .collect()
    }
}

/// What is at the other end of a switch port's cable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Nothing.
    None,
    /// Port 1 of the HCA at this LID (whether a node is there, and its link up, is the
    /// fabric's to say).
    Hca(Lid),
    /// Another switch's port, over inter-switch link `link`.
    Switch {
        /// The switch's index.
        sw: usize,
        /// Its port.
        port: u8,
        /// The link's index in the topology.
        link: usize,
    },
}

/// One switch as the SM sees it.
#[derive(Clone, Debug)]
pub struct Switch {
    /// Its LID (port 0's).
    pub lid: Lid,
    /// Its node, system and port-0 GUID.
    pub guid: u64,
    /// Its name (NodeDescription says "hcabench switch NAME").
    pub name: String,
    /// Ports 1..=num_ports.
    pub num_ports: u8,
    /// Index p: what port p links (index 0, the management port, links nothing).
    peers: Vec<Peer>,
}

impl Switch {
    /// What port `port` links.
    pub fn peer(&self, port: u8) -> Peer {
        self.peers
            .get(usize::from(port))
            .copied()
            .unwrap_or(Peer::None)
    }
}

/// Where a packet's way through this host's switches ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// At the HCA port at this LID, on this host.
    Hca(Lid),
    /// At this switch's management port (its LID), on this host.
    Switch(usize),
    /// It leaves this host over inter-host link `link`.
    Remote {
        /// The link's index.
        link: usize,
    },
    /// Nowhere: no table leads on, a link is down, or it loops.
    Lost,
}

/// An inter-switch link crossed one way: `forward` is from the first switch its
/// `[[link]]` names to the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwitchLink {
    /// The link's index in the topology (the cluster file's `[[link]]` order, from 0).
    pub link: usize,
    /// From its first switch to its second.
    pub forward: bool,
}

/// One switch's part of a packet's way (see [`Subnet::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The way ends here, or leaves this host.
    Stop(Stop),
    /// Into `link`, which is down: lost there.
    Down(SwitchLink),
    /// Over `link` to another switch of this host, at (switch, port).
    Cross {
        /// The link and the way across it.
        link: SwitchLink,
        /// Where it arrives.
        to: (usize, u8),
    },
}

/// One switch a route crosses: where the packet comes in and leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The switch's index.
    pub sw: usize,
    /// The port it arrived on (0: from the switch itself).
    pub port_in: u8,
    /// The port it leaves by (0: for the switch itself).
    pub port_out: u8,
}

/// The subnet as the SM's last sweep left it, with the links as they are now.
#[derive(Clone, Debug)]
pub struct Subnet {
    topology: Topology,
    switches: Vec<Switch>,
    /// By LID: the (switch, port) an HCA port hangs on.
    attached: Vec<Option<(usize, u8)>>,
    /// Whether each inter-switch link is up now.
    links_up: Vec<bool>,
    /// [switch][LID]: the port the switch forwards an HCA LID to ([`NO_PORT`]: none).
    lft: Vec<Vec<u8>>,
    /// [switch][switch]: the port toward another switch's LID (0: itself).
    to_switch: Vec<Vec<u8>>,
    /// [switch][switch]: the ports one hop nearer to the other switch, over the links up
    /// at the last sweep.
    near: Vec<Vec<Vec<u8>>>,
    /// [switch][port]: how many HCA LIDs the switch's table sends out of the port (the
    /// spread over equal ports counts them).
    load: Vec<Vec<u32>>,
    /// How many sweeps made this.
    sweeps: u64,
    /// The host this subnet is seen from (see [`Topology::on_hosts`]).
    here: u16,
}

impl Subnet {
    /// The subnet cabled as `topology` with every link up, swept with the HCA ports at
    /// `lids` (ascending) on the fabric.
    pub fn new(topology: Topology, lids: &[Lid]) -> Self {
        let links_up = vec![true; topology.links.len()];
        let mut s = Self {
            topology,
            switches: Vec::new(),
            attached: Vec::new(),
            links_up,
            lft: Vec::new(),
            to_switch: Vec::new(),
            near: Vec::new(),
            load: Vec::new(),
            sweeps: 0,
            here: 0,
        };
        s.sweep(lids);
        s
    }

    /// Like [`Subnet::new`], seen from host `here`: its switches are local, the others
    /// across inter-host links.
    pub fn new_on(topology: Topology, here: u16, lids: &[Lid]) -> Self {
        let mut s = Self::new(topology, lids);
        s.here = here;
        s
    }

    /// The host this subnet is seen from.
    pub fn here(&self) -> u16 {
        self.here
    }

    /// Whether switch `sw` is on this host.
    pub fn is_local(&self, sw: usize) -> bool {
        sw < self.switches.len() && self.topology.host_of(sw) == self.here
    }

    /// The host the port at `lid` (an HCA's or a switch's) is on.
    pub fn host_of_lid(&self, lid: Lid) -> Option<u16> {
        let sw = self
            .switch_at(lid)
            .or_else(|| Some(self.attachment(lid)?.0))?;
        Some(self.topology.host_of(sw))
    }

    /// Link `link`'s two ends, (switch, port) each, the first as the topology names it.
    pub fn link_ends(&self, link: usize) -> Option<((usize, u8), (usize, u8))> {
        let &(a, b) = self.topology.links.get(link)?;
        let pa = self.topology.link_port(a, link)?;
        let pb = self.topology.link_port(b, link)?;
        Some(((a, pa), (b, pb)))
    }

    /// Where a packet from `slid` to unicast `dlid` stops on this host (see [`Stop`]).
    pub fn next_stop(&self, slid: Lid, dlid: Lid) -> Stop {
        match self.entry(slid) {
            Some((sw, port)) if self.is_local(sw) => self.next_stop_from(sw, port, dlid),
            _ => Stop::Lost,
        }
    }

    /// Where a packet for `dlid` that came into local switch `sw` stops on this host.
    pub fn next_stop_from(&self, mut sw: usize, _port_in: u8, dlid: Lid) -> Stop {
        for _ in 0..=self.switches.len() {
            match self.step(sw, dlid) {
                Step::Stop(stop) => return stop,
                Step::Down(_) => return Stop::Lost,
                Step::Cross { to, .. } => sw = to.0,
            }
        }
        Stop::Lost
    }

    /// One switch's part of a packet's way: where local switch `sw` sends a packet for
    /// `dlid`, a stop or a link up to another switch of this host (the fabric walks the
    /// links one by one, for their counters and faults).
    pub fn step(&self, sw: usize, dlid: Lid) -> Step {
        self.step_out(sw, dlid, self.out_port(sw, dlid))
    }

    /// Like [`Subnet::step`], for a packet switch `sw` sends out of port `out` (as a
    /// table other than the SM's says: a user's SM's).
    pub fn step_out(&self, sw: usize, dlid: Lid, out: u8) -> Step {
        let stop = match (out, self.peer(sw, out)) {
            (0, _) if self.switch_at(dlid) == Some(sw) => Stop::Switch(sw),
            (_, Peer::Hca(l)) if out != 0 && l == dlid => Stop::Hca(l),
            (0, _) => Stop::Lost,
            (
                _,
                Peer::Switch {
                    sw: next,
                    port,
                    link,
                },
            ) => {
                let way = SwitchLink {
                    link,
                    forward: self.topology.links.get(link).is_some_and(|l| l.0 == sw),
                };
                if self.links_up.get(link) != Some(&true) {
                    return Step::Down(way);
                } else if !self.is_local(next) {
                    Stop::Remote { link }
                } else {
                    return Step::Cross {
                        link: way,
                        to: (next, port),
                    };
                }
            }
            _ => Stop::Lost,
        };
        Step::Stop(stop)
    }

    /// Which way a packet from local switch `sw` crosses link `link` (None: `sw` is not
    /// one of its ends).
    pub fn leaving(&self, sw: usize, link: usize) -> Option<SwitchLink> {
        let &(a, b) = self.topology.links.get(link)?;
        (sw == a || sw == b).then_some(SwitchLink {
            link,
            forward: sw == a,
        })
    }

    /// The cabling.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// How many sweeps the SM made of this subnet.
    pub fn sweeps(&self) -> u64 {
        self.sweeps
    }

    /// The SM sweeps: finds the switches and the HCA ports at `lids` (ascending; the ones
    /// on the fabric), and programs every switch's forwarding table over the links up now.
    pub fn sweep(&mut self, lids: &[Lid]) {
        self.sweeps += 1;
        let t = &self.topology;
        if t.is_single() {
            // Port n links LID n, up to the highest LID (at least one port).
            let top = lids
                .last()
                .copied()
                .unwrap_or(1)
                .clamp(1, MAX_SWITCH_PORTS as Lid);
            let num_ports = top as u8;
            let peers = (0..=num_ports)
                .map(|p| {
                    if p == 0 {
                        Peer::None
                    } else {
                        Peer::Hca(Lid::from(p))
                    }
                })
                .collect();
            self.switches = vec![switch(0, "", num_ports, peers)];
            self.attached = (0..=top)
                .map(|l| (l >= 1).then_some((0, l as u8)))
                .collect();
            let mut lft = vec![NO_PORT; usize::from(top) + 1];
            for &l in lids.iter().filter(|&&l| l <= top) {
                if let Some(x) = lft.get_mut(usize::from(l)) {
                    *x = l as u8;
                }
            }
            self.lft = vec![lft];
            self.to_switch = vec![vec![0]];
            return;
        }
        // The cabling.
        let n = t.switches.len();
        let top = t
            .switches
            .iter()
            .flat_map(|s| s.hcas.iter().copied())
            .max()
            .unwrap_or(0);
        let mut attached = vec![None; usize::from(top) + 1];
        let mut switches = Vec::with_capacity(n);
        for (i, spec) in t.switches.iter().enumerate() {
            let mut peers = vec![Peer::None];
            for (p, &lid) in spec.hcas.iter().enumerate() {
                peers.push(Peer::Hca(lid));
                if let Some(a) = attached.get_mut(usize::from(lid)) {
                    *a = Some((i, (p + 1) as u8));
                }
            }
            for (k, &(a, b)) in t.links.iter().enumerate() {
                let other = match (a == i, b == i) {
                    (true, _) => b,
                    (_, true) => a,
                    _ => continue,
                };
                let port = t.link_port(other, k).unwrap_or(NO_PORT);
                peers.push(Peer::Switch {
                    sw: other,
                    port,
                    link: k,
                });
            }
            let num_ports = (peers.len() - 1).max(1) as u8;
            switches.push(switch(i, &spec.name, num_ports, peers));
        }
        // Min-hop routes over the links up now.
        let dist = t.distances(&self.links_up);
        let hops = |a: usize, b: usize| dist.get(a).and_then(|d| d.get(b)).copied().flatten();
        // The ports of each switch that lead one hop nearer to each other switch.
        let nearer = |a: usize, b: usize| -> Vec<u8> {
            let Some(d) = hops(a, b).filter(|&d| d > 0) else {
                return Vec::new();
            };
            let sw = switches.get(a);
            (1..=sw.map_or(0, |s: &Switch| s.num_ports))
                .filter(|&p| match sw.map_or(Peer::None, |s| s.peer(p)) {
                    Peer::Switch { sw: next, link, .. } => {
                        self.links_up.get(link) == Some(&true) && hops(next, b) == Some(d - 1)
                    }
                    _ => false,
                })
                .collect()
        };
        let mut live = vec![false; usize::from(top) + 1];
        for &l in lids {
            if let Some(x) = live.get_mut(usize::from(l)) {
                *x = true;
            }
        }
        let mut to_switch = vec![vec![NO_PORT; n]; n];
        let mut lft = vec![vec![NO_PORT; usize::from(top) + 1]; n];
        let mut near_all = Vec::with_capacity(n);
        let mut load_all = Vec::with_capacity(n);
        for a in 0..n {
            let near: Vec<Vec<u8>> = (0..n).map(|b| nearer(a, b)).collect();
            let nearer = |b: usize| near.get(b).map(Vec::as_slice).unwrap_or_default();
            let mut load = vec![0u32; MAX_SWITCH_PORTS + 1];
            let row = to_switch.get_mut(a);
            for (b, out) in row.into_iter().flatten().enumerate() {
                *out = if a == b {
                    0
                } else {
                    nearer(b).first().copied().unwrap_or(NO_PORT)
                };
            }
            let table = lft.get_mut(a);
            for (lid, out) in table.into_iter().flatten().enumerate() {
                if live.get(lid) != Some(&true) {
                    continue;
                }
                let Some(&Some((b, port))) = attached.get(lid) else {
                    continue;
                };
                *out = if a == b {
                    port
                } else {
                    // The least-loaded of the nearer ports (the lowest on a tie).
                    let best = (nearer(b).iter().copied())
                        .min_by_key(|&p| (load.get(usize::from(p)).copied(), p));
                    if let Some(l) = best.and_then(|p| load.get_mut(usize::from(p))) {
                        *l += 1;
                    }
                    best.unwrap_or(NO_PORT)
                };
            }
            near_all.push(near);
            load_all.push(load);
        }
        self.switches = switches;
        self.attached = attached;
        self.lft = lft;
        self.to_switch = to_switch;
        self.near = near_all;
        self.load = load_all;
    }

    /// The SM found the HCA port at `lid` on the fabric (`here`) or gone: its entry in
    /// every switch's table made as a full sweep would (min-hop over the links up at the
    /// last sweep, spread over equal ports), the rest left as they are. What a port coming
    /// or going costs: a full sweep's work over one LID. (Not for the default single
    /// switch, whose port count follows the LIDs: sweep that.)
    pub fn sweep_lid(&mut self, lid: Lid, here: bool) {
        let Some((b, port)) = self.attachment(lid) else {
            return;
        };
        for a in 0..self.switches.len() {
            let (Some(table), Some(load)) = (self.lft.get_mut(a), self.load.get_mut(a)) else {
                continue;
            };
            let Some(out) = table.get_mut(usize::from(lid)) else {
                continue;
            };
            if a != b && *out != NO_PORT {
                if let Some(l) = load.get_mut(usize::from(*out)) {
                    *l = l.saturating_sub(1);
                }
            }
            *out = match (here, a == b) {
                (false, _) => NO_PORT,
                (true, true) => port,
                (true, false) => {
                    let near = (self.near.get(a).and_then(|n| n.get(b)))
                        .map(Vec::as_slice)
                        .unwrap_or_default();
                    let best = (near.iter().copied())
                        .min_by_key(|&p| (load.get(usize::from(p)).copied(), p));
                    if let Some(l) = best.and_then(|p| load.get_mut(usize::from(p))) {
                        *l += 1;
                    }
                    best.unwrap_or(NO_PORT)
                }
            };
        }
    }

    /// The subnet with inter-switch link `link` up or down from now, its tables unchanged
    /// until the next [`Subnet::sweep`]. None if there is no such link.
    pub fn with_link(&self, link: usize, up: bool) -> Option<Self> {
        let mut s = self.clone();
        *s.links_up.get_mut(link)? = up;
        Some(s)
    }

    /// Whether switches `a` and `b` are joined by links up now (whatever the tables say).
    pub fn joined(&self, a: usize, b: usize) -> bool {
        let n = self.switches.len();
        let mut seen = vec![false; n];
        let mut todo = vec![a];
        while let Some(s) = todo.pop() {
            match seen.get_mut(s) {
                Some(x) if !*x => *x = true,
                _ => continue,
            }
            if s == b {
                return true;
            }
            let ends = (self.topology.links.iter()).zip(&self.links_up);
            for (&(x, y), _) in ends.filter(|(_, &up)| up) {
                if x == s {
                    todo.push(y);
                } else if y == s {
                    todo.push(x);
                }
            }
        }
        false
    }

    /// Whether inter-switch link `link` is up (None: no such link).
    pub fn link_up(&self, link: usize) -> Option<bool> {
        self.links_up.get(link).copied()
    }

    /// The switches, the SM's first.
    pub fn switches(&self) -> &[Switch] {
        &self.switches
    }

    /// Switch `sw`.
    pub fn switch(&self, sw: usize) -> Option<&Switch> {
        self.switches.get(sw)
    }

    /// The switch whose LID is `lid`.
    pub fn switch_at(&self, lid: Lid) -> Option<usize> {
        let i = usize::from(SM_LID.checked_sub(lid)?);
        (i < self.switches.len()).then_some(i)
    }

    /// The switch and port the HCA port at `lid` hangs on.
    pub fn attachment(&self, lid: Lid) -> Option<(usize, u8)> {
        self.attached.get(usize::from(lid)).copied().flatten()
    }

    /// What port `port` of switch `sw` links.
    pub fn peer(&self, sw: usize, port: u8) -> Peer {
        self.switch(sw).map_or(Peer::None, |s| s.peer(port))
    }

    /// The port switch `sw` forwards `dlid` to: 0 for its own LID, [`NO_PORT`] for none.
    pub fn out_port(&self, sw: usize, dlid: Lid) -> u8 {
        if let Some(target) = self.switch_at(dlid) {
            return (self.to_switch.get(sw).and_then(|r| r.get(target)))
                .copied()
                .unwrap_or(NO_PORT);
        }
        (self.lft.get(sw).and_then(|t| t.get(usize::from(dlid))))
            .copied()
            .unwrap_or(NO_PORT)
    }

    /// Block `block` (64 LIDs) of switch `sw`'s linear forwarding table, up to its top
    /// (the SM's switch's LID, the highest unicast LID); None past it.
    pub fn lft_block(&self, sw: usize, block: u32) -> Option<[u8; 64]> {
        let first = block.checked_mul(64).filter(|&f| f <= u32::from(SM_LID))?;
        self.switch(sw)?;
        let mut out = [NO_PORT; 64];
        for (o, lid) in out.iter_mut().zip(first..) {
            if let Ok(lid) = Lid::try_from(lid) {
                *o = self.out_port(sw, lid);
            }
        }
        Some(out)
    }

    /// The switch a packet from `slid` enters first, and the port it enters by (0: the
    /// switch's own LID).
    pub fn entry(&self, slid: Lid) -> Option<(usize, u8)> {
        match self.switch_at(slid) {
            Some(sw) => Some((sw, 0)),
            None => self.attachment(slid),
        }
    }

    /// The switches a packet from `slid` to unicast `dlid` crosses as the forwarding tables
    /// send it, over links that are up now: None if it gets nowhere (no entry, a table with
    /// no port for it, a cut link, a loop). Whether the HCA link at either end is up is the
    /// fabric's to say.
    pub fn route(&self, slid: Lid, dlid: Lid) -> Option<Vec<Hop>> {
        let mut hops = Vec::new();
        self.walk(slid, dlid, |h| hops.push(h))?;
        Some(hops)
    }

    /// How many switches a packet from `slid` to `dlid` crosses (see [`Subnet::route`]).
    pub fn hops(&self, slid: Lid, dlid: Lid) -> Option<usize> {
        let mut n = 0;
        self.walk(slid, dlid, |_| n += 1)?;
        Some(n)
    }

    /// Whether a packet from `slid` reaches `dlid` (see [`Subnet::route`]).
    pub fn reaches(&self, slid: Lid, dlid: Lid) -> bool {
        self.walk(slid, dlid, |_| {}).is_some()
    }

    fn walk(&self, slid: Lid, dlid: Lid, mut each: impl FnMut(Hop)) -> Option<()> {
        let (mut sw, mut port_in) = self.entry(slid)?;
        for _ in 0..=self.switches.len() {
            let out = self.out_port(sw, dlid);
            each(Hop {
                sw,
                port_in,
                port_out: out,
            });
            match (out, self.peer(sw, out)) {
                (0, _) => return (self.switch_at(dlid) == Some(sw)).then_some(()),
                (_, Peer::Hca(l)) => return (l == dlid).then_some(()),
                (
                    _,
                    Peer::Switch {
                        sw: next,
                        port,
                        link,
                    },
                ) => {
                    if self.links_up.get(link) != Some(&true) {
                        return None;
                    }
                    (sw, port_in) = (next, port);
                }
                (_, Peer::None) => return None,
            }
        }
        None
    }

    /// Switch `sw`'s multicast forwarding for a group whose receiving members are at
    /// `members`: the ports toward each (a bit per port, port 0 first).
    pub fn mft_ports(&self, sw: usize, members: &[Lid]) -> Vec<u8> {
        let mut ports: Vec<u8> = members
            .iter()
            .map(|&m| self.out_port(sw, m))
            .filter(|&p| p != NO_PORT && p != 0)
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

fn switch(i: usize, name: &str, num_ports: u8, peers: Vec<Peer>) -> Switch {
    let lid = SM_LID - i as Lid;
    Switch {
        lid,
        guid: node_guid(lid),
        name: name.to_string(),
        num_ports,
        peers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(name: &str, hcas: &[Lid]) -> SwitchSpec {
        SwitchSpec {
            name: name.into(),
            hcas: hcas.to_vec(),
        }
    }

    /// Three switches in a ring: s0 has LIDs 1, 2; s1 has 3, 4; s2 has 5.
    fn ring() -> Subnet {
        let t = Topology::new(
            vec![sw("s0", &[1, 2]), sw("s1", &[3, 4]), sw("s2", &[5])],
            vec![(0, 1), (1, 2), (2, 0)],
        )
        .unwrap();
        Subnet::new(t, &[1, 2, 3, 4, 5])
    }

    #[test]
    fn test_the_default_switch_routes_lid_n_out_of_port_n() {
        let s = Subnet::new(Topology::single(), &[1, 2, 4]);
        assert_eq!(s.switches().len(), 1);
        assert_eq!(s.switch(0).unwrap().num_ports, 4);
        assert_eq!(s.out_port(0, 2), 2);
        assert_eq!(s.out_port(0, 3), NO_PORT, "no port at LID 3");
        assert_eq!(s.out_port(0, SM_LID), 0);
        assert_eq!(s.hops(1, 4), Some(1));
        assert!(!s.reaches(1, 3));
        assert_eq!(s.attachment(4), Some((0, 4)));
        let b = s.lft_block(0, 0).unwrap();
        assert_eq!(&b[..5], &[NO_PORT, 1, 2, NO_PORT, 4]);
    }

    #[test]
    fn test_ports_are_hcas_then_links_and_routes_are_min_hop() {
        let s = ring();
        let s1 = s.switch(1).unwrap();
        assert_eq!(s1.lid, SM_LID - 1);
        // s1: ports 1, 2 its HCAs; 3 the link to s0, 4 the link to s2.
        assert_eq!(s1.num_ports, 4);
        assert_eq!(s1.peer(1), Peer::Hca(3));
        assert_eq!(
            s1.peer(3),
            Peer::Switch {
                sw: 0,
                port: 3,
                link: 0
            }
        );
        assert_eq!(
            s1.peer(4),
            Peer::Switch {
                sw: 2,
                port: 2,
                link: 1
            }
        );
        // One hop over the ring each way; from an HCA: its switch, then the other's.
        assert_eq!(s.out_port(0, 3), 3);
        assert_eq!(s.out_port(0, 5), 4);
        assert_eq!(s.hops(1, 5), Some(2));
        assert_eq!(s.hops(3, 4), Some(1));
        let r = s.route(1, SM_LID - 2).unwrap();
        assert_eq!(
            r,
            vec![
                Hop {
                    sw: 0,
                    port_in: 1,
                    port_out: 4
                },
                Hop {
                    sw: 2,
                    port_in: 3,
                    port_out: 0
                }
            ]
        );
    }

    #[test]
    fn test_a_cut_link_loses_packets_until_the_sweep_routes_around_it() {
        let s = ring();
        let cut = s.with_link(0, false).unwrap();
        assert!(!cut.reaches(1, 3), "the old table still uses the cut link");
        assert!(cut.reaches(1, 5));
        let mut swept = cut.clone();
        swept.sweep(&[1, 2, 3, 4, 5]);
        assert_eq!(swept.hops(1, 3), Some(3), "round the ring through s2");
        assert_eq!(
            swept
                .route(1, 3)
                .unwrap()
                .iter()
                .map(|h| h.sw)
                .collect::<Vec<_>>(),
            [0, 2, 1]
        );
        let mut back = swept.with_link(0, true).unwrap();
        back.sweep(&[1, 2, 3, 4, 5]);
        assert_eq!(back.hops(1, 3), Some(2));
    }

    #[test]
    fn test_a_switch_cut_off_is_unreachable_and_so_are_its_hcas() {
        let t = Topology::new(vec![sw("a", &[1]), sw("b", &[2])], vec![(0, 1)]).unwrap();
        let mut s = Subnet::new(t, &[1, 2]).with_link(0, false).unwrap();
        s.sweep(&[1, 2]);
        assert!(!s.reaches(1, 2));
        assert!(!s.reaches(SM_LID, 2));
        assert_eq!(s.out_port(0, 2), NO_PORT);
        assert_eq!(s.out_port(0, SM_LID - 1), NO_PORT);
    }

    #[test]
    fn test_equal_paths_share_the_lids() {
        // Two parallel links between two switches: the four LIDs of the far one are split.
        let t = Topology::new(
            vec![sw("a", &[1]), sw("b", &[2, 3, 4, 5])],
            vec![(0, 1), (0, 1)],
        )
        .unwrap();
        let s = Subnet::new(t, &[1, 2, 3, 4, 5]);
        let ports: Vec<u8> = (2..=5).map(|l| s.out_port(0, l)).collect();
        assert_eq!(ports.iter().filter(|&&p| p == 2).count(), 2);
        assert_eq!(ports.iter().filter(|&&p| p == 3).count(), 2);
        // Multicast to all four goes out both.
        assert_eq!(s.mft_ports(0, &[2, 3, 4, 5]), vec![2, 3]);
        assert_eq!(s.mft_ports(1, &[1, 2]), vec![1, 5]);
    }

    #[test]
    fn test_bad_topologies_are_refused_with_the_reason() {
        use TopologyError::*;
        let t = |s, l| Topology::new(s, l).unwrap_err();
        assert_eq!(t(vec![], vec![]), NoSwitch);
        assert_eq!(
            t(vec![sw("a", &[1]), sw("a", &[2])], vec![(0, 1)]),
            NameTwice("a".into())
        );
        assert_eq!(
            t(vec![sw("a", &[1]), sw("b", &[1])], vec![(0, 1)]),
            LidTwice(1)
        );
        assert_eq!(t(vec![sw("a", &[0])], vec![]), BadLid(0));
        assert_eq!(t(vec![sw("a", &[SM_LID])], vec![]), BadLid(SM_LID));
        assert_eq!(t(vec![sw("a", &[1])], vec![(0, 1)]), BadLink(0));
        assert_eq!(t(vec![sw("a", &[1])], vec![(0, 0)]), SelfLink(0));
        assert_eq!(
            t(vec![sw("a", &[1]), sw("b", &[2])], vec![]),
            Disconnected("b".into())
        );
        let many: Vec<Lid> = (1..=254).collect();
        assert_eq!(
            t(vec![sw("a", &many), sw("b", &[300])], vec![(0, 1)]),
            TooManyPorts("a".into(), 255)
        );
    }

    #[test]
    fn test_unattached_lids_are_not_routed() {
        let t = Topology::new(vec![sw("a", &[1, 2]), sw("b", &[3])], vec![(0, 1)]).unwrap();
        let s = Subnet::new(t, &[1, 3]);
        assert_eq!(s.out_port(0, 2), NO_PORT);
        assert_eq!(s.out_port(0, 3), 3);
        assert!(!s.reaches(1, 2));
    }
}
