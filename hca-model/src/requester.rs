//! The send engine (requester side): reads send WQEs, checks them, cuts messages into
//! path-MTU packets, and completes WRs when their ACK or response arrives.
//!
//! A WR fails locally (bad opcode, too many SGEs, bad lkey, oversize) with the IB status and
//! the QP goes to ERR. Successful WRs produce a CQE only when signaled (per WR, or all WRs
//! when the QP was created with QP_FLAG_SIG_ALL): the paper's unsignaled sends.
//!
//! RC payloads reference the sender's memory until delivery (the WR completes only after its
//! ACK, so the buffer is still the consumer's to keep); UD payloads are copied at send time,
//! because a UD WR completes as soon as it is sent.

use crate::abi::*;
use crate::dma::read_obj;
use crate::fabric::{DropReason, Rejected};
use crate::hca::HcaState;
use crate::mr::{SgeList, Use};
use crate::packet::*;
use crate::qp::{cqe_op_of, qp_db, PendKind, Pending};
use crate::status::WcError;

/// Largest UD message: the port MTU.
const UD_MTU: u64 = 4096;

/// Where a WR's data comes from.
enum Source {
    Inline(Vec<u8>),
    Gather(SegList),
}

impl Source {
    /// The whole source as a payload.
    fn into_payload(self, st: &HcaState) -> Payload {
        match self {
            Source::Inline(b) => Payload::Bytes(b),
            Source::Gather(segs) => Payload::Dma {
                mem: st.mem.clone(),
                segs,
                grant: None,
            },
        }
    }
}

impl HcaState {
    /// Goes on with send queues that the last turn left work in; whether it did any.
    pub(crate) fn continue_send_queues(&mut self) -> bool {
        if !std::mem::take(&mut self.more_work) {
            return false;
        }
        self.stats.extra_turns += 1;
        self.scan_send_queues();
        true
    }

    /// DB_SQ: runs every QP's send queue.
    pub(crate) fn scan_send_queues(&mut self) {
        for i in 0..self.live_qps.len() {
            let Some(&qpn) = self.live_qps.get(i) else {
                break;
            };
            self.process_sq(qpn);
        }
    }

    /// Executes the WQEs posted to `qpn`'s send queue, as far as its state allows.
    pub(crate) fn process_sq(&mut self, qpn: u32) {
        loop {
            let Some(qp) = self.qps.get(qpn) else {
                return;
            };
            match u32::from(qp.attr.state) {
                QPS_RTS if !qp.sq_waits => {}
                QPS_ERR => return self.flush_queues(qpn),
                _ => return,
            }
            let pi = self.bar2.load_u32(qp_db(qpn));
            let posted = pi.wrapping_sub(qp.sq.ci);
            if posted == 0 {
                return;
            }
            if self.turn_left == 0 {
                self.more_work = true;
                return;
            }
            if posted > qp.sq.size() {
                return self.qp_fatal(qpn, ERR_WQ_INDEX);
            }
            let addr = qp.sq.slot(qp.sq.ci);
            let Ok(wqe) = read_obj::<HcaSendWqe>(self.mem.as_ref(), addr) else {
                return self.qp_fatal(qpn, ERR_RING_ACCESS);
            };
            if self.sq_must_wait(qpn, &wqe) {
                if let Some(qp) = self.qps.get_mut(qpn) {
                    qp.sq_waits = true;
                }
                return;
            }
            if let Some(qp) = self.qps.get_mut(qpn) {
                qp.sq.ci = qp.sq.ci.wrapping_add(1);
            }
            self.stats.wqes += 1;
            self.turn_left = self.turn_left.saturating_sub(1);
            if let Some((hook, now)) = self.adapter_hook() {
                if let Some(status) = hook.send_wqe(self.lid, qpn, now) {
                    return self.fail_wr(qpn, &wqe, status);
                }
            }
            if let Err(status) = self.execute_send(qpn, addr, &wqe) {
                return self.fail_wr(qpn, &wqe, status);
            }
        }
    }

