//! MPI jobs across guests without ssh, for both MPIs Debian 12 has: MPICH's launcher
//! (hydra's `mpiexec`) with its manual launcher, and Open MPI's `mpirun` with an rsh agent
//! of ours; in both the host starts the remote part through the guests' command channels.
//!
//! MPICH, on nodes `n0, n1, ...` (IPoIB addresses `a0, a1, ...` on ib0):
//!
//! 1. On n0: `mpiexec.hydra -launcher manual -iface ib0 -hosts a0,a1,... -n N PROGRAM`. With
//!    the manual launcher mpiexec starts no proxy itself: it prints each proxy's command
//!    line, `HYDRA_LAUNCH: hydra_pmi_proxy --control-port a0:PORT ... --proxy-id K`, one per
//!    host in `-hosts`' order, then `HYDRA_LAUNCH_END`, and waits for them to connect to
//!    its control port.
//! 2. n0's channel is busy with mpiexec, so n0's own proxy (the first line) is started by
//!    the guest-side script that reads mpiexec's output ([`launcher_script`]); every other
//!    line reaches the host, which runs proxy K on node K through that node's channel.
//! 3. The proxies start the ranks, relay their output to mpiexec (so every rank's output
//!    comes back on n0's channel) and exit when the job ends; mpiexec exits with the
//!    job's status, which the script prints after [`EXIT`].
//!
//! Open MPI: `mpirun.openmpi -H a0:S,a1:S,... --map-by node` on n0 with
//! `plm_rsh_agent` set to [`RSH_AGENT`], which every node gets first: where mpirun would
//! ssh to host `aK` to start its daemon (orted), the agent prints `HCABENCH-RSH aK COMMAND`
//! and exits, and the host runs COMMAND (in the foreground: `--daemonize` taken out) on
//! node K. n0's ranks mpirun starts itself. Open MPI wants host names it can put in a
//! regular expression, so a guest without one (`(none)`) is named after its node first.
//!
//! The ranks talk over UCX (Debian's MPICH is built ch4:ucx; Open MPI runs with `--mca pml
//! ucx`); `UCX_NET_DEVICES=hcab0:1` by default, so that their traffic goes over hcab0's
//! verbs transports, not TCP on ib0 (the launchers' own connections use TCP on ib0).

use std::io;
use std::sync::mpsc;
use std::time::Duration;

use crate::agent::{Agent, AgentError, Patience};

/// The line the launcher script ends with: mpiexec's exit status follows.
pub const EXIT: &str = "HCABENCH-MPIEXEC-EXIT ";
/// The start of a proxy's command line in mpiexec's output (the manual launcher's).
pub const LAUNCH: &str = "HYDRA_LAUNCH: ";
/// The start of a launch line from our rsh agent for Open MPI: the host's address and the
/// command follow.
pub const RSH: &str = "HCABENCH-RSH ";
/// Where every node gets our rsh agent for Open MPI.
pub const RSH_AGENT: &str = "/tmp/hcabench-rsh";
/// UCX's settings for the ranks unless the job says otherwise.
pub const UCX_DEFAULTS: [(&str, &str); 1] = [("UCX_NET_DEVICES", "hcab0:1")];

