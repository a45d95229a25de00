//! `kiln run`: fetch an image (registry or OCI layout), unpack its layers into a root
//! filesystem cached by manifest digest, and run its Entrypoint + Cmd in a rootless
//! bubblewrap sandbox that shares the host network, so the function's `FUNC_PORT` is
//! reachable on the host. It never builds or pushes, and reads no environment variables.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kiln::run::Error> {
//! use kiln::registry::{Client, ClientConfig};
//! let client = Client::new(ClientConfig::default()).expect("client");
//! let opts = kiln::run::Options {
//!     image: "oci:./out@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
//!         .parse()
//!         .expect("image"),
//!     platform: kiln::oci::Platform::linux_amd64(),
//!     cache_dir: "/tmp/kiln-cache".into(),
//!     env: vec![("FUNC_PORT".into(), "8080".into())],
//!     args: None,
//!     entrypoint: None,
//!     user: None,
//!     jobs: 4,
//!     max_unpacked: kiln::run::unpack::DEFAULT_LIMIT,
//! };
//! let code: u8 = kiln::run::run(&client, &opts, &[]).await?;
//! # let _ = code; Ok(()) }
//! ```

pub mod cache;
pub mod chain;
mod error;
pub mod image;
pub mod process;
pub mod reference;
pub mod unpack;
pub mod user;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

pub use error::Error;
pub use reference::{ImageRef, Selector};

pub use self::cache::Entry;
use self::cache::{RootfsCache, Staging};
use self::image::{LayerFile, Resolved};
use self::unpack::Unpacker;
use crate::io_error::IoContext as _;
use crate::oci::{Descriptor, Digest, ImageConfig, Platform};
use crate::registry::Client;
use crate::sandbox::Bind;
use crate::sandbox::emulator::Emulator;

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to run and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// The image.
    pub image: ImageRef,
    /// The platform picked from a multi-platform image.
    pub platform: Platform,
    /// kiln's cache directory; rootfs trees go under `rootfs/`.
    pub cache_dir: PathBuf,
    /// Environment variables set on top of the image's `Env` (later entries win).
    pub env: Vec<(String, String)>,
    /// Arguments replacing the image's `Cmd` (its `Entrypoint` is kept).
    pub args: Option<Vec<String>>,
    /// A command replacing the image's `Entrypoint`; the image's `Cmd` is then dropped too
    /// (as `docker run --entrypoint` and a Kubernetes container's `command` do), so only
    /// [`Options::args`] follow it.
    pub entrypoint: Option<Vec<String>>,
    /// Numeric ids replacing the image's `User`.
    pub user: Option<user::Ids>,
    /// Parallel layer downloads.
    pub jobs: usize,
    /// The most bytes of file contents the image may unpack to.
    pub max_unpacked: u64,
}

/// Runs the image, with `volumes` (host paths) bound into its sandbox after everything else,
/// and returns the exit code to exit with (the function's, or 128 + the signal that ended
/// it). SIGINT and SIGTERM are forwarded to the function once it runs; before that they stop
/// kiln with [`Error::Interrupted`].
///
/// # Errors
/// bwrap missing or unusable, the image unavailable or malformed, layers that fail to
/// unpack, a config that cannot be run.
pub async fn run(client: &Client, opts: &Options, volumes: &[Bind]) -> Result<u8> {
    let mut signals = process::Signals::install()?;
    let entry = tokio::select! {
        entry = prepare(client, opts) => entry?,
        signal = signals.recv() => return Err(Error::Interrupted { signal }),
    };
    let image_platform = Platform {
        os: entry.config.os.clone(),
        ..Platform::linux(&entry.config.architecture)
    };
    if !opts.platform.matches(&image_platform) {
        tracing::warn!(
            image = %image_platform,
            wanted = %opts.platform,
            "the image is for another platform",
        );
    }
    // A foreign image runs under the emulator (checked before anything is planned).
    let emulator = Emulator::for_machine(
        image_platform
            .machine()
            .filter(|_| image_platform.os == "linux"),
        &image_platform.to_string(),
    )?;
    let mut launch = {
        let (opts, volumes) = (opts.clone(), volumes.to_vec());
        let plan = move || process::plan(&entry.rootfs, &entry.config, &opts, &volumes);
        tokio::task::spawn_blocking(plan)
            .await
            .map_err(Error::Task)??
    };
    if let Some(emulator) = emulator {
        tracing::info!(
            emulator = %emulator.path.display(),
            image = %image_platform,
            "running the image under emulation",
        );
        launch.argv = emulator.apply(&mut launch.sandbox, &launch.argv);
    }
    tracing::info!(
        argv = ?launch.argv,
        uid = launch.sandbox.uid,
        gid = launch.sandbox.gid,
        cwd = %launch.sandbox.cwd,
        "starting the function"
    );
    process::supervise(&launch, &mut signals).await
}

