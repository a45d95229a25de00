//! The lookup and publish halves of a split build that read other stages' records:
//! [`run_lookup`] (`--stage lookup`), the install stage's use of its record, and the publish
//! stage's dependency layer from the stage directory or the cache repository.

use std::path::{Path, PathBuf};

use tracing::Instrument;

use super::assemble::DepLayer;
use super::cache::LayerCache;
use super::error::Error;
use super::function::{self, Function};
use super::options::Options;
use super::{install, load, remote_cache, stage};
use crate::oci::Digest;
use crate::registry::{Client, Reference};

/// `--stage lookup`: computes the dependency key (from the builder image's digest, or the
/// toolchain on PATH; no third-party code runs), asks the cache repository for it and writes
/// what it found into `dir`. An unusable cache repository is a warning and a miss.
///
/// # Errors
/// See [`Error`].
pub async fn run_lookup(
    client: &Client,
    opts: &Options,
    dir: &Path,
) -> Result<stage::Lookup, Error> {
    let span = tracing::info_span!(
        "build",
        function = %opts.name,
        runtime = %opts.runtime.name,
        stage = "lookup",
    );
    async move {
        let cache = super::cache::open_cache(&opts.cache_dir)?;
        let loaded = load::load(opts, &cache.tmp_dir()).await?;
        let inputs = loaded.function.deps.as_ref();
        let repo = opts.cache_repo.as_ref().map(Reference::repository_only);
        let (mut key, mut found) = (None, None);
        if let (Some(inputs), Some(repo)) = (inputs, &repo) {
            let planned = install::lockfile_plan(opts, inputs);
            install::require_builder(opts, &planned)?;
            let dep_key = install::dependency_key(client, opts, &cache, inputs, planned)
                .await?
                .key;
            found = match remote_cache::lookup(client, repo, &dep_key, &opts.cache_trust).await {
                Ok(Some(entry)) => {
                    tracing::info!(
                        key = %dep_key,
                        digest = %entry.digest,
                        cache_repo = %repo,
                        "the cache repository has the dependency layer",
                    );
                    Some(stage::Found {
                        digest: entry.digest,
                        diff_id: entry.diff_id,
                        size: entry.size,
                    })
                }
                Ok(None) => {
                    tracing::info!(
                        key = %dep_key,
                        cache_repo = %repo,
                        "dependency layer not in the cache repository: the install stage installs \
                            it",
                    );
                    None
                }
                Err(e) => {
                    tracing::warn!(
                        cache_repo = %repo,
                        error = %format!("{:#}", anyhow::Error::new(e)),
                        "the cache repository cannot be used; the install stage installs without \
                            it",
                    );
                    None
                }
            };
            key = Some(dep_key);
        }
        let lookup = stage::Lookup::new(
            &opts.runtime.name,
            opts.epoch,
            inputs,
            key,
            repo.map(|r| r.to_string()).unwrap_or_default(),
            found,
        );
        let (dir, written) = (dir.to_path_buf(), lookup.clone());
        tokio::task::spawn_blocking(move || stage::write_lookup(&dir, &written)).await??;
        Ok(lookup)
    }
    .instrument(span)
    .await
}

/// The entry `--stage lookup` found for `key` (`--lookup-dir`), if any. A lookup that
/// computed another key (other flags) is not used, with a warning.
pub(super) async fn lookup_hit(
    opts: &Options,
    inputs: &function::DepInputs,
    key: &Digest,
) -> Result<Option<stage::Found>, Error> {
    let Some(lookup) = read_lookup(opts, Some(inputs)).await? else {
        return Ok(None);
    };
    if lookup.key.as_ref() != Some(key) {
        tracing::warn!(
            %key,
            lookup = ?lookup.key.as_ref().map(Digest::to_string),
            "--stage lookup computed another dependency key (run every stage with the same flags); \
                installing",
        );
        return Ok(None);
    }
    Ok(lookup.found)
}

/// The `--lookup-dir` record, checked against this build.
async fn read_lookup(
    opts: &Options,
    inputs: Option<&function::DepInputs>,
) -> Result<Option<stage::Lookup>, Error> {
    let Some(dir) = opts.lookup_dir.clone() else {
        return Ok(None);
    };
    let (runtime, epoch, inputs) = (opts.runtime.name.clone(), opts.epoch, inputs.cloned());
    let lookup = tokio::task::spawn_blocking(move || {
        stage::read_lookup(&dir, &runtime, epoch, inputs.as_ref())
    })
    .await??;
    Ok(Some(lookup))
}

