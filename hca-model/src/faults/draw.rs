//! Decisions drawn from the seed: which event of which stream, and a uniform number for
//! it that does not depend on how traffic interleaves.

use crate::fabric::{LinkDir, LinkId};
use crate::subnet::SwitchLink;

/// Which counter an event advances (its index is the "k-th" a decision depends on).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Stream {
    Link(LinkId),
    SwitchLink(SwitchLink),
    Doorbell(u16),
    Interrupt(u16),
    Wqe(u16, u32),
    Cqe(u16, u32),
}

impl Stream {
    /// Distinct bits per stream for the draws.
    fn key(self) -> u64 {
        let (kind, lid, id) = match self {
            Stream::Link(l) => (u64::from(l.dir == LinkDir::Down), l.lid, 0),
            Stream::Doorbell(lid) => (2, lid, 0),
            Stream::Interrupt(lid) => (3, lid, 0),
            Stream::Wqe(lid, qpn) => (4, lid, qpn),
            Stream::Cqe(lid, cqn) => (5, lid, cqn),
            // (A topology has far fewer than 2^16 links.)
            Stream::SwitchLink(l) => (6 + u64::from(l.forward), l.link as u16, 0),
        };
        kind << 56 | u64::from(lid) << 40 | u64::from(id)
    }
}

/// Which random draw a decision is.
#[derive(Clone, Copy)]
pub(super) enum Draw {
    Corrupt = 1,
    Drop,
    Duplicate,
    Reorder,
    Jitter,
    Lose,
    Late,
}

/// A uniform number in [0, 1) from (seed, stream, event index, draw): splitmix64's
/// finaliser.
pub(super) fn uniform(seed: u64, stream: Stream, n: u64, draw: Draw) -> f64 {
    let mut z = seed
        ^ stream.key().rotate_left(7)
        ^ (draw as u64) << 32
        ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
