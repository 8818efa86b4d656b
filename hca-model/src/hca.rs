//! The HCA: its state, its entry points (doorbell, packet delivery) and its interrupt output.
//!
//! Locking: one mutex per HCA guards all of its state (`HcaState`). Entry points take it,
//! do their work, and collect what must happen outside it: interrupts to raise and fabric
//! packets to move. Interrupts are raised and the fabric pumped after the lock is dropped, so
//! an HCA never holds its lock while another HCA's lock is taken (see fabric/mod.rs).
//!
//! Shape: `HcaState` is the QP table beside a `Device` (everything else). Device-wide
//! concerns are `impl Device` blocks in their own files: PD/MR and key checks (mr.rs), CQ
//! rings (cq.rs), event queues (eq.rs), multicast attachments (mcast.rs). The engine is
//! per QP (`QpEngine` in qp.rs: one QP and the device it emits into), in the files rxe
//! has: the requester (requester.rs), the completer (completer.rs), the responder
//! (responder.rs), the transport timer (reliability.rs), and the state machine (qp.rs).
//! `HcaState` keeps what needs the QP table: commands (command.rs) and the dispatch of a
//! doorbell, a packet or a tick to the QPs it concerns.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use vm_memory::GuestMemory;

use crate::abi::*;
use crate::adapter_hook::{AdapterHook, IrqFate};
use crate::answers::READ_PIECES_PER_TURN;
use crate::cq::Cq;
use crate::devmem::DeviceMemory;
use crate::dma::{DmaSpace, GuestRam};
use crate::eq::Eq;
use crate::fabric::{AdapterFault, DropReason, Fabric, Lid, LidTaken, PacketSink, Rejected};
use crate::mr::{Mr, Pd};
use crate::packet::Packet;
use crate::qp::Qp;
use crate::sync::Unpoisoned;
use crate::turn::{Turn, WORK_PER_TURN};

/// Raises one of the guest's MSI-X vectors. Host adapters implement it (an eventfd write
/// under QEMU, an irqfd under the VMM).
pub trait InterruptSink: Send + Sync {
    /// Raises MSI-X vector `vector`.
    fn raise(&self, vector: u32);
}

/// Discards interrupts: for a guest that only polls.
pub struct NoInterrupts;

impl InterruptSink for NoInterrupts {
    fn raise(&self, _vector: u32) {}
}

/// Counters a user can read to see what the device did. Monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaStats {
    /// Doorbells rung (receive doorbells counted without the lock included).
    pub doorbells: u64,
    /// Mailbox commands run.
    pub commands: u64,
    /// WQEs executed.
    pub wqes: u64,
    /// CQEs written.
    pub cqes: u64,
    /// CQEs lost to a full CQ.
    pub cqes_lost: u64,
    /// EQEs written.
    pub events: u64,
    /// EQEs lost to a full EQ.
    pub events_lost: u64,
    /// Completion events not posted because the CQ's last one was still unconsumed.
    pub events_coalesced: u64,
    /// MSI-X interrupts raised.
    pub interrupts: u64,
    /// MTU packets sent and received (a train counts as the packets it stands for).
    pub packets_out: u64,
    /// MTU packets received.
    pub packets_in: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Octets sent and received on the wire, headers and CRCs included
    /// ([`Packet::wire_bytes`]).
    pub wire_out: u64,
    /// Octets received on the wire.
    pub wire_in: u64,
    /// MTU packets sent to and received from multicast groups.
    pub mcast_out: u64,
    /// MTU packets received from multicast groups.
    pub mcast_in: u64,
    /// Packets the port could not send: no port had their destination LID.
    pub xmit_discards: u64,
    /// Times the port's link went down.
    pub link_downs: u64,
    /// Datagrams dropped: no receive posted, a bad Q_Key, too long.
    pub ud_dropped: u64,
    /// UC packets dropped: out of sequence, or refused by the responder (no receive WQE,
    /// a bad rkey, too long), or undeliverable (UC does not tell the sender).
    pub uc_dropped: u64,
    /// RC packets sent that no receiver took.
    pub rc_dropped: u64,
    /// Device accesses to guest memory that failed (outside RAM, or a bad ring).
    pub dma_faults: u64,
    /// RC packets sent again (timeouts, sequence NAKs, RNR waits).
    pub retransmits: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks: u64,
    /// Read responses that arrived past a gap (the read was asked again at once).
    pub read_gaps: u64,
    /// RNR NAKs received.
    pub rnr_naks: u64,
    /// WRs that ended in WcError::RetryExc: their retries ran out, or the peer's port is
    /// gone from the fabric (no route: retrying cannot help).
    pub retry_exceeded: u64,
    /// Requests seen twice (a resend of something that had arrived) and answered again.
    pub duplicates: u64,
    /// Packets dropped on arrival for a bad ICRC (corrupted on the wire).
    pub icrc_errors: u64,
    /// Packets dropped on arrival for a P_Key that does not match the receiving QP's
    /// partition (IBA's P_Key violations; see `crate::partition`).
    pub pkey_violations: u64,
    /// Remote accesses stopped because their MR was deregistered, invalidated or re-mapped
    /// after the key was checked: read responses not copied, write packets refused.
    pub revoked: u64,
    /// Further turns that send queues or READ responses took because their work was more
    /// than one turn allows (the device lock was let go between turns).
    pub extra_turns: u64,
    /// Send-doorbell ring entries that named a QP the ring may name (see `sq_ring`).
    pub sq_named: u64,
    /// Send-doorbell ring entries passed over: no live QP created with `QP_FLAG_SQ_RING`, or
    /// one whose doorbell record the ring's owner does not hold.
    pub sq_ring_ignored: u64,
    /// Send doorbells that found a ring's producer index too far ahead to read it, and
    /// looked at every live QP instead.
    pub sq_ring_overruns: u64,
    /// Looks at every live QP's send queue (a ring overran, or a turn went on with work
    /// left); a send doorbell otherwise runs only the QPs named and the unnamed ones.
    pub sq_scans: u64,
}

