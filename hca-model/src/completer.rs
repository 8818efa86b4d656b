//! The completer (requester side, incoming): ACKs, NAKs, read responses and atomic
//! responses for WRs this QP sent, which complete those WRs in send order.
//!
//! An ACK completes every WR up to its PSN; a read completes when its last response is
//! scattered into the local buffer, an atomic when its original value is written there. A
//! NAK that names an outstanding request acknowledges the WRs before it; a fatal one fails
//! the WR it names (the oldest left) and the QP goes to ERR (a NAK for a request already
//! done is ignored); sequence and RNR NAKs are retried
//! (reliability.rs). Completions end the waits of a send queue that was held (a FENCE,
//! credits, the window), which then goes on.

use crate::abi::*;
use crate::fabric::{DropReason, Rejected};
use crate::hca::{Device, HcaState};
use crate::packet::*;
use crate::qp::{PendKind, Pending, QpEngine};
use crate::status::WcError;

impl HcaState {
    /// A response packet for requester QP `pkt.dest_qpn`.
    pub(crate) fn on_response(&mut self, pkt: Packet) -> Result<(), Rejected> {
        match self.engine(pkt.dest_qpn) {
            Some(e) if !e.admits(&pkt) => {
                e.dev.stats.pkey_violations += 1;
                Ok(())
            }
            Some(mut e) => e.on_response(pkt),
            None => Err(Rejected::of(pkt)),
        }
    }

    /// One of our packets reached no receiver. UD: counted. RC: lost on a link (a fault),
    /// the transport timer resends it. RC request with no route or refused by the receiving
    /// QP: every resend would meet the same fate, so the WR ends now as it would once the
    /// retries ran out (WcError::RetryExc) and the QP goes to ERR.
    pub(crate) fn bounced(&mut self, pkt: Packet, why: DropReason) {
        self.dev.stats.xmit_discards += u64::from(why == DropReason::NoRoute);
        if pkt.is_ud() {
            self.dev.stats.ud_dropped += 1;
            return;
        }
        if pkt.uc {
            // Nothing waits for it: UC's WR completed as it was sent.
            self.dev.stats.uc_dropped += 1;
            return;
        }
        self.dev.stats.rc_dropped += 1;
        if !pkt.is_request() {
            return self.answer_bounced(&pkt, why);
        }
        if matches!(why, DropReason::Hook | DropReason::Unrouted) {
            return;
        }
        let Some(mut e) = self.engine(pkt.src_qpn) else {
            return;
        };
        if !e.qp.is_ud() && u32::from(e.qp.attr.state) == QPS_RTS {
            e.dev.stats.retry_exceeded += 1;
            e.fail_front(WcError::RetryExc);
        }
    }
}

