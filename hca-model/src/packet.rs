//! Packets on the fabric, shaped after IB's: LRH (LIDs), BTH (opcode, QPN, PSN, SE) and the
//! extended headers a given opcode carries (RETH, AtomicETH, AETH, ImmDt, DETH). Opcodes use
//! IB's BTH numbering so that a capture (issue 7) can write them unchanged.
//!
//! A packet may stand for a *train*: all the MTU-sized packets of one message, with
//! consecutive PSNs, moving as one queue item (`count > 1`). A link hook always sees single
//! packets (the fabric [`Packet::split`]s a train first); with no hook attached, the receiver
//! places the whole message at once. On a lossless, in-order fabric the two are
//! indistinguishable, except that other traffic does not interleave inside a message.
//!
//! A payload can reference the sender's guest memory rather than own a copy: the receiver then
//! copies straight from one guest to the other. Whoever needs the bytes (a capture hook, a
//! corruption fault) materializes them with [`Payload::make_owned`].

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::dma::{copy_between, DmaFault, DmaSpace};

// RC opcodes (IB BTH, transport 000).
/// SEND, first packet of several.
pub const RC_SEND_FIRST: u8 = 0x00;
/// SEND, a middle packet.
pub const RC_SEND_MIDDLE: u8 = 0x01;
/// SEND, last packet.
pub const RC_SEND_LAST: u8 = 0x02;
/// SEND, last packet, with immediate data.
pub const RC_SEND_LAST_IMM: u8 = 0x03;
/// SEND in one packet.
pub const RC_SEND_ONLY: u8 = 0x04;
/// SEND in one packet, with immediate data.
pub const RC_SEND_ONLY_IMM: u8 = 0x05;
/// RDMA WRITE, first packet (carries the RETH).
pub const RC_WRITE_FIRST: u8 = 0x06;
/// RDMA WRITE, a middle packet.
pub const RC_WRITE_MIDDLE: u8 = 0x07;
/// RDMA WRITE, last packet.
pub const RC_WRITE_LAST: u8 = 0x08;
/// RDMA WRITE, last packet, with immediate data.
pub const RC_WRITE_LAST_IMM: u8 = 0x09;
/// RDMA WRITE in one packet.
pub const RC_WRITE_ONLY: u8 = 0x0a;
/// RDMA WRITE in one packet, with immediate data.
pub const RC_WRITE_ONLY_IMM: u8 = 0x0b;
/// RDMA READ request (RETH: what to read).
pub const RC_READ_REQUEST: u8 = 0x0c;
/// RDMA READ response, first packet.
pub const RC_READ_RESP_FIRST: u8 = 0x0d;
/// RDMA READ response, a middle packet.
pub const RC_READ_RESP_MIDDLE: u8 = 0x0e;
/// RDMA READ response, last packet.
pub const RC_READ_RESP_LAST: u8 = 0x0f;
/// RDMA READ response in one packet.
pub const RC_READ_RESP_ONLY: u8 = 0x10;
/// Acknowledge (AETH: an ACK or a NAK).
pub const RC_ACK: u8 = 0x11;
/// Atomic acknowledge (AETH and AtomicAckETH: the original value).
pub const RC_ATOMIC_ACK: u8 = 0x12;
/// Atomic compare-and-swap request (AtomicETH).
pub const RC_CMP_SWAP: u8 = 0x13;
/// Atomic fetch-and-add request (AtomicETH).
pub const RC_FETCH_ADD: u8 = 0x14;
/// SEND, last packet, with Invalidate (IETH).
pub const RC_SEND_LAST_INV: u8 = 0x16;
/// SEND in one packet, with Invalidate (IETH).
pub const RC_SEND_ONLY_INV: u8 = 0x17;
/// IBTA 1.5: RETH and 8 bytes of data, stored in one access; answered by an ACK.
pub const RC_ATOMIC_WRITE: u8 = 0x1d;
/// UC opcodes (transport 001) are RC's SEND and WRITE opcodes (0x00-0x0b) with this.
pub const UC_TRANSPORT: u8 = 0x20;
// UD opcodes (transport 011).
/// UD SEND (every datagram is one packet).
pub const UD_SEND_ONLY: u8 = 0x64;
/// UD SEND with immediate data.
pub const UD_SEND_ONLY_IMM: u8 = 0x65;

// AETH syndromes.
/// ACK: every request up to the PSN arrived.
pub const AETH_ACK: u8 = 0x00;
/// RNR NAK: no receive was posted; retry after the timer the low bits give.
pub const AETH_RNR_NAK: u8 = 0x20;
/// NAK: PSN sequence error (a packet went missing); resend from the PSN.
pub const AETH_NAK_PSN_SEQ: u8 = 0x60;
/// NAK: invalid request.
pub const AETH_NAK_INV_REQ: u8 = 0x61;
/// NAK: remote access error (bad rkey, range or rights).
pub const AETH_NAK_REM_ACCESS: u8 = 0x62;
/// NAK: remote operational error.
pub const AETH_NAK_REM_OP: u8 = 0x63;

/// PSNs are 24-bit.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// Whether `a` comes at or before `b` in 24-bit PSN order.
pub fn psn_le(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) & PSN_MASK) < (1 << 23)
}

/// `a + n` in 24-bit PSN space.
pub fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Remote address, key and length (RETH), also used for the AtomicETH's address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reth {
    /// The remote virtual address.
    pub va: u64,
    /// The remote MR's key.
    pub rkey: u32,
    /// The length of the DMA (the whole message's, for a WRITE or READ).
    pub len: u32,
}

/// A contiguous guest-physical range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seg {
    /// The guest-physical start.
    pub addr: u64,
    /// The length in bytes.
    pub len: u32,
}

/// A gather or scatter list; almost always one or two pieces, kept inline.
pub type SegList = smallvec::SmallVec<[Seg; 2]>;

/// Cuts `[off, off + n)` out of a gather list.
pub fn sub_segs(segs: &[Seg], off: u64, n: u64) -> SegList {
    SegCursor::default().cut(segs, off, n)
}

/// A place in a gather list, so that cutting it piece after piece in order (a message's
/// packets) costs the pieces' own length, not a walk from the start each time (a message
/// over a repeated-page MR has a record per page).
#[derive(Clone, Copy, Debug, Default)]
pub struct SegCursor {
    /// Byte offset in the list, the record it falls in, and the offset in that record.
    off: u64,
    idx: usize,
    skip: u64,
}

