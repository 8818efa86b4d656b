//! The fabric: an in-process switch keyed by LID, acting as subnet manager (it hands out the
//! LIDs), with one link per port and a hook on every link.
//!
//! Delivery: packets are queued per (destination, source) port in the order their senders
//! produced them (a sender enqueues while holding its own lock) and served round-robin, so a
//! port flooding the fabric delays another's packets by one item each, not by its backlog.
//! Each destination has a lane of its own (its own lock and cache lines: see `Lanes`), so
//! guests whose traffic goes to different ports move it on different cores without meeting.
//! Any thread that pumps delivers items for destinations no other thread is serving, taking
//! one HCA lock at a time: each source's packets reach each destination in order (RC's
//! need), exactly once, deliveries to different ports run in parallel, and no deadlock is
//! possible (no thread waits for an HCA lock while it holds one). Where no hook or tap
//! watches, a device's turn moves what it sent itself before it lets go of its lock, when
//! that overtakes nothing and the receiving port is free (a cut-through: see `Cut`): a
//! message and its ACK then take no queue, no pump and one turn of each port's lock. In
//! the queue too, where no hook or tap watches, a run of one stream's packets (the same
//! sender QP to the same QP) is handed to its port as one burst of at most [`MAX_BURST`]
//! packets, taken in one turn of the port's lock. An answer sent inside a pump (an ACK, a
//! response) to a port nothing waits for goes to that pump directly (`Fabric::push`).
//!
//! Every packet crosses two links: its source port's uplink and its destination port's
//! downlink, and the [`LinkHook`] sees it on both. Fault injection, capture and remote links
//! attach there (ARCHITECTURE.md section 6).
//!
//! Time: the fabric owns the clock the ports' transport timers run on (RC retransmission,
//! RNR waits) and calls every port's [`PacketSink::tick`] as it advances. A real-time fabric
//! ticks from its own thread every [`TICK`]; a manual one ([`Fabric::with_manual_clock`])
//! moves only when [`Fabric::advance`] says, so tests run timeouts in virtual time.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::adapter_hook::AdapterHook;
use crate::packet::Packet;
use crate::partition::{self, PKeyTable, Partition, PartitionError};
use crate::sa::{SubnetAdmin, SM_LID};
use crate::sync::{Unpoisoned, UnpoisonedRw};

/// A port's local identifier. LID 0 is invalid in IB; the fabric hands out 1, 2, ...
pub type Lid = u16;

/// Why a packet did not reach a receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// No port has the destination LID (never attached, or detached: a dead node).
    NoRoute,
    /// A link hook dropped it.
    Hook,
    /// The receiving HCA had no QP for it, or the QP could not take it.
    Rejected,
}

/// A receiver discarded a packet (no such QP, wrong state, not from the QP's peer, ...),
/// and gives it back unchanged: its sender hears of it. (Boxed: refusals are rare, and the
/// result of every delivery stays small.)
#[derive(Debug)]
pub struct Rejected(pub Box<Packet>);

impl Rejected {
    pub fn of(pkt: Packet) -> Self {
        Rejected(Box::new(pkt))
    }
}

/// A LID that is 0 or held by a live port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LidTaken(pub Lid);

impl std::fmt::Display for LidTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LID {} is invalid or already in use on this fabric",
            self.0
        )
    }
}

impl std::error::Error for LidTaken {}

/// What a port does with packets: the HCA side of a link.
pub trait PacketSink: Send + Sync {
    /// Takes one packet; `Err` means the receiver discarded it.
    fn deliver(&self, pkt: Packet) -> Result<(), Rejected>;
    /// Like `deliver`; `more`: the next item queued for this port is a packet of the same
    /// stream (from the same sender QP to the same QP), to be delivered next (by this
    /// thread or another). A port may hold back what the last delivery of such a burst can
    /// send for all of it: one ACK covers every message before it. The fabric says `more`
    /// only where nothing can come between (no hook or tap attached), and never across
    /// streams, so no QP's answer waits behind another QP's traffic.
    fn deliver_in_burst(&self, pkt: Packet, more: bool) -> Result<(), Rejected> {
        let _ = more;
        self.deliver(pkt)
    }
    /// Takes several packets of one stream, in order, as [`PacketSink::deliver_in_burst`]
    /// would one by one (`more` for the last); a port may take them in one turn. Returns
    /// the packets it discarded.
    fn deliver_burst(&self, pkts: Vec<Packet>, more: bool) -> Vec<Rejected> {
        let n = pkts.len();
        let mut rejected = Vec::new();
        for (i, pkt) in pkts.into_iter().enumerate() {
            if let Err(r) = self.deliver_in_burst(pkt, more || i + 1 < n) {
                rejected.push(r);
            }
        }
        rejected
    }
    /// Takes a run of packets for this port from another port's turn (see `Cut`), in
    /// order, each with whether the next is of its stream (as `more` in
    /// [`PacketSink::deliver_in_burst`]), but only if it can without waiting (the caller
    /// holds its own port's lock): None, with nothing taken from `run`, if it is busy.
    /// Otherwise the packets it discarded, and whether its turn left work for more turns
    /// (see [`PacketSink::resume`]).
    fn try_deliver_run(&self, run: &mut Run<'_>) -> Option<(Vec<Rejected>, bool)> {
        let _ = run;
        None
    }
    /// Goes on with work a turn left (`try_deliver_run` said so), waiting for the port.
    fn resume(&self) {}
    /// Hears back about one of its own packets that reached no receiver.
    fn undeliverable(&self, pkt: Packet, why: DropReason);
    /// The fabric's clock reads `now_ns`: fire the timers that are due.
    fn tick(&self, _now_ns: u64) {}
    /// The port's GUID (its GID's interface ID), for the subnet administrator.
    fn port_guid(&self) -> Option<u64> {
        None
    }
    /// The port's link went down (false) or came back up (true).
    fn link_changed(&self, _up: bool) {}
    /// The capability bits the port advertises (PortInfo:CapabilityMask), which its driver
    /// sets; the SA's PortInfoRecords show them.
    fn capability_mask(&self) -> u32 {
        0
    }
    /// The fabric has an adapter hook (true) or none (false) from now on: said when the
    /// port is attached and at every change, in order.
    fn adapter_hook_changed(&self, _attached: bool) {}
    /// The port's P_Key table, as the subnet manager set it (see `crate::partition`):
    /// said when the port is attached and whenever the partitions change.
    fn pkeys_changed(&self, _table: &PKeyTable) {}
    /// The port's counters (`CTR_*` order, as QUERY_COUNTERS gives them), if it keeps any.
    fn counters(&self) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        None
    }
}

/// The most queued items a port may leave behind it (see
/// [`Fabric::pump_with_backpressure`]), in units of [`BACKLOG_UNIT`]: an item counts one,
/// and one more per `BACKLOG_UNIT` bytes it holds on the heap (a datagram's payload, a
/// long message's piece of gather records; [`Packet::heap_bytes`]). So a port's queued
/// items hold at most about 18 MiB of host memory (16384 slots of 128 bytes, 16 MiB
/// beside them), whatever they are: 16384 small packets, or 3276 full-size datagrams.
pub const MAX_BACKLOG: usize = 16384;

/// Host bytes beside an item that count as one item more in the backlog.
pub const BACKLOG_UNIT: usize = 1024;

/// The most queued items in all (in the same units), past which every sender waits:
/// several floods at once.
pub const MAX_TOTAL_BACKLOG: usize = 8 * MAX_BACKLOG;

/// What `pkt` counts in the backlog (see [`MAX_BACKLOG`]).
fn weight(pkt: &Packet) -> usize {
    1 + pkt.heap_bytes() / BACKLOG_UNIT
}

