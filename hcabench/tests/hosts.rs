//! End-to-end: one subnet across two hcabench hosts. Each host is an `hcabench up --host`
//! in a network namespace of its own (`ip netns`), the two joined by a veth pair, with one
//! guest each: node1 on host a (which runs the SM), node2 on host b. Their inter-host link
//! carries IB packets in UDP over the veth.
//!
//! Across the hosts: Debian's ibnetdiscover sees both switches; IPoIB pings and a 16 MiB
//! file over TCP arrives intact; NVMe-oF (nvmet-rdma on node2, nvme-rdma on node1) reads
//! back what it wrote; a DSM application runs verified on both nodes. Then the link is cut
//! with `hcabench link down` (pings fail, quickly) and restored (they pass again); and
//! host b is killed outright: host a finds it gone, node1's traffic to it fails in bounded
//! time, and node1 and host a go on.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cluster::agent::Agent;
use cluster::dsm::{configure, connect_mesh, run_app};
use e2e::{image_or_skip, repo_root};

mod common;

const T: Duration = Duration::from_secs(120);

/// A network namespace pair joined by a veth, removed when dropped.
struct Netns {
    names: [String; 2],
    veth: String,
}

impl Netns {
    /// Two namespaces, their veth ends at 10.99.0.1 and 10.99.0.2 (each pair of
    /// namespaces is its own network, so the addresses never meet another test's).
    fn pair(tag: &str) -> Result<Netns, String> {
        let names = [format!("{tag}a"), format!("{tag}b")];
        let (va, vb) = (format!("{tag}va"), format!("{tag}vb"));
        let ns = Netns {
            names: names.clone(),
            veth: va.clone(),
        };
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", &names[0]],
            vec!["netns", "add", &names[1]],
            vec!["link", "add", &va, "type", "veth", "peer", "name", &vb],
            vec!["link", "set", &va, "netns", &names[0]],
            vec!["link", "set", &vb, "netns", &names[1]],
            vec!["-n", &names[0], "addr", "add", "10.99.0.1/24", "dev", &va],
            vec!["-n", &names[1], "addr", "add", "10.99.0.2/24", "dev", &vb],
            vec!["-n", &names[0], "link", "set", &va, "up"],
            vec!["-n", &names[1], "link", "set", &vb, "up"],
            vec!["-n", &names[0], "link", "set", "lo", "up"],
            vec!["-n", &names[1], "link", "set", "lo", "up"],
        ];
        for s in steps {
            let o = Command::new("ip")
                .args(&s)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if !o.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    s.join(" "),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            // Whatever still runs in it (a daemon that never wrote its state, its QEMU).
            if let Ok(o) = Command::new("ip").args(["netns", "pids", n]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(pid) = pid.parse::<i32>() {
                        // SAFETY: kill has no memory preconditions; the process is one this
                        // test's namespace holds.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        // The veth goes with its namespaces, unless it never reached them.
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
    }
}

/// One host: its namespace and run directory; `hcabench down` when dropped.
struct Host {
    ns: String,
    dir: PathBuf,
}

impl Host {
    fn hcabench(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns, env!("CARGO_BIN_EXE_hcabench")])
            .env("RUST_LOG", "warn")
            .arg("--run-dir")
            .arg(&self.dir)
            .args(args)
            .output()
            .expect("run hcabench")
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.hcabench(args);
        assert!(o.status.success(), "{args:?}: {}", common::text(&o));
        common::text(&o)
    }

    /// The guest's agent (its shell's command channel, a unix socket in the run
    /// directory: reachable from any namespace).
    fn agent(&self, node: &str) -> Agent {
        Agent::connect(node, &self.dir.join(format!("{node}.agent")), T).unwrap()
    }

    /// The daemon's process and its guests' (QEMU's), from its state file.
    fn pids(&self) -> Vec<i32> {
        let state = std::fs::read_to_string(self.dir.join("state.toml")).unwrap();
        (state.lines())
            .filter(|l| l.starts_with("daemon_pid") || l.starts_with("pid"))
            .filter_map(|l| l.split('=').nth(1)?.trim().parse().ok())
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.hcabench(&["down"]);
    }
}

fn wait_for(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    ok()
}

fn pings(a: &mut Agent, to: &str, count: u32) -> bool {
    let out = a
        .run(&format!("ping -c {count} -W 2 {to} 2>&1; true"), T)
        .unwrap();
    out.contains(&format!("{count} packets received"))
}