impl SegCursor {
    /// Cuts `[off, off + n)` out of `segs`, from this cursor when `off` is at or past it
    /// (from the start otherwise), and leaves the cursor at `off + n`.
    pub fn cut(&mut self, segs: &[Seg], off: u64, n: u64) -> SegList {
        if off < self.off {
            *self = SegCursor::default();
        }
        // Move to `off`.
        let mut ahead = off - self.off;
        while ahead > 0 {
            let Some(s) = segs.get(self.idx) else {
                break;
            };
            let rest = u64::from(s.len) - self.skip;
            if ahead < rest {
                self.skip += ahead;
                ahead = 0;
            } else {
                ahead -= rest;
                (self.idx, self.skip) = (self.idx + 1, 0);
            }
        }
        self.off = off;
        let mut out = SegList::new();
        let mut left = n;
        while left > 0 {
            let Some(s) = segs.get(self.idx) else {
                break;
            };
            let rest = u64::from(s.len) - self.skip;
            let take = rest.min(left);
            if take > 0 {
                out.push(Seg {
                    addr: s.addr + self.skip,
                    len: take as u32,
                });
            }
            left -= take;
            self.off += take;
            if take == rest {
                (self.idx, self.skip) = (self.idx + 1, 0);
            } else {
                self.skip += take;
            }
        }
        out
    }
}

/// Payloads of at most this many bytes (what fits in the room a payload takes anyway) travel
/// inside the packet, read from the sender's memory when the WR is sent, as an HCA reads a
/// WQE's data when it executes it: no gather list to allocate, share with the
/// retransmission copy and free, and no second guest to copy from at the receiver. For a
/// small SEND that bookkeeping was a large part of the message's cost.
pub const SMALL_PAYLOAD: usize = 15;

/// At most [`SMALL_PAYLOAD`] bytes, by value.
#[derive(Clone, Copy, Default)]
pub struct SmallBytes {
    len: u8,
    bytes: [u8; SMALL_PAYLOAD],
}

impl SmallBytes {
    /// `b` as small bytes, if it is short enough.
    pub fn new(b: &[u8]) -> Option<Self> {
        let mut s = SmallBytes::default();
        s.bytes.get_mut(..b.len())?.copy_from_slice(b);
        s.len = b.len() as u8;
        Some(s)
    }

    /// The bytes of `segs` in `mem`, if they are few enough and all readable.
    pub fn gather(mem: &dyn DmaSpace, segs: &[Seg]) -> Option<Self> {
        let mut s = SmallBytes::default();
        let mut at = 0usize;
        for seg in segs {
            let end = at.checked_add(seg.len as usize)?;
            crate::dma::read(mem, seg.addr, s.bytes.get_mut(at..end)?).ok()?;
            at = end;
        }
        s.len = at as u8;
        Some(s)
    }

    /// The bytes carried.
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or_default()
    }
}

/// Packet data: none, a few bytes carried along, owned bytes, or a gather list in the
/// sender's memory.
#[derive(Clone, Default)]
pub enum Payload {
    /// No payload (an ACK, a READ request, a zero-length message).
    #[default]
    Empty,
    /// A few bytes copied into the packet (inline data, atomics' results).
    Small(SmallBytes),
    /// Bytes the packet owns (a MAD, a datagram copied from a sender).
    Bytes(Vec<u8>),
    /// Shared: the copy a sender keeps for retransmission is the same list.
    Dma(Arc<Gather>),
}

/// Bytes in one guest's memory, as a gather list: what a message's payload is until a
/// receiver copies it.
pub struct Gather {
    /// The memory the bytes are in.
    pub mem: Arc<dyn DmaSpace>,
    /// Where in it, in order.
    pub segs: SegList,
    /// The remote access that reached these bytes (a READ's rkey), when it can be revoked
    /// before they are copied: then they are never copied.
    pub grant: Option<Arc<Grant>>,
}

/// Gather lists of one device's sent messages, kept for reuse once nothing else holds
/// them (the receiver has dropped every copy sent, and the WR completed): a message's DMA
/// payload then costs no allocation and no count on the memory's handle. At most
/// [`GatherPool::MAX`] are kept.
#[derive(Default)]
pub(crate) struct GatherPool(Vec<Arc<Gather>>);

impl GatherPool {
    pub const MAX: usize = 64;

    /// A payload of `segs` in `mem`, reached under `grant`.
    pub fn payload(
        &mut self,
        mem: &Arc<dyn DmaSpace>,
        segs: SegList,
        grant: &Arc<Grant>,
    ) -> Payload {
        // Only unique lists of `mem`'s are kept, so `get_mut` finds it unique.
        if let Some(mut g) = self.0.pop() {
            if let Some(inner) = Arc::get_mut(&mut g) {
                inner.segs = segs;
                // A list reused by the same QP keeps its grant: no count to change.
                if !inner.grant.as_ref().is_some_and(|h| Arc::ptr_eq(h, grant)) {
                    inner.grant = Some(grant.clone());
                }
                return Payload::Dma(g);
            }
        }
        Payload::dma(mem.clone(), segs, Some(grant.clone()))
    }

    /// Keeps `payload`'s gather list if it is one of `mem`'s that nothing else holds, of
    /// records kept inline (a long list's heap goes now, not when the pool's entry is
    /// next taken). Its records stay until then: [`GatherPool::payload`] replaces them.
    /// Uniqueness is read from the counts (two loads) rather than claimed with
    /// `Arc::get_mut` (an atomic read-modify-write): nothing makes a `Weak` of a
    /// `Gather`, and while this holds the only reference no other thread can make one;
    /// `payload` claims it before it writes.
    pub fn recycle(&mut self, mem: &Arc<dyn DmaSpace>, payload: Payload) {
        let Payload::Dma(g) = payload else {
            return;
        };
        let unique = Arc::strong_count(&g) == 1 && Arc::weak_count(&g) == 0;
        if self.0.len() >= Self::MAX || !unique || g.segs.spilled() {
            return;
        }
        if std::ptr::addr_eq(Arc::as_ptr(&g.mem), Arc::as_ptr(mem)) {
            self.0.push(g);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// Permission for remote access through one MR key (or to one QP's send buffers), as it
/// stood when the key was checked. Deregistering, invalidating or re-mapping the MR (or
/// flushing the QP's WRs) revokes it. A copy holds the grant while its bytes move
/// ([`Grant::enter`]), and [`Grant::revoke`] returns only once no copy holds it: so no
/// access touches the memory once the command or work request that ended it has run, even
/// when the copy runs on another port's thread (a READ response, a peer's SEND).
#[derive(Debug, Default)]
pub struct Grant(AtomicU32);

/// [`Grant`]'s state: this bit once revoked, below it the copies under way.
const REVOKED: u32 = 1 << 31;

impl Grant {
    /// Ends the access, then waits for the copies under way to end: each moves one packet
    /// train's piece at most (1 MiB), with no lock taken, so the wait is short.
    pub fn revoke(&self) {
        if self.0.fetch_or(REVOKED, Ordering::AcqRel) & !REVOKED == 0 {
            return;
        }
        while self.0.load(Ordering::Acquire) & !REVOKED != 0 {
            std::thread::yield_now();
        }
    }

    /// Whether the access was revoked (its MR deregistered or invalidated): the bytes must not be copied.
    pub fn is_revoked(&self) -> bool {
        self.0.load(Ordering::Acquire) & REVOKED != 0
    }

    /// Holds the grant for one copy; None once revoked (nothing may be copied).
    pub fn enter(&self) -> Option<GrantHeld<'_>> {
        let mut v = self.0.load(Ordering::Relaxed);
        loop {
            if v & REVOKED != 0 {
                return None;
            }
            match self
                .0
                .compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(GrantHeld(self)),
                Err(now) => v = now,
            }
        }
    }
}

/// A copy under way under a [`Grant`]; dropping it ends the copy.
pub struct GrantHeld<'a>(&'a Grant);

