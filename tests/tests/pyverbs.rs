//! End-to-end: rdma-core's own test suite (pyverbs, `tests/run_tests.py`, as Debian 12's
//! python3-pyverbs ships it) on hcab0, and the same suite on SoftRoCE (rxe0) at the same
//! time on the other guest, as the control. Both guests lay the shared userland disk
//! (python3, pyverbs, the tests) under /usr with `userland-up`; hcab0's rdma_cm tests reach
//! their peer over IPoIB (ib0), rxe0's over the virtio-net link.
//!
//! Asserted: the suite ran whole on both devices; nothing fails or errors on hcab0; and each
//! test that passes on rxe0 passes on hcab0 too, or is skipped on hcab0 for a feature the
//! device does not have (ABSENT, each said in docs/user-verbs.md). The table of passed,
//! failed and skipped tests per test file, side by side, is printed either way.

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::verbs::Testbed;
use cluster::ClusterSpec;
use e2e::{image_or_skip, BOOT_TIMEOUT};

/// How long one run of the suite may take (about 10 s on hcab0 under TCG on 2 cores).
const SUITE_SECS: u32 = 600;
const T: Duration = Duration::from_secs(SUITE_SECS as u64 + 60);
/// Fewer tests than this in a run means the suite did not load (an import failed).
const MIN_TESTS: usize = 250;

/// Why hcab0 may skip a test rxe0 passes: the start of the suite's skip reason, and the
/// feature hcab0 lacks (each in docs/user-verbs.md).
const ABSENT: [(&str, &str); 1] = [
    // RoCE's own tests: hcab0's port is InfiniBand.
    (
        "Link layer of port=1 is InfiniBand",
        "an Ethernet link layer (RoCE)",
    ),
];

/// One test's outcome as unittest's verbose output says it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Pass,
    Skip(String),
    Fail,
    Error,
    /// "expected failure": passes for unittest.
    XFail,
    /// "unexpected success": fails for unittest.
    XPass,
}

impl Outcome {
    fn passed(&self) -> bool {
        matches!(self, Outcome::Pass | Outcome::XFail)
    }

    fn failed(&self) -> bool {
        matches!(self, Outcome::Fail | Outcome::Error | Outcome::XPass)
    }
}

/// Each test's outcome by its id (`tests.test_cq.CQAPITest.test_create_cq`), from
/// `run_tests.py -v`'s output. unittest writes `name (id)` and, for a test with a docstring,
/// the docstring's first line on a line of its own, then ` ... RESULT`; a test's own prints
/// may come before RESULT.
fn outcomes(log: &str) -> BTreeMap<String, Outcome> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        if let Some(id) = test_id(line) {
            current = Some(id.to_string());
        }
        // A test that prints leaves its result at the start of a later line.
        let result = match line.rsplit_once(" ... ") {
            Some((_, r)) => r,
            None if current.is_some() => line,
            None => continue,
        };
        let outcome = match result.trim_end() {
            "ok" => Outcome::Pass,
            "FAIL" => Outcome::Fail,
            "ERROR" => Outcome::Error,
            "expected failure" => Outcome::XFail,
            "unexpected success" => Outcome::XPass,
            r => match r.strip_prefix("skipped ") {
                Some(why) => Outcome::Skip(why.trim_matches(|c| c == '\'' || c == '"').into()),
                None => continue,
            },
        };
        if let Some(id) = current.take() {
            out.insert(id, outcome);
        }
    }
    out
}

/// The id in a line that starts `test_name (tests.module.Class.test_name)`.
fn test_id(line: &str) -> Option<&str> {
    let (name, rest) = line.split_once(" (")?;
    let id = &rest[..rest.find(')')?];
    let ok = name.chars().all(|c| c.is_alphanumeric() || c == '_')
        && id.starts_with("tests.")
        && id.ends_with(name);
    ok.then_some(id)
}

/// The last `n` lines of a log.
fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The test file of an id: `test_cq` of `tests.test_cq.CQAPITest.test_create_cq`.
fn file_of(id: &str) -> &str {
    id.split('.').nth(1).unwrap_or(id)
}

