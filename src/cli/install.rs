//! Where `kiln build` installs dependencies (`--deps-sandbox`, the builder image, `KILN_BUILDER`)
//! and making sure the local store holds the runtime's images when they are needed.

use std::path::Path;

use anyhow::Context;

use crate::build::{Stage, deps::Isolation};

/// Where the dependency install runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DepsSandbox {
    /// bwrap, or the toolchain on PATH inside the runtime's builder image.
    Auto,
    /// Inside the builder image, in a rootless sandbox (bubblewrap or kiln's built-in one).
    Bwrap,
    /// The toolchain on PATH.
    None,
}

/// Whether this build needs the runtime's images in the local store: a whole build for its
/// base; `--stage deps` and `--stage lookup` only for the builder, and not when the install
/// uses the toolchain on PATH (`--deps-sandbox none`, or natively inside the builder image).
pub(super) fn needs_store(
    mode: DepsSandbox,
    in_builder: Option<&str>,
    runtime: &str,
    stage: &Stage,
) -> bool {
    let native =
        mode == DepsSandbox::None || (mode == DepsSandbox::Auto && in_builder == Some(runtime));
    !(native && matches!(stage, Stage::Deps(_) | Stage::Lookup(_)))
}

/// Resolves `--deps-sandbox` into where the install runs; `in_builder` is `KILN_BUILDER`.
pub(super) fn isolation(
    mode: DepsSandbox,
    builder: Option<&str>,
    in_builder: Option<&str>,
    runtime: &str,
) -> anyhow::Result<Isolation> {
    let sandbox = match mode {
        DepsSandbox::None => return Ok(Isolation::Host),
        // Inside the runtime's builder image (a build Job) the toolchain on PATH is its own;
        // a builder named by digest is the image this runs in (the Job's), and names it.
        DepsSandbox::Auto if in_builder == Some(runtime) => {
            return Ok(pinned_digest(builder)
                .map_or(Isolation::Host, |builder| Isolation::Native { builder }));
        }
        DepsSandbox::Auto => "auto",
        DepsSandbox::Bwrap => "bwrap",
    };
    let Some(image) = builder else {
        // A base override without a builder: the build refuses it only if the Function has
        // dependencies to install, never by falling back to the toolchain on PATH.
        return Ok(Isolation::MissingBuilder { sandbox });
    };
    let image = image
        .parse::<crate::run::ImageRef>()
        .with_context(|| format!("invalid --builder-image {image:?}"))?;
    // Unpacked by the build only if the Function has dependencies to install.
    Ok(Isolation::Pending(image))
}

/// The digest of a builder image named `REF@sha256:…`.
fn pinned_digest(builder: Option<&str>) -> Option<crate::oci::Digest> {
    let (_, digest) = builder?.rsplit_once('@')?;
    digest.parse().ok()
}

/// Makes sure the local store `store` has the runtime's base and builder images, assembling
/// them (downloads in `cache_dir`) when it does not.
pub(super) async fn ensure_store(
    runtime: &str,
    cache_dir: &Path,
    store: &Path,
) -> anyhow::Result<()> {
    ensure_store_for(runtime, cache_dir, store, &crate::oci::Platform::host()).await
}

/// [`ensure_store`] for `platform`'s images (named by [`crate::base::store::platform_name`]).
/// Another platform's builder carries no kiln: this one is for this machine's.
pub(super) async fn ensure_store_for(
    runtime: &str,
    cache_dir: &Path,
    store: &Path,
    platform: &crate::oci::Platform,
) -> anyhow::Result<()> {
    // The fast path: finding the package sources runs npm, which costs more than the build.
    if crate::base::store::has_platform_images(store, runtime, platform) {
        return Ok(());
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let source_args = super::base::SourceArgs {
        debian_mirror: var("KILN_DEBIAN_MIRROR")
            .map(|u| u.parse())
            .transpose()
            .context("KILN_DEBIAN_MIRROR")?,
        keyring: crate::base::debian::DEBIAN_ARCHIVE_KEYRING.into(),
        npm_registry: var("KILN_NPM_REGISTRY")
            .map(|u| u.parse())
            .transpose()
            .context("KILN_NPM_REGISTRY")?,
        cache_dir: Some(cache_dir.to_path_buf()),
    };
    let sources = super::base::sources(&source_args)?;
    let kiln = std::env::current_exe().context("finding the kiln binary")?;
    let host = crate::oci::Platform::host();
    let own = platform.os == host.os && platform.architecture == host.architecture;
    if !own {
        tracing::warn!(
            %platform,
            "no kiln for this platform in its builder image: it serves sandboxed installs, not \
                build Jobs (kiln base build --platform {platform} --kiln-binary FILE makes one \
                that does)",
        );
    }
    crate::base::store::ensure(&sources, runtime, store, own.then_some(&*kiln), platform)
        .await
        .with_context(|| {
            format!(
                "preparing the {runtime} runtime images in {}",
                store.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_without_a_builder_image_is_left_for_the_build_to_refuse() {
        let resolve = |mode, builder, in_builder| {
            isolation(mode, builder, in_builder, "nodejs22").expect("valid flags")
        };
        let builder = Some("oci:/tmp/bases:nodejs22-builder");
        assert!(matches!(
            resolve(DepsSandbox::Auto, None, None),
            Isolation::MissingBuilder { sandbox: "auto" }
        ));
        assert!(matches!(
            resolve(DepsSandbox::Bwrap, None, Some("nodejs22")),
            Isolation::MissingBuilder { sandbox: "bwrap" }
        ));
        assert!(matches!(
            resolve(DepsSandbox::Auto, builder, None),
            Isolation::Pending(_)
        ));
        // Another runtime's builder image does not have this runtime's toolchain.
        assert!(matches!(
            resolve(DepsSandbox::Auto, builder, Some("python313")),
            Isolation::Pending(_)
        ));
        assert!(matches!(
            resolve(DepsSandbox::Auto, None, Some("nodejs22")),
            Isolation::Host
        ));
        assert!(matches!(
            resolve(DepsSandbox::None, builder, None),
            Isolation::Host
        ));
    }

    #[test]
    fn inside_a_builder_named_by_digest_the_digest_names_the_toolchain() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let pinned = format!("registry.example/kiln/nodejs22-builder@{digest}");
        let resolve = |builder: &str, in_builder| {
            isolation(DepsSandbox::Auto, Some(builder), in_builder, "nodejs22").expect("valid")
        };
        assert!(matches!(
            resolve(&pinned, Some("nodejs22")),
            Isolation::Native { builder } if builder.to_string() == digest
        ));
        // By tag: nothing names the image, the toolchain on PATH is asked.
        assert!(matches!(
            resolve(
                "registry.example/kiln/nodejs22-builder:latest",
                Some("nodejs22")
            ),
            Isolation::Host
        ));
        // Outside the builder image the digest is an image to unpack.
        assert!(matches!(resolve(&pinned, None), Isolation::Pending(_)));
    }
}
