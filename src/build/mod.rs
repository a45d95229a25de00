//! Building a Function image: the only module that uses `oci`, `registry` and `runtime`
//! together. [`run`] checks the Function, resolves the base, installs dependencies (or takes
//! the layer from the cache, or from a `--stage deps` run), writes the source layer, appends
//! both to the base and publishes; [`run_deps`] is a split build's first half.

mod assemble;
pub mod cache;
pub mod deps;
pub mod egress;
mod error;
pub mod existing;
pub mod function;
mod install;
mod install_output;
mod load;
pub mod lockfile;
pub mod mask;
pub mod memtree;
mod options;
pub(crate) mod pep440;
pub mod pinned;
pub mod plan;
pub mod remote_cache;
pub(crate) mod sbom;
mod split;
pub mod stage;
mod warm;

use std::path::Path;

use tracing::Instrument;

use crate::image::publish::Role;
use crate::image::resolve::ResolvedBase;
use crate::image::{publish, pushed, resolve};
use crate::oci::Digest;
use crate::progress::steps::{self, Step};
use crate::registry::{Client, Reference};
use assemble::DepLayer;
use cache::LayerCache;
pub use error::Error;
use function::Function;
pub use load::run_source;
pub use options::{
    DepsOutput, FunctionSpec, Inputs, Options, Output, Signing, Stage, Target,
    dependency_media_type,
};
use publish::Published;
pub use split::run_lookup;
use split::{lookup_hit, staged_layer};
pub use warm::{Warmed, warm_deps};

/// Builds and publishes the image described by `opts` (`--stage all`, or `--stage publish`
/// with the dependency layer from a stage directory).
///
/// # Errors
/// See [`Error`]; nothing is published unless every step before succeeded, and the manifest
/// goes last.
pub async fn run(client: &Client, opts: &Options) -> Result<Output, Error> {
    let span = tracing::info_span!("build", function = %opts.name, runtime = %opts.runtime.name);
    async move {
        let cache = cache::open_cache(&opts.cache_dir)?;
        let loaded = load::load(opts, &cache.tmp_dir()).await?;
        let function = &loaded.function;
        tracing::info!(files = function.tree.file_count(), "collected source");
        let mut planned = function
            .deps
            .as_ref()
            .map(|inputs| install::lockfile_plan(opts, inputs));
        let history = planned.as_ref().and_then(install::history);
        let (deps, mut store_in) =
            staged_or_checked(client, opts, &cache, function, history, planned.as_ref()).await?;
        opts.authorize_up_front(client).await?;
        let step = Step::start("resolve base");
        let base = resolve::resolve(client, &opts.base, &opts.base_name, &opts.platform).await?;
        step.done(format_args!(
            "{}@{}",
            opts.base_name,
            steps::short_digest(&base.base.manifest.digest)
        ));
        tracing::info!(
            base = %opts.base_name,
            digest = %base.base.manifest.digest,
            "resolved base image",
        );
        // The dependency key, not the layer: enough for the image key. `--stage publish`
        // installs nothing: its layer is the staged one, or none.
        let dep_key = match (
            &deps,
            function.deps.as_ref().zip(planned.take()),
            &opts.stage,
        ) {
            (None, Some((inputs, planned)), Stage::All | Stage::Deps(_) | Stage::Lookup(_)) => {
                Some(install::dependency_key(client, opts, &cache, inputs, planned).await?)
            }
            _ => None,
        };
        let layer_type =
            base.base
                .family()
                .layer(opts.compression)
                .ok_or_else(|| Error::NoZstd {
                    base: opts.base_name.clone(),
                })?;
        let step = Step::start("source layer");
        let source = assemble::source_layer(opts, &cache, function, layer_type).await?;
        step.done(format_args!(
            "{} files, {}",
            function.tree.file_count(),
            crate::progress::bytes(source.descriptor.size)
        ));
        let keyed = deps
            .as_ref()
            .map(|d| (&d.key, d.toolchain.as_deref()))
            .or(dep_key
                .as_ref()
                .map(|k| (&k.key, Some(k.toolchain.as_str()))));
        let planned = assemble::plan(opts, function, &base, keyed, &source);
        let inputs = inputs(
            opts,
            function,
            &base,
            keyed.map(|(key, _)| key),
            &source,
            loaded.commit.as_deref(),
        );
        // `--no-cache` rebuilds: no existing image is taken either.
        let step = Step::start("existing image");
        if opts.use_cache
            && let Some(found) =
                existing::find(client, &opts.target, opts.tag_by_key, &planned.image_key).await?
        {
            step.done("unchanged: the target holds this build");
            let mut output = unchanged(found, planned.image_key, loaded.commit, inputs);
            let layers = match opts.signing {
                Some(_) => own_layers(client, opts, &base, &output.published.digest).await?,
                None => Vec::new(),
            };
            let prepared =
                prepare_attachments(client, opts, &output, &base, &layers, false).await?;
            output.attached = push_attachments(client, &output, prepared).await?;
            return Ok(output);
        }
        drop(step);
        let deps = match (deps, &function.deps, dep_key) {
            (Some(staged), _, _) => Some(staged),
            (None, Some(inputs), Some(dep_key)) => {
                let (layer, store) =
                    installed_layer(client, opts, &cache, function, inputs, dep_key, history)
                        .await?;
                store_in = store;
                Some(layer)
            }
            (None, _, _) => None,
        };
        let image_key = planned.image_key.clone();
        let assembled = assemble::assemble(&base, deps.as_ref(), source, planned)?;
        let mut output = Output {
            published: Published {
                reference: String::new(),
                digest: assembled.image.manifest.digest.clone(),
                blobs: Vec::new(),
            },
            image_key,
            image: None,
            unchanged: false,
            commit: loaded.commit,
            inputs,
            attached: None,
        };
        // The Function's own layers, for its SBOM.
        let layers: Vec<sbom::LayerAt> = assembled
            .plans
            .iter()
            .filter(|p| matches!(p.role, Role::Dependencies | Role::Source))
            .map(|p| sbom::LayerAt {
                descriptor: p.descriptor.clone(),
                local: p.local.clone(),
                remote: p.remote.clone(),
            })
            .collect();
        let publishing = assemble::publish(
            client,
            opts,
            &cache,
            &assembled.image,
            &base,
            assembled.plans,
            &output.image_key,
        );
        // The signature and the provenance are made ready while the image goes up: once its
        // manifest is there, only theirs remain.
        let attaching = prepare_attachments(client, opts, &output, &base, &layers, true);
        let (published, prepared) = tokio::join!(publishing, attaching);
        output.published = published?;
        tracing::info!(reference = %output.published.reference, "built");
        output.attached = push_attachments(client, &output, prepared?).await?;
        if let (Some(repo), Some(dep), Some(inputs)) = (store_in, &deps, &function.deps) {
            store_in_cache_repo(
                client,
                opts,
                &repo,
                dep,
                inputs,
                &install::install_command(&opts.runtime, function, history),
            )
            .await;
        }
        output.image = Some(assembled.image);
        Ok(output)
    }
    .instrument(span)
    .await
}