/// Passed, failed, skipped per test file, for each device, side by side.
fn table(runs: &[(&str, &BTreeMap<String, Outcome>)]) -> String {
    let mut files: BTreeMap<&str, Vec<[usize; 3]>> = BTreeMap::new();
    for (i, (_, run)) in runs.iter().enumerate() {
        for (id, o) in run.iter() {
            let row = files
                .entry(file_of(id))
                .or_insert_with(|| vec![[0; 3]; runs.len()]);
            let col = if o.passed() {
                0
            } else if o.failed() {
                1
            } else {
                2
            };
            row[i][col] += 1;
        }
    }
    let mut s = format!("{:<28}", "test file (pass/fail/skip)");
    for (dev, _) in runs {
        s += &format!(" {dev:>14}");
    }
    s.push('\n');
    let mut totals = vec![[0; 3]; runs.len()];
    for (file, row) in &files {
        s += &format!("{file:<28}");
        for (i, c) in row.iter().enumerate() {
            s += &format!(" {:>14}", format!("{}/{}/{}", c[0], c[1], c[2]));
            for k in 0..3 {
                totals[i][k] += c[k];
            }
        }
        s.push('\n');
    }
    s += &format!("{:<28}", "total");
    for c in &totals {
        s += &format!(" {:>14}", format!("{}/{}/{}", c[0], c[1], c[2]));
    }
    s + "\n"
}

/// What is wrong with hcab0's run against rxe0's (empty: nothing).
fn verdict(hcab: &BTreeMap<String, Outcome>, rxe: &BTreeMap<String, Outcome>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (dev, run) in [("hcab0", hcab), ("rxe0", rxe)] {
        if run.len() < MIN_TESTS {
            wrong.push(format!(
                "{dev}: only {} tests reported (the suite has about 270)",
                run.len()
            ));
        }
    }
    for (id, o) in hcab {
        if o.failed() {
            wrong.push(format!("{id}: {o:?} on hcab0"));
            continue;
        }
        if o.passed() || !rxe.get(id).is_some_and(Outcome::passed) {
            continue;
        }
        let explained = match o {
            Outcome::Skip(why) => ABSENT.iter().any(|(start, _)| why.starts_with(start)),
            _ => false,
        };
        if !explained {
            wrong.push(format!("{id}: passes on rxe0, {o:?} on hcab0"));
        }
    }
    wrong
}

