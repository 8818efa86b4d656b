//! One subnet across two hosts: two fabrics, each with its own switch and guests, joined by
//! an inter-switch link whose frames (`hca_model::wire`) go through a test network that
//! can lose them. RC, the SA, multicast and directed-route SMPs cross it; a host not heard
//! from takes the link and its ports down; what a peer sends is checked.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hca_model::abi::*;
use hca_model::fabric::{RemoteError, RemoteHosts};
use hca_model::sa::{port_gid, IPOIB_BROADCAST_MGID, SM_LID};
use hca_model::subnet::{SwitchLink, SwitchSpec, Topology};
use hca_model::wire::{self, Frame, PortAd};
use hca_model::Fabric;
use hca_test_driver::*;

const MS: Duration = Duration::from_millis(1);
const MTU_1024: u8 = 3;

/// Datagrams between hosts: (to, from, bytes), moved by [`Net::settle`].
type Queue = Arc<Mutex<VecDeque<(u16, u16, Vec<u8>)>>>;

struct Sender {
    from: u16,
    queue: Queue,
    /// The network between the hosts is cut: datagrams are lost.
    cut: Arc<AtomicBool>,
}

impl RemoteHosts for Sender {
    fn send(&self, host: u16, frame: Vec<u8>) {
        if !self.cut.load(Relaxed) {
            self.queue
                .lock()
                .unwrap()
                .push_back((host, self.from, frame));
        }
    }
}

struct Net {
    hosts: Vec<Fabric>,
    queue: Queue,
    cut: Arc<AtomicBool>,
}

impl Net {
    /// Host 0 has switch s0 with LIDs 1 and 2 and the SM; host 1 has s1 with LIDs 3 and 4.
    fn two_hosts() -> Net {
        let t = Topology::new(vec![sw("s0", &[1, 2]), sw("s1", &[3, 4])], vec![(0, 1)])
            .unwrap()
            .on_hosts(vec![0, 1])
            .unwrap();
        Net::on(t, 2)
    }

    /// A chain of three hosts, a switch each: s0 (host 0, the SM's, node 1) - s1 (host 1,
    /// node 2) - s2 (host 2, the nodes at `far`).
    fn chain(far: &[u16]) -> Net {
        let t = Topology::new(
            vec![sw("s0", &[1]), sw("s1", &[2]), sw("s2", far)],
            vec![(0, 1), (1, 2)],
        )
        .unwrap()
        .on_hosts(vec![0, 1, 2])
        .unwrap();
        Net::on(t, 3)
    }

    /// `hosts` hosts cabled as `t` (its switches on them as `Topology::on_hosts` put them).
    fn on(t: Topology, hosts: u16) -> Net {
        let queue = Queue::default();
        let cut = Arc::new(AtomicBool::new(false));
        let hosts: Vec<Fabric> = (0..hosts)
            .map(|h| {
                let f = Fabric::with_manual_clock();
                f.set_topology_on(t.clone(), h);
                f.set_remote(Some(Arc::new(Sender {
                    from: h,
                    queue: queue.clone(),
                    cut: cut.clone(),
                })));
                f
            })
            .collect();
        Net { hosts, queue, cut }
    }

    /// Moves datagrams until none is left.
    fn settle(&self) {
        loop {
            let next = self.queue.lock().unwrap().pop_front();
            let Some((to, from, d)) = next else {
                return;
            };
            self.hosts[usize::from(to)].receive(from, &d).unwrap();
        }
    }

    /// Every host announces itself to the others.
    fn announce(&self) {
        for (h, f) in self.hosts.iter().enumerate() {
            let a = f.announcement();
            for other in 0..self.hosts.len() {
                if other != h && !self.cut.load(Relaxed) {
                    self.queue
                        .lock()
                        .unwrap()
                        .push_back((other as u16, h as u16, a.clone()));
                }
            }
        }
        self.settle();
    }

    /// A millisecond of virtual time on every host.
    fn tick(&self) {
        for f in &self.hosts {
            f.advance(MS);
            self.settle();
        }
    }
}

/// Switch `name` with the HCA ports at `hcas` on its ports 1, 2, ...
fn sw(name: &str, hcas: &[u16]) -> SwitchSpec {
    SwitchSpec {
        name: name.into(),
        hcas: hcas.to_vec(),
    }
}

/// A guest on `fabric` at `lid`.
fn guest(fabric: &Fabric, lid: u16) -> Driver {
    let d = Driver::new(None, 8);
    d.hca.attach_at(fabric, lid).unwrap();
    d
}

fn port_guid(d: &mut Driver) -> u64 {
    let port: HcaPortAttr = decode(&d.cmd_raw(CMD_QUERY_PORT, &[], 0).1);
    port.port_guid
}

/// Polls `cq` while time passes on every host, until it gave `n` CQEs or `limit` passed.
fn collect(net: &Net, d: &mut Driver, cq: &mut CqH, n: usize, limit: Duration) -> Vec<HcaCqe> {
    let mut got = d.drain_cq(cq);
    let mut waited = Duration::ZERO;
    while got.len() < n && waited < limit {
        net.tick();
        waited += MS;
        got.extend(d.drain_cq(cq));
    }
    got
}

/// A GSI QP on `d`, with a CQ and receives for `n` MADs at `rbuf`.
struct Gsi {
    cq: CqH,
    qp: QpH,
    rbuf: u64,
}

fn gsi(d: &mut Driver, n: u64) -> Gsi {
    let pd = d.alloc_pd();
    let cq = d.create_cq(6);
    let mut qp = d.create_qp(QPT_GSI, pd, cq.cqn, cq.cqn);
    d.bring_up_ud(qp.qpn, GSI_QKEY, true);
    let rbuf = d.alloc(n * 296, 64);
    for i in 0..n {
        d.post_recv(
            &mut qp,
            100 + i,
            &[sge(rbuf + i * 296, 296, LOCAL_DMA_LKEY)],
        );
    }
    Gsi { cq, qp, rbuf }
}

