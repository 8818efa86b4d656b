/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * The responses of the verbs that carry udata: ib_uverbs' standard response
 * followed by hca_ib's (hca_uapi.h). create_qp alone sends request udata.
 *
 * rdma-core's providers declare these with DECLARE_DRV_CMD over headers
 * generated from the kernel's; two structs per verb say the same here.
 */
#ifndef HCAB_ABI_H
#define HCAB_ABI_H

#include <stddef.h>
#include <infiniband/kern-abi.h>
#include "hca_uapi.h"

struct hcab_get_context_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct hca_ualloc_ucontext_resp drv;
};

struct hcab_create_cq_resp {
	struct ib_uverbs_create_cq_resp ibv_resp;
	struct hca_ucreate_cq_resp drv;
};

/* resize_cq answers as create_cq does, for the new ring. */
struct hcab_resize_cq_resp {
	struct ib_uverbs_resize_cq_resp ibv_resp;
	struct hca_ucreate_cq_resp drv;
};

struct hcab_create_qp {
	struct ibv_create_qp ibv_cmd;
	struct hca_ucreate_qp drv;
};

struct hcab_create_qp_resp {
	struct ib_uverbs_create_qp_resp ibv_resp;
	struct hca_ucreate_qp_resp drv;
};

struct hcab_create_srq_resp {
	struct ib_uverbs_create_srq_resp ibv_resp;
	struct hca_ucreate_srq_resp drv;
};

/*
 * The kernel copies its response to udata's outbuf, which begins right
 * after the standard response: no padding may come between the two.
 */
#define HCAB_RESP_CHECK(t)						\
	_Static_assert(offsetof(struct t, drv) ==			\
		       sizeof(((struct t *)0)->ibv_resp), #t)
HCAB_RESP_CHECK(hcab_get_context_resp);
HCAB_RESP_CHECK(hcab_create_cq_resp);
HCAB_RESP_CHECK(hcab_resize_cq_resp);
HCAB_RESP_CHECK(hcab_create_qp_resp);
HCAB_RESP_CHECK(hcab_create_srq_resp);

_Static_assert(sizeof(struct hca_ualloc_ucontext_resp) == 32, "ucontext resp");
_Static_assert(sizeof(struct hca_ucreate_cq_resp) == 24, "create_cq resp");
_Static_assert(sizeof(struct hca_ucreate_qp_resp) == 32, "create_qp resp");
_Static_assert(sizeof(struct hca_ucreate_srq_resp) == 24, "create_srq resp");

#endif /* HCAB_ABI_H */
