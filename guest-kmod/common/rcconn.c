// SPDX-License-Identifier: GPL-2.0
/* See rcconn.h. */
#include <rdma/ib_cache.h>
#include "rcconn.h"

/* RoCE needs a GID; prefer the IPv4-mapped RoCEv2 one (routable over eth). */
int rcconn_pick_gid(struct ib_device *dev, int *index, union ib_gid *gid)
{
	const struct ib_gid_attr *a;
	int i, best = -1;

	for (i = 0; i < dev->port_data[1].immutable.gid_tbl_len; i++) {
		a = rdma_get_gid_attr(dev, 1, i);
		if (IS_ERR(a))
			continue;
		if (best < 0 || (ipv6_addr_v4mapped((struct in6_addr *)a->gid.raw) &&
				 a->gid_type == IB_GID_TYPE_ROCE_UDP_ENCAP))
			best = i;
		rdma_put_gid_attr(a);
	}
	if (best < 0)
		return -ENODEV;
	*index = best;
	return rdma_query_gid(dev, 1, best, gid);
}

static void rcconn_set_av(struct rdma_ah_attr *ah, const struct rcconn_path *p)
{
	union ib_gid dgid = p->dgid;

	if (p->roce) {
		ah->type = RDMA_AH_ATTR_TYPE_ROCE;
		rdma_ah_set_grh(ah, &dgid, 0, p->sgid_index, 64, 0);
	} else {
		ah->type = RDMA_AH_ATTR_TYPE_IB;
		rdma_ah_set_dlid(ah, p->dlid);
	}
	rdma_ah_set_port_num(ah, 1);
}

/* RESET -> INIT -> RTR -> RTS with remote read/write (and atomics) allowed on our side. */
int rcconn_to_rts(struct ib_qp *qp, const struct rcconn_path *p)
{
	struct ib_qp_attr a = {};
	int err;

	a.qp_state = IB_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			    IB_ACCESS_REMOTE_READ;
	if (p->atomics)
		a.qp_access_flags |= IB_ACCESS_REMOTE_ATOMIC;
	err = ib_modify_qp(qp, &a, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT |
			   IB_QP_ACCESS_FLAGS);
	if (err)
		return err;
	memset(&a, 0, sizeof(a));
	a.qp_state = IB_QPS_RTR;
	a.path_mtu = p->mtu;
	a.dest_qp_num = p->dest_qpn;
	a.rq_psn = p->rq_psn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	rcconn_set_av(&a.ah_attr, p);
	err = ib_modify_qp(qp, &a, IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU |
			   IB_QP_DEST_QPN | IB_QP_RQ_PSN |
			   IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER);
	if (err)
		return err;
	memset(&a, 0, sizeof(a));
	a.qp_state = IB_QPS_RTS;
	a.sq_psn = p->sq_psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	return ib_modify_qp(qp, &a, IB_QP_STATE | IB_QP_SQ_PSN | IB_QP_TIMEOUT |
			    IB_QP_RETRY_CNT | IB_QP_RNR_RETRY |
			    IB_QP_MAX_QP_RD_ATOMIC);
}
