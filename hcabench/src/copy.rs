//! `hcabench cp`: files and directories into and out of a running cluster's guests, over
//! the command channel `hcabench exec` uses (`exec.rs`).
//!
//! Whatever is copied travels as one tar archive per source (`tar.rs`) in base64 lines
//! over the guest's serial port; the guest's busybox tar makes or unpacks the other end.
//! Into a guest: the archive goes in pieces of [`CHUNK`] bytes, each a here-document for
//! `base64 -d` appending to a staging file in the guest's /tmp, each acknowledged before
//! the next (so no more is in flight than the guest's tty and pipe hold); the guest then
//! checks the file's SHA-256 against the host's and only then unpacks it. Out of a guest:
//! busybox tar's output is hashed in the guest as it is sent (through a FIFO to
//! `sha256sum`); the host unpacks it as it comes into a staging directory beside the
//! destination and moves it into place only if the hashes match. Modes are kept both ways.

use std::fs;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cluster::agent::{Patience, HEREDOC_END};

use crate::base64;
use crate::base64::Base64Error;
use crate::exec::{self, channel_error, sh_quote, Channel, ExecError};
use crate::rundir::{ClusterState, RunDir};
use crate::sha256::Sha256;
use crate::tar::{self, TarError};

/// Copy files and directories into or out of a guest
///
/// Exactly one side names a guest, as NODE:PATH (as scp and docker cp do): SRC... NODE:DEST
/// copies into NODE, NODE:SRC... DEST out of it. A directory is copied with everything in
/// it; modes are kept (an executable stays executable); links inside a directory stay
/// links. If DEST is a directory each source goes into it under its own name; else the one
/// source is copied to DEST. Guest paths not starting with / are from the guest's /.
///
/// Every copy is checked: the SHA-256 of what was sent is compared on both ends, and a
/// copy that does not match is an error and is not put in place. A copy into a guest that
/// would not fit (its files live in its RAM) is refused before it starts. Progress goes to
/// stderr for a MiB or more: a QEMU guest's serial port takes about 100 KiB/s in and
/// 250 KiB/s out.
///
/// Examples:
///   hcabench cp build/mymod.ko tests/ node1:/tmp
///   hcabench cp node2:/tmp/results .
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
#[command(override_usage = "hcabench cp SRC... NODE:DEST\n       hcabench cp NODE:SRC... DEST")]
pub struct CpArgs {
    /// Sources, then the destination; one side is NODE:PATH, e.g. node1:/tmp
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<String>,
}

/// Raw bytes per here-document: 576 lines of base64 (about 44 KiB), which the guest's pipe
/// to its shell holds whole.
const CHUNK: usize = 57 * 576;
/// How long a guest may stay silent while a piece is in flight.
const IDLE: Duration = Duration::from_secs(60);
/// How long to wait for another exec or cp on the node to finish.
const LOCK_WAIT: Duration = Duration::from_secs(600);
/// The guest's staging files.
const STAGE_IN: &str = "/tmp/.hcabench-cp-in";
const STAGE_OUT: &str = "/tmp/.hcabench-cp-out";
/// The line that follows the archive's base64 out of a guest: its SHA-256 and tar's status.
const END: &str = "HCABENCH-END ";
/// The status the guest's unpacking script gives a checksum that does not match.
const MISMATCH: &str = "90";
/// Progress is shown for transfers of at least this many bytes.
const SHOW_PROGRESS: u64 = 1 << 20;

