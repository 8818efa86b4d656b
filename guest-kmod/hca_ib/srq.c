// SPDX-License-Identifier: GPL-2.0
/*
 * Shared receive queues: one ring of receive WQEs that any number of QPs
 * take from (IPoIB connected mode and storage targets use one per device
 * instead of a ring per connection).
 *
 * The device takes WQEs in ring order, but their completions reach
 * whichever CQ the taking QP reports to, so they are polled in any order,
 * and a consumer may hold one receive's completion back while it reposts
 * the others many times (nvmet-rdma does). So a WQE's wr_id carries its
 * ring index and a tag: the tag names the consumer's wr_id until the
 * completion is polled (max_wr tags, IB's bound on outstanding receives);
 * the ring index of any polled completion tells how far the device has
 * taken (ci). Slots the device took whose completions are not yet polled
 * each hold a tag, so with a ring of max_wr slots, a free tag always finds
 * a free slot: no receive waits for another's completion.
 * Posting writes the WQE and the producer index; no doorbell is needed,
 * the device reads the index when a message needs a receive.
 *
 * Locking: srq->lock (irqsave: consumers post from completion handlers)
 * guards pi, ci and the tags. poll_cq takes it inside cq->lock; nothing
 * takes a CQ lock or table_lock while holding it.
 */
#include "hca_ib.h"

static void __iomem *hca_srq_db(struct hca_dev *dev, u32 srqn)
{
	return dev->bar2 + HCA_BAR2_SRQ_DB_OFFSET + srqn * sizeof(struct hca_srq_db);
}

struct hca_srq *hca_srq_lookup(struct hca_dev *dev, u32 srqn)
{
	return srqn < HCA_MAX_SRQ ? READ_ONCE(dev->srqs[srqn]) : NULL;
}

static void hca_srq_set_table(struct hca_dev *dev, u32 srqn, struct hca_srq *srq)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->table_lock, flags);
	WRITE_ONCE(dev->srqs[srqn], srq);
	spin_unlock_irqrestore(&dev->table_lock, flags);
}

/*
 * The device may already have given the SRQN to a new SRQ, which may
 * already be published: only our own entry goes.
 */
static void hca_srq_unpublish(struct hca_dev *dev, struct hca_srq *srq)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->table_lock, flags);
	if (dev->srqs[srq->srqn] == srq)
		WRITE_ONCE(dev->srqs[srq->srqn], NULL);
	spin_unlock_irqrestore(&dev->table_lock, flags);
}

/* A process's SRQ ring and record slot (uverbs.c); its provider tags. */
static int hca_srq_alloc_user(struct hca_dev *dev, struct hca_srq *srq,
			      struct ib_udata *udata,
			      struct hca_ucreate_srq_resp *resp, u32 *db_offset)
{
	int err;

	srq->uc = rdma_udata_to_drv_context(udata, struct hca_ucontext, ibuc);
	srq->wq.ring_bytes = (size_t)1 << (srq->wq.log_entries +
					   srq->wq.wqe_shift);
	srq->db_slot = hca_uar_slot_get(srq->uc, HCA_UAR_SRQ, db_offset);
	if (srq->db_slot < 0)
		return srq->db_slot;
	err = hca_wq_alloc_user(dev, srq->uc, &srq->wq, &resp->ring_mmap_offset);
	if (err) {
		hca_uar_slot_put(srq->uc, HCA_UAR_SRQ, srq->db_slot);
		return err;
	}
	resp->db_slot = srq->db_slot;
	resp->log_entries = srq->wq.log_entries;
	resp->wqe_shift = srq->wq.wqe_shift;
	return 0;
}

static void hca_srq_free(struct hca_dev *dev, struct hca_srq *srq)
{
	if (srq->uc) {
		hca_wq_free_user(&srq->wq);
		hca_uar_slot_put(srq->uc, HCA_UAR_SRQ, srq->db_slot);
		return;
	}
	kfree(srq->free_tags);
	kfree(srq->busy);
	hca_wq_free(dev, &srq->wq);
}

