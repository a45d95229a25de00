//! The dependency layer of a build: taken from the cache when its key matches, else
//! installed (inside the builder image, which is unpacked only then, or with the toolchain on
//! PATH) and layered. The key names everything that decides the layer's bytes.

use std::path::Path;

use super::cache::{self, LayerCache};
use super::deps::{self, InstallEnv};
use super::error::Error;
use super::function::{self, Function};
use super::options::Options;
use super::{lockfile, pinned, remote_cache};
use crate::oci::source;
use crate::oci::{self, Digest, LayerBlob, layer::write_layer};
use crate::progress::steps::{self, Step};
use crate::registry::{Client, Reference};
use crate::sandbox::emulator::Emulator;

/// Refuses a sandboxed install without a builder image: the user must name one (or ask for
/// the toolchain on PATH), since nothing says which toolchain matches an overridden base.
/// An install from an npm lock file alone needs no toolchain; one from pinned Python
/// requirements may still need pip. `direct` is [`lockfile_plan`]'s answer.
pub(super) fn require_builder(opts: &Options, direct: &Planned) -> Result<(), Error> {
    if let Ok(Direct::Npm(_)) = direct {
        return Ok(());
    }
    if let Err(why) = direct {
        foreign_install(opts, why)?;
    }
    match &opts.install.isolation {
        deps::Isolation::MissingBuilder { sandbox } => Err(Error::NoBuilder {
            sandbox,
            base: opts.base_name.clone(),
            runtime: opts.runtime.name.clone(),
        }),
        _ => Ok(()),
    }
}

/// Allows the package manager's install (`why` says why it must run) for a platform other
/// than this machine's only in the builder image's sandbox under emulation ([`emulation`]):
/// on this machine's toolchain its install scripts and compilers would make this machine's
/// programs.
fn foreign_install(opts: &Options, why: &str) -> Result<(), Error> {
    let host = oci::Platform::host();
    if opts.platform.os == host.os && opts.platform.architecture == host.architecture {
        return Ok(());
    }
    let not_emulated = match emulation(opts) {
        Ok(emulator) => {
            tracing::info!(
                platform = %opts.platform,
                emulator = %emulator.path.display(),
                reason = why,
                "the install runs {} for another platform, under emulation",
                tool(opts.runtime.language),
            );
            return Ok(());
        }
        Err(not) => not,
    };
    let python = opts.runtime.language == crate::runtime::Language::Python;
    Err(Error::ForeignInstall {
        platform: opts.platform.to_string(),
        tool: tool(opts.runtime.language),
        why: why.to_string(),
        not_emulated,
        remedy: if python {
            "a requirements.txt that pins every package (NAME==VERSION) with wheels for that \
                platform"
        } else {
            "a package-lock.json that decides every package, none with an install script"
        },
    })
}

/// The emulator a sandboxed install for another platform runs under: every program the
/// install starts must be emulated ([`Emulator::children`]), and the install must run in the
/// builder image (the toolchain on PATH is this machine's). Why not, as a clause.
fn emulation(opts: &Options) -> Result<Emulator, String> {
    if opts.install.no_emulation {
        return Err("--no-emulation forbids running it under emulation".into());
    }
    if !matches!(
        opts.install.isolation,
        deps::Isolation::Pending(_)
            | deps::Isolation::Builder { .. }
            | deps::Isolation::MissingBuilder { .. }
    ) {
        return Err(
            "only an install in the builder image's sandbox can be emulated, and this one would \
             run the toolchain on PATH"
                .into(),
        );
    }
    let platform = opts.platform.to_string();
    let emulator = Emulator::for_machine(opts.platform.machine(), &platform)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{platform} needs no emulator here"))?;
    emulator.children().map_err(|why| {
        format!(
            "{why}; without that the programs npm or pip starts (install scripts, \
             compilers) would not run"
        )
    })?;
    Ok(emulator)
}

