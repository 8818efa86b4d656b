//! What the device targets check after every run.

use std::ops::Range;

/// The victim's memory changed only inside `win` (what it opened) and `cq` (its own CQ
/// ring): a memcmp of everything outside them first, then the byte that differs.
pub fn changed_only_inside(before: &[u8], after: &[u8], win: Range<usize>, cq: Range<usize>) {
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
