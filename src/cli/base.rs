//! `kiln base lock|build`: pin a runtime's base-image inputs, and assemble its base and
//! builder images from the pins.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};

use super::Failure;
use super::registry::RegistryArgs;
use crate::base::assemble::{self, Sources};
use crate::base::{debian, recipe, store};
use crate::image::publish::{PublishInput, Publisher, RegistryPublisher};
use crate::oci::{Descriptor, Document, MediaType, Platform};
use crate::registry::{Client, Reference};

mod platforms;
use platforms::{base_platforms, kiln_binary};

/// `kiln base` subcommands.
#[derive(Debug, Subcommand)]
pub enum BaseCommand {
    /// Resolve a runtime's recipe (base-images/RUNTIME/recipe.toml) against the Debian
    /// mirror (signature-verified) and the npm registry, and write the lock file.
    Lock(Box<LockArgs>),
    /// Assemble a runtime's base and builder images (and the kiln image) from its lock
    /// file, reproducibly.
    Build(Box<BuildBaseArgs>),
}

/// Where packages come from.
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Debian mirror root [default: the Debian mirror in the machine's apt sources].
    #[arg(long, env = "KILN_DEBIAN_MIRROR", value_name = "URL")]
    pub debian_mirror: Option<url::Url>,
    /// Keyring that signs the mirror's InRelease files.
    #[arg(long, value_name = "FILE", default_value = debian::DEBIAN_ARCHIVE_KEYRING)]
    pub keyring: PathBuf,
    /// npm registry [default: $npm_config_registry, else npm's configured registry].
    #[arg(long, env = "KILN_NPM_REGISTRY", value_name = "URL")]
    pub npm_registry: Option<url::Url>,
    /// Download cache [default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln].
    #[arg(long, env = "KILN_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// Flags of `kiln base lock`.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// The runtime (nodejs22, nodejs24, nodejs26, python313, python314).
    pub runtime: String,
    /// Where to write the lock [default: base-images/RUNTIME/lock.toml].
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// Lock from the mirror's InRelease even when its Valid-Until has passed (its signature is
    /// still checked). A stale Release may lack security fixes: use it only when no current
    /// mirror can be had, as for a testing suite (python314) on a mirror that lags.
    #[arg(long)]
    pub allow_expired_release: bool,
    /// Package sources.
    #[command(flatten)]
    pub sources: SourceArgs,
}

/// Flags of `kiln base build`.
#[derive(Debug, Args)]
pub struct BuildBaseArgs {
    /// The runtime (nodejs22, nodejs24, nodejs26, python313, python314).
    pub runtime: String,
    /// Push the base image here.
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Push the builder image here.
    #[arg(long, value_name = "REF", requires = "image")]
    pub builder_image: Option<String>,
    /// Push the kiln image here: the image deploy/ runs `kiln controller` and `kiln webhook`
    /// from (the runtime's Debian layer and --kiln-binary, as user 65532), the same as the
    /// Dockerfile builds, for machines without Docker.
    #[arg(long, value_name = "REF", requires = "image")]
    pub kiln_image: Option<String>,
    /// Write both images into an OCI layout, named RUNTIME and RUNTIME-builder.
    #[arg(long, value_name = "oci:DIR", conflicts_with = "image")]
    pub output: Option<String>,
    /// Use this lock file instead of the one compiled into kiln.
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// The platform to build the images for: linux/amd64 or linux/arm64 (the lock has both),
    /// or both, comma-separated: each platform's images are then named RUNTIME-linux-ARCH
    /// (in a layout; pushed by digest to a registry) and an OCI image index over them takes
    /// the plain name or the tag.
    #[arg(long, value_name = "OS/ARCH[,…]", default_value = "linux/amd64")]
    pub platform: String,
    /// The kiln executable to put into the builder image at /usr/local/bin/kiln (for example a
    /// release build for the --platform). Once per platform: each goes into the builder of the
    /// platform it is built for [default: this kiln, on its own platform; none on another,
    /// and that builder then serves sandboxed installs but not build Jobs].
    #[arg(long, value_name = "PATH")]
    pub kiln_binary: Vec<PathBuf>,
    /// Registry access.
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Package sources.
    #[command(flatten)]
    pub sources: SourceArgs,
}

pub(super) async fn run(cmd: BaseCommand) -> Result<String, Failure> {
    match cmd {
        BaseCommand::Lock(args) => lock(*args).await,
        BaseCommand::Build(args) => build(*args).await,
    }
}

pub(super) fn sources(args: &SourceArgs) -> anyhow::Result<Sources> {
    let mirror = match &args.debian_mirror {
        Some(url) => url.clone(),
        None => debian::system_mirror_url().ok_or_else(|| {
            anyhow!("no Debian mirror in the apt sources; pass --debian-mirror URL")
        })?,
    };
    let npm_registry = match &args.npm_registry {
        Some(url) => url.clone(),
        None => npm_registry().context("finding the npm registry; pass --npm-registry URL")?,
    };
    let cache_dir = super::cache_dir(args.cache_dir.as_deref())?;
    let http = crate::fetch::download::client_builder().build()?;
    Ok(Sources {
        http,
        mirror,
        npm_registry,
        keyring: args.keyring.clone(),
        cache_dir,
        allow_expired_release: false,
    })
}

