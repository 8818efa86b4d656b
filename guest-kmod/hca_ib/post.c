// SPDX-License-Identifier: GPL-2.0
/*
 * post_send and post_recv: WQEs into the ring, the new producer index
 * into the QP's BAR2 doorbell record, one doorbell per call.
 *
 * Locking: qp->sq_lock / qp->rq_lock (irqsave: consumers post from
 * completion handlers) guard the producer index. The consumer index is
 * advanced by poll_cq alone and read here with READ_ONCE.
 */
#include "hca_ib.h"

static void __iomem *hca_qp_db(struct hca_dev *dev, u32 qpn)
{
	return dev->bar2 + HCA_BAR2_QP_DB_OFFSET + qpn * sizeof(struct hca_qp_db);
}

static void *hca_wqe(struct hca_wq *wq, u32 idx)
{
	return wq->ring + ((size_t)(idx & ((1 << wq->log_entries) - 1)) <<
			   wq->wqe_shift);
}

static bool hca_wq_full(struct hca_wq *wq)
{
	return wq->pi - READ_ONCE(wq->ci) >= (1u << wq->log_entries);
}

static int hca_wr_opcode(enum ib_wr_opcode op)
{
	switch (op) {
	case IB_WR_SEND:
		return HCA_WR_SEND;
	case IB_WR_SEND_WITH_IMM:
		return HCA_WR_SEND_IMM;
	case IB_WR_RDMA_WRITE:
		return HCA_WR_RDMA_WRITE;
	case IB_WR_RDMA_WRITE_WITH_IMM:
		return HCA_WR_RDMA_WRITE_IMM;
	case IB_WR_RDMA_READ:
		return HCA_WR_RDMA_READ;
	case IB_WR_ATOMIC_CMP_AND_SWP:
		return HCA_WR_ATOMIC_CMP_SWP;
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		return HCA_WR_ATOMIC_FETCH_ADD;
	case IB_WR_MASKED_ATOMIC_CMP_AND_SWP:
		return HCA_WR_MASKED_CMP_SWP;
	case IB_WR_MASKED_ATOMIC_FETCH_AND_ADD:
		return HCA_WR_MASKED_FETCH_ADD;
	case IB_WR_REG_MR:
		return HCA_WR_REG_MR;
	case IB_WR_LOCAL_INV:
		return HCA_WR_LOCAL_INV;
	case IB_WR_SEND_WITH_INV:
		return HCA_WR_SEND_INV;
	default:
		return -EINVAL;
	}
}

/* Inline SGEs carry kernel virtual addresses, as in every kernel provider. */
static int hca_copy_inline(struct hca_wq *wq, struct hca_send_wqe *w,
			   const struct ib_send_wr *wr)
{
	u8 *dst = (u8 *)(w + 1);
	u32 room = min_t(u32, HCA_MAX_INLINE,
			 (1 << wq->wqe_shift) - sizeof(*w));
	u32 len = 0;
	int i;

	for (i = 0; i < wr->num_sge; i++) {
		if (wr->sg_list[i].length > room - len)
			return -EINVAL;
		memcpy(dst + len, (void *)(uintptr_t)wr->sg_list[i].addr,
		       wr->sg_list[i].length);
		len += wr->sg_list[i].length;
	}
	w->inline_len = len;
	w->flags |= HCA_WQE_INLINE;
	return 0;
}

static void hca_copy_sges(struct hca_sge *dst, const struct ib_sge *src, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		dst[i].addr = src[i].addr;
		dst[i].length = src[i].length;
		dst[i].lkey = src[i].lkey;
	}
}

static void hca_wqe_remote(struct hca_qp *qp, struct hca_send_wqe *w,
			   const struct ib_send_wr *wr)
{
	switch (wr->opcode) {
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_WRITE_WITH_IMM:
	case IB_WR_RDMA_READ:
		w->remote_addr = rdma_wr(wr)->remote_addr;
		w->rkey = rdma_wr(wr)->rkey;
		break;
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		w->remote_addr = atomic_wr(wr)->remote_addr;
		w->rkey = atomic_wr(wr)->rkey;
		w->compare_add = atomic_wr(wr)->compare_add;
		w->swap = atomic_wr(wr)->swap;
		break;
	case IB_WR_MASKED_ATOMIC_CMP_AND_SWP:
	case IB_WR_MASKED_ATOMIC_FETCH_AND_ADD: {
		/* The masks take the UD fields' place (an RC-only WR). */
		struct hca_masked_atomic_wqe *m = (void *)w;

		m->remote_addr = atomic_wr(wr)->remote_addr;
		m->rkey = atomic_wr(wr)->rkey;
		m->compare_add = atomic_wr(wr)->compare_add;
		m->swap = atomic_wr(wr)->swap;
		m->compare_add_mask = atomic_wr(wr)->compare_add_mask;
		m->swap_mask = atomic_wr(wr)->swap_mask;
		break;
	}
	default:
		break;
	}
	if (hca_qp_is_datagram(qp)) {
		w->ud_dlid = to_hah(ud_wr(wr)->ah)->dlid;
		w->ud_remote_qpn = ud_wr(wr)->remote_qpn;
		w->ud_qkey = ud_wr(wr)->remote_qkey;
		/* The MAD layer sends each MAD in its partition (ib_cm: the path's). */
		w->ud_pkey_index = ud_wr(wr)->pkey_index;
	}
}

