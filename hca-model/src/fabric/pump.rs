//! The thread-local pump: which fabric and destinations this thread moves, the packet a
//! delivery hands back to it, and the loop that hands queued items to their ports.

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::lanes::{slot, take_burst, weight, Item, LaneGuard, MAX_BACKLOG, MAX_TOTAL_BACKLOG};
use super::{DropReason, Fabric, Lid, PacketSink, Rejected};
use crate::packet::Packet;

thread_local! {
    /// The fabric whose queue this thread is moving (its [`Fabric::id`]; 0: none).
    /// Deliveries' own sends must not wait for it.
    pub(super) static PUMPING: Cell<usize> = const { Cell::new(0) };
    /// A packet a delivery inside this thread's pump sent to a lane with nothing queued and
    /// no one delivering: claimed for the pump, which delivers it next (see
    /// [`Fabric::push`]).
    pub(super) static HANDOFF: RefCell<Option<Handoff>> = const { RefCell::new(None) };
    /// What [`Fabric::pump_own`] serves: the destinations this thread queued items for.
    pub(super) static QUEUED_TO: RefCell<QueuedTo> = const {
        RefCell::new(QueuedTo { to: Vec::new(), next: 0 })
    };
    /// This thread is in a pump's loop over the queued items (a cut-through, which counts
    /// as pumping too, is not).
    static SERVING: Cell<bool> = const { Cell::new(false) };
    /// Ports whose further turns wait for this thread's pump to end (see
    /// [`Fabric::defer_turns`]), as (fabric, LID) pairs, each once.
    static DEFERRED: RefCell<Vec<(usize, Lid)>> = const { RefCell::new(Vec::new()) };
    /// `DEFERRED` has entries (read on every pump's way out, without a borrow).
    static ANY_DEFERRED: Cell<bool> = const { Cell::new(false) };
    /// This thread is running deferred turns: a pump inside them leaves new ones to it.
    static RESUMING: Cell<bool> = const { Cell::new(false) };
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
pub(super) fn in_a_pump() -> bool {
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
pub(super) struct Handoff {
    pub(super) dst: usize,
    pub(super) src: Lid,
    pub(super) pkt: Packet,
    pub(super) port: Option<Arc<dyn PacketSink>>,
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
        SERVING.set(true);
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
        SERVING.set(false);
        PUMPING.with(|p| p.set(0));
    }
}

/// Whether this thread has queued items for fabric `fabric` that it has not moved.
fn queued_any(fabric: usize) -> bool {
    QUEUED_TO.with(|q| q.borrow().to.iter().any(|&(f, _)| f == fabric))
}

/// Notes that this thread queued an item for `dst` on fabric `fabric`.
pub(super) fn note_queued(fabric: usize, dst: usize) {
    QUEUED_TO.with(|q| {
        let to = &mut q.borrow_mut().to;
        if to.last() != Some(&(fabric, dst)) && !to.contains(&(fabric, dst)) {
            to.push((fabric, dst));
        }
    });
}

/// The next port on fabric `fabric` whose turns were deferred to this thread's pump.
fn take_deferred(fabric: usize) -> Option<Lid> {
    DEFERRED.with(|d| {
        let mut d = d.borrow_mut();
        let i = d.iter().position(|&(f, _)| f == fabric)?;
        let (_, lid) = d.swap_remove(i);
        ANY_DEFERRED.set(!d.is_empty());
        Some(lid)
    })
}

/// Marks this thread as running deferred turns until dropped (however it ends).
struct Resuming;

impl Drop for Resuming {
    fn drop(&mut self) {
        RESUMING.set(false);
    }
}

impl Fabric {
    /// A packet left handed over to this thread's pump (see [`HANDOFF`]) goes back to the
    /// head of its lane, no longer claimed, for this thread's next pump.
    pub(super) fn requeue_handoff(&self) {
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

    /// Whether this thread is inside a pump of this fabric.
    pub(super) fn pumping_here(&self) -> bool {
        PUMPING.with(Cell::get) == self.id()
    }

    /// Like [`Fabric::pump_own`]; then, while more than [`MAX_BACKLOG`] items from the port
    /// at `sender` wait, that sender waits for the fabric (pumping meanwhile), so one guest's
    /// flood of datagrams cannot grow the queue without bound. Only the port past its bound
    /// waits: another guest's turn goes on at once, whatever one flood has queued (past
    /// [`MAX_TOTAL_BACKLOG`] in all, every sender waits). Never waits inside a pump (a
    /// delivery's own sends). Call it with no HCA lock held.
    pub fn pump_with_backpressure(&self, sender: Lid) {
        self.pump_own();
        if in_a_pump() {
            return;
        }
        while self.backlogged(sender) {
            self.pump();
            std::thread::yield_now();
        }
    }

    /// Whether the port at `sender` is past its backlog bound, or the queue past its total
    /// (see [`Fabric::pump_with_backpressure`]). While no source crowds the fabric (a
    /// sender that does has counted so itself, before this load), none is past its bound
    /// nor the queue past its total: the usual case reads one counter that packets leave
    /// alone.
    pub(crate) fn backlogged(&self, sender: Lid) -> bool {
        let lanes = &self.inner.lanes;
        lanes.crowded.load(Relaxed) > 0
            && (lanes.queued_from(slot(sender)) > MAX_BACKLOG || lanes.total() > MAX_TOTAL_BACKLOG)
    }

    /// A port's turn left work for further turns (READ responses to make, a long send
    /// queue): whether those turns wait for this thread's pump, which runs them once it
    /// has moved what it could (see [`Fabric::pump_own`]). They do when the turn was a
    /// delivery of the pump's: nothing would move what they queue between them, and what
    /// the first turn queued is moved first (a long READ's first pieces reach the
    /// requester before more are made). Elsewhere (a doorbell's or a tick's thread) they
    /// run at once, the port waiting for the fabric between them
    /// ([`Fabric::pump_with_backpressure`]); a cut-through's deliveries go on once the
    /// turn that cut through lets go of its lock (`PacketSink::resume`).
    #[cold]
    #[inline(never)]
    pub(crate) fn defer_turns(&self, lid: Lid) -> bool {
        if !SERVING.get() {
            return false;
        }
        let entry = (self.id(), lid);
        DEFERRED.with(|d| {
            let mut d = d.borrow_mut();
            if !d.contains(&entry) {
                d.push(entry);
            }
        });
        ANY_DEFERRED.set(true);
        true
    }

    /// Runs the turns deferred to this thread's pump of this fabric (see
    /// [`Fabric::defer_turns`]), each port's until it has no work left, with no pump under
    /// way: each port waits for the fabric between its turns, as a doorbell's turns do. One
    /// frame at a time: a pump inside these turns leaves what they defer to it.
    fn run_deferred(&self) {
        if !ANY_DEFERRED.get() || RESUMING.get() {
            return;
        }
        RESUMING.set(true);
        let _resuming = Resuming;
        while let Some(lid) = take_deferred(self.id()) {
            if let Some(port) = self.port(lid) {
                port.resume();
            }
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
    /// are theirs to move. Then runs the turns deferred to it (`Fabric::defer_turns`).
    /// A device's turn ends with this: a guest's doorbell thread moves its own traffic (and
    /// what it causes), not another guest's flood. Call it with no HCA lock held.
    pub fn pump_own(&self) {
        self.pump_while(false);
    }

    /// The pump; `any`: items anyone queued, else this thread's own. A nested call (from a
    /// delivery) returns at once: the outer frame goes on with what it queued.
    fn pump_while(&self, any: bool) {
        if in_a_pump() {
            return;
        }
        // (Unless nothing of this thread's is queued: a turn that sent nothing.)
        if any || queued_any(self.id()) {
            self.pump_items(any);
            self.run_deferred();
        }
    }

    /// [`Fabric::pump_while`]'s loop over the queued items.
    fn pump_items(&self, any: bool) {
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
                    match self.port(pkt.slid) {
                        Some(src) => src.undeliverable(pkt, why),
                        // A sender on another host hears of its receiver's refusal there, or
                        // that no port has the LID there any more (a node killed), as a
                        // sender here does.
                        None if self.routed()
                            && (why == DropReason::Rejected
                                || why == DropReason::NoRoute && !pkt.is_multicast()) =>
                        {
                            self.bounce_across(pkt)
                        }
                        None => {}
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
}
