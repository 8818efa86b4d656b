//! Runs a device server for N nodes until Ctrl-C or stdin closes; for manual QEMU runs
//! until `hcabench up` does this itself.
//!
//! `cargo run -p device-server --example serve -- DIR NODES RAM_MIB`
//! Node k listens on DIR/nodek.sock and finds its RAM in DIR/nodek.ram.

use std::io::Read;
use std::path::PathBuf;

use device_server::{DeviceServer, NodeConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, nodes, mib] = &args[..] else {
        eprintln!("usage: serve DIR NODES RAM_MIB");
        std::process::exit(2);
    };
    let (Ok(nodes), Ok(mib)) = (nodes.parse::<usize>(), mib.parse::<u64>()) else {
        eprintln!("NODES and RAM_MIB must be numbers");
        std::process::exit(2);
    };
    let dir = PathBuf::from(dir);
    let configs = NodeConfig::cluster(&dir, nodes, mib << 20);
    let server = match DeviceServer::start(configs) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("serve: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "serve: {nodes} nodes listening in {}; close stdin to stop",
        dir.display()
    );
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    if let Err(e) = server.shutdown() {
        eprintln!("serve: {e}");
    }
}