/// Why a copy was refused, failed, or arrived damaged.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("want SRC... DEST, one side NODE:PATH")]
    Usage,
    #[error("both sides name a guest: copy from one guest to the host, then to the other")]
    BothGuests,
    #[error(
        "neither side names a guest: write it as NODE:PATH, e.g. `hcabench cp {sources} \
         node1:/tmp`"
    )]
    NoGuest { sources: String },
    #[error("the sources mix guest (NODE:PATH) and host paths: exactly one side names a guest")]
    Mixed,
    #[error("the sources are on {node} and {other}: copy from one guest at a time")]
    TwoGuests { node: String, other: String },
    #[error("{0}: name a file or directory after the colon")]
    NoPath(String),
    /// A host path could not be read, made or moved.
    #[error("{}: {source}", .path.display())]
    Host { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Tar(#[from] TarError),
    #[error("{0}: name a file or directory")]
    GuestName(String),
    #[error("{node}: unexpected answer about {about}: {answer:?}")]
    Answer {
        node: String,
        about: String,
        answer: String,
    },
    #[error("{}: cannot copy this (no name, or not UTF-8)", .0.display())]
    NoName(PathBuf),
    #[error("{node}: no directory {dir} in the guest (for {dest})")]
    NoGuestParent {
        node: String,
        dir: String,
        dest: String,
    },
    #[error("{node}: no directory {dest} in the guest")]
    NoGuestDir { node: String, dest: String },
    #[error("{node}:{dest} is a file: cannot copy the directory {} onto it", .src.display())]
    DirOntoFile {
        node: String,
        dest: String,
        src: PathBuf,
    },
    #[error("{node}:{dest} is not a directory in the guest: copying several sources needs one")]
    NotGuestDir { node: String, dest: String },
    #[error(
        "{node}: no room for {}: it needs about {} in the guest (the archive while it is \
         checked, then its files) and the guest can give it {} (its files live in its RAM: \
         memory_mib in the cluster file)",
        .src.display(),
        mib(*.need),
        mib(*.free)
    )]
    NoRoom {
        node: String,
        src: PathBuf,
        need: u64,
        free: u64,
    },
    #[error(
        "{node}: the copy of {} arrived damaged: sent sha256 {sum}, {}; nothing was unpacked",
        .src.display(),
        .guest.trim()
    )]
    DamagedIn {
        node: String,
        src: PathBuf,
        sum: String,
        /// What the guest said of it.
        guest: String,
    },
    #[error(
        "{node}: unpacking {} in {parent} failed: {}{}",
        .src.display(),
        .output.trim(),
        disk_full_hint(.output)
    )]
    Unpacking {
        node: String,
        src: PathBuf,
        parent: String,
        output: String,
    },
    #[error(
        "{node}: writing {STAGE_IN} in the guest failed: {}{}",
        .output.trim(),
        disk_full_hint(.output)
    )]
    Staging { node: String, output: String },
    #[error("{}: not a directory (copying several sources needs one)", .0.display())]
    NotDir(PathBuf),
    #[error("{}: no such directory", .0.display())]
    NoSuchDir(PathBuf),
    #[error("{node}:{src}: no such file or directory in the guest")]
    GuestMissing { node: String, src: String },
    #[error("{node}:{src}: not a regular file or directory (a device, FIFO or socket)")]
    GuestSpecial { node: String, src: String },
    #[error("{node}: unexpected path for {src}: {resolved:?}")]
    GuestPath {
        node: String,
        src: String,
        resolved: String,
    },
    #[error("{node}:{src}: cannot copy the guest's /")]
    GuestRoot { node: String, src: String },
    #[error("{node}: the copy of {src} ended without its checksum: {trailer}")]
    NoChecksum {
        node: String,
        src: String,
        trailer: String,
    },
    #[error("{node}: tar in the guest failed on {src}: {trailer}")]
    GuestTar {
        node: String,
        src: String,
        trailer: String,
    },
    #[error(
        "{node}: the copy of {src} arrived damaged: the guest sent sha256 {theirs}, {ours} \
         arrived; nothing was put in place"
    )]
    DamagedOut {
        node: String,
        src: String,
        theirs: String,
        ours: String,
    },
    #[error("the archive was unpacked twice")]
    UnpackedTwice,
    #[error("{node}: the copy of {src}: {source}")]
    Unpack {
        node: String,
        src: String,
        source: TarError,
    },
    #[error("the guest sent a line too long to be base64: the copy is garbled")]
    LineTooLong,
    #[error("the copy is garbled: {0}")]
    Garbled(#[source] Base64Error),
    #[error("the guest sent more than its cluster's {} of RAM could hold: refused", mib(*.0))]
    TooMuch(u64),
    #[error("{}: a directory is there: not replaced with a file", .0.display())]
    DirThere(PathBuf),
    #[error("{}: a file is there: not replaced with a directory", .0.display())]
    FileThere(PathBuf),
}

impl CopyError {
    /// The error for an I/O failure on host path `path`.
    fn host(path: &Path) -> impl Fn(io::Error) -> CopyError + '_ {
        move |source| CopyError::Host {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What `hcabench cp` was asked to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Transfer {
    /// Host paths into `node`'s `dest`.
    In {
        node: String,
        sources: Vec<PathBuf>,
        dest: String,
    },
    /// `node`'s paths to the host's `dest`.
    Out {
        node: String,
        sources: Vec<String>,
        dest: PathBuf,
    },
}

/// `NODE:PATH` as (node, path): a colon after a non-empty name without a slash, as scp
/// reads it (`./a:b` is a local file).
pub fn remote(arg: &str) -> Option<(&str, &str)> {
    let (node, path) = arg.split_once(':')?;
    (!node.is_empty() && !node.contains('/')).then_some((node, path))
}

/// Reads `SRC... DEST`: which side is the guest's, and which guest.
pub fn parse(args: &[String]) -> Result<Transfer, CopyError> {
    let Some((dest, sources)) = args.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(CopyError::Usage);
    };
    let remote_sources: Vec<_> = sources.iter().filter_map(|s| remote(s)).collect();
    match remote(dest) {
        Some((node, path)) => {
            if !remote_sources.is_empty() {
                return Err(CopyError::BothGuests);
            }
            Ok(Transfer::In {
                node: node.to_string(),
                sources: sources.iter().map(PathBuf::from).collect(),
                dest: if path.is_empty() { "/" } else { path }.to_string(),
            })
        }
        None => {
            if remote_sources.is_empty() {
                return Err(CopyError::NoGuest {
                    sources: sources.join(" "),
                });
            }
            if remote_sources.len() != sources.len() {
                return Err(CopyError::Mixed);
            }
            let node = remote_sources.first().map_or("", |(n, _)| n);
            if let Some((other, _)) = remote_sources.iter().find(|(n, _)| *n != node) {
                return Err(CopyError::TwoGuests {
                    node: node.to_string(),
                    other: other.to_string(),
                });
            }
            if let Some(s) = sources
                .iter()
                .find(|s| remote(s).is_some_and(|(_, p)| p.is_empty()))
            {
                return Err(CopyError::NoPath(s.clone()));
            }
            Ok(Transfer::Out {
                node: node.to_string(),
                sources: remote_sources.iter().map(|(_, p)| p.to_string()).collect(),
                dest: PathBuf::from(dest),
            })
        }
    }
}

pub fn run(run: &RunDir, a: &CpArgs) -> Result<(), CopyError> {
    let transfer = parse(&a.paths)?;
    match &transfer {
        Transfer::In { sources, .. } => {
            // The host's side is checked before anything happens in the guest.
            for s in sources {
                fs::metadata(s).map_err(CopyError::host(s))?;
            }
        }
        Transfer::Out { dest, sources, .. } => {
            out_destination(dest, sources.len())?;
        }
    }
    let state = exec::live_cluster(run)?;
    match transfer {
        Transfer::In {
            node,
            sources,
            dest,
        } => copy_in(run, &state, &node, &sources, &dest),
        Transfer::Out {
            node,
            sources,
            dest,
        } => copy_out(run, &state, &node, &sources, &dest),
    }
}

/// Runs a short script (its last command's status is the answer) and returns (status,
/// output), the output bounded.
fn ask(
    ch: &mut Channel,
    what: &str,
    script: &str,
    limit: Duration,
) -> Result<(String, String), CopyError> {
    let mut out = Vec::new();
    let word = ch
        .agent
        .exchange(
            what,
            |marker| format!("{script}\necho \"{marker}$?\""),
            Patience::Total(limit),
            &mut |b| {
                let room = (64usize << 10).saturating_sub(out.len());
                out.extend(b.iter().take(room));
                Ok(())
            },
        )
        .map_err(|e| channel_error(&ch.node, e))?;
    Ok((word, String::from_utf8_lossy(&out).into_owned()))
}

/// The last path component of a guest path, or an error naming it.
fn guest_name(path: &str) -> Result<String, CopyError> {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| CopyError::GuestName(path.to_string()))
}

