//! The command mailbox: one command at a time, in BAR2.
//!
//! The device copies the whole mailbox once (so the guest cannot change a command while it
//! runs), acts only when `seq` differs from the last one it completed, and publishes
//! `output`, then `status`, then `done_seq = seq`. With CMD_FLAG_EVENT it also posts
//! EV_CMD_DONE on EQ 0 and raises vector 0; otherwise the driver polls `done_seq`.

use vm_memory::ByteValued;

use crate::abi::*;
use crate::hca::{Device, HcaState};
use crate::status::CmdError;

/// Reads a command's input struct from the mailbox's input bytes.
pub(crate) fn input<T: ByteValued + Default>(mb: &HcaCmdMailbox) -> T {
    let mut v = T::default();
    for (d, s) in v.as_mut_slice().iter_mut().zip(&mb.input) {
        *d = *s;
    }
    v
}

/// Writes a command's output struct into the mailbox's output bytes.
fn output<T: ByteValued>(out: &mut [u8; 64], v: &T) {
    for (d, s) in out.iter_mut().zip(v.as_slice()) {
        *d = *s;
    }
}

fn handle(v: u32) -> HcaCmdHandle {
    HcaCmdHandle { handle: v, rsvd: 0 }
}

impl HcaState {
    /// DB_CMD: runs the mailbox's command if it is new.
    pub(crate) fn run_command(&mut self) {
        let mb: HcaCmdMailbox = self.dev.bar2.read_obj(BAR2_MAILBOX_OFFSET);
        if mb.seq == self.dev.last_cmd_seq {
            return; // Already done: a coalesced or repeated doorbell.
        }
        self.dev.stats.commands += 1;
        if mb.opcode == CMD_RESIZE_CQ {
            // Whether the unpolled CQEs fit counts those of work the driver rang for before
            // this command: the doorbells travel apart (each class has its own eventfd under
            // QEMU), so the send doorbell may not have been seen yet. Posted work is run first.
            self.send_doorbell();
        }
        let mut out = [0u8; 64];
        let status = match self.execute(&mb, &mut out) {
            Ok(()) => CMD_OK,
            Err(e) => {
                log::debug!(
                    "LID {}: command {:#x} (seq {}) refused: {e:?}",
                    self.dev.lid,
                    mb.opcode,
                    mb.seq
                );
                e.code()
            }
        };
        let off = |f: usize| BAR2_MAILBOX_OFFSET + f as u32;
        self.dev
            .bar2
            .write_bytes(off(std::mem::offset_of!(HcaCmdMailbox, output)), &out);
        self.dev
            .bar2
            .write_obj(off(std::mem::offset_of!(HcaCmdMailbox, status)), &status);
        self.dev
            .bar2
            .store_u32(off(std::mem::offset_of!(HcaCmdMailbox, done_seq)), mb.seq);
        self.dev.last_cmd_seq = mb.seq;
        if mb.flags & CMD_FLAG_EVENT != 0 {
            self.dev.post_event(VEC_ASYNC, EV_CMD_DONE, mb.seq, status);
        }
    }

