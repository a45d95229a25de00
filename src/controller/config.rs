//! The controller's configuration: plain values, validated by `cli::controller` from flags
//! and the environment. Nothing here reads the environment.

use std::collections::BTreeMap;
use std::time::Duration;

/// The images a runtime builds with: its base (what Functions run on) and its builder (the
/// same OS and toolchain plus kiln: what build Jobs run in). Registry references; pinned by
/// digest or resolved by the controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeImages {
    /// The base image.
    pub base: String,
    /// The builder image (`kiln base build RUNTIME` makes both).
    pub builder: String,
}

/// The ServiceAccount the controller keeps for Function Pods when the registry needs a pull
/// Secret (Kyma's name).
pub const DEFAULT_FUNCTION_SERVICE_ACCOUNT: &str = "serverless-function";

/// What the controller renders to run a Function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// Deployment + Service (+ HPA): Kyma's flow.
    Deployment,
    /// A Knative Serving `Service` (Kyma's 2019–2020 flow).
    Knative,
}

/// Who shares a dependency cache repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheScope {
    /// Every Function: one install serves every namespace with the same dependencies.
    Shared,
    /// Each Function namespace has its own, `<cache repo>/<namespace>`: no layer one
    /// tenant's install made is ever used by another's build.
    Namespace,
}

/// The key of the image signing Secret that holds the private key (PEM; cosign's encrypted
/// format or PKCS#8), as cosign names it.
pub const IMAGE_SIGNING_KEY: &str = "cosign.key";
/// The key of the image signing Secret that holds the private key's password, if any.
pub const IMAGE_SIGNING_PASSWORD: &str = "cosign.password";
/// The key of the image signing Secret that holds the public key (PEM).
pub const IMAGE_VERIFY_KEY: &str = "cosign.pub";

/// The controller's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where build Jobs push: `REGISTRY[/PREFIX]`; images are `<this>/<namespace>/<name>:<key>`.
    pub registry: String,
    /// Where nodes pull from when it differs from `registry` (Kyma's NodePort address).
    pub pull_registry: Option<String>,
    /// The repository build Jobs share as dependency-layer cache (`--cache-repo`): with it,
    /// a build Job first looks the dependency layer up there (`--stage lookup`).
    pub cache_repo: Option<String>,
    /// Whether every Function namespace shares `cache_repo`, or each has its own below it.
    pub cache_scope: CacheScope,
    /// The Secret in the controller's namespace with the Ed25519 key build Jobs sign cache
    /// entries with (made by the controller when missing), copied into the build namespace.
    pub cache_signing_secret: String,
    /// A Secret in the controller's namespace with the ECDSA P-256 key images are signed
    /// with, as `cosign generate-key-pair k8s://NAMESPACE/NAME` writes it (keys
    /// [`IMAGE_SIGNING_KEY`], [`IMAGE_SIGNING_PASSWORD`], [`IMAGE_VERIFY_KEY`]). Copied into
    /// the build namespace; only the container that pushes mounts it.
    pub image_signing_secret: Option<String>,
    /// Deploy an image only if a provenance signed with the public key of
    /// `image_signing_secret` names the Function's build key.
    pub require_provenance: bool,
    /// What every Function is built for (`--platforms`) unless it names its own
    /// ([`super::names::PLATFORMS`]); `None`: the platforms of the cluster's Nodes.
    pub platforms: Option<Vec<crate::oci::Platform>>,
    /// Talk plain HTTP to the registry (build Jobs get `--insecure-registry`).
    pub insecure_registry: bool,
    /// Base and builder image per kiln runtime.
    pub runtimes: BTreeMap<String, RuntimeImages>,
    /// The controller's own namespace: where the registry Secrets and CA ConfigMap live.
    pub namespace: String,
    /// Where build Jobs run, with their source ConfigMaps, the copies of the push Secret and
    /// CA ConfigMap, and the controller's records of what it built. No tenant has access to
    /// it: push credentials never enter a Function's namespace.
    pub build_namespace: String,
    /// The `kubernetes.io/dockerconfigjson` Secret build Jobs push with (copied into the
    /// build namespace only).
    pub registry_secret: String,
    /// A `kubernetes.io/dockerconfigjson` Secret with pull-only credentials, for registries
    /// that need them to pull: copied into each Function's namespace, where the Function
    /// ServiceAccount carries it as its `imagePullSecrets`. `None`: nodes pull anonymously.
    pub pull_secret: Option<String>,
    /// A ConfigMap (key `ca.crt`) with CAs the builds trust for package and image registries.
    pub ca_bundle_configmap: Option<String>,
    /// The per-namespace Secret with `.npmrc` / `pip.conf` for private package registries.
    pub package_registry_secret: String,
    /// At most this many build Jobs run at once, cluster-wide.
    pub max_build_jobs: usize,
    /// At most this many Functions between a rebase onto a new base and running on it.
    pub max_rollouts: usize,
    /// At most this many of them in one namespace.
    pub max_rollouts_per_namespace: usize,
    /// Rebase a Function onto its runtime's new images when safe (else build it).
    pub rebase: bool,
    /// Report what a base change would do (rebase, or build and why), and keep every
    /// Function on the images it was built on.
    pub rebase_dry_run: bool,
    /// A build Job's `activeDeadlineSeconds`.
    pub build_deadline: Duration,
    /// The first retry delay after a failed build; it doubles per failure.
    pub build_retry_base: Duration,
    /// The longest retry delay.
    pub build_retry_max: Duration,
    /// How often a git source's reference is resolved again.
    pub git_poll_interval: Duration,
    /// How long a resolved image tag → digest stays trusted.
    pub image_cache_ttl: Duration,
    /// The Function profile when a Function sets none.
    pub default_function_profile: String,
    /// The build profile when a Function sets none.
    pub default_build_profile: String,
    /// Deployments or Knative Services.
    pub serving: Serving,
    /// The HPA's CPU target.
    pub target_cpu_utilization: i32,
    /// The runtime Pods' ServiceAccount (Kyma's `serverless-function`). With a
    /// [`Config::pull_secret`] the controller keeps it in each Function's namespace, carrying
    /// the pull Secret; without one it must exist, or `None` uses the namespace's `default`.
    pub function_service_account: Option<String>,
    /// `TRACE_COLLECTOR_ENDPOINT` for Functions.
    pub trace_collector_endpoint: Option<String>,
    /// `PUBLISHER_PROXY_ADDRESS` for Functions.
    pub publisher_proxy_address: Option<String>,
    /// The pause before a Function waiting for a build slot, a running build or a Deployment
    /// is looked at again.
    pub requeue: Duration,
}