impl Drop for GrantHeld<'_> {
    fn drop(&mut self) {
        // Release: the copy's bytes are moved before a revoker sees it end.
        self.0 .0.fetch_sub(1, Ordering::Release);
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Empty => write!(f, "Empty"),
            Payload::Small(b) => write!(f, "Small({})", b.as_slice().len()),
            Payload::Bytes(b) => write!(f, "Bytes({})", b.len()),
            Payload::Dma(g) => {
                write!(f, "Dma({} segs, {} bytes)", g.segs.len(), self.len())
            }
        }
    }
}

impl Payload {
    /// The bytes of `segs` in `mem`, reached (when remotely) through `grant`.
    pub fn dma(mem: Arc<dyn DmaSpace>, segs: SegList, grant: Option<Arc<Grant>>) -> Payload {
        Payload::Dma(Arc::new(Gather { mem, segs, grant }))
    }

    /// Payload bytes.
    pub fn len(&self) -> u32 {
        match self {
            Payload::Empty => 0,
            Payload::Small(b) => b.len.into(),
            Payload::Bytes(b) => b.len() as u32,
            Payload::Dma(g) => g.segs.iter().map(|s| s.len).sum(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the payload refers to memory whose remote access was revoked.
    pub fn is_revoked(&self) -> bool {
        matches!(self, Payload::Dma(g) if g.grant.as_ref().is_some_and(|g| g.is_revoked()))
    }

    /// Holds the payload's grant, if it has one, for a copy of its bytes; a fault (nothing
    /// may be copied) once it is revoked.
    fn enter(&self) -> Result<Option<GrantHeld<'_>>, DmaFault> {
        match self {
            Payload::Dma(g) => match &g.grant {
                Some(grant) => grant.enter().map(Some).ok_or(DmaFault { addr: 0, len: 0 }),
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// Replaces a memory reference by a copy of the bytes, as a wire would carry them.
    pub fn make_owned(&mut self) -> Result<&mut Vec<u8>, DmaFault> {
        if let Payload::Dma(g) = &*self {
            let held = self.enter()?;
            let mut bytes = vec![0u8; g.segs.iter().map(|s| s.len as usize).sum()];
            let mut rest = bytes.as_mut_slice();
            for s in g.segs.iter() {
                // The buffer is the pieces' total: each piece has its room.
                let (piece, tail) = rest.split_at_mut((s.len as usize).min(rest.len()));
                g.mem.read(s.addr, piece)?;
                rest = tail;
            }
            drop(held);
            *self = Payload::Bytes(bytes);
        }
        match self {
            Payload::Empty => *self = Payload::Bytes(Vec::new()),
            Payload::Small(b) => *self = Payload::Bytes(b.as_slice().to_vec()),
            _ => {}
        }
        match self {
            Payload::Bytes(b) => Ok(b),
            _ => unreachable!("payload was just made owned"),
        }
    }

    /// Bytes `[off, off + n)` of the payload.
    pub fn slice(&self, off: u64, n: u64) -> Payload {
        match self {
            Payload::Empty => Payload::Empty,
            Payload::Small(b) => {
                let (a, e) = (off as usize, (off + n) as usize);
                let piece = b.as_slice().get(a..e).unwrap_or_default();
                SmallBytes::new(piece).map_or(Payload::Empty, Payload::Small)
            }
            Payload::Bytes(b) => {
                let (a, e) = (off as usize, (off + n) as usize);
                Payload::Bytes(b.get(a..e).unwrap_or_default().to_vec())
            }
            Payload::Dma(g) if off == 0 && n == self.len() as u64 => Payload::Dma(g.clone()),
            Payload::Dma(g) => {
                Payload::dma(g.mem.clone(), sub_segs(&g.segs, off, n), g.grant.clone())
            }
        }
    }

    /// Copies the payload into `dst` at the concatenation of `segs` (which must hold at least
    /// `len()` bytes). Revoked bytes are not copied: a fault.
    // Always inline: a small payload's copy is one store behind this match.
    #[inline(always)]
    pub fn scatter(&self, dst: &dyn DmaSpace, segs: &[Seg]) -> Result<(), DmaFault> {
        let _held = self.enter()?;
        match self {
            Payload::Empty => Ok(()),
            Payload::Small(b) => scatter_bytes(b.as_slice(), dst, segs),
            Payload::Bytes(b) => scatter_bytes(b, dst, segs),
            Payload::Dma(g) => merge_copy(g.mem.as_ref(), &g.segs, dst, segs),
        }
    }
}

/// Copies `bytes` into `dst` at the concatenation of `segs`.
fn scatter_bytes(bytes: &[u8], dst: &dyn DmaSpace, segs: &[Seg]) -> Result<(), DmaFault> {
    let mut rest = bytes;
    for s in segs {
        if rest.is_empty() {
            break;
        }
        let (piece, tail) = rest.split_at((s.len as usize).min(rest.len()));
        crate::dma::write(dst, s.addr, piece)?;
        rest = tail;
    }
    Ok(())
}

/// Copies the bytes of gather list `src` into scatter list `dst`, piece by overlapping piece.
fn merge_copy(
    src_mem: &dyn DmaSpace,
    src: &[Seg],
    dst_mem: &dyn DmaSpace,
    dst: &[Seg],
) -> Result<(), DmaFault> {
    let (mut si, mut so, mut di, mut d_off) = (0usize, 0u32, 0usize, 0u32);
    while let (Some(&s), Some(&d)) = (src.get(si), dst.get(di)) {
        let n = (s.len - so).min(d.len - d_off);
        copy_between(
            src_mem,
            s.addr + u64::from(so),
            dst_mem,
            d.addr + u64::from(d_off),
            u64::from(n),
        )?;
        so += n;
        d_off += n;
        if so == s.len {
            si += 1;
            so = 0;
        }
        if d_off == d.len {
            di += 1;
            d_off = 0;
        }
    }
    Ok(())
}

/// The packets of a train, made as they are taken (see [`Packet::packets`]).
pub struct Packets {
    train: Option<Packet>,
    family: Option<Family>,
    /// The train's payload length.
    total: u64,
    next: u32,
    cursor: SegCursor,
}

impl Iterator for Packets {
    type Item = Packet;

    fn next(&mut self) -> Option<Packet> {
        let Some(f) = self.family else {
            // A single packet: itself, once.
            return self.train.take();
        };
        let t = self.train.as_ref()?;
        if self.next >= t.count {
            return None;
        }
        self.next += 1;
        Some(t.cut(f, self.next - 1, 1, self.total, &mut self.cursor))
    }
}

/// A global route header: what a multicast datagram carries (this fabric is one subnet, so
/// unicast packets go without).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grh {
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID (a multicast group's MGID).
    pub dgid: [u8; 16],
}

/// GRH "next header" for an IBA transport header.
pub const GRH_NEXT_HEADER_IBA: u8 = 0x1b;

impl Grh {
    /// The 40 bytes on the wire for a packet whose transport headers, payload and ICRC come
    /// to `pay_len` bytes (traffic class, flow label and hop limit 0).
    pub fn to_bytes(&self, pay_len: u16) -> [u8; 40] {
        let mut b = [0u8; 40];
        b[0] = 6 << 4; // IP version 6
        b[4..6].copy_from_slice(&pay_len.to_be_bytes());
        b[6] = GRH_NEXT_HEADER_IBA;
        b[8..24].copy_from_slice(&self.sgid);
        b[24..40].copy_from_slice(&self.dgid);
        b
    }
}

/// The headers few packets carry, boxed beside the packet: a packet moves by value through
/// the requester, the fabric's queue and the responder, and without them it is half the
/// size (small enough to be moved without a call to memcpy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RareHeaders {
    /// The GRH of a multicast datagram.
    pub grh: Option<Grh>,
    /// AtomicETH: address/key in the packet's `reth`, then swap-or-add and compare.
    pub atomic: Option<(u64, u64)>,
    /// A masked atomic's masks, after its AtomicETH: compare (or the fields' top bits,
    /// for a fetch-and-add) and swap.
    pub atomic_masks: Option<(u64, u64)>,
    /// AtomicAckETH: the original remote value.
    pub atomic_ack: Option<u64>,
}

impl RareHeaders {
    /// As a packet carries them: no box when there are none.
    pub fn boxed(self) -> Option<Box<RareHeaders>> {
        (self != RareHeaders::default()).then(|| Box::new(self))
    }
}

/// One packet. Fields an opcode does not carry are zero/None; its P_Key is the default
/// partition's unless its QP is in another.
#[derive(Debug)]
pub struct Packet {
    /// LRH source LID: the sending port (the fabric sets it).
    pub slid: u16,
    /// LRH destination LID: a port, the SM, or a multicast group.
    pub dlid: u16,
    /// LRH service level.
    pub sl: u8,
    /// BTH opcode (`RC_*`, `UD_*`).
    pub opcode: u8,
    /// BTH P_Key: the partition of the QP that sent it (see `crate::partition`).
    pub pkey: u16,
    /// BTH solicited-event bit.
    pub solicited: bool,
    /// BTH destination QP.
    pub dest_qpn: u32,
    /// The sending QP: DETH's source QP for UD; for RC it is implied by the connection and is
    /// carried only so that the responder can check the packet comes from its peer.
    pub src_qpn: u32,
    /// BTH PSN (of the first packet, for a train).
    pub psn: u32,
    /// RETH: remote address, key and length (RDMA WRITE first and only, READ request, atomics).
    pub reth: Option<Reth>,
    /// AETH: syndrome and MSN.
    pub aeth: Option<(u8, u32)>,
    /// A GRH, AtomicETH or AtomicAckETH, when the packet has one.
    pub rare: Option<Box<RareHeaders>>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH: the rkey a SEND with Invalidate makes the responder invalidate.
    pub ieth: Option<u32>,
    /// DETH Q_Key (UD).
    pub qkey: u32,
    /// The data the packet carries.
    pub payload: Payload,
    /// MTU packets this stands for: 1, or a whole message (a train; see the module docs).
    pub count: u32,
    /// The path MTU a train is cut at.
    pub mtu: u32,
    /// A train that is a piece of a longer message (see [`Packet::chunks`]): the index of
    /// its first packet in the message, and the message's packet count (0: the train ends
    /// the message, `first + count`).
    pub first: u32,
    /// See `first`: the whole message's packet count, or 0.
    pub of: u32,
    /// Bits flipped on the wire: its ICRC would not match, so a receiver drops it.
    pub corrupt: bool,
    /// The BTH's transport is UC: the opcode is RC's SEND or WRITE opcode here, and on the
    /// wire has UC's transport bits (see [`Packet::wire_opcode`]).
    pub uc: bool,
}

impl Clone for Packet {
    /// A packet that owns nothing on the heap (no rare headers; a payload that is empty or
    /// rides in it: nearly every SEND and ACK, and the copy a requester keeps of each) is
    /// copied whole, a few wide moves; any other field by field.
    fn clone(&self) -> Self {
        if self.rare.is_none() && matches!(self.payload, Payload::Empty | Payload::Small(_)) {
            // SAFETY: apart from `rare` and `payload`, every field is plain `Copy` data (the
            // struct update below copies them, so a field that is not fails to compile);
            // `rare` is None and the payload holds no pointer. The copy shares nothing
            // with the original, and dropping both frees nothing twice.
            return unsafe { std::ptr::read(self) };
        }
        Packet {
            rare: self.rare.clone(),
            payload: self.payload.clone(),
            ..*self
        }
    }
}

impl Default for Packet {
    fn default() -> Packet {
        Packet {
            slid: 0,
            dlid: 0,
            sl: 0,
            opcode: 0,
            pkey: crate::partition::DEFAULT_PKEY,
            solicited: false,
            dest_qpn: 0,
            src_qpn: 0,
            psn: 0,
            reth: None,
            aeth: None,
            rare: None,
            imm: None,
            ieth: None,
            qkey: 0,
            payload: Payload::Empty,
            count: 0,
            mtu: 0,
            first: 0,
            of: 0,
            corrupt: false,
            uc: false,
        }
    }
}

// Moved by value on every hop: keep it within what the compiler moves without a call.
const _: () = assert!(std::mem::size_of::<Packet>() <= 128);

impl Packet {
    /// Host bytes the packet holds on the heap beside itself: its own payload bytes, or a
    /// gather list too long to keep inline (a piece of a message over scattered pages),
    /// and its rare headers. What a queued packet costs the host beyond its slot, which the
    /// fabric's backlog bound counts (see `fabric::MAX_BACKLOG`).
    pub fn heap_bytes(&self) -> usize {
        let payload = match &self.payload {
            Payload::Bytes(b) => b.capacity(),
            Payload::Dma(g) if g.segs.spilled() => {
                std::mem::size_of::<Gather>() + g.segs.capacity() * std::mem::size_of::<Seg>()
            }
            _ => 0,
        };
        let rare = self
            .rare
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<RareHeaders>());
        payload + rare
    }
}

/// Messages that span packets, for deriving each packet's opcode.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Send,
    Write,
    ReadResp,
}

fn family(opcode: u8) -> Option<Family> {
    match opcode {
        RC_SEND_FIRST..=RC_SEND_ONLY_IMM | RC_SEND_LAST_INV | RC_SEND_ONLY_INV => {
            Some(Family::Send)
        }
        RC_WRITE_FIRST..=RC_WRITE_ONLY_IMM => Some(Family::Write),
        RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY => Some(Family::ReadResp),
        _ => None,
    }
}

/// The opcode of packet `i` of an `n`-packet message whose last packet carries `tail`.
fn message_opcode(f: Family, i: u32, n: u32, tail: Tail) -> u8 {
    match (tail, base_opcode(f, i, n, tail == Tail::Imm)) {
        (Tail::Inv, RC_SEND_LAST) => RC_SEND_LAST_INV,
        (Tail::Inv, RC_SEND_ONLY) => RC_SEND_ONLY_INV,
        (_, op) => op,
    }
}

/// What a message's last packet carries beyond the payload.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    None,
    Imm,
    Inv,
}

impl Packet {
    /// Octets the packet (each of a train's `count` MTU packets) takes on the wire, as
    /// IBA's PortXmitData and PortRcvData count them: its headers ([`Packet::header_bytes`])
    /// and its payload.
    #[inline]
    pub fn wire_bytes(&self) -> u64 {
        self.header_bytes() + u64::from(self.payload.len())
    }

