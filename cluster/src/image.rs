//! The guest images `images/build.py` builds: a kernel (as the ELF vmlinux QEMU boots
//! through PVH and as the bzImage hcabench's VMM boots) and the initramfs, one directory per
//! kernel: Debian's by release name (`6.1.0-56-amd64`, `6.12.117+deb12-amd64`), a
//! developer's as `local-<release>`; `current` names the default one.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A built guest image.
#[derive(Clone, Debug)]
pub struct Image {
    /// The guest kernel's release, as `uname -r` prints it there.
    pub kernel_version: String,
    /// The image's directory name: the release, or `local-<release>` for a developer's kernel.
    pub name: String,
    pub vmlinux: PathBuf,
    /// Debian's compressed kernel as shipped (the KVM backend boots it).
    pub bzimage: PathBuf,
    pub initramfs: PathBuf,
    /// The shared userland disk (python3, pyverbs, rdma-core's tests), where the image has
    /// one: every guest attaches it read-only (QEMU's virtio-blk-pci, the VMM's virtio-mmio
    /// block device), with serial [`USERLAND_SERIAL`], and `userland-up` lays it under /usr.
    pub userland: Option<PathBuf>,
}

/// The userland disk's serial, by which `userland-up` finds it among the guest's disks.
pub const USERLAND_SERIAL: &str = "hcab-userland";

/// Why there is no image to boot.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// `images/build.py` never ran for this directory.
    #[error("no guest image in {} ({HOW})", .0.display())]
    NotBuilt(PathBuf),
    /// A file of the named image is missing (a build was interrupted, or files removed).
    #[error("guest image {version} is incomplete: no {} ({HOW})", .missing.display())]
    Incomplete { version: String, missing: PathBuf },
    /// No image of the kernel asked for, and none could be built here.
    #[error(
        "no guest image of kernel {kernel} in {} (build it with: python3 images/build.py \
         --kernel {kernel})",
        .dir.display()
    )]
    NoKernel { kernel: String, dir: PathBuf },
    /// `images/build.py` failed for that kernel (it said why on stderr).
    #[error("building the guest image of kernel {kernel} failed: {source}")]
    Build { kernel: String, source: BuildError },
}

/// Why `images/build.py` built nothing.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The source tree this hcabench was built from is gone; `kernel`: the `--kernel` to
    /// run it with from the source tree.
    #[error(
        "{} is not here (this hcabench was built from a tree since moved){}",
        .script.display(),
        .kernel.as_ref().map_or_else(String::new, |k| {
            format!(": run it from the source tree with --kernel {k}")
        })
    )]
    Moved {
        script: PathBuf,
        kernel: Option<String>,
    },
    #[error("cannot run python3: {0}")]
    Python(#[source] std::io::Error),
    #[error("images/build.py exited with {0}")]
    Exit(std::process::ExitStatus),
    #[error("images/build.py named no image")]
    NoImage,
    #[error("images/build.py named no disk")]
    NoDisk,
    #[error("{}: {source}", .path.display())]
    Canonicalize {
        path: PathBuf,
        source: std::io::Error,
    },
}

const HOW: &str = "build it with: python3 images/build.py";

/// Runs `images/build.py` (its progress on stderr): the last line it printed on stdout
/// (what it built), or why it failed.
fn run_build_py(cmd: &mut Command) -> Result<String, BuildError> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(BuildError::Python)?;
    if !out.status.success() {
        return Err(BuildError::Exit(out.status));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(stdout.lines().last().unwrap_or("").trim().to_string())
}

impl Image {
    /// The default image under `dir` (default target/images): the one `images/build.py`
    /// builds without `--kernel`.
    pub fn find(dir: &Path) -> Result<Image, ImageError> {
        let ver = fs::read_to_string(dir.join("current"))
            .map_err(|_| ImageError::NotBuilt(dir.to_path_buf()))?;
        Self::open(dir, ver.trim())
    }

