// SPDX-License-Identifier: GPL-2.0
/*
 * A vendor MAD through ib_mad and the GSI QP (QP1) to our own port: the
 * MAD layer's send path (UD WQE with an address handle and Q_Key), the
 * HCA's loopback, and the MAD layer's receive path and dispatch (GRH room,
 * source QP, P_Key index) all have to work for it to arrive. Caller holds
 * the control lock (vb_ctl.lock); the handlers run in ib_mad's workqueue.
 */
#include <rdma/ib_mad.h>
#include "vbench.h"

#define VB_MAD_CLASS	0x09	/* vendor range 1: no OUI needed */
#define VB_MAD_TID	0x5eedf00dULL

struct vb_mad {
	struct completion sent, received;
	int send_status;
	u64 tid;
	u32 src_qp, slid;
};

static void vb_mad_send_done(struct ib_mad_agent *agent,
			     struct ib_mad_send_wc *wc)
{
	struct vb_mad *m = agent->context;

	m->send_status = wc->status;
	complete(&m->sent);
}

static void vb_mad_recv(struct ib_mad_agent *agent, struct ib_mad_send_buf *buf,
			struct ib_mad_recv_wc *wc)
{
	struct vb_mad *m = agent->context;

	m->tid = be64_to_cpu(wc->recv_buf.mad->mad_hdr.tid);
	m->src_qp = wc->wc->src_qp;
	m->slid = wc->wc->slid;
	ib_free_recv_mad(wc);
	complete(&m->received);
}

static int vb_mad_send(struct ib_mad_agent *agent)
{
	struct rdma_ah_attr attr = { .type = RDMA_AH_ATTR_TYPE_IB };
	struct ib_mad_send_buf *msg;
	struct ib_mad_hdr *hdr;
	int err;

	msg = ib_create_send_mad(agent, 1, 0, 0, IB_MGMT_MAD_HDR,
				 IB_MGMT_MAD_DATA, GFP_KERNEL,
				 IB_MGMT_BASE_VERSION);
	if (IS_ERR(msg))
		return PTR_ERR(msg);
	hdr = msg->mad;
	hdr->base_version = IB_MGMT_BASE_VERSION;
	hdr->mgmt_class = VB_MAD_CLASS;
	hdr->class_version = 1;
	hdr->method = IB_MGMT_METHOD_SET;
	hdr->tid = cpu_to_be64(VB_MAD_TID);
	rdma_ah_set_dlid(&attr, vb->lid);
	rdma_ah_set_port_num(&attr, 1);
	msg->ah = rdma_create_ah(agent->qp->pd, &attr, RDMA_CREATE_AH_SLEEPABLE);
	if (IS_ERR(msg->ah)) {
		err = PTR_ERR(msg->ah);
		ib_free_send_mad(msg);
		return err;
	}
	err = ib_post_send_mad(msg, NULL);
	if (err)
		goto out;
	if (!wait_for_completion_timeout(&((struct vb_mad *)agent->context)->sent,
					 10 * HZ))
		err = -ETIMEDOUT;
out:
	rdma_destroy_ah(msg->ah, RDMA_DESTROY_AH_SLEEPABLE);
	ib_free_send_mad(msg);
	return err;
}

int vb_mad(char *out, size_t len)
{
	struct ib_mad_reg_req req = {
		.mgmt_class = VB_MAD_CLASS,
		.mgmt_class_version = 1,
	};
	struct ib_mad_agent *agent;
	struct vb_mad m = {};
	int err;

	if (!vb->dev)
		return -ENOTCONN;
	if (vb->roce)
		return -EOPNOTSUPP;
	init_completion(&m.sent);
	init_completion(&m.received);
	set_bit(IB_MGMT_METHOD_SET, req.method_mask);
	agent = ib_register_mad_agent(vb->dev, 1, IB_QPT_GSI, &req, 0,
				      vb_mad_send_done, vb_mad_recv, &m, 0);
	if (IS_ERR(agent))
		return PTR_ERR(agent);
	err = vb_mad_send(agent);
	if (!err && !wait_for_completion_timeout(&m.received, 10 * HZ))
		err = -ETIMEDOUT;
	ib_unregister_mad_agent(agent);
	if (err)
		return err;
	return scnprintf(out, len, "mad send_status=%d tid_ok=%d src_qp=%u slid_ok=%d\n",
			 m.send_status, m.tid == VB_MAD_TID, m.src_qp,
			 m.slid == vb->lid);
}
