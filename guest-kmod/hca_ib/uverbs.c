// SPDX-License-Identifier: GPL-2.0
/*
 * User contexts (ib_uverbs): what a process maps to post and poll without
 * a system call, as libhcab does.
 *
 * Each context owns one user access region (UAR): a BAR2 page of the
 * device holding the doorbell records of that context's QPs, CQs and
 * SRQs, in slots handed out here. The device reads a user queue's record
 * only there, so a process that writes its page moves only its own queues.
 * The process also maps the page holding BAR0's doorbell register (a
 * doorbell names only a class; what it rang is read from the records).
 * Rings are DMA memory the kernel allocates and the process maps; each
 * belongs to an rdma_user_mmap_entry, and is freed by mmap_free only when
 * the entry is removed and the last mapping of it is gone, so a process
 * that keeps a stale mapping never reaches memory the kernel reused.
 *
 * Locking: uc->slot_lock (a mutex: create and destroy sleep) guards the
 * slot bitmaps; dev->uar_ida has its own lock.
 */
#include <linux/io.h>
#include "hca_ib.h"

static_assert(HCA_UAR_SIZE == PAGE_SIZE);

static struct hca_mmap_entry *to_hentry(struct rdma_user_mmap_entry *e)
{
	return container_of(e, struct hca_mmap_entry, rdma);
}

/*
 * The page holding BAR0 goes to processes only if no other device's
 * register lies in it: under QEMU BAR0 is 256 bytes, and firmware may
 * pack small BARs of several devices into one page.
 */
bool hca_db_page_private(struct pci_dev *pdev)
{
	resource_size_t start = pci_resource_start(pdev, 0) & PAGE_MASK;
	resource_size_t end = start + PAGE_SIZE - 1;
	struct pci_dev *other = NULL;
	struct resource *r;
	int i;

	for_each_pci_dev(other) {
		for (i = 0; i <= PCI_ROM_RESOURCE; i++) {
			r = &other->resource[i];
			if (!(r->flags & IORESOURCE_MEM) || !r->start)
				continue;
			if (other == pdev && i == 0)
				continue;
			if (r->start <= end && r->end >= start) {
				dev_info(&pdev->dev,
					 "BAR0's page is shared with %s BAR %d: no user verbs\n",
					 pci_name(other), i);
				pci_dev_put(other);
				return false;
			}
		}
	}
	return true;
}

static struct hca_mmap_entry *hca_mmap_insert(struct hca_ucontext *uc,
					       struct hca_mmap_entry *e,
					       size_t size, u64 *offset)
{
	int err;

	err = rdma_user_mmap_entry_insert(&uc->ibuc, &e->rdma, size);
	if (err) {
		kfree(e);
		return ERR_PTR(err);
	}
	*offset = rdma_user_mmap_get_offset(&e->rdma);
	return e;
}

/* A page of the device (BAR0's or a UAR) for the process, uncached. */
static struct hca_mmap_entry *hca_mmap_io(struct hca_ucontext *uc,
					  phys_addr_t addr, int uar, u64 *offset)
{
	struct hca_mmap_entry *e = kzalloc(sizeof(*e), GFP_KERNEL);

	if (!e)
		return ERR_PTR(-ENOMEM);
	e->pfn = PHYS_PFN(addr);
	e->io = true;
	e->uar = uar;
	e->dev = to_hdev(uc->ibuc.device);
	return hca_mmap_insert(uc, e, PAGE_SIZE, offset);
}

/*
 * A ring of wq->ring_bytes for the process: DMA memory (the device needs
 * its bus address), page-rounded so that the mapping holds nothing else.
 */
int hca_wq_alloc_user(struct hca_dev *dev, struct hca_ucontext *uc,
		      struct hca_wq *wq, u64 *offset)
{
	struct hca_mmap_entry *e;

