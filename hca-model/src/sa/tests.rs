//! The SA, query by query, through `SubnetAdmin::answer` as the fabric calls it.

use std::cell::Cell;

use super::groups::mc;
use super::records::{nr, pir, pr};
use super::services::sr;
use super::*;

/// Nodes 1..=n with the GUIDs hca_model::abi gives them; links up unless taken down.
struct Nodes {
    n: Lid,
    down: Cell<Option<Lid>>,
    now: Cell<u64>,
    /// Switches of their own (None: the default single switch).
    subnet: Option<std::sync::Arc<crate::subnet::Subnet>>,
}

impl Nodes {
    fn new(n: Lid) -> Self {
        Self {
            n,
            down: Cell::new(None),
            now: Cell::new(0),
            subnet: None,
        }
    }
}

impl Ports for Nodes {
    fn lid_of(&self, guid: u64) -> Option<Lid> {
        (1..=self.n).find(|&l| crate::abi::node_guid(l) == guid)
    }
    fn guid_of(&self, lid: Lid) -> Option<u64> {
        (1..=self.n)
            .contains(&lid)
            .then(|| crate::abi::node_guid(lid))
    }
    fn lids(&self) -> Vec<Lid> {
        (1..=self.n).collect()
    }
    fn link_up(&self, lid: Lid) -> bool {
        self.down.get() != Some(lid)
    }
    /// Node 3 says it is a device-management agent (as ib_srpt makes a port); all do CM.
    fn capability_mask(&self, lid: Lid) -> u32 {
        CM_SUPPORTED | if lid == 3 { DEV_MGMT_SUPPORTED } else { 0 }
    }
    fn now_ns(&self) -> u64 {
        self.now.get()
    }
    fn subnet(&self) -> std::sync::Arc<crate::subnet::Subnet> {
        match &self.subnet {
            Some(s) => s.clone(),
            None => std::sync::Arc::new(crate::subnet::Subnet::new(
                crate::subnet::Topology::single(),
                &self.lids(),
            )),
        }
    }
}

const CM_SUPPORTED: u32 = 1 << 16;
const DEV_MGMT_SUPPORTED: u32 = 1 << 19;

fn three() -> Nodes {
    Nodes::new(3)
}

fn mad(method: u8, attr: u16, comp_mask: u64, data: &[u8]) -> Packet {
    let tid = 0x1234_5678_9abc_def0;
    let mut m = mad::header(class::SUBN_ADM, SA_CLASS_VERSION, method, tid, attr);
    m[at::SA_COMP_MASK..at::SA_DATA].copy_from_slice(&comp_mask.to_be_bytes());
    m[at::SA_DATA..at::SA_DATA + data.len()].copy_from_slice(data);
    mad::to_sa(2, 1, m.to_vec())
}

/// (method, status, data) of the answer.
fn ask(sa: &mut SubnetAdmin, p: &Packet) -> (u8, u16, Vec<u8>) {
    let r = sa.answer(p, &three()).expect("an answer").remove(0);
    assert_eq!(
        (r.dlid, r.slid, r.dest_qpn, r.qkey),
        (2, SM_LID, 1, GSI_QKEY)
    );
    let Payload::Bytes(b) = r.payload else {
        panic!("bytes")
    };
    assert_eq!(b.len(), MAD_SIZE);
    assert_eq!(be64(&b, 8), 0x1234_5678_9abc_def0, "the TID comes back");
    (b[3], be16(&b, 4), b[at::SA_DATA..].to_vec())
}

fn gid(lid: Lid) -> [u8; 16] {
    port_gid(crate::abi::node_guid(lid))
}

#[test]
fn test_a_path_record_by_dgid_names_both_ends_and_honours_selectors() {
    let mut sa = SubnetAdmin::new();
    let mut d = [0u8; 64];
    d[8..24].copy_from_slice(&gid(3));
    let (m, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::PATH_RECORD, pr::DGID, &d),
    );
    assert_eq!((m, st), ((method::GET | method::RESP), 0));
    assert_eq!(r[8..24], gid(3));
    assert_eq!(r[24..40], gid(2), "from the asker");
    assert_eq!((be16(&r, 40), be16(&r, 42)), (3, 2));
    assert_eq!((be16(&r, 50), r[54] & 0x3f), (0xffff, MTU_4096));
    // MTU exactly 2048: a 4096 path carries that too.
    d[54] = 2 << 6 | MTU_2048;
    let exact = pr::DGID | pr::MTU_SELECTOR | pr::MTU;
    let (_, st, r) = ask(&mut sa, &mad(method::GET, attr::sa::PATH_RECORD, exact, &d));
    assert_eq!((st, r[54] & 0x3f), (0, MTU_2048));
    // Greater than 2048: 4096 will do; greater than 4096 nothing does.
    d[54] = MTU_2048;
    let (_, st, r) = ask(&mut sa, &mad(method::GET, attr::sa::PATH_RECORD, exact, &d));
    assert_eq!((st, r[54] & 0x3f), (0, MTU_4096));
    d[54] = MTU_4096;
    let (_, st, _) = ask(&mut sa, &mad(method::GET, attr::sa::PATH_RECORD, exact, &d));
    assert_eq!(st, status::NO_RECORDS);
    // An unknown GID has no path; a query naming no destination is incomplete.
    d[8..24].copy_from_slice(&gid(9));
    let (_, st, _) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::PATH_RECORD, pr::DGID, &d),
    );
    assert_eq!(st, status::NO_RECORDS);
    let (_, st, _) = ask(&mut sa, &mad(method::GET, attr::sa::PATH_RECORD, 0, &d));
    assert_eq!(st, status::INSUFFICIENT_COMPONENTS);
    // By DLID and SLID.
    let mut d = [0u8; 64];
    d[40..42].copy_from_slice(&1u16.to_be_bytes());
    d[42..44].copy_from_slice(&3u16.to_be_bytes());
    let (_, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::PATH_RECORD, pr::DLID | pr::SLID, &d),
    );
    assert_eq!((st, r[24..40].to_vec()), (0, gid(3).to_vec()));
}

#[test]
fn test_paths_and_groups_carry_the_packet_lifetime_the_subnet_is_given() {
    let mut sa = SubnetAdmin::new();
    let mut d = [0u8; 64];
    d[8..24].copy_from_slice(&gid(3));
    let path = mad(method::GET, attr::sa::PATH_RECORD, pr::DGID, &d);
    let join = mad(
        method::SET,
        attr::sa::MCMEMBER_RECORD,
        mc::MGID | mc::PORT_GID | mc::JOIN_STATE,
        &member(IPOIB_BROADCAST_MGID, 2, 1),
    );
    // OpenSM's default until told otherwise.
    assert_eq!(ask(&mut sa, &path).2[56] & 0x3f, DEFAULT_PACKET_LIFE);
    assert_eq!(ask(&mut sa, &join).2[43] & 0x3f, DEFAULT_PACKET_LIFE);
    assert_eq!(sa.set_packet_life(12), Some(()));
    let (_, st, r) = ask(&mut sa, &path);
    assert_eq!((st, r[56]), (0, 2 << 6 | 12), "exactly 12");
    assert_eq!(ask(&mut sa, &join).2[43], 2 << 6 | 12);
    // A query's selector is met against it: "less than 12" may have 11, "greater than
    // 12" has nothing.
    let life = pr::DGID | pr::LIFE_SELECTOR | pr::LIFE;
    d[56] = 1 << 6 | 12;
    let (_, st, r) = ask(&mut sa, &mad(method::GET, attr::sa::PATH_RECORD, life, &d));
    assert_eq!((st, r[56] & 0x3f), (0, 11));
    d[56] = 12;
    let (_, st, _) = ask(&mut sa, &mad(method::GET, attr::sa::PATH_RECORD, life, &d));
    assert_eq!(st, status::NO_RECORDS);
    // Past what a QP's 5-bit ACK timeout can follow: refused, nothing changed.
    assert_eq!(sa.set_packet_life(MAX_PACKET_LIFE + 1), None);
    assert_eq!(sa.packet_life(), 12);
    assert_eq!(ask(&mut sa, &path).2[56] & 0x3f, 12);
}

fn member(mgid: [u8; 16], lid: Lid, join: u8) -> [u8; 52] {
    let mut d = [0u8; 52];
    d[0..16].copy_from_slice(&mgid);
    d[16..32].copy_from_slice(&gid(lid));
    d[40..42].copy_from_slice(&0xffffu16.to_be_bytes());
    d[48] = join;
    d
}

