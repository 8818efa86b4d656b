//! The one cluster every test in this binary shares: booted by the first test that asks for
//! it, with ib0 up on every node (datagram mode), and handed to one test at a time.
//!
//! libtest runs tests in threads, several at once. Each test here takes a turn
//! ([`cluster`]) and holds the cluster until it returns (or fails); the turns go in the order
//! of the tests' names, which is the order libtest starts them in, so a run of the whole
//! binary goes the same way every time (as `--test-threads=1` would). A test that changes
//! the fabric or a guest puts it back before it returns; a fault hook or capture tap a
//! failed test left behind is taken off when the next turn begins.
//!
//! The cluster is a `static`, which Rust never drops: an `atexit` handler kills its guests
//! and removes its directory when the test binary exits.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Instant;

use cluster::verbs::Testbed;
use e2e::{image_or_skip, BOOT_TIMEOUT};

use crate::{addr, wait_members, NODES, PACKET_LIFE, PARTITION, RAM_MIB, T};

/// The booted cluster and what its tests set up on it once for all.
pub struct Shared {
    pub tb: Testbed,
    /// What `nvmeof target` printed on node 3, once it exports its RAM disk over NVMe-oF
    /// (`nvmeof::target`): once per boot, as nvmet-rdma's SRQ mode must be its first target.
    pub nvmeof_target: Option<String>,
}

enum State {
    Unbooted,
    Up(Box<Shared>),
    Failed(String),
}

static CLUSTER: Mutex<State> = Mutex::new(State::Unbooted);
static TURNS: Turns = Turns {
    state: Mutex::new(TurnState {
        busy: false,
        waiting: BTreeSet::new(),
    }),
    changed: Condvar::new(),
};

/// Who holds the cluster, and who waits for it (by test name).
struct Turns {
    state: Mutex<TurnState>,
    changed: Condvar,
}

struct TurnState {
    busy: bool,
    waiting: BTreeSet<String>,
}

impl Turns {
    /// Puts `test` among those waiting for the cluster.
    fn queue(&self, test: &str) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.waiting.insert(test.to_string());
    }

    /// Waits until no test holds the cluster and `test` is the first, by name, of those
    /// waiting; then `test` holds it.
    fn take(&self, test: &str) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while s.busy || s.waiting.first().map(String::as_str) != Some(test) {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.waiting.remove(test);
        s.busy = true;
    }

    /// Takes `test` off the queue (a test that failed before its turn came), if it is
    /// still there.
    fn leave(&self, test: &str) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.waiting.remove(test) {
            self.changed.notify_all();
        }
    }

    fn give_back(&self) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.busy = false;
        self.changed.notify_all();
    }
}

/// A test's turn on the shared cluster: derefs to it, and hands it on when dropped (also
/// when the test fails).
pub struct Turn {
    state: MutexGuard<'static, State>,
    test: String,
    since: Instant,
}

impl std::ops::Deref for Turn {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        match &*self.state {
            State::Up(s) => s,
            _ => unreachable!("a turn is handed out only on a cluster that is up"),
        }
    }
}

impl std::ops::DerefMut for Turn {
    fn deref_mut(&mut self) -> &mut Shared {
        match &mut *self.state {
            State::Up(s) => s,
            _ => unreachable!("a turn is handed out only on a cluster that is up"),
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Which protocol takes the time (seen with --nocapture, or under a failure).
        let secs = self.since.elapsed().as_secs_f64();
        eprintln!("ulps: {} held the cluster {secs:.1} s", self.test);
        TURNS.give_back();
    }
}

/// A test on the queue, taken off it if it fails (the boot panics) before its turn.
struct Queued<'a>(&'a str);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        TURNS.leave(self.0);
    }
}

