// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * The provider's data path against a simulated kernel and device, in one
 * process and without libibverbs: the ibv_cmd_* calls the provider makes
 * are answered here as hca_ib's user verbs would (rings sized from the
 * caps, a UAR page of records, mmap cookies), and a small device executes
 * posted WQEs between RC and UD QPs of this process by the ABI's rules
 * (hca_abi.h: records, wr_id echo, CQEs with the owner byte last).
 *
 * It checks what a guest cannot show cheaply: index wrap-around, full
 * queues, the wr_id trick with unsignaled sends, SRQ tags completed out of
 * order, inline data, CQEs of destroyed and reset QPs, and the arm word.
 * It knows only the ABI, not hca-model: runtime in guests is the real test.
 *
 * build.sh compiles it with the provider's objects and runs it.
 */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../hcab.h"
#include "../hcab-abi.h"

#define CHECK(cond)							\
	do {								\
		if (!(cond)) {						\
			fprintf(stderr, "sim: %s:%d: check failed: %s\n",	\
				__FILE__, __LINE__, #cond);		\
			abort();					\
		}							\
	} while (0)

#define PEER		7
#define SLID		0x11
#define QKEY		0x1234

/* ------------------------------------------------------------------ */
/* The simulated device: it sees rings through mappings of its own.   */

struct dcq {
	struct hca_cqe *ring;
	uint32_t log, pi;
	struct hca_cq_db *rec;
	uint32_t arm_seen;
	int overflow;
};

struct dsrq {
	uint8_t *ring;
	uint32_t log, shift, ci;
	struct hca_srq_db *rec;
};

struct dqp {
	int live;
	uint32_t qpn, type, sig_all, peer;
	uint8_t *sq, *rq;
	uint32_t sq_log, sq_shift, sq_ci, rq_log, rq_shift, rq_ci;
	struct dsrq *srq;
	struct dcq *scq, *rcq;
	struct hca_qp_db *rec;
	int named;	/* HCA_UCREATE_QP_SQ_RING: run when the UAR's ring names it */
	int rung;	/* named since the last dev_run */
};

static struct hcab_context *ctx;
static uint32_t sq_ring_ci;	/* the device's own consumer index */
static uint32_t doorbell;
static struct dqp dqps[HCA_MAX_QP];
static struct dcq dcqs[HCA_MAX_CQ];
static struct dsrq dsrqs[HCA_MAX_SRQ];
static uint32_t next_cqn, next_srqn = 1;

/* A ring the kernel allocated: a memfd, its cookie the fd. */
static void *dev_ring(size_t bytes, __u64 *cookie)
{
	size_t len = (bytes + 4095) & ~(size_t)4095;
	int fd = memfd_create("ring", 0);
	void *p;

	CHECK(fd >= 0 && ftruncate(fd, len) == 0);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(p != MAP_FAILED);
	*cookie = fd;
	return p;
}

void *hcab_mmap(struct hcab_context *c, uint64_t offset, size_t bytes,
		size_t *map_bytes)
{
	size_t len = (bytes + c->page_size - 1) & ~(c->page_size - 1);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED,
		       (int)offset, 0);

	if (p == MAP_FAILED)
		return NULL;
	*map_bytes = len;
	return p;
}

static void dev_post_cqe(struct dcq *cq, struct hca_cqe c)
{
	uint32_t size = 1u << cq->log;
	struct hca_cqe *slot = &cq->ring[cq->pi & (size - 1)];

	if (cq->pi - cq->rec->ci >= size) {
		cq->overflow = 1;
		return;
	}
	c.owner = 0;
	memcpy(slot, &c, HCA_CQE_OWNER_OFFSET);
	memcpy((uint8_t *)slot + HCA_CQE_OWNER_OFFSET + 1,
	       (uint8_t *)&c + HCA_CQE_OWNER_OFFSET + 1,
	       sizeof(c) - HCA_CQE_OWNER_OFFSET - 1);
	__atomic_store_n(&slot->owner, hca_owner_bit(cq->pi, cq->log),
			 __ATOMIC_RELEASE);
	cq->pi++;
}

/* The next receive WQE of q (its RQ or its SRQ), or NULL. */
static struct hca_recv_wqe *dev_take_recv(struct dqp *q)
{
	if (q->srq) {
		struct dsrq *s = q->srq;

		if (s->ci == s->rec->pi)
			return NULL;
		return (void *)(s->ring +
			((size_t)(s->ci++ & ((1u << s->log) - 1)) << s->shift));
	}
	if (q->rq_ci == q->rec->rq_pi)
		return NULL;
	return (void *)(q->rq +
		((size_t)(q->rq_ci++ & ((1u << q->rq_log) - 1)) << q->rq_shift));
}

static uint32_t dev_gather(struct hca_send_wqe *w, uint8_t *buf)
{
	struct hca_sge *sge = (void *)(w + 1);
	uint32_t len = 0;
	int i;

	if (w->flags & HCA_WQE_INLINE) {
		memcpy(buf, w + 1, w->inline_len);
		return w->inline_len;
	}
	for (i = 0; i < w->num_sge; i++) {
		memcpy(buf + len, (void *)(uintptr_t)sge[i].addr, sge[i].length);
		len += sge[i].length;
	}
	return len;
}

static void dev_scatter(struct hca_sge *sge, int n, const uint8_t *buf,
			uint32_t len)
{
	int i;

	for (i = 0; i < n && len; i++) {
		uint32_t k = sge[i].length < len ? sge[i].length : len;

		memcpy((void *)(uintptr_t)sge[i].addr, buf, k);
		buf += k;
		len -= k;
	}
}

static uint8_t dev_cqe_op(uint8_t wr_op)
{
	switch (wr_op) {
	case HCA_WR_RDMA_WRITE:
	case HCA_WR_RDMA_WRITE_IMM:
		return HCA_CQE_OP_RDMA_WRITE;
	case HCA_WR_RDMA_READ:
		return HCA_CQE_OP_RDMA_READ;
	case HCA_WR_ATOMIC_CMP_SWP:
		return HCA_CQE_OP_COMP_SWAP;
	case HCA_WR_ATOMIC_FETCH_ADD:
		return HCA_CQE_OP_FETCH_ADD;
	default:
		return HCA_CQE_OP_SEND;
	}
}

