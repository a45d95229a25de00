//! The build Job: `kiln build` in the runtime's builder image, split in two so that install
//! scripts never see push credentials. The init container `deps` installs the dependencies
//! (`--stage deps`): third-party code runs there, with no registry credentials, no
//! service-account token and its own /tmp, and writes only the dependency layer into the
//! `deps` emptyDir. The container `build` then assembles and pushes (`--stage publish`) with
//! the credentials mounted, running no third-party code. With a shared dependency cache
//! (`--cache-repo`) the init container `lookup` comes first: with the registry credentials
//! and no third-party code it computes the dependency key and asks the cache repository,
//! writing what it found into the `lookup` emptyDir, which `deps` and `build` mount
//! read-only: `deps` then installs nothing on a hit, and `build` mounts the cached layer, or
//! stores the installed one under the key `lookup` computed. Only `build` mounts the key that
//! signs cache entries; `lookup` mounts its public key, and uses only entries it signed.
//! Likewise only `build` mounts the image signing key (`--image-signing-secret`), with which
//! it signs the image and its provenance (`--sign-key`). A
//! git Function is fetched once,
//! by the first init container `source` (`--stage source`), the only one given the git
//! credentials, into the `git-source` emptyDir that the others build read-only as a
//! directory: the install's scripts never see the credentials. All are unprivileged, with a
//! read-only root filesystem; `backoffLimit: 0` (the controller retries, with backoff).
//!
//! The Job builds for the plan's platforms (`--platform`) on a Node of one of them
//! ([`super::build_node_selector`]), installing natively for that platform and, for the
//! others, only what needs no foreign code (kiln's lock-file install, pinned wheels), each
//! platform's files in its own directory below `deps` and `lookup`; it pushes one image each
//! and an index over them.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath,
    PodSecurityContext, PodSpec, PodTemplateSpec, SecretKeySelector, SecretVolumeSource, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::source::{Copied, DEPENDENCIES_KEY, SOURCE_KEY, copy_name};
use super::{build_meta, restricted_container, runtime_default_seccomp, stamp};
use crate::controller::config::{Config, IMAGE_SIGNING_KEY, IMAGE_SIGNING_PASSWORD};
use crate::controller::crd::Function;
use crate::controller::names;
use crate::controller::plan::{Plan, SourcePlan};
use crate::controller::plumbing::{CACHE_PUBLIC_KEY, CACHE_SIGNING_KEY};

/// The user build containers run as (the builder image's files are world-readable).
pub const BUILD_UID: i64 = 1000;
/// The init container that installs dependencies.
pub const DEPS_CONTAINER: &str = "deps";
/// The init container that fetches a git Function.
pub const SOURCE_CONTAINER: &str = "source";
/// The init container that looks the dependency layer up in the cache repository.
pub const LOOKUP_CONTAINER: &str = "lookup";
/// The container that assembles and pushes the image.
pub const BUILD_CONTAINER: &str = "build";

const SRC_DIR: &str = "/workspace/src";
/// Where `source` writes a git Function (the `git-source` emptyDir) and the others read it.
const GIT_SOURCE_DIR: &str = "/workspace/git";
const GIT_FUNCTION_DIR: &str = "/workspace/git/function";
const DEPS_DIR: &str = "/workspace/deps";
const LOOKUP_DIR: &str = "/workspace/lookup";
const REGISTRY_DIR: &str = "/kiln/registry";
const PACKAGE_REGISTRY_DIR: &str = "/kiln/package-registry";
const CA_DIR: &str = "/kiln/ca";
/// Where `build` finds the cache signing key and `lookup` its public key.
const CACHE_KEY_DIR: &str = "/kiln/cache-key";
/// Where `build` finds the image signing key.
const IMAGE_KEY_DIR: &str = "/kiln/image-key";
const GIT_DIR: &str = "/kiln/git";
const TERMINATION_LOG: &str = "/dev/termination-log";

/// The build Job of `plan`.
pub fn job(f: &Function, plan: &Plan, config: &Config) -> Job {
    let name = names::build_name(f, &plan.key);
    let metadata = build_meta(f, plan, config, &name);
    // The Function's own labels stay off: in the build namespace a label could make a
    // NetworkPolicy select the Pod.
    let mut pod_labels = metadata.labels.clone().unwrap_or_default();
    pod_labels.insert(names::APP_NAME.into(), f.name_or_empty().into());
    let mut job = Job {
        metadata,
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            parallelism: Some(1),
            completions: Some(1),
            active_deadline_seconds: Some(deadline_seconds(config)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        "sidecar.istio.io/inject".to_string(),
                        "false".to_string(),
                    )])),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod_spec(f, plan, config)),
            },
            ..JobSpec::default()
        }),
        status: None,
    };
    stamp(&mut job, |j| &mut j.metadata);
    job
}

