//! Protection domains, memory regions, and key checks.
//!
//! A key is `(mr_index << 8) | tag`; lkey and rkey are the same value. The tag changes on
//! every registration of a slot, so a deregistered key stops matching. An MR's page list is
//! copied into the device at registration and every page validated then, so a translation
//! can never leave guest memory and the guest cannot change it afterwards.

use crate::abi::*;
use crate::dma::read_obj;
use crate::hca::HcaState;
use crate::packet::{Seg, SegList};

/// SGEs read from one WQE, kept inline for the usual few.
pub(crate) type SgeList = smallvec::SmallVec<[HcaSge; 4]>;

/// A protection domain; counts the MRs and QPs that name it.
#[derive(Default)]
pub(crate) struct Pd {
    pub users: u32,
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
pub(crate) struct KeyCheck {
    /// The PD of the QP using the key.
    pub pdn: u32,
    pub use_: Use,
    /// The QP's own remote-access flags (checked for remote uses only).
    pub qp_access: u32,
}

impl KeyCheck {
    pub fn local(pdn: u32, use_: Use) -> Self {
        Self {
            pdn,
            use_,
            qp_access: 0,
        }
    }

    pub fn remote(pdn: u32, use_: Use, qp_access: u32) -> Self {
        Self {
            pdn,
            use_,
            qp_access,
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
                    push_seg(out, pages[(pos >> shift) as usize] + in_page, n);
                    pos += n;
                }
            }
        }
    }
}

