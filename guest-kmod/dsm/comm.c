// SPDX-License-Identifier: GPL-2.0
/*
 * The communication primitives (see dsm.h): connections, send-buffer
 * reservation and reclamation, pre-posted receives, the single completion
 * handler and its fallback to process context.
 */
#include <linux/slab.h>
#include <linux/random.h>
#include "dsm.h"
#include "rcconn.h"
#include "dmabuf.h"

#define DSM_WR_SEND	(1ULL << 63)

static u64 dsm_recv_wrid(u32 peer, u32 slot)
{
	return (u64)peer << 32 | slot;
}

static u64 dsm_send_wrid(u32 peer, u64 seq)
{
	return DSM_WR_SEND | (u64)peer << 48 | (seq & ((1ULL << 48) - 1));
}

static int dsm_post_recv(struct dsm_comm *c, struct dsm_peer *p, u32 slot)
{
	struct ib_sge sge = {
		.addr = p->rbuf_dma + (u64)slot * DSM_MSG_MAX,
		.length = DSM_MSG_MAX,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_id = dsm_recv_wrid(p->id, slot),
		.sg_list = &sge,
		.num_sge = 1,
	};

	return ib_post_recv(p->qp, &wr, NULL);
}

/* A slot to fill, or NULL when every buffer is in flight (-EBUSY for the caller). */
void *dsm_msg_reserve(struct dsm_comm *c, u32 peer, u32 *slot)
{
	struct dsm_peer *p = &c->peers[peer];
	unsigned long flags;

	if (peer < 1 || peer > c->nodes || !p->connected)
		return NULL;
	spin_lock_irqsave(&p->lock, flags);
	if (!p->nfree) {
		spin_unlock_irqrestore(&p->lock, flags);
		atomic64_inc(&c->stats.send_busy);
		return NULL;
	}
	*slot = p->free[--p->nfree];
	spin_unlock_irqrestore(&p->lock, flags);
	return p->sbuf + (size_t)*slot * DSM_MSG_MAX;
}

void dsm_msg_unreserve(struct dsm_comm *c, u32 peer, u32 slot)
{
	struct dsm_peer *p = &c->peers[peer];
	unsigned long flags;

	spin_lock_irqsave(&p->lock, flags);
	p->free[p->nfree++] = slot;
	spin_unlock_irqrestore(&p->lock, flags);
}

/*
 * Posts a reserved slot. Unsignaled, except every DSM_SIGNAL_EVERY-th WR
 * (for cleanup) and when the sender wants to know (notify); a signaled
 * completion reclaims every buffer posted before it on this QP.
 */
int dsm_msg_send(struct dsm_comm *c, u32 peer, u32 slot, u32 len, bool notify)
{
	struct dsm_peer *p = &c->peers[peer];
	struct ib_sge sge = {
		.addr = p->sbuf_dma + (u64)slot * DSM_MSG_MAX,
		.length = len,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_SEND };
	unsigned long flags;
	int err;

	if (len < sizeof(struct dsm_msg_hdr) || len > DSM_MSG_MAX)
		return -EINVAL;
	spin_lock_irqsave(&p->lock, flags);
	p->post_seq++;
	wr.wr_id = dsm_send_wrid(peer, p->post_seq);
	if (notify || p->post_seq % DSM_SIGNAL_EVERY == 0)
		wr.send_flags = IB_SEND_SIGNALED;
	err = ib_post_send(p->qp, &wr, NULL);
	if (err) {
		p->post_seq--;
		p->free[p->nfree++] = slot;
	} else {
		p->fifo[p->fifo_tail % DSM_SENDS] = slot;
		p->fifo_seq[p->fifo_tail % DSM_SENDS] = p->post_seq;
		p->fifo_tail++;
	}
	spin_unlock_irqrestore(&p->lock, flags);
	if (!err)
		atomic64_inc(&c->stats.sent);
	return err;
}

/* A signaled send completed: it and everything posted before it are done. */
static void dsm_reclaim(struct dsm_comm *c, u32 peer, u64 seq)
{
	struct dsm_peer *p = &c->peers[peer];
	unsigned long flags;
	u32 i;

	spin_lock_irqsave(&p->lock, flags);
	while (p->fifo_head != p->fifo_tail) {
		i = p->fifo_head % DSM_SENDS;
		if (p->fifo_seq[i] > seq)
			break;
		p->free[p->nfree++] = p->fifo[i];
		p->fifo_head++;
	}
	spin_unlock_irqrestore(&p->lock, flags);
}