    /// The header octets of [`Packet::wire_bytes`]: every packet's LRH, BTH, ICRC and VCRC
    /// (and a datagram's DETH, a multicast's GRH), and the extension headers a message
    /// carries once (RETH, AETH, ImmDt, IETH, AtomicETH, AtomicAckETH). (A read response
    /// train's middle packets carry no AETH: it is counted once.) Branch-free but for the
    /// rare headers: every packet sent and received is counted.
    #[inline]
    pub fn header_bytes(&self) -> u64 {
        const LRH_BTH_CRCS: u64 = 8 + 12 + 4 + 2;
        // DETH: UD's two opcodes differ in their low bit.
        let each = LRH_BTH_CRCS + 8 * u64::from(self.opcode & !1 == UD_SEND_ONLY);
        let once = 16 * u64::from(self.reth.is_some())
            + 4 * u64::from(self.aeth.is_some())
            + 4 * u64::from(self.imm.is_some())
            + 4 * u64::from(self.ieth.is_some());
        let n = u64::from(self.count.max(1));
        match &self.rare {
            None => n * each + once,
            Some(r) => {
                // AtomicETH is 28 octets: its address and key are the RETH's 16 above.
                n * (each + 40 * u64::from(r.grh.is_some()))
                    + once
                    + 12 * u64::from(r.atomic.is_some())
                    + 16 * u64::from(r.atomic_masks.is_some())
                    + 8 * u64::from(r.atomic_ack.is_some())
            }
        }
    }

