// SPDX-License-Identifier: GPL-2.0
/*
 * A real user-level DSM: the kernel DSM's protocol (page-based sequential
 * consistency, single writer / multiple readers, write-invalidate, Li &
 * Hudak's fixed distributed managers: page p at node p % nodes + 1, the
 * barrier at node 1, lock l at node l % nodes + 1) run by this library in
 * the application's process, over libibverbs, with no help from dsm.ko.
 *
 * Memory: the shared space is a memfd mapped twice. The application's
 * view is mprotected per page (PROT_NONE: no copy, PROT_READ: a read
 * copy, RW: the owner's writable copy); an access it does not allow is a
 * SIGSEGV whose handler (in the faulting thread) sends the request and
 * waits for the grant. The service view is always writable: page data
 * arrives there while the application's view still forbids access.
 *
 * Messages: one RC QP to every peer, two-sided SENDs of a small header,
 * followed by the page for data messages (copied out of and into the
 * service view: one page copy each way, no remote keys to exchange). One
 * CQ takes every completion. The service thread handles every received
 * message: DSM_MODE=user sleeps on a completion channel (poll() on its fd
 * and on an eventfd that application threads kick when they queue a
 * message to this node itself); DSM_MODE=user-poll polls the CQ, yielding
 * the CPU when it finds nothing.
 *
 * A transaction on a page is serialised by its manager as in the kernel
 * (proto.c): busy from the request to the requester's confirmation, later
 * requests queued. Read: the owner drops to read-only and sends the page.
 * Write: the manager invalidates every other copy and collects the acks;
 * the owner drops its copy and sends the page (without it when the
 * requester holds a read copy, or is the owner itself).
 *
 * Locking: u.lock guards all protocol state. Handlers run under it in the
 * service thread only; application threads take it to send a request and
 * wait on u.cv (grants, barrier, locks, free send buffers). Only the
 * service thread polls the CQ. A send with no free buffer waits on u.cv in
 * an application thread; in the service thread it polls the CQ for send
 * completions, keeping the receives it finds for later (u.backlog).
 *
 * Threat model: a peer's message is hostile. Its sender must be the node
 * whose QP it came on; type, page, lock id, node, generation and length
 * are checked against the state they claim to change, and any mismatch is
 * a fatal protocol error naming the message, never a write out of bounds.
 * Peers run on the same architecture: the header is in host byte order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include "udsm.h"

#define U_MAX_NODES	16
#define U_PAGE		4096
#define U_PAGES		2048	/* as the kernel DSM's default (ctl.c) */
#define U_RECVS		128	/* receive buffers per peer */
#define U_SENDS		128	/* send buffers per peer */
#define U_SELFQ		4096	/* messages to ourselves not yet handled */
#define U_BATCH		16

enum u_type {
	U_REQ_READ = 1,		/* to the manager */
	U_REQ_WRITE,
	U_FWD_READ,		/* to the owner: send node the page */
	U_FWD_WRITE,		/* same, and drop ours; U_F_DATA: with the data */
	U_INV,			/* to a copy holder: drop it, ack to the manager */
	U_INV_ACK,
	U_DATA_READ,		/* to the requester: a read copy (always with data) */
	U_DATA_WRITE,		/* ownership; U_F_DATA: the page follows */
	U_CONFIRM_READ,		/* to the manager: transaction done */
	U_CONFIRM_WRITE,
	U_BAR_ENTER,		/* arg = barrier generation, to node 1 */
	U_BAR_GO,
	U_LOCK_REQ,		/* arg = lock id, to its manager */
	U_LOCK_GRANT,
	U_UNLOCK,
	U_TYPE_END
};

static const char *const u_names[U_TYPE_END] = {
	"?", "REQ_READ", "REQ_WRITE", "FWD_READ", "FWD_WRITE", "INV", "INV_ACK",
	"DATA_READ", "DATA_WRITE", "CONFIRM_READ", "CONFIRM_WRITE", "BAR_ENTER",
	"BAR_GO", "LOCK_REQ", "LOCK_GRANT", "UNLOCK",
};

#define U_F_DATA	1

struct u_msg {
	uint16_t type, from;
	uint32_t arg;		/* page, lock id or barrier generation */
	uint16_t node;		/* FWD_*: the requester */
	uint16_t flags;
	uint32_t len;		/* bytes after the header: 0 or U_PAGE */
};

#define U_SLOT	(sizeof(struct u_msg) + U_PAGE)

/* wr_id: bit 32 set for sends, the peer in bits 16..31, the buffer in 0..15. */
#define U_WR_SEND	(1ULL << 32)

enum { U_NONE, U_READ, U_RW };	/* a page's access here, and a request's kind */

/* A page's state at its manager. */
struct u_mgr {
	uint16_t copyset;	/* read copies besides the owner's: bit node - 1 */
	uint8_t owner;
	uint8_t busy;		/* a transaction is open */
	uint8_t req, kind;	/* its requester and kind */
	uint8_t acks;		/* invalidations not yet acknowledged */
	uint16_t inv;		/* the nodes they went to: bit node - 1 */
	uint8_t qh, qn;		/* requests waiting: q[] entries (node | 0x80 for a write) */
	uint8_t q[U_MAX_NODES];
};

struct u_lockmgr {
	uint8_t holder;		/* 0: free */
	uint8_t qh, qn;
	uint8_t q[U_MAX_NODES];
};

