//! Live fault injection into a running cluster (`hcabench fault node2 link-down`,
//! `hcabench link down leaf1 leaf2`) and what `hcabench fabric` shows of it: the daemon
//! listens on `control.sock` in the run directory; a client writes one request line and
//! reads one reply line ("ok ..." or "error ...").
//!
//! A request changes the cluster's fault plan while it runs (a cluster started without
//! `--faults` gets an empty plan, seed 0, at the first request), and every change is logged
//! in `faults.jsonl` next to the plan's own decisions. A killed node's guest is stopped by
//! the daemon's main loop, which polls [`FaultHook::due_kills`] for planned and live kills
//! alike.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::hotplug::{self, HotplugError, Monitor};
use hca_model::abi::NUM_VECTORS;
use hca_model::faults::{AdapterEvent, FaultHook, FaultPlan, LinkFaults, LiveFault};
use hca_model::sa::SM_LID;
use hca_model::subnet::SwitchLink;
use hca_model::subnet::{Peer, Subnet};
use hca_model::sync::Unpoisoned;
use hca_model::{AdapterFault, Fabric};

pub const SOCKET: &str = "control.sock";

/// The longest request line the daemon reads.
const MAX_REQUEST: u64 = 4096;

/// Whether the peer of `stream` runs as this process's user (SO_PEERCRED).
fn same_user(stream: &UnixStream) -> bool {
    // SAFETY: getuid cannot fail and has no preconditions.
    cluster::peer_cred(stream).is_some_and(|c| c.uid == unsafe { libc::getuid() })
}

/// What `hcabench fault NODE ACTION` accepts, for errors and --help.
pub const ACTIONS: &str = "link-down, link-up, drop P, duplicate P, reorder P, corrupt P, \
                           delay US [JITTER_US] (these five in any number, one after another), \
                           clear, kill, fatal, reset, unplug, replug";

