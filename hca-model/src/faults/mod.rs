//! Seeded fault plans: a [`LinkHook`](crate::LinkHook) that drops, duplicates, reorders,
//! delays and corrupts packets, takes links down on a schedule and kills nodes, and an
//! [`AdapterHook`](crate::AdapterHook) that makes HCAs fail WQEs, lose doorbells, lose or
//! delay interrupts and overflow CQs. Every decision
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
//! [[link]]
//! switch_link = 1       # instead of lid: the cluster file's first inter-switch [[link]]
//! dir = "up"            # from the first switch it names to the second
//! delay_us = 50         # the same faults; down windows cut it (the SM routes round)
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
//! fatal_ms = 8000       # node2's HCA has a catastrophic error (read from every rule)
//! reset_ms = 20000      # node2's HCA is reset underneath its driver (every rule too)
//! unplug_ms = 30000     # node2's HCA is hot-unplugged (QEMU guests), and a new one
//! replug_ms = 35000     #   plugged into its slot
//! ```
//!
//! By concern: `plan` (the file's schema and checks), `draw` (seeded decisions), `link` and
//! `adapter` (the two hooks), `live` (changes to a running plan, node kills), `log` (the
//! JSON-lines log); this module holds the hook's shared state and counts.

mod adapter;
mod draw;
mod link;
mod live;
mod log;
mod plan;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

pub use live::{AdapterEvent, LiveFault};
pub use plan::{AdapterFaults, Dirs, FaultPlan, LinkFaults, NodeFaults, PlanError};

use crate::fabric::AdapterFault;
use crate::sync::Unpoisoned;
use draw::Stream;
use log::LogLine;

/// What a plan did, for the end-of-run report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Packets lost to a link down (a window, or `hcabench fault NODE down`).
    pub link_down: u64,
    /// Packets a rule dropped.
    pub dropped: u64,
    /// Packets a rule sent twice.
    pub duplicated: u64,
    /// Packets a rule held back so that later ones overtook them.
    pub reordered: u64,
    /// Packets a rule corrupted (their receivers drop them for a bad ICRC).
    pub corrupted: u64,
    /// Packets a rule delayed.
    pub delayed: u64,
    /// Packets lost to or from a killed node.
    pub node_dead: u64,
    /// Nodes killed.
    pub nodes_killed: u64,
    /// Send WQEs made to complete with WC_GENERAL_ERR.
    pub wqe_errors: u64,
    /// Doorbells the device ignored.
    pub doorbells_lost: u64,
    /// Interrupts never raised.
    pub interrupts_lost: u64,
    /// Interrupts raised late.
    pub interrupts_late: u64,
    /// CQs made to overflow.
    pub cq_overflows: u64,
    /// Catastrophic errors given to HCAs (planned `fatal_ms`, and `hcabench fault NODE
    /// fatal`).
    pub adapters_fatal: u64,
    /// HCAs reset underneath their drivers (planned `reset_ms`, and `hcabench fault NODE
    /// reset`).
    pub adapters_reset: u64,
    /// HCAs hot-unplugged (planned `unplug_ms`, and `hcabench fault NODE unplug`).
    pub adapters_unplugged: u64,
}

impl FaultCounts {
    fn count_adapter_event(&mut self, event: AdapterEvent) {
        match event {
            AdapterEvent::Fault(AdapterFault::Fatal) => self.adapters_fatal += 1,
            AdapterEvent::Fault(AdapterFault::Reset) => self.adapters_reset += 1,
            AdapterEvent::Unplug => self.adapters_unplugged += 1,
            AdapterEvent::Replug => {}
        }
    }

    /// Every fault counted, of all kinds.
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
            + self.adapters_fatal
            + self.adapters_reset
            + self.adapters_unplugged
    }
}

#[derive(Default)]
struct State {
    seen: HashMap<Stream, u64>,
    counts: FaultCounts,
    log: Option<Box<dyn Write + Send>>,
    live_down: HashSet<u16>,
    live_rules: HashMap<u16, LinkFaults>,
    /// Inter-switch links' live rules, by link index (`hcabench link faults`).
    live_switch_rules: HashMap<usize, LinkFaults>,
    /// Dead nodes and since when (ns after the origin).
    dead: HashMap<u16, u64>,
    /// Kills already handed to whoever stops the guests.
    kills_reported: HashSet<u16>,
    /// Adapter rules (by index) whose `fatal_ms`, `reset_ms`, `unplug_ms` or `replug_ms`
    /// came due.
    adapter_events_due: HashSet<(usize, AdapterEvent)>,
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

/// A plan at work: `fabric.set_hook(Some(hook.clone()))` for the links,
/// `fabric.set_adapter_hook(Some(hook))` for the HCAs.
pub struct FaultHook {
    plan: FaultPlan,
    /// Fabric time at which the plan starts; plan and log times count from here.
    origin_ns: AtomicU64,
    state: Mutex<State>,
    /// Some rule is for an inter-switch link (the plan's, or a live one): until then a
    /// packet crossing one passes without the state's lock.
    switch_rules: std::sync::atomic::AtomicBool,
}

impl FaultHook {
    /// `log`: where the decisions go, one JSON object a line (None: counted only).
    pub fn new(plan: FaultPlan, log: Option<Box<dyn Write + Send>>) -> Self {
        Self {
            switch_rules: std::sync::atomic::AtomicBool::new(
                plan.links.iter().any(|l| l.switch_link.is_some()),
            ),
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

    /// The plan's seed: with it, the same traffic meets the same faults.
    pub fn seed(&self) -> u64 {
        self.plan.seed
    }

    /// What the plan has done so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
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
}
