// SPDX-License-Identifier: GPL-2.0
/*
 * The communication primitives (see dsm.h): connections, send-buffer
 * reservation and reclamation, pre-posted receives, the single completion
 * handler and its fallback to process context.
 */
#include <linux/slab.h>
#include <linux/random.h>
#include <linux/delay.h>
#include "dsm.h"
#include "rcconn.h"
#include "dmabuf.h"
#include "cqpoll.h"

/*
 * wr_id of a receive: peer << 32 | slot. Of a send-queue WR: SEND, READ
 * for an RDMA Read, peer at bit 48, the read's index at bit 40, and the
 * WR's post sequence number (mod 2^40) below.
 */
#define DSM_WR_SEND	(1ULL << 63)
#define DSM_WR_READ	(1ULL << 62)
#define DSM_SEQ_MASK	((1ULL << 40) - 1)

static u64 dsm_recv_wrid(u32 peer, u32 slot)
{
	return (u64)peer << 32 | slot;
}

static u64 dsm_send_wrid(u32 peer, u64 seq)
{
	return DSM_WR_SEND | (u64)peer << 48 | (seq & DSM_SEQ_MASK);
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
 * Posts wr (a chain ending in the message's Send, whose slot it is) on the
 * peer's QP. Unsignaled, except every DSM_SIGNAL_EVERY-th WR (for
 * cleanup) and when the sender wants to know (notify); a signaled
 * completion reclaims every buffer posted before it on this QP.
 * Called with p->lock held.
 */
static int dsm_post_chain(struct dsm_comm *c, struct dsm_peer *p,
			  struct ib_send_wr *first, u32 nwr, u32 slot, bool notify)
{
	struct ib_send_wr *wr = first;
	u64 seq = p->post_seq;
	u32 k;
	int err;

	if (p->fifo_tail - p->fifo_head + nwr > DSM_SQ)
		return -EAGAIN;
	for (k = 0; k < nwr; k++, wr = wr->next) {
		seq++;
		wr->wr_id |= dsm_send_wrid(p->id, seq);
		if (seq % DSM_SIGNAL_EVERY == 0 || (notify && !wr->next))
			wr->send_flags |= IB_SEND_SIGNALED;
	}
	err = ib_post_send(p->qp, first, NULL);
	if (err)
		return err;
	for (k = 0; k < nwr; k++) {
		p->post_seq++;
		p->fifo[p->fifo_tail % DSM_SQ] = k == nwr - 1 ? slot : DSM_NO_SLOT;
		p->fifo_seq[p->fifo_tail % DSM_SQ] = p->post_seq;
		p->fifo_tail++;
	}
	return 0;
}

static int dsm_send(struct dsm_comm *c, u32 peer, u32 slot, u32 len,
		    struct ib_rdma_wr *data, bool notify)
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
	if (data)
		data->wr.next = &wr;
	spin_lock_irqsave(&p->lock, flags);
	err = dsm_post_chain(c, p, data ? &data->wr : &wr, data ? 2 : 1, slot,
			     notify);
	if (!err)
		p->msgs_out++;
	spin_unlock_irqrestore(&p->lock, flags);
	if (err)
		return err;
	atomic64_inc(&c->stats.sent);
	atomic64_add(len, &c->stats.msg_bytes);
	if (data)
		atomic64_add(data->wr.sg_list->length, &c->stats.data_bytes);
	return 0;
}

/* On failure the slot stays reserved (the caller may retry or unreserve it). */
int dsm_msg_send(struct dsm_comm *c, u32 peer, u32 slot, u32 len, bool notify)
{
	return dsm_send(c, peer, slot, len, NULL, notify);
}

int dsm_msg_send_data(struct dsm_comm *c, u32 peer, u32 slot, u32 len,
		      u64 src, u64 dst, u32 dlen)
{
	struct ib_sge sge = {
		.addr = src, .length = dlen, .lkey = c->pd->local_dma_lkey,
	};
	struct ib_rdma_wr w = {
		.wr = { .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_RDMA_WRITE },
		.remote_addr = dst,
		.rkey = c->peers[peer].rkey,
	};

	return dsm_send(c, peer, slot, len, &w, false);
}

