//! Boots the two-guest verbs testbed, runs the commands given after the directory on node1,
//! and prints what they answered (for poking at the guests by hand).
use std::time::Duration;

fn main() {
    let image = e2e::prerequisites().expect("prerequisites");
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: testbed DIR [N:CMD]..."));
    let spec = cluster::ClusterSpec {
        link: true,
        ..cluster::ClusterSpec::new(cluster::Backend::Qemu, image, dir, 2)
    };
    let mut tb =
        cluster::verbs::Testbed::boot(&spec, e2e::BOOT_TIMEOUT, &mut |m| eprintln!("{m}")).unwrap();
    for a in args {
        let (n, cmd) = a.split_once(':').expect("N:CMD");
        let i: usize = n.parse().expect("node index");
        let r = tb.agents[i].status(cmd, Duration::from_secs(60));
        match r {
            Ok((rc, out)) => println!("[{i}] {cmd} -> {rc}\n{out}"),
            Err(e) => println!("[{i}] {cmd} -> {e}"),
        }
    }
}
