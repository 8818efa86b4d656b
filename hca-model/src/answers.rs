//! The responder's answers, in order: what an RC QP owes its requester for the requests it
//! took (READ responses, ACKs and NAKs, atomics' original values), sent in PSN order as
//! IBA has them. An answer goes out at once unless an earlier one is still being made: a
//! READ's response longer than what one turn makes of it, which every answer after it
//! waits behind (an ACK past a READ whose response has not all arrived tells the requester
//! that the rest was lost).
//!
//! A READ's response is made a piece ([`PIECE_BYTES`], 1 MiB) at a time, and each piece's
//! bytes are resolved only as the piece is made, its key checked again then: a READ owed
//! holds its RETH (an [`Answer`] of 40 bytes), not a record per page of the range it names
//! (2 GiB over pages of 4 KiB is 8 MiB of records, which the whole response made at once
//! held, and as many again in its pieces in the fabric's queue). A turn makes at most
//! [`READ_PIECES_PER_TURN`] pieces; the QPs that owe more (`Device::answering`) go on in
//! the device's further turns, a piece each in turn. No piece is made while the port is
//! past its backlog bound in the fabric (`fabric::MAX_BACKLOG`), and the further turns
//! wait for the fabric then, as a send queue's do (`Fabric::pump_with_backpressure`;
//! inside a pump, until the pump has moved what it could: `Fabric::defer_turns`). So READ
//! responses hold at most what the port's queued packets may hold, and one turn's pieces,
//! whatever the number of READs owed; a QP owes at most [`MAX_ANSWERS`].
//!
//! A duplicate READ (the requester asks again from a PSN: a response was lost, or its
//! timer ran out) whose response is still owed rewinds it to that PSN; one whose response
//! was made whole is answered again, behind what is owed. A piece whose key no longer
//! resolves (its MR deregistered, invalidated or re-mapped since the READ came) ends the
//! READ with a remote access NAK, as a duplicate READ of a key gone is answered, and the
//! QP's state stays as it is (the request was good when it came). What a QP owes goes out
//! whatever state it enters next (a NAK that moved it to ERR goes out behind what it
//! owed); RESET, destroying it, a catastrophic error, or an answer bounced by the fabric
//! (its requester QP is gone) drops it.

use std::collections::VecDeque;

use crate::fabric::DropReason;
use crate::hca::{HcaState, PIECE_BYTES};
use crate::mr::{KeyCheck, Use};
use crate::packet::*;
use crate::qp::QpEngine;

/// Pieces of READ responses one turn of a device makes at most: 16 MiB of data, whose
/// records are at most 4 KiB a piece (a record per 4 KiB page).
pub(crate) const READ_PIECES_PER_TURN: u32 = 16;

/// The most answers one QP may owe; one more is dropped, as if lost on the way (its
/// requester asks again). A requester has at most 255 READs and atomics outstanding on a
/// QP (`max_rd_atomic` is a byte), each with at most an ACK behind it (ACKs owed one after
/// another are one) and a duplicate answered again: far fewer.
pub(crate) const MAX_ANSWERS: usize = 1024;

/// Room a QP's queue of answers keeps once it owes nothing.
const KEEP: usize = 8;

/// What a responder QP owes its requester, oldest first (see the module's doc).
#[derive(Default)]
pub(crate) struct Answers {
    owed: VecDeque<Answer>,
    /// The QP is in `Device::answering`.
    listed: bool,
}

impl Answers {
    /// Whether it owes nothing.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.owed.is_empty()
    }

    /// Answers owed.
    pub fn len(&self) -> usize {
        self.owed.len()
    }

    /// Drops every answer owed, and the queue's room.
    pub fn clear(&mut self) {
        self.owed = VecDeque::new();
    }
}

/// One answer owed.
#[derive(Clone, Copy)]
enum Answer {
    /// A READ's response, from its packet `next` on.
    Read(ReadAnswer),
    /// An ACK or NAK: its AETH syndrome, the PSN it names, the MSN then.
    Aeth { syndrome: u8, psn: u32, msn: u32 },
    /// An atomic's response: its PSN and the original value.
    Atomic { psn: u32, orig: u64 },
}

const _: () = assert!(std::mem::size_of::<Answer>() <= 40);

/// A READ's response still to be made: the READ's RETH and PSN, the message's packets at
/// the MTU it was cut at, and the next one to make.
#[derive(Clone, Copy)]
struct ReadAnswer {
    psn: u32,
    packets: u32,
    next: u32,
    mtu: u32,
    va: u64,
    rkey: u32,
    len: u32,
}