/// Sends `mad` from `g` to the SA and returns the answer's MAD.
fn ask_sa(net: &Net, d: &mut Driver, g: &mut Gsi, mad: &[u8; 256]) -> Vec<u8> {
    let sbuf = d.alloc(256, 64);
    d.write(sbuf, mad);
    let mut wr = send_wr(1, WR_SEND, WQE_SIGNALED);
    (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (SM_LID, GSI_QPN, GSI_QKEY);
    d.post_send(&mut g.qp, wr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let got = collect(net, d, &mut g.cq, 2, 50 * MS);
    let answer = got.iter().find(|c| u32::from(c.opcode) == CQE_OP_RECV);
    let answer = answer.expect("the SA answered across the link");
    assert_eq!(answer.slid, SM_LID);
    d.read(g.rbuf + (answer.wr_id - 100) * 296 + 40, 256)
}

/// PortCounters of `port` of the switch at `lid`, asked from `g` (as perfquery asks): the
/// answer's MAD, which must come from that switch.
fn perf_query(net: &Net, d: &mut Driver, g: &mut Gsi, lid: u16, port: u8) -> Vec<u8> {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x04, 1, 0x01]); // PerfMgmt Get
    m[8..16].copy_from_slice(&9u64.to_be_bytes());
    m[16..18].copy_from_slice(&0x0012u16.to_be_bytes()); // PortCounters
    m[64 + 1] = port;
    let sbuf = d.alloc(256, 64);
    d.write(sbuf, &m);
    let mut wr = send_wr(2, WR_SEND, WQE_SIGNALED);
    (wr.ud_dlid, wr.ud_remote_qpn, wr.ud_qkey) = (lid, GSI_QPN, GSI_QKEY);
    d.post_send(&mut g.qp, wr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let got = collect(net, d, &mut g.cq, 2, 50 * MS);
    let answer = got.iter().find(|c| u32::from(c.opcode) == CQE_OP_RECV);
    let answer = answer.unwrap_or_else(|| panic!("the PMA at LID {lid} answered: {got:?}"));
    assert_eq!(answer.slid, lid, "from the switch asked");
    d.read(g.rbuf + (answer.wr_id - 100) * 296 + 40, 256)
}

fn sa_mad(method: u8, attr: u16, comp_mask: u64) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x03, 2, method]);
    m[8..16].copy_from_slice(&7u64.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    m[48..56].copy_from_slice(&comp_mask.to_be_bytes());
    m
}

fn status(m: &[u8]) -> u16 {
    u16::from_be_bytes([m[4], m[5]])
}

#[test]
fn test_two_hosts_are_one_subnet_for_rc_the_sa_multicast_and_smps() {
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    // Host 0 holds what comes into it over the link for 100 us: held packets, a group's
    // included, go on when due.
    let plan = "[[link]]\nswitch_link = 1\ndelay_us = 100\n";
    let delay = Arc::new(hca_model::faults::FaultHook::new(
        hca_model::faults::FaultPlan::parse(plan).unwrap(),
        None,
    ));
    a.set_hook(Some(delay.clone()));
    let mut g1 = guest(a, 1);
    let mut g3 = guest(b, 3);
    // Before they hear of each other the far LIDs are not routed.
    assert!(!a.subnet().reaches(1, 3));
    net.announce();
    net.tick();
    assert_eq!(
        a.subnet().hops(1, 3),
        Some(2),
        "s0, then s1 on the other host"
    );
    assert_eq!(b.subnet().hops(3, 1), Some(2));
    // RC: an RDMA WRITE and a READ across hosts.
    let (pd1, pd3) = (g1.alloc_pd(), g3.alloc_pd());
    let (mut cq1, cq3) = (g1.create_cq(8), g3.create_cq(8));
    let mut q1 = g1.create_qp(QPT_RC, pd1, cq1.cqn, cq1.cqn);
    let q3 = g3.create_qp(QPT_RC, pd3, cq3.cqn, cq3.cqn);
    g1.bring_up_rc_tuned(q1.qpn, 3, q3.qpn, ALL_ACCESS, MTU_1024, (12, 7, 7));
    g3.bring_up_rc_tuned(q3.qpn, 1, q1.qpn, ALL_ACCESS, MTU_1024, (12, 7, 7));
    let (k1, k3) = (
        g1.reg_dma_mr(pd1, ALL_ACCESS),
        g3.reg_dma_mr(pd3, ALL_ACCESS),
    );
    let (src, dst) = (g1.alloc(8192, 64), g3.alloc(8192, 64));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
    g1.write(src, &data);
    let mut w = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, k3);
    g1.post_send(&mut q1, w, &[sge(src, 8192, k1)]);
    let c = collect(&net, &mut g1, &mut cq1, 1, 20 * MS);
    assert_eq!((c.len(), c[0].status), (1, 0), "{c:?}");
    assert_eq!(g3.read(dst, 8192), data);
    let back = g1.alloc(8192, 64);
    let mut r = send_wr(2, WR_RDMA_READ, WQE_SIGNALED);
    (r.remote_addr, r.rkey) = (dst, k3);
    g1.post_send(&mut q1, r, &[sge(back, 8192, k1)]);
    let c = collect(&net, &mut g1, &mut cq1, 1, 20 * MS);
    assert_eq!((c.len(), c[0].status), (1, 0), "{c:?}");
    assert_eq!(g1.read(back, 8192), data);
    let stats = a.remote_stats();
    assert!(stats.frames_out >= 8 && stats.frames_in >= 8, "{stats:?}");
    // The SA, on host 0, answers host 1's guest: a path to LID 1 by its GID.
    let guid1 = port_guid(&mut g1);
    let mut gs3 = gsi(&mut g3, 8);
    let mut q = sa_mad(0x01, 0x0035, 1 << 2);
    q[56 + 8..56 + 24].copy_from_slice(&port_gid(guid1));
    let p = ask_sa(&net, &mut g3, &mut gs3, &q);
    assert_eq!(status(&p), 0);
    assert_eq!(u16::from_be_bytes([p[56 + 40], p[56 + 41]]), 1, "DLID");
    assert_eq!(u16::from_be_bytes([p[56 + 42], p[56 + 43]]), 3, "SLID");
    // Both join the IPoIB broadcast group; a datagram from host 1 reaches both members.
    let mut gs1 = gsi(&mut g1, 8);
    let join = |guid: u64| {
        let mut q = sa_mad(0x02, 0x0038, 1 | 2 | 1 << 7 | 1 << 16);
        q[56..72].copy_from_slice(&IPOIB_BROADCAST_MGID);
        q[72..88].copy_from_slice(&port_gid(guid));
        q[56 + 40..56 + 42].copy_from_slice(&0xffffu16.to_be_bytes());
        q[56 + 48] = 1;
        q
    };
    let guid3 = port_guid(&mut g3);
    let j1 = ask_sa(&net, &mut g1, &mut gs1, &join(guid1));
    let j3 = ask_sa(&net, &mut g3, &mut gs3, &join(guid3));
    assert_eq!((status(&j1), status(&j3)), (0, 0));
    let mlid = u16::from_be_bytes([j3[56 + 36], j3[56 + 37]]);
    let mut members = Vec::new();
    for (g, d) in [(&mut g1, 0), (&mut g3, 1)] {
        let pd = g.alloc_pd();
        let cq = g.create_cq(6);
        let mut qp = g.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
        g.bring_up_ud(qp.qpn, 0xb, false);
        let mut m = HcaCmdMcast::default();
        (m.qpn, m.mgid, m.mlid) = (qp.qpn, IPOIB_BROADCAST_MGID, mlid);
        assert_eq!(g.cmd(CMD_ATTACH_MCAST, &m).0, 0);
        let rbuf = g.alloc(40 + 64, 64);
        g.post_recv(&mut qp, 50 + d, &[sge(rbuf, 40 + 64, LOCAL_DMA_LKEY)]);
        members.push((cq, qp, rbuf));
    }
    let sbuf = g3.alloc(64, 64);
    g3.write(sbuf, b"to every member, on either host");
    let mut wr = ud_send_wr(mlid, 0x00ff_ffff, 0xb);
    wr.wr_id = 60;
    let (_, qp3, _) = &mut members[1];
    g3.post_send(qp3, wr, &[sge(sbuf, 31, LOCAL_DMA_LKEY)]);
    for (i, g) in [&mut g1, &mut g3].into_iter().enumerate() {
        let (cq, _, rbuf) = &mut members[i];
        let got = collect(&net, g, cq, 2, 20 * MS);
        let recv = got.iter().find(|c| u32::from(c.opcode) == CQE_OP_RECV);
        assert!(recv.is_some(), "member {i} got the datagram: {got:?}");
        assert_eq!(g.read(*rbuf + 40, 31), b"to every member, on either host");
    }
    // A directed route from host 1's guest to the SM's switch on host 0: s1 (port 1 in),
    // out of its port 3 over the link, answered by s0, back the same way.
    let pd = g3.alloc_pd();
    let mut cq0 = g3.create_cq(6);
    let mut qp0 = g3.create_qp(QPT_SMI, pd, cq0.cqn, cq0.cqn);
    g3.bring_up_ud(qp0.qpn, 0, true);
    let rbuf = g3.alloc(296, 64);
    g3.post_recv(&mut qp0, 70, &[sge(rbuf, 296, LOCAL_DMA_LKEY)]);
    let mut smp = [0u8; 256];
    (smp[0], smp[1], smp[2], smp[3], smp[6], smp[7]) = (1, 0x81, 1, 0x01, 1, 2);
    smp[16..18].copy_from_slice(&0x0011u16.to_be_bytes()); // NodeInfo
    smp[32..36].copy_from_slice(&[0xff; 4]);
    (smp[128], smp[129], smp[130]) = (0, 1, 3);
    let sbuf = g3.alloc(256, 64);
    g3.write(sbuf, &smp);
    let mut dr = send_wr(71, WR_SEND, WQE_SIGNALED);
    (dr.ud_dlid, dr.ud_remote_qpn, dr.ud_qkey) = (0xffff, SMI_QPN, 0);
    g3.post_send(&mut qp0, dr, &[sge(sbuf, 256, LOCAL_DMA_LKEY)]);
    let got = collect(&net, &mut g3, &mut cq0, 2, 20 * MS);
    assert!(
        got.iter().any(|c| u32::from(c.opcode) == CQE_OP_RECV),
        "{got:?}"
    );
    let ans = g3.read(rbuf + 40, 256);
    assert_eq!((ans[3], ans[6]), (0x81, 1), "GetResp, back at hop 1");
    assert_eq!(
        ans[192 + 1..192 + 3],
        [1, 3],
        "in by s1's port 1, then s0's port 3"
    );
    let guid = u64::from_be_bytes(ans[64 + 12..64 + 20].try_into().unwrap());
    assert_eq!(guid, node_guid(SM_LID), "the SM's switch");
    assert!(delay.counts().delayed > 0, "{:?}", delay.counts());
}

