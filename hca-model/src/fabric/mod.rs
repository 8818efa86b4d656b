//! The fabric: an in-process switch keyed by LID, acting as subnet manager (it hands out the
//! LIDs), with one link per port and a hook on every link. It may be cabled as a subnet of
//! several switches (`routing.rs`), whose forwarding tables then decide where a packet
//! gets.
//!
//! Delivery: packets are queued per (destination, source) port in the order their senders
//! produced them (a sender enqueues while holding its own lock) and served round-robin, so a
//! port flooding the fabric delays another's packets by one item each, not by its backlog.
//! Each destination has a lane of its own (its own lock and cache lines: see `Lanes`), so
//! guests whose traffic goes to different ports move it on different cores without meeting.
//! Any thread that pumps delivers items for destinations no other thread is serving, taking
//! one HCA lock at a time: each source's packets reach each destination in order (RC's
//! need), exactly once, deliveries to different ports run in parallel, and no deadlock is
//! possible (no thread waits for an HCA lock while it holds one). Where no hook or tap
//! watches, a device's turn moves what it sent itself before it lets go of its lock, when
//! that overtakes nothing and the receiving port is free (a cut-through: see `Cut`): a
//! message and its ACK then take no queue, no pump and one turn of each port's lock. In
//! the queue too, where no hook or tap watches, a run of one stream's packets (the same
//! sender QP to the same QP) is handed to its port as one burst of at most `MAX_BURST`
//! packets, taken in one turn of the port's lock. An answer sent inside a pump (an ACK, a
//! response) to a port nothing waits for goes to that pump directly (`Fabric::push`).
//!
//! Every packet crosses two links: its source port's uplink and its destination port's
//! downlink, and the [`LinkHook`] sees it on both. Fault injection, capture and remote links
//! attach there (ARCHITECTURE.md section 6).
//!
//! Time: the fabric owns the clock the ports' transport timers run on (RC retransmission,
//! RNR waits) and calls every port's [`PacketSink::tick`] as it advances. A real-time fabric
//! ticks from its own thread every [`TICK`]; a manual one ([`Fabric::with_manual_clock`])
//! moves only when [`Fabric::advance`] says, so tests run timeouts in virtual time. A
//! port's timers do not count the fabric's own stalls (see `clock.rs`): the time its
//! packets wait in the fabric's queue, and the time the host did not run the fabric.
//!
//! The files, one concern each: this one the API (the [`Fabric`] handle, ports attached and
//! detached, [`PacketSink`], delivery outcomes); `link.rs` the links and what watches them
//! ([`LinkHook`], [`PacketTap`]); `lanes.rs` the queue, its lanes and backlog bounds;
//! `pump.rs` the thread-local pump; `cut.rs` the cut-through; `clock.rs` the clock and its
//! tick; `sa_port.rs` the subnet administrator's port and the partitions; `routing.rs` the
//! switches and their routes; `switch_links.rs` the inter-switch links' counters and
//! faults; `remote.rs` the links to other hosts; `user_sm.rs` a user's own SM.

mod clock;
mod cut;
mod lanes;
mod link;
mod pump;
mod remote;
mod routing;
mod sa_port;
mod switch_links;
mod user_sm;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use crate::adapter_hook::AdapterHook;
use crate::packet::Packet;
use crate::partition::PKeyTable;
use crate::sa::{SubnetAdmin, SM_LID};
use crate::sync::{Unpoisoned, UnpoisonedRw};

use clock::Clock;
use lanes::{slot, Item, Lanes};
use link::{Attachment, Stage};
use sa_port::{Partitioning, SaPort};

pub use crate::abi::Lid;
pub use clock::TICK;
pub(crate) use cut::PortNote;
pub use cut::Run;
pub use lanes::{BACKLOG_UNIT, MAX_BACKLOG, MAX_TOTAL_BACKLOG};
pub use link::{LinkDir, LinkHook, LinkId, PacketTap, Verdict};
pub use remote::{RemoteError, RemoteHosts, RemoteStats};
pub use switch_links::SwitchLinkStats;
pub use user_sm::UserSmError;