/// A fixed-capacity handle table; index 0 and any reserved low indices are never handed out.
/// A table made with [`Table::next_fit`] hands out the free index after the one it handed
/// out last (wrapping round), not the lowest free one.
pub(crate) struct Table<T> {
    slots: Vec<Option<T>>,
    first: u32,
    /// Where the next search starts (next-fit tables only).
    next: Option<u32>,
}

impl<T> Table<T> {
    pub fn new(capacity: u32, first: u32) -> Self {
        Self {
            slots: (0..capacity).map(|_| None).collect(),
            first,
            next: None,
        }
    }

    /// A table whose freed indices come back only after every other free one has been
    /// handed out: QPNs, as HCAs give them, so that a packet still in flight to a
    /// destroyed QP does not reach the next QP created.
    pub fn next_fit(capacity: u32, first: u32) -> Self {
        Self {
            next: Some(first),
            ..Self::new(capacity, first)
        }
    }

    /// Where a next-fit table's next search starts (None for other tables).
    pub fn cursor(&self) -> Option<u32> {
        self.next
    }

    /// A next-fit table's next search starts at `at` (wrapped into the table).
    pub fn set_cursor(&mut self, at: u32) {
        let (first, len) = (self.first, self.slots.len() as u32);
        if self.next.is_some() && len > first {
            self.next = Some(first + at.saturating_sub(first) % (len - first));
        }
    }

    pub fn alloc(&mut self, v: T) -> Option<u32> {
        let first = self.first as usize;
        let start = self.next.map_or(first, |n| n as usize);
        let free = |s: &Option<T>| s.is_none();
        let i = (start..self.slots.len())
            .chain(first..start)
            .find(|&i| self.slots.get(i).is_some_and(free))?;
        *self.slots.get_mut(i)? = Some(v);
        if self.next.is_some() {
            self.next = Some(i as u32 + 1);
        }
        Some(i as u32)
    }

    /// Puts `v` at a fixed index (the GSI QP); fails if taken or out of range.
    pub fn insert_at(&mut self, i: u32, v: T) -> bool {
        match self.slots.get_mut(i as usize) {
            Some(s @ None) => {
                *s = Some(v);
                true
            }
            _ => false,
        }
    }

    pub fn get(&self, i: u32) -> Option<&T> {
        self.slots.get(i as usize)?.as_ref()
    }

    pub fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        self.slots.get_mut(i as usize)?.as_mut()
    }

    pub fn remove(&mut self, i: u32) -> Option<T> {
        self.slots.get_mut(i as usize)?.take()
    }

    /// The indices in use, in order.
    pub fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.slots.len() as u32).filter(|&i| self.get(i).is_some())
    }
}

/// Everything behind the HCA's lock: its QPs, and the device they act through.
pub(crate) struct HcaState {
    pub dev: Device,
    pub qps: Table<Qp>,
    /// QPNs in use, so doorbells scan only live QPs.
    pub live_qps: Vec<u32>,
    /// What a send doorbell's scan last found of each QP's send queue, by QPN: lets the
    /// scan pass over an idle QP reading this dense table and the QP's doorbell record
    /// alone, not the QP (see `SqHint`).
    pub sq_hints: Vec<SqHint>,
    /// Which QPs a send doorbell is for (see `sq_ring`).
    pub sq_rings: crate::sq_ring::SqRings,
}

/// A send doorbell's note on one QP's send queue. Only the scan sets one, after running
/// the QP; every other access to the QP goes through `HcaState::engine`, which clears it,
/// so a hint never outlives the state it describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum SqHint {
    /// Unknown: the scan looks at the QP.
    #[default]
    Look,
    /// Nothing for a send doorbell to do whatever is posted (a state that does not send,
    /// or RTS waiting for completions).
    Still,
    /// In RTS with its consumer index `ci`: nothing to do while the producer index in the
    /// record at BAR2 offset `db` equals it.
    Idle { ci: u32, db: u32 },
}

