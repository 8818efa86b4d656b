//! A subnet a user's SM manages (`Fabric::set_guest_sm`, `sm = "guest"`): the test plays
//! OpenSM from node 1's QP0 (directed-route SMPs to the switch) and the HCAs' agents
//! (SMP_SET, as hca_ib's sma.c hands the Sets to the device). The ports wait in INIT and
//! pass no data until the SM arms and activates them; the switch forwards unicast by the
//! LFT the SM set and multicast by its MFT, no further; the switch's and the ports' M_Keys
//! keep out an SM without them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::fabric::UserSmError;
use hca_model::fabric::{LinkDir, LinkHook, LinkId, Verdict};
use hca_model::packet::Packet;
use hca_model::sa::SM_LID;
use hca_model::subnet::SwitchLink;
use hca_model::subnet::{SwitchSpec, Topology};
use hca_model::Fabric;
use hca_test_driver::*;

const MS: Duration = Duration::from_millis(1);
const MTU_1024: u8 = 3;
const PORT_INFO: u16 = 0x0015;
const SWITCH_INFO: u16 = 0x0012;
const LFT: u16 = 0x0019;
const MFT: u16 = 0x001b;
const SM_INFO: u16 = 0x0020;
const SET: u8 = 0x02;
const GET: u8 = 0x01;
/// The SMP status of a field the switch cannot take.
const INVALID_FIELD: u16 = 7 << 2;
const MLID: u16 = 0xc001;
/// The first WR ID of the receives the SM posts for traps.
const UNASKED: u64 = 0x7000;
const MGID: [u8; 16] = [0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// Advances virtual time until `cq` gave `n` CQEs or `limit` passed.
fn collect(f: &Fabric, d: &mut Driver, cq: &mut CqH, n: usize, limit: Duration) -> Vec<HcaCqe> {
    let start = f.now_ns();
    let mut got = d.drain_cq(cq);
    while got.len() < n && f.now_ns() - start < limit.as_nanos() as u64 {
        f.advance(MS);
        got.extend(d.drain_cq(cq));
    }
    got
}

/// The user's SM: QP0 on a node's HCA, sending directed-route SMPs one hop, to the switch.
struct Sm {
    qp0: QpH,
    cq: CqH,
    rbuf: u64,
    sbuf: u64,
    tid: u64,
    /// The buffers of the receives posted for traps, by WR ID from [`UNASKED`].
    unasked: Vec<u64>,
}

impl Sm {
    fn on(d: &mut Driver) -> Sm {
        let pd = d.alloc_pd();
        let cq = d.create_cq(6);
        let qp0 = d.create_qp(QPT_SMI, pd, cq.cqn, cq.cqn);
        d.bring_up_ud(qp0.qpn, 0, true);
        let rbuf = d.alloc(296, 64);
        let sbuf = d.alloc(256, 64);
        Sm {
            qp0,
            cq,
            rbuf,
            sbuf,
            tid: 0,
            unasked: Vec::new(),
        }
    }

    /// A Get or Set of `attr` at the switch; its answer (None: no answer).
    fn ask(
        &mut self,
        f: &Fabric,
        d: &mut Driver,
        what: (u8, u16, u32),
        data: &[u8],
        mkey: u64,
    ) -> Option<Vec<u8>> {
        self.ask_by(f, d, &[1], what, data, mkey)
    }

    /// Like [`Sm::ask`], at the end of directed route `path` (the ports out of each hop,
    /// the HCA's first).
    fn ask_by(
        &mut self,
        f: &Fabric,
        d: &mut Driver,
        path: &[u8],
        (method, attr, attr_mod): (u8, u16, u32),
        data: &[u8],
        mkey: u64,
    ) -> Option<Vec<u8>> {
        self.tid += 1;
        let mut smp = [0u8; 256];
        // Directed route, hop pointer 1 (the sender moved it) of the path's hops.
        let hops = path.len() as u8;
        (smp[0], smp[1], smp[2], smp[3], smp[6], smp[7]) = (1, 0x81, 1, method, 1, hops);
        smp[8..16].copy_from_slice(&self.tid.to_be_bytes());
        smp[16..18].copy_from_slice(&attr.to_be_bytes());
        smp[20..24].copy_from_slice(&attr_mod.to_be_bytes());
        smp[24..32].copy_from_slice(&mkey.to_be_bytes());
        smp[32..36].copy_from_slice(&[0xff; 4]);
        smp[64..64 + data.len()].copy_from_slice(data);
        smp[129..129 + path.len()].copy_from_slice(path);
        d.write(self.sbuf, &smp);
        d.post_recv(
            &mut self.qp0,
            self.tid,
            &[sge(self.rbuf, 296, LOCAL_DMA_LKEY)],
        );
        let mut wr = send_wr(1000 + self.tid, WR_SEND, WQE_SIGNALED);
        (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (0xffff, SMI_QPN, 0);
        d.post_send(&mut self.qp0, wr, &[sge(self.sbuf, 256, LOCAL_DMA_LKEY)]);
        let got = collect(f, d, &mut self.cq, 2, 10 * MS);
        let Some(recv) = got.iter().find(|c| u32::from(c.opcode) == CQE_OP_RECV) else {
            // (The receive stays posted, for the next answer: into the same buffer.)
            return None;
        };
        // Into the first receive posted: this one, an earlier one left (same buffer), or
        // one left for traps.
        let unasked = recv.wr_id.checked_sub(UNASKED);
        let buf = unasked.map_or(self.rbuf, |k| self.unasked[k as usize]);
        let ans = d.read(buf + 40, 256);
        assert_eq!(
            ans[8..16],
            self.tid.to_be_bytes(),
            "the answer keeps the TID"
        );
        Some(ans)
    }

    /// Posts `n` more receives for SMPs that come unasked (traps).
    fn listen(&mut self, d: &mut Driver, n: usize) {
        for _ in 0..n {
            let buf = d.alloc(296, 64);
            let wr_id = UNASKED + self.unasked.len() as u64;
            d.post_recv(&mut self.qp0, wr_id, &[sge(buf, 296, LOCAL_DMA_LKEY)]);
            self.unasked.push(buf);
        }
    }

    /// The SMPs that came unasked into the receives [`Sm::listen`] posted, within 10 ms.
    fn heard(&mut self, f: &Fabric, d: &mut Driver) -> Vec<Vec<u8>> {
        let got = collect(f, d, &mut self.cq, usize::MAX, 10 * MS);
        (got.iter())
            .filter(|c| u32::from(c.opcode) == CQE_OP_RECV && c.status == 0)
            // (Or a receive an answer did not take, into the answers' buffer.)
            .map(|c| match c.wr_id.checked_sub(UNASKED) {
                Some(k) => self.unasked[k as usize],
                None => self.rbuf,
            })
            .map(|b| d.read(b + 40, 256))
            .collect()
    }

    /// A Set at the switch: the answer's status (without the D bit) and data.
    fn set(
        &mut self,
        f: &Fabric,
        d: &mut Driver,
        attr: u16,
        m: u32,
        data: &[u8],
    ) -> (u16, Vec<u8>) {
        self.set_by(f, d, &[1], attr, m, data)
    }

    /// A Set at the switch at the end of directed route `path`.
    fn set_by(
        &mut self,
        f: &Fabric,
        d: &mut Driver,
        path: &[u8],
        attr: u16,
        m: u32,
        data: &[u8],
    ) -> (u16, Vec<u8>) {
        let a = (self.ask_by(f, d, path, (SET, attr, m), data, 0)).expect("an answer");
        (
            u16::from_be_bytes([a[4], a[5]]) & 0x7fff,
            a[64..128].to_vec(),
        )
    }
}

/// PortInfo with PortState `state` and MasterSMLID 1 (the rest: no change).
fn port_info(state: u8, lid: u16) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[16..18].copy_from_slice(&lid.to_be_bytes());
    d[18..20].copy_from_slice(&1u16.to_be_bytes());
    d[32] = state;
    d[36] = 5 << 4;
    d[43] = 1 << 4;
    d
}

/// The HCA's agent hands a PortInfo Set to its device, as sma.c does.
fn hca_set(d: &mut Driver, data: [u8; 64], mkey: u64) -> u32 {
    let smp = HcaCmdSmpSet {
        attr_id: PORT_INFO,
        attr_mod: 1,
        mkey,
        data,
        ..Default::default()
    };
    d.cmd(CMD_SMP_SET, &smp).0
}

fn port_attr(d: &mut Driver) -> HcaPortAttr {
    decode(&d.cmd_raw(CMD_QUERY_PORT, &[], 0).1)
}

/// Posts an 8 KiB RDMA Write (WR 1) from `p.a` to `p.b`; the source and target buffers.
fn write_8k(p: &mut Pair) -> (u64, u64) {
    let src = p.a.alloc(8192, 64);
    let dst = p.b.alloc(8192, 64);
    p.a.write(
        src,
        &(0..8192u32).map(|i| (i * 7) as u8).collect::<Vec<_>>(),
    );
    let mut w = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, p.key_b);
    p.a.post_send(&mut p.qa, w, &[sge(src, 8192, p.key_a)]);
    (src, dst)
}