/// The directory a guest path is in ("." for a bare name, from the guest's /).
fn guest_parent(path: &str) -> String {
    match Path::new(path).parent().and_then(Path::to_str) {
        Some("") | None => ".".into(),
        Some(p) => p.to_string(),
    }
}

/// What is at the destination in the guest.
#[derive(Debug, PartialEq, Eq)]
enum GuestDest {
    Dir,
    File,
    New,
    NoDir,
}

fn copy_in(
    run: &RunDir,
    state: &ClusterState,
    node: &str,
    sources: &[PathBuf],
    dest: &str,
) -> Result<(), CopyError> {
    let mut ch = exec::open(run, state, node, LOCK_WAIT)?;
    let d = sh_quote(dest);
    let probe = format!(
        "hcabench_d={d}\n\
         if [ -d \"$hcabench_d\" ]; then hcabench_p=$hcabench_d; echo dir\n\
         elif [ -e \"$hcabench_d\" ] || [ -L \"$hcabench_d\" ]; then \
         hcabench_p=$(dirname \"$hcabench_d\"); echo file\n\
         elif [ -d \"$(dirname \"$hcabench_d\")\" ]; then hcabench_p=$(dirname \"$hcabench_d\"); \
         echo new\n\
         else hcabench_p=; echo nodir; fi\n\
         [ -z \"$hcabench_p\" ] || stat -f -c '%a %S' \"$hcabench_p\"\n\
         grep MemAvailable /proc/meminfo"
    );
    let (_, out) = ask(
        &mut ch,
        "looking at the destination",
        &probe,
        Duration::from_secs(30),
    )?;
    let mut lines = out.lines();
    let kind = match lines.next().map(str::trim) {
        Some("dir") => GuestDest::Dir,
        Some("file") => GuestDest::File,
        Some("new") => GuestDest::New,
        Some("nodir") => GuestDest::NoDir,
        other => {
            return Err(CopyError::Answer {
                node: node.to_string(),
                about: dest.to_string(),
                answer: other.unwrap_or_default().to_string(),
            })
        }
    };
    let room = Room::read(lines);
    let targets = in_targets(node, sources, dest, &kind)?;
    for (src, parent, name) in targets {
        send(&mut ch, &src, &parent, &name, &room)?;
    }
    Ok(())
}

/// What a copy into a guest may take there. A guest's files live in its RAM (its root is
/// a tmpfs, as is the /tmp the archive waits in), and a guest whose tmpfs takes the memory
/// its kernel needs panics: so the bound is the smaller of the destination's free space
/// and the guest's available memory less [`RESERVE`].
#[derive(Debug, Default, PartialEq, Eq)]
struct Room {
    /// `stat -f`: the destination file system's free bytes.
    fs: Option<u64>,
    /// /proc/meminfo's MemAvailable, in bytes.
    memory: Option<u64>,
}

/// Memory a guest keeps for itself, whatever a copy would take.
const RESERVE: u64 = 32 << 20;

