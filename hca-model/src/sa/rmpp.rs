//! RMPP (IBA 13.6), the SA's side: a GetTable answer longer than one MAD goes as DATA
//! segments of 200 bytes of records each (every segment repeats the MAD and SA headers),
//! paced by the receiver's ACKs as ib_mad's receiver expects (a window of one segment
//! until the first ACK names a bigger one). A duplicate ACK (the receiver lost a
//! segment) sends again from the segment after the one it acknowledges. A transfer ends
//! at the ACK of its last segment, or at a STOP or ABORT.
//!
//! There is no resend timer: a transfer whose segment and ACKs are all lost ends when its
//! receiver times the query out and asks again (ib_umad's clients retry).
//! Bounded: [`MAX_TRANSFERS`] under way; a new one retires the oldest.

use std::collections::VecDeque;

use super::mad::at;
use super::{be32, method, Peer, MAD_SIZE};

pub const MAX_TRANSFERS: usize = 16;

/// RMPPType values.
pub(super) const DATA: u8 = 1;
const ACK: u8 = 2;
const STOP: u8 = 3;
const ABORT: u8 = 4;
/// RMPPFlags.
const ACTIVE: u8 = 1;
const FIRST: u8 = 2;
const LAST: u8 = 4;
/// RRespTime: none given.
const NO_RESP_TIME: u8 = 0x1f;
/// RMPPStatus of an ABORT for a transfer the SA does not take ("unspecified").
const STATUS_UNSPECIFIED: u8 = 127;
/// Where the RMPP header sits, and the bytes of each segment after it that count as
/// payload: the SA header (20) and 200 bytes of records.
const RMPP_AT: usize = 24;
const SA_HEADER: usize = at::SA_DATA - 36;
const SEGMENT_DATA: usize = MAD_SIZE - at::SA_DATA;

/// A MAD's RMPP header, when RMPP is active in it.
pub(super) struct Header {
    pub kind: u8,
    flags: u8,
    seg: u32,
    /// PayloadLength in DATA, NewWindowLast in ACK.
    len_or_window: u32,
}

impl Header {
    pub(super) fn of(mad: &[u8; MAD_SIZE]) -> Option<Self> {
        let flags = mad[RMPP_AT + 2] & 0x7;
        (mad[RMPP_AT] != 0 && flags & ACTIVE != 0).then(|| Header {
            kind: mad[RMPP_AT + 1],
            flags,
            seg: be32(mad, RMPP_AT + 4),
            len_or_window: be32(mad, RMPP_AT + 8),
        })
    }

    /// A whole transfer in one segment.
    pub(super) fn is_single(&self) -> bool {
        self.kind == DATA && self.flags & (FIRST | LAST) == FIRST | LAST && self.seg == 1
    }
}

fn set_header(mad: &mut [u8; MAD_SIZE], kind: u8, flags: u8, status: u8, seg: u32, word: u32) {
    mad[RMPP_AT] = 1;
    mad[RMPP_AT + 1] = kind;
    mad[RMPP_AT + 2] = NO_RESP_TIME << 3 | ACTIVE | flags;
    mad[RMPP_AT + 3] = status;
    mad[RMPP_AT + 4..RMPP_AT + 8].copy_from_slice(&seg.to_be_bytes());
    mad[RMPP_AT + 8..RMPP_AT + 12].copy_from_slice(&word.to_be_bytes());
}

/// The ACK of a one-segment request transfer `mad` (it goes back to the requester's agent,
/// so it carries the response bit).
pub(super) fn ack_of(mad: &[u8; MAD_SIZE]) -> Vec<u8> {
    let mut ack = [0u8; MAD_SIZE];
    ack[..RMPP_AT].copy_from_slice(&mad[..RMPP_AT]);
    ack[3] ^= method::RESP;
    ack[4..6].fill(0);
    set_header(&mut ack, ACK, 0, 0, 1, 1);
    ack.to_vec()
}

/// Turns request `mad` into the ABORT of its transfer.
pub(super) fn abort(mad: &mut [u8; MAD_SIZE]) {
    mad[3] ^= method::RESP;
    set_header(mad, ABORT, 0, STATUS_UNSPECIFIED, 0, 0);
    mad[at::SA_DATA..].fill(0);
}

/// An answer under way to `to`.
#[derive(Debug)]
struct Transfer {
    to: Peer,
    tid: u64,
    segments: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
pub(super) struct Transfers {
    live: VecDeque<Transfer>,
}

impl Transfers {
    /// Starts sending `data` (records) under the MAD and SA headers of `header`: returns
    /// the first segment, which is all a sender may send before the receiver's first ACK.
    pub(super) fn start(&mut self, to: Peer, header: &[u8; MAD_SIZE], data: &[u8]) -> Vec<Vec<u8>> {
        let n = data.len().div_ceil(SEGMENT_DATA).max(1);
        let segments: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let mut m = [0u8; MAD_SIZE];
                m[..at::SA_DATA].copy_from_slice(&header[..at::SA_DATA]);
                let chunk = data.chunks(SEGMENT_DATA).nth(i).unwrap_or_default();
                for (d, c) in m[at::SA_DATA..].iter_mut().zip(chunk) {
                    *d = *c;
                }
                let (first, last) = (i == 0, i + 1 == n);
                // PayloadLength: the whole transfer's in the first segment, the last
                // segment's own in the last (SA header included in each).
                let len = if first {
                    n * SA_HEADER + data.len()
                } else if last {
                    SA_HEADER + chunk.len()
                } else {
                    0
                };
                let flags = if first { FIRST } else { 0 } | if last { LAST } else { 0 };
                set_header(&mut m, DATA, flags, 0, i as u32 + 1, len as u32);
                m.to_vec()
            })
            .collect();
        let first = segments.first().cloned().into_iter().collect();
        let tid = super::be64(header, 8);
        self.live.retain(|t| !(t.to == to && t.tid == tid));
        if n > 1 {
            if self.live.len() >= MAX_TRANSFERS {
                self.live.pop_front();
            }
            self.live.push_back(Transfer { to, tid, segments });
        }
        first
    }

    /// An ACK, STOP or ABORT from `from` for transaction `tid`: the segments to send now.
    pub(super) fn control(&mut self, from: Peer, tid: u64, h: &Header) -> Vec<Vec<u8>> {
        let Some(i) = self.live.iter().position(|t| t.to == from && t.tid == tid) else {
            return Vec::new();
        };
        let total = self.live.get(i).map_or(0, |t| t.segments.len());
        let acked = h.seg as usize;
        match h.kind {
            ACK if acked < total => {
                let end = (h.len_or_window as usize).min(total);
                self.live
                    .get(i)
                    .and_then(|t| t.segments.get(acked..end))
                    .map(<[Vec<u8>]>::to_vec)
                    .unwrap_or_default()
            }
            ACK | STOP | ABORT => {
                self.live.remove(i);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
pub(super) mod wire {
    //! RMPP codes for the tests to build a receiver's ACKs with.
    pub const ACK: u8 = super::ACK;
    pub const STOP: u8 = super::STOP;
    pub const FIRST: u8 = super::FIRST;
    pub const LAST: u8 = super::LAST;
    pub const ACTIVE: u8 = super::ACTIVE;
}
