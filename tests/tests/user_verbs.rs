//! End-to-end: user-level verbs. Two QEMU guests run Debian 12's rdma-core userland
//! unmodified (libibverbs, librdmacm, ibverbs-utils, rdmacm-utils, perftest) on hcab0,
//! through ib_uverbs and our provider (guest-user/libhcab, libhcab-rdmav34.so): ibv_devinfo
//! shows the port, the ibv_*_pingpong tools move checked data over RC, UC, UD and an SRQ,
//! rping's pattern arrives intact, and perftest's latency, bandwidth and atomic tests report
//! what they ran. The same tools run then on SoftRoCE (rxe0, over a virtio-net link between
//! the guests) as a control: it shows that the image's userland works whatever hcab0 does.
//! Node 1 serves, node 2 is the client, and the tools exchange their addresses over IPoIB
//! (ib0, 10.78.0.k). One booted pair serves every check; each check names its exact command,
//! and the test reports every check that failed (not only the first) before it fails.
//!
//! Also here, as the same userland brings them: /dev/infiniband's nodes, and modprobe
//! (busybox's, with the modules.dep and modules.alias images/build.py makes with depmod)
//! loading and removing a module with its dependencies, and the kernel loading one it asks
//! for.

use std::time::{Duration, Instant};

use cluster::agent::AgentError;
use cluster::verbs::Testbed;
use cluster::ClusterSpec;
use e2e::{image_or_skip, BOOT_TIMEOUT};

/// How long one command may take in the harness (the guest's own `timeout` ends the tools
/// sooner).
const T: Duration = Duration::from_secs(150);
/// How long a tool may run in the guest before `timeout` kills it.
const TOOL_SECS: u32 = 90;
/// The server's address as the client reaches it: node 1's ib0.
const SERVER_IB0: &str = "10.78.0.1";
/// Node 1's address on the virtio-net link (rdma_cm picks rxe0 by it).
const SERVER_ETH0: &str = "10.77.0.1";
/// rping's default buffer: 64 bytes, its last a NUL.
const RPING_SIZE: usize = 64;

/// A command's exit status and output (stdout and stderr).
#[derive(Debug)]
struct Ran {
    status: i32,
    out: String,
}

/// A server run on node 1 and its client on node 2.
#[derive(Debug)]
struct Pair {
    server: Ran,
    client: Ran,
}

/// How the harness knows the server is listening before the client starts.
#[derive(Clone, Copy)]
enum Listen {
    /// On TCP port 18515: the ibv_*_pingpong tools and perftest exchange addresses there.
    Tcp,
    /// As an rdma_cm ID in state LISTEN (`rdma resource show cm_id`): rping, udaddy.
    RdmaCm,
    /// When the fabric's SA has node 1's port in the multicast group of this IPv4 group
    /// address (mckey, whose log is block-buffered into a file until it exits), and a
    /// moment more for the process to attach its QP to the group.
    Joined([u8; 4]),
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
enum CheckError {
    /// A command in a guest gave no answer, or failed.
    #[error(transparent)]
    Shell(#[from] AgentError),
    /// A step of a server and client run (`what`) failed in a guest's shell.
    #[error("{what}: {source}")]
    Step {
        what: &'static str,
        source: AgentError,
    },
    /// The tools ran, and what they said is not what the check wants.
    #[error("{0}")]
    Wrong(String),
    /// With what may explain it (hcab0's verbs missing on a node).
    #[error("{source}{diagnosis}")]
    Diagnosed {
        source: Box<CheckError>,
        diagnosis: String,
    },
}

impl CheckError {
    fn diagnosed(self, diagnosis: String) -> CheckError {
        CheckError::Diagnosed {
            source: Box::new(self),
            diagnosis,
        }
    }
}

fn fail<T>(why: String) -> Result<T, CheckError> {
    Err(CheckError::Wrong(why))
}

macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        {
            let ok: bool = $cond;
            if !ok {
                return fail(format!($($why)+));
            }
        }
    };
}

