//! End-to-end: a subnet of three switches in a ring under three QEMU guests, one node on
//! each (node1 on s0, node2 on s1, node3 on s2; links s0-s1, s1-s2, s2-s0), cabled through
//! `ClusterSpec::topology` as a cluster file's `[[switch]]` and `[[link]]` tables are.
//!
//! Debian's infiniband-diags in the guests see the subnet the SM swept: ibnetdiscover finds
//! the three switches and every link, ibroute reads a switch's min-hop forwarding table,
//! ibtracert follows a path switch by switch. Then links are cut as `hcabench link down`
//! cuts them: IPoIB traffic from node1 to node2 goes round the ring through s2 once the SM
//! has swept, the tools show the longer path and the cut link down at both ends; with s1
//! cut off altogether node2 is unreachable (and the SA has no path to it) while node3 is
//! not; restored, node2 answers again. perfquery reads each switch's end of a link: what
//! crossed it each way, and that it went down.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cluster::verbs::Testbed;
use cluster::{ClusterSpec, SwitchSpec, TopologySpec};
use e2e::{image_or_skip, BOOT_TIMEOUT};
use hca_model::subnet::SwitchLink;

const T: Duration = Duration::from_secs(120);
const NODES: usize = 3;
/// Switch `i`'s LID (the SM's switch, s0, has the SM's).
const fn switch_lid(i: u16) -> u16 {
    hca_model::sa::SM_LID - i
}
/// The links in `ClusterSpec::topology`'s order (the model's link indices).
const S0_S1: usize = 0;
const S1_S2: usize = 1;

/// Node `i`'s IPoIB address.
fn addr(i: usize) -> String {
    format!("10.78.0.{}", i + 1)
}

#[test]
fn test_a_ring_of_switches_routes_around_cut_links_as_the_guests_tools_show() {
    let Some(image) = image_or_skip("a ring of three switches") else {
        return;
    };
    let started = Instant::now();
    let link = |a: &str, b: &str| [a.to_string(), b.to_string()];
    let spec = ClusterSpec {
        topology: TopologySpec {
            switches: (0..NODES)
                .map(|i| SwitchSpec {
                    name: format!("s{i}"),
                    nodes: vec![ClusterSpec::node_name(i)],
                    ..SwitchSpec::default()
                })
                .collect(),
            links: vec![link("s0", "s1"), link("s1", "s2"), link("s2", "s0")],
        },
        ..e2e::qemu_spec(&image, "switches", NODES)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |m| eprintln!("  {m}")).unwrap();
    for i in 0..NODES {
        let out = run(&mut tb, i, &format!("ipoib-up {}/24", addr(i)));
        assert!(out.contains("LOWER_UP"), "node{}: {out}", i + 1);
    }
    the_tools_see_the_ring(&mut tb);
    // (The first echoes wait for ARP and the SA's path: a busy host may take a while.)
    assert!(
        pings_within(&mut tb, 0, 1, Duration::from_secs(20)),
        "node1 -> node2 over s0-s1"
    );
    // perfquery (from node3) reads s1's end of s0-s1 (its port 2): the pings crossed it
    // both ways, no more than the fabric counted, none lost.
    let c = perfquery(&mut tb, 2, switch_lid(1), 2);
    let s0_s1 = |forward| {
        (tb.fabric())
            .switch_link_stats(SwitchLink {
                link: S0_S1,
                forward,
            })
            .unwrap()
    };
    let (into_s1, from_s1) = (s0_s1(true), s0_s1(false));
    assert!(
        (1..=into_s1.rcv_pkts).contains(&c["PortRcvPkts"])
            && (1..=from_s1.xmit_pkts).contains(&c["PortXmitPkts"])
            && c["PortRcvData"] > 0
            && c["PortXmitDiscards"] == 0
            && c["LinkDownedCounter"] == 0,
        "s1 port 2: {c:?}, the fabric: {into_s1:?} {from_s1:?}"
    );

    // s0-s1 cut: the SM's sweep at the next tick sends node1's traffic round through s2.
    set_link(&tb, S0_S1, false);
    assert!(
        pings_within(&mut tb, 0, 1, Duration::from_secs(5)),
        "node1 -> node2 round the ring"
    );
    assert_eq!(
        trace(&mut tb, 1, 2),
        [switch_lid(0), switch_lid(2), switch_lid(1)]
    );
    let table = ibroute(&mut tb, 0, switch_lid(0));
    assert!(
        table.contains(&(2, 3)),
        "LID 2 now out of s0's port 3: {table:?}"
    );
    let links = iblinkinfo_down(&mut tb, 0);
    assert_eq!(
        links,
        BTreeSet::from([(switch_lid(0), 2), (switch_lid(1), 2)]),
        "the cut link is down at both of its ends"
    );
    let c = perfquery(&mut tb, 2, switch_lid(0), 2);
    assert_eq!(c["LinkDownedCounter"], 1, "s0 port 2: {c:?}");

    // s1-s2 cut as well: s1, and node2 behind it, are cut off.
    set_link(&tb, S1_S2, false);
    let t = Instant::now();
    assert!(!pings(&mut tb, 0, 1, 2), "node2 is unreachable");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "a failed ping ends in bounded time ({:.1?})",
        t.elapsed()
    );
    assert!(
        pings_within(&mut tb, 0, 2, Duration::from_secs(20)),
        "node1 -> node3 still"
    );
    let (switches, cas, _) = discover(&mut tb, 0);
    assert_eq!(
        (switches, cas),
        (
            BTreeSet::from([switch_lid(0), switch_lid(2)]),
            BTreeSet::from([1, 3])
        ),
        "ibnetdiscover no longer finds s1 or node2"
    );
    let paths = run(&mut tb, 0, "saquery -p");
    let path = |from: u16, to: u16| {
        paths.contains(&format!(
            "dlid....................{to}\n\t\tslid....................{from}\n"
        ))
    };
    assert!(
        path(1, 3) && !path(1, 2),
        "the SA has a path from node1 to node3, none to node2: {paths}"
    );

    // Restored one at a time: node2 is back through s2, then by the short way.
    set_link(&tb, S1_S2, true);
    assert!(
        pings_within(&mut tb, 0, 1, Duration::from_secs(10)),
        "node2 answers again"
    );
    assert_eq!(
        trace(&mut tb, 1, 2),
        [switch_lid(0), switch_lid(2), switch_lid(1)]
    );
    set_link(&tb, S0_S1, true);
    assert!(pings_within(&mut tb, 0, 1, Duration::from_secs(5)));
    assert_eq!(trace(&mut tb, 1, 2), [switch_lid(0), switch_lid(1)]);
    assert!(iblinkinfo_down(&mut tb, 0).is_empty());
    eprintln!(
        "switches: {:.1} s from boot to the last check",
        started.elapsed().as_secs_f64()
    );
}

