// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * Completion queues: the kernel's ring of CQEs, mapped, which the device
 * fills; the consumer index and the arm word in the CQ's record in the UAR.
 * poll_cq reads CQEs as hca_ib's does (cq.c there) and hands each back to
 * its QP's work queue through the wr_id index the WQE carried.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "hcab.h"
#include "hcab-abi.h"

/* A CQE's status passes through: both number it as ib_wc_status does. */
_Static_assert(HCA_WC_SUCCESS == IBV_WC_SUCCESS, "wc status");
_Static_assert(HCA_WC_LOC_LEN_ERR == IBV_WC_LOC_LEN_ERR, "wc status");
_Static_assert(HCA_WC_LOC_QP_OP_ERR == IBV_WC_LOC_QP_OP_ERR, "wc status");
_Static_assert(HCA_WC_LOC_PROT_ERR == IBV_WC_LOC_PROT_ERR, "wc status");
_Static_assert(HCA_WC_WR_FLUSH_ERR == IBV_WC_WR_FLUSH_ERR, "wc status");
_Static_assert(HCA_WC_BAD_RESP_ERR == IBV_WC_BAD_RESP_ERR, "wc status");
_Static_assert(HCA_WC_LOC_ACCESS_ERR == IBV_WC_LOC_ACCESS_ERR, "wc status");
_Static_assert(HCA_WC_REM_INV_REQ_ERR == IBV_WC_REM_INV_REQ_ERR, "wc status");
_Static_assert(HCA_WC_REM_ACCESS_ERR == IBV_WC_REM_ACCESS_ERR, "wc status");
_Static_assert(HCA_WC_REM_OP_ERR == IBV_WC_REM_OP_ERR, "wc status");
_Static_assert(HCA_WC_RETRY_EXC_ERR == IBV_WC_RETRY_EXC_ERR, "wc status");
_Static_assert(HCA_WC_RNR_RETRY_EXC_ERR == IBV_WC_RNR_RETRY_EXC_ERR, "wc status");
_Static_assert(HCA_WC_GENERAL_ERR == IBV_WC_GENERAL_ERR, "wc status");

