// SPDX-License-Identifier: GPL-2.0
/*
 * The port's Subnet Management Agent, as an HCA's firmware runs one: it
 * answers Gets of NodeDescription, NodeInfo, GUIDInfo, PortInfo and
 * P_KeyTable, LID-routed (from QP0 on the wire: another node's smpquery)
 * or directed-route (this node's own tools, through ib_mad's local path).
 *
 * The fabric is the subnet manager and configures the port itself, so the
 * agent takes no Sets: a Set is answered with "unsupported", and nothing a
 * remote node sends changes the port.
 */
#include <rdma/ib_mad.h>
#include <rdma/ib_smi.h>
#include "hca_ib.h"

#define SMA_LINK_WIDTH_SUPPORTED	(IB_WIDTH_1X | IB_WIDTH_4X)
/* LinkSpeedSupported/Enabled: SDR, DDR and QDR (IBA 14.2.5.6). */
#define SMA_LINK_SPEEDS			0x7
#define SMA_LINK_SPEED_QDR		0x4
/* LinkDownDefaultState: Polling. */
#define SMA_LINK_DOWN_DEFAULT		0x2
/* One data VL (VL0): VLCap and OperationalVLs. */
#define SMA_VL0_ONLY			0x1
/* 4.096 us * 2^18, about 1 s, as the SA and the PMA say. */
#define SMA_RESP_TIME_VALUE		18

static u16 sma_node_info(struct hca_dev *dev, u32 port, void *data)
{
	struct ib_node_info *ni = data;
	u32 vendor = HCA_PCI_VENDOR_HCABENCH;

	ni->base_version = IB_MGMT_BASE_VERSION;
	ni->class_version = 1;
	ni->node_type = RDMA_NODE_IB_CA;
	ni->num_ports = dev->ibdev.phys_port_cnt;
	ni->sys_guid = dev->ibdev.node_guid;
	ni->node_guid = dev->ibdev.node_guid;
	ni->port_guid = cpu_to_be64(dev->port.port_guid);
	ni->partition_cap = cpu_to_be16(HCA_PKEY_TABLE_LEN);
	ni->device_id = cpu_to_be16(HCA_PCI_DEVICE_HCABENCH);
	ni->revision = cpu_to_be32(dev->attr.fw_ver);
	ni->local_port_num = port;
	ni->vendor_id[0] = vendor >> 16;
	ni->vendor_id[1] = vendor >> 8;
	ni->vendor_id[2] = vendor;
	return 0;
}

static u16 sma_port_info(struct hca_dev *dev, u32 port, u32 attr_mod,
			 void *data)
{
	struct ib_port_info *pi = data;
	struct ib_port_attr a;

	/* A CA's ports are named from 1; 0 is the port the SMP came in on. */
	if (attr_mod && attr_mod != port)
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	if (ib_query_port(&dev->ibdev, port, &a))
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	pi->gid_prefix = cpu_to_be64(dev->port.gid_prefix);
	pi->lid = cpu_to_be16(a.lid);
	pi->sm_lid = cpu_to_be16(a.sm_lid);
	pi->cap_mask = cpu_to_be32(a.port_cap_flags);
	pi->local_port_num = port;
	pi->link_width_enabled = a.active_width;
	pi->link_width_supported = SMA_LINK_WIDTH_SUPPORTED;
	pi->link_width_active = a.active_width;
	pi->linkspeed_portstate = SMA_LINK_SPEEDS << 4 | a.state;
	pi->portphysstate_linkdown = a.phys_state << 4 | SMA_LINK_DOWN_DEFAULT;
	pi->mkeyprot_resv_lmc = a.lmc & 0x7;
	pi->linkspeedactive_enabled = SMA_LINK_SPEED_QDR << 4 | SMA_LINK_SPEEDS;
	pi->neighbormtu_mastersmsl = a.active_mtu << 4 | (a.sm_sl & 0xf);
	pi->vlcap_inittype = SMA_VL0_ONLY << 4;
	pi->inittypereply_mtucap = a.max_mtu & 0xf;
	pi->operationalvl_pei_peo_fpi_fpo = SMA_VL0_ONLY << 4;
	pi->pkey_violations = cpu_to_be16(a.bad_pkey_cntr);
	pi->qkey_violations = cpu_to_be16(a.qkey_viol_cntr);
	pi->guid_cap = a.gid_tbl_len;
	pi->clientrereg_resv_subnetto = a.subnet_timeout & 0x1f;
	pi->resv_resptimevalue = SMA_RESP_TIME_VALUE;
	return 0;
}