#[test]
fn test_one_subnet_spans_two_hosts_in_their_own_network_namespaces() {
    let Some(_image) = image_or_skip("a subnet across two hosts") else {
        return;
    };
    // (Unique to this run: a namespace a crashed run left is not reused.)
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tag = format!("hcb{:x}", (std::process::id() ^ nanos) % 0xf_ffff);
    let net = match Netns::pair(&tag) {
        Ok(n) => n,
        Err(why) if std::env::var_os("HCABENCH_E2E_REQUIRED").is_some() => {
            panic!("a subnet across two hosts: network namespaces: {why}")
        }
        Err(why) => return e2e::skipped("a subnet across two hosts", &why),
    };
    let scratch = std::env::temp_dir().join(format!("{tag}-hosts"));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let cfg = scratch.join("cluster.toml");
    let images = repo_root().join("target/images");
    // Host b is reached "over ssh" as its namespace: a stand-in for ssh that runs the
    // command there, with a run directory of b's own.
    let ssh = scratch.join("ssh-to-netns");
    std::fs::write(
        &ssh,
        format!(
            "#!/bin/sh\n# ssh DEST COMMAND, DEST a network namespace\ndest=$1\nshift\n\
             export HCABENCH_RUN_DIR={}/$dest\nexec ip netns exec \"$dest\" sh -c \"$*\"\n",
            scratch.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&ssh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        &cfg,
        format!(
            "nodes = 2\nimage_dir = {images:?}\n\
             node_memory_mib = {{ node2 = 512 }}\n\
             [[host]]\nname = \"a\"\naddress = \"10.99.0.1:7700\"\nnodes = 1\n\
             [[host]]\nname = \"b\"\naddress = \"10.99.0.2:7700\"\nnodes = 1\n\
             ssh = {:?}\n",
            net.names[1]
        ),
    )
    .unwrap();
    let a = Host {
        ns: net.names[0].clone(),
        dir: scratch.join("a"),
    };
    let b = Host {
        ns: net.names[1].clone(),
        dir: scratch.join(&net.names[1]),
    };
    // One command on host a starts b too (`--start-others`), as a user starts a cluster
    // of several machines from one.
    let cfg = cfg.to_str().unwrap().to_string();
    let up = Command::new("ip")
        .args(["netns", "exec", &a.ns, env!("CARGO_BIN_EXE_hcabench")])
        .env("RUST_LOG", "warn")
        .env("HCABENCH_SSH", &ssh)
        .env("HCABENCH_REMOTE", env!("CARGO_BIN_EXE_hcabench"))
        .arg("--run-dir")
        .arg(&a.dir)
        .args(["up", "--config", &cfg, "--host", "a", "--start-others"])
        .output()
        .expect("run hcabench");
    let ok = up.status.success();
    let up = common::text(&up);
    assert!(ok && up.contains("all 2 hosts up"), "{up}");
    assert!(
        up.contains("[host b] cluster up: 1 nodes, LIDs 2..=2"),
        "{up}"
    );

    let (mut n1, mut n2) = (a.agent("node1"), b.agent("node2"));
    // The SM on host a sees host b's switch and node; so do node2's own tools.
    assert!(
        wait_for(Duration::from_secs(10), || a
            .ok(&["fabric"])
            .contains("  1  a port 2 - b port 2                      up")),
        "{}",
        a.ok(&["fabric"])
    );
    let disc = n2.run("ibnetdiscover", T).unwrap();
    for want in [
        "\"hcabench switch a (subnet manager)\"",
        "\"hcabench switch b\"",
        "\"hcabench HCA, LID 1\"",
        "\"hcabench HCA, LID 2\"",
    ] {
        assert!(
            disc.contains(want),
            "ibnetdiscover on host b's node2 lacks {want}: {disc}"
        );
    }

    // IPoIB, up at boot on each (10.78.0.LID): pings and 16 MiB over TCP, checked.
    for agent in [&mut n1, &mut n2] {
        let carrier =
            "for i in $(seq 300); do [ $(cat /sys/class/net/ib0/carrier) = 1 ] && break; \
                       sleep 0.1; done; cat /sys/class/net/ib0/carrier";
        assert_eq!(
            agent.run(carrier, T).unwrap().trim(),
            "1",
            "ib0 joined across the hosts"
        );
    }
    assert!(
        wait_for(Duration::from_secs(30), || pings(&mut n1, "10.78.0.2", 1)),
        "node1 -> node2 across the hosts"
    );
    let sum = n2
        .run(
            "dd if=/dev/urandom of=/tmp/blob bs=1M count=16 2>/dev/null && md5sum /tmp/blob && \
             httpd -p 8080 -h /tmp",
            T,
        )
        .unwrap();
    let sum = sum.split_whitespace().next().unwrap().to_string();
    let got = n1
        .run("wget -q -O - http://10.78.0.2:8080/blob | md5sum", T)
        .unwrap();
    assert_eq!(
        got.split_whitespace().next(),
        Some(sum.as_str()),
        "16 MiB over TCP, intact"
    );
    n2.run("pkill httpd; rm -f /tmp/blob; true", T).unwrap();
    // The link counted it on both hosts: a's switch sent it to b, b's received it.
    let way = |host: &Host, col: usize| -> u64 {
        let fabric = host.ok(&["fabric"]);
        let row = (fabric.lines())
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|w| w.len() == 13 && w[..3] == ["1", "a", "port"]);
        let row = row.unwrap_or_else(|| panic!("no link 1 in {fabric}"));
        row[col].parse().unwrap()
    };
    // (Columns: 9 packets there, a to b; 11 back. In MTU packets: at least 4096.)
    assert!(way(&a, 9) > 0, "host a sent to b (TCP's ACKs)");
    assert!(
        way(&b, 11) >= 4096 && way(&a, 11) >= 4096,
        "16 MiB went from b to a: host b counted {} sent, host a {} received",
        way(&b, 11),
        way(&a, 11)
    );
    // perfquery from node2 asks host a's switch, across the hosts: its port 2 (the link)
    // sent and received at least what host a had counted just before, and lost nothing.
    let (sent, received) = (way(&a, 9), way(&a, 11));
    let pq = n2.run("perfquery 49151 2", T).unwrap();
    let field = |name: &str| -> u64 {
        (pq.lines())
            .find_map(|l| {
                l.strip_prefix(name)?
                    .trim_start_matches(['.', ':'])
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {name} in {pq}"))
    };
    assert!(
        field("PortXmitPkts:") >= sent
            && field("PortRcvPkts:") >= received
            && field("PortXmitDiscards:") == 0
            && field("PortRcvErrors:") == 0,
        "host a counted {sent} sent, {received} received: {pq}"
    );

    // NVMe-oF: node2 exports a RAM disk, node1 writes 16 MiB through it and reads it back.
    let target = n2.run("nvmeof target 32 srq", T).unwrap();
    assert!(target.contains("at rdma 10.78.0.2:4420"), "{target}");
    let dev = n1.run("nvmeof connect 10.78.0.2", T).unwrap();
    let dev = dev.trim().to_string();
    assert!(dev.starts_with("nvme") && dev.ends_with("n1"), "{dev}");
    let io = n1
        .run(
            &format!(
                "dd if=/dev/urandom of=/tmp/w bs=1M count=16 2>/dev/null && \
                 dd if=/tmp/w of=/dev/{dev} bs=1M oflag=direct 2>/dev/null && \
                 dd if=/dev/{dev} bs=1M count=16 iflag=direct 2>/dev/null | md5sum && md5sum /tmp/w"
            ),
            T,
        )
        .unwrap();
    let sums: Vec<&str> = io
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        sums.len() == 2 && sums[0] == sums[1],
        "read back through NVMe-oF: {io}"
    );
    n1.run("nvmeof disconnect; rm -f /tmp/w", T).unwrap();

    // The DSM: a mesh across the hosts, an application verified on both nodes.
    let mut agents = vec![n1, n2];
    connect_mesh(&mut agents, "hcab0").unwrap();
    configure(&mut agents, "handler=irq readfault=write").unwrap();
    let res = run_app(
        &mut agents,
        "DSM_THREADS=1 sor 34 1024 4",
        Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("sor across hosts: {e}"));
    assert_eq!(res[0].verified, Some(true), "{}", res[0].line);
    assert!(
        res.iter().all(|r| r.msgs > 0),
        "both nodes took part: {res:?}"
    );
    let [mut n1, mut n2]: [Agent; 2] = agents.try_into().ok().unwrap();
    n1.run("dsmctl close; true", T).unwrap();
    n2.run("dsmctl close; true", T).unwrap();

    // The inter-host link cut on host a: node2 unreachable, in bounded time; restored,
    // reachable again.
    a.ok(&["link", "down", "a", "b"]);
    let t = Instant::now();
    assert!(!pings(&mut n1, "10.78.0.2", 2), "node2 behind the cut link");
    assert!(t.elapsed() < Duration::from_secs(15), "{:.1?}", t.elapsed());
    assert!(
        b.ok(&["fabric"])
            .contains("a port 2 - b port 2                      down"),
        "host b sees it down too"
    );
    a.ok(&["link", "up", "a", "b"]);
    assert!(
        wait_for(Duration::from_secs(30), || pings(&mut n1, "10.78.0.2", 1)),
        "node1 -> node2 once the link is back"
    );

    // Host b killed outright (its daemon and guest): host a finds it gone; node1's
    // traffic to node2 fails in bounded time; node1 and host a go on.
    for pid in b.pids() {
        // SAFETY: kill has no memory preconditions; the pids are the daemon and the QEMU
        // this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        wait_for(Duration::from_secs(10), || a
            .ok(&["fabric"])
            .contains("a port 2 - b port 2                      down")),
        "host a found host b gone: {}",
        a.ok(&["fabric"])
    );
    let t = Instant::now();
    assert!(!pings(&mut n1, "10.78.0.2", 2));
    assert!(t.elapsed() < Duration::from_secs(15), "{:.1?}", t.elapsed());
    assert_eq!(n1.run("echo alive", T).unwrap().trim(), "alive");
    assert!(a.ok(&["status"]).contains("node1"));
    drop(n2);
    drop((a, b));
    drop(net);
    let _ = std::fs::remove_dir_all(&scratch);
}
