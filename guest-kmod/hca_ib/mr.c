// SPDX-License-Identifier: GPL-2.0
/*
 * Memory regions: the physical MR over all guest memory (ib_get_dma_mr,
 * the PD's global rkey) and fast-registration MRs (ib_alloc_mr +
 * ib_map_mr_sg + IB_WR_REG_MR), whose page list lives in guest RAM and is
 * copied by the device when the REG_MR work request executes.
 */
#include "hca_ib.h"

/* ib_access_flags to the device's; IB wants local write under remote write. */
u32 hca_mr_access(int access)
{
	u32 a = access & (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			  IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC);

	if (a & (IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_ATOMIC))
		a |= IB_ACCESS_LOCAL_WRITE;
	return a;
}

static struct hca_mr *hca_mr_register(struct ib_pd *ibpd,
				      struct hca_cmd_reg_mr *in)
{
	struct hca_cmd_handle out;
	struct hca_mr *mr;
	int err;

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	in->pdn = to_hpd(ibpd)->pdn;
	err = hca_cmd(to_hdev(ibpd->device), HCA_CMD_REG_MR, in, sizeof(*in),
		      &out, sizeof(out));
	if (err) {
		kfree(mr);
		return ERR_PTR(err);
	}
	mr->hw_key = out.handle;
	mr->ibmr.lkey = out.handle;
	mr->ibmr.rkey = out.handle;
	return mr;
}

struct ib_mr *hca_get_dma_mr(struct ib_pd *ibpd, int access)
{
	struct hca_cmd_reg_mr in = {
		.iova = 0,
		.length = U64_MAX,
		.access = hca_mr_access(access),
		.flags = HCA_MR_FLAG_PHYS,
	};
	struct hca_mr *mr = hca_mr_register(ibpd, &in);

	return IS_ERR(mr) ? ERR_CAST(mr) : &mr->ibmr;
}

/* No user space verbs; ib_core lists this op as mandatory for kernel providers. */
struct ib_mr *hca_reg_user_mr(struct ib_pd *pd, u64 start, u64 length,
			      u64 virt, int access, struct ib_udata *udata)
{
	return ERR_PTR(-EOPNOTSUPP);
}

struct ib_mr *hca_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type, u32 max_sg)
{
	struct hca_dev *dev = to_hdev(ibpd->device);
	struct hca_cmd_reg_mr in = { .flags = HCA_MR_FLAG_FAST_REG };
	struct hca_mr *mr;

	if (type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EOPNOTSUPP);
	if (!max_sg || max_sg > HCA_IB_MAX_FRMR_PAGES)
		return ERR_PTR(-EINVAL);
	in.npages = max_sg;
	mr = hca_mr_register(ibpd, &in);
	if (IS_ERR(mr))
		return ERR_CAST(mr);
	mr->max_pages = max_sg;
	mr->pages = dma_alloc_coherent(&dev->pdev->dev, max_sg * sizeof(u64),
				       &mr->pages_dma, GFP_KERNEL);
	if (!mr->pages) {
		hca_dereg_mr(&mr->ibmr, NULL);
		return ERR_PTR(-ENOMEM);
	}
	return &mr->ibmr;
}

static int hca_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct hca_mr *mr = to_hmr(ibmr);

	if (mr->npages == mr->max_pages)
		return -ENOMEM;
	mr->pages[mr->npages++] = addr;
	return 0;
}

int hca_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		  unsigned int *sg_offset)
{
	to_hmr(ibmr)->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, hca_set_page);
}

int hca_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibmr->device);
	struct hca_mr *mr = to_hmr(ibmr);
	int err;

	err = hca_cmd_handle(dev, HCA_CMD_DEREG_MR, mr->hw_key);
	if (err == -ENOENT && mr->prev_key && mr->prev_key != mr->hw_key)
		err = hca_cmd_handle(dev, HCA_CMD_DEREG_MR, mr->prev_key);
	if (err)
		return err;
	if (mr->pages)
		dma_free_coherent(&dev->pdev->dev, mr->max_pages * sizeof(u64),
				  mr->pages, mr->pages_dma);
	kfree(mr);
	return 0;
}