    fn execute(&mut self, mb: &HcaCmdMailbox, out: &mut [u8; 64]) -> Result<(), CmdError> {
        if self.dev.catas != 0 && !crate::catas::runs_in_error(mb.opcode, mb) {
            return Err(CmdError::Fatal);
        }
        let h = input::<HcaCmdHandle>(mb).handle;
        match mb.opcode {
            CMD_QUERY_DEVICE => output(out, &self.dev.device_attr()),
            CMD_QUERY_PORT => output(out, &self.dev.port_attr()),
            CMD_QUERY_PKEYS => output(
                out,
                &HcaPKeyTable {
                    pkeys: self.dev.pkeys,
                },
            ),
            CMD_RESET => self.reset_function(),
            CMD_QUERY_COUNTERS => {
                output(out, &self.dev.counters(input::<HcaCmdCounters>(mb).first)?)
            }
            CMD_ALLOC_PD => output(out, &handle(self.dev.cmd_alloc_pd(&input(mb))?)),
            CMD_DEALLOC_PD => self.dev.cmd_dealloc_pd(h)?,
            CMD_REG_MR => output(out, &handle(self.dev.cmd_reg_mr(&input(mb))?)),
            CMD_DEREG_MR => self.dev.cmd_dereg_mr(h)?,
            CMD_ALLOC_MW => output(out, &handle(self.dev.cmd_alloc_mw(&input(mb))?)),
            CMD_DEALLOC_MW => self.dev.cmd_dealloc_mw(h)?,
            CMD_CREATE_CQ => output(out, &handle(self.dev.cmd_create_cq(&input(mb))?)),
            CMD_DESTROY_CQ => self.dev.cmd_destroy_cq(h)?,
            CMD_RESIZE_CQ => self.dev.cmd_resize_cq(&input(mb))?,
            CMD_CREATE_QP => output(out, &handle(self.cmd_create_qp(&input(mb))?)),
            CMD_MODIFY_QP => self.cmd_modify_qp(&input(mb))?,
            CMD_QUERY_QP => output(out, &self.cmd_query_qp(h)?),
            CMD_DESTROY_QP => self.cmd_destroy_qp(h)?,
            CMD_ATTACH_MCAST => self.cmd_attach_mcast(&input(mb))?,
            CMD_DETACH_MCAST => self.cmd_detach_mcast(&input(mb))?,
            CMD_CREATE_SRQ => output(out, &handle(self.dev.cmd_create_srq(&input(mb))?)),
            CMD_MODIFY_SRQ => self.dev.cmd_modify_srq(&input(mb))?,
            CMD_QUERY_SRQ => output(out, &self.dev.cmd_query_srq(h)?),
            CMD_DESTROY_SRQ => self.dev.cmd_destroy_srq(h)?,
            CMD_SMP_SET => self.dev.cmd_smp_set(&input(mb))?,
            CMD_SET_PORT_CAP => {
                let c: HcaCmdPortCap = input(mb);
                self.dev
                    .port_caps
                    .store(c.cap_mask, std::sync::atomic::Ordering::Relaxed);
            }
            _ => return Err(CmdError::BadOpcode),
        }
        Ok(())
    }
}

impl Device {
    /// QUERY_COUNTERS: the eight counters from `first` on.
    fn counters(&self, first: u32) -> Result<HcaCounters, CmdError> {
        if first >= COUNTERS_LEN {
            return Err(CmdError::BadParam);
        }
        let mut out = HcaCounters::default();
        for (i, v) in (first..).zip(out.values.iter_mut()) {
            *v = self.counter(i);
        }
        Ok(out)
    }

    /// Counter `i` (a `CTR_*`; 0 past the last).
    pub(crate) fn counter(&self, i: u32) -> u64 {
        let s = &self.stats;
        match i {
            CTR_TX_PACKETS => s.packets_out,
            CTR_RX_PACKETS => s.packets_in,
            CTR_TX_OCTETS => s.wire_out,
            CTR_RX_OCTETS => s.wire_in,
            CTR_TX_MCAST_PACKETS => s.mcast_out,
            CTR_RX_MCAST_PACKETS => s.mcast_in,
            CTR_TX_DISCARDS => s.xmit_discards,
            CTR_LINK_DOWNED => s.link_downs,
            CTR_ICRC_ERRORS => s.icrc_errors,
            CTR_PKEY_VIOLATIONS => s.pkey_violations,
            CTR_RETRANSMITS => s.retransmits,
            CTR_SEQ_NAKS => s.seq_naks,
            CTR_RNR_NAKS => s.rnr_naks,
            CTR_RETRY_EXCEEDED => s.retry_exceeded,
            CTR_DUPLICATES => s.duplicates,
            CTR_UD_DROPPED => s.ud_dropped,
            CTR_RC_DROPPED => s.rc_dropped,
            CTR_REVOKED => s.revoked,
            CTR_READ_GAPS => s.read_gaps,
            CTR_DMA_FAULTS => s.dma_faults,
            CTR_CQES_LOST => s.cqes_lost,
            CTR_EVENTS_LOST => s.events_lost,
            _ => 0,
        }
    }

