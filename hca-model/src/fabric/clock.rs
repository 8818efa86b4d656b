//! The fabric's clock, real or manual, and its tick: held packets released, links followed,
//! every port's transport timers run.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Fabric, Lid, PacketSink, Stage};
use crate::packet::Packet;
use crate::sync::{Unpoisoned, UnpoisonedRw};

/// How often a real-time fabric runs its ports' timers.
pub const TICK: Duration = Duration::from_millis(1);

pub(super) enum Clock {
    Real(Instant),
    Manual(AtomicU64),
}

impl Fabric {
    /// Nanoseconds since the fabric was made (its clock, real or manual).
    pub fn now_ns(&self) -> u64 {
        match &self.inner.clock {
            Clock::Real(t0) => t0.elapsed().as_nanos() as u64,
            Clock::Manual(t) => t.load(Relaxed),
        }
    }

    /// The clock's reading where it costs a load (a manual clock); None on the real clock,
    /// whose reading costs a message's worth of work here (about 26 ns): a port starts a
    /// timer there at its next [`PacketSink::tick`] instead (at most [`TICK`] later), so
    /// that sending does not read the clock.
    pub fn now_ns_if_cheap(&self) -> Option<u64> {
        match &self.inner.clock {
            Clock::Real(_) => None,
            Clock::Manual(t) => Some(t.load(Relaxed)),
        }
    }

    /// Moves a manual clock on by `d` and runs the timers that come due (a real clock
    /// ignores this).
    pub fn advance(&self, d: Duration) {
        if let Clock::Manual(t) = &self.inner.clock {
            t.fetch_add(d.as_nanos() as u64, Relaxed);
            self.tick();
        }
    }

    /// Releases held packets that are due and runs every port's due timers.
    pub(super) fn tick(&self) {
        let now = self.now_ns();
        let due: Vec<(u64, Stage, Packet)> = {
            let mut held = self.inner.held.lock_unpoisoned();
            let (due, keep) = std::mem::take(&mut *held)
                .into_iter()
                .partition(|h| h.0 <= now);
            *held = keep;
            due
        };
        let mut released = !due.is_empty();
        let hook = self.hook();
        for (_, stage, pkt) in due {
            self.resume(pkt, stage, hook.as_ref(), false);
        }
        let ports: Vec<(Lid, Arc<dyn PacketSink>)> = {
            let ports = self.inner.ports.read_unpoisoned();
            ports
                .iter()
                .enumerate()
                .filter_map(|(lid, p)| Some((lid as Lid, p.as_ref()?.upgrade()?)))
                .collect()
        };
        released |= self.follow_links(&ports, hook.as_ref(), now);
        released |= self.inner.reports_waiting.swap(false, Relaxed);
        for (_, p) in ports {
            p.tick(now);
        }
        // A port whose timers fired moved its packets itself. Pump only for what the held
        // packets queued (bounces) and the SA's trap Reports: an idle tick must not take the pumping over from a
        // sender, which then finds its packets still queued when it returns.
        if released {
            self.pump();
        }
    }
}
