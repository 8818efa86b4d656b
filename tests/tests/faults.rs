//! End-to-end: the fabric's capture and faults under real guests. Three QEMU guests with the
//! hca_ib provider and the vbench consumer share one booted cluster:
//! - a capture of a verbs ping-pong and an RDMA Write, decoded by Debian's tshark: the
//!   opcodes and the QPNs the guests' own QPs have;
//! - the ping-pong under 1% packet drops: every round trip done, the data verified;
//! - an adapter's catastrophic error (`hcabench fault NODE fatal`), then a function reset
//!   underneath its driver (`hcabench fault NODE reset`): hca_ib raises
//!   IB_EVENT_DEVICE_FATAL, its consumers tear down (after the reset, on work hca_ib
//!   completes in software), it resets the function and registers hcab0 again, with no
//!   oops or warning; the NVMe-oF host's controller and the SRP initiator's disk go and,
//!   connected again, read back what they wrote before; RDS, IPoIB on the new ib0, the DSM
//!   and a new verbs connection run verified (before the reset, IPoIB runs in connected
//!   mode: its drain of the QPs on its SRQ must not time out); and the same across a PCI hot-unplug of
//!   node3's HCA and the hot-plug of a new one (`unplug`, `replug`);
//! - a killed node (its QEMU gone): its peer's work request ends in an error completion,
//!   the device server and the other nodes go on (a new connection runs clean); a DSM
//!   node waiting on it, with nothing of its own outstanding, learns that it is gone from
//!   its probes in seconds, not from its 60 s wait.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::dsm::{close_all, connect_mesh, run_app};
use cluster::verbs::{num, Mode, Testbed};
use e2e::{image_or_skip, port_guid, tshark_or_skip, BOOT_TIMEOUT};
use hca_model::abi::{CATAS_INJECTED, CATAS_RESET};
use hca_model::capture::{Capture, CaptureFormat};
use hca_model::faults::{FaultHook, FaultPlan};
use hca_model::packet::*;
use hca_model::AdapterFault;

const T: Duration = Duration::from_secs(120);

#[test]
fn test_capture_drops_and_a_killed_node_on_real_guests() {
    let Some(image) = image_or_skip("faults on real guests") else {
        return;
    };
    let spec = e2e::qemu_spec(&image, "faults", 3);
    let dir = spec.dir.clone();
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |m| eprintln!("  {m}")).unwrap();
    capture_is_decoded_by_tshark(&mut tb, &dir);
    ping_pong_survives_one_percent_drops(&mut tb);
    adapter_faults_are_recovered_and_consumers_come_back(&mut tb);
    a_killed_node_fails_its_peers_work_only(&mut tb);
}

/// The QPN in a `vb open` address line.
fn qpn(addr: &str) -> u32 {
    num(addr, "qpn").unwrap() as u32
}

