/* SPDX-License-Identifier: GPL-2.0 */
/*
 * hca_ib: the ib_core provider for the hcabench HCA.
 *
 * Locking overview (details next to each lock):
 * - dev->port_mutex serialises ib_modify_port, so that the device hears
 *   capability changes in the order they were made.
 * - dev->qp_mutex makes a QPN's hand-out and its publication one step, and
 *   its release and unpublication another, so that a QPN the device frees
 *   and gives to a new QP is never unpublished under that QP.
 * - dev->cmd_mutex serialises the one command mailbox; commands sleep.
 * - dev->table_lock guards the QPN -> QP and CQN -> CQ lookup tables,
 *   which interrupt handlers read (poll_cq reads the QP table locklessly).
 * - cq->lock guards a CQ's consumer index and arming sequence.
 * - qp->sq_lock and qp->rq_lock guard each work queue's producer state.
 * - srq->lock guards an SRQ's indices and which of its slots were polled.
 * - dev->sq_ring_lock[r] guards send-doorbell ring r's producer index and
 *   makes its writer one at a time (CPUs share a ring past HCA_SQ_RINGS).
 *
 * port_lock and pma_mutex are leaf locks, taken alone; sq_ring_lock is a
 * leaf lock taken only under qp->sq_lock.
 *
 * Lock order (outermost first):
 *
 *   dev->port_mutex | dev->qp_mutex
 *     dev->cmd_mutex
 *       dev->table_lock
 *         cq->lock | qp->sq_lock | qp->rq_lock | srq->lock
 *           srq->lock (poll_cq retires SRQ slots under cq->lock)
 *           qp->sq_lock, qp->rq_lock (poll_cq flushes in software under
 *             cq->lock once the device lost its state: catas.c)
 *           dev->sq_ring_lock[r] (post_send names the QP under qp->sq_lock)
 *
 * table_lock is held across the consumer's completion and event handlers
 * (eq.c), which keeps the CQ or QP alive while they run; those handlers
 * call poll_cq and req_notify_cq (cq->lock) and post_send / post_recv
 * (qp->sq_lock, qp->rq_lock), so these three nest inside table_lock and
 * never the other way round: nothing takes table_lock while holding one of
 * them (hca_qp_unpublish takes table_lock, drops it, then takes each CQ's
 * lock alone), and nothing takes cq->lock while holding another of them.
 * cmd_mutex sleeps, so it is never taken under a spinlock; verbs that issue
 * commands (create, modify, destroy) take the spinlocks only after or
 * between commands. The handlers run in hard interrupt context, so every
 * process-context user of these spinlocks disables interrupts (irqsave).
 */
#ifndef HCA_IB_H
#define HCA_IB_H

#include <linux/pci.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/completion.h>
#include <linux/idr.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>
#include <rdma/uverbs_ioctl.h>
#include "hca_abi.h"
#include "hca_uapi.h"
#include "hcab_compat.h"

#define HCA_IB_NUM_COMP_VECTORS	(HCA_NUM_VECTORS - HCA_VEC_COMP_FIRST)
/*
 * The port's GID table: index 0 is the port GUID's GID, the rest are alias
 * GUIDs' entries, left unassigned (as on an mthca port, whose table has 32).
 * One GUIDInfo block holds them all (sma.c).
 */
#define HCA_IB_GID_TABLE_LEN	8
#define HCA_IB_CMD_TIMEOUT_MS	5000
#define HCA_IB_PMA_FIELDS	12
/* The largest ring or MR page list a process gets: 4 MiB, one allocation. */
#define HCA_IB_MAX_USER_RING	(4UL << 20)

struct hca_dev {
	struct ib_device ibdev;
	struct pci_dev *pdev;
	void __iomem *bar0;
	void __iomem *bar2;
	u32 doorbell_peer;
	u32 caps;		/* HCA_CAP_* the device offers */

	struct hca_device_attr attr;
	struct hca_port_attr port;

	struct mutex qp_mutex;

	/* Mailbox: one command at a time, completed by an EV_CMD_DONE. */
	struct mutex cmd_mutex;
	struct completion cmd_done;
	u32 cmd_seq;
	u32 cmd_status;

	/* Per-EQ consumer index; each EQ is drained by its own vector only. */
	u32 eq_ci[HCA_NUM_VECTORS];
	int irq[HCA_NUM_VECTORS];

	/* Readers: interrupt handlers and pollers; writers: create/destroy. */
	spinlock_t table_lock;
	struct hca_qp *qps[HCA_MAX_QP];
	struct hca_cq *cqs[HCA_MAX_CQ];
	struct hca_srq *srqs[HCA_MAX_SRQ];

