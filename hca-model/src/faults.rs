//! Seeded fault plans: a [`LinkHook`] that drops, duplicates, reorders, delays and corrupts
//! packets, takes links down on a schedule and kills nodes, and an [`AdapterHook`] that makes
//! HCAs fail WQEs, lose doorbells, lose or delay interrupts and overflow CQs. Every decision
//! is drawn from the plan's seed and logged as one JSON line; times in the plan and the log
//! count from the moment the plan starts ([`FaultHook::set_origin`]).
//!
//! A decision is a pure function of (seed, where, the event's index there, the kind of
//! fault), not of a shared random stream, so the k-th packet on a link (or the k-th doorbell
//! of an HCA) meets the same fate in every run with that seed however traffic interleaves: a
//! run replays, and two runs' logs compare line by line per link.
//!
//! Live injection ([`FaultHook::live`]) changes a running plan: a link down or up, a node's
//! link rule replaced, a node killed; each change is logged too.
//!
//! ```toml
//! seed = 42
//! [[link]]              # the first [[link]] naming a link is the one that applies
//! lid = 2               # node2's link (omit: every link)
//! dir = "up"            # "up" (node to switch), "down", or "both" (default)
//! drop = 0.01           # probabilities per packet
//! duplicate = 0.001
//! reorder = 0.01        # held until the next tick, so later packets overtake it
//! corrupt = 0.001       # bits flipped: the receiver drops it for its ICRC
//! delay_us = 200        # every packet, plus up to jitter_us more
//! jitter_us = 100
//! down = [[1000, 1500]] # link down from 1000 ms to 1500 ms after the plan starts
//!
//! [[node]]
//! lid = 3
//! kill_ms = 5000        # node3 dies: its links go dead, its guest is stopped
//!
//! [[adapter]]           # the first [[adapter]] naming an HCA is the one that applies
//! lid = 2               # node2's HCA (omit: every HCA)
//! error_wqe = 100       # the 100th send WQE of each QP (or of `qpn` only) fails, QP to ERR
//! qpn = 5
//! lose_doorbell = 0.01  # probabilities per doorbell / interrupt
//! lose_interrupt = 0.01
//! late_interrupt = 0.1  # this share of interrupts comes late_interrupt_us late
//! late_interrupt_us = 500
//! cq_overflow_after = 1000  # the CQ (`cqn`, or each) overflows at its 1001st CQE
//! ```

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde::Deserialize;

