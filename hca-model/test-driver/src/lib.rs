//! A Rust test driver that plays the guest: it owns a guest memory, writes WQEs and commands
//! the way the kernel's hca_ib does, rings doorbells, and reads CQEs and EQEs back. The
//! device is reached through a [`Port`]: an in-process [`Hca`] (the model's tests, bench and
//! example), or BAR2 and doorbell eventfds a device server handed over (its tests).

pub mod hostile;
pub mod tshark;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hca_model::abi::*;
use hca_model::dma::{read_obj, write_obj};
use hca_model::{DeviceMemory, DmaSpace, Fabric, GuestRam, Hca, InterruptSink};
use vm_memory::{Address, GuestMemoryBackend};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

/// How the driver reaches its device.
pub trait Port {
    /// Commands complete inside the doorbell call (in-process); otherwise the driver polls
    /// the mailbox for them.
    const SYNCHRONOUS: bool;
    fn bar2(&self) -> &DeviceMemory;
    fn doorbell(&self, class: u32);
    /// The port's LID, as the device publishes it in BAR2.
    fn lid(&self) -> u16 {
        self.bar2().read_obj::<HcaDevInfo>(BAR2_INFO_OFFSET).lid
    }
}

impl Port for Hca {
    const SYNCHRONOUS: bool = true;
    fn bar2(&self) -> &DeviceMemory {
        Hca::bar2(self)
    }
    fn doorbell(&self, class: u32) {
        Hca::doorbell(self, class)
    }
    fn lid(&self) -> u16 {
        Hca::lid(self)
    }
}

/// How long a remote device may take to complete a command.
const COMMAND_WAIT: Duration = Duration::from_secs(10);

/// Counts interrupts per vector.
#[derive(Default)]
pub struct IrqCount(pub [AtomicU32; NUM_VECTORS as usize]);

impl InterruptSink for IrqCount {
    fn raise(&self, vector: u32) {
        self.0[vector as usize].fetch_add(1, Ordering::SeqCst);
    }
}

impl IrqCount {
    pub fn get(&self, v: u32) -> u32 {
        self.0[v as usize].load(Ordering::SeqCst)
    }
}

/// The guest's view of a CQ.
pub struct CqH {
    pub cqn: u32,
    pub ring: u64,
    pub log: u32,
    pub ci: u32,
    pub arm_sn: u32,
    /// Its doorbell record's BAR2 offset.
    pub db: u32,
}

/// The guest's view of a QP.
#[derive(Clone)]
pub struct QpH {
    pub qpn: u32,
    pub sq: u64,
    pub rq: u64,
    pub sq_log: u32,
    pub rq_log: u32,
    pub sq_shift: u32,
    pub rq_shift: u32,
    pub sq_pi: u32,
    pub rq_pi: u32,
    /// Its doorbell record's BAR2 offset.
    pub db: u32,
    /// The BAR2 offset of the send-doorbell ring that names it before each DB_SQ (it was
    /// created with QP_FLAG_SQ_RING); None: an unnamed QP, as an older driver makes.
    pub ring: Option<u32>,
}

/// The send-doorbell ring at BAR2 offset `ring` holds `qpn` next, then says so (its writer's
/// producer index is kept in BAR2 alone: the test driver is its only writer).
pub fn name_in_ring(bar2: &DeviceMemory, ring: u32, qpn: u32) {
    let pi = bar2.load_u32(ring + SQ_RING_PI);
    bar2.store_u32(ring + SQ_RING_QPN_OFFSET + 4 * (pi % SQ_RING_ENTRIES), qpn);
    bar2.store_u32(ring + SQ_RING_PI, pi.wrapping_add(1));
}

/// The guest's view of an SRQ.
pub struct SrqH {
    pub srqn: u32,
    pub ring: u64,
    pub log: u32,
    pub shift: u32,
    pub pi: u32,
    /// Its doorbell record's BAR2 offset.
    pub db: u32,
}

pub const MIB: u64 = 1 << 20;

/// The attributes an RC QP needs for INIT -> RTR.
pub const RC_RTR_MASK: u32 = QP_ATTR_STATE
    | QP_ATTR_AV
    | QP_ATTR_PATH_MTU
    | QP_ATTR_DEST_QPN
    | QP_ATTR_RQ_PSN
    | QP_ATTR_MAX_DEST_RD_ATOMIC
    | QP_ATTR_MIN_RNR_TIMER;

pub struct Driver<P: Port = Hca> {
    /// The device (an in-process HCA, or a remote port).
    pub hca: P,
    pub mem: GuestMemoryMmap,
    /// The same memory through the model's region table: the rings' plain stores and loads
    /// (a guest's driver writes a WQE with a few moves, not a region search per field).
    ram: GuestRam<GuestMemoryMmap>,
    /// Interrupts an in-process HCA raised (a remote device raises its own eventfds).
    pub irq: Arc<IrqCount>,
    next_free: u64,
    mem_end: u64,
    seq: u32,
    eq_ci: [u32; NUM_VECTORS as usize],
    /// Where the next queue's doorbell record goes: None, the handle's own record; else
    /// (BAR2 offset, next slot) in a user access region (see `use_uar`).
    uar: Option<(u32, u32)>,
    /// QPs made from now on are named in a send-doorbell ring (QP_FLAG_SQ_RING): the
    /// kernel's ring 0, or the UAR page's ring. On by default where the device has
    /// CAP_SQ_RING; off, they are made as an older driver makes them.
    pub name_sqs: bool,
}

