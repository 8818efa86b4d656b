// SPDX-License-Identifier: GPL-2.0
/*
 * DSM memory: /dev/dsm mmap gives a process a region of kernel pages
 * mapped with special (PFN) PTEs: the DSM session's shared space when one
 * is open, else a private scratch region. dsm_protect() is the paper's
 * section 3.3 primitive: one call changes any group of the region's pages
 * to none, read or read-write by editing the PTEs directly. No VMA or
 * other MM structure changes, nothing sleeps, and the locks are tried,
 * never waited for: a busy lock fails the call (-EAGAIN) for a retry, so
 * it may be attempted from the completion handler. A missing or
 * read-only PTE faults into this file's vm_ops: the coherence protocol's
 * read and write faults for the shared space, SIGBUS for a scratch region.
 * A region not mapped (yet, or any more) keeps its protections in prot[]
 * alone; mmap applies them.
 *
 * TLB shootdown: taking a right away (RW to read, anything to none) must
 * reach every CPU's TLB before the page's data leaves. In process context
 * the primitive flushes the other CPUs synchronously. With interrupts off
 * (the completion handler) it may not wait for them, so it fences: it
 * sends each other CPU an asynchronous IPI that flushes its TLB, returns
 * DSM_FENCED at once, and the last CPU to flush calls
 * dsm_proto_fence_done(), which sends what the protocol held back
 * meanwhile. Nothing sleeps or spins on another CPU. Granting a right
 * needs no remote flush: a stale entry only faults again, and the fault
 * finds the new PTE.
 *
 * Locking: r->lock (irqsave, tried) makes the region's PTE edits and
 * teardown exclusive: the MMU notifier marks a region dead under it before
 * the kernel unmaps the range and frees its page tables, so the primitive
 * never walks freed tables. Each PTE page's own lock (split ptlock, also
 * tried) orders our edits with the kernel's. dsm_regions_lock guards the
 * list of live regions the notifier searches; dsm_space_lock (a mutex)
 * the published shared space and its users.
 */
#include <linux/module.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/smp.h>
#include <asm/tlbflush.h>
#include "hcab_compat.h"
#include "region.h"

#ifdef CONFIG_HIGHPTE
#error "dsm_set_pte() expects PTE tables always mapped (no HIGHPTE)"
#endif
#include "proto.h"

#define DSM_MAX_REGION_PAGES	65536
#define DSM_FENCES		8	/* shootdowns in flight per region */

/* One asynchronous shootdown: an IPI to every other online CPU. */
struct dsm_fence {
	struct dsm_region *r;
	atomic_t busy;
	atomic_t left;			/* CPUs still to flush, plus the sender */
	call_single_data_t *csd;	/* per CPU */
};

struct dsm_region {
	struct kref ref;
	struct dsm_proto *proto;	/* the session's space; NULL: scratch */
	struct list_head link;
	struct mm_struct *mm;
	struct mmu_notifier *mn;
	unsigned long start;
	u32 npages;
	struct page **pages;
	u8 *prot;		/* DSM_PROT_* per page */
	spinlock_t lock;
	bool dead;		/* no PTEs to edit: not mapped, or being unmapped */
	/*
	 * The user-level simulation: the process mprotects the pages itself,
	 * which splits the VMA; vmas counts the pieces.
	 */
	bool usim;
	atomic_t vmas;
	atomic_t fences;	/* shootdowns not yet finished */
	struct dsm_fence fence[DSM_FENCES];
};

static DEFINE_SPINLOCK(dsm_regions_lock);
static LIST_HEAD(dsm_regions);
static DEFINE_MUTEX(dsm_space_lock);
static struct dsm_region *dsm_space;

static void dsm_regions_kill(struct mm_struct *mm, unsigned long start,
			     unsigned long end)
{
	struct dsm_region *r;
	unsigned long flags;

	spin_lock(&dsm_regions_lock);
	list_for_each_entry(r, &dsm_regions, link) {
		if (r->mm != mm || end <= r->start ||
		    start >= r->start + ((unsigned long)r->npages << PAGE_SHIFT))
			continue;
		spin_lock_irqsave(&r->lock, flags);
		r->dead = true;
		spin_unlock_irqrestore(&r->lock, flags);
	}
	spin_unlock(&dsm_regions_lock);
}