    /// The image of `kernel` under `dir`: the default one for None; else the image of that
    /// name (`6.12.117+deb12-amd64`, `local-6.12.0-rc1`), or the newest of a Debian version
    /// (`6.12` matches `6.12.117+deb12-amd64`, not `6.1.0-56-amd64`).
    pub fn resolve(dir: &Path, kernel: Option<&str>) -> Result<Image, ImageError> {
        let Some(kernel) = kernel else {
            return Self::find(dir);
        };
        if is_kernel_path(kernel) {
            return Err(ImageError::NoKernel {
                kernel: kernel.to_string(),
                dir: dir.to_path_buf(),
            });
        }
        if dir.join(kernel).join("manifest.json").exists() {
            return Self::open(dir, kernel);
        }
        let mut matches: Vec<(std::time::SystemTime, String)> = fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let versioned = name
                    .strip_prefix(kernel)
                    .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'));
                let built = e
                    .path()
                    .join("manifest.json")
                    .metadata()
                    .ok()?
                    .modified()
                    .ok()?;
                (versioned && !name.starts_with("local-")).then_some((built, name))
            })
            .collect();
        matches.sort();
        match matches.pop() {
            Some((_, name)) => Self::open(dir, &name),
            None => Err(ImageError::NoKernel {
                kernel: kernel.to_string(),
                dir: dir.to_path_buf(),
            }),
        }
    }

    /// Builds (or finds up to date) the image of `kernel` under `dir` with this source tree's
    /// `images/build.py`, its progress on stderr: a Debian version, or a developer's kernel
    /// tree or install directory (rebuilt whenever its files change).
    pub fn build(dir: &Path, kernel: &str) -> Result<Image, ImageError> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/build.py");
        let fail = |source| ImageError::Build {
            kernel: kernel.to_string(),
            source,
        };
        if !script.exists() {
            return Err(fail(BuildError::Moved {
                script,
                kernel: Some(kernel.to_string()),
            }));
        }
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .arg("--kernel")
            .arg(kernel)
            .arg("--out")
            .arg(dir);
        let built = run_build_py(cmd.arg("--print-dir")).map_err(fail)?;
        let name = Path::new(&built)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| fail(BuildError::NoImage))?;
        Self::open(dir, &name)
    }

    /// Builds (or finds up to date) a shared userland disk with Debian's `packages` (and
    /// their dependencies) beside the default ones, with this source tree's
    /// `images/build.py --package` (progress on stderr), under `dir/userland/`; its path.
    pub fn build_userland(dir: &Path, packages: &[String]) -> Result<PathBuf, ImageError> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/build.py");
        let fail = |source| ImageError::Build {
            kernel: format!("userland disk with {}", packages.join(", ")),
            source,
        };
        if !script.exists() {
            return Err(fail(BuildError::Moved {
                script,
                kernel: None,
            }));
        }
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg("--out").arg(dir);
        for p in packages {
            cmd.arg("--package").arg(p);
        }
        let path = Some(PathBuf::from(run_build_py(&mut cmd).map_err(fail)?))
            .filter(|p| p.extension().is_some_and(|e| e == "img"))
            .ok_or_else(|| fail(BuildError::NoDisk))?;
        // Absolute: the daemon that boots the guests runs elsewhere.
        fs::canonicalize(&path).map_err(|source| fail(BuildError::Canonicalize { path, source }))
    }

    /// The image in `dir/name`, checked whole.
    fn open(dir: &Path, name: &str) -> Result<Image, ImageError> {
        let d = dir.join(name);
        // The manifest names the release; images from before it did are named by it.
        let release = fs::read_to_string(d.join("manifest.json"))
            .ok()
            .and_then(|m| serde_json::from_str::<serde_json::Value>(&m).ok())
            .and_then(|m| m.get("kernel")?.as_str().map(String::from))
            .unwrap_or_else(|| name.to_string());
        let img = Image {
            vmlinux: d.join("vmlinux"),
            bzimage: d.join("bzImage"),
            initramfs: d.join("initramfs.cpio"),
            kernel_version: release,
            name: name.to_string(),
            userland: Some(d.join("userland.img")).filter(|p| p.exists()),
        };
        for f in [&img.vmlinux, &img.bzimage, &img.initramfs] {
            if !f.exists() {
                return Err(ImageError::Incomplete {
                    version: img.name.clone(),
                    missing: f.clone(),
                });
            }
        }
        Ok(img)
    }
}