int dsm_rdma_read(struct dsm_comm *c, u32 peer, u64 dst, u64 src, u32 len,
		  const void *done, u32 dlen)
{
	struct ib_sge sge = { .addr = dst, .length = len, .lkey = c->pd->local_dma_lkey };
	struct ib_rdma_wr w = {
		.wr = { .sg_list = &sge, .num_sge = 1, .opcode = IB_WR_RDMA_READ },
		.remote_addr = src,
	};
	struct dsm_peer *p;
	unsigned long flags;
	u32 i;
	int err;

	if (peer < 1 || peer > c->nodes || !c->peers[peer].connected ||
	    dlen > DSM_DONE_MAX)
		return -EINVAL;
	p = &c->peers[peer];
	w.rkey = p->rkey;
	spin_lock_irqsave(&c->read_lock, flags);
	for (i = 0; i < DSM_READS && c->reads[i].peer; i++)
		;
	if (i < DSM_READS) {
		c->reads[i].peer = peer;
		c->reads[i].len = dlen;
		memcpy(c->reads[i].done, done, dlen);
	}
	spin_unlock_irqrestore(&c->read_lock, flags);
	if (i == DSM_READS)
		return -EAGAIN;
	w.wr.wr_id = DSM_WR_READ | (u64)i << 40;
	spin_lock_irqsave(&p->lock, flags);
	err = dsm_post_chain(c, p, &w.wr, 1, DSM_NO_SLOT, true);
	spin_unlock_irqrestore(&p->lock, flags);
	if (err) {
		WRITE_ONCE(c->reads[i].peer, 0);
		return err;
	}
	atomic64_inc(&c->stats.rdma_reads);
	atomic64_add(len, &c->stats.data_bytes);
	return 0;
}

/* An RDMA Read finished: its `done` message goes to the handler. */
static void dsm_read_done(struct dsm_comm *c, u32 i)
{
	u8 done[DSM_DONE_MAX];
	u32 len;

	if (i >= DSM_READS || !c->reads[i].peer)
		return;
	len = c->reads[i].len;
	memcpy(done, c->reads[i].done, len);
	WRITE_ONCE(c->reads[i].peer, 0);
	dsm_deliver(c, c->self, done, len);
}

