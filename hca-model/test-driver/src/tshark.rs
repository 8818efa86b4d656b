//! Decoding captures with Wireshark's own dissectors (tshark), for tests that check that a
//! capture means to Wireshark what the model meant. A test helper: the model only writes
//! captures (`hca_model::capture`).

/// Why tshark could not decode a capture.
#[derive(Debug)]
pub enum TsharkError {
    /// tshark is not installed (or cannot start).
    Missing(String),
    /// tshark ran and failed.
    Failed(String),
}

/// Decodes `pcap` with Wireshark's dissectors: for each frame, the values of `fields`
/// (tshark's names, e.g. `infiniband.bth.opcode`), empty where the frame has none. This is
/// how hcabench's tests check that captures mean to Wireshark what the model meant.
pub fn tshark_fields(
    pcap: &std::path::Path,
    fields: &[&str],
) -> Result<Vec<Vec<String>>, TsharkError> {
    let mut cmd = std::process::Command::new("tshark");
    cmd.arg("-n").arg("-r").arg(pcap).args(["-T", "fields"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .map_err(|e| TsharkError::Missing(format!("tshark cannot run: {e}")))?;
    if !out.status.success() {
        return Err(TsharkError::Failed(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect())
}
