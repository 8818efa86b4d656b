//! What crossing hosts costs a packet: an RC ping-pong of small SENDs between two HCAs on
//! one fabric (a local link), side by side in one run with the same ping-pong between two
//! fabrics joined by an inter-host link whose UDP datagrams cross a veth pair between two
//! network namespaces, and a plain UDP echo over that veth. The target (issue 48): a packet
//! between hosts adds no more than one UDP round trip of latency over a local link (a
//! ping-pong crosses twice: half its added time is one crossing's).
//!
//! `cargo bench -p cluster --bench interhost [-- --rounds N]` (root: it makes the
//! namespaces, and removes them).

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::interhost::Interhost;
use hca_model::abi::*;
use hca_model::subnet::{SwitchSpec, Topology};
use hca_model::Fabric;
use hca_test_driver::*;

const MTU_1024: u8 = 3;

struct Netns(Vec<String>);

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Two namespaces joined by a veth: 10.98.0.1 and 10.98.0.2.
fn namespaces() -> Result<Netns, String> {
    let tag = format!("hib{}", std::process::id() % 100_000);
    let (a, b) = (format!("{tag}a"), format!("{tag}b"));
    let ns = Netns(vec![a.clone(), b.clone()]);
    let (va, vb) = (format!("{tag}va"), format!("{tag}vb"));
    ip(&["netns", "add", &a])?;
    ip(&["netns", "add", &b])?;
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    ip(&["link", "set", &va, "netns", &a])?;
    ip(&["link", "set", &vb, "netns", &b])?;
    ip(&["-n", &a, "addr", "add", "10.98.0.1/24", "dev", &va])?;
    ip(&["-n", &b, "addr", "add", "10.98.0.2/24", "dev", &vb])?;
    ip(&["-n", &a, "link", "set", &va, "up"])?;
    ip(&["-n", &b, "link", "set", &vb, "up"])?;
    Ok(ns)
}

/// A UDP socket bound to `addr` inside network namespace `ns` (made on a thread that
/// enters it; the socket stays in it).
fn socket_in(ns: &str, addr: &str) -> UdpSocket {
    let (ns, addr) = (ns.to_string(), addr.to_string());
    std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns");
        // SAFETY: setns on this thread alone, with a namespace file it opened.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {ns}");
        UdpSocket::bind(&addr).expect("bind")
    })
    .join()
    .unwrap()
}

/// Two connected RC QPs on guests `a` and `b`, receives posted.
struct PingPong {
    a: Driver,
    b: Driver,
    qa: QpH,
    qb: QpH,
    cqa: CqH,
    cqb: CqH,
    bufs: (u64, u64),
}

impl PingPong {
    fn new(mut a: Driver, mut b: Driver) -> Self {
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let (cqa, cqb) = (a.create_cq(8), b.create_cq(8));
        let qa = a.create_qp(QPT_RC, pa, cqa.cqn, cqa.cqn);
        let qb = b.create_qp(QPT_RC, pb, cqb.cqn, cqb.cqn);
        let (la, lb) = (a.lid(), b.lid());
        a.bring_up_rc_tuned(qa.qpn, lb, qb.qpn, ALL_ACCESS, MTU_1024, (14, 7, 7));
        b.bring_up_rc_tuned(qb.qpn, la, qa.qpn, ALL_ACCESS, MTU_1024, (14, 7, 7));
        let bufs = (a.alloc(64, 64), b.alloc(64, 64));
        let mut p = PingPong {
            a,
            b,
            qa,
            qb,
            cqa,
            cqb,
            bufs,
        };
        for _ in 0..2 {
            p.a.post_recv(&mut p.qa, 0, &[sge(bufs.0, 64, LOCAL_DMA_LKEY)]);
            p.b.post_recv(&mut p.qb, 0, &[sge(bufs.1, 64, LOCAL_DMA_LKEY)]);
        }
        p
    }

    /// One round trip of an 8-byte SEND each way, its time.
    fn round(&mut self) -> Duration {
        let t = Instant::now();
        let wr = send_wr(1, WR_SEND, WQE_SIGNALED);
        self.a
            .post_send(&mut self.qa, wr, &[sge(self.bufs.0, 8, LOCAL_DMA_LKEY)]);
        wait_recv(&mut self.b, &mut self.cqb);
        self.b
            .post_recv(&mut self.qb, 0, &[sge(self.bufs.1, 64, LOCAL_DMA_LKEY)]);
        let wr = send_wr(2, WR_SEND, WQE_SIGNALED);
        self.b
            .post_send(&mut self.qb, wr, &[sge(self.bufs.1, 8, LOCAL_DMA_LKEY)]);
        wait_recv(&mut self.a, &mut self.cqa);
        let took = t.elapsed();
        self.a
            .post_recv(&mut self.qa, 0, &[sge(self.bufs.0, 64, LOCAL_DMA_LKEY)]);
        took
    }
}

