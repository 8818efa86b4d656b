// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * uverbs-hostile: what a hostile process can do to hcab through what
 * libhcab maps for it, and what the device must do about it.
 *
 * A process posts and polls without system calls: it writes WQEs into
 * rings it mapped, producer indices into its UAR page and a class into
 * BAR0's doorbell register. Whatever it writes there, the device may only
 * fail that process's own QPs (error completions, QP error state); it must
 * never reach memory outside what the process registered in the QP's PD
 * (a user PD: no HCA_LOCAL_DMA_LKEY, no physical or fast-reg MRs), and
 * never disturb another process's QPs.
 *
 * libibverbs sets everything up; the forging goes through the provider's
 * own objects (hcab.h): its rings, its doorbell records and its doorbell
 * register, as a process that ignores libhcab would write them. Runs on
 * hcab0 (HOSTILE_DEV overrides), RC QPs connected to each other through
 * port 1. Each check prints "PASS name (detail)" or "FAIL name: why"; the
 * exit status is nonzero if any failed.
 *
 *   1 reserved lkey: HCA_LOCAL_DMA_LKEY as lkey (send, write, read, recv)
 *     and as rkey
 *   2 forged keys: another PD's keys, random keys, wrong tags, ranges past
 *     an MR, missing access rights
 *   3 forged producer indices (SQ and RQ), with a bystander pair
 *   4 garbage WQEs: targeted (opcodes, num_sge 255, inline lengths,
 *     REG_MR, LOCAL_INV, SEND_INV, masked atomics) and random rings
 *   5 a destroyed QP's ring, mapped a second time, written and rung; and
 *     mmap of offsets that are not (or no longer) the process's
 *   6 another process: clean 4 KiB ping-pong while 3 and 4 run
 *   7 a process killed mid-traffic; a new context afterwards
 *   8 hoarding: CQs from two contexts stop at hca_ib's user share of the
 *     device, and meanwhile the kernel still makes its own (an IPoIB
 *     child interface of ib0)
 *
 * Environment: HOSTILE_DEV (device, default hcab0), HOSTILE_SEED (the
 * random seed; printed), HOSTILE_PINGPONG (check 6's minimum of round
 * trips, two SENDs each; default 500), HOSTILE_WATCHDOG (seconds before
 * the whole run gives up, 300).
 *
 * Built by guest-user/libhcab/build.sh against the provider's headers;
 * the provider objects it casts to must come from the same tree.
 */
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hcab.h"

#define DEV_DEFAULT		"hcab0"
#define PORT			1
#define BUF_LEN			4096
#define GUARD			64
#define GUARD_BYTE		0xa5
#define CQ_DEPTH		256
#define WQ_DEPTH		32
#define PSN_A			0x100
#define PSN_B			0x200
#define WHY_LEN			256

#define WAIT_MS			5000	/* a completion that must come */
#define SLOW_WAIT_MS		8000	/* one that may take transport retries */
#define QUIET_MS		100	/* how long "nothing happens" is watched */
#define STALE_QUIET_MS		500
#define EXTRA_MS		20	/* completions after the expected ones */
#define CHILD_WAIT_MS		10000
#define CHILD_START_MS		20000
#define CHILD_CAP_MS		60000
#define REAP_MS			20000

#define PP_ROUND_TRIPS		500	/* 1000 SENDs of 4 KiB, at least */
#define KILL_AFTER		200	/* completions before the child is "mid-traffic" */
#define RQ_SENDS		16

/* A guest-physical address a buggy device would read with lkey 1. */
#define PHYS_ADDR		0x100000ULL
/* An mmap page offset the kernel never hands out this early. */
#define BOGUS_PGOFF		0xdeadbULL

#define BIT(n)			(1u << (n))

/* ------------------------------------------------------------------ */
/* Reporting                                                           */

static unsigned int n_pass, n_fail;

static void result(const char *name, bool ok, const char *detail)
{
	if (ok) {
		n_pass++;
		if (detail && *detail)
			printf("PASS %s (%s)\n", name, detail);
		else
			printf("PASS %s\n", name);
	} else {
		n_fail++;
		printf("FAIL %s: %s\n", name, detail);
	}
	fflush(stdout);
}

static int __attribute__((format(printf, 2, 3)))
why_set(char *why, const char *fmt, ...)
{
	va_list ap;

	if (!why)
		return -1;
	va_start(ap, fmt);
	vsnprintf(why, WHY_LEN, fmt, ap);
	va_end(ap);
	return -1;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *state_str(int st)
{
	static const char *const names[] = {
		"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR",
	};

	if (st < 0)
		return "unknown (query failed)";
	return st < 7 ? names[st] : "out of range";
}

/* xorshift64*: reproducible from the printed seed. */
static uint64_t rng_state = 1;

static uint64_t rng_next(void)
{
	uint64_t x = rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545f4914f6cdd1dULL;
}

static void fill_random(void *p, size_t len)
{
	uint8_t *b = p;
	uint64_t x;
	size_t i;

	for (i = 0; i < len; i += 8) {
		x = rng_next();
		memcpy(b + i, &x, len - i < 8 ? len - i : 8);
	}
}

static void pattern_fill(uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 0x9e3779b9u;
	size_t i;

	for (i = 0; i < len; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = x >> 24;
	}
}

/* ------------------------------------------------------------------ */
/* Buffers with sentinel bytes on both sides                           */

/*
 * GUARD bytes of GUARD_BYTE, len bytes of data (filled with fill), GUARD
 * bytes of GUARD_BYTE. The MR covers the data only: the guards share its
 * pages, so a device that checks bounds by page and not by byte shows up.
 */
struct gbuf {
	const char *name;
	uint8_t *base;
	uint8_t *data;
	size_t len;
	uint8_t fill;
	struct ibv_mr *mr;
};

static void gbuf_reset(struct gbuf *b)
{
	memset(b->base, GUARD_BYTE, GUARD);
	memset(b->data, b->fill, b->len);
	memset(b->data + b->len, GUARD_BYTE, GUARD);
}

static int gbuf_init(struct gbuf *b, const char *name, struct ibv_pd *pd,
		     size_t len, int access, uint8_t fill, char *why)
{
	void *p;
	int err;

	memset(b, 0, sizeof(*b));
	b->name = name;
	err = posix_memalign(&p, 4096, len + 2 * GUARD);
	if (err)
		return why_set(why, "%s: posix_memalign: %s", name,
			       strerror(err));
	b->base = p;
	b->data = b->base + GUARD;
	b->len = len;
	b->fill = fill;
	gbuf_reset(b);
	if (!pd)
		return 0;
	b->mr = ibv_reg_mr(pd, b->data, len, access);
	if (!b->mr) {
		err = errno;
		free(b->base);
		b->base = NULL;
		return why_set(why, "%s: ibv_reg_mr: %s", name, strerror(err));
	}
	return 0;
}

static void gbuf_fini(struct gbuf *b)
{
	if (b->mr)
		ibv_dereg_mr(b->mr);
	free(b->base);
	memset(b, 0, sizeof(*b));
}

/* Guards intact, and the data too unless it may change. */
static int gbuf_check(const struct gbuf *b, bool data_may_change, char *why)
{
	size_t i;

	for (i = 0; i < GUARD; i++) {
		if (b->base[i] != GUARD_BYTE)
			return why_set(why,
				       "%s: sentinel byte %zu before the buffer changed (%#x)",
				       b->name, GUARD - i, b->base[i]);
		if (b->data[b->len + i] != GUARD_BYTE)
			return why_set(why,
				       "%s: sentinel byte %zu after the buffer changed (%#x)",
				       b->name, i, b->data[b->len + i]);
	}
	if (data_may_change)
		return 0;
	for (i = 0; i < b->len; i++)
		if (b->data[i] != b->fill)
			return why_set(why,
				       "%s: byte %zu changed (%#x, was %#x)",
				       b->name, i, b->data[i], b->fill);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Device, QP pairs, completions                                       */

struct dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint16_t lid;
	enum ibv_mtu mtu;
	uint8_t rd_atom;
};

static void dev_close(struct dev *d)
{
	if (d->pd)
		ibv_dealloc_pd(d->pd);
	if (d->ctx)
		ibv_close_device(d->ctx);
	memset(d, 0, sizeof(*d));
}

static int dev_open(struct dev *d, char *why)
{
	const char *want = getenv("HOSTILE_DEV");
	struct ibv_device **list, *found = NULL;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	int i, n, err;

	memset(d, 0, sizeof(*d));
	if (!want || !*want)
		want = DEV_DEFAULT;
	list = ibv_get_device_list(&n);
	if (!list)
		return why_set(why, "ibv_get_device_list: %s", strerror(errno));
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), want))
			found = list[i];
	if (!found) {
		ibv_free_device_list(list);
		return why_set(why, "no RDMA device %s (%d found)", want, n);
	}
	d->ctx = ibv_open_device(found);
	err = errno;
	ibv_free_device_list(list);
	if (!d->ctx)
		return why_set(why,
			       "ibv_open_device(%s): %s (libhcab installed?)",
			       want, strerror(err));
	err = ibv_query_port(d->ctx, PORT, &pa);
	if (err) {
		why_set(why, "ibv_query_port: %s", strerror(err));
		goto err;
	}
	if (pa.state != IBV_PORT_ACTIVE || !pa.lid) {
		why_set(why, "port %d is %s with LID %u: not usable", PORT,
			ibv_port_state_str(pa.state), pa.lid);
		goto err;
	}
	d->lid = pa.lid;
	d->mtu = pa.active_mtu;
	err = ibv_query_device(d->ctx, &da);
	if (err) {
		why_set(why, "ibv_query_device: %s", strerror(err));
		goto err;
	}
	d->rd_atom = 4;
	if (da.max_qp_rd_atom < d->rd_atom)
		d->rd_atom = da.max_qp_rd_atom;
	if (da.max_qp_init_rd_atom < d->rd_atom)
		d->rd_atom = da.max_qp_init_rd_atom;
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		why_set(why, "ibv_alloc_pd: %s", strerror(errno));
		goto err;
	}
	return 0;

err:
	dev_close(d);
	return -1;
}

/* Two RC QPs connected to each other, each with a CQ of its own. */
struct pair {
	struct ibv_cq *cq[2];
	struct ibv_qp *qp[2];
};

/* The provider's objects, as this program was compiled to see them. */
static int qp_sane(struct ibv_qp *qp, char *why)
{
	struct hcab_qp *q = to_hqp(qp);

	if (q->qpn != qp->qp_num || !q->db || !q->sq.ring || !q->rq.ring ||
	    q->sq.log_entries > HCA_MAX_QP_LOG_WR ||
	    q->rq.log_entries > HCA_MAX_QP_LOG_WR ||
	    q->sq.wqe_shift < HCA_MIN_SQ_WQE_SHIFT ||
	    q->sq.wqe_shift > HCA_MAX_SQ_WQE_SHIFT ||
	    q->rq.wqe_shift < HCA_MIN_RQ_WQE_SHIFT ||
	    q->rq.wqe_shift > HCA_MAX_RQ_WQE_SHIFT)
		return why_set(why,
			       "QP %#x: the provider's object does not look like hcab.h's struct hcab_qp (libhcab built from another tree?)",
			       qp->qp_num);
	return 0;
}