/// The HCA apart from its QPs: guest memory and BAR2, protection domains and keys, CQs and
/// EQs, the port. A QP's engine (see qp.rs) reads WQEs and keys through it and emits what
/// it produces into it: packets (`transmit`), completions (`post_cqe`), events and the
/// interrupts they raise, timer deadlines and counters.
pub(crate) struct Device {
    pub mem: Arc<dyn DmaSpace>,
    pub bar2: Arc<DeviceMemory>,
    pub fabric: Option<Fabric>,
    pub lid: Lid,
    pub node_guid: u64,
    pub pds: Table<Pd>,
    pub mrs: Table<Mr>,
    /// Per-slot key tag, bumped on every registration so a stale key never matches.
    pub mr_tags: Vec<u8>,
    pub mr_pages: u64,
    pub cqs: Table<Cq>,
    /// CQNs in use, so doorbells scan only live CQs.
    pub live_cqs: Vec<u32>,
    pub srqs: Table<crate::srq::Srq>,
    pub eqs: [Eq; NUM_VECTORS as usize],
    pub last_cmd_seq: u32,
    /// The host's id for this device as a doorbell target (ivshmem peer id), shown in BAR2.
    pub doorbell_peer: u32,
    pub stats: HcaStats,
    /// No QP timer is due before this fabric time (ns; NEVER when none runs).
    pub timer_hint: u64,
    /// Fabric time the port's transport timers do not count: the fabric's stalls for it,
    /// summed (see fabric/clock.rs). Shared with `Shared`, whose ticks add to it.
    pub transport_lag: Arc<AtomicU64>,
    /// Interrupts an adapter fault made late: (due fabric time, vector).
    pub late_irqs: Vec<(u64, u32)>,
    /// UD QPs attached to multicast groups.
    pub mcast: Vec<crate::mcast::Attachment>,
    /// The fabric has this port's link down (a fault): the port is DOWN until it returns.
    pub link_down: bool,
    /// QPs that entered ERR, each once (kept until a receive doorbell finds one reset or
    /// destroyed): the only QPs a receive doorbell acts on.
    pub qps_in_error: Vec<u32>,
    /// What a receive doorbell reads before it takes the lock; shared with `Shared`.
    pub recv_doorbells: Arc<RecvDoorbells>,
    /// PortInfo:CapabilityMask as the driver set it (SET_PORT_CAP); shared with the port's
    /// sink, which the SA asks without taking the device lock.
    pub port_caps: Arc<AtomicU32>,
    /// Host bytes that every QP's WRs in flight hold (each QP's `InFlight` keeps it).
    pub held: Arc<AtomicUsize>,
    /// QPs whose send queues wait for `held` to fall below `MAX_IN_FLIGHT_BYTES`, each once
    /// (`Qp::mem_waits`); the end of a turn that finds it so wakes them.
    pub mem_waiters: Vec<u32>,
    /// The bound on `held` (default [`MAX_IN_FLIGHT_BYTES`]; [`Hca::set_in_flight_budget`]).
    pub in_flight_budget: usize,
    /// Gather lists of completed messages, for the next ones.
    pub gathers: crate::packet::GatherPool,
    /// QPs that owe a READ's response still to be made, each once, served in turn by the
    /// device's further turns (see answers.rs).
    pub answering: std::collections::VecDeque<u32>,
    /// The port's P_Keys, as the subnet manager set them.
    pub pkeys: crate::partition::PKeyTable,
    /// The port's state past INIT, its SM and M_Key, as the subnet manager set them
    /// (see sma.rs).
    pub mgmt: crate::sma::PortMgmt,
    /// The scratch state of the turn under way (see turn.rs).
    pub turn: Turn,
    /// A catastrophic error's syndrome (`CATAS_*`; 0: none): see catas.rs.
    pub catas: u32,
}

impl HcaState {
    pub(crate) fn new(mem: Arc<dyn DmaSpace>, bar2: Arc<DeviceMemory>, node_guid: u64) -> Self {
        Self {
            dev: Device::new(mem, bar2, node_guid),
            qps: Table::next_fit(MAX_QP, 2),
            live_qps: Vec::new(),
            sq_hints: vec![SqHint::Look; MAX_QP as usize],
            sq_rings: Default::default(),
        }
    }

    /// The device holds less than its bound again: the send queues that waited for it
    /// look again (in the next turn; each that finds it spent waits again).
    #[cold]
    fn wake_mem_waiters(&mut self) {
        for qpn in std::mem::take(&mut self.dev.mem_waiters) {
            if let Some(qp) = self.qps.get_mut(qpn) {
                if std::mem::take(&mut qp.mem_waits) {
                    qp.sq_waits = false;
                }
            }
            if let Some(h) = self.sq_hints.get_mut(qpn as usize) {
                *h = SqHint::Look;
            }
        }
        self.dev.turn.more_work = true;
    }

    fn doorbell(&mut self, class: u32) {
        if let Some((hook, now)) = self.dev.adapter_hook() {
            if !hook.doorbell(self.dev.lid, class, now) {
                return;
            }
        }
        self.dev.stats.doorbells += 1;
        match class {
            DB_CMD => self.run_command(),
            DB_SQ => self.send_doorbell(),
            DB_RQ => self.scan_recv_queues(),
            DB_CQ_ARM => self.dev.scan_cq_arms(),
            _ => {} // Unknown classes are ignored: ivshmem lets the guest ring any vector.
        }
    }
}

impl Device {
    fn new(mem: Arc<dyn DmaSpace>, bar2: Arc<DeviceMemory>, node_guid: u64) -> Self {
        let st = Self {
            mem,
            bar2,
            fabric: None,
            lid: 0,
            node_guid,
            pds: Table::new(MAX_PD, 1),
            mrs: Table::new(MAX_MR, 1),
            mr_tags: vec![1; MAX_MR as usize],
            mr_pages: 0,
            cqs: Table::new(MAX_CQ, 1),
            live_cqs: Vec::new(),
            srqs: Table::new(MAX_SRQ, 1),
            eqs: Default::default(),
            last_cmd_seq: 0,
            doorbell_peer: 0,
            stats: HcaStats::default(),
            timer_hint: crate::reliability::NEVER,
            transport_lag: Arc::default(),
            late_irqs: Vec::new(),
            mcast: Vec::new(),
            link_down: false,
            port_caps: Arc::default(),
            held: Arc::default(),
            mem_waiters: Vec::new(),
            in_flight_budget: MAX_IN_FLIGHT_BYTES,
            qps_in_error: Vec::new(),
            recv_doorbells: Arc::default(),
            gathers: Default::default(),
            answering: Default::default(),
            pkeys: crate::partition::default_table(),
            mgmt: crate::sma::PortMgmt::default(),
            turn: Turn::default(),
            catas: 0,
        };
        st.bar2.zero(0, BAR2_SIZE);
        st.publish_info();
        st
    }