#[test]
fn test_ipoib_joins_the_broadcast_group_that_exists_from_the_start() {
    let mut sa = SubnetAdmin::new();
    let d = member(IPOIB_BROADCAST_MGID, 2, 1);
    let mask = mc::MGID | mc::PORT_GID | mc::PKEY | mc::JOIN_STATE;
    let (m, st, r) = ask(
        &mut sa,
        &mad(method::SET, attr::sa::MCMEMBER_RECORD, mask, &d),
    );
    assert_eq!((m, st), ((method::GET | method::RESP), 0));
    assert_eq!(r[0..16], IPOIB_BROADCAST_MGID);
    assert_eq!(be32(&r, 32), IPOIB_QKEY);
    assert_eq!(be16(&r, 36), MLID_BASE);
    assert_eq!((r[38] & 0x3f, r[48] & 0xf), (MTU_2048, 1));
    // Leaving keeps the permanent group.
    let (m, st, _) = ask(
        &mut sa,
        &mad(method::DELETE, attr::sa::MCMEMBER_RECORD, mask, &d),
    );
    assert_eq!((m, st), ((method::DELETE | method::RESP), 0));
    assert!(sa.group_by_mlid(MLID_BASE).unwrap().members.is_empty());
}

#[test]
fn test_a_group_is_created_by_a_full_join_and_goes_with_its_last_member() {
    let mut sa = SubnetAdmin::new();
    let mgid = [
        0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    ];
    let partial = mc::MGID | mc::PORT_GID | mc::JOIN_STATE;
    let mut d = member(mgid, 2, 1);
    let (_, st, _) = ask(
        &mut sa,
        &mad(method::SET, attr::sa::MCMEMBER_RECORD, partial, &d),
    );
    assert_eq!(
        st,
        status::REQ_INVALID,
        "no group, and not enough to create one"
    );
    d[32..36].copy_from_slice(&IPOIB_QKEY.to_be_bytes());
    let full = partial | mc::CREATE;
    let (_, st, r) = ask(
        &mut sa,
        &mad(method::SET, attr::sa::MCMEMBER_RECORD, full, &d),
    );
    assert_eq!(st, 0);
    let mlid = be16(&r, 36);
    assert!(mlid > MLID_BASE, "a new MLID");
    let d3 = member(mgid, 3, 1);
    let (_, st, r) = ask(
        &mut sa,
        &mad(method::SET, attr::sa::MCMEMBER_RECORD, partial, &d3),
    );
    assert_eq!(
        (st, be16(&r, 36)),
        (0, mlid),
        "the second member joins the group"
    );
    assert_eq!(sa.group_by_mlid(mlid).unwrap().members.len(), 2);
    // Get by MGID.
    let (_, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::MCMEMBER_RECORD, mc::MGID, &d),
    );
    assert_eq!((st, be16(&r, 36)), (0, mlid));
    for x in [&d, &d3] {
        let (_, st, _) = ask(
            &mut sa,
            &mad(method::DELETE, attr::sa::MCMEMBER_RECORD, partial, x),
        );
        assert_eq!(st, 0);
    }
    assert!(
        sa.group_by_mlid(mlid).is_none(),
        "the group went with its last member"
    );
    let (_, st, _) = ask(
        &mut sa,
        &mad(method::DELETE, attr::sa::MCMEMBER_RECORD, partial, &d),
    );
    assert_eq!(st, status::NO_RECORDS);
    // A stranger's GID cannot join.
    let stranger = member(IPOIB_BROADCAST_MGID, 9, 1);
    let (_, st, _) = ask(
        &mut sa,
        &mad(method::SET, attr::sa::MCMEMBER_RECORD, partial, &stranger),
    );
    assert_eq!(st, status::INVALID_GID);
}

#[test]
fn test_a_node_record_by_lid_or_guid_describes_the_node() {
    let mut sa = SubnetAdmin::new();
    let mut d = [0u8; 108];
    d[0..2].copy_from_slice(&3u16.to_be_bytes());
    let (m, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::NODE_RECORD, nr::LID, &d),
    );
    assert_eq!((m, st), ((method::GET | method::RESP), 0));
    assert_eq!(be16(&r, 0), 3);
    assert_eq!(
        (r[4 + 2], r[4 + 3]),
        (1, 1),
        "a channel adapter with one port"
    );
    assert_eq!(be64(&r, 4 + 12), crate::abi::node_guid(3));
    assert!(r[44..108].starts_with(b"hcabench HCA, LID 3"));
    let mut d = [0u8; 108];
    d[16..24].copy_from_slice(&crate::abi::node_guid(2).to_be_bytes());
    let (_, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::NODE_RECORD, nr::NODE_GUID, &d),
    );
    assert_eq!((st, be16(&r, 0)), (0, 2));
    d[0..2].copy_from_slice(&9u16.to_be_bytes());
    let (_, st, _) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::NODE_RECORD, nr::LID, &d),
    );
    assert_eq!(st, status::NO_RECORDS);
    let (_, st, _) = ask(&mut sa, &mad(method::GET, attr::sa::NODE_RECORD, 0, &d));
    assert_eq!(st, status::TOO_MANY_RECORDS, "all three match");
}

/// Sixteen ports, joining and leaving eight groups in a seeded order: the SA's members
/// are exactly the joins not yet left, and groups go with their last member.
#[test]
fn test_many_members_join_and_leave_many_groups() {
    let sixteen = Nodes::new(16);
    let mut sa = SubnetAdmin::new();
    let mgid = |g: u8| {
        [
            0xff, 0x12, 0x40, 0x1b, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, g,
        ]
    };
    let mut want: std::collections::BTreeSet<(u8, Lid)> = Default::default();
    let mut x = 0x2545_f491_u32;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let (g, lid) = ((x % 8) as u8, (x >> 8) as u16 % 16 + 1);
        let mut d = member(mgid(g), 1, 1);
        d[16..32].copy_from_slice(&gid(lid));
        d[32..36].copy_from_slice(&IPOIB_QKEY.to_be_bytes());
        let joined = want.contains(&(g, lid));
        let (method, mask) = if joined {
            (method::DELETE, mc::MGID | mc::PORT_GID | mc::JOIN_STATE)
        } else {
            (method::SET, mc::MGID | mc::PORT_GID | mc::CREATE)
        };
        let p = Packet {
            slid: lid,
            ..mad(method, attr::sa::MCMEMBER_RECORD, mask, &d)
        };
        let r = sa.answer(&p, &sixteen).unwrap().remove(0);
        let Payload::Bytes(b) = r.payload else {
            panic!()
        };
        assert_eq!(be16(&b, 4), 0, "{method:#x} of node{lid} in group {g}");
        if joined {
            want.remove(&(g, lid));
        } else {
            want.insert((g, lid));
        }
    }
    let mut have: std::collections::BTreeSet<(u8, Lid)> = Default::default();
    for grp in sa.groups().filter(|grp| !grp.permanent) {
        assert!(!grp.members.is_empty(), "an empty group was kept");
        for guid in grp.members.keys() {
            have.insert((grp.mgid[15], sixteen.lid_of(*guid).unwrap()));
        }
    }
    assert_eq!(have, want);
    let mlids: std::collections::BTreeSet<Lid> = sa.groups().map(|g| g.mlid).collect();
    assert_eq!(mlids.len(), sa.groups().count(), "every group its own MLID");
}

/// A MultiPathRecord GetMulti for `sgids` to `dgids`, sent as ib_mad sends a one-segment
/// RMPP request.
fn multipath(sgids: &[Lid], dgids: &[Lid], comp_mask: u64, extra: &[(usize, u8)]) -> Packet {
    let mut d = vec![0u8; 24 + 16 * (sgids.len() + dgids.len())];
    (d[15], d[16]) = (sgids.len() as u8, dgids.len() as u8);
    for (i, &lid) in sgids.iter().chain(dgids).enumerate() {
        d[24 + 16 * i..40 + 16 * i].copy_from_slice(&gid(lid));
    }
    for &(at, v) in extra {
        d[at] = v;
    }
    let counts = 1 << 19 | 1 << 20;
    let mut p = mad(
        method::GET_MULTI,
        attr::sa::MULTIPATH_RECORD,
        counts | comp_mask,
        &d,
    );
    if let Payload::Bytes(m) = &mut p.payload {
        (m[24], m[25]) = (1, rmpp::DATA);
        m[26] = rmpp::wire::ACTIVE | rmpp::wire::FIRST | rmpp::wire::LAST;
        m[28..32].copy_from_slice(&1u32.to_be_bytes());
        m[32..36].copy_from_slice(&(20 + d.len() as u32).to_be_bytes());
    }
    p
}

/// The SA's answer to a GetMulti: its status and the PathRecords it carries.
fn multipath_answer(sa: &mut SubnetAdmin, q: &Packet) -> (u16, Vec<Vec<u8>>) {
    let a = answers(sa, q, &three());
    assert_eq!(
        (a[0].0, a[0].2[25]),
        (method::GET_MULTI | method::RESP, rmpp::wire::ACK),
        "the request's one segment acknowledged first"
    );
    let (m, st, seg) = &a[1];
    assert_eq!(*m, method::GET_MULTI | method::RESP);
    if *st != 0 {
        return (*st, Vec::new());
    }
    assert_eq!(be16(seg, at::SA_ATTR_OFFSET), 8, "PathRecords, 64 bytes");
    let (n, flags, total) = segment(seg);
    assert_eq!((n, flags & rmpp::wire::FIRST), (1, rmpp::wire::FIRST));
    let mut segs = vec![seg.clone()];
    if flags & rmpp::wire::LAST == 0 {
        segs.extend(answers(sa, &ack(1, 64), &three()).into_iter().map(|a| a.2));
    }
    let last = segment(segs.last().unwrap());
    assert_ne!(
        last.1 & rmpp::wire::LAST,
        0,
        "the whole answer in the window"
    );
    let len = total as usize - 20 * segs.len();
    let data: Vec<u8> = segs
        .iter()
        .flat_map(|s| s[at::SA_DATA..].to_vec())
        .collect();
    let rows = data[..len].chunks(64).map(<[u8]>::to_vec).collect();
    (0, rows)
}

