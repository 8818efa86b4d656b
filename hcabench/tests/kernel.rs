//! `--kernel`: a developer's own kernel, laid out as `make modules_install
//! INSTALL_MOD_PATH=DIR` leaves it (building a kernel from source would take too long on CI's
//! two cores, so Debian's default kernel package stands in for the tree), booted by
//! `hcabench up --kernel DIR` with its own RDMA modules; a config that lacks what the guests
//! need, and a kernel Debian does not have, refused with the reason before anything boots.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::text;
use e2e::{image_or_skip, repo_root};

mod common;

/// hcabench from the repository's root, where its default image directory
/// (target/images) is the one images/build.py fills.
fn hcabench(run_dir: &Path, args: &[&str]) -> Output {
    common::command(run_dir)
        .current_dir(repo_root())
        .args(args)
        .output()
        .expect("run hcabench")
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("hcab-kernel-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The default image's kernel release and Debian's unpacked package of it (images/build.py
/// leaves it in its cache), or None after saying why not.
fn debian_kernel(test: &str) -> Option<(String, PathBuf)> {
    let image = image_or_skip(test)?;
    let images = repo_root().join("target/images");
    let manifest: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(images.join(&image.name).join("manifest.json")).unwrap(),
    )
    .unwrap();
    let deb = manifest["kernel_deb"].as_str().expect("a Debian image");
    let root = images
        .join("cache")
        .join(format!("root-{}", deb.trim_end_matches(".deb")));
    assert!(
        root.join("boot").is_dir(),
        "{} is not unpacked",
        root.display()
    );
    Some((image.kernel_version, root))
}

/// DIR as `make modules_install INSTALL_MOD_PATH=DIR` and `make install` would leave a
/// kernel: boot/vmlinuz-REL and config-REL, lib/modules/REL with the modules and `build`
/// pointing at the tree (here: Debian's headers for it). Files are hard links, except those
/// `change` rewrites.
fn lay_out(dir: &Path, rel: &str, package: &Path) {
    let status = Command::new("cp")
        .arg("-al")
        .arg(package.join("boot"))
        .arg(package.join("lib"))
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success(), "cp -al of {}", package.display());
    std::os::unix::fs::symlink(
        format!("/usr/src/linux-headers-{rel}"),
        dir.join("lib/modules").join(rel).join("build"),
    )
    .unwrap();
}

/// Replaces a hard link with a copy changed by `f`, as a rebuilt file would be.
fn rewrite(path: &Path, f: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let data = f(fs::read(path).unwrap());
    fs::remove_file(path).unwrap();
    fs::write(path, data).unwrap();
}

/// A module without its appended signature (a changed byte under a signature is refused
/// outright, even where signatures are optional; a missing one only taints).
fn unsigned(mut ko: Vec<u8>) -> Vec<u8> {
    const MAGIC: &[u8] = b"~Module signature appended~\n";
    if !ko.ends_with(MAGIC) {
        return ko;
    }
    // struct module_signature (12 bytes, its last 4 the signature's length, big-endian)
    // sits before the magic, the signature before it.
    let end = ko.len() - MAGIC.len();
    let sig_len = u32::from_be_bytes(ko[end - 4..end].try_into().unwrap()) as usize;
    ko.truncate(end - 12 - sig_len);
    ko
}

