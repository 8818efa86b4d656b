// SPDX-License-Identifier: GPL-2.0
/*
 * Memory regions: the physical MR over all guest memory (ib_get_dma_mr,
 * the PD's global rkey), fast-registration MRs (ib_alloc_mr +
 * ib_map_mr_sg + IB_WR_REG_MR), whose page list lives in guest RAM and is
 * copied by the device when the REG_MR work request executes, and a
 * process's MRs (reg_user_mr): its pages pinned by ib_umem, their list
 * handed to REG_MR, which copies it.
 */
#include "hca_ib.h"

/* ib_access_flags to the device's; IB wants local write under remote write. */
u32 hca_mr_access(int access)
{
	u32 a = access & (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			  IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC |
			  IB_ACCESS_MW_BIND);

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

/* The page list of a pinned range, in DMA memory the device reads. */
static u64 *hca_umem_pages(struct hca_dev *dev, struct ib_umem *umem,
			   u32 npages, dma_addr_t *dma)
{
	struct ib_block_iter biter;
	u64 *list;
	u32 i = 0;

	list = dma_alloc_coherent(&dev->pdev->dev, npages * sizeof(u64), dma,
				  GFP_KERNEL | __GFP_NOWARN);
	if (!list)
		return NULL;
	rdma_umem_for_each_dma_block(umem, &biter, PAGE_SIZE) {
		if (i == npages)
			break;
		list[i++] = rdma_block_iter_dma_address(&biter);
	}
	return list;
}

struct ib_mr *hca_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
			      u64 virt, int access, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibpd->device);
	struct hca_cmd_reg_mr in = {
		.iova = virt,
		.length = length,
		.access = hca_mr_access(access),
		.page_shift = PAGE_SHIFT,
	};
	struct ib_umem *umem;
	struct hca_mr *mr;
	dma_addr_t list_dma;
	size_t npages;
	u64 *list;

	/* iova and address share their page offset: one page list serves both. */
	if (offset_in_page(virt ^ start) || !length || start + length < start)
		return ERR_PTR(-EINVAL);
	/* Its page list is one allocation the device reads: bounded before pinning. */
	npages = (PAGE_ALIGN(start + length) - (start & PAGE_MASK)) >> PAGE_SHIFT;
	if (npages > HCA_MAX_MR_PAGES ||
	    npages * sizeof(u64) > HCA_IB_MAX_USER_RING)
		return ERR_PTR(-EINVAL);
	/*
	 * Optional bits (relaxed ordering, which perftest asks for) are hints
	 * a device may ignore, as ib_core lets it.
	 */
	if (access & ~(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
		       IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC |
		       IB_ACCESS_MW_BIND | IB_ACCESS_OPTIONAL))
		return ERR_PTR(-EOPNOTSUPP);
	if ((access & IB_ACCESS_MW_BIND) && !(dev->caps & HCA_CAP_MW_UC))
		return ERR_PTR(-EOPNOTSUPP);
	umem = ib_umem_get(ibpd->device, start, length, access);
	if (IS_ERR(umem))
		return ERR_CAST(umem);
	npages = ib_umem_num_dma_blocks(umem, PAGE_SIZE);
	mr = ERR_PTR(-EINVAL);
	if (npages > HCA_MAX_MR_PAGES)
		goto err_umem;
	mr = ERR_PTR(-ENOMEM);
	list = hca_umem_pages(dev, umem, npages, &list_dma);
	if (!list)
		goto err_umem;
	in.page_list = list_dma;
	in.npages = npages;
	mr = hca_mr_register(ibpd, &in);
	dma_free_coherent(&dev->pdev->dev, npages * sizeof(u64), list, list_dma);
	if (IS_ERR(mr))
		goto err_umem;
	mr->umem = umem;
	return &mr->ibmr;

err_umem:
	ib_umem_release(umem);
	return ERR_CAST(mr);
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
	ib_umem_release(mr->umem);
	kfree(mr);
	return 0;
}

/*
 * A memory window: the device's key for it is its rkey. Processes bind it
 * through their send queues (libhcab); the kernel's ULPs use none.
 */
int hca_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibmw->device);
	struct hca_cmd_alloc_mw in = { .pdn = to_hpd(ibmw->pd)->pdn };
	struct hca_cmd_handle out;
	int err;

	if (!(dev->caps & HCA_CAP_MW_UC))
		return -EOPNOTSUPP;
	switch (ibmw->type) {
	case IB_MW_TYPE_1:
		in.mw_type = HCA_MW_TYPE_1;
		break;
	case IB_MW_TYPE_2:
		in.mw_type = HCA_MW_TYPE_2;
		break;
	default:
		return -EINVAL;
	}
	err = hca_cmd(dev, HCA_CMD_ALLOC_MW, &in, sizeof(in), &out, sizeof(out));
	if (err)
		return err;
	ibmw->rkey = out.handle;
	return 0;
}

int hca_dealloc_mw(struct ib_mw *ibmw)
{
	/* The window's index names it, whatever key its last bind gave it. */
	return hca_cmd_handle(to_hdev(ibmw->device), HCA_CMD_DEALLOC_MW,
			      ibmw->rkey);
}
