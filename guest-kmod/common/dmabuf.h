/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dmabuf: zeroed kernel buffers mapped for an ib_device (ib_dma_* also
 * covers providers such as rdma_rxe that use virtual addresses). Compiled
 * into each module that uses it.
 */
#ifndef DMABUF_H
#define DMABUF_H

#include <rdma/ib_verbs.h>

/* NULL on failure; *dma is the address to put in SGEs. */
void *dmabuf_alloc(struct ib_device *dev, size_t bytes, u64 *dma,
		   enum dma_data_direction dir);
/* Does nothing for a NULL buffer. */
void dmabuf_free(struct ib_device *dev, void *buf, u64 dma, size_t bytes,
		 enum dma_data_direction dir);

#endif /* DMABUF_H */
