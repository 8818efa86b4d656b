// SPDX-License-Identifier: GPL-2.0
/*
 * The protocol's asynchronous entry points: every message handler runs
 * under the protocol lock, first in the completion handler (interrupt
 * context). A handler first reserves what it needs (send buffers, queue
 * entries) and changes page protections, and only then changes state and
 * sends; any shortage (a busy lock included) returns -EAGAIN with nothing
 * changed, and the communication layer hands the message to process
 * context. Messages to ourselves queue on d->selfq and run right after
 * the handler that sent them, in the same context.
 *
 * A transaction on a page is serialised by its manager (busy from the
 * request to the requester's confirmation; later requests wait in a
 * queue). Read: the owner downgrades to read-only and RDMA-Writes the
 * page into the requester's frame before its DATA message (or, with
 * rdma_read and an owner already read-only, the requester RDMA-Reads it
 * without disturbing the owner). Write: the manager invalidates every
 * other copy and collects the acks, then the owner drops its copy and
 * sends the data (none if the requester holds a valid read copy).
 */
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/delay.h>
#include "proto.h"
#include "proto_int.h"
#include "region.h"

/* A message being built: a send buffer to a peer, or a self message. */
struct dsm_out {
	u32 to, slot;
	struct dsm_pmsg *m;
	struct dsm_selfmsg *sm;
	u64 src, dst;		/* page data by RDMA Write when dst != 0 */
};

/* Pages whose history a report prints, and how much of it. */
#define DSM_REPORT_PAGES	4
#define DSM_REPORT_MSGS		80

/* Short names of the message types, for the trace (dsm_proto_report). */
static const char *const dsm_type_names[DSM_TYPE_END - DSM_PROTO_TYPE_MIN] = {
	"REQ_READ", "REQ_WRITE", "FWD_READ", "FWD_WRITE", "INV", "INV_ACK",
	"DATA_READ", "DATA_WRITE", "FETCH", "FETCH_DONE", "CONFIRM_READ",
	"CONFIRM_WRITE", "BAR_ENTER", "BAR_GO", "LOCK_REQ", "LOCK_GRANT",
	"UNLOCK", "PROBE",
};

static bool page_type(u32 type)
{
	return type >= DSM_PROTO_TYPE_MIN && type < DSM_BAR_ENTER;
}

/* Records a message in the trace; under d->lock. Probes are left out (noise). */
static void trace_msg(struct dsm_proto *d, enum dsm_trace_dir dir, u32 peer,
		      u32 type, u32 arg, u32 node)
{
	struct dsm_trace_ent *e, *last = &d->trace[(d->trace_n - 1) % DSM_TRACE];

	if (type == DSM_PROBE || type >= DSM_TYPE_END)
		return;
	/* A message refused again and again while a resource is short: one entry. */
	if (dir == DSM_TR_AGAIN && d->trace_n && last->dir == DSM_TR_AGAIN &&
	    last->type == type && last->arg == arg && last->peer == peer)
		return;
	e = &d->trace[d->trace_n++ % DSM_TRACE];
	*e = (struct dsm_trace_ent){
		.ns = ktime_get_ns(), .arg = arg, .type = type, .peer = peer,
		.dir = dir, .node = node,
		.prot = page_type(type) && arg < d->npages ?
			dsm_region_prot(d->r, arg) : -1,
	};
}

void dsm_proto_trace_fault(struct dsm_proto *d, u32 dir, u32 page, bool write,
			   bool flag)
{
	spin_lock(&d->lock);
	trace_msg(d, dir, task_pid_nr(current) & 0xff,
		  write ? DSM_REQ_WRITE : DSM_REQ_READ, page, flag);
	spin_unlock(&d->lock);
}

static int out_reserve(struct dsm_proto *d, struct dsm_out *o, u32 to)
{
	o->to = to;
	o->dst = 0;
	o->sm = NULL;
	if (to == d->self) {
		o->sm = kmalloc(sizeof(*o->sm), GFP_ATOMIC);
		o->m = o->sm ? &o->sm->m : NULL;
	} else {
		o->m = dsm_msg_reserve(d->c, to, &o->slot);
	}
	return o->m ? 0 : -EAGAIN;
}

static void out_cancel(struct dsm_proto *d, struct dsm_out *o)
{
	if (o->to == d->self)
		kfree(o->sm);
	else
		dsm_msg_unreserve(d->c, o->to, o->slot);
}

static int out_reserve_n(struct dsm_proto *d, struct dsm_out *o, const u32 *to,
			 u32 n)
{
	u32 k;

	for (k = 0; k < n; k++) {
		if (out_reserve(d, &o[k], to[k])) {
			while (k--)
				out_cancel(d, &o[k]);
			return -EAGAIN;
		}
	}
	return 0;
}

static void post_now(struct dsm_proto *d, u32 to, u32 slot, u32 type, u64 src,
		     u64 dst)
{
	int err;

	if (dst)
		err = dsm_msg_send_data(d->c, to, slot, sizeof(struct dsm_pmsg), src,
					dst, PAGE_SIZE);
	else
		err = dsm_msg_send(d->c, to, slot, sizeof(struct dsm_pmsg), false);
	if (err) {
		/* The send queue is sized for every buffer: the QP is broken. */
		dsm_msg_unreserve(d->c, to, slot);
		atomic64_inc(&d->st.protocol_errors);
		pr_err_ratelimited("dsm: message %u to node %u lost: %d\n", type,
				   to, err);
	}
}

/*
 * Messages wait: a shootdown is in flight, or the process has mprotects to
 * do (a change recorded and not yet known applied).
 */
