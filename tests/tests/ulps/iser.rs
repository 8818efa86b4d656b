//! iSER with Debian's LIO iSCSI target (ib_isert, node 1) and open-iscsi's initiator
//! (iscsid, iscsiadm, ib_iser; nodes 2 and 3).

use crate::shared::{self, Shared};
use crate::storage::{login, login_failure, scsi_disk_keeps_every_byte};
use crate::{addr, nvmeof, T};

#[test]
fn test_iser_serves_one_ram_disk_to_the_initiators_in_its_acl() {
    let Some(mut c) = shared::cluster("iser") else {
        return;
    };
    iser_over_ib(&mut c);
}

/// iSCSI Extensions for RDMA with Debian's LIO iSCSI target (ib_isert) and open-iscsi's
/// initiator (iscsid, iscsiadm, ib_iser), over rdma_cm on the ib0 addresses: node 1 exports a
/// RAM disk; the logins run over iSER (SendTargets discovery over TCP on ib0: see the
/// docs/guides/iser.md). An initiator the target's ACL does not list is refused, and
/// let in once it is added; then nodes 2 and 3 each write their own half and every byte
/// reads back the same on the initiator and on the target's disk, also under 1% drops, and
/// after a logout and a new login. The NVMe-oF target's node refuses to export its RAM disk
/// over iSER too.
fn iser_over_ib(c: &mut Shared) {
    nvmeof::target(c);
    let tb = &mut c.tb;
    let (rc, out) = tb.agents[2].status("iser target 16 node1", T).unwrap();
    assert!(
        rc == 1 && out.contains("exported over NVMe-oF on this node already"),
        "exit {rc}: {out}"
    );
    let out = tb.agents[0].run("iser target 16 node2", T).unwrap();
    let iqn = "iqn.2026-11.org.hcabench:node1";
    assert!(
        out.contains(&format!("at {iqn} on {}:3260 for node2", addr(0))),
        "{out}"
    );
    // Node 3 is not in the ACL: its login is refused.
    let (rc, out) = tb.agents[2]
        .status(&format!("iser connect {}", addr(0)), T)
        .unwrap();
    if rc == 0 || !out.contains("authorization failure") {
        let why = login_failure(tb, 2, 0);
        panic!("node3 logged in without an ACL entry? exit {rc}: {out}\n{why}");
    }
    tb.agents[0].run("iser target 16 node3", T).unwrap();
    let mut disks = Vec::new();
    for i in [1, 2] {
        let dev = login(tb, i, 0, &format!("iser connect {}", addr(0)));
        assert!(dev.starts_with("sd"), "node{}: {dev}", i + 1);
        disks.push(dev);
        // The session runs over iSER, not iSCSI over TCP on ib0.
        let sessions = tb.agents[i].run("iscsiadm -m session", T).unwrap();
        assert!(
            sessions.contains("iser: [") && sessions.contains(iqn),
            "node{}: {sessions}",
            i + 1
        );
    }
    let connect = format!("iser connect {}", addr(0));
    scsi_disk_keeps_every_byte(tb, 0, [1, 2], &disks, 11, &connect, "iser disconnect");
}
