//! End-to-end: the upper-layer protocols over hcab0 on three QEMU guests, each protocol
//! its own test on one shared booted cluster (`shared.rs`), so that a failure names its
//! protocol and one runs alone: `cargo test -p e2e --test ulps nvmeof`.
//!
//! The guests run Debian's own kernel modules, unmodified. The fabric's subnet administrator
//! lets each port join the partition's broadcast group, so ib0 (ib_ipoib) gets carrier on
//! every node before any test runs. Then, a module each:
//!
//! - `ipoib`: in datagram mode every pair pings (a capture shows the SA's joins and path
//!   queries, ARP and ICMP), TCP moves 64 MiB intact (busybox httpd and wget), also under 1%
//!   packet drops and across a link that goes down for a while (the port goes DOWN, ib0 loses
//!   carrier, TCP resumes after link-up), and a port taken down leaves the group and comes
//!   back; in connected mode (ib_cm's REQ/REP/RTU over QP1, then RC QPs sharing one SRQ, MTU
//!   65520) the same 64 MiB arrive intact.
//! - `subnet`: Debian's saquery reads the SA's tables; smpquery, sminfo, ibnetdiscover,
//!   iblinkinfo, ibroute, ibtracert, perfquery, ibping and ibqueryerrors ask the ports' and
//!   the switch's agents.
//! - `ethernet`: the guests' virtio-net NICs share one Ethernet segment (hcabench's hub):
//!   every pair pings over it, and SoftRoCE (rdma_rxe) on all three nodes carries verified
//!   ping-pongs between every pair.
//! - `counters`: the ports' counters (ib_core's sysfs through hca_ib's Performance
//!   Management agent, and hardware counters through Debian's `rdma statistic`) follow the
//!   traffic; another node reads and resets them over QP1.
//! - `partitions`: an IPoIB child per partition reaches the partition's members only.
//! - `nvmeof`: NVMe over Fabrics (nvmet-rdma, nvme-rdma) moves 32 MiB through a namespace
//!   over rdma_cm on IPoIB addresses.
//! - `rds`: Reliable Datagram Sockets (rds, rds_rdma) carry every size up to RDS's largest
//!   message between nodes, and RDS's RDMA.
//! - `tipc`: TIPC (Debian's tipc, its InfiniBand media on ib0) links every pair of nodes,
//!   carries messages up to its largest between each pair, every byte checked, and its
//!   one-byte latency is printed beside TCP's on ib0.
//! - `srp`: the SCSI RDMA Protocol (LIO's ib_srpt, ib_srp) serves one RAM disk to two
//!   initiators through IB CM.
//! - `iser`: iSER (LIO's ib_isert, open-iscsi with ib_iser) serves another to two
//!   initiators over rdma_cm.
//! - `nfs`: NFS over RDMA (nfsd's svcrdma, the NFSv4 client's xprtrdma) serves one export to
//!   two clients.
//!
//! Each test sets up what it needs beyond ib0 (a file to serve, a target, a mount) and puts
//! back what it changed (faults, the IPoIB mode, partitions, servers, logins and mounts, TIPC), so
//! any one of them runs alone or in any order. The storage targets stay (NVMe-oF on node 3,
//! SRP and NFS on node 2, iSER on node 1): each is set up once per boot, and no other test
//! uses those disks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::verbs::Testbed;
use e2e::broadcast_members;
pub(crate) use e2e::port_guid;
use hca_model::capture::{Capture, CaptureFormat};
use hca_model::faults::{FaultHook, FaultPlan};

mod counters;
mod ethernet;
mod ipoib;
mod iser;
mod nfs;
mod nvmeof;
mod partitions;
mod rds;
mod shared;
mod srp;
mod storage;
mod subnet;
mod tipc;

const T: Duration = Duration::from_secs(120);
const NODES: usize = 3;
/// Each guest's RAM: the launcher's default of 256 MiB is too little for one node that is an
/// NVMe-oF target, an RDS server and an NFS client at once (see `shared::boot`).
const RAM_MIB: u64 = 384;
/// The subnet's packet lifetime: ib_cm's RC ACK timeouts are then about 134 ms (hcab0's CA
/// ACK delay), not the 2.1 s of OpenSM's default, so the protocols' runs under drops
/// wait less for each lost packet. The SA's paths must carry it (saquery checks).
const PACKET_LIFE: u8 = 13;
/// The partition beside the default (its P_Key, full members' form).
const PARTITION: u16 = 0x8001;