/* Unmapping (munmap, mremap, exit) frees page tables: no more edits after this. */
static int dsm_mn_invalidate_start(struct mmu_notifier *mn,
				   const struct mmu_notifier_range *range)
{
	if (range->event == MMU_NOTIFY_UNMAP || range->event == MMU_NOTIFY_CLEAR)
		dsm_regions_kill(range->mm, range->start, range->end);
	return 0;
}

static void dsm_mn_release(struct mmu_notifier *mn, struct mm_struct *mm)
{
	dsm_regions_kill(mm, 0, ULONG_MAX);
}

static struct mmu_notifier *dsm_mn_alloc(struct mm_struct *mm)
{
	struct mmu_notifier *mn = kzalloc(sizeof(*mn), GFP_KERNEL);

	return mn ? mn : ERR_PTR(-ENOMEM);
}

static void dsm_mn_free(struct mmu_notifier *mn)
{
	kfree(mn);
}

static const struct mmu_notifier_ops dsm_mn_ops = {
	.invalidate_range_start = dsm_mn_invalidate_start,
	.release = dsm_mn_release,
	.alloc_notifier = dsm_mn_alloc,
	.free_notifier = dsm_mn_free,
};

static pte_t dsm_pte(struct dsm_region *r, u32 i, int prot)
{
	vm_flags_t f = VM_READ | VM_SHARED | (prot == DSM_PROT_RW ? VM_WRITE : 0);

	return pte_mkspecial(pfn_pte(page_to_pfn(r->pages[i]), vm_get_page_prot(f)));
}

/*
 * Edits one PTE under its page-table page's lock, which *held caches;
 * tried only, unless wait (process context, nothing else can hold it).
 */
static int dsm_set_pte(struct dsm_region *r, u32 i, int prot, spinlock_t **held,
		       bool wait)
{
	unsigned long addr = r->start + ((unsigned long)i << PAGE_SHIFT);
	pgd_t *pgd = pgd_offset(r->mm, addr);
	p4d_t *p4d;
	pud_t *pud;
	pmd_t *pmd;
	pte_t *pte;
	spinlock_t *ptl;

	p4d = p4d_offset(pgd, addr);
	if (p4d_none(*p4d))
		return -EFAULT;
	pud = pud_offset(p4d, addr);
	if (pud_none(*pud))
		return -EFAULT;
	pmd = pmd_offset(pud, addr);
	if (pmd_none(*pmd) || pmd_trans_huge(*pmd) || pmd_bad(*pmd))
		return -EFAULT;
	ptl = pte_lockptr(r->mm, pmd);
	if (ptl != *held) {
		if (*held)
			spin_unlock(*held);
		*held = NULL;
		if (wait)
			spin_lock(ptl);
		else if (!spin_trylock(ptl))
			return -EAGAIN;
		*held = ptl;
	}
	/*
	 * The table is present and we hold its lock. pte_offset_map() is out
	 * of line for modules since 6.5 (__pte_offset_map is not exported);
	 * without HIGHPTE, as on x86-64, a PTE table is always mapped, and
	 * pte_offset_kernel() finds the same entry on every kernel.
	 */
	pte = pte_offset_kernel(pmd, addr);
	if (prot == DSM_PROT_NONE)
		ptep_get_and_clear(r->mm, addr, pte);
	else
		set_pte_at(r->mm, addr, pte, dsm_pte(r, i, prot));
	r->prot[i] = prot;
	return 0;
}

static void dsm_flush_local(void *unused)
{
	__flush_tlb_all();
}

/*
 * Modules get no ranged user TLB flush, only the local full one: invlpg
 * per page when the region's mm is the one loaded and user and kernel
 * share its address-space ID (no PTI), else the full flush (it drops
 * every ASID's entries).
 */
static void dsm_flush_this_cpu(struct dsm_region *r, const u32 *pages, u32 n)
{
	unsigned long flags, addr;
	u32 k;

	local_irq_save(flags);
	if (r->mm == current->active_mm && !boot_cpu_has(X86_FEATURE_PTI) &&
	    n <= 64) {
		for (k = 0; k < n; k++) {
			addr = r->start + ((unsigned long)pages[k] << PAGE_SHIFT);
			asm volatile("invlpg (%0)" : : "r" (addr) : "memory");
		}
	} else {
		__flush_tlb_all();
	}
	local_irq_restore(flags);
}

static void dsm_fence_put(struct dsm_fence *f)
{
	struct dsm_region *r = f->r;

	if (!atomic_dec_and_test(&f->left))
		return;
	atomic_set(&f->busy, 0);
	/* The protocol reads `fences` under its own lock in dsm_proto_fence_done. */
	atomic_dec(&r->fences);
	if (r->proto)
		dsm_proto_fence_done(r->proto);
}

