//! Queue pairs: creation, the IB state machine (RESET, INIT, RTR, RTS, ERR), and flushing.
//!
//! Work queues are rings in guest RAM; the driver publishes free-running producer indices in
//! the QP's doorbell record and the device keeps its consumer indices here. A producer index
//! more than a ring's size ahead of the consumer is a broken driver: the QP gets EV_QP_FATAL
//! and goes to ERR. Entering ERR completes every outstanding and posted WR with
//! WcError::WrFlush (signaled or not), and WRs posted while in ERR are flushed the same way.
//! Entering RESET empties both queues without completions and zeroes the doorbell record.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::abi::*;
use crate::dma::read_obj;
use crate::hca::{Device, HcaState, SqHint};
use crate::packet::{Grant, Packet, Seg, SegList, PSN_MASK};
use crate::reliability::Retry;
use crate::status::{CmdError, WcError};

pub(crate) struct WorkQueue {
    pub addr: u64,
    pub log_entries: u32,
    pub wqe_shift: u32,
    /// Device consumer index, free-running.
    pub ci: u32,
}

impl WorkQueue {
    pub fn size(&self) -> u32 {
        1 << self.log_entries
    }

    pub fn slot(&self, index: u32) -> u64 {
        self.addr + (u64::from(index & (self.size() - 1)) << self.wqe_shift)
    }

    /// SGEs that fit in one WQE after a header of `header` bytes.
    pub fn max_sge(&self, header: u32) -> u32 {
        (((1u32 << self.wqe_shift) - header) / 16).min(MAX_SGE)
    }
}

/// What a sent WR still waits for.
pub(crate) enum PendKind {
    /// An ACK (SEND, RDMA WRITE).
    Ack,
    /// Read response data, scattered into these pieces (`cursor` follows the responses).
    Read {
        dst: SegList,
        cursor: crate::packet::SegCursor,
    },
    /// The original value of an atomic, written here.
    Atomic { dst: Seg },
    /// A local operation (WR_REG_MR), already done; completes when it reaches the front,
    /// so that completions stay in send order.
    Local,
}

/// A sent WR awaiting its ACK or response; in send order.
pub(crate) struct Pending {
    pub wr_id: u64,
    pub cqe_op: u32,
    pub signaled: bool,
    pub first_psn: u32,
    pub last_psn: u32,
    pub byte_len: u32,
    pub kind: PendKind,
    /// A read: the next response PSN it expects (responses come in order or not at all).
    pub next_resp_psn: u32,
    /// A read: the response PSN it was last asked again from after a gap, so that the
    /// responses behind one gap ask only once.
    pub reread_from: Option<u32>,
}

/// Host bytes every WR in flight holds whatever its size: its `Pending` and its request
/// as sent (headers, a small payload) in the QP's queues, and the shared gather record
/// its payload refers to. A send window bounds them per QP, but not per device (1024 QPs
/// of 16K slots: 16M WRs, gigabytes), so they count against the device's bound too.
pub const WR_FIXED_BYTES: usize = std::mem::size_of::<(Pending, usize)>()
    + std::mem::size_of::<Option<Packet>>()
    + std::mem::size_of::<crate::packet::Gather>()
    + 2 * std::mem::size_of::<usize>();

/// Of [`WR_FIXED_BYTES`], the WR's slot in the QP's two queues of WRs in flight. A queue
/// keeps its room when its WRs complete (until it shrinks: see `InFlight`), so past the
/// first [`WINDOW_FLOOR`] slots the room itself is what the device counts, used or not,
/// and a WR beyond them counts its fixed share less its slot.
pub const WR_SLOT_BYTES: usize =
    std::mem::size_of::<(Pending, usize)>() + std::mem::size_of::<Option<Packet>>();

/// Slots a QP's queues of WRs in flight keep whatever they hold, counted as the QP's own
/// (fixed) state, not against the device's bound: a QP with a few WRs in flight at a time
/// neither allocates nor counts anything per WR for its slots. About 4 KiB.
pub const WINDOW_FLOOR: usize = 16;

/// Host bytes a WR holds while in flight: its fixed share ([`WR_FIXED_BYTES`]; less its
/// slot when it is not among the queue's first [`WINDOW_FLOOR`], whose room the queue
/// counts), its request's owned payload bytes, and the records of a gather or scatter list
/// too long to be kept inline (a list of one or two pieces lives in that fixed share, as a
/// small payload lives in its packet). A message sent in pieces (longer than
/// `PIECE_BYTES`) counts its records twice: each time it is sent (a retransmission too)
/// its pieces carry lists of their own, as many records again, until the fabric has moved
/// them.
fn host_bytes(p: &Pending, request: Option<&Packet>, in_floor: bool) -> usize {
    let records = |l: &crate::packet::SegList| {
        if l.spilled() {
            l.len() * std::mem::size_of::<Seg>()
        } else {
            0
        }
    };
    let request = match request.map(|r| &r.payload) {
        Some(crate::packet::Payload::Bytes(b)) => b.len(),
        Some(payload @ crate::packet::Payload::Dma(g)) => {
            let pieces = payload.len() > crate::hca::PIECE_BYTES;
            records(&g.segs) << u8::from(pieces)
        }
        _ => 0,
    };
    let dst = match &p.kind {
        PendKind::Read { dst, .. } => records(dst),
        _ => 0,
    };
    let fixed = if in_floor {
        WR_FIXED_BYTES
    } else {
        WR_FIXED_BYTES - WR_SLOT_BYTES
    };
    fixed + request + dst
}