static bool held_back(struct dsm_proto *d)
{
	return dsm_region_fenced(d->r) ||
	       READ_ONCE(d->usim_recorded) != READ_ONCE(d->usim_applied);
}

/* Posts the held messages once no fence is in flight; under fence_lock. */
static void held_drain(struct dsm_proto *d)
{
	struct dsm_held *h;

	while (d->held_n && !held_back(d)) {
		h = &d->heldq[d->held_head];
		post_now(d, h->to, h->slot, h->type, h->src, h->dst);
		d->held_head = (d->held_head + 1) % DSM_HELD;
		d->held_n--;
	}
}

void dsm_proto_fence_done(struct dsm_proto *d)
{
	unsigned long flags;

	spin_lock_irqsave(&d->fence_lock, flags);
	held_drain(d);
	spin_unlock_irqrestore(&d->fence_lock, flags);
}

/* Posts a written message, or holds it behind a fence (or behind held ones). */
static void post_or_hold(struct dsm_proto *d, u32 to, u32 slot, u32 type, u64 src,
			 u64 dst)
{
	unsigned long flags;
	struct dsm_held *h;

	spin_lock_irqsave(&d->fence_lock, flags);
	if (!d->held_n && !held_back(d)) {
		post_now(d, to, slot, type, src, dst);
	} else {
		h = &d->heldq[(d->held_head + d->held_n++) % DSM_HELD];
		*h = (struct dsm_held){ to, slot, type, src, dst };
		atomic64_inc(&d->st.held);
		/* The fence may have ended between our check and the queueing. */
		held_drain(d);
	}
	spin_unlock_irqrestore(&d->fence_lock, flags);
}

static void out_post(struct dsm_proto *d, struct dsm_out *o, u32 type, u32 arg,
		     u32 node, u32 flags, u64 addr)
{
	struct dsm_pmsg *m = o->m;

	m->h.type = cpu_to_le16(type);
	m->h.from = cpu_to_le16(d->self);
	m->h.seq = 0;
	m->arg = cpu_to_le32(arg);
	m->node = cpu_to_le16(node);
	m->flags = cpu_to_le16(flags);
	m->addr = cpu_to_le64(addr);
	trace_msg(d, DSM_TR_OUT, o->to, type, arg, node);
	if (o->to == d->self) {
		list_add_tail(&o->sm->link, &d->selfq);
		return;
	}
	post_or_hold(d, o->to, o->slot, type, o->src, o->dst);
}

/* One message, reserved and posted at once (nothing to change in between). */
static int send1(struct dsm_proto *d, u32 to, u32 type, u32 arg, u64 addr)
{
	struct dsm_out o;

	if (out_reserve(d, &o, to))
		return -EAGAIN;
	out_post(d, &o, type, arg, 0, 0, addr);
	return 0;
}

/*
 * The user-level simulation's protection change: recorded for the
 * process to mprotect (the paper's third change), with messages held
 * until it has. The access check (dsm_proto_fault) reads the new value
 * at once.
 */
static int protect_usim(struct dsm_proto *d, u32 page, int prot)
{
	unsigned long flags;

	if (d->usim_nops >= DSM_USIM_OPS)
		return -EAGAIN;
	d->usim_ops[d->usim_nops++] = (struct dsm_prot_op){ page, prot };
	dsm_region_record(d->r, page, prot);
	/* Under fence_lock: every message posted from here on is held. */
	spin_lock_irqsave(&d->fence_lock, flags);
	WRITE_ONCE(d->usim_recorded, d->usim_recorded + 1);
	spin_unlock_irqrestore(&d->fence_lock, flags);
	/* Recorded outside SERVE (an application thread's own request): tell the process. */
	if (READ_ONCE(d->usim_server) != current)
		dsm_usim_kick(d);
	return 0;
}

/* 0 when the change is made (everywhere, or fenced); -EAGAIN to retry. */
static int protect1(struct dsm_proto *d, u32 page, int prot)
{
	int err;

	if (d->usim)
		return protect_usim(d, page, prot);
	err = dsm_protect(d->r, &page, 1, prot);

	if (err == DSM_FENCED) {
		atomic64_inc(&d->st.fenced);
		return 0;
	}
	return err;
}

/*
 * Wakes the application's waiting threads. A user-level DSM makes a
 * system call for it (futex), which the simulation charges 1 us for (the
 * paper's second change); its other calls (signal delivery, SERVE,
 * mprotect, FAULT) are real here.
 */
static void wake_app(struct dsm_proto *d)
{
	if (d->usim)
		udelay(1);
	wake_up_all(&d->wq);
}

static void wake_page(struct dsm_proto *d, u32 page)
{
	/* The protection is set before the count moves (dsm_proto_fault_wait). */
	smp_wmb();
	WRITE_ONCE(d->grants[page], d->grants[page] + 1);
	wake_app(d);
}

/*
 * Progress under contention. A DSM fault sleeps until its grant arrives and
 * then the access is retried; with every vCPU busy, the next request's
 * invalidation or forward can take the page before the faulting thread runs
 * again, and it faults again, and so on: litmus's mp with two spinning
 * threads per node took minutes, its writer faulting 13,253 times for 80
 * writes. So a page that lost a grant before its use is contended for
 * DSM_CONTENDED_NS, and while it is, a grant of it is kept (taking it away
 * is refused: -EAGAIN, deferred and retried in order) until the faulting
 * thread has run again, at most DSM_HOLD_MAX_NS: Mirage's time window, ended
 * early by the faulter, and only where it is needed (holding every page
 * made SOR's boundary exchanges five times slower).
 */
