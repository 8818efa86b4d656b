//! The subnet at scale, on the model alone (issue 48, "scale without VMs"): a two-level fat
//! tree (leaf-spine) whose leaves carry the HCA ports and whose spines join the leaves, each
//! leaf linked once to every spine, with a light port on every LID in place of a full HCA
//! (`tests/scale/mod.rs`). The default: 1,024 ports on 32 switches (16 leaves of 64 ports,
//! 16 spines, 256 inter-switch links), and 256 and 512 ports on 8 and 16 switches beside
//! it, to show how each figure grows. Measured, each over several repetitions (median and
//! min), on the manual clock:
//! - the SM's sweep: `Subnet::sweep` over every port; cabling a fabric and attaching every
//!   port (`Fabric::set_topology`, then `Fabric::attach` each); the re-sweep after a spine
//!   link is cut (`set_switch_link`, then the one tick that sweeps);
//! - every port's IPoIB broadcast join (MCMemberRecord Set) at once, all queued and then
//!   pumped: the time until every answer has arrived;
//! - PathRecord Gets from every port to others, by LIDs and by GIDs and P_Key (as IPoIB and
//!   rdma_cm ask): answers a second;
//! - unicast datagrams between random ports, across the switches: packets delivered a
//!   second, after a first pass that makes the fabric's queues (and beside it the same ports
//!   on the single switch, which has no route check); one broadcast datagram to every
//!   member of the group.
//!
//! Every answer and packet is checked (each join and path answered successfully, each
//! datagram at its destination only), and once per size: 10,000 random pairs and every
//! pair of 4 ports a leaf routed min-hop and delivered, and every entry of every switch's
//! forwarding table walked to its LID, before and after the cut.
//!
//! Run: `cargo bench -p hca-model --bench subnet`; options after `--`: `--ports 256,512,1024`
//! (each a multiple of `--per-leaf`), `--per-leaf 64`, `--spines N` (default: as many as
//! leaves), `--reps 7`, `--quick` (3 repetitions).

#[path = "../tests/scale/mod.rs"]
mod scale;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hca_model::abi::Lid;
use hca_model::fabric::TICK;
use hca_model::subnet::{Subnet, Topology};
use hca_model::Fabric;
use scale::*;

/// The targets on one core: a sweep of 1,024 ports, and 1,024 joins answered.
const TARGET: Duration = Duration::from_secs(1);

/// Datagrams each port sends in the forwarding measure.
const PER_PORT: usize = 64;
/// PathRecord Gets each port sends.
const PATHS_PER_PORT: usize = 16;
/// Broadcast datagrams timed (each fans out to every port).
const BROADCASTS: usize = 8;

/// One size's samples, a `Vec` per row.
#[derive(Default)]
struct Samples {
    sweep: Vec<Duration>,
    attach: Vec<Duration>,
    resweep: Vec<Duration>,
    joins: Vec<Duration>,
    path_lid: Vec<f64>,
    path_gid: Vec<f64>,
    unicast: Vec<f64>,
    single: Vec<f64>,
    broadcast: Vec<Duration>,
    /// Sweeps the fabric had made once every port was on it.
    sweeps: u64,
    /// Pairs checked end to end, and table entries walked.
    pairs: usize,
    entries: usize,
}

fn median_min<T: Copy + PartialOrd>(v: &[T]) -> (T, T) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (s[s.len() / 2], s[0])
}

