// SPDX-License-Identifier: GPL-2.0
/* ib_device_ops.create_cq takes a uverbs_attr_bundle (6.11+), not ib_udata. */
#include <rdma/ib_verbs.h>

_Static_assert(__builtin_types_compatible_p(
	typeof(((struct ib_device_ops *)0)->create_cq),
	int (*)(struct ib_cq *, const struct ib_cq_init_attr *,
		struct uverbs_attr_bundle *)), "create_cq takes attrs");