struct u_peer {
	struct ibv_qp *qp;
	uint8_t *rbuf, *sbuf;
	struct ibv_mr *rmr, *smr;
	uint16_t free[U_SENDS];	/* free send buffers (a stack) */
	unsigned nfree;
	uint32_t lid, psn, qpn;	/* the peer's, for our QP */
	union ibv_gid gid;
};

static struct {
	int poll;
	unsigned self, nodes, npages, timeout_s;
	size_t size;
	uint8_t *app, *svc;	/* the application's view, the service view */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	uint8_t port;
	int gid_index, global;
	uint32_t psn;
	struct u_peer peer[U_MAX_NODES + 1];
	int kick;		/* eventfd: the self queue has messages */
	pthread_t service;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	unsigned send_waiters;
	/* this node's pages */
	uint8_t *prot, *want, *own;
	uint64_t *req_ns;	/* when our request for the page went out */
	/* pages, barrier and locks this node manages */
	struct u_mgr *mgr;
	uint32_t bar_count, bar_released;
	uint32_t bar_entered[U_MAX_NODES + 1];
	struct u_lockmgr locks[DSM_LOCKS];
	/* the synchronous side */
	uint32_t bar_gen, bar_done;
	uint8_t lock_wait[DSM_LOCKS], lock_granted[DSM_LOCKS];
	pthread_mutex_t local[DSM_LOCKS];	/* a node's threads queue here per lock */
	/* messages to ourselves, and receives found while waiting for a send buffer */
	struct u_msg *selfq;
	unsigned sq_head, sq_n;
	struct ibv_wc *backlog;
	unsigned bl_head, bl_n, bl_max;
	struct dsm_stats_user st;
} u;

static __thread int in_service;
static int trace;	/* DSM_TRACE=1: every message sent and handled, on stderr */