/* Runs on each other CPU, in its IPI handler. */
static void dsm_fence_ipi(void *info)
{
	__flush_tlb_all();
	dsm_fence_put(info);
}

/*
 * A free fence slot, taken; NULL when every one is in use. Taken before a
 * right is removed, so that a shortage changes nothing (the caller
 * retries) rather than leaving a PTE edited and its flush undone.
 */
static struct dsm_fence *dsm_fence_get(struct dsm_region *r)
{
	int k;

	for (k = 0; k < DSM_FENCES; k++)
		if (!atomic_cmpxchg(&r->fence[k].busy, 0, 1))
			return &r->fence[k];
	return NULL;
}

static void dsm_fence_unget(struct dsm_fence *f)
{
	if (f)
		atomic_set(&f->busy, 0);
}

/* Starts an asynchronous shootdown on every other online CPU, in slot f. */
static int dsm_fence_start(struct dsm_region *r, struct dsm_fence *f)
{
	int self = smp_processor_id(), cpu;

	atomic_inc(&r->fences);
	atomic_set(&f->left, 1);
	for_each_online_cpu(cpu) {
		if (cpu == self)
			continue;
		atomic_inc(&f->left);
		INIT_CSD(&f->csd[cpu], dsm_fence_ipi, f);
		/* An offline CPU holds no entries; a busy csd cannot be (the fence was free). */
		if (smp_call_function_single_async(cpu, &f->csd[cpu]))
			atomic_dec(&f->left);
	}
	dsm_fence_put(f);
	return DSM_FENCED;
}

/*
 * After a change to pages[0..n): this CPU's TLB now; other CPUs' only
 * when a right was taken away: synchronously when we may wait (interrupts
 * were on), else by a fence in slot f (taken by the caller; given back if
 * unused).
 */
static int dsm_flush_tlb(struct dsm_region *r, const u32 *pages, u32 n,
			 bool revoked, bool may_wait, struct dsm_fence *f)
{
	dsm_flush_this_cpu(r, pages, n);
	if (!revoked || num_online_cpus() == 1 || may_wait) {
		dsm_fence_unget(f);
		if (revoked && num_online_cpus() > 1)
			smp_call_function(dsm_flush_local, NULL, 1);
		return 0;
	}
	/* Taken by dsm_protect; missing only if a CPU came online since. */
	if (!f)
		f = dsm_fence_get(r);
	return f ? dsm_fence_start(r, f) : -EAGAIN;
}

bool dsm_region_fenced(struct dsm_region *r)
{
	return atomic_read(&r->fences) > 0;
}

/* Waits (spinning; the IPIs take microseconds) until no shootdown is in flight. */
void dsm_region_quiesce(struct dsm_region *r)
{
	while (atomic_read(&r->fences))
		cpu_relax();
}

/*
 * The primitive. Changes pages[0..n) of r to prot; never sleeps. 0: done,
 * every CPU sees the change. DSM_FENCED: done here, other CPUs flush
 * asynchronously and dsm_proto_fence_done() follows (for the shared
 * space). -EAGAIN: a lock was busy or no fence slot was free. A fence
 * slot is taken before any PTE is edited, so only a busy page-table lock
 * of a later page leaves some pages changed (a retry, idempotent, finishes
 * the job); a one-page change fails whole. The protocol relies on that: a
 * retried forward checks that the page is still ours.
 */
int dsm_protect(struct dsm_region *r, const u32 *pages, u32 n, int prot)
{
	bool may_wait = !irqs_disabled(), revoked = false, edited = false;
	struct dsm_fence *fence = NULL;
	spinlock_t *held = NULL;
	unsigned long flags;
	u32 k;
	int err = 0;

	if (prot < DSM_PROT_NONE || prot > DSM_PROT_RW)
		return -EINVAL;
	if (!spin_trylock_irqsave(&r->lock, flags))
		return -EAGAIN;
	for (k = 0; k < n; k++) {
		if (pages[k] >= r->npages) {
			spin_unlock_irqrestore(&r->lock, flags);
			return -EINVAL;
		}
		/*
		 * A right taken away; a page already at a lesser target
		 * counts too, as it may be a retry whose flush failed.
		 */
		revoked |= prot < r->prot[pages[k]] ||
			   (prot == r->prot[pages[k]] && prot < DSM_PROT_RW);
	}
	/* A fence slot before any edit: without one, nothing changes. */
	if (revoked && !may_wait && !r->dead && num_online_cpus() > 1) {
		fence = dsm_fence_get(r);
		if (!fence) {
			spin_unlock_irqrestore(&r->lock, flags);
			return -EAGAIN;
		}
	}
	for (k = 0; k < n && !err; k++) {
		if (r->dead) {
			r->prot[pages[k]] = prot;
			continue;
		}
		err = dsm_set_pte(r, pages[k], prot, &held, false);
		edited = true;
	}
	if (held)
		spin_unlock(held);
	spin_unlock_irqrestore(&r->lock, flags);
	if (edited && !r->dead) {
		int f = dsm_flush_tlb(r, pages, k, revoked, may_wait, fence);

		if (f)
			err = err ?: f;
	} else {
		dsm_fence_unget(fence);
	}
	return err;
}