/* IB_WR_REG_MR: the device copies the page list when it executes the WQE. */
static int hca_build_reg_mr(struct hca_qp *qp, const struct ib_send_wr *wr)
{
	struct hca_wq *wq = &qp->sq;
	struct hca_reg_mr_wqe *w = hca_wqe(wq, wq->pi);
	struct hca_mr *mr = to_hmr(reg_wr(wr)->mr);

	if (!mr->pages || !mr->npages)
		return -EINVAL;
	memset(w, 0, sizeof(*w));
	w->wr_id = wq->pi;
	w->opcode = HCA_WR_REG_MR;
	if (wr->send_flags & IB_SEND_SIGNALED)
		w->flags |= HCA_WQE_SIGNALED;
	w->access = hca_mr_access(reg_wr(wr)->access);
	w->iova = mr->ibmr.iova;
	w->key = reg_wr(wr)->key;
	w->npages = mr->npages;
	w->length = mr->ibmr.length;
	w->page_list = mr->pages_dma;
	w->page_shift = ilog2(mr->ibmr.page_size);
	/* From here on the device knows the MR by this key (dereg uses it). */
	mr->prev_key = mr->hw_key;
	mr->hw_key = reg_wr(wr)->key;
	return 0;
}

static int hca_build_send(struct hca_qp *qp, const struct ib_send_wr *wr)
{
	struct hca_wq *wq = &qp->sq;
	struct hca_send_wqe *w = hca_wqe(wq, wq->pi);
	int op = hca_wr_opcode(wr->opcode);

	if (op < 0 || wr->num_sge < 0 || wr->num_sge > wq->max_sge)
		return -EINVAL;
	if ((op == HCA_WR_MASKED_CMP_SWP || op == HCA_WR_MASKED_FETCH_ADD) &&
	    !(to_hdev(qp->ibqp.device)->caps & HCA_CAP_MASKED_ATOMIC))
		return -EINVAL;
	if (hca_qp_is_datagram(qp) && op != HCA_WR_SEND && op != HCA_WR_SEND_IMM)
		return -EINVAL;
	if (op == HCA_WR_REG_MR)
		return hca_build_reg_mr(qp, wr);
	memset(w, 0, sizeof(*w));
	w->wr_id = wq->pi;
	w->opcode = op;
	if (wr->send_flags & IB_SEND_SIGNALED)
		w->flags |= HCA_WQE_SIGNALED;
	if (wr->send_flags & IB_SEND_SOLICITED)
		w->flags |= HCA_WQE_SOLICITED;
	if (wr->send_flags & IB_SEND_FENCE)
		w->flags |= HCA_WQE_FENCE;
	if (op == HCA_WR_SEND_IMM || op == HCA_WR_RDMA_WRITE_IMM)
		w->imm = (__force u32)wr->ex.imm_data;
	/* The key to invalidate, here or (SEND_INV) at the responder. */
	if (op == HCA_WR_LOCAL_INV || op == HCA_WR_SEND_INV)
		w->imm = wr->ex.invalidate_rkey;
	if (op == HCA_WR_LOCAL_INV)
		return 0;
	hca_wqe_remote(qp, w, wr);
	if (wr->send_flags & IB_SEND_INLINE)
		return hca_copy_inline(wq, w, wr);
	w->num_sge = wr->num_sge;
	hca_copy_sges((struct hca_sge *)(w + 1), wr->sg_list, wr->num_sge);
	return 0;
}

/*
 * The send-doorbell rings go on from the producer indices BAR2 holds (a
 * previous load of the driver may have left them anywhere): the device
 * keeps its own consumer indices.
 */
void hca_sq_rings_init(struct hca_dev *dev)
{
	int r;

	dev->sq_rings = dev->caps & HCA_CAP_SQ_RING;
	for (r = 0; r < HCA_SQ_RINGS; r++) {
		spin_lock_init(&dev->sq_ring_lock[r]);
		dev->sq_ring_pi[r] = dev->sq_rings ?
			ioread32(dev->bar2 + HCA_BAR2_SQ_RING_OFFSET +
				 r * HCA_SQ_RING_STRIDE + HCA_SQ_RING_PI) : 0;
	}
	/* The device reads only the rings this many CPUs write. */
	if (dev->sq_rings)
		iowrite32(min_t(u32, nr_cpu_ids, HCA_SQ_RINGS),
			  dev->bar2 + HCA_BAR2_SQ_RING_OFFSET +
			  HCA_SQ_RINGS_USED);
}

