/* SPDX-License-Identifier: (GPL-2.0 OR Apache-2.0) */
/*
 * User verbs ABI between hca_ib and the rdma-core provider (libhcab):
 * the udata of each verb and the layout of a context's user access region.
 *
 * Posting and polling make no system call. The kernel allocates each ring
 * (SQ, RQ, SRQ, CQ) in guest RAM and the process maps it; the process maps
 * its user access region (UAR, one BAR2 page of the device holding its
 * queues' doorbell records) and the page of BAR0's doorbell register. To
 * post, the provider writes WQEs into the ring, then the record's producer
 * index, then rings the doorbell class (HCA_DB_SQ, ...) as the kernel does.
 * The device reads a user queue's record only from its owner's UAR.
 *
 * Checked against hca-model/src/uapi.rs by hca-model/tests/abi_c.rs.
 * mmap offsets are opaque cookies: pass them to mmap() on the context's fd.
 */
#ifndef HCA_UAPI_H
#define HCA_UAPI_H

#include <linux/types.h>

#define HCA_UVERBS_ABI_VERSION		1

/* Slots in a UAR page: 8-byte records (struct hca_qp_db, hca_cq_db, hca_srq_db) */
#define HCA_UAR_QP_OFFSET		0x000
#define HCA_UAR_QP_SLOTS		256
#define HCA_UAR_CQ_OFFSET		0x800
#define HCA_UAR_CQ_SLOTS		128
#define HCA_UAR_SRQ_OFFSET		0xc00
#define HCA_UAR_SRQ_SLOTS		64
/*
 * The context's send-doorbell ring (with HCA_CAP_SQ_RING), laid out as the
 * kernel's (HCA_SQ_RING_PI, HCA_SQ_RING_QPN_OFFSET, HCA_SQ_RING_ENTRIES in
 * hca_abi.h). The provider appends the QPN of a QP created with
 * HCA_UCREATE_QP_SQ_RING before ringing HCA_DB_SQ for it, one thread at a
 * time; the device takes from it only QPs whose records are in this page.
 */
#define HCA_UAR_SQ_RING_OFFSET		0xe00

/* create_qp command (after the standard one); none: an unnamed QP */
#define HCA_UCREATE_QP_SQ_RING		(1 << 0)
struct hca_ucreate_qp {
	__u32 flags;		/* HCA_UCREATE_QP_* */
	__u32 rsvd;
};

/* ibv_open_device / alloc_ucontext response */
struct hca_ualloc_ucontext_resp {
	__aligned_u64 uar_mmap_offset;	/* one page: the context's UAR */
	__aligned_u64 db_mmap_offset;	/* one page: holds BAR0's doorbell register */
	__u32 db_reg_offset;	/* the doorbell register's offset in that page */
	__u32 doorbell_peer;	/* peer field of every doorbell write */
	__u32 caps;		/* HCA_CAP_* */
	__u32 max_inline;	/* the device's inline limit, bytes */
};

/* create_cq response (after the standard one); resize_cq's too, for the new ring */
struct hca_ucreate_cq_resp {
	__aligned_u64 ring_mmap_offset;	/* 32 << log_entries bytes, page-rounded */
	__u32 cqn;
	__u32 log_entries;
	__u32 db_slot;		/* record at HCA_UAR_CQ_OFFSET + 8 * db_slot */
	__u32 rsvd;
};

/* create_qp response (after the standard one) */
struct hca_ucreate_qp_resp {
	__aligned_u64 sq_mmap_offset;	/* 1 << (sq_log_entries + sq_wqe_shift) bytes */
	__aligned_u64 rq_mmap_offset;	/* 0 on an SRQ */
	__u32 qpn;
	__u32 db_slot;		/* record at HCA_UAR_QP_OFFSET + 8 * db_slot */
	__u8 sq_log_entries;
	__u8 sq_wqe_shift;
	__u8 rq_log_entries;
	__u8 rq_wqe_shift;
	__u32 max_inline;	/* inline bytes one send WQE of this QP holds */
};

/* create_srq response (after the standard one) */
struct hca_ucreate_srq_resp {
	__aligned_u64 ring_mmap_offset;	/* 1 << (log_entries + wqe_shift) bytes */
	__u32 srqn;
	__u32 db_slot;		/* record at HCA_UAR_SRQ_OFFSET + 8 * db_slot */
	__u8 log_entries;
	__u8 wqe_shift;
	__u16 rsvd0;
	__u32 rsvd1;
};

#endif /* HCA_UAPI_H */
