/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What differs between the kernels the guest modules build for (Debian's
 * 6.1 and 6.12, a developer's own tree), in one place. Each difference is
 * decided by a compile test of the feature itself (compat/conftest.sh
 * writes generated/hcab_config.h) or by __has_include, never by the
 * version number, so backports and trees between releases build too.
 * Modules use the names below and no #if of their own.
 */
#ifndef HCAB_COMPAT_H
#define HCAB_COMPAT_H

#include <linux/mm.h>
#include <rdma/ib_verbs.h>
#include "generated/hcab_config.h"

/* 6.12 moved the unaligned accessors out of asm/. */
#if __has_include(<linux/unaligned.h>)
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

/*
 * ib_device_ops.create_cq's last argument: the uverbs attribute bundle
 * since 6.11 (its driver_udata is the old ib_udata), ib_udata before.
 * NULL for a kernel consumer's CQ either way.
 */
#ifdef HCAB_HAVE_CREATE_CQ_ATTRS
#include <rdma/uverbs_ioctl.h>

typedef struct uverbs_attr_bundle hcab_create_cq_arg;

static inline struct ib_udata *hcab_create_cq_udata(hcab_create_cq_arg *arg)
{
	return arg ? &arg->driver_udata : NULL;
}
#else
typedef struct ib_udata hcab_create_cq_arg;

static inline struct ib_udata *hcab_create_cq_udata(hcab_create_cq_arg *arg)
{
	return arg;
}
#endif

/*
 * vma->vm_flags became read-only in 6.3: changes go through
 * vm_flags_set(), which also takes the VMA's write lock where per-VMA
 * locking needs it.
 */
static inline void hcab_vm_flags_set(struct vm_area_struct *vma,
				     vm_flags_t flags)
{
#ifdef HCAB_HAVE_VM_FLAGS_SET
	vm_flags_set(vma, flags);
#else
	vma->vm_flags |= flags;
#endif
}

/*
 * The device capability flag for IBTA 1.5's ATOMIC WRITE (6.2+); none
 * before, where no consumer can ask for the operation either.
 */
#ifdef HCAB_HAVE_DEVICE_ATOMIC_WRITE
#define HCAB_DEVICE_ATOMIC_WRITE IB_DEVICE_ATOMIC_WRITE
#else
#define HCAB_DEVICE_ATOMIC_WRITE 0
#endif

#endif /* HCAB_COMPAT_H */
