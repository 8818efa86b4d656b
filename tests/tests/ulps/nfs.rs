//! NFS over RDMA with Debian's nfsd (svcrdma, node 2) and NFSv4.2 client (xprtrdma, nodes 1
//! and 3).

use cluster::verbs::Testbed;
use e2e::tshark_or_skip;

use crate::storage::written_and_read;
use crate::{addr, capture, drop_one_percent, kernel_log, shared, T};

#[test]
fn test_nfs_over_rdma_serves_one_export_to_two_clients() {
    let Some(mut c) = shared::cluster("nfs") else {
        return;
    };
    nfs_over_rdma(&mut c.tb);
}

/// The md5 of a file on node `i` (empty if it has none).
fn file_sum(tb: &mut Testbed, i: usize, path: &str) -> String {
    let out = tb.agents[i]
        .run(&format!("md5sum < {path}"), T)
        .unwrap_or_default();
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Node `i` writes `mib` MiB of fresh random bytes to `path` on its NFS mount (flushed to
/// the server), drops its page cache and reads the file back through NFS: the md5 of what
/// was written, and of what came back.
fn nfs_write_read(tb: &mut Testbed, i: usize, path: &str, mib: u32) -> (String, String) {
    let out = tb.agents[i]
        .run(
            &format!(
                "dd if=/dev/urandom of=/tmp/nfs.src bs=1M count={mib} 2>/dev/null && \
                 md5sum < /tmp/nfs.src && \
                 dd if=/tmp/nfs.src of={path} bs=1M conv=fsync 2>/dev/null && rm /tmp/nfs.src && \
                 echo 3 > /proc/sys/vm/drop_caches && md5sum < {path}"
            ),
            T,
        )
        .unwrap_or_else(|e| {
            // The kernel's last words too (an OOM kill shows there, not in the output).
            let log = kernel_log(tb, i);
            panic!("NFS I/O on node{}: {e}\n{}\n{log}", i + 1, tb.console(i))
        });
    written_and_read(&out, i)
}

/// NFS over RDMA with Debian's nfsd (svcrdma) and NFSv4.2 client (xprtrdma), nfs-utils'
/// rpc.nfsd, rpc.mountd and exportfs on the server: rdma_cm finds node 2's RDMA listener
/// (port 20049) by its IPoIB address; nodes 1 and 3 mount its export at once and each writes
/// a file of its own (the server pulls the data with RDMA READs) and reads it back (the
/// server pushes it with RDMA WRITEs: a capture shows both); every file reads the same on
/// the server and on the other client, also under 1% drops, and after an unmount and a new
/// mount.
fn nfs_over_rdma(tb: &mut Testbed) {
    let out = tb.agents[1]
        .run("nfs export 40", T)
        .unwrap_or_else(|e| panic!("{e}\n{}", tb.console(1)));
    assert!(
        out.contains(&format!("at {}, RDMA port 20049", addr(1))),
        "{out}"
    );
    for i in [0, 2] {
        let out = tb.agents[i]
            .run(
                &format!(
                    "nfs mount {} /mnt/nfs && grep ' /mnt/nfs ' /proc/mounts",
                    addr(1)
                ),
                T,
            )
            .unwrap_or_else(|e| panic!("NFS mount on node{}: {e}\n{}", i + 1, tb.console(i)));
        assert!(
            out.contains("nfs4") && out.contains("proto=rdma"),
            "node{}: {out}",
            i + 1
        );
    }
    let (w1, r1) = nfs_write_read(tb, 0, "/mnt/nfs/node1", 8);
    let (w3, r3) = nfs_write_read(tb, 2, "/mnt/nfs/node3", 8);
    assert_eq!(w1, r1, "node1 read back through NFS");
    assert_eq!(w3, r3, "node3 read back through NFS");
    for (i, path, want, what) in [
        (1, "/export/node1", &w1, "node1's file on the server"),
        (1, "/export/node3", &w3, "node3's file on the server"),
        (2, "/mnt/nfs/node1", &w1, "node1's file read on node3"),
    ] {
        assert_eq!(&file_sum(tb, i, path), want, "{what}");
    }
    let stats = tb.agents[0]
        .run("grep 'xprt:' /proc/self/mountstats", T)
        .unwrap();
    assert!(
        stats.contains("xprt:\trdma"),
        "the transport is RDMA: {stats}"
    );
    nfs_moves_data_by_rdma_read_and_write(tb);

    // Under 1% drops on every link RC resends below NFS; the file arrives intact.
    let hook = drop_one_percent(tb, 9);
    let (w, r) = nfs_write_read(tb, 2, "/mnt/nfs/drops", 8);
    tb.fabric().set_hook(None);
    assert_eq!(w, r, "node3 under 1% drops");
    assert!(hook.counts().dropped > 0, "the plan dropped packets");
    assert_eq!(
        file_sum(tb, 1, "/export/drops"),
        w,
        "written under drops, on the server"
    );

    // Unmounted and mounted again: the files are the server's.
    tb.agents[0].run("nfs umount /mnt/nfs", T).unwrap();
    let (mounted, _) = tb.agents[0]
        .status("grep -q ' /mnt/nfs ' /proc/mounts", T)
        .unwrap();
    assert_eq!(mounted, 1, "unmounted");
    tb.agents[0]
        .run(&format!("nfs mount {} /mnt/nfs", addr(1)), T)
        .unwrap_or_else(|e| panic!("NFS mount again: {e}\n{}", tb.console(0)));
    for (path, want) in [("/mnt/nfs/node3", &w3), ("/mnt/nfs/drops", &w)] {
        assert_eq!(&file_sum(tb, 0, path), want, "{path}, mounted again");
    }
    for i in [0, 2] {
        tb.agents[i].run("nfs umount /mnt/nfs", T).unwrap();
    }
}

/// A capture of node 1 writing 1 MiB to the server and reading them back: NFS/RDMA moves
/// data that large in chunks, which the server pulls with RDMA READs and pushes with RDMA
/// WRITEs (small ones would ride inline in SENDs).
fn nfs_moves_data_by_rdma_read_and_write(tb: &mut Testbed) {
    let pcap = capture(tb, "nfs.pcap");
    let (w, r) = nfs_write_read(tb, 0, "/mnt/nfs/small", 1);
    tb.fabric().set_tap(None);
    assert_eq!(w, r, "node1's 1 MiB through NFS");
    let Some(rows) = tshark_or_skip("NFS/RDMA capture", &pcap, &["infiniband.bth.opcode"]) else {
        return;
    };
    let opcode = |r: &Vec<String>| {
        let o = r[0].trim();
        o.strip_prefix("0x")
            .map_or_else(|| o.parse().ok(), |h| u8::from_str_radix(h, 16).ok())
    };
    let count = |ops: std::ops::RangeInclusive<u8>| {
        rows.iter()
            .filter(|r| opcode(r).is_some_and(|o| ops.contains(&o)))
            .count()
    };
    // RC opcodes: RDMA WRITE First..Only with Immediate 0x06-0x0b, RDMA READ Request 0x0c,
    // its responses 0x0d-0x10.
    let (writes, reads, responses) = (count(6..=11), count(12..=12), count(13..=16));
    assert!(
        writes > 0 && reads > 0 && responses > 0,
        "RDMA WRITE packets {writes}, READ requests {reads}, READ responses {responses}"
    );
}
