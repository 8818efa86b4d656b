//! The plan in the HCAs: WQEs failed, doorbells and interrupts lost or late, CQs overflowed.

use super::draw::{uniform, Draw, Stream};
use super::log::LogLine;
use super::plan::AdapterFaults;
use super::{FaultHook, State};
use crate::adapter_hook::{AdapterHook, IrqFate};

/// A fault the plan injects into an HCA.
#[derive(Clone, Copy)]
enum AdapterFault {
    WqeError,
    DoorbellLost,
    InterruptLost,
    InterruptLate,
    CqOverflow,
}

impl FaultHook {
    /// The first [[adapter]] rule for the HCA at `lid`.
    fn adapter(&self, lid: u16) -> Option<&AdapterFaults> {
        self.plan
            .adapters
            .iter()
            .find(|a| a.lid.is_none_or(|l| l == lid))
    }

    /// Logs an adapter fault and counts it.
    fn adapter_fault(
        &self,
        st: &mut State,
        t: u64,
        lid: u16,
        n: u64,
        f: AdapterFault,
        mut line: LogLine,
    ) {
        let c = &mut st.counts;
        let (counter, what) = match f {
            AdapterFault::WqeError => (&mut c.wqe_errors, "wqe-error"),
            AdapterFault::DoorbellLost => (&mut c.doorbells_lost, "doorbell-lost"),
            AdapterFault::InterruptLost => (&mut c.interrupts_lost, "interrupt-lost"),
            AdapterFault::InterruptLate => (&mut c.interrupts_late, "interrupt-late"),
            AdapterFault::CqOverflow => (&mut c.cq_overflows, "cq-overflow"),
        };
        *counter += 1;
        line.t_ns = t;
        line.hca = Some(format!("lid{lid}"));
        line.n = Some(n);
        line.fault = Some(what);
        st.log(&line);
    }
}

impl AdapterHook for FaultHook {
    fn doorbell(&self, lid: u16, class: u32, now_ns: u64) -> bool {
        let Some(a) = self.adapter(lid).filter(|a| a.lose_doorbell > 0.0) else {
            return true;
        };
        let mut st = self.lock();
        let n = st.next(Stream::Doorbell(lid));
        if uniform(self.plan.seed, Stream::Doorbell(lid), n, Draw::Lose) >= a.lose_doorbell {
            return true;
        }
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            class: Some(class),
            ..Default::default()
        };
        self.adapter_fault(&mut st, t, lid, n, AdapterFault::DoorbellLost, line);
        false
    }

    fn interrupt(&self, lid: u16, vector: u32, now_ns: u64) -> IrqFate {
        let Some(a) = self
            .adapter(lid)
            .filter(|a| a.lose_interrupt > 0.0 || a.late_interrupt > 0.0)
        else {
            return IrqFate::Deliver;
        };
        let mut st = self.lock();
        let s = Stream::Interrupt(lid);
        let n = st.next(s);
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            vector: Some(vector),
            ..Default::default()
        };
        let seed = self.plan.seed;
        if uniform(seed, s, n, Draw::Lose) < a.lose_interrupt {
            self.adapter_fault(&mut st, t, lid, n, AdapterFault::InterruptLost, line);
            return IrqFate::Lose;
        }
        if uniform(seed, s, n, Draw::Late) < a.late_interrupt {
            self.adapter_fault(&mut st, t, lid, n, AdapterFault::InterruptLate, line);
            return IrqFate::Late(a.late_interrupt_us * 1000);
        }
        IrqFate::Deliver
    }

    fn send_wqe(&self, lid: u16, qpn: u32, now_ns: u64) -> Option<crate::WcError> {
        let a = self.adapter(lid)?;
        let nth = a.error_wqe?;
        if a.qpn.is_some_and(|q| q != qpn) {
            return None;
        }
        let mut st = self.lock();
        let n = st.next(Stream::Wqe(lid, qpn));
        if n + 1 != nth {
            return None;
        }
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            qpn: Some(qpn),
            ..Default::default()
        };
        self.adapter_fault(&mut st, t, lid, n, AdapterFault::WqeError, line);
        Some(crate::WcError::General)
    }

    fn cqe(&self, lid: u16, cqn: u32, now_ns: u64) -> bool {
        let Some(after) = self.adapter(lid).and_then(|a| {
            a.cq_overflow_after
                .filter(|_| a.cqn.is_none_or(|c| c == cqn))
        }) else {
            return false;
        };
        let mut st = self.lock();
        let n = st.next(Stream::Cqe(lid, cqn));
        if n != after {
            return false;
        }
        let t = self.plan_ns(now_ns);
        let line = LogLine {
            cqn: Some(cqn),
            ..Default::default()
        };
        self.adapter_fault(&mut st, t, lid, n, AdapterFault::CqOverflow, line);
        true
    }
}
