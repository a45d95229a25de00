//! Loading the Function a build works on: from a directory, from a Kyma manifest's inline
//! source, or from a git repository (fetched into scratch space that lives as long as the
//! loaded Function, since its source layer reads the files from there), with the
//! package-registry config of `--package-registry-config` laid over the Function's own.

use std::path::{Path, PathBuf};

use super::error::Error;
use super::function::{self, DepInputs, Function, NamedBytes};
use super::options::{FunctionSpec, Options};
use crate::runtime::RuntimeSpec;

/// A loaded Function and what keeps its files alive.
#[derive(Debug)]
pub struct Loaded {
    /// The Function.
    pub function: Function,
    /// The commit built, for a git source.
    pub commit: Option<String>,
    /// The fetched tree of a git source; the Function's files point into it.
    _checkout: Option<tempfile::TempDir>,
}

/// Loads the Function `opts` describes, using `scratch` for a git checkout. Blocking work
/// (walking, fetching) runs on a blocking thread.
///
/// # Errors
/// The Function's own errors, git errors, an unreadable package-registry config.
pub async fn load(opts: &Options, scratch: &Path) -> Result<Loaded, Error> {
    let (opts, scratch) = (opts.clone(), scratch.to_path_buf());
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(|| load_blocking(&opts, &scratch))).await?
}

fn load_blocking(opts: &Options, scratch: &Path) -> Result<Loaded, Error> {
    let (name, namespace) = (opts.name.clone(), opts.namespace.clone());
    let (mut function, commit, checkout) = match &opts.function {
        FunctionSpec::Dir(dir) => (
            function::from_dir(dir, &opts.runtime, name, namespace)?,
            None,
            None,
        ),
        FunctionSpec::Manifest(m) => (
            function::from_manifest(m, &opts.runtime, namespace)?,
            None,
            None,
        ),
        FunctionSpec::Git { source, access } => {
            let checkout = tempfile::tempdir_in(scratch).map_err(|source| Error::Cache {
                path: scratch.to_path_buf(),
                source,
            })?;
            let tree = checkout.path().join("tree");
            let (function, commit) = fetch(opts, source, access, checkout.path(), &tree)?;
            (function, Some(commit), Some(checkout))
        }
    };
    let origin = || match &opts.function {
        FunctionSpec::Dir(dir) => dir.display().to_string(),
        FunctionSpec::Manifest(m) => format!("Function {}", m.name),
        FunctionSpec::Git { source, .. } => format!("{} ({})", source.url, source.base_dir),
    };
    let refused = |source| function::Error::Manifest {
        origin: origin(),
        source,
    };
    if !opts.allow_direct_deps
        && let Some(deps) = &function.deps
    {
        let text = String::from_utf8_lossy(&deps.manifest.bytes);
        crate::runtime::check_registry_only(opts.runtime.language, &deps.manifest.name, &text)
            .map_err(refused)?;
    }
    if let Some(dir) = &opts.package_registry_config {
        let configs = read_registry_config(dir, &opts.runtime)?;
        if let Some(deps) = &mut function.deps {
            lay_over(deps, configs, &opts.runtime);
        }
    }
    // The lock's sources, against the registries the install may reach: its own
    // (the runtime's) and those the registry config names.
    if !opts.allow_direct_deps
        && let Some(deps) = &function.deps
        && let Some(lock) = &deps.lock
    {
        let registries = &opts.runtime.dependencies.registries;
        let policy = super::egress::Policy::for_install(registries, &deps.configs, &[]);
        let allowed: Vec<String> = policy.hosts().collect();
        let text = String::from_utf8_lossy(&lock.bytes);
        crate::runtime::check_lock_registry_only(&lock.name, &text, &allowed).map_err(refused)?;
    }
    Ok(Loaded {
        function,
        commit,
        _checkout: checkout,
    })
}

/// Fetches the git source into `tree` (which must not exist yet), using `scratch` for the
/// repository, and reads the Function there; also returns the commit.
fn fetch(
    opts: &Options,
    source: &crate::git::Source,
    access: &crate::git::Access,
    scratch: &Path,
    tree: &Path,
) -> Result<(Function, String), Error> {
    let fetched = crate::git::fetch_tree(source, access, scratch, tree)?;
    tracing::info!(
        url = %source.url,
        reference = %source.reference,
        base_dir = %source.base_dir,
        commit = %fetched.commit,
        files = fetched.files,
        "fetched the git source"
    );
    let (name, namespace) = (opts.name.clone(), opts.namespace.clone());
    let function = function::from_dir(tree, &opts.runtime, name, namespace).map_err(|e| {
        Error::GitFunction {
            url: source.url.to_string(),
            commit: fetched.commit.clone(),
            base_dir: source.base_dir.to_string(),
            source: Box::new(e),
        }
    })?;
    Ok((function, fetched.commit))
}