fn capture_is_decoded_by_tshark(tb: &mut Testbed, dir: &Path) {
    let addrs = tb.connect_pair(0, 1, "hcab0").unwrap();
    let (q1, q2) = (qpn(&addrs[0]), qpn(&addrs[1]));
    let fabric = tb.fabric().clone();
    let pcap = dir.join("fabric.pcap");
    let file = std::fs::File::create(&pcap).unwrap();
    let cap = Arc::new(Capture::new(Box::new(file), CaptureFormat::Erf, fabric.now_ns()).unwrap());
    fabric.set_tap(Some(cap.clone()));
    let r = tb.ping(Mode::Poll, 64, 20, true).unwrap();
    assert_eq!((r.done, r.errors), (20, 0), "{r:?}");
    let bw = tb.bw(false, 8192, 4).unwrap();
    assert_eq!(bw.errors, 0, "{bw:?}");
    fabric.set_tap(None);

    let fields = [
        "infiniband.lrh.slid",
        "infiniband.lrh.dlid",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
        "infiniband.reth.dmalen",
        "infiniband.bth.psn",
    ];
    let Some(rows) = tshark_or_skip("capture decoded by tshark", &pcap, &fields) else {
        return;
    };
    assert_eq!(rows.len() as u64, cap.frames(), "every frame decoded");
    let hex = |q: u32| format!("{q:#08x}");
    // Counted by PSN: a host too busy to run the fabric for a while can make a requester
    // resend, and a resent packet carries its first copy's PSN.
    let mut sends = [HashSet::new(), HashSet::new()];
    let mut write_firsts = HashSet::new();
    for row in &rows {
        let (slid, op): (u16, u8) = (row[0].parse().unwrap(), row[2].parse().unwrap());
        // Node k has LID k; each side's packets go to the other's QP.
        let want_qp = if slid == 1 { hex(q2) } else { hex(q1) };
        assert_eq!(row[3], want_qp, "frame {row:?} (QPNs {q1} and {q2})");
        assert_eq!(row[1], if slid == 1 { "2" } else { "1" }, "{row:?}");
        match op {
            RC_SEND_ONLY_IMM => {
                sends[usize::from(slid - 1)].insert(row[5].clone());
            }
            RC_WRITE_FIRST => {
                assert_eq!((slid, row[4].as_str()), (1, "8192"), "{row:?}");
                write_firsts.insert(row[5].clone());
            }
            // vbench reads the region back to check the bytes it wrote.
            RC_READ_REQUEST => assert_eq!(slid, 1, "{row:?}"),
            RC_READ_RESP_FIRST..=RC_READ_RESP_ONLY => assert_eq!(slid, 2, "{row:?}"),
            RC_WRITE_LAST | RC_ACK => {}
            _ => panic!("unexpected opcode in {row:?}"),
        }
    }
    assert_eq!(
        sends.map(|s| s.len()),
        [20, 20],
        "20 pings and 20 pongs, each one SEND with immediate"
    );
    // The 4 timed writes, then vbench's check writes 64 KiB in 8 KiB pieces (8 more); each
    // is 2 packets at MTU 4096, the first with the RETH.
    assert_eq!(write_firsts.len(), 4 + 8, "RDMA Writes of 8 KiB");
    eprintln!("tshark decoded {} frames of {}", rows.len(), pcap.display());
}

fn ping_pong_survives_one_percent_drops(tb: &mut Testbed) {
    let fabric = tb.fabric().clone();
    let plan = FaultPlan::parse("seed = 5\n[[link]]\ndrop = 0.01\n").unwrap();
    let hook = Arc::new(FaultHook::new(plan, None));
    hook.set_origin(fabric.now_ns());
    fabric.set_hook(Some(hook.clone()));
    let resent = |tb: &Testbed| -> u64 {
        (0..2)
            .filter_map(|i| tb.hca(i))
            .map(|h| h.stats().retransmits)
            .sum()
    };
    let before = resent(tb);
    let r = tb.ping(Mode::Isr, 512, 1000, true).unwrap();
    fabric.set_hook(None);
    assert_eq!(r.done, 1000, "every round trip done: {r:?}");
    assert_eq!((r.errors, r.served, r.server_errors), (0, 1000, 0), "{r:?}");
    let dropped = hook.counts().dropped;
    let resent = resent(tb) - before;
    assert!(
        dropped > 0 && resent > 0,
        "{dropped} dropped, {resent} resent"
    );
    eprintln!(
        "1000 verified round trips of 512 B under 1% drops: {dropped} dropped, {resent} resent"
    );
}

/// What node3's kernel log says of the recovery, once it says `done` (or after 60 s).
fn recovery_log(tb: &mut Testbed, done: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = tb.agents[2]
            .run(
                "dmesg | grep -i -e 'hca_ib' -e 'BUG' -e 'Oops' -e 'Call Trace' -e 'WARNING'; true",
                T,
            )
            .unwrap();
        if log.contains(done) || Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The port node1's RDS echo server binds.
const RDS_PORT: u16 = 18634;

/// node3 asks node1's RDS echo server for 8 messages of each size, 4 in flight: whether every
/// echo came back verified, and what rds-echo said.
fn rds_ping(tb: &mut Testbed) -> (bool, String) {
    let out = tb.agents[2]
        .run(
            &format!(
                "rds-echo ping 10.78.0.3 10.78.0.1 {RDS_PORT} 8 4 1 65536 2>&1; \
                 echo exit=$?"
            ),
            T,
        )
        .unwrap();
    (
        out.contains("16 messages, 524296 bytes, every echo verified"),
        out,
    )
}

/// node3's NVMe-oF controller of node1's namespace: its block device, connected now.
fn nvme_connect(tb: &mut Testbed) -> String {
    let dev = tb.agents[2]
        .run("nvmeof connect 10.78.0.1", T)
        .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(2)));
    let dev = dev.trim().to_string();
    assert!(dev.starts_with("nvme") && dev.ends_with("n1"), "{dev}");
    dev
}

