//! Kernel verbs runs between two guests: a testbed (device server, two QEMU guests with the
//! hcabench HCA and a virtio-net link between them, both under agent control) and the
//! operations of the guest's `vbench` module over any ib_device: our `hcab0`, or `rxe0`
//! (SoftRoCE over the virtio-net link), so that the same module measures both.
//!
//! The guest side is `guest-kmod/vbench` (the verbs consumer), `vbench-user` (the user
//! process of mode "user"), `vb` and `rxe-up` (shell helpers in the image).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::agent::Agent;
use crate::console_protocol;
use crate::qemu::{BootedGuest, Guest, GuestSpec, Image, NetSpec};
use crate::{DeviceServer, NodeConfig};
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

fn field<T: std::str::FromStr>(line: &str, key: &str) -> Result<T, String> {
    fields(line)
        .get(key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no {key}= in the guest's answer `{}`", line.trim()))
}

/// The number after `key=` in a vbench (or dsm) result line.
pub fn num(line: &str, key: &str) -> Result<u64, String> {
    field(line, key)
}

/// Like [`num`], for a decimal fraction.
pub fn float(line: &str, key: &str) -> Result<f64, String> {
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

/// How many QEMU guests a testbed boots and how.
#[derive(Clone, Copy, Debug)]
pub struct QemuShape {
    pub nodes: usize,
    /// A virtio-net link between the two guests (for SoftRoCE); needs `nodes == 2`.
    pub link: bool,
    pub ram_mib: u64,
    pub vcpus: u32,
    /// QEMU with `-accel kvm` (only where KVM runs Linux guests) instead of TCG.
    pub kvm: bool,
}

/// Booted guests under agent control, and the device server behind their HCAs when they
/// are QEMU guests (hcabench's own VMM hosts its HCAs in-process: `server` is None).
pub struct Testbed {
    pub agents: Vec<Agent>,
    pub guests: Vec<Box<dyn BootedGuest>>,
    pub server: Option<DeviceServer>,
    /// The fabric of guests whose host runs it in this process (the VMM's).
    fabric: Option<Fabric>,
    pub dir: PathBuf,
    keep_dir: bool,
}

impl Testbed {
    /// Boots two guests (`ram_mib` each) in `dir`, linked by virtio-net, and connects to
    /// their shells. `progress` hears about each step.
    pub fn boot(
        image: &Image,
        dir: PathBuf,
        ram_mib: u64,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Testbed, String> {
        Self::boot_nodes(image, dir, 2, true, ram_mib, boot_timeout, progress)
    }

    /// Boots `n` guests; with `link`, `n` must be 2 and they share a virtio-net link.
    pub fn boot_nodes(
        image: &Image,
        dir: PathBuf,
        n: usize,
        link: bool,
        ram_mib: u64,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Testbed, String> {
        let shape = QemuShape {
            nodes: n,
            link,
            ram_mib,
            vcpus: 1,
            kvm: false,
        };
        Self::boot_qemu(image, dir, shape, boot_timeout, progress)
    }

    /// Boots QEMU guests as `shape` says, each with its HCA in a device server.
    pub fn boot_qemu(
        image: &Image,
        dir: PathBuf,
        shape: QemuShape,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Testbed, String> {
        let QemuShape {
            nodes: n,
            link,
            ram_mib,
            ..
        } = shape;
        if link && n != 2 {
            return Err("a virtio-net link joins exactly two guests".into());
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let nodes = NodeConfig::cluster(&dir, n, ram_mib << 20);
        let server = DeviceServer::start(nodes.clone()).map_err(|e| e.to_string())?;
        let mut tb = Testbed {
            agents: Vec::new(),
            guests: Vec::new(),
            server: Some(server),
            fabric: None,
            dir: dir.clone(),
            keep_dir: false,
        };
        let eth = dir.join("eth.sock");
        let _ = std::fs::remove_file(&eth);
        for (i, node) in nodes.into_iter().enumerate() {
            let spec = GuestSpec {
                console_log: dir.join(format!("{}.console", node.name)),
                console_socket: Some(dir.join(format!("{}.serial", node.name))),
                node,
                image: image.clone(),
                vcpus: shape.vcpus,
                kvm: shape.kvm,
                cmd: "agent".into(),
                kernel_args: String::new(),
                net: link.then(|| NetSpec {
                    socket: eth.clone(),
                    listen: i == 0,
                    mac: format!("52:54:00:12:34:{:02x}", i + 1),
                }),
            };
            progress(&format!("starting {}", spec.node.name));
            tb.guests.push(Box::new(
                Guest::spawn(&spec).map_err(|e| format!("cannot start QEMU: {e}"))?,
            ));
            if i == 0 && link {
                // The second guest connects to the link socket the first one listens on.
                wait_for_path(&eth, Duration::from_secs(10))?;
            }
        }
        tb.connect_agents(boot_timeout, progress)?;
        Ok(tb)
    }

    /// A testbed of guests started elsewhere (booted with `hcabench.cmd=agent`, each
    /// console on `dir/<name>.serial`): waits for their shells and connects to them.
    pub fn from_guests(
        guests: Vec<Box<dyn BootedGuest>>,
        dir: PathBuf,
        fabric: Option<Fabric>,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Testbed, String> {
        let mut tb = Testbed {
            agents: Vec::new(),
            guests,
            server: None,
            fabric,
            dir,
            keep_dir: false,
        };
        tb.connect_agents(boot_timeout, progress)?;
        Ok(tb)
    }

    fn connect_agents(
        &mut self,
        boot_timeout: Duration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), String> {
        for g in &mut self.guests {
            let (_, took) = g.wait_line(console_protocol::AGENT, boot_timeout)?;
            progress(&format!("{} booted ({took:.1?})", g.name()));
            let sock = self.dir.join(format!("{}.serial", g.name()));
            let agent = Agent::connect(g.name(), &sock, boot_timeout)
                .map_err(|e| format!("{e}\nconsole of {}:\n{}", g.name(), tail(&g.console())))?;
            self.agents.push(agent);
        }
        Ok(())
    }

    /// The fabric between the guests' HCAs (the device server's, or the VMM's).
    pub fn fabric(&self) -> Option<&Fabric> {
        self.server
            .as_ref()
            .map(DeviceServer::fabric)
            .or(self.fabric.as_ref())
    }

    /// Guest `i`'s HCA, while it is on the fabric.
    pub fn hca(&self, i: usize) -> Option<Hca> {
        match &self.server {
            Some(s) => s.hca(i),
            None => self.guests.get(i).and_then(|g| g.hca()),
        }
    }

    /// Keeps the directory (consoles, logs) after the testbed goes, for a post-mortem.
    pub fn keep_dir(&mut self) {
        self.keep_dir = true;
    }

    /// The end of the guest's console log (for error reports).
    pub fn console(&self, i: usize) -> String {
        tail(&self.guests[i].console())
    }

    /// Brings up SoftRoCE on both guests: device rxe0 over the virtio-net link.
    pub fn rxe_up(&mut self) -> Result<(), String> {
        for (i, a) in self.agents.iter_mut().enumerate() {
            a.run(&format!("rxe-up 10.77.0.{}/24", i + 1), CMD_TIMEOUT)?;
        }
        Ok(())
    }

    /// Opens `dev` on both guests and connects their RC QPs (the harness hands each side
    /// the other's address).
    pub fn connect(&mut self, dev: &str) -> Result<(), String> {
        self.connect_pair(0, 1, dev).map(|_| ())
    }

    /// Opens `dev` on guests `i` and `j` (re-opening drops an earlier connection) and
    /// connects their RC QPs; their addresses (`lid=.. qpn=.. ...`).
    pub fn connect_pair(&mut self, i: usize, j: usize, dev: &str) -> Result<[String; 2], String> {
        let mut addrs = [String::new(), String::new()];
        for (k, &n) in [i, j].iter().enumerate() {
            let a = &mut self.agents[n];
            let out = a.run(&format!("vb open {dev}"), CMD_TIMEOUT)?;
            let line = out
                .lines()
                .find(|l| l.starts_with("lid="))
                .ok_or_else(|| format!("{}: vb open {dev}: no address in `{out}`", a.name))?;
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
    ) -> Result<PingResult, String> {
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
    ) -> Result<PingResult, String> {
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
        })
    }

    /// RDMA Write or Read bandwidth from guest 0 against guest 1's region, then a check of
    /// the bytes moved.
    pub fn bw(&mut self, read: bool, size: u32, iters: u64) -> Result<BwResult, String> {
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

/// The last 40 lines of a console log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
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

fn wait_for_path(p: &std::path::Path, timeout: Duration) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    while !p.exists() {
        if std::time::Instant::now() > deadline {
            return Err(format!("{} did not appear", p.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for g in &mut self.guests {
            g.kill();
        }
        if let Some(s) = self.server.take() {
            let _ = s.shutdown();
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
