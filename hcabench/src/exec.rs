//! `hcabench exec`: a command in a running cluster's guest, its output and exit status
//! here, for scripts and CI. It goes over each guest's command channel: the second serial
//! port (ttyS1), whose host end is `NODE.agent` in the run directory and on which the shell
//! job's init runs a shell (images/init.sh), so the console stays the user's.
//!
//! One command at a time per node: a lock file beside the socket (`NODE.agent.lock`,
//! flock) keeps two execs or copies from interleaving on one serial line. The guest
//! enforces the time limit itself (a watchdog kills the command's process group), so a
//! stuck command cannot wedge the channel for the next exec.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cluster::agent::{Agent, AgentError, Patience};
use cluster::node::complete_lines;

use crate::daemon::GUEST_STOPPED;
use crate::rundir::{pid_alive, ClusterState, NodeState, RunDir};
use hca_model::sync::Unpoisoned;

/// Run a command in a guest and exit with its exit status
///
/// COMMAND's words are joined with spaces and run by the guest's busybox sh (`sh -c`), as
/// ssh does: quote what the guest's shell should see. Its stdout and stderr both come to
/// stdout here, as they come; its stdin is empty; it starts in the guest's /. It goes over
/// the guest's second serial port, so `hcabench console` stays free.
///
/// Exit status: the command's; 124 when it ran past --timeout (the guest kills it and what
/// it started); 255 when hcabench could not run it (no cluster, no such node, the guest
/// gone). With --all it runs on every node at once, each output line after `NODE: `; the
/// exit status is the first failing node's, and stderr names every failure. Two commands
/// on one node never mix: the second waits for the first.
///
/// Examples:
///   hcabench exec node1 -- 'lsmod | grep hca_ib'
///   hcabench exec --all --timeout 600 -- /tmp/tests/run.sh
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct ExecArgs {
    /// The node, e.g. node1
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub node: Option<String>,
    /// Run the command on every node in parallel
    #[arg(long)]
    pub all: bool,
    /// Seconds the command may run (1 to 86400)
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = timeout_secs())]
    pub timeout: u64,
    /// The command and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Exit status for a command that ran past its time (as coreutils' `timeout`).
pub const TIMED_OUT: u8 = 124;
/// Exit status when hcabench itself could not run the command (as ssh's).
pub const NOT_RUN: u8 = 255;

/// How long `Agent::connect` waits for the guest's shell to answer on the channel.
const CONNECT: Duration = Duration::from_secs(20);
/// How long the host waits for the guest's own verdict past the command's time limit.
const MARGIN: Duration = Duration::from_secs(30);

/// A node's command channel, held: nobody else's exec or cp uses it until this is dropped.
pub struct Channel {
    pub agent: Agent,
    pub node: NodeState,
    /// Held with flock while the channel is open; closing it releases the lock. It holds
    /// when the guest's shell will be free again (UNIX seconds) while a command runs
    /// there: an exec interrupted here (Ctrl-C, a closed pipe) leaves its command running
    /// to its time limit, and the next exec waits that long for the shell.
    lock: File,
}

impl Channel {
    /// Notes in the lock file until when the guest's shell is busy (None: not busy).
    fn busy_until(&mut self, until: Option<SystemTime>) {
        let secs = until
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(String::new(), |d| d.as_secs().to_string());
        let _ = self.lock.set_len(0);
        let _ = self.lock.write_all_at(secs.as_bytes(), 0);
    }
}

/// How long the guest's shell may still be busy with an interrupted exec's command, from
/// the lock file.
fn still_busy(lock: &File) -> Duration {
    let mut text = String::new();
    let _ = (&*lock).read_to_string(&mut text);
    let until = text
        .trim()
        .parse::<u64>()
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s));
    until
        .and_then(|t| t.duration_since(SystemTime::now()).ok())
        .unwrap_or(Duration::ZERO)
}

