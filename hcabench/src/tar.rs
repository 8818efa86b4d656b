//! The tar archives `hcabench cp` moves between host and guest (the guest's busybox tar
//! makes and unpacks the other end): ustar headers, GNU long names (`L`, `K`) past
//! ustar's limits, regular files, directories, symbolic links and, read only, hard links.
//!
//! Reading is for archives a guest made, so it trusts nothing: every member must lie under
//! the one top-level name asked for, with no `..`; nothing is written through a symbolic
//! link (each parent is checked to be a directory this extraction made or found as one);
//! headers are checksummed; names are bounded; setuid and setgid bits are dropped; device
//! nodes and FIFOs are skipped and named. Extraction goes into a fresh directory of the
//! caller's, so a refused archive leaves nothing elsewhere.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

const BLOCK: usize = 512;
/// The longest name or link target a GNU long-name record may carry here.
const MAX_LONG_NAME: u64 = 4096;
/// The largest size an 11-digit octal field holds.
const MAX_SIZE: u64 = 0o77777777777;

/// What one member of an archive to write is.
#[derive(Debug)]
enum Kind {
    File { source: PathBuf, size: u64 },
    Dir,
    Symlink(Vec<u8>),
}

/// One member of an archive to write, read from the host.
#[derive(Debug)]
pub struct Entry {
    /// Its name in the archive (`top/...`).
    name: Vec<u8>,
    kind: Kind,
    mode: u32,
    mtime: u64,
}

/// What [`plan`] found to copy.
#[derive(Debug, Default)]
pub struct Plan {
    pub entries: Vec<Entry>,
    /// Things that cannot be copied (sockets, FIFOs, devices), left out.
    pub skipped: Vec<PathBuf>,
}

impl Plan {
    /// The archive's size in bytes, as [`write`] makes it.
    pub fn archive_bytes(&self) -> u64 {
        let members: u64 = (self.entries.iter())
            .map(|e| {
                let long = |len: usize| {
                    if len > 100 {
                        BLOCK as u64 + padded(len as u64 + 1)
                    } else {
                        0
                    }
                };
                let name = if split_ustar(&e.name).is_some() {
                    0
                } else {
                    long(e.name.len())
                };
                let (data, link) = match &e.kind {
                    Kind::File { size, .. } => (padded(*size), 0),
                    Kind::Dir => (0, 0),
                    Kind::Symlink(t) => (0, long(t.len())),
                };
                BLOCK as u64 + name + link + data
            })
            .sum();
        members + 2 * BLOCK as u64
    }

    /// Bytes of file content.
    pub fn content_bytes(&self) -> u64 {
        (self.entries.iter())
            .map(|e| match e.kind {
                Kind::File { size, .. } => size,
                _ => 0,
            })
            .sum()
    }
}

/// Why an archive could not be made from host files, or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// A host file or directory could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: not a regular file or directory", .0.display())]
    NotFileOrDir(PathBuf),
    #[error("{}: larger than 8 GiB", .0.display())]
    TooLarge(PathBuf),
    #[error("{}: shrank from {size} to {sent} bytes while being copied", .path.display())]
    Shrank { path: PathBuf, size: u64, sent: u64 },
    /// The archive's reader, or a file being unpacked, refused the bytes.
    #[error("{0}")]
    Write(#[source] io::Error),
    #[error("the archive ended early")]
    EndedEarly,
    #[error("a tar header without a checksum")]
    NoChecksum,
    #[error("a tar header's checksum does not match: the data is corrupt")]
    Checksum,
    #[error("a long name of {0} bytes")]
    LongName(u64),
    #[error("{0}: an absolute path in the archive")]
    Absolute(String),
    #[error("{0}: `..` in the archive")]
    DotDot(String),
    #[error("{name}: not under {top} in the archive")]
    NotUnder { name: String, top: String },
    #[error("{0}: a parent in the archive is no directory")]
    ParentNotDir(String),
    #[error("{}: a directory where the archive has a file", .0.display())]
    DirInTheWay(PathBuf),
    #[error("{name}: a hard link to {target} that is no file of this copy")]
    HardLink { name: String, target: String },
}

