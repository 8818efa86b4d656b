//! Kernel verbs runs between guests: a testbed (a [`Cluster`] whose guests run the agent
//! job, a shell in each) and the operations of the guest's `vbench` module over any
//! ib_device: our `hcab0`, or `rxe0` (SoftRoCE over a virtio-net link between two QEMU
//! guests), so that the same module measures both.
//!
//! The guest side is `guest-kmod/vbench` (the verbs consumer), `vbench-user` (the user
//! process of mode "user"), `vb` and `rxe-up` (shell helpers in the image).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::agent::{Agent, AgentError};
use crate::console_protocol;
use crate::node::{tail, WaitError};
use crate::{BootError, Cluster, ClusterSpec};
use hca_model::{Fabric, Hca};

const CMD_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the receiver handles completions (the paper's Table 1 columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A busy-polling kernel thread.
    Poll,
    /// The CQ's completion handler, in hard interrupt context.
    Isr,
    /// A workqueue the handler queues work on.
    Wq,
    /// A user process the handler wakes.
    User,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Poll, Mode::Isr, Mode::Wq, Mode::User];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Poll => "poll",
            Mode::Isr => "isr",
            Mode::Wq => "wq",
            Mode::User => "user",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `key=value` pairs of one vbench result line.
pub fn fields(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A guest program's answer that lacks what the harness reads from it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// No `key=` (or not a number) in a result line.
    #[error("no {key}= in the guest's answer `{}`", .line.trim())]
    MissingField { key: String, line: String },
    /// No result line at all in a command's output.
    #[error("{node}: {what}: no result in `{}`", .output.trim())]
    NoLine {
        node: String,
        what: String,
        output: String,
    },
}

