//! `hcabench exec` and `hcabench cp` against a running 2-node QEMU cluster of its own
//! (`hcabench up` in a private run directory): what a script or another project's CI does
//! with a cluster. One cluster serves every check (booting is the slow part).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{hcabench, stdout, text};
use e2e::{image_or_skip, repo_root};

mod common;

/// The test's directory: the cluster's run directory (`run/`) and the host's files. Its
/// cluster is brought down and the directory removed, whatever happens to the test.
struct TestDir(PathBuf);

impl TestDir {
    fn run(&self) -> PathBuf {
        self.0.join("run")
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = hcabench(&self.run(), &["down"]);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n` bytes no compressor could shrink (xorshift), the same every run.
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn test_exec_and_cp_drive_the_guests_of_a_running_cluster() {
    let Some(_image) = image_or_skip("exec_cp") else {
        return;
    };
    let dir = TestDir(std::env::temp_dir().join(format!("hcab-exec-cp-{}", std::process::id())));
    let host = dir.0.join("host");
    std::fs::create_dir_all(&host).unwrap();
    let run = dir.run();

    // Without a cluster both say so; exec's own failures are 255, as ssh's.
    let o = hcabench(&run, &["exec", "node1", "--", "true"]);
    assert_eq!(o.status.code(), Some(255), "{}", text(&o));
    assert!(text(&o).contains("no cluster is up"), "{}", text(&o));
    let o = hcabench(&run, &["cp", "/etc/hostname", "node1:/tmp"]);
    assert!(!o.status.success() && text(&o).contains("no cluster is up"));

    let cfg = host.join("cluster.toml");
    let images = repo_root().join("target/images");
    // A user's own Debian package (jq, with its libraries) on the guests' userland disk,
    // from the file's `packages` and from --package alike.
    std::fs::write(
        &cfg,
        format!("nodes = 2\nimage_dir = {images:?}\nbackend = \"qemu\"\npackages = [\"jq\"]\n"),
    )
    .unwrap();
    let up = hcabench(
        &run,
        &[
            "up",
            "--config",
            cfg.to_str().unwrap(),
            "--package",
            "libjq1",
        ],
    );
    assert!(up.status.success(), "{}", text(&up));
    let o = hcabench(
        &run,
        &["exec", "node2", "--", "echo '{\"a\": [20, 22]}' | jq -M '.a | add'; python3 -c 'import pyverbs; print(\"pyverbs\")'"],
    );
    assert_eq!(stdout(&o), "42\npyverbs\n", "{}", text(&o));

    // Output (stdout and stderr) comes back, and the exit status with it.
    let t = Instant::now();
    let o = hcabench(&run, &["exec", "node1", "--", "echo hello; echo oops >&2"]);
    let latency = t.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(stdout(&o), "hello\noops\n");
    let o = hcabench(
        &run,
        &[
            "exec",
            "node2",
            "--",
            "echo",
            "$((1 + 2))",
            ";",
            "exit",
            "3",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert_eq!(stdout(&o), "3\n");

    // A command past its time is killed in the guest, pipeline and all: 124, and the
    // channel is free for the next.
    let t = Instant::now();
    let o = hcabench(
        &run,
        &["exec", "--timeout", "2", "node1", "--", "sleep 57 | cat"],
    );
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    assert!(text(&o).contains("killed"), "{}", text(&o));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let o = hcabench(
        &run,
        &[
            "exec",
            "node1",
            "--",
            "echo after; ps | grep -c 'sleep 5[7]'",
        ],
    );
    assert_eq!(stdout(&o), "after\n0\n", "{}", text(&o));

    // Every node at once, each line with its node.
    let lid = "cat /sys/class/infiniband/hcab0/ports/1/lid";
    let o = hcabench(&run, &["exec", "--all", "--", lid]);
    assert!(o.status.success(), "{}", text(&o));
    let out = stdout(&o);
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, ["node1: 0x1", "node2: 0x2"]);
    let o = hcabench(
        &run,
        &["exec", "--all", "--", &format!("[ $({lid}) = 0x1 ]")],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("failed on 1 of 2 nodes: node2 (exit 1)"),
        "{}",
        text(&o)
    );

    // Two at once on one node: the second waits for the first, neither's output mixes.
    let both: Vec<_> = ["A", "B"]
        .iter()
        .map(|tag| {
            Command::new(env!("CARGO_BIN_EXE_hcabench"))
                .arg("--run-dir")
                .arg(&run)
                .args(["exec", "node1", "--"])
                .arg(format!("for i in $(seq 300); do echo {tag}$i; done"))
                .output()
        })
        .collect();
    for (tag, o) in ["A", "B"].iter().zip(both) {
        let o = o.unwrap();
        let want: String = (1..=300).map(|i| format!("{tag}{i}\n")).collect();
        assert!(
            o.status.success() && stdout(&o) == want,
            "{tag}: {}",
            text(&o)
        );
    }

    let o = hcabench(&run, &["exec", "node7", "--", "true"]);
    assert_eq!(o.status.code(), Some(255));
    assert!(
        text(&o).contains("no node node7; the cluster has node1, node2"),
        "{}",
        text(&o)
    );

    // Into node1: 3 MiB of noise, and a tree with an executable, a private file and a link.
    let data = noise(3 << 20);
    let blob = host.join("noise.bin");
    std::fs::write(&blob, &data).unwrap();
    let tree = host.join("tree");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::write(
        tree.join("bin/hello.sh"),
        "#!/bin/sh\necho \"hello from $0 $*\"\n",
    )
    .unwrap();
    std::fs::set_permissions(tree.join("bin/hello.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(tree.join("secret"), "s").unwrap();
    std::fs::set_permissions(tree.join("secret"), PermissionsExt::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink("bin/hello.sh", tree.join("hello")).unwrap();
    let t = Instant::now();
    let o = hcabench(
        &run,
        &[
            "cp",
            blob.to_str().unwrap(),
            tree.to_str().unwrap(),
            "node1:/tmp",
        ],
    );
    let took_in = t.elapsed();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("sha256 checked"),
        "progress and check: {}",
        text(&o)
    );
    let o = hcabench(&run, &["exec", "node1", "--", "/tmp/tree/hello a b"]);
    assert_eq!(
        stdout(&o),
        "hello from /tmp/tree/hello a b\n",
        "{}",
        text(&o)
    );
    let o = hcabench(
        &run,
        &["exec", "node1", "--", "stat -c %a /tmp/tree/secret"],
    );
    assert_eq!(stdout(&o), "640\n", "{}", text(&o));
    // One file to a new name.
    let o = hcabench(
        &run,
        &[
            "cp",
            tree.join("secret").to_str().unwrap(),
            "node2:/tmp/renamed",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = hcabench(&run, &["exec", "node2", "--", "cat /tmp/renamed"]);
    assert_eq!(stdout(&o), "s");

    // Out again, byte for byte, modes and link as they were.
    let back = host.join("back");
    std::fs::create_dir(&back).unwrap();
    let t = Instant::now();
    let o = hcabench(
        &run,
        &[
            "cp",
            "node1:/tmp/noise.bin",
            "node1:/tmp/tree",
            back.to_str().unwrap(),
        ],
    );
    let took_out = t.elapsed();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        std::fs::read(back.join("noise.bin")).unwrap() == data,
        "the noise came back changed"
    );
    assert_eq!(mode(&back.join("tree/bin/hello.sh")), 0o755);
    assert_eq!(mode(&back.join("tree/secret")), 0o640);
    assert_eq!(
        std::fs::read_link(back.join("tree/hello")).unwrap(),
        Path::new("bin/hello.sh")
    );

    // What cannot be done is refused with the reason, and nothing is left half-done.
    for (args, says) in [
        (
            vec![blob.to_str().unwrap(), "node1:/no/such/dir/x"],
            "no directory /no/such/dir in the guest",
        ),
        (
            vec![host.join("missing").to_str().unwrap(), "node1:/tmp"],
            "missing: No such file or directory",
        ),
        (
            vec!["node1:/tmp/missing", back.to_str().unwrap()],
            "node1:/tmp/missing: no such file or directory in the guest",
        ),
        (vec![blob.to_str().unwrap(), "node9:/tmp"], "no node node9"),
    ] {
        let o = hcabench(&run, &[&["cp"][..], &args].concat());
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
    // More than the guest's memory (its root is a tmpfs): refused before a byte moves.
    let big = host.join("big");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let o = hcabench(&run, &["cp", big.to_str().unwrap(), "node1:/tmp"]);
    assert!(
        !o.status.success() && text(&o).contains("no room for"),
        "{}",
        text(&o)
    );
    let o = hcabench(&run, &["exec", "node1", "--", "ls -a /tmp"]);
    assert!(
        !stdout(&o).contains("big") && !stdout(&o).contains(".hcabench-cp"),
        "{}",
        text(&o)
    );

    eprintln!(
        "exec round trip {latency:.2?}; 3 MiB in {took_in:.1?} ({:.0} KiB/s), out in \
         {took_out:.1?} ({:.0} KiB/s)",
        3072.0 / took_in.as_secs_f64(),
        3072.0 / took_out.as_secs_f64()
    );
    let down = hcabench(&run, &["down"]);
    assert!(down.status.success(), "{}", text(&down));
}

/// `hcabench up` on a guest whose kernel crashes before init: the daemon boots it again
/// (`BOOT_RETRIES` times, said in daemon.log, each crashed console kept), and when it keeps
/// crashing `up` fails naming the node and showing the panic, rather than hanging or
/// calling the cluster up.
#[test]
fn test_up_boots_a_guest_crashed_before_init_again_then_reports_it() {
    let Some(_image) = image_or_skip("exec_cp") else {
        return;
    };
    let dir = TestDir(std::env::temp_dir().join(format!("hcab-crash-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let run = dir.run();
    let cfg = dir.0.join("cluster.toml");
    let images = repo_root().join("target/images");
    std::fs::write(
        &cfg,
        format!(
            "nodes = 1\nimage_dir = {images:?}\nbackend = \"qemu\"\n\
             kernel_args = \"rdinit=/none init=/none\"\n"
        ),
    )
    .unwrap();
    let up = hcabench(&run, &["up", "--config", cfg.to_str().unwrap()]);
    let said = text(&up);
    assert!(!up.status.success(), "{said}");
    assert!(
        said.contains("node1") && said.contains("Kernel panic"),
        "{said}"
    );
    let log = std::fs::read_to_string(run.join("daemon.log")).unwrap_or_default();
    for k in 1..=cluster::BOOT_RETRIES {
        let again = format!("booting it again ({k} of {})", cluster::BOOT_RETRIES);
        assert!(log.contains(&again), "no `{again}` in daemon.log:\n{log}");
        assert!(run.join(format!("node1.console.crash{k}")).exists());
    }
}