/// Unpacks a pending builder image (once, verified, cached by digest) into the root
/// filesystem the install runs in.
async fn resolve_builder(client: &Client, opts: &Options) -> Result<InstallEnv, Error> {
    let deps::Isolation::Pending(image) = &opts.install.isolation else {
        return Ok(opts.install.clone());
    };
    let run_opts = crate::run::Options {
        image: image.clone(),
        platform: opts.platform.clone(),
        cache_dir: opts.cache_dir.clone(),
        env: vec![],
        args: None,
        entrypoint: None,
        user: None,
        jobs: opts.jobs,
        max_unpacked: crate::run::unpack::DEFAULT_LIMIT,
    };
    let step = Step::start("unpack builder");
    let entry = crate::run::prepare(client, &run_opts)
        .await
        .map_err(Box::new)?;
    step.done(steps::short_digest(&entry.digest));
    let env = entry
        .config
        .config
        .as_ref()
        .map(|c| c.env_pairs())
        .unwrap_or_default();
    tracing::info!(builder = %entry.digest, "dependencies install inside the builder image");
    let host = oci::Platform::host();
    let foreign = opts.platform.architecture != host.architecture;
    let isolation = deps::Isolation::Builder {
        rootfs: entry.rootfs,
        digest: entry.digest,
        env,
        in_use: entry.in_use,
        // An install the package manager must run was allowed only with an emulator.
        emulator: if foreign { emulation(opts).ok() } else { None },
    };
    Ok(InstallEnv {
        isolation,
        ..opts.install.clone()
    })
}

/// An install by kiln itself, without the package manager.
#[derive(Clone, Debug)]
pub(super) enum Direct {
    /// From an npm lock file that decides everything.
    Npm(lockfile::Plan),
    /// From a requirements.txt that pins every line, if the wheels need nothing else.
    Wheels(pinned::Plan),
}

/// How the image history names the install `direct` plans, if kiln does it.
pub(super) fn history(direct: &Planned) -> Option<&'static str> {
    direct.as_ref().ok().map(Direct::history)
}

impl Direct {
    /// How the image history names the install.
    pub(super) fn history(&self) -> &'static str {
        match self {
            Direct::Npm(_) => "(by kiln from the lock file, without npm)",
            Direct::Wheels(_) => {
                "(by kiln from the pinned wheels, without pip, when they pin every dependency)"
            }
        }
    }
}

/// [`lockfile_plan`]'s answer: the install by kiln itself, or why the package manager runs.
pub(super) type Planned = Result<Direct, String>;

/// The install of `inputs` by kiln itself, without the package manager, when
/// `--lockfile-install auto` and the lock (or a fully pinned requirements.txt) may decide
/// everything; else why not. Worked out once per build (it parses the lock file) and
/// handed to [`require_builder`], [`dependency_key`] and the history text.
pub(super) fn lockfile_plan(opts: &Options, inputs: &function::DepInputs) -> Planned {
    if !opts.lockfile_install {
        return Err("--lockfile-install off".into());
    }
    match opts.runtime.language {
        crate::runtime::Language::Python => {
            pinned::plan(&opts.runtime, inputs, &opts.platform).map(Direct::Wheels)
        }
        _ => lockfile::plan(&opts.runtime, inputs, &opts.platform).map(Direct::Npm),
    }
}

/// The package manager a runtime's install falls back to, for log lines.
fn tool(language: crate::runtime::Language) -> &'static str {
    match language {
        crate::runtime::Language::Python => "pip",
        _ => "npm",
    }
}

/// A dependency key, computed before anything is installed, and how to install if the
/// layer is not cached.
pub(super) struct DepKey {
    pub key: Digest,
    /// What installs the layer, as the key names it: kiln's lock-file install for a
    /// platform, or a builder image by digest (see [`deps::builder_toolchain_id`]).
    pub toolchain: String,
    /// The install by kiln itself, when the package manager may not be needed.
    direct: Option<Direct>,
    /// The install environment when it was needed to name the toolchain (the toolchain on
    /// PATH); `None` for a builder image, unpacked only for an install.
    install: Option<InstallEnv>,
    /// Where the toolchain on `PATH` was asked for its version (the install runs there too);
    /// else made only when something is installed, so a build that finds its image or its
    /// dependency layer makes no directory.
    scratch: Option<tempfile::TempDir>,
}

