//! Protection domains, memory regions, and key checks.
//!
//! A key is `(mr_index << 8) | tag`; lkey and rkey are the same value. The tag changes on
//! every registration of a slot, so a deregistered key stops matching. A memory window is a
//! slot of the same table: its key reaches, for remote access only, the range of an MR it
//! was bound to (WR_BIND_MW), with the rights the binding gave, while the binding lasts. An MR's page list is
//! copied into the device at registration and every page validated then, so a translation
//! can never leave guest memory and the guest cannot change it afterwards.

use crate::abi::*;
use crate::dma::{read_obj, DmaFault};
use crate::hca::Device;
use crate::status::{CmdError, WcError};
use std::sync::Arc;

use crate::packet::{Grant, Seg, SegList};

/// Why a WQE's SGE list could not be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SgeFault {
    /// An SGE lies outside guest memory.
    Read,
    /// An SGE's lkey does not grant the access to its range.
    Key,
}

impl From<SgeFault> for WcError {
    /// IB's local errors: a list the WQE cannot describe is a QP operation error, a key
    /// that does not cover its range a protection error.
    fn from(f: SgeFault) -> Self {
        match f {
            SgeFault::Read => WcError::LocQpOp,
            SgeFault::Key => WcError::LocProt,
        }
    }
}

/// A WQE's header `H` with the SGE after it, read in one access of guest memory where the
/// WQE's slot holds both (the usual one-SGE WQE is then read whole): one look-up and copy,
/// not two. The SGE means nothing when the header says there is none.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct WithSge<H> {
    pub hdr: H,
    pub sge: HcaSge,
}

const _: () = assert!(std::mem::size_of::<WithSge<HcaSendWqe>>() == 64 + 16);
const _: () = assert!(std::mem::size_of::<WithSge<HcaRecvWqe>>() == 16 + 16);
// SAFETY: two ABI byte images, each a multiple of 8 bytes and aligned to at most 8, laid
// out back to back (sizes asserted above): no padding, every bit pattern valid.
unsafe impl vm_memory::ByteValued for WithSge<HcaSendWqe> {}
// SAFETY: as above.
unsafe impl vm_memory::ByteValued for WithSge<HcaRecvWqe> {}

/// A protection domain; counts the MRs and QPs that name it.
#[derive(Default)]
pub(crate) struct Pd {
    pub users: u32,
    /// A user process's PD (`PD_FLAG_USER`): no LOCAL_DMA_LKEY, no physical or
    /// fast-registration MR.
    pub user: bool,
}

pub(crate) enum Translation {
    /// iova is the guest-physical address.
    Phys,
    /// Pages of `1 << shift` bytes; `fbo` is the iova's offset inside the first page.
    Pages {
        shift: u32,
        fbo: u64,
        pages: Box<[u64]>,
    },
}

pub(crate) struct Mr {
    pub pdn: u32,
    pub access: u32,
    pub iova: u64,
    pub length: u64,
    pub xlat: Translation,
    /// Pages charged to the device-wide budget (a fast-registration MR: its capacity).
    pub budget: u64,
    /// A fast-registration MR's capacity in pages; 0 for ordinary MRs.
    pub fast_reg_pages: u32,
    /// Remote access under the current mapping; revoked when the MR goes or changes.
    pub grant: Arc<Grant>,
    /// When this slot is a memory window: what it is bound to. `access`, `iova` and
    /// `length` are then the binding's rights and range (none while unbound).
    pub window: Option<Window>,
    /// Windows bound to this MR: while any is, it cannot be deregistered, invalidated or
    /// mapped again (a window's access goes through this MR's translation).
    pub windows: u32,
}

/// A memory window's type and binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub mw_type: u32,
    /// The MR index it is bound to, while bound.
    pub mr: Option<u32>,
    /// Type 2: the QP that bound it, which alone takes remote access through it.
    pub qpn: u32,
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.grant.revoke();
    }
}

/// What a key is about to be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    LocalRead,
    LocalWrite,
    RemoteRead,
    RemoteWrite,
    RemoteAtomic,
}

impl Use {
    fn is_remote(self) -> bool {
        !matches!(self, Use::LocalRead | Use::LocalWrite)
    }