    /// Whether `qpn`'s next WQE `wqe` must wait for WRs in flight to complete: a FENCE
    /// behind READs or atomics; a full send window (no more WRs in flight than the send
    /// queue holds, as a slot is the guest's again only at its completion); a READ or atomic
    /// beyond the QP's `max_rd_atomic` (at least one); or the device holding
    /// [`MAX_IN_FLIGHT_BYTES`] for requests in flight. A well-behaved guest meets only the
    /// last two; each wait ends when this QP's WRs complete.
    fn sq_must_wait(&self, qpn: u32, wqe: &HcaSendWqe) -> bool {
        let Some(qp) = self.qps.get(qpn) else {
            return true;
        };
        let op = u32::from(wqe.opcode);
        let read_like = matches!(op, WR_RDMA_READ | WR_ATOMIC_CMP_SWP | WR_ATOMIC_FETCH_ADD);
        let fence = u32::from(wqe.flags) & WQE_FENCE != 0 && qp.pending.fenced() > 0;
        let window = qp.pending.len() >= qp.sq.size() as usize;
        let credits = read_like
            && !qp.is_ud()
            && qp.pending.reads() >= usize::from(qp.attr.max_rd_atomic.max(1));
        // Only a QP that holds much itself looks at the device's total (the fast path stays
        // O(1)); it always has WRs in flight whose completions end its wait.
        let memory = qp.pending.bytes() >= MAX_IN_FLIGHT_BYTES / 64
            && self.in_flight_bytes() >= MAX_IN_FLIGHT_BYTES;
        fence || window || credits || memory
    }

    /// Host bytes every QP's WRs in flight hold.
    pub(crate) fn in_flight_bytes(&self) -> usize {
        self.live_qps
            .iter()
            .filter_map(|&q| self.qps.get(q))
            .map(|q| q.pending.bytes())
            .sum()
    }

    /// Completes a WR that failed locally with `status` (always, signaled or not), then ERR.
    /// Earlier WRs still in flight complete (flushed) before it, in order.
    fn fail_wr(&mut self, qpn: u32, wqe: &HcaSendWqe, status: WcError) {
        let Some(qp) = self.qps.get_mut(qpn) else {
            return;
        };
        let cqn = qp.send_cqn;
        let pending: Vec<Pending> = qp.pending.take_all();
        for p in pending {
            self.post_status(cqn, qpn, p.wr_id, p.cqe_op, WcError::WrFlush);
        }
        let op = cqe_op_of(wqe.opcode.into()).unwrap_or(CQE_OP_SEND);
        self.post_status(cqn, qpn, wqe.wr_id, op, status);
        self.qp_to_error(qpn);
    }

    fn execute_send(&mut self, qpn: u32, addr: u64, w: &HcaSendWqe) -> Result<(), WcError> {
        let qp = self.qps.get(qpn).ok_or(WcError::General)?;
        let op = u32::from(w.opcode);
        if op == WR_REG_MR {
            return self.execute_reg_mr(qpn, addr);
        }
        if op == WR_LOCAL_INV {
            let signaled = u32::from(w.flags) & WQE_SIGNALED != 0 || qp.sig_all;
            if !self.invalidate(qp.pdn, w.imm) {
                return Err(WcError::LocProt);
            }
            return self.complete_local(qpn, w.wr_id, CQE_OP_LOCAL_INV, signaled);
        }
        if op == WR_SEND_INV && qp.is_ud() {
            return Err(WcError::LocQpOp);
        }
        let cqe_op = cqe_op_of(op).ok_or(WcError::LocQpOp)?;
        let flags = u32::from(w.flags);
        let is_read_like = matches!(op, WR_RDMA_READ | WR_ATOMIC_CMP_SWP | WR_ATOMIC_FETCH_ADD);
        let (pdn, stride) = (qp.pdn, 1u32 << qp.sq.wqe_shift);
        let max_sge = qp.sq.max_sge(64);
        let src = if flags & WQE_INLINE != 0 {
            if is_read_like || w.inline_len > MAX_INLINE || 64 + w.inline_len > stride {
                return Err(WcError::LocQpOp);
            }
            let mut b = vec![0u8; w.inline_len as usize];
            self.mem
                .read(addr + 64, &mut b)
                .map_err(|_| WcError::LocQpOp)?;
            Source::Inline(b)
        } else {
            if u32::from(w.num_sge) > max_sge {
                return Err(WcError::LocQpOp);
            }
            let sges = self.read_sges(addr + 64, w.num_sge.into())?;
            let use_ = if is_read_like {
                Use::LocalWrite
            } else {
                Use::LocalRead
            };
            let mut segs = SegList::new();
            self.resolve_sges(&sges, pdn, use_, &mut segs)
                .map_err(|_| WcError::LocProt)?;
            self.turn_left = self.turn_left.saturating_sub(segs.len() as u64);
            Source::Gather(segs)
        };
        let len = match &src {
            Source::Inline(b) => b.len() as u64,
            Source::Gather(segs) => segs.iter().map(|s| u64::from(s.len)).sum(),
        };
        if len > u64::from(MAX_MSG_SIZE) {
            return Err(WcError::LocLen);
        }
        let signaled = flags & WQE_SIGNALED != 0 || qp.sig_all;
        if qp.is_ud() {
            return self.send_ud(qpn, w, src, len, signaled);
        }
        let pend = Pending {
            wr_id: w.wr_id,
            cqe_op,
            signaled,
            first_psn: 0,
            last_psn: 0,
            byte_len: len as u32,
            kind: PendKind::Ack,
            request: None,
            next_resp_psn: 0,
            reread_from: None,
        };
        match op {
            WR_RDMA_READ => self.send_read(qpn, w, src, len, pend),
            WR_ATOMIC_CMP_SWP | WR_ATOMIC_FETCH_ADD => self.send_atomic(qpn, w, src, len, pend),
            _ => self.send_rc_message(qpn, w, src, len, pend),
        }
    }

