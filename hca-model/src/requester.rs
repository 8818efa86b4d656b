//! The requester: reads send WQEs, checks them, and cuts messages into path-MTU packets.
//! Their ACKs and responses come back to the completer (completer.rs).
//!
//! A WR fails locally (bad opcode, too many SGEs, bad lkey, oversize) with the IB status and
//! the QP goes to ERR. Successful WRs produce a CQE only when signaled (per WR, or all WRs
//! when the QP was created with QP_FLAG_SIG_ALL): the paper's unsignaled sends.
//!
//! RC payloads reference the sender's memory until delivery (the WR completes only after its
//! ACK, so the buffer is still the consumer's to keep); UD and UC payloads are copied at send
//! time, because their WRs complete as soon as they are sent.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use vm_memory::ByteValued;

use crate::abi::*;
use crate::completer::ok_cqe;
use crate::dma::read_obj;
use crate::hca::{Device, HcaState, SqHint};
use crate::mr::Use;
use crate::packet::*;
use crate::qp::{cqe_op_of, PendKind, Pending, QpEngine};
use crate::snapshot::Snapshot;
use crate::status::WcError;

/// Largest UD message: the port MTU.
const UD_MTU: u64 = 4096;

/// Bytes of a datagram's copy that cost one unit of a turn's work (see `WORK_PER_TURN`).
const COPY_BYTES_PER_UNIT: u64 = 64;

/// Where a WR's data comes from.
enum Source {
    Inline(Vec<u8>),
    Gather(SegList),
}

impl Source {
    /// The whole source as a payload; one that stays in the sender's memory is reached
    /// under `grant` (the QP's, revoked when its WRs are flushed: see `InFlight`).
    fn into_payload(self, dev: &mut Device, len: u64, grant: &Arc<Grant>) -> Payload {
        match self {
            Source::Inline(b) => match SmallBytes::new(&b) {
                Some(small) => Payload::Small(small),
                None => Payload::Bytes(b),
            },
            Source::Gather(segs) if len <= SMALL_PAYLOAD as u64 => small_or_dma(dev, segs, grant),
            Source::Gather(segs) => dev.gathers.payload(&dev.mem, segs, grant),
        }
    }
}

/// A few bytes read now, or (if reading them faults) the gather list: the fault then shows,
/// as for any payload, when the receiver copies.
#[inline(never)]
fn small_or_dma(dev: &mut Device, segs: SegList, grant: &Arc<Grant>) -> Payload {
    match SmallBytes::gather(dev.mem.as_ref(), &segs) {
        Some(small) => Payload::Small(small),
        None => dev.gathers.payload(&dev.mem, segs, grant),
    }
}

impl HcaState {
    /// Goes on with send queues that the last turn left work in; whether it did any.
    pub(crate) fn continue_send_queues(&mut self) -> bool {
        if !std::mem::take(&mut self.dev.turn.more_work) {
            return false;
        }
        self.dev.stats.extra_turns += 1;
        self.scan_send_queues();
        true
    }

    /// Runs every live QP's send queue (after a send-doorbell ring overran, or for a turn
    /// that goes on with work left: see `sq_ring`). Each one is looked at first through its
    /// hint (`SqHint`): a QP that cannot send, or one in RTS whose producer index has not
    /// moved past the consumer index noted, is passed over on the hint table and its
    /// doorbell record alone, without touching the QP or starting its engine.
    pub(crate) fn scan_send_queues(&mut self) {
        self.dev.stats.sq_scans += 1;
        let mut from = 0;
        while let Some((i, qpn)) =
            next_sq_to_look(&self.sq_hints, &self.dev.bar2, &self.live_qps, from)
        {
            from = i + 1;
            self.run_send_queue(qpn);
        }
    }

    /// Like `scan_send_queues` for the QPs no send-doorbell ring names (those created
    /// without `QP_FLAG_SQ_RING`), which every send doorbell looks at.
    pub(crate) fn scan_unnamed_send_queues(&mut self) {
        let mut from = 0;
        while let Some((i, qpn)) =
            next_sq_to_look(&self.sq_hints, &self.dev.bar2, &self.sq_rings.unnamed, from)
        {
            from = i + 1;
            self.run_send_queue(qpn);
        }
    }

