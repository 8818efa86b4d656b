//! Shared receive queues: one ring of receive WQEs in guest RAM that any number of QPs take
//! their receives from (IPoIB's connected mode and storage targets use one per device
//! rather than a ring per connection).
//!
//! The driver publishes a free-running producer index in the SRQ's doorbell record; the
//! device keeps the consumer index here and reads the producer index only when a message
//! needs a receive, so posting rings no doorbell. WQEs are taken in ring order, by whichever
//! QP needs one first. A producer index more than the ring's size ahead, or a WQE the device
//! cannot read, puts the SRQ in error (EV_SRQ_ERR, once): every QP that next needs a receive
//! from it goes to ERR, the other guests and SRQs are untouched.
//!
//! The limit event follows IB: an armed SRQ whose posted WQEs fall below its limit posts
//! EV_SRQ_LIMIT once and disarms. A QP on an SRQ that enters ERR posts EV_QP_LAST_WQE (IB's
//! Last WQE Reached): its receives stay in the SRQ for the other QPs, nothing is flushed.

use crate::abi::*;
use crate::hca::Device;
use crate::qp::WorkQueue;
use crate::status::CmdError;

pub(crate) struct Srq {
    pub wq: WorkQueue,
    pub pdn: u32,
    /// Its doorbell record's BAR2 offset (see [`crate::uar`]).
    pub db: u32,
    /// Armed below this many posted WQEs (0: not armed).
    pub limit: u32,
    pub error: bool,
    /// QPs that take receives from it.
    pub users: u32,
}

pub(crate) fn srq_db(srqn: u32) -> u32 {
    BAR2_SRQ_DB_OFFSET + srqn * 8
}

/// A receive WQE taken from an SRQ: where it lies, to parse, and the PD its lkeys are in.
pub(crate) struct SrqWqe {
    pub addr: u64,
    pub pdn: u32,
    pub max_sge: u32,
    pub hdr: HcaRecvWqe,
    /// The SGE after the header, read with it when the slot holds one.
    pub first: Option<HcaSge>,
}

/// Why no WQE came from an SRQ.
pub(crate) enum SrqTake {
    /// Nothing posted: the sender is told RNR (RC) or the datagram is dropped (UD).
    Empty,
    /// The SRQ is in error (now or before): the QP goes to ERR.
    Broken,
}

impl Device {
    pub(crate) fn cmd_create_srq(&mut self, a: &HcaCmdCreateSrq) -> Result<u32, CmdError> {
        let log_entries = u32::from(a.log_entries);
        let wqe_shift = u32::from(a.wqe_shift);
        if log_entries > MAX_SRQ_LOG_WR
            || !(MIN_RQ_WQE_SHIFT..=MAX_RQ_WQE_SHIFT).contains(&wqe_shift)
            || a.limit > 1 << log_entries
        {
            return Err(CmdError::BadParam);
        }
        let db = crate::uar::record(a.db_offset, 0)?;
        if self.pds.get(a.pdn).is_none() {
            return Err(CmdError::BadHandle);
        }
        if !self
            .mem
            .check(a.ring_addr, 1u64 << (log_entries + wqe_shift))
        {
            return Err(CmdError::BadAddress);
        }
        let srq = Srq {
            wq: WorkQueue {
                addr: a.ring_addr,
                log_entries,
                wqe_shift,
                ci: 0,
            },
            pdn: a.pdn,
            db,
            limit: a.limit,
            error: false,
            users: 0,
        };
        let srqn = self.srqs.alloc(srq).ok_or(CmdError::NoResources)?;
        if let Some(pd) = self.pds.get_mut(a.pdn) {
            pd.users += 1;
        }
        let db = if db == 0 { srq_db(srqn) } else { db };
        if let Some(s) = self.srqs.get_mut(srqn) {
            s.db = db;
        }
        self.bar2.write_obj(db, &HcaSrqDb::default());
        Ok(srqn)
    }

    /// Refused while a QP still takes receives from it (ib_core destroys those first).
    pub(crate) fn cmd_destroy_srq(&mut self, srqn: u32) -> Result<(), CmdError> {
        match self.srqs.get(srqn) {
            None => Err(CmdError::BadHandle),
            Some(s) if s.users > 0 => Err(CmdError::Busy),
            Some(s) => {
                let pdn = s.pdn;
                self.srqs.remove(srqn);
                if let Some(pd) = self.pds.get_mut(pdn) {
                    pd.users -= 1;
                }
                Ok(())
            }
        }
    }

    pub(crate) fn cmd_modify_srq(&mut self, m: &HcaCmdSrqLimit) -> Result<(), CmdError> {
        let srq = self.srqs.get_mut(m.srqn).ok_or(CmdError::BadHandle)?;
        if m.limit > srq.wq.size() {
            return Err(CmdError::BadParam);
        }
        if srq.error {
            return Err(CmdError::BadState);
        }
        srq.limit = m.limit;
        Ok(())
    }

    pub(crate) fn cmd_query_srq(&self, srqn: u32) -> Result<HcaCmdSrqLimit, CmdError> {
        let srq = self.srqs.get(srqn).ok_or(CmdError::BadHandle)?;
        Ok(HcaCmdSrqLimit {
            srqn,
            limit: srq.limit,
        })
    }

    /// Takes the next posted WQE of SRQ `srqn` (its header read, the caller reads its SGEs).
    pub(crate) fn srq_take(&mut self, srqn: u32) -> Result<SrqWqe, SrqTake> {
        let Some(srq) = self.srqs.get_mut(srqn) else {
            return Err(SrqTake::Broken);
        };
        let pi = self.bar2.load_u32(srq.db);
        if srq.error {
            return Err(SrqTake::Broken);
        }
        let posted = pi.wrapping_sub(srq.wq.ci);
        if posted == 0 {
            return Err(SrqTake::Empty);
        }
        let addr = srq.wq.slot(srq.wq.ci);
        let stride = 1u32 << srq.wq.wqe_shift;
        let head = if posted > srq.wq.size() {
            Err(ERR_WQ_INDEX)
        } else {
            self.read_wqe_head::<HcaRecvWqe>(addr, stride)
                .map_err(|_| ERR_RING_ACCESS)
        };
        let Some(srq) = self.srqs.get_mut(srqn) else {
            return Err(SrqTake::Broken);
        };
        let (hdr, first) = match head {
            Ok(h) => h,
            Err(reason) => {
                srq.error = true;
                log::debug!("LID {}: SRQ {srqn} in error (reason {reason})", self.lid);
                self.post_event(VEC_ASYNC, EV_SRQ_ERR, srqn, reason);
                return Err(SrqTake::Broken);
            }
        };
        srq.wq.ci = srq.wq.ci.wrapping_add(1);
        let wqe = SrqWqe {
            addr,
            pdn: srq.pdn,
            max_sge: srq.wq.max_sge(16),
            hdr,
            first,
        };
        if srq.limit != 0 && posted - 1 < srq.limit {
            srq.limit = 0;
            self.post_event(VEC_ASYNC, EV_SRQ_LIMIT, srqn, 0);
        }
        Ok(wqe)
    }

    /// Gives back the WQE just taken (a datagram too long for it): the next message gets it.
    pub(crate) fn srq_untake(&mut self, srqn: u32) {
        if let Some(srq) = self.srqs.get_mut(srqn) {
            srq.wq.ci = srq.wq.ci.wrapping_sub(1);
        }
    }
}