/// A guest's shell that can run a command, its output streamed as it comes.
pub trait Shell: Send {
    /// The node's name (node1).
    fn name(&self) -> &str;
    /// Runs `cmd` (sh syntax) for at most `secs` seconds, its stdout and stderr to `sink`;
    /// its exit status, or None when it ran past `secs` and was killed.
    fn stream(
        &mut self,
        cmd: &str,
        secs: u64,
        sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<Option<u8>, Box<dyn std::error::Error + Send + Sync>>;
}

impl Shell for Agent {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream(
        &mut self,
        cmd: &str,
        secs: u64,
        sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<Option<u8>, Box<dyn std::error::Error + Send + Sync>> {
        // The guest's own `timeout` kills the command; the host waits a little longer.
        let word = self.exchange(
            cmd,
            |marker| {
                format!(
                    "timeout -s KILL {secs} sh -c {} < /dev/null 2>&1\necho \"{marker}$?\"\n",
                    sh_quote(cmd)
                )
            },
            Patience::Total(Duration::from_secs(secs + 30)),
            sink,
        )?;
        match word.parse::<u8>() {
            // `timeout -s KILL`'s status for a command it killed.
            Ok(137) => Ok(None),
            Ok(s) => Ok(Some(s)),
            Err(_) => Err(Box::new(AgentError::Garbled {
                node: self.name.clone(),
                what: format!("status {word:?}"),
            })),
        }
    }
}

/// `s` quoted for sh, whatever it holds.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Which MPI runs the job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mpi {
    /// MPICH 4.0 (ch4:ucx), launched by hydra's mpiexec.
    #[default]
    Mpich,
    /// Open MPI 4.1 (pml ucx), launched by its mpirun.
    OpenMpi,
}

/// An MPI job: `ranks` processes of `program` over the nodes, round-robin.
#[derive(Clone, Debug)]
pub struct Job {
    pub mpi: Mpi,
    pub ranks: usize,
    /// The program and its arguments, each a word (quoted for the guest's shell here).
    pub program: Vec<String>,
    /// Environment for the ranks (beside [`UCX_DEFAULTS`], which these override).
    pub env: Vec<(String, String)>,
    /// Seconds the whole job may take.
    pub secs: u64,
}

/// How a job went.
#[derive(Debug)]
pub struct Outcome {
    /// mpiexec's exit status (the job's: non-zero when a rank failed); None when the job
    /// ran past its time and was killed.
    pub status: Option<u8>,
    /// Everything mpiexec and the ranks printed (n0's channel), the launch lines left out.
    pub output: String,
    /// Each node's IPoIB address, in the order of the nodes.
    pub hosts: Vec<String>,
}

/// Why a job could not be run.
#[derive(Debug, thiserror::Error)]
pub enum MpiError {
    #[error("an MPI job needs at least one node and one rank")]
    Empty,
    #[error("{node}: no IPv4 address on ib0 (is IPoIB up?): {output}")]
    NoAddress { node: String, output: String },
    #[error("{node}: {source}")]
    Shell {
        node: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "mpiexec asked for {asked} proxies for {nodes} nodes (is MPICH's mpiexec on the \
         disk? `hcabench up --package mpich`)"
    )]
    Proxies { asked: usize, nodes: usize },
    #[error("mpirun asked to start a daemon on {0}, which is none of the nodes' ib0")]
    UnknownHost(String),
    #[error("{node}: its proxy ended with status {status:?}; its output:\n{output}")]
    Proxy {
        node: String,
        status: Option<u8>,
        output: String,
    },
    #[error("a thread of the launcher panicked")]
    Panicked,
}

/// The IPv4 address in `ip -4 addr show ib0`'s output (`inet 10.78.0.1/16 ...`).
pub fn ib0_address(ip_output: &str) -> Option<String> {
    ip_output.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("inet ")?;
        let addr = rest.split(['/', ' ']).next()?;
        let ok = addr.split('.').count() == 4 && addr.split('.').all(|o| o.parse::<u8>().is_ok());
        ok.then(|| addr.to_string())
    })
}