/// A new scratch directory for probing the toolchain and installing, in the cache's `tmp`.
fn scratch_dir(cache: &LayerCache) -> Result<tempfile::TempDir, Error> {
    tempfile::tempdir_in(cache.tmp_dir()).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })
}

/// The dependency key of `inputs` for this build: the builder image's digest names the
/// toolchain (one manifest lookup, no unpacking), or the toolchain on PATH is asked.
pub(super) async fn dependency_key(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    inputs: &function::DepInputs,
    plan: Planned,
) -> Result<DepKey, Error> {
    match &plan {
        Err(why) => {
            let tool = tool(opts.runtime.language);
            tracing::info!(
                reason = %why,
                "the dependencies need {tool}: the lock file does not decide them alone",
            );
        }
        Ok(Direct::Npm(_)) => {
            let toolchain = lockfile::toolchain_id(&opts.platform);
            let key = deps::cache_key(
                &opts.runtime,
                &toolchain,
                inputs,
                opts.epoch,
                opts.compression,
            );
            return Ok(DepKey {
                key,
                toolchain,
                direct: plan.ok(),
                install: None,
                scratch: None,
            });
        }
        Ok(Direct::Wheels(_)) => {}
    }
    let (toolchain, install, scratch) = match &opts.install.isolation {
        deps::Isolation::Pending(image) => {
            let resolved = crate::run::image::resolve(client, image, &opts.platform)
                .await
                .map_err(Box::new)?;
            (deps::builder_toolchain_id(&resolved.digest), None, None)
        }
        deps::Isolation::Host | deps::Isolation::MissingBuilder { .. } => {
            let install = opts.install.clone();
            let scratch = scratch_dir(cache)?;
            let id = deps::toolchain_id(&opts.runtime, &install, scratch.path()).await?;
            (id, Some(install), Some(scratch))
        }
        // The builder image's digest names the toolchain; nothing is asked (natively inside
        // it, deps::install checks the toolchain on PATH before it runs).
        deps::Isolation::Native { builder }
        | deps::Isolation::Builder {
            digest: builder, ..
        } => (
            deps::builder_toolchain_id(builder),
            Some(opts.install.clone()),
            None,
        ),
    };
    // Pinned wheels, else pip: the key names both ways, since which one runs shows only in
    // the wheels.
    let toolchain = match &plan {
        Ok(Direct::Wheels(p)) => format!("{} else {toolchain}", pinned::toolchain_id(p)),
        _ => toolchain,
    };
    let key = deps::cache_key(
        &opts.runtime,
        &toolchain,
        inputs,
        opts.epoch,
        opts.compression,
    );
    Ok(DepKey {
        key,
        toolchain,
        direct: plan.ok(),
        install,
        scratch,
    })
}

/// A build's dependency layer and where its bytes are.
pub(super) struct Layer {
    pub key: Digest,
    pub cached: cache::CachedLayer,
    /// Keeps `kiln cache prune` from removing the cached blob until it is published.
    pub in_use: crate::inuse::InUse,
    /// The cache repository holding the blob, when it is not in the local cache (a hit
    /// mounted into the target).
    pub remote: Option<Reference>,
    /// The cache repository to store the layer in after the image: it was installed here.
    pub store_in: Option<Reference>,
    /// Taken from the local cache: nothing was installed or downloaded.
    pub from_local_cache: bool,
}