/// Why the control socket could not be served, or a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot listen on {}: {source}", .socket.display())]
    Listen { socket: PathBuf, source: io::Error },
    #[error("cannot start the control thread: {0}")]
    Thread(#[source] io::Error),
    /// `hcabench fault` found no daemon on the socket.
    #[error("cannot reach the cluster's daemon at {}: {source}", .socket.display())]
    Connect { socket: PathBuf, source: io::Error },
    #[error("cannot send to the daemon: {0}")]
    Send(#[source] io::Error),
    #[error("no reply from the daemon: {0}")]
    Receive(#[source] io::Error),
    /// The daemon refused the request; its words.
    #[error("{0}")]
    Refused(String),
    /// The daemon answered something that is not the protocol.
    #[error("unexpected reply from the daemon: `{0}`")]
    Garbled(String),
}

/// Why the daemon refused a request (the words it sends back with `error`).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(
        "cannot parse `{0}` (want: fault NODE ACTION [ARGS], groups, partitions, partition \
         PKEY FULL LIMITED|remove, counters, registrations, switches or link up|down \
         SWITCH SWITCH [N])"
    )]
    Unparsed(String),
    #[error(
        "the subnet is one switch, with no links between switches to cut ([[switch]] and \
         [[link]] in the cluster file cable several)"
    )]
    OneSwitch,
    #[error("no switch `{name}`; the switches are {known}")]
    NoSwitch { name: String, known: String },
    #[error("no link joins {a} and {b} (`hcabench fabric` lists the links)")]
    NotJoined { a: String, b: String },
    #[error(
        "neither {a} nor {b} is on this host: cut the link on host {hosts} (`hcabench link` \
         there)"
    )]
    NotHere { a: String, b: String, hosts: String },
    #[error("{count} links join {a} and {b}: say which, 1 to {count} in the cluster file's order")]
    WhichLink { a: String, b: String, count: usize },
    #[error("`{n}` is not one of the links joining {a} and {b} (1 to {count})")]
    LinkNumber {
        n: String,
        a: String,
        b: String,
        count: usize,
    },
    #[error("no node `{node}`; the cluster has node1 to node{nodes}")]
    NoNode { node: String, nodes: usize },
    #[error("P_Key `{0}` is not a hex number")]
    PKey(String),
    #[error("no partition {0:#06x}")]
    NoPartition(u16),
    #[error("want: partition PKEY FULL LIMITED, or partition PKEY remove")]
    PartitionUsage,
    #[error(
        "a subnet manager in a guest manages this subnet (sm = \"guest\"): its partitions are \
         that SM's to set (OpenSM's partitions.conf)"
    )]
    GuestSm,
    #[error(transparent)]
    Partitions(#[from] hca_model::partition::PartitionError),
    #[error(transparent)]
    Faults(#[from] crate::faultrun::FaultRunError),
    #[error("unknown action `{0}`; actions: {ACTIONS}")]
    UnknownAction(String),
    #[error("`{0}` is not a probability (0 to 1)")]
    Probability(String),
    #[error("`{0}` is not a number of microseconds")]
    Micros(String),
    #[error("{0} has no adapter on the fabric (not booted yet, or killed)")]
    NoAdapter(String),
    #[error(transparent)]
    Hotplug(#[from] HotplugError),
}

/// The daemon's side: the fabric, the plan on it (if any yet) and where its log goes.
pub struct Control {
    fabric: Fabric,
    hook: Mutex<Option<Arc<FaultHook>>>,
    log_path: PathBuf,
    nodes: usize,
    /// The run directory of QEMU guests, where their monitors and HCA links are
    /// (`unplug`, `replug`); None under a VMM without PCI hot-plug.
    hotplug_dir: Option<PathBuf>,
    /// Each guest's monitor session, kept from its first hot-plug request on.
    monitors: Mutex<HashMap<String, Monitor>>,
}

impl Control {
    pub fn new(
        fabric: Fabric,
        hook: Option<Arc<FaultHook>>,
        log_path: PathBuf,
        nodes: usize,
        hotplug_dir: Option<PathBuf>,
    ) -> Arc<Self> {
        Arc::new(Self {
            fabric,
            hook: Mutex::new(hook),
            log_path,
            nodes,
            hotplug_dir,
            monitors: Mutex::new(HashMap::new()),
        })
    }

    /// The plan on the fabric, if the cluster has one.
    pub fn hook(&self) -> Option<Arc<FaultHook>> {
        self.hook.lock_unpoisoned().clone()
    }

    /// Makes the HCA events the plan has come due (`[[adapter]] fatal_ms`, `reset_ms`,
    /// `unplug_ms`, `replug_ms`) happen: each with what came of it.
    pub fn planned_adapter_events(&self) -> Vec<(u16, AdapterEvent, Result<(), String>)> {
        let Some(h) = self.hook() else {
            return Vec::new();
        };
        let due = h.due_adapter_events(self.fabric.now_ns());
        due.into_iter()
            .map(|(lid, event)| {
                let node = format!("node{lid}");
                let done = match event {
                    AdapterEvent::Fault(f) => match self.fabric.adapter_fault(lid, f) {
                        Some(_) => Ok(()),
                        None => Err(RequestError::NoAdapter(node).to_string()),
                    },
                    AdapterEvent::Unplug | AdapterEvent::Replug => self
                        .hotplug_now(&node, event == AdapterEvent::Unplug)
                        .map_err(|e| e.to_string()),
                };
                (lid, event, done)
            })
            .collect()
    }

    /// Nodes (by index from 0) whose guests must stop now: planned kills that came due and
    /// live ones.
    pub fn due_kills(&self) -> Vec<usize> {
        let Some(h) = self.hook() else {
            return Vec::new();
        };
        h.due_kills(self.fabric.now_ns())
            .into_iter()
            .filter_map(|lid| usize::from(lid).checked_sub(1))
            .filter(|&i| i < self.nodes)
            .collect()
    }

    /// Serves requests on `path` from a thread of its own.
    pub fn serve(self: &Arc<Self>, path: &Path) -> Result<(), ControlError> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|source| ControlError::Listen {
            socket: path.to_path_buf(),
            source,
        })?;
        let me = self.clone();
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                // A client of its own thread each, so a slow one holds up no other.
                for stream in listener.incoming().flatten() {
                    let me = me.clone();
                    let _ = std::thread::Builder::new()
                        .name("control-client".into())
                        .spawn(move || me.answer(stream));
                }
            })
            .map_err(ControlError::Thread)?;
        Ok(())
    }

    fn answer(&self, stream: UnixStream) {
        if !same_user(&stream) {
            eprintln!("daemon: control: a connection from another user, refused");
            return;
        }
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        // One request line, bounded: a client cannot make the daemon buffer without end.
        let mut line = String::new();
        let mut reader = BufReader::new(&stream).take(MAX_REQUEST);
        if reader.read_line(&mut line).is_err() || !line.ends_with('\n') {
            let _ = (&stream).write_all(b"error request too long or cut off\n");
            return;
        }
        let reply = match self.handle(line.trim()) {
            Ok(s) => format!("ok {s}\n"),
            Err(e) => format!("error {e}\n"),
        };
        eprintln!("daemon: control `{}`: {}", line.trim(), reply.trim());
        let _ = (&stream).write_all(reply.as_bytes());
    }

    /// Carries out one request: `fault NODE ACTION [ARGS]`, `groups` (the subnet
    /// administrator's multicast groups) or `registrations` (how many service records and
    /// trap subscriptions it holds, and the subnet's packet lifetime).
    fn handle(&self, line: &str) -> Result<String, RequestError> {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words == ["groups"] {
            return Ok(self.groups());
        }
        if words == ["partitions"] {
            return Ok(self.partitions());
        }
        if let ["partition", pkey, rest @ ..] = words.as_slice() {
            if self.fabric.guest_sm() {
                return Err(RequestError::GuestSm);
            }
            return self.set_partition(pkey, rest);
        }
        if words == ["user-sm"] {
            return Ok(self.user_sm());
        }
        if words == ["counters"] {
            return Ok(self.counters());
        }
        if words == ["switches"] {
            return Ok(self.switches());
        }
        if let ["link", state @ ("up" | "down"), a, b, which @ ..] = words.as_slice() {
            if which.len() <= 1 {
                return self.set_switch_link(*state == "up", a, b, which.first().copied());
            }
        }
        if let ["link", "clear", a, b, which @ ..] = words.as_slice() {
            if which.len() <= 1 {
                return self.switch_link_faults(a, b, which.first().copied(), None);
            }
        }
        if let ["link", "faults", a, b, which, acts @ ..] = words.as_slice() {
            let which = (*which != "-").then_some(*which);
            return self.switch_link_faults(a, b, which, Some(acts));
        }
        if words == ["registrations"] {
            let ((services, informs), life) = self
                .fabric
                .with_sa(|sa| (sa.registrations(), sa.packet_life()));
            return Ok(format!("{services} {informs} {life}"));
        }
        let ["fault", node, action, args @ ..] = words.as_slice() else {
            return Err(RequestError::Unparsed(line.to_string()));
        };
        let lid = self.lid_of(node)?;
        let hook = self.hook_or_start()?;
        if let ("unplug" | "replug", []) = (*action, args) {
            return self.hotplug(node, lid, *action == "unplug", &hook);
        }
        let adapter = match (*action, args) {
            ("fatal", []) => Some(AdapterFault::Fatal),
            ("reset", []) => Some(AdapterFault::Reset),
            _ => None,
        };
        if let Some(fault) = adapter {
            let first = self
                .fabric
                .adapter_fault(lid, fault)
                .ok_or_else(|| RequestError::NoAdapter(node.to_string()))?;
            hook.live(lid, LiveFault::Adapter(fault), self.fabric.now_ns());
            let name = fault.name();
            return Ok(if first {
                format!("{node}: {name}")
            } else {
                format!("{node}: {name} (its adapter was in a catastrophic error already)")
            });
        }
        let change = match (*action, args) {
            ("link-down", []) => LiveFault::LinkDown,
            ("link-up", []) => LiveFault::LinkUp,
            ("clear", []) => LiveFault::Clear,
            ("kill", []) => LiveFault::Kill,
            _ => LiveFault::Rule(rule(hook.live_rule(lid).unwrap_or_default(), &words[2..])?),
        };
        hook.live(lid, change, self.fabric.now_ns());
        Ok(format!("{node}: {}", words[2..].join(" ")))
    }

    /// `partition PKEY FULL LIMITED` (comma-separated node names, `-` for none) sets that
    /// partition's members, replacing the ones it had; `partition PKEY remove` removes it.
    /// The other partitions stay as they are, in their order (a new one comes last, so the
    /// entries ports had keep their places).
    fn set_partition(&self, pkey: &str, rest: &[&str]) -> Result<String, RequestError> {
        let pkey = u16::from_str_radix(pkey.trim_start_matches("0x"), 16)
            .map_err(|_| RequestError::PKey(pkey.to_string()))?;
        let id = pkey & 0x7fff;
        let mut parts = self.fabric.partitions();
        let at = parts.iter().position(|p| p.pkey & 0x7fff == id);
        let lids = |names: &str| -> Result<Vec<u16>, RequestError> {
            if names == "-" {
                return Ok(Vec::new());
            }
            names.split(',').map(|n| self.lid_of(n)).collect()
        };
        let what = match (rest, at) {
            (["remove"], Some(i)) => {
                parts.remove(i);
                "removed".to_string()
            }
            (["remove"], None) => return Err(RequestError::NoPartition(pkey)),
            ([full, limited], _) => {
                let p = hca_model::partition::Partition {
                    pkey: pkey | hca_model::partition::FULL_MEMBER,
                    members: lids(full)?,
                    limited: lids(limited)?,
                };
                let what = format!("full: {full}, limited: {limited}");
                match at {
                    Some(i) => {
                        if let Some(slot) = parts.get_mut(i) {
                            *slot = p;
                        }
                    }
                    None => parts.push(p),
                }
                what
            }
            _ => return Err(RequestError::PartitionUsage),
        };
        self.fabric.set_partitions(&parts)?;
        Ok(format!("partition {:#06x} {what}", pkey | 0x8000))
    }

    /// Every node's port counters on one line: `NODE V0 V1 ...` per node in
    /// [`hca_model::abi::COUNTER_NAMES`] order, `;` between nodes; a node whose HCA is not
    /// on the fabric (its guest not connected yet, or killed) is `NODE -`.
    fn counters(&self) -> String {
        (1..=self.nodes as u16)
            .map(|lid| match self.fabric.counters(lid) {
                Some(c) => {
                    let values: Vec<String> = c.iter().map(u64::to_string).collect();
                    format!("node{lid} {}", values.join(" "))
                }
                None => format!("node{lid} -"),
            })
            .collect::<Vec<_>>()
            .join(";")
    }

    /// The partitions beside the default on one line: `PKEY FULL LIMITED` per partition,
    /// `;` between them, members as node names (`-` for none).
    fn partitions(&self) -> String {
        let names = |lids: &[u16]| {
            if lids.is_empty() {
                "-".to_string()
            } else {
                let n: Vec<String> = lids.iter().map(|l| format!("node{l}")).collect();
                n.join(",")
            }
        };
        (self.fabric.partitions().iter())
            .map(|p| {
                format!(
                    "{:#06x} {} {}",
                    p.pkey,
                    names(&p.members),
                    names(&p.limited)
                )
            })
            .collect::<Vec<_>>()
            .join(";")
    }

    /// The SA's groups on one line: `MGID MLID QKEY MEMBERS` per group, `;` between
    /// groups, members as node names (`-` for none).
    fn groups(&self) -> String {
        let name = |guid: u64| {
            (1..=self.nodes as u16)
                .find(|&l| hca_model::abi::node_guid(l) == guid)
                .map_or(format!("{guid:#x}"), |l| format!("node{l}"))
        };
        self.fabric.with_sa(|sa| {
            sa.groups()
                .map(|g| {
                    let members: Vec<String> = g.members.keys().map(|&m| name(m)).collect();
                    format!(
                        "{} {:#06x} {:#x} {}",
                        gid_text(&g.mgid),
                        g.mlid,
                        g.qkey,
                        if members.is_empty() {
                            "-".to_string()
                        } else {
                            members.join(",")
                        }
                    )
                })
                .collect::<Vec<_>>()
                .join(";")
        })
    }

    /// The subnet on one line, `;` between entries: `switch NAME LID SM NODES` per switch
    /// (the default one's NAME is `-`; SM is `reached` or `cut-off`: whether the SM's
    /// packets get to it now; NODES `node1:1,node2:2`, each with its port, or `-`), then
    /// `link N A:PORT B:PORT up|down AB BA` per inter-switch link, numbered from 1, where
    /// AB is `PACKETS/LOST` from A to B as this host counted them (sent, where A is
    /// here; else arrived; LOST `-` where B is on another host, which counts them), and
    /// BA the other way.
    /// Under a user's SM (`sm = "guest"`), what it set in each switch, `;` between
    /// switches: `NAME LID SM_LID TOP MLIDS PORTS` (the default switch's NAME is `-`),
    /// PORTS `node1:1:STATE,...` for HCA ports and `@NAME:PORT:STATE` for a link to switch
    /// NAME (STATE a PortState number, 1 while the link is down), or `-`; empty under the
    /// fabric's own SM.
    fn user_sm(&self) -> String {
        let subnet = self.fabric.subnet();
        let f: &dyn hca_model::sa::Ports = &self.fabric;
        let mut out = Vec::new();
        for (i, sw) in subnet.switches().iter().enumerate() {
            let Some(t) = self.fabric.user_sm_tables(i) else {
                return String::new();
            };
            let ports: Vec<String> = (1..=sw.num_ports)
                .filter_map(|p| {
                    let (name, up) = match sw.peer(p) {
                        Peer::Hca(l) if usize::from(l) <= self.nodes => {
                            (format!("node{l}"), f.guid_of(l).is_some() && f.link_up(l))
                        }
                        Peer::Switch { sw: far, link, .. } => (
                            format!("@{}", name_or_dash(&subnet.switch(far)?.name)),
                            subnet.link_up(link) == Some(true),
                        ),
                        _ => return None,
                    };
                    Some(format!(
                        "{name}:{p}:{}",
                        if up { t.port_state(p) } else { 1 }
                    ))
                })
                .collect();
            out.push(format!(
                "{} {} {} {} {} {}",
                name_or_dash(&sw.name),
                sw.lid,
                t.sm_lid(),
                t.top(),
                t.mlids(),
                if ports.is_empty() {
                    "-".to_string()
                } else {
                    ports.join(",")
                }
            ));
        }
        out.join(";")
    }

    fn switches(&self) -> String {
        let subnet = self.fabric.subnet();
        let mut out: Vec<String> = (subnet.switches().iter())
            .map(|sw| {
                let nodes: Vec<String> = (1..=sw.num_ports)
                    .filter_map(|p| match sw.peer(p) {
                        Peer::Hca(l) if usize::from(l) <= self.nodes => {
                            Some(format!("node{l}:{p}"))
                        }
                        _ => None,
                    })
                    .collect();
                let reached = subnet.reaches(SM_LID, sw.lid) && subnet.reaches(sw.lid, SM_LID);
                format!(
                    "switch {} {} {} {}",
                    if sw.name.is_empty() { "-" } else { &sw.name },
                    sw.lid,
                    if reached { "reached" } else { "cut-off" },
                    if nodes.is_empty() {
                        "-".to_string()
                    } else {
                        nodes.join(",")
                    }
                )
            })
            .collect();
        for (k, &(a, b)) in subnet.topology().links().iter().enumerate() {
            let end = |sw: usize| {
                let name = subnet.switch(sw).map_or("?", |s| s.name.as_str());
                format!("{name}:{}", link_port(&subnet, sw, k).unwrap_or(0))
            };
            let up = subnet.link_up(k) == Some(true);
            // Each way as this host saw it: sent from a switch here, or received at one.
            let way = |forward: bool| {
                let st = self
                    .fabric
                    .switch_link_stats(SwitchLink { link: k, forward })
                    .unwrap_or_default();
                let (from, to) = if forward { (a, b) } else { (b, a) };
                let pkts = if subnet.is_local(from) {
                    st.xmit_pkts
                } else {
                    st.rcv_pkts
                };
                // What the hook lost, the host the way goes into counted.
                if subnet.is_local(to) {
                    format!("{pkts}/{}", st.discards)
                } else {
                    format!("{pkts}/-")
                }
            };
            out.push(format!(
                "link {} {} {} {} {} {}",
                k + 1,
                end(a),
                end(b),
                if up { "up" } else { "down" },
                way(true),
                way(false)
            ));
        }
        out.join(";")
    }

    /// The inter-switch link joining switches A and B (the Nth of those that do, in the
    /// cluster file's order, where several do), at a switch of this host: (its index, A's
    /// index, B's).
    fn switch_link(
        &self,
        subnet: &hca_model::subnet::Subnet,
        a: &str,
        b: &str,
        which: Option<&str>,
    ) -> Result<(usize, usize, usize), RequestError> {
        let topology = subnet.topology();
        if topology.is_single() {
            return Err(RequestError::OneSwitch);
        }
        let switches = topology.switches();
        let index = |name: &str| {
            (switches.iter().position(|s| s.name == name)).ok_or_else(|| {
                let known: Vec<&str> = switches.iter().map(|s| s.name.as_str()).collect();
                RequestError::NoSwitch {
                    name: name.to_string(),
                    known: known.join(", "),
                }
            })
        };
        let (ia, ib) = (index(a)?, index(b)?);
        let joining: Vec<usize> = (topology.links().iter().enumerate())
            .filter(|(_, &(x, y))| (x, y) == (ia, ib) || (x, y) == (ib, ia))
            .map(|(k, _)| k)
            .collect();
        let (a, b) = (a.to_string(), b.to_string());
        let count = joining.len();
        let k = match (which, joining.as_slice()) {
            (_, []) => return Err(RequestError::NotJoined { a, b }),
            (None, [k]) => *k,
            (None, _) => return Err(RequestError::WhichLink { a, b, count }),
            (Some(n), _) => {
                let at = n.parse::<usize>().ok().and_then(|n| n.checked_sub(1));
                *at.and_then(|i| joining.get(i))
                    .ok_or_else(|| RequestError::LinkNumber {
                        n: n.to_string(),
                        a: a.clone(),
                        b: b.clone(),
                        count,
                    })?
            }
        };
        // On a subnet that spans hosts, a host cuts only the links at its own switches.
        if !(subnet.is_local(ia) || subnet.is_local(ib)) {
            let mut hosts = vec![topology.host_of(ia), topology.host_of(ib)];
            hosts.dedup();
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            return Err(RequestError::NotHere {
                a,
                b,
                hosts: hosts.join(" or "),
            });
        }
        Ok((k, ia, ib))
    }

    /// `link up|down A B [N]`: the inter-switch link joining switches A and B (the Nth of
    /// those that do, in the cluster file's order, where several do) cut or restored. The
    /// cut takes effect at once; the SM routes around it at the fabric's next tick.
    fn set_switch_link(
        &self,
        up: bool,
        a: &str,
        b: &str,
        which: Option<&str>,
    ) -> Result<String, RequestError> {
        let subnet = self.fabric.subnet();
        let (k, ia, ib) = self.switch_link(&subnet, a, b, which)?;
        let (a, b) = (a.to_string(), b.to_string());
        let was = subnet.link_up(k) == Some(up);
        // (The topology and its links never change under a running cluster.)
        if self.fabric.set_switch_link(k, up).is_none() {
            return Err(RequestError::NotJoined { a, b });
        }
        let ports = |sw| link_port(&subnet, sw, k).unwrap_or(0);
        Ok(format!(
            "link {} ({a} port {} - {b} port {}) {}{}: at the fabric's next tick the SM {}",
            k + 1,
            ports(ia),
            ports(ib),
            if up { "up" } else { "down" },
            if was { " (it was already)" } else { "" },
            if up {
                "routes over it again"
            } else {
                "routes around it where the subnet allows"
            }
        ))
    }

    /// `link faults A B N|- RULE...`: the link follows RULE (`hcabench fault`'s words)
    /// both ways from now, on top of the last rule set; `link clear A B [N]` (`acts` None):
    /// back to the plan's rules.
    fn switch_link_faults(
        &self,
        a: &str,
        b: &str,
        which: Option<&str>,
        acts: Option<&[&str]>,
    ) -> Result<String, RequestError> {
        let subnet = self.fabric.subnet();
        let (k, ..) = self.switch_link(&subnet, a, b, which)?;
        let hook = self.hook_or_start()?;
        let now = self.fabric.now_ns();
        let Some(acts) = acts else {
            hook.live_switch_link(k, None, now);
            return Ok(format!(
                "link {} ({a} - {b}): the fault plan's rules",
                k + 1
            ));
        };
        let r = rule(hook.live_switch_rule(k).unwrap_or_default(), acts)?;
        let what = format!(
            "link {} ({a} - {b}): drop {} duplicate {} reorder {} corrupt {} delay {} us \
             jitter {} us, both ways{}",
            k + 1,
            r.drop,
            r.duplicate,
            r.reorder,
            r.corrupt,
            r.delay_us,
            r.jitter_us,
            if subnet.topology().spans_hosts()
                && subnet
                    .link_ends(k)
                    .is_some_and(|((x, _), (y, _))| { !(subnet.is_local(x) && subnet.is_local(y)) })
            {
                " (into this host's switch: the other host judges what comes into its own)"
            } else {
                ""
            }
        );
        hook.live_switch_link(k, Some(r), now);
        Ok(what)
    }

    /// Hot-unplugs node's HCA, or plugs a new one into its slot, through its QEMU monitor.
    fn hotplug_now(&self, node: &str, unplug: bool) -> Result<(), HotplugError> {
        let Some(dir) = &self.hotplug_dir else {
            return Err(HotplugError::Unsupported {
                node: node.to_string(),
            });
        };
        let mut monitors = self.monitors.lock_unpoisoned();
        let m = monitors
            .entry(node.to_string())
            .or_insert_with(|| Monitor::new(node, hotplug::qmp_socket(dir, node)));
        if unplug {
            m.unplug_hca()
        } else {
            m.replug_hca(&hotplug::hca_socket(dir, node), NUM_VECTORS)
        }
    }

    /// `fault NODE unplug|replug`: the hot-plug, logged.
    fn hotplug(
        &self,
        node: &str,
        lid: u16,
        unplug: bool,
        hook: &FaultHook,
    ) -> Result<String, RequestError> {
        self.hotplug_now(node, unplug)?;
        let change = if unplug {
            LiveFault::Unplug
        } else {
            LiveFault::Replug
        };
        hook.live(lid, change, self.fabric.now_ns());
        Ok(if unplug {
            format!("{node}: unplug (its guest released its HCA, which left the fabric)")
        } else {
            format!("{node}: replug (a new HCA in its slot; its guest probes it)")
        })
    }

    fn lid_of(&self, node: &str) -> Result<u16, RequestError> {
        node.strip_prefix("node")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=self.nodes).contains(n))
            .map(|n| n as u16)
            .ok_or_else(|| RequestError::NoNode {
                node: node.to_string(),
                nodes: self.nodes,
            })
    }

    /// The cluster's plan, or an empty one started now.
    fn hook_or_start(&self) -> Result<Arc<FaultHook>, RequestError> {
        let mut slot = self.hook.lock_unpoisoned();
        if let Some(h) = slot.as_ref() {
            return Ok(h.clone());
        }
        let h = crate::faultrun::start(&self.log_path, FaultPlan::default(), &self.fabric)?;
        *slot = Some(h.clone());
        Ok(h)
    }
}

