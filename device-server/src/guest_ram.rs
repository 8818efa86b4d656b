//! A QEMU guest's RAM as the device server maps it: a sealed memfd it shares with QEMU, or
//! the file QEMU backs it with (`-object memory-backend-file,share=on,mem-path=...`).
//!
//! QEMU connects to the device server before it creates its RAM backend, so a file may not
//! exist when the guest connects: it is mapped on first use. Until then (or if it cannot be
//! mapped), every DMA faults, which the model turns into error completions for that guest
//! alone.

use std::fs::{File, OpenOptions};
use std::sync::OnceLock;

use hca_model::dma::{DmaFault, DmaSpace, GuestRam, RamTable, Slices};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, VolatileSlice};

use crate::RamBacking;

const GIB: u64 = 1 << 30;

/// Where q35 puts guest RAM: below 2.75 GiB all of it at 0; from 2.75 GiB on, 2 GiB at 0
/// and the rest above 4 GiB. Returns (guest address, length, file offset) per region.
pub fn q35_layout(size: u64) -> Vec<(u64, u64, u64)> {
    if size < 2 * GIB + 3 * GIB / 4 {
        vec![(0, size, 0)]
    } else {
        vec![(0, 2 * GIB, 0), (4 * GIB, size - 2 * GIB, 2 * GIB)]
    }
}

pub struct QemuRam {
    backing: RamBacking,
    size: u64,
    mapped: OnceLock<GuestRam<GuestMemoryMmap>>,
}

impl QemuRam {
    pub fn new(backing: RamBacking, size: u64) -> Self {
        Self {
            backing,
            size,
            mapped: OnceLock::new(),
        }
    }

    fn open(&self) -> Option<File> {
        match &self.backing {
            RamBacking::Memfd(f) => f.try_clone().ok(),
            RamBacking::Path(p) => OpenOptions::new().read(true).write(true).open(p).ok(),
        }
    }

    fn map(&self) -> Option<&GuestRam<GuestMemoryMmap>> {
        if let Some(m) = self.mapped.get() {
            return Some(m);
        }
        let file = self.open()?;
        if file.metadata().ok()?.len() < self.size {
            return None; // QEMU has not sized it yet.
        }
        let ranges: Vec<_> = q35_layout(self.size)
            .into_iter()
            .map(|(gpa, len, off)| {
                let fo = file.try_clone().ok().map(|f| FileOffset::new(f, off));
                (GuestAddress(gpa), len as usize, fo)
            })
            .collect();
        let mem = GuestMemoryMmap::from_ranges_with_files(ranges).ok()?;
        log::info!(
            "mapped guest RAM {:?} ({} MiB)",
            self.backing,
            self.size >> 20
        );
        let _ = self.mapped.set(GuestRam::new(mem));
        self.mapped.get()
    }
}

/// Every access goes to the mapped [`GuestRam`], its fast paths included.
impl DmaSpace for QemuRam {
    fn slices(&self, addr: u64, len: u64) -> Result<Slices<'_>, DmaFault> {
        self.map().ok_or(DmaFault { addr, len })?.slices(addr, len)
    }

    fn flat(&self, addr: u64, len: u64) -> Option<VolatileSlice<'_>> {
        self.map()?.flat(addr, len)
    }

    fn table(&self) -> Option<&RamTable> {
        self.map()?.table()
    }

    fn check(&self, addr: u64, len: u64) -> bool {
        self.map().is_some_and(|m| m.check(addr, len))
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let len = buf.len() as u64;
        self.map().ok_or(DmaFault { addr, len })?.read(addr, buf)
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaFault> {
        let len = buf.len() as u64;
        self.map().ok_or(DmaFault { addr, len })?.write(addr, buf)
    }

    /// A CQE or EQE: the entry and its flag through one look-up, as [`GuestRam`] does it
    /// (the trait's default is two writes, each looked up).
    fn publish(&self, addr: u64, entry: &[u8], at: usize, flag: u8) -> Result<(), DmaFault> {
        let len = entry.len() as u64;
        (self.map().ok_or(DmaFault { addr, len })?).publish(addr, entry, at, flag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_q35_splits_ram_above_2_75_gib() {
        assert_eq!(q35_layout(GIB), vec![(0, GIB, 0)]);
        assert_eq!(q35_layout(11 * GIB / 4 - 1), vec![(0, 11 * GIB / 4 - 1, 0)]);
        assert_eq!(
            q35_layout(3 * GIB),
            vec![(0, 2 * GIB, 0), (4 * GIB, GIB, 2 * GIB)]
        );
    }

    #[test]
    fn test_ram_file_is_mapped_once_it_exists_and_is_sized() {
        let dir = std::env::temp_dir().join(format!("hcab-ram-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ram");
        let ram = QemuRam::new(RamBacking::Path(path.clone()), 1 << 20);
        assert!(!ram.check(0, 8), "no file yet");
        let f = std::fs::File::create(&path).unwrap();
        assert!(!ram.check(0, 8), "file not sized yet");
        f.set_len(1 << 20).unwrap();
        ram.write(0x100, b"hello").unwrap();
        let mut b = [0u8; 5];
        let file = std::fs::File::open(&path).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut b, 0x100).unwrap();
        assert_eq!(&b, b"hello", "writes land in the file QEMU maps");
        ram.publish(0x200, &[1, 2, 3, 4], 3, 9).unwrap();
        let mut e = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut e, 0x200).unwrap();
        assert_eq!(e, [1, 2, 3, 9], "an entry published lands with its flag");
        assert!(ram.publish((1 << 20) - 2, &[1, 2, 3, 4], 3, 9).is_err());
        assert!(!ram.check((1 << 20) - 4, 8));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
