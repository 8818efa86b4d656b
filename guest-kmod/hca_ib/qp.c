// SPDX-License-Identifier: GPL-2.0
/*
 * Queue pairs: RC, UD, and the SMI and GSI QPs (QPN 0 and 1) that ib_mad
 * opens. Rings live in guest RAM; the device runs the IB state machine and
 * checks every attribute, so modify/query mostly translate between ib_core
 * and the ABI (whose numbering is ib_core's).
 */
#include <linux/interrupt.h>
#include "hca_ib.h"

#define HCA_QP_KNOWN_MASK (IB_QP_STATE | IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | \
	IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY | IB_QP_AV | IB_QP_PATH_MTU | \
	IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_RQ_PSN | \
	IB_QP_MAX_QP_RD_ATOMIC | IB_QP_MIN_RNR_TIMER | IB_QP_SQ_PSN | \
	IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_DEST_QPN)

struct hca_qp *hca_qp_lookup(struct hca_dev *dev, u32 qpn)
{
	return qpn < HCA_MAX_QP ? READ_ONCE(dev->qps[qpn]) : NULL;
}

/* Sizes a work queue for wr entries of hdr + sge * 16 (or hdr + inline) bytes. */
int hca_wq_size(struct hca_wq *wq, u32 wr, u32 hdr, u32 sge, u32 inl,
		u32 min_shift, u32 max_shift)
{
	u32 bytes = max(hdr + sge * (u32)sizeof(struct hca_sge), hdr + inl);

	if (sge > HCA_MAX_SGE || inl > HCA_MAX_INLINE ||
	    wr > (1 << HCA_MAX_QP_LOG_WR))
		return -EINVAL;
	wq->log_entries = order_base_2(max(wr, 1u));
	wq->wqe_shift = max_t(u32, order_base_2(bytes), min_shift);
	if (wq->wqe_shift > max_shift)
		return -EINVAL;
	wq->max_sge = min_t(u32, HCA_MAX_SGE,
			    ((1 << wq->wqe_shift) - hdr) / sizeof(struct hca_sge));
	return 0;
}

int hca_wq_alloc(struct hca_dev *dev, struct hca_wq *wq)
{
	wq->ring_bytes = (size_t)1 << (wq->log_entries + wq->wqe_shift);
	wq->ring = dma_alloc_coherent(&dev->pdev->dev, wq->ring_bytes,
				      &wq->ring_dma, GFP_KERNEL);
	if (!wq->ring)
		return -ENOMEM;
	wq->wrid = kcalloc(1 << wq->log_entries, sizeof(u64), GFP_KERNEL);
	if (!wq->wrid) {
		dma_free_coherent(&dev->pdev->dev, wq->ring_bytes, wq->ring,
				  wq->ring_dma);
		return -ENOMEM;
	}
	return 0;
}

void hca_wq_free(struct hca_dev *dev, struct hca_wq *wq)
{
	if (!wq->ring)
		return;
	kfree(wq->wrid);
	dma_free_coherent(&dev->pdev->dev, wq->ring_bytes, wq->ring, wq->ring_dma);
}

static int hca_qp_check(struct ib_qp_init_attr *init, u32 *type)
{
	switch (init->qp_type) {
	case IB_QPT_RC:
		*type = HCA_QPT_RC;
		break;
	case IB_QPT_UC:
		*type = HCA_QPT_UC;
		break;
	case IB_QPT_UD:
		*type = HCA_QPT_UD;
		break;
	case IB_QPT_SMI:
		*type = HCA_QPT_SMI;
		break;
	case IB_QPT_GSI:
		*type = HCA_QPT_GSI;
		break;
	default:
		return -EOPNOTSUPP;
	}
	if (init->create_flags)
		return -EOPNOTSUPP;
	if (!init->send_cq || !init->recv_cq)
		return -EINVAL;
	return 0;
}

static void hca_qp_report_caps(struct hca_qp *qp, struct ib_qp_cap *cap)
{
	cap->max_send_wr = 1 << qp->sq.log_entries;
	cap->max_recv_wr = qp->srq ? 0 : 1 << qp->rq.log_entries;
	cap->max_send_sge = qp->sq.max_sge;
	cap->max_recv_sge = qp->srq ? 0 : qp->rq.max_sge;
	cap->max_inline_data = min_t(u32, HCA_MAX_INLINE,
				     (1 << qp->sq.wqe_shift) -
				     sizeof(struct hca_send_wqe));
}

/*
 * A process's QP: rings it maps, a record slot in its UAR (uverbs.c). Its
 * provider names it in the UAR's send-doorbell ring if its command says so
 * (an older provider sends none).
 */
static int hca_qp_alloc_user(struct hca_dev *dev, struct hca_qp *qp,
			     struct ib_udata *udata,
			     struct hca_ucreate_qp_resp *resp, u32 *db_offset)
{
	struct hca_ucreate_qp ucmd = {};
	int err;

