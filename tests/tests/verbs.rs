//! End-to-end: kernel verbs over the hcabench HCA. Two QEMU guests load the hca_ib provider
//! and the vbench consumer; the harness connects RC QPs between them and checks that data
//! moves intact in every completion mode and at every size, that UD datagrams and address
//! handles work, that ib_mad's MADs travel over the GSI QP, that fast-registered kernel
//! buffers work, that a bad rkey fails the way IB says, that the driver and the module unload
//! and reload, that its rdma_cm mode connects by IPoIB address (address and route resolved
//! through IPoIB and the fabric's SA), and that the same module runs unchanged over SoftRoCE
//! (rdma_rxe on a virtio-net link, rdma_cm by IP address), and so does the DSM module with
//! its applications. One booted pair serves all.

use std::time::Duration;

use cluster::dsm::{close_all, configure, connect_mesh, run_app, settle};
use cluster::verbs::{Mode, Testbed};
use cluster::ClusterSpec;
use e2e::{image_or_skip, BOOT_TIMEOUT, RXE_DSM_APPS};

const T: Duration = Duration::from_secs(120);
/// Every power of two from 8 B to 4 KiB.
const SIZES: [u32; 10] = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096];

fn ping_ok(tb: &mut Testbed, dev: &str, mode: Mode, size: u32, iters: u64) {
    let r = tb
        .ping(mode, size, iters, true)
        .unwrap_or_else(|e| panic!("{dev} {mode} {size}: {e}\n{}", tb.console(0)));
    assert_eq!(r.done, iters, "{dev} {mode} {size}: round trips: {r:?}");
    assert_eq!(
        r.errors, 0,
        "{dev} {mode} {size}: client saw bad data: {r:?}"
    );
    assert_eq!(
        r.served, iters,
        "{dev} {mode} {size}: server answers: {r:?}"
    );
    assert_eq!(
        r.server_errors, 0,
        "{dev} {mode} {size}: server saw bad data: {r:?}"
    );
    assert!(r.rtt_min_ns > 0 && r.rtt_avg_ns >= r.rtt_min_ns, "{r:?}");
    // hcab0 calls completion handlers from its interrupt handler on every kernel, so isr
    // mode measures the interrupt path. (rxe on newer kernels calls them under its CQ
    // lock: vbench then polls from its workqueue, and says so in `deferred`.)
    if dev.starts_with("hcab0") {
        assert_eq!(
            r.deferred, 0,
            "{dev} {mode} {size}: handler calls deferred: {r:?}"
        );
    }
}

fn bw_ok(tb: &mut Testbed, dev: &str, read: bool, size: u32, iters: u64) {
    let r = tb.bw(read, size, iters).unwrap();
    assert_eq!(r.errors, 0, "{dev}: RDMA data check failed: {r:?}");
    assert!(r.mb_per_s > 0.0, "{r:?}");
}