/// Checks bwrap, then finds the image's rootfs in the cache or unpacks it there (every layer
/// verified). Also used to get a builder image's root filesystem for sandboxed installs.
///
/// # Errors
/// No bwrap, an unreachable or lying registry, a malformed image.
pub async fn prepare(client: &Client, opts: &Options) -> Result<Entry> {
    crate::sandbox::check_available().await?;
    let cache = RootfsCache::new(&opts.cache_dir);
    if let Some(digest) = pinned_digest(&opts.image)
        && let Some(entry) = lookup(&cache, digest).await?
    {
        tracing::info!(%digest, rootfs = %entry.rootfs.display(), "rootfs from cache");
        return Ok(entry);
    }
    tracing::info!(image = %opts.image, "resolving image");
    let resolved = image::resolve(client, &opts.image, &opts.platform).await?;
    if let Some(entry) = lookup(&cache, &resolved.digest).await? {
        let digest = &resolved.digest;
        tracing::info!(%digest, rootfs = %entry.rootfs.display(), "rootfs from cache");
        return Ok(entry);
    }
    let (found, held) = {
        let (cache, digest) = (cache.clone(), resolved.digest.clone());
        tokio::task::spawn_blocking(move || -> Result<_> {
            // In use from now on: a prune cannot remove the entry between its unpack and
            // its run.
            let in_use = cache.hold(&digest)?;
            let in_use = match cache.lookup_holding(&digest, in_use) {
                Ok(entry) => return Ok((Some(entry), None)),
                Err(in_use) => in_use,
            };
            let unpacking = cache.lock_unpack(&digest)?;
            // Whoever unpacked before us may have committed it.
            Ok(match cache.lookup_holding(&digest, in_use) {
                Ok(entry) => (Some(entry), None),
                Err(in_use) => (None, Some((in_use, unpacking))),
            })
        })
        .await
        .map_err(Error::Task)??
    };
    if let Some(entry) = found {
        let digest = &resolved.digest;
        tracing::info!(%digest, rootfs = %entry.rootfs.display(), "rootfs from cache");
        return Ok(entry);
    }
    let config = image::fetch_config(client, &resolved).await?;
    let mut entry = unpack_image(client, &cache, resolved, config, opts).await?;
    if let Some((in_use, _unpacking)) = held {
        // The unpack lock is released here, after the entry is committed.
        entry.in_use = in_use;
    }
    Ok(entry)
}

/// The digest the reference pins, when it names one.
fn pinned_digest(image: &ImageRef) -> Option<&Digest> {
    match image {
        ImageRef::Registry(r) => r.digest.as_ref(),
        ImageRef::Layout {
            selector: Selector::Digest(d),
            ..
        } => Some(d),
        ImageRef::Layout { .. } => None,
    }
}

async fn lookup(cache: &RootfsCache, digest: &Digest) -> Result<Option<Entry>> {
    let (cache, digest) = (cache.clone(), digest.clone());
    tokio::task::spawn_blocking(move || cache.lookup(&digest))
        .await
        .map_err(Error::Task)
}