impl Driver {
    /// A guest with `mib` MiB of RAM in two regions (so DMA crosses a region boundary), its
    /// HCA attached to `fabric` if given.
    pub fn new(fabric: Option<&Fabric>, mib: u64) -> Self {
        let half = (mib * MIB / 2) as usize;
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), half),
            (GuestAddress(half as u64), half),
        ])
        .expect("guest memory");
        let irq = Arc::new(IrqCount::default());
        let hca = Hca::new(
            mem.clone(),
            DeviceMemory::new().expect("bar2"),
            irq.clone(),
            hca_model::abi::NODE_GUID_PREFIX | u64::from(rand_tag()),
        );
        if let Some(f) = fabric {
            hca.attach(f);
        }
        let name_sqs = has_sq_rings(hca.bar2());
        Self {
            hca,
            ram: GuestRam::new(mem.clone()),
            mem,
            irq,
            next_free: 0x1000,
            mem_end: mib * MIB,
            seq: 0,
            eq_ci: [0; NUM_VECTORS as usize],
            uar: None,
            name_sqs,
        }
    }
}

impl<P: Port> Driver<P> {
    /// A driver for a device reached through `port`, over guest memory `mem` (all of it
    /// free for the driver's rings and buffers from 4 KiB up). It goes on from the device's
    /// last command, as a reloaded driver must: the device ignores a sequence number it has
    /// completed.
    pub fn with_port(port: P, mem: GuestMemoryMmap) -> Self {
        let mem_end = mem.last_addr().raw_value() + 1;
        let done: HcaCmdMailbox = port.bar2().read_obj(BAR2_MAILBOX_OFFSET);
        let name_sqs = has_sq_rings(port.bar2());
        Self {
            hca: port,
            ram: GuestRam::new(mem.clone()),
            mem,
            irq: Arc::new(IrqCount::default()),
            next_free: 0x1000,
            mem_end,
            seq: done.done_seq,
            eq_ci: [0; NUM_VECTORS as usize],
            uar: None,
            name_sqs,
        }
    }

    pub fn lid(&self) -> u16 {
        self.hca.lid()
    }

    /// Bump allocation of guest memory, `align`-aligned (a power of two).
    pub fn alloc(&mut self, size: u64, align: u64) -> u64 {
        let at = (self.next_free + align - 1) & !(align - 1);
        assert!(at + size <= self.mem_end, "test guest out of memory");
        self.next_free = at + size;
        at
    }

    /// Stores a ring entry (an ABI struct) at `addr`.
    fn put<T: ByteValued>(&self, addr: u64, v: &T) {
        write_obj(&self.ram, addr, v).expect("ring inside guest memory");
    }

    pub fn write(&self, addr: u64, b: &[u8]) {
        self.ram.write(addr, b).expect("inside guest memory");
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.ram.read(addr, &mut b).expect("inside guest memory");
        b
    }

    // ---- commands ------------------------------------------------------------------------