	/*
	 * The port's capability bits, which consumers set and clear through
	 * ib_modify_port (ib_cm sets CM_SUP, ib_srpt DEVICE_MGMT_SUP) and the
	 * device reports in the SA's PortInfoRecords. port_lock is a leaf lock,
	 * taken alone; port_mutex orders the changes (see above).
	 */
	struct mutex port_mutex;
	spinlock_t port_lock;
	u32 port_cap_flags;

	/*
	 * What the Performance Management agent's counters read at their last
	 * reset, per PMA field (counters.c); pma_mutex is a leaf lock.
	 */
	struct mutex pma_mutex;
	u64 pma_base[HCA_IB_PMA_FIELDS];

	/*
	 * User contexts (uverbs.c): whether they may open, their UARs, and
	 * how many QPs, CQs and SRQs (by enum hca_uar_kind) all processes
	 * hold together.
	 */
	bool user_verbs;
	struct ida uar_ida;
	atomic_t user_objs[3];

	/*
	 * Send-doorbell rings (HCA_CAP_SQ_RING, post.c): a CPU names each QP
	 * it rings HCA_DB_SQ for in ring (cpu % HCA_SQ_RINGS), whose producer
	 * index sq_ring_pi[r] (as last written to BAR2) sq_ring_lock[r] guards.
	 */
	bool sq_rings;
	spinlock_t sq_ring_lock[HCA_SQ_RINGS];
	u32 sq_ring_pi[HCA_SQ_RINGS];

	/*
	 * Catastrophic errors (catas.c): HCA_CATAS_* bits, health check, and
	 * the work that calls consumers' completion handlers for what the
	 * driver completes in software.
	 */
	unsigned long catas;
	struct delayed_work health;
	struct work_struct sw_notify;
};

/* Bits of hca_dev.catas */
enum {
	HCA_CATAS_REGISTERED,	/* ib_register_device succeeded */
	HCA_CATAS_SEEN,		/* recovery is under way */
	/*
	 * The device was reset underneath the driver and holds nothing of
	 * it: commands are not sent, and work is completed in software.
	 */
	HCA_CATAS_LOST,
};

static inline bool hca_lost(struct hca_dev *dev)
{
	return unlikely(test_bit(HCA_CATAS_LOST, &dev->catas));
}

/* The kinds of doorbell record slots in a UAR page (hca_uapi.h). */
enum hca_uar_kind {
	HCA_UAR_QP,
	HCA_UAR_CQ,
	HCA_UAR_SRQ,
	HCA_UAR_KINDS,
};

struct hca_ucontext {
	struct ib_ucontext ibuc;
	u32 uar;
	struct rdma_user_mmap_entry *uar_entry;
	struct rdma_user_mmap_entry *db_entry;
	struct mutex slot_lock;
	unsigned long slots[HCA_UAR_KINDS][BITS_TO_LONGS(HCA_UAR_QP_SLOTS)];
};

static inline struct hca_ucontext *to_huc(struct ib_ucontext *ibuc)
{
	return container_of(ibuc, struct hca_ucontext, ibuc);
}

/* What one mmap cookie of a context maps: a device page or a ring. */
struct hca_mmap_entry {
	struct rdma_user_mmap_entry rdma;
	struct hca_dev *dev;
	unsigned long pfn;
	bool io;		/* a BAR page: mapped uncached */
	int uar;		/* >= 0: the UAR to give back when it goes */
	void *cpu;		/* a ring's DMA memory, freed when it goes */
	dma_addr_t dma;
	size_t size;
};

struct hca_pd {
	struct ib_pd ibpd;
	u32 pdn;
};

struct hca_ah {
	struct ib_ah ibah;
	u16 dlid;
};

#define HCA_IB_MAX_FRMR_PAGES	(1 << 16)

struct hca_mr {
	struct ib_mr ibmr;
	u32 hw_key;	/* the key the device knows the MR by */
	u32 prev_key;	/* ... or this one, if the last REG_MR WR failed */
	/* Fast registration (ib_alloc_mr): the page list IB_WR_REG_MR hands over. */
	u64 *pages;
	dma_addr_t pages_dma;
	u32 max_pages;
	u32 npages;
	struct ib_umem *umem;	/* reg_user_mr: the process's pinned pages */
};

struct hca_mw {
	struct ib_mw ibmw;
};

static inline struct hca_mr *to_hmr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct hca_mr, ibmr);
}

