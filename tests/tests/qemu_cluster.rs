//! End-to-end: Linux guests under QEMU (TCG here) with the hcabench HCA over ivshmem.
//! One 2-node cluster serves every check below in turn (booting is the slow part).

use std::fs;
use std::time::{Duration, Instant};

use cluster::console_protocol::{INIT, PCI, PROBE, READY};
use cluster::node::WaitError;
use cluster::ClusterSpec;
use e2e::{image_or_skip, Cluster, BOOT_TIMEOUT};

/// Parses `key=value` out of a console line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn test_two_node_cluster_boots_reaches_its_hcas_and_survives_a_dead_node() {
    let Some(image) = image_or_skip("qemu_cluster") else {
        return;
    };
    let started = Instant::now();
    let mut c = Cluster::start("two", &image, 2, 256, "shell");

    // Every guest boots, finds its HCA on PCI, reads its LID from BAR2, and gets MSI-X
    // interrupts back for doorbells it rings.
    for (i, g) in c.nodes_mut().enumerate() {
        let (init, _) = g.wait_line(INIT, BOOT_TIMEOUT).unwrap();
        assert_eq!(
            field(&init, "node"),
            Some(format!("node{}", i + 1).as_str())
        );
        g.wait_line(&format!("{PCI} "), BOOT_TIMEOUT).unwrap();
        let (found, _) = g
            .wait_line(&format!("{PROBE} HCA found"), BOOT_TIMEOUT)
            .unwrap();
        assert_eq!(
            field(&found, "lid"),
            Some((i + 1).to_string().as_str()),
            "{found}"
        );
        assert_eq!(
            field(&found, "port_state"),
            Some("4"),
            "port ACTIVE: {found}"
        );
        let (rtt, _) = g
            .wait_line(&format!("{PROBE} doorbell-irq"), BOOT_TIMEOUT)
            .map_err(|e| format!("{e}\n{}", g.console()))
            .unwrap();
        eprintln!("{}: {rtt}", g.name());
        let (ready, at) = g.wait_line(READY, BOOT_TIMEOUT).unwrap();
        eprintln!("{}: {ready} ({at:.2?} after QEMU started)", g.name());
    }
    eprintln!("2-node cluster up in {:.2?}", started.elapsed());
    assert!(c.hca(0).is_some() && c.hca(1).is_some());
    guest_ram_is_a_sealed_memfd_of_its_own(&c);

    // Killing one guest leaves the other guest and the server running.
    assert!(c.kill(0), "node1 was running");
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.hca(0).is_some() {
        assert!(
            Instant::now() < deadline,
            "server did not notice node1 died"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(c.node_mut(1).is_running(), "node2 still runs");
    assert!(c.hca(1).is_some(), "node2's HCA is still up");
    let lid2 = c.hca(1).unwrap().lid();
    assert_eq!(lid2, 2);

    // node1 booted again (as after a crash on its way up) comes back whole: a new QEMU on
    // the same RAM and socket, a fresh HCA at its LID, its crashed console kept aside.
    let kept = c
        .node_mut(0)
        .boot_again(1)
        .unwrap()
        .expect("QEMU boots again");
    assert!(kept.exists() && kept.to_string_lossy().ends_with(".console.crash1"));
    let (found, _) = (c.node_mut(0))
        .wait_line(&format!("{PROBE} HCA found"), BOOT_TIMEOUT)
        .unwrap();
    assert_eq!(
        field(&found, "port_state"),
        Some("4"),
        "port ACTIVE: {found}"
    );
    c.node_mut(0).wait_line(READY, BOOT_TIMEOUT).unwrap();
    assert_eq!(c.hca(0).map(|h| h.lid()), Some(1), "node1's HCA is back");
}

/// A guest whose kernel crashes before init (here: no init to run) is booted again up to
/// `BOOT_RETRIES` times, each crashed console kept; then the wait fails with the crash on
/// the console, rather than looping or passing.
#[test]
fn test_a_guest_crashing_before_init_is_booted_again_then_fails() {
    let Some(image) = image_or_skip("qemu_cluster") else {
        return;
    };
    let spec = ClusterSpec {
        ram_mib: 256,
        job: "shell".into(),
        console_sockets: false,
        kernel_args: "rdinit=/none init=/none".into(),
        ..e2e::qemu_spec(&image, "crash", 1)
    };
    let mut c = cluster::Cluster::boot(&spec, &mut |_| {}).expect("boot");
    let e = c.wait_booted(0, READY, BOOT_TIMEOUT).unwrap_err();
    assert!(
        matches!(&e, WaitError::Stopped { console, .. } if console.contains("Kernel panic")),
        "{e}"
    );
    for k in 1..=cluster::BOOT_RETRIES {
        let kept = spec.dir.join(format!("node1.console.crash{k}"));
        let text = fs::read_to_string(&kept).unwrap_or_default();
        assert!(text.contains("Kernel panic"), "{kept:?}: {text}");
    }
    let more = spec
        .dir
        .join(format!("node1.console.crash{}", cluster::BOOT_RETRIES + 1));
    assert!(!more.exists(), "booted more than BOOT_RETRIES times again");
    drop(c);
    let _ = fs::remove_dir_all(&spec.dir);
}

/// Each guest's RAM is a memfd only its own QEMU (and the device server) holds, and nobody
/// holding it can resize it: a truncated RAM file used to be SIGBUS in the device server,
/// for every guest it served. No file of guest memory lies in the cluster's directory.
fn guest_ram_is_a_sealed_memfd_of_its_own(c: &e2e::Cluster) {
    for e in fs::read_dir(c.dir()).unwrap() {
        let e = e.unwrap();
        let len = e.metadata().unwrap().len();
        assert!(
            len < 1 << 20,
            "{:?} ({len} bytes) in the run directory",
            e.path()
        );
    }
    for (i, node) in c.nodes().enumerate() {
        let pid = node.pid().expect("a QEMU guest has a pid");
        let rams: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| {
                let fd = e.ok()?.path();
                let to = fs::read_link(&fd).ok()?.to_string_lossy().into_owned();
                to.contains("memfd:hcabench-ram").then(|| {
                    let f = fs::OpenOptions::new().write(true).open(&fd).unwrap();
                    let e = f.set_len(4096).unwrap_err();
                    assert_eq!(
                        e.kind(),
                        std::io::ErrorKind::PermissionDenied,
                        "{to} resized"
                    );
                    to
                })
            })
            .collect();
        let own = format!("memfd:hcabench-ram-node{} ", i + 1);
        assert!(!rams.is_empty(), "node{}'s QEMU holds no RAM memfd", i + 1);
        assert!(
            rams.iter().all(|r| r.contains(&own)),
            "node{}'s QEMU holds {rams:?}",
            i + 1
        );
        let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            maps.contains(own.trim_end()),
            "node{} maps its RAM memfd",
            i + 1
        );
    }
}