impl Room {
    /// From the probe's lines: `AVAILABLE-BLOCKS BLOCK-SIZE`, `MemAvailable: N kB`.
    fn read<'a>(lines: impl Iterator<Item = &'a str>) -> Room {
        let mut r = Room::default();
        for l in lines {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["MemAvailable:", kib, "kB"] => {
                    r.memory = kib.parse::<u64>().ok().map(|k| k << 10);
                }
                [blocks, size] => {
                    if let (Ok(b), Ok(s)) = (blocks.parse::<u64>(), size.parse::<u64>()) {
                        r.fs = b.checked_mul(s);
                    }
                }
                _ => {}
            }
        }
        r
    }

    /// Bytes a copy may take, if anything is known.
    fn bytes(&self) -> Option<u64> {
        let memory = self.memory.map(|m| m.saturating_sub(RESERVE));
        match (self.fs, memory) {
            (Some(f), Some(m)) => Some(f.min(m)),
            (f, m) => f.or(m),
        }
    }
}

/// Where each source goes in the guest: (source, guest directory, name there).
fn in_targets(
    node: &str,
    sources: &[PathBuf],
    dest: &str,
    kind: &GuestDest,
) -> Result<Vec<(PathBuf, String, String)>, CopyError> {
    let source_name = |s: &PathBuf| -> Result<String, CopyError> {
        let full = fs::canonicalize(s).map_err(CopyError::host(s))?;
        full.file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .ok_or_else(|| CopyError::NoName(s.clone()))
    };
    match (kind, sources) {
        (GuestDest::Dir, _) => sources
            .iter()
            .map(|s| Ok((s.clone(), dest.to_string(), source_name(s)?)))
            .collect(),
        (GuestDest::NoDir, _) => Err(CopyError::NoGuestParent {
            node: node.to_string(),
            dir: guest_parent(dest),
            dest: dest.to_string(),
        }),
        (_, [one]) => {
            if dest.ends_with('/') {
                return Err(CopyError::NoGuestDir {
                    node: node.to_string(),
                    dest: dest.to_string(),
                });
            }
            if *kind == GuestDest::File && fs::metadata(one).is_ok_and(|m| m.is_dir()) {
                return Err(CopyError::DirOntoFile {
                    node: node.to_string(),
                    dest: dest.to_string(),
                    src: one.clone(),
                });
            }
            source_name(one)?;
            Ok(vec![(one.clone(), guest_parent(dest), guest_name(dest)?)])
        }
        _ => Err(CopyError::NotGuestDir {
            node: node.to_string(),
            dest: dest.to_string(),
        }),
    }
}

/// Sends host path `src` into the guest's `parent` directory as `name`.
fn send(
    ch: &mut Channel,
    src: &Path,
    parent: &str,
    name: &str,
    room: &Room,
) -> Result<(), CopyError> {
    let node = ch.node.name.clone();
    let plan = tar::plan(src, name)?;
    for s in &plan.skipped {
        eprintln!(
            "hcabench: {}: not a file, directory or link: left out",
            s.display()
        );
    }
    let archive = plan.archive_bytes();
    // The archive sits in the guest's /tmp while it is checked, then its files.
    let need = archive + plan.content_bytes();
    if let Some(free) = room.bytes() {
        if need > free {
            return Err(CopyError::NoRoom {
                node,
                src: src.to_path_buf(),
                need,
                free,
            });
        }
    }
    let label = format!("{} -> {node}:{parent}/{name}", src.display());
    let mut sender = Sender {
        ch,
        buf: Vec::with_capacity(CHUNK),
        hash: Sha256::default(),
        first: true,
        failed: None,
        progress: Progress::new(&label, archive),
    };
    let written = tar::write(&plan, &mut sender)
        .map_err(CopyError::from)
        .and_then(|()| sender.send_rest());
    if let Err(e) = written {
        let why = sender.failed.take().unwrap_or(e);
        let _ = ask(
            sender.ch,
            "cleaning up",
            &format!("rm -f {STAGE_IN}"),
            Duration::from_secs(30),
        );
        return Err(why);
    }
    let sum = std::mem::take(&mut sender.hash).hex();
    let progress = std::mem::replace(&mut sender.progress, Progress::new("", 0));
    let unpack = format!(
        "hcabench_h=$(sha256sum < {STAGE_IN})\n\
         hcabench_h=${{hcabench_h%% *}}\n\
         if [ \"$hcabench_h\" != {sum} ]; then echo \"the guest got sha256 $hcabench_h\"; \
         hcabench_r={MISMATCH}\n\
         else tar -x -o -f {STAGE_IN} -C {} 2>&1; hcabench_r=$?; fi\n\
         rm -f {STAGE_IN}\n\
         (exit $hcabench_r)",
        sh_quote(parent)
    );
    // Hashing and unpacking in the guest: about 10 s a 100 MiB under TCG, and then some.
    let limit = Duration::from_secs(60 + archive / (1 << 20));
    let (word, out) = ask(ch, "checking and unpacking the copy", &unpack, limit)?;
    match word.as_str() {
        "0" => {}
        MISMATCH => {
            return Err(CopyError::DamagedIn {
                node,
                src: src.to_path_buf(),
                sum,
                guest: out,
            })
        }
        _ => {
            return Err(CopyError::Unpacking {
                node,
                src: src.to_path_buf(),
                parent: parent.to_string(),
                output: out,
            })
        }
    }
    progress.finish("sha256 checked on both ends");
    Ok(())
}

/// Takes the archive in and sends it to the guest a piece at a time.
struct Sender<'a> {
    ch: &'a mut Channel,
    buf: Vec<u8>,
    hash: Sha256,
    first: bool,
    /// What went wrong (the Write trait carries io errors only).
    failed: Option<CopyError>,
    progress: Progress,
}

