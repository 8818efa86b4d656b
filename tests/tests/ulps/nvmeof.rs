//! NVMe over Fabrics with Debian's nvmet-rdma (node 3, the target) and nvme-rdma (node 1).

use e2e::tshark_or_skip;

use crate::shared::{self, Shared};
use crate::storage::{disk_write_read, ram_disk_sum};
use crate::{addr, capture, T};

#[test]
fn test_nvme_over_fabrics_moves_32_mib_through_a_namespace() {
    let Some(mut c) = shared::cluster("nvmeof") else {
        return;
    };
    nvme_over_fabrics(&mut c);
}

/// Node 3 exports its RAM disk (48 MiB, brd's /dev/ram0) over NVMe-oF, once per boot: what
/// `nvmeof target` printed. The SRP and iSER tests ask for it too, to see that node refuse
/// to export the same disk over LIO.
pub fn target(c: &mut Shared) -> String {
    if let Some(out) = &c.nvmeof_target {
        return out.clone();
    }
    // The target takes its hosts' commands from shared receive queues (hcab0's SRQs: one
    // per completion vector, 1,024 commands of 4 KiB inline data each). With the RAM disk
    // they need the room of the 64 MiB blob that the TCP checks serve from this guest.
    let out = c.tb.agents[2]
        .run("rm -f /tmp/blob && nvmeof target 48 srq", T)
        .unwrap();
    c.nvmeof_target = Some(out.clone());
    out
}

/// NVMe over Fabrics with Debian's nvmet-rdma and nvme-rdma: rdma_cm finds the target by its
/// IPoIB address, the host registers each I/O's pages with FRWR and the target answers with
/// a SEND with Invalidate; 32 MiB written through the namespace read back the same on the
/// host and on the target's RAM disk.
fn nvme_over_fabrics(c: &mut Shared) {
    let out = target(c);
    let tb = &mut c.tb;
    assert!(out.contains(&format!("at rdma {}:4420", addr(2))), "{out}");
    let pcap = capture(tb, "nvme.pcap");
    let dev = tb.agents[0]
        .run(&format!("nvmeof connect {}", addr(2)), T)
        .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(0)));
    let dev = dev.trim().to_string();
    assert!(dev.starts_with("nvme") && dev.ends_with("n1"), "{dev}");
    tb.agents[0]
        .run(
            &format!("dd if=/dev/{dev} of=/dev/null bs=4k count=1 iflag=direct 2>&1"),
            T,
        )
        .unwrap();
    tb.fabric().set_tap(None);
    if let Some(rows) = tshark_or_skip("NVMe-oF capture", &pcap, &["infiniband.bth.opcode"]) {
        let inv = rows
            .iter()
            .filter(|r| r[0] == "23" || r[0] == "0x17")
            .count();
        assert!(inv > 0, "no RC SEND Only with Invalidate: {rows:?}");
    }
    let srqs = tb.agents[2].run("rdma res show srq", T).unwrap();
    assert!(
        srqs.lines()
            .any(|l| l.contains("comm [nvmet_rdma]") && l.contains("lqpn")),
        "nvmet-rdma serves its queue from an SRQ: {srqs}"
    );
    let (written, read) = disk_write_read(tb, 0, &dev, 0, 32);
    assert_eq!(written, read, "read back through NVMe-oF");
    let target = ram_disk_sum(tb, 2, 0, 32);
    assert!(
        target.starts_with(&written),
        "on the target's disk: {target}"
    );
    tb.agents[0].run("nvmeof disconnect", T).unwrap();
}
