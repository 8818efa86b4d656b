//! A read-only virtio block device (virtio 1.1 §5.2) backed by an image file: what the
//! guests' shared userland disk (images/build.py's EROFS `userland.img`) is under
//! hcabench's VMM, as QEMU's virtio-blk is under QEMU. One request queue, no writes.
//!
//! Threat model: the guest driver is hostile. Every request comes from guest memory: its
//! descriptor chain (walked by the `virtio-queue` crate, which bounds it by the queue size,
//! follows indirect tables once and refuses chains over 4 GiB), its header, its buffers'
//! lengths and its sector. A request that cannot be served is completed with
//! `VIRTIO_BLK_S_IOERR` (bad length, sectors past the end, a write to this read-only disk)
//! or `VIRTIO_BLK_S_UNSUPP` (a type we do not offer); one with no room for its status byte,
//! or whose buffers lie outside guest RAM, is returned with nothing written. Nothing here
//! panics on guest input, and what a request allocates is bounded: data moves through one
//! [`CHUNK`]-sized buffer the device keeps.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR,
    VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{ByteValued, GuestMemoryMmap};

use crate::virtio_mmio::VirtioDevice;

/// A sector, as virtio-blk counts them whatever the backing file's block size.
pub const SECTOR: u64 = 512;
/// The request queue's size (descriptors). Linux asks for the largest the device offers.
pub const QUEUE_SIZE: u16 = 256;
/// Data moves between the file and guest memory this many bytes at a time.
pub const CHUNK: usize = 64 << 10;
/// Segments a request may have besides its header and status (`seg_max` in the config).
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;

/// A request's header (`struct virtio_blk_outhdr`), the first 16 device-readable bytes.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct RequestHeader {
    type_: u32,
    ioprio: u32,
    sector: u64,
}
const _: () = assert!(std::mem::size_of::<RequestHeader>() == 16);

// SAFETY: plain integers with no padding (the size assertion above: 4 + 4 + 8), so every
// byte pattern is a valid value.
unsafe impl ByteValued for RequestHeader {}

/// Why a disk could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("disk {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("disk {}: {bytes} bytes, not a whole number of {SECTOR}-byte sectors", .path.display())]
    Size { path: PathBuf, bytes: u64 },
    #[error("disk serial {0:?}: at most {VIRTIO_BLK_ID_BYTES} bytes")]
    Serial(String),
}

/// The device: the image (opened read-only; every VM opens its own descriptor on the same
/// file), its size in sectors, the serial `GET_ID` reports (the guest's
/// `/sys/block/vdX/serial`) and the bounce buffer.
pub struct Block {
    file: File,
    sectors: u64,
    id: [u8; VIRTIO_BLK_ID_BYTES as usize],
    buf: Vec<u8>,
}

impl Block {
    /// Opens `path` read-only as a disk whose serial is `serial`.
    pub fn open(path: &Path, serial: &str) -> Result<Block, BlockError> {
        let err = |source| BlockError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(err)?;
        let bytes = file.metadata().map_err(err)?.len();
        if bytes % SECTOR != 0 {
            return Err(BlockError::Size {
                path: path.to_owned(),
                bytes,
            });
        }
        Block::new(file, bytes / SECTOR, serial)
    }

    /// A disk of `sectors` sectors read from `file`.
    pub fn new(file: File, sectors: u64, serial: &str) -> Result<Block, BlockError> {
        let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
        id.get_mut(..serial.len())
            .ok_or_else(|| BlockError::Serial(serial.to_string()))?
            .copy_from_slice(serial.as_bytes());
        Ok(Block {
            file,
            sectors,
            id,
            buf: vec![0; CHUNK],
        })
    }

    /// The disk's size in sectors (the config space's `capacity`).
    pub fn sectors(&self) -> u64 {
        self.sectors
    }