static void dev_exec(struct dqp *q, struct hca_send_wqe *w)
{
	static uint8_t buf[1 << 16];
	uint32_t dqpn = q->type == HCA_QPT_UD ? w->ud_remote_qpn : q->peer;
	struct dqp *d = &dqps[dqpn];
	struct hca_cqe c = { .wr_id = w->wr_id, .qpn = q->qpn };
	uint32_t len = 0;
	uint64_t *remote = (uint64_t *)(uintptr_t)w->remote_addr;

	CHECK(d->live);
	switch (w->opcode) {
	case HCA_WR_RDMA_READ:
		dev_scatter((void *)(w + 1), w->num_sge, (void *)remote,
			    ((struct hca_sge *)(w + 1))->length);
		break;
	case HCA_WR_ATOMIC_CMP_SWP:
	case HCA_WR_ATOMIC_FETCH_ADD: {
		uint64_t old = *remote;

		if (w->opcode == HCA_WR_ATOMIC_FETCH_ADD)
			*remote = old + w->compare_add;
		else if (old == w->compare_add)
			*remote = w->swap;
		dev_scatter((void *)(w + 1), w->num_sge, (void *)&old, 8);
		break;
	}
	default:
		len = dev_gather(w, buf);
		if (w->opcode == HCA_WR_RDMA_WRITE ||
		    w->opcode == HCA_WR_RDMA_WRITE_IMM)
			memcpy(remote, buf, len);
	}
	if (w->opcode == HCA_WR_SEND || w->opcode == HCA_WR_SEND_IMM ||
	    w->opcode == HCA_WR_SEND_INV || w->opcode == HCA_WR_RDMA_WRITE_IMM) {
		struct hca_recv_wqe *r = dev_take_recv(d);
		struct hca_cqe rc = { .qpn = d->qpn, .src_qp = q->qpn,
				      .slid = SLID, .byte_len = len,
				      .opcode = HCA_CQE_OP_RECV };

		CHECK(r);	/* the tests post receives first */
		if (q->type == HCA_QPT_UD)
			CHECK(w->ud_qkey == QKEY && w->ud_dlid == SLID);
		rc.wr_id = r->wr_id;
		if (w->opcode == HCA_WR_RDMA_WRITE_IMM) {
			rc.opcode = HCA_CQE_OP_RECV_RDMA_IMM;
			rc.byte_len = 0;
		} else {
			dev_scatter((void *)(r + 1), r->num_sge, buf, len);
		}
		if (w->opcode == HCA_WR_SEND_IMM ||
		    w->opcode == HCA_WR_RDMA_WRITE_IMM)
			rc.flags |= HCA_CQE_FLAG_IMM;
		if (w->opcode == HCA_WR_SEND_INV)
			rc.flags |= HCA_CQE_FLAG_INV;
		rc.imm = w->imm;
		dev_post_cqe(d->rcq, rc);
	}
	if ((w->flags & HCA_WQE_SIGNALED) || q->sig_all) {
		c.opcode = dev_cqe_op(w->opcode);
		c.byte_len = len;
		dev_post_cqe(q->scq, c);
	}
}

/*
 * What DB_SQ makes the device do: run the new WQEs of the QPs the UAR's
 * send-doorbell ring names and of the unnamed ones; of every QP if the ring
 * ran a lap ahead. A named QP the ring does not name is not run, so a post
 * that forgot to name it shows as missing completions.
 */
static void dev_run(void)
{
	char *ring = (char *)ctx->uar + HCA_UAR_SQ_RING_OFFSET;
	uint32_t pi = *(volatile uint32_t *)(ring + HCA_SQ_RING_PI);
	int all = pi - sq_ring_ci >= HCA_SQ_RING_ENTRIES;
	uint32_t i;

	for (; !all && sq_ring_ci != pi; sq_ring_ci++) {
		uint32_t qpn = *(uint32_t *)(ring + HCA_SQ_RING_QPN_OFFSET + 4 *
					     (sq_ring_ci % HCA_SQ_RING_ENTRIES));

		CHECK(qpn < HCA_MAX_QP && dqps[qpn].live && dqps[qpn].named);
		dqps[qpn].rung = 1;
	}
	sq_ring_ci = pi;
	for (i = 0; i < HCA_MAX_QP; i++) {
		struct dqp *q = &dqps[i];

		if (q->named && !q->rung && !all)
			continue;
		q->rung = 0;
		while (q->live && q->sq_ci != q->rec->sq_pi) {
			dev_exec(q, (void *)(q->sq +
				((size_t)(q->sq_ci & ((1u << q->sq_log) - 1)) <<
				 q->sq_shift)));
			q->sq_ci++;
		}
	}
}

/* ------------------------------------------------------------------ */
/* The simulated kernel: the ibv_cmd_* the objects call.              */

static uint32_t order_base_2(uint32_t n)
{
	uint32_t l = 0;

	while ((1u << l) < n)
		l++;
	return l;
}

/* hca_ib's hca_wq_size */
static void kern_wq_size(uint32_t wr, uint32_t hdr, uint32_t sge, uint32_t inl,
			 uint32_t min_shift, uint8_t *log, uint8_t *shift)
{
	uint32_t bytes = hdr + sge * 16 > hdr + inl ? hdr + sge * 16 : hdr + inl;

	*log = order_base_2(wr ? wr : 1);
	*shift = order_base_2(bytes) > min_shift ? order_base_2(bytes) : min_shift;
}

int ibv_cmd_create_cq(struct ibv_context *context, int cqe,
		      struct ibv_comp_channel *channel, int comp_vector,
		      struct ibv_cq *cq, struct ibv_create_cq *cmd,
		      size_t cmd_size, struct ib_uverbs_create_cq_resp *resp,
		      size_t resp_size)
{
	struct hcab_create_cq_resp *r = (void *)resp;
	uint32_t cqn = next_cqn++;
	struct dcq *d = &dcqs[cqn];

	CHECK(resp_size == sizeof(*r));
	d->log = order_base_2(cqe) ? order_base_2(cqe) : 1;
	d->ring = dev_ring(sizeof(struct hca_cqe) << d->log,
			   &r->drv.ring_mmap_offset);
	d->rec = (void *)((char *)ctx->uar + HCA_UAR_CQ_OFFSET + 8 * cqn);
	memset(d->rec, 0, sizeof(*d->rec));	/* the device does, at CREATE */
	r->drv.cqn = cqn;
	r->drv.log_entries = d->log;
	r->drv.db_slot = cqn;
	cq->context = context;
	cq->cqe = 1 << d->log;
	return 0;
}

