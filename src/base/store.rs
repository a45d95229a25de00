//! The local image store: an OCI layout under the cache directory holding each runtime's base
//! and builder images, assembled on first use from the recipes and locks compiled into kiln,
//! and the images `kiln build` writes when no registry or layout is named. A file lock keeps
//! concurrent kiln processes from assembling the same runtime twice.

use std::path::Path;

use super::assemble::{self, Assembled, Sources};
use super::recipe;
use crate::image::publish::{LayoutPublisher, PublishInput, Publisher};
use crate::oci::Layout;
use crate::registry::{Client, ClientConfig};

/// Why the store could not provide a runtime's images.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime has no recipe.
    #[error(transparent)]
    Recipe(#[from] recipe::Error),
    /// Assembling failed.
    #[error("assembling the {runtime} base images")]
    Assemble {
        /// The runtime.
        runtime: String,
        /// The cause.
        #[source]
        source: Box<assemble::Error>,
    },
    /// Writing the layout.
    #[error(transparent)]
    Publish(#[from] crate::image::publish::Error),
    /// The store directory or its lock.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
    /// A worker thread died.
    #[error("internal task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// The layout name of a runtime's builder image.
pub fn builder_name(runtime: &str) -> String {
    format!("{runtime}-builder")
}

/// Whether the store at `dir` already holds `runtime`'s base and builder images, assembled
/// by a kiln with this one's recipe, lock and function servers. Images another kiln assembled
/// (before an upgrade, or from another checkout) are not these: a build on them would carry
/// that kiln's server and give another digest than this kiln's, so they are assembled again.
/// Cheap: the fast path of every build on the runtime's own base.
pub fn has_images(dir: &Path, runtime: &str) -> bool {
    has_named(dir, runtime, runtime)
}

/// The layout name of `runtime`'s base image for `platform` in the store: the runtime's name
/// for this machine's platform (what builds use), `RUNTIME-OS-ARCH` for another (what
/// `kiln warm --platform` pushes), as `kiln base build --platform A,B` names them.
pub fn platform_name(runtime: &str, platform: &crate::oci::Platform) -> String {
    let host = crate::oci::Platform::host();
    match platform.os == host.os && platform.architecture == host.architecture {
        true => runtime.to_string(),
        false => format!("{runtime}-{}", platform.file_name()),
    }
}

/// [`has_images`] for `runtime`'s images for `platform`, named by [`platform_name`].
pub fn has_platform_images(dir: &Path, runtime: &str, platform: &crate::oci::Platform) -> bool {
    has_named(dir, runtime, &platform_name(runtime, platform))
}

/// [`has_images`] for `runtime`'s images under `name` and [`builder_name`]`(name)`.
fn has_named(dir: &Path, runtime: &str, name: &str) -> bool {
    let present = |name: &str| {
        Layout::open(dir)
            .and_then(|l| l.resolve(Some(name)))
            .is_ok()
    };
    let current = std::fs::read_to_string(stamp(dir, name))
        .is_ok_and(|s| Some(s.trim()) == assembly_inputs(runtime));
    current && present(name) && present(&builder_name(name))
}

/// Notes in the layout at `dir` that its `runtime` images are what this kiln assembles for the
/// store (the embedded recipe and lock, no SOURCE_DATE_EPOCH), so it can serve as the store.
///
/// # Errors
/// Writing the note.
pub fn mark_assembled(dir: &Path, runtime: &str) -> std::io::Result<()> {
    mark_named(dir, runtime, runtime)
}

fn mark_named(dir: &Path, runtime: &str, name: &str) -> std::io::Result<()> {
    match assembly_inputs(runtime) {
        Some(inputs) => std::fs::write(stamp(dir, name), inputs),
        None => Ok(()),
    }
}

/// Where the store notes what the images named `name` were assembled from.
fn stamp(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!(".assembled-{name}"))
}

/// The fingerprint of what this kiln assembles `runtime`'s images from (build.rs).
fn assembly_inputs(runtime: &str) -> Option<&'static str> {
    crate::runtime::table::ASSEMBLY_INPUTS
        .iter()
        .find(|(r, _)| *r == runtime)
        .map(|(_, f)| *f)
}