static void trace_msg(const char *dir, unsigned peer, const struct u_msg *m)
{
	if (trace)
		fprintf(stderr, "dsm: node %u %s %u: %s %u node=%u flags=%u\n", u.self, dir,
			peer, m->type < U_TYPE_END ? u_names[m->type] : "?", m->arg, m->node,
			m->flags);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static unsigned env_uint(const char *name, unsigned def, unsigned lo, unsigned hi)
{
	const char *v = getenv(name);
	unsigned long x;
	char *end;

	if (!v || !*v)
		return def;
	x = strtoul(v, &end, 10);
	if (*end || x < lo || x > hi)
		dsm_die("%s=%s: want %u to %u", name, v, lo, hi);
	return x;
}

int udsm_mode(void)
{
	const char *m = getenv("DSM_MODE");

	if (!m || !*m || !strcmp(m, "kernel"))
		return 0;
	if (!strcmp(m, "user"))
		return 1;
	if (!strcmp(m, "user-poll"))
		return 2;
	dsm_die("DSM_MODE=%s: want kernel, user or user-poll", m);
}

static unsigned manager(uint32_t page)
{
	return page % u.nodes + 1;
}

static void __attribute__((noreturn, format(printf, 2, 3)))
proto_error(const struct u_msg *m, const char *fmt, ...)
{
	char why[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	dsm_die("protocol error: %s %u from node %u (node %u, flags %u, len %u): %s",
		m->type < U_TYPE_END ? u_names[m->type] : "?", m->arg, m->from,
		m->node, m->flags, m->len, why);
}

/* A wait's deadline, for pthread_cond_timedwait (u.cv uses CLOCK_MONOTONIC). */
static struct timespec deadline(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += u.timeout_s;
	return ts;
}

static void wait_cv(const struct timespec *until, const char *what, unsigned arg)
{
	int err = pthread_cond_timedwait(&u.cv, &u.lock, until);

	if (err == ETIMEDOUT)
		dsm_die("%s %u: no answer in %u s (DSM_TIMEOUT)", what, arg, u.timeout_s);
	if (err)
		dsm_die("pthread_cond_timedwait: %s", strerror(err));
}

static void set_prot(uint32_t page, int prot)
{
	static const int bits[] = { PROT_NONE, PROT_READ, PROT_READ | PROT_WRITE };

	if (u.prot[page] == prot)
		return;
	if (mprotect(u.app + (size_t)page * U_PAGE, U_PAGE, bits[prot]))
		dsm_die("mprotect of page %u: %s", page, strerror(errno));
	u.prot[page] = prot;
}

/* ---- completions and sends ---- */

static void kick(void)
{
	uint64_t one = 1;

	if (!u.poll && write(u.kick, &one, sizeof(one)) != sizeof(one))
		dsm_die("eventfd write: %s", strerror(errno));
}

static void post_recv(unsigned peer, unsigned slot)
{
	struct u_peer *p = &u.peer[peer];
	struct ibv_sge sge = {
		.addr = (uintptr_t)(p->rbuf + slot * U_SLOT),
		.length = U_SLOT,
		.lkey = p->rmr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)peer << 16 | slot, .sg_list = &sge,
				  .num_sge = 1 }, *bad;
	int err = ibv_post_recv(p->qp, &wr, &bad);

	if (err)
		dsm_die("ibv_post_recv to node %u: %s", peer, strerror(err));
}

/* Takes one batch of completions: sends free their buffers, receives go to the backlog. */
static int reap(void)
{
	struct ibv_wc wc[U_BATCH];
	int n = ibv_poll_cq(u.cq, U_BATCH, wc), i;
	unsigned peer, slot;

	if (n < 0)
		dsm_die("ibv_poll_cq failed");
	for (i = 0; i < n; i++) {
		peer = wc[i].wr_id >> 16 & 0xffff;
		slot = wc[i].wr_id & 0xffff;
		if (wc[i].status != IBV_WC_SUCCESS)
			dsm_die("%s to node %u failed: %s (vendor error %u)",
				wc[i].wr_id & U_WR_SEND ? "send" : "receive", peer,
				ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
		if (wc[i].wr_id & U_WR_SEND) {
			u.peer[peer].free[u.peer[peer].nfree++] = slot;
			if (u.send_waiters)
				pthread_cond_broadcast(&u.cv);
			continue;
		}
		if (u.bl_n == u.bl_max)
			dsm_die("receive backlog overflow");	/* more than we posted: a bug */
		u.backlog[(u.bl_head + u.bl_n++) % u.bl_max] = wc[i];
	}
	return n;
}

static void send_msg(unsigned to, unsigned type, uint32_t arg, unsigned node,
		     unsigned flags)
{
	struct u_msg m = { .type = type, .from = u.self, .arg = arg, .node = node,
			   .flags = flags };
	struct timespec until = deadline();
	struct u_peer *p = &u.peer[to];
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	unsigned slot;
	uint64_t t0;
	uint8_t *buf;
	int err;

	/* Only the DATA messages carry the page; U_F_DATA on a FWD asks for it. */
	if (flags & U_F_DATA && (type == U_DATA_READ || type == U_DATA_WRITE))
		m.len = U_PAGE;
	trace_msg("to", to, &m);
	if (to == u.self) {
		/* Never with data: the protocol sends no page to its own node. */
		if (u.sq_n == U_SELFQ)
			dsm_die("self queue overflow (%u messages)", U_SELFQ);
		u.selfq[(u.sq_head + u.sq_n++) % U_SELFQ] = m;
		if (!in_service)
			kick();
		return;
	}
	t0 = now_ns();
	while (!p->nfree) {
		if (in_service) {
			if (!reap() && now_ns() - t0 > u.timeout_s * 1000000000ULL)
				dsm_die("no send completion from node %u in %u s", to,
					u.timeout_s);
			continue;
		}
		u.send_waiters++;
		wait_cv(&until, "send buffer to node", to);
		u.send_waiters--;
	}
	slot = p->free[--p->nfree];
	buf = p->sbuf + slot * U_SLOT;
	memcpy(buf, &m, sizeof(m));
	if (m.len)
		memcpy(buf + sizeof(m), u.svc + (size_t)arg * U_PAGE, U_PAGE);
	sge = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = sizeof(m) + m.len,
				.lkey = p->smr->lkey };
	wr = (struct ibv_send_wr){ .wr_id = U_WR_SEND | (uint64_t)to << 16 | slot,
				   .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED };
	err = ibv_post_send(p->qp, &wr, &bad);
	if (err)
		dsm_die("ibv_post_send %s to node %u: %s", u_names[type], to, strerror(err));
	u.st.msgs_sent++;
	u.st.msg_bytes += sizeof(m) + m.len;
	u.st.data_bytes += m.len;
}

/* ---- the manager's side ---- */

static void mgr_start(uint32_t page, unsigned from, unsigned kind);

static void mgr_proceed_write(uint32_t page)
{
	struct u_mgr *mp = &u.mgr[page];
	unsigned r = mp->req;

	if (mp->owner == r)
		send_msg(r, U_DATA_WRITE, page, 0, 0);
	else
		send_msg(mp->owner, U_FWD_WRITE, page, r,
			 mp->copyset & 1u << (r - 1) ? 0 : U_F_DATA);
}

static void mgr_start(uint32_t page, unsigned from, unsigned kind)
{
	struct u_mgr *mp = &u.mgr[page];
	unsigned n;

	mp->busy = 1;
	mp->req = from;
	mp->kind = kind;
	if (kind == U_READ) {
		/* The owner never loses its copy but to a write: it has no cause to ask. */
		if (mp->owner == from)
			dsm_die("protocol error: a read request for page %u from its owner, node %u",
				page, from);
		send_msg(mp->owner, U_FWD_READ, page, from, 0);
		return;
	}
	mp->acks = 0;
	mp->inv = 0;
	for (n = 1; n <= u.nodes; n++) {
		if (n == from || n == mp->owner || !(mp->copyset & 1u << (n - 1)))
			continue;
		send_msg(n, U_INV, page, 0, 0);
		mp->inv |= 1u << (n - 1);
		mp->acks++;
	}
	if (!mp->acks)
		mgr_proceed_write(page);
}

static void mgr_request(const struct u_msg *m, unsigned kind)
{
	struct u_mgr *mp = &u.mgr[m->arg];
	unsigned n;

	if (!mp->busy) {
		mgr_start(m->arg, m->from, kind);
		return;
	}
	/* A node has one request per page open: a second one is a lie. */
	if (mp->req == m->from || mp->qn == u.nodes)
		proto_error(m, "a second request from the node");
	for (n = 0; n < mp->qn; n++)
		if ((mp->q[(mp->qh + n) % U_MAX_NODES] & 0x7f) == m->from)
			proto_error(m, "a second request from the node");
	mp->q[(mp->qh + mp->qn++) % U_MAX_NODES] = m->from | (kind == U_RW ? 0x80 : 0);
}

static void mgr_done(uint32_t page)
{
	struct u_mgr *mp = &u.mgr[page];
	uint8_t next;

	mp->busy = 0;
	if (!mp->qn)
		return;
	next = mp->q[mp->qh];
	mp->qh = (mp->qh + 1) % U_MAX_NODES;
	mp->qn--;
	mgr_start(page, next & 0x7f, next & 0x80 ? U_RW : U_READ);
}

/* ---- handlers (service thread, under u.lock) ---- */

static void handle(const struct u_msg *m, const uint8_t *data)
{
	uint32_t page = m->arg;
	struct u_mgr *mp;
	unsigned n;

	u.st.handled_process++;
	trace_msg("from", m->from, m);
	if (m->type >= U_REQ_READ && m->type <= U_CONFIRM_WRITE && page >= u.npages)
		proto_error(m, "no such page (%u pages)", u.npages);
	if ((m->len != 0) != (m->type == U_DATA_READ ||
			      (m->type == U_DATA_WRITE && m->flags & U_F_DATA)))
		proto_error(m, "data where none belongs, or none where it does");
	mp = page < u.npages ? &u.mgr[page] : NULL;
	switch (m->type) {
	case U_REQ_READ:
	case U_REQ_WRITE:
		if (manager(page) != u.self)
			proto_error(m, "not the page's manager");
		mgr_request(m, m->type == U_REQ_READ ? U_READ : U_RW);
		break;
	case U_INV_ACK:
	case U_CONFIRM_READ:
	case U_CONFIRM_WRITE:
		if (manager(page) != u.self || !mp->busy)
			proto_error(m, "no transaction open on the page here");
		if (m->type == U_INV_ACK) {
			/* Only a node sent an INV may ack it, and only once. */
			if (mp->kind != U_RW || !mp->acks ||
			    !(mp->inv & 1u << (m->from - 1)))
				proto_error(m, "no invalidation pending to the node");
			mp->inv &= ~(1u << (m->from - 1));
			mp->copyset &= ~(1u << (m->from - 1));
			if (!--mp->acks)
				mgr_proceed_write(page);
			break;
		}
		if (m->from != mp->req || mp->acks ||
		    (m->type == U_CONFIRM_READ) != (mp->kind == U_READ))
			proto_error(m, "not the open transaction's requester or kind");
		if (mp->kind == U_READ) {
			if (mp->owner != m->from)
				mp->copyset |= 1u << (m->from - 1);
		} else {
			mp->owner = m->from;
			mp->copyset = 0;
		}
		mgr_done(page);
		break;
	case U_FWD_READ:
	case U_FWD_WRITE:
		if (m->from != manager(page) || !u.own[page] || !m->node ||
		    m->node > u.nodes || m->node == u.self)
			proto_error(m, "not from the manager, not ours, or a bad requester");
		if (m->type == U_FWD_READ) {
			set_prot(page, U_READ);
			send_msg(m->node, U_DATA_READ, page, 0, U_F_DATA);
		} else {
			set_prot(page, U_NONE);
			u.own[page] = 0;
			send_msg(m->node, U_DATA_WRITE, page, 0, m->flags & U_F_DATA);
		}
		break;
	case U_INV:
		if (m->from != manager(page) || u.own[page])
			proto_error(m, "not from the manager, or we own the page");
		set_prot(page, U_NONE);
		u.st.invalidations++;
		send_msg(m->from, U_INV_ACK, page, 0, 0);
		break;
	case U_DATA_READ:
	case U_DATA_WRITE:
		if (u.want[page] != (m->type == U_DATA_READ ? U_READ : U_RW))
			proto_error(m, "no such request of ours open");
		if (data)
			memcpy(u.svc + (size_t)page * U_PAGE, data, U_PAGE);
		else if (m->type == U_DATA_WRITE && !u.own[page] && u.prot[page] != U_READ)
			proto_error(m, "ownership without data, and we hold no copy");
		if (m->type == U_DATA_WRITE)
			u.own[page] = 1;
		set_prot(page, m->type == U_DATA_READ ? U_READ : U_RW);
		u.want[page] = 0;
		if (m->type == U_DATA_READ)
			u.st.read_fault_ns += now_ns() - u.req_ns[page];
		else
			u.st.write_fault_ns += now_ns() - u.req_ns[page];
		pthread_cond_broadcast(&u.cv);
		send_msg(manager(page), m->type == U_DATA_READ ? U_CONFIRM_READ :
			 U_CONFIRM_WRITE, page, 0, 0);
		break;
	case U_BAR_ENTER:
		if (u.self != 1 || m->arg != u.bar_released + 1 ||
		    u.bar_entered[m->from] == m->arg)
			proto_error(m, "not the barrier's next generation, or entered twice");
		u.bar_entered[m->from] = m->arg;
		if (++u.bar_count < u.nodes)
			break;
		u.bar_count = 0;
		u.bar_released = m->arg;
		for (n = 1; n <= u.nodes; n++)
			send_msg(n, U_BAR_GO, m->arg, 0, 0);
		break;
	case U_BAR_GO:
		if (m->from != 1 || m->arg != u.bar_done + 1 || m->arg > u.bar_gen)
			proto_error(m, "not the generation we wait for");
		u.bar_done = m->arg;
		u.st.barriers++;
		pthread_cond_broadcast(&u.cv);
		break;
	case U_LOCK_REQ:
	case U_UNLOCK: {
		struct u_lockmgr *l;

		if (m->arg >= DSM_LOCKS || m->arg % u.nodes + 1 != u.self)
			proto_error(m, "no such lock, or not its manager");
		l = &u.locks[m->arg];
		if (m->type == U_UNLOCK) {
			if (l->holder != m->from)
				proto_error(m, "the node does not hold the lock");
			l->holder = 0;
			if (l->qn) {
				l->holder = l->q[l->qh];
				l->qh = (l->qh + 1) % U_MAX_NODES;
				l->qn--;
				send_msg(l->holder, U_LOCK_GRANT, m->arg, 0, 0);
			}
			break;
		}
		if (l->holder == m->from)
			proto_error(m, "the node holds the lock already");
		for (n = 0; n < l->qn; n++)
			if (l->q[(l->qh + n) % U_MAX_NODES] == m->from)
				proto_error(m, "the node waits for the lock already");
		if (!l->holder) {
			l->holder = m->from;
			send_msg(m->from, U_LOCK_GRANT, m->arg, 0, 0);
		} else {
			l->q[(l->qh + l->qn++) % U_MAX_NODES] = m->from;
		}
		break;
	}
	case U_LOCK_GRANT:
		if (m->arg >= DSM_LOCKS || m->from != m->arg % u.nodes + 1 ||
		    !u.lock_wait[m->arg] || u.lock_granted[m->arg])
			proto_error(m, "no request of ours for the lock");
		u.lock_granted[m->arg] = 1;
		pthread_cond_broadcast(&u.cv);
		break;
	default:
		proto_error(m, "unknown type");
	}
}

/* A received message: from the node whose QP it came on, its length as it says. */
static void handle_recv(const struct ibv_wc *wc)
{
	unsigned peer = wc->wr_id >> 16 & 0xffff, slot = wc->wr_id & 0xffff;
	const uint8_t *buf = u.peer[peer].rbuf + slot * U_SLOT;
	struct u_msg m;

	if (wc->opcode != IBV_WC_RECV || wc->byte_len < sizeof(m))
		dsm_die("protocol error: a %u-byte message (opcode %u) from node %u",
			wc->byte_len, wc->opcode, peer);
	memcpy(&m, buf, sizeof(m));
	if (m.from != peer || m.len != wc->byte_len - sizeof(m) ||
	    (m.len && m.len != U_PAGE))
		proto_error(&m, "came from node %u with %u bytes", peer, wc->byte_len);
	u.st.msgs_received++;
	handle(&m, m.len ? buf + sizeof(m) : NULL);
	post_recv(peer, slot);
}

/* Handles everything there is; the number of messages and completions seen. */
static unsigned serve_all(void)
{
	unsigned n = 0;
	struct u_msg m;
	struct ibv_wc wc;

	for (;;) {
		if (u.sq_n) {
			m = u.selfq[u.sq_head];
			u.sq_head = (u.sq_head + 1) % U_SELFQ;
			u.sq_n--;
			handle(&m, NULL);
		} else if (u.bl_n) {
			wc = u.backlog[u.bl_head];
			u.bl_head = (u.bl_head + 1) % u.bl_max;
			u.bl_n--;
			handle_recv(&wc);
		} else if (!reap()) {
			return n;
		}
		n++;
	}
}

static void *service_main(void *unused)
{
	struct pollfd fds[2];
	struct ibv_cq *cq;
	uint64_t count;
	void *cq_ctx;
	unsigned n;

	in_service = 1;
	fds[0] = (struct pollfd){ .fd = u.poll ? -1 : u.ch->fd, .events = POLLIN };
	fds[1] = (struct pollfd){ .fd = u.poll ? -1 : u.kick, .events = POLLIN };
	for (;;) {
		pthread_mutex_lock(&u.lock);
		n = serve_all();
		pthread_mutex_unlock(&u.lock);
		if (u.poll) {
			/* Polling: nothing found, let an application thread have the CPU. */
			if (!n)
				sched_yield();
			continue;
		}
		if (n)
			continue;
		/* Arm the channel, then look again: a completion may have come before. */
		if (ibv_req_notify_cq(u.cq, 0))
			dsm_die("ibv_req_notify_cq failed");
		pthread_mutex_lock(&u.lock);
		n = serve_all();
		pthread_mutex_unlock(&u.lock);
		if (n)
			continue;
		if (poll(fds, 2, -1) < 0 && errno != EINTR)
			dsm_die("poll: %s", strerror(errno));
		if (fds[0].revents & POLLIN) {
			if (ibv_get_cq_event(u.ch, &cq, &cq_ctx))
				dsm_die("ibv_get_cq_event failed");
			ibv_ack_cq_events(cq, 1);
		}
		if (fds[1].revents & POLLIN &&
		    read(u.kick, &count, sizeof(count)) != sizeof(count) && errno != EAGAIN)
			dsm_die("eventfd read: %s", strerror(errno));
	}
	return NULL;
}

/* ---- the application's side ---- */

/* Waits until this node may access the page so; sends the request if no thread has. */
static void fault(uint32_t page, int write)
{
	struct timespec until = deadline();
	int need = write ? U_RW : U_READ;

	pthread_mutex_lock(&u.lock);
	while (u.prot[page] < need) {
		if (!u.want[page]) {
			u.want[page] = need;
			u.req_ns[page] = now_ns();
			if (write)
				u.st.write_faults++;
			else
				u.st.read_faults++;
			send_msg(manager(page), write ? U_REQ_WRITE : U_REQ_READ, page, 0, 0);
		}
		wait_cv(&until, write ? "write fault on page" : "read fault on page", page);
	}
	pthread_mutex_unlock(&u.lock);
}

/*
 * The access faulted on a page of ours: get it, then return to retry the
 * access. It is synchronous and comes from application code, which holds
 * none of our locks, so taking u.lock here is safe.
 */
static void segv(int sig, siginfo_t *si, void *ctx)
{
	uint8_t *a = si->si_addr;
	ucontext_t *uc = ctx;
	int saved = errno;

	/*
	 * Not ours, or an instruction fetch (error code bit 4: the shared
	 * space is never executable, so no protocol step would end it): the
	 * access faults again and kills.
	 */
	if (a < u.app || a >= u.app + u.size ||
	    (uc->uc_mcontext.gregs[REG_ERR] & 0x10)) {
		signal(SIGSEGV, SIG_DFL);
		return;
	}
	fault((a - u.app) / U_PAGE, !!(uc->uc_mcontext.gregs[REG_ERR] & 2));
	errno = saved;
}

void udsm_barrier(void)
{
	struct timespec until = deadline();
	uint32_t gen;

	pthread_mutex_lock(&u.lock);
	gen = ++u.bar_gen;
	send_msg(1, U_BAR_ENTER, gen, 0, 0);
	while (u.bar_done < gen)
		wait_cv(&until, "barrier generation", gen);
	pthread_mutex_unlock(&u.lock);
}

void udsm_lock(unsigned id)
{
	struct timespec until;

	if (id >= DSM_LOCKS)
		dsm_die("lock %u: want below %u", id, DSM_LOCKS);
	pthread_mutex_lock(&u.local[id]);
	until = deadline();
	pthread_mutex_lock(&u.lock);
	u.lock_wait[id] = 1;
	u.lock_granted[id] = 0;
	send_msg(id % u.nodes + 1, U_LOCK_REQ, id, 0, 0);
	while (!u.lock_granted[id])
		wait_cv(&until, "lock", id);
	u.lock_wait[id] = 0;
	u.lock_granted[id] = 0;
	u.st.lock_acquires++;
	pthread_mutex_unlock(&u.lock);
}

void udsm_unlock(unsigned id)
{
	if (id >= DSM_LOCKS)
		dsm_die("unlock %u: want below %u", id, DSM_LOCKS);
	pthread_mutex_lock(&u.lock);
	send_msg(id % u.nodes + 1, U_UNLOCK, id, 0, 0);
	pthread_mutex_unlock(&u.lock);
	pthread_mutex_unlock(&u.local[id]);
}

void udsm_stats(struct dsm_stats_user *st)
{
	pthread_mutex_lock(&u.lock);
	*st = u.st;
	pthread_mutex_unlock(&u.lock);
}

/* Until every message we sent has been acknowledged by its peer. */
static void wait_sends_done(void)
{
	struct timespec until = deadline();
	unsigned p;

	pthread_mutex_lock(&u.lock);
	for (p = 1; p <= u.nodes; p++) {
		u.send_waiters++;
		while (p != u.self && u.peer[p].nfree < U_SENDS)
			wait_cv(&until, "last sends' completion from node", p);
		u.send_waiters--;
	}
	pthread_mutex_unlock(&u.lock);
}

void udsm_exit(void)
{
	/*
	 * Before the exit barrier too: a last CONFIRM or INV_ACK travels on
	 * another QP than node 1's BAR_GO, and a peer that passed the barrier
	 * may be gone before it lands.
	 */
	wait_sends_done();
	udsm_barrier();
	/* Node 1's last BAR_GO must reach every peer before our QPs go with the process. */
	wait_sends_done();
}

/* ---- set-up ---- */

static void *zalloc(size_t n)
{
	void *p = calloc(1, n);

	if (!p)
		dsm_die("out of memory (%zu bytes)", n);
	return p;
}

static void open_device(void)
{
	const char *want = getenv("DSM_DEV");
	struct ibv_device **list;
	struct ibv_port_attr pa;
	int i, n;

	if (!want || !*want)
		want = "hcab0";
	list = ibv_get_device_list(&n);
	if (!list)
		dsm_die("ibv_get_device_list: %s", strerror(errno));
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), want))
			break;
	if (i == n)
		dsm_die("no RDMA device %s (DSM_DEV) among %d", want, n);
	u.ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!u.ctx)
		dsm_die("ibv_open_device %s: %s", want, strerror(errno));
	u.port = 1;
	if (ibv_query_port(u.ctx, u.port, &pa))
		dsm_die("ibv_query_port %s/1 failed", want);
	if (pa.state != IBV_PORT_ACTIVE)
		dsm_die("%s port 1 is not active (state %d)", want, pa.state);
	/* RoCE (rxe0) addresses by GID; InfiniBand by LID. */
	u.global = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	u.gid_index = env_uint("DSM_GID_INDEX", u.global ? 1 : 0, 0, 255);
	u.peer[u.self].lid = pa.lid;
	if (ibv_query_gid(u.ctx, u.port, u.gid_index, &u.peer[u.self].gid))
		dsm_die("ibv_query_gid %s/1 index %d failed", want, u.gid_index);
	u.pd = ibv_alloc_pd(u.ctx);
	if (!u.pd)
		dsm_die("ibv_alloc_pd failed");
	if (!u.poll) {
		u.ch = ibv_create_comp_channel(u.ctx);
		if (!u.ch)
			dsm_die("ibv_create_comp_channel failed");
		if (fcntl(u.ch->fd, F_SETFL, fcntl(u.ch->fd, F_GETFL) | O_NONBLOCK))
			dsm_die("O_NONBLOCK on the completion channel: %s", strerror(errno));
	}
	u.cq = ibv_create_cq(u.ctx, (u.nodes - 1) * (U_RECVS + U_SENDS), NULL, u.ch, 0);
	if (!u.cq)
		dsm_die("ibv_create_cq of %u entries failed", (u.nodes - 1) * (U_RECVS + U_SENDS));
}

