//! The guest console protocol: the lines the guest image's init (`images/init.sh`) prints
//! for the harness, each starting with [`PREFIX`] and a kind. Rust code matches these
//! constants, never its own literals; a test checks that init.sh prints exactly the kinds in
//! [`INIT_KINDS`] and recognises exactly the PCI functions of [`hca_model::abi`].

/// Every harness line starts with this.
pub const PREFIX: &str = "HCABENCH-";
/// The first userspace line: `HCABENCH-INIT node=NAME kernel=VERSION uptime=SECONDS`.
pub const INIT: &str = "HCABENCH-INIT";
/// An HCA on the guest's PCI bus: `HCABENCH-PCI 0000:00:04.0 0x1af4:0x1110`.
pub const PCI: &str = "HCABENCH-PCI";
/// Something the init could not do: `HCABENCH-ERROR what`.
pub const ERROR: &str = "HCABENCH-ERROR";
/// hca_probe's findings (`HCA found ...`, `doorbell-irq rounds=... median_ns=...`).
pub const PROBE: &str = "HCABENCH-PROBE";
/// An ib_core device's port: `HCABENCH-IB hcab0 lid=0x1 state=ACTIVE`.
pub const IB: &str = "HCABENCH-IB";
/// IPoIB is up on the shell job's ib0: `HCABENCH-IPOIB ib0 addr=10.78.0.1/16`.
pub const IPOIB: &str = "HCABENCH-IPOIB";
/// The shell job's shared userland disk is under /usr (`userland-up`):
/// `HCABENCH-USERLAND /usr from 3.89 s to 4.51 s` (uptime before and after).
pub const USERLAND: &str = "HCABENCH-USERLAND";
/// Init is done (drivers loaded): `HCABENCH-READY node=NAME uptime=SECONDS`.
pub const READY: &str = "HCABENCH-READY";
/// The agent's command channel is open (`hcabench.cmd=agent`).
pub const AGENT: &str = "HCABENCH-AGENT";
/// Not printed by init: the agent ([`crate::agent`]) ends each command it types with
/// `echo "HCABENCH-RC SEQ $?"`.
pub const RC: &str = "HCABENCH-RC";

/// Every kind of line init.sh prints.
pub const INIT_KINDS: [&str; 9] = [INIT, PCI, ERROR, PROBE, IB, IPOIB, USERLAND, READY, AGENT];

#[cfg(test)]
mod tests {
    use super::*;
    use hca_model::abi;
    use std::collections::BTreeSet;

    fn init_sh() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../images/init.sh");
        std::fs::read_to_string(path).expect("images/init.sh")
    }

    /// The kinds init.sh prints: `say KIND ...` (say prefixes PREFIX) and literal
    /// `HCABENCH-KIND` (the probe's dmesg lines, rewritten by sed).
    fn kinds_printed(script: &str) -> BTreeSet<String> {
        let mut kinds = BTreeSet::new();
        for line in script.lines().map(str::trim_start) {
            if line.starts_with('#') {
                continue;
            }
            for marker in ["say ", PREFIX] {
                for (i, _) in line.match_indices(marker) {
                    let word: String = line[i + marker.len()..]
                        .trim_start_matches('"')
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase())
                        .collect();
                    if !word.is_empty() {
                        kinds.insert(format!("{PREFIX}{word}"));
                    }
                }
            }
        }
        kinds
    }

    #[test]
    fn test_init_sh_prints_exactly_the_protocol_kinds() {
        let printed = kinds_printed(&init_sh());
        let known: BTreeSet<String> = INIT_KINDS.iter().map(|k| k.to_string()).collect();
        assert_eq!(
            printed, known,
            "images/init.sh and console_protocol disagree"
        );
    }

    #[test]
    fn test_kind_parser_sees_say_and_literal_lines() {
        let script = "say \"INIT node=$n\"\n# say NOTME\nsed 's/x/HCABENCH-PROBE /'\n\
                      [ x ] || say ERROR oops\n";
        let got: Vec<String> = kinds_printed(script).into_iter().collect();
        assert_eq!(got, ["HCABENCH-ERROR", "HCABENCH-INIT", "HCABENCH-PROBE"]);
    }

    #[test]
    fn test_init_sh_looks_for_the_abi_pci_functions() {
        let script = init_sh();
        let pattern = script
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("0x") && l.ends_with(')'))
            .expect("init.sh's case pattern of PCI IDs");
        let found: BTreeSet<&str> = pattern
            .trim_end_matches(')')
            .split('|')
            .map(str::trim)
            .collect();
        let abi_ids: BTreeSet<String> = [
            (abi::PCI_VENDOR_IVSHMEM, abi::PCI_DEVICE_IVSHMEM),
            (abi::PCI_VENDOR_HCABENCH, abi::PCI_DEVICE_HCABENCH),
        ]
        .iter()
        .map(|(v, d)| format!("{v:#06x}:{d:#06x}"))
        .collect();
        assert_eq!(
            found,
            abi_ids.iter().map(String::as_str).collect::<BTreeSet<_>>()
        );
    }
}
