// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * Device matching, the context (its UAR and doorbell pages), the ops table
 * libibverbs calls through, and device and port queries.
 */
#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hcab.h"
#include "hcab-abi.h"

/*
 * hca_ib registers with RDMA_DRIVER_UNKNOWN and no PCI ID of its own that
 * libibverbs would know, so the device is found by its name, hcab<N>.
 */
static const struct verbs_match_ent hcab_match_table[] = {
	VERBS_NAME_MATCH("hcab", NULL),
	{}
};

/* Maps one of the kernel's mmap cookies on the context's command fd. */
void *hcab_mmap(struct hcab_context *ctx, uint64_t offset, size_t bytes,
		size_t *map_bytes)
{
	size_t len = (bytes + ctx->page_size - 1) & ~(ctx->page_size - 1);
	void *p;

	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED,
		 ctx->ibv_ctx.context.cmd_fd, offset);
	if (p == MAP_FAILED)
		return NULL;
	*map_bytes = len;
	return p;
}

static int hcab_query_device_ex(struct ibv_context *ibctx,
				const struct ibv_query_device_ex_input *input,
				struct ibv_device_attr_ex *attr,
				size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(ibctx, input, attr, attr_size, &resp,
				       &resp_size);
	if (ret)
		return ret;
	/* The kernel hands over a number; ibv_devinfo shows this string. */
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

static int hcab_query_port(struct ibv_context *ibctx, uint8_t port,
			   struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd = {};

	return ibv_cmd_query_port(ibctx, port, attr, &cmd, sizeof(cmd));
}

static void hcab_free_context(struct ibv_context *ibctx)
{
	struct hcab_context *ctx = to_hctx(ibctx);

	munmap(ctx->db_page, ctx->page_size);
	munmap(ctx->uar, ctx->page_size);
	pthread_mutex_destroy(&ctx->qp_table_mutex);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

/*
 * Not set, and why: cq_event (each arm carries a new sequence number of its
 * own, so an event needs no bookkeeping here) and async_event (the kernel
 * raises every event; no user-space state depends on one). libibverbs' own
 * no-op versions stand in for them.
 */
static const struct verbs_context_ops hcab_ctx_ops = {
	.alloc_mw = hcab_alloc_mw,
	.alloc_pd = hcab_alloc_pd,
	.bind_mw = hcab_bind_mw,
	.attach_mcast = hcab_attach_mcast,
	.create_ah = hcab_create_ah,
	.create_cq = hcab_create_cq,
	.create_cq_ex = hcab_create_cq_ex,
	.create_qp = hcab_create_qp,
	.create_qp_ex = hcab_create_qp_ex,
	.create_srq = hcab_create_srq,
	.dealloc_mw = hcab_dealloc_mw,
	.dealloc_pd = hcab_dealloc_pd,
	.dereg_mr = hcab_dereg_mr,
	.destroy_ah = hcab_destroy_ah,
	.destroy_cq = hcab_destroy_cq,
	.destroy_qp = hcab_destroy_qp,
	.destroy_srq = hcab_destroy_srq,
	.detach_mcast = hcab_detach_mcast,
	.free_context = hcab_free_context,
	.modify_qp = hcab_modify_qp,
	.modify_srq = hcab_modify_srq,
	.poll_cq = hcab_poll_cq,
	.post_recv = hcab_post_recv,
	.post_send = hcab_post_send,
	.resize_cq = hcab_resize_cq,
	.post_srq_recv = hcab_post_srq_recv,
	.query_device_ex = hcab_query_device_ex,
	.query_port = hcab_query_port,
	.query_qp = hcab_query_qp,
	.query_srq = hcab_query_srq,
	.reg_mr = hcab_reg_mr,
	.req_notify_cq = hcab_req_notify_cq,
};

static struct verbs_context *hcab_alloc_context(struct ibv_device *ibdev,
						int cmd_fd, void *private_data)
{
	struct hcab_get_context_resp resp = {};
	struct ibv_get_context cmd = {};
	struct hcab_context *ctx;
	size_t len;
	int ret;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	ctx->page_size = sysconf(_SC_PAGESIZE);
	pthread_mutex_init(&ctx->qp_table_mutex, NULL);
	ret = ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd),
				  &resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_free;
	}
	if (resp.drv.db_reg_offset % 4 ||
	    resp.drv.db_reg_offset > ctx->page_size - 4) {
		verbs_err(&ctx->ibv_ctx,
			  "doorbell register at %#x: not in a page\n",
			  resp.drv.db_reg_offset);
		errno = EINVAL;
		goto err_free;
	}
	ctx->doorbell_peer = resp.drv.doorbell_peer;
	ctx->uar = hcab_mmap(ctx, resp.drv.uar_mmap_offset, ctx->page_size, &len);
	if (!ctx->uar)
		goto err_free;
	hcab_sq_ring_init(ctx, resp.drv.caps);
	ctx->db_page = hcab_mmap(ctx, resp.drv.db_mmap_offset, ctx->page_size,
				 &len);
	if (!ctx->db_page)
		goto err_uar;
	ctx->db_reg = (char *)ctx->db_page + resp.drv.db_reg_offset;
	verbs_set_ops(&ctx->ibv_ctx, &hcab_ctx_ops);
	return &ctx->ibv_ctx;

err_uar:
	munmap(ctx->uar, ctx->page_size);
err_free:
	ret = errno;
	pthread_mutex_destroy(&ctx->qp_table_mutex);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	errno = ret;
	return NULL;
}

static struct verbs_device *hcab_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct hcab_device *dev = calloc(1, sizeof(*dev));

	return dev ? &dev->ibv_dev : NULL;
}

static void hcab_uninit_device(struct verbs_device *vdev)
{
	free(container_of(vdev, struct hcab_device, ibv_dev));
}

static const struct verbs_device_ops hcab_dev_ops = {
	.name = "hcab",
	.match_min_abi_version = HCA_UVERBS_ABI_VERSION,
	.match_max_abi_version = HCA_UVERBS_ABI_VERSION,
	.match_table = hcab_match_table,
	.alloc_device = hcab_device_alloc,
	.uninit_device = hcab_uninit_device,
	.alloc_context = hcab_alloc_context,
};
PROVIDER_DRIVER(hcab, hcab_dev_ops);
