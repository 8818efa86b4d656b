//! TIPC over InfiniBand with Debian's tipc module (its IB media, a bearer on ib0): links
//! between every pair of nodes, messages checked between each pair, and TIPC's one-byte
//! latency beside TCP's on ib0.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use cluster::verbs::Testbed;

use crate::{addr, kernel_log, shared, NODES, T};

#[test]
fn test_tipc_links_every_pair_over_ib0_and_carries_messages_intact() {
    let Some(mut c) = shared::cluster("tipc") else {
        return;
    };
    let tb = &mut c.tb;
    let run = catch_unwind(AssertUnwindSafe(|| tipc_over_ib(tb)));
    // Put back what the test changed, also when it failed: no servers, no bearers, no
    // tipc module (the next tipc-up starts with no identity and no links).
    let mut left = Vec::new();
    for i in 0..NODES {
        if let Err(e) = tb.agents[i].run("killall tipc-echo 2> /dev/null; tipc-up down", T) {
            left.push(format!("node{}: {e}", i + 1));
        }
    }
    if let Err(panic) = run {
        resume_unwind(panic);
    }
    assert!(left.is_empty(), "tipc-up down: {}", left.join("\n"));
}

/// The service type `tipc-echo serve` binds its RDM echo to (the instance: the node's
/// number).
const ECHO_TYPE: u32 = 18888;
/// The message sizes each pair exchanges: around the link MTU (ib0's 2044 bytes, less
/// TIPC's header), fragmented ones up to TIPC's largest message (66000 bytes).
const SIZES: [u32; 9] = [1, 7, 8, 1000, 2044, 4096, 16384, 65536, 66000];
/// Messages of each size per pair.
const COUNT: u32 = 8;
/// How long every link has to come up: discovery goes every second or so at first (TIPC's
/// link-establishment interval), and a link's setup takes a few messages more.
const LINK_WAIT: Duration = Duration::from_secs(30);
/// Round trips per latency run.
const ROUNDS: u32 = 1000;

/// Node `i`'s TIPC identity (tipc-up takes the node's name) and link name to node `j`.
fn node(i: usize) -> String {
    format!("node{}", i + 1)
}

fn link(i: usize, j: usize) -> String {
    format!("{}:ib0-{}:ib0", node(i), node(j))
}

/// What every node says about its TIPC state, with its kernel's last words and console,
/// for a failure message.
fn tipc_state(tb: &mut Testbed) -> String {
    let mut s = String::new();
    for i in 0..NODES {
        let out = tb.agents[i].run(
            "tipc node get identity; tipc bearer list; tipc link list; tipc node list; \
             tipc nametable show; cat /tmp/tipc-serve.log",
            T,
        );
        let out = out.unwrap_or_else(|e| e.to_string());
        s += &format!("node{}'s TIPC:\n{out}\n{}\n", i + 1, kernel_log(tb, i));
        s += &format!("node{}'s console:\n{}\n", i + 1, tb.console(i));
    }
    s
}

/// The links `tipc link list` shows (one `NAME: STATE` a line), by name.
fn links(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.trim().rsplit_once(':'))
        .map(|(name, state)| (name.trim().to_string(), state.trim().to_string()))
        .collect()
}

/// The links node `i` lacks (not listed, or not up) of those to every other node.
fn links_missing(out: &str, i: usize) -> Vec<String> {
    let have = links(out);
    (0..NODES)
        .filter(|&j| j != i)
        .map(|j| link(i, j))
        .filter(|want| !have.iter().any(|(n, s)| n == want && s == "up"))
        .collect()
}

/// How many messages a link fragmented as it sent them: Y of `TX ... fragments:X/Y` in
/// `tipc link statistics show`.
fn tx_fragmented(stats: &str) -> Option<u64> {
    let line = stats
        .lines()
        .find(|l| l.trim_start().starts_with("TX packets:"))?;
    let frag = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fragments:"))?;
    frag.split_once('/')?.1.parse().ok()
}

/// `key=value` of the `LAT ` line `tipc-echo lat` printed, as a number.
fn lat_field(out: &str, key: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.starts_with("LAT "))?;
    let value = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?;
    value
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
}

