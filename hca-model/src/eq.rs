//! Event queues: one ring per interrupt vector in BAR2. EQ 0 carries command completions and
//! asynchronous events; EQ k (k >= 1) carries completion events of CQs bound to vector k.
//! The device writes an entry (owner byte last), then asks for the vector to be raised once
//! its lock is dropped; interrupts coalesce, so the driver drains an EQ until the owner bit
//! says "not yet".

use crate::abi::*;
use crate::hca::Device;

/// The device's producer index for one EQ.
#[derive(Default)]
pub(crate) struct Eq {
    pub pi: u32,
}

impl Device {
    /// The consumer index the driver published for EQ `v`.
    pub(crate) fn eq_ci(&self, v: u32) -> u32 {
        self.bar2.load_u32(BAR2_EQ_DB_OFFSET + v * EQ_DB_STRIDE)
    }

    /// Posts an event on EQ `vector` and requests that vector; the index it took. A full EQ
    /// (the driver stopped consuming) loses the event, counted in `events_lost`; the
    /// interrupt is still raised.
    pub(crate) fn post_event(
        &mut self,
        vector: u32,
        event_type: u32,
        param: u32,
        data: u32,
    ) -> Option<u32> {
        // Reset underneath its driver, the function has no EQ the driver knows of: its
        // rings start over at slot 0 while the driver's consumer indices go on.
        if self.catas == CATAS_RESET {
            return None;
        }
        let v = vector.min(NUM_VECTORS - 1);
        let ci = self.eq_ci(v);
        let pi = self.eqs.get(v as usize).map(|e| e.pi)?;
        self.turn.pending_irqs |= 1 << v;
        if pi.wrapping_sub(ci) >= EQ_ENTRIES {
            self.stats.events_lost += 1;
            return None;
        }
        let slot = BAR2_EQ_OFFSET + (v * EQ_ENTRIES + (pi & (EQ_ENTRIES - 1))) * 16;
        let owner = owner_bit(pi, EQ_LOG_ENTRIES);
        let eqe = HcaEqe {
            event_type: event_type as u8,
            owner: owner ^ 1,
            param,
            data,
            ..Default::default()
        };
        self.bar2.write_obj(slot, &eqe);
        self.bar2.store_u8(slot + EQE_OWNER_OFFSET, owner);
        if let Some(e) = self.eqs.get_mut(v as usize) {
            e.pi = pi.wrapping_add(1);
        }
        self.stats.events += 1;
        Some(pi)
    }
}