int hca_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		   struct ib_udata *udata)
{
	struct hca_ucreate_srq_resp resp = {};
	struct hca_dev *dev = to_hdev(ibsrq->device);
	struct hca_srq *srq = to_hsrq(ibsrq);
	struct ib_srq_attr *a = &init->attr;
	struct hca_cmd_create_srq in = {};
	struct hca_cmd_handle out;
	u32 entries;
	int err;

	if (!(dev->caps & HCA_CAP_SRQ))
		return -EOPNOTSUPP;
	if (init->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	if (a->max_wr > (1 << HCA_MAX_SRQ_LOG_WR))
		return -EINVAL;
	/* A QP's receive queue and an SRQ share a WQE format: sized alike. */
	err = hca_wq_size(&srq->wq, a->max_wr, sizeof(struct hca_recv_wqe),
			  a->max_sge, 0, HCA_MIN_RQ_WQE_SHIFT, HCA_MAX_RQ_WQE_SHIFT);
	if (err)
		return err;
	entries = 1 << srq->wq.log_entries;
	if (a->srq_limit > entries)
		return -EINVAL;
	spin_lock_init(&srq->lock);
	if (udata) {
		err = hca_srq_alloc_user(dev, srq, udata, &resp, &in.db_offset);
		if (err)
			return err;
		goto create;
	}
	/* wq.wrid is indexed by tag: as many tags as slots. */
	err = hca_wq_alloc(dev, &srq->wq);
	if (err)
		return err;
	srq->busy = kcalloc(entries, sizeof(u8), GFP_KERNEL);
	srq->free_tags = kcalloc(entries, sizeof(u32), GFP_KERNEL);
	err = -ENOMEM;
	if (!srq->busy || !srq->free_tags)
		goto err_free;
	for (srq->nfree = 0; srq->nfree < entries; srq->nfree++)
		srq->free_tags[srq->nfree] = entries - 1 - srq->nfree;
create:
	in.ring_addr = srq->wq.ring_dma;
	in.pdn = to_hpd(ibsrq->pd)->pdn;
	in.limit = a->srq_limit;
	in.log_entries = srq->wq.log_entries;
	in.wqe_shift = srq->wq.wqe_shift;
	err = hca_cmd(dev, HCA_CMD_CREATE_SRQ, &in, sizeof(in), &out, sizeof(out));
	if (err)
		goto err_free;
	err = -EIO;
	if (out.handle >= HCA_MAX_SRQ)
		goto err_destroy;
	srq->srqn = out.handle;
	a->max_wr = entries;
	a->max_sge = srq->wq.max_sge;
	if (udata) {
		resp.srqn = srq->srqn;
		err = ib_copy_to_udata(udata, &resp,
				       min(sizeof(resp), udata->outlen));
		if (err)
			goto err_destroy;
	}
	hca_srq_set_table(dev, srq->srqn, srq);
	return 0;

err_destroy:
	/* The device may still read an SRQ it could not destroy. */
	if (hca_cmd_handle(dev, HCA_CMD_DESTROY_SRQ, out.handle)) {
		WARN_ONCE(1, "hca_ib: SRQ %#x not destroyed: its ring is leaked\n",
			  out.handle);
		return err;
	}
err_free:
	hca_srq_free(dev, srq);
	return err;
}

/* Only the limit changes (IB_SRQ_LIMIT arms it); the ring is not resized. */
int hca_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		   enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct hca_srq *srq = to_hsrq(ibsrq);
	struct hca_cmd_srq_limit in = { .srqn = srq->srqn };

	if (mask & ~IB_SRQ_LIMIT)
		return -EOPNOTSUPP;
	if (!(mask & IB_SRQ_LIMIT))
		return 0;
	if (attr->srq_limit > (1u << srq->wq.log_entries))
		return -EINVAL;
	in.limit = attr->srq_limit;
	return hca_cmd(to_hdev(ibsrq->device), HCA_CMD_MODIFY_SRQ, &in,
		       sizeof(in), NULL, 0);
}

int hca_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct hca_srq *srq = to_hsrq(ibsrq);
	struct hca_cmd_handle in = { .handle = srq->srqn };
	struct hca_cmd_srq_limit out;
	int err;

	err = hca_cmd(to_hdev(ibsrq->device), HCA_CMD_QUERY_SRQ, &in, sizeof(in),
		      &out, sizeof(out));
	if (err)
		return err;
	attr->max_wr = 1 << srq->wq.log_entries;
	attr->max_sge = srq->wq.max_sge;
	attr->srq_limit = out.limit;
	return 0;
}

int hca_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibsrq->device);
	struct hca_srq *srq = to_hsrq(ibsrq);
	int err;

	err = hca_cmd_handle(dev, HCA_CMD_DESTROY_SRQ, srq->srqn);
	if (err)
		return err;
	hca_srq_unpublish(dev, srq);
	/* An event handler that found the SRQ before it went finishes first. */
	synchronize_irq(dev->irq[HCA_VEC_ASYNC]);
	hca_srq_free(dev, srq);
	return 0;
}

int hca_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
		      const struct ib_recv_wr **bad_wr)
{
	struct hca_dev *dev = to_hdev(ibsrq->device);
	struct hca_srq *srq = to_hsrq(ibsrq);
	struct hca_wq *wq = &srq->wq;
	u32 mask = (1 << wq->log_entries) - 1, start, tag;
	unsigned long flags;
	int err = 0;

	spin_lock_irqsave(&srq->lock, flags);
	start = wq->pi;
	for (; wr; wr = wr->next) {
		/* Cannot fail while a tag is free (see above); checked all the same. */
		if (!srq->nfree || wq->pi - wq->ci > mask) {
			err = -ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > wq->max_sge) {
			err = -EINVAL;
			break;
		}
		tag = srq->free_tags[--srq->nfree];
		srq->busy[tag] = 1;
		wq->wrid[tag] = wr->wr_id;
		hca_write_recv_wqe(wq, wq->pi, (u64)wq->pi << 32 | tag, wr);
		wq->pi++;
	}
	if (err)
		*bad_wr = wr;
	if (wq->pi != start) {
		dma_wmb();
		iowrite32(wq->pi, hca_srq_db(dev, srq->srqn) +
			  offsetof(struct hca_srq_db, pi));
	}
	spin_unlock_irqrestore(&srq->lock, flags);
	return err;
}

/*
 * The completion of the SRQ WQE whose wr_id field was `hw` (ring index and
 * tag) was polled, or dropped with its destroyed QP: the consumer's wr_id;
 * the tag is free again, and the device has taken every slot up to that
 * index. Caller holds a CQ lock.
 */
u64 hca_srq_retire(struct hca_srq *srq, u64 hw)
{
	u32 entries = 1 << srq->wq.log_entries, tag = (u32)hw, idx = hw >> 32;
	unsigned long flags;
	u64 wr_id = 0;

	spin_lock_irqsave(&srq->lock, flags);
	/* Both halves come from the device: only a tag in use, a slot posted. */
	if (tag < entries && srq->busy[tag]) {
		wr_id = srq->wq.wrid[tag];
		srq->busy[tag] = 0;
		srq->free_tags[srq->nfree++] = tag;
	}
	if (idx - srq->wq.ci < srq->wq.pi - srq->wq.ci)
		srq->wq.ci = idx + 1;
	spin_unlock_irqrestore(&srq->lock, flags);
	return wr_id;
}