impl TarError {
    /// The error for an I/O failure on host path `path`.
    fn at(path: &Path) -> impl Fn(io::Error) -> TarError + '_ {
        move |source| TarError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn padded(n: u64) -> u64 {
    n.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// The members for host path `src` (followed if it is a symbolic link, as `cp` does),
/// named `top` in the archive: a file, or a directory with its whole tree, parents before
/// their contents. Links inside a directory stay links.
pub fn plan(src: &Path, top: &str) -> Result<Plan, TarError> {
    let meta = fs::metadata(src).map_err(TarError::at(src))?;
    let mut p = Plan::default();
    if !(meta.is_file() || meta.is_dir()) {
        return Err(TarError::NotFileOrDir(src.to_path_buf()));
    }
    add(&mut p, src, top.as_bytes().to_vec(), &meta)?;
    Ok(p)
}

fn add(p: &mut Plan, path: &Path, name: Vec<u8>, meta: &fs::Metadata) -> Result<(), TarError> {
    let ft = meta.file_type();
    let mode = meta.mode() & 0o7777;
    let mtime = meta.mtime().max(0) as u64;
    let err = TarError::at(path);
    if ft.is_symlink() {
        let target = fs::read_link(path).map_err(err)?;
        p.entries.push(Entry {
            name,
            kind: Kind::Symlink(target.as_os_str().as_bytes().to_vec()),
            mode,
            mtime,
        });
    } else if ft.is_file() {
        if meta.len() > MAX_SIZE {
            return Err(TarError::TooLarge(path.to_path_buf()));
        }
        p.entries.push(Entry {
            name,
            kind: Kind::File {
                source: path.to_path_buf(),
                size: meta.len(),
            },
            mode,
            mtime,
        });
    } else if ft.is_dir() {
        p.entries.push(Entry {
            name: name.clone(),
            kind: Kind::Dir,
            mode,
            mtime,
        });
        let mut children: Vec<_> = fs::read_dir(path)
            .map_err(&err)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(&err)?;
        children.sort();
        for c in children {
            let child = path.join(&c);
            let m = fs::symlink_metadata(&child).map_err(TarError::at(&child))?;
            let mut n = name.clone();
            n.push(b'/');
            n.extend_from_slice(c.as_bytes());
            add(p, &child, n, &m)?;
        }
    } else {
        p.skipped.push(path.to_path_buf());
    }
    Ok(())
}

/// Writes the archive of `plan` to `out`. A file that shrank since it was planned is an
/// error (what was sent would not be what the header said).
pub fn write(plan: &Plan, out: &mut dyn Write) -> Result<(), TarError> {
    let io = TarError::Write;
    for e in &plan.entries {
        let (flag, size, link): (u8, u64, &[u8]) = match &e.kind {
            Kind::File { size, .. } => (b'0', *size, b""),
            Kind::Dir => (b'5', 0, b""),
            Kind::Symlink(t) => (b'2', 0, t),
        };
        let mut name = e.name.clone();
        if flag == b'5' {
            name.push(b'/');
        }
        let (prefix, short) = match split_ustar(&name) {
            Some((prefix, short)) => (prefix.to_vec(), short.to_vec()),
            None => {
                out.write_all(&long_record(b'L', &name)).map_err(io)?;
                (Vec::new(), name.get(..100).unwrap_or(&name).to_vec())
            }
        };
        let link = if link.len() > 100 {
            out.write_all(&long_record(b'K', link)).map_err(io)?;
            link.get(..100).unwrap_or(link)
        } else {
            link
        };
        let h = header(&Header {
            name: &short,
            prefix: &prefix,
            mode: e.mode,
            size,
            mtime: e.mtime,
            flag,
            link,
        });
        out.write_all(&h).map_err(io)?;
        if let Kind::File { source, size } = &e.kind {
            copy_exactly(source, *size, out)?;
        }
    }
    out.write_all(&[0u8; 2 * BLOCK]).map_err(io)
}

/// Sends exactly `size` bytes of `source`, padded to a block.
fn copy_exactly(source: &Path, size: u64, out: &mut dyn Write) -> Result<(), TarError> {
    let err = TarError::at(source);
    let mut f = File::open(source).map_err(&err)?.take(size);
    let mut buf = vec![0u8; 64 << 10];
    let mut sent = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(&err)?;
        if n == 0 {
            break;
        }
        out.write_all(buf.get(..n).unwrap_or_default())
            .map_err(TarError::Write)?;
        sent += n as u64;
    }
    if sent != size {
        return Err(TarError::Shrank {
            path: source.to_path_buf(),
            size,
            sent,
        });
    }
    let pad = (padded(size) - size) as usize;
    out.write_all(&vec![0u8; pad]).map_err(TarError::Write)
}

/// `name` as ustar's prefix and name fields, if it fits them.
fn split_ustar(name: &[u8]) -> Option<(&[u8], &[u8])> {
    if name.len() <= 100 {
        return Some((b"", name));
    }
    // The prefix ends at a slash; the name after it is at most 100 bytes.
    (0..name.len())
        .filter(|&i| name.get(i) == Some(&b'/'))
        .find(|&i| i <= 155 && name.len() - i - 1 <= 100 && name.len() - i > 1)
        .map(|i| {
            (
                name.get(..i).unwrap_or_default(),
                name.get(i + 1..).unwrap_or_default(),
            )
        })
}

struct Header<'a> {
    name: &'a [u8],
    prefix: &'a [u8],
    mode: u32,
    size: u64,
    mtime: u64,
    flag: u8,
    link: &'a [u8],
}