/* A CQ of at least cqe entries: the kernel's ring, mapped. */
static struct hcab_cq *hcab_cq_create(struct ibv_context *ibctx, int cqe,
				      struct ibv_comp_channel *channel,
				      int comp_vector)
{
	struct hcab_context *ctx = to_hctx(ibctx);
	struct hcab_create_cq_resp resp = {};
	struct ibv_create_cq cmd = {};
	struct hcab_cq *cq;
	int err;

	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	err = pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	if (err) {
		errno = err;
		goto err_free;
	}
	err = ibv_cmd_create_cq(ibctx, cqe, channel, comp_vector, &cq->vcq.cq,
				&cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (err)
		goto err_lock;
	err = EINVAL;
	if (resp.drv.log_entries > HCA_MAX_CQ_LOG_CQE ||
	    resp.drv.db_slot >= HCA_UAR_CQ_SLOTS)
		goto err_destroy;
	cq->cqn = resp.drv.cqn;
	cq->log_entries = resp.drv.log_entries;
	cq->db = (char *)ctx->uar + HCA_UAR_CQ_OFFSET +
		 resp.drv.db_slot * sizeof(struct hca_cq_db);
	cq->ring = hcab_mmap(ctx, resp.drv.ring_mmap_offset,
			     sizeof(struct hca_cqe) << cq->log_entries,
			     &cq->map_bytes);
	err = errno;
	if (!cq->ring)
		goto err_destroy;
	return cq;

err_destroy:
	ibv_cmd_destroy_cq(&cq->vcq.cq);
err_lock:
	pthread_spin_destroy(&cq->lock);
	errno = err;
err_free:
	free(cq);
	return NULL;
}

struct ibv_cq *hcab_create_cq(struct ibv_context *ibctx, int cqe,
			      struct ibv_comp_channel *channel,
			      int comp_vector)
{
	struct hcab_cq *cq = hcab_cq_create(ibctx, cqe, channel, comp_vector);

	return cq ? &cq->vcq.cq : NULL;
}

int hcab_destroy_cq(struct ibv_cq *ibcq)
{
	struct hcab_cq *cq = to_hcq(ibcq);
	int ret;

	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;
	munmap(cq->ring, cq->map_bytes);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

/*
 * ibv_resize_cq: the kernel makes a new ring and the device moves the CQEs
 * not yet polled (by the consumer index in the CQ's record) to its first
 * slots; polling goes on from index 0 there. cq->lock is held throughout so
 * that no poll runs meanwhile. Should the new ring fail to map, the CQ is
 * lost to this process (the device fills a ring it cannot see): the error
 * says so, and destroy_cq still works.
 */
int hcab_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct hcab_context *ctx = to_hctx(ibcq->context);
	struct hcab_cq *cq = to_hcq(ibcq);
	struct hcab_resize_cq_resp resp = {};
	struct ibv_resize_cq cmd = {};
	struct hca_cqe *ring;
	size_t map_bytes;
	int err;

	pthread_spin_lock(&cq->lock);
	mmio_write32((char *)cq->db + offsetof(struct hca_cq_db, ci), cq->ci);
	err = ibv_cmd_resize_cq(ibcq, cqe, &cmd, sizeof(cmd), &resp.ibv_resp,
				sizeof(resp));
	if (err)
		goto out;
	err = EIO;
	if (resp.drv.log_entries > HCA_MAX_CQ_LOG_CQE)
		goto out;
	ring = hcab_mmap(ctx, resp.drv.ring_mmap_offset,
			 sizeof(struct hca_cqe) << resp.drv.log_entries,
			 &map_bytes);
	err = errno;
	if (!ring)
		goto out;
	munmap(cq->ring, cq->map_bytes);
	cq->ring = ring;
	cq->map_bytes = map_bytes;
	cq->log_entries = resp.drv.log_entries;
	cq->ci = 0;
	err = 0;
out:
	pthread_spin_unlock(&cq->lock);
	return err;
}

static struct hca_cqe *hcab_cqe_at(struct hcab_cq *cq, uint32_t idx)
{
	struct hca_cqe *cqe = &cq->ring[idx & ((1u << cq->log_entries) - 1)];
	uint8_t owner = atomic_load_explicit((_Atomic uint8_t *)&cqe->owner,
					     memory_order_relaxed);

	if (owner != hca_owner_bit(idx, cq->log_entries))
		return NULL;
	/* The owner byte is written last: read the rest only after it. */
	udma_from_device_barrier();
	return cqe;
}

static struct hcab_qp *hcab_qp_lookup(struct hcab_context *ctx, uint32_t qpn)
{
	if (qpn >= HCA_MAX_QP)
		return NULL;
	return atomic_load_explicit(&ctx->qp_table[qpn], memory_order_acquire);
}

/*
 * CQEs of a destroyed or reset QP still in the ring name slots of indices
 * that no longer hold (a later QP may even have the QPN), so they are marked
 * as no QP's and poll drops them. A receive the QP took from an SRQ is
 * another matter: the SRQ lives on. On destroy its tag is retired here (as
 * hca_ib does); on reset its CQE stays, so that the consumer gets the
 * wr_id back. The QP makes no more CQEs (the kernel destroyed or reset it
 * first).
 */
void hcab_cq_clean(struct hcab_cq *cq, struct hcab_qp *qp, bool destroyed)
{
	uint32_t mask = (1u << cq->log_entries) - 1, i;
	struct hca_cqe *cqe;
	bool srq_recv;

	pthread_spin_lock(&cq->lock);
	for (i = cq->ci; i - cq->ci <= mask; i++) {
		cqe = hcab_cqe_at(cq, i);
		if (!cqe)
			break;
		if (cqe->qpn != qp->qpn)
			continue;
		srq_recv = qp->srq && (cqe->opcode & HCA_CQE_OP_RECV);
		if (srq_recv && !destroyed)
			continue;
		if (srq_recv)
			hcab_srq_retire(qp->srq, cqe->wr_id);
		cqe->qpn = HCA_MAX_QP;
	}
	pthread_spin_unlock(&cq->lock);
}

/* The device's work-queue index in wr_id back to the consumer's wr_id. */
static uint64_t hcab_retire(struct hcab_wq *wq, uint64_t index)
{
	uint32_t idx = (uint32_t)index;

	/* Release: the slot's reuse follows our reads of it (its wr_id). */
	atomic_store_explicit(&wq->ci, idx + 1, memory_order_release);
	return wq->wrid[idx & hcab_wq_mask(wq)];
}

/*
 * A send CQE's opcode as libibverbs numbers it, each named: the two
 * numberings are not the same (the ABI's are the device's own).
 */
static enum ibv_wc_opcode hcab_wc_opcode(uint8_t op)
{
	switch (op) {
	case HCA_CQE_OP_SEND:
		return IBV_WC_SEND;
	case HCA_CQE_OP_RDMA_WRITE:
		return IBV_WC_RDMA_WRITE;
	case HCA_CQE_OP_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case HCA_CQE_OP_COMP_SWAP:
		return IBV_WC_COMP_SWAP;
	case HCA_CQE_OP_FETCH_ADD:
		return IBV_WC_FETCH_ADD;
	case HCA_CQE_OP_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case HCA_CQE_OP_BIND_MW:
		return IBV_WC_BIND_MW;
	case HCA_CQE_OP_ATOMIC_WRITE:
		return IBV_WC_ATOMIC_WRITE;
	default:
		/* No user WR makes another; a consumer sees a plain send. */
		return IBV_WC_SEND;
	}
}

/* False for a CQE of no QP of this context: the caller drops it. */
static bool hcab_cqe_to_wc(struct hcab_context *ctx, const struct hca_cqe *c,
			   struct ibv_wc *wc)
{
	struct hcab_qp *qp = hcab_qp_lookup(ctx, c->qpn);

	if (!qp)
		return false;
	wc->status = c->status;
	wc->vendor_err = 0;
	wc->byte_len = c->byte_len;
	wc->qp_num = c->qpn;
	wc->src_qp = c->src_qp;
	wc->wc_flags = 0;
	wc->pkey_index = c->pkey_index;
	wc->slid = c->slid;
	wc->sl = 0;
	wc->dlid_path_bits = 0;
	wc->imm_data = 0;
	/* imm is carried as the sender gave it (big-endian in ibv_send_wr). */
	if (c->flags & HCA_CQE_FLAG_IMM) {
		wc->wc_flags |= IBV_WC_WITH_IMM;
		wc->imm_data = (__be32)c->imm;
	}
	if (c->flags & HCA_CQE_FLAG_GRH)
		wc->wc_flags |= IBV_WC_GRH;
	if (c->flags & HCA_CQE_FLAG_INV) {
		wc->wc_flags |= IBV_WC_WITH_INV;
		wc->invalidated_rkey = c->imm;
	}
	if (c->opcode & HCA_CQE_OP_RECV) {
		wc->opcode = c->opcode == HCA_CQE_OP_RECV_RDMA_IMM ?
			     IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
		wc->wr_id = qp->srq ? hcab_srq_retire(qp->srq, c->wr_id) :
				      hcab_retire(&qp->rq, c->wr_id);
	} else {
		wc->opcode = hcab_wc_opcode(c->opcode);
		wc->wr_id = hcab_retire(&qp->sq, c->wr_id);
	}
	return true;
}

/*
 * The device checks for overflow, and fires an arm at once if CQEs are left,
 * by the consumer index in the CQ's record: publish it (if it moved since
 * `start`) before any later arm. Caller holds cq->lock.
 */
static void hcab_cq_publish_ci(struct hcab_cq *cq, uint32_t start)
{
	if (cq->ci != start)
		mmio_write32((char *)cq->db + offsetof(struct hca_cq_db, ci),
			     cq->ci);
}

int hcab_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct hcab_context *ctx = to_hctx(ibcq->context);
	struct hcab_cq *cq = to_hcq(ibcq);
	struct hca_cqe *cqe;
	uint32_t start;
	int n = 0;

	pthread_spin_lock(&cq->lock);
	start = cq->ci;
	while (n < num && (cqe = hcab_cqe_at(cq, cq->ci))) {
		if (hcab_cqe_to_wc(ctx, cqe, &wc[n]))
			n++;
		cq->ci++;
	}
	hcab_cq_publish_ci(cq, start);
	pthread_spin_unlock(&cq->lock);
	return n;
}