/// The shared cluster, booted on first use, for test `test` (its name in a skip or a
/// failure) when its turn comes; None after saying why there is no image or QEMU (see
/// `e2e::image_or_skip`).
pub fn cluster(test: &str) -> Option<Turn> {
    let image = image_or_skip(test)?;
    // libtest names each test's thread for the test, and starts them in the order of their
    // names. Every test it has started queues before the cluster boots, so the first of
    // them by name goes first.
    let current = std::thread::current();
    let name = current.name().unwrap_or(test);
    TURNS.queue(name);
    let queued = Queued(name);
    {
        let mut state = CLUSTER.lock().unwrap_or_else(PoisonError::into_inner);
        if let State::Unbooted = *state {
            // SAFETY: `shut_down` is an `extern "C" fn()` as atexit takes; it uses only
            // this file's statics, which live as long as the process.
            unsafe { libc::atexit(shut_down) };
            let since = Instant::now();
            *state = match boot(&image) {
                Ok(s) => State::Up(Box::new(s)),
                Err(why) => State::Failed(why),
            };
            eprintln!(
                "ulps: boot and ib0 up: {:.1} s",
                since.elapsed().as_secs_f64()
            );
        }
    }
    TURNS.take(name);
    drop(queued);
    let turn = Turn {
        state: CLUSTER.lock().unwrap_or_else(PoisonError::into_inner),
        test: test.to_string(),
        since: Instant::now(),
    };
    if let State::Failed(why) = &*turn.state {
        panic!("{test}: the shared cluster did not come up: {why}");
    }
    // As the test found it if the last one failed half-way: no faults, no capture.
    let fabric = turn.tb.fabric().clone();
    fabric.set_hook(None);
    fabric.set_tap(None);
    Some(turn)
}

/// Three guests of `RAM_MIB` with partition 1 (nodes 1 and 2), the subnet's packet lifetime
/// `PACKET_LIFE`, and ib0 up in datagram mode on every node, each in the broadcast group.
fn boot(image: &cluster::Image) -> Result<Shared, String> {
    let spec = cluster::ClusterSpec {
        packet_life: PACKET_LIFE,
        // The storage tests share this cluster, and each leaves its protocol's buffers
        // behind. At 256 MiB node 3 had 4.7 MiB free when NFS under drops began (after 32 MiB
        // in its NVMe-oF RAM disk, 26 MiB of RDS rings and pools, 25 MiB of NFS client, over
        // a 62 MiB root file system in RAM), and CI saw its kernel OOM-kill the write there.
        ram_mib: RAM_MIB,
        // Partition 1 holds node1 and node2; node3 is in the default partition only.
        partitions: vec![cluster::PartitionSpec {
            pkey: PARTITION,
            members: vec!["node1".into(), "node2".into()],
            limited: vec![],
        }],
        // A NIC each, on one Ethernet segment (`ethernet.rs`); down until a test brings it up.
        link: true,
        ..e2e::qemu_spec(image, "ulps", NODES)
    };
    let mut tb =
        Testbed::boot(&spec, BOOT_TIMEOUT, &mut |_| {}).map_err(|e| format!("boot: {e}"))?;
    // ib0 comes up with carrier on every node: the SA answered the broadcast join.
    for i in 0..NODES {
        let out = tb.agents[i]
            .run(&format!("ipoib-up {}/24", addr(i)), T)
            .map_err(|e| format!("node{}: ipoib-up: {e}\n{}", i + 1, tb.console(i)))?;
        if !out.contains("LOWER_UP") {
            return Err(format!("node{}: ib0 has no carrier: {out}", i + 1));
        }
        let mode = tb.agents[i]
            .run("cat /sys/class/net/ib0/mode", T)
            .map_err(|e| format!("node{}: {e}", i + 1))?;
        if mode.trim() != "datagram" {
            return Err(format!("node{}: ib0 in mode {mode}", i + 1));
        }
    }
    wait_members(&tb, NODES);
    Ok(Shared {
        tb,
        nvmeof_target: None,
    })
}

/// Kills the shared cluster's guests and removes its directory, as the process exits.
extern "C" fn shut_down() {
    let mut state = match CLUSTER.try_lock() {
        Ok(state) => state,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        // A test still holds it (the process exits from elsewhere): leave it.
        Err(TryLockError::WouldBlock) => return,
    };
    *state = State::Unbooted;
}
