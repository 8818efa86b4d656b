//! The 16550 serial ports' host side: the log file, an in-memory copy of the first output
//! (for tests and early-boot checks), and an attachable console: a unix socket whose one
//! client at a time sees the output and types into the port's receive FIFO. COM1 is the
//! console; COM2 has only its socket, the shell job's command channel (`hcabench exec`).

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hca_model::sync::Unpoisoned;
use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

/// Output kept in memory beyond this goes only to the log and the client.
const CAPTURE_LIMIT: usize = 1 << 20;

/// The serial port's interrupt line: an irqfd on its IOAPIC pin.
pub struct IrqLine(pub EventFd);

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub type SerialPort = Serial<IrqLine, NoEvents, ConsoleOut>;

/// Where the guest's serial output goes.
/// Why a serial port's log or socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// The console log or a port's socket.
    #[error("{}: {source}", .path.display())]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{thread} thread: {source}")]
    Thread {
        thread: String,
        source: std::io::Error,
    },
}

impl SerialError {
    fn file(path: &Path) -> impl FnOnce(std::io::Error) -> SerialError + '_ {
        move |source| SerialError::File {
            path: path.to_owned(),
            source,
        }
    }
}

pub struct ConsoleOut {
    log: Option<File>,
    captured: Arc<Mutex<Vec<u8>>>,
    /// How much of the output `captured` keeps.
    capture_limit: usize,
    client: Arc<Mutex<Option<UnixStream>>>,
}

impl ConsoleOut {
    pub fn new(log: Option<&Path>) -> Result<ConsoleOut, SerialError> {
        let log = match log {
            Some(p) => Some(File::create(p).map_err(SerialError::file(p))?),
            None => None,
        };
        Ok(ConsoleOut {
            log,
            captured: Arc::new(Mutex::new(Vec::new())),
            capture_limit: CAPTURE_LIMIT,
            client: Arc::new(Mutex::new(None)),
        })
    }

    /// Output for the socket's client alone: no log, nothing kept (COM2's command channel
    /// carries file data, which belongs in no console log).
    pub fn socket_only() -> ConsoleOut {
        ConsoleOut {
            log: None,
            captured: Arc::new(Mutex::new(Vec::new())),
            capture_limit: 0,
            client: Arc::new(Mutex::new(None)),
        }
    }

    pub fn attached(&self) -> bool {
        self.client.lock_unpoisoned().is_some()
    }

    /// The first `CAPTURE_LIMIT` bytes of output, shared.
    pub fn captured(&self) -> Arc<Mutex<Vec<u8>>> {
        self.captured.clone()
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = &mut self.log {
            f.write_all(b)?;
        }
        if self.capture_limit > 0 {
            let mut c = self.captured.lock_unpoisoned();
            let room = self.capture_limit.saturating_sub(c.len());
            c.extend(b.iter().take(room));
        }
        let mut client = self.client.lock_unpoisoned();
        if let Some(s) = client.as_mut() {
            // A client that went away, or blocks a write for longer than its 200 ms write
            // timeout, is dropped: the guest's vCPU never waits on it for longer.
            if s.write_all(b).is_err() {
                *client = None;
            }
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serves the port's socket at `path` until `stop`, on a thread named `thread`: one client
/// at a time (the next waits until it leaves); what the client sends goes into the receive
/// FIFO, paced to the FIFO's room so nothing typed is lost.
pub fn serve(
    path: &Path,
    thread: &str,
    port: Arc<Mutex<SerialPort>>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, SerialError> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(SerialError::file(path))?;
    listener
        .set_nonblocking(true)
        .map_err(SerialError::file(path))?;
    let client = port.lock_unpoisoned().writer().client.clone();
    std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => attach(s, &port, &client, &stop),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => {
                        log::warn!("console socket: {e}");
                        std::thread::sleep(Duration::from_millis(50))
                    }
                }
            }
        })
        .map_err(|source| SerialError::Thread {
            thread: thread.into(),
            source,
        })
}

fn attach(
    s: UnixStream,
    port: &Mutex<SerialPort>,
    client: &Mutex<Option<UnixStream>>,
    stop: &AtomicBool,
) {
    let (Ok(mut input), Ok(())) = (
        s.try_clone(),
        s.set_read_timeout(Some(Duration::from_millis(50))),
    ) else {
        return;
    };
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    *client.lock_unpoisoned() = Some(s);
    let mut buf = [0u8; 256];
    while !stop.load(Ordering::SeqCst) {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        let mut sent = 0;
        while sent < n && !stop.load(Ordering::SeqCst) {
            // An error is a full FIFO: the guest has not read yet.
            let rest = buf.get(sent..n).unwrap_or_default();
            if let Ok(k) = port.lock_unpoisoned().enqueue_raw_bytes(rest) {
                sent += k;
            }
            if sent < n {
                // The guest empties the 64-byte FIFO within microseconds of its interrupt
                // under KVM; a short wait keeps a file copy (`hcabench cp`) from crawling.
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
    *client.lock_unpoisoned() = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16550's line status register and its data-ready bit.
    const LSR: u8 = 5;
    const DATA_READY: u8 = 1;

    fn port() -> Arc<Mutex<SerialPort>> {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        Arc::new(Mutex::new(Serial::new(
            IrqLine(irq),
            ConsoleOut::socket_only(),
        )))
    }

    /// Reads what the guest would from the receive FIFO until `want` bytes came.
    fn guest_reads(port: &Mutex<SerialPort>, want: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got.len() < want {
            assert!(std::time::Instant::now() < deadline, "got {got:?}");
            let mut p = port.lock_unpoisoned();
            if p.read(LSR) & DATA_READY != 0 {
                got.push(p.read(0));
            } else {
                drop(p);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        got
    }

    #[test]
    fn test_a_socket_only_port_carries_both_ways_and_keeps_nothing() {
        let path = std::env::temp_dir().join(format!("vmm-com2-{}.sock", std::process::id()));
        let port = port();
        let stop = Arc::new(AtomicBool::new(false));
        let t = serve(&path, "com2-test", port.clone(), stop.clone()).unwrap();
        let mut client = UnixStream::connect(&path).unwrap();
        while !port.lock_unpoisoned().writer().attached() {
            std::thread::sleep(Duration::from_millis(5));
        }
        // More than the 64-byte FIFO holds: the socket's side paces it, nothing is lost.
        let sent: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        client.write_all(&sent).unwrap();
        assert_eq!(guest_reads(&port, sent.len()), sent);
        for b in b"ok\n" {
            port.lock_unpoisoned().write(0, *b).unwrap();
        }
        let mut back = [0u8; 3];
        client.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ok\n");
        let writer = port.lock_unpoisoned();
        assert!(writer.writer().captured().lock_unpoisoned().is_empty());
        drop(writer);
        stop.store(true, Ordering::SeqCst);
        drop(client);
        t.join().unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
