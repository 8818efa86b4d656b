//! Send-doorbell rings: a send doorbell runs the QPs its rings name, looks at the QPs no ring
//! names (an older driver's), and falls back to a look at every QP when a ring overran.
//! What a ring holds is hostile: a QPN of another context, of no QP, or out of range does
//! nothing but count.

use hca_model::abi::*;
use hca_model::uapi::UAR_SQ_RING_OFFSET;
use hca_test_driver::*;

/// Posts one 8-byte SEND on the pair's A -> B QPs with a receive for it, and checks that
/// both completions arrive.
fn send_one(p: &mut Pair, wr_id: u64) {
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.write(src, &wr_id.to_le_bytes());
    p.b.post_recv(&mut p.qb, wr_id, &[sge(dst, 8, p.key_b)]);
    let mut w = send_wr(wr_id, WR_SEND, WQE_SIGNALED);
    w.num_sge = 1;
    p.a.post_send(&mut p.qa, w, &[sge(src, 8, p.key_a)]);
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(wr_id, WC_SUCCESS)]);
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![(wr_id, WC_SUCCESS)]);
    assert_eq!(p.b.read(dst, 8), wr_id.to_le_bytes());
}

#[test]
fn test_a_named_qp_is_served_without_a_look_at_the_other_qps() {
    let mut p = Pair::new(MTU_4096 as u8);
    assert!(p.qa.ring.is_some(), "the test driver names its QPs");
    for _ in 0..32 {
        let q = p.a.create_qp(QPT_RC, p.pd_a, p.cq_a.cqn, p.cq_a.cqn);
        p.a.bring_up_rc(q.qpn, p.b.lid(), p.qb.qpn, ALL_ACCESS, MTU_4096 as u8);
    }
    let before = p.a.hca.stats();
    for i in 0..10 {
        send_one(&mut p, i);
    }
    let after = p.a.hca.stats();
    assert_eq!(after.sq_named - before.sq_named, 10);
    assert_eq!(after.sq_scans, before.sq_scans, "no look at every QP");
    assert_eq!(after.wqes - before.wqes, 10);
    assert_eq!(after.sq_ring_ignored + after.sq_ring_overruns, 0);
}

#[test]
fn test_a_ring_that_overran_falls_back_to_a_look_at_every_qp_and_loses_nothing() {
    let mut p = Pair::new(MTU_4096 as u8);
    let ring = p.qa.ring.unwrap();
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.write(src, b"overrun!");
    p.b.post_recv(&mut p.qb, 1, &[sge(dst, 8, p.key_b)]);
    let mut w = send_wr(1, WR_SEND, WQE_SIGNALED);
    w.num_sge = 1;
    p.a.write_send(&mut p.qa, &w, &[sge(src, 8, p.key_a)], &[]);
    p.a.hca.bar2().store_u32(p.qa.db, p.qa.sq_pi);
    // The QP's name, then a lap of others over it before the device reads the ring.
    name_in_ring(p.a.hca.bar2(), ring, p.qa.qpn);
    for _ in 0..SQ_RING_ENTRIES {
        name_in_ring(p.a.hca.bar2(), ring, 0xdead);
    }
    let before = p.a.hca.stats();
    p.a.hca.doorbell(DB_SQ);
    let after = p.a.hca.stats();
    assert_eq!(after.sq_ring_overruns - before.sq_ring_overruns, 1);
    assert_eq!(after.sq_scans - before.sq_scans, 1);
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(1, WC_SUCCESS)]);
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![(1, WC_SUCCESS)]);
    assert_eq!(p.b.read(dst, 8), b"overrun!");

    // The device took up the ring where the writer was: the next name is served alone.
    let before = p.a.hca.stats();
    send_one(&mut p, 2);
    let after = p.a.hca.stats();
    assert_eq!(after.sq_named - before.sq_named, 1);
    assert_eq!(after.sq_ring_overruns, before.sq_ring_overruns);
    assert_eq!(after.sq_scans, before.sq_scans);
}