/// The most packets of one stream a pump hands a port at once (see
/// [`PacketSink::deliver_burst`]), and the payload bytes past which it stops adding more:
/// a burst saves the queue's and the port's per-packet bookkeeping, and stays short enough
/// that another source's packet for the same port waits for little.
const MAX_BURST: usize = 16;
const MAX_BURST_BYTES: u64 = 64 << 10;

thread_local! {
    /// The fabric whose queue this thread is moving (its [`Fabric::id`]; 0: none).
    /// Deliveries' own sends must not wait for it.
    static PUMPING: Cell<usize> = const { Cell::new(0) };
    /// A packet a delivery inside this thread's pump sent to a lane with nothing queued and
    /// no one delivering: claimed for the pump, which delivers it next (see
    /// [`Fabric::push`]).
    static HANDOFF: RefCell<Option<Handoff>> = const { RefCell::new(None) };
    /// The cut-through this thread runs (see [`Cut`]): its port's slot (0: none), and the
    /// packet for that port a delivery sent back, taken by the port's own turn.
    static CUT: RefCell<CutBack> = const { RefCell::new(CutBack { port: 0, back: None }) };
    /// What [`Fabric::pump_own`] serves: the destinations this thread queued items for.
    static QUEUED_TO: RefCell<QueuedTo> = const {
        RefCell::new(QueuedTo { to: Vec::new(), next: 0 })
    };
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
fn keep_back(dst: usize, src: Lid, pkt: Packet) -> Option<Packet> {
    CUT.with(|c| {
        let mut c = c.borrow_mut();
        if c.port != dst || dst == 0 || c.back.is_some() {
            return Some(pkt);
        }
        c.back = Some((src, pkt));
        None
    })
}

/// (fabric, destination slot) pairs this thread queued items for since its last pump of
/// that fabric, and where its next look starts (so that its destinations take turns). A
/// few entries: a plain list beats a ring here.
struct QueuedTo {
    to: Vec<(usize, usize)>,
    next: usize,
}

/// The next of the destinations this thread queued for on fabric `fabric` whose lane
/// `open` finds open (it returns the lane, locked), served in turn. A destination drops
/// from the list once it is empty, or claimed by another thread (which goes on with it: it
/// holds it in its own list, or serves every destination).
#[inline]
fn next_own<'a>(
    fabric: usize,
    mut open: impl FnMut(usize) -> Option<LaneGuard<'a>>,
) -> Option<(usize, LaneGuard<'a>)> {
    QUEUED_TO.with(|mine| {
        let mine = &mut *mine.borrow_mut();
        // Each entry is looked at once, from the cursor on and around: one of this fabric's
        // that is no longer open drops out (the last entry takes its place, looked at next);
        // the first open one is served and the cursor moves past it; another fabric's is
        // passed over.
        let mut i = mine.next;
        for _ in 0..mine.to.len() {
            if i >= mine.to.len() {
                i = 0;
            }
            let &(f, dst) = mine.to.get(i)?;
            if f != fabric {
                i += 1;
            } else if let Some(lane) = open(dst) {
                mine.next = i + 1;
                return Some((dst, lane));
            } else {
                mine.to.swap_remove(i);
            }
        }
        None
    })
}

/// Whether this thread is inside a pump (of any fabric).
fn in_a_pump() -> bool {
    PUMPING.with(Cell::get) != 0
}

/// Whether `dst` is the only destination on fabric `fabric` in this thread's list.
fn only_own(fabric: usize, dst: usize) -> bool {
    QUEUED_TO.with(|mine| {
        let mine = mine.borrow();
        let mut on = mine.to.iter().filter(|&&(f, _)| f == fabric);
        on.next() == Some(&(fabric, dst)) && on.next().is_none()
    })
}

/// Drops `dst` on fabric `fabric` from this thread's list (its lane is empty).
fn forget_own(fabric: usize, dst: usize) {
    QUEUED_TO.with(|mine| {
        let to = &mut mine.borrow_mut().to;
        if let Some(i) = to.iter().position(|&e| e == (fabric, dst)) {
            to.swap_remove(i);
        }
    });
}

/// A packet handed to the pump of the thread that sent it (see [`HANDOFF`]).
struct Handoff {
    dst: usize,
    src: Lid,
    pkt: Packet,
    port: Option<Arc<dyn PacketSink>>,
}

/// This thread's pump of `fabric`, and the destination it has claimed. Ends the pump
/// however it ends: a delivery that panics (a device bug) must not leave its destination
/// claimed, or this thread's later pumps returning at once.
struct Pumping<'a> {
    fabric: &'a Fabric,
    claimed: Option<usize>,
    /// Packets it handed to their ports since it claimed its lane, counted there
    /// (`DstQueue::delivered`) when it lets go of it: no atomic of their own.
    delivered: u64,
}

impl<'a> Pumping<'a> {
    fn start(fabric: &'a Fabric) -> Self {
        PUMPING.with(|p| p.set(fabric.id()));
        Self {
            fabric,
            claimed: None,
            delivered: 0,
        }
    }

    /// Lets go of the lane it claimed, counting there what it delivered; returns that
    /// lane, still locked (the pump may serve it again in the same turn of its lock).
    fn settle(&mut self) -> Option<(usize, LaneGuard<'a>)> {
        let dst = self.claimed.take()?;
        let mut lane = self.fabric.lane(dst)?;
        lane.claimed = false;
        lane.delivered += std::mem::take(&mut self.delivered);
        Some((dst, lane))
    }
}

impl Drop for Pumping<'_> {
    fn drop(&mut self) {
        drop(self.settle());
        // A delivery that panicked may leave a packet handed over.
        self.fabric.requeue_handoff();
        if self.delivered != 0 {
            let c = &self.fabric.inner.stats.delivered;
            c.fetch_add(self.delivered, Relaxed);
        }
        PUMPING.with(|p| p.set(0));
    }
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

    /// A packet left handed over to this thread's pump (see [`HANDOFF`]) goes back to the
    /// head of its lane, no longer claimed, for this thread's next pump.
    fn requeue_handoff(&self) {
        let Some(h) = HANDOFF.with(|h| h.borrow_mut().take()) else {
            return;
        };
        let lanes = &self.inner.lanes;
        if let Some(lane) = lanes.get(h.dst) {
            let mut d = lane.lock();
            lanes.count_in(usize::from(h.src), weight(&h.pkt));
            d.push_front(h.src, Item::Packet(h.pkt));
            d.claimed = false;
            drop(d);
            note_queued(self.id(), h.dst);
        }
    }
}

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

/// Whether this thread has queued items for fabric `fabric` that it has not moved.
fn queued_any(fabric: usize) -> bool {
    QUEUED_TO.with(|q| q.borrow().to.iter().any(|&(f, _)| f == fabric))
}

/// Notes that this thread queued an item for `dst` on fabric `fabric`.
fn note_queued(fabric: usize, dst: usize) {
    QUEUED_TO.with(|q| {
        let to = &mut q.borrow_mut().to;
        if to.last() != Some(&(fabric, dst)) && !to.contains(&(fabric, dst)) {
            to.push((fabric, dst));
        }
    });
}

/// How often a real-time fabric runs its ports' timers.
pub const TICK: Duration = Duration::from_millis(1);

enum Clock {
    Real(Instant),
    Manual(AtomicU64),
}

/// Which way a packet crosses a port's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkDir {
    /// From the port's HCA into the switch.
    Up,
    /// From the switch to the port's HCA.
    Down,
}

/// A link: the port at one end (the switch is at the other) and the direction of travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinkId {
    pub lid: Lid,
    pub dir: LinkDir,
}

/// The hook's decision for one packet on one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Goes on, and a copy right behind it.
    Duplicate,
    /// Held for this many nanoseconds of fabric time, then goes on (later packets overtake
    /// it: reordering).
    Delay(u64),
}