/// The port of switch `sw` that inter-switch link `link` takes.
fn link_port(subnet: &Subnet, sw: usize, link: usize) -> Option<u8> {
    let s = subnet.switch(sw)?;
    (1..=s.num_ports).find(|&p| matches!(s.peer(p), Peer::Switch { link: l, .. } if l == link))
}

/// The link's live rule `r` with the rates and the delay that `acts` set (`drop P`,
/// `duplicate P`, `reorder P`, `corrupt P`, `delay US [JITTER_US]`, one after another: a
/// campaign changes several at once), the rest as they were.
fn rule(mut r: LinkFaults, acts: &[&str]) -> Result<LinkFaults, RequestError> {
    let unknown = || RequestError::UnknownAction(acts.join(" "));
    if acts.is_empty() {
        return Err(unknown());
    }
    let mut rest = acts;
    while let [name, tail @ ..] = rest {
        rest = match (*name, tail) {
            (rate @ ("drop" | "duplicate" | "reorder" | "corrupt"), [p, more @ ..]) => {
                let p = probability(p)?;
                match rate {
                    "drop" => r.drop = p,
                    "duplicate" => r.duplicate = p,
                    "reorder" => r.reorder = p,
                    _ => r.corrupt = p,
                }
                more
            }
            ("delay", [us, more @ ..]) => {
                r.delay_us = micros(us)?;
                // The jitter is the number after the delay, if one follows.
                match more {
                    [j, after @ ..] if j.parse::<u64>().is_ok() => {
                        r.jitter_us = micros(j)?;
                        after
                    }
                    _ => {
                        r.jitter_us = 0;
                        more
                    }
                }
            }
            _ => return Err(unknown()),
        };
    }
    Ok(r)
}