#[test]
fn test_kernel_verbs_over_the_hca_and_over_softroce() {
    let Some(image) = image_or_skip("verbs") else {
        return;
    };
    let spec = ClusterSpec {
        link: true,
        ..e2e::qemu_spec(&image, "verbs", 2)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();

    // The provider registered an IB device with ib_core, visible to the standard tools,
    // with the node GUID of its LID (the same on every backend and every run).
    for (i, a) in tb.agents.iter_mut().enumerate() {
        let guid = a
            .run("cat /sys/class/infiniband/hcab0/node_guid", T)
            .unwrap();
        let want = hca_model::abi::node_guid(i as u16 + 1);
        let want = format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            want >> 48,
            (want >> 32) & 0xffff,
            (want >> 16) & 0xffff,
            want & 0xffff
        );
        assert_eq!(guid.trim(), want);
        let link = a.run("rdma link show", T).unwrap();
        assert!(
            link.contains("hcab0/1") && link.contains("state ACTIVE"),
            "{link}"
        );
        let ll = a
            .run("cat /sys/class/infiniband/hcab0/ports/1/link_layer", T)
            .unwrap();
        assert_eq!(ll.trim(), "InfiniBand");
    }

    // Ping-pong moves correct data at every size, in every receive mode.
    tb.connect("hcab0").unwrap();
    for mode in Mode::ALL {
        for size in SIZES {
            ping_ok(&mut tb, "hcab0", mode, size, 20);
        }
    }
    // RDMA Write and Read move correct data (the module reads writes back, and compares
    // reads with the pattern the peer's region holds).
    for size in [8, 4096, 65536, 1 << 20] {
        bw_ok(&mut tb, "hcab0", false, size, 8);
        bw_ok(&mut tb, "hcab0", true, size, 8);
    }

    // UD: a datagram between two UD QPs through an address handle (our own LID), with the
    // 40-byte GRH room IB puts in front of it and the sender's QPN and LID in the completion.
    let ud = tb.agents[0].run("vb udloop", T).unwrap();
    assert!(
        ud.contains("byte_len=296 src_qp_ok=1 slid_ok=1 data_ok=1"),
        "{ud}"
    );

    // A MAD through ib_mad's GSI QP (QP1) to our own port arrives and is dispatched.
    let mad = tb.agents[0].run("vb mad", T).unwrap();
    assert!(
        mad.contains("send_status=0 tid_ok=1 src_qp=1 slid_ok=1"),
        "{mad}"
    );

    // A kernel buffer of scattered pages, registered the way kernel consumers do it
    // (ib_alloc_mr, ib_map_mr_sg, IB_WR_REG_MR), receives an RDMA Read intact.
    let fr = tb.agents[0].run("vb fastreg", T).unwrap();
    assert!(
        fr.contains("fastreg pages=4") && fr.contains("errors=0"),
        "{fr}"
    );

    // IB's atomics, plain and masked, between two QPs of one node: each returns the old
    // value and leaves what IBA prescribes; a key without remote-atomic access is refused.
    let at = tb.agents[0].run("vb atomic", T).unwrap();
    assert!(
        at.contains("atomic ops=5 masked=yes errors=0 refused=REM_ACCESS_ERR"),
        "{at}"
    );

    // A destroyed QP's unpolled completion on a shared CQ is not handed to a later QP the
    // device gives its number (vb cqclean creates QPs until it does: qpn_reused=1).
    let cqc = tb.agents[0].run("vb cqclean", T).unwrap();
    assert!(cqc.contains("cqclean qpn_reused=1 b=1 other=0"), "{cqc}");

    // A bad rkey: the consumer gets a remote access error and its QP goes to error.
    let bad = tb.agents[0].run("vb badrkey", T).unwrap();
    assert!(
        bad.contains("status=REM_ACCESS_ERR") && bad.contains("qp_state=ERR"),
        "{bad}"
    );
    // The responder's consumer hears of it as an asynchronous QP event.
    let events = tb.agents[1]
        .run("dmesg | grep 'vbench: QP event'", T)
        .unwrap();
    assert!(events.contains("QP access error"), "{events}");
    // Fresh QPs on both sides work again.
    tb.connect("hcab0").unwrap();
    ping_ok(&mut tb, "hcab0", Mode::Poll, 64, 20);

    // Unloading and reloading the driver and the module works, and verbs work after it.
    for a in tb.agents.iter_mut() {
        a.run(
            "k=/lib/modules/$(uname -r)/extra; rmmod vbench && rmmod hca_ib && \
             ! [ -e /sys/class/infiniband/hcab0 ] && \
             insmod $k/hca_ib.ko && insmod $k/vbench.ko && \
             cat /sys/class/infiniband/hcab0/ports/1/state",
            T,
        )
        .unwrap();
    }
    tb.connect("hcab0").unwrap();
    ping_ok(&mut tb, "hcab0", Mode::Isr, 512, 20);
    bw_ok(&mut tb, "hcab0", false, 65536, 8);

    // rdma_cm over hcab0, as storage protocols connect: the server's IPoIB address is
    // resolved over IPoIB, the route through the fabric's SA, the CM handshake on QP1.
    tb.ipoib_up().unwrap();
    tb.connect_cm(0, 1, "10.78.0.2", 7471).unwrap();
    ping_ok(&mut tb, "hcab0 (rdma_cm)", Mode::Isr, 1024, 20);
    bw_ok(&mut tb, "hcab0 (rdma_cm)", true, 65536, 8);

    // The same vbench.ko, unchanged, over SoftRoCE between the same two guests.
    tb.rxe_up().unwrap();
    for a in tb.agents.iter_mut() {
        let link = a.run("rdma link show rxe0/1", T).unwrap();
        assert!(link.contains("state ACTIVE"), "{link}");
    }
    tb.connect("rxe0").unwrap();
    ping_ok(&mut tb, "rxe0", Mode::Poll, 64, 10);
    ping_ok(&mut tb, "rxe0", Mode::Isr, 4096, 10);
    bw_ok(&mut tb, "rxe0", true, 65536, 4);
    let fr = tb.agents[0].run("vb fastreg", T).unwrap();
    assert!(fr.contains("errors=0"), "rxe0: {fr}");

    // ... and its rdma_cm mode connects over rxe0 by the NIC's IP address.
    tb.connect_cm(0, 1, "10.77.0.2", 7472).unwrap();
    ping_ok(&mut tb, "rxe0 (rdma_cm)", Mode::Poll, 64, 10);

    // The DSM module is a plain verbs consumer too: over rxe0 its protocol gives the same
    // verified results as over hcab0 (page data by RDMA Write, and by RDMA Read), for every
    // application.
    //
    // SoftRoCE here sometimes stopped delivering on a connection it still reported in RTS,
    // with no error: messages the DSM posted (ib_post_send took them) never reached the
    // peer, nor did 29 more posted on new QPs after it, either way (twice in CI in a day;
    // twice in about 55 runs of this test on a 2-core host). It was the guests' link,
    // not rxe: the NIC's pings failed both ways too, and a guest's virtio-net reported its
    // transmit queue timed out. That link was a unix stream socket between the two QEMUs
    // (`-netdev stream`), which makes each QEMU's sending wait for the other's reading; it
    // is UDP on loopback now (`cluster::qemu::NetSpec`), which never waits. A stall is still
    // told from other failures (every node's per-link message counts: `DsmError::stalled`):
    // once per run it is said, with what each side of the link shows (`rxe_report`), and
    // the application runs again on a SoftRoCE made anew (`rxe_renew`); any other failure,
    // or a second stall, fails the test.
    let mut rxe_stall_forgiven = false;
    for (cmd, config) in RXE_DSM_APPS {
        connect_mesh(&mut tb.agents, "rxe0").unwrap();
        configure(&mut tb.agents, config).unwrap();
        let res = match run_app(&mut tb.agents, cmd, Duration::from_secs(600)) {
            Ok(res) => res,
            Err(e) if e.stalled().is_empty() || rxe_stall_forgiven => panic!("rxe0 {cmd}: {e}"),
            Err(e) => {
                rxe_stall_forgiven = true;
                eprintln!(
                    "rxe0 {cmd}: SoftRoCE stopped delivering; running it again on rxe0 made \
                     anew: {e}\nthe link then:\n{}",
                    tb.rxe_report()
                );
                close_all(&mut tb.agents).unwrap();
                tb.rxe_renew()
                    .unwrap_or_else(|e| panic!("rxe0 made anew: {e}\n{}", tb.console(0)));
                connect_mesh(&mut tb.agents, "rxe0").unwrap();
                configure(&mut tb.agents, config).unwrap();
                run_app(&mut tb.agents, cmd, Duration::from_secs(600)).unwrap_or_else(|e| {
                    panic!(
                        "rxe0 {cmd}, run again: {e}\nthe link then:\n{}",
                        tb.rxe_report()
                    )
                })
            }
        };
        assert_eq!(res[0].verified, Some(true), "rxe0 {cmd}: {}", res[0].line);
        assert!(res.iter().all(|r| r.data_bytes > 0), "rxe0 {cmd}: {res:?}");
        settle(&mut tb.agents, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("rxe0 {cmd}: {e}"));
        for a in tb.agents.iter_mut() {
            let s = a.run("dsmctl stats", T).unwrap();
            assert!(s.contains("cqe_errors=0 proto_errors=0"), "rxe0 {cmd}: {s}");
        }
        close_all(&mut tb.agents).unwrap();
    }
}