/// Why a packet did not reach a receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// No port has the destination LID (never attached, or detached: a dead node).
    NoRoute,
    /// A link hook dropped it.
    Hook,
    /// Lost between switches: its route crossed a cut inter-switch link, or a switch's
    /// table had no port for it (a subnet of several switches, `routing.rs`). As on a
    /// lossy link, the sender is not told; its transport timer resends.
    Unrouted,
    /// The receiving HCA had no QP for it, or the QP could not take it.
    Rejected,
}

/// A receiver discarded a packet (no such QP, wrong state, not from the QP's peer, ...),
/// and gives it back unchanged: its sender hears of it. (Boxed: refusals are rare, and the
/// result of every delivery stays small.)
#[derive(Debug)]
pub struct Rejected(pub Box<Packet>);

impl Rejected {
    /// The refusal of `pkt`, given back whole.
    pub fn of(pkt: Packet) -> Self {
        Rejected(Box::new(pkt))
    }
}

/// A LID that is 0 or held by a live port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LidTaken(pub Lid);

impl std::fmt::Display for LidTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LID {} is invalid or already in use on this fabric",
            self.0
        )
    }
}

impl std::error::Error for LidTaken {}

/// What a port does with packets: the HCA side of a link.
pub trait PacketSink: Send + Sync {
    /// Takes one packet; `Err` means the receiver discarded it.
    fn deliver(&self, pkt: Packet) -> Result<(), Rejected>;
    /// Like `deliver`; `more`: the next item queued for this port is a packet of the same
    /// stream (from the same sender QP to the same QP), to be delivered next (by this
    /// thread or another). A port may hold back what the last delivery of such a burst can
    /// send for all of it: one ACK covers every message before it. The fabric says `more`
    /// only where nothing can come between (no hook or tap attached), and never across
    /// streams, so no QP's answer waits behind another QP's traffic.
    fn deliver_in_burst(&self, pkt: Packet, more: bool) -> Result<(), Rejected> {
        let _ = more;
        self.deliver(pkt)
    }
    /// Takes several packets of one stream, in order, as [`PacketSink::deliver_in_burst`]
    /// would one by one (`more` for the last); a port may take them in one turn. Returns
    /// the packets it discarded.
    fn deliver_burst(&self, pkts: Vec<Packet>, more: bool) -> Vec<Rejected> {
        let n = pkts.len();
        let mut rejected = Vec::new();
        for (i, pkt) in pkts.into_iter().enumerate() {
            if let Err(r) = self.deliver_in_burst(pkt, more || i + 1 < n) {
                rejected.push(r);
            }
        }
        rejected
    }
    /// Takes a run of packets for this port from another port's turn (see `Cut`), in
    /// order, each with whether the next is of its stream (as `more` in
    /// [`PacketSink::deliver_in_burst`]), but only if it can without waiting (the caller
    /// holds its own port's lock): None, with nothing taken from `run`, if it is busy.
    /// Otherwise the packets it discarded, and whether its turn left work for more turns
    /// (see [`PacketSink::resume`]).
    fn try_deliver_run(&self, run: &mut Run<'_>) -> Option<(Vec<Rejected>, bool)> {
        let _ = run;
        None
    }
    /// Goes on with work a turn left (`try_deliver_run` said so), waiting for the port.
    fn resume(&self) {}
    /// Hears back about one of its own packets that reached no receiver.
    fn undeliverable(&self, pkt: Packet, why: DropReason);
    /// The fabric's clock reads `now_ns`: fire the timers that are due. Of the time since
    /// the last tick, `stalled_ns` was the fabric's stall for this port, which its transport
    /// timers do not count (see `clock.rs`).
    fn tick(&self, _now_ns: u64, _stalled_ns: u64) {}
    /// The port's GUID (its GID's interface ID), for the subnet administrator.
    fn port_guid(&self) -> Option<u64> {
        None
    }
    /// The port's link went down (false) or came back up (true).
    fn link_changed(&self, _up: bool) {}
    /// The capability bits the port advertises (PortInfo:CapabilityMask), which its driver
    /// sets; the SA's PortInfoRecords show them.
    fn capability_mask(&self) -> u32 {
        0
    }
    /// The fabric has an adapter hook (true) or none (false) from now on: said when the
    /// port is attached and at every change, in order.
    fn adapter_hook_changed(&self, _attached: bool) {}
    /// The port's P_Key table, as the subnet manager set it (see `crate::partition`):
    /// said when the port is attached and whenever the partitions change.
    fn pkeys_changed(&self, _table: &PKeyTable) {}
    /// The port's counters (`CTR_*` order, as QUERY_COUNTERS gives them), if it keeps any.
    fn counters(&self) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        None
    }
    /// The adapter behind the port suffers `fault` (injected): whether it was not in an
    /// error already; None if the port has no adapter that can.
    fn adapter_fault(&self, _fault: AdapterFault) -> Option<bool> {
        None
    }
}