    fn needed(self) -> u32 {
        match self {
            Use::LocalRead => 0,
            Use::LocalWrite => ACCESS_LOCAL_WRITE,
            Use::RemoteRead => ACCESS_REMOTE_READ,
            Use::RemoteWrite => ACCESS_REMOTE_WRITE,
            Use::RemoteAtomic => ACCESS_REMOTE_ATOMIC,
        }
    }
}

/// Who uses a key, and for what.
#[derive(Clone, Copy)]
pub(crate) struct KeyCheck {
    /// The PD of the QP using the key.
    pub pdn: u32,
    pub use_: Use,
    /// The QP's own remote-access flags (checked for remote uses only).
    pub qp_access: u32,
    /// The QP a remote access arrived at (a type 2 window answers only the QP it is
    /// bound to).
    pub qpn: u32,
}

impl KeyCheck {
    pub fn local(pdn: u32, use_: Use) -> Self {
        Self {
            pdn,
            use_,
            qp_access: 0,
            qpn: 0,
        }
    }

    pub fn remote(qpn: u32, pdn: u32, use_: Use, qp_access: u32) -> Self {
        Self {
            pdn,
            use_,
            qp_access,
            qpn,
        }
    }
}

/// A key check failed: the caller turns it into the right completion status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyViolation;

impl Mr {
    /// Appends the guest-physical pieces of `[va, va + len)` to `out`.
    fn translate(&self, va: u64, len: u64, out: &mut SegList) {
        let off = va - self.iova;
        match &self.xlat {
            Translation::Phys => push_seg(out, va, len),
            Translation::Pages { shift, fbo, pages } => {
                let psize = 1u64 << shift;
                let mut pos = fbo + off;
                let end = pos + len;
                while pos < end {
                    let in_page = pos & (psize - 1);
                    let n = (psize - in_page).min(end - pos);
                    // Registration checked that the pages cover the MR: never short.
                    let Some(&page) = pages.get((pos >> shift) as usize) else {
                        return;
                    };
                    push_seg(out, page + in_page, n);
                    pos += n;
                }
            }
        }
    }
}

/// Appends a range, merging with the previous one when contiguous; pieces stay below 4 GiB.
// Always inline: LTO kept it out of line, a call per SGE for a push.
#[inline(always)]
fn push_seg(out: &mut SegList, addr: u64, len: u64) {
    // The usual range: the first piece of a list, and short (an empty one adds nothing).
    if out.is_empty() && (1..=1 << 31).contains(&len) {
        out.push(Seg {
            addr,
            len: len as u32,
        });
        return;
    }
    push_seg_after(out, addr, len);
}

#[inline(never)]
fn push_seg_after(out: &mut SegList, addr: u64, len: u64) {
    if let Some(last) = out.last_mut() {
        if last.addr + u64::from(last.len) == addr
            && u64::from(last.len) + len <= u64::from(u32::MAX)
        {
            last.len += len as u32;
            return;
        }
    }
    let mut addr = addr;
    let mut left = len;
    while left > 0 {
        let n = left.min(1 << 31);
        out.push(Seg {
            addr,
            len: n as u32,
        });
        addr += n;
        left -= n;
    }
}

/// Access bits IB allows together: known bits only, and remote write or atomic only with
/// local write.
fn access_ok(access: u32) -> bool {
    let remote_needs_local = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC;
    access & !0x1f == 0 && (access & remote_needs_local == 0 || access & ACCESS_LOCAL_WRITE != 0)
}

/// The rights a window grants: remote ones only (a bind may name local write as well, as
/// verbs consumers do; it means nothing for a window).
const WINDOW_RIGHTS: u32 = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;

impl Device {
    /// Resolves `[va, va + len)` under `key` for `how`, appending the guest-physical pieces
    /// to `out`.
    // Always inline: run for every SGE and rkey, and short on its usual path.
    #[inline(always)]
    pub(crate) fn resolve_key(
        &self,
        key: u32,
        va: u64,
        len: u64,
        how: &KeyCheck,
        out: &mut SegList,
    ) -> Result<(), KeyViolation> {
        self.resolve_key_upto(key, va, len, how, out, len)
    }