/// How many receives each node's member QP completed.
fn received(nodes: [&mut Driver; 3], members: &mut [(CqH, QpH, u64)]) -> Vec<usize> {
    (nodes.into_iter().zip(members))
        .map(|(d, (cq, _, _))| {
            (d.drain_cq(cq).iter())
                .filter(|e| u32::from(e.opcode) == CQE_OP_RECV)
                .count()
        })
        .collect()
}

/// A UD QP attached to the test's group, with a receive posted.
fn member(d: &mut Driver) -> (CqH, QpH, u64) {
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    let mut qp = d.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    d.bring_up_ud(qp.qpn, 0xb, false);
    let mut m = HcaCmdMcast::default();
    (m.qpn, m.mgid, m.mlid) = (qp.qpn, MGID, MLID);
    assert_eq!(d.cmd(CMD_ATTACH_MCAST, &m).0, CMD_OK);
    let rbuf = d.alloc(40 + 64, 64);
    d.post_recv(&mut qp, 7, &[sge(rbuf, 40 + 64, LOCAL_DMA_LKEY)]);
    (cq, qp, rbuf)
}

#[test]
fn test_a_user_sm_must_be_chosen_first_and_on_one_host() {
    let f = Fabric::with_manual_clock();
    let mut d = Driver::new(Some(&f), 4);
    assert_eq!(f.set_guest_sm(), Err(UserSmError::PortsAttached));
    // The fabric's own SM manages the port: no Set changes it, whoever makes it.
    let a = port_attr(&mut d);
    assert_eq!((a.state, a.sm_lid, a.flags), (PORT_ACTIVE as u8, SM_LID, 0));
    assert_eq!(hca_set(&mut d, port_info(1, 1), 0), CMD_BAD_STATE);
    assert_eq!(port_attr(&mut d), a);
    let f = Fabric::with_manual_clock();
    let two = vec![
        SwitchSpec {
            name: "a".into(),
            hcas: vec![1],
        },
        SwitchSpec {
            name: "b".into(),
            hcas: vec![2],
        },
    ];
    let t = Topology::new(two, vec![(0, 1)]).unwrap();
    f.set_topology_on(t.clone().on_hosts(vec![0, 1]).unwrap(), 0);
    assert_eq!(f.set_guest_sm(), Err(UserSmError::Hosts));
    assert!(!f.guest_sm());
    // Several switches of one host take it.
    let f = Fabric::with_manual_clock();
    f.set_topology(t);
    assert_eq!(f.set_guest_sm(), Ok(()));
}