/// The registry npm itself is configured to use.
fn npm_registry() -> anyhow::Result<url::Url> {
    if let Ok(url) = std::env::var("npm_config_registry")
        && !url.is_empty()
    {
        return Ok(url.parse()?);
    }
    let out = std::process::Command::new("npm")
        .args(["config", "get", "registry"])
        .output()
        .context("running `npm config get registry`")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .with_context(|| format!("npm's registry {text:?} is not a URL"))
}

async fn lock(args: LockArgs) -> Result<String, Failure> {
    let (recipe, _) = recipe::embedded(&args.runtime).map_err(|e| Failure::Usage(e.into()))?;
    let mut src = sources(&args.sources).map_err(Failure::Usage)?;
    src.allow_expired_release = args.allow_expired_release;
    let lock = assemble::lock(&src, &recipe)
        .await
        .map_err(|e| Failure::Build(e.into()))?;
    let path = args
        .lock
        .unwrap_or_else(|| PathBuf::from(format!("base-images/{}/lock.toml", args.runtime)));
    let text = lock.to_toml().map_err(|e| Failure::Build(e.into()))?;
    std::fs::write(&path, text)
        .with_context(|| format!("writing {}", path.display()))
        .map_err(Failure::Build)?;
    Ok(path.display().to_string())
}

async fn build(args: BuildBaseArgs) -> Result<String, Failure> {
    let (recipe, embedded_lock) =
        recipe::embedded(&args.runtime).map_err(|e| Failure::Usage(e.into()))?;
    let lock = match &args.lock {
        None => embedded_lock,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))
                .map_err(Failure::Usage)?;
            recipe::parse_lock(&args.runtime, &text).map_err(|e| Failure::Usage(e.into()))?
        }
    };
    if lock.first.debian.is_empty() {
        return Err(Failure::Usage(anyhow!(
            "the lock for {} is empty: run `kiln base lock {}` first",
            args.runtime,
            args.runtime
        )));
    }
    let src = sources(&args.sources).map_err(Failure::Usage)?;
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if !v.is_empty() => v
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?}"))
            .map_err(Failure::Usage)?,
        _ => 0,
    };
    let platforms = base_platforms(&args).map_err(Failure::Usage)?;
    // Checked before the assembly, which takes a while.
    let destination = destination(&args).map_err(Failure::Usage)?;
    let client = Client::new(args.registry.client_config().map_err(Failure::Usage)?)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    let scratch = src.cache_dir.join("tmp");
    let several = platforms.len() > 1;
    // Per image (base, builder, kiln): each platform's manifest, for an index over them.
    let mut written: [Vec<Descriptor>; 3] = Default::default();
    let mut lines = Vec::new();
    for platform in &platforms {
        let kiln = kiln_binary(&args, platform)?;
        let built = assemble::assemble(
            &src,
            &recipe,
            &lock,
            &platform.architecture,
            epoch,
            kiln.as_deref(),
        )
        .await
        .map_err(|e| Failure::Build(e.into()))?;
        let images = [Some(&built.base), Some(&built.builder), built.kiln.as_ref()];
        match &destination {
            Destination::Layout(dir) => {
                // Several platforms: each under a name of its own, the index under the plain one.
                let name = match several {
                    true => format!("{}-{}-{}", args.runtime, platform.os, platform.architecture),
                    false => args.runtime.clone(),
                };
                let refs = store::write_layout(&built, &client, dir, &name, &scratch)
                    .await
                    .map_err(|e| Failure::Build(e.into()))?;
                let host = platform.architecture == Platform::host().architecture;
                // Exactly what a first build assembles into the store: the layout can be one.
                if !several
                    && args.lock.is_none()
                    && epoch == 0
                    && args.kiln_binary.is_empty()
                    && host
                {
                    store::mark_assembled(dir, &args.runtime)
                        .with_context(|| format!("writing into {}", dir.display()))
                        .map_err(Failure::Build)?;
                }
                for (i, assembly) in images.iter().take(2).enumerate() {
                    written[i].extend(assembly.map(|a| a.image.manifest.descriptor()));
                }
                if !several {
                    lines.extend(refs);
                }
            }
            Destination::Registry {
                base,
                builder,
                kiln,
            } => {
                let targets = [Some(base.as_ref()), builder.as_ref(), kiln.as_ref()];
                for (i, (assembly, target)) in images.into_iter().zip(targets).enumerate() {
                    // No kiln image without a kiln binary (refused above when one was asked for).
                    let (Some(assembly), Some(target)) = (assembly, target) else {
                        continue;
                    };
                    let target = match several {
                        true => target.repository_only(),
                        false => target.clone(),
                    };
                    let input = PublishInput {
                        image: &assembly.image,
                        layers: &assembly.layers,
                        base: None,
                        scratch: &scratch,
                    };
                    let publisher = RegistryPublisher {
                        client: client.clone(),
                        target,
                        key_tag: None,
                        pushed: None,
                        jobs: 4,
                    };
                    let published = publisher.publish(input).await;
                    let published = published.map_err(|e| Failure::Build(e.into()))?;
                    written[i].push(assembly.image.manifest.descriptor());
                    if !several {
                        lines.push(published.reference);
                    }
                }
            }
        }
    }
    if several {
        lines = write_indexes(&client, &destination, &args.runtime, &platforms, written)
            .await
            .map_err(Failure::Build)?;
    }
    Ok(lines.join("\n"))
}

