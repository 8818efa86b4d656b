// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * Extended QPs (ibv_create_qp_ex) and their send API: ibv_wr_start, one
 * ibv_wr_<opcode> per WR followed by its ibv_wr_set_* calls, then
 * ibv_wr_complete or ibv_wr_abort. The WQEs are post_send's, built a call
 * at a time in the ring; nothing reaches the device before wr_complete
 * publishes the batch's producer index.
 *
 * Locking: wr_start takes the send queue's lock and wr_complete or wr_abort
 * lets it go, so a batch is one thread's, as the API requires. A WR the QP
 * cannot take (an opcode it was not made with, a full queue, too many SGEs
 * or too much inline data) marks the batch failed: wr_complete then posts
 * none of it and returns the first error.
 */
#include <config.h>

#include <errno.h>
#include <string.h>

#include "hcab.h"

/* The opcodes a QP of each type can be made with. */
#define HCAB_RC_SEND_OPS                                                     \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                \
	 IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |          \
	 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |     \
	 IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | \
	 IBV_QP_EX_WITH_ATOMIC_WRITE | HCAB_LOCAL_OPS)
#define HCAB_UD_SEND_OPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)
#define HCAB_UC_SEND_OPS                                                     \
	(HCAB_UD_SEND_OPS | IBV_QP_EX_WITH_RDMA_WRITE |                       \
	 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | HCAB_LOCAL_OPS)
/* Memory windows, a connected QP's. */
#define HCAB_LOCAL_OPS (IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV)

static struct hcab_qp *to_hqpx(struct ibv_qp_ex *qpx)
{
	return container_of(qpx, struct hcab_qp, vqp.qp_ex);
}

static void hcab_wr_fail(struct hcab_qp *qp, int err)
{
	if (!qp->wr_err)
		qp->wr_err = err;
	qp->wr_cur = NULL;
}

/* Opens the batch's next WQE, for opcode op that ops_flag allows. */
static struct hca_send_wqe *hcab_wr_open(struct ibv_qp_ex *qpx, uint8_t op,
					 uint64_t ops_flag)
{
	struct hcab_qp *qp = to_hqpx(qpx);
	struct hcab_wq *wq = &qp->sq;
	struct hca_send_wqe *w;

	if (qp->wr_err)
		return NULL;
	if (!(qp->send_ops & ops_flag)) {
		hcab_wr_fail(qp, EINVAL);
		return NULL;
	}
	if (hcab_wq_full(wq)) {
		hcab_wr_fail(qp, ENOMEM);
		return NULL;
	}
	w = hcab_wqe(wq, wq->pi);
	memset(w, 0, sizeof(*w));
	w->wr_id = wq->pi;
	w->opcode = op;
	w->flags = hcab_wqe_flags(qpx->wr_flags);
	wq->wrid[wq->pi & hcab_wq_mask(wq)] = qpx->wr_id;
	wq->pi++;
	qp->wr_cur = w;
	return w;
}

static void hcab_wr_remote(struct ibv_qp_ex *qpx, uint8_t op, uint64_t flag,
			   uint32_t rkey, uint64_t remote_addr)
{
	struct hca_send_wqe *w = hcab_wr_open(qpx, op, flag);

	if (!w)
		return;
	w->rkey = rkey;
	w->remote_addr = remote_addr;
}

static void hcab_wr_send(struct ibv_qp_ex *qpx)
{
	hcab_wr_open(qpx, HCA_WR_SEND, IBV_QP_EX_WITH_SEND);
}

static void hcab_wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm)
{
	struct hca_send_wqe *w = hcab_wr_open(qpx, HCA_WR_SEND_IMM,
					      IBV_QP_EX_WITH_SEND_WITH_IMM);

	/* imm travels as the consumer gave it (big-endian), as post_send's. */
	if (w)
		w->imm = (uint32_t)imm;
}

static void hcab_wr_send_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
	struct hca_send_wqe *w = hcab_wr_open(qpx, HCA_WR_SEND_INV,
					      IBV_QP_EX_WITH_SEND_WITH_INV);

	if (w)
		w->imm = rkey;
}

static void hcab_wr_local_inv(struct ibv_qp_ex *qpx, uint32_t rkey)
{
	struct hca_send_wqe *w = hcab_wr_open(qpx, HCA_WR_LOCAL_INV,
					      IBV_QP_EX_WITH_LOCAL_INV);

	if (w)
		w->imm = rkey;
	/* No data: an SGE set after it has nowhere to go. */
	to_hqpx(qpx)->wr_cur = NULL;
}

static void hcab_wr_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw,
			    uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	struct hca_send_wqe *w = hcab_wr_open(qpx, HCA_WR_BIND_MW,
					      IBV_QP_EX_WITH_BIND_MW);

	if (w)
		hcab_fill_bind_mw((struct hca_bind_mw_wqe *)w, mw, rkey, info);
	to_hqpx(qpx)->wr_cur = NULL;
}

