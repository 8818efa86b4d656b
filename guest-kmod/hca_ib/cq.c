// SPDX-License-Identifier: GPL-2.0
/*
 * Completion queues: a ring of CQEs in guest RAM that the device fills,
 * a consumer index and an arm word in the CQ's BAR2 doorbell record.
 *
 * Locking: cq->lock (irqsave: poll_cq runs in completion handlers) guards
 * ci and arm_sn. Under it, poll_cq looks QPs up and advances their work
 * queues' consumer indices, of which it is the only writer; destroy_qp
 * takes this lock once after unpublishing a QP, so no poller still uses it.
 */
#include <linux/interrupt.h>
#include "hca_ib.h"

static void __iomem *hca_cq_db(struct hca_dev *dev, u32 cqn)
{
	return dev->bar2 + HCA_BAR2_CQ_DB_OFFSET + cqn * sizeof(struct hca_cq_db);
}

/*
 * A process's CQ ring: mapped by it through an mmap entry, which frees the
 * ring once the CQ is gone and the process unmapped it; and the CQ's slot
 * in the process's UAR.
 */
static int hca_cq_alloc_user(struct hca_dev *dev, struct hca_cq *cq,
			     struct ib_udata *udata,
			     struct hca_ucreate_cq_resp *resp, u32 *db_offset)
{
	struct hca_wq ring = { .ring_bytes = cq->ring_bytes };
	int err;

	cq->uc = rdma_udata_to_drv_context(udata, struct hca_ucontext, ibuc);
	cq->db_slot = hca_uar_slot_get(cq->uc, HCA_UAR_CQ, db_offset);
	if (cq->db_slot < 0)
		return cq->db_slot;
	err = hca_wq_alloc_user(dev, cq->uc, &ring, &resp->ring_mmap_offset);
	if (err) {
		hca_uar_slot_put(cq->uc, HCA_UAR_CQ, cq->db_slot);
		return err;
	}
	cq->ring = ring.ring;
	cq->ring_dma = ring.ring_dma;
	cq->mmap = ring.mmap;
	resp->log_entries = cq->log_entries;
	resp->db_slot = cq->db_slot;
	return 0;
}

static void hca_cq_free_ring(struct hca_dev *dev, struct hca_cq *cq)
{
	struct hca_wq ring = { .mmap = cq->mmap };

	if (!cq->uc) {
		dma_free_coherent(&dev->pdev->dev, cq->ring_bytes, cq->ring,
				  cq->ring_dma);
		return;
	}
	hca_wq_free_user(&ring);
	hca_uar_slot_put(cq->uc, HCA_UAR_CQ, cq->db_slot);
}

int hca_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		  hcab_create_cq_arg *arg)
{
	struct ib_udata *udata = hcab_create_cq_udata(arg);
	struct hca_dev *dev = to_hdev(ibcq->device);
	struct hca_cq *cq = to_hcq(ibcq);
	struct hca_ucreate_cq_resp resp = {};
	struct hca_cmd_create_cq in = {};
	struct hca_cmd_handle out;
	unsigned long flags;
	int err;

	if (attr->flags)
		return -EOPNOTSUPP;
	if (attr->cqe < 1 || attr->cqe > (1 << HCA_MAX_CQ_LOG_CQE))
		return -EINVAL;
	cq->log_entries = max(order_base_2(attr->cqe), 1);
	cq->ring_bytes = sizeof(struct hca_cqe) << cq->log_entries;
	if (udata) {
		err = hca_cq_alloc_user(dev, cq, udata, &resp, &in.db_offset);
		if (err)
			return err;
	} else {
		cq->ring = dma_alloc_coherent(&dev->pdev->dev, cq->ring_bytes,
					      &cq->ring_dma, GFP_KERNEL);
		if (!cq->ring)
			return -ENOMEM;
	}
	spin_lock_init(&cq->lock);
	mutex_init(&cq->resize_lock);
	INIT_LIST_HEAD(&cq->send_qps);
	INIT_LIST_HEAD(&cq->recv_qps);
	cq->vector = HCA_VEC_COMP_FIRST + attr->comp_vector % HCA_IB_NUM_COMP_VECTORS;
	in.ring_addr = cq->ring_dma;
	in.log_entries = cq->log_entries;
	in.vector = cq->vector;
	err = hca_cmd(dev, HCA_CMD_CREATE_CQ, &in, sizeof(in), &out, sizeof(out));
	if (err)
		goto err_ring;
	if (out.handle >= HCA_MAX_CQ) {
		err = -EIO;
		goto err_ring;
	}
	cq->cqn = out.handle;
	ibcq->cqe = 1 << cq->log_entries;
	if (udata) {
		resp.cqn = cq->cqn;
		err = ib_copy_to_udata(udata, &resp,
				       min(sizeof(resp), udata->outlen));
		if (err) {
			/* The device may still write a CQ it could not destroy. */
			if (hca_cmd_handle(dev, HCA_CMD_DESTROY_CQ, cq->cqn)) {
				WARN_ONCE(1, "hca_ib: CQ %#x not destroyed: its ring is leaked\n",
					  cq->cqn);
				return err;
			}
			goto err_ring;
		}
	}
	spin_lock_irqsave(&dev->table_lock, flags);
	WRITE_ONCE(dev->cqs[cq->cqn], cq);
	spin_unlock_irqrestore(&dev->table_lock, flags);
	return 0;

err_ring:
	hca_cq_free_ring(dev, cq);
	return err;
}