/// Runs `server` on node 1 in the background, waits until it listens, runs `client` on
/// node 2, then waits for the server to end; both under the guest's `timeout`. A server
/// still running after its client ended is killed.
fn pair(tb: &mut Testbed, server: &str, client: &str, listen: Listen) -> Result<Pair, CheckError> {
    let prog = server.split_whitespace().next().unwrap_or_default();
    let ready = match listen {
        Listen::Tcp => "netstat -ltn | grep -q ':18515 '",
        Listen::RdmaCm => "rdma resource show cm_id 2>/dev/null | grep -q LISTEN",
        // Waited for here, from the host (below).
        Listen::Joined(_) => "true",
    };
    let start = format!(
        "killall -q -9 {prog}; rm -f /tmp/uv-srv.log; \
         (timeout -s KILL {TOOL_SECS} {server} > /tmp/uv-srv.log 2>&1; \
         echo \"UV-EXIT $?\" >> /tmp/uv-srv.log) > /dev/null 2>&1 &\n\
         for i in $(seq 200); do grep -q '^UV-EXIT' /tmp/uv-srv.log 2>/dev/null && break; \
         {ready} && break; sleep 0.1; done"
    );
    tb.agents[0]
        .run(&start, T)
        .map_err(|source| CheckError::Step {
            what: "starting the server",
            source,
        })?;
    if let Listen::Joined(group) = listen {
        let node1 = hca_model::abi::node_guid(1);
        // The MGID ends in the group address less its top four bits (ip_ib_mc_map).
        let tail = [group[0] & 0x0f, group[1], group[2], group[3]];
        let joined = || {
            tb.cluster.fabric().with_sa(|sa| {
                sa.groups()
                    .any(|g| g.mgid[12..] == tail && g.members.contains_key(&node1))
            })
        };
        let since = Instant::now();
        while !joined() && since.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let (status, out) = tb.agents[1]
        .status(&format!("timeout -s KILL {TOOL_SECS} {client}"), T)
        .map_err(|source| CheckError::Step {
            what: "the client",
            source,
        })?;
    let client = Ran { status, out };
    let log = tb.agents[0]
        .run(
            &format!(
                "for i in $(seq 300); do grep -q '^UV-EXIT' /tmp/uv-srv.log && break; \
                 sleep 0.1; done; grep -q '^UV-EXIT' /tmp/uv-srv.log || \
                 {{ killall -q -9 {prog}; sleep 0.5; echo 'UV-EXIT hung'; }}; \
                 cat /tmp/uv-srv.log"
            ),
            T,
        )
        .map_err(|source| CheckError::Step {
            what: "the server's log",
            source,
        })?;
    let status = log
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("UV-EXIT "))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(-1);
    let out = log
        .lines()
        .filter(|l| !l.starts_with("UV-EXIT"))
        .collect::<Vec<_>>()
        .join("\n");
    Ok(Pair {
        server: Ran { status, out },
        client,
    })
}

/// Both ends exited 0.
fn both_ok(p: &Pair) -> Result<(), CheckError> {
    ensure!(
        p.server.status == 0 && p.client.status == 0,
        "server exit {}, client exit {}\n--- server:\n{}\n--- client:\n{}",
        p.server.status,
        p.client.status,
        p.server.out.trim_end(),
        p.client.out.trim_end()
    );
    Ok(())
}

/// The numbers of an ibv_*_pingpong summary: "B bytes in S seconds = ... Mbit/sec" and
/// "N iters in S seconds = U usec/iter".
fn pingpong_summary(out: &str) -> Option<(u64, u64, f64)> {
    let word = |l: &str, i: usize| l.split_whitespace().nth(i).map(str::to_string);
    let bytes = out
        .lines()
        .find(|l| l.contains(" bytes in ") && l.contains("Mbit/sec"))
        .and_then(|l| word(l, 0)?.parse().ok())?;
    let iters_line = out
        .lines()
        .find(|l| l.contains(" iters in ") && l.contains("usec/iter"))?;
    let iters = word(iters_line, 0)?.parse().ok()?;
    let usec = word(iters_line, 6)?.parse().ok()?;
    Some((bytes, iters, usec))
}

/// The LID and GID an ibv_*_pingpong printed for its `which` ("local" or "remote") QPs:
/// "  local address:  LID 0x0001, QPN 0x000011, PSN 0x3b2c1a, GID ::" (the UD tool puts a
/// colon before GID).
fn addresses(out: &str, which: &str) -> Vec<(u16, String)> {
    out.lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{which} address:")))
        .filter_map(|rest| {
            let lid = rest.split("LID 0x").nth(1)?.get(..4)?;
            let lid = u16::from_str_radix(lid, 16).ok()?;
            let gid = rest.split("GID ").nth(1)?.trim().to_string();
            Some((lid, gid))
        })
        .collect()
}

/// What a pingpong over `dev` must show on both ends: the iterations asked for, the bytes
/// they move (2 x size x iterations; `size` None where the tool picks it by the MTU), each
/// end's own address and its peer's (`lids` and `gids` as node 1's and node 2's), and no
/// data the tool's -c check refused.
fn pingpong_ok(
    p: &Pair,
    iters: u64,
    size: Option<u64>,
    lids: [u16; 2],
    gids: Option<[&str; 2]>,
) -> Result<String, CheckError> {
    both_ok(p)?;
    let mut said = String::new();
    for (end, ran, me, peer) in [("server", &p.server, 0, 1), ("client", &p.client, 1, 0)] {
        let out = &ran.out;
        ensure!(
            !out.contains("invalid data") && !out.contains("Failed status"),
            "{end} saw bad data or a failed completion:\n{out}"
        );
        let Some((bytes, n, usec)) = pingpong_summary(out) else {
            return fail(format!("{end}: no summary lines:\n{out}"));
        };
        ensure!(n == iters, "{end}: {n} iterations, not {iters}:\n{out}");
        match size {
            Some(s) => ensure!(
                bytes == 2 * s * iters,
                "{end}: {bytes} bytes, not 2 x {s} x {iters}:\n{out}"
            ),
            None => ensure!(
                bytes > 0 && bytes % (2 * iters) == 0 && bytes / (2 * iters) <= 4096,
                "{end}: {bytes} bytes is no whole message size for {iters} round trips:\n{out}"
            ),
        }
        ensure!(usec > 0.0, "{end}: {usec} usec/iter:\n{out}");
        let local = addresses(out, "local");
        let remote = addresses(out, "remote");
        ensure!(
            !local.is_empty() && local.len() == remote.len(),
            "{end}: {} local and {} remote addresses:\n{out}",
            local.len(),
            remote.len()
        );
        for (addrs, who) in [(&local, me), (&remote, peer)] {
            for (lid, gid) in addrs.iter() {
                ensure!(
                    *lid == lids[who],
                    "{end}: LID {lid:#06x} where node{}'s is {:#06x}:\n{out}",
                    who + 1,
                    lids[who]
                );
                if let Some(g) = gids {
                    ensure!(
                        gid == g[who],
                        "{end}: GID {gid} where node{}'s is {}:\n{out}",
                        who + 1,
                        g[who]
                    );
                }
            }
        }
        if end == "client" {
            said = format!(
                "{n} round trips, {} B each, {usec} us/iter, {} QP(s)",
                bytes / (2 * iters),
                local.len()
            );
        }
    }
    Ok(said)
}