#define DSM_HOLD_MAX_NS		(20 * NSEC_PER_MSEC)
#define DSM_CONTENDED_NS	(100 * NSEC_PER_MSEC)

static bool page_held(struct dsm_proto *d, u32 page)
{
	struct dsm_hold *h = &d->hold[page];
	u64 now = ktime_get_ns();

	if (now >= READ_ONCE(h->contended_until) || now >= READ_ONCE(h->until))
		return false;
	if (!h->counted) {
		h->counted = true;
		atomic64_inc(&d->st.kept);
	}
	return true;
}

/* Our grant of the page goes: if its faulting thread has not run yet, it will fault again. */
static void page_taken(struct dsm_proto *d, u32 page)
{
	struct dsm_hold *h = &d->hold[page];

	if (READ_ONCE(h->unused))
		WRITE_ONCE(h->contended_until, ktime_get_ns() + DSM_CONTENDED_NS);
	WRITE_ONCE(h->unused, false);
}

static void page_granted(struct dsm_proto *d, u32 page)
{
	struct dsm_hold *h = &d->hold[page];

	WRITE_ONCE(h->until, ktime_get_ns() + DSM_HOLD_MAX_NS);
	WRITE_ONCE(h->unused, true);
	h->counted = false;
}

void dsm_proto_page_used(struct dsm_proto *d, u32 page)
{
	WRITE_ONCE(d->hold[page].unused, false);
	WRITE_ONCE(d->hold[page].until, 0);
}

static void proto_error(struct dsm_proto *d, const char *what, u32 from, u32 arg)
{
	atomic64_inc(&d->st.protocol_errors);
	pr_err_ratelimited("dsm: protocol error: %s (from node %u, arg %u)\n",
			   what, from, arg);
}

/* ---- manager: starting and finishing transactions ---- */

/* Write, after the invalidations: the owner hands over (or we grant an upgrade). */
static int mgr_write_handover(struct dsm_proto *d, u32 page)
{
	struct dsm_mgr_page *mp = &d->mgr[page];
	u32 w = mp->req_from;
	struct dsm_out o;

	if (out_reserve(d, &o, mp->owner))
		return -EAGAIN;
	if (mp->owner == w)
		out_post(d, &o, DSM_DATA_WRITE, page, w, 0, 0);
	else
		out_post(d, &o, DSM_FWD_WRITE, page, w,
			 mp->copyset & BIT(w - 1) ? 0 : DSM_F_DATA, mp->req_addr);
	return 0;
}

static int mgr_start_read(struct dsm_proto *d, u32 page)
{
	struct dsm_mgr_page *mp = &d->mgr[page];
	u32 from = mp->req_from;
	bool fetch = d->rdma_read && mp->owner_ro;
	struct dsm_out o;

	/*
	 * The owner asks for a copy of its own page: a request that went
	 * after the page was granted to it. dsm_proto_request sends none such
	 * (request_moot); should one come, its frame holds the data, so the
	 * grant goes straight back and it becomes read-only, as any reader,
	 * rather than the owner being told to forward the page to itself.
	 */
	if (mp->owner == from) {
		if (out_reserve(d, &o, from))
			return -EAGAIN;
		atomic64_inc(&d->st.stale);
		out_post(d, &o, DSM_DATA_READ, page, 0, 0, 0);
		return 0;
	}
	if (out_reserve(d, &o, fetch ? from : mp->owner))
		return -EAGAIN;
	if (fetch)
		out_post(d, &o, DSM_FETCH, page, mp->owner, 0, mp->owner_addr);
	else
		out_post(d, &o, DSM_FWD_READ, page, from, 0, mp->req_addr);
	return 0;
}

static int mgr_start_write(struct dsm_proto *d, u32 page)
{
	struct dsm_mgr_page *mp = &d->mgr[page];
	u16 inv = mp->copyset & ~BIT(mp->req_from - 1) & ~BIT(mp->owner - 1);
	struct dsm_out o[DSM_MAX_NODES];
	u32 to[DSM_MAX_NODES], n = 0, k;

	for (k = 1; k <= d->nodes; k++)
		if (inv & BIT(k - 1))
			to[n++] = k;
	if (!n)
		return mgr_write_handover(d, page);
	if (out_reserve_n(d, o, to, n))
		return -EAGAIN;
	mp->acks_left = n;
	for (k = 0; k < n; k++)
		out_post(d, &o[k], DSM_INV, page, 0, 0, 0);
	return 0;
}

/*
 * Opens a transaction on an idle page; -EAGAIN: nothing changed (the
 * request fields are only meaningful while busy).
 */
static int mgr_start(struct dsm_proto *d, u32 page, u32 from, u32 kind, u64 addr)
{
	struct dsm_mgr_page *mp = &d->mgr[page];
	int err;

	mp->req_from = from;
	mp->req_addr = addr;
	err = kind == DSM_REQ_READ ? mgr_start_read(d, page) :
				     mgr_start_write(d, page);
	if (!err)
		mp->busy = 1;
	return err;
}

/* Starts the next queued request on each idle page; what cannot start now is retried later. */
static void mgr_run_waiters(struct dsm_proto *d)
{
	struct dsm_waiter *w, *n;

	list_for_each_entry_safe(w, n, &d->waiting, link) {
		if (d->mgr[w->page].busy)
			continue;
		if (mgr_start(d, w->page, w->from, w->kind, w->addr)) {
			schedule_work(&d->self_work);
			return;
		}
		list_move(&w->link, &d->free_waiters);
	}
}