#[test]
fn test_a_host_not_heard_from_takes_its_link_and_ports_down_until_it_is_back() {
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    let mut g1 = guest(a, 1);
    let _g3 = guest(b, 3);
    net.announce();
    net.tick();
    let mut gs1 = gsi(&mut g1, 16);
    // A trap 65 subscription at LID 1, as ib_sa makes one.
    let mut sub = sa_mad(0x02, 0x0003, 0);
    let d = &mut sub[56..];
    d[16..18].copy_from_slice(&0xffffu16.to_be_bytes());
    (d[22], d[23]) = (1, 1);
    d[26..28].copy_from_slice(&65u16.to_be_bytes());
    d[28..32].copy_from_slice(&(GSI_QPN << 8).to_be_bytes());
    assert_eq!(status(&ask_sa(&net, &mut g1, &mut gs1, &sub)), 0);
    let path_to_3 = || {
        let mut q = sa_mad(0x01, 0x0035, 1 << 4 | 1 << 5);
        q[56 + 40..56 + 42].copy_from_slice(&3u16.to_be_bytes());
        q[56 + 42..56 + 44].copy_from_slice(&1u16.to_be_bytes());
        q
    };
    assert_eq!(status(&ask_sa(&net, &mut g1, &mut gs1, &path_to_3())), 0);
    // Host 1 falls silent (its caller's timer says so): the link goes, its port is out
    // of service, and no path leads there.
    net.cut.store(true, Relaxed);
    a.set_host_alive(1, false);
    net.tick();
    assert_eq!(a.subnet().link_up(0), Some(false));
    assert!(!a.subnet().reaches(1, 3));
    let got = g1.drain_cq(&mut gs1.cq);
    let reports: Vec<Vec<u8>> = (got.iter())
        .filter(|c| u32::from(c.opcode) == CQE_OP_RECV)
        .map(|c| g1.read(gs1.rbuf + (c.wr_id - 100) * 296 + 40, 256))
        .filter(|m| m[3] == 0x06)
        .collect();
    assert_eq!(reports.len(), 1, "one trap 65");
    assert_eq!(
        u16::from_be_bytes([reports[0][56 + 4], reports[0][56 + 5]]),
        65
    );
    assert_eq!(
        status(&ask_sa(&net, &mut g1, &mut gs1, &path_to_3())),
        3 << 8,
        "no records"
    );
    // Back: heard from again, the link and the path return.
    net.cut.store(false, Relaxed);
    net.announce();
    net.tick();
    assert_eq!(a.subnet().link_up(0), Some(true));
    assert_eq!(status(&ask_sa(&net, &mut g1, &mut gs1, &path_to_3())), 0);
}