use crate::adapter_hook::{AdapterHook, IrqFate};
use crate::fabric::{LinkDir, LinkHook, LinkId, Verdict};
use crate::packet::Packet;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    pub seed: u64,
    #[serde(rename = "link")]
    pub links: Vec<LinkFaults>,
    #[serde(rename = "node")]
    pub nodes: Vec<NodeFaults>,
    #[serde(rename = "adapter")]
    pub adapters: Vec<AdapterFaults>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeFaults {
    pub lid: u16,
    /// When the node dies, in milliseconds after the plan starts.
    pub kill_ms: f64,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AdapterFaults {
    pub lid: Option<u16>,
    /// The Nth send WQE (from 1) of a QP completes with WC_GENERAL_ERR.
    pub error_wqe: Option<u64>,
    /// Limits `error_wqe` to one QP.
    pub qpn: Option<u32>,
    pub lose_doorbell: f64,
    pub lose_interrupt: f64,
    pub late_interrupt: f64,
    pub late_interrupt_us: u64,
    /// A CQ overflows when it is handed CQE number N + 1.
    pub cq_overflow_after: Option<u64>,
    /// Limits `cq_overflow_after` to one CQ.
    pub cqn: Option<u32>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Dirs {
    Up,
    Down,
    #[default]
    Both,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LinkFaults {
    pub lid: Option<u16>,
    pub dir: Dirs,
    pub drop: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub corrupt: f64,
    pub delay_us: u64,
    pub jitter_us: u64,
    /// [from, to) in milliseconds of fabric time.
    pub down: Vec<[f64; 2]>,
}

impl LinkFaults {
    fn applies(&self, link: LinkId) -> bool {
        let dir = match self.dir {
            Dirs::Both => true,
            Dirs::Up => link.dir == LinkDir::Up,
            Dirs::Down => link.dir == LinkDir::Down,
        };
        dir && self.lid.is_none_or(|l| l == link.lid)
    }
}

impl FaultPlan {
    /// Parses and checks a plan; errors name the field and what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let plan: FaultPlan = toml::from_str(text).map_err(|e| e.to_string())?;
        for (i, l) in plan.links.iter().enumerate() {
            for (name, p) in [
                ("drop", l.drop),
                ("duplicate", l.duplicate),
                ("reorder", l.reorder),
                ("corrupt", l.corrupt),
            ] {
                if !(0.0..=1.0).contains(&p) {
                    return Err(format!(
                        "link {}: {name} = {p} (a probability, 0 to 1)",
                        i + 1
                    ));
                }
            }
            if let Some(w) = l.down.iter().find(|w| !(w[0] >= 0.0 && w[0] < w[1])) {
                return Err(format!(
                    "link {}: down window {w:?} (want [from_ms, to_ms] with from < to)",
                    i + 1
                ));
            }
        }
        for (i, n) in plan.nodes.iter().enumerate() {
            if n.lid == 0 || !(n.kill_ms.is_finite() && n.kill_ms >= 0.0) {
                return Err(format!(
                    "node {}: lid = {}, kill_ms = {} (want a LID from 1 and a time >= 0)",
                    i + 1,
                    n.lid,
                    n.kill_ms
                ));
            }
        }
        for (i, a) in plan.adapters.iter().enumerate() {
            for (name, p) in [
                ("lose_doorbell", a.lose_doorbell),
                ("lose_interrupt", a.lose_interrupt),
                ("late_interrupt", a.late_interrupt),
            ] {
                if !(0.0..=1.0).contains(&p) {
                    return Err(format!(
                        "adapter {}: {name} = {p} (a probability, 0 to 1)",
                        i + 1
                    ));
                }
            }
            if a.error_wqe == Some(0) {
                return Err(format!(
                    "adapter {}: error_wqe counts from 1 (the first WQE)",
                    i + 1
                ));
            }
            if a.late_interrupt > 0.0 && a.late_interrupt_us == 0 {
                return Err(format!(
                    "adapter {}: late_interrupt without late_interrupt_us",
                    i + 1
                ));
            }
        }
        Ok(plan)
    }
}

/// What a plan did, for the end-of-run report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub link_down: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub delayed: u64,
    /// Packets lost to or from a killed node.
    pub node_dead: u64,
    pub nodes_killed: u64,
    pub wqe_errors: u64,
    pub doorbells_lost: u64,
    pub interrupts_lost: u64,
    pub interrupts_late: u64,
    pub cq_overflows: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.link_down
            + self.dropped
            + self.duplicated
            + self.reordered
            + self.corrupted
            + self.delayed
            + self.node_dead
            + self.nodes_killed
            + self.adapter()
    }

    /// Faults of the HCAs themselves.
    pub fn adapter(&self) -> u64 {
        self.wqe_errors
            + self.doorbells_lost
            + self.interrupts_lost
            + self.interrupts_late
            + self.cq_overflows
    }
}

/// A change to a running plan (`hcabench fault NODE ...`).
#[derive(Clone, Debug, PartialEq)]
pub enum LiveFault {
    /// The node's link goes down (both directions) until LinkUp.
    LinkDown,
    LinkUp,
    /// The node's link follows this rule instead of the plan's.
    Rule(LinkFaults),
    /// Back to the plan for this node's link (and its link up).
    Clear,
    /// The node dies: its link goes dead for good.
    Kill,
}

/// Which counter an event advances (its index is the "k-th" a decision depends on).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Stream {
    Link(LinkId),
    Doorbell(u16),
    Interrupt(u16),
    Wqe(u16, u32),
    Cqe(u16, u32),
}

impl Stream {
    /// Distinct bits per stream for the draws.
    fn key(self) -> u64 {
        let (kind, lid, id) = match self {
            Stream::Link(l) => (u64::from(l.dir == LinkDir::Down), l.lid, 0),
            Stream::Doorbell(lid) => (2, lid, 0),
            Stream::Interrupt(lid) => (3, lid, 0),
            Stream::Wqe(lid, qpn) => (4, lid, qpn),
            Stream::Cqe(lid, cqn) => (5, lid, cqn),
        };
        kind << 56 | u64::from(lid) << 40 | u64::from(id)
    }
}

#[derive(Default)]
struct State {
    seen: HashMap<Stream, u64>,
    counts: FaultCounts,
    log: Option<Box<dyn Write + Send>>,
    live_down: HashSet<u16>,
    live_rules: HashMap<u16, LinkFaults>,
    /// Dead nodes and since when (ns after the origin).
    dead: HashMap<u16, u64>,
    /// Kills already handed to whoever stops the guests.
    kills_reported: HashSet<u16>,
}