/*
 * The extended CQ's polling (ibv_start_poll, ibv_next_poll, ibv_end_poll):
 * the same CQEs as poll_cq, one at a time into cq->cur, which the read_*
 * calls answer from. cq->lock is held from a successful start_poll to
 * end_poll, as the API lets one thread poll between them.
 */
static int hcab_cq_next(struct hcab_cq *cq)
{
	struct hcab_context *ctx = to_hctx(cq->vcq.cq.context);
	struct hca_cqe *cqe;

	while ((cqe = hcab_cqe_at(cq, cq->ci))) {
		bool ours = hcab_cqe_to_wc(ctx, cqe, &cq->cur);

		cq->ci++;
		if (ours) {
			cq->vcq.cq_ex.wr_id = cq->cur.wr_id;
			cq->vcq.cq_ex.status = cq->cur.status;
			return 0;
		}
	}
	return ENOENT;
}

static int hcab_start_poll(struct ibv_cq_ex *ibcq, struct ibv_poll_cq_attr *attr)
{
	struct hcab_cq *cq = to_hcq(ibv_cq_ex_to_cq(ibcq));
	int ret;

	if (attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&cq->lock);
	cq->poll_start = cq->ci;
	ret = hcab_cq_next(cq);
	if (ret) {
		/* No end_poll follows an empty start_poll. */
		hcab_cq_publish_ci(cq, cq->poll_start);
		pthread_spin_unlock(&cq->lock);
	}
	return ret;
}

