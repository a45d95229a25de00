//! `kiln warm`: prepares a cluster's registry before its first build — each runtime's base
//! and builder images copied from the local store (assembled there on first use), and the
//! dependency layers of given Functions pre-built into the cache repository. What is there
//! already is left alone, so a second run is a few requests and uploads nothing.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use futures_util::{StreamExt, stream};

use super::Failure;
use super::registry::RegistryArgs;
use crate::build::{self, Warmed};
use crate::image::publish::{BlobPlan, PublishInput, Publisher, RegistryPublisher, Role};
use crate::image::resolve::{BaseRef, resolve};
use crate::oci::{Image, Platform};
use crate::registry::{Client, Reference};
use crate::runtime::Catalog;

/// Flags of `kiln warm`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  kiln warm --registry reg.example.com                       # every runtime's images
  kiln warm --registry reg.example.com --cache-repo reg.example.com/kiln/cache \\
    --cache-sign-key cache.key --function fns/orders.yaml --function fns/billing.yaml
  kiln warm --registry reg.example.com --cache-repo reg.example.com/kiln/cache \\
    --cache-sign-key cache.key --runtime nodejs22 ./fn-a ./fn-b

Prints one line per image and Function: what is there now, and `pushed`, `unchanged`,
`stored`, `present` or `no-dependencies`.")]
pub struct WarmArgs {
    /// Runtimes whose images to put into --registry, and Function directories whose
    /// dependency layers to put into --cache-repo (an argument naming an existing directory
    /// is a Function). Without runtimes or Functions: every runtime.
    #[arg(value_name = "RUNTIME|DIR")]
    pub targets: Vec<String>,
    /// A Kyma Function manifest (inline source) whose dependency layer to pre-build into
    /// --cache-repo; repeatable. Its runtime's images are warmed too.
    #[arg(long, value_name = "FILE")]
    pub function: Vec<PathBuf>,
    /// The runtime of the Function directories given [default: the one runtime named, if
    /// exactly one is].
    #[arg(long, value_name = "RUNTIME")]
    pub runtime: Option<String>,
    /// The registry (host[:port], optionally with a path) to copy the runtimes' images into,
    /// as REGISTRY/PREFIX/RUNTIME:TAG and REGISTRY/PREFIX/RUNTIME-builder:TAG — the
    /// references `kiln controller --base-image`/`--builder-image` name in deploy/.
    #[arg(long, value_name = "REGISTRY[/PATH]", env = "KILN_REGISTRY")]
    pub registry: Option<String>,
    /// The repository path prefix of the runtime images in --registry.
    #[arg(long, default_value = "kiln", value_name = "PREFIX")]
    pub prefix: String,
    /// The tag of the runtime images in --registry.
    #[arg(long, default_value = "latest")]
    pub tag: String,
    /// The platforms of the runtime images, comma-separated: linux/amd64, linux/arm64, or
    /// both, for a cluster with Nodes of both. With several, each platform's image is pushed
    /// by digest and an OCI image index over them takes the tag. Another platform's images
    /// are assembled into the store too; its builder carries no kiln (this kiln is for this
    /// machine), so build Jobs run on Nodes of this platform [default: this machine's].
    #[arg(long, value_name = "OS/ARCH,…")]
    pub platform: Option<String>,
    /// The dependency-layer cache repository (`kiln build --cache-repo`) to pre-build the
    /// Functions' dependency layers into.
    #[arg(long, value_name = "REPO", env = "KILN_CACHE_REPO")]
    pub cache_repo: Option<String>,
    /// Who signs the entries stored, and whose count as present already.
    #[command(flatten)]
    pub cache_keys: super::build::CacheKeyArgs,
    /// Functions prepared at once (each may run an install).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub parallel: u16,
    /// Parallel blob transfers per image.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub jobs: u16,
    /// Cache directory: the local image store, dependency layers, downloads
    /// [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, value_name = "DIR", env = "KILN_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// As `kiln build --package-registry-config`: the package-registry config the installs
    /// use (and their keys count).
    #[arg(long, value_name = "DIR")]
    pub package_registry_config: Option<PathBuf>,
    /// As `kiln build --allow-direct-deps`.
    #[arg(long, env = "KILN_ALLOW_DIRECT_DEPS")]
    pub allow_direct_deps: bool,
    /// CA bundle the installs trust, as `kiln build --ca-bundle`.
    #[arg(long, value_name = "FILE")]
    pub ca_bundle: Option<PathBuf>,
    /// The layer compression the builds use (`kiln build --compression`): part of the
    /// dependency key.
    #[arg(
        long,
        value_enum,
        default_value_t = super::build::CompressionArg::Gzip,
        env = "KILN_COMPRESSION",
    )]
    pub compression: super::build::CompressionArg,
    /// As `kiln build --lockfile-install`: part of the dependency key.
    #[arg(
        long,
        value_enum,
        default_value_t = super::build::LockfileInstallArg::Auto,
        env = "KILN_LOCKFILE_INSTALL",
    )]
    pub lockfile_install: super::build::LockfileInstallArg,
    /// Registry access.
    #[command(flatten)]
    pub registry_args: RegistryArgs,
}