static void hcab_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey,
			       uint64_t remote_addr)
{
	hcab_wr_remote(qpx, HCA_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE, rkey,
		       remote_addr);
}

static void hcab_wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey,
				   uint64_t remote_addr, __be32 imm)
{
	struct hcab_qp *qp = to_hqpx(qpx);

	hcab_wr_remote(qpx, HCA_WR_RDMA_WRITE_IMM,
		       IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, rkey, remote_addr);
	if (qp->wr_cur)
		qp->wr_cur->imm = (uint32_t)imm;
}

static void hcab_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey,
			      uint64_t remote_addr)
{
	hcab_wr_remote(qpx, HCA_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ, rkey,
		       remote_addr);
}

static void hcab_wr_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey,
				   uint64_t remote_addr, uint64_t compare,
				   uint64_t swap)
{
	struct hcab_qp *qp = to_hqpx(qpx);

	hcab_wr_remote(qpx, HCA_WR_ATOMIC_CMP_SWP,
		       IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, rkey, remote_addr);
	if (qp->wr_cur) {
		qp->wr_cur->compare_add = compare;
		qp->wr_cur->swap = swap;
	}
}

static void hcab_wr_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey,
				     uint64_t remote_addr, uint64_t add)
{
	struct hcab_qp *qp = to_hqpx(qpx);

	hcab_wr_remote(qpx, HCA_WR_ATOMIC_FETCH_ADD,
		       IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, rkey, remote_addr);
	if (qp->wr_cur)
		qp->wr_cur->compare_add = add;
}

/* The 8 bytes travel in the WQE, as the consumer gave them: no SGE. */
static void hcab_wr_atomic_write(struct ibv_qp_ex *qpx, uint32_t rkey,
				 uint64_t remote_addr, const void *atomic_wr)
{
	struct hcab_qp *qp = to_hqpx(qpx);

	hcab_wr_remote(qpx, HCA_WR_ATOMIC_WRITE, IBV_QP_EX_WITH_ATOMIC_WRITE,
		       rkey, remote_addr);
	if (qp->wr_cur)
		memcpy(&qp->wr_cur->compare_add, atomic_wr, 8);
	qp->wr_cur = NULL;
}

static void hcab_wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah,
				uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct hcab_qp *qp = to_hqpx(qpx);
	struct hca_send_wqe *w = qp->wr_cur;

	if (!w || qp->vqp.qp.qp_type != IBV_QPT_UD)
		return;
	if (!ah) {
		hcab_wr_fail(qp, EINVAL);
		return;
	}
	w->ud_dlid = to_hah(ah)->dlid;
	w->ud_remote_qpn = remote_qpn;
	w->ud_qkey = remote_qkey;
}

static void hcab_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge,
				 const struct ibv_sge *sg_list)
{
	struct hcab_qp *qp = to_hqpx(qpx);
	struct hca_send_wqe *w = qp->wr_cur;
	struct hca_sge *sge;
	size_t i;

	if (!w)
		return;
	if (num_sge > qp->sq.max_sge) {
		hcab_wr_fail(qp, EINVAL);
		return;
	}
	sge = (struct hca_sge *)(w + 1);
	for (i = 0; i < num_sge; i++) {
		sge[i].addr = sg_list[i].addr;
		sge[i].length = sg_list[i].length;
		sge[i].lkey = sg_list[i].lkey;
	}
	w->num_sge = num_sge;
}

static void hcab_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey,
			    uint64_t addr, uint32_t length)
{
	const struct ibv_sge sge = { .addr = addr, .length = length,
				     .lkey = lkey };

	hcab_wr_set_sge_list(qpx, 1, &sge);
}

/*
 * Inline data is copied into the WQE now. Only data the requester sends
 * can be: a read's or an atomic's buffer is where the response lands.
 */
static void hcab_wr_set_inline_data_list(struct ibv_qp_ex *qpx,
					 size_t num_buf,
					 const struct ibv_data_buf *bufs)
{
	struct hcab_qp *qp = to_hqpx(qpx);
	struct hca_send_wqe *w = qp->wr_cur;
	uint8_t *dst;
	size_t i, len = 0;

	if (!w)
		return;
	if (w->opcode == HCA_WR_RDMA_READ ||
	    w->opcode == HCA_WR_ATOMIC_CMP_SWP ||
	    w->opcode == HCA_WR_ATOMIC_FETCH_ADD) {
		hcab_wr_fail(qp, EINVAL);
		return;
	}
	dst = (uint8_t *)(w + 1);
	for (i = 0; i < num_buf; i++) {
		if (bufs[i].length > qp->max_inline - len) {
			hcab_wr_fail(qp, EINVAL);
			return;
		}
		memcpy(dst + len, bufs[i].addr, bufs[i].length);
		len += bufs[i].length;
	}
	w->inline_len = len;
	w->num_sge = 0;
	w->flags |= HCA_WQE_INLINE;
}

