//! VFIO passthrough (feature `vfio`): a host PCI function bound to vfio-pci joins a KVM
//! machine's PCI bus next to the emulated HCA, for mixed clusters of emulated and real
//! adapters. Only built on the project's hosts (they have no IOMMU and no spare adapter);
//! docs/vmm.md says so.
//!
//! - DMA: the machine's RAM is mapped into the VFIO container's IOMMU domain at its
//!   guest-physical addresses, so the device DMAs with the addresses its guest driver gives.
//! - Config space: the device's own through the VFIO config region, virtualised by
//!   [`VirtualConfig`] (BARs, MSI-X control, MSI hidden).
//! - BARs: each memory BAR the kernel lets us mmap becomes KVM memory slots at the guest's
//!   base (guest accesses go straight to the device); the page(s) holding the MSI-X table
//!   stay unmapped, so those accesses exit and the VMM owns the table. A BAR that cannot
//!   be mmapped is trapped entirely and forwarded through the region's file offset.
//! - Interrupts: a GSI and an eventfd per MSI-X vector; VFIO signals the eventfd, KVM's
//!   irqfd injects the route the guest's table entry gives. A masked vector's irqfd is
//!   detached; KVM replays an eventfd that fired meanwhile when it is attached again.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use kvm_ioctls::VmFd;
use vfio_ioctls::{VfioContainer, VfioDevice, VfioDeviceFd, VfioOps};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::boot;
use super::irq::{GsiRouter, IrqError, MsixTable};
use super::pci::{PciFunction, TrappedBars};
use super::vfio_config::{ConfigWrite, VirtualConfig};

const CONFIG_REGION: u32 = 7;
const REGION_FLAG_MMAP: u32 = 1 << 2;
const PAGE: u64 = 0x1000;

/// Guest-physical window the machine gives passed-through BARs (between RAM's top at
/// 3 GiB and the emulated HCA's BARs).
pub const BAR_WINDOW: std::ops::Range<u64> = 0xc000_0000..0xe000_0000;

