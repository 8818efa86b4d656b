//! End-to-end: a user's own subnet manager. Three QEMU guests on a fabric with `sm =
//! "guest"` (`ClusterSpec::guest_sm`): the fabric runs no SM and no SA, the ports wait in
//! INIT, and Debian's own opensm, started in node1 as a user would (`opensm -B`), sweeps
//! the subnet by directed-route SMPs, keeps the LIDs the ports have, programs the switch's
//! forwarding tables, brings every port through ARMED to ACTIVE and serves the SA. Then:
//! every port is ACTIVE with node1 as its SM; the guests' tools read what OpenSM set
//! (ibroute the switch's table, sminfo OpenSM as MASTER, saquery OpenSM's records); IPoIB,
//! which joins its broadcast group through OpenSM's SA and whose multicast the switch
//! forwards by OpenSM's multicast table, carries pings and a checked TCP transfer. A port
//! whose link goes down and comes back waits in INIT until OpenSM's next sweep finds it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::verbs::Testbed;
use cluster::{ClusterSpec, Image, SwitchSpec, TopologySpec};
use e2e::{image_or_skip, repo_root, BOOT_TIMEOUT};
use hca_model::faults::{FaultHook, FaultPlan, LiveFault};

const T: Duration = Duration::from_secs(120);
const NODES: usize = 3;
/// The switch's LID, which OpenSM keeps.
const SWITCH_LID: u16 = hca_model::sa::SM_LID;

/// Node `i`'s IPoIB address.
fn addr(i: usize) -> String {
    format!("10.79.0.{}", i + 1)
}

