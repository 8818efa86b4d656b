//! The responder: takes request packets off the fabric for our QPs.
//!
//! RC: a packet must come from the QP's connected peer. One with the expected PSN is
//! executed; a duplicate (a PSN already taken: the requester resent after a lost ACK) is not
//! executed again but answered again (ACK, read data, the atomic's saved result); one ahead
//! of the expected PSN (a packet before it was lost) gets one PSN sequence NAK per gap, so
//! the requester resends from there. SENDs consume a
//! receive WQE at their first packet and complete it at their last; RDMA WRITEs are checked
//! against the rkey (PD, REMOTE_WRITE on both MR and QP, bounds) at their first packet; READs
//! and atomics are answered from local memory. Every accepted message is ACKed (inside a
//! burst of deliveries, the latest ACK is held and sent at the burst's end: it covers the
//! messages before it, and anything else the QP answers goes behind it); a violation
//! is NAKed with IB's syndrome (remote access, invalid request, remote operational), posts
//! EV_QP_ACCESS_ERR where IB raises it, and moves this QP to ERR too. A SEND with no receive
//! WQE posted gets an RNR NAK and leaves the QP as it was.
//!
//! UC: RC's SENDs and WRITEs from the connected peer, placed as RC places them, never
//! answered; what RC would NAK drops the rest of the message instead (see `receive_uc`).
//!
//! UD: checked against the Q_Key; with no receive WQE, a bad Q_Key, or more data than the
//! receive WQE holds, it is dropped silently and counted, as UD allows (the WQE stays).
//! Receive buffers start with UD_GRH_BYTES of GRH room, which holds a multicast datagram's
//! GRH. A group's datagram goes to every QP attached to the group here.

use crate::abi::*;
use crate::fabric::Rejected;
use crate::hca::{Device, HcaState, PIECE_BYTES};
use crate::mr::{KeyCheck, Use};
use crate::packet::*;
use crate::qp::{HeldAck, Inbound, QpEngine, Rest, INBOUND_WINDOW};
use crate::srq::SrqTake;
use crate::status::WcError;

/// Resolves the window of `msg` from its offset on, at least `n` bytes (a packet's), from
/// the ranges its `rest` keeps, checking their keys again: `msg.segs` then covers
/// `[msg.offset, msg.end)`. Else the syndrome the message fails with (a key gone since
/// the message began, or room shorter than the message).
#[cold]
#[inline(never)]
fn next_window(dev: &Device, msg: &mut Inbound, n: u64) -> Result<(), u8> {
    let rest = msg.rest.as_deref().ok_or(AETH_NAK_REM_OP)?;
    let want = n.max(INBOUND_WINDOW).min(msg.cap - msg.offset);
    let mut segs = SegList::new();
    let (mut skip, mut left) = (msg.offset, want);
    for &(key, va, len) in &rest.ranges {
        if left == 0 {
            break;
        }
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = (len - skip).min(left);
        dev.resolve_key(key, va + skip, take, &rest.how, &mut segs)
            .map_err(|_| rest.syndrome)?;
        (skip, left) = (0, left - take);
    }
    if want - left < n {
        return Err(rest.syndrome);
    }
    msg.segs = segs;
    (msg.base, msg.end) = (msg.offset, msg.offset + want - left);
    msg.cursor = Default::default();
    Ok(())
}

/// The receive CQE of an RC message of `byte_len` bytes that ended with `pkt` (its last
/// packet carries the immediate data or the invalidated rkey).
fn recv_cqe(qpn: u32, pkt: &Packet, wr_id: u64, byte_len: u32, opcode: u32) -> HcaCqe {
    HcaCqe {
        wr_id,
        byte_len,
        imm: pkt.imm.or(pkt.ieth).unwrap_or(0),
        qpn,
        src_qp: pkt.src_qpn,
        slid: pkt.slid,
        opcode: opcode as u8,
        flags: (if pkt.imm.is_some() { CQE_FLAG_IMM } else { 0 }
            | if pkt.grh().is_some() { CQE_FLAG_GRH } else { 0 }
            | if pkt.ieth.is_some() { CQE_FLAG_INV } else { 0 }) as u8,
        ..Default::default()
    }
}

/// The status of a receive WR whose message was refused with NAK `syndrome`: too long for
/// it, or not placed.
fn refused_status(syndrome: u8) -> WcError {
    if syndrome == AETH_NAK_INV_REQ {
        WcError::LocLen
    } else {
        WcError::LocProt
    }
}

/// A receive WQE taken off a receive queue, with its SGEs resolved: all of them, or, for
/// room longer than [`INBOUND_WINDOW`], its first window and the SGEs for the rest.
struct Recv {
    wr_id: u64,
    segs: SegList,
    cap: u64,
    rest: Option<Box<Rest>>,
}

impl Recv {
    /// A SEND's message to come, into this WQE.
    fn into_inbound(self) -> Inbound {
        Inbound {
            segs: self.segs,
            base: 0,
            end: self.cap.min(INBOUND_WINDOW),
            rest: self.rest,
            offset: 0,
            cap: self.cap,
            recv_wr_id: Some(self.wr_id),
            grant: None,
            cursor: Default::default(),
        }
    }
}

/// Why a receive WQE could not be used.
enum RecvError {
    /// None posted (RNR for RC, drop for UD).
    Empty,
    /// The WQE completes with this status and the QP goes to ERR.
    Bad { wr_id: u64, status: WcError },
    /// Broken indices or ring: the QP already went to ERR.
    Fatal,
}