#[test]
fn test_what_a_peer_host_sends_is_checked() {
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    let mut g1 = guest(a, 1);
    let _g3 = guest(b, 3);
    // Junk, and a frame of another version.
    assert!(matches!(
        a.receive(1, &[1, 2, 3]),
        Err(RemoteError::Wire(_))
    ));
    assert!(matches!(
        a.receive(1, &[9, 1, 0, 0]),
        Err(RemoteError::Wire(_))
    ));
    // A packet from a host that does not end the link it names (host 0 is this one).
    let pkt = hca_model::packet::Packet {
        slid: 3,
        dlid: 1,
        opcode: hca_model::packet::RC_SEND_ONLY,
        count: 1,
        ..Default::default()
    };
    let frame = |link| Frame::Packet {
        link,
        hops: 0,
        members: vec![],
        bounce: false,
        pkt: pkt.clone(),
    };
    let d = wire::encode(&frame(0)).unwrap();
    assert_eq!(
        a.receive(0, &d),
        Err(RemoteError::NotItsLink { host: 0, link: 0 })
    );
    assert_eq!(
        a.receive(2, &d),
        Err(RemoteError::NotItsLink { host: 2, link: 0 })
    );
    let d = wire::encode(&frame(9)).unwrap();
    assert_eq!(
        a.receive(1, &d),
        Err(RemoteError::NotItsLink { host: 1, link: 9 })
    );
    // Announcements: for another host, of a port on host 0's switch, of a switch's LID.
    let ad = |host, lid| {
        wire::encode(&Frame::Announce {
            host,
            seq: 1,
            links: vec![],
            ports: vec![PortAd {
                lid,
                guid: 5,
                caps: 0,
                up: true,
            }],
        })
        .unwrap()
    };
    assert!(matches!(
        a.receive(1, &ad(0, 3)),
        Err(RemoteError::NotItsOwn { .. })
    ));
    assert!(matches!(
        a.receive(1, &ad(1, 2)),
        Err(RemoteError::NotItsOwn { .. })
    ));
    assert!(matches!(
        a.receive(1, &ad(1, SM_LID - 1)),
        Err(RemoteError::NotItsOwn { .. })
    ));
    // A port on host 1 with host 0's node's GUID: the SA would give its GID away.
    let guid1 = port_guid(&mut g1);
    let hijack = wire::encode(&Frame::Announce {
        host: 1,
        seq: 2,
        links: vec![],
        ports: vec![PortAd {
            lid: 3,
            guid: guid1,
            caps: 0,
            up: true,
        }],
    })
    .unwrap();
    assert!(matches!(
        a.receive(1, &hijack),
        Err(RemoteError::NotItsOwn { .. })
    ));
    // Packets that cannot have come from host 1: from a port or the SM of host 0, a
    // unicast packet named for another port, or a group's copy named for a switch (which
    // would reach the SA's port, or go round as a fresh group packet).
    let forged = |slid, dlid, egress| {
        let pkt = hca_model::packet::Packet {
            slid,
            dlid,
            ..pkt.clone()
        };
        wire::encode(&Frame::Packet {
            link: 0,
            hops: 0,
            members: if egress == 0 { vec![] } else { vec![egress] },
            bounce: false,
            pkt,
        })
        .unwrap()
    };
    // A group's copies for a port here "from" a port here, to the SM's host (which
    // sends them, never takes them) are forged too.
    for (slid, dlid, egress) in [
        (1, 2, 0),
        (SM_LID, 1, 0),
        (3, 1, 2),
        (3, 0xc000, SM_LID),
        (1, 0xc000, 2),
    ] {
        assert!(
            matches!(
                a.receive(1, &forged(slid, dlid, egress)),
                Err(RemoteError::Spoofed { .. })
            ),
            "from {slid} to {dlid}, for member {egress}"
        );
    }
    // One LID twice in an announcement.
    let twice = wire::encode(&Frame::Announce {
        host: 1,
        seq: 3,
        links: vec![],
        ports: vec![
            PortAd {
                lid: 3,
                guid: 7,
                caps: 0,
                up: true,
            };
            2
        ],
    })
    .unwrap();
    assert!(matches!(
        a.receive(1, &twice),
        Err(RemoteError::NotItsOwn { .. })
    ));
    assert_eq!(a.remote_stats().refused, 15);
    // Nothing of it took: LID 3 is unknown, the link up, host 1's own announcement fine.
    assert!(!a.subnet().reaches(1, 3));
    assert_eq!(a.receive(1, &b.announcement()), Ok(()));
    net.tick();
    assert!(a.subnet().reaches(1, 3));
    // A packet whose way leads back over the link it came by (tables that disagree for a
    // moment) is lost here, not sent back.
    let (out, lost) = (a.remote_stats().frames_out, a.stats().unrouted);
    a.receive(1, &forged(4, 3, 0)).unwrap();
    assert_eq!(a.remote_stats().frames_out, out, "not sent back");
    assert_eq!(a.stats().unrouted, lost + 1);
}

/// A receiver on another host that refuses a packet (no such QP) tells its sender, as one
/// on the same host does: the RC WR fails at once, not after its retries.
#[test]
fn test_a_refusal_on_another_host_reaches_the_sender() {
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    let mut g1 = guest(a, 1);
    let _g3 = guest(b, 3);
    net.announce();
    net.tick();
    let pd = g1.alloc_pd();
    let mut cq = g1.create_cq(8);
    let mut qp = g1.create_qp(QPT_RC, pd, cq.cqn, cq.cqn);
    // timeout 14 (67 ms) x 8 tries: half a second of retries were it lost.
    g1.bring_up_rc_tuned(qp.qpn, 3, 0x00ab_cdef, ALL_ACCESS, MTU_1024, (14, 7, 7));
    let key = g1.reg_dma_mr(pd, ALL_ACCESS);
    let buf = g1.alloc(64, 64);
    g1.post_send(
        &mut qp,
        send_wr(5, WR_SEND, WQE_SIGNALED),
        &[sge(buf, 64, key)],
    );
    let c = collect(&net, &mut g1, &mut cq, 1, 10 * MS);
    assert_eq!(
        (c.len(), c[0].wr_id, u32::from(c[0].status)),
        (1, 5, WC_RETRY_EXC_ERR),
        "{c:?}"
    );
    assert_eq!(
        g1.hca.stats().retransmits,
        0,
        "heard at once, not timed out"
    );
    // A refusal must name a refusing port on the sender's side: one "from" this host's
    // own port is forged.
    let forged = wire::encode(&Frame::Packet {
        link: 0,
        hops: 0,
        members: vec![],
        bounce: true,
        pkt: hca_model::packet::Packet {
            slid: 1,
            dlid: 2,
            opcode: hca_model::packet::RC_SEND_ONLY,
            count: 1,
            ..Default::default()
        },
    })
    .unwrap();
    assert!(matches!(
        a.receive(1, &forged),
        Err(RemoteError::Spoofed { .. })
    ));
}

