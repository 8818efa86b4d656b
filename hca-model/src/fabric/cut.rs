//! The cut-through: a device's turn moving what it sent itself, straight to the receiving
//! port, before it lets go of its own lock.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::{Arc, Weak};

use super::lanes::{slot, weight, Item, Lane, MAX_BURST, MAX_BURST_BYTES};
use super::pump::{in_a_pump, note_queued, PUMPING};
use super::{DropReason, Fabric, Lid, PacketSink, Rejected};
use crate::packet::Packet;

thread_local! {
    /// The cut-through this thread runs (see [`Cut`]): its port's slot (0: none), and the
    /// packet for that port a delivery sent back, taken by the port's own turn.
    static CUT: RefCell<CutBack> = const { RefCell::new(CutBack { port: 0, back: None }) };
}

/// See [`CUT`]: `back` is (source slot, packet).
struct CutBack {
    port: usize,
    back: Option<(Lid, Packet)>,
}

/// Keeps `pkt`, from slot `src`, for the turn of the port at slot `dst` if that port runs
/// this thread's cut-through and has no packet kept yet (see [`Cut::returned`]); else
/// gives it back. The caller has made sure that nothing from `src` waits for `dst` or is
/// being delivered to it.
pub(super) fn keep_back(dst: usize, src: Lid, pkt: Packet) -> Option<Packet> {
    CUT.with(|c| {
        let mut c = c.borrow_mut();
        if c.port != dst || dst == 0 || c.back.is_some() {
            return Some(pkt);
        }
        c.back = Some((src, pkt));
        None
    })
}

/// A sender's note of the port at one LID, for its cut-throughs (see [`Cut::port_for`]):
/// good while no port has been attached to the fabric or detached from it since.
#[derive(Default)]
pub(crate) struct PortNote {
    lid: Lid,
    /// `Inner::port_epoch` when it was taken.
    epoch: u64,
    port: Option<Weak<dyn PacketSink>>,
}

/// A device's turn moving what it sent itself, before it lets go of its own lock: a
/// *cut-through*. Each run of its packets for one port goes straight to that port's
/// [`PacketSink::try_deliver_run`] if nothing the sender sent earlier waits for that port
/// or is being delivered to it (its lane holds nothing from the sender and is not
/// claimed), and the port's lock is free; the sender's lock, held, keeps anything newer
/// from the sender out meanwhile, so its order to each port holds. Else the run is queued
/// as before. The deliveries' own sends are queued, as in a pump (this thread counts as
/// pumping meanwhile), but for the first answer to the sender when nothing else waits for
/// it: that one the turn takes itself ([`Cut::returned`]), in the same turn of its lock.
///
/// So an RC message sent by a doorbell's turn costs no queue round trip, no pump, and no
/// second turn of the sender's lock for its ACK. No deadlock comes of holding two device
/// locks: a turn takes the second only if it is free, and never waits while it holds one.
/// Runs are bursts, and the port's other sources still take their turns (see
/// [`Cut::send`]); one cut hands over at most [`CUT_BYTES`] and [`CUT_PACKETS`] itself.
pub(crate) struct Cut<'a> {
    fabric: &'a Fabric,
    /// Packets its ports took, counted at its end in the sender's lane
    /// (`Lane::cut_delivered`).
    delivered: u64,
    /// Payload bytes and packets it may still hand over itself (see [`CUT_BYTES`]).
    budget: u64,
    packets_left: usize,
}

/// The most payload, and the most packets, one cut-through hands over itself, in bursts.
/// The sender's lock is held meanwhile: packets for the sender wait for at most as long
/// as the queue's longest item (`PIECE_BYTES` in hca.rs) takes to copy, or 16 bursts of
/// small messages take to deliver. The rest is queued.
const CUT_BYTES: u64 = 1 << 20;
const CUT_PACKETS: usize = 16 * MAX_BURST;

