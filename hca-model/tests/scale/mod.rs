//! A subnet at scale, model only: a leaf-spine fabric of many switches with a light port on
//! every HCA LID in place of a full HCA (it names its GUID and keeps what reaches it, so a
//! thousand of them cost next to nothing), the MADs IPoIB and rdma_cm send the SA, and the
//! checks of what the SM programmed. Shared by `tests/subnet_scale.rs` (behaviour, in CI)
//! and `benches/subnet.rs` (timings).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use hca_model::abi::{node_guid, Lid, GSI_QPN};
use hca_model::fabric::{DropReason, PacketSink, Rejected};
use hca_model::packet::{Packet, Payload, UD_SEND_ONLY};
use hca_model::sa::mad::{self, at, attr, class, method, SA_CLASS_VERSION};
use hca_model::sa::{port_gid, IPOIB_BROADCAST_MGID, SM_LID};
use hca_model::subnet::{Peer, Subnet, SwitchSpec, Topology, NO_PORT};
use hca_model::Fabric;

/// IPoIB's Q_Key for the default partition's groups.
pub const IPOIB_QKEY: u32 = 0x0b;

/// A two-level fat tree: `leaves` leaf switches with `per_leaf` HCA ports each (LIDs 1, 2,
/// ... leaf by leaf), and `spines` spine switches, every leaf linked once to every spine.
/// Switch `i < leaves` is leaf `i` (leaf 0 carries the SM, as a host-run SM hangs off a
/// leaf), the spines follow; link `leaf * spines + spine` joins the two.
#[derive(Clone, Copy, Debug)]
pub struct LeafSpine {
    pub leaves: usize,
    pub spines: usize,
    pub per_leaf: usize,
}

impl LeafSpine {
    pub fn ports(&self) -> usize {
        self.leaves * self.per_leaf
    }

    pub fn switches(&self) -> usize {
        self.leaves + self.spines
    }

    pub fn links(&self) -> usize {
        self.leaves * self.spines
    }

    /// Every HCA LID, ascending.
    pub fn lids(&self) -> Vec<Lid> {
        (1..=self.ports() as Lid).collect()
    }

    /// The leaf the HCA port at `lid` hangs on.
    pub fn leaf_of(&self, lid: Lid) -> usize {
        (usize::from(lid) - 1) / self.per_leaf
    }

    /// The link between a leaf and a spine (by its index among the spines).
    pub fn link(&self, leaf: usize, spine: usize) -> usize {
        leaf * self.spines + spine
    }

    pub fn topology(&self) -> Topology {
        let mut switches: Vec<SwitchSpec> = (0..self.leaves)
            .map(|l| SwitchSpec {
                name: format!("leaf{l}"),
                hcas: (1 + l * self.per_leaf..=(l + 1) * self.per_leaf)
                    .map(|x| x as Lid)
                    .collect(),
            })
            .collect();
        switches.extend((0..self.spines).map(|s| SwitchSpec {
            name: format!("spine{s}"),
            hcas: Vec::new(),
        }));
        let links = (0..self.leaves)
            .flat_map(|l| (0..self.spines).map(move |s| (l, self.leaves + s)))
            .collect();
        Topology::new(switches, links).expect("a leaf-spine cabling is valid")
    }

    /// Hops between every pair of switches over the links not in `cut`, found here by a
    /// search of the cabling (not the model's): what min-hop routing must match.
    pub fn distances(&self, cut: &[usize]) -> Vec<Vec<Option<usize>>> {
        let n = self.switches();
        let mut adj = vec![Vec::new(); n];
        for l in 0..self.leaves {
            for s in 0..self.spines {
                if !cut.contains(&self.link(l, s)) {
                    adj[l].push(self.leaves + s);
                    adj[self.leaves + s].push(l);
                }
            }
        }
        (0..n)
            .map(|from| {
                let mut d = vec![None; n];
                d[from] = Some(0);
                let mut q = VecDeque::from([from]);
                while let Some(s) = q.pop_front() {
                    for &t in &adj[s] {
                        if d[t].is_none() {
                            d[t] = Some(d[s].unwrap() + 1);
                            q.push_back(t);
                        }
                    }
                }
                d
            })
            .collect()
    }
}

