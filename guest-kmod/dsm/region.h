/* SPDX-License-Identifier: GPL-2.0 */
/*
 * DSM memory regions and the page-protection primitive. A region is a
 * set of kernel pages with a protection per page; /dev/dsm maps it into
 * one process with special (PFN) PTEs that follow those protections.
 */
#ifndef DSM_REGION_H
#define DSM_REGION_H

#include "uapi.h"

struct dsm_region;
struct dsm_proto;

int dsm_region_init(void);
void dsm_region_exit(void);
/* dsm_protect: done here, other CPUs' TLBs flushed asynchronously (region.c). */
#define DSM_FENCED	1
int dsm_protect(struct dsm_region *r, const u32 *pages, u32 n, int prot);
/* A shootdown is in flight: the protocol holds back page data and messages. */
bool dsm_region_fenced(struct dsm_region *r);
void dsm_region_quiesce(struct dsm_region *r);

/* The shared space of a DSM session: npages zeroed pages, all DSM_PROT_NONE. */
struct dsm_region *dsm_region_create(u32 npages);
void dsm_region_put(struct dsm_region *r);
struct page *dsm_region_page(struct dsm_region *r, u32 i);
int dsm_region_prot(struct dsm_region *r, u32 i);
/* The simulated user level (usim.c): prot[] changes, the process mprotects. */
void dsm_region_record(struct dsm_region *r, u32 i, int prot);
int dsm_region_set_usim(struct dsm_region *r, bool on);
/* The session whose space /dev/dsm maps (NULL: none); serialised by the caller. */
void dsm_region_publish(struct dsm_region *r, struct dsm_proto *d);
bool dsm_region_retract(struct dsm_region *r);

#endif /* DSM_REGION_H */