    /// (Re)writes the BAR2 header from the device's own state.
    pub fn publish_info(&self) {
        let info = HcaDevInfo {
            signature: SIGNATURE,
            abi_version: ABI_VERSION,
            lid: self.lid,
            port_state: self.port_state() as u8,
            num_vectors: NUM_VECTORS as u8,
            caps: CAP_RC
                | CAP_UD
                | CAP_RDMA_READ
                | CAP_ATOMIC
                | CAP_MASKED_ATOMIC
                | CAP_LOCAL_DMA_LKEY
                | CAP_SRQ
                | CAP_UAR
                | CAP_SQ_RING
                | CAP_MW_UC
                | CAP_RESET,
            node_guid: self.node_guid,
            mailbox_offset: BAR2_MAILBOX_OFFSET,
            eq_offset: BAR2_EQ_OFFSET,
            eq_db_offset: BAR2_EQ_DB_OFFSET,
            qp_db_offset: BAR2_QP_DB_OFFSET,
            cq_db_offset: BAR2_CQ_DB_OFFSET,
            eq_log_entries: EQ_LOG_ENTRIES,
            doorbell_peer: self.doorbell_peer,
            srq_db_offset: BAR2_SRQ_DB_OFFSET,
            catas_syndrome: self.catas,
            rsvd0: 0,
            rsvd: [0; 2],
        };
        self.bar2.write_obj(BAR2_INFO_OFFSET, &info);
    }

    pub fn port_state(&self) -> u32 {
        if self.fabric.is_some() && !self.link_down && self.catas == 0 {
            self.mgmt.state
        } else {
            PORT_DOWN
        }
    }

    /// Hands a packet to the fabric (queued; it moves after the lock is dropped).
    pub fn transmit(&mut self, mut pkt: Packet) {
        let Some(f) = &self.fabric else {
            self.turn.stranded.push(pkt.clone_header());
            return;
        };
        pkt.slid = self.lid;
        let n = u64::from(pkt.count.max(1));
        let len = u64::from(pkt.payload.len());
        self.stats.packets_out += n;
        self.stats.mcast_out += n * u64::from(pkt.is_multicast());
        self.stats.bytes_out += len;
        self.stats.wire_out += pkt.header_bytes() + len;
        if self.turn.cut {
            self.turn.outbox.push_back(pkt);
        } else {
            f.enqueue(pkt);
        }
    }

    /// Queues what the turn kept to move itself (in order), as `transmit` would have; the
    /// outbox keeps its room for the next turn, up to [`OUTBOX_KEEP`] packets (a turn that
    /// sent the pieces of many long messages gives back the rest).
    fn queue_outbox(&mut self) {
        while let Some(pkt) = self.turn.outbox.pop_front() {
            match &self.fabric {
                Some(f) => f.enqueue(pkt),
                None => self.turn.stranded.push(pkt.clone_header()),
            }
        }
        if self.turn.outbox.capacity() > OUTBOX_KEEP {
            self.turn.outbox.shrink_to(OUTBOX_KEEP);
        }
    }

    /// Sends a message's train in pieces of about [`PIECE_BYTES`]: the fabric moves, and the
    /// peer takes, one piece at a time, so no message holds them for its whole length.
    /// Inline: the usual train is one piece, and a packet passed on by value through
    /// another call is one more copy of it.
    #[inline]
    pub fn transmit_train(&mut self, train: Packet) {
        let max = (PIECE_BYTES / train.mtu.max(1)).max(1);
        if train.count <= max {
            return self.transmit(train); // one piece: the usual case, without a Vec
        }
        self.transmit_pieces(train, max);
    }

    #[inline(never)]
    fn transmit_pieces(&mut self, train: Packet, max: u32) {
        for piece in train.chunks(max) {
            self.transmit(piece);
        }
    }

    /// Fabric time (ns); 0 off a fabric.
    pub(crate) fn now(&self) -> u64 {
        self.fabric.as_ref().map_or(0, |f| f.now_ns())
    }

    /// The fabric's stalls for this port so far: its transport time is fabric time less this.
    pub(crate) fn transport_lag(&self) -> u64 {
        self.transport_lag.load(Ordering::Relaxed)
    }

    /// The port's transport time, which QP timers run on (ns; 0 off a fabric).
    pub(crate) fn transport_now(&self) -> u64 {
        self.now().saturating_sub(self.transport_lag())
    }

    /// Transport time to start a timer from, where reading the clock is cheap (a manual
    /// clock; 0 off a fabric); None on a real clock: the timer starts at the next tick (see
    /// [`Fabric::now_ns_if_cheap`]).
    pub(crate) fn timer_start(&self) -> Option<u64> {
        self.fabric.as_ref().map_or(Some(0), |f| {
            f.now_ns_if_cheap()
                .map(|t| t.saturating_sub(self.transport_lag()))
        })
    }

    /// The fabric's adapter-fault hook and clock, when the port is on a fabric that has one.
    /// Asked at every WQE and CQE, nearly always to find none: inline, that is a load.
    #[inline]
    pub fn adapter_hook(&self) -> Option<(Arc<dyn AdapterHook>, u64)> {
        let f = self.fabric.as_ref()?;
        if !f.has_adapter_hook() {
            return None;
        }
        self.attached_hook(f)
    }

    #[inline(never)]
    fn attached_hook(&self, f: &Fabric) -> Option<(Arc<dyn AdapterHook>, u64)> {
        Some((f.adapter_hook()?, f.now_ns()))
    }

    /// Which of the `irqs` go out now; late ones are queued for the timer.
    fn judge_irqs(&mut self, irqs: u32) -> u32 {
        let Some((hook, now)) = self.adapter_hook() else {
            return irqs;
        };
        let mut out = 0;
        for v in (0..NUM_VECTORS).filter(|v| irqs & (1 << v) != 0) {
            match hook.interrupt(self.lid, v, now) {
                IrqFate::Deliver => out |= 1 << v,
                IrqFate::Lose => {}
                IrqFate::Late(ns) => {
                    let due = now.saturating_add(ns);
                    self.late_irqs.push((due, v));
                    self.timer_hint = self.timer_hint.min(due);
                }
            }
        }
        out
    }

