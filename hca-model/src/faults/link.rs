//! The plan on the links: packets dropped, duplicated, reordered, delayed, corrupted, links
//! down on a schedule, nodes dead.

use super::draw::{uniform, Draw, Stream};
use super::log::LogLine;
use super::LinkFaults;
use super::{FaultHook, State};
use crate::fabric::{LinkDir, LinkHook, LinkId, Verdict};
use crate::packet::Packet;
use crate::subnet::SwitchLink;

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

fn dir_name(d: LinkDir) -> &'static str {
    match d {
        LinkDir::Up => "up",
        LinkDir::Down => "down",
    }
}

impl FaultHook {
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
        self.by_rule(f, Stream::Link(link), n, t)
    }

    /// The fault rule `f` gives event `n` of `stream` at plan time `t`.
    fn by_rule(&self, f: &LinkFaults, stream: Stream, n: u64, t: u64) -> Option<Fault> {
        let ms = t as f64 / 1e6;
        let seed = self.plan.seed;
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
        let name = format!("lid{}-{}", link.lid, dir_name(link.dir));
        Self::inject(&mut st, fault, name, (n, t), pkt)
    }

    /// Down while one of the plan's down windows for it (either way) covers plan time.
    fn switch_link_up(&self, link: usize, now_ns: u64) -> bool {
        let ms = self.plan_ns(now_ns) as f64 / 1e6;
        let ways = [true, false].map(|forward| SwitchLink { link, forward });
        !self.plan.links.iter().any(|l| {
            ways.iter().any(|&w| l.applies_switch(w))
                && l.down.iter().any(|w| (w[0]..w[1]).contains(&ms))
        })
    }

    fn on_switch_link(&self, link: SwitchLink, now_ns: u64, pkt: &mut Packet) -> Verdict {
        if !self.switch_rules.load(std::sync::atomic::Ordering::Acquire) {
            return Verdict::Pass;
        }
        let t = self.plan_ns(now_ns);
        let mut st = self.lock();
        let live = st.live_switch_rules.contains_key(&link.link);
        if !live && !self.plan.links.iter().any(|l| l.applies_switch(link)) {
            return Verdict::Pass;
        }
        let stream = Stream::SwitchLink(link);
        let n = st.next(stream);
        let rule = match st.live_switch_rules.get(&link.link) {
            Some(r) => r,
            None => match self.plan.links.iter().find(|l| l.applies_switch(link)) {
                Some(r) => r,
                None => return Verdict::Pass,
            },
        };
        let Some(fault) = self.by_rule(rule, stream, n, t) else {
            return Verdict::Pass;
        };
        let way = if link.forward { "up" } else { "down" };
        let name = format!("switch-link{}-{way}", link.link + 1);
        Self::inject(&mut st, fault, name, (n, t), pkt)
    }
}

impl FaultHook {
    /// Counts and logs `fault` on packet `n` of link `name` at plan time `t`, marks a
    /// corrupt packet, and says what the fabric does with it.
    fn inject(
        st: &mut State,
        fault: Fault,
        name: String,
        (n, t): (u64, u64),
        pkt: &mut Packet,
    ) -> Verdict {
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
            link: Some(name),
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
