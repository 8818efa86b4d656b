// SPDX-License-Identifier: GPL-2.0
/*
 * Resources and connection: PD with the global rkey (the peer reaches our
 * region through it), one shared CQ, one RC QP, buffers, and the moves to
 * RTS with the address the harness handed in. Caller holds the control
 * lock (vb_ctl.lock).
 */
#include <linux/slab.h>
#include <linux/random.h>
#include <linux/inet.h>
#include "vbench.h"
#include "rcconn.h"
#include "dmabuf.h"

static void vb_free_buffers(void)
{
	dmabuf_free(vb->dev, vb->rbuf, vb->rbuf_dma, VB_RECVS * VB_MAX_MSG, DMA_BIDIRECTIONAL);
	dmabuf_free(vb->dev, vb->sbuf, vb->sbuf_dma, VB_MAX_MSG, DMA_BIDIRECTIONAL);
	dmabuf_free(vb->dev, vb->region, vb->region_dma, 2 * VB_REGION, DMA_BIDIRECTIONAL);
	dmabuf_free(vb->dev, vb->local, vb->local_dma, VB_REGION, DMA_BIDIRECTIONAL);
	vb->rbuf = vb->sbuf = vb->region = vb->local = NULL;
}

/* The read region holds pat(i) so the peer can check what it reads. */
static int vb_alloc_buffers(void)
{
	u32 i;

	vb->rbuf = dmabuf_alloc(vb->dev, VB_RECVS * VB_MAX_MSG, &vb->rbuf_dma, DMA_BIDIRECTIONAL);
	vb->sbuf = dmabuf_alloc(vb->dev, VB_MAX_MSG, &vb->sbuf_dma, DMA_BIDIRECTIONAL);
	vb->region = dmabuf_alloc(vb->dev, 2 * VB_REGION, &vb->region_dma, DMA_BIDIRECTIONAL);
	vb->local = dmabuf_alloc(vb->dev, VB_REGION, &vb->local_dma, DMA_BIDIRECTIONAL);
	if (!vb->rbuf || !vb->sbuf || !vb->region || !vb->local) {
		vb_free_buffers();
		return -ENOMEM;
	}
	for (i = 0; i < VB_REGION; i++)
		vb->region[i] = vb_pattern[i % VB_MAX_MSG];
	return 0;
}

void vb_close(void)
{
	if (!vb->dev)
		return;
	vb_stop();
	/* A connection rdma_cm made: it owns the QP and the id. */
	if (vb_cm_close_connection())
		vb->qp = NULL;
	if (vb->qp)
		ib_destroy_qp(vb->qp);
	if (vb->cq)
		ib_destroy_cq(vb->cq);
	vb_free_buffers();
	if (vb->pd)
		ib_dealloc_pd(vb->pd);
	vb->qp = NULL;
	vb->cq = NULL;
	vb->pd = NULL;
	vb->dev = NULL;
}

static void vb_cq_event(struct ib_event *ev, void *ctx)
{
	pr_warn("vbench: CQ event %s\n", ib_event_msg(ev->event));
}

static void vb_qp_event(struct ib_event *ev, void *ctx)
{
	pr_info("vbench: QP event %s\n", ib_event_msg(ev->event));
}