impl ReadAnswer {
    /// Whether `psn` is one of the response's.
    fn spans(&self, psn: u32) -> bool {
        psn_le(self.psn, psn) && psn_le(psn, psn_add(self.psn, self.packets - 1))
    }
}

impl HcaState {
    /// What a turn left to further turns (`Turn::more_work`): READ responses to make, then
    /// send queues.
    pub(crate) fn continue_work(&mut self) {
        let owed = self.continue_answers();
        self.continue_send_queues();
        self.dev.turn.more_work |= owed;
    }

    /// Makes pieces of the READ responses the device's QPs owe, a piece each in turn,
    /// until the turn's allowance is spent; the QPs that owe more stay listed. Whether any
    /// do.
    #[inline(never)]
    fn continue_answers(&mut self) -> bool {
        while self.dev.turn.pieces_left > 0 {
            let Some(qpn) = self.dev.answering.pop_front() else {
                break;
            };
            if let Some(mut e) = self.engine(qpn) {
                e.qp.answers.listed = false;
                e.pay(1);
            }
        }
        !self.dev.answering.is_empty()
    }

    /// One of our answers reached no requester QP (`why`): the QP that sent it owes its
    /// requester nothing more (it is gone, or another QP's peer now).
    pub(crate) fn answer_bounced(&mut self, pkt: &Packet, why: DropReason) {
        if matches!(why, DropReason::Hook | DropReason::Unrouted) {
            return; // lost on a link: the requester asks again
        }
        let Some(e) = self.engine(pkt.src_qpn) else {
            return;
        };
        let attr = &e.qp.attr;
        if attr.dlid == pkt.dlid && attr.dest_qpn == pkt.dest_qpn && !e.qp.answers.is_empty() {
            log::debug!(
                "LID {}: QP {:#x}: requester {}/{:#x} gone; {} answers dropped",
                e.dev.lid,
                e.qpn,
                pkt.dlid,
                pkt.dest_qpn,
                e.qp.answers.len()
            );
            e.qp.answers.clear();
        }
    }
}