impl Sender<'_> {
    /// One here-document of `data` appended to the guest's staging file.
    fn piece(&mut self, data: &[u8]) -> Result<(), CopyError> {
        self.hash.update(data);
        let lines = base64::encode_lines(data);
        let redirect = if self.first { ">" } else { ">>" };
        self.first = false;
        let mut out = Vec::new();
        let word = self
            .ch
            .agent
            .exchange(
                "writing the copy",
                |marker| {
                    format!(
                        "base64 -d 2>&1 {redirect} {STAGE_IN} <<'{HEREDOC_END}'\n{lines}\
                         {HEREDOC_END}\necho \"{marker}$?\""
                    )
                },
                Patience::Idle(IDLE),
                &mut |b| {
                    let room = 4096usize.saturating_sub(out.len());
                    out.extend(b.iter().take(room));
                    Ok(())
                },
            )
            .map_err(|e| channel_error(&self.ch.node, e))?;
        if word != "0" {
            return Err(CopyError::Staging {
                node: self.ch.node.name.clone(),
                output: String::from_utf8_lossy(&out).into_owned(),
            });
        }
        self.progress.add(data.len() as u64);
        Ok(())
    }

    fn send_rest(&mut self) -> Result<(), CopyError> {
        let rest = std::mem::take(&mut self.buf);
        if !rest.is_empty() {
            self.piece(&rest)?;
        }
        Ok(())
    }
}

impl Write for Sender<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(b);
        while self.buf.len() >= CHUNK {
            let piece: Vec<u8> = self.buf.drain(..CHUNK).collect();
            if let Err(e) = self.piece(&piece) {
                let said = e.to_string();
                self.failed = Some(e);
                return Err(io::Error::other(said));
            }
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn disk_full_hint(out: &str) -> &'static str {
    if out.contains("No space left") {
        " (the guest's disk is full: its root is a tmpfs of 80% of its RAM; `hcabench exec \
         NODE -- df -h /` shows it)"
    } else {
        ""
    }
}

/// Checks the host destination of a copy out: an existing directory, or (one source) a
/// new or existing file name in an existing directory.
fn out_destination(dest: &Path, sources: usize) -> Result<(), CopyError> {
    if dest.is_dir() {
        return Ok(());
    }
    if sources > 1 {
        return Err(CopyError::NotDir(dest.to_path_buf()));
    }
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if dest.as_os_str().as_encoded_bytes().ends_with(b"/") || !parent.is_dir() {
        let missing = if parent.is_dir() { dest } else { parent };
        return Err(CopyError::NoSuchDir(missing.to_path_buf()));
    }
    Ok(())
}

fn copy_out(
    run: &RunDir,
    state: &ClusterState,
    node: &str,
    sources: &[String],
    dest: &Path,
) -> Result<(), CopyError> {
    // What a guest sends can be no more than the guests hold: their RAM.
    let limit: u64 = (state.nodes.iter())
        .map(|n| state.config.memory_mib_of(&n.name) << 20)
        .sum();
    let mut ch = exec::open(run, state, node, LOCK_WAIT)?;
    for src in sources {
        receive(&mut ch, src, dest, limit)?;
    }
    Ok(())
}

