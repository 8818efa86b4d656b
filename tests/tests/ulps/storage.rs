//! What the storage tests (NVMe-oF, SRP, iSER, NFS) share: writing and reading back a
//! remote disk, a target's RAM disk, logins and what a failed one leaves to go on.

use cluster::verbs::Testbed;

use crate::{drop_one_percent, kernel_log, T};

/// The two md5 sums of a write-and-read-back's output on node `i`: what was written, and
/// what came back.
pub fn written_and_read(out: &str, i: usize) -> (String, String) {
    let sums: Vec<&str> = out.split_whitespace().filter(|w| w.len() == 32).collect();
    assert_eq!(sums.len(), 2, "node{}: {out}", i + 1);
    (sums[0].to_string(), sums[1].to_string())
}

/// `MIB` MiB of fresh random bytes written at `at_mib` into node `i`'s remote disk `dev`
/// (NVMe-oF, SRP) and read back through it (direct I/O both ways): the md5 of what was
/// written, and of what came back.
pub fn disk_write_read(
    tb: &mut Testbed,
    i: usize,
    dev: &str,
    at_mib: u32,
    mib: u32,
) -> (String, String) {
    let out = tb.agents[i]
        .run(
            &format!(
                "dd if=/dev/urandom of=/tmp/disk bs=1M count={mib} 2>/dev/null && md5sum < /tmp/disk && \
                 dd if=/tmp/disk of=/dev/{dev} bs=1M seek={at_mib} oflag=direct 2>/dev/null && \
                 rm /tmp/disk && \
                 dd if=/dev/{dev} bs=1M skip={at_mib} count={mib} iflag=direct 2>/dev/null | md5sum"
            ),
            T,
        )
        .unwrap_or_else(|e| panic!("I/O to {dev} on node{}: {e}\n{}", i + 1, tb.console(i)));
    written_and_read(&out, i)
}

