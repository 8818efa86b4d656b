//! Shared set-up for the end-to-end tests: clusters booted through the launcher
//! (`cluster::Cluster`) from the image `images/build.py` made, in scratch directories
//! removed afterwards.
//!
//! When QEMU or the image is missing the tests say so and stop. That is a skip with its
//! reason printed, and it never happens in CI, whose script installs QEMU and builds the
//! image first. Set HCABENCH_E2E_REQUIRED=1 to make it a failure instead.
//!
//! HCABENCH_KERNEL=6.12 (or any `hcabench up --kernel` value naming a built image) runs them
//! on that kernel's image instead of the default one: CI runs a set of them on both of
//! Debian 12's kernels.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cluster::qemu::qemu_available;
use cluster::{Backend, ClusterSpec, Image};

pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Every DSM application at the sizes the SoftRoCE comparison runs it (`verbs.rs`, and its
/// soak `rxe_soak.rs`), with the protocol configuration it runs under: page data by RDMA
/// Write, and by RDMA Read for two of them.
pub const RXE_DSM_APPS: [(&str, &str); 8] = [
    ("sor 34 1024 4", "handler=irq readfault=write"),
    ("lu 64", "handler=irq readfault=read"),
    ("is 16384 1024 2", "handler=irq readfault=write"),
    ("tsp 8", "handler=irq readfault=write"),
    ("nbody 64 2", "handler=irq readfault=write"),
    ("nbodyw 64 2", "handler=irq readfault=read"),
    ("water 27 2", "handler=irq readfault=write"),
    ("barnes 64 2", "handler=irq readfault=write"),
];

/// The repository root (this crate lives in tests/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Why an end-to-end test cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum Missing {
    #[error(transparent)]
    Qemu(#[from] cluster::BackendError),
    #[error(transparent)]
    Image(#[from] cluster::ImageError),
}

/// The image to boot, or the reason there is none (QEMU missing, image not built).
pub fn prerequisites() -> Result<Image, Missing> {
    qemu_available()?;
    Ok(image()?)
}

/// The default image, or HCABENCH_KERNEL's.
fn image() -> Result<Image, cluster::ImageError> {
    let kernel = std::env::var("HCABENCH_KERNEL").ok();
    Image::resolve(
        &repo_root().join("target/images"),
        kernel.as_deref().filter(|k| !k.is_empty()),
    )
}

/// Returns the image, or prints why the test cannot run and returns None. With
/// HCABENCH_E2E_REQUIRED=1 a missing prerequisite fails the test instead.
pub fn image_or_skip(test: &str) -> Option<Image> {
    or_skip(test, prerequisites())
}

/// The image alone (for tests that boot it without QEMU), or None after saying why.
pub fn image_only_or_skip(test: &str) -> Option<Image> {
    or_skip(test, image())
}

fn or_skip<T, E: std::fmt::Display>(test: &str, r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(why) if std::env::var_os("HCABENCH_E2E_REQUIRED").is_some() => {
            panic!("{test}: {why}")
        }
        Err(why) => {
            skipped(test, &why.to_string());
            None
        }
    }
}

/// Wireshark's decode of `pcap` (the values of `fields` per frame), or None after saying
/// why tshark cannot run; HCABENCH_E2E_REQUIRED=1 makes a missing tshark a failure.
pub fn tshark_or_skip(test: &str, pcap: &Path, fields: &[&str]) -> Option<Vec<Vec<String>>> {
    use hca_test_driver::tshark::{tshark_fields, TsharkError};
    match tshark_fields(pcap, fields) {
        Ok(rows) => Some(rows),
        Err(TsharkError::Missing(why)) => or_skip(test, Err(why)),
        Err(e) => panic!("{test}: tshark: {e:?}"),
    }
}

/// Prints "SKIPPED test: why" straight to stderr: the test harness captures print macros of
/// passing tests, and a skip must never pass silently.
pub fn skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// A scratch directory for test `name`, emptied first.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hcab-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `nodes` QEMU guests of 256 MiB in the scratch directory of test `name`.
/// How many ports the fabric's SA has in IPoIB's broadcast group of the default partition.
pub fn broadcast_members(fabric: &hca_model::Fabric) -> usize {
    fabric.with_sa(|sa| {
        sa.groups()
            .find(|g| g.mgid == hca_model::sa::IPOIB_BROADCAST_MGID)
            .map_or(0, |g| g.members.len())
    })
}

pub fn qemu_spec(image: &Image, name: &str, nodes: usize) -> ClusterSpec {
    ClusterSpec::new(Backend::Qemu, image.clone(), scratch_dir(name), nodes)
}

/// A cluster booted through the launcher whose scratch directory goes with it.
pub struct Cluster {
    pub cluster: cluster::Cluster,
    dir: PathBuf,
}

impl Cluster {
    /// `nodes` QEMU guests (`ram_mib` each) that run `job` after boot, consoles logged
    /// only.
    pub fn start(name: &str, image: &Image, nodes: usize, ram_mib: u64, job: &str) -> Cluster {
        let spec = ClusterSpec {
            ram_mib,
            job: job.into(),
            console_sockets: false,
            ..qemu_spec(image, name, nodes)
        };
        let cluster = cluster::Cluster::boot(&spec, &mut |_| {}).expect("boot the cluster");
        Cluster {
            cluster,
            dir: spec.dir,
        }
    }
}

impl Cluster {
    /// The directory the cluster's sockets and consoles are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl std::ops::Deref for Cluster {
    type Target = cluster::Cluster;
    fn deref(&self) -> &cluster::Cluster {
        &self.cluster
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut cluster::Cluster {
        &mut self.cluster
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.cluster.kill_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Node `i`'s port GUID as its hcab0 reports it (`xxxx:xxxx:xxxx:xxxx`), as ib_srpt names
/// ports and initiators.
pub fn port_guid(tb: &mut cluster::verbs::Testbed, i: usize) -> String {
    let g = tb.agents[i]
        .run(
            "cat /sys/class/infiniband/hcab0/node_guid",
            Duration::from_secs(120),
        )
        .unwrap();
    g.trim().to_string()
}