/// The WRs a QP has sent and not yet completed, in send order, with what they hold: the
/// count of READs and atomics (against `max_rd_atomic`), of WRs that a FENCE waits for, and
/// the host bytes their requests keep, which also count in the device's total (against its
/// bound, [`MAX_IN_FLIGHT_BYTES`]) until they complete or the QP goes. Changes go through
/// the methods, which keep the counts.
///
/// Each WR's request as sent (a train for a multi-packet message; none for a local WR), to
/// resend from, lies in a queue beside the list, not in its `Pending`: both then stay
/// within the size the compiler moves without a call to memcpy.
///
/// The queues keep their room as WRs complete, so that a QP that keeps many in flight
/// does not allocate for each; room past [`WINDOW_FLOOR`] slots counts in the device's
/// total as long as it is kept (`room`), and is given back when at most a quarter of it is
/// in use (the queues shrink to twice what they hold) or the QP's WRs are flushed. A QP
/// that once had a full window of 16K WRs in flight thus holds nothing for it once they
/// have completed, and the device's bound covers the room as well as the WRs in it.
///
/// A request's payload refers to the sender's memory until a receiver copies it. Once the
/// WRs are flushed or dropped (ERR, RESET, a destroyed QP) their buffers are the
/// consumer's again, so the grant their payloads carry ([`InFlight::sends`]) is revoked
/// then: a packet still on the wire never carries what the consumer writes there later
/// (a receiver drops it, as if it had been lost). WRs sent after that get a new grant.
pub(crate) struct InFlight {
    list: VecDeque<(Pending, usize)>,
    requests: VecDeque<Option<Packet>>,
    reads: usize,
    fenced: usize,
    bytes: usize,
    /// The room the queues keep past [`WINDOW_FLOOR`] slots, in bytes (in
    /// `device_bytes` too).
    room: usize,
    /// The device's total over all its QPs.
    device_bytes: Arc<AtomicUsize>,
    sends: Arc<Grant>,
}

impl InFlight {
    pub fn new(device_bytes: Arc<AtomicUsize>) -> Self {
        Self {
            list: VecDeque::new(),
            requests: VecDeque::new(),
            reads: 0,
            fenced: 0,
            bytes: 0,
            room: 0,
            device_bytes,
            sends: Arc::default(),
        }
    }

    /// The bytes the queues' room past [`WINDOW_FLOOR`] slots takes.
    fn room_bytes(&self) -> usize {
        let past = |cap: usize| cap.saturating_sub(WINDOW_FLOOR);
        past(self.list.capacity()) * std::mem::size_of::<(Pending, usize)>()
            + past(self.requests.capacity()) * std::mem::size_of::<Option<Packet>>()
    }

    /// Counts the queues' room anew, after it changed.
    #[cold]
    #[inline(never)]
    fn recount_room(&mut self) {
        let room = self.room_bytes();
        if room >= self.room {
            self.device_bytes
                .fetch_add(room - self.room, Ordering::Relaxed);
        } else {
            self.device_bytes
                .fetch_sub(self.room - room, Ordering::Relaxed);
        }
        self.room = room;
    }

    /// As a WR is about to leave: gives back room that at most a quarter of will be in use
    /// then, so that the queues keep twice what they hold (at least [`WINDOW_FLOOR`]
    /// slots). It keeps the room at most four times what is in flight, and costs a copy of
    /// the WRs left now and then (amortized: the queue must have shrunk by half since it
    /// last grew). (Before the WR is taken, not after: its `Pending` or request then moves
    /// once, straight to the caller.)
    #[inline(always)]
    fn shrink_before_pop(&mut self) {
        // Both queues have the same length and grow and shrink alike: the same capacity.
        let cap = self.list.capacity();
        // At most a quarter in use once one leaves: (len - 1) * 4 <= cap.
        if cap > WINDOW_FLOOR && self.list.len() * 4 <= cap + 4 {
            self.shrink_to((self.list.len().saturating_sub(1) * 2).max(WINDOW_FLOOR));
        }
    }

    #[cold]
    #[inline(never)]
    fn shrink_to(&mut self, slots: usize) {
        self.list.shrink_to(slots);
        self.requests.shrink_to(slots);
        self.recount_room();
    }

    /// The grant that this QP's requests reach its memory under, while their WRs are live.
    pub fn sends(&self) -> &Arc<Grant> {
        &self.sends
    }

    fn counts(p: &Pending) -> (usize, usize) {
        let read = matches!(p.kind, PendKind::Read { .. } | PendKind::Atomic { .. });
        (
            usize::from(read),
            usize::from(!matches!(p.kind, PendKind::Ack)),
        )
    }

    /// Adds a WR sent as `request` (None: a local WR).
    // Always inline (as `push_pending`): the `Pending` and the packet move once, into
    // the queues, not through each call's copy.
    #[inline(always)]
    pub fn push_back(&mut self, p: Pending, request: Option<Packet>) {
        let (r, f) = Self::counts(&p);
        let len = self.list.len();
        let b = host_bytes(&p, request.as_ref(), len < WINDOW_FLOOR);
        (self.reads, self.fenced, self.bytes) = (self.reads + r, self.fenced + f, self.bytes + b);
        self.device_bytes.fetch_add(b, Ordering::Relaxed);
        // (Both queues grow alike: see `shrink_before_pop`.)
        let grows = len == self.list.capacity();
        self.list.push_back((p, b));
        self.requests.push_back(request);
        if grows {
            self.recount_room();
        }
    }

    pub fn pop_front(&mut self) -> Option<Pending> {
        self.uncount_front();
        self.shrink_before_pop();
        self.requests.pop_front();
        self.list.pop_front().map(|(p, _)| p)
    }

    /// Drops the oldest WR; returns its request as sent, if it had one.
    pub fn drop_front(&mut self) -> Option<Packet> {
        self.uncount_front();
        self.shrink_before_pop();
        self.list.pop_front();
        self.requests.pop_front().flatten()
    }

    fn uncount_front(&mut self) {
        let Some((p, b)) = self.list.front() else {
            return;
        };
        let (r, f) = Self::counts(p);
        self.reads -= r;
        self.fenced -= f;
        self.bytes -= b;
        self.device_bytes.fetch_sub(*b, Ordering::Relaxed);
    }

    /// Empties the list (flush, reset), oldest first.
    pub fn take_all(&mut self) -> Vec<Pending> {
        self.sends.revoke();
        self.sends = Arc::default();
        self.device_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        (self.reads, self.fenced, self.bytes) = (0, 0, 0);
        self.requests.clear();
        let all = self.list.drain(..).map(|(p, _)| p).collect();
        if self.room > 0 {
            self.shrink_to(WINDOW_FLOOR);
        }
        all
    }