/// node3's NVMe-oF namespace once its controller is live again (60 s at most), if the
/// controller is still there; None once no controller is left.
fn nvme_live_again(tb: &mut Testbed) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = tb.agents[2]
            .run(
                "for c in /sys/class/nvme/nvme*; do [ -e $c/state ] && echo ctrl=$(cat $c/state); \
                 done; ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$'; true",
                T,
            )
            .unwrap();
        if !out.contains("ctrl=") {
            return None;
        }
        let dev = out.lines().find(|l| l.starts_with("nvme"));
        if let (true, Some(dev)) = (out.contains("ctrl=live"), dev) {
            return Some(dev.to_string());
        }
        assert!(
            Instant::now() < deadline,
            "node3's NVMe-oF controller is not live again in 60 s: {out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// node3 logs in to node2's SRP target (its port GUID `target`): the new disk's name.
fn srp_connect(tb: &mut Testbed, target: &str) -> String {
    let sd = tb.agents[2]
        .run(&format!("srp connect {target}"), T)
        .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(2)));
    let sd = sd.trim().to_string();
    assert!(sd.starts_with("sd"), "{sd}");
    sd
}

/// node3 writes `mib` MiB of random bytes at the start of its disk `dev`: their md5.
fn disk_write(tb: &mut Testbed, dev: &str, mib: u32) -> String {
    let out = tb.agents[2]
        .run(
            &format!(
                "dd if=/dev/urandom of=/tmp/disk bs=1M count={mib} 2>/dev/null && \
                 md5sum < /tmp/disk && dd if=/tmp/disk of=/dev/{dev} bs=1M oflag=direct \
                 2>/dev/null && rm /tmp/disk"
            ),
            T,
        )
        .unwrap();
    let sum = out.split_whitespace().next().unwrap_or("").to_string();
    assert_eq!(sum.len(), 32, "{out}");
    sum
}

/// The md5 of the first `mib` MiB of node3's disk `dev`, read direct.
fn disk_read(tb: &mut Testbed, dev: &str, mib: u32) -> String {
    let out = tb.agents[2]
        .run(
            &format!("dd if=/dev/{dev} bs=1M count={mib} iflag=direct 2>/dev/null | md5sum"),
            T,
        )
        .unwrap();
    out.split_whitespace().next().unwrap_or("").to_string()
}

/// Adapter faults on node3, a catastrophic error (`hcabench fault node3 fatal`) and then a
/// function reset underneath its driver (`hcabench fault node3 reset`), each with an NVMe-oF
/// host, an SRP initiator, an RDS connection, the DSM, IPoIB and a verbs connection on it:
/// hca_ib resets the function and registers again with no oops; each consumer fails cleanly
/// and comes back as its user brings it back, the data written before the fault read back
/// after it.
fn adapter_faults_are_recovered_and_consumers_come_back(tb: &mut Testbed) {
    for (i, addr) in [(0, "10.78.0.1/24"), (2, "10.78.0.3/24")] {
        tb.agents[i].run(&format!("ipoib-up {addr}"), T).unwrap();
    }
    // node1 exports a RAM disk over NVMe-oF, node2 its own over SRP to node3.
    let target = tb.agents[0].run("nvmeof target 16", T).unwrap();
    assert!(target.contains("at rdma 10.78.0.1:4420"), "{target}");
    let (guid2, guid3) = (port_guid(tb, 1), port_guid(tb, 2));
    let srp = tb.agents[1]
        .run(&format!("srp target 16 {guid3}"), T)
        .unwrap();
    assert!(srp.contains("srp: LUN 0"), "{srp}");
    // RDS between node3 and node1's echo server.
    for i in [0, 2] {
        tb.agents[i].run("rds-up", T).unwrap();
    }
    tb.agents[0]
        .run(
            &format!("rds-echo serve 10.78.0.1 {RDS_PORT} > /tmp/rds.log 2>&1 &"),
            T,
        )
        .unwrap();
    for fault in [
        Fault::Adapter(AdapterFault::Fatal),
        Fault::Adapter(AdapterFault::Reset),
        // Twice: a slot is plugged again after a replug as after boot.
        Fault::Hotplug,
        Fault::Hotplug,
    ] {
        a_fault_is_recovered(tb, fault, &guid2);
    }
    tb.agents[0].run("killall rds-echo; true", T).unwrap();
    for i in [0, 2] {
        tb.agents[i]
            .run("ip addr flush dev ib0; ip link set ib0 down", T)
            .unwrap();
    }
    // As the steps before left it: node1's verbs connection is to node2.
    tb.connect_pair(0, 1, "hcab0").unwrap();
}

