//! Checking `kiln build`'s flags and turning them into build [`Options`].

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};

use super::Extra;
use super::GitArgs;
use super::{BuildArgs, CompressionArg, Env, LockfileInstallArg, StageArg, cache_repo};
use crate::build::{
    FunctionSpec, Options, Stage, Target,
    deps::{InstallEnv, Isolation},
    function::FunctionManifest,
};
use crate::image::resolve::BaseRef;
use crate::oci::Platform;
use crate::registry::{ClientConfig, Reference};
use crate::runtime::{Catalog, RuntimeSpec};

pub(super) fn validate(
    args: &BuildArgs,
    env: &Env,
) -> anyhow::Result<(Options, ClientConfig, Extra)> {
    let catalog = Catalog::embedded();
    let manifest = args
        .function
        .as_deref()
        .map(FunctionManifest::read)
        .transpose()?;
    let runtime = pick_runtime(&catalog, args.runtime.as_deref(), manifest.as_ref())?;
    let git = args.git.source()?;
    let (function, default_name, default_ns) = function_spec(args, manifest.as_ref(), git)?;
    let cache_dir = super::super::cache_dir(args.cache_dir.as_deref())?;
    let store = cache_dir.join("store");
    let (base, base_name, default_base) = base_image(args, manifest.as_ref(), runtime, &store)?;
    let platforms = platforms(&args.platform)?;
    if platforms.len() > 1 {
        several_platforms(args)?;
    }
    let platform = platforms[0].clone();
    let name = args.name.clone().unwrap_or(default_name);
    let target = target(args, &store, &name)?;
    let epoch = epoch(env)?;
    let install = install_env(args, env, &cache_dir)?;
    let config = args.registry.client_config()?;
    let stage = stage(args, &function)?;
    let cache_repo = args.cache_repo.as_deref().map(cache_repo).transpose()?;
    let cache_trust = cache_trust(
        args.cache_keys.cache_sign_key.as_deref(),
        &args.cache_keys.cache_trust_key,
        cache_repo.is_some(),
    )?;
    let opts = Options {
        function,
        runtime: runtime.clone(),
        name,
        namespace: args
            .namespace
            .clone()
            .or(default_ns)
            .unwrap_or_else(|| "default".into()),
        base,
        base_name,
        platform,
        target,
        epoch,
        cache_dir,
        use_cache: !args.no_cache,
        jobs: usize::from(args.jobs),
        install,
        stage,
        package_registry_config: args.package_registry_config.clone(),
        allow_direct_deps: args.allow_direct_deps,
        tag_by_key: args.tag_by_key,
        cache_repo,
        cache_trust,
        lookup_dir: args.lookup_dir.clone(),
        compression: match args.compression {
            CompressionArg::Gzip => crate::oci::Compression::Gzip,
            CompressionArg::Zstd => crate::oci::Compression::Zstd,
        },
        lockfile_install: args.lockfile_install == LockfileInstallArg::Auto,
        signing: None,
    };
    let extra = Extra {
        digest_file: args.digest_file.clone(),
        report: args.report.clone(),
        verify: args.verify,
        store: default_base.then_some(store),
        platforms,
    };
    Ok((opts, config, extra))
}

/// `--platform`: one platform, or a comma-separated list of them (each once).
fn platforms(flag: &str) -> anyhow::Result<Vec<Platform>> {
    Platform::parse_list(flag).map_err(|why| anyhow!("--platform {flag:?}: {why}"))
}

/// The flags a build for several platforms (one image each, and an index over them) does not
/// take: each is about one image. (Its stages keep each platform's files in a directory of
/// their own below the stage and lookup directories.)
fn several_platforms(args: &BuildArgs) -> anyhow::Result<()> {
    let one_image = [
        ("--tag-by-key", args.tag_by_key),
        ("--report", args.report.is_some()),
    ];
    match one_image.iter().find(|(_, given)| *given) {
        Some((flag, _)) => Err(anyhow!(
            "{flag} is about one image, and --platform {:?} builds one per platform and an \
                index: build once per platform to use it",
            args.platform
        )),
        None => Ok(()),
    }
}