impl State {
    /// The index of this event in its stream.
    fn next(&mut self, s: Stream) -> u64 {
        let c = self.seen.entry(s).or_insert(0);
        *c += 1;
        *c - 1
    }

    fn log(&mut self, line: &LogLine) {
        if let Some(log) = self.log.as_mut() {
            if serde_json::to_writer(&mut *log, line).is_ok() {
                let _ = log.write_all(b"\n");
            }
        }
    }
}

/// One decision in the JSON-lines log: the time, where (a node, an HCA or a link), what,
/// and the packet or event it hit. Absent fields are left out.
#[derive(Default, serde::Serialize)]
struct LogLine {
    t_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    link: Option<String>,
    /// Which draw of its stream (packet, doorbell, interrupt, WQE, CQE) this was.
    #[serde(skip_serializing_if = "Option::is_none")]
    n: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dlid: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    opcode: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    qpn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    psn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    class: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vector: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cqn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    live: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fault: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_ns: Option<u64>,
}

/// A plan at work: `fabric.set_hook(Some(hook.clone()))` for the links,
/// `fabric.set_adapter_hook(Some(hook))` for the HCAs.
pub struct FaultHook {
    plan: FaultPlan,
    /// Fabric time at which the plan starts; plan and log times count from here.
    origin_ns: AtomicU64,
    state: Mutex<State>,
}

/// A fault the plan injects into one packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    NodeDead,
    LinkDown,
    Corrupt,
    Drop,
    Duplicate,
    Reorder,
    Delay(u64),
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::NodeDead => "node-dead",
            Fault::LinkDown => "link-down",
            Fault::Corrupt => "corrupt",
            Fault::Drop => "drop",
            Fault::Duplicate => "duplicate",
            Fault::Reorder => "reorder",
            Fault::Delay(_) => "delay",
        }
    }

    /// What the fabric does with the packet (a corrupt one travels on, marked).
    fn verdict(self) -> Verdict {
        match self {
            Fault::NodeDead | Fault::LinkDown | Fault::Drop => Verdict::Drop,
            Fault::Corrupt => Verdict::Pass,
            Fault::Duplicate => Verdict::Duplicate,
            // Held until the next tick: later packets overtake it.
            Fault::Reorder => Verdict::Delay(1),
            Fault::Delay(ns) => Verdict::Delay(ns),
        }
    }
}

/// A fault the plan injects into an HCA.
#[derive(Clone, Copy)]
enum AdapterFault {
    WqeError,
    DoorbellLost,
    InterruptLost,
    InterruptLate,
    CqOverflow,
}

/// Which random draw a decision is.
#[derive(Clone, Copy)]
enum Draw {
    Corrupt = 1,
    Drop,
    Duplicate,
    Reorder,
    Jitter,
    Lose,
    Late,
}

/// A uniform number in [0, 1) from (seed, stream, event index, draw): splitmix64's
/// finaliser.
fn uniform(seed: u64, stream: Stream, n: u64, draw: Draw) -> f64 {
    let mut z = seed
        ^ stream.key().rotate_left(7)
        ^ (draw as u64) << 32
        ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

fn dir_name(d: LinkDir) -> &'static str {
    match d {
        LinkDir::Up => "up",
        LinkDir::Down => "down",
    }
}

impl FaultHook {
    /// `log`: where the decisions go, one JSON object a line (None: counted only).
    pub fn new(plan: FaultPlan, log: Option<Box<dyn Write + Send>>) -> Self {
        Self {
            plan,
            origin_ns: AtomicU64::new(0),
            state: Mutex::new(State {
                log,
                ..State::default()
            }),
        }
    }

    /// The plan starts at fabric time `now_ns` (its windows and kills count from here).
    pub fn set_origin(&self, now_ns: u64) {
        self.origin_ns.store(now_ns, Relaxed);
    }

