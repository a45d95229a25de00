//! `kiln build`: the run, on its flags (args.rs) validated into [`crate::build::Options`]
//! (validate.rs).

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::{Context, anyhow};

use super::Failure;
use super::git::GitArgs;
use super::install::{ensure_store, isolation, needs_store};
use super::report::{Extra, write_deps_report, write_outputs};
use crate::build::{self, FunctionSpec, Options, Stage, deps::Isolation};
use crate::progress::{bytes, steps};
use crate::registry::Client;

mod args;
mod platforms;
mod validate;
pub use args::{BuildArgs, CacheKeyArgs, CompressionArg, LockfileInstallArg, StageArg};
use validate::validate;

/// The values `kiln build` takes from the environment, read once here.
struct Env {
    source_date_epoch: Option<String>,
    path: OsString,
    ssl_cert_file: Option<PathBuf>,
    /// `KILN_BUILDER`: set in builder images to their runtime's name.
    in_builder: Option<String>,
    proxy: Vec<(String, String)>,
}

impl Env {
    fn read() -> Env {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let proxy = [
            "http_proxy",
            "https_proxy",
            "no_proxy",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "NO_PROXY",
        ]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
        Env {
            source_date_epoch: std::env::var("SOURCE_DATE_EPOCH")
                .ok()
                .filter(|v| !v.is_empty()),
            path: var("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
            ssl_cert_file: var("SSL_CERT_FILE").map(PathBuf::from),
            in_builder: std::env::var("KILN_BUILDER").ok().filter(|v| !v.is_empty()),
            proxy,
        }
    }
}

pub(super) async fn run(args: BuildArgs) -> Result<String, Failure> {
    let prune_to = args
        .cache_max_size
        .zip(super::cache_dir(args.cache_dir.as_deref()).ok());
    let result = run_build(args).await;
    if let Some((max, cache_dir)) = prune_to {
        let opts = crate::prune::Options {
            cache_dir,
            older_than: None,
            max_size: Some(max),
            dry_run: false,
        };
        let pruned = tokio::task::spawn_blocking(move || crate::prune::prune(&opts)).await;
        match pruned {
            Ok(Ok(report)) => {
                tracing::info!(
                    removed = report.removed.len(),
                    in_use = report.in_use.len(),
                    before = report.before,
                    after = report.after,
                    "pruned the cache (--cache-max-size)"
                );
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "pruning the cache (--cache-max-size) failed"),
            Err(e) => tracing::warn!(error = %e, "pruning the cache (--cache-max-size) failed"),
        }
    }
    result
}

async fn run_build(args: BuildArgs) -> Result<String, Failure> {
    let termination_log = args.termination_log.clone();
    let outcome = build(args).await;
    match termination_log {
        Some(path) => super::termination::write(&path, outcome),
        None => outcome,
    }
}

async fn build(args: BuildArgs) -> Result<String, Failure> {
    let started = crate::provenance::now();
    let began = std::time::Instant::now();
    let env = Env::read();
    let (mut opts, config, extra) = validate(&args, &env).map_err(Failure::Usage)?;
    let sign_key = match (&args.sign_key, &opts.target) {
        (None, _) => None,
        (Some(spec), build::Target::Registry(_)) => Some(
            super::verify::read_key(spec, "--sign-key", crate::cosign::SignKey::from_pem)
                .map_err(Failure::Usage)?,
        ),
        (Some(_), build::Target::Layout { .. }) => {
            return Err(Failure::Usage(anyhow!(
                "--sign-key stores the signature in the image's registry: name a registry \
                 target with --image, or sign after pushing the layout"
            )));
        }
    };
    if let (Stage::Source(dir), FunctionSpec::Git { source, access }) =
        (&opts.stage, &opts.function)
    {
        return build::run_source(&opts, source, access, dir)
            .await
            .map_err(build_failure);
    }
    let client = prepare(&args, &env, &mut opts, config, extra.store.as_deref()).await?;
    if extra.platforms.len() > 1 && matches!(opts.stage, Stage::Lookup(_) | Stage::Deps(_)) {
        return platforms::stage_several(&client, &opts, &extra).await;
    }
    if let Stage::Lookup(dir) = &opts.stage {
        let lookup = build::run_lookup(&client, &opts, dir)
            .await
            .map_err(build_failure)?;
        return Ok(lookup_line(&lookup));
    }
    if let Stage::Deps(dir) = &opts.stage {
        let output = build::run_deps(&client, &opts, dir)
            .await
            .map_err(build_failure)?;
        write_deps_report(&extra, &output).map_err(Failure::Build)?;
        return Ok(deps_line(&output));
    }
    opts.signing = sign_key.map(|key| build::Signing {
        key: std::sync::Arc::new(key),
        external: external_parameters(&opts),
        started,
    });
    if extra.platforms.len() > 1 {
        let index = platforms::build_several(&client, &opts, &extra).await?;
        steps::summary(&[
            ("index", shortened(&index)),
            ("images", extra.platforms.len().to_string()),
            ("sent", bytes(client.traffic().bytes_sent)),
            ("time", steps::duration(began.elapsed())),
        ]);
        return Ok(index);
    }
    let output = build::run(&client, &opts).await.map_err(build_failure)?;
    // An unchanged build made no image here: it was checked when it was built.
    if extra.verify
        && let Some(image) = &output.image
    {
        crate::oci::validate::check_image(&image.manifest, &image.config)
            .context("verifying the built image")
            .map_err(Failure::Build)?;
    }
    if let Some(attached) = &output.attached {
        let (what, at) = match &attached.signature {
            crate::cosign::Signed::Pushed(at) => ("signed the image", at),
            crate::cosign::Signed::Present(at) => ("the image is already signed by this key", at),
        };
        let key = opts.signing.as_ref().map(|s| s.key.public().id());
        tracing::info!(key = key.unwrap_or_default(), signatures = %at, "{what}");
        if let Some(at) = &attached.provenance {
            tracing::info!(attestations = %at, "attached the SLSA provenance");
        }
    }
    write_outputs(&extra, &opts.stage, &output, client.traffic()).map_err(Failure::Build)?;
    summary(&output, began);
    Ok(output.published.reference)
}

/// The human view's last lines, below the steps: the reference (its digest shortened: the
/// whole one is on stdout), the image's size and its layers new or reused, the bytes
/// uploaded (or written to a layout) and the time; with -v the build key.
fn summary(output: &build::Output, began: std::time::Instant) {
    use crate::image::publish::{Outcome, Role};
    if !steps::enabled() {
        return;
    }
    let mut rows = vec![("image", shortened(&output.published.reference))];
    if let Some(image) = &output.image {
        let size =
            image.layers.iter().map(|l| l.size).sum::<u64>() + image.config.bytes.len() as u64;
        let new = output
            .published
            .blobs
            .iter()
            .filter(|b| !matches!(b.role, Role::Config | Role::Manifest))
            .filter(|b| matches!(b.outcome, Outcome::Uploaded | Outcome::Written))
            .count();
        let layers = image.layers.len();
        let reused = layers.saturating_sub(new);
        rows.push((
            "size",
            format!(
                "{}, {layers} layers: {new} new, {reused} reused",
                bytes(size)
            ),
        ));
    } else if output.unchanged {
        rows.push((
            "size",
            "unchanged: the target already holds this build".into(),
        ));
    }
    let sent: u64 = output.published.blobs.iter().map(|b| b.bytes_sent).sum();
    let layout = output.published.reference.starts_with("oci:");
    rows.push((if layout { "written" } else { "sent" }, bytes(sent)));
    rows.push(("time", steps::duration(began.elapsed())));
    if steps::verbose() {
        rows.push(("key", output.image_key.to_string()));
    }
    steps::summary(&rows);
}

/// `reference` with its digest shortened (see [`steps::short_digest`]).
fn shortened(reference: &str) -> String {
    match reference.rsplit_once('@') {
        Some((name, digest)) => format!("{name}@{}", steps::short_digest(&digest)),
        None => reference.to_string(),
    }
}

/// The registry client, and the builder image and install isolation `opts` builds with; the
/// runtime's own base and builder images are assembled into the local `store` first when the
/// build uses them.
async fn prepare(
    args: &BuildArgs,
    env: &Env,
    opts: &mut Options,
    mut config: crate::registry::ClientConfig,
    store: Option<&std::path::Path>,
) -> Result<Client, Failure> {
    // Manifests and configs by digest (a base or builder named by tag is then one HEAD), and
    // what each registry refuses.
    config.cache_dir = Some(opts.cache_dir.clone());
    let client = Client::new(config)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    let publish = matches!(opts.stage, Stage::Publish(_));
    let mut builder = args.builder_image.clone();
    if let Some(store) = store {
        if publish {
            // Assembling the runtime's images runs npm: publish runs no program.
            if !crate::base::store::has_images(store, &opts.runtime.name) {
                return Err(Failure::Usage(anyhow!(
                    "--stage publish runs no program, so it cannot assemble the {runtime} \
                        runtime's base image into {}: pass --base REF, or run `kiln base build \
                        {runtime}` (or a whole build) first",
                    store.display(),
                    runtime = opts.runtime.name
                )));
            }
        } else if needs_store(
            args.deps_sandbox,
            env.in_builder.as_deref(),
            &opts.runtime.name,
            &opts.stage,
        ) {
            ensure_store(&opts.runtime.name, &opts.cache_dir, store)
                .await
                .map_err(Failure::Build)?;
        }
        // The runtime's own base: install in its own builder unless told otherwise.
        builder = builder.or_else(|| {
            Some(format!(
                "oci:{}:{}",
                store.display(),
                crate::base::store::builder_name(&opts.runtime.name)
            ))
        });
    }
    opts.install.isolation = if publish {
        // Never used: publish installs nothing.
        Isolation::Host
    } else {
        isolation(
            args.deps_sandbox,
            builder.as_deref(),
            env.in_builder.as_deref(),
            &opts.runtime.name,
        )
        .map_err(Failure::Usage)?
    };
    Ok(client)
}

/// `kiln dev`'s build: the options and client `kiln build ARGS` would run with (one platform,
/// the whole build), made ready as [`build`] makes them.
pub(super) async fn for_dev(args: &BuildArgs) -> Result<(Client, Options), Failure> {
    let env = Env::read();
    let (mut opts, config, extra) = validate(args, &env).map_err(Failure::Usage)?;
    let client = prepare(args, &env, &mut opts, config, extra.store.as_deref()).await?;
    Ok((client, opts))
}

/// What `--stage lookup` prints: `none` (nothing to install), `miss`, or the cached layer's
/// digest.
fn lookup_line(lookup: &build::stage::Lookup) -> String {
    match (&lookup.key, &lookup.found) {
        (None, _) => "none".into(),
        (Some(_), None) => "miss".into(),
        (Some(_), Some(found)) => found.digest.to_string(),
    }
}

/// What `--stage deps` prints: the staged layer's digest, or `none`.
fn deps_line(output: &build::DepsOutput) -> String {
    output
        .record
        .dependencies
        .as_ref()
        .map_or_else(|| "none".to_string(), |l| l.digest.to_string())
}

/// `kiln build FLAGS`'s flags, for the commands that run a build of their own (`kiln warm`,
/// `kiln dev`).
pub(super) fn parse_flags(
    flags: impl IntoIterator<Item = OsString>,
) -> Result<BuildArgs, clap::Error> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        args: BuildArgs,
    }
    let line = std::iter::once(OsString::from("build")).chain(flags);
    Ok(<Flags as clap::Parser>::try_parse_from(line)?.args)
}