int hca_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibcq->device);
	struct hca_cq *cq = to_hcq(ibcq);
	unsigned long flags;
	int err;

	err = hca_cmd_handle(dev, HCA_CMD_DESTROY_CQ, cq->cqn);
	if (err)
		return err;
	/*
	 * The device may already have given the CQN to a new CQ, which may
	 * already be published: only our own entry goes.
	 */
	spin_lock_irqsave(&dev->table_lock, flags);
	if (dev->cqs[cq->cqn] == cq)
		WRITE_ONCE(dev->cqs[cq->cqn], NULL);
	spin_unlock_irqrestore(&dev->table_lock, flags);
	/* Handlers that found the CQ before it was unpublished finish first. */
	synchronize_irq(dev->irq[cq->vector]);
	synchronize_irq(dev->irq[HCA_VEC_ASYNC]);
	hca_cq_free_ring(dev, cq);
	return 0;
}

/*
 * A process's CQ moves to a new ring (ibv_resize_cq): its provider holds the
 * CQ's lock across the call, so nothing polls meanwhile; the device moves the
 * unpolled CQEs to the new ring's first slots and the provider polls on from
 * index 0 there. The old ring goes when the process unmaps it. Kernel CQs are
 * not resized: their pollers run in interrupt context, where nothing could
 * wait out the command, and no kernel consumer asks.
 */
int hca_resize_cq(struct ib_cq *ibcq, int entries, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibcq->device);
	struct hca_cq *cq = to_hcq(ibcq);
	struct hca_ucreate_cq_resp resp = {};
	struct hca_cmd_resize_cq in = {};
	struct hca_wq ring = {}, old = {};
	u32 log;
	int err;

	if (!udata || !cq->uc)
		return -EOPNOTSUPP;
	if (entries < 1 || entries > (1 << HCA_MAX_CQ_LOG_CQE))
		return -EINVAL;
	log = max(order_base_2(entries), 1);
	mutex_lock(&cq->resize_lock);
	ring.ring_bytes = sizeof(struct hca_cqe) << log;
	err = hca_wq_alloc_user(dev, cq->uc, &ring, &resp.ring_mmap_offset);
	if (err)
		goto out;
	in.ring_addr = ring.ring_dma;
	in.cqn = cq->cqn;
	in.log_entries = log;
	/* Too small for the CQEs not yet polled: -EINVAL, and nothing moved. */
	err = hca_cmd(dev, HCA_CMD_RESIZE_CQ, &in, sizeof(in), NULL, 0);
	if (err) {
		hca_wq_free_user(&ring);
		goto out;
	}
	old.mmap = cq->mmap;
	cq->ring = ring.ring;
	cq->ring_dma = ring.ring_dma;
	cq->ring_bytes = ring.ring_bytes;
	cq->mmap = ring.mmap;
	cq->log_entries = log;
	ibcq->cqe = 1 << log;
	hca_wq_free_user(&old);
	resp.cqn = cq->cqn;
	resp.log_entries = log;
	resp.db_slot = cq->db_slot;
	err = ib_copy_to_udata(udata, &resp, min(sizeof(resp), udata->outlen));
out:
	mutex_unlock(&cq->resize_lock);
	return err;
}

static struct hca_cqe *hca_next_cqe(struct hca_cq *cq)
{
	struct hca_cqe *cqe = &cq->ring[cq->ci & ((1 << cq->log_entries) - 1)];

