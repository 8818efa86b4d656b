//! Shared set-up for the end-to-end tests: a device server and N QEMU guests booted from the
//! image `images/build.py` made, in a scratch directory removed afterwards.
//!
//! When QEMU or the image is missing the tests say so and stop. That is a skip with its
//! reason printed, and it never happens in CI, whose script installs QEMU and builds the
//! image first. Set HCABENCH_E2E_REQUIRED=1 to make it a failure instead.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use device_server::qemu::{qemu_available, Guest, GuestSpec, Image};
use device_server::{DeviceServer, NodeConfig};

pub const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// The repository root (this crate lives in tests/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The image to boot, or the reason there is none (QEMU missing, image not built).
pub fn prerequisites() -> Result<Image, String> {
    qemu_available()?;
    Image::find(&repo_root().join("target/images"))
}

/// Returns the image, or prints why the test cannot run and returns None. With
/// HCABENCH_E2E_REQUIRED=1 a missing prerequisite fails the test instead.
pub fn image_or_skip(test: &str) -> Option<Image> {
    or_skip(test, prerequisites())
}

/// The image alone (for tests that boot it without QEMU), or None after saying why.
pub fn image_only_or_skip(test: &str) -> Option<Image> {
    or_skip(test, Image::find(&repo_root().join("target/images")))
}

fn or_skip<T>(test: &str, r: Result<T, String>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(why) if std::env::var_os("HCABENCH_E2E_REQUIRED").is_some() => {
            panic!("{test}: {why}")
        }
        Err(why) => {
            skipped(test, &why);
            None
        }
    }
}

/// Wireshark's decode of `pcap` (the values of `fields` per frame), or None after saying
/// why tshark cannot run; HCABENCH_E2E_REQUIRED=1 makes a missing tshark a failure.
pub fn tshark_or_skip(test: &str, pcap: &Path, fields: &[&str]) -> Option<Vec<Vec<String>>> {
    use hca_model::capture::{tshark_fields, TsharkError};
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

/// A booted cluster: the device server and one guest per node.
pub struct Cluster {
    pub server: Option<DeviceServer>,
    pub guests: Vec<Guest>,
    pub dir: PathBuf,
}

impl Cluster {
    /// Starts the server and `nodes` guests (`ram_mib` each) that run `cmd` after boot.
    pub fn start(name: &str, image: &Image, nodes: usize, ram_mib: u64, cmd: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("hcab-e2e-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let configs = NodeConfig::cluster(&dir, nodes, ram_mib << 20);
        let server = DeviceServer::start(configs.clone()).expect("device server");
        let guests = configs
            .into_iter()
            .map(|node| {
                let spec = GuestSpec {
                    console_log: dir.join(format!("{}.console", node.name)),
                    console_socket: None,
                    node,
                    image: image.clone(),
                    vcpus: 1,
                    kvm: false,
                    cmd: cmd.to_string(),
                    kernel_args: String::new(),
                    net: None,
                };
                Guest::spawn(&spec).expect("start QEMU")
            })
            .collect();
        Cluster {
            server: Some(server),
            guests,
            dir,
        }
    }

    pub fn server(&self) -> &DeviceServer {
        self.server.as_ref().expect("server running")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for g in &mut self.guests {
            g.kill();
        }
        if let Some(s) = self.server.take() {
            let _ = s.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
