//! IPoIB (Debian's ib_ipoib) in datagram and connected mode: joins, pings, TCP, drops, a
//! port taken down and a link that goes down.

use std::sync::Arc;
use std::time::Duration;

use cluster::verbs::Testbed;
use e2e::tshark_or_skip;
use hca_model::faults::{FaultHook, FaultPlan, LiveFault};

use crate::{
    addr, capture, drop_one_percent, fetch, port_guid, serve_blob, shared, stop_serving, wait_for,
    wait_members, NODES, T,
};

/// Every node's ib0 goes down and comes up again, in datagram mode, under a capture: each
/// port rejoins the broadcast group, and every pair pings (ARP over the broadcast group,
/// then unicast over SA path records). Wireshark decodes the SA's joins and path queries and
/// the IPoIB datagrams carrying ARP and ICMP.
#[test]
fn test_datagram_mode_joins_the_broadcast_group_and_every_pair_pings() {
    let Some(mut c) = shared::cluster("ipoib datagram pings") else {
        return;
    };
    let tb = &mut c.tb;
    for i in 0..NODES {
        let mode = tb.agents[i].run("cat /sys/class/net/ib0/mode", T).unwrap();
        assert_eq!(mode.trim(), "datagram");
        // Down, ib0 leaves the group and forgets its paths and neighbours.
        tb.agents[i].run("ip link set ib0 down", T).unwrap();
    }
    wait_members(tb, 0);
    // Everything IPoIB puts on the fabric from the joins until the pings are done.
    let pcap = capture(tb, "ipoib.pcap");
    for i in 0..NODES {
        let out = tb.agents[i]
            .run(&ib0_up(), T)
            .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(i)));
        assert_eq!(out.trim(), "1", "node{}: carrier back", i + 1);
    }
    wait_members(tb, NODES);
    for i in 0..NODES {
        for j in (0..NODES).filter(|&j| j != i) {
            let out = tb.agents[i]
                .run(&format!("ping -c 2 -W 5 {}", addr(j)), T)
                .unwrap();
            assert!(out.contains("2 packets received"), "{i}->{j}: {out}");
        }
    }
    tb.fabric().set_tap(None);
    the_capture_shows_sa_queries_joins_and_ipoib_datagrams(&pcap);
}

/// `ip link set ib0 up`, then up to 10 s for carrier: the carrier it has then.
fn ib0_up() -> String {
    "ip link set ib0 up; for i in $(seq 100); do \
     [ $(cat /sys/class/net/ib0/carrier) = 1 ] && break; sleep 0.1; done; \
     cat /sys/class/net/ib0/carrier"
        .into()
}

/// 64 MiB over TCP in datagram mode arrive intact: node 3 serves, nodes 1 and 2 fetch;
/// under 1% drops on every link TCP resends and the bytes still arrive intact.
#[test]
fn test_datagram_mode_carries_64_mib_over_tcp_also_under_drops() {
    let Some(mut c) = shared::cluster("ipoib datagram TCP") else {
        return;
    };
    let tb = &mut c.tb;
    let sum = serve_blob(tb);
    for from in [0, 1] {
        assert_eq!(fetch(tb, from, 2), sum, "node{} got other bytes", from + 1);
    }
    let hook = drop_one_percent(tb, 9);
    let got = fetch(tb, 0, 2);
    tb.fabric().set_hook(None);
    assert_eq!(got, sum, "under 1% drops");
    assert!(hook.counts().dropped > 0, "the plan dropped packets");
    stop_serving(tb);
}

/// A port taken down leaves the group (IPoIB's SA Delete); up again, it rejoins and talks.
#[test]
fn test_a_port_taken_down_leaves_the_broadcast_group_and_rejoins() {
    let Some(mut c) = shared::cluster("ipoib port down") else {
        return;
    };
    let tb = &mut c.tb;
    tb.agents[1].run("ip link set ib0 down", T).unwrap();
    wait_members(tb, NODES - 1);
    let out = tb.agents[1].run(&ib0_up(), T).unwrap();
    assert_eq!(out.trim(), "1", "carrier back");
    wait_members(tb, NODES);
    let out = tb.agents[1]
        .run(&format!("ping -c 2 -W 5 {}", addr(0)), T)
        .unwrap();
    assert!(out.contains("2 packets received"), "{out}");
}