    pub fn seed(&self) -> u64 {
        self.plan.seed
    }

    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plan time (ns since the origin) at fabric time `now_ns`.
    fn plan_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.origin_ns.load(Relaxed))
    }

    /// Pushes buffered log lines out (the end of a run).
    pub fn flush(&self) {
        if let Some(log) = self.lock().log.as_mut() {
            let _ = log.flush();
        }
    }

    /// Applies a live change to node `lid`'s link at fabric time `now_ns`, and logs it.
    pub fn live(&self, lid: u16, change: LiveFault, now_ns: u64) {
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        let what = match &change {
            LiveFault::LinkDown => {
                st.live_down.insert(lid);
                "link-down".to_string()
            }
            LiveFault::LinkUp => {
                st.live_down.remove(&lid);
                "link-up".to_string()
            }
            LiveFault::Rule(r) => {
                st.live_rules.insert(lid, r.clone());
                format!(
                    "rule drop={} duplicate={} reorder={} corrupt={} delay_us={} jitter_us={}",
                    r.drop, r.duplicate, r.reorder, r.corrupt, r.delay_us, r.jitter_us
                )
            }
            LiveFault::Clear => {
                st.live_down.remove(&lid);
                st.live_rules.remove(&lid);
                "clear".to_string()
            }
            LiveFault::Kill => {
                st.dead.entry(lid).or_insert(t);
                st.counts.nodes_killed += 1;
                "kill".to_string()
            }
        };
        st.log(&LogLine {
            t_ns: t,
            node: Some(format!("lid{lid}")),
            live: Some(what),
            ..Default::default()
        });
    }

    /// The live rule for node `lid`'s link, if a live change set one.
    pub fn live_rule(&self, lid: u16) -> Option<LinkFaults> {
        self.lock().live_rules.get(&lid).cloned()
    }

    /// Nodes the plan has killed by fabric time `now_ns` that were not yet returned: the
    /// caller stops their guests. Each comes back once.
    pub fn due_kills(&self, now_ns: u64) -> Vec<u16> {
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        for n in &self.plan.nodes {
            let at = (n.kill_ms * 1e6) as u64;
            if at <= t && !st.dead.contains_key(&n.lid) {
                st.dead.insert(n.lid, at);
                st.counts.nodes_killed += 1;
                let lid = n.lid;
                st.log(&LogLine {
                    t_ns: t,
                    node: Some(format!("lid{lid}")),
                    fault: Some("kill"),
                    ..Default::default()
                });
            }
        }
        let fresh: Vec<u16> = st
            .dead
            .keys()
            .copied()
            .filter(|l| !st.kills_reported.contains(l))
            .collect();
        st.kills_reported.extend(&fresh);
        fresh
    }

    /// Whether node `lid` is dead at plan time `t`.
    fn is_dead(&self, st: &State, lid: u16, t: u64) -> bool {
        st.dead.get(&lid).is_some_and(|&at| at <= t)
            || self
                .plan
                .nodes
                .iter()
                .any(|n| n.lid == lid && (n.kill_ms * 1e6) as u64 <= t)
    }

    /// The fault for packet `n` on `link` at plan time `t` (None: it passes).
    fn decide(&self, st: &State, link: LinkId, pkt: &Packet, n: u64, t: u64) -> Option<Fault> {
        if self.is_dead(st, pkt.slid, t) || self.is_dead(st, pkt.dlid, t) {
            return Some(Fault::NodeDead);
        }
        if st.live_down.contains(&link.lid) {
            return Some(Fault::LinkDown);
        }
        let f = match st.live_rules.get(&link.lid) {
            Some(r) => r,
            None => self.plan.links.iter().find(|l| l.applies(link))?,
        };
        let ms = t as f64 / 1e6;
        let seed = self.plan.seed;
        let stream = Stream::Link(link);
        let hit = |p: f64, d: Draw| p > 0.0 && uniform(seed, stream, n, d) < p;
        if f.down.iter().any(|w| (w[0]..w[1]).contains(&ms)) {
            return Some(Fault::LinkDown);
        }
        if hit(f.corrupt, Draw::Corrupt) {
            return Some(Fault::Corrupt);
        }
        if hit(f.drop, Draw::Drop) {
            return Some(Fault::Drop);
        }
        if hit(f.duplicate, Draw::Duplicate) {
            return Some(Fault::Duplicate);
        }
        if hit(f.reorder, Draw::Reorder) {
            return Some(Fault::Reorder);
        }
        if f.delay_us > 0 || f.jitter_us > 0 {
            let jitter = (uniform(seed, stream, n, Draw::Jitter) * f.jitter_us as f64) as u64;
            return Some(Fault::Delay((f.delay_us + jitter) * 1000));
        }
        None
    }

    /// The first [[adapter]] rule for the HCA at `lid`.
    fn adapter(&self, lid: u16) -> Option<&AdapterFaults> {
        self.plan
            .adapters
            .iter()
            .find(|a| a.lid.is_none_or(|l| l == lid))
    }

    /// Logs an adapter fault and counts it.
    fn adapter_fault(
        &self,
        st: &mut State,
        t: u64,
        lid: u16,
        n: u64,
        f: AdapterFault,
        mut line: LogLine,
    ) {
        let c = &mut st.counts;
        let (counter, what) = match f {
            AdapterFault::WqeError => (&mut c.wqe_errors, "wqe-error"),
            AdapterFault::DoorbellLost => (&mut c.doorbells_lost, "doorbell-lost"),
            AdapterFault::InterruptLost => (&mut c.interrupts_lost, "interrupt-lost"),
            AdapterFault::InterruptLate => (&mut c.interrupts_late, "interrupt-late"),
            AdapterFault::CqOverflow => (&mut c.cq_overflows, "cq-overflow"),
        };
        *counter += 1;
        line.t_ns = t;
        line.hca = Some(format!("lid{lid}"));
        line.n = Some(n);
        line.fault = Some(what);
        st.log(&line);
    }
}

