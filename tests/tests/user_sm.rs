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
use cluster::{ClusterSpec, Image};
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
    let disk = Image::build_userland(&repo_root().join("target/images"), &["opensm".into()])
        .unwrap_or_else(|e| panic!("the userland disk with opensm: {e}"));
    let image = Image {
        userland: Some(disk),
        ..image
    };
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
    let sent = run(
        &mut tb,
        1,
        "dd if=/dev/urandom of=/tmp/blob bs=1M count=8 2>/dev/null && md5sum /tmp/blob && \
         httpd -p 8080 -h /tmp",
    );
    let got = run(
        &mut tb,
        2,
        &format!("wget -q -O - http://{}:8080/blob | md5sum", addr(1)),
    );
    assert_eq!(
        got.split_whitespace().next(),
        sent.split_whitespace().next(),
        "8 MiB over TCP on ib0 arrive intact"
    );
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