/// Whether a `--kernel` value names a developer's kernel by path rather than a Debian kernel
/// by version: it has a slash or names a directory.
pub fn is_kernel_path(kernel: &str) -> bool {
    kernel.contains('/') || kernel.starts_with('.') || Path::new(kernel).is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hcab-image-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A whole image named `name` whose manifest gives `release`.
    fn image(dir: &Path, name: &str, release: &str) {
        let d = dir.join(name);
        fs::create_dir_all(&d).unwrap();
        for f in ["vmlinux", "bzImage", "initramfs.cpio"] {
            fs::write(d.join(f), "").unwrap();
        }
        fs::write(
            d.join("manifest.json"),
            format!("{{\"kernel\": \"{release}\"}}\n"),
        )
        .unwrap();
    }

    #[test]
    fn test_a_missing_or_partial_image_says_how_to_build_it() {
        let dir = scratch("partial");
        fs::create_dir_all(dir.join("6.1")).unwrap();
        let e = Image::find(&dir).unwrap_err();
        assert!(matches!(e, ImageError::NotBuilt(_)), "{e}");
        fs::write(dir.join("current"), "6.1\n").unwrap();
        fs::write(dir.join("6.1/vmlinux"), "").unwrap();
        let e = Image::find(&dir).unwrap_err().to_string();
        assert!(
            e.contains("6.1 is incomplete") && e.contains("bzImage"),
            "{e}"
        );
        assert!(e.contains("images/build.py"), "{e}");
        fs::write(dir.join("6.1/bzImage"), "").unwrap();
        fs::write(dir.join("6.1/initramfs.cpio"), "").unwrap();
        assert_eq!(Image::find(&dir).unwrap().kernel_version, "6.1");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_a_kernel_is_found_by_version_or_name_and_never_by_a_longer_version() {
        let dir = scratch("resolve");
        image(&dir, "6.1.0-56-amd64", "6.1.0-56-amd64");
        image(&dir, "6.12.117+deb12-amd64", "6.12.117+deb12-amd64");
        image(&dir, "local-6.12.0-rc1", "6.12.0-rc1");
        fs::write(dir.join("current"), "6.1.0-56-amd64\n").unwrap();

        let default = Image::resolve(&dir, None).unwrap();
        assert_eq!(default.kernel_version, "6.1.0-56-amd64");
        // "6.1" is 6.1's, not 6.12's, though both start with those characters.
        assert_eq!(
            Image::resolve(&dir, Some("6.1")).unwrap().name,
            "6.1.0-56-amd64"
        );
        let new = Image::resolve(&dir, Some("6.12")).unwrap();
        assert_eq!(new.name, "6.12.117+deb12-amd64");
        assert!(new.vmlinux.starts_with(dir.join("6.12.117+deb12-amd64")));
        // A developer's image: by its name, its release read from the manifest.
        let local = Image::resolve(&dir, Some("local-6.12.0-rc1")).unwrap();
        assert_eq!(local.kernel_version, "6.12.0-rc1");
        let e = Image::resolve(&dir, Some("6.6")).unwrap_err().to_string();
        assert!(
            e.contains("no guest image of kernel 6.6") && e.contains("--kernel 6.6"),
            "{e}"
        );
        // A path is never looked up by name: it is built (Image::build).
        assert!(matches!(
            Image::resolve(&dir, Some("./linux")),
            Err(ImageError::NoKernel { .. })
        ));
        assert!(is_kernel_path("/src/linux") && is_kernel_path("../linux"));
        assert!(!is_kernel_path("6.12") && !is_kernel_path("6.12.117+deb12-amd64"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