/// Makes sure the store at `dir` holds `runtime`'s base and builder images for `platform`
/// (under [`platform_name`]), assembling them (about 15 s, plus downloads the first time)
/// when it does not. The builder carries `kiln_binary`, if given (a kiln for `platform`).
///
/// # Errors
/// Unknown runtime, failed downloads or verification, I/O.
pub async fn ensure(
    src: &Sources,
    runtime: &str,
    dir: &Path,
    kiln_binary: Option<&Path>,
    platform: &crate::oci::Platform,
) -> Result<(), Error> {
    let name = platform_name(runtime, platform);
    let io = |source| {
        Error::Io(crate::io_error::IoError {
            action: "using the image store",
            path: dir.to_path_buf(),
            source,
        })
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let lock_path = dir.join(".lock");
    let lock = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(file)
    })
    .await?
    .map_err(io)?;
    // Another process may have assembled them while this one waited for the lock.
    if has_named(dir, runtime, &name) {
        return Ok(());
    }
    tracing::info!(
        runtime,
        %platform,
        store = %dir.display(),
        "assembling the runtime's base and builder images (first use)",
    );
    let (recipe, lock_file) = recipe::embedded(runtime)?;
    // Shared images: one fixed timestamp, whatever the Function's SOURCE_DATE_EPOCH.
    let arch = &platform.architecture;
    let built = assemble::assemble(src, &recipe, &lock_file, arch, 0, kiln_binary)
        .await
        .map_err(|e| Error::Assemble {
            runtime: runtime.into(),
            source: Box::new(e),
        })?;
    let client = Client::new(ClientConfig::default()).map_err(|e| {
        Error::Io(crate::io_error::IoError {
            action: "using the image store",
            path: dir.into(),
            source: std::io::Error::other(e),
        })
    })?;
    write_layout(&built, &client, dir, &name, &src.cache_dir.join("tmp")).await?;
    mark_named(dir, runtime, &name).map_err(io)?;
    drop(lock);
    Ok(())
}

/// Writes `built`'s base and builder images into the layout at `dir`, named `runtime` and
/// [`builder_name`]; returns their references (`oci:DIR@sha256:…`), base first.
///
/// # Errors
/// When writing the layout fails.
pub async fn write_layout(
    built: &Assembled,
    client: &Client,
    dir: &Path,
    runtime: &str,
    scratch: &Path,
) -> Result<Vec<String>, crate::image::publish::Error> {
    let mut references = Vec::new();
    for (assembly, name) in [
        (&built.base, runtime.to_string()),
        (&built.builder, builder_name(runtime)),
    ] {
        let input = PublishInput {
            image: &assembly.image,
            layers: &assembly.layers,
            base: None,
            scratch,
        };
        let publisher = LayoutPublisher {
            client: client.clone(),
            dir: dir.to_path_buf(),
            name,
            jobs: 4,
        };
        references.push(publisher.publish(input).await?.reference);
    }
    Ok(references)
}

#[cfg(test)]
mod tests {
    use super::{assembly_inputs, builder_name, has_images, stamp};

    /// A layout whose index names `runtime`'s base and builder (no blobs: only names count).
    fn named_layout(runtime: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        let entry = |name: &str| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", "a".repeat(64)),
                "size": 1,
                "annotations": {"org.opencontainers.image.ref.name": name},
            })
        };
        let index = serde_json::json!({
            "schemaVersion": 2,
            "manifests": [entry(runtime), entry(&builder_name(runtime))],
        });
        std::fs::write(dir.path().join("index.json"), index.to_string()).unwrap();
        dir
    }

    #[test]
    fn images_another_kiln_assembled_are_not_reused() {
        let store = named_layout("nodejs22");
        // Named, but with no note of what they were assembled from (a store of an older kiln).
        assert!(!has_images(store.path(), "nodejs22"));
        std::fs::write(stamp(store.path(), "nodejs22"), "0123456789abcdef").unwrap();
        assert!(
            !has_images(store.path(), "nodejs22"),
            "another kiln's inputs"
        );
        let current = assembly_inputs("nodejs22").unwrap();
        std::fs::write(stamp(store.path(), "nodejs22"), current).unwrap();
        assert!(has_images(store.path(), "nodejs22"));
        // Each runtime has inputs of its own (its recipe and lock).
        assert_ne!(assembly_inputs("nodejs24"), Some(current));
    }
}
