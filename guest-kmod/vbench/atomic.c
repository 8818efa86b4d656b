// SPDX-License-Identifier: GPL-2.0
/*
 * Atomics loopback: two RC QPs of the open device connected to each other
 * through the fabric, an 8-byte target in a fast-registered MR that allows
 * remote atomics, and IB's four atomics against it (compare-and-swap,
 * fetch-and-add, and their masked forms when the device has them). Each
 * returns the target's old value into a local buffer and leaves the value
 * IBA prescribes; both are checked. Last, an atomic through a key without
 * remote-atomic access must end in a remote access error. Caller holds
 * the control lock (vb_ctl.lock). IB link layer only: a RoCE loopback
 * would need our own MAC resolved for the QPs' address vector.
 */
#include <linux/scatterlist.h>
#include <linux/random.h>
#include "vbench.h"
#include "dmabuf.h"

/* The target, then the old value each atomic returns. */
#define VB_AT_TARGET	0
#define VB_AT_RESULT	8
#define VB_AT_BYTES	PAGE_SIZE

struct vb_at {
	struct ib_cq *cq;
	struct ib_qp *qp[2];	/* requester, responder */
	struct ib_mr *mr;	/* the target's MR, remote atomics allowed */
	u64 *buf;
	u64 dma;
	u64 remote;		/* the target's address through mr */
	u32 psn[2];
	enum ib_wc_status status;	/* the last atomic's */
	int errors;
};

/* Posts one signaled WR on QP i and waits for its completion. */
static int vb_at_post(struct vb_at *a, int i, const struct ib_send_wr *wr,
		      struct ib_wc *wc)
{
	int err = ib_post_send(a->qp[i], wr, NULL);

	return err ?: vb_poll_one(a->cq, wc, 10 * HZ);
}

static int vb_at_setup(struct vb_at *a)
{
	struct ib_cq_init_attr ca = { .cqe = 16 };
	struct ib_qp_init_attr qa = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 1,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_type = IB_SIGNAL_ALL_WR,
		.qp_type = IB_QPT_RC,
	};
	/* To our own port. */
	struct rcconn_path p = vb_rc_path(vb->lid, &vb->sgid);
	int i, err;

	a->cq = ib_create_cq(vb->dev, NULL, NULL, NULL, &ca);
	if (IS_ERR(a->cq))
		return PTR_ERR(a->cq);
	qa.send_cq = a->cq;
	qa.recv_cq = a->cq;
	for (i = 0; i < 2; i++) {
		a->qp[i] = ib_create_qp(vb->pd, &qa);
		if (IS_ERR(a->qp[i]))
			return PTR_ERR(a->qp[i]);
		a->psn[i] = get_random_u32() & 0xffffff;
	}
	p.atomics = true;
	for (i = 0; i < 2; i++) {
		p.dest_qpn = a->qp[!i]->qp_num;
		p.rq_psn = a->psn[!i];
		p.sq_psn = a->psn[i];
		err = rcconn_to_rts(a->qp[i], &p);
		if (err)
			return err;
	}
	a->mr = ib_alloc_mr(vb->pd, IB_MR_TYPE_MEM_REG, 1);
	return PTR_ERR_OR_ZERO(a->mr);
}

/* Maps the buffer's page into the MR and registers it on the responder's QP. */
static int vb_at_register(struct vb_at *a)
{
	struct ib_reg_wr wr = {
		.wr = { .opcode = IB_WR_REG_MR, .send_flags = IB_SEND_SIGNALED },
		.mr = a->mr,
		.access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_ATOMIC,
	};
	struct scatterlist sg;
	struct ib_wc wc;
	int err;

	sg_init_table(&sg, 1);
	sg_dma_address(&sg) = a->dma;
	sg_dma_len(&sg) = VB_AT_BYTES;
	ib_update_fast_reg_key(a->mr, ib_inc_rkey(a->mr->rkey) & 0xff);
	err = ib_map_mr_sg(a->mr, &sg, 1, NULL, PAGE_SIZE);
	if (err != 1)
		return err < 0 ? err : -EINVAL;
	wr.key = a->mr->rkey;
	err = vb_at_post(a, 1, &wr.wr, &wc);
	if (!err && (wc.status != IB_WC_SUCCESS || wc.opcode != IB_WC_REG_MR))
		err = -EIO;
	a->remote = a->mr->iova + VB_AT_TARGET;
	return err;
}

static void vb_at_teardown(struct vb_at *a)
{
	int i;

	if (!IS_ERR_OR_NULL(a->mr))
		ib_dereg_mr(a->mr);
	for (i = 0; i < 2; i++)
		if (!IS_ERR_OR_NULL(a->qp[i]))
			ib_destroy_qp(a->qp[i]);
	if (!IS_ERR_OR_NULL(a->cq))
		ib_destroy_cq(a->cq);
}

/*
 * One atomic from QP 0 through rkey against a target holding `before`:
 * its completion status in a->status (an error unless it succeeds), and
 * whether the returned old value is `before` and the target now holds
 * `after`.
 */