    /// Raises the late interrupts that are due.
    pub(crate) fn release_late_irqs(&mut self, now: u64) {
        let mut keep = Vec::new();
        for (due, v) in std::mem::take(&mut self.late_irqs) {
            if due <= now {
                self.turn.late_due |= 1 << v;
            } else {
                self.timer_hint = self.timer_hint.min(due);
                keep.push((due, v));
            }
        }
        self.late_irqs = keep;
    }
}

/// The longest piece of a message the fabric moves as one item (see `transmit_train`).
pub(crate) const PIECE_BYTES: u32 = 1 << 20;

/// Packets a device's turn keeps room for in its outbox between turns (32 KiB).
const OUTBOX_KEEP: usize = 256;

/// What a receive doorbell needs to know before it takes the device lock, kept where it
/// can be read without it. Only QPs in ERR act on receive doorbells (they flush the new
/// receives; other QPs take receives as messages arrive), and an adapter hook may lose or
/// log any doorbell: with neither, a receive doorbell is counted and has nothing to do.
/// A guest posts a receive per message, so this spares every message a turn of the lock.
#[derive(Default)]
pub(crate) struct RecvDoorbells {
    /// Set when a QP enters ERR (before its queues are flushed); cleared by a receive
    /// doorbell's visit that finds no QP left in ERR.
    qps_in_error: AtomicBool,
    /// The port's fabric has an adapter hook (`PacketSink::adapter_hook_changed`).
    hooked: AtomicBool,
    /// Receive doorbells counted here, not in `HcaStats::doorbells` under the lock.
    quiet: AtomicU64,
}

impl RecvDoorbells {
    /// A QP enters ERR: call it before its receive queue's producer index is read.
    pub(crate) fn qp_entered_error(&self) {
        self.qps_in_error.store(true, Ordering::Relaxed);
        // Pairs with the fence in `idle`: the guest wrote its producer index before it
        // rang, so either that doorbell sees the flag or this QP's flush sees the receive.
        fence(Ordering::SeqCst);
    }

    /// No QP is in ERR any more (under the device lock, as every `qp_entered_error`).
    pub(crate) fn no_qp_in_error(&self) {
        self.qps_in_error.store(false, Ordering::Relaxed);
    }

    /// Whether a receive doorbell has nothing to do; if so it is counted here.
    fn idle(&self) -> bool {
        if self.hooked.load(Ordering::Acquire) {
            return false;
        }
        fence(Ordering::SeqCst);
        if self.qps_in_error.load(Ordering::Relaxed) {
            return false;
        }
        self.quiet.fetch_add(1, Ordering::Relaxed);
        true
    }
}

struct Shared {
    state: Mutex<HcaState>,
    recv_doorbells: Arc<RecvDoorbells>,
    /// HcaState::timer_hint as of the last unlock, so that ticks skip the lock when idle.
    timer_hint: AtomicU64,
    bar2: Arc<DeviceMemory>,
    irq: Arc<dyn InterruptSink>,
    /// The port's GUID (the node GUID: one port), fixed for the device's life.
    guid: u64,
    /// HcaState::port_caps.
    port_caps: Arc<AtomicU32>,
    /// Device::transport_lag, which ticks add the fabric's stalls to.
    transport_lag: Arc<AtomicU64>,
    /// The fabric the port was first attached to, for the pump a turn runs once it has let
    /// go of the device lock: read here without a lock or a clone of the fabric's handle,
    /// whose count every device's turn would change (a cache line the cores of all guests
    /// would pass around). A port later on another fabric clones its handle to pump.
    first_fabric: OnceLock<Fabric>,
}

/// What a turn pumps once it has let go of the device lock.
enum Pump {
    No,
    /// [`Shared::first_fabric`], the one the port is on.
    First,
    Other(Fabric),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HcaState> {
        // A panic while holding the lock is a device bug; keep serving the other QPs.
        self.state.lock_unpoisoned()
    }

    /// Runs `f` under the lock, then raises interrupts and moves packets with it released.
    /// Send queues that had more work than one turn allows go on in further turns, the
    /// lock let go between them (so that packets for this device get in, and its own packets
    /// move, while a guest's long queue is worked through).
    fn with_state<R>(&self, f: impl FnOnce(&mut HcaState) -> R) -> R {
        let (r, mut more) = self.turn(self.lock(), f);
        while more && !self.defer_turns() {
            more = self.turn(self.lock(), HcaState::continue_work).1;
        }
        r
    }

    /// Whether the further turns of a turn that left work wait for the pump this thread
    /// is in: nothing between them would move what they queue (see `Fabric::defer_turns`).
    #[cold]
    fn defer_turns(&self) -> bool {
        let st = self.lock();
        let lid = st.dev.lid;
        st.dev.fabric.as_ref().is_some_and(|f| f.defer_turns(lid))
    }

    /// Like `with_state` for one turn, unless another thread holds the device: then None
    /// at once (the fabric's timer never waits for a busy device; its timers run at the
    /// next tick).
    fn try_with_state<R>(&self, f: impl FnOnce(&mut HcaState) -> R) -> Option<R> {
        let st = self.state.try_lock_unpoisoned()?;
        Some(self.turn(st, f).0)
    }

