//! The guests' shared Ethernet segment: a virtio-net NIC in each QEMU guest, all on one
//! learning switch of hcabench's (`cluster::ethernet`), so that SoftRoCE (rdma_rxe) and
//! TCP over Ethernet run on any number of nodes, beside hcab0.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;

use cluster::verbs::{Mode, Testbed};

use crate::{shared, NODES, T};

/// Every pair of nodes pings over eth0, through the hub (which switches what it learned
/// rather than flooding it); then rxe0 on every node carries vbench's ping-pong between each
/// pair, every byte checked.
#[test]
fn test_the_guests_share_one_ethernet_segment_and_softroce_runs_across_it() {
    let Some(mut c) = shared::cluster("ethernet") else {
        return;
    };
    let tb = &mut c.tb;
    let run = catch_unwind(AssertUnwindSafe(|| one_segment(tb)));
    // Put back what the test changed, also when it failed: no rxe0, eth0 down.
    let mut left = Vec::new();
    for i in 0..NODES {
        let down = "rdma link delete rxe0 2> /dev/null; ip addr flush dev eth0; \
                    ip link set eth0 down";
        if let Err(e) = tb.agents[i].run(down, T) {
            left.push(format!("node{}: {e}", i + 1));
        }
    }
    if let Err(panic) = run {
        resume_unwind(panic);
    }
    assert!(
        left.is_empty(),
        "taking rxe0 and eth0 down: {}",
        left.join("\n")
    );
}

fn one_segment(tb: &mut Testbed) {
    let switched_before = tb
        .cluster
        .ethernet()
        .expect("the cluster's guests have NICs")
        .stats()
        .switched
        .load(Relaxed);
    tb.rxe_up().unwrap();
    for i in 0..NODES {
        for j in (0..NODES).filter(|&j| j != i) {
            let out = tb.agents[i]
                .run(
                    &format!(
                        "ping -c 2 -W 2 10.77.0.{} >/dev/null 2>&1; echo ping=$?",
                        j + 1
                    ),
                    T,
                )
                .unwrap();
            assert!(
                out.contains("ping=0"),
                "node{} to node{} over eth0: {out}",
                i + 1,
                j + 1
            );
        }
    }
    let hub = tb.cluster.ethernet().unwrap().stats();
    assert!(
        hub.switched.load(Relaxed) > switched_before,
        "the hub switched no frame: {hub:?}"
    );
    for (i, j) in [(0, 1), (0, 2), (1, 2)] {
        tb.connect_pair(i, j, "rxe0").unwrap();
        let r = tb.ping_between(i, j, Mode::Poll, 4096, 20, true).unwrap();
        assert_eq!(
            (r.done, r.errors, r.server_errors),
            (20, 0, 0),
            "rxe0 node{} to node{}: {r:?}",
            i + 1,
            j + 1
        );
    }
}