	/* One allocation of contiguous pages: a process asks for no more. */
	if (wq->ring_bytes > HCA_IB_MAX_USER_RING)
		return -EINVAL;
	e = kzalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		return -ENOMEM;
	e->size = PAGE_ALIGN(wq->ring_bytes);
	e->cpu = dma_alloc_coherent(&dev->pdev->dev, e->size, &e->dma,
				    GFP_KERNEL | __GFP_NOWARN);
	if (!e->cpu) {
		kfree(e);
		return -ENOMEM;
	}
	/*
	 * The process maps the ring by its physical pages: only a linear
	 * mapping (dma-direct, no translating IOMMU) gives them.
	 */
	if (is_vmalloc_addr(e->cpu)) {
		dma_free_coherent(&dev->pdev->dev, e->size, e->cpu, e->dma);
		kfree(e);
		return -EOPNOTSUPP;
	}
	e->pfn = PHYS_PFN(virt_to_phys(e->cpu));
	e->uar = -1;
	e->dev = dev;
	wq->ring = e->cpu;
	wq->ring_dma = e->dma;
	e = hca_mmap_insert(uc, e, e->size, offset);
	if (IS_ERR(e)) {
		dma_free_coherent(&dev->pdev->dev, PAGE_ALIGN(wq->ring_bytes),
				  wq->ring, wq->ring_dma);
		wq->ring = NULL;
		return PTR_ERR(e);
	}
	wq->mmap = &e->rdma;
	return 0;
}

/* The ring goes when its last mapping does (hca_mmap_free). */
void hca_wq_free_user(struct hca_wq *wq)
{
	if (wq->mmap)
		rdma_user_mmap_entry_remove(wq->mmap);
	wq->mmap = NULL;
	wq->ring = NULL;
}

void hca_mmap_free(struct rdma_user_mmap_entry *rdma)
{
	struct hca_mmap_entry *e = to_hentry(rdma);

	if (e->cpu)
		dma_free_coherent(&e->dev->pdev->dev, e->size, e->cpu, e->dma);
	/* No process maps the UAR any more: another context may have it. */
	if (e->uar >= 0)
		ida_free(&e->dev->uar_ida, e->uar);
	kfree(e);
}

int hca_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rdma;
	struct hca_mmap_entry *e;
	pgprot_t prot;
	int err;

	rdma = rdma_user_mmap_entry_get(ibuc, vma);
	if (!rdma)
		return -EINVAL;
	e = to_hentry(rdma);
	prot = e->io ? pgprot_noncached(vma->vm_page_prot) : vma->vm_page_prot;
	err = rdma_user_mmap_io(ibuc, vma, e->pfn, vma->vm_end - vma->vm_start,
				prot, rdma);
	rdma_user_mmap_entry_put(rdma);
	return err;
}

/*
 * The share of the device's QPs, CQs and SRQs that processes may hold
 * together. The rest stays the kernel's: a process that hoards queues (two
 * contexts' UAR slots are all of the device's CQs) must not leave IPoIB,
 * NVMe-oF or rdma_cm's other ULPs without them.
 */
static unsigned int user_share = 75;
module_param(user_share, uint, 0644);
MODULE_PARM_DESC(user_share,
		 "percent of the device's QPs, CQs and SRQs all processes together may hold (default 75)");

static_assert(HCA_UAR_KINDS == ARRAY_SIZE(((struct hca_dev *)0)->user_objs));

/*
 * A free slot of a kind in the context's UAR; its record's BAR2 offset.
 * Every process's QP, CQ and SRQ takes one, so the user share is counted
 * here too.
 */
