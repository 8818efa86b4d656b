/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * libhcab: the rdma-core provider for the hcabench HCA (hca_ib's user verbs).
 *
 * Posting and polling make no system call. The kernel allocates each ring
 * (SQ, RQ, SRQ, CQ) and the process maps it; the context maps its user
 * access region (UAR: one BAR2 page holding its queues' doorbell records)
 * and the page of BAR0's doorbell register (hca_uapi.h). The data path is
 * the kernel driver's (guest-kmod/hca_ib/post.c, cq.c, srq.c) moved into
 * the process: same WQEs, same wr_id trick, same records and doorbells.
 *
 * Locking overview (details next to each lock):
 * - ctx->qp_table_mutex serialises changes to the QPN -> QP table, and is
 *   held across DESTROY_QP and the unpublishing that follows, so that a
 *   new QP that is given the same QPN is published only after the old one
 *   is gone from the table and from its CQs. poll_cq reads the table
 *   without it (atomic loads).
 * - cq->lock guards a CQ's consumer index and arming sequence; under it
 *   poll_cq advances the work queues' consumer indices (their only writer)
 *   and retires SRQ slots.
 * - qp->sq.lock and qp->rq.lock guard each work queue's producer index.
 * - srq->wq.lock guards an SRQ's indices and tags.
 * - ctx->sq_ring_lock makes the UAR's send-doorbell ring's writer one
 *   thread at a time and guards ctx->sq_ring_pi.
 *
 * Lock order (outermost first):
 *
 *   ctx->qp_table_mutex
 *     cq->lock (one CQ at a time) | qp->sq.lock | qp->rq.lock
 *       srq->wq.lock (poll_cq and CQ cleaning retire SRQ slots)
 *       ctx->sq_ring_lock (post_send names the QP under qp->sq.lock)
 */
#ifndef HCAB_H
#define HCAB_H

#include <stdatomic.h>
#include <stdint.h>
#include <pthread.h>
#include <infiniband/driver.h>
#include <util/udma_barrier.h>
#include <util/mmio.h>

#include "hca_abi.h"
#include "hca_uapi.h"

struct hcab_device {
	struct verbs_device ibv_dev;
};

struct hcab_qp;

struct hcab_context {
	struct verbs_context ibv_ctx;
	size_t page_size;
	void *uar;		/* the UAR page: doorbell records */
	void *db_page;		/* the page holding BAR0's doorbell register */
	void *db_reg;		/* the doorbell register in db_page */
	uint32_t doorbell_peer;
	/* Writers hold qp_table_mutex; poll_cq reads with atomic loads. */
	pthread_mutex_t qp_table_mutex;
	struct hcab_qp *_Atomic qp_table[HCA_MAX_QP];
	/*
	 * The UAR's send-doorbell ring (HCA_CAP_SQ_RING): post_send names each
	 * QP created with HCA_UCREATE_QP_SQ_RING in it before its HCA_DB_SQ, so
	 * that the device runs that QP without looking at every other. Threads
	 * posting on different QPs at once share it; the device reads it as one
	 * writer's, so sq_ring_lock makes them take turns (a spinlock: held for
	 * two stores), and guards sq_ring_pi, the producer index last written.
	 */
	bool sq_ring;
	pthread_spinlock_t sq_ring_lock;
	uint32_t sq_ring_pi;
};

/* One work queue: a mapped ring plus the consumer's wr_ids. */
struct hcab_wq {
	void *ring;
	size_t map_bytes;	/* the mapping's length, page-rounded */
	uint32_t log_entries;
	uint32_t wqe_shift;
	uint32_t max_sge;
	/* Guards pi (and, for an SRQ, ci and the tags). */
	pthread_spinlock_t lock;
	uint32_t pi;		/* next slot to fill */
	_Atomic uint32_t ci;	/* oldest slot not known complete */
	uint64_t *wrid;		/* consumer wr_id per slot (SRQ: per tag) */
};

struct hcab_cq {
	struct verbs_cq vcq;
	uint32_t cqn;
	uint32_t log_entries;
	struct hca_cqe *ring;
	size_t map_bytes;
	void *db;		/* struct hca_cq_db in the UAR */
	/*
	 * Guards ci, arm_sn and the extended poll's state: poll_cq and
	 * req_notify_cq race from any thread; an extended CQ's poller holds
	 * it from a successful start_poll to end_poll.
	 */
	pthread_spinlock_t lock;
	uint32_t ci;
	uint32_t arm_sn;
	/* The extended CQ's poll: where start_poll began, and its current WC. */
	uint32_t poll_start;
	struct ibv_wc cur;
};

/*
 * A shared receive queue: a WQE's wr_id carries its ring index (high half)
 * and a tag (low half) that names the consumer's wr_id until its completion
 * is polled (srq.c in hca_ib explains why). wq.ci is how far the device is
 * known to have taken; wq.wrid is indexed by tag.
 */
struct hcab_srq {
	struct verbs_srq vsrq;
	uint32_t srqn;
	void *db;		/* struct hca_srq_db in the UAR */
	struct hcab_wq wq;
	uint8_t *busy;		/* per tag: held until its completion is polled */
	uint32_t *free_tags;
	uint32_t nfree;
};

struct hcab_qp {
	struct verbs_qp vqp;
	uint32_t qpn;
	uint32_t max_inline;	/* inline bytes one send WQE holds */
	void *db;		/* struct hca_qp_db in the UAR */
	struct hcab_srq *srq;	/* receives come from it; rq is then unused */
	bool sq_named;		/* post_send names it in the UAR's ring */
	struct hcab_wq sq;
	struct hcab_wq rq;
	/*
	 * The extended send API (qpex.c), under sq.lock from wr_start to
	 * wr_complete or wr_abort: the IBV_QP_EX_WITH_* it was made with, the
	 * batch's first index, its first error, and the WQE being built.
	 */
	uint64_t send_ops;
	uint32_t wr_start_pi;
	int wr_err;
	struct hca_send_wqe *wr_cur;
};

/* An address handle lives in the process alone: the WQE carries its DLID. */
struct hcab_ah {
	struct ibv_ah ibv_ah;
	uint16_t dlid;
	uint8_t sl;
};

/*
 * The context's send-doorbell ring: off without HCA_CAP_SQ_RING; else it goes
 * on from the producer index the UAR page holds (another process may have
 * used the page before).
 */
static inline void hcab_sq_ring_init(struct hcab_context *ctx, uint32_t caps)
{
	ctx->sq_ring = caps & HCA_CAP_SQ_RING;
	pthread_spin_init(&ctx->sq_ring_lock, PTHREAD_PROCESS_PRIVATE);
	ctx->sq_ring_pi = ctx->sq_ring ?
		mmio_read32((char *)ctx->uar + HCA_UAR_SQ_RING_OFFSET +
			    HCA_SQ_RING_PI) : 0;
}

static inline struct hcab_context *to_hctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct hcab_context, ibv_ctx.context);
}

