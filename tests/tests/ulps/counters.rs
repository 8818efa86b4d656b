//! The ports' counters as the guests read them: ib_core's sysfs through hca_ib's
//! Performance Management agent, hardware counters, and another node's PMA queries over QP1.

use cluster::verbs::Testbed;

use crate::{fetch, serve_blob, shared, stop_serving, T};

/// Nodes 1 and 2 each fetch 64 MiB from node 3 over TCP on ib0 (datagram mode): both views
/// of the ports' counters count them, and node 2 reads and resets node 1's over QP1.
#[test]
fn test_the_port_counters_count_a_fetch_and_another_node_resets_them() {
    let Some(mut c) = shared::cluster("port counters") else {
        return;
    };
    let tb = &mut c.tb;
    let sum = serve_blob(tb);
    let before = [port_counters(tb, 0), port_counters(tb, 2)];
    for from in [0, 1] {
        assert_eq!(fetch(tb, from, 2), sum, "node{} got other bytes", from + 1);
    }
    stop_serving(tb);
    the_port_counters_saw_the_fetch(tb, before);
    another_node_reads_and_resets_the_counters_over_qp1(tb);
}

/// Node `i`'s port counters as ib_core's sysfs shows them through hca_ib's Performance
/// Management agent (`counters/`: IBA's PortCounters and PortCountersExtended) and as
/// hardware counters (`hw_counters/`): name -> value.
fn port_counters(tb: &mut Testbed, i: usize) -> Counters {
    let out = tb.agents[i]
        .run(
            "cd /sys/class/infiniband/hcab0/ports/1 && \
             for f in counters/* hw_counters/*; do echo \"$f $(cat $f)\"; done",
            T,
        )
        .unwrap();
    name_values(&out)
}

/// Counters by name.
type Counters = std::collections::HashMap<String, u64>;

/// `NAME VALUE` lines (a value in decimal, or in hex after `0x`), by name; other lines are
/// left out.
fn name_values(out: &str) -> Counters {
    out.lines()
        .filter_map(|l| {
            let (name, v) = l.split_once(' ')?;
            let v = v.trim();
            let v = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok()?,
                None => v.parse().ok()?,
            };
            Some((name.to_string(), v))
        })
        .collect()
}

/// Nodes 1 and 2 each fetched 64 MiB from node 3 over TCP on ib0: node 3's port sent at
/// least 128 MiB and node 1's received at least 64 MiB, in both views of the counters
/// (the PMA's data counters count 4-octet words), and not much more (IPoIB, IP and TCP
/// headers, TCP's ACKs, the fabric's own headers: under 10%).
fn the_port_counters_saw_the_fetch(tb: &mut Testbed, before: [Counters; 2]) {
    let after = [port_counters(tb, 0), port_counters(tb, 2)];
    // hca_ib names its hardware counters as the device's ABI does.
    for name in hca_model::abi::COUNTER_NAMES {
        let key = format!("hw_counters/{name}");
        assert!(
            after[0].contains_key(&key),
            "no {key}: {:?}",
            after[0].keys()
        );
    }
    let grew = |k: usize, name: &str| {
        let get = |m: &Counters| {
            *m.get(name)
                .unwrap_or_else(|| panic!("no {name} among {:?}", m.keys()))
        };
        get(&after[k]) - get(&before[k])
    };
    const MIB: u64 = 1 << 20;
    let checks = [
        (1, "counters/port_xmit_data", 4, 128 * MIB),
        (1, "hw_counters/tx_octets", 1, 128 * MIB),
        (0, "counters/port_rcv_data", 4, 64 * MIB),
        (0, "hw_counters/rx_octets", 1, 64 * MIB),
    ];
    for (k, name, unit, want) in checks {
        let got = grew(k, name) * unit;
        assert!(
            got >= want && got < want + want / 10,
            "node{} {name}: {got} octets for {want} of payload",
            if k == 0 { 1 } else { 3 }
        );
    }
    // At IPoIB's datagram MTU of 2044 bytes, 64 MiB is at least 32,832 packets.
    assert!(grew(0, "counters/port_rcv_packets") >= 64 * MIB / 2044);
    assert_eq!(grew(0, "counters/port_rcv_errors"), 0);
}

/// `pma-query` on node 2 asks node 1's Performance Management agent over QP1 (as a
/// performance manager would): what it answers agrees with what node 1's own sysfs reads
/// through the same agent; a Set resets the PMA's view, which node 1's `counters/` then
/// shows, while its hardware counters keep counting.
fn another_node_reads_and_resets_the_counters_over_qp1(tb: &mut Testbed) {
    let query = |tb: &mut Testbed, args: &str| -> Counters {
        let out = tb.agents[1]
            .run(&format!("pma-query {args}"), T)
            .unwrap_or_else(|e| panic!("pma-query {args}: {e}"));
        name_values(&out)
    };
    let remote = query(tb, "1");
    let local = port_counters(tb, 0);
    // PortCountersExtended, all of it (ib_core's sysfs reads its fields).
    assert_eq!(remote.get("capability_mask"), Some(&0x200), "{remote:?}");
    // Node 1 fetched 64 MiB over TCP: at least a packet per datagram MTU of it came in.
    let got = remote["ext_port_rcv_packets"];
    assert!(got > 64 * (1 << 20) / 2044, "{remote:?}");
    assert!(
        local["counters/port_rcv_packets"] >= got,
        "{local:?} {remote:?}"
    );
    for way in ["xmit", "rcv"] {
        assert_eq!(
            remote[&format!("ext_port_{way}_packets")],
            remote[&format!("ext_port_unicast_{way}_packets")]
                + remote[&format!("ext_port_multicast_{way}_packets")],
            "{remote:?}"
        );
    }
    let reset = query(tb, "-r 1");
    for k in ["port_rcv_packets", "port_xmit_data", "ext_port_rcv_packets"] {
        assert_eq!(reset.get(k), Some(&0), "{k} after a reset: {reset:?}");
    }
    let after = port_counters(tb, 0);
    assert!(
        after["counters/port_rcv_packets"] < got / 100,
        "node1's PMA view not reset: {after:?}"
    );
    assert!(after["hw_counters/rx_packets"] >= local["hw_counters/rx_packets"]);
}