/*
 * GUIDInfo: eight GUIDs a block, as many as the GID table (GUIDCap); the
 * port has one, its port GUID, and no alias GUIDs.
 */
static u16 sma_guid_info(struct hca_dev *dev, u32 attr_mod, void *data)
{
	__be64 *guids = data;

	if (attr_mod)
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	guids[0] = cpu_to_be64(dev->port.port_guid);
	return 0;
}

/* P_KeyTable: 32 entries a block; the table (16 entries) fits block 0. */
static u16 sma_pkey_table(struct hca_dev *dev, u32 attr_mod, void *data)
{
	struct hca_pkey_table t;
	__be16 *pkeys = data;
	int i;

	if (attr_mod & 0xffff)
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	if (hca_cmd(dev, HCA_CMD_QUERY_PKEYS, NULL, 0, &t, sizeof(t)))
		return IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE;
	for (i = 0; i < HCA_PKEY_TABLE_LEN; i++)
		pkeys[i] = cpu_to_be16(t.pkeys[i]);
	return 0;
}

/*
 * Answers an SMP Get or Set in *out (a copy of *in); SUCCESS alone for what
 * is not the agent's (responses to this node's own queries, traps), which
 * ib_mad then hands to its agents.
 */
int hca_sma_process(struct hca_dev *dev, u32 port, const struct ib_mad *in,
		    struct ib_mad *out)
{
	const struct ib_smp *smp = (const struct ib_smp *)in;
	struct ib_smp *resp = (struct ib_smp *)out;
	u32 attr_mod = be32_to_cpu(smp->attr_mod);
	u16 status = 0;

	if (smp->method != IB_MGMT_METHOD_GET &&
	    smp->method != IB_MGMT_METHOD_SET)
		return IB_MAD_RESULT_SUCCESS;
	memcpy(out, in, sizeof(*out));
	resp->method = IB_MGMT_METHOD_GET_RESP;
	memset(resp->data, 0, sizeof(resp->data));
	if (smp->class_version != 1)
		status = IB_MGMT_MAD_STATUS_BAD_VERSION;
	else if (smp->method == IB_MGMT_METHOD_SET)
		status = IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB;
	else if (smp->attr_id == IB_SMP_ATTR_NODE_DESC)
		memcpy(resp->data, dev->ibdev.node_desc, IB_DEVICE_NODE_DESC_MAX);
	else if (smp->attr_id == IB_SMP_ATTR_NODE_INFO)
		status = sma_node_info(dev, port, resp->data);
	else if (smp->attr_id == IB_SMP_ATTR_GUID_INFO)
		status = sma_guid_info(dev, attr_mod, resp->data);
	else if (smp->attr_id == IB_SMP_ATTR_PORT_INFO)
		status = sma_port_info(dev, port, attr_mod, resp->data);
	else if (smp->attr_id == IB_SMP_ATTR_PKEY_TABLE)
		status = sma_pkey_table(dev, attr_mod, resp->data);
	else
		status = IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB;
	/* ib_mad's SMI turns the route round; the D bit says it is a reply. */
	resp->status = cpu_to_be16(status);
	if (smp->mgmt_class == IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE)
		resp->status |= IB_SMP_DIRECTION;
	return IB_MAD_RESULT_SUCCESS | IB_MAD_RESULT_REPLY;
}
