//! A command channel into a guest booted with `hcabench.cmd=agent`, over its serial console
//! socket. The guest's init runs a non-interactive shell on the console with echo off; each
//! command is followed by a marker line carrying its exit status, so output and status come
//! back without guessing where one command ends.

use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::console_protocol;

/// Why a command in a guest's shell did not give an answer, or failed.
#[derive(Debug)]
pub enum AgentError {
    /// The console socket would not connect (the guest's host gone, or never there).
    Connect {
        node: String,
        socket: std::path::PathBuf,
        source: io::Error,
    },
    /// Reading or writing the console failed.
    Io { node: String, source: io::Error },
    /// The console closed: the guest stopped.
    Closed { node: String },
    /// No end-of-command marker in time: the guest hangs, or the command runs on.
    Timeout {
        node: String,
        cmd: String,
        timeout: Duration,
        output: String,
    },
    /// The command ran and exited non-zero.
    Failed {
        node: String,
        cmd: String,
        status: i32,
        output: String,
    },
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentError::Connect {
                node,
                socket,
                source,
            } => write!(f, "{node}: console {}: {source}", socket.display()),
            AgentError::Io { node, source } => write!(f, "{node}: console: {source}"),
            AgentError::Closed { node } => write!(f, "{node}: console closed (guest gone?)"),
            AgentError::Timeout {
                node,
                cmd,
                timeout,
                output,
            } => write!(
                f,
                "{node}: `{cmd}` gave no answer within {timeout:?}; output so far:\n{output}"
            ),
            AgentError::Failed {
                node,
                cmd,
                status,
                output,
            } => write!(
                f,
                "{node}: `{cmd}` failed (exit {status}): {}",
                output.trim()
            ),
        }
    }
}

impl std::error::Error for AgentError {}

impl AgentError {
    /// The node whose shell it was.
    pub fn node(&self) -> &str {
        match self {
            AgentError::Connect { node, .. }
            | AgentError::Io { node, .. }
            | AgentError::Closed { node }
            | AgentError::Timeout { node, .. }
            | AgentError::Failed { node, .. } => node,
        }
    }
}

impl From<AgentError> for String {
    fn from(e: AgentError) -> String {
        e.to_string()
    }
}

/// One guest's shell.
pub struct Agent {
    pub name: String,
    stream: UnixStream,
    pending: Vec<u8>,
    seq: u64,
}

impl Agent {
    /// Connects to the console socket (QEMU creates it at start-up) and checks the shell
    /// answers. Call after the guest printed [`console_protocol::AGENT`].
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
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|source| AgentError::Io {
                node: name.to_string(),
                source,
            })?;
        let mut a = Agent {
            name: name.to_string(),
            stream,
            pending: Vec::new(),
            seq: 0,
        };
        // The shell may not read the console yet: ask until it answers.
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
        self.seq += 1;
        let marker = format!("{} {} ", console_protocol::RC, self.seq);
        // The command on its own line (it may end in `&`), then the marker. Its stdin is
        // /dev/null: the shell's stdin is the console, and the next commands must stay there.
        // The blank lines after it push the command through the guest's 16550 receive FIFO:
        // bytes below its trigger level wait for a timeout interrupt that QEMU's TCG
        // guests do not always get, so a short command would sit there until the next.
        let line = format!(
            "{{ {cmd}\n}} < /dev/null 2>&1\necho \"{marker}$?\"\n{}",
            "\n".repeat(16)
        );
        let io = |source| AgentError::Io {
            node: self.name.clone(),
            source,
        };
        self.stream.write_all(line.as_bytes()).map_err(io)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(done) = self.take_until(&marker) {
                return Ok(done);
            }
            if Instant::now() > deadline {
                return Err(AgentError::Timeout {
                    node: self.name.clone(),
                    cmd: cmd.to_string(),
                    timeout,
                    output: String::from_utf8_lossy(&self.pending).into_owned(),
                });
            }
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(AgentError::Closed {
                        node: self.name.clone(),
                    })
                }
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
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

    /// If the marker line arrived: removes everything up to it and returns (status, output).
    fn take_until(&mut self, marker: &str) -> Option<(i32, String)> {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        let at = text.find(marker)?;
        let end = at + text[at..].find('\n')?;
        let rc = text[at + marker.len()..end].trim().parse().unwrap_or(-1);
        let out = text[..at].replace('\r', "");
        self.pending = text.as_bytes()[end + 1..].to_vec();
        Some((rc, out))
    }
}