/// Why a command could not be run in a guest, or did not come back.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("no cluster is up in {}: start one with `hcabench up`", .0.display())]
    NoCluster(PathBuf),
    #[error("no node {name}; the cluster has {}", .nodes.join(", "))]
    NoNode { name: String, nodes: Vec<String> },
    /// The node's guest is not running (`why`: see [`guest_gone`]).
    #[error("{node}: {why}")]
    GuestGone { node: String, why: String },
    #[error(
        "{0} has no command channel: the cluster was started by an hcabench without exec \
         (`hcabench down`, then `hcabench up`)"
    )]
    NoChannel(String),
    #[error("{node}: cannot reach its command channel at {}: {source}", .socket.display())]
    Unreachable {
        node: String,
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{node}: its shell on the second serial port (ttyS1) did not answer within \
         {patience:?}: an earlier command may still run, or the guest hangs (its console: {})",
        .console.display()
    )]
    NoShell {
        node: String,
        patience: Duration,
        console: PathBuf,
    },
    #[error("{0}: the command channel closed (the guest stopped?)")]
    Closed(String),
    #[error(transparent)]
    Shell(AgentError),
    /// The node's channel lock file.
    #[error("{}: {source}", .path.display())]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{node}: another hcabench exec or cp has held its command channel for {wait:?} ({})",
        .path.display()
    )]
    Busy {
        node: String,
        wait: Duration,
        path: PathBuf,
    },
    #[error(
        "{node}: no word from the guest {limit:?} after starting `{cmd}` (its own {secs} s \
         limit did not end it: the guest hangs?)"
    )]
    Hung {
        node: String,
        limit: Duration,
        cmd: String,
        secs: u64,
    },
    #[error("{node}: the guest's shell answered {word:?}, not an exit status")]
    NotAStatus { node: String, word: String },
    #[error("its thread panicked")]
    Panicked,
}

/// The running cluster's state, or why there is none.
pub fn live_cluster(run: &RunDir) -> Result<ClusterState, ExecError> {
    run.live_state()
        .ok_or_else(|| ExecError::NoCluster(run.dir().to_path_buf()))
}

/// The node called `name`, or an error that lists the nodes.
pub fn find_node<'a>(state: &'a ClusterState, name: &str) -> Result<&'a NodeState, ExecError> {
    state
        .nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| ExecError::NoNode {
            name: name.to_string(),
            nodes: state.nodes.iter().map(|n| n.name.clone()).collect(),
        })
}

/// Why the node's guest is not running, if it is not: its QEMU exited, or the daemon
/// noted it stopped (a kill, a crash).
pub fn guest_gone(n: &NodeState) -> Option<String> {
    if !pid_alive(n.pid) {
        return Some(format!("its guest's process (pid {}) has exited", n.pid));
    }
    let log = std::fs::read(&n.console_log).unwrap_or_default();
    complete_lines(&String::from_utf8_lossy(&log))
        .into_iter()
        .find_map(|l| {
            l.strip_prefix(GUEST_STOPPED)
                .map(|why| format!("its guest stopped ({})", why.trim()))
        })
}

/// Opens node `name`'s command channel: waits (up to `wait`) for another exec or cp on it
/// to finish, connects, and checks the guest's shell answers.
pub fn open(
    run: &RunDir,
    state: &ClusterState,
    name: &str,
    wait: Duration,
) -> Result<Channel, ExecError> {
    let n = find_node(state, name)?;
    let gone = |why| ExecError::GuestGone {
        node: name.to_string(),
        why,
    };
    if let Some(why) = guest_gone(n) {
        return Err(gone(why));
    }
    if n.agent_socket.as_os_str().is_empty() {
        return Err(ExecError::NoChannel(name.to_string()));
    }
    let lock = lock_channel(run, name, wait)?;
    let busy = still_busy(&lock);
    if busy > Duration::ZERO {
        eprintln!(
            "hcabench: {name}: an interrupted exec's command may run there for {} s more (to \
             its time limit): waiting for it",
            busy.as_secs()
        );
    }
    let patience = CONNECT + busy;
    let agent = Agent::connect(name, &n.agent_socket, patience).map_err(|e| match e {
        AgentError::Connect { source, .. } => match guest_gone(n) {
            Some(why) => gone(why),
            None => ExecError::Unreachable {
                node: name.to_string(),
                socket: n.agent_socket.clone(),
                source,
            },
        },
        AgentError::Timeout { .. } => ExecError::NoShell {
            node: name.to_string(),
            patience,
            console: n.console_log.clone(),
        },
        e => channel_error(n, e),
    })?;
    let mut ch = Channel {
        agent,
        node: n.clone(),
        lock,
    };
    ch.busy_until(None);
    Ok(ch)
}

/// What an error on an open channel means to a user: a closed channel is a guest gone.
pub fn channel_error(n: &NodeState, e: AgentError) -> ExecError {
    match e {
        AgentError::Closed { .. } => match guest_gone(n) {
            Some(why) => ExecError::GuestGone {
                node: n.name.clone(),
                why,
            },
            None => ExecError::Closed(n.name.clone()),
        },
        e => ExecError::Shell(e),
    }
}