/// Downloads layers (up to `jobs` at once) while applying them in order in a staging
/// directory, then commits it to the cache.
async fn unpack_image(
    client: &Client,
    cache: &RootfsCache,
    resolved: Resolved,
    config_bytes: Vec<u8>,
    opts: &Options,
) -> Result<Entry> {
    let config: ImageConfig =
        serde_json::from_slice(&config_bytes).map_err(|source| Error::Malformed {
            digest: resolved.manifest.config.digest.clone(),
            source,
        })?;
    let layers = resolved.manifest.layers.clone();
    let diff_ids = config.rootfs.diff_ids.clone();
    if diff_ids.len() != layers.len() {
        return Err(Error::LayerCount {
            layers: layers.len(),
            diff_ids: diff_ids.len(),
        });
    }
    let chains = chain::chain_ids(&diff_ids);
    // The base's layers, stored once unpacked for the next image on the same base.
    let base =
        chain::base_layers(&config, layers.len()).filter(|&b| !cache.has_prefix(&chains[b - 1]));
    let (staging, mut unpacker, start) = {
        let (cache, chains, limit) = (cache.clone(), chains.clone(), opts.max_unpacked);
        tokio::task::spawn_blocking(move || -> Result<_> {
            let staging = cache.stage()?;
            let (unpacker, start) = from_prefix(&cache, &staging, &chains, limit)?;
            Ok((staging, unpacker, start))
        })
        .await
        .map_err(Error::Task)??
    };
    tracing::info!(
        digest = %resolved.digest,
        layers = layers.len(),
        from_cache = start,
        "unpacking image"
    );
    let unpacked = Arc::new(AtomicU64::new(0));
    let _progress = unpack_progress(&layers[start..], unpacked.clone());
    let mut fetches = image::Fetches::start(client, &resolved, &staging.blobs(), opts.jobs, start);
    let layers = layers.into_iter().zip(diff_ids).enumerate().skip(start);
    for (index, (descriptor, diff_id)) in layers {
        let file = fetches.get(index).await?;
        let last_use = fetches.last_use(index);
        let counter = unpacked.clone();
        let store = (base == Some(index + 1))
            .then(|| (cache.clone(), chains[index].clone(), staging.rootfs()));
        unpacker = tokio::task::spawn_blocking(move || -> Result<Unpacker> {
            let layer = LayerAt {
                file: &file,
                descriptor: &descriptor,
                diff_id: &diff_id,
                last_use,
            };
            let unpacker = apply_layer(unpacker, layer, counter)?;
            if let Some((cache, chain, rootfs)) = store {
                store_prefix(&cache, &rootfs, &chain, &unpacker);
            }
            Ok(unpacker)
        })
        .await
        .map_err(Error::Task)??;
    }
    commit(cache, staging, unpacker, &resolved.digest, config_bytes).await
}

/// Copies the longest stored prefix of the image's layers (by their `chains`) into the
/// staging rootfs, and returns the unpacker to go on with and the layers it covers; a fresh
/// unpacker and 0 when none is stored or the copy fails.
fn from_prefix(
    cache: &RootfsCache,
    staging: &Staging,
    chains: &[Digest],
    limit: u64,
) -> Result<(Unpacker, usize)> {
    let rootfs = staging.rootfs();
    let found = (1..=chains.len())
        .rev()
        .find_map(|n| Some((n, cache.lookup_prefix(&chains[n - 1])?)));
    if let Some((layers, prefix)) = found {
        let copied = chain::clone_tree(&prefix.rootfs, &rootfs);
        match copied {
            Ok(entries) => {
                if let Some(unpacker) = Unpacker::resume(&rootfs, limit, &prefix.pending) {
                    tracing::debug!(layers, entries, "rootfs prefix from cache");
                    return Ok((unpacker, layers));
                }
            }
            Err(e) => tracing::warn!(
                prefix = %prefix.rootfs.display(),
                error = %e,
                "could not copy a cached rootfs prefix; unpacking every layer"
            ),
        }
        staging.reset_rootfs()?;
    }
    Ok((Unpacker::with_limit(&rootfs, limit), 0))
}

