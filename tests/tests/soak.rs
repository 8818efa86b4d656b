//! The soak of issue 49: the DSM's applications, IPoIB, NVMe-oF and RDS at once on four QEMU
//! guests, beside CPU hogs on the host that starve them, for `SOAK_SECS` (default 120, the
//! short form CI runs), every result checked:
//! - node1 fetches node4's 4 MiB file over TCP on ib0 again and again, its md5 checked;
//! - node3 writes 8 MiB of random bytes to node4's NVMe-oF namespace and reads them back;
//! - node2 sends RDS messages to node1's echo server, every echo checked;
//! - all four run the DSM's eight applications in turn, each verified against its
//!   sequential run;
//! - one busy thread per host core competes with the guests.
//!
//! Any failed check, a DSM run that fails, or a kernel warning, oops or hung task in a guest
//! fails it, and it prints what each workload did. By hand, for half an hour:
//! `SOAK_SECS=1800 cargo test --release -p e2e --test soak -- --nocapture`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::dsm::{close_all, configure, connect_mesh, run_app, settle};
use cluster::verbs::Testbed;
use e2e::{image_or_skip, BOOT_TIMEOUT, RXE_DSM_APPS};

const T: Duration = Duration::from_secs(300);
const RDS_PORT: u16 = 18634;

/// A check a guest runs in a loop until told to stop: `name`, on node `node` (from 0), as a
/// shell condition.
struct Workload {
    name: &'static str,
    node: usize,
    check: String,
}

impl Workload {
    fn log(&self) -> String {
        format!("/tmp/soak-{}.log", self.name)
    }

    /// Starts the loop in the background: a line per round, `ok N` or `FAIL N`, and `done`
    /// once /tmp/soak.stop appears.
    fn start(&self, tb: &mut Testbed) {
        let script = format!(
            "(i=0; while [ ! -e /tmp/soak.stop ]; do i=$((i+1)); \
             if {}; then echo \"ok $i\"; else echo \"FAIL $i $(cat /proc/uptime)\"; fi; \
             done; echo done) > {} 2>&1 &",
            self.check,
            self.log()
        );
        tb.agents[self.node].run(&script, T).unwrap();
    }