    pub fn front(&self) -> Option<&Pending> {
        self.list.front().map(|(p, _)| p)
    }

    /// The oldest WR, to update its progress (a read's response PSNs); its kind and
    /// request stay as they were pushed.
    pub fn front_mut(&mut self) -> Option<&mut Pending> {
        self.list.front_mut().map(|(p, _)| p)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.list.iter().map(|(p, _)| p)
    }

    /// The WRs with their requests as sent (None for a local WR), oldest first.
    pub fn with_requests(&self) -> impl Iterator<Item = (&Pending, Option<&Packet>)> {
        self.list
            .iter()
            .zip(&self.requests)
            .map(|((p, _), r)| (p, r.as_ref()))
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// READs and atomics in flight.
    pub fn reads(&self) -> usize {
        self.reads
    }

    /// WRs a FENCE waits for (READs, atomics, local operations).
    pub fn fenced(&self) -> usize {
        self.fenced
    }
}

impl Drop for InFlight {
    /// A destroyed QP's WRs hold nothing any more, and reach nothing.
    fn drop(&mut self) {
        self.device_bytes
            .fetch_sub(self.bytes + self.room, Ordering::Relaxed);
        self.sends.revoke();
    }
}

/// Bytes of a message's destination resolved at a time (a window): a message's list of
/// places is kept whole only up to this length. Past it, a QP receiving it holds the
/// records of one window ([`INBOUND_WINDOW_RECORDS`] at most) and the ranges to resolve the
/// next from, not a record per page of the whole message: a message of 2 GiB over pages of
/// 4 KiB would be 8 MiB of records, on each of 1024 QPs.
pub const INBOUND_WINDOW: u64 = 1 << 20;

/// The most records a window of [`INBOUND_WINDOW`] bytes takes: one per page of the
/// smallest size an MR has (4 KiB), one more per range its receive WQE's SGEs name and
/// one for an unaligned start.
pub const INBOUND_WINDOW_RECORDS: usize =
    (INBOUND_WINDOW >> MIN_MR_PAGE_SHIFT) as usize + 2 * MAX_SGE as usize + 1;

/// Where the rest of a long inbound message goes: the ranges (key, address, length) its
/// bytes fill in order (a WRITE's one rkey range, or a receive WQE's SGEs), checked again
/// as each window is resolved, and the NAK syndrome a range that no longer resolves gets.
pub(crate) struct Rest {
    pub ranges: smallvec::SmallVec<[(u32, u64, u64); 1]>,
    pub how: crate::mr::KeyCheck,
    pub syndrome: u8,
}

/// A message the responder is receiving across several packets.
pub(crate) struct Inbound {
    /// Where the message's bytes go, in order: from byte `base` of the message up to
    /// `end` (all of it, `base` 0 and `end` the room, unless `rest` is set).
    pub segs: SegList,
    pub base: u64,
    pub end: u64,
    /// Where the bytes past `end` go, for a message longer than [`INBOUND_WINDOW`].
    pub rest: Option<Box<Rest>>,
    /// Bytes placed so far, and the room there is.
    pub offset: u64,
    pub cap: u64,
    /// The receive WR a SEND consumed (None for an RDMA WRITE).
    pub recv_wr_id: Option<u64>,
    /// An RDMA WRITE's rkey grant, checked again for each later packet.
    pub grant: Option<std::sync::Arc<crate::packet::Grant>>,
    /// Where `offset` falls in `segs`.
    pub cursor: crate::packet::SegCursor,
}

pub(crate) struct Qp {
    pub qp_type: u32,
    pub pdn: u32,
    /// Its doorbell record's BAR2 offset (see [`crate::uar`]).
    pub db: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    pub sig_all: bool,
    pub sq: WorkQueue,
    /// Its own receive queue; empty and unused when `srq` is set.
    pub rq: WorkQueue,
    /// The SRQ its receives come from.
    pub srq: Option<u32>,
    /// The current attributes; `attr.state` is the QP state.
    pub attr: HcaQpAttr,
    // Requester.
    pub next_psn: u32,
    pub pending: InFlight,
    /// The send queue waits for WRs in flight to complete before it executes its next WQE:
    /// a FENCE waits for earlier READs/atomics, or a limit is reached (the send window, the
    /// READ/atomic credits, the device's in-flight memory bound).
    pub sq_waits: bool,
    /// It waited for the device's in-flight memory bound, and is in `Device::mem_waiters`
    /// (once): the turn that finds the device below its bound again wakes it.
    pub mem_waits: bool,
    /// Created with QP_FLAG_SQ_RING: a send-doorbell ring names it (see `sq_ring`).
    pub sq_named: bool,
    pub retry: Retry,
    // Responder.
    pub epsn: u32,
    pub msn: u32,
    pub inbound: Option<Inbound>,
    /// A sequence (or RNR) NAK went out for `epsn`; further early packets are dropped
    /// silently until it arrives (one NAK per gap, as IB has it).
    pub nak_sent: bool,
    /// The last atomic executed: its PSN and the original value, to answer a duplicate
    /// without executing it twice.
    pub last_atomic: Option<(u32, u64)>,
    /// The responder's latest ACK, held while a burst of this QP's stream is being delivered
    /// (see `Turn::hold_acks`); it covers every message before it. Never while it owes
    /// `answers`: the ACK goes behind them.
    pub held_ack: Option<HeldAck>,
    /// This QP is in `Turn::held_acks` (until the burst's end goes through the list).
    pub held_ack_listed: bool,
    /// What the responder owes its requester and has not sent, in order: a long READ's
    /// response being made, and the answers behind it (see answers.rs).
    pub answers: crate::answers::Answers,
    /// The P_Key at its P_Key index when that was set: its packets carry it, and only
    /// packets of its partition reach it.
    pub pkey: u16,
}

/// An ACK the responder holds: what its packet is made of when it goes out. (Sixteen
/// bytes written per message, where a whole `Packet` was built, moved and dropped for
/// each one only to be replaced by the next.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldAck {
    /// The requester's LID and QP: where the ACK goes; the partition it goes in.
    pub dlid: u16,
    pub dest_qpn: u32,
    pub pkey: u16,
    /// The PSN it acknowledges, and the MSN then.
    pub psn: u32,
    pub msn: u32,
}

