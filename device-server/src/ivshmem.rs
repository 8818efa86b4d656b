//! The ivshmem server protocol (QEMU's docs/specs/ivshmem-spec.rst), server side, plus the
//! client side that tests and tools use to stand in for QEMU.
//!
//! Every message is one little-endian i64, optionally with one file descriptor (SCM_RIGHTS).
//! On connect the server sends: the protocol version (0); the client's own id; -1 with the
//! shared-memory fd; for each other peer, its id once per vector, each with the eventfd that
//! interrupts that peer on that vector; then the client's own id once per vector, each with
//! the eventfd the client is interrupted through. Later messages announce peers coming
//! (id with fd) and going (id alone). The client never writes.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub const PROTOCOL_VERSION: i64 = 0;

/// Sends one message.
pub fn send(sock: &UnixStream, value: i64, fd: Option<RawFd>) -> io::Result<()> {
    let bytes = value.to_le_bytes();
    let fds: &[RawFd] = match &fd {
        Some(f) => std::slice::from_ref(f),
        None => &[],
    };
    let n = sock
        .send_with_fds(&[&bytes[..]], fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    if n != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short ivshmem message",
        ));
    }
    Ok(())
}

/// Receives one message (client side).
pub fn recv(sock: &UnixStream) -> io::Result<(i64, Option<File>)> {
    let mut b = [0u8; 8];
    let (n, file) = sock
        .recv_with_fd(&mut b)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    if n != b.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("ivshmem message of {n} bytes, expected 8"),
        ));
    }
    Ok((i64::from_le_bytes(b), file))
}

/// What the server hands a new client.
pub struct Greeting<'a> {
    pub client_id: u16,
    pub shm: &'a File,
    /// Other peers: (id, one eventfd per vector that interrupts that peer).
    pub peers: &'a [(u16, Vec<RawFd>)],
    /// The eventfds the client is interrupted through, one per vector.
    pub own: &'a [RawFd],
}

/// Sends the connect-time messages, in the order the spec requires.
pub fn greet(sock: &UnixStream, g: &Greeting<'_>) -> io::Result<()> {
    send(sock, PROTOCOL_VERSION, None)?;
    send(sock, i64::from(g.client_id), None)?;
    send(sock, -1, Some(g.shm.as_raw_fd()))?;
    for (id, fds) in g.peers {
        for fd in fds {
            send(sock, i64::from(*id), Some(*fd))?;
        }
    }
    for fd in g.own {
        send(sock, i64::from(g.client_id), Some(*fd))?;
    }
    Ok(())
}

/// A client's view after the greeting (what QEMU would hold).
pub struct ClientView {
    pub id: u16,
    pub shm: File,
    /// (peer id, eventfds to interrupt it, per vector).
    pub peers: Vec<(u16, Vec<File>)>,
    /// Eventfds this client is interrupted through, per vector.
    pub own: Vec<File>,
}

/// Reads a whole greeting for a device configured with `vectors` vectors (client side).
pub fn read_greeting(sock: &UnixStream, vectors: usize) -> io::Result<ClientView> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let (version, _) = recv(sock)?;
    if version != PROTOCOL_VERSION {
        return Err(bad(format!(
            "ivshmem protocol version {version}, expected 0"
        )));
    }
    let (id, _) = recv(sock)?;
    let id = u16::try_from(id).map_err(|_| bad(format!("client id {id} out of range")))?;
    let (minus_one, shm) = recv(sock)?;
    let shm = match (minus_one, shm) {
        (-1, Some(f)) => f,
        (v, _) => {
            return Err(bad(format!(
                "expected -1 with the shared memory fd, got {v}"
            )))
        }
    };
    let mut peers: Vec<(u16, Vec<File>)> = Vec::new();
    let mut own = Vec::new();
    while own.len() < vectors {
        let (who, fd) = recv(sock)?;
        let fd = fd.ok_or_else(|| bad(format!("peer {who} announced without an eventfd")))?;
        let who = u16::try_from(who).map_err(|_| bad(format!("peer id {who} out of range")))?;
        if who == id {
            own.push(fd);
        } else if let Some(p) = peers.iter_mut().find(|(p, _)| *p == who) {
            p.1.push(fd);
        } else {
            peers.push((who, vec![fd]));
        }
    }
    Ok(ClientView {
        id,
        shm,
        peers,
        own,
    })
}