static int qp_to_rts(struct dev *d, struct ibv_qp *qp, uint32_t dqpn,
		     uint32_t sq_psn, uint32_t rq_psn, char *why)
{
	struct ibv_qp_attr a;
	int ret;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			    IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret)
		return why_set(why, "QP %#x to INIT: %s", qp->qp_num,
			       strerror(ret));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = d->mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = d->rd_atom;
	a.min_rnr_timer = 1;
	a.ah_attr.dlid = d->lid;
	a.ah_attr.port_num = PORT;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV |
			    IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			    IBV_QP_MIN_RNR_TIMER);
	if (ret)
		return why_set(why, "QP %#x to RTR: %s", qp->qp_num,
			       strerror(ret));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 3;
	a.rnr_retry = 3;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = d->rd_atom;
	ret = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret)
		return why_set(why, "QP %#x to RTS: %s", qp->qp_num,
			       strerror(ret));
	return 0;
}

/* why may be NULL: an earlier error is being reported. */
static int pair_destroy(struct pair *p, char *why)
{
	int i, ret, bad = 0;

	for (i = 0; i < 2; i++) {
		if (!p->qp[i])
			continue;
		ret = ibv_destroy_qp(p->qp[i]);
		if (ret && !bad)
			bad = why_set(why, "ibv_destroy_qp: %s", strerror(ret));
		p->qp[i] = NULL;
	}
	for (i = 0; i < 2; i++) {
		if (!p->cq[i])
			continue;
		ret = ibv_destroy_cq(p->cq[i]);
		if (ret && !bad)
			bad = why_set(why, "ibv_destroy_cq: %s", strerror(ret));
		p->cq[i] = NULL;
	}
	return bad;
}

static int pair_create(struct dev *d, struct ibv_pd *pd, struct pair *p,
		       char *why)
{
	struct ibv_qp_init_attr ia;
	int i;

	memset(p, 0, sizeof(*p));
	for (i = 0; i < 2; i++) {
		p->cq[i] = ibv_create_cq(d->ctx, CQ_DEPTH, NULL, NULL, 0);
		if (!p->cq[i]) {
			why_set(why, "ibv_create_cq: %s", strerror(errno));
			goto err;
		}
		memset(&ia, 0, sizeof(ia));
		ia.send_cq = p->cq[i];
		ia.recv_cq = p->cq[i];
		ia.qp_type = IBV_QPT_RC;
		ia.cap.max_send_wr = WQ_DEPTH;
		ia.cap.max_recv_wr = WQ_DEPTH;
		ia.cap.max_send_sge = 2;
		ia.cap.max_recv_sge = 2;
		p->qp[i] = ibv_create_qp(pd, &ia);
		if (!p->qp[i]) {
			why_set(why, "ibv_create_qp: %s", strerror(errno));
			goto err;
		}
		if (qp_sane(p->qp[i], why))
			goto err;
	}
	if (qp_to_rts(d, p->qp[0], p->qp[1]->qp_num, PSN_A, PSN_B, why) ||
	    qp_to_rts(d, p->qp[1], p->qp[0]->qp_num, PSN_B, PSN_A, why))
		goto err;
	return 0;

err:
	pair_destroy(p, NULL);
	return -1;
}

static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return -1;
	return a.qp_state;
}

/*
 * Up to n completions of cq into wc, for at most ms; how many came, or -1
 * if polling failed. Spins a little, then yields (the guest may have one
 * vCPU for this process and its children).
 */
static int cq_wait(struct ibv_cq *cq, struct ibv_wc *wc, int n,
		   unsigned int ms)
{
	uint64_t end = now_ms() + ms;
	unsigned int idle = 0;
	int got = 0, r;

	while (got < n) {
		r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return -1;
		if (r) {
			got += r;
			idle = 0;
			continue;
		}
		if (now_ms() >= end)
			break;
		if (++idle > 1000)
			usleep(100);
		else if (idle > 32)
			sched_yield();
	}
	return got;
}

struct tally {
	unsigned int n;
	unsigned int errs;
	unsigned int succ;
	enum ibv_wc_status first_err;
};

static int cq_drain(struct ibv_cq *cq, struct tally *t)
{
	struct ibv_wc wc[16];
	int n, i;

	while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
		for (i = 0; i < n; i++) {
			t->n++;
			if (wc[i].status == IBV_WC_SUCCESS) {
				t->succ++;
				continue;
			}
			if (!t->errs++)
				t->first_err = wc[i].status;
		}
	}
	return n;
}

/*
 * Waits up to ms for qp to be in ERR, draining cq meanwhile (and for a
 * while after, as flushes may trail); the ms it took, or -1.
 */
static long wait_qp_err(struct ibv_qp *qp, struct ibv_cq *cq,
			struct tally *t, unsigned int ms)
{
	uint64_t t0 = now_ms(), end = t0 + ms;
	long took;

	for (;;) {
		cq_drain(cq, t);
		if (qp_state(qp) == IBV_QPS_ERR)
			break;
		if (now_ms() >= end)
			return -1;
		usleep(5000);
	}
	took = now_ms() - t0;
	usleep(50000);
	cq_drain(cq, t);
	return took;
}

static int post_recv(struct ibv_qp *qp, uint64_t addr, uint32_t len,
		     uint32_t lkey, uint64_t wr_id, char *why)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = {}, *bad;
	int ret;

	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ret = ibv_post_recv(qp, &wr, &bad);
	if (ret)
		return why_set(why, "ibv_post_recv: %s", strerror(ret));
	return 0;
}

static int post_one(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t laddr,
		    uint32_t llen, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		    uint64_t wr_id, char *why)
{
	struct ibv_sge sge = { .addr = laddr, .length = llen, .lkey = lkey };
	struct ibv_send_wr wr = {}, *bad;
	int ret;

	wr.wr_id = wr_id;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	ret = ibv_post_send(qp, &wr, &bad);
	if (ret)
		return why_set(why, "ibv_post_send: %s", strerror(ret));
	return 0;
}

/* No completion on either CQ of p for ms. */
static int pair_quiet(struct pair *p, unsigned int ms, char *why)
{
	struct ibv_wc wc;
	int i, n;

	for (i = 0; i < 2; i++) {
		n = cq_wait(p->cq[i], &wc, 1, i ? EXTRA_MS : ms);
		if (n < 0)
			return why_set(why, "ibv_poll_cq failed");
		if (n)
			return why_set(why,
				       "unexpected completion on QP %#x: %s, wr_id %#" PRIx64 ", %u bytes",
				       wc.qp_num, ibv_wc_status_str(wc.status),
				       wc.wr_id, wc.byte_len);
	}
	return 0;
}

/* One completion on cq that must be a success of opcode op with wr_id. */
static int expect_ok(struct ibv_cq *cq, enum ibv_wc_opcode op, uint64_t wr_id,
		     uint32_t byte_len, unsigned int ms, const char *what,
		     char *why)
{
	struct ibv_wc wc;
	int n = cq_wait(cq, &wc, 1, ms);

	if (n < 0)
		return why_set(why, "%s: ibv_poll_cq failed", what);
	if (!n)
		return why_set(why, "%s: no completion in %u ms", what, ms);
	if (wc.status != IBV_WC_SUCCESS)
		return why_set(why, "%s: %s (vendor %#x)", what,
			       ibv_wc_status_str(wc.status), wc.vendor_err);
	if (wc.opcode != op || wc.wr_id != wr_id)
		return why_set(why,
			       "%s: opcode %d wr_id %#" PRIx64 ", expected opcode %d wr_id %#" PRIx64,
			       what, wc.opcode, wc.wr_id, op, wr_id);
	if (byte_len && wc.byte_len != byte_len)
		return why_set(why, "%s: %u bytes, expected %u", what,
			       wc.byte_len, byte_len);
	return 0;
}

static int compare(const uint8_t *got, const uint8_t *want, size_t len,
		   const char *what, char *why)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (got[i] != want[i])
			return why_set(why,
				       "%s: byte %zu is %#x, expected %#x",
				       what, i, got[i], want[i]);
	return 0;
}

/*
 * A clean SEND of len bytes from tx to rx over p: one successful
 * completion each side, the data in rx, rx's guards intact, nothing more.
 */
static int pair_send_check(struct pair *p, struct gbuf *tx, struct gbuf *rx,
			   size_t len, uint32_t seed, char *why)
{
	pattern_fill(tx->data, len, seed);
	memset(rx->data, rx->fill, rx->len);
	if (post_recv(p->qp[1], (uintptr_t)rx->data, rx->len, rx->mr->lkey,
		      0xb0b, why) ||
	    post_one(p->qp[0], IBV_WR_SEND, (uintptr_t)tx->data, len,
		     tx->mr->lkey, 0, 0, 0xa1ce, why))
		return -1;
	if (expect_ok(p->cq[0], IBV_WC_SEND, 0xa1ce, 0, WAIT_MS, "send", why) ||
	    expect_ok(p->cq[1], IBV_WC_RECV, 0xb0b, len, WAIT_MS, "receive",
		      why) ||
	    compare(rx->data, tx->data, len, "received data", why) ||
	    gbuf_check(rx, true, why) || pair_quiet(p, EXTRA_MS, why))
		return -1;
	return 0;
}

