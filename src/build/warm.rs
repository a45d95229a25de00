//! `kiln warm`'s half of a build: a Function's dependency layer into the cache repository,
//! under the key a build of it computes, without building an image.

use tracing::Instrument;

use super::error::Error;
use super::options::Options;
use super::{install, load, remote_cache};
use crate::image::publish;
use crate::oci::Digest;
use crate::registry::{Client, Reference};

/// What `kiln warm` did for one Function's dependencies.
#[derive(Debug)]
pub enum Warmed {
    /// The Function has no dependencies: nothing to cache.
    NoDependencies,
    /// The cache repository already held the layer for this key.
    Present {
        /// The dependency key.
        key: Digest,
        /// The entry.
        entry: Reference,
    },
    /// Installed (or taken from the local cache) and stored in the cache repository.
    Stored {
        /// The dependency key.
        key: Digest,
        /// The entry.
        entry: Reference,
        /// Whether the packages were installed (not in the local cache).
        installed: bool,
    },
}

/// `kiln warm`: makes sure the cache repository `repo` holds the dependency layer of the
/// Function in `opts`, under the key a build of it computes. One manifest request when it
/// is there; else the layer from the local cache or an install, and the entry pushed (the
/// layer, the empty config, the manifest last). No image is built.
///
/// # Errors
/// See [`Error`]; a cache repository that cannot be read or written is an error here, since
/// warming it is the whole job.
pub async fn warm_deps(client: &Client, opts: &Options, repo: &Reference) -> Result<Warmed, Error> {
    let span = tracing::info_span!("warm", function = %opts.name, runtime = %opts.runtime.name);
    async move {
        let cache = super::cache::open_cache(&opts.cache_dir)?;
        let loaded = load::load(opts, &cache.tmp_dir()).await?;
        let function = &loaded.function;
        let Some(inputs) = &function.deps else {
            return Ok(Warmed::NoDependencies);
        };
        let planned = install::lockfile_plan(opts, inputs);
        let history = install::history(&planned);
        install::require_builder(opts, &planned)?;
        let lookup_err = |e| Error::Lookup {
            target: repo.to_string(),
            source: Box::new(e),
        };
        let dep_key = install::dependency_key(client, opts, &cache, inputs, planned).await?;
        let key = dep_key.key.clone();
        let entry = repo
            .with_tag(&remote_cache::tag(&key))
            .map_err(lookup_err)?;
        if opts.use_cache
            && remote_cache::lookup(client, repo, &key, &opts.cache_trust)
                .await
                .map_err(lookup_err)?
                .is_some()
        {
            tracing::info!(%key, %entry, "the cache repository holds this dependency layer");
            return Ok(Warmed::Present { key, entry });
        }
        let install = install::install_command(&opts.runtime, function, history);
        let layer = install::dependency_layer(client, opts, &cache, inputs, dep_key, None).await?;
        let installed = !layer.from_local_cache;
        let local = cache.blob_path(&layer.cached.digest);
        let stored = remote_cache::push_cache_entry(
            client,
            opts,
            repo,
            &key,
            &layer.cached,
            inputs,
            &install,
            &local,
            None,
        )
        .await
        .map_err(|e| publish::Error::Registry {
            what: format!("dependency cache entry {}", remote_cache::tag(&key)),
            target: repo.to_string(),
            source: Box::new(e),
        })?;
        if !stored {
            return Err(Error::NoCacheSignKey);
        }
        tracing::info!(%key, %entry, "stored the dependency layer in the cache repository");
        Ok(Warmed::Stored {
            key,
            entry,
            installed,
        })
    }
    .instrument(span)
    .await
}
