//! The fabric's clock, real or manual, and its tick: held packets released, links followed,
//! every port's transport timers run.
//!
//! A port's transport timers do not count the fabric's own stalls, which no real link has
//! and which would spend a QP's retries while its packets were on their way: the time the
//! host did not run the fabric (a tick far later than [`TICK`] on the real clock: every
//! port's timers stop for it), and the time a port's packets, or packets for it, wait in
//! the fabric's queue behind others (a loaded host moves the queue slowly; the port's
//! timers then count a sixteenth of it, so that a lost packet still times out on a port
//! the fabric never stops holding). Each tick tells each port the stall since the last
//! one ([`PacketSink::tick`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lanes::slot;
use super::{Fabric, Lid, PacketSink, Stage};
use crate::packet::Packet;
use crate::sync::{Unpoisoned, UnpoisonedRw};

/// How often a real-time fabric runs its ports' timers.
pub const TICK: Duration = Duration::from_millis(1);

/// A tick this much after the last one on the real clock shows that the host did not run
/// the fabric's timer thread (nor, most likely, the threads moving its packets) between.
const LATE: Duration = Duration::from_millis(10);

/// While the fabric holds a port's packets, its timers count one nanosecond in this many.
const HELD_SHARE: u64 = 16;

/// Of the `elapsed` ns since the last tick, what a port's timers do not count: all but a
/// tick's worth when the tick came `late`, all but a [`HELD_SHARE`]th when the fabric
/// `held` the port's packets at the tick.
pub(super) fn stall_ns(elapsed: u64, late: bool, held: bool) -> u64 {
    let starved = if late {
        elapsed.saturating_sub(TICK.as_nanos() as u64)
    } else {
        0
    };
    let queued = if held {
        elapsed - elapsed / HELD_SHARE
    } else {
        0
    };
    starved.max(queued)
}

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
        let elapsed = now.saturating_sub(self.inner.last_tick.swap(now, Relaxed));
        let late = matches!(self.inner.clock, Clock::Real(_)) && elapsed > LATE.as_nanos() as u64;
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
        self.follow_switch_links(hook.as_ref(), now);
        released |= self.sweep_if_due();
        released |= self.inner.reports_waiting.swap(false, Relaxed);
        for (lid, p) in ports {
            // Slot 0 is shared (LIDs past the lanes' table): no port's own queue to look at.
            let held = slot(lid) != 0 && self.inner.lanes.holds(slot(lid));
            p.tick(now, stall_ns(elapsed, late, held));
        }
        // A port whose timers fired moved its packets itself. Pump only for what the held
        // packets queued (bounces) and the SA's trap Reports: an idle tick must not take the pumping over from a
        // sender, which then finds its packets still queued when it returns.
        if released {
            self.pump();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn test_a_late_tick_stops_the_timers_for_all_but_a_tick() {
        assert_eq!(
            stall_ns(MS, false, false),
            0,
            "an on-time tick counts in full"
        );
        assert_eq!(stall_ns(3_000 * MS, true, false), 2_999 * MS);
        assert_eq!(stall_ns(3_000 * MS, true, true), 2_999 * MS);
    }

    #[test]
    fn test_a_held_port_counts_a_sixteenth() {
        assert_eq!(stall_ns(16 * MS, false, true), 15 * MS);
        assert_eq!(stall_ns(MS, false, true), MS - MS / 16);
        // A late tick on a held port stops the timers at least as long as the hold would.
        assert!(stall_ns(11 * MS, true, true) >= stall_ns(11 * MS, false, true));
    }
}