impl HcaState {
    /// Handles one packet from the fabric. `Err` tells the fabric the packet was discarded
    /// (so that the sender learns it never arrived).
    pub(crate) fn receive(&mut self, pkt: Packet) -> Result<(), Rejected> {
        let n = u64::from(pkt.count.max(1));
        self.dev.stats.packets_in += n;
        self.dev.stats.mcast_in += n * u64::from(pkt.is_multicast());
        self.dev.stats.wire_in += pkt.wire_bytes();
        if self.dev.catas != 0 {
            // A dead adapter: its peers' timers find out.
            return Ok(());
        }
        if pkt.corrupt {
            // A bad ICRC: dropped unseen, as IB does; the sender's timer finds out.
            self.dev.stats.icrc_errors += 1;
            return Ok(());
        }
        if !pkt.is_request() {
            return self.on_response(pkt);
        }
        if !pkt.is_ud() {
            return match self.engine(pkt.dest_qpn) {
                Some(e) if !e.admits(&pkt) => {
                    e.dev.stats.pkey_violations += 1;
                    Ok(())
                }
                Some(mut e) if pkt.uc => e.receive_uc(pkt),
                Some(mut e) => e.receive_rc(pkt),
                None => Err(Rejected::of(pkt)),
            };
        }
        // A group's datagram goes to every QP attached here (each checks its Q_Key); it
        // may be attached under two MGIDs that share the MLID: it gets one copy.
        let qpns = if pkt.is_multicast() {
            self.dev.attached(pkt.dlid)
        } else {
            vec![pkt.dest_qpn]
        };
        for qpn in qpns {
            match self.engine(qpn) {
                Some(e) if !e.admits(&pkt) => e.dev.stats.pkey_violations += 1,
                Some(mut e) => e.receive_ud(&pkt),
                None => self.dev.stats.ud_dropped += 1,
            }
        }
        Ok(())
    }
}

