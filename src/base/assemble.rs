//! Assembling the base and builder images from a lock ([`super::lock`] makes it). Layers, base
//! first: Debian packages with the synthesized distroless files, the runtime from npm, Kyma's
//! runtime packages, Python bytecode, the function server, the SBOM; the builder adds its
//! Debian packages, npm tooling and the kiln binary.

use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::bytecode::Compiler;
use super::debian::{self, LockedPackage};
use super::packages;
use super::recipe::{BytecodeRecipe, Lock, Recipe, Target};
use super::rootfs;
use crate::fetch::npm;
use crate::image::publish::{BlobPlan, Role};
use crate::io_error::IoContext as _;
use crate::oci::source;
use crate::oci::{
    self, ConfigEdit, Content, EntryKind, Image, LayerBlob, LayerEntry, MediaType, NewLayer,
};
use crate::runtime::abi::{self, Abi};

mod config;
mod error;
mod inventory;
use config::{builder_edit, config_edit, kiln_edit, scratch};
pub use error::Error;
use inventory::{NODE_VERSION_H, SbomEntry};

/// Where the builder image has the kiln binary; its entrypoint.
pub const KILN_IN_BUILDER: &str = "/usr/local/bin/kiln";

/// Where packages come from.
#[derive(Clone, Debug)]
pub struct Sources {
    /// HTTP client for the mirror and the npm registry.
    pub http: reqwest::Client,
    /// The Debian mirror root.
    pub mirror: url::Url,
    /// The npm registry.
    pub npm_registry: url::Url,
    /// The keyring that signs the mirror's InRelease.
    pub keyring: PathBuf,
    /// Download cache.
    pub cache_dir: PathBuf,
    /// `kiln base lock --allow-expired-release` (see [`debian::Mirror`]).
    pub allow_expired_release: bool,
}

type Result<T, E = Error> = std::result::Result<T, E>;

pub use super::lock::lock;

/// An assembled image with the files of its layers.
#[derive(Debug)]
pub struct Assembly {
    /// Manifest and config.
    pub image: Image,
    /// Every layer blob with its local file.
    pub layers: Vec<BlobPlan>,
}

/// Both images of a runtime.
#[derive(Debug)]
pub struct Assembled {
    /// The runtime base image.
    pub base: Assembly,
    /// The builder image (base + toolchain + kiln).
    pub builder: Assembly,
    /// The kiln image: the runtime's Debian layer (libc, CA certificates, the distroless
    /// files; what the Dockerfile's distroless/cc base holds) and kiln, running as 65532.
    /// `None` without a kiln binary for the architecture.
    pub kiln: Option<Assembly>,
    _blobs: Vec<LayerBlob>,
    _staging: TempDir,
}