    /// WR_REG_MR: maps the MR now (later WRs may use it); completes in send order.
    fn execute_reg_mr(&mut self, qpn: u32, addr: u64) -> Result<(), WcError> {
        let w: HcaRegMrWqe = read_obj(self.mem.as_ref(), addr).map_err(|_| WcError::LocQpOp)?;
        let qp = self.qps.get(qpn).ok_or(WcError::General)?;
        let signaled = u32::from(w.flags) & WQE_SIGNALED != 0 || qp.sig_all;
        self.turn_left = self.turn_left.saturating_sub(u64::from(w.npages));
        self.fast_register(qp.pdn, &w)?;
        self.complete_local(qpn, w.wr_id, CQE_OP_REG_MR, signaled)
    }

    /// A local operation (REG_MR, LOCAL_INV), already done: it completes in send order, after
    /// the WRs before it that are still in flight.
    fn complete_local(
        &mut self,
        qpn: u32,
        wr_id: u64,
        cqe_op: u32,
        signaled: bool,
    ) -> Result<(), WcError> {
        let pend = Pending {
            wr_id,
            cqe_op,
            signaled,
            first_psn: 0,
            last_psn: 0,
            byte_len: 0,
            kind: PendKind::Local,
            request: None,
            next_resp_psn: 0,
            reread_from: None,
        };
        let qp = self.qps.get_mut(qpn).ok_or(WcError::General)?;
        let cqn = qp.send_cqn;
        if !qp.pending.is_empty() {
            qp.pending.push_back(pend);
        } else if signaled {
            self.post_cqe(cqn, ok_cqe(qpn, &pend), false);
        }
        Ok(())
    }

    /// Completes the local operations that have reached the front of the pending list.
    fn complete_locals(&mut self, qpn: u32) {
        loop {
            let Some(qp) = self.qps.get_mut(qpn) else {
                return;
            };
            if !qp
                .pending
                .front()
                .is_some_and(|p| matches!(p.kind, PendKind::Local))
            {
                return;
            }
            let Some(p) = qp.pending.pop_front() else {
                return;
            };
            let cqn = qp.send_cqn;
            if p.signaled {
                self.post_cqe(cqn, ok_cqe(qpn, &p), false);
            }
        }
    }

    pub(crate) fn read_sges(&self, addr: u64, n: u32) -> Result<SgeList, WcError> {
        (0..n)
            .map(|i| read_obj::<HcaSge>(self.mem.as_ref(), addr + 16 * u64::from(i)))
            .collect::<Result<_, _>>()
            .map_err(|_| WcError::LocQpOp)
    }

    fn rc_packet(&self, qpn: u32, opcode: u8, psn: u32) -> Result<Packet, WcError> {
        let qp = self.qps.get(qpn).ok_or(WcError::General)?;
        Ok(Packet {
            dlid: qp.attr.dlid,
            sl: qp.attr.sl,
            opcode,
            dest_qpn: qp.attr.dest_qpn,
            src_qpn: qpn,
            psn,
            ..Default::default()
        })
    }

