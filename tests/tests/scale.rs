//! End-to-end at a node count the other tests do not reach: eight QEMU guests on one
//! fabric, one of them with RAM of its own (`ClusterSpec::ram_mib_of`, the cluster file's
//! `[node_memory_mib]`). Every node's IPoIB joins the broadcast group and the last node
//! pings every other; node 1 exports NFS over RDMA and the seven others mount it and write
//! a file each, all at once (seven RC connections into one server's svcrdma, every QP's
//! traffic on one fabric at the same time), and every file reads back the same on the
//! server.

use cluster::verbs::Testbed;
use cluster::ClusterSpec;
use e2e::{broadcast_members, image_or_skip, BOOT_TIMEOUT};
use std::time::Duration;

const T: Duration = Duration::from_secs(180);
const NODES: usize = 8;
/// Node 1's RAM (the others have the default 256 MiB): it serves seven clients.
const SERVER_MIB: u64 = 512;

fn addr(i: usize) -> String {
    format!("10.78.0.{}", i + 1)
}

/// What the guest's kernel says it has, in KiB (MemTotal).
fn mem_total_kib(tb: &mut Testbed, i: usize) -> u64 {
    let out = tb.agents[i].run("grep MemTotal /proc/meminfo", T).unwrap();
    out.split_whitespace()
        .nth(1)
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("node{}: {out}", i + 1))
}

#[test]
fn test_eight_guests_ping_and_write_to_one_nfs_server_at_once() {
    let Some(image) = image_or_skip("scale") else {
        return;
    };
    let spec = ClusterSpec {
        ram_mib_of: [(ClusterSpec::node_name(0), SERVER_MIB)].into(),
        // RC ACK timeouts of about 134 ms, as the ulps tests run.
        packet_life: 13,
        ..e2e::qemu_spec(&image, "scale", NODES)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();

    // Node 1's own RAM reached its guest; the others have the cluster's.
    let (server, client) = (mem_total_kib(&mut tb, 0), mem_total_kib(&mut tb, 1));
    assert!(
        server > (SERVER_MIB - 100) * 1024 && client < 256 * 1024,
        "MemTotal: node1 {server} KiB, node2 {client} KiB"
    );

    for i in 0..NODES {
        let out = tb.agents[i]
            .run(&format!("ipoib-up {}/24", addr(i)), T)
            .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(i)));
        assert!(out.contains("LOWER_UP"), "node{}: {out}", i + 1);
    }
    assert_eq!(
        broadcast_members(tb.fabric()),
        NODES,
        "the broadcast group's members"
    );
    let last = NODES - 1;
    for j in 0..last {
        let out = tb.agents[last]
            .run(&format!("ping -c 1 -W 5 {}", addr(j)), T)
            .unwrap();
        assert!(out.contains("1 packets received"), "node8 -> {j}: {out}");
    }

    let out = tb.agents[0]
        .run("nfs export 64", T)
        .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(0)));
    assert!(out.contains("RDMA port 20049"), "{out}");
    for i in 1..NODES {
        let out = tb.agents[i]
            .run(
                &format!(
                    "nfs mount {} /mnt/nfs && grep ' /mnt/nfs ' /proc/mounts",
                    addr(0)
                ),
                T,
            )
            .unwrap_or_else(|e| panic!("NFS mount on node{}: {e}\n{}", i + 1, tb.console(i)));
        assert!(out.contains("proto=rdma"), "node{}: {out}", i + 1);
    }
    // Seven clients write 2 MiB each at once, each through its own shell on its own thread.
    let sums: Vec<(usize, String)> = std::thread::scope(|s| {
        let writers: Vec<_> = (tb.agents.iter_mut().enumerate().skip(1))
            .map(|(i, agent)| {
                s.spawn(move || {
                    let out = agent
                        .run(
                            &format!(
                                "dd if=/dev/urandom of=/tmp/src bs=1M count=2 2>/dev/null && \
                                 md5sum < /tmp/src && \
                                 dd if=/tmp/src of=/mnt/nfs/node{n} bs=1M conv=fsync \
                                 2>/dev/null && echo written",
                                n = i + 1
                            ),
                            T,
                        )
                        .unwrap_or_else(|e| panic!("node{}: {e}", i + 1));
                    assert!(out.contains("written"), "node{}: {out}", i + 1);
                    let sum = out.split_whitespace().find(|w| w.len() == 32);
                    (i, sum.unwrap_or_default().to_string())
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().expect("writer"))
            .collect()
    });
    for (i, want) in sums {
        let got = tb.agents[0]
            .run(&format!("md5sum < /export/node{}", i + 1), T)
            .unwrap();
        assert_eq!(
            got.split_whitespace().next(),
            Some(want.as_str()),
            "node{}'s file on the server",
            i + 1
        );
    }
}
