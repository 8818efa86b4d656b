//! Memory the server creates and shares with a guest's QEMU: memfds whose size is sealed.
//!
//! The server maps them; if anyone holding the fd (a guest's QEMU, or whoever it hands it to)
//! could shrink one, the server's next access past the new end would be SIGBUS for every
//! guest it serves. A sealed size cannot change, so a mapping made once stays valid.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

/// A new memfd named `name` (seen in /proc/PID/maps as `memfd:NAME`), close-on-exec and
/// sealable, of size 0.
pub(crate) fn create(name: &str) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: memfd_create reads a NUL-terminated name we own and returns a new fd or -1.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Seals a memfd's size (F_SEAL_SHRINK, F_SEAL_GROW) and its seals.
pub(crate) fn seal_size(f: &File) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS on an fd we own takes an int argument and touches no memory.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Guest RAM for a QEMU guest: a memfd of `size` bytes, its size sealed. QEMU maps it
/// through `/proc/self/fd/N` (see [`crate::RamBacking`]).
pub fn guest_ram(name: &str, size: u64) -> io::Result<File> {
    let f = create(&format!("hcabench-ram-{name}"))?;
    f.set_len(size)?;
    seal_size(&f)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_guest_ram_cannot_be_resized_by_anyone_holding_it() {
        let f = guest_ram("t", 1 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        // What a QEMU (or a process it handed the fd to) would try.
        let again = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
            .unwrap();
        for len in [0, 4096, 2 << 20] {
            let e = again.set_len(len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "set_len({len})");
        }
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    }
}
