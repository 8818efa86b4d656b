//! Fabric capture: every packet as its sender put it on the wire, written to a pcap file as
//! the IB link carries it: LRH, BTH, the extended headers the opcode carries (RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, DETH), the payload padded to 4 bytes, ICRC and VCRC.
//!
//! Two framings of the same bytes ([`CaptureFormat`]): LINKTYPE_INFINIBAND (247), the
//! registered link type for raw IB frames, and LINKTYPE_ERF (197) with each frame in an ERF
//! record of type 21 (InfiniBand). Wireshark's file reader has no entry for link type 247
//! (4.0 reports "network type 247 unknown or unsupported"), while it decodes ERF InfiniBand
//! records with its InfiniBand dissector, so ERF is what opens in Wireshark and tshark.
//!
//! The capture point is the sender's uplink, before any fault hook: a packet a fault plan
//! then drops, delays or duplicates appears once, as sent, and a resend appears again. The
//! model carries no GRH on unicast packets (every packet is LRH-routed inside one subnet),
//! so those frames carry LNH = "IBA local"; the BTH carries the packet's P_Key.

use std::io::{self, Write};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::fabric::PacketTap;
use crate::packet::*;
use crate::sync::Unpoisoned;

/// pcap's link type for raw InfiniBand frames starting at the LRH.
pub const LINKTYPE_INFINIBAND: u32 = 247;
/// pcap's link type for Endace ERF records.
pub const LINKTYPE_ERF: u32 = 197;
/// The ERF record type of an InfiniBand frame.
const ERF_TYPE_INFINIBAND: u8 = 21;
/// ERF flags: variable-length record, interface 0.
const ERF_FLAG_VLEN: u8 = 0x04;
/// The pcap magic for nanosecond timestamps.
const PCAP_MAGIC_NS: u32 = 0xa1b2_3c4d;

/// How the frames are framed in the pcap file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CaptureFormat {
    /// LINKTYPE_ERF: what Wireshark and tshark decode.
    #[default]
    Erf,
    /// LINKTYPE_INFINIBAND (247): the bare frames, for tools that read that link type.
    Infiniband,
}

impl CaptureFormat {
    /// The pcap link type this format's frames are written under.
    pub fn linktype(self) -> u32 {
        match self {
            CaptureFormat::Erf => LINKTYPE_ERF,
            CaptureFormat::Infiniband => LINKTYPE_INFINIBAND,
        }
    }
}

/// `frame` in an ERF record stamped `ts_ns` (Unix time): a 16-byte header (timestamp as
/// 32.32 fixed-point seconds, type, flags, record length, loss counter, wire length), then
/// the frame padded to 8 bytes.
fn erf_record(ts_ns: u64, frame: &[u8]) -> Vec<u8> {
    let secs = ts_ns / 1_000_000_000;
    let frac = ((ts_ns % 1_000_000_000) << 32) / 1_000_000_000;
    let padded = frame.len().div_ceil(8) * 8;
    let mut r = Vec::with_capacity(16 + padded);
    r.extend_from_slice(&(secs << 32 | frac).to_le_bytes());
    r.push(ERF_TYPE_INFINIBAND);
    r.push(ERF_FLAG_VLEN);
    r.extend_from_slice(&((16 + padded) as u16).to_be_bytes());
    r.extend_from_slice(&0u16.to_be_bytes());
    r.extend_from_slice(&(frame.len() as u16).to_be_bytes());
    r.extend_from_slice(frame);
    r.resize(16 + padded, 0);
    r
}
const SNAPLEN: u32 = 65_535;
/// LRH Link Next Header: a BTH follows directly (no GRH), or a GRH comes first.
const LNH_IBA_LOCAL: u8 = 2;
const LNH_IBA_GLOBAL: u8 = 3;
const LRH_BYTES: usize = 8;
const GRH_BYTES: usize = 40;

