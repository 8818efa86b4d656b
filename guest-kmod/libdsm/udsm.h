/* SPDX-License-Identifier: GPL-2.0 */
/*
 * libdsm's user-level DSM (udsm.c): the protocol run in the application's
 * own process over libibverbs, chosen by DSM_MODE=user or user-poll in the
 * environment. libdsm.c keeps the API and the threads; these are the calls
 * it makes instead of /dev/dsm's ioctls when the mode is user-level.
 */
#ifndef LIBDSM_UDSM_H
#define LIBDSM_UDSM_H

#include "libdsm.h"

/* 0: the kernel DSM (DSM_MODE unset or "kernel"); 1: user; 2: user-poll. Dies on others. */
int udsm_mode(void);
/* Connects to every node, maps the shared space; fills info, *base and *size. */
void udsm_init(int mode, struct dsm_info *info, uint8_t **base, size_t *size);
/* One node-level barrier (libdsm.c does the node's threads' part). */
void udsm_barrier(void);
void udsm_lock(unsigned id);
void udsm_unlock(unsigned id);
void udsm_stats(struct dsm_stats_user *st);
/* At exit: the last barrier (peers may still need our pages) and the sends' completions. */
void udsm_exit(void);

#endif /* LIBDSM_UDSM_H */
