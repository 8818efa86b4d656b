//! Directories that hold a cluster's sockets, consoles and logs: only their owner may enter
//! them. Another local user must not read a guest's console, plant a socket or a
//! symbolic link where hcabench will create one, or connect to a control socket.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The credentials of the process at the other end of `stream` (SO_PEERCRED): who may
/// use a socket of a private directory, and which process a QEMU monitor is.
pub fn peer_cred(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writing and len says cred's size; the fd is open.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

/// Creates `dir` (and missing parents) with mode 0700, or checks an existing one: it must
/// be a real directory (not a symbolic link) owned by this user; a group- or world-
/// accessible one of ours is made private.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    if !meta.file_type().is_dir() {
        return refuse(format!(
            "{} is not a directory (a symbolic link or a file is in the way); remove it",
            dir.display()
        ));
    }
    // SAFETY: getuid cannot fail and has no preconditions.
    let uid = unsafe { libc::getuid() };
    if meta.uid() != uid {
        return refuse(format!(
            "{} belongs to user {}, not to you (uid {uid}): pick another with --run-dir",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_private_dir_is_ours_alone_and_a_symlink_is_refused() {
        let base = std::env::temp_dir().join(format!("hcab-private-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let dir = base.join("run");
        create_private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // An existing one of ours that others could enter is closed.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        // A symbolic link planted where the directory goes is refused, not followed.
        let target = base.join("elsewhere");
        fs::create_dir(&target).unwrap();
        let link = base.join("planted");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create_private_dir(&link).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        fs::remove_dir_all(&base).unwrap();
    }
}
