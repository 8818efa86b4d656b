// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * Queue pairs (RC and UD). The kernel sizes and allocates the rings from
 * the standard caps and runs every state change; the process maps the
 * rings, keeps the QP in its QPN table for poll_cq, and restarts its
 * indices when the QP is reset, as hca_ib's qp.c does.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "hcab.h"
#include "hcab-abi.h"

/* The SGEs a WQE of 1 << wqe_shift bytes holds after its hdr-byte header. */
static uint32_t hcab_max_sge(uint32_t wqe_shift, uint32_t hdr)
{
	uint32_t n = ((1u << wqe_shift) - hdr) / sizeof(struct hca_sge);

	return n < HCA_MAX_SGE ? n : HCA_MAX_SGE;
}

/*
 * Maps the ring of a work queue whose log_entries and wqe_shift the kernel
 * chose (checked here against the device's limits: the process indexes the
 * mapping with them) and allocates its wr_id array.
 */
int hcab_wq_map(struct hcab_context *ctx, struct hcab_wq *wq, uint64_t offset,
		uint32_t log_entries, uint32_t wqe_shift, uint32_t hdr,
		uint32_t min_shift, uint32_t max_shift)
{
	int err;

	if (log_entries > HCA_MAX_QP_LOG_WR || wqe_shift < min_shift ||
	    wqe_shift > max_shift)
		return EINVAL;
	wq->log_entries = log_entries;
	wq->wqe_shift = wqe_shift;
	wq->max_sge = hcab_max_sge(wqe_shift, hdr);
	wq->wrid = calloc((size_t)1 << log_entries, sizeof(*wq->wrid));
	if (!wq->wrid)
		return ENOMEM;
	err = pthread_spin_init(&wq->lock, PTHREAD_PROCESS_PRIVATE);
	if (err)
		goto err_wrid;
	wq->ring = hcab_mmap(ctx, offset, (size_t)1 << (log_entries + wqe_shift),
			     &wq->map_bytes);
	if (!wq->ring) {
		err = errno;
		goto err_lock;
	}
	return 0;

err_lock:
	pthread_spin_destroy(&wq->lock);
err_wrid:
	free(wq->wrid);
	wq->wrid = NULL;
	return err;
}

void hcab_wq_unmap(struct hcab_wq *wq)
{
	if (!wq->ring)
		return;
	munmap(wq->ring, wq->map_bytes);
	pthread_spin_destroy(&wq->lock);
	free(wq->wrid);
	wq->ring = NULL;
}

static void hcab_qp_publish(struct hcab_context *ctx, uint32_t qpn,
			    struct hcab_qp *qp)
{
	atomic_store_explicit(&ctx->qp_table[qpn], qp, memory_order_release);
}

struct ibv_qp *hcab_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct hcab_context *ctx = to_hctx(pd->context);
	struct hcab_create_qp_resp resp = {};
	struct hcab_create_qp cmd = {};
	struct hcab_qp *qp;
	uint32_t room;
	int err;

	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC &&
	    attr->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	/*
	 * Named in the UAR's ring where the device reads it (a kernel that
	 * does not know the command makes an unnamed QP: the device then
	 * ignores the names and looks at the QP on every doorbell).
	 */
	qp->sq_named = ctx->sq_ring;
	if (qp->sq_named)
		cmd.drv.flags = HCA_UCREATE_QP_SQ_RING;
	err = ibv_cmd_create_qp(pd, &qp->vqp.qp, attr, &cmd.ibv_cmd,
				sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (err)
		goto err_free;
	qp->qpn = resp.drv.qpn;
	qp->srq = attr->srq ? to_hsrq(attr->srq) : NULL;
	err = EINVAL;
	if (qp->qpn >= HCA_MAX_QP || qp->qpn != qp->vqp.qp.qp_num ||
	    resp.drv.db_slot >= HCA_UAR_QP_SLOTS)
		goto err_destroy;
	qp->db = (char *)ctx->uar + HCA_UAR_QP_OFFSET +
		 resp.drv.db_slot * sizeof(struct hca_qp_db);
	err = hcab_wq_map(ctx, &qp->sq, resp.drv.sq_mmap_offset,
			  resp.drv.sq_log_entries, resp.drv.sq_wqe_shift,
			  sizeof(struct hca_send_wqe), HCA_MIN_SQ_WQE_SHIFT,
			  HCA_MAX_SQ_WQE_SHIFT);
	if (err)
		goto err_destroy;
	if (!qp->srq) {
		err = hcab_wq_map(ctx, &qp->rq, resp.drv.rq_mmap_offset,
				  resp.drv.rq_log_entries, resp.drv.rq_wqe_shift,
				  sizeof(struct hca_recv_wqe),
				  HCA_MIN_RQ_WQE_SHIFT, HCA_MAX_RQ_WQE_SHIFT);
		if (err)
			goto err_sq;
	}
	/* Inline data fills the WQE after its header, and no further. */
	room = (1u << qp->sq.wqe_shift) - sizeof(struct hca_send_wqe);
	qp->max_inline = resp.drv.max_inline;
	if (qp->max_inline > room)
		qp->max_inline = room;
	if (qp->max_inline > HCA_MAX_INLINE)
		qp->max_inline = HCA_MAX_INLINE;
	attr->cap.max_inline_data = qp->max_inline;

	/*
	 * Under the mutex: a QP destroyed with this QPN left the table and its
	 * CQs before the mutex was let go (hcab_destroy_qp).
	 */
	pthread_mutex_lock(&ctx->qp_table_mutex);
	hcab_qp_publish(ctx, qp->qpn, qp);
	pthread_mutex_unlock(&ctx->qp_table_mutex);
	return &qp->vqp.qp;

err_sq:
	hcab_wq_unmap(&qp->sq);
err_destroy:
	ibv_cmd_destroy_qp(&qp->vqp.qp);
err_free:
	free(qp);
	errno = err;
	return NULL;
}