int ibv_cmd_destroy_cq(struct ibv_cq *cq)
{
	return 0;
}

/* hca_ib's resize_cq and the device's RESIZE_CQ in one. */
int ibv_cmd_resize_cq(struct ibv_cq *cq, int cqe, struct ibv_resize_cq *cmd,
		      size_t cmd_size, struct ib_uverbs_resize_cq_resp *resp,
		      size_t resp_size)
{
	struct hcab_resize_cq_resp *r = (void *)resp;
	uint32_t cqn = to_hcq(cq)->cqn, i, log, pending;
	struct dcq *d = &dcqs[cqn];
	struct hca_cqe *ring;

	CHECK(resp_size == sizeof(*r));
	log = order_base_2(cqe) ? order_base_2(cqe) : 1;
	pending = d->pi - d->rec->ci;
	if (pending > 1u << log)
		return EINVAL;
	ring = dev_ring(sizeof(struct hca_cqe) << log, &r->drv.ring_mmap_offset);
	for (i = 0; i < pending; i++) {
		ring[i] = d->ring[(d->rec->ci + i) & ((1u << d->log) - 1)];
		ring[i].owner = hca_owner_bit(i, log);
	}
	d->ring = ring;
	d->log = log;
	d->pi = pending;
	d->rec->ci = 0;
	r->drv.cqn = cqn;
	r->drv.log_entries = log;
	r->drv.db_slot = cqn;
	cq->cqe = 1 << log;
	return 0;
}

int ibv_cmd_create_srq(struct ibv_pd *pd, struct ibv_srq *srq,
		       struct ibv_srq_init_attr *attr,
		       struct ibv_create_srq *cmd, size_t cmd_size,
		       struct ib_uverbs_create_srq_resp *resp, size_t resp_size)
{
	struct hcab_create_srq_resp *r = (void *)resp;
	uint32_t srqn = next_srqn++;
	struct dsrq *d = &dsrqs[srqn];
	uint8_t log, shift;

	CHECK(resp_size == sizeof(*r));
	kern_wq_size(attr->attr.max_wr, 16, attr->attr.max_sge, 0,
		     HCA_MIN_RQ_WQE_SHIFT, &log, &shift);
	d->log = log;
	d->shift = shift;
	d->ring = dev_ring((size_t)1 << (log + shift), &r->drv.ring_mmap_offset);
	d->rec = (void *)((char *)ctx->uar + HCA_UAR_SRQ_OFFSET + 8 * srqn);
	memset(d->rec, 0, sizeof(*d->rec));	/* the device does, at CREATE */
	r->drv.srqn = srqn;
	r->drv.db_slot = srqn;
	r->drv.log_entries = log;
	r->drv.wqe_shift = shift;
	srq->context = pd->context;
	srq->pd = pd;
	return 0;
}

int ibv_cmd_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		       int srq_attr_mask, struct ibv_modify_srq *cmd,
		       size_t cmd_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
		      struct ibv_query_srq *cmd, size_t cmd_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_destroy_srq(struct ibv_srq *srq)
{
	return 0;
}

int ibv_cmd_create_qp(struct ibv_pd *pd, struct ibv_qp *qp,
		      struct ibv_qp_init_attr *attr, struct ibv_create_qp *cmd,
		      size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
		      size_t resp_size)
{
	struct hcab_create_qp_resp *r = (void *)resp;
	uint32_t qpn = 2;
	struct hcab_create_qp *c = (void *)cmd;
	struct dqp *d;

	/* The lowest free number, so that a destroyed QP's comes back at once. */
	while (dqps[qpn].live)
		qpn++;
	d = &dqps[qpn];

	CHECK(resp_size == sizeof(*r));
	CHECK(cmd_size == sizeof(*c));
	memset(d, 0, sizeof(*d));
	d->qpn = qpn;
	/* The provider asks for a named QP where the device has the rings. */
	d->named = !!(c->drv.flags & HCA_UCREATE_QP_SQ_RING);
	CHECK(d->named == ctx->sq_ring);
	d->type = attr->qp_type == IBV_QPT_UD ? HCA_QPT_UD : HCA_QPT_RC;
	d->sig_all = attr->sq_sig_all;
	kern_wq_size(attr->cap.max_send_wr, 64, attr->cap.max_send_sge,
		     attr->cap.max_inline_data, HCA_MIN_SQ_WQE_SHIFT,
		     &r->drv.sq_log_entries, &r->drv.sq_wqe_shift);
	d->sq_log = r->drv.sq_log_entries;
	d->sq_shift = r->drv.sq_wqe_shift;
	d->sq = dev_ring((size_t)1 << (d->sq_log + d->sq_shift),
			 &r->drv.sq_mmap_offset);
	if (attr->srq) {
		d->srq = &dsrqs[to_hsrq(attr->srq)->srqn];
	} else {
		kern_wq_size(attr->cap.max_recv_wr, 16, attr->cap.max_recv_sge,
			     0, HCA_MIN_RQ_WQE_SHIFT, &r->drv.rq_log_entries,
			     &r->drv.rq_wqe_shift);
		d->rq_log = r->drv.rq_log_entries;
		d->rq_shift = r->drv.rq_wqe_shift;
		d->rq = dev_ring((size_t)1 << (d->rq_log + d->rq_shift),
				 &r->drv.rq_mmap_offset);
	}
	d->scq = &dcqs[to_hcq(attr->send_cq)->cqn];
	d->rcq = &dcqs[to_hcq(attr->recv_cq)->cqn];
	d->rec = (void *)((char *)ctx->uar + HCA_UAR_QP_OFFSET + 8 * qpn);
	memset(d->rec, 0, sizeof(*d->rec));	/* the device does, at CREATE */
	d->live = 1;
	r->drv.qpn = qpn;
	r->drv.db_slot = qpn;
	r->drv.max_inline = (1u << d->sq_shift) - 64;
	r->ibv_resp.qpn = qpn;
	qp->context = pd->context;
	qp->pd = pd;
	qp->qp_num = qpn;
	qp->qp_type = attr->qp_type;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->srq = attr->srq;
	return 0;
}

