//! End-to-end: UCX and MPI on hcab0, with Debian 12's own packages (ucx-utils, mpich,
//! openmpi-bin, netpipe-mpich2 on a userland disk that `images/build.py --package` builds,
//! with guest-user/mpi's mpi-check built against each MPI). Four guests.
//!
//! Asserted:
//! - `ucx_info -d` lists memory domain hcab0 with transports rc_verbs and ud_verbs on
//!   device hcab0:1;
//! - `ucx_perftest` between two guests completes a tag-matching bandwidth test on each
//!   transport, on the lane UCX reports (rc_verbs/hcab0:1, ud_verbs/hcab0:1), with a
//!   bandwidth above zero. ucx_perftest 1.13 has no option to check payloads, so the data
//!   check is mpi-check's:
//! - MPICH (ch4:ucx) and Open MPI (pml ucx) run mpi-check across the four guests, one
//!   rank on each, through the launcher `hcabench mpirun` uses (`cluster::mpi::run`:
//!   hydra's manual launcher, or Open MPI's mpirun with our rsh agent; the remote parts
//!   started through the guests' shells); MPICH over rc_verbs (UCX's default choice, as its
//!   log shows) and over ud_verbs alone, Open MPI over rc_verbs: rings of 1 B to 1 MiB checked byte by byte, an allreduce
//!   against its closed form (checked here too), a broadcast, and a Jacobi relaxation
//!   split over the ranks against the sequential one, bit for bit.

use std::time::{Duration, Instant};

use cluster::agent::Agent;
use cluster::mpi::{self, Job, Mpi};
use cluster::verbs::Testbed;
use cluster::{ClusterSpec, Image};
use e2e::{image_or_skip, repo_root, BOOT_TIMEOUT};

const NODES: usize = 4;
const T: Duration = Duration::from_secs(120);
/// Debian 12's packages the guests need.
const PACKAGES: [&str; 4] = ["ucx-utils", "mpich", "openmpi-bin", "netpipe-mpich2"];
/// What mpi-check's allreduce must give: the sum of i * i below its N (1000003).
const SUM: i128 = {
    let n: i128 = 1_000_003;
    n * (n - 1) * (2 * n - 1) / 6
};
/// UCX over hcab0's RC QPs, with UD for its wire-up messages only (rc_verbs alone has no
/// way to exchange the addresses a connection needs).
const RC: &str = "UCX_TLS=rc_verbs,ud_verbs:aux,self UCX_NET_DEVICES=hcab0:1";
const UD: &str = "UCX_TLS=ud_verbs,self UCX_NET_DEVICES=hcab0:1";

/// The lines of `ucx_info -d` from memory domain `md` to the next memory domain.
fn md_section<'a>(info: &'a str, md: &str) -> Option<&'a str> {
    let start = info.find(&format!("# Memory domain: {md}\n"))?;
    let rest = &info[start + 1..];
    let end = rest.find("# Memory domain:").unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The final line of `ucx_perftest -f -I`: its overall bandwidth (MB/s, the 6th number)
/// and the lane it names (`rc_verbs/hcab0:1`).
fn perftest_final(out: &str) -> Option<(f64, String)> {
    let line = out.lines().rev().find(|l| l.contains("lane[0]:"))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .map_while(|w| w.parse::<f64>().ok())
        .collect();
    let lane = line.split("lane[0]:").nth(1)?.split_whitespace().next()?;
    let lane = lane.split_once(':').map_or(lane, |(_, l)| l);
    Some((*nums.get(5)?, lane.trim_end_matches(".0").to_string()))
}

/// mpi-check's verdict line, checked: the allreduce's sum right, and every rank there, on
/// its node (round-robin over `nodes` guests, named node1, node2, ...).
fn check_mpi_output(out: &str, ranks: usize, nodes: usize) -> Result<(), String> {
    let ok = out
        .lines()
        .find(|l| l.starts_with("MPI-CHECK "))
        .ok_or("no MPI-CHECK line")?;
    if !ok.starts_with(&format!("MPI-CHECK OK ranks={ranks} ")) {
        return Err(format!("mpi-check says: {ok}"));
    }
    if !ok.contains(&format!(" sum={SUM} ")) {
        return Err(format!("allreduce sum is not {SUM}: {ok}"));
    }
    for r in 0..ranks {
        let node = r % nodes + 1;
        if !out.contains(&format!("rank {r} of {ranks} on node{node}\n")) {
            return Err(format!("rank {r} never said it started on node{node}"));
        }
    }
    Ok(())
}