/// Where a held packet resumes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// It passed its uplink: route it, then the downlink.
    Routed,
    /// It passed the downlink of the port at this LID: deliver it there (a multicast
    /// packet's copies each go to their own port).
    Arrived(Lid),
}

/// Sees (and may change, drop, copy or hold) every packet on every link; `now_ns` is the
/// fabric's clock.
pub trait LinkHook: Send + Sync {
    fn on_packet(&self, link: LinkId, now_ns: u64, pkt: &mut Packet) -> Verdict;
    /// Whether the link of the port at `lid` is up (its port is ACTIVE) at `now_ns`.
    fn link_up(&self, _lid: Lid, _now_ns: u64) -> bool {
        true
    }
}

/// Sees every packet once, as its sender put it on its uplink, before any hook: a capture.
pub trait PacketTap: Send + Sync {
    fn on_wire(&self, now_ns: u64, pkt: &Packet);
}

/// Delivery counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    pub delivered: u64,
    pub no_route: u64,
    pub hook_dropped: u64,
    pub rejected: u64,
}

/// What the fabric moves: packets, and notices to senders whose packets went nowhere. A
/// notice waits its turn behind what was already queued, as the sender's timeout would: an
/// ACK or NAK already on its way arrives first. (A notice is boxed: it is rare, and an item
/// as small as a packet moves without a memcpy.)
enum Item {
    Packet(Packet),
    Bounce(Box<(Packet, DropReason)>),
}

impl Item {
    /// What it counts in the backlog.
    fn weight(&self) -> usize {
        match self {
            Item::Packet(p) => weight(p),
            Item::Bounce(b) => weight(&b.0),
        }
    }
}

const _: () = assert!(std::mem::size_of::<Item>() <= std::mem::size_of::<Packet>());

/// `first` and the packets of its stream queued right behind it in lane `d` (which the
/// caller has claimed), up to [`MAX_BURST`] packets or [`MAX_BURST_BYTES`] of payload.
/// Also says whether the stream goes on behind them.
fn take_burst(d: &mut DstQueue, first: Packet) -> (Vec<Packet>, bool) {
    let mut bytes = u64::from(first.payload.len());
    let mut burst = Vec::with_capacity(MAX_BURST);
    burst.push(first);
    loop {
        let follows = burst.last().is_some_and(|last| d.next_follows(last));
        if !follows || burst.len() == MAX_BURST || bytes > MAX_BURST_BYTES {
            return (burst, follows);
        }
        let Some((_, Item::Packet(p))) = d.take() else {
            unreachable!("next_follows saw a packet next");
        };
        bytes += u64::from(p.payload.len());
        burst.push(p);
    }
}

/// Queues past this LID share slot 0 with the SM and multicast (a guest may address any
/// LID; the slot table stays small).
const SLOTS: usize = 4096;

/// The destination slot of a LID: its own for a port's LID, 0 for the SM, multicast and
/// LIDs past [`SLOTS`].
fn slot(lid: Lid) -> usize {
    match usize::from(lid) {
        l if l < SLOTS && lid < SM_LID => l,
        _ => 0,
    }
}

/// Items a source may have queued before it counts as crowding the fabric: while no
/// source has more, the fabric holds at most [`MAX_TOTAL_BACKLOG`] items in all (one
/// source per slot), and no sender's turn needs to add them up.
const CROWD: usize = MAX_TOTAL_BACKLOG / SLOTS;
const _: () = assert!(CROWD * SLOTS <= MAX_TOTAL_BACKLOG && CROWD > 0 && CROWD < MAX_BACKLOG);

/// Everything queued, as a lane per destination slot: in each, a FIFO per source slot,
/// served round-robin over the sources. One sender's flood then delays another's packet
/// to the same port by one item, not by the flood; the order of one source's items to one
/// destination (what RC needs) is kept.
///
/// Each lane has its own lock, and beside it the count of items its slot has queued as a
/// source (in any lane): guests whose traffic goes to different ports share no lock and no
/// cache line they write, and their threads move packets on different cores at once. (One
/// lock for the whole queue made each pump wait for the other's and miss in cache on what
/// it wrote: two pairs on two threads moved fewer messages than one; the bench's `cores`
/// part measures it.) A lane is made when its slot is first used.
///
/// A destination is claimed by the thread delivering its item, so its items arrive one at
/// a time and in order, while items for other destinations are delivered by other threads
/// at the same moment (each HCA has its own lock). A device's thread delivers what it
/// queued itself (and what those deliveries queue), not another guest's backlog: see
/// [`Fabric::pump_with_backpressure`]. No thread holds two lanes' locks at once.
struct Lanes {
    slots: Box<[OnceLock<Box<Lane>>]>,
    /// One past the highest slot with a lane: what a look at every lane covers.
    top: AtomicUsize,
    /// Sources with more than [`CROWD`] items queued.
    crowded: AtomicUsize,
}

/// One slot's lane, on cache lines of its own (see [`Lanes`]).
#[derive(Default)]
#[repr(align(128))]
struct Lane {
    q: Mutex<DstQueue>,
    /// Items queued with this slot as their source, in every lane: what backpressure
    /// holds a sender to. Counted before an item is queued and after it is taken, so never
    /// short.
    from_here: AtomicUsize,
    /// The lane held no item and was not claimed when its lock was last let go (false
    /// until then). Read without the lock by a turn holding a sender's device lock: true
    /// then means nothing that sender sent waits here or is being delivered from here
    /// (whoever queued or claimed it let go of this lock, then of the sender's, before),
    /// so a packet of the sender's may go straight to the port (see [`Cut`]).
    quiet: AtomicBool,
    /// Packets this slot's port handed straight to their ports in its cut-throughs (part
    /// of `FabricStats::delivered`).
    cut_delivered: AtomicU64,
}

impl Lanes {
    fn new() -> Self {
        Self {
            slots: std::iter::repeat_with(OnceLock::new).take(SLOTS).collect(),
            top: AtomicUsize::new(0),
            crowded: AtomicUsize::new(0),
        }
    }

    fn get(&self, slot: usize) -> Option<&Lane> {
        self.slots.get(slot)?.get().map(|l| &**l)
    }

    fn get_or_make(&self, slot: usize) -> Option<&Lane> {
        let cell = self.slots.get(slot)?;
        Some(cell.get_or_init(|| {
            self.top.fetch_max(slot + 1, Relaxed);
            Box::default()
        }))
    }

    /// One past the highest slot with a lane.
    fn top(&self) -> usize {
        self.top.load(Acquire).min(SLOTS)
    }

    /// Every lane made so far, with its slot.
    fn all(&self) -> impl Iterator<Item = (usize, &Lane)> {
        (0..self.top()).filter_map(|s| Some((s, self.get(s)?)))
    }

    /// `n` more items queued from slot `src`.
    fn count_in(&self, src: usize, n: usize) {
        let Some(lane) = self.get_or_make(src) else {
            return;
        };
        let before = lane.from_here.fetch_add(n, Relaxed);
        if before <= CROWD && before + n > CROWD {
            self.crowded.fetch_add(1, Relaxed);
        }
    }

    /// `n` items from slot `src` taken off the queue.
    fn count_out(&self, src: usize, n: usize) {
        let Some(lane) = self.get(src) else {
            return;
        };
        let before = lane.from_here.fetch_sub(n, Relaxed);
        if before > CROWD && before - n <= CROWD {
            self.crowded.fetch_sub(1, Relaxed);
        }
    }

    /// Items queued from slot `src`.
    fn queued_from(&self, src: usize) -> usize {
        self.get(src).map_or(0, |l| l.from_here.load(Relaxed))
    }

