//! A message longer than `INBOUND_WINDOW` is received a window at a time: the responder
//! keeps the records of one window of its destination (a receive WQE's SGEs or a WRITE's
//! rkey range), not a record per page of the whole message, and resolves the next window,
//! checking its key again, as the message's packets reach it. Here: such messages land
//! byte for byte over scattered pages, and a receive buffer deregistered while its message
//! arrives fails that message instead of being written.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::{Fabric, LinkDir, LinkHook, LinkId, Verdict, INBOUND_WINDOW};
use hca_test_driver::*;

/// Registers `npages` pages of `d`'s memory in a scattered order (page i of the MR is
/// page `(i * 7) % npages` of the block, with a gap between every two; `npages` not a
/// multiple of 7, so that no page repeats): returns the key, the iova, and the
/// guest-physical address of each MR page in order.
fn scattered_mr(d: &mut Driver, pdn: u32, npages: u64, access: u32) -> (u32, u64, Vec<u64>) {
    assert_ne!(npages % 7, 0);
    let block = d.alloc(2 * npages * 4096, 4096);
    let pages: Vec<u64> = (0..npages)
        .map(|i| block + 2 * ((i * 7) % npages) * 4096)
        .collect();
    let list = d.alloc(npages * 8, 8);
    let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    d.write(list, &bytes);
    let iova = 0x7000_0000;
    let key = d
        .try_reg_mr(&HcaCmdRegMr {
            iova,
            length: npages * 4096,
            page_list: list,
            pdn,
            access,
            npages: npages as u32,
            page_shift: 12,
            ..Default::default()
        })
        .expect("scattered MR");
    (key, iova, pages)
}

/// The `len` bytes at byte `off` of an MR whose pages are `pages`.
fn read_mr(d: &Driver, pages: &[u64], off: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let mut at = off;
    while at < off + len {
        let (page, in_page) = ((at / 4096) as usize, at % 4096);
        let n = (4096 - in_page).min(off + len - at);
        out.extend(d.read(pages[page] + in_page, n as usize));
        at += n;
    }
    out
}

fn pair(mib: u64) -> Pair {
    Pair::build_with_memory(
        Fabric::with_manual_clock(),
        mib,
        MTU_4096 as u8,
        ALL_ACCESS,
        DEFAULT_RTS,
    )
}

#[test]
fn test_a_send_longer_than_a_window_lands_whole_across_several_scattered_sges() {
    let mut p = pair(64);
    let (k1, iova1, pages1) = scattered_mr(&mut p.b, p.pd_b, 900, ACCESS_LOCAL_WRITE);
    let (k2, iova2, pages2) = scattered_mr(&mut p.b, p.pd_b, 701, ACCESS_LOCAL_WRITE);
    let phys = p.b.alloc(4096, 4096);
    // Room: 100 bytes, then 3 MiB + 17 from byte 300 of the first MR, then the second MR
    // from byte 5. The message fills it but for 1000 bytes.
    let l1 = (3 << 20) + 17;
    let l2 = 700 * 4096 - 5;
    let room = 100 + l1 + l2;
    let len = room - 1000;
    assert!(u64::from(len) > 4 * INBOUND_WINDOW);
    p.b.post_recv(
        &mut p.qb,
        7,
        &[
            sge(phys, 100, LOCAL_DMA_LKEY),
            sge(iova1 + 300, l1, k1),
            sge(iova2 + 5, l2, k2),
        ],
    );
    let src = p.a.alloc(u64::from(len), 4096);
    let data = pattern(len as usize, 3);
    p.a.write(src, &data);
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, len, LOCAL_DMA_LKEY)],
    );
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(1, WC_SUCCESS)]);
    let cqes = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(cqes.len(), 1);
    assert_eq!((cqes[0].wr_id, cqes[0].status), (7, WC_SUCCESS as u8));
    assert_eq!(cqes[0].byte_len, len);
    let mut got = p.b.read(phys, 100);
    got.extend(read_mr(&p.b, &pages1, 300, u64::from(l1)));
    got.extend(read_mr(&p.b, &pages2, 5, u64::from(len - 100 - l1)));
    assert!(got == data, "the message landed in its SGEs in order");
}