int hca_uar_slot_get(struct hca_ucontext *uc, enum hca_uar_kind kind,
		     u32 *db_offset)
{
	static const u32 first[] = { HCA_UAR_QP_OFFSET, HCA_UAR_CQ_OFFSET,
				     HCA_UAR_SRQ_OFFSET };
	static const u32 count[] = { HCA_UAR_QP_SLOTS, HCA_UAR_CQ_SLOTS,
				     HCA_UAR_SRQ_SLOTS };
	static const u32 table[] = { HCA_MAX_QP, HCA_MAX_CQ, HCA_MAX_SRQ };
	struct hca_dev *dev = to_hdev(uc->ibuc.device);
	u32 limit = table[kind] * min(READ_ONCE(user_share), 100U) / 100;
	unsigned long *map = uc->slots[kind];
	u32 slot;

	if (atomic_inc_return(&dev->user_objs[kind]) > limit) {
		atomic_dec(&dev->user_objs[kind]);
		return -ENOMEM;
	}
	mutex_lock(&uc->slot_lock);
	slot = find_first_zero_bit(map, count[kind]);
	if (slot < count[kind])
		set_bit(slot, map);
	mutex_unlock(&uc->slot_lock);
	if (slot >= count[kind]) {
		atomic_dec(&dev->user_objs[kind]);
		return -ENOMEM;
	}
	*db_offset = HCA_BAR2_UAR_OFFSET + uc->uar * HCA_UAR_SIZE +
		     first[kind] + slot * 8;
	return slot;
}

void hca_uar_slot_put(struct hca_ucontext *uc, enum hca_uar_kind kind,
		      u32 slot)
{
	mutex_lock(&uc->slot_lock);
	clear_bit(slot, uc->slots[kind]);
	mutex_unlock(&uc->slot_lock);
	atomic_dec(&to_hdev(uc->ibuc.device)->user_objs[kind]);
}

int hca_alloc_ucontext(struct ib_ucontext *ibuc, struct ib_udata *udata)
{
	struct hca_dev *dev = to_hdev(ibuc->device);
	struct hca_ucontext *uc = to_huc(ibuc);
	struct hca_ualloc_ucontext_resp resp = {};
	phys_addr_t bar0 = pci_resource_start(dev->pdev, 0);
	phys_addr_t page;
	struct hca_mmap_entry *e;
	int uar, err;

	if (!dev->user_verbs)
		return -EOPNOTSUPP;
	mutex_init(&uc->slot_lock);
	uar = ida_alloc_max(&dev->uar_ida, HCA_MAX_UAR - 1, GFP_KERNEL);
	if (uar < 0)
		return uar == -ENOSPC ? -EMFILE : uar;
	uc->uar = uar;
	/* A previous owner's records must not look like posted work. */
	memset_io(dev->bar2 + HCA_BAR2_UAR_OFFSET + uar * HCA_UAR_SIZE, 0,
		  HCA_UAR_SIZE);
	page = pci_resource_start(dev->pdev, 2) + HCA_BAR2_UAR_OFFSET +
	       uar * HCA_UAR_SIZE;
	e = hca_mmap_io(uc, page, uar, &resp.uar_mmap_offset);
	if (IS_ERR(e)) {
		ida_free(&dev->uar_ida, uar);
		return PTR_ERR(e);
	}
	uc->uar_entry = &e->rdma;
	e = hca_mmap_io(uc, bar0 & PAGE_MASK, -1, &resp.db_mmap_offset);
	if (IS_ERR(e)) {
		err = PTR_ERR(e);
		goto err_uar;
	}
	uc->db_entry = &e->rdma;
	resp.db_reg_offset = offset_in_page(bar0) + HCA_BAR0_DOORBELL;
	resp.doorbell_peer = dev->doorbell_peer;
	resp.caps = dev->caps;
	resp.max_inline = HCA_MAX_INLINE;
	err = ib_copy_to_udata(udata, &resp, min(sizeof(resp), udata->outlen));
	if (err)
		goto err_db;
	return 0;

err_db:
	rdma_user_mmap_entry_remove(uc->db_entry);
err_uar:
	/* Gives the UAR back through hca_mmap_free. */
	rdma_user_mmap_entry_remove(uc->uar_entry);
	return err;
}

void hca_dealloc_ucontext(struct ib_ucontext *ibuc)
{
	struct hca_ucontext *uc = to_huc(ibuc);

	rdma_user_mmap_entry_remove(uc->db_entry);
	rdma_user_mmap_entry_remove(uc->uar_entry);
}

/*
 * ib_uverbs zaps every mapping of the context itself; the objects it
 * destroys next free their rings. Having this lets hca_ib unload while
 * processes hold contexts.
 */
void hca_disassociate_ucontext(struct ib_ucontext *ibuc)
{
}