static int on_request(struct dsm_proto *d, u32 from, u32 type, u32 page, u64 addr)
{
	struct dsm_waiter *w;

	if (dsm_manager(d, page) != d->self) {
		proto_error(d, "request to a page we do not manage", from, page);
		return 0;
	}
	if (!d->mgr[page].busy && !list_empty(&d->waiting))
		mgr_run_waiters(d);
	if (!d->mgr[page].busy)
		return mgr_start(d, page, from, type, addr);
	w = list_first_entry_or_null(&d->free_waiters, struct dsm_waiter, link);
	if (!w)
		return -EAGAIN;
	w->page = page;
	w->from = from;
	w->kind = type;
	w->addr = addr;
	list_move_tail(&w->link, &d->waiting);
	return 0;
}

static int on_inv_ack(struct dsm_proto *d, u32 from, u32 page)
{
	struct dsm_mgr_page *mp = &d->mgr[page];

	if (!mp->busy || !mp->acks_left) {
		proto_error(d, "unexpected invalidation ack", from, page);
		return 0;
	}
	if (mp->acks_left == 1 && mgr_write_handover(d, page))
		return -EAGAIN;
	mp->acks_left--;
	return 0;
}

static int on_confirm(struct dsm_proto *d, u32 from, u32 type, u32 page, u64 addr)
{
	struct dsm_mgr_page *mp = &d->mgr[page];

	if (!mp->busy || mp->req_from != from || mp->acks_left) {
		proto_error(d, "unexpected confirmation", from, page);
		return 0;
	}
	if (type == DSM_CONFIRM_READ) {
		/* The copy set is the readers besides the owner. */
		if (from != mp->owner)
			mp->copyset |= BIT(from - 1);
		mp->owner_ro = 1;
	} else {
		mp->owner = from;
		mp->owner_addr = addr;
		mp->copyset = 0;
		mp->owner_ro = 0;
	}
	mp->busy = 0;
	mgr_run_waiters(d);
	return 0;
}

/* ---- owner and copy holders ---- */

static int on_forward(struct dsm_proto *d, u32 type, u32 page, u32 to, u32 flags,
		      u64 addr)
{
	int prot = type == DSM_FWD_READ ? DSM_PROT_READ : DSM_PROT_NONE;
	struct dsm_out o;

	if (dsm_region_prot(d->r, page) == DSM_PROT_NONE || to == d->self ||
	    to < 1 || to > d->nodes) {
		proto_error(d, "forward to a node that is not the owner", to, page);
		return 0;
	}
	if (page_held(d, page))
		return -EAGAIN;
	if (out_reserve(d, &o, to))
		return -EAGAIN;
	/* No writes of ours may race the copy: protect first. */
	if (protect1(d, page, prot)) {
		out_cancel(d, &o);
		return -EAGAIN;
	}
	page_taken(d, page);
	if (type == DSM_FWD_READ || (flags & DSM_F_DATA)) {
		o.src = d->dma[page];
		o.dst = addr;
	}
	out_post(d, &o, type == DSM_FWD_READ ? DSM_DATA_READ : DSM_DATA_WRITE,
		 page, 0, 0, 0);
	return 0;
}

static int on_inv(struct dsm_proto *d, u32 from, u32 page)
{
	struct dsm_out o;

	if (page_held(d, page))
		return -EAGAIN;
	if (out_reserve(d, &o, from))
		return -EAGAIN;
	if (protect1(d, page, DSM_PROT_NONE)) {
		out_cancel(d, &o);
		return -EAGAIN;
	}
	page_taken(d, page);
	atomic64_inc(&d->st.invalidations);
	out_post(d, &o, DSM_INV_ACK, page, 0, 0, 0);
	return 0;
}

/* ---- requester ---- */

static int on_data(struct dsm_proto *d, u32 type, u32 page)
{
	bool write = type == DSM_DATA_WRITE;
	struct dsm_out o;

	if (out_reserve(d, &o, dsm_manager(d, page)))
		return -EAGAIN;
	if (protect1(d, page, write ? DSM_PROT_RW : DSM_PROT_READ)) {
		out_cancel(d, &o);
		return -EAGAIN;
	}
	page_granted(d, page);
	wake_page(d, page);
	out_post(d, &o, write ? DSM_CONFIRM_WRITE : DSM_CONFIRM_READ, page, 0, 0,
		 d->dma[page]);
	return 0;
}

static int on_fetch(struct dsm_proto *d, u32 page, u32 owner, u64 addr)
{
	struct dsm_pmsg done = {
		.h.type = cpu_to_le16(DSM_FETCH_DONE),
		.h.from = cpu_to_le16(d->self),
		.arg = cpu_to_le32(page),
	};

	if (owner < 1 || owner > d->nodes || owner == d->self) {
		proto_error(d, "fetch from a bad owner", owner, page);
		return 0;
	}
	return dsm_rdma_read(d->c, owner, d->dma[page], addr, PAGE_SIZE, &done,
			     sizeof(done)) ? -EAGAIN : 0;
}

/* ---- barrier (node 1) and lock managers ---- */

static int on_bar_enter(struct dsm_proto *d, u32 from, u32 gen)
{
	struct dsm_out o[DSM_MAX_NODES];
	u32 to[DSM_MAX_NODES], k;

	if (d->self != 1) {
		proto_error(d, "barrier entry at a node other than 1", from, gen);
		return 0;
	}
	if (d->bar_count[gen & 1] + 1 < d->nodes) {
		d->bar_count[gen & 1]++;
		return 0;
	}
	for (k = 0; k < d->nodes; k++)
		to[k] = k + 1;
	if (out_reserve_n(d, o, to, d->nodes))
		return -EAGAIN;
	d->bar_count[gen & 1] = 0;
	for (k = 0; k < d->nodes; k++)
		out_post(d, &o[k], DSM_BAR_GO, gen, 0, 0, 0);
	return 0;
}