    /// One turn: `f` with a fresh work budget, then interrupts raised and packets moved with
    /// the lock released. Also says whether a send queue has work left for another turn.
    fn turn<R>(
        &self,
        mut st: MutexGuard<'_, HcaState>,
        f: impl FnOnce(&mut HcaState) -> R,
    ) -> (R, bool) {
        let mut resume = Vec::new();
        let (r, irqs, pump, lid, more) = {
            st.dev.turn.work_left = WORK_PER_TURN;
            st.dev.turn.pieces_left = READ_PIECES_PER_TURN;
            st.dev.turn.cut = st.dev.fabric.as_ref().is_some_and(Fabric::may_cut);
            let r = f(&mut st);
            if !st.dev.mem_waiters.is_empty()
                && st.dev.held.load(Ordering::Relaxed) < st.dev.in_flight_budget
            {
                st.wake_mem_waiters();
            }
            // Any turn but a delivery with more behind it ends a burst: its ACKs go now.
            if !std::mem::take(&mut st.dev.turn.hold_acks) && !st.dev.turn.held_acks.is_empty() {
                st.send_held_acks();
            }
            if st.dev.turn.cut {
                self.cut_through(&mut st, &mut resume);
            }
            while !st.dev.turn.stranded.is_empty() {
                for pkt in std::mem::take(&mut st.dev.turn.stranded) {
                    st.bounced(pkt, DropReason::NoRoute);
                }
            }
            let irqs = std::mem::take(&mut st.dev.turn.pending_irqs);
            let irqs = if irqs != 0 {
                st.dev.judge_irqs(irqs)
            } else {
                0
            };
            let irqs = irqs | std::mem::take(&mut st.dev.turn.late_due);
            st.dev.stats.interrupts += u64::from(irqs.count_ones());
            // Work left over (send queues, READ responses to make) is due at once: the next
            // tick goes on with it if no caller does. So is a send queue waiting for memory:
            // what a UC copy or a peer's READ response held may be freed on another thread,
            // which wakes no one here.
            let hint = if st.dev.turn.more_work || !st.dev.mem_waiters.is_empty() {
                0
            } else {
                st.dev.timer_hint
            };
            self.timer_hint.store(hint, Ordering::Relaxed);
            let pump = match st.dev.fabric.as_ref() {
                Some(f) if f.has_work_for_this_thread() => match self.first_fabric.get() {
                    Some(first) if first.same(f) => Pump::First,
                    _ => Pump::Other(f.clone()),
                },
                _ => Pump::No,
            };
            (r, irqs, pump, st.dev.lid, st.dev.turn.more_work)
        };
        drop(st);
        // The vectors to raise, lowest first (most turns raise none).
        let mut irqs = irqs & ((1 << NUM_VECTORS) - 1);
        while irqs != 0 {
            self.irq.raise(irqs.trailing_zeros());
            irqs &= irqs - 1;
        }
        match pump {
            Pump::No => {}
            Pump::First => {
                if let Some(f) = self.first_fabric.get() {
                    f.pump_with_backpressure(lid);
                }
            }
            Pump::Other(f) => f.pump_with_backpressure(lid),
        }
        for port in resume {
            port.resume();
        }
        (r, more)
    }

    /// The end of a turn that kept what it sent (see `fabric/cut.rs`): each run of packets
    /// for one port goes to that port now if it can, else to the queue; an answer that
    /// comes straight back (an ACK) is taken in this turn, and what taking it sends (WRs
    /// a full send window held, say) goes in the next round. Ports whose turns left work
    /// go in `resume`, to go on once this device's lock is let go. The turn stops keeping
    /// what it sends here, and what is left is queued.
    fn cut_through(&self, st: &mut HcaState, resume: &mut Vec<Arc<dyn PacketSink>>) {
        // Held to the end: what is left is queued while the cut still stands.
        let mut cut = match (self.first_fabric.get(), st.dev.fabric.as_ref()) {
            (Some(first), Some(f)) if first.same(f) => first.begin_cut(st.dev.lid),
            _ => None,
        };
        if let Some(cut) = cut.as_mut() {
            let lid = st.dev.lid;
            for _ in 0..CUT_ROUNDS {
                if st.dev.turn.outbox.is_empty() {
                    break;
                }
                let mut out = std::mem::take(&mut st.dev.turn.outbox);
                cut.send(lid, &mut out, &mut st.dev.turn.port_note, resume);
                if st.dev.turn.outbox.is_empty() {
                    st.dev.turn.outbox = out; // (emptied: kept for its capacity)
                }
                let Some(pkt) = cut.returned() else {
                    break;
                };
                st.dev.turn.hold_acks = false;
                cut.took(st.receive(pkt));
            }
        }
        st.dev.turn.cut = false;
        st.dev.queue_outbox();
    }
}

/// Rounds of a turn's cut-through: what it sent goes, and what comes straight back is
/// taken, this many times at most; then the rest is queued (two ports answering each
/// other end their exchange in the pump, a turn each).
const CUT_ROUNDS: usize = 4;

impl PacketSink for Shared {
    fn deliver(&self, pkt: Packet) -> Result<(), Rejected> {
        self.with_state(|st| st.receive(pkt))
    }

    fn deliver_in_burst(&self, pkt: Packet, more: bool) -> Result<(), Rejected> {
        self.with_state(|st| {
            st.dev.turn.hold_acks = more;
            st.receive(pkt)
        })
    }

    /// One turn for the whole burst: its ACKs are held until its last packet (or past it,
    /// with `more`), as when delivered one by one.
    fn deliver_burst(&self, pkts: Vec<Packet>, more: bool) -> Vec<Rejected> {
        let n = pkts.len();
        let mut rejected = Vec::new();
        self.with_state(|st| {
            for (i, pkt) in pkts.into_iter().enumerate() {
                st.dev.turn.hold_acks = more || i + 1 < n;
                if let Err(r) = st.receive(pkt) {
                    rejected.push(r);
                }
            }
        });
        rejected
    }

