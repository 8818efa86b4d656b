//! Two hosts on the real network (UDP on the loopback interface), each a fabric with its
//! own switch and guest, joined as one subnet: RC crosses; a host that leaves is found gone
//! within a bound, and RC to it fails within its retry budget; strangers are ignored.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use cluster::interhost::{Interhost, DEAD_AFTER};
use hca_model::abi::*;
use hca_model::subnet::{SwitchSpec, Topology};
use hca_model::Fabric;
use hca_test_driver::*;

const MTU_1024: u8 = 3;

fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    ok()
}

fn poll(d: &mut Driver, cq: &mut CqH, limit: Duration) -> Vec<HcaCqe> {
    let mut got = Vec::new();
    wait_for(limit, || {
        got.extend(d.drain_cq(cq));
        !got.is_empty()
    });
    got
}

#[test]
fn test_two_hosts_over_udp_share_a_subnet_until_one_leaves() {
    let sw = |name: &str, lid: u16| SwitchSpec {
        name: name.into(),
        hcas: vec![lid],
    };
    let t = Topology::new(vec![sw("a", 1), sw("b", 2)], vec![(0, 1)])
        .unwrap()
        .on_hosts(vec![0, 1])
        .unwrap();
    let sockets: Vec<UdpSocket> = (0..2)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
    let fabrics: Vec<Fabric> = (0..2u16)
        .map(|h| {
            let f = Fabric::new();
            f.set_topology_on(t.clone(), h);
            f
        })
        .collect();
    let mut nets: Vec<Option<Interhost>> = sockets
        .into_iter()
        .enumerate()
        .map(|(h, s)| Some(Interhost::with_socket(&fabrics[h], h as u16, s, &addrs).unwrap()))
        .collect();
    let mut g1 = Driver::new(None, 8);
    g1.hca.attach_at(&fabrics[0], 1).unwrap();
    let mut g2 = Driver::new(None, 8);
    g2.hca.attach_at(&fabrics[1], 2).unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || fabrics[0].subnet().reaches(1, 2)
            && fabrics[1].subnet().reaches(2, 1)),
        "the hosts find each other's ports"
    );
    let (pd1, pd2) = (g1.alloc_pd(), g2.alloc_pd());
    let (mut cq1, cq2) = (g1.create_cq(8), g2.create_cq(8));
    let mut q1 = g1.create_qp(QPT_RC, pd1, cq1.cqn, cq1.cqn);
    let q2 = g2.create_qp(QPT_RC, pd2, cq2.cqn, cq2.cqn);
    // timeout 12 (16.8 ms) x 8 tries.
    g1.bring_up_rc_tuned(q1.qpn, 2, q2.qpn, ALL_ACCESS, MTU_1024, (12, 7, 7));
    g2.bring_up_rc_tuned(q2.qpn, 1, q1.qpn, ALL_ACCESS, MTU_1024, (12, 7, 7));
    let (k1, k2) = (
        g1.reg_dma_mr(pd1, ALL_ACCESS),
        g2.reg_dma_mr(pd2, ALL_ACCESS),
    );
    let (src, dst) = (g1.alloc(65536, 64), g2.alloc(65536, 64));
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 31 + 7) as u8).collect();
    g1.write(src, &data);
    let mut w = send_wr(1, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, k2);
    g1.post_send(&mut q1, w, &[sge(src, 65536, k1)]);
    let c = poll(&mut g1, &mut cq1, Duration::from_secs(10));
    assert_eq!((c.len(), c[0].status), (1, 0), "{c:?}");
    assert_eq!(g2.read(dst, 65536), data, "64 KiB over the wire, intact");
    // A stranger's datagram is dropped.
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    stranger.send_to(b"not a frame", addrs[0]).unwrap();
    let net0 = nets[0].as_ref().unwrap();
    assert!(wait_for(Duration::from_secs(2), || net0.dropped().0 == 1));
    // Host b leaves: within a bound host a takes the link down, and a WRITE to its guest
    // ends in an error completion, not a hang.
    let gone = Instant::now();
    nets[1] = None;
    assert!(
        wait_for(DEAD_AFTER * 3, || fabrics[0].subnet().link_up(0)
            == Some(false)),
        "host a found host b gone"
    );
    let found = gone.elapsed();
    assert!(
        found >= DEAD_AFTER,
        "not before its announcements were missed: {found:?}"
    );
    let mut w = send_wr(2, WR_RDMA_WRITE, WQE_SIGNALED);
    (w.remote_addr, w.rkey) = (dst, k2);
    g1.post_send(&mut q1, w, &[sge(src, 4096, k1)]);
    let c = poll(&mut g1, &mut cq1, Duration::from_secs(10));
    assert_eq!(
        (c.len(), u32::from(c[0].status)),
        (1, WC_RETRY_EXC_ERR),
        "{c:?}"
    );
    drop(nets);
}