#[test]
fn test_a_multipath_record_gives_the_path_between_each_source_and_destination() {
    let mut sa = SubnetAdmin::new();
    let (st, rows) = multipath_answer(&mut sa, &multipath(&[1, 2], &[3, 1], 0, &[]));
    assert_eq!(st, 0);
    let pairs: Vec<(Lid, Lid)> = rows.iter().map(|r| (be16(r, 42), be16(r, 40))).collect();
    assert_eq!(pairs, [(1, 3), (1, 1), (2, 3), (2, 1)]);
    for r in &rows {
        assert_eq!(r[8..24], gid(be16(r, 40)), "DGID");
        assert_eq!(r[24..40], gid(be16(r, 42)), "SGID");
        assert_eq!((be16(r, 50), r[54] & 0x3f), (0xffff, MTU_4096));
    }
    // The selectors of a PathRecord query: MTU exactly 2048 (bits 10, 11).
    let mtu = (10, 2 << 6 | MTU_2048);
    let (_, rows) = multipath_answer(&mut sa, &multipath(&[1], &[2], 3 << 10, &[mtu]));
    assert_eq!((rows.len(), rows[0][54] & 0x3f), (1, MTU_2048));
    let (_, rows) = multipath_answer(&mut sa, &multipath(&[1], &[2], 3 << 10, &[(10, MTU_4096)]));
    assert!(rows.is_empty(), "nothing greater than 4096");
    // A GID of no port; no destinations; more GIDs than a MAD holds.
    let unknown = multipath(&[1], &[9], 0, &[]);
    assert_eq!(multipath_answer(&mut sa, &unknown).0, status::INVALID_GID);
    assert_eq!(
        multipath_answer(&mut sa, &multipath(&[1, 2], &[], 0, &[])).0,
        status::REQ_INVALID
    );
    let many = multipath(&[1; 6], &[2; 5], 0, &[(16, 6)]);
    assert_eq!(multipath_answer(&mut sa, &many).0, status::REQ_INVALID);
    let mut no_counts = multipath(&[1], &[2], 0, &[]);
    if let Payload::Bytes(m) = &mut no_counts.payload {
        m[at::SA_COMP_MASK..at::SA_DATA].fill(0);
    }
    assert_eq!(
        multipath_answer(&mut sa, &no_counts).0,
        status::INSUFFICIENT_COMPONENTS
    );
    // The SA says it serves them.
    let (_, _, cpi) = ask(&mut sa, &mad(method::GET, attr::CLASS_PORT_INFO, 0, &[]));
    assert_ne!(be16(&cpi, 2) & 1 << 10, 0, "IsMultiPathSupported");
}

#[test]
fn test_bad_and_unsupported_queries_get_a_status_never_silence() {
    let mut sa = SubnetAdmin::new();
    let (_, st, r) = ask(&mut sa, &mad(method::GET, attr::CLASS_PORT_INFO, 0, &[]));
    assert_eq!((st, r[1], be32(&r, 4) & 0x1f), (0, 2, u32::from(RESP_TIME)));
    let (_, st, _) = ask(&mut sa, &mad(method::GET, 0x0039, 0, &[]));
    assert_eq!(st, status::METHOD_ATTR_UNSUPPORTED, "TraceRecord");
    let (_, st, _) = ask(&mut sa, &mad(0x07, attr::sa::PATH_RECORD, 0, &[]));
    assert_eq!(st, status::METHOD_UNSUPPORTED);
    let mut p = mad(method::GET, attr::CLASS_PORT_INFO, 0, &[]);
    if let Payload::Bytes(b) = &mut p.payload {
        b[2] = 9;
    }
    assert_eq!(ask(&mut sa, &p).1, status::BAD_VERSION);
    // Not for the SA: another class, a response, the wrong Q_Key, a short MAD.
    let mut other = mad(method::GET, attr::CLASS_PORT_INFO, 0, &[]);
    if let Payload::Bytes(b) = &mut other.payload {
        b[1] = 0x07;
    }
    assert!(sa.answer(&other, &three()).is_none());
    let mut resp = mad(method::GET | method::RESP, attr::CLASS_PORT_INFO, 0, &[]);
    assert!(sa.answer(&resp, &three()).is_none());
    resp = mad(method::GET, attr::CLASS_PORT_INFO, 0, &[]);
    resp.qkey = 0;
    assert!(sa.answer(&resp, &three()).is_none());
    resp.qkey = GSI_QKEY;
    resp.payload = Payload::Bytes(vec![1, 3, 2, 1]);
    assert!(sa.answer(&resp, &three()).is_none());
}

/// Every packet of the SA's answer, as (method, status, the whole MAD).
fn answers(sa: &mut SubnetAdmin, p: &Packet, ports: &Nodes) -> Vec<(u8, u16, Vec<u8>)> {
    sa.answer(p, ports)
        .expect("the SA's to answer")
        .into_iter()
        .map(|r| {
            assert_eq!((r.dlid, r.dest_qpn, r.qkey), (p.slid, p.src_qpn, GSI_QKEY));
            let Payload::Bytes(b) = r.payload else {
                panic!("bytes")
            };
            (b[3], be16(&b, 4), b)
        })
        .collect()
}

/// The ACK a receiver sends for segments up to `seg`, opening the window to `window`.
fn ack(seg: u32, window: u32) -> Packet {
    let mut p = mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]);
    if let Payload::Bytes(m) = &mut p.payload {
        m[24] = 1;
        m[25] = rmpp::wire::ACK;
        m[26] = rmpp::wire::ACTIVE;
        m[28..32].copy_from_slice(&seg.to_be_bytes());
        m[32..36].copy_from_slice(&window.to_be_bytes());
    }
    p
}

/// (segment number, flags, PayloadLength) of an RMPP DATA segment.
fn segment(m: &[u8]) -> (u32, u8, u32) {
    assert_eq!((m[24], m[25]), (1, 1), "an RMPP DATA segment");
    (be32(m, 28), m[26] & 7, be32(m, 32))
}

/// Receives a whole GetTable answer as ib_mad's receiver does (window of 64 after the first
/// segment): the records and their size.
fn table(sa: &mut SubnetAdmin, q: &Packet, ports: &Nodes) -> (usize, Vec<Vec<u8>>) {
    let first = answers(sa, q, ports);
    assert_eq!(first.len(), 1, "one segment before the first ACK");
    let (m, st, seg1) = &first[0];
    assert_eq!((*m, *st), (method::GET_TABLE | method::RESP, 0));
    let (n, flags, total) = segment(seg1);
    assert_eq!(n, 1);
    assert_ne!(flags & rmpp::wire::FIRST, 0);
    let mut segs = vec![seg1.clone()];
    let mut last_flags = flags;
    // ACK at each window's end, opening the next 64 segments.
    while last_flags & rmpp::wire::LAST == 0 {
        let n = segs.len() as u32;
        let rest = answers(sa, &ack(n, n + 64), ports);
        assert!(!rest.is_empty(), "an ACK within the transfer brings more");
        segs.extend(rest.into_iter().map(|(_, _, b)| b));
        last_flags = segment(segs.last().unwrap()).1;
    }
    let last = segs.last().unwrap();
    let (n, flags, last_len) = segment(last);
    assert_eq!(n as usize, segs.len(), "segments in order, none missing");
    assert_ne!(flags & rmpp::wire::LAST, 0);
    // The final ACK ends the transfer: nothing more comes.
    assert!(answers(sa, &ack(n, n + 64), ports).is_empty());
    let size = be16(seg1, at::SA_ATTR_OFFSET) as usize * 8;
    let data_len = total as usize - segs.len() * 20;
    assert_eq!(last_len as usize, 20 + data_len - (segs.len() - 1) * 200);
    let data: Vec<u8> = segs
        .iter()
        .flat_map(|s| s[at::SA_DATA..].to_vec())
        .collect();
    let rows = data[..data_len]
        .chunks(size.max(1))
        .map(<[u8]>::to_vec)
        .collect();
    (size, rows)
}

#[test]
fn test_a_path_table_comes_back_in_rmpp_segments_paced_by_acks() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    // Every path on three nodes: nine records of 64 bytes, three segments.
    let (size, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]),
        &ports,
    );
    assert_eq!((size, rows.len()), (64, 9));
    let pairs: std::collections::BTreeSet<(u16, u16)> =
        rows.iter().map(|r| (be16(r, 42), be16(r, 40))).collect();
    assert_eq!(pairs.len(), 9, "each (source, destination) once");
    // From one source: three records.
    let mut d = [0u8; 64];
    d[42..44].copy_from_slice(&2u16.to_be_bytes());
    let q = mad(method::GET_TABLE, attr::sa::PATH_RECORD, pr::SLID, &d);
    let (_, rows) = table(&mut sa, &q, &ports);
    assert!(rows.len() == 3 && rows.iter().all(|r| r[24..40] == gid(2)));
    assert_eq!(sa.transfers.len(), 0, "finished transfers are gone");
}

