//! The queue: a lane per destination slot, each a FIFO per source served round-robin, and
//! the backlog bounds that hold senders back.

use std::collections::VecDeque;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use super::cut::keep_back;
use super::pump::{note_queued, Handoff, HANDOFF};
use super::{DropReason, Fabric, Lid, PacketSink};
use crate::packet::Packet;
use crate::sa::SM_LID;
use crate::sync::Unpoisoned;

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

/// Slots a source's FIFO keeps once it is empty (16 KiB); room it grew past that under a
/// burst is given back then, so that what the fabric holds after a flood is what it holds
/// queued, not the room every (destination, source) pair once needed.
pub(super) const FIFO_KEEP: usize = 128;

#[cold]
#[inline(never)]
fn shrink(q: &mut VecDeque<Item>) {
    q.shrink_to(FIFO_KEEP);
}

/// What `pkt` counts in the backlog (see [`MAX_BACKLOG`]).
pub(super) fn weight(pkt: &Packet) -> usize {
    1 + pkt.heap_bytes() / BACKLOG_UNIT
}

/// The most packets of one stream a pump hands a port at once (see
/// [`PacketSink::deliver_burst`]), and the payload bytes past which it stops adding more:
/// a burst saves the queue's and the port's per-packet bookkeeping, and stays short enough
/// that another source's packet for the same port waits for little.
pub(super) const MAX_BURST: usize = 16;
pub(super) const MAX_BURST_BYTES: u64 = 64 << 10;

