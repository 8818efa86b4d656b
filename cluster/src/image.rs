//! The guest image `images/build.py` builds: Debian's kernel (as the ELF vmlinux QEMU boots
//! through PVH and as the bzImage hcabench's VMM boots) and the initramfs.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// A built guest image.
#[derive(Clone, Debug)]
pub struct Image {
    pub kernel_version: String,
    pub vmlinux: PathBuf,
    /// Debian's compressed kernel as shipped (the KVM backend boots it).
    pub bzimage: PathBuf,
    pub initramfs: PathBuf,
}

/// Why there is no image to boot.
#[derive(Debug)]
pub enum ImageError {
    /// `images/build.py` never ran for this directory.
    NotBuilt(PathBuf),
    /// A file of the named image is missing (a build was interrupted, or files removed).
    Incomplete { version: String, missing: PathBuf },
}

const HOW: &str = "build it with: python3 images/build.py";

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::NotBuilt(dir) => write!(f, "no guest image in {} ({HOW})", dir.display()),
            ImageError::Incomplete { version, missing } => write!(
                f,
                "guest image {version} is incomplete: no {} ({HOW})",
                missing.display()
            ),
        }
    }
}

impl std::error::Error for ImageError {}

impl From<ImageError> for String {
    fn from(e: ImageError) -> String {
        e.to_string()
    }
}

impl Image {
    /// The image `images/build.py` last built under `dir` (default target/images).
    pub fn find(dir: &Path) -> Result<Image, ImageError> {
        let ver = fs::read_to_string(dir.join("current"))
            .map_err(|_| ImageError::NotBuilt(dir.to_path_buf()))?;
        let ver = ver.trim().to_string();
        let img = Image {
            vmlinux: dir.join(&ver).join("vmlinux"),
            bzimage: dir.join(&ver).join("bzImage"),
            initramfs: dir.join(&ver).join("initramfs.cpio.gz"),
            kernel_version: ver,
        };
        for f in [&img.vmlinux, &img.bzimage, &img.initramfs] {
            if !f.exists() {
                return Err(ImageError::Incomplete {
                    version: img.kernel_version.clone(),
                    missing: f.clone(),
                });
            }
        }
        Ok(img)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_missing_or_partial_image_says_how_to_build_it() {
        let dir = std::env::temp_dir().join(format!("hcab-image-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
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
        fs::write(dir.join("6.1/initramfs.cpio.gz"), "").unwrap();
        assert_eq!(Image::find(&dir).unwrap().kernel_version, "6.1");
        fs::remove_dir_all(&dir).unwrap();
    }
}
