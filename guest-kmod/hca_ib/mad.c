// SPDX-License-Identifier: GPL-2.0
/*
 * process_mad: the MADs an HCA's firmware answers for its port. ib_mad calls
 * it for every MAD the port receives on QP0 and QP1 and for this node's own
 * directed-route SMPs to itself; ib_core's sysfs asks it for counters.
 * Subnet management goes to the SMA (sma.c), performance management to the
 * PMA (counters.c); anything else is left to ib_mad's agents.
 */
#include <rdma/ib_mad.h>
#include "hca_ib.h"

static int hca_process_mad(struct ib_device *ibdev, int flags, u32 port,
			   const struct ib_wc *in_wc, const struct ib_grh *in_grh,
			   const struct ib_mad *in, struct ib_mad *out,
			   size_t *out_size, u16 *out_pkey_index)
{
	struct hca_dev *dev = to_hdev(ibdev);

	switch (in->mad_hdr.mgmt_class) {
	case IB_MGMT_CLASS_SUBN_LID_ROUTED:
	case IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE:
		return hca_sma_process(dev, port, in, out);
	case IB_MGMT_CLASS_PERF_MGMT:
		return hca_pma_process(dev, port, in, out);
	default:
		return IB_MAD_RESULT_SUCCESS;
	}
}

const struct ib_device_ops hca_mad_ops = {
	.process_mad = hca_process_mad,
};