#[test]
fn test_an_inter_host_link_counts_on_both_hosts_and_one_plan_judges_each_packet_once() {
    use hca_model::faults::{FaultHook, FaultPlan};
    use hca_model::subnet::SwitchLink;
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    // The same plan on both hosts, as one cluster file gives it: a loss on the link,
    // both ways.
    let plan = "seed = 3\n[[link]]\nswitch_link = 1\ndrop = 0.2\n";
    let hooks: Vec<Arc<FaultHook>> = (net.hosts.iter())
        .map(|f| {
            let h = Arc::new(FaultHook::new(FaultPlan::parse(plan).unwrap(), None));
            f.set_hook(Some(h.clone()));
            h
        })
        .collect();
    // Host b's capture: what its node sends, and what comes from host a.
    let seen = Arc::new(Seen::default());
    b.set_tap(Some(seen.clone()));
    let mut g1 = guest(a, 1);
    let mut g3 = guest(b, 3);
    net.announce();
    net.tick();
    let (pd1, pd3) = (g1.alloc_pd(), g3.alloc_pd());
    let (mut cq1, cq3) = (g1.create_cq(16), g3.create_cq(8));
    let mut q1 = g1.create_qp(QPT_RC, pd1, cq1.cqn, cq1.cqn);
    let q3 = g3.create_qp(QPT_RC, pd3, cq3.cqn, cq3.cqn);
    g1.bring_up_rc_tuned(q1.qpn, 3, q3.qpn, ALL_ACCESS, MTU_1024, (10, 7, 7));
    g3.bring_up_rc_tuned(q3.qpn, 1, q1.qpn, ALL_ACCESS, MTU_1024, (10, 7, 7));
    let (k1, k3) = (
        g1.reg_dma_mr(pd1, ALL_ACCESS),
        g3.reg_dma_mr(pd3, ALL_ACCESS),
    );
    let (src, dst) = (g1.alloc(65536, 64), g3.alloc(65536, 64));
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 11) as u8).collect();
    g1.write(src, &data);
    for i in 0..8u64 {
        let mut w = send_wr(i, WR_RDMA_WRITE, WQE_SIGNALED);
        (w.remote_addr, w.rkey) = (dst + i * 8192, k3);
        g1.post_send(&mut q1, w, &[sge(src + i * 8192, 8192, k1)]);
    }
    let c = collect(&net, &mut g1, &mut cq1, 8, Duration::from_secs(5));
    assert_eq!(c.len(), 8);
    assert!(c.iter().all(|c| c.status == 0), "{c:?}");
    assert_eq!(g3.read(dst, 65536), data);
    let way = |f: &Fabric, forward| {
        f.switch_link_stats(SwitchLink { link: 0, forward })
            .unwrap()
    };
    // s0 (host 0) to s1 (host 1): host 0 counted what it sent, host 1 what arrived and
    // what its plan dropped; every packet sent is one or the other.
    let (sent, came) = (way(a, true), way(b, true));
    assert!(sent.xmit_pkts >= 64, "{sent:?}");
    assert_eq!(came.rcv_pkts + came.discards, sent.xmit_pkts, "{came:?}");
    assert_eq!(sent.discards, 0, "judged where it arrives, not twice");
    let (acks_sent, acks_came) = (way(b, false), way(a, false));
    assert_eq!(acks_came.rcv_pkts + acks_came.discards, acks_sent.xmit_pkts);
    let (da, db) = (hooks[0].counts().dropped, hooks[1].counts().dropped);
    assert_eq!((da, db), (acks_came.discards, came.discards));
    assert!(
        db > 0,
        "host 1's plan dropped some of what came over the link"
    );
    assert!(g1.hca.stats().retransmits > 0);
    // Host b's capture has node 1's writes once each as host a sent them (before the
    // plan, as a capture sees a local packet before the hook), and node 3's ACKs.
    let seen = seen.0.lock().unwrap();
    let from = |lid: u16| seen.iter().filter(|&&(s, _)| s == lid).count() as u64;
    assert_eq!(from(1), came.rcv_pkts + came.discards);
    assert_eq!(from(3), acks_sent.xmit_pkts);
    drop(seen);
    // Host 1's switch's PMA, asked from host 0 with the plan off: its port 3 (the link)
    // received what came, the query too, and counts what host 1 dropped as errors; no
    // down since boot.
    for f in &net.hosts {
        f.set_hook(None);
    }
    let mut gs1 = gsi(&mut g1, 4);
    let pc = perf_query(&net, &mut g1, &mut gs1, SM_LID - 1, 3);
    let be = |off: usize, n: usize| {
        (pc[64 + off..64 + off + n].iter()).fold(0u64, |v, &x| v << 8 | u64::from(x))
    };
    assert_eq!(status(&pc), 0);
    assert_eq!(be(36, 4), came.rcv_pkts + 1, "PortRcvPkts");
    assert_eq!(be(8, 2), came.discards, "PortRcvErrors");
    assert_eq!(be(32, 4), acks_sent.xmit_pkts, "PortXmitPkts");
    assert_eq!(be(7, 1), 0, "LinkDownedCounter");
}

/// A capture that notes (SLID, DLID) of every packet it sees.
#[derive(Default)]
struct Seen(Mutex<Vec<(u16, u16)>>);

impl hca_model::PacketTap for Seen {
    fn on_wire(&self, _now_ns: u64, pkt: &hca_model::packet::Packet) {
        self.0.lock().unwrap().push((pkt.slid, pkt.dlid));
    }
}

