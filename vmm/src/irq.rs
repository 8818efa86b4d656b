//! Interrupt plumbing shared by every PCI function of a machine: the VM's GSI routing table
//! and the MSI-X table layout.
//!
//! KVM_SET_GSI_ROUTING replaces the whole table, so one owner ([`GsiRouter`]) keeps it: the
//! irqchip pins KVM starts with, plus an MSI route per GSI that a device allocated. Each
//! device's vectors are irqfds on its GSIs; the routes follow the guest's MSI-X table.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use hca_model::sync::Unpoisoned;
use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;

/// The IOAPIC's pins; MSI GSIs are handed out above them.
pub const IOAPIC_PINS: u32 = 24;
/// KVM's default routing table size (KVM_MAX_IRQ_ROUTES is larger, this is plenty).
const MAX_GSI: u32 = 1024;

/// An MSI message: address low, address high, data.
pub type MsiMessage = [u32; 3];

pub struct GsiRouter {
    vm: Arc<VmFd>,
    routes: Mutex<Routes>,
}

struct Routes {
    next_gsi: u32,
    msi: BTreeMap<u32, MsiMessage>,
}

/// Why GSIs could not be allocated or routed.
#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    #[error("no GSIs left for {0} more MSI vectors")]
    NoGsis(u32),
    #[error("GSI routing table: {0:?}")]
    Table(#[source] vmm_sys_util::fam::Error),
    #[error("KVM_SET_GSI_ROUTING: {0}")]
    SetRouting(#[source] kvm_ioctls::Error),
}

impl GsiRouter {
    /// The router of `vm`, with the irqchip routes installed.
    pub fn new(vm: Arc<VmFd>) -> Result<Arc<Self>, IrqError> {
        let r = Arc::new(Self {
            vm,
            routes: Mutex::new(Routes {
                next_gsi: IOAPIC_PINS,
                msi: BTreeMap::new(),
            }),
        });
        r.commit(&r.routes.lock_unpoisoned())?;
        Ok(r)
    }

    pub fn vm(&self) -> &Arc<VmFd> {
        &self.vm
    }

    /// `n` consecutive GSIs for one device's vectors; the first.
    pub fn allocate(&self, n: u32) -> Result<u32, IrqError> {
        let mut r = self.routes.lock_unpoisoned();
        let base = r.next_gsi;
        if base + n > MAX_GSI {
            return Err(IrqError::NoGsis(n));
        }
        r.next_gsi += n;
        Ok(base)
    }

    /// Points each `(gsi, message)` at its MSI message and installs the table.
    pub fn set_msi(&self, changes: &[(u32, MsiMessage)]) -> Result<(), IrqError> {
        let mut r = self.routes.lock_unpoisoned();
        for &(gsi, m) in changes {
            r.msi.insert(gsi, m);
        }
        self.commit(&r)
    }

    fn commit(&self, r: &Routes) -> Result<(), IrqError> {
        let chip = |gsi: u32, irqchip: u32, pin: u32| {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_IRQCHIP,
                ..Default::default()
            };
            e.u.irqchip.irqchip = irqchip;
            e.u.irqchip.pin = pin;
            e
        };
        let mut entries = Vec::new();
        for gsi in 0..IOAPIC_PINS {
            // GSI 2 is the PIC cascade; the IOAPIC's pin 2 takes the timer.
            if gsi < 16 && gsi != 2 {
                let (c, pin) = if gsi < 8 {
                    (KVM_IRQCHIP_PIC_MASTER, gsi)
                } else {
                    (KVM_IRQCHIP_PIC_SLAVE, gsi - 8)
                };
                entries.push(chip(gsi, c, pin));
            }
            entries.push(chip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
        }
        for (&gsi, m) in &r.msi {
            let mut e = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            e.u.msi.address_lo = m[0];
            e.u.msi.address_hi = m[1];
            e.u.msi.data = m[2];
            entries.push(e);
        }
        let routing = KvmIrqRouting::from_entries(&entries).map_err(IrqError::Table)?;
        self.vm
            .set_gsi_routing(&routing)
            .map_err(IrqError::SetRouting)
    }
}

/// The guest-visible MSI-X state of a function: the table (16 bytes a vector: address low,
/// address high, data, vector control) and the capability's enable and function-mask bits.
/// The pending bits stay with the device, which knows what it held back.
pub struct MsixTable {
    entries: Vec<[u32; 4]>,
    pub enabled: bool,
    pub function_mask: bool,
}

impl MsixTable {
    /// `vectors` entries, each masked, as after reset.
    pub fn new(vectors: usize) -> Self {
        Self {
            entries: vec![[0, 0, 0, 1]; vectors],
            enabled: false,
            function_mask: false,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether vector `v` may interrupt now.
    pub fn deliverable(&self, v: usize) -> bool {
        self.enabled && !self.function_mask && self.entries.get(v).is_some_and(|e| e[3] & 1 == 0)
    }

    /// Vector `v`'s address and data (zeros past the table's end).
    pub fn message(&self, v: usize) -> MsiMessage {
        let [lo, hi, data, _] = self.entries.get(v).copied().unwrap_or_default();
        [lo, hi, data]
    }

    /// The dword at byte offset `off` of the table (0 past its end).
    pub fn read(&self, off: u64) -> u32 {
        let (v, f) = ((off / 16) as usize, ((off % 16) / 4) as usize);
        self.entries
            .get(v)
            .and_then(|e| e.get(f))
            .copied()
            .unwrap_or(0)
    }

    /// Writes the dword at `off`; the vector written and whether its message changed
    /// (None past the table's end).
    pub fn write(&mut self, off: u64, val: u32) -> Option<(usize, bool)> {
        let (v, f) = ((off / 16) as usize, ((off % 16) / 4) as usize);
        let word = self.entries.get_mut(v)?.get_mut(f)?;
        let changed = f < 3 && *word != val;
        *word = if f == 3 { val & 1 } else { val };
        Some((v, changed))
    }

    /// The capability's Message Control word: table size - 1, function mask, enable.
    pub fn control(&self) -> u32 {
        (self.entries.len() as u32 - 1)
            | u32::from(self.function_mask) << 14
            | u32::from(self.enabled) << 15
    }

    /// Applies a write of Message Control (only the two writable bits count).
    pub fn set_control(&mut self, ctl: u32) {
        self.enabled = ctl & 1 << 15 != 0;
        self.function_mask = ctl & 1 << 14 != 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_msix_table_reads_back_and_masks_until_enabled() {
        let mut t = MsixTable::new(4);
        assert_eq!(t.control(), 3);
        assert!(!t.deliverable(1), "masked and disabled at reset");
        assert_eq!(t.write(16, 0xfee0_0000), Some((1, true)));
        assert_eq!(t.write(16 + 8, 0x41), Some((1, true)));
        assert_eq!(t.write(16 + 8, 0x41), Some((1, false)), "same message");
        assert_eq!(
            t.write(16 + 12, 0),
            Some((1, false)),
            "unmask is not a message"
        );
        assert!(!t.deliverable(1), "still disabled");
        t.set_control(1 << 15);
        assert!(t.deliverable(1) && !t.deliverable(0));
        t.set_control(1 << 15 | 1 << 14);
        assert!(!t.deliverable(1), "function mask");
        assert_eq!(t.message(1), [0xfee0_0000, 0, 0x41]);
        assert_eq!(t.read(16 + 8), 0x41);
        assert_eq!(t.write(4 * 16, 1), None, "past the table");
        assert_eq!(t.read(4 * 16), 0);
    }
}