/// Before anything is fetched (a bad stage directory or a usage error should not wait for
/// the network): with `--stage publish`, the staged dependency layer; otherwise a check that
/// the install `planned` can run here.
async fn staged_or_checked(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    function: &Function,
    history: Option<&'static str>,
    planned: Option<&install::Planned>,
) -> Result<(Option<DepLayer>, Option<Reference>), Error> {
    match &opts.stage {
        Stage::Publish(dir) => staged_layer(client, opts, cache, function, history, dir).await,
        Stage::All | Stage::Deps(_) | Stage::Lookup(_) | Stage::Source(_) => {
            if let Some(planned) = planned {
                install::require_builder(opts, planned)?;
            }
            Ok((None, None))
        }
    }
}

/// What the build is made of, by digest (see [`Inputs`]).
fn inputs(
    opts: &Options,
    function: &function::Function,
    base: &resolve::ResolvedBase,
    dependency_key: Option<&Digest>,
    source: &crate::oci::LayerBlob,
    commit: Option<&str>,
) -> Inputs {
    let dependency_files = function
        .deps
        .iter()
        .flat_map(|d| std::iter::once(&d.manifest).chain(&d.lock))
        .map(|f| (f.name.clone(), Digest::of(&f.bytes)))
        .collect();
    let builder = match &opts.install.isolation {
        deps::Isolation::Native { builder } => Some(builder.to_string()),
        deps::Isolation::Pending(image) if function.deps.is_some() => Some(image.to_string()),
        _ => None,
    };
    let git = match (&opts.function, commit) {
        (FunctionSpec::Git { source, .. }, Some(commit)) => {
            Some((source.url.to_string(), commit.to_string()))
        }
        _ => None,
    };
    Inputs {
        base_name: opts.base_name.clone(),
        base_digest: base.base.manifest.digest.clone(),
        source_diff_id: source.diff_id.clone(),
        dependency_files,
        dependency_key: dependency_key.cloned(),
        builder,
        git,
    }
}

/// The output of a build whose image the target already holds: nothing installed or pushed.
fn unchanged(
    found: existing::Found,
    image_key: Digest,
    commit: Option<String>,
    inputs: Inputs,
) -> Output {
    tracing::info!(
        reference = %found.reference,
        image_key = %image_key,
        "the target already holds this build: nothing to install or push",
    );
    let published = Published {
        reference: found.reference,
        digest: found.digest,
        blobs: Vec::new(),
    };
    Output {
        published,
        image_key,
        image: None,
        unchanged: true,
        commit,
        inputs,
        attached: None,
    }
}

