//! Live changes to a running plan (`hcabench fault`), and the plan's node kills.

use super::log::LogLine;
use super::plan::LinkFaults;
use super::FaultHook;
use crate::fabric::AdapterFault;

/// A change to a running plan (`hcabench fault NODE ...`).
#[derive(Clone, Debug, PartialEq)]
pub enum LiveFault {
    /// The node's link goes down (both directions) until LinkUp.
    LinkDown,
    /// The node's link comes back up (ends a LinkDown).
    LinkUp,
    /// The node's link follows this rule instead of the plan's.
    Rule(LinkFaults),
    /// Back to the plan for this node's link (and its link up).
    Clear,
    /// The node dies: its link goes dead for good.
    Kill,
    /// The node's adapter suffers a fault (the caller makes it so, through
    /// `Fabric::adapter_fault`; the hook logs and counts it).
    Adapter(AdapterFault),
    /// The node's adapter was hot-unplugged (the caller did it, through the guest's VMM).
    Unplug,
    /// A new adapter was hot-plugged into the node's empty slot.
    Replug,
}

/// What a plan's `[[adapter]]` rule does to its HCA at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdapterEvent {
    /// `fatal_ms`, `reset_ms`: the caller gives it through `Fabric::adapter_fault`.
    Fault(AdapterFault),
    /// `unplug_ms`: the caller hot-unplugs it through the guest's VMM.
    Unplug,
    /// `replug_ms`: the caller plugs a new one into its slot.
    Replug,
}

impl AdapterEvent {
    /// The word that names it in fault logs.
    pub fn name(self) -> &'static str {
        match self {
            AdapterEvent::Fault(f) => f.name(),
            AdapterEvent::Unplug => "unplug",
            AdapterEvent::Replug => "replug",
        }
    }
}

impl FaultHook {
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
            LiveFault::Adapter(fault) => {
                st.counts.count_adapter_event(AdapterEvent::Fault(*fault));
                fault.name().to_string()
            }
            LiveFault::Unplug => {
                st.counts.count_adapter_event(AdapterEvent::Unplug);
                "unplug".to_string()
            }
            LiveFault::Replug => "replug".to_string(),
        };
        st.log(&LogLine {
            t_ns: t,
            node: Some(format!("lid{lid}")),
            live: Some(what),
            ..Default::default()
        });
    }

    /// Inter-switch link `link` (its index) follows `rule` both ways from now, instead of
    /// the plan's rules; None: back to the plan. Logged.
    pub fn live_switch_link(&self, link: usize, rule: Option<LinkFaults>, now_ns: u64) {
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        let what = match rule {
            Some(r) => {
                let what = format!(
                    "rule drop={} duplicate={} reorder={} corrupt={} delay_us={} jitter_us={}",
                    r.drop, r.duplicate, r.reorder, r.corrupt, r.delay_us, r.jitter_us
                );
                st.live_switch_rules.insert(link, r);
                (self.switch_rules).store(true, std::sync::atomic::Ordering::Release);
                what
            }
            None => {
                st.live_switch_rules.remove(&link);
                "clear".to_string()
            }
        };
        st.log(&LogLine {
            t_ns: t,
            link: Some(format!("switch-link{}", link + 1)),
            live: Some(what),
            ..Default::default()
        });
    }

    /// The live rule of inter-switch link `link`, if a live change set one.
    pub fn live_switch_rule(&self, link: usize) -> Option<LinkFaults> {
        self.lock().live_switch_rules.get(&link).cloned()
    }

    /// The live rule for node `lid`'s link, if a live change set one.
    pub fn live_rule(&self, lid: u16) -> Option<LinkFaults> {
        self.lock().live_rules.get(&lid).cloned()
    }

    /// HCAs (by LID) whose planned event (`fatal_ms`, `reset_ms`, `unplug_ms`,
    /// `replug_ms`) came due by fabric time `now_ns` and was not yet returned, in the order
    /// they came due: the caller makes each happen. Each comes due once, logged.
    pub fn due_adapter_events(&self, now_ns: u64) -> Vec<(u16, AdapterEvent)> {
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        let mut due = Vec::new();
        for (i, a) in self.plan.adapters.iter().enumerate() {
            let Some(lid) = a.lid else { continue };
            for (ms, event) in [
                (a.fatal_ms, AdapterEvent::Fault(AdapterFault::Fatal)),
                (a.reset_ms, AdapterEvent::Fault(AdapterFault::Reset)),
                (a.unplug_ms, AdapterEvent::Unplug),
                (a.replug_ms, AdapterEvent::Replug),
            ] {
                let Some(ms) = ms else { continue };
                let at = (ms * 1e6) as u64;
                if at <= t && st.adapter_events_due.insert((i, event)) {
                    st.counts.count_adapter_event(event);
                    st.log(&LogLine {
                        t_ns: t,
                        node: Some(format!("lid{lid}")),
                        fault: Some(event.name()),
                        ..Default::default()
                    });
                    due.push((at, lid, event));
                }
            }
        }
        due.sort_by_key(|&(at, ..)| at);
        due.into_iter().map(|(_, lid, f)| (lid, f)).collect()
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
}