/// Switch a: node 1 on port 1, the link on port 2; switch b: nodes 2 and 3 on ports 1 and
/// 2, the link on port 3.
fn two_switches() -> Fabric {
    let f = Fabric::with_manual_clock();
    let sw = |name: &str, hcas: Vec<u16>| SwitchSpec {
        name: name.into(),
        hcas,
    };
    let t = Topology::new(vec![sw("a", vec![1]), sw("b", vec![2, 3])], vec![(0, 1)]).unwrap();
    f.set_topology(t);
    f.set_guest_sm().unwrap();
    f
}

/// A user's SM manages two switches as OpenSM does: directed routes to the far switch,
/// each switch's ports and LFT, the link's ports at both ends. Unicast then crosses the
/// link by each switch's own table and counts on it; nothing crosses while the far end
/// of the link is not ACTIVE, nor after the link is cut until the SM activates its ports
/// again. Multicast goes by each switch's MFT, never back over the link it came by, and
/// a loop an SM's MFTs make floods each switch once.
#[test]
fn test_a_user_sm_manages_several_switches_by_their_own_tables() {
    let f = two_switches();
    let mut p = Pair::build(f.clone(), MTU_1024, ALL_ACCESS, (10, 7, 7));
    let mut c = Driver::new(Some(&f), 4);
    assert_eq!((p.a.lid(), p.b.lid(), c.lid()), (1, 2, 3));
    let mut sm = Sm::on(&mut p.a);
    let (to_a, to_b): (&[u8], &[u8]) = (&[1], &[1, 2]);
    // Each switch answers at its own end of the route.
    for (path, lid) in [(to_a, SM_LID), (to_b, SM_LID - 1)] {
        let pi0 = sm
            .ask_by(&f, &mut p.a, path, (GET, PORT_INFO, 0), &[], 0)
            .unwrap();
        assert_eq!(u16::from_be_bytes([pi0[64 + 16], pi0[64 + 17]]), lid);
    }
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&3u16.to_be_bytes());
    // LIDs 1..=3: a sends 1 to port 1 and the rest over the link (2); b sends 1 over the
    // link (3), 2 and 3 to ports 1 and 2.
    let (mut lft_a, mut lft_b) = ([0xffu8; 64], [0xffu8; 64]);
    (lft_a[1], lft_a[2], lft_a[3]) = (1, 2, 2);
    (lft_b[1], lft_b[2], lft_b[3]) = (3, 1, 2);
    for (path, lft, ports) in [(to_a, lft_a, 1..=2u32), (to_b, lft_b, 1..=2)] {
        assert_eq!(sm.set_by(&f, &mut p.a, path, SWITCH_INFO, 0, &si).0, 0);
        assert_eq!(sm.set_by(&f, &mut p.a, path, LFT, 0, &lft).0, 0);
        for port in ports {
            for state in [PORT_ARMED, PORT_ACTIVE] {
                let pi = port_info(state as u8, 0);
                assert_eq!(sm.set_by(&f, &mut p.a, path, PORT_INFO, port, &pi).0, 0);
            }
        }
    }
    for (d, lid) in [(&mut p.a, 1u16), (&mut p.b, 2), (&mut c, 3)] {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            assert_eq!(hca_set(d, port_info(state as u8, lid), 0), CMD_OK);
        }
    }
    let lft = sm
        .ask_by(&f, &mut p.a, to_b, (GET, LFT, 0), &[], 0)
        .unwrap();
    assert_eq!(lft[64..68], [0xff, 3, 1, 2], "b's table as the SM set it");

    // Switch a's end of the link is ACTIVE, b's still INIT: lost at the link.
    let lost = f.stats().unrouted;
    let (src, dst) = write_8k(&mut p);
    f.advance(MS);
    assert!(
        f.stats().unrouted > lost,
        "not into a link whose far port is INIT"
    );
    let ab = hca_model::subnet::SwitchLink {
        link: 0,
        forward: true,
    };
    let ba = hca_model::subnet::SwitchLink {
        link: 0,
        forward: false,
    };
    assert_eq!(f.switch_link_stats(ab).unwrap().xmit_pkts, 0);
    for state in [PORT_ARMED, PORT_ACTIVE] {
        let pi = port_info(state as u8, 0);
        assert_eq!(sm.set_by(&f, &mut p.a, to_b, PORT_INFO, 3, &pi).0, 0);
    }
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!(done.iter().map(|c| c.status).collect::<Vec<_>>(), [0]);
    assert_eq!(p.b.read(dst, 8192), p.a.read(src, 8192));
    let there = f.switch_link_stats(ab).unwrap();
    assert!(
        there.xmit_pkts >= 8 && there.rcv_pkts == there.xmit_pkts,
        "{there:?}"
    );
    assert!(
        f.switch_link_stats(ba).unwrap().rcv_pkts >= 1,
        "the ACKs came back"
    );

    // Multicast: a's MFT sends MLID 0xc001 over the link, b's to both its nodes and back
    // into the link (which it must not take back).
    let mut members: Vec<(CqH, QpH, u64)> = [&mut p.a, &mut p.b, &mut c]
        .into_iter()
        .map(member)
        .collect();
    let (mut mft_a, mut mft_b) = ([0u8; 64], [0u8; 64]);
    mft_a[2..4].copy_from_slice(&0b100u16.to_be_bytes());
    mft_b[2..4].copy_from_slice(&0b1110u16.to_be_bytes());
    assert_eq!(sm.set_by(&f, &mut p.a, to_a, MFT, 0, &mft_a).0, 0);
    assert_eq!(sm.set_by(&f, &mut p.a, to_b, MFT, 0, &mft_b).0, 0);
    let back = f.switch_link_stats(ba).unwrap().mcast_xmit_pkts;
    let sbuf = p.a.alloc(64, 64);
    p.a.write(sbuf, b"by the switches' MFTs");
    let mut wr = ud_send_wr(MLID, 0x00ff_ffff, 0xb);
    wr.wr_id = 9;
    p.a.post_send(&mut members[0].1, wr, &[sge(sbuf, 21, LOCAL_DMA_LKEY)]);
    f.advance(5 * MS);
    let got = received([&mut p.a, &mut p.b, &mut c], &mut members);
    assert_eq!(
        got,
        [0, 1, 1],
        "once to each port b's MFT names, none to a's own"
    );
    assert_eq!(c.read(members[2].2 + 40, 21), b"by the switches' MFTs");
    assert_eq!(f.switch_link_stats(ab).unwrap().mcast_xmit_pkts, 1);
    assert_eq!(
        f.switch_link_stats(ba).unwrap().mcast_xmit_pkts,
        back,
        "not back over the link it came by"
    );

    // The link is cut and restored: both its ports start again from INIT, and unicast
    // waits for the SM to activate them. Each switch told of its SM (port 0's PortInfo)
    // sends it trap 128 when a port's link changes, unless the cut keeps it from the SM.
    for path in [to_a, to_b] {
        let pi = port_info(0, 0);
        assert_eq!(sm.set_by(&f, &mut p.a, path, PORT_INFO, 0, &pi).0, 0);
    }
    // (The receives go first: a UD packet that finds none is dropped.)
    let traps_from = |smps: Vec<Vec<u8>>| {
        let mut from: Vec<u16> = (smps.iter())
            .map(|t| {
                // A LID-routed Trap(Notice): generic, urgent, from a switch, number 128,
                // its IssuerLID and LIDADDR the switch's.
                assert_eq!((t[1], t[3], &t[16..18]), (0x01, 0x05, &[0u8, 2][..]));
                assert_eq!(&t[64..70], &[0x81, 0, 0, 2, 0, 128]);
                assert_eq!(t[70..72], t[74..76]);
                u16::from_be_bytes([t[70], t[71]])
            })
            .collect();
        from.sort();
        from
    };
    // (As many as traps come: a receive left over would take an answer the SM waits for.)
    sm.listen(&mut p.a, 1);
    f.set_switch_link(0, false).unwrap();
    let heard = sm.heard(&f, &mut p.a);
    let only_a = "only a, which the cut leaves by the SM";
    assert_eq!(traps_from(heard), [SM_LID], "{only_a}");
    // Restored: both (b's trap too: it is joined to the SM's port again).
    sm.listen(&mut p.a, 2);
    f.set_switch_link(0, true).unwrap();
    let heard = sm.heard(&f, &mut p.a);
    assert_eq!(traps_from(heard), [SM_LID - 1, SM_LID], "both");
    for path in [to_a, to_b] {
        let port = if path.len() == 1 { 2 } else { 3 };
        let pi = (sm.ask_by(&f, &mut p.a, path, (GET, PORT_INFO, port), &[], 0)).unwrap();
        assert_eq!(pi[64 + 32] & 0xf, PORT_INIT as u8, "{path:?} port {port}");
    }
    let lost = f.stats().unrouted;
    let mut w = send_wr(2, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, p.key_b);
    p.a.post_send(&mut p.qa, w, &[sge(src, 64, p.key_a)]);
    f.advance(MS);
    assert!(
        f.stats().unrouted > lost,
        "nothing over a link not yet ACTIVE again"
    );
    for (path, port) in [(to_a, 2u32), (to_b, 3)] {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            let pi = port_info(state as u8, 0);
            assert_eq!(sm.set_by(&f, &mut p.a, path, PORT_INFO, port, &pi).0, 0);
        }
    }
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!(done.iter().map(|c| c.status).collect::<Vec<_>>(), [0]);
}

