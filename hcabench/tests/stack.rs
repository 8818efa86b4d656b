//! `hcabench bench stack`: its options refused before anything boots, its --help, and a
//! short run on two QEMU guests whose tables must have every layer with measured figures.

use common::{hcabench, text};
use e2e::{image_or_skip, repo_root};

mod common;

/// The rows every run has under QEMU (MPI's only with --mpi).
const LATENCY_ROWS: [&str; 8] = [
    "kernel verbs",
    "user verbs",
    "TCP ib0 datagram",
    "TCP ib0 connected",
    "TIPC RDM",
    "TIPC stream",
    "RDS",
    "TCP virtio-net",
];

#[test]
fn test_bench_stack_refuses_bad_options_and_explains_its_columns() {
    let dir = std::env::temp_dir().join(format!("hcab-stack-cli-{}", std::process::id()));
    for (args, says) in [
        (&["--rounds", "5"][..], "--rounds 5 is outside 10..=100000"),
        (
            &["--sizes", "1024,0"][..],
            "bandwidth size 0 is outside 1..=1048576",
        ),
        (&["--sizes", "2097152"][..], "outside 1..=1048576"),
        (&["--bw-bytes", "0"][..], "--bw-bytes 0 is outside"),
        (&["--iters", "5"][..], "unexpected argument '--iters'"),
    ] {
        let o = hcabench(&dir, &[&["bench", "stack"][..], args].concat());
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("booting"), "{args:?}: {}", text(&o));
    }
    let help = hcabench(&dir, &["bench", "stack", "--help"]);
    assert!(help.status.success(), "{}", text(&help));
    let help = text(&help);
    for row in LATENCY_ROWS.iter().chain(&["MPI / UCX", "MPI / TCP ib0"]) {
        assert!(help.contains(row), "--help says nothing of {row}: {help}");
    }
    for opt in ["--rounds", "--sizes", "--bw-bytes", "--mpi"] {
        assert!(help.contains(opt), "{opt}: {help}");
    }
}

/// The figures of `name`'s row in the table that starts with `title`: the words after the
/// name, up to the table's end (a blank line).
fn row(out: &str, title: &str, name: &str) -> Option<Vec<String>> {
    let table = out.split(title).nth(1)?;
    let table = table.split("\n\n").next()?;
    let line = table
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with("  "))?;
    Some(
        line[name.len()..]
            .split_whitespace()
            .map(String::from)
            .collect(),
    )
}

fn positive(w: &str) -> bool {
    w.trim_matches(|c| c == '(' || c == ')')
        .parse::<f64>()
        .is_ok_and(|v| v > 0.0)
}

#[test]
fn test_bench_stack_measures_every_layer_on_two_guests() {
    let Some(_image) = image_or_skip("bench stack") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("hcab-stack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("cluster.toml");
    let images = repo_root().join("target/images");
    std::fs::write(&cfg, format!("image_dir = {images:?}\n")).unwrap();
    let o = hcabench(
        &dir,
        &[
            "bench",
            "stack",
            "--backend",
            "qemu",
            "--config",
            cfg.to_str().unwrap(),
            "--rounds",
            "30",
            "--sizes",
            "4096,65536",
            "--bw-bytes",
            "262144",
        ],
    );
    let out = text(&o);
    eprintln!("{out}");
    assert!(o.status.success(), "{out}");
    for name in LATENCY_ROWS {
        let lat = row(&out, "one-byte ping-pong", name)
            .unwrap_or_else(|| panic!("no latency row for {name}:\n{out}"));
        // mean, median, ratio of means, ratio of medians: all measured.
        assert_eq!(lat.len(), 4, "{name}: {lat:?}");
        assert!(lat.iter().all(|w| positive(w)), "{name}: {lat:?}");
        if name == "TIPC RDM" {
            continue;
        }
        let bw = row(&out, "bandwidth by message size", name)
            .unwrap_or_else(|| panic!("no bandwidth row for {name}:\n{out}"));
        // MB/s and its ratio at each of the two sizes.
        assert_eq!(bw.len(), 4, "{name}: {bw:?}");
        assert!(bw.iter().all(|w| positive(w)), "{name}: {bw:?}");
    }
    let kernel = row(&out, "one-byte ping-pong", "kernel verbs").unwrap();
    assert_eq!(kernel[2..], ["1.00", "1.00"], "kernel verbs is the base");
}