static struct ibv_mr *reg(void *buf, size_t len, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(u.pd, buf, len, access);

	if (!mr)
		dsm_die("ibv_reg_mr of %zu bytes: %s", len, strerror(errno));
	return mr;
}

static void create_qps(void)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = u.cq, .recv_cq = u.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = U_SENDS, .max_recv_wr = U_RECVS,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = u.port,
		.qp_access_flags = 0,
	};
	unsigned n, s;
	struct u_peer *p;

	for (n = 1; n <= u.nodes; n++) {
		if (n == u.self)
			continue;
		p = &u.peer[n];
		p->qp = ibv_create_qp(u.pd, &ia);
		if (!p->qp)
			dsm_die("ibv_create_qp for node %u: %s", n, strerror(errno));
		if (ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
			dsm_die("QP for node %u to INIT failed", n);
		p->rbuf = zalloc((size_t)U_RECVS * U_SLOT);
		p->sbuf = zalloc((size_t)U_SENDS * U_SLOT);
		p->rmr = reg(p->rbuf, (size_t)U_RECVS * U_SLOT, IBV_ACCESS_LOCAL_WRITE);
		p->smr = reg(p->sbuf, (size_t)U_SENDS * U_SLOT, 0);
		for (s = 0; s < U_SENDS; s++)
			p->free[s] = s;
		p->nfree = U_SENDS;
		/* Every receive is posted before the peer can send (before RTR). */
		for (s = 0; s < U_RECVS; s++)
			post_recv(n, s);
	}
}