impl Qp {
    /// A datagram QP (UD, or the management QPs 0 and 1).
    pub fn is_ud(&self) -> bool {
        !self.is_connected()
    }

    /// Connected to one peer QP (RC or UC): its packets must come from that peer.
    pub fn is_connected(&self) -> bool {
        matches!(self.qp_type, QPT_RC | QPT_UC)
    }

    /// Unreliable connected: nothing is acknowledged or resent.
    pub fn is_uc(&self) -> bool {
        self.qp_type == QPT_UC
    }

    pub fn mtu(&self) -> u32 {
        128 << self.attr.path_mtu.clamp(1, 5)
    }

    /// Whether a sent WR waits for the peer (an ACK or a response), so the timer runs.
    pub fn awaits_peer(&self) -> bool {
        self.pending
            .iter()
            .any(|p| !matches!(p.kind, PendKind::Local))
    }

    /// The retry budgets back to the QP's retry_cnt and rnr_retry.
    pub fn refill_retries(&mut self) {
        self.retry.retries_left = self.attr.retry_cnt;
        self.retry.rnr_left = self.attr.rnr_retry;
    }
}

pub(crate) fn qp_db(qpn: u32) -> u32 {
    BAR2_QP_DB_OFFSET + qpn * 8
}

/// Maps a WR opcode to the opcode its CQE reports.
pub(crate) fn cqe_op_of(wr_opcode: u32) -> Option<u32> {
    Some(match wr_opcode {
        WR_SEND | WR_SEND_IMM | WR_SEND_INV => CQE_OP_SEND,
        WR_RDMA_WRITE | WR_RDMA_WRITE_IMM => CQE_OP_RDMA_WRITE,
        WR_RDMA_READ => CQE_OP_RDMA_READ,
        WR_ATOMIC_CMP_SWP => CQE_OP_COMP_SWAP,
        WR_ATOMIC_FETCH_ADD => CQE_OP_FETCH_ADD,
        WR_MASKED_CMP_SWP => CQE_OP_MASKED_COMP_SWAP,
        WR_MASKED_FETCH_ADD => CQE_OP_MASKED_FETCH_ADD,
        WR_REG_MR => CQE_OP_REG_MR,
        WR_LOCAL_INV => CQE_OP_LOCAL_INV,
        WR_BIND_MW => CQE_OP_BIND_MW,
        WR_ATOMIC_WRITE => CQE_OP_ATOMIC_WRITE,
        _ => return None,
    })
}

/// Required and optional attributes of a transition, as ib_core's table has them; None if
/// the transition is not allowed.
fn transition(qp_type: u32, cur: u32, next: u32) -> Option<(u32, u32)> {
    if qp_type == QPT_UC {
        return uc_transition(cur, next);
    }
    let rc = qp_type == QPT_RC;
    // QP0 and QP1 serve the one port: no port attribute.
    let gsi = matches!(qp_type, QPT_GSI | QPT_SMI);
    let port = if gsi { 0 } else { QP_ATTR_PORT };
    Some(match (cur, next) {
        (_, QPS_RESET) | (_, QPS_ERR) => (0, 0),
        (QPS_RESET, QPS_INIT) if rc => {
            (QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS, 0)
        }
        (QPS_RESET, QPS_INIT) => (QP_ATTR_PKEY_INDEX | port | QP_ATTR_QKEY, 0),
        (QPS_INIT, QPS_INIT) if rc => (0, QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS),
        (QPS_INIT, QPS_INIT) => (0, QP_ATTR_PKEY_INDEX | port | QP_ATTR_QKEY),
        (QPS_INIT, QPS_RTR) if rc => (
            QP_ATTR_AV
                | QP_ATTR_PATH_MTU
                | QP_ATTR_DEST_QPN
                | QP_ATTR_RQ_PSN
                | QP_ATTR_MAX_DEST_RD_ATOMIC
                | QP_ATTR_MIN_RNR_TIMER,
            QP_ATTR_ACCESS_FLAGS | QP_ATTR_PKEY_INDEX,
        ),
        (QPS_INIT, QPS_RTR) => (0, QP_ATTR_PKEY_INDEX | QP_ATTR_QKEY),
        (QPS_RTR, QPS_RTS) if rc => (
            QP_ATTR_SQ_PSN
                | QP_ATTR_TIMEOUT
                | QP_ATTR_RETRY_CNT
                | QP_ATTR_RNR_RETRY
                | QP_ATTR_MAX_QP_RD_ATOMIC,
            QP_ATTR_CUR_STATE | QP_ATTR_ACCESS_FLAGS | QP_ATTR_MIN_RNR_TIMER,
        ),
        (QPS_RTR, QPS_RTS) => (QP_ATTR_SQ_PSN, QP_ATTR_CUR_STATE | QP_ATTR_QKEY),
        (QPS_RTS, QPS_RTS) if rc => (
            0,
            QP_ATTR_CUR_STATE | QP_ATTR_ACCESS_FLAGS | QP_ATTR_MIN_RNR_TIMER,
        ),
        (QPS_RTS, QPS_RTS) => (0, QP_ATTR_CUR_STATE | QP_ATTR_QKEY),
        _ => return None,
    })
}