/* A clean RDMA WRITE (local -> remote) or READ (remote -> local). */
static int pair_rdma_check(struct pair *p, enum ibv_wr_opcode op,
			   struct gbuf *local, struct gbuf *remote,
			   uint32_t seed, char *why)
{
	bool write = op == IBV_WR_RDMA_WRITE;
	struct gbuf *from = write ? local : remote;
	struct gbuf *to = write ? remote : local;

	pattern_fill(from->data, from->len, seed);
	memset(to->data, to->fill, to->len);
	if (post_one(p->qp[0], op, (uintptr_t)local->data, local->len,
		     local->mr->lkey, (uintptr_t)remote->data,
		     remote->mr->rkey, 0xd0, why) ||
	    expect_ok(p->cq[0], write ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ,
		      0xd0, 0, WAIT_MS, write ? "RDMA WRITE" : "RDMA READ",
		      why) ||
	    compare(to->data, from->data, to->len, "transferred data", why) ||
	    gbuf_check(to, true, why) || gbuf_check(from, true, why) ||
	    pair_quiet(p, EXTRA_MS, why))
		return -1;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Forging what libhcab would write                                    */

/*
 * Names QPN qpn in the context's send-doorbell ring (HCA_CAP_SQ_RING), as
 * post_send does before ringing: the device runs a named QP only when the
 * ring names it. No lock: this process posts from one thread.
 */
static void forge_name_sq(struct hcab_context *ctx, uint32_t qpn)
{
	char *ring = (char *)ctx->uar + HCA_UAR_SQ_RING_OFFSET;

	if (!ctx->sq_ring)
		return;
	mmio_write32(ring + HCA_SQ_RING_QPN_OFFSET +
		     4 * (ctx->sq_ring_pi % HCA_SQ_RING_ENTRIES), qpn);
	udma_to_device_barrier();
	mmio_write32(ring + HCA_SQ_RING_PI, ++ctx->sq_ring_pi);
}

/* post_send's last steps, with an index of our choosing. */
static void forge_sq_pi(struct ibv_qp *qp, uint32_t pi)
{
	struct hcab_qp *q = to_hqp(qp);

	udma_to_device_barrier();
	mmio_write32((char *)q->db + offsetof(struct hca_qp_db, sq_pi), pi);
	forge_name_sq(to_hctx(qp->context), q->qpn);
	hcab_ring(to_hctx(qp->context), HCA_DB_SQ);
}

static void forge_rq_pi(struct ibv_qp *qp, uint32_t pi)
{
	struct hcab_qp *q = to_hqp(qp);

	udma_to_device_barrier();
	mmio_write32((char *)q->db + offsetof(struct hca_qp_db, rq_pi), pi);
	hcab_ring(to_hctx(qp->context), HCA_DB_RQ);
}

/* ------------------------------------------------------------------ */
/* The parent's environment                                            */

enum {
	B_SRC,		/* LOCAL_WRITE: what sends read */
	B_RECV,		/* LOCAL_WRITE: where receives land */
	B_DST,		/* LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ */
	B_RO,		/* REMOTE_READ alone: nothing may write it */
	B_WO,		/* LOCAL_WRITE | REMOTE_WRITE: no remote read */
	B_SINK,		/* LOCAL_WRITE: where reads land */
	B_PD2,		/* everything, but in the second PD */
	B_SECRET,	/* not registered at all: nothing may touch it */
	B_NUM
};

struct env {
	struct dev d;
	struct ibv_pd *pd2;
	struct gbuf b[B_NUM];
	uint32_t forged_key;	/* what check 4's REG_MR tried to make */
	uint32_t seed;		/* data patterns: a new one each transfer */
};

static void env_reset(struct env *e)
{
	int i;

	for (i = 0; i < B_NUM; i++)
		gbuf_reset(&e->b[i]);
}

/* Every guard intact; every buffer's data too, but those in may_change. */
static int env_check(struct env *e, unsigned int may_change, char *why)
{
	int i;

	for (i = 0; i < B_NUM; i++)
		if (gbuf_check(&e->b[i], may_change & BIT(i), why))
			return -1;
	return 0;
}

static void env_fini(struct env *e)
{
	int i;

	for (i = 0; i < B_NUM; i++)
		gbuf_fini(&e->b[i]);
	if (e->pd2)
		ibv_dealloc_pd(e->pd2);
	e->pd2 = NULL;
	dev_close(&e->d);
}

static int env_init(struct env *e, char *why)
{
	static const struct {
		const char *name;
		int access;
		uint8_t fill;
		bool pd2;
		bool unregistered;
	} spec[B_NUM] = {
		[B_SRC] = { "src", IBV_ACCESS_LOCAL_WRITE, 0x11 },
		[B_RECV] = { "recv", IBV_ACCESS_LOCAL_WRITE, 0x22 },
		[B_DST] = { "dst", IBV_ACCESS_LOCAL_WRITE |
			    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
			    0x33 },
		[B_RO] = { "read-only", IBV_ACCESS_REMOTE_READ, 0x44 },
		[B_WO] = { "write-only", IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE, 0x55 },
		[B_SINK] = { "sink", IBV_ACCESS_LOCAL_WRITE, 0x66 },
		[B_PD2] = { "pd2", IBV_ACCESS_LOCAL_WRITE |
			    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC, 0x77, true },
		[B_SECRET] = { "secret", 0, 0xe7, false, true },
	};
	struct ibv_pd *pd;
	int i;

	memset(e, 0, sizeof(*e));
	if (dev_open(&e->d, why))
		return -1;
	e->pd2 = ibv_alloc_pd(e->d.ctx);
	if (!e->pd2) {
		why_set(why, "second ibv_alloc_pd: %s", strerror(errno));
		goto err;
	}
	for (i = 0; i < B_NUM; i++) {
		pd = spec[i].unregistered ? NULL :
		     spec[i].pd2 ? e->pd2 : e->d.pd;
		if (gbuf_init(&e->b[i], spec[i].name, pd, BUF_LEN,
			      spec[i].access, spec[i].fill, why))
			goto err;
	}
	return 0;

err:
	env_fini(e);
	return -1;
}

static bool key_is_ours(struct env *e, uint32_t key)
{
	int i;

	for (i = 0; i < B_NUM; i++)
		if (e->b[i].mr && (e->b[i].mr->lkey == key ||
				   e->b[i].mr->rkey == key))
			return true;
	return key == HCA_LOCAL_DMA_LKEY || key == 0 || key == 0xffffffff;
}

static uint32_t random_key(struct env *e)
{
	uint32_t k;

	do
		k = (uint32_t)rng_next();
	while (key_is_ours(e, k));
	return k;
}

static uint64_t addr_of(struct env *e, int i)
{
	return (uintptr_t)e->b[i].data;
}

static uint32_t lkey_of(struct env *e, int i)
{
	return e->b[i].mr->lkey;
}

static uint32_t rkey_of(struct env *e, int i)
{
	return e->b[i].mr->rkey;
}

/* ------------------------------------------------------------------ */
/* Checks 1 and 2: work requests a well-behaved provider passes as they */
/* are (libhcab checks no key), that the device must refuse            */

struct bad_wr {
	char name[64];
	enum ibv_wr_opcode op;
	uint64_t laddr;
	uint32_t llen;
	uint32_t lkey;
	uint64_t raddr;
	uint32_t rkey;
	/* B's receive SGE instead of the recv buffer: B must fail too */
	bool recv_forged;
	uint64_t recv_addr;
	uint32_t recv_len;
	uint32_t recv_lkey;
	unsigned int may_change;	/* BIT(B_*) whose data may change */
};

static void run_bad_wr(struct env *e, const struct bad_wr *c)
{
	char why[WHY_LEN], detail[WHY_LEN];
	struct ibv_wc wc, bwc[8];
	struct pair p;
	bool ok = false;
	int n, i;

	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result(c->name, false, why);
		return;
	}
	if (c->recv_forged) {
		if (post_recv(p.qp[1], c->recv_addr, c->recv_len, c->recv_lkey,
			      0xb0b, why))
			goto out;
	} else if (post_recv(p.qp[1], addr_of(e, B_RECV), BUF_LEN,
			     lkey_of(e, B_RECV), 0xb0b, why)) {
		goto out;
	}
	if (post_one(p.qp[0], c->op, c->laddr, c->llen, c->lkey, c->raddr,
		     c->rkey, 0xbad, why))
		goto out;
	n = cq_wait(p.cq[0], &wc, 1, SLOW_WAIT_MS);
	if (n < 0) {
		why_set(why, "ibv_poll_cq failed");
		goto out;
	}
	if (!n) {
		why_set(why, "no completion in %d ms (QP %s): hung?",
			SLOW_WAIT_MS, state_str(qp_state(p.qp[0])));
		goto out;
	}
	if (wc.status == IBV_WC_SUCCESS) {
		why_set(why, "completed successfully");
		goto out;
	}
	snprintf(detail, sizeof(detail), "%s", ibv_wc_status_str(wc.status));
	if (c->recv_forged) {
		n = cq_wait(p.cq[1], bwc, 1, WAIT_MS);
		if (n != 1) {
			why_set(why, "receiver: no completion in %d ms (QP %s)",
				WAIT_MS, state_str(qp_state(p.qp[1])));
			goto out;
		}
		if (bwc[0].status == IBV_WC_SUCCESS) {
			why_set(why, "receiver completed successfully (%u bytes)",
				bwc[0].byte_len);
			goto out;
		}
		snprintf(detail, sizeof(detail), "%s; receiver: %s",
			 ibv_wc_status_str(wc.status),
			 ibv_wc_status_str(bwc[0].status));
	} else {
		n = cq_wait(p.cq[1], bwc, 8, QUIET_MS);
		for (i = 0; i < n; i++) {
			if (bwc[i].status == IBV_WC_SUCCESS) {
				why_set(why,
					"receiver completed a message (%u bytes)",
					bwc[i].byte_len);
				goto out;
			}
		}
	}
	if (env_check(e, c->may_change, why))
		goto out;
	ok = true;
out:
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	result(c->name, ok, ok ? detail : why);
}

static void bad_send(struct env *e, const char *name, uint64_t laddr,
		     uint32_t llen, uint32_t lkey)
{
	struct bad_wr c = {
		.op = IBV_WR_SEND, .laddr = laddr, .llen = llen, .lkey = lkey,
	};

	snprintf(c.name, sizeof(c.name), "%s", name);
	run_bad_wr(e, &c);
}

static void bad_rdma(struct env *e, const char *name, enum ibv_wr_opcode op,
		     uint64_t laddr, uint32_t llen, uint32_t lkey,
		     uint64_t raddr, uint32_t rkey)
{
	struct bad_wr c = {
		.op = op, .laddr = laddr, .llen = llen, .lkey = lkey,
		.raddr = raddr, .rkey = rkey,
	};

	snprintf(c.name, sizeof(c.name), "%s", name);
	run_bad_wr(e, &c);
}

/* A valid 64-byte SEND into a receive the device must refuse. */
static void bad_recv(struct env *e, const char *name, uint64_t raddr,
		     uint32_t rlen, uint32_t rlkey)
{
	struct bad_wr c = {
		.op = IBV_WR_SEND, .laddr = addr_of(e, B_SRC), .llen = 64,
		.lkey = lkey_of(e, B_SRC), .recv_forged = true,
		.recv_addr = raddr, .recv_len = rlen, .recv_lkey = rlkey,
	};

	snprintf(c.name, sizeof(c.name), "%s", name);
	run_bad_wr(e, &c);
}

static void check_reserved_lkey(struct env *e)
{
	const uint32_t k1 = HCA_LOCAL_DMA_LKEY;

	/* As a kernel PD's lkey, 0x100000 would be guest-physical memory. */
	bad_send(e, "1.reserved-lkey.send-phys", PHYS_ADDR, 64, k1);
	bad_send(e, "1.reserved-lkey.send-virt", addr_of(e, B_SECRET), 64, k1);
	bad_rdma(e, "1.reserved-lkey.write-phys", IBV_WR_RDMA_WRITE, PHYS_ADDR,
		 64, k1, addr_of(e, B_DST), rkey_of(e, B_DST));
	bad_rdma(e, "1.reserved-lkey.write-virt", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SECRET), 64, k1, addr_of(e, B_DST),
		 rkey_of(e, B_DST));
	/*
	 * The sink is the unregistered secret: taken as a physical address
	 * by a buggy device, a user address lies past guest RAM.
	 */
	bad_rdma(e, "1.reserved-lkey.read-virt", IBV_WR_RDMA_READ,
		 addr_of(e, B_SECRET), 64, k1, addr_of(e, B_DST),
		 rkey_of(e, B_DST));
	bad_recv(e, "1.reserved-lkey.recv-virt", addr_of(e, B_SECRET), 64, k1);
	bad_rdma(e, "1.reserved-rkey.write", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC),
		 addr_of(e, B_SECRET), k1);
	bad_rdma(e, "1.reserved-rkey.read", IBV_WR_RDMA_READ,
		 addr_of(e, B_SINK), 64, lkey_of(e, B_SINK),
		 addr_of(e, B_SECRET), k1);
}