impl QpEngine<'_> {
    /// Whether a packet's partition lets it reach this QP: its P_Key matches the QP's, or,
    /// for QP1 (which serves every partition of the port), any entry of the port's table.
    /// A packet that fails is dropped unanswered, as IB drops a P_Key violation.
    pub(crate) fn admits(&self, pkt: &Packet) -> bool {
        match self.qpn {
            SMI_QPN => true, // IBA: subnet management is not partitioned
            GSI_QPN => crate::partition::table_admits(&self.dev.pkeys, pkt.pkey),
            _ => crate::partition::pkeys_match(pkt.pkey, self.qp.pkey),
        }
    }

    /// An RC request for this QP.
    fn receive_rc(&mut self, pkt: Packet) -> Result<(), Rejected> {
        let qp = &mut *self.qp;
        let state = u32::from(qp.attr.state);
        let from_peer = pkt.slid == qp.attr.dlid && pkt.src_qpn == qp.attr.dest_qpn;
        if qp.qp_type != QPT_RC || !matches!(state, QPS_RTR | QPS_RTS) || !from_peer {
            return Err(Rejected::of(pkt));
        }
        if pkt.psn != qp.epsn {
            self.out_of_sequence(pkt);
            return Ok(());
        }
        if pkt.payload.is_revoked() {
            // Its sender's WR was flushed while it was on the wire: the buffer is that
            // consumer's again, and what is there now was never sent. Lost, as far as
            // this QP can tell (the sender's QP is in ERR or gone).
            self.dev.stats.revoked += 1;
            return Ok(());
        }
        qp.nak_sent = false;
        match pkt.opcode {
            RC_SEND_FIRST..=RC_SEND_ONLY_IMM | RC_SEND_LAST_INV | RC_SEND_ONLY_INV => {
                self.rc_send(&pkt)
            }
            RC_WRITE_FIRST..=RC_WRITE_ONLY_IMM => self.rc_write(pkt),
            RC_READ_REQUEST => self.rc_read(pkt, true),
            RC_CMP_SWAP | RC_FETCH_ADD => self.rc_atomic(pkt),
            RC_ATOMIC_WRITE => self.rc_atomic_write(pkt),
            _ => self.nak(&pkt, AETH_NAK_INV_REQ),
        }
        Ok(())
    }

    /// A request whose PSN is not the expected one: a duplicate, or early.
    fn out_of_sequence(&mut self, pkt: Packet) {
        let qp = &mut *self.qp;
        let last_done = psn_add(qp.epsn, PSN_MASK);
        if !psn_le(pkt.psn, last_done) {
            // Early: something before it was lost. One NAK per gap.
            if !qp.nak_sent {
                qp.nak_sent = true;
                let epsn = qp.epsn;
                self.transmit_aeth(&pkt, AETH_NAK_PSN_SEQ, epsn);
            }
            return;
        }
        self.dev.stats.duplicates += 1;
        match pkt.opcode {
            RC_READ_REQUEST => self.rc_read(pkt, false),
            RC_CMP_SWAP | RC_FETCH_ADD => match qp.last_atomic {
                Some((psn, orig)) if psn == pkt.psn => self.answer_atomic(&pkt, orig),
                _ => {} // Older than the one we keep: its ACK must have arrived.
            },
            _ if pkt.ends_message() => {
                // Everything up to last_done was taken: say so again.
                self.transmit_aeth(&pkt, AETH_ACK, last_done);
            }
            _ => {}
        }
    }

    // Always inline (as `start_recv`): a `Recv` returned through a call is copied
    // through memory at each level; LTO left both out of line.
    #[inline(always)]
    fn take_recv(&mut self) -> Result<Recv, RecvError> {
        if let Some(srqn) = self.qp.srq {
            return match self.dev.srq_take(srqn) {
                Ok(w) => self.parse_recv(w.addr, w.hdr, w.first, w.pdn, w.max_sge),
                Err(SrqTake::Empty) => Err(RecvError::Empty),
                Err(SrqTake::Broken) => {
                    self.enter_error();
                    Err(RecvError::Fatal)
                }
            };
        }
        let pi = self.dev.bar2.load_u32(self.qp.db + 4);
        let posted = pi.wrapping_sub(self.qp.rq.ci);
        if posted == 0 {
            return Err(RecvError::Empty);
        }
        if posted > self.qp.rq.size() {
            self.fatal(ERR_WQ_INDEX);
            return Err(RecvError::Fatal);
        }
        let addr = self.qp.rq.slot(self.qp.rq.ci);
        let (pdn, max_sge) = (self.qp.pdn, self.qp.rq.max_sge(16));
        let stride = 1u32 << self.qp.rq.wqe_shift;
        let Ok((hdr, first)) = self.dev.read_wqe_head::<HcaRecvWqe>(addr, stride) else {
            self.fatal(ERR_RING_ACCESS);
            return Err(RecvError::Fatal);
        };
        self.qp.rq.ci = self.qp.rq.ci.wrapping_add(1);
        self.parse_recv(addr, hdr, first, pdn, max_sge)
    }

    /// A receive WQE just taken (header `hdr` at `addr`, and its first SGE if read with
    /// it): its SGEs, resolved in PD `pdn`.
    // Always inline, as `take_recv`: its `Recv` is returned by value.
    #[inline(always)]
    fn parse_recv(
        &mut self,
        addr: u64,
        hdr: HcaRecvWqe,
        first: Option<HcaSge>,
        pdn: u32,
        max_sge: u32,
    ) -> Result<Recv, RecvError> {
        let bad = |status| RecvError::Bad {
            wr_id: hdr.wr_id,
            status,
        };
        if u32::from(hdr.num_sge) > max_sge {
            return Err(bad(WcError::LocQpOp));
        }
        let mut segs = SegList::new();
        let cap = self
            .dev
            .gather_sges(
                addr + 16,
                hdr.num_sge.into(),
                first,
                (pdn, Use::LocalWrite),
                &mut segs,
                INBOUND_WINDOW,
            )
            .map_err(|f| bad(f.into()))?;
        let rest = if cap > INBOUND_WINDOW {
            self.recv_rest(addr + 16, hdr.num_sge.into(), first, pdn)
        } else {
            None
        };
        Ok(Recv {
            wr_id: hdr.wr_id,
            segs,
            cap,
            rest,
        })
    }

    /// The SGEs of a receive WQE whose room is longer than [`INBOUND_WINDOW`], read
    /// again (`gather_sges` checked them), for the windows past the first. None if they
    /// cannot be read: the message then fails where its first window ends.
    #[cold]
    #[inline(never)]
    fn recv_rest(&self, addr: u64, n: u32, first: Option<HcaSge>, pdn: u32) -> Option<Box<Rest>> {
        let mut ranges = smallvec::SmallVec::new();
        for i in 0..u64::from(n) {
            let sge = match first.filter(|_| i == 0) {
                Some(sge) => sge,
                None => {
                    crate::dma::read_obj::<HcaSge>(self.dev.mem.as_ref(), addr + 16 * i).ok()?
                }
            };
            ranges.push((sge.lkey, sge.addr, u64::from(sge.length)));
        }
        Some(Box::new(Rest {
            ranges,
            how: KeyCheck::local(pdn, Use::LocalWrite),
            syndrome: AETH_NAK_REM_OP,
        }))
    }

    /// Gives back the receive WQE just taken: the next message gets it.
    fn untake_recv(&mut self) {
        match self.qp.srq {
            Some(srqn) => self.dev.srq_untake(srqn),
            None => self.qp.rq.ci = self.qp.rq.ci.wrapping_sub(1),
        }
    }

    /// ACKs message `req`, which completed here (the MSN counts it). Inside a burst (more of
    /// `req`'s stream queued behind it) the ACK is held: the burst's end sends the
    /// latest, which covers every message before it, as IB lets ACKs coalesce.
    // Always inline: a few stores on its usual path (the ACK held), after every message.
    #[inline(always)]
    fn transmit_ack(&mut self, req: &Packet) {
        self.qp.msn = self.qp.msn.wrapping_add(1) & PSN_MASK;
        let psn = psn_add(req.psn, req.span() - 1);
        if !self.qp.answers.is_empty() {
            return self.owe_aeth(AETH_ACK, psn);
        }
        if !self.dev.turn.hold_acks {
            // A held ACK is older: this one covers its messages too.
            self.qp.held_ack = None;
            let ack = self.aeth(req, AETH_ACK, psn);
            return self.dev.transmit(ack);
        }
        self.qp.held_ack = Some(HeldAck {
            dlid: req.slid,
            dest_qpn: req.src_qpn,
            pkey: self.qp.pkey,
            psn,
            msn: self.qp.msn,
        });
        if !std::mem::replace(&mut self.qp.held_ack_listed, true) {
            self.dev.turn.held_acks.push(self.qpn);
        }
    }

    /// An ACK or NAK (AETH `syndrome`, the current MSN) to `req`'s sender naming `psn`:
    /// an ACK covers everything up to it, a NAK asks for a resend from it (or fails it).
    fn transmit_aeth(&mut self, req: &Packet, syndrome: u8, psn: u32) {
        if !self.qp.answers.is_empty() {
            return self.owe_aeth(syndrome, psn);
        }
        let pkt = self.aeth(req, syndrome, psn);
        self.reply(pkt);
    }

    /// The response to atomic request `req`, which found `orig`.
    fn answer_atomic(&mut self, req: &Packet, orig: u64) {
        if !self.qp.answers.is_empty() {
            return self.owe_atomic(req.psn, orig);
        }
        self.reply(atomic_ack(self.qpn, self.qp.pkey, req, orig));
    }

    fn aeth(&self, req: &Packet, syndrome: u8, psn: u32) -> Packet {
        Packet {
            dlid: req.slid,
            opcode: RC_ACK,
            pkey: self.qp.pkey,
            dest_qpn: req.src_qpn,
            src_qpn: self.qpn,
            psn,
            aeth: Some((syndrome, self.qp.msn)),
            ..Default::default()
        }
    }

    /// Sends a response, behind the ACK this QP holds (which is older).
    fn reply(&mut self, pkt: Packet) {
        self.send_held_ack();
        self.dev.transmit(pkt);
    }

    pub(crate) fn send_held_ack(&mut self) {
        if let Some(held) = self.qp.held_ack.take() {
            // The packet `aeth` makes, from the held fields. (One builder shared by both,
            // taking a `HeldAck`, made a 4 KiB WRITE up to 7 ns slower at sixteen per
            // doorbell, in 8 of 9 rounds over two tries, one a tie: code layout.)
            let ack = Packet {
                dlid: held.dlid,
                opcode: RC_ACK,
                pkey: held.pkey,
                dest_qpn: held.dest_qpn,
                src_qpn: self.qpn,
                psn: held.psn,
                aeth: Some((AETH_ACK, held.msn)),
                ..Default::default()
            };
            self.dev.transmit(ack);
        }
    }

    /// NAKs `req` (naming its first PSN, the one refused) and, unless it is an RNR NAK,
    /// moves this QP to ERR.
    fn nak(&mut self, req: &Packet, syndrome: u8) {
        log::debug!(
            "LID {}: QP {:#x} NAKs PSN {:#x} from LID {} (syndrome {syndrome:#x})",
            self.dev.lid,
            self.qpn,
            req.psn,
            req.slid
        );
        self.transmit_aeth(req, syndrome, req.psn);
        if syndrome & 0xe0 != AETH_RNR_NAK {
            if syndrome == AETH_NAK_REM_ACCESS {
                self.dev
                    .post_event(VEC_ASYNC, EV_QP_ACCESS_ERR, self.qpn, 0);
            }
            self.enter_error();
        }
    }

    fn advance_epsn(&mut self, n: u32) {
        self.qp.epsn = psn_add(self.qp.epsn, n);
    }

    fn post_recv_cqe(&mut self, cqe: HcaCqe, solicited: bool) {
        self.dev.post_cqe(self.qp.recv_cqn, cqe, solicited);
    }

    fn fail_recv(&mut self, wr_id: u64, status: WcError) {
        self.dev
            .post_status(self.qp.recv_cqn, self.qpn, wr_id, CQE_OP_RECV, status);
    }

    /// Starts an inbound message that needs a receive WQE; on failure, answers for it.
    #[inline(always)]
    fn start_recv(&mut self, pkt: &Packet) -> Option<Recv> {
        match self.take_recv() {
            Ok(r) => Some(r),
            Err(RecvError::Empty) => {
                // Later packets of this message are early now: no sequence NAK for them.
                self.qp.nak_sent = true;
                let timer = self.qp.attr.min_rnr_timer;
                self.transmit_aeth(pkt, AETH_RNR_NAK | (timer & 0x1f), pkt.psn);
                None
            }
            Err(RecvError::Bad { wr_id, status }) => {
                self.fail_recv(wr_id, status);
                self.nak(pkt, AETH_NAK_REM_OP);
                None
            }
            Err(RecvError::Fatal) => None,
        }
    }

    /// Places a packet's payload at the current offset of the inbound message.
    fn place(&mut self, pkt: &Packet) -> Result<(), u8> {
        let msg = self.qp.inbound.as_mut().ok_or(AETH_NAK_INV_REQ)?;
        if msg.grant.as_ref().is_some_and(|g| g.is_revoked()) {
            // The MR this WRITE was let into went since its first packet.
            self.dev.stats.revoked += 1;
            return Err(AETH_NAK_REM_ACCESS);
        }
        let n = u64::from(pkt.payload.len());
        if msg.offset + n > msg.cap {
            return Err(AETH_NAK_INV_REQ);
        }
        if msg.offset + n > msg.end {
            next_window(self.dev, msg, n)?;
        }
        let mem = self.dev.mem.as_ref();
        let placed = if msg.offset == msg.base {
            pkt.payload.scatter(mem, &msg.segs)
        } else {
            let piece = msg.cursor.cut(&msg.segs, msg.offset - msg.base, n);
            pkt.payload.scatter(mem, &piece)
        };
        msg.offset += n;
        if placed.is_err() {
            self.dev.stats.dma_faults += 1;
            return Err(AETH_NAK_REM_OP);
        }
        Ok(())
    }

    /// The inbound message could not be placed (`syndrome`): its receive WR (if it took
    /// one) fails, and the request is NAKed.
    fn refuse_inbound(&mut self, pkt: &Packet, syndrome: u8) {
        let msg = self.qp.inbound.take();
        if let Some(wr_id) = msg.and_then(|m| m.recv_wr_id) {
            self.fail_recv(wr_id, refused_status(syndrome));
        }
        self.nak(pkt, syndrome);
    }

    fn rc_send(&mut self, pkt: &Packet) {
        let (first, last) = (pkt.starts_message(), pkt.ends_message());
        if first == self.qp.inbound.is_some() {
            return self.nak(pkt, AETH_NAK_INV_REQ); // FIRST inside a message, or MIDDLE outside one.
        }
        if first && last {
            return self.rc_send_only(pkt);
        }
        if first {
            let Some(r) = self.start_recv(pkt) else {
                return;
            };
            self.qp.inbound = Some(r.into_inbound());
        }
        self.rc_send_placed(pkt, last);
    }

    /// Places a packet of the inbound SEND message, and ends the message at its last.
    // Always inline: `rc_send`'s own body (one call site but for the rare one-train message
    // longer than a window).
    #[inline(always)]
    fn rc_send_placed(&mut self, pkt: &Packet, last: bool) {
        if let Err(syndrome) = self.place(pkt) {
            return self.refuse_inbound(pkt, syndrome);
        }
        // A SEND with Invalidate invalidates its rkey as the message completes; an rkey that
        // is not one of this QP's PD's fast-registration MRs is an invalid request.
        if let Some(rkey) = pkt.ieth.filter(|_| last) {
            if !self.dev.invalidate(self.qp.pdn, rkey) {
                if let Some(wr_id) = self.qp.inbound.take().and_then(|m| m.recv_wr_id) {
                    self.fail_recv(wr_id, WcError::RemInvReq);
                }
                return self.nak(pkt, AETH_NAK_INV_REQ);
            }
        }
        self.advance_epsn(pkt.span());
        // One ACK per message, at its last packet (IB lets ACKs coalesce).
        if last {
            self.finish_inbound(pkt, CQE_OP_RECV);
            self.transmit_ack(pkt);
        }
    }

    #[cold]
    #[inline(never)]
    fn rc_send_long(&mut self, pkt: &Packet, r: Recv) {
        self.qp.inbound = Some(r.into_inbound());
        self.rc_send_placed(pkt, true);
    }

    /// A SEND in one packet (nearly every small message): its receive WQE is taken, its
    /// payload placed and its CQE written at once, without the inbound state that a message
    /// of several packets keeps between them. Answers as [`Self::rc_send`] does.
    fn rc_send_only(&mut self, pkt: &Packet) {
        let Some(r) = self.start_recv(pkt) else {
            return;
        };
        let n = pkt.payload.len();
        let syndrome = if u64::from(n) > r.cap {
            Some(AETH_NAK_INV_REQ)
        } else if u64::from(n) > INBOUND_WINDOW {
            // Longer than the window its WQE's list was resolved for (a train is at most
            // a 1 MiB piece, so not in practice): placed a window at a time.
            return self.rc_send_long(pkt, r);
        } else if pkt.payload.scatter(self.dev.mem.as_ref(), &r.segs).is_err() {
            self.dev.stats.dma_faults += 1;
            Some(AETH_NAK_REM_OP)
        } else {
            None
        };
        if let Some(syndrome) = syndrome {
            self.fail_recv(r.wr_id, refused_status(syndrome));
            return self.nak(pkt, syndrome);
        }
        if let Some(rkey) = pkt.ieth {
            if !self.dev.invalidate(self.qp.pdn, rkey) {
                self.fail_recv(r.wr_id, WcError::RemInvReq);
                return self.nak(pkt, AETH_NAK_INV_REQ);
            }
        }
        self.advance_epsn(pkt.span());
        self.post_recv_cqe(
            recv_cqe(self.qpn, pkt, r.wr_id, n, CQE_OP_RECV),
            pkt.solicited,
        );
        self.transmit_ack(pkt);
    }

    /// Completes the inbound message: a receive CQE if it consumed a receive WQE.
    fn finish_inbound(&mut self, pkt: &Packet, opcode: u32) {
        // Read in place, then dropped there (`take` would move it out first: a memcpy).
        let done = self.qp.inbound.as_ref().map(|m| (m.recv_wr_id, m.offset));
        self.qp.inbound = None;
        let Some((Some(wr_id), offset)) = done else {
            return;
        };
        let cqe = recv_cqe(self.qpn, pkt, wr_id, offset as u32, opcode);
        self.post_recv_cqe(cqe, pkt.solicited);
    }

    fn rc_write(&mut self, pkt: Packet) {
        let (first, last) = (pkt.starts_message(), pkt.ends_message());
        let with_imm = last && pkt.imm.is_some();
        if first == self.qp.inbound.is_some() {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        }
        if first && last && !with_imm {
            return self.rc_write_only(pkt);
        }
        if first {
            match self.write_target(&pkt) {
                Ok(msg) => self.qp.inbound = Some(msg),
                Err(syndrome) => return self.nak(&pkt, syndrome),
            }
        }
        // WRITE_WITH_IMM consumes a receive WQE for its immediate; check before placing.
        if with_imm {
            let Some(r) = self.start_recv(&pkt) else {
                // The requester resends from this packet after RNR: a whole message
                // starts over, a last packet finds the message where it was.
                if pkt.starts_message() {
                    self.qp.inbound = None;
                }
                return;
            };
            if let Some(msg) = self.qp.inbound.as_mut() {
                msg.recv_wr_id = Some(r.wr_id);
            }
        }
        if let Err(syndrome) = self.place(&pkt) {
            return self.refuse_inbound(&pkt, syndrome);
        }
        if last {
            let complete = self.qp.inbound.as_ref().is_some_and(|m| m.offset == m.cap);
            if !complete {
                self.qp.inbound = None;
                return self.nak(&pkt, AETH_NAK_INV_REQ);
            }
            self.finish_inbound(&pkt, CQE_OP_RECV_RDMA_IMM);
            self.transmit_ack(&pkt);
        }
        self.advance_epsn(pkt.span());
    }

    /// A WRITE in one packet without immediate (nearly every one): checked, placed and
    /// ACKed at once, with no inbound message kept between its packets, as `rc_write`
    /// keeps for a longer one. Its answers are `rc_write`'s: a bad key is a remote access
    /// error; a payload longer or shorter than the RETH's length, an invalid request; bytes
    /// that cannot be copied, a remote operational error. (Its key check repeats
    /// `rc_write`'s: a helper shared by both, returning the RETH and the list, cost about 40
    /// instructions a WRITE in moves, and 5-10 ns one at a time.)
    fn rc_write_only(&mut self, pkt: Packet) {
        let Some(reth) = pkt.reth else {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        };
        let check = KeyCheck::remote(
            self.qpn,
            self.qp.pdn,
            Use::RemoteWrite,
            self.qp.attr.access_flags,
        );
        let mut segs = SegList::new();
        let len = u64::from(reth.len);
        // The range the RETH names is checked whole; only what the payload fills is
        // resolved (a payload of another length is refused below).
        let fills = u64::from(pkt.payload.len());
        if (self.dev)
            .resolve_key_upto(reth.rkey, reth.va, len, &check, &mut segs, fills)
            .is_err()
        {
            return self.nak(&pkt, AETH_NAK_REM_ACCESS);
        }
        if fills != len {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        }
        // Placed under the device lock that deregistering or invalidating the MR must
        // take: nothing revokes the key between the check and the copy.
        if pkt.payload.scatter(self.dev.mem.as_ref(), &segs).is_err() {
            self.dev.stats.dma_faults += 1;
            return self.nak(&pkt, AETH_NAK_REM_OP);
        }
        self.transmit_ack(&pkt);
        self.advance_epsn(pkt.span());
    }

    /// A read request; `fresh` false for a duplicate, answered again without taking PSNs.
    /// A response in one piece when the QP owes nothing before it (nearly every READ) is
    /// made now; a longer one, or one behind answers owed, is owed (see answers.rs): its
    /// range is checked whole now, and resolved a piece at a time as it is made.
    fn rc_read(&mut self, pkt: Packet, fresh: bool) {
        let Some(reth) = pkt.reth else {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        };
        let check = KeyCheck::remote(
            self.qpn,
            self.qp.pdn,
            Use::RemoteRead,
            self.qp.attr.access_flags,
        );
        let len = u64::from(reth.len);
        let now = len <= u64::from(PIECE_BYTES) && self.qp.answers.is_empty();
        let mut segs = SegList::new();
        if self
            .dev
            .resolve_key_upto(
                reth.rkey,
                reth.va,
                len,
                &check,
                &mut segs,
                if now { len } else { 0 },
            )
            .is_err()
        {
            if !fresh {
                // A duplicate of a read this QP took: its MR went away since (the
                // requester may be done with it, and its consumer let go of the memory).
                // The requester hears of it, if it still waits; this QP's state is not the
                // duplicate's to change.
                return self.transmit_aeth(&pkt, AETH_NAK_REM_ACCESS, pkt.psn);
            }
            return self.nak(&pkt, AETH_NAK_REM_ACCESS);
        }
        if !now {
            let npk = len.div_ceil(u64::from(self.qp.mtu())).max(1) as u32;
            self.owe_read(pkt.psn, reth, fresh);
            if fresh {
                self.advance_epsn(npk);
            }
            return;
        }
        let mut resp = Packet {
            dlid: pkt.slid,
            pkey: self.qp.pkey,
            dest_qpn: pkt.src_qpn,
            src_qpn: self.qpn,
            psn: pkt.psn,
            aeth: Some((AETH_ACK, 0)),
            payload: Payload::dma(self.dev.mem.clone(), segs, self.dev.grant_of(reth.rkey)),
            ..Default::default()
        };
        resp.make_message(RC_READ_RESP_ONLY, len, self.qp.mtu());
        let npk = resp.span();
        self.send_held_ack();
        self.dev.transmit_train(resp);
        if fresh {
            self.advance_epsn(npk);
        }
    }

    fn rc_atomic(&mut self, pkt: Packet) {
        let (Some(reth), Some((swap_add, compare))) = (pkt.reth, pkt.atomic()) else {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        };
        if reth.va % 8 != 0 {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        }
        let check = KeyCheck::remote(
            self.qpn,
            self.qp.pdn,
            Use::RemoteAtomic,
            self.qp.attr.access_flags,
        );
        let mut segs = SegList::new();
        if self
            .dev
            .resolve_key(reth.rkey, reth.va, 8, &check, &mut segs)
            .is_err()
        {
            return self.nak(&pkt, AETH_NAK_REM_ACCESS);
        }
        // Atomic with respect to other atomics through this HCA (IB_ATOMIC_HCA): the HCA's
        // lock is held across the read-modify-write.
        let [target] = segs.as_slice() else {
            return self.nak(&pkt, AETH_NAK_REM_ACCESS);
        };
        let at = target.addr;
        let mut b = [0u8; 8];
        if self.dev.mem.read(at, &mut b).is_err() {
            return self.nak(&pkt, AETH_NAK_REM_OP);
        }
        let orig = u64::from_le_bytes(b);
        // Unmasked atomics are masked ones with every bit compared and swapped, and one
        // 64-bit field.
        let masks = pkt.atomic_masks();
        let new = if pkt.opcode == RC_CMP_SWAP {
            let (compare_mask, swap_mask) = masks.unwrap_or((!0, !0));
            masked_cmp_swap(orig, compare, swap_add, compare_mask, swap_mask)
        } else {
            fields_add(
                orig,
                swap_add,
                masks.map_or(0, |(boundaries, _)| boundaries),
            )
        };
        if self.dev.mem.write(at, &new.to_le_bytes()).is_err() {
            return self.nak(&pkt, AETH_NAK_REM_OP);
        }
        self.answer_atomic(&pkt, orig);
        self.qp.last_atomic = Some((pkt.psn, orig));
        self.advance_epsn(1);
    }

    /// A UC request for this QP: a SEND or RDMA WRITE from its connected peer, placed as
    /// RC's are, and never answered. What RC would NAK is dropped instead, with the rest of
    /// its message, and the QP stays as it was (IBA 9.7.5.2): a PSN gap (a packet lost;
    /// the message it belonged to is abandoned, and the next one that starts is taken), no
    /// receive WQE, a bad rkey, a message too long for its WQE or its RETH, bytes that
    /// cannot be placed.
    fn receive_uc(&mut self, pkt: Packet) -> Result<(), Rejected> {
        let qp = &mut *self.qp;
        let state = u32::from(qp.attr.state);
        let from_peer = pkt.slid == qp.attr.dlid && pkt.src_qpn == qp.attr.dest_qpn;
        if !qp.is_uc() || !matches!(state, QPS_RTR | QPS_RTS) || !from_peer {
            return Err(Rejected::of(pkt));
        }
        let start = pkt.starts_message();
        if pkt.psn != qp.epsn || qp.nak_sent {
            // `nak_sent`: here, the message under way is being dropped.
            if !start {
                qp.epsn = psn_add(pkt.psn, pkt.span());
                return self.drop_uc();
            }
            self.abandon_uc();
            self.qp.epsn = pkt.psn;
        }
        if start && self.qp.inbound.is_some() {
            // The last message's end was lost: it is abandoned, this one taken.
            self.abandon_uc();
        }
        let qp = &mut *self.qp;
        qp.nak_sent = false;
        qp.epsn = psn_add(pkt.psn, pkt.span());
        let (first, last) = (start, pkt.ends_message());
        if !first && qp.inbound.is_none() {
            return self.drop_uc();
        }
        let write = matches!(pkt.opcode, RC_WRITE_FIRST..=RC_WRITE_ONLY_IMM);
        if first {
            let inbound = if write {
                self.write_target(&pkt).ok()
            } else {
                self.uc_recv()
            };
            let Some(inbound) = inbound else {
                return self.drop_uc();
            };
            self.qp.inbound = Some(inbound);
        }
        if last && write && pkt.imm.is_some() {
            // Its immediate data takes a receive WQE.
            let Some(r) = self.uc_recv() else {
                return self.drop_uc();
            };
            if let Some(msg) = self.qp.inbound.as_mut() {
                msg.recv_wr_id = r.recv_wr_id;
            }
        }
        if pkt.payload.is_revoked() || self.place(&pkt).is_err() {
            return self.drop_uc();
        }
        if last {
            let complete = self.qp.inbound.as_ref().is_some_and(|m| m.offset == m.cap);
            if write && !complete {
                return self.drop_uc();
            }
            let op = if write {
                CQE_OP_RECV_RDMA_IMM
            } else {
                CQE_OP_RECV
            };
            self.finish_inbound(&pkt, op);
        }
        Ok(())
    }

    /// A receive WQE for a UC SEND (or WRITE with immediate), as an inbound message.
    fn uc_recv(&mut self) -> Option<Inbound> {
        match self.take_recv() {
            Ok(r) => Some(r.into_inbound()),
            // A WQE that cannot be used completes in error, as RC's does; UC leaves the
            // QP as it is.
            Err(RecvError::Bad { wr_id, status }) => {
                self.fail_recv(wr_id, status);
                None
            }
            Err(RecvError::Empty | RecvError::Fatal) => None,
        }
    }

    /// Where a WRITE's first packet says its bytes go (RC and UC), checked against the
    /// rkey: PD, REMOTE_WRITE on both MR and QP, bounds. Else the syndrome RC NAKs with.
    fn write_target(&mut self, pkt: &Packet) -> Result<Inbound, u8> {
        let reth = pkt.reth.ok_or(AETH_NAK_INV_REQ)?;
        let check = KeyCheck::remote(
            self.qpn,
            self.qp.pdn,
            Use::RemoteWrite,
            self.qp.attr.access_flags,
        );
        let mut segs = SegList::new();
        let len = u64::from(reth.len);
        self.dev
            .resolve_key_upto(reth.rkey, reth.va, len, &check, &mut segs, INBOUND_WINDOW)
            .map_err(|_| AETH_NAK_REM_ACCESS)?;
        let rest = (len > INBOUND_WINDOW).then(|| {
            Box::new(Rest {
                ranges: smallvec::smallvec![(reth.rkey, reth.va, len)],
                how: check,
                syndrome: AETH_NAK_REM_ACCESS,
            })
        });
        Ok(Inbound {
            segs,
            base: 0,
            end: len.min(INBOUND_WINDOW),
            rest,
            offset: 0,
            cap: len,
            recv_wr_id: None,
            // A WRITE in one packet is placed in this turn, under the device lock that
            // deregistering or invalidating its MR must take: nothing can revoke the key
            // between the check and the copy, so it needs no grant.
            grant: if pkt.ends_message() {
                None
            } else {
                self.dev.grant_of(reth.rkey)
            },
            cursor: Default::default(),
        })
    }

    /// Drops the rest of the UC message under way.
    fn drop_uc(&mut self) -> Result<(), Rejected> {
        self.dev.stats.uc_dropped += 1;
        self.qp.nak_sent = true;
        self.abandon_uc();
        Ok(())
    }

    /// Abandons the UC message under way, if any: a receive WQE it took goes back to the
    /// QP's receive queue for the next message; one from an SRQ, which may have been taken
    /// from since, completes in error instead (IBA's class E).
    fn abandon_uc(&mut self) {
        let Some(wr_id) = self.qp.inbound.take().and_then(|m| m.recv_wr_id) else {
            return;
        };
        match self.qp.srq {
            Some(_) => self.fail_recv(wr_id, WcError::RemInvReq),
            None => self.untake_recv(),
        }
    }

    /// An ATOMIC WRITE: its 8 bytes stored at an aligned address under the rkey's remote
    /// write right, in one access under the device's lock (so no atomic of this HCA sees
    /// half of it); ACKed as a WRITE is. A duplicate is ACKed again, not stored again.
    fn rc_atomic_write(&mut self, pkt: Packet) {
        let (Some(reth), 8) = (pkt.reth, pkt.payload.len()) else {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        };
        if reth.va % 8 != 0 || reth.len != 8 {
            return self.nak(&pkt, AETH_NAK_INV_REQ);
        }
        let check = KeyCheck::remote(
            self.qpn,
            self.qp.pdn,
            Use::RemoteWrite,
            self.qp.attr.access_flags,
        );
        let mut segs = SegList::new();
        if self
            .dev
            .resolve_key(reth.rkey, reth.va, 8, &check, &mut segs)
            .is_err()
        {
            return self.nak(&pkt, AETH_NAK_REM_ACCESS);
        }
        if pkt.payload.scatter(self.dev.mem.as_ref(), &segs).is_err() {
            self.dev.stats.dma_faults += 1;
            return self.nak(&pkt, AETH_NAK_REM_OP);
        }
        self.transmit_ack(&pkt);
        self.advance_epsn(1);
    }

    /// A datagram for this QP.
    fn receive_ud(&mut self, pkt: &Packet) {
        let qp = &*self.qp;
        // QP0 takes only what a QP0 sent (as VL15 carries only subnet management), without
        // a Q_Key; no other QP takes that.
        let keyed = if self.qpn == SMI_QPN {
            pkt.src_qpn == SMI_QPN
        } else {
            qp.attr.qkey == pkt.qkey && pkt.src_qpn != SMI_QPN
        };
        let ok = qp.is_ud() && matches!(u32::from(qp.attr.state), QPS_RTR | QPS_RTS) && keyed;
        if !ok {
            self.dev.stats.ud_dropped += 1;
            return;
        }
        let r = match self.take_recv() {
            Ok(r) => r,
            Err(RecvError::Empty) | Err(RecvError::Fatal) => {
                self.dev.stats.ud_dropped += 1;
                return;
            }
            Err(RecvError::Bad { wr_id, status }) => {
                self.fail_recv(wr_id, status);
                return self.enter_error();
            }
        };
        let grh = u64::from(UD_GRH_BYTES);
        let len = u64::from(pkt.payload.len());
        if r.cap < grh + len {
            // A datagram too long for the buffer is dropped and the WQE stays for the next:
            // a remote sender (QP1's Q_Key is public) must never break this QP.
            self.untake_recv();
            self.dev.stats.ud_dropped += 1;
            return;
        }
        // A multicast datagram's GRH as on the wire (BTH, DETH, payload, ICRC after it);
        // a unicast one has none: the room is zeroed and CQE_FLAG_GRH clear.
        let room = match pkt.grh() {
            Some(g) => g.to_bytes((12 + 8 + len + 4) as u16).to_vec(),
            None => vec![0u8; UD_GRH_BYTES as usize],
        };
        let mem = self.dev.mem.as_ref();
        let placed = Payload::Bytes(room)
            .scatter(mem, &sub_segs(&r.segs, 0, grh))
            .and_then(|()| pkt.payload.scatter(mem, &sub_segs(&r.segs, grh, len)));
        if placed.is_err() {
            self.dev.stats.dma_faults += 1;
            self.fail_recv(r.wr_id, WcError::LocProt);
            return self.enter_error();
        }
        // The partition it came in: QP1's (or QP0's) answer goes back in it (ib_mad takes
        // the index).
        let pkey_index = if self.qpn <= GSI_QPN {
            crate::partition::entry_admitting(&self.dev.pkeys, pkt.pkey).unwrap_or(0) as u16
        } else {
            self.qp.attr.pkey_index
        };
        let cqe = HcaCqe {
            wr_id: r.wr_id,
            byte_len: (grh + len) as u32,
            imm: pkt.imm.unwrap_or(0),
            qpn: self.qpn,
            src_qp: pkt.src_qpn,
            slid: pkt.slid,
            pkey_index,
            opcode: CQE_OP_RECV as u8,
            flags: (if pkt.imm.is_some() { CQE_FLAG_IMM } else { 0 }
                | if pkt.grh().is_some() { CQE_FLAG_GRH } else { 0 }) as u8,
            ..Default::default()
        };
        self.post_recv_cqe(cqe, pkt.solicited);
    }
}

