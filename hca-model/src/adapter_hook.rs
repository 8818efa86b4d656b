//! Adapter faults: a hook the HCA consults at its own decision points (a doorbell arrives, an
//! interrupt is raised, a send WQE starts, a CQE is written), so that a fault plan can make
//! the device itself misbehave the way real adapters do. It is set on the fabric
//! ([`crate::Fabric::set_adapter_hook`]), so every HCA on it, including one a restarted
//! guest gets, sees the same plan.

use crate::abi::Lid;

/// What becomes of one interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrqFate {
    /// Raised now.
    Deliver,
    /// Never raised: the guest's driver must find the work by polling.
    Lose,
    /// Raised this many nanoseconds of fabric time later.
    Late(u64),
}

/// Consulted by the HCA at port `lid`; `now_ns` is the fabric's clock. Every method's
/// default is "no fault".
pub trait AdapterHook: Send + Sync {
    /// A doorbell write of `class` arrived: false loses it.
    fn doorbell(&self, _lid: Lid, _class: u32, _now_ns: u64) -> bool {
        true
    }
    /// MSI-X `vector` is about to be raised.
    fn interrupt(&self, _lid: Lid, _vector: u32, _now_ns: u64) -> IrqFate {
        IrqFate::Deliver
    }
    /// A send WQE on `qpn` is about to execute: Some(status) completes it with that error
    /// status instead (the QP then goes to ERR, as for any local error).
    fn send_wqe(&self, _lid: Lid, _qpn: u32, _now_ns: u64) -> Option<crate::WcError> {
        None
    }
    /// A CQE is about to be written to `cqn`: true overflows the CQ instead.
    fn cqe(&self, _lid: Lid, _cqn: u32, _now_ns: u64) -> bool {
        false
    }
}
