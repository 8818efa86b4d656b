//! What the command-line tests share: the hcabench binary run against a run directory, and
//! its output as text. Each test file includes it with `mod common;`.

use std::path::Path;
use std::process::{Command, Output};

/// `hcabench --run-dir RUN_DIR`, not run yet, with RUST_LOG=warn (its own default, so
/// that a RUST_LOG in the test's environment does not fill its output), in the test's
/// working directory: for a test that sets more (another filter, another directory).
pub fn command(run_dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hcabench"));
    c.env("RUST_LOG", "warn").arg("--run-dir").arg(run_dir);
    c
}

/// `hcabench --run-dir RUN_DIR ARGS...` run to its end. (kernel.rs runs its own from the
/// repository's root, where its default image directory is.)
#[allow(dead_code)]
pub fn hcabench(run_dir: &Path, args: &[&str]) -> Output {
    command(run_dir).args(args).output().expect("run hcabench")
}

/// What a command wrote on stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a command wrote, stdout and then stderr.
pub fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), String::from_utf8_lossy(&o.stderr))
}