/// The md5 of `mib` MiB at `at_mib` of node `i`'s RAM disk (a target's), read direct: the
/// target writes the disk beneath the node's page cache, which would keep what an earlier
/// read saw.
pub fn ram_disk_sum(tb: &mut Testbed, i: usize, at_mib: u32, mib: u32) -> String {
    let out = tb.agents[i]
        .run(
            &format!(
                "dd if=/dev/ram0 bs=1M skip={at_mib} count={mib} iflag=direct 2>/dev/null | md5sum"
            ),
            T,
        )
        .unwrap();
    out.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// One hardware counter of node `i`'s port as Debian's `rdma statistic` prints it.
fn rdma_statistic(tb: &mut Testbed, i: usize, name: &str) -> u64 {
    let out = tb.agents[i]
        .run("rdma statistic show link hcab0/1", T)
        .unwrap();
    let words: Vec<&str> = out.split_whitespace().collect();
    let at = words.iter().position(|w| *w == name);
    at.and_then(|k| words.get(k + 1)?.parse().ok())
        .unwrap_or_else(|| panic!("node{}: no {name} in `{out}`", i + 1))
}

/// Node `i` logs in with `connect` (SRP, iSER) to the disk node `target` serves: the new
/// disk's name. A failed login shows what `login_failure` gathers.
pub fn login(tb: &mut Testbed, i: usize, target: usize, connect: &str) -> String {
    match tb.agents[i].run(connect, T) {
        Ok(dev) => dev.trim().to_string(),
        Err(e) => panic!(
            "node{}: {connect}: {e}\n{}",
            i + 1,
            login_failure(tb, i, target)
        ),
    }
}

/// What a failed login of node `i` to node `target` leaves to go on, for each of the two:
/// the kernel's last words, where its storage threads wait, its port counters and its
/// interrupt counts (what found iscsiadm's discovery race: docs/guides/iser.md).
pub fn login_failure(tb: &mut Testbed, i: usize, target: usize) -> String {
    let mut out = String::new();
    for n in [i, target] {
        let state = tb.agents[n]
            .run(
                "rdma statistic show link hcab0/1; grep -i hca /proc/interrupts",
                T,
            )
            .unwrap_or_default();
        out += &format!(
            "{}\n{}\n{state}\n",
            kernel_log(tb, n),
            storage_threads(tb, n)
        );
    }
    out
}

/// Where node `i`'s storage threads and busy kernel workers wait (LIO's login thread serves
/// one login at a time: one stuck there stops every later login), for a failure message.
fn storage_threads(tb: &mut Testbed, i: usize) -> String {
    let out = tb.agents[i].run(
        "for d in /proc/[0-9]*; do n=$(cat $d/comm); w=$(cat $d/wchan); case $n:$w in \
         kworker*:worker_thread|kworker*:rescuer_thread) ;; \
         iscsi*|isert*|iser*|srp*|target*|kworker*) echo \"$n $w:\"; cat $d/stack;; \
         esac; done 2>/dev/null",
        T,
    );
    format!(
        "node{}'s storage threads:\n{}",
        i + 1,
        out.unwrap_or_default()
    )
}

/// What a RAM disk that node `target` serves over RDMA (SRP, iSER) to nodes `inits` (as
/// their `disks`) must do: each initiator writes its own 8 MiB and every byte reads back
/// the same on the initiator and on the target's disk; under 1% drops on every link (plan
/// `seed`) RC resends below the protocol, the ports' hardware counters (as Debian's `rdma
/// statistic` reads them) count the resends, and the bytes arrive intact; after a logout
/// (`disconnect`) and a new login (`connect`) the first initiator's disk comes back with
/// its data. Every initiator logs out at the end.
pub fn scsi_disk_keeps_every_byte(
    tb: &mut Testbed,
    target: usize,
    inits: [usize; 2],
    disks: &[String],
    seed: u64,
    connect: &str,
    disconnect: &str,
) {
    let [first, second] = inits;
    let (wa, ra) = disk_write_read(tb, first, &disks[0], 0, 8);
    let (wb, rb) = disk_write_read(tb, second, &disks[1], 8, 8);
    assert_eq!(wa, ra, "node{} read back", first + 1);
    assert_eq!(wb, rb, "node{} read back", second + 1);
    assert_eq!(
        ram_disk_sum(tb, target, 0, 8),
        wa,
        "node{}'s half on the target",
        first + 1
    );
    assert_eq!(
        ram_disk_sum(tb, target, 8, 8),
        wb,
        "node{}'s half on the target",
        second + 1
    );

    let resent = |tb: &mut Testbed| -> u64 {
        [target, first]
            .iter()
            .map(|&i| rdma_statistic(tb, i, "retransmits"))
            .sum()
    };
    let resent_before = resent(tb);
    let hook = drop_one_percent(tb, seed);
    let (w, r) = disk_write_read(tb, first, &disks[0], 0, 8);
    tb.fabric().set_hook(None);
    assert_eq!(w, r, "node{} under 1% drops", first + 1);
    assert!(hook.counts().dropped > 0, "the plan dropped packets");
    assert!(resent(tb) > resent_before, "no resends counted under drops");
    assert_eq!(
        ram_disk_sum(tb, target, 0, 8),
        w,
        "written under drops, on the target"
    );

    tb.agents[first].run(disconnect, T).unwrap();
    let gone = tb.agents[first].run("ls /sys/block", T).unwrap();
    assert!(!gone.contains(&disks[0]), "{gone}");
    let dev = login(tb, first, target, connect);
    let again = tb.agents[first]
        .run(
            &format!(
                "dd if=/dev/{} bs=1M count=16 iflag=direct 2>/dev/null | md5sum",
                dev
            ),
            T,
        )
        .unwrap();
    assert!(
        again.starts_with(&ram_disk_sum(tb, target, 0, 16)),
        "{again}"
    );
    for i in inits {
        tb.agents[i].run(disconnect, T).unwrap();
    }
}