#[test]
fn test_a_lost_segment_is_sent_again_from_a_duplicate_ack_and_stop_ends_a_transfer() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let q = mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]);
    assert_eq!(answers(&mut sa, &q, &ports).len(), 1);
    // A window of one after segment 1 sends nothing yet; opened to 3, two more segments.
    assert!(answers(&mut sa, &ack(1, 1), &ports).is_empty());
    let two = answers(&mut sa, &ack(1, 3), &ports);
    assert_eq!(
        two.iter().map(|a| segment(&a.2).0).collect::<Vec<_>>(),
        [2, 3]
    );
    // Segment 2 was lost: the receiver acknowledges 1 again; 2 and 3 come again.
    let again = answers(&mut sa, &ack(1, 3), &ports);
    assert_eq!(
        again.iter().map(|a| segment(&a.2).0).collect::<Vec<_>>(),
        [2, 3]
    );
    // A STOP ends it.
    let mut stop = ack(1, 3);
    if let Payload::Bytes(m) = &mut stop.payload {
        m[25] = rmpp::wire::STOP;
    }
    assert!(answers(&mut sa, &stop, &ports).is_empty());
    assert_eq!(sa.transfers.len(), 0);
    assert!(answers(&mut sa, &ack(1, 3), &ports).is_empty());
}

#[test]
fn test_transfers_under_way_are_bounded() {
    let mut sa = SubnetAdmin::new();
    let ports = Nodes::new(40);
    for tid in 0..200u64 {
        let mut q = mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]);
        if let Payload::Bytes(m) = &mut q.payload {
            m[8..16].copy_from_slice(&tid.to_be_bytes());
        }
        assert_eq!(answers(&mut sa, &q, &ports).len(), 1);
    }
    assert_eq!(sa.transfers.len(), rmpp::MAX_TRANSFERS);
    // 40 nodes is 1600 paths (under the table limit): 512 segments, eight windows.
    let (_, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]),
        &ports,
    );
    assert_eq!(rows.len(), 1600);
    // 64 nodes' 4096 come back whole (`saquery -p` on hcabench's largest cluster); 65
    // nodes' 4225 are refused.
    let (_, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]),
        &Nodes::new(64),
    );
    assert_eq!(rows.len(), 4096);
    let big = Nodes::new(65);
    let q = mad(method::GET_TABLE, attr::sa::PATH_RECORD, 0, &[]);
    let a = answers(&mut sa, &q, &big);
    assert_eq!((a.len(), a[0].1), (1, status::NO_RESOURCES));
}

#[test]
fn test_node_and_member_tables_list_every_node_and_membership() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let (size, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::NODE_RECORD, 0, &[]),
        &ports,
    );
    assert_eq!(size, 112);
    let lids: Vec<u16> = rows.iter().map(|r| be16(r, 0)).collect();
    assert_eq!(lids, [1, 2, 3, SM_LID], "the nodes, and the switch");
    // NodeType and NumPorts (NodeInfo at 4): channel adapters of one port, the switch with
    // a port per LID.
    let kinds: Vec<(u8, u8)> = rows.iter().map(|r| (r[6], r[7])).collect();
    assert_eq!(kinds, [(1, 1), (1, 1), (1, 1), (2, 3)]);
    // A Get that matches them all is refused; by port GUID it finds one.
    let (_, st, _) = ask(&mut sa, &mad(method::GET, attr::sa::NODE_RECORD, 0, &[]));
    assert_eq!(st, status::TOO_MANY_RECORDS);
    let mut d = [0u8; 108];
    d[24..32].copy_from_slice(&crate::abi::node_guid(3).to_be_bytes());
    let (_, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::NODE_RECORD, nr::PORT_GUID, &d),
    );
    assert_eq!((st, be16(&r, 0)), (0, 3));
    // The broadcast group with no members is one record; with two, one per member.
    let q = mad(method::GET_TABLE, attr::sa::MCMEMBER_RECORD, 0, &[]);
    let (size, rows) = table(&mut sa, &q, &ports);
    assert_eq!(
        (size, rows.len(), rows[0][16..32].to_vec()),
        (56, 1, vec![0; 16])
    );
    for lid in [1, 3] {
        let p = Packet {
            slid: lid,
            ..mad(
                method::SET,
                attr::sa::MCMEMBER_RECORD,
                mc::MGID | mc::PORT_GID | mc::JOIN_STATE,
                &member(IPOIB_BROADCAST_MGID, lid, 1),
            )
        };
        assert_eq!(answers(&mut sa, &p, &ports)[0].1, 0);
    }
    let (_, rows) = table(&mut sa, &q, &ports);
    let members: Vec<[u8; 16]> = rows.iter().map(|r| gid_at(r, 16)).collect();
    assert_eq!(members, [gid(1), gid(3)]);
    // By port GID: that port's memberships only.
    let q = mad(
        method::GET_TABLE,
        attr::sa::MCMEMBER_RECORD,
        mc::PORT_GID,
        &member([0; 16], 3, 0),
    );
    let (_, rows) = table(&mut sa, &q, &ports);
    assert_eq!((rows.len(), rows[0][48] & 0xf), (1, 1));
}

#[test]
fn test_port_info_records_show_state_and_capabilities() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&2u16.to_be_bytes());
    let (m, st, r) = ask(
        &mut sa,
        &mad(method::GET, attr::sa::PORT_INFO_RECORD, pir::LID, &d),
    );
    assert_eq!((m, st), (method::GET | method::RESP, 0));
    let pi = &r[4..];
    assert_eq!(
        (be16(pi, 16), be16(pi, 18)),
        (2, SM_LID),
        "LID and master SM LID"
    );
    assert_eq!((pi[32] & 0xf, pi[33] >> 4), (4, 5), "Active, LinkUp");
    assert_eq!(be32(pi, 20), CM_SUPPORTED);
    ports.down.set(Some(2));
    let q = mad(method::GET, attr::sa::PORT_INFO_RECORD, pir::LID, &d);
    let r = &answers(&mut sa, &q, &ports)[0].2[at::SA_DATA..];
    assert_eq!((r[4 + 32] & 0xf, r[4 + 33] >> 4), (1, 3), "Down, Disabled");
    // srp_daemon's question: which ports are device-management agents?
    d[4 + 20..4 + 24].copy_from_slice(&DEV_MGMT_SUPPORTED.to_be_bytes());
    let q = mad(
        method::GET_TABLE,
        attr::sa::PORT_INFO_RECORD,
        pir::CAPABILITY_MASK,
        &d,
    );
    let (size, rows) = table(&mut sa, &q, &ports);
    assert_eq!((size, rows.len(), be16(&rows[0], 0)), (72, 1, 3));
}

/// The switch's ports in PortInfoRecords: its management port 0 with its LID and the SM
/// (IsSM), and an external port per node, each with its link's state.
#[test]
fn test_port_info_records_list_the_switchs_ports() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    ports.down.set(Some(2));
    let (_, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::PORT_INFO_RECORD, 0, &[]),
        &ports,
    );
    let keys: Vec<(Lid, u8)> = rows.iter().map(|r| (be16(r, 0), r[2])).collect();
    let sw = |p: u8| (SM_LID, p);
    assert_eq!(keys, [(1, 1), (2, 1), (3, 1), sw(0), sw(1), sw(2), sw(3)]);
    let pi = |r: &Vec<u8>| r[4..68].to_vec();
    let port0 = pi(&rows[3]);
    assert_eq!(
        (be16(&port0, 16), be32(&port0, 20)),
        (SM_LID, 1 << 1),
        "LID, IsSM"
    );
    // Switch port 2 links node 2, whose link is down.
    let states: Vec<u8> = rows[4..].iter().map(|r| pi(r)[32] & 0xf).collect();
    assert_eq!(states, [4, 1, 4]);
    // By LID and port number.
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&SM_LID.to_be_bytes());
    d[2] = 3;
    let q = mad(
        method::GET,
        attr::sa::PORT_INFO_RECORD,
        pir::LID | pir::PORT_NUM,
        &d,
    );
    let (_, st, r) = ask(&mut sa, &q);
    assert_eq!((st, be16(&r, 0), r[2]), (0, SM_LID, 3));
}

