// SPDX-License-Identifier: GPL-2.0
/*
 * The two-VM part of the test guest: through the mailbox it allocates a
 * PD, a physical (DMA) MR, a CQ and an RC QP, publishes its LID, QPN,
 * rkey and buffer address in the exchange block, waits for the host to
 * mirror the peer's, brings the QP to RTS and meets the peer there again. The writer (role 1) posts
 * one signaled RDMA Write of BUF_BYTES (several packets at a 1 KiB MTU)
 * into the target's buffer and waits for its CQE; the target (role 2)
 * waits for the last word to land and checks every byte.
 */
#include "hcatest.h"

#define ROLE_WRITER	1
#define ROLE_TARGET	2
#define BUF_BYTES	8192
#define SQ_LOG		2
#define SQ_SHIFT	7	/* 64-byte header + one SGE fits in 128 */
#define CQ_LOG		2
#define MTU_1024	3

static unsigned char buf[BUF_BYTES] __attribute__((aligned(4096)));
static unsigned char sq[1 << (SQ_LOG + SQ_SHIFT)] __attribute__((aligned(4096)));
static unsigned char rq[1 << HCA_MIN_RQ_WQE_SHIFT] __attribute__((aligned(4096)));
static struct hca_cqe cq[1 << CQ_LOG] __attribute__((aligned(4096)));

static unsigned long bar0_base, bar2_base;
static unsigned int db_peer, cmd_seq, cq_num;

static unsigned char pattern(unsigned int i)
{
	return (unsigned char)(i * 7 + 3 + (i >> 8));
}

static volatile struct hca_cmd_mailbox *mailbox(void)
{
	return (volatile struct hca_cmd_mailbox *)(bar2_base +
						   HCA_BAR2_MAILBOX_OFFSET);
}

static void ring(unsigned int class)
{
	mmio_write32(bar0_base + HCA_BAR0_DOORBELL,
		     db_peer << HCA_DOORBELL_PEER_SHIFT | class);
}

/* Runs one command; its status (HCA_CMD_*), ~0 on a timeout. */
static unsigned int cmd(unsigned int op, const void *in, unsigned int len,
			unsigned int *handle)
{
	volatile struct hca_cmd_mailbox *mb = mailbox();
	const unsigned char *src = in;
	unsigned long long t0;
	unsigned long spins;
	unsigned int i;

	mb->opcode = op;
	mb->flags = 0;
	for (i = 0; i < sizeof(mb->input); i++)
		mb->input[i] = i < len ? src[i] : 0;
	mb->seq = ++cmd_seq;
	ring(HCA_DB_CMD);
	for (spins = 0, t0 = rdtsc(); mb->done_seq != cmd_seq;)
		if (waited_too_long(&spins, t0))
			return ~0u;
	if (handle)
		*handle = *(volatile __u32 *)mb->output;
	return mb->status;
}

static int modify_qp(unsigned int qpn, unsigned int mask,
		     const struct hca_qp_attr *a)
{
	struct hca_cmd_modify_qp m = { .qpn = qpn, .attr_mask = mask,
				       .attr = *a };

	return cmd(HCA_CMD_MODIFY_QP, &m, sizeof(m), 0);
}

static const char *bring_up(unsigned int qpn, const struct xchg_side *peer)
{
	struct hca_qp_attr init = {
		.state = HCA_QPS_INIT, .port_num = 1,
		.access_flags = HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE,
	};
	struct hca_qp_attr rtr = {
		.state = HCA_QPS_RTR, .dlid = peer->lid, .dest_qpn = peer->qpn,
		.path_mtu = MTU_1024, .rq_psn = 1, .max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
	};
	struct hca_qp_attr rts = {
		.state = HCA_QPS_RTS, .sq_psn = 1, .timeout = 14,
		.retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1,
	};

	if (modify_qp(qpn, HCA_QP_ATTR_STATE | HCA_QP_ATTR_PKEY_INDEX |
		      HCA_QP_ATTR_PORT | HCA_QP_ATTR_ACCESS_FLAGS, &init))
		return "modify QP to INIT failed";
	if (modify_qp(qpn, HCA_QP_ATTR_STATE | HCA_QP_ATTR_AV |
		      HCA_QP_ATTR_PATH_MTU | HCA_QP_ATTR_DEST_QPN |
		      HCA_QP_ATTR_RQ_PSN | HCA_QP_ATTR_MAX_DEST_RD_ATOMIC |
		      HCA_QP_ATTR_MIN_RNR_TIMER, &rtr))
		return "modify QP to RTR failed";
	if (modify_qp(qpn, HCA_QP_ATTR_STATE | HCA_QP_ATTR_SQ_PSN |
		      HCA_QP_ATTR_TIMEOUT | HCA_QP_ATTR_RETRY_CNT |
		      HCA_QP_ATTR_RNR_RETRY | HCA_QP_ATTR_MAX_QP_RD_ATOMIC, &rts))
		return "modify QP to RTS failed";
	return 0;
}