/*
 * Names QP qpn in this CPU's send-doorbell ring, so that the HCA_DB_SQ
 * rung next runs its send queue without the device looking at every QP:
 * the QPN, then the producer index that publishes it. Called under
 * qp->sq_lock (interrupts off: the CPU stays), after the record's sq_pi.
 */
static void hca_name_sq(struct hca_dev *dev, u32 qpn)
{
	unsigned int r = raw_smp_processor_id() % HCA_SQ_RINGS;
	void __iomem *ring = dev->bar2 + HCA_BAR2_SQ_RING_OFFSET +
			     r * HCA_SQ_RING_STRIDE;
	u32 pi;

	spin_lock(&dev->sq_ring_lock[r]);
	pi = dev->sq_ring_pi[r];
	iowrite32(qpn, ring + HCA_SQ_RING_QPN_OFFSET +
		  4 * (pi % HCA_SQ_RING_ENTRIES));
	/* The QPN reaches the device before the index that publishes it. */
	wmb();
	iowrite32(pi + 1, ring + HCA_SQ_RING_PI);
	dev->sq_ring_pi[r] = pi + 1;
	spin_unlock(&dev->sq_ring_lock[r]);
}

int hca_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		  const struct ib_send_wr **bad_wr)
{
	struct hca_dev *dev = to_hdev(ibqp->device);
	struct hca_qp *qp = to_hqp(ibqp);
	unsigned long flags;
	u32 start;
	int err = 0;

	spin_lock_irqsave(&qp->sq_lock, flags);
	start = qp->sq.pi;
	for (; wr; wr = wr->next) {
		if (hca_wq_full(&qp->sq)) {
			err = -ENOMEM;
			break;
		}
		err = hca_build_send(qp, wr);
		if (err)
			break;
		qp->sq.wrid[qp->sq.pi & ((1 << qp->sq.log_entries) - 1)] = wr->wr_id;
		qp->sq.pi++;
	}
	if (err)
		*bad_wr = wr;
	if (qp->sq.pi != start) {
		/* WQEs reach memory before the index that publishes them. */
		dma_wmb();
		iowrite32(qp->sq.pi, hca_qp_db(dev, qp->qpn) +
			  offsetof(struct hca_qp_db, sq_pi));
		if (qp->sq_named) {
			/* The record's index reaches the device before the name. */
			wmb();
			hca_name_sq(dev, qp->qpn);
		}
		hca_ring(dev, HCA_DB_SQ);
	}
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	/* The device will not complete it: the driver flushes it (catas.c). */
	if (hca_lost(dev))
		hca_sw_notify(dev);
	return err;
}

/*
 * A receive WQE in slot idx of wq (a QP's receive queue or an SRQ): the
 * consumer's SGEs, and the wr_id the device hands back in the CQE.
 */
void hca_write_recv_wqe(struct hca_wq *wq, u32 idx, u64 hw_wr_id,
			const struct ib_recv_wr *wr)
{
	struct hca_recv_wqe *w = hca_wqe(wq, idx);

	memset(w, 0, sizeof(*w));
	w->wr_id = hw_wr_id;
	w->num_sge = wr->num_sge;
	hca_copy_sges((struct hca_sge *)(w + 1), wr->sg_list, wr->num_sge);
}

int hca_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		  const struct ib_recv_wr **bad_wr)
{
	struct hca_dev *dev = to_hdev(ibqp->device);
	struct hca_qp *qp = to_hqp(ibqp);
	struct hca_wq *wq = &qp->rq;
	unsigned long flags;
	u32 start;
	int err = 0;

	/* A QP on an SRQ has no receive queue of its own. */
	if (qp->srq) {
		*bad_wr = wr;
		return -EINVAL;
	}
	spin_lock_irqsave(&qp->rq_lock, flags);
	start = wq->pi;
	for (; wr; wr = wr->next) {
		if (hca_wq_full(wq)) {
			err = -ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > wq->max_sge) {
			err = -EINVAL;
			break;
		}
		hca_write_recv_wqe(wq, wq->pi, wq->pi, wr);
		wq->wrid[wq->pi & ((1 << wq->log_entries) - 1)] = wr->wr_id;
		wq->pi++;
	}
	if (err)
		*bad_wr = wr;
	if (wq->pi != start) {
		dma_wmb();
		iowrite32(wq->pi, hca_qp_db(dev, qp->qpn) +
			  offsetof(struct hca_qp_db, rq_pi));
		hca_ring(dev, HCA_DB_RQ);
	}
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	if (hca_lost(dev))
		hca_sw_notify(dev);
	return err;
}