/// Why a host function could not be passed through.
#[derive(Debug, thiserror::Error)]
pub enum PassthroughError {
    #[error("VFIO {name}: KVM VFIO device: {source}")]
    KvmDevice {
        name: String,
        source: kvm_ioctls::Error,
    },
    #[error("VFIO {name}: the VFIO container (is vfio-pci loaded, the IOMMU on?): {source}")]
    Container {
        name: String,
        source: vfio_ioctls::VfioError,
    },
    #[error(
        "VFIO {name}: open (is it bound to vfio-pci, and is /dev/vfio/<group> yours?): {source}"
    )]
    Open {
        name: String,
        source: vfio_ioctls::VfioError,
    },
    #[error("VFIO {name}: IOMMU map: {source}")]
    IommuMap {
        name: String,
        source: vfio_ioctls::VfioError,
    },
    #[error(
        "BAR{bar} ({size:#x} bytes) does not fit the {} MiB window for passed-through BARs",
        (BAR_WINDOW.end - BAR_WINDOW.start) >> 20
    )]
    BarWindow { bar: usize, size: u64 },
    #[error(transparent)]
    Gsi(#[from] IrqError),
    #[error("eventfd: {0}")]
    Eventfd(#[source] std::io::Error),
}

/// A piece of a BAR mapped into the guest: host mapping, offset in the BAR, KVM slot.
struct Piece {
    slot: u32,
    bar_offset: u64,
    len: u64,
}

struct BarMap {
    /// The mmap of the whole region (null when the BAR is trapped entirely).
    host: *mut libc::c_void,
    len: u64,
    pieces: Vec<Piece>,
    /// Where the pieces are mapped now (None: memory decoding off or never mapped).
    mapped_at: Option<u64>,
}

// SAFETY: `host` is a shared mapping of the device's region, owned by this BarMap and
// only handed to KVM; moving it between threads is fine.
unsafe impl Send for BarMap {}

pub struct VfioPci {
    name: String,
    device: Arc<VfioDevice>,
    _container: Arc<VfioContainer>,
    vm: Arc<VmFd>,
    router: Arc<GsiRouter>,
    config: VirtualConfig,
    bars: Vec<BarMap>,
    memory_enabled: bool,
    table: MsixTable,
    gsi_base: u32,
    vectors: Vec<EventFd>,
    /// Which vectors' irqfds are attached to KVM now.
    attached: Vec<bool>,
    msix_running: bool,
}

impl VfioPci {
    /// Opens the function at `sysfs` (e.g. /sys/bus/pci/devices/0000:03:00.0, bound to
    /// vfio-pci), maps `mem` for its DMA and places its BARs from `BAR_WINDOW`, taking KVM
    /// slots from `*next_slot`.
    pub fn new(
        sysfs: &Path,
        vm: Arc<VmFd>,
        router: Arc<GsiRouter>,
        mem: &GuestMemoryMmap,
        next_slot: &mut u32,
    ) -> Result<Self, PassthroughError> {
        let name = sysfs.display().to_string();
        let mut kvm_vfio = kvm_bindings::kvm_create_device {
            type_: kvm_bindings::kvm_device_type_KVM_DEV_TYPE_VFIO,
            fd: 0,
            flags: 0,
        };
        let kvm_dev =
            vm.create_device(&mut kvm_vfio)
                .map_err(|source| PassthroughError::KvmDevice {
                    name: name.clone(),
                    source,
                })?;
        let container = Arc::new(
            VfioContainer::new(Some(Arc::new(VfioDeviceFd::new_from_kvm(kvm_dev)))).map_err(
                |source| PassthroughError::Container {
                    name: name.clone(),
                    source,
                },
            )?,
        );
        let device = VfioDevice::new(sysfs, container.clone() as Arc<dyn VfioOps>, false).map_err(
            |source| PassthroughError::Open {
                name: name.clone(),
                source,
            },
        )?;
        // SAFETY: guest RAM is only ever touched through vm-memory's volatile accessors
        // and by guests; it stays mapped as long as the machine, which owns this device.
        unsafe { container.vfio_map_guest_memory(mem) }.map_err(|source| {
            PassthroughError::IommuMap {
                name: name.clone(),
                source,
            }
        })?;
        let device = Arc::new(device);
        let sizes: [u64; 6] = std::array::from_fn(|i| device.get_region_size(i as u32));
        let mut config = VirtualConfig::parse(|off| config_dword(&device, off), sizes);
        place_bars(&mut config)?;
        let vectors = config.msix.map_or(0, |m| m.vectors);
        let gsi_base = router.allocate(vectors)?;
        let mut me = Self {
            name,
            bars: Vec::new(),
            vectors: (0..vectors)
                .map(|_| EventFd::new(libc::EFD_NONBLOCK).map_err(PassthroughError::Eventfd))
                .collect::<Result<_, _>>()?,
            attached: vec![false; vectors as usize],
            table: MsixTable::new(vectors as usize),
            device,
            _container: container,
            vm,
            router,
            config,
            memory_enabled: false,
            gsi_base,
            msix_running: false,
        };
        for i in 0..6 {
            let bar = me.map_bar(i, next_slot)?;
            me.bars.push(bar);
        }
        Ok(me)
    }

    /// mmaps BAR `i` where the kernel allows it and cuts it into slots around the MSI-X
    /// table's pages.
    fn map_bar(&self, i: usize, next_slot: &mut u32) -> Result<BarMap, PassthroughError> {
        let mut bar = BarMap {
            host: std::ptr::null_mut(),
            len: 0,
            pieces: Vec::new(),
            mapped_at: None,
        };
        let size = self.device.get_region_size(i as u32);
        if self.config.bar_base(i).is_none()
            || self.device.get_region_flags(i as u32) & REGION_FLAG_MMAP == 0
            || size % PAGE != 0
        {
            return Ok(bar);
        }
        // SAFETY: a fresh shared mapping of the device fd at the region's offset; the
        // result is checked and owned by `bar` (unmapped in Drop).
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.device.as_raw_fd(),
                self.device.get_region_offset(i as u32) as libc::off_t,
            )
        };
        if host == libc::MAP_FAILED {
            log::warn!(
                "VFIO {}: BAR{i} cannot be mmapped ({}); trapping it",
                self.name,
                std::io::Error::last_os_error()
            );
            return Ok(bar);
        }
        bar.host = host;
        bar.len = size;
        let hole = self.table_pages(i);
        let mut cuts = vec![(0, size)];
        if let Some((s, e)) = hole {
            cuts = vec![(0, s), (e, size)];
        }
        for (s, e) in cuts.into_iter().filter(|(s, e)| e > s) {
            bar.pieces.push(Piece {
                slot: *next_slot,
                bar_offset: s,
                len: e - s,
            });
            *next_slot += 1;
        }
        Ok(bar)
    }

    /// The page-aligned byte range of BAR `i` that holds the MSI-X table, if any.
    fn table_pages(&self, i: usize) -> Option<(u64, u64)> {
        let m = self.config.msix.filter(|m| m.table_bar == i)?;
        let end = m.table_offset + 16 * u64::from(m.vectors);
        Some((m.table_offset & !(PAGE - 1), end.div_ceil(PAGE) * PAGE))
    }

    /// Moves every mapped BAR to where the guest put it (or unmaps all when memory
    /// decoding is off).
    fn remap(&mut self) {
        for i in 0..self.bars.len() {
            let want = self.config.bar_base(i).filter(|_| self.memory_enabled);
            let Some(bar) = self.bars.get_mut(i) else {
                continue;
            };
            if bar.mapped_at == want || bar.host.is_null() {
                continue;
            }
            for p in &bar.pieces {
                let host = bar.host as u64 + p.bar_offset;
                // SAFETY: `host` lies in the BAR's mapping, which lives until Drop
                // removes these slots.
                let r = unsafe {
                    match want {
                        Some(base) => {
                            boot::map_slot(&self.vm, p.slot, base + p.bar_offset, p.len, host)
                        }
                        None => boot::map_slot(&self.vm, p.slot, 0, 0, host),
                    }
                };
                if let Err(e) = r {
                    log::error!("VFIO {}: BAR{i}: {e}", self.name);
                }
            }
            bar.mapped_at = want;
        }
    }

    fn table_write(&mut self, off: u64, val: u32) {
        if let Some((v, changed)) = self.table.write(off, val) {
            if changed {
                let gsi = self.gsi_base + v as u32;
                if let Err(e) = self.router.set_msi(&[(gsi, self.table.message(v))]) {
                    log::error!("VFIO {}: MSI-X vector {v}: {e}", self.name);
                }
            }
            self.sync_vectors();
        }
    }

    /// Starts or stops the device's MSI-X in VFIO with the guest's enable bit, and
    /// attaches exactly the deliverable vectors' irqfds.
    fn sync_vectors(&mut self) {
        if self.table.enabled != self.msix_running {
            let r = if self.table.enabled {
                self.device.enable_msix(self.vectors.iter().collect())
            } else {
                self.device.disable_msix()
            };
            match r {
                Ok(()) => self.msix_running = self.table.enabled,
                Err(e) => log::error!(
                    "VFIO {}: MSI-X enable={}: {e}",
                    self.name,
                    self.table.enabled
                ),
            }
        }
        for v in 0..self.vectors.len() {
            let want = self.msix_running && self.table.deliverable(v);
            let (Some(&attached), Some(fd)) = (self.attached.get(v), self.vectors.get(v)) else {
                continue;
            };
            if want == attached {
                continue;
            }
            let gsi = self.gsi_base + v as u32;
            let r = if want {
                self.vm.register_irqfd(fd, gsi)
            } else {
                self.vm.unregister_irqfd(fd, gsi)
            };
            match r {
                Ok(()) => {
                    if let Some(a) = self.attached.get_mut(v) {
                        *a = want;
                    }
                }
                Err(e) => log::error!("VFIO {}: irqfd for vector {v}: {e}", self.name),
            }
        }
    }
}