/* PD, DMA MR, CQ and RC QP; fills in @self. */
static const char *create_resources(struct xchg_side *self)
{
	struct hca_cmd_reg_mr mr = {
		.iova = 0, .length = ~0ULL, .flags = HCA_MR_FLAG_PHYS,
		.access = HCA_ACCESS_LOCAL_WRITE | HCA_ACCESS_REMOTE_WRITE,
	};
	struct hca_cmd_create_cq ccq = {
		.ring_addr = (unsigned long)cq, .log_entries = CQ_LOG,
		.vector = HCA_VEC_COMP_FIRST,
	};
	struct hca_cmd_create_qp cqp = {
		.sq_addr = (unsigned long)sq, .rq_addr = (unsigned long)rq,
		.qp_type = HCA_QPT_RC, .sq_log_entries = SQ_LOG,
		.sq_wqe_shift = SQ_SHIFT, .rq_log_entries = 0,
		.rq_wqe_shift = HCA_MIN_RQ_WQE_SHIFT,
	};
	unsigned int pdn, cqn;

	if (cmd(HCA_CMD_ALLOC_PD, 0, 0, &pdn))
		return "ALLOC_PD failed";
	mr.pdn = pdn;
	if (cmd(HCA_CMD_REG_MR, &mr, sizeof(mr), &self->rkey))
		return "REG_MR failed";
	if (cmd(HCA_CMD_CREATE_CQ, &ccq, sizeof(ccq), &cqn))
		return "CREATE_CQ failed";
	cq_num = cqn;
	cqp.pdn = pdn;
	cqp.send_cqn = cqn;
	cqp.recv_cqn = cqn;
	if (cmd(HCA_CMD_CREATE_QP, &cqp, sizeof(cqp), &self->qpn))
		return "CREATE_QP failed";
	self->lid = *(volatile __u16 *)(bar2_base + HCA_BAR2_INFO_OFFSET +
			__builtin_offsetof(struct hca_dev_info, lid));
	self->addr = (unsigned long)buf;
	return 0;
}

static const char *write_to_peer(unsigned int qpn, unsigned int lkey,
				 const struct xchg_side *peer)
{
	struct hca_send_wqe *w = (struct hca_send_wqe *)sq;
	struct hca_sge *sge = (struct hca_sge *)(sq + sizeof(*w));
	volatile struct hca_cqe *c = cq;
	unsigned long long t0;
	unsigned long spins;
	unsigned int i;

	for (i = 0; i < BUF_BYTES; i++)
		buf[i] = pattern(i);
	*w = (struct hca_send_wqe){
		.wr_id = 0x5752, .opcode = HCA_WR_RDMA_WRITE,
		.flags = HCA_WQE_SIGNALED, .num_sge = 1,
		.remote_addr = peer->addr, .rkey = peer->rkey,
	};
	*sge = (struct hca_sge){ .addr = (unsigned long)buf,
				 .length = BUF_BYTES, .lkey = lkey };
	mmio_write32(bar2_base + HCA_BAR2_QP_DB_OFFSET + qpn * 8, 1);
	ring(HCA_DB_SQ);
	for (spins = 0, t0 = rdtsc(); c->owner != hca_owner_bit(0, CQ_LOG);)
		if (waited_too_long(&spins, t0))
			return "no completion for the RDMA Write";
	mmio_write32(bar2_base + HCA_BAR2_CQ_DB_OFFSET + cq_num * 8, 1);
	say("rdma-write-cqe-status", c->status);
	say("rdma-write-cqe-wr-id", c->wr_id);
	if (c->status != HCA_WC_SUCCESS || c->wr_id != 0x5752 ||
	    c->opcode != HCA_CQE_OP_RDMA_WRITE)
		return "the RDMA Write completed in error";
	return 0;
}

static const char *wait_for_data(void)
{
	volatile unsigned char *b = buf;
	unsigned long long t0;
	unsigned long spins;
	unsigned int i;

	for (spins = 0, t0 = rdtsc(); b[BUF_BYTES - 1] != pattern(BUF_BYTES - 1);)
		if (waited_too_long(&spins, t0))
			return "the peer's RDMA Write never arrived";
	for (i = 0; i < BUF_BYTES; i++)
		if (b[i] != pattern(i)) {
			say("rdma-bad-byte-at", i);
			return "the RDMA Write's data is wrong";
		}
	say("rdma-write-received-bytes", BUF_BYTES);
	return 0;
}

/*
 * Publishes @self at @phase (the ready word last) and waits until the host
 * has mirrored the peer's side at the same phase into x->peer.
 */
static const char *sync_phase(volatile struct xchg *x,
			      const struct xchg_side *self, unsigned int phase,
			      struct xchg_side *other)
{
	unsigned long long t0;
	unsigned long spins;

	x->self.lid = self->lid;
	x->self.qpn = self->qpn;
	x->self.rkey = self->rkey;
	x->self.addr = self->addr;
	__asm__ volatile("" ::: "memory");
	x->self.ready = phase;
	for (spins = 0, t0 = rdtsc(); x->peer.ready < phase;)
		if (waited_too_long(&spins, t0))
			return "the host never mirrored the peer's side";
	__asm__ volatile("" ::: "memory");
	other->lid = x->peer.lid;
	other->qpn = x->peer.qpn;
	other->rkey = x->peer.rkey;
	other->addr = x->peer.addr;
	return 0;
}

const char *rdma_test(unsigned long bar0, unsigned long bar2, unsigned int peer)
{
	volatile struct xchg *x = (volatile struct xchg *)XCHG_ADDR;
	struct xchg_side self = { 0 }, other;
	const char *err;

	if (x->magic != XCHG_MAGIC || !x->role)
		return 0;
	bar0_base = bar0;
	bar2_base = bar2;
	db_peer = peer;
	cmd_seq = mailbox()->done_seq;	/* hcatest.c's QUERY_PORT, completed */
	err = create_resources(&self);
	if (!err) {
		say("rdma-lid", self.lid);
		say("rdma-qpn", self.qpn);
		err = sync_phase(x, &self, 1, &other);
	}
	if (!err)
		err = bring_up(self.qpn, &other);
	/* Phase 2: both QPs are in RTS before anything is sent. */
	if (!err)
		err = sync_phase(x, &self, 2, &other);
	if (err)
		return err;
	if (x->role == ROLE_WRITER)
		return write_to_peer(self.qpn, self.rkey, &other);
	if (x->role == ROLE_TARGET)
		return wait_for_data();
	return "unknown role";
}