    fn try_deliver_run(&self, run: &mut crate::fabric::Run<'_>) -> Option<(Vec<Rejected>, bool)> {
        let st = self.state.try_lock_unpoisoned()?;
        let mut rejected = Vec::new();
        let ((), more) = self.turn(st, |st| {
            for (pkt, more) in run {
                st.dev.turn.hold_acks = more;
                if let Err(r) = st.receive(pkt) {
                    rejected.push(r);
                }
            }
        });
        Some((rejected, more))
    }

    fn resume(&self) {
        self.with_state(HcaState::continue_work);
    }

    fn undeliverable(&self, pkt: Packet, why: DropReason) {
        self.with_state(|st| st.bounced(pkt, why))
    }

    fn tick(&self, now_ns: u64, stalled_ns: u64) {
        if stalled_ns != 0 {
            self.transport_lag.fetch_add(stalled_ns, Ordering::Relaxed);
        }
        if now_ns >= self.timer_hint.load(Ordering::Relaxed) {
            self.try_with_state(|st| {
                st.on_timer(now_ns);
                st.continue_work();
            });
        }
    }

    fn port_guid(&self) -> Option<u64> {
        Some(self.guid)
    }

    fn capability_mask(&self) -> u32 {
        self.port_caps.load(Ordering::Relaxed)
    }

    /// As QUERY_COUNTERS gives them to the guest (named by [`COUNTER_NAMES`]).
    fn counters(&self) -> Option<[u64; COUNTERS_LEN as usize]> {
        let st = self.lock();
        Some(std::array::from_fn(|i| st.dev.counter(i as u32)))
    }

    fn pkeys_changed(&self, table: &crate::partition::PKeyTable) {
        self.with_state(|st| {
            if st.dev.pkeys != *table {
                st.dev.pkeys = *table;
                st.dev.post_event(VEC_ASYNC, EV_PKEY_CHANGE, 1, 0);
            }
        });
    }

    fn adapter_hook_changed(&self, attached: bool) {
        self.recv_doorbells
            .hooked
            .store(attached, Ordering::Release);
    }

    fn adapter_fault(&self, fault: AdapterFault) -> Option<bool> {
        Some(self.with_state(|st| match fault {
            AdapterFault::Fatal => {
                let first = st.dev.catas == 0;
                st.catastrophic(CATAS_INJECTED);
                first
            }
            AdapterFault::Reset => st.reset_underneath(),
        }))
    }

    fn link_changed(&self, up: bool) {
        self.with_state(|st| {
            if st.dev.link_down != up || st.dev.fabric.is_none() {
                return;
            }
            st.dev.link_down = !up;
            st.dev.stats.link_downs += u64::from(!up);
            // Under a user's SM a link that comes back waits in INIT for it.
            let guest_sm = st.dev.fabric.as_ref().is_some_and(|f| f.guest_sm());
            if up && guest_sm {
                st.dev.mgmt.state = PORT_INIT;
            }
            st.dev.publish_info();
            if !up || st.dev.mgmt.state == PORT_ACTIVE {
                let ev = if up { EV_PORT_ACTIVE } else { EV_PORT_DOWN };
                st.dev.post_event(VEC_ASYNC, ev, 1, 0);
            }
        })
    }
}

/// One emulated HCA with one port. Cheap to clone; clones are the same device.
#[derive(Clone)]
pub struct Hca {
    shared: Arc<Shared>,
}

impl Hca {
    /// An HCA doing DMA into `mem`, with `bar2` as its device memory. Its port stays DOWN
    /// until [`Hca::attach`].
    pub fn new<M>(mem: M, bar2: DeviceMemory, irq: Arc<dyn InterruptSink>, node_guid: u64) -> Self
    where
        M: GuestMemory<Bitmap = ()> + Send + Sync + 'static,
    {
        Self::with_dma(Arc::new(GuestRam::new(mem)), bar2, irq, node_guid)
    }

