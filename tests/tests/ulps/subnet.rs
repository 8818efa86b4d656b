//! The subnet's management as Debian's infiniband-diags sees it: saquery asks the fabric's
//! SA; smpquery, sminfo, ibnetdiscover, iblinkinfo, ibroute, ibtracert, perfquery, ibping
//! and ibqueryerrors ask the ports' agents, the switch's and the SM's.

use cluster::verbs::Testbed;

use crate::{port_guid, shared, NODES, PACKET_LIFE, T};

/// Debian's saquery (infiniband-diags, over ib_umad) asks the SA as it would ask OpenSM:
/// its GetTable answers come back whole over RMPP and list every node, path and member.
#[test]
fn test_debians_saquery_reads_the_sa_tables() {
    let Some(mut c) = shared::cluster("saquery") else {
        return;
    };
    debians_saquery_reads_the_sa_tables(&mut c.tb);
}

/// See [`debians_smpquery_and_perfquery_ask_the_ports_agents`].
#[test]
fn test_debians_smpquery_and_perfquery_ask_the_ports_agents() {
    let Some(mut c) = shared::cluster("smpquery and perfquery") else {
        return;
    };
    debians_smpquery_and_perfquery_ask_the_ports_agents(&mut c.tb);
}

/// Debian's saquery reads the records of the subnet's structure, and they say what the
/// switch's SMPs say: the master SM, the switch, each node's link to it, its forwarding
/// tables (a node's LID out of its port, the broadcast group to every member), each port's
/// GUID, P_Key and SL-to-VL tables; no VL arbitration tables, as the ports have none.
#[test]
fn test_debians_saquery_reads_the_subnets_structure() {
    let Some(mut c) = shared::cluster("saquery: the subnet's structure") else {
        return;
    };
    debians_saquery_reads_the_subnets_structure(&mut c.tb);
}