/// What happens to node3's HCA.
#[derive(Clone, Copy)]
enum Fault {
    /// `hcabench fault node3 fatal|reset`.
    Adapter(AdapterFault),
    /// `hcabench fault node3 unplug`, then `replug`.
    Hotplug,
}

/// One fault of node3's HCA (LID 3), its consumers set up before it and checked after.
fn a_fault_is_recovered(tb: &mut Testbed, fault: Fault, srp_target: &str) {
    let what = match fault {
        Fault::Adapter(f) => f.name(),
        Fault::Hotplug => "unplug and replug",
    };
    let ping = "ping -c 3 -W 2 10.78.0.3 >/dev/null 2>&1; echo ping=$?";
    assert!(tb.agents[0].run(ping, T).unwrap().contains("ping=0"));
    let nvme = nvme_connect(tb);
    let nvme_written = disk_write(tb, &nvme, 8);
    let sd = srp_connect(tb, srp_target);
    let srp_written = disk_write(tb, &sd, 4);
    let (ok, out) = rds_ping(tb);
    assert!(ok, "RDS before {what}: {out}");
    // The DSM across the three nodes, and a verbs connection node1 -> node3.
    connect_mesh(&mut tb.agents, "hcab0").unwrap();
    tb.connect_pair(0, 2, "hcab0").unwrap();

    if matches!(fault, Fault::Adapter(AdapterFault::Reset)) {
        ipoib_connected_into_node3(tb);
    }

    // What node3's kernel says from here on is this fault's.
    tb.agents[2].run("dmesg -c > /dev/null", T).unwrap();
    let began = Instant::now();
    let (log, expected) = match fault {
        Fault::Adapter(f) => {
            assert_eq!(tb.fabric().adapter_fault(3, f), Some(true));
            let syndrome = match f {
                AdapterFault::Fatal => CATAS_INJECTED,
                AdapterFault::Reset => CATAS_RESET,
            };
            let done = "recovered from a catastrophic error";
            let mut expected = vec![format!("syndrome {syndrome}"), done.to_string()];
            if f == AdapterFault::Reset {
                // hca_ib completed its consumers' work itself: the device forgot it.
                expected.push("completing its work in software".to_string());
            }
            (recovery_log(tb, done), expected)
        }
        Fault::Hotplug => {
            tb.cluster.node_mut(2).unplug_hca().unwrap();
            // Its port leaves the fabric as its link closes; no hcab0 is left in the guest.
            let gone = Instant::now() + Duration::from_secs(5);
            while tb.hca(2).is_some() {
                assert!(Instant::now() < gone, "node3's HCA is still on the fabric");
                std::thread::sleep(Duration::from_millis(50));
            }
            let left = tb.agents[2].run("ls /sys/class/infiniband", T).unwrap();
            assert_eq!(left.trim(), "", "node3 still has an RDMA device");
            eprintln!("node3's HCA unplugged in {:?}", began.elapsed());
            tb.cluster.node_mut(2).replug_hca().unwrap();
            let done = "hcab0: lid 3, port ACTIVE";
            (recovery_log(tb, done), vec![done.to_string()])
        }
    };
    assert!(
        expected.iter().all(|e| log.contains(e.as_str())),
        "node3 did not recover from {what} in 60 s:\n{log}\n{}",
        tb.console(2)
    );
    if let Some(bad) = ["BUG", "Oops", "Call Trace", "WARNING"]
        .into_iter()
        .find(|bad| log.contains(bad))
    {
        // The whole log since the fault: the warning's cause is in lines the filter drops.
        let all = tb.agents[2].run("dmesg | tail -250", T).unwrap();
        panic!("node3's kernel after {what}: {bad}:\n{all}");
    }
    if matches!(fault, Fault::Adapter(AdapterFault::Reset)) {
        // IPoIB's teardown moved its connection's QP, on its SRQ, to ERR and waited for
        // its last-WQE event, which hca_ib raised itself: the device had forgotten the QP.
        let drain = tb.agents[2]
            .run("dmesg | grep -i -e 'drain' -e 'ipoib'; true", T)
            .unwrap();
        assert!(
            !drain.contains("timing out"),
            "IPoIB's drain of its SRQ's QPs timed out after {what}:\n{drain}"
        );
        tb.agents[0]
            .run("echo datagram > /sys/class/net/ib0/mode", T)
            .unwrap();
    }
    let port = tb.agents[2]
        .run("cat /sys/class/infiniband/hcab0/ports/1/state", T)
        .unwrap();
    assert_eq!(port.trim(), "4: ACTIVE", "the new hcab0's port");
    assert_eq!(tb.hca(2).unwrap().catastrophic_syndrome(), 0, "reset");
    eprintln!(
        "node3's hca_ib recovered from {what} in {:?}",
        began.elapsed()
    );

    // ib_srp removed its SCSI host with the old device: its disk is gone.
    let left = tb.agents[2]
        .run(&format!("ls /sys/block | grep -e '^{sd}$'; true"), T)
        .unwrap();
    assert_eq!(left.trim(), "", "the SRP disk is left after {what}");
    // IPoIB's ib0 went with the old device; the new one comes up as a user brings it up.
    // node1 forgets node3's old address (its QPN was the old device's).
    tb.agents[2].run("ipoib-up 10.78.0.3/24", T).unwrap();
    tb.agents[0].run("ip neigh flush dev ib0", T).unwrap();
    let out = tb.agents[0].run(ping, T).unwrap();
    assert!(out.contains("ping=0"), "IPoIB to node3 after {what}: {out}");
    // NVMe-oF: the controller's own error recovery (its queues failed first) let go of the
    // old device, so it outlives it and reconnects by itself over the new one; one that the
    // device's removal deleted instead is connected again. Either way, what was written
    // before the fault reads back.
    let nvme = match nvme_live_again(tb) {
        Some(dev) => {
            eprintln!("node3's NVMe-oF controller reconnected by itself after {what}: {dev}");
            dev
        }
        None => {
            eprintln!("node3's NVMe-oF controller went with the old device: connecting anew");
            nvme_connect(tb)
        }
    };
    assert_eq!(
        disk_read(tb, &nvme, 8),
        nvme_written,
        "NVMe-oF after {what}"
    );
    tb.agents[2].run("nvmeof disconnect", T).unwrap();
    // SRP: logged in again, what was written before the fault reads back.
    let sd = srp_connect(tb, srp_target);
    assert_eq!(disk_read(tb, &sd, 4), srp_written, "SRP after {what}");
    tb.agents[2].run("srp disconnect", T).unwrap();
    // RDS: a new connection from the new device (node1's side of the old one learns from
    // its retries, or is replaced when node3 connects again).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ok, out) = rds_ping(tb);
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "RDS after node3's {what}: {out}\nnode1: {}",
            tb.agents[0]
                .run("dmesg | grep -i rds | tail -20", T)
                .unwrap_or_default()
        );
    }
    // The DSM: node3's closed with the old device; a new mesh runs an application verified.
    close_all(&mut tb.agents).unwrap();
    connect_mesh(&mut tb.agents, "hcab0").unwrap();
    let res = run_app(&mut tb.agents, "sor 50 256 4", Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("the DSM after node3's {what}: {e}"));
    assert_eq!(res[0].verified, Some(true), "{}", res[0].line);
    close_all(&mut tb.agents).unwrap();
    // Verbs: a new connection to node3 runs verified.
    tb.connect_pair(0, 2, "hcab0").unwrap();
    let r = tb.ping_between(0, 2, Mode::Isr, 256, 50, true).unwrap();
    assert_eq!((r.done, r.errors, r.server_errors), (50, 0, 0), "{r:?}");
}

