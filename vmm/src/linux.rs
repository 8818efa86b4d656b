//! Direct Linux boot through linux-loader: Debian's bzImage loaded at 1 MiB (or the ELF
//! vmlinux extracted from it, which skips the decompressor), the zero page (setup header,
//! command line, initramfs, e820 map) and the MP table, entered through the 64-bit boot
//! protocol (%rsi = the zero page; the entry is the bzImage's load address + 0x200, or the
//! ELF's entry point, startup_64 either way).

use std::fs::File;
use std::path::PathBuf;

use kvm_ioctls::VcpuFd;
use linux_loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::elf::Elf;
use linux_loader::loader::{load_cmdline, KernelLoader, KernelLoaderResult};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{boot, mptable};

/// What to boot.
#[derive(Debug, Clone)]
pub struct LinuxBoot {
    pub kernel: PathBuf,
    pub initramfs: Option<PathBuf>,
    pub cmdline: String,
}

const ZERO_PAGE: u64 = 0x7000;
const BOOT_STACK: u64 = 0x8ff0;
const CMDLINE: u64 = 0x2_0000;
const CMDLINE_MAX: usize = 2048;
const HIMEM: u64 = 0x10_0000;
/// Base memory ends where the MP table starts; 640K..1M is the legacy hole.
const BASE_END: u64 = mptable::MPTABLE_START;
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
/// The 64-bit entry point's offset in the protected-mode kernel.
const STARTUP_64: u64 = 0x200;
/// Where devices live; RAM must end below it (one slot, no split around the hole).
pub const RAM_LIMIT: u64 = 0xc000_0000;

