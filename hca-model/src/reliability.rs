//! RC reliability, requester side: the transport timer, go-back-N retransmission, and what
//! NAKs mean, as IB defines them.
//!
//! - Every RC QP with requests in flight runs one timer of 4.096 us x 2^timeout (timeout 0:
//!   infinite). Progress (an ACK or response that completes something) restarts it and
//!   refills the retry budget; expiry resends everything unacknowledged, from the oldest
//!   unacknowledged PSN, and spends one retry. With none left the oldest WR completes with
//!   WcError::RetryExc and the QP goes to ERR: at most (retry_cnt + 1) timeouts after the
//!   last progress.
//! - A PSN sequence NAK acknowledges everything before its PSN and asks for a resend from
//!   there (a packet was lost on the way): resent at once, without spending a retry or
//!   restarting the timer, so a peer that keeps NAKing without letting anything complete
//!   still runs the QP into the timeout bound.
//! - An RNR NAK (no receive WQE posted) acknowledges what came before and waits the delay
//!   its syndrome encodes before resending; rnr_retry 7 retries forever, otherwise the
//!   budget runs out into WcError::RnrRetryExc.
//!
//! - A read missing responses is asked again at once, from the first one missing, when
//!   a response past it arrives (of the same read or of a later one: responses come in
//!   order) or an ACK past it does (IB's implied NAK); once per gap, no retry spent.
//!
//! Resending re-reads the WR's memory, as hardware does; a read resumes at the first
//! response PSN not yet received (its RETH advanced to match).

use crate::abi::*;
use crate::hca::HcaState;
use crate::packet::*;
use crate::qp::{PendKind, QpEngine};
use crate::status::WcError;

/// No timer armed.
pub(crate) const NEVER: u64 = u64::MAX;

/// The local ACK timeout for a QP's 5-bit `timeout` attribute; None for 0 (infinite).
pub fn ack_timeout_ns(code: u8) -> Option<u64> {
    (code != 0).then(|| 4096u64 << code.min(31))
}

/// The RNR NAK timer field's delay, in microseconds (IB's table: code 0 is the longest).
pub fn rnr_delay_us(code: u8) -> u64 {
    const US: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    US.get(usize::from(code & 0x1f)).copied().unwrap_or(US[0])
}

/// What a QP's timer is waiting for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Wait {
    #[default]
    Idle,
    /// The ACK timeout: resend from the oldest unacknowledged PSN, spending a retry.
    Ack(u64),
    /// The ACK timeout, counted from the fabric's next tick (armed on a real clock, without
    /// reading it: see [`crate::Fabric::now_ns_if_cheap`]).
    AckFromTick,
    /// An RNR delay: resend from this PSN when it passes.
    Rnr(u64, u32),
}

/// A requester's retransmission state.
#[derive(Default)]
pub(crate) struct Retry {
    pub wait: Wait,
    pub retries_left: u8,
    pub rnr_left: u8,
}

impl HcaState {
    /// Fires every timer due at fabric time `now` (QP timers on the port's transport time);
    /// recomputes the earliest one left.
    pub(crate) fn on_timer(&mut self, now: u64) {
        if now < self.dev.timer_hint {
            return;
        }
        self.dev.timer_hint = NEVER;
        self.dev.release_late_irqs(now);
        let port_now = now.saturating_sub(self.dev.transport_lag());
        for i in 0..self.live_qps.len() {
            let Some(&qpn) = self.live_qps.get(i) else {
                break;
            };
            if let Some(mut e) = self.engine(qpn) {
                e.on_timer(port_now);
            }
        }
    }
}