/// Node `i`'s address on ib0.
fn addr(i: usize) -> String {
    format!("10.78.0.{}", i + 1)
}

/// Waits (20 s at most) until the SA has `want` ports in IPoIB's broadcast group.
fn wait_members(tb: &Testbed, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while broadcast_members(tb.fabric()) != want {
        assert!(
            Instant::now() < deadline,
            "the broadcast group has {} members, not {want}",
            broadcast_members(tb.fabric())
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops node 3's HTTP server (busybox has no pkill; node 3 runs no other httpd) and waits
/// until it has gone, so that its port is free.
const STOP_HTTPD: &str = "killall httpd 2> /dev/null; \
    for i in $(seq 50); do pidof httpd > /dev/null || break; sleep 0.1; done";

/// Node 3 writes 64 MiB of fresh random bytes to /tmp/blob and serves /tmp over HTTP (busybox
/// httpd, port 8080): the file's md5. [`stop_serving`] takes both away again.
fn serve_blob(tb: &mut Testbed) -> String {
    let sum = tb.agents[2]
        .run(
            &format!(
                "{STOP_HTTPD}; dd if=/dev/urandom of=/tmp/blob bs=1M count=64 2>/dev/null && \
             md5sum /tmp/blob && httpd -p 8080 -h /tmp"
            ),
            T,
        )
        .unwrap();
    let sum = sum.split_whitespace().next().unwrap().to_string();
    assert_eq!(sum.len(), 32);
    sum
}

/// Node 3's HTTP server stopped and the files it served (and node 2's copy) removed: guest
/// RAM holds them, and the storage protocols need the room.
fn stop_serving(tb: &mut Testbed) {
    tb.agents[2]
        .run(&format!("{STOP_HTTPD}; rm -f /tmp/blob"), T)
        .unwrap();
    tb.agents[1].run("rm -f /tmp/bg /tmp/bg.md5", T).unwrap();
}

/// node `from` fetches node `to`'s file over TCP through ib0; its md5sum (computed as it
/// arrives: guest RAM holds the file system).
fn fetch(tb: &mut Testbed, from: usize, to: usize) -> String {
    let out = tb.agents[from]
        .run(
            &format!("wget -q -O - http://{}:8080/blob | md5sum", addr(to)),
            T,
        )
        .unwrap();
    out.split_whitespace().next().unwrap_or("").to_string()
}

/// Sets a fault plan dropping 1% of the packets on every link (its `seed`) on the fabric,
/// until the caller takes it off; the hook, for its counts.
fn drop_one_percent(tb: &Testbed, seed: u64) -> Arc<FaultHook> {
    let fabric = tb.fabric();
    let plan = FaultPlan::parse(&format!("seed = {seed}\n[[link]]\ndrop = 0.01\n")).unwrap();
    let hook = Arc::new(FaultHook::new(plan, None));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook.clone()));
    hook
}

/// Starts capturing everything on the fabric into `name` in the testbed's directory (ERF,
/// for tshark), until the caller takes the tap off: the file's path.
fn capture(tb: &Testbed, name: &str) -> PathBuf {
    let fabric = tb.fabric();
    let pcap = tb.dir.join(name);
    let file = std::fs::File::create(&pcap).unwrap();
    let cap = Capture::new(Box::new(file), CaptureFormat::Erf, fabric.now_ns()).unwrap();
    fabric.set_tap(Some(Arc::new(cap)));
    pcap
}

/// The last lines of node `i`'s kernel log, for a failure message.
fn kernel_log(tb: &mut Testbed, i: usize) -> String {
    let out = tb.agents[i].run("dmesg | tail -40", T);
    format!("node{}'s dmesg:\n{}", i + 1, out.unwrap_or_default())
}

/// Polls `probe` until it answers `want` (20 s at most).
fn wait_for(tb: &mut Testbed, probe: &dyn Fn(&mut Testbed) -> String, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = probe(tb);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "wanted {want:?}, still {got:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