/// A UC QP's transitions: RC's, less what only reliability needs (ACK timeout, retry
/// counts, READ/atomic depths, the RNR timer).
fn uc_transition(cur: u32, next: u32) -> Option<(u32, u32)> {
    let init = QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS;
    Some(match (cur, next) {
        (_, QPS_RESET) | (_, QPS_ERR) => (0, 0),
        (QPS_RESET, QPS_INIT) => (init, 0),
        (QPS_INIT, QPS_INIT) => (0, init),
        (QPS_INIT, QPS_RTR) => (
            QP_ATTR_AV | QP_ATTR_PATH_MTU | QP_ATTR_DEST_QPN | QP_ATTR_RQ_PSN,
            QP_ATTR_ACCESS_FLAGS | QP_ATTR_PKEY_INDEX,
        ),
        (QPS_RTR, QPS_RTS) => (QP_ATTR_SQ_PSN, QP_ATTR_CUR_STATE | QP_ATTR_ACCESS_FLAGS),
        (QPS_RTS, QPS_RTS) => (0, QP_ATTR_CUR_STATE | QP_ATTR_ACCESS_FLAGS),
        _ => return None,
    })
}

/// Range checks on the attributes `mask` names.
fn attrs_valid(mask: u32, a: &HcaQpAttr) -> bool {
    let has = |bit| mask & bit != 0;
    !(has(QP_ATTR_PKEY_INDEX) && usize::from(a.pkey_index) >= crate::partition::PKEY_TABLE_LEN
        || has(QP_ATTR_PORT) && a.port_num != 1
        || has(QP_ATTR_ACCESS_FLAGS) && a.access_flags & !0xf != 0
        || has(QP_ATTR_PATH_MTU) && !(MTU_256..=MTU_4096).contains(&u32::from(a.path_mtu))
        || has(QP_ATTR_AV) && (a.dlid == 0 || a.dlid >= 0xc000)
        || has(QP_ATTR_DEST_QPN) && a.dest_qpn > PSN_MASK
        || has(QP_ATTR_RQ_PSN) && a.rq_psn > PSN_MASK
        || has(QP_ATTR_SQ_PSN) && a.sq_psn > PSN_MASK
        || has(QP_ATTR_TIMEOUT) && a.timeout > 31
        || has(QP_ATTR_RETRY_CNT) && a.retry_cnt > 7
        || has(QP_ATTR_RNR_RETRY) && a.rnr_retry > 7
        || has(QP_ATTR_MIN_RNR_TIMER) && a.min_rnr_timer > 31)
}

/// One QP's engine: the QP and the device it acts through. The requester (requester.rs),
/// the completer (completer.rs), the responder (responder.rs) and the transport timer
/// (reliability.rs) are its methods, as rxe's are functions of one `struct rxe_qp`: each
/// works on this QP's state and emits what it produces into the device (packets, CQEs,
/// events), so none looks a QP up by number, and one QP's work cannot touch another QP.
pub(crate) struct QpEngine<'a> {
    pub qpn: u32,
    pub qp: &'a mut Qp,
    pub dev: &'a mut Device,
}

