//! The Function being built, from a directory or from a Kyma `Function` manifest
//! (`serverless.kyma-project.io/v1alpha2`, inline source), checked before anything runs:
//! the handler exists, the dependency manifest parses, secrets are set aside for the install.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::io_error::IoContext as _;
use crate::oci::source::{self, Tree, WalkRules};
use crate::oci::{Content, EntryKind};
use crate::runtime::{self, Language, ManifestError, RuntimeSpec};

/// The most kiln reads of a dependency manifest, lock file or registry config: lock files
/// of large projects run to megabytes, never to this.
pub const MAX_DEPENDENCY_FILE: u64 = 64 * 1024 * 1024;
/// A named file's bytes (dependency manifest, lock file, registry config).
#[derive(Clone, Debug)]
pub struct NamedBytes {
    /// File name.
    pub name: String,
    /// Content.
    pub bytes: Vec<u8>,
}

/// What the dependency install needs.
#[derive(Clone, Debug)]
pub struct DepInputs {
    /// `package.json` / `requirements.txt`.
    pub manifest: NamedBytes,
    /// The lock file, if any.
    pub lock: Option<NamedBytes>,
    /// Package-registry configuration (`.npmrc`, `pip.conf`): may hold credentials.
    pub configs: Vec<NamedBytes>,
}

/// A Function ready to build.
#[derive(Debug)]
pub struct Function {
    /// `FUNC_NAME`.
    pub name: String,
    /// `SERVICE_NAMESPACE`.
    pub namespace: String,
    /// Source files, secrets excluded.
    pub tree: Tree,
    /// The install's inputs; `None` when nothing is to be installed.
    pub deps: Option<DepInputs>,
}