/// A run of one sender's packets for one port, taken off the front of the sender's
/// outbox as the port takes them (see `Cut::send`): a burst at most (see
/// `take_burst`), each with whether the next is of its stream (the port may then hold
/// its ACK). A type of its own, not a `dyn Iterator`, so that the port's loop takes each
/// packet without a call.
pub struct Run<'a> {
    out: &'a mut VecDeque<Packet>,
    dlid: Lid,
    n: usize,
    bytes: u64,
}

impl Iterator for Run<'_> {
    type Item = (Packet, bool);

    #[inline]
    fn next(&mut self) -> Option<(Packet, bool)> {
        let dlid = self.dlid;
        if self.n == MAX_BURST
            || self.bytes > MAX_BURST_BYTES
            || self.out.front().is_none_or(|p| p.dlid != dlid)
        {
            return None;
        }
        let pkt = self.out.pop_front()?;
        let more = self.out.front().is_some_and(|next| {
            next.dlid == dlid && next.src_qpn == pkt.src_qpn && next.dest_qpn == pkt.dest_qpn
        });
        self.n += 1;
        self.bytes += u64::from(pkt.payload.len());
        Some((pkt, more))
    }
}

impl Cut<'_> {
    /// The port at `dlid`, if a packet from the port at `slid` may go to it now (see
    /// [`Cut`]): a port's own LID other than the sender's, no hook or tap watching, and
    /// nothing from `slid` waiting for it or being delivered to it.
    ///
    /// A quiet lane says so without its lock, and `note` then names the port if it is the
    /// one noted last and no port has been attached or detached since.
    fn port_for(&self, slid: Lid, dlid: Lid, note: &mut PortNote) -> Option<Arc<dyn PacketSink>> {
        let dst = slot(dlid);
        if dst == 0 || dlid == slid || !self.fabric.unwatched() {
            return None;
        }
        let inner = &self.fabric.inner;
        let lane = inner.lanes.get(dst)?;
        let epoch = inner.port_epoch.load(Acquire);
        if lane.is_quiet() && note.lid == dlid && note.epoch == epoch {
            return note.port.as_ref()?.upgrade();
        }
        let d = lane.lock();
        if d.claimed || d.holds_from(slot(slid) as Lid) {
            return None;
        }
        *note = PortNote {
            lid: dlid,
            epoch,
            port: d.port.clone(),
        };
        d.port()
    }

    /// Sends the packets in `out` (emptying it), which the port at `slid` sent in this
    /// order: each run of them for one port straight to it, if [`Cut::port_for`] gives it
    /// and it is free, else to the queue. A run is a burst at most (see [`take_burst`]).
    /// Another follows for the same port while nothing else waits for it (its lane is
    /// quiet) and the cut's budget lasts; else the rest is queued, where the port's other
    /// sources take their turns. Ports whose turns left work go in `resume`.
    pub(crate) fn send(
        &mut self,
        slid: Lid,
        out: &mut VecDeque<Packet>,
        note: &mut PortNote,
        resume: &mut Vec<Arc<dyn PacketSink>>,
    ) {
        while let Some(dlid) = out.front().map(|p| p.dlid) {
            let for_dst = |p: &Packet| p.dlid == dlid;
            let mut queue_rest = true;
            let within = self.budget > 0 && self.packets_left > 0;
            if let Some(port) = self.port_for(slid, dlid, note).filter(|_| within) {
                let mut run = Run {
                    out: &mut *out,
                    dlid,
                    n: 0,
                    bytes: 0,
                };
                let took = port.try_deliver_run(&mut run);
                let (n, bytes) = (run.n, run.bytes);
                if let Some((rejected, more_turns)) = took {
                    self.delivered += (n - rejected.len()) as u64;
                    self.budget = self.budget.saturating_sub(bytes);
                    self.packets_left = self.packets_left.saturating_sub(n);
                    for Rejected(pkt) in rejected {
                        self.fabric.bounce(*pkt, DropReason::Rejected);
                    }
                    if more_turns {
                        resume.push(port);
                    }
                    // Another run follows while nothing else waits for the port.
                    queue_rest = !self
                        .fabric
                        .inner
                        .lanes
                        .get(slot(dlid))
                        .is_some_and(Lane::is_quiet);
                }
            }
            // The run if the port was busy, or the rest after a run while something else
            // waits for the port (where it takes its turn) or the cut's budget is spent:
            // queued, and later packets for the port behind them (its lane now holds some
            // from this sender).
            if queue_rest {
                while out.front().is_some_and(for_dst) {
                    if let Some(pkt) = out.pop_front() {
                        self.fabric.enqueue(pkt);
                    }
                }
            }
        }
    }

    /// The packet a delivery of this cut sent back to the cut's port when nothing from
    /// its sender waited for that port (see [`Fabric::push`]): the port's turn, which
    /// holds its lock, takes it now and gives [`Cut::took`] the outcome. Nothing can
    /// overtake it: the port's lock keeps any other delivery out until then.
    pub(crate) fn returned(&self) -> Option<Packet> {
        CUT.with(|c| c.borrow_mut().back.take()).map(|(_, pkt)| pkt)
    }

    /// What became of the packet [`Cut::returned`] gave.
    pub(crate) fn took(&mut self, outcome: Result<(), Rejected>) {
        match outcome {
            Ok(()) => self.delivered += 1,
            Err(Rejected(pkt)) => self.fabric.bounce(*pkt, DropReason::Rejected),
        }
    }
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        // A packet sent back and not taken (the turn's rounds ran out) goes first in its
        // source's turn in its lane: anything from there queued behind it is newer.
        let (port, back) = CUT.with(|c| {
            let mut c = c.borrow_mut();
            (std::mem::take(&mut c.port), c.back.take())
        });
        if let Some((src, pkt)) = back {
            let lanes = &self.fabric.inner.lanes;
            if let Some(lane) = lanes.get(port) {
                lanes.count_in(usize::from(src), weight(&pkt));
                lane.lock().push_front(src, Item::Packet(pkt));
                note_queued(self.fabric.id(), port);
            }
        }
        self.fabric.requeue_handoff();
        if self.delivered != 0 {
            // Only this port's turns write its count (its lock is held), so a load and a
            // store do: no atomic, and no line another core writes. Slot 0's ports share
            // theirs (LIDs past the slots), and count with one.
            let lanes = &self.fabric.inner.lanes;
            match lanes.get(port).filter(|_| port != 0) {
                Some(lane) => {
                    let n = lane.cut_delivered.load(Relaxed);
                    lane.cut_delivered.store(n + self.delivered, Relaxed);
                }
                None => {
                    let c = &self.fabric.inner.stats.delivered;
                    c.fetch_add(self.delivered, Relaxed);
                }
            }
        }
        PUMPING.with(|p| p.set(0));
    }
}

impl Fabric {
    /// Starts a cut-through for a device's turn on this thread: None inside a pump (a
    /// delivery's own turn queues what it sends) or while a hook or tap watches the links
    /// (they see every packet on the way).
    pub(crate) fn begin_cut(&self, lid: Lid) -> Option<Cut<'_>> {
        if in_a_pump() || !self.unwatched() {
            return None;
        }
        PUMPING.with(|p| p.set(self.id()));
        CUT.with(|c| c.borrow_mut().port = slot(lid));
        Some(Cut {
            fabric: self,
            delivered: 0,
            budget: CUT_BYTES,
            packets_left: CUT_PACKETS,
        })
    }

    /// Whether a device's turn on this thread may move what it sends itself (see [`Cut`]):
    /// not inside a pump, no hook or tap attached.
    pub(crate) fn may_cut(&self) -> bool {
        !in_a_pump() && self.unwatched()
    }
}