fn deadline_seconds(config: &Config) -> i64 {
    i64::try_from(config.build_deadline.as_secs()).unwrap_or(i64::MAX)
}

fn pod_spec(f: &Function, plan: &Plan, config: &Config) -> PodSpec {
    let cached = config.cache_repo.is_some();
    let source = git_source_args(f, plan, config).map(|args| {
        let mut mounts = vec![
            mount("git-source", GIT_SOURCE_DIR, false),
            mount("tmp-source", "/tmp", false),
        ];
        if let SourcePlan::Git {
            auth_secret: Some(_),
            ..
        } = &plan.source
        {
            mounts.push(mount("git-auth", GIT_DIR, true));
        }
        with_shared_mounts(container(SOURCE_CONTAINER, plan, args, mounts), config)
    });
    let lookup = cached.then(|| {
        let mut mounts = source_mounts(plan);
        mounts.push(mount("lookup", LOOKUP_DIR, false));
        mounts.push(mount("tmp-lookup", "/tmp", false));
        mounts.push(mount("package-registry", PACKAGE_REGISTRY_DIR, true));
        mounts.push(mount("registry-auth", REGISTRY_DIR, true));
        mounts.push(mount("cache-trust", CACHE_KEY_DIR, true));
        let c = container(LOOKUP_CONTAINER, plan, lookup_args(f, plan, config), mounts);
        with_shared_mounts(c, config)
    });
    let deps = container(DEPS_CONTAINER, plan, deps_args(f, plan, config), {
        let mut mounts = source_mounts(plan);
        mounts.push(mount("deps", DEPS_DIR, false));
        mounts.push(mount("tmp-deps", "/tmp", false));
        mounts.push(mount("package-registry", PACKAGE_REGISTRY_DIR, true));
        if cached {
            // Read-only: the cache entry's key must not come from the install.
            mounts.push(mount("lookup", LOOKUP_DIR, true));
        }
        mounts
    });
    let build = container(BUILD_CONTAINER, plan, publish_args(f, plan, config), {
        let mut mounts = source_mounts(plan);
        mounts.push(mount("deps", DEPS_DIR, true));
        mounts.push(mount("tmp-build", "/tmp", false));
        mounts.push(mount("registry-auth", REGISTRY_DIR, true));
        if cached {
            mounts.push(mount("lookup", LOOKUP_DIR, true));
            mounts.push(mount("cache-sign", CACHE_KEY_DIR, true));
        }
        if config.image_signing_secret.is_some() {
            mounts.push(mount("image-sign", IMAGE_KEY_DIR, true));
        }
        mounts
    });
    let build = with_signing_password(build, config);
    let (deps, build) = (
        with_shared_mounts(deps, config),
        with_shared_mounts(build, config),
    );
    PodSpec {
        restart_policy: Some("Never".into()),
        // Neither container talks to the API server; the install must not find a token.
        automount_service_account_token: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(BUILD_UID),
            run_as_group: Some(BUILD_UID),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..PodSecurityContext::default()
        }),
        node_selector: super::build_node_selector(plan),
        init_containers: Some(source.into_iter().chain(lookup).chain([deps]).collect()),
        containers: vec![build],
        volumes: Some(volumes(f, plan, config)),
        ..PodSpec::default()
    }
}