impl LinkHook for FaultHook {
    /// Down while a live link-down holds or one of the plan's down windows (either
    /// direction) covers plan time.
    fn link_up(&self, lid: u16, now_ns: u64) -> bool {
        let ms = self.plan_ns(now_ns) as f64 / 1e6;
        let st = self.lock();
        if st.live_down.contains(&lid) {
            return false;
        }
        let rule = |dir| {
            let link = LinkId { lid, dir };
            match st.live_rules.get(&lid) {
                Some(r) => Some(r),
                None => self.plan.links.iter().find(|l| l.applies(link)),
            }
        };
        ![LinkDir::Up, LinkDir::Down]
            .into_iter()
            .any(|dir| rule(dir).is_some_and(|l| l.down.iter().any(|w| (w[0]..w[1]).contains(&ms))))
    }

    fn on_packet(&self, link: LinkId, now_ns: u64, pkt: &mut Packet) -> Verdict {
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        let n = st.next(Stream::Link(link));
        let Some(fault) = self.decide(&st, link, pkt, n, t) else {
            return Verdict::Pass;
        };
        let c = &mut st.counts;
        match fault {
            Fault::NodeDead => c.node_dead += 1,
            Fault::LinkDown => c.link_down += 1,
            Fault::Corrupt => {
                c.corrupted += 1;
                pkt.corrupt = true;
            }
            Fault::Drop => c.dropped += 1,
            Fault::Duplicate => c.duplicated += 1,
            Fault::Reorder => c.reordered += 1,
            Fault::Delay(_) => c.delayed += 1,
        }
        st.log(&LogLine {
            t_ns: t,
            link: Some(format!("lid{}-{}", link.lid, dir_name(link.dir))),
            n: Some(n),
            slid: Some(pkt.slid),
            dlid: Some(pkt.dlid),
            opcode: Some(pkt.opcode),
            qpn: Some(pkt.dest_qpn),
            psn: Some(pkt.psn),
            fault: Some(fault.name()),
            delay_ns: match fault {
                Fault::Delay(ns) => Some(ns),
                _ => None,
            },
            ..Default::default()
        });
        fault.verdict()
    }
}