/// `kiln warm`'s view of a Function: the options `kiln build FLAGS` (no `--base`) has, with
/// the dependencies installed in the runtime's own builder image from the local store
/// (which the caller has made sure of), so the dependency key is the one such a build
/// computes.
pub(super) fn warm_options(flags: &[OsString]) -> anyhow::Result<Options> {
    let args = parse_flags(flags.iter().cloned())?;
    let env = Env::read();
    let (mut opts, _, extra) = validate(&args, &env)?;
    let store = extra.store.ok_or_else(|| {
        anyhow!(
            "the Function overrides the base image (spec.runtimeImageOverride or KILN_BASE): \
                    kiln warm prepares builds on the runtime's own base images only"
        )
    })?;
    let builder = format!(
        "oci:{}:{}",
        store.display(),
        crate::base::store::builder_name(&opts.runtime.name)
    );
    opts.install.isolation = isolation(
        args.deps_sandbox,
        Some(&builder),
        env.in_builder.as_deref(),
        &opts.runtime.name,
    )?;
    Ok(opts)
}

/// `--cache-repo`: a repository, without tag or digest (kiln names the entries).
pub(super) fn cache_repo(s: &str) -> anyhow::Result<crate::registry::Reference> {
    let reference: crate::registry::Reference = s
        .parse()
        .with_context(|| format!("invalid --cache-repo {s:?}"))?;
    if reference.tag.is_some() || reference.digest.is_some() {
        return Err(anyhow!(
            "--cache-repo {s:?}: name a repository without a tag or digest (kiln tags each entry \
                deps-KEY), e.g. {}",
            reference.repository_path()
        ));
    }
    Ok(reference)
}