/// Stores the tree unpacked so far as the prefix of chain ID `chain`: best effort, since the
/// run goes on without it.
fn store_prefix(cache: &RootfsCache, rootfs: &Path, chain: &Digest, unpacker: &Unpacker) {
    let stored = cache.stage().and_then(|prefix| {
        chain::clone_tree(rootfs, &prefix.rootfs()).at("copying the rootfs to", prefix.rootfs())?;
        cache.commit_prefix(prefix, chain, &unpacker.pending())
    });
    match stored {
        Ok(()) => tracing::debug!(%chain, "stored the base's rootfs for other images on it"),
        Err(e) => tracing::warn!(error = %e, "could not store the base's rootfs for reuse"),
    }
}

/// The bytes of the image's layers unpacked so far, against their total: a live line on a
/// terminal, a log line every few seconds elsewhere.
fn unpack_progress(layers: &[Descriptor], done: Arc<AtomicU64>) -> crate::progress::Ticker {
    let total: u64 = layers.iter().map(|d| d.size).sum();
    let label = "unpacking".to_string();
    crate::progress::Ticker::bytes(label, done, Some(total), move |elapsed, unpacked| {
        tracing::info!(
            unpacked = crate::progress::megabytes(unpacked),
            layers = crate::progress::megabytes(total),
            elapsed_s = elapsed.as_secs(),
            "unpacking image"
        );
    })
}

/// A layer to apply: its file, what it must be, and whether a later layer uses the file.
struct LayerAt<'a> {
    file: &'a LayerFile,
    descriptor: &'a Descriptor,
    diff_id: &'a Digest,
    last_use: bool,
}

/// Applies one layer file and checks both of its digests, adding the bytes read to
/// `unpacked`; a downloaded file goes once no later layer uses the same blob.
fn apply_layer(
    mut unpacker: Unpacker,
    layer: LayerAt<'_>,
    unpacked: Arc<AtomicU64>,
) -> Result<Unpacker> {
    let LayerAt {
        file,
        descriptor,
        diff_id,
        last_use,
    } = layer;
    let path = file.path();
    let io_err = |action| {
        move |source| {
            Error::Io(crate::io_error::IoError {
                action,
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let mut blob = std::fs::File::open(path).map_err(io_err("opening layer"))?;
    if let LayerFile::InLayout(_) = file {
        // A download was verified as it arrived; a layout's blob is verified before a byte
        // of it is unpacked (and again while unpacking, in case it changes meanwhile).
        let mut hashing = crate::oci::HashingReader::new(&mut blob);
        std::io::copy(&mut hashing, &mut std::io::sink()).map_err(io_err("reading layer"))?;
        let (actual, _) = hashing.finish();
        if actual != descriptor.digest {
            return Err(Error::LayerDigest {
                expected: descriptor.digest.clone(),
                actual,
            });
        }
        std::io::Seek::rewind(&mut blob).map_err(io_err("reading layer"))?;
    }
    let blob = crate::progress::Counted::new(blob, unpacked);
    let applied = unpacker.apply(blob).map_err(|source| Error::Unpack {
        digest: descriptor.digest.clone(),
        source,
    })?;
    if applied.digest != descriptor.digest {
        return Err(Error::LayerDigest {
            expected: descriptor.digest.clone(),
            actual: applied.digest,
        });
    }
    if applied.diff_id != *diff_id {
        return Err(Error::DiffId {
            layer: descriptor.digest.clone(),
            expected: diff_id.clone(),
            actual: applied.diff_id,
        });
    }
    if let LayerFile::Downloaded(path) = file
        && last_use
    {
        let _ = std::fs::remove_file(path);
    }
    tracing::debug!(digest = %descriptor.digest, "applied layer");
    Ok(unpacker)
}

async fn commit(
    cache: &RootfsCache,
    staging: Staging,
    unpacker: Unpacker,
    digest: &Digest,
    config: Vec<u8>,
) -> Result<Entry> {
    let cache = cache.clone();
    let digest = digest.clone();
    let entry = tokio::task::spawn_blocking(move || {
        staging.add_mount_points()?;
        unpacker.finish().map_err(Error::Finish)?;
        cache.commit(staging, &digest, &config)
    })
    .await
    .map_err(Error::Task)??;
    tracing::info!(rootfs = %entry.rootfs.display(), "rootfs unpacked");
    Ok(entry)
}