/// A fault of the adapter behind a port, injected by the host (`hcabench fault NODE
/// fatal|reset`, `[[adapter]] fatal_ms|reset_ms` in a plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdapterFault {
    /// A catastrophic error: the device flushes its QPs, reports the error and takes no
    /// more work until its driver resets it.
    Fatal,
    /// A function reset underneath the driver: the device forgets everything at once,
    /// flushes nothing, and waits for its driver's reset.
    Reset,
}

impl AdapterFault {
    /// The word that names it in `hcabench fault` and in fault logs.
    pub fn name(self) -> &'static str {
        match self {
            AdapterFault::Fatal => "fatal",
            AdapterFault::Reset => "reset",
        }
    }
}

/// Delivery counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FabricStats {
    /// Packets that reached a port (those cut through or handed over straight included).
    pub delivered: u64,
    /// Packets whose DLID no port held.
    pub no_route: u64,
    /// Packets a link hook dropped.
    pub hook_dropped: u64,
    /// Packets lost between switches (see [`DropReason::Unrouted`]).
    pub unrouted: u64,
    /// Packets the receiving port refused (no QP, wrong state, not from its peer).
    pub rejected: u64,
}

struct Inner {
    ports: RwLock<Vec<Option<Weak<dyn PacketSink>>>>,
    lanes: Lanes,
    hook: Attachment<dyn LinkHook>,
    tap: Attachment<dyn PacketTap>,
    adapter_hook: Attachment<dyn AdapterHook>,
    stats: Counters,
    clock: Clock,
    /// Packets a hook delayed: (due time, where they resume, the packet).
    held: Mutex<Vec<(u64, Stage, Packet)>>,
    /// The subnet administrator's port, at [`SM_LID`].
    sa: Arc<SaPort>,
    /// LIDs whose link the hook has down (their ports were told).
    links_down: Mutex<Vec<Lid>>,
    /// The partitions beside the default as last set, and the P_Key tables of the ports in
    /// one (the rest have the default table).
    pkeys: RwLock<Partitioning>,
    /// The SA queued trap Reports from where no pump may run (a port attaching or leaving
    /// under its device's lock): the next tick moves them.
    reports_waiting: AtomicBool,
    /// Counts ports attached and detached (see [`PortNote`]).
    port_epoch: AtomicU64,
    /// The clock's reading at the last tick.
    last_tick: AtomicU64,
    /// The switches and their routes, as the SM's last sweep left them (`routing.rs`).
    subnet: RwLock<Arc<crate::subnet::Subnet>>,
    /// The subnet has several switches: packets follow their tables.
    routed: AtomicBool,
    /// An inter-switch link changed: the SM sweeps at the next tick.
    sweep_due: AtomicBool,
    /// Each inter-switch link's counters (`switch_links.rs`).
    trunks: RwLock<Vec<switch_links::Trunk>>,
    /// HCA ports the last sweep found cut off from the SM.
    cut_off: Mutex<Vec<Lid>>,
    /// Where datagrams for other hosts go, on a subnet that spans hosts (`remote.rs`).
    remote: Attachment<dyn RemoteHosts>,
    /// What this host knows of the others.
    hosts: Mutex<remote::Hosts>,
    /// The HCA ports other hosts announced, by LID: (host, port).
    remote_ports: RwLock<std::collections::BTreeMap<Lid, (u16, crate::wire::PortAd)>>,
    remote_counters: remote::Counters,
    /// Port GUID to LID, of the ports here and the ports other hosts announced: the SA
    /// looks a GID up on every join, path query and multicast delivery, which on a subnet
    /// of thousands of ports must not be a walk through all of them.
    guids: RwLock<std::collections::HashMap<u64, Lid>>,
    /// A user's SM manages the subnet (`user_sm.rs`).
    guest_sm: AtomicBool,
    /// What the user's SM set in each switch.
    switch_tables: user_sm::UserTables,
}

