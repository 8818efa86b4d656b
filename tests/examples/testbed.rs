//! Boots a testbed of QEMU guests (TB_NODES, default 2; TB_VCPUS each, default 1), runs the
//! commands given after the directory and prints what they answered (for poking at the
//! guests by hand). A command is `N:CMD` (node index N), `all:CMD` (every node at once), or
//! `mesh` (open the DSM on hcab0 everywhere and connect the RC mesh).
use std::time::Duration;

fn env_num(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let image = e2e::prerequisites().expect("prerequisites");
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: testbed DIR [N:CMD]..."));
    let nodes = env_num("TB_NODES", 2);
    let spec = cluster::ClusterSpec {
        link: nodes == 2,
        vcpus: env_num("TB_VCPUS", 1) as u32,
        ..cluster::ClusterSpec::new(cluster::Backend::Qemu, image, dir, nodes)
    };
    let mut tb =
        cluster::verbs::Testbed::boot(&spec, e2e::BOOT_TIMEOUT, &mut |m| eprintln!("{m}")).unwrap();
    let t = Duration::from_secs(600);
    for a in args {
        if a == "mesh" {
            cluster::dsm::connect_mesh(&mut tb.agents, "hcab0").unwrap();
            println!("mesh connected");
            continue;
        }
        let (n, cmd) = a.split_once(':').expect("N:CMD, all:CMD or mesh");
        if n == "all" {
            for (i, r) in cluster::dsm::run_everywhere(&mut tb.agents, cmd, t)
                .into_iter()
                .enumerate()
            {
                match r {
                    Ok((rc, out)) => println!("[{i}] {cmd} -> {rc}\n{out}"),
                    Err(e) => println!("[{i}] {cmd} -> {e}"),
                }
            }
            continue;
        }
        let i: usize = n.parse().expect("node index");
        match tb.agents[i].status(cmd, t) {
            Ok((rc, out)) => println!("[{i}] {cmd} -> {rc}\n{out}"),
            Err(e) => println!("[{i}] {cmd} -> {e}"),
        }
    }
}