fn build_failure(e: build::Error) -> Failure {
    let input = e.is_input_error();
    let e = anyhow::Error::new(e);
    if input {
        Failure::Usage(e)
    } else {
        Failure::Build(e)
    }
}

/// The flags that change the image, for the provenance's `externalParameters`.
fn external_parameters(opts: &Options) -> serde_json::Value {
    let source = match &opts.function {
        FunctionSpec::Dir(_) => serde_json::json!({"kind": "directory"}),
        FunctionSpec::Manifest(m) => serde_json::json!({"kind": "manifest", "name": m.name}),
        FunctionSpec::Git { source, .. } => serde_json::json!({
            "kind": "git",
            "url": source.url.to_string(),
            "reference": source.reference.to_string(),
            "baseDir": source.base_dir.to_string(),
        }),
    };
    // The reference pushed to, tag included: a controller's build key is its tag.
    let image = match &opts.target {
        build::Target::Registry(r) => Some(r.to_string()),
        build::Target::Layout { .. } => None,
    };
    serde_json::json!({
        "image": image,
        "source": source,
        "runtime": opts.runtime.name,
        "name": opts.name,
        "namespace": opts.namespace,
        "base": opts.base_name,
        "platform": opts.platform.to_string(),
        "sourceDateEpoch": opts.epoch,
        "compression": opts.compression,
        "lockfileInstall": opts.lockfile_install,
    })
}