fn probability(s: &str) -> Result<f64, RequestError> {
    s.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| RequestError::Probability(s.to_string()))
}

fn micros(s: &str) -> Result<u64, RequestError> {
    s.parse::<u64>()
        .map_err(|_| RequestError::Micros(s.to_string()))
}

/// The client's side: sends `request` to the daemon of the cluster in `run_dir` and returns
/// its reply.
pub fn request(run_dir: &Path, request: &str) -> Result<String, ControlError> {
    let path = run_dir.join(SOCKET);
    let mut s = UnixStream::connect(&path).map_err(|source| ControlError::Connect {
        socket: path.clone(),
        source,
    })?;
    // An unplug waits for the guest to release its HCA.
    let _ = s.set_read_timeout(Some(hotplug::RELEASE_TIMEOUT + Duration::from_secs(30)));
    s.write_all(format!("{request}\n").as_bytes())
        .map_err(ControlError::Send)?;
    let mut reply = String::new();
    BufReader::new(&s)
        .read_line(&mut reply)
        .map_err(ControlError::Receive)?;
    parse_reply(&reply)
}

/// A reply line: `ok [TEXT]` or `error [WHY]`. An empty answer (no partitions, say) is
/// `ok` alone.
fn parse_reply(reply: &str) -> Result<String, ControlError> {
    let line = reply.trim();
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    match word {
        "ok" => Ok(rest.to_string()),
        "error" => Err(ControlError::Refused(rest.to_string())),
        _ => Err(ControlError::Garbled(line.to_string())),
    }
}