static int vb_at_one(struct vb_at *a, const char *name, struct ib_atomic_wr *wr,
		     u32 rkey, u64 before, u64 after)
{
	struct ib_sge sge = {
		.addr = a->dma + VB_AT_RESULT,
		.length = 8,
		.lkey = vb->pd->local_dma_lkey,
	};
	u64 *target = a->buf + VB_AT_TARGET / 8, *old = a->buf + VB_AT_RESULT / 8;
	struct ib_wc wc;
	int err;

	WRITE_ONCE(*target, before);
	WRITE_ONCE(*old, ~before);
	ib_dma_sync_single_for_device(vb->dev, a->dma, VB_AT_BYTES, DMA_BIDIRECTIONAL);
	wr->wr.sg_list = &sge;
	wr->wr.num_sge = 1;
	wr->wr.send_flags = IB_SEND_SIGNALED;
	wr->remote_addr = a->remote;
	wr->rkey = rkey;
	err = vb_at_post(a, 0, &wr->wr, &wc);
	if (err)
		return err;
	ib_dma_sync_single_for_cpu(vb->dev, a->dma, VB_AT_BYTES, DMA_BIDIRECTIONAL);
	a->status = wc.status;
	if (wc.status != IB_WC_SUCCESS) {
		pr_err("vbench: %s: %s\n", name, ib_wc_status_msg(wc.status));
		a->errors++;
	} else if (READ_ONCE(*old) != before || READ_ONCE(*target) != after) {
		pr_err("vbench: %s: old %#llx target %#llx, expected %#llx and %#llx\n",
		       name, READ_ONCE(*old), READ_ONCE(*target), before, after);
		a->errors++;
	}
	return 0;
}

/* The atomics IBA defines, each with an outcome that a wrong one would miss. */
static int vb_at_run(struct vb_at *a, bool masked, int *ops)
{
	const u64 t = 0x1111222233334444ULL;
	struct ib_atomic_wr wr;
	int err;

	/* Compare matches: swapped. */
	wr = (struct ib_atomic_wr){ .wr.opcode = IB_WR_ATOMIC_CMP_AND_SWP,
				    .compare_add = t, .swap = 0xaaaabbbbccccddddULL };
	err = vb_at_one(a, "cmp_swap", &wr, a->mr->rkey, t, 0xaaaabbbbccccddddULL);
	/* Compare differs: left alone, the old value still returned. */
	wr = (struct ib_atomic_wr){ .wr.opcode = IB_WR_ATOMIC_CMP_AND_SWP,
				    .compare_add = t + 1, .swap = 0 };
	err = err ?: vb_at_one(a, "cmp_swap miss", &wr, a->mr->rkey, t, t);
	/* The carry crosses every 32-bit boundary. */
	wr = (struct ib_atomic_wr){ .wr.opcode = IB_WR_ATOMIC_FETCH_AND_ADD,
				    .compare_add = 1 };
	err = err ?: vb_at_one(a, "fetch_add", &wr, a->mr->rkey, 0x00000000ffffffffULL,
			       0x0000000100000000ULL);
	*ops = 3;
	if (err || !masked)
		return err;
	/* Only the masked bits compared (the low half differs) and swapped (the high half). */
	wr = (struct ib_atomic_wr){ .wr.opcode = IB_WR_MASKED_ATOMIC_CMP_AND_SWP,
				    .compare_add = 0x1111222200000000ULL,
				    .compare_add_mask = 0xffffffff00000000ULL,
				    .swap = 0x9999888877776666ULL,
				    .swap_mask = 0xffff000000000000ULL };
	err = vb_at_one(a, "masked cmp_swap", &wr, a->mr->rkey, t, 0x9999222233334444ULL);
	/* Two 32-bit fields (boundary bits 31 and 63): the low carry is dropped. */
	wr = (struct ib_atomic_wr){ .wr.opcode = IB_WR_MASKED_ATOMIC_FETCH_AND_ADD,
				    .compare_add = 0x0000000100000001ULL,
				    .compare_add_mask = 0x8000000080000000ULL };
	err = err ?: vb_at_one(a, "masked fetch_add", &wr, a->mr->rkey,
			       0x00000000ffffffffULL, 0x0000000100000000ULL);
	*ops = 5;
	return err;
}

int vb_atomic(char *out, size_t len)
{
	bool masked = vb->dev && vb->dev->attrs.masked_atomic_cap != IB_ATOMIC_NONE;
	struct ib_atomic_wr wr = { .wr.opcode = IB_WR_ATOMIC_FETCH_AND_ADD, .compare_add = 1 };
	struct vb_at a = {};
	int err, ops = 0, errors;

	if (!vb->pd)
		return -ENOTCONN;
	if (vb->roce || vb->dev->attrs.atomic_cap == IB_ATOMIC_NONE)
		return -EOPNOTSUPP;
	a.buf = dmabuf_alloc(vb->dev, VB_AT_BYTES, &a.dma, DMA_BIDIRECTIONAL);
	if (!a.buf)
		return -ENOMEM;
	err = vb_at_setup(&a) ?: vb_at_register(&a) ?: vb_at_run(&a, masked, &ops);
	/*
	 * The PD's global rkey reaches the same bytes at their DMA address and
	 * grants remote read and write, not atomics: this one must fail.
	 */
	errors = a.errors;
	a.remote = a.dma + VB_AT_TARGET;
	if (!err)
		err = vb_at_one(&a, "without atomic access", &wr,
				vb->pd->unsafe_global_rkey, 0, 1);
	if (!err)
		err = scnprintf(out, len, "atomic ops=%d masked=%s errors=%d refused=%s\n",
				ops, masked ? "yes" : "unsupported", errors,
				a.status == IB_WC_REM_ACCESS_ERR ? "REM_ACCESS_ERR" :
				ib_wc_status_msg(a.status));
	vb_at_teardown(&a);
	dmabuf_free(vb->dev, a.buf, a.dma, VB_AT_BYTES, DMA_BIDIRECTIONAL);
	return err;
}
