//! With a hook attached (any fault plan, any capture), the fabric hands a long message to
//! the hook one MTU packet at a time, making each as it goes: the host never holds all of a
//! message's packets at once. Measured with a counting allocator (this test binary's own).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use hca_model::abi::*;
use hca_model::packet::Packet;
use hca_model::{Fabric, LinkHook, LinkId, Verdict};
use hca_test_driver::*;

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator with the caller's layout unchanged; the
// counters are bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as it is.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = NOW.fetch_add(l.size(), Relaxed) + l.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` above with this layout (the caller's contract).
        unsafe { System.dealloc(p, l) };
        NOW.fetch_sub(l.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Counts the packets it passes.
#[derive(Default)]
struct Count(AtomicUsize);

impl LinkHook for Count {
    fn on_packet(&self, _: LinkId, _: u64, _: &mut Packet) -> Verdict {
        self.0.fetch_add(1, Relaxed);
        Verdict::Pass
    }
}

#[test]
fn test_a_long_message_meets_the_hook_one_packet_at_a_time() {
    let fabric = Fabric::with_manual_clock();
    // MTU 256 (enum 1): 32 MiB is 131072 packets.
    let p = Pair::build_with_memory(fabric.clone(), 48, 1, ALL_ACCESS, DEFAULT_RTS);
    let Pair {
        mut a,
        mut b,
        mut cq_a,
        mut qa,
        key_a: ka,
        key_b: kb,
        ..
    } = p;
    let len = 32u64 << 20;
    let (src, dst) = (a.alloc(len, 4096), b.alloc(len, 4096));
    let hook = Arc::new(Count::default());
    fabric.set_hook(Some(hook.clone()));
    let base = NOW.load(Relaxed);
    PEAK.store(base, Relaxed);
    let w = HcaSendWqe {
        wr_id: 1,
        opcode: WR_RDMA_WRITE as u8,
        flags: WQE_SIGNALED as u8,
        remote_addr: dst,
        rkey: kb,
        ..Default::default()
    };
    a.post_send(&mut qa, w, &[sge(src, len as u32, ka)]);
    let c = a.drain_cq(&mut cq_a);
    assert_eq!(u32::from(c[0].status), WC_SUCCESS);
    let packets = hook.0.load(Relaxed);
    assert!(packets >= 131072, "{packets} packets");
    let peak = PEAK.load(Relaxed) - base;
    assert!(
        peak < 4 << 20,
        "{peak} bytes allocated at once for {packets} packets"
    );
}
