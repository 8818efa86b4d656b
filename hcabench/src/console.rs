//! `hcabench console NODE`: attaches the terminal to a guest's serial console.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use vmm_sys_util::terminal::Terminal;

/// Ctrl-] ends the session, as in telnet.
const ESCAPE: u8 = 0x1d;

/// Why the terminal could not be attached to a guest's console.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("cannot attach to {node}'s console at {}: {source}", .socket.display())]
    Connect {
        node: String,
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("{node}'s console: {source}")]
    Stream {
        node: String,
        source: std::io::Error,
    },
}

pub fn attach(socket: &Path, name: &str) -> Result<(), ConsoleError> {
    let stream = UnixStream::connect(socket).map_err(|source| ConsoleError::Connect {
        node: name.to_string(),
        socket: socket.to_path_buf(),
        source,
    })?;
    let stdin = std::io::stdin();
    let lock = stdin.lock();
    let raw = std::io::IsTerminal::is_terminal(&std::io::stdin()) && lock.set_raw_mode().is_ok();
    eprintln!("attached to {name}'s console; Ctrl-] detaches\r");
    let mut from_guest = stream.try_clone().map_err(|source| ConsoleError::Stream {
        node: name.to_string(),
        source,
    })?;
    let out = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdout = std::io::stdout();
        while let Ok(n) = from_guest.read(&mut buf) {
            if n == 0
                || stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
            {
                break;
            }
        }
    });
    let mut to_guest = stream;
    let mut input = lock;
    let mut buf = [0u8; 256];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(at) = buf[..n].iter().position(|&b| b == ESCAPE) {
            let _ = to_guest.write_all(&buf[..at]);
            break;
        }
        if to_guest.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if raw {
        let _ = input.set_canon_mode();
    }
    let _ = to_guest.shutdown(std::net::Shutdown::Both);
    let _ = out.join();
    eprintln!("\ndetached from {name}");
    Ok(())
}