    /// Checks `[va, va + len)` under `key` for `how` as [`Device::resolve_key`] does, and
    /// appends the guest-physical pieces of its first `upto` bytes only (`upto <= len`):
    /// where only part of a long range is needed now, its list is not made whole (a range
    /// over one page repeated is a record per page: 8 MiB for 2 GiB).
    // Always inline: `resolve_key`'s body, with `upto` its `len` there.
    #[inline(always)]
    pub(crate) fn resolve_key_upto(
        &self,
        key: u32,
        va: u64,
        len: u64,
        how: &KeyCheck,
        out: &mut SegList,
        upto: u64,
    ) -> Result<(), KeyViolation> {
        let upto = upto.min(len);
        let (pdn, use_) = (how.pdn, how.use_);
        if use_.is_remote() && how.qp_access & use_.needed() == 0 {
            return Err(KeyViolation);
        }
        // IBA C9-88: a zero-length RDMA WRITE or READ carries no R_Key or VA to check (and
        // touches no memory); consumers such as ib_srpt post them with key 0.
        if use_.is_remote() && len == 0 {
            return Ok(());
        }
        let end = va.checked_add(len).ok_or(KeyViolation)?;
        if key == LOCAL_DMA_LKEY && !use_.is_remote() && !self.pd_is_user(pdn) {
            if !crate::dma::check(self.mem.as_ref(), va, len) {
                return Err(KeyViolation);
            }
            push_seg(out, va, upto);
            return Ok(());
        }
        let idx = key >> 8;
        let mr = self.mrs.get(idx).ok_or(KeyViolation)?;
        let tag_ok = self.mr_tags.get(idx as usize) == Some(&((key & 0xff) as u8));
        let in_bounds = va >= mr.iova && end <= mr.iova.saturating_add(mr.length);
        let allowed = mr.access & use_.needed() == use_.needed();
        if !tag_ok || mr.pdn != pdn || !in_bounds || !allowed {
            return Err(KeyViolation);
        }
        if len == 0 {
            return Ok(());
        }
        if let Some(w) = mr.window {
            return self.through_window(w, va, len, how, out, upto);
        }
        self.pieces(mr, va, len, out, upto)
    }

    /// Appends the guest-physical pieces of the first `upto` bytes of `[va, va + len)`,
    /// which lies inside `mr`.
    // Always inline: on every key's path.
    #[inline(always)]
    fn pieces(
        &self,
        mr: &Mr,
        va: u64,
        len: u64,
        out: &mut SegList,
        upto: u64,
    ) -> Result<(), KeyViolation> {
        match mr.xlat {
            Translation::Phys if !crate::dma::check(self.mem.as_ref(), va, len) => {
                return Err(KeyViolation)
            }
            Translation::Phys => push_seg(out, va, upto),
            Translation::Pages { .. } => mr.translate(va, upto, out),
        }
        Ok(())
    }

    /// The pieces of `[va, va + len)` through window `w`, whose own range and rights the
    /// caller has checked: remote use only, by its QP if it is of type 2, through the MR it
    /// is bound to (which cannot change or go while it is bound).
    #[cold]
    fn through_window(
        &self,
        w: Window,
        va: u64,
        len: u64,
        how: &KeyCheck,
        out: &mut SegList,
        upto: u64,
    ) -> Result<(), KeyViolation> {
        if !how.use_.is_remote() || (w.mw_type == MW_TYPE_2 && w.qpn != how.qpn) {
            return Err(KeyViolation);
        }
        let under = self
            .mrs
            .get(w.mr.ok_or(KeyViolation)?)
            .ok_or(KeyViolation)?;
        self.pieces(under, va, len, out, upto)
    }

    /// The header of the WQE at `addr` in a slot of `stride` bytes, and the SGE after it
    /// when the slot has room for one (read together: see [`WithSge`]).
    pub(crate) fn read_wqe_head<H>(
        &self,
        addr: u64,
        stride: u32,
    ) -> Result<(H, Option<HcaSge>), DmaFault>
    where
        H: vm_memory::ByteValued + Default,
        WithSge<H>: vm_memory::ByteValued,
    {
        if stride as usize >= std::mem::size_of::<WithSge<H>>() {
            let w = read_obj::<WithSge<H>>(self.mem.as_ref(), addr)?;
            return Ok((w.hdr, Some(w.sge)));
        }
        Ok((read_obj::<H>(self.mem.as_ref(), addr)?, None))
    }

