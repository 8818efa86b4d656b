//! The plan file's schema (TOML) and its checks.

use serde::Deserialize;

use crate::fabric::{LinkDir, LinkId};
use crate::subnet::SwitchLink;

/// A fault plan, as its TOML file gives it: a seed, and rules for links, nodes and adapters.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    /// Seeds every random draw: a run with the same seed and traffic meets the same faults.
    pub seed: u64,
    /// Rules for links (`[[link]]`).
    #[serde(rename = "link")]
    pub links: Vec<LinkFaults>,
    /// Nodes that die (`[[node]]`).
    #[serde(rename = "node")]
    pub nodes: Vec<NodeFaults>,
    /// Rules for the HCAs themselves (`[[adapter]]`).
    #[serde(rename = "adapter")]
    pub adapters: Vec<AdapterFaults>,
}

/// A node that dies during the run: its link goes dead for good.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeFaults {
    /// The node's LID.
    pub lid: u16,
    /// When the node dies, in milliseconds after the plan starts.
    pub kill_ms: f64,
}

/// Faults of an HCA itself: lost doorbells and interrupts, late interrupts, a WQE or CQ made to fail.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AdapterFaults {
    /// The HCA's LID; None: every HCA.
    pub lid: Option<u16>,
    /// The Nth send WQE (from 1) of a QP completes with WC_GENERAL_ERR.
    pub error_wqe: Option<u64>,
    /// Limits `error_wqe` to one QP.
    pub qpn: Option<u32>,
    /// Probability that a doorbell is ignored.
    pub lose_doorbell: f64,
    /// Probability that an interrupt is never raised.
    pub lose_interrupt: f64,
    /// Probability that an interrupt is raised late.
    pub late_interrupt: f64,
    /// How late a late interrupt is, in microseconds.
    pub late_interrupt_us: u64,
    /// A CQ overflows when it is handed CQE number N + 1.
    pub cq_overflow_after: Option<u64>,
    /// Limits `cq_overflow_after` to one CQ.
    pub cqn: Option<u32>,
    /// The HCA (`lid` must name it) has a catastrophic error this many milliseconds after
    /// the plan starts, as `hcabench fault NODE fatal` gives it one now.
    pub fatal_ms: Option<f64>,
    /// The HCA (`lid` must name it) is reset underneath its driver this many milliseconds
    /// after the plan starts, as `hcabench fault NODE reset` does now.
    pub reset_ms: Option<f64>,
    /// The HCA (`lid` must name it) is hot-unplugged this many milliseconds after the plan
    /// starts, as `hcabench fault NODE unplug` does now (QEMU guests).
    pub unplug_ms: Option<f64>,
    /// A new HCA is hot-plugged into its slot this long after the plan starts (after
    /// `unplug_ms`).
    pub replug_ms: Option<f64>,
}

/// Which directions of a link a rule applies to.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Dirs {
    /// From the port into the switch.
    Up,
    /// From the switch to the port.
    Down,
    /// Both ways.
    #[default]
    Both,
}

/// Faults on links: probabilities per packet, a delay with jitter, windows with the link down.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LinkFaults {
    /// The LID of the port whose link it is; None (and no `switch_link`): every node's
    /// link.
    pub lid: Option<u16>,
    /// Instead of a node's link: the inter-switch link, 1 for the cluster file's first
    /// `[[link]]`. Its `dir` "up" is from the first switch the `[[link]]` names to the
    /// second, "down" back.
    pub switch_link: Option<u16>,
    /// The directions it applies to.
    pub dir: Dirs,
    /// Probability that a packet is dropped.
    pub drop: f64,
    /// Probability that a packet is sent twice.
    pub duplicate: f64,
    /// Probability that a packet is held back for later ones to overtake.
    pub reorder: f64,
    /// Probability that a packet's bits are flipped (its ICRC then fails).
    pub corrupt: f64,
    /// Delay added to every packet, in microseconds.
    pub delay_us: u64,
    /// Random extra delay, up to this many microseconds.
    pub jitter_us: u64,
    /// [from, to) in milliseconds of fabric time.
    pub down: Vec<[f64; 2]>,
}

impl LinkFaults {
    pub(super) fn applies(&self, link: LinkId) -> bool {
        let dir = match self.dir {
            Dirs::Both => true,
            Dirs::Up => link.dir == LinkDir::Up,
            Dirs::Down => link.dir == LinkDir::Down,
        };
        dir && self.switch_link.is_none() && self.lid.is_none_or(|l| l == link.lid)
    }

    /// Whether the rule is for inter-switch link `link`, that way.
    pub(super) fn applies_switch(&self, link: SwitchLink) -> bool {
        let dir = match self.dir {
            Dirs::Both => true,
            Dirs::Up => link.forward,
            Dirs::Down => !link.forward,
        };
        dir && self
            .switch_link
            .is_some_and(|k| usize::from(k) == link.link + 1)
    }
}

