//! The user verbs ABI between the guest's hca_ib and its rdma-core provider (libhcab):
//! the Rust twin of `guest-kmod/include/hca_uapi.h`, checked against it by
//! `tests/abi_c.rs`. The device never reads these structs; what it sees of a process is the
//! doorbell records in the process's user access region (see `abi::BAR2_UAR_OFFSET`), whose
//! slots are laid out here.

/// `uverbs_abi_ver` of hca_ib; the provider accepts this version only.
pub const UVERBS_ABI_VERSION: u32 = 1;

/// Slots of 8-byte doorbell records in one UAR page, by queue kind.
pub const UAR_QP_OFFSET: u32 = 0x000;
pub const UAR_QP_SLOTS: u32 = 256;
pub const UAR_CQ_OFFSET: u32 = 0x800;
pub const UAR_CQ_SLOTS: u32 = 128;
pub const UAR_SRQ_OFFSET: u32 = 0xc00;
pub const UAR_SRQ_SLOTS: u32 = 64;

const _: () = {
    assert!(UAR_QP_OFFSET + UAR_QP_SLOTS * 8 <= UAR_CQ_OFFSET);
    assert!(UAR_CQ_OFFSET + UAR_CQ_SLOTS * 8 <= UAR_SRQ_OFFSET);
    assert!(UAR_SRQ_OFFSET + UAR_SRQ_SLOTS * 8 <= crate::abi::UAR_SIZE);
};

/// alloc_ucontext's response: the mmap cookies of the context's UAR page and of the page
/// holding BAR0's doorbell register.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUallocUcontextResp {
    pub uar_mmap_offset: u64,
    pub db_mmap_offset: u64,
    pub db_reg_offset: u32,
    pub doorbell_peer: u32,
    pub caps: u32,
    pub max_inline: u32,
}

/// create_cq's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateCqResp {
    pub ring_mmap_offset: u64,
    pub cqn: u32,
    pub log_entries: u32,
    pub db_slot: u32,
    pub rsvd: u32,
}

/// create_qp's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateQpResp {
    pub sq_mmap_offset: u64,
    pub rq_mmap_offset: u64,
    pub qpn: u32,
    pub db_slot: u32,
    pub sq_log_entries: u8,
    pub sq_wqe_shift: u8,
    pub rq_log_entries: u8,
    pub rq_wqe_shift: u8,
    pub max_inline: u32,
}

/// create_srq's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcaUcreateSrqResp {
    pub ring_mmap_offset: u64,
    pub srqn: u32,
    pub db_slot: u32,
    pub log_entries: u8,
    pub wqe_shift: u8,
    pub rsvd0: u16,
    pub rsvd1: u32,
}

const _: () = {
    assert!(std::mem::size_of::<HcaUallocUcontextResp>() == 32);
    assert!(std::mem::size_of::<HcaUcreateCqResp>() == 24);
    assert!(std::mem::size_of::<HcaUcreateQpResp>() == 32);
    assert!(std::mem::size_of::<HcaUcreateSrqResp>() == 24);
};