/// The script n0 runs: the MPI's launcher, its exit status last after [`EXIT`]. For
/// MPICH its output is read line by line: the first launch line (n0's own proxy) is
/// started there in the background, and every line (that one too) is passed on.
pub fn launcher_script(job: &Job, hosts: &[String]) -> String {
    let mut env: Vec<(String, String)> = UCX_DEFAULTS
        .iter()
        .filter(|(k, _)| !job.env.iter().any(|(j, _)| j == k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(job.env.iter().cloned());
    let assign: String = env
        .iter()
        .map(|(k, v)| format!("{k}={} ", sh_quote(v)))
        .collect();
    let program: Vec<String> = job.program.iter().map(|w| sh_quote(w)).collect();
    let program = program.join(" ");
    let ranks = job.ranks;
    match job.mpi {
        Mpi::Mpich => format!(
            "cd /tmp && {{ env {assign}mpiexec.hydra -launcher manual -iface ib0 -hosts {hosts} \
             -n {ranks} {program}; echo \"{EXIT}$?\"; }} 2>&1 | {{ local=; \
             while IFS= read -r l; do case \"$l\" in \"{LAUNCH}\"*) if [ -z \"$local\" ]; then \
             local=1; sh -c \"${{l#{LAUNCH}}}\" < /dev/null > /tmp/hcabench-proxy.log 2>&1 & \
             fi;; esac; echo \"$l\"; done; wait; }}",
            hosts = hosts.join(","),
        ),
        Mpi::OpenMpi => {
            let slots = ranks.div_ceil(hosts.len().max(1));
            let hosts: Vec<String> = hosts.iter().map(|h| format!("{h}:{slots}")).collect();
            let export: String = env.iter().map(|(k, _)| format!("-x {k} ")).collect();
            format!(
                "cd /tmp && {{ env {assign}mpirun.openmpi --allow-run-as-root \
                 --mca plm_rsh_agent {RSH_AGENT} --mca plm_rsh_no_tree_spawn 1 \
                 --mca oob_tcp_if_include ib0 --mca pml ucx --mca btl ^openib {export}\
                 -H {hosts} --map-by node -np {ranks} {program}; echo \"{EXIT}$?\"; }} 2>&1",
                hosts = hosts.join(","),
            )
        }
    }
}

/// What every node runs before a job: a host name where it has none (Open MPI's
/// `(none)` is refused), and our rsh agent for Open MPI, which prints its request for the
/// host to carry out.
pub fn prepare_script(node: &str) -> String {
    format!(
        "[ \"$(hostname)\" = '(none)' ] && hostname {node}; \
         printf '%s\\n' '#!/bin/sh' 'h=$1; shift' 'echo \"{RSH}$h $*\"' > {RSH_AGENT} && \
         chmod +x {RSH_AGENT} && ip -4 addr show ib0",
        node = sh_quote(node)
    )
}

/// A launch request in a line of n0's output: the node (index into `hosts`) and the command
/// to run there. `launches` counts MPICH's launch lines before this one (its K-th proxy
/// goes to node K); Open MPI's name their host.
pub fn launch_request(
    mpi: Mpi,
    line: &str,
    launches: usize,
    hosts: &[String],
) -> Option<Result<(usize, String), MpiError>> {
    match mpi {
        Mpi::Mpich => line
            .strip_prefix(LAUNCH)
            .map(|cmd| Ok((launches, cmd.to_string()))),
        Mpi::OpenMpi => {
            let rest = line.strip_prefix(RSH)?;
            let (host, cmd) = rest.split_once(' ').unwrap_or((rest, ""));
            // orted stays in the foreground, so that its node's channel tells when it ends.
            let cmd = cmd.trim().replacen("--daemonize ", "", 1);
            Some(match hosts.iter().position(|h| h == host) {
                Some(i) if i > 0 => Ok((i, cmd)),
                _ => Err(MpiError::UnknownHost(host.to_string())),
            })
        }
    }
}

/// Runs `job` on `nodes` (the first one runs mpiexec): each node's ib0 address, then the
/// launcher on the first and the proxies mpiexec asks for on the others. `out` sees the
/// first node's output as it comes.
pub fn run<S: Shell>(
    nodes: &mut [S],
    job: &Job,
    out: &mut (dyn FnMut(&str) + Send),
) -> Result<Outcome, MpiError> {
    if nodes.is_empty() || job.ranks == 0 {
        return Err(MpiError::Empty);
    }
    let mut hosts = Vec::new();
    for n in nodes.iter_mut() {
        let mut text = Vec::new();
        let prepare = prepare_script(n.name());
        n.stream(&prepare, 20, &mut |b| {
            text.extend_from_slice(b);
            Ok(())
        })
        .map_err(|source| MpiError::Shell {
            node: n.name().to_string(),
            source,
        })?;
        let text = String::from_utf8_lossy(&text).into_owned();
        hosts.push(ib0_address(&text).ok_or_else(|| MpiError::NoAddress {
            node: n.name().to_string(),
            output: text.trim().to_string(),
        })?);
    }
    let script = launcher_script(job, &hosts);
    let (first, rest) = nodes.split_first_mut().ok_or(MpiError::Empty)?;
    let first_name = first.name().to_string();
    let (tx, rx) = mpsc::channel::<Result<(usize, String), MpiError>>();
    let mpi = job.mpi;
    let hosts_seen = hosts.clone();
    let secs = job.secs;
    std::thread::scope(|s| {
        let launcher = s.spawn(move || {
            let mut output = String::new();
            let mut partial = Vec::new();
            let mut launches = 0usize;
            let mut status = None;
            let r = first.stream(&script, secs, &mut |b| {
                partial.extend_from_slice(b);
                while let Some(i) = partial.iter().position(|&c| c == b'\n') {
                    let line: Vec<u8> = partial.drain(..=i).collect();
                    let line = String::from_utf8_lossy(&line).replace('\r', "");
                    let line = line.trim_end_matches('\n');
                    if let Some(req) = launch_request(mpi, line, launches, &hosts_seen) {
                        // MPICH's first is n0's own, which the script started.
                        if launches > 0 || mpi == Mpi::OpenMpi {
                            let _ = tx.send(req);
                        }
                        launches += 1;
                    } else if let Some(st) = line.strip_prefix(EXIT) {
                        status = st.trim().parse::<u8>().ok();
                    } else if line != "HYDRA_LAUNCH_END" {
                        out(line);
                        output.push_str(line);
                        output.push('\n');
                    }
                }
                Ok(())
            });
            drop(tx);
            (r, status, output, launches)
        });
        // Each request on its node, in a thread of its own; a node takes one.
        let mut free: Vec<Option<&mut S>> = rest.iter_mut().map(Some).collect();
        let mut proxies = Vec::new();
        for req in rx.iter() {
            let node = req.and_then(|(k, cmd)| {
                let slot = k.checked_sub(1).and_then(|i| free.get_mut(i));
                match slot.and_then(Option::take) {
                    Some(node) => Ok((node, cmd)),
                    None => Err(MpiError::Proxies {
                        asked: k + 1,
                        nodes: hosts.len(),
                    }),
                }
            });
            let (node, cmd) = match node {
                Ok(n) => n,
                Err(e) => {
                    proxies.push(Err(e));
                    continue;
                }
            };
            proxies.push(Ok(s.spawn(move || {
                let mut text = Vec::new();
                let r = node.stream(&cmd, secs, &mut |b| {
                    text.extend_from_slice(b);
                    Ok(())
                });
                (node.name().to_string(), r, text)
            })));
        }
        let (r, status, output, launches) = launcher.join().map_err(|_| MpiError::Panicked)?;
        let mut failed = None;
        for p in proxies {
            let (node, r, text) = p?.join().map_err(|_| MpiError::Panicked)?;
            let text = String::from_utf8_lossy(&text).into_owned();
            match r {
                Ok(Some(0)) => {}
                Ok(st) => {
                    failed.get_or_insert(MpiError::Proxy {
                        node,
                        status: st,
                        output: text,
                    });
                }
                Err(source) => {
                    failed.get_or_insert(MpiError::Shell { node, source });
                }
            }
        }
        let script = r.map_err(|source| MpiError::Shell {
            node: first_name,
            source,
        })?;
        if mpi == Mpi::Mpich && launches != 0 && launches != hosts.len() {
            return Err(MpiError::Proxies {
                asked: launches,
                nodes: hosts.len(),
            });
        }
        // A proxy's failure is the news only when mpiexec gave no status of its own.
        if let (Some(_), None, Some(e)) = (script, status, failed) {
            return Err(e);
        }
        Ok(Outcome {
            status: script.and(status),
            output,
            hosts: hosts.clone(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ib0_address_is_read_from_ip_output() {
        let out = "4: ib0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 2044 qdisc pfifo_fast\n    \
                   link/infiniband 80:00:00:02:fe:80 brd 00:ff:ff:ff:ff:12\n    \
                   inet 10.78.0.3/16 scope global ib0\n       valid_lft forever\n";
        assert_eq!(ib0_address(out).as_deref(), Some("10.78.0.3"));
        assert_eq!(ib0_address("Device \"ib0\" does not exist."), None);
        assert_eq!(ib0_address("inet 10.78.0/16"), None);
    }

    #[test]
    fn test_launcher_script_starts_the_first_proxy_and_reports_the_status() {
        let job = Job {
            mpi: Mpi::Mpich,
            ranks: 4,
            program: vec!["mpi-check".into(), "it's".into()],
            env: vec![("UCX_TLS".into(), "rc_verbs,self".into())],
            secs: 60,
        };
        let s = launcher_script(&job, &["10.78.0.1".into(), "10.78.0.2".into()]);
        assert!(s.contains("-hosts 10.78.0.1,10.78.0.2 -n 4 'mpi-check' 'it'\\''s'"));
        assert!(s.contains("UCX_NET_DEVICES='hcab0:1' UCX_TLS='rc_verbs,self' mpiexec.hydra"));
        assert!(s.contains(&format!("echo \"{EXIT}$?\"")));
        // The user's UCX_NET_DEVICES wins over the default.
        let job = Job {
            env: vec![("UCX_NET_DEVICES".into(), "ib0".into())],
            ..job
        };
        let s = launcher_script(&job, &["10.78.0.1".into()]);
        assert!(!s.contains("hcab0:1") && s.contains("UCX_NET_DEVICES='ib0'"));
        // Open MPI: slots for every rank, spread by node, each variable exported.
        let job = Job {
            mpi: Mpi::OpenMpi,
            ranks: 3,
            ..job
        };
        let s = launcher_script(&job, &["10.78.0.1".into(), "10.78.0.2".into()]);
        assert!(s.contains("-H 10.78.0.1:2,10.78.0.2:2 --map-by node -np 3 'mpi-check'"));
        assert!(s.contains("-x UCX_NET_DEVICES ") && s.contains(RSH_AGENT));
    }

    #[test]
    fn test_launch_requests_name_their_node() {
        let hosts: Vec<String> = vec!["10.78.0.1".into(), "10.78.0.2".into()];
        let line = "HYDRA_LAUNCH: /usr/bin/hydra_pmi_proxy --control-port 10.78.0.1:4 --proxy-id 1";
        let (k, cmd) = launch_request(Mpi::Mpich, line, 1, &hosts)
            .unwrap()
            .unwrap();
        assert_eq!((k, cmd.starts_with("/usr/bin/hydra_pmi_proxy")), (1, true));
        assert!(launch_request(Mpi::Mpich, "rank 0 of 2", 1, &hosts).is_none());
        let line = "HCABENCH-RSH 10.78.0.2  orted --daemonize -mca ess \"env\"";
        let (k, cmd) = launch_request(Mpi::OpenMpi, line, 0, &hosts)
            .unwrap()
            .unwrap();
        assert_eq!((k, cmd.as_str()), (1, "orted -mca ess \"env\""));
        let line = "HCABENCH-RSH 10.9.9.9 orted";
        assert!(matches!(
            launch_request(Mpi::OpenMpi, line, 0, &hosts),
            Some(Err(MpiError::UnknownHost(_)))
        ));
    }
}