static void check_forged_keys(struct env *e)
{
	char name[64];
	int i;

	bad_send(e, "2.lkey.other-pd", addr_of(e, B_PD2), 64,
		 lkey_of(e, B_PD2));
	bad_send(e, "2.lkey.wrong-tag", addr_of(e, B_SRC), 64,
		 lkey_of(e, B_SRC) ^ 1);
	bad_send(e, "2.lkey.zero", addr_of(e, B_SRC), 64, 0);
	bad_send(e, "2.lkey.all-ones", addr_of(e, B_SRC), 64, 0xffffffff);
	for (i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "2.lkey.random-%d", i);
		bad_send(e, name, addr_of(e, B_SRC), 64, random_key(e));
	}
	bad_send(e, "2.lkey.past-end", addr_of(e, B_SRC) + BUF_LEN - 32, 64,
		 lkey_of(e, B_SRC));
	bad_send(e, "2.lkey.before-start", addr_of(e, B_SRC) - 8, 64,
		 lkey_of(e, B_SRC));
	bad_send(e, "2.lkey.other-address", addr_of(e, B_SECRET), 64,
		 lkey_of(e, B_SRC));
	bad_recv(e, "2.lkey.recv-other-pd", addr_of(e, B_PD2), 64,
		 lkey_of(e, B_PD2));
	bad_recv(e, "2.lkey.recv-no-local-write", addr_of(e, B_RO), 64,
		 lkey_of(e, B_RO));
	bad_recv(e, "2.lkey.recv-past-end", addr_of(e, B_RECV) + BUF_LEN - 32,
		 64, lkey_of(e, B_RECV));

	bad_rdma(e, "2.rkey.wrong-tag", IBV_WR_RDMA_WRITE, addr_of(e, B_SRC),
		 64, lkey_of(e, B_SRC), addr_of(e, B_DST),
		 rkey_of(e, B_DST) ^ 1);
	bad_rdma(e, "2.rkey.other-pd-write", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC), addr_of(e, B_PD2),
		 rkey_of(e, B_PD2));
	bad_rdma(e, "2.rkey.other-pd-read", IBV_WR_RDMA_READ,
		 addr_of(e, B_SINK), 64, lkey_of(e, B_SINK),
		 addr_of(e, B_PD2), rkey_of(e, B_PD2));
	bad_rdma(e, "2.rkey.other-address", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC),
		 addr_of(e, B_SECRET), rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.random", IBV_WR_RDMA_WRITE, addr_of(e, B_SRC), 64,
		 lkey_of(e, B_SRC), addr_of(e, B_DST), random_key(e));
	bad_rdma(e, "2.rkey.no-remote-write", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC), addr_of(e, B_RO),
		 rkey_of(e, B_RO));
	bad_rdma(e, "2.rkey.no-remote-read", IBV_WR_RDMA_READ,
		 addr_of(e, B_SINK), 64, lkey_of(e, B_SINK), addr_of(e, B_WO),
		 rkey_of(e, B_WO));
	bad_rdma(e, "2.rkey.read-past-end", IBV_WR_RDMA_READ,
		 addr_of(e, B_SINK), 64, lkey_of(e, B_SINK),
		 addr_of(e, B_DST) + BUF_LEN - 32, rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.read-before-start", IBV_WR_RDMA_READ,
		 addr_of(e, B_SINK), 64, lkey_of(e, B_SINK),
		 addr_of(e, B_DST) - 16, rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.write-past-end", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC),
		 addr_of(e, B_DST) + BUF_LEN - 32, rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.write-before-start", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC),
		 addr_of(e, B_DST) - 16, rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.address-wraps", IBV_WR_RDMA_WRITE,
		 addr_of(e, B_SRC), 64, lkey_of(e, B_SRC),
		 0xfffffffffffffff0ULL, rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.read-into-read-only", IBV_WR_RDMA_READ,
		 addr_of(e, B_RO), 64, lkey_of(e, B_RO), addr_of(e, B_DST),
		 rkey_of(e, B_DST));
	bad_rdma(e, "2.rkey.no-remote-atomic", IBV_WR_ATOMIC_FETCH_AND_ADD,
		 addr_of(e, B_SINK), 8, lkey_of(e, B_SINK), addr_of(e, B_DST),
		 rkey_of(e, B_DST));
}

/* ------------------------------------------------------------------ */
/* Check 3: forged producer indices                                    */

enum forged_pi { PI_SQ_FAR, PI_SQ_BACK, PI_RQ_FAR };

static void run_forged_pi(struct env *e, const char *name, enum forged_pi kind)
{
	char why[WHY_LEN], detail[WHY_LEN];
	struct tally t = {}, tb = {};
	struct ibv_qp *victim;
	struct ibv_cq *vcq;
	struct ibv_wc wc;
	struct pair p;
	bool ok = false;
	uint32_t pi;
	long took;
	int n;

	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result(name, false, why);
		return;
	}
	/* Some traffic first: the indices are not where they started. */
	if (pair_send_check(&p, &e->b[B_SRC], &e->b[B_RECV], 64, ++e->seed,
			    why))
		goto out;
	env_reset(e);
	if (kind == PI_RQ_FAR) {
		victim = p.qp[1];
		vcq = p.cq[1];
		pi = atomic_load(&to_hqp(victim)->rq.ci);
		forge_rq_pi(victim, pi + 10000);
		/* A valid message that needs the forged queue. */
		if (post_one(p.qp[0], IBV_WR_SEND, addr_of(e, B_SRC), 64,
			     lkey_of(e, B_SRC), 0, 0, 0x5e, why))
			goto out;
		n = cq_wait(p.cq[0], &wc, 1, SLOW_WAIT_MS);
		if (n != 1) {
			why_set(why,
				"sender: no completion in %d ms (QP %s): hung?",
				SLOW_WAIT_MS, state_str(qp_state(p.qp[0])));
			goto out;
		}
		if (wc.status == IBV_WC_SUCCESS) {
			why_set(why,
				"sender completed successfully into a queue with a forged index");
			goto out;
		}
	} else {
		victim = p.qp[0];
		vcq = p.cq[0];
		/* Idle: ci == pi, all that was posted has completed. */
		pi = atomic_load(&to_hqp(victim)->sq.ci);
		forge_sq_pi(victim, kind == PI_SQ_FAR ? pi + 10000 : pi - 1);
	}
	took = wait_qp_err(victim, vcq, &t, WAIT_MS);
	if (took < 0) {
		why_set(why, "QP %#x still %s %d ms after the forged index",
			victim->qp_num, state_str(qp_state(victim)), WAIT_MS);
		goto out;
	}
	if (t.succ) {
		why_set(why, "%u successful completions after the forged index",
			t.succ);
		goto out;
	}
	/* The peer may fail (retries, flushes) but receives nothing. */
	cq_drain(victim == p.qp[0] ? p.cq[1] : p.cq[0], &tb);
	if (kind != PI_RQ_FAR && tb.succ) {
		why_set(why, "the peer completed %u WRs", tb.succ);
		goto out;
	}
	if (env_check(e, 0, why))
		goto out;
	snprintf(detail, sizeof(detail),
		 "QP %#x in ERR after %ld ms, %u completions", victim->qp_num,
		 took, t.n);
	ok = true;
out:
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	result(name, ok, ok ? detail : why);
}

/* A QP pair that does nothing while others misbehave, then must work. */
static void bystander_check(struct env *e, struct pair *by, bool made,
			    const char *name)
{
	char why[WHY_LEN];
	bool ok;

	if (!made) {
		result(name, false, "no bystander pair");
		return;
	}
	env_reset(e);
	ok = !pair_quiet(by, 0, why) &&
	     !pair_send_check(by, &e->b[B_SRC], &e->b[B_RECV], BUF_LEN,
			      ++e->seed, why);
	result(name, ok, ok ? "4 KiB SEND, data checked" : why);
}

static void fresh_pair_check(struct env *e, const char *name)
{
	char why[WHY_LEN];
	struct pair p;
	bool ok;

	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result(name, false, why);
		return;
	}
	ok = !pair_quiet(&p, QUIET_MS, why) &&
	     !pair_send_check(&p, &e->b[B_SRC], &e->b[B_RECV], BUF_LEN,
			      ++e->seed, why);
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	result(name, ok, ok ? "4 KiB SEND, data checked" : why);
}

static void check_forged_pi(struct env *e)
{
	char why[WHY_LEN];
	struct pair by;
	bool made;

	made = !pair_create(&e->d, e->d.pd, &by, why);
	if (!made)
		result("3.forged-pi.setup", false, why);
	run_forged_pi(e, "3.forged-pi.sq-far-ahead", PI_SQ_FAR);
	run_forged_pi(e, "3.forged-pi.sq-backwards", PI_SQ_BACK);
	run_forged_pi(e, "3.forged-pi.rq-far-ahead", PI_RQ_FAR);
	bystander_check(e, &by, made, "3.forged-pi.bystander");
	fresh_pair_check(e, "3.forged-pi.fresh-pair");
	if (made && pair_destroy(&by, why))
		result("3.forged-pi.teardown", false, why);
}

/* ------------------------------------------------------------------ */
/* Check 4: garbage WQEs                                               */

enum garbage {
	G_OPCODE_UNKNOWN,
	G_OPCODE_PAST_LAST,
	G_NUM_SGE_255,
	G_INLINE_HUGE,
	G_INLINE_PAST_SLOT,
	G_INLINE_READ,
	G_REG_MR_OWN,
	G_REG_MR_OTHER,
	G_LOCAL_INV,
	G_SEND_INV,
	G_MASKED_CSWAP,
	G_NUM
};

static const char *const garbage_name[G_NUM] = {
	[G_OPCODE_UNKNOWN] = "4.garbage.opcode-0xee",
	[G_OPCODE_PAST_LAST] = "4.garbage.opcode-past-last",
	[G_NUM_SGE_255] = "4.garbage.num-sge-255",
	[G_INLINE_HUGE] = "4.garbage.inline-len-huge",
	[G_INLINE_PAST_SLOT] = "4.garbage.inline-past-slot",
	[G_INLINE_READ] = "4.garbage.inline-read",
	[G_REG_MR_OWN] = "4.garbage.reg-mr-own-mr",
	[G_REG_MR_OTHER] = "4.garbage.reg-mr-index-1",
	[G_LOCAL_INV] = "4.garbage.local-inv-own-mr",
	[G_SEND_INV] = "4.garbage.send-inv-peer-mr",
	[G_MASKED_CSWAP] = "4.garbage.masked-cswap-no-atomic",
};

static uint32_t next_tag_key(uint32_t key)
{
	uint32_t tag = key & 0xff;

	tag = tag >= 255 || tag < 2 ? 2 : tag + 1;
	return (key & ~0xffu) | tag;
}