/// The frame an IB link would carry for `pkt` (one MTU packet, not a train).
pub fn encode(pkt: &Packet, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(104 + payload.len());
    f.extend_from_slice(&[0; LRH_BYTES]); // LRH, filled in once the length is known
    if pkt.grh().is_some() {
        f.extend_from_slice(&[0; GRH_BYTES]); // GRH, likewise
    }
    encode_bth(&mut f, pkt, payload.len());
    encode_ext_headers(&mut f, pkt);
    f.extend_from_slice(payload);
    let pad = (4 - payload.len() % 4) % 4;
    f.resize(f.len() + pad, 0);
    // PktLen counts 4-byte words from the LRH through the ICRC.
    let words = ((f.len() + 4) / 4) as u16;
    let lnh = match pkt.grh() {
        Some(g) => {
            // PayLen: from the end of the GRH through the ICRC.
            let pay_len = (f.len() - LRH_BYTES - GRH_BYTES + 4) as u16;
            if let Some(room) = f.get_mut(LRH_BYTES..LRH_BYTES + GRH_BYTES) {
                room.copy_from_slice(&g.to_bytes(pay_len));
            }
            LNH_IBA_GLOBAL
        }
        None => LNH_IBA_LOCAL,
    };
    let mut lrh = [0u8; LRH_BYTES]; // VL 0, LVer 0
    lrh[1] = (pkt.sl & 0xf) << 4 | lnh;
    lrh[2..4].copy_from_slice(&pkt.dlid.to_be_bytes());
    lrh[4..6].copy_from_slice(&(words & 0x7ff).to_be_bytes());
    lrh[6..8].copy_from_slice(&pkt.slid.to_be_bytes());
    if let Some(room) = f.get_mut(..LRH_BYTES) {
        room.copy_from_slice(&lrh);
    }
    let icrc = icrc(&f, pkt.grh().is_some());
    f.extend_from_slice(&icrc.to_le_bytes());
    let vcrc = vcrc(&f);
    f.extend_from_slice(&vcrc.to_be_bytes());
    f
}

fn encode_bth(f: &mut Vec<u8>, pkt: &Packet, payload_len: usize) {
    let pad = ((4 - payload_len % 4) % 4) as u8;
    f.push(pkt.wire_opcode());
    f.push(u8::from(pkt.solicited) << 7 | pad << 4); // SE, MigReq 0, PadCnt, TVer 0
    f.extend_from_slice(&pkt.pkey.to_be_bytes());
    f.extend_from_slice(&(pkt.dest_qpn & 0x00ff_ffff).to_be_bytes()); // resv8a, DestQP
                                                                      // AckReq on the packet that ends an RC request message: the responder answers it.
    let ack_req = pkt.is_request() && !pkt.is_ud() && !pkt.uc && pkt.ends_message();
    let word = u32::from(ack_req) << 31 | (pkt.psn & PSN_MASK);
    f.extend_from_slice(&word.to_be_bytes());
}

fn encode_ext_headers(f: &mut Vec<u8>, pkt: &Packet) {
    if pkt.is_ud() {
        f.extend_from_slice(&pkt.qkey.to_be_bytes());
        f.extend_from_slice(&(pkt.src_qpn & 0x00ff_ffff).to_be_bytes());
    }
    match (pkt.reth, pkt.atomic()) {
        (Some(r), Some((swap_add, compare))) => {
            f.extend_from_slice(&r.va.to_be_bytes());
            f.extend_from_slice(&r.rkey.to_be_bytes());
            f.extend_from_slice(&swap_add.to_be_bytes());
            f.extend_from_slice(&compare.to_be_bytes());
            // IBA has no header for a masked atomic's masks (vendors' extended atomics
            // differ): they follow the AtomicETH, where a dissector shows them as data.
            if let Some((compare_mask, swap_mask)) = pkt.atomic_masks() {
                f.extend_from_slice(&compare_mask.to_be_bytes());
                f.extend_from_slice(&swap_mask.to_be_bytes());
            }
        }
        (Some(r), None) => {
            f.extend_from_slice(&r.va.to_be_bytes());
            f.extend_from_slice(&r.rkey.to_be_bytes());
            f.extend_from_slice(&r.len.to_be_bytes());
        }
        _ => {}
    }
    if let Some((syndrome, msn)) = pkt.aeth {
        f.extend_from_slice(&(u32::from(syndrome) << 24 | msn & 0x00ff_ffff).to_be_bytes());
    }
    if let Some(orig) = pkt.atomic_ack() {
        f.extend_from_slice(&orig.to_be_bytes());
    }
    if let Some(imm) = pkt.imm {
        f.extend_from_slice(&imm.to_be_bytes());
    }
    if let Some(rkey) = pkt.ieth {
        f.extend_from_slice(&rkey.to_be_bytes());
    }
}