fn debians_saquery_reads_the_subnets_structure(tb: &mut Testbed) {
    let ask = |tb: &mut Testbed, q: &str| {
        tb.agents[0]
            .run(&format!("saquery {q}"), T)
            .unwrap_or_else(|e| panic!("saquery {q}: {e}"))
    };
    let count = |out: &str, what: &str| out.matches(what).count();
    let out = ask(tb, "SMIR");
    for want in [
        "LID...................49151\n",
        "GUID..................0x0002c9030000bfff\n",
        "SMState...............3\n",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let out = ask(tb, "SWIR");
    assert!(
        out.contains("LID.....................................49151\n")
            && out.contains("LinearFDBTop............................0xBFFF\n"),
        "{out}"
    );
    // Node n's port 1 to the switch's port n, and back.
    let out = ask(tb, "LR");
    assert_eq!(count(&out, "LinkRecord dump"), 2 * NODES, "{out}");
    for n in 1..=NODES {
        let there = format!("FromLID....................{n}\n\t\tFromPort...................1\n\t\tToPort.....................{n}\n");
        assert!(out.contains(&there), "node {n}'s link: {out}");
    }
    // The first block of the linear forwarding table: LID n leaves by port n.
    let out = ask(tb, "LFTR 49151/0");
    for n in 1..=NODES {
        assert!(out.contains(&format!("\t\t{n}\t{n}\n")), "LID {n}: {out}");
    }
    // Every node's port is in IPoIB's broadcast group: its MLID goes out of ports 1 to
    // NODES.
    crate::wait_members(tb, NODES);
    let mlid = tb.fabric().with_sa(|sa| {
        sa.groups()
            .find(|g| g.mgid == hca_model::sa::IPOIB_BROADCAST_MGID)
            .map(|g| g.mlid)
            .unwrap()
    });
    let mask = (1u16 << (NODES + 1)) - 2;
    let out = ask(tb, "MFTR");
    assert!(
        out.contains(&format!("\t\t0x{mlid:04x}\t0x{mask:04x}\n")),
        "MLID 0x{mlid:04x} to ports 0x{mask:04x}: {out}"
    );
    let out = ask(tb, "GIR");
    for i in 0..NODES {
        let guid = format!(
            "GUID 0.....................0x{}\n",
            port_guid(tb, i).replace(':', "")
        );
        assert!(out.contains(&guid), "{guid}: {out}");
    }
    let out = ask(tb, "PKTR");
    assert_eq!(count(&out, "PKeyTableRecord dump"), NODES + 1, "{out}");
    assert!(out.contains("\t\t0xffff "), "the default partition: {out}");
    // One per node's port, and per pair of the switch's ports (0 and one per node).
    let out = ask(tb, "SL2VL");
    assert_eq!(
        count(&out, "SL2VLTableRecord dump"),
        NODES + (NODES + 1) * (NODES + 1),
        "{out}"
    );
    let out = ask(tb, "VLAR");
    assert_eq!(count(&out, "VLArbTableRecord dump"), 0, "{out}");
    // Subscriptions, if any, name their subscriber (the query is answered either way).
    let out = ask(tb, "IIR");
    assert_eq!(
        count(&out, "InformInfoRecord dump"),
        count(&out, "SubscriberGID...........fe80::"),
        "{out}"
    );
}

fn debians_saquery_reads_the_sa_tables(tb: &mut Testbed) {
    let ask = |tb: &mut Testbed, q: &str| {
        tb.agents[0]
            .run(&format!("saquery {q}"), T)
            .unwrap_or_else(|e| panic!("saquery {q}: {e}"))
    };
    // The user-space faces of the stack are there: ib_umad's devices (saquery's) and
    // rdma_ucm's (librdmacm's).
    let devs = tb.agents[0].run("ls /dev/infiniband", T).unwrap();
    for d in ["umad0", "issm0", "rdma_cm"] {
        assert!(devs.split_whitespace().any(|x| x == d), "no {d}: {devs}");
    }
    let gids: Vec<String> = (1..=NODES)
        .map(|l| format!("fe80::2:c903:0:{l:x}"))
        .collect();
    // The nodes, and the switch.
    let out = ask(tb, "");
    assert_eq!(out.matches("NodeRecord dump").count(), NODES + 1, "{out}");
    assert!(out.contains("hcabench fabric switch"), "{out}");
    let out = ask(tb, "-p");
    assert_eq!(
        out.matches("PathRecord dump").count(),
        NODES * NODES,
        "{out}"
    );
    // Every path has the cluster's packet lifetime (selector "exactly", 2 << 6).
    let life = format!("pkt_life................0x{:X}\n", 2 << 6 | PACKET_LIFE);
    assert_eq!(out.matches(&life).count(), NODES * NODES, "{life}: {out}");
    let out = ask(tb, "-m");
    for g in &gids {
        assert!(
            out.contains(&format!("PortGid.................{g}\n")),
            "{g}: {out}"
        );
    }
    // ib_cm set IsCommunicationManagementSupported through ib_modify_port. The switch's
    // ports 0 to NODES are listed too.
    let out = ask(tb, "PIR");
    assert_eq!(
        out.matches("PortInfoRecord dump").count(),
        2 * NODES + 1,
        "{out}"
    );
    assert_eq!(
        out.matches("IsCommunicatonManagementSupported").count(),
        NODES,
        "{out}"
    );
}

/// infiniband-diags' subnet management and performance tools, through ib_umad on QP0 and
/// QP1: `smpquery` asks another node's Subnet Management Agent (hca_ib's, as HCA firmware
/// runs one) LID-routed over QP0, and its own port by directed route (which ib_mad answers
/// locally); what they say agrees with each node's sysfs. `sminfo` finds the fabric's SM as
/// the master; `ibnetdiscover` and `iblinkinfo` find the fabric's switch and every node on
/// it by directed routes, `ibroute` its forwarding table and `ibtracert` a path through it.
/// `perfquery` reads the local and a remote PMA, and the switch's, whose port n counts its
/// link to LID n from the other end; `ibqueryerrors` asks them all and finds no errors.
/// `ibping` reaches another node's `ibping -S` through a vendor class on QP1. A node cannot
/// change another's port (`ibportstate ... disable` is refused).
fn debians_smpquery_and_perfquery_ask_the_ports_agents(tb: &mut Testbed) {
    let ask = |tb: &mut Testbed, i: usize, q: &str| {
        tb.agents[i]
            .run(q, T)
            .unwrap_or_else(|e| panic!("node{}: {q}: {e}", i + 1))
    };
    let sysfs = |tb: &mut Testbed, i: usize, f: &str| {
        ask(tb, i, &format!("cat /sys/class/infiniband/hcab0/{f}"))
            .trim()
            .to_string()
    };
    // Each node's GUID as the tools print it (0x and 16 digits).
    let guids: Vec<String> = (0..NODES)
        .map(|i| format!("0x{}", port_guid(tb, i).replace(':', "")))
        .collect();
    for (i, lid) in [(0usize, 2u32), (1, 3), (2, 1)] {
        let j = lid as usize - 1;
        let guid = &guids[j];
        let out = ask(tb, i, &format!("smpquery nodeinfo {lid}"));
        for want in [
            format!("Guid:............................{guid}\n"),
            "NodeType:........................Channel Adapter\n".into(),
            "LocalPort:.......................1\n".into(),
        ] {
            assert!(out.contains(&want), "node{} asked LID {lid}: {out}", i + 1);
        }
        let out = ask(tb, i, &format!("smpquery portinfo {lid}"));
        for want in [
            format!("Lid:.............................{lid}\n"),
            "SMLid:...........................49151\n".into(),
            "LinkState:.......................Active\n".into(),
            "LinkWidthActive:.................4X\n".into(),
        ] {
            assert!(out.contains(&want), "node{} asked LID {lid}: {out}", i + 1);
        }
        let desc = sysfs(tb, j, "node_desc");
        let out = ask(tb, i, &format!("smpquery nodedesc {lid}"));
        assert!(out.contains(&desc), "{desc:?}: {out}");
    }
    // Node 1's own port by directed route: its partition's P_Key is in its table.
    let out = ask(tb, 0, "smpquery -D nodedesc 0");
    assert!(out.contains(&sysfs(tb, 0, "node_desc")), "{out}");
    let pkey = sysfs(tb, 0, "ports/1/pkeys/1");
    let out = ask(tb, 0, "smpquery -D pkeys 0");
    assert!(out.contains(&pkey) && pkey != "0x0000", "{pkey}: {out}");
    // The fabric is the SM: another node's Set (ibportstate disables a port by a PortInfo
    // Set) is refused by the port's agent and changes nothing.
    let out = ask(tb, 0, "ibportstate 3 1 disable 2>&1; echo status=$?");
    assert!(
        !out.contains("status=0"),
        "node1 disabled node3's port: {out}"
    );
    assert_eq!(sysfs(tb, 2, "ports/1/state"), "4: ACTIVE", "{out}");
    // The master SM that PortInfo names answers its SMInfo over QP0.
    let out = ask(tb, 1, "sminfo");
    assert!(
        out.contains("sm lid 49151 sm guid 0x2c9030000bfff")
            && out.contains("state 3 SMINFO_MASTER"),
        "{out}"
    );
    // ibnetdiscover walks the subnet by directed routes: the fabric's switch, its port n
    // linked to each node's port 1 (LID n), both ways. Node 3 is outside partition 1:
    // subnet management is not partitioned.
    let out = ask(tb, 2, "ibnetdiscover -p");
    let links: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| l.starts_with("CA ") || l.starts_with("SW "))
        .collect();
    assert_eq!(links.len(), 2 * NODES, "{out}");
    for lid in 1..=NODES {
        let guid = &guids[lid - 1];
        let sw = format!("SW 49151 {lid} 0x0002c9030000bfff");
        for want in [
            format!("CA {lid} 1 {guid} 4x QDR - {sw}"),
            format!("{sw} 4x QDR - CA {lid} 1 {guid}"),
        ] {
            assert!(links.iter().any(|l| l.starts_with(&want)), "{want}: {out}");
        }
        // A directed route through the switch's port `lid` reaches that node's agent.
        let out = ask(tb, 1, &format!("smpquery -D nodeinfo 0,1,{lid}"));
        let want = format!("Guid:............................{guid}\n");
        assert!(out.contains(&want), "{out}");
    }
    let out = ask(tb, 0, "iblinkinfo");
    let up = "4X          10.0 Gbps Active/  LinkUp";
    assert_eq!(out.matches(up).count(), 2 * NODES, "{out}");
    // The switch forwards LID n by port n (ibroute reads its table); ibtracert follows it.
    let out = ask(tb, 1, "ibroute 49151");
    assert!(
        out.contains(&format!("{} valid lids dumped", NODES + 1)),
        "{out}"
    );
    for lid in 1..=NODES {
        assert!(
            out.contains(&format!("0x{lid:04x} {lid:03} : (Channel Adapter")),
            "{out}"
        );
    }
    let out = ask(tb, 0, "ibtracert 1 3");
    let want = format!("[3] -> ca port {{{}}}[1] lid 3-3", guids[2]);
    assert!(out.contains(&want), "{out}");
    // perfquery opens the SMI class (QP0) as well as the PMA's: here, and of another node.
    for (i, args, lid) in [(2usize, "", 3), (0, "-x 3", 3)] {
        let out = ask(tb, i, &format!("perfquery {args}"));
        assert!(
            out.contains(&format!("# Port counters: Lid {lid} port"))
                || out.contains(&format!("# Port extended counters: Lid {lid} port")),
            "node{}: perfquery {args}: {out}",
            i + 1
        );
        assert!(out.contains("PortRcvPkts:"), "{out}");
    }
    // The switch's PMA: its port n counts the link to LID n from the switch's end, so what
    // node n sent (its sysfs hardware counter tx_packets, read before and after) the switch
    // port received, the query itself included. (Not its PMA's port_xmit_packets: the
    // counters test resets node 1's PMA view, and the switch's view goes on from boot.)
    let field = |out: &str, name: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {out}"));
        line.trim_start_matches(|c| c != '.')
            .trim_start_matches('.')
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    for i in 0..NODES {
        let lid = i + 1;
        let sent = "cat /sys/class/infiniband/hcab0/ports/1/hw_counters/tx_packets";
        let out = ask(tb, i, &format!("{sent}; perfquery -x 49151 {lid}; {sent}"));
        let lines: Vec<&str> = out.lines().collect();
        let before: u64 = lines[0]
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{out}: {e}"));
        let after: u64 = lines[lines.len() - 1]
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{out}: {e}"));
        assert!(
            out.contains(&format!("# Port extended counters: Lid 49151 port {lid}")),
            "{out}"
        );
        let rcv = field(&out, "PortRcvPkts:");
        assert!(
            before < rcv && rcv <= after,
            "node{lid}: sent {before}..{after}, switch port {lid} received {rcv}: {out}"
        );
        assert!(field(&out, "PortXmitPkts:") > 0, "{out}");
    }
    // ibping: a vendor-class MAD (0x32) echoed by another node's `ibping -S` over QP1.
    ask(tb, 0, "ibping -S > /tmp/ibping.log 2>&1 &");
    let out = ask(tb, 2, "sleep 1; ibping -c 3 1; echo rc=$?");
    ask(tb, 0, "pkill ibping; true");
    assert!(
        out.contains("3 packets transmitted, 3 received") && out.contains("rc=0"),
        "{out}"
    );
    // ibqueryerrors asks every port's PMA, the switch's (all its ports at once) and each
    // node's: nothing has failed yet.
    let out = ask(tb, 1, "ibqueryerrors; echo rc=$?");
    for want in [
        format!("{} nodes checked, 0 bad nodes found", NODES + 1),
        format!(
            "{} ports checked, 0 ports have errors beyond threshold",
            2 * NODES
        ),
        "rc=0".into(),
    ] {
        assert!(out.contains(&want), "{want}: {out}");
    }
}