/// The records of the subnet's structure, each as the switch's SMPs show it: the SM, the
/// switch, its links (both ways, only those up), its forwarding tables, and each port's
/// GUID, P_Key and SL-to-VL tables.
#[test]
fn test_the_subnets_structure_records_agree_with_the_switch() {
    use super::topology::cm;
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let get_table = |sa: &mut SubnetAdmin, attr: u16, mask: u64, d: &[u8]| {
        table(sa, &mad(method::GET_TABLE, attr, mask, d), &ports)
    };
    // SMInfoRecord: the master SM at the switch's LID.
    let (size, rows) = get_table(&mut sa, attr::sa::SM_INFO_RECORD, 0, &[]);
    assert_eq!((size, rows.len()), (32, 1));
    let r = &rows[0];
    assert_eq!((be16(r, 0), be64(r, 4)), (SM_LID, sm::SM_GUID));
    assert_eq!(r[24], 3, "priority 0, MASTER");
    // SwitchInfoRecord: the one switch; its LinearFDBTop is its own LID.
    let (size, rows) = get_table(&mut sa, attr::sa::SWITCH_INFO_RECORD, 0, &[]);
    assert_eq!((size, rows.len(), be16(&rows[0], 0)), (24, 1, SM_LID));
    assert_eq!((be16(&rows[0], 4), be16(&rows[0], 10)), (0xc000, SM_LID));
    // LinkRecord: node n's port 1 to switch port n and back, for the links that are up.
    ports.down.set(Some(2));
    let (size, rows) = get_table(&mut sa, attr::sa::LINK_RECORD, 0, &[]);
    let links: Vec<(Lid, u8, u8, Lid)> = rows
        .iter()
        .map(|r| (be16(r, 0), r[2], r[3], be16(r, 4)))
        .collect();
    assert_eq!(size, 8);
    assert_eq!(
        links,
        [
            (1, 1, 1, SM_LID),
            (SM_LID, 1, 1, 1),
            (3, 1, 3, SM_LID),
            (SM_LID, 3, 1, 3)
        ]
    );
    let mut d = [0u8; 8];
    d[0..2].copy_from_slice(&3u16.to_be_bytes());
    let (_, rows) = get_table(&mut sa, attr::sa::LINK_RECORD, cm::FROM_LID, &d);
    assert_eq!(rows.len(), 1);
    ports.down.set(None);
    // LinearForwardingTableRecord: block 0 sends LID n out of port n; a LID with no node
    // has no port; the last block has the switch's own LID (port 0). Every block, each
    // SMP's answer, up to the top.
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&SM_LID.to_be_bytes());
    let (size, rows) = get_table(&mut sa, attr::sa::LFT_RECORD, cm::LID | cm::BLOCK_1, &d);
    assert_eq!((size, rows.len()), (72, 1));
    assert_eq!(rows[0][8..13], [0xff, 1, 2, 3, 0xff]);
    let (_, rows) = get_table(&mut sa, attr::sa::LFT_RECORD, 0, &[]);
    assert_eq!(rows.len(), usize::from(SM_LID) / 64 + 1);
    let last = rows.last().unwrap();
    assert_eq!((be16(last, 2), last[8 + 63]), (SM_LID / 64, 0));
    for (b, r) in rows.iter().enumerate() {
        assert_eq!(r[8..72], ports.subnet().lft_block(0, b as u32).unwrap());
    }
    // GUIDInfoRecord: each port's GUID first in its block 0.
    let (_, rows) = get_table(&mut sa, attr::sa::GUID_INFO_RECORD, 0, &[]);
    let guids: Vec<(Lid, u64)> = rows.iter().map(|r| (be16(r, 0), be64(r, 8))).collect();
    let g = crate::abi::node_guid;
    assert_eq!(
        guids,
        [(1, g(1)), (2, g(2)), (3, g(3)), (SM_LID, sm::SM_GUID)]
    );
    // P_KeyTableRecord: each node's table as the SM set it (the default partition).
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&2u16.to_be_bytes());
    let (_, rows) = get_table(&mut sa, attr::sa::PKEY_TABLE_RECORD, cm::LID, &d);
    assert_eq!((rows.len(), rows[0][4], be16(&rows[0], 8)), (1, 1, 0xffff));
    // SL2VLTableRecord: one per node port, and per pair of the switch's ports in use.
    let (size, rows) = get_table(&mut sa, attr::sa::SL2VL_TABLE_RECORD, 0, &[]);
    assert_eq!((size, rows.len()), (16, 3 + 4 * 4));
    assert!(rows.iter().all(|r| r[8..16] == [0; 8]), "every SL on VL0");
    // VLArbitrationTableRecord: the ports have no arbitration tables.
    let q = mad(method::GET, attr::sa::VLARB_TABLE_RECORD, 0, &[]);
    assert_eq!(ask(&mut sa, &q).1, status::NO_RECORDS);
}

/// MulticastForwardingTableRecord: the members of a group that receive (full or non-members,
/// not send-only) are the ports its MLID's entry sends to.
#[test]
fn test_the_multicast_forwarding_table_follows_the_groups_members() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    for (lid, join) in [(1, 1), (3, 4)] {
        let d = member(IPOIB_BROADCAST_MGID, lid, join);
        let mask = mc::MGID | mc::PORT_GID | mc::JOIN_STATE;
        let mut p = mad(method::SET, attr::sa::MCMEMBER_RECORD, mask, &d);
        p.slid = lid;
        assert_eq!(answers(&mut sa, &p, &ports)[0].1, 0);
    }
    let mlid = sa.groups().next().unwrap().mlid;
    let (size, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::MFT_RECORD, 0, &[]),
        &ports,
    );
    assert_eq!((size, rows.len()), (72, 1), "one block, one position");
    let r = &rows[0];
    assert_eq!(be16(r, 0), SM_LID);
    let at = 8 + usize::from(mlid - MLID_BASE) % 32 * 2;
    assert_eq!(
        be16(r, at),
        1 << 1,
        "port 1 (node 1) only: node 3 only sends"
    );
}

fn service(id: u64, lid: Lid, name: &str, lease: u32) -> [u8; 176] {
    let mut d = [0u8; 176];
    d[0..8].copy_from_slice(&id.to_be_bytes());
    d[8..24].copy_from_slice(&gid(lid));
    d[24..26].copy_from_slice(&0xffffu16.to_be_bytes());
    d[28..32].copy_from_slice(&lease.to_be_bytes());
    d[32] = 0x5a; // ServiceKey
    d[48..48 + name.len()].copy_from_slice(name.as_bytes());
    d
}

#[test]
fn test_service_records_are_registered_found_leased_and_deleted() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let set = sr::ID | sr::GID | sr::PKEY | sr::NAME;
    let from = |lid: Lid, p: Packet| Packet { slid: lid, ..p };
    for (id, lid, name, lease) in [(0x10, 2, "nvme", u32::MAX), (0x11, 3, "srp", 10)] {
        let p = from(
            lid,
            mad(
                method::SET,
                attr::sa::SERVICE_RECORD,
                set,
                &service(id, lid, name, lease),
            ),
        );
        assert_eq!(answers(&mut sa, &p, &ports)[0].1, 0);
    }
    let (size, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::SERVICE_RECORD, 0, &[]),
        &ports,
    );
    assert_eq!((size, rows.len()), (176, 2));
    let (_, st, r) = ask(
        &mut sa,
        &mad(
            method::GET,
            attr::sa::SERVICE_RECORD,
            sr::NAME,
            &service(0, 1, "srp", 0),
        ),
    );
    assert_eq!((st, be64(&r, 0)), (0, 0x11));
    // The 10-second lease runs out; the lease of all ones does not.
    ports.now.set(11_000_000_000);
    let (_, rows) = table(
        &mut sa,
        &mad(method::GET_TABLE, attr::sa::SERVICE_RECORD, 0, &[]),
        &ports,
    );
    assert_eq!(rows.len(), 1);
    // Node 3 may not delete node 2's record without its key; node 2 may.
    let del = sr::ID | sr::GID;
    let p = from(
        3,
        mad(
            method::DELETE,
            attr::sa::SERVICE_RECORD,
            del,
            &service(0x10, 2, "", 0),
        ),
    );
    assert_eq!(answers(&mut sa, &p, &ports)[0].1, status::NO_RECORDS);
    let p = from(
        2,
        mad(
            method::DELETE,
            attr::sa::SERVICE_RECORD,
            del,
            &service(0x10, 2, "", 0),
        ),
    );
    let a = answers(&mut sa, &p, &ports);
    assert_eq!((a[0].0, a[0].1), (method::DELETE | method::RESP, 0));
    assert_eq!(sa.registrations().0, 0);
    // A stranger's GID is refused, and one port's records are bounded.
    let p = mad(
        method::SET,
        attr::sa::SERVICE_RECORD,
        set,
        &service(1, 9, "x", 0),
    );
    assert_eq!(answers(&mut sa, &p, &ports)[0].1, status::INVALID_GID);
    let mut last = 0;
    for id in 0..services::MAX_SERVICES_PER_PORT as u64 + 5 {
        let p = mad(
            method::SET,
            attr::sa::SERVICE_RECORD,
            set,
            &service(id, 2, "x", u32::MAX),
        );
        last = answers(&mut sa, &p, &ports)[0].1;
    }
    assert_eq!(last, status::NO_RESOURCES);
    assert_eq!(sa.registrations().0, services::MAX_SERVICES_PER_PORT);
}

