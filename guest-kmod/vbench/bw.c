// SPDX-License-Identifier: GPL-2.0
/*
 * RDMA Write and Read bandwidth against the peer's region, polled, with
 * up to VB_WINDOW operations in flight, then a check that the bytes
 * arrived: writes are read back, reads are compared with pat(i), which
 * the peer's read region holds. And the bad-rkey probe, and a fast-
 * registration check (ib_alloc_mr + ib_map_mr_sg + IB_WR_REG_MR).
 */
#include <linux/slab.h>
#include <linux/scatterlist.h>
#include "vbench.h"

#define VB_WINDOW	16
#define VB_CHECK_BYTES	(64 * 1024)

static int vb_post_rdma(bool read, u64 local, u64 remote, u32 size, u32 rkey)
{
	struct ib_sge sge = {
		.addr = local,
		.length = size,
		.lkey = vb->pd->local_dma_lkey,
	};
	struct ib_rdma_wr wr = {
		.wr = {
			.wr_id = U64_MAX,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = read ? IB_WR_RDMA_READ : IB_WR_RDMA_WRITE,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = remote,
		.rkey = rkey,
	};

	return ib_post_send(vb->qp, &wr.wr, NULL);
}

/* Waits for one RDMA completion; receives (none expected) are reposted. */
static int vb_wait_rdma(struct ib_wc *wc)
{
	unsigned long deadline = jiffies + 30 * HZ;
	int n;

	for (;;) {
		n = ib_poll_cq(vb->cq, 1, wc);
		if (n < 0)
			return n;
		if (n && (wc->opcode & IB_WC_RECV) && wc->status == IB_WC_SUCCESS) {
			vb_post_recv(wc->wr_id);
			continue;
		}
		/* Signaled ping-pong sends from earlier runs are old news. */
		if (n && wc->opcode == IB_WC_SEND && wc->status == IB_WC_SUCCESS)
			continue;
		if (n)
			return wc->status == IB_WC_SUCCESS ? 0 : -EIO;
		if (time_after(jiffies, deadline))
			return -ETIMEDOUT;
		cond_resched();
	}
}

/* One RDMA Read of `len` bytes from the peer's read region into (iova, lkey). */
static int vb_rdma_burst_key(u64 iova, u32 lkey, u32 len)
{
	struct ib_sge sge = { .addr = iova, .length = len, .lkey = lkey };
	struct ib_rdma_wr wr = {
		.wr = {
			.wr_id = U64_MAX,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IB_WR_RDMA_READ,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = vb->peer.raddr,
		.rkey = vb->peer.rkey,
	};
	struct ib_wc wc;
	int err = ib_post_send(vb->qp, &wr.wr, NULL);

	return err ?: vb_wait_rdma(&wc);
}

/* Runs `iters` operations of `size`, at most VB_WINDOW in flight. */
static int vb_rdma_burst(bool read, u32 size, u32 iters, u64 remote_base,
			 u32 span)
{
	u32 posted = 0, completed = 0, per = max(span / size, 1u);
	struct ib_wc wc;
	int err;

	while (completed < iters) {
		while (posted < iters && posted - completed < VB_WINDOW) {
			u64 off = (u64)(posted % per) * size;

			err = vb_post_rdma(read, vb->local_dma + off,
					   remote_base + off, size, vb->peer.rkey);
			if (err)
				return err;
			posted++;
		}
		err = vb_wait_rdma(&wc);
		if (err)
			return err;
		completed++;
	}
	return 0;
}

/* Writes a nonce-marked pattern over the write region's head and reads it back. */
static int vb_check_write(u32 size, u32 nonce)
{
	u32 len = min_t(u32, VB_CHECK_BYTES, VB_REGION), i;
	u64 wregion = vb->peer.raddr + VB_REGION;
	int err;

	for (i = 0; i < len; i++)
		vb->local[i] = vb_pattern[i % VB_MAX_MSG] ^ (u8)nonce;
	err = vb_rdma_burst(false, min(size, len), max(len / size, 1u), wregion, len);
	if (err)
		return err;
	memset(vb->local, 0, len);
	err = vb_rdma_burst(true, len, 1, wregion, len);
	if (err)
		return err;
	for (i = 0; i < len; i++)
		if (vb->local[i] != (vb_pattern[i % VB_MAX_MSG] ^ (u8)nonce))
			return 1;
	return 0;
}

static int vb_check_read(u32 size)
{
	u32 len = min_t(u32, VB_CHECK_BYTES, VB_REGION), i;
	int err;

	memset(vb->local, 0, len);
	err = vb_rdma_burst(true, min(size, len), max(len / size, 1u),
			    vb->peer.raddr, len);
	if (err)
		return err;
	for (i = 0; i < len; i++)
		if (vb->local[i] != vb_pattern[i % VB_MAX_MSG])
			return 1;
	return 0;
}

int vb_bw(bool read, u32 size, u32 iters, char *out, size_t len)
{
	u64 remote = vb->peer.raddr + (read ? 0 : VB_REGION);
	ktime_t t0;
	u64 ns, mbps;
	int err, bad;

	if (!vb->qp)
		return -ENOTCONN;
	if (!size || size > VB_REGION || !iters)
		return -EINVAL;
	vb_stop();
	t0 = ktime_get();
	err = vb_rdma_burst(read, size, iters, remote, VB_REGION);
	ns = ktime_to_ns(ktime_sub(ktime_get(), t0));
	if (err)
		return err;
	bad = read ? vb_check_read(size) : vb_check_write(size, iters);
	if (bad < 0)
		return bad;
	mbps = div64_u64((u64)size * iters * 1000, max(ns, 1ull));
	return scnprintf(out, len, "op=%s size=%u iters=%u ns=%llu mb_per_s=%llu errors=%d\n",
			 read ? "read" : "write", size, iters, ns, mbps, bad);
}

/* An RDMA Write with a key the peer never issued: IB says REM_ACCESS_ERR. */
int vb_badrkey(char *out, size_t len)
{
	struct ib_qp_init_attr init;
	struct ib_qp_attr attr;
	struct ib_wc wc;
	int err;

	if (!vb->qp)
		return -ENOTCONN;
	vb_stop();
	err = vb_post_rdma(false, vb->local_dma, vb->peer.raddr + VB_REGION, 64,
			   vb->peer.rkey ^ 0x5a5a00);
	if (err)
		return err;
	err = vb_wait_rdma(&wc);
	if (err != -EIO)
		return err ? err : -EPROTO;
	err = ib_query_qp(vb->qp, &attr, IB_QP_STATE, &init);
	if (err)
		return err;
	return scnprintf(out, len, "status=%s qp_state=%s\n",
			 wc.status == IB_WC_REM_ACCESS_ERR ? "REM_ACCESS_ERR" :
			 ib_wc_status_msg(wc.status),
			 attr.qp_state == IB_QPS_ERR ? "ERR" : "not-ERR");
}

#define VB_FR_PAGES	4

static int vb_reg_mr_wr(struct ib_mr *mr)
{
	struct ib_reg_wr wr = {
		.wr = {
			.wr_id = U64_MAX,
			.opcode = IB_WR_REG_MR,
			.send_flags = IB_SEND_SIGNALED,
		},
		.mr = mr,
		.key = mr->rkey,
		.access = IB_ACCESS_LOCAL_WRITE,
	};
	struct ib_wc wc;
	int err;

	err = ib_post_send(vb->qp, &wr.wr, NULL);
	if (err)
		return err;
	err = vb_wait_rdma(&wc);
	if (!err && wc.opcode != IB_WC_REG_MR)
		err = -EPROTO;
	return err;
}

/* RDMA-reads the peer's read region into separate pages through a fast-registered MR. */
static int vb_fastreg_read(struct ib_mr *mr, struct page **pages, int *bad)
{
	u32 i, j;
	u8 *p;
	int err;

	err = vb_reg_mr_wr(mr);
	if (err)
		return err;
	err = vb_rdma_burst_key(mr->iova, mr->lkey, VB_FR_PAGES * PAGE_SIZE);
	if (err)
		return err;
	for (i = 0; i < VB_FR_PAGES; i++) {
		p = page_address(pages[i]);
		for (j = 0; j < PAGE_SIZE; j++)
			if (p[j] != vb_pattern[(i * PAGE_SIZE + j) % VB_MAX_MSG])
				(*bad)++;
	}
	return 0;
}

int vb_fastreg(char *out, size_t len)
{
	struct scatterlist sg[VB_FR_PAGES];
	struct page *pages[VB_FR_PAGES] = {};
	struct ib_mr *mr = NULL;
	int i, n = 0, bad = 0, err = -ENOMEM;

	if (!vb->qp)
		return -ENOTCONN;
	vb_stop();
	sg_init_table(sg, VB_FR_PAGES);
	for (i = 0; i < VB_FR_PAGES; i++) {
		pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!pages[i])
			goto out;
		sg_set_page(&sg[i], pages[i], PAGE_SIZE, 0);
	}
	n = ib_dma_map_sg(vb->dev, sg, VB_FR_PAGES, DMA_BIDIRECTIONAL);
	if (n <= 0)
		goto out;
	mr = ib_alloc_mr(vb->pd, IB_MR_TYPE_MEM_REG, VB_FR_PAGES);
	if (IS_ERR(mr)) {
		err = PTR_ERR(mr);
		mr = NULL;
		goto out;
	}
	/* A fresh key for this registration, as consumers do before each REG_MR. */
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey) & 0xff);
	err = ib_map_mr_sg(mr, sg, n, NULL, PAGE_SIZE);
	if (err != n) {
		err = err < 0 ? err : -EINVAL;
		goto out;
	}
	err = vb_fastreg_read(mr, pages, &bad);
out:
	if (mr)
		ib_dereg_mr(mr);
	if (n > 0)
		ib_dma_unmap_sg(vb->dev, sg, VB_FR_PAGES, DMA_BIDIRECTIONAL);
	for (i = 0; i < VB_FR_PAGES; i++)
		if (pages[i])
			__free_page(pages[i]);
	if (err)
		return err;
	return scnprintf(out, len, "fastreg pages=%d bytes=%lu errors=%d\n",
			 VB_FR_PAGES, VB_FR_PAGES * PAGE_SIZE, bad);
}
