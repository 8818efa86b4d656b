//! What the device targets share: the window the victim (B) opens to the attacker, and the
//! check made after every run.

use std::ops::Range;

use hca_model::abi::*;
use hca_test_driver::*;

/// The window's size: eight 512-byte receive buffers at its start, the rest for RDMA.
const WINDOW: u64 = 0x4000;

/// How much of the victim's memory is compared before and after.
const VICTIM_BYTES: usize = 8 * MIB as usize;

/// All that B opens to A: one MR over the window (B's all-memory DMA MR is deregistered)
/// and eight receives into its first 4 KiB.
pub struct Window {
    pub addr: u64,
    pub key: u32,
    /// The victim's memory when the window was opened.
    before: Vec<u8>,
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
        let before = p.b.read(0, VICTIM_BYTES);
        Self { addr, key, before }
    }

    /// The victim's memory changed only inside the window and its own CQ ring.
    pub fn check(&self, p: &Pair) {
        let after = p.b.read(0, VICTIM_BYTES);
        let win = self.addr as usize..(self.addr + WINDOW) as usize;
        let cq = p.cq_b.ring as usize..(p.cq_b.ring + (32 << p.cq_b.log)) as usize;
        changed_only_inside(&self.before, &after, win, cq);
    }
}

/// `after` differs from `before` only inside `win` and `cq`: a memcmp of everything outside
/// them first, then the byte that differs.
fn changed_only_inside(before: &[u8], after: &[u8], win: Range<usize>, cq: Range<usize>) {
    let size = before.len();
    let mut cuts = [win.clone(), cq.clone()];
    cuts.sort_by_key(|r| r.start);
    let same = |r: Range<usize>| before[r.clone()] == after[r];
    let outside_same = same(0..cuts[0].start)
        && same(cuts[0].end.min(cuts[1].start)..cuts[1].start)
        && same(cuts[1].end.max(cuts[0].end)..size);
    if !outside_same {
        for (i, (x, y)) in before.iter().zip(after).enumerate() {
            assert!(
                x == y || win.contains(&i) || cq.contains(&i),
                "victim byte {i:#x} changed"
            );
        }
    }
}