/// A port that keeps what reaches it: each packet's (SLID, DLID, PSN), and the SA's MADs.
pub struct Port {
    pub lid: Lid,
    got: Mutex<Vec<(Lid, Lid, u32)>>,
    mads: Mutex<Vec<Vec<u8>>>,
    /// Its own packets the fabric gave back (no route, lost between switches).
    lost: AtomicU64,
}

impl Port {
    fn new(lid: Lid) -> Self {
        Self {
            lid,
            got: Mutex::default(),
            mads: Mutex::default(),
            lost: AtomicU64::new(0),
        }
    }

    /// The packets that reached it since the last call.
    pub fn take_got(&self) -> Vec<(Lid, Lid, u32)> {
        std::mem::take(&mut *self.got.lock().unwrap())
    }

    /// The MADs the SA sent it since the last call.
    pub fn take_mads(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.mads.lock().unwrap())
    }

    pub fn lost(&self) -> u64 {
        self.lost.load(Relaxed)
    }
}

impl PacketSink for Port {
    fn deliver(&self, pkt: Packet) -> Result<(), Rejected> {
        match pkt.payload {
            Payload::Bytes(mad) if pkt.slid == SM_LID => self.mads.lock().unwrap().push(mad),
            _ => (self.got.lock().unwrap()).push((pkt.slid, pkt.dlid, pkt.psn)),
        }
        Ok(())
    }

    fn undeliverable(&self, _pkt: Packet, _why: DropReason) {
        self.lost.fetch_add(1, Relaxed);
    }

    fn port_guid(&self) -> Option<u64> {
        Some(node_guid(self.lid))
    }
}

/// A fabric on the manual clock cabled as `shape`, with no port yet.
pub fn cabled(shape: &LeafSpine) -> Fabric {
    let fabric = Fabric::with_manual_clock();
    fabric.set_topology(shape.topology());
    fabric
}

/// Attaches a port at each of LIDs 1 to `n`, in order (the fabric hands them out so).
pub fn attach_all(fabric: &Fabric, n: usize) -> Vec<Arc<Port>> {
    (1..=n as Lid)
        .map(|lid| {
            let p = Arc::new(Port::new(lid));
            let sink: Weak<dyn PacketSink> = Arc::downgrade(&p) as Weak<dyn PacketSink>;
            assert_eq!(fabric.attach(sink), lid);
            p
        })
        .collect()
}

/// A small deterministic generator (splitmix64): the same pairs every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A LID of 1 to `n`.
    pub fn lid(&mut self, n: usize) -> Lid {
        (self.next() % n as u64) as Lid + 1
    }

    /// `count` pairs of distinct LIDs of 1 to `n`.
    pub fn pairs(&mut self, n: usize, count: usize) -> Vec<(Lid, Lid)> {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let (a, b) = (self.lid(n), self.lid(n));
            if a != b {
                out.push((a, b));
            }
        }
        out
    }
}

/// Every ordered pair of distinct LIDs among `lids`.
pub fn all_pairs(lids: &[Lid]) -> Vec<(Lid, Lid)> {
    (lids.iter())
        .flat_map(|&a| lids.iter().filter(move |&&b| b != a).map(move |&b| (a, b)))
        .collect()
}

/// `per_leaf` LIDs from each leaf (its first, its last, and between), for checks of every
/// pair among them.
pub fn subset(shape: &LeafSpine, per_leaf: usize) -> Vec<Lid> {
    (0..shape.leaves)
        .flat_map(|l| {
            let first = 1 + l * shape.per_leaf;
            let step = (shape.per_leaf - 1) / (per_leaf - 1).max(1);
            (0..per_leaf.min(shape.per_leaf)).map(move |i| (first + i * step) as Lid)
        })
        .collect()
}

// SA component mask bits (IBA 15.2.5.17 MCMemberRecord, 15.2.5.16 PathRecord).
const MC_MGID: u64 = 1 << 0;
const MC_PORT_GID: u64 = 1 << 1;
const MC_PKEY: u64 = 1 << 7;
const MC_JOIN_STATE: u64 = 1 << 16;
const PR_DGID: u64 = 1 << 2;
const PR_SGID: u64 = 1 << 3;
const PR_DLID: u64 = 1 << 4;
const PR_SLID: u64 = 1 << 5;
const PR_PKEY: u64 = 1 << 13;