/// What was asked for, checked.
struct Plan {
    /// Runtimes whose images go to the registry (and whose store the Functions need).
    runtimes: Vec<String>,
    /// Each Function: how to name it, and its `kiln build` flags.
    functions: Vec<(String, Vec<OsString>)>,
    /// Where runtime images go.
    registry: Option<String>,
    cache_repo: Option<Reference>,
    /// The runtime images' platforms.
    platforms: Vec<Platform>,
}

fn plan(args: &WarmArgs) -> anyhow::Result<Plan> {
    let catalog = Catalog::embedded();
    let mut runtimes: Vec<String> = Vec::new();
    let mut dirs = Vec::new();
    let add = |name: &str, runtimes: &mut Vec<String>| -> anyhow::Result<()> {
        let (spec, alias) = catalog.resolve(name)?;
        if let Some(alias) = alias {
            tracing::warn!("{}", alias.warning(&catalog));
        }
        if !runtimes.contains(&spec.name) {
            runtimes.push(spec.name.clone());
        }
        Ok(())
    };
    for target in &args.targets {
        if std::path::Path::new(target).is_dir() {
            dirs.push(PathBuf::from(target));
        } else {
            add(target, &mut runtimes).with_context(|| {
                format!("{target:?} is neither a runtime nor a Function directory")
            })?;
        }
    }
    let named = runtimes.clone();
    let mut functions = Vec::new();
    if !dirs.is_empty() {
        let runtime = match (&args.runtime, named.as_slice()) {
            (Some(r), _) => r.clone(),
            (None, [one]) => one.clone(),
            (None, _) => {
                return Err(anyhow!(
                    "which runtime are the Function directories? pass --runtime RUNTIME"
                ));
            }
        };
        add(&runtime, &mut runtimes)?;
        for dir in dirs {
            let flags = vec![
                dir.clone().into(),
                "--runtime".into(),
                runtime.clone().into(),
            ];
            functions.push((dir.display().to_string(), flags));
        }
    }
    for file in &args.function {
        let manifest = build::function::FunctionManifest::read(file)?;
        add(&manifest.runtime, &mut runtimes)?;
        let flags = vec!["--function".into(), file.clone().into()];
        functions.push((file.display().to_string(), flags));
    }
    if runtimes.is_empty() {
        runtimes = catalog.names();
    }
    let cache_repo = args
        .cache_repo
        .as_deref()
        .map(super::build::cache_repo)
        .transpose()?;
    if !functions.is_empty() && cache_repo.is_none() {
        return Err(anyhow!(
            "Functions to warm, but no cache repository to warm them into: pass --cache-repo REPO"
        ));
    }
    if !functions.is_empty() && args.cache_keys.cache_sign_key.is_none() {
        return Err(anyhow!(
            "Functions to warm, but no key to sign their cache entries with: pass \
                --cache-sign-key FILE (readers use only entries a key they trust signed)"
        ));
    }
    if functions.is_empty() && args.registry.is_none() {
        return Err(anyhow!(
            "nothing to do: pass --registry REGISTRY for the runtimes' images (and --cache-repo \
                REPO with Functions)"
        ));
    }
    let registry = args
        .registry
        .clone()
        .map(|r| r.trim_end_matches('/').to_string());
    if let Some(registry) = &registry {
        let host = registry.split('/').next().unwrap_or_default();
        crate::registry::check_registry(host)
            .map_err(|problem| anyhow!("--registry {registry:?}: {problem}"))?;
    }
    let platforms = match &args.platform {
        None => vec![Platform::host()],
        Some(list) => Platform::parse_list(list)
            .map_err(|why| anyhow!("--platform {list:?}: {why}"))?
            .into_iter()
            .map(
                |p| match p.os == "linux" && p.machine().is_some() && p.variant.is_none() {
                    true => Ok(p),
                    false => Err(anyhow!(
                        "--platform {p}: runtime images are built for linux/amd64 and linux/arm64"
                    )),
                },
            )
            .collect::<anyhow::Result<_>>()?,
    };
    // Every Function is built with the same shared flags.
    let shared = shared_build_flags(args);
    for (_, flags) in &mut functions {
        flags.extend(shared.iter().cloned());
    }
    Ok(Plan {
        runtimes,
        functions,
        registry,
        cache_repo,
        platforms,
    })
}