int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		      int attr_mask, struct ibv_modify_qp *cmd,
		      size_t cmd_size)
{
	struct dqp *d = &dqps[qp->qp_num];

	if (attr_mask & IBV_QP_DEST_QPN)
		d->peer = attr->dest_qp_num;
	/* As ibv_modify_qp does once the provider's modify_qp returned. */
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	/* RESET empties the device's queues. */
	if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
		d->sq_ci = d->rq_ci = 0;
		memset(d->rec, 0, sizeof(*d->rec));
	}
	return 0;
}

int ibv_cmd_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *qp_attr,
		     int attr_mask, struct ibv_qp_init_attr *qp_init_attr,
		     struct ibv_query_qp *cmd, size_t cmd_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_destroy_qp(struct ibv_qp *qp)
{
	dqps[qp->qp_num].live = 0;
	return 0;
}

/* What verbs.c calls besides: not exercised here. */
int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd,
		     struct ibv_alloc_pd *cmd, size_t cmd_size,
		     struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_dealloc_pd(struct ibv_pd *pd)
{
	return EOPNOTSUPP;
}

int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
		   uint64_t hca_va, int access, struct verbs_mr *vmr,
		   struct ibv_reg_mr *cmd, size_t cmd_size,
		   struct ib_uverbs_reg_mr_resp *resp, size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_dereg_mr(struct verbs_mr *vmr)
{
	return EOPNOTSUPP;
}

int ibv_cmd_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type,
		     struct ibv_mw *mw, struct ibv_alloc_mw *cmd,
		     size_t cmd_size, struct ib_uverbs_alloc_mw_resp *resp,
		     size_t resp_size)
{
	return EOPNOTSUPP;
}

int ibv_cmd_dealloc_mw(struct ibv_mw *mw)
{
	return EOPNOTSUPP;
}

int ibv_cmd_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			 uint16_t lid)
{
	return EOPNOTSUPP;
}

int ibv_cmd_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid,
			 uint16_t lid)
{
	return EOPNOTSUPP;
}

/* ------------------------------------------------------------------ */
/* Tests                                                              */

static struct ibv_pd pd;

static struct ibv_cq *make_cq(int cqe)
{
	struct ibv_cq *cq = hcab_create_cq(&ctx->ibv_ctx.context, cqe, NULL, 0);

	CHECK(cq);
	return cq;
}

static struct ibv_qp *make_qp(enum ibv_qp_type type, struct ibv_cq *scq,
			      struct ibv_cq *rcq, struct ibv_srq *srq,
			      uint32_t wr, uint32_t inl)
{
	struct ibv_qp_init_attr a = {
		.send_cq = scq, .recv_cq = rcq, .srq = srq, .qp_type = type,
		.cap = { .max_send_wr = wr, .max_recv_wr = wr,
			 .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = inl },
	};
	struct ibv_qp *qp = hcab_create_qp(&pd, &a);

	CHECK(qp);
	CHECK(a.cap.max_inline_data >= inl);
	/* Connected at once: the simulated device has no states. */
	qp->state = IBV_QPS_RTS;
	return qp;
}

static void pair_up(struct ibv_qp *a, struct ibv_qp *b)
{
	struct ibv_qp_attr at = { .dest_qp_num = b->qp_num };

	CHECK(hcab_modify_qp(a, &at, IBV_QP_DEST_QPN) == 0);
	at.dest_qp_num = a->qp_num;
	CHECK(hcab_modify_qp(b, &at, IBV_QP_DEST_QPN) == 0);
}

static int post_recv(struct ibv_qp *qp, uint64_t wr_id, void *buf,
		     uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, 1 };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1 }, *bad;

	return hcab_post_recv(qp, &wr, &bad);
}

static int post_srq(struct ibv_srq *srq, uint64_t wr_id, void *buf,
		    uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, 1 };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1 }, *bad;

	return hcab_post_srq_recv(srq, &wr, &bad);
}

static int rdma1(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
		 unsigned int flags, const void *buf, uint32_t len, void *remote)
{
	struct ibv_sge sge = { (uintptr_t)buf, len, 1 };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1, .opcode = op,
				  .send_flags = flags }, *bad;

	wr.wr.rdma.remote_addr = (uintptr_t)remote;
	return hcab_post_send(qp, &wr, &bad);
}

static int send1(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op,
		 unsigned int flags, const void *buf, uint32_t len)
{
	return rdma1(qp, wr_id, op, flags, buf, len, NULL);
}

static struct ibv_wc poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	CHECK(hcab_poll_cq(cq, 1, &wc) == 1);
	CHECK(wc.status == IBV_WC_SUCCESS);
	return wc;
}

static void expect_empty(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	CHECK(hcab_poll_cq(cq, 1, &wc) == 0);
}