/// MFTs that loop (three switches in a ring, each sending the group out of every port):
/// each switch floods a group's packet once, and each member gets one copy.
#[test]
fn test_a_multicast_loop_in_a_user_sms_tables_floods_each_switch_once() {
    let f = Fabric::with_manual_clock();
    let sw = |name: &str, lid: u16| SwitchSpec {
        name: name.into(),
        hcas: vec![lid],
    };
    let ring = vec![sw("a", 1), sw("b", 2), sw("c", 3)];
    f.set_topology(Topology::new(ring, vec![(0, 1), (1, 2), (2, 0)]).unwrap());
    f.set_guest_sm().unwrap();
    let mut a = Driver::new(Some(&f), 4);
    let mut b = Driver::new(Some(&f), 4);
    let mut c = Driver::new(Some(&f), 4);
    let mut sm = Sm::on(&mut a);
    // Each switch: its node on port 1, its two links on ports 2 and 3.
    let mut mft = [0u8; 64];
    mft[2..4].copy_from_slice(&0b1110u16.to_be_bytes());
    for path in [&[1u8][..], &[1, 2], &[1, 3]] {
        assert_eq!(sm.set_by(&f, &mut a, path, MFT, 0, &mft).0, 0);
        for port in 1..=3 {
            for state in [PORT_ARMED, PORT_ACTIVE] {
                let pi = port_info(state as u8, 0);
                assert_eq!(sm.set_by(&f, &mut a, path, PORT_INFO, port, &pi).0, 0);
            }
        }
    }
    for (d, lid) in [(&mut a, 1u16), (&mut b, 2), (&mut c, 3)] {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            assert_eq!(hca_set(d, port_info(state as u8, lid), 0), CMD_OK);
        }
    }
    let mut members: Vec<(CqH, QpH, u64)> =
        [&mut a, &mut b, &mut c].into_iter().map(member).collect();
    let sbuf = b.alloc(64, 64);
    b.write(sbuf, b"once");
    let wr = ud_send_wr(MLID, 0x00ff_ffff, 0xb);
    b.post_send(&mut members[1].1, wr, &[sge(sbuf, 4, LOCAL_DMA_LKEY)]);
    f.advance(5 * MS);
    let got = received([&mut a, &mut b, &mut c], &mut members);
    assert_eq!(got, [1, 1, 1], "one copy each, the sender's own included");
}

