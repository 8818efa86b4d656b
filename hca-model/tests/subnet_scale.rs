//! A subnet at scale on the model alone (no VM, no full HCA): a leaf-spine fabric of
//! hundreds of ports on many switches. Every port's IPoIB join, all at once, is answered;
//! datagrams reach their destination and no other port, by min-hop routes; every entry of
//! every switch's forwarding table leads to its LID; and a spine link cut is routed around
//! at the SM's next sweep with every pair still reachable. Timings are the bench's
//! (`benches/subnet.rs`); this checks behaviour only.

mod scale;

use hca_model::fabric::TICK;
use hca_model::subnet::Peer;
use hca_model::Lid;
use scale::*;

/// 512 ports on 16 switches: 8 leaves of 64 and 8 spines. The bench's 1,024 on 32 is the
/// same cabling twice as wide; this size keeps a debug build's run to seconds (attaching
/// costs a sweep per port, and the sweep grows with switches x LIDs x spines).
const SHAPE: LeafSpine = LeafSpine {
    leaves: 8,
    spines: 8,
    per_leaf: 64,
};

#[test]
fn test_every_port_joins_at_once_and_datagrams_follow_min_hop_routes_to_their_port_only() {
    let fabric = cabled(&SHAPE);
    let ports = attach_all(&fabric, SHAPE.ports());
    assert_eq!(fabric.subnet().topology().links().len(), SHAPE.links());
    queue_joins(&fabric, &ports);
    fabric.pump();
    check_joined(&fabric, &ports);
    let mut rng = Rng(48);
    for by_gid in [false, true] {
        let asked = queue_paths(&fabric, &ports, 4, by_gid, &mut rng);
        fabric.pump();
        check_all_paths(&ports, &asked);
    }

    let subnet = fabric.subnet();
    let mut pairs = rng.pairs(SHAPE.ports(), 10_000);
    pairs.extend(all_pairs(&subset(&SHAPE, 4)));
    check_routes(&subnet, &SHAPE, &[], &pairs);
    send_and_check(&fabric, &ports, &pairs);
    check_tables(&subnet, &SHAPE, &[]);
    assert_eq!(fabric.stats().unrouted, 0);

    // Each leaf spreads the LIDs of the other leaves evenly over its uplinks.
    for leaf in 0..SHAPE.leaves {
        let mut per_uplink = vec![0usize; SHAPE.spines];
        for lid in SHAPE.lids() {
            if SHAPE.leaf_of(lid) == leaf {
                continue;
            }
            match subnet.peer(leaf, subnet.out_port(leaf, lid)) {
                Peer::Switch { sw, .. } => per_uplink[sw - SHAPE.leaves] += 1,
                other => panic!("leaf {leaf} sends LID {lid} to {other:?}"),
            }
        }
        let (min, max) = (per_uplink.iter().min(), per_uplink.iter().max());
        assert!(
            max.unwrap() - min.unwrap() <= 1,
            "leaf {leaf}: {per_uplink:?}"
        );
    }
}

#[test]
fn test_a_spine_link_cut_is_swept_around_and_every_pair_still_reaches() {
    let fabric = cabled(&SHAPE);
    let ports = attach_all(&fabric, SHAPE.ports());
    // Leaf 1's link to spine 0, and the SM's leaf's link to the last spine.
    let cut = [SHAPE.link(1, 0), SHAPE.link(0, SHAPE.spines - 1)];
    for &link in &cut {
        fabric.set_switch_link(link, false).unwrap();
    }
    // Until the SM sweeps, the old tables still send some LIDs over the cut links, and
    // what goes that way is lost (its sender hears of it).
    let stale = fabric.subnet();
    let lids = SHAPE.lids();
    let (a, b) = (lids.iter())
        .flat_map(|&a| lids.iter().map(move |&b| (a, b)))
        .find(|&(a, b)| a != b && !stale.reaches(a, b))
        .expect("the cut links carried routes");
    fabric.enqueue(datagram(a, b, 0));
    fabric.pump();
    assert_eq!(fabric.stats().unrouted, 1);
    assert_eq!(ports[usize::from(a) - 1].lost(), 1);
    assert!(ports[usize::from(b) - 1].take_got().is_empty());

    let sweeps = stale.sweeps();
    fabric.advance(TICK);
    let subnet = fabric.subnet();
    assert_eq!(subnet.sweeps(), sweeps + 1, "one sweep, at the tick");
    for &a in &lids {
        for &b in &lids {
            assert!(a == b || subnet.reaches(a, b), "{a} reaches {b}");
        }
    }
    check_tables(&subnet, &SHAPE, &cut);
    let mut pairs = Rng(65).pairs(SHAPE.ports(), 10_000);
    // Every pair to and from the leaves that lost a link.
    let near_cut: Vec<Lid> = (lids.iter().copied())
        .filter(|&l| SHAPE.leaf_of(l) <= 1)
        .step_by(8)
        .collect();
    pairs.extend(all_pairs(&near_cut));
    check_routes(&subnet, &SHAPE, &cut, &pairs);
    send_and_check(&fabric, &ports, &pairs);
    queue_joins(&fabric, &ports);
    fabric.pump();
    check_joined(&fabric, &ports);

    // Back up: the next sweep uses the links again.
    for &link in &cut {
        fabric.set_switch_link(link, true).unwrap();
    }
    fabric.advance(TICK);
    check_tables(&fabric.subnet(), &SHAPE, &[]);
}