/// With `--sign-key`, the signature and provenance of `output`'s image made ready (see
/// [`crate::cosign::prepare`]); `fresh`: its manifest is going up now.
async fn prepare_attachments(
    client: &Client,
    opts: &Options,
    output: &Output,
    base: &ResolvedBase,
    layers: &[sbom::LayerAt],
    fresh: bool,
) -> Result<Option<crate::cosign::Prepared>, Error> {
    let (Some(signing), Target::Registry(target)) = (&opts.signing, &opts.target) else {
        return Ok(None);
    };
    let digest = &output.published.digest;
    let repository = target.repository_path();
    let attach_err = |source| Error::Attach {
        image: format!("{repository}@{digest}"),
        source: Box::new(source),
    };
    // The signature's requests start at once; the attestations' once the SBOM is read.
    let attestations = async {
        let started = std::time::Instant::now();
        let bom =
            sbom::statement(client, &opts.cache_dir, base, layers, &repository, digest).await?;
        tracing::debug!(took = ?started.elapsed(), bytes = bom.len(), "SBOM");
        let statement = crate::provenance::statement(&crate::provenance::Build {
            repository: &repository,
            digest,
            build_key: &output.image_key,
            inputs: &output.inputs,
            external: signing.external.clone(),
            started: signing.started.clone(),
            // The image is complete: only its push (beside this) remains.
            finished: crate::provenance::now(),
        });
        let statement = serde_json::to_vec(&statement).expect("a JSON value serialises");
        let statements = crate::cosign::Statements {
            provenance: &statement,
            sbom: Some(&bom),
        };
        crate::cosign::prepare_attestations(
            client,
            target,
            digest,
            &signing.key,
            &statements,
            fresh,
        )
        .await
        .map_err(attach_err)
    };
    let signature = crate::cosign::prepare_signature(client, target, digest, &signing.key, fresh);
    let (signature, attestations) = tokio::join!(signature, attestations);
    Ok(Some(crate::cosign::Prepared::new(
        signature.map_err(attach_err)?,
        attestations?,
    )))
}

/// The layers of the image `digest` in the target that are not `base`'s: the Function's own.
async fn own_layers(
    client: &Client,
    opts: &Options,
    base: &ResolvedBase,
    digest: &Digest,
) -> Result<Vec<sbom::LayerAt>, Error> {
    let Target::Registry(target) = &opts.target else {
        return Ok(Vec::new());
    };
    let fail = |e: &dyn std::fmt::Display| Error::Sbom(format!("reading {target}@{digest}: {e}"));
    let reference = target.with_digest(digest.clone());
    let doc = client
        .get_manifest(&reference, &crate::registry::DEFAULT_MANIFEST_TYPES)
        .await
        .map_err(|e| fail(&e))?;
    let manifest: crate::oci::Manifest = doc.parse().map_err(|e| fail(&e))?;
    let base_layers = base
        .base
        .parse_manifest()
        .map_err(|e| fail(&e))?
        .layers
        .len();
    Ok(manifest
        .layers
        .into_iter()
        .skip(base_layers)
        .map(|descriptor| sbom::LayerAt {
            descriptor,
            local: None,
            remote: Some(target.clone()),
        })
        .collect())
}

/// Puts what [`prepare_attachments`] made ready, once the image's manifest is up.
async fn push_attachments(
    client: &Client,
    output: &Output,
    prepared: Option<crate::cosign::Prepared>,
) -> Result<Option<crate::cosign::Attached>, Error> {
    let Some(prepared) = prepared else {
        return Ok(None);
    };
    prepared
        .push(client)
        .await
        .map(Some)
        .map_err(|source| Error::Attach {
            image: output.published.reference.clone(),
            source: Box::new(source),
        })
}

/// The dependency layer for `dep_key` (cached, from the cache repository, or installed), and
/// the cache repository to store it in after the image when it was installed here.
async fn installed_layer(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    function: &Function,
    inputs: &function::DepInputs,
    dep_key: install::DepKey,
    history: Option<&'static str>,
) -> Result<(DepLayer, Option<Reference>), Error> {
    let toolchain = Some(dep_key.toolchain.clone());
    let layer = install::dependency_layer(
        client,
        opts,
        cache,
        inputs,
        dep_key,
        opts.cache_repo.as_ref(),
    )
    .await?;
    let local = layer
        .remote
        .is_none()
        .then(|| cache.blob_path(&layer.cached.digest));
    let created_by = stage::created_by(
        &install::install_command(&opts.runtime, function, history),
        &layer.key,
    );
    let dep = DepLayer {
        key: layer.key,
        toolchain,
        digest: layer.cached.digest,
        diff_id: layer.cached.diff_id,
        size: layer.cached.size,
        created_by,
        local,
        remote: layer.remote,
        _copy: None,
        _in_use: layer.in_use,
    };
    Ok((dep, layer.store_in))
}