/// Why a fault plan was refused: the rule (counted from 1 in its kind) and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Not TOML, or not a plan's fields (an unknown one, a wrong type).
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// A probability outside 0..=1.
    #[error("{kind} {index}: {name} = {value} (a probability, 0 to 1)")]
    Probability {
        /// "link" or "adapter".
        kind: &'static str,
        /// The rule, from 1.
        index: usize,
        /// The field.
        name: &'static str,
        /// What it said.
        value: f64,
    },
    /// A link's down window that ends before it starts.
    #[error("link {link}: down window {window:?} (want [from_ms, to_ms] with from < to)")]
    DownWindow {
        /// The link rule, from 1.
        link: usize,
        /// The window given.
        window: [f64; 2],
    },
    /// A link rule naming both a node's link and an inter-switch link, or link 0.
    #[error("link {link}: {why}")]
    SwitchLink {
        /// The link rule, from 1.
        link: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A node rule without a LID or a time to kill it.
    #[error("node {node}: lid = {lid}, kill_ms = {kill_ms} (want a LID from 1 and a time >= 0)")]
    Node {
        /// The node rule, from 1.
        node: usize,
        /// The LID given.
        lid: u16,
        /// The time given.
        kill_ms: f64,
    },
    /// `fatal_ms`, `reset_ms`, `unplug_ms` or `replug_ms` without the LID of one HCA, or
    /// not a time >= 0.
    #[error("adapter {adapter}: {field} = {ms} (want one HCA's lid and a time >= 0)")]
    AdapterFaultTime {
        /// The adapter rule, from 1.
        adapter: usize,
        /// `fatal_ms` or `reset_ms`.
        field: &'static str,
        /// The time given.
        ms: f64,
    },
    /// `replug_ms` without an earlier `unplug_ms` in the same rule.
    #[error("adapter {adapter}: replug_ms = {replug_ms} wants an earlier unplug_ms")]
    ReplugFirst {
        /// The adapter rule, from 1.
        adapter: usize,
        /// The time given.
        replug_ms: f64,
    },
    /// `error_wqe = 0`.
    #[error("adapter {adapter}: error_wqe counts from 1 (the first WQE)")]
    ErrorWqeZero {
        /// The adapter rule, from 1.
        adapter: usize,
    },
    /// Late interrupts without a lateness.
    #[error("adapter {adapter}: late_interrupt without late_interrupt_us")]
    LateWithoutDelay {
        /// The adapter rule, from 1.
        adapter: usize,
    },
}

impl FaultPlan {
    /// Parses and checks a plan; errors name the rule, the field and what is wrong.
    pub fn parse(text: &str) -> Result<Self, PlanError> {
        let plan: FaultPlan = toml::from_str(text)?;
        for (i, l) in plan.links.iter().enumerate() {
            for (name, p) in [
                ("drop", l.drop),
                ("duplicate", l.duplicate),
                ("reorder", l.reorder),
                ("corrupt", l.corrupt),
            ] {
                if !(0.0..=1.0).contains(&p) {
                    return Err(PlanError::Probability {
                        kind: "link",
                        index: i + 1,
                        name,
                        value: p,
                    });
                }
            }
            let why = match (l.lid, l.switch_link) {
                (Some(_), Some(_)) => Some("lid and switch_link name two links (give one)"),
                (_, Some(0)) => Some("switch_link counts from 1 (the first [[link]])"),
                _ => None,
            };
            if let Some(why) = why {
                return Err(PlanError::SwitchLink { link: i + 1, why });
            }
            if let Some(w) = l.down.iter().find(|w| !(w[0] >= 0.0 && w[0] < w[1])) {
                return Err(PlanError::DownWindow {
                    link: i + 1,
                    window: *w,
                });
            }
        }
        for (i, n) in plan.nodes.iter().enumerate() {
            if n.lid == 0 || !(n.kill_ms.is_finite() && n.kill_ms >= 0.0) {
                return Err(PlanError::Node {
                    node: i + 1,
                    lid: n.lid,
                    kill_ms: n.kill_ms,
                });
            }
        }
        for (i, a) in plan.adapters.iter().enumerate() {
            for (field, ms) in [
                ("fatal_ms", a.fatal_ms),
                ("reset_ms", a.reset_ms),
                ("unplug_ms", a.unplug_ms),
                ("replug_ms", a.replug_ms),
            ] {
                let Some(ms) = ms else { continue };
                if !(ms.is_finite() && ms >= 0.0) || a.lid.is_none_or(|l| l == 0) {
                    return Err(PlanError::AdapterFaultTime {
                        adapter: i + 1,
                        field,
                        ms,
                    });
                }
            }
            for (name, p) in [
                ("lose_doorbell", a.lose_doorbell),
                ("lose_interrupt", a.lose_interrupt),
                ("late_interrupt", a.late_interrupt),
            ] {
                if !(0.0..=1.0).contains(&p) {
                    return Err(PlanError::Probability {
                        kind: "adapter",
                        index: i + 1,
                        name,
                        value: p,
                    });
                }
            }
            if let Some(replug_ms) = a.replug_ms {
                if a.unplug_ms.is_none_or(|u| u >= replug_ms) {
                    return Err(PlanError::ReplugFirst {
                        adapter: i + 1,
                        replug_ms,
                    });
                }
            }
            if a.error_wqe == Some(0) {
                return Err(PlanError::ErrorWqeZero { adapter: i + 1 });
            }
            if a.late_interrupt > 0.0 && a.late_interrupt_us == 0 {
                return Err(PlanError::LateWithoutDelay { adapter: i + 1 });
            }
        }
        Ok(plan)
    }
}