	if (udata->inlen) {
		err = ib_copy_from_udata(&ucmd, udata,
					 min(sizeof(ucmd), udata->inlen));
		if (err)
			return err;
	}
	qp->sq_named = dev->sq_rings && (ucmd.flags & HCA_UCREATE_QP_SQ_RING);
	qp->uc = rdma_udata_to_drv_context(udata, struct hca_ucontext, ibuc);
	qp->sq.ring_bytes = (size_t)1 << (qp->sq.log_entries + qp->sq.wqe_shift);
	qp->rq.ring_bytes = (size_t)1 << (qp->rq.log_entries + qp->rq.wqe_shift);
	qp->db_slot = hca_uar_slot_get(qp->uc, HCA_UAR_QP, db_offset);
	if (qp->db_slot < 0)
		return qp->db_slot;
	err = hca_wq_alloc_user(dev, qp->uc, &qp->sq, &resp->sq_mmap_offset);
	if (!err && !qp->srq)
		err = hca_wq_alloc_user(dev, qp->uc, &qp->rq,
					&resp->rq_mmap_offset);
	if (err) {
		hca_wq_free_user(&qp->sq);
		hca_uar_slot_put(qp->uc, HCA_UAR_QP, qp->db_slot);
		return err;
	}
	resp->db_slot = qp->db_slot;
	resp->sq_log_entries = qp->sq.log_entries;
	resp->sq_wqe_shift = qp->sq.wqe_shift;
	resp->rq_log_entries = qp->rq.log_entries;
	resp->rq_wqe_shift = qp->rq.wqe_shift;
	return 0;
}

static void hca_qp_free_rings(struct hca_dev *dev, struct hca_qp *qp)
{
	if (!qp->uc) {
		hca_wq_free(dev, &qp->rq);
		hca_wq_free(dev, &qp->sq);
		return;
	}
	hca_wq_free_user(&qp->rq);
	hca_wq_free_user(&qp->sq);
	hca_uar_slot_put(qp->uc, HCA_UAR_QP, qp->db_slot);
}

static int hca_qp_publish(struct hca_dev *dev, struct hca_qp *qp)
{
	struct hca_cq *scq = to_hcq(qp->ibqp.send_cq);
	struct hca_cq *rcq = to_hcq(qp->ibqp.recv_cq);
	unsigned long flags;

	if (qp->qpn >= HCA_MAX_QP)
		return -EIO;
	spin_lock_irqsave(&dev->table_lock, flags);
	WRITE_ONCE(dev->qps[qp->qpn], qp);
	spin_unlock_irqrestore(&dev->table_lock, flags);
	spin_lock_irqsave(&scq->lock, flags);
	list_add_tail(&qp->send_node, &scq->send_qps);
	spin_unlock_irqrestore(&scq->lock, flags);
	spin_lock_irqsave(&rcq->lock, flags);
	list_add_tail(&qp->recv_node, &rcq->recv_qps);
	spin_unlock_irqrestore(&rcq->lock, flags);
	return 0;
}