#[test]
fn test_unnamed_qps_of_an_older_driver_send_beside_named_ones() {
    let mut p = Pair::new(MTU_4096 as u8);
    p.a.name_sqs = false;
    let mut old = p.a.create_qp(QPT_RC, p.pd_a, p.cq_a.cqn, p.cq_a.cqn);
    assert_eq!(old.ring, None);
    let mut peer = p.b.create_qp(QPT_RC, p.pd_b, p.cq_b.cqn, p.cq_b.cqn);
    p.a.bring_up_rc(old.qpn, p.b.lid(), peer.qpn, ALL_ACCESS, MTU_4096 as u8);
    p.b.bring_up_rc(peer.qpn, p.a.lid(), old.qpn, ALL_ACCESS, MTU_4096 as u8);
    let (src, dst) = (p.a.alloc(8, 8), p.b.alloc(8, 8));
    p.a.write(src, b"unnamed!");
    p.b.post_recv(&mut peer, 7, &[sge(dst, 8, p.key_b)]);
    let mut w = send_wr(7, WR_SEND, WQE_SIGNALED);
    w.num_sge = 1;
    let before = p.a.hca.stats();
    p.a.post_send(&mut old, w, &[sge(src, 8, p.key_a)]);
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(7, WC_SUCCESS)]);
    assert_eq!(p.b.read(dst, 8), b"unnamed!");
    let after = p.a.hca.stats();
    assert_eq!(after.sq_named, before.sq_named, "no ring named it");
    assert_eq!(
        after.sq_scans, before.sq_scans,
        "the unnamed QPs alone were looked at"
    );
    p.b.drain_cq(&mut p.cq_b);
    send_one(&mut p, 8);
}

#[test]
fn test_a_ring_naming_another_contexts_qp_or_no_qp_does_nothing() {
    let mut p = Pair::new(MTU_4096 as u8);
    // A process on UAR page 3 with an RC QP to B, another on page 4.
    p.a.use_uar(Some(3));
    let pd3 = p.a.alloc_user_pd();
    let mut cq3 = p.a.create_cq(6);
    let mut q3 = p.a.create_qp(QPT_RC, pd3, cq3.cqn, cq3.cqn);
    let mut peer = p.b.create_qp(QPT_RC, p.pd_b, p.cq_b.cqn, p.cq_b.cqn);
    p.a.bring_up_rc(q3.qpn, p.b.lid(), peer.qpn, ALL_ACCESS, MTU_4096 as u8);
    p.b.bring_up_rc(peer.qpn, p.a.lid(), q3.qpn, ALL_ACCESS, MTU_4096 as u8);
    assert_eq!(
        q3.ring,
        Some(BAR2_UAR_OFFSET + 3 * UAR_SIZE + UAR_SQ_RING_OFFSET)
    );
    p.a.use_uar(Some(4));
    let pd4 = p.a.alloc_user_pd();
    let cq4 = p.a.create_cq(6);
    let q4 = p.a.create_qp(QPT_RC, pd4, cq4.cqn, cq4.cqn);
    p.a.use_uar(None);

    let src = p.a.alloc(4096, 4096);
    let key3 = p.a.reg_mr(pd3, src, 4096, ACCESS_LOCAL_WRITE);
    let dst = p.b.alloc(8, 8);
    p.b.post_recv(&mut peer, 1, &[sge(dst, 8, p.key_b)]);
    let mut w = send_wr(1, WR_SEND, WQE_SIGNALED);
    w.num_sge = 1;
    p.a.write_send(&mut q3, &w, &[sge(src, 8, key3)], &[]);
    p.a.hca.bar2().store_u32(q3.db, q3.sq_pi);

    // Page 4's process names page 3's QP; the kernel's ring names it (a user QP) and a
    // kernel QP of B; both name QPNs of no QP, or out of range.
    let bar2 = p.a.hca.bar2();
    let ring4 = q4.ring.unwrap();
    let kernel = p.qa.ring.unwrap();
    let bogus = [q3.qpn, 0, 1, 1000, MAX_QP, u32::MAX];
    for q in bogus {
        name_in_ring(bar2, ring4, q);
        name_in_ring(bar2, kernel, q);
    }
    let before = p.a.hca.stats();
    p.a.hca.doorbell(DB_SQ);
    let after = p.a.hca.stats();
    assert_eq!(after.sq_ring_ignored - before.sq_ring_ignored, 12);
    assert_eq!(after.wqes, before.wqes, "nothing ran");
    assert_eq!(after.sq_named + after.sq_ring_overruns, before.sq_named);
    assert!(p.a.drain_cq(&mut cq3).is_empty());

    // Its own ring names it: it sends.
    p.a.ring_sq(&q3);
    assert_eq!(p.a.drain_statuses(&mut cq3), vec![(1, WC_SUCCESS)]);
    assert_eq!(p.b.drain_statuses(&mut p.cq_b), vec![(1, WC_SUCCESS)]);
}

#[test]
fn test_qp_flag_sq_ring_is_advertised() {
    let p = Pair::new(MTU_4096 as u8);
    let info: HcaDevInfo = p.a.hca.bar2().read_obj(BAR2_INFO_OFFSET);
    assert_ne!(info.caps & CAP_SQ_RING, 0);
}