/* The user-level simulation's change: the process mprotects, the kernel only records. */
void dsm_region_record(struct dsm_region *r, u32 i, int prot)
{
	WRITE_ONCE(r->prot[i], prot);
}

/* -EBUSY once mapped: the mapping is set up for one mode or the other. */
int dsm_region_set_usim(struct dsm_region *r, bool on)
{
	unsigned long flags;
	int err = 0;

	spin_lock_irqsave(&r->lock, flags);
	if (r->mm)
		err = -EBUSY;
	else
		r->usim = on;
	spin_unlock_irqrestore(&r->lock, flags);
	return err;
}

struct page *dsm_region_page(struct dsm_region *r, u32 i)
{
	return r->pages[i];
}

int dsm_region_prot(struct dsm_region *r, u32 i)
{
	return READ_ONCE(r->prot[i]);
}

/* The shared space's faults are the protocol's (sync entry points; may sleep). */
static vm_fault_t dsm_space_fault(struct dsm_region *r, unsigned long addr,
				  bool write)
{
	u32 i = (addr - r->start) >> PAGE_SHIFT;

	if (i >= r->npages)
		return VM_FAULT_SIGBUS;
	return dsm_proto_fault(r->proto, i, write);
}

/* A page with no PTE: protected to none. */
static vm_fault_t dsm_fault(struct vm_fault *vmf)
{
	struct dsm_region *r = vmf->vma->vm_private_data;

	/* Simulated user level: mprotect keeps every PTE; access is the VMA's business. */
	if (r->proto && !r->usim)
		return dsm_space_fault(r, vmf->address,
				       vmf->flags & FAULT_FLAG_WRITE);
	return VM_FAULT_SIGBUS;
}

/* A write to a read-only PTE. */
static vm_fault_t dsm_pfn_mkwrite(struct vm_fault *vmf)
{
	struct dsm_region *r = vmf->vma->vm_private_data;
	u32 i = (vmf->address - r->start) >> PAGE_SHIFT;

	/*
	 * Simulated user level: the VMA allows the write, so it is allowed
	 * (a page being taken away has its data held until mprotect is done).
	 */
	if (r->usim)
		return 0;
	if (r->proto)
		return dsm_space_fault(r, vmf->address, true);
	return i < r->npages && r->prot[i] == DSM_PROT_RW ? 0 : VM_FAULT_SIGBUS;
}

static int dsm_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	struct dsm_region *r = vma->vm_private_data;

	return r->usim ? 0 : -EINVAL;
}

/* A piece split off by mprotect (simulated user level only). */
static void dsm_vma_open(struct vm_area_struct *vma)
{
	struct dsm_region *r = vma->vm_private_data;

	atomic_inc(&r->vmas);
}

static void dsm_vma_close(struct vm_area_struct *vma)
{
	struct dsm_region *r = vma->vm_private_data;
	unsigned long flags;

	if (atomic_dec_return(&r->vmas) > 0)
		return;
	spin_lock(&dsm_regions_lock);
	list_del_init(&r->link);
	spin_unlock(&dsm_regions_lock);
	spin_lock_irqsave(&r->lock, flags);
	r->dead = true;
	r->mm = NULL;
	spin_unlock_irqrestore(&r->lock, flags);
	mmu_notifier_put(r->mn);
	r->mn = NULL;
}

static const struct vm_operations_struct dsm_vm_ops = {
	.open = dsm_vma_open,
	.fault = dsm_fault,
	.pfn_mkwrite = dsm_pfn_mkwrite,
	.may_split = dsm_may_split,
	.close = dsm_vma_close,
};