fn put(h: &mut [u8; BLOCK], at: usize, field: &[u8]) {
    for (d, s) in h.iter_mut().skip(at).zip(field) {
        *d = *s;
    }
}

fn octal(h: &mut [u8; BLOCK], at: usize, width: usize, v: u64) {
    let text = format!("{v:0w$o}\0", w = width - 1);
    put(h, at, text.as_bytes());
}

fn header(f: &Header) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    put(&mut h, 0, f.name);
    octal(&mut h, 100, 8, u64::from(f.mode & 0o7777));
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, f.size);
    octal(&mut h, 136, 12, f.mtime.min(MAX_SIZE));
    h[156] = f.flag;
    put(&mut h, 157, f.link);
    put(&mut h, 257, b"ustar\x0000");
    put(&mut h, 265, b"root");
    put(&mut h, 297, b"root");
    put(&mut h, 345, f.prefix);
    let sum = checksum(&h);
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    h
}

/// A GNU long-name (`L`) or long-link (`K`) record: its header and the NUL-ended text.
fn long_record(flag: u8, text: &[u8]) -> Vec<u8> {
    let size = text.len() as u64 + 1;
    let mut out = header(&Header {
        name: b"././@LongLink",
        prefix: b"",
        mode: 0,
        size,
        mtime: 0,
        flag,
        link: b"",
    })
    .to_vec();
    out.extend_from_slice(text);
    out.resize(BLOCK + padded(size) as usize, 0);
    out
}

/// The header's checksum: its bytes summed with the checksum field as spaces.
fn checksum(h: &[u8; BLOCK]) -> u32 {
    (h.iter().enumerate())
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                u32::from(b' ')
            } else {
                u32::from(b)
            }
        })
        .sum()
}

/// A numeric field: octal digits ended by NUL or space. Base-256 and garbage are refused.
fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = field
        .iter()
        .skip_while(|&&b| b == b' ')
        .take_while(|&&b| b != 0 && b != b' ');
    let mut v = 0u64;
    let mut digits = 0;
    for &b in text {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add(u64::from(b - b'0'))?;
        digits += 1;
    }
    (digits > 0).then_some(v)
}

/// A NUL-ended field's text.
fn text(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    field.get(..end).unwrap_or_default()
}

/// Where a member's bytes go.
enum Sink {
    File(File),
    LongName(Vec<u8>),
    LongLink(Vec<u8>),
    Skip,
}

enum State {
    Header,
    Data { left: u64, pad: u64, sink: Sink },
    End,
}

/// Unpacks an archive fed to it in pieces of any size into `root`, which must exist and
/// should be empty: every member must be `top` or lie under it.
pub struct Extract {
    root: PathBuf,
    top: Vec<u8>,
    state: State,
    block: Vec<u8>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    zero_blocks: u8,
    /// Directories made, with their modes, set last (a read-only one still gets its files).
    dirs: Vec<(PathBuf, u32)>,
    /// Members left out, with why.
    pub skipped: Vec<String>,
    pub files: u64,
}

impl Extract {
    pub fn new(root: &Path, top: &str) -> Extract {
        Extract {
            root: root.to_path_buf(),
            top: top.as_bytes().to_vec(),
            state: State::Header,
            block: Vec::with_capacity(BLOCK),
            long_name: None,
            long_link: None,
            zero_blocks: 0,
            dirs: Vec::new(),
            skipped: Vec::new(),
            files: 0,
        }
    }