static void connect_qp(unsigned n)
{
	struct u_peer *p = &u.peer[n];
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = p->qpn,
		.rq_psn = p->psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .dlid = p->lid, .port_num = u.port },
	};

	if (u.global) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh = (struct ibv_global_route){ .dgid = p->gid, .hop_limit = 1,
							   .sgid_index = u.gid_index };
	}
	if (ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		dsm_die("QP for node %u to RTR failed (lid %u qpn %u)", n, p->lid, p->qpn);
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.sq_psn = u.psn, .max_rd_atomic = 1,
	};
	if (ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		dsm_die("QP for node %u to RTS failed", n);
}

static void write_file(const char *dir, const char *name, const char *text)
{
	char path[256], tmp[272];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) || rename(tmp, path))
		dsm_die("writing %s: %s", path, strerror(errno));
}

/* Waits for dir/name (the harness writes it whole, by rename); its contents. */
static char *wait_file(const char *dir, const char *name, const char *what)
{
	uint64_t end = now_ns() + u.timeout_s * 1000000000ULL;
	char path[256], *text;
	struct stat sb;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	while (!(f = fopen(path, "r"))) {
		if (errno != ENOENT)
			dsm_die("%s: %s", path, strerror(errno));
		if (now_ns() > end)
			dsm_die("no %s (%s) in %u s: the harness passes it (DSM_TIMEOUT)",
				what, path, u.timeout_s);
		usleep(10000);
	}
	if (fstat(fileno(f), &sb) || sb.st_size > 64 * 1024)
		dsm_die("%s: unreadable or too big", path);
	text = zalloc(sb.st_size + 1);
	n = fread(text, 1, sb.st_size, f);
	text[n] = 0;
	fclose(f);
	return text;
}