    /// Runs QP `qpn`'s send queue, and notes what a send doorbell would find of it next.
    pub(crate) fn run_send_queue(&mut self, qpn: u32) {
        let Some(mut e) = self.engine(qpn) else {
            return;
        };
        e.process_sq();
        let hint = e.sq_hint();
        if let Some(h) = self.sq_hints.get_mut(qpn as usize) {
            *h = hint;
        }
    }
}

/// The index in `qpns`, from `from` on, and the QPN of the next QP whose hint does not say
/// its send queue has nothing to do. (A loop of its own: with no call in it that may change
/// the tables, it runs on borrowed slices, about 20 instructions per idle QP. Kept out of
/// line: inlined into `scan_send_queues`, as LTO did, its branches were laid out so that an
/// idle QP took 1 ns rather than 0.6, `throughput scale`, 512 idle QPs before the rings.)
#[inline(never)]
fn next_sq_to_look(
    hints: &[SqHint],
    bar2: &crate::devmem::DeviceMemory,
    qpns: &[u32],
    from: usize,
) -> Option<(usize, u32)> {
    let k = qpns
        .get(from..)?
        .iter()
        .position(|&qpn| match hints.get(qpn as usize) {
            Some(SqHint::Still) => false,
            Some(&SqHint::Idle { ci, db }) => bar2.load_u32(db) != ci,
            _ => true,
        })?;
    let i = from + k;
    Some((i, *qpns.get(i)?))
}