/// Copies guest path `src` to the host: into `dest` if it is a directory, else as `dest`.
fn receive(ch: &mut Channel, src: &str, dest: &Path, limit: u64) -> Result<(), CopyError> {
    let node = ch.node.name.clone();
    let probe = format!(
        "hcabench_s={}\n\
         if [ ! -e \"$hcabench_s\" ]; then echo missing\n\
         else hcabench_r=$(readlink -f \"$hcabench_s\")\n\
         if [ -d \"$hcabench_r\" ]; then echo \"dir $(du -sk \"$hcabench_r\" | cut -f1)\"\n\
         elif [ -f \"$hcabench_r\" ]; then echo \"file $(du -sk \"$hcabench_r\" | cut -f1)\"\n\
         else echo other; fi\n\
         echo \"$hcabench_r\"; fi",
        sh_quote(src)
    );
    let (_, out) = ask(ch, "looking at the source", &probe, Duration::from_secs(30))?;
    let (head, resolved) = out.split_once('\n').unwrap_or((&out, ""));
    let resolved = resolved.strip_suffix('\n').unwrap_or(resolved);
    let mut words = head.split_whitespace();
    let estimate = match (words.next(), words.next()) {
        (Some("missing"), _) => {
            return Err(CopyError::GuestMissing {
                node,
                src: src.to_string(),
            })
        }
        (Some("dir" | "file"), kib) => kib.and_then(|k| k.parse::<u64>().ok()).unwrap_or(0) * 1024,
        (Some("other"), _) => {
            return Err(CopyError::GuestSpecial {
                node,
                src: src.to_string(),
            })
        }
        _ => {
            return Err(CopyError::Answer {
                node,
                about: src.to_string(),
                answer: head.to_string(),
            })
        }
    };
    if !resolved.starts_with('/') || resolved.contains('\n') {
        return Err(CopyError::GuestPath {
            node,
            src: src.to_string(),
            resolved: resolved.to_string(),
        });
    }
    let name = guest_name(resolved).map_err(|_| CopyError::GuestRoot {
        node: node.clone(),
        src: src.to_string(),
    })?;
    let target = if dest.is_dir() {
        dest.join(&name)
    } else {
        dest.to_path_buf()
    };
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let stage = Stage::new(&parent)?;
    let label = format!("{node}:{src} -> {}", target.display());
    let mut rx = Receiver {
        line: Vec::new(),
        end: None,
        trailer: Vec::new(),
        hash: Sha256::default(),
        extract: Some(tar::Extract::new(&stage.0, &name)),
        bytes: 0,
        limit,
        failed: None,
        progress: Progress::new(&label, estimate),
    };
    let t = STAGE_OUT;
    let stream = format!(
        "rm -f {t}.fifo {t}.sum {t}.err {t}.rc\n\
         mkfifo {t}.fifo\n\
         sha256sum < {t}.fifo > {t}.sum &\n\
         hcabench_w=$!\n\
         {{ tar -c -f - -C {} {} 2> {t}.err; echo $? > {t}.rc; }} | tee {t}.fifo | base64\n\
         wait $hcabench_w\n\
         echo \"{END}$(cut -d' ' -f1 < {t}.sum) $(cat {t}.rc)\"\n\
         cat {t}.err\n\
         rm -f {t}.fifo {t}.sum {t}.err {t}.rc",
        sh_quote(&guest_parent(resolved)),
        sh_quote(&name)
    );
    let r = ch.agent.exchange(
        "sending the copy",
        |marker| format!("{stream}\necho \"{marker}$?\""),
        Patience::Idle(IDLE),
        &mut |b| rx.push(b),
    );
    if let Err(e) = r {
        return Err(rx
            .failed
            .take()
            .unwrap_or_else(|| channel_error(&ch.node, e).into()));
    }
    let Some((their_sum, tar_status)) = rx.end.take() else {
        return Err(CopyError::NoChecksum {
            node,
            src: src.to_string(),
            trailer: String::from_utf8_lossy(&rx.trailer).trim().to_string(),
        });
    };
    let trailer = String::from_utf8_lossy(&rx.trailer).trim().to_string();
    if tar_status != "0" {
        return Err(CopyError::GuestTar {
            node,
            src: src.to_string(),
            trailer,
        });
    }
    let our_sum = std::mem::take(&mut rx.hash).hex();
    if our_sum != their_sum {
        return Err(CopyError::DamagedOut {
            node,
            src: src.to_string(),
            theirs: their_sum,
            ours: our_sum,
        });
    }
    let x = rx
        .extract
        .take()
        .ok_or(CopyError::UnpackedTwice)?
        .finish()
        .map_err(|source| CopyError::Unpack {
            node: node.clone(),
            src: src.to_string(),
            source,
        })?;
    for s in &x.skipped {
        eprintln!("hcabench: {node}:{src}: {s}: left out");
    }
    place(&stage.0.join(&name), &target)?;
    std::mem::replace(&mut rx.progress, Progress::new("", 0)).finish("sha256 checked on both ends");
    Ok(())
}

/// Reads what the guest sends out: base64 lines of the archive, then the END line, then
/// tar's complaints.
struct Receiver {
    line: Vec<u8>,
    /// The END line's checksum and tar status, once it came.
    end: Option<(String, String)>,
    trailer: Vec<u8>,
    hash: Sha256,
    extract: Option<tar::Extract>,
    bytes: u64,
    limit: u64,
    failed: Option<CopyError>,
    progress: Progress,
}

/// The longest line a guest may send: base64 lines are 76 characters.
const MAX_LINE: usize = 4096;

impl Receiver {
    /// Takes what the guest sent; an error is kept in `failed`, and said to the channel.
    fn push(&mut self, b: &[u8]) -> io::Result<()> {
        self.take(b).map_err(|e| {
            let said = e.to_string();
            self.failed = Some(e);
            io::Error::other(said)
        })
    }