/* One WQE of kind g in qp's next SQ slot, published and rung. */
static void forge_wqe(struct env *e, struct ibv_qp *qp, enum garbage g)
{
	struct hcab_qp *q = to_hqp(qp);
	uint32_t pi = q->sq.pi, stride = 1u << q->sq.wqe_shift;
	uint8_t *slot = hcab_wqe(&q->sq, pi);
	struct hca_send_wqe *w = (struct hca_send_wqe *)slot;
	struct hca_sge *sge = (struct hca_sge *)(w + 1);
	struct hca_reg_mr_wqe *r = (struct hca_reg_mr_wqe *)slot;
	struct hca_masked_atomic_wqe *m = (struct hca_masked_atomic_wqe *)slot;

	memset(slot, 0, stride);
	w->wr_id = pi;
	w->opcode = HCA_WR_SEND;
	w->flags = HCA_WQE_SIGNALED;
	w->num_sge = 1;
	sge->addr = addr_of(e, B_SRC);
	sge->length = 64;
	sge->lkey = lkey_of(e, B_SRC);
	switch (g) {
	case G_OPCODE_UNKNOWN:
		w->opcode = 0xee;
		break;
	case G_OPCODE_PAST_LAST:
		w->opcode = HCA_WR_MASKED_FETCH_ADD + 1;
		break;
	case G_NUM_SGE_255:
		w->num_sge = 255;
		break;
	case G_INLINE_HUGE:
		w->flags |= HCA_WQE_INLINE;
		w->num_sge = 0;
		w->inline_len = 0xffffffff;
		break;
	case G_INLINE_PAST_SLOT:
		/* One byte more than the slot holds (or than any slot may). */
		w->flags |= HCA_WQE_INLINE;
		w->num_sge = 0;
		w->inline_len = stride - sizeof(*w) + 1;
		memset(slot + sizeof(*w), 0x5a, stride - sizeof(*w));
		break;
	case G_INLINE_READ:
		w->opcode = HCA_WR_RDMA_READ;
		w->flags |= HCA_WQE_INLINE;
		w->num_sge = 0;
		w->inline_len = 8;
		w->remote_addr = addr_of(e, B_DST);
		w->rkey = rkey_of(e, B_DST);
		break;
	case G_REG_MR_OWN:
	case G_REG_MR_OTHER:
		/*
		 * Remap an MR onto guest-physical page 0 (page_list at
		 * guest-physical 0), all access: a user PD holds no
		 * fast-registration MR, so no key may work.
		 */
		memset(slot, 0, stride);
		r->wr_id = pi;
		r->opcode = HCA_WR_REG_MR;
		r->flags = HCA_WQE_SIGNALED;
		r->access = HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE |
			    HCA_ACCESS_REMOTE_READ | HCA_ACCESS_REMOTE_ATOMIC;
		r->iova = 0;
		r->length = 4096;
		r->page_list = 0;
		r->npages = 1;
		r->page_shift = 12;
		if (g == G_REG_MR_OWN) {
			e->forged_key = next_tag_key(lkey_of(e, B_SRC));
			r->key = e->forged_key;
		} else {
			r->key = 1 << 8 | 2;
		}
		break;
	case G_LOCAL_INV:
		w->opcode = HCA_WR_LOCAL_INV;
		w->num_sge = 0;
		w->imm = rkey_of(e, B_DST);
		break;
	case G_SEND_INV:
		w->opcode = HCA_WR_SEND_INV;
		w->imm = rkey_of(e, B_DST);
		break;
	case G_MASKED_CSWAP:
		memset(slot, 0, stride);
		m->wr_id = pi;
		m->opcode = HCA_WR_MASKED_CMP_SWP;
		m->flags = HCA_WQE_SIGNALED;
		m->num_sge = 1;
		m->remote_addr = addr_of(e, B_DST);
		m->rkey = rkey_of(e, B_DST);
		m->compare_add_mask = ~0ULL;
		m->swap_mask = ~0ULL;
		m->compare_add = 0x3333333333333333ULL;
		m->swap = 0xdeadbeefdeadbeefULL;
		sge = (struct hca_sge *)(m + 1);
		sge->addr = addr_of(e, B_SINK);
		sge->length = 8;
		sge->lkey = lkey_of(e, B_SINK);
		break;
	case G_NUM:
		break;
	}
	q->sq.pi = pi + 1;
	forge_sq_pi(qp, pi + 1);
}

static void run_garbage(struct env *e, enum garbage g)
{
	const char *name = garbage_name[g];
	char why[WHY_LEN], detail[WHY_LEN];
	struct tally tb = {};
	struct ibv_wc wc;
	struct pair p;
	bool ok = false;
	int n, st;

	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result(name, false, why);
		return;
	}
	if (post_recv(p.qp[1], addr_of(e, B_RECV), BUF_LEN,
		      lkey_of(e, B_RECV), 0xb0b, why))
		goto out;
	forge_wqe(e, p.qp[0], g);
	n = cq_wait(p.cq[0], &wc, 1, SLOW_WAIT_MS);
	if (n < 0) {
		why_set(why, "ibv_poll_cq failed");
		goto out;
	}
	if (n && wc.status == IBV_WC_SUCCESS) {
		why_set(why, "completed successfully (opcode %d)", wc.opcode);
		goto out;
	}
	st = qp_state(p.qp[0]);
	if (!n && st != IBV_QPS_ERR) {
		why_set(why, "no completion in %d ms and the QP is %s: hung?",
			SLOW_WAIT_MS, state_str(st));
		goto out;
	}
	if (n)
		snprintf(detail, sizeof(detail), "%s; QP %s",
			 ibv_wc_status_str(wc.status), state_str(st));
	else
		snprintf(detail, sizeof(detail), "no completion; QP ERR");
	usleep(QUIET_MS * 1000);
	cq_drain(p.cq[1], &tb);
	if (tb.succ) {
		why_set(why, "the peer completed %u WRs successfully", tb.succ);
		goto out;
	}
	/* A SEND with Invalidate may land its payload before it fails. */
	if (env_check(e, g == G_SEND_INV ? BIT(B_RECV) : 0, why))
		goto out;
	ok = true;
out:
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	result(name, ok, ok ? detail : why);
}

/* A key of one of ours, slightly off, reserved or random. */
static uint32_t pick_key(struct env *e)
{
	uint64_t r = rng_next();
	struct ibv_mr *mr = e->b[r % B_SECRET].mr;

	switch ((r >> 8) % 6) {
	case 0:
	case 1:
		return mr->lkey;
	case 2:
		return mr->rkey;
	case 3:
		return mr->lkey ^ 1;
	case 4:
		return HCA_LOCAL_DMA_LKEY;
	default:
		return (uint32_t)(r >> 32);
	}
}

/* An address in or near one of our buffers, physical-looking, or random. */
static uint64_t pick_addr(struct env *e)
{
	uint64_t r = rng_next();
	struct gbuf *b = &e->b[r % B_NUM];

	switch ((r >> 8) % 5) {
	case 0:
		return PHYS_ADDR;
	case 1:
		return r >> 16;
	default:
		return (uintptr_t)b->base + (r >> 16) % (b->len + 2 * GUARD);
	}
}

/*
 * Random bytes, then (plausible) fields that get past the first checks:
 * opcodes 0..12, few SGEs with keys and addresses near ours.
 */
static void garbage_slot(struct env *e, uint8_t *slot, uint32_t stride,
			 uint32_t hdr, bool plausible, bool send)
{
	struct hca_sge *sge = (struct hca_sge *)(slot + hdr);
	uint32_t room = (stride - hdr) / sizeof(*sge), i;
	uint64_t r = rng_next();

	fill_random(slot, stride);
	if (!plausible)
		return;
	if (send) {
		struct hca_send_wqe *w = (struct hca_send_wqe *)slot;

		w->opcode = r % 13;
		w->flags = (r >> 4) & 0xf;
		w->num_sge = ((r >> 8) & 7) == 0 ? 255 : (r >> 11) % 4;
		w->inline_len = ((r >> 13) & 3) == 0 ? (uint32_t)rng_next() :
			       (r >> 15) % 600;
		w->remote_addr = pick_addr(e);
		w->rkey = pick_key(e);
		w->imm = pick_key(e);
	} else {
		struct hca_recv_wqe *w = (struct hca_recv_wqe *)slot;

		w->num_sge = ((r >> 8) & 7) == 0 ? 255 : (r >> 11) % 4;
	}
	for (i = 0; i < room && i < 4; i++) {
		sge[i].addr = pick_addr(e);
		sge[i].length = rng_next() % (BUF_LEN + 2 * GUARD);
		sge[i].lkey = pick_key(e);
	}
}

/* What plausible garbage may legitimately write: our PD's LOCAL_WRITE MRs. */
#define PLAUSIBLE_MAY_CHANGE \
	(BIT(B_SRC) | BIT(B_RECV) | BIT(B_DST) | BIT(B_WO) | BIT(B_SINK))

/* The whole SQ ring of garbage, every slot posted. */
static void run_random_sq(struct env *e, int round, bool plausible)
{
	char name[64], why[WHY_LEN], detail[WHY_LEN];
	struct tally ta = {}, tb = {};
	struct hcab_qp *q;
	struct pair p;
	uint32_t nslots, stride, i;
	bool ok = false;
	long took;

	snprintf(name, sizeof(name), "4.garbage.random-sq-%d%s", round,
		 plausible ? "-plausible" : "");
	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result(name, false, why);
		return;
	}
	/* Receives for whatever random SEND gets through. */
	for (i = 0; i < WQ_DEPTH / 2; i++)
		if (post_recv(p.qp[1], addr_of(e, B_RECV), BUF_LEN,
			      lkey_of(e, B_RECV), i, why))
			goto out;
	q = to_hqp(p.qp[0]);
	nslots = 1u << q->sq.log_entries;
	stride = 1u << q->sq.wqe_shift;
	for (i = 0; i < nslots; i++)
		garbage_slot(e, hcab_wqe(&q->sq, q->sq.pi + i), stride,
			     sizeof(struct hca_send_wqe), plausible, true);
	q->sq.pi += nslots;
	forge_sq_pi(p.qp[0], q->sq.pi);
	took = wait_qp_err(p.qp[0], p.cq[0], &ta, SLOW_WAIT_MS);
	if (took < 0) {
		why_set(why,
			"QP still %s %d ms after %u garbage WQEs (%u completions, %u errors): hung?",
			state_str(qp_state(p.qp[0])), SLOW_WAIT_MS, nslots,
			ta.n, ta.errs);
		goto out;
	}
	usleep(QUIET_MS * 1000);
	cq_drain(p.cq[0], &ta);
	cq_drain(p.cq[1], &tb);
	if (env_check(e, plausible ? PLAUSIBLE_MAY_CHANGE : BIT(B_RECV), why))
		goto out;
	snprintf(detail, sizeof(detail),
		 "%u WQEs; ERR after %ld ms; %u completions (%u errors), peer %u",
		 nslots, took, ta.n, ta.errs, tb.n);
	ok = true;
out:
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	result(name, ok, ok ? detail : why);
}

/* The whole RQ ring of garbage, then valid SENDs into it. */
static void run_random_rq(struct env *e, int round, bool plausible)
{
	char name[64], why[WHY_LEN], detail[WHY_LEN];
	struct ibv_wc wc[RQ_SENDS];
	struct tally tb = {};
	struct hcab_qp *q;
	struct pair p;
	uint32_t nslots, stride, i;
	unsigned int errs = 0;
	bool ok = false;
	int n;

	snprintf(name, sizeof(name), "4.garbage.random-rq-%d%s", round,
		 plausible ? "-plausible" : "");
	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result(name, false, why);
		return;
	}
	q = to_hqp(p.qp[1]);
	nslots = 1u << q->rq.log_entries;
	stride = 1u << q->rq.wqe_shift;
	for (i = 0; i < nslots; i++)
		garbage_slot(e, hcab_wqe(&q->rq, q->rq.pi + i), stride,
			     sizeof(struct hca_recv_wqe), plausible, false);
	q->rq.pi += nslots;
	forge_rq_pi(p.qp[1], q->rq.pi);
	for (i = 0; i < RQ_SENDS; i++)
		if (post_one(p.qp[0], IBV_WR_SEND, addr_of(e, B_SRC), BUF_LEN,
			     lkey_of(e, B_SRC), 0, 0, i, why))
			goto out;
	/* Every SEND completes, one way or another (flushes included). */
	n = cq_wait(p.cq[0], wc, RQ_SENDS, 2 * SLOW_WAIT_MS);
	if (n < 0) {
		why_set(why, "ibv_poll_cq failed");
		goto out;
	}
	for (i = 0; i < (uint32_t)n; i++)
		if (wc[i].status != IBV_WC_SUCCESS)
			errs++;
	if (n < RQ_SENDS) {
		why_set(why,
			"%d of %d SENDs completed in %d ms (sender %s, receiver %s): hung?",
			n, RQ_SENDS, 2 * SLOW_WAIT_MS,
			state_str(qp_state(p.qp[0])),
			state_str(qp_state(p.qp[1])));
		goto out;
	}
	if (!plausible && !errs) {
		why_set(why, "%d SENDs into random receive WQEs all succeeded",
			RQ_SENDS);
		goto out;
	}
	usleep(QUIET_MS * 1000);
	cq_drain(p.cq[1], &tb);
	if (env_check(e, plausible ? PLAUSIBLE_MAY_CHANGE : 0, why))
		goto out;
	snprintf(detail, sizeof(detail),
		 "%u WQEs; %d SENDs, %u failed; receiver %s, %u completions (%u errors)",
		 nslots, RQ_SENDS, errs, state_str(qp_state(p.qp[1])), tb.n,
		 tb.errs);
	ok = true;