static int on_lock_req(struct dsm_proto *d, u32 from, u32 id)
{
	struct dsm_lockmgr *l = &d->locks[id];

	if (!l->holder) {
		if (send1(d, from, DSM_LOCK_GRANT, id, 0))
			return -EAGAIN;
		l->holder = from;
		return 0;
	}
	if (l->qn >= DSM_MAX_NODES) {
		proto_error(d, "lock queue overflow", from, id);
		return 0;
	}
	l->q[(l->qh + l->qn++) % DSM_MAX_NODES] = from;
	return 0;
}

static int on_unlock(struct dsm_proto *d, u32 from, u32 id)
{
	struct dsm_lockmgr *l = &d->locks[id];
	u32 next;

	if (l->holder != from) {
		proto_error(d, "unlock by a node not holding the lock", from, id);
		return 0;
	}
	if (!l->qn) {
		l->holder = 0;
		return 0;
	}
	next = l->q[l->qh];
	if (send1(d, next, DSM_LOCK_GRANT, id, 0))
		return -EAGAIN;
	l->qh = (l->qh + 1) % DSM_MAX_NODES;
	l->qn--;
	l->holder = next;
	return 0;
}

/* ---- dispatch ---- */

static bool msg_ok(struct dsm_proto *d, u32 type, u32 arg)
{
	if (type >= DSM_BAR_ENTER && type <= DSM_BAR_GO)
		return true;
	if (type == DSM_PROBE)
		return true;
	if (type >= DSM_LOCK_REQ)
		return arg < DSM_LOCKS;
	return arg < d->npages;
}

/* One message, under the protocol lock. */
static int proto_dispatch(struct dsm_proto *d, u32 from, const struct dsm_pmsg *m)
{
	u32 type = le16_to_cpu(m->h.type), arg = le32_to_cpu(m->arg);
	u32 node = le16_to_cpu(m->node);
	u64 addr = le64_to_cpu(m->addr);

	if (type >= DSM_TYPE_END || !msg_ok(d, type, arg)) {
		proto_error(d, "bad message", from, type);
		return 0;
	}
	switch (type) {
	case DSM_REQ_READ:
	case DSM_REQ_WRITE:
		return on_request(d, from, type, arg, addr);
	case DSM_FWD_READ:
	case DSM_FWD_WRITE:
		return on_forward(d, type, arg, node, le16_to_cpu(m->flags), addr);
	case DSM_INV:
		return on_inv(d, from, arg);
	case DSM_INV_ACK:
		return on_inv_ack(d, from, arg);
	case DSM_DATA_READ:
	case DSM_DATA_WRITE:
		return on_data(d, type, arg);
	case DSM_FETCH:
		return on_fetch(d, arg, node, addr);
	case DSM_FETCH_DONE:
		return on_data(d, DSM_DATA_READ, arg);
	case DSM_CONFIRM_READ:
	case DSM_CONFIRM_WRITE:
		return on_confirm(d, from, type, arg, addr);
	case DSM_BAR_ENTER:
		return on_bar_enter(d, from, arg);
	case DSM_BAR_GO:
		WRITE_ONCE(d->bar_done, arg);
		wake_app(d);
		return 0;
	case DSM_LOCK_REQ:
		return on_lock_req(d, from, arg);
	case DSM_LOCK_GRANT:
		WRITE_ONCE(d->lock_grants[arg], d->lock_grants[arg] + 1);
		wake_app(d);
		return 0;
	case DSM_UNLOCK:
		return on_unlock(d, from, arg);
	case DSM_PROBE:
		return 0;	/* its delivery is the point: dsm_proto_probe() */
	}
	return 0;
}

static int proto_msg(struct dsm_proto *d, u32 from, const struct dsm_pmsg *m)
{
	int err = proto_dispatch(d, from, m);

	trace_msg(d, err ? DSM_TR_AGAIN : DSM_TR_IN, from,
		  le16_to_cpu(m->h.type), le32_to_cpu(m->arg),
		  le16_to_cpu(m->node));
	return err;
}

/* Our messages to ourselves, in order; a stuck one waits for self_work. */
static void proto_drain(struct dsm_proto *d, bool in_irq)
{
	struct dsm_selfmsg *sm;

	while ((sm = list_first_entry_or_null(&d->selfq, struct dsm_selfmsg, link))) {
		if ((in_irq && d->process_only) || proto_msg(d, d->self, &sm->m)) {
			schedule_work(&d->self_work);
			return;
		}
		list_del(&sm->link);
		kfree(sm);
	}
}

static void proto_self_work(struct work_struct *w)
{
	struct dsm_proto *d = container_of(w, struct dsm_proto, self_work);
	bool again;

	do {
		spin_lock(&d->lock);
		mgr_run_waiters(d);
		proto_drain(d, false);
		again = !list_empty(&d->selfq);
		spin_unlock(&d->lock);
		if (again)
			usleep_range(20, 100);
	} while (again);
	/* Changes recorded here reach the simulated user level by its signal. */
	if (READ_ONCE(d->usim) && READ_ONCE(d->usim_nops))
		dsm_usim_kick(d);
}

