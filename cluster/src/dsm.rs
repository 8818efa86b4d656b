//! Driving the guests' DSM module (`guest-kmod/dsm`) through their shells: opening it on an
//! ib_device and connecting the full mesh of RC QPs (the harness hands every node every
//! other node's address).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::agent::{Agent, AgentError};
use crate::verbs::{fields, float, num, AnswerError};

/// Why driving the DSM in the guests failed.
#[derive(Debug)]
pub enum DsmError {
    Shell(AgentError),
    Answer(AnswerError),
    /// An application exited non-zero for another reason than its own failed check.
    Exited {
        node: String,
        cmd: String,
        status: i32,
        output: String,
    },
    /// An application failed; `state` is what every node's DSM waited on and held just
    /// after (`dsmctl state` and the module's kernel log lines), to tell a lost message
    /// from a stuck queue or a dead QP.
    Failed {
        cause: Box<DsmError>,
        state: String,
    },
}

impl fmt::Display for DsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DsmError::Shell(e) => write!(f, "{e}"),
            DsmError::Answer(e) => write!(f, "{e}"),
            DsmError::Exited {
                node,
                cmd,
                status,
                output,
            } => write!(f, "{node}: `{cmd}` exited {status}:\n{output}"),
            DsmError::Failed { cause, state } => {
                write!(f, "{cause}\nthe DSM on every node just after:\n{state}")
            }
        }
    }
}

impl std::error::Error for DsmError {}

impl From<AgentError> for DsmError {
    fn from(e: AgentError) -> Self {
        DsmError::Shell(e)
    }
}

impl From<AnswerError> for DsmError {
    fn from(e: AnswerError) -> Self {
        DsmError::Answer(e)
    }
}

impl From<DsmError> for String {
    fn from(e: DsmError) -> String {
        e.to_string()
    }
}

const T: Duration = Duration::from_secs(120);

/// The shell command that runs `app` with `args` and `threads` workers per node.
pub fn app_command(app: &str, args: &[String], threads: u32) -> String {
    let mut cmd = format!("DSM_THREADS={threads} {app}");
    for a in args {
        cmd.push(' ');
        cmd.push_str(a);
    }
    cmd
}

/// Opens the DSM on `dev` in every guest (node ids 1..=n in agent order) and connects
/// every pair.
pub fn connect_mesh(agents: &mut [Agent], dev: &str) -> Result<(), DsmError> {
    let n = agents.len();
    let mut addrs: Vec<HashMap<String, String>> = Vec::new();
    for (i, a) in agents.iter_mut().enumerate() {
        let out = a.run(&format!("dsmctl open {dev} {} {n}", i + 1), T)?;
        let line = out
            .lines()
            .find(|l| l.starts_with("node="))
            .ok_or_else(|| AnswerError::NoLine {
                node: a.name.clone(),
                what: format!("dsmctl open {dev}"),
                output: out.clone(),
            })?;
        addrs.push(fields(line));
    }
    for (i, a) in agents.iter_mut().enumerate() {
        for (j, peer) in addrs.iter().enumerate() {
            if i == j {
                continue;
            }
            // The peer's QP for us is the (i+1)-th of its list.
            let qpn = peer
                .get("qpns")
                .and_then(|q| q.split(',').nth(i))
                .ok_or_else(|| AnswerError::MissingField {
                    key: format!("qpns (entry {})", i + 1),
                    line: format!("node{}'s address {peer:?}", j + 1),
                })?;
            a.run(
                &format!(
                    "dsmctl connect {} lid={} qpn={qpn} psn={} rkey={} gid={}",
                    j + 1,
                    peer["lid"],
                    peer["psn"],
                    peer["rkey"],
                    peer["gid"]
                ),
                T,
            )?;
        }
    }
    Ok(())
}