	if (READ_ONCE(cqe->owner) != hca_owner_bit(cq->ci, cq->log_entries))
		return NULL;
	/* The owner byte is written last: read the rest only after it. */
	dma_rmb();
	return cqe;
}

/*
 * A destroyed QP's CQEs still in the ring (the device made them before the
 * DESTROY_QP command ended, and none after) are marked as no QP's, so that
 * poll drops them: the QPN may be given to a new QP before they are polled,
 * which would then retire them against its own work queues and hand its
 * consumer wr_ids it never had in flight. Its receives from an SRQ are
 * retired there now, or the SRQ's slots would never come back. Caller
 * holds cq->lock.
 */
void hca_cq_clean(struct hca_cq *cq, struct hca_qp *qp)
{
	u32 qpn = qp->qpn;
	u32 i, mask = (1 << cq->log_entries) - 1;
	struct hca_cqe *cqe;

	/* A process polls its own CQ, and its provider cleans it itself. */
	if (cq->uc)
		return;
	for (i = cq->ci; i - cq->ci <= mask; i++) {
		cqe = &cq->ring[i & mask];
		if (READ_ONCE(cqe->owner) != hca_owner_bit(i, cq->log_entries))
			break;
		dma_rmb();
		if (cqe->qpn != qpn)
			continue;
		if (qp->srq && (cqe->opcode & HCA_CQE_OP_RECV))
			hca_srq_retire(qp->srq, cqe->wr_id);
		WRITE_ONCE(cqe->qpn, HCA_MAX_QP);
	}
}

/* Maps the device's work-queue index in wr_id back to the consumer's wr_id. */
static u64 hca_retire(struct hca_wq *wq, u64 index)
{
	u32 idx = (u32)index;

	WRITE_ONCE(wq->ci, idx + 1);
	return wq->wrid[idx & ((1 << wq->log_entries) - 1)];
}

/*
 * A CQE's status passes through as ib_wc_status, whose numbers every kernel
 * keeps (rdma-core's ibv_wc_status mirrors them); a kernel that moved one
 * fails the build here rather than reporting the wrong error.
 */
static_assert(HCA_WC_SUCCESS == IB_WC_SUCCESS);
static_assert(HCA_WC_LOC_LEN_ERR == IB_WC_LOC_LEN_ERR);
static_assert(HCA_WC_LOC_QP_OP_ERR == IB_WC_LOC_QP_OP_ERR);
static_assert(HCA_WC_LOC_PROT_ERR == IB_WC_LOC_PROT_ERR);
static_assert(HCA_WC_WR_FLUSH_ERR == IB_WC_WR_FLUSH_ERR);
static_assert(HCA_WC_BAD_RESP_ERR == IB_WC_BAD_RESP_ERR);
static_assert(HCA_WC_LOC_ACCESS_ERR == IB_WC_LOC_ACCESS_ERR);
static_assert(HCA_WC_REM_INV_REQ_ERR == IB_WC_REM_INV_REQ_ERR);
static_assert(HCA_WC_REM_ACCESS_ERR == IB_WC_REM_ACCESS_ERR);
static_assert(HCA_WC_REM_OP_ERR == IB_WC_REM_OP_ERR);
static_assert(HCA_WC_RETRY_EXC_ERR == IB_WC_RETRY_EXC_ERR);
static_assert(HCA_WC_RNR_RETRY_EXC_ERR == IB_WC_RNR_RETRY_EXC_ERR);
static_assert(HCA_WC_GENERAL_ERR == IB_WC_GENERAL_ERR);

/*
 * A send CQE's opcode as ib_core numbers it. The ABI's values are the
 * device's own: ib_wc_opcode is no stable ABI (6.2 put IB_WC_ATOMIC_WRITE
 * before IB_WC_REG_MR and moved the masked atomics up by one), so each is
 * named, never passed through.
 */