/// The text rping puts in its buffer for ping `n`: "rdma-ping-N: " and then ASCII from
/// 'A' + N (wrapping from 'z' back to 'A') up to the buffer's last byte (a NUL).
fn rping_text(n: usize, size: usize) -> String {
    let mut s = format!("rdma-ping-{n}: ");
    let mut c = b'A' + (n % 58) as u8;
    while s.len() < size - 1 {
        s.push(c as char);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    s
}

/// Every ping of `count` arrived with its pattern, in order, on both ends (the client
/// checks each with -V too).
fn rping_ok(p: &Pair, count: usize) -> Result<String, CheckError> {
    both_ok(p)?;
    for (end, ran, prefix) in [
        ("server", &p.server, "server ping data: "),
        ("client", &p.client, "ping data: "),
    ] {
        let out = &ran.out;
        ensure!(
            !out.contains("data mismatch"),
            "{end}: rping found a mismatch:\n{out}"
        );
        let got: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix(prefix)).collect();
        ensure!(
            got.len() == count,
            "{end}: {} pings printed, not {count}:\n{out}",
            got.len()
        );
        for (n, line) in got.iter().enumerate() {
            let want = rping_text(n, RPING_SIZE);
            ensure!(
                *line == want,
                "{end}: ping {n} carried {line:?}, not {want:?}"
            );
        }
    }
    Ok(format!(
        "{count} pings of {RPING_SIZE} B, every pattern intact"
    ))
}

/// The numbers of perftest's result line (the line under the one starting "#bytes").
fn perftest_row(out: &str) -> Option<Vec<f64>> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next()?;
    let row = lines.find(|l| !l.trim().is_empty())?;
    row.split_whitespace().map(|w| w.parse().ok()).collect()
}

/// perftest's latency result: the size and iterations asked for, t_min <= t_typical and
/// t_min <= t_avg <= t_max, all positive.
/// A perftest run between the nodes: `cmd` served on node 1, and on node 2 against it. A
/// run whose clock calibration failed (perftest times with the TSC and gives up, "Can't
/// produce a report", when the TSC and the wall clock do not keep step, as a vCPU under
/// TCG on a loaded host may not) says nothing of RDMA: it is run again, at most twice.
fn perftest_pair(tb: &mut Testbed, cmd: &str) -> Result<Pair, CheckError> {
    let mut tries = 0;
    loop {
        let p = pair(tb, cmd, &format!("{cmd} {SERVER_IB0}"), Listen::Tcp)?;
        let clock = |r: &Ran| r.out.contains("Correlation coefficient r^2");
        tries += 1;
        if !(clock(&p.server) || clock(&p.client)) || tries == 3 {
            return Ok(p);
        }
        eprintln!("note: `{cmd}`: perftest's clock calibration failed in the guest; again");
    }
}

fn perftest_lat_ok(p: &Pair, size: u64, iters: u64) -> Result<String, CheckError> {
    both_ok(p)?;
    let out = &p.client.out;
    let Some(row) = perftest_row(out) else {
        return fail(format!("no result line:\n{out}"));
    };
    ensure!(row.len() >= 6, "short result line {row:?}:\n{out}");
    let (bytes, n, min, max, typical, avg) = (row[0], row[1], row[2], row[3], row[4], row[5]);
    ensure!(
        bytes == size as f64 && n == iters as f64,
        "{bytes} B x {n}, not {size} B x {iters}:\n{out}"
    );
    ensure!(
        min > 0.0 && min <= typical && min <= avg && avg <= max,
        "latencies out of order (min {min}, typical {typical}, avg {avg}, max {max}):\n{out}"
    );
    Ok(format!(
        "{size} B: t_min {min} us, t_typical {typical} us, t_avg {avg} us"
    ))
}

/// perftest's bandwidth result: the size and iterations asked for, a positive average
/// and message rate.
fn perftest_bw_ok(p: &Pair, size: u64, iters: u64) -> Result<String, CheckError> {
    both_ok(p)?;
    let out = &p.client.out;
    let Some(row) = perftest_row(out) else {
        return fail(format!("no result line:\n{out}"));
    };
    ensure!(row.len() >= 5, "short result line {row:?}:\n{out}");
    let (bytes, n, peak, avg, rate) = (row[0], row[1], row[2], row[3], row[4]);
    ensure!(
        bytes == size as f64 && n == iters as f64,
        "{bytes} B x {n}, not {size} B x {iters}:\n{out}"
    );
    ensure!(
        avg > 0.0 && peak >= avg && rate > 0.0,
        "bandwidth peak {peak}, average {avg} MB/s, {rate} Mpps:\n{out}"
    );
    Ok(format!(
        "{size} B x {iters}: {avg} MB/s average, {rate} Mpps"
    ))
}