/* The communication layer's entry point for protocol messages. */
int dsm_proto_handle(struct dsm_comm *c, u32 peer, void *msg, u32 len, bool in_irq)
{
	struct dsm_proto *d = c->proto;
	int err;

	if (!d || len < sizeof(struct dsm_pmsg) ||
	    le16_to_cpu(((struct dsm_pmsg *)msg)->h.from) != peer)
		return 0;
	/* Simulated user level: the process handles it when its signal comes. */
	if (READ_ONCE(d->usim))
		return dsm_usim_queue(d, peer, msg);
	if (in_irq) {
		/* Interrupts are off: nothing of ours on this CPU holds the lock. */
		if (READ_ONCE(d->process_only) || !spin_trylock(&d->lock))
			return -EAGAIN;
	} else {
		spin_lock(&d->lock);
	}
	err = proto_msg(d, peer, msg);
	if (!err) {
		atomic64_inc(in_irq ? &d->st.handled_irq : &d->st.handled_process);
		proto_drain(d, in_irq);
	}
	spin_unlock(&d->lock);
	return err;
}

int dsm_proto_handle_now(struct dsm_proto *d, u32 peer, const struct dsm_pmsg *m)
{
	int err;

	spin_lock(&d->lock);
	err = proto_msg(d, peer, m);
	if (!err) {
		atomic64_inc(&d->st.handled_process);
		proto_drain(d, false);
	}
	spin_unlock(&d->lock);
	return err;
}

void dsm_proto_usim_applied(struct dsm_proto *d)
{
	unsigned long flags;
	bool released = false;

	spin_lock(&d->lock);
	spin_lock_irqsave(&d->fence_lock, flags);
	if (d->usim_applied != d->usim_handed) {
		WRITE_ONCE(d->usim_applied, d->usim_handed);
		held_drain(d);
		released = true;
	}
	spin_unlock_irqrestore(&d->fence_lock, flags);
	spin_unlock(&d->lock);
	if (released)
		wake_up_all(&d->wq);
}

void dsm_proto_usim_release(struct dsm_proto *d)
{
	spin_lock(&d->lock);
	d->usim_nops = 0;
	d->usim_handed = d->usim_recorded;
	spin_unlock(&d->lock);
	dsm_proto_usim_applied(d);
}

/*
 * A node is gone (a WR to it ran out of retries). Sequential consistency
 * cannot go on without it: the protocol goes dead, so waiting faults get
 * SIGBUS and calls -ENODEV instead of hanging. Interrupt context; no lock
 * is needed, `dead` is only ever set, and waiters re-read it after a wake.
 */
void dsm_proto_peer_lost(struct dsm_comm *c, u32 peer,
			 enum ib_wc_status status)
{
	struct dsm_proto *d = c->proto;

	if (!d || READ_ONCE(d->dead))
		return;
	pr_err("dsm: node %u lost node %u (%s); this DSM is dead\n",
	       d->self, peer, ib_wc_status_msg(status));
	WRITE_ONCE(d->dead, true);
	wake_up_all(&d->wq);
}

/*
 * A wait of ours has run long: a PROBE to every peer. IB tells a requester,
 * not a waiter, that its peer is gone: a node waiting for an answer from a
 * peer that died after acknowledging the request has nothing outstanding
 * to fail. The probe is such a WR: over a dead peer its retries run out
 * and the protocol goes dead (dsm_proto_peer_lost) within a second or so,
 * not at the end of the wait. Best effort: with no send buffer free to a
 * peer, WRs to it are outstanding anyway.
 */
void dsm_proto_probe(struct dsm_proto *d)
{
	u32 i;

	spin_lock(&d->lock);
	for (i = 1; i <= d->nodes; i++)
		if (i != d->self && !send1(d, i, DSM_PROBE, 0, 0))
			atomic64_inc(&d->st.probes);
	spin_unlock(&d->lock);
}

/*
 * The access a fault's request asks for is ours already: granted between
 * the fault's look and now (another thread's request was answered, and
 * that thread let go of the page's request slot). Checked under the
 * protocol lock, where grants are made, so a request that goes is never
 * stale: the manager would take it for a request the page's owner makes
 * of itself. Not sent; the fault's wait ends at once, as the grant moved
 * the count it waits on.
 */
static bool request_moot(struct dsm_proto *d, u32 type, u32 page)
{
	int need = type == DSM_REQ_WRITE ? DSM_PROT_RW : DSM_PROT_READ;

	if ((type != DSM_REQ_READ && type != DSM_REQ_WRITE) ||
	    dsm_region_prot(d->r, page) < need)
		return false;
	atomic64_inc(&d->st.moot);
	return true;
}

int dsm_proto_request(struct dsm_proto *d, u32 to, u32 type, u32 arg, u64 addr)
{
	int err;

	for (;;) {
		if (READ_ONCE(d->dead))
			return -ENODEV;
		spin_lock(&d->lock);
		if (request_moot(d, type, arg)) {
			spin_unlock(&d->lock);
			return 0;
		}
		err = send1(d, to, type, arg, addr);
		if (!err)
			proto_drain(d, false);
		spin_unlock(&d->lock);
		if (err != -EAGAIN)
			return err;
		usleep_range(20, 100);
	}
}

/* Pages listed one by one in a state report; the rest are counted. */
#define DSM_STATE_PAGES	8

/*
 * This node's side of the protocol, for a wait that ran out and for
 * `dsmctl state`: the communication layer's line, then what the protocol
 * holds back, the locks this node holds or wants, the lock managers'
 * holders and queues here, the transactions open at this manager and our
 * own requests in flight. Process context; a snapshot, not a consistent cut
 * across nodes.
 */