/// The better of a rate's samples is the largest.
fn median_max(v: &[f64]) -> (f64, f64) {
    let (med, _) = median_min(v);
    (med, v.iter().copied().fold(0.0, f64::max))
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// One repetition on a fresh fabric; `check`: also the full correctness checks.
fn once(shape: &LeafSpine, check: bool, s: &mut Samples) {
    let n = shape.ports();
    let lids = shape.lids();
    let mut rng = Rng(0x48 + s.sweep.len() as u64);

    let mut subnet = Subnet::new(shape.topology(), &lids);
    let t = Instant::now();
    subnet.sweep(&lids);
    s.sweep.push(t.elapsed());

    let t = Instant::now();
    let fabric = cabled(shape);
    let ports = attach_all(&fabric, n);
    s.attach.push(t.elapsed());
    s.sweeps = fabric.subnet().sweeps();

    let t = Instant::now();
    queue_joins(&fabric, &ports);
    fabric.pump();
    s.joins.push(t.elapsed());
    check_joined(&fabric, &ports);

    for (by_gid, out) in [(false, &mut s.path_lid), (true, &mut s.path_gid)] {
        let t = Instant::now();
        let asked = queue_paths(&fabric, &ports, PATHS_PER_PORT, by_gid, &mut rng);
        fabric.pump();
        out.push(rate(n * PATHS_PER_PORT, t.elapsed()));
        check_all_paths(&ports, &asked);
    }

    let pairs = rng.pairs(n, n * PER_PORT);
    s.unicast.push(forward(&fabric, &ports, &pairs));

    let mlid = broadcast_mlid(&fabric);
    let t = Instant::now();
    for i in 0..BROADCASTS {
        let mut b = datagram(rng.lid(n), mlid, i as u32);
        b.dest_qpn = 0xff_ffff;
        fabric.enqueue(b);
        fabric.pump();
    }
    s.broadcast.push(t.elapsed() / BROADCASTS as u32);
    let got: usize = ports.iter().map(|p| p.take_got().len()).sum();
    assert_eq!(got, BROADCASTS * n, "every member got every broadcast");

    if check {
        let mut pairs = rng.pairs(n, 10_000);
        pairs.extend(all_pairs(&subset(shape, 4)));
        let subnet = fabric.subnet();
        check_routes(&subnet, shape, &[], &pairs);
        send_and_check(&fabric, &ports, &pairs);
        s.entries += check_tables(&subnet, shape, &[]);
        s.pairs += pairs.len();
    }

    // A leaf's link to a spine is cut; the SM sweeps at the next tick.
    let cut = [shape.link(shape.leaves - 1, 0)];
    fabric.set_switch_link(cut[0], false).unwrap();
    let t = Instant::now();
    fabric.advance(TICK);
    s.resweep.push(t.elapsed());
    let subnet = fabric.subnet();
    if check {
        let pairs = rng.pairs(n, 10_000);
        check_routes(&subnet, shape, &cut, &pairs);
        send_and_check(&fabric, &ports, &pairs);
        s.entries += check_tables(&subnet, shape, &cut);
        s.pairs += pairs.len();
    } else {
        assert!((0..1000).all(|_| {
            let (a, b) = (rng.lid(n), rng.lid(n));
            subnet.reaches(a, b)
        }));
    }
    drop(ports);

    // The same ports on the one switch of old: no route to check.
    let single = Fabric::with_manual_clock();
    single.set_topology(Topology::single());
    let ports = attach_all(&single, n);
    s.single.push(forward(&single, &ports, &pairs));
}

/// Datagrams for every pair, all queued, then pumped: delivered a second. Timed on the
/// second pass: the first makes the queues every (destination, source) pair needs.
fn forward(fabric: &Fabric, ports: &[Arc<Port>], pairs: &[(Lid, Lid)]) -> f64 {
    let mut per_s = 0.0;
    for _ in 0..2 {
        let t = Instant::now();
        for (tag, &(a, b)) in pairs.iter().enumerate() {
            fabric.enqueue(datagram(a, b, tag as u32));
        }
        fabric.pump();
        per_s = rate(pairs.len(), t.elapsed());
        let got: usize = ports.iter().map(|p| p.take_got().len()).sum();
        assert_eq!(got, pairs.len(), "every datagram delivered");
    }
    per_s
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).map(String::as_str)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let per_leaf: usize = arg(&args, "--per-leaf").map_or(64, |v| v.parse().unwrap());
    let sizes: Vec<usize> = arg(&args, "--ports").map_or(vec![256, 512, 1024], |v| {
        v.split(',').map(|n| n.parse().unwrap()).collect()
    });
    let reps: usize =
        arg(&args, "--reps").map_or(if quick { 3 } else { 7 }, |v| v.parse().unwrap());
    let spines: Option<usize> = arg(&args, "--spines").map(|v| v.parse().unwrap());

    let shapes: Vec<LeafSpine> = (sizes.iter())
        .map(|&n| {
            assert!(n % per_leaf == 0, "{n} ports: a multiple of {per_leaf}");
            let leaves = n / per_leaf;
            LeafSpine {
                leaves,
                spines: spines.unwrap_or(leaves),
                per_leaf,
            }
        })
        .collect();
    let samples: Vec<Samples> = (shapes.iter())
        .map(|shape| {
            let mut s = Samples::default();
            for rep in 0..reps {
                once(shape, rep == 0, &mut s);
            }
            s
        })
        .collect();

    println!(
        "Subnet at scale: a two-level fat tree (leaf-spine), {per_leaf} HCA ports a leaf, \
         every leaf linked once to every spine, the SM on leaf 0; light ports (no HCA), \
         manual clock, one thread. Median (best) of {reps} repetitions."
    );
    let w = 22;
    print!("{:<44}", "ports");
    for sh in &shapes {
        print!("{:>w$}", sh.ports());
    }
    println!();
    let row = |name: &str, cell: &dyn Fn(&LeafSpine, &Samples) -> String| {
        print!("{name:<44}");
        for (sh, s) in shapes.iter().zip(&samples) {
            print!("{:>w$}", cell(sh, s));
        }
        println!();
    };
    let time = |v: &[Duration]| {
        let (med, min) = median_min(v);
        format!("{} ({})", ms(med), ms(min))
    };
    let per_s = |v: &[f64], unit: f64| {
        let (med, max) = median_max(v);
        format!("{:.0} ({:.0})", med / unit, max / unit)
    };
    row("switches: leaves + spines, links", &|sh, _| {
        format!("{} + {}, {}", sh.leaves, sh.spines, sh.links())
    });
    row("Subnet::sweep, ms", &|_, s| time(&s.sweep));
    row("set_topology + attach every port, ms", &|_, s| {
        time(&s.attach)
    });
    row("  sweeps made by then", &|_, s| s.sweeps.to_string());
    row("re-sweep after a spine link cut (tick), ms", &|_, s| {
        time(&s.resweep)
    });
    row("every port joins at once: all answered, ms", &|_, s| {
        time(&s.joins)
    });
    row("PathRecord Get by LIDs, k/s", &|_, s| {
        per_s(&s.path_lid, 1e3)
    });
    row("PathRecord Get by GIDs + P_Key, k/s", &|_, s| {
        per_s(&s.path_gid, 1e3)
    });
    row("unicast datagrams across switches, k/s", &|_, s| {
        per_s(&s.unicast, 1e3)
    });
    row("  same ports on one switch (no routes), k/s", &|_, s| {
        per_s(&s.single, 1e3)
    });
    row("one broadcast to every port, ms", &|_, s| {
        time(&s.broadcast)
    });
    row("checked: pairs end to end, table entries", &|_, s| {
        format!("{}, {}", s.pairs, s.entries)
    });

    if let Some((sh, s)) = (shapes.iter().zip(&samples)).find(|(sh, _)| sh.ports() == 1024) {
        let med = |v: &[Duration]| median_min(v).0;
        let met = |d: Duration| if d < TARGET { "met" } else { "NOT met" };
        let (sweep, resweep) = (med(&s.sweep), med(&s.resweep));
        println!(
            "Targets (one core) at {} ports on {} switches, medians: an SM sweep under 1 s: {} \
             (Subnet::sweep {} ms, the fabric's re-sweep after a cut {} ms; bringing the \
             fabric up, each attach routing its own LID, {} ms); {} joins answered under 1 s: {} \
             ({} ms).",
            sh.ports(),
            sh.switches(),
            met(sweep.max(resweep)),
            ms(sweep),
            ms(resweep),
            ms(med(&s.attach)),
            sh.ports(),
            met(med(&s.joins)),
            ms(med(&s.joins))
        );
    }
}