static void dsm_region_free(struct kref *ref)
{
	struct dsm_region *r = container_of(ref, struct dsm_region, ref);
	u32 i;

	dsm_region_quiesce(r);
	for (i = 0; i < DSM_FENCES; i++)
		kfree(r->fence[i].csd);

	if (r->pages)
		for (i = 0; i < r->npages; i++)
			if (r->pages[i])
				__free_page(r->pages[i]);
	kvfree(r->pages);
	kvfree(r->prot);
	kfree(r);
}

void dsm_region_put(struct dsm_region *r)
{
	if (r)
		kref_put(&r->ref, dsm_region_free);
}

static struct dsm_region *dsm_region_alloc(u32 npages, int prot)
{
	struct dsm_region *r = kzalloc(sizeof(*r), GFP_KERNEL);
	u32 i;

	if (!r)
		return NULL;
	kref_init(&r->ref);
	INIT_LIST_HEAD(&r->link);
	spin_lock_init(&r->lock);
	r->dead = true;
	r->npages = npages;
	atomic_set(&r->fences, 0);
	for (i = 0; i < DSM_FENCES; i++) {
		r->fence[i].r = r;
		r->fence[i].csd = kcalloc(nr_cpu_ids, sizeof(*r->fence[i].csd),
					  GFP_KERNEL);
		if (!r->fence[i].csd)
			goto err;
	}
	r->pages = kvcalloc(npages, sizeof(*r->pages), GFP_KERNEL);
	r->prot = kvcalloc(npages, 1, GFP_KERNEL);
	if (!r->pages || !r->prot)
		goto err;
	for (i = 0; i < npages; i++) {
		r->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!r->pages[i])
			goto err;
		r->prot[i] = prot;
	}
	return r;
err:
	dsm_region_put(r);
	return NULL;
}

struct dsm_region *dsm_region_create(u32 npages)
{
	if (!npages || npages > DSM_MAX_REGION_PAGES)
		return NULL;
	return dsm_region_alloc(npages, DSM_PROT_NONE);
}

/*
 * Maps every page read-write (so the page tables exist), then, once the
 * primitive may edit them (dead cleared under r->lock), applies prot[]:
 * protections changed meanwhile (the protocol runs in interrupts) are in
 * prot[] and nobody can touch the range before mmap returns.
 */
static int dsm_region_map(struct dsm_region *r, struct vm_area_struct *vma)
{
	spinlock_t *held = NULL;
	unsigned long flags;
	u32 i;
	int err;

	for (i = 0; i < r->npages; i++) {
		err = remap_pfn_range(vma, r->start + ((unsigned long)i << PAGE_SHIFT),
				      page_to_pfn(r->pages[i]), PAGE_SIZE,
				      vm_get_page_prot(VM_READ | VM_WRITE | VM_SHARED));
		if (err)
			return err;
	}
	spin_lock_irqsave(&r->lock, flags);
	r->dead = false;
	/* Simulated user level: the process applies prot[] with mprotect. */
	for (i = 0; i < r->npages && !err && !r->usim; i++)
		if (r->prot[i] != DSM_PROT_RW)
			err = dsm_set_pte(r, i, r->prot[i], &held, true);
	if (held)
		spin_unlock(held);
	if (err)
		r->dead = true;
	spin_unlock_irqrestore(&r->lock, flags);
	__flush_tlb_all();
	return err;
}

