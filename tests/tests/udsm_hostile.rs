//! The user-level DSM's checks of its peers' messages (libdsm's udsm.c), on the host: its
//! handlers fed forged messages by `guest-kmod/libdsm/udsm_hostile.c`, which must see every
//! one refused with a protocol error, and a valid transaction complete. Needs gcc and the
//! libibverbs headers `images/build.py` extracts (Debian 12's libibverbs-dev, under
//! target/images/cache); skips without them, as the end-to-end tests skip without an image.

use std::process::Command;

#[test]
fn test_user_level_dsm_refuses_forged_messages() {
    let root = e2e::repo_root();
    let inc = root.join("target/images/cache/root-libibverbs-dev/usr/include");
    if !inc.join("infiniband/verbs.h").exists() {
        let why = format!("no {} (run python3 images/build.py)", inc.display());
        if std::env::var_os("HCABENCH_E2E_REQUIRED").is_some() {
            panic!("udsm_hostile: {why}");
        }
        e2e::skipped("udsm_hostile", &why);
        return;
    }
    let exe = e2e::scratch_dir("udsm_hostile").with_extension("bin");
    // Static, with the verbs calls left unresolved: no case reaches the device.
    let cc = Command::new("gcc")
        .args(["-O2", "-Wall", "-Werror", "-pthread", "-static", "-I"])
        .arg(&inc)
        .arg("-o")
        .arg(&exe)
        .arg(root.join("guest-kmod/libdsm/udsm_hostile.c"))
        .arg("-Wl,--unresolved-symbols=ignore-all")
        .output()
        .expect("gcc");
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let run = Command::new(&exe).output().expect("udsm_hostile");
    let _ = std::fs::remove_file(&exe);
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && out.starts_with("udsm-hostile ok "),
        "{out}{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
