//! Completion queues: rings of HcaCqe in guest RAM, shared by any number of QPs.
//!
//! The device owns the producer index; the driver publishes its consumer index in the CQ's
//! doorbell record. A CQE that would overwrite an unconsumed one is an overflow: the CQ goes
//! to error, EV_CQ_ERR is posted on EQ 0, and this and later CQEs are counted as lost, never
//! silently dropped. Arming is one-shot: a new `arm` word arms the CQ for the next CQE (or
//! the next solicited or error CQE), which posts EV_COMPLETION on the CQ's vector.

use crate::abi::*;
use crate::hca::Device;
use crate::status::{CmdError, WcError};
use vm_memory::ByteValued;

pub(crate) struct Cq {
    pub ring: u64,
    pub log_entries: u32,
    pub vector: u32,
    /// Its doorbell record's BAR2 offset (see [`crate::uar`]).
    pub db: u32,
    pub pi: u32,
    /// The last arm word seen; a different one arms the CQ.
    pub arm_seen: u32,
    /// Armed, and whether only solicited (or error) CQEs fire it.
    pub armed: Option<bool>,
    /// Where its last completion event went in its EQ: while the driver has not consumed
    /// it, a re-arm that would fire at once rides on it instead (see `scan_cq_arms`).
    pub last_event: Option<u32>,
    pub error: bool,
    /// QPs that report to this CQ.
    pub users: u32,
}

fn cq_db(cqn: u32) -> u32 {
    BAR2_CQ_DB_OFFSET + cqn * 8
}

impl Device {
    /// Writes `cqe` (owner byte last) to CQ `cqn`. `solicited` marks a CQE that fires a CQ
    /// armed for solicited events only.
    pub(crate) fn post_cqe(&mut self, cqn: u32, mut cqe: HcaCqe, solicited: bool) {
        if cqe.status != WC_SUCCESS as u8 {
            log::debug!(
                "LID {}: CQ {cqn:#x}: error completion, status {} opcode {} on QP {:#x} \
                 (wr_id {:#x})",
                self.lid,
                cqe.status,
                cqe.opcode,
                cqe.qpn,
                cqe.wr_id
            );
        }
        let Some(cq) = self.cqs.get_mut(cqn) else {
            self.stats.cqes_lost += 1;
            return;
        };
        let ci = self.bar2.load_u32(cq.db);
        if cq.error {
            self.stats.cqes_lost += 1;
            return;
        }
        let size = 1u32 << cq.log_entries;
        let forced = self
            .adapter_hook()
            .is_some_and(|(hook, now)| hook.cqe(self.lid, cqn, now));
        if forced {
            return self.cq_error(cqn, ERR_CQ_OVERFLOW);
        }
        let Some(cq) = self.cqs.get_mut(cqn) else {
            return;
        };
        // A consumer index ahead of the producer is as wrong as a full ring: both mean the
        // driver and device disagree, and the CQ cannot be trusted any more.
        if cq.pi.wrapping_sub(ci) >= size {
            return self.cq_error(cqn, ERR_CQ_OVERFLOW);
        }
        let slot = cq.ring + u64::from(cq.pi & (size - 1)) * 32;
        let owner = owner_bit(cq.pi, cq.log_entries);
        cqe.owner = owner ^ 1;
        let at = CQE_OWNER_OFFSET as usize;
        let written = crate::dma::publish(self.mem.as_ref(), slot, cqe.as_slice(), at, owner);
        if written.is_err() {
            return self.cq_error(cqn, ERR_RING_ACCESS);
        }
        cq.pi = cq.pi.wrapping_add(1);
        let fire = match cq.armed {
            Some(sol_only) => !sol_only || solicited || u32::from(cqe.status) != WC_SUCCESS,
            None => false,
        };
        let vector = cq.vector;
        if fire {
            cq.armed = None;
        }
        self.stats.cqes += 1;
        if fire {
            let at = self.post_event(vector, EV_COMPLETION, cqn, 0);
            if let Some(cq) = self.cqs.get_mut(cqn) {
                cq.last_event = at;
            }
        }
    }