/* Sends with SGEs, inline and immediate data, many times round small rings. */
static void test_rc_send_recv_wraps(void)
{
	struct ibv_cq *scq = make_cq(4), *rcq = make_cq(8);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, scq, scq, NULL, 4, 64);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, rcq, rcq, NULL, 8, 0);
	char out[3][100], in[3][100], sent[64];
	struct ibv_sge sg[4];
	struct ibv_send_wr wr[3], *bad;
	struct ibv_wc wc[4];
	int it, i;

	pair_up(a, b);
	for (it = 0; it < 50; it++) {
		for (i = 0; i < 3; i++) {
			memset(out[i], 'a' + (it + i) % 26, sizeof(out[i]));
			memset(in[i], 0, sizeof(in[i]));
			CHECK(post_recv(b, 1000 * it + i, in[i], 100) == 0);
		}
		CHECK(dqps[b->qp_num].rec->rq_pi == (uint32_t)3 * (it + 1));
		CHECK(doorbell == (PEER << HCA_DOORBELL_PEER_SHIFT | HCA_DB_RQ));
		memset(wr, 0, sizeof(wr));
		/* two SGEs */
		sg[0] = (struct ibv_sge){ (uintptr_t)out[0], 30, 1 };
		sg[1] = (struct ibv_sge){ (uintptr_t)out[0] + 30, 70, 1 };
		sg[2] = (struct ibv_sge){ (uintptr_t)out[1], 64, 1 };
		sg[3] = (struct ibv_sge){ (uintptr_t)out[2], 100, 1 };
		wr[0] = (struct ibv_send_wr){ .wr_id = 10 * it, .next = &wr[1],
			.sg_list = sg, .num_sge = 2, .opcode = IBV_WR_SEND };
		/* 64 bytes inline, from a buffer reused at once */
		wr[1] = (struct ibv_send_wr){ .wr_id = 10 * it + 1,
			.next = &wr[2], .sg_list = &sg[2], .num_sge = 1,
			.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE };
		/* immediate data; only this one signaled */
		wr[2] = (struct ibv_send_wr){ .wr_id = 10 * it + 2,
			.sg_list = &sg[3], .num_sge = 1,
			.opcode = IBV_WR_SEND_WITH_IMM,
			.send_flags = IBV_SEND_SIGNALED,
			.imm_data = htobe32(0xabc00000 + it) };
		doorbell = 0;
		CHECK(hcab_post_send(a, wr, &bad) == 0);
		CHECK(doorbell == (PEER << HCA_DOORBELL_PEER_SHIFT | HCA_DB_SQ));
		memcpy(sent, out[1], 64);
		memset(out[1], '#', 64);
		dev_run();
		CHECK(hcab_poll_cq(scq, 4, wc) == 1);
		CHECK(wc[0].wr_id == (uint64_t)10 * it + 2 &&
		      wc[0].opcode == IBV_WC_SEND && wc[0].qp_num == a->qp_num);
		CHECK(hcab_poll_cq(rcq, 4, wc) == 3);
		for (i = 0; i < 3; i++) {
			CHECK(wc[i].wr_id == (uint64_t)1000 * it + i);
			CHECK(wc[i].opcode == IBV_WC_RECV);
			CHECK(wc[i].src_qp == a->qp_num && wc[i].slid == SLID);
		}
		CHECK(wc[0].byte_len == 100 && !memcmp(in[0], out[0], 100));
		/* inline kept the bytes the buffer held when posted */
		CHECK(wc[1].byte_len == 64 && !memcmp(in[1], sent, 64));
		CHECK(wc[2].byte_len == 100 && !memcmp(in[2], out[2], 100));
		CHECK(wc[2].wc_flags & IBV_WC_WITH_IMM);
		CHECK(be32toh(wc[2].imm_data) == 0xabc00000u + it);
		CHECK(!(wc[1].wc_flags & IBV_WC_WITH_IMM));
		/* The CQ's consumer index is published for the device. */
		CHECK(dcqs[to_hcq(rcq)->cqn].rec->ci == (uint32_t)3 * (it + 1));
	}
	/* Inline larger than the QP holds fails, and is not posted. */
	{
		static char big[600];
		uint32_t pi = to_hqp(a)->sq.pi;

		CHECK(send1(a, 1, IBV_WR_SEND, IBV_SEND_INLINE, big,
			    to_hqp(a)->max_inline + 1) == EINVAL);
		CHECK(to_hqp(a)->sq.pi == pi);
	}
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
	CHECK(hcab_destroy_cq(scq) == 0 && hcab_destroy_cq(rcq) == 0);
}

/* Unsignaled sends free their slots only when a later signaled one is polled. */
static void test_full_send_queue(void)
{
	struct ibv_cq *cq = make_cq(16);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 0);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, cq, cq, NULL, 16, 0);
	struct ibv_send_wr wr[5], *bad = NULL;
	static uint64_t word;
	char buf[8];
	int i;

	pair_up(a, b);
	memset(wr, 0, sizeof(wr));
	for (i = 0; i < 5; i++) {
		wr[i].wr_id = i;
		wr[i].next = i < 4 ? &wr[i + 1] : NULL;
		wr[i].opcode = IBV_WR_RDMA_WRITE;
		wr[i].wr.rdma.remote_addr = (uintptr_t)&word;
	}
	wr[3].send_flags = IBV_SEND_SIGNALED;
	CHECK(hcab_post_send(a, wr, &bad) == ENOMEM && bad == &wr[4]);
	dev_run();
	/* Full until the CQE is polled, even though the device is done. */
	CHECK(rdma1(a, 9, IBV_WR_RDMA_WRITE, 0, buf, 8, &word) == ENOMEM);
	CHECK(poll1(cq).wr_id == 3);
	CHECK(rdma1(a, 9, IBV_WR_RDMA_WRITE, 0, buf, 8, &word) == 0);
	/* Bad work requests stop the list where they are. */
	wr[0].next = NULL;
	wr[0].opcode = IBV_WR_TSO;
	CHECK(hcab_post_send(a, wr, &bad) == EINVAL && bad == &wr[0]);
	wr[0].opcode = IBV_WR_SEND;
	wr[0].num_sge = to_hqp(a)->sq.max_sge + 1;
	CHECK(hcab_post_send(a, wr, &bad) == EINVAL && bad == &wr[0]);
	dev_run();
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
	CHECK(hcab_destroy_cq(cq) == 0);
}

