//! A device's turn: one pass of work under the HCA's lock (a doorbell, a delivery, a tick),
//! and the scratch state it keeps until it lets go of the lock. `Device` holds one [`Turn`];
//! `Shared::turn` (hca.rs) starts it, and at its end sends held ACKs, moves what it kept to
//! send itself (the cut-through), bounces what had no fabric and raises the interrupts it
//! collected.
//!
//! Nothing here outlives a turn but buffers kept for their capacity and the cut-through's
//! note of the last port it went to; the device's lasting state (resource tables, timers,
//! counters) stays in `Device`.

use std::collections::VecDeque;

use crate::fabric::PortNote;
use crate::packet::Packet;

/// How much one turn under the device lock may do: WQEs executed, page-list entries read
/// (a fast registration), gather records made (a message over a repeated-page MR). A guest
/// with more queued waits for the next turn, so no single doorbell holds the device for long
/// (16K fast registrations of 1M pages each, say).
pub(crate) const WORK_PER_TURN: u64 = 1 << 16;

/// The per-turn scratch state of a device (see the module's doc).
pub(crate) struct Turn {
    /// Work units left in this turn (a WQE, a page-list entry read, a gather record made);
    /// see [`WORK_PER_TURN`].
    pub work_left: u64,
    /// A send queue stopped for want of budget, or QPs owe READ responses still to be
    /// made: more turns follow.
    pub more_work: bool,
    /// Pieces of READ responses this turn may still make (see answers.rs); the QPs that
    /// owe more go on in further turns.
    pub pieces_left: u32,
    /// This turn delivers a packet with more of its stream (the same sender QP to the same
    /// QP) queued right behind it: the responder holds its ACKs (each QP's latest in `Qp::held_ack`), and the turn that
    /// ends the burst sends them, one per QP for all its messages.
    pub hold_acks: bool,
    /// QPs holding an ACK, each once.
    pub held_acks: Vec<u32>,
    /// This turn keeps what it sends in `outbox`, and moves it itself at its end (see
    /// `fabric/cut.rs`).
    pub cut: bool,
    /// What this turn sent while `cut`, in order.
    pub outbox: VecDeque<Packet>,
    /// The port this one's cut-throughs went to last.
    pub port_note: PortNote,
    /// Vectors to raise once the lock is dropped.
    pub pending_irqs: u32,
    /// Late interrupts now due: raised without being judged again.
    pub late_due: u32,
    /// Packets sent while the port had no fabric; they bounce once the current work is done,
    /// as they would from a fabric with no route.
    pub stranded: Vec<Packet>,
}

impl Default for Turn {
    fn default() -> Self {
        Self {
            work_left: WORK_PER_TURN,
            more_work: false,
            pieces_left: crate::answers::READ_PIECES_PER_TURN,
            hold_acks: false,
            held_acks: Vec::new(),
            cut: false,
            outbox: VecDeque::new(),
            port_note: PortNote::default(),
            pending_irqs: 0,
            late_due: 0,
            stranded: Vec::new(),
        }
    }
}
