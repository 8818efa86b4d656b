//! Seeded fault plans: a [`LinkHook`] that drops, duplicates, reorders, delays and corrupts
//! packets and takes links down on a schedule, every decision drawn from the plan's seed and
//! logged as one JSON line.
//!
//! A decision is a pure function of (seed, link, the packet's index on that link, the kind
//! of fault), not of a shared random stream, so the k-th packet on a link meets the same
//! fate in every run with that seed however the links' traffic interleaves: a run replays,
//! and two runs' logs compare line by line per link.
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
//! down = [[1000, 1500]] # link down from 1000 ms to 1500 ms of fabric time
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

use serde::Deserialize;

use crate::fabric::{LinkDir, LinkHook, LinkId, Verdict};
use crate::packet::Packet;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    pub seed: u64,
    #[serde(rename = "link")]
    pub links: Vec<LinkFaults>,
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
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.link_down
            + self.dropped
            + self.duplicated
            + self.reordered
            + self.corrupted
            + self.delayed
    }
}

struct State {
    seen: HashMap<LinkId, u64>,
    counts: FaultCounts,
    log: Option<Box<dyn Write + Send>>,
}

/// A plan at work on a fabric (`fabric.set_hook(Some(Arc::new(hook)))`).
pub struct FaultHook {
    plan: FaultPlan,
    state: Mutex<State>,
}

/// A fault the plan injects into one packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
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
            Fault::LinkDown | Fault::Drop => Verdict::Drop,
            Fault::Corrupt => Verdict::Pass,
            Fault::Duplicate => Verdict::Duplicate,
            // Held until the next tick: later packets overtake it.
            Fault::Reorder => Verdict::Delay(1),
            Fault::Delay(ns) => Verdict::Delay(ns),
        }
    }
}

/// Which random draw a decision is.
#[derive(Clone, Copy)]
enum Draw {
    Corrupt = 1,
    Drop,
    Duplicate,
    Reorder,
    Jitter,
}

/// A uniform number in [0, 1) from (seed, link, packet index, draw): splitmix64's finaliser.
fn uniform(seed: u64, link: LinkId, n: u64, draw: Draw) -> f64 {
    let dir = u64::from(link.dir == LinkDir::Down);
    let mut z = seed
        ^ (u64::from(link.lid) << 48 | dir << 47 | (draw as u64) << 40)
        ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl FaultHook {
    /// `log`: where the decisions go, one JSON object a line (None: counted only).
    pub fn new(plan: FaultPlan, log: Option<Box<dyn Write + Send>>) -> Self {
        Self {
            plan,
            state: Mutex::new(State {
                seen: HashMap::new(),
                counts: FaultCounts::default(),
                log,
            }),
        }
    }

    pub fn seed(&self) -> u64 {
        self.plan.seed
    }

    pub fn counts(&self) -> FaultCounts {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).counts
    }

    /// Pushes buffered log lines out (the end of a run).
    pub fn flush(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(log) = st.log.as_mut() {
            let _ = log.flush();
        }
    }

    /// The fault for packet `n` on `link` at `now_ns`, by the plan (None: it passes).
    fn decide(&self, link: LinkId, n: u64, now_ns: u64) -> Option<Fault> {
        let f = self.plan.links.iter().find(|l| l.applies(link))?;
        let ms = now_ns as f64 / 1e6;
        let seed = self.plan.seed;
        let hit = |p: f64, d: Draw| p > 0.0 && uniform(seed, link, n, d) < p;
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
            let jitter = (uniform(seed, link, n, Draw::Jitter) * f.jitter_us as f64) as u64;
            return Some(Fault::Delay((f.delay_us + jitter) * 1000));
        }
        None
    }
}

impl LinkHook for FaultHook {
    fn on_packet(&self, link: LinkId, now_ns: u64, pkt: &mut Packet) -> Verdict {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let n = {
            let c = st.seen.entry(link).or_insert(0);
            *c += 1;
            *c - 1
        };
        let Some(fault) = self.decide(link, n, now_ns) else {
            return Verdict::Pass;
        };
        let c = &mut st.counts;
        match fault {
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
        if let Some(log) = st.log.as_mut() {
            let dir = if link.dir == LinkDir::Up {
                "up"
            } else {
                "down"
            };
            let extra = match fault {
                Fault::Delay(ns) => format!(",\"delay_ns\":{ns}"),
                _ => String::new(),
            };
            let _ = writeln!(
                log,
                "{{\"t_ns\":{now_ns},\"link\":\"lid{}-{dir}\",\"n\":{n},\"slid\":{},\"dlid\":{},\
                 \"opcode\":{},\"qpn\":{},\"psn\":{},\"fault\":\"{}\"{extra}}}",
                link.lid,
                pkt.slid,
                pkt.dlid,
                pkt.opcode,
                pkt.dest_qpn,
                pkt.psn,
                fault.name()
            );
        }
        fault.verdict()
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

    #[test]
    fn test_draws_are_uniform_enough_and_depend_on_every_input() {
        let link = LinkId {
            lid: 1,
            dir: LinkDir::Up,
        };
        let n = 100_000;
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
        assert_ne!(a, uniform(3, down, 5, Draw::Drop));
    }
}