/// `ibv_devinfo -v`'s section of device `dev` (from its "hca_id:" line to the next).
fn devinfo_section<'a>(out: &'a str, dev: &str) -> Option<&'a str> {
    let start = out.find(&format!("hca_id:\t{dev}\n"))?;
    let rest = &out[start..];
    let end = rest[1..].find("hca_id:").map_or(rest.len(), |e| e + 1);
    Some(&rest[..end])
}

/// The value of `key:` in an ibv_devinfo section (the first such line).
fn devinfo_value<'a>(section: &'a str, key: &str) -> Option<&'a str> {
    section
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .map(str::trim)
}

/// The checks' results, reported as they come and all together at the end.
#[derive(Default)]
struct Checks {
    failed: Vec<String>,
    passed: usize,
}

impl Checks {
    fn run(
        &mut self,
        tb: &mut Testbed,
        what: &str,
        f: impl FnOnce(&mut Testbed) -> Result<String, CheckError>,
    ) {
        let t = Instant::now();
        match f(tb) {
            Ok(said) => {
                self.passed += 1;
                eprintln!("ok   {what} ({:.1?}): {said}", t.elapsed());
            }
            Err(why) => {
                eprintln!("FAIL {what} ({:.1?}): {why}", t.elapsed());
                self.failed.push(format!("{what}: {why}"));
            }
        }
    }
}

/// Why hcab0's user-level verbs may be missing on a node: whether ib_uverbs attached to it,
/// and whether the image carries our provider.
fn hcab0_diagnosis(tb: &mut Testbed, i: usize) -> String {
    tb.agents[i]
        .run(
            "for u in /sys/class/infiniband_verbs/uverbs*; do echo \"$u: $(cat $u/ibdev)\"; done; \
             ls /usr/lib/x86_64-linux-gnu/libibverbs/libhcab-rdmav34.so \
             /etc/libibverbs.d/hcab.driver 2>&1; ibv_devices 2>&1",
            T,
        )
        .unwrap_or_else(|e| format!("(no answer: {e})"))
}

/// The GID index of rxe0's IPv4 address (::ffff:a.b.c.d), which the pingpong tools need
/// (-g) to reach the peer over RoCE v2.
fn rxe_gid_index(tb: &mut Testbed, i: usize) -> Result<u32, CheckError> {
    let out = tb.agents[i].run(
        "cd /sys/class/infiniband/rxe0/ports/1/gids && for g in *; do \
             case $(cat $g) in 0000:0000:0000:0000:0000:ffff:*) echo $g; break;; esac; done",
        T,
    )?;
    out.trim()
        .parse()
        .map_err(|_| CheckError::Wrong(format!("rxe0 has no IPv4 GID: {out:?}")))
}