    /// Reads the `n` SGEs of a WQE at `addr` (the first already read if `first`, with its
    /// WQE's header: see [`WithSge`]) and resolves each in PD `pdn` for `use_` as it is
    /// read, appending the guest-physical pieces to `out`; returns the total length.
    /// Every SGE is read before an SGE's key can fail the WQE, so that a list that leaves
    /// guest memory is always [`SgeFault::Read`], whatever its keys. Every SGE is checked,
    /// but only the first `upto` bytes of the list are resolved (`u64::MAX`: all).
    // Always inline: every send and receive WQE's SGEs, usually one, resolved in its caller.
    #[inline(always)]
    pub(crate) fn gather_sges(
        &self,
        addr: u64,
        n: u32,
        first: Option<HcaSge>,
        (pdn, use_): (u32, Use),
        out: &mut SegList,
        upto: u64,
    ) -> Result<u64, SgeFault> {
        let how = KeyCheck::local(pdn, use_);
        // The usual WQE: one SGE, read with its header.
        if let (1, Some(sge)) = (n, first) {
            let len = u64::from(sge.length);
            return match self.resolve_key_upto(sge.lkey, sge.addr, len, &how, out, upto) {
                Ok(()) => Ok(len),
                Err(KeyViolation) => Err(SgeFault::Key),
            };
        }
        let (mut total, mut bad_key) = (0u64, false);
        for i in 0..u64::from(n) {
            let sge = match first.filter(|_| i == 0) {
                Some(sge) => sge,
                None => read_obj::<HcaSge>(self.mem.as_ref(), addr + 16 * i)
                    .map_err(|_| SgeFault::Read)?,
            };
            if bad_key {
                continue;
            }
            let len = u64::from(sge.length);
            let here = upto.saturating_sub(total);
            bad_key = self
                .resolve_key_upto(sge.lkey, sge.addr, len, &how, out, here)
                .is_err();
            total += len;
        }
        if bad_key {
            return Err(SgeFault::Key);
        }
        Ok(total)
    }

    pub(crate) fn cmd_alloc_pd(&mut self, a: &HcaCmdAllocPd) -> Result<u32, CmdError> {
        if a.flags & !PD_FLAG_USER != 0 {
            return Err(CmdError::BadParam);
        }
        let pd = Pd {
            users: 0,
            user: a.flags & PD_FLAG_USER != 0,
        };
        self.pds.alloc(pd).ok_or(CmdError::NoResources)
    }

    fn pd_is_user(&self, pdn: u32) -> bool {
        self.pds.get(pdn).is_some_and(|pd| pd.user)
    }

    pub(crate) fn cmd_dealloc_pd(&mut self, pdn: u32) -> Result<(), CmdError> {
        match self.pds.get(pdn) {
            None => Err(CmdError::BadHandle),
            Some(pd) if pd.users > 0 => Err(CmdError::Busy),
            Some(_) => {
                self.pds.remove(pdn);
                Ok(())
            }
        }
    }

    pub(crate) fn cmd_reg_mr(&mut self, a: &HcaCmdRegMr) -> Result<u32, CmdError> {
        let Some(pd) = self.pds.get(a.pdn) else {
            return Err(CmdError::BadHandle);
        };
        let kind = a.flags & (MR_FLAG_PHYS | MR_FLAG_FAST_REG);
        if !access_ok(a.access)
            || a.flags & !kind != 0
            || kind == MR_FLAG_PHYS | MR_FLAG_FAST_REG
            || (pd.user && kind != 0)
        {
            return Err(CmdError::BadParam);
        }
        let mut mr = Mr {
            pdn: a.pdn,
            access: a.access,
            iova: a.iova,
            length: a.length,
            xlat: Translation::Phys,
            budget: 0,
            fast_reg_pages: 0,
            grant: Arc::default(),
            window: None,
            windows: 0,
        };
        if kind == MR_FLAG_FAST_REG {
            if a.npages == 0 || a.npages > MAX_MR_PAGES {
                return Err(CmdError::BadParam);
            }
            // Nothing mapped yet: no range, no rights, until a WR_REG_MR.
            (mr.access, mr.iova, mr.length) = (0, 0, 0);
            mr.budget = u64::from(a.npages);
            mr.fast_reg_pages = a.npages;
        } else if kind == 0 {
            mr.xlat = self.read_pages(a.iova, a.length, a.page_list, a.npages, a.page_shift)?;
            mr.budget = u64::from(a.npages);
        }
        if self.mr_pages + mr.budget > u64::from(MAX_TOTAL_MR_PAGES) {
            return Err(CmdError::NoResources);
        }
        let budget = mr.budget;
        let idx = self.mrs.alloc(mr).ok_or(CmdError::NoResources)?;
        self.mr_pages += budget;
        self.take_key(idx, a.pdn)
    }