#[test]
fn test_ports_pass_data_only_once_the_user_sm_activates_them_and_by_its_tables() {
    let f = Fabric::with_manual_clock();
    f.set_guest_sm().unwrap();
    let mut p = Pair::build(f.clone(), MTU_1024, ALL_ACCESS, (10, 7, 7));
    let mut c = Driver::new(Some(&f), 4);
    assert_eq!((p.a.lid(), p.b.lid(), c.lid()), (1, 2, 3));
    for d in [&mut p.a, &mut p.b, &mut c] {
        let a = port_attr(d);
        assert_eq!(
            (a.state, a.sm_lid, a.flags),
            (PORT_INIT as u8, 0, PORT_FLAG_GUEST_SM),
            "waits for an SM"
        );
        assert!(d
            .drain_eq(0)
            .iter()
            .all(|e| e.event_type != EV_PORT_ACTIVE as u8));
    }
    // Before the SM: an RC write is lost at the switch (its timer resends it).
    let lost = f.stats().unrouted;
    let (src, dst) = write_8k(&mut p);
    f.advance(MS);
    assert!(f.stats().unrouted > lost, "no data through an INIT port");

    // The SM, from node 1: the switch runs no SM of its own.
    let mut sm = Sm::on(&mut p.a);
    let info = sm.ask(&f, &mut p.a, (GET, SM_INFO, 0), &[], 0).unwrap();
    assert_eq!(
        u16::from_be_bytes([info[4], info[5]]) & 0x7fff,
        0x0c,
        "no SMInfo"
    );
    let pi0 = sm.ask(&f, &mut p.a, (GET, PORT_INFO, 0), &[], 0).unwrap();
    assert_eq!(pi0[64 + 23] & 2, 0, "port 0 is not IsSM");
    let before = sm.ask(&f, &mut p.a, (GET, SWITCH_INFO, 0), &[], 0).unwrap();
    assert_eq!(before[64 + 11] & 4, 4, "PortStateChange: ports came up");
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&SM_LID.to_be_bytes());
    // LifeTimeValue 0x12; PortStateChange written back clears it.
    si[11] = 0x12 << 3 | 4;
    let (st, got) = sm.set(&f, &mut p.a, SWITCH_INFO, 0, &si);
    assert_eq!(
        (st, &got[6..8], got[11]),
        (0, &SM_LID.to_be_bytes()[..], 0x90)
    );
    // LFT block 0, with LID 2 sent out of port 3 by mistake.
    let mut block = [0xffu8; 64];
    (block[1], block[2], block[3]) = (1, 3, 3);
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let mut past = block;
    past[4] = 9;
    assert_eq!(
        sm.set(&f, &mut p.a, LFT, 0, &past).0,
        INVALID_FIELD,
        "no port 9"
    );
    assert_eq!(
        sm.set(&f, &mut p.a, LFT, 768, &block).0,
        INVALID_FIELD,
        "past 0xbfff"
    );
    for port in 1..=3u32 {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            let (st, got) = sm.set(&f, &mut p.a, PORT_INFO, port, &port_info(state as u8, 0));
            assert_eq!((st, got[32] & 0xf), (0, state as u8), "switch port {port}");
        }
    }
    assert_eq!(
        sm.set(&f, &mut p.a, PORT_INFO, 1, &port_info(PORT_ARMED as u8, 0))
            .0,
        INVALID_FIELD,
        "ACTIVE goes back only through DOWN"
    );
    // The HCAs' agents: LID kept, SM at LID 1; ACTIVE only after ARMED.
    for (d, lid) in [(&mut p.a, 1u16), (&mut p.b, 2), (&mut c, 3)] {
        d.drain_eq(0);
        assert_eq!(
            hca_set(d, port_info(PORT_ACTIVE as u8, lid), 0),
            CMD_BAD_PARAM
        );
        assert_eq!(
            hca_set(d, port_info(0, lid + 1), 0),
            CMD_BAD_PARAM,
            "a LID it is not at"
        );
        assert_eq!(hca_set(d, port_info(PORT_ARMED as u8, lid), 0), CMD_OK);
        assert_eq!(hca_set(d, port_info(PORT_ACTIVE as u8, lid), 0), CMD_OK);
        let a = port_attr(d);
        assert_eq!((a.state, a.lid, a.sm_lid), (PORT_ACTIVE as u8, lid, 1));
        let ev: Vec<(u8, u32)> = (d.drain_eq(0).iter())
            .map(|e| (e.event_type, e.data))
            .collect();
        assert!(
            ev.contains(&(EV_PORT_CHANGE as u8, PORT_CHANGE_SM)),
            "{ev:?}"
        );
        assert!(ev.iter().any(|e| e.0 == EV_PORT_ACTIVE as u8), "{ev:?}");
    }
    // Every port ACTIVE, but LID 2's entry names port 3: the write is still lost.
    let lost = f.stats().unrouted;
    f.advance(50 * MS);
    assert!(
        f.stats().unrouted > lost,
        "forwarded by the SM's table, to the wrong port"
    );
    block[2] = 2;
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!(done.iter().map(|c| c.status).collect::<Vec<_>>(), [0]);
    assert_eq!(p.b.read(dst, 8192), p.a.read(src, 8192));
    // An entry of 0 (the switch itself) for an HCA's LID delivers nothing there.
    let send = |p: &mut Pair, id: u64| {
        let mut w = send_wr(id, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst, p.key_b);
        p.a.post_send(&mut p.qa, w, &[sge(src, 64, p.key_a)]);
    };
    block[2] = 0;
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let lost = f.stats().unrouted;
    send(&mut p, 2);
    f.advance(MS);
    assert!(
        f.stats().unrouted > lost,
        "not to LID 2 by the switch's port 0"
    );
    block[2] = 2;
    assert_eq!(sm.set(&f, &mut p.a, LFT, 0, &block).0, 0);
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!((done.len(), done[0].status), (1, 0));
    // The SM sets switch port 2 Down: the link retrains, node 2's port is INIT again (its
    // driver hears PORT_DOWN) and nothing passes until the SM activates both ends.
    p.b.drain_eq(0);
    assert_eq!(sm.set(&f, &mut p.a, PORT_INFO, 2, &port_info(1, 0)).0, 0);
    assert_eq!(port_attr(&mut p.b).state, PORT_INIT as u8);
    assert!(p
        .b
        .drain_eq(0)
        .iter()
        .any(|e| e.event_type == EV_PORT_DOWN as u8));
    let lost = f.stats().unrouted;
    send(&mut p, 3);
    f.advance(MS);
    assert!(f.stats().unrouted > lost, "no data through a port set Down");
    for state in [PORT_ARMED, PORT_ACTIVE] {
        assert_eq!(
            sm.set(&f, &mut p.a, PORT_INFO, 2, &port_info(state as u8, 0))
                .0,
            0
        );
        assert_eq!(hca_set(&mut p.b, port_info(state as u8, 2), 0), CMD_OK);
    }
    let done = collect(&f, &mut p.a, &mut p.cq_a, 1, 200 * MS);
    assert_eq!(
        (done.len(), done[0].status),
        (1, 0),
        "once both ends are ACTIVE"
    );
    // Node 2's agent takes a Down: its switch port goes back to INIT too.
    assert_eq!(hca_set(&mut p.b, port_info(1, 2), 0), CMD_OK);
    let pi = sm.ask(&f, &mut p.a, (GET, PORT_INFO, 2), &[], 0).unwrap();
    assert_eq!(pi[64 + 32] & 0xf, PORT_INIT as u8, "switch port 2");

    // Multicast by the MFT: MLID 0xc001 to ports 1 and 3, not 2 (whose QP is attached).
    let mut members: Vec<(CqH, QpH, u64)> = [&mut p.a, &mut p.b, &mut c]
        .into_iter()
        .map(member)
        .collect();
    let mut mft = [0u8; 64];
    mft[2..4].copy_from_slice(&0b1010u16.to_be_bytes());
    assert_eq!(sm.set(&f, &mut p.a, MFT, 0, &mft).0, 0);
    let sbuf = c.alloc(64, 64);
    c.write(sbuf, b"by the multicast table");
    let mut wr = ud_send_wr(MLID, 0x00ff_ffff, 0xb);
    wr.wr_id = 9;
    let (_, qp_c, _) = &mut members[2];
    c.post_send(qp_c, wr, &[sge(sbuf, 22, LOCAL_DMA_LKEY)]);
    f.advance(5 * MS);
    let got: Vec<bool> = [&mut p.a, &mut p.b, &mut c]
        .into_iter()
        .zip(&mut members)
        .map(|(d, (cq, _, _))| (d.drain_cq(cq).iter()).any(|e| u32::from(e.opcode) == CQE_OP_RECV))
        .collect();
    assert_eq!(got, [true, false, true], "to the ports the MFT names");
    assert_eq!(p.a.read(members[0].2 + 40, 22), b"by the multicast table");
}