/// ibnetdiscover finds the three switches, the three CAs and every cable, both ways (s0's
/// port 2 to s1's port 2, s1's 3 to s2's 2, s2's 3 to s0's 3; node n on port 1 of its
/// switch); the switches are named as cabled; each switch's forwarding table is min-hop
/// (one hop to either neighbour); ibtracert from node1 to node2 crosses s0 then s1.
fn the_tools_see_the_ring(tb: &mut Testbed) {
    let (switches, cas, links) = discover(tb, 0);
    let all: BTreeSet<u16> = (0..NODES as u16).map(switch_lid).collect();
    assert_eq!(switches, all);
    assert_eq!(cas, BTreeSet::from([1, 2, 3]));
    let (s0, s1, s2) = (switch_lid(0), switch_lid(1), switch_lid(2));
    let mut want = BTreeSet::new();
    for (a, b) in [
        (("SW", s0, 2), ("SW", s1, 2)),
        (("SW", s1, 3), ("SW", s2, 2)),
        (("SW", s2, 3), ("SW", s0, 3)),
        (("CA", 1, 1), ("SW", s0, 1)),
        (("CA", 2, 1), ("SW", s1, 1)),
        (("CA", 3, 1), ("SW", s2, 1)),
    ] {
        want.insert((a, b));
        want.insert((b, a));
    }
    assert_eq!(links, want, "ibnetdiscover's links");
    let desc = run(tb, 2, "smpquery nodedesc 49150; smpquery nodedesc 49149");
    assert!(
        desc.contains("hcabench switch s1") && desc.contains("hcabench switch s2"),
        "{desc}"
    );
    // Node n's LID leaves by the port toward its switch; each switch's LID too (0: itself).
    let tables = [
        [(1, 1), (2, 2), (3, 3)],
        [(1, 2), (2, 1), (3, 3)],
        [(1, 3), (2, 2), (3, 1)],
    ];
    let switch_ports = [[0, 2, 3], [2, 0, 3], [3, 2, 0]];
    for (sw, (lids, to_switches)) in tables.iter().zip(switch_ports).enumerate() {
        let table = ibroute(tb, sw, switch_lid(sw as u16));
        let mut want: Vec<(u16, u8)> = lids.to_vec();
        want.extend((0..NODES).map(|t| (switch_lid(t as u16), to_switches[t])));
        want.sort_unstable();
        assert_eq!(table, want, "s{sw}'s forwarding table");
    }
    assert_eq!(trace(tb, 1, 2), [s0, s1]);
}

/// Runs `cmd` on node `i` (from 0); its output, which must come with status 0.
fn run(tb: &mut Testbed, i: usize, cmd: &str) -> String {
    tb.agents[i]
        .run(cmd, T)
        .unwrap_or_else(|e| panic!("node{}: {e}", i + 1))
}