int hca_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		  struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibqp->device);
	struct hca_qp *qp = to_hqp(ibqp);
	struct ib_qp_cap *cap = &init->cap;
	struct hca_ucreate_qp_resp resp = {};
	struct hca_cmd_create_qp in = {};
	struct hca_cmd_handle out;
	u32 type;
	int err;

	err = hca_qp_check(init, &type);
	if (err)
		return err;
	/* Processes get RC, UC and UD; the management QPs are ib_mad's. */
	if (udata && (type == HCA_QPT_SMI || type == HCA_QPT_GSI))
		return -EOPNOTSUPP;
	qp->srq = init->srq ? to_hsrq(init->srq) : NULL;
	err = hca_wq_size(&qp->sq, cap->max_send_wr, sizeof(struct hca_send_wqe),
			  cap->max_send_sge, cap->max_inline_data,
			  HCA_MIN_SQ_WQE_SHIFT, HCA_MAX_SQ_WQE_SHIFT);
	if (!err && !qp->srq)
		err = hca_wq_size(&qp->rq, cap->max_recv_wr,
				  sizeof(struct hca_recv_wqe), cap->max_recv_sge,
				  0, HCA_MIN_RQ_WQE_SHIFT, HCA_MAX_RQ_WQE_SHIFT);
	if (err)
		return err;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	if (udata) {
		err = hca_qp_alloc_user(dev, qp, udata, &resp, &in.db_offset);
		if (err)
			return err;
	} else {
		qp->sq_named = dev->sq_rings;
		err = hca_wq_alloc(dev, &qp->sq);
		if (err)
			return err;
		err = qp->srq ? 0 : hca_wq_alloc(dev, &qp->rq);
		if (err) {
			hca_wq_free(dev, &qp->sq);
			return err;
		}
	}
	qp->sig_all = init->sq_sig_type == IB_SIGNAL_ALL_WR;
	in.sq_addr = qp->sq.ring_dma;
	in.rq_addr = qp->rq.ring_dma;
	in.pdn = to_hpd(ibqp->pd)->pdn;
	in.send_cqn = to_hcq(init->send_cq)->cqn;
	in.recv_cqn = to_hcq(init->recv_cq)->cqn;
	in.qp_type = type;
	in.flags = qp->sig_all ? HCA_QP_FLAG_SIG_ALL : 0;
	if (qp->sq_named)
		in.flags |= HCA_QP_FLAG_SQ_RING;
	if (qp->srq) {
		in.flags |= HCA_QP_FLAG_SRQ;
		in.srqn = qp->srq->srqn;
	}
	in.sq_log_entries = qp->sq.log_entries;
	in.sq_wqe_shift = qp->sq.wqe_shift;
	in.rq_log_entries = qp->rq.log_entries;
	in.rq_wqe_shift = qp->rq.wqe_shift;
	mutex_lock(&dev->qp_mutex);
	err = hca_cmd(dev, HCA_CMD_CREATE_QP, &in, sizeof(in), &out, sizeof(out));
	if (err)
		goto err_unlock;
	qp->qpn = out.handle;
	ibqp->qp_num = qp->qpn;
	qp->state = HCA_QPS_RESET;
	err = hca_qp_publish(dev, qp);
	if (err)
		goto err_destroy;
	mutex_unlock(&dev->qp_mutex);
	hca_qp_report_caps(qp, cap);
	if (!udata)
		return 0;
	/*
	 * Outside qp_mutex: a process's buffer may take its time to fault
	 * in, and every other QP's creation would wait for it.
	 */
	resp.qpn = qp->qpn;
	resp.max_inline = cap->max_inline_data;
	err = ib_copy_to_udata(udata, &resp, min(sizeof(resp), udata->outlen));
	if (err)
		hca_destroy_qp(ibqp, udata);
	return err;

err_destroy:
	/* The device may still hold the rings if it could not destroy the QP. */
	if (hca_cmd_handle(dev, HCA_CMD_DESTROY_QP, qp->qpn)) {
		mutex_unlock(&dev->qp_mutex);
		WARN_ONCE(1, "hca_ib: QP %#x not destroyed: its rings are leaked\n",
			  qp->qpn);
		return err;
	}
err_unlock:
	mutex_unlock(&dev->qp_mutex);
	hca_qp_free_rings(dev, qp);
	return err;
}

static void hca_attr_to_hw(const struct ib_qp_attr *a, struct hca_qp_attr *h)
{
	h->qkey = a->qkey;
	h->rq_psn = a->rq_psn;
	h->sq_psn = a->sq_psn;
	h->dest_qpn = a->dest_qp_num;
	h->access_flags = a->qp_access_flags;
	h->pkey_index = a->pkey_index;
	h->dlid = rdma_ah_get_dlid(&a->ah_attr);
	h->sl = rdma_ah_get_sl(&a->ah_attr);
	h->state = a->qp_state;
	h->cur_state = a->cur_qp_state;
	h->path_mtu = a->path_mtu;
	h->port_num = a->port_num;
	h->timeout = a->timeout;
	h->retry_cnt = a->retry_cnt;
	h->rnr_retry = a->rnr_retry;
	h->min_rnr_timer = a->min_rnr_timer;
	h->max_rd_atomic = a->max_rd_atomic;
	h->max_dest_rd_atomic = a->max_dest_rd_atomic;
}

/* Entering RESET empties both queues on the device: restart our indices. */
static void hca_qp_reset_indices(struct hca_qp *qp)
{
	unsigned long flags;

	spin_lock_irqsave(&qp->sq_lock, flags);
	qp->sq.pi = 0;
	WRITE_ONCE(qp->sq.ci, 0);
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	spin_lock_irqsave(&qp->rq_lock, flags);
	qp->rq.pi = 0;
	WRITE_ONCE(qp->rq.ci, 0);
	spin_unlock_irqrestore(&qp->rq_lock, flags);
}