/// Why a Linux guest could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    #[error("{} MiB of RAM: Linux guests take 64 MiB to {} MiB", .0 >> 20, RAM_LIMIT >> 20)]
    Ram(u64),
    #[error("kernel {}: {source}", .path.display())]
    Kernel {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("kernel {} (ELF): {source}", .path.display())]
    Elf {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    #[error("kernel {}: neither ELF nor bzImage: {source}", .path.display())]
    NotAKernel {
        path: PathBuf,
        source: linux_loader::loader::Error,
    },
    #[error("bzImage without a setup header")]
    NoSetupHeader,
    #[error("command line: {0}")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    #[error("command line {cmdline:?}: {source}")]
    CmdlineText {
        cmdline: String,
        source: linux_loader::cmdline::Error,
    },
    #[error("command line: {0}")]
    CmdlineLoad(#[source] linux_loader::loader::Error),
    #[error("initramfs {}: {source}", .path.display())]
    Initramfs {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("initramfs of {0} bytes does not fit in RAM")]
    InitramfsTooBig(usize),
    #[error("initramfs: {0}")]
    InitramfsWrite(#[source] vm_memory::GuestMemoryError),
    #[error("zero page: {0}")]
    ZeroPage(#[source] linux_loader::configurator::Error),
    #[error(transparent)]
    MpTable(#[from] mptable::MpTableError),
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// A vCPU register ioctl (named) failed.
    #[error("{0}: {1}")]
    Vcpu(&'static str, #[source] kvm_ioctls::Error),
}

fn e820(addr: u64, size: u64, type_: u32) -> boot_e820_entry {
    boot_e820_entry {
        addr,
        size,
        r#type: type_,
    }
}

/// Loads a bzImage or an ELF vmlinux: where it went, its setup header (a fresh one for an
/// ELF) and its 64-bit entry point.
fn load_kernel(
    mem: &GuestMemoryMmap,
    path: &std::path::Path,
) -> Result<(KernelLoaderResult, setup_header, u64), LinuxError> {
    let path_err = |source| LinuxError::Kernel {
        path: path.to_owned(),
        source,
    };
    let mut f = File::open(path).map_err(path_err)?;
    let mut magic = [0u8; 4];
    std::io::Read::read_exact(&mut f, &mut magic).map_err(path_err)?;
    if magic == *b"\x7fELF" {
        let r = Elf::load(mem, None, &mut f, Some(GuestAddress(HIMEM))).map_err(|source| {
            LinuxError::Elf {
                path: path.to_owned(),
                source,
            }
        })?;
        let hdr = setup_header {
            boot_flag: 0xaa55,
            header: 0x5372_6448, // "HdrS"
            version: 0x020f,
            kernel_alignment: 0x100_0000,
            initrd_addr_max: 0x7fff_ffff,
            ..Default::default()
        };
        let entry = r.kernel_load.0;
        return Ok((r, hdr, entry));
    }
    let r = BzImage::load(mem, None, &mut f, Some(GuestAddress(HIMEM))).map_err(|source| {
        LinuxError::NotAKernel {
            path: path.to_owned(),
            source,
        }
    })?;
    let hdr = r.setup_header.ok_or(LinuxError::NoSetupHeader)?;
    let entry = r.kernel_load.0 + STARTUP_64;
    Ok((r, hdr, entry))
}

/// Loads the kernel, the initramfs (at the top of RAM) and the command line, and writes the
/// zero page and MP table; then puts `bsp` at the 64-bit entry point.
pub fn load(
    mem: &GuestMemoryMmap,
    ram_bytes: u64,
    vcpus: u8,
    bsp: &VcpuFd,
    what: &LinuxBoot,
) -> Result<(), LinuxError> {
    if !(64 << 20..=RAM_LIMIT).contains(&ram_bytes) {
        return Err(LinuxError::Ram(ram_bytes));
    }
    let (loaded, mut hdr, entry) = load_kernel(mem, &what.kernel)?;

    let mut cmdline = Cmdline::new(CMDLINE_MAX).map_err(LinuxError::Cmdline)?;
    cmdline
        .insert_str(&what.cmdline)
        .map_err(|source| LinuxError::CmdlineText {
            cmdline: what.cmdline.clone(),
            source,
        })?;
    load_cmdline(mem, GuestAddress(CMDLINE), &cmdline).map_err(LinuxError::CmdlineLoad)?;
    hdr.type_of_loader = 0xff;
    hdr.cmd_line_ptr = CMDLINE as u32;
    hdr.loadflags |= 0x80; // CAN_USE_HEAP
    hdr.heap_end_ptr = 0xfe00;
    hdr.vid_mode = 0xffff;

    if let Some(path) = &what.initramfs {
        let data = std::fs::read(path).map_err(|source| LinuxError::Initramfs {
            path: path.clone(),
            source,
        })?;
        let top = ram_bytes.min(u64::from(hdr.initrd_addr_max) + 1);
        let at = top
            .checked_sub(data.len() as u64)
            .map(|a| a & !0xfff)
            .filter(|a| *a >= loaded.kernel_end)
            .ok_or(LinuxError::InitramfsTooBig(data.len()))?;
        mem.write_slice(&data, GuestAddress(at))
            .map_err(LinuxError::InitramfsWrite)?;
        hdr.ramdisk_image = at as u32;
        hdr.ramdisk_size = data.len() as u32;
    }

    let mut params = boot_params {
        hdr,
        ..Default::default()
    };
    let map = [
        e820(0, BASE_END, E820_RAM),
        e820(BASE_END, HIMEM - BASE_END, E820_RESERVED),
        e820(HIMEM, ram_bytes - HIMEM, E820_RAM),
    ];
    for (slot, e) in params.e820_table.iter_mut().zip(map) {
        *slot = e;
    }
    params.e820_entries = map.len() as u8;
    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE)),
        mem,
    )
    .map_err(LinuxError::ZeroPage)?;
    mptable::write(mem, vcpus)?;

    boot::enter_long_mode(mem, bsp, entry, BOOT_STACK)?;
    let mut regs = bsp
        .get_regs()
        .map_err(|e| LinuxError::Vcpu("KVM_GET_REGS", e))?;
    regs.rsi = ZERO_PAGE;
    bsp.set_regs(&regs)
        .map_err(|e| LinuxError::Vcpu("KVM_SET_REGS", e))
}