/// IPoIB in connected mode on node1 and node3, and a ping from node1: node1 connects to
/// node3, whose end of the connection is a QP that receives on IPoIB's SRQ.
fn ipoib_connected_into_node3(tb: &mut Testbed) {
    // Only node1 sends in connected mode: node3 accepts its connection on a QP of IPoIB's SRQ
    // in either mode. A connected-mode sender on node3 would hold a CM TX connection too, and
    // Linux's IPoIB (6.1 and 6.12) tears that down on a work item it does not wait for before
    // destroying its CQs, so an adapter's removal then warns "Destroy of kernel CQ shouldn't
    // fail" now and then, whatever the device (docs/guides/faults.md).
    let mode = tb.agents[0]
        .run(
            "echo connected > /sys/class/net/ib0/mode && cat /sys/class/net/ib0/mode",
            T,
        )
        .unwrap();
    assert_eq!(mode.trim(), "connected", "node1's ib0");
    let before = tb.hca(2).unwrap().next_qpn();
    let out = tb.agents[0]
        .run(
            "ping -c 3 -W 2 -s 4000 10.78.0.3 >/dev/null 2>&1; echo ping=$?",
            T,
        )
        .unwrap();
    assert!(out.contains("ping=0"), "IPoIB-CM to node3: {out}");
    assert!(
        tb.hca(2).unwrap().next_qpn() > before,
        "node3 made no QP for node1's IPoIB-CM connection"
    );
}