impl HcaState {
    /// QP `qpn`'s engine, if the QP exists.
    pub(crate) fn engine(&mut self, qpn: u32) -> Option<QpEngine<'_>> {
        // The engine may change anything of the QP: what the send scan noted goes.
        self.forget_sq_hint(qpn);
        let qp = self.qps.get_mut(qpn)?;
        Some(QpEngine {
            qpn,
            qp,
            dev: &mut self.dev,
        })
    }

    fn forget_sq_hint(&mut self, qpn: u32) {
        if let Some(h) = self.sq_hints.get_mut(qpn as usize) {
            *h = SqHint::Look;
        }
    }

    pub(crate) fn cmd_create_qp(&mut self, a: &HcaCmdCreateQp) -> Result<u32, CmdError> {
        if !matches!(a.qp_type, QPT_RC | QPT_UC | QPT_UD | QPT_GSI | QPT_SMI)
            || a.flags & !(QP_FLAG_SIG_ALL | QP_FLAG_SRQ | QP_FLAG_SQ_RING) != 0
        {
            return Err(CmdError::BadParam);
        }
        let srq = (a.flags & QP_FLAG_SRQ != 0).then_some(a.srqn);
        let db = crate::uar::record(a.db_offset, 0)?;
        let dev = &mut self.dev;
        // Management QPs are the kernel's: a user PD cannot hold one.
        if matches!(a.qp_type, QPT_GSI | QPT_SMI) && dev.pds.get(a.pdn).is_some_and(|pd| pd.user) {
            return Err(CmdError::BadParam);
        }
        if dev.pds.get(a.pdn).is_none()
            || dev.cqs.get(a.send_cqn).is_none()
            || dev.cqs.get(a.recv_cqn).is_none()
        {
            return Err(CmdError::BadHandle);
        }
        match srq.map(|n| dev.srqs.get(n)) {
            Some(None) => return Err(CmdError::BadHandle),
            Some(Some(s)) if s.error => return Err(CmdError::BadState),
            _ => {}
        }
        // On an SRQ the QP's own receive queue is empty: its fields are not looked at.
        let (rq_log_entries, rq_wqe_shift, rq_addr) = match srq {
            Some(_) => (0, MIN_RQ_WQE_SHIFT as u8, 0),
            None => (a.rq_log_entries, a.rq_wqe_shift, a.rq_addr),
        };
        let shapes_ok = u32::from(a.sq_log_entries) <= MAX_QP_LOG_WR
            && u32::from(rq_log_entries) <= MAX_QP_LOG_WR
            && (MIN_SQ_WQE_SHIFT..=MAX_SQ_WQE_SHIFT).contains(&u32::from(a.sq_wqe_shift))
            && (MIN_RQ_WQE_SHIFT..=MAX_RQ_WQE_SHIFT).contains(&u32::from(rq_wqe_shift));
        if !shapes_ok {
            return Err(CmdError::BadParam);
        }
        let sq_bytes = 1u64 << (a.sq_log_entries + a.sq_wqe_shift);
        let rq_bytes = 1u64 << (rq_log_entries + rq_wqe_shift);
        if !dev.mem.check(a.sq_addr, sq_bytes)
            || (srq.is_none() && !dev.mem.check(rq_addr, rq_bytes))
        {
            return Err(CmdError::BadAddress);
        }
        let qp = Qp {
            qp_type: a.qp_type,
            pdn: a.pdn,
            db,
            send_cqn: a.send_cqn,
            recv_cqn: a.recv_cqn,
            sig_all: a.flags & QP_FLAG_SIG_ALL != 0,
            sq: WorkQueue {
                addr: a.sq_addr,
                log_entries: a.sq_log_entries.into(),
                wqe_shift: a.sq_wqe_shift.into(),
                ci: 0,
            },
            rq: WorkQueue {
                addr: rq_addr,
                log_entries: rq_log_entries.into(),
                wqe_shift: rq_wqe_shift.into(),
                ci: 0,
            },
            srq,
            attr: HcaQpAttr {
                state: QPS_RESET as u8,
                qp_type: a.qp_type as u8,
                qkey: if a.qp_type == QPT_GSI { GSI_QKEY } else { 0 },
                path_mtu: MTU_4096 as u8,
                port_num: 1,
                ..Default::default()
            },
            next_psn: 0,
            pending: InFlight::new(dev.held.clone()),
            sq_waits: false,
            mem_waits: false,
            sq_named: a.flags & QP_FLAG_SQ_RING != 0,
            retry: Retry::default(),
            epsn: 0,
            msn: 0,
            inbound: None,
            nak_sent: false,
            last_atomic: None,
            held_ack: None,
            held_ack_listed: false,
            answers: Default::default(),
            pkey: crate::partition::DEFAULT_PKEY,
        };
        let special = match a.qp_type {
            QPT_GSI => Some(GSI_QPN),
            QPT_SMI => Some(SMI_QPN),
            _ => None,
        };
        let qpn = match special {
            Some(qpn) => {
                if !self.qps.insert_at(qpn, qp) {
                    return Err(CmdError::Busy);
                }
                qpn
            }
            None => self.qps.alloc(qp).ok_or(CmdError::NoResources)?,
        };
        let db = if db == 0 { qp_db(qpn) } else { db };
        if let Some(qp) = self.qps.get_mut(qpn) {
            qp.db = db;
        }
        let dev = &mut self.dev;
        for cqn in [a.send_cqn, a.recv_cqn] {
            if let Some(cq) = dev.cqs.get_mut(cqn) {
                cq.users += 1;
            }
        }
        if let Some(pd) = dev.pds.get_mut(a.pdn) {
            pd.users += 1;
        }
        if let Some(s) = srq.and_then(|n| dev.srqs.get_mut(n)) {
            s.users += 1;
        }
        dev.bar2.write_obj(db, &HcaQpDb::default());
        self.live_qps.push(qpn);
        self.sq_rings
            .add(&dev.bar2, qpn, db, a.flags & QP_FLAG_SQ_RING != 0);
        self.forget_sq_hint(qpn);
        Ok(qpn)
    }

    pub(crate) fn cmd_destroy_qp(&mut self, qpn: u32) -> Result<(), CmdError> {
        let mut qp = self.qps.remove(qpn).ok_or(CmdError::BadHandle)?;
        self.live_qps.retain(|&q| q != qpn);
        self.sq_rings.remove(qpn, qp.db, qp.sq_named);
        self.forget_sq_hint(qpn);
        let dev = &mut self.dev;
        dev.give_back_inbound(qpn, &mut qp);
        dev.detach_qp(qpn);
        dev.unbind_windows_of(qpn);
        for cqn in [qp.send_cqn, qp.recv_cqn] {
            if let Some(cq) = dev.cqs.get_mut(cqn) {
                cq.users -= 1;
            }
        }
        if let Some(pd) = dev.pds.get_mut(qp.pdn) {
            pd.users -= 1;
        }
        if let Some(s) = qp.srq.and_then(|n| dev.srqs.get_mut(n)) {
            s.users -= 1;
        }
        Ok(())
    }

    pub(crate) fn cmd_query_qp(&self, qpn: u32) -> Result<HcaQpAttr, CmdError> {
        let qp = self.qps.get(qpn).ok_or(CmdError::BadHandle)?;
        let mut a = qp.attr;
        a.cur_state = a.state;
        Ok(a)
    }

    pub(crate) fn cmd_modify_qp(&mut self, m: &HcaCmdModifyQp) -> Result<(), CmdError> {
        let mut e = self.engine(m.qpn).ok_or(CmdError::BadHandle)?;
        let cur = u32::from(e.qp.attr.state);
        let mask = m.attr_mask;
        let a = &m.attr;
        if mask & QP_ATTR_CUR_STATE != 0 && u32::from(a.cur_state) != cur {
            return Err(CmdError::BadState);
        }
        let next = if mask & QP_ATTR_STATE != 0 {
            u32::from(a.state)
        } else {
            cur
        };
        let (required, optional) = transition(e.qp.qp_type, cur, next).ok_or(CmdError::BadState)?;
        let allowed = required | optional | QP_ATTR_STATE | QP_ATTR_CUR_STATE;
        if mask & required != required || mask & !allowed != 0 {
            return Err(CmdError::BadParam);
        }
        if !attrs_valid(mask, a) {
            return Err(CmdError::BadParam);
        }
        if mask & QP_ATTR_PKEY_INDEX != 0 {
            // An empty entry names no partition (IBA: the index must hold a valid P_Key).
            let pkey = e.dev.pkeys.get(usize::from(a.pkey_index)).copied();
            e.qp.pkey = pkey
                .filter(|&k| k & 0x7fff != 0)
                .ok_or(CmdError::BadParam)?;
        }
        apply_attrs(e.qp, mask, a);
        match next {
            QPS_RESET => e.reset(),
            QPS_ERR if cur != QPS_ERR => e.enter_error_from(cur),
            QPS_RTS if cur == QPS_RTR => e.process_sq(),
            _ => {}
        }
        Ok(())
    }

    /// DB_RQ: only QPs in ERR act on receive doorbells (new receives are flushed); others
    /// consume receive WQEs when messages arrive. So only the QPs that entered ERR are
    /// visited, not every live one; one that left ERR since (reset, or destroyed and its
    /// number reused) drops out of the list.
    pub(crate) fn scan_recv_queues(&mut self) {
        let mut i = 0;
        while let Some(&qpn) = self.dev.qps_in_error.get(i) {
            match self.engine(qpn) {
                Some(mut e) if u32::from(e.qp.attr.state) == QPS_ERR => {
                    e.flush_queues();
                    i += 1;
                }
                _ => {
                    self.dev.qps_in_error.swap_remove(i);
                }
            }
        }
        if self.dev.qps_in_error.is_empty() {
            self.dev.recv_doorbells.no_qp_in_error();
        }
    }
}

