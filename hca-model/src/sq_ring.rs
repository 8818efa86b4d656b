//! Send-doorbell rings: which QPs a send doorbell is for.
//!
//! An ivshmem doorbell carries 8 bits of class and nothing else, so DB_SQ cannot name its QP
//! as mthca's UAR doorbell does. The name travels through BAR2 instead: before it rings DB_SQ
//! for a QP created with `QP_FLAG_SQ_RING`, the guest appends the QPN to a ring (one of the
//! kernel's `SQ_RINGS` at `BAR2_SQ_RING_OFFSET`, or its process's ring in the UAR page,
//! `uapi::UAR_SQ_RING_OFFSET`), writing the QPN, then the ring's producer index (the kernel
//! says in ring 0 how many of its rings it writes: `SQ_RINGS_USED`). A send
//! doorbell then runs the send queues its rings name, and looks at the QPs created without
//! the flag (an older driver's or provider's) as every send doorbell did before: it never
//! visits an idle named QP.
//!
//! Ownership: each ring has one writer at a time (the kernel's, a CPU each; a process's, its
//! provider under a lock), which owns the producer index; the device owns its consumer
//! index, kept here and never read from the guest. Everything read from a ring is hostile:
//! - a QPN is served only if it is a live QP created with the flag whose doorbell record the
//!   ring's owner holds (the kernel's record region for a kernel ring, the UAR page for a UAR
//!   ring); any other entry is counted (`HcaStats::sq_ring_ignored`) and passed over;
//! - a doorbell reads at most `SQ_RING_ENTRIES - 1` entries of a ring. A producer index that
//!   ran further ahead (the device was slow, or the guest lies), before or while the entries
//!   were read (a writer lapping the reader overwrites entries not yet read), costs one look
//!   at every live QP instead, as DB_SQ was before the rings, and the consumer index moves to
//!   the producer index read last: nothing the guest posted is left unserved.
//!
//! A budget-bound send queue goes on in the next turn's look at every live QP
//! (`continue_send_queues`, or the next send doorbell's), and RTR -> RTS runs the send
//! queue itself, as before.

use crate::abi::*;
use crate::devmem::DeviceMemory;
use crate::hca::{HcaState, SqHint};
use crate::uapi::UAR_SQ_RING_OFFSET;

/// A send-doorbell ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ring {
    /// The kernel's ring of this index.
    Kernel(u32),
    /// The ring in this UAR page (its index from `BAR2_UAR_OFFSET`).
    Uar(u32),
}

impl Ring {
    /// The ring's BAR2 offset.
    fn base(self) -> u32 {
        match self {
            Ring::Kernel(r) => BAR2_SQ_RING_OFFSET + r * SQ_RING_STRIDE,
            Ring::Uar(p) => BAR2_UAR_OFFSET + p * UAR_SIZE + UAR_SQ_RING_OFFSET,
        }
    }

    /// Whether a QP whose doorbell record is at BAR2 offset `db` may be named on this ring.
    fn holds(self, db: u32) -> bool {
        owner_of(db).is_some_and(|o| match (o, self) {
            (Owner::Kernel, Ring::Kernel(_)) => true,
            (Owner::Uar(p), Ring::Uar(q)) => p == q,
            _ => false,
        })
    }
}

/// Whose rings may name a QP: the kernel's, or one UAR page's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Kernel,
    Uar(u32),
}

/// The owner of a doorbell record at BAR2 offset `db` (see `uar::record`).
fn owner_of(db: u32) -> Option<Owner> {
    if (BAR2_QP_DB_OFFSET..BAR2_QP_DB_OFFSET + MAX_QP * 8).contains(&db) {
        Some(Owner::Kernel)
    } else if (BAR2_UAR_OFFSET..BAR2_SIZE).contains(&db) {
        Some(Owner::Uar((db - BAR2_UAR_OFFSET) / UAR_SIZE))
    } else {
        None
    }
}

