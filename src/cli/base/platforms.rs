//! Which platforms `kiln base build` builds, and which kiln goes into each one's builder.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};

use super::BuildBaseArgs;
use crate::cli::Failure;
use crate::oci::Platform;

/// `--platform`: linux/amd64, linux/arm64, or both, comma-separated.
pub(super) fn base_platforms(args: &BuildBaseArgs) -> anyhow::Result<Vec<Platform>> {
    let mut platforms: Vec<Platform> = Vec::new();
    for part in args.platform.split(',').map(str::trim) {
        let platform = Platform::parse(part)
            .filter(|p| p.os == "linux" && p.machine().is_some() && p.variant.is_none())
            .ok_or_else(|| {
                anyhow!(
                    "--platform {part:?}: base images are built for linux/amd64 and linux/arm64"
                )
            })?;
        if !platforms.contains(&platform) {
            platforms.push(platform);
        }
    }
    if platforms.len() > 1 && args.kiln_image.is_some() {
        return Err(anyhow!(
            "--kiln-image is for one platform: build the kiln image once per platform"
        ));
    }
    // Each --kiln-binary is for one of the platforms, and no two for the same one.
    let mut placed: Vec<&Platform> = Vec::new();
    for binary in &args.kiln_binary {
        let Some(platform) = platforms
            .iter()
            .find(|p| check_kiln_binary(binary, p).is_ok())
        else {
            let first = platforms.first().unwrap_or(&Platform::host()).clone();
            return Err(check_kiln_binary(binary, &first).err().unwrap_or_else(|| {
                anyhow!("--kiln-binary {} is for no --platform", binary.display())
            }));
        };
        if placed.contains(&platform) {
            return Err(anyhow!(
                "--kiln-binary is given twice for {platform}: pass one kiln per platform"
            ));
        }
        placed.push(platform);
    }
    Ok(platforms)
}

/// The kiln binary for `platform`'s builder: --kiln-binary, or this kiln on its own platform,
/// or none.
pub(super) fn kiln_binary(
    args: &BuildBaseArgs,
    platform: &Platform,
) -> Result<Option<PathBuf>, Failure> {
    let given = args
        .kiln_binary
        .iter()
        .find(|path| check_kiln_binary(path, platform).is_ok());
    Ok(match given {
        Some(path) => Some(path.clone()),
        None if platform.architecture == Platform::host().architecture => Some(
            std::env::current_exe()
                .context("finding the kiln binary")
                .map_err(Failure::Build)?,
        ),
        None if args.kiln_image.is_some() => {
            return Err(Failure::Usage(anyhow!(
                "--kiln-image for {platform} needs --kiln-binary: a kiln built for {platform}"
            )));
        }
        None => {
            tracing::warn!(
                %platform,
                "no kiln binary for this platform: the builder image serves sandboxed \
                    installs, not build Jobs; pass --kiln-binary with a kiln for it",
            );
            None
        }
    })
}

/// `--kiln-binary`: an existing, executable regular file (symlinks followed), and an ELF
/// program for `platform`'s CPU when it is one.
fn check_kiln_binary(path: &Path, platform: &crate::oci::Platform) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "--kiln-binary {}: cannot read it; pass the path of a kiln executable",
            path.display()
        )
    })?;
    if !meta.is_file() {
        return Err(anyhow!(
            "--kiln-binary {} is not a regular file; pass the path of a kiln executable",
            path.display()
        ));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(anyhow!(
            "--kiln-binary {} is not executable; chmod +x it or pass another file",
            path.display()
        ));
    }
    let mut head = [0u8; 20];
    let read = std::io::Read::read(&mut std::fs::File::open(path)?, &mut head)?;
    // ELF's e_machine (little-endian, at 18): 62 is x86-64, 183 AArch64.
    if read == head.len() && head.starts_with(b"\x7fELF") {
        let machine = match u16::from_le_bytes([head[18], head[19]]) {
            62 => Some("x86_64"),
            183 => Some("aarch64"),
            _ => None,
        };
        if machine != platform.machine() {
            return Err(anyhow!(
                "--kiln-binary {} is a program for {}, not for {platform}; pass a kiln built \
                    for {platform}",
                path.display(),
                machine.unwrap_or("another CPU")
            ));
        }
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::tests::parse;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_kiln_binary_goes_to_the_builder_of_its_own_platform() {
        let this = std::env::current_exe().unwrap();
        let this = this.to_str().unwrap();
        let both = ["--platform", "linux/amd64,linux/arm64"];
        let args = parse(&[&both[..], &["--kiln-binary", this]].concat());
        let platforms = base_platforms(&args).unwrap();
        let (amd64, arm64) = (&platforms[0], &platforms[1]);
        assert_eq!(kiln_binary(&args, amd64).ok().flatten(), Some(this.into()));
        assert_eq!(kiln_binary(&args, arm64).ok().flatten(), None);
        let twice = parse(&[&both[..], &["--kiln-binary", this, "--kiln-binary", this]].concat());
        let err = base_platforms(&twice).unwrap_err().to_string();
        assert!(err.contains("given twice for linux/amd64"), "{err}");
        let foreign = parse(&["--platform", "linux/arm64", "--kiln-binary", this]);
        let err = base_platforms(&foreign).unwrap_err().to_string();
        assert!(err.contains("not for linux/arm64"), "{err}");
        let image = parse(
            &[
                &both[..],
                &["--image", "r.example/b:1", "--kiln-image", "r/k:1"],
            ]
            .concat(),
        );
        let err = base_platforms(&image).unwrap_err().to_string();
        assert!(err.contains("--kiln-image is for one platform"), "{err}");
    }

    #[test]
    fn the_kiln_binary_must_be_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("kiln");
        std::fs::write(&exe, b"x").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let amd64 = crate::oci::Platform::linux_amd64();
        assert_eq!(check_kiln_binary(&exe, &amd64).unwrap(), exe);
        // An ELF program for another CPU is refused.
        let this = std::env::current_exe().unwrap();
        let arm64 = crate::oci::Platform::linux("arm64");
        let err = format!("{:#}", check_kiln_binary(&this, &arm64).unwrap_err());
        assert!(
            err.contains("is a program for x86_64, not for linux/arm64"),
            "{err}"
        );
        assert_eq!(check_kiln_binary(&this, &amd64).unwrap(), this);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"x").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = format!("{:#}", check_kiln_binary(&plain, &amd64).unwrap_err());
        assert!(err.contains("is not executable"), "{err}");
        let err = format!("{:#}", check_kiln_binary(dir.path(), &amd64).unwrap_err());
        assert!(err.contains("is not a regular file"), "{err}");
        let err = format!(
            "{:#}",
            check_kiln_binary(&dir.path().join("nope"), &amd64).unwrap_err()
        );
        assert!(
            err.contains("cannot read it") && err.contains("No such file"),
            "{err}"
        );
    }
}
