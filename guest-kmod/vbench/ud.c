// SPDX-License-Identifier: GPL-2.0
/*
 * UD loopback: two UD QPs on the open device, a datagram from one to the
 * other through an address handle naming our own port, checked for its
 * bytes (after the 40-byte GRH room), source QP and source LID. IB link
 * layer only (a RoCE AH would need a resolved MAC). Caller holds the
 * control lock (vb_ctl.lock).
 */
#include "vbench.h"
#include "dmabuf.h"

#define VB_UD_QKEY	0x11111111
#define VB_UD_BYTES	256
#define VB_GRH		40
/* The datagram to send, then the receive buffer (GRH room + datagram). */
#define VB_UD_BUF	(2 * VB_UD_BYTES + VB_GRH)

struct vb_ud {
	struct ib_cq *cq;
	struct ib_qp *qp[2];
	struct ib_ah *ah;
	u8 *buf;
	u64 dma;
};

static int vb_ud_qp_up(struct ib_qp *qp)
{
	struct ib_qp_attr a = {
		.qp_state = IB_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qkey = VB_UD_QKEY,
	};
	int err;

	err = ib_modify_qp(qp, &a, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT |
			   IB_QP_QKEY);
	if (err)
		return err;
	a.qp_state = IB_QPS_RTR;
	err = ib_modify_qp(qp, &a, IB_QP_STATE);
	if (err)
		return err;
	a.qp_state = IB_QPS_RTS;
	a.sq_psn = 0;
	return ib_modify_qp(qp, &a, IB_QP_STATE | IB_QP_SQ_PSN);
}

static int vb_ud_setup(struct vb_ud *u)
{
	struct ib_cq_init_attr ca = { .cqe = 16 };
	struct ib_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_type = IB_SIGNAL_ALL_WR,
		.qp_type = IB_QPT_UD,
	};
	struct rdma_ah_attr ah = { .type = RDMA_AH_ATTR_TYPE_IB };
	int i, err;

	u->cq = ib_create_cq(vb->dev, NULL, NULL, NULL, &ca);
	if (IS_ERR(u->cq))
		return PTR_ERR(u->cq);
	qa.send_cq = u->cq;
	qa.recv_cq = u->cq;
	for (i = 0; i < 2; i++) {
		u->qp[i] = ib_create_qp(vb->pd, &qa);
		if (IS_ERR(u->qp[i]))
			return PTR_ERR(u->qp[i]);
		err = vb_ud_qp_up(u->qp[i]);
		if (err)
			return err;
	}
	rdma_ah_set_dlid(&ah, vb->lid);
	rdma_ah_set_port_num(&ah, 1);
	u->ah = rdma_create_ah(vb->pd, &ah, RDMA_CREATE_AH_SLEEPABLE);
	return PTR_ERR_OR_ZERO(u->ah);
}

static void vb_ud_teardown(struct vb_ud *u)
{
	int i;

	if (!IS_ERR_OR_NULL(u->ah))
		rdma_destroy_ah(u->ah, RDMA_DESTROY_AH_SLEEPABLE);
	for (i = 0; i < 2; i++)
		if (!IS_ERR_OR_NULL(u->qp[i]))
			ib_destroy_qp(u->qp[i]);
	if (!IS_ERR_OR_NULL(u->cq))
		ib_destroy_cq(u->cq);
}

static int vb_ud_post(struct vb_ud *u)
{
	struct ib_sge rs = { .addr = u->dma + VB_UD_BYTES,
			     .length = VB_GRH + VB_UD_BYTES,
			     .lkey = vb->pd->local_dma_lkey };
	struct ib_recv_wr rwr = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 };
	struct ib_sge ss = { .addr = u->dma, .length = VB_UD_BYTES,
			     .lkey = vb->pd->local_dma_lkey };
	struct ib_ud_wr swr = {
		.wr = { .wr_id = 1, .sg_list = &ss, .num_sge = 1,
			.opcode = IB_WR_SEND, .send_flags = IB_SEND_SIGNALED },
		.ah = u->ah,
		.remote_qpn = u->qp[1]->qp_num,
		.remote_qkey = VB_UD_QKEY,
	};
	int err = ib_post_recv(u->qp[1], &rwr, NULL);

	return err ?: ib_post_send(u->qp[0], &swr.wr, NULL);
}

/* Polls for the send and the receive completion; the receive lands in *rwc. */
static int vb_ud_wait(struct vb_ud *u, struct ib_wc *rwc)
{
	struct ib_wc wc;
	int got, err;

	for (got = 0; got < 2; got++) {
		err = vb_poll_one(u->cq, &wc, 10 * HZ);
		if (err)
			return err;
		if (wc.status != IB_WC_SUCCESS)
			return -EIO;
		if (wc.opcode == IB_WC_RECV)
			*rwc = wc;
	}
	return 0;
}

int vb_udloop(char *out, size_t len)
{
	struct vb_ud u = {};
	struct ib_wc rwc = {};
	int err, bad;

	if (!vb->pd)
		return -ENOTCONN;
	if (vb->roce)
		return -EOPNOTSUPP;
	u.buf = dmabuf_alloc(vb->dev, VB_UD_BUF, &u.dma, DMA_BIDIRECTIONAL);
	if (!u.buf)
		return -ENOMEM;
	memcpy(u.buf, vb_pattern, VB_UD_BYTES);
	err = vb_ud_setup(&u);
	if (!err)
		err = vb_ud_post(&u);
	if (!err)
		err = vb_ud_wait(&u, &rwc);
	if (!err) {
		bad = memcmp(u.buf + VB_UD_BYTES + VB_GRH, vb_pattern, VB_UD_BYTES) != 0;
		err = scnprintf(out, len,
				"udloop byte_len=%u src_qp_ok=%d slid_ok=%d data_ok=%d\n",
				rwc.byte_len, rwc.src_qp == u.qp[0]->qp_num,
				rwc.slid == vb->lid, !bad);
	}
	vb_ud_teardown(&u);
	dmabuf_free(vb->dev, u.buf, u.dma, VB_UD_BUF, DMA_BIDIRECTIONAL);
	return err;
}