    /// The GRH, if the packet has one (multicast datagrams).
    pub fn grh(&self) -> Option<&Grh> {
        self.rare.as_ref()?.grh.as_ref()
    }

    /// AtomicETH's swap-or-add and compare values, if the packet is an atomic request.
    pub fn atomic(&self) -> Option<(u64, u64)> {
        self.rare.as_ref()?.atomic
    }

    /// AtomicAckETH's original remote value, if the packet is an atomic ACK.
    pub fn atomic_ack(&self) -> Option<u64> {
        self.rare.as_ref()?.atomic_ack
    }

    /// A masked atomic's (compare or boundary mask, swap mask).
    pub fn atomic_masks(&self) -> Option<(u64, u64)> {
        self.rare.as_ref()?.atomic_masks
    }

    /// The rare headers, to set one.
    pub fn rare_mut(&mut self) -> &mut RareHeaders {
        self.rare.get_or_insert_with(Default::default)
    }

    fn tail(&self) -> Tail {
        match (self.imm, self.ieth) {
            (Some(_), _) => Tail::Imm,
            (None, Some(_)) => Tail::Inv,
            _ => Tail::None,
        }
    }
}

fn base_opcode(f: Family, i: u32, n: u32, imm: bool) -> u8 {
    let (first, last) = (i == 0, i + 1 == n);
    match (f, first, last, imm) {
        (Family::Send, true, true, false) => RC_SEND_ONLY,
        (Family::Send, true, true, true) => RC_SEND_ONLY_IMM,
        (Family::Send, true, false, _) => RC_SEND_FIRST,
        (Family::Send, false, false, _) => RC_SEND_MIDDLE,
        (Family::Send, false, true, false) => RC_SEND_LAST,
        (Family::Send, false, true, true) => RC_SEND_LAST_IMM,
        (Family::Write, true, true, false) => RC_WRITE_ONLY,
        (Family::Write, true, true, true) => RC_WRITE_ONLY_IMM,
        (Family::Write, true, false, _) => RC_WRITE_FIRST,
        (Family::Write, false, false, _) => RC_WRITE_MIDDLE,
        (Family::Write, false, true, false) => RC_WRITE_LAST,
        (Family::Write, false, true, true) => RC_WRITE_LAST_IMM,
        (Family::ReadResp, true, true, _) => RC_READ_RESP_ONLY,
        (Family::ReadResp, true, false, _) => RC_READ_RESP_FIRST,
        (Family::ReadResp, false, false, _) => RC_READ_RESP_MIDDLE,
        (Family::ReadResp, false, true, _) => RC_READ_RESP_LAST,
    }
}

impl Packet {
    /// Makes this packet, which carries a message's headers (RETH, ImmDt, SE, AETH), the
    /// whole SEND, RDMA WRITE or read response of `len` bytes cut at `mtu`, as one train;
    /// `kind` is any opcode of the message's family. In place: a packet moved just after it
    /// was written field by field is read back whole before the writes have landed (a
    /// store-forwarding stall, which the requester's SENDs paid).
    pub fn make_message(&mut self, kind: u8, len: u64, mtu: u32) {
        let n = len.div_ceil(u64::from(mtu)).max(1) as u32;
        let Some(f) = family(kind) else {
            // Not an opcode of a multi-packet family (the engine never passes one): a single
            // packet with that opcode.
            self.opcode = kind;
            (self.count, self.mtu, self.first, self.of) = (1, mtu, 0, 1);
            return;
        };
        self.opcode = message_opcode(f, 0, n, self.tail());
        self.count = n;
        self.mtu = mtu;
        (self.first, self.of) = (0, n);
    }

    /// The message's packet count (a whole train's own count, or what a piece says).
    fn message_packets(&self) -> u32 {
        if self.of == 0 {
            self.first + self.count.max(1)
        } else {
            self.of
        }
    }

    /// Packets `[start, start + n)` of this train as a train of their own (a piece of the
    /// message, or one packet: its opcodes, PSNs, headers and payload slice as those packets
    /// have them). `total` is the train's payload length; `cursor` follows the payload's
    /// gather list from piece to piece.
    fn cut(&self, f: Family, start: u32, n: u32, total: u64, cursor: &mut SegCursor) -> Packet {
        let mtu = u64::from(self.mtu);
        let off = u64::from(start) * mtu;
        let len = total.saturating_sub(off).min(u64::from(n) * mtu);
        let payload = match &self.payload {
            // A piece of the list, cut where the last piece ended (the whole list, a train
            // that is one piece, is shared by `slice`).
            Payload::Dma(g) if len < total => Payload::dma(
                g.mem.clone(),
                cursor.cut(&g.segs, off, len),
                g.grant.clone(),
            ),
            p => p.slice(off, len),
        };
        self.piece_of(f, start, n, payload)
    }