/// Assembles the base and builder images of `recipe` for `arch` from `lock`. `kiln_binary`
/// (a kiln for `arch`) goes into the builder, and makes the kiln image; without it the builder
/// serves sandboxed installs (which run its toolchain, not kiln) but not build Jobs. A
/// foreign architecture's Python bytecode is compiled under emulation.
///
/// # Errors
/// Downloads that fail verification, unpack and layer errors, a lock without `arch`, no
/// emulator for a foreign interpreter.
pub async fn assemble(
    src: &Sources,
    recipe: &Recipe,
    lock: &Lock,
    arch: &str,
    epoch: u64,
    kiln_binary: Option<&Path>,
) -> Result<Assembled> {
    if lock.runtime != recipe.runtime {
        return Err(Error::StaleLock {
            wanted: recipe.runtime.clone(),
            found: lock.runtime.clone(),
        });
    }
    let all_arches = lock;
    let lock = &lock.for_arch(arch).ok_or_else(|| Error::NoArchitecture {
        runtime: recipe.runtime.clone(),
        arch: arch.to_string(),
        available: lock.architectures().join(", "),
    })?;
    let tmp = src.cache_dir.join("tmp");
    std::fs::create_dir_all(&tmp).at("using", &tmp)?;
    let staging = tempfile::tempdir_in(&tmp).at("using", &tmp)?;
    let mut stage = Stage {
        src,
        dir: staging.path().to_path_buf(),
        platform: oci::Platform::linux(arch),
        epoch,
        blobs: Vec::new(),
        sbom: Vec::new(),
        abi: Abi::default(),
    };

    let base_debs: Vec<LockedPackage> = lock.debs(Target::Base).cloned().collect();
    inventory::debian_abi(&mut stage.abi, &base_debs);
    let debian_base = stage.debian_layer("debian", &base_debs, true).await?;
    let runtime = stage
        .npm_layer("runtime", lock, recipe, Target::Base)
        .await?;
    let mut base_layers = vec![debian_base.clone(), runtime];
    if let Some(layer) = stage.packages_layer(lock, recipe).await? {
        base_layers.push(layer);
    }
    if let Some(bytecode) = &recipe.image.bytecode {
        let native = super::bytecode::native_python(all_arches, lock, arch);
        base_layers.push(stage.bytecode_layer(bytecode, recipe, native).await?);
    }
    base_layers.push(stage.server_layer(recipe)?);
    base_layers.push(stage.sbom_layer(&recipe.runtime)?);
    // The base's config describes the base's packages only.
    let base_edit = config_edit(
        recipe,
        epoch,
        &inventory::sbom_label(&stage.sbom),
        &stage.abi,
    );
    let kiln_debs: Vec<LockedPackage> = lock.debs(Target::Kiln).cloned().collect();
    let builder_debs: Vec<LockedPackage> = lock.debs(Target::Builder).cloned().collect();
    let mut builder_layers = base_layers.clone();
    let kiln_debian = match kiln_debs.is_empty() {
        true => None,
        false => Some(stage.debian_layer("kiln-debian", &kiln_debs, false).await?),
    };
    builder_layers.extend(kiln_debian.clone());
    builder_layers.push(
        stage
            .debian_layer("builder-debian", &builder_debs, false)
            .await?,
    );
    builder_layers.push(
        stage
            .npm_layer("builder-npm", lock, recipe, Target::Builder)
            .await?,
    );
    let kiln_dest = KILN_IN_BUILDER.trim_start_matches('/');
    let kiln_layer = kiln_binary
        .map(|binary| stage.file_layer("kiln", binary, kiln_dest))
        .transpose()?;
    builder_layers.extend(kiln_layer.clone());
    // The builder's SBOM lists its own packages too (the base's stays the base's).
    builder_layers.push(stage.sbom_layer(&recipe.runtime)?);

    let builder_edit = builder_edit(
        config_edit(
            recipe,
            epoch,
            &inventory::sbom_label(&stage.sbom),
            &stage.abi,
        ),
        recipe,
    );
    let base = stage.image(&base_layers, &base_edit)?;
    let builder = stage.image(&builder_layers, &builder_edit)?;
    let kiln = match kiln_layer {
        Some(kiln_layer) => {
            let layers: Vec<NewLayer> = [Some(debian_base), kiln_debian, Some(kiln_layer)]
                .into_iter()
                .flatten()
                .collect();
            Some(stage.image(&layers, &kiln_edit(epoch))?)
        }
        None => None,
    };
    Ok(Assembled {
        base,
        builder,
        kiln,
        _blobs: stage.blobs,
        _staging: staging,
    })
}

struct Stage<'a> {
    src: &'a Sources,
    dir: PathBuf,
    platform: oci::Platform,
    epoch: u64,
    blobs: Vec<LayerBlob>,
    sbom: Vec<SbomEntry>,
    /// What native code built against the base needs of it, for its labels.
    abi: Abi,
}