    /// SEND, SEND_IMM, RDMA WRITE, RDMA WRITE_IMM: one message of `npk` packets.
    fn send_rc_message(
        &mut self,
        qpn: u32,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        mut pend: Pending,
    ) -> Result<(), WcError> {
        let op = u32::from(w.opcode);
        let (mtu, first_psn) = {
            let qp = self.qps.get(qpn).ok_or(WcError::General)?;
            (u64::from(qp.mtu()), qp.next_psn)
        };
        let write = matches!(op, WR_RDMA_WRITE | WR_RDMA_WRITE_IMM);
        let imm = matches!(op, WR_SEND_IMM | WR_RDMA_WRITE_IMM);
        let mut head = self.rc_packet(qpn, 0, first_psn)?;
        head.payload = src.into_payload(self);
        head.reth = write.then_some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: len as u32,
        });
        head.imm = imm.then_some(w.imm);
        head.ieth = (op == WR_SEND_INV).then_some(w.imm);
        head.solicited = u32::from(w.flags) & WQE_SOLICITED != 0;
        let kind = if write { RC_WRITE_ONLY } else { RC_SEND_ONLY };
        let train = Packet::message(head, kind, len, mtu as u32);
        let npk = train.span();
        pend.request = Some(train.clone());
        self.transmit_train(train);
        pend.first_psn = first_psn;
        pend.last_psn = psn_add(first_psn, npk - 1);
        self.push_pending(qpn, pend, npk);
        Ok(())
    }

    fn send_read(
        &mut self,
        qpn: u32,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        mut pend: Pending,
    ) -> Result<(), WcError> {
        let Source::Gather(dst) = src else {
            return Err(WcError::LocQpOp);
        };
        let (mtu, psn) = {
            let qp = self.qps.get(qpn).ok_or(WcError::General)?;
            (u64::from(qp.mtu()), qp.next_psn)
        };
        let npk = len.div_ceil(mtu).max(1) as u32;
        let mut pkt = self.rc_packet(qpn, RC_READ_REQUEST, psn)?;
        pkt.reth = Some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: len as u32,
        });
        pend.request = Some(pkt.clone());
        self.transmit(pkt);
        pend.first_psn = psn;
        pend.last_psn = psn_add(psn, npk - 1);
        pend.next_resp_psn = psn;
        pend.kind = PendKind::Read {
            dst,
            cursor: Default::default(),
        };
        self.push_pending(qpn, pend, npk);
        Ok(())
    }

    fn send_atomic(
        &mut self,
        qpn: u32,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        mut pend: Pending,
    ) -> Result<(), WcError> {
        let Source::Gather(dst) = src else {
            return Err(WcError::LocQpOp);
        };
        // The result lands in one 8-byte local buffer.
        let (8, [result]) = (len, dst.as_slice()) else {
            return Err(WcError::LocLen);
        };
        let result = *result;
        let psn = self.qps.get(qpn).ok_or(WcError::General)?.next_psn;
        let opcode = if u32::from(w.opcode) == WR_ATOMIC_CMP_SWP {
            RC_CMP_SWAP
        } else {
            RC_FETCH_ADD
        };
        let mut pkt = self.rc_packet(qpn, opcode, psn)?;
        pkt.reth = Some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: 8,
        });
        // CMP_SWAP: (swap, compare); FETCH_ADD: (add, unused).
        pkt.atomic = Some(if opcode == RC_CMP_SWAP {
            (w.swap, w.compare_add)
        } else {
            (w.compare_add, 0)
        });
        pend.request = Some(pkt.clone());
        self.transmit(pkt);
        pend.first_psn = psn;
        pend.last_psn = psn;
        pend.byte_len = 8;
        pend.kind = PendKind::Atomic { dst: result };
        self.push_pending(qpn, pend, 1);
        Ok(())
    }

    fn push_pending(&mut self, qpn: u32, pend: Pending, npk: u32) {
        if let Some(qp) = self.qps.get_mut(qpn) {
            qp.next_psn = psn_add(qp.next_psn, npk);
            qp.pending.push_back(pend);
        }
        self.arm_timer(qpn);
    }

    fn send_ud(
        &mut self,
        qpn: u32,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        signaled: bool,
    ) -> Result<(), WcError> {
        let op = u32::from(w.opcode);
        if !matches!(op, WR_SEND | WR_SEND_IMM) {
            return Err(WcError::LocQpOp);
        }
        if len > UD_MTU {
            return Err(WcError::LocLen);
        }
        let qp = self.qps.get(qpn).ok_or(WcError::General)?;
        // IB: a Q_Key with its high bit set means "use the QP's own".
        let qkey = if w.ud_qkey & 0x8000_0000 != 0 {
            qp.attr.qkey
        } else {
            w.ud_qkey
        };
        let mut payload = src.into_payload(self);
        payload.make_owned().map_err(|_| WcError::LocProt)?;
        let grh = self.multicast_grh(w.ud_dlid);
        let qp = self.qps.get(qpn).ok_or(WcError::General)?;
        let pkt = Packet {
            dlid: w.ud_dlid,
            grh,
            opcode: if op == WR_SEND_IMM {
                UD_SEND_ONLY_IMM
            } else {
                UD_SEND_ONLY
            },
            solicited: u32::from(w.flags) & WQE_SOLICITED != 0,
            dest_qpn: w.ud_remote_qpn & PSN_MASK,
            src_qpn: qpn,
            psn: qp.next_psn,
            imm: (op == WR_SEND_IMM).then_some(w.imm),
            qkey,
            payload,
            ..Default::default()
        };
        let cqn = qp.send_cqn;
        if let Some(qp) = self.qps.get_mut(qpn) {
            qp.next_psn = psn_add(qp.next_psn, 1);
        }
        self.transmit(pkt);
        if signaled {
            let cqe = HcaCqe {
                wr_id: w.wr_id,
                byte_len: len as u32,
                qpn,
                opcode: CQE_OP_SEND as u8,
                ..Default::default()
            };
            self.post_cqe(cqn, cqe, false);
        }
        Ok(())
    }

    /// An ACK, NAK, read response or atomic response for requester `qpn`.
    pub(crate) fn on_response(&mut self, pkt: Packet) -> Result<(), Rejected> {
        let qpn = pkt.dest_qpn;
        let qp = self.qps.get(qpn).ok_or(Rejected)?;
        if qp.is_ud() || pkt.slid != qp.attr.dlid || pkt.src_qpn != qp.attr.dest_qpn {
            return Err(Rejected);
        }
        if u32::from(qp.attr.state) != QPS_RTS {
            return Ok(()); // Late response to a QP that moved on: ignored, as hardware does.
        }
        let mtu = u64::from(qp.mtu());
        match pkt.opcode {
            RC_ACK => {
                let (syndrome, _msn) = pkt.aeth.unwrap_or((AETH_ACK, 0));
                if syndrome == AETH_ACK {
                    self.complete_acked(qpn, pkt.psn);
                } else if syndrome == AETH_NAK_PSN_SEQ || syndrome & 0xe0 == AETH_RNR_NAK {
                    self.on_retry_nak(qpn, syndrome, pkt.psn);
                } else {
                    self.fail_front(qpn, nak_status(syndrome));
                }
            }
            RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY => self.on_read_response(qpn, pkt, mtu),
            RC_ATOMIC_ACK => self.on_atomic_ack(qpn, pkt),
            _ => return Err(Rejected),
        }
        self.resume_sq(qpn);
        Ok(())
    }

    /// Completes, in order, every ACK-awaiting WR up to and including `psn`.
    pub(crate) fn complete_acked(&mut self, qpn: u32, psn: u32) {
        let mut done_any = false;
        loop {
            let Some(qp) = self.qps.get_mut(qpn) else {
                return;
            };
            let done = qp.pending.front().is_some_and(|p| match p.kind {
                PendKind::Ack => psn_le(p.last_psn, psn),
                PendKind::Local => true,
                _ => false,
            });
            if !done {
                break;
            }
            let Some(p) = qp.pending.pop_front() else {
                break;
            };
            done_any = true;
            let cqn = qp.send_cqn;
            if p.signaled {
                self.post_cqe(cqn, ok_cqe(qpn, &p), false);
            }
        }
        if done_any {
            self.progress(qpn);
        }
    }

    fn on_read_response(&mut self, qpn: u32, pkt: Packet, mtu: u64) {
        let mem = self.mem.clone();
        let Some(qp) = self.qps.get_mut(qpn) else {
            return;
        };
        let Some(front) = qp.pending.front_mut() else {
            return;
        };
        let PendKind::Read { dst, cursor } = &mut front.kind else {
            return; // A response nobody asked for: dropped.
        };
        // In order only: a duplicate is ignored; one past a gap means the responses before
        // it were lost, so the read is asked again from the first missing PSN at once (an
        // implied sequence NAK), once per gap; no retry is spent and the timer runs on.
        if pkt.psn != front.next_resp_psn || !psn_le(pkt.psn, front.last_psn) {
            let from = front.next_resp_psn;
            let gap = psn_le(from, pkt.psn) && psn_le(pkt.psn, front.last_psn);
            if gap && front.reread_from != Some(from) {
                front.reread_from = Some(from);
                self.stats.read_gaps += 1;
                self.resend_from(qpn, from, self.now(), false);
            }
            return;
        }
        front.next_resp_psn = psn_add(pkt.psn, pkt.span());
        let off = u64::from(pkt.psn.wrapping_sub(front.first_psn) & PSN_MASK) * mtu;
        let ends = pkt.ends_message();
        let n = u64::from(pkt.payload.len());
        if off + n > u64::from(front.byte_len) {
            return self.fail_front(qpn, WcError::BadResp);
        }
        if pkt.payload.is_revoked() {
            // The responder's MR went while this response was on the wire: its bytes are
            // not read. Lost, as far as the requester can tell: it asks again, and the
            // responder now answers with a remote access error.
            self.stats.revoked += 1;
            front.next_resp_psn = pkt.psn;
            return;
        }
        let target = cursor.cut(dst, off, n);
        if pkt.payload.scatter(mem.as_ref(), &target).is_err() {
            self.stats.dma_faults += 1;
            return self.fail_front(qpn, WcError::LocProt);
        }
        if ends {
            self.complete_front(qpn);
        } else {
            self.progress(qpn);
        }
    }

    fn on_atomic_ack(&mut self, qpn: u32, pkt: Packet) {
        let Some(qp) = self.qps.get(qpn) else {
            return;
        };
        let Some(PendKind::Atomic { dst }) = qp.pending.front().map(|p| &p.kind) else {
            return;
        };
        let orig = pkt.atomic_ack.unwrap_or(0);
        if self.mem.write(dst.addr, &orig.to_le_bytes()).is_err() {
            self.stats.dma_faults += 1;
            return self.fail_front(qpn, WcError::LocProt);
        }
        self.complete_front(qpn);
    }

    fn complete_front(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get_mut(qpn) else {
            return;
        };
        let Some(p) = qp.pending.pop_front() else {
            return;
        };
        let cqn = qp.send_cqn;
        if p.signaled {
            self.post_cqe(cqn, ok_cqe(qpn, &p), false);
        }
        self.progress(qpn);
    }

    /// The oldest outstanding WR failed remotely (or can never finish): it completes with
    /// `status` and the QP goes to ERR, flushing the rest.
    pub(crate) fn fail_front(&mut self, qpn: u32, status: WcError) {
        let Some(qp) = self.qps.get_mut(qpn) else {
            return;
        };
        let cqn = qp.send_cqn;
        let Some(p) = qp.pending.pop_front() else {
            return self.qp_to_error(qpn);
        };
        let mut cqe = ok_cqe(qpn, &p);
        cqe.status = status.code() as u8;
        self.post_cqe(cqn, cqe, false);
        self.qp_to_error(qpn);
    }

    /// After WRs completed: a send queue that waited for them looks again (and waits
    /// again if it still must).
    fn resume_sq(&mut self, qpn: u32) {
        self.complete_locals(qpn);
        let Some(qp) = self.qps.get_mut(qpn) else {
            return;
        };
        if qp.sq_waits {
            qp.sq_waits = false;
            self.process_sq(qpn);
        }
    }

    /// One of our packets reached no receiver. UD: counted. RC: lost on a link (a fault),
    /// the transport timer resends it. RC request with no route or refused by the receiving
    /// QP: every resend would meet the same fate, so the WR ends now as it would once the
    /// retries ran out (WcError::RetryExc) and the QP goes to ERR.
    pub(crate) fn bounced(&mut self, pkt: Packet, why: DropReason) {
        if pkt.is_ud() {
            self.stats.ud_dropped += 1;
            return;
        }
        self.stats.rc_dropped += 1;
        if !pkt.is_request() || why == DropReason::Hook {
            return;
        }
        let qpn = pkt.src_qpn;
        let live = self
            .qps
            .get(qpn)
            .is_some_and(|q| !q.is_ud() && u32::from(q.attr.state) == QPS_RTS);
        if live {
            self.stats.retry_exceeded += 1;
            self.fail_front(qpn, WcError::RetryExc);
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

fn ok_cqe(qpn: u32, p: &Pending) -> HcaCqe {
    HcaCqe {
        wr_id: p.wr_id,
        byte_len: p.byte_len,
        qpn,
        opcode: p.cqe_op as u8,
        status: WC_SUCCESS as u8,
        ..Default::default()
    }
}