/// The dependency layer for `key`: from the local cache, else from `cache_repo` (a
/// registry, `--cache-repo`), else installed and layered (and cached).
pub(super) async fn dependency_layer(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    inputs: &function::DepInputs,
    key: DepKey,
    cache_repo: Option<&Reference>,
) -> Result<Layer, Error> {
    let DepKey {
        key,
        toolchain: _,
        direct,
        install,
        scratch,
    } = key;
    // Held until the layer is published (or staged): a prune leaves it alone meanwhile.
    let in_use = cache.hold(&key).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })?;
    let layer = |cached, remote, store_in, from_local_cache| Layer {
        key: key.clone(),
        cached,
        in_use: in_use.clone(),
        remote,
        store_in,
        from_local_cache,
    };
    let step = Step::start("dependencies");
    let size = |l: &cache::CachedLayer| crate::progress::bytes(l.size);
    if opts.use_cache
        && let Some(hit) = cache.get(&key)
    {
        tracing::info!(%key, digest = %hit.digest, "dependency layer from cache");
        step.done(format_args!("cache hit (local cache), {}", size(&hit)));
        return Ok(layer(hit, None, None, true));
    }
    let mut store_in = None;
    if let Some(repo) = cache_repo.filter(|_| opts.use_cache) {
        match from_cache_repo(client, opts, cache, &key, repo).await {
            Ok(Some((cached, remote))) => {
                step.done(format_args!("cache hit ({}), {}", repo, size(&cached)));
                return Ok(layer(cached, remote, None, false));
            }
            Ok(None) => store_in = Some(repo.clone()),
            Err(e) => {
                tracing::warn!(
                    cache_repo = %repo,
                    error = %format!("{:#}", anyhow::Error::new(e)),
                    "the cache repository cannot be used; installing without it",
                );
            }
        }
    }
    let scratch = match scratch {
        Some(dir) => dir,
        None => scratch_dir(cache)?,
    };
    let output = install_direct(opts, direct, scratch.path()).await?;
    let (output, how) = match (output, install) {
        (Some(done), _) => (done, "by kiln, without the package manager"),
        (None, Some(install)) => {
            let dir = deps::install(&opts.runtime, inputs, &install, scratch.path()).await?;
            (Installed::Dir(dir), tool(opts.runtime.language))
        }
        (None, None) => {
            let install = resolve_builder(client, opts).await?;
            let dir = deps::install(&opts.runtime, inputs, &install, scratch.path()).await?;
            (Installed::Dir(dir), tool(opts.runtime.language))
        }
    };
    let cached = write_dependency_layer(opts, cache, &key, output).await?;
    step.done(format_args!("installed ({how}), {}", size(&cached)));
    Ok(layer(cached, None, store_in, false))
}

/// Installs without the package manager what a lock file or pinned requirements decide
/// alone; `None` when the package manager must run.
async fn install_direct(
    opts: &Options,
    direct: Option<Direct>,
    scratch: &Path,
) -> Result<Option<Installed>, Error> {
    Ok(match direct {
        Some(Direct::Npm(plan)) => {
            tracing::info!(
                packages = plan.len(),
                "installing dependencies from the lock file, without npm"
            );
            let http = lockfile::client(opts.install.ca_bundle.as_deref())?;
            Some(Installed::Tree(
                lockfile::install(&plan, &http, &opts.cache_dir, scratch).await?,
            ))
        }
        Some(Direct::Wheels(plan)) => {
            tracing::info!(
                packages = plan.len(),
                "installing the pinned requirements, without pip"
            );
            let http = lockfile::client(opts.install.ca_bundle.as_deref())?;
            match pinned::install(&plan, &http, &opts.cache_dir, scratch).await? {
                pinned::Outcome::Installed(tree) => Some(Installed::Tree(tree)),
                pinned::Outcome::NeedsPip(why) => {
                    foreign_install(opts, &why)?;
                    tracing::info!(
                        reason = %why,
                        "the dependencies need pip: the pinned wheels do not decide them alone",
                    );
                    None
                }
            }
        }
        None => None,
    })
}