impl AdapterHook for FaultHook {
    fn doorbell(&self, lid: u16, class: u32, now_ns: u64) -> bool {
        let Some(a) = self.adapter(lid).filter(|a| a.lose_doorbell > 0.0) else {
            return true;
        };
        let mut st = self.lock();
        let n = st.next(Stream::Doorbell(lid));
        if uniform(self.plan.seed, Stream::Doorbell(lid), n, Draw::Lose) >= a.lose_doorbell {
            return true;
        }
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            class: Some(class),
            ..Default::default()
        };
        self.adapter_fault(&mut st, t, lid, n, AdapterFault::DoorbellLost, line);
        false
    }

    fn interrupt(&self, lid: u16, vector: u32, now_ns: u64) -> IrqFate {
        let Some(a) = self
            .adapter(lid)
            .filter(|a| a.lose_interrupt > 0.0 || a.late_interrupt > 0.0)
        else {
            return IrqFate::Deliver;
        };
        let mut st = self.lock();
        let s = Stream::Interrupt(lid);
        let n = st.next(s);
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            vector: Some(vector),
            ..Default::default()
        };
        let seed = self.plan.seed;
        if uniform(seed, s, n, Draw::Lose) < a.lose_interrupt {
            self.adapter_fault(&mut st, t, lid, n, AdapterFault::InterruptLost, line);
            return IrqFate::Lose;
        }
        if uniform(seed, s, n, Draw::Late) < a.late_interrupt {
            self.adapter_fault(&mut st, t, lid, n, AdapterFault::InterruptLate, line);
            return IrqFate::Late(a.late_interrupt_us * 1000);
        }
        IrqFate::Deliver
    }

    fn send_wqe(&self, lid: u16, qpn: u32, now_ns: u64) -> Option<u32> {
        let a = self.adapter(lid)?;
        let nth = a.error_wqe?;
        if a.qpn.is_some_and(|q| q != qpn) {
            return None;
        }
        let mut st = self.lock();
        let n = st.next(Stream::Wqe(lid, qpn));
        if n + 1 != nth {
            return None;
        }
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            qpn: Some(qpn),
            ..Default::default()
        };
        self.adapter_fault(&mut st, t, lid, n, AdapterFault::WqeError, line);
        Some(crate::abi::WC_GENERAL_ERR)
    }

    fn cqe(&self, lid: u16, cqn: u32, now_ns: u64) -> bool {
        let Some(after) = self.adapter(lid).and_then(|a| {
            a.cq_overflow_after
                .filter(|_| a.cqn.is_none_or(|c| c == cqn))
        }) else {
            return false;
        };
        let mut st = self.lock();
        let n = st.next(Stream::Cqe(lid, cqn));
        if n != after {
            return false;
        }
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            cqn: Some(cqn),
            ..Default::default()
        };
        self.adapter_fault(&mut st, t, lid, n, AdapterFault::CqOverflow, line);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_plans_parse_and_bad_ones_say_why() {
        let p = FaultPlan::parse(
            "seed = 7\n[[link]]\nlid = 2\ndir = \"up\"\ndrop = 0.5\ndown = [[10.0, 20.0]]\n",
        )
        .unwrap();
        assert_eq!(
            (p.seed, p.links[0].lid, p.links[0].dir),
            (7, Some(2), Dirs::Up)
        );
        let e = FaultPlan::parse("[[link]]\ndrop = 1.5").unwrap_err();
        assert!(e.contains("drop = 1.5"), "{e}");
        let e = FaultPlan::parse("[[link]]\ndown = [[5.0, 1.0]]").unwrap_err();
        assert!(e.contains("down window"), "{e}");
        let e = FaultPlan::parse("[[link]]\ndorp = 0.1").unwrap_err();
        assert!(e.contains("dorp"), "{e}");
    }

    /// The plan README.md shows is a valid one.
    #[test]
    fn test_the_readme_plan_parses() {
        let readme = include_str!("../../README.md");
        let block = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("README has a toml block");
        let p = FaultPlan::parse(block).unwrap();
        assert_eq!((p.links.len(), p.nodes.len(), p.adapters.len()), (1, 1, 1));
        assert_eq!(p.adapters[0].error_wqe, Some(100));
        let e = FaultPlan::parse("[[adapter]]\nerror_wqe = 0").unwrap_err();
        assert!(e.contains("counts from 1"), "{e}");
        let e = FaultPlan::parse("[[node]]\nlid = 0\nkill_ms = 1.0").unwrap_err();
        assert!(e.contains("node 1"), "{e}");
    }

    #[test]
    fn test_draws_are_uniform_enough_and_depend_on_every_input() {
        let link = LinkId {
            lid: 1,
            dir: LinkDir::Up,
        };
        let n = 100_000;
        let link = Stream::Link(link);
        let hits = (0..n)
            .filter(|&i| uniform(3, link, i, Draw::Drop) < 0.01)
            .count();
        assert!((800..1200).contains(&hits), "{hits} of {n} under 1%");
        let a = uniform(3, link, 5, Draw::Drop);
        assert_ne!(a, uniform(4, link, 5, Draw::Drop));
        assert_ne!(a, uniform(3, link, 6, Draw::Drop));
        assert_ne!(a, uniform(3, link, 5, Draw::Duplicate));
        let down = LinkId {
            lid: 1,
            dir: LinkDir::Down,
        };
        assert_ne!(a, uniform(3, Stream::Link(down), 5, Draw::Drop));
        assert_ne!(a, uniform(3, Stream::Doorbell(1), 5, Draw::Drop));
    }
}