impl Config {
    /// A configuration with Kyma's defaults for everything but the registry and images.
    pub fn new(registry: String, runtimes: BTreeMap<String, RuntimeImages>) -> Config {
        Config {
            registry,
            pull_registry: None,
            cache_repo: None,
            cache_scope: CacheScope::Shared,
            cache_signing_secret: "kiln-cache-signing".into(),
            image_signing_secret: None,
            require_provenance: false,
            platforms: None,
            insecure_registry: false,
            runtimes,
            namespace: "kiln-system".into(),
            build_namespace: "kiln-builds".into(),
            registry_secret: "kiln-registry".into(),
            pull_secret: None,
            ca_bundle_configmap: None,
            package_registry_secret: "serverless-package-registry-config".into(),
            max_build_jobs: 5,
            max_rollouts: 50,
            max_rollouts_per_namespace: 50,
            rebase: true,
            rebase_dry_run: false,
            build_deadline: Duration::from_secs(1800),
            build_retry_base: Duration::from_secs(30),
            build_retry_max: Duration::from_secs(300),
            git_poll_interval: Duration::from_secs(300),
            image_cache_ttl: Duration::from_secs(300),
            default_function_profile: super::presets::DEFAULT_FUNCTION_PROFILE.into(),
            default_build_profile: super::presets::DEFAULT_BUILD_PROFILE.into(),
            serving: Serving::Deployment,
            target_cpu_utilization: 50,
            function_service_account: None,
            trace_collector_endpoint: None,
            publisher_proxy_address: None,
            requeue: Duration::from_secs(5),
        }
    }

    /// The Secrets the controller keeps for the platform (push, cache signing, and pull and
    /// image signing if any), which no Function may read.
    pub fn managed_secrets(&self) -> Vec<&str> {
        [self.registry_secret.as_str(), &self.cache_signing_secret]
            .into_iter()
            .chain(self.pull_secret.as_deref())
            .chain(self.image_signing_secret.as_deref())
            .collect()
    }

    /// The dependency cache repository of a Function in `namespace` (`cache_scope`).
    pub fn cache_repo_for(&self, namespace: &str) -> Option<String> {
        let repo = self.cache_repo.as_deref()?;
        Some(match self.cache_scope {
            CacheScope::Shared => repo.to_string(),
            CacheScope::Namespace => format!("{repo}/{namespace}"),
        })
    }

    /// The registry nodes pull from.
    pub fn pull_registry(&self) -> &str {
        self.pull_registry.as_deref().unwrap_or(&self.registry)
    }

    /// The ServiceAccount Function Pods run as, if not the namespace's `default`.
    pub fn function_service_account(&self) -> Option<&str> {
        match (&self.function_service_account, &self.pull_secret) {
            (Some(name), _) => Some(name),
            (None, Some(_)) => Some(DEFAULT_FUNCTION_SERVICE_ACCOUNT),
            (None, None) => None,
        }
    }
}
