//! Which VMM hosts a cluster's guests, and whether it can here.

use std::fmt;
use std::time::Duration;

use vmm::{check_kvm, KvmCheck};

/// What hosts a cluster's guests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A QEMU process per guest, the HCAs in a device server in this process.
    Qemu,
    /// hcabench's own VMM: every guest and HCA in this process (needs KVM that runs Linux).
    Kvm,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Qemu => "qemu",
            Backend::Kvm => "kvm",
        }
    }

    /// How progress lines name the guests' host.
    pub fn describe(self) -> &'static str {
        match self {
            Backend::Qemu => "QEMU (TCG)",
            Backend::Kvm => "KVM (hcabench's VMM)",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// `kvm` was asked for, and this host's KVM cannot run a Linux guest.
    #[error("backend kvm: KVM cannot run a Linux guest here ({0}); use --backend qemu or auto")]
    KvmUnusable(String),
    /// The QEMU binary is not installed.
    #[error(
        "{} not found: install it with `sudo apt-get install -y qemu-system-x86`",
        crate::qemu::QEMU
    )]
    NoQemu,
}

/// The backend for a request (`None`: auto) and why it was chosen. Auto picks the VMM where
/// KVM can run a Linux guest at native speed and QEMU (TCG) elsewhere; an explicit `kvm`
/// where KVM cannot is an error, never a silent fallback.
pub fn choose(requested: Option<Backend>) -> Result<(Backend, String), BackendError> {
    match requested {
        Some(Backend::Qemu) => Ok((Backend::Qemu, "asked for".into())),
        Some(Backend::Kvm) => match check_kvm() {
            KvmCheck::Usable => Ok((Backend::Kvm, "asked for".into())),
            KvmCheck::Unusable(why) => Err(BackendError::KvmUnusable(why)),
        },
        None => Ok(match check_kvm() {
            KvmCheck::Usable => (
                Backend::Kvm,
                "auto: KVM runs guests at native speed here, so hcabench's own VMM".into(),
            ),
            KvmCheck::Unusable(why) => (
                Backend::Qemu,
                format!("auto: KVM cannot run a Linux guest here ({why}), so QEMU with TCG"),
            ),
        }),
    }
}

/// What to tell a user whose guest did not reach userspace under hcabench's VMM in time:
/// what happened, then what to do.
pub fn kvm_boot_advice(err: &str, timeout: Duration) -> String {
    format!(
        "{err}\n\nhcabench's VMM (KVM) did not bring this guest to userspace (it stopped, or \
         the {}s limit passed). \
         Linux needs a few seconds there on hardware KVM; nested or heavily loaded KVM can be \
         far slower. What to do: run the same command with --backend qemu (QEMU, which needs \
         no KVM), or give KVM longer with --timeout; the kernel's own lines above show where \
         it stopped (add kernel_args = \"earlyprintk=serial,ttyS0\" to a cluster file for \
         the earliest ones).",
        timeout.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_kvm_is_refused_with_the_reason_where_it_cannot_run_linux() {
        match check_kvm() {
            KvmCheck::Usable => assert_eq!(choose(Some(Backend::Kvm)).unwrap().0, Backend::Kvm),
            KvmCheck::Unusable(why) => {
                let e = choose(Some(Backend::Kvm)).unwrap_err();
                assert_eq!(e, BackendError::KvmUnusable(why.clone()));
                assert!(e.to_string().contains("--backend qemu"), "{e}");
                let (auto, reason) = choose(None).unwrap();
                assert_eq!(auto, Backend::Qemu);
                assert!(reason.contains(&why), "{reason}");
            }
        }
        assert_eq!(choose(Some(Backend::Qemu)).unwrap().0, Backend::Qemu);
    }
}