    /// Packets `[start, start + n)` of this message (a train that stands for all of it;
    /// its own payload is not looked at) as a piece of their own, carrying `payload`: what
    /// a responder makes of a long READ's answer a piece at a time, resolving each piece's
    /// bytes as it makes it (see answers.rs).
    pub(crate) fn piece(&self, start: u32, n: u32, payload: Payload) -> Packet {
        match family(self.opcode) {
            Some(f) => self.piece_of(f, start, n, payload),
            None => Packet {
                payload,
                ..self.clone_header()
            },
        }
    }

    /// [`Packet::cut`]'s packet, with the payload given.
    fn piece_of(&self, f: Family, start: u32, n: u32, payload: Payload) -> Packet {
        let of = self.message_packets();
        let abs = self.first + start;
        let (has_first, has_last) = (abs == 0, abs + n == of);
        Packet {
            opcode: message_opcode(f, abs, of, self.tail()),
            psn: psn_add(self.psn, start),
            solicited: has_last && self.solicited,
            reth: self.reth.filter(|_| has_first),
            imm: self.imm.filter(|_| has_last),
            ieth: self.ieth.filter(|_| has_last),
            aeth: self.aeth.filter(|_| has_first || has_last),
            payload,
            count: n,
            first: abs,
            of,
            ..self.clone_header()
        }
    }

    /// The train in pieces of at most `max` packets, in order: a long message moves, and is
    /// received, a piece at a time (each piece under its receiver's lock on its own), so one
    /// guest's 2 GiB message never holds the fabric or a peer for its whole length. A single
    /// packet, or a train no longer than `max`, comes back as it is.
    pub fn chunks(self, max: u32) -> Vec<Packet> {
        let max = max.max(1);
        let Some(f) = family(self.opcode).filter(|_| self.count > max) else {
            return vec![self];
        };
        let (total, mut cursor) = (u64::from(self.payload.len()), SegCursor::default());
        (0..self.count.div_ceil(max))
            .map(|k| {
                let start = k * max;
                self.cut(f, start, max.min(self.count - start), total, &mut cursor)
            })
            .collect()
    }

    /// The train without its packets before PSN `psn` (which it must span): what is sent
    /// again after the peer took the first part of a message.
    pub fn from_psn(self, psn: u32) -> Packet {
        let skip = psn.wrapping_sub(self.psn) & PSN_MASK;
        match family(self.opcode) {
            Some(f) if skip > 0 && skip < self.count => {
                let total = u64::from(self.payload.len());
                self.cut(f, skip, self.count - skip, total, &mut SegCursor::default())
            }
            _ => self,
        }
    }

    /// The single packets a train stands for, each with its own opcode, PSN, headers and
    /// payload slice. A single packet comes back as it is.
    pub fn split(self) -> Vec<Packet> {
        self.packets().collect()
    }

    /// Like [`Packet::split`], made one packet at a time as they are taken: a 2 GiB
    /// message at a 256-byte MTU is 8M packets, which a hook sees one by one, never all
    /// at once.
    pub fn packets(self) -> Packets {
        Packets {
            family: family(self.opcode).filter(|_| self.count > 1),
            total: u64::from(self.payload.len()),
            train: Some(self),
            next: 0,
            cursor: SegCursor::default(),
        }
    }

    /// The packet without its payload.
    pub fn clone_header(&self) -> Packet {
        Packet {
            slid: self.slid,
            dlid: self.dlid,
            sl: self.sl,
            opcode: self.opcode,
            pkey: self.pkey,
            solicited: self.solicited,
            dest_qpn: self.dest_qpn,
            src_qpn: self.src_qpn,
            psn: self.psn,
            reth: self.reth,
            aeth: self.aeth,
            rare: self.rare.clone(),
            imm: self.imm,
            ieth: self.ieth,
            qkey: self.qkey,
            payload: Payload::Empty,
            count: self.count,
            mtu: self.mtu,
            first: self.first,
            of: self.of,
            corrupt: self.corrupt,
            uc: self.uc,
        }
    }

    /// Whether this (packet or train) begins a message.
    pub fn starts_message(&self) -> bool {
        matches!(
            self.opcode,
            RC_SEND_FIRST
                | RC_SEND_ONLY
                | RC_SEND_ONLY_IMM
                | RC_SEND_ONLY_INV
                | RC_WRITE_FIRST
                | RC_WRITE_ONLY
                | RC_WRITE_ONLY_IMM
                | RC_READ_RESP_FIRST
                | RC_READ_RESP_ONLY
        )
    }

    /// Whether this (packet or train) ends a message.
    pub fn ends_message(&self) -> bool {
        if self.count > 1 && family(self.opcode).is_some() {
            return self.first + self.count >= self.message_packets();
        }
        !matches!(
            self.opcode,
            RC_SEND_FIRST
                | RC_SEND_MIDDLE
                | RC_WRITE_FIRST
                | RC_WRITE_MIDDLE
                | RC_READ_RESP_FIRST
                | RC_READ_RESP_MIDDLE
        )
    }

    /// PSNs this packet or train occupies.
    pub fn span(&self) -> u32 {
        self.count.max(1)
    }

    /// Whether the packet goes to a multicast group.
    pub fn is_multicast(&self) -> bool {
        (crate::abi::MCAST_LID_FIRST..0xffff).contains(&u32::from(self.dlid))
    }

    /// Whether it is a datagram (a UD SEND).
    pub fn is_ud(&self) -> bool {
        self.opcode == UD_SEND_ONLY || self.opcode == UD_SEND_ONLY_IMM
    }

    /// The BTH opcode byte: a UC packet's is its RC opcode with transport 001.
    pub fn wire_opcode(&self) -> u8 {
        if self.uc {
            UC_TRANSPORT | self.opcode
        } else {
            self.opcode
        }
    }