/// Takes `NODE.agent.lock` in the run directory (flock, exclusive), waiting up to `wait`
/// for whoever holds it; says once that it waits.
fn lock_channel(run: &RunDir, name: &str, wait: Duration) -> Result<File, ExecError> {
    let path = run.path(&format!("{name}.agent.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| ExecError::Lock {
            path: path.clone(),
            source,
        })?;
    let started = Instant::now();
    let mut said = false;
    loop {
        // SAFETY: flock on a descriptor this function owns; it touches no memory.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        let source = std::io::Error::last_os_error();
        if source.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(ExecError::Lock { path, source });
        }
        if started.elapsed() > wait {
            return Err(ExecError::Busy {
                node: name.to_string(),
                wait,
                path,
            });
        }
        if !said && started.elapsed() > Duration::from_secs(1) {
            eprintln!("hcabench: {name}: waiting for another exec or cp on it to finish");
            said = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `s` quoted for sh: as it is, whatever it holds.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script that runs `cmd` in the guest under a time limit and ends with `marker` and
/// the command's exit status, or `timeout`. The command runs in a session of its own
/// (setsid), so that the watchdog kills its whole process group: a pipeline or a child it
/// left behind cannot hold the channel past the limit. The watchdog leaves its flag before
/// it kills, as the shell's `wait` returns the moment the command dies. (`wait`'s stderr is the shell's
/// "Killed" for a command the watchdog ended.)
fn exec_script(cmd: &str, secs: u64, marker: &str) -> String {
    let flag = "/tmp/.hcabench-exec-timeout";
    format!(
        "rm -f {flag}\n\
         setsid sh -c {cmd} < /dev/null 2>&1 &\n\
         hcabench_pid=$!\n\
         setsid sh -c \"sleep {secs}; : > {flag}; kill -KILL -$hcabench_pid 2> /dev/null || rm {flag}\" \
         < /dev/null > /dev/null 2>&1 &\n\
         hcabench_dog=$!\n\
         wait $hcabench_pid 2> /dev/null\n\
         hcabench_rc=$?\n\
         kill -KILL -$hcabench_dog 2> /dev/null\n\
         [ -e {flag} ] && hcabench_rc=timeout\n\
         echo \"{marker}$hcabench_rc\"",
        cmd = sh_quote(cmd)
    )
}

/// How a command in a guest ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Exited(u8),
    TimedOut,
}

/// Runs `cmd` on an open channel, its output to `sink` as it comes.
pub fn run_on(
    ch: &mut Channel,
    cmd: &str,
    secs: u64,
    sink: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<Outcome, ExecError> {
    let limit = Duration::from_secs(secs) + MARGIN;
    ch.busy_until(Some(SystemTime::now() + Duration::from_secs(secs + 5)));
    let word = ch
        .agent
        .exchange(
            cmd,
            |marker| exec_script(cmd, secs, marker),
            Patience::Total(limit),
            sink,
        )
        .map_err(|e| match e {
            AgentError::Timeout { .. } => ExecError::Hung {
                node: ch.node.name.clone(),
                limit,
                cmd: cmd.to_string(),
                secs,
            },
            e => channel_error(&ch.node, e),
        })?;
    ch.busy_until(None);
    match word.as_str() {
        "timeout" => Ok(Outcome::TimedOut),
        w => w
            .parse::<u8>()
            .map(Outcome::Exited)
            .map_err(|_| ExecError::NotAStatus {
                node: ch.node.name.clone(),
                word: w.to_string(),
            }),
    }
}

/// `--timeout`'s range for a command in a guest (`exec`, `mpirun`): a second to a day.
pub fn timeout_secs() -> clap::builder::RangedU64ValueParser {
    clap::value_parser!(u64).range(1..=86_400)
}

/// Exits with a guest command's status (what `run` returned), or says why it did not run
/// and exits [`NOT_RUN`].
pub fn exit_with<E: std::error::Error>(run: Result<u8, E>) -> ExitCode {
    match run {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("hcabench: {}", crate::error::chain(&e));
            ExitCode::from(NOT_RUN)
        }
    }
}

/// `hcabench exec`: the exit status is the command's.
pub fn main(run: &RunDir, a: &ExecArgs) -> ExitCode {
    exit_with(exec(run, a))
}

fn exec(run: &RunDir, a: &ExecArgs) -> Result<u8, ExecError> {
    let cmd = a.command.join(" ");
    let state = live_cluster(run)?;
    let wait = Duration::from_secs(a.timeout) + MARGIN;
    if !a.all {
        let node = a.node.as_deref().unwrap_or_default();
        let mut ch = open(run, &state, node, wait)?;
        let mut stdout = std::io::stdout().lock();
        let outcome = run_on(&mut ch, &cmd, a.timeout, &mut |b| {
            stdout.write_all(b)?;
            stdout.flush()
        })?;
        return Ok(match outcome {
            Outcome::Exited(code) => code,
            Outcome::TimedOut => {
                eprintln!(
                    "hcabench: {node}: `{cmd}` ran past its {} s limit and was killed \
                     (--timeout)",
                    a.timeout
                );
                TIMED_OUT
            }
        });
    }
    // Every node at once, lines kept whole: each node's output is cut into lines before
    // it reaches stdout.
    let stdout = Mutex::new(std::io::stdout());
    let results: Vec<(String, Result<Outcome, ExecError>)> = std::thread::scope(|s| {
        let jobs: Vec<_> = (state.nodes.iter())
            .map(|n| {
                let (name, cmd, stdout, state) = (&n.name, &cmd, &stdout, &state);
                s.spawn(move || {
                    let mut lines = Prefixed::new(name, stdout);
                    let r = open(run, state, name, wait)
                        .and_then(|mut ch| run_on(&mut ch, cmd, a.timeout, &mut |b| lines.push(b)));
                    lines.finish();
                    r
                })
            })
            .collect();
        (state.nodes.iter().zip(jobs))
            .map(|(n, j)| {
                let r = j.join().unwrap_or(Err(ExecError::Panicked));
                (n.name.clone(), r)
            })
            .collect()
    });
    let mut failed = Vec::new();
    let mut code = 0;
    for (name, r) in &results {
        let (this, why) = match r {
            Ok(Outcome::Exited(0)) => continue,
            Ok(Outcome::Exited(c)) => (*c, format!("exit {c}")),
            Ok(Outcome::TimedOut) => (TIMED_OUT, format!("killed after {} s", a.timeout)),
            Err(e) => (NOT_RUN, e.to_string()),
        };
        if code == 0 {
            code = this;
        }
        failed.push(format!("{name} ({why})"));
    }
    if !failed.is_empty() {
        eprintln!(
            "hcabench: `{cmd}` failed on {} of {} nodes: {}",
            failed.len(),
            results.len(),
            failed.join(", ")
        );
    }
    Ok(code)
}

/// One node's output for `--all`: whole lines, each after `NODE: `.
struct Prefixed<'a> {
    prefix: String,
    partial: Vec<u8>,
    out: &'a Mutex<std::io::Stdout>,
}