/// Joins `g` (its GSI `gs`, its port GUID `guid`) to the IPoIB broadcast group through the
/// SA across the hosts, and attaches a UD QP with a receive for one datagram (wr_id
/// `wr_id`): its CQ, QP and receive buffer, and the group's MLID.
fn broadcast_member(net: &Net, g: &mut Driver, gs: &mut Gsi, wr_id: u64) -> ((CqH, QpH, u64), u16) {
    let guid = port_guid(g);
    let mut q = sa_mad(0x02, 0x0038, 1 | 2 | 1 << 7 | 1 << 16);
    q[56..72].copy_from_slice(&IPOIB_BROADCAST_MGID);
    q[72..88].copy_from_slice(&port_gid(guid));
    q[56 + 40..56 + 42].copy_from_slice(&0xffffu16.to_be_bytes());
    q[56 + 48] = 1;
    let j = ask_sa(net, g, gs, &q);
    assert_eq!(status(&j), 0, "joined");
    let mlid = u16::from_be_bytes([j[56 + 36], j[56 + 37]]);
    let pd = g.alloc_pd();
    let cq = g.create_cq(6);
    let mut qp = g.create_qp(QPT_UD, pd, cq.cqn, cq.cqn);
    g.bring_up_ud(qp.qpn, 0xb, false);
    let mut m = HcaCmdMcast::default();
    (m.qpn, m.mgid, m.mlid) = (qp.qpn, IPOIB_BROADCAST_MGID, mlid);
    assert_eq!(g.cmd(CMD_ATTACH_MCAST, &m).0, 0);
    let rbuf = g.alloc(40 + 64, 64);
    g.post_recv(&mut qp, wr_id, &[sge(rbuf, 40 + 64, LOCAL_DMA_LKEY)]);
    ((cq, qp, rbuf), mlid)
}

#[test]
fn test_a_groups_packet_crosses_to_another_host_once_for_all_its_members_there() {
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    let mut g1 = guest(a, 1);
    let mut g3 = guest(b, 3);
    let mut g4 = guest(b, 4);
    net.announce();
    net.tick();
    let mut gs: Vec<Gsi> = [&mut g1, &mut g3, &mut g4]
        .into_iter()
        .map(|g| gsi(g, 4))
        .collect();
    let (m1, mlid) = broadcast_member(&net, &mut g1, &mut gs[0], 51);
    let (m3, _) = broadcast_member(&net, &mut g3, &mut gs[1], 53);
    let (mut m4, _) = broadcast_member(&net, &mut g4, &mut gs[2], 54);
    let mut members = [m1, m3];
    // Node 1 (host 0, the SM's) sends to the group: host 1 gets one frame for its two
    // members, and each of them its copy.
    let frames = b.remote_stats().frames_in;
    let sbuf = g1.alloc(64, 64);
    g1.write(sbuf, b"one frame, two members");
    let mut wr = ud_send_wr(mlid, 0x00ff_ffff, 0xb);
    wr.wr_id = 60;
    g1.post_send(&mut members[0].1, wr, &[sge(sbuf, 22, LOCAL_DMA_LKEY)]);
    for (g, (cq, _, rbuf)) in [(&mut g3, &mut members[1]), (&mut g4, &mut m4)] {
        let got = collect(&net, g, cq, 1, 20 * MS);
        assert!(
            got.iter().any(|c| u32::from(c.opcode) == CQE_OP_RECV),
            "{got:?}"
        );
        assert_eq!(g.read(*rbuf + 40, 22), b"one frame, two members");
    }
    assert_eq!(b.remote_stats().frames_in - frames, 1, "one frame for both");
    // Node 3 (host 1) sends: to the SM's host once, and back once for host 1's two
    // members (the sender's own port among them).
    let [m1, m3] = &mut members;
    for (g, (_, qp, rbuf), id) in [(&mut g1, m1, 51), (&mut g3, m3, 53), (&mut g4, &mut m4, 54)] {
        g.post_recv(qp, id, &[sge(*rbuf, 40 + 64, LOCAL_DMA_LKEY)]);
    }
    let (a_in, b_in) = (a.remote_stats().frames_in, b.remote_stats().frames_in);
    let sbuf = g3.alloc(64, 64);
    g3.write(sbuf, b"from host 1 and back");
    let mut wr = ud_send_wr(mlid, 0x00ff_ffff, 0xb);
    wr.wr_id = 61;
    g3.post_send(&mut members[1].1, wr, &[sge(sbuf, 20, LOCAL_DMA_LKEY)]);
    let got = collect(&net, &mut g4, &mut m4.0, 1, 20 * MS);
    assert!(got.iter().any(|c| u32::from(c.opcode) == CQE_OP_RECV));
    assert_eq!(g4.read(m4.2 + 40, 20), b"from host 1 and back");
    let (cq1, _, rbuf1) = &mut members[0];
    let got = collect(&net, &mut g1, cq1, 1, 20 * MS);
    assert!(got.iter().any(|c| u32::from(c.opcode) == CQE_OP_RECV));
    assert_eq!(g1.read(*rbuf1 + 40, 20), b"from host 1 and back");
    let (cq3, _, rbuf3) = &mut members[1];
    let got = collect(&net, &mut g3, cq3, 2, 20 * MS);
    let recvs = got
        .iter()
        .filter(|c| u32::from(c.opcode) == CQE_OP_RECV)
        .count();
    assert_eq!(recvs, 1, "the sender's own copy, once: {got:?}");
    assert_eq!(g3.read(*rbuf3 + 40, 20), b"from host 1 and back");
    assert_eq!(
        (
            a.remote_stats().frames_in - a_in,
            b.remote_stats().frames_in - b_in
        ),
        (1, 1),
        "to the SM's host once, back once"
    );
}

#[test]
fn test_a_groups_packet_reaches_the_members_beside_its_sender_through_a_host_between() {
    // A chain: host 0 (the SM's, node 1) - host 1 (node 2) - host 2 (nodes 3 and 4).
    let net = Net::chain(&[3, 4]);
    let mut g1 = guest(&net.hosts[0], 1);
    let mut g3 = guest(&net.hosts[2], 3);
    let mut g4 = guest(&net.hosts[2], 4);
    net.announce();
    net.tick();
    net.tick();
    assert_eq!(net.hosts[2].subnet().hops(3, 1), Some(3), "s2, s1, s0");
    let mut gs: Vec<Gsi> = [&mut g1, &mut g3, &mut g4]
        .into_iter()
        .map(|g| gsi(g, 4))
        .collect();
    let (mut m1, mlid) = broadcast_member(&net, &mut g1, &mut gs[0], 51);
    let (mut m3, _) = broadcast_member(&net, &mut g3, &mut gs[1], 53);
    let (mut m4, _) = broadcast_member(&net, &mut g4, &mut gs[2], 54);
    // Node 3's broadcast goes to the SM's host and comes back through host 1 for nodes
    // 3 and 4, in one frame over each link.
    let (via_in, far_in) = (
        net.hosts[1].remote_stats().frames_in,
        net.hosts[2].remote_stats().frames_in,
    );
    let sbuf = g3.alloc(64, 64);
    g3.write(sbuf, b"ARP, who has");
    let mut wr = ud_send_wr(mlid, 0x00ff_ffff, 0xb);
    wr.wr_id = 60;
    g3.post_send(&mut m3.1, wr, &[sge(sbuf, 12, LOCAL_DMA_LKEY)]);
    for (g, (cq, _, rbuf)) in [(&mut g4, &mut m4), (&mut g1, &mut m1), (&mut g3, &mut m3)] {
        let got = collect(&net, g, cq, 1, 20 * MS);
        assert!(
            got.iter().any(|c| u32::from(c.opcode) == CQE_OP_RECV),
            "{got:?}"
        );
        assert_eq!(g.read(*rbuf + 40, 12), b"ARP, who has");
    }
    assert_eq!(
        (
            net.hosts[1].remote_stats().frames_in - via_in,
            net.hosts[2].remote_stats().frames_in - far_in,
        ),
        (2, 1),
        "host 1: on its way to host 0 and back; host 2: one frame for nodes 3 and 4"
    );
}