    /// Whether the packet is a request (to a responder) rather than a response (to a requester).
    pub fn is_request(&self) -> bool {
        self.is_ud() || !matches!(self.opcode, RC_READ_RESP_FIRST..=RC_ATOMIC_ACK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ram() -> Arc<dyn DmaSpace> {
        use vm_memory::{GuestAddress, GuestMemoryMmap};
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        Arc::new(crate::dma::GuestRam::new(m))
    }

    fn segs(addr: u64, len: u32) -> SegList {
        smallvec::smallvec![Seg { addr, len }]
    }

    fn gather(p: &Payload) -> &Arc<Gather> {
        match p {
            Payload::Dma(g) => g,
            other => panic!("not a DMA payload: {other:?}"),
        }
    }

    #[test]
    fn test_a_reused_gather_list_carries_the_grant_of_its_new_payload() {
        let mem = ram();
        let mut pool = GatherPool::default();
        let (rkey, sends): (Arc<Grant>, Arc<Grant>) = (Arc::default(), Arc::default());
        // A read response's list, under an MR's grant, is kept...
        pool.recycle(
            &mem,
            Payload::dma(mem.clone(), segs(0, 8), Some(rkey.clone())),
        );
        assert_eq!(pool.len(), 1);
        // ...and a request made from it answers to the sending QP's grant alone.
        let p = pool.payload(&mem, segs(0x100, 8), &sends);
        assert!(gather(&p)
            .grant
            .as_ref()
            .is_some_and(|g| Arc::ptr_eq(g, &sends)));
        rkey.revoke();
        assert!(!p.is_revoked(), "the MR's grant is not this payload's");
        sends.revoke();
        assert!(p.is_revoked());
    }

    /// A memory whose first `flat` look-up stops until let go, or 300 ms pass: a copy
    /// caught after its grant was checked, before its bytes move.
    struct Stalling {
        ram: Arc<dyn DmaSpace>,
        stalled: std::sync::atomic::AtomicBool,
        entered: std::sync::mpsc::SyncSender<()>,
        go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl DmaSpace for Stalling {
        fn slices(&self, addr: u64, len: u64) -> Result<crate::dma::Slices<'_>, DmaFault> {
            self.ram.slices(addr, len)
        }

        fn flat(&self, addr: u64, len: u64) -> Option<vm_memory::VolatileSlice<'_>> {
            if !self
                .stalled
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                let _ = self.entered.send(());
                let go = self.go.lock().unwrap();
                let _ = go.recv_timeout(std::time::Duration::from_millis(300));
            }
            self.ram.flat(addr, len)
        }
    }

    #[test]
    fn test_no_byte_moves_under_a_grant_once_its_revoke_returns() {
        let ram = ram();
        ram.write(0x100, &[0xab; 64]).unwrap();
        let (entered, inside) = std::sync::mpsc::sync_channel(1);
        let (go, wait) = std::sync::mpsc::channel();
        let src: Arc<dyn DmaSpace> = Arc::new(Stalling {
            ram: ram.clone(),
            stalled: Default::default(),
            entered,
            go: std::sync::Mutex::new(wait),
        });
        let dst = self::ram();
        let grant: Arc<Grant> = Arc::default();
        let payload = Payload::dma(src, segs(0x100, 64), Some(grant.clone()));
        let read_dst = |dst: &Arc<dyn DmaSpace>| {
            let mut b = [0u8; 64];
            dst.read(0x200, &mut b).unwrap();
            b
        };
        std::thread::scope(|s| {
            // Another port's thread copies the payload (a READ response, a peer's SEND)...
            let copier = s.spawn(|| payload.scatter(dst.as_ref(), &segs(0x200, 64)));
            inside.recv().unwrap();
            // ...and its owner revokes the grant (dereg, a flush) while the copy is under
            // way. From revoke's return on, nothing may change in `dst`.
            grant.revoke();
            let at_return = read_dst(&dst);
            let _ = go.send(());
            let copied = copier.join().unwrap();
            assert_eq!(
                read_dst(&dst),
                at_return,
                "bytes moved after the revoke returned (copy: {copied:?})"
            );
        });
        // A copy that starts after the revoke moves nothing.
        let fresh = self::ram();
        assert!(payload.scatter(fresh.as_ref(), &segs(0x200, 64)).is_err());
        assert_eq!(read_dst(&fresh), [0u8; 64]);
    }

    #[test]
    fn test_a_gather_list_is_reused_only_once_nothing_else_holds_it() {
        let (mem, other) = (ram(), ram());
        let mut pool = GatherPool::default();
        let grant = Arc::default();
        let sent = pool.payload(&mem, segs(0x100, 64), &grant);
        let first = Arc::as_ptr(gather(&sent));
        // The copy kept for retransmission is taken back while the receiver still holds
        // the one sent: not kept.
        let kept = sent.clone();
        pool.recycle(&mem, kept);
        assert_eq!(pool.len(), 0);
        // Once the receiver is done, the same allocation carries the next message.
        pool.recycle(&mem, sent);
        assert_eq!(pool.len(), 1);
        let next = pool.payload(&mem, segs(0x200, 32), &grant);
        assert_eq!(Arc::as_ptr(gather(&next)), first);
        assert_eq!(
            gather(&next).segs.as_slice(),
            &[Seg {
                addr: 0x200,
                len: 32
            }]
        );
        assert_eq!(next.len(), 32);
        // Another memory's list is not kept.
        pool.recycle(&mem, Payload::dma(other.clone(), segs(0, 8), None));
        assert_eq!(pool.len(), 0);
        // Nor is a list of records on the heap: that goes now.
        let long: SegList = (0..3)
            .map(|i| Seg {
                addr: i << 12,
                len: 8,
            })
            .collect();
        assert!(long.spilled());
        pool.recycle(&mem, Payload::dma(mem.clone(), long, None));
        assert_eq!(pool.len(), 0);
    }

    #[test]
    fn test_the_gather_pool_is_bounded() {
        let mem = ram();
        let mut pool = GatherPool::default();
        for _ in 0..GatherPool::MAX + 10 {
            pool.recycle(&mem, Payload::dma(mem.clone(), segs(0, 8), None));
        }
        assert_eq!(pool.len(), GatherPool::MAX);
    }

    /// The plain walk from the start that a cursor must agree with.
    fn cut_from_start(segs: &[Seg], off: u64, n: u64) -> Vec<(u64, u32)> {
        let mut bytes: Vec<u64> = Vec::new();
        for s in segs {
            bytes.extend((0..u64::from(s.len)).map(|k| s.addr + k));
        }
        let picked: Vec<u64> = bytes
            .into_iter()
            .skip(off as usize)
            .take(n as usize)
            .collect();
        let mut out: Vec<(u64, u32)> = Vec::new();
        for a in picked {
            match out.last_mut() {
                Some((start, len)) if *start + u64::from(*len) == a => *len += 1,
                _ => out.push((a, 1)),
            }
        }
        out
    }

    fn merged(l: &[Seg]) -> Vec<(u64, u32)> {
        let mut out: Vec<(u64, u32)> = Vec::new();
        for s in l {
            match out.last_mut() {
                Some((start, len)) if *start + u64::from(*len) == s.addr => *len += s.len,
                _ => out.push((s.addr, s.len)),
            }
        }
        out
    }