    /// Takes the next bytes of the archive.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), TarError> {
        while !data.is_empty() {
            match &mut self.state {
                State::End => return Ok(()),
                State::Header => {
                    let take = (BLOCK - self.block.len()).min(data.len());
                    let (now, rest) = data.split_at(take);
                    self.block.extend_from_slice(now);
                    data = rest;
                    if self.block.len() == BLOCK {
                        let mut h = [0u8; BLOCK];
                        h.copy_from_slice(&self.block);
                        self.block.clear();
                        self.header(&h)?;
                    }
                }
                State::Data { left, pad, sink } => {
                    if *left > 0 {
                        let take = (*left).min(data.len() as u64) as usize;
                        let (now, rest) = data.split_at(take);
                        match sink {
                            Sink::File(f) => f.write_all(now).map_err(TarError::Write)?,
                            Sink::LongName(v) | Sink::LongLink(v) => v.extend_from_slice(now),
                            Sink::Skip => {}
                        }
                        *left -= take as u64;
                        data = rest;
                    } else {
                        let take = (*pad).min(data.len() as u64) as usize;
                        *pad -= take as u64;
                        data = data.get(take..).unwrap_or_default();
                    }
                    if *left == 0 && *pad == 0 {
                        let State::Data { sink, .. } =
                            std::mem::replace(&mut self.state, State::Header)
                        else {
                            continue;
                        };
                        match sink {
                            Sink::LongName(v) => self.long_name = Some(text(&v).to_vec()),
                            Sink::LongLink(v) => self.long_link = Some(text(&v).to_vec()),
                            Sink::File(_) | Sink::Skip => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The archive ended: checks it ended where an archive does, and sets the
    /// directories' modes.
    pub fn finish(mut self) -> Result<Extract, TarError> {
        if !matches!(self.state, State::End) {
            return Err(TarError::EndedEarly);
        }
        for (dir, mode) in self.dirs.iter().rev() {
            fs::set_permissions(dir, fs::Permissions::from_mode(*mode))
                .map_err(TarError::at(dir))?;
        }
        self.dirs.clear();
        Ok(self)
    }

    fn header(&mut self, h: &[u8; BLOCK]) -> Result<(), TarError> {
        if h.iter().all(|&b| b == 0) {
            self.zero_blocks += 1;
            if self.zero_blocks == 2 {
                self.state = State::End;
            }
            return Ok(());
        }
        self.zero_blocks = 0;
        let stored = parse_octal(&h[148..156]).ok_or(TarError::NoChecksum)?;
        if stored != u64::from(checksum(h)) {
            return Err(TarError::Checksum);
        }
        let size = parse_octal(&h[124..136]).unwrap_or(0);
        let mode = parse_octal(&h[100..108]).unwrap_or(0o644) as u32;
        let mtime = parse_octal(&h[136..148]).unwrap_or(0);
        let flag = h[156];
        let data = |sink| State::Data {
            left: size,
            pad: padded(size) - size,
            sink,
        };
        if matches!(flag, b'L' | b'K') {
            if size > MAX_LONG_NAME {
                return Err(TarError::LongName(size));
            }
            self.state = data(if flag == b'L' {
                Sink::LongName(Vec::new())
            } else {
                Sink::LongLink(Vec::new())
            });
            return Ok(());
        }
        let name = match self.long_name.take() {
            Some(n) => n,
            None => {
                let (prefix, short) = (text(&h[345..500]), text(&h[0..100]));
                if prefix.is_empty() {
                    short.to_vec()
                } else {
                    [prefix, b"/", short].concat()
                }
            }
        };
        let link = self
            .long_link
            .take()
            .unwrap_or_else(|| text(&h[157..257]).to_vec());
        let shown = String::from_utf8_lossy(&name).into_owned();
        let mut sink = Sink::Skip;
        match flag {
            b'0' | 0 | b'7' => {
                let path = self.member(&name)?;
                self.clear_for_file(&path)?;
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(TarError::at(&path))?;
                // The final mode and time now: the descriptor writes whatever they are.
                f.set_permissions(fs::Permissions::from_mode(mode & 0o1777))
                    .map_err(TarError::at(&path))?;
                let _ = f.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
                self.files += 1;
                sink = Sink::File(f);
            }
            b'5' => {
                let path = self.member(&name)?;
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        fs::remove_file(&path).map_err(TarError::at(&path))?;
                        make_dir(&path)?;
                    }
                    Err(_) => make_dir(&path)?,
                }
                self.dirs.push((path, mode & 0o1777));
            }
            b'2' => {
                let path = self.member(&name)?;
                self.clear_for_file(&path)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&link), &path)
                    .map_err(TarError::at(&path))?;
            }
            b'1' => {
                let path = self.member(&name)?;
                let target = self.member(&link)?;
                match fs::symlink_metadata(&target) {
                    Ok(m) if m.is_file() => {}
                    _ => {
                        return Err(TarError::HardLink {
                            name: shown,
                            target: String::from_utf8_lossy(&link).into_owned(),
                        })
                    }
                }
                self.clear_for_file(&path)?;
                fs::hard_link(&target, &path).map_err(TarError::at(&path))?;
            }
            b'3' | b'4' | b'6' => self
                .skipped
                .push(format!("{shown} (a device node or FIFO)")),
            b'x' | b'g' => self.skipped.push(format!("{shown} (pax attributes)")),
            other => self
                .skipped
                .push(format!("{shown} (tar member type {:?})", char::from(other))),
        }
        self.state = data(sink);
        if size == 0 {
            // Nothing follows the header: back to headers at once.
            self.state = State::Header;
        }
        Ok(())
    }

    /// Where member `name` goes: under the root, as `top` or below it, through no
    /// symbolic link. Missing parents are made.
    fn member(&self, name: &[u8]) -> Result<PathBuf, TarError> {
        let shown = || String::from_utf8_lossy(name).into_owned();
        if name.first() == Some(&b'/') {
            return Err(TarError::Absolute(shown()));
        }
        let parts: Vec<&[u8]> = (name.split(|&b| b == b'/'))
            .filter(|p| !p.is_empty() && *p != b".")
            .collect();
        if parts.iter().any(|p| *p == b"..") {
            return Err(TarError::DotDot(shown()));
        }
        if parts.first() != Some(&self.top.as_slice()) {
            return Err(TarError::NotUnder {
                name: shown(),
                top: String::from_utf8_lossy(&self.top).into_owned(),
            });
        }
        let mut path = self.root.clone();
        let last = parts.len() - 1;
        for (i, p) in parts.iter().enumerate() {
            path.push(OsStr::from_bytes(p));
            if i == last {
                break;
            }
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(TarError::ParentNotDir(shown())),
                Err(_) => make_dir(&path)?,
            }
        }
        Ok(path)
    }