    /// Runs one command; returns its status and output bytes.
    pub fn cmd_raw(&mut self, opcode: u32, input: &[u8], flags: u32) -> (u32, [u8; 64]) {
        self.seq = self.seq.wrapping_add(1);
        let mut mb = HcaCmdMailbox {
            opcode,
            flags,
            ..Default::default()
        };
        mb.input[..input.len()].copy_from_slice(input);
        let bar2 = self.hca.bar2();
        bar2.write_obj(BAR2_MAILBOX_OFFSET, &mb);
        bar2.store_u32(BAR2_MAILBOX_OFFSET + 8, self.seq);
        self.hca.doorbell(DB_CMD);
        let deadline = Instant::now() + COMMAND_WAIT;
        loop {
            let done: HcaCmdMailbox = bar2.read_obj(BAR2_MAILBOX_OFFSET);
            if done.done_seq == self.seq {
                return (done.status, done.output);
            }
            assert!(!P::SYNCHRONOUS, "command did not complete synchronously");
            assert!(
                Instant::now() < deadline,
                "command {opcode:#x} did not complete within {COMMAND_WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn cmd<T: ByteValued>(&mut self, opcode: u32, input: &T) -> (u32, [u8; 64]) {
        self.cmd_raw(opcode, input.as_slice(), 0)
    }

    fn handle_out(&mut self, opcode: u32, input: &[u8]) -> Result<u32, u32> {
        let (st, out) = self.cmd_raw(opcode, input, 0);
        if st == CMD_OK {
            Ok(u32::from_le_bytes(out[..4].try_into().unwrap()))
        } else {
            Err(st)
        }
    }

    pub fn alloc_pd(&mut self) -> u32 {
        self.handle_out(CMD_ALLOC_PD, &[]).expect("alloc pd")
    }

    /// A user process's PD (PD_FLAG_USER), as hca_ib makes for a uverbs context.
    pub fn alloc_user_pd(&mut self) -> u32 {
        let a = HcaCmdAllocPd {
            flags: PD_FLAG_USER,
            rsvd: 0,
        };
        self.handle_out(CMD_ALLOC_PD, a.as_slice())
            .expect("alloc user pd")
    }

    /// Puts the doorbell records of the CQs, QPs and SRQs made from now on in user access
    /// region `page` (one slot each, in creation order), as hca_ib does for a process;
    /// None goes back to the handles' own records.
    pub fn use_uar(&mut self, page: Option<u32>) {
        self.uar = page.map(|p| (BAR2_UAR_OFFSET + p * UAR_SIZE, 0));
    }

    /// The db_offset for the next queue (0: its handle's record).
    fn next_db_offset(&mut self) -> u32 {
        match &mut self.uar {
            None => 0,
            Some((base, slot)) => {
                *slot += 1;
                *base + (*slot - 1) * 8
            }
        }
    }

    pub fn try_reg_mr(&mut self, a: &HcaCmdRegMr) -> Result<u32, u32> {
        self.handle_out(CMD_REG_MR, a.as_slice())
    }

    /// Registers `[addr, addr + len)` through a 4 KiB page list (iova = addr).
    pub fn reg_mr(&mut self, pdn: u32, addr: u64, len: u64, access: u32) -> u32 {
        let first = addr & !0xfff;
        let npages = (addr + len - first).div_ceil(4096);
        let list = self.alloc(npages * 8, 8);
        for i in 0..npages {
            self.write(list + i * 8, &(first + i * 4096).to_le_bytes());
        }
        self.try_reg_mr(&HcaCmdRegMr {
            iova: addr,
            length: len,
            page_list: list,
            pdn,
            access,
            npages: npages as u32,
            page_shift: 12,
            ..Default::default()
        })
        .expect("reg mr")
    }

    /// The global DMA MR kernel consumers get from ib_get_dma_mr: all of memory, physical.
    pub fn reg_dma_mr(&mut self, pdn: u32, access: u32) -> u32 {
        self.try_reg_mr(&HcaCmdRegMr {
            iova: 0,
            length: u64::MAX,
            pdn,
            access,
            flags: MR_FLAG_PHYS,
            ..Default::default()
        })
        .expect("reg dma mr")
    }

    pub fn try_create_cq(&mut self, log: u32, vector: u32) -> Result<CqH, u32> {
        let ring = self.alloc(32 << log, 64);
        let db_offset = self.next_db_offset();
        let cqn = self.handle_out(
            CMD_CREATE_CQ,
            HcaCmdCreateCq {
                ring_addr: ring,
                log_entries: log,
                vector,
                db_offset,
                rsvd: 0,
            }
            .as_slice(),
        )?;
        Ok(CqH {
            cqn,
            ring,
            log,
            ci: 0,
            arm_sn: 0,
            db: if db_offset == 0 {
                BAR2_CQ_DB_OFFSET + cqn * 8
            } else {
                db_offset
            },
        })
    }

    /// RESIZE_CQ to a new ring of `log` log2 entries, as a driver does holding its CQ's
    /// lock: on success the handle polls on from index 0 of the new ring. The status.
    pub fn resize_cq(&mut self, cq: &mut CqH, log: u32) -> u32 {
        let ring = self.alloc(32 << log, 64);
        let a = HcaCmdResizeCq {
            ring_addr: ring,
            cqn: cq.cqn,
            log_entries: log,
        };
        let (st, _) = self.cmd(CMD_RESIZE_CQ, &a);
        if st == CMD_OK {
            (cq.ring, cq.log, cq.ci) = (ring, log, 0);
        }
        st
    }

    /// An MR in PD `pdn` whose page list names one page `npages` times: a big message over
    /// few bytes of guest memory, and one gather record per page. Its (lkey, iova).
    pub fn repeated_page_mr(&mut self, pdn: u32, npages: u64) -> (u32, u64) {
        let page = self.alloc(4096, 4096);
        let list = self.alloc(npages * 8, 8);
        let bytes: Vec<u8> = (0..npages).flat_map(|_| page.to_le_bytes()).collect();
        self.write(list, &bytes);
        let iova = 0x4000_0000;
        let key = self
            .try_reg_mr(&HcaCmdRegMr {
                iova,
                length: npages * 4096,
                page_list: list,
                pdn,
                access: ACCESS_LOCAL_WRITE,
                npages: npages as u32,
                page_shift: 12,
                ..Default::default()
            })
            .expect("repeated-page MR");
        (key, iova)
    }

    pub fn create_cq(&mut self, log: u32) -> CqH {
        self.try_create_cq(log, VEC_COMP_FIRST).expect("create cq")
    }

    /// Creates a QP reporting to CQs `(send, recv)` with rings of `(sq, rq)` log2 entries.
    pub fn try_create_qp(
        &mut self,
        qp_type: u32,
        pdn: u32,
        (scq, rcq): (u32, u32),
        (sq_log, rq_log): (u32, u32),
        flags: u32,
    ) -> Result<QpH, u32> {
        let (sq_shift, rq_shift) = (9u32, 8u32);
        let sq = self.alloc(1 << (sq_log + sq_shift), 64);
        let rq = self.alloc(1 << (rq_log + rq_shift), 64);
        let db_offset = self.next_db_offset();
        let named = self.name_sqs;
        let flags = flags | if named { QP_FLAG_SQ_RING } else { 0 };
        let qpn = self.handle_out(
            CMD_CREATE_QP,
            HcaCmdCreateQp {
                sq_addr: sq,
                rq_addr: rq,
                pdn,
                send_cqn: scq,
                recv_cqn: rcq,
                qp_type,
                flags,
                sq_log_entries: sq_log as u8,
                sq_wqe_shift: sq_shift as u8,
                rq_log_entries: rq_log as u8,
                rq_wqe_shift: rq_shift as u8,
                srqn: 0,
                db_offset,
            }
            .as_slice(),
        )?;
        Ok(QpH {
            qpn,
            sq,
            rq,
            sq_log,
            rq_log,
            sq_shift,
            rq_shift,
            sq_pi: 0,
            rq_pi: 0,
            db: qp_record(qpn, db_offset),
            ring: sq_ring_for(named, qp_record(qpn, db_offset)),
        })
    }

    /// Creates an SRQ of `1 << log` receive WQEs (room for 8 SGEs each) in PD `pdn`, its limit
    /// armed at `limit` (0: not armed).
    pub fn try_create_srq(&mut self, pdn: u32, log: u32, limit: u32) -> Result<SrqH, u32> {
        let shift = 8u32;
        let ring = self.alloc(1 << (log + shift), 64);
        let db_offset = self.next_db_offset();
        let srqn = self.handle_out(
            CMD_CREATE_SRQ,
            HcaCmdCreateSrq {
                ring_addr: ring,
                pdn,
                limit,
                log_entries: log as u8,
                wqe_shift: shift as u8,
                db_offset,
                ..Default::default()
            }
            .as_slice(),
        )?;
        Ok(SrqH {
            srqn,
            ring,
            log,
            shift,
            pi: 0,
            db: if db_offset == 0 {
                BAR2_SRQ_DB_OFFSET + srqn * 8
            } else {
                db_offset
            },
        })
    }

    /// Creates a QP whose receives come from SRQ `srqn` (its own receive ring is empty).
    pub fn try_create_qp_on_srq(
        &mut self,
        qp_type: u32,
        pdn: u32,
        (scq, rcq): (u32, u32),
        srqn: u32,
    ) -> Result<QpH, u32> {
        let (sq_log, sq_shift) = (6u32, 9u32);
        let sq = self.alloc(1 << (sq_log + sq_shift), 64);
        let db_offset = self.next_db_offset();
        let named = self.name_sqs;
        let qpn = self.handle_out(
            CMD_CREATE_QP,
            HcaCmdCreateQp {
                sq_addr: sq,
                db_offset,
                pdn,
                send_cqn: scq,
                recv_cqn: rcq,
                qp_type,
                flags: QP_FLAG_SRQ | if named { QP_FLAG_SQ_RING } else { 0 },
                sq_log_entries: sq_log as u8,
                sq_wqe_shift: sq_shift as u8,
                srqn,
                ..Default::default()
            }
            .as_slice(),
        )?;
        Ok(QpH {
            qpn,
            sq,
            rq: 0,
            sq_log,
            rq_log: 0,
            sq_shift,
            rq_shift: MIN_RQ_WQE_SHIFT,
            sq_pi: 0,
            rq_pi: 0,
            db: qp_record(qpn, db_offset),
            ring: sq_ring_for(named, qp_record(qpn, db_offset)),
        })
    }

    /// Posts a receive WQE to an SRQ: the WQE, then the producer index (no doorbell).
    pub fn post_srq_recv(&mut self, srq: &mut SrqH, wr_id: u64, sges: &[HcaSge]) {
        let slot = srq.ring + (u64::from(srq.pi & ((1 << srq.log) - 1)) << srq.shift);
        self.write_recv(slot, wr_id, sges);
        srq.pi = srq.pi.wrapping_add(1);
        self.hca.bar2().store_u32(srq.db, srq.pi);
    }

    pub fn create_qp(&mut self, qp_type: u32, pdn: u32, scq: u32, rcq: u32) -> QpH {
        self.try_create_qp(qp_type, pdn, (scq, rcq), (6, 6), 0)
            .expect("create qp")
    }

    /// Moves QP `qpn` to ERR (MODIFY_QP must succeed): its WRs are flushed.
    pub fn to_error(&mut self, qpn: u32) {
        let err = HcaQpAttr {
            state: QPS_ERR as u8,
            ..Default::default()
        };
        assert_eq!(
            self.modify_qp(qpn, QP_ATTR_STATE, err),
            CMD_OK,
            "QP {qpn:#x} to ERR"
        );
    }

    pub fn modify_qp(&mut self, qpn: u32, mask: u32, attr: HcaQpAttr) -> u32 {
        self.cmd(
            CMD_MODIFY_QP,
            &HcaCmdModifyQp {
                qpn,
                attr_mask: mask,
                attr,
            },
        )
        .0
    }

    pub fn query_qp(&mut self, qpn: u32) -> HcaQpAttr {
        let (st, out) = self.cmd(
            CMD_QUERY_QP,
            &HcaCmdHandle {
                handle: qpn,
                rsvd: 0,
            },
        );
        assert_eq!(st, CMD_OK);
        decode(&out)
    }

    pub fn qp_state(&mut self, qpn: u32) -> u32 {
        u32::from(self.query_qp(qpn).state)
    }

    /// RESET -> INIT -> RTR -> RTS for an RC QP talking to `(dlid, dqpn)`, with the
    /// transport's usual tuning (timeout 14, 7 retries, RNR retries forever).
    pub fn bring_up_rc(&mut self, qpn: u32, dlid: u16, dqpn: u32, access: u32, mtu: u8) {
        self.bring_up_rc_tuned(qpn, dlid, dqpn, access, mtu, DEFAULT_RTS);
    }

    /// Like [`Driver::bring_up_rc`] with (timeout, retry_cnt, rnr_retry) given.
    pub fn bring_up_rc_tuned(
        &mut self,
        qpn: u32,
        dlid: u16,
        dqpn: u32,
        access: u32,
        mtu: u8,
        rts: (u8, u8, u8),
    ) {
        self.bring_up_rc_in(qpn, 0, dlid, dqpn, access, mtu, rts);
    }

    /// Like [`Driver::bring_up_rc_tuned`] in the partition at `pkey_index` of the port's
    /// P_Key table.
    #[allow(clippy::too_many_arguments)]
    pub fn bring_up_rc_in(
        &mut self,
        qpn: u32,
        pkey_index: u16,
        dlid: u16,
        dqpn: u32,
        access: u32,
        mtu: u8,
        (timeout, retry_cnt, rnr_retry): (u8, u8, u8),
    ) {
        self.connected_to_init(qpn, pkey_index, access);
        let rtr = HcaQpAttr {
            state: QPS_RTR as u8,
            dlid,
            dest_qpn: dqpn,
            path_mtu: mtu,
            rq_psn: 100,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ..Default::default()
        };
        assert_eq!(self.modify_qp(qpn, RC_RTR_MASK, rtr), CMD_OK);
        let rts = HcaQpAttr {
            state: QPS_RTS as u8,
            sq_psn: 100,
            timeout,
            retry_cnt,
            rnr_retry,
            max_rd_atomic: 4,
            ..Default::default()
        };
        let m = QP_ATTR_STATE
            | QP_ATTR_SQ_PSN
            | QP_ATTR_TIMEOUT
            | QP_ATTR_RETRY_CNT
            | QP_ATTR_RNR_RETRY
            | QP_ATTR_MAX_QP_RD_ATOMIC;
        assert_eq!(self.modify_qp(qpn, m, rts), CMD_OK);
    }

    /// RESET -> INIT for an RC or UC QP.
    fn connected_to_init(&mut self, qpn: u32, pkey_index: u16, access: u32) {
        let init = HcaQpAttr {
            state: QPS_INIT as u8,
            port_num: 1,
            pkey_index,
            access_flags: access,
            ..Default::default()
        };
        let m = QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS;
        assert_eq!(self.modify_qp(qpn, m, init), CMD_OK);
    }

    /// RESET -> INIT -> RTR -> RTS for a UC QP, with only the attributes UC takes (PSNs 100,
    /// as [`Driver::bring_up_rc`]'s).
    pub fn bring_up_uc(&mut self, qpn: u32, dlid: u16, dqpn: u32, access: u32, mtu: u8) {
        self.connected_to_init(qpn, 0, access);
        let rtr = HcaQpAttr {
            state: QPS_RTR as u8,
            dlid,
            dest_qpn: dqpn,
            path_mtu: mtu,
            rq_psn: 100,
            ..Default::default()
        };
        let m = QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_PATH_MTU | QP_ATTR_DEST_QPN | QP_ATTR_RQ_PSN;
        assert_eq!(self.modify_qp(qpn, m, rtr), CMD_OK);
        self.rtr_to_rts(qpn, 100);
    }

    /// RTR -> RTS with the send PSN alone (UC, UD).
    fn rtr_to_rts(&mut self, qpn: u32, sq_psn: u32) {
        let rts = HcaQpAttr {
            state: QPS_RTS as u8,
            sq_psn,
            ..Default::default()
        };
        assert_eq!(
            self.modify_qp(qpn, QP_ATTR_STATE | QP_ATTR_SQ_PSN, rts),
            CMD_OK
        );
    }

    /// RESET -> INIT -> RTR -> RTS for a UD (or GSI) QP.
    pub fn bring_up_ud(&mut self, qpn: u32, qkey: u32, gsi: bool) {
        let port = if gsi { 0 } else { QP_ATTR_PORT };
        let init = HcaQpAttr {
            state: QPS_INIT as u8,
            port_num: 1,
            qkey,
            ..Default::default()
        };
        let m = QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | port | QP_ATTR_QKEY;
        assert_eq!(self.modify_qp(qpn, m, init), CMD_OK);
        let rtr = HcaQpAttr {
            state: QPS_RTR as u8,
            ..Default::default()
        };
        assert_eq!(self.modify_qp(qpn, QP_ATTR_STATE, rtr), CMD_OK);
        self.rtr_to_rts(qpn, 7);
    }

    // ---- data path ------------------------------------------------------------------------

    /// Writes a send WQE (header + SGEs or inline bytes) at the SQ's producer index, without
    /// ringing. Returns the slot address.
    pub fn write_send(
        &mut self,
        qp: &mut QpH,
        wqe: &HcaSendWqe,
        sges: &[HcaSge],
        inline: &[u8],
    ) -> u64 {
        let slot = qp.sq + (u64::from(qp.sq_pi & ((1 << qp.sq_log) - 1)) << qp.sq_shift);
        self.put(slot, wqe);
        for (i, s) in sges.iter().enumerate() {
            self.put(slot + 64 + 16 * i as u64, s);
        }
        if !inline.is_empty() {
            self.write(slot + 64, inline);
        }
        qp.sq_pi = qp.sq_pi.wrapping_add(1);
        slot
    }

    /// Posts a WR_REG_MR WQE (its opcode is set here).
    pub fn post_reg_mr(&mut self, qp: &mut QpH, w: HcaRegMrWqe) {
        self.write_reg_mr(qp, w);
        self.ring_sq(qp);
    }

    /// Writes a WR_REG_MR WQE (its opcode is set here) without ringing the doorbell.
    pub fn write_reg_mr(&mut self, qp: &mut QpH, mut w: HcaRegMrWqe) {
        w.opcode = WR_REG_MR as u8;
        self.push_sq_wqe(qp, &w);
    }

    /// Posts a WR_BIND_MW WQE (its opcode is set here).
    pub fn post_bind_mw(&mut self, qp: &mut QpH, mut w: HcaBindMwWqe) {
        w.opcode = WR_BIND_MW as u8;
        self.push_sq_wqe(qp, &w);
        self.ring_sq(qp);
    }

    /// Writes a WQE of its own layout at the SQ's producer index, which moves on.
    fn push_sq_wqe<T: ByteValued>(&mut self, qp: &mut QpH, w: &T) {
        let slot = qp.sq + (u64::from(qp.sq_pi & ((1 << qp.sq_log) - 1)) << qp.sq_shift);
        self.put(slot, w);
        qp.sq_pi = qp.sq_pi.wrapping_add(1);
    }

    /// A memory window of `mw_type` in PD `pdn`: its key, or the command's status.
    pub fn alloc_mw(&mut self, pdn: u32, mw_type: u32) -> Result<u32, u32> {
        let (st, out) = self.cmd(CMD_ALLOC_MW, &HcaCmdAllocMw { pdn, mw_type });
        match st {
            CMD_OK => Ok(decode::<HcaCmdHandle>(&out).handle),
            e => Err(e),
        }
    }

    /// Publishes the SQ producer index, names the QP in its send-doorbell ring (if it has
    /// one) and rings DB_SQ.
    pub fn ring_sq(&mut self, qp: &QpH) {
        self.hca.bar2().store_u32(qp.db, qp.sq_pi);
        if let Some(ring) = qp.ring {
            name_in_ring(self.hca.bar2(), ring, qp.qpn);
        }
        self.hca.doorbell(DB_SQ);
    }

    pub fn post_send(&mut self, qp: &mut QpH, wqe: HcaSendWqe, sges: &[HcaSge]) {
        let mut w = wqe;
        w.num_sge = sges.len() as u8;
        self.write_send(qp, &w, sges, &[]);
        self.ring_sq(qp);
    }

    /// A receive WQE (header and SGEs) at `slot`, of a QP's ring or an SRQ's.
    fn write_recv(&mut self, slot: u64, wr_id: u64, sges: &[HcaSge]) {
        let hdr = HcaRecvWqe {
            wr_id,
            num_sge: sges.len() as u8,
            ..Default::default()
        };
        self.put(slot, &hdr);
        for (i, s) in sges.iter().enumerate() {
            self.put(slot + 16 + 16 * i as u64, s);
        }
    }

    pub fn post_recv(&mut self, qp: &mut QpH, wr_id: u64, sges: &[HcaSge]) {
        let slot = qp.rq + (u64::from(qp.rq_pi & ((1 << qp.rq_log) - 1)) << qp.rq_shift);
        self.write_recv(slot, wr_id, sges);
        qp.rq_pi = qp.rq_pi.wrapping_add(1);
        self.hca.bar2().store_u32(qp.db + 4, qp.rq_pi);
        self.hca.doorbell(DB_RQ);
    }

    /// Takes the next CQE if the device wrote one, and publishes the new consumer index.
    pub fn poll_cq(&mut self, cq: &mut CqH) -> Option<HcaCqe> {
        let slot = cq.ring + u64::from(cq.ci & ((1 << cq.log) - 1)) * 32;
        // The owner byte first, then (after an acquire fence) the entry, as a driver must:
        // the device writes the entry, then its owner byte. Read in one copy, the entry
        // may come from the lap before while the byte is this lap's (a device run by
        // another thread writes it meanwhile).
        let mut owner = [0u8];
        (self.ram)
            .read(slot + u64::from(CQE_OWNER_OFFSET), &mut owner)
            .expect("CQ ring inside guest memory");
        if owner[0] != owner_bit(cq.ci, cq.log) {
            return None;
        }
        std::sync::atomic::fence(Ordering::Acquire);
        let cqe: HcaCqe = read_obj(&self.ram, slot).expect("CQ ring inside guest memory");
        cq.ci = cq.ci.wrapping_add(1);
        self.hca.bar2().store_u32(cq.db, cq.ci);
        Some(cqe)
    }

    pub fn drain_cq(&mut self, cq: &mut CqH) -> Vec<HcaCqe> {
        std::iter::from_fn(|| self.poll_cq(cq)).collect()
    }

    /// The CQEs there, as (wr_id, status).
    pub fn drain_statuses(&mut self, cq: &mut CqH) -> Vec<(u64, u32)> {
        let cqes = self.drain_cq(cq);
        cqes.iter()
            .map(|c| (c.wr_id, u32::from(c.status)))
            .collect()
    }

    pub fn arm_cq(&mut self, cq: &mut CqH, solicited_only: bool) {
        cq.arm_sn += 1;
        let word = (cq.arm_sn << 1) | u32::from(solicited_only);
        self.hca.bar2().store_u32(cq.db + 4, word);
        self.hca.doorbell(DB_CQ_ARM);
    }

    /// Drains EQ `v`, publishing the consumer index.
    pub fn drain_eq(&mut self, v: u32) -> Vec<HcaEqe> {
        let mut out = Vec::new();
        let bar2 = self.hca.bar2();
        loop {
            let ci = self.eq_ci[v as usize];
            let slot = BAR2_EQ_OFFSET + (v * EQ_ENTRIES + (ci & (EQ_ENTRIES - 1))) * 16;
            let e: HcaEqe = bar2.read_obj(slot);
            if e.owner != owner_bit(ci, EQ_LOG_ENTRIES) {
                break;
            }
            out.push(e);
            self.eq_ci[v as usize] = ci.wrapping_add(1);
        }
        bar2.store_u32(BAR2_EQ_DB_OFFSET + v * EQ_DB_STRIDE, self.eq_ci[v as usize]);
        out
    }
}

/// Copies a command's output bytes into its struct.
/// Whether the device behind `bar2` reads send-doorbell rings (CAP_SQ_RING); if so, the
/// driver says it writes kernel rings 0 (its own) and 1 (where tests name QPs from other
/// threads, as from another CPU).
fn has_sq_rings(bar2: &DeviceMemory) -> bool {
    let info: HcaDevInfo = bar2.read_obj(BAR2_INFO_OFFSET);
    let has = info.caps & CAP_SQ_RING != 0;
    if has {
        bar2.store_u32(BAR2_SQ_RING_OFFSET + SQ_RINGS_USED, 2);
    }
    has
}

/// The send-doorbell ring that names a QP whose record is at `db`, if it is named.
fn sq_ring_for(named: bool, db: u32) -> Option<u32> {
    let uar = db.checked_sub(BAR2_UAR_OFFSET).map(|o| o / UAR_SIZE);
    named.then(|| match uar {
        None => BAR2_SQ_RING_OFFSET,
        Some(page) => BAR2_UAR_OFFSET + page * UAR_SIZE + hca_model::uapi::UAR_SQ_RING_OFFSET,
    })
}

/// QP `qpn`'s doorbell record when it was created with `db_offset`.
fn qp_record(qpn: u32, db_offset: u32) -> u32 {
    if db_offset == 0 {
        BAR2_QP_DB_OFFSET + qpn * 8
    } else {
        db_offset
    }
}

pub fn decode<T: ByteValued + Default>(out: &[u8]) -> T {
    let mut v = T::default();
    let n = std::mem::size_of::<T>();
    v.as_mut_slice().copy_from_slice(&out[..n]);
    v
}

fn rand_tag() -> u32 {
    use std::sync::atomic::AtomicU32;
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

pub fn sge(addr: u64, length: u32, lkey: u32) -> HcaSge {
    HcaSge { addr, length, lkey }
}

pub fn send_wr(wr_id: u64, opcode: u32, flags: u32) -> HcaSendWqe {
    HcaSendWqe {
        wr_id,
        opcode: opcode as u8,
        flags: flags as u8,
        ..Default::default()
    }
}

/// A signaled masked atomic (`WR_MASKED_CMP_SWP` or `WR_MASKED_FETCH_ADD`) on the 8 bytes
/// at `remote_addr` under `rkey`, as the send WQE it overlays.
pub fn masked_atomic_wr(
    wr_id: u64,
    opcode: u32,
    remote_addr: u64,
    rkey: u32,
) -> HcaMaskedAtomicWqe {
    HcaMaskedAtomicWqe {
        wr_id,
        opcode: opcode as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr,
        rkey,
        ..Default::default()
    }
}

/// `w` as the send WQE whose bytes it has.
pub fn as_send_wqe(w: &HcaMaskedAtomicWqe) -> HcaSendWqe {
    let mut s = HcaSendWqe::default();
    s.as_mut_slice().copy_from_slice(w.as_slice());
    s
}

/// An unsignaled UD SEND to QP `remote_qpn` at `dlid`, with Q_Key `qkey`.
pub fn ud_send_wr(dlid: u16, remote_qpn: u32, qkey: u32) -> HcaSendWqe {
    HcaSendWqe {
        opcode: WR_SEND as u8,
        ud_dlid: dlid,
        ud_remote_qpn: remote_qpn,
        ud_qkey: qkey,
        ..Default::default()
    }
}

/// Two nodes on one fabric with one RC QP each, connected; shared helpers for many tests.
pub struct Pair {
    pub fabric: Fabric,
    pub a: Driver,
    pub b: Driver,
    pub pd_a: u32,
    pub pd_b: u32,
    pub cq_a: CqH,
    pub cq_b: CqH,
    pub qa: QpH,
    pub qb: QpH,
    /// DMA MRs with full access on each side.
    pub key_a: u32,
    pub key_b: u32,
}

/// (timeout 14 = 67 ms, retry_cnt 7, rnr_retry 7 = forever), what kernel consumers use.
pub const DEFAULT_RTS: (u8, u8, u8) = (14, 7, 7);

pub const ALL_ACCESS: u32 =
    ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;

impl Pair {
    pub fn new(mtu: u8) -> Self {
        Self::with_access(mtu, ALL_ACCESS)
    }

    /// `qp_access` is what both QPs allow remote peers to do. The fabric's clock is
    /// manual: the test thread alone moves packets (no timer thread pumps under it), so a
    /// WR's completion is there when post_send returns; timeouts run on `advance`.
    pub fn with_access(mtu: u8, qp_access: u32) -> Self {
        Self::build(Fabric::with_manual_clock(), mtu, qp_access, DEFAULT_RTS)
    }

    /// A pair on `fabric` (a manual clock, say) with the QPs' (timeout, retry_cnt,
    /// rnr_retry) given.
    pub fn build(fabric: Fabric, mtu: u8, qp_access: u32, rts: (u8, u8, u8)) -> Self {
        Self::build_with_memory(fabric, 8, mtu, qp_access, rts)
    }

    /// Like [`Pair::build`] with `mib` MiB of guest memory on each side (long messages).
    pub fn build_with_memory(
        fabric: Fabric,
        mib: u64,
        mtu: u8,
        qp_access: u32,
        rts: (u8, u8, u8),
    ) -> Self {
        Self::build_of(QPT_RC, fabric, mib, mtu, qp_access, rts)
    }

    /// Two UC QPs, connected, on a manual clock (as [`Pair::with_access`]'s).
    pub fn uc(mtu: u8, qp_access: u32) -> Self {
        let fabric = Fabric::with_manual_clock();
        Self::build_of(QPT_UC, fabric, 8, mtu, qp_access, DEFAULT_RTS)
    }

    fn build_of(
        qp_type: u32,
        fabric: Fabric,
        mib: u64,
        mtu: u8,
        qp_access: u32,
        rts: (u8, u8, u8),
    ) -> Self {
        let mut a = Driver::new(Some(&fabric), mib);
        let mut b = Driver::new(Some(&fabric), mib);
        let pd_a = a.alloc_pd();
        let pd_b = b.alloc_pd();
        let cq_a = a.create_cq(8);
        let cq_b = b.create_cq(8);
        let qa = a.create_qp(qp_type, pd_a, cq_a.cqn, cq_a.cqn);
        let qb = b.create_qp(qp_type, pd_b, cq_b.cqn, cq_b.cqn);
        let (la, lb) = (a.lid(), b.lid());
        if qp_type == QPT_UC {
            a.bring_up_uc(qa.qpn, lb, qb.qpn, qp_access, mtu);
            b.bring_up_uc(qb.qpn, la, qa.qpn, qp_access, mtu);
        } else {
            a.bring_up_rc_tuned(qa.qpn, lb, qb.qpn, qp_access, mtu, rts);
            b.bring_up_rc_tuned(qb.qpn, la, qa.qpn, qp_access, mtu, rts);
        }
        let key_a = a.reg_dma_mr(pd_a, ALL_ACCESS);
        let key_b = b.reg_dma_mr(pd_b, ALL_ACCESS);
        Self {
            fabric,
            a,
            b,
            pd_a,
            pd_b,
            cq_a,
            cq_b,
            qa,
            qb,
            key_a,
            key_b,
        }
    }
}

impl Pair {
    /// `rounds` batches of 8 SENDs from A to B, each carrying its sequence number; asserts
    /// that every one completes once, intact and in order (for traffic beside other
    /// threads' on one fabric).
    pub fn sends_in_order(&mut self, rounds: u64) {
        let (src, dst) = (self.a.alloc(64, 8), self.b.alloc(64, 8));
        let mut next = 0u64;
        for _ in 0..rounds {
            for k in 0..8u64 {
                self.b
                    .post_recv(&mut self.qb, next + k, &[sge(dst + 8 * k, 8, self.key_b)]);
                self.a.write(src + 8 * k, &(next + k).to_le_bytes());
                let mut wr = send_wr(next + k, WR_SEND, WQE_SIGNALED);
                wr.num_sge = 1;
                let list = [sge(src + 8 * k, 8, self.key_a)];
                self.a.write_send(&mut self.qa, &wr, &list, &[]);
            }
            self.a.ring_sq(&self.qa);
            let (mut sent, mut got) = (0, 0);
            while (sent, got) != (8, 8) {
                if let Some(c) = self.a.poll_cq(&mut self.cq_a) {
                    assert_eq!(u32::from(c.status), WC_SUCCESS);
                    sent += 1;
                }
                if let Some(c) = self.b.poll_cq(&mut self.cq_b) {
                    assert_eq!(u32::from(c.status), WC_SUCCESS);
                    assert_eq!(c.wr_id, next + got, "receives complete in order");
                    let mut v = [0u8; 8];
                    v.copy_from_slice(&self.b.read(dst + 8 * got, 8));
                    let v = u64::from_le_bytes(v);
                    assert_eq!(v, next + got, "SEND {} carried its own bytes", next + got);
                    got += 1;
                }
                std::thread::yield_now();
            }
            next += 8;
        }
    }

    /// `n` signaled 8-byte SENDs from A (wr_ids 0..n), all from `from`, rung with one
    /// doorbell.
    pub fn sends_at_once(&mut self, n: u64, from: HcaSge) {
        for i in 0..n {
            let wr = HcaSendWqe {
                num_sge: 1,
                ..send_wr(i, WR_SEND, WQE_SIGNALED)
            };
            self.a.write_send(&mut self.qa, &wr, &[from], &[]);
        }
        self.a.ring_sq(&self.qa);
    }

    /// Another connected RC QP pair: A's QP reports to CQ `cqs.0`, B's to `cqs.1`; rings of
    /// `2^log` entries; `flags_a` for A's QP (QP_FLAG_SIG_ALL, say).
    pub fn connect_more(&mut self, cqs: (u32, u32), log: u32, flags_a: u32) -> (QpH, QpH) {
        let qa = self
            .a
            .try_create_qp(QPT_RC, self.pd_a, (cqs.0, cqs.0), (log, log), flags_a)
            .expect("create QP");
        let qb = self
            .b
            .try_create_qp(QPT_RC, self.pd_b, (cqs.1, cqs.1), (log, log), 0)
            .expect("create QP");
        let (la, lb) = (self.a.lid(), self.b.lid());
        self.a
            .bring_up_rc(qa.qpn, lb, qb.qpn, ALL_ACCESS, MTU_4096 as u8);
        self.b
            .bring_up_rc(qb.qpn, la, qa.qpn, ALL_ACCESS, MTU_4096 as u8);
        (qa, qb)
    }
}

/// A deterministic byte pattern, different per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}
