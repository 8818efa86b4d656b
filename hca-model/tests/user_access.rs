//! User processes' queues: doorbell records in a user access region (UAR) and user PDs.
//! What a hostile process can write is its own UAR page and its own rings; these tests
//! check that neither reaches beyond its own queues and its own registered memory.

use hca_model::abi::*;
use hca_model::Fabric;
use hca_test_driver::*;

/// A on UAR page 3 with a user PD (a process's RC QP), B a kernel consumer; both RTS.
struct UserPair {
    a: Driver,
    b: Driver,
    pd_a: u32,
    cq_a: CqH,
    cq_b: CqH,
    qa: QpH,
    qb: QpH,
    key_b: u32,
    _fabric: Fabric,
}

fn user_pair() -> UserPair {
    let fabric = Fabric::with_manual_clock();
    let mut a = Driver::new(Some(&fabric), 8);
    let mut b = Driver::new(Some(&fabric), 8);
    a.use_uar(Some(3));
    let pd_a = a.alloc_user_pd();
    let cq_a = a.create_cq(6);
    let qa = a.create_qp(QPT_RC, pd_a, cq_a.cqn, cq_a.cqn);
    let pd_b = b.alloc_pd();
    let cq_b = b.create_cq(6);
    let qb = b.create_qp(QPT_RC, pd_b, cq_b.cqn, cq_b.cqn);
    let (la, lb) = (a.lid(), b.lid());
    a.bring_up_rc(qa.qpn, lb, qb.qpn, ALL_ACCESS, MTU_4096 as u8);
    b.bring_up_rc(qb.qpn, la, qa.qpn, ALL_ACCESS, MTU_4096 as u8);
    let key_b = b.reg_dma_mr(pd_b, ALL_ACCESS);
    UserPair {
        a,
        b,
        pd_a,
        cq_a,
        cq_b,
        qa,
        qb,
        key_b,
        _fabric: fabric,
    }
}

#[test]
fn test_records_of_uar_queues_lie_in_their_page() {
    let p = user_pair();
    let page = BAR2_UAR_OFFSET + 3 * UAR_SIZE;
    assert!((page..page + UAR_SIZE).contains(&p.cq_a.db));
    assert!((page..page + UAR_SIZE).contains(&p.qa.db));
    assert_ne!(p.cq_a.db, p.qa.db);
}

#[test]
fn test_a_uar_qp_sends_when_its_own_record_moves_and_not_when_the_handles_record_does() {
    let mut p = user_pair();
    let len = 300;
    let src = p.a.alloc(4096, 4096);
    let key_a = p.a.reg_mr(p.pd_a, src, 4096, ACCESS_LOCAL_WRITE);
    let data = pattern(len, 9);
    p.a.write(src, &data);
    let dst = p.b.alloc(4096, 64);
    p.b.post_recv(&mut p.qb, 5, &[sge(dst, 4096, p.key_b)]);
    let mut w = send_wr(1, WR_SEND, WQE_SIGNALED);
    w.num_sge = 1;
    p.a.write_send(&mut p.qa, &w, &[sge(src, len as u32, key_a)], &[]);

    // A producer index in the QPN's kernel record (someone else's page) is not this QP's.
    p.a.hca
        .bar2()
        .store_u32(BAR2_QP_DB_OFFSET + p.qa.qpn * 8, p.qa.sq_pi);
    p.a.hca.doorbell(DB_SQ);
    assert!(
        p.a.drain_cq(&mut p.cq_a).is_empty(),
        "kernel record ignored"
    );
    assert!(p.b.drain_cq(&mut p.cq_b).is_empty());

    p.a.ring_sq(&p.qa);
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(1, WC_SUCCESS)]);
    let got = p.b.drain_cq(&mut p.cq_b);
    assert_eq!((got.len(), got[0].byte_len as usize), (1, len));
    assert_eq!(p.b.read(dst, len), data);

    // Receives and the CQ's arm word go through the UAR page too.
    let rbuf = p.a.alloc(4096, 4096);
    let rkey = p.a.reg_mr(p.pd_a, rbuf, 4096, ACCESS_LOCAL_WRITE);
    p.a.post_recv(&mut p.qa, 8, &[sge(rbuf, 4096, rkey)]);
    p.a.arm_cq(&mut p.cq_a, false);
    let before = p.a.irq.get(VEC_COMP_FIRST);
    let sb = p.b.alloc(64, 64);
    p.b.write(sb, b"to the process");
    p.b.post_send(&mut p.qb, send_wr(2, WR_SEND, 0), &[sge(sb, 14, p.key_b)]);
    let got = p.a.drain_cq(&mut p.cq_a);
    assert_eq!((got.len(), got[0].wr_id, got[0].byte_len), (1, 8, 14));
    assert_eq!(p.a.read(rbuf, 14), b"to the process");
    assert!(
        p.a.irq.get(VEC_COMP_FIRST) > before,
        "armed through the UAR"
    );
}

