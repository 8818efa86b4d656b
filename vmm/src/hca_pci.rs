//! The HCA as a PCI function of a KVM machine, with the same guest ABI as under QEMU's
//! ivshmem-doorbell: BAR0 registers (the doorbell at 0x0c), BAR1 the MSI-X table and PBA,
//! BAR2 the model's device memory mapped straight into the guest as a memory slot. The ID
//! is the VMM's own (1234:21a8), which the guest driver binds as well.
//!
//! Interrupts: the model raises vector v -> an irqfd on the v-th GSI the machine's router
//! gave the function, whose route follows the guest's MSI-X table entry; a masked vector
//! (or function) sets its PBA bit and fires when unmasked.

use std::sync::{Arc, Mutex};

use hca_model::abi::{BAR2_SIZE, NUM_VECTORS, PCI_DEVICE_HCABENCH, PCI_VENDOR_HCABENCH};
use hca_model::sync::Unpoisoned;
use hca_model::InterruptSink;
use vmm_sys_util::eventfd::EventFd;

use super::irq::{GsiRouter, IrqError, MsixTable};
use super::pci::{ConfigSpace, PciFunction};

/// Where the BARs start (the guest may move them; the machine follows).
pub const BAR0_GPA: u64 = 0xe000_0000;
pub const BAR1_GPA: u64 = 0xe000_1000;
pub const BAR2_GPA: u64 = 0xe010_0000;
pub const BAR0_SIZE: u64 = 0x1000;
pub const BAR1_SIZE: u64 = 0x1000;
const PBA_OFFSET: u64 = 0x800;
const MSIX_CAP: u32 = 0x40;
const NV: usize = NUM_VECTORS as usize;

/// The MSI-X side: table, PBA, irqfds on the GSIs the router gave it. The model's
/// [`InterruptSink`].
pub struct Msix {
    router: Arc<GsiRouter>,
    gsi_base: u32,
    irqfds: Vec<EventFd>,
    state: Mutex<MsixState>,
}

struct MsixState {
    table: MsixTable,
    /// Vectors raised while masked (the PBA).
    pending: u32,
}

