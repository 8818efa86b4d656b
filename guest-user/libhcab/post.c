// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * post_send and post_recv without a system call: WQEs into the mapped
 * ring, the new producer index into the QP's record in the UAR, then one
 * doorbell per call, in that order (hca_ib's post.c does the same).
 *
 * A WQE's wr_id field carries its slot's free-running index; the
 * consumer's wr_id waits in wq->wrid until poll_cq retires the slot.
 *
 * Locking: wq->lock guards pi. ci moves in poll_cq alone (under its CQ's
 * lock) and is read here with an acquire load.
 */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "hcab.h"

/*
 * Names QP qpn in the UAR's send-doorbell ring: the QPN, then the producer
 * index that publishes it. Threads take turns (see hcab_context).
 */
static void hcab_name_sq(struct hcab_context *ctx, uint32_t qpn)
{
	char *ring = (char *)ctx->uar + HCA_UAR_SQ_RING_OFFSET;
	uint32_t pi;

	pthread_spin_lock(&ctx->sq_ring_lock);
	pi = ctx->sq_ring_pi;
	mmio_write32(ring + HCA_SQ_RING_QPN_OFFSET +
		     4 * (pi % HCA_SQ_RING_ENTRIES), qpn);
	/* The QPN reaches the device before the index that publishes it. */
	udma_to_device_barrier();
	mmio_write32(ring + HCA_SQ_RING_PI, pi + 1);
	ctx->sq_ring_pi = pi + 1;
	pthread_spin_unlock(&ctx->sq_ring_lock);
}

/*
 * Publishes a work queue's new producer index (at offset `field` of the QP's
 * record) if the call posted anything, names a named QP's send queue in the
 * UAR's ring, then rings `class`: WQEs reach memory before the index that
 * publishes them, and that index before the name. Caller holds wq->lock.
 */
void hcab_wq_publish(struct hcab_context *ctx, struct hcab_qp *qp,
		     struct hcab_wq *wq, uint32_t start, size_t field,
		     uint32_t class)
{
	if (wq->pi == start)
		return;
	udma_to_device_barrier();
	mmio_write32((char *)qp->db + field, wq->pi);
	if (class == HCA_DB_SQ && qp->sq_named) {
		udma_to_device_barrier();
		hcab_name_sq(ctx, qp->qpn);
	}
	hcab_ring(ctx, class);
}

static int hcab_wr_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_SEND:
		return HCA_WR_SEND;
	case IBV_WR_SEND_WITH_IMM:
		return HCA_WR_SEND_IMM;
	case IBV_WR_SEND_WITH_INV:
		return HCA_WR_SEND_INV;
	case IBV_WR_RDMA_WRITE:
		return HCA_WR_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return HCA_WR_RDMA_WRITE_IMM;
	case IBV_WR_RDMA_READ:
		return HCA_WR_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return HCA_WR_ATOMIC_CMP_SWP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return HCA_WR_ATOMIC_FETCH_ADD;
	case IBV_WR_LOCAL_INV:
		/* A process's type 2 window: it has no fast-registration MR. */
		return HCA_WR_LOCAL_INV;
	case IBV_WR_BIND_MW:
		return HCA_WR_BIND_MW;
	default:
		return -1;
	}
}

/*
 * A bind of window mw, as key rkey, to bind_info's range of its MR (none:
 * a type 1 window unbound), with its rights. The device checks the window,
 * the MR, the range and the rights; what it refuses fails the WR.
 */
void hcab_fill_bind_mw(struct hca_bind_mw_wqe *w, struct ibv_mw *mw,
		       uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	w->access = info->mw_access_flags;
	w->addr = info->addr;
	w->length = info->length;
	w->mw_key = mw->rkey;
	w->new_key = rkey;
	w->mr_key = info->mr ? info->mr->lkey : 0;
}

/* Inline SGEs name the process's own memory: copy it into the WQE. */
static int hcab_copy_inline(struct hcab_qp *qp, struct hca_send_wqe *w,
			    const struct ibv_send_wr *wr)
{
	uint8_t *dst = (uint8_t *)(w + 1);
	uint32_t len = 0;
	int i;

	for (i = 0; i < wr->num_sge; i++) {
		if (wr->sg_list[i].length > qp->max_inline - len)
			return EINVAL;
		memcpy(dst + len, (void *)(uintptr_t)wr->sg_list[i].addr,
		       wr->sg_list[i].length);
		len += wr->sg_list[i].length;
	}
	w->inline_len = len;
	w->flags |= HCA_WQE_INLINE;
	return 0;
}

static void hcab_copy_sges(struct hca_sge *dst, const struct ibv_sge *src,
			   int n)
{
	int i;

	for (i = 0; i < n; i++) {
		dst[i].addr = src[i].addr;
		dst[i].length = src[i].length;
		dst[i].lkey = src[i].lkey;
	}
}