struct hca_cq {
	struct ib_cq ibcq;
	u32 cqn;
	u32 log_entries;
	struct hca_cqe *ring;
	dma_addr_t ring_dma;
	size_t ring_bytes;
	/* Guards ci and arm_sn: poll_cq and req_notify_cq race from any context. */
	spinlock_t lock;
	u32 ci;
	u32 arm_sn;
	int vector;
	/* A process's CQ: the ring is mapped by it, which alone polls it. */
	struct hca_ucontext *uc;
	int db_slot;
	/* Guards ring, log_entries and mmap against two resizes at once. */
	struct mutex resize_lock;
	struct rdma_user_mmap_entry *mmap;
	/*
	 * Under lock: the QPs whose sends and whose receives complete here
	 * (for the software flush), and whether the consumer armed the CQ
	 * since the driver last called its handler for that flush.
	 */
	struct list_head send_qps;
	struct list_head recv_qps;
	bool sw_armed;
};

/* One work queue: a ring in guest RAM plus the consumer's wr_ids. */
struct hca_wq {
	void *ring;
	dma_addr_t ring_dma;
	size_t ring_bytes;
	u32 log_entries;
	u32 wqe_shift;
	u32 max_sge;
	u32 pi;		/* next slot to fill */
	u32 ci;		/* oldest slot not known complete */
	u64 *wrid;	/* consumer wr_id per slot; the WQE carries the index */
	struct rdma_user_mmap_entry *mmap;	/* a process's ring */
};

/*
 * A shared receive queue (srq.c): wq.ci is how far the device is known to
 * have taken; wq.wrid holds the consumers' wr_ids by tag.
 */
struct hca_srq {
	struct ib_srq ibsrq;
	u32 srqn;
	spinlock_t lock;
	struct hca_wq wq;
	u8 *busy;	/* per tag: a receive holds it until its completion is polled */
	u32 *free_tags;
	u32 nfree;
	/* A process's SRQ: its provider keeps the tags; the ring and slot. */
	struct hca_ucontext *uc;
	int db_slot;
};

static inline struct hca_srq *to_hsrq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct hca_srq, ibsrq);
}

struct hca_qp {
	struct ib_qp ibqp;
	u32 qpn;
	u8 state;
	bool sig_all;
	bool sq_named;	/* HCA_QP_FLAG_SQ_RING: post_send names it in a ring */
	struct hca_srq *srq;	/* receives come from it; rq is then unused */
	/* Guards sq.pi and sq.ci (ci also moves in poll_cq). */
	spinlock_t sq_lock;
	struct hca_wq sq;
	/* Guards rq.pi and rq.ci. */
	spinlock_t rq_lock;
	struct hca_wq rq;
	/* A process's QP: its rings and UAR slot. */
	struct hca_ucontext *uc;
	int db_slot;
	/* On its CQs' send_qps and recv_qps lists, under their locks. */
	struct list_head send_node;
	struct list_head recv_node;
};

static inline struct hca_dev *to_hdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct hca_dev, ibdev);
}

static inline struct hca_pd *to_hpd(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct hca_pd, ibpd);
}

static inline struct hca_cq *to_hcq(struct ib_cq *ibcq)
{
	return container_of(ibcq, struct hca_cq, ibcq);
}

static inline struct hca_qp *to_hqp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct hca_qp, ibqp);
}

/* UD and the management QPs: each WR names its destination (an AH, a QPN, a Q_Key). */
static inline bool hca_qp_is_datagram(struct hca_qp *qp)
{
	return qp->ibqp.qp_type != IB_QPT_RC && qp->ibqp.qp_type != IB_QPT_UC;
}

static inline struct hca_ah *to_hah(struct ib_ah *ibah)
{
	return container_of(ibah, struct hca_ah, ibah);
}

/* Every guest-to-device signal: one write of the class to BAR0's doorbell. */
static inline void hca_ring(struct hca_dev *dev, u32 class)
{
	iowrite32(dev->doorbell_peer << HCA_DOORBELL_PEER_SHIFT | class,
		  dev->bar0 + HCA_BAR0_DOORBELL);
}

/* cmd.c */
int hca_cmd(struct hca_dev *dev, u32 opcode, const void *in, size_t in_len,
	    void *out, size_t out_len);
int hca_cmd_handle(struct hca_dev *dev, u32 opcode, u32 handle);
void hca_cmd_complete(struct hca_dev *dev, u32 seq, u32 status);

/* post.c */
void hca_sq_rings_init(struct hca_dev *dev);

