/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rcconn: what every kernel consumer in guest-kmod needs to connect an RC
 * QP to an address the harness handed in, over IB (LID) or RoCE (GID):
 * picking our GID and walking the QP through INIT, RTR and RTS. Compiled
 * into each module that uses it (vbench, dsm).
 */
#ifndef RCCONN_H
#define RCCONN_H

#include <rdma/ib_verbs.h>

/* The far end and our side of one RC connection. */
struct rcconn_path {
	bool roce;
	u32 dlid;		/* IB */
	union ib_gid dgid;	/* RoCE */
	int sgid_index;		/* RoCE */
	enum ib_mtu mtu;
	u32 dest_qpn;
	u32 rq_psn;		/* the peer's starting PSN */
	u32 sq_psn;		/* ours */
	bool atomics;		/* allow remote atomics on our side too */
};

int rcconn_pick_gid(struct ib_device *dev, int *index, union ib_gid *gid);
int rcconn_to_rts(struct ib_qp *qp, const struct rcconn_path *p);

#endif /* RCCONN_H */
