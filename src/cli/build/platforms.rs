//! `kiln build --platform linux/amd64,linux/arm64`: one image per platform, built side by side
//! as a one-platform build would (the source layer is the same blob in each; the dependency
//! layer is each platform's own), then an OCI image index over them at the target, signed
//! like the images when a key is given. Each image is pushed by
//! digest (into a layout, under `NAME-OS-ARCH`), so the target's tag names only the index.
//! A split build (a build Job's `--stage lookup|deps|publish`) keeps each platform's files in
//! a directory of its own, `OS-ARCH`, below the stage and lookup directories it is given.

use std::path::Path;

use anyhow::{Context, anyhow};

use super::super::Failure;
use super::{Extra, build_failure, deps_line, external_parameters, lookup_line};
use crate::build::{self, Options, Stage, Target};
use crate::image::resolve;
use crate::oci::{Descriptor, Document, Index, Layout, Platform};
use crate::registry::Client;

/// Builds `opts` for each of `extra.platforms` and publishes the index; its reference.
///
/// # Errors
/// The first platform's build that fails (nothing of the index is written then), or the
/// index's push or signature.
pub(super) async fn build_several(
    client: &Client,
    opts: &Options,
    extra: &Extra,
) -> Result<String, Failure> {
    // Every platform's base first: one that lacks a platform fails the build before any
    // image is pushed. Each build then names its base by the digest found here, which the
    // client has: no second look-up of the tag.
    let mut bases = Vec::new();
    for platform in &extra.platforms {
        let resolved = resolve::resolve(client, &opts.base, &opts.base_name, platform)
            .await
            .map_err(|e| build_failure(e.into()))?;
        bases.push(pinned(&opts.base, &resolved));
    }
    let builds = extra
        .platforms
        .iter()
        .zip(bases)
        .map(|(platform, base)| async move {
            let mut one = for_platform(opts, platform);
            one.base = base;
            // The provenance says what was asked for: the target's tag, and this platform.
            let external = external_parameters(&one);
            one.target = by_digest(&opts.target, platform);
            if let Some(signing) = &mut one.signing {
                signing.external = external;
            }
            tracing::info!(%platform, "building for one platform of several");
            let output = build::run(client, &one).await.map_err(build_failure)?;
            let mut descriptor = manifest(client, &one.target, &output)
                .await
                .map_err(Failure::Build)?;
            descriptor.platform = Some(platform.clone());
            Ok::<_, Failure>(descriptor)
        });
    // Side by side: most of a build waits (on the registry, the package servers), and the
    // source layer one writes is the other's cache hit or the same bytes.
    let manifests = futures_util::future::try_join_all(builds).await?;
    let doc = Index::document(manifests)
        .context("writing the image index")
        .map_err(Failure::Build)?;
    let reference = publish_index(client, opts, &doc)
        .await
        .map_err(Failure::Build)?;
    tracing::info!(%reference, platforms = extra.platforms.len(), "built the image index");
    if let Some(path) = &extra.digest_file {
        std::fs::write(path, format!("{}\n", doc.digest))
            .with_context(|| format!("writing the digest to {}", path.display()))
            .map_err(Failure::Build)?;
    }
    Ok(reference)
}

/// `base` as `resolved` found it: a registry base by its platform manifest's digest (the
/// name the image records, `base_name`, stays as given); a layout as it is.
fn pinned(base: &resolve::BaseRef, resolved: &resolve::ResolvedBase) -> resolve::BaseRef {
    match base {
        resolve::BaseRef::Registry(reference) => {
            resolve::BaseRef::Registry(crate::registry::Reference {
                tag: None,
                digest: Some(resolved.base.manifest.digest.clone()),
                ..reference.clone()
            })
        }
        resolve::BaseRef::Layout { .. } => base.clone(),
    }
}

