//! The subnet administrator fed any sequence of MADs (and port changes): it never panics,
//! every answer is one MAD for the asker's QP, and what it keeps stays within its bounds.
//! SMPs to the SM's QP0, LID-routed or directed-route through the fabric's switch, get at
//! most one packet each, for a QP0 on a port that is there with its link up. The switch's
//! PMA answers every Get and Set with one MAD to the asker's QP1.

use std::cell::Cell;

use arbitrary::Arbitrary;
use hca_model::abi::{node_guid, Lid, COUNTERS_LEN, SMI_QPN};
use hca_model::packet::{Packet, Payload, UD_SEND_ONLY};
use hca_model::sa::mad::{self, at, class, SA_CLASS_VERSION};
use hca_model::sa::pma::Agent;
use hca_model::sa::sm::PERMISSIVE_LID;
use hca_model::sa::{Ports, SubnetAdmin, MAD_SIZE, SM_LID};

struct Nodes {
    n: Lid,
    down: Cell<u64>,
    now: Cell<u64>,
}

impl Ports for Nodes {
    fn lid_of(&self, guid: u64) -> Option<Lid> {
        (1..=self.n).find(|&l| node_guid(l) == guid)
    }
    fn guid_of(&self, lid: Lid) -> Option<u64> {
        (1..=self.n).contains(&lid).then(|| node_guid(lid))
    }
    fn lids(&self) -> Vec<Lid> {
        (1..=self.n).collect()
    }
    fn link_up(&self, lid: Lid) -> bool {
        self.down.get() & (1 << (lid % 64)) == 0
    }
    fn capability_mask(&self, lid: Lid) -> u32 {
        u32::from(lid).wrapping_mul(0x9e37_79b9)
    }
    fn now_ns(&self) -> u64 {
        self.now.get()
    }
    /// Counters that grow with time, large enough to saturate PortCounters' fields.
    fn counters(&self, lid: Lid) -> Option<[u64; COUNTERS_LEN as usize]> {
        let t = self.now.get() / 1_000_000_000;
        let c = std::array::from_fn(|i| (u64::from(lid) << (i % 40)).wrapping_mul(t + 1));
        self.guid_of(lid).map(|_| c)
    }
}

#[derive(Arbitrary, Debug)]
pub enum Step {
    /// A MAD from node `from` (QP `qpn`), with the SA's class and version most of the time.
    Mad {
        from: u8,
        qpn: u8,
        sa_header: bool,
        method: u8,
        attr: u16,
        comp_mask: u64,
        rmpp: [u8; 12],
        data: Vec<u8>,
    },
    /// A short or odd packet.
    Raw {
        from: u8,
        qkey: u32,
        dest_qpn: u32,
        bytes: Vec<u8>,
    },
    /// An SMP from node `from`'s QP0: LID-routed to the SM, or directed-route (to the
    /// permissive LID) with these hop fields and paths.
    Smp {
        from: u8,
        directed: bool,
        method: u8,
        attr: u8,
        attr_mod: u8,
        status: u16,
        hops: (u8, u8),
        dr_lids: (bool, bool),
        initial_path: Vec<u8>,
        return_path: Vec<u8>,
    },
    /// A Performance Management MAD for the switch's PMA from node `from`'s QP1.
    Pma {
        from: u8,
        versions_ok: bool,
        method: u8,
        attr: u8,
        port: u8,
        select: u16,
    },
    PortChanged {
        lid: u8,
        up: bool,
    },
    Time {
        seconds: u16,
    },
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    nodes: u8,
    steps: Vec<Step>,
}

