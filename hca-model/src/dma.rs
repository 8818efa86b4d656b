//! DMA into one guest's memory, behind an object-safe trait.
//!
//! The model is generic over `vm_memory::GuestMemory` at its public edge ([`GuestRam`]); inside,
//! everything goes through `dyn DmaSpace` so that a packet can carry a reference to its
//! sender's memory and the receiver can copy straight from one guest into another (one
//! memmove per host-contiguous piece, no bounce buffer). Every access is bounds-checked
//! against the guest's regions: an address outside them is a [`DmaFault`], never a host
//! access. [`GuestRam`] answers a range inside one region from its own table of the
//! regions (nearly every access: one copy, no slice list) and leaves the rest to vm-memory;
//! a range is looked up once per region it crosses, and a write that would fault writes
//! nothing. That table ([`RamTable`]) is lent by the space, so that the device's accesses
//! on a message's path ([`read()`], [`write()`], [`publish()`], [`check()`]) run inline, with
//! their lengths known, and go through the trait only for what the table does not answer.

use std::fmt;
use std::sync::atomic::{fence, Ordering};

use vm_memory::{
    Address, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress,
    Permissions, VolatileSlice,
};

/// A guest address range the device may not touch (outside guest RAM, or overflowing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaFault {
    /// The guest-physical start of the range.
    pub addr: u64,
    /// Its length in bytes.
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

/// The host-contiguous pieces of one guest range, in order; nearly always one.
pub enum Slices<'a> {
    /// The range lies in one host mapping.
    One(VolatileSlice<'a>),
    /// The range crosses mappings: one slice each, in guest order.
    Many(Vec<VolatileSlice<'a>>),
}

impl<'a> Slices<'a> {
    /// The pieces, as one slice however many there are.
    pub fn as_slice(&self) -> &[VolatileSlice<'a>] {
        match self {
            Slices::One(s) => std::slice::from_ref(s),
            Slices::Many(v) => v,
        }
    }
}

/// One guest's physical memory as the device sees it.
pub trait DmaSpace: Send + Sync {
    /// The pieces of `[addr, addr + len)`, or a fault if any byte lies outside guest memory.
    fn slices(&self, addr: u64, len: u64) -> Result<Slices<'_>, DmaFault>;

    /// `[addr, addr + len)` as one slice when it lies in one mapped piece of guest memory,
    /// found without building [`Slices`]; `None` (the default) sends the caller to
    /// [`DmaSpace::slices`], which also says whether the range faults.
    fn flat(&self, _addr: u64, _len: u64) -> Option<VolatileSlice<'_>> {
        None
    }

    /// The table of mapped regions that answers most accesses, when the space has one (see
    /// [`RamTable`]): the device's hot accesses then run inline, not through this trait.
    fn table(&self) -> Option<&RamTable> {
        None
    }

    /// Whether `[addr, addr + len)` lies wholly inside guest memory.
    fn check(&self, addr: u64, len: u64) -> bool {
        self.slices(addr, len).is_ok()
    }

    /// Reads exactly `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        read_pieces(self, addr, buf)
    }

    /// Writes all of `buf` at `addr`; on a fault nothing is written.
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaFault> {
        write_pieces(self, addr, buf)
    }

    /// Writes a ring entry whose consumer polls one byte of it: `entry` at `addr`, then,
    /// after a release fence, `flag` at `addr + at` (inside the entry), so that a consumer
    /// that sees the flag sees the whole entry. On a fault nothing is written.
    fn publish(&self, addr: u64, entry: &[u8], at: usize, flag: u8) -> Result<(), DmaFault> {
        self.write(addr, entry)?;
        fence(Ordering::Release);
        self.write(addr.wrapping_add(at as u64), &[flag])
    }
}

