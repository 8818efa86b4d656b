//! End-to-end: the DSM module's communication layer (the paper's section 3 primitives) on
//! four QEMU guests: a full mesh of RC QPs over the hcabench HCA, one CQ and one
//! interrupt-context handler per node, reserved send buffers reclaimed through occasional
//! signaled completions, pre-posted receives without flow control, and the fallback to
//! process context. Every node PINGs every other; every PONG's bytes are checked. And the
//! page-protection primitive (the paper's section 3.3) on a /dev/dsm region.

use std::time::Duration;

use device_server::dsm::connect_mesh;
use device_server::verbs::Testbed;
use e2e::{image_or_skip, BOOT_TIMEOUT};

const T: Duration = Duration::from_secs(120);

fn num(line: &str, key: &str) -> u64 {
    device_server::verbs::num(line, key).unwrap()
}

#[test]
fn test_dsm_mesh_messages_on_four_nodes() {
    let Some(image) = image_or_skip("dsm_comm") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("hcab-e2e-{}-dsm", std::process::id()));
    let mut tb =
        Testbed::boot_nodes(&image, dir, 4, false, 256, BOOT_TIMEOUT, &mut |_| {}).unwrap();
    connect_mesh(&mut tb.agents, "hcab0").unwrap();
    // Every third PING is handled in process context instead of the interrupt handler.
    for a in tb.agents.iter_mut() {
        a.run("dsmctl defer 3", T).unwrap();
    }

    // One node at a time: 300 PINGs to each of three peers, more than the 64 send buffers
    // and 64 receives per connection, so buffers must be reclaimed and receives recycled.
    for i in 0..4 {
        let out = tb.agents[i].run("dsmctl selftest 300 200", T).unwrap();
        let line = out.lines().find(|l| l.starts_with("selftest")).unwrap();
        if num(line, "pongs") != 900 {
            for a in tb.agents.iter_mut() {
                let s = a.run("dsmctl stats; dmesg | grep -i 'dsm\\|hca' | tail -5", T);
                eprintln!("{}: {s:?}", a.name);
            }
        }
        assert_eq!(num(line, "pongs"), 900, "node{}: {line}", i + 1);
        assert_eq!(num(line, "errors"), 0, "node{}: {line}", i + 1);
        assert_eq!(num(line, "err"), 0, "node{}: {line}", i + 1);
    }

    // All four at once: every connection carries traffic both ways.
    for a in tb.agents.iter_mut() {
        a.run("dsmctl selftest 200 64 > /tmp/st.log &", T).unwrap();
    }
    for (i, a) in tb.agents.iter_mut().enumerate() {
        let mut line = String::new();
        for _ in 0..600 {
            let log = a.run("cat /tmp/st.log", T).unwrap();
            if let Some(l) = log.lines().find(|l| l.starts_with("selftest")) {
                line = l.to_string();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(num(&line, "pongs"), 600, "node{}: {line}", i + 1);
        assert_eq!(num(&line, "errors"), 0, "node{}: {line}", i + 1);
    }

    // The page-protection primitive: pages in a /dev/dsm region go to none, read and
    // read-write and fault (or not) accordingly, also when changed with interrupts off.
    let prot = tb.agents[1].run("dsm-prot check", T).unwrap();
    assert!(prot.contains("prot-check ok faults=4"), "{prot}");

    // The handlers deferred work to process context, and no completion failed.
    for (i, a) in tb.agents.iter_mut().enumerate() {
        let s = a.run("dsmctl stats", T).unwrap();
        assert!(num(&s, "deferred") > 0, "node{}: {s}", i + 1);
        assert_eq!(num(&s, "cqe_errors"), 0, "node{}: {s}", i + 1);
        assert_eq!(num(&s, "received"), num(&s, "sent"), "node{}: {s}", i + 1);
    }
}
