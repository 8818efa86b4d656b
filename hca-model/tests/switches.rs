//! A subnet of several switches on the fabric: packets follow the forwarding tables the SM
//! programs, a cut inter-switch link loses what its routes carry until the SM sweeps and
//! routes around it, and a part of the subnet cut off from the SM is reported out of
//! service.

use std::time::Duration;

use hca_model::abi::*;
use hca_model::sa::SM_LID;
use hca_model::subnet::{SwitchSpec, Topology};
use hca_model::Fabric;
use hca_test_driver::*;

const MS: Duration = Duration::from_millis(1);
const MTU_1024: u8 = 3;

fn sw(name: &str, hcas: &[u16]) -> SwitchSpec {
    SwitchSpec {
        name: name.into(),
        hcas: hcas.to_vec(),
    }
}

/// A ring of three switches: LID 1 on s0, LID 2 on s1, nothing on s2; links s0-s1 (0),
/// s1-s2 (1), s2-s0 (2).
fn ring() -> Topology {
    Topology::new(
        vec![sw("s0", &[1]), sw("s1", &[2]), sw("s2", &[])],
        vec![(0, 1), (1, 2), (2, 0)],
    )
    .unwrap()
}

/// Advances virtual time a millisecond at a time until `cq` has given `n` CQEs or
/// `limit` passes.
fn collect(
    fabric: &Fabric,
    d: &mut Driver,
    cq: &mut CqH,
    n: usize,
    limit: Duration,
) -> Vec<HcaCqe> {
    let start = fabric.now_ns();
    let mut got = d.drain_cq(cq);
    while got.len() < n && fabric.now_ns() - start < limit.as_nanos() as u64 {
        fabric.advance(MS);
        got.extend(d.drain_cq(cq));
    }
    got
}

fn write(p: &mut Pair, wr_id: u64, src: u64, dst: u64, len: u32) {
    let mut w = send_wr(wr_id, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, p.key_b);
    p.a.post_send(&mut p.qa, w, &[sge(src, len, p.key_a)]);
}

#[test]
fn test_rc_crosses_switches_and_rides_out_a_cut_link_the_sm_routes_around() {
    let fabric = Fabric::with_manual_clock();
    fabric.set_topology(ring());
    // timeout 12 (16.8 ms) x 8 tries: the SM's sweep one tick after the cut is well within.
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (12, 7, 7));
    assert_eq!((p.a.lid(), p.b.lid()), (1, 2));
    let s = fabric.subnet();
    assert_eq!(s.hops(1, 2), Some(2), "s0, s1");
    let src = p.a.alloc(16384, 64);
    let dst = p.b.alloc(16384, 64);
    p.a.write(src, &(0..16384u32).map(|i| i as u8).collect::<Vec<_>>());
    write(&mut p, 1, src, dst, 4096);
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 1, 10 * MS);
    assert_eq!((c.len(), c[0].status), (1, 0), "across two switches");
    // Cut s0-s1: what is sent now is lost, then the sweep routes it through s2.
    fabric.set_switch_link(0, false).unwrap();
    assert!(
        !fabric.subnet().reaches(1, 2),
        "the old tables use the cut link"
    );
    let lost_before = fabric.stats().unrouted;
    write(&mut p, 2, src + 4096, dst + 4096, 4096);
    assert!(
        fabric.stats().unrouted > lost_before,
        "lost on the cut link"
    );
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!((c.len(), c[0].wr_id, c[0].status), (1, 2, 0), "{c:?}");
    let s = fabric.subnet();
    assert_eq!(s.hops(1, 2), Some(3), "s0, s2, s1");
    assert!(p.a.hca.stats().retransmits >= 1);
    // Back up: the next sweep takes the short way again.
    fabric.set_switch_link(0, true).unwrap();
    fabric.advance(MS);
    assert_eq!(fabric.subnet().hops(1, 2), Some(2));
    write(&mut p, 3, src + 8192, dst + 8192, 8192);
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 1, 10 * MS);
    assert_eq!((c.len(), c[0].status), (1, 0));
    assert_eq!(p.b.read(dst, 16384), p.a.read(src, 16384));
    assert_eq!(fabric.set_switch_link(3, false), None, "no link 3");
}