static int hex_gid(const char *s, union ibv_gid *gid)
{
	unsigned i, b;

	for (i = 0; i < 16; i++) {
		if (sscanf(s + 2 * i, "%2x", &b) != 1)
			return -1;
		gid->raw[i] = b;
	}
	return s[32] == 0 || s[32] == ' ' || s[32] == '\n' ? 0 : -1;
}

/* One peer's address line: node= lid= psn= gid= qpns=q1,...,qN (ours to it: entry self). */
static void parse_peer(const char *line)
{
	unsigned node, lid, psn, k;
	const char *g, *q;
	char *end;
	unsigned long qpn = 0;

	if (sscanf(line, "node=%u lid=%u psn=%u", &node, &lid, &psn) != 3 ||
	    !node || node > u.nodes || lid > 0xffff || psn > 0xffffff)
		dsm_die("bad peer address line: %.200s", line);
	if (node == u.self)
		return;
	g = strstr(line, " gid=");
	q = strstr(line, " qpns=");
	if (!g || !q || hex_gid(g + 5, &u.peer[node].gid))
		dsm_die("bad peer address line (gid, qpns): %.200s", line);
	q += 6;
	for (k = 1; k <= u.self; k++) {
		qpn = strtoul(q, &end, 10);
		if (end == q || (*end != ',' && k < u.nodes))
			dsm_die("bad qpns in peer address line: %.200s", line);
		q = end + 1;
	}
	if (!qpn || qpn > 0xffffff)
		dsm_die("node %u names no QP for us: %.200s", node, line);
	if (u.peer[node].qpn)
		dsm_die("two address lines for node %u", node);
	u.peer[node].lid = lid;
	u.peer[node].psn = psn;
	u.peer[node].qpn = qpn;
}