impl QpEngine<'_> {
    /// Owes `a`, behind what the QP owes already (an ACK behind an ACK replaces it: it
    /// covers what that one did), unless it owes [`MAX_ANSWERS`] already.
    #[cold]
    #[inline(never)]
    fn owe(&mut self, a: Answer) {
        if self.qp.answers.is_empty() {
            // A held ACK is older: it goes first.
            self.send_held_ack();
        }
        let owed = &mut self.qp.answers.owed;
        let full = owed.len() >= MAX_ANSWERS;
        match (a, owed.back_mut()) {
            (
                Answer::Aeth {
                    syndrome: AETH_ACK, ..
                },
                Some(
                    last @ Answer::Aeth {
                        syndrome: AETH_ACK, ..
                    },
                ),
            ) => *last = a,
            _ if full => {} // lost, as far as the requester can tell
            _ => owed.push_back(a),
        }
    }

    /// Owes an ACK or NAK (AETH `syndrome`, the current MSN) naming `psn`.
    pub(crate) fn owe_aeth(&mut self, syndrome: u8, psn: u32) {
        let msn = self.qp.msn;
        self.owe(Answer::Aeth { syndrome, psn, msn });
    }

    /// Owes the response of the atomic at `psn`, which found `orig`.
    pub(crate) fn owe_atomic(&mut self, psn: u32, orig: u64) {
        self.owe(Answer::Atomic { psn, orig });
    }

    /// Answers the READ at `psn` for `reth`, whose key was checked over its whole range:
    /// owed, and made as far as this turn allows. A duplicate (`fresh` false) of a READ
    /// whose response is still owed rewinds that response instead.
    #[cold]
    #[inline(never)]
    pub(crate) fn owe_read(&mut self, psn: u32, reth: Reth, fresh: bool) {
        if !fresh && self.rewind(psn) {
            return;
        }
        let mtu = self.qp.mtu();
        let packets = u64::from(reth.len).div_ceil(u64::from(mtu)).max(1) as u32;
        self.owe(Answer::Read(ReadAnswer {
            psn,
            packets,
            next: 0,
            mtu,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.len,
        }));
        let left = self.dev.turn.pieces_left;
        self.pay(left);
    }

    /// A duplicate READ from `psn`: if the QP still owes that READ's response, it is
    /// rewound to `psn` (what was made from there on may have been lost). Whether it was.
    fn rewind(&mut self, psn: u32) -> bool {
        for a in self.qp.answers.owed.iter_mut() {
            if let Answer::Read(r) = a {
                if r.spans(psn) {
                    let at = psn.wrapping_sub(r.psn) & PSN_MASK;
                    r.next = r.next.min(at);
                    return true;
                }
            }
        }
        false
    }

    /// Sends what the QP owes, in order, making at most `pieces` pieces of READ responses
    /// (and no more than the turn allows); a QP that owes more is listed for further turns.
    pub(crate) fn pay(&mut self, mut pieces: u32) {
        if self.dev.catas != 0 {
            // A dead adapter answers nothing: its peers' timers find out.
            self.qp.answers.clear();
            return;
        }
        while let Some(&a) = self.qp.answers.owed.front() {
            let pkt = match a {
                Answer::Read(mut r) => {
                    if self.backlogged() {
                        self.dev.turn.pieces_left = 0; // none in this turn
                    }
                    if pieces == 0 || self.dev.turn.pieces_left == 0 {
                        return self.list();
                    }
                    pieces -= 1;
                    self.dev.turn.pieces_left -= 1;
                    let pkt = self.read_piece(&mut r);
                    match self.qp.answers.owed.front_mut() {
                        Some(front) if r.next < r.packets => *front = Answer::Read(r),
                        _ => drop(self.qp.answers.owed.pop_front()),
                    }
                    pkt
                }
                Answer::Aeth { syndrome, psn, msn } => {
                    self.qp.answers.owed.pop_front();
                    self.aeth_packet(syndrome, psn, msn)
                }
                Answer::Atomic { psn, orig } => {
                    self.qp.answers.owed.pop_front();
                    let mut pkt = self.aeth_packet(AETH_ACK, psn, 0);
                    pkt.opcode = RC_ATOMIC_ACK;
                    pkt.rare = RareHeaders {
                        atomic_ack: Some(orig),
                        ..Default::default()
                    }
                    .boxed();
                    pkt
                }
            };
            self.dev.transmit(pkt);
        }
        // It owes nothing now: the room its queue took goes.
        if self.qp.answers.owed.capacity() > KEEP {
            self.qp.answers.clear();
        }
    }

    /// Whether the device's port is past its backlog bound in the fabric: it makes no
    /// piece then, and its further turns wait for the fabric.
    fn backlogged(&self) -> bool {
        let lid = self.dev.lid;
        self.dev.fabric.as_ref().is_some_and(|f| f.backlogged(lid))
    }

    /// Lists the QP for the device's further turns (once), which the turn then asks for.
    fn list(&mut self) {
        self.dev.turn.more_work = true;
        if !std::mem::replace(&mut self.qp.answers.listed, true) {
            self.dev.answering.push_back(self.qpn);
        }
    }

    /// The next piece of READ response `r`, which moves past it: its packets, or if its
    /// key no longer resolves, the NAK that ends the READ.
    fn read_piece(&mut self, r: &mut ReadAnswer) -> Packet {
        let n = (PIECE_BYTES / r.mtu).max(1).min(r.packets - r.next);
        let mtu = u64::from(r.mtu);
        let off = u64::from(r.next) * mtu;
        let bytes = u64::from(r.len).saturating_sub(off).min(u64::from(n) * mtu);
        let check = KeyCheck::remote(
            self.qpn,
            self.qp.pdn,
            Use::RemoteRead,
            self.qp.attr.access_flags,
        );
        let mut segs = SegList::new();
        let va = r.va.wrapping_add(off);
        if (self.dev)
            .resolve_key(r.rkey, va, bytes, &check, &mut segs)
            .is_err()
        {
            // Gone since the READ came (its range was checked whole then).
            self.dev.stats.revoked += 1;
            let psn = psn_add(r.psn, r.next);
            r.next = r.packets;
            return self.aeth_packet(AETH_NAK_REM_ACCESS, psn, self.qp.msn);
        }
        let payload = Payload::dma(self.dev.mem.clone(), segs, self.dev.grant_of(r.rkey));
        let mut head = Packet {
            dlid: self.qp.attr.dlid,
            pkey: self.qp.pkey,
            dest_qpn: self.qp.attr.dest_qpn,
            src_qpn: self.qpn,
            psn: r.psn,
            aeth: Some((AETH_ACK, 0)),
            ..Default::default()
        };
        head.make_message(RC_READ_RESP_ONLY, u64::from(r.len), r.mtu);
        let piece = head.piece(r.next, n, payload);
        r.next += n;
        piece
    }

    /// An ACK or NAK to the QP's requester.
    fn aeth_packet(&self, syndrome: u8, psn: u32, msn: u32) -> Packet {
        Packet {
            dlid: self.qp.attr.dlid,
            opcode: RC_ACK,
            pkey: self.qp.pkey,
            dest_qpn: self.qp.attr.dest_qpn,
            src_qpn: self.qpn,
            psn,
            aeth: Some((syndrome, msn)),
            ..Default::default()
        }
    }
}
