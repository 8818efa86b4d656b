//! The virtio-mmio transport (virtio 1.1 §4.2.2, version 2, "modern" only): a 4 KiB page of
//! registers a vCPU's MMIO exits land in, and a [`VirtioDevice`] behind it. Linux finds
//! such a device through its command line ([`cmdline`]: `virtio_mmio.device=4K@ADDR:IRQ`,
//! upstream's CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES syntax; Debian's kernels lack that option,
//! and guest-kmod's hcab_virtio_mmio registers the devices from the same words instead),
//! and gets its interrupt on an IOAPIC pin: an irqfd, as the serial ports'.
//!
//! The transport is a state machine generic over its interrupt ([`Trigger`]), tested
//! without a VM. Queue notifications are served on the vCPU thread that wrote QueueNotify:
//! a read-only disk's requests are copies out of the host's page cache.
//!
//! The guest is hostile: registers of the wrong width read as zero and ignore writes,
//! queue geometry changes only while that queue is not ready, a queue is served only when
//! the driver has set DRIVER_OK and its rings lie in guest memory, and features the device
//! did not offer (or a driver without VIRTIO_F_VERSION_1) leave FEATURES_OK unset.

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK,
    VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vm_superio::Trigger;

/// The register page's size.
pub const MMIO_SIZE: u64 = 0x1000;
/// "virt", little-endian.
const MAGIC: u32 = 0x7472_6976;
/// The modern (virtio 1.0) register layout.
const VERSION: u32 = 2;
/// The vendor ID the device reports (PCI's virtio vendor).
const VENDOR: u32 = 0x1af4;

/// The kernel parameter that announces a device at `addr` on IRQ `irq` to Linux.
pub fn cmdline(addr: u64, irq: u32) -> String {
    format!("virtio_mmio.device=4K@{addr:#x}:{irq}")
}

/// What a device behind a transport provides: its identity, features, config space, and
/// the handling of a queue the driver notified.
pub trait VirtioDevice: Send {
    /// The virtio device ID (2: block).
    fn device_type(&self) -> u32;
    /// The feature bits offered, VIRTIO_F_VERSION_1 among them.
    fn features(&self) -> u64;
    /// One entry per queue: its largest size.
    fn queue_max_sizes(&self) -> &[u16];
    /// Reads `data.len()` bytes of the device's config space at `offset` (zeros past it).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Serves the chains the driver made available on queue `index`; whether any was put
    /// in the used ring (then the driver is interrupted).
    fn process_queue(&mut self, index: usize, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool;
}

/// One virtio-mmio device: the registers' state, its queues, the device and its interrupt.
pub struct MmioTransport<D, T> {
    device: D,
    mem: GuestMemoryMmap,
    irq: T,
    queues: Vec<Queue>,
    queue_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    status: u32,
    interrupt_status: u32,
}

impl<D: VirtioDevice, T: Trigger> MmioTransport<D, T> {
    /// `device` over guest memory `mem`, interrupting through `irq`; reset.
    pub fn new(device: D, mem: GuestMemoryMmap, irq: T) -> Self {
        let queues = (device.queue_max_sizes().iter())
            .filter_map(|&max| Queue::new(max).ok())
            .collect();
        Self {
            device,
            mem,
            irq,
            queues,
            queue_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            interrupt_status: 0,
        }
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The device status register (0 after reset).
    pub fn status(&self) -> u32 {
        self.status
    }

    fn reset(&mut self) {
        for q in &mut self.queues {
            q.reset();
        }
        self.queue_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt_status = 0;
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// A register read at `offset` into the page; `data` is what the vCPU loads.
    pub fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            self.device
                .read_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        let v = if data.len() == 4 {
            self.register(offset)
        } else {
            0
        };
        for (b, v) in data
            .iter_mut()
            .zip(v.to_le_bytes().into_iter().chain([0; 4]))
        {
            *b = v;
        }
    }

    fn register(&mut self, offset: u64) -> u32 {
        let Ok(off) = u32::try_from(offset) else {
            return 0;
        };
        match off {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => self.selected().map_or(0, |q| u32::from(q.max_size())),
            VIRTIO_MMIO_QUEUE_READY => self.selected().map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status,
            VIRTIO_MMIO_STATUS => self.status,
            // The config space never changes while the driver runs.
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            _ => 0,
        }
    }

    /// A register write at `offset` into the page; `data` is what the vCPU stored.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        // Config space is read-only here; registers are 32 bits wide.
        let (Ok(off), Ok(bytes)) = (u32::try_from(offset), <[u8; 4]>::try_from(data)) else {
            return;
        };
        let v = u32::from_le_bytes(bytes);
        match off {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES => match self.driver_features_sel {
                0 => self.driver_features = self.driver_features & !0xffff_ffff | u64::from(v),
                1 => self.driver_features = self.driver_features & 0xffff_ffff | u64::from(v) << 32,
                _ => {}
            },
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = v,
            VIRTIO_MMIO_QUEUE_NOTIFY => self.serve_queue(v),
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt_status &= !v,
            VIRTIO_MMIO_STATUS => self.set_status(v),
            VIRTIO_MMIO_QUEUE_READY => {
                let mem = self.mem.clone();
                if let Some(q) = self.selected() {
                    // A queue whose rings are not in guest memory never goes ready.
                    q.set_ready(v == 1);
                    if q.ready() && !q.is_valid(&mem) {
                        q.set_ready(false);
                    }
                }
            }
            _ => self.queue_geometry(off, v),
        }
    }