#[test]
fn test_user_verbs_rdma_core_tools_on_hcab0_and_softroce() {
    let Some(image) = image_or_skip("user_verbs") else {
        return;
    };
    // Whether the image carries our provider (images/build.py builds it when
    // guest-user/libhcab/build.sh is there): said with every hcab0 failure.
    let manifest = image.initramfs.with_file_name("manifest.json");
    let provider = std::fs::read_to_string(&manifest)
        .map(|m| m.contains("\"hcab_provider\": true"))
        .unwrap_or(false);
    if !provider {
        eprintln!(
            "note: {} has no hcab provider (guest-user/libhcab/build.sh was not there when \
             images/build.py built it): hcab0's checks will fail",
            image.name
        );
    }
    let spec = ClusterSpec {
        link: true,
        ..e2e::qemu_spec(&image, "user_verbs", 2)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();
    tb.rxe_up()
        .unwrap_or_else(|e| panic!("rxe-up: {e}\n{}", tb.console(0)));
    tb.ipoib_up()
        .unwrap_or_else(|e| panic!("ipoib-up: {e}\n{}", tb.console(0)));
    let mut checks = Checks::default();

    // The image: ib_uverbs and rdma_ucm loaded at boot made their device nodes.
    checks.run(
        &mut tb,
        "/dev/infiniband has uverbs and rdma_cm nodes",
        |tb| {
            let mut said = String::new();
            for a in tb.agents.iter_mut() {
                let out = a.run(
                    "lsmod | cut -d' ' -f1 | grep -x 'ib_uverbs\\|rdma_ucm'; ls /dev/infiniband",
                    T,
                )?;
                let words: Vec<&str> = out.split_whitespace().collect();
                for want in ["ib_uverbs", "rdma_ucm", "rdma_cm"] {
                    ensure!(words.contains(&want), "{}: no {want}:\n{out}", a.name);
                }
                ensure!(
                    words.iter().any(|w| w.starts_with("uverbs")),
                    "{}: no /dev/infiniband/uverbsN:\n{out}",
                    a.name
                );
                said = words.join(" ");
            }
            Ok(said)
        },
    );

    // `modprobe nvmet-rdma`: the module and every dependency from modules.dep;
    // `modprobe -r nvmet-rdma`: the module and the dependencies nothing else uses go again.
    // (busybox's modprobe exits 1 when a dependency stays in use, ib_core here, so its
    // status is not what is checked: what is loaded is.)
    checks.run(
        &mut tb,
        "modprobe nvmet-rdma; modprobe -r nvmet-rdma",
        |tb| {
            let a = &mut tb.agents[1];
            let mods = |a: &mut cluster::agent::Agent| -> Result<Vec<String>, CheckError> {
                let out = a.run("cut -d' ' -f1 /proc/modules | sort", T)?;
                Ok(out.lines().map(str::to_string).collect())
            };
            let before = mods(a)?;
            ensure!(
                !before.iter().any(|m| m == "nvmet_rdma"),
                "nvmet_rdma is loaded already"
            );
            // What modules.dep says it needs (`insmod /lib/modules/<kernel>/kernel/X.ko`
            // lines, dependencies first), as module names.
            let deps = a.run("modprobe -D nvmet-rdma", T)?;
            let deps: Vec<String> = (deps.lines())
                .filter_map(|l| l.strip_prefix("insmod "))
                .filter_map(|f| f.trim().rsplit('/').next())
                .map(|f| f.trim_end_matches(".ko").replace('-', "_"))
                .collect();
            for m in ["ib_core", "rdma_cm", "nvmet", "nvmet_rdma"] {
                ensure!(
                    deps.iter().any(|d| d == m),
                    "modprobe -D nvmet-rdma names no {m}: {deps:?}"
                );
            }
            a.run("modprobe nvmet-rdma", T)?;
            let loaded = mods(a)?;
            for m in &deps {
                ensure!(
                    loaded.contains(m),
                    "after modprobe, no {m} (of {deps:?}): {loaded:?}"
                );
            }
            let (status, out) = a.status("modprobe -r nvmet-rdma", T)?;
            let after = mods(a)?;
            ensure!(
                after == before,
                "after modprobe -r (exit {status}: {out}) the modules are {after:?}, \
             not as before {before:?}"
            );
            Ok(format!(
                "{} modules loaded ({} with dependencies), all removed again but those in use \
                 (modprobe -r exit {status})",
                loaded.len() - before.len(),
                deps.len()
            ))
        },
    );

    // hcab0, through ib_uverbs and our provider. LIDs are the nodes' (node k has LID k).
    let lids = [1u16, 2];
    let why = |tb: &mut Testbed| {
        format!(
            "\n--- node1 (uverbs devices, provider, ibv_devices):\n{}{}",
            hcab0_diagnosis(tb, 0),
            if provider {
                ""
            } else {
                "(the image has no hcab provider)\n"
            }
        )
    };
    checks.run(&mut tb, "hcab0: ibv_devinfo -v (both nodes)", |tb| {
        let mut said = Vec::new();
        for (i, lid) in lids.into_iter().enumerate() {
            let out = tb.agents[i].run("ibv_devinfo -v 2>&1", T)?;
            let Some(sec) = devinfo_section(&out, "hcab0") else {
                let listed: Vec<&str> = (out.lines())
                    .filter(|l| l.starts_with("hca_id:") || !l.starts_with('\t'))
                    .collect();
                return fail(format!(
                    "node{}: ibv_devinfo lists no hcab0: {listed:?}{}",
                    i + 1,
                    why(tb)
                ));
            };
            let guid = hca_model::abi::node_guid(lid);
            let guid = format!(
                "{:04x}:{:04x}:{:04x}:{:04x}",
                guid >> 48,
                (guid >> 32) & 0xffff,
                (guid >> 16) & 0xffff,
                guid & 0xffff
            );
            for (key, want) in [
                ("transport", "InfiniBand (0)".to_string()),
                ("node_guid", guid),
                ("state", "PORT_ACTIVE (4)".to_string()),
                ("port_lid", lid.to_string()),
                ("link_layer", "InfiniBand".to_string()),
            ] {
                ensure!(
                    devinfo_value(sec, key) == Some(want.as_str()),
                    "node{}: hcab0's {key} is {:?}, not {want:?}:\n{sec}",
                    i + 1,
                    devinfo_value(sec, key)
                );
            }
            // ATOMIC WRITE (IB_UVERBS_DEVICE_ATOMIC_WRITE, bit 40) is said where the kernel
            // has the flag (6.2+): the device runs it either way.
            let release = tb.agents[i].run("uname -r", T)?;
            let mut v = release.trim().split(['.', '-']).map(|p| p.parse::<u32>());
            let at_least_6_2 = match (v.next(), v.next()) {
                (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (6, 2),
                _ => return fail(format!("node{}: uname -r said {release:?}", i + 1)),
            };
            let flags = devinfo_value(sec, "device_cap_flags_ex")
                .and_then(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok());
            ensure!(
                flags.map(|f| f >> 40 & 1 == 1) == Some(at_least_6_2),
                "node{}: hcab0's device_cap_flags_ex is {flags:x?} on {}: ATOMIC_WRITE (bit \
                 40) should be {}:\n{sec}",
                i + 1,
                release.trim(),
                if at_least_6_2 { "set" } else { "clear" }
            );
            said.push(format!("node{} port_lid {lid}", i + 1));
        }
        Ok(format!(
            "hcab0: InfiniBand, PORT_ACTIVE, {}",
            said.join(", ")
        ))
    });
    for (cmd, iters, size) in [
        (
            "ibv_rc_pingpong -d hcab0 -c -n 200".to_string(),
            200,
            Some(4096),
        ),
        (
            "ibv_rc_pingpong -d hcab0 -c -n 200 -s 8".to_string(),
            200,
            Some(8),
        ),
        (
            "ibv_uc_pingpong -d hcab0 -c -n 200".to_string(),
            200,
            Some(4096),
        ),
        ("ibv_ud_pingpong -d hcab0 -c".to_string(), 1000, None),
        ("ibv_srq_pingpong -d hcab0 -c".to_string(), 1000, Some(4096)),
    ] {
        checks.run(
            &mut tb,
            &format!("hcab0: {cmd} [server] / {cmd} {SERVER_IB0}"),
            |tb| {
                let p = pair(tb, &cmd, &format!("{cmd} {SERVER_IB0}"), Listen::Tcp)?;
                pingpong_ok(&p, iters, size, lids, None).map_err(|e| e.diagnosed(why(tb)))
            },
        );
    }
    checks.run(
        &mut tb,
        &format!("hcab0: rping -s -a {SERVER_IB0} -v -C 20 / rping -c -a {SERVER_IB0} -v -V -C 20"),
        |tb| {
            let p = pair(
                tb,
                &format!("rping -s -a {SERVER_IB0} -v -C 20"),
                &format!("rping -c -a {SERVER_IB0} -v -V -C 20"),
                Listen::RdmaCm,
            )?;
            rping_ok(&p, 20).map_err(|e| e.diagnosed(why(tb)))
        },
    );
    checks.run(&mut tb, "hcab0: ib_send_lat -d hcab0 -s 8 -n 1000", |tb| {
        let cmd = "ib_send_lat -d hcab0 -s 8 -n 1000";
        let p = perftest_pair(tb, cmd)?;
        perftest_lat_ok(&p, 8, 1000).map_err(|e| e.diagnosed(why(tb)))
    });
    // perftest's own defaults (its -h says them): 5,000 RDMA Writes, 1,000 RDMA Reads of
    // 64 KiB, 1,000 8-byte fetch-and-adds; PCIe relaxed ordering asked for in every MR
    // (IBV_ACCESS_RELAXED_ORDERING, an optional access flag a device may ignore). Then
    // READs of 32 MiB, which the responder answers a piece at a time over many turns.
    for (cmd, size, iters) in [
        ("ib_write_bw -d hcab0 -s 65536", 65536, 5000),
        ("ib_read_bw -d hcab0", 65536, 1000),
        ("ib_atomic_bw -d hcab0", 8, 1000),
        ("ib_read_bw -d hcab0 -s 33554432 -n 20", 33554432, 20),
    ] {
        checks.run(&mut tb, &format!("hcab0: {cmd}"), |tb| {
            let p = perftest_pair(tb, cmd)?;
            perftest_bw_ok(&p, size, iters).map_err(|e| e.diagnosed(why(tb)))
        });
    }
    // rdma_cm over UD: udaddy resolves the peer's address and route through the SA and
    // trades datagrams; mckey joins a multicast group through the SA (the fabric's
    // MCMemberRecord join) and the receiver takes every datagram the sender sent to it.
    checks.run(
        &mut tb,
        &format!("hcab0: udaddy -b {SERVER_IB0} / udaddy -s {SERVER_IB0}"),
        |tb| {
            let p = pair(
                tb,
                &format!("udaddy -b {SERVER_IB0}"),
                &format!("udaddy -s {SERVER_IB0}"),
                Listen::RdmaCm,
            )?;
            both_ok(&p).map_err(|e| e.diagnosed(why(tb)))?;
            for (end, r) in [("server", &p.server), ("client", &p.client)] {
                ensure!(
                    r.out.contains("data transfers complete"),
                    "udaddy's {end} moved no data:\n{}",
                    r.out
                );
            }
            Ok("datagrams both ways".into())
        },
    );
    checks.run(
        &mut tb,
        &format!(
            "hcab0: mckey -m 239.1.2.3 -b {SERVER_IB0} -C 8 / mckey -m 239.1.2.3 -b 10.78.0.2 -s -C 8"
        ),
        |tb| {
            let p = pair(
                tb,
                &format!("mckey -m 239.1.2.3 -b {SERVER_IB0} -C 8"),
                "mckey -m 239.1.2.3 -b 10.78.0.2 -s -C 8",
                Listen::Joined([239, 1, 2, 3]),
            )?;
            both_ok(&p).map_err(|e| e.diagnosed(why(tb)))?;
            ensure!(
                p.server.out.contains("data transfers complete"),
                "the receiver did not take all 8 datagrams:\n{}",
                p.server.out
            );
            let mlid = p
                .server
                .out
                .lines()
                .find(|l| l.contains("joined dgid"))
                .unwrap_or("")
                .to_string();
            ensure!(mlid.contains("mlid 0xc"), "no multicast LID: {mlid}");
            Ok(mlid.trim().to_string())
        },
    );
    // A hostile process (guest-user/tests/uverbs-hostile.c): the reserved lkey, forged
    // keys, producer indices, WQEs and doorbells on stale mappings get it errors only; a
    // clean process beside it keeps its data intact, and one killed mid-traffic leaves the
    // device working for the next.
    checks.run(&mut tb, "hcab0: uverbs-hostile", |tb| {
        let out = tb.agents[0].run("uverbs-hostile 2>&1; echo exit=$?", T)?;
        let summary = out
            .lines()
            .find(|l| l.starts_with("uverbs-hostile:") && l.contains(" passed, "))
            .unwrap_or("");
        let failed: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
        ensure!(
            failed.is_empty() && summary.contains(" 0 failed") && out.contains("exit=0"),
            "uverbs-hostile failed: {failed:?}\n{out}{}",
            why(tb)
        );
        let passed = out.lines().filter(|l| l.starts_with("PASS")).count();
        ensure!(passed >= 60, "only {passed} checks ran:\n{out}");
        Ok(summary.to_string())
    });

    // An adapter's catastrophic error under a process (`hcabench fault node2 fatal`), then
    // a function reset underneath its driver (`reset`): the process hears
    // IBV_EVENT_DEVICE_FATAL and its context dies; hca_ib resets the device and registers
    // hcab0 again, and new processes run on it as before.
    for fault in [
        hca_model::AdapterFault::Fatal,
        hca_model::AdapterFault::Reset,
    ] {
        checks.run(
            &mut tb,
            &format!("hcab0: a process across node2's adapter's {}", fault.name()),
            |tb| {
                // ib0 down first: this check is about a user process. With ib0 up across the
                // adapter's fatal, Debian 6.12's IPoIB once in a while warns in its own
                // teardown (WARN_ON at ipoib_main.c:2030, in ipoib_ndo_uninit, called from
                // ipoib_remove_one as hca_ib unregisters the device: CI at stops 58 and 60;
                // which of IPoIB's flags it finds set is not traced yet). IPoIB across a
                // fatal is faults.rs's to exercise.
                tb.agents[1].run(
                    "ip link set ib0 down; dmesg -c > /dev/null; rm -f /tmp/aw.log; \
                 (ibv_asyncwatch -d hcab0 > /tmp/aw.log 2>&1; \
             echo exit=$? >> /tmp/aw.log) & \
             for i in $(seq 50); do grep -q 'async event FD' /tmp/aw.log && break; \
             sleep 0.1; done",
                    T,
                )?;
                ensure!(
                    tb.fabric().adapter_fault(2, fault) == Some(true),
                    "node2's adapter was not on the fabric"
                );
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                // node2's whole kernel log since the fault, so that a warning shows its own line
                // and frames (once in CI a trace came during the teardown, its cause unseen).
                let log = loop {
                    let log = tb.agents[1].run("cat /tmp/aw.log; dmesg | tail -150", T)?;
                    if log.contains("recovered from a catastrophic error")
                        && log.contains("IBV_EVENT_DEVICE_FATAL")
                        || std::time::Instant::now() > deadline
                    {
                        break log;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                };
                ensure!(
                    log.contains("event_type IBV_EVENT_DEVICE_FATAL (8)")
                        && log.contains("recovered from a catastrophic error")
                        && !log.contains("exit=0")
                        && !log.contains("Oops")
                        && !log.contains("Call Trace"),
                    "the process did not hear the error, or the device did not recover:\n{log}{}",
                    why(tb)
                );
                // (ibv_asyncwatch's next read would fail: its device is gone. It waits for one.)
                tb.agents[1].run("killall -q ibv_asyncwatch; true", T)?;
                // IPoIB's ib0 came back down and empty: up again, and node1 forgets the old QPN.
                tb.agents[1].run("ipoib-up 10.78.0.2/24", T)?;
                tb.agents[0].run("ip neigh flush dev ib0", T)?;
                let cmd = "ibv_rc_pingpong -d hcab0 -c -n 100";
                let p = pair(tb, cmd, &format!("{cmd} {SERVER_IB0}"), Listen::Tcp)?;
                pingpong_ok(&p, 100, Some(4096), [1, 2], None).map_err(|e| e.diagnosed(why(tb)))?;
                Ok(
                    "IBV_EVENT_DEVICE_FATAL heard, hcab0 back, 100 verified round trips after"
                        .into(),
                )
            },
        );
    }

    // The kernel loads a module it asks for through /sbin/modprobe: `rdma link add ...
    // type rxe` with rdma_rxe unloaded brings it back (as rdma-link-rxe).
    checks.run(
        &mut tb,
        "rdma link add rxe0 type rxe netdev eth0 (rdma_rxe unloaded)",
        |tb| {
            let out = tb.agents[1].run(
                "rdma link delete rxe0 && rmmod rdma_rxe && rdma link add rxe0 type rxe \
                 netdev eth0 && for i in $(seq 100); do \
                 [ \"$(cat /sys/class/infiniband/rxe0/ports/1/state)\" = '4: ACTIVE' ] && \
                 break; sleep 0.1; done; grep -c '^rdma_rxe ' /proc/modules; \
                 cat /sys/class/infiniband/rxe0/ports/1/state",
                T,
            )?;
            ensure!(
                out.contains("1\n4: ACTIVE"),
                "rdma_rxe or rxe0 not back:\n{out}"
            );
            Ok("rdma_rxe loaded by the kernel, rxe0 ACTIVE again".into())
        },
    );

    // The control: rdma-core's tools on SoftRoCE (RoCE v2: the GID index of each node's
    // IPv4 address; LIDs are 0). After hcab0's checks, so that a guest SoftRoCE takes down
    // (it has, under TCG) leaves those already run.
    let gids = ["::ffff:10.77.0.1", "::ffff:10.77.0.2"];
    let gix = (0..2)
        .map(|i| rxe_gid_index(&mut tb, i))
        .collect::<Result<Vec<_>, _>>();
    match gix {
        Ok(g) if g[0] == g[1] => {
            let gx = g[0];
            checks.run(&mut tb, "rxe0: ibv_devinfo -v", |tb| {
                let out = tb.agents[0].run("ibv_devinfo -v", T)?;
                let Some(sec) = devinfo_section(&out, "rxe0") else {
                    return fail(format!("no rxe0:\n{out}"));
                };
                ensure!(
                    devinfo_value(sec, "transport") == Some("InfiniBand (0)")
                        && devinfo_value(sec, "state") == Some("PORT_ACTIVE (4)")
                        && devinfo_value(sec, "link_layer") == Some("Ethernet"),
                    "rxe0 is not an active RoCE port:\n{sec}"
                );
                Ok("rxe0: transport InfiniBand, PORT_ACTIVE, link layer Ethernet".into())
            });
            for (cmd, iters, size) in [
                (
                    format!("ibv_rc_pingpong -d rxe0 -g {gx} -c -n 200"),
                    200,
                    Some(4096),
                ),
                (
                    format!("ibv_ud_pingpong -d rxe0 -g {gx} -c -n 100"),
                    100,
                    None,
                ),
                (
                    format!("ibv_srq_pingpong -d rxe0 -g {gx} -c -n 100"),
                    100,
                    Some(4096),
                ),
            ] {
                checks.run(
                    &mut tb,
                    &format!("rxe0: {cmd} [server] / {cmd} {SERVER_IB0}"),
                    |tb| {
                        let p = pair(tb, &cmd, &format!("{cmd} {SERVER_IB0}"), Listen::Tcp)?;
                        pingpong_ok(&p, iters, size, [0, 0], Some(gids))
                    },
                );
            }
            checks.run(
                &mut tb,
                &format!("rxe0: rping -s -a {SERVER_ETH0} -v -C 20 / rping -c -a {SERVER_ETH0} -v -V -C 20"),
                |tb| {
                    let p = pair(
                        tb,
                        &format!("rping -s -a {SERVER_ETH0} -v -C 20"),
                        &format!("rping -c -a {SERVER_ETH0} -v -V -C 20"),
                        Listen::RdmaCm,
                    )?;
                    rping_ok(&p, 20)
                },
            );
            checks.run(&mut tb, "rxe0: ib_send_lat -d rxe0 -s 8 -n 200", |tb| {
                let cmd = "ib_send_lat -d rxe0 -s 8 -n 200";
                let p = perftest_pair(tb, cmd)?;
                perftest_lat_ok(&p, 8, 200)
            });
            checks.run(&mut tb, "rxe0: ib_write_bw -d rxe0 -s 65536 -n 100", |tb| {
                let cmd = "ib_write_bw -d rxe0 -s 65536 -n 100";
                let p = perftest_pair(tb, cmd)?;
                perftest_bw_ok(&p, 65536, 100)
            });
        }
        other => checks
            .failed
            .push(format!("rxe0: the nodes' IPv4 GID indexes: {other:?}")),
    }

    // A guest that died (its shell socket broke) fails every later check: its console's
    // end says why (a panic's lines reach it).
    let consoles = if checks.failed.is_empty() {
        String::new()
    } else {
        (0..tb.agents.len())
            .map(|i| {
                format!(
                    "\n--- {}'s console ---\n{}",
                    tb.agents[i].name,
                    tb.console(i)
                )
            })
            .collect()
    };
    assert!(
        checks.failed.is_empty(),
        "{} of {} user-verbs checks failed:\n\n{}{consoles}",
        checks.failed.len(),
        checks.failed.len() + checks.passed,
        checks.failed.join("\n\n")
    );
}

#[test]
fn rping_text_is_what_rping_writes() {
    // As rping printed it on rxe0 (rdma-core 44).
    assert_eq!(
        rping_text(0, 64),
        "rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert_eq!(
        rping_text(9, 64),
        "rdma-ping-9: JKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyzA"
    );
    assert_eq!(rping_text(57, 64).as_bytes()[14], b'z');
    assert_eq!(rping_text(58, 64).as_bytes()[14], b'A');
}

#[test]
fn the_parsers_read_the_tools_output() {
    let rc = "  local address:  LID 0x0002, QPN 0x000011, PSN 0x257dc6, GID ::\n  \
              remote address: LID 0x0001, QPN 0x000012, PSN 0xfcee4e, GID ::\n\
              1638400 bytes in 1.36 seconds = 9.67 Mbit/sec\n\
              200 iters in 1.36 seconds = 6779.51 usec/iter\n";
    assert_eq!(pingpong_summary(rc), Some((1638400, 200, 6779.51)));
    assert_eq!(addresses(rc, "local"), vec![(2, "::".to_string())]);
    assert_eq!(addresses(rc, "remote"), vec![(1, "::".to_string())]);
    let ud = "  local address:  LID 0x0000, QPN 0x000013, PSN 0x0109e5: GID ::ffff:10.77.0.2\n";
    assert_eq!(
        addresses(ud, "local"),
        vec![(0, "::ffff:10.77.0.2".to_string())]
    );
    let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n \
              65536      200              8.92               5.28   \t\t   0.000085\n";
    assert_eq!(
        perftest_row(bw),
        Some(vec![65536.0, 200.0, 8.92, 5.28, 0.000085])
    );
    let info = "hca_id:\trxe0\n\ttransport:\t\t\tInfiniBand (0)\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\
                \t\t\tport_lid:\t\t0\nhca_id:\thcab0\n\ttransport:\t\t\tInfiniBand (0)\n\
                \t\t\tport_lid:\t\t2\n";
    let sec = devinfo_section(info, "hcab0").unwrap();
    assert_eq!(devinfo_value(sec, "port_lid"), Some("2"));
    let sec = devinfo_section(info, "rxe0").unwrap();
    assert_eq!(devinfo_value(sec, "port_lid"), Some("0"));
    assert_eq!(devinfo_value(sec, "state"), Some("PORT_ACTIVE (4)"));
}
