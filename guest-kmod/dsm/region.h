/* SPDX-License-Identifier: GPL-2.0 */
/*
 * DSM memory regions (/dev/dsm mmap) and the page-protection primitive.
 * Shared with user space: the ioctl ABI below.
 */
#ifndef DSM_REGION_H
#define DSM_REGION_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define DSM_PROT_NONE	0
#define DSM_PROT_READ	1
#define DSM_PROT_RW	2

/* Change the protection of pages[0..n) (page indices in the region). */
struct dsm_protect_req {
	__u64 pages;	/* user pointer to __u32 page indices */
	__u32 n;
	__u32 prot;	/* DSM_PROT_* */
	__u32 atomic;	/* run the primitive with interrupts off (as a handler would) */
	__u32 rsvd;
};

#define DSM_IOC_PROTECT	_IOW('D', 1, struct dsm_protect_req)

#ifdef __KERNEL__
struct dsm_region;
int dsm_region_init(void);
void dsm_region_exit(void);
int dsm_protect(struct dsm_region *r, const u32 *pages, u32 n, int prot);
#endif

#endif /* DSM_REGION_H */