/// `--cache-sign-key` and `--cache-trust-key`, read. A cache repository needs one of them:
/// without a trusted key no entry could be used.
pub(in crate::cli) fn cache_trust(
    sign: Option<&Path>,
    trust: &[PathBuf],
    cache_repo: bool,
) -> anyhow::Result<crate::build::remote_cache::CacheTrust> {
    use crate::signing::{MAX_KEY_FILE, PublicKey, SigningKey};
    let read = |flag: &str, path: &Path| -> anyhow::Result<String> {
        let bytes = std::fs::File::open(path)
            .and_then(|f| crate::rootpath::read_to_limit(f, MAX_KEY_FILE))
            .with_context(|| format!("reading {flag} {}", path.display()))?;
        String::from_utf8(bytes)
            .map_err(|_| anyhow!("{flag} {}: not a PEM text file", path.display()))
    };
    let sign = sign
        .map(|path| {
            SigningKey::from_pem(&read("--cache-sign-key", path)?)
                .with_context(|| format!("--cache-sign-key {}", path.display()))
        })
        .transpose()?;
    let trusted = trust
        .iter()
        .map(|path| {
            PublicKey::from_pem(&read("--cache-trust-key", path)?)
                .with_context(|| format!("--cache-trust-key {}", path.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let trust = crate::build::remote_cache::CacheTrust::new(sign, trusted);
    if cache_repo && !trust.trusts_any() {
        return Err(anyhow!(
            "--cache-repo needs --cache-trust-key FILE (the public key whose signed entries to \
                use) or --cache-sign-key FILE (the key this build signs its entries with): an \
                entry no trusted key signed could have been stored by anyone who can push there"
        ));
    }
    Ok(trust)
}

/// The Function to build (a manifest, a git source or a directory), its default name and
/// namespace.
fn function_spec(
    args: &BuildArgs,
    manifest: Option<&FunctionManifest>,
    git: Option<(crate::git::Source, crate::git::Access)>,
) -> anyhow::Result<(FunctionSpec, String, Option<String>)> {
    Ok(match (manifest, git) {
        (Some(m), _) => (
            FunctionSpec::Manifest(m.clone()),
            m.name.clone(),
            m.namespace.clone(),
        ),
        (None, Some((source, access))) => {
            let name = GitArgs::default_name(&source);
            (FunctionSpec::Git { source, access }, name, None)
        }
        (None, None) => {
            let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            if !dir.is_dir() {
                return Err(anyhow!(
                    "function directory {} does not exist",
                    dir.display()
                ));
            }
            let name = dir_name(&dir);
            (FunctionSpec::Dir(dir), name, None)
        }
    })
}

/// The base image (`--base`, the manifest's override, the runtime's, or the runtime's own in
/// the local store), its name as given, and whether it is the store's default.
fn base_image(
    args: &BuildArgs,
    manifest: Option<&FunctionManifest>,
    runtime: &RuntimeSpec,
    store: &Path,
) -> anyhow::Result<(BaseRef, String, bool)> {
    let explicit_base = args
        .base
        .clone()
        .or_else(|| manifest.and_then(|m| m.runtime_image_override.clone()))
        .or_else(|| runtime.base.clone());
    let default_base = explicit_base.is_none();
    // Without a base, the runtime's own base image from the local store (built on first use).
    let base_name =
        explicit_base.unwrap_or_else(|| format!("oci:{}:{}", store.display(), runtime.name));
    let base =
        BaseRef::parse(&base_name).with_context(|| format!("invalid --base {base_name:?}"))?;
    if let (false, BaseRef::Layout { dir, .. }) = (default_base, &base)
        && !dir.join("oci-layout").is_file()
    {
        return Err(anyhow!(
            "--base {base_name:?}: {} is not an OCI image layout (it has no oci-layout file); \
         name a layout that `kiln base build` or `skopeo copy` wrote, or a registry reference",
            dir.display()
        ));
    }
    Ok((base, base_name, default_base))
}

/// `--stage` with the directories each stage needs, and no directory a stage does not use.
fn stage(args: &BuildArgs, function: &FunctionSpec) -> anyhow::Result<Stage> {
    let stage = match (args.stage, &args.stage_dir) {
        (StageArg::All, None) => Stage::All,
        (StageArg::All, Some(_)) => {
            return Err(anyhow!(
                "--stage-dir needs --stage deps (which writes it) or --stage publish (which \
                    reads it); a whole build takes no --stage-dir"
            ));
        }
        (StageArg::Deps, Some(dir)) => Stage::Deps(dir.clone()),
        (StageArg::Publish, Some(dir)) => Stage::Publish(dir.clone()),
        (StageArg::Lookup, _) => match &args.lookup_dir {
            Some(dir) => Stage::Lookup(dir.clone()),
            None => return Err(anyhow!("--stage lookup needs --lookup-dir DIR")),
        },
        (StageArg::Source, _) => match (&args.source_dir, function) {
            (Some(dir), FunctionSpec::Git { .. }) => {
                check_new_dir(dir)?;
                Stage::Source(dir.clone())
            }
            (None, _) => return Err(anyhow!("--stage source needs --source-dir DIR")),
            (Some(_), _) => {
                return Err(anyhow!(
                    "--stage source fetches a git source: give --git URL --git-ref REFERENCE"
                ));
            }
        },
        (_, None) => {
            return Err(anyhow!(
                "--stage deps and --stage publish need --stage-dir DIR"
            ));
        }
    };
    if args.source_dir.is_some() && !matches!(stage, Stage::Source(_)) {
        return Err(anyhow!(
            "--source-dir is where --stage source writes the git source; the later stages take it \
            as the Function's directory"
        ));
    }
    if args.lookup_dir.is_some() && matches!(stage, Stage::All | Stage::Source(_)) {
        return Err(anyhow!(
            "--lookup-dir is for split builds: --stage lookup writes it, --stage deps and --stage \
            publish read it"
        ));
    }
    Ok(stage)
}

/// `SOURCE_DATE_EPOCH`, or 0.
fn epoch(env: &Env) -> anyhow::Result<u64> {
    Ok(match &env.source_date_epoch {
        None => 0,
        Some(v) => v
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a whole number of seconds"))?,
    })
}

/// What host installs get from the environment, with the CA bundle checked.
fn install_env(args: &BuildArgs, env: &Env, cache_dir: &Path) -> anyhow::Result<InstallEnv> {
    let install = InstallEnv {
        path: env.path.clone(),
        ca_bundle: args.ca_bundle.clone().or_else(|| env.ssl_cert_file.clone()),
        proxy: env.proxy.clone(),
        package_cache: cache_dir.join("packages"),
        isolation: Isolation::Host,
        no_emulation: args.no_emulation,
    };
    if let Some(ca) = &install.ca_bundle
        && !ca.is_file()
    {
        return Err(anyhow!("CA bundle {} does not exist", ca.display()));
    }
    Ok(install)
}

/// `--source-dir`: before any network, a new directory in an existing one.
fn check_new_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.symlink_metadata().is_ok() {
        return Err(anyhow!(
            "--source-dir {} already exists: --stage source writes the Function into a new \
                directory; name one that does not exist yet",
            dir.display()
        ));
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if parent.is_some_and(|p| !p.is_dir()) {
        return Err(anyhow!(
            "--source-dir {}: its parent directory does not exist",
            dir.display()
        ));
    }
    Ok(())
}

fn pick_runtime<'a>(
    catalog: &'a Catalog,
    flag: Option<&str>,
    manifest: Option<&FunctionManifest>,
) -> anyhow::Result<&'a RuntimeSpec> {
    let resolve = |name: &str| -> anyhow::Result<&'a RuntimeSpec> {
        let (spec, alias) = catalog.resolve(name)?;
        if let Some(alias) = alias {
            tracing::warn!("{}", alias.warning(catalog));
        }
        Ok(spec)
    };
    match (flag, manifest) {
        (Some(f), Some(m)) => {
            let (flagged, declared) = (resolve(f)?, resolve(&m.runtime)?);
            if flagged.name != declared.name {
                return Err(anyhow!(
                    "--runtime {f} contradicts spec.runtime {} in the Function manifest: drop \
                        --runtime (the manifest names it), or give --runtime {}",
                    m.runtime,
                    m.runtime
                ));
            }
            Ok(flagged)
        }
        (Some(f), None) => resolve(f),
        (None, Some(m)) => resolve(&m.runtime),
        (None, None) => Err(anyhow!(
            "--runtime is required; known runtimes: {}",
            catalog.names().join(", ")
        )),
    }
}

fn dir_name(dir: &Path) -> String {
    std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "function".into())
}

