//! A subnet of several switches on the fabric: packets follow the forwarding tables the SM
//! programs, a cut inter-switch link loses what its routes carry until the SM sweeps and
//! routes around it, and a part of the subnet cut off from the SM is reported out of
//! service. Inter-switch links are watched as a node's link is: they count what crosses
//! them each way (each switch's PMA shows it, as `perfquery` asks), and a fault plan's
//! `[[link]]` rule naming one drops, delays or cuts what crosses it and nothing else.

use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::faults::{FaultHook, FaultPlan};
use hca_model::sa::mad::{at, attr, class, PERF_CLASS_VERSION};
use hca_model::sa::SM_LID;
use hca_model::subnet::{SwitchLink, SwitchSpec, Topology};
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
    let cut = SwitchLink {
        link: 0,
        forward: true,
    };
    let st = fabric.switch_link_stats(cut).unwrap();
    assert!(
        st.discards >= 4 && st.discards == st.xmit_pkts - st.rcv_pkts && st.downed == 1,
        "counted as sent into the cut link and lost there: {st:?}"
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

/// [`ring`] with LID 3 on s2.
fn ring_with_three_nodes() -> Topology {
    Topology::new(
        vec![sw("s0", &[1]), sw("s1", &[2]), sw("s2", &[3])],
        vec![(0, 1), (1, 2), (2, 0)],
    )
    .unwrap()
}

/// A node that asks the switches' PMAs, as perfquery does: a GSI QP and its buffers.
struct PerfQuery {
    d: Driver,
    qp: QpH,
    cq: CqH,
    rbuf: u64,
    sbuf: u64,
    posted: u64,
}

impl PerfQuery {
    fn new(fabric: &Fabric) -> Self {
        let mut d = Driver::new(Some(fabric), 4);
        let pd = d.alloc_pd();
        let cq = d.create_cq(6);
        let qp = d.create_qp(QPT_GSI, pd, cq.cqn, cq.cqn);
        d.bring_up_ud(qp.qpn, GSI_QKEY, true);
        let rbuf = d.alloc(296, 64);
        let sbuf = d.alloc(256, 64);
        Self {
            d,
            qp,
            cq,
            rbuf,
            sbuf,
            posted: 0,
        }
    }

    /// PortCounters (Get, or a Set resetting `select`) of `port` of the switch at `lid`:
    /// the answer's status and data.
    fn counters(
        &mut self,
        fabric: &Fabric,
        lid: u16,
        port: u8,
        set: Option<u16>,
    ) -> (u16, Vec<u8>) {
        self.posted += 1;
        let n = self.posted;
        self.d.post_recv(
            &mut self.qp,
            1000 + n,
            &[sge(self.rbuf, 296, LOCAL_DMA_LKEY)],
        );
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[
            1,
            class::PERF_MGMT,
            PERF_CLASS_VERSION,
            1 + u8::from(set.is_some()),
        ]);
        m[8..16].copy_from_slice(&n.to_be_bytes());
        m[16..18].copy_from_slice(&attr::pma::PORT_COUNTERS.to_be_bytes());
        m[at::DATA + 1] = port;
        m[at::DATA + 2..at::DATA + 4].copy_from_slice(&set.unwrap_or(0).to_be_bytes());
        self.d.write(self.sbuf, &m);
        let mut wr = send_wr(n, WR_SEND, WQE_SIGNALED);
        (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (lid, GSI_QPN, GSI_QKEY);
        self.d
            .post_send(&mut self.qp, wr, &[sge(self.sbuf, 256, LOCAL_DMA_LKEY)]);
        let got = collect(fabric, &mut self.d, &mut self.cq, 2, 10 * MS);
        let answer = got
            .iter()
            .find(|c| u32::from(c.opcode) == CQE_OP_RECV)
            .expect("the switch's PMA answers");
        assert_eq!(answer.wr_id, 1000 + n);
        let a = self.d.read(self.rbuf + 40, 256);
        (u16::from_be_bytes([a[4], a[5]]), a[at::DATA..].to_vec())
    }
}

fn be32(d: &[u8], off: usize) -> u64 {
    u64::from(u32::from_be_bytes(d[off..off + 4].try_into().unwrap()))
}

#[test]
fn test_a_link_counts_each_way_and_each_switch_pma_shows_its_end() {
    let fabric = Fabric::with_manual_clock();
    fabric.set_topology(ring_with_three_nodes());
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (12, 7, 7));
    let mut q = PerfQuery::new(&fabric);
    assert_eq!((p.a.lid(), p.b.lid(), q.d.lid()), (1, 2, 3));
    let (s0_to_s1, s1_to_s0) = (
        SwitchLink {
            link: 0,
            forward: true,
        },
        SwitchLink {
            link: 0,
            forward: false,
        },
    );
    let before = fabric.switch_link_stats(s0_to_s1).unwrap();
    let src = p.a.alloc(8192, 64);
    let dst = p.b.alloc(8192, 64);
    p.a.write(src, &[7u8; 8192]);
    write(&mut p, 1, src, dst, 8192);
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 1, 10 * MS);
    assert_eq!((c.len(), c[0].status), (1, 0));
    let out = fabric.switch_link_stats(s0_to_s1).unwrap();
    let back = fabric.switch_link_stats(s1_to_s0).unwrap();
    // 8 KiB in 1 KiB packets: 8 over s0-s1; their ACKs come back over it.
    assert_eq!(out.xmit_pkts - before.xmit_pkts, 8, "{out:?}");
    assert_eq!(out.rcv_pkts, out.xmit_pkts);
    assert!(out.xmit_bytes - before.xmit_bytes > 8192);
    assert_eq!((out.discards, out.downed), (0, 0));
    assert!(
        back.xmit_pkts >= 1 && back.rcv_pkts == back.xmit_pkts,
        "{back:?}"
    );
    // The s0-s1 link the write crossed is not the s1-s2 link.
    let other = fabric
        .switch_link_stats(SwitchLink {
            link: 1,
            forward: true,
        })
        .unwrap();
    assert_eq!(other.xmit_pkts, 0, "{other:?}");
    assert_eq!(
        fabric.switch_link_stats(SwitchLink {
            link: 3,
            forward: true
        }),
        None
    );

    // s1's PMA (LID SM_LID - 1): its port on link 0 received what s0 sent into it.
    let ((a, pa), (b, pb)) = fabric.subnet().link_ends(0).unwrap();
    assert_eq!((a, b), (0, 1));
    let (st, d) = q.counters(&fabric, SM_LID - 1, pb, None);
    assert_eq!(st, 0);
    assert_eq!(be32(&d, 36), out.rcv_pkts, "s1 PortRcvPkts");
    assert_eq!(be32(&d, 28), out.rcv_bytes / 4, "s1 PortRcvData");
    assert_eq!(be32(&d, 32), back.xmit_pkts, "s1 PortXmitPkts");
    // s0's PMA, its end of the same link: the other way round.
    let (st, d) = q.counters(&fabric, SM_LID, pa, None);
    assert_eq!(st, 0);
    assert_eq!(be32(&d, 32), out.xmit_pkts, "s0 PortXmitPkts");
    // s1's port 1 links node 2: what that node's port took, the switch port sent.
    let (_, d) = q.counters(&fabric, SM_LID - 1, 1, None);
    assert!(be32(&d, 32) >= 8, "s1 port 1 PortXmitPkts");
    // A reset (CounterSelect: XmitPkts, RcvPkts) starts them again from 0.
    let (st, _) = q.counters(&fabric, SM_LID - 1, pb, Some(0xc000));
    assert_eq!(st, 0);
    let (_, d) = q.counters(&fabric, SM_LID - 1, pb, None);
    assert_eq!((be32(&d, 32), be32(&d, 36)), (0, 0));
    // A port past the switch's: invalid field.
    let (st, _) = q.counters(&fabric, SM_LID - 1, 9, None);
    assert_eq!(st & 0x1c, 0x1c, "status {st:#x}");
}

