//! What the device decides is logged (`log`, debug level), so that `RUST_LOG=debug` on
//! the hosts shows why a guest's command was refused, a WR failed or a QP went to ERR.

use std::sync::Mutex;

use hca_model::abi::*;
use hca_test_driver::*;

/// Keeps every record this test binary logs.
struct Capture(Mutex<Vec<String>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        self.0
            .lock()
            .unwrap()
            .push(format!("{} {}", r.level(), r.args()));
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture(Mutex::new(Vec::new()));

#[test]
fn test_refused_commands_error_completions_and_qp_errors_are_logged() {
    log::set_logger(&CAPTURE).unwrap();
    log::set_max_level(log::LevelFilter::Debug);

    let mut p = Pair::new(5);
    let src = p.a.alloc(8, 8);
    p.a.post_send(
        &mut p.qa,
        send_wr(7, WR_SEND, WQE_SIGNALED),
        &[sge(src, 8, 0xdead_0002)],
    );
    let c = p.a.drain_cq(&mut p.cq_a);
    assert_eq!(u32::from(c[0].status), WC_LOC_PROT_ERR);
    let qpn = p.qa.qpn;
    assert_ne!(p.a.modify_qp(0x7fff, 0, HcaQpAttr::default()), CMD_OK);

    let lines = CAPTURE.0.lock().unwrap().join("\n");
    let completion = format!(
        "DEBUG LID 1: CQ {:#x}: error completion, status {WC_LOC_PROT_ERR} opcode",
        p.cq_a.cqn
    );
    assert!(lines.contains(&completion), "{lines}");
    assert!(lines.contains("(wr_id 0x7)"), "{lines}");
    assert!(
        lines.contains(&format!("DEBUG LID 1: QP {qpn:#x} to ERR")),
        "{lines}"
    );
    assert!(
        lines.contains(&format!("command {CMD_MODIFY_QP:#x}")) && lines.contains("refused"),
        "{lines}"
    );
}