/// Why a Function cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The handler file is missing.
    #[error("{origin} has no {handler}: the {runtime} runtime loads main() from it")]
    MissingHandler {
        /// Where we looked.
        origin: String,
        /// The file name.
        handler: String,
        /// The runtime.
        runtime: String,
    },
    /// The dependency manifest is malformed.
    #[error("invalid dependency manifest in {origin}")]
    Manifest {
        /// Where.
        origin: String,
        /// The problem and its line.
        #[source]
        source: ManifestError,
    },
    /// The Function manifest file is malformed or unsupported.
    #[error("{path}: {problem}")]
    FunctionManifest {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Reading or walking the directory.
    #[error(transparent)]
    Source(#[from] source::Error),
    /// Reading a file.
    #[error(transparent)]
    Io(#[from] crate::io_error::IoError),
}

/// The parts of a Kyma Function manifest kiln builds from.
#[derive(Clone, Debug)]
pub struct FunctionManifest {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, if set.
    pub namespace: Option<String>,
    /// `spec.runtime`.
    pub runtime: String,
    /// `spec.runtimeImageOverride`.
    pub runtime_image_override: Option<String>,
    /// `spec.source.inline.source`.
    pub source: String,
    /// `spec.source.inline.dependencies`.
    pub dependencies: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawFunction {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: RawMeta,
    spec: RawSpec,
}

#[derive(Deserialize)]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    runtime: Option<String>,
    runtime_image_override: Option<String>,
    source: RawSource,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSource {
    inline: Option<RawInline>,
    git_repository: Option<serde_yaml::Value>,
}

#[derive(Deserialize)]
struct RawInline {
    source: String,
    dependencies: Option<String>,
}

impl FunctionManifest {
    /// Reads a `Function` manifest file.
    ///
    /// # Errors
    /// When it is not a v1alpha2 Function with inline source.
    pub fn read(path: &Path) -> Result<FunctionManifest, Error> {
        let text = fs::read_to_string(path).at("reading", path)?;
        let bad = |problem: String| Error::FunctionManifest {
            path: path.into(),
            problem,
        };
        let raw: RawFunction = serde_yaml::from_str(&text)
            .map_err(|e| bad(format!("not a Function manifest: {e}")))?;
        if raw.kind.as_deref() != Some("Function")
            || raw.api_version.as_deref() != Some("serverless.kyma-project.io/v1alpha2")
        {
            return Err(bad(
                "expected apiVersion serverless.kyma-project.io/v1alpha2, kind Function".into(),
            ));
        }
        let name = raw
            .metadata
            .name
            .ok_or_else(|| bad("metadata.name is missing".into()))?;
        // The name becomes the image name, a store entry and, in a cluster, a Service name.
        crate::k8s_names::dns1035_label(&name)
            .map_err(|e| bad(format!("metadata.name {name:?} is not a valid name: {e}")))?;
        if let Some(ns) = &raw.metadata.namespace {
            crate::k8s_names::dns1123_label(ns)
                .map_err(|e| bad(format!("metadata.namespace {ns:?} is not valid: {e}")))?;
        }
        let runtime = raw
            .spec
            .runtime
            .ok_or_else(|| bad("spec.runtime is missing".into()))?;
        let inline = match (raw.spec.source.inline, raw.spec.source.git_repository) {
            (Some(inline), None) => inline,
            (None, Some(_)) => {
                return Err(bad(
                    "spec.source.gitRepository is not built by `kiln build --function`; \
                    build it with --git URL --git-ref REFERENCE --git-base-dir BASEDIR"
                        .into(),
                ));
            }
            _ => {
                return Err(bad(
                    "spec.source must have exactly one of inline and gitRepository".into(),
                ));
            }
        };
        if inline.source.trim().is_empty() {
            return Err(bad("spec.source.inline.source is empty".into()));
        }
        Ok(FunctionManifest {
            name,
            namespace: raw.metadata.namespace,
            runtime,
            runtime_image_override: raw.spec.runtime_image_override.filter(|s| !s.is_empty()),
            source: inline.source,
            dependencies: inline.dependencies,
        })
    }
}

/// Loads a Function from directory `dir`.
///
/// # Errors
/// Missing handler, malformed manifest, unsafe files.
pub fn from_dir(
    dir: &Path,
    runtime: &RuntimeSpec,
    name: String,
    namespace: String,
) -> Result<Function, Error> {
    let rules = WalkRules {
        exclude: runtime.source.exclude.clone(),
        never: runtime.secret_files().to_vec(),
        ignore_file: true,
        absolute_links: false,
        budget: Default::default(),
    };
    let tree = source::walk(dir, &rules)?;
    let origin = dir.display().to_string();
    if !matches!(
        tree.entries.get(&runtime.source.handler),
        Some(EntryKind::File { .. })
    ) {
        return Err(Error::MissingHandler {
            origin,
            handler: runtime.source.handler.clone(),
            runtime: runtime.name.clone(),
        });
    }
    let read = |name: &str| -> Result<Option<NamedBytes>, Error> {
        let path = dir.join(name);
        // Through links inside the Function only: a manifest linked to a host file is refused.
        match crate::rootpath::read_beneath(dir, Path::new(name), MAX_DEPENDENCY_FILE) {
            Ok(bytes) => Ok(Some(NamedBytes {
                name: name.into(),
                bytes,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io(crate::io_error::IoError {
                action: "reading",
                path,
                source,
            })),
        }
    };
    let spec = &runtime.dependencies;
    let deps = match read(&spec.manifest)? {
        None => None,
        Some(manifest) => {
            let lock = spec
                .lock_files
                .iter()
                .find_map(|f| read(f).transpose())
                .transpose()?;
            let configs = spec
                .config_files
                .iter()
                .filter_map(|f| read(f).transpose())
                .collect::<Result<_, _>>()?;
            dep_inputs(runtime.language, &origin, manifest, lock, configs)?
        }
    };
    Ok(Function {
        name,
        namespace,
        tree,
        deps,
    })
}

/// Builds a Function from a manifest's inline source exactly as the cluster would: the
/// source becomes the handler file, the dependencies the dependency manifest (for Node.js an
/// empty value becomes `{}`, as Kyma's controller does).
///
/// # Errors
/// A malformed dependency manifest.
pub fn from_manifest(
    m: &FunctionManifest,
    runtime: &RuntimeSpec,
    namespace: String,
) -> Result<Function, Error> {
    let origin = format!("Function {}", m.name);
    let deps_text = match (runtime.language, m.dependencies.as_deref().map(str::trim)) {
        (Language::Nodejs, None | Some("")) => "{}".to_string(),
        (_, deps) => deps.unwrap_or("").to_string(),
    };
    let mut tree = Tree::default();
    let file = |text: &str| EntryKind::File {
        content: Content::Bytes(text.as_bytes().to_vec()),
        executable: false,
    };
    tree.entries
        .insert(runtime.source.handler.clone(), file(&m.source));
    tree.entries
        .insert(runtime.dependencies.manifest.clone(), file(&deps_text));
    let manifest = NamedBytes {
        name: runtime.dependencies.manifest.clone(),
        bytes: deps_text.into_bytes(),
    };
    let deps = dep_inputs(runtime.language, &origin, manifest, None, vec![])?;
    Ok(Function {
        name: m.name.clone(),
        namespace,
        tree,
        deps,
    })
}

fn dep_inputs(
    language: Language,
    origin: &str,
    manifest: NamedBytes,
    lock: Option<NamedBytes>,
    configs: Vec<NamedBytes>,
) -> Result<Option<DepInputs>, Error> {
    let text = String::from_utf8_lossy(&manifest.bytes);
    runtime::validate_manifest(language, &manifest.name, &text).map_err(|source| {
        Error::Manifest {
            origin: origin.into(),
            source,
        }
    })?;
    let any = runtime::has_dependencies(language, &text);
    Ok(any.then_some(DepInputs {
        manifest,
        lock,
        configs,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Catalog;

    #[test]
    fn a_function_manifest_builds_like_the_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        fs::write(
            &path,
            "apiVersion: serverless.kyma-project.io/v1alpha2\nkind: \
            Function\nmetadata: {name: hello, namespace: team}\nspec:\n  runtime: nodejs22\n  \
            source:\n    inline:\n      source: |\n        module.exports = { main: () => 'hi' \
            }\n",
        )
        .unwrap();
        let m = FunctionManifest::read(&path).unwrap();
        assert_eq!((m.name.as_str(), m.runtime.as_str()), ("hello", "nodejs22"));
        let catalog = Catalog::embedded();
        let f = from_manifest(&m, catalog.get("nodejs22").unwrap(), "team".into()).unwrap();
        assert!(
            f.deps.is_none(),
            "an empty dependency list installs nothing"
        );
        assert!(f.tree.entries.contains_key("handler.js"));
        assert!(f.tree.entries.contains_key("package.json"));
    }

    #[test]
    fn git_sources_and_other_kinds_are_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        fs::write(
            &path,
            "apiVersion: serverless.kyma-project.io/v1alpha2\nkind: \
            Function\nmetadata: {name: x}\nspec: {runtime: python313, source: {gitRepository: \
            {url: u}}}\n",
        )
        .unwrap();
        let err = FunctionManifest::read(&path).unwrap_err().to_string();
        assert!(err.contains("gitRepository"), "{err}");
        fs::write(&path, "kind: Pod\nmetadata: {}\nspec: {source: {}}\n").unwrap();
        assert!(FunctionManifest::read(&path).is_err());
    }

    #[test]
    fn a_missing_handler_names_the_file_and_runtime() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("main.py"), "").unwrap();
        let catalog = Catalog::embedded();
        let err = from_dir(
            dir.path(),
            catalog.get("python313").unwrap(),
            "f".into(),
            "d".into(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("has no handler.py: the python313 runtime loads main() from it"),
            "{err}"
        );
    }
}