/// The reply to `switches` as `hcabench fabric` shows it: a table of the switches, then
/// one of the links between them.
pub fn switches_text(reply: &str) -> String {
    let mut switches = String::new();
    let mut links = String::new();
    for entry in reply.split(';') {
        match entry.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["switch", name, lid, sm, nodes] => {
                let lid_hex = lid
                    .parse::<u16>()
                    .map_or(String::new(), |l| format!("{l:#06x}"));
                let sm = if *sm == "reached" {
                    "reaches"
                } else {
                    "cut off"
                };
                let nodes = if *nodes == "-" {
                    "none".to_string()
                } else {
                    let on: Vec<String> = (nodes.split(','))
                        .map(|n| match n.split_once(':') {
                            Some((node, port)) => format!("{node} ({port})"),
                            None => n.to_string(),
                        })
                        .collect();
                    on.join(", ")
                };
                switches += &format!("  {name:<16} {lid:>5} {lid_hex:<6}  {sm:<8}  {nodes}\n");
            }
            ["link", n, a, b, state, ways @ ..] => {
                let end = |e: &str| match e.split_once(':') {
                    Some((sw, port)) => format!("{sw} port {port}"),
                    None => e.to_string(),
                };
                let ends = format!("{} - {}", end(a), end(b));
                let way = |w: Option<&&str>| {
                    let (pkts, lost) = w.and_then(|w| w.split_once('/')).unwrap_or(("-", "-"));
                    format!("{pkts:>10} {lost:>7}")
                };
                links += &format!(
                    "  {n:>3}  {ends:<40} {state:<5} {} {}\n",
                    way(ways.first()),
                    way(ways.get(1))
                );
            }
            _ => {}
        }
    }
    let mut out = String::from(
        "switches (the first runs the SM, which programs min-hop forwarding tables):\n",
    );
    out += &format!(
        "  {:<16} {:>5} {:<6}  {:<8}  nodes (port)\n",
        "switch", "LID", "", "the SM"
    );
    out += &switches;
    if links.is_empty() {
        out += "links between switches: none ([[switch]] and [[link]] in the cluster file)\n";
    } else {
        out += "links between switches (`hcabench link down|up SWITCH SWITCH [N]`); packets \
                since boot, there (first switch to second) and back, as this host counted \
                them, and how many each way lost:\n";
        out += &format!(
            "  {:>3}  {:<40} {:<5} {:>10} {:>7} {:>10} {:>7}\n",
            "", "", "state", "there", "lost", "back", "lost"
        );
        out += &links;
    }
    out
}