fn inform(trap: u16, subscribe: u8) -> [u8; 36] {
    let mut d = [0u8; 36];
    d[16..18].copy_from_slice(&0xffffu16.to_be_bytes());
    d[22] = 1; // generic
    d[23] = subscribe;
    d[26..28].copy_from_slice(&trap.to_be_bytes());
    d[28..32].copy_from_slice(&(1u32 << 8).to_be_bytes()); // QP1
    d
}

/// InformInfoRecord: each subscription, under its subscriber's GID, numbered per subscriber.
#[test]
fn test_inform_info_records_list_the_subscriptions() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    for trap in [64, 65] {
        let (_, st, _) = ask(
            &mut sa,
            &mad(method::SET, attr::INFORM_INFO, 0, &inform(trap, 1)),
        );
        assert_eq!(st, 0);
    }
    let q = mad(method::GET_TABLE, attr::sa::INFORM_INFO_RECORD, 0, &[]);
    let (size, rows) = table(&mut sa, &q, &ports);
    assert_eq!((size, rows.len()), (64, 2));
    let subs: Vec<(u16, u16, u16, u32)> = rows
        .iter()
        .map(|r| {
            (
                be16(r, 16),
                be16(r, 24 + 16),
                be16(r, 24 + 26),
                be32(r, 24 + 28) >> 8,
            )
        })
        .collect();
    assert_eq!(subs, [(0, 0xffff, 64, 1), (1, 0xffff, 65, 1)]);
    assert!(rows
        .iter()
        .all(|r| gid_at(r, 0) == gid(2) && r[24 + 22] == 1));
    // By another subscriber's GID: none.
    let mut d = [0u8; 64];
    d[0..16].copy_from_slice(&gid(3));
    let q = mad(method::GET, attr::sa::INFORM_INFO_RECORD, 1, &d);
    assert_eq!(ask(&mut sa, &q).1, status::NO_RECORDS);
}

#[test]
fn test_trap_subscribers_get_a_report_when_a_port_goes_down_or_up() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let sub = mad(method::SET, attr::INFORM_INFO, 0, &inform(65, 1));
    let (m, st, r) = ask(&mut sa, &sub);
    assert_eq!((m, st, r[23]), (method::GET | method::RESP, 0, 1));
    assert!(
        sa.port_changed(3, true, &ports).is_empty(),
        "no one asked for trap 64"
    );
    let reports = sa.port_changed(3, false, &ports);
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!((r.dlid, r.dest_qpn, r.slid), (2, 1, SM_LID));
    let Payload::Bytes(b) = &r.payload else {
        panic!()
    };
    assert_eq!((b[3], be16(b, 16)), (method::REPORT, attr::NOTICE));
    let notice = &b[at::SA_DATA..];
    assert_eq!(
        (notice[0] >> 7, be16(notice, 4)),
        (1, 65),
        "generic trap 65"
    );
    assert_eq!(
        gid_at(notice, 16),
        gid(3),
        "the port that went out of service"
    );
    // The subscriber's ReportResp is taken, and answered with nothing.
    let resp = mad(method::REPORT | method::RESP, attr::NOTICE, 0, &[]);
    assert_eq!(sa.answer(&resp, &ports).map(|v| v.len()), Some(0));
    // Unsubscribed: no more Reports. Subscriptions are bounded per port.
    ask(
        &mut sa,
        &mad(method::SET, attr::INFORM_INFO, 0, &inform(65, 0)),
    );
    assert!(sa.port_changed(3, false, &ports).is_empty());
    let mut last = 0;
    for trap in 0..inform::MAX_SUBSCRIPTIONS_PER_PORT as u16 + 3 {
        last = ask(
            &mut sa,
            &mad(method::SET, attr::INFORM_INFO, 0, &inform(trap, 1)),
        )
        .1;
    }
    assert_eq!(last, status::NO_RESOURCES);
    // Vendor traps are not the fabric's.
    let mut vendor = inform(64, 1);
    vendor[22] = 0;
    let (_, st, _) = ask(&mut sa, &mad(method::SET, attr::INFORM_INFO, 0, &vendor));
    assert_eq!(st, status::REQ_INVALID);
}

#[test]
fn test_a_request_sent_as_rmpp_is_acknowledged_and_a_long_one_aborted() {
    let mut sa = SubnetAdmin::new();
    let ports = three();
    let mut q = mad(method::GET, attr::CLASS_PORT_INFO, 0, &[]);
    if let Payload::Bytes(m) = &mut q.payload {
        m[24] = 1;
        m[25] = 1;
        m[26] = rmpp::wire::ACTIVE | rmpp::wire::FIRST | rmpp::wire::LAST;
        m[28..32].copy_from_slice(&1u32.to_be_bytes());
    }
    let a = answers(&mut sa, &q, &ports);
    assert_eq!(a.len(), 2);
    assert_eq!(
        (a[0].0, a[0].2[25], be32(&a[0].2, 28)),
        (method::GET | method::RESP, rmpp::wire::ACK, 1)
    );
    assert_eq!(
        (a[1].0, a[1].1, a[1].2[24]),
        (method::GET | method::RESP, 0, 0),
        "then the answer"
    );
    if let Payload::Bytes(m) = &mut q.payload {
        m[26] = rmpp::wire::ACTIVE | rmpp::wire::FIRST;
    }
    let a = answers(&mut sa, &q, &ports);
    assert_eq!((a.len(), a[0].2[25]), (1, 4), "ABORT");
}

/// An SMP from node 2's QP0: LID-routed to the SM, or directed-route along `path`.
fn smp(method: u8, attr: u16, src_qpn: u32) -> Packet {
    let m = mad::header(class::SUBN_LID_ROUTED, 1, method, 0x0bad_cafe, attr).to_vec();
    Packet {
        slid: 2,
        dlid: SM_LID,
        opcode: crate::packet::UD_SEND_ONLY,
        dest_qpn: SMI_QPN,
        src_qpn,
        payload: Payload::Bytes(m),
        ..Default::default()
    }
}

/// A LID-routed Get of `attr` with modifier `attr_mod` (a port, a block) to the SM.
fn get_smp(attr: u16, attr_mod: u32) -> Packet {
    let mut p = smp(0x01, attr, SMI_QPN);
    let Payload::Bytes(m) = &mut p.payload else {
        unreachable!()
    };
    m[20..24].copy_from_slice(&attr_mod.to_be_bytes());
    p
}

/// A directed-route Get of `attr` along `path` (its first hop, 0, is the sender), as the
/// sender's ib_mad puts it on the wire: the hop pointer on the first hop.
fn dr_smp(attr: u16, path: &[u8]) -> Packet {
    let mut p = smp(0x01, attr, SMI_QPN);
    p.dlid = sm::PERMISSIVE_LID;
    let Payload::Bytes(m) = &mut p.payload else {
        unreachable!()
    };
    (m[1], m[6], m[7]) = (0x81, 1, (path.len() - 1) as u8);
    m[32..36].copy_from_slice(&[0xff; 4]); // DR SLID and DLID permissive
    m[128..128 + path.len()].copy_from_slice(path);
    p
}

fn bytes(p: &Packet) -> &[u8] {
    match &p.payload {
        Payload::Bytes(b) => b,
        _ => panic!("bytes"),
    }
}