int hca_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		  struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibqp->device);
	struct hca_qp *qp = to_hqp(ibqp);
	struct hca_cmd_modify_qp in = {};
	int err;

	/* A process's udata carries nothing for this verb. */
	if (mask & ~HCA_QP_KNOWN_MASK)
		return -EOPNOTSUPP;
	/*
	 * Controlled Q_Keys (high bit set) are privileged, as ib_uverbs
	 * itself checks since 6.4: a process's UD QP could otherwise pose as
	 * a management agent.
	 */
	if (udata && (mask & IB_QP_QKEY) && (attr->qkey & 0x80000000) &&
	    !capable(CAP_NET_RAW))
		return -EPERM;
	in.qpn = qp->qpn;
	in.attr_mask = mask;
	hca_attr_to_hw(attr, &in.attr);
	err = hca_cmd(dev, HCA_CMD_MODIFY_QP, &in, sizeof(in), NULL, 0);
	if (err)
		return err;
	if (mask & IB_QP_STATE) {
		/*
		 * A device that lost its state raises no event. The one an
		 * SRQ's QP owes on its way to ERR is what its consumer waits
		 * for before it frees the QP (ib_drain_qp on 6.12, up to a
		 * minute): raised here, as the device would have.
		 */
		if (attr->qp_state == IB_QPS_ERR && qp->state != IB_QPS_ERR &&
		    ibqp->srq && hca_lost(dev))
			hca_sw_qp_event(dev, qp, IB_EVENT_QP_LAST_WQE_REACHED);
		qp->state = attr->qp_state;
		if (attr->qp_state == IB_QPS_RESET)
			hca_qp_reset_indices(qp);
	}
	return 0;
}

static void hca_attr_from_hw(const struct hca_qp_attr *h, struct ib_qp_attr *a)
{
	a->qp_state = h->state;
	a->cur_qp_state = h->state;
	a->path_mtu = h->path_mtu;
	a->qkey = h->qkey;
	a->rq_psn = h->rq_psn;
	a->sq_psn = h->sq_psn;
	a->dest_qp_num = h->dest_qpn;
	a->qp_access_flags = h->access_flags;
	a->pkey_index = h->pkey_index;
	a->port_num = h->port_num ? h->port_num : 1;
	a->timeout = h->timeout;
	a->retry_cnt = h->retry_cnt;
	a->rnr_retry = h->rnr_retry;
	a->min_rnr_timer = h->min_rnr_timer;
	a->max_rd_atomic = h->max_rd_atomic;
	a->max_dest_rd_atomic = h->max_dest_rd_atomic;
	a->ah_attr.type = RDMA_AH_ATTR_TYPE_IB;
	rdma_ah_set_dlid(&a->ah_attr, h->dlid);
	rdma_ah_set_sl(&a->ah_attr, h->sl);
	rdma_ah_set_port_num(&a->ah_attr, a->port_num);
}

int hca_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		 struct ib_qp_init_attr *init)
{
	struct hca_qp *qp = to_hqp(ibqp);
	struct hca_cmd_handle in = { .handle = qp->qpn };
	struct hca_qp_attr h;
	int err;

	err = hca_cmd(to_hdev(ibqp->device), HCA_CMD_QUERY_QP, &in, sizeof(in),
		      &h, sizeof(h));
	if (err)
		return err;
	memset(attr, 0, sizeof(*attr));
	hca_attr_from_hw(&h, attr);
	qp->state = h.state;
	hca_qp_report_caps(qp, &attr->cap);
	memset(init, 0, sizeof(*init));
	init->qp_type = ibqp->qp_type;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = attr->cap;
	init->sq_sig_type = qp->sig_all ? IB_SIGNAL_ALL_WR : IB_SIGNAL_REQ_WR;
	init->srq = ibqp->srq;
	return 0;
}

/*
 * After this, no poller or event handler still holds the QP, and no CQE of
 * it is left for a later QP with its number to take.
 */
static void hca_qp_unpublish(struct hca_dev *dev, struct hca_qp *qp)
{
	struct hca_cq *scq = to_hcq(qp->ibqp.send_cq);
	struct hca_cq *rcq = to_hcq(qp->ibqp.recv_cq);
	unsigned long flags;

	spin_lock_irqsave(&dev->table_lock, flags);
	WRITE_ONCE(dev->qps[qp->qpn], NULL);
	spin_unlock_irqrestore(&dev->table_lock, flags);
	spin_lock_irqsave(&scq->lock, flags);
	hca_cq_clean(scq, qp);
	list_del(&qp->send_node);
	spin_unlock_irqrestore(&scq->lock, flags);
	spin_lock_irqsave(&rcq->lock, flags);
	if (rcq != scq)
		hca_cq_clean(rcq, qp);
	list_del(&qp->recv_node);
	spin_unlock_irqrestore(&rcq->lock, flags);
	synchronize_irq(dev->irq[HCA_VEC_ASYNC]);
}

int hca_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibqp->device);
	struct hca_qp *qp = to_hqp(ibqp);
	int err;

	mutex_lock(&dev->qp_mutex);
	err = hca_cmd_handle(dev, HCA_CMD_DESTROY_QP, qp->qpn);
	if (!err)
		hca_qp_unpublish(dev, qp);
	mutex_unlock(&dev->qp_mutex);
	if (err)
		return err;
	hca_qp_free_rings(dev, qp);
	return 0;
}