/// The image signing key's password, from its Secret (the copy in the build namespace), for
/// the container that signs: cosign reads it from `COSIGN_PASSWORD`, and so does kiln. A key
/// stored unencrypted has no password to give.
fn with_signing_password(mut c: Container, config: &Config) -> Container {
    if let Some(secret) = &config.image_signing_secret {
        c.env.get_or_insert_with(Vec::new).push(EnvVar {
            name: "COSIGN_PASSWORD".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.clone(),
                    key: IMAGE_SIGNING_PASSWORD.into(),
                    optional: Some(true),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    c
}

/// The mount every container needs: the CA bundle.
fn with_shared_mounts(mut c: Container, config: &Config) -> Container {
    if config.ca_bundle_configmap.is_some() {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        mounts.push(mount("ca-bundle", CA_DIR, true));
    }
    c
}

fn container(name: &str, plan: &Plan, args: Vec<String>, mounts: Vec<VolumeMount>) -> Container {
    Container {
        name: name.into(),
        image: Some(plan.builder.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args),
        resources: Some(plan.build_resources.resources.clone()),
        security_context: Some(restricted_container()),
        termination_message_path: Some(TERMINATION_LOG.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

/// The Function's files: inline, the handler and the dependency manifest, each a file
/// mounted by subPath (a ConfigMap mounted as a directory is a tree of `..data` symlinks,
/// not a Function); from git, what `source` fetched, read-only.
fn source_mounts(plan: &Plan) -> Vec<VolumeMount> {
    if matches!(plan.source, SourcePlan::Git { .. }) {
        return vec![mount("git-source", GIT_SOURCE_DIR, true)];
    }
    let deps = &plan.runtime.dependencies.manifest;
    [&plan.runtime.source.handler, deps]
        .into_iter()
        .map(|file| VolumeMount {
            name: "source".into(),
            mount_path: format!("{SRC_DIR}/{file}"),
            sub_path: Some(file.clone()),
            read_only: Some(true),
            ..VolumeMount::default()
        })
        .collect()
}

/// `source`'s arguments, for a git Function: fetch the commit into `git-source`.
fn git_source_args(f: &Function, plan: &Plan, config: &Config) -> Option<Vec<String>> {
    let SourcePlan::Git {
        url,
        commit,
        base_dir,
        auth_secret,
    } = &plan.source
    else {
        return None;
    };
    let mut args = vec!["build".to_string(), "--git".into(), url.clone()];
    args.extend(["--git-ref".into(), commit.clone()]);
    args.extend(["--git-base-dir".into(), base_dir.clone()]);
    if auth_secret.is_some() {
        args.extend(["--git-auth-dir".into(), GIT_DIR.into()]);
    }
    if config.ca_bundle_configmap.is_some() {
        args.extend(["--git-ca".into(), format!("{CA_DIR}/ca.crt")]);
    }
    args.extend(names_args(f, plan));
    args.extend(["--stage".into(), "source".into()]);
    args.extend(["--source-dir".into(), GIT_FUNCTION_DIR.into()]);
    Some(args)
}

/// The runtime, the Function's names and how to log.
fn names_args(f: &Function, plan: &Plan) -> [String; 10] {
    [
        "--runtime".into(),
        plan.runtime.name.clone(),
        "--name".into(),
        f.name_or_empty().into(),
        "--namespace".into(),
        f.namespace_or_default().into(),
        "--termination-log".into(),
        TERMINATION_LOG.into(),
        "--log-format".into(),
        "json".into(),
    ]
}

/// What the later stages share: where the code is, the runtime, the names, the base, logs.
fn common_args(f: &Function, plan: &Plan, config: &Config) -> Vec<String> {
    let dir = match &plan.source {
        SourcePlan::Inline { .. } => SRC_DIR,
        SourcePlan::Git { .. } => GIT_FUNCTION_DIR,
    };
    let mut args = vec!["build".to_string(), dir.into()];
    args.extend(names_args(f, plan));
    let platforms: Vec<String> = plan.platforms.iter().map(ToString::to_string).collect();
    args.extend([
        "--platform".into(),
        platforms.join(","),
        "--base".into(),
        plan.base.clone(),
        "--cache-dir".into(),
        "/tmp/kiln-cache".into(),
    ]);
    if config.insecure_registry {
        args.extend([
            "--insecure-registry".into(),
            registry_host(&config.registry),
        ]);
    }
    args
}

/// `--builder-image`: the image the container runs, by digest. Inside it the install uses
/// the toolchain on PATH, and the digest names that toolchain in the dependency key, so the
/// key is the one `kiln warm` and local builds with this builder compute.
fn builder_args(plan: &Plan) -> [String; 2] {
    ["--builder-image".into(), plan.builder.clone()]
}

/// The dependency key's inputs: the builder and the package-registry config.
fn key_args(plan: &Plan) -> impl Iterator<Item = String> {
    builder_args(plan).into_iter().chain([
        "--package-registry-config".into(),
        PACKAGE_REGISTRY_DIR.into(),
    ])
}

fn registry_args(config: &Config) -> Vec<String> {
    let mut args = vec![
        "--registry-auth".into(),
        format!("{REGISTRY_DIR}/config.json"),
    ];
    if config.ca_bundle_configmap.is_some() {
        args.extend(["--registry-ca".into(), format!("{CA_DIR}/ca.crt")]);
    }
    args
}

fn lookup_args(f: &Function, plan: &Plan, config: &Config) -> Vec<String> {
    let mut args = common_args(f, plan, config);
    args.extend(["--stage".into(), "lookup".into()]);
    args.extend(["--lookup-dir".into(), LOOKUP_DIR.into()]);
    args.extend([
        "--cache-repo".into(),
        config
            .cache_repo_for(f.namespace_or_default())
            .unwrap_or_default(),
    ]);
    args.extend([
        "--cache-trust-key".into(),
        format!("{CACHE_KEY_DIR}/{CACHE_PUBLIC_KEY}"),
    ]);
    args.extend(key_args(plan));
    args.extend(registry_args(config));
    args
}

fn deps_args(f: &Function, plan: &Plan, config: &Config) -> Vec<String> {
    let mut args = common_args(f, plan, config);
    args.extend(["--stage".into(), "deps".into()]);
    args.extend(["--stage-dir".into(), DEPS_DIR.into()]);
    args.extend(key_args(plan));
    if config.cache_repo.is_some() {
        args.extend(["--lookup-dir".into(), LOOKUP_DIR.into()]);
    }
    if config.ca_bundle_configmap.is_some() {
        args.extend(["--ca-bundle".into(), format!("{CA_DIR}/ca.crt")]);
    }
    args
}

fn publish_args(f: &Function, plan: &Plan, config: &Config) -> Vec<String> {
    let mut args = common_args(f, plan, config);
    args.extend(["--stage".into(), "publish".into()]);
    args.extend(["--stage-dir".into(), DEPS_DIR.into()]);
    args.extend(["--image".into(), plan.push_image.clone()]);
    if let Some(repo) = config.cache_repo_for(f.namespace_or_default()) {
        args.extend(["--cache-repo".into(), repo]);
        args.extend([
            "--cache-sign-key".into(),
            format!("{CACHE_KEY_DIR}/{CACHE_SIGNING_KEY}"),
        ]);
        args.extend(["--lookup-dir".into(), LOOKUP_DIR.into()]);
    }
    if config.image_signing_secret.is_some() {
        args.extend([
            "--sign-key".into(),
            format!("{IMAGE_KEY_DIR}/{IMAGE_SIGNING_KEY}"),
        ]);
    }
    args.extend(registry_args(config));
    args
}

/// The host[:port] of a `REGISTRY[/PREFIX]`.
pub fn registry_host(registry: &str) -> String {
    registry.split('/').next().unwrap_or_default().to_string()
}

fn volumes(f: &Function, plan: &Plan, config: &Config) -> Vec<Volume> {
    // What one install may write before the kubelet evicts the Pod: the build profile's.
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(plan.build_resources.scratch.clone())),
            medium: None,
        }),
        ..Volume::default()
    };
    let mut volumes = vec![empty("deps"), empty("tmp-deps"), empty("tmp-build")];
    if config.cache_repo.is_some() {
        volumes.extend([empty("lookup"), empty("tmp-lookup")]);
        // One Secret, two views: the lookup sees only the public key.
        for (volume, key) in [
            ("cache-trust", CACHE_PUBLIC_KEY),
            ("cache-sign", CACHE_SIGNING_KEY),
        ] {
            volumes.push(secret_volume(
                volume,
                &config.cache_signing_secret,
                Some((key, key)),
                false,
            ));
        }
    }
    if matches!(plan.source, SourcePlan::Git { .. }) {
        volumes.extend([empty("git-source"), empty("tmp-source")]);
    }
    if matches!(plan.source, SourcePlan::Inline { .. }) {
        let item = |key: &str, path: &str| KeyToPath {
            key: key.into(),
            path: path.into(),
            mode: None,
        };
        volumes.push(Volume {
            name: "source".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::build_name(f, &plan.key),
                items: Some(vec![
                    item(SOURCE_KEY, &plan.runtime.source.handler),
                    item(DEPENDENCIES_KEY, &plan.runtime.dependencies.manifest),
                ]),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    volumes.push(secret_volume(
        "registry-auth",
        &config.registry_secret,
        Some((".dockerconfigjson", "config.json")),
        false,
    ));
    // The Function namespace's package-registry config, copied next to the Job when it
    // has one.
    volumes.push(secret_volume(
        "package-registry",
        &copy_name(f, plan, Copied::Packages),
        None,
        true,
    ));
    if let Some(secret) = &config.image_signing_secret {
        // The private key alone: the password goes in as COSIGN_PASSWORD.
        volumes.push(secret_volume(
            "image-sign",
            secret,
            Some((IMAGE_SIGNING_KEY, IMAGE_SIGNING_KEY)),
            false,
        ));
    }
    if let Some(cm) = &config.ca_bundle_configmap {
        volumes.push(Volume {
            name: "ca-bundle".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.clone(),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    if let SourcePlan::Git {
        auth_secret: Some(_),
        ..
    } = &plan.source
    {
        volumes.push(secret_volume(
            "git-auth",
            &copy_name(f, plan, Copied::Git),
            None,
            false,
        ));
    }
    volumes
}

fn secret_volume(name: &str, secret: &str, item: Option<(&str, &str)>, optional: bool) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            items: item.map(|(key, path)| {
                vec![KeyToPath {
                    key: key.into(),
                    path: path.into(),
                    mode: None,
                }]
            }),
            optional: optional.then_some(true),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}