/// One node's `DSM-RESULT` line (libdsm's `dsm_report`).
#[derive(Debug, Clone)]
pub struct AppResult {
    pub node: u32,
    /// `Some(true)`: this node checked the result against a sequential run and it matched.
    pub verified: Option<bool>,
    pub time_ms: f64,
    pub read_faults: u64,
    pub write_faults: u64,
    pub msgs: u64,
    pub msg_bytes: u64,
    pub data_bytes: u64,
    /// Mean fault service time seen by the kernel (request to grant), in microseconds.
    pub read_fault_us: f64,
    pub write_fault_us: f64,
    /// Messages handled in the completion handler / in process context.
    pub irq: u64,
    pub process: u64,
    /// The same computation run sequentially in private memory (node 1, where the app has one).
    pub seq_ms: Option<f64>,
    pub line: String,
}

impl AppResult {
    pub fn parse(line: &str) -> Result<AppResult, AnswerError> {
        let f = fields(line);
        let u = |k: &str| num(line, k);
        let x = |k: &str| float(line, k);
        Ok(AppResult {
            node: u("node")? as u32,
            verified: match f.get("verified").map(String::as_str) {
                Some("ok") => Some(true),
                Some("FAILED") => Some(false),
                _ => None,
            },
            time_ms: x("time_ms")?,
            read_faults: u("rfaults")?,
            write_faults: u("wfaults")?,
            msgs: u("msgs")?,
            msg_bytes: u("msg_bytes")?,
            data_bytes: u("data_bytes")?,
            read_fault_us: x("rfault_us")?,
            write_fault_us: x("wfault_us")?,
            irq: u("irq")?,
            process: u("process")?,
            seq_ms: f.get("seq_ms").and_then(|v| v.parse().ok()),
            line: line.to_string(),
        })
    }
}