    #[test]
    fn test_a_cursor_cuts_a_gather_list_as_a_walk_from_the_start_does() {
        let segs: Vec<Seg> = (0..40u64)
            .map(|i| Seg {
                addr: 0x1000 * (i * 7 % 40) + i % 3,
                len: (i % 5 + 1) as u32 * 3,
            })
            .collect();
        let total: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
        let mut x = 0x9e37_79b9u64;
        let mut cursor = SegCursor::default();
        let mut off = 0u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly in order, as packets come; now and then back or past the end.
            let n = x % 23;
            off = match x % 10 {
                0 => x % (total + 5),
                _ if off + n > total => 0,
                _ => off,
            };
            let got = cursor.cut(&segs, off, n);
            assert_eq!(merged(&got), cut_from_start(&segs, off, n), "at {off}+{n}");
            off += n;
        }
    }

    #[test]
    fn test_psn_order_wraps_at_24_bits() {
        assert!(psn_le(5, 5));
        assert!(psn_le(PSN_MASK, 0));
        assert!(!psn_le(0, PSN_MASK));
        assert_eq!(psn_add(PSN_MASK, 2), 1);
    }

    #[test]
    fn test_a_train_splits_into_mtu_packets_with_ib_opcodes() {
        let mut t = Packet {
            psn: PSN_MASK,
            imm: Some(9),
            solicited: true,
            reth: Some(Reth {
                va: 1,
                rkey: 2,
                len: 600,
            }),
            payload: Payload::Bytes((0..600u32).map(|i| i as u8).collect()),
            ..Default::default()
        };
        t.make_message(RC_WRITE_ONLY, 600, 256);
        assert_eq!((t.count, t.opcode), (3, RC_WRITE_FIRST));
        assert!(t.starts_message() && t.ends_message());
        let p = t.split();
        let ops: Vec<u8> = p.iter().map(|p| p.opcode).collect();
        assert_eq!(ops, [RC_WRITE_FIRST, RC_WRITE_MIDDLE, RC_WRITE_LAST_IMM]);
        let psns: Vec<u32> = p.iter().map(|p| p.psn).collect();
        assert_eq!(psns, [PSN_MASK, 0, 1]);
        let lens: Vec<u32> = p.iter().map(|p| p.payload.len()).collect();
        assert_eq!(lens, [256, 256, 88]);
        assert!(p[0].reth.is_some() && p[1].reth.is_none() && p[2].reth.is_none());
        assert_eq!(
            (p[0].imm, p[2].imm, p[0].solicited, p[2].solicited),
            (None, Some(9), false, true)
        );
        assert!(!p[0].ends_message() && !p[1].starts_message() && p[2].ends_message());
        let Payload::Bytes(b) = &p[1].payload else {
            panic!()
        };
        assert_eq!(b[0], 0);
        assert_eq!(b[1], 1);
    }

    /// What a receiver sees of a packet: every header and the payload bytes.
    type Wire = (
        u8,
        u32,
        bool,
        Option<Reth>,
        Option<u32>,
        Option<u32>,
        Vec<u8>,
    );

    fn wire(p: &Packet) -> Wire {
        let mut b = p.payload.clone();
        let bytes = b.make_owned().unwrap().clone();
        (p.opcode, p.psn, p.solicited, p.reth, p.imm, p.ieth, bytes)
    }

    /// A message cut into pieces (or resent from a PSN inside it) splits into exactly the
    /// packets the whole train does, whatever the piece size, for every message kind.
    #[test]
    fn test_pieces_of_a_train_are_the_trains_own_packets() {
        let payload: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
        for (kind, imm, ieth, reth) in [
            (RC_SEND_ONLY, None, None, false),
            (RC_SEND_ONLY, Some(5), None, false),
            (RC_SEND_ONLY, None, Some(0x77), false),
            (RC_WRITE_ONLY, Some(6), None, true),
            (RC_READ_RESP_ONLY, None, None, false),
        ] {
            let mut t = Packet {
                psn: PSN_MASK - 3,
                imm,
                ieth,
                solicited: true,
                aeth: (kind == RC_READ_RESP_ONLY).then_some((AETH_ACK, 0)),
                reth: reth.then_some(Reth {
                    va: 1,
                    rkey: 2,
                    len: 2500,
                }),
                payload: Payload::Bytes(payload.clone()),
                ..Default::default()
            };
            t.make_message(kind, 2500, 256);
            let want: Vec<_> = t.clone().split().iter().map(wire).collect();
            assert_eq!(want.len(), 10);
            for max in [1, 3, 4, 9, 10, 64] {
                let pieces = t.clone().chunks(max);
                assert_eq!(pieces.len(), 10usize.div_ceil(max as usize));
                let ends: Vec<bool> = pieces.iter().map(|p| p.ends_message()).collect();
                assert!(ends[..ends.len() - 1].iter().all(|e| !e) && ends[ends.len() - 1]);
                assert!(pieces[0].starts_message());
                assert!(pieces[1..].iter().all(|p| !p.starts_message()));
                let got: Vec<_> = pieces
                    .into_iter()
                    .flat_map(|p| p.split())
                    .map(|p| wire(&p))
                    .collect();
                assert_eq!(got, want, "kind {kind:#x} in pieces of {max}");
            }
            for skip in [0u32, 1, 4, 9] {
                let rest = t.clone().from_psn(psn_add(t.psn, skip));
                assert_eq!(rest.span(), 10 - skip);
                assert!(rest.ends_message());
                let got: Vec<_> = rest.split().iter().map(wire).collect();
                assert_eq!(got, want[skip as usize..], "kind {kind:#x} from {skip}");
            }
        }
    }

    /// A packet is cloned whole when it owns nothing on the heap, else field by field: either
    /// way the clone is the packet, and one that shares a gather list counts as a holder.
    #[test]
    fn test_a_clone_is_the_packet_whether_it_owns_heap_memory_or_not() {
        let plain = Packet {
            opcode: RC_SEND_ONLY,
            dlid: 2,
            psn: 0x123456,
            imm: Some(7),
            payload: Payload::Small(SmallBytes::new(b"8 bytes!").unwrap()),
            ..Default::default()
        };
        let c = plain.clone();
        assert_eq!(format!("{c:?}"), format!("{plain:?}"));
        let g = Arc::new(Gather {
            mem: ram(),
            segs: segs(0x100, 64),
            grant: None,
        });
        let owning = Packet {
            opcode: RC_CMP_SWAP,
            rare: RareHeaders {
                atomic: Some((1, 2)),
                ..Default::default()
            }
            .boxed(),
            payload: Payload::Dma(g.clone()),
            ..Default::default()
        };
        let c = owning.clone();
        assert_eq!(format!("{c:?}"), format!("{owning:?}"));
        assert_eq!(Arc::strong_count(&g), 3, "the clone holds the list too");
        drop((c, owning));
        assert_eq!(Arc::strong_count(&g), 1);
    }

    #[test]
    fn test_requests_and_responses_are_told_apart() {
        let mut p = Packet {
            opcode: RC_SEND_ONLY,
            ..Default::default()
        };
        assert!(p.is_request());
        p.opcode = RC_ACK;
        assert!(!p.is_request());
        p.opcode = RC_CMP_SWAP;
        assert!(p.is_request());
        p.opcode = UD_SEND_ONLY;
        assert!(p.is_request());
    }
}
