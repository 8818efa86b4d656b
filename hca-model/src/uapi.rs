//! The user verbs ABI between the guest's hca_ib and its rdma-core provider (libhcab):
//! the Rust twin of `guest-kmod/include/hca_uapi.h`, checked against it by
//! `tests/abi_c.rs`. The device never reads these structs; what it sees of a process is the
//! doorbell records in the process's user access region (see `abi::BAR2_UAR_OFFSET`), whose
//! slots are laid out here.

/// `uverbs_abi_ver` of hca_ib; the provider accepts this version only.
pub const UVERBS_ABI_VERSION: u32 = 1;

/// Slots of 8-byte doorbell records in one UAR page, by queue kind.
pub const UAR_QP_OFFSET: u32 = 0x000;
/// QP doorbell records one UAR holds.
pub const UAR_QP_SLOTS: u32 = 256;
/// Where a UAR's CQ doorbell records start.
pub const UAR_CQ_OFFSET: u32 = 0x800;
/// CQ doorbell records one UAR holds.
pub const UAR_CQ_SLOTS: u32 = 128;
/// Where a UAR's SRQ doorbell records start.
pub const UAR_SRQ_OFFSET: u32 = 0xc00;
/// SRQ doorbell records one UAR holds.
pub const UAR_SRQ_SLOTS: u32 = 64;
/// The context's send-doorbell ring (with CAP_SQ_RING), laid out as a kernel one
/// (`abi::SQ_RING_PI`, `abi::SQ_RING_QPN_OFFSET`, `abi::SQ_RING_ENTRIES`): the provider
/// appends the QPN of a QP created with `UCREATE_QP_SQ_RING` before it rings DB_SQ for it.
/// The device takes from it only QPs whose records are in this page.
pub const UAR_SQ_RING_OFFSET: u32 = 0xe00;

const _: () = {
    use crate::abi::{SQ_RING_ENTRIES, SQ_RING_QPN_OFFSET, UAR_SIZE};
    assert!(UAR_QP_OFFSET + UAR_QP_SLOTS * 8 <= UAR_CQ_OFFSET);
    assert!(UAR_CQ_OFFSET + UAR_CQ_SLOTS * 8 <= UAR_SRQ_OFFSET);
    assert!(UAR_SRQ_OFFSET + UAR_SRQ_SLOTS * 8 <= UAR_SQ_RING_OFFSET);
    assert!(UAR_SQ_RING_OFFSET + SQ_RING_QPN_OFFSET + SQ_RING_ENTRIES * 4 <= UAR_SIZE);
};

/// `HcaUcreateQp::flags`: the provider names this QP in the UAR's send-doorbell ring before
/// each DB_SQ (the kernel then creates it with `abi::QP_FLAG_SQ_RING`).
pub const UCREATE_QP_SQ_RING: u32 = 1 << 0;

/// create_qp's driver command (after the standard one); a provider that sends none (an
/// older one) gets a QP the device looks at on every send doorbell.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateQp {
    /// `UCREATE_QP_*` bits.
    pub flags: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}

/// alloc_ucontext's response: the mmap cookies of the context's UAR page and of the page
/// holding BAR0's doorbell register.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUallocUcontextResp {
    /// mmap cookie of the context's UAR page.
    pub uar_mmap_offset: u64,
    /// mmap cookie of the page holding BAR0's doorbell register.
    pub db_mmap_offset: u64,
    /// The doorbell register's offset in that page.
    pub db_reg_offset: u32,
    /// The device's ivshmem peer id, for doorbell writes.
    pub doorbell_peer: u32,
    /// The device's `CAP_*` bits.
    pub caps: u32,
    /// Inline bytes a send WQE may carry at most.
    pub max_inline: u32,
}

/// create_cq's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateCqResp {
    /// mmap cookie of the CQE ring.
    pub ring_mmap_offset: u64,
    /// The CQ's number.
    pub cqn: u32,
    /// The ring holds `1 << log_entries` CQEs.
    pub log_entries: u32,
    /// The CQ's doorbell record slot in the UAR.
    pub db_slot: u32,
    /// Reserved; zero.
    pub rsvd: u32,
}

/// create_qp's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateQpResp {
    /// mmap cookie of the send queue ring.
    pub sq_mmap_offset: u64,
    /// mmap cookie of the receive queue ring.
    pub rq_mmap_offset: u64,
    /// The QP's number.
    pub qpn: u32,
    /// The QP's doorbell record slot in the UAR.
    pub db_slot: u32,
    /// The send queue holds `1 << sq_log_entries` WQEs.
    pub sq_log_entries: u8,
    /// Each send WQE is `1 << sq_wqe_shift` bytes.
    pub sq_wqe_shift: u8,
    /// The receive queue holds `1 << rq_log_entries` WQEs.
    pub rq_log_entries: u8,
    /// Each receive WQE is `1 << rq_wqe_shift` bytes.
    pub rq_wqe_shift: u8,
    /// Inline bytes a send WQE may carry at most.
    pub max_inline: u32,
}

/// create_srq's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateSrqResp {
    /// mmap cookie of the SRQ's WQE ring.
    pub ring_mmap_offset: u64,
    /// The SRQ's number.
    pub srqn: u32,
    /// The SRQ's doorbell record slot in the UAR.
    pub db_slot: u32,
    /// The ring holds `1 << log_entries` WQEs.
    pub log_entries: u8,
    /// Each WQE is `1 << wqe_shift` bytes.
    pub wqe_shift: u8,
    /// Reserved; zero.
    pub rsvd0: u16,
    /// Reserved; zero.
    pub rsvd1: u32,
}

const _: () = {
    assert!(std::mem::size_of::<HcaUcreateQp>() == 8);
    assert!(std::mem::size_of::<HcaUallocUcontextResp>() == 32);
    assert!(std::mem::size_of::<HcaUcreateCqResp>() == 24);
    assert!(std::mem::size_of::<HcaUcreateQpResp>() == 32);
    assert!(std::mem::size_of::<HcaUcreateSrqResp>() == 24);
};