/// The link goes down (`hcabench fault node2 link-down`) while node 2 fetches 64 MiB from
/// node 3: the port goes DOWN, IPoIB drops carrier; link-up brings both back, and TCP
/// resumes and delivers every byte. Debian's `ibqueryerrors` then finds the link that went
/// down.
#[test]
fn test_tcp_resumes_across_a_link_that_goes_down() {
    let Some(mut c) = shared::cluster("ipoib link down") else {
        return;
    };
    let tb = &mut c.tb;
    let fabric = tb.fabric().clone();
    let sum = serve_blob(tb);
    tb.agents[1]
        .run(
            &format!(
                "rm -f /tmp/bg.md5; (wget -q -O /tmp/bg http://{}:8080/blob; \
                 md5sum /tmp/bg > /tmp/bg.md5) > /dev/null 2>&1 &",
                addr(2)
            ),
            T,
        )
        .unwrap();
    // Under way (past its first MiB) before the link goes.
    tb.agents[1]
        .run(
            "for i in $(seq 200); do [ $(stat -c %s /tmp/bg 2>/dev/null || echo 0) -gt 1048576 ] \
             && break; sleep 0.1; done; stat -c %s /tmp/bg",
            T,
        )
        .unwrap();
    let hook = Arc::new(FaultHook::new(FaultPlan::default(), None));
    fabric.set_hook(Some(hook.clone()));
    hook.live(2, LiveFault::LinkDown, fabric.now_ns());
    let state = |tb: &mut Testbed| {
        tb.agents[1]
            .run(
                "cat /sys/class/infiniband/hcab0/ports/1/state /sys/class/net/ib0/carrier",
                T,
            )
            .unwrap()
    };
    wait_for(tb, &state, "1: DOWN\n0\n");
    let mid = tb.agents[1]
        .run("ls /tmp/bg.md5 2>/dev/null; stat -c %s /tmp/bg", T)
        .unwrap();
    // Down for a while: the sender's retransmissions meet the dead link.
    std::thread::sleep(Duration::from_secs(2));
    hook.live(2, LiveFault::LinkUp, fabric.now_ns());
    wait_for(tb, &state, "4: ACTIVE\n1\n");
    fabric.set_hook(None);
    let resumed = tb.agents[1]
        .run(
            "for i in $(seq 600); do [ -s /tmp/bg.md5 ] && break; sleep 0.1; done; \
             cat /tmp/bg.md5",
            T,
        )
        .unwrap();
    if !resumed.starts_with(&sum) {
        let why = tb.agents[1]
            .run("ls -la /tmp/bg*; dmesg | tail -20", T)
            .unwrap_or_default();
        panic!("across the link-down: `{resumed}`\n{why}");
    }
    let c = hook.counts();
    assert!(
        c.link_down > 0,
        "the link-down held packets back: {c:?}\n{mid}"
    );
    let out = tb.agents[1]
        .run(&format!("ping -c 2 -W 5 {}", addr(2)), T)
        .unwrap();
    assert!(out.contains("2 packets received"), "{out}");
    stop_serving(tb);
    ibqueryerrors_finds_the_link_that_went_down(tb, 2);
}

/// After LID `lid`'s link went down once: Debian's `ibqueryerrors` reports it at both of its
/// ends, the node's port and the switch's port `lid` (as on a real fabric), and `-k` clears
/// every port's counters through the PMAs, after which it finds no error.
fn ibqueryerrors_finds_the_link_that_went_down(tb: &mut Testbed, lid: usize) {
    let guid = format!("0x{}", port_guid(tb, lid - 1).replace(':', ""));
    let guid = format!("0x{:x}", u64::from_str_radix(&guid[2..], 16).unwrap());
    let out = tb.agents[0].run("ibqueryerrors; echo rc=$?", T).unwrap();
    for want in [
        format!("GUID {guid} port 1: [LinkDownedCounter == 1]"),
        format!("GUID 0x2c9030000bfff port {lid}: [LinkDownedCounter == 1]"),
        "rc=1".into(),
    ] {
        assert!(out.contains(&want), "{want}: {out}");
    }
    let out = tb.agents[0]
        .run("ibqueryerrors -k > /dev/null; ibqueryerrors; echo rc=$?", T)
        .unwrap();
    assert!(
        out.contains(&format!("{} nodes checked, 0 bad nodes found", NODES + 1))
            && out.contains("rc=0"),
        "{out}"
    );
}

/// Connected mode: an MTU over the datagram limit is taken only there, and TCP rides RC
/// connections that ib_cm set up through the SA's path records (a capture shows the CM
/// handshake); the 64 MiB arrive intact. Every node goes back to datagram mode after.
#[test]
fn test_connected_mode_carries_tcp_over_rc_connections() {
    let Some(mut c) = shared::cluster("ipoib connected mode") else {
        return;
    };
    let tb = &mut c.tb;
    let sum = serve_blob(tb);
    for a in tb.agents.iter_mut() {
        let out = a
            .run(
                "echo connected > /sys/class/net/ib0/mode && ip link set ib0 mtu 65520 && \
                 cat /sys/class/net/ib0/mode /sys/class/net/ib0/mtu",
                T,
            )
            .unwrap();
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["connected", "65520"]
        );
    }
    let pcap = capture(tb, "cm.pcap");
    let out = tb.agents[0]
        .run(&format!("ping -c 2 -W 5 -s 30000 {}", addr(2)), T)
        .unwrap();
    tb.fabric().set_tap(None);
    assert!(out.contains("2 packets received"), "{out}");
    the_capture_shows_a_cm_handshake(&pcap);
    assert_eq!(fetch(tb, 0, 2), sum, "connected mode");
    let log = tb.agents[0].run("dmesg", T).unwrap();
    assert!(!log.contains("failed to send cm req"), "{log}");
    connected_mode_shares_one_srq_and_reaps_its_qps(tb);
    stop_serving(tb);
    // Datagram mode again (its MTU with it), as the other tests expect.
    for a in tb.agents.iter_mut() {
        let out = a
            .run(
                "echo datagram > /sys/class/net/ib0/mode && cat /sys/class/net/ib0/mode",
                T,
            )
            .unwrap();
        assert_eq!(out.trim(), "datagram");
    }
}