fn a_killed_node_fails_its_peers_work_only(tb: &mut Testbed) {
    // A DSM on node1 and node2 where only node1 runs the application: it waits at its
    // first barrier for node2, which has nothing of node1's to answer. IB tells a
    // requester, not a waiter, that its peer is gone; the DSM's probes (every 2 s of a
    // wait) are the requests that find out.
    connect_mesh(&mut tb.agents[..2], "hcab0").unwrap();
    tb.agents[0]
        .run(
            "(sor 34 1024 4 > /tmp/alone.out 2>&1; echo exit=$? >> /tmp/alone.out) &",
            T,
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(tb.cluster.kill(1), "node2 was running");
    let killed = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tb.hca(1).is_some() {
        assert!(
            Instant::now() < deadline,
            "the device server did not notice node2 die"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // node1's QP still points at node2's: its next send fails.
    let out = tb.agents[0].run("vb ping poll 64 10", T).unwrap();
    let line = out.lines().find(|l| l.starts_with("size=")).unwrap();
    assert!(num(line, "errors").unwrap() >= 1, "{out}");
    assert!(num(line, "done").unwrap() < 10, "{out}");
    // The first error is the send's own (then the posted receives flush).
    let log = tb.agents[0]
        .run("dmesg | grep 'vbench: completion error'", T)
        .unwrap();
    assert!(
        log.lines()
            .next()
            .unwrap_or("")
            .ends_with("transport retry counter exceeded"),
        "{log}"
    );
    assert!(tb.hca(0).is_some() && tb.hca(2).is_some());
    // The waiting DSM node found node2 gone and failed its application with the reason.
    let alone = loop {
        let out = tb.agents[0]
            .run("cat /tmp/alone.out; dmesg | grep 'dsm:'", T)
            .unwrap();
        if out.contains("exit=") || killed.elapsed() > Duration::from_secs(30) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        alone.contains("dsm: node 1 lost node 2") && !alone.contains("exit=0"),
        "{:?} after the kill: {alone}",
        killed.elapsed()
    );
    assert!(!alone.contains("no answer in"), "{alone}");
    eprintln!(
        "the waiting DSM node learned of the kill in {:?} (before probes: its 60 s wait)",
        killed.elapsed()
    );
    tb.agents[0].run("dsmctl close", T).unwrap();
    let failed = tb.hca(0).unwrap().stats().retry_exceeded;
    assert!(failed >= 1, "node1's HCA counts the WR that found no node2");
    // The survivors connect anew and run clean.
    let addrs = tb.connect_pair(0, 2, "hcab0").unwrap();
    assert!(addrs[1].starts_with("lid=3 "), "{}", addrs[1]);
    let r = tb.ping_between(0, 2, Mode::Isr, 256, 50, true).unwrap();
    assert_eq!((r.done, r.errors, r.server_errors), (50, 0, 0), "{r:?}");
}