/*
 * The harness's rendezvous, in DSM_DIR: we write addr; it writes peers (every
 * node's addr line); we connect and write ready; it writes go once every
 * node is ready, so nothing is sent to a QP not yet able to receive.
 */
static void rendezvous(void)
{
	const char *dir = getenv("DSM_DIR");
	char line[512], *peers, *l, *save;
	unsigned n, len, found = 0;

	if (!dir || !*dir)
		dir = "/tmp/udsm";
	len = snprintf(line, sizeof(line), "node=%u lid=%u psn=%u gid=", u.self,
		       u.peer[u.self].lid, u.psn);
	for (n = 0; n < 16; n++)
		len += snprintf(line + len, sizeof(line) - len, "%02x",
				u.peer[u.self].gid.raw[n]);
	len += snprintf(line + len, sizeof(line) - len, " qpns=");
	for (n = 1; n <= u.nodes; n++)
		len += snprintf(line + len, sizeof(line) - len, "%s%u", n > 1 ? "," : "",
				n == u.self ? 0 : u.peer[n].qp->qp_num);
	snprintf(line + len, sizeof(line) - len, "\n");
	write_file(dir, "addr", line);
	peers = wait_file(dir, "peers", "peer addresses");
	for (l = strtok_r(peers, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		parse_peer(l);
		found++;
	}
	if (found != u.nodes)
		dsm_die("%s/peers has %u address lines, want %u", dir, found, u.nodes);
	free(peers);
	/* Two lines for ourselves would leave a peer with none. */
	for (n = 1; n <= u.nodes; n++)
		if (n != u.self && !u.peer[n].qpn)
			dsm_die("%s/peers has no address line for node %u", dir, n);
	for (n = 1; n <= u.nodes; n++)
		if (n != u.self)
			connect_qp(n);
	write_file(dir, "ready", "ready\n");
	free(wait_file(dir, "go", "go from the harness"));
}

void udsm_init(int mode, struct dsm_info *info, uint8_t **base, size_t *size)
{
	struct sigaction sa = { .sa_sigaction = segv, .sa_flags = SA_SIGINFO };
	pthread_condattr_t ca;
	unsigned p;
	int fd, err;

	u.poll = mode == 2;
	u.nodes = env_uint("DSM_NODES", 0, 2, U_MAX_NODES);
	u.self = env_uint("DSM_NODE", 0, 1, u.nodes);
	if (!u.nodes || !u.self)
		dsm_die("DSM_MODE=%s needs DSM_NODE and DSM_NODES", u.poll ? "user-poll" : "user");
	u.npages = env_uint("DSM_PAGES", U_PAGES, 1, 1 << 20);
	u.timeout_s = env_uint("DSM_TIMEOUT", 300, 1, 86400);
	trace = env_uint("DSM_TRACE", 0, 0, 1);
	u.size = (size_t)u.npages * U_PAGE;
	if (sysconf(_SC_PAGESIZE) != U_PAGE)
		dsm_die("the system's page is not %d bytes", U_PAGE);
	*info = (struct dsm_info){ .self = u.self, .nodes = u.nodes, .pages = u.npages,
				   .page_size = U_PAGE };

	fd = memfd_create("dsm", 0);
	if (fd < 0 || ftruncate(fd, u.size))
		dsm_die("memfd of %zu bytes: %s", u.size, strerror(errno));
	u.svc = mmap(NULL, u.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	u.app = mmap(NULL, u.size, PROT_NONE, MAP_SHARED, fd, 0);
	if (u.svc == MAP_FAILED || u.app == MAP_FAILED)
		dsm_die("mmap of %zu bytes: %s", u.size, strerror(errno));
	close(fd);
	u.prot = zalloc(u.npages);
	u.want = zalloc(u.npages);
	u.own = zalloc(u.npages);
	u.req_ns = zalloc(u.npages * sizeof(*u.req_ns));
	u.mgr = zalloc(u.npages * sizeof(*u.mgr));
	/* Every page starts at its manager, its owner, zero-filled. */
	for (p = 0; p < u.npages; p++) {
		u.mgr[p].owner = manager(p);
		if (manager(p) == u.self) {
			u.own[p] = 1;
			set_prot(p, U_RW);
		}
	}
	u.selfq = zalloc(U_SELFQ * sizeof(*u.selfq));
	u.bl_max = (u.nodes - 1) * U_RECVS;
	u.backlog = zalloc(u.bl_max * sizeof(*u.backlog));
	pthread_mutex_init(&u.lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&u.cv, &ca);
	for (p = 0; p < DSM_LOCKS; p++)
		pthread_mutex_init(&u.local[p], NULL);
	u.kick = eventfd(0, EFD_NONBLOCK);
	if (u.kick < 0)
		dsm_die("eventfd: %s", strerror(errno));
	u.psn = (getpid() * 2654435761u + u.self) & 0xffffff;

	open_device();
	create_qps();
	rendezvous();

	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL))
		dsm_die("sigaction: %s", strerror(errno));
	err = pthread_create(&u.service, NULL, service_main, NULL);
	if (err)
		dsm_die("pthread_create: %s", strerror(err));
	*base = u.app;
	*size = u.size;
}