    fn take(&mut self, b: &[u8]) -> Result<(), CopyError> {
        let mut decoded = Vec::with_capacity(b.len());
        for &c in b {
            if c != b'\n' {
                if self.line.len() >= MAX_LINE {
                    return Err(CopyError::LineTooLong);
                }
                self.line.push(c);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            if self.end.is_some() {
                let room = MAX_LINE.saturating_sub(self.trailer.len());
                self.trailer.extend(line.iter().chain(b"\n").take(room));
            } else if let Some(rest) = line.strip_prefix(END.as_bytes()) {
                let rest = String::from_utf8_lossy(rest);
                let mut w = rest.split_whitespace();
                let sum = w.next().unwrap_or_default().to_string();
                let status = w.next().unwrap_or_default().to_string();
                self.end = Some((sum, status));
            } else if !line.is_empty() {
                base64::decode_line(&line, &mut decoded).map_err(CopyError::Garbled)?;
            }
        }
        if decoded.is_empty() {
            return Ok(());
        }
        self.bytes += decoded.len() as u64;
        if self.bytes > self.limit {
            return Err(CopyError::TooMuch(self.limit));
        }
        self.hash.update(&decoded);
        self.progress.add(decoded.len() as u64);
        match self.extract.as_mut() {
            Some(x) => Ok(x.feed(&decoded)?),
            None => Ok(()),
        }
    }
}

/// A directory beside the destination that a copy out is unpacked into; removed when
/// dropped, with whatever is left in it.
struct Stage(PathBuf);

impl Stage {
    fn new(parent: &Path) -> Result<Stage, CopyError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = parent.join(format!(".hcabench-cp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(CopyError::host(&dir))?;
        Ok(Stage(dir))
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Moves what was unpacked at `from` to `to`, as `cp -r` would leave it: a new name is a
/// rename, a file replaces a file, a directory merges into a directory.
fn place(from: &Path, to: &Path) -> Result<(), CopyError> {
    let err = CopyError::host(to);
    let from_err = CopyError::host(from);
    let from_dir = fs::symlink_metadata(from).map_err(&from_err)?.is_dir();
    match fs::symlink_metadata(to) {
        Err(_) => fs::rename(from, to).map_err(err),
        Ok(m) if m.is_dir() && from_dir => {
            for e in fs::read_dir(from).map_err(&from_err)? {
                let e = e.map_err(&from_err)?;
                place(&e.path(), &to.join(e.file_name()))?;
            }
            Ok(())
        }
        Ok(m) if m.is_dir() => Err(CopyError::DirThere(to.to_path_buf())),
        Ok(_) if from_dir => Err(CopyError::FileThere(to.to_path_buf())),
        Ok(_) => fs::rename(from, to).map_err(err),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Progress of one transfer on stderr, for transfers of [`SHOW_PROGRESS`] or more: a line
/// that updates itself on a terminal, a line a quarter elsewhere (CI logs).
struct Progress {
    label: String,
    total: u64,
    done: u64,
    started: Instant,
    shown: Instant,
    quarter: u64,
    tty: bool,
}

impl Progress {
    fn new(label: &str, total: u64) -> Progress {
        Progress {
            label: label.to_string(),
            total,
            done: 0,
            started: Instant::now(),
            shown: Instant::now(),
            quarter: 0,
            tty: io::stderr().is_terminal(),
        }
    }

    fn shown(&self) -> bool {
        self.total >= SHOW_PROGRESS
    }

    fn rate(&self) -> String {
        let s = self.started.elapsed().as_secs_f64().max(1e-3);
        format!("{:.0} KiB/s", self.done as f64 / 1024.0 / s)
    }

    fn add(&mut self, n: u64) {
        self.done += n;
        if !self.shown() {
            return;
        }
        // The total may be an estimate (du, out of a guest).
        let pct = (self.done * 100 / self.total.max(1)).min(99);
        if self.tty {
            if self.shown.elapsed() > Duration::from_millis(200) {
                self.shown = Instant::now();
                eprint!(
                    "\r{}: {} of {} ({pct}%), {}   ",
                    self.label,
                    mib(self.done),
                    mib(self.total),
                    self.rate()
                );
            }
        } else if pct / 25 > self.quarter {
            self.quarter = pct / 25;
            eprintln!(
                "{}: {} of {} ({pct}%), {}",
                self.label,
                mib(self.done),
                mib(self.total),
                self.rate()
            );
        }
    }

    fn finish(self, note: &str) {
        if self.shown() {
            eprintln!(
                "{}{}: {} in {:.1?} ({}), {note}",
                if self.tty { "\r" } else { "" },
                self.label,
                mib(self.done),
                self.started.elapsed(),
                self.rate()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_node_colon_path_names_a_guest_as_scp_reads_it() {
        assert_eq!(remote("node1:/tmp/x"), Some(("node1", "/tmp/x")));
        assert_eq!(remote("node2:"), Some(("node2", "")));
        assert_eq!(remote("node1:a:b"), Some(("node1", "a:b")));
        for local in ["/tmp/x", "./a:b", "dir/node1:x", ":x", "plain"] {
            assert_eq!(remote(local), None, "{local}");
        }
    }

    #[test]
    fn test_the_side_that_names_a_guest_sets_the_direction() {
        assert_eq!(
            parse(&args(&["a", "dir/b", "node1:/tmp"])).ok(),
            Some(Transfer::In {
                node: "node1".into(),
                sources: vec!["a".into(), "dir/b".into()],
                dest: "/tmp".into()
            })
        );
        assert_eq!(
            parse(&args(&["f", "node2:"])).ok(),
            Some(Transfer::In {
                node: "node2".into(),
                sources: vec!["f".into()],
                dest: "/".into()
            })
        );
        assert_eq!(
            parse(&args(&["node1:/var/log", "node1:x", "."])).ok(),
            Some(Transfer::Out {
                node: "node1".into(),
                sources: vec!["/var/log".into(), "x".into()],
                dest: ".".into()
            })
        );
    }

    #[test]
    fn test_copies_that_are_not_one_guest_and_the_host_are_refused_with_why() {
        for (a, says) in [
            (&["a", "b"][..], "neither side names a guest"),
            (&["node1:a", "node2:b"][..], "both sides name a guest"),
            (&["node1:a", "b", "c"][..], "mix guest"),
            (&["node1:a", "node2:b", "c"][..], "on node1 and node2"),
            (&["node1:", "c"][..], "after the colon"),
            (&["node1:/tmp"][..], "want SRC... DEST"),
        ] {
            let e = parse(&args(a)).unwrap_err().to_string();
            assert!(e.contains(says), "{a:?}: {e}");
        }
    }

    #[test]
    fn test_guest_targets_follow_what_is_at_the_destination() {
        let dir = std::env::temp_dir().join(format!("hcab-cp-t-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("tree")).unwrap();
        fs::write(dir.join("f"), "x").unwrap();
        let (f, tree) = (dir.join("f"), dir.join("tree"));
        let t = in_targets("node1", &[f.clone(), tree.clone()], "/tmp", &GuestDest::Dir).unwrap();
        assert_eq!(t[0], (f.clone(), "/tmp".into(), "f".into()));
        assert_eq!(t[1], (tree.clone(), "/tmp".into(), "tree".into()));
        let t = in_targets("node1", std::slice::from_ref(&f), "/tmp/g", &GuestDest::New).unwrap();
        assert_eq!(t, [(f.clone(), "/tmp".into(), "g".into())]);
        let t = in_targets("node1", std::slice::from_ref(&f), "g", &GuestDest::File).unwrap();
        assert_eq!(t, [(f.clone(), ".".into(), "g".into())]);
        for (srcs, dest, kind, says) in [
            (
                vec![f.clone()],
                "/no/x",
                GuestDest::NoDir,
                "no directory /no",
            ),
            (
                vec![f.clone(), tree.clone()],
                "/tmp/g",
                GuestDest::New,
                "not a directory",
            ),
            (
                vec![tree.clone()],
                "/etc/passwd",
                GuestDest::File,
                "is a file",
            ),
            (
                vec![f.clone()],
                "/tmp/new/",
                GuestDest::New,
                "no directory /tmp/new/",
            ),
        ] {
            let e = in_targets("node1", &srcs, dest, &kind)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{dest}: {e}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_room_in_a_guest_is_its_free_space_or_its_spare_memory_whichever_is_less() {
        let r = Room::read("40000 4096\nMemAvailable:      98888 kB\n".lines());
        assert_eq!(r.fs, Some(40000 * 4096));
        assert_eq!(r.memory, Some(98888 << 10));
        assert_eq!(r.bytes(), Some((98888 << 10) - RESERVE));
        let r = Room::read("10 4096\ngarbage\n".lines());
        assert_eq!(r.bytes(), Some(40960));
        let r = Room::read("stat: can't\nMemAvailable: 1 kB\n".lines());
        assert_eq!(r.bytes(), Some(0));
        assert_eq!(Room::read("".lines()).bytes(), None);
    }

    #[test]
    fn test_host_destinations_are_checked_before_the_guest_is_asked() {
        let dir = std::env::temp_dir();
        assert!(out_destination(&dir, 3).is_ok());
        assert!(out_destination(&dir.join("new-file"), 1).is_ok());
        let e = out_destination(&dir.join("new-file"), 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
        let e = out_destination(&dir.join("no-such-dir/x"), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such directory"), "{e}");
    }

    #[test]
    fn test_a_copy_out_merges_into_a_directory_and_replaces_a_file() {
        let d = std::env::temp_dir().join(format!("hcab-cp-place-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("from/sub")).unwrap();
        fs::write(d.join("from/sub/new"), "new").unwrap();
        fs::write(d.join("from/same"), "copied").unwrap();
        fs::create_dir_all(d.join("to/sub")).unwrap();
        fs::write(d.join("to/sub/old"), "old").unwrap();
        fs::write(d.join("to/same"), "was").unwrap();
        place(&d.join("from"), &d.join("to")).unwrap();
        assert_eq!(fs::read_to_string(d.join("to/sub/new")).unwrap(), "new");
        assert_eq!(fs::read_to_string(d.join("to/sub/old")).unwrap(), "old");
        assert_eq!(fs::read_to_string(d.join("to/same")).unwrap(), "copied");
        fs::create_dir_all(d.join("dir")).unwrap();
        fs::write(d.join("file"), "f").unwrap();
        let e = place(&d.join("file"), &d.join("dir"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a directory is there"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn test_what_a_guest_sends_out_is_decoded_checked_and_bounded() {
        let data = b"hello, archive".repeat(10);
        let mut want = Sha256::default();
        want.update(&data);
        let mut rx = Receiver {
            line: Vec::new(),
            end: None,
            trailer: Vec::new(),
            hash: Sha256::default(),
            extract: None,
            bytes: 0,
            limit: 1000,
            failed: None,
            progress: Progress::new("t", 0),
        };
        let text = format!(
            "{}{END}{} 0\ntar: a complaint\n",
            base64::encode_lines(&data),
            want.clone().hex()
        );
        // In pieces that cut lines anywhere.
        for piece in text.as_bytes().chunks(7) {
            rx.push(piece).unwrap();
        }
        assert_eq!(rx.end, Some((want.hex(), "0".into())));
        assert_eq!(rx.bytes, data.len() as u64);
        assert_eq!(String::from_utf8_lossy(&rx.trailer), "tar: a complaint\n");
        rx.end = None;
        let e = rx.push(b"not base64!\n").unwrap_err().to_string();
        assert!(e.contains("garbled"), "{e}");
        let e = rx.push(&[b'A'; MAX_LINE + 1]).unwrap_err().to_string();
        assert!(e.contains("too long"), "{e}");
        rx.line.clear();
        let e = rx
            .push(base64::encode_lines(&[0u8; 2000]).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than"), "{e}");
    }
}