/// `--stage source`: fetches the git `source` into `dest`, which must not exist yet (its
/// parent must), and checks that a Function of `opts`'s runtime is there. The later stages
/// build `dest` as a directory, so only this stage needs the git credentials, and it runs no
/// third-party code. Returns the commit.
///
/// # Errors
/// Git errors; the Function's own errors.
pub async fn run_source(
    opts: &Options,
    source: &crate::git::Source,
    access: &crate::git::Access,
    dest: &Path,
) -> Result<String, Error> {
    let (opts, source, access, dest) = (
        opts.clone(),
        source.clone(),
        access.clone(),
        dest.to_path_buf(),
    );
    let span = tracing::info_span!(
        "build",
        function = %opts.name,
        runtime = %opts.runtime.name,
        stage = "source",
    );
    tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            let scratch = tempfile::tempdir().map_err(|source| Error::Cache {
                path: std::env::temp_dir(),
                source,
            })?;
            fetch(&opts, &source, &access, scratch.path(), &dest).map(|(_, commit)| commit)
        })
    })
    .await?
}

/// The runtime's package-registry config files (`.npmrc`, `pip.conf`) found in `dir`. A
/// mounted Secret's files are symlinks into its `..data` directory, so links are followed.
fn read_registry_config(dir: &Path, runtime: &RuntimeSpec) -> Result<Vec<NamedBytes>, Error> {
    let err = |path: PathBuf| move |source| Error::RegistryConfig { path, source };
    std::fs::read_dir(dir).map_err(err(dir.to_path_buf()))?;
    let mut found = Vec::new();
    for name in runtime.secret_files() {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => found.push(NamedBytes {
                name: name.clone(),
                bytes,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(path)(e)),
        }
    }
    tracing::debug!(files = found.len(), dir = %dir.display(), "package-registry config");
    Ok(found)
}

/// Replaces the Function's own config files with same-named ones from `configs`, keeping
/// the runtime's order (the first is the one the install is pointed at).
fn lay_over(deps: &mut DepInputs, configs: Vec<NamedBytes>, runtime: &RuntimeSpec) {
    let mut merged = Vec::new();
    for name in runtime.secret_files() {
        let pick = configs
            .iter()
            .chain(&deps.configs)
            .find(|c| &c.name == name)
            .cloned();
        merged.extend(pick);
    }
    deps.configs = merged;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounted_config_wins_over_the_functions_own_and_keeps_the_runtime_order() {
        let runtime = crate::runtime::Catalog::embedded()
            .get("nodejs22")
            .expect("nodejs22")
            .clone();
        let nb = |n: &str, b: &str| NamedBytes {
            name: n.into(),
            bytes: b.as_bytes().to_vec(),
        };
        let mut deps = DepInputs {
            manifest: nb("package.json", "{}"),
            lock: None,
            configs: vec![nb(".npmrc", "own")],
        };
        lay_over(&mut deps, vec![nb(".npmrc", "mounted")], &runtime);
        assert_eq!(deps.configs.len(), 1);
        assert_eq!(deps.configs[0].bytes, b"mounted");
        lay_over(&mut deps, vec![], &runtime);
        assert_eq!(deps.configs[0].bytes, b"mounted", "nothing mounted: kept");
    }

    #[test]
    fn a_kubernetes_secret_mount_is_read_through_its_data_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("..2024_01_01");
        std::fs::create_dir(&data).expect("mkdir");
        std::fs::write(data.join(".npmrc"), "//reg/:_authToken=x\n").expect("write");
        std::os::unix::fs::symlink("..2024_01_01", dir.path().join("..data")).expect("link");
        std::os::unix::fs::symlink("..data/.npmrc", dir.path().join(".npmrc")).expect("link");
        let runtime = crate::runtime::Catalog::embedded()
            .get("nodejs22")
            .expect("nodejs22")
            .clone();
        let found = read_registry_config(dir.path(), &runtime).expect("read");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].bytes, b"//reg/:_authToken=x\n");
        let missing = read_registry_config(&dir.path().join("nope"), &runtime);
        assert!(matches!(missing, Err(Error::RegistryConfig { .. })));
    }
}