/// The `kiln build` flags every warmed Function gets: those of `args` that `kiln build` has
/// too.
fn shared_build_flags(args: &WarmArgs) -> Vec<OsString> {
    let mut shared: Vec<OsString> = Vec::new();
    if let Some(dir) = &args.cache_dir {
        shared.extend(["--cache-dir".into(), dir.into()]);
    }
    if let Some(dir) = &args.package_registry_config {
        shared.extend(["--package-registry-config".into(), dir.into()]);
    }
    shared.extend(args.cache_keys.flags());
    if let Some(file) = &args.ca_bundle {
        shared.extend(["--ca-bundle".into(), file.into()]);
    }
    if args.allow_direct_deps {
        shared.push("--allow-direct-deps".into());
    }
    if args.compression == super::build::CompressionArg::Zstd {
        shared.extend(["--compression".into(), "zstd".into()]);
    }
    if args.lockfile_install == super::build::LockfileInstallArg::Off {
        shared.extend(["--lockfile-install".into(), "off".into()]);
    }
    shared
}

pub(super) async fn run(args: WarmArgs) -> Result<String, Failure> {
    let plan = plan(&args).map_err(Failure::Usage)?;
    let cache_dir = super::cache_dir(args.cache_dir.as_deref()).map_err(Failure::Usage)?;
    let store = cache_dir.join("store");
    let mut config = args.registry_args.client_config().map_err(Failure::Usage)?;
    config.cache_dir = Some(cache_dir.clone());
    let client = Client::new(config)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    // Checked before anything is assembled or installed.
    let functions = plan
        .functions
        .iter()
        .map(|(label, flags)| {
            super::build::warm_options(flags)
                .with_context(|| format!("Function {label}"))
                .map(|opts| (label.clone(), opts))
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map_err(Failure::Usage)?;
    let mut lines = Vec::new();
    for runtime in &plan.runtimes {
        // The Functions build on this machine's images.
        super::install::ensure_store(runtime, &cache_dir, &store)
            .await
            .map_err(Failure::Build)?;
        for platform in &plan.platforms {
            super::install::ensure_store_for(runtime, &cache_dir, &store, platform)
                .await
                .map_err(Failure::Build)?;
        }
        let Some(registry) = &plan.registry else {
            continue;
        };
        for builder in [false, true] {
            let name = |runtime: &str| match builder {
                true => crate::base::store::builder_name(runtime),
                false => runtime.to_string(),
            };
            let target = format!("{registry}/{}/{}:{}", args.prefix, name(runtime), args.tag);
            let target: Reference = target
                .parse()
                .with_context(|| {
                    format!("invalid image reference {target:?} (--registry, --prefix, --tag)")
                })
                .map_err(Failure::Usage)?;
            let stored = plan.platforms.iter().map(|platform| {
                let in_store = crate::base::store::platform_name(runtime, platform);
                (name(&in_store), platform.clone())
            });
            let line = copy_images(&client, &store, stored.collect(), &target, args.jobs)
                .await
                .with_context(|| {
                    format!("copying the store's {} images to {target}", name(runtime))
                })
                .map_err(Failure::Build)?;
            lines.push(line);
        }
    }
    if let Some(repo) = &plan.cache_repo {
        let client = &client;
        let warmed: Vec<_> = stream::iter(functions.iter().map(|(label, opts)| async move {
            (label, build::warm_deps(client, opts, repo).await)
        }))
        .buffered(usize::from(args.parallel))
        .collect()
        .await;
        let mut failed = Vec::new();
        for (label, outcome) in warmed {
            match outcome {
                Ok(Warmed::NoDependencies) => lines.push(format!("none no-dependencies {label}")),
                Ok(Warmed::Present { entry, .. }) => lines.push(format!("{entry} present {label}")),
                Ok(Warmed::Stored { entry, .. }) => lines.push(format!("{entry} stored {label}")),
                Err(e) => failed.push(format!("{label}: {:#}", anyhow::Error::new(e))),
            }
        }
        if !failed.is_empty() {
            for line in &lines {
                tracing::info!("{line}");
            }
            return Err(Failure::Build(anyhow!(
                "warming {} of {} Functions failed:\n  {}",
                failed.len(),
                functions.len(),
                failed.join("\n  ")
            )));
        }
    }
    Ok(lines.join("\n"))
}

/// Copies the store's images (each `(name, platform)`) to `target`: one image at the tag, or
/// several by digest and an image index over them at the tag. Unless the tag already names
/// it: one `HEAD` then. Returns the line to print.
async fn copy_images(
    client: &Client,
    store: &std::path::Path,
    images: Vec<(String, Platform)>,
    target: &Reference,
    jobs: u16,
) -> anyhow::Result<String> {
    let jobs = usize::from(jobs);
    if let [(name, platform)] = images.as_slice() {
        return Ok(copy_image(client, store, name, platform, target, jobs)
            .await?
            .0);
    }
    let mut manifests = Vec::new();
    for (name, platform) in &images {
        let by_digest = target.repository_only();
        let (_, mut descriptor) =
            copy_image(client, store, name, platform, &by_digest, jobs).await?;
        descriptor.platform = Some(platform.clone());
        manifests.push(descriptor);
    }
    let index = crate::oci::Index {
        schema_version: 2,
        media_type: Some(crate::oci::MediaType::OciIndex),
        manifests,
        annotations: None,
    };
    let doc = crate::oci::Document::new(
        crate::oci::MediaType::OciIndex,
        crate::oci::canonical::to_vec(&index)?,
    );
    let printed = format!("{}@{}", target, doc.digest);
    if let Some(found) = client.head_manifest(target).await?
        && found.digest == doc.digest
    {
        let digest = &doc.digest;
        tracing::info!(image = %target, %digest, "the registry holds this index already");
        return Ok(format!("{printed} unchanged"));
    }
    client
        .put_manifest(target, &doc)
        .await
        .with_context(|| format!("pushing the image index to {target}"))?;
    tracing::info!(image = %target, digest = %doc.digest, "pushed the image index");
    Ok(format!("{printed} pushed"))
}

/// Copies the store's image `name` (for `platform`) to `target` unless the tag (or, for a
/// target without one, the digest) already names it: one `HEAD` then, else the blobs the
/// repository lacks and the manifest. Returns the line to print and the manifest's
/// descriptor.
async fn copy_image(
    client: &Client,
    store: &std::path::Path,
    name: &str,
    platform: &Platform,
    target: &Reference,
    jobs: usize,
) -> anyhow::Result<(String, crate::oci::Descriptor)> {
    let base = BaseRef::Layout {
        dir: store.to_path_buf(),
        name: Some(name.to_string()),
    };
    let label = format!("oci:{}:{name}", store.display());
    let resolved = resolve(client, &base, &label, platform).await?;
    let digest = resolved.base.manifest.digest.clone();
    let descriptor = resolved.base.manifest.descriptor();
    let printed = format!("{}@{digest}", target);
    let pinned = match target.tag {
        Some(_) => target.clone(),
        None => target.with_digest(digest.clone()),
    };
    if let Some(found) = client.head_manifest(&pinned).await?
        && found.digest == digest
    {
        tracing::info!(image = %target, %digest, "the registry holds this image already");
        return Ok((format!("{printed} unchanged"), descriptor));
    }
    let manifest = resolved.base.parse_manifest()?;
    let image = Image {
        manifest: resolved.base.manifest.clone(),
        config: resolved.base.config.clone(),
        layers: manifest.layers.clone(),
    };
    let layers: Vec<BlobPlan> = manifest
        .layers
        .iter()
        .map(|d| BlobPlan {
            descriptor: d.clone(),
            role: Role::Base,
            local: None,
            remote: None,
        })
        .collect();
    let scratch = tempfile::tempdir()?;
    let publisher = RegistryPublisher {
        client: client.clone(),
        target: target.clone(),
        key_tag: None,
        pushed: None,
        jobs,
    };
    let published = publisher
        .publish(PublishInput {
            image: &image,
            layers: &layers,
            base: Some(&resolved),
            scratch: scratch.path(),
        })
        .await?;
    let sent: u64 = published.blobs.iter().map(|b| b.bytes_sent).sum();
    tracing::info!(image = %target, %digest, bytes_sent = sent, "pushed the image");
    Ok((format!("{printed} pushed"), descriptor))
}