#[derive(Default)]
struct Counters {
    delivered: AtomicU64,
    no_route: AtomicU64,
    hook_dropped: AtomicU64,
    unrouted: AtomicU64,
    rejected: AtomicU64,
}

/// A switched fabric. Cheap to clone; all clones are the same fabric.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<Inner>,
}

impl Default for Fabric {
    fn default() -> Self {
        Self::new()
    }
}

impl Fabric {
    /// A fabric on the real clock, with a thread that runs its timers (it ends when the
    /// last clone of the fabric is dropped).
    pub fn new() -> Self {
        let f = Self::with_clock(Clock::Real(Instant::now()));
        let weak = Arc::downgrade(&f.inner);
        let spawned = std::thread::Builder::new()
            .name("fabric-timer".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                Fabric { inner }.tick();
            });
        if let Err(e) = spawned {
            log::error!("fabric timer thread: {e}; RC retransmission will not run");
        }
        f
    }

    /// A fabric whose clock stands still until [`Fabric::advance`]: timeouts in virtual time.
    pub fn with_manual_clock() -> Self {
        Self::with_clock(Clock::Manual(AtomicU64::new(0)))
    }

    fn with_clock(clock: Clock) -> Self {
        Self {
            inner: Arc::new_cyclic(|weak| Inner {
                ports: RwLock::new(vec![None]),
                lanes: Lanes::new(),
                hook: Attachment::default(),
                tap: Attachment::default(),
                adapter_hook: Attachment::default(),
                stats: Counters::default(),
                clock,
                held: Mutex::new(Vec::new()),
                sa: Arc::new(SaPort {
                    fabric: weak.clone(),
                    sa: Mutex::new(SubnetAdmin::new()),
                    pma: Mutex::default(),
                }),
                links_down: Mutex::new(Vec::new()),
                pkeys: RwLock::new((Vec::new(), Vec::new())),
                reports_waiting: AtomicBool::new(false),
                port_epoch: AtomicU64::new(0),
                last_tick: AtomicU64::new(0),
                subnet: RwLock::new(Arc::new(crate::subnet::Subnet::new(
                    crate::subnet::Topology::single(),
                    &[],
                ))),
                routed: AtomicBool::new(false),
                sweep_due: AtomicBool::new(false),
                trunks: RwLock::default(),
                cut_off: Mutex::new(Vec::new()),
                remote: Attachment::default(),
                hosts: Mutex::default(),
                remote_ports: RwLock::default(),
                remote_counters: remote::Counters::default(),
                guids: RwLock::default(),
                guest_sm: AtomicBool::new(false),
                switch_tables: RwLock::default(),
            }),
        }
    }

    /// Attaches a port and assigns it the next free LID (node number k gets LID k).
    pub fn attach(&self, sink: Weak<dyn PacketSink>) -> Lid {
        let lid = {
            let mut ports = self.inner.ports.write_unpoisoned();
            let lid = ports.len() as Lid;
            self.tell_adapter_hook(&sink);
            self.set_port(lid, Some(sink.clone()));
            ports.push(Some(sink.clone()));
            lid
        };
        // Told outside the port table's lock: the port takes its device's lock to hear it.
        self.tell_pkeys(lid, &sink);
        self.index_guid(lid, &sink);
        self.sweep_lid(lid, true);
        self.user_sm_link_changed(lid);
        self.report_port(lid, true);
        lid
    }

    /// Attaches a port at a given LID (a node coming back keeps its LID). Fails if a live port
    /// holds that LID already.
    pub fn attach_at(&self, lid: Lid, sink: Weak<dyn PacketSink>) -> Result<(), LidTaken> {
        let mut ports = self.inner.ports.write_unpoisoned();
        // 0 is no LID; the SM's and the multicast LIDs are not a port's.
        if lid == 0 || lid >= SM_LID {
            return Err(LidTaken(lid));
        }
        if ports.len() <= lid as usize {
            ports.resize(lid as usize + 1, None);
        }
        let Some(slot) = ports.get_mut(lid as usize) else {
            return Err(LidTaken(lid));
        };
        if slot.as_ref().is_some_and(|w| w.strong_count() > 0) {
            return Err(LidTaken(lid));
        }
        self.tell_adapter_hook(&sink);
        self.set_port(lid, Some(sink.clone()));
        *slot = Some(sink.clone());
        drop(ports);
        // (Outside the port table's lock, as in `attach`.)
        self.tell_pkeys(lid, &sink);
        // A new port starts up; the next tick tells it if its link is down.
        self.inner
            .links_down
            .lock_unpoisoned()
            .retain(|&l| l != lid);
        self.index_guid(lid, &sink);
        self.sweep_lid(lid, true);
        self.user_sm_link_changed(lid);
        self.report_port(lid, true);
        Ok(())
    }

    /// Takes a port off the fabric: packets for its LID are then undeliverable. The SA
    /// reports its GID out of service to subscribers.
    pub fn detach(&self, lid: Lid) {
        self.report_port(lid, false);
        {
            let mut ports = self.inner.ports.write_unpoisoned();
            if let Some(p) = ports.get_mut(lid as usize) {
                *p = None;
                self.set_port(lid, None);
            }
        }
        self.inner.guids.write_unpoisoned().retain(|_, l| *l != lid);
        self.sweep_lid(lid, false);
        self.user_sm_link_changed(lid);
    }

    /// Keeps the GUID of the port just attached at `lid` in the index.
    fn index_guid(&self, lid: Lid, sink: &Weak<dyn PacketSink>) {
        if let Some(guid) = sink.upgrade().and_then(|s| s.port_guid()) {
            let mut g = self.inner.guids.write_unpoisoned();
            g.retain(|_, l| *l != lid);
            g.insert(guid, lid);
        }
    }

    /// The LID the index has for port GUID `guid`.
    pub(super) fn indexed_lid(&self, guid: u64) -> Option<Lid> {
        self.inner.guids.read_unpoisoned().get(&guid).copied()
    }

    /// Faults for the HCAs on this fabric (see adapter_hook.rs).
    pub fn set_adapter_hook(&self, hook: Option<Arc<dyn AdapterHook>>) {
        let attached = hook.is_some();
        // Ports keep whether there is one without asking the fabric (an HCA's receive
        // doorbell needs no turn unless a hook is to see it): each hears of the change
        // under the ports' lock, which orders it with every other change and attachment.
        let ports = self.inner.ports.write_unpoisoned();
        self.inner.adapter_hook.set(hook);
        let sinks: Vec<Arc<dyn PacketSink>> =
            ports.iter().flatten().filter_map(Weak::upgrade).collect();
        for s in &sinks {
            s.adapter_hook_changed(attached);
        }
        drop(ports);
    }

    /// Tells a port being attached (the caller holds the ports' lock) whether there is an
    /// adapter hook.
    fn tell_adapter_hook(&self, sink: &Weak<dyn PacketSink>) {
        if let Some(s) = sink.upgrade() {
            s.adapter_hook_changed(self.inner.adapter_hook.is_set());
        }
    }

    /// The adapter-fault hook the fabric's HCAs consult, if one is set.
    pub fn adapter_hook(&self) -> Option<Arc<dyn AdapterHook>> {
        self.inner.adapter_hook.get()
    }

    /// Whether an adapter hook is attached (one load; [`Fabric::adapter_hook`] gives it).
    #[inline]
    pub(crate) fn has_adapter_hook(&self) -> bool {
        self.inner.adapter_hook.is_set()
    }

    /// The fabric's delivery counters so far.
    pub fn stats(&self) -> FabricStats {
        let c = &self.inner.stats;
        FabricStats {
            delivered: c.delivered.load(Relaxed)
                + (self.inner.lanes.all())
                    .map(|(_, l)| l.lock().delivered + l.cut_delivered.load(Relaxed))
                    .sum::<u64>(),
            no_route: c.no_route.load(Relaxed),
            hook_dropped: c.hook_dropped.load(Relaxed),
            unrouted: c.unrouted.load(Relaxed),
            rejected: c.rejected.load(Relaxed),
        }
    }

    /// Whether `other` is this fabric (a clone of its handle).
    pub(crate) fn same(&self, other: &Fabric) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// This fabric's identity, for [`QUEUED_TO`].
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The counters of the port at `lid` (`CTR_*` order), if a port there keeps them.
    pub fn counters(&self, lid: Lid) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        self.port(lid)?.counters()
    }

    /// The adapter at `lid` suffers `fault` (`hcabench fault NODE fatal|reset`): whether it
    /// was not in an error already (since its driver last reset it); None if no adapter
    /// there can.
    pub fn adapter_fault(&self, lid: Lid, fault: AdapterFault) -> Option<bool> {
        self.port(lid)?.adapter_fault(fault)
    }

    fn port(&self, lid: Lid) -> Option<Arc<dyn PacketSink>> {
        // The SA and SM's port; a directed-route SMP's first hop is the switch it runs on.
        // Every switch's management port is the SM's to answer (`sa::sm`).
        if lid > crate::subnet::MAX_HCA_LID {
            let switch = lid == crate::sa::sm::PERMISSIVE_LID
                || (!self.routed() && lid == SM_LID)
                || (self.routed() && {
                    let s = self.subnet();
                    s.switch_at(lid).is_some_and(|sw| s.is_local(sw))
                });
            if switch {
                return Some(self.inner.sa.clone());
            }
        }
        let ports = self.inner.ports.read_unpoisoned();
        ports.get(lid as usize)?.as_ref()?.upgrade()
    }

    fn deliver(&self, dst: &Arc<dyn PacketSink>, pkt: Packet, more: bool) {
        if self.hand_over(dst, pkt, more) {
            self.inner.stats.delivered.fetch_add(1, Relaxed);
        }
    }

    /// Gives `pkt` to its port: whether the port took it (one it refused goes back to its
    /// sender as a notice, headers only).
    fn hand_over(&self, dst: &Arc<dyn PacketSink>, pkt: Packet, more: bool) -> bool {
        match dst.deliver_in_burst(pkt, more) {
            Ok(()) => true,
            Err(Rejected(pkt)) => {
                self.bounce(*pkt, DropReason::Rejected);
                false
            }
        }
    }

    fn bounce(&self, pkt: Packet, why: DropReason) {
        let c = &self.inner.stats;
        match why {
            DropReason::NoRoute => c.no_route.fetch_add(1, Relaxed),
            DropReason::Hook => c.hook_dropped.fetch_add(1, Relaxed),
            DropReason::Unrouted => c.unrouted.fetch_add(1, Relaxed),
            DropReason::Rejected => c.rejected.fetch_add(1, Relaxed),
        };
        let mut pkt = pkt;
        pkt.payload = Default::default();
        // Back to its sender, behind what the port it was for has already sent there (an
        // ACK on its way arrives first, as it would before the sender's timeout).
        let (dst, src) = (slot(pkt.slid), slot(pkt.dlid) as Lid);
        self.push(dst, src, Item::Bounce(Box::new((pkt, why))));
    }
}