/// `--stage lookup` or `--stage deps` for several platforms: each platform's, one after the
/// other (an install takes the machine), in its own directory. One line: `PLATFORM=OUTCOME`
/// for each, separated by spaces, each outcome what a one-platform stage prints.
///
/// # Errors
/// The first platform's stage that fails.
pub(super) async fn stage_several(
    client: &crate::registry::Client,
    opts: &Options,
    extra: &Extra,
) -> Result<String, Failure> {
    let mut outcomes = Vec::new();
    for platform in &extra.platforms {
        let one = for_platform(opts, platform);
        tracing::info!(%platform, "the stage for one platform of several");
        let outcome = match &one.stage {
            Stage::Lookup(dir) => lookup_line(
                &build::run_lookup(client, &one, dir)
                    .await
                    .map_err(build_failure)?,
            ),
            Stage::Deps(dir) => deps_line(
                &build::run_deps(client, &one, dir)
                    .await
                    .map_err(build_failure)?,
            ),
            Stage::All | Stage::Publish(_) | Stage::Source(_) => {
                return Err(Failure::Usage(anyhow!(
                    "only --stage lookup and --stage deps run per platform on their own"
                )));
            }
        };
        outcomes.push(format!("{platform}={outcome}"));
    }
    Ok(outcomes.join(" "))
}

/// `opts` for one platform of several: that platform, and its own directory below each stage
/// and lookup directory.
fn for_platform(opts: &Options, platform: &Platform) -> Options {
    let own = |dir: &Path| dir.join(platform.file_name());
    let mut one = opts.clone();
    one.platform = platform.clone();
    one.stage = match &opts.stage {
        Stage::Deps(dir) => Stage::Deps(own(dir)),
        Stage::Publish(dir) => Stage::Publish(own(dir)),
        Stage::Lookup(dir) => Stage::Lookup(own(dir)),
        stage @ (Stage::All | Stage::Source(_)) => stage.clone(),
    };
    one.lookup_dir = opts.lookup_dir.as_deref().map(own);
    one
}

/// Where one platform's image goes: the target's repository by digest alone, or the layout
/// under a name of its own.
fn by_digest(target: &Target, platform: &Platform) -> Target {
    match target {
        Target::Registry(reference) => Target::Registry(reference.repository_only()),
        Target::Layout { dir, name } => Target::Layout {
            dir: dir.clone(),
            name: format!("{name}-{}", platform.file_name()),
        },
    }
}

/// The descriptor of the manifest a build published (read back when the build found its image
/// and made none).
async fn manifest(
    client: &Client,
    target: &Target,
    output: &build::Output,
) -> anyhow::Result<Descriptor> {
    if let Some(image) = &output.image {
        return Ok(image.manifest.descriptor());
    }
    let digest = &output.published.digest;
    let found = match target {
        Target::Registry(reference) => client
            .head_manifest(&reference.with_digest(digest.clone()))
            .await
            .with_context(|| format!("reading {} back", output.published.reference))?,
        Target::Layout { dir, name } => Some(
            Layout::open(dir)
                .and_then(|l| l.resolve(Some(name)))
                .with_context(|| format!("reading {} back", output.published.reference))?,
        ),
    };
    found
        .filter(|d| &d.digest == digest)
        .ok_or_else(|| anyhow!("{} is not there", output.published.reference))
}

/// Puts the index at the target (its tag, else by digest; a layout's name) and signs it when
/// the images are signed; its reference.
async fn publish_index(client: &Client, opts: &Options, doc: &Document) -> anyhow::Result<String> {
    match &opts.target {
        Target::Registry(target) => {
            let dest = match target.tag {
                Some(_) => target.clone(),
                None => target.with_digest(doc.digest.clone()),
            };
            client
                .put_manifest(&dest, doc)
                .await
                .with_context(|| format!("pushing the image index to {dest}"))?;
            if let Some(signing) = &opts.signing {
                let signed = crate::cosign::sign(client, target, &doc.digest, &signing.key)
                    .await
                    .context("signing the image index")?;
                tracing::info!(signature = ?signed, "signed the image index");
            }
            Ok(format!("{}@{}", target.repository_path(), doc.digest))
        }
        Target::Layout { dir, name } => {
            let layout = Layout::open(dir).with_context(|| format!("opening {}", dir.display()))?;
            layout.write_blob(&doc.bytes)?;
            layout.set_ref(doc.descriptor(), name)?;
            Ok(format!("oci:{}@{}", dir.display(), doc.digest))
        }
    }
}