    /// Items queued in all.
    fn total(&self) -> usize {
        self.all().map(|(_, l)| l.from_here.load(Relaxed)).sum()
    }
}

/// A destination's queue: what its [`Lane`]'s lock guards.
#[derive(Default)]
struct DstQueue {
    /// Per source slot, its FIFO; kept when empty (the same few sources keep sending), at
    /// most [`SLOTS`] of them.
    srcs: Vec<(Lid, VecDeque<Item>)>,
    /// Indices into `srcs` with items, in service order.
    turn: VecDeque<usize>,
    /// The index the last push used.
    last: usize,
    claimed: bool,
    /// The port at this slot (slot 0, shared, has none): the pump finds it here while it
    /// holds the lane anyway, not through the table's lock (two atomics less a packet).
    port: Option<Weak<dyn PacketSink>>,
    /// Packets pumps handed straight to their ports from here (part of
    /// `FabricStats::delivered`).
    delivered: u64,
}

impl DstQueue {
    /// The index of `src`'s FIFO (a new one for a new source).
    #[inline]
    fn source(&mut self, src: Lid) -> usize {
        match self.srcs.get(self.last) {
            Some((s, _)) if *s == src => self.last,
            _ => match self.srcs.iter().position(|(s, _)| *s == src) {
                Some(i) => i,
                None => {
                    self.srcs.push((src, VecDeque::new()));
                    self.srcs.len() - 1
                }
            },
        }
    }

    #[inline]
    fn push(&mut self, src: Lid, item: Item) {
        let i = self.source(src);
        self.last = i;
        let Some((_, q)) = self.srcs.get_mut(i) else {
            return;
        };
        if q.is_empty() {
            self.turn.push_back(i);
        }
        q.push_back(item);
    }

    /// Puts `item` back at the head of its source's FIFO, first in turn.
    fn push_front(&mut self, src: Lid, item: Item) {
        let i = self.source(src);
        let Some((_, q)) = self.srcs.get_mut(i) else {
            return;
        };
        if q.is_empty() {
            self.turn.push_front(i);
        }
        q.push_front(item);
    }

    /// Whether items from `src` wait here.
    fn holds_from(&self, src: Lid) -> bool {
        self.srcs.iter().any(|(s, q)| *s == src && !q.is_empty())
    }

    /// The port at this slot, if it has its own (not slot 0) and it is still there.
    fn port(&self) -> Option<Arc<dyn PacketSink>> {
        self.port.as_ref()?.upgrade()
    }

    /// Whether it has items that no thread is delivering.
    fn open(&self) -> bool {
        !self.claimed && !self.turn.is_empty()
    }

    /// The next item, and the source slot it came from; the caller then holds the lane
    /// claimed until it lets go of it.
    #[inline]
    fn take(&mut self) -> Option<(Lid, Item)> {
        let i = self.turn.pop_front()?;
        let (src, q) = self.srcs.get_mut(i)?;
        let item = q.pop_front()?;
        if !q.is_empty() {
            self.turn.push_back(i);
        }
        self.claimed = true;
        Some((*src, item))
    }

    /// Whether the next item it will serve is a packet of `pkt`'s stream (the same sender
    /// QP to the same QP).
    fn next_follows(&self, pkt: &Packet) -> bool {
        let next = self.turn.front().and_then(|&i| self.srcs.get(i)?.1.front());
        matches!(next, Some(Item::Packet(n))
            if n.slid == pkt.slid && n.src_qpn == pkt.src_qpn && n.dest_qpn == pkt.dest_qpn)
    }
}

impl Lane {
    /// Locks the lane (one a panicking delivery left behind is whole: no change to a lane
    /// runs into a delivery).
    fn lock(&self) -> LaneGuard<'_> {
        LaneGuard {
            d: self.q.lock_unpoisoned(),
            quiet: &self.quiet,
        }
    }

    /// Whether the lane was empty and unclaimed when its lock was last let go (see
    /// [`Lane::quiet`]).
    fn is_quiet(&self) -> bool {
        self.quiet.load(Acquire)
    }
}

/// A lane, locked. Letting go of it notes in [`Lane::quiet`] whether it is empty and
/// unclaimed.
struct LaneGuard<'a> {
    d: MutexGuard<'a, DstQueue>,
    quiet: &'a AtomicBool,
}

impl std::ops::Deref for LaneGuard<'_> {
    type Target = DstQueue;
    fn deref(&self) -> &DstQueue {
        &self.d
    }
}

impl std::ops::DerefMut for LaneGuard<'_> {
    fn deref_mut(&mut self) -> &mut DstQueue {
        &mut self.d
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        // (Before the lock is let go: the guard's fields drop after this.)
        self.quiet
            .store(self.d.turn.is_empty() && !self.d.claimed, Release);
    }
}

/// Something attached to the fabric at run time (a hook, a tap), swapped under traffic.
/// Asked for on every packet, WQE and CQE: when nothing is attached (the usual case) the
/// answer comes from one atomic load, without the lock.
struct Attachment<T: ?Sized> {
    slot: RwLock<Option<Arc<T>>>,
    present: AtomicBool,
}

impl<T: ?Sized> Default for Attachment<T> {
    fn default() -> Self {
        Self {
            slot: RwLock::new(None),
            present: AtomicBool::new(false),
        }
    }
}

impl<T: ?Sized> Attachment<T> {
    fn set(&self, v: Option<Arc<T>>) {
        let mut slot = self.slot.write_unpoisoned();
        self.present.store(v.is_some(), Release);
        *slot = v;
    }

    /// Whether something is attached (one atomic load).
    fn is_set(&self) -> bool {
        self.present.load(Acquire)
    }

    fn get(&self) -> Option<Arc<T>> {
        if !self.is_set() {
            return None;
        }
        self.slot.read_unpoisoned().clone()
    }
}

struct Inner {
    ports: RwLock<Vec<Option<Weak<dyn PacketSink>>>>,
    lanes: Lanes,
    hook: Attachment<dyn LinkHook>,
    tap: Attachment<dyn PacketTap>,
    adapter_hook: Attachment<dyn AdapterHook>,
    stats: Counters,
    clock: Clock,
    /// Packets a hook delayed: (due time, where they resume, the packet).
    held: Mutex<Vec<(u64, Stage, Packet)>>,
    /// The subnet administrator's port, at [`SM_LID`].
    sa: Arc<SaPort>,
    /// LIDs whose link the hook has down (their ports were told).
    links_down: Mutex<Vec<Lid>>,
    /// The partitions beside the default as last set, and the P_Key tables of the ports in
    /// one (the rest have the default table).
    pkeys: RwLock<Partitioning>,
    /// The SA queued trap Reports from where no pump may run (a port attaching or leaving
    /// under its device's lock): the next tick moves them.
    reports_waiting: AtomicBool,
    /// Counts ports attached and detached (see [`PortNote`]).
    port_epoch: AtomicU64,
}

/// A subnet's partitions beside the default and the port tables they make.
type Partitioning = (Vec<Partition>, Vec<(Lid, PKeyTable)>);

/// The port the subnet administrator answers on: a packet for [`SM_LID`] is a query, and
/// its answer goes back onto the fabric like any port's packet.
struct SaPort {
    fabric: Weak<Inner>,
    sa: Mutex<SubnetAdmin>,
    /// The switch's PMA, which reads device counters: never under the SA's lock (a port
    /// attaching holds its device's lock and then takes the SA's).
    pma: Mutex<crate::sa::pma::Agent>,
}

