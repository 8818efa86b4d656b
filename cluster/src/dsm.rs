//! Driving the guests' DSM module (`guest-kmod/dsm`) through their shells: opening it on an
//! ib_device and connecting the full mesh of RC QPs (the harness hands every node every
//! other node's address).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use crate::agent::{Agent, AgentError};
use crate::verbs::{fields, float, num, AnswerError};

/// Why driving the DSM in the guests failed.
#[derive(Debug, thiserror::Error)]
pub enum DsmError {
    #[error(transparent)]
    Shell(#[from] AgentError),
    #[error(transparent)]
    Answer(#[from] AnswerError),
    /// An application exited non-zero for another reason than its own failed check.
    #[error("{node}: `{cmd}` exited {status}:\n{output}")]
    Exited {
        node: String,
        cmd: String,
        status: i32,
        output: String,
    },
    /// An application failed; `state` is what every node's DSM waited on and held just
    /// after (`dsmctl state` and the module's kernel log lines), to tell a lost message
    /// from a stuck queue or a dead QP; `stalled`, the links on which messages were posted
    /// and never received (see [`stalled_links`]).
    #[error(
        "{cause}\nthe DSM on every node just after:\n{state}{}",
        stalled_note(.stalled)
    )]
    Failed {
        #[source]
        cause: Box<DsmError>,
        state: String,
        stalled: Vec<Undelivered>,
    },
}

/// The links on which the transport stopped delivering, when there are any.
fn stalled_note(stalled: &[Undelivered]) -> String {
    if stalled.is_empty() {
        return String::new();
    }
    let links: Vec<String> = stalled.iter().map(ToString::to_string).collect();
    format!(
        "\nthe transport stopped delivering, with both ends' QPs in RTS: {}",
        links.join("; ")
    )
}

/// Why the DSM did not come to rest after an application.
#[derive(Debug, thiserror::Error)]
pub enum SettleError {
    #[error(transparent)]
    Shell(#[from] AgentError),
    /// `busy`: the nodes whose DSM is not at rest; `lost`: the links with messages posted
    /// and not received; `states`: every node's state.
    #[error("{}:\n{states}", unsettled(.busy, .lost))]
    Unsettled {
        busy: Vec<String>,
        lost: Vec<Undelivered>,
        states: String,
    },
}

/// What stays busy: the nodes not at rest, then the links with messages in flight.
fn unsettled(busy: &[String], lost: &[Undelivered]) -> String {
    let mut why = String::new();
    if !busy.is_empty() {
        why += &format!("the DSM is not at rest on {}", busy.join(", "));
    }
    for u in lost {
        why += &format!("{}{u}", if why.is_empty() { "" } else { "; " });
    }
    why
}

impl DsmError {
    /// The links on which a failed application's messages were posted and never received
    /// (empty for any other failure).
    pub fn stalled(&self) -> &[Undelivered] {
        match self {
            DsmError::Failed { stalled, .. } => stalled,
            _ => &[],
        }
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
        // (A node that cannot answer, killed say, leaves nothing to compare.)
        stalled: stalled_links(agents, STALL_WAIT).unwrap_or_default(),
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

/// How long messages posted and not received must stay so after a failure to count as
/// never delivered (the application is gone: nothing more is sent meanwhile).
const STALL_WAIT: Duration = Duration::from_secs(2);

fn collect_results(
    agents: &mut [Agent],
    cmd: &str,
    timeout: Duration,
) -> Result<Vec<AppResult>, DsmError> {
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let mut out = Vec::new();
    for (name, r) in names.iter().zip(run_everywhere(agents, cmd, timeout)) {
        let (rc, text) = r?;
        out.push(result_of(name, cmd, rc, text)?);
    }
    Ok(out)
}

/// One node's result from its run's exit status and output: an error when it printed no
/// result line, or exited non-zero for another reason than its own failed check.
pub fn result_of(node: &str, cmd: &str, rc: i32, text: String) -> Result<AppResult, DsmError> {
    let line = text
        .lines()
        .find(|l| l.starts_with("DSM-RESULT "))
        .ok_or_else(|| AnswerError::NoLine {
            node: node.to_string(),
            what: format!("`{cmd}` (exit {rc})"),
            output: text.clone(),
        })?;
    let res = AppResult::parse(line)?;
    if rc != 0 && res.verified != Some(false) {
        return Err(DsmError::Exited {
            node: node.to_string(),
            cmd: cmd.to_string(),
            status: rc,
            output: text,
        });
    }
    Ok(res)
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

/// A link on which messages were posted and not (yet) received: node `from` (1-based, the
/// agents' order) posted `posted` messages to node `to`, which has received `received`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Undelivered {
    pub from: usize,
    pub to: usize,
    pub posted: u64,
    pub received: u64,
}

impl fmt::Display for Undelivered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "node{} posted {} messages to node{}, which received {}",
            self.from, self.posted, self.to, self.received
        )
    }
}