/* uverbs.c */
bool hca_db_page_private(struct pci_dev *pdev);
int hca_alloc_ucontext(struct ib_ucontext *ibuc, struct ib_udata *udata);
void hca_dealloc_ucontext(struct ib_ucontext *ibuc);
void hca_disassociate_ucontext(struct ib_ucontext *ibuc);
int hca_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma);
void hca_mmap_free(struct rdma_user_mmap_entry *rdma);
int hca_wq_alloc_user(struct hca_dev *dev, struct hca_ucontext *uc,
		      struct hca_wq *wq, u64 *offset);
void hca_wq_free_user(struct hca_wq *wq);
int hca_uar_slot_get(struct hca_ucontext *uc, enum hca_uar_kind kind,
		     u32 *db_offset);
void hca_uar_slot_put(struct hca_ucontext *uc, enum hca_uar_kind kind,
		      u32 slot);

/* catas.c */
void hca_catastrophic(struct hca_dev *dev, u32 syndrome);
int hca_cmd_lost(u32 opcode, const void *in, size_t in_len);
void hca_sw_notify_init(struct hca_dev *dev);
void hca_sw_notify(struct hca_dev *dev);
void hca_sw_qp_event(struct hca_dev *dev, struct hca_qp *qp,
		     enum ib_event_type type);
void hca_health_start(struct hca_dev *dev);
void hca_health_stop(struct hca_dev *dev);
int hca_reset(struct hca_dev *dev);
int hca_recovery_init(void);
void hca_recovery_stop(void);
void hca_recovery_exit(void);

/* eq.c */
int hca_eq_init(struct hca_dev *dev);
void hca_eq_cleanup(struct hca_dev *dev);

/* verbs.c */
extern const struct ib_device_ops hca_dev_ops;
extern const struct ib_device_ops hca_counter_ops;

/* mad.c, and the agents it hands MADs to (counters.c, sma.c) */
struct ib_mad;
extern const struct ib_device_ops hca_mad_ops;
int hca_pma_process(struct hca_dev *dev, u32 port, const struct ib_mad *in,
		    struct ib_mad *out);
int hca_sma_process(struct hca_dev *dev, u32 port, const struct ib_mad *in,
		    struct ib_mad *out);

/* mr.c */
struct ib_mr *hca_get_dma_mr(struct ib_pd *ibpd, int access);
struct ib_mr *hca_reg_user_mr(struct ib_pd *pd, u64 start, u64 length,
			      u64 virt, int access, struct ib_udata *udata);
struct ib_mr *hca_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type, u32 max_sg);
int hca_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		  unsigned int *sg_offset);
int hca_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);
int hca_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int hca_dealloc_mw(struct ib_mw *ibmw);
u32 hca_mr_access(int access);

/* cq.c */
int hca_resize_cq(struct ib_cq *ibcq, int entries, struct ib_udata *udata);
int hca_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		  hcab_create_cq_arg *arg);
int hca_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);
int hca_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc);
void hca_cq_clean(struct hca_cq *cq, struct hca_qp *qp);
int hca_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);
bool hca_cq_flush_pending(struct hca_cq *cq);

/* qp.c; the work-queue helpers serve SRQs too */
int hca_wq_size(struct hca_wq *wq, u32 wr, u32 hdr, u32 sge, u32 inl,
		u32 min_shift, u32 max_shift);
int hca_wq_alloc(struct hca_dev *dev, struct hca_wq *wq);
void hca_wq_free(struct hca_dev *dev, struct hca_wq *wq);
int hca_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		  struct ib_udata *udata);
int hca_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		  struct ib_udata *udata);
int hca_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		 struct ib_qp_init_attr *init);
int hca_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);
struct hca_qp *hca_qp_lookup(struct hca_dev *dev, u32 qpn);

/* post.c */
int hca_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		  const struct ib_send_wr **bad_wr);
int hca_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		  const struct ib_recv_wr **bad_wr);
void hca_write_recv_wqe(struct hca_wq *wq, u32 idx, u64 hw_wr_id,
			const struct ib_recv_wr *wr);

/* srq.c */
int hca_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		   struct ib_udata *udata);
int hca_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		   enum ib_srq_attr_mask mask, struct ib_udata *udata);
int hca_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int hca_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);
int hca_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
		      const struct ib_recv_wr **bad_wr);
struct hca_srq *hca_srq_lookup(struct hca_dev *dev, u32 srqn);
u64 hca_srq_retire(struct hca_srq *srq, u64 index);

#endif /* HCA_IB_H */