    /// Like [`Hca::new`] for a host that already has its memory as a [`DmaSpace`].
    pub fn with_dma(
        mem: Arc<dyn DmaSpace>,
        bar2: DeviceMemory,
        irq: Arc<dyn InterruptSink>,
        node_guid: u64,
    ) -> Self {
        let bar2 = Arc::new(bar2);
        let state = HcaState::new(mem, bar2.clone(), node_guid);
        let port_caps = state.dev.port_caps.clone();
        let recv_doorbells = state.dev.recv_doorbells.clone();
        let transport_lag = state.dev.transport_lag.clone();
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                recv_doorbells,
                timer_hint: AtomicU64::new(crate::reliability::NEVER),
                bar2,
                irq,
                guid: node_guid,
                port_caps,
                transport_lag,
                first_fabric: OnceLock::new(),
            }),
        }
    }

    /// Connects the port to `fabric`, which assigns its LID; the port goes ACTIVE and the
    /// guest gets an EV_PORT_ACTIVE event.
    pub fn attach(&self, fabric: &Fabric) -> Lid {
        let lid = fabric.attach(self.sink());
        self.port_up(fabric, lid);
        lid
    }

    /// Like [`Hca::attach`] at a chosen LID: a restarted node's new HCA takes its old LID.
    pub fn attach_at(&self, fabric: &Fabric, lid: Lid) -> Result<(), LidTaken> {
        fabric.attach_at(lid, self.sink())?;
        self.port_up(fabric, lid);
        Ok(())
    }

    fn sink(&self) -> Weak<dyn PacketSink> {
        let strong: Arc<dyn PacketSink> = self.shared.clone();
        Arc::downgrade(&strong)
    }

    fn port_up(&self, fabric: &Fabric, lid: Lid) {
        // (Set once: a port moved to another fabric pumps with a clone of its handle.)
        let _ = self.shared.first_fabric.set(fabric.clone());
        self.shared.with_state(|st| {
            st.dev.fabric = Some(fabric.clone());
            st.dev.lid = lid;
            // A user's SM in a guest brings the port up from INIT; the fabric's own has it
            // ACTIVE at once.
            st.dev.mgmt = if fabric.guest_sm() {
                crate::sma::PortMgmt::waiting()
            } else {
                crate::sma::PortMgmt::by_fabric(crate::sa::SM_LID)
            };
            st.dev.publish_info();
            if st.dev.mgmt.state == PORT_ACTIVE {
                st.dev.post_event(VEC_ASYNC, EV_PORT_ACTIVE, 1, 0);
            }
        });
    }

    /// Takes the port off its fabric (a node going away); peers' packets to it then fail.
    pub fn detach(&self) {
        self.shared.with_state(|st| {
            if let Some(f) = st.dev.fabric.take() {
                f.detach(st.dev.lid);
                st.dev.publish_info();
                st.dev.post_event(VEC_ASYNC, EV_PORT_DOWN, 1, 0);
            }
        });
    }

    /// Tells the guest (through BAR2) which peer id its doorbell writes must name.
    /// The host memory this device may hold for its guest's requests in flight (every WR's
    /// share, payload copies, gather records): at it, every send queue waits for
    /// completions. [`MAX_IN_FLIGHT_BYTES`] unless set; at least [`MIN_IN_FLIGHT_BYTES`].
    pub fn set_in_flight_budget(&self, bytes: usize) {
        self.shared
            .with_state(|st| st.dev.in_flight_budget = bytes.max(MIN_IN_FLIGHT_BYTES));
    }

    /// The QPN the device hands out next (if free; else the next free one after it).
    pub fn next_qpn(&self) -> u32 {
        self.shared.with_state(|st| st.qps.cursor().unwrap_or(0))
    }

    /// The device hands out QPNs from `qpn` on: what a fresh device in a slot whose last
    /// device got that far continues from, as a reset device does (see
    /// `HcaState::reset_function`).
    pub fn continue_qpns_from(&self, qpn: u32) {
        self.shared.with_state(|st| st.qps.set_cursor(qpn));
    }

    /// Sets the device's ivshmem peer id, shown to the driver in BAR2's [`crate::abi::HcaDevInfo`].
    pub fn set_doorbell_peer(&self, peer: u32) {
        self.shared.with_state(|st| {
            st.dev.doorbell_peer = peer;
            st.dev.publish_info();
        });
    }

    /// The doorbell: the guest wrote `class` (the vector field of an ivshmem doorbell write).
    pub fn doorbell(&self, class: u32) {
        let class = class & 0xff;
        if class == DB_RQ && self.shared.recv_doorbells.idle() {
            return;
        }
        self.shared.with_state(|st| st.doorbell(class));
    }

    /// The device memory the host maps as the guest's BAR2.
    pub fn bar2(&self) -> &DeviceMemory {
        &self.shared.bar2
    }

    /// The adapter dies (`hcabench fault NODE fatal`): a catastrophic error, as catas.rs
    /// describes. False if it was in one already.
    pub fn inject_catastrophic(&self) -> bool {
        self.shared.adapter_fault(AdapterFault::Fatal) == Some(true)
    }

    /// The function is reset underneath its driver (`hcabench fault NODE reset`), as
    /// catas.rs describes. False if it was in a catastrophic error already.
    pub fn inject_reset(&self) -> bool {
        self.shared.adapter_fault(AdapterFault::Reset) == Some(true)
    }

    /// The syndrome of the device's catastrophic error (0: none).
    pub fn catastrophic_syndrome(&self) -> u32 {
        self.shared.lock().dev.catas
    }

    /// The port's LID (0 while it is on no fabric).
    pub fn lid(&self) -> Lid {
        self.shared.lock().dev.lid
    }

    /// The device's counters so far.
    pub fn stats(&self) -> HcaStats {
        let mut stats = self.shared.lock().dev.stats;
        stats.doorbells += self.shared.recv_doorbells.quiet.load(Ordering::Relaxed);
        stats
    }

    /// What the device holds for its guest's WRs in flight now: (WRs sent and not yet
    /// completed, host bytes their requests keep), the latter bounded by its budget
    /// ([`MAX_IN_FLIGHT_BYTES`] unless set) plus one WR.
    pub fn in_flight(&self) -> (usize, usize) {
        let st = self.shared.lock();
        let wrs = st
            .live_qps
            .iter()
            .filter_map(|&q| st.qps.get(q))
            .map(|q| q.pending.len())
            .sum();
        (wrs, st.dev.held.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    #[test]
    fn test_a_turns_outbox_gives_back_the_room_a_long_burst_took() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let bar2 = Arc::new(DeviceMemory::new().unwrap());
        let mut st = HcaState::new(Arc::new(GuestRam::new(mem)), bar2, 1);
        // The pieces of several long messages sent in one turn.
        for _ in 0..8192 {
            st.dev.turn.outbox.push_back(Packet::default());
        }
        st.dev.queue_outbox();
        assert!(st.dev.turn.outbox.is_empty());
        assert!(st.dev.turn.outbox.capacity() <= OUTBOX_KEEP);
        // Off a fabric, what it held bounces (stranded), in order.
        assert_eq!(st.dev.turn.stranded.len(), 8192);
        // A turn that sends a few keeps its room.
        for _ in 0..10 {
            st.dev.turn.outbox.push_back(Packet::default());
        }
        st.dev.queue_outbox();
        assert!(st.dev.turn.outbox.capacity() >= 10);
    }
}