/// Appends a range, merging with the previous one when contiguous; pieces stay below 4 GiB.
fn push_seg(out: &mut SegList, addr: u64, len: u64) {
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

impl HcaState {
    /// Resolves `[va, va + len)` under `key` for `how`, appending the guest-physical pieces
    /// to `out`.
    pub(crate) fn resolve_key(
        &self,
        key: u32,
        va: u64,
        len: u64,
        how: &KeyCheck,
        out: &mut SegList,
    ) -> Result<(), KeyViolation> {
        let (pdn, use_) = (how.pdn, how.use_);
        if use_.is_remote() && how.qp_access & use_.needed() == 0 {
            return Err(KeyViolation);
        }
        let end = va.checked_add(len).ok_or(KeyViolation)?;
        if key == LOCAL_DMA_LKEY && !use_.is_remote() {
            if !self.mem.check(va, len) {
                return Err(KeyViolation);
            }
            push_seg(out, va, len);
            return Ok(());
        }
        let idx = key >> 8;
        let mr = self.mrs.get(idx).ok_or(KeyViolation)?;
        let tag_ok = self.mr_tags[idx as usize] == (key & 0xff) as u8;
        let in_bounds = va >= mr.iova && end <= mr.iova.saturating_add(mr.length);
        let allowed = mr.access & use_.needed() == use_.needed();
        if !tag_ok || mr.pdn != pdn || !in_bounds || !allowed {
            return Err(KeyViolation);
        }
        if len == 0 {
            return Ok(());
        }
        if matches!(mr.xlat, Translation::Phys) && !self.mem.check(va, len) {
            return Err(KeyViolation);
        }
        mr.translate(va, len, out);
        Ok(())
    }

    /// Resolves a list of SGEs (read from the guest) into guest-physical pieces.
    /// Returns the total length.
    pub(crate) fn resolve_sges(
        &self,
        sges: &[HcaSge],
        pdn: u32,
        use_: Use,
        out: &mut SegList,
    ) -> Result<u64, KeyViolation> {
        let mut total = 0u64;
        let how = KeyCheck::local(pdn, use_);
        for s in sges {
            self.resolve_key(s.lkey, s.addr, u64::from(s.length), &how, out)?;
            total += u64::from(s.length);
        }
        Ok(total)
    }

    pub(crate) fn cmd_alloc_pd(&mut self) -> Result<u32, u32> {
        self.pds.alloc(Pd::default()).ok_or(CMD_NO_RESOURCES)
    }

    pub(crate) fn cmd_dealloc_pd(&mut self, pdn: u32) -> Result<(), u32> {
        match self.pds.get(pdn) {
            None => Err(CMD_BAD_HANDLE),
            Some(pd) if pd.users > 0 => Err(CMD_BUSY),
            Some(_) => {
                self.pds.remove(pdn);
                Ok(())
            }
        }
    }

    pub(crate) fn cmd_reg_mr(&mut self, a: &HcaCmdRegMr) -> Result<u32, u32> {
        if self.pds.get(a.pdn).is_none() {
            return Err(CMD_BAD_HANDLE);
        }
        let remote_needs_local = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC;
        if a.access & !0xf != 0
            || (a.access & remote_needs_local != 0 && a.access & ACCESS_LOCAL_WRITE == 0)
            || a.flags & !MR_FLAG_PHYS != 0
        {
            return Err(CMD_BAD_PARAM);
        }
        let (xlat, npages) = if a.flags & MR_FLAG_PHYS != 0 {
            (Translation::Phys, 0)
        } else {
            self.read_page_list(a)?
        };
        if self.mr_pages + npages > u64::from(MAX_TOTAL_MR_PAGES) {
            return Err(CMD_NO_RESOURCES);
        }
        let mr = Mr {
            pdn: a.pdn,
            access: a.access,
            iova: a.iova,
            length: a.length,
            xlat,
        };
        let idx = self.mrs.alloc(mr).ok_or(CMD_NO_RESOURCES)?;
        self.mr_pages += npages;
        if let Some(pd) = self.pds.get_mut(a.pdn) {
            pd.users += 1;
        }
        // Tags run 2..=255: 0 never, and 1 only for LOCAL_DMA_LKEY's slot 0.
        let tag = &mut self.mr_tags[idx as usize];
        *tag = if *tag == 255 { 2 } else { *tag + 1 };
        Ok((idx << 8) | u32::from(*tag))
    }

    fn read_page_list(&self, a: &HcaCmdRegMr) -> Result<(Translation, u64), u32> {
        if !(MIN_MR_PAGE_SHIFT..=MAX_MR_PAGE_SHIFT).contains(&a.page_shift)
            || a.npages == 0
            || a.npages > MAX_MR_PAGES
            || a.length == 0
        {
            return Err(CMD_BAD_PARAM);
        }
        let psize = 1u64 << a.page_shift;
        let fbo = a.iova & (psize - 1);
        let span = u64::from(a.npages) << a.page_shift;
        if a.iova.checked_add(a.length).is_none() || fbo + a.length > span {
            return Err(CMD_BAD_PARAM);
        }
        let mut pages = vec![0u64; a.npages as usize].into_boxed_slice();
        for (i, p) in pages.iter_mut().enumerate() {
            let at = a
                .page_list
                .checked_add(8 * i as u64)
                .ok_or(CMD_BAD_ADDRESS)?;
            *p = read_obj::<u64>(self.mem.as_ref(), at).map_err(|_| CMD_BAD_ADDRESS)?;
            if *p & (psize - 1) != 0 || !self.mem.check(*p, psize) {
                return Err(CMD_BAD_ADDRESS);
            }
        }
        let n = u64::from(a.npages);
        Ok((
            Translation::Pages {
                shift: a.page_shift,
                fbo,
                pages,
            },
            n,
        ))
    }

    pub(crate) fn cmd_dereg_mr(&mut self, key: u32) -> Result<(), u32> {
        let idx = key >> 8;
        let valid = self.mrs.get(idx).is_some() && self.mr_tags[idx as usize] == (key & 0xff) as u8;
        if !valid {
            return Err(CMD_BAD_HANDLE);
        }
        let mr = self.mrs.remove(idx).ok_or(CMD_BAD_HANDLE)?;
        if let Translation::Pages { pages, .. } = &mr.xlat {
            self.mr_pages -= pages.len() as u64;
        }
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