/// A GID as IPv6 text, in full groups (ff12:401b:ffff:0000:...).
pub fn gid_text(gid: &[u8; 16]) -> String {
    gid.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// A switch's name as the replies give it: `-` for the default switch's empty one.
fn name_or_dash(name: &str) -> &str {
    if name.is_empty() {
        "-"
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_reply_may_carry_nothing() {
        assert_eq!(parse_reply("ok\n").unwrap(), "");
        assert_eq!(
            parse_reply("ok 0x8001 node1 -\n").unwrap(),
            "0x8001 node1 -"
        );
        assert!(
            matches!(parse_reply("error no such node\n"), Err(ControlError::Refused(w)) if w == "no such node")
        );
        assert!(matches!(
            parse_reply("huh\n"),
            Err(ControlError::Garbled(_))
        ));
    }

    fn control(tag: &str) -> (Arc<Control>, PathBuf) {
        let dir = std::env::temp_dir().join(format!("hcab-control-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Control::new(
            Fabric::with_manual_clock(),
            None,
            dir.join("faults.jsonl"),
            3,
            None,
        );
        (c, dir)
    }

    #[test]
    fn test_counters_give_every_nodes_port_counters_in_order() {
        use hca_model::abi::*;
        use hca_test_driver::*;
        let mut p = Pair::new(MTU_4096 as u8);
        let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
        p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
        let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
        wr.num_sge = 1;
        p.a.post_send(&mut p.qa, wr, &[sge(src, 8, p.key_a)]);
        assert!(p.a.poll_cq(&mut p.cq_a).is_some());
        let dir = std::env::temp_dir().join(format!("hcab-counters-{}", std::process::id()));
        // A third node whose HCA is not on the fabric.
        let c = Control::new(p.fabric.clone(), None, dir.join("faults.jsonl"), 3, None);
        let reply = c.handle("counters").unwrap();
        let nodes: Vec<Vec<&str>> = reply.split(';').map(|n| n.split(' ').collect()).collect();
        assert_eq!(nodes.len(), 3, "{reply}");
        assert_eq!(nodes[2], ["node3", "-"]);
        for (i, n) in nodes.iter().take(2).enumerate() {
            assert_eq!(n.len(), 1 + COUNTER_NAMES.len(), "{reply}");
            assert_eq!(n[0], format!("node{}", i + 1));
        }
        let at = |node: usize, ctr: u32| nodes[node][1 + ctr as usize];
        // The SEND one way, its ACK the other.
        assert_eq!(at(0, CTR_TX_PACKETS), "1", "{reply}");
        assert_eq!(at(1, CTR_RX_PACKETS), "1", "{reply}");
        assert_eq!(at(1, CTR_TX_PACKETS), "1", "{reply}");
        assert_eq!(at(0, CTR_RETRANSMITS), "0", "{reply}");
    }

    #[test]
    fn test_planned_adapter_events_happen_or_say_why_not() {
        use hca_model::abi::*;
        use hca_test_driver::*;
        let p = Pair::new(MTU_4096 as u8);
        let plan = FaultPlan::parse(
            "[[adapter]]\nlid = 2\nreset_ms = 0\n[[adapter]]\nlid = 1\nunplug_ms = 0\n",
        )
        .unwrap();
        let hook = Arc::new(FaultHook::new(plan, None));
        p.fabric.set_hook(Some(hook.clone()));
        let dir = std::env::temp_dir().join(format!("hcab-planned-{}", std::process::id()));
        // No hot-plug directory: the cluster runs under a VMM without PCI hot-plug.
        let c = Control::new(p.fabric.clone(), Some(hook), dir.join("f.jsonl"), 3, None);
        let mut done = c.planned_adapter_events();
        done.sort_by_key(|(lid, ..)| *lid);
        assert_eq!(done.len(), 2, "{done:?}");
        assert_eq!((done[0].0, done[0].1), (1, AdapterEvent::Unplug));
        let why = done[0].2.as_ref().unwrap_err();
        assert!(why.contains("needs the qemu backend"), "{why}");
        assert_eq!(
            done[1],
            (2, AdapterEvent::Fault(AdapterFault::Reset), Ok(()))
        );
        assert_eq!(p.b.hca.catastrophic_syndrome(), CATAS_RESET);
        assert!(c.planned_adapter_events().is_empty(), "each comes due once");
    }

    #[test]
    fn test_fatal_and_reset_fault_the_nodes_adapter() {
        use hca_model::abi::*;
        use hca_test_driver::*;
        let p = Pair::new(MTU_4096 as u8);
        let dir = std::env::temp_dir().join(format!("hcab-fatal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Control::new(p.fabric.clone(), None, dir.join("faults.jsonl"), 3, None);
        assert_eq!(c.handle("fault node2 fatal").unwrap(), "node2: fatal");
        assert_eq!(p.b.hca.catastrophic_syndrome(), CATAS_INJECTED);
        assert_eq!(
            p.a.hca.catastrophic_syndrome(),
            0,
            "node1's adapter is fine"
        );
        let again = c.handle("fault node2 fatal").unwrap();
        assert!(again.contains("already"), "{again}");
        // A reset underneath the driver forgets the error, and holds the function until
        // the driver's own reset.
        assert!(c.handle("fault node2 reset").unwrap().contains("already"));
        assert_eq!(p.b.hca.catastrophic_syndrome(), CATAS_RESET);
        assert_eq!(c.handle("fault node1 reset").unwrap(), "node1: reset");
        assert_eq!(p.a.hca.catastrophic_syndrome(), CATAS_RESET);
        // node3 has no HCA on the fabric.
        let e = c.handle("fault node3 fatal").unwrap_err().to_string();
        assert!(e.contains("no adapter"), "{e}");
        let h = c.hook().unwrap();
        h.flush();
        let log = std::fs::read_to_string(dir.join("faults.jsonl")).unwrap();
        assert_eq!(log.matches("\"live\":\"fatal\"").count(), 2, "{log}");
        assert_eq!(log.matches("\"live\":\"reset\"").count(), 2, "{log}");
        assert_eq!(h.counts().adapters_reset, 2);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn test_requests_change_the_plan_and_bad_ones_say_why() {
        let (c, dir) = control("requests");
        assert!(c.hook().is_none());
        assert_eq!(
            c.handle("fault node2 link-down").unwrap(),
            "node2: link-down"
        );
        let h = c.hook().expect("the first request starts an empty plan");
        c.handle("fault node2 drop 0.25").unwrap();
        c.handle("fault node2 delay 300 50").unwrap();
        let r = h.live_rule(2).unwrap();
        assert_eq!((r.drop, r.delay_us, r.jitter_us), (0.25, 300, 50));
        // Several in one request; what it leaves out stays as it was.
        assert_eq!(
            c.handle("fault node2 reorder 0.05 delay 10 duplicate 0.02 corrupt 0.01")
                .unwrap(),
            "node2: reorder 0.05 delay 10 duplicate 0.02 corrupt 0.01"
        );
        let r = h.live_rule(2).unwrap();
        assert_eq!(
            (r.drop, r.reorder, r.duplicate, r.corrupt),
            (0.25, 0.05, 0.02, 0.01)
        );
        assert_eq!((r.delay_us, r.jitter_us), (10, 0));
        let e = c
            .handle("fault node2 drop 0.5 reorder")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown action"), "{e}");
        let e = c
            .handle("fault node2 drop 0.5 link-down")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown action"), "{e}");
        assert_eq!(
            h.live_rule(2).unwrap().drop,
            0.25,
            "a refused request changes nothing"
        );
        c.handle("fault node3 kill").unwrap();
        assert_eq!(c.due_kills(), [2], "node3 is index 2");
        assert!(c.due_kills().is_empty());
        let e = c.handle("fault node4 kill").unwrap_err().to_string();
        assert!(e.contains("node1 to node3"), "{e}");
        let e = c.handle("fault node1 drop 2").unwrap_err().to_string();
        assert!(e.contains("probability"), "{e}");
        let e = c.handle("fault node1 explode").unwrap_err().to_string();
        assert!(e.contains("actions: link-down"), "{e}");
        h.flush();
        let log = std::fs::read_to_string(dir.join("faults.jsonl")).unwrap();
        assert_eq!(log.lines().count(), 5, "{log}");
        assert!(log.contains("\"live\":\"link-down\"") && log.contains("\"live\":\"kill\""));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A control on a ring of three switches, node n alone on switch s(n-1), with a
    /// second link between s0 and s1 (link 4).
    fn ring_control(tag: &str) -> (Arc<Control>, PathBuf) {
        use hca_model::subnet::{SwitchSpec, Topology};
        let (c, dir) = control(tag);
        let sw = |i: u16| SwitchSpec {
            name: format!("s{i}"),
            hcas: vec![i + 1],
        };
        let t = Topology::new(
            vec![sw(0), sw(1), sw(2)],
            vec![(0, 1), (1, 2), (2, 0), (0, 1)],
        )
        .unwrap();
        c.fabric.set_topology(t);
        (c, dir)
    }

    #[test]
    fn test_under_a_guest_sm_the_switch_shows_its_ports_and_partitions_are_refused() {
        use hca_test_driver::Driver;
        let (c, dir) = control("user-sm");
        assert_eq!(c.handle("user-sm").unwrap(), "", "the fabric's own SM");
        c.fabric.set_guest_sm().unwrap();
        let _nodes: Vec<Driver> = (0..2).map(|_| Driver::new(Some(&c.fabric), 4)).collect();
        assert_eq!(
            c.handle("user-sm").unwrap(),
            "- 49151 0 0 0 node1:1:2,node2:2:2",
            "no SM yet: every port INIT"
        );
        let e = c.handle("partition 0x8001 node1 -").unwrap_err();
        assert!(e.to_string().contains("partitions.conf"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
        // Several switches: each with its nodes and its links' ports.
        let (c, dir) = ring_control("user-sm");
        c.fabric.set_guest_sm().unwrap();
        let _nodes: Vec<Driver> = (0..3).map(|_| Driver::new(Some(&c.fabric), 4)).collect();
        let reply = c.handle("user-sm").unwrap();
        let entries: Vec<&str> = reply.split(';').collect();
        assert_eq!(
            entries,
            [
                "s0 49151 0 0 0 node1:1:2,@s1:2:2,@s2:3:2,@s1:4:2",
                "s1 49150 0 0 0 node2:1:2,@s0:2:2,@s2:3:2,@s0:4:2",
                "s2 49149 0 0 0 node3:1:2,@s1:2:2,@s0:3:2",
            ]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn test_switches_list_every_switch_and_link_as_the_sm_sees_them() {
        let (c, dir) = ring_control("switches");
        let reply = c.handle("switches").unwrap();
        let entries: Vec<&str> = reply.split(';').collect();
        assert_eq!(
            entries,
            [
                "switch s0 49151 reached node1:1",
                "switch s1 49150 reached node2:1",
                "switch s2 49149 reached node3:1",
                "link 1 s0:2 s1:2 up 0/0 0/0",
                "link 2 s1:3 s2:2 up 0/0 0/0",
                "link 3 s2:3 s0:3 up 0/0 0/0",
                "link 4 s0:4 s1:4 up 0/0 0/0",
            ]
        );
        let text = switches_text(&reply);
        for want in [
            "  s1               49150 0xbffe  reaches   node2 (1)\n",
            "    4  s0 port 4 - s1 port 4",
        ] {
            assert!(text.contains(want), "{want:?}:\n{text}");
        }
        // The default: one switch, node n on port n, no links.
        let (one, one_dir) = control("one-switch");
        let reply = one.handle("switches").unwrap();
        assert_eq!(
            reply, "switch - 49151 reached node1:1",
            "a port at least, for LID 1"
        );
        assert!(switches_text(&reply).contains("links between switches: none"));
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(one_dir);
    }

    #[test]
    fn test_a_live_rule_on_a_switch_link_loses_what_crosses_it_until_cleared() {
        use hca_model::abi::*;
        use hca_test_driver::*;
        let (c, dir) = ring_control("link-faults");
        let fabric = c.fabric.clone();
        // Node 1 on s0, node 2 on s1: two links join s0 and s1, both lose everything.
        let mut p = Pair::build(fabric.clone(), MTU_4096 as u8, ALL_ACCESS, (12, 7, 7));
        for n in ["1", "2"] {
            let reply = c.handle(&format!("link faults s0 s1 {n} drop 1")).unwrap();
            assert!(reply.contains("drop 1 duplicate 0"), "{reply}");
        }
        let e = c.handle("link faults s0 s1 - drop 1").unwrap_err();
        assert!(e.to_string().contains("say which"), "{e}");
        let e = c.handle("link faults s1 s2 - drop 2").unwrap_err();
        assert!(e.to_string().contains("probability"), "{e}");
        let (src, dst) = (p.a.alloc(4096, 64), p.b.alloc(4096, 64));
        let mut w = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, p.key_b);
        p.a.post_send(&mut p.qa, w, &[sge(src, 4096, p.key_a)]);
        for _ in 0..5 {
            fabric.advance(Duration::from_millis(1));
        }
        assert!(p.a.drain_cq(&mut p.cq_a).is_empty(), "lost on the link");
        let lost: u64 = [0, 3]
            .into_iter()
            .map(|link| {
                let way = hca_model::subnet::SwitchLink {
                    link,
                    forward: true,
                };
                fabric.switch_link_stats(way).unwrap().discards
            })
            .sum();
        assert!(lost >= 1, "counted where it was lost");
        for n in ["1", "2"] {
            let reply = c.handle(&format!("link clear s1 s0 {n}")).unwrap();
            assert!(reply.ends_with("the fault plan's rules"), "{reply}");
        }
        // The sender's retransmission gets through now.
        let mut got = Vec::new();
        for _ in 0..200 {
            fabric.advance(Duration::from_millis(1));
            got.extend(p.a.drain_cq(&mut p.cq_a));
            if !got.is_empty() {
                break;
            }
        }
        assert_eq!((got.len(), got.first().map(|c| c.status)), (1, Some(0)));
        let log = std::fs::read_to_string(dir.join("faults.jsonl")).unwrap_or_default();
        assert!(
            log.contains("switch-link1") && log.contains("\"clear\""),
            "{log}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn test_a_switch_link_is_cut_and_restored_by_the_names_of_its_switches() {
        let (c, dir) = ring_control("link");
        let fabric = c.fabric.clone();
        let reply = c.handle("link down s1 s2").unwrap();
        assert!(
            reply.starts_with(
                "link 2 (s1 port 3 - s2 port 2) down: at the fabric's next tick the SM routes \
                 around it where the subnet allows"
            ),
            "{reply}"
        );
        assert_eq!(fabric.subnet().link_up(1), Some(false), "at once");
        let again = c.handle("link down s2 s1").unwrap();
        assert!(again.contains("down (it was already)"), "{again}");
        // s1 has two links to s0: which one must be said.
        let e = c.handle("link down s0 s1").unwrap_err().to_string();
        assert!(e.contains("2 links join s0 and s1: say which"), "{e}");
        let sweeps = fabric.subnet().sweeps();
        assert!(c
            .handle("link down s1 s0 2")
            .unwrap()
            .starts_with("link 4 "));
        assert!(c
            .handle("link down s0 s1 1")
            .unwrap()
            .starts_with("link 1 "));
        // The SM's sweep at the next tick finds s1 cut off; its reply says so.
        fabric.advance(Duration::from_millis(1));
        assert!(fabric.subnet().sweeps() > sweeps, "the tick swept");
        let reply = c.handle("switches").unwrap();
        assert!(reply.contains("switch s1 49150 cut-off node2:1"), "{reply}");
        assert!(reply.contains("link 4 s0:4 s1:4 down"), "{reply}");
        assert_eq!(
            c.handle("link up s0 s1 2").unwrap(),
            "link 4 (s0 port 4 - s1 port 4) up: at the fabric's next tick the SM routes over \
             it again"
        );
        fabric.advance(Duration::from_millis(1));
        let reply = c.handle("switches").unwrap();
        assert!(reply.contains("switch s1 49150 reached"), "{reply}");
        for (request, says) in [
            (
                "link down s0 s9",
                "no switch `s9`; the switches are s0, s1, s2",
            ),
            ("link down s0 s0", "no link joins s0 and s0"),
            (
                "link down s0 s1 3",
                "`3` is not one of the links joining s0 and s1 (1 to 2)",
            ),
            ("link down s0 s1 0", "`0` is not one of the links"),
            ("link sideways s0 s1", "cannot parse"),
            ("link down s0 s1 1 2", "cannot parse"),
        ] {
            let e = c.handle(request).unwrap_err().to_string();
            assert!(e.contains(says), "{request}: {e}");
        }
        let (one, one_dir) = control("link-one-switch");
        let e = one.handle("link down a b").unwrap_err().to_string();
        assert!(e.contains("the subnet is one switch"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(one_dir);
    }

    #[test]
    fn test_the_client_talks_to_the_daemon_over_the_socket() {
        let (c, dir) = control("socket");
        c.serve(&dir.join(SOCKET)).unwrap();
        assert_eq!(
            request(&dir, "fault node1 link-up").unwrap(),
            "node1: link-up"
        );
        match request(&dir, "fault nodeX link-up").unwrap_err() {
            ControlError::Refused(e) => assert!(e.contains("no node `nodeX`"), "{e}"),
            e => panic!("not the daemon's refusal: {e}"),
        }
        // A client that connects and says nothing holds up no other one; an endless line
        // is cut off, not buffered.
        let _idle = UnixStream::connect(dir.join(SOCKET)).unwrap();
        assert_eq!(
            request(&dir, "fault node1 link-down").unwrap(),
            "node1: link-down"
        );
        let mut flood = UnixStream::connect(dir.join(SOCKET)).unwrap();
        let _ = flood.write_all(&vec![b'x'; 1 << 20]);
        let mut reply = String::new();
        let _ = BufReader::new(&flood).read_line(&mut reply);
        assert!(reply.starts_with("error request too long"), "{reply}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