impl QpEngine<'_> {
    /// An ACK, NAK, read response or atomic response for this QP.
    fn on_response(&mut self, pkt: Packet) -> Result<(), Rejected> {
        let qp = &*self.qp;
        if qp.qp_type != QPT_RC || pkt.slid != qp.attr.dlid || pkt.src_qpn != qp.attr.dest_qpn {
            return Err(Rejected::of(pkt));
        }
        if u32::from(qp.attr.state) != QPS_RTS {
            return Ok(()); // Late response to a QP that moved on: ignored, as hardware does.
        }
        match pkt.opcode {
            RC_ACK => {
                let (syndrome, _msn) = pkt.aeth.unwrap_or((AETH_ACK, 0));
                if syndrome == AETH_ACK {
                    self.complete_acked(pkt.psn);
                    // Only a read still in flight can be missing responses.
                    if self.qp.pending.reads() > 0 {
                        self.read_gap_before(pkt.psn);
                    }
                } else if !self.outstanding(pkt.psn) {
                    // A NAK for a request already done, or never sent: nothing to act on.
                } else if syndrome == AETH_NAK_PSN_SEQ || syndrome & 0xe0 == AETH_RNR_NAK {
                    self.on_retry_nak(syndrome, pkt.psn);
                } else {
                    // A NAK acknowledges every request before the one it names, whatever
                    // became of their ACKs; the WR it names fails.
                    self.complete_acked(psn_add(pkt.psn, PSN_MASK)); // psn - 1
                    self.fail_front(nak_status(syndrome));
                }
            }
            RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY => self.on_read_response(pkt),
            RC_ATOMIC_ACK => self.on_atomic_ack(pkt),
            _ => return Err(Rejected::of(pkt)),
        }
        self.resume_sq();
        Ok(())
    }

    /// Whether `psn` names a request still waiting for its answer: from the first PSN of
    /// the oldest WR sent and not complete to the last PSN sent. A NAK that names anything
    /// else answers a request already done (a duplicate the responder saw again after the
    /// requester moved on: a READ whose MR was deregistered since is NAKed) or one never
    /// sent; IB's requester ignores responses outside its window. Acted on, it would fail
    /// or resend whatever WR is at the front now.
    fn outstanding(&self, psn: u32) -> bool {
        let oldest = self
            .qp
            .pending
            .iter()
            .find(|p| !matches!(p.kind, PendKind::Local));
        let last_sent = psn_add(self.qp.next_psn, PSN_MASK);
        oldest.is_some_and(|p| psn_le(p.first_psn, psn) && psn_le(psn, last_sent))
    }

    /// Completes, in order, every ACK-awaiting WR up to and including `psn`.
    pub(crate) fn complete_acked(&mut self, psn: u32) {
        let done_any = self.complete_while(|p| match p.kind {
            PendKind::Ack => psn_le(p.last_psn, psn),
            PendKind::Local => true,
            _ => false,
        });
        if done_any {
            self.progress();
        }
    }

    /// Completes, in order, the WRs at the front that `done` says are done; whether any.
    fn complete_while(&mut self, done: impl Fn(&Pending) -> bool) -> bool {
        let mut any = false;
        while let Some(p) = self.qp.pending.front().filter(|p| done(p)) {
            any = true;
            post_ok(self.dev, self.qp.send_cqn, self.qpn, p);
            self.drop_front();
        }
        any
    }

    fn on_read_response(&mut self, pkt: Packet) {
        let mtu = u64::from(self.qp.mtu());
        let Some(front) = self.qp.pending.front_mut() else {
            return;
        };
        let PendKind::Read { dst, cursor } = &mut front.kind else {
            return; // A response nobody asked for: dropped.
        };
        // In order only: a duplicate is ignored; one past the next expected shows a gap.
        if pkt.psn != front.next_resp_psn || !psn_le(pkt.psn, front.last_psn) {
            return self.read_gap_before(pkt.psn);
        }
        front.next_resp_psn = psn_add(pkt.psn, pkt.span());
        let off = u64::from(pkt.psn.wrapping_sub(front.first_psn) & PSN_MASK) * mtu;
        let n = u64::from(pkt.payload.len());
        if off + n > u64::from(front.byte_len) {
            return self.fail_front(WcError::BadResp);
        }
        if pkt.payload.is_revoked() {
            // The responder's MR went while this response was on the wire: its bytes are
            // not read. Lost, as far as the requester can tell: it asks again, and the
            // responder now answers with a remote access error.
            self.dev.stats.revoked += 1;
            front.next_resp_psn = pkt.psn;
            return;
        }
        let target = cursor.cut(dst, off, n);
        if pkt.payload.scatter(self.dev.mem.as_ref(), &target).is_err() {
            self.dev.stats.dma_faults += 1;
            return self.fail_front(WcError::LocProt);
        }
        if pkt.ends_message() {
            self.complete_front();
        } else {
            self.progress();
        }
    }

    /// A response or ACK naming `psn`, past the next response the front read expects,
    /// shows that the responses between were lost (the responder answers in order: for a
    /// later read's response, or an ACK past the read, IB's implied NAK). The read is asked
    /// again from the first missing PSN at once, once per gap; no retry is spent and the
    /// timer runs on.
    fn read_gap_before(&mut self, psn: u32) {
        let asked = psn_add(self.qp.next_psn, PSN_MASK); // the last request PSN sent
        let Some(front) = self.qp.pending.front_mut() else {
            return;
        };
        let from = front.next_resp_psn;
        let past = psn_le(from, psn) && psn != from && psn_le(psn, asked);
        if !matches!(front.kind, PendKind::Read { .. }) || !past {
            return;
        }
        if front.reread_from != Some(from) {
            front.reread_from = Some(from);
            self.dev.stats.read_gaps += 1;
            let now = self.dev.transport_now();
            self.resend_from(from, now, false);
        }
    }

    fn on_atomic_ack(&mut self, pkt: Packet) {
        let Some(PendKind::Atomic { dst }) = self.qp.pending.front().map(|p| &p.kind) else {
            return;
        };
        let orig = pkt.atomic_ack().unwrap_or(0);
        if self.dev.mem.write(dst.addr, &orig.to_le_bytes()).is_err() {
            self.dev.stats.dma_faults += 1;
            return self.fail_front(WcError::LocProt);
        }
        self.complete_front();
    }

    /// Drops the oldest WR, which has completed; its request's gather list goes back to
    /// the device's pool.
    fn drop_front(&mut self) {
        if let Some(req) = self.qp.pending.drop_front() {
            self.dev.gathers.recycle(&self.dev.mem, req.payload);
        }
    }

    fn complete_front(&mut self) {
        let Some(p) = self.qp.pending.front() else {
            return;
        };
        post_ok(self.dev, self.qp.send_cqn, self.qpn, p);
        self.drop_front();
        self.progress();
    }

    /// The oldest outstanding WR failed remotely (or can never finish): it completes with
    /// `status` and the QP goes to ERR, flushing the rest.
    pub(crate) fn fail_front(&mut self, status: WcError) {
        if let Some(p) = self.qp.pending.pop_front() {
            let mut cqe = ok_cqe(self.qpn, &p);
            cqe.status = status.code() as u8;
            self.dev.post_cqe(self.qp.send_cqn, cqe, false);
        }
        self.enter_error();
    }

    /// After WRs completed: the local operations now at the front complete, and a send
    /// queue that waited looks again (and waits again if it still must).
    fn resume_sq(&mut self) {
        self.complete_while(|p| matches!(p.kind, PendKind::Local));
        if std::mem::take(&mut self.qp.sq_waits) {
            self.process_sq();
        }
    }
}

/// WC status for a fatal NAK's syndrome (RNR and sequence NAKs are retried, in
/// reliability.rs).
fn nak_status(syndrome: u8) -> WcError {
    match syndrome {
        AETH_NAK_INV_REQ => WcError::RemInvReq,
        AETH_NAK_REM_ACCESS => WcError::RemAccess,
        AETH_NAK_REM_OP => WcError::RemOp,
        _ => WcError::BadResp,
    }
}

/// A completed WR's CQE on `cqn`, if it was signaled.
fn post_ok(dev: &mut Device, cqn: u32, qpn: u32, p: &Pending) {
    if p.signaled {
        dev.post_cqe(cqn, ok_cqe(qpn, p), false);
    }
}

/// The successful CQE for sent WR `p`.
pub(crate) fn ok_cqe(qpn: u32, p: &Pending) -> HcaCqe {
    HcaCqe {
        wr_id: p.wr_id,
        byte_len: p.byte_len,
        qpn,
        opcode: p.cqe_op as u8,
        status: WC_SUCCESS as u8,
        ..Default::default()
    }
}
