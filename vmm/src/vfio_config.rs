//! The configuration space a passed-through PCI function shows its guest: the device's own,
//! except what the VMM must own. The BARs are virtual (the guest places them in its address
//! space; the VMM maps the device's regions there), the MSI-X enable and mask bits are the
//! VMM's (it routes the vectors), MSI is hidden (only MSI-X is wired), and there is no
//! expansion ROM and no INTx pin. Pure logic over the device's config dwords, so it is
//! tested without a device. The virtual BAR registers are a [`ConfigSpace`], the register
//! file the HCA's function keeps its own configuration in.

use super::pci::{ConfigSpace, BAR0_REG};

/// What a BAR register pair holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// Unimplemented, or an I/O BAR (not passed through: reads as absent).
    Absent,
    Mem32 {
        prefetch: bool,
    },
    Mem64 {
        prefetch: bool,
    },
    /// The upper half of the 64-bit BAR below it.
    Upper,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    pub kind: BarKind,
    pub size: u64,
}

/// Where the function's MSI-X capability, table and PBA are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixCap {
    /// The capability's offset in config space.
    pub offset: u32,
    pub vectors: u32,
    pub table_bar: usize,
    pub table_offset: u64,
    pub pba_bar: usize,
    pub pba_offset: u64,
}

const CAP_MSI: u8 = 0x05;
const CAP_MSIX: u8 = 0x11;
const STATUS_CAP_LIST: u32 = 1 << 20;

/// What a config write means for the VMM.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigWrite {
    /// Pass it to the device as is.
    Device,
    /// A BAR moved or was sized; nothing reaches the device.
    Bar,
    /// The command register: pass it on, and memory decoding is now on or off.
    Command { memory: bool },
    /// MSI-X Message Control: the new value (the VMM's own).
    MsixControl(u32),
    /// Dropped (MSI, expansion ROM, read-only fields).
    Dropped,
}

pub struct VirtualConfig {
    pub bars: [Bar; 6],
    /// The BAR registers as the guest programs them (the rest of `regs` is unused: those
    /// reads come from the device).
    regs: ConfigSpace,
    /// Capabilities as (offset, id), in list order.
    caps: Vec<(u32, u8)>,
    pub msix: Option<MsixCap>,
}

impl VirtualConfig {
    /// From the device's first 256 config bytes (as dwords) and its BAR region sizes.
    pub fn parse(dword: impl Fn(u32) -> u32, sizes: [u64; 6]) -> Self {
        let mut bars = [Bar {
            kind: BarKind::Absent,
            size: 0,
        }; 6];
        let mut i = 0;
        while i < 6 {
            let raw = dword(0x10 + 4 * i as u32);
            let prefetch = raw & 8 != 0;
            let size = sizes.get(i).copied().unwrap_or(0);
            if raw & 1 == 0 && size != 0 {
                let wide = raw & 6 == 4 && i < 5;
                if let Some(bar) = bars.get_mut(i) {
                    *bar = Bar {
                        kind: if wide {
                            BarKind::Mem64 { prefetch }
                        } else {
                            BarKind::Mem32 { prefetch }
                        },
                        size: size.next_power_of_two().max(0x1000),
                    };
                }
                if wide {
                    if let Some(upper) = bars.get_mut(i + 1) {
                        upper.kind = BarKind::Upper;
                    }
                    i += 1;
                }
            }
            i += 1;
        }
        let mut caps = Vec::new();
        if dword(0x04) & STATUS_CAP_LIST != 0 {
            let mut off = dword(0x34) & 0xfc;
            // A malformed list (a loop) ends after as many capabilities as fit.
            while off >= 0x40 && caps.len() < 48 {
                let d = dword(off);
                caps.push((off, d as u8));
                off = (d >> 8) & 0xfc;
            }
        }
        let msix = caps.iter().find(|c| c.1 == CAP_MSIX).map(|&(off, _)| {
            let (table, pba) = (dword(off + 4), dword(off + 8));
            MsixCap {
                offset: off,
                vectors: ((dword(off) >> 16) & 0x7ff) + 1,
                table_bar: (table & 7) as usize,
                table_offset: u64::from(table & !7),
                pba_bar: (pba & 7) as usize,
                pba_offset: u64::from(pba & !7),
            }
        });
        let mut regs = ConfigSpace::new();
        for (i, b) in bars.iter().enumerate() {
            match b.kind {
                BarKind::Mem32 { prefetch } => regs.set_bar(i, 0, b.size, false, prefetch),
                BarKind::Mem64 { prefetch } => regs.set_bar(i, 0, b.size, true, prefetch),
                BarKind::Absent | BarKind::Upper => {}
            }
        }
        Self {
            bars,
            regs,
            caps,
            msix,
        }
    }