/// The ICRC's CRC-32: IEEE 802.3's (reflected, as Ethernet's FCS).
const CRC32: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// The VCRC's CRC-16: IBA's polynomial 0x100B, MSB first, all ones in, inverted out.
const CRC16_IB: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::Algorithm {
    width: 16,
    poly: 0x100b,
    init: 0xffff,
    refin: false,
    refout: false,
    xorout: 0xffff,
    check: 0x4591,
    residue: 0xf6aa,
});

/// The invariant CRC: CRC-32 over the frame with the fields a switch or router may change
/// (LRH VL; GRH traffic class, flow label and hop limit; BTH resv8a) read as all ones.
pub(crate) fn icrc(frame: &[u8], grh: bool) -> u32 {
    let bth = LRH_BYTES + if grh { GRH_BYTES } else { 0 };
    let (Some(fixed), Some(rest)) = (frame.get(..bth + 12), frame.get(bth + 12..)) else {
        return 0; // not a frame `encode` made
    };
    let mut head = [0u8; LRH_BYTES + GRH_BYTES + 12];
    for (h, f) in head.iter_mut().zip(fixed) {
        *h = *f;
    }
    head[0] |= 0xf0;
    if grh {
        head[LRH_BYTES] |= 0x0f;
        head[LRH_BYTES + 1..LRH_BYTES + 4].fill(0xff);
        head[LRH_BYTES + 7] = 0xff;
    }
    if let Some(resv8a) = head.get_mut(bth + 4) {
        *resv8a = 0xff;
    }
    let mut d = CRC32.digest();
    d.update(head.get(..bth + 12).unwrap_or_default());
    d.update(rest);
    d.finalize()
}

/// The variant CRC: CRC-16 over the frame through its ICRC.
pub(crate) fn vcrc(frame: &[u8]) -> u16 {
    CRC16_IB.checksum(frame)
}

/// A pcap writer on the fabric (`fabric.set_tap(Some(Arc::new(capture)))`).
pub struct Capture {
    out: Mutex<Box<dyn Write + Send>>,
    format: CaptureFormat,
    /// Wall-clock nanoseconds at fabric time 0, so frames carry real timestamps.
    epoch_ns: u64,
    frames: std::sync::atomic::AtomicU64,
}

impl Capture {
    /// Writes the pcap header to `out`; `fabric_now_ns` is the fabric's clock at this moment.
    pub fn new(
        mut out: Box<dyn Write + Send>,
        format: CaptureFormat,
        fabric_now_ns: u64,
    ) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&PCAP_MAGIC_NS.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&[0; 8]); // thiszone, sigfigs
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&format.linktype().to_le_bytes());
        out.write_all(&h)?;
        out.flush()?;
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Ok(Self {
            out: Mutex::new(out),
            format,
            epoch_ns: wall.saturating_sub(fabric_now_ns),
            frames: Default::default(),
        })
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn write_frame(&self, now_ns: u64, frame: &[u8]) -> io::Result<()> {
        let ts = self.epoch_ns + now_ns;
        let erf;
        let frame = match self.format {
            CaptureFormat::Infiniband => frame,
            CaptureFormat::Erf => {
                erf = erf_record(ts, frame);
                &erf[..]
            }
        };
        let len = frame.len() as u32;
        let mut rec = Vec::with_capacity(16 + frame.len());
        rec.extend_from_slice(&((ts / 1_000_000_000) as u32).to_le_bytes());
        rec.extend_from_slice(&((ts % 1_000_000_000) as u32).to_le_bytes());
        rec.extend_from_slice(&len.min(SNAPLEN).to_le_bytes());
        rec.extend_from_slice(&len.to_le_bytes());
        rec.extend(frame.iter().take(SNAPLEN as usize));
        let mut out = self.out.lock_unpoisoned();
        // Flushed per frame: the file is readable while the cluster runs, and complete if
        // the process dies.
        out.write_all(&rec)?;
        out.flush()
    }
}

