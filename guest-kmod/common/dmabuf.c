// SPDX-License-Identifier: GPL-2.0
/* See dmabuf.h. */
#include <linux/slab.h>
#include "dmabuf.h"

void *dmabuf_alloc(struct ib_device *dev, size_t bytes, u64 *dma,
		   enum dma_data_direction dir)
{
	void *buf = kzalloc(bytes, GFP_KERNEL);

	if (!buf)
		return NULL;
	*dma = ib_dma_map_single(dev, buf, bytes, dir);
	if (ib_dma_mapping_error(dev, *dma)) {
		kfree(buf);
		return NULL;
	}
	return buf;
}

void dmabuf_free(struct ib_device *dev, void *buf, u64 dma, size_t bytes,
		 enum dma_data_direction dir)
{
	if (!buf)
		return;
	ib_dma_unmap_single(dev, dma, bytes, dir);
	kfree(buf);
}