    /// The guest-programmed base of memory BAR `i` (None for an absent or upper half).
    pub fn bar_base(&self, i: usize) -> Option<u64> {
        self.bars
            .get(i)
            .is_some_and(|b| matches!(b.kind, BarKind::Mem32 { .. } | BarKind::Mem64 { .. }))
            .then(|| self.regs.bar_base(i))
    }

    /// Sets BAR `i`'s base as firmware would before the guest boots.
    pub fn set_bar_base(&mut self, i: usize, base: u64) {
        self.regs.place_bar(i, base);
    }

    /// The next capability after `off` that the guest may see (MSI is skipped).
    fn visible_next(&self, after: Option<u32>) -> u32 {
        let start = match after {
            None => 0,
            Some(a) => match self.caps.iter().position(|c| c.0 == a) {
                Some(p) => p + 1,
                None => return 0,
            },
        };
        self.caps
            .iter()
            .skip(start)
            .find(|c| c.1 != CAP_MSI)
            .map_or(0, |c| c.0)
    }

    /// The dword the guest reads at `off`, given the device's own value there and, for
    /// MSI-X Message Control, the VMM's control word.
    pub fn read(&self, off: u32, device: u32, msix_control: u32) -> u32 {
        match off {
            BAR0_REG..=0x27 => self.regs.read(off),
            0x30 => 0,                // no expansion ROM
            0x3c => device & !0xff00, // no INTx pin
            0x34 => (device & !0xff) | self.visible_next(None),
            _ => match self.caps.iter().find(|c| c.0 == off) {
                Some(&(_, id)) => {
                    let head = (device & 0xffff_00ff) | self.visible_next(Some(off)) << 8;
                    if id == CAP_MSIX {
                        (head & 0xffff) | msix_control << 16
                    } else {
                        head
                    }
                }
                None => device,
            },
        }
    }

    /// What a guest write of `val` (the bytes in `mask`) at `off` means.
    pub fn write(&mut self, off: u32, val: u32, mask: u32) -> ConfigWrite {
        match off {
            0x04 if mask & 2 != 0 => ConfigWrite::Command {
                memory: val & 2 != 0,
            },
            BAR0_REG..=0x27 => {
                // Absent BARs have no writable bits; sizing reads back the size mask.
                self.regs.write(off, val, mask);
                ConfigWrite::Bar
            }
            0x30 => ConfigWrite::Dropped,
            _ => match self.caps.iter().find(|c| c.0 <= off && off < c.0 + 4) {
                Some(&(_, CAP_MSIX)) if mask & 0xffff_0000 != 0 => {
                    ConfigWrite::MsixControl(val >> 16)
                }
                Some(&(_, CAP_MSIX)) => ConfigWrite::Dropped,
                _ if self.in_msi(off) => ConfigWrite::Dropped,
                _ => ConfigWrite::Device,
            },
        }
    }