/// perfquery's PortCounters of port `port` of the switch at `lid`, asked from node `i`:
/// each field by its name.
fn perfquery(
    tb: &mut Testbed,
    i: usize,
    lid: u16,
    port: u8,
) -> std::collections::BTreeMap<String, u64> {
    let out = run(tb, i, &format!("perfquery {lid} {port}"));
    // `PortRcvPkts:.....................42`
    let fields: std::collections::BTreeMap<String, u64> = (out.lines())
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            Some((
                name.into(),
                value.trim_start_matches('.').trim().parse().ok()?,
            ))
        })
        .collect();
    assert!(fields.contains_key("PortRcvPkts"), "{out}");
    fields
}

/// Takes inter-switch link `link` down or up, as `hcabench link` does.
fn set_link(tb: &Testbed, link: usize, up: bool) {
    tb.fabric()
        .set_switch_link(link, up)
        .expect("the ring has the link");
}

/// Whether node `from` pings node `to` over IPoIB, `count` echoes a second apart (every
/// one answered).
fn pings(tb: &mut Testbed, from: usize, to: usize, count: u32) -> bool {
    let cmd = format!("ping -c {count} -W 1 {}", addr(to));
    let (status, out) = tb.agents[from].status(&cmd, T).unwrap();
    status == 0 && out.contains(&format!("{count} packets received"))
}

/// Whether node `from` gets an echo from node `to` within `limit`.
fn pings_within(tb: &mut Testbed, from: usize, to: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if pings(tb, from, to, 1) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
    }
}

/// The LIDs of the switches ibtracert finds from `slid` to `dlid` (run on node `slid`).
fn trace(tb: &mut Testbed, slid: u16, dlid: u16) -> Vec<u16> {
    let out = run(
        tb,
        usize::from(slid) - 1,
        &format!("ibtracert {slid} {dlid}"),
    );
    // `[1] -> switch port {0x0002c9030000bfff}[1] lid 49151-49151 "..."`
    out.lines()
        .filter(|l| l.contains("-> switch port"))
        .map(|l| {
            let lid = l.split(" lid ").nth(1).and_then(|r| r.split('-').next());
            lid.and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no LID in `{l}`: {out}"))
        })
        .collect()
}

/// ibroute's table of the switch at `lid` (asked from node `i`): (LID, out port) per valid
/// LID, in LID order.
fn ibroute(tb: &mut Testbed, i: usize, lid: u16) -> Vec<(u16, u8)> {
    let out = run(tb, i, &format!("ibroute {lid}"));
    // `0x0002 002 : (Channel Adapter portguid ...)`
    let table: Vec<(u16, u8)> = out
        .lines()
        .filter_map(|l| {
            let (lid, rest) = l.strip_prefix("0x")?.split_once(' ')?;
            let port = rest.split_whitespace().next()?;
            Some((u16::from_str_radix(lid, 16).ok()?, port.parse().ok()?))
        })
        .collect();
    assert!(
        out.contains(&format!("{} valid lids dumped", table.len())),
        "{out}"
    );
    table
}

/// A port in ibnetdiscover's words: its node's type ("SW" or "CA"), LID and port number.
type End = (&'static str, u16, u8);

/// `ibnetdiscover -p` on node `i`: the switches' LIDs, the CAs' LIDs, and every cable as
/// (this end, far end), once from each end.
fn discover(tb: &mut Testbed, i: usize) -> (BTreeSet<u16>, BTreeSet<u16>, BTreeSet<(End, End)>) {
    let out = run(tb, i, "ibnetdiscover -p");
    let end = |w: &[&str]| -> Option<End> {
        let kind = match *w.first()? {
            "SW" => "SW",
            "CA" => "CA",
            _ => return None,
        };
        Some((kind, w.get(1)?.parse().ok()?, w.get(2)?.parse().ok()?))
    };
    let (mut switches, mut cas, mut links) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    // `SW 49151  2 0x0002c9030000bfff 4x QDR - SW 49150  2 0x... ( 'desc' - 'desc' )`; a
    // port with no cable has no `-` and no far end.
    for line in out.lines() {
        let (here, there) = match line.split_once(" - ") {
            Some((h, t)) => (h, Some(t)),
            None => (line, None),
        };
        let Some(a) = end(&here.split_whitespace().collect::<Vec<_>>()) else {
            continue;
        };
        match a.0 {
            "SW" => switches.insert(a.1),
            _ => cas.insert(a.1),
        };
        if let Some(b) = there.and_then(|t| end(&t.split_whitespace().collect::<Vec<_>>())) {
            links.insert((a, b));
        }
    }
    (switches, cas, links)
}

/// The switch ports iblinkinfo (on node `i`) shows Down, as (switch LID, port).
fn iblinkinfo_down(tb: &mut Testbed, i: usize) -> BTreeSet<(u16, u8)> {
    let out = run(tb, i, "iblinkinfo");
    // `       49151    2[  ] ==(                Down/ Polling)==>             [  ] "" ( )`
    out.lines()
        .filter(|l| l.contains("Down/"))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let lid = w.next()?.parse().ok()?;
            let port = w.next()?.split('[').next()?.parse().ok()?;
            Some((lid, port))
        })
        .collect()
}