static enum ib_wc_opcode hca_wc_opcode(u8 op)
{
	switch (op) {
	case HCA_CQE_OP_SEND:
		return IB_WC_SEND;
	case HCA_CQE_OP_RDMA_WRITE:
		return IB_WC_RDMA_WRITE;
	case HCA_CQE_OP_RDMA_READ:
		return IB_WC_RDMA_READ;
	case HCA_CQE_OP_COMP_SWAP:
		return IB_WC_COMP_SWAP;
	case HCA_CQE_OP_FETCH_ADD:
		return IB_WC_FETCH_ADD;
	case HCA_CQE_OP_LOCAL_INV:
		return IB_WC_LOCAL_INV;
	case HCA_CQE_OP_REG_MR:
		return IB_WC_REG_MR;
	case HCA_CQE_OP_MASKED_COMP_SWAP:
		return IB_WC_MASKED_COMP_SWAP;
	case HCA_CQE_OP_MASKED_FETCH_ADD:
		return IB_WC_MASKED_FETCH_ADD;
	default:
		/* The device writes no other; a consumer sees a plain send. */
		return IB_WC_SEND;
	}
}

static void hca_cqe_to_wc(struct hca_dev *dev, const struct hca_cqe *c,
			  struct ib_wc *wc)
{
	struct hca_qp *qp = hca_qp_lookup(dev, c->qpn);

	memset(wc, 0, sizeof(*wc));
	wc->status = c->status;
	wc->byte_len = c->byte_len;
	wc->src_qp = c->src_qp;
	wc->slid = c->slid;
	wc->pkey_index = c->pkey_index;
	wc->port_num = 1;
	wc->qp = qp ? &qp->ibqp : NULL;
	if (c->flags & HCA_CQE_FLAG_IMM) {
		wc->wc_flags |= IB_WC_WITH_IMM;
		wc->ex.imm_data = (__force __be32)c->imm;
	}
	if (c->flags & HCA_CQE_FLAG_GRH)
		wc->wc_flags |= IB_WC_GRH;
	if (c->flags & HCA_CQE_FLAG_INV) {
		wc->wc_flags |= IB_WC_WITH_INVALIDATE;
		wc->ex.invalidate_rkey = c->imm;
	}
	if (c->opcode & HCA_CQE_OP_RECV) {
		wc->opcode = c->opcode == HCA_CQE_OP_RECV_RDMA_IMM ?
			     IB_WC_RECV_RDMA_WITH_IMM : IB_WC_RECV;
		if (qp && qp->srq)
			wc->wr_id = hca_srq_retire(qp->srq, c->wr_id);
		else if (qp)
			wc->wr_id = hca_retire(&qp->rq, c->wr_id);
	} else {
		wc->opcode = hca_wc_opcode(c->opcode);
		if (qp)
			wc->wr_id = hca_retire(&qp->sq, c->wr_id);
	}
}

/* WRs posted to wq and not yet completed (0 if ci ran past a reset pi). */
static u32 hca_wq_outstanding(struct hca_wq *wq)
{
	s32 n = wq->pi - wq->ci;

	return n > 0 ? n : 0;
}

/*
 * Whether a kernel QP completing on cq has work outstanding. Caller holds
 * cq->lock. The queue's lock orders this with a post: one that took it
 * later sees HCA_CATAS_LOST, set before this runs, and notifies anew.
 */
bool hca_cq_flush_pending(struct hca_cq *cq)
{
	struct hca_qp *qp;
	bool pending;

	list_for_each_entry(qp, &cq->send_qps, send_node) {
		if (qp->uc)
			continue;
		spin_lock(&qp->sq_lock);
		pending = hca_wq_outstanding(&qp->sq);
		spin_unlock(&qp->sq_lock);
		if (pending)
			return true;
	}
	list_for_each_entry(qp, &cq->recv_qps, recv_node) {
		if (qp->uc || qp->srq)
			continue;
		spin_lock(&qp->rq_lock);
		pending = hca_wq_outstanding(&qp->rq);
		spin_unlock(&qp->rq_lock);
		if (pending)
			return true;
	}
	return false;
}

/*
 * What a flushed send WR was, from the opcode the driver wrote into its WQE
 * (the first byte after wr_id in every send WQE layout), so that a consumer
 * that tells its completions apart by opcode sees the WR it posted.
 */
static enum ib_wc_opcode hca_flushed_send_opcode(struct hca_wq *wq, u32 idx)
{
	const struct hca_send_wqe *w = wq->ring +
		((size_t)(idx & ((1 << wq->log_entries) - 1)) << wq->wqe_shift);