#[test]
fn test_a_user_pd_cannot_use_the_reserved_lkey_or_physical_memory() {
    let mut p = user_pair();
    // The reserved lkey names all of guest memory: a process's WQE may not use it.
    let dst = p.b.alloc(4096, 64);
    p.b.post_recv(&mut p.qb, 5, &[sge(dst, 4096, p.key_b)]);
    let secret = p.a.alloc(64, 64);
    p.a.write(secret, b"kernel memory");
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(secret, 13, LOCAL_DMA_LKEY)],
    );
    let st = p.a.drain_statuses(&mut p.cq_a);
    assert_eq!(st.first(), Some(&(1, WC_LOC_PROT_ERR)));
    assert_ne!(p.b.read(dst, 13), b"kernel memory");

    // Nor may its kernel make it a physical or fast-registration MR.
    let phys = HcaCmdRegMr {
        length: u64::MAX,
        pdn: p.pd_a,
        access: ALL_ACCESS,
        flags: MR_FLAG_PHYS,
        ..Default::default()
    };
    assert_eq!(p.a.try_reg_mr(&phys), Err(CMD_BAD_PARAM));
    let frmr = HcaCmdRegMr {
        pdn: p.pd_a,
        npages: 16,
        flags: MR_FLAG_FAST_REG,
        ..Default::default()
    };
    assert_eq!(p.a.try_reg_mr(&frmr), Err(CMD_BAD_PARAM));
    // A management QP in a user PD is refused.
    assert_eq!(
        p.a.try_create_qp(QPT_GSI, p.pd_a, (p.cq_a.cqn, p.cq_a.cqn), (4, 4), 0)
            .err(),
        Some(CMD_BAD_PARAM)
    );
    // A kernel PD keeps the reserved lkey.
    let kpd = p.a.alloc_pd();
    assert!(p.a.try_reg_mr(&HcaCmdRegMr { pdn: kpd, ..phys }).is_ok());
}

#[test]
fn test_records_outside_the_user_access_regions_are_refused() {
    let mut a = Driver::new(None, 4);
    let ring = a.alloc(32 << 4, 64);
    for db_offset in [
        BAR2_MAILBOX_OFFSET,
        BAR2_QP_DB_OFFSET,
        BAR2_UAR_OFFSET - 8,
        BAR2_UAR_OFFSET + 4,
        BAR2_SIZE,
        u32::MAX - 7,
    ] {
        let cq = HcaCmdCreateCq {
            ring_addr: ring,
            log_entries: 4,
            vector: VEC_COMP_FIRST,
            db_offset,
            rsvd: 0,
        };
        assert_eq!(a.cmd(CMD_CREATE_CQ, &cq).0, CMD_BAD_PARAM, "{db_offset:#x}");
    }
    let bad_flags = HcaCmdAllocPd { flags: 2, rsvd: 0 };
    assert_eq!(a.cmd(CMD_ALLOC_PD, &bad_flags).0, CMD_BAD_PARAM);
}

#[test]
fn test_toggling_an_arm_word_gives_one_event_until_the_driver_consumes_it() {
    let mut p = user_pair();
    // One CQE for the process, left unpolled.
    let rbuf = p.a.alloc(4096, 4096);
    let rkey = p.a.reg_mr(p.pd_a, rbuf, 4096, ACCESS_LOCAL_WRITE);
    p.a.post_recv(&mut p.qa, 8, &[sge(rbuf, 4096, rkey)]);
    let sb = p.b.alloc(64, 64);
    p.b.post_send(&mut p.qb, send_wr(2, WR_SEND, 0), &[sge(sb, 8, p.key_b)]);
    p.a.drain_eq(VEC_COMP_FIRST);
    // Re-arming a CQ that holds a CQE fires at once; doing it 1000 times without a
    // system call must not fill the EQ the kernel's CQs share.
    for _ in 0..1000 {
        p.a.arm_cq(&mut p.cq_a, false);
    }
    let events = p.a.drain_eq(VEC_COMP_FIRST);
    let ours = events.iter().filter(|e| e.param == p.cq_a.cqn).count();
    assert_eq!(ours, 1, "one event stands for all the re-arms");
    assert_eq!(p.a.hca.stats().events_lost, 0);
    assert_eq!(p.a.hca.stats().events_coalesced, 999);
    // Once the driver consumed it, a re-arm fires again (no wake-up is lost).
    p.a.arm_cq(&mut p.cq_a, false);
    let again = p.a.drain_eq(VEC_COMP_FIRST);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].param, p.cq_a.cqn);
}
