// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * Shared receive queues. The kernel allocates the ring and arms or reads
 * the limit (ibv_cmd_*); posting and retiring run here, as in hca_ib's
 * srq.c, whose comment says why a WQE's wr_id carries its ring index and a
 * tag: completions of an SRQ come back in any order, and the tag (one of
 * max_wr) names the consumer's wr_id until its completion is polled, while
 * the index of any polled completion tells how far the device has taken.
 * Posting rings no doorbell: the device reads the producer index when a
 * message needs a receive.
 *
 * Locking: srq->wq.lock guards pi, ci and the tags; poll_cq takes it (in
 * hcab_srq_retire) under a CQ's lock.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "hcab.h"
#include "hcab-abi.h"

/* hcab_wq_map checks an SRQ's size against the QP's limit. */
_Static_assert(HCA_MAX_SRQ_LOG_WR == HCA_MAX_QP_LOG_WR, "SRQ ring limit");

struct ibv_srq *hcab_create_srq(struct ibv_pd *pd,
				struct ibv_srq_init_attr *init)
{
	struct hcab_context *ctx = to_hctx(pd->context);
	struct hcab_create_srq_resp resp = {};
	struct ibv_create_srq cmd = {};
	struct hcab_srq *srq;
	uint32_t entries;
	int err;

	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return NULL;
	err = ibv_cmd_create_srq(pd, &srq->vsrq.srq, init, &cmd, sizeof(cmd),
				 &resp.ibv_resp, sizeof(resp));
	if (err)
		goto err_free;
	srq->srqn = resp.drv.srqn;
	err = EINVAL;
	if (resp.drv.db_slot >= HCA_UAR_SRQ_SLOTS)
		goto err_destroy;
	srq->db = (char *)ctx->uar + HCA_UAR_SRQ_OFFSET +
		  resp.drv.db_slot * sizeof(struct hca_srq_db);
	/* A QP's receive queue and an SRQ share a WQE format. */
	err = hcab_wq_map(ctx, &srq->wq, resp.drv.ring_mmap_offset,
			  resp.drv.log_entries, resp.drv.wqe_shift,
			  sizeof(struct hca_recv_wqe), HCA_MIN_RQ_WQE_SHIFT,
			  HCA_MAX_RQ_WQE_SHIFT);
	if (err)
		goto err_destroy;
	/* As many tags as slots: wq.wrid is indexed by tag. */
	entries = 1u << srq->wq.log_entries;
	srq->busy = calloc(entries, sizeof(*srq->busy));
	srq->free_tags = calloc(entries, sizeof(*srq->free_tags));
	err = ENOMEM;
	if (!srq->busy || !srq->free_tags)
		goto err_wq;
	for (srq->nfree = 0; srq->nfree < entries; srq->nfree++)
		srq->free_tags[srq->nfree] = entries - 1 - srq->nfree;
	return &srq->vsrq.srq;

err_wq:
	free(srq->free_tags);
	free(srq->busy);
	hcab_wq_unmap(&srq->wq);
err_destroy:
	ibv_cmd_destroy_srq(&srq->vsrq.srq);
err_free:
	free(srq);
	errno = err;
	return NULL;
}

int hcab_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct ibv_modify_srq cmd = {};

	return ibv_cmd_modify_srq(ibsrq, attr, mask, &cmd, sizeof(cmd));
}

int hcab_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd = {};

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

int hcab_destroy_srq(struct ibv_srq *ibsrq)
{
	struct hcab_srq *srq = to_hsrq(ibsrq);
	int ret;

	ret = ibv_cmd_destroy_srq(ibsrq);
	if (ret)
		return ret;
	free(srq->free_tags);
	free(srq->busy);
	hcab_wq_unmap(&srq->wq);
	free(srq);
	return 0;
}

int hcab_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad_wr)
{
	struct hcab_srq *srq = to_hsrq(ibsrq);
	struct hcab_wq *wq = &srq->wq;
	uint32_t mask = hcab_wq_mask(wq), start, tag, ci;
	int err = 0;

	pthread_spin_lock(&wq->lock);
	start = wq->pi;
	for (; wr; wr = wr->next) {
		/* Cannot fail while a tag is free; checked all the same. */
		ci = atomic_load_explicit(&wq->ci, memory_order_relaxed);
		if (!srq->nfree || wq->pi - ci > mask) {
			err = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > wq->max_sge) {
			err = EINVAL;
			break;
		}
		tag = srq->free_tags[--srq->nfree];
		srq->busy[tag] = 1;
		wq->wrid[tag] = wr->wr_id;
		hcab_write_recv_wqe(wq, wq->pi, (uint64_t)wq->pi << 32 | tag, wr);
		wq->pi++;
	}
	if (err)
		*bad_wr = wr;
	if (wq->pi != start) {
		udma_to_device_barrier();
		mmio_write32((char *)srq->db + offsetof(struct hca_srq_db, pi),
			     wq->pi);
	}
	pthread_spin_unlock(&wq->lock);
	return err;
}

/*
 * The completion of the SRQ WQE whose wr_id field was hw (ring index and
 * tag) was polled, or dropped with its QP: returns the consumer's wr_id;
 * the tag is free again, and the device has taken every slot up to that
 * index. Caller holds a CQ's lock.
 */
uint64_t hcab_srq_retire(struct hcab_srq *srq, uint64_t hw)
{
	struct hcab_wq *wq = &srq->wq;
	uint32_t entries = 1u << wq->log_entries, tag = (uint32_t)hw;
	uint32_t idx = hw >> 32, ci;
	uint64_t wr_id = 0;

	pthread_spin_lock(&wq->lock);
	/* Both halves come from the ring: only a tag in use, a slot posted. */
	if (tag < entries && srq->busy[tag]) {
		wr_id = wq->wrid[tag];
		srq->busy[tag] = 0;
		srq->free_tags[srq->nfree++] = tag;
	}
	ci = atomic_load_explicit(&wq->ci, memory_order_relaxed);
	if (idx - ci < wq->pi - ci)
		atomic_store_explicit(&wq->ci, idx + 1, memory_order_relaxed);
	pthread_spin_unlock(&wq->lock);
	return wr_id;
}