/// The base's and the builder's image indexes over each platform's manifest in `written`, at
/// the layout's plain names or the registry targets; their references.
async fn write_indexes(
    client: &Client,
    destination: &Destination,
    runtime: &str,
    platforms: &[Platform],
    written: [Vec<Descriptor>; 3],
) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    let [base, builder, _] = written;
    let names = [runtime.to_string(), store::builder_name(runtime)];
    for (i, manifests) in [base, builder].into_iter().enumerate() {
        if manifests.is_empty() {
            continue;
        }
        let manifests = manifests
            .into_iter()
            .zip(platforms)
            .map(|(mut d, p)| {
                d.platform = Some(p.clone());
                d
            })
            .collect();
        let index = crate::oci::Index {
            schema_version: 2,
            media_type: Some(MediaType::OciIndex),
            manifests,
            annotations: None,
        };
        let doc = Document::new(MediaType::OciIndex, crate::oci::canonical::to_vec(&index)?);
        match destination {
            Destination::Layout(dir) => {
                let layout = crate::oci::Layout::open(dir)?;
                layout.write_blob(&doc.bytes)?;
                layout.set_ref(doc.descriptor(), &names[i])?;
                lines.push(format!("oci:{}@{}", dir.display(), doc.digest));
            }
            Destination::Registry { base, builder, .. } => {
                let Some(target) = [Some(base.as_ref()), builder.as_ref()][i] else {
                    continue;
                };
                client
                    .put_manifest(target, &doc)
                    .await
                    .with_context(|| format!("pushing the image index to {target}"))?;
                lines.push(format!("{}@{}", target.repository_path(), doc.digest));
            }
        }
    }
    Ok(lines)
}

/// Where `kiln base build` writes its images.
enum Destination {
    /// Both into this layout.
    Layout(PathBuf),
    /// The base here, the builder and the kiln image there when named.
    Registry {
        base: Box<Reference>,
        builder: Option<Reference>,
        kiln: Option<Reference>,
    },
}

fn destination(args: &BuildBaseArgs) -> anyhow::Result<Destination> {
    let parse = |image: &String| -> anyhow::Result<Reference> {
        image
            .parse()
            .with_context(|| format!("invalid image {image:?}"))
    };
    match (&args.output, &args.image) {
        (Some(output), _) => {
            let dir = output.strip_prefix("oci:").ok_or_else(|| {
                anyhow!(
                    "--output must start with oci:, e.g. --output oci:./bases; to push to a \
                            registry, use --image REF"
                )
            })?;
            Ok(Destination::Layout(dir.into()))
        }
        (None, Some(image)) => Ok(Destination::Registry {
            base: Box::new(parse(image)?),
            builder: args.builder_image.as_ref().map(parse).transpose()?,
            kiln: args.kiln_image.as_ref().map(parse).transpose()?,
        }),
        (None, None) => Err(anyhow!(
            "say where the images go: --output oci:DIR or --image REF"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    pub(super) fn parse(args: &[&str]) -> BuildBaseArgs {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: BuildBaseArgs,
        }
        <Wrapper as clap::Parser>::try_parse_from(["kiln", "nodejs22"].iter().chain(args))
            .unwrap()
            .args
    }

    fn destination_of(args: &[&str]) -> anyhow::Result<Destination> {
        destination(&parse(args))
    }

    #[test]
    fn where_the_images_go_is_checked_before_anything_is_assembled() {
        let err = destination_of(&[]).err().unwrap().to_string();
        assert!(err.contains("--output oci:DIR or --image REF"), "{err}");
        let err = destination_of(&["--output", "./bases"]).err().unwrap();
        assert!(err.to_string().contains("must start with oci:"), "{err}");
        let err = destination_of(&["--image", "Not A Ref"]).err().unwrap();
        assert!(err.to_string().contains("invalid image"), "{err}");
        match destination_of(&["--output", "oci:./bases"]).unwrap() {
            Destination::Layout(dir) => assert_eq!(dir, PathBuf::from("./bases")),
            Destination::Registry { .. } => panic!("a layout"),
        }
        let both = [
            "--image",
            "r.example/b:1",
            "--builder-image",
            "r.example/bb:1",
        ];
        match destination_of(&both).unwrap() {
            Destination::Registry { base, builder, .. } => {
                assert_eq!(base.to_string(), "r.example/b:1");
                assert_eq!(builder.unwrap().to_string(), "r.example/bb:1");
            }
            Destination::Layout(_) => panic!("a registry"),
        }
    }
}