/// TIPC over IB: `tipc-up` on every node loads Debian's tipc, sets the node's identity
/// and enables a bearer on ib0 (TIPC's IB media, carried by IPoIB's UD QP); discovery over
/// ib0's broadcast group finds the other nodes, and every node lists a link up to each
/// other. Then an echo server on each node (`tipc-echo serve`, bound to its own service
/// instance): each pair exchanges 8 messages of each size from 1 byte to TIPC's largest
/// (66000, fragmented to the link's MTU), one at a time, each checked on arrival at the
/// server (from 8 bytes: they carry their sequence number) and its echo checked byte for
/// byte, from the node that published the service, over the link between the two; each
/// pair both ways round. A message one byte larger is refused (EMSGSIZE). The link's MTU is
/// ib0's, and it fragmented the messages longer than that.
/// Last, a one-byte ping-pong from node 1 to node 2 over a TIPC RDM socket, a TIPC stream
/// and TCP on ib0: printed side by side, not asserted on (TCG's timing is the host's).
fn tipc_over_ib(tb: &mut Testbed) {
    for i in 0..NODES {
        let out = tb.agents[i]
            .run(
                "tipc-up && grep -q '^tipc ' /proc/modules && echo 'tipc is loaded' && \
                 tipc bearer list",
                T,
            )
            .unwrap_or_else(|e| panic!("node{}: {e}\n{}", i + 1, tb.console(i)));
        let want = format!("tipc-up: node {}, bearer ib:ib0 enabled", node(i));
        assert!(
            out.contains(&want)
                && out.contains("tipc is loaded")
                && out.lines().any(|l| l.trim() == "ib:ib0"),
            "node{}: {out}",
            i + 1
        );
    }
    // Again: nothing to do, and it says so the same way.
    let out = tb.agents[0].run("tipc-up", T).unwrap();
    assert!(
        out.contains("tipc-up: node node1, bearer ib:ib0 enabled"),
        "tipc-up again: {out}"
    );

    let since = Instant::now();
    let deadline = since + LINK_WAIT;
    let mut lists = vec![String::new(); NODES];
    loop {
        let mut missing = Vec::new();
        for (i, list) in lists.iter_mut().enumerate() {
            *list = tb.agents[i].run("tipc link list", T).unwrap();
            missing.extend(links_missing(list, i));
        }
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "TIPC links not up after {} s: {}\n{}",
                LINK_WAIT.as_secs(),
                missing.join(", "),
                tipc_state(tb)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "tipc: every link up in {:.1} s; node1's `tipc link list`:\n{}",
        since.elapsed().as_secs_f64(),
        lists[0].trim_end()
    );

    for i in 0..NODES {
        tb.agents[i]
            .run(
                &format!("tipc-echo serve {} > /tmp/tipc-serve.log 2>&1 &", i + 1),
                T,
            )
            .unwrap();
    }
    // Every pair, each way (each message is echoed too, so every link carries both
    // ways in each run).
    let sizes = SIZES.map(|s| s.to_string()).join(" ");
    let bytes: u64 = SIZES.iter().map(|&s| u64::from(s * COUNT)).sum();
    let messages = SIZES.len() as u32 * COUNT;
    let pairs = (0..NODES).flat_map(|i| (0..NODES).filter(move |&j| j != i).map(move |j| (i, j)));
    for (i, j) in pairs {
        let cmd = format!("tipc-echo send {} {COUNT} {sizes}", j + 1);
        let (rc, out) = tb.agents[i]
            .status(&cmd, T)
            .unwrap_or_else(|e| panic!("node{}: {cmd}: {e}\n{}", i + 1, tipc_state(tb)));
        let located = format!(
            "{{{ECHO_TYPE},{}}} is on node {} over link {}",
            j + 1,
            node(j),
            link(i, j)
        );
        let done = format!(
            "{messages} messages, {bytes} bytes to node {} and back",
            node(j)
        );
        let ok = rc == 0
            && out.contains(&located)
            && out.contains(&done)
            && out.contains("every one checked")
            && out.contains("66001 bytes refused (EMSGSIZE)");
        if !ok {
            panic!(
                "node{} to node{} (exit {rc}): {cmd}:\n{out}\n{}",
                i + 1,
                j + 1,
                tipc_state(tb)
            );
        }
        let line = out.lines().find(|l| l.contains(&done)).unwrap_or_default();
        eprintln!("tipc: node{} -> node{}: {line}", i + 1, j + 1);
    }
    // Each server checked what it received, and found nothing wrong.
    for i in 0..NODES {
        let log = tb.agents[i].run("cat /tmp/tipc-serve.log", T).unwrap();
        assert!(
            log.contains(&format!("serving {{{ECHO_TYPE},{}}}", i + 1))
                && !log.contains("tipc-echo serve:"),
            "node{}'s server: {log}",
            i + 1
        );
    }
    // The link's MTU is ib0's, and the long messages went as fragments of it.
    let mtu = tb.agents[0].run("cat /sys/class/net/ib0/mtu", T).unwrap();
    let stats = tb.agents[0]
        .run(&format!("tipc link statistics show link {}", link(0, 1)), T)
        .unwrap();
    eprintln!(
        "tipc: node1's statistics of {}:\n{}",
        link(0, 1),
        stats.trim_end()
    );
    assert!(
        stats.contains(&format!("MTU:{} ", mtu.trim())),
        "the link's MTU is not ib0's ({}): {stats}",
        mtu.trim()
    );
    let fragmented = tx_fragmented(&stats)
        .unwrap_or_else(|| panic!("no TX fragments in the link's statistics: {stats}"));
    // Node 1 sent node 2 COUNT messages of each size over the MTU, and echoed as many.
    let mtu: u32 = mtu.trim().parse().unwrap();
    let long = SIZES.iter().filter(|&&s| s >= mtu).count() as u64 * u64::from(COUNT);
    assert!(
        fragmented >= 2 * long,
        "{fragmented} messages fragmented, not {} or more: {stats}",
        2 * long
    );

    let kernel = tb.agents[0].run("uname -r", T).unwrap();
    let mut table = Vec::new();
    for (mode, target, what) in [
        ("rdm", "2".to_string(), "TIPC, RDM socket"),
        ("stream", "2".to_string(), "TIPC, stream socket"),
        ("tcp", addr(1), "TCP on ib0"),
    ] {
        let cmd = format!("tipc-echo lat {mode} {target} {ROUNDS}");
        let out = tb.agents[0]
            .run(&cmd, T)
            .unwrap_or_else(|e| panic!("node1: {cmd}: {e}\n{}", tipc_state(tb)));
        let field =
            |key| lat_field(&out, key).unwrap_or_else(|| panic!("{cmd}: no {key} in:\n{out}"));
        let rounds = field("rounds");
        assert_eq!(rounds, f64::from(ROUNDS), "{cmd}: {out}");
        table.push(format!(
            "  {what:<20} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            field("oneway_mean_us"),
            field("oneway_median_us"),
            field("rtt_mean_us"),
            field("rtt_median_us")
        ));
    }
    eprintln!(
        "tipc: one-byte ping-pong, node1 to node2, {ROUNDS} round trips (kernel {}, TCG), \
         in microseconds:\n  {:<20} {:>8} {:>8} {:>8} {:>8}\n{}",
        kernel.trim(),
        "",
        "one-way",
        "median",
        "RTT",
        "median",
        table.join("\n")
    );
}

mod parse {
    use super::*;

    #[test]
    fn test_links_and_lat_lines_parse() {
        let list = "broadcast-link: up\nnode1:ib0-node2:ib0: up\nnode1:ib0-node3:ib0: down\n";
        assert_eq!(links_missing(list, 0), vec!["node1:ib0-node3:ib0"]);
        let list = "broadcast-link: up\nnode2:ib0-node1:ib0: up\nnode2:ib0-node3:ib0: up\n";
        assert!(links_missing(list, 1).is_empty());
        let out = "x\nLAT mode=rdm rounds=1000 rtt_mean_us=512.5 rtt_median_us=500.0 \
                   oneway_mean_us=256.2 oneway_median_us=250.0\n";
        assert_eq!(lat_field(out, "rounds"), Some(1000.0));
        assert_eq!(lat_field(out, "oneway_median_us"), Some(250.0));
        assert_eq!(lat_field(out, "rtt_mean"), None);
        assert_eq!(lat_field("LAT rounds=nan", "rounds"), None);
        let stats = "Link <a>\n  RX packets:9 fragments:1328/80 bundles:0/0\n  \
                     TX packets:1394 fragments:1328/81 bundles:0/0\n";
        assert_eq!(tx_fragmented(stats), Some(81));
    }
}