/// A config dword straight from the device.
fn config_dword(device: &VfioDevice, off: u32) -> u32 {
    let mut b = [0u8; 4];
    device.region_read(CONFIG_REGION, &mut b, u64::from(off));
    u32::from_le_bytes(b)
}

/// Gives each memory BAR a naturally aligned base in [`BAR_WINDOW`], largest first (as
/// firmware would, so the guest finds them assigned).
fn place_bars(config: &mut VirtualConfig) -> Result<(), PassthroughError> {
    let mut order: Vec<usize> = (0..6).filter(|&i| config.bar_base(i).is_some()).collect();
    let size_of = |c: &VirtualConfig, i: usize| c.bars.get(i).map_or(0, |b| b.size);
    order.sort_by_key(|&i| std::cmp::Reverse(size_of(config, i)));
    let mut next = BAR_WINDOW.start;
    for i in order {
        let size = size_of(config, i);
        let base = next.div_ceil(size) * size;
        if base + size > BAR_WINDOW.end {
            return Err(PassthroughError::BarWindow { bar: i, size });
        }
        config.set_bar_base(i, base);
        next = base + size;
    }
    Ok(())
}

impl PciFunction for VfioPci {
    fn config_read(&mut self, off: u32) -> u32 {
        let dev = config_dword(&self.device, off);
        self.config.read(off, dev, self.table.control())
    }