out:
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	result(name, ok, ok ? detail : why);
}

/*
 * After the forged REG_MR, LOCAL_INV and SEND_INV: src and dst still work
 * with their own keys, and the key REG_MR tried to make works nowhere.
 */
static void check_after_garbage(struct env *e)
{
	char why[WHY_LEN];
	struct pair p;
	struct ibv_wc wc = {};
	bool ok;
	int n;

	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result("4.after.fresh-pair", false, why);
		return;
	}
	ok = !pair_quiet(&p, QUIET_MS, why) &&
	     !pair_send_check(&p, &e->b[B_SRC], &e->b[B_RECV], BUF_LEN,
			      ++e->seed, why) &&
	     !pair_rdma_check(&p, IBV_WR_RDMA_WRITE, &e->b[B_SRC],
			      &e->b[B_DST], ++e->seed, why) &&
	     !pair_rdma_check(&p, IBV_WR_RDMA_READ, &e->b[B_SINK],
			      &e->b[B_DST], ++e->seed, why);
	result("4.after.fresh-pair", ok,
	       ok ? "4 KiB SEND, WRITE and READ with the MRs' own keys" : why);
	if (!ok || !e->forged_key)
		goto out;
	/* Last on this pair: it fails (and errs) the QP. */
	env_reset(e);
	ok = false;
	if (post_recv(p.qp[1], addr_of(e, B_RECV), BUF_LEN,
		      lkey_of(e, B_RECV), 0xb0b, why) ||
	    post_one(p.qp[0], IBV_WR_SEND, 0, 64, e->forged_key, 0, 0, 0xf0,
		     why))
		goto report;
	n = cq_wait(p.cq[0], &wc, 1, SLOW_WAIT_MS);
	if (n != 1)
		why_set(why, "no completion in %d ms", SLOW_WAIT_MS);
	else if (wc.status == IBV_WC_SUCCESS)
		why_set(why,
			"a SEND with the key the forged REG_MR asked for (%#x) succeeded",
			e->forged_key);
	else if (!env_check(e, 0, why))
		ok = true;
report:
	result("4.after.forged-key-dead", ok,
	       ok ? ibv_wc_status_str(wc.status) : why);
out:
	if (pair_destroy(&p, why))
		result("4.after.teardown", false, why);
}

static void check_garbage(struct env *e)
{
	char why[WHY_LEN];
	struct pair by;
	bool made;
	int g;

	made = !pair_create(&e->d, e->d.pd, &by, why);
	if (!made)
		result("4.garbage.setup", false, why);
	for (g = 0; g < G_NUM; g++)
		run_garbage(e, g);
	run_random_sq(e, 0, false);
	run_random_sq(e, 1, false);
	run_random_sq(e, 2, true);
	run_random_sq(e, 3, true);
	run_random_rq(e, 0, false);
	run_random_rq(e, 1, true);
	check_after_garbage(e);
	bystander_check(e, &by, made, "4.after.bystander");
	if (made && pair_destroy(&by, why))
		result("4.garbage.teardown", false, why);
}

/* ------------------------------------------------------------------ */
/* Check 5: a destroyed QP's ring, and mmap offsets                    */

/* The mapping that starts at addr, from /proc/self/maps. */
static int find_mapping(void *addr, size_t *len, unsigned long long *off,
			char *why)
{
	unsigned long start, end;
	unsigned long long o;
	char line[512], perms[8], path[256];
	FILE *f = fopen("/proc/self/maps", "r");
	int found = 0;

	if (!f)
		return why_set(why, "/proc/self/maps: %s", strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		path[0] = 0;
		if (sscanf(line, "%lx-%lx %7s %llx %*s %*s %255s", &start, &end,
			   perms, &o, path) < 4)
			continue;
		if (start != (uintptr_t)addr)
			continue;
		*len = end - start;
		*off = o;
		found = 1;
		break;
	}
	fclose(f);
	if (!found)
		return why_set(why, "no mapping at %p in /proc/self/maps", addr);
	if (!strstr(path, "uverbs"))
		return why_set(why, "the mapping at %p is of %s, not uverbs",
			       addr, path[0] ? path : "nothing");
	return 0;
}

/* mmap on the context's fd that must fail (with want, if nonzero). */
static void mmap_must_fail(struct env *e, const char *name, size_t len,
			   int flags, unsigned long long off, int want)
{
	char why[WHY_LEN];
	void *m;
	int err;

	m = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, e->d.ctx->cmd_fd,
		 (off_t)off);
	err = errno;
	if (m != MAP_FAILED) {
		munmap(m, len);
		why_set(why, "mmap(%zu bytes at offset %#llx) succeeded", len,
			off);
		result(name, false, why);
		return;
	}
	if (want && err != want) {
		why_set(why, "mmap failed with %s, expected %s", strerror(err),
			strerror(want));
		result(name, false, why);
		return;
	}
	result(name, true, strerror(err));
}

/*
 * Whether the device wrote a CQE at cq's consumer index. poll_cq would
 * drop one of a destroyed QP without a word, so this reads the ring.
 */
static bool cq_raw_pending(struct ibv_cq *cq)
{
	struct hcab_cq *c = to_hcq(cq);
	struct hca_cqe *cqe = &c->ring[c->ci & ((1u << c->log_entries) - 1)];
	uint8_t owner = atomic_load_explicit((_Atomic uint8_t *)&cqe->owner,
					     memory_order_relaxed);

	return owner == hca_owner_bit(c->ci, c->log_entries);
}

static sigjmp_buf fault_jmp;

static void fault_handler(int sig)
{
	siglongjmp(fault_jmp, sig);
}

/*
 * A valid SEND of src's first 64 bytes in slot w, written through a
 * mapping the kernel may have revoked: the signal that stopped it, or 0.
 */
static int write_stale_wqe(struct env *e, struct hca_send_wqe *w,
			   uint32_t stride, uint32_t wr_id)
{
	struct sigaction sa = { .sa_handler = fault_handler };
	struct sigaction old_bus, old_segv;
	struct hca_sge *sge = (struct hca_sge *)(w + 1);
	int sig;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old_bus);
	sigaction(SIGSEGV, &sa, &old_segv);
	sig = sigsetjmp(fault_jmp, 1);
	if (!sig) {
		memset(w, 0, stride);
		w->wr_id = wr_id;
		w->opcode = HCA_WR_SEND;
		w->flags = HCA_WQE_SIGNALED;
		w->num_sge = 1;
		sge->addr = addr_of(e, B_SRC);
		sge->length = 64;
		sge->lkey = lkey_of(e, B_SRC);
	}
	sigaction(SIGBUS, &old_bus, NULL);
	sigaction(SIGSEGV, &old_segv, NULL);
	return sig;
}

/*
 * Maps p's A SQ ring a second time, destroys A, then writes a valid SEND
 * to B into the dead ring through that mapping, its index into A's old
 * record, and rings: nothing may happen. *ring2 and *len say what to
 * unmap. *detail says what was seen.
 */
static int stale_ring(struct env *e, struct pair *p, void **ring2,
		      size_t *len, char *detail, char *why)
{
	size_t page = sysconf(_SC_PAGESIZE);
	struct hcab_context *hctx;
	unsigned long long off = 0;
	struct hca_send_wqe *w;
	struct ibv_wc wc = {};
	struct hcab_qp *q;
	uint32_t pi, mask, shift, qpn;
	void *rec;
	int ret, n, sig;

	/* A real WQE in the ring, so that both views can be compared. */
	if (pair_send_check(p, &e->b[B_SRC], &e->b[B_RECV], 64, ++e->seed,
			    why))
		return -1;
	q = to_hqp(p->qp[0]);
	/* libhcab keeps no cookie: the kernel's is the mapping's offset. */
	if (find_mapping(q->sq.ring, len, &off, why))
		return -1;
	if (*len != q->sq.map_bytes)
		return why_set(why,
			       "the ring's mapping is %zu bytes, libhcab mapped %zu",
			       *len, q->sq.map_bytes);
	*ring2 = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED,
		      e->d.ctx->cmd_fd, (off_t)off);
	if (*ring2 == MAP_FAILED)
		return why_set(why,
			       "second mmap of the SQ ring (offset %#llx): %s",
			       off, strerror(errno));
	if (memcmp(*ring2, q->sq.ring, *len))
		return why_set(why,
			       "the second mapping shows other memory than the ring");
	result("5.stale-ring.second-mapping", true, "same pages as the ring");
	mmap_must_fail(e, "5.mmap.private", *len, MAP_PRIVATE, off, 0);
	mmap_must_fail(e, "5.mmap.oversize", *len + page, MAP_SHARED, off, 0);

	rec = (char *)q->db + offsetof(struct hca_qp_db, sq_pi);
	qpn = q->qpn;
	pi = q->sq.pi;
	mask = hcab_wq_mask(&q->sq);
	shift = q->sq.wqe_shift;
	hctx = to_hctx(p->qp[0]->context);
	env_reset(e);
	if (post_recv(p->qp[1], addr_of(e, B_RECV), BUF_LEN,
		      lkey_of(e, B_RECV), 0xb0b, why))
		return -1;
	/* libhcab unmaps its view (and frees q); ours stays, as does the UAR. */
	ret = ibv_destroy_qp(p->qp[0]);
	p->qp[0] = NULL;
	if (ret)
		return why_set(why, "ibv_destroy_qp: %s", strerror(ret));
	mmap_must_fail(e, "5.mmap.after-destroy", *len, MAP_SHARED, off, 0);
	if (cq_raw_pending(p->cq[0]))
		return why_set(why, "a CQE is pending before the forged doorbell");

	/* A valid SEND to the surviving peer, in the dead QP's next slot. */
	w = (struct hca_send_wqe *)((char *)*ring2 + ((pi & mask) << shift));
	sig = write_stale_wqe(e, w, 1u << shift, pi);
	if (sig) {
		/* Revoked at destroy: nothing stale is left to write. */
		snprintf(detail, WHY_LEN,
			 "the second mapping was revoked at destroy (%s)",
			 strsignal(sig));
		return 0;
	}
	udma_to_device_barrier();
	mmio_write32(rec, pi + 1);
	/* Named too: the device must not run a QPN that is gone. */
	forge_name_sq(hctx, qpn);
	hcab_ring(hctx, HCA_DB_SQ);

	/* B is alive: poll_cq shows its CQEs. A's CQ is read raw. */
	n = cq_wait(p->cq[1], &wc, 1, STALE_QUIET_MS);
	if (n)
		return why_set(why,
			       "the peer got a completion (%s, %u bytes) from the destroyed QP's ring",
			       n < 0 ? "poll failed" :
			       ibv_wc_status_str(wc.status), wc.byte_len);
	if (cq_raw_pending(p->cq[0]))
		return why_set(why,
			       "the device wrote a CQE for the destroyed QP");
	snprintf(detail, WHY_LEN,
		 "no completion in %d ms, peer's buffer unchanged",
		 STALE_QUIET_MS);
	return env_check(e, 0, why);
}