#[test]
fn test_a_sender_hears_at_once_that_a_port_on_another_host_is_gone() {
    let net = Net::two_hosts();
    let (a, b) = (&net.hosts[0], &net.hosts[1]);
    let mut g1 = guest(a, 1);
    let mut g3 = guest(b, 3);
    net.announce();
    net.tick();
    let (pd1, pd3) = (g1.alloc_pd(), g3.alloc_pd());
    let (mut cq1, cq3) = (g1.create_cq(8), g3.create_cq(8));
    let mut q1 = g1.create_qp(QPT_RC, pd1, cq1.cqn, cq1.cqn);
    let q3 = g3.create_qp(QPT_RC, pd3, cq3.cqn, cq3.cqn);
    // timeout 14 (67 ms) x 7 retries: half a second were the loss only timed out.
    g1.bring_up_rc_tuned(q1.qpn, 3, q3.qpn, ALL_ACCESS, MTU_1024, (14, 7, 7));
    g3.bring_up_rc_tuned(q3.qpn, 1, q1.qpn, ALL_ACCESS, MTU_1024, (14, 7, 7));
    let (k1, k3) = (
        g1.reg_dma_mr(pd1, ALL_ACCESS),
        g3.reg_dma_mr(pd3, ALL_ACCESS),
    );
    let (src, dst) = (g1.alloc(4096, 64), g3.alloc(4096, 64));
    // Node 3's HCA leaves the fabric (its node killed), before host 0 hears of it.
    g3.hca.detach();
    let mut w = send_wr(9, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, k3);
    g1.post_send(&mut q1, w, &[sge(src, 4096, k1)]);
    let c = collect(&net, &mut g1, &mut cq1, 1, 10 * MS);
    assert_eq!(
        (c.len(), c.first().map(|c| u32::from(c.status))),
        (1, Some(WC_RETRY_EXC_ERR)),
        "{c:?}"
    );
    assert_eq!(
        g1.hca.stats().retransmits,
        0,
        "heard at once, not timed out"
    );
    // Once host 1 has said so, host 0's own tables leave LID 3 out: a new connection's
    // first WRITE is refused at host 0 itself, as on one switch.
    net.announce();
    net.tick();
    assert!(!a.subnet().reaches(1, 3));
    let mut q = g1.create_qp(QPT_RC, pd1, cq1.cqn, cq1.cqn);
    g1.bring_up_rc_tuned(q.qpn, 3, q3.qpn, ALL_ACCESS, MTU_1024, (14, 7, 7));
    let mut w = send_wr(10, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, k3);
    let frames = a.remote_stats().frames_out;
    g1.post_send(&mut q, w, &[sge(src, 4096, k1)]);
    let c = collect(&net, &mut g1, &mut cq1, 1, 10 * MS);
    assert_eq!(
        (c.len(), c.first().map(|c| (c.wr_id, u32::from(c.status)))),
        (1, Some((10, WC_RETRY_EXC_ERR))),
        "{c:?}"
    );
    assert_eq!(a.remote_stats().frames_out, frames, "nothing sent across");
    assert_eq!(g1.hca.stats().retransmits, 0);
}

#[test]
fn test_a_host_between_refuses_for_a_port_gone_beyond_it() {
    // A chain: host 0 (node 1) - host 1 (node 2) - host 2 (node 3).
    let net = Net::chain(&[3]);
    let mut g1 = guest(&net.hosts[0], 1);
    let mut g3 = guest(&net.hosts[2], 3);
    net.announce();
    net.tick();
    net.tick();
    let (pd1, pd3) = (g1.alloc_pd(), g3.alloc_pd());
    let (mut cq1, cq3) = (g1.create_cq(8), g3.create_cq(8));
    let mut q1 = g1.create_qp(QPT_RC, pd1, cq1.cqn, cq1.cqn);
    let q3 = g3.create_qp(QPT_RC, pd3, cq3.cqn, cq3.cqn);
    g1.bring_up_rc_tuned(q1.qpn, 3, q3.qpn, ALL_ACCESS, MTU_1024, (14, 7, 7));
    let (k1, k3) = (
        g1.reg_dma_mr(pd1, ALL_ACCESS),
        g3.reg_dma_mr(pd3, ALL_ACCESS),
    );
    let (src, dst) = (g1.alloc(4096, 64), g3.alloc(64, 64));
    // Node 3 leaves; only host 1 has heard (and swept), host 0 still routes LID 3.
    g3.hca.detach();
    let said = net.hosts[2].announcement();
    net.hosts[1].receive(2, &said).unwrap();
    net.hosts[1].advance(MS);
    assert!(!net.hosts[1].subnet().reaches(2, 3));
    assert!(net.hosts[0].subnet().reaches(1, 3));
    let mut w = send_wr(9, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, k3);
    g1.post_send(&mut q1, w, &[sge(src, 64, k1)]);
    let c = collect(&net, &mut g1, &mut cq1, 1, 10 * MS);
    assert_eq!(
        (c.len(), c.first().map(|c| u32::from(c.status))),
        (1, Some(WC_RETRY_EXC_ERR)),
        "{c:?}"
    );
    assert_eq!(g1.hca.stats().retransmits, 0, "refused by host 1 at once");
}