fn run_perftest(tb: &mut Testbed, env: &str, test: &str) -> (f64, String) {
    tb.agents[1]
        .run(
            &format!("({env} timeout -s KILL 100 ucx_perftest > /tmp/perftest-srv.log 2>&1 &)"),
            T,
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = tb.agents[0]
        .run(
            &format!("{env} ucx_perftest 10.78.0.2 -t {test} -s 65536 -n 200 -w 20 -f -I 2>&1"),
            T,
        )
        .unwrap_or_else(|e| panic!("ucx_perftest {test} ({env}): {e}"));
    perftest_final(&out).unwrap_or_else(|| panic!("ucx_perftest {test} ({env}):\n{out}"))
}

fn mpi_run(tb: &mut Testbed, which: Mpi, env: &[(&str, &str)]) -> mpi::Outcome {
    let program = match which {
        Mpi::Mpich => "mpi-check",
        Mpi::OpenMpi => "mpi-check.openmpi",
    };
    let job = Job {
        mpi: which,
        ranks: NODES,
        program: vec![program.into()],
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        secs: 120,
    };
    let t0 = Instant::now();
    let out = mpi::run(&mut tb.agents, &job, &mut |_| {})
        .unwrap_or_else(|e| panic!("mpirun {env:?}: {e}"));
    eprintln!(
        "{program}, {} ranks on {NODES} guests {env:?}: {:.1?}",
        job.ranks,
        t0.elapsed()
    );
    assert_eq!(out.status, Some(0), "mpiexec's status:\n{}", out.output);
    if let Err(why) = check_mpi_output(&out.output, job.ranks, NODES) {
        panic!("{program} {env:?}: {why}\n{}", out.output);
    }
    out
}

#[test]
fn test_ucx_mpich_and_open_mpi_run_over_hcab0_across_four_guests() {
    let Some(image) = image_or_skip("mpi") else {
        return;
    };
    let t0 = Instant::now();
    let pkgs: Vec<String> = PACKAGES.iter().map(|p| p.to_string()).collect();
    let disk = Image::build_userland(&repo_root().join("target/images"), &pkgs)
        .unwrap_or_else(|e| panic!("the userland disk with {PACKAGES:?}: {e}"));
    let image = Image {
        userland: Some(disk),
        ..image
    };
    let spec = ClusterSpec {
        ram_mib: 512,
        ..e2e::qemu_spec(&image, "mpi", NODES)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();
    tb.ipoib_up()
        .unwrap_or_else(|e| panic!("ipoib-up: {e}\n{}", tb.console(0)));
    for a in tb.agents.iter_mut() {
        a.run(
            "userland-up && export PATH=/usr/sbin:/usr/bin:/sbin:/bin && \
             test -x /usr/bin/mpi-check",
            T,
        )
        .unwrap_or_else(|e| panic!("userland-up on {}: {e}", a.name));
    }
    eprintln!("disk and {NODES} guests up: {:.1?}", t0.elapsed());

    let info = tb.agents[0].run("ucx_info -d 2>&1", T).unwrap();
    let hcab = md_section(&info, "hcab0")
        .unwrap_or_else(|| panic!("ucx_info -d lists no memory domain hcab0:\n{info}"));
    for tl in ["rc_verbs", "ud_verbs"] {
        assert!(
            hcab.contains(&format!(
                "#      Transport: {tl}\n#         Device: hcab0:1\n"
            )),
            "ucx_info -d: no {tl} on hcab0:1:\n{hcab}"
        );
    }

    for (env, lane) in [(RC, "rc_verbs/hcab0:1"), (UD, "ud_verbs/hcab0:1")] {
        let (mb, used) = run_perftest(&mut tb, env, "tag_bw");
        eprintln!("ucx_perftest tag_bw 64 KiB over {used}: {mb:.1} MB/s");
        assert_eq!(used, lane, "ucx_perftest ({env}) ran on another lane");
        assert!(mb > 0.0, "ucx_perftest over {lane}: {mb} MB/s");
    }

    // UCX's own choice (its log names each endpoint's lanes), then UD alone.
    for which in [Mpi::Mpich, Mpi::OpenMpi] {
        let out = mpi_run(&mut tb, which, &[("UCX_LOG_LEVEL", "info")]);
        let lanes: Vec<&str> = (out.output.lines())
            .filter(|l| l.contains("ep_cfg[") && !l.contains("self/memory0"))
            .collect();
        assert!(
            !lanes.is_empty() && lanes.iter().all(|l| l.contains("tag(rc_verbs/hcab0:1)")),
            "{which:?}: ranks on other guests should talk over rc_verbs on hcab0; UCX \
             says:\n{}",
            lanes.join("\n")
        );
    }
    mpi_run(&mut tb, Mpi::Mpich, &[("UCX_TLS", "ud_verbs,self,sm")]);
    eprintln!("all: {:.1?}", t0.elapsed());
}

#[test]
fn test_the_parsers_read_ucx_and_mpi_check_output() {
    let info = "# Memory domain: hcab0\n#     Component: ib\n#\n#      Transport: rc_verbs\n\
                #         Device: hcab0:1\n# Memory domain: cma\n#      Transport: cma\n";
    let s = md_section(info, "hcab0").unwrap();
    assert!(s.contains("rc_verbs") && !s.contains("cma"));
    assert!(md_section(info, "mlx5_0").is_none());
    let pt = "                         200      1.000   744.200   744.200       83.98      \
              83.98        1344        1344  flags:0x4001 send length 65536 ???() \
              lane[0]:  1:ud_verbs/hcab0:1.0 md[1]      -> md[1]/ib/sysdev[255] am";
    assert_eq!(
        perftest_final(pt),
        Some((83.98, "ud_verbs/hcab0:1".to_string()))
    );
    let good = format!("rank 1 of 2 on node2\nrank 0 of 2 on node1\nMPI-CHECK OK ranks=2 sum={SUM} jacobi=4096x200 seconds=0.7\n");
    assert_eq!(check_mpi_output(&good, 2, 2), Ok(()));
    assert!(check_mpi_output(&good, 4, 2).is_err());
    assert!(
        check_mpi_output(&good, 2, 1).is_err(),
        "rank 1 is not on node1"
    );
    assert!(check_mpi_output(&good.replace(&SUM.to_string(), "5"), 2, 2).is_err());
    assert!(check_mpi_output("MPI-CHECK FAILED ranks=2\n", 2, 2).is_err());
    assert!(check_mpi_output(&good.replace("rank 1 of", "rank 7 of"), 2, 2).is_err());
    // The launcher's agent side: what Agent runs is a Shell.
    fn is_shell<S: mpi::Shell>() {}
    is_shell::<Agent>();
}