/// Why the HCA's MSI-X vectors could not be wired to the VM.
#[derive(Debug, thiserror::Error)]
pub enum MsixError {
    #[error(transparent)]
    Gsi(#[from] IrqError),
    #[error("eventfd: {0}")]
    Eventfd(#[source] std::io::Error),
    #[error("KVM_IRQFD for vector {vector}: {source}")]
    Irqfd {
        vector: u32,
        source: kvm_ioctls::Error,
    },
}

impl Msix {
    pub fn new(router: Arc<GsiRouter>) -> Result<Arc<Self>, MsixError> {
        let gsi_base = router.allocate(NUM_VECTORS)?;
        let mut irqfds = Vec::new();
        for v in 0..NUM_VECTORS {
            let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(MsixError::Eventfd)?;
            router
                .vm()
                .register_irqfd(&fd, gsi_base + v)
                .map_err(|source| MsixError::Irqfd { vector: v, source })?;
            irqfds.push(fd);
        }
        Ok(Arc::new(Self {
            router,
            gsi_base,
            irqfds,
            state: Mutex::new(MsixState {
                table: MsixTable::new(NV),
                pending: 0,
            }),
        }))
    }

    fn fire_pending(&self, s: &mut MsixState) {
        for v in 0..NV {
            if s.pending & (1 << v) != 0 && s.table.deliverable(v) {
                s.pending &= !(1 << v);
                if let Some(fd) = self.irqfds.get(v) {
                    let _ = fd.write(1);
                }
            }
        }
    }

    /// A 4-byte read at `off` in BAR1 (table, then PBA).
    pub fn bar_read(&self, off: u64) -> u32 {
        let s = self.state.lock_unpoisoned();
        if off >= PBA_OFFSET {
            return if off == PBA_OFFSET { s.pending } else { 0 };
        }
        s.table.read(off)
    }

    pub fn bar_write(&self, off: u64, val: u32) {
        let mut s = self.state.lock_unpoisoned();
        if off >= PBA_OFFSET {
            return;
        }
        // Every vector keeps a route, even a masked one: delivery is gated here.
        if let Some((v, true)) = s.table.write(off, val) {
            let gsi = self.gsi_base + v as u32;
            if let Err(e) = self.router.set_msi(&[(gsi, s.table.message(v))]) {
                log::error!("MSI-X vector {v}: {e}");
            }
        }
        self.fire_pending(&mut s);
    }

    fn set_control(&self, ctl: u32) {
        let mut s = self.state.lock_unpoisoned();
        s.table.set_control(ctl);
        self.fire_pending(&mut s);
    }

    fn control(&self) -> u32 {
        self.state.lock_unpoisoned().table.control()
    }
}

impl InterruptSink for Msix {
    fn raise(&self, vector: u32) {
        let v = vector as usize;
        if v >= NV {
            return;
        }
        let mut s = self.state.lock_unpoisoned();
        if s.table.deliverable(v) {
            if let Some(fd) = self.irqfds.get(v) {
                let _ = fd.write(1);
            }
        } else {
            s.pending |= 1 << v;
        }
    }
}

/// The dword offsets an access of `len` bytes at BAR1 offset `off` touches: the MSI-X table
/// and PBA take aligned dword and qword accesses (a qword is two dwords, low first); any
/// other access touches nothing (reads as zero, writes are dropped).
pub fn msix_dwords(off: u64, len: usize) -> impl Iterator<Item = u64> {
    let ok = off % 4 == 0 && (len == 4 || (len == 8 && off % 8 == 0));
    let n = if ok { len as u64 / 4 } else { 0 };
    (0..n).map(move |k| off + 4 * k)
}

/// A BAR the guest moved: the machine re-registers what hangs off it.
pub type BarMoved = Box<dyn FnMut(usize, u64, u64) + Send>;

/// The function's configuration space.
pub struct HcaPci {
    config: ConfigSpace,
    /// Guest-physical base of BAR0, BAR1, BAR2 (64-bit) as mapped (moves take effect while
    /// memory decoding is on, so BAR sizing never maps).
    mapped: [u64; 3],
    msix: Arc<Msix>,
    on_move: BarMoved,
}

/// The BAR numbers of BAR0, BAR1 and BAR2 (BAR2 is 64-bit: BAR3 is its upper half).
const BARS: [usize; 3] = [0, 1, 2];
const COMMAND_WRITABLE: u32 = 0x0547;
const STATUS_CAP_LIST: u32 = 0x0010 << 16;

impl HcaPci {
    pub fn new(msix: Arc<Msix>, on_move: BarMoved) -> Self {
        let ids = PCI_DEVICE_HCABENCH << 16 | PCI_VENDOR_HCABENCH;
        let mut config = ConfigSpace::new();
        config.set(0x00, ids, 0);
        config.set(0x04, STATUS_CAP_LIST, COMMAND_WRITABLE);
        config.set(0x08, 0x0c06_0001, 0); // class: InfiniBand controller, rev 1
        config.set_bar(0, BAR0_GPA, BAR0_SIZE, false, false);
        config.set_bar(1, BAR1_GPA, BAR1_SIZE, false, false);
        config.set_bar(2, BAR2_GPA, u64::from(BAR2_SIZE), true, true);
        config.set(0x2c, ids, 0);
        config.set(0x34, MSIX_CAP, 0);
        // MSI-X: the capability header reads from the table's state (below).
        config.set(MSIX_CAP + 4, 1, 0); // table: BAR1 offset 0
        config.set(MSIX_CAP + 8, PBA_OFFSET as u32 | 1, 0); // PBA: BAR1
        Self {
            config,
            mapped: [BAR0_GPA, BAR1_GPA, BAR2_GPA],
            msix,
            on_move,
        }
    }

    /// Where the BARs are mapped now.
    pub fn mapped_bars(&self) -> [u64; 3] {
        self.mapped
    }

    fn apply_moves(&mut self) {
        if self.config.read(0x04) & 2 == 0 {
            return;
        }
        for (i, (&bar, mapped)) in BARS.iter().zip(self.mapped.iter_mut()).enumerate() {
            let now = self.config.bar_base(bar);
            if now != *mapped {
                (self.on_move)(i, *mapped, now);
                *mapped = now;
            }
        }
    }
}

impl PciFunction for HcaPci {
    fn config_read(&mut self, off: u32) -> u32 {
        match off {
            MSIX_CAP => 0x11 | self.msix.control() << 16,
            _ => self.config.read(off),
        }
    }

    fn config_write(&mut self, off: u32, val: u32, mask: u32) {
        if off == MSIX_CAP {
            let ctl = ((self.config_read(MSIX_CAP) & !mask) | (val & mask)) >> 16;
            self.msix.set_control(ctl);
        } else {
            // Sizing writes all ones; a BAR's writable bits keep it aligned to its size.
            self.config.write(off, val, mask);
        }
        self.apply_moves();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_msix_takes_aligned_dwords_and_qwords_only() {
        let d = |off, len| msix_dwords(off, len).collect::<Vec<_>>();
        assert_eq!(d(0x10, 4), [0x10]);
        assert_eq!(d(0x10, 8), [0x10, 0x14], "a qword's high half is not lost");
        assert!(d(0x14, 8).is_empty(), "a misaligned qword");
        assert!(d(0x11, 4).is_empty(), "a misaligned dword");
        assert!(
            d(0x10, 2).is_empty() && d(0x10, 1).is_empty(),
            "a partial write"
        );
        assert!(d(0x10, 16).is_empty());
    }
}