static void check_stale_mapping(struct env *e)
{
	size_t page = sysconf(_SC_PAGESIZE), len = 0;
	char why[WHY_LEN], detail[WHY_LEN] = "";
	void *ring2 = MAP_FAILED;
	struct pair p;
	bool ok;

	env_reset(e);
	if (pair_create(&e->d, e->d.pd, &p, why)) {
		result("5.stale-ring.doorbell", false, why);
	} else {
		ok = !stale_ring(e, &p, &ring2, &len, detail, why);
		result("5.stale-ring.doorbell", ok, ok ? detail : why);
		/* A new pair (perhaps the same QPN and record): clean, working. */
		fresh_pair_check(e, "5.stale-ring.new-pair");
		if (ring2 != MAP_FAILED)
			munmap(ring2, len);
		if (pair_destroy(&p, why))
			result("5.stale-ring.teardown", false, why);
	}
	mmap_must_fail(e, "5.mmap.made-up-offset", page, MAP_SHARED,
		       BOGUS_PGOFF * page, EINVAL);
}

/* ------------------------------------------------------------------ */
/* Children: forked before any verbs call, started through a pipe      */

struct child_msg {
	char kind;		/* 'R': running, 'D': done */
	char ok;
	unsigned long count;
	char why[WHY_LEN];
};

struct child {
	pid_t pid;
	int go;			/* parent -> child: 'G' to start, 'S' to stop */
	int res;		/* child -> parent: struct child_msg */
};

static void child_send(int fd, char kind, bool ok, unsigned long count,
		       const char *why)
{
	struct child_msg m;
	ssize_t r;

	memset(&m, 0, sizeof(m));
	m.kind = kind;
	m.ok = ok;
	m.count = count;
	snprintf(m.why, sizeof(m.why), "%s", why ? why : "");
	r = write(fd, &m, sizeof(m));
	(void)r;
}

/* 1: a message; 0: none within ms; -1: the child is gone. */
static int child_recv(struct child *c, struct child_msg *m, unsigned int ms)
{
	struct pollfd pfd = { .fd = c->res, .events = POLLIN };
	ssize_t r;
	int n;

	n = poll(&pfd, 1, ms);
	if (n <= 0)
		return 0;
	r = read(c->res, m, sizeof(*m));
	if (r == (ssize_t)sizeof(*m))
		return 1;
	return -1;
}

static bool go_pending(int go)
{
	struct pollfd pfd = { .fd = go, .events = POLLIN };

	return poll(&pfd, 1, 0) > 0;
}

static void child_ping_pong(int go, int res);
static void child_traffic(int go, int res);

static void spawn(struct child *c, void (*fn)(int, int))
{
	int go[2], res[2];
	char cmd;

	c->pid = -1;
	c->go = -1;
	c->res = -1;
	if (pipe(go))
		return;
	if (pipe(res)) {
		close(go[0]);
		close(go[1]);
		return;
	}
	fflush(stdout);
	c->pid = fork();
	if (c->pid == 0) {
		close(go[1]);
		close(res[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		/* Nothing to do unless told: EOF means the parent is done. */
		if (read(go[0], &cmd, 1) == 1 && cmd == 'G')
			fn(go[0], res[1]);
		_exit(0);
	}
	close(go[0]);
	close(res[1]);
	if (c->pid < 0) {
		close(go[1]);
		close(res[0]);
		return;
	}
	c->go = go[1];
	c->res = res[0];
}

static bool child_tell(struct child *c, char cmd)
{
	return c->go >= 0 && write(c->go, &cmd, 1) == 1;
}

/* Reaps c within ms (SIGKILL after that); its wait status, -1 if none. */
static int child_reap(struct child *c, unsigned int ms)
{
	uint64_t end = now_ms() + ms;
	int st = -1;
	pid_t r;

	if (c->pid <= 0)
		return -1;
	for (;;) {
		r = waitpid(c->pid, &st, WNOHANG);
		if (r == c->pid)
			break;
		if (r < 0) {
			st = -1;
			break;
		}
		if (now_ms() >= end) {
			kill(c->pid, SIGKILL);
			waitpid(c->pid, NULL, 0);
			st = -1;
			break;
		}
		usleep(10000);
	}
	c->pid = -1;
	if (c->go >= 0)
		close(c->go);
	if (c->res >= 0)
		close(c->res);
	c->go = -1;
	c->res = -1;
	return st;
}

static unsigned long pp_iters(void)
{
	const char *s = getenv("HOSTILE_PINGPONG");
	unsigned long n = s ? strtoul(s, NULL, 0) : 0;

	return n ? n : PP_ROUND_TRIPS;
}

/* One round trip: 4 KiB A -> B, then 4 KiB B -> A, each checked. */
static int ping_pong_once(struct pair *p, struct gbuf *atx, struct gbuf *arx,
			  struct gbuf *btx, struct gbuf *brx, unsigned long i,
			  char *why)
{
	struct ibv_wc wc[2];
	int n, k, got_send = 0, got_recv = 0;

	if (post_recv(p->qp[1], (uintptr_t)brx->data, BUF_LEN, brx->mr->lkey,
		      2 * i, why) ||
	    post_recv(p->qp[0], (uintptr_t)arx->data, BUF_LEN, arx->mr->lkey,
		      2 * i + 1, why))
		return -1;
	pattern_fill(atx->data, BUF_LEN, 2 * i);
	if (post_one(p->qp[0], IBV_WR_SEND, (uintptr_t)atx->data, BUF_LEN,
		     atx->mr->lkey, 0, 0, 2 * i, why) ||
	    expect_ok(p->cq[1], IBV_WC_RECV, 2 * i, BUF_LEN, CHILD_WAIT_MS,
		      "ping receive", why) ||
	    compare(brx->data, atx->data, BUF_LEN, "ping data", why))
		return -1;
	pattern_fill(btx->data, BUF_LEN, 2 * i + 1);
	if (post_one(p->qp[1], IBV_WR_SEND, (uintptr_t)btx->data, BUF_LEN,
		     btx->mr->lkey, 0, 0, 2 * i + 1, why))
		return -1;
	/* A's send completion and the pong may come in either order. */
	n = cq_wait(p->cq[0], wc, 2, CHILD_WAIT_MS);
	if (n != 2)
		return why_set(why, "%d of 2 completions on A in %d ms",
			       n < 0 ? 0 : n, CHILD_WAIT_MS);
	for (k = 0; k < 2; k++) {
		if (wc[k].status != IBV_WC_SUCCESS)
			return why_set(why, "A: %s",
				       ibv_wc_status_str(wc[k].status));
		if (wc[k].opcode == IBV_WC_SEND && wc[k].wr_id == 2 * i)
			got_send++;
		else if (wc[k].opcode == IBV_WC_RECV &&
			 wc[k].wr_id == 2 * i + 1 && wc[k].byte_len == BUF_LEN)
			got_recv++;
	}
	if (got_send != 1 || got_recv != 1)
		return why_set(why,
			       "A's completions are not one send and one 4 KiB receive");
	if (compare(arx->data, btx->data, BUF_LEN, "pong data", why) ||
	    expect_ok(p->cq[1], IBV_WC_SEND, 2 * i + 1, 0, CHILD_WAIT_MS,
		      "pong send", why))
		return -1;
	return 0;
}

/* Check 6's child: a clean ping-pong of its own until told to stop. */
static void child_ping_pong(int go, int res)
{
	struct gbuf atx = {}, arx = {}, btx = {}, brx = {};
	unsigned long min = pp_iters(), done = 0;
	char why[WHY_LEN] = "";
	bool ok = false, stop = false;
	struct pair p = {};
	struct dev d;
	uint64_t start;

	if (dev_open(&d, why)) {
		child_send(res, 'D', false, 0, why);
		return;
	}
	if (gbuf_init(&atx, "A tx", d.pd, BUF_LEN, IBV_ACCESS_LOCAL_WRITE, 1,
		      why) ||
	    gbuf_init(&arx, "A rx", d.pd, BUF_LEN, IBV_ACCESS_LOCAL_WRITE, 2,
		      why) ||
	    gbuf_init(&btx, "B tx", d.pd, BUF_LEN, IBV_ACCESS_LOCAL_WRITE, 3,
		      why) ||
	    gbuf_init(&brx, "B rx", d.pd, BUF_LEN, IBV_ACCESS_LOCAL_WRITE, 4,
		      why) ||
	    pair_create(&d, d.pd, &p, why))
		goto out;
	start = now_ms();
	for (;;) {
		if (ping_pong_once(&p, &atx, &arx, &btx, &brx, done, why)) {
			char tmp[WHY_LEN];

			snprintf(tmp, sizeof(tmp), "round trip %lu: %s", done,
				 why);
			snprintf(why, WHY_LEN, "%s", tmp);
			goto out;
		}
		if (!done++)
			child_send(res, 'R', true, done, NULL);
		if (!stop && go_pending(go))
			stop = true;
		if (done >= min && stop)
			break;
		if (now_ms() - start > CHILD_CAP_MS) {
			if (done >= min)
				break;
			why_set(why, "only %lu of %lu round trips in %d s",
				done, min, CHILD_CAP_MS / 1000);
			goto out;
		}
	}
	if (gbuf_check(&atx, true, why) || gbuf_check(&arx, true, why) ||
	    gbuf_check(&btx, true, why) || gbuf_check(&brx, true, why))
		goto out;
	ok = true;
out:
	if (pair_destroy(&p, ok ? why : NULL))
		ok = false;
	gbuf_fini(&atx);
	gbuf_fini(&arx);
	gbuf_fini(&btx);
	gbuf_fini(&brx);
	dev_close(&d);
	child_send(res, 'D', ok, done, why);
}

/* Check 7's child: SENDs and RDMA WRITEs in a loop until it is killed. */
static void child_traffic(int go, int res)
{
	struct gbuf tx = {}, rx = {};
	unsigned long completions = 0;
	unsigned int outstanding = 0, k;
	char why[WHY_LEN] = "";
	struct pair p = {};
	struct ibv_wc wc[16];
	uint64_t start, last;
	bool told = false;
	struct dev d;
	int n, i;

	if (dev_open(&d, why)) {
		child_send(res, 'D', false, 0, why);
		return;
	}
	if (gbuf_init(&tx, "tx", d.pd, BUF_LEN, IBV_ACCESS_LOCAL_WRITE, 1,
		      why) ||
	    gbuf_init(&rx, "rx", d.pd, BUF_LEN, IBV_ACCESS_LOCAL_WRITE |
		      IBV_ACCESS_REMOTE_WRITE, 2, why) ||
	    pair_create(&d, d.pd, &p, why))
		goto out;
	for (k = 0; k < WQ_DEPTH / 2; k++)
		if (post_recv(p.qp[1], (uintptr_t)rx.data, BUF_LEN,
			      rx.mr->lkey, k, why))
			goto out;
	pattern_fill(tx.data, BUF_LEN, 7);
	start = last = now_ms();
	for (k = 0;;) {
		while (outstanding < 8) {
			if (post_one(p.qp[0], k & 1 ? IBV_WR_RDMA_WRITE :
				     IBV_WR_SEND, (uintptr_t)tx.data, BUF_LEN,
				     tx.mr->lkey, (uintptr_t)rx.data,
				     rx.mr->rkey, k, why))
				goto out;
			outstanding++;
			k++;
		}
		n = ibv_poll_cq(p.cq[0], 16, wc);
		for (i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				why_set(why, "sender: %s",
					ibv_wc_status_str(wc[i].status));
				goto out;
			}
			outstanding--;
			completions++;
			last = now_ms();
		}
		n = ibv_poll_cq(p.cq[1], 16, wc);
		for (i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				why_set(why, "receiver: %s",
					ibv_wc_status_str(wc[i].status));
				goto out;
			}
			if (post_recv(p.qp[1], (uintptr_t)rx.data, BUF_LEN,
				      rx.mr->lkey, wc[i].wr_id, why))
				goto out;
		}
		if (!told && completions >= KILL_AFTER) {
			child_send(res, 'R', true, completions, NULL);
			told = true;
		}
		if (now_ms() - last > CHILD_WAIT_MS) {
			why_set(why, "traffic stalled after %lu completions",
				completions);
			goto out;
		}
		if (now_ms() - start > CHILD_CAP_MS) {
			why_set(why, "not killed within %d s", CHILD_CAP_MS / 1000);
			goto out;
		}
		sched_yield();
	}
out:
	/* Only on failure: a killed child never gets here. */
	pair_destroy(&p, NULL);
	gbuf_fini(&tx);
	gbuf_fini(&rx);
	dev_close(&d);
	child_send(res, 'D', false, completions, why);
}