/// A masked compare-and-swap's new value: `swap`'s bits under `swap_mask` when `orig` and
/// `compare` agree under `compare_mask`, else `orig` unchanged.
pub(crate) fn masked_cmp_swap(
    orig: u64,
    compare: u64,
    swap: u64,
    compare_mask: u64,
    swap_mask: u64,
) -> u64 {
    if (orig ^ compare) & compare_mask == 0 {
        (orig & !swap_mask) | (swap & swap_mask)
    } else {
        orig
    }
}

/// `a + b` as fields added side by side: a set bit of `boundaries` is a field's top bit,
/// and the carry out of it is dropped (0: one 64-bit field).
pub(crate) fn fields_add(a: u64, b: u64, boundaries: u64) -> u64 {
    if boundaries == 0 {
        return a.wrapping_add(b);
    }
    // Each field's bits: from just above the previous boundary to its own.
    let mut sum = 0u64;
    let mut low = 0u32;
    let mut rest = boundaries;
    while low < 64 {
        let top = if rest == 0 { 63 } else { rest.trailing_zeros() };
        let width = top - low + 1;
        let mask = if width == 64 {
            !0
        } else {
            ((1u64 << width) - 1) << low
        };
        sum |= ((a & mask).wrapping_add(b & mask)) & mask;
        rest &= rest.wrapping_sub(1); // this boundary done
        low = top + 1;
    }
    sum
}

