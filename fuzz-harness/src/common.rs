//! What the device targets share: the pair of nodes each run drives, the window the victim
//! (B) opens to the attacker, and the check made after every run.
//!
//! A run's set-up is cheap, so that an hour of fuzzing reaches many inputs: the two guest
//! memories are mapped once per thread and handed back zero-filled to each run (the kernel
//! drops their pages, `MADV_DONTNEED`), and the check after the run reads only the victim's
//! pages that are in memory (`mincore`): a page never touched since is still zero-filled on
//! demand, so it cannot have changed. Everything else (fabric, HCAs, BAR2, queues) is made
//! anew for each run, as before: a run sees the same state whichever inputs ran before it.
//! One pair per thread at a time: a second would share the first one's memory.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::ops::Range;
use std::sync::Arc;

use hca_model::abi::*;
use hca_model::{DeviceMemory, Fabric, Hca};
use hca_test_driver::*;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, VolatileMemory,
};

/// The window's size: eight 512-byte receive buffers at its start, the rest for RDMA.
const WINDOW: u64 = 0x4000;

/// Each node's guest memory, as [`Pair::new`] gives it; all of the victim's is checked.
const GUEST_BYTES: usize = 8 * MIB as usize;

/// The unit `mincore` reports in (huge pages are turned off on the guest memories).
const PAGE: usize = 4096;

thread_local! {
    /// A's and B's guest memory, mapped once per thread.
    static GUESTS: RefCell<Option<[GuestMemoryMmap; 2]>> = const { RefCell::new(None) };
    /// Also read all of the victim's memory after each run on this thread, and check that
    /// every page the check left out (not in memory when the window was opened, nor after
    /// the run) is still zero: all 8 MiB compared, as before the check looked at resident
    /// pages only. The corpus replay sets it, so every input in the corpora checks that
    /// no page changed without being in memory.
    pub static FULL_CHECK: Cell<bool> = const { Cell::new(false) };
}

/// Two regions (so that DMA crosses a region boundary, as with [`Driver::new`]), huge pages
/// off (a DMA write then brings in 4 KiB, not 2 MiB, and `mincore` sees which 4 KiB).
fn guest_memory() -> GuestMemoryMmap {
    let half = GUEST_BYTES / 2;
    let mem =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), half), (GuestAddress(half as u64), half)])
            .expect("guest memory");
    for r in mem.iter() {
        // SAFETY: the range is the region's own anonymous mapping; the advice changes how
        // the kernel backs it, not its contents.
        let rc = unsafe { libc::madvise(r.as_ptr().cast(), r.size(), libc::MADV_NOHUGEPAGE) };
        assert_eq!(rc, 0, "madvise(MADV_NOHUGEPAGE)");
    }
    mem
}

/// This thread's two guest memories, every byte zero (as freshly mapped ones).
fn zeroed_guests() -> [GuestMemoryMmap; 2] {
    GUESTS.with(|g| {
        let guests = g
            .borrow_mut()
            .get_or_insert_with(|| [guest_memory(), guest_memory()])
            .clone();
        for r in guests.iter().flat_map(|m| m.iter()) {
            // SAFETY: the region is a private anonymous mapping that this thread's last run
            // (its devices and drivers dropped) no longer uses; after MADV_DONTNEED its
            // pages read as zero again, which is all this changes.
            let rc = unsafe { libc::madvise(r.as_ptr().cast(), r.size(), libc::MADV_DONTNEED) };
            assert_eq!(rc, 0, "madvise(MADV_DONTNEED)");
        }
        guests
    })
}

