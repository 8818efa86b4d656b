// SPDX-License-Identifier: GPL-2.0
/*
 * Connections through rdma_cm, as the kernel's storage protocols make
 * them: the server listens on a TCP-space port of all its addresses (an
 * IPoIB address on hcab0, an IP address on rxe0's netdev); the client
 * resolves the server's address (ARP, over IPoIB on IB), its route (an SA
 * PathRecord on IB) and connects. Each side's rkey and region address
 * travel as private data. Afterwards ping-pong and bandwidth run as over a
 * connection the harness set up.
 *
 * Locking: the client's steps run in its control command (vb_ctl.lock
 * held) and wait for events its handler only records. The server's
 * connection request is handled in the event handler, which takes
 * vb_ctl.lock itself, with trylock: a command that holds the lock may be
 * destroying ids, which waits for their handlers.
 */
#include <linux/inet.h>
#include <linux/in.h>
#include <rdma/rdma_cm.h>
#include "vbench.h"

#define VB_CM_TIMEOUT_MS	5000

/* What each side tells the other in the REQ and the REP. */
struct vb_cm_priv {
	__be32 rkey;
	__be64 raddr;
} __packed;

static struct {
	struct mutex *ctl_lock;
	struct rdma_cm_id *listen;
	struct rdma_cm_id *id;		/* the connection, either side */
	struct completion event;	/* a client step's event came */
	enum rdma_cm_event_type last;
	int status;
	struct completion established;	/* server: the connection is up */
} cm;

void vb_cm_init(struct mutex *ctl_lock)
{
	cm.ctl_lock = ctl_lock;
	init_completion(&cm.event);
	init_completion(&cm.established);
}

static void vb_cm_take_peer(const struct rdma_conn_param *p)
{
	const struct vb_cm_priv *priv = p->private_data;

	if (p->private_data_len < sizeof(*priv))
		return;
	vb->peer.rkey = be32_to_cpu(priv->rkey);
	vb->peer.raddr = be64_to_cpu(priv->raddr);
}

static void vb_cm_param(struct rdma_conn_param *p, struct vb_cm_priv *priv)
{
	priv->rkey = cpu_to_be32(vb->pd->unsafe_global_rkey);
	priv->raddr = cpu_to_be64(vb->region_dma);
	*p = (struct rdma_conn_param) {
		.private_data = priv,
		.private_data_len = sizeof(*priv),
		.responder_resources = 1,
		.initiator_depth = 1,
		.retry_count = 7,
		.rnr_retry_count = 7,
	};
}

/* Resources on the id's device and the id's QP, receives posted. */
static int vb_cm_setup(struct rdma_cm_id *id)
{
	struct ib_qp_init_attr init;
	int err;

	vb_close();
	err = vb_open_on(id->device, false);
	if (err)
		return err;
	vb_qp_init_attr(&init);
	err = rdma_create_qp(id, vb->pd, &init);
	if (err) {
		vb_close();
		return err;
	}
	vb->qp = id->qp;
	err = vb_post_recvs();
	if (err) {
		rdma_destroy_qp(id);
		vb->qp = NULL;
		vb_close();
	}
	return err;
}

/* Client: each step's event, recorded for the waiting command. */
static int vb_cm_client_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
		vb_cm_take_peer(&ev->param.conn);
	cm.last = ev->event;
	cm.status = ev->status;
	complete(&cm.event);
	return 0;
}

static int vb_cm_step(enum rdma_cm_event_type want)
{
	if (!wait_for_completion_timeout(&cm.event,
					 msecs_to_jiffies(2 * VB_CM_TIMEOUT_MS)))
		return -ETIMEDOUT;
	if (cm.last == want)
		return 0;
	pr_warn("vbench: rdma_cm: %s (status %d) instead of %s\n",
		rdma_event_msg(cm.last), cm.status, rdma_event_msg(want));
	return cm.last == RDMA_CM_EVENT_REJECTED ? -ECONNREFUSED : -EHOSTUNREACH;
}