#[test]
fn test_a_write_longer_than_a_window_lands_whole_over_scattered_pages() {
    let mut p = pair(64);
    let npages = 1500;
    let (rkey, iova, pages) = scattered_mr(
        &mut p.b,
        p.pd_b,
        npages,
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
    );
    let len = (5 << 20) + 333u32;
    let at = 4096 * 3 + 123;
    let src = p.a.alloc(u64::from(len), 4096);
    let data = pattern(len as usize, 9);
    p.a.write(src, &data);
    let mut w = send_wr(2, WR_RDMA_WRITE, WQE_SIGNALED);
    w.remote_addr = iova + at;
    w.rkey = rkey;
    p.a.post_send(&mut p.qa, w, &[sge(src, len, LOCAL_DMA_LKEY)]);
    assert_eq!(p.a.drain_statuses(&mut p.cq_a), vec![(2, WC_SUCCESS)]);
    assert!(read_mr(&p.b, &pages, at, u64::from(len)) == data);
    // The bytes around it are untouched.
    assert_eq!(read_mr(&p.b, &pages, at - 1, 1), vec![0]);
    assert_eq!(read_mr(&p.b, &pages, at + u64::from(len), 1), vec![0]);
}

/// Passes A's first `pass` packets, then drops A's packets while `on`.
struct Cut {
    lid: u16,
    pass: AtomicU32,
    on: AtomicBool,
}

impl LinkHook for Cut {
    fn on_packet(&self, link: LinkId, _now: u64, _pkt: &mut Packet) -> Verdict {
        if link.dir != LinkDir::Up || link.lid != self.lid || !self.on.load(Relaxed) {
            return Verdict::Pass;
        }
        let left = self.pass.load(Relaxed);
        if left > 0 {
            self.pass.store(left - 1, Relaxed);
            return Verdict::Pass;
        }
        Verdict::Drop
    }
}

#[test]
fn test_a_receive_buffer_deregistered_while_its_long_message_arrives_fails_it() {
    let mut p = pair(64);
    let (k, iova, pages) = scattered_mr(&mut p.b, p.pd_b, 1024, ACCESS_LOCAL_WRITE);
    let len = 4u32 << 20;
    p.b.post_recv(&mut p.qb, 7, &[sge(iova, len, k)]);
    let src = p.a.alloc(u64::from(len), 4096);
    p.a.write(src, &pattern(len as usize, 5));
    // The first window and a little of the second arrive; the rest is lost.
    let cut = Arc::new(Cut {
        lid: p.a.lid(),
        pass: AtomicU32::new(300),
        on: true.into(),
    });
    p.fabric.set_hook(Some(cut.clone()));
    p.a.post_send(
        &mut p.qa,
        send_wr(1, WR_SEND, WQE_SIGNALED),
        &[sge(src, len, LOCAL_DMA_LKEY)],
    );
    assert!(
        p.b.drain_cq(&mut p.cq_b).is_empty(),
        "the message is under way"
    );
    assert_eq!(read_mr(&p.b, &pages, 0, 4096), pattern(4096, 5));
    // B deregisters the buffer; the rest is sent again and reaches the next window.
    let h = HcaCmdHandle { handle: k, rsvd: 0 };
    assert_eq!(p.b.cmd(CMD_DEREG_MR, &h).0, CMD_OK);
    cut.on.store(false, Relaxed);
    for _ in 0..20 {
        p.fabric.advance(Duration::from_millis(100));
    }
    let cqes = p.b.drain_cq(&mut p.cq_b);
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wr_id, cqes[0].status),
        (7, WC_LOC_PROT_ERR as u8),
        "the receive fails"
    );
    assert_eq!(
        p.a.drain_statuses(&mut p.cq_a),
        vec![(1, WC_REM_OP_ERR)],
        "the sender hears of it"
    );
    // Nothing past the window that was resolved before the deregistration was written.
    let second_window_end = 2 * INBOUND_WINDOW;
    let tail = read_mr(
        &p.b,
        &pages,
        second_window_end,
        u64::from(len) - second_window_end,
    );
    assert!(tail.iter().all(|&b| b == 0));
}