/* One mapping per region at a time; the caller holds mmap_lock for writing. */
static int dsm_mmap(struct file *f, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	struct dsm_region *r = f->private_data;
	int err;

	if (!(vma->vm_flags & VM_SHARED) || vma->vm_pgoff ||
	    len > (unsigned long)DSM_MAX_REGION_PAGES << PAGE_SHIFT)
		return -EINVAL;
	if (!r) {
		r = dsm_region_alloc(len >> PAGE_SHIFT, DSM_PROT_RW);
		if (!r)
			return -ENOMEM;
		f->private_data = r;
	}
	if (len != (unsigned long)r->npages << PAGE_SHIFT)
		return -EINVAL;
	if (!list_empty(&r->link) || r->mm)
		return -EBUSY;
	r->mm = vma->vm_mm;
	r->start = vma->vm_start;
	hcab_vm_flags_set(vma, VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	err = dsm_region_map(r, vma);
	if (err)
		goto err_unmap;
	r->mn = mmu_notifier_get_locked(&dsm_mn_ops, vma->vm_mm);
	if (IS_ERR(r->mn)) {
		err = PTR_ERR(r->mn);
		r->mn = NULL;
		goto err_unmap;
	}
	vma->vm_private_data = r;
	vma->vm_ops = &dsm_vm_ops;
	atomic_set(&r->vmas, 1);
	spin_lock(&dsm_regions_lock);
	list_add(&r->link, &dsm_regions);
	spin_unlock(&dsm_regions_lock);
	return 0;

err_unmap:
	/* Nothing may map the pages once they are freed. */
	r->dead = true;
	zap_vma_ptes(vma, vma->vm_start, len);
	r->mm = NULL;
	return err;
}

void dsm_region_publish(struct dsm_region *r, struct dsm_proto *d)
{
	mutex_lock(&dsm_space_lock);
	if (r)
		r->proto = d;
	dsm_space = r;
	mutex_unlock(&dsm_space_lock);
}

/*
 * An open file uses the published shared space (holding a reference, so
 * the session cannot close under it), or later maps a scratch region.
 */
static int dsm_open(struct inode *inode, struct file *f)
{
	mutex_lock(&dsm_space_lock);
	f->private_data = dsm_space;
	if (dsm_space)
		kref_get(&dsm_space->ref);
	mutex_unlock(&dsm_space_lock);
	return 0;
}

/* The VMA (which held the file) is gone, so nothing maps the pages. */
static int dsm_release(struct inode *inode, struct file *f)
{
	struct dsm_region *r = f->private_data;

	if (r && r->proto) {
		dsm_proto_fasync(r->proto, -1, f, 0);
		/* The process is gone with its mapping: nobody will mprotect any more. */
		if (!READ_ONCE(r->mm))
			dsm_proto_usim_release(r->proto);
	}
	dsm_region_put(r);
	return 0;
}

static int dsm_fasync(int fd, struct file *f, int on)
{
	struct dsm_region *r = f->private_data;

	return r && r->proto ? dsm_proto_fasync(r->proto, fd, f, on) : -ENOTCONN;
}

/* Unpublishes the space if no file uses it (the session may close then). */
bool dsm_region_retract(struct dsm_region *r)
{
	bool unused;

	mutex_lock(&dsm_space_lock);
	unused = kref_read(&r->ref) == 1;
	if (unused && dsm_space == r)
		dsm_space = NULL;
	mutex_unlock(&dsm_space_lock);
	return unused;
}

static long dsm_ioctl_protect(struct dsm_region *r, void __user *arg)
{
	struct dsm_protect_req req;
	unsigned long flags;
	u32 *pages;
	int err, tries = 0;

	/* The shared space's protections are the protocol's alone. */
	if (r->proto)
		return -EPERM;
	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (!req.n || req.n > r->npages)
		return -EINVAL;
	pages = memdup_user(u64_to_user_ptr(req.pages), req.n * sizeof(u32));
	if (IS_ERR(pages))
		return PTR_ERR(pages);
	do {
		if (req.atomic)
			local_irq_save(flags);
		err = dsm_protect(r, pages, req.n, req.prot);
		if (req.atomic)
			local_irq_restore(flags);
		if (err == DSM_FENCED) {
			dsm_region_quiesce(r);
			err = 0;
		}
	} while (err == -EAGAIN && ++tries < 1000 && !cond_resched());
	kfree(pages);
	return err;
}

static long dsm_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct dsm_region *r = f->private_data;

	if (cmd == DSM_IOC_PROTECT)
		return r ? dsm_ioctl_protect(r, (void __user *)arg) : -ENXIO;
	if (!r || !r->proto)
		return -ENOTCONN;
	return dsm_proto_ioctl(r->proto, cmd, (void __user *)arg);
}

static const struct file_operations dsm_fops = {
	.owner = THIS_MODULE,
	.open = dsm_open,
	.mmap = dsm_mmap,
	.unlocked_ioctl = dsm_ioctl,
	.fasync = dsm_fasync,
	.release = dsm_release,
};

static struct miscdevice dsm_dev = {
	.minor = MISC_DYNAMIC_MINOR, .name = "dsm", .fops = &dsm_fops,
};

int dsm_region_init(void)
{
	return misc_register(&dsm_dev);
}

void dsm_region_exit(void)
{
	misc_deregister(&dsm_dev);
	/* Notifiers put by closed regions are freed after a grace period. */
	mmu_notifier_synchronize();
}