    /// Whether `off` falls in the hidden MSI capability (up to 24 bytes).
    fn in_msi(&self, off: u32) -> bool {
        self.caps
            .iter()
            .any(|&(c, id)| id == CAP_MSI && (c..c + 24).contains(&off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NIC-like function: BAR0 64-bit prefetchable 32 MiB, BAR2 an I/O BAR, BAR4 32-bit
    /// 16 KiB holding the MSI-X table (8 vectors) and PBA; capabilities PM (0x40) -> MSI
    /// (0x50) -> MSI-X (0x70).
    fn device() -> impl Fn(u32) -> u32 {
        |off| match off {
            0x04 => STATUS_CAP_LIST | 0x0006,
            0x10 => 0xc,
            0x18 => 0x1,
            0x20 => 0x0,
            0x34 => 0x40,
            0x3c => 0x0000_010b,
            0x40 => 0x5001,
            0x50 => 0x0180_7005,
            0x70 => 0x0007_0011,
            0x74 => 0x0000_0004,
            0x78 => 0x0000_2004,
            _ => 0,
        }
    }

    fn sizes() -> [u64; 6] {
        [32 << 20, 0, 0x100, 0, 0x4000, 0]
    }

    #[test]
    fn test_layout_is_read_from_the_device() {
        let c = VirtualConfig::parse(device(), sizes());
        assert_eq!(c.bars[0].kind, BarKind::Mem64 { prefetch: true });
        assert_eq!(c.bars[1].kind, BarKind::Upper);
        assert_eq!(c.bars[2].kind, BarKind::Absent, "I/O BARs are not passed");
        assert_eq!(
            c.bars[4],
            Bar {
                kind: BarKind::Mem32 { prefetch: false },
                size: 0x4000
            }
        );
        let m = c.msix.unwrap();
        assert_eq!(
            (m.offset, m.vectors, m.table_bar, m.table_offset),
            (0x70, 8, 4, 0)
        );
        assert_eq!((m.pba_bar, m.pba_offset), (4, 0x2000));
    }

    #[test]
    fn test_bar_sizing_and_placement_are_virtual() {
        let dev = device();
        let mut c = VirtualConfig::parse(&dev, sizes());
        c.set_bar_base(0, 0x1_0000_0000);
        assert_eq!(c.read(0x10, dev(0x10), 0), 0xc);
        assert_eq!(c.read(0x14, dev(0x14), 0), 1);
        // Sizing: all ones in, the size mask out, and no write reaches the device.
        assert_eq!(c.write(0x10, u32::MAX, u32::MAX), ConfigWrite::Bar);
        assert_eq!(c.write(0x14, u32::MAX, u32::MAX), ConfigWrite::Bar);
        assert_eq!(c.read(0x10, 0, 0), 0xfe00_000c);
        assert_eq!(c.read(0x14, 0, 0), u32::MAX);
        c.write(0x10, 0xd000_0000, u32::MAX);
        c.write(0x14, 0, u32::MAX);
        assert_eq!(c.bar_base(0), Some(0xd000_0000));
        assert_eq!(c.bar_base(1), None);
        assert_eq!(c.read(0x18, dev(0x18), 0), 0, "the I/O BAR reads as absent");
    }

    #[test]
    fn test_msi_is_hidden_and_msix_control_is_the_vmms() {
        let dev = device();
        let c = VirtualConfig::parse(&dev, sizes());
        assert_eq!(c.read(0x34, dev(0x34), 0), 0x40);
        // PM's next pointer skips MSI (0x50) to MSI-X (0x70).
        assert_eq!(c.read(0x40, dev(0x40), 0) >> 8 & 0xff, 0x70);
        assert_eq!(c.read(0x70, dev(0x70), 0x8007), 0x8007_0011);
        assert_eq!(c.read(0x3c, dev(0x3c), 0), 0x0b, "no INTx pin");
    }

    #[test]
    fn test_writes_are_sorted_by_owner() {
        let mut c = VirtualConfig::parse(device(), sizes());
        assert_eq!(
            c.write(0x04, 0x6, 0xffff),
            ConfigWrite::Command { memory: true }
        );
        assert_eq!(
            c.write(0x70, 0x8000_0000, 0xffff_0000),
            ConfigWrite::MsixControl(0x8000)
        );
        assert_eq!(
            c.write(0x54, 0xfee0_0000, u32::MAX),
            ConfigWrite::Dropped,
            "MSI"
        );
        assert_eq!(
            c.write(0x30, u32::MAX, u32::MAX),
            ConfigWrite::Dropped,
            "ROM"
        );
        assert_eq!(c.write(0x44, 0x3, 0xff), ConfigWrite::Device, "PM control");
    }

    #[test]
    fn test_a_capability_loop_ends() {
        let c = VirtualConfig::parse(
            |off| match off {
                0x04 => STATUS_CAP_LIST,
                0x34 => 0x40,
                0x40 => 0x4001, // points at itself
                _ => 0,
            },
            [0; 6],
        );
        assert_eq!(c.caps.len(), 48);
        assert!(c.msix.is_none());
    }
}
