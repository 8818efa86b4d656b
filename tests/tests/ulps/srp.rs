//! The SCSI RDMA Protocol with Debian's LIO target (ib_srpt, node 2) and initiator
//! (ib_srp, nodes 1 and 3).

use crate::shared::{self, Shared};
use crate::storage::{login, scsi_disk_keeps_every_byte};
use crate::{nvmeof, port_guid, T};

#[test]
fn test_srp_serves_one_ram_disk_to_two_initiators() {
    let Some(mut c) = shared::cluster("srp") else {
        return;
    };
    srp_over_ib(&mut c);
}

/// The SCSI RDMA Protocol with Debian's LIO target (ib_srpt) and initiator (ib_srp), found by
/// port GUID through IB CM (no IP): node 2 exports a RAM disk to nodes 1 and 3, both logged
/// in at once, each writing its own half; every byte reads back the same on the initiator
/// and on the target's disk, also under 1% drops, and after a logout and a new login.
/// (ib_srpt checks its channel with a zero-length RDMA WRITE of key 0, which IBA C9-88 says
/// no responder may refuse: refused, the channel was torn down at once.) The NVMe-oF
/// target's node refuses to export its RAM disk over SRP too.
fn srp_over_ib(c: &mut Shared) {
    nvmeof::target(c);
    let tb = &mut c.tb;
    let (g1, g2, g3) = (port_guid(tb, 0), port_guid(tb, 1), port_guid(tb, 2));
    // Node 3 exports its RAM disk over NVMe-oF (`nvmeof::target`): not a second time.
    let (rc, out) = tb.agents[2]
        .status(&format!("srp target 16 {g1}"), T)
        .unwrap();
    assert!(
        rc == 1 && out.contains("exported over NVMe-oF on this node already"),
        "exit {rc}: {out}"
    );
    let out = tb.agents[1]
        .run(&format!("srp target 16 {g1} {g3}"), T)
        .unwrap();
    assert!(
        out.contains(&format!("at target {g2} for {g1} {g3}")),
        "{out}"
    );
    let mut disks = Vec::new();
    for i in [0, 2] {
        let dev = login(tb, i, 1, &format!("srp connect {g2}"));
        assert!(dev.starts_with("sd"), "node{}: {dev}", i + 1);
        disks.push(dev);
    }
    let connect = format!("srp connect {g2}");
    scsi_disk_keeps_every_byte(tb, 1, [0, 2], &disks, 7, &connect, "srp disconnect");
}