impl PacketSink for SaPort {
    fn deliver(&self, pkt: Packet) -> Result<(), Rejected> {
        let Some(inner) = self.fabric.upgrade() else {
            return Err(Rejected::of(pkt));
        };
        let fabric = Fabric { inner };
        let counters = (self.pma.lock_unpoisoned()).answer(&pkt, &fabric);
        let answer = match counters {
            Some(a) => Some(vec![a]),
            None => {
                let mut sa = self.sa.lock_unpoisoned();
                sa.answer(&pkt, &fabric)
            }
        };
        match answer {
            // Queued behind what is in flight; the pump that delivered the query moves it.
            Some(packets) => {
                for a in packets {
                    fabric.enqueue(a);
                }
                Ok(())
            }
            None => Err(Rejected::of(pkt)),
        }
    }

    fn undeliverable(&self, _pkt: Packet, _why: DropReason) {}

    fn port_guid(&self) -> Option<u64> {
        None
    }
}

impl crate::sa::Ports for Fabric {
    fn lid_of(&self, guid: u64) -> Option<Lid> {
        let ports = self.inner.ports.read_unpoisoned();
        ports.iter().enumerate().find_map(|(lid, p)| {
            let sink = p.as_ref()?.upgrade()?;
            (sink.port_guid() == Some(guid)).then_some(lid as Lid)
        })
    }

    fn guid_of(&self, lid: Lid) -> Option<u64> {
        self.port(lid)?.port_guid()
    }

    fn lids(&self) -> Vec<Lid> {
        let ports = self.inner.ports.read_unpoisoned();
        ports
            .iter()
            .enumerate()
            .filter_map(|(lid, p)| {
                let sink = p.as_ref()?.upgrade()?;
                sink.port_guid().map(|_| lid as Lid)
            })
            .collect()
    }

    fn link_up(&self, lid: Lid) -> bool {
        let down = self.inner.links_down.lock_unpoisoned();
        !down.contains(&lid)
    }

    fn capability_mask(&self, lid: Lid) -> u32 {
        self.port(lid).map_or(0, |p| p.capability_mask())
    }

    fn pkeys(&self, lid: Lid) -> PKeyTable {
        self.pkey_table(lid)
    }

    fn now_ns(&self) -> u64 {
        Fabric::now_ns(self)
    }

    fn counters(&self, lid: Lid) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        Fabric::counters(self, lid)
    }
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    no_route: AtomicU64,
    hook_dropped: AtomicU64,
    rejected: AtomicU64,
}

/// A switched fabric. Cheap to clone; all clones are the same fabric.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Inner>,
}

impl Default for Fabric {
    fn default() -> Self {
        Self::new()
    }
}