/* ------------------------------------------------------------------ */
/* Checks 6 and 7 in the parent                                        */

static bool check6_start(struct child *c, char *why)
{
	struct child_msg m;
	int r;

	if (c->pid <= 0 || !child_tell(c, 'G')) {
		why_set(why, "could not start the child");
		return false;
	}
	r = child_recv(c, &m, CHILD_START_MS);
	if (r == 1 && m.kind == 'R')
		return true;
	if (r == 1)
		why_set(why, "child failed before its traffic ran: %s", m.why);
	else if (r == 0)
		why_set(why, "child ran no round trip in %d ms",
			CHILD_START_MS);
	else
		why_set(why, "child died before its traffic ran");
	return false;
}

static void check6_finish(struct child *c, bool started, const char *why0)
{
	const char *name = "6.another-process";
	char why[WHY_LEN];
	struct child_msg m;
	int r, st;

	if (!started) {
		child_reap(c, 0);
		result(name, false, why0);
		return;
	}
	child_tell(c, 'S');
	r = child_recv(c, &m, CHILD_CAP_MS + CHILD_WAIT_MS);
	st = child_reap(c, REAP_MS);
	if (r != 1 || m.kind != 'D') {
		why_set(why, "no result from the child (wait status %#x)", st);
		result(name, false, why);
		return;
	}
	if (!m.ok) {
		result(name, false, m.why);
		return;
	}
	why_set(why,
		"%lu round trips (%lu SENDs of 4 KiB, data checked) while 3 and 4 ran",
		m.count, 2 * m.count);
	result(name, true, why);
}

static void check_kill(struct env *e, struct child *c)
{
	char why[WHY_LEN], detail[WHY_LEN];
	struct gbuf tx = {}, rx = {};
	struct child_msg m;
	struct pair p;
	struct dev d2;
	bool ok;
	int r, st;

	if (c->pid <= 0 || !child_tell(c, 'G')) {
		result("7.kill.child", false, "could not start the child");
		goto after;
	}
	r = child_recv(c, &m, CHILD_START_MS);
	if (r != 1 || m.kind != 'R') {
		if (r == 1)
			why_set(why, "child failed: %s", m.why);
		else
			why_set(why, "child ran no traffic in %d ms",
				CHILD_START_MS);
		child_reap(c, 0);
		result("7.kill.child", false, why);
		goto after;
	}
	usleep(50000);
	kill(c->pid, SIGKILL);
	st = child_reap(c, REAP_MS);
	if (st == -1) {
		result("7.kill.child", false,
		       "the killed child was not reaped in 20 s (stuck in the kernel?)");
		goto after;
	}
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		why_set(why, "the child ended on its own (status %#x) before the kill",
			st);
		result("7.kill.child", false, why);
		goto after;
	}
	snprintf(detail, sizeof(detail), "killed after %lu+ completions",
		 m.count);
	result("7.kill.child", true, detail);
after:
	/* A new context, as a process started now would get. */
	if (dev_open(&d2, why)) {
		result("7.kill.new-context", false, why);
	} else {
		ok = !gbuf_init(&tx, "tx", d2.pd, BUF_LEN,
				IBV_ACCESS_LOCAL_WRITE, 1, why) &&
		     !gbuf_init(&rx, "rx", d2.pd, BUF_LEN,
				IBV_ACCESS_LOCAL_WRITE, 2, why) &&
		     !pair_create(&d2, d2.pd, &p, why);
		if (ok) {
			ok = !pair_quiet(&p, QUIET_MS, why) &&
			     !pair_send_check(&p, &tx, &rx, BUF_LEN, ++e->seed,
					      why);
			if (pair_destroy(&p, ok ? why : NULL))
				ok = false;
		}
		gbuf_fini(&tx);
		gbuf_fini(&rx);
		dev_close(&d2);
		result("7.kill.new-context", ok,
		       ok ? "4 KiB SEND, data checked" : why);
	}
	fresh_pair_check(e, "7.kill.old-context");
}

/* ------------------------------------------------------------------ */

/* Writes `text` to a sysfs file: 0, or the errno of the write. */
static int sysfs_write(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	int err = 0;

	if (!f)
		return errno;
	if (fputs(text, f) == EOF)
		err = errno;
	if (fclose(f) && !err)
		err = errno;
	return err;
}

/*
 * 8: CQs are the device's scarcest queues (two contexts' UAR slots are all
 * of them). A process that takes what it can stops at hca_ib's user share,
 * whatever others hold, and the kernel keeps the rest: an IPoIB child
 * interface (two CQs and a QP of ib_ipoib's) comes up while the hoard lasts.
 */
static void check_hoard(void)
{
	static const char child[] = "/sys/class/net/ib0/create_child";
	struct ibv_cq *cqs[2 * HCA_UAR_CQ_SLOTS];
	char why[WHY_LEN] = "", detail[WHY_LEN];
	unsigned int share = 75, limit, n = 0, i, k;
	struct dev d[2] = {};
	int err = 0;
	FILE *f;
	bool ok;

	f = fopen("/sys/module/hca_ib/parameters/user_share", "r");
	if (f) {
		if (fscanf(f, "%u", &share) != 1)
			share = 75;
		fclose(f);
	}
	limit = HCA_MAX_CQ * (share > 100 ? 100 : share) / 100;
	for (k = 0; k < 2 && !err; k++) {
		if (dev_open(&d[k], why)) {
			result("8.hoard.cq", false, why);
			goto out;
		}
		err = 0;
		while (n < sizeof(cqs) / sizeof(cqs[0])) {
			cqs[n] = ibv_create_cq(d[k].ctx, 1, NULL, NULL, 0);
			if (!cqs[n]) {
				err = errno;
				break;
			}
			n++;
		}
		/* The first context runs out of UAR slots: go on. */
		if (k == 0 && n == HCA_UAR_CQ_SLOTS)
			err = 0;
	}
	/* Others (this process's other contexts, its children) hold a few. */
	ok = err == ENOMEM && n <= limit && n >= limit / 2;
	snprintf(detail, sizeof(detail),
		 "%u CQs, then %s; the share is %u%% of %u, %u", n,
		 strerror(err), share, HCA_MAX_CQ, limit);
	result("8.hoard.cq", ok, detail);
	if (access(child, W_OK)) {
		printf("SKIP 8.hoard.kernel: no %s (ib_ipoib not loaded)\n",
		       child);
		goto out;
	}
	err = sysfs_write(child, "0x7ffe");
	snprintf(detail, sizeof(detail), "%s", err ? strerror(err) :
		 "ib0.7ffe made with the hoard held");
	result("8.hoard.kernel", !err, detail);
	if (!err)
		sysfs_write("/sys/class/net/ib0/delete_child", "0x7ffe");
out:
	for (i = 0; i < n; i++)
		ibv_destroy_cq(cqs[i]);
	dev_close(&d[0]);
	dev_close(&d[1]);
}

static struct child kids[2];

static void watchdog(int sig)
{
	static const char msg[] =
		"FAIL watchdog: the run took too long (hung?)\n";
	ssize_t r;
	int i;

	r = write(STDOUT_FILENO, msg, sizeof(msg) - 1);
	(void)r;
	for (i = 0; i < 2; i++)
		if (kids[i].pid > 0)
			kill(kids[i].pid, SIGKILL);
	_exit(2);
}

int main(int argc, char **argv)
{
	const char *s = getenv("HOSTILE_SEED");
	struct child *pp = &kids[0], *killee = &kids[1];
	char why[WHY_LEN] = "", why6[WHY_LEN] = "";
	unsigned int wd;
	uint64_t t0 = now_ms(), seed;
	struct env e;
	bool started;

	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	seed = s ? strtoull(s, NULL, 0) :
	       ((uint64_t)time(NULL) << 20 ^ (uint64_t)getpid());
	rng_state = seed ? seed : 1;
	s = getenv("HOSTILE_WATCHDOG");
	wd = s ? strtoul(s, NULL, 0) : 300;
	s = getenv("HOSTILE_DEV");
	printf("uverbs-hostile: device %s, seed %#" PRIx64 "\n",
	       s && *s ? s : DEV_DEFAULT, seed);

	/* Before any verbs call: the children share nothing of ours. */
	spawn(pp, child_ping_pong);
	spawn(killee, child_traffic);
	signal(SIGALRM, watchdog);
	alarm(wd);

	if (env_init(&e, why)) {
		result("setup", false, why);
		child_reap(pp, 0);
		child_reap(killee, 0);
		printf("uverbs-hostile: 0 passed, 1 failed (setup), %.1f s\n",
		       (now_ms() - t0) / 1000.0);
		return 1;
	}
	e.seed = (uint32_t)seed;

	check_reserved_lkey(&e);
	check_forged_keys(&e);

	/* Check 6's child runs its ping-pong while 3 and 4 do their worst. */
	started = check6_start(pp, why6);
	check_forged_pi(&e);
	check_garbage(&e);
	check6_finish(pp, started, why6);

	check_stale_mapping(&e);
	check_kill(&e, killee);
	check_hoard();

	env_fini(&e);
	alarm(0);
	printf("uverbs-hostile: %u passed, %u failed, %.1f s\n", n_pass,
	       n_fail, (now_ms() - t0) / 1000.0);
	return n_fail ? 1 : 0;
}