/// [`DmaSpace::read`] through the space's slices.
fn read_pieces<D: DmaSpace + ?Sized>(d: &D, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
    // The pieces cover exactly `buf.len()` bytes, in order.
    let mut rest = buf;
    for s in d.slices(addr, rest.len() as u64)?.as_slice() {
        let (piece, tail) = rest.split_at_mut(s.len().min(rest.len()));
        s.copy_to(piece);
        rest = tail;
    }
    Ok(())
}

/// [`DmaSpace::write`] through the space's slices.
fn write_pieces<D: DmaSpace + ?Sized>(d: &D, addr: u64, buf: &[u8]) -> Result<(), DmaFault> {
    let mut rest = buf;
    for s in d.slices(addr, rest.len() as u64)?.as_slice() {
        let (piece, tail) = rest.split_at(s.len().min(rest.len()));
        s.copy_from(piece);
        rest = tail;
    }
    Ok(())
}

/// Reads a plain ABI object at `addr`.
#[inline(always)]
pub fn read_obj<T: vm_memory::ByteValued + Default>(
    mem: &dyn DmaSpace,
    addr: u64,
) -> Result<T, DmaFault> {
    let mut v = T::default();
    read(mem, addr, v.as_mut_slice())?;
    Ok(v)
}

/// Writes a plain ABI object at `addr`.
pub fn write_obj<T: vm_memory::ByteValued>(
    mem: &dyn DmaSpace,
    addr: u64,
    v: &T,
) -> Result<(), DmaFault> {
    write(mem, addr, v.as_slice())
}

// The device's accesses: inline through the space's table when the range lies in one
// region (a copy of a length its caller knows), else through the space.

/// [`DmaSpace::read`].
#[inline(always)]
pub fn read(mem: &dyn DmaSpace, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
    match mem.table().and_then(|t| t.read(addr, buf)) {
        Some(()) => Ok(()),
        None => mem.read(addr, buf),
    }
}

/// [`DmaSpace::write`].
#[inline(always)]
pub fn write(mem: &dyn DmaSpace, addr: u64, buf: &[u8]) -> Result<(), DmaFault> {
    match mem.table().and_then(|t| t.write(addr, buf)) {
        Some(()) => Ok(()),
        None => mem.write(addr, buf),
    }
}

/// [`DmaSpace::publish`].
#[inline(always)]
pub fn publish(
    mem: &dyn DmaSpace,
    addr: u64,
    entry: &[u8],
    at: usize,
    flag: u8,
) -> Result<(), DmaFault> {
    match mem.table().and_then(|t| t.publish(addr, entry, at, flag)) {
        Some(()) => Ok(()),
        None => mem.publish(addr, entry, at, flag),
    }
}

/// [`DmaSpace::check`].
#[inline(always)]
pub fn check(mem: &dyn DmaSpace, addr: u64, len: u64) -> bool {
    mem.table()
        .is_some_and(|t| t.host_range(addr, len).is_some())
        || mem.check(addr, len)
}

/// Copies `len` bytes from `src` at `src_addr` to `dst` at `dst_addr`, which may be another
/// guest's memory. Both ranges are resolved (and so checked) before any byte moves.
pub fn copy_between(
    src: &dyn DmaSpace,
    src_addr: u64,
    dst: &dyn DmaSpace,
    dst_addr: u64,
    len: u64,
) -> Result<(), DmaFault> {
    // Nearly every copy: one piece on each side, one memmove (the two may be overlapping
    // ranges of one guest's memory, a loopback WRITE).
    if let (Some(from), Some(to)) = (src.flat(src_addr, len), dst.flat(dst_addr, len)) {
        from.copy_to_volatile_slice(to);
        return Ok(());
    }
    let s = src.slices(src_addr, len)?;
    let d = dst.slices(dst_addr, len)?;
    let (s, d) = (s.as_slice(), d.as_slice());
    let (mut si, mut so, mut di, mut d_off) = (0, 0, 0, 0);
    while let (Some(sp), Some(dp)) = (s.get(si), d.get(di)) {
        let n = (sp.len() - so).min(dp.len() - d_off);
        if let (Ok(from), Ok(to)) = (sp.subslice(so, n), dp.subslice(d_off, n)) {
            from.copy_to_volatile_slice(to);
        }
        so += n;
        d_off += n;
        if so == sp.len() {
            (si, so) = (si + 1, 0);
        }
        if d_off == dp.len() {
            (di, d_off) = (di + 1, 0);
        }
    }
    Ok(())
}