#[test]
fn test_m_keys_keep_out_an_sm_without_them() {
    let f = Fabric::with_manual_clock();
    f.set_guest_sm().unwrap();
    let mut a = Driver::new(Some(&f), 4);
    let mut sm = Sm::on(&mut a);
    // The switch's port 0 takes an M_Key; then a Set without it gets no answer at all.
    let key = 0x5eed_0000_0000_0001u64;
    let mut p0 = port_info(0, SM_LID);
    p0[..8].copy_from_slice(&key.to_be_bytes());
    assert_eq!(sm.set(&f, &mut a, PORT_INFO, 0, &p0).0, 0);
    let armed = port_info(PORT_ARMED as u8, 0);
    assert!(sm.ask(&f, &mut a, (SET, PORT_INFO, 1), &armed, 0).is_none());
    // Every attribute: the tables stay as they were.
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&100u16.to_be_bytes());
    for (attr, data) in [
        (SWITCH_INFO, &si[..]),
        (LFT, &[1u8; 64][..]),
        (MFT, &[0xffu8; 64][..]),
    ] {
        assert!(
            sm.ask(&f, &mut a, (SET, attr, 0), data, 0).is_none(),
            "{attr:#x}"
        );
    }
    let lft = sm.ask(&f, &mut a, (GET, LFT, 0), &[], 0).unwrap();
    assert_eq!(lft[64..128], [0xff; 64], "no LID forwarded");
    assert_eq!(f.user_sm_tables(0).unwrap().top(), 0);
    let ok = sm
        .ask(&f, &mut a, (SET, PORT_INFO, 1), &armed, key)
        .unwrap();
    assert_eq!(
        (ok[4], ok[5] & 0x7f, ok[64 + 32] & 0xf),
        (0x80, 0, PORT_ARMED as u8)
    );
    let mut moved = p0;
    moved[16..18].copy_from_slice(&5u16.to_be_bytes());
    let refused = sm
        .ask(&f, &mut a, (SET, PORT_INFO, 0), &moved, key)
        .unwrap();
    assert_eq!(
        u16::from_be_bytes([refused[4], refused[5]]) & 0x7fff,
        INVALID_FIELD,
        "the switch keeps its LID"
    );
    // The HCA's port likewise.
    let mut with_key = port_info(0, 1);
    with_key[..8].copy_from_slice(&key.to_be_bytes());
    assert_eq!(hca_set(&mut a, with_key, 0), CMD_OK);
    assert_eq!(port_attr(&mut a).mkey, key);
    assert_eq!(
        hca_set(&mut a, port_info(PORT_ARMED as u8, 1), 7),
        CMD_BAD_KEY
    );
    assert_eq!(port_attr(&mut a).state, PORT_INIT as u8);
    assert_eq!(hca_set(&mut a, port_info(PORT_ARMED as u8, 1), key), CMD_OK);
}