/// The dependency layer from `--stage-dir`, checked against this build's Function, and
/// the cache repository to store it in afterwards. Runs no program. A layer the install
/// stage says is in the cache repository is taken from there as `--lookup-dir`'s record
/// (written by the lookup stage, which the install stage cannot write) names it: the stage
/// record's key must be the lookup's, since the cache entry is stored under it.
pub(super) async fn staged_layer(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    function: &Function,
    history: Option<&'static str>,
    dir: &Path,
) -> Result<(Option<DepLayer>, Option<Reference>), Error> {
    let (dir, scratch, runtime, epoch) = (
        dir.to_path_buf(),
        cache.tmp_dir(),
        opts.runtime.name.clone(),
        opts.epoch,
    );
    let inputs = function.deps.clone();
    let install_command = install::install_command(&opts.runtime, function, history);
    let compression = opts.compression;
    let verified = tokio::task::spawn_blocking(move || {
        let expected = stage::Expected {
            runtime: &runtime,
            epoch,
            inputs: inputs.as_ref(),
            install_command,
            compression,
        };
        stage::read(&dir, &expected, &scratch)
    })
    .await??;
    let lookup = read_lookup(opts, function.deps.as_ref()).await?;
    let Some(layer) = verified.record.dependencies else {
        return Ok((None, None));
    };
    // Where a mismatch with the lookup is reported.
    let lookup_file = opts
        .lookup_dir
        .clone()
        .unwrap_or_default()
        .join(stage::LOOKUP_FILE);
    let lookup_key = lookup.as_ref().and_then(|l| l.key.clone());
    if layer.in_cache_repo && lookup_key.as_ref() != Some(&layer.key) {
        return Err(stage::Error::Mismatch {
            path: lookup_file.clone(),
            field: "dependency key",
            recorded: lookup_key.map_or_else(|| "none".into(), |k| k.to_string()),
            current: format!("{} (the install stage's record)", layer.key),
        }
        .into());
    }
    let repo = opts.cache_repo.as_ref().map(Reference::repository_only);
    let Some(copy) = verified.blob else {
        let found = lookup.and_then(|l| l.found);
        let dep = from_cache_repo(client, opts, cache, layer, found, repo, lookup_file).await?;
        return Ok((Some(dep), None));
    };
    tracing::info!(
        key = %layer.key,
        digest = %layer.digest,
        "dependency layer from the stage directory",
    );
    let store_in = store_staged_in(lookup_key, &layer.key, repo);
    Ok((
        Some(DepLayer {
            key: layer.key,
            toolchain: layer.toolchain,
            digest: layer.digest,
            diff_id: layer.diff_id,
            size: layer.size,
            created_by: layer.created_by,
            local: Some(copy.to_path_buf()),
            remote: None,
            _copy: Some(copy),
            _in_use: crate::inuse::InUse::default(),
        }),
        store_in,
    ))
}

/// A staged layer the install stage found in the cache repository, taken from there as the
/// lookup stage found it (`found`): mounted, or downloaded and verified.
async fn from_cache_repo(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    layer: stage::StagedLayer,
    found: Option<stage::Found>,
    repo: Option<Reference>,
    lookup_file: PathBuf,
) -> Result<DepLayer, Error> {
    // In the cache repository, as the lookup found it: mounted, or downloaded and verified.
    let (found, repo) = match (found, repo) {
        (Some(found), Some(repo)) if found.digest == layer.digest => (found, repo),
        (found, repo) => {
            return Err(stage::Error::Mismatch {
                path: lookup_file,
                field: "cache repository entry",
                recorded: found.map_or_else(
                    || "none".into(),
                    |f| {
                        format!(
                            "{} in {}",
                            f.digest,
                            repo.map_or_else(|| "no --cache-repo".into(), |r| r.to_string())
                        )
                    },
                ),
                current: format!("{} (the install stage's record)", layer.digest),
            }
            .into());
        }
    };
    opts.authorize_up_front(client).await?;
    let gone = || stage::Error::EntryGone {
        key: layer.key.clone(),
        repo: repo.to_string(),
    };
    let (cached, remote) = install::from_cache_repo(client, opts, cache, &layer.key, &repo)
        .await
        .map_err(|e| {
            tracing::warn!(
                error = %format!("{:#}", anyhow::Error::new(e)),
                "reading the cache repository",
            );
            gone()
        })?
        .filter(|(cached, _)| cached.digest == found.digest)
        .ok_or_else(gone)?;
    let local = remote.is_none().then(|| cache.blob_path(&cached.digest));
    Ok(DepLayer {
        key: layer.key,
        toolchain: layer.toolchain,
        digest: cached.digest,
        diff_id: cached.diff_id,
        size: cached.size,
        created_by: layer.created_by,
        local,
        remote,
        _copy: None,
        _in_use: crate::inuse::InUse::default(),
    })
}

/// Where a layer the install stage installed is stored after the image: the cache repository,
/// under the lookup's key only, never one the install stage made up.
fn store_staged_in(
    lookup_key: Option<Digest>,
    staged: &Digest,
    repo: Option<Reference>,
) -> Option<Reference> {
    match lookup_key {
        Some(key) if key == *staged => repo,
        _ if repo.is_none() => None,
        Some(key) => {
            tracing::warn!(
                lookup = %key,
                staged = %staged,
                "the install stage's dependency key is not the one --stage lookup computed: the \
                    layer is used in this image but not stored in the cache repository",
            );
            None
        }
        None => {
            tracing::warn!(
                "no --lookup-dir: the dependency layer is not stored in the cache repository, \
                since its key would come from the install stage (run --stage lookup first)"
            );
            None
        }
    }
}