impl Fabric {
    /// A fabric on the real clock, with a thread that runs its timers (it ends when the
    /// last clone of the fabric is dropped).
    pub fn new() -> Self {
        let f = Self::with_clock(Clock::Real(Instant::now()));
        let weak = Arc::downgrade(&f.inner);
        let spawned = std::thread::Builder::new()
            .name("fabric-timer".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                Fabric { inner }.tick();
            });
        if let Err(e) = spawned {
            log::error!("fabric timer thread: {e}; RC retransmission will not run");
        }
        f
    }

    /// A fabric whose clock stands still until [`Fabric::advance`]: timeouts in virtual time.
    pub fn with_manual_clock() -> Self {
        Self::with_clock(Clock::Manual(AtomicU64::new(0)))
    }

    fn with_clock(clock: Clock) -> Self {
        Self {
            inner: Arc::new_cyclic(|weak| Inner {
                ports: RwLock::new(vec![None]),
                lanes: Lanes::new(),
                hook: Attachment::default(),
                tap: Attachment::default(),
                adapter_hook: Attachment::default(),
                stats: Counters::default(),
                clock,
                held: Mutex::new(Vec::new()),
                sa: Arc::new(SaPort {
                    fabric: weak.clone(),
                    sa: Mutex::new(SubnetAdmin::new()),
                    pma: Mutex::default(),
                }),
                links_down: Mutex::new(Vec::new()),
                pkeys: RwLock::new((Vec::new(), Vec::new())),
                reports_waiting: AtomicBool::new(false),
                port_epoch: AtomicU64::new(0),
            }),
        }
    }

    /// Runs `f` on the subnet administrator's state (its multicast groups).
    pub fn with_sa<T>(&self, f: impl FnOnce(&SubnetAdmin) -> T) -> T {
        f(&self.inner.sa.sa.lock_unpoisoned())
    }

    /// Sets the PacketLifeTime the subnet administrator gives paths and groups (OpenSM's
    /// `packet_life_time`; 4.096 us * 2^life, see [`crate::sa::DEFAULT_PACKET_LIFE`]).
    /// Set it before guests ask for paths: ib_cm derives a connection's QP ACK timeout
    /// from it. None (changing nothing) past [`crate::sa::MAX_PACKET_LIFE`].
    pub fn set_packet_life(&self, life: u8) -> Option<()> {
        (self.inner.sa.sa.lock_unpoisoned()).set_packet_life(life)
    }

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
    fn tick(&self) {
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

    /// Tells ports whose link the hook took down or brought back up (a link-down window, a
    /// live link-down): their port state follows, as a real port's does.
    /// Returns whether it queued Reports of the change for the SA's trap subscribers.
    fn follow_links(
        &self,
        ports: &[(Lid, Arc<dyn PacketSink>)],
        hook: Option<&Arc<dyn LinkHook>>,
        now: u64,
    ) -> bool {
        let mut changed = Vec::new();
        {
            let mut down = self.inner.links_down.lock_unpoisoned();
            for (lid, p) in ports {
                let up = hook.is_none_or(|h| h.link_up(*lid, now));
                let was_up = !down.contains(lid);
                if up != was_up {
                    if up {
                        down.retain(|l| l != lid);
                    } else {
                        down.push(*lid);
                    }
                    changed.push((*lid, p.clone(), up));
                }
            }
        }
        let mut reports = Vec::new();
        for (lid, p, up) in changed {
            p.link_changed(up);
            let mut sa = self.inner.sa.sa.lock_unpoisoned();
            reports.extend(sa.port_changed(lid, up, self));
        }
        let any = !reports.is_empty();
        for r in reports {
            self.enqueue(r);
        }
        any
    }

    /// Attaches a port and assigns it the next free LID (node number k gets LID k).
    pub fn attach(&self, sink: Weak<dyn PacketSink>) -> Lid {
        let lid = {
            let mut ports = self.inner.ports.write_unpoisoned();
            let lid = ports.len() as Lid;
            self.tell_adapter_hook(&sink);
            self.set_port(lid, Some(sink.clone()));
            ports.push(Some(sink.clone()));
            lid
        };
        // Told outside the port table's lock: the port takes its device's lock to hear it.
        self.tell_pkeys(lid, &sink);
        self.report_port(lid, true);
        lid
    }

    /// Queues the SA's trap Reports for a port coming into service or going out of it
    /// (trap 64 or 65); the next tick moves them.
    fn report_port(&self, lid: Lid, up: bool) {
        let reports = {
            let mut sa = self.inner.sa.sa.lock_unpoisoned();
            sa.port_changed(lid, up, self)
        };
        if !reports.is_empty() {
            for r in reports {
                self.enqueue(r);
            }
            self.inner.reports_waiting.store(true, Relaxed);
        }
    }

    /// Attaches a port at a given LID (a node coming back keeps its LID). Fails if a live port
    /// holds that LID already.
    pub fn attach_at(&self, lid: Lid, sink: Weak<dyn PacketSink>) -> Result<(), LidTaken> {
        let mut ports = self.inner.ports.write_unpoisoned();
        // 0 is no LID; the SM's and the multicast LIDs are not a port's.
        if lid == 0 || lid >= SM_LID {
            return Err(LidTaken(lid));
        }
        if ports.len() <= lid as usize {
            ports.resize(lid as usize + 1, None);
        }
        let Some(slot) = ports.get_mut(lid as usize) else {
            return Err(LidTaken(lid));
        };
        if slot.as_ref().is_some_and(|w| w.strong_count() > 0) {
            return Err(LidTaken(lid));
        }
        self.tell_adapter_hook(&sink);
        self.set_port(lid, Some(sink.clone()));
        *slot = Some(sink.clone());
        drop(ports);
        // (Outside the port table's lock, as in `attach`.)
        self.tell_pkeys(lid, &sink);
        // A new port starts up; the next tick tells it if its link is down.
        self.inner
            .links_down
            .lock_unpoisoned()
            .retain(|&l| l != lid);
        self.report_port(lid, true);
        Ok(())
    }

    /// Takes a port off the fabric: packets for its LID are then undeliverable. The SA
    /// reports its GID out of service to subscribers.
    pub fn detach(&self, lid: Lid) {
        self.report_port(lid, false);
        let mut ports = self.inner.ports.write_unpoisoned();
        if let Some(p) = ports.get_mut(lid as usize) {
            *p = None;
            self.set_port(lid, None);
        }
    }

    pub fn set_hook(&self, hook: Option<Arc<dyn LinkHook>>) {
        self.inner.hook.set(hook);
    }

    pub fn set_tap(&self, tap: Option<Arc<dyn PacketTap>>) {
        self.inner.tap.set(tap);
    }

    /// Faults for the HCAs on this fabric (see adapter_hook.rs).
    pub fn set_adapter_hook(&self, hook: Option<Arc<dyn AdapterHook>>) {
        let attached = hook.is_some();
        // Ports keep whether there is one without asking the fabric (an HCA's receive
        // doorbell needs no turn unless a hook is to see it): each hears of the change
        // under the ports' lock, which orders it with every other change and attachment.
        let ports = self.inner.ports.write_unpoisoned();
        self.inner.adapter_hook.set(hook);
        let sinks: Vec<Arc<dyn PacketSink>> =
            ports.iter().flatten().filter_map(Weak::upgrade).collect();
        for s in &sinks {
            s.adapter_hook_changed(attached);
        }
        drop(ports);
    }

    /// Tells a port being attached (the caller holds the ports' lock) whether there is an
    /// adapter hook.
    fn tell_adapter_hook(&self, sink: &Weak<dyn PacketSink>) {
        if let Some(s) = sink.upgrade() {
            s.adapter_hook_changed(self.inner.adapter_hook.is_set());
        }
    }

    /// The partitions beside the default, as the subnet manager sets them: every port's
    /// P_Key table follows (ports on the fabric are told now, later ones as they attach),
    /// and the SA answers by them. Replaces the partitions set before.
    pub fn set_partitions(&self, parts: &[Partition]) -> Result<(), PartitionError> {
        let tables = partition::tables(parts)?;
        *self.inner.pkeys.write_unpoisoned() = (parts.to_vec(), tables);
        let pkeys: Vec<u16> = parts.iter().map(|p| p.pkey).collect();
        (self.inner.sa.sa.lock_unpoisoned()).set_partitions(&pkeys);
        let ports: Vec<_> = {
            let ports = self.inner.ports.read_unpoisoned();
            ports
                .iter()
                .enumerate()
                .map(|(l, p)| (l as Lid, p.clone()))
                .collect()
        };
        for (lid, port) in ports {
            if let Some(sink) = port.and_then(|w| w.upgrade()) {
                sink.pkeys_changed(&self.pkey_table(lid));
            }
        }
        Ok(())
    }

    /// The P_Key table of the port at `lid`.
    pub fn pkey_table(&self, lid: Lid) -> PKeyTable {
        let pkeys = self.inner.pkeys.read_unpoisoned();
        (pkeys.1.iter())
            .find(|(l, _)| *l == lid)
            .map_or_else(partition::default_table, |(_, t)| *t)
    }

    /// Every partition beside the default, as last set (its P_Key with the full bit), in
    /// the order given (`hcabench fabric`).
    pub fn partitions(&self) -> Vec<Partition> {
        let pkeys = self.inner.pkeys.read_unpoisoned();
        (pkeys.0.iter())
            .map(|p| Partition {
                pkey: p.pkey | partition::FULL_MEMBER,
                ..p.clone()
            })
            .collect()
    }

    fn tell_pkeys(&self, lid: Lid, sink: &Weak<dyn PacketSink>) {
        if let Some(s) = sink.upgrade() {
            s.pkeys_changed(&self.pkey_table(lid));
        }
    }

    pub fn adapter_hook(&self) -> Option<Arc<dyn AdapterHook>> {
        self.inner.adapter_hook.get()
    }

    /// Whether an adapter hook is attached (one load; [`Fabric::adapter_hook`] gives it).
    #[inline]
    pub(crate) fn has_adapter_hook(&self) -> bool {
        self.inner.adapter_hook.is_set()
    }

    pub fn stats(&self) -> FabricStats {
        let c = &self.inner.stats;
        FabricStats {
            delivered: c.delivered.load(Relaxed)
                + (self.inner.lanes.all())
                    .map(|(_, l)| l.lock().delivered + l.cut_delivered.load(Relaxed))
                    .sum::<u64>(),
            no_route: c.no_route.load(Relaxed),
            hook_dropped: c.hook_dropped.load(Relaxed),
            rejected: c.rejected.load(Relaxed),
        }
    }

    /// Queues a packet. Callers hold their own HCA lock, which fixes the order of packets from
    /// one sender; the packet moves at the next [`Fabric::pump`].
    pub fn enqueue(&self, pkt: Packet) {
        let (dst, src) = (slot(pkt.dlid), slot(pkt.slid) as Lid);
        self.push(dst, src, Item::Packet(pkt));
    }

    #[inline]
    fn push(&self, dst: usize, src: Lid, item: Item) {
        let lanes = &self.inner.lanes;
        let Some(lane) = lanes.get_or_make(dst) else {
            return;
        };
        // Sent back, inside a cut-through, to the port whose turn runs it: that turn takes
        // it (see [`Cut::returned`]) if nothing from this source is before it: none
        // waits in the lane, and none is being delivered (the lane is not claimed). A
        // quiet lane says so without its lock.
        let item = match item {
            Item::Packet(pkt) if lane.is_quiet() && self.pumping_here() => {
                match keep_back(dst, src, pkt) {
                    None => return,
                    Some(pkt) => Item::Packet(pkt),
                }
            }
            item => item,
        };
        let mut d = lane.lock();
        let item = match item {
            Item::Packet(pkt) if self.pumping_here() && !d.claimed && !d.holds_from(src) => {
                match keep_back(dst, src, pkt) {
                    None => return,
                    Some(pkt) => Item::Packet(pkt),
                }
            }
            item => item,
        };
        let item = match item {
            // A delivery inside this fabric's pump answering to a lane with nothing queued
            // and no one delivering (an ACK, a response): the lane is claimed here and the
            // packet goes to the pump, next, without passing through the queue (one turn
            // of the lane's lock instead of two). The order of the lane's items holds: any
            // later one waits behind the claim.
            Item::Packet(pkt) if d.turn.is_empty() && !d.claimed && self.pumping_here() => {
                // (Given back when the pump has a packet handed over already.)
                let left = HANDOFF.with(|h| {
                    let mut h = h.borrow_mut();
                    if h.is_some() {
                        return Some(pkt);
                    }
                    d.claimed = true;
                    let port = d.port();
                    *h = Some(Handoff {
                        dst,
                        src,
                        pkt,
                        port,
                    });
                    None
                });
                match left {
                    None => return,
                    Some(pkt) => Item::Packet(pkt),
                }
            }
            item => item,
        };
        lanes.count_in(usize::from(src), item.weight());
        d.push(src, item);
        drop(d);
        note_queued(self.id(), dst);
    }

    /// Whether this thread is inside a pump of this fabric.
    fn pumping_here(&self) -> bool {
        PUMPING.with(Cell::get) == self.id()
    }

    /// Keeps the port at `lid` (None: none there now) in its slot's lane.
    fn set_port(&self, lid: Lid, sink: Option<Weak<dyn PacketSink>>) {
        let dst = slot(lid);
        if dst == 0 {
            return;
        }
        if let Some(lane) = self.inner.lanes.get_or_make(dst) {
            let mut d = lane.lock();
            d.port = sink;
            self.inner.port_epoch.fetch_add(1, Release);
        }
    }

    /// Slot `dst`'s lane, locked, if it has one.
    fn lane(&self, dst: usize) -> Option<LaneGuard<'_>> {
        Some(self.inner.lanes.get(dst)?.lock())
    }

    /// Whether `other` is this fabric (a clone of its handle).
    pub(crate) fn same(&self, other: &Fabric) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// This fabric's identity, for [`QUEUED_TO`].
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Packets and bounces queued, not yet moved.
    pub fn backlog(&self) -> usize {
        self.inner.lanes.total()
    }

    /// Like [`Fabric::pump_own`]; then, while more than [`MAX_BACKLOG`] items from the port
    /// at `sender` wait, that sender waits for the fabric (pumping meanwhile), so one guest's
    /// flood of datagrams cannot grow the queue without bound. Only the port past its bound
    /// waits: another guest's turn goes on at once, whatever one flood has queued (past
    /// [`MAX_TOTAL_BACKLOG`] in all, every sender waits). Never waits inside a pump (a
    /// delivery's own sends). Call it with no HCA lock held.
    pub fn pump_with_backpressure(&self, sender: Lid) {
        self.pump_own();
        // While no source crowds the fabric (a sender that does has counted so itself,
        // before this load), none is past its bound nor the queue past its total: the
        // usual case reads one counter that packets leave alone.
        let lanes = &self.inner.lanes;
        if in_a_pump() || lanes.crowded.load(Relaxed) == 0 {
            return;
        }
        let over =
            || lanes.queued_from(slot(sender)) > MAX_BACKLOG || lanes.total() > MAX_TOTAL_BACKLOG;
        while over() {
            self.pump();
            std::thread::yield_now();
        }
    }

    /// Whether [`Fabric::pump_with_backpressure`] would do anything on this thread: not
    /// inside a pump, and this thread has items of its own queued or a source has many
    /// queued (see `CROWD`). A device asks before it lets go of its lock (a turn that sent
    /// nothing, or a delivery's turn inside a pump, then needs no hold on the fabric).
    pub fn has_work_for_this_thread(&self) -> bool {
        !in_a_pump() && (queued_any(self.id()) || self.inner.lanes.crowded.load(Relaxed) > 0)
    }

    /// Delivers every queued item that no other thread is delivering, until none is left.
    /// Call it with no HCA lock held.
    pub fn pump(&self) {
        self.pump_while(true);
    }

    /// Delivers what this thread queued, and what those deliveries queue, until nothing of
    /// it is left that another thread is not delivering; items only other threads queued
    /// are theirs to move. A device's turn ends with this: a guest's doorbell thread moves
    /// its own traffic, not another guest's flood. Call it with no HCA lock held.
    pub fn pump_own(&self) {
        self.pump_while(false);
    }

    /// The pump; `any`: items anyone queued, else this thread's own. A nested call (from a
    /// delivery) returns at once: the outer frame goes on with what it queued.
    fn pump_while(&self, any: bool) {
        if in_a_pump() {
            return;
        }
        let id = self.id();
        if !any && !queued_any(id) {
            return; // nothing of this thread's to move (a turn that sent nothing)
        }
        let mut pumping = Pumping::start(self);
        let mut cursor = 0;
        // The item goes from the queue to its port in as few moves as the code can make it:
        // a packet is 128 bytes, and every move of one is a dozen instructions.
        let lanes = &self.inner.lanes;
        loop {
            if let Some(h) = HANDOFF.with(|h| h.borrow_mut().take()) {
                // Sent by the delivery just made; its lane is claimed for it already.
                drop(self.let_go(&mut pumping));
                pumping.claimed = Some(h.dst);
                pumping.delivered += self.forward(h.pkt, false, h.port);
                continue;
            }
            let Some((dst, mut d)) = self.next_lane(&mut pumping, any, &mut cursor) else {
                break;
            };
            let Some((src, item)) = d.take() else {
                continue; // (next_lane gives open lanes only)
            };
            pumping.claimed = Some(dst);
            let src = usize::from(src);
            match item {
                Item::Packet(pkt) => {
                    let more = d.next_follows(&pkt);
                    let port = d.port();
                    if more && self.unwatched() {
                        let (burst, more) = take_burst(&mut d, pkt);
                        drop(d);
                        lanes.count_out(src, burst.iter().map(weight).sum());
                        pumping.delivered += self.forward_burst(burst, more, port);
                    } else {
                        drop(d);
                        lanes.count_out(src, weight(&pkt));
                        pumping.delivered += self.forward(pkt, more, port);
                    }
                }
                Item::Bounce(notice) => {
                    drop(d);
                    lanes.count_out(src, weight(&notice.0));
                    let (pkt, why) = *notice;
                    if let Some(src) = self.port(pkt.slid) {
                        src.undeliverable(pkt, why);
                    }
                }
            }
        }
    }

    /// Lets go of the lane the pump served last: forgotten if it is empty; else (others'
    /// items came in behind the claim and were left to this pump) served in turn with this
    /// thread's own, and returned, still locked.
    fn let_go<'a>(&self, pumping: &mut Pumping<'a>) -> Option<(usize, LaneGuard<'a>)> {
        let (dst, lane) = pumping.settle()?;
        if lane.open() {
            note_queued(self.id(), dst);
            Some((dst, lane))
        } else {
            drop(lane);
            forget_own(self.id(), dst);
            None
        }
    }

    /// The lane a pump serves next, locked and open (its items wait and no thread is
    /// delivering them). First the pump lets go of the lane it served last, and serves it
    /// again in the same turn of its lock if it is still open and this thread has no other
    /// destination waiting; then this thread's own destinations in turn; with `any`, every
    /// lane in turn from `cursor`.
    fn next_lane<'a>(
        &'a self,
        pumping: &mut Pumping<'a>,
        any: bool,
        cursor: &mut usize,
    ) -> Option<(usize, LaneGuard<'a>)> {
        let id = self.id();
        if let Some((dst, lane)) = self.let_go(pumping) {
            if only_own(id, dst) {
                return Some((dst, lane));
            }
        }
        if let Some(found) = next_own(id, |dst| self.lane(dst).filter(|d| d.open())) {
            return Some(found);
        }
        if !any {
            return None;
        }
        let top = self.inner.lanes.top();
        for _ in 0..top {
            let dst = *cursor % top;
            *cursor = dst + 1;
            if let Some(lane) = self.lane(dst).filter(|d| d.open()) {
                return Some((dst, lane));
            }
        }
        None
    }

    /// The counters of the port at `lid` (`CTR_*` order), if a port there keeps them.
    pub fn counters(&self, lid: Lid) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        self.port(lid)?.counters()
    }

    fn port(&self, lid: Lid) -> Option<Arc<dyn PacketSink>> {
        // The SA and SM's port; a directed-route SMP's first hop is the switch it runs on.
        if lid == SM_LID || lid == crate::sa::sm::PERMISSIVE_LID {
            return Some(self.inner.sa.clone());
        }
        let ports = self.inner.ports.read_unpoisoned();
        ports.get(lid as usize)?.as_ref()?.upgrade()
    }

    fn hook(&self) -> Option<Arc<dyn LinkHook>> {
        self.inner.hook.get()
    }

    fn tap(&self) -> Option<Arc<dyn PacketTap>> {
        self.inner.tap.get()
    }

    /// Whether a device's turn on this thread may move what it sends itself (see [`Cut`]):
    /// not inside a pump, no hook or tap attached.
    pub(crate) fn may_cut(&self) -> bool {
        !in_a_pump() && self.unwatched()
    }

    /// No hook or tap is attached: nothing sees packets between the queue and their port.
    fn unwatched(&self) -> bool {
        !self.inner.hook.is_set() && !self.inner.tap.is_set()
    }

    /// Packets of one stream for one port (see [`take_burst`]), handed over at once; `more`:
    /// the next item for the port continues the stream. A hook or tap attached meanwhile
    /// sees them one by one.
    /// `port`: the port they are for, if the caller has it. Returns how many went straight
    /// to the port, for the pump to count (see [`Fabric::forward`]).
    fn forward_burst(
        &self,
        burst: Vec<Packet>,
        more: bool,
        port: Option<Arc<dyn PacketSink>>,
    ) -> u64 {
        let n = burst.len();
        let lid = burst.first().map_or(0, |p| p.dlid);
        let dst = port.or_else(|| self.port(lid)).filter(|_| self.unwatched());
        let Some(dst) = dst else {
            return (burst.into_iter().enumerate())
                .map(|(i, pkt)| self.forward(pkt, more || i + 1 < n, None))
                .sum();
        };
        let rejected = dst.deliver_burst(burst, more);
        let delivered = n - rejected.len();
        for Rejected(pkt) in rejected {
            self.bounce(*pkt, DropReason::Rejected);
        }
        delivered as u64
    }

    /// `more`: the next item for the same port is a packet of this one's stream (see
    /// [`PacketSink::deliver_in_burst`]); said only where nothing can come between.
    /// `port`: the port at the packet's DLID, if the caller has it. Returns 1 if the packet
    /// went straight to its port, which the pump then counts as delivered; packets past a
    /// hook or tap, or to multicast groups, are counted where they arrive.
    fn forward(&self, pkt: Packet, more: bool, port: Option<Arc<dyn PacketSink>>) -> u64 {
        if self.unwatched() && !pkt.is_multicast() {
            // Nothing on the links: straight to the port (the usual case).
            return match port.or_else(|| self.port(pkt.dlid)) {
                Some(dst) => u64::from(self.hand_over(&dst, pkt, more)),
                None => {
                    self.bounce(pkt, DropReason::NoRoute);
                    0
                }
            };
        }
        let (hook, tap) = (self.hook(), self.tap());
        if hook.is_none() && tap.is_none() {
            self.forward_one(pkt, None, more);
            return 0;
        }
        // Hooks and taps see every MTU packet of a train, one by one.
        for p in pkt.packets() {
            if let Some(t) = &tap {
                t.on_wire(self.now_ns(), &p);
            }
            self.forward_one(p, hook.as_ref(), false);
        }
        0
    }

    fn forward_one(&self, mut pkt: Packet, hook: Option<&Arc<dyn LinkHook>>, more: bool) {
        let up = LinkId {
            lid: pkt.slid,
            dir: LinkDir::Up,
        };
        if let Some(copy) = self.judge(hook, up, &mut pkt, Stage::Routed) {
            let dup = copy.then(|| pkt.clone());
            self.resume(pkt, Stage::Routed, hook, more && dup.is_none());
            if let Some(d) = dup {
                self.resume(d, Stage::Routed, hook, false);
            }
        }
    }

    /// Runs the hook on one link: None if the packet stops here (dropped or held), else
    /// whether a duplicate follows it.
    fn judge(
        &self,
        hook: Option<&Arc<dyn LinkHook>>,
        link: LinkId,
        pkt: &mut Packet,
        resume: Stage,
    ) -> Option<bool> {
        let Some(h) = hook else {
            return Some(false);
        };
        let now = self.now_ns();
        match h.on_packet(link, now, pkt) {
            Verdict::Pass => Some(false),
            Verdict::Duplicate => Some(true),
            Verdict::Drop => {
                self.bounce(std::mem::take(pkt), DropReason::Hook);
                None
            }
            Verdict::Delay(ns) => {
                let due = now.saturating_add(ns);
                let mut held = self.inner.held.lock_unpoisoned();
                held.push((due, resume, std::mem::take(pkt)));
                None
            }
        }
    }

    /// Takes a packet on from `stage`: route and downlink, or delivery.
    fn resume(&self, pkt: Packet, stage: Stage, hook: Option<&Arc<dyn LinkHook>>, more: bool) {
        match stage {
            Stage::Arrived(lid) => match self.port(lid) {
                Some(dst) => self.deliver(&dst, pkt, false),
                None => self.bounce(pkt, DropReason::NoRoute),
            },
            Stage::Routed if pkt.is_multicast() => {
                // To every member port the SA lists, the sender's own included.
                let members = self.with_sa(|sa| {
                    sa.group_by_mlid(pkt.dlid)
                        .map(|g| g.members.keys().copied().collect::<Vec<u64>>())
                        .unwrap_or_default()
                });
                let lids: Vec<Lid> = members
                    .into_iter()
                    .filter_map(|guid| crate::sa::Ports::lid_of(self, guid))
                    .collect();
                if lids.is_empty() {
                    return self.bounce(pkt, DropReason::NoRoute);
                }
                for lid in lids {
                    self.down_and_deliver(pkt.clone(), lid, hook, false);
                }
            }
            Stage::Routed => {
                let lid = pkt.dlid;
                self.down_and_deliver(pkt, lid, hook, more);
            }
        }
    }

    /// The downlink of the port at `lid`, then delivery there.
    fn down_and_deliver(
        &self,
        mut pkt: Packet,
        lid: Lid,
        hook: Option<&Arc<dyn LinkHook>>,
        more: bool,
    ) {
        let Some(dst) = self.port(lid) else {
            return self.bounce(pkt, DropReason::NoRoute);
        };
        let down = LinkId {
            lid,
            dir: LinkDir::Down,
        };
        match self.judge(hook, down, &mut pkt, Stage::Arrived(lid)) {
            None => return,
            Some(true) => {
                self.deliver(&dst, pkt.clone(), false);
                return self.deliver(&dst, pkt, false);
            }
            Some(false) => {}
        }
        self.deliver(&dst, pkt, more);
    }

    fn deliver(&self, dst: &Arc<dyn PacketSink>, pkt: Packet, more: bool) {
        if self.hand_over(dst, pkt, more) {
            self.inner.stats.delivered.fetch_add(1, Relaxed);
        }
    }

    /// Gives `pkt` to its port: whether the port took it (one it refused goes back to its
    /// sender as a notice, headers only).
    fn hand_over(&self, dst: &Arc<dyn PacketSink>, pkt: Packet, more: bool) -> bool {
        match dst.deliver_in_burst(pkt, more) {
            Ok(()) => true,
            Err(Rejected(pkt)) => {
                self.bounce(*pkt, DropReason::Rejected);
                false
            }
        }
    }

    fn bounce(&self, pkt: Packet, why: DropReason) {
        let c = &self.inner.stats;
        match why {
            DropReason::NoRoute => c.no_route.fetch_add(1, Relaxed),
            DropReason::Hook => c.hook_dropped.fetch_add(1, Relaxed),
            DropReason::Rejected => c.rejected.fetch_add(1, Relaxed),
        };
        let mut pkt = pkt;
        pkt.payload = Default::default();
        // Back to its sender, behind what the port it was for has already sent there (an
        // ACK on its way arrives first, as it would before the sender's timeout).
        let (dst, src) = (slot(pkt.slid), slot(pkt.dlid) as Lid);
        self.push(dst, src, Item::Bounce(Box::new((pkt, why))));
    }
}
