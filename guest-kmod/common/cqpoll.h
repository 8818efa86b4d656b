/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Whether a CQ's completion handler may poll that CQ where it was called.
 *
 * A hardware-style provider (hcab0, mlx5) calls the handler from its
 * interrupt handler, and rxe called it from a tasklet; there a consumer
 * polls and re-arms in the handler (the paper's "interrupt" mode). rxe on
 * newer kernels (6.12 among them) calls it from its own task with the CQ's
 * lock held and interrupts off (rxe_cq_post), where ib_poll_cq on that CQ
 * spins on the lock it already holds and the CPU hangs. A handler that
 * finds interrupts off outside a hard interrupt is under some provider
 * lock: it must hand the CQ to process context instead.
 */
#ifndef CQPOLL_H
#define CQPOLL_H

#include <linux/irqflags.h>
#include <linux/preempt.h>

static inline bool cq_handler_may_poll(void)
{
	return in_hardirq() || !irqs_disabled();
}

#endif /* CQPOLL_H */
