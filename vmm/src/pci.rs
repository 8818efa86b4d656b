//! A PCI host bridge on configuration mechanism 1 (ports 0xcf8/0xcfc): bus 0 only, device 0
//! is the bridge itself, devices behind it implement [`PciFunction`]. [`ConfigSpace`] is the
//! register file every emulated function keeps its configuration in (the HCA's and a
//! passed-through function's virtual BARs): values, and which bits a guest write may change.

use std::sync::{Arc, Mutex};

use hca_model::sync::Unpoisoned;

pub const CONFIG_ADDRESS: u16 = 0xcf8;
pub const CONFIG_DATA: u16 = 0xcfc;

/// A function's configuration space, accessed a dword at a time (`mask` says which bytes
/// of `val` a narrower write covers).
pub trait PciFunction: Send {
    fn config_read(&mut self, off: u32) -> u32;
    fn config_write(&mut self, off: u32, val: u32, mask: u32);
}

/// The standard header's first BAR register.
pub const BAR0_REG: u32 = 0x10;
const DWORDS: usize = 64;
const BAR_MEM64: u32 = 0b100;
const BAR_PREFETCH: u32 = 0b1000;

/// A type-0 configuration header and capabilities (256 bytes) as registers: what a read
/// returns, and per register the bits a guest write may change (the rest are read-only, as
/// the device defines them). BAR sizing works the way hardware's does: a BAR's writable bits
/// are those above its size, so writing all ones reads back the size mask.
#[derive(Clone, Debug)]
pub struct ConfigSpace {
    regs: [u32; DWORDS],
    writable: [u32; DWORDS],
}

impl Default for ConfigSpace {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigSpace {
    /// All zero, nothing writable.
    pub fn new() -> Self {
        Self {
            regs: [0; DWORDS],
            writable: [0; DWORDS],
        }
    }

    fn index(off: u32) -> Option<usize> {
        let i = (off / 4) as usize;
        (i < DWORDS).then_some(i)
    }

    /// Defines the register at `off`: its value and the bits a guest may write.
    pub fn set(&mut self, off: u32, value: u32, writable: u32) {
        if let Some(i) = Self::index(off) {
            if let (Some(r), Some(w)) = (self.regs.get_mut(i), self.writable.get_mut(i)) {
                (*r, *w) = (value, writable);
            }
        }
    }