fn sa_request(method: u8, attr: u16, comp_mask: u64, tid: u64) -> [u8; mad::MAD_SIZE] {
    let mut m = mad::header(class::SUBN_ADM, SA_CLASS_VERSION, method, tid, attr);
    m[at::SA_COMP_MASK..at::SA_COMP_MASK + 8].copy_from_slice(&comp_mask.to_be_bytes());
    m
}

/// The join IPoIB sends when its interface comes up: MCMemberRecord Set of the broadcast
/// group, full member, from QP1 of the port at `lid`.
pub fn join_broadcast(lid: Lid, tid: u64) -> Packet {
    let mut m = sa_request(
        method::SET,
        attr::sa::MCMEMBER_RECORD,
        MC_MGID | MC_PORT_GID | MC_PKEY | MC_JOIN_STATE,
        tid,
    );
    let d = at::SA_DATA;
    m[d..d + 16].copy_from_slice(&IPOIB_BROADCAST_MGID);
    m[d + 16..d + 32].copy_from_slice(&port_gid(node_guid(lid)));
    m[d + 40..d + 42].copy_from_slice(&0xffffu16.to_be_bytes());
    m[d + 48] = 1; // full member
    mad::to_sa(lid, GSI_QPN, m.to_vec())
}

/// A PathRecord Get from the port at `src` to the one at `dst`: by LIDs, or by GIDs and
/// P_Key as IPoIB's and rdma_cm's path queries name them.
pub fn path_query(src: Lid, dst: Lid, by_gid: bool, tid: u64) -> Packet {
    let mask = if by_gid {
        PR_DGID | PR_SGID | PR_PKEY
    } else {
        PR_DLID | PR_SLID
    };
    let mut m = sa_request(method::GET, attr::sa::PATH_RECORD, mask, tid);
    let d = at::SA_DATA;
    m[d + 8..d + 24].copy_from_slice(&port_gid(node_guid(dst)));
    m[d + 24..d + 40].copy_from_slice(&port_gid(node_guid(src)));
    m[d + 40..d + 42].copy_from_slice(&dst.to_be_bytes());
    m[d + 42..d + 44].copy_from_slice(&src.to_be_bytes());
    m[d + 50..d + 52].copy_from_slice(&0xffffu16.to_be_bytes());
    mad::to_sa(src, GSI_QPN, m.to_vec())
}

fn be16(m: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([m[at], m[at + 1]])
}

fn tid_of(m: &[u8]) -> u64 {
    u64::from_be_bytes(m[at::TID..at::TID + 8].try_into().unwrap())
}

/// Checks that the port at `lid` got one answer to its join `tid`: a successful GetResp
/// naming the broadcast group, its port and the group's MLID `mlid`.
pub fn check_join(port: &Port, tid: u64, mlid: Lid) {
    let mads = port.take_mads();
    assert_eq!(mads.len(), 1, "LID {}: one answer", port.lid);
    let m = &mads[0];
    let d = at::SA_DATA;
    assert_eq!(
        (m[at::METHOD], be16(m, at::STATUS), tid_of(m)),
        (method::GET_RESP, 0, tid),
        "LID {}: GetResp, success, its TID",
        port.lid
    );
    assert_eq!(m[d..d + 16], IPOIB_BROADCAST_MGID);
    assert_eq!(m[d + 16..d + 32], port_gid(node_guid(port.lid)));
    assert_eq!(be16(m, d + 36), mlid, "LID {}: the group's MLID", port.lid);
}

/// Checks the answers `port` got to its path queries `(dst, tid)`, in any order: each a
/// successful GetResp of the one path from it to `dst`.
pub fn check_paths(port: &Port, asked: &[(Lid, u64)]) {
    let mut mads = port.take_mads();
    assert_eq!(mads.len(), asked.len(), "LID {}: every answer", port.lid);
    mads.sort_by_key(|m| tid_of(m));
    let mut asked = asked.to_vec();
    asked.sort_by_key(|&(_, tid)| tid);
    let d = at::SA_DATA;
    for (m, &(dst, tid)) in mads.iter().zip(&asked) {
        assert_eq!(
            (m[at::METHOD], be16(m, at::STATUS), tid_of(m)),
            (method::GET_RESP, 0, tid),
            "LID {} to {dst}",
            port.lid
        );
        assert_eq!(m[d + 8..d + 24], port_gid(node_guid(dst)), "DGID");
        assert_eq!(m[d + 24..d + 40], port_gid(node_guid(port.lid)), "SGID");
        assert_eq!((be16(m, d + 40), be16(m, d + 42)), (dst, port.lid));
    }
}