#[test]
fn test_with_no_way_round_rc_fails_in_bounded_time_and_the_sm_reports_the_port_lost() {
    let fabric = Fabric::with_manual_clock();
    let t = Topology::new(vec![sw("a", &[1, 3]), sw("b", &[2])], vec![(0, 1)]).unwrap();
    fabric.set_topology(t);
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (10, 3, 7));
    // A subscriber to trap 65 at LID 3, as ib_sa subscribes for IPoIB.
    let mut g = Driver::new(Some(&fabric), 4);
    assert_eq!(g.lid(), 3);
    let pd = g.alloc_pd();
    let mut cq = g.create_cq(6);
    let mut qp = g.create_qp(QPT_GSI, pd, cq.cqn, cq.cqn);
    g.bring_up_ud(qp.qpn, GSI_QKEY, true);
    let rbuf = g.alloc(4 * 296, 64);
    for i in 0..4u64 {
        g.post_recv(
            &mut qp,
            100 + i,
            &[sge(rbuf + i * 296, 296, LOCAL_DMA_LKEY)],
        );
    }
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x03, 2, 0x02]); // SA, Set
    m[16..18].copy_from_slice(&0x0003u16.to_be_bytes()); // InformInfo
    let d = &mut m[56..];
    d[16..18].copy_from_slice(&0xffffu16.to_be_bytes()); // every LID
    (d[22], d[23]) = (1, 1); // generic, subscribe
    d[26..28].copy_from_slice(&65u16.to_be_bytes());
    d[28..32].copy_from_slice(&(GSI_QPN << 8).to_be_bytes());
    let sbuf = g.alloc(256, 64);
    g.write(sbuf, &m);
    let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
    (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (SM_LID, GSI_QPN, GSI_QKEY);
    g.post_send(&mut qp, wr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let got = g.drain_cq(&mut cq);
    let answer = got.iter().find(|c| u32::from(c.opcode) == CQE_OP_RECV);
    let answer = answer.expect("the SA answered the subscription");
    let off = (answer.wr_id - 100) * 296 + 40;
    let a = g.read(rbuf + off, 256);
    assert_eq!(
        u16::from_be_bytes([a[4], a[5]]),
        0,
        "subscribed: {:x?}",
        &a[..8]
    );
    // The only link goes: B's side is cut off. A's WR fails after its retries.
    fabric.set_switch_link(0, false).unwrap();
    let src = p.a.alloc(4096, 64);
    let dst = p.b.alloc(4096, 64);
    write(&mut p, 7, src, dst, 4096);
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 1, Duration::from_secs(2));
    assert_eq!(
        (c.len(), c[0].wr_id, u32::from(c[0].status)),
        (1, 7, WC_RETRY_EXC_ERR)
    );
    // The sweep found LID 2 gone: trap 65 for its GID.
    let reports: Vec<Vec<u8>> = g
        .drain_cq(&mut cq)
        .iter()
        .filter(|c| u32::from(c.opcode) == CQE_OP_RECV)
        .map(|c| g.read(rbuf + (c.wr_id - 100) * 296 + 40, 256))
        .collect();
    let trap65: Vec<&Vec<u8>> = reports
        .iter()
        .filter(|r| r[3] == 0x06 && u16::from_be_bytes([r[56 + 4], r[56 + 5]]) == 65)
        .collect();
    assert_eq!(trap65.len(), 1, "one Report: {reports:x?}");
    let port_b: HcaPortAttr = decode(&p.b.cmd_raw(CMD_QUERY_PORT, &[], 0).1);
    let gid_b = hca_model::sa::port_gid(port_b.port_guid);
    assert_eq!(trap65[0][56 + 16..56 + 32], gid_b[..], "LID 2's GID");
}