    /// The key of slot `idx`, just filled with a PD `pdn`'s MR or window: a new tag.
    fn take_key(&mut self, idx: u32, pdn: u32) -> Result<u32, CmdError> {
        if let Some(pd) = self.pds.get_mut(pdn) {
            pd.users += 1;
        }
        // Tags run 2..=255: 0 never, and 1 only for LOCAL_DMA_LKEY's slot 0.
        let tag = self
            .mr_tags
            .get_mut(idx as usize)
            .ok_or(CmdError::NoResources)?;
        *tag = if *tag == 255 { 2 } else { *tag + 1 };
        Ok((idx << 8) | u32::from(*tag))
    }

    /// ALLOC_MW: an unbound window of type 1 or 2 in PD `pdn`; its key.
    pub(crate) fn cmd_alloc_mw(&mut self, a: &HcaCmdAllocMw) -> Result<u32, CmdError> {
        if self.pds.get(a.pdn).is_none() {
            return Err(CmdError::BadHandle);
        }
        if !matches!(a.mw_type, MW_TYPE_1 | MW_TYPE_2) {
            return Err(CmdError::BadParam);
        }
        let mw = Mr {
            pdn: a.pdn,
            access: 0,
            iova: 0,
            length: 0,
            xlat: Translation::Phys,
            budget: 0,
            fast_reg_pages: 0,
            grant: Arc::default(),
            window: Some(Window {
                mw_type: a.mw_type,
                mr: None,
                qpn: 0,
            }),
            windows: 0,
        };
        let idx = self.mrs.alloc(mw).ok_or(CmdError::NoResources)?;
        self.take_key(idx, a.pdn)
    }

    /// DEALLOC_MW: the window whose key (any it had: its index names it) is `key` goes, and
    /// with it every access through it.
    pub(crate) fn cmd_dealloc_mw(&mut self, key: u32) -> Result<(), CmdError> {
        let idx = key >> 8;
        if self.mrs.get(idx).is_none_or(|m| m.window.is_none()) {
            return Err(CmdError::BadHandle);
        }
        self.unbind_window(idx);
        let mw = self.mrs.remove(idx).ok_or(CmdError::BadHandle)?;
        if let Some(pd) = self.pds.get_mut(mw.pdn) {
            pd.users -= 1;
        }
        Ok(())
    }

    /// WR_BIND_MW on QP `qpn` of PD `pdn`: binds window `w.mw_key >> 8` as the WQE says
    /// (see `HcaBindMwWqe`). Errors are completion statuses.
    pub(crate) fn bind_window(
        &mut self,
        qpn: u32,
        pdn: u32,
        w: &HcaBindMwWqe,
    ) -> Result<(), WcError> {
        let idx = w.mw_key >> 8;
        let kind = match self.mrs.get(idx) {
            Some(m) if m.pdn == pdn => m.window.ok_or(WcError::MwBind)?,
            _ => return Err(WcError::MwBind),
        };
        // Bound anew: a type 2 window must be unbound first (LOCAL_INV), a type 1 is
        // rebound at will.
        let fresh = w.new_key >> 8 == idx && w.new_key > LOCAL_DMA_LKEY;
        if !fresh
            || w.access & !(WINDOW_RIGHTS | ACCESS_LOCAL_WRITE) != 0
            || (kind.mw_type == MW_TYPE_2 && kind.mr.is_some())
        {
            return Err(WcError::MwBind);
        }
        let target = if w.length == 0 {
            None
        } else {
            Some(self.window_target(pdn, w)?)
        };
        self.unbind_window(idx);
        if let Some(m) = target.and_then(|t| self.mrs.get_mut(t)) {
            m.windows += 1;
        }
        let mw = self.mrs.get_mut(idx).ok_or(WcError::MwBind)?;
        (mw.access, mw.iova, mw.length) = (w.access & WINDOW_RIGHTS, w.addr, w.length);
        mw.window = Some(Window {
            mw_type: kind.mw_type,
            mr: target,
            qpn,
        });
        if let Some(t) = self.mr_tags.get_mut(idx as usize) {
            *t = (w.new_key & 0xff) as u8;
        }
        Ok(())
    }