    fn device_attr(&self) -> HcaDeviceAttr {
        HcaDeviceAttr {
            fw_ver: u64::from(ABI_VERSION),
            node_guid: self.node_guid,
            max_mr_size: u64::MAX,
            page_size_cap: ((1u64 << (MAX_MR_PAGE_SHIFT + 1)) - 1)
                & !((1u64 << MIN_MR_PAGE_SHIFT) - 1),
            max_qp: MAX_QP,
            max_qp_wr: 1 << MAX_QP_LOG_WR,
            max_cq: MAX_CQ,
            max_cqe: 1 << MAX_CQ_LOG_CQE,
            max_mr: MAX_MR,
            max_pd: MAX_PD,
            max_sge: MAX_SGE as u16,
            max_inline: MAX_INLINE as u16,
            local_dma_lkey: LOCAL_DMA_LKEY,
        }
    }

    /// Whether a subnet manager in a guest manages the port.
    fn guest_sm(&self) -> bool {
        self.fabric.as_ref().is_some_and(|f| f.guest_sm())
    }

    fn port_attr(&self) -> HcaPortAttr {
        HcaPortAttr {
            gid_prefix: 0xfe80_0000_0000_0000,
            port_guid: self.node_guid,
            lid: self.lid,
            sm_lid: if self.fabric.is_some() {
                self.mgmt.sm_lid
            } else {
                0
            },
            state: self.port_state() as u8,
            max_mtu: MTU_4096 as u8,
            active_mtu: MTU_4096 as u8,
            lmc: 0,
            mkey: self.mgmt.mkey,
            mkey_lease: self.mgmt.mkey_lease,
            sm_sl: self.mgmt.sm_sl,
            mkey_prot: self.mgmt.mkey_prot,
            subnet_timeout: self.mgmt.subnet_timeout,
            flags: if self.guest_sm() {
                PORT_FLAG_GUEST_SM
            } else {
                0
            },
            rsvd1: 0,
            rsvd2: [0; 3],
        }
    }

    /// SMP_SET: a subnet manager's Set, as the port's SMA took it (see sma.rs); the
    /// driver hears what changed as events.
    fn cmd_smp_set(&mut self, smp: &HcaCmdSmpSet) -> Result<(), CmdError> {
        use crate::sma;
        // The fabric's own SM manages the port: no SMP changes it.
        if !self.guest_sm() {
            return Err(CmdError::BadState);
        }
        let was_down = self.port_state() == PORT_DOWN;
        let changed = match smp.attr_id {
            sma::ATTR_PORT_INFO => sma::set_port_info(&mut self.mgmt, self.lid, smp)?,
            sma::ATTR_PKEY_TABLE => sma::set_pkey_table(&self.mgmt, &mut self.pkeys, smp)?,
            _ => return Err(CmdError::BadParam),
        };
        self.publish_info();
        if changed.retrained {
            if let Some(f) = &self.fabric {
                f.user_sm_link_changed(self.lid);
            }
        }
        if changed.pkeys {
            self.post_event(VEC_ASYNC, EV_PKEY_CHANGE, 1, 0);
        }
        let bits = (u32::from(changed.sm) * PORT_CHANGE_SM)
            | (u32::from(changed.rereg) * PORT_CHANGE_REREG);
        if bits != 0 {
            self.post_event(VEC_ASYNC, EV_PORT_CHANGE, 1, bits);
        }
        // A port with no link hears of its state when the link comes back.
        match changed.active {
            _ if was_down => {}
            Some(true) => {
                self.post_event(VEC_ASYNC, EV_PORT_ACTIVE, 1, 0);
            }
            Some(false) => {
                self.post_event(VEC_ASYNC, EV_PORT_DOWN, 1, 0);
            }
            None => {}
        }
        Ok(())
    }
}
