//! Every input the fuzzer kept (`fuzz/corpus/TARGET/`, minimised with `cargo fuzz cmin`),
//! replayed through its target on the stable toolchain: a fix that breaks what a target
//! asserts, or an input that once found a bug, fails here without nightly or libFuzzer.

use std::path::PathBuf;

use hcabench_fuzz_harness::common::FULL_CHECK;
use hcabench_fuzz_harness::{
    cluster_config, device, fault_plan, pci, remote, replay, responder, sa,
};

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the corpora are committed)", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: empty corpus", dir.display());
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// Replays a target's corpus; most inputs must decode (else the corpus is for another
/// version of the target's input type).
fn replay_all(target: &str, run: impl Fn(&[u8]) -> bool) {
    FULL_CHECK.set(true);
    let inputs = corpus(target);
    let ran = inputs
        .iter()
        .filter(|(p, bytes)| {
            eprintln!("{target}: {}", p.display());
            run(bytes)
        })
        .count();
    println!("{target}: {ran} of {} inputs replayed", inputs.len());
    assert!(
        ran * 2 >= inputs.len(),
        "{target}: only {ran} of {} decode",
        inputs.len()
    );
}

#[test]
fn test_remote_corpus() {
    replay_all("remote", |b| replay::<remote::Input>(b, remote::run));
}

#[test]
fn test_device_corpus() {
    replay_all("device", |b| replay::<device::Input>(b, device::run));
}

#[test]
fn test_responder_corpus() {
    replay_all("responder", |b| {
        replay::<responder::Input>(b, responder::run)
    });
}

/// Runs up to `n` of a target's inputs in corpus order, then in reverse order: each ends
/// in the same state both times (guest memory and BAR2 alike), so that nothing a run leaves
/// in the memory or the thread it shares with the next one changes what the next one does.
fn same_in_either_order(target: &str, n: usize, run: impl Fn(&[u8]) -> Option<u64>) {
    let inputs: Vec<_> = corpus(target).into_iter().take(n).collect();
    let forward: Vec<_> = inputs.iter().map(|(_, b)| run(b)).collect();
    for (i, (p, bytes)) in inputs.iter().enumerate().rev() {
        assert_eq!(run(bytes), forward[i], "{}: another end state", p.display());
    }
}

#[test]
fn test_device_runs_do_not_depend_on_the_runs_before() {
    same_in_either_order("device", 64, |b| {
        let mut f = None;
        replay::<device::Input>(b, |i| f = Some(device::run_fingerprint(i)));
        f
    });
}

#[test]
fn test_responder_runs_do_not_depend_on_the_runs_before() {
    same_in_either_order("responder", 64, |b| {
        let mut f = None;
        replay::<responder::Input>(b, |i| f = Some(responder::run_fingerprint(i)));
        f
    });
}

#[test]
fn test_sa_corpus() {
    replay_all("sa", |b| replay::<sa::Input>(b, sa::run));
}

#[test]
fn test_fault_plan_corpus() {
    replay_all("fault_plan", |b| {
        replay::<fault_plan::Input>(b, fault_plan::run)
    });
}

#[test]
fn test_pci_corpus() {
    replay_all("pci", |b| replay::<pci::Input>(b, pci::run));
}

#[test]
fn test_cluster_config_corpus() {
    replay_all("cluster_config", |b| {
        replay::<cluster_config::Input>(b, cluster_config::run)
    });
}