/// infiniband-diags' `sminfo` and `smpquery` ask the SM's LID over QP0: the fabric's node
/// is a switch with the SM on its port 0. It answers SMInfo as the master, with an activity
/// count that grows with what it answers, and NodeInfo, SwitchInfo and PortInfo as a switch
/// whose port n links LID n; it takes no Sets, and nothing an SMP says changes it.
#[test]
fn test_the_sm_answers_as_a_switch_on_qp0_and_nothing_changes_it() {
    let mut sa = SubnetAdmin::new();
    let nodes = three();
    let mut sm_ask = |p: &Packet| {
        let r = sa.answer(p, &nodes).expect("an answer").remove(0);
        assert_eq!(
            (r.dlid, r.slid, r.dest_qpn, r.src_qpn),
            (2, SM_LID, SMI_QPN, SMI_QPN)
        );
        let b = bytes(&r);
        assert_eq!((b.len(), be64(b, 8)), (MAD_SIZE, 0x0bad_cafe));
        (b[3], be16(b, 4), b[64..128].to_vec())
    };
    let (method, st, info) = sm_ask(&smp(0x01, 0x0020, SMI_QPN));
    assert_eq!((method, st), (0x81, 0));
    assert_eq!(
        (be64(&info, 0), be64(&info, 8)),
        (sm::SM_GUID, 0),
        "GUID, no SM_Key"
    );
    assert_eq!(info[20], 3, "priority 0, master");
    let first = u32::from_be_bytes(info[16..20].try_into().unwrap());
    let (_, _, info) = sm_ask(&smp(0x01, 0x0020, SMI_QPN));
    assert_eq!(
        u32::from_be_bytes(info[16..20].try_into().unwrap()),
        first + 1
    );
    // NodeInfo: a switch of three ports (LIDs 1..=3), asked from its port 2.
    let (_, st, ni) = sm_ask(&smp(0x01, 0x0011, SMI_QPN));
    assert_eq!((st, ni[2], ni[3], ni[36]), (0, 2, 3, 2));
    assert_eq!(be64(&ni, 12), sm::SM_GUID);
    let (_, _, si) = sm_ask(&smp(0x01, 0x0012, SMI_QPN));
    assert_eq!(be16(&si, 6), SM_LID, "LinearFDBTop: the switch's own LID");
    let (_, _, nd) = sm_ask(&smp(0x01, 0x0010, SMI_QPN));
    assert!(nd.starts_with(sm::NODE_DESC.as_bytes()));
    // PortInfo: port 0 has the switch's LID and the SM; port 3 is up, then down with its
    // link; there is no port 4.
    let port_info = |port: u32| get_smp(0x0015, port);
    let (_, _, pi) = sm_ask(&port_info(0));
    assert_eq!((be16(&pi, 16), be16(&pi, 18)), (SM_LID, SM_LID));
    assert_eq!(
        u32::from_be_bytes(pi[20..24].try_into().unwrap()),
        1 << 1,
        "IsSM"
    );
    let (_, _, pi) = sm_ask(&port_info(3));
    assert_eq!((pi[32] & 0xf, pi[33] >> 4), (4, 5), "Active, LinkUp");
    nodes.down.set(Some(3));
    let (_, _, pi) = sm_ask(&port_info(3));
    assert_eq!((pi[32] & 0xf, pi[33] >> 4), (1, 2), "Down, Polling");
    nodes.down.set(None);
    let (_, st, _) = sm_ask(&port_info(4));
    assert_eq!(st, status::INVALID_FIELD);
    // Its forwarding table: LID n by port n, its own LID by port 0, nothing else.
    let lft = |block: u32| get_smp(0x0019, block);
    let (_, st, first) = sm_ask(&lft(0));
    assert_eq!((st, &first[..5]), (0, &[0xff, 1, 2, 3, 0xff][..]));
    let (_, _, last) = sm_ask(&lft(u32::from(SM_LID) / 64));
    assert_eq!((last[63], last[62]), (0, 0xff));
    let (_, st, _) = sm_ask(&lft(u32::from(SM_LID) / 64 + 1));
    assert_eq!(st, status::INVALID_FIELD);
    // A Set, or an attribute it does not have: refused, and it changes nothing.
    for p in [smp(0x02, 0x0020, SMI_QPN), smp(0x01, 0x001b, SMI_QPN)] {
        let (method, st, data) = sm_ask(&p);
        assert_eq!((method, st), (0x81, status::METHOD_ATTR_UNSUPPORTED));
        assert!(data.iter().all(|&b| b == 0));
    }
    let (_, _, info) = sm_ask(&smp(0x01, 0x0020, SMI_QPN));
    assert_eq!((be64(&info, 0), info[20]), (sm::SM_GUID, 3));
    // Only a QP0 talks to QP0, and a response is not a query.
    assert!(sa.answer(&smp(0x01, 0x0020, 7), &nodes).is_none());
    assert!(sa.answer(&smp(0x81, 0x0020, SMI_QPN), &nodes).is_none());
}

/// Directed routes through the fabric's switch (IBA 14.2.2), as `smpquery -D` and
/// `ibnetdiscover` send them: a route that ends at the switch is answered back to its
/// sender; one that goes on leaves by the port its path names, with the switch's port in
/// the return path; the answer coming back goes one hop further back; a route to a port
/// with nothing up on it, or that is not a pure directed route, goes nowhere.
#[test]
fn test_directed_routes_through_the_switch_follow_their_paths_both_ways() {
    let mut sa = SubnetAdmin::new();
    let nodes = three();
    // "0,1" from LID 2: the switch's NodeInfo, back to LID 2.
    let r = sa
        .answer(&dr_smp(0x0011, &[0, 1]), &nodes)
        .unwrap()
        .remove(0);
    let b = bytes(&r);
    assert_eq!((r.dlid, r.dest_qpn), (2, SMI_QPN));
    assert_eq!(
        r.slid,
        sm::PERMISSIVE_LID,
        "the receiver answers by the same route"
    );
    assert_eq!(
        (b[3], be16(b, 4), b[6], b[7]),
        (0x81, 0x8000, 1, 1),
        "D set, hop 1"
    );
    assert_eq!(b[192 + 1], 2, "return path: the switch port it came in on");
    assert_eq!(
        (b[64 + 2], b[64 + 36]),
        (2, 2),
        "a switch, asked from port 2"
    );
    // "0,1,3" from LID 2: on to LID 3's QP0, one hop further.
    let r = sa
        .answer(&dr_smp(0x0011, &[0, 1, 3]), &nodes)
        .unwrap()
        .remove(0);
    let b = bytes(&r).to_vec();
    assert_eq!((r.dlid, r.dest_qpn), (3, SMI_QPN));
    assert_eq!(
        (b[3], be16(&b, 4), b[6], b[7], b[192 + 1]),
        (0x01, 0, 2, 2, 2)
    );
    // LID 3's answer on its way back (its SMA set D and stepped back onto hop 2).
    let mut back = r.clone();
    back.slid = 3;
    back.dlid = sm::PERMISSIVE_LID;
    let Payload::Bytes(m) = &mut back.payload else {
        unreachable!()
    };
    (m[3], m[4], m[6]) = (0x81, 0x80, 2);
    m[192 + 2] = 1;
    let r = sa.answer(&back, &nodes).unwrap().remove(0);
    assert_eq!((r.dlid, bytes(&r)[6]), (2, 1), "back to LID 2, hop 1");
    // Nothing on port 9; port 3's link down; a route with a LID-routed part.
    assert!(sa.answer(&dr_smp(0x0011, &[0, 1, 9]), &nodes).is_none());
    nodes.down.set(Some(3));
    assert!(sa.answer(&dr_smp(0x0011, &[0, 1, 3]), &nodes).is_none());
    nodes.down.set(None);
    let mut mixed = dr_smp(0x0011, &[0, 1, 3]);
    let Payload::Bytes(m) = &mut mixed.payload else {
        unreachable!()
    };
    m[32..34].copy_from_slice(&2u16.to_be_bytes());
    assert!(sa.answer(&mixed, &nodes).is_none());
}

/// Five nodes on three switches in a ring: s0 has LIDs 1 and 2 (ports 1, 2), the link to
/// s1 (port 3) and to s2 (port 4); s1 has LIDs 3 and 4, s0 on port 3 and s2 on port 4;
/// s2 has LID 5, s1 on port 2 and s0 on port 3. `cut`: link s0-s1 down, tables as swept
/// with it up (`swept`: or swept again since).
fn ring(cut: bool, swept: bool) -> Nodes {
    use crate::subnet::{Subnet, SwitchSpec, Topology};
    let sw = |name: &str, hcas: &[Lid]| SwitchSpec {
        name: name.into(),
        hcas: hcas.to_vec(),
    };
    let t = Topology::new(
        vec![sw("s0", &[1, 2]), sw("s1", &[3, 4]), sw("s2", &[5])],
        vec![(0, 1), (1, 2), (2, 0)],
    )
    .unwrap();
    let lids = [1, 2, 3, 4, 5];
    let mut s = Subnet::new(t, &lids);
    if cut {
        s = s.with_link(0, false).unwrap();
    }
    if swept {
        s.sweep(&lids);
    }
    let mut n = Nodes::new(5);
    n.subnet = Some(std::sync::Arc::new(s));
    n
}