/// One node's message counts per peer from its `dsmctl state`: `nodeJ:...,out=N,in=M`
/// means this node posted N messages to node J and received M from it (counted since the
/// connections were made).
fn message_counts(state: &str) -> HashMap<usize, (u64, u64)> {
    let mut counts = HashMap::new();
    for w in state.split_whitespace() {
        let Some((peer, rest)) = w.split_once(":qp=") else {
            continue;
        };
        let Some(peer) = peer.strip_prefix("node").and_then(|p| p.parse().ok()) else {
            continue;
        };
        let field = |k: &str| {
            rest.split(',')
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse::<u64>().ok())
        };
        if let (Some(out), Some(inn)) = (field("out="), field("in=")) {
            counts.insert(peer, (out, inn));
        }
    }
    counts
}

/// Every link on which a node posted more messages than its peer received, from one
/// snapshot of every node's `dsmctl state` (node i's at index i - 1). A message in flight
/// shows here for a moment; one lost, or kept in a send queue, stays.
pub fn undelivered(states: &[String]) -> Vec<Undelivered> {
    let counts: Vec<_> = states.iter().map(|s| message_counts(s)).collect();
    let mut out = Vec::new();
    for (i, mine) in counts.iter().enumerate() {
        for (&peer, &(posted, _)) in mine {
            let received = counts
                .get(peer.wrapping_sub(1))
                .and_then(|theirs| theirs.get(&(i + 1)))
                .map_or(0, |&(_, inn)| inn);
            if posted > received {
                out.push(Undelivered {
                    from: i + 1,
                    to: peer,
                    posted,
                    received,
                });
            }
        }
    }
    out.sort_by_key(|u| (u.from, u.to));
    out
}

/// Every node's `dsmctl state`, asked of all at once.
fn states(agents: &mut [Agent]) -> Result<Vec<String>, AgentError> {
    run_everywhere(agents, "dsmctl state", STATE_TIMEOUT)
        .into_iter()
        .map(|r| r.map(|(_, out)| out))
        .collect()
}

/// Waits (up to `timeout`) until every node's protocol is at rest after an application
/// (its last confirmations may still be landing when the processes exit) and every
/// message posted has been received. Err names what stays busy, with every node's state.
pub fn settle(agents: &mut [Agent], timeout: Duration) -> Result<(), SettleError> {
    let end = std::time::Instant::now() + timeout;
    loop {
        let states = states(agents)?;
        let busy: Vec<String> = (agents.iter().zip(&states))
            .filter(|(_, s)| !at_rest(s))
            .map(|(a, _)| a.name.clone())
            .collect();
        let lost = undelivered(&states);
        if busy.is_empty() && lost.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= end {
            let states: String = (agents.iter().zip(&states))
                .map(|(a, s)| format!("== {} ==\n{}\n", a.name, s.trim_end()))
                .collect();
            return Err(SettleError::Unsettled { busy, lost, states });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After a failed application: the links on which messages were posted and never
/// received, and stay so for `wait` with nothing more arriving (the application is gone,
/// so nothing else is sent). This is a transport that stopped delivering on a connection
/// it still reports in RTS, outside the DSM, which counts a message as posted only when
/// `ib_post_send` took it and as received when its completion was polled. Empty when
/// every message arrived, or the counts moved meanwhile.
pub fn stalled_links(agents: &mut [Agent], wait: Duration) -> Result<Vec<Undelivered>, AgentError> {
    let before = states(agents)?;
    std::thread::sleep(wait);
    let after = states(agents)?;
    let all_rts = after.iter().all(|s| {
        let qps: Vec<&str> = s
            .split_whitespace()
            .filter(|w| w.contains(":qp="))
            .collect();
        !qps.is_empty() && qps.iter().all(|w| w.contains(":qp=RTS,"))
    });
    let then = undelivered(&before);
    Ok(undelivered(&after)
        .into_iter()
        .filter(|u| all_rts && then.contains(u))
        .collect())
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
    use super::{at_rest, undelivered, Undelivered};

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

    #[test]
    fn test_messages_posted_and_not_received_are_named_per_link() {
        let node = |peers: &str| format!("deferred=0 reads=0 send_busy=0 {peers}\nopen=0");
        let states = [
            node("node2:qp=RTS,free=62,wrs=2,out=23,in=21 node3:qp=RTS,free=64,wrs=0,out=5,in=5"),
            node("node1:qp=RTS,free=56,wrs=12,out=21,in=21 node3:qp=RTS,free=64,wrs=0,out=0,in=0"),
            node("node1:qp=RTS,free=64,wrs=0,out=5,in=5 node2:qp=RTS,free=64,wrs=0,out=0,in=0"),
        ];
        assert_eq!(
            undelivered(&states),
            [Undelivered {
                from: 1,
                to: 2,
                posted: 23,
                received: 21
            }]
        );
        let even = states[0].replace("out=23", "out=21");
        assert!(undelivered(&[even, states[1].clone(), states[2].clone()]).is_empty());
        // A node that cannot report counts as having received nothing.
        let lost = undelivered(&[states[0].clone(), String::new(), states[2].clone()]);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].received, 0);
    }
}
