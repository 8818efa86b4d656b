// SPDX-License-Identifier: GPL-2.0
/*
 * The port's counters, read from the device (QUERY_COUNTERS), shown two ways:
 *
 * - as hardware counters (rdma_hw_stats): every counter the device keeps,
 *   under /sys/class/infiniband/hcab0/ports/1/hw_counters/ and in
 *   `rdma statistic show link hcab0/1`;
 * - as IBA's Performance Management agent (through mad.c's process_mad):
 *   PortCounters and PortCountersExtended Gets and Sets (resets), locally
 *   for ib_core's /sys/class/infiniband/hcab0/ports/1/counters/ and on QP1
 *   for any node's perfquery, as an HCA's firmware would.
 *
 * The device's counters never go back; a PMA reset keeps a base per PMA
 * field here, which later reads subtract (hardware counters are not reset).
 */
#include <linux/slab.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_pma.h>
#include "hca_ib.h"

static const struct rdma_stat_desc hca_hw_stat_descs[] = {
	[HCA_CTR_TX_PACKETS] = { .name = "tx_packets" },
	[HCA_CTR_RX_PACKETS] = { .name = "rx_packets" },
	[HCA_CTR_TX_OCTETS] = { .name = "tx_octets" },
	[HCA_CTR_RX_OCTETS] = { .name = "rx_octets" },
	[HCA_CTR_TX_MCAST_PACKETS] = { .name = "tx_mcast_packets" },
	[HCA_CTR_RX_MCAST_PACKETS] = { .name = "rx_mcast_packets" },
	[HCA_CTR_TX_DISCARDS] = { .name = "tx_discards" },
	[HCA_CTR_LINK_DOWNED] = { .name = "link_downed" },
	[HCA_CTR_ICRC_ERRORS] = { .name = "icrc_errors" },
	[HCA_CTR_PKEY_VIOLATIONS] = { .name = "pkey_violations" },
	[HCA_CTR_RETRANSMITS] = { .name = "retransmits" },
	[HCA_CTR_SEQ_NAKS] = { .name = "seq_naks_received" },
	[HCA_CTR_RNR_NAKS] = { .name = "rnr_naks_received" },
	[HCA_CTR_RETRY_EXCEEDED] = { .name = "retry_exceeded" },
	[HCA_CTR_DUPLICATES] = { .name = "duplicate_requests" },
	[HCA_CTR_UD_DROPPED] = { .name = "ud_dropped" },
	[HCA_CTR_RC_DROPPED] = { .name = "rc_dropped" },
	[HCA_CTR_REVOKED] = { .name = "revoked_accesses" },
	[HCA_CTR_READ_GAPS] = { .name = "read_gaps" },
	[HCA_CTR_DMA_FAULTS] = { .name = "dma_faults" },
	[HCA_CTR_CQES_LOST] = { .name = "cqes_lost" },
	[HCA_CTR_EVENTS_LOST] = { .name = "events_lost" },
};

static_assert(ARRAY_SIZE(hca_hw_stat_descs) == HCA_COUNTERS_LEN);

/* Every counter the device keeps, eight per command. */
static int hca_read_counters(struct hca_dev *dev, u64 *v)
{
	struct hca_cmd_counters in = {};
	struct hca_counters out;
	u32 i, n;
	int err;

	for (i = 0; i < HCA_COUNTERS_LEN; i += n) {
		in.first = i;
		err = hca_cmd(dev, HCA_CMD_QUERY_COUNTERS, &in, sizeof(in), &out,
			      sizeof(out));
		if (err)
			return err;
		n = min_t(u32, ARRAY_SIZE(out.values), HCA_COUNTERS_LEN - i);
		memcpy(v + i, out.values, n * sizeof(*v));
	}
	return 0;
}