    /// Serves one request; the bytes written to its device-writable buffers (the used
    /// element's length): its data and its status byte, or 0 where it had no status byte
    /// or its buffers are not in guest memory.
    fn request(&mut self, mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> u32 {
        let (mut reader, mut data) = match (chain.clone().reader(mem), chain.writer(mem)) {
            (Ok(r), Ok(w)) => (r, w),
            _ => return 0,
        };
        // The status is the last writable byte (§5.2.6); what precedes it is the data.
        let Some(status_at) = data.available_bytes().checked_sub(1) else {
            return 0;
        };
        let Ok(mut status) = data.split_at(status_at) else {
            return 0;
        };
        let code = match reader.read_obj::<RequestHeader>() {
            Ok(h) => self.execute(&h, &mut data),
            Err(_) => VIRTIO_BLK_S_IOERR,
        };
        if status.write_all(&[code as u8]).is_err() {
            return 0;
        }
        u32::try_from(data.bytes_written() + 1).unwrap_or(u32::MAX)
    }

    /// Carries out a request whose header is `h` into its data buffers; its status.
    fn execute(&mut self, h: &RequestHeader, data: &mut virtio_queue::Writer<'_>) -> u32 {
        match u32::from_le(h.type_) {
            VIRTIO_BLK_T_IN => self.read(u64::from_le(h.sector), data),
            VIRTIO_BLK_T_GET_ID => {
                let n = data.available_bytes().min(self.id.len());
                match self.id.get(..n).map(|id| data.write_all(id)) {
                    Some(Ok(())) => VIRTIO_BLK_S_OK,
                    _ => VIRTIO_BLK_S_IOERR,
                }
            }
            // A read-only disk (VIRTIO_BLK_F_RO): a driver that writes anyway gets an error.
            VIRTIO_BLK_T_OUT => VIRTIO_BLK_S_IOERR,
            _ => VIRTIO_BLK_S_UNSUPP,
        }
    }

    /// Reads sectors from `sector` on into all of `data`, which must be whole sectors
    /// within the disk.
    fn read(&mut self, sector: u64, data: &mut virtio_queue::Writer<'_>) -> u32 {
        let len = data.available_bytes() as u64;
        let within = sector
            .checked_add(len / SECTOR)
            .is_some_and(|end| end <= self.sectors);
        if len % SECTOR != 0 || !within {
            return VIRTIO_BLK_S_IOERR;
        }
        // In bounds (checked above: sector + len / SECTOR <= sectors = file size / SECTOR).
        let mut at = sector * SECTOR;
        let mut left = len;
        while left > 0 {
            let n = left.min(CHUNK as u64);
            let Some(buf) = self.buf.get_mut(..n as usize) else {
                return VIRTIO_BLK_S_IOERR;
            };
            if self.file.read_exact_at(buf, at).is_err() || data.write_all(buf).is_err() {
                return VIRTIO_BLK_S_IOERR;
            }
            at += n;
            left -= n;
        }
        VIRTIO_BLK_S_OK
    }

    /// The config space (`struct virtio_blk_config` up to `seg_max`): capacity in sectors,
    /// `size_max` (unused: no VIRTIO_BLK_F_SIZE_MAX) and `seg_max`.
    fn config(&self) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..8].copy_from_slice(&self.sectors.to_le_bytes());
        c[12..].copy_from_slice(&SEG_MAX.to_le_bytes());
        c
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_BLK_F_RO
            | 1 << VIRTIO_BLK_F_SEG_MAX
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let c = self.config();
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset.checked_add(i as u64);
            *b = at.and_then(|a| c.get(a as usize)).copied().unwrap_or(0);
        }
    }

    fn process_queue(&mut self, _index: usize, queue: &mut Queue, mem: &GuestMemoryMmap) -> bool {
        let mut used = false;
        // `pop_descriptor_chain` stops at a corrupt available index (one that claims more
        // entries than the queue holds), so this loop ends with what the guest posted.
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = self.request(mem, chain);
            if queue.add_used(mem, head, len).is_err() {
                // The used ring is not in guest memory (is_valid checked it when the
                // queue went ready; the guest can only have lied about its index).
                break;
            }
            used = true;
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    const HDR: u64 = 0x10_0000;
    const DATA: u64 = 0x20_0000;
    const STATUS: u64 = 0x30_0000;
    const RAM: usize = 0x100_0000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).unwrap()
    }

    /// A disk of `sectors` sectors whose byte i is `i / SECTOR` (each sector filled with
    /// its own number, mod 256).
    fn disk(sectors: u64) -> Block {
        let path = std::env::temp_dir().join(format!(
            "vmm-blk-{}-{}",
            std::process::id(),
            std::thread::current()
                .name()
                .unwrap_or("t")
                .replace(':', "_")
        ));
        let bytes: Vec<u8> = (0..sectors * SECTOR).map(|i| (i / SECTOR) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        let b = Block::open(&path, "hcab-userland").unwrap();
        std::fs::remove_file(&path).unwrap();
        b
    }

    fn header(mem: &GuestMemoryMmap, type_: u32, sector: u64) {
        let h = RequestHeader {
            type_,
            ioprio: 0,
            sector,
        };
        mem.write_obj(h, GuestAddress(HDR)).unwrap();
    }

    /// Posts one chain of `(addr, len, flags)` descriptors (linked in order) and runs the
    /// device on it; the used element's length and the status byte.
    fn run(blk: &mut Block, mem: &GuestMemoryMmap, descs: &[(u64, u32, u32)]) -> (u32, u8) {
        let vq = MockSplitQueue::create(mem, GuestAddress(0x1000), QUEUE_SIZE);
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let next = if i + 1 < descs.len() {
                VRING_DESC_F_NEXT
            } else {
                0
            };
            let d = Descriptor::new(addr, len, (flags | next) as u16, i as u16 + 1);
            vq.desc_table()
                .store(i as u16, RawDescriptor::from(d))
                .unwrap();
        }
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        assert!(blk.process_queue(0, &mut q, mem));
        let used = vq.used().ring().ref_at(0).unwrap().load();
        assert_eq!(vq.used().idx().load(), 1);
        assert_eq!(used.id(), 0);
        (used.len(), mem.read_obj(GuestAddress(STATUS)).unwrap())
    }

    /// header, data (writable), status (writable): the layout Linux uses.
    fn req(data_len: u32) -> Vec<(u64, u32, u32)> {
        vec![
            (HDR, 16, 0),
            (DATA, data_len, VRING_DESC_F_WRITE),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ]
    }

    #[test]
    fn test_read_returns_the_sectors_asked_for_and_ok() {
        let (mem, mut blk) = (mem(), disk(300));
        header(&mem, VIRTIO_BLK_T_IN, 3);
        let len = 200 * SECTOR as u32; // more than one CHUNK
        assert_eq!(
            run(&mut blk, &mem, &req(len)),
            (len + 1, VIRTIO_BLK_S_OK as u8)
        );
        let mut got = vec![0u8; len as usize];
        mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        for (s, sector) in got.chunks(SECTOR as usize).enumerate() {
            assert!(sector.iter().all(|&b| b == (s + 3) as u8), "sector {s}");
        }
    }

    #[test]
    fn test_read_through_split_header_and_scattered_buffers() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 5);
        let descs = [
            (HDR, 7, 0),
            (HDR + 7, 9, 0),
            (DATA, 512, VRING_DESC_F_WRITE),
            (DATA + 0x1000, 512, VRING_DESC_F_WRITE),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ];
        assert_eq!(run(&mut blk, &mem, &descs), (1025, VIRTIO_BLK_S_OK as u8));
        assert_eq!(mem.read_obj::<u8>(GuestAddress(DATA)).unwrap(), 5);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(DATA + 0x11ff)).unwrap(), 6);
    }

    #[test]
    fn test_reads_past_the_end_fail_with_ioerr() {
        let (mem, mut blk) = (mem(), disk(8));
        for sector in [7, 8, 9, u64::MAX, u64::MAX - 1] {
            header(&mem, VIRTIO_BLK_T_IN, sector);
            let (_, status) = run(&mut blk, &mem, &req(1024));
            assert_eq!(status, VIRTIO_BLK_S_IOERR as u8, "sector {sector}");
        }
        header(&mem, VIRTIO_BLK_T_IN, 6);
        assert_eq!(run(&mut blk, &mem, &req(1024)).1, VIRTIO_BLK_S_OK as u8);
    }

    #[test]
    fn test_a_read_of_part_of_a_sector_fails_with_ioerr() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        assert_eq!(
            run(&mut blk, &mem, &req(100)),
            (1, VIRTIO_BLK_S_IOERR as u8)
        );
    }

    #[test]
    fn test_writes_to_the_read_only_disk_fail_and_change_nothing() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_OUT, 0);
        let descs = [
            (HDR, 16, 0),
            (DATA, 512, 0),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ];
        assert_eq!(run(&mut blk, &mem, &descs), (1, VIRTIO_BLK_S_IOERR as u8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        run(&mut blk, &mem, &req(512));
        assert_eq!(mem.read_obj::<u8>(GuestAddress(DATA + 5)).unwrap(), 0);
    }

    #[test]
    fn test_unknown_request_types_are_unsupported() {
        let (mem, mut blk) = (mem(), disk(8));
        for t in [4, 11, 13, 0xdead_beef] {
            header(&mem, t, 0);
            let (_, status) = run(&mut blk, &mem, &req(512));
            assert_eq!(status, VIRTIO_BLK_S_UNSUPP as u8, "type {t}");
        }
    }

    #[test]
    fn test_get_id_gives_the_serial() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_GET_ID, 0);
        assert_eq!(run(&mut blk, &mem, &req(20)), (21, VIRTIO_BLK_S_OK as u8));
        let mut id = [0u8; 20];
        mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id[..13], b"hcab-userland");
        assert!(id[13..].iter().all(|&b| b == 0));
    }

    #[test]
    fn test_a_short_header_fails_with_ioerr() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        let descs = [
            (HDR, 12, 0),
            (DATA, 512, VRING_DESC_F_WRITE),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ];
        assert_eq!(run(&mut blk, &mem, &descs), (1, VIRTIO_BLK_S_IOERR as u8));
    }

    #[test]
    fn test_a_chain_with_no_status_byte_is_returned_untouched() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        assert_eq!(run(&mut blk, &mem, &[(HDR, 16, 0)]), (0, 0xff));
    }

    #[test]
    fn test_buffers_outside_guest_ram_are_returned_untouched() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        let far = RAM as u64 - 256;
        let descs = [
            (HDR, 16, 0),
            (far, 512, VRING_DESC_F_WRITE),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ];
        assert_eq!(run(&mut blk, &mem, &descs), (0, 0xff));
        let descs = [
            (u64::MAX - 8, 16, 0),
            (DATA, 512, VRING_DESC_F_WRITE),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ];
        assert_eq!(run(&mut blk, &mem, &descs), (0, 0xff));
    }

    #[test]
    fn test_a_huge_data_length_is_refused_without_allocating_it() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        // 4 GiB - 512 of "data" that guest RAM does not have: refused before any read.
        let descs = [
            (HDR, 16, 0),
            (0, u32::MAX - 511, VRING_DESC_F_WRITE),
            (STATUS, 1, VRING_DESC_F_WRITE),
        ];
        assert_eq!(run(&mut blk, &mem, &descs), (0, 0xff));
    }

    #[test]
    fn test_a_looping_chain_ends() {
        let (mem, mut blk) = (mem(), disk(8));
        header(&mem, VIRTIO_BLK_T_IN, 0);
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QUEUE_SIZE);
        let flags = (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16;
        let d0 = Descriptor::new(HDR, 16, VRING_DESC_F_NEXT as u16, 1);
        let d1 = Descriptor::new(DATA, 512, flags, 1); // points at itself
        vq.desc_table().store(0, RawDescriptor::from(d0)).unwrap();
        vq.desc_table().store(1, RawDescriptor::from(d1)).unwrap();
        vq.avail().ring().ref_at(0).unwrap().store(0);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        assert!(blk.process_queue(0, &mut q, &mem));
        assert_eq!(vq.used().idx().load(), 1);
    }

    #[test]
    fn test_a_lying_available_index_stops_processing() {
        let (mem, mut blk) = (mem(), disk(8));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QUEUE_SIZE);
        vq.avail().idx().store(QUEUE_SIZE + 5);
        let mut q: Queue = vq.create_queue().unwrap();
        assert!(!blk.process_queue(0, &mut q, &mem));
        assert_eq!(vq.used().idx().load(), 0);
    }

    #[test]
    fn test_config_space_has_capacity_and_seg_max() {
        let blk = disk(8);
        let mut c = [0u8; 8];
        blk.read_config(0, &mut c);
        assert_eq!(u64::from_le_bytes(c), 8);
        let mut s = [0u8; 4];
        blk.read_config(12, &mut s);
        assert_eq!(u32::from_le_bytes(s), SEG_MAX);
        let mut past = [0xaau8; 4];
        blk.read_config(u64::MAX - 1, &mut past);
        assert_eq!(past, [0; 4]);
        assert_ne!(blk.features() & 1 << VIRTIO_BLK_F_RO, 0);
    }

    #[test]
    fn test_a_file_of_part_sectors_or_a_long_serial_is_refused() {
        let path = std::env::temp_dir().join(format!("vmm-blk-odd-{}", std::process::id()));
        std::fs::write(&path, [0u8; 513]).unwrap();
        let r = Block::open(&path, "x");
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(r, Err(BlockError::Size { bytes: 513, .. })));
        let f = File::open("/dev/null").unwrap();
        assert!(matches!(
            Block::new(f, 0, "a serial of more than twenty bytes"),
            Err(BlockError::Serial(_))
        ));
    }
}
