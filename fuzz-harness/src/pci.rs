//! The VMM's PCI configuration mechanism and MSI-X table fed any port and MMIO accesses a
//! guest can make (any width, string I/O included): never a panic, and a BAR reads back
//! only what its size allows.

use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use vmm::irq::MsixTable;
use vmm::pci::{ConfigSpace, PciBus, PciFunction};

/// A function with the HCA's BAR shapes (a 32-bit and a 64-bit prefetchable BAR).
struct Function(ConfigSpace);

impl PciFunction for Function {
    fn config_read(&mut self, off: u32) -> u32 {
        self.0.read(off)
    }
    fn config_write(&mut self, off: u32, val: u32, mask: u32) {
        self.0.write(off, val, mask);
    }
}

#[derive(Arbitrary, Debug)]
pub enum Access {
    IoRead { port: u16, len: u8 },
    IoWrite { port: u16, data: Vec<u8> },
    Address { dev: u8, off: u8, enable: bool },
    TableRead { off: u16 },
    TableWrite { off: u16, val: u32 },
    Control { ctl: u32 },
}

/// What the fuzzer decodes its bytes into.
pub type Input = Vec<Access>;

/// One run of the target on a decoded input.
pub fn run(accesses: Input) {
    let mut config = ConfigSpace::new();
    config.set(0x00, 0x21a8_1234, 0);
    config.set(0x04, 0x0010_0000, 0x0547);
    config.set_bar(0, 0xe000_0000, 0x1000, false, false);
    config.set_bar(2, 0x1_0000_0000, 0x10000, true, true);
    let mut bus = PciBus::new();
    bus.add(Arc::new(Mutex::new(Function(config))));
    let mut table = MsixTable::new(4);
    for a in accesses.iter().take(512) {
        match a {
            Access::IoRead { port, len } => {
                let mut buf = vec![0u8; usize::from(*len % 16)];
                bus.io_read(0xcf8 + port % 12, &mut buf);
            }
            Access::IoWrite { port, data } => {
                let data = &data[..data.len().min(16)];
                bus.io_write(0xcf8 + port % 12, data);
            }
            Access::Address { dev, off, enable } => {
                let addr = u32::from(*enable) << 31 | u32::from(dev % 4) << 11 | u32::from(*off);
                bus.io_write(0xcf8, &addr.to_le_bytes());
            }
            Access::TableRead { off } => {
                let _ = table.read(u64::from(*off));
            }
            Access::TableWrite { off, val } => {
                let _ = table.write(u64::from(*off), *val);
            }
            Access::Control { ctl } => table.set_control(*ctl),
        }
    }
    // BAR0 sized 4 KiB: all ones written, its size mask reads back.
    let sel = 1u32 << 31 | 1 << 11 | 0x10;
    bus.io_write(0xcf8, &sel.to_le_bytes());
    bus.io_write(0xcfc, &u32::MAX.to_le_bytes());
    let mut v = [0u8; 4];
    bus.io_read(0xcfc, &mut v);
    assert_eq!(u32::from_le_bytes(v) & !0xf, !0xfff & !0xf);
}