#[test]
fn test_a_plan_rule_for_a_switch_link_drops_there_and_nowhere_else() {
    let fabric = Fabric::with_manual_clock();
    fabric.set_topology(ring_with_three_nodes());
    let plan = "seed = 7\n[[link]]\nswitch_link = 1\ndir = \"up\"\ndrop = 0.3\n";
    let hook = Arc::new(FaultHook::new(FaultPlan::parse(plan).unwrap(), None));
    fabric.set_hook(Some(hook.clone()));
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (10, 7, 7));
    let src = p.a.alloc(65536, 64);
    let dst = p.b.alloc(65536, 64);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    p.a.write(src, &data);
    for i in 0..8u64 {
        write(&mut p, i, src + i * 8192, dst + i * 8192, 8192);
    }
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 8, Duration::from_secs(5));
    assert_eq!(c.len(), 8);
    assert!(c.iter().all(|c| c.status == 0), "{c:?}");
    assert_eq!(p.b.read(dst, 65536), data);
    let out = fabric
        .switch_link_stats(SwitchLink {
            link: 0,
            forward: true,
        })
        .unwrap();
    let back = fabric
        .switch_link_stats(SwitchLink {
            link: 0,
            forward: false,
        })
        .unwrap();
    let dropped = hook.counts().dropped;
    assert!(dropped > 0, "{:?}", hook.counts());
    // Only s0 to s1 ("up": the [[link]]'s first switch to its second) lost any.
    assert_eq!(out.discards, dropped, "{out:?}");
    assert_eq!(out.rcv_pkts + out.discards, out.xmit_pkts);
    assert_eq!(back.discards, 0);
    assert!(p.a.hca.stats().retransmits > 0);
    assert!(fabric.stats().hook_dropped >= dropped);
}