static int hcab_build_send(struct hcab_qp *qp, const struct ibv_send_wr *wr)
{
	struct hcab_wq *wq = &qp->sq;
	struct hca_send_wqe *w = hcab_wqe(wq, wq->pi);
	int op = hcab_wr_opcode(wr->opcode);
	bool ud = qp->vqp.qp.qp_type == IBV_QPT_UD;
	bool uc = qp->vqp.qp.qp_type == IBV_QPT_UC;
	bool send = op == HCA_WR_SEND || op == HCA_WR_SEND_IMM;
	bool write = op == HCA_WR_RDMA_WRITE || op == HCA_WR_RDMA_WRITE_IMM;
	bool local = op == HCA_WR_LOCAL_INV || op == HCA_WR_BIND_MW;

	if (op < 0 || wr->num_sge < 0 || wr->num_sge > wq->max_sge)
		return EINVAL;
	/* A datagram QP sends, with or without immediate data, and no more. */
	if (ud && !send)
		return EINVAL;
	/* UC has no reads, atomics or SEND with Invalidate. */
	if (uc && !send && !write && !local)
		return EINVAL;
	if (ud && !wr->wr.ud.ah)
		return EINVAL;
	memset(w, 0, sizeof(*w));
	w->wr_id = wq->pi;
	w->opcode = op;
	w->flags = hcab_wqe_flags(wr->send_flags);
	if (op == HCA_WR_BIND_MW) {
		hcab_fill_bind_mw((struct hca_bind_mw_wqe *)w, wr->bind_mw.mw,
				  wr->bind_mw.rkey, &wr->bind_mw.bind_info);
		return 0;
	}
	if (op == HCA_WR_LOCAL_INV) {
		w->imm = wr->invalidate_rkey;
		return 0;
	}
	if (op == HCA_WR_SEND_IMM || op == HCA_WR_RDMA_WRITE_IMM)
		w->imm = (uint32_t)wr->imm_data;
	/* The key the responder invalidates. */
	if (op == HCA_WR_SEND_INV)
		w->imm = wr->invalidate_rkey;
	switch (op) {
	case HCA_WR_RDMA_WRITE:
	case HCA_WR_RDMA_WRITE_IMM:
	case HCA_WR_RDMA_READ:
		w->remote_addr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		break;
	case HCA_WR_ATOMIC_CMP_SWP:
	case HCA_WR_ATOMIC_FETCH_ADD:
		w->remote_addr = wr->wr.atomic.remote_addr;
		w->rkey = wr->wr.atomic.rkey;
		w->compare_add = wr->wr.atomic.compare_add;
		w->swap = wr->wr.atomic.swap;
		break;
	}
	if (ud) {
		w->ud_dlid = to_hah(wr->wr.ud.ah)->dlid;
		w->ud_remote_qpn = wr->wr.ud.remote_qpn;
		w->ud_qkey = wr->wr.ud.remote_qkey;
	}
	/*
	 * Only data the requester sends can be inline: a read's or an
	 * atomic's SGEs are where the response lands.
	 */
	if ((wr->send_flags & IBV_SEND_INLINE) && op != HCA_WR_RDMA_READ &&
	    op != HCA_WR_ATOMIC_CMP_SWP && op != HCA_WR_ATOMIC_FETCH_ADD)
		return hcab_copy_inline(qp, w, wr);
	w->num_sge = wr->num_sge;
	hcab_copy_sges((struct hca_sge *)(w + 1), wr->sg_list, wr->num_sge);
	return 0;
}

int hcab_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		   struct ibv_send_wr **bad_wr)
{
	struct hcab_context *ctx = to_hctx(ibqp->context);
	struct hcab_qp *qp = to_hqp(ibqp);
	struct hcab_wq *wq = &qp->sq;
	uint32_t start;
	int err = 0;

	/*
	 * Not before RTS (ERR takes WRs, to flush them): the state is the
	 * one this process last set, as libibverbs keeps it.
	 */
	if (ibqp->state < IBV_QPS_RTS) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&wq->lock);
	start = wq->pi;
	for (; wr; wr = wr->next) {
		if (hcab_wq_full(wq)) {
			err = ENOMEM;
			break;
		}
		err = hcab_build_send(qp, wr);
		if (err)
			break;
		wq->wrid[wq->pi & hcab_wq_mask(wq)] = wr->wr_id;
		wq->pi++;
	}
	if (err)
		*bad_wr = wr;
	hcab_wq_publish(ctx, qp, wq, start, offsetof(struct hca_qp_db, sq_pi),
			HCA_DB_SQ);
	pthread_spin_unlock(&wq->lock);
	return err;
}

/*
 * A receive WQE in slot idx of wq (a QP's receive queue or an SRQ): the
 * consumer's SGEs, and the wr_id the device hands back in the CQE.
 */
void hcab_write_recv_wqe(struct hcab_wq *wq, uint32_t idx, uint64_t hw_wr_id,
			 const struct ibv_recv_wr *wr)
{
	struct hca_recv_wqe *w = hcab_wqe(wq, idx);

	memset(w, 0, sizeof(*w));
	w->wr_id = hw_wr_id;
	w->num_sge = wr->num_sge;
	hcab_copy_sges((struct hca_sge *)(w + 1), wr->sg_list, wr->num_sge);
}

int hcab_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		   struct ibv_recv_wr **bad_wr)
{
	struct hcab_context *ctx = to_hctx(ibqp->context);
	struct hcab_qp *qp = to_hqp(ibqp);
	struct hcab_wq *wq = &qp->rq;
	uint32_t start;
	int err = 0;

	/* A QP on an SRQ has no receive queue of its own; none in RESET. */
	if (qp->srq || ibqp->state == IBV_QPS_RESET) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&wq->lock);
	start = wq->pi;
	for (; wr; wr = wr->next) {
		if (hcab_wq_full(wq)) {
			err = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > wq->max_sge) {
			err = EINVAL;
			break;
		}
		hcab_write_recv_wqe(wq, wq->pi, wq->pi, wr);
		wq->wrid[wq->pi & hcab_wq_mask(wq)] = wr->wr_id;
		wq->pi++;
	}
	if (err)
		*bad_wr = wr;
	hcab_wq_publish(ctx, qp, wq, start, offsetof(struct hca_qp_db, rq_pi),
			HCA_DB_RQ);
	pthread_spin_unlock(&wq->lock);
	return err;
}