    /// Posts a completion that carries only its WR, QP, opcode and status (errors, flushes).
    pub(crate) fn post_status(
        &mut self,
        cqn: u32,
        qpn: u32,
        wr_id: u64,
        opcode: u32,
        status: WcError,
    ) {
        let cqe = HcaCqe {
            wr_id,
            qpn,
            opcode: opcode as u8,
            status: status.code() as u8,
            ..Default::default()
        };
        self.post_cqe(cqn, cqe, false);
    }

    fn cq_error(&mut self, cqn: u32, reason: u32) {
        if let Some(cq) = self.cqs.get_mut(cqn) {
            cq.error = true;
        }
        self.stats.cqes_lost += 1;
        self.post_event(VEC_ASYNC, EV_CQ_ERR, cqn, reason);
    }

    /// DB_CQ_ARM: arms every CQ whose arm word changed. A CQ that already holds CQEs the
    /// driver has not consumed (by its published consumer index) fires at once: the driver
    /// cannot tell whether a CQE landed between its last poll and this arm, so an event now
    /// is the only way not to lose a wake-up. Drivers see at most a spurious event. But a
    /// CQ whose last event is still in its EQ, unconsumed, gets no second one: that event
    /// wakes its consumer all the same, and a process that left a CQE unpolled and toggled
    /// its arm word (its own UAR page, no system call) would otherwise fill the EQ it
    /// shares with the kernel's CQs, whose events would then be lost.
    pub(crate) fn scan_cq_arms(&mut self) {
        for i in 0..self.live_cqs.len() {
            let Some(&cqn) = self.live_cqs.get(i) else {
                break;
            };
            let Some(cq) = self.cqs.get_mut(cqn) else {
                continue;
            };
            let word = self.bar2.load_u32(cq.db + 4);
            let ci = self.bar2.load_u32(cq.db);
            if word == cq.arm_seen {
                continue;
            }
            cq.arm_seen = word;
            if cq.pi != ci && !cq.error {
                cq.armed = None;
                let (vector, last) = (cq.vector, cq.last_event);
                let eq_ci = self.eq_ci(vector);
                if last.is_some_and(|at| at.wrapping_sub(eq_ci) < EQ_ENTRIES) {
                    self.stats.events_coalesced += 1;
                    continue;
                }
                let at = self.post_event(vector, EV_COMPLETION, cqn, 0);
                if let Some(cq) = self.cqs.get_mut(cqn) {
                    cq.last_event = at;
                }
            } else {
                cq.armed = Some(word & 1 != 0);
            }
        }
    }

    pub(crate) fn cmd_create_cq(&mut self, a: &HcaCmdCreateCq) -> Result<u32, CmdError> {
        if a.log_entries > MAX_CQ_LOG_CQE || !(VEC_COMP_FIRST..NUM_VECTORS).contains(&a.vector) {
            return Err(CmdError::BadParam);
        }
        let db = crate::uar::record(a.db_offset, 0)?;
        let bytes = 32u64 << a.log_entries;
        if !self.mem.check(a.ring_addr, bytes) {
            return Err(CmdError::BadAddress);
        }
        // Zero the ring so that no stale entry looks valid.
        let _ = self.zero_ring(a.ring_addr, bytes);
        let cq = Cq {
            ring: a.ring_addr,
            log_entries: a.log_entries,
            vector: a.vector,
            db,
            pi: 0,
            arm_seen: 0,
            armed: None,
            last_event: None,
            error: false,
            users: 0,
        };
        let cqn = self.cqs.alloc(cq).ok_or(CmdError::NoResources)?;
        let db = if db == 0 { cq_db(cqn) } else { db };
        if let Some(cq) = self.cqs.get_mut(cqn) {
            cq.db = db;
        }
        self.bar2.write_obj(db, &HcaCqDb::default());
        self.live_cqs.push(cqn);
        Ok(cqn)
    }