/// Queues a PathRecord Get from every port to `per_port` others picked by `rng` (by GIDs or
/// by LIDs): what each port asked, as `(dst, tid)`, for [`check_all_paths`].
pub fn queue_paths(
    fabric: &Fabric,
    ports: &[Arc<Port>],
    per_port: usize,
    by_gid: bool,
    rng: &mut Rng,
) -> Vec<Vec<(Lid, u64)>> {
    let n = ports.len();
    let mut tid = 0;
    (ports.iter())
        .map(|p| {
            (0..per_port)
                .map(|_| {
                    let dst = loop {
                        let d = rng.lid(n);
                        if d != p.lid {
                            break d;
                        }
                    };
                    tid += 1;
                    fabric.enqueue(path_query(p.lid, dst, by_gid, tid));
                    (dst, tid)
                })
                .collect()
        })
        .collect()
}

/// Checks every port's answers to what [`queue_paths`] asked.
pub fn check_all_paths(ports: &[Arc<Port>], asked: &[Vec<(Lid, u64)>]) {
    for (p, asked) in ports.iter().zip(asked) {
        check_paths(p, asked);
    }
}

/// A datagram from the port at `src` to the one at `dst`, tagged `tag` (its PSN).
pub fn datagram(src: Lid, dst: Lid, tag: u32) -> Packet {
    Packet {
        slid: src,
        dlid: dst,
        opcode: UD_SEND_ONLY,
        dest_qpn: 2,
        src_qpn: 2,
        qkey: IPOIB_QKEY,
        psn: tag,
        ..Default::default()
    }
}

/// Sends one tagged datagram for each pair at once, pumps, and checks that each reached
/// its destination and no other port, and none was lost.
pub fn send_and_check(fabric: &Fabric, ports: &[Arc<Port>], pairs: &[(Lid, Lid)]) {
    for p in ports {
        p.take_got();
    }
    let lost: u64 = ports.iter().map(|p| p.lost()).sum();
    for (tag, &(a, b)) in pairs.iter().enumerate() {
        fabric.enqueue(datagram(a, b, tag as u32));
    }
    fabric.pump();
    let mut want: Vec<Vec<(Lid, Lid, u32)>> = vec![Vec::new(); ports.len()];
    for (tag, &(a, b)) in pairs.iter().enumerate() {
        want[usize::from(b) - 1].push((a, b, tag as u32));
    }
    for (p, want) in ports.iter().zip(&mut want) {
        let mut got = p.take_got();
        got.sort_unstable_by_key(|&(_, _, tag)| tag);
        want.sort_unstable_by_key(|&(_, _, tag)| tag);
        assert_eq!(&got, want, "what reached LID {}", p.lid);
    }
    assert_eq!(
        ports.iter().map(|p| p.lost()).sum::<u64>(),
        lost,
        "none lost"
    );
}

/// Checks that the route of each pair crosses the switches min-hop routing predicts (over
/// the links not in `cut`): out of the source's switch port, through as many switches as
/// the cabling's shortest path between the two leaves, into the destination's port.
pub fn check_routes(subnet: &Subnet, shape: &LeafSpine, cut: &[usize], pairs: &[(Lid, Lid)]) {
    let dist = shape.distances(cut);
    for &(a, b) in pairs {
        let route = subnet
            .route(a, b)
            .unwrap_or_else(|| panic!("{a} reaches {b}"));
        let (la, lb) = (shape.leaf_of(a), shape.leaf_of(b));
        assert_eq!(
            route.len(),
            dist[la][lb].unwrap() + 1,
            "{a} to {b}: min-hop"
        );
        let (first, last) = (route[0], route[route.len() - 1]);
        assert_eq!((first.sw, first.port_in), subnet.attachment(a).unwrap());
        assert_eq!((last.sw, last.port_out), subnet.attachment(b).unwrap());
        for w in route.windows(2) {
            match subnet.peer(w[0].sw, w[0].port_out) {
                Peer::Switch { sw, port, link } => {
                    assert_eq!((sw, port), (w[1].sw, w[1].port_in), "{a} to {b}");
                    assert!(!cut.contains(&link), "{a} to {b} over cut link {link}");
                }
                other => panic!("{a} to {b}: switch {} leads to {other:?}", w[0].sw),
            }
        }
    }
}