/// Runs `cmd` in every guest at once (a DSM application's processes must run together);
/// each guest's exit status and output, in agent order.
pub fn run_everywhere(
    agents: &mut [Agent],
    cmd: &str,
    timeout: Duration,
) -> Vec<Result<(i32, String), AgentError>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = agents
            .iter_mut()
            .map(|a| s.spawn(move || a.status(cmd, timeout)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Runs a DSM application on every node and collects each node's result line. Fails when
/// a node prints no result, or exits non-zero for any reason but its own failed check (a
/// result `verified=FAILED`, which the caller sees in the results).
pub fn run_app(
    agents: &mut [Agent],
    cmd: &str,
    timeout: Duration,
) -> Result<Vec<AppResult>, DsmError> {
    collect_results(agents, cmd, timeout).map_err(|cause| DsmError::Failed {
        cause: Box::new(cause),
        state: dsm_state(agents),
    })
}

/// Every node's `dsmctl state` and the DSM's last kernel log lines (a wait that ran out
/// logs its state there too); a node that cannot answer says why. All nodes are asked at
/// once, each given `STATE_TIMEOUT`: a node killed under the application answers nothing,
/// and its report must not hold up the others' or the failure's.
pub fn dsm_state(agents: &mut [Agent]) -> String {
    let cmd = "dsmctl state; dmesg | grep 'dsm:' | tail -n 20";
    let texts = run_everywhere(agents, cmd, STATE_TIMEOUT);
    agents
        .iter()
        .zip(texts)
        .map(|(a, r)| {
            let text = r.map_or_else(|e| format!("(no answer: {e})"), |(_, out)| out);
            format!("== {} ==\n{}\n", a.name, text.trim_end())
        })
        .collect()
}

/// How long a node has to report its DSM state after a failure.
const STATE_TIMEOUT: Duration = Duration::from_secs(10);

fn collect_results(
    agents: &mut [Agent],
    cmd: &str,
    timeout: Duration,
) -> Result<Vec<AppResult>, DsmError> {
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let mut out = Vec::new();
    for (name, r) in names.iter().zip(run_everywhere(agents, cmd, timeout)) {
        let (rc, text) = r?;
        let line = text
            .lines()
            .find(|l| l.starts_with("DSM-RESULT "))
            .ok_or_else(|| AnswerError::NoLine {
                node: name.clone(),
                what: format!("`{cmd}` (exit {rc})"),
                output: text.clone(),
            })?;
        let res = AppResult::parse(line)?;
        if rc != 0 && res.verified != Some(false) {
            return Err(DsmError::Exited {
                node: name.clone(),
                cmd: cmd.to_string(),
                status: rc,
                output: text,
            });
        }
        out.push(res);
    }
    Ok(out)
}

/// Whether one node's `dsmctl state` shows a protocol at rest: every connection in RTS,
/// nothing deferred, held or queued, no lock held or wanted, no transaction open at this
/// manager and no request of ours unanswered.
pub fn at_rest(state: &str) -> bool {
    let words: Vec<&str> = state.split_whitespace().collect();
    let qps: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| w.contains(":qp="))
        .collect();
    !qps.is_empty()
        && qps.iter().all(|w| w.contains(":qp=RTS,"))
        && [
            "deferred=0",
            "reads=0",
            "selfq=empty",
            "held=0",
            "waiting=0",
            "dead=0",
        ]
        .iter()
        .all(|k| words.contains(k))
        && words.contains(&"locks_wanted=")
        && !words.iter().any(|w| w.contains(":holder="))
        && state.contains("open=0 requested=0")
}

/// Waits (up to `timeout`) until every node's protocol is at rest after an application:
/// its last confirmations may still be landing when the processes exit. Err names the
/// first node that stays busy, with its state.
pub fn settle(agents: &mut [Agent], timeout: Duration) -> Result<(), String> {
    let end = std::time::Instant::now() + timeout;
    for a in agents.iter_mut() {
        loop {
            let state = a
                .run("dsmctl state", T)
                .map_err(|e| format!("{}: {e}", a.name))?;
            if at_rest(&state) {
                break;
            }
            if std::time::Instant::now() >= end {
                return Err(format!("{}: the DSM is not at rest:\n{state}", a.name));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Sets the protocol's knobs on every guest (`dsmctl config handler=... readfault=...`).
pub fn configure(agents: &mut [Agent], config: &str) -> Result<(), DsmError> {
    for a in agents.iter_mut() {
        a.run(&format!("dsmctl config {config}"), T)?;
    }
    Ok(())
}

/// Closes the DSM session on every guest (so the next application starts from fresh memory).
pub fn close_all(agents: &mut [Agent]) -> Result<(), DsmError> {
    for a in agents.iter_mut() {
        a.run("dsmctl close", T)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::at_rest;

    const REST: &str = "deferred=0 reads=0 send_busy=0 node2:qp=RTS,free=56,wrs=10 \
        node3:qp=RTS,free=64,wrs=0\n\
        selfq=empty held=0 fenced=0 waiting=0 dead=0 bar_gen=8 bar_done=8 bar_count=0,0 \
        locks_wanted=\n\
        open=0 requested=0\n";

    #[test]
    fn test_a_quiet_session_is_at_rest() {
        assert!(at_rest(REST));
    }

    #[test]
    fn test_anything_queued_held_or_open_is_not_at_rest() {
        for (from, to) in [
            ("deferred=0", "deferred=2 (head: type 20 from node 2)"),
            ("node3:qp=RTS", "node3:qp=ERR"),
            ("reads=0", "reads=1"),
            ("selfq=empty", "selfq=queued"),
            ("held=0", "held=3"),
            ("waiting=0", "waiting=1"),
            ("dead=0", "dead=1"),
            ("locks_wanted=", "locks_wanted=5"),
            ("locks_wanted=", "locks_wanted= lock5:holder=2,queued=0"),
            (
                "open=0 requested=0",
                "page4:open,from=2,owner=1,acks_left=0 open=1 requested=0",
            ),
            (
                "open=0 requested=0",
                "page9:requested,prot=0,grants=3 open=0 requested=1",
            ),
        ] {
            let state = REST.replacen(from, to, 1);
            assert!(!at_rest(&state), "{state}");
        }
        // No connection at all is not a session at rest either.
        assert!(!at_rest("connections closed\nselfq=empty"));
    }
}
