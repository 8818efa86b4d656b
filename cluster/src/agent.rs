//! A command channel into a guest's shell over a unix socket that is one of its serial
//! ports: the console of a guest booted with `hcabench.cmd=agent`, or the second serial
//! port (ttyS1) that the shell job of `hcabench up` keeps for `hcabench exec` and `cp`.
//! The guest runs a non-interactive shell there with echo off; each command is followed by
//! a marker line carrying its exit status, so output and status come back without
//! guessing where one command ends.
//!
//! The guest is not trusted: what it sends is scanned in bounded pieces and may be any
//! bytes. A marker names this connection (a random session) and the command's number, so
//! the output of an earlier connection's command cannot end one of this connection's.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::console_protocol;

/// A status word after a marker longer than this is garbage, not a status.
const MAX_STATUS: usize = 64;

/// The line that ends every here-document a script sends (`<<': HCABENCH-EOF'`; file data
/// in base64, which has no `:` or space). [`Agent::connect`] sends it first, so that a
/// shell left inside a here-document by a copy that died half-way comes out of it; to a
/// shell that is not in one it is `:`, which does nothing.
pub const HEREDOC_END: &str = ": HCABENCH-EOF";

/// Blank lines that push a script through the guest's 16550: see [`Agent::exchange`].
const NUDGE: &[u8] = &[b'\n'; 16];
/// A nudge follows this long a silence while the script may still be on its way in; after
/// that each waits twice as long as the last, up to [`NUDGE_MAX`] (a long command's shell
/// gets a few blank lines, not a flood).
const NUDGE_FIRST: Duration = Duration::from_millis(10);
const NUDGE_MAX: Duration = Duration::from_secs(1);
/// How fast a guest's port takes a script at the slowest (QEMU TCG: about 130 KB/s
/// nudged, 40 KB/s with stalls).
const SLOWEST_BYTES_PER_MS: u64 = 40;

/// Why a command in a guest's shell did not give an answer, or failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The socket would not connect (the guest's host gone, or never there).
    #[error("{node}: shell socket {}: {source}", .socket.display())]
    Connect {
        node: String,
        socket: std::path::PathBuf,
        source: io::Error,
    },
    /// Reading or writing the channel failed.
    #[error("{node}: shell socket: {source}")]
    Io { node: String, source: io::Error },
    /// The channel closed: the guest stopped.
    #[error("{node}: the shell's serial port closed (guest gone?)")]
    Closed { node: String },
    /// No end-of-command marker in time: the guest hangs, or the command runs on.
    #[error("{node}: `{cmd}` gave no answer within {timeout:?}; output so far:\n{output}")]
    Timeout {
        node: String,
        cmd: String,
        timeout: Duration,
        output: String,
    },
    /// The command ran and exited non-zero.
    #[error("{node}: `{cmd}` failed (exit {status}): {}", .output.trim())]
    Failed {
        node: String,
        cmd: String,
        status: i32,
        output: String,
    },
    /// What came back after a marker was not a status line.
    #[error("{node}: garbled answer from the guest's shell: {what}")]
    Garbled { node: String, what: String },
    /// The caller's sink refused the command's output (a closed pipe, a full disk).
    #[error("{node}: the command's output could not be passed on: {source}")]
    Output { node: String, source: io::Error },
}

impl AgentError {
    /// The node whose shell it was.
    pub fn node(&self) -> &str {
        match self {
            AgentError::Connect { node, .. }
            | AgentError::Io { node, .. }
            | AgentError::Closed { node }
            | AgentError::Timeout { node, .. }
            | AgentError::Failed { node, .. }
            | AgentError::Garbled { node, .. }
            | AgentError::Output { node, .. } => node,
        }
    }
}

/// How long to wait for a command's marker.
#[derive(Clone, Copy, Debug)]
pub enum Patience {
    /// At most this long in all.
    Total(Duration),
    /// As long as output keeps coming, with no gap longer than this (a transfer).
    Idle(Duration),
}

impl Patience {
    fn duration(self) -> Duration {
        match self {
            Patience::Total(d) | Patience::Idle(d) => d,
        }
    }
}

