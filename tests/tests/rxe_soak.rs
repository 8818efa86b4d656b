//! A soak, run by hand: the DSM over SoftRoCE as `verbs.rs` runs it, every application
//! again and again on one booted pair until `SOAK_SECS` (default 300) pass. It stops at the
//! first failure, whose report names the links that stopped delivering (see
//! `cluster::dsm::stalled_links`). Several at once load a many-core host:
//! `SOAK_SECS=400 cargo test -p e2e --test rxe_soak -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use cluster::dsm::{close_all, configure, connect_mesh, run_app, settle};
use cluster::verbs::Testbed;
use cluster::ClusterSpec;
use e2e::{image_or_skip, BOOT_TIMEOUT, RXE_DSM_APPS};

#[test]
#[ignore = "a soak of many minutes, run by hand with --ignored"]
fn test_the_dsm_over_softroce_again_and_again() {
    let secs = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let Some(image) = image_or_skip("rxe soak") else {
        return;
    };
    let spec = ClusterSpec {
        link: true,
        ..e2e::qemu_spec(&image, "rxe-soak", 2)
    };
    let mut tb = Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).unwrap();
    tb.rxe_up().unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    let (mut runs, mut slowest) = (0u64, (Duration::ZERO, ""));
    while Instant::now() < end {
        for (cmd, config) in RXE_DSM_APPS {
            let t = Instant::now();
            connect_mesh(&mut tb.agents, "rxe0").unwrap();
            configure(&mut tb.agents, config).unwrap();
            let res = run_app(&mut tb.agents, cmd, Duration::from_secs(600))
                .unwrap_or_else(|e| panic!("run {runs}, rxe0 {cmd}: {e}"));
            assert_eq!(res[0].verified, Some(true), "rxe0 {cmd}: {}", res[0].line);
            settle(&mut tb.agents, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("run {runs}, rxe0 {cmd}: {e}"));
            close_all(&mut tb.agents).unwrap();
            runs += 1;
            slowest = slowest.max((t.elapsed(), cmd));
        }
    }
    println!(
        "{runs} application runs over rxe0, none failed; the slowest {:?} ({})",
        slowest.0, slowest.1
    );
}