impl PacketTap for Capture {
    fn on_wire(&self, now_ns: u64, pkt: &Packet) {
        let mut payload = pkt.payload.clone();
        let bytes = match payload.make_owned() {
            Ok(b) => std::mem::take(b),
            // The sender's memory went away under it: the frame shows no payload.
            Err(_) => Vec::new(),
        };
        let frame = encode(pkt, &bytes);
        match self.write_frame(now_ns, &frame) {
            Ok(()) => {
                self.frames
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(e) => log::warn!("capture: {e}; frame lost"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_crcs_are_ieee_crc32_and_ibas_crc16() {
        assert_eq!(CRC32.checksum(b"123456789"), 0xcbf4_3926);
        // The VCRC's polynomial bit by bit (x^16 + x^12 + x^3 + x + 1), as IBA 7.8.2 gives it.
        let mut crc: u16 = 0xffff;
        for &b in b"123456789" {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    crc << 1 ^ 0x100b
                } else {
                    crc << 1
                };
            }
        }
        assert_eq!(CRC16_IB.checksum(b"123456789"), !crc);
    }

    #[test]
    fn test_a_write_only_frame_has_its_headers_where_ib_puts_them() {
        let pkt = Packet {
            slid: 1,
            dlid: 2,
            opcode: RC_WRITE_ONLY,
            dest_qpn: 0x12_3456,
            psn: 0xab_cdef,
            reth: Some(Reth {
                va: 0x1122_3344_5566_7788,
                rkey: 0xdead_beef,
                len: 5,
            }),
            ..Default::default()
        };
        let f = encode(&pkt, b"hello");
        // LRH 8 + BTH 12 + RETH 16 + 5 bytes + 3 pad + ICRC 4 + VCRC 2.
        assert_eq!(f.len(), 50);
        assert_eq!(f[1] & 3, LNH_IBA_LOCAL);
        assert_eq!(u16::from_be_bytes([f[2], f[3]]), 2);
        assert_eq!(u16::from_be_bytes([f[4], f[5]]) & 0x7ff, 12); // 48 bytes / 4
        assert_eq!(u16::from_be_bytes([f[6], f[7]]), 1);
        assert_eq!(f[8], RC_WRITE_ONLY);
        assert_eq!((f[9] >> 4) & 3, 3, "PadCnt");
        assert_eq!(&f[13..16], &[0x12, 0x34, 0x56]);
        assert_eq!(f[16] & 0x80, 0x80, "AckReq on a request's last packet");
        assert_eq!(&f[17..20], &[0xab, 0xcd, 0xef]);
        assert_eq!(&f[28..32], &0xdead_beefu32.to_be_bytes());
        assert_eq!(&f[36..41], b"hello");
        // The ICRC ignores VL and resv8a, which a switch may rewrite.
        let mut g = f.clone();
        g[0] |= 0x30;
        g[12] = 7;
        assert_eq!(icrc(&g[..44], false), icrc(&f[..44], false));
        g[40] ^= 1;
        assert_ne!(icrc(&g[..44], false), icrc(&f[..44], false));
    }

    #[test]
    fn test_a_uc_frame_has_ucs_opcode_and_asks_no_ack() {
        let pkt = Packet {
            opcode: RC_WRITE_ONLY,
            uc: true,
            reth: Some(Reth::default()),
            ..Default::default()
        };
        let f = encode(&pkt, b"hi");
        assert_eq!(f[8], 0x2a, "UC RDMA WRITE Only");
        assert_eq!(f[16] & 0x80, 0, "no AckReq: UC is never answered");
    }

    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The two framings carry the same frame bytes; only the pcap link type and ERF's
    /// record header differ.
    #[test]
    fn test_both_formats_carry_the_same_frames() {
        let pkt = Packet {
            slid: 3,
            dlid: 4,
            opcode: RC_ACK,
            dest_qpn: 7,
            aeth: Some((AETH_ACK, 9)),
            ..Default::default()
        };
        let mut files = Vec::new();
        for format in [CaptureFormat::Infiniband, CaptureFormat::Erf] {
            let buf = Buf::default();
            let cap = Capture::new(Box::new(buf.clone()), format, 0).unwrap();
            cap.on_wire(1_500_000_000, &pkt);
            let bytes = buf.0.lock().unwrap().clone();
            assert_eq!(&bytes[20..24], &format.linktype().to_le_bytes());
            files.push(bytes);
        }
        let frame = encode(&pkt, &[]);
        let ib = &files[0][24 + 16..];
        assert_eq!(ib, &frame[..]);
        let erf = &files[1][24 + 16..];
        assert_eq!((erf[8], usize::from(erf[15])), (21, frame.len()));
        assert_eq!(&erf[16..16 + frame.len()], &frame[..]);
        assert_eq!(erf.len() % 8, 0);
    }
}