/// ibnetdiscover's walk across switches: a directed route crosses as many switches as its
/// path names, each moving the hop pointer and keeping its ingress port in the return
/// path; the switch it ends at answers as itself; the answer comes back through them all;
/// a route over a cut link goes nowhere.
#[test]
fn test_directed_routes_cross_several_switches_both_ways() {
    let mut sa = SubnetAdmin::new();
    let nodes = ring(false, false);
    let from_1 = |path: &[u8]| {
        let mut p = dr_smp(0x0011, path);
        p.slid = 1;
        p
    };
    // "0,1,4" from LID 1: s0, then out of its port 4 to s2, which answers; back to LID 1.
    let r = sa.answer(&from_1(&[0, 1, 4]), &nodes).unwrap().remove(0);
    let b = bytes(&r);
    assert_eq!((r.dlid, r.slid), (1, sm::PERMISSIVE_LID));
    assert_eq!((b[3], be16(b, 4), b[6], b[7]), (0x81, 0x8000, 1, 2));
    assert_eq!((b[192 + 1], b[192 + 2]), (1, 3), "the ports it came in by");
    assert_eq!(be64(b, 64 + 12), crate::abi::node_guid(SM_LID - 2));
    assert_eq!(
        (b[64 + 2], b[64 + 3], b[64 + 36]),
        (2, 3, 3),
        "s2, 3 ports, from 3"
    );
    // NodeDescription names it.
    let mut nd = from_1(&[0, 1, 4]);
    let Payload::Bytes(m) = &mut nd.payload else {
        unreachable!()
    };
    m[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    let r = sa.answer(&nd, &nodes).unwrap().remove(0);
    assert!(bytes(&r)[64..].starts_with(b"hcabench switch s2"));
    // "0,1,3,1": s0, s1, and on to LID 3's QP0, three hops out.
    let r = sa.answer(&from_1(&[0, 1, 3, 1]), &nodes).unwrap().remove(0);
    let b = bytes(&r);
    assert_eq!(
        (r.dlid, b[6], b[7], b[192 + 1], b[192 + 2]),
        (3, 3, 3, 1, 3)
    );
    // Its answer from LID 3, back through s1 and s0 to LID 1.
    let mut back = r.clone();
    (back.slid, back.dlid) = (3, sm::PERMISSIVE_LID);
    let Payload::Bytes(m) = &mut back.payload else {
        unreachable!()
    };
    (m[3], m[4], m[6]) = (0x81, 0x80, 3);
    m[192 + 3] = 1;
    let r = sa.answer(&back, &nodes).unwrap().remove(0);
    assert_eq!((r.dlid, bytes(&r)[6]), (1, 1), "back at LID 1, hop 1");
    // Over the cut link: nowhere. Round the other way: there.
    let cut = ring(true, false);
    assert!(sa.answer(&from_1(&[0, 1, 3]), &cut).is_none());
    let r = sa.answer(&from_1(&[0, 1, 4, 2]), &cut).unwrap().remove(0);
    assert_eq!(be64(bytes(&r), 64 + 12), crate::abi::node_guid(SM_LID - 1));
}

/// `smpquery -L` and `ibroute` ask a switch by its LID: the tables carry the SMP there and
/// the answer back; the switch's forwarding table is the SM's min-hop routing.
#[test]
fn test_a_switch_answers_lid_routed_smps_with_its_own_table() {
    let mut sa = SubnetAdmin::new();
    let nodes = ring(false, false);
    let to_s1 = |attr: u16, attr_mod: u32| {
        let mut p = get_smp(attr, attr_mod);
        (p.slid, p.dlid) = (1, SM_LID - 1);
        p
    };
    let r = sa.answer(&to_s1(0x0011, 0), &nodes).unwrap().remove(0);
    assert_eq!((r.slid, r.dlid), (SM_LID - 1, 1));
    let b = bytes(&r);
    assert_eq!(
        (be16(b, 4), b[64 + 2], b[64 + 36]),
        (0, 2, 3),
        "from its port 3"
    );
    let r = sa.answer(&to_s1(0x0019, 0), &nodes).unwrap().remove(0);
    let lft = &bytes(&r)[64..70];
    assert_eq!(
        lft,
        &[0xff, 3, 3, 1, 2, 4],
        "LIDs 1, 2 to s0; 3, 4 its own; 5 to s2"
    );
    let r = sa.answer(&to_s1(0x0015, 0), &nodes).unwrap().remove(0);
    let pi = &bytes(&r)[64..];
    assert_eq!(
        (be16(pi, 16), be16(pi, 18), be32(pi, 20)),
        (SM_LID - 1, SM_LID, 0)
    );
    // Only the SM's switch runs an SM.
    let r = sa.answer(&to_s1(0x0020, 0), &nodes).unwrap().remove(0);
    assert_eq!(be16(bytes(&r), 4), status::METHOD_ATTR_UNSUPPORTED);
    // A switch the tables no longer reach does not answer.
    assert!(sa.answer(&to_s1(0x0011, 0), &ring(true, false)).is_none());
    assert!(sa.answer(&to_s1(0x0011, 0), &ring(true, true)).is_some());
}

/// saquery on a subnet of switches: every switch, every link (inter-switch ones from both
/// ends), every switch's table; paths only where the tables lead, their lifetime growing
/// with the switches they cross.
#[test]
fn test_the_sa_describes_every_switch_and_link_and_paths_follow_the_tables() {
    use super::topology::cm;
    let mut sa = SubnetAdmin::new();
    let ports = ring(false, false);
    let get_table = |sa: &mut SubnetAdmin, ports: &Nodes, attr: u16, mask: u64, d: &[u8]| {
        table(sa, &mad(method::GET_TABLE, attr, mask, d), ports)
    };
    let (_, rows) = get_table(&mut sa, &ports, attr::sa::SWITCH_INFO_RECORD, 0, &[]);
    let lids: Vec<Lid> = rows.iter().map(|r| be16(r, 0)).collect();
    assert_eq!(lids, [SM_LID, SM_LID - 1, SM_LID - 2]);
    let (_, rows) = get_table(&mut sa, &ports, attr::sa::LINK_RECORD, 0, &[]);
    let links: Vec<(Lid, u8, u8, Lid)> = rows
        .iter()
        .map(|r| (be16(r, 0), r[2], r[3], be16(r, 4)))
        .collect();
    assert_eq!(links.len(), 5 * 2 + 3 * 2);
    assert!(links.contains(&(SM_LID, 3, 3, SM_LID - 1)));
    assert!(links.contains(&(SM_LID - 1, 3, 3, SM_LID)));
    assert!(links.contains(&(5, 1, 1, SM_LID - 2)));
    let (_, rows) = get_table(&mut sa, &ports, attr::sa::NODE_RECORD, 0, &[]);
    assert_eq!(rows.len(), 5 + 3);
    let mut d = [0u8; 72];
    d[0..2].copy_from_slice(&(SM_LID - 2).to_be_bytes());
    let (_, rows) = get_table(
        &mut sa,
        &ports,
        attr::sa::LFT_RECORD,
        cm::LID | cm::BLOCK_1,
        &d,
    );
    assert_eq!(rows[0][8..14], [0xff, 3, 3, 2, 2, 1]);
    let (_, rows) = get_table(&mut sa, &ports, attr::sa::PORT_INFO_RECORD, 0, &[]);
    assert_eq!(
        rows.len(),
        5 + (5 + 5 + 4),
        "five CAs, each switch's ports 0..=n"
    );
    // Paths: one switch keeps the subnet's lifetime, two add one step.
    let path = |sa: &mut SubnetAdmin, ports: &Nodes, from: Lid, to: Lid| {
        let mut d = [0u8; 64];
        d[40..42].copy_from_slice(&to.to_be_bytes());
        d[42..44].copy_from_slice(&from.to_be_bytes());
        let q = mad(method::GET, attr::sa::PATH_RECORD, pr::DLID | pr::SLID, &d);
        let r = sa.answer(&q, ports).unwrap().remove(0);
        let b = bytes(&r).to_vec();
        (be16(&b, 4), b[at::SA_DATA + 56] & 0x3f)
    };
    assert_eq!(path(&mut sa, &ports, 1, 2), (0, DEFAULT_PACKET_LIFE));
    assert_eq!(path(&mut sa, &ports, 1, 5), (0, DEFAULT_PACKET_LIFE + 1));
    let cut = ring(true, false);
    assert_eq!(path(&mut sa, &cut, 1, 3).0, status::NO_RECORDS);
    let swept = ring(true, true);
    assert_eq!(
        path(&mut sa, &swept, 1, 3),
        (0, DEFAULT_PACKET_LIFE + 2),
        "three switches"
    );
    // The cut link is gone from the links.
    let (_, rows) = get_table(&mut sa, &swept, attr::sa::LINK_RECORD, 0, &[]);
    assert_eq!(rows.len(), 5 * 2 + 2 * 2);
    // s1 cut off (s1-s2 down too): it and LIDs 3 and 4 are gone from the SA's records,
    // and from paths, its own among them.
    let mut off = (*swept.subnet.clone().unwrap())
        .clone()
        .with_link(1, false)
        .unwrap();
    off.sweep(&[1, 2, 3, 4, 5]);
    let mut isolated = Nodes::new(5);
    isolated.subnet = Some(std::sync::Arc::new(off));
    let (_, rows) = get_table(&mut sa, &isolated, attr::sa::NODE_RECORD, 0, &[]);
    let lids: Vec<Lid> = rows.iter().map(|r| be16(r, 0)).collect();
    assert_eq!(lids, [1, 2, 5, SM_LID, SM_LID - 2]);
    let (_, rows) = get_table(&mut sa, &isolated, attr::sa::PORT_INFO_RECORD, 0, &[]);
    assert_eq!(rows.len(), 3 + (5 + 4));
    assert_eq!(path(&mut sa, &isolated, 3, 3).0, status::NO_RECORDS);
    assert_eq!(path(&mut sa, &isolated, 1, 5).0, 0);
}

/// The switches' names are what ibnetdiscover shows: the SM's switch says so too.
#[test]
fn test_named_switches_describe_themselves() {
    let nodes = ring(false, false);
    let s = nodes.subnet();
    let desc: Vec<String> = s.switches().iter().map(sm::node_desc).collect();
    assert_eq!(
        desc,
        [
            "hcabench switch s0 (subnet manager)",
            "hcabench switch s1",
            "hcabench switch s2"
        ]
    );
    let single = three().subnet();
    assert_eq!(sm::node_desc(&single.switches()[0]), sm::NODE_DESC);
}