/// One guest's shell.
pub struct Agent {
    pub name: String,
    stream: UnixStream,
    /// Bytes read but not yet handed on: at most a marker's length plus one read, as output
    /// is passed on as soon as it cannot be the start of a marker.
    pending: Vec<u8>,
    /// Names this connection in its markers.
    session: u64,
    seq: u64,
}

impl Agent {
    /// Connects to the shell's socket (QEMU creates it at start-up) and checks the shell
    /// answers. Call after the guest printed [`console_protocol::AGENT`] (the agent job) or
    /// [`console_protocol::READY`] (the shell job's ttyS1 channel).
    pub fn connect(name: &str, socket: &Path, timeout: Duration) -> Result<Agent, AgentError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(source) if Instant::now() > deadline => {
                    return Err(AgentError::Connect {
                        node: name.to_string(),
                        socket: socket.to_path_buf(),
                        source,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let io = |source| AgentError::Io {
            node: name.to_string(),
            source,
        };
        stream
            .set_read_timeout(Some(Duration::from_millis(5)))
            .map_err(io)?;
        // A guest that stops reading its port must not hold a writer for ever.
        stream
            .set_write_timeout(Some(Duration::from_secs(60)))
            .map_err(io)?;
        let mut a = Agent {
            name: name.to_string(),
            stream,
            pending: Vec::new(),
            session: session_id(),
            seq: 0,
        };
        // The shell may be inside a here-document an earlier connection left open, or
        // still run that connection's command, or not read the port yet: end the
        // here-document, then ask until it answers. What came before the answer is dropped.
        a.stream
            .write_all(format!("\n{HEREDOC_END}\n").as_bytes())
            .map_err(|source| AgentError::Io {
                node: name.to_string(),
                source,
            })?;
        loop {
            match a.status("true", Duration::from_secs(2)) {
                Ok(_) => return Ok(a),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// Runs `cmd` in the guest's shell; its output (stdout and stderr) if it exits 0.
    pub fn run(&mut self, cmd: &str, timeout: Duration) -> Result<String, AgentError> {
        match self.status(cmd, timeout)? {
            (0, out) => Ok(out),
            (status, output) => Err(AgentError::Failed {
                node: self.name.clone(),
                cmd: cmd.to_string(),
                status,
                output,
            }),
        }
    }

    /// Runs `cmd`; its exit status and output, whatever the status.
    pub fn status(&mut self, cmd: &str, timeout: Duration) -> Result<(i32, String), AgentError> {
        let mut out = Vec::new();
        // The command on its own line (it may end in `&`), then the marker. Its stdin is
        // /dev/null: the shell's stdin is the channel, and the next commands must stay
        // there.
        let r = self.exchange(
            cmd,
            |marker| format!("{{ {cmd}\n}} < /dev/null 2>&1\necho \"{marker}$?\"\n"),
            Patience::Total(timeout),
            &mut |b| {
                out.extend_from_slice(b);
                Ok(())
            },
        );
        // The console's line discipline turns each \n into \r\n.
        let text = String::from_utf8_lossy(&out).replace('\r', "");
        match r {
            Ok(word) => Ok((word.parse().unwrap_or(-1), text)),
            Err(AgentError::Timeout {
                node, cmd, timeout, ..
            }) => Err(AgentError::Timeout {
                node,
                cmd,
                timeout,
                output: text,
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends the script `script(marker)` makes, which must end by printing `marker`
    /// followed by a status word and a newline (`echo "${marker}$?"`), and hands everything
    /// the guest sends before the marker to `sink` as it comes. Returns the status word.
    /// `what` names the command in errors.
    pub fn exchange(
        &mut self,
        what: &str,
        script: impl FnOnce(&str) -> String,
        patience: Patience,
        sink: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<String, AgentError> {
        self.seq += 1;
        let marker = format!(
            "{} {:016x}-{} ",
            console_protocol::RC,
            self.session,
            self.seq
        );
        // The blank lines after it push the script through the guest's 16550 receive
        // FIFO: bytes below its trigger level wait for a timeout interrupt that QEMU's TCG
        // guests do not always get, so a short command would sit there until the next.
        // Nor do they always get the interrupts that say the FIFO filled or the transmitter
        // emptied: a transfer stalls until the port's next interrupt. So while the guest is
        // silent, more blank lines follow now and then (empty commands to the shell, after
        // the script), often at first: they raise that interrupt. Without them a 700 KB
        // copy into a TCG guest took 7 to 18 s; with them 6.2 s, every time.
        let text = format!("{}\n", script(&marker));
        let io = |source| AgentError::Io {
            node: self.name.clone(),
            source,
        };
        self.stream.write_all(text.as_bytes()).map_err(io)?;
        self.stream.write_all(NUDGE).map_err(io)?;
        let refused = |source| AgentError::Output {
            node: self.name.clone(),
            source,
        };
        let mut deadline = Instant::now() + patience.duration();
        let mut last = Instant::now();
        let mut nudge_after = NUDGE_FIRST;
        // While the script may still be on its way in, a stall holds up everything behind
        // it: nudge often until it must have arrived (at the slowest a port takes it).
        let arriving = Instant::now()
            + NUDGE_FIRST * 10
            + Duration::from_millis(text.len() as u64 / SLOWEST_BYTES_PER_MS);
        loop {
            match scan(&mut self.pending, marker.as_bytes()) {
                Scan::Done { output, status } => {
                    sink(&output).map_err(refused)?;
                    return match std::str::from_utf8(&status) {
                        Ok(s) => Ok(s.trim().to_string()),
                        Err(_) => Err(AgentError::Garbled {
                            node: self.name.clone(),
                            what: format!("status {:?}", String::from_utf8_lossy(&status)),
                        }),
                    };
                }
                Scan::Output(b) => {
                    if !b.is_empty() {
                        sink(&b).map_err(refused)?;
                    }
                }
                Scan::Garbled => {
                    return Err(AgentError::Garbled {
                        node: self.name.clone(),
                        what: format!("no end of line within {MAX_STATUS} bytes of a marker"),
                    })
                }
            }
            if last.elapsed() > nudge_after {
                self.stream.write_all(NUDGE).map_err(io)?;
                last = Instant::now();
                nudge_after = if Instant::now() > arriving {
                    (nudge_after * 2).min(NUDGE_MAX)
                } else {
                    NUDGE_FIRST
                };
            }
            if Instant::now() > deadline {
                return Err(AgentError::Timeout {
                    node: self.name.clone(),
                    cmd: what.to_string(),
                    timeout: patience.duration(),
                    output: String::new(),
                });
            }
            let mut buf = [0u8; 16384];
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(AgentError::Closed {
                        node: self.name.clone(),
                    })
                }
                Ok(n) => {
                    self.pending
                        .extend_from_slice(buf.get(..n).unwrap_or_default());
                    if let Patience::Idle(d) = patience {
                        deadline = Instant::now() + d;
                    }
                    last = Instant::now();
                    nudge_after = NUDGE_FIRST;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(source) => {
                    return Err(AgentError::Io {
                        node: self.name.clone(),
                        source,
                    })
                }
            }
        }
    }
}

/// What [`scan`] found in the bytes read so far.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// The marker and its status line: the output before it, and the status word.
    Done { output: Vec<u8>, status: Vec<u8> },
    /// No marker yet: output that cannot be the start of one (possibly empty).
    Output(Vec<u8>),
    /// A marker with no line end after it within [`MAX_STATUS`] bytes.
    Garbled,
}

/// Takes from `pending` what is known: everything up to a complete marker line, or else
/// all but a tail that may be the start of the marker. What follows a marker line stays.
fn scan(pending: &mut Vec<u8>, marker: &[u8]) -> Scan {
    if let Some(at) = find(pending, marker) {
        let after = at + marker.len();
        let rest = pending.get(after..).unwrap_or_default();
        return match rest.iter().position(|&b| b == b'\n') {
            Some(nl) if nl <= MAX_STATUS => {
                let status = rest.get(..nl).unwrap_or_default().to_vec();
                let output = pending.get(..at).unwrap_or_default().to_vec();
                pending.drain(..after + nl + 1);
                Scan::Done { output, status }
            }
            Some(_) => Scan::Garbled,
            None if rest.len() > MAX_STATUS => Scan::Garbled,
            None => {
                // Pass on what comes before the marker; wait for the rest of its line.
                Scan::Output(pending.drain(..at).collect())
            }
        };
    }
    // The longest tail of `pending` that the marker starts with stays for the next read.
    let keep = (1..marker.len().min(pending.len() + 1))
        .rev()
        .find(|&k| pending.ends_with(marker.get(..k).unwrap_or_default()))
        .unwrap_or(0);
    let cut = pending.len() - keep;
    Scan::Output(pending.drain(..cut).collect())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A random number for this connection's markers (the kernel's; the clock and pid where
/// it cannot be read).
fn session_id() -> u64 {
    let mut b = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ u64::from(std::process::id()).rotate_left(32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &[u8] = b"HCABENCH-RC 00ff-1 ";

    #[test]
    fn test_output_and_status_are_split_at_the_marker_line() {
        let mut p = b"hello\nworldHCABENCH-RC 00ff-1 3\nnext".to_vec();
        assert_eq!(
            scan(&mut p, M),
            Scan::Done {
                output: b"hello\nworld".to_vec(),
                status: b"3".to_vec()
            }
        );
        assert_eq!(p, b"next", "what follows the marker line stays");
    }

    #[test]
    fn test_a_tail_that_may_start_the_marker_is_held_back_and_the_rest_passed_on() {
        let mut p = b"abc\nHCABENCH-R".to_vec();
        assert_eq!(scan(&mut p, M), Scan::Output(b"abc\n".to_vec()));
        assert_eq!(p, b"HCABENCH-R");
        p.extend_from_slice(b"C 00ff-1 0");
        // The marker without its line end: nothing more to pass on yet.
        assert_eq!(scan(&mut p, M), Scan::Output(Vec::new()));
        p.push(b'\n');
        assert_eq!(
            scan(&mut p, M),
            Scan::Done {
                output: Vec::new(),
                status: b"0".to_vec()
            }
        );
        let mut p = b"HCABENCH-X".to_vec();
        assert_eq!(scan(&mut p, M), Scan::Output(b"HCABENCH-X".to_vec()));
    }

    #[test]
    fn test_another_connections_marker_is_output() {
        let mut p = b"HCABENCH-RC 0001-1 0\nHCABENCH-RC 00ff-1 7\n".to_vec();
        assert_eq!(
            scan(&mut p, M),
            Scan::Done {
                output: b"HCABENCH-RC 0001-1 0\n".to_vec(),
                status: b"7".to_vec()
            }
        );
    }

    #[test]
    fn test_a_marker_without_a_line_end_is_garbage_not_a_wait_for_ever() {
        let mut p = b"HCABENCH-RC 00ff-1 ".to_vec();
        p.extend([b'x'; MAX_STATUS + 1]);
        assert_eq!(scan(&mut p, M), Scan::Garbled);
        let mut p = b"HCABENCH-RC 00ff-1 ".to_vec();
        p.extend([b'y'; MAX_STATUS + 1]);
        p.push(b'\n');
        assert_eq!(scan(&mut p, M), Scan::Garbled);
    }

    #[test]
    fn test_any_bytes_scan_without_panic_and_stay_bounded() {
        // A cheap generator: every byte value, markers cut at every point.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            let mut p = Vec::new();
            for _ in 0..64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let b = seed as u8;
                if b % 7 == 0 {
                    p.extend_from_slice(&M[..usize::from(b) % M.len()]);
                } else {
                    p.push(b);
                }
            }
            // Whole marker lines come off one by one; then what stays is at most a
            // marker and its status line's start (garbage ends the exchange).
            let mut last = scan(&mut p, M);
            while let Scan::Done { .. } = last {
                last = scan(&mut p, M);
            }
            if let Scan::Output(_) = last {
                assert!(p.len() <= M.len() + MAX_STATUS, "{}", p.len());
            }
        }
    }
}
