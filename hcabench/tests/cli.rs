//! The `hcabench` command line against real QEMU guests: up, status, run, console errors,
//! down; and the errors a user meets without a cluster.

use std::path::Path;
use std::process::{Command, Output};

use common::{hcabench, text};
use e2e::{image_or_skip, repo_root};

mod common;

/// `hcabench` with RUST_LOG set to `filter`.
fn hcabench_with_log(run_dir: &Path, args: &[&str], filter: &str) -> Output {
    common::command(run_dir)
        .env("RUST_LOG", filter)
        .args(args)
        .output()
        .expect("run hcabench")
}

/// `hcabench fault NODE unplug` and `replug`: node2's guest lets its HCA go and probes the
/// new one, each refused with the reason when the slot is already so.
fn the_hca_is_unplugged_and_plugged_again(run_dir: &Path) {
    let state = "cat /sys/class/infiniband/hcab0/ports/1/state 2>/dev/null; true";
    for (action, says, again) in [
        ("unplug", "node2: unplug", "unplugged already"),
        ("replug", "node2: replug", "plugged in already"),
    ] {
        let o = hcabench(run_dir, &["fault", "node2", action]);
        if text(&o).contains("needs the qemu backend") {
            // Where auto chose hcabench's VMM, which has no PCI hot-plug (CI runs QEMU).
            eprintln!("hot-plug not tested: {}", text(&o).trim());
            return;
        }
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains(says), "{}", text(&o));
        let o = hcabench(run_dir, &["fault", "node2", action]);
        assert!(!o.status.success(), "{action} twice");
        assert!(text(&o).contains(again), "{}", text(&o));
        if action == "unplug" {
            let o = hcabench(run_dir, &["exec", "node2", "--", state]);
            assert_eq!(text(&o).trim(), "", "node2 still has hcab0 after unplug");
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let o = hcabench(run_dir, &["exec", "node2", "--", state]);
        if text(&o).contains("4: ACTIVE") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node2's new hcab0 is not ACTIVE: {}",
            text(&o)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `hcabench fault` on a cluster started without a plan: changes are taken (an empty plan
/// starts), bad ones refused with the reason, and a killed node's guest stops.
fn live_faults_reach_the_running_cluster(run_dir: &Path) {
    let ok = hcabench(run_dir, &["fault", "node2", "drop", "0.5"]);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("node2: drop 0.5"), "{}", text(&ok));
    // Several rates and a delay in one call (a campaign's mix).
    let mix = [
        "fault",
        "node2",
        "reorder",
        "0.05",
        "duplicate",
        "0.02",
        "delay",
        "100",
        "20",
    ];
    let ok = hcabench(run_dir, &mix);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(
        text(&ok).contains("node2: reorder 0.05 duplicate 0.02 delay 100 20"),
        "{}",
        text(&ok)
    );
    for (args, says) in [
        (
            &["fault", "node3", "kill"][..],
            "the cluster has node1 to node2",
        ),
        (&["fault", "node1", "drop", "7"][..], "not a probability"),
        (&["fault", "node1", "melt"][..], "actions: link-down"),
        (
            &["fault", "node1", "drop", "0.1", "reorder"][..],
            "unknown action `drop 0.1 reorder`",
        ),
    ] {
        let o = hcabench(run_dir, args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    the_hca_is_unplugged_and_plugged_again(run_dir);
    let kill = hcabench(run_dir, &["fault", "node2", "kill"]);
    assert!(kill.status.success(), "{}", text(&kill));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let st = text(&hcabench(run_dir, &["status"]));
        if st.contains(" dead ") {
            assert!(
                st.contains(" ready ") && st.matches(" dead ").count() == 1,
                "{st}"
            );
            break;
        }
        assert!(std::time::Instant::now() < deadline, "node2 still up: {st}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `hcabench counters`: a row per node with what the port counted since boot (IPoIB's
/// joins and the SA's answers at least: packets both ways on every node), and every
/// counter of one node by name.
fn port_counters_show_each_node(run_dir: &Path) {
    let table = hcabench(run_dir, &["counters"]);
    assert!(table.status.success(), "{}", text(&table));
    let out = text(&table);
    assert!(out.contains("tx pkts") && out.contains("resent"), "{out}");
    for node in ["node1", "node2"] {
        let row: Vec<&str> = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(node))
            .unwrap_or_else(|| panic!("no row for {node}: {out}"))
            .split_whitespace()
            .collect();
        let (tx, rx): (u64, u64) = (row[1].parse().unwrap(), row[2].parse().unwrap());
        assert!(tx > 0 && rx > 0, "{node}: {out}");
    }
    let one = hcabench(run_dir, &["counters", "node2"]);
    let out = text(&one);
    assert!(one.status.success(), "{out}");
    assert_eq!(
        out.lines().count(),
        hca_model::abi::COUNTER_NAMES.len(),
        "{out}"
    );
    for name in hca_model::abi::COUNTER_NAMES {
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name}: {out}"
        );
    }
    let bad = hcabench(run_dir, &["counters", "node9"]);
    assert!(
        !bad.status.success() && text(&bad).contains("no node `node9`"),
        "{}",
        text(&bad)
    );
}

/// A run directory removed at the end, with the cluster in it stopped.
struct RunDir(std::path::PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = hcabench(&self.0, &["down"]);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `hcabench status`, `fabric` and `counters` into a pipe whose reader has gone (`| head` done): they
/// end as other tools do, by SIGPIPE, without a panic's message.
fn listings_end_quietly_when_their_reader_does(run_dir: &Path) {
    use std::os::fd::FromRawFd;
    use std::os::unix::process::ExitStatusExt;
    for cmd in ["status", "fabric", "counters"] {
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors pipe() writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe() just made both; each is owned once, here.
        let (reader, writer) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        drop(reader);
        let o = Command::new(env!("CARGO_BIN_EXE_hcabench"))
            .arg("--run-dir")
            .arg(run_dir)
            .arg(cmd)
            .stdout(writer)
            .output()
            .expect("run hcabench");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{cmd}: {err}");
        assert!(!err.contains("panicked"), "{cmd}: {err}");
    }
}

#[test]
fn test_up_status_run_down_on_a_two_node_cluster() {
    let Some(_image) = image_or_skip("cli") else {
        return;
    };
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let cfg = dir.0.join("cluster.in.toml");
    let images = repo_root().join("target/images");
    std::fs::write(
        &cfg,
        format!(
            "nodes = 2\nimage_dir = {images:?}\npacket_life_time = 14\n\
             [node_memory_mib]\nnode2 = 320\n"
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();

    let pcap = dir.0.join("fabric.pcap");
    let up = hcabench_with_log(
        &dir.0,
        &["up", "--config", cfg, "--capture", pcap.to_str().unwrap()],
        "debug",
    );
    assert!(up.status.success(), "{}", text(&up));
    assert!(
        text(&up).contains("node2: booting ... ready"),
        "{}",
        text(&up)
    );

    let again = hcabench(&dir.0, &["up", "--config", cfg]);
    assert!(!again.status.success());
    assert!(text(&again).contains("already up"), "{}", text(&again));

    let st = hcabench(&dir.0, &["status"]);
    assert_eq!(text(&st).matches(" ready ").count(), 2, "{}", text(&st));
    // node2's own RAM (the cluster file's node_memory_mib), node1 the default.
    for (node, mib) in [("node1", "256"), ("node2", "320")] {
        assert!(
            text(&st)
                .lines()
                .any(|l| l.split_whitespace().next() == Some(node)
                    && l.split_whitespace().nth(4) == Some(mib)),
            "{node} {mib}: {}",
            text(&st)
        );
    }
    listings_end_quietly_when_their_reader_does(&dir.0);
    // Every node came up with IPoIB on ib0 (its address from its LID), members of the
    // partition's broadcast group at the fabric's SA.
    for addr in ["10.78.0.1/16", "10.78.0.2/16"] {
        assert!(text(&st).contains(addr), "{}", text(&st));
    }
    let fabric = hcabench(&dir.0, &["fabric"]);
    assert!(fabric.status.success(), "{}", text(&fabric));
    assert!(
        text(&fabric).contains("partitions") && text(&fabric).contains("none other"),
        "a cluster file without [[partition]]: {}",
        text(&fabric)
    );
    // A partition set and removed on the running cluster, as an SM would.
    let set = hcabench(
        &dir.0,
        &[
            "partition",
            "0x8002",
            "--members",
            "node1",
            "--limited",
            "node2",
        ],
    );
    assert!(set.status.success(), "{}", text(&set));
    let fabric = hcabench(&dir.0, &["fabric"]);
    assert!(
        text(&fabric).contains("0x8002  full: node1  limited: node2"),
        "{}",
        text(&fabric)
    );
    let bad = hcabench(&dir.0, &["partition", "0x8003", "--members", "node9"]);
    assert!(
        !bad.status.success() && text(&bad).contains("no node `node9`"),
        "{}",
        text(&bad)
    );
    let gone = hcabench(&dir.0, &["partition", "0x8002", "--remove"]);
    assert!(gone.status.success(), "{}", text(&gone));
    let fabric = hcabench(&dir.0, &["fabric"]);
    assert!(text(&fabric).contains("none other"), "{}", text(&fabric));
    assert!(
        text(&fabric)
            .lines()
            .any(|l| l.contains("ff12:401b:ffff:0000:0000:0000:ffff:ffff")
                && l.contains("0xc000")
                && l.contains("node1,node2")),
        "{}",
        text(&fabric)
    );
    assert!(
        text(&fabric).contains("service records: 0; trap subscriptions: 0"),
        "{}",
        text(&fabric)
    );
    // The cluster file's packet lifetime reached the SA.
    assert!(
        text(&fabric).contains("packet lifetime: 14 (4.096 us x 2^14, 0.067 s"),
        "{}",
        text(&fabric)
    );

    let probe = hcabench(&dir.0, &["run", "probe"]);
    let out = text(&probe);
    assert!(probe.status.success(), "{out}");
    assert!(
        out.contains("node1: HCA found abi=1 lid=1 port_state=4"),
        "{out}"
    );
    assert!(
        out.contains("node2: HCA found abi=1 lid=2 port_state=4"),
        "{out}"
    );
    assert_eq!(out.matches("doorbell-irq rounds=200").count(), 2, "{out}");

    port_counters_show_each_node(&dir.0);

    let bad = hcabench(&dir.0, &["console", "node7"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("the cluster has node1, node2"),
        "{}",
        text(&bad)
    );
    let job = hcabench(&dir.0, &["run", "nosuchjob"]);
    assert!(
        text(&job).contains("possible values: probe, sor"),
        "{}",
        text(&job)
    );

    live_faults_reach_the_running_cluster(&dir.0);
    // RUST_LOG reaches the daemon: the device server's decisions are in its log.
    let daemon_log = std::fs::read_to_string(dir.0.join("daemon.log")).unwrap();
    assert!(
        daemon_log.contains("node1: guest connected, HCA up at LID 1"),
        "{daemon_log}"
    );

    let qemu_pids: Vec<u32> = std::fs::read_to_string(dir.0.join("state.toml"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("pid = "))
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(qemu_pids.len(), 2);
    let down = hcabench(&dir.0, &["down"]);
    assert!(down.status.success(), "{}", text(&down));
    let report = text(&down);
    assert!(report.contains("fabric capture: "), "{report}");
    // The capture (link type 197, ERF) holds the cluster's start-up: each node's IPoIB
    // joining the broadcast group through the SA (MCMemberRecord, 0x0038).
    let cap = std::fs::read(&pcap).unwrap();
    assert_eq!(&cap[20..24], &197u32.to_le_bytes());
    let fields = ["infiniband.lrh.slid", "infiniband.mad.attributeid"];
    if let Some(rows) = e2e::tshark_or_skip("up's capture", &pcap, &fields) {
        for lid in ["1", "2"] {
            assert!(
                rows.iter()
                    .any(|r| r.len() == 2 && r[0] == lid && r[1] == "0x0038"),
                "node{lid}'s join: {rows:?}"
            );
        }
    }
    assert!(
        report.contains("nodes killed 1") && report.contains("fault plan report (seed 0)"),
        "the live changes' report: {report}"
    );
    let log = std::fs::read_to_string(dir.0.join("faults.jsonl")).unwrap();
    assert!(
        log.contains("\"live\":\"rule drop=0.5") && log.contains("\"live\":\"kill\""),
        "{log}"
    );
    for pid in qemu_pids {
        // SAFETY: signal 0 only probes whether the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive, "QEMU {pid} outlived `down`");
    }
    assert!(text(&hcabench(&dir.0, &["status"])).contains("no cluster is up"));
    assert!(
        dir.0.join("node1.console").exists(),
        "console logs are kept"
    );
}

/// A cluster file of two switches joined by two links: `hcabench fabric` lists them, and
/// `hcabench link` cuts and restores each by its switches' names while node1 pings node2
/// over IPoIB, round the first cut and not once both are.
#[test]
fn test_link_cuts_and_restores_the_links_between_a_running_clusters_switches() {
    let Some(_image) = image_or_skip("cli: link") else {
        return;
    };
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-link-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let cfg = dir.0.join("cluster.in.toml");
    let images = repo_root().join("target/images");
    std::fs::write(
        &cfg,
        format!(
            "nodes = 2\nimage_dir = {images:?}\n\
             [[switch]]\nname = \"leaf1\"\nnodes = [\"node1\"]\n\
             [[switch]]\nname = \"leaf2\"\nnodes = [\"node2\"]\n\
             [[link]]\nswitches = [\"leaf1\", \"leaf2\"]\n\
             [[link]]\nswitches = [\"leaf2\", \"leaf1\"]\n"
        ),
    )
    .unwrap();
    let up = hcabench(&dir.0, &["up", "--config", cfg.to_str().unwrap()]);
    assert!(up.status.success(), "{}", text(&up));
    let ok = |args: &[&str]| {
        let o = hcabench(&dir.0, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        text(&o)
    };
    let ping = |count: &str| {
        let cmd = format!("ping -c {count} -W 1 10.78.0.2");
        hcabench(&dir.0, &["exec", "node1", "--", &cmd])
            .status
            .success()
    };
    let fabric = ok(&["fabric"]);
    for want in [
        "  leaf1            49151 0xbfff  reaches   node1 (1)\n",
        "  leaf2            49150 0xbffe  reaches   node2 (1)\n",
        "    1  leaf1 port 2 - leaf2 port 2",
        "    2  leaf2 port 3 - leaf1 port 3",
    ] {
        assert!(fabric.contains(want), "{want:?}: {fabric}");
    }
    assert!(ping("1"), "node1 -> node2 across the switches");
    let which = hcabench(&dir.0, &["link", "down", "leaf1", "leaf2"]);
    assert!(
        !which.status.success() && text(&which).contains("2 links join leaf1 and leaf2"),
        "{}",
        text(&which)
    );
    let out = ok(&["link", "down", "leaf1", "leaf2", "1"]);
    assert!(
        out.contains("link 1 (leaf1 port 2 - leaf2 port 2) down"),
        "{out}"
    );
    assert!(ping("2"), "over the second link");
    ok(&["link", "down", "leaf2", "leaf1", "2"]);
    let fabric = ok(&["fabric"]);
    // A link's row: N, its ends, state, then packets and losses there and back.
    let links: Vec<Vec<&str>> = (fabric.lines())
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 13 && w[2] == "port")
        .collect();
    assert!(
        fabric.contains("0xbffe  cut off   node2 (1)")
            && links.iter().filter(|w| w[8] == "down").count() == 2,
        "{fabric}"
    );
    // Both links carried the pings both ways, and lost none.
    for w in &links {
        let n = |i: usize| w[i].parse::<u64>().unwrap();
        assert!(
            n(9) > 0 && n(11) > 0 && n(10) == 0 && n(12) == 0,
            "{w:?}: {fabric}"
        );
    }
    assert!(!ping("2"), "node2 is cut off");
    ok(&["link", "up", "leaf1", "leaf2", "1"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !ping("1") {
        assert!(
            std::time::Instant::now() < deadline,
            "node2 does not answer with link 1 up again"
        );
    }
    let bad = hcabench(&dir.0, &["link", "down", "leaf1", "spine"]);
    assert!(
        text(&bad).contains("no switch `spine`; the switches are leaf1, leaf2"),
        "{}",
        text(&bad)
    );
}

#[test]
fn test_commands_without_a_cluster_say_so() {
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-none-{}", std::process::id())));
    let c = hcabench(&dir.0, &["console", "node1"]);
    assert!(!c.status.success());
    assert!(text(&c).contains("no cluster is up"), "{}", text(&c));
    let f = hcabench(&dir.0, &["fabric"]);
    assert!(!f.status.success());
    assert!(text(&f).contains("no cluster is up"), "{}", text(&f));
    assert!(text(&hcabench(&dir.0, &["down"])).contains("no cluster is up"));
    let bad = hcabench(&dir.0, &["up", "--nodes", "99"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("nodes = 99"), "{}", text(&bad));
    // A time limit outside a second to a day is refused before any guest is asked.
    for args in [
        &["exec", "--timeout", "0", "node1", "--", "true"][..],
        &["mpirun", "-n", "2", "--timeout", "86401", "--", "true"][..],
    ] {
        let o = hcabench(&dir.0, args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains("1..=86400"), "{args:?}: {}", text(&o));
    }
}

#[test]
fn test_bench_rejects_what_it_cannot_measure_before_booting_anything() {
    let dir = std::env::temp_dir().join(format!("hcab-cli-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The NFS bench's client (node2) with less RAM than the server: it bounds the file.
    let small = dir.join("small-client.toml");
    std::fs::write(&small, "[node_memory_mib]\nnode2 = 128\n").unwrap();
    let small = small.to_str().unwrap();
    for (args, says) in [
        (&["bench", "lu"][..], "unrecognized subcommand 'lu'"),
        (
            &["bench", "apps", "--iters", "5"][..],
            "unexpected argument '--iters'",
        ),
        (
            &["bench", "ipoib", "--iters", "5000"][..],
            "outside 1..=1000",
        ),
        (
            &["bench", "verbs", "--sizes", "8,5000"][..],
            "ping-pong size 5000 is outside 8..=4096",
        ),
        (
            &["bench", "verbs", "--bw-sizes", "0"][..],
            "RDMA size 0 is outside",
        ),
        (
            &["bench", "verbs", "--iters", "0"][..],
            "outside 1..=100000",
        ),
        (&["bench", "dsm", "--iters", "0"][..], "outside 1..=100000"),
        (
            &["bench", "dsm", "--pages", "0"][..],
            "--pages 0 is outside 1..=1024",
        ),
        (
            &["bench", "nfs", "--bw-bytes", "100000"][..],
            "--bw-bytes 100000 is outside 1 MiB..=64 MiB",
        ),
        (
            &["bench", "nfs", "--bw-bytes", "1073741824"][..],
            "outside 1 MiB..=64 MiB (a quarter of the smaller guest's 256 MiB)",
        ),
        (
            &["bench", "nfs", "--bw-bytes", "67108864", "--config", small][..],
            "outside 1 MiB..=32 MiB (a quarter of the smaller guest's 128 MiB)",
        ),
    ] {
        let o = hcabench(&dir, args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

#[test]
fn test_run_and_bench_vmm_refuse_kvm_where_kvm_cannot_run_linux() {
    use vmm::{check_kvm, KvmCheck};
    if check_kvm() == KvmCheck::Usable {
        e2e::skipped(
            "run --backend kvm refusal",
            "KVM runs Linux here, so the run would boot (ci/nested-kvm.sh checks that)",
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("hcab-cli-runkvm-{}", std::process::id()));
    // It used to boot QEMU guests instead, silently.
    let o = hcabench(&dir, &["run", "sor", "--backend", "kvm"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("backend kvm: KVM cannot run a Linux guest here"),
        "{}",
        text(&o)
    );
    assert!(!text(&o).contains("booting"), "{}", text(&o));
    let o = hcabench(&dir, &["bench", "vmm"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("KVM cannot run Linux here") && text(&o).contains("ci/nested-kvm.sh"),
        "{}",
        text(&o)
    );
}

#[test]
fn test_run_rejects_bad_dsm_jobs_before_booting_anything() {
    let dir = std::env::temp_dir().join(format!("hcab-cli-run-{}", std::process::id()));
    for (args, says) in [
        (
            &["run", "fft"][..],
            "possible values: probe, sor, is, lu, tsp, nbody",
        ),
        (
            &["run", "sor", "--nodes", "1"][..],
            "--nodes 1 is outside 2..=16",
        ),
        (&["run", "sor", "--nodes", "17"][..], "outside 2..=16"),
        (
            &["run", "lu", "--transport", "rxe", "--capture", "x.pcap"][..],
            "--faults and --capture act on hcabench's fabric, not on SoftRoCE's network",
        ),
        (
            &["run", "lu", "--", "big"][..],
            "argument `big` is not a number",
        ),
    ] {
        let o = hcabench(&dir, args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

#[test]
fn test_backend_choice_is_explained_and_kvm_refused_where_it_cannot_run_linux() {
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-be-{}", std::process::id())));
    let bad = hcabench(&dir.0, &["up", "--backend", "xen"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("possible values: auto, qemu, kvm"),
        "{}",
        text(&bad)
    );
    match vmm::check_kvm() {
        vmm::KvmCheck::Unusable(why) => {
            let t = std::time::Instant::now();
            let kvm = hcabench(&dir.0, &["up", "--backend", "kvm"]);
            assert!(!kvm.status.success());
            let out = text(&kvm);
            assert!(out.contains("KVM cannot run a Linux guest here"), "{out}");
            assert!(out.contains(&why), "{out}");
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "{out}");
            // Nothing was started.
            assert!(!dir.0.join("state.toml").exists());
        }
        vmm::KvmCheck::Usable => {
            e2e::skipped("refusing --backend kvm", "KVM is usable on this host");
        }
    }
}

/// `--vfio` is checked before anything boots: its syntax, its node, and its backend.
#[test]
fn test_vfio_requests_are_checked_before_booting_anything() {
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-vfio-{}", std::process::id())));
    let dev = "/sys/bus/pci/devices/0000:00:00.0";
    let cases: &[(&[&str], &str)] = &[
        (&["up", "--vfio", dev], "expected NODE=SYSFS_PATH"),
        (
            &["up", "--vfio", &format!("node9={dev}")],
            "no node \"node9\"",
        ),
        (
            &["up", "--backend", "qemu", "--vfio", &format!("node1={dev}")],
            "passthrough needs the kvm backend",
        ),
    ];
    for (args, says) in cases {
        let o = hcabench(&dir.0, args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    if let vmm::KvmCheck::Unusable(_) = vmm::check_kvm() {
        let o = hcabench(&dir.0, &["up", "--vfio", &format!("node1={dev}")]);
        assert!(!o.status.success());
        assert!(
            text(&o).contains("--vfio needs the kvm backend"),
            "{}",
            text(&o)
        );
    }
    assert!(!dir.0.join("state.toml").exists());
}

/// A fault plan is read and checked before anything boots; its errors name the file.
#[test]
fn test_fault_plans_are_checked_before_booting_anything() {
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-faults-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let bad = dir.0.join("bad.toml");
    std::fs::write(&bad, "seed = 1\n[[link]]\ndrop = 2.0\n").unwrap();
    let missing = dir.0.join("missing.toml");
    let cases = [
        (bad.clone(), "link 1: drop = 2 (a probability, 0 to 1)"),
        (missing.clone(), "cannot read fault plan"),
    ];
    for (plan, says) in cases {
        let o = hcabench(&dir.0, &["up", "--faults", plan.to_str().unwrap()]);
        assert!(!o.status.success());
        let out = text(&o);
        assert!(
            out.contains(says) && out.contains(plan.to_str().unwrap()),
            "{out}"
        );
    }
    assert!(!dir.0.join("state.toml").exists());
    // A packet lifetime a QP's ACK timeout cannot follow, from the flag or the file.
    let o = hcabench(&dir.0, &["up", "--packet-life-time", "31"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("packet_life_time = 31 (must be 0 to 30"),
        "{}",
        text(&o)
    );
    assert!(!dir.0.join("state.toml").exists());
}

/// `hcabench run sor --nodes 2` under the fault plan `plan` (written into `dir`), with
/// `extra` arguments after; its output, printed too.
fn sor_on_two_nodes_under(dir: &RunDir, plan: &str, extra: &[&str]) -> (Output, String) {
    std::fs::create_dir_all(&dir.0).unwrap();
    let plan_file = dir.0.join("plan.toml");
    std::fs::write(&plan_file, plan).unwrap();
    let images = repo_root().join("target/images");
    let mut args = vec![
        "run",
        "sor",
        "--nodes",
        "2",
        "--image-dir",
        images.to_str().unwrap(),
        "--faults",
        plan_file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = hcabench(&dir.0, &args);
    let out = text(&o);
    println!("{out}");
    (o, out)
}

/// The DSM's traffic as tshark decodes it: control messages as SENDs, page data as RDMA
/// Writes, ACKs; on 2 nodes each side's packets all go to the one QP its peer has for it.
/// (tests/tests/faults.rs checks QPNs against the ones the guests' QPs report.)
fn dsm_capture_is_decoded_by_tshark(pcap: &Path) {
    use hca_test_driver::tshark::{tshark_fields, TsharkError};
    let fields = [
        "infiniband.lrh.slid",
        "infiniband.bth.opcode",
        "infiniband.bth.destqp",
    ];
    let rows = match tshark_fields(pcap, &fields) {
        Ok(r) => r,
        Err(TsharkError::Missing(why)) if std::env::var_os("HCABENCH_E2E_REQUIRED").is_none() => {
            return e2e::skipped("DSM capture decoded by tshark", &why);
        }
        Err(e) => panic!("tshark: {e:?}"),
    };
    let mut ops = std::collections::BTreeMap::<u8, u64>::new();
    let mut qps = [std::collections::BTreeSet::new(), Default::default()];
    for r in &rows {
        let slid: usize = r[0].parse().unwrap();
        *ops.entry(r[1].parse().unwrap()).or_default() += 1;
        qps[slid - 1].insert(r[2].clone());
    }
    println!(
        "tshark: {} frames, by opcode {ops:?}, QPs {qps:?}",
        rows.len()
    );
    for op in [hca_model::packet::RC_SEND_ONLY, hca_model::packet::RC_ACK] {
        assert!(ops.contains_key(&op), "no opcode {op} in {ops:?}");
    }
    assert!(
        ops.keys().any(|&o| (6..=0x0b).contains(&o)),
        "no RDMA Write: {ops:?}"
    );
    // (Each HCA numbers its QPs from 2, so both may be 0x000002.)
    assert!(qps.iter().all(|q| q.len() == 1), "{qps:?}");
}

/// The paper's SOR on two guests with 1% of the fabric's packets dropped (seeded): the
/// RC transport resends, the result still matches the sequential run, no WR ran out of
/// retries, and the report says what was injected.
#[test]
fn test_sor_is_verified_under_one_percent_drops() {
    let Some(_image) = image_or_skip("sor under faults") else {
        return;
    };
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-sorf-{}", std::process::id())));
    let pcap = dir.0.join("sor.pcap");
    let (o, out) = sor_on_two_nodes_under(
        &dir,
        "seed = 7\n[[link]]\ndrop = 0.01\n",
        &["--capture", pcap.to_str().unwrap()],
    );
    assert!(o.status.success(), "{out}");
    assert!(out.contains("verified against a sequential run"), "{out}");
    dsm_capture_is_decoded_by_tshark(&pcap);
    let dropped: u64 = out
        .split("dropped ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drop count in the report: {out}"));
    assert!(dropped > 0, "the plan must have dropped packets: {out}");
    assert!(
        out.contains("error completions (retries exhausted or peer unreachable): 0"),
        "{out}"
    );
    // The log is kept: one JSON line per decision.
    let log_path = out
        .split("decisions in ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .expect("the log's path");
    let log = std::fs::read_to_string(log_path).unwrap();
    assert_eq!(log.lines().count() as u64, dropped, "{log_path}");
    let _ = std::fs::remove_dir_all(std::path::Path::new(log_path).parent().unwrap());
}

/// A plan that kills node2 while SOR runs on 2 guests: the run stops its guest and fails
/// with the reason, and the report counts the kill. Node1 finds out through a WR to node2
/// that runs out of retries, its own or, while it only waits on node2, one of the probes
/// its DSM sends each 2 s of a wait; its DSM goes dead (SIGBUS or ENODEV), never meeting
/// the 60 s no-answer timeout.
#[test]
fn test_a_planned_node_kill_ends_a_dsm_run_with_the_reason() {
    let Some(_image) = image_or_skip("node kill under sor") else {
        return;
    };
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-kill-{}", std::process::id())));
    let (o, out) = sor_on_two_nodes_under(
        &dir,
        "seed = 1\n[[node]]\nlid = 2\nkill_ms = 300\n",
        &["--", "258", "1024", "40"],
    );
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("node2 killed by the fault plan"), "{out}");
    assert!(out.contains("nodes killed 1"), "{out}");
    assert!(
        out.contains("Bus error") || out.contains("No such device"),
        "node1's application fails for the lost node: {out}"
    );
    assert!(out.contains("lost node 2"), "{out}");
    assert!(out.contains("the DSM cannot go on"), "{out}");
    if let Some(log) = out
        .split("decisions in ")
        .nth(1)
        .and_then(|s| s.lines().next())
    {
        let _ = std::fs::remove_dir_all(std::path::Path::new(log).parent().unwrap());
    }
}

/// `down --others` where this host has no cluster up (it failed to start): with the
/// cluster file and this host's name it still stops the others over ssh (here a stand-in
/// for ssh that notes what it was asked to run), and says how when they are not given.
#[test]
fn test_down_others_without_a_cluster_here_stops_the_others_from_the_cluster_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = RunDir(std::env::temp_dir().join(format!("hcab-cli-downo-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let asked = dir.0.join("asked");
    let ssh = dir.0.join("fake-ssh");
    std::fs::write(
        &ssh,
        format!("#!/bin/sh\necho \"$@\" >> {}\n", asked.display()),
    )
    .unwrap();
    std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        "nodes = 3\n\
         [[host]]\nname = \"a\"\naddress = \"127.0.0.1:7700\"\nnodes = 1\n\
         [[host]]\nname = \"b\"\naddress = \"127.0.0.2:7700\"\nnodes = 1\nssh = \"me@b\"\n\
         [[host]]\nname = \"c\"\naddress = \"127.0.0.3:7700\"\nnodes = 1\n",
    )
    .unwrap();
    let run = dir.0.join("run");
    let o = hcabench(&run, &["down", "--others"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("--config FILE --host NAME"),
        "{}",
        text(&o)
    );
    let c = cfg.to_str().unwrap();
    let o = hcabench(&run, &["down", "--others", "--config", c, "--host", "x"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no [[host]] named \"x\""), "{}", text(&o));
    let o = common::command(&run)
        .env("HCABENCH_SSH", &ssh)
        .args(["down", "--others", "--config", c, "--host", "a"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("host c: no `ssh`"), "{}", text(&o));
    let asked = std::fs::read_to_string(&asked).unwrap_or_default();
    assert_eq!(
        asked, "me@b 'hcabench' 'down'\n",
        "b only, and not this host"
    );
}