static void dsm_defer(struct dsm_comm *c, u32 peer, void *msg, u32 len)
{
	struct dsm_deferred *d = kmalloc(sizeof(*d) + len, GFP_ATOMIC);
	unsigned long flags;

	if (!d) {
		pr_err_ratelimited("dsm: message from node %u lost: no memory\n", peer);
		return;
	}
	d->peer = peer;
	d->len = len;
	memcpy(d->data, msg, len);
	spin_lock_irqsave(&c->defer_lock, flags);
	list_add_tail(&d->link, &c->deferred);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	atomic64_inc(&c->stats.deferred);
	schedule_work(&c->defer_work);
}

/* Stage two: messages the interrupt-context handler could not take. */
static void dsm_defer_work(struct work_struct *w)
{
	struct dsm_comm *c = container_of(w, struct dsm_comm, defer_work);
	struct dsm_deferred *d;
	unsigned long flags;

	for (;;) {
		spin_lock_irqsave(&c->defer_lock, flags);
		d = list_first_entry_or_null(&c->deferred, struct dsm_deferred, link);
		if (d)
			list_del(&d->link);
		spin_unlock_irqrestore(&c->defer_lock, flags);
		if (!d)
			return;
		c->handle(c, d->peer, d->data, d->len, false);
		kfree(d);
	}
}

static void dsm_on_recv(struct dsm_comm *c, const struct ib_wc *wc)
{
	u32 peer = wc->wr_id >> 32, slot = (u32)wc->wr_id;
	struct dsm_peer *p;
	void *msg;

	if (peer < 1 || peer > c->nodes || slot >= DSM_RECVS)
		return;
	p = &c->peers[peer];
	msg = p->rbuf + (size_t)slot * DSM_MSG_MAX;
	atomic64_inc(&c->stats.received);
	/* The buffer is the protocol's only for this call. */
	if (c->handle(c, peer, msg, wc->byte_len, true) == -EAGAIN)
		dsm_defer(c, peer, msg, wc->byte_len);
	if (dsm_post_recv(c, p, slot))
		pr_err_ratelimited("dsm: cannot re-post a receive to node %u\n", peer);
}

static void dsm_on_wc(struct dsm_comm *c, const struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS) {
		atomic64_inc(&c->stats.cqe_errors);
		pr_err_ratelimited("dsm: completion error %s (wr_id %llx)\n",
				   ib_wc_status_msg(wc->status), wc->wr_id);
		return;
	}
	if (wc->wr_id & DSM_WR_SEND)
		dsm_reclaim(c, (wc->wr_id >> 48) & 0x7fff,
			    wc->wr_id & ((1ULL << 48) - 1));
	else
		dsm_on_recv(c, wc);
}

/* The one completion handler, in interrupt context: poll, re-arm, poll what slipped in. */
static void dsm_comp_handler(struct ib_cq *cq, void *ctx)
{
	struct dsm_comm *c = ctx;
	struct ib_wc wc[16];
	int n, i;

	do {
		while ((n = ib_poll_cq(cq, ARRAY_SIZE(wc), wc)) > 0)
			for (i = 0; i < n; i++)
				dsm_on_wc(c, &wc[i]);
	} while (ib_req_notify_cq(cq, IB_CQ_NEXT_COMP |
				  IB_CQ_REPORT_MISSED_EVENTS) > 0);
}

static void dsm_free_peer(struct dsm_comm *c, struct dsm_peer *p)
{
	if (p->qp)
		ib_destroy_qp(p->qp);
	dmabuf_free(c->dev, p->rbuf, p->rbuf_dma, DSM_RECVS * DSM_MSG_MAX,
		    DMA_FROM_DEVICE);
	dmabuf_free(c->dev, p->sbuf, p->sbuf_dma, DSM_SENDS * DSM_MSG_MAX,
		    DMA_TO_DEVICE);
	memset(p, 0, sizeof(*p));
}

static int dsm_init_peer(struct dsm_comm *c, u32 id)
{
	struct dsm_peer *p = &c->peers[id];
	struct ib_qp_init_attr init = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.cap = {
			.max_send_wr = DSM_SENDS,
			.max_recv_wr = DSM_RECVS,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.qp_type = IB_QPT_RC,
	};
	u32 i;
	int err;

	p->id = id;
	spin_lock_init(&p->lock);
	for (i = 0; i < DSM_SENDS; i++)
		p->free[i] = i;
	p->nfree = DSM_SENDS;
	p->rbuf = dmabuf_alloc(c->dev, DSM_RECVS * DSM_MSG_MAX, &p->rbuf_dma,
			       DMA_FROM_DEVICE);
	p->sbuf = dmabuf_alloc(c->dev, DSM_SENDS * DSM_MSG_MAX, &p->sbuf_dma,
			       DMA_TO_DEVICE);
	if (!p->rbuf || !p->sbuf)
		return -ENOMEM;
	p->qp = ib_create_qp(c->pd, &init);
	if (IS_ERR(p->qp)) {
		err = PTR_ERR(p->qp);
		p->qp = NULL;
	}
	return err;
}