/// The device's side of the send-doorbell rings.
pub(crate) struct SqRings {
    /// Live QPs created without `QP_FLAG_SQ_RING`: every send doorbell looks at them.
    pub unnamed: Vec<u32>,
    /// Each kernel ring's consumer index.
    kernel_ci: [u32; SQ_RINGS as usize],
    /// Live named QPs whose records are the kernel's: while none, kernel rings are not read.
    kernel_qps: u32,
    /// Per UAR page: its ring's consumer index, and the live named QPs whose records it holds.
    uar_ci: Vec<u32>,
    uar_qps: Vec<u32>,
    /// UAR pages holding a live named QP's record: the only UAR rings a doorbell reads.
    active_uars: Vec<u32>,
}

impl Default for SqRings {
    fn default() -> Self {
        Self {
            unnamed: Vec::new(),
            kernel_ci: [0; SQ_RINGS as usize],
            kernel_qps: 0,
            uar_ci: vec![0; MAX_UAR as usize],
            uar_qps: vec![0; MAX_UAR as usize],
            active_uars: Vec::new(),
        }
    }
}

impl SqRings {
    /// A new live QP `qpn`, its record at `db`, named on rings when `named`. A ring that
    /// names its first live QP starts at its producer index now: what it held before named
    /// no QP it may name.
    pub fn add(&mut self, bar2: &DeviceMemory, qpn: u32, db: u32, named: bool) {
        if !named {
            self.unnamed.push(qpn);
            return;
        }
        match owner_of(db) {
            Some(Owner::Kernel) => {
                if self.kernel_qps == 0 {
                    for (r, ci) in (0..SQ_RINGS).zip(self.kernel_ci.iter_mut()) {
                        *ci = bar2.load_u32(Ring::Kernel(r).base() + SQ_RING_PI);
                    }
                }
                self.kernel_qps += 1;
            }
            Some(Owner::Uar(p)) => {
                let (Some(n), Some(ci)) = (
                    self.uar_qps.get_mut(p as usize),
                    self.uar_ci.get_mut(p as usize),
                ) else {
                    return;
                };
                if *n == 0 {
                    *ci = bar2.load_u32(Ring::Uar(p).base() + SQ_RING_PI);
                    self.active_uars.push(p);
                }
                *n += 1;
            }
            None => {}
        }
    }

    /// Live QP `qpn` (as [`SqRings::add`] had it) is destroyed.
    pub fn remove(&mut self, qpn: u32, db: u32, named: bool) {
        if !named {
            self.unnamed.retain(|&q| q != qpn);
            return;
        }
        match owner_of(db) {
            Some(Owner::Kernel) => self.kernel_qps = self.kernel_qps.saturating_sub(1),
            Some(Owner::Uar(p)) => {
                if let Some(n) = self.uar_qps.get_mut(p as usize) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.active_uars.retain(|&q| q != p);
                    }
                }
            }
            None => {}
        }
    }

    fn ci_mut(&mut self, ring: Ring) -> Option<&mut u32> {
        match ring {
            Ring::Kernel(r) => self.kernel_ci.get_mut(r as usize),
            Ring::Uar(p) => self.uar_ci.get_mut(p as usize),
        }
    }

    /// Whether `ring`'s producer index moved past the consumer index.
    fn has_new(&self, bar2: &DeviceMemory, ring: Ring) -> bool {
        let ci = match ring {
            Ring::Kernel(r) => self.kernel_ci.get(r as usize),
            Ring::Uar(p) => self.uar_ci.get(p as usize),
        };
        ci.is_some_and(|&ci| bar2.load_u32(ring.base() + SQ_RING_PI) != ci)
    }

    /// Takes what `ring` holds past its consumer index into `qpns`, returning how many; None
    /// when the writer ran too far ahead to read them safely (the consumer index then moves
    /// to the producer index).
    fn take(&mut self, bar2: &DeviceMemory, ring: Ring, qpns: &mut [u32]) -> Option<usize> {
        let base = ring.base();
        let ci_ref = self.ci_mut(ring)?;
        let ci = *ci_ref;
        let pi = bar2.load_u32(base + SQ_RING_PI);
        let n = pi.wrapping_sub(ci);
        if n == 0 {
            return Some(0);
        }
        let mut ok = n < SQ_RING_ENTRIES;
        if ok {
            for (k, q) in (0..n).zip(qpns.iter_mut()) {
                let slot = ci.wrapping_add(k) % SQ_RING_ENTRIES;
                *q = bar2.load_u32(base + SQ_RING_QPN_OFFSET + 4 * slot);
            }
            // (Acquire loads: the producer index is read again after the entries.) The
            // writer overwrites the entry of index `ci` when it writes index
            // `ci + SQ_RING_ENTRIES`, with the producer index at that value: below it, all
            // entries read were the ones published.
        }
        let again = bar2.load_u32(base + SQ_RING_PI);
        ok &= again.wrapping_sub(ci) < SQ_RING_ENTRIES;
        *ci_ref = if ok { pi } else { again };
        ok.then_some(n as usize)
    }
}