#[test]
fn test_opensm_in_a_guest_brings_the_subnet_up_and_ipoib_runs_over_its_sa() {
    let Some(image) = image_or_skip("a subnet manager in a guest") else {
        return;
    };
    let started = Instant::now();
    let image = with_opensm(image);
    let spec = ClusterSpec {
        guest_sm: true,
        ..e2e::qemu_spec(&image, "user_sm", NODES)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |m| eprintln!("  {m}")).unwrap();
    for i in 0..NODES {
        assert_eq!(
            port(&mut tb, i, "state"),
            "2: INIT",
            "node{}'s port waits for a subnet manager",
            i + 1
        );
    }

    run(&mut tb, 0, "userland-up");
    // As a user starts it by hand; its log is written as it exits.
    run(
        &mut tb,
        0,
        "setsid opensm -f /tmp/opensm.log </dev/null >/tmp/opensm.out 2>&1 & \
         echo $! > /tmp/opensm.pid",
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..NODES {
        while port(&mut tb, i, "state") != "4: ACTIVE" {
            assert!(
                Instant::now() < deadline,
                "node{}'s port is not ACTIVE a minute after opensm started:\n{}",
                i + 1,
                run(&mut tb, 0, "cat /tmp/opensm.out")
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        assert_eq!(
            port(&mut tb, i, "lid"),
            format!("{:#x}", i + 1),
            "node{}",
            i + 1
        );
        assert_eq!(port(&mut tb, i, "sm_lid"), "0x1", "node{}'s SM", i + 1);
    }
    eprintln!(
        "opensm: every port ACTIVE {:.1?} after boot",
        started.elapsed()
    );
    let sm = run(&mut tb, 2, "sminfo");
    assert!(
        sm.contains("sminfo: sm lid 1 ") && sm.contains("state 3 SMINFO_MASTER"),
        "node3 finds OpenSM on node1 as master: {sm}"
    );
    // OpenSM's table: each node's LID out of its port, the switch's own to port 0.
    let table = run(&mut tb, 1, &format!("ibroute {SWITCH_LID}"));
    for (lid, port) in [(1, 1), (2, 2), (3, 3), (SWITCH_LID, 0)] {
        let row = format!("{lid:#06x} {port:03} ");
        assert!(table.contains(&row), "ibroute: no {row:?}:\n{table}");
    }
    // OpenSM's SA answers: its records name the three CAs and the switch.
    let nodes = run(&mut tb, 2, "saquery -t 5000 NodeRecord");
    assert_eq!(
        nodes.matches("NodeRecord dump:").count(),
        NODES + 1,
        "OpenSM's SA lists every node:\n{nodes}"
    );

    for i in 0..NODES {
        let out = run(&mut tb, i, &format!("ipoib-up {}/24", addr(i)));
        assert!(out.contains("LOWER_UP"), "node{}: {out}", i + 1);
    }
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        let out = run(
            &mut tb,
            from,
            &format!("ping -c 3 -W 10 {} >/dev/null && echo ok || true", addr(to)),
        );
        assert_eq!(out.trim(), "ok", "node{} -> node{}", from + 1, to + 1);
    }
    // 8 MiB of random data over TCP on ib0, node2 to node3, checked end to end.
    tcp_checked(&mut tb, 1, 2, 8);
    // node3's link goes down and comes back: its port starts again from INIT, and OpenSM's
    // next sweep (every 10 s, which finds the switch's PortStateChange) brings it back.
    let hook = Arc::new(FaultHook::new(FaultPlan::default(), None));
    tb.fabric().set_hook(Some(hook.clone()));
    hook.live(3, LiveFault::LinkDown, tb.fabric().now_ns());
    wait_for_state(&mut tb, 2, "1: DOWN", Duration::from_secs(10));
    hook.live(3, LiveFault::LinkUp, tb.fabric().now_ns());
    wait_for_state(&mut tb, 2, "2: INIT", Duration::from_secs(10));
    let t = Instant::now();
    wait_for_state(&mut tb, 2, "4: ACTIVE", Duration::from_secs(40));
    eprintln!(
        "opensm: node3 ACTIVE again {:.1?} after its link came back",
        t.elapsed()
    );
    tb.fabric().set_hook(None);
    // IPoIB joins its groups again through OpenSM's SA (its join task may be backing off
    // from the joins that failed while the link was down): within 30 s.
    let again = run(
        &mut tb,
        0,
        &format!(
            "for i in $(seq 30); do ping -c 1 -W 1 {} >/dev/null && echo ok && break; done; true",
            addr(2)
        ),
    );
    assert!(
        again.contains("ok"),
        "node1 -> node3 once OpenSM brought it back"
    );

    // OpenSM's own account, written as it stops: the subnet came up without an error. The
    // ports stay ACTIVE without it, as on a real subnet.
    let log = run(
        &mut tb,
        0,
        "kill $(cat /tmp/opensm.pid); for i in $(seq 50); do \
         kill -0 $(cat /tmp/opensm.pid) 2>/dev/null || break; sleep 0.1; done; \
         cat /tmp/opensm.log",
    );
    assert!(
        log.contains("SUBNET UP") && !log.contains(" ERR "),
        "opensm's log:\n{log}"
    );
    assert!(
        run(
            &mut tb,
            2,
            &format!("ping -c 1 -W 10 {} >/dev/null && echo ok || true", addr(0))
        )
        .contains("ok"),
        "IPoIB goes on after opensm stops"
    );
    eprintln!(
        "user_sm: {:.1} s from boot to the last check",
        started.elapsed().as_secs_f64()
    );
}

/// OpenSM in node1 manages two switches: node1 on switch a, node2 and node3 on switch b,
/// one link between them. It finds both switches by directed routes, programs each one's
/// LFT and MFT and activates the link's ports at both ends; IPoIB (whose broadcast group
/// crosses the link by OpenSM's MFTs) carries pings across the link and within switch b,
/// and a checked TCP transfer across; the switches' PMAs count the link. The link cut and
/// restored: its ports start again from INIT, and OpenSM's next sweep brings them back.
#[test]
fn test_opensm_in_a_guest_manages_two_switches_and_the_link_between() {
    let Some(image) = image_or_skip("a subnet manager in a guest, two switches") else {
        return;
    };
    let started = Instant::now();
    let image = with_opensm(image);
    let switch = |name: &str, nodes: &[usize]| SwitchSpec {
        name: name.into(),
        nodes: nodes.iter().map(|&i| ClusterSpec::node_name(i)).collect(),
        ..SwitchSpec::default()
    };
    let spec = ClusterSpec {
        guest_sm: true,
        topology: TopologySpec {
            switches: vec![switch("a", &[0]), switch("b", &[1, 2])],
            links: vec![["a".into(), "b".into()]],
        },
        ..e2e::qemu_spec(&image, "user_sm2", NODES)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |m| eprintln!("  {m}")).unwrap();
    run(&mut tb, 0, "userland-up");
    run(
        &mut tb,
        0,
        "setsid opensm -f /tmp/opensm.log </dev/null >/tmp/opensm.out 2>&1 & \
         echo $! > /tmp/opensm.pid",
    );
    for i in 0..NODES {
        wait_for_state(&mut tb, i, "4: ACTIVE", Duration::from_secs(60));
        assert_eq!(port(&mut tb, i, "lid"), format!("{:#x}", i + 1));
        assert_eq!(port(&mut tb, i, "sm_lid"), "0x1", "node{}'s SM", i + 1);
    }
    eprintln!(
        "opensm, two switches: every port ACTIVE {:.1?} after boot",
        started.elapsed()
    );
    let found = run(&mut tb, 2, "ibnetdiscover");
    assert_eq!(
        found.matches("\nSwitch").count(),
        2,
        "two switches:\n{found}"
    );
    // OpenSM's table in switch b: node1 over the link (port 3), nodes 2 and 3 on ports 1
    // and 2, b's own LID to port 0.
    let table = run(&mut tb, 1, &format!("ibroute {}", SWITCH_LID - 1));
    for (lid, port) in [(1, 3), (2, 1), (3, 2), (SWITCH_LID - 1, 0)] {
        let row = format!("{lid:#06x} {port:03} ");
        assert!(table.contains(&row), "ibroute: no {row:?}:\n{table}");
    }
    for i in 0..NODES {
        let out = run(&mut tb, i, &format!("ipoib-up {}/24", addr(i)));
        assert!(out.contains("LOWER_UP"), "node{}: {out}", i + 1);
    }
    for (from, to) in [(0, 2), (2, 0), (1, 2)] {
        assert!(
            pings_within(&mut tb, from, to, Duration::from_secs(20)),
            "node{} -> node{}",
            from + 1,
            to + 1
        );
    }
    tcp_checked(&mut tb, 0, 2, 4);
    // Switch b's PMA counts its end of the link (port 3): at least the 4 MiB's packets in.
    let pma = run(&mut tb, 2, &format!("perfquery {} 3", SWITCH_LID - 1));
    let rcv: u64 = (pma.lines())
        .find_map(|l| l.strip_prefix("PortRcvPkts:"))
        .and_then(|v| v.trim_start_matches('.').trim().parse().ok())
        .unwrap_or_else(|| panic!("perfquery:\n{pma}"));
    assert!(
        rcv >= 2048,
        "PortRcvPkts {rcv} at b's end of the link:\n{pma}"
    );

    // The link cut: nothing crosses; restored, its ports wait in INIT until OpenSM's next
    // sweep (PortStateChange) activates them again.
    tb.fabric().set_switch_link(0, false).unwrap();
    assert!(
        !pings_within(&mut tb, 0, 2, Duration::from_secs(3)),
        "across a cut link"
    );
    tb.fabric().set_switch_link(0, true).unwrap();
    let t = Instant::now();
    assert!(
        pings_within(&mut tb, 0, 2, Duration::from_secs(60)),
        "node1 -> node3 once OpenSM activated the link again"
    );
    eprintln!(
        "opensm: the link carried IPoIB again {:.1?} after it came back",
        t.elapsed()
    );
    let log = run(
        &mut tb,
        0,
        "kill $(cat /tmp/opensm.pid); for i in $(seq 50); do \
         kill -0 $(cat /tmp/opensm.pid) 2>/dev/null || break; sleep 0.1; done; \
         cat /tmp/opensm.log",
    );
    // Switch a told it of the cut, and both switches of the link's return (trap 128).
    assert!(
        log.matches("num:128 (Link state change) Producer:2")
            .count()
            >= 3,
        "opensm heard no trap 128 from the switches:\n{log}"
    );
    // Its only errors are SMPs lost in the cut link (timeouts) and the trap of switch b
    // coming back before OpenSM found it again (which it dropped with the cut: "Lid is out
    // of range", "Failed to find source physical port for trap"), and the subnet came up
    // again after the last of them.
    let lines: Vec<&str> = log.lines().collect();
    let errors: Vec<usize> = (0..lines.len())
        .filter(|&k| lines[k].contains(" ERR "))
        .collect();
    for &k in &errors {
        let l = lines[k];
        assert!(
            ["IB_TIMEOUT", "Set method failed", "ERR 7504", "ERR 3809"]
                .iter()
                .any(|e| l.contains(e)),
            "opensm's error is not the cut link's: {l}\n{log}"
        );
    }
    let up = lines.iter().rposition(|l| l.contains("SUBNET UP"));
    assert!(
        up.is_some_and(|u| errors.last().is_none_or(|&e| u > e)),
        "opensm's log ends with the subnet up:\n{log}"
    );
    eprintln!(
        "user_sm, two switches: {:.1} s from boot to the last check",
        started.elapsed().as_secs_f64()
    );
}

/// `image` with Debian's opensm on the guests' userland disk.
fn with_opensm(image: Image) -> Image {
    let disk = Image::build_userland(&repo_root().join("target/images"), &["opensm".into()])
        .unwrap_or_else(|e| panic!("the userland disk with opensm: {e}"));
    Image {
        userland: Some(disk),
        ..image
    }
}

/// `mib` MiB of random data over TCP on ib0, served by node `from` and fetched by node
/// `to`, checked end to end (md5).
fn tcp_checked(tb: &mut Testbed, from: usize, to: usize, mib: u32) {
    let sent = run(
        tb,
        from,
        &format!(
            "dd if=/dev/urandom of=/tmp/blob bs=1M count={mib} 2>/dev/null && \
             md5sum /tmp/blob && httpd -p 8080 -h /tmp"
        ),
    );
    let got = run(
        tb,
        to,
        &format!("wget -q -O - http://{}:8080/blob | md5sum", addr(from)),
    );
    assert_eq!(
        got.split_whitespace().next(),
        sent.split_whitespace().next(),
        "{mib} MiB over TCP on ib0, node{} to node{}, arrive intact",
        from + 1,
        to + 1
    );
}

/// Whether node `from` pings node `to` over IPoIB within `limit` (a try a second).
fn pings_within(tb: &mut Testbed, from: usize, to: usize, limit: Duration) -> bool {
    let tries = limit.as_secs().max(1);
    let out = run(
        tb,
        from,
        &format!(
            "for i in $(seq {tries}); do ping -c 1 -W 1 {} >/dev/null && echo ok && break; \
             done; true",
            addr(to)
        ),
    );
    out.contains("ok")
}

/// Waits up to `limit` for node `i`'s port to be in `state` (as sysfs says it).
fn wait_for_state(tb: &mut Testbed, i: usize, state: &str, limit: Duration) {
    let t = Instant::now();
    loop {
        let now = port(tb, i, "state");
        if now == state {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "node{}'s port is {now:?}, not {state:?}, after {limit:?}",
            i + 1
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Port 1's sysfs attribute `what` on node `i`.
fn port(tb: &mut Testbed, i: usize, what: &str) -> String {
    run(
        tb,
        i,
        &format!("cat /sys/class/infiniband/hcab0/ports/1/{what}"),
    )
    .trim()
    .to_string()
}

/// Runs `cmd` on node `i` (from 0); its output, which must come with status 0.
fn run(tb: &mut Testbed, i: usize, cmd: &str) -> String {
    match tb.agents[i].run(cmd, T) {
        Ok(out) => out,
        Err(e) => panic!("node{}: {cmd}: {e}\n{}", i + 1, tb.console(i)),
    }
}