static int hcab_next_poll(struct ibv_cq_ex *ibcq)
{
	return hcab_cq_next(to_hcq(ibv_cq_ex_to_cq(ibcq)));
}

static void hcab_end_poll(struct ibv_cq_ex *ibcq)
{
	struct hcab_cq *cq = to_hcq(ibv_cq_ex_to_cq(ibcq));

	hcab_cq_publish_ci(cq, cq->poll_start);
	pthread_spin_unlock(&cq->lock);
}

static const struct ibv_wc *hcab_cur(struct ibv_cq_ex *ibcq)
{
	return &to_hcq(ibv_cq_ex_to_cq(ibcq))->cur;
}

static enum ibv_wc_opcode hcab_read_opcode(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->opcode;
}

static uint32_t hcab_read_vendor_err(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->vendor_err;
}

static uint32_t hcab_read_byte_len(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->byte_len;
}

/* Immediate data, or the invalidated rkey (they share the field). */
static __be32 hcab_read_imm_data(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->imm_data;
}

static uint32_t hcab_read_qp_num(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->qp_num;
}

static uint32_t hcab_read_src_qp(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->src_qp;
}

static unsigned int hcab_read_wc_flags(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->wc_flags;
}

static uint32_t hcab_read_slid(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->slid;
}

static uint8_t hcab_read_sl(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->sl;
}

static uint8_t hcab_read_dlid_path_bits(struct ibv_cq_ex *ibcq)
{
	return hcab_cur(ibcq)->dlid_path_bits;
}

/*
 * ibv_create_cq_ex: the fields of a plain work completion (a CQE carries no
 * timestamp, VLAN, flow tag or tag-matching state), no parent domain, and
 * of the creation flags only SINGLE_THREADED (a hint the locks can ignore).
 */
struct ibv_cq_ex *hcab_create_cq_ex(struct ibv_context *ibctx,
				    struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_cq_ex *ex;
	struct hcab_cq *cq;

	if (attr->wc_flags & ~(uint64_t)IBV_WC_STANDARD_FLAGS ||
	    attr->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS ||
	    (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS &&
	     attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->cqe > INT32_MAX) {
		errno = EINVAL;
		return NULL;
	}
	cq = hcab_cq_create(ibctx, attr->cqe, attr->channel, attr->comp_vector);
	if (!cq)
		return NULL;
	ex = &cq->vcq.cq_ex;
	ex->start_poll = hcab_start_poll;
	ex->next_poll = hcab_next_poll;
	ex->end_poll = hcab_end_poll;
	ex->read_opcode = hcab_read_opcode;
	ex->read_vendor_err = hcab_read_vendor_err;
	ex->read_wc_flags = hcab_read_wc_flags;
	if (attr->wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		ex->read_byte_len = hcab_read_byte_len;
	if (attr->wc_flags & IBV_WC_EX_WITH_IMM)
		ex->read_imm_data = hcab_read_imm_data;
	if (attr->wc_flags & IBV_WC_EX_WITH_QP_NUM)
		ex->read_qp_num = hcab_read_qp_num;
	if (attr->wc_flags & IBV_WC_EX_WITH_SRC_QP)
		ex->read_src_qp = hcab_read_src_qp;
	if (attr->wc_flags & IBV_WC_EX_WITH_SLID)
		ex->read_slid = hcab_read_slid;
	if (attr->wc_flags & IBV_WC_EX_WITH_SL)
		ex->read_sl = hcab_read_sl;
	if (attr->wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		ex->read_dlid_path_bits = hcab_read_dlid_path_bits;
	return ex;
}

int hcab_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct hcab_context *ctx = to_hctx(ibcq->context);
	struct hcab_cq *cq = to_hcq(ibcq);

	pthread_spin_lock(&cq->lock);
	/* A new sequence number arms the CQ once. */
	cq->arm_sn++;
	mmio_write32((char *)cq->db + offsetof(struct hca_cq_db, arm),
		     cq->arm_sn << 1 | !!solicited_only);
	hcab_ring(ctx, HCA_DB_CQ_ARM);
	pthread_spin_unlock(&cq->lock);
	return 0;
}