impl Stage<'_> {
    fn scratch(&self, name: &str) -> Result<PathBuf> {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).at("using", &dir)?;
        Ok(dir)
    }

    /// `debs` unpacked into a scratch tree `name`, without synthesised files.
    async fn debian_tree(&self, name: &'static str, debs: &[LockedPackage]) -> Result<PathBuf> {
        let root = self.scratch(name)?;
        let files = debian::fetch_debs(
            &self.src.http,
            &self.src.mirror,
            debs,
            &self.src.cache_dir,
            4,
        )
        .await?;
        let root2 = root.clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            debian::merged_usr_links(&root2)?;
            for file in &files {
                debian::unpack_deb(file, &root2)?;
            }
            Ok(())
        })
        .await??;
        Ok(root)
    }

    async fn debian_layer(
        &mut self,
        name: &'static str,
        debs: &[LockedPackage],
        with_base_files: bool,
    ) -> Result<NewLayer> {
        let root = self.debian_tree(name, debs).await?;
        let root2 = root.clone();
        let debs2 = debs.to_vec();
        let licenses = tokio::task::spawn_blocking(move || -> Result<Vec<Vec<String>>> {
            let licenses = debs2
                .iter()
                .map(|p| debian::licenses(&root2, &p.name))
                .collect();
            if with_base_files {
                rootfs::synthesize(&root2)?;
            } else {
                rootfs::synthesize_builder(&root2)?;
            }
            Ok(licenses)
        })
        .await??;
        for (p, licenses) in debs.iter().zip(licenses) {
            self.sbom.push(SbomEntry {
                name: p.name.clone(),
                version: p.version.clone(),
                origin: "debian",
                licenses,
                in_label: true,
            });
        }
        self.tree_layer(
            name,
            &root,
            format!("kiln base: {} Debian packages", debs.len()),
        )
        .await
    }

    async fn npm_layer(
        &mut self,
        name: &'static str,
        lock: &Lock,
        recipe: &Recipe,
        image: Target,
    ) -> Result<NewLayer> {
        let root = self.scratch(name)?;
        for (pinned, wanted) in lock
            .first
            .npm
            .iter()
            .filter(|n| n.image == image)
            .zip(recipe.npm.iter().filter(|n| n.image == image))
        {
            let tgz = pinned
                .tarball
                .fetch(&self.src.http, &self.src.npm_registry, &self.src.cache_dir)
                .await?;
            let dest = root.join(wanted.dest.trim_start_matches('/'));
            let include: Vec<&str> = wanted.include.iter().map(String::as_str).collect();
            npm::unpack(&tgz, &include, &dest)?;
            for [link, target] in &wanted.links {
                let path = root.join(link.trim_start_matches('/'));
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).at("using", parent)?;
                }
                std::os::unix::fs::symlink(target, &path).at("using", &path)?;
            }
            if image == Target::Base
                && let Some(header) = npm::read_member(&tgz, NODE_VERSION_H, 1 << 20)
            {
                self.abi.node = abi::node_version_header(&String::from_utf8_lossy(&header));
            }
            self.sbom.push(SbomEntry {
                name: pinned.tarball.package.clone(),
                version: pinned.tarball.version.clone(),
                origin: "npm",
                licenses: super::licenses::npm_tarball(&tgz),
                in_label: true,
            });
        }
        self.tree_layer(name, &root, format!("kiln base: {name}"))
            .await
    }

    /// Kyma's runtime packages, in a layer of their own (absent without any).
    async fn packages_layer(&mut self, lock: &Lock, recipe: &Recipe) -> Result<Option<NewLayer>> {
        let Some(wanted) = &recipe.packages else {
            return Ok(None);
        };
        if (!wanted.npm.is_empty() && lock.first.npm_tree.is_empty())
            || (!wanted.pip.is_empty() && lock.first.wheel.is_empty())
        {
            return Err(Error::UnlockedPackages {
                runtime: recipe.runtime.clone(),
            });
        }
        if lock.first.npm_tree.is_empty() && lock.first.wheel.is_empty() {
            return Ok(None);
        }
        let root = self.scratch("packages")?;
        let dest = root.join(wanted.dest.trim_start_matches('/'));
        packages::install_npm(
            &self.src.http,
            &self.src.npm_registry,
            &self.src.cache_dir,
            &lock.first.npm_tree,
            &dest,
        )
        .await?;
        packages::install_wheels(
            &self.src.http,
            &self.src.cache_dir,
            &lock.first.wheel,
            &dest,
        )
        .await?;
        let mut seen = std::collections::BTreeSet::new();
        for p in &lock.first.npm_tree {
            if seen.insert((&p.tarball.package, &p.tarball.version)) {
                let manifest = dest.join(&p.path).join("package.json");
                self.sbom.push(SbomEntry {
                    name: p.tarball.package.clone(),
                    version: p.tarball.version.clone(),
                    origin: "npm",
                    licenses: std::fs::read(&manifest)
                        .map(|b| super::licenses::npm_declared(&b))
                        .unwrap_or_default(),
                    in_label: false,
                });
            }
        }
        let mut wheel_licenses = super::licenses::installed_wheels(&dest);
        for w in &lock.first.wheel {
            self.sbom.push(SbomEntry {
                name: w.name.clone(),
                version: w.version.clone(),
                origin: "pypi",
                licenses: wheel_licenses
                    .remove(&super::licenses::normalise(&w.name))
                    .unwrap_or_default(),
                in_label: false,
            });
        }
        let count = lock.first.npm_tree.len() + lock.first.wheel.len();
        let layer = self
            .tree_layer(
                "packages",
                &root,
                format!(
                    "kiln base: Kyma's runtime packages ({count}) in {}",
                    wanted.dest
                ),
            )
            .await?;
        Ok(Some(layer))
    }

    /// The .pyc files of [`BytecodeRecipe::dirs`], compiled by the image's interpreter in the
    /// sandbox over the Debian tree, with the runtime packages bound in (read-only) and only the
    /// output directory writable.
    async fn bytecode_layer(
        &mut self,
        bytecode: &BytecodeRecipe,
        recipe: &Recipe,
        native: Option<Vec<LockedPackage>>,
    ) -> Result<NewLayer> {
        let fail = |detail: String| Error::Bytecode {
            python: bytecode.python.clone(),
            detail,
        };
        let out = self.scratch("bytecode")?;
        let packages = recipe.packages.as_ref().map(|p| {
            (
                self.dir
                    .join("packages")
                    .join(p.dest.trim_start_matches('/')),
                p.dest.clone(),
            )
        });
        let compiler = match native {
            Some(debs) => Compiler::Native(self.debian_tree("native-python", &debs).await?),
            None => Compiler::Own(self.platform.clone()),
        };
        super::bytecode::compile(
            bytecode,
            &self.dir.join("debian"),
            packages,
            &out,
            &compiler,
        )
        .await
        .map_err(fail)?;
        self.tree_layer(
            "bytecode",
            &out,
            format!(
                "kiln base: Python bytecode of {} in {}",
                bytecode.dirs.join(", "),
                bytecode.prefix
            ),
        )
        .await
    }

    fn server_layer(&mut self, recipe: &Recipe) -> Result<NewLayer> {
        let file = |path: String, text: &str| LayerEntry {
            path,
            kind: EntryKind::File {
                content: Content::Bytes(text.as_bytes().to_vec()),
                executable: false,
            },
        };
        let dest = recipe.image.server_dest.trim_start_matches('/');
        let dir = dest.rsplit_once('/').map_or("", |(dir, _)| dir);
        let mut entries = Vec::new();
        if let Some(server) = super::servers::server(&recipe.image.server) {
            entries.push(file(dest.to_string(), server.main));
            for (path, text) in server.beside {
                let path = if dir.is_empty() {
                    (*path).to_string()
                } else {
                    format!("{dir}/{path}")
                };
                entries.push(file(path, text));
            }
        }
        self.write(
            "server",
            entries,
            format!("kiln base: function server {}", recipe.image.server_dest),
        )
    }

    fn sbom_layer(&mut self, runtime: &str) -> Result<NewLayer> {
        let bytes = inventory::sbom_document(runtime, &self.sbom);
        let entry = LayerEntry {
            path: "usr/share/kiln/sbom.json".into(),
            kind: EntryKind::File {
                content: Content::Bytes(bytes),
                executable: false,
            },
        };
        self.write("sbom", vec![entry], "kiln base: SBOM".into())
    }

    fn file_layer(&mut self, name: &'static str, file: &Path, dest: &str) -> Result<NewLayer> {
        let entry = LayerEntry {
            path: dest.into(),
            kind: EntryKind::File {
                content: Content::Path(file.to_path_buf()),
                executable: true,
            },
        };
        self.write(name, vec![entry], format!("kiln base: /{dest}"))
    }

    async fn tree_layer(
        &mut self,
        name: &'static str,
        root: &Path,
        created_by: String,
    ) -> Result<NewLayer> {
        let rules = source::WalkRules {
            absolute_links: true,
            ..source::WalkRules::default()
        };
        let tree = source::walk(root, &rules)?;
        let entries = tree
            .entries
            .into_iter()
            .map(|(path, kind)| {
                // Only /tmp keeps a mode other than 0755/0644: it must be world-writable.
                let kind = if path == "tmp" {
                    EntryKind::ModeDir(0o1777)
                } else {
                    kind
                };
                LayerEntry { path, kind }
            })
            .collect();
        self.write(name, entries, created_by)
    }

    fn write(
        &mut self,
        what: &'static str,
        entries: Vec<LayerEntry>,
        created_by: String,
    ) -> Result<NewLayer> {
        let blob = oci::layer::write_layer(entries, self.epoch, MediaType::OciLayerGzip, &self.dir)
            .map_err(|source| Error::Layer { what, source })?;
        tracing::info!(
            layer = what,
            digest = %blob.descriptor.digest,
            size = blob.descriptor.size,
            "wrote layer",
        );
        let layer = NewLayer {
            descriptor: blob.descriptor.clone(),
            diff_id: blob.diff_id.clone(),
            created_by,
        };
        self.blobs.push(blob);
        Ok(layer)
    }

    fn image(&self, layers: &[NewLayer], edit: &ConfigEdit) -> Result<Assembly> {
        let image = oci::image::append(&scratch(&self.platform), layers, edit)?;
        let plans = layers
            .iter()
            .map(|l| {
                let file = self
                    .blobs
                    .iter()
                    .find(|b| b.descriptor.digest == l.descriptor.digest)
                    .map(|b| b.file.to_path_buf());
                BlobPlan {
                    descriptor: l.descriptor.clone(),
                    role: Role::Base,
                    local: file,
                    remote: None,
                }
            })
            .collect();
        Ok(Assembly {
            image,
            layers: plans,
        })
    }
}