/// IPoIB's connected mode takes every passive connection's receives from one SRQ (what
/// keeps its memory per peer small), and when a peer drops its connections the passive
/// QPs leave through IB's Last WQE Reached event and a drain: none is left behind and no
/// drain times out. The peer then reconnects.
fn connected_mode_shares_one_srq_and_reaps_its_qps(tb: &mut Testbed) {
    let srqs = tb.agents[2].run("rdma res show srq", T).unwrap();
    assert!(
        srqs.lines()
            .any(|l| l.contains("comm [ib_ipoib]") && l.contains("lqpn")),
        "ib_ipoib's SRQ serves its connections: {srqs}"
    );
    let rc_qps = |tb: &mut Testbed| {
        let out = tb.agents[2].run("rdma res show qp", T).unwrap();
        out.lines().filter(|l| l.contains("type RC")).count()
    };
    let before = rc_qps(tb);
    tb.agents[0]
        .run("echo datagram > /sys/class/net/ib0/mode", T)
        .unwrap();
    let mut after = before;
    for _ in 0..100 {
        after = rc_qps(tb);
        if after < before {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(after < before, "node3 still holds {after} RC QPs");
    let log = tb.agents[2].run("dmesg", T).unwrap();
    assert!(!log.contains("drain timing out"), "{log}");
    tb.agents[0]
        .run(
            "echo connected > /sys/class/net/ib0/mode && ip link set ib0 mtu 65520",
            T,
        )
        .unwrap();
    let out = tb.agents[0]
        .run(&format!("ping -c 2 -W 5 -s 30000 {}", addr(2)), T)
        .unwrap();
    assert!(out.contains("2 packets received"), "{out}");
}

/// Wireshark decodes what IPoIB's start-up and pings put on the wire: SA PathRecord and
/// MCMemberRecord exchanges with the fabric's SA, and IPoIB datagrams carrying ARP and ICMP.
fn the_capture_shows_sa_queries_joins_and_ipoib_datagrams(pcap: &std::path::Path) {
    let fields = [
        "infiniband.mad.method",
        "infiniband.mad.attributeid",
        "infiniband.mad.status",
        "infiniband.mcmemberrecord.mgid",
        "infiniband.pathrecord.dgid",
        "arp.opcode",
        "icmp.type",
    ];
    let Some(rows) = tshark_or_skip("ipoib capture decoded by tshark", pcap, &fields) else {
        return;
    };
    let has = |f: &dyn Fn(&[String]) -> bool| rows.iter().any(|r| r.len() == fields.len() && f(r));
    // MCMemberRecord (0x0038) Set (0x02), answered OK by a GetResp (0x81).
    assert!(
        has(&|r| r[0] == "0x02" && r[1] == "0x0038"),
        "no join: {rows:?}"
    );
    assert!(
        has(&|r| r[0] == "0x81"
            && r[1] == "0x0038"
            && r[2] == "0x0000"
            && r[3].starts_with("ff12:401b:ffff")),
        "no join answer for the broadcast group: {rows:?}"
    );
    // PathRecord (0x0035) Get and its answer.
    assert!(
        has(&|r| r[0] == "0x01" && r[1] == "0x0035"),
        "no path query"
    );
    assert!(
        has(&|r| r[0] == "0x81" && r[1] == "0x0035" && r[4].starts_with("fe80::")),
        "no path answer: {rows:?}"
    );
    assert!(
        has(&|r| r[5] == "1") && has(&|r| r[5] == "2"),
        "no ARP request and reply"
    );
    assert!(
        has(&|r| r[6] == "8") && has(&|r| r[6] == "0"),
        "no ICMP echo and reply"
    );
}

/// IPoIB-CM's connection: a CM REQ (attribute 0x0010), REP (0x0013) and RTU (0x0014) over
/// QP1, the REQ for an RC QP.
fn the_capture_shows_a_cm_handshake(pcap: &std::path::Path) {
    let fields = [
        "infiniband.mad.mgmtclass",
        "infiniband.mad.attributeid",
        "infiniband.cm.req.transpsvctype",
    ];
    let Some(rows) = tshark_or_skip("ipoib-cm capture decoded by tshark", pcap, &fields) else {
        return;
    };
    let cm: Vec<&str> = rows
        .iter()
        .filter(|r| r.len() == fields.len() && r[0] == "0x07")
        .map(|r| r[1].as_str())
        .collect();
    for (attr, name) in [("0x0010", "REQ"), ("0x0013", "REP"), ("0x0014", "RTU")] {
        assert!(cm.contains(&attr), "no CM {name} in {cm:?}");
    }
    assert!(
        rows.iter()
            .any(|r| r.len() == fields.len() && r[1] == "0x0010" && r[2] == "0x00"),
        "the REQ is for RC (transport service type 0): {rows:?}"
    );
}
