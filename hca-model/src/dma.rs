//! DMA into one guest's memory, behind an object-safe trait.
//!
//! The model is generic over `vm_memory::GuestMemory` at its public edge ([`GuestRam`]); inside,
//! everything goes through `dyn DmaSpace` so that a packet can carry a reference to its
//! sender's memory and the receiver can copy straight from one guest into another (one
//! memmove per host-contiguous piece, no bounce buffer). Every access is bounds-checked by
//! vm-memory against the guest's regions: an address outside them is a [`DmaFault`], never a
//! host access.

use std::fmt;

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryError, Permissions, VolatileSlice};

/// A guest address range the device may not touch (outside guest RAM, or overflowing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaFault {
    pub addr: u64,
    pub len: u64,
}

impl fmt::Display for DmaFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DMA to [{:#x}, +{:#x}) is outside guest memory",
            self.addr, self.len
        )
    }
}

impl std::error::Error for DmaFault {}

/// One guest's physical memory as the device sees it.
pub trait DmaSpace: Send + Sync {
    /// Whether `[addr, addr + len)` lies wholly inside guest memory.
    fn check(&self, addr: u64, len: u64) -> bool;
    /// Reads exactly `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault>;
    /// Writes all of `buf` at `addr`; on a fault nothing is written.
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaFault>;
    /// Calls `f` with each host-contiguous piece of `[addr, addr + len)`, in order.
    fn for_each_slice(
        &self,
        addr: u64,
        len: u64,
        f: &mut dyn FnMut(VolatileSlice<'_>),
    ) -> Result<(), DmaFault>;
}

/// Reads a plain ABI object at `addr`.
pub fn read_obj<T: vm_memory::ByteValued + Default>(
    mem: &dyn DmaSpace,
    addr: u64,
) -> Result<T, DmaFault> {
    let mut v = T::default();
    mem.read(addr, v.as_mut_slice())?;
    Ok(v)
}

/// Writes a plain ABI object at `addr`.
pub fn write_obj<T: vm_memory::ByteValued>(
    mem: &dyn DmaSpace,
    addr: u64,
    v: &T,
) -> Result<(), DmaFault> {
    mem.write(addr, v.as_slice())
}

/// Copies `len` bytes from `src` at `src_addr` to `dst` at `dst_addr`, which may be another
/// guest's memory. Both ranges are checked before any byte moves.
pub fn copy_between(
    src: &dyn DmaSpace,
    src_addr: u64,
    dst: &dyn DmaSpace,
    dst_addr: u64,
    len: u64,
) -> Result<(), DmaFault> {
    if !src.check(src_addr, len) {
        return Err(DmaFault {
            addr: src_addr,
            len,
        });
    }
    if !dst.check(dst_addr, len) {
        return Err(DmaFault {
            addr: dst_addr,
            len,
        });
    }
    let mut done = 0u64;
    src.for_each_slice(src_addr, len, &mut |s| {
        let mut inner = 0usize;
        // Cannot fail: the destination range was checked above.
        let _ = dst.for_each_slice(dst_addr + done, s.len() as u64, &mut |d| {
            if let Ok(piece) = s.subslice(inner, d.len()) {
                piece.copy_to_volatile_slice(d);
            }
            inner += d.len();
        });
        done += s.len() as u64;
    })
}

/// Adapts any `vm_memory::GuestMemory` (without dirty bitmap) to [`DmaSpace`].
pub struct GuestRam<M> {
    mem: M,
}

impl<M> GuestRam<M> {
    pub fn new(mem: M) -> Self {
        Self { mem }
    }

    pub fn inner(&self) -> &M {
        &self.mem
    }
}

fn fault(addr: u64, len: u64) -> DmaFault {
    DmaFault { addr, len }
}

impl<M> DmaSpace for GuestRam<M>
where
    M: GuestMemory<Bitmap = ()> + Send + Sync,
{
    fn check(&self, addr: u64, len: u64) -> bool {
        let Ok(len_usize) = usize::try_from(len) else {
            return false;
        };
        addr.checked_add(len).is_some()
            && (len == 0
                || self
                    .mem
                    .check_range(GuestAddress(addr), len_usize, Permissions::ReadWrite))
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let len = buf.len() as u64;
        if !self.check(addr, len) {
            return Err(fault(addr, len));
        }
        self.mem
            .read_slice(buf, GuestAddress(addr))
            .map_err(|_: GuestMemoryError| fault(addr, len))
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaFault> {
        let len = buf.len() as u64;
        if !self.check(addr, len) {
            return Err(fault(addr, len));
        }
        self.mem
            .write_slice(buf, GuestAddress(addr))
            .map_err(|_: GuestMemoryError| fault(addr, len))
    }

    fn for_each_slice(
        &self,
        addr: u64,
        len: u64,
        f: &mut dyn FnMut(VolatileSlice<'_>),
    ) -> Result<(), DmaFault> {
        if !self.check(addr, len) {
            return Err(fault(addr, len));
        }
        if len == 0 {
            return Ok(());
        }
        let slices = self
            .mem
            .get_slices(GuestAddress(addr), len as usize, Permissions::ReadWrite)
            .map_err(|_| fault(addr, len))?;
        for s in slices {
            f(s.map_err(|_| fault(addr, len))?);
        }
        Ok(())
    }
}