#[test]
fn test_up_boots_a_developers_kernel_with_its_own_rdma_modules() {
    let test = "test_up_boots_a_developers_kernel_with_its_own_rdma_modules";
    let Some((rel, package)) = debian_kernel(test) else {
        return;
    };
    let tree = Scratch::new("tree");
    lay_out(&tree.0, &rel, &package);
    // The developer changed ib_core and rebuilt it: a byte of its description, and, as a
    // module built outside Debian's build has, no Debian signature. The guest kernel loads
    // it and marks that module (and only it) unsigned: taint E.
    let ib_core = tree
        .0
        .join("lib/modules")
        .join(&rel)
        .join("kernel/drivers/infiniband/core/ib_core.ko");
    rewrite(&ib_core, |ko| {
        let mut ko = unsigned(ko);
        let at = (ko.windows(27))
            .position(|w| w == b"core kernel InfiniBand API\0")
            .expect("ib_core's description");
        ko[at] = b'C';
        ko
    });

    let run = Scratch::new("run");
    let kernel = tree.0.to_str().unwrap();
    let up = hcabench(&run.0, &["up", "--nodes", "2", "--kernel", kernel]);
    let down = || hcabench(&run.0, &["down"]);
    if !up.status.success() {
        down();
        panic!("up --kernel {kernel}:\n{}", text(&up));
    }
    let image = repo_root()
        .join("target/images")
        .join(format!("local-{rel}"));
    // The checks panic on what they find wrong; the cluster goes down first.
    let checks = || {
        let status = text(&hcabench(&run.0, &["status"]));
        assert!(
            status.contains(&format!("kernel {rel}")) && status.matches(&rel).count() >= 3,
            "status does not name {rel} for the cluster and each node:\n{status}"
        );
        let exec = |node: &str, cmd: &str| {
            let o = hcabench(&run.0, &["exec", node, "--", cmd]);
            assert!(o.status.success(), "{node}: `{cmd}`: {}", text(&o));
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        let taint = exec("node1", "cat /sys/module/ib_core/taint");
        assert_eq!(
            taint, "E",
            "ib_core's taint is {taint:?}, not the tree's unsigned E"
        );
        // The tree's other modules are Debian's, still signed.
        let ipoib = exec("node1", "cat /sys/module/ib_ipoib/taint");
        assert!(
            ipoib.is_empty(),
            "ib_ipoib's taint is {ipoib:?}: not the tree's module?"
        );
        let state = exec("node2", "cat /sys/class/infiniband/hcab0/ports/1/state");
        assert!(state.contains("ACTIVE"), "node2's hcab0 port: {state}");
        exec("node1", "ping -c 2 -W 5 10.78.0.2");
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(checks));
    let stopped = down();
    if let Err(failed) = result {
        std::panic::resume_unwind(failed);
    }
    assert!(stopped.status.success(), "{}", text(&stopped));
    assert!(
        image.join("manifest.json").exists(),
        "no image {}",
        image.display()
    );

    // Unchanged, the tree's image is reused; the next `make` (a newer module) rebuilds it.
    let build = || {
        let o = Command::new("python3")
            .current_dir(repo_root())
            .args(["images/build.py", "--kernel", kernel])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let again = build();
    assert!(again.contains("up to date"), "{again}");
    rewrite(&ib_core, |ko| ko);
    let rebuilt = build();
    assert!(rebuilt.contains("built in"), "{rebuilt}");
}

#[test]
fn test_a_kernel_without_what_the_guests_need_is_refused_before_booting() {
    let test = "test_a_kernel_without_what_the_guests_need_is_refused_before_booting";
    let Some((rel, package)) = debian_kernel(test) else {
        return;
    };
    let tree = Scratch::new("noib");
    lay_out(&tree.0, &rel, &package);
    rewrite(&tree.0.join("boot").join(format!("config-{rel}")), |c| {
        String::from_utf8(c)
            .unwrap()
            .replace("CONFIG_INFINIBAND=m", "# CONFIG_INFINIBAND is not set")
            .replace("CONFIG_PCI_MSI=y", "# CONFIG_PCI_MSI is not set")
            .into_bytes()
    });
    let run = Scratch::new("noib-run");
    let up = hcabench(&run.0, &["up", "--kernel", tree.0.to_str().unwrap()]);
    let says = text(&up);
    assert!(!up.status.success(), "{says}");
    assert!(
        says.contains("CONFIG_INFINIBAND (the RDMA core")
            && says.contains("CONFIG_PCI_MSI")
            && says.contains("lacks what hcabench's guests need"),
        "{says}"
    );
    assert!(!run.0.join("state.toml").exists(), "something booted");

    // A directory that is no kernel at all, and a kernel Debian does not carry.
    let empty = Scratch::new("empty");
    let up = hcabench(&run.0, &["up", "--kernel", empty.0.to_str().unwrap()]);
    assert!(!up.status.success());
    assert!(
        text(&up).contains("neither a built kernel tree"),
        "{}",
        text(&up)
    );
    let up = hcabench(&run.0, &["up", "--kernel", "5.99"]);
    assert!(!up.status.success());
    assert!(
        text(&up).contains("no Debian kernel matches `5.99`"),
        "{}",
        text(&up)
    );
}
