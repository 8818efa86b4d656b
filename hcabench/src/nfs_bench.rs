//! `hcabench bench nfs`: what a user gets from NFS over the emulated InfiniBand fabric.
//! Two guests: Debian's nfsd on one exports a tmpfs, the other mounts it over RDMA
//! (xprtrdma/svcrdma through rdma_cm), then over TCP on IPoIB in datagram and in connected
//! mode; a file is written through each mount (flushed to the server) and read back cold
//! (the client's page cache dropped), its bytes checked by md5.

use std::time::Duration;

use cluster::Backend;

use crate::bench::{elapsed, random_blob, timed, VerbsBench};
use crate::session::{BenchError, Shape};

const T: Duration = Duration::from_secs(600);
const SERVER: &str = "10.78.0.2";

/// One transport's figures.
struct Row {
    name: &'static str,
    write_mb_s: f64,
    read_mb_s: f64,
}

/// The largest file the bench moves on guests of `memory_mib` MiB: the client keeps the
/// source in its RAM-backed /tmp and the server the copy in its tmpfs export, each beside
/// the kernel, the image and NFS's own buffers.
pub fn max_mib(memory_mib: u64) -> u64 {
    memory_mib / 4
}

/// Writes `mib` MiB from the client's /tmp/blob to `dir` (fsync'd) and reads it back with
/// the client's page cache dropped; the MB/s each way, the read's bytes checked against
/// `sum`.
fn measure(
    tb: &mut cluster::verbs::Testbed,
    name: &'static str,
    dir: &str,
    mib: u64,
    sum: &str,
) -> Result<Row, BenchError> {
    let mb = (mib << 20) as f64 / 1e6;
    let out = tb.agents[0].run(
        &timed(&format!(
            "dd if=/tmp/blob of={dir}/blob bs=1M conv=fsync 2>/dev/null"
        )),
        T,
    )?;
    let no_timing = |output: &str| BenchError::NoTiming {
        name: name.to_string(),
        output: output.to_string(),
    };
    let w = elapsed(&out).ok_or_else(|| no_timing(&out))?;
    let out = tb.agents[0].run(
        &timed(&format!(
            "echo 3 > /proc/sys/vm/drop_caches; md5sum < {dir}/blob"
        )),
        T,
    )?;
    if !out.contains(sum) {
        return Err(BenchError::Changed {
            name: name.to_string(),
            what: "the file read back",
            output: out,
        });
    }
    let r = elapsed(&out).ok_or_else(|| no_timing(&out))?;
    tb.agents[0].run(&format!("rm {dir}/blob"), T)?;
    let row = Row {
        name,
        write_mb_s: mb / w.max(0.01),
        read_mb_s: mb / r.max(0.01),
    };
    println!(
        "  {name:<28} write {:>8.1} MB/s   read {:>8.1} MB/s",
        row.write_mb_s, row.read_mb_s
    );
    Ok(row)
}

pub fn run(b: &VerbsBench, backend: Backend) -> Result<(), BenchError> {
    println!(
        "booting 2 {} guests with the hcabench HCA",
        backend.describe()
    );
    let shape = Shape {
        what: "bench-nfs",
        nodes: 2,
        link: false,
    };
    let mut s = crate::bench::boot(b, backend, shape)?;
    s.tb.ipoib_up()?;
    s.start_fabric_tools()?;
    let tb = &mut s.tb;
    let mib = (b.bw_bytes >> 20).max(1);
    let out = tb.agents[1].run(&format!("nfs export {}", mib + 8), T)?;
    if !out.contains("RDMA port 20049") {
        return Err(BenchError::NfsServer(out));
    }
    let sum = random_blob(tb, 0, mib)?;
    println!("{mib} MiB written and read back per transport (NFSv4.2, the server's tmpfs)");
    // One mount at a time: a second mount of the same server shares the first one's
    // transport (NFSv4.1's trunking discovery), whatever proto it asks for.
    let mut rows = Vec::new();
    for (name, via, ib0) in [
        ("NFS over RDMA", "rdma", None),
        ("NFS over TCP, ib0 datagram", "tcp", None),
        ("NFS over TCP, ib0 connected", "tcp", Some("connected")),
    ] {
        if let Some(mode) = ib0 {
            for a in tb.agents.iter_mut() {
                a.run(
                    &format!("echo {mode} > /sys/class/net/ib0/mode && ip link set ib0 mtu 65520"),
                    T,
                )?;
            }
        }
        // A fresh server refuses new OPENs for its grace period (10 s): the first file
        // waits it out here, not in a figure.
        let out = tb.agents[0].run(
            &format!(
                "nfs mount {SERVER} /mnt/nfs {via} && echo > /mnt/nfs/warm && rm /mnt/nfs/warm \
                 && grep ' /mnt/nfs ' /proc/mounts"
            ),
            T,
        )?;
        if !out.contains(&format!("proto={via}")) {
            return Err(BenchError::NfsMount {
                name: name.to_string(),
                via: via.to_string(),
                output: out,
            });
        }
        rows.push(measure(tb, name, "/mnt/nfs", mib, &sum)?);
        tb.agents[0].run("nfs umount /mnt/nfs", T)?;
    }
    print_table(&rows);
    s.print_fault_report();
    Ok(())
}

fn print_table(rows: &[Row]) {
    println!();
    println!("NFS between two guests: a file written (fsync) and read back cold, bytes checked");
    println!(
        "{:<28} {:>12} {:>12} {:>16} {:>16}",
        "transport", "write MB/s", "read MB/s", "write vs RDMA", "read vs RDMA"
    );
    let Some(base) = rows.first() else {
        return;
    };
    for r in rows {
        println!(
            "{:<28} {:>12.1} {:>12.1} {:>16.2} {:>16.2}",
            r.name,
            r.write_mb_s,
            r.read_mb_s,
            r.write_mb_s / base.write_mb_s.max(1e-3),
            r.read_mb_s / base.read_mb_s.max(1e-3)
        );
    }
    println!("(ratios below 1: NFS over RDMA is the faster)");
}
