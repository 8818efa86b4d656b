//! BAR2 device memory: the header, the command mailbox, doorbell records and the EQ rings.
//!
//! The guest maps this region (ivshmem's shared memory under QEMU, a memory slot under the
//! VMM) and may write anything anywhere in it at any time, so every value the device reads
//! back from it is treated as hostile, and the device keeps its own copy of everything it
//! needs (it never trusts, for example, the header it wrote).

use std::fs::File;
use std::sync::atomic::{fence, AtomicU32, Ordering};

use vm_memory::mmap::MmapRegionError;
use vm_memory::{ByteValued, Bytes, FileOffset, MmapRegion, VolatileMemory};

use crate::abi::BAR2_SIZE;

/// The BAR2 region. Offsets are always below [`BAR2_SIZE`] by construction of the layout;
/// an access that is not would be a device bug, and is ignored (reads give zero).
pub struct DeviceMemory {
    region: MmapRegion<()>,
}

impl DeviceMemory {
    /// Anonymous memory, for tests and for hosts that map it from the model.
    pub fn new() -> Result<Self, MmapRegionError> {
        Ok(Self {
            region: MmapRegion::new(BAR2_SIZE as usize)?,
        })
    }

    /// Memory backed by `file` (a memfd the host shares with QEMU or maps into a VM).
    pub fn from_file(file: File) -> Result<Self, MmapRegionError> {
        file.set_len(u64::from(BAR2_SIZE))
            .map_err(MmapRegionError::Mmap)?;
        Ok(Self {
            region: MmapRegion::from_file(FileOffset::new(file, 0), BAR2_SIZE as usize)?,
        })
    }

    /// The mapping, for host adapters that expose it to a guest.
    pub fn region(&self) -> &MmapRegion<()> {
        &self.region
    }

    /// Reads a `T` at BAR2 offset `off`; zeros (`T::default()`) past the end.
    pub fn read_obj<T: ByteValued + Default>(&self, off: u32) -> T {
        self.region
            .as_volatile_slice()
            .read_obj(off as usize)
            .unwrap_or_default()
    }

    /// Writes `v` at BAR2 offset `off`; nothing past the end.
    pub fn write_obj<T: ByteValued>(&self, off: u32, v: &T) {
        let _ = self.region.as_volatile_slice().write_obj(*v, off as usize);
    }

    /// Writes `b` at BAR2 offset `off`; nothing past the end.
    pub fn write_bytes(&self, off: u32, b: &[u8]) {
        let _ = self.region.as_volatile_slice().write_slice(b, off as usize);
    }

    /// Reads a u32 the guest publishes (producer/consumer index, arm word, mailbox seq);
    /// acquire so that what the guest wrote before it is visible.
    /// (A send doorbell reads one per live QP: a plain load here, not vm-memory's checked
    /// reference, which cost about four times as many instructions.)
    pub fn load_u32(&self, off: u32) -> u32 {
        let off = off as usize;
        if off % 4 != 0 || off.saturating_add(4) > self.region.size() {
            return 0;
        }
        // SAFETY: the region stays mapped, `size()` bytes from `as_ptr()` (page-aligned),
        // while `self` lives; `off` is in bounds and 4-aligned. The guest may store to the
        // word at any moment: an atomic load is what tolerates that.
        unsafe { (*self.region.as_ptr().add(off).cast::<AtomicU32>()).load(Ordering::Acquire) }
    }

    /// Publishes a u32 (mailbox done_seq) after everything written before it.
    pub fn store_u32(&self, off: u32, v: u32) {
        fence(Ordering::Release);
        if let Ok(r) = self.region.as_volatile_slice().get_ref::<u32>(off as usize) {
            r.store(v);
        }
    }

    /// Publishes an owner byte after the rest of its entry.
    pub fn store_u8(&self, off: u32, v: u8) {
        fence(Ordering::Release);
        if let Ok(r) = self.region.as_volatile_slice().get_ref::<u8>(off as usize) {
            r.store(v);
        }
    }

    /// Zeroes `[off, off + len)`.
    pub fn zero(&self, off: u32, len: u32) {
        if let Ok(s) = self
            .region
            .as_volatile_slice()
            .get_slice(off as usize, len as usize)
        {
            let _ = s.write_slice(&vec![0u8; len as usize], 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_out_of_range_access_is_ignored_not_a_panic() {
        let m = DeviceMemory::new().unwrap();
        m.store_u32(BAR2_SIZE, 7);
        assert_eq!(m.load_u32(BAR2_SIZE - 2), 0);
        m.store_u32(16, 0xdead_beef);
        assert_eq!(m.load_u32(16), 0xdead_beef);
        // The last word reads; a misaligned one, or one past the end however far, gives 0.
        m.store_u32(BAR2_SIZE - 4, 5);
        assert_eq!(m.load_u32(BAR2_SIZE - 4), 5);
        assert_eq!(m.load_u32(18), 0);
        assert_eq!(m.load_u32(u32::MAX - 3), 0);
    }
}