/// A link hook for the hostile-table tests: every packet crossing an inter-switch link is
/// held 1 us (`delay`) or copied (the first `copies` crossings); crossings and multicast
/// deliveries counted.
#[derive(Default)]
struct OnLinks {
    delay: bool,
    copies: u64,
    crossings: AtomicU64,
    mcast_down: AtomicU64,
}

impl LinkHook for OnLinks {
    fn on_packet(&self, link: LinkId, _now: u64, pkt: &mut Packet) -> Verdict {
        if link.dir == LinkDir::Down && pkt.dlid == MLID {
            self.mcast_down.fetch_add(1, Relaxed);
        }
        Verdict::Pass
    }

    fn on_switch_link(&self, _link: SwitchLink, _now: u64, _pkt: &mut Packet) -> Verdict {
        let n = self.crossings.fetch_add(1, Relaxed);
        if self.delay {
            Verdict::Delay(1_000)
        } else if n < self.copies {
            Verdict::Duplicate
        } else {
            Verdict::Pass
        }
    }
}

/// Every port of the switch at the end of `path` (1..=`ports`) made ACTIVE.
fn activate(sm: &mut Sm, f: &Fabric, d: &mut Driver, path: &[u8], ports: u32) {
    for port in 1..=ports {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            let pi = port_info(state as u8, 0);
            assert_eq!(sm.set_by(f, d, path, PORT_INFO, port, &pi).0, 0);
        }
    }
}

/// Two switches whose LFTs loop for LID 2 (a sends it over the link, b back), every port
/// ACTIVE; node 1, a UD QP on it and a send buffer.
fn looped() -> (Fabric, Driver, Driver, QpH, u64) {
    let f = two_switches();
    let mut a = Driver::new(Some(&f), 4);
    let mut b = Driver::new(Some(&f), 4);
    let mut sm = Sm::on(&mut a);
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&3u16.to_be_bytes());
    let (mut lft_a, mut lft_b) = ([0xffu8; 64], [0xffu8; 64]);
    (lft_a[2], lft_b[2]) = (2, 3);
    for (path, lft, ports) in [(&[1u8][..], lft_a, 2), (&[1, 2][..], lft_b, 3)] {
        assert_eq!(sm.set_by(&f, &mut a, path, SWITCH_INFO, 0, &si).0, 0);
        assert_eq!(sm.set_by(&f, &mut a, path, LFT, 0, &lft).0, 0);
        activate(&mut sm, &f, &mut a, path, ports);
    }
    for (d, lid) in [(&mut a, 1u16), (&mut b, 2)] {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            assert_eq!(hca_set(d, port_info(state as u8, lid), 0), CMD_OK);
        }
    }
    let pd = a.alloc_pd();
    let cq = a.create_cq(6);
    let qp = a.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    a.bring_up_ud(qp.qpn, 0xb, false);
    let sbuf = a.alloc(64, 64);
    (f, a, b, qp, sbuf)
}

