//! Driving the guests' DSM module (`guest-kmod/dsm`) through their shells: opening it on an
//! ib_device and connecting the full mesh of RC QPs (the harness hands every node every
//! other node's address).

use std::collections::HashMap;
use std::time::Duration;

use crate::agent::Agent;
use crate::verbs::fields;

const T: Duration = Duration::from_secs(120);

/// Opens the DSM on `dev` in every guest (node ids 1..=n in agent order) and connects
/// every pair.
pub fn connect_mesh(agents: &mut [Agent], dev: &str) -> Result<(), String> {
    let n = agents.len();
    let mut addrs: Vec<HashMap<String, String>> = Vec::new();
    for (i, a) in agents.iter_mut().enumerate() {
        let out = a.run(&format!("dsmctl open {dev} {} {n}", i + 1), T)?;
        let line = out
            .lines()
            .find(|l| l.starts_with("node="))
            .ok_or_else(|| format!("{}: dsm open: no address in `{out}`", a.name))?;
        addrs.push(fields(line));
    }
    for (i, a) in agents.iter_mut().enumerate() {
        for (j, peer) in addrs.iter().enumerate() {
            if i == j {
                continue;
            }
            // The peer's QP for us is the (i+1)-th of its list.
            let qpn = peer
                .get("qpns")
                .and_then(|q| q.split(',').nth(i))
                .ok_or_else(|| format!("node {}: no qpns in its address", j + 1))?;
            a.run(
                &format!(
                    "dsmctl connect {} lid={} qpn={qpn} psn={} gid={}",
                    j + 1,
                    peer["lid"],
                    peer["psn"],
                    peer["gid"]
                ),
                T,
            )?;
        }
    }
    Ok(())
}