int dsm_proto_state(struct dsm_proto *d, char *out, size_t len)
{
	struct dsm_mgr_page *mp;
	struct dsm_lockmgr *l;
	struct dsm_waiter *w;
	u32 waiting = 0, busy = 0, mine = 0, i;
	int n;

	/* A device removed under us took the connections (dsm_close): none to show. */
	if (READ_ONCE(d->c->proto) == d && !READ_ONCE(d->dead))
		n = dsm_comm_state(d->c, out, len);
	else
		n = scnprintf(out, len, "connections closed");
	spin_lock(&d->lock);
	list_for_each_entry(w, &d->waiting, link)
		waiting++;
	n += scnprintf(out + n, len - n,
		       "\nselfq=%s held=%u fenced=%d waiting=%u dead=%d probes=%lld bar_gen=%u bar_done=%u bar_count=%u,%u locks_wanted=%*pbl",
		       list_empty(&d->selfq) ? "empty" : "queued", d->held_n,
		       dsm_region_fenced(d->r), waiting, READ_ONCE(d->dead),
		       atomic64_read(&d->st.probes), READ_ONCE(d->bar_gen), READ_ONCE(d->bar_done),
		       d->bar_count[0], d->bar_count[1], DSM_LOCKS,
		       d->held);
	for (i = 0; i < DSM_LOCKS; i++) {
		l = &d->locks[i];
		if (l->holder)
			n += scnprintf(out + n, len - n, " lock%u:holder=%u,queued=%u",
				       i, l->holder, l->qn);
	}
	n += scnprintf(out + n, len - n, "\n");
	for (i = 0; i < d->npages; i++) {
		mp = &d->mgr[i];
		if (dsm_manager(d, i) == d->self && mp->busy &&
		    busy++ < DSM_STATE_PAGES)
			n += scnprintf(out + n, len - n,
				       "page%u:open,from=%u,owner=%u,acks_left=%u ",
				       i, mp->req_from, mp->owner, mp->acks_left);
		if (READ_ONCE(d->inflight[i]) && mine++ < DSM_STATE_PAGES)
			n += scnprintf(out + n, len - n,
				       "page%u:requested,prot=%d,grants=%u ", i,
				       dsm_region_prot(d->r, i), READ_ONCE(d->grants[i]));
	}
	spin_unlock(&d->lock);
	return n + scnprintf(out + n, len - n, "open=%u requested=%u\n", busy,
			     mine);
}


/* The trace's latest entries for one page, oldest first, into e[]; how many. */
static u32 trace_page(struct dsm_proto *d, u32 page, struct dsm_trace_ent *e)
{
	u32 n = 0, k, i;

	spin_lock(&d->lock);
	for (k = 0; k < DSM_TRACE && k < d->trace_n && n < DSM_REPORT_MSGS; k++) {
		i = (d->trace_n - 1 - k) % DSM_TRACE;
		if (page_type(d->trace[i].type) && d->trace[i].arg == page)
			e[n++] = d->trace[i];
	}
	spin_unlock(&d->lock);
	for (k = 0; k < n / 2; k++)
		swap(e[k], e[n - 1 - k]);
	return n;
}

/*
 * A page's recent messages here, in the kernel log: time (us before now),
 * in/again/out, the type, the peer, the node field and the page's
 * protection after a handled one.
 */
static void report_page(struct dsm_proto *d, u32 page, struct dsm_trace_ent *e)
{
	static const char *const dir[] = { "in", "again", "out", "fault", "done" };
	u64 now = ktime_get_ns();
	u32 n = trace_page(d, page, e), k;

	pr_err("dsm: node %u: page %u: its last %u messages here\n", d->self, page, n);
	for (k = 0; k < n; k++)
		pr_err("dsm: node %u: page %u: -%lluus %s %s peer=%u node=%u prot=%d\n",
		       d->self, page, (now - e[k].ns) / NSEC_PER_USEC, dir[e[k].dir],
		       dsm_type_names[e[k].type - DSM_PROTO_TYPE_MIN], e[k].peer,
		       e[k].node, e[k].prot);
}

/*
 * The state report in the kernel log, a line at a time, then the history
 * of the pages open at this manager or requested here.
 */
void dsm_proto_report(struct dsm_proto *d)
{
	char *buf = kmalloc(DSM_STATE_MAX, GFP_KERNEL), *line, *rest;
	struct dsm_trace_ent *e = kmalloc_array(DSM_REPORT_MSGS, sizeof(*e), GFP_KERNEL);
	u32 pages[DSM_REPORT_PAGES], np = 0, i;

	if (!buf || !e)
		goto out;
	dsm_proto_state(d, buf, DSM_STATE_MAX);
	rest = buf;
	while ((line = strsep(&rest, "\n")))
		if (*line)
			pr_err("dsm: node %u: state: %s\n", d->self, line);
	spin_lock(&d->lock);
	for (i = 0; i < d->npages && np < DSM_REPORT_PAGES; i++)
		if ((dsm_manager(d, i) == d->self && d->mgr[i].busy) ||
		    READ_ONCE(d->inflight[i]))
			pages[np++] = i;
	spin_unlock(&d->lock);
	for (i = 0; i < np; i++)
		report_page(d, pages[i], e);
out:
	kfree(e);
	kfree(buf);
}

int dsm_proto_config(struct dsm_proto *d, enum dsm_mode mode, bool rdma_read)
{
	int err = 0;

	spin_lock(&d->lock);
	/* The simulation changes how the space is mapped: before any application. */
	if ((mode == DSM_MODE_USER_SIM) != d->usim &&
	    dsm_region_set_usim(d->r, mode == DSM_MODE_USER_SIM))
		err = -EBUSY;
	if (!err) {
		WRITE_ONCE(d->usim, mode == DSM_MODE_USER_SIM);
		WRITE_ONCE(d->process_only, mode == DSM_MODE_TASK_QUEUE);
		d->rdma_read = rdma_read;
	}
	spin_unlock(&d->lock);
	return err;
}