static struct rdma_hw_stats *hca_alloc_hw_port_stats(struct ib_device *ibdev,
						     u32 port)
{
	return rdma_alloc_hw_stats_struct(hca_hw_stat_descs, HCA_COUNTERS_LEN,
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

static int hca_get_hw_stats(struct ib_device *ibdev,
			    struct rdma_hw_stats *stats, u32 port, int index)
{
	int err = hca_read_counters(to_hdev(ibdev), stats->value);

	return err ? err : stats->num_counters;
}

/* The PMA's fields, each with its own reset base. */
enum hca_pma_field {
	PMA_XMIT_DATA,
	PMA_RCV_DATA,
	PMA_XMIT_PKTS,
	PMA_RCV_PKTS,
	PMA_UNI_XMIT_PKTS,
	PMA_UNI_RCV_PKTS,
	PMA_MC_XMIT_PKTS,
	PMA_MC_RCV_PKTS,
	PMA_LINK_DOWNED,
	PMA_RCV_ERRORS,
	PMA_XMIT_DISCARDS,
	PMA_RCV_CONSTRAINT,
	PMA_FIELDS
};

static_assert(PMA_FIELDS == HCA_IB_PMA_FIELDS);

/* PortCounters' CounterSelect bits for the fields above (IBA 16.1.3.5). */
static const struct {
	u16 select;
	enum hca_pma_field field;
} hca_pma_select[] = {
	{ 0x0004, PMA_LINK_DOWNED },
	{ 0x0008, PMA_RCV_ERRORS },
	{ 0x0040, PMA_XMIT_DISCARDS },
	{ 0x0100, PMA_RCV_CONSTRAINT },
	{ 0x1000, PMA_XMIT_DATA },
	{ 0x2000, PMA_RCV_DATA },
	{ 0x4000, PMA_XMIT_PKTS },
	{ 0x8000, PMA_RCV_PKTS },
};

/* The raw value behind each field; data counts in units of 4 octets. */
static void hca_pma_raw(const u64 *c, u64 *f)
{
	f[PMA_XMIT_DATA] = c[HCA_CTR_TX_OCTETS] / 4;
	f[PMA_RCV_DATA] = c[HCA_CTR_RX_OCTETS] / 4;
	f[PMA_XMIT_PKTS] = c[HCA_CTR_TX_PACKETS];
	f[PMA_RCV_PKTS] = c[HCA_CTR_RX_PACKETS];
	f[PMA_MC_XMIT_PKTS] = c[HCA_CTR_TX_MCAST_PACKETS];
	f[PMA_MC_RCV_PKTS] = c[HCA_CTR_RX_MCAST_PACKETS];
	f[PMA_UNI_XMIT_PKTS] = c[HCA_CTR_TX_PACKETS] - c[HCA_CTR_TX_MCAST_PACKETS];
	f[PMA_UNI_RCV_PKTS] = c[HCA_CTR_RX_PACKETS] - c[HCA_CTR_RX_MCAST_PACKETS];
	f[PMA_LINK_DOWNED] = c[HCA_CTR_LINK_DOWNED];
	f[PMA_RCV_ERRORS] = c[HCA_CTR_ICRC_ERRORS];
	f[PMA_XMIT_DISCARDS] = c[HCA_CTR_TX_DISCARDS];
	f[PMA_RCV_CONSTRAINT] = c[HCA_CTR_PKEY_VIOLATIONS];
}

/*
 * The PMA's view now: each field less its base; the fields whose bit is in
 * 'reset' (an index mask of enum hca_pma_field) start again from 0.
 */
static int hca_pma_read(struct hca_dev *dev, u32 reset, u64 *f)
{
	u64 c[HCA_COUNTERS_LEN];
	int err, i;

	err = hca_read_counters(dev, c);
	if (err)
		return err;
	hca_pma_raw(c, f);
	mutex_lock(&dev->pma_mutex);
	for (i = 0; i < PMA_FIELDS; i++) {
		if (reset & BIT(i))
			dev->pma_base[i] = f[i];
		f[i] -= dev->pma_base[i];
	}
	mutex_unlock(&dev->pma_mutex);
	return 0;
}

static u32 sat32(u64 v)
{
	return min_t(u64, v, U32_MAX);
}

static u16 sat16(u64 v)
{
	return min_t(u64, v, U16_MAX);
}

static u8 sat8(u64 v)
{
	return min_t(u64, v, U8_MAX);
}

static u16 hca_pma_counters(struct hca_dev *dev, bool set, void *data)
{
	struct ib_pma_portcounters *pc = data;
	u16 sel = be16_to_cpu(pc->counter_select);
	u64 f[PMA_FIELDS];
	u32 reset = 0;
	int i;

	for (i = 0; set && i < ARRAY_SIZE(hca_pma_select); i++)
		if (sel & hca_pma_select[i].select)
			reset |= BIT(hca_pma_select[i].field);
	if (hca_pma_read(dev, reset, f))
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	/* No symbol, link, physical, relay or VL15 errors, and no waits. */
	pc->symbol_error_counter = 0;
	pc->link_error_recovery_counter = 0;
	pc->port_rcv_remphys_errors = 0;
	pc->port_rcv_switch_relay_errors = 0;
	pc->port_xmit_constraint_errors = 0;
	pc->reserved1 = 0;
	pc->link_overrun_errors = 0;
	pc->reserved2 = 0;
	pc->vl15_dropped = 0;
	pc->port_xmit_wait = 0;
	pc->link_downed_counter = sat8(f[PMA_LINK_DOWNED]);
	pc->port_rcv_errors = cpu_to_be16(sat16(f[PMA_RCV_ERRORS]));
	pc->port_xmit_discards = cpu_to_be16(sat16(f[PMA_XMIT_DISCARDS]));
	pc->port_rcv_constraint_errors = sat8(f[PMA_RCV_CONSTRAINT]);
	pc->port_xmit_data = cpu_to_be32(sat32(f[PMA_XMIT_DATA]));
	pc->port_rcv_data = cpu_to_be32(sat32(f[PMA_RCV_DATA]));
	pc->port_xmit_packets = cpu_to_be32(sat32(f[PMA_XMIT_PKTS]));
	pc->port_rcv_packets = cpu_to_be32(sat32(f[PMA_RCV_PKTS]));
	return 0;
}

static u16 hca_pma_counters_ext(struct hca_dev *dev, bool set, void *data)
{
	struct ib_pma_portcounters_ext *pc = data;
	u16 sel = be16_to_cpu(pc->counter_select);
	u64 f[PMA_FIELDS];
	/* Its select bits 0-7 name the eight 64-bit fields in enum order. */
	u32 reset = set ? (sel & 0xff) : 0;

	if (hca_pma_read(dev, reset, f))
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	pc->reserved1 = 0;
	pc->port_xmit_data = cpu_to_be64(f[PMA_XMIT_DATA]);
	pc->port_rcv_data = cpu_to_be64(f[PMA_RCV_DATA]);
	pc->port_xmit_packets = cpu_to_be64(f[PMA_XMIT_PKTS]);
	pc->port_rcv_packets = cpu_to_be64(f[PMA_RCV_PKTS]);
	pc->port_unicast_xmit_packets = cpu_to_be64(f[PMA_UNI_XMIT_PKTS]);
	pc->port_unicast_rcv_packets = cpu_to_be64(f[PMA_UNI_RCV_PKTS]);
	pc->port_multicast_xmit_packets = cpu_to_be64(f[PMA_MC_XMIT_PKTS]);
	pc->port_multicast_rcv_packets = cpu_to_be64(f[PMA_MC_RCV_PKTS]);
	return 0;
}

static void hca_pma_class_port_info(void *data)
{
	struct ib_class_port_info *cpi = data;

	memset(cpi, 0, sizeof(*cpi));
	cpi->base_version = 1;
	cpi->class_version = 1;
	/* PortCountersExtended with all its fields: ib_core's sysfs reads them. */
	cpi->capability_mask = IB_PMA_CLASS_CAP_EXT_WIDTH;
	/* Response time value 18, as for the SA: 4.096 us * 2^18, about 1 s. */
	cpi->cap_mask2_resp_time = cpu_to_be32(18);
}

/*
 * Answers a Performance Management Get or Set for this port in *out; leaves
 * PMA responses to this node's own queries to ib_mad.
 */
int hca_pma_process(struct hca_dev *dev, u32 port, const struct ib_mad *in,
		    struct ib_mad *out)
{
	const struct ib_mad_hdr *hdr = &in->mad_hdr;
	struct ib_pma_mad *resp = (struct ib_pma_mad *)out;
	bool set = hdr->method == IB_MGMT_METHOD_SET;
	u8 *data = resp->data;
	u16 status = 0;

	if (hdr->method != IB_MGMT_METHOD_GET && !set)
		return IB_MAD_RESULT_SUCCESS;
	memcpy(out, in, sizeof(*out));
	resp->mad_hdr.method = IB_MGMT_METHOD_GET_RESP;
	if (hdr->class_version != 1) {
		status = IB_MGMT_MAD_STATUS_BAD_VERSION;
	} else if (hdr->attr_id == IB_PMA_CLASS_PORT_INFO && !set) {
		hca_pma_class_port_info(data);
	} else if (hdr->attr_id == IB_PMA_PORT_COUNTERS ||
		   hdr->attr_id == IB_PMA_PORT_COUNTERS_EXT) {
		/* PortSelect: this port (one port: 0 names it too, as on HCAs). */
		u8 sel = data[1];

		if (sel != port && sel != 0)
			status = IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
		else if (hdr->attr_id == IB_PMA_PORT_COUNTERS)
			status = hca_pma_counters(dev, set, data);
		else
			status = hca_pma_counters_ext(dev, set, data);
	} else {
		status = IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB;
	}
	resp->mad_hdr.status = cpu_to_be16(status);
	return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_REPLY;
}

const struct ib_device_ops hca_counter_ops = {
	.alloc_hw_port_stats = hca_alloc_hw_port_stats,
	.get_hw_stats = hca_get_hw_stats,
};
