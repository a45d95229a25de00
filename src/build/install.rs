//! The dependency layer of a build: taken from the cache when its key matches, else
//! installed (inside the builder image, which is unpacked only then, or with the toolchain on
//! PATH) and layered. The key names everything that decides the layer's bytes.

use super::cache::{self, LayerCache};
use super::deps::{self, InstallEnv};
use super::{Error, Options, function, source};
use crate::oci::{self, Digest, LayerBlob, layer::write_layer};
use crate::registry::Client;

/// Refuses a sandboxed install without a builder image: the user must name one (or ask for
/// the toolchain on PATH), since nothing says which toolchain matches an overridden base.
pub(super) fn require_builder(opts: &Options) -> Result<(), Error> {
    match &opts.install.isolation {
        deps::Isolation::MissingBuilder { sandbox } => Err(Error::NoBuilder {
            sandbox,
            base: opts.base_name.clone(),
            runtime: opts.runtime.name.clone(),
        }),
        _ => Ok(()),
    }
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
    let entry = crate::run::prepare(client, &run_opts)
        .await
        .map_err(Box::new)?;
    let env = entry
        .config
        .config
        .as_ref()
        .map(|c| c.env_pairs())
        .unwrap_or_default();
    tracing::info!(builder = %entry.digest, "dependencies install inside the builder image");
    let isolation = deps::Isolation::Builder {
        rootfs: entry.rootfs,
        digest: entry.digest,
        env,
        in_use: entry.in_use,
    };
    Ok(InstallEnv {
        isolation,
        ..opts.install.clone()
    })
}

pub(super) async fn dependency_layer(
    client: &Client,
    opts: &Options,
    cache: &LayerCache,
    inputs: &function::DepInputs,
) -> Result<(Digest, cache::CachedLayer, crate::inuse::InUse), Error> {
    let scratch = tempfile::tempdir_in(cache.tmp_dir()).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })?;
    // A pending builder is only unpacked for an install: its digest alone names the toolchain,
    // so a cache hit needs neither the sandbox nor the builder's layers.
    let (toolchain, mut install) = match &opts.install.isolation {
        deps::Isolation::Pending(image) => {
            let resolved = crate::run::image::resolve(client, image, &opts.platform)
                .await
                .map_err(Box::new)?;
            (deps::builder_toolchain_id(&resolved.digest), None)
        }
        _ => {
            let install = opts.install.clone();
            let id = deps::toolchain_id(&opts.runtime, &install, scratch.path()).await?;
            (id, Some(install))
        }
    };
    let key = deps::cache_key(&opts.runtime, &toolchain, inputs, opts.epoch);
    // Held until the layer is published (or staged): a prune leaves it alone meanwhile.
    let in_use = cache.hold(&key).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })?;
    if opts.use_cache
        && let Some(hit) = cache.get(&key)
    {
        tracing::info!(%key, digest = %hit.digest, "dependency layer from cache");
        return Ok((key, hit, in_use));
    }
    let install = match install.take() {
        Some(install) => install,
        None => resolve_builder(client, opts).await?,
    };
    let output = deps::install(&opts.runtime, inputs, &install, scratch.path()).await?;
    let (dest, tmp, epoch) = (
        opts.runtime.dependencies.dir.clone(),
        cache.tmp_dir(),
        opts.epoch,
    );
    let blob = tokio::task::spawn_blocking(move || -> Result<LayerBlob, Error> {
        let tree =
            source::walk(&output, &source::WalkRules::default()).map_err(function::Error::from)?;
        write_layer(
            tree.to_layer_entries(&dest),
            epoch,
            oci::MediaType::OciLayerGzip,
            &tmp,
        )
        .map_err(|source| Error::Layer {
            what: "dependency",
            source,
        })
    });
    let blob = blob.await??;
    tracing::info!(%key, digest = %blob.descriptor.digest, size = blob.descriptor.size, "wrote dependency layer");
    let cached = cache.put(&key, blob).map_err(|source| Error::Cache {
        path: cache.tmp_dir(),
        source,
    })?;
    Ok((key, cached, in_use))
}