    /// RESIZE_CQ: CQ `a.cqn` goes on in the ring at `a.ring_addr`. The CQEs its driver has
    /// not consumed (from the consumer index in its doorbell record to the producer index)
    /// move to the new ring's first slots, in order, and the record's consumer index becomes
    /// 0. This happens between two CQEs, so none is lost or doubled; the driver holds the
    /// CQ's lock across the command and polls on from index 0 of the new ring. Too small a
    /// ring for the unconsumed CQEs is refused (BadParam) and the CQ goes on as it was.
    pub(crate) fn cmd_resize_cq(&mut self, a: &HcaCmdResizeCq) -> Result<(), CmdError> {
        if a.log_entries > MAX_CQ_LOG_CQE {
            return Err(CmdError::BadParam);
        }
        let bytes = 32u64 << a.log_entries;
        if !self.mem.check(a.ring_addr, bytes) {
            return Err(CmdError::BadAddress);
        }
        let cq = self.cqs.get(a.cqn).ok_or(CmdError::BadHandle)?;
        if cq.error {
            return Err(CmdError::BadState);
        }
        let old_size = 1u32 << cq.log_entries;
        let ci = self.bar2.load_u32(cq.db);
        let pending = cq.pi.wrapping_sub(ci);
        if pending > old_size {
            // The driver's consumer index is ahead of the device: nothing to move is known.
            return Err(CmdError::BadState);
        }
        if pending > 1u32 << a.log_entries {
            return Err(CmdError::BadParam);
        }
        // Read them all before writing any: the rings may overlap. At most 2 MiB.
        let mut moved = vec![HcaCqe::default(); pending as usize];
        for (i, cqe) in (ci..).zip(moved.iter_mut()) {
            let slot = cq.ring + u64::from(i & (old_size - 1)) * 32;
            crate::dma::read(self.mem.as_ref(), slot, cqe.as_mut_slice())
                .map_err(|_| CmdError::BadAddress)?;
        }
        self.zero_ring(a.ring_addr, bytes)
            .map_err(|_| CmdError::BadAddress)?;
        let at = CQE_OWNER_OFFSET as usize;
        for (i, cqe) in (0u32..).zip(moved.iter_mut()) {
            let owner = owner_bit(i, a.log_entries);
            cqe.owner = owner ^ 1;
            let slot = a.ring_addr + u64::from(i) * 32;
            crate::dma::publish(self.mem.as_ref(), slot, cqe.as_slice(), at, owner)
                .map_err(|_| CmdError::BadAddress)?;
        }
        let cq = self.cqs.get_mut(a.cqn).ok_or(CmdError::BadHandle)?;
        cq.ring = a.ring_addr;
        cq.log_entries = a.log_entries;
        cq.pi = pending;
        let db = cq.db;
        self.bar2.store_u32(db, 0);
        Ok(())
    }

    /// Zeroes a new ring of `bytes` at `addr`, a page at a time.
    fn zero_ring(&self, addr: u64, bytes: u64) -> Result<(), crate::dma::DmaFault> {
        let zero = [0u8; 4096];
        let mut off = 0;
        while off < bytes {
            let n = (bytes - off).min(4096);
            let chunk = zero.get(..n as usize).unwrap_or(&[]);
            crate::dma::write(self.mem.as_ref(), addr + off, chunk)?;
            off += n;
        }
        Ok(())
    }

    pub(crate) fn cmd_destroy_cq(&mut self, cqn: u32) -> Result<(), CmdError> {
        match self.cqs.get(cqn) {
            None => Err(CmdError::BadHandle),
            Some(cq) if cq.users > 0 => Err(CmdError::Busy),
            Some(_) => {
                self.cqs.remove(cqn);
                self.live_cqs.retain(|&c| c != cqn);
                Ok(())
            }
        }
    }
}
