//! A PCI host bridge on configuration mechanism 1 (ports 0xcf8/0xcfc): bus 0 only, device 0
//! is the bridge itself, devices behind it implement [`PciFunction`].

use std::sync::{Arc, Mutex};

pub const CONFIG_ADDRESS: u16 = 0xcf8;
pub const CONFIG_DATA: u16 = 0xcfc;

/// A function's configuration space, accessed a dword at a time (`mask` says which bytes
/// of `val` a narrower write covers).
pub trait PciFunction: Send {
    fn config_read(&mut self, off: u32) -> u32;
    fn config_write(&mut self, off: u32, val: u32, mask: u32);
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
                    let v = d.lock().unwrap().config_read(off);
                    v >> (8 * (port - CONFIG_DATA))
                }
                None => u32::MAX,
            },
            _ => return false,
        };
        for (i, b) in data.iter_mut().enumerate() {
            *b = (v >> (8 * i)) as u8;
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
                let mask = (u32::MAX >> (32 - 8 * data.len().min(4) as u32)) << shift;
                if let Some((d, off)) = self.target() {
                    d.lock().unwrap().config_write(off, v << shift, mask);
                }
            }
            _ => return false,
        }
        true
    }
}