#[test]
fn test_a_plan_down_window_cuts_a_switch_link_and_the_sm_routes_round_it() {
    let fabric = Fabric::with_manual_clock();
    fabric.set_topology(ring_with_three_nodes());
    let plan = "[[link]]\nswitch_link = 1\ndown = [[20, 60]]\n";
    let hook = Arc::new(FaultHook::new(FaultPlan::parse(plan).unwrap(), None));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook.clone()));
    let mut p = Pair::build(fabric.clone(), MTU_1024, ALL_ACCESS, (12, 7, 7));
    assert_eq!(fabric.subnet().hops(1, 2), Some(2), "s0, s1");
    while fabric.now_ns() < 25_000_000 {
        fabric.advance(MS);
    }
    assert_eq!(fabric.subnet().link_up(0), Some(false), "cut in the window");
    assert_eq!(fabric.subnet().hops(1, 2), Some(3), "s0, s2, s1");
    let stats = |forward| {
        fabric
            .switch_link_stats(SwitchLink { link: 0, forward })
            .unwrap()
    };
    assert_eq!((stats(true).downed, stats(false).downed), (1, 1));
    // Traffic goes round the cut meanwhile.
    let src = p.a.alloc(4096, 64);
    let dst = p.b.alloc(4096, 64);
    p.a.write(src, &[9u8; 4096]);
    write(&mut p, 1, src, dst, 4096);
    let c = collect(&fabric, &mut p.a, &mut p.cq_a, 1, 10 * MS);
    assert_eq!((c.len(), c[0].status), (1, 0));
    assert_eq!(stats(true).xmit_pkts, 0, "not over the cut link");
    while fabric.now_ns() < 65_000_000 {
        fabric.advance(MS);
    }
    assert_eq!(
        fabric.subnet().link_up(0),
        Some(true),
        "back after the window"
    );
    assert_eq!(fabric.subnet().hops(1, 2), Some(2));
}

#[test]
fn test_a_plan_naming_a_node_link_and_a_switch_link_at_once_is_refused() {
    let e = FaultPlan::parse("[[link]]\nlid = 2\nswitch_link = 1\n").unwrap_err();
    assert!(e.to_string().contains("lid and switch_link"), "{e}");
    let e = FaultPlan::parse("[[link]]\nswitch_link = 0\n").unwrap_err();
    assert!(e.to_string().contains("counts from 1"), "{e}");
}
