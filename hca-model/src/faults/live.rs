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
                st.counts.count_adapter_fault(*fault);
                fault.name().to_string()
            }
            LiveFault::Unplug => {
                st.counts.adapters_unplugged += 1;
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

    /// The live rule for node `lid`'s link, if a live change set one.
    pub fn live_rule(&self, lid: u16) -> Option<LinkFaults> {
        self.lock().live_rules.get(&lid).cloned()
    }

    /// HCAs (by LID) whose planned fault (`fatal_ms`, `reset_ms`) came due by fabric time
    /// `now_ns` and was not yet returned, in the order they came due: the caller makes each
    /// happen (`Fabric::adapter_fault`). Each comes due once, logged.
    pub fn due_adapter_faults(&self, now_ns: u64) -> Vec<(u16, AdapterFault)> {
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        let mut due = Vec::new();
        for (i, a) in self.plan.adapters.iter().enumerate() {
            let Some(lid) = a.lid else { continue };
            for (ms, fault) in [
                (a.fatal_ms, AdapterFault::Fatal),
                (a.reset_ms, AdapterFault::Reset),
            ] {
                let Some(ms) = ms else { continue };
                let at = (ms * 1e6) as u64;
                if at <= t && st.adapter_faults_due.insert((i, fault)) {
                    st.counts.count_adapter_fault(fault);
                    st.log(&LogLine {
                        t_ns: t,
                        node: Some(format!("lid{lid}")),
                        fault: Some(fault.name()),
                        ..Default::default()
                    });
                    due.push((at, lid, fault));
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
