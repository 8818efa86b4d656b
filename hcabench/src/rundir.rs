//! The run directory: where a cluster's sockets, console logs and state live (guest
//! RAM is a memfd, never a file here).
//!
//! Default `$XDG_RUNTIME_DIR/hcabench`, else `/tmp/hcabench-<uid>`; `--run-dir` or
//! HCABENCH_RUN_DIR choose another. `state.toml` exists while a cluster is up and names the
//! daemon that owns it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::ClusterConfig;

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct NodeState {
    pub name: String,
    pub lid: u16,
    /// The process running the guest: its QEMU, or the daemon itself under the KVM backend.
    pub pid: u32,
    pub console_log: PathBuf,
    pub console_socket: PathBuf,
    /// The command channel of `hcabench exec` and `cp` (the guest's second serial port);
    /// empty in the state of a cluster an older hcabench started.
    #[serde(default)]
    pub agent_socket: PathBuf,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ClusterState {
    pub daemon_pid: u32,
    pub backend: String,
    pub kernel: String,
    pub config: ClusterConfig,
    pub nodes: Vec<NodeState>,
}

pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn resolve(flag: Option<PathBuf>) -> RunDir {
        if let Some(d) = flag.or_else(|| std::env::var_os("HCABENCH_RUN_DIR").map(PathBuf::from)) {
            return RunDir(d);
        }
        if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
            return RunDir(PathBuf::from(x).join("hcabench"));
        }
        // SAFETY: getuid cannot fail and has no preconditions.
        let uid = unsafe { libc::getuid() };
        RunDir(std::env::temp_dir().join(format!("hcabench-{uid}")))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn state_file(&self) -> PathBuf {
        self.path("state.toml")
    }

    pub fn read_state(&self) -> Option<ClusterState> {
        let text = std::fs::read_to_string(self.state_file()).ok()?;
        toml::from_str(&text).ok()
    }

    pub fn write_state(&self, s: &ClusterState) -> std::io::Result<()> {
        let text = toml::to_string(s).map_err(std::io::Error::other)?;
        let tmp = self.path("state.toml.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(tmp, self.state_file())
    }

    /// The state of a cluster whose daemon still runs; a stale file is removed.
    pub fn live_state(&self) -> Option<ClusterState> {
        let s = self.read_state()?;
        if pid_alive(s.daemon_pid) {
            Some(s)
        } else {
            let _ = std::fs::remove_file(self.state_file());
            None
        }
    }

    pub fn dir(&self) -> &Path {
        &self.0
    }
}

pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}