static void test_rdma_and_atomics(void)
{
	struct ibv_cq *cq = make_cq(8);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, 8, 32);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, cq, cq, NULL, 8, 0);
	static char remote[64], local[64];
	static uint64_t counter = 40, result;
	struct ibv_sge sge = { (uintptr_t)&result, 8, 1 };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	pair_up(a, b);
	strcpy(local, "written inline");
	CHECK(rdma1(a, 1, IBV_WR_RDMA_WRITE, IBV_SEND_INLINE | IBV_SEND_SIGNALED,
		    local, 15, remote) == 0);
	dev_run();
	CHECK(poll1(cq).opcode == IBV_WC_RDMA_WRITE && !strcmp(remote, local));

	memset(local, 0, sizeof(local));
	wr.wr_id = 2;
	wr.opcode = IBV_WR_RDMA_READ;
	wr.wr.rdma.remote_addr = (uintptr_t)remote;
	sge = (struct ibv_sge){ (uintptr_t)local, 15, 1 };
	/* INLINE means nothing to a read: its SGE is where data lands. */
	wr.send_flags |= IBV_SEND_INLINE;
	CHECK(hcab_post_send(a, &wr, &bad) == 0);
	dev_run();
	wc = poll1(cq);
	CHECK(wc.wr_id == 2 && wc.opcode == IBV_WC_RDMA_READ);
	CHECK(!strcmp(local, "written inline"));

	sge = (struct ibv_sge){ (uintptr_t)&result, 8, 1 };
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr_id = 3;
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.remote_addr = (uintptr_t)&counter;
	wr.wr.atomic.compare_add = 2;
	CHECK(hcab_post_send(a, &wr, &bad) == 0);
	wr.wr_id = 4;
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 42;
	wr.wr.atomic.swap = 7;
	CHECK(hcab_post_send(a, &wr, &bad) == 0);
	dev_run();
	CHECK(poll1(cq).opcode == IBV_WC_FETCH_ADD);
	wc = poll1(cq);
	CHECK(wc.wr_id == 4 && wc.opcode == IBV_WC_COMP_SWAP);
	CHECK(result == 42 && counter == 7);

	/* RDMA write with immediate: the responder's receive completes. */
	{
		char rbuf[8];

		CHECK(post_recv(b, 77, rbuf, sizeof(rbuf)) == 0);
		sge = (struct ibv_sge){ (uintptr_t)local, 4, 1 };
		wr.wr_id = 5;
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.wr.rdma.remote_addr = (uintptr_t)remote;
		wr.imm_data = htobe32(99);
		CHECK(hcab_post_send(a, &wr, &bad) == 0);
		dev_run();
		wc = poll1(cq);
		CHECK(wc.wr_id == 77 && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
		CHECK(wc.qp_num == b->qp_num && be32toh(wc.imm_data) == 99);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
		wc = poll1(cq);
		CHECK(wc.wr_id == 5 && wc.opcode == IBV_WC_RDMA_WRITE);
		CHECK(!memcmp(remote, "writ", 4));
	}
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
	CHECK(hcab_destroy_cq(cq) == 0);
}

/*
 * Two QPs on one SRQ report to different CQs, which are polled in the
 * opposite order: tags come back out of order, and slots keep flowing.
 */
static void test_srq_out_of_order(void)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_cq *scq = make_cq(64), *c1 = make_cq(8), *c2 = make_cq(8);
	struct ibv_srq *srq = hcab_create_srq(&pd, &sa);
	struct ibv_qp *r1, *r2, *s1, *s2;
	char bufs[4][16], msg[16];
	uint64_t seen[4];
	int it, i, n;

	CHECK(srq);
	r1 = make_qp(IBV_QPT_RC, scq, c1, srq, 4, 0);
	r2 = make_qp(IBV_QPT_RC, scq, c2, srq, 4, 0);
	s1 = make_qp(IBV_QPT_RC, scq, scq, NULL, 4, 0);
	s2 = make_qp(IBV_QPT_RC, scq, scq, NULL, 4, 0);
	pair_up(s1, r1);
	pair_up(s2, r2);
	CHECK(post_recv(r1, 1, bufs[0], 16) == EINVAL);
	for (i = 0; i < 4; i++)
		CHECK(post_srq(srq, 100 + i, bufs[i], 16) == 0);
	CHECK(post_srq(srq, 999, bufs[0], 16) == ENOMEM);
	for (it = 0; it < 40; it++) {
		/* receives 1 and 3 (in SRQ order) go to r2, 0 and 2 to r1 */
		for (i = 0; i < 4; i++) {
			snprintf(msg, sizeof(msg), "m%u.%u", it % 100u, i % 10u);
			CHECK(send1(i & 1 ? s2 : s1, i, IBV_WR_SEND,
				    IBV_SEND_SIGNALED, msg, sizeof(msg)) == 0);
			dev_run();
			CHECK(poll1(scq).wr_id == (uint64_t)i);
		}
		n = 0;
		while (n < 2)
			seen[n++] = poll1(c2).wr_id;
		/* repost the two freed ones before the other CQ is polled */
		for (i = 0; i < 2; i++)
			CHECK(post_srq(srq, seen[i], bufs[seen[i] - 100], 16) == 0);
		CHECK(post_srq(srq, 999, bufs[0], 16) == ENOMEM);
		while (n < 4)
			seen[n++] = poll1(c1).wr_id;
		for (i = 2; i < 4; i++)
			CHECK(post_srq(srq, seen[i], bufs[seen[i] - 100], 16) == 0);
		/* every wr_id came back once, with its own data */
		CHECK(seen[0] != seen[1] && seen[2] != seen[3]);
		CHECK(seen[0] + seen[1] + seen[2] + seen[3] == 406);
		for (i = 0; i < 4; i++)
			CHECK(bufs[seen[i] - 100][0] == 'm');
	}
	expect_empty(c1);
	expect_empty(c2);
	CHECK(hcab_destroy_qp(r1) == 0 && hcab_destroy_qp(r2) == 0);
	CHECK(hcab_destroy_qp(s1) == 0 && hcab_destroy_qp(s2) == 0);
	CHECK(hcab_destroy_srq(srq) == 0);
	CHECK(hcab_destroy_cq(scq) == 0 && hcab_destroy_cq(c1) == 0 &&
	      hcab_destroy_cq(c2) == 0);
}

/*
 * A destroyed QP's CQEs are dropped, even once its QPN is taken again, and
 * its receives from an SRQ give their tags back.
 */
static void test_destroy_drops_cqes(void)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 2, .max_sge = 1 } };
	struct ibv_cq *cq = make_cq(16), *rcq = make_cq(4);
	struct ibv_srq *srq = hcab_create_srq(&pd, &sa);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 0);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, cq, rcq, srq, 4, 0);
	struct ibv_qp *c;
	uint32_t bqpn = b->qp_num;
	char buf[2][8];

	pair_up(a, b);
	CHECK(post_srq(srq, 1, buf[0], 8) == 0);
	CHECK(post_srq(srq, 2, buf[1], 8) == 0);
	CHECK(send1(a, 5, IBV_WR_SEND, IBV_SEND_SIGNALED, "x", 1) == 0);
	CHECK(send1(a, 6, IBV_WR_SEND, IBV_SEND_SIGNALED, "y", 1) == 0);
	CHECK(rdma1(a, 7, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, buf, 0, buf) == 0);
	dev_run();
	/* b's receive CQEs wait in rcq; its QPN goes to c, on the same CQs. */
	CHECK(hcab_destroy_qp(b) == 0);
	CHECK(to_hsrq(srq)->nfree == 2);
	c = make_qp(IBV_QPT_RC, cq, rcq, NULL, 4, 0);
	CHECK(c->qp_num == bqpn);
	CHECK(post_recv(c, 42, buf[0], 8) == 0);
	expect_empty(rcq);
	CHECK(poll1(cq).wr_id == 5);
	CHECK(poll1(cq).wr_id == 6);
	CHECK(poll1(cq).wr_id == 7);
	expect_empty(cq);
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(c) == 0);
	CHECK(hcab_destroy_srq(srq) == 0 && hcab_destroy_cq(cq) == 0 &&
	      hcab_destroy_cq(rcq) == 0);
}