int vb_cm_connect(const char *addr, u16 port)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct rdma_conn_param param;
	struct vb_cm_priv priv;
	struct rdma_cm_id *id;
	int err;

	if (!in4_pton(addr, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL))
		return -EINVAL;
	vb_close();
	id = rdma_create_id(&init_net, vb_cm_client_handler, NULL, RDMA_PS_TCP,
			    IB_QPT_RC);
	if (IS_ERR(id))
		return PTR_ERR(id);
	reinit_completion(&cm.event);
	err = rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, VB_CM_TIMEOUT_MS) ?:
	      vb_cm_step(RDMA_CM_EVENT_ADDR_RESOLVED);
	if (!err) {
		reinit_completion(&cm.event);
		err = rdma_resolve_route(id, VB_CM_TIMEOUT_MS) ?:
		      vb_cm_step(RDMA_CM_EVENT_ROUTE_RESOLVED);
	}
	if (!err)
		err = vb_cm_setup(id);
	if (err) {
		rdma_destroy_id(id);
		return err;
	}
	cm.id = id;
	vb_cm_param(&param, &priv);
	reinit_completion(&cm.event);
	err = rdma_connect(id, &param) ?: vb_cm_step(RDMA_CM_EVENT_ESTABLISHED);
	if (err)
		vb_close();
	return err;
}

/* Server: a connection request sets up resources on its device and accepts. */
static int vb_cm_request(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	struct rdma_conn_param param;
	struct vb_cm_priv priv;
	int err;

	if (!mutex_trylock(cm.ctl_lock))
		return -EBUSY;	/* rdma_cm rejects and destroys the new id */
	err = vb_cm_setup(id);
	if (!err) {
		vb_cm_take_peer(&ev->param.conn);
		vb_cm_param(&param, &priv);
		reinit_completion(&cm.established);
		err = rdma_accept(id, &param);
		if (err) {
			rdma_destroy_qp(id);
			vb->qp = NULL;
			vb_close();
		} else {
			cm.id = id;
		}
	}
	mutex_unlock(cm.ctl_lock);
	return err;
}

static int vb_cm_server_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		return vb_cm_request(id, ev);
	case RDMA_CM_EVENT_ESTABLISHED:
		complete(&cm.established);
		return 0;
	default:
		pr_info("vbench: rdma_cm: %s (status %d)\n",
			rdma_event_msg(ev->event), ev->status);
		return 0;
	}
}

int vb_cm_listen(u16 port)
{
	struct sockaddr_in any = {
		.sin_family = AF_INET,
		.sin_port = htons(port),
		.sin_addr.s_addr = htonl(INADDR_ANY),
	};
	struct rdma_cm_id *id;
	int err;

	vb_close();
	vb_cm_close_listener();
	id = rdma_create_id(&init_net, vb_cm_server_handler, NULL, RDMA_PS_TCP,
			    IB_QPT_RC);
	if (IS_ERR(id))
		return PTR_ERR(id);
	err = rdma_bind_addr(id, (struct sockaddr *)&any) ?: rdma_listen(id, 1);
	if (err) {
		rdma_destroy_id(id);
		return err;
	}
	cm.listen = id;
	return 0;
}

/* Server: waits for the connection to be up; its address for the harness. */
int vb_cm_wait(char *out, size_t len)
{
	if (!cm.listen)
		return -ENOTCONN;
	if (!wait_for_completion_timeout(&cm.established,
					 msecs_to_jiffies(4 * VB_CM_TIMEOUT_MS)))
		return -ETIMEDOUT;
	return scnprintf(out, len, "connected qpn=%u peer_rkey=%u\n",
			 vb->qp ? vb->qp->qp_num : 0, vb->peer.rkey);
}

void vb_cm_close_listener(void)
{
	if (cm.listen) {
		rdma_destroy_id(cm.listen);
		cm.listen = NULL;
	}
}

/* Tears an rdma_cm connection down (its QP first); false if there was none. */
bool vb_cm_close_connection(void)
{
	struct rdma_cm_id *id = cm.id;

	if (!id)
		return false;
	cm.id = NULL;
	rdma_disconnect(id);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	return true;
}