    /// The rounds that passed and the lines of those that failed, once the loop ended (or
    /// after 5 minutes of waiting for its last round).
    fn result(&self, tb: &mut Testbed) -> (usize, Vec<String>, bool) {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let out = tb.agents[self.node]
                .run(&format!("cat {}", self.log()), T)
                .unwrap();
            let done = out.lines().any(|l| l == "done");
            if done || Instant::now() > deadline {
                let ok = out.lines().filter(|l| l.starts_with("ok ")).count();
                let failed = out
                    .lines()
                    .filter(|l| !l.starts_with("ok ") && *l != "done")
                    .map(str::to_string)
                    .collect();
                return (ok, failed, done);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// One busy thread per host core until `stop`.
fn cpu_hogs(stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (0..cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect()
}

#[test]
fn test_dsm_ipoib_nvme_and_rds_together_beside_cpu_hogs() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let Some(image) = image_or_skip("soak") else {
        return;
    };
    let spec = e2e::qemu_spec(&image, "soak", 4);
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |m| eprintln!("  {m}")).unwrap();
    for i in 0..4 {
        tb.agents[i]
            .run(&format!("ipoib-up 10.78.0.{}/24", i + 1), T)
            .unwrap();
    }
    // node4 serves a file over TCP and a RAM disk over NVMe-oF; node1 echoes RDS.
    let sum = tb.agents[3]
        .run(
            "dd if=/dev/urandom of=/tmp/blob bs=1M count=4 2>/dev/null && \
             md5sum < /tmp/blob && httpd -p 8080 -h /tmp",
            T,
        )
        .unwrap();
    let sum = sum.split_whitespace().next().unwrap_or("").to_string();
    assert_eq!(sum.len(), 32, "{sum}");
    let target = tb.agents[3].run("nvmeof target 32", T).unwrap();
    assert!(target.contains("at rdma 10.78.0.4:4420"), "{target}");
    let nvme = tb.agents[2].run("nvmeof connect 10.78.0.4", T).unwrap();
    let nvme = nvme.trim().to_string();
    assert!(nvme.starts_with("nvme"), "{nvme}");
    for i in [0, 1] {
        tb.agents[i].run("rds-up", T).unwrap();
    }
    tb.agents[0]
        .run(
            &format!("rds-echo serve 10.78.0.1 {RDS_PORT} > /tmp/rds.log 2>&1 &"),
            T,
        )
        .unwrap();
    let workloads = [
        Workload {
            name: "ipoib",
            node: 0,
            check: format!(
                "[ \"$(timeout 120 wget -q -O - http://10.78.0.4:8080/blob | md5sum)\" = \"{sum}  -\" ]"
            ),
        },
        Workload {
            name: "nvme",
            node: 2,
            check: format!(
                "dd if=/dev/urandom of=/tmp/w bs=1M count=8 2>/dev/null && \
                 a=$(md5sum < /tmp/w) && \
                 dd if=/tmp/w of=/dev/{nvme} bs=1M oflag=direct 2>/dev/null && \
                 b=$(dd if=/dev/{nvme} bs=1M count=8 iflag=direct 2>/dev/null | md5sum) && \
                 [ \"$a\" = \"$b\" ]"
            ),
        },
        Workload {
            name: "rds",
            node: 1,
            check: format!(
                "rds-echo ping 10.78.0.2 10.78.0.1 {RDS_PORT} 8 4 1 65536 2>&1 | \
                 grep -q 'every echo verified'"
            ),
        },
    ];
    for w in &workloads {
        w.start(&mut tb);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hogs = cpu_hogs(&stop);
    let began = Instant::now();
    let end = began + Duration::from_secs(secs);
    let mut runs = 0u64;
    let mut slowest = (Duration::ZERO, "");
    'soak: while Instant::now() < end {
        for (cmd, config) in RXE_DSM_APPS {
            let t = Instant::now();
            connect_mesh(&mut tb.agents, "hcab0").unwrap();
            configure(&mut tb.agents, config).unwrap();
            let res = run_app(&mut tb.agents, cmd, Duration::from_secs(900))
                .unwrap_or_else(|e| panic!("DSM run {runs}, {cmd}, at {:?}: {e}", began.elapsed()));
            assert_eq!(res[0].verified, Some(true), "{cmd}: {}", res[0].line);
            settle(&mut tb.agents, Duration::from_secs(30)).unwrap();
            close_all(&mut tb.agents).unwrap();
            runs += 1;
            slowest = slowest.max((t.elapsed(), cmd));
            if Instant::now() >= end {
                break 'soak;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    let soaked = began.elapsed();
    for i in 0..4 {
        tb.agents[i].run("touch /tmp/soak.stop", T).unwrap();
    }
    println!(
        "soak: {soaked:.0?} beside {} busy host threads; DSM: {runs} application runs, all \
         verified, the slowest {:.1?} ({})",
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        slowest.0,
        slowest.1
    );
    let mut failures = Vec::new();
    for w in &workloads {
        let (ok, failed, done) = w.result(&mut tb);
        println!(
            "soak: {:<6} on node{}: {ok} rounds checked, {} failed",
            w.name,
            w.node + 1,
            failed.len()
        );
        if !failed.is_empty() || !done || ok == 0 {
            failures.push(format!(
                "{} (node{}): {ok} ok, done {done}, {} failed; the first: {:?}",
                w.name,
                w.node + 1,
                failed.len(),
                &failed[..failed.len().min(6)]
            ));
        }
    }
    for i in 0..4 {
        let log = tb.agents[i]
            .run(
                "dmesg | grep -e 'BUG' -e 'Oops' -e 'Call Trace' -e 'WARNING' \
                 -e 'blocked for more than'; true",
                T,
            )
            .unwrap();
        if !log.trim().is_empty() {
            failures.push(format!("node{}'s kernel:\n{log}", i + 1));
        }
    }
    assert!(
        failures.is_empty(),
        "soak failures:\n{}",
        failures.join("\n")
    );
}
