//! The runtime catalog: `runtimes/<name>/runtime.toml`, embedded in the binary, parsed into
//! validated [`RuntimeSpec`]s. Pure: no I/O beyond the embedded text.

pub mod abi;
pub mod alias;
mod catalog;
mod manifest;
mod registry_only;
pub mod table;

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

pub use alias::Alias;
pub use catalog::{Catalog, UnknownRuntime};
pub use manifest::{ManifestError, has_dependencies, validate_manifest};
pub use registry_only::{check_lock_registry_only, check_registry_only};

/// A runtime name (`nodejs22`, `python313`): lowercase letters and digits.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuntimeName(String);

impl RuntimeName {
    /// Parses a runtime name.
    pub fn parse(s: &str) -> Option<RuntimeName> {
        let ok = !s.is_empty()
            && s.len() <= 32
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        ok.then(|| RuntimeName(s.to_string()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RuntimeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The language family, which decides how dependency manifests are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Node.js: package.json.
    Nodejs,
    /// Python: requirements.txt.
    Python,
}

/// A runtime: where things go in the image and how dependencies are installed.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Its name.
    pub name: String,
    /// Its language.
    pub language: Language,
    /// One line for `--help` and error messages.
    pub description: String,
    /// The default base image reference, if the runtime has one.
    #[serde(default)]
    pub base: Option<String>,
    /// The Function's source files.
    pub source: SourceSpec,
    /// The dependency install.
    pub dependencies: DependencySpec,
    /// Config the image gets.
    pub image: ImageSpec,
}

/// Where the Function's files go.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Absolute directory in the image.
    pub dir: String,
    /// The file that must exist (`handler.js`).
    pub handler: String,
    /// Ignore patterns (gitignore syntax) always applied.
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// How dependencies are installed and where they go.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DependencySpec {
    /// The dependency manifest (`package.json`).
    pub manifest: String,
    /// Lock files; with one present, `install_locked` is used.
    #[serde(default)]
    pub lock_files: Vec<String>,
    /// Package-registry config files: given to the install, never layered.
    #[serde(default)]
    pub config_files: Vec<String>,
    /// The package registries (URLs) a sandboxed install may reach besides those its config
    /// files name.
    #[serde(default)]
    pub registries: Vec<String>,
    /// Absolute directory of the dependency layer in the image.
    pub dir: String,
    /// What the install produces, relative to its working directory.
    pub output: String,
    /// Commands whose output identifies the toolchain (part of the cache key).
    pub toolchain: Vec<Vec<String>>,
    /// What the first toolchain command's output starts with when the toolchain matches the
    /// runtime's base image (`v22.`, `Python 3.13.`).
    #[serde(default)]
    pub toolchain_version: Option<String>,
    /// The install command.
    pub install: Vec<String>,
    /// The install command when a lock file is present.
    #[serde(default)]
    pub install_locked: Option<Vec<String>>,
    /// The environment variable naming the package cache directory.
    #[serde(default)]
    pub cache_env: Option<String>,
    /// The environment variable naming the package-registry config file, for tools that do
    /// not read it from the working directory.
    #[serde(default)]
    pub config_env: Option<String>,
    /// pip's installation report (`--report FILE` in `install`), relative to its working
    /// directory: kiln records from it which archive each distribution came from (PEP 710's
    /// `provenance.json`, for the SBOM).
    #[serde(default)]
    pub report: Option<String>,
    /// The wheels that fit the base image, for installs without pip ([`crate::build::pinned`]).
    #[serde(default)]
    pub wheels: Option<WheelSpec>,
}

/// What decides which Python wheels fit a runtime's base image and how pip would install
/// them there.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WheelSpec {
    /// The CPython minor release (`3.13`).
    pub python: String,
    /// The base image's glibc (`2.41`): the newest manylinux tag that fits.
    pub glibc: String,
    /// The interpreter pip runs as in the builder image (`sys.executable`): the `#!` line of
    /// the scripts it writes.
    pub executable: String,
}

/// Config for the built image.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// The user to run as.
    pub user: Option<String>,
    /// The working directory.
    pub workdir: Option<String>,
    /// Ports to expose.
    #[serde(default)]
    pub ports: Vec<String>,
    /// The entrypoint; unset keeps the base image's.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// Environment, sorted by name.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Why a runtime file is invalid.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// Not TOML of the expected shape.
    #[error("parsing runtimes/{file}/runtime.toml")]
    Parse {
        /// The runtime directory.
        file: String,
        /// The cause.
        #[source]
        source: toml::de::Error,
    },
    /// A rule the shape cannot express.
    #[error("runtimes/{file}/runtime.toml: {problem}")]
    Invalid {
        /// The runtime directory.
        file: String,
        /// What is wrong.
        problem: String,
    },
}

impl RuntimeSpec {
    /// Parses and validates a runtime file; `dir_name` is the folder it came from.
    ///
    /// # Errors
    /// When the TOML is malformed or breaks a rule.
    pub fn parse(dir_name: &str, text: &str) -> Result<RuntimeSpec, SpecError> {
        let spec: RuntimeSpec = toml::from_str(text).map_err(|source| SpecError::Parse {
            file: dir_name.into(),
            source,
        })?;
        let invalid = |problem: String| SpecError::Invalid {
            file: dir_name.into(),
            problem,
        };
        if spec.name != dir_name || RuntimeName::parse(&spec.name).is_none() {
            return Err(invalid(format!(
                "name {:?} must equal its folder name",
                spec.name
            )));
        }
        for (what, dir) in [
            ("source.dir", &spec.source.dir),
            ("dependencies.dir", &spec.dependencies.dir),
        ] {
            if !dir.starts_with('/') || dir.split('/').any(|c| c == "..") {
                return Err(invalid(format!(
                    "{what} {dir:?} must be an absolute clean path"
                )));
            }
        }
        if spec.dependencies.install.is_empty() {
            return Err(invalid("dependencies.install is empty".into()));
        }
        Ok(spec)
    }

    /// The install command for a Function that has (or lacks) a lock file.
    pub fn install_command(&self, locked: bool) -> &[String] {
        match (&self.dependencies.install_locked, locked) {
            (Some(cmd), true) => cmd,
            _ => &self.dependencies.install,
        }
    }

    /// Files of a Function directory that never enter the image.
    pub fn secret_files(&self) -> &[String] {
        &self.dependencies.config_files
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_names_are_validated() {
        assert!(RuntimeName::parse("nodejs22").is_some());
        assert!(RuntimeName::parse("Node").is_none());
        assert!(RuntimeName::parse("").is_none());
        assert!(RuntimeName::parse("../x").is_none());
    }

    #[test]
    fn a_runtime_whose_name_differs_from_its_folder_is_rejected() {
        let text = Catalog::embedded().get("nodejs22").unwrap().name.clone();
        let toml = crate::runtime::catalog::embedded_text("nodejs22").unwrap();
        assert!(RuntimeSpec::parse("nodejs99", toml).is_err());
        assert_eq!(text, "nodejs22");
    }
}