/* ibv_resize_cq keeps the CQEs not yet polled, in order, and goes on. */
static void test_resize_cq(void)
{
	struct ibv_cq *scq = make_cq(16), *rcq = make_cq(4);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, scq, scq, NULL, 16, 0);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, rcq, rcq, NULL, 16, 0);
	char buf[16][8];
	int i;

	pair_up(a, b);
	for (i = 0; i < 3; i++) {
		CHECK(post_recv(b, 100 + i, buf[i], 8) == 0);
		CHECK(send1(a, i, IBV_WR_SEND, 0, "x", 1) == 0);
	}
	dev_run();
	/* Three CQEs wait: a ring of two is too small, and nothing changes. */
	CHECK(hcab_resize_cq(rcq, 2) == EINVAL);
	CHECK(poll1(rcq).wr_id == 100);
	CHECK(hcab_resize_cq(rcq, 16) == 0);
	CHECK(rcq->cqe == 16 && to_hcq(rcq)->log_entries == 4);
	for (i = 3; i < 14; i++) {
		CHECK(post_recv(b, 100 + i, buf[i], 8) == 0);
		CHECK(send1(a, i, IBV_WR_SEND, 0, "x", 1) == 0);
	}
	dev_run();
	for (i = 1; i < 14; i++)
		CHECK(poll1(rcq).wr_id == (uint64_t)100 + i);
	expect_empty(rcq);
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
	CHECK(hcab_destroy_cq(scq) == 0 && hcab_destroy_cq(rcq) == 0);
}

/* RESET drops the QP's CQEs and starts its indices again. */
static void test_reset_restarts_indices(void)
{
	struct ibv_cq *cq = make_cq(8);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 0);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 0);
	struct ibv_qp_attr reset = { .qp_state = IBV_QPS_RESET };
	char buf[8];

	pair_up(a, b);
	CHECK(post_recv(b, 1, buf, 8) == 0);
	CHECK(send1(a, 2, IBV_WR_SEND, IBV_SEND_SIGNALED, "z", 1) == 0);
	CHECK(rdma1(a, 3, IBV_WR_RDMA_WRITE, 0, buf, 8, buf) == 0);
	dev_run();
	CHECK(hcab_modify_qp(a, &reset, IBV_QP_STATE) == 0);
	CHECK(to_hqp(a)->sq.pi == 0);
	CHECK(poll1(cq).wr_id == 1);	/* b's receive stays */
	expect_empty(cq);
	/* Nothing posts in RESET; once connected again, from index 0. */
	CHECK(rdma1(a, 4, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, buf, 8, buf) ==
	      EINVAL);
	reset.qp_state = IBV_QPS_RTS;
	CHECK(hcab_modify_qp(a, &reset, IBV_QP_STATE) == 0);
	CHECK(rdma1(a, 4, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, buf, 8, buf) == 0);
	CHECK(dqps[a->qp_num].rec->sq_pi == 1);
	dev_run();
	CHECK(poll1(cq).wr_id == 4);
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);

	/* A receive taken from an SRQ still completes: the SRQ lives on. */
	{
		struct ibv_srq_init_attr sa = {
			.attr = { .max_wr = 2, .max_sge = 1 } };
		struct ibv_srq *srq = hcab_create_srq(&pd, &sa);

		CHECK(srq);
		a = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 0);
		b = make_qp(IBV_QPT_RC, cq, cq, srq, 4, 0);
		pair_up(a, b);
		CHECK(post_srq(srq, 31, buf, 8) == 0);
		CHECK(send1(a, 5, IBV_WR_SEND, 0, "s", 1) == 0);
		dev_run();
		CHECK(hcab_modify_qp(b, &reset, IBV_QP_STATE) == 0);
		CHECK(poll1(cq).wr_id == 31);
		CHECK(to_hsrq(srq)->nfree == 2);
		CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
		CHECK(hcab_destroy_srq(srq) == 0);
	}
	CHECK(hcab_destroy_cq(cq) == 0);
}

static void test_ud_through_ah(void)
{
	struct ibv_cq *cq = make_cq(8);
	struct ibv_qp *a = make_qp(IBV_QPT_UD, cq, cq, NULL, 4, 64);
	struct ibv_qp *b = make_qp(IBV_QPT_UD, cq, cq, NULL, 4, 0);
	struct ibv_ah_attr aa = { .dlid = SLID, .port_num = 1 };
	struct ibv_ah *ah = hcab_create_ah(&pd, &aa);
	char buf[64 + HCA_UD_GRH_BYTES];
	struct ibv_sge sge = { (uintptr_t)"datagram", 9, 1 };
	struct ibv_send_wr wr = { .wr_id = 8, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED |
						IBV_SEND_INLINE }, *bad;
	struct ibv_wc wc;

	CHECK(ah);
	aa.dlid = 0;
	CHECK(!hcab_create_ah(&pd, &aa));
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = b->qp_num;
	wr.wr.ud.remote_qkey = QKEY;
	CHECK(post_recv(b, 9, buf, sizeof(buf)) == 0);
	CHECK(hcab_post_send(a, &wr, &bad) == 0);
	dev_run();
	/* the simulated device completes the receive first */
	wc = poll1(cq);
	CHECK(wc.wr_id == 9 && wc.src_qp == a->qp_num && !strcmp(buf, "datagram"));
	CHECK(poll1(cq).wr_id == 8);
	/* A datagram QP neither writes nor reads. */
	wr.opcode = IBV_WR_RDMA_WRITE;
	CHECK(hcab_post_send(a, &wr, &bad) == EINVAL);
	wr.opcode = IBV_WR_SEND;
	wr.wr.ud.ah = NULL;
	CHECK(hcab_post_send(a, &wr, &bad) == EINVAL);
	CHECK(hcab_destroy_ah(ah) == 0);
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
	CHECK(hcab_destroy_cq(cq) == 0);
}