/// An SM's LFTs that loop cost a bounded walk whatever the link hook does: a packet held
/// on every crossing does not circulate for ever, and copies of copies do not multiply.
#[test]
fn test_a_loop_in_a_user_sms_lfts_is_walked_a_bounded_way_under_any_hook() {
    for hook in [
        OnLinks {
            delay: true,
            ..OnLinks::default()
        },
        OnLinks {
            copies: 5000,
            ..OnLinks::default()
        },
    ] {
        let (f, mut a, _b, mut qp, sbuf) = looped();
        let hook = Arc::new(hook);
        f.set_hook(Some(hook.clone()));
        let wr = ud_send_wr(2, 0x1234, 0xb);
        a.post_send(&mut qp, wr, &[sge(sbuf, 8, LOCAL_DMA_LKEY)]);
        for _ in 0..300 {
            f.advance(MS);
        }
        // Three crossings at most (as many as switches, and one), each copied at most once.
        let x = hook.crossings.load(Relaxed);
        assert!(
            x <= 3 * 3,
            "one packet crossed {x} times (delay: {})",
            hook.delay
        );
    }
}

/// Seven switches, each linked to every other, each MFT naming every port, every
/// crossing held by the hook: each switch floods the packet once (at most one crossing
/// into each), and each node gets one copy.
#[test]
fn test_a_multicast_flood_reaches_each_switch_once_however_the_hook_holds_it() {
    let n = 7usize;
    let f = Fabric::with_manual_clock();
    let sws: Vec<SwitchSpec> = (0..n)
        .map(|i| SwitchSpec {
            name: format!("s{i}"),
            hcas: vec![i as u16 + 1],
        })
        .collect();
    let links = (0..n)
        .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
        .collect();
    f.set_topology(Topology::new(sws, links).unwrap());
    f.set_guest_sm().unwrap();
    let mut ds: Vec<Driver> = (0..n).map(|_| Driver::new(Some(&f), 4)).collect();
    let mut sm = Sm::on(&mut ds[0]);
    let mut mft = [0u8; 64];
    mft[2..4].copy_from_slice(&(((1u32 << (n + 1)) - 2) as u16).to_be_bytes());
    for j in 0..n {
        // Switch j: its node on port 1, the links after it; from s0, j's link is port j+1.
        let path: Vec<u8> = if j == 0 {
            vec![1]
        } else {
            vec![1, j as u8 + 1]
        };
        assert_eq!(sm.set_by(&f, &mut ds[0], &path, MFT, 0, &mft).0, 0);
        activate(&mut sm, &f, &mut ds[0], &path, n as u32);
    }
    for (i, d) in ds.iter_mut().enumerate() {
        for state in [PORT_ARMED, PORT_ACTIVE] {
            assert_eq!(hca_set(d, port_info(state as u8, i as u16 + 1), 0), CMD_OK);
        }
    }
    let hook = Arc::new(OnLinks {
        delay: true,
        ..OnLinks::default()
    });
    f.set_hook(Some(hook.clone()));
    let d = &mut ds[0];
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    let mut qp = d.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    d.bring_up_ud(qp.qpn, 0xb, false);
    let sbuf = d.alloc(64, 64);
    let wr = ud_send_wr(MLID, 0x00ff_ffff, 0xb);
    d.post_send(&mut qp, wr, &[sge(sbuf, 8, LOCAL_DMA_LKEY)]);
    for _ in 0..20 {
        f.advance(MS);
    }
    let (x, down) = (hook.crossings.load(Relaxed), hook.mcast_down.load(Relaxed));
    assert_eq!(
        (x, down),
        (n as u64 - 1, n as u64),
        "crossings, copies to nodes"
    );
}

/// A LID-routed SMP goes by the LFTs the SM set, through ports still INIT, but not across
/// a cut link: node 1's to node 3 behind switch b arrives only while the link is up.
#[test]
fn test_a_lid_routed_smp_follows_the_lfts_and_not_a_cut_link() {
    let f = two_switches();
    let mut a = Driver::new(Some(&f), 4);
    let _b = Driver::new(Some(&f), 4);
    let mut c = Driver::new(Some(&f), 4);
    let mut sm = Sm::on(&mut a);
    let mut rx = Sm::on(&mut c);
    let mut si = [0u8; 20];
    si[6..8].copy_from_slice(&3u16.to_be_bytes());
    let (mut lft_a, mut lft_b) = ([0xffu8; 64], [0xffu8; 64]);
    (lft_a[3], lft_b[3]) = (2, 2);
    for (path, lft) in [(&[1u8][..], lft_a), (&[1, 2][..], lft_b)] {
        assert_eq!(sm.set_by(&f, &mut a, path, SWITCH_INFO, 0, &si).0, 0);
        assert_eq!(sm.set_by(&f, &mut a, path, LFT, 0, &lft).0, 0);
    }
    let mut smp = [0u8; 256];
    (smp[0], smp[1], smp[2], smp[3]) = (1, 0x01, 1, GET);
    smp[16..18].copy_from_slice(&PORT_INFO.to_be_bytes());
    a.write(sm.sbuf, &smp);
    let mut arrives = |f: &Fabric, a: &mut Driver, id: u64| {
        c.post_recv(&mut rx.qp0, id, &[sge(rx.rbuf, 296, LOCAL_DMA_LKEY)]);
        let mut wr = send_wr(id, WR_SEND, WQE_SIGNALED);
        (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (3, SMI_QPN, 0);
        a.post_send(&mut sm.qp0, wr, &[sge(sm.sbuf, 256, LOCAL_DMA_LKEY)]);
        let got = collect(f, &mut c, &mut rx.cq, 1, 5 * MS);
        got.iter().any(|e| u32::from(e.opcode) == CQE_OP_RECV)
    };
    assert!(arrives(&f, &mut a, 1), "by the LFTs, every port INIT");
    f.set_switch_link(0, false).unwrap();
    assert!(!arrives(&f, &mut a, 2), "not across the cut link");
    f.set_switch_link(0, true).unwrap();
    assert!(arrives(&f, &mut a, 3), "the link back");
}