#[test]
fn test_pyverbs_suite_on_hcab0_beside_softroce() {
    let Some(image) = image_or_skip("pyverbs") else {
        return;
    };
    assert!(
        image.userland.is_some(),
        "image {} has no userland.img (images/build.py makes it): no python3 or pyverbs \
         in the guests",
        image.name
    );
    // Python and the suite's processes want more than the default 256 MiB (rxe0's run was
    // killed for memory there).
    let spec = ClusterSpec {
        link: true,
        ram_mib: 1024,
        ..e2e::qemu_spec(&image, "pyverbs", 2)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();
    tb.rxe_up()
        .unwrap_or_else(|e| panic!("rxe-up: {e}\n{}", tb.console(0)));
    tb.ipoib_up()
        .unwrap_or_else(|e| panic!("ipoib-up: {e}\n{}", tb.console(0)));
    for a in tb.agents.iter_mut() {
        let out = a
            .run(
                "userland-up && python3 -c 'import pyverbs; print(\"pyverbs\")'",
                T,
            )
            .unwrap_or_else(|e| panic!("userland-up on {}: {e}", a.name));
        assert!(out.contains("pyverbs"), "{}: no pyverbs: {out}", a.name);
    }
    // The tests pair a device with its interface through sysfs (the PCI device's net/)
    // and read its address with iproute2's `ip -j` (the disk's: busybox's shell runs its
    // own `ip` whatever PATH says, so this asks as the tests do, from Python).
    for (a, dev, ifname) in [("hcab0", "ib0"), ("rxe0", "eth0")]
        .into_iter()
        .zip(tb.agents.iter_mut())
        .map(|((d, i), a)| (a, d, i))
    {
        let out = a
            .run(
                &format!(
                    "ls /sys/class/infiniband/{dev}/device/net; \
                     PATH=/usr/sbin:/usr/bin:/bin python3 -c \"import subprocess; \
                     print(subprocess.check_output(['ip', '-j', 'addr', 'show', '{ifname}']))\"; \
                     echo \" rc=$?\""
                ),
                T,
            )
            .unwrap();
        assert!(
            out.contains(ifname) && out.contains("\"local\"") && out.ends_with(" rc=0\n"),
            "{}: {dev}'s interface {ifname} as the tests find it:\n{out}",
            a.name
        );
    }
    let suite = |dev: &str| {
        format!(
            "cd /tmp && PATH=/usr/sbin:/usr/bin:/bin timeout -s KILL {SUITE_SECS} \
             python3 /usr/share/rdma-core/tests/run_tests.py --dev {dev} -v \
             > /tmp/pyverbs-{dev}.log 2>&1; echo \"PV-EXIT $?\" >> /tmp/pyverbs-{dev}.log"
        )
    };
    // rxe0's run in the background on node 2, hcab0's on node 1 meanwhile.
    tb.agents[1]
        .run(&format!("({}) > /dev/null 2>&1 &", suite("rxe0")), T)
        .unwrap();
    tb.agents[0].run(&suite("hcab0"), T).unwrap();
    let hcab_log = tb.agents[0].run("cat /tmp/pyverbs-hcab0.log", T).unwrap();
    let rxe_log = tb.agents[1]
        .run(
            &format!(
                "for i in $(seq {}); do grep -q '^PV-EXIT' /tmp/pyverbs-rxe0.log && break; \
                 sleep 1; done; cat /tmp/pyverbs-rxe0.log",
                SUITE_SECS + 30
            ),
            T,
        )
        .unwrap();
    let (hcab, rxe) = (outcomes(&hcab_log), outcomes(&rxe_log));
    if rxe.len() < MIN_TESTS {
        eprintln!("--- end of rxe0's log ---\n{}", tail(&rxe_log, 40));
    }
    eprintln!("{}", table(&[("hcab0", &hcab), ("rxe0", &rxe)]));
    for (id, o) in &rxe {
        if o.failed() {
            eprintln!("note: rxe0: {id}: {o:?}");
        }
        match hcab.get(id) {
            Some(Outcome::Skip(why)) if o.passed() => {
                eprintln!("note: passes on rxe0 only: {id}: hcab0 skips: {why}")
            }
            _ => {}
        }
    }
    let wrong = verdict(&hcab, &rxe);
    if !wrong.is_empty() {
        panic!(
            "pyverbs on hcab0:\n  {}\n--- end of hcab0's log ---\n{}",
            wrong.join("\n  "),
            tail(&hcab_log, 60)
        );
    }
}

#[test]
fn the_parser_reads_unittest_verbose_output() {
    let log = "\
test_create_cq (tests.test_cq.CQAPITest.test_create_cq) ... ok
test_create_cq_bad_flow (tests.test_cq.CQAPITest.test_create_cq_bad_flow)
Test ibv_create_cq() with wrong comp_vector / number of cqes ... ok
test_resize_cq (tests.test_cq.CQTest.test_resize_cq)
Test resize CQ ... skipped 'Frobnication is not supported'
test_fork (tests.test_fork.ForkAPITest.test_fork) ... is_fork_initialized() = 2
FAIL
test_mr_rereg (tests.test_mr.MRTest.test_mr_rereg) ... ERROR
----------------------------------------------------------------------
Ran 5 tests in 1.788s
";
    let o = outcomes(log);
    assert_eq!(o.len(), 5, "{o:?}");
    assert_eq!(o["tests.test_cq.CQAPITest.test_create_cq"], Outcome::Pass);
    assert_eq!(
        o["tests.test_cq.CQAPITest.test_create_cq_bad_flow"],
        Outcome::Pass
    );
    assert_eq!(
        o["tests.test_cq.CQTest.test_resize_cq"],
        Outcome::Skip("Frobnication is not supported".into())
    );
    assert_eq!(o["tests.test_mr.MRTest.test_mr_rereg"], Outcome::Error);
    assert_eq!(file_of("tests.test_cq.CQTest.test_resize_cq"), "test_cq");
    let rxe: BTreeMap<String, Outcome> = o.keys().map(|k| (k.clone(), Outcome::Pass)).collect();
    let wrong = verdict(&o, &rxe);
    // Too few tests on both, the error, and a skip for no listed reason that rxe0 passes.
    assert!(
        wrong.iter().any(|w| w.contains("test_mr_rereg")),
        "{wrong:?}"
    );
    assert!(
        wrong.iter().any(|w| w.contains("test_resize_cq")),
        "{wrong:?}"
    );
    assert!(!wrong.iter().any(|w| w.contains("bad_flow")), "{wrong:?}");
    assert!(table(&[("hcab0", &o), ("rxe0", &rxe)]).contains("test_cq"));
}
