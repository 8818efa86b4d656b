// SPDX-License-Identifier: GPL-2.0
/*
 * A destroyed QP's completions on a CQ it shared: QP a, in error, gets a
 * receive flushed (a CQE, left unpolled), and is destroyed; QP b, created
 * on the same CQ with a's number (QPs are created and destroyed until the
 * device hands it out again: it gives numbers out in turn, so that takes a
 * round of its QPN space), gets one receive flushed. Polling must then give
 * b's one completion and nothing of a's, as consumers that share a CQ
 * between connections (IPoIB-CM, NVMe-oF's CQ pools) rely on. Caller holds
 * the control lock (vb_ctl.lock).
 */
#include <linux/delay.h>
#include "vbench.h"

#define VB_CQC_A	0xa0a0a0a0a0a0a0a0ULL
#define VB_CQC_B	0xb0b0b0b0b0b0b0b0ULL

/*
 * An RC QP on cq numbered want (0: any), moved straight to ERR, with one
 * receive posted (and flushed). QPs the device numbers otherwise are
 * destroyed at once, for at most two rounds of its QPN space.
 */
static struct ib_qp *vb_cqc_flushed_qp(struct ib_cq *cq, u64 wr_id, u32 want)
{
	struct ib_qp_init_attr init = {
		.cap = { .max_send_wr = 1, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_type = IB_SIGNAL_ALL_WR,
		.qp_type = IB_QPT_RC,
		.send_cq = cq,
		.recv_cq = cq,
	};
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };
	struct ib_sge sge = {
		.addr = vb->rbuf_dma,
		.length = 8,
		.lkey = vb->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
	int tries = 2 * vb->dev->attrs.max_qp + 2;
	struct ib_qp *qp;
	int err;

	for (;;) {
		qp = ib_create_qp(vb->pd, &init);
		if (IS_ERR(qp) || !want || qp->qp_num == want)
			break;
		ib_destroy_qp(qp);
		if (--tries <= 0)
			return ERR_PTR(-EAGAIN);
	}
	if (IS_ERR(qp))
		return qp;
	err = ib_modify_qp(qp, &attr, IB_QP_STATE) ?: ib_post_recv(qp, &wr, NULL);
	if (err) {
		ib_destroy_qp(qp);
		return ERR_PTR(err);
	}
	return qp;
}

/* Every completion the CQ gives until a second passes without one: b's, and others. */
static void vb_cqc_poll(struct ib_cq *cq, int *b, int *other)
{
	struct ib_wc wc;

	while (!vb_poll_one(cq, &wc, HZ)) {
		if (wc.wr_id == VB_CQC_B && wc.status == IB_WC_WR_FLUSH_ERR)
			(*b)++;
		else
			(*other)++;
	}
}

int vb_cqclean(char *out, size_t len)
{
	struct ib_cq_init_attr ca = { .cqe = 8 };
	struct ib_qp *a, *b;
	struct ib_cq *cq;
	int got_b = 0, other = 0;
	u32 qpn_a;

	if (!vb->pd)
		return -ENOTCONN;
	cq = ib_create_cq(vb->dev, NULL, NULL, NULL, &ca);
	if (IS_ERR(cq))
		return PTR_ERR(cq);
	a = vb_cqc_flushed_qp(cq, VB_CQC_A, 0);
	if (IS_ERR(a)) {
		ib_destroy_cq(cq);
		return PTR_ERR(a);
	}
	/* Give the device time to flush a's receive into the CQ. */
	msleep(100);
	qpn_a = a->qp_num;
	ib_destroy_qp(a);
	b = vb_cqc_flushed_qp(cq, VB_CQC_B, qpn_a);
	if (IS_ERR(b)) {
		ib_destroy_cq(cq);
		return PTR_ERR(b);
	}
	vb_cqc_poll(cq, &got_b, &other);
	len = scnprintf(out, len, "cqclean qpn_reused=%d b=%d other=%d\n",
			b->qp_num == qpn_a, got_b, other);
	ib_destroy_qp(b);
	ib_destroy_cq(cq);
	return len;
}
