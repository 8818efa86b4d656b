use super::draw::{uniform, Draw};
use super::*;
use crate::fabric::{LinkDir, LinkId};

#[test]
fn test_plans_parse_and_bad_ones_say_why() {
    let p = FaultPlan::parse(
        "seed = 7\n[[link]]\nlid = 2\ndir = \"up\"\ndrop = 0.5\ndown = [[10.0, 20.0]]\n",
    )
    .unwrap();
    assert_eq!(
        (p.seed, p.links[0].lid, p.links[0].dir),
        (7, Some(2), Dirs::Up)
    );
    let e = FaultPlan::parse("[[link]]\ndrop = 1.5")
        .unwrap_err()
        .to_string();
    assert!(e.contains("drop = 1.5"), "{e}");
    let e = FaultPlan::parse("[[link]]\ndown = [[5.0, 1.0]]")
        .unwrap_err()
        .to_string();
    assert!(e.contains("down window"), "{e}");
    let e = FaultPlan::parse("[[link]]\ndorp = 0.1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("dorp"), "{e}");
}

/// The plan README.md shows is a valid one.
#[test]
fn test_the_readme_plan_parses() {
    let readme = include_str!("../../../README.md");
    let block = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("README has a toml block");
    let p = FaultPlan::parse(block).unwrap();
    assert_eq!((p.links.len(), p.nodes.len(), p.adapters.len()), (1, 1, 1));
    assert_eq!(p.adapters[0].error_wqe, Some(100));
    let e = FaultPlan::parse("[[adapter]]\nerror_wqe = 0")
        .unwrap_err()
        .to_string();
    assert!(e.contains("counts from 1"), "{e}");
    let e = FaultPlan::parse("[[node]]\nlid = 0\nkill_ms = 1.0")
        .unwrap_err()
        .to_string();
    assert!(e.contains("node 1"), "{e}");
}

#[test]
fn test_draws_are_uniform_enough_and_depend_on_every_input() {
    let link = LinkId {
        lid: 1,
        dir: LinkDir::Up,
    };
    let n = 100_000;
    let link = Stream::Link(link);
    let hits = (0..n)
        .filter(|&i| uniform(3, link, i, Draw::Drop) < 0.01)
        .count();
    assert!((800..1200).contains(&hits), "{hits} of {n} under 1%");
    let a = uniform(3, link, 5, Draw::Drop);
    assert_ne!(a, uniform(4, link, 5, Draw::Drop));
    assert_ne!(a, uniform(3, link, 6, Draw::Drop));
    assert_ne!(a, uniform(3, link, 5, Draw::Duplicate));
    let down = LinkId {
        lid: 1,
        dir: LinkDir::Down,
    };
    assert_ne!(a, uniform(3, Stream::Link(down), 5, Draw::Drop));
    assert_ne!(a, uniform(3, Stream::Doorbell(1), 5, Draw::Drop));
}