/// The guest addresses of `mem`'s pages that are in memory: every page written since the
/// last [`zeroed_guests`] is, unless swapped out (a host with swap might then miss a page,
/// never report a wrong one; the corpus replay's [`FULL_CHECK`] does not depend on this).
fn resident_pages(mem: &GuestMemoryMmap) -> Vec<u64> {
    let mut pages = Vec::new();
    for r in mem.iter() {
        let mut vec = vec![0u8; r.size().div_ceil(PAGE)];
        // SAFETY: the range is the region's own mapping, page-aligned; `vec` has one byte
        // per page of it.
        let rc = unsafe { libc::mincore(r.as_ptr().cast(), r.size(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore");
        let base = r.start_addr().0;
        pages.extend(
            vec.iter()
                .enumerate()
                .filter(|(_, v)| *v & 1 != 0)
                .map(|(i, _)| base + (i * PAGE) as u64),
        );
    }
    pages
}

/// A node as [`Driver::new`] makes one, on `mem`, with a node GUID of its own that does not
/// depend on how many nodes the process made before.
fn node(fabric: &Fabric, mem: GuestMemoryMmap, tag: u64) -> Driver {
    let irq = Arc::new(IrqCount::default());
    let bar2 = DeviceMemory::new().expect("bar2");
    let hca = Hca::new(mem.clone(), bar2, irq.clone(), NODE_GUID_PREFIX | tag);
    hca.attach(fabric);
    let mut d = Driver::with_port(hca, mem);
    d.irq = irq;
    d
}

/// Two nodes on `fabric` with an RC QP each, connected, as
/// `Pair::build(fabric, mtu, ALL_ACCESS, DEFAULT_RTS)` makes them, on this thread's guest
/// memories.
pub fn pair(fabric: Fabric, mtu: u8) -> Pair {
    let [mem_a, mem_b] = zeroed_guests();
    let mut a = node(&fabric, mem_a, 1);
    let mut b = node(&fabric, mem_b, 2);
    let pd_a = a.alloc_pd();
    let pd_b = b.alloc_pd();
    let cq_a = a.create_cq(8);
    let cq_b = b.create_cq(8);
    let qa = a.create_qp(QPT_RC, pd_a, cq_a.cqn, cq_a.cqn);
    let qb = b.create_qp(QPT_RC, pd_b, cq_b.cqn, cq_b.cqn);
    let (la, lb) = (a.lid(), b.lid());
    a.bring_up_rc_tuned(qa.qpn, lb, qb.qpn, ALL_ACCESS, mtu, DEFAULT_RTS);
    b.bring_up_rc_tuned(qb.qpn, la, qa.qpn, ALL_ACCESS, mtu, DEFAULT_RTS);
    let key_a = a.reg_dma_mr(pd_a, ALL_ACCESS);
    let key_b = b.reg_dma_mr(pd_b, ALL_ACCESS);
    Pair {
        fabric,
        a,
        b,
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        qa,
        qb,
        key_a,
        key_b,
    }
}

/// A digest of what a run left: both nodes' guest memory (the pages in memory, with their
/// addresses) and BAR2. Two runs of one input give the same one, whatever ran before.
pub fn fingerprint(p: &Pair) -> u64 {
    let mut h = DefaultHasher::new();
    for d in [&p.a, &p.b] {
        for page in resident_pages(&d.mem) {
            h.write_u64(page);
            h.write(&d.read(page, PAGE));
        }
        let bar2 = d.hca.bar2().region().as_volatile_slice();
        let mut bytes = vec![0u8; bar2.len()];
        bar2.copy_to(&mut bytes[..]);
        h.write(&bytes);
    }
    h.finish()
}

/// All that B opens to A: one MR over the window (B's all-memory DMA MR is deregistered)
/// and eight receives into its first 4 KiB.
pub struct Window {
    pub addr: u64,
    pub key: u32,
    /// The victim's pages in memory when the window was opened, by guest address; every
    /// other page was zero.
    before: BTreeMap<u64, Vec<u8>>,
}

impl Window {
    /// Opens the window on `p.b`; `extra_recvs` posts further receives (into the window's
    /// second 4 KiB) on B's other QPs before the victim's memory is snapshot.
    pub fn open(p: &mut Pair, extra_recvs: impl FnOnce(&mut Pair, u64)) -> Self {
        let addr = p.b.alloc(WINDOW, 4096);
        let key = p.b.reg_mr(p.pd_b, addr, WINDOW, ALL_ACCESS);
        let h = HcaCmdHandle {
            handle: p.key_b,
            rsvd: 0,
        };
        assert_eq!(p.b.cmd(CMD_DEREG_MR, &h).0, CMD_OK);
        for i in 0..8 {
            p.b.post_recv(&mut p.qb, i, &[sge(addr + 512 * i, 512, LOCAL_DMA_LKEY)]);
        }
        extra_recvs(p, addr + 0x2000);
        let before = resident_pages(&p.b.mem)
            .into_iter()
            .map(|page| (page, p.b.read(page, PAGE)))
            .collect();
        Self { addr, key, before }
    }

    /// The victim's memory changed only inside the window and its own CQ ring: each page
    /// in memory now or then is compared with what it held then (zero if it was not in).
    pub fn check(&self, p: &Pair) {
        let win = self.addr as usize..(self.addr + WINDOW) as usize;
        let cq = p.cq_b.ring as usize..(p.cq_b.ring + (32 << p.cq_b.log)) as usize;
        let zero = [0u8; PAGE];
        // Before anything here reads the victim's memory: a read brings a page in too.
        let mut pages = resident_pages(&p.b.mem);
        pages.extend(self.before.keys());
        pages.sort_unstable();
        pages.dedup();
        for &page in &pages {
            let at = page as usize;
            if [&win, &cq]
                .iter()
                .any(|r| r.start <= at && at + PAGE <= r.end)
            {
                continue;
            }
            let then = self.before.get(&page).map_or(&zero[..], |b| &b[..]);
            changed_only_inside(at, then, &p.b.read(page, PAGE), &win, &cq);
        }
        if FULL_CHECK.get() {
            let all = p.b.read(0, GUEST_BYTES);
            for (at, now) in (0u64..).step_by(PAGE).zip(all.chunks(PAGE)) {
                assert!(
                    pages.binary_search(&at).is_ok() || now == zero,
                    "victim page {at:#x} changed and was not in memory"
                );
            }
        }
    }
}

/// `after` (the victim's bytes from guest address `at`) differs from `before` only inside
/// `win` and `cq`: a memcmp first, then the byte that differs.
fn changed_only_inside(
    at: usize,
    before: &[u8],
    after: &[u8],
    win: &Range<usize>,
    cq: &Range<usize>,
) {
    if before == after {
        return;
    }
    for (i, (x, y)) in before.iter().zip(after).enumerate() {
        let i = at + i;
        assert!(
            x == y || win.contains(&i) || cq.contains(&i),
            "victim byte {i:#x} changed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened() -> (Pair, Window) {
        let mut p = pair(Fabric::with_manual_clock(), 3);
        let w = Window::open(&mut p, |_, _| {});
        (p, w)
    }

    #[test]
    fn test_check_passes_writes_inside_the_window() {
        let (p, w) = opened();
        p.b.write(w.addr + 100, &[0xff; 64]);
        w.check(&p);
    }

    #[test]
    #[should_panic(expected = "victim byte 0x600010 changed")]
    fn test_check_sees_a_write_to_an_untouched_page() {
        let (p, w) = opened();
        p.b.write(0x60_0010, &[1]);
        w.check(&p);
    }

    #[test]
    #[should_panic(expected = "changed")]
    fn test_check_sees_a_write_next_to_the_window() {
        let (p, w) = opened();
        p.b.write(w.addr + WINDOW, &[1]);
        w.check(&p);
    }

    #[test]
    #[should_panic(expected = "changed")]
    fn test_check_sees_a_write_to_the_victims_queue() {
        let (p, w) = opened();
        // B's QP ring, written when the pair was made: a page that was in memory then.
        p.b.write(p.qb.rq, &[0xee; 8]);
        w.check(&p);
    }

    #[test]
    fn test_full_check_passes_writes_inside_the_window() {
        FULL_CHECK.set(true);
        let (p, w) = opened();
        p.b.write(w.addr + 0x1000, &[0xff; 4096]);
        w.check(&p);
    }

    #[test]
    #[should_panic(expected = "victim byte 0x500000 changed")]
    fn test_full_check_sees_a_write_to_an_untouched_page() {
        FULL_CHECK.set(true);
        let (p, w) = opened();
        p.b.write(0x50_0000, &[1]);
        w.check(&p);
    }

    #[test]
    fn test_each_run_starts_from_zeroed_guest_memory() {
        let (p, w) = opened();
        p.a.write(0x30_0000, &[7; 16]);
        p.b.write(0x70_0000, &[7; 16]);
        drop((p, w));
        let p = pair(Fabric::with_manual_clock(), 3);
        assert_eq!(p.a.read(0x30_0000, 16), [0; 16]);
        assert_eq!(p.b.read(0x70_0000, 16), [0; 16]);
    }

    #[test]
    fn test_a_pair_made_again_is_the_same() {
        let first = fingerprint(&opened().0);
        let again = fingerprint(&opened().0);
        assert_eq!(first, again);
    }
}