    /// The MR a bind names, if it lets the window reach `[w.addr, w.addr + w.length)` with
    /// `w.access`: an MR (not a window) of PD `pdn` under its current key, that allows
    /// MW_BIND, covers the range, and allows local write where the window grants remote
    /// write or atomics (as an MR must itself).
    fn window_target(&self, pdn: u32, w: &HcaBindMwWqe) -> Result<u32, WcError> {
        let idx = w.mr_key >> 8;
        let mr = self.mrs.get(idx).ok_or(WcError::MwBind)?;
        let tag_ok = self.mr_tags.get(idx as usize) == Some(&((w.mr_key & 0xff) as u8));
        let end = w.addr.checked_add(w.length).ok_or(WcError::MwBind)?;
        let inside = w.addr >= mr.iova && end <= mr.iova.saturating_add(mr.length);
        let rights = access_ok(w.access | (mr.access & ACCESS_LOCAL_WRITE));
        let ok = tag_ok
            && mr.window.is_none()
            && mr.pdn == pdn
            && mr.access & ACCESS_MW_BIND != 0
            && inside
            && rights;
        ok.then_some(idx).ok_or(WcError::MwBind)
    }

    /// Unbinds window `idx`, if bound: no access through it from now on (copies under
    /// way end first: see [`Grant::revoke`]).
    fn unbind_window(&mut self, idx: u32) {
        let Some(mw) = self.mrs.get_mut(idx) else {
            return;
        };
        let Some(w) = mw.window.as_mut() else {
            return;
        };
        let under = w.mr.take();
        (mw.access, mw.length) = (0, 0);
        mw.grant.revoke();
        mw.grant = Arc::default();
        if let Some(m) = under.and_then(|u| self.mrs.get_mut(u)) {
            m.windows -= 1;
        }
    }

    /// Unbinds the type 2 windows bound to QP `qpn`, which is going: a later QP given
    /// its number must not inherit them.
    pub(crate) fn unbind_windows_of(&mut self, qpn: u32) {
        let bound: Vec<u32> = self
            .mrs
            .indices()
            .filter(|&i| {
                self.mrs
                    .get(i)
                    .and_then(|m| m.window)
                    .is_some_and(|w| w.mw_type == MW_TYPE_2 && w.qpn == qpn && w.mr.is_some())
            })
            .collect();
        for idx in bound {
            self.unbind_window(idx);
        }
    }

    /// WR_REG_MR: maps the fast-registration MR `w.key >> 8`, which must belong to `pdn`,
    /// and gives it the key `w.key`. Errors are completion statuses.
    pub(crate) fn fast_register(&mut self, pdn: u32, w: &HcaRegMrWqe) -> Result<(), WcError> {
        let idx = w.key >> 8;
        let tag = (w.key & 0xff) as u8;
        let cap = match self.mrs.get(idx) {
            Some(mr) if mr.fast_reg_pages > 0 && mr.pdn == pdn && mr.windows == 0 => {
                mr.fast_reg_pages
            }
            _ => return Err(WcError::LocProt),
        };
        // Any tag, as ib_inc_rkey wraps through them all, but never LOCAL_DMA_LKEY's value.
        if w.key <= LOCAL_DMA_LKEY || !access_ok(w.access) || w.npages > cap {
            return Err(WcError::LocProt);
        }
        let xlat = self
            .read_pages(w.iova, w.length, w.page_list, w.npages, w.page_shift)
            .map_err(|_| WcError::LocProt)?;
        let mr = self.mrs.get_mut(idx).ok_or(WcError::LocProt)?;
        (mr.access, mr.iova, mr.length, mr.xlat) = (w.access, w.iova, w.length, xlat);
        mr.grant.revoke();
        mr.grant = Arc::default();
        if let Some(t) = self.mr_tags.get_mut(idx as usize) {
            *t = tag;
        }
        Ok(())
    }