impl<'a> Prefixed<'a> {
    fn new(name: &str, out: &'a Mutex<std::io::Stdout>) -> Self {
        Prefixed {
            prefix: format!("{name}: "),
            partial: Vec::new(),
            out,
        }
    }

    fn push(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.partial.extend_from_slice(b);
        let Some(end) = self.partial.iter().rposition(|&c| c == b'\n') else {
            return Ok(());
        };
        let done: Vec<u8> = self.partial.drain(..=end).collect();
        self.write(&done)
    }

    fn write(&self, text: &[u8]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(text.len() + 16);
        for line in text.split_inclusive(|&c| c == b'\n') {
            buf.extend_from_slice(self.prefix.as_bytes());
            buf.extend_from_slice(line);
        }
        let out = self.out.lock_unpoisoned();
        let mut out = out.lock();
        out.write_all(&buf)?;
        out.flush()
    }

    /// A last line without its newline gets one.
    fn finish(&mut self) {
        if !self.partial.is_empty() {
            let mut last = std::mem::take(&mut self.partial);
            last.push(b'\n');
            let _ = self.write(&last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_any_text_is_quoted_for_sh_as_it_is() {
        assert_eq!(sh_quote("ls -l"), "'ls -l'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        // sh itself reads each back as it was.
        for s in ["a b", "it's", "$HOME `x` \"q\"", "new\nline", "''", "\\"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", sh_quote(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), s);
        }
    }

    #[test]
    fn test_the_exec_script_reports_a_status_or_a_timeout_on_the_marker_line() {
        // The guest's script, run by the host's sh: the same busybox-compatible syntax.
        let flag = std::env::temp_dir().join(format!(".hcab-t-{}", std::process::id()));
        let run = |cmd: &str, secs: u64| {
            let s = exec_script(cmd, secs, "HCABENCH-RC t-1 ");
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(s.replace("/tmp/.hcabench-exec-timeout", flag.to_str().unwrap()))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(run("echo hi; exit 3", 10), "hi\nHCABENCH-RC t-1 3\n");
        assert_eq!(run("echo 'it'\\''s' >&2", 10), "it's\nHCABENCH-RC t-1 0\n");
        let t = Instant::now();
        assert_eq!(
            run("sleep 30 | cat; echo never", 1),
            "HCABENCH-RC t-1 timeout\n"
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        let _ = std::fs::remove_file(&flag);
    }

    #[test]
    fn test_all_keeps_each_nodes_lines_whole_and_prefixed() {
        let out = Mutex::new(std::io::stdout());
        let mut p = Prefixed::new("node2", &out);
        p.push(b"par").unwrap();
        assert_eq!(p.partial, b"par");
        p.push(b"tial\nnext\nla").unwrap();
        assert_eq!(p.partial, b"la");
        p.finish();
        assert!(p.partial.is_empty());
    }
}