/// The response to atomic request `req`, carrying the original value.
fn atomic_ack(qpn: u32, pkey: u16, req: &Packet, orig: u64) -> Packet {
    Packet {
        dlid: req.slid,
        opcode: RC_ATOMIC_ACK,
        pkey,
        dest_qpn: req.src_qpn,
        src_qpn: qpn,
        psn: req.psn,
        aeth: Some((AETH_ACK, 0)),
        rare: RareHeaders {
            atomic_ack: Some(orig),
            ..Default::default()
        }
        .boxed(),
        ..Default::default()
    }
}

impl HcaState {
    /// Ends a burst of deliveries: each QP's held ACK goes out.
    pub(crate) fn send_held_acks(&mut self) {
        let mut list = std::mem::take(&mut self.dev.turn.held_acks);
        for &qpn in &list {
            if let Some(mut e) = self.engine(qpn) {
                e.qp.held_ack_listed = false;
                e.send_held_ack();
            }
        }
        list.clear();
        if self.dev.turn.held_acks.is_empty() {
            self.dev.turn.held_acks = list; // keeps its capacity
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fields_add, masked_cmp_swap};

    #[test]
    fn test_a_masked_compare_and_swap_compares_and_swaps_only_the_masked_bits() {
        // Equal under the compare mask (the high half), though not in the low half: the
        // swap mask's bits (the low byte) take the swap value's, the rest stay.
        let orig = 0x1234_5678_0000_00aa;
        assert_eq!(
            masked_cmp_swap(
                orig,
                0x1234_5678_ffff_ffff,
                0xffff_ffff_ffff_ff55,
                !0 << 32,
                0xff
            ),
            0x1234_5678_0000_0055
        );
        // One compared bit differs: no swap.
        assert_eq!(
            masked_cmp_swap(orig, 0x1234_5679_0000_00aa, 0x55, !0 << 32, !0),
            orig
        );
        // All bits compared and swapped: the plain compare-and-swap.
        assert_eq!(masked_cmp_swap(7, 7, 9, !0, !0), 9);
        assert_eq!(masked_cmp_swap(7, 8, 9, !0, !0), 7);
    }

    #[test]
    fn test_a_masked_fetch_and_add_drops_each_fields_carry() {
        // No boundary: one 64-bit field, wrapping.
        assert_eq!(fields_add(u64::MAX, 2, 0), 1);
        // Two 32-bit fields (top bits 31 and 63): the low field's carry stays in it.
        let b = 1 << 31 | 1 << 63;
        assert_eq!(
            fields_add(0x0000_0001_ffff_ffff, 0x0000_0001_0000_0001, b),
            0x0000_0002_0000_0000
        );
        // Eight byte-wide counters, each incremented; 0xff wraps to 0 alone.
        let bytes = 0x8080_8080_8080_8080;
        assert_eq!(
            fields_add(0x00ff_0102_0304_0506, 0x0101_0101_0101_0101, bytes),
            0x0100_0203_0405_0607
        );
        // A boundary at bit 63 alone is the plain add.
        assert_eq!(fields_add(5, 6, 1 << 63), 11);
    }
}