impl HcaState {
    /// DB_SQ: runs the send queues that the rings name, then looks at the QPs no ring names
    /// (or, after a ring overran, at every live QP).
    pub(crate) fn send_doorbell(&mut self) {
        let mut overran = false;
        if self.sq_rings.kernel_qps > 0 {
            let used = self.dev.bar2.load_u32(BAR2_SQ_RING_OFFSET + SQ_RINGS_USED);
            let used = if used == 0 {
                SQ_RINGS
            } else {
                used.min(SQ_RINGS)
            };
            for r in 0..used {
                overran |= !self.drain_sq_ring(Ring::Kernel(r));
            }
        }
        for i in 0..self.sq_rings.active_uars.len() {
            let Some(&p) = self.sq_rings.active_uars.get(i) else {
                break;
            };
            overran |= !self.drain_sq_ring(Ring::Uar(p));
        }
        if overran {
            self.dev.stats.sq_ring_overruns += 1;
        }
        // A turn that left work (its thread may be held up in the fabric's pump before it
        // goes on) is gone on with here, as a send doorbell did before the rings.
        if overran || std::mem::take(&mut self.dev.turn.more_work) {
            self.scan_send_queues();
        } else if !self.sq_rings.unnamed.is_empty() {
            self.scan_unnamed_send_queues();
        }
    }