impl Device {
    /// Drops a message half received; the receive WQE it consumed completes flushed.
    fn flush_inbound(&mut self, qpn: u32, qp: &mut Qp) {
        if let Some(wr_id) = qp.inbound.take().and_then(|m| m.recv_wr_id) {
            self.post_status(qp.recv_cqn, qpn, wr_id, CQE_OP_RECV, WcError::WrFlush);
        }
    }

    /// A QP leaving without ERR (reset, destroyed): a receive it took from an SRQ completes
    /// flushed, so that the SRQ's owner gets its slot back (a QP's own receive queue goes
    /// with it, and needs nothing).
    fn give_back_inbound(&mut self, qpn: u32, qp: &mut Qp) {
        if qp.srq.is_some() {
            self.flush_inbound(qpn, qp);
        }
    }
}

impl QpEngine<'_> {
    fn reset(&mut self) {
        self.dev.give_back_inbound(self.qpn, self.qp);
        let qp = &mut *self.qp;
        qp.attr.state = QPS_RESET as u8;
        qp.sq.ci = 0;
        qp.rq.ci = 0;
        qp.pending.take_all();
        qp.inbound = None;
        qp.sq_waits = false;
        qp.msn = 0;
        qp.held_ack = None;
        qp.answers.clear();
        self.dev.bar2.write_obj(self.qp.db, &HcaQpDb::default());
    }

    /// Moves the QP to ERR and flushes everything it holds.
    pub(crate) fn enter_error(&mut self) {
        let was = u32::from(self.qp.attr.state);
        self.enter_error_from(was);
    }

    /// Moves the QP, which was in state `was`, to ERR (MODIFY_QP has set the state already).
    fn enter_error_from(&mut self, was: u32) {
        let (qpn, qp) = (self.qpn, &mut *self.qp);
        qp.attr.state = QPS_ERR as u8;
        if qp.srq.is_some() && was != QPS_ERR {
            // It takes no more receives: the SRQ's owner may reclaim the QP.
            self.dev.post_event(VEC_ASYNC, EV_QP_LAST_WQE, qpn, 0);
        }
        if !self.dev.qps_in_error.contains(&qpn) {
            self.dev.qps_in_error.push(qpn);
        }
        self.dev.recv_doorbells.qp_entered_error();
        qp.sq_waits = false;
        qp.retry = Retry::default();
        qp.held_ack = None;
        let pending: Vec<Pending> = qp.pending.take_all();
        log::debug!(
            "LID {}: QP {qpn:#x} to ERR; {} outstanding WRs flushed",
            self.dev.lid,
            pending.len()
        );
        // A message half received has consumed a receive WQE: it is flushed too, first.
        self.dev.flush_inbound(qpn, qp);
        for p in pending {
            self.dev
                .post_status(qp.send_cqn, qpn, p.wr_id, p.cqe_op, WcError::WrFlush);
        }
        self.flush_queues();
    }

    /// A local catastrophic error (bad ring index, unreadable WQE): async event, then ERR.
    pub(crate) fn fatal(&mut self, reason: u32) {
        let qpn = self.qpn;
        log::debug!(
            "LID {}: QP {qpn:#x} fatal error (reason {reason:#x})",
            self.dev.lid
        );
        self.dev.post_event(VEC_ASYNC, EV_QP_FATAL, qpn, reason);
        // The indices cannot be trusted: drop what is posted rather than flush garbage.
        let db: HcaQpDb = self.dev.bar2.read_obj(self.qp.db);
        self.qp.sq.ci = db.sq_pi;
        self.qp.rq.ci = db.rq_pi;
        self.enter_error();
    }

    /// Completes every WR posted to an ERR QP's queues with WcError::WrFlush.
    pub(crate) fn flush_queues(&mut self) {
        let (qpn, qp) = (self.qpn, &mut *self.qp);
        let db: HcaQpDb = self.dev.bar2.read_obj(qp.db);
        let mem = self.dev.mem.as_ref();
        let mut flushed = Vec::new();
        // Receives posted to an SRQ stay there for its other QPs.
        let rq_pi = if qp.srq.is_some() { qp.rq.ci } else { db.rq_pi };
        for (wq, pi, cqn, is_send) in [
            (&mut qp.sq, db.sq_pi, qp.send_cqn, true),
            (&mut qp.rq, rq_pi, qp.recv_cqn, false),
        ] {
            if pi.wrapping_sub(wq.ci) > wq.size() {
                wq.ci = pi; // Nonsense index: nothing sensible to flush.
            }
            while wq.ci != pi {
                let slot = wq.slot(wq.ci);
                let (wr_id, op) = if is_send {
                    let w: HcaSendWqe = read_obj(mem, slot).unwrap_or_default();
                    (w.wr_id, cqe_op_of(w.opcode.into()).unwrap_or(CQE_OP_SEND))
                } else {
                    let w: HcaRecvWqe = read_obj(mem, slot).unwrap_or_default();
                    (w.wr_id, CQE_OP_RECV)
                };
                flushed.push((cqn, wr_id, op));
                wq.ci = wq.ci.wrapping_add(1);
            }
        }
        for (cqn, wr_id, op) in flushed {
            self.dev.post_status(cqn, qpn, wr_id, op, WcError::WrFlush);
        }
    }
}