impl QpEngine<'_> {
    /// Sets the QP's timer; the device's hint (fabric time) gets its deadline (transport
    /// time) as fabric time reads it if the port stalls no more: no later than it comes due.
    fn set_wait(&mut self, wait: Wait) {
        self.qp.retry.wait = wait;
        match wait {
            Wait::Ack(t) | Wait::Rnr(t, _) => {
                let due = t.saturating_add(self.dev.transport_lag());
                self.dev.timer_hint = self.dev.timer_hint.min(due);
            }
            Wait::AckFromTick => self.dev.timer_hint = 0, // the next tick starts it
            Wait::Idle => {}
        }
    }

    /// The ACK timer started at transport time `now` (Idle for an infinite timeout).
    fn ack_wait_from(&self, now: u64) -> Wait {
        ack_timeout_ns(self.qp.attr.timeout).map_or(Wait::Idle, |t| Wait::Ack(now + t))
    }

    /// The ACK timer (`timeout_ns` long) started now: from the clock where reading it is
    /// cheap, else from the next tick.
    fn ack_wait(&self, timeout_ns: u64) -> Wait {
        self.dev
            .timer_start()
            .map_or(Wait::AckFromTick, |now| Wait::Ack(now + timeout_ns))
    }

    /// Arms the ACK timer for requests just sent, if it is not running; a QP that was idle
    /// starts with its full retry budgets.
    pub(crate) fn arm_timer(&mut self) {
        let qp = &mut *self.qp;
        if qp.retry.wait != Wait::Idle || !qp.awaits_peer() {
            return;
        }
        qp.refill_retries();
        if let Some(t) = ack_timeout_ns(qp.attr.timeout) {
            let wait = self.ack_wait(t);
            self.set_wait(wait);
        }
    }

    /// Something completed: the budgets refill and the timer restarts for what is left.
    /// (A real clock is not read here either: the restarted timer counts from the next
    /// tick, and the last ACK of a run leaves nothing to time.)
    pub(crate) fn progress(&mut self) {
        let qp = &mut *self.qp;
        qp.refill_retries();
        let busy = qp.awaits_peer();
        let wait = match ack_timeout_ns(qp.attr.timeout) {
            Some(t) if busy && !matches!(qp.retry.wait, Wait::Rnr(..)) => self.ack_wait(t),
            _ if busy => qp.retry.wait,
            _ => Wait::Idle,
        };
        self.set_wait(wait);
    }

    /// Spends one retry; false (and the oldest WR failed, the QP in ERR) when none was left.
    fn spend_retry(&mut self) -> bool {
        if self.qp.retry.retries_left == 0 {
            self.dev.stats.retry_exceeded += 1;
            self.fail_front(WcError::RetryExc);
            return false;
        }
        self.qp.retry.retries_left -= 1;
        true
    }

    /// This QP's timer at transport time `now`: fires if due, else stays in the device's hint.
    fn on_timer(&mut self, now: u64) {
        let live = u32::from(self.qp.attr.state) == QPS_RTS && self.qp.qp_type == QPT_RC;
        match self.qp.retry.wait {
            _ if !live => self.set_wait(Wait::Idle),
            Wait::Ack(t) if t <= now => {
                if self.spend_retry() {
                    let from = self.oldest_unacked();
                    self.resend_from(from, now, true);
                }
            }
            Wait::Rnr(t, psn) if t <= now => self.resend_from(psn, now, true),
            Wait::AckFromTick => {
                let wait = self.ack_wait_from(now);
                self.set_wait(wait);
            }
            w => self.set_wait(w), // not due: keeps it in the hint
        }
    }

    /// The first PSN the peer has not acknowledged (for a read: not yet answered).
    fn oldest_unacked(&self) -> u32 {
        self.qp
            .pending
            .iter()
            .find(|p| !matches!(p.kind, PendKind::Local))
            .map_or(self.qp.next_psn, |p| match p.kind {
                PendKind::Read { .. } => p.next_resp_psn,
                _ => p.first_psn,
            })
    }

    /// Resends every request from PSN `from` on; `restart`: the ACK timer starts over.
    pub(crate) fn resend_from(&mut self, from: u32, now: u64, restart: bool) {
        let mtu = u64::from(self.qp.mtu());
        let mut resent = 0;
        for (p, req) in self.qp.pending.with_requests() {
            let Some(req) = req else {
                continue;
            };
            if !psn_le(from, p.last_psn) {
                continue; // wholly before `from`: acknowledged already
            }
            let pkt = match p.kind {
                PendKind::Read { .. } => {
                    let start = if psn_le(p.next_resp_psn, from) {
                        from
                    } else {
                        p.next_resp_psn
                    };
                    let done = u64::from(start.wrapping_sub(p.first_psn) & PSN_MASK) * mtu;
                    let mut r = req.clone_header();
                    r.psn = start;
                    if let Some(reth) = r.reth.as_mut() {
                        reth.va = reth.va.wrapping_add(done);
                        reth.len = reth.len.saturating_sub(done as u32);
                    }
                    r
                }
                _ if psn_le(from, p.first_psn) => req.clone(),
                // Part of a multi-packet message went through: the rest of it.
                _ => req.clone().from_psn(from),
            };
            resent += 1;
            self.dev.transmit_train(pkt);
        }
        self.dev.stats.retransmits += resent;
        if restart {
            let wait = self.ack_wait_from(now);
            self.set_wait(wait);
        }
    }

    /// A NAK other than a fatal one: PSN sequence error or RNR. Everything before its PSN
    /// is acknowledged by it.
    pub(crate) fn on_retry_nak(&mut self, syndrome: u8, psn: u32) {
        self.complete_acked(psn_add(psn, PSN_MASK)); // psn - 1
        let now = self.dev.transport_now();
        if syndrome == AETH_NAK_PSN_SEQ {
            self.dev.stats.seq_naks += 1;
            return self.resend_from(psn, now, false);
        }
        self.dev.stats.rnr_naks += 1;
        // rnr_retry 7 means retry forever.
        if self.qp.attr.rnr_retry != 7 {
            if self.qp.retry.rnr_left == 0 {
                return self.fail_front(WcError::RnrRetryExc);
            }
            self.qp.retry.rnr_left -= 1;
        }
        let delay = rnr_delay_us(syndrome & 0x1f) * 1000;
        self.set_wait(Wait::Rnr(now + delay, psn));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_timer_encodings_follow_ib() {
        assert_eq!(ack_timeout_ns(0), None, "0 is infinite");
        assert_eq!(ack_timeout_ns(1), Some(8_192));
        assert_eq!(ack_timeout_ns(14), Some(67_108_864)); // ~67 ms
        assert_eq!(rnr_delay_us(0), 655_360);
        assert_eq!(rnr_delay_us(12), 640);
        assert_eq!(rnr_delay_us(31), 491_520);
    }
}
