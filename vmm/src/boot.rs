//! Guest memory and CPU state for entering a guest: RAM as a memfd through vm-memory, its
//! memory slot, and the 64-bit entry state the bare-metal test guest starts in (identity
//! page tables over the low 4 GiB, a flat GDT, long mode on).

use std::fs::File;

use kvm_bindings::{kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{VcpuFd, VmFd};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MmapRegion,
};

/// Slot 0: guest RAM from address 0; device memory (BAR2) takes slots from 1.
pub const RAM_SLOT: u32 = 0;

const GDT: u64 = 0x500;
const PML4: u64 = 0x9000;
const PDPT: u64 = 0xa000;
const PD: u64 = 0xb000; // four pages: 4 GiB of 2 MiB pages

/// Why guest RAM, its memory slot or the 64-bit entry state could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("memfd_create: {0}")]
    Memfd(#[source] std::io::Error),
    #[error("memfd size: {0}")]
    MemfdSize(#[source] std::io::Error),
    #[error("mmap of guest RAM: {0}")]
    Mmap(#[source] vm_memory::mmap::MmapRegionError),
    #[error("guest RAM region")]
    Region,
    #[error("guest memory: {0}")]
    Memory(#[source] vm_memory::GuestRegionCollectionError),
    #[error("no guest RAM")]
    NoRam,
    #[error("KVM_SET_USER_MEMORY_REGION slot {slot}: {source}")]
    MemorySlot {
        slot: u32,
        source: kvm_ioctls::Error,
    },
    #[error("boot tables at {addr:#x}: {source}")]
    Tables {
        addr: u64,
        source: vm_memory::GuestMemoryError,
    },
    /// A vCPU register ioctl (named) failed.
    #[error("{0}: {1}")]
    Vcpu(&'static str, #[source] kvm_ioctls::Error),
}

/// `size` bytes of guest RAM at address 0, backed by a memfd (shareable, e.g. with a
/// device process).
pub fn guest_ram(size: usize) -> Result<GuestMemoryMmap, BootError> {
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"hcabench-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(BootError::Memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a new descriptor we own.
    let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(size as u64).map_err(BootError::MemfdSize)?;
    let region = MmapRegion::from_file(FileOffset::new(file, 0), size).map_err(BootError::Mmap)?;
    let region = GuestRegionMmap::new(region, GuestAddress(0)).ok_or(BootError::Region)?;
    GuestMemoryMmap::from_regions(vec![region]).map_err(BootError::Memory)
}

/// Registers host memory at `host` as guest-physical `gpa..gpa+size` in `slot`.
///
/// # Safety
/// `host..host+size` must stay mapped for as long as the VM exists.
pub unsafe fn map_slot(
    vm: &VmFd,
    slot: u32,
    gpa: u64,
    size: u64,
    host: u64,
) -> Result<(), BootError> {
    let r = kvm_userspace_memory_region {
        slot,
        flags: 0,
        guest_phys_addr: gpa,
        memory_size: size,
        userspace_addr: host,
    };
    // SAFETY: the caller guarantees the mapping outlives the VM.
    unsafe { vm.set_user_memory_region(r) }.map_err(|source| BootError::MemorySlot { slot, source })
}

/// Maps all of `mem` (one region) as slot 0.
pub fn map_ram(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), BootError> {
    let r = mem.iter().next().ok_or(BootError::NoRam)?;
    // SAFETY: the caller keeps `mem` alive as long as the VM (Machine owns both).
    unsafe { map_slot(vm, RAM_SLOT, r.start_addr().0, r.len(), r.as_ptr() as u64) }
}

fn seg(selector: u16, typ: u8, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: typ,
        present: 1,
        dpl: 0,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Writes the page tables and GDT into guest RAM and puts the vCPU in 64-bit mode at
/// `entry` with `stack` as its stack pointer.
pub fn enter_long_mode(
    mem: &GuestMemoryMmap,
    vcpu: &VcpuFd,
    entry: u64,
    stack: u64,
) -> Result<(), BootError> {
    let w = |addr: u64, v: u64| {
        mem.write_obj(v, GuestAddress(addr))
            .map_err(|source| BootError::Tables { addr, source })
    };
    // Null, 64-bit code (0x08), data (0x10).
    for (i, d) in [0u64, 0x00af_9b00_0000_ffff, 0x00cf_9300_0000_ffff]
        .iter()
        .enumerate()
    {
        w(GDT + 8 * i as u64, *d)?;
    }
    w(PML4, PDPT | 3)?;
    for i in 0..4u64 {
        w(PDPT + 8 * i, (PD + 0x1000 * i) | 3)?;
        for j in 0..512u64 {
            // 2 MiB pages; the top GiB (devices, the local APIC) uncached.
            let pcd = if i == 3 { 1 << 4 } else { 0 };
            w(
                PD + 0x1000 * i + 8 * j,
                ((i << 30) + (j << 21)) | 0x83 | pcd,
            )?;
        }
    }
    let mut s = vcpu
        .get_sregs()
        .map_err(|e| BootError::Vcpu("KVM_GET_SREGS", e))?;
    s.gdt.base = GDT;
    s.gdt.limit = 23;
    s.cs = seg(0x08, 0xb, true);
    let data = seg(0x10, 0x3, false);
    (s.ds, s.es, s.fs, s.gs, s.ss) = (data, data, data, data, data);
    s.cr3 = PML4;
    s.cr4 |= 1 << 5; // PAE
    s.cr0 |= 1 | (1 << 31); // PE, PG
    s.efer |= (1 << 8) | (1 << 10); // LME, LMA
    vcpu.set_sregs(&s)
        .map_err(|e| BootError::Vcpu("KVM_SET_SREGS", e))?;
    let mut r = vcpu
        .get_regs()
        .map_err(|e| BootError::Vcpu("KVM_GET_REGS", e))?;
    r.rip = entry;
    r.rsp = stack;
    r.rflags = 2;
    vcpu.set_regs(&r)
        .map_err(|e| BootError::Vcpu("KVM_SET_REGS", e))
}