    /// Removes what is at `path` for a file or link to take its place; a directory stays
    /// (an error).
    fn clear_for_file(&self, path: &Path) -> Result<(), TarError> {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => Err(TarError::DirInTheWay(path.to_path_buf())),
            Ok(_) => fs::remove_file(path).map_err(TarError::at(path)),
            Err(_) => Ok(()),
        }
    }
}

fn make_dir(path: &Path) -> Result<(), TarError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(TarError::at(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hcab-tar-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn archive(src: &Path, top: &str) -> Vec<u8> {
        let p = plan(src, top).unwrap();
        let mut out = Vec::new();
        write(&p, &mut out).unwrap();
        assert_eq!(out.len() as u64, p.archive_bytes());
        out
    }

    /// Unpacks `data` fed in pieces of `piece` bytes; a refused archive's directory goes.
    fn unpack(data: &[u8], top: &str, piece: usize) -> Result<(PathBuf, Extract), TarError> {
        let root = scratch(&format!("out-{top}-{piece}"));
        let mut x = Extract::new(&root, top);
        let r = data
            .chunks(piece)
            .try_for_each(|p| x.feed(p))
            .and_then(|()| x.finish());
        match r {
            Ok(x) => Ok((root, x)),
            Err(e) => {
                fs::remove_dir_all(&root).unwrap();
                Err(e)
            }
        }
    }

    #[test]
    fn test_a_tree_comes_back_as_it_was_whatever_the_pieces() {
        let src = scratch("tree");
        let t = src.join("t");
        fs::create_dir_all(t.join("sub/deeper")).unwrap();
        fs::write(
            t.join("sub/data"),
            (0..70_000u32).map(|i| i as u8).collect::<Vec<_>>(),
        )
        .unwrap();
        fs::write(t.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(t.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(t.join("empty"), "").unwrap();
        std::os::unix::fs::symlink("sub/data", t.join("link")).unwrap();
        let long = "n".repeat(120);
        fs::write(t.join("sub/deeper").join(&long), "long name").unwrap();
        let data = archive(&t, "copy");
        for piece in [1, 511, 512, 4096, data.len()] {
            let (root, x) = unpack(&data, "copy", piece).unwrap();
            let c = root.join("copy");
            assert_eq!(
                fs::read(c.join("sub/data")).unwrap(),
                fs::read(t.join("sub/data")).unwrap()
            );
            let m = fs::metadata(c.join("run.sh")).unwrap();
            assert_eq!(m.mode() & 0o777, 0o755, "the executable stays executable");
            assert_eq!(fs::read(c.join("empty")).unwrap(), b"");
            assert_eq!(
                fs::read_link(c.join("link")).unwrap(),
                Path::new("sub/data")
            );
            assert_eq!(
                fs::read(c.join("sub/deeper").join(&long)).unwrap(),
                b"long name"
            );
            assert_eq!(x.files, 4);
            fs::remove_dir_all(root).unwrap();
        }
        fs::remove_dir_all(src).unwrap();
    }

    #[test]
    fn test_the_host_tar_reads_what_we_write() {
        let src = scratch("gnu");
        fs::write(src.join("f"), "x").unwrap();
        fs::set_permissions(src.join("f"), fs::Permissions::from_mode(0o751)).unwrap();
        let data = archive(&src.join("f"), &"a".repeat(150));
        let Ok(out) = std::process::Command::new("tar")
            .arg("-tvf")
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                c.stdin.take().unwrap().write_all(&data)?;
                c.wait_with_output()
            })
        else {
            return; // no tar here
        };
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("-rwxr-x--x"), "{listing}");
        assert!(listing.contains(&"a".repeat(150)), "{listing}");
        fs::remove_dir_all(src).unwrap();
    }

    /// A one-member archive with `name`, type `flag`, `link`, and `body`.
    fn member(name: &str, flag: u8, link: &str, body: &[u8]) -> Vec<u8> {
        let mut out = header(&Header {
            name: name.as_bytes(),
            prefix: b"",
            mode: 0o644,
            size: body.len() as u64,
            mtime: 0,
            flag,
            link: link.as_bytes(),
        })
        .to_vec();
        out.extend_from_slice(body);
        out.resize(
            out.len() + (padded(body.len() as u64) as usize - body.len()),
            0,
        );
        out
    }

    fn end(mut v: Vec<u8>) -> Vec<u8> {
        v.extend_from_slice(&[0u8; 2 * BLOCK]);
        v
    }

    #[test]
    fn test_hostile_archives_write_nothing_outside_their_directory() {
        for (case, data, says) in [
            (
                "dotdot",
                end(member("top/../../x", b'0', "", b"evil")),
                "`..`",
            ),
            (
                "absolute",
                end(member("/etc/x", b'0', "", b"evil")),
                "absolute",
            ),
            (
                "elsewhere",
                end(member("other/x", b'0', "", b"evil")),
                "not under top",
            ),
            (
                "through a link",
                end([
                    member("top/l", b'2', "/tmp", b""),
                    member("top/l/x", b'0', "", b"evil"),
                ]
                .concat()),
                "no directory",
            ),
            (
                "hard link out",
                end(member("top/h", b'1', "/etc/passwd", b"")),
                "absolute",
            ),
        ] {
            let e = unpack(&data, "top", 512)
                .err()
                .unwrap_or_else(|| panic!("{case}"))
                .to_string();
            assert!(e.contains(says), "{case}: {e}");
        }
        let mut bad = member("top/f", b'0', "", b"x");
        bad[0] ^= 1;
        let e = unpack(&end(bad), "top", 512).err().unwrap().to_string();
        assert!(e.contains("checksum"), "{e}");
        let short = member("top/f", b'0', "", &[7u8; 1000]);
        let e = unpack(&short[..700], "top", 100).err().unwrap().to_string();
        assert!(e.contains("ended early"), "{e}");
    }

    #[test]
    fn test_setuid_bits_and_devices_do_not_come_through() {
        let mut m = header(&Header {
            name: b"top/s",
            prefix: b"",
            mode: 0o4755,
            size: 0,
            mtime: 0,
            flag: b'0',
            link: b"",
        })
        .to_vec();
        m.extend(member("top/dev", b'3', "", b""));
        let (root, x) = unpack(&end(m), "top", 512).unwrap();
        let mode = fs::metadata(root.join("top/s")).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o755);
        assert_eq!(x.skipped.len(), 1, "{:?}", x.skipped);
        assert!(!root.join("top/dev").exists());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn test_numeric_fields_refuse_garbage() {
        assert_eq!(parse_octal(b"0000644\0"), Some(0o644));
        assert_eq!(parse_octal(b"  755 \0"), Some(0o755));
        assert_eq!(parse_octal(b"\x80\0\0\0"), None);
        assert_eq!(parse_octal(b"12a"), None);
        assert_eq!(parse_octal(b"\0\0"), None);
        assert_eq!(parse_octal(b"77777777777777777777777777"), None);
    }
}