/// What the fabric moves: packets, and notices to senders whose packets went nowhere. A
/// notice waits its turn behind what was already queued, as the sender's timeout would: an
/// ACK or NAK already on its way arrives first. (A notice is boxed: it is rare, and an item
/// as small as a packet moves without a memcpy.)
pub(super) enum Item {
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
pub(super) fn take_burst(d: &mut DstQueue, first: Packet) -> (Vec<Packet>, bool) {
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
pub(super) fn slot(lid: Lid) -> usize {
    match usize::from(lid) {
        l if l < SLOTS && lid < SM_LID => l,
        _ => 0,
    }
}

/// Items a source may have queued before it counts as crowding the fabric: while no
/// source has more, the fabric holds at most [`MAX_TOTAL_BACKLOG`] items in all (one
/// source per slot), and no sender's turn needs to add them up.
pub(super) const CROWD: usize = MAX_TOTAL_BACKLOG / SLOTS;
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
pub(super) struct Lanes {
    slots: Box<[OnceLock<Box<Lane>>]>,
    /// One past the highest slot with a lane: what a look at every lane covers.
    top: AtomicUsize,
    /// Sources with more than [`CROWD`] items queued.
    pub(super) crowded: AtomicUsize,
}

/// One slot's lane, on cache lines of its own (see [`Lanes`]).
#[derive(Default)]
#[repr(align(128))]
pub(super) struct Lane {
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
    pub(super) cut_delivered: AtomicU64,
}

impl Lanes {
    pub(super) fn new() -> Self {
        Self {
            slots: std::iter::repeat_with(OnceLock::new).take(SLOTS).collect(),
            top: AtomicUsize::new(0),
            crowded: AtomicUsize::new(0),
        }
    }

    pub(super) fn get(&self, slot: usize) -> Option<&Lane> {
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
    pub(super) fn top(&self) -> usize {
        self.top.load(Acquire).min(SLOTS)
    }

    /// Every lane made so far, with its slot.
    pub(super) fn all(&self) -> impl Iterator<Item = (usize, &Lane)> {
        (0..self.top()).filter_map(|s| Some((s, self.get(s)?)))
    }

    /// `n` more items queued from slot `src`.
    pub(super) fn count_in(&self, src: usize, n: usize) {
        let Some(lane) = self.get_or_make(src) else {
            return;
        };
        let before = lane.from_here.fetch_add(n, Relaxed);
        if before <= CROWD && before + n > CROWD {
            self.crowded.fetch_add(1, Relaxed);
        }
    }

    /// `n` items from slot `src` taken off the queue.
    pub(super) fn count_out(&self, src: usize, n: usize) {
        let Some(lane) = self.get(src) else {
            return;
        };
        let before = lane.from_here.fetch_sub(n, Relaxed);
        if before > CROWD && before - n <= CROWD {
            self.crowded.fetch_sub(1, Relaxed);
        }
    }

    /// Items queued from slot `src`.
    pub(super) fn queued_from(&self, src: usize) -> usize {
        self.get(src).map_or(0, |l| l.from_here.load(Relaxed))
    }

    /// Whether the fabric holds items from or for the port at slot `slot`: its own are
    /// queued, or its lane has items or is being delivered from. A lane that is quiet was
    /// neither when last let go; one that is not is looked at, unless a thread holds it
    /// (it is busy then).
    pub(super) fn holds(&self, slot: usize) -> bool {
        let Some(lane) = self.get(slot) else {
            return false;
        };
        if lane.from_here.load(Relaxed) > 0 {
            return true;
        }
        if lane.is_quiet() {
            return false;
        }
        lane.q
            .try_lock_unpoisoned()
            .is_none_or(|d| d.claimed || !d.turn.is_empty())
    }

    /// Items queued in all.
    pub(super) fn total(&self) -> usize {
        self.all().map(|(_, l)| l.from_here.load(Relaxed)).sum()
    }
}

/// A destination's queue: what its [`Lane`]'s lock guards.
#[derive(Default)]
pub(super) struct DstQueue {
    /// Per source slot, its FIFO; kept when empty (the same few sources keep sending), at
    /// most [`SLOTS`] of them.
    srcs: Vec<(Lid, VecDeque<Item>)>,
    /// Indices into `srcs` with items, in service order.
    turn: VecDeque<usize>,
    /// The index the last push used.
    last: usize,
    pub(super) claimed: bool,
    /// The port at this slot (slot 0, shared, has none): the pump finds it here while it
    /// holds the lane anyway, not through the table's lock (two atomics less a packet).
    pub(super) port: Option<Weak<dyn PacketSink>>,
    /// Packets pumps handed straight to their ports from here (part of
    /// `FabricStats::delivered`).
    pub(super) delivered: u64,
}

impl DstQueue {
    /// The index of `src`'s FIFO (a new one for a new source).
    #[inline]
    pub(super) fn source(&mut self, src: Lid) -> usize {
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
    pub(super) fn push(&mut self, src: Lid, item: Item) {
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
    pub(super) fn push_front(&mut self, src: Lid, item: Item) {
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
    pub(super) fn holds_from(&self, src: Lid) -> bool {
        self.srcs.iter().any(|(s, q)| *s == src && !q.is_empty())
    }

    /// The port at this slot, if it has its own (not slot 0) and it is still there.
    pub(super) fn port(&self) -> Option<Arc<dyn PacketSink>> {
        self.port.as_ref()?.upgrade()
    }

    /// Whether it has items that no thread is delivering.
    pub(super) fn open(&self) -> bool {
        !self.claimed && !self.turn.is_empty()
    }

    /// The next item, and the source slot it came from; the caller then holds the lane
    /// claimed until it lets go of it.
    #[inline]
    pub(super) fn take(&mut self) -> Option<(Lid, Item)> {
        let i = self.turn.pop_front()?;
        let (src, q) = self.srcs.get_mut(i)?;
        let item = q.pop_front()?;
        if !q.is_empty() {
            self.turn.push_back(i);
        } else if q.capacity() > FIFO_KEEP {
            shrink(q);
        }
        self.claimed = true;
        Some((*src, item))
    }

    /// Whether the next item it will serve is a packet of `pkt`'s stream (the same sender
    /// QP to the same QP).
    pub(super) fn next_follows(&self, pkt: &Packet) -> bool {
        let next = self.turn.front().and_then(|&i| self.srcs.get(i)?.1.front());
        matches!(next, Some(Item::Packet(n))
            if n.slid == pkt.slid && n.src_qpn == pkt.src_qpn && n.dest_qpn == pkt.dest_qpn)
    }
}

impl Lane {
    /// Locks the lane (one a panicking delivery left behind is whole: no change to a lane
    /// runs into a delivery).
    pub(super) fn lock(&self) -> LaneGuard<'_> {
        LaneGuard {
            d: self.q.lock_unpoisoned(),
            quiet: &self.quiet,
        }
    }

    /// Whether the lane was empty and unclaimed when its lock was last let go (see
    /// [`Lane::quiet`]).
    pub(super) fn is_quiet(&self) -> bool {
        self.quiet.load(Acquire)
    }
}

/// A lane, locked. Letting go of it notes in [`Lane::quiet`] whether it is empty and
/// unclaimed.
pub(super) struct LaneGuard<'a> {
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

impl Fabric {
    /// Queues a packet. Callers hold their own HCA lock, which fixes the order of packets from
    /// one sender; the packet moves at the next [`Fabric::pump`].
    pub fn enqueue(&self, pkt: Packet) {
        let (dst, src) = (slot(pkt.dlid), slot(pkt.slid) as Lid);
        self.push(dst, src, Item::Packet(pkt));
    }

    #[inline]
    pub(super) fn push(&self, dst: usize, src: Lid, item: Item) {
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

    /// Keeps the port at `lid` (None: none there now) in its slot's lane.
    pub(super) fn set_port(&self, lid: Lid, sink: Option<Weak<dyn PacketSink>>) {
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
    pub(super) fn lane(&self, dst: usize) -> Option<LaneGuard<'_>> {
        Some(self.inner.lanes.get(dst)?.lock())
    }

    /// Packets and bounces queued, not yet moved.
    pub fn backlog(&self) -> usize {
        self.inner.lanes.total()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_sources_fifo_gives_back_the_room_a_burst_took_once_it_is_empty() {
        let mut d = DstQueue::default();
        for _ in 0..10_000 {
            d.push(7, Item::Packet(Packet::default()));
        }
        let grown = d.srcs[0].1.capacity();
        assert!(grown >= 10_000);
        let mut taken = 0;
        while d.take().is_some() {
            taken += 1;
            // Not while it still holds items: a flood drains without copies.
            if taken < 10_000 {
                assert_eq!(d.srcs[0].1.capacity(), grown);
            }
        }
        assert_eq!(taken, 10_000);
        assert!(d.srcs[0].1.capacity() <= FIFO_KEEP);
        // A source that keeps a few items queued keeps its room.
        d.push(7, Item::Packet(Packet::default()));
        d.take();
        assert!(d.srcs[0].1.capacity() > 0);
    }
}
