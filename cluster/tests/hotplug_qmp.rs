//! `cluster::hotplug::Monitor` against a QEMU monitor played by this test (a QMP server on a
//! unix socket): the commands an unplug and a replug send, in order, and what each of
//! QEMU's answers and events makes of them (a guest that refuses, a slot already so, a
//! device that does not plug, a late reply to an earlier command).
//!
//! The fd numbers an unplug frees in QEMU, filled again through `add-fd` (the QEMU 7.2
//! workaround), need QEMU in a process of its own: `tests/tests/faults.rs` and
//! `hcabench/tests/cli.rs` replug real guests. One test in its own binary: an unplug reads
//! this process's fds (its monitor's peer), which no other test may open or close
//! meanwhile, so that it finds none freed.

use std::fs::File;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;

use cluster::hotplug::{HotplugError, Monitor, HCA_CHARDEV, HCA_DEVICE, HCA_PORT};
use serde_json::{json, Value};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// What the played QEMU does with one command: the lines it writes back (`{id}` stands
/// for the command's id).
struct Answer {
    command: &'static str,
    lines: Vec<String>,
}

fn ok(command: &'static str) -> Answer {
    Answer {
        command,
        lines: vec![r#"{"return": {}, "id": {id}}"#.into()],
    }
}

fn refused(command: &'static str, desc: &str) -> Answer {
    let desc = serde_json::to_string(desc).unwrap();
    Answer {
        command,
        lines: vec![format!(
            r#"{{"error": {{"class": "GenericError", "desc": {desc}}}, "id": {{id}}}}"#
        )],
    }
}

fn event(name: &str) -> String {
    json!({"event": name, "data": {"device": HCA_DEVICE}}).to_string()
}

/// The played QEMU: answers the script's commands in order (each must be the one it
/// expects), takes `add-fd` wherever it comes and keeps the fd, as QEMU does; the commands
/// it saw come back when the session ends.
struct FakeQemu {
    path: PathBuf,
    seen: mpsc::Receiver<Value>,
    thread: JoinHandle<Vec<File>>,
}

impl FakeQemu {
    fn start(name: &str, script: Vec<Answer>) -> FakeQemu {
        let path = std::env::temp_dir().join(format!("hcab-qmp-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, seen) = mpsc::channel();
        let thread = std::thread::spawn(move || serve(listener, script, tx));
        FakeQemu { path, seen, thread }
    }

    /// The commands it saw, and the fds it holds, once the client went.
    fn finish(self) -> (Vec<Value>, Vec<File>) {
        let held = self.thread.join().unwrap();
        let _ = std::fs::remove_file(&self.path);
        (self.seen.try_iter().collect(), held)
    }
}

fn serve(listener: UnixListener, script: Vec<Answer>, seen: mpsc::Sender<Value>) -> Vec<File> {
    let (mut s, _) = listener.accept().unwrap();
    writeln!(s, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
    let mut script = script.into_iter();
    let mut held = Vec::new();
    let mut pending = Vec::new();
    loop {
        let Some(line) = next_line(&s, &mut pending, &mut held) else {
            return held;
        };
        let cmd: Value = serde_json::from_str(&line).unwrap();
        let id = cmd["id"].to_string();
        let name = cmd["execute"].as_str().unwrap_or_default().to_string();
        let _ = seen.send(cmd);
        if name == "qmp_capabilities" || name == "add-fd" {
            writeln!(s, r#"{{"return": {{}}, "id": {id}}}"#).unwrap();
            continue;
        }
        let a = script
            .next()
            .unwrap_or_else(|| panic!("{name}: past the script"));
        assert_eq!(name, a.command, "the command sent");
        for l in a.lines {
            writeln!(s, "{}", l.replace("{id}", &id)).unwrap();
        }
    }
}

/// The next line the client sent; fds that came with it are kept in `held`.
fn next_line(s: &UnixStream, pending: &mut Vec<u8>, held: &mut Vec<File>) -> Option<String> {
    loop {
        if let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            return Some(String::from_utf8(line).unwrap());
        }
        let mut buf = [0u8; 4096];
        let (n, fd) = s.recv_with_fd(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        held.extend(fd);
        pending.extend_from_slice(&buf[..n]);
    }
}

fn commands(seen: &[Value]) -> Vec<&str> {
    seen.iter()
        .filter_map(|c| c["execute"].as_str())
        .filter(|&c| c != "qmp_capabilities")
        .collect()
}

#[test]
fn test_the_monitor_unplugs_and_replugs_as_qemus_answers_say() {
    // An unplug: device_del, QEMU's answer and then DEVICE_DELETED once the guest let go
    // (here a late reply to an earlier command comes first, and is passed over), then the
    // link goes.
    let mut late = ok("device_del");
    late.lines.insert(0, r#"{"return": {}, "id": 0}"#.into());
    late.lines.push(event("DEVICE_DELETED"));
    let qemu = FakeQemu::start("unplug", vec![late, ok("chardev-remove")]);
    Monitor::new("node2", qemu.path.clone())
        .unplug_hca()
        .unwrap();
    let (seen, _) = qemu.finish();
    assert_eq!(commands(&seen), ["device_del", "chardev-remove"]);
    assert_eq!(seen[1]["arguments"]["id"], HCA_DEVICE);
    assert_eq!(seen[2]["arguments"]["id"], HCA_CHARDEV);

    // DEVICE_DELETED may come before device_del's answer: it is kept, not waited for again.
    let mut early = Answer {
        command: "device_del",
        lines: vec![event("DEVICE_DELETED")],
    };
    early.lines.extend(ok("device_del").lines);
    let qemu = FakeQemu::start("early", vec![early, ok("chardev-remove")]);
    Monitor::new("node2", qemu.path.clone())
        .unplug_hca()
        .unwrap();
    qemu.finish();

    // Unplugged already: QEMU has no such device, nor a link to remove.
    let qemu = FakeQemu::start(
        "again",
        vec![
            refused("device_del", "Device 'hca0' not found"),
            refused("chardev-remove", "Chardev 'hca' not found"),
        ],
    );
    let r = Monitor::new("node2", qemu.path.clone()).unplug_hca();
    assert!(matches!(r, Err(HotplugError::Unplugged { .. })), "{r:?}");
    qemu.finish();

    // The guest refuses to let go.
    let mut refuse = ok("device_del");
    refuse.lines.push(event("DEVICE_UNPLUG_GUEST_ERROR"));
    let qemu = FakeQemu::start("refused", vec![refuse]);
    let r = Monitor::new("node2", qemu.path.clone()).unplug_hca();
    assert!(matches!(r, Err(HotplugError::GuestRefused { .. })), "{r:?}");
    qemu.finish();

    // A replug: a new link to the device server, then the device on the HCA's root port.
    let socket = PathBuf::from("/run/hcab/node2.hca");
    let qemu = FakeQemu::start("replug", vec![ok("chardev-add"), ok("device_add")]);
    Monitor::new("node2", qemu.path.clone())
        .replug_hca(&socket, 4)
        .unwrap();
    let (seen, _) = qemu.finish();
    let add = &seen[2]["arguments"];
    assert_eq!(
        (
            &add["driver"],
            &add["bus"],
            &add["id"],
            &add["chardev"],
            &add["vectors"]
        ),
        (
            &json!("ivshmem-doorbell"),
            &json!(HCA_PORT),
            &json!(HCA_DEVICE),
            &json!(HCA_CHARDEV),
            &json!(4)
        )
    );
    let link = &seen[1]["arguments"]["backend"]["data"]["addr"]["data"]["path"];
    assert_eq!(link, &json!(socket));

    // Plugged already: the link exists.
    let qemu = FakeQemu::start(
        "plugged",
        vec![refused("chardev-add", "Chardev 'hca' already exists")],
    );
    let r = Monitor::new("node2", qemu.path.clone()).replug_hca(&socket, 4);
    assert!(matches!(r, Err(HotplugError::Plugged { .. })), "{r:?}");
    qemu.finish();

    // A device that does not plug: its link goes again, so the server's HCA goes too.
    let qemu = FakeQemu::start(
        "no-device",
        vec![
            ok("chardev-add"),
            refused("device_add", "Bus 'hcaport' not found"),
            ok("chardev-remove"),
        ],
    );
    let r = Monitor::new("node2", qemu.path.clone()).replug_hca(&socket, 4);
    match r {
        Err(HotplugError::Refused { command, desc, .. }) => {
            assert_eq!(
                (command, desc.as_str()),
                ("device_add", "Bus 'hcaport' not found")
            )
        }
        r => panic!("{r:?}"),
    }
    let (seen, _) = qemu.finish();
    assert_eq!(
        commands(&seen),
        ["chardev-add", "device_add", "chardev-remove"]
    );
}