/* ---- session set-up and tear-down ---- */

static void dsm_proto_free(struct dsm_proto *d)
{
	struct dsm_selfmsg *sm, *n;
	u32 i;

	cancel_work_sync(&d->self_work);
	list_for_each_entry_safe(sm, n, &d->selfq, link)
		kfree(sm);
	/* No shootdown may call back into a freed protocol. */
	if (d->r)
		dsm_region_quiesce(d->r);
	kfree(d->heldq);
	dsm_usim_free(d);
	if (d->dma)
		for (i = 0; i < d->npages && d->dma[i]; i++)
			ib_dma_unmap_page(d->dev, d->dma[i], PAGE_SIZE,
					  DMA_BIDIRECTIONAL);
	kvfree(d->dma);
	d->dma = NULL;
	kvfree(d->mgr);
	kvfree(d->grants);
	kvfree(d->hold);
	kvfree(d->inflight);
	kvfree(d->trace);
	dsm_region_put(d->r);
	kfree(d);
}

static int dsm_proto_map(struct dsm_proto *d)
{
	u64 a;
	u32 i;

	for (i = 0; i < d->npages; i++) {
		a = ib_dma_map_page(d->dev, dsm_region_page(d->r, i), 0, PAGE_SIZE,
				    DMA_BIDIRECTIONAL);
		if (ib_dma_mapping_error(d->dev, a))
			return -ENOMEM;
		d->dma[i] = a;
	}
	return 0;
}

/* Every page starts zeroed, owned and writable by its manager. */
static void dsm_proto_init_pages(struct dsm_proto *d)
{
	u32 i;

	for (i = 0; i < d->npages; i++) {
		d->mgr[i].owner = dsm_manager(d, i);
		if (d->mgr[i].owner == d->self) {
			d->mgr[i].owner_addr = d->dma[i];
			protect1(d, i, DSM_PROT_RW);
		}
	}
}

int dsm_proto_open(struct dsm_comm *c, u32 npages)
{
	struct dsm_proto *d = kzalloc(sizeof(*d), GFP_KERNEL);
	u32 i;
	int err = -ENOMEM;

	if (!d)
		return -ENOMEM;
	d->c = c;
	d->dev = c->dev;
	d->self = c->self;
	d->nodes = c->nodes;
	d->npages = npages;
	spin_lock_init(&d->lock);
	spin_lock_init(&d->fence_lock);
	spin_lock_init(&d->usim_lock);
	INIT_LIST_HEAD(&d->usim_q);
	mutex_init(&d->usim_serve);
	mutex_init(&d->req_lock);
	init_waitqueue_head(&d->wq);
	INIT_LIST_HEAD(&d->waiting);
	INIT_LIST_HEAD(&d->free_waiters);
	INIT_LIST_HEAD(&d->selfq);
	INIT_WORK(&d->self_work, proto_self_work);
	for (i = 0; i < DSM_WAITERS; i++)
		list_add(&d->waiters[i].link, &d->free_waiters);
	d->r = dsm_region_create(npages);
	d->dma = kvcalloc(npages, sizeof(*d->dma), GFP_KERNEL);
	d->mgr = kvcalloc(npages, sizeof(*d->mgr), GFP_KERNEL);
	d->grants = kvcalloc(npages, sizeof(*d->grants), GFP_KERNEL);
	d->hold = kvcalloc(npages, sizeof(*d->hold), GFP_KERNEL);
	d->inflight = kvcalloc(npages, 1, GFP_KERNEL);
	d->trace = kvcalloc(DSM_TRACE, sizeof(*d->trace), GFP_KERNEL);
	d->heldq = kcalloc(DSM_HELD, sizeof(*d->heldq), GFP_KERNEL);
	d->usim_ops = kcalloc(DSM_USIM_OPS, sizeof(*d->usim_ops), GFP_KERNEL);
	if (!d->r || !d->dma || !d->mgr || !d->grants || !d->hold ||
	    !d->inflight || !d->trace || !d->heldq || !d->usim_ops)
		goto err;
	err = dsm_proto_map(d);
	if (err)
		goto err;
	dsm_proto_init_pages(d);
	c->proto = d;
	dsm_region_publish(d->r, d);
	return 0;
err:
	dsm_proto_free(d);
	return err;
}

/*
 * Closes the session: the protocol, then the connections. -EBUSY while an
 * application has the space open, unless force (the device is going):
 * then the protocol is left dead for that application (its faults and
 * calls fail) and freed never, as its space may still be mapped.
 */
int dsm_close(struct dsm_comm *c, bool force)
{
	struct dsm_proto *d = c->proto;
	bool busy = d && !dsm_region_retract(d->r);
	u32 i;

	if (busy && !force)
		return -EBUSY;
	c->proto = NULL;
	dsm_comm_close(c);
	if (!d)
		return 0;
	if (!busy) {
		dsm_proto_free(d);
		return 0;
	}
	pr_warn("dsm: device removed under a running application; its DSM is dead\n");
	WRITE_ONCE(d->dead, true);
	wake_up_all(&d->wq);
	cancel_work_sync(&d->self_work);
	for (i = 0; i < d->npages && d->dma[i]; i++)
		ib_dma_unmap_page(d->dev, d->dma[i], PAGE_SIZE, DMA_BIDIRECTIONAL);
	return 0;
}