/// Writes the installed dependencies as the layer for `key`, into the local cache.
async fn write_dependency_layer(
    opts: &Options,
    cache: &LayerCache,
    key: &Digest,
    output: Installed,
) -> Result<cache::CachedLayer, Error> {
    let (dest, tmp, epoch, media_type) = (
        opts.runtime.dependencies.dir.clone(),
        cache.tmp_dir(),
        opts.epoch,
        super::dependency_media_type(opts.compression),
    );
    let blob = tokio::task::spawn_blocking(move || -> Result<LayerBlob, Error> {
        let tree = match output {
            Installed::Dir(dir) => {
                source::walk(&dir, &source::WalkRules::default()).map_err(function::Error::from)?
            }
            Installed::Tree(tree) => tree,
        };
        write_layer(tree.to_layer_entries(&dest), epoch, media_type, &tmp).map_err(|source| {
            Error::Layer {
                what: "dependency",
                source,
            }
        })
    });
    let blob = blob.await??;
    tracing::info!(
        %key,
        digest = %blob.descriptor.digest,
        size = blob.descriptor.size,
        "wrote dependency layer",
    );
    let cached = cache
        .put_blocking(key, blob)
        .await
        .map_err(|source| Error::Cache {
            path: cache.tmp_dir(),
            source,
        })?;
    Ok(cached)
}

/// What an install produced: the package manager's output directory, or the tree kiln
/// built from the lock file.
enum Installed {
    Dir(std::path::PathBuf),
    Tree(source::Tree),
}

/// The layer of `key` from the cache repository: mounted later when the target is on its
/// registry (`remote` set, nothing downloaded), else downloaded, verified (digest and diff
/// ID) and put in the local cache. `Ok(None)`: no usable entry.
pub(super) async fn from_cache_repo(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    key: &Digest,
    repo: &Reference,
) -> Result<Option<(cache::CachedLayer, Option<Reference>)>, crate::registry::Error> {
    let Some(entry) = remote_cache::lookup(client, repo, key, &opts.cache_trust).await? else {
        tracing::info!(%key, cache_repo = %repo, "dependency layer not in the cache repository");
        return Ok(None);
    };
    let cached = cache::CachedLayer {
        digest: entry.digest.clone(),
        diff_id: entry.diff_id.clone(),
        size: entry.size,
    };
    if let super::options::Target::Registry(target) = &opts.target
        && target.registry == entry.repo.registry
    {
        tracing::info!(
            %key,
            digest = %entry.digest,
            cache_repo = %repo,
            "dependency layer from the cache repository (mounted, not downloaded)",
        );
        return Ok(Some((cached, Some(entry.repo))));
    }
    tracing::warn!(
        %key,
        cache_repo = %repo,
        "the cache repository is not on the target's registry: downloading the dependency layer to \
            upload it",
    );
    let descriptor = oci::Descriptor::new(
        super::dependency_media_type(opts.compression),
        entry.digest.clone(),
        entry.size,
    );
    let file = tempfile::Builder::new()
        .prefix(".cache-repo-")
        .tempfile_in(cache.tmp_dir())
        .map_err(|source| {
            crate::registry::Error::Io(crate::io_error::IoError {
                action: "creating a file in",
                path: cache.tmp_dir(),
                source,
            })
        })?
        .into_temp_path();
    client
        .get_blob_to_file(&entry.repo, &descriptor, &file)
        .await?;
    let path = file.to_path_buf();
    let diff_id = tokio::task::spawn_blocking(move || oci::layer::diff_id_of(&path))
        .await
        .ok()
        .and_then(Result::ok);
    if diff_id.as_ref() != Some(&entry.diff_id) {
        tracing::warn!(
            %key,
            cache_repo = %repo,
            "the cached dependency layer does not decompress to the diff ID its entry names: \
                ignored; installing",
        );
        return Ok(None);
    }
    let blob = LayerBlob {
        descriptor,
        diff_id: entry.diff_id,
        file,
    };
    match cache.put_blocking(key, blob).await {
        Ok(cached) => Ok(Some((cached, None))),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "could not keep the downloaded dependency layer; installing",
            );
            Ok(None)
        }
    }
}

/// The install command line, as the history text names it; `history` says how kiln installs
/// without the package manager, when it does ([`history`]).
pub(super) fn install_command(
    runtime: &crate::runtime::RuntimeSpec,
    function: &Function,
    history: Option<&'static str>,
) -> String {
    let Some(inputs) = &function.deps else {
        return runtime.install_command(false).join(" ");
    };
    let command = runtime.install_command(inputs.lock.is_some()).join(" ");
    match history {
        Some(history) => format!("{command} {history}"),
        None => command,
    }
}