fn apply_attrs(qp: &mut Qp, mask: u32, a: &HcaQpAttr) {
    let has = |bit| mask & bit != 0;
    if has(QP_ATTR_STATE) {
        qp.attr.state = a.state;
    }
    if has(QP_ATTR_ACCESS_FLAGS) {
        qp.attr.access_flags = a.access_flags;
    }
    if has(QP_ATTR_QKEY) {
        qp.attr.qkey = a.qkey;
    }
    if has(QP_ATTR_AV) {
        qp.attr.dlid = a.dlid;
        qp.attr.sl = a.sl;
    }
    if has(QP_ATTR_PATH_MTU) {
        qp.attr.path_mtu = a.path_mtu;
    }
    if has(QP_ATTR_DEST_QPN) {
        qp.attr.dest_qpn = a.dest_qpn;
    }
    if has(QP_ATTR_RQ_PSN) {
        qp.attr.rq_psn = a.rq_psn;
        qp.epsn = a.rq_psn;
    }
    if has(QP_ATTR_SQ_PSN) {
        qp.attr.sq_psn = a.sq_psn;
        qp.next_psn = a.sq_psn;
    }
    if has(QP_ATTR_TIMEOUT) {
        qp.attr.timeout = a.timeout;
    }
    if has(QP_ATTR_RETRY_CNT) {
        qp.attr.retry_cnt = a.retry_cnt;
    }
    if has(QP_ATTR_RNR_RETRY) {
        qp.attr.rnr_retry = a.rnr_retry;
    }
    if has(QP_ATTR_MIN_RNR_TIMER) {
        qp.attr.min_rnr_timer = a.min_rnr_timer;
    }
    if has(QP_ATTR_MAX_QP_RD_ATOMIC) {
        qp.attr.max_rd_atomic = a.max_rd_atomic;
    }
    if has(QP_ATTR_MAX_DEST_RD_ATOMIC) {
        qp.attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rc_rtr_needs_the_path_and_remote_qp() {
        let (req, _) = transition(QPT_RC, QPS_INIT, QPS_RTR).unwrap();
        assert_ne!(req & QP_ATTR_DEST_QPN, 0);
        assert_ne!(req & QP_ATTR_AV, 0);
        assert!(transition(QPT_RC, QPS_RESET, QPS_RTS).is_none());
        assert!(transition(QPT_UD, QPS_INIT, QPS_RTS).is_none());
        assert_eq!(transition(QPT_UD, QPS_RTS, QPS_ERR), Some((0, 0)));
    }

    #[test]
    fn test_attribute_ranges_are_checked() {
        let a = HcaQpAttr {
            path_mtu: 6,
            ..Default::default()
        };
        assert!(!attrs_valid(QP_ATTR_PATH_MTU, &a));
        assert!(attrs_valid(0, &a));
        let a = HcaQpAttr {
            dlid: 0,
            ..Default::default()
        };
        assert!(!attrs_valid(QP_ATTR_AV, &a));
    }
    fn pending(wr_id: u64) -> Pending {
        Pending {
            wr_id,
            cqe_op: CQE_OP_SEND,
            signaled: false,
            first_psn: 0,
            last_psn: 0,
            byte_len: 0,
            kind: PendKind::Ack,
            next_resp_psn: 0,
            reread_from: None,
        }
    }

    /// What the queues' slots take on the heap past the floor, and the WRs' other shares.
    fn floor_free(f: &InFlight) -> usize {
        let past = |cap: usize| cap.saturating_sub(WINDOW_FLOOR);
        past(f.list.capacity()) * std::mem::size_of::<(Pending, usize)>()
            + past(f.requests.capacity()) * std::mem::size_of::<Option<Packet>>()
            + f.len() * (WR_FIXED_BYTES - WR_SLOT_BYTES)
    }

    #[test]
    fn test_a_window_counts_its_room_and_gives_it_back_as_wrs_complete() {
        let device = Arc::new(AtomicUsize::new(0));
        let mut f = InFlight::new(device.clone());
        // A few WRs: each its fixed share, no room counted.
        for i in 0..4 {
            f.push_back(pending(i), Some(Packet::default()));
        }
        assert_eq!(device.load(Ordering::Relaxed), 4 * WR_FIXED_BYTES);
        for _ in 0..4 {
            f.pop_front();
        }
        assert_eq!(device.load(Ordering::Relaxed), 0);
        // A full window of 16K: every slot the queues allocated past the floor counts.
        for i in 0..1 << 14 {
            f.push_back(pending(i), Some(Packet::default()));
            assert!(device.load(Ordering::Relaxed) >= floor_free(&f));
        }
        let full = device.load(Ordering::Relaxed);
        assert!(full >= (1 << 14) * WR_FIXED_BYTES, "{full}");
        assert!(full <= (1 << 15) * WR_FIXED_BYTES, "{full}");
        // As they complete the room shrinks: never more than four times what is in use.
        while !f.is_empty() {
            f.pop_front();
            let cap = f.list.capacity().max(f.requests.capacity());
            assert!(
                cap <= WINDOW_FLOOR || cap < 4 * f.len(),
                "{cap} for {}",
                f.len()
            );
            assert_eq!(device.load(Ordering::Relaxed), f.bytes + f.room);
            assert!(device.load(Ordering::Relaxed) >= floor_free(&f));
        }
        assert_eq!(
            device.load(Ordering::Relaxed),
            0,
            "nothing counted once done"
        );
        assert!(f.list.capacity() <= WINDOW_FLOOR);
        assert!(f.requests.capacity() <= WINDOW_FLOOR);
    }

    #[test]
    fn test_a_flushed_or_dropped_window_gives_back_its_room() {
        let device = Arc::new(AtomicUsize::new(0));
        let mut f = InFlight::new(device.clone());
        for i in 0..5000 {
            f.push_back(pending(i), None);
        }
        assert!(device.load(Ordering::Relaxed) > 5000 * WR_FIXED_BYTES);
        assert_eq!(f.take_all().len(), 5000);
        assert_eq!(device.load(Ordering::Relaxed), 0);
        assert!(f.list.capacity() <= WINDOW_FLOOR);
        // Dropped (the QP destroyed) with its window full.
        for i in 0..5000 {
            f.push_back(pending(i), None);
        }
        drop(f);
        assert_eq!(device.load(Ordering::Relaxed), 0);
    }
}