    /// Invalidates the fast-registration MR or type 2 window whose current key is `key`
    /// (LOCAL_INV, or a SEND with Invalidate naming it): an MR reaches no byte until the
    /// next WR_REG_MR, a window until it is bound again. Only one of `pdn`'s can be
    /// invalidated, an MR only while no window is bound to it; false otherwise.
    pub(crate) fn invalidate(&mut self, pdn: u32, key: u32) -> bool {
        let idx = key >> 8;
        let tag_ok = self
            .mr_tags
            .get(idx as usize)
            .is_some_and(|&t| t == (key & 0xff) as u8);
        match self.mrs.get_mut(idx) {
            Some(mw) if tag_ok && mw.pdn == pdn && mw.window.is_some() => {
                let bound_2 = mw
                    .window
                    .is_some_and(|w| w.mw_type == MW_TYPE_2 && w.mr.is_some());
                if bound_2 {
                    self.unbind_window(idx);
                }
                bound_2
            }
            Some(mr) if tag_ok && mr.fast_reg_pages > 0 && mr.pdn == pdn && mr.windows == 0 => {
                (mr.access, mr.length) = (0, 0);
                mr.grant.revoke();
                mr.grant = Arc::default();
                true
            }
            _ => false,
        }
    }

    /// The grant of remote access through `key` as it stands now (after `resolve_key`
    /// accepted the key).
    pub(crate) fn grant_of(&self, key: u32) -> Option<Arc<Grant>> {
        self.mrs.get(key >> 8).map(|mr| mr.grant.clone())
    }

    /// Reads and checks a page list: every page aligned and inside guest memory, and the
    /// pages covering `[iova, iova + length)`. Errors are command statuses.
    fn read_pages(
        &self,
        iova: u64,
        length: u64,
        page_list: u64,
        npages: u32,
        page_shift: u32,
    ) -> Result<Translation, CmdError> {
        if !(MIN_MR_PAGE_SHIFT..=MAX_MR_PAGE_SHIFT).contains(&page_shift)
            || npages == 0
            || npages > MAX_MR_PAGES
            || length == 0
        {
            return Err(CmdError::BadParam);
        }
        let psize = 1u64 << page_shift;
        let fbo = iova & (psize - 1);
        let span = u64::from(npages) << page_shift;
        if iova.checked_add(length).is_none() || fbo + length > span {
            return Err(CmdError::BadParam);
        }
        let mut pages = vec![0u64; npages as usize].into_boxed_slice();
        for (i, p) in pages.iter_mut().enumerate() {
            let at = page_list
                .checked_add(8 * i as u64)
                .ok_or(CmdError::BadAddress)?;
            *p = read_obj::<u64>(self.mem.as_ref(), at).map_err(|_| CmdError::BadAddress)?;
            if *p & (psize - 1) != 0 || !self.mem.check(*p, psize) {
                return Err(CmdError::BadAddress);
            }
        }
        Ok(Translation::Pages {
            shift: page_shift,
            fbo,
            pages,
        })
    }

    pub(crate) fn cmd_dereg_mr(&mut self, key: u32) -> Result<(), CmdError> {
        let idx = key >> 8;
        let valid = self.mrs.get(idx).is_some_and(|m| m.window.is_none())
            && self.mr_tags.get(idx as usize) == Some(&((key & 0xff) as u8));
        if !valid {
            return Err(CmdError::BadHandle);
        }
        if self.mrs.get(idx).is_some_and(|m| m.windows > 0) {
            return Err(CmdError::Busy);
        }
        let mr = self.mrs.remove(idx).ok_or(CmdError::BadHandle)?;
        self.mr_pages -= mr.budget;
        if let Some(pd) = self.pds.get_mut(mr.pdn) {
            pd.users -= 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_page_translation_splits_at_page_boundaries_and_merges_contiguous_pages() {
        let mr = Mr {
            pdn: 1,
            access: 0,
            iova: 0x10_0800,
            length: 0x2000,
            xlat: Translation::Pages {
                shift: 12,
                fbo: 0x800,
                pages: vec![0x5000, 0x9000, 0xa000].into_boxed_slice(),
            },
            budget: 3,
            grant: Arc::default(),
            fast_reg_pages: 0,
            window: None,
            windows: 0,
        };
        let mut out = SegList::new();
        mr.translate(0x10_0800, 0x2000, &mut out);
        assert_eq!(
            out.to_vec(),
            vec![
                Seg {
                    addr: 0x5800,
                    len: 0x800
                },
                Seg {
                    addr: 0x9000,
                    len: 0x1800
                },
            ]
        );
    }
}