	switch (READ_ONCE(w->opcode)) {
	case HCA_WR_RDMA_WRITE:
	case HCA_WR_RDMA_WRITE_IMM:
		return IB_WC_RDMA_WRITE;
	case HCA_WR_RDMA_READ:
		return IB_WC_RDMA_READ;
	case HCA_WR_ATOMIC_CMP_SWP:
		return IB_WC_COMP_SWAP;
	case HCA_WR_ATOMIC_FETCH_ADD:
		return IB_WC_FETCH_ADD;
	case HCA_WR_MASKED_CMP_SWP:
		return IB_WC_MASKED_COMP_SWAP;
	case HCA_WR_MASKED_FETCH_ADD:
		return IB_WC_MASKED_FETCH_ADD;
	case HCA_WR_REG_MR:
		return IB_WC_REG_MR;
	case HCA_WR_LOCAL_INV:
		return IB_WC_LOCAL_INV;
	default:
		/* SEND, with immediate or invalidate. */
		return IB_WC_SEND;
	}
}

/* Up to num of wq's outstanding WRs, oldest first, as flushed. */
static int hca_flush_wq(struct hca_qp *qp, struct hca_wq *wq, spinlock_t *lock,
			bool send, int num, struct ib_wc *wc)
{
	int n = 0;

	spin_lock(lock);
	for (; n < num && hca_wq_outstanding(wq); n++) {
		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = wq->wrid[wq->ci & ((1 << wq->log_entries) - 1)];
		wc[n].status = IB_WC_WR_FLUSH_ERR;
		wc[n].opcode = send ? hca_flushed_send_opcode(wq, wq->ci) :
				      IB_WC_RECV;
		wc[n].qp = &qp->ibqp;
		wc[n].port_num = 1;
		WRITE_ONCE(wq->ci, wq->ci + 1);
	}
	spin_unlock(lock);
	return n;
}

/*
 * The device lost its state (catas.c): every WR still outstanding on a QP
 * that completes on cq ends flushed, as the device would have flushed it.
 * Caller holds cq->lock, under which the work queues' locks are taken.
 */
static int hca_poll_flushed(struct hca_cq *cq, int num, struct ib_wc *wc)
{
	struct hca_qp *qp;
	int n = 0;

	list_for_each_entry(qp, &cq->send_qps, send_node)
		if (!qp->uc)
			n += hca_flush_wq(qp, &qp->sq, &qp->sq_lock, true,
					  num - n, wc + n);
	list_for_each_entry(qp, &cq->recv_qps, recv_node)
		if (!qp->uc && !qp->srq)
			n += hca_flush_wq(qp, &qp->rq, &qp->rq_lock, false,
					  num - n, wc + n);
	return n;
}

int hca_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc)
{
	struct hca_dev *dev = to_hdev(ibcq->device);
	struct hca_cq *cq = to_hcq(ibcq);
	struct hca_cqe *cqe;
	unsigned long flags;
	int n = 0;

	spin_lock_irqsave(&cq->lock, flags);
	while (n < num && (cqe = hca_next_cqe(cq))) {
		hca_cqe_to_wc(dev, cqe, &wc[n]);
		cq->ci++;
		/* A CQE of a destroyed QP has no consumer left: drop it. */
		if (wc[n].qp)
			n++;
	}
	if (hca_lost(dev) && n < num)
		n += hca_poll_flushed(cq, num - n, wc + n);
	iowrite32(cq->ci, hca_cq_db(dev, cq->cqn) + offsetof(struct hca_cq_db, ci));
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

int hca_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct hca_dev *dev = to_hdev(ibcq->device);
	struct hca_cq *cq = to_hcq(ibcq);
	bool solicited = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED;
	unsigned long irqflags;
	int missed = 0;

	spin_lock_irqsave(&cq->lock, irqflags);
	cq->arm_sn++;
	iowrite32(cq->arm_sn << 1 | solicited,
		  hca_cq_db(dev, cq->cqn) + offsetof(struct hca_cq_db, arm));
	hca_ring(dev, HCA_DB_CQ_ARM);
	/* CQEs already in the ring do not fire the arm: tell the caller. */
	if ((flags & IB_CQ_REPORT_MISSED_EVENTS) && hca_next_cqe(cq))
		missed = 1;
	cq->sw_armed = true;
	/* Nor does work flushed in software: neither the arm nor its event. */
	if (hca_lost(dev) && (flags & IB_CQ_REPORT_MISSED_EVENTS) &&
	    hca_cq_flush_pending(cq))
		missed = 1;
	spin_unlock_irqrestore(&cq->lock, irqflags);
	if (hca_lost(dev))
		hca_sw_notify(dev);
	return missed;
}
