//! End-to-end: the real user-level DSM (libdsm's udsm.c: the protocol in each application
//! process over libibverbs on hcab0, SIGSEGV and mprotect for faults, no kernel DSM) on
//! two 2-vCPU QEMU guests, one booted cluster for every check. Every application at the
//! sizes `hcabench bench apps` runs, with its service thread on a completion channel,
//! each checked against a sequential run on node 1; two of them again with two threads
//! per node and the polling service thread; and the sequential-consistency litmus tests with
//! one thread per node (completion channel) and two (polling).

use std::time::Duration;

use cluster::dsm::AppResult;
use cluster::udsm::{run_app_user, run_user_ok, Service};
use cluster::verbs::Testbed;
use e2e::{image_or_skip, BOOT_TIMEOUT};

/// Each application with `hcabench bench apps`'s arguments (apps_bench::bench_args).
const APPS: [(&str, &str); 8] = [
    ("sor", "130 1024 8"),
    ("is", "65536 1024 2"),
    ("lu", "128"),
    ("tsp", "9"),
    ("nbody", "192 3"),
    ("nbodyw", "128 3"),
    ("water", "64 3"),
    ("barnes", "192 2"),
];

const RUN: Duration = Duration::from_secs(600);

fn num(line: &str, key: &str) -> u64 {
    cluster::verbs::num(line, key).unwrap()
}

/// Runs `app` and checks node 1 verified it and every node really shared pages.
fn verified(tb: &mut Testbed, app: &str, args: &str, threads: u32, service: Service) {
    let cmd = format!("DSM_THREADS={threads} {app} {args}");
    let res: Vec<AppResult> = run_app_user(&mut tb.agents, &cmd, "hcab0", service, RUN)
        .unwrap_or_else(|e| panic!("{cmd} ({service:?}): {e}"));
    eprintln!("dsm_user: {cmd} ({service:?}): {}", res[0].line);
    assert_eq!(res[0].verified, Some(true), "{cmd}: {}", res[0].line);
    for r in &res {
        assert!(
            r.line.contains(&format!("threads={threads} ")),
            "{}",
            r.line
        );
        // Every node faulted, moved page data and handled messages itself (no kernel DSM:
        // every message counts as handled by its service thread).
        assert!(
            r.read_faults + r.write_faults > 0 && r.data_bytes > 0 && r.process > 0,
            "{cmd}: {}",
            r.line
        );
        assert_eq!(r.irq, 0, "{cmd}: {}", r.line);
    }
}

#[test]
fn test_user_level_dsm_runs_every_app_verified() {
    let Some(image) = image_or_skip("dsm_user") else {
        return;
    };
    let spec = cluster::ClusterSpec {
        vcpus: 2,
        ..e2e::qemu_spec(&image, "dsm_user", 2)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();
    // No kernel DSM session is open: the applications cannot be using dsm.ko.
    for a in tb.agents.iter_mut() {
        let s = a
            .run("dsmctl state 2>&1; true", Duration::from_secs(30))
            .unwrap();
        assert!(
            !s.contains(":qp="),
            "{}: a kernel DSM session is open: {s}",
            a.name
        );
    }

    for (app, args) in APPS {
        verified(&mut tb, app, args, 1, Service::Channel);
    }
    // Two threads per node (faults on one page from two threads, locks queued locally,
    // the hierarchical barrier) with the polling service thread.
    verified(&mut tb, "water", "64 3", 2, Service::Poll);
    verified(&mut tb, "is", "65536 1024 2", 2, Service::Poll);

    litmus(&mut tb, 1, Service::Channel);
    litmus(&mut tb, 2, Service::Poll);
}

/// The sequential-consistency litmus tests with `threads` workers per node: no violation,
/// and an mp reader that really raced the writer.
fn litmus(tb: &mut Testbed, threads: u32, service: Service) {
    let cmd = format!("DSM_THREADS={threads} litmus 40");
    let outs = run_user_ok(&mut tb.agents, &cmd, "hcab0", service, RUN)
        .unwrap_or_else(|e| panic!("{cmd} ({service:?}): {e}"));
    assert!(
        outs.iter()
            .flat_map(|t| t.lines())
            .filter(|l| l.starts_with("LITMUS-MP"))
            .any(|l| num(l, "reads") > 1),
        "{cmd}: no mp reader read more than once: {outs:?}"
    );
    for (i, text) in outs.iter().enumerate() {
        for test in ["mp", "sb", "counter", "barrier"] {
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("LITMUS test={test} ")))
                .collect();
            assert_eq!(
                lines.len(),
                threads as usize,
                "node{}: {cmd}: {test}: one line per worker:\n{text}",
                i + 1
            );
            for line in lines {
                assert_eq!(num(line, "violations"), 0, "node{}: {cmd}: {line}", i + 1);
            }
        }
    }
}