/*
 * The QP was reset: the device emptied its queues and zeroed the record.
 * Its CQEs left in the CQs are dropped (they name slots of the old
 * indices), as mlx4 and mthca do, and the indices start again from 0, as
 * hca_ib's hca_qp_reset_indices does.
 */
static void hcab_qp_reset(struct hcab_qp *qp)
{
	struct ibv_qp *ibqp = &qp->vqp.qp;

	hcab_cq_clean(to_hcq(ibqp->send_cq), qp, false);
	if (ibqp->recv_cq != ibqp->send_cq)
		hcab_cq_clean(to_hcq(ibqp->recv_cq), qp, false);
	pthread_spin_lock(&qp->sq.lock);
	qp->sq.pi = 0;
	atomic_store_explicit(&qp->sq.ci, 0, memory_order_relaxed);
	pthread_spin_unlock(&qp->sq.lock);
	if (qp->srq)
		return;
	pthread_spin_lock(&qp->rq.lock);
	qp->rq.pi = 0;
	atomic_store_explicit(&qp->rq.ci, 0, memory_order_relaxed);
	pthread_spin_unlock(&qp->rq.lock);
}

int hcab_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct ibv_modify_qp cmd = {};
	int ret;

	ret = ibv_cmd_modify_qp(ibqp, attr, mask, &cmd, sizeof(cmd));
	if (ret)
		return ret;
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET)
		hcab_qp_reset(to_hqp(ibqp));
	return 0;
}

int hcab_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
		  struct ibv_qp_init_attr *init)
{
	struct ibv_query_qp cmd = {};

	return ibv_cmd_query_qp(ibqp, attr, mask, init, &cmd, sizeof(cmd));
}

int hcab_destroy_qp(struct ibv_qp *ibqp)
{
	struct hcab_context *ctx = to_hctx(ibqp->context);
	struct hcab_qp *qp = to_hqp(ibqp);
	int ret;

	/*
	 * From DESTROY_QP on, the kernel may give the QPN to a new QP; the
	 * mutex keeps that QP out of the table until this one has left it and
	 * no CQE of this one is left for it to take.
	 */
	pthread_mutex_lock(&ctx->qp_table_mutex);
	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret) {
		pthread_mutex_unlock(&ctx->qp_table_mutex);
		return ret;
	}
	hcab_qp_publish(ctx, qp->qpn, NULL);
	/* Pollers that found the QP finish under the CQ locks this takes. */
	hcab_cq_clean(to_hcq(ibqp->send_cq), qp, true);
	if (ibqp->recv_cq != ibqp->send_cq)
		hcab_cq_clean(to_hcq(ibqp->recv_cq), qp, true);
	pthread_mutex_unlock(&ctx->qp_table_mutex);
	hcab_wq_unmap(&qp->rq);
	hcab_wq_unmap(&qp->sq);
	free(qp);
	return 0;
}