/// Nodes 1..=`n` on host 0 of `net`, each a member of the IPoIB broadcast group with a
/// receive posted (wr_id 50 + k for node k + 1): their drivers, member QPs and the MLID.
fn broadcast_members(net: &Net, n: u16) -> (Vec<Driver>, Vec<(CqH, QpH, u64)>, u16) {
    let mut gs: Vec<Driver> = (1..=n).map(|lid| guest(&net.hosts[0], lid)).collect();
    net.tick();
    let mut members = Vec::new();
    let mut mlid = 0;
    for (k, g) in gs.iter_mut().enumerate() {
        let mut s = gsi(g, 4);
        let (m, l) = broadcast_member(net, g, &mut s, 50 + k as u64);
        members.push(m);
        mlid = l;
    }
    (gs, members, mlid)
}

/// Within one host too, a group's packet leaves each switch once by each port its members'
/// ways take (as a switch's multicast table sends it), not once per member: three switches
/// in a line, the sender on the first, members on the second (two) and the third.
#[test]
fn test_a_groups_packet_crosses_each_link_of_a_host_once_for_all_its_members() {
    let t = Topology::new(
        vec![sw("s0", &[1]), sw("s1", &[2, 3]), sw("s2", &[4])],
        vec![(0, 1), (1, 2)],
    )
    .unwrap();
    let net = Net::on(t, 1);
    let f = &net.hosts[0];
    let (mut gs, mut members, mlid) = broadcast_members(&net, 4);
    let way = |link: usize, forward: bool| {
        let s = f.switch_link_stats(SwitchLink { link, forward }).unwrap();
        s.mcast_xmit_pkts
    };
    let before = [way(0, true), way(1, true), way(0, false), way(1, false)];
    let sbuf = gs[0].alloc(64, 64);
    gs[0].write(sbuf, b"once a link");
    let mut wr = ud_send_wr(mlid, 0x00ff_ffff, 0xb);
    wr.wr_id = 60;
    gs[0].post_send(&mut members[0].1, wr, &[sge(sbuf, 11, LOCAL_DMA_LKEY)]);
    for (g, (cq, _, rbuf)) in gs.iter_mut().zip(&mut members).skip(1) {
        let got = collect(&net, g, cq, 1, 20 * MS);
        let recvs = got.iter().filter(|c| u32::from(c.opcode) == CQE_OP_RECV);
        assert_eq!(recvs.count(), 1, "{got:?}");
        assert_eq!(g.read(*rbuf + 40, 11), b"once a link");
    }
    let after = [way(0, true), way(1, true), way(0, false), way(1, false)];
    let crossed: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(
        crossed,
        [1, 1, 0, 0],
        "s0->s1, s1->s2 once each; nothing back"
    );
}

/// Duplicates the first `dups` group packets crossing inter-switch link `link`.
struct DupOn {
    link: SwitchLink,
    dups: std::sync::atomic::AtomicU64,
}

impl hca_model::fabric::LinkHook for DupOn {
    fn on_packet(
        &self,
        _: hca_model::fabric::LinkId,
        _: u64,
        _: &mut hca_model::packet::Packet,
    ) -> hca_model::fabric::Verdict {
        hca_model::fabric::Verdict::Pass
    }

    fn on_switch_link(
        &self,
        l: SwitchLink,
        _: u64,
        p: &mut hca_model::packet::Packet,
    ) -> hca_model::fabric::Verdict {
        let dup = l == self.link && p.is_multicast();
        if dup
            && self
                .dups
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            return hca_model::fabric::Verdict::Duplicate;
        }
        hca_model::fabric::Verdict::Pass
    }
}

/// A group's copy for several members that a link hook duplicates parts where it
/// arrives, as the first does (no detour through one member's switch and back); and a
/// link down toward several members loses one copy, not one a member.
#[test]
fn test_a_groups_copies_part_where_they_arrive_and_a_link_down_loses_one() {
    // A star: s0 (node 1) - s1 - s2 (node 2) and s3 (node 3).
    let t = Topology::new(
        vec![
            sw("s0", &[1]),
            sw("s1", &[]),
            sw("s2", &[2]),
            sw("s3", &[3]),
        ],
        vec![(0, 1), (1, 2), (1, 3)],
    )
    .unwrap();
    let net = Net::on(t, 1);
    let f = &net.hosts[0];
    let (mut gs, mut members, mlid) = broadcast_members(&net, 3);
    for (g, (_, qp, rbuf)) in gs.iter_mut().zip(&mut members).skip(1) {
        g.post_recv(qp, 70, &[sge(*rbuf, 40 + 64, LOCAL_DMA_LKEY)]);
    }
    let mcast = |link: usize, forward: bool| {
        let s = f.switch_link_stats(SwitchLink { link, forward }).unwrap();
        (s.mcast_xmit_pkts, s.discards)
    };
    let back = [mcast(1, false), mcast(2, false), mcast(0, false)];
    let s0s1 = SwitchLink {
        link: 0,
        forward: true,
    };
    f.set_hook(Some(Arc::new(DupOn {
        link: s0s1,
        dups: 1.into(),
    })));
    let sbuf = gs[0].alloc(64, 64);
    let send = |g: &mut Driver, qp: &mut QpH| {
        let mut wr = ud_send_wr(mlid, 0x00ff_ffff, 0xb);
        wr.wr_id = 60;
        g.post_send(qp, wr, &[sge(sbuf, 8, LOCAL_DMA_LKEY)]);
    };
    send(&mut gs[0], &mut members[0].1);
    for (g, (cq, _, _)) in gs.iter_mut().zip(&mut members).skip(1) {
        let got = collect(&net, g, cq, 2, 20 * MS);
        let recvs = got.iter().filter(|c| u32::from(c.opcode) == CQE_OP_RECV);
        assert_eq!(recvs.count(), 2, "the copy and the hook's copy");
    }
    let now = [mcast(1, false), mcast(2, false), mcast(0, false)];
    assert_eq!(now, back, "nothing back toward s1 or s0");
    assert_eq!(
        mcast(1, true).0,
        2,
        "s1 -> s2: the copy and the hook's copy"
    );
    // s0-s1 down (the SM finds no way round): one copy for nodes 2 and 3 lost there, not
    // one a member.
    f.set_hook(None);
    let (sent, lost) = mcast(0, true);
    f.set_switch_link(0, false).unwrap();
    send(&mut gs[0], &mut members[0].1);
    net.settle();
    let (sent_now, lost_now) = mcast(0, true);
    assert_eq!(
        (sent_now - sent, lost_now - lost),
        (1, 1),
        "one copy for both, lost"
    );
}