    /// Runs the send queues `ring` names; false if it overran (nothing run).
    fn drain_sq_ring(&mut self, ring: Ring) -> bool {
        // (Most rings are empty at most doorbells: they are passed over on one load, without
        // the room for a ring's entries made ready.)
        if !self.sq_rings.has_new(&self.dev.bar2, ring) {
            return true;
        }
        let mut qpns = [0u32; SQ_RING_ENTRIES as usize];
        let Some(n) = self.sq_rings.take(&self.dev.bar2, ring, &mut qpns) else {
            return false;
        };
        for &qpn in qpns.iter().take(n) {
            let ok = self
                .qps
                .get(qpn)
                .is_some_and(|qp| qp.sq_named && ring.holds(qp.db));
            if !ok {
                self.dev.stats.sq_ring_ignored += 1;
                continue;
            }
            self.dev.stats.sq_named += 1;
            // (Named again and again while posting: most entries find nothing new.)
            let idle = match self.sq_hints.get(qpn as usize) {
                Some(SqHint::Still) => true,
                Some(&SqHint::Idle { ci, db }) => self.dev.bar2.load_u32(db) == ci,
                _ => false,
            };
            if !idle {
                self.run_send_queue(qpn);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_records_belong_to_the_kernel_or_their_uar_page() {
        assert_eq!(owner_of(BAR2_QP_DB_OFFSET), Some(Owner::Kernel));
        assert_eq!(owner_of(BAR2_CQ_DB_OFFSET), None);
        assert_eq!(owner_of(BAR2_UAR_OFFSET + 8), Some(Owner::Uar(0)));
        assert_eq!(
            owner_of(BAR2_UAR_OFFSET + 3 * UAR_SIZE + 0x10),
            Some(Owner::Uar(3))
        );
        assert!(Ring::Kernel(5).holds(BAR2_QP_DB_OFFSET + 8 * 7));
        assert!(!Ring::Kernel(0).holds(BAR2_UAR_OFFSET));
        assert!(Ring::Uar(2).holds(BAR2_UAR_OFFSET + 2 * UAR_SIZE));
        assert!(!Ring::Uar(2).holds(BAR2_UAR_OFFSET + 3 * UAR_SIZE));
        assert!(!Ring::Uar(0).holds(BAR2_QP_DB_OFFSET));
    }

    fn ring_with(bar2: &DeviceMemory, ring: Ring, pi: u32, qpns: &[(u32, u32)]) {
        for &(i, q) in qpns {
            bar2.store_u32(
                ring.base() + SQ_RING_QPN_OFFSET + 4 * (i % SQ_RING_ENTRIES),
                q,
            );
        }
        bar2.store_u32(ring.base() + SQ_RING_PI, pi);
    }

    #[test]
    fn test_a_ring_is_read_from_the_devices_own_consumer_index() {
        let bar2 = DeviceMemory::new().unwrap();
        let mut rings = SqRings::default();
        rings.add(&bar2, 5, BAR2_QP_DB_OFFSET + 40, true);
        let ring = Ring::Kernel(3);
        let mut out = [0; SQ_RING_ENTRIES as usize];
        ring_with(&bar2, ring, 2, &[(0, 5), (1, 9)]);
        assert_eq!(rings.take(&bar2, ring, &mut out), Some(2));
        assert_eq!(out[..2], [5, 9]);
        assert_eq!(rings.take(&bar2, ring, &mut out), Some(0), "taken once");
        // Across the wrap of the slots and of the index.
        rings.kernel_ci[3] = u32::MAX - 1;
        ring_with(&bar2, ring, 1, &[(u32::MAX - 1, 7), (u32::MAX, 8), (0, 6)]);
        assert_eq!(rings.take(&bar2, ring, &mut out), Some(3));
        assert_eq!(out[..3], [7, 8, 6]);
    }

    #[test]
    fn test_a_ring_run_a_lap_ahead_is_not_read_and_resyncs() {
        let bar2 = DeviceMemory::new().unwrap();
        let mut rings = SqRings::default();
        let ring = Ring::Uar(4);
        rings.add(&bar2, 5, BAR2_UAR_OFFSET + 4 * UAR_SIZE, true);
        let mut out = [0; SQ_RING_ENTRIES as usize];
        for lie in [SQ_RING_ENTRIES, SQ_RING_ENTRIES + 1, u32::MAX] {
            let ci = rings.uar_ci[4];
            ring_with(&bar2, ring, ci.wrapping_add(lie), &[]);
            assert_eq!(rings.take(&bar2, ring, &mut out), None, "{lie}");
            assert_eq!(rings.uar_ci[4], ci.wrapping_add(lie));
        }
        ring_with(&bar2, ring, rings.uar_ci[4] + SQ_RING_ENTRIES - 1, &[]);
        assert_eq!(
            rings.take(&bar2, ring, &mut out),
            Some(SQ_RING_ENTRIES as usize - 1)
        );
    }

    #[test]
    fn test_a_ring_naming_its_first_qp_starts_at_its_producer_index() {
        let bar2 = DeviceMemory::new().unwrap();
        let ring = Ring::Uar(1);
        ring_with(&bar2, ring, 1000, &[]);
        let mut rings = SqRings::default();
        let db = BAR2_UAR_OFFSET + UAR_SIZE + 8;
        rings.add(&bar2, 9, db, true);
        assert_eq!(rings.uar_ci[1], 1000);
        assert_eq!(rings.active_uars, [1]);
        rings.remove(9, db, true);
        assert!(rings.active_uars.is_empty());
        rings.add(&bar2, 10, BAR2_QP_DB_OFFSET, false);
        assert_eq!(rings.unnamed, [10]);
        rings.remove(10, BAR2_QP_DB_OFFSET, false);
        assert!(rings.unnamed.is_empty());
    }
}