fn target(args: &BuildArgs, store: &Path, name: &str) -> anyhow::Result<Target> {
    match (&args.image, &args.output) {
        (Some(image), None) => {
            if image.starts_with("oci:") {
                return Err(anyhow!(
                    "--image {image:?} names an OCI layout, and --image pushes to a registry: \
                        to write the layout, use --output {image}"
                ));
            }
            let reference: Reference = image
                .parse()
                .with_context(|| format!("invalid --image {image:?}"))?;
            if reference.digest.is_some() {
                return Err(anyhow!(
                    "--image {image:?} names a digest, which the image's own will replace: name \
                        a repository, optionally with a tag, e.g. --image {}:latest",
                    reference.repository_path()
                ));
            }
            Ok(Target::Registry(reference))
        }
        (None, Some(output)) => {
            let rest = output.strip_prefix("oci:").ok_or_else(|| {
                anyhow!(
                    "--output {output:?} must start with oci: (it writes an OCI layout, e.g. \
                        --output oci:./out); to push to a registry, use --image {output}"
                )
            })?;
            let (dir, name) = crate::oci::layout::split_layout_ref(rest);
            if dir.is_empty() {
                return Err(anyhow!(
                    "--output {output:?} names no directory; expected oci:DIR[:NAME]"
                ));
            }
            Ok(Target::Layout {
                dir: dir.into(),
                name: name.unwrap_or_else(|| "latest".into()),
            })
        }
        // No registry named: the local store, where `kiln run` finds it.
        (None, None) => Ok(Target::Layout {
            dir: store.to_path_buf(),
            name: format!("functions/{name}"),
        }),
        _ => Err(anyhow!(
            "--image and --output are exclusive: give --image to push to a registry, or \
                --output oci:DIR to write an OCI layout"
        )),
    }
}