/// Walks every entry of every switch's forwarding table, block by block as the SMA gives
/// them, from that switch to the LID: each leads there, by a min-hop path over the links
/// not in `cut`; every port's LID and every switch's has an entry in every switch, and
/// no other LID has one. Returns how many entries it walked.
pub fn check_tables(subnet: &Subnet, shape: &LeafSpine, cut: &[usize]) -> usize {
    let dist = shape.distances(cut);
    let n = shape.switches();
    let mut walked = 0;
    for (from, dist) in dist.iter().enumerate() {
        let mut entries = 0;
        for block in 0.. {
            let Some(table) = subnet.lft_block(from, block) else {
                break;
            };
            for (i, &out) in table.iter().enumerate() {
                let lid = (block * 64) as usize + i;
                let hca = (1..=shape.ports()).contains(&lid);
                let switch = subnet.switch_at(lid as Lid);
                if !hca && switch.is_none() {
                    assert_eq!(out, NO_PORT, "switch {from}: LID {lid} is no one's");
                    continue;
                }
                assert_ne!(out, NO_PORT, "switch {from} has no port for LID {lid}");
                // Where the LID's last hop is: its leaf, or the switch itself.
                let to = switch.unwrap_or_else(|| shape.leaf_of(lid as Lid));
                let crossed = walk(subnet, from, lid as Lid, n);
                assert_eq!(crossed, dist[to].unwrap() + 1, "{from} to {lid}");
                entries += 1;
            }
        }
        assert_eq!(entries, shape.ports() + n, "switch {from}'s entries");
        walked += entries;
    }
    walked
}

/// Follows the tables from switch `sw` toward `lid` port by port: how many switches it
/// crosses before it gets there (panics if it does not).
fn walk(subnet: &Subnet, mut sw: usize, lid: Lid, limit: usize) -> usize {
    for crossed in 1..=limit {
        let out = subnet.out_port(sw, lid);
        match subnet.peer(sw, out) {
            _ if out == 0 => {
                assert_eq!(subnet.switch_at(lid), Some(sw), "port 0 of {sw} for {lid}");
                return crossed;
            }
            Peer::Hca(l) => {
                assert_eq!(l, lid, "switch {sw} port {out} for {lid}");
                return crossed;
            }
            Peer::Switch { sw: next, link, .. } => {
                assert_eq!(
                    subnet.link_up(link),
                    Some(true),
                    "{sw} to {lid}: link {link}"
                );
                sw = next;
            }
            Peer::None => panic!("switch {sw} port {out} for {lid} links nothing"),
        }
    }
    panic!("a loop toward LID {lid}");
}

/// The broadcast group's MLID, as the SA holds it.
pub fn broadcast_mlid(fabric: &Fabric) -> Lid {
    fabric.with_sa(|sa| {
        (sa.groups().find(|g| g.mgid == IPOIB_BROADCAST_MGID))
            .expect("the SA keeps the broadcast group")
            .mlid
    })
}

/// Every port's join of the broadcast group, queued at once (then pump, then
/// [`check_joined`]).
pub fn queue_joins(fabric: &Fabric, ports: &[Arc<Port>]) {
    for p in ports {
        fabric.enqueue(join_broadcast(p.lid, u64::from(p.lid)));
    }
}

/// Checks that every port got the answer to its join, and the group lists them all.
pub fn check_joined(fabric: &Fabric, ports: &[Arc<Port>]) {
    let mlid = broadcast_mlid(fabric);
    for p in ports {
        check_join(p, u64::from(p.lid), mlid);
    }
    let members = fabric.with_sa(|sa| {
        (sa.groups().find(|g| g.mgid == IPOIB_BROADCAST_MGID)).map(|g| g.members.len())
    });
    assert_eq!(members, Some(ports.len()));
}