impl QpEngine<'_> {
    /// What a send doorbell would find of this QP now: mirrors `process_sq`'s first two
    /// returns (a state other than RTS or ERR, or RTS waiting; nothing posted).
    fn sq_hint(&self) -> SqHint {
        match u32::from(self.qp.attr.state) {
            QPS_RTS if self.qp.sq_waits => SqHint::Still,
            QPS_RTS => SqHint::Idle {
                ci: self.qp.sq.ci,
                db: self.qp.db,
            },
            QPS_ERR => SqHint::Look,
            _ => SqHint::Still,
        }
    }

    /// Executes the WQEs posted to this QP's send queue, as far as its state allows.
    pub(crate) fn process_sq(&mut self) {
        loop {
            match u32::from(self.qp.attr.state) {
                QPS_RTS if !self.qp.sq_waits => {}
                QPS_ERR => return self.flush_queues(),
                _ => return,
            }
            let pi = self.dev.bar2.load_u32(self.qp.db);
            let posted = pi.wrapping_sub(self.qp.sq.ci);
            if posted == 0 {
                return;
            }
            if self.dev.turn.work_left == 0 {
                self.dev.turn.more_work = true;
                return;
            }
            if posted > self.qp.sq.size() {
                return self.fatal(ERR_WQ_INDEX);
            }
            let addr = self.qp.sq.slot(self.qp.sq.ci);
            let stride = 1u32 << self.qp.sq.wqe_shift;
            let Ok((wqe, first)) = self.dev.read_wqe_head::<HcaSendWqe>(addr, stride) else {
                return self.fatal(ERR_RING_ACCESS);
            };
            if self.sq_must_wait(&wqe) {
                self.qp.sq_waits = true;
                return;
            }
            if self.dev.held.load(Ordering::Relaxed) >= self.dev.in_flight_budget {
                return self.wait_for_memory();
            }
            self.qp.sq.ci = self.qp.sq.ci.wrapping_add(1);
            self.dev.stats.wqes += 1;
            self.dev.turn.work_left = self.dev.turn.work_left.saturating_sub(1);
            if let Some((hook, now)) = self.dev.adapter_hook() {
                if let Some(status) = hook.send_wqe(self.dev.lid, self.qpn, now) {
                    return self.fail_wr(&wqe, status);
                }
            }
            if let Err(status) = self.execute_send(addr, &wqe, first) {
                return self.fail_wr(&wqe, status);
            }
        }
    }

    /// Whether the next WQE `wqe` must wait for WRs in flight to complete: a FENCE behind
    /// READs or atomics; a full send window (no more WRs in flight than the send queue
    /// holds, as a slot is the guest's again only at its completion); a READ or atomic
    /// beyond the QP's `max_rd_atomic` (at least one); or the device holding
    /// [`MAX_IN_FLIGHT_BYTES`] for requests in flight. A well-behaved guest meets only the
    /// last two; each wait ends when this QP's WRs complete.
    fn sq_must_wait(&self, wqe: &HcaSendWqe) -> bool {
        let qp = &*self.qp;
        let op = u32::from(wqe.opcode);
        let read_like = is_read_like(op);
        let fence = u32::from(wqe.flags) & WQE_FENCE != 0 && qp.pending.fenced() > 0;
        let window = qp.pending.len() >= qp.sq.size() as usize;
        let credits = read_like
            && !qp.is_ud()
            && qp.pending.reads() >= usize::from(qp.attr.max_rd_atomic.max(1));
        fence || window || credits
    }

    /// The device holds its bound for requests in flight ([`MAX_IN_FLIGHT_BYTES`]): this
    /// send queue waits, whatever it holds itself (each QP that went on by one WR would
    /// take the device past its bound by a WR per QP), until WRs complete anywhere on the
    /// device (the end of that turn wakes it: see `Device::mem_waiters`).
    #[cold]
    fn wait_for_memory(&mut self) {
        self.qp.sq_waits = true;
        if !std::mem::replace(&mut self.qp.mem_waits, true) {
            self.dev.mem_waiters.push(self.qpn);
        }
    }

    /// Completes a WR that failed locally with `status` (always, signaled or not), then ERR.
    /// Earlier WRs still in flight complete (flushed) before it, in order.
    fn fail_wr(&mut self, wqe: &HcaSendWqe, status: WcError) {
        let (qpn, cqn) = (self.qpn, self.qp.send_cqn);
        for p in self.qp.pending.take_all() {
            self.dev
                .post_status(cqn, qpn, p.wr_id, p.cqe_op, WcError::WrFlush);
        }
        let op = cqe_op_of(wqe.opcode.into()).unwrap_or(CQE_OP_SEND);
        self.dev.post_status(cqn, qpn, wqe.wr_id, op, status);
        self.enter_error();
    }

    /// `first`: the SGE after the header, if read with it.
    fn execute_send(
        &mut self,
        addr: u64,
        w: &HcaSendWqe,
        first: Option<HcaSge>,
    ) -> Result<(), WcError> {
        let op = u32::from(w.opcode);
        if op == WR_REG_MR {
            return self.execute_reg_mr(addr);
        }
        if op == WR_BIND_MW {
            return self.execute_bind_mw(addr);
        }
        let (pdn, sig_all, is_ud) = (self.qp.pdn, self.qp.sig_all, self.qp.is_ud());
        let flags = u32::from(w.flags);
        let signaled = flags & WQE_SIGNALED != 0 || sig_all;
        if op == WR_LOCAL_INV {
            if !self.dev.invalidate(pdn, w.imm) {
                return Err(WcError::LocProt);
            }
            self.complete_local(w.wr_id, CQE_OP_LOCAL_INV, signaled);
            return Ok(());
        }
        if op == WR_SEND_INV && is_ud {
            return Err(WcError::LocQpOp);
        }
        let cqe_op = cqe_op_of(op).ok_or(WcError::LocQpOp)?;
        let is_read_like = is_read_like(op);
        let stride = 1u32 << self.qp.sq.wqe_shift;
        let max_sge = self.qp.sq.max_sge(64);
        let src = if flags & WQE_INLINE != 0 {
            if is_read_like || w.inline_len > MAX_INLINE || 64 + w.inline_len > stride {
                return Err(WcError::LocQpOp);
            }
            let mut b = vec![0u8; w.inline_len as usize];
            self.dev
                .mem
                .read(addr + 64, &mut b)
                .map_err(|_| WcError::LocQpOp)?;
            Source::Inline(b)
        } else {
            if u32::from(w.num_sge) > max_sge {
                return Err(WcError::LocQpOp);
            }
            let use_ = if is_read_like {
                Use::LocalWrite
            } else {
                Use::LocalRead
            };
            let mut segs = SegList::new();
            self.dev.gather_sges(
                addr + 64,
                w.num_sge.into(),
                first,
                (pdn, use_),
                &mut segs,
                u64::MAX,
            )?;
            self.dev.turn.work_left = self.dev.turn.work_left.saturating_sub(segs.len() as u64);
            Source::Gather(segs)
        };
        let len = match &src {
            Source::Inline(b) => b.len() as u64,
            Source::Gather(segs) => segs.iter().map(|s| u64::from(s.len)).sum(),
        };
        if len > u64::from(MAX_MSG_SIZE) {
            return Err(WcError::LocLen);
        }
        if is_ud {
            return self.send_ud(w, src, len, signaled);
        }
        if self.qp.is_uc() {
            return self.send_uc(w, src, len, signaled);
        }
        let pend = Pending {
            wr_id: w.wr_id,
            cqe_op,
            signaled,
            first_psn: 0,
            last_psn: 0,
            byte_len: len as u32,
            kind: PendKind::Ack,
            next_resp_psn: 0,
            reread_from: None,
        };
        match op {
            WR_RDMA_READ => self.send_read(w, src, len, pend),
            _ if is_atomic(op) => self.send_atomic(w, src, len, pend),
            WR_ATOMIC_WRITE => self.send_atomic_write(w, pend),
            _ => self.send_rc_message(w, src, len, pend),
        }
    }

    /// WR_REG_MR: maps the MR now (later WRs may use it); completes in send order.
    fn execute_reg_mr(&mut self, addr: u64) -> Result<(), WcError> {
        let w: HcaRegMrWqe = read_obj(self.dev.mem.as_ref(), addr).map_err(|_| WcError::LocQpOp)?;
        let signaled = u32::from(w.flags) & WQE_SIGNALED != 0 || self.qp.sig_all;
        self.dev.turn.work_left = self.dev.turn.work_left.saturating_sub(u64::from(w.npages));
        self.dev.fast_register(self.qp.pdn, &w)?;
        self.complete_local(w.wr_id, CQE_OP_REG_MR, signaled);
        Ok(())
    }

    /// WR_BIND_MW: binds the window now (later WRs' peers may use it); completes in send
    /// order. A UD QP binds no window.
    fn execute_bind_mw(&mut self, addr: u64) -> Result<(), WcError> {
        let w: HcaBindMwWqe =
            read_obj(self.dev.mem.as_ref(), addr).map_err(|_| WcError::LocQpOp)?;
        if self.qp.is_ud() {
            return Err(WcError::LocQpOp);
        }
        let signaled = u32::from(w.flags) & WQE_SIGNALED != 0 || self.qp.sig_all;
        self.dev.bind_window(self.qpn, self.qp.pdn, &w)?;
        self.complete_local(w.wr_id, CQE_OP_BIND_MW, signaled);
        Ok(())
    }

    /// A local operation (REG_MR, BIND_MW, LOCAL_INV), already done: it completes in send order, after
    /// the WRs before it that are still in flight.
    fn complete_local(&mut self, wr_id: u64, cqe_op: u32, signaled: bool) {
        let pend = Pending {
            wr_id,
            cqe_op,
            signaled,
            first_psn: 0,
            last_psn: 0,
            byte_len: 0,
            kind: PendKind::Local,
            next_resp_psn: 0,
            reread_from: None,
        };
        if !self.qp.pending.is_empty() {
            self.qp.pending.push_back(pend, None);
        } else if signaled {
            self.dev
                .post_cqe(self.qp.send_cqn, ok_cqe(self.qpn, &pend), false);
        }
    }

    /// An RC request packet to the connected peer.
    fn rc_packet(&self, opcode: u8, psn: u32) -> Packet {
        Packet {
            dlid: self.qp.attr.dlid,
            sl: self.qp.attr.sl,
            opcode,
            pkey: self.qp.pkey,
            dest_qpn: self.qp.attr.dest_qpn,
            src_qpn: self.qpn,
            psn,
            ..Default::default()
        }
    }

    /// SEND, SEND_IMM, RDMA WRITE, RDMA WRITE_IMM: one message of `npk` packets.
    fn send_rc_message(
        &mut self,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        mut pend: Pending,
    ) -> Result<(), WcError> {
        let first_psn = self.qp.next_psn;
        let payload = src.into_payload(self.dev, len, self.qp.pending.sends());
        let head = self.message_head(w, payload, len);
        let npk = head.span();
        let request = head.clone();
        self.dev.transmit_train(head);
        pend.first_psn = first_psn;
        pend.last_psn = psn_add(first_psn, npk - 1);
        self.push_pending(pend, request, npk);
        Ok(())
    }

    /// The train of a SEND or RDMA WRITE WR `w` (with immediate, or a SEND with
    /// invalidate) of `len` bytes, from the QP's next PSN: its headers on its first and
    /// last packets, cut at the path MTU.
    // Always inline: on every RC SEND's path, and the packet is built in place.
    #[inline(always)]
    fn message_head(&self, w: &HcaSendWqe, payload: Payload, len: u64) -> Packet {
        let op = u32::from(w.opcode);
        let write = matches!(op, WR_RDMA_WRITE | WR_RDMA_WRITE_IMM);
        let imm = matches!(op, WR_SEND_IMM | WR_RDMA_WRITE_IMM);
        let mut head = self.rc_packet(0, self.qp.next_psn);
        head.payload = payload;
        head.reth = write.then_some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: len as u32,
        });
        head.imm = imm.then_some(w.imm);
        head.ieth = (op == WR_SEND_INV).then_some(w.imm);
        head.solicited = u32::from(w.flags) & WQE_SOLICITED != 0;
        head.make_message(
            if write { RC_WRITE_ONLY } else { RC_SEND_ONLY },
            len,
            self.qp.mtu(),
        );
        head
    }

    /// UC: a SEND or RDMA WRITE (with or without immediate), cut into packets as RC's are,
    /// never acknowledged or resent. The WR completes as it goes out, so its bytes are
    /// copied now (see [`Snapshot`]): the copy counts against the device's bound on bytes
    /// in flight, which is why one larger than that whole bound is refused.
    fn send_uc(
        &mut self,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        signaled: bool,
    ) -> Result<(), WcError> {
        let op = u32::from(w.opcode);
        if !matches!(
            op,
            WR_SEND | WR_SEND_IMM | WR_RDMA_WRITE | WR_RDMA_WRITE_IMM
        ) {
            return Err(WcError::LocQpOp);
        }
        if len > self.dev.in_flight_budget as u64 {
            return Err(WcError::LocLen);
        }
        let payload = src.into_payload(self.dev, len, self.qp.pending.sends());
        let payload = Snapshot::take(payload, &self.dev.held).map_err(|_| WcError::LocProt)?;
        self.dev.turn.work_left = self
            .dev
            .turn
            .work_left
            .saturating_sub(len / COPY_BYTES_PER_UNIT);
        let mut head = self.message_head(w, payload, len);
        head.uc = true;
        self.qp.next_psn = psn_add(self.qp.next_psn, head.span());
        self.dev.transmit_train(head);
        if signaled {
            self.complete_sent(w.wr_id, op, len);
        }
        Ok(())
    }

    /// The CQE of a WR that completed as it was sent (UD, UC).
    fn complete_sent(&mut self, wr_id: u64, wr_op: u32, len: u64) {
        let cqe = HcaCqe {
            wr_id,
            byte_len: len as u32,
            qpn: self.qpn,
            opcode: cqe_op_of(wr_op).unwrap_or(CQE_OP_SEND) as u8,
            ..Default::default()
        };
        self.dev.post_cqe(self.qp.send_cqn, cqe, false);
    }

    fn send_read(
        &mut self,
        w: &HcaSendWqe,
        src: Source,
        len: u64,
        mut pend: Pending,
    ) -> Result<(), WcError> {
        let Source::Gather(dst) = src else {
            return Err(WcError::LocQpOp);
        };
        let (mtu, psn) = (u64::from(self.qp.mtu()), self.qp.next_psn);
        let npk = len.div_ceil(mtu).max(1) as u32;
        let mut pkt = self.rc_packet(RC_READ_REQUEST, psn);
        pkt.reth = Some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: len as u32,
        });
        let request = pkt.clone();
        self.dev.transmit(pkt);
        pend.first_psn = psn;
        pend.last_psn = psn_add(psn, npk - 1);
        pend.next_resp_psn = psn;
        pend.kind = PendKind::Read {
            dst,
            cursor: Default::default(),
        };
        self.push_pending(pend, request, npk);
        Ok(())
    }

    fn send_atomic(
        &mut self,
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
        let psn = self.qp.next_psn;
        let wr_op = u32::from(w.opcode);
        let opcode = if matches!(wr_op, WR_ATOMIC_CMP_SWP | WR_MASKED_CMP_SWP) {
            RC_CMP_SWAP
        } else {
            RC_FETCH_ADD
        };
        let mut pkt = self.rc_packet(opcode, psn);
        pkt.reth = Some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: 8,
        });
        // CMP_SWAP: (swap, compare); FETCH_ADD: (add, unused).
        pkt.rare_mut().atomic = Some(if opcode == RC_CMP_SWAP {
            (w.swap, w.compare_add)
        } else {
            (w.compare_add, 0)
        });
        if matches!(wr_op, WR_MASKED_CMP_SWP | WR_MASKED_FETCH_ADD) {
            // The masks sit where a send WQE has its UD fields.
            let mut m = HcaMaskedAtomicWqe::default();
            m.as_mut_slice().copy_from_slice(w.as_slice());
            pkt.rare_mut().atomic_masks = Some((m.compare_add_mask, m.swap_mask));
        }
        let request = pkt.clone();
        self.dev.transmit(pkt);
        pend.first_psn = psn;
        pend.last_psn = psn;
        pend.byte_len = 8;
        pend.kind = PendKind::Atomic { dst: result };
        self.push_pending(pend, request, 1);
        Ok(())
    }

    /// ATOMIC WRITE: the WQE's 8 bytes to the peer in one packet, ACKed as a WRITE is.
    fn send_atomic_write(&mut self, w: &HcaSendWqe, mut pend: Pending) -> Result<(), WcError> {
        let psn = self.qp.next_psn;
        let mut pkt = self.rc_packet(RC_ATOMIC_WRITE, psn);
        pkt.reth = Some(Reth {
            va: w.remote_addr,
            rkey: w.rkey,
            len: 8,
        });
        let data = w.compare_add.to_le_bytes();
        pkt.payload = SmallBytes::new(&data).map_or(Payload::Empty, Payload::Small);
        let request = pkt.clone();
        self.dev.transmit(pkt);
        (pend.first_psn, pend.last_psn, pend.byte_len) = (psn, psn, 8);
        self.push_pending(pend, request, 1);
        Ok(())
    }

    // Always inline: the WR's `Pending` and kept request move into the window once.
    #[inline(always)]
    fn push_pending(&mut self, pend: Pending, request: Packet, npk: u32) {
        self.qp.next_psn = psn_add(self.qp.next_psn, npk);
        self.qp.pending.push_back(pend, Some(request));
        self.arm_timer();
    }

    fn send_ud(
        &mut self,
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
        // IB: a Q_Key with its high bit set means "use the QP's own".
        let qkey = if w.ud_qkey & 0x8000_0000 != 0 {
            self.qp.attr.qkey
        } else {
            w.ud_qkey
        };
        // QP1 (and QP0) send each MAD in the partition its WR names; other QPs in their
        // own.
        let pkey = if self.qpn <= GSI_QPN {
            let entry = self.dev.pkeys.get(usize::from(w.ud_pkey_index)).copied();
            entry.filter(|&k| k & 0x7fff != 0).ok_or(WcError::LocQpOp)?
        } else {
            self.qp.pkey
        };
        let mut payload = src.into_payload(self.dev, len, self.qp.pending.sends());
        payload.make_owned().map_err(|_| WcError::LocProt)?;
        // The copy waits in the turn's outbox or the fabric's queue: a turn makes at most
        // `WORK_PER_TURN * COPY_BYTES_PER_UNIT` (4 MiB) of them, and the fabric's
        // backpressure holds the port between turns.
        let units = len / COPY_BYTES_PER_UNIT;
        self.dev.turn.work_left = self.dev.turn.work_left.saturating_sub(units);
        let pkt = Packet {
            dlid: w.ud_dlid,
            pkey,
            rare: RareHeaders {
                grh: self.dev.multicast_grh(w.ud_dlid),
                ..Default::default()
            }
            .boxed(),
            opcode: if op == WR_SEND_IMM {
                UD_SEND_ONLY_IMM
            } else {
                UD_SEND_ONLY
            },
            solicited: u32::from(w.flags) & WQE_SOLICITED != 0,
            dest_qpn: w.ud_remote_qpn & PSN_MASK,
            src_qpn: self.qpn,
            psn: self.qp.next_psn,
            imm: (op == WR_SEND_IMM).then_some(w.imm),
            qkey,
            payload,
            ..Default::default()
        };
        self.qp.next_psn = psn_add(self.qp.next_psn, 1);
        self.dev.transmit(pkt);
        if signaled {
            self.complete_sent(w.wr_id, op, len);
        }
        Ok(())
    }
}

/// The atomic WRs, plain and masked.
fn is_atomic(op: u32) -> bool {
    matches!(
        op,
        WR_ATOMIC_CMP_SWP | WR_ATOMIC_FETCH_ADD | WR_MASKED_CMP_SWP | WR_MASKED_FETCH_ADD
    )
}

/// WRs that take a responder's resources (`max_rd_atomic`) and can carry no inline data.
fn is_read_like(op: u32) -> bool {
    op == WR_RDMA_READ || is_atomic(op)
}