/* Each arm writes a new word, (sn << 1) | solicited, and rings DB_CQ_ARM. */
static void test_arm_word(void)
{
	struct ibv_cq *cq = make_cq(2);
	struct hca_cq_db *rec = dcqs[to_hcq(cq)->cqn].rec;

	CHECK(hcab_req_notify_cq(cq, 0) == 0);
	CHECK(rec->arm == 2);
	CHECK(doorbell == (PEER << HCA_DOORBELL_PEER_SHIFT | HCA_DB_CQ_ARM));
	CHECK(hcab_req_notify_cq(cq, 1) == 0);
	CHECK(rec->arm == 5);
	CHECK(hcab_destroy_cq(cq) == 0);
}

/* The extended send API's batches, polled through an extended CQ. */
static void test_extended_qp_and_cq(void)
{
	struct ibv_cq_init_attr_ex ca = {
		.cqe = 8,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
	};
	struct ibv_context *ibctx = &ctx->ibv_ctx.context;
	struct ibv_cq_ex *cqx = hcab_create_cq_ex(ibctx, &ca);
	struct ibv_poll_cq_attr pa = {};
	struct ibv_qp_init_attr_ex qa;
	char out[16] = "extended-send!", in[16] = { 0 }, remote[8] = { 0 };
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *x;
	struct ibv_cq *cq;
	uint32_t pi;
	int n;

	CHECK(cqx);
	cq = ibv_cq_ex_to_cq(cqx);
	CHECK(cqx->read_byte_len && cqx->read_qp_num && !cqx->read_slid);
	/* A CQE carries no timestamp. */
	ca.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	CHECK(!hcab_create_cq_ex(ibctx, &ca) && errno == EOPNOTSUPP);

	qa = (struct ibv_qp_init_attr_ex){
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 16 },
		.comp_mask = IBV_QP_INIT_ATTR_PD |
			     IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = &pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND |
				  IBV_QP_EX_WITH_RDMA_WRITE,
	};
	a = hcab_create_qp_ex(ibctx, &qa);
	CHECK(a);
	CHECK(to_hqp(a)->vqp.comp_mask & VERBS_QP_EX);
	x = &to_hqp(a)->vqp.qp_ex;
	b = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 0);
	pair_up(a, b);

	/* Not before RTS, and an opcode the QP was not made with: nothing. */
	pi = to_hqp(a)->sq.pi;
	x->wr_start(x);
	x->wr_id = 1;
	x->wr_send(x);
	x->wr_set_sge(x, 1, (uintptr_t)out, 14);
	CHECK(x->wr_complete(x) == EINVAL);
	a->state = IBV_QPS_RTS;
	x->wr_start(x);
	x->wr_send(x);
	x->wr_set_sge(x, 1, (uintptr_t)out, 14);
	x->wr_rdma_read(x, 1, (uintptr_t)remote);
	CHECK(x->wr_complete(x) == EINVAL);
	CHECK(to_hqp(a)->sq.pi == pi && dqps[a->qp_num].rec->sq_pi == pi);

	/* A SEND from an SGE and an inline RDMA WRITE, one batch. */
	CHECK(post_recv(b, 7, in, 16) == 0);
	x->wr_start(x);
	x->wr_id = 2;
	x->wr_flags = IBV_SEND_SIGNALED;
	x->wr_send(x);
	x->wr_set_sge(x, 1, (uintptr_t)out, 14);
	x->wr_id = 3;
	x->wr_rdma_write(x, 1, (uintptr_t)remote);
	x->wr_set_inline_data(x, "inline!", 8);
	CHECK(x->wr_complete(x) == 0);
	CHECK(dqps[a->qp_num].rec->sq_pi == pi + 2);
	dev_run();
	CHECK(!memcmp(in, out, 14) && !strcmp(remote, "inline!"));

	/* The receive and both sends, one at a time. */
	CHECK(cqx->start_poll(cqx, &pa) == 0);
	n = 0;
	do {
		CHECK(cqx->status == IBV_WC_SUCCESS);
		if (cqx->wr_id == 7) {
			CHECK(cqx->read_opcode(cqx) == IBV_WC_RECV);
			CHECK(cqx->read_byte_len(cqx) == 14);
			CHECK(cqx->read_qp_num(cqx) == b->qp_num);
		} else {
			CHECK(cqx->wr_id == 2 || cqx->wr_id == 3);
		}
		n++;
	} while (cqx->next_poll(cqx) == 0);
	cqx->end_poll(cqx);
	CHECK(n == 3);
	CHECK(cqx->start_poll(cqx, &pa) == ENOENT);
	CHECK(hcab_destroy_qp(a) == 0 && hcab_destroy_qp(b) == 0);
	CHECK(hcab_destroy_cq(cq) == 0);
}

int main(void)
{
	ctx = calloc(1, sizeof(*ctx));
	CHECK(ctx);
	ctx->page_size = 4096;
	ctx->uar = aligned_alloc(4096, 4096);
	CHECK(ctx->uar);
	memset(ctx->uar, 0, 4096);
	ctx->db_reg = &doorbell;
	ctx->doorbell_peer = PEER;
	hcab_sq_ring_init(ctx, HCA_CAP_SQ_RING);
	CHECK(ctx->sq_ring);
	pthread_mutex_init(&ctx->qp_table_mutex, NULL);
	pd.context = &ctx->ibv_ctx.context;

	test_rc_send_recv_wraps();
	test_full_send_queue();
	test_rdma_and_atomics();
	test_srq_out_of_order();
	test_destroy_drops_cqes();
	test_reset_restarts_indices();
	test_ud_through_ah();
	test_arm_word();
	test_extended_qp_and_cq();
	test_resize_cq();
	fprintf(stderr, "sim: all data-path checks passed\n");
	return 0;
}