/* The RC QP's attributes, on the shared CQ (which must exist). */
void vb_qp_init_attr(struct ib_qp_init_attr *init)
{
	*init = (struct ib_qp_init_attr) {
		.event_handler = vb_qp_event,
		.cap = {
			.max_send_wr = VB_SQ_DEPTH,
			.max_recv_wr = VB_RECVS,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.qp_type = IB_QPT_RC,
		.send_cq = vb->cq,
		.recv_cq = vb->cq,
	};
}

static int vb_create_qp(bool own_qp)
{
	struct ib_cq_init_attr cq_attr = { .cqe = 2 * (VB_SQ_DEPTH + VB_RECVS) };
	struct ib_qp_init_attr init;

	vb->cq = ib_create_cq(vb->dev, vb_comp_handler, vb_cq_event, NULL, &cq_attr);
	if (IS_ERR(vb->cq)) {
		int err = PTR_ERR(vb->cq);

		vb->cq = NULL;
		return err;
	}
	/* rdma_cm creates a connection's QP itself (vb_cm_* in cm.c). */
	if (!own_qp)
		return 0;
	vb_qp_init_attr(&init);
	vb->qp = ib_create_qp(vb->pd, &init);
	if (IS_ERR(vb->qp)) {
		int err = PTR_ERR(vb->qp);

		vb->qp = NULL;
		return err;
	}
	vb->psn = get_random_u32() & 0xffffff;
	return 0;
}

/*
 * PD, buffers and CQ on dev, and with own_qp the RC QP the harness connects;
 * without, the caller (rdma_cm) makes the QP.
 */
int vb_open_on(struct ib_device *dev, bool own_qp)
{
	struct ib_port_attr pa;
	int err;

	vb->dev = dev;
	err = ib_query_port(dev, 1, &pa);
	if (err)
		goto err;
	if (pa.state != IB_PORT_ACTIVE) {
		err = -ENETDOWN;
		goto err;
	}
	vb->mtu = pa.active_mtu;
	vb->roce = rdma_protocol_roce(dev, 1);
	vb->lid = pa.lid;
	err = rcconn_pick_gid(dev, &vb->sgid_index, &vb->sgid);
	if (err)
		goto err;
	vb->pd = ib_alloc_pd(dev, IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(vb->pd)) {
		err = PTR_ERR(vb->pd);
		vb->pd = NULL;
		goto err;
	}
	err = vb_alloc_buffers();
	if (!err)
		err = vb_create_qp(own_qp);
	if (!err)
		return 0;
err:
	vb_close();
	return err;
}

int vb_open(struct ib_device *dev)
{
	vb_close();
	return vb_open_on(dev, true);
}

int vb_addr(char *out, size_t len)
{
	if (!vb->qp)
		return -ENOTCONN;
	return scnprintf(out, len, "lid=%u qpn=%u psn=%u rkey=%u raddr=%llu gid=%pI6\n",
			 vb->lid, vb->qp->qp_num, vb->psn,
			 vb->pd->unsafe_global_rkey, vb->region_dma, vb->sgid.raw);
}

/* The path to the port at dlid (IB) or dgid (RoCE), with our side of it; no QP yet. */
struct rcconn_path vb_rc_path(u32 dlid, const union ib_gid *dgid)
{
	return (struct rcconn_path) {
		.roce = vb->roce,
		.dlid = dlid,
		.dgid = *dgid,
		.sgid_index = vb->sgid_index,
		.mtu = vb->mtu,
	};
}

/* Polls cq for one completion, for up to timeout jiffies: 0, or -ETIMEDOUT. */
int vb_poll_one(struct ib_cq *cq, struct ib_wc *wc, unsigned long timeout)
{
	unsigned long deadline = jiffies + timeout;

	while (ib_poll_cq(cq, 1, wc) != 1) {
		if (time_after(jiffies, deadline))
			return -ETIMEDOUT;
		cond_resched();
	}
	return 0;
}

static int vb_to_rts(const struct vb_peer *p)
{
	struct rcconn_path path = vb_rc_path(p->lid, &p->gid);

	path.dest_qpn = p->qpn;
	path.rq_psn = p->psn;
	path.sq_psn = vb->psn;
	return rcconn_to_rts(vb->qp, &path);
}

/* Receives go in before any peer can send (RC would see RNR). */
int vb_post_recvs(void)
{
	u32 i;
	int err;

	for (i = 0; i < VB_RECVS; i++) {
		err = vb_post_recv(i);
		if (err)
			return err;
	}
	vb->sends = 0;
	return 0;
}

int vb_connect(const struct vb_peer *p)
{
	int err;

	if (!vb->qp)
		return -ENOTCONN;
	err = vb_to_rts(p) ?: vb_post_recvs();
	if (err)
		return err;
	vb->peer.qpn = p->qpn;
	vb->peer.rkey = p->rkey;
	vb->peer.raddr = p->raddr;
	return 0;
}

int vb_post_recv(u32 slot)
{
	struct ib_sge sge = {
		.addr = vb->rbuf_dma + (u64)slot * VB_MAX_MSG,
		.length = VB_MAX_MSG,
		.lkey = vb->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 };

	return ib_post_recv(vb->qp, &wr, NULL);
}

/*
 * A SEND with the header word as immediate data. Unsignaled except one in
 * VB_SIGNAL_EVERY, as the paper's protocol does, so the SQ drains.
 */
int vb_post_send(u32 size, u32 word0, bool force_signal)
{
	struct ib_sge sge = {
		.addr = vb->sbuf_dma,
		.length = size,
		.lkey = vb->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_id = U64_MAX,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IB_WR_SEND_WITH_IMM,
		.ex.imm_data = cpu_to_be32(word0),
	};

	if (force_signal || ++vb->sends % VB_SIGNAL_EVERY == 0)
		wr.send_flags = IB_SEND_SIGNALED;
	return ib_post_send(vb->qp, &wr, NULL);
}