/// Why a verbs run between guests failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error(transparent)]
    Boot(#[from] BootError),
    /// A guest never reached its shell.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// A guest's shell failed; `console` is the end of its console log.
    #[error("{source}{}", shell_console(.source, .console.as_deref()))]
    Shell {
        source: AgentError,
        console: Option<String>,
    },
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

/// The console that goes with a failed shell command, when there is one.
fn shell_console(source: &AgentError, console: Option<&str>) -> String {
    console.map_or_else(String::new, |c| {
        format!("\nconsole of {}:\n{c}", source.node())
    })
}

impl From<AgentError> for VerbsError {
    fn from(source: AgentError) -> Self {
        VerbsError::Shell {
            source,
            console: None,
        }
    }
}

fn field<T: std::str::FromStr>(line: &str, key: &str) -> Result<T, AnswerError> {
    fields(line)
        .get(key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| AnswerError::MissingField {
            key: key.to_string(),
            line: line.to_string(),
        })
}

/// The number after `key=` in a vbench (or dsm) result line.
pub fn num(line: &str, key: &str) -> Result<u64, AnswerError> {
    field(line, key)
}

/// Like [`num`], for a decimal fraction.
pub fn float(line: &str, key: &str) -> Result<f64, AnswerError> {
    field(line, key)
}

/// One ping-pong run as the client saw it.
#[derive(Clone, Debug)]
pub struct PingResult {
    pub mode: Mode,
    pub size: u32,
    pub iters: u64,
    pub done: u64,
    pub errors: u64,
    pub rtt_avg_ns: u64,
    pub rtt_min_ns: u64,
    pub rtt_median_ns: u64,
    /// Messages the server answered and the errors it saw.
    pub served: u64,
    pub server_errors: u64,
    /// Completion-handler calls (isr mode, client and server) that the device made where
    /// the CQ may not be polled (under its CQ lock: rxe on newer kernels), so vbench
    /// polled from its workqueue instead: that run measured the workqueue path there.
    pub deferred: u64,
}

/// One RDMA bandwidth run.
#[derive(Clone, Debug)]
pub struct BwResult {
    pub read: bool,
    pub size: u32,
    pub iters: u64,
    /// Decimal megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    pub errors: u64,
}

/// Booted guests under agent control: the cluster, and a shell in each guest.
pub struct Testbed {
    pub agents: Vec<Agent>,
    pub cluster: Cluster,
    pub dir: PathBuf,
    keep_dir: bool,
}

impl Testbed {
    /// Boots the cluster `spec` describes with every guest running the agent job, and
    /// connects to their shells. `progress` hears about each step. The directory goes with
    /// the testbed unless [`Testbed::keep_dir`] is called.
    pub fn boot(
        spec: &ClusterSpec,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Testbed, VerbsError> {
        let spec = ClusterSpec {
            job: "agent".into(),
            console_sockets: true,
            ..spec.clone()
        };
        let cluster = Cluster::boot(&spec, progress)?;
        let mut tb = Testbed {
            agents: Vec::new(),
            cluster,
            dir: spec.dir.clone(),
            keep_dir: false,
        };
        tb.connect_agents(&spec, boot_timeout, progress)?;
        Ok(tb)
    }

    fn connect_agents(
        &mut self,
        spec: &ClusterSpec,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), VerbsError> {
        for i in 0..self.cluster.len() {
            let took = (self.cluster).wait_booted(i, console_protocol::AGENT, boot_timeout)?;
            let g = self.cluster.node(i);
            progress(&format!("{} booted ({took:.1?})", g.name()));
            let sock = spec
                .console_socket(i)
                .expect("agents talk over console sockets");
            let agent = Agent::connect(g.name(), &sock, boot_timeout).map_err(|source| {
                VerbsError::Shell {
                    source,
                    console: Some(tail(&g.console())),
                }
            })?;
            self.agents.push(agent);
        }
        Ok(())
    }

    /// The fabric between the guests' HCAs.
    pub fn fabric(&self) -> &Fabric {
        self.cluster.fabric()
    }

    /// Guest `i`'s HCA, while it is on the fabric.
    pub fn hca(&self, i: usize) -> Option<Hca> {
        self.cluster.hca(i)
    }

    /// Keeps the directory (consoles, logs) after the testbed goes, for a post-mortem.
    pub fn keep_dir(&mut self) {
        self.keep_dir = true;
    }

    /// The end of the guest's console log (for error reports).
    pub fn console(&self, i: usize) -> String {
        tail(&self.cluster.node(i).console())
    }

    /// Brings up SoftRoCE on both guests: device rxe0 over the virtio-net link.
    pub fn rxe_up(&mut self) -> Result<(), VerbsError> {
        self.rxe_up_after("")
    }

    /// Runs the guest's `rxe-up` (the NIC up with its address, rxe0 added, until ACTIVE) on
    /// every guest, each after shell commands `first`.
    fn rxe_up_after(&mut self, first: &str) -> Result<(), VerbsError> {
        for (i, a) in self.agents.iter_mut().enumerate() {
            a.run(&format!("{first}rxe-up 10.77.0.{}/24", i + 1), CMD_TIMEOUT)?;
        }
        Ok(())
    }

    /// What each guest's side of the SoftRoCE link shows: whether the NIC still carries a
    /// ping to the peer, the NIC's packet counts, rxe0's own counters and the kernel's last
    /// words. For a report when rxe stops delivering: it tells a dead link (QEMU's or the
    /// NIC's) from rxe's own state.
    pub fn rxe_report(&mut self) -> String {
        let n = self.agents.len();
        let mut out = String::new();
        for (i, a) in self.agents.iter_mut().enumerate() {
            let peer = (i + 1) % n + 1;
            let cmd = format!(
                "ping -c 2 -W 2 10.77.0.{peer} | tail -1; \
                 (cd /sys/class/net/eth0/statistics && grep -H . tx_packets rx_packets \
                 tx_dropped rx_dropped | tr '\\n' ' '); echo; \
                 (cd /sys/class/infiniband/rxe0/ports/1/hw_counters 2>/dev/null && \
                 grep -H . * | grep -v ':0$' | tr '\\n' ' '); echo; dmesg | tail -8"
            );
            let shown = a
                .run(&cmd, CMD_TIMEOUT)
                .unwrap_or_else(|e| format!("(no answer: {e})"));
            out += &format!("== {} ==\n{}\n", a.name, shown.trim_end());
        }
        out
    }

    /// Makes SoftRoCE anew on both guests: rxe0 deleted (its clients, vbench and the DSM,
    /// let go of it through their `remove` callbacks), the NIC taken down and up (its
    /// queues refilled), and rxe0 added again: what a guest can do when SoftRoCE stops
    /// delivering. (It did not revive the unix stream link the guests once had: that died
    /// in QEMU; see `NetSpec`.)
    pub fn rxe_renew(&mut self) -> Result<(), VerbsError> {
        self.rxe_up_after(
            "rdma link delete rxe0 && ip addr flush dev eth0 && ip link set eth0 down && ",
        )
    }

    /// Opens `dev` on both guests and connects their RC QPs (the harness hands each side
    /// the other's address).
    pub fn connect(&mut self, dev: &str) -> Result<(), VerbsError> {
        self.connect_pair(0, 1, dev).map(|_| ())
    }

    /// Brings up IPoIB on hcab0 on every guest: ib0 at 10.78.0.k/24 for guest k (from 1).
    pub fn ipoib_up(&mut self) -> Result<(), VerbsError> {
        for (i, a) in self.agents.iter_mut().enumerate() {
            a.run(&format!("ipoib-up 10.78.0.{}/24", i + 1), CMD_TIMEOUT)?;
        }
        Ok(())
    }

    /// Connects guest `client` to guest `server` through rdma_cm: the server listens on
    /// `port`, the client resolves `server_ip` (an address of the server's: IPoIB's for
    /// hcab0, the NIC's for rxe0) and its route, and connects. Later pings run over it.
    pub fn connect_cm(
        &mut self,
        client: usize,
        server: usize,
        server_ip: &str,
        port: u16,
    ) -> Result<(), VerbsError> {
        self.agents[server].run(&format!("vb cm listen {port}"), CMD_TIMEOUT)?;
        self.agents[client].run(&format!("vb cm connect {server_ip} {port}"), CMD_TIMEOUT)?;
        self.agents[server].run("vb cm wait", CMD_TIMEOUT)?;
        Ok(())
    }

    /// Opens `dev` on guests `i` and `j` (re-opening drops an earlier connection) and
    /// connects their RC QPs; their addresses (`lid=.. qpn=.. ...`).
    pub fn connect_pair(
        &mut self,
        i: usize,
        j: usize,
        dev: &str,
    ) -> Result<[String; 2], VerbsError> {
        let mut addrs = [String::new(), String::new()];
        for (k, &n) in [i, j].iter().enumerate() {
            let a = &mut self.agents[n];
            let out = a.run(&format!("vb open {dev}"), CMD_TIMEOUT)?;
            let line =
                out.lines()
                    .find(|l| l.starts_with("lid="))
                    .ok_or_else(|| AnswerError::NoLine {
                        node: a.name.clone(),
                        what: format!("vb open {dev}"),
                        output: out.clone(),
                    })?;
            addrs[k] = line.trim().to_string();
        }
        self.agents[i].run(&format!("vb connect {}", addrs[1]), CMD_TIMEOUT)?;
        self.agents[j].run(&format!("vb connect {}", addrs[0]), CMD_TIMEOUT)?;
        Ok(addrs)
    }

    /// Ping-pong from guest 0 to guest 1, both handling completions in `mode`.
    pub fn ping(
        &mut self,
        mode: Mode,
        size: u32,
        iters: u64,
        verify: bool,
    ) -> Result<PingResult, VerbsError> {
        self.ping_between(0, 1, mode, size, iters, verify)
    }

    /// Ping-pong from guest `i` to guest `j` (connected by [`Testbed::connect_pair`]).
    pub fn ping_between(
        &mut self,
        i: usize,
        j: usize,
        mode: Mode,
        size: u32,
        iters: u64,
        verify: bool,
    ) -> Result<PingResult, VerbsError> {
        let v = if verify { " verify" } else { "" };
        let (client, server) = pair(&mut self.agents, i, j);
        server.run(&format!("vb serve {mode}{v}"), CMD_TIMEOUT)?;
        let out = if mode == Mode::User {
            server.run("vbench-user serve > /tmp/vbench-user.log &", CMD_TIMEOUT)?;
            client.run("vb serve user", CMD_TIMEOUT)?;
            let r = client.run(&format!("vbench-user ping {size} {iters}{v}"), CMD_TIMEOUT);
            client.run("vb stop", CMD_TIMEOUT)?;
            r?
        } else {
            client.run(&format!("vb ping {mode} {size} {iters}{v}"), CMD_TIMEOUT)?
        };
        let stop = server.run("vb stop", CMD_TIMEOUT)?;
        // (Absent from a vbench before it counted them.)
        let server_deferred = num(&stop, "deferred").unwrap_or(0);
        let (served, server_errors) = if mode == Mode::User {
            // The user process answered; it reports when vb stop ends its read().
            let log = server.run("sleep 0.2; cat /tmp/vbench-user.log", CMD_TIMEOUT)?;
            let line = log.lines().find(|l| l.contains("served=")).unwrap_or("");
            (num(line, "served")?, num(line, "errors")?)
        } else {
            (num(&stop, "served")?, num(&stop, "errors")?)
        };
        let line = out.lines().find(|l| l.starts_with("size=")).unwrap_or("");
        Ok(PingResult {
            mode,
            size,
            iters,
            done: num(line, "done")?,
            errors: num(line, "errors")?,
            rtt_avg_ns: num(line, "rtt_avg_ns")?,
            rtt_min_ns: num(line, "rtt_min_ns")?,
            rtt_median_ns: num(line, "rtt_median_ns")?,
            served,
            server_errors,
            deferred: num(line, "deferred").unwrap_or(0) + server_deferred,
        })
    }

    /// RDMA Write or Read bandwidth from guest 0 against guest 1's region, then a check of
    /// the bytes moved.
    pub fn bw(&mut self, read: bool, size: u32, iters: u64) -> Result<BwResult, VerbsError> {
        let op = if read { "read" } else { "write" };
        let out = self.agents[0].run(&format!("vb bw {op} {size} {iters}"), CMD_TIMEOUT)?;
        let line = out.lines().find(|l| l.starts_with("op=")).unwrap_or("");
        Ok(BwResult {
            read,
            size,
            iters,
            mb_per_s: (u64::from(size) * iters) as f64 * 1e3 / num(line, "ns")?.max(1) as f64,
            errors: num(line, "errors")?,
        })
    }
}

/// Agents `i` and `j` (i != j), both mutable.
fn pair(agents: &mut [Agent], i: usize, j: usize) -> (&mut Agent, &mut Agent) {
    assert_ne!(i, j, "a ping needs two nodes");
    if i < j {
        let (a, b) = agents.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = agents.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.cluster.kill_all();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