/// Spins until `cq` gives a receive (send completions on the way are dropped).
fn wait_recv(d: &mut Driver, cq: &mut CqH) {
    let start = Instant::now();
    loop {
        while let Some(c) = d.poll_cq(cq) {
            assert_eq!(c.status, 0, "{c:?}");
            if u32::from(c.opcode) == CQE_OP_RECV {
                return;
            }
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no receive");
        std::hint::spin_loop();
    }
}

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(v[v.len() / 2]), us(v[v.len() * 99 / 100]))
}

fn main() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let ns = match namespaces() {
        Ok(ns) => ns,
        Err(why) => {
            eprintln!("interhost bench not run: network namespaces: {why} (run it as root)");
            return;
        }
    };
    // A local link: two guests on one fabric's switch.
    let local = Fabric::new();
    let mut near = PingPong::new(Driver::new(Some(&local), 8), Driver::new(Some(&local), 8));
    // Across hosts: a switch on each, joined over the veth.
    let sw = |name: &str, lid: u16| SwitchSpec {
        name: name.into(),
        hcas: vec![lid],
    };
    let t = Topology::new(vec![sw("a", 1), sw("b", 2)], vec![(0, 1)])
        .unwrap()
        .on_hosts(vec![0, 1])
        .unwrap();
    let addrs: Vec<SocketAddr> = vec![
        "10.98.0.1:7800".parse().unwrap(),
        "10.98.0.2:7800".parse().unwrap(),
    ];
    let fabrics: Vec<Fabric> = (0..2u16)
        .map(|h| {
            let f = Fabric::new();
            f.set_topology_on(t.clone(), h);
            f
        })
        .collect();
    let _nets: Vec<Interhost> = (0..2)
        .map(|h| {
            let s = socket_in(&ns.0[h], &addrs[h].to_string());
            Interhost::with_socket(&fabrics[h], h as u16, s, &addrs).unwrap()
        })
        .collect();
    let a = Driver::new(None, 8);
    a.hca.attach_at(&fabrics[0], 1).unwrap();
    let b = Driver::new(None, 8);
    b.hca.attach_at(&fabrics[1], 2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(fabrics[0].subnet().reaches(1, 2) && fabrics[1].subnet().reaches(2, 1)) {
        assert!(
            Instant::now() < deadline,
            "the hosts did not find each other"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut far = PingPong::new(a, b);
    // A UDP echo over the same veth: the round trip a crossing is measured against.
    let echo_a = socket_in(&ns.0[0], "10.98.0.1:7801");
    let echo_b = socket_in(&ns.0[1], "10.98.0.2:7801");
    echo_b
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    echo_a
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok((n, from)) = echo_b.recv_from(&mut buf) {
            if n == 1 && buf[0] == 0xff {
                return;
            }
            let _ = echo_b.send_to(&buf[..n], from);
        }
    });
    let udp_round = || {
        let t = Instant::now();
        echo_a.send_to(&[0u8; 100], "10.98.0.2:7801").unwrap();
        let mut buf = [0u8; 256];
        echo_a.recv_from(&mut buf).unwrap();
        t.elapsed()
    };
    // Warm up, then the three interleaved: one run, the same host load for each.
    for _ in 0..1000 {
        near.round();
        far.round();
        udp_round();
    }
    let (mut l, mut r, mut u) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        l.push(near.round());
        r.push(far.round());
        u.push(udp_round());
    }
    echo_a.send_to(&[0xff], "10.98.0.2:7801").unwrap();
    let _ = echo.join();
    let (l50, l99) = stats(l);
    let (r50, r99) = stats(r);
    let (u50, u99) = stats(u);
    println!(
        "RC round trip of 8-byte SENDs, {rounds} rounds interleaved, one thread, real clocks \
         (median / 99th percentile, us):"
    );
    println!("  local link (one fabric)                 {l50:8.1} / {l99:8.1}");
    println!("  across hosts (UDP over a veth)          {r50:8.1} / {r99:8.1}");
    println!("  UDP echo over the same veth (100 B)     {u50:8.1} / {u99:8.1}");
    // A round trip crosses twice (each SEND one way; each ACK travels too, off the
    // critical path): the cost of one crossing packet is half the difference.
    let added = (r50 - l50) / 2.0;
    println!(
        "target: a packet between hosts adds at most one UDP round trip over a local link: \
         {added:.1} us a crossing against {u50:.1} us: {} (a bare datagram one way is about \
         {:.1} us: the rest is the frame's encoding, the receiving host's thread and its \
         delivery)",
        if added <= u50 { "met" } else { "NOT met" },
        u50 / 2.0
    );
    let s = fabrics[0].remote_stats();
    println!(
        "inter-host frames: {} out, {} in, {} refused",
        s.frames_out, s.frames_in, s.refused
    );
}