    /// The dword at `off` (0 outside the 256 bytes).
    pub fn read(&self, off: u32) -> u32 {
        Self::index(off)
            .and_then(|i| self.regs.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// A guest write of `val`'s bytes in `mask` at `off`: only writable bits change.
    pub fn write(&mut self, off: u32, val: u32, mask: u32) {
        if let Some(i) = Self::index(off) {
            if let (Some(r), Some(&w)) = (self.regs.get_mut(i), self.writable.get(i)) {
                let w = w & mask;
                *r = (*r & !w) | (val & w);
            }
        }
    }

    /// Defines memory BAR `bar` (0..6) of `size` bytes (a power of two, at least 16) at
    /// `base`; a 64-bit BAR takes register `bar + 1` for its upper half.
    pub fn set_bar(&mut self, bar: usize, base: u64, size: u64, wide: bool, prefetch: bool) {
        let off = BAR0_REG + 4 * bar as u32;
        let flags = if wide { BAR_MEM64 } else { 0 } | if prefetch { BAR_PREFETCH } else { 0 };
        let size_mask = !(size.max(16) - 1);
        let base = base & size_mask;
        self.set(off, base as u32 | flags, size_mask as u32 & !0xf);
        if wide {
            self.set(off + 4, (base >> 32) as u32, (size_mask >> 32) as u32);
        }
    }

    /// Where memory BAR `bar` is placed now (both halves of a 64-bit BAR).
    pub fn bar_base(&self, bar: usize) -> u64 {
        let off = BAR0_REG + 4 * bar as u32;
        let lo = self.read(off);
        let mut base = u64::from(lo & !0xf);
        if lo & 0b110 == BAR_MEM64 {
            base |= u64::from(self.read(off + 4)) << 32;
        }
        base
    }

    /// Places memory BAR `bar` at `base` as firmware does, through its writable bits.
    pub fn place_bar(&mut self, bar: usize, base: u64) {
        let off = BAR0_REG + 4 * bar as u32;
        let wide = self.read(off) & 0b110 == BAR_MEM64;
        self.write(off, base as u32, u32::MAX);
        if wide {
            self.write(off + 4, (base >> 32) as u32, u32::MAX);
        }
    }
}

/// A function some of whose BAR space exits to the VMM (a passed-through device's MSI-X
/// table); `mmio` answers false for an address that is not its.
pub trait TrappedBars: Send {
    fn mmio(&mut self, gpa: u64, read: Option<&mut [u8]>, write: Option<&[u8]>) -> bool;
}

/// Device 0: the host bridge (an ID, a class code, nothing else).
struct HostBridge;

impl PciFunction for HostBridge {
    fn config_read(&mut self, off: u32) -> u32 {
        match off {
            0x00 => 0x29c0_8086,
            0x08 => 0x0600_0000, // class: host bridge
            _ => 0,
        }
    }
    fn config_write(&mut self, _off: u32, _val: u32, _mask: u32) {}
}

pub struct PciBus {
    address: u32,
    devices: Vec<Arc<Mutex<dyn PciFunction>>>,
}

impl Default for PciBus {
    fn default() -> Self {
        Self::new()
    }
}

impl PciBus {
    pub fn new() -> Self {
        Self {
            address: 0,
            devices: vec![Arc::new(Mutex::new(HostBridge))],
        }
    }

    /// Adds a function as the next device number on bus 0; its device number.
    pub fn add(&mut self, f: Arc<Mutex<dyn PciFunction>>) -> u32 {
        self.devices.push(f);
        self.devices.len() as u32 - 1
    }

    /// The function the current address selects, and the dword offset; None for an
    /// absent one (reads as all ones) or a disabled address.
    fn target(&self) -> Option<(&Arc<Mutex<dyn PciFunction>>, u32)> {
        let a = self.address;
        let (enabled, bus, dev, func) = (
            a >> 31 != 0,
            (a >> 16) & 0xff,
            (a >> 11) & 0x1f,
            (a >> 8) & 7,
        );
        if !enabled || bus != 0 || func != 0 {
            return None;
        }
        self.devices.get(dev as usize).map(|d| (d, a & 0xfc))
    }

    /// A port read in 0xcf8..0xd00; false if the port is not ours.
    pub fn io_read(&mut self, port: u16, data: &mut [u8]) -> bool {
        let v = match port {
            CONFIG_ADDRESS..=0xcfb => self.address >> (8 * (port - CONFIG_ADDRESS)),
            CONFIG_DATA..=0xcff => match self.target() {
                Some((d, off)) => {
                    let v = d.lock_unpoisoned().config_read(off);
                    v >> (8 * (port - CONFIG_DATA))
                }
                None => u32::MAX,
            },
            _ => return false,
        };
        // String I/O (`rep insb`) hands over more than 4 bytes: the register has 4.
        for (i, b) in data.iter_mut().enumerate() {
            *b = v.checked_shr(8 * i as u32).unwrap_or(0) as u8;
        }
        true
    }

    pub fn io_write(&mut self, port: u16, data: &[u8]) -> bool {
        let mut v = 0u32;
        for (i, b) in data.iter().enumerate().take(4) {
            v |= u32::from(*b) << (8 * i);
        }
        match port {
            CONFIG_ADDRESS if data.len() == 4 => self.address = v & 0x80ff_fffc,
            CONFIG_ADDRESS..=0xcfb => {}
            CONFIG_DATA..=0xcff => {
                let shift = 8 * u32::from(port - CONFIG_DATA);
                // An empty write changes nothing (u32::MAX >> 32 would overflow).
                let width = 8 * data.len().min(4) as u32;
                let mask = u32::MAX.checked_shr(32 - width).unwrap_or(0) << shift;
                if let Some((d, off)) = self.target() {
                    d.lock_unpoisoned().config_write(off, v << shift, mask);
                }
            }
            _ => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_string_io_on_the_config_ports_never_panics() {
        let mut bus = PciBus::new();
        bus.io_write(CONFIG_ADDRESS, &0x8000_0000u32.to_le_bytes());
        let mut long = [0u8; 64];
        assert!(bus.io_read(CONFIG_DATA, &mut long));
        assert_eq!(
            &long[..4],
            &0x29c0_8086u32.to_le_bytes(),
            "the host bridge's ID"
        );
        assert!(long[4..].iter().all(|&b| b == 0));
        assert!(bus.io_write(CONFIG_DATA + 3, &[0xff; 64]));
        // An empty write (found by replaying the pci fuzz corpus in a debug build).
        assert!(bus.io_write(CONFIG_DATA, &[]));
        assert!(bus.io_read(CONFIG_DATA, &mut long[..4]));
        assert_eq!(&long[..4], &0x29c0_8086u32.to_le_bytes());
        let mut one = [0u8; 1];
        assert!(bus.io_read(CONFIG_ADDRESS + 3, &mut one));
        assert_eq!(one[0], 0x80);
    }

    #[test]
    fn test_read_only_bits_survive_writes_and_bars_size_like_hardware() {
        let mut c = ConfigSpace::new();
        c.set(0x00, 0x1110_1af4, 0);
        c.set(0x04, 0x0010_0000, 0x0547);
        c.write(0x00, u32::MAX, u32::MAX);
        c.write(0x04, u32::MAX, u32::MAX);
        assert_eq!(c.read(0x00), 0x1110_1af4, "IDs are read-only");
        assert_eq!(c.read(0x04), 0x0010_0547, "status is read-only");
        c.write(0x04, 0, 0x0000_00ff);
        assert_eq!(c.read(0x04), 0x0010_0500, "only the written bytes change");

        c.set_bar(0, 0xe000_0000, 0x1000, false, false);
        c.set_bar(2, 0x1_e010_0000, 1 << 20, true, true);
        assert_eq!(c.bar_base(2), 0x1_e010_0000);
        for off in [0x10, 0x18, 0x1c] {
            c.write(off, u32::MAX, u32::MAX);
        }
        assert_eq!(c.read(0x10), 0xffff_f000);
        assert_eq!(
            c.read(0x18),
            0xfff0_000c,
            "size mask and 64-bit prefetchable flags"
        );
        assert_eq!(c.read(0x1c), u32::MAX);
        c.place_bar(2, 0x2_0000_0000 | 0x12_3456);
        assert_eq!(
            c.bar_base(2),
            0x2_0010_0000,
            "aligned down to the BAR's size"
        );
        assert_eq!(c.read(0x400), 0, "beyond the 256 bytes reads as zero");
        c.write(0x400, 1, u32::MAX);
    }
}
