//! Catastrophic errors and the function reset that clears them (`CAP_RESET`).
//!
//! A catastrophic error is what a driver meets when its adapter dies under it: the port
//! goes down, the device takes no new work, and the driver must tear its consumers down,
//! reset the function and start again. Real drivers reach this path only with broken
//! hardware; here the host injects it (`Hca::inject_catastrophic`).
//!
//! In the error the device still completes what teardown needs: every QP is moved to ERR
//! with its work flushed (as mlx5's driver flushes in software once its device is dead),
//! so a consumer's `ib_drain_qp` returns; and it still runs the commands that free
//! things, so `ib_unregister_device` finishes. Everything else is refused with
//! `CMD_FATAL`, and packets from the fabric are dropped unseen (the peers' RC QPs run out
//! of retries, as against a dead port). `CMD_RESET` brings the function back to its
//! power-on state and its port up.
//!
//! A function reset underneath the driver (`Hca::inject_reset`, `hcabench fault NODE
//! reset`: what a hypervisor's or a firmware's reset does to a live driver) is harder: the
//! device forgets every QP, CQ and EQ at once, so nothing is flushed and no event can say
//! so. It keeps `CATAS_RESET` in `catas_syndrome` and refuses work as in an error until the
//! driver's RESET, so that nothing the driver does before it notices (its health check
//! reads the syndrome) reaches a device that no longer knows its handles; the driver
//! completes its consumers' work in software.

use std::sync::atomic::Ordering;

use crate::abi::*;
use crate::hca::HcaState;

/// Whether a command may run while the device is in a catastrophic error: queries and
/// what tears down, never what creates or brings a QP back.
pub(crate) fn runs_in_error(opcode: u32, mb: &HcaCmdMailbox) -> bool {
    match opcode {
        CMD_QUERY_DEVICE | CMD_QUERY_PORT | CMD_QUERY_PKEYS | CMD_QUERY_COUNTERS | CMD_QUERY_QP
        | CMD_QUERY_SRQ | CMD_RESET | CMD_DEALLOC_PD | CMD_DEREG_MR | CMD_DEALLOC_MW
        | CMD_DESTROY_CQ | CMD_DESTROY_QP | CMD_DETACH_MCAST | CMD_DESTROY_SRQ
        | CMD_SET_PORT_CAP => true,
        CMD_MODIFY_QP => {
            let m: HcaCmdModifyQp = crate::command::input(mb);
            m.attr_mask & QP_ATTR_STATE != 0
                && matches!(u32::from(m.attr.state), QPS_RESET | QPS_ERR)
        }
        _ => false,
    }
}

impl HcaState {
    /// Enters a catastrophic error with `syndrome` (a `CATAS_*`); once: a second one
    /// changes nothing until a reset.
    pub(crate) fn catastrophic(&mut self, syndrome: u32) {
        if self.dev.catas != 0 {
            return;
        }
        log::info!(
            "LID {}: catastrophic error (syndrome {syndrome}): port down, {} QPs flushed",
            self.dev.lid,
            self.live_qps.len()
        );
        self.dev.catas = syndrome.max(1);
        for qpn in self.live_qps.clone() {
            if let Some(mut e) = self.engine(qpn) {
                if u32::from(e.qp.attr.state) != QPS_ERR {
                    e.enter_error();
                }
            }
        }
        self.dev.publish_info();
        self.dev.post_event(VEC_ASYNC, EV_PORT_DOWN, 1, 0);
        self.dev.post_event(VEC_ASYNC, EV_CATAS, syndrome, 0);
    }

    /// A reset underneath the driver: the function as at power-on, then held in
    /// `CATAS_RESET` until the driver's own RESET. Whether the device was not in an error
    /// already (a reset during one still forgets everything).
    pub(crate) fn reset_underneath(&mut self) -> bool {
        let first = self.dev.catas == 0;
        self.reset_function();
        self.dev.catas = CATAS_RESET;
        self.dev.publish_info();
        log::info!(
            "LID {}: function reset underneath the driver: port down until its RESET",
            self.dev.lid
        );
        first
    }

    /// CMD_RESET: the function as at power-on. What the host set (fabric and LID, doorbell
    /// peer, budget, P_Keys) and what outlives a reset on real hardware (counters, key tags,
    /// so that a key from before the reset never matches a region registered after it)
    /// stay; the turn under way keeps its scratch state. QPNs go on from where they were:
    /// peers' connection managers remember the QPNs of connections to this port (for as
    /// long as their time-wait lasts, or until they learn the connection is gone), and take
    /// a request from one of those again for a stale connection, which they reject.
    pub(crate) fn reset_function(&mut self) {
        let old = &mut self.dev;
        let mut fresh = HcaState::new(old.mem.clone(), old.bar2.clone(), old.node_guid);
        let new = &mut fresh.dev;
        new.fabric = old.fabric.take();
        new.lid = old.lid;
        new.doorbell_peer = old.doorbell_peer;
        new.stats = old.stats;
        new.link_down = old.link_down;
        new.in_flight_budget = old.in_flight_budget;
        new.pkeys = old.pkeys;
        new.mgmt = old.mgmt;
        new.mr_tags = std::mem::take(&mut old.mr_tags);
        // Shared with the port's sink: the same objects, their values as at power-on.
        new.port_caps = old.port_caps.clone();
        new.port_caps.store(0, Ordering::Relaxed);
        new.recv_doorbells = old.recv_doorbells.clone();
        new.recv_doorbells.no_qp_in_error();
        new.turn = std::mem::take(&mut old.turn);
        if let Some(next) = self.qps.cursor() {
            fresh.qps.set_cursor(next);
        }
        let had = self.live_qps.len();
        *self = fresh;
        self.dev.publish_info();
        log::info!(
            "LID {}: function reset ({had} QPs dropped); port {}",
            self.dev.lid,
            if self.dev.port_state() == PORT_ACTIVE {
                "ACTIVE"
            } else {
                "DOWN"
            }
        );
    }
}