static inline struct hcab_cq *to_hcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct hcab_cq, vcq.cq);
}

static inline struct hcab_qp *to_hqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct hcab_qp, vqp.qp);
}

static inline struct hcab_srq *to_hsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct hcab_srq, vsrq.srq);
}

static inline struct hcab_ah *to_hah(struct ibv_ah *ibah)
{
	return container_of(ibah, struct hcab_ah, ibv_ah);
}

static inline uint32_t hcab_wq_mask(const struct hcab_wq *wq)
{
	return (1u << wq->log_entries) - 1;
}

static inline void *hcab_wqe(const struct hcab_wq *wq, uint32_t idx)
{
	size_t slot = idx & hcab_wq_mask(wq);

	return (char *)wq->ring + (slot << wq->wqe_shift);
}

/*
 * Every signal to the device: one 32-bit store of the class to BAR0's
 * doorbell register. Callers have stored the record it is about first, and
 * the record (BAR2) and the register (BAR0) are separate mappings, so the
 * flush keeps the two stores in that order on any memory type.
 */
static inline void hcab_ring(struct hcab_context *ctx, uint32_t class)
{
	mmio_flush_writes();
	mmio_write32(ctx->db_reg,
		     ctx->doorbell_peer << HCA_DOORBELL_PEER_SHIFT | class);
}