/* A signaled send completed: it and everything posted before it are done. */
static void dsm_reclaim(struct dsm_comm *c, u32 peer, u64 seq)
{
	struct dsm_peer *p = &c->peers[peer];
	unsigned long flags;
	u32 i;

	spin_lock_irqsave(&p->lock, flags);
	while (p->fifo_head != p->fifo_tail) {
		i = p->fifo_head % DSM_SQ;
		if ((p->fifo_seq[i] & DSM_SEQ_MASK) > seq)
			break;
		if (p->fifo[i] != DSM_NO_SLOT)
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

/*
 * Stage two: messages the interrupt-context handler could not take, in
 * order; one stays at the head, retried after a short sleep, while the
 * handler still finds its resource short.
 */
static void dsm_defer_work(struct work_struct *w)
{
	struct dsm_comm *c = container_of(w, struct dsm_comm, defer_work);
	struct dsm_deferred *d;
	unsigned long flags;

	for (;;) {
		spin_lock_irqsave(&c->defer_lock, flags);
		d = list_first_entry_or_null(&c->deferred, struct dsm_deferred, link);
		spin_unlock_irqrestore(&c->defer_lock, flags);
		if (!d)
			return;
		if (c->handle(c, d->peer, d->data, d->len, false) == -EAGAIN) {
			usleep_range(20, 100);
			continue;
		}
		spin_lock_irqsave(&c->defer_lock, flags);
		list_del(&d->link);
		spin_unlock_irqrestore(&c->defer_lock, flags);
		kfree(d);
	}
}

void dsm_deliver(struct dsm_comm *c, u32 peer, void *msg, u32 len)
{
	bool queued;
	unsigned long flags;

	spin_lock_irqsave(&c->defer_lock, flags);
	queued = !list_empty(&c->deferred);
	spin_unlock_irqrestore(&c->defer_lock, flags);
	/* Behind a deferred message, or refused here: process context. */
	if (queued || c->handle(c, peer, msg, len, true) == -EAGAIN)
		dsm_defer(c, peer, msg, len);
}

static void dsm_on_recv(struct dsm_comm *c, const struct ib_wc *wc)
{
	u32 peer = wc->wr_id >> 32, slot = (u32)wc->wr_id;
	struct dsm_peer *p;

	if (peer < 1 || peer > c->nodes || slot >= DSM_RECVS)
		return;
	p = &c->peers[peer];
	atomic64_inc(&c->stats.received);
	WRITE_ONCE(p->msgs_in, p->msgs_in + 1);
	/* The buffer is the protocol's only for this call. */
	dsm_deliver(c, peer, p->rbuf + (size_t)slot * DSM_MSG_MAX, wc->byte_len);
	if (dsm_post_recv(c, p, slot))
		pr_err_ratelimited("dsm: cannot re-post a receive to node %u\n", peer);
}

static void dsm_on_wc(struct dsm_comm *c, const struct ib_wc *wc)
{
	if (wc->status != IB_WC_SUCCESS) {
		atomic64_inc(&c->stats.cqe_errors);
		pr_err_ratelimited("dsm: completion error %s (wr_id %llx)\n",
				   ib_wc_status_msg(wc->status), wc->wr_id);
		/* Flushes follow the first error; only that one names a peer. */
		if (wc->status != IB_WC_WR_FLUSH_ERR && c->peer_lost &&
		    (wc->wr_id & DSM_WR_SEND))
			c->peer_lost(c, (wc->wr_id >> 48) & 0x7f, wc->status);
		return;
	}
	if (!(wc->wr_id & DSM_WR_SEND)) {
		dsm_on_recv(c, wc);
		return;
	}
	dsm_reclaim(c, (wc->wr_id >> 48) & 0x7f, wc->wr_id & DSM_SEQ_MASK);
	if (wc->wr_id & DSM_WR_READ)
		dsm_read_done(c, (wc->wr_id >> 40) & 0xff);
}

/* Poll, re-arm, poll what slipped in. */
static void dsm_poll_cq(struct dsm_comm *c, struct ib_cq *cq)
{
	struct ib_wc wc[16];
	int n, i;

	do {
		while ((n = ib_poll_cq(cq, ARRAY_SIZE(wc), wc)) > 0)
			for (i = 0; i < n; i++)
				dsm_on_wc(c, &wc[i]);
	} while (ib_req_notify_cq(cq, IB_CQ_NEXT_COMP |
				  IB_CQ_REPORT_MISSED_EVENTS) > 0);
}

/*
 * The one completion handler, in interrupt context where the provider
 * allows polling there; else the CQ goes to process context for good.
 */
static void dsm_comp_handler(struct ib_cq *cq, void *ctx)
{
	struct dsm_comm *c = ctx;

	if (!READ_ONCE(c->poll_in_task) && !cq_handler_may_poll()) {
		pr_info_once("dsm: %s calls completion handlers under its CQ lock: its CQ is polled in process context\n",
			     dev_name(&cq->device->dev));
		WRITE_ONCE(c->poll_in_task, true);
	}
	if (READ_ONCE(c->poll_in_task))
		schedule_work(&c->poll_work);
	else
		dsm_poll_cq(c, cq);
}

static void dsm_poll_work(struct work_struct *w)
{
	struct dsm_comm *c = container_of(w, struct dsm_comm, poll_work);

	dsm_poll_cq(c, c->cq);
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
			.max_send_wr = DSM_SQ,
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
	c->rkey = c->pd->unsafe_global_rkey;
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
	spin_lock_init(&c->read_lock);
	INIT_LIST_HEAD(&c->deferred);
	INIT_WORK(&c->defer_work, dsm_defer_work);
	INIT_WORK(&c->poll_work, dsm_poll_work);
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
	/* No QP is left to complete: the last poll may still use the CQ. */
	cancel_work_sync(&c->poll_work);
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
	int n = scnprintf(out, len, "node=%u lid=%u psn=%u rkey=%u gid=%pI6 qpns=",
			  c->self, c->lid, c->psn, c->rkey, c->sgid.raw);
	u32 i;

	for (i = 1; i <= c->nodes; i++)
		n += scnprintf(out + n, len - n, "%s%u", i > 1 ? "," : "",
			       c->peers[i].qp ? c->peers[i].qp->qp_num : 0);
	return n + scnprintf(out + n, len - n, "\n");
}

/*
 * The layer's state, for a report of a wait that ran out: messages
 * deferred to process context (and the one at their head), RDMA Reads in
 * flight, and per peer its QP's state, free send buffers and WRs not yet
 * reclaimed. Process context (ib_query_qp may sleep).
 */
int dsm_comm_state(struct dsm_comm *c, char *out, size_t len)
{
	static const char *const qp_states[] = {
		[IB_QPS_RESET] = "RESET", [IB_QPS_INIT] = "INIT",
		[IB_QPS_RTR] = "RTR", [IB_QPS_RTS] = "RTS", [IB_QPS_SQD] = "SQD",
		[IB_QPS_SQE] = "SQE", [IB_QPS_ERR] = "ERR",
	};
	struct ib_qp_init_attr init;
	struct ib_qp_attr attr;
	struct dsm_deferred *m;
	struct dsm_peer *p;
	const char *state;
	unsigned long flags;
	u32 n = 0, head_peer = 0, head_type = 0, reads = 0, i;
	int w;

	spin_lock_irqsave(&c->defer_lock, flags);
	list_for_each_entry(m, &c->deferred, link) {
		if (!n++ && m->len >= sizeof(struct dsm_msg_hdr)) {
			head_peer = m->peer;
			head_type = le16_to_cpu(((struct dsm_msg_hdr *)m->data)->type);
		}
	}
	spin_unlock_irqrestore(&c->defer_lock, flags);
	for (i = 0; i < DSM_READS; i++)
		reads += !!READ_ONCE(c->reads[i].peer);
	w = scnprintf(out, len, "deferred=%u", n);
	if (n)
		w += scnprintf(out + w, len - w, " (head: type %u from node %u)",
			       head_type, head_peer);
	w += scnprintf(out + w, len - w, " reads=%u send_busy=%lld", reads,
		       atomic64_read(&c->stats.send_busy));
	for (i = 1; i <= c->nodes; i++) {
		p = &c->peers[i];
		if (!p->qp || i == c->self)
			continue;
		state = "?";
		if (!ib_query_qp(p->qp, &attr, IB_QP_STATE, &init) &&
		    attr.qp_state <= IB_QPS_ERR)
			state = qp_states[attr.qp_state];
		spin_lock_irqsave(&p->lock, flags);
		w += scnprintf(out + w, len - w,
			       " node%u:qp=%s,free=%u,wrs=%u,out=%llu,in=%llu", i,
			       state, p->nfree, p->fifo_tail - p->fifo_head,
			       p->msgs_out, READ_ONCE(p->msgs_in));
		spin_unlock_irqrestore(&p->lock, flags);
	}
	return w;
}

int dsm_comm_connect(struct dsm_comm *c, u32 peer, u32 lid, u32 qpn, u32 psn,
		     u32 rkey, const union ib_gid *gid)
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
	p->rkey = rkey;
	err = rcconn_to_rts(p->qp, &path);
	/* Every receive goes in before the peer can send: no RNR, no flow control. */
	for (i = 0; !err && i < DSM_RECVS; i++)
		err = dsm_post_recv(c, p, i);
	if (!err)
		p->connected = true;
	return err;
}