    fn config_write(&mut self, off: u32, val: u32, mask: u32) {
        match self.config.write(off, val, mask) {
            ConfigWrite::Dropped => {}
            ConfigWrite::Bar => self.remap(),
            ConfigWrite::MsixControl(ctl) => {
                self.table.set_control(ctl);
                self.sync_vectors();
            }
            w @ (ConfigWrite::Device | ConfigWrite::Command { .. }) => {
                // Only the bytes the guest wrote reach the device.
                let bytes = val.to_le_bytes();
                for k in (0..4).filter(|k| mask >> (8 * k) & 0xff != 0) {
                    let at = u64::from(off) + k as u64;
                    let byte = bytes.get(k..=k).unwrap_or_default();
                    self.device.region_write(CONFIG_REGION, byte, at);
                }
                if let ConfigWrite::Command { memory } = w {
                    self.memory_enabled = memory;
                    self.remap();
                }
            }
        }
    }
}

/// An access that exited: in a BAR but not in a mapped piece (the MSI-X table, or a
/// trapped BAR).
impl TrappedBars for VfioPci {
    fn mmio(&mut self, gpa: u64, read: Option<&mut [u8]>, write: Option<&[u8]>) -> bool {
        let Some((i, off)) = (0..6).find_map(|i| {
            let base = self.config.bar_base(i).filter(|_| self.memory_enabled)?;
            (base..base + self.config.bars.get(i).map_or(0, |b| b.size))
                .contains(&gpa)
                .then_some((i, gpa - base))
        }) else {
            return false;
        };
        let table = self.config.msix.filter(|m| {
            m.table_bar == i
                && (m.table_offset..m.table_offset + 16 * u64::from(m.vectors)).contains(&off)
        });
        if let Some(m) = table {
            let t = off - m.table_offset;
            match (read, write) {
                (Some(r), _) => {
                    let v = self.table.read(t & !3).to_le_bytes();
                    let at = (t & 3) as usize;
                    for (k, b) in r.iter_mut().enumerate() {
                        *b = v.get(at + k).copied().unwrap_or(0);
                    }
                }
                (None, Some(w)) => {
                    let mut v = [0u8; 4];
                    for (d, s) in v.iter_mut().zip(w) {
                        *d = *s;
                    }
                    self.table_write(t & !3, u32::from_le_bytes(v));
                }
                _ => {}
            }
            return true;
        }
        let size = self.device.get_region_size(i as u32);
        match (read, write) {
            (Some(r), _) if off + r.len() as u64 <= size => {
                self.device.region_read(i as u32, r, off)
            }
            (Some(r), _) => r.fill(0xff),
            (None, Some(w)) if off + w.len() as u64 <= size => {
                self.device.region_write(i as u32, w, off)
            }
            _ => {}
        }
        true
    }
}

impl Drop for VfioPci {
    fn drop(&mut self) {
        self.memory_enabled = false;
        self.remap();
        if self.msix_running {
            let _ = self.device.disable_msix();
        }
        for b in &self.bars {
            if !b.host.is_null() {
                // SAFETY: our own mapping; its slots were removed by remap() above.
                unsafe { libc::munmap(b.host, b.len as usize) };
            }
        }
    }
}