static int dsm_open_device(struct dsm_comm *c)
{
	struct ib_cq_init_attr ca = { .cqe = DSM_MAX_NODES * (DSM_SENDS + DSM_RECVS) };
	struct ib_port_attr pa;
	int err;

	err = ib_query_port(c->dev, 1, &pa);
	if (err)
		return err;
	if (pa.state != IB_PORT_ACTIVE)
		return -ENETDOWN;
	c->lid = pa.lid;
	c->mtu = pa.active_mtu;
	c->roce = rdma_protocol_roce(c->dev, 1);
	c->psn = get_random_u32() & 0xffffff;
	err = rcconn_pick_gid(c->dev, &c->sgid_index, &c->sgid);
	if (err)
		return err;
	c->pd = ib_alloc_pd(c->dev, IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(c->pd)) {
		err = PTR_ERR(c->pd);
		c->pd = NULL;
		return err;
	}
	c->cq = ib_create_cq(c->dev, dsm_comp_handler, NULL, c, &ca);
	if (IS_ERR(c->cq)) {
		err = PTR_ERR(c->cq);
		c->cq = NULL;
	}
	return err;
}

int dsm_comm_open(struct dsm_comm *c, struct ib_device *dev, u32 self, u32 nodes)
{
	u32 i;
	int err;

	if (nodes < 2 || nodes > DSM_MAX_NODES || self < 1 || self > nodes)
		return -EINVAL;
	c->dev = dev;
	c->self = self;
	c->nodes = nodes;
	spin_lock_init(&c->defer_lock);
	INIT_LIST_HEAD(&c->deferred);
	INIT_WORK(&c->defer_work, dsm_defer_work);
	err = dsm_open_device(c);
	for (i = 1; !err && i <= nodes; i++)
		if (i != self)
			err = dsm_init_peer(c, i);
	if (!err)
		err = ib_req_notify_cq(c->cq, IB_CQ_NEXT_COMP);
	if (err)
		dsm_comm_close(c);
	return err;
}

void dsm_comm_close(struct dsm_comm *c)
{
	struct dsm_deferred *d, *n;
	u32 i;

	if (!c->dev)
		return;
	for (i = 1; i <= DSM_MAX_NODES; i++)
		dsm_free_peer(c, &c->peers[i]);
	if (c->cq)
		ib_destroy_cq(c->cq);
	cancel_work_sync(&c->defer_work);
	list_for_each_entry_safe(d, n, &c->deferred, link)
		kfree(d);
	if (c->pd)
		ib_dealloc_pd(c->pd);
	memset(c, 0, sizeof(*c));
}

/* Our address for every peer: the QPN it must connect to is qpn[its id]. */
int dsm_comm_addr(struct dsm_comm *c, char *out, size_t len)
{
	int n = scnprintf(out, len, "node=%u lid=%u psn=%u gid=%pI6 qpns=",
			  c->self, c->lid, c->psn, c->sgid.raw);
	u32 i;

	for (i = 1; i <= c->nodes; i++)
		n += scnprintf(out + n, len - n, "%s%u", i > 1 ? "," : "",
			       c->peers[i].qp ? c->peers[i].qp->qp_num : 0);
	return n + scnprintf(out + n, len - n, "\n");
}

int dsm_comm_connect(struct dsm_comm *c, u32 peer, u32 lid, u32 qpn, u32 psn,
		     const union ib_gid *gid)
{
	struct rcconn_path path = {
		.roce = c->roce,
		.dlid = lid,
		.sgid_index = c->sgid_index,
		.mtu = c->mtu,
		.dest_qpn = qpn,
		.rq_psn = psn,
		.sq_psn = c->psn,
	};
	struct dsm_peer *p;
	u32 i;
	int err;

	if (peer < 1 || peer > c->nodes || peer == c->self)
		return -EINVAL;
	p = &c->peers[peer];
	if (!p->qp || p->connected)
		return -EALREADY;
	path.dgid = *gid;
	err = rcconn_to_rts(p->qp, &path);
	/* Every receive goes in before the peer can send: no RNR, no flow control. */
	for (i = 0; !err && i < DSM_RECVS; i++)
		err = dsm_post_recv(c, p, i);
	if (!err)
		p->connected = true;
	return err;
}