/// One run of the target on a decoded input.
pub fn run(input: Input) {
    let ports = Nodes {
        n: Lid::from(input.nodes % 70) + 1,
        down: Cell::new(0),
        now: Cell::new(0),
    };
    let mut sa = SubnetAdmin::new();
    let mut pma = Agent::default();
    for step in input.steps.into_iter().take(256) {
        let (pkt, from) = match step {
            Step::Mad {
                from,
                qpn,
                sa_header,
                method,
                attr,
                comp_mask,
                rmpp,
                data,
            } => {
                // The attributes the SA knows, most of the time.
                const ATTRS: [u16; 8] = [1, 2, 3, 0x11, 0x12, 0x31, 0x35, 0x38];
                let attr = if attr & 0x8000 == 0 {
                    ATTRS[usize::from(attr) % 8]
                } else {
                    attr
                };
                let mut m = mad::header(class::SUBN_ADM, SA_CLASS_VERSION, method, 0, attr);
                if !sa_header {
                    m[..at::METHOD].fill(0);
                }
                m[24..36].copy_from_slice(&rmpp);
                m[at::SA_COMP_MASK..at::SA_DATA].copy_from_slice(&comp_mask.to_be_bytes());
                let n = data.len().min(MAD_SIZE - at::SA_DATA);
                m[at::SA_DATA..at::SA_DATA + n].copy_from_slice(&data[..n]);
                let from = Lid::from(from);
                (mad::to_sa(from, u32::from(qpn), m.to_vec()), from)
            }
            Step::Raw {
                from,
                qkey,
                dest_qpn,
                bytes,
            } => {
                let from = Lid::from(from);
                let p = Packet {
                    slid: from,
                    opcode: UD_SEND_ONLY,
                    dest_qpn,
                    src_qpn: 1,
                    qkey,
                    payload: Payload::Bytes(bytes),
                    ..Default::default()
                };
                (p, from)
            }
            Step::Smp {
                from,
                directed,
                method,
                attr,
                attr_mod,
                status,
                hops,
                dr_lids,
                initial_path,
                return_path,
            } => {
                let class = if directed {
                    class::SUBN_DIRECTED_ROUTE
                } else {
                    class::SUBN_LID_ROUTED
                };
                let mut m = mad::header(class, 1, method, 0, u16::from(attr));
                m[4..6].copy_from_slice(&status.to_be_bytes());
                (m[6], m[7]) = hops;
                m[20..24].copy_from_slice(&u32::from(attr_mod).to_be_bytes());
                let dr = |permissive: bool| if permissive { [0xff, 0xff] } else { [0, 2] };
                m[32..34].copy_from_slice(&dr(dr_lids.0));
                m[34..36].copy_from_slice(&dr(dr_lids.1));
                for (at, path) in [(128, &initial_path), (192, &return_path)] {
                    let n = path.len().min(64);
                    m[at..at + n].copy_from_slice(&path[..n]);
                }
                let p = Packet {
                    slid: Lid::from(from),
                    dlid: if directed { PERMISSIVE_LID } else { SM_LID },
                    opcode: UD_SEND_ONLY,
                    dest_qpn: SMI_QPN,
                    src_qpn: SMI_QPN,
                    payload: Payload::Bytes(m.to_vec()),
                    ..Default::default()
                };
                if let Some(answers) = sa.answer(&p, &ports) {
                    let [a] = answers.as_slice() else {
                        panic!("{} packets for one SMP", answers.len());
                    };
                    assert_eq!((a.payload.len() as usize, a.dest_qpn), (MAD_SIZE, SMI_QPN));
                    let there = ports.guid_of(a.dlid).is_some() && ports.link_up(a.dlid);
                    assert!(there || !directed, "to LID {} that is not there", a.dlid);
                    assert!(directed || a.dlid == p.slid);
                }
                continue;
            }
            Step::Pma {
                from,
                versions_ok,
                method,
                attr,
                port,
                select,
            } => {
                let version = if versions_ok { 1 } else { method >> 4 };
                // ClassPortInfo, PortCounters, PortCountersExtended, or any.
                let attr = [1, 0x12, 0x1d, u16::from(attr)][usize::from(attr % 4)];
                let mut m = mad::header(class::PERF_MGMT, version, method, 0, attr);
                m[65] = port;
                m[66..68].copy_from_slice(&select.to_be_bytes());
                let p = mad::to_sa(Lid::from(from), 1, m.to_vec());
                if let Some(a) = pma.answer(&p, &ports) {
                    assert_eq!(a.payload.len() as usize, MAD_SIZE);
                    assert_eq!((a.dlid, a.dest_qpn), (p.slid, 1));
                } else {
                    assert!(method & 0x80 != 0, "no answer to method {method:#x}");
                }
                continue;
            }
            Step::PortChanged { lid, up } => {
                let lid = Lid::from(lid);
                let bit = 1u64 << (lid % 64);
                let d = ports.down.get();
                ports.down.set(if up { d & !bit } else { d | bit });
                for r in sa.port_changed(lid, up, &ports) {
                    assert_eq!(r.payload.len() as usize, MAD_SIZE);
                }
                continue;
            }
            Step::Time { seconds } => {
                ports
                    .now
                    .set(ports.now.get() + u64::from(seconds) * 1_000_000_000);
                continue;
            }
        };
        if let Some(answers) = sa.answer(&pkt, &ports) {
            assert!(answers.len() <= 65, "{} packets for one MAD", answers.len());
            for a in answers {
                assert_eq!(a.payload.len() as usize, MAD_SIZE);
                assert_eq!((a.dlid, a.dest_qpn), (from, pkt.src_qpn));
            }
        }
        let (services, informs) = sa.registrations();
        assert!(services <= 1024 && informs <= 256);
        assert!(sa.groups().count() <= 0x3fff);
    }
}