    /// QueueNum and the rings' addresses, which a ready queue keeps as they are.
    fn queue_geometry(&mut self, off: u32, v: u32) {
        let Some(q) = self.selected().filter(|q| !q.ready()) else {
            return;
        };
        match off {
            VIRTIO_MMIO_QUEUE_NUM => q.set_size(u16::try_from(v).unwrap_or(0)),
            VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(Some(v), None),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(v)),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(v), None),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(v)),
            VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(Some(v), None),
            VIRTIO_MMIO_QUEUE_USED_HIGH => q.set_used_ring_address(None, Some(v)),
            _ => {}
        }
    }

    fn set_status(&mut self, v: u32) {
        if v == 0 {
            self.reset();
            return;
        }
        let mut v = v;
        let offered = self.device.features();
        let acceptable = self.driver_features & !offered == 0
            && self.driver_features >> VIRTIO_F_VERSION_1 & 1 == 1;
        if v & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.status & VIRTIO_CONFIG_S_FEATURES_OK == 0
            && !acceptable
        {
            v &= !VIRTIO_CONFIG_S_FEATURES_OK;
        }
        self.status = v;
    }

    /// Whether the driver runs the device: DRIVER_OK after FEATURES_OK, and no failure.
    fn live(&self) -> bool {
        let ok = VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK;
        let dead = VIRTIO_CONFIG_S_FAILED | VIRTIO_CONFIG_S_NEEDS_RESET;
        self.status & ok == ok && self.status & dead == 0
    }

    /// Serves queue `index` and interrupts if it used any buffer: when the driver notified
    /// it, and when the device has something for it (a NIC's received frame).
    pub fn serve_queue(&mut self, index: u32) {
        if !self.live() {
            return;
        }
        let Some(q) = self.queues.get_mut(index as usize).filter(|q| q.ready()) else {
            return;
        };
        if self.device.process_queue(index as usize, q, &self.mem) {
            self.interrupt_status |= VIRTIO_MMIO_INT_VRING;
            if self.irq.trigger().is_err() {
                log::error!("virtio-mmio: the interrupt could not be raised");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;
    use virtio_bindings::virtio_config::{VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;

    /// A device that uses every chain it is given and counts them.
    struct Echo {
        served: usize,
    }

    impl VirtioDevice for Echo {
        fn device_type(&self) -> u32 {
            2
        }
        fn features(&self) -> u64 {
            1 << VIRTIO_F_VERSION_1 | 1 << 5
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16]
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn process_queue(&mut self, _: usize, q: &mut Queue, mem: &GuestMemoryMmap) -> bool {
            let mut any = false;
            while let Some(c) = q.pop_descriptor_chain(mem) {
                q.add_used(mem, c.head_index(), 0).unwrap();
                self.served += 1;
                any = true;
            }
            any
        }
    }

    /// An irqfd's stand-in: counts triggers.
    #[derive(Clone, Default)]
    struct Count(Rc<Cell<u32>>);
    impl Trigger for Count {
        type E = std::io::Error;
        fn trigger(&self) -> std::io::Result<()> {
            self.0.set(self.0.get() + 1);
            Ok(())
        }
    }

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    fn rd(t: &mut MmioTransport<Echo, Count>, off: u32) -> u32 {
        let mut b = [0u8; 4];
        t.read(u64::from(off), &mut b);
        u32::from_le_bytes(b)
    }

    fn wr(t: &mut MmioTransport<Echo, Count>, off: u32, v: u32) {
        t.write(u64::from(off), &v.to_le_bytes());
    }

    /// Linux's probe sequence up to DRIVER_OK, with queue 0 on `vq`'s rings.
    fn bring_up(t: &mut MmioTransport<Echo, Count>, vq: &MockSplitQueue<GuestMemoryMmap>) {
        wr(t, VIRTIO_MMIO_STATUS, 0);
        wr(t, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        let s = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
        wr(t, VIRTIO_MMIO_STATUS, s);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        wr(t, VIRTIO_MMIO_DRIVER_FEATURES, 1 << 5);
        wr(t, VIRTIO_MMIO_STATUS, s | VIRTIO_CONFIG_S_FEATURES_OK);
        assert_ne!(rd(t, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK, 0);
        wr(t, VIRTIO_MMIO_QUEUE_SEL, 0);
        assert_eq!(rd(t, VIRTIO_MMIO_QUEUE_NUM_MAX), 16);
        wr(t, VIRTIO_MMIO_QUEUE_NUM, 16);
        let (d, a, u) = (vq.desc_table_addr(), vq.avail_addr(), vq.used_addr());
        wr(t, VIRTIO_MMIO_QUEUE_DESC_LOW, d.0 as u32);
        wr(t, VIRTIO_MMIO_QUEUE_DESC_HIGH, (d.0 >> 32) as u32);
        wr(t, VIRTIO_MMIO_QUEUE_AVAIL_LOW, a.0 as u32);
        wr(t, VIRTIO_MMIO_QUEUE_AVAIL_HIGH, (a.0 >> 32) as u32);
        wr(t, VIRTIO_MMIO_QUEUE_USED_LOW, u.0 as u32);
        wr(t, VIRTIO_MMIO_QUEUE_USED_HIGH, (u.0 >> 32) as u32);
        wr(t, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_eq!(rd(t, VIRTIO_MMIO_QUEUE_READY), 1);
        wr(
            t,
            VIRTIO_MMIO_STATUS,
            s | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
        );
    }

    #[test]
    fn test_identity_registers_read_as_a_modern_virtio_mmio_device() {
        let mut t = MmioTransport::new(Echo { served: 0 }, mem(), Count::default());
        assert_eq!(rd(&mut t, VIRTIO_MMIO_MAGIC_VALUE), MAGIC);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_VERSION), 2);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_ID), 2);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_FEATURES), 1 << 5);
        wr(&mut t, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_FEATURES), 1);
        wr(&mut t, VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_DEVICE_FEATURES), 0);
        let mut c = [0u8; 2];
        t.read(0x108, &mut c);
        assert_eq!(c, [8, 8], "config space at its offset");
        let mut narrow = [0xaau8; 2];
        t.read(u64::from(VIRTIO_MMIO_MAGIC_VALUE), &mut narrow);
        assert_eq!(narrow, [0, 0], "registers are 32 bits wide");
        wr(&mut t, VIRTIO_MMIO_QUEUE_SEL, 9);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_QUEUE_NUM_MAX), 0, "no queue 9");
    }

    #[test]
    fn test_a_notified_queue_is_served_and_interrupts() {
        let m = mem();
        let mut vq = MockSplitQueue::create(&m, GuestAddress(0x1000), 16);
        let irq = Count::default();
        let mut t = MmioTransport::new(Echo { served: 0 }, m.clone(), irq.clone());
        bring_up(&mut t, &vq);
        vq.add_chain(2).unwrap();
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(t.device().served, 1);
        assert_eq!(irq.0.get(), 1);
        assert_eq!(
            rd(&mut t, VIRTIO_MMIO_INTERRUPT_STATUS),
            VIRTIO_MMIO_INT_VRING
        );
        wr(&mut t, VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        // Nothing new: no interrupt.
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(irq.0.get(), 1);
        // Notifying a queue that does not exist does nothing.
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 3);
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, u32::MAX);
        assert_eq!(irq.0.get(), 1);
    }

    #[test]
    fn test_nothing_is_served_before_driver_ok_or_after_reset() {
        let m = mem();
        let mut vq = MockSplitQueue::create(&m, GuestAddress(0x1000), 16);
        let mut t = MmioTransport::new(Echo { served: 0 }, m.clone(), Count::default());
        vq.add_chain(1).unwrap();
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(t.device().served, 0);
        bring_up(&mut t, &vq);
        wr(&mut t, VIRTIO_MMIO_STATUS, 0);
        assert_eq!(t.status(), 0);
        assert_eq!(
            rd(&mut t, VIRTIO_MMIO_QUEUE_READY),
            0,
            "reset unreadies queues"
        );
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(t.device().served, 0);
    }

    #[test]
    fn test_features_not_offered_or_without_version_1_leave_features_ok_unset() {
        let mut t = MmioTransport::new(Echo { served: 0 }, mem(), Count::default());
        wr(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        wr(&mut t, VIRTIO_MMIO_DRIVER_FEATURES, 1 << 5);
        wr(&mut t, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_FEATURES_OK);
        assert_eq!(t.status(), 0, "no VERSION_1: a legacy driver is refused");
        wr(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        wr(&mut t, VIRTIO_MMIO_DRIVER_FEATURES, 1 | 2);
        wr(&mut t, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_FEATURES_OK);
        assert_eq!(t.status(), 0, "a feature the device did not offer");
        wr(&mut t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
        wr(&mut t, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_FEATURES_OK);
        assert_eq!(t.status(), VIRTIO_CONFIG_S_FEATURES_OK);
    }

    #[test]
    fn test_a_queue_outside_guest_memory_never_goes_ready_and_a_ready_one_keeps_its_rings() {
        let m = mem();
        let mut vq = MockSplitQueue::create(&m, GuestAddress(0x1000), 16);
        let mut t = MmioTransport::new(Echo { served: 0 }, m.clone(), Count::default());
        wr(&mut t, VIRTIO_MMIO_QUEUE_NUM, 16);
        wr(&mut t, VIRTIO_MMIO_QUEUE_DESC_LOW, 0xffff_f000);
        wr(&mut t, VIRTIO_MMIO_QUEUE_READY, 1);
        assert_eq!(rd(&mut t, VIRTIO_MMIO_QUEUE_READY), 0);
        bring_up(&mut t, &vq);
        wr(&mut t, VIRTIO_MMIO_QUEUE_DESC_LOW, 0xffff_f000);
        vq.add_chain(1).unwrap();
        wr(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
        assert_eq!(t.device().served, 1, "the ready queue kept its table");
    }

    #[test]
    fn test_the_command_line_names_size_address_and_irq() {
        assert_eq!(
            cmdline(0xfe00_0000, 5),
            "virtio_mmio.device=4K@0xfe000000:5"
        );
    }
}