/// `--stage deps`: loads the Function, installs its dependencies exactly as a whole build
/// would (same key, same layer, same cache) and writes the layer and its record into `dir`.
/// Needs no base image and no registry but a builder image's, and publishes nothing.
///
/// # Errors
/// See [`Error`].
pub async fn run_deps(client: &Client, opts: &Options, dir: &Path) -> Result<DepsOutput, Error> {
    let span = tracing::info_span!(
        "build",
        function = %opts.name,
        runtime = %opts.runtime.name,
        stage = "deps",
    );
    async move {
        let cache = cache::open_cache(&opts.cache_dir)?;
        let loaded = load::load(opts, &cache.tmp_dir()).await?;
        let function = &loaded.function;
        let mut record = stage::Record {
            format: stage::FORMAT.into(),
            runtime: opts.runtime.name.clone(),
            epoch: opts.epoch,
            manifest_digest: function.deps.as_ref().map(stage::manifest_digest),
            dependencies: None,
        };
        let mut blob = None;
        if let Some(inputs) = &function.deps {
            let planned = install::lockfile_plan(opts, inputs);
            let history = install::history(&planned);
            install::require_builder(opts, &planned)?;
            let dep_key = install::dependency_key(client, opts, &cache, inputs, planned).await?;
            let created_by = stage::created_by(
                &install::install_command(&opts.runtime, function, history),
                &dep_key.key,
            );
            let media_type = dependency_media_type(opts.compression);
            let toolchain = Some(dep_key.toolchain.clone());
            match lookup_hit(opts, inputs, &dep_key.key).await? {
                Some(found) => {
                    tracing::info!(
                        key = %dep_key.key,
                        digest = %found.digest,
                        "the cache repository has the dependency layer (--stage lookup): nothing \
                            to install",
                    );
                    record.dependencies = Some(stage::StagedLayer {
                        key: dep_key.key,
                        media_type,
                        digest: found.digest,
                        diff_id: found.diff_id,
                        size: found.size,
                        created_by,
                        toolchain,
                        in_cache_repo: true,
                    });
                }
                None => {
                    // The install stage has no registry credentials: the local cache only.
                    let install::Layer { key, cached, .. } =
                        install::dependency_layer(client, opts, &cache, inputs, dep_key, None)
                            .await?;
                    blob = Some(cache.blob_path(&cached.digest));
                    record.dependencies = Some(stage::StagedLayer {
                        key,
                        media_type,
                        digest: cached.digest,
                        diff_id: cached.diff_id,
                        size: cached.size,
                        created_by,
                        toolchain,
                        in_cache_repo: false,
                    });
                }
            }
        }
        let (dir, written) = (dir.to_path_buf(), record.clone());
        tokio::task::spawn_blocking(move || stage::write(&dir, &written, blob.as_deref()))
            .await??;
        tracing::info!(
            layer = ?record.dependencies.as_ref().map(|l| &l.digest),
            "staged the dependencies",
        );
        Ok(DepsOutput {
            record,
            commit: loaded.commit,
        })
    }
    .instrument(span)
    .await
}

/// Pushes the freshly installed dependency layer to the cache repository, after the image.
/// A failure is a warning: the image is built.
async fn store_in_cache_repo(
    client: &Client,
    opts: &Options,
    repo: &Reference,
    dep: &DepLayer,
    inputs: &function::DepInputs,
    install: &str,
) {
    let Some(local) = &dep.local else { return };
    let mount_from = match &opts.target {
        Target::Registry(t) if t.registry == repo.registry => Some(t.repository.as_str()),
        _ => None,
    };
    let cached = cache::CachedLayer {
        digest: dep.digest.clone(),
        diff_id: dep.diff_id.clone(),
        size: dep.size,
    };
    match remote_cache::push_cache_entry(
        client, opts, repo, &dep.key, &cached, inputs, install, local, mount_from,
    )
    .await
    {
        Ok(true) => {
            tracing::info!(
                cache_repo = %repo,
                tag = %remote_cache::tag(&dep.key),
                "stored the dependency layer in the cache repository",
            )
        }
        Ok(false) => {
            tracing::info!(
                cache_repo = %repo,
                "not storing the dependency layer in the cache repository: no --cache-sign-key \
                    to sign the entry with",
            )
        }
        Err(e) => {
            tracing::warn!(
                cache_repo = %repo,
                error = %format!("{:#}", anyhow::Error::new(e)),
                "could not store the dependency layer in the cache repository",
            )
        }
    }
}
