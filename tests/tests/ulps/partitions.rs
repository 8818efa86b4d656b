//! Partitions: an IPoIB child interface per partition, in datagram and connected mode,
//! reaching the partition's members only; the SM adding a node on the running cluster.

use std::time::{Duration, Instant};

use cluster::verbs::Testbed;

use crate::{shared, NODES, PARTITION, T};

/// See [`a_partitions_ipoib_child_reaches_its_members_only`]. The partitions are the
/// cluster's again after (node 3 out of partition 1).
#[test]
fn test_a_partitions_ipoib_child_reaches_its_members_only() {
    let Some(mut c) = shared::cluster("partitions") else {
        return;
    };
    let tb = &mut c.tb;
    a_partitions_ipoib_child_reaches_its_members_only(tb);
    tb.fabric()
        .set_partitions(&[hca_model::partition::Partition {
            pkey: PARTITION,
            members: vec![1, 2],
            limited: vec![],
        }])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let table = tb.agents[2]
            .run("cat /sys/class/infiniband/hcab0/ports/1/pkeys/1", T)
            .unwrap();
        if table.trim() == "0x0000" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node3 keeps {table} after leaving the partition"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Debian's IPoIB makes a child interface per partition (`create_child`, what `ip link add
/// ... type ipoib pkey` does): it finds the P_Key in hcab0's table (which the fabric's SM
/// set), joins the partition's broadcast group (which the SA made) and runs in it, in
/// datagram and in connected mode (ib_cm's RC QPs in the partition). A node outside the
/// partition has no such P_Key: its child stays without carrier.
fn a_partitions_ipoib_child_reaches_its_members_only(tb: &mut Testbed) {
    let child = format!("ib0.{PARTITION:04x}");
    let paddr = |i: usize| format!("10.79.0.{}", i + 1);
    for i in 0..NODES {
        let table = tb.agents[i]
            .run("cat /sys/class/infiniband/hcab0/ports/1/pkeys/[01]", T)
            .unwrap();
        let want = if i < 2 { "0x8001" } else { "0x0000" };
        assert_eq!(
            table.split_whitespace().collect::<Vec<_>>(),
            ["0xffff", want],
            "node{}",
            i + 1
        );
        tb.agents[i]
            .run(
                &format!(
                    "echo {PARTITION:#x} > /sys/class/net/ib0/create_child && \
                     ip addr add {}/24 dev {child} && ip link set {child} up",
                    paddr(i)
                ),
                T,
            )
            .unwrap();
    }
    let carrier = |tb: &mut Testbed, i: usize| {
        let c = tb.agents[i]
            .run(&format!("cat /sys/class/net/{child}/carrier"), T)
            .unwrap();
        c.trim() == "1"
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(carrier(tb, 0) && carrier(tb, 1)) {
        assert!(
            Instant::now() < deadline,
            "the members' {child} got no carrier"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!carrier(tb, 2), "node3 is not in the partition");
    let log = tb.agents[2].run("dmesg | grep 'P_Key'", T).unwrap();
    assert!(log.contains("P_Key 0x8001 is not found"), "{log}");
    let out = tb.agents[0]
        .run(&format!("ping -c 2 -W 5 {}", paddr(1)), T)
        .unwrap();
    assert!(out.contains("2 packets received"), "{out}");
    let out = tb.agents[0]
        .run(&format!("ping -c 2 -W 2 {} || true", paddr(2)), T)
        .unwrap();
    assert!(out.contains("0 packets received"), "{out}");
    // The partition's groups have its members only.
    let groups: Vec<(usize, u16)> = tb.fabric().with_sa(|sa| {
        sa.groups()
            .filter(|g| g.pkey == PARTITION)
            .map(|g| (g.members.len(), u16::from_be_bytes([g.mgid[4], g.mgid[5]])))
            .collect()
    });
    assert!(!groups.is_empty());
    assert!(
        groups.iter().all(|&(n, k)| n <= 2 && k == PARTITION),
        "{groups:?}"
    );

    // The SM adds node3 to the partition on the running cluster (what `hcabench
    // partition` does): hcab0 tells ib_core the table changed, IPoIB finds the P_Key and
    // node3's child comes up.
    tb.fabric()
        .set_partitions(&[hca_model::partition::Partition {
            pkey: PARTITION,
            members: vec![1, 2, 3],
            limited: vec![],
        }])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !carrier(tb, 2) {
        let log = tb.agents[2].run("dmesg | tail -5", T).unwrap_or_default();
        assert!(
            Instant::now() < deadline,
            "node3's {child} got no carrier after joining the partition: {log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The first datagram may go while node1 still resolves node3's new child (its ARP and
    // path queries run as the child's carrier comes up): one ping first, then two that
    // must both come back.
    let _ = tb.agents[0].run(&format!("ping -c 1 -W 5 {}", paddr(2)), T);
    let out = tb.agents[0]
        .run(&format!("ping -c 2 -W 5 {}", paddr(2)), T)
        .unwrap();
    assert!(out.contains("2 packets received"), "{out}");

    // 4 MiB over TCP in connected mode: an RC connection in the partition, intact.
    for i in 0..2 {
        tb.agents[i]
            .run(
                &format!(
                    "echo connected > /sys/class/net/{child}/mode && \
                     ip link set {child} mtu 65520"
                ),
                T,
            )
            .unwrap();
    }
    let sum = tb.agents[1]
        .run(
            "mkdir -p /tmp/p && dd if=/dev/urandom of=/tmp/p/blob bs=1M count=4 2>/dev/null && \
             md5sum /tmp/p/blob && httpd -p 8081 -h /tmp/p",
            T,
        )
        .unwrap();
    let sum = sum.split_whitespace().next().unwrap().to_string();
    let got = tb.agents[0]
        .run(
            &format!("wget -q -O - http://{}:8081/blob | md5sum", paddr(1)),
            T,
        )
        .unwrap();
    assert_eq!(got.split_whitespace().next(), Some(sum.as_str()));
    let rc = tb.agents[0]
        .run("rdma res show qp | grep -c 'type RC'", T)
        .unwrap();
    assert!(rc.trim().parse::<u32>().unwrap_or(0) >= 1, "{rc}");
    for i in 0..NODES {
        tb.agents[i]
            .run(
                &format!(
                    "echo {PARTITION:#x} > /sys/class/net/ib0/delete_child; \
                     killall httpd 2> /dev/null; rm -rf /tmp/p; true"
                ),
                T,
            )
            .unwrap();
    }
}