static void hcab_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr,
				    size_t length)
{
	const struct ibv_data_buf buf = { .addr = addr, .length = length };

	hcab_wr_set_inline_data_list(qpx, 1, &buf);
}

static void hcab_wr_start(struct ibv_qp_ex *qpx)
{
	struct hcab_qp *qp = to_hqpx(qpx);

	pthread_spin_lock(&qp->sq.lock);
	qp->wr_start_pi = qp->sq.pi;
	qp->wr_err = 0;
	qp->wr_cur = NULL;
}

/* Forgets the batch's WQEs: nothing was published, the slots are free. */
static void hcab_wr_drop(struct hcab_qp *qp)
{
	qp->sq.pi = qp->wr_start_pi;
	qp->wr_cur = NULL;
}

static int hcab_wr_complete(struct ibv_qp_ex *qpx)
{
	struct hcab_context *ctx = to_hctx(qpx->qp_base.context);
	struct hcab_qp *qp = to_hqpx(qpx);
	int err = qp->wr_err;

	/* As post_send: not before RTS, in the state this process last set. */
	if (!err && qpx->qp_base.state < IBV_QPS_RTS)
		err = EINVAL;
	if (err)
		hcab_wr_drop(qp);
	else
		hcab_wq_publish(ctx, qp, &qp->sq, qp->wr_start_pi,
				offsetof(struct hca_qp_db, sq_pi), HCA_DB_SQ);
	pthread_spin_unlock(&qp->sq.lock);
	return err;
}

static void hcab_wr_abort(struct ibv_qp_ex *qpx)
{
	struct hcab_qp *qp = to_hqpx(qpx);

	hcab_wr_drop(qp);
	pthread_spin_unlock(&qp->sq.lock);
}

static void hcab_qp_ex_init(struct hcab_qp *qp, uint64_t ops)
{
	struct ibv_qp_ex *x = &qp->vqp.qp_ex;

	qp->send_ops = ops;
	qp->vqp.comp_mask |= VERBS_QP_EX;
	x->wr_start = hcab_wr_start;
	x->wr_complete = hcab_wr_complete;
	x->wr_abort = hcab_wr_abort;
	x->wr_send = hcab_wr_send;
	x->wr_send_imm = hcab_wr_send_imm;
	x->wr_send_inv = hcab_wr_send_inv;
	x->wr_local_inv = hcab_wr_local_inv;
	x->wr_bind_mw = hcab_wr_bind_mw;
	x->wr_rdma_write = hcab_wr_rdma_write;
	x->wr_rdma_write_imm = hcab_wr_rdma_write_imm;
	x->wr_rdma_read = hcab_wr_rdma_read;
	x->wr_atomic_cmp_swp = hcab_wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = hcab_wr_atomic_fetch_add;
	x->wr_atomic_write = hcab_wr_atomic_write;
	x->wr_set_ud_addr = hcab_wr_set_ud_addr;
	x->wr_set_sge = hcab_wr_set_sge;
	x->wr_set_sge_list = hcab_wr_set_sge_list;
	x->wr_set_inline_data = hcab_wr_set_inline_data;
	x->wr_set_inline_data_list = hcab_wr_set_inline_data_list;
}

/*
 * ibv_create_qp_ex: an RC or UD QP as create_qp makes it, with the extended
 * send API where send_ops_flags asks for it. No creation flags, TSO, XRC or
 * parent domain: the device has none.
 */
struct ibv_qp *hcab_create_qp_ex(struct ibv_context *ibctx,
				 struct ibv_qp_init_attr_ex *attr)
{
	const uint32_t known = IBV_QP_INIT_ATTR_PD |
			       IBV_QP_INIT_ATTR_CREATE_FLAGS |
			       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	struct ibv_qp_init_attr init;
	uint64_t ops = 0, allowed;
	struct ibv_qp *ibqp;

	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		errno = EINVAL;
		return NULL;
	}
	if (attr->comp_mask & ~known ||
	    (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS &&
	     attr->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		ops = attr->send_ops_flags;
		switch (attr->qp_type) {
		case IBV_QPT_UD:
			allowed = HCAB_UD_SEND_OPS;
			break;
		case IBV_QPT_UC:
			allowed = HCAB_UC_SEND_OPS;
			break;
		default:
			allowed = HCAB_RC_SEND_OPS;
		}
		if (ops & ~allowed) {
			errno = EOPNOTSUPP;
			return NULL;
		}
	}
	init = (struct ibv_qp_init_attr){
		.qp_context = attr->qp_context,
		.send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq,
		.srq = attr->srq,
		.cap = attr->cap,
		.qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all,
	};
	ibqp = hcab_create_qp(attr->pd, &init);
	if (!ibqp)
		return NULL;
	attr->cap = init.cap;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		hcab_qp_ex_init(to_hqp(ibqp), ops);
	return ibqp;
}