static inline bool hcab_wq_full(struct hcab_wq *wq)
{
	uint32_t ci = atomic_load_explicit(&wq->ci, memory_order_acquire);

	return wq->pi - ci >= (1u << wq->log_entries);
}

/* A send WR's IBV_SEND_* flags as the WQE's (inline is the builder's). */
static inline uint8_t hcab_wqe_flags(unsigned int send_flags)
{
	uint8_t f = 0;

	if (send_flags & IBV_SEND_SIGNALED)
		f |= HCA_WQE_SIGNALED;
	if (send_flags & IBV_SEND_SOLICITED)
		f |= HCA_WQE_SOLICITED;
	if (send_flags & IBV_SEND_FENCE)
		f |= HCA_WQE_FENCE;
	return f;
}

/* hcab.c */
void *hcab_mmap(struct hcab_context *ctx, uint64_t offset, size_t bytes,
		size_t *map_bytes);

/* verbs.c */
struct ibv_pd *hcab_alloc_pd(struct ibv_context *ibctx);
int hcab_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *hcab_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			   uint64_t hca_va, int access);
int hcab_dereg_mr(struct verbs_mr *vmr);
struct ibv_mw *hcab_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int hcab_dealloc_mw(struct ibv_mw *mw);
int hcab_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind);
void hcab_fill_bind_mw(struct hca_bind_mw_wqe *w, struct ibv_mw *mw,
		       uint32_t rkey, const struct ibv_mw_bind_info *info);
struct ibv_ah *hcab_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int hcab_destroy_ah(struct ibv_ah *ah);
int hcab_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
		      uint16_t lid);
int hcab_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
		      uint16_t lid);

/* cq.c */
struct ibv_cq *hcab_create_cq(struct ibv_context *ibctx, int cqe,
			      struct ibv_comp_channel *channel,
			      int comp_vector);
struct ibv_cq_ex *hcab_create_cq_ex(struct ibv_context *ibctx,
				    struct ibv_cq_init_attr_ex *attr);
int hcab_destroy_cq(struct ibv_cq *ibcq);
int hcab_resize_cq(struct ibv_cq *ibcq, int cqe);
int hcab_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc);
int hcab_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
void hcab_cq_clean(struct hcab_cq *cq, struct hcab_qp *qp, bool destroyed);

/* qp.c */
struct ibv_qp *hcab_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
int hcab_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask);
int hcab_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
		  struct ibv_qp_init_attr *init);
int hcab_destroy_qp(struct ibv_qp *ibqp);
int hcab_wq_map(struct hcab_context *ctx, struct hcab_wq *wq, uint64_t offset,
		uint32_t log_entries, uint32_t wqe_shift, uint32_t hdr,
		uint32_t min_shift, uint32_t max_shift);
void hcab_wq_unmap(struct hcab_wq *wq);

/* post.c */
int hcab_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		   struct ibv_send_wr **bad_wr);
int hcab_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		   struct ibv_recv_wr **bad_wr);
void hcab_write_recv_wqe(struct hcab_wq *wq, uint32_t idx, uint64_t hw_wr_id,
			 const struct ibv_recv_wr *wr);
void hcab_wq_publish(struct hcab_context *ctx, struct hcab_qp *qp,
		     struct hcab_wq *wq, uint32_t start, size_t field,
		     uint32_t class);

/* qpex.c */
struct ibv_qp *hcab_create_qp_ex(struct ibv_context *ibctx,
				 struct ibv_qp_init_attr_ex *attr);

/* srq.c */
struct ibv_srq *hcab_create_srq(struct ibv_pd *pd,
				struct ibv_srq_init_attr *init);
int hcab_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		    int mask);
int hcab_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr);
int hcab_destroy_srq(struct ibv_srq *ibsrq);
int hcab_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad_wr);
uint64_t hcab_srq_retire(struct hcab_srq *srq, uint64_t hw);

#endif /* HCAB_H */