/// Adapts any `vm_memory::GuestMemory` (without dirty bitmap) to [`DmaSpace`].
///
/// A range inside one region (nearly every access) is found in a table of the regions made
/// once, without vm-memory's per-access region search and iterator; anything else (a range
/// across regions, or one that faults) takes vm-memory's path.
pub struct GuestRam<M> {
    mem: M,
    table: RamTable,
}

/// The regions of a guest's RAM mapped in this process, with their host addresses: what
/// [`GuestRam`] answers a range inside one region from. Only a space hands one out,
/// borrowed ([`DmaSpace::table`]): the space keeps the mappings for as long as it lives,
/// and a region's mapping does not change through a shared reference.
pub struct RamTable {
    regions: Vec<FlatRegion>,
}

/// One region of guest RAM: guest range and where it is mapped in this process.
struct FlatRegion {
    start: u64,
    len: u64,
    /// Host address of `start` (a `*mut u8` kept as an integer so the table is Send + Sync).
    host: usize,
}

impl<M: GuestMemory> GuestRam<M> {
    /// Wraps `mem`, noting the host address of each region so that DMA skips vm-memory's lookup.
    pub fn new(mem: M) -> Self {
        // Regions without a host address (none in vm-memory's mmap backend) or memory behind
        // an IOMMU leave the table empty: every access takes vm-memory's path.
        let regions = mem
            .physical_memory()
            .map(|phys| {
                phys.iter()
                    .map_while(|r| {
                        let host = r.get_host_address(MemoryRegionAddress(0)).ok()?;
                        Some(FlatRegion {
                            start: r.start_addr().raw_value(),
                            len: r.len(),
                            host: host as usize,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            mem,
            table: RamTable { regions },
        }
    }
}

impl<M> GuestRam<M> {
    /// The wrapped guest memory.
    pub fn inner(&self) -> &M {
        &self.mem
    }

    #[inline]
    fn host_range(&self, addr: u64, len: u64) -> Option<*mut u8> {
        self.table.host_range(addr, len)
    }
}

impl RamTable {
    /// The host address of `[addr, addr + len)` when it lies inside one region (and is not
    /// empty).
    #[inline]
    fn host_range(&self, addr: u64, len: u64) -> Option<*mut u8> {
        if len == 0 {
            return None;
        }
        self.regions.iter().find_map(|r| {
            let off = addr.checked_sub(r.start)?;
            (off <= r.len && len <= r.len - off).then(|| (r.host + off as usize) as *mut u8)
        })
    }

    /// Reads `buf` at `addr` if the range lies in one region; None leaves it to the space.
    #[inline(always)]
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Option<()> {
        let host = self.host_range(addr, buf.len() as u64)?;
        // SAFETY: the range is mapped guest RAM for as long as the space that lent this
        // table lives (see `RamTable`); `buf` is this process's own memory, so the two do
        // not overlap.
        unsafe {
            if buf.len() > SMALL_COPY {
                copy_object(host, buf.as_mut_ptr(), buf.len());
            } else {
                load_small(host, buf);
            }
        }
        Some(())
    }

    /// Writes `buf` at `addr` if the range lies in one region; None leaves it to the space.
    #[inline(always)]
    pub fn write(&self, addr: u64, buf: &[u8]) -> Option<()> {
        let host = self.host_range(addr, buf.len() as u64)?;
        // SAFETY: as in `read`.
        unsafe {
            if buf.len() > SMALL_COPY {
                copy_object(buf.as_ptr(), host, buf.len());
            } else {
                store_small(host, buf);
            }
        }
        Some(())
    }

    /// [`DmaSpace::publish`] with one look-up of the entry, if it lies in one region and
    /// `at` inside it; None leaves it to the space.
    #[inline(always)]
    pub fn publish(&self, addr: u64, entry: &[u8], at: usize, flag: u8) -> Option<()> {
        if at >= entry.len() {
            return None;
        }
        let host = self.host_range(addr, entry.len() as u64)?;
        // SAFETY: as in `write`; `at` lies inside the entry's range.
        unsafe {
            copy_object(entry.as_ptr(), host, entry.len());
            fence(Ordering::Release);
            std::ptr::write_volatile(host.add(at), flag);
        }
        Some(())
    }
}

/// Copies of this many bytes or fewer are volatile accesses, an aligned word a single one
/// (a CQE's owner byte, a counter), as vm-memory makes them; longer ones are a memcpy, as
/// there too. Both are done here without building vm-memory's slices.
const SMALL_COPY: usize = 8;

/// Stores `buf` (at most [`SMALL_COPY`] bytes) at `dst` with volatile writes: one when its
/// length is 2, 4 or 8 and `dst` is aligned to it, else one per byte.
///
/// # Safety
/// `dst` must be valid for writes of `buf.len()` bytes.
unsafe fn store_small(dst: *mut u8, buf: &[u8]) {
    use std::ptr::write_volatile;
    let aligned = |n: usize| dst as usize % n == 0;
    // SAFETY: the caller's promise; each arm writes exactly `buf.len()` bytes at `dst`.
    unsafe {
        match *buf {
            [a, b] if aligned(2) => write_volatile(dst.cast(), u16::from_ne_bytes([a, b])),
            [a, b, c, d] if aligned(4) => {
                write_volatile(dst.cast(), u32::from_ne_bytes([a, b, c, d]))
            }
            [a, b, c, d, e, f, g, h] if aligned(8) => {
                write_volatile(dst.cast(), u64::from_ne_bytes([a, b, c, d, e, f, g, h]))
            }
            _ => {
                for (i, &v) in buf.iter().enumerate() {
                    write_volatile(dst.add(i), v);
                }
            }
        }
    }
}

/// Loads `buf.len()` (at most [`SMALL_COPY`]) bytes from `src` the way [`store_small`]
/// stores them.
///
/// # Safety
/// `src` must be valid for reads of `buf.len()` bytes.
unsafe fn load_small(src: *const u8, buf: &mut [u8]) {
    use std::ptr::read_volatile;
    let aligned = |n: usize| src as usize % n == 0;
    // SAFETY: the caller's promise; each arm reads exactly `buf.len()` bytes at `src`.
    unsafe {
        match buf.len() {
            2 if aligned(2) => buf.copy_from_slice(&read_volatile(src.cast::<u16>()).to_ne_bytes()),
            4 if aligned(4) => buf.copy_from_slice(&read_volatile(src.cast::<u32>()).to_ne_bytes()),
            8 if aligned(8) => buf.copy_from_slice(&read_volatile(src.cast::<u64>()).to_ne_bytes()),
            _ => {
                for (i, v) in buf.iter_mut().enumerate() {
                    *v = read_volatile(src.add(i));
                }
            }
        }
    }
}

/// Copies `len` bytes from `src` to `dst`. The sizes of the ABI's objects (an SGE or a
/// receive WQE, a CQE, a send WQE, a send WQE with its first SGE) are copies of a length
/// known here, which the compiler makes a few vector moves; other lengths call memcpy,
/// whose call and dispatch cost more than such a copy itself.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, not overlapping.
#[inline(always)]
unsafe fn copy_object(src: *const u8, dst: *mut u8, len: usize) {
    /// One object of `N` bytes, moved as a value: LLVM keeps these arms apart, where
    /// `copy_nonoverlapping(src, dst, N)` in each arm is folded (under LTO) back into one
    /// memcpy of `len`.
    ///
    /// # Safety
    /// As for `copy_object`, with `len == N`.
    #[inline(always)]
    unsafe fn by_value<const N: usize>(src: *const u8, dst: *mut u8) {
        // SAFETY: the caller's promise; unaligned accesses of exactly N bytes.
        unsafe {
            dst.cast::<[u8; N]>()
                .write_unaligned(src.cast::<[u8; N]>().read_unaligned())
        }
    }
    // SAFETY: the caller's promise; each arm copies exactly `len` bytes.
    unsafe {
        match len {
            16 => by_value::<16>(src, dst),
            32 => by_value::<32>(src, dst),
            64 => by_value::<64>(src, dst),
            80 => by_value::<80>(src, dst),
            _ => std::ptr::copy_nonoverlapping(src, dst, len),
        }
    }
}

impl<M> DmaSpace for GuestRam<M>
where
    M: GuestMemory<Bitmap = ()> + Send + Sync,
{
    fn slices(&self, addr: u64, len: u64) -> Result<Slices<'_>, DmaFault> {
        let fault = DmaFault { addr, len };
        let count = usize::try_from(len).map_err(|_| fault)?;
        addr.checked_add(len).ok_or(fault)?;
        if count == 0 {
            return Ok(Slices::Many(Vec::new()));
        }
        if let Some(host) = self.host_range(addr, len) {
            // SAFETY: [addr, addr + len) lies inside one region, which `self.mem` keeps
            // mapped at its host address for as long as `self` lives (a GuestMemory's
            // regions do not change through a shared reference), and guest memory is only
            // ever accessed through volatile slices or whole-range copies.
            return Ok(Slices::One(unsafe { VolatileSlice::new(host, count) }));
        }
        let mut it = self
            .mem
            .get_slices(GuestAddress(addr), count, Permissions::ReadWrite)
            .map_err(|_| fault)?;
        let first = it.next().ok_or(fault)?.map_err(|_| fault)?;
        if first.len() == count {
            return Ok(Slices::One(first));
        }
        // get_slices yields pieces covering `count` bytes unless one of them is an error.
        let mut all = vec![first];
        for s in it {
            all.push(s.map_err(|_| fault)?);
        }
        Ok(Slices::Many(all))
    }

    fn flat(&self, addr: u64, len: u64) -> Option<VolatileSlice<'_>> {
        let host = self.host_range(addr, len)?;
        // SAFETY: as in `slices`.
        Some(unsafe { VolatileSlice::new(host, len as usize) })
    }

    fn table(&self) -> Option<&RamTable> {
        Some(&self.table)
    }

    fn check(&self, addr: u64, len: u64) -> bool {
        self.host_range(addr, len).is_some() || self.slices(addr, len).is_ok()
    }

    // Inline where the space's type is known (a test driver playing the guest): a CQE's
    // owner byte is then a load, as it is to a guest's driver.
    #[inline]
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        match self.table.read(addr, buf) {
            Some(()) => Ok(()),
            None => read_pieces(self, addr, buf),
        }
    }

    #[inline]
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaFault> {
        match self.table.write(addr, buf) {
            Some(()) => Ok(()),
            None => write_pieces(self, addr, buf),
        }
    }

    /// One look-up of the entry's host address for both stores (a CQE per completion).
    fn publish(&self, addr: u64, entry: &[u8], at: usize, flag: u8) -> Result<(), DmaFault> {
        if self.table.publish(addr, entry, at, flag).is_some() {
            return Ok(());
        }
        self.write(addr, entry)?;
        fence(Ordering::Release);
        self.write(addr.wrapping_add(at as u64), &[flag])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn ram() -> GuestRam<GuestMemoryMmap> {
        // Two adjacent regions, then a hole, then a third.
        GuestRam::new(
            GuestMemoryMmap::from_ranges(&[
                (GuestAddress(0), 0x1000),
                (GuestAddress(0x1000), 0x1000),
                (GuestAddress(0x4000), 0x1000),
            ])
            .unwrap(),
        )
    }

    #[test]
    fn test_ranges_across_regions_work_and_holes_fault() {
        let m = ram();
        m.write(0xff0, &[7; 0x20]).unwrap();
        let mut b = [0u8; 0x20];
        m.read(0xff0, &mut b).unwrap();
        assert_eq!(b, [7; 0x20]);
        assert!(m.check(0, 0x2000));
        assert!(!m.check(0x1ff0, 0x20), "runs into the hole");
        assert!(!m.check(u64::MAX - 4, 8), "wraps around");
    }

    #[test]
    fn test_copies_inside_one_region_small_and_large() {
        let m = ram();
        for len in [1usize, 4, 8, 9, 32, 0x1000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let at = 0x1000 - len as u64; // ends exactly at the first region's end
            m.write(at, &data).unwrap();
            let mut got = vec![0u8; len];
            m.read(at, &mut got).unwrap();
            assert_eq!(got, data, "{len} bytes");
        }
        // Small ones at every alignment (one access when aligned, else bytes).
        for len in 1..=8usize {
            for at in 0x4000..0x4008u64 {
                let data: Vec<u8> = (0..len).map(|i| (at as usize + i * 13) as u8).collect();
                m.write(at, &data).unwrap();
                let mut got = vec![0u8; len];
                m.read(at, &mut got).unwrap();
                assert_eq!(got, data, "{len} bytes at {at:#x}");
            }
        }
        assert!(m.write(0x4ff8, &[1; 9]).is_err(), "past the last region");
        assert!(
            m.write(0x4ffc, &[1; 5]).is_err(),
            "a small one past the last region"
        );
        assert!(m.read(u64::MAX - 8, &mut [0; 9]).is_err(), "wraps around");
    }

    #[test]
    fn test_faulting_write_writes_nothing() {
        let m = ram();
        assert!(m.write(0x1ff0, &[9; 0x20]).is_err());
        let mut b = [1u8; 0x10];
        m.read(0x1ff0, &mut b).unwrap();
        assert_eq!(b, [0; 0x10]);
    }

    #[test]
    fn test_copy_between_two_guests_across_pieces() {
        let (a, b) = (ram(), ram());
        let data: Vec<u8> = (0..0x300u32).map(|i| i as u8).collect();
        a.write(0xe00, &data).unwrap();
        copy_between(&a, 0xe00, &b, 0x4100, 0x300).unwrap();
        let mut got = vec![0u8; 0x300];
        b.read(0x4100, &mut got).unwrap();
        assert_eq!(got, data);
        assert!(copy_between(&a, 0xe00, &b, 0x4f00, 0x300).is_err());
    }

    #[test]
    fn test_copy_between_one_piece_each_side() {
        let (a, b) = (ram(), ram());
        let data: Vec<u8> = (0..0x800u32).map(|i| (i * 3) as u8).collect();
        a.write(0x4200, &data).unwrap();
        copy_between(&a, 0x4200, &b, 0x100, 0x800).unwrap();
        let mut got = vec![0u8; 0x800];
        b.read(0x100, &mut got).unwrap();
        assert_eq!(got, data);
        // Overlapping ranges of one guest (a loopback WRITE) copy as a memmove would.
        copy_between(&a, 0x4200, &a, 0x4280, 0x800).unwrap();
        a.read(0x4280, &mut got).unwrap();
        assert_eq!(got, data);
        // One side out of memory: nothing moves.
        assert!(copy_between(&a, 0x4200, &b, 0x1f00, 0x800).is_err());
        assert!(copy_between(&a, 0x4a00, &b, 0x100, 0x800).is_err());
        let mut tail = [0u8; 0x100];
        b.read(0x1f00, &mut tail).unwrap();
        assert_eq!(tail, [0; 0x100]);
    }
}
