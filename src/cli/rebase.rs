//! `kiln rebase IMAGE --base NEW_BASE`: moves a Function image onto a new base image without
//! a build, when that is safe (see [`crate::rebase`]).

use anyhow::{Context, anyhow};
use clap::Args;

use super::Failure;
use super::registry::RegistryArgs;
use crate::cosign::{VerifyError, VerifyKey, Wanted};
use crate::image::resolve::{self, BaseRef};
use crate::oci::Platform;
use crate::rebase::attest::{self, Signer};
use crate::rebase::{self, Decision, IndexDecision, Request};
use crate::registry::{Client, Reference};
use crate::runtime::Catalog;

/// The exit code of a rebase refused as unsafe: a build is needed.
pub const EXIT_REBUILD: u8 = 3;

/// Flags of `kiln rebase`.
#[derive(Debug, Args)]
#[command(
    after_help = "What is checked (a rebase that fails any check is refused, with the reason):
  - the image was built by kiln, which can reproduce its build key from it;
  - the new base is for the same runtime and platform;
  - the dependency layer, if any, was installed by kiln's own lock-file install, or in the
    builder image the new base pairs with (--builder);
  - the new base offers the binary interface the dependencies were built for: the same
    Node.js major and module version, the same Python major.minor, the same C library at a
    version no older (the base's dev.kiln.abi.* labels).
The result is the image a full `kiln build` on the new base gives, to the digest.
An image index (kiln build --platform linux/amd64,linux/arm64) is rebased platform by
platform onto the new base's image for each, and its new index pushed last: every platform
moves, or none does (one that is not safe refuses the whole index).

Exit codes: 0 rebased (or on the new base already), 3 refused (build it instead), 1 failed,
2 bad usage.

Examples:
  kiln rebase reg.example.com/fns/orders:latest --base reg.example.com/kiln/nodejs22:1.1
  kiln rebase reg.example.com/fns/orders@sha256:… --base reg.example.com/kiln/python313:1.1 \\
      --builder reg.example.com/kiln/python313-builder:1.1 --image reg.example.com/fns/orders:v2
  kiln rebase reg.example.com/fns/orders:latest --base reg.example.com/kiln/nodejs22:1.1 --dry-run
  kiln rebase reg.example.com/fns/orders:latest --base reg.example.com/kiln/nodejs22:1.1 \\
      --sign-key cosign.key   # signed, with a provenance of the rebase and an SBOM"
)]
pub struct RebaseArgs {
    /// The Function image, by tag or digest (what `kiln build` printed): one platform's
    /// image, or the index of a build for several.
    #[arg(value_name = "IMAGE")]
    pub image: String,
    /// The new base image: a registry reference, or `oci:DIR[:NAME]` (as `kiln build --base`).
    #[arg(long, value_name = "REF")]
    pub base: String,
    /// The builder image the new base pairs with: needed to rebase an image whose dependencies
    /// were installed in a builder image (npm or pip ran), which must be this very one.
    #[arg(long, value_name = "REF")]
    pub builder: Option<String>,
    /// Where the rebased image goes [default: IMAGE's own tag; IMAGE by digest needs it].
    #[arg(long = "image", value_name = "REF")]
    pub target: Option<String>,
    /// Also tag the rebased image with its build key (`kiln-<hex>`), as `kiln build
    /// --tag-by-key` does.
    #[arg(long)]
    pub tag_by_key: bool,
    /// The platform of the new base (and builder) to take from an image index, for a
    /// one-platform image (an index's images each take their own).
    #[arg(long, value_name = "OS/ARCH", default_value = "linux/amd64")]
    pub platform: String,
    /// Say what would happen (rebase, rebuild and why, or nothing to do), and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write a JSON report here: the decision (`rebase`, `rebuild`, `current`, or `unproven`
    /// under --sign-key) and its reason,
    /// the reference, each blob's outcome, and the registry requests and bytes sent (in all,
    /// for the push alone, and for signing).
    #[arg(long, value_name = "FILE")]
    pub report: Option<std::path::PathBuf>,
    /// Cache directory: manifests and configs by digest, and what each registry refuses
    /// [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Sign the rebased image as `kiln build --sign-key` signs a build: with this ECDSA P-256
    /// key (a file or `env://VAR`; an encrypted key's password in COSIGN_PASSWORD), its
    /// signature, an SLSA provenance of the rebase (naming the image it came from and the new
    /// base) and its SBOM, stored as cosign stores them. An index: each platform's image, and
    /// the index.
    ///
    /// Only an image whose own build is proven is signed: its signature and SLSA provenance,
    /// signed by --input-key (default: this key's public half), must name the image and the
    /// build key it records. An index: each platform's image.
    #[arg(long, value_name = "FILE|env://VAR", env = "KILN_SIGN_KEY")]
    pub sign_key: Option<String>,
    /// The public key (PEM, a file or `env://VAR`) whose signature and provenance must prove
    /// IMAGE before --sign-key signs its rebase, when the build was signed by another key
    /// than --sign-key's (a CI key, say).
    #[arg(long, value_name = "FILE|env://VAR", requires = "sign_key")]
    pub input_key: Option<String>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

pub(super) async fn run(args: RebaseArgs) -> Result<String, Failure> {
    let started = crate::provenance::now();
    let usage = |e: anyhow::Error| Failure::Usage(e);
    let sign_key = match &args.sign_key {
        Some(spec) => Some(
            super::verify::read_key(spec, "--sign-key", crate::cosign::SignKey::from_pem)
                .map_err(usage)?,
        ),
        None => None,
    };
    let input_key = match (&args.input_key, &sign_key) {
        (Some(spec), _) => Some(
            super::verify::read_key(spec, "--input-key", crate::cosign::VerifyKey::from_pem)
                .map_err(usage)?,
        ),
        (None, Some(key)) => Some(key.public().clone()),
        (None, None) => None,
    };
    let image: Reference = args
        .image
        .parse()
        .with_context(|| format!("invalid image reference {:?}", args.image))
        .map_err(usage)?;
    let base = BaseRef::parse(&args.base)
        .with_context(|| format!("--base {:?}", args.base))
        .map_err(usage)?;
    let target: Reference = match &args.target {
        Some(t) => t
            .parse()
            .with_context(|| format!("--image {t:?}"))
            .map_err(usage)?,
        None => match &image.tag {
            Some(tag) => image
                .repository_only()
                .with_tag(tag)
                .map_err(|e| usage(e.into()))?,
            None => {
                return Err(usage(anyhow!(
                    "{} names no tag to move: pass --image REF for the rebased image",
                    args.image
                )));
            }
        },
    };
    let platform = Platform::parse(&args.platform)
        .ok_or_else(|| anyhow!("--platform {:?}: not OS/ARCH", args.platform))
        .map_err(usage)?;
    let mut config = args.registry.client_config().map_err(usage)?;
    let cache_dir = super::cache_dir(args.cache_dir.as_deref()).map_err(usage)?;
    config.cache_dir = Some(cache_dir.clone());
    let client = Client::new(config)
        .context("setting up the registry client")
        .map_err(usage)?;
    let builder_ref = match &args.builder {
        Some(b) => Some((
            BaseRef::parse(b)
                .with_context(|| format!("--builder {b:?}"))
                .map_err(usage)?,
            b.as_str(),
        )),
        None => None,
    };
    let builder = match &builder_ref {
        Some((parsed, b)) => {
            let found = resolve::resolve(&client, parsed, b, &platform)
                .await
                .with_context(|| format!("reading the builder image {b}"))
                .map_err(Failure::Build)?;
            Some(found.base.manifest.digest)
        }
        None => None,
    };
    let catalog = Catalog::embedded();
    let request = Request {
        image: &image,
        base: &base,
        base_name: &args.base,
        builder: builder.as_ref(),
        builder_index: builder_ref
            .as_ref()
            .and_then(|(r, _)| rebase::pinned_digest(r)),
        platform: &platform,
        catalog: &catalog,
        resolved: None,
    };
    let planned = rebase::plan(&client, request).await;
    let report = |fields: serde_json::Value| -> Result<(), Failure> {
        let Some(path) = &args.report else {
            return Ok(());
        };
        let mut value = serde_json::json!({
            "image": args.image,
            "base": args.base,
            "dryRun": args.dry_run,
            "registry": client.traffic(),
        });
        if let (Some(all), serde_json::Value::Object(more)) = (value.as_object_mut(), fields) {
            all.extend(more);
        }
        let bytes = serde_json::to_vec_pretty(&value)
            .context("serialising the report")
            .map_err(Failure::Build)?;
        std::fs::write(path, bytes)
            .with_context(|| format!("writing the report to {}", path.display()))
            .map_err(Failure::Build)
    };
    let planned = match planned {
        Ok(planned) => planned,
        Err(rebase::Error::Index { index, .. }) => {
            let builder = builder_ref.as_ref().map(|(parsed, b)| (parsed, *b));
            let plan = rebase::plan_index(&client, request, &index, builder, &())
                .await
                .map_err(|e| Failure::Build(e.into()))?;
            let to = (&image, &target);
            let signer = sign_key
                .as_ref()
                .zip(input_key.as_ref())
                .map(|(key, proof)| {
                    let signer = Signer {
                        key,
                        cache_dir: &cache_dir,
                        started: &started,
                    };
                    (signer, proof)
                });
            let builder = args.builder.as_deref();
            return rebase_index(
                &args,
                &client,
                plan,
                &index.digest,
                to,
                (signer, builder),
                &report,
            )
            .await;
        }
        Err(e) => return Err(Failure::Build(e.into())),
    };
    if let (Some(proof), Decision::Rebase(_)) = (&input_key, &planned.decision) {
        let current = image.repository_only().with_digest(planned.current.clone());
        proven(&client, &[current], proof, &report).await?;
    }
    let rebased = match (planned.decision, args.dry_run) {
        (Decision::Current, _) => {
            let at = (&client, &image, &planned.current, &target);
            return stays(&args, &report, at).await;
        }
        (Decision::Rebuild(reason), _) => return refuse(&args, &report, reason),
        (Decision::Rebase(rebased), true) => {
            let reference = format!(
                "{}@{}",
                target.repository_path(),
                rebased.image.manifest.digest
            );
            report(serde_json::json!({
                "decision": "rebase",
                "reference": reference,
                "imageKey": rebased.image_key,
            }))?;
            return Ok(format!(
                "rebase {reference} (image key {})",
                rebased.image_key
            ));
        }
        (Decision::Rebase(rebased), false) => rebased,
    };
    let scratch = tempfile::tempdir()
        .context("making a scratch directory")
        .map_err(Failure::Build)?;
    let key_tag = args
        .tag_by_key
        .then(|| crate::build::plan::key_tag(&rebased.image_key));
    let before = client.traffic();
    let published = rebase::publish(
        &client,
        &rebased,
        &planned.new_base,
        &image,
        &target,
        key_tag,
        scratch.path(),
    )
    .await
    .map_err(|e| Failure::Build(e.into()))?;
    let pushed = client.traffic();
    if let Some(key) = &sign_key {
        let signer = Signer {
            key,
            cache_dir: &cache_dir,
            started: &started,
        };
        let from = image.with_digest(planned.current.clone());
        let builder = args.builder.as_deref();
        let base = &planned.new_base;
        let one = attest::Image::rebased(&rebased, base, (&from, &target), &platform, builder);
        attest::image(&client, signer, one)
            .await
            .map_err(|e| Failure::Build(e.into()))?;
    }
    let after = client.traffic();
    tracing::info!(
        reference = %published.reference,
        image_key = %rebased.image_key,
        blobs = %crate::image::publish::counts(&published.blobs),
        "rebased",
    );
    report(serde_json::json!({
        "decision": "rebase",
        "reference": published.reference,
        "digest": published.digest,
        "imageKey": rebased.image_key,
        "blobs": published.blobs,
        "push": {
            "requests": pushed.requests - before.requests,
            "bytesSent": pushed.bytes_sent - before.bytes_sent,
        },
        "signing": {
            "requests": after.requests - pushed.requests,
            "bytesSent": after.bytes_sent - pushed.bytes_sent,
        },
    }))?;
    Ok(published.reference)
}

/// `kiln rebase` of an image index: every platform's image moves, or none does.
async fn rebase_index(
    args: &RebaseArgs,
    client: &Client,
    plan: IndexDecision,
    current: &crate::oci::Digest,
    (image, target): (&Reference, &Reference),
    (signer, builder): (Option<(Signer<'_>, &VerifyKey)>, Option<&str>),
    report: &impl Fn(serde_json::Value) -> Result<(), Failure>,
) -> Result<String, Failure> {
    let (index, platforms) = match plan {
        IndexDecision::Current => {
            return stays(args, report, (client, image, current, target)).await;
        }
        IndexDecision::Rebuild(reason) => return refuse(args, report, reason),
        IndexDecision::Rebase { index, platforms } => (index, platforms),
    };
    let reference = format!("{}@{}", target.repository_path(), index.digest);
    let keys: Vec<serde_json::Value> = platforms
        .iter()
        .map(|p| match &p.planned.decision {
            Decision::Rebase(rebased) => serde_json::json!({
                "platform": p.platform.to_string(),
                "digest": rebased.image.manifest.digest,
                "imageKey": rebased.image_key,
            }),
            _ => serde_json::json!({
                "platform": p.platform.to_string(),
                "digest": p.current.digest,
                "current": true,
            }),
        })
        .collect();
    if let Some((_, proof)) = &signer {
        let current: Vec<Reference> = platforms
            .iter()
            .map(|p| {
                image
                    .repository_only()
                    .with_digest(p.current.digest.clone())
            })
            .collect();
        proven(client, &current, proof, report).await?;
    }
    if args.dry_run {
        report(serde_json::json!({
            "decision": "rebase", "reference": reference, "platforms": keys,
        }))?;
        return Ok(format!(
            "rebase {reference} ({} platforms)",
            platforms.len()
        ));
    }
    let scratch = tempfile::tempdir()
        .context("making a scratch directory")
        .map_err(Failure::Build)?;
    let before = client.traffic();
    let (digest, published) = rebase::publish_index(
        client,
        &index,
        &platforms,
        image,
        target,
        args.tag_by_key,
        scratch.path(),
    )
    .await
    .map_err(|e| Failure::Build(e.into()))?;
    let pushed = client.traffic();
    if let Some((signer, _)) = signer {
        attest::index(
            client,
            signer,
            &platforms,
            (image, target),
            &digest,
            builder,
        )
        .await
        .map_err(|e| Failure::Build(e.into()))?;
    }
    let after = client.traffic();
    tracing::info!(%reference, platforms = platforms.len(), "rebased the image index");
    let blobs: Vec<_> = published.iter().flat_map(|p| &p.blobs).collect();
    report(serde_json::json!({
        "decision": "rebase",
        "reference": reference,
        "digest": digest,
        "platforms": keys,
        "blobs": blobs,
        "push": {
            "requests": pushed.requests - before.requests,
            "bytesSent": pushed.bytes_sent - before.bytes_sent,
        },
        "signing": {
            "requests": after.requests - pushed.requests,
            "bytesSent": after.bytes_sent - pushed.bytes_sent,
        },
    }))?;
    Ok(reference)
}

/// The image (`image` as named, at `digest`) is on the new base already: its reference
/// (`current REF` in a dry run), put where `--image` and `--tag-by-key` ask ([`place`]).
async fn stays(
    args: &RebaseArgs,
    report: &impl Fn(serde_json::Value) -> Result<(), Failure>,
    (client, image, digest, target): (&Client, &Reference, &crate::oci::Digest, &Reference),
) -> Result<String, Failure> {
    tracing::info!(image = %args.image, base = %args.base, "on the new base already");
    let current = format!("{}@{digest}", image.repository_path());
    if !args.dry_run {
        let at = image.with_digest(digest.clone());
        place(client, &at, target, args)
            .await
            .map_err(Failure::Build)?;
    }
    report(serde_json::json!({ "decision": "current", "reference": current }))?;
    Ok(match args.dry_run {
        true => format!("current {current}"),
        false => current,
    })
}

/// An image on the new base already (`at`, by digest) is where a rebase would have put it:
/// `--image`'s tag (in another repository, its blobs mounted there first) and, with
/// `--tag-by-key`, its key's tag (not an index's). The image's own tag, which named it, is not
/// put again.
async fn place(
    client: &Client,
    at: &Reference,
    target: &Reference,
    args: &RebaseArgs,
) -> anyhow::Result<()> {
    let mut tags: Vec<String> = Vec::new();
    if args.target.is_some()
        && let Some(tag) = &target.tag
    {
        tags.push(tag.clone());
    }
    if tags.is_empty() && !args.tag_by_key {
        return Ok(());
    }
    let doc = client
        .get_manifest(at, &crate::registry::DEFAULT_MANIFEST_TYPES)
        .await
        .with_context(|| format!("reading {at}"))?;
    if args.tag_by_key && !doc.media_type.is_index() {
        let key = attest::recorded_key(client, at).await?;
        tags.push(crate::build::plan::key_tag(&key));
    } else if args.tag_by_key {
        tracing::warn!(image = %at, "an index on the new base already is not tagged by key");
    }
    // Another repository: the image (an index's platform images) first, by mounts.
    if (&at.registry, &at.repository) != (&target.registry, &target.repository) {
        if doc.media_type.is_index() {
            let index: crate::oci::Index = doc.parse().context("parsing the index")?;
            for image in &index.manifests {
                let one = at.with_digest(image.digest.clone());
                rebase::copy_by_mounts(client, &one, target).await?;
            }
        } else {
            rebase::copy_by_mounts(client, at, target).await?;
        }
    }
    for tag in tags {
        let to = target.repository_only().with_tag(&tag)?;
        client
            .put_manifest(&to, &doc)
            .await
            .with_context(|| format!("tagging {at} as {to}"))?;
        tracing::info!(image = %at, tag = %to, "on the new base already: tagged");
    }
    Ok(())
}

/// Before `--sign-key` signs a rebase of `images` (each by digest: an index's every
/// platform's), each image's own build must be proven: a signature by `key` over it, and a
/// provenance by `key` that names it and the build key it records. The rebase's provenance
/// says it was built as that key says; a signature over an image anyone could have edited in
/// the registry (its dependency layer, say, which the rebase keeps as it is) would lend it the
/// signer's trust. Checked before anything is written, in a dry run too (it only reads).
///
/// # Errors
/// An image that is not proven (exit 1, `unproven` in the report), or the registry failing.
async fn proven(
    client: &Client,
    images: &[Reference],
    key: &VerifyKey,
    report: &impl Fn(serde_json::Value) -> Result<(), Failure>,
) -> Result<(), Failure> {
    for image in images {
        let recorded = attest::recorded_key(client, image)
            .await
            .map_err(|e| Failure::Build(e.into()))?
            .to_string();
        let wanted = Wanted {
            build_key: Some(&recorded),
            pushed_as: None,
        };
        match crate::cosign::verify(client, image, key, wanted).await {
            Ok(_) => tracing::info!(%image, key = %key.id(), "the image's build is proven"),
            Err(e @ VerifyError::Registry { .. }) => {
                let e = anyhow::Error::new(e);
                return Err(Failure::Build(e.context("proving the image's build")));
            }
            Err(e) => {
                let e = anyhow::Error::new(e);
                let reason = format!(
                    "kiln rebase --sign-key signs only an image whose build is proven by key {}, \
                     and {image} is not: {e:#}. Sign its build (kiln build --sign-key), name the \
                     key that did with --input-key, or rebase it without --sign-key",
                    key.id()
                );
                report(serde_json::json!({ "decision": "unproven", "reason": reason }))?;
                return Err(Failure::Build(anyhow!(reason)));
            }
        }
    }
    Ok(())
}

/// A rebase refused as unsafe: the reason, and the exit code that asks for a build.
fn refuse(
    args: &RebaseArgs,
    report: &impl Fn(serde_json::Value) -> Result<(), Failure>,
    reason: String,
) -> Result<String, Failure> {
    report(serde_json::json!({ "decision": "rebuild", "reason": reason }))?;
    if args.dry_run {
        return Ok(format!("rebuild {reason}"));
    }
    eprintln!(
        "kiln rebase: {} cannot be rebased onto {}: {reason}. Build it on the new base \
         instead (kiln build … --base {}).",
        args.image, args.base, args.base
    );
    Err(Failure::Exit(EXIT_REBUILD))
}
