//! `kiln controller`: flags, their validation into [`crate::controller::config::Config`], and
//! the run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, ValueEnum};

use super::Failure;
use super::registry::RegistryArgs;
use crate::controller::config::{CacheScope, Config, RuntimeImages, Serving};
use crate::controller::lookup::CommitResolver;
use crate::controller::runner::{self, Options};
use crate::registry::Client;
use crate::runtime::Catalog;

/// Flags of `kiln controller`.
#[derive(Debug, Args)]
#[command(after_help = "\
The controller watches Function resources (serverless.kyma-project.io/v1alpha2; `kiln crd` \
prints the CRD) in every namespace and, for each, builds the image with a build Job running \
`kiln build` in the runtime's builder image, then runs it by digest as a Deployment, Service and \
HPA (or a Knative Service). It finds the API server from KUBECONFIG or, in a Pod, from its \
service account.

Images are pushed to REGISTRY/<namespace>/<name>:<build key>. Build Jobs run in \
--build-namespace, a namespace no tenant can reach, and push with the dockerconfigjson Secret \
--registry-secret, copied there from --namespace: push credentials never enter a Function's \
namespace. A Function's namespace gets at most the pull-only Secret --pull-secret, on the \
ServiceAccount its Pods run as. The controller deploys only digests its own build Jobs \
reported, which it records in --build-namespace; an image some other party pushed under a \
build key's tag is never deployed.

Example:
  kiln controller --registry registry.example.com/functions \\
    --base-image nodejs22=registry.example.com/kiln/nodejs22@sha256:… \\
    --builder-image nodejs22=registry.example.com/kiln/nodejs22-builder@sha256:… \\
    --registry-auth /var/run/kiln/registry/.dockerconfigjson")]
pub struct ControllerArgs {
    /// Where build Jobs push images: REGISTRY[/PREFIX].
    #[arg(long, value_name = "REGISTRY[/PREFIX]", env = "KILN_REGISTRY")]
    pub registry: String,
    /// The repository build Jobs share as dependency-layer cache (`kiln build --cache-repo`):
    /// a build Pod on any node mounts the dependency layer another Function with the same
    /// dependencies installed, instead of installing. `none` turns it off. The registry
    /// Secret must allow pushing to it.
    #[arg(
        long,
        value_name = "REPO|none",
        env = "KILN_CACHE_REPO",
        default_value = "REGISTRY/kiln-cache"
    )]
    pub cache_repo: String,
    /// Who shares --cache-repo: `shared`, every Function (one install serves all namespaces
    /// with the same dependencies), or `namespace`, a repository per Function namespace below
    /// it (REPO/NAMESPACE), so no tenant's build uses a layer another tenant's install made.
    /// Entries are signed in either case, and used only if the controller's key signed them.
    #[arg(long, value_enum, default_value_t = CacheScopeArg::Shared, env = "KILN_CACHE_SCOPE")]
    pub cache_scope: CacheScopeArg,
    /// The Secret in --namespace with the Ed25519 key (keys signing.pem and public.pem) build
    /// Jobs sign their --cache-repo entries with and check them against. The controller
    /// makes it with a new key when it is missing; to rotate, delete it.
    #[arg(long, default_value = "kiln-cache-signing", value_name = "NAME")]
    pub cache_signing_secret: String,
    /// Sign every image build Jobs push, with SLSA provenance, using the ECDSA P-256 key in
    /// this Secret in --namespace: keys cosign.key (PEM, cosign's encrypted format or
    /// PKCS#8), cosign.password (if encrypted) and cosign.pub, as `cosign generate-key-pair
    /// k8s://NAMESPACE/NAME` makes it. It is copied into --build-namespace and mounted only by
    /// the container that pushes, never where dependencies install. The controller signs the
    /// images it rebases with it too.
    #[arg(long, value_name = "NAME", env = "KILN_IMAGE_SIGNING_SECRET")]
    pub image_signing_secret: Option<String>,
    /// Deploy an image only if it carries a signature and an SLSA provenance by the key in
    /// --image-signing-secret (its cosign.pub) that names the Function's build key, checked
    /// every time an image is taken for a build key: an image planted in a shared registry,
    /// or one whose provenance names another build, is rebuilt or refused, never deployed.
    #[arg(
        long,
        requires = "image_signing_secret",
        env = "KILN_REQUIRE_PROVENANCE",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub require_provenance: bool,
    /// The platforms every Function is built for, comma-separated (linux/amd64,linux/arm64):
    /// one image each and an index over them when there are several. A Function's
    /// annotation kiln.io/platforms overrides it. Empty: the platforms of the cluster's Nodes
    /// (their kubernetes.io/os and kubernetes.io/arch labels), looked at every few minutes.
    #[arg(long, value_name = "OS/ARCH,…", env = "KILN_PLATFORMS")]
    pub platforms: Option<String>,
    /// Where nodes pull images from, when it differs from --registry.
    #[arg(long, value_name = "REGISTRY[/PREFIX]", env = "KILN_PULL_REGISTRY")]
    pub pull_registry: Option<String>,
    /// A runtime's base image: RUNTIME=REF (pin it by digest, or it is resolved every few
    /// minutes); repeatable. `kiln base build RUNTIME --image REF` makes it.
    #[arg(long = "base-image", value_name = "RUNTIME=REF", required = true)]
    pub base_images: Vec<String>,
    /// A runtime's builder image (same OS and toolchain as its base, plus kiln):
    /// RUNTIME=REF; repeatable.
    #[arg(long = "builder-image", value_name = "RUNTIME=REF", required = true)]
    pub builder_images: Vec<String>,
    /// The controller's own namespace: where --registry-secret, --ca-bundle-configmap and the
    /// leader Lease live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kiln-system")]
    pub namespace: String,
    /// The kubernetes.io/dockerconfigjson Secret build Jobs push with, in --namespace.
    #[arg(long, default_value = "kiln-registry")]
    pub registry_secret: String,
    /// Where build Jobs run (with their source ConfigMaps and the push Secret's copy): a
    /// namespace of kiln's own that no tenant may read.
    #[arg(long, env = "KILN_BUILD_NAMESPACE", default_value = "kiln-builds")]
    pub build_namespace: String,
    /// A kubernetes.io/dockerconfigjson Secret in --namespace with pull-only credentials,
    /// for a registry that needs them to pull (empty: nodes pull anonymously). It is copied
    /// into each Function's namespace and carried by the Function ServiceAccount
    /// (--function-service-account, default serverless-function), which the controller keeps.
    #[arg(long, value_name = "NAME", env = "KILN_PULL_SECRET")]
    pub pull_secret: Option<String>,
    /// A ConfigMap (key ca.crt) of CAs build Jobs trust for package and image registries
    /// and git servers, in the controller's namespace (empty: none); the controller trusts
    /// them too, for its registry lookups (read at start) and git references.
    #[arg(long, value_name = "NAME", env = "KILN_CA_BUNDLE_CONFIGMAP")]
    pub ca_bundle_configmap: Option<String>,
    /// The Secret (keys .npmrc, pip.conf) of private package registries, in a Function's
    /// namespace (Kyma's name).
    #[arg(long, default_value = "serverless-package-registry-config")]
    pub package_registry_secret: String,
    /// At most this many build Jobs at once, cluster-wide; the rest wait (JobQueued).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_build_jobs: u16,
    /// When a runtime's base or builder image changes, at most this many Functions are
    /// between their rebase onto it (no build Job; see `kiln rebase`) and running on the new
    /// image, cluster-wide; the rest wait (RebaseQueued). Rebuilds are paced by
    /// --max-build-jobs.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_rollouts: u16,
    /// At most this many of those rollouts in one namespace [default: --max-concurrent-rollouts].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_rollouts_per_namespace: Option<u16>,
    /// When a runtime's base or builder image changes, say on each Function (BuildReady
    /// NewerBaseAvailable, and an Event) whether it would be rebased or built again and why,
    /// and keep it on the images it was built on. A Function opts out of rebases by itself
    /// with the annotation kiln.io/auto-rebase: "false".
    #[arg(
        long,
        env = "KILN_REBASE_DRY_RUN",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub rebase_dry_run: bool,
    /// Never rebase: build every Function on a runtime's new images with a Job, as for any
    /// change.
    #[arg(long, conflicts_with = "rebase_dry_run")]
    pub no_rebase: bool,
    /// How long a base or builder image tag's digest is trusted before it is resolved again
    /// (how soon a base change is seen).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub image_cache_ttl: u64,
    /// A build Job's activeDeadlineSeconds.
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    pub build_deadline: u64,
    /// The first retry delay after a failed build, doubling per failure.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub build_retry_base: u64,
    /// The longest retry delay after failed builds.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub build_retry_max: u64,
    /// How often a git source's reference is resolved again.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub git_poll_interval: u64,
    /// The Function profile when a Function names none (XS, S, M, L, XL).
    #[arg(long, default_value = "L")]
    pub default_function_profile: String,
    /// The build profile when a Function names none (local-dev, slow, normal, fast).
    #[arg(long, default_value = "normal")]
    pub default_build_profile: String,
    /// Run Functions as Deployments (Kyma) or Knative Services.
    #[arg(long, value_enum, default_value_t = ServingArg::Deployment)]
    pub serving: ServingArg,
    /// The HPA's target CPU utilization, in percent.
    #[arg(long, default_value_t = 50)]
    pub target_cpu_utilization: i32,
    /// The runtime Pods' ServiceAccount. With --pull-secret the controller keeps it in
    /// each Function's namespace (default serverless-function); without, it must exist there
    /// (default: the namespace's `default`). Function Pods mount no token from it unless the
    /// Function has the annotation kiln.io/automount-service-account-token: "true".
    #[arg(long, value_name = "NAME")]
    pub function_service_account: Option<String>,
    /// TRACE_COLLECTOR_ENDPOINT for Functions.
    #[arg(long, value_name = "URL")]
    pub trace_collector_endpoint: Option<String>,
    /// PUBLISHER_PROXY_ADDRESS for Functions.
    #[arg(long, value_name = "URL")]
    pub publisher_proxy_address: Option<String>,
    /// Where /metrics, /healthz and /readyz are served (default: port 8080 on --listen-ip).
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_address: Option<SocketAddr>,
    /// The address the endpoints listen on: all addresses by default; one address, such as
    /// the Pod's IP from the downward API (`status.podIP`), to serve only there.
    #[arg(
        long,
        value_name = "IP",
        default_value = "0.0.0.0",
        env = "KILN_LISTEN_IP"
    )]
    pub listen_ip: std::net::IpAddr,
    /// The Lease for leader election (one replica reconciles).
    #[arg(
        long,
        default_value = "kiln-controller",
        conflicts_with = "no_leader_election"
    )]
    pub leader_lease: String,
    /// How long the leader's Lease lasts unrenewed: a standby replica takes over this long
    /// after the leader stops renewing it (the leader renews every third of it).
    #[arg(long, default_value_t = 15, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub leader_lease_duration: u64,
    /// Reconcile without leader election (a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Reconciles running at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// Reconcile every Function again this often (0: only on changes); SIGHUP does it at once.
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    pub resync: u64,
    /// A kubeconfig file [default: $KUBECONFIG, ~/.kube/config, or the Pod's service account].
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Registry access for the controller's own lookups (does this image exist?).
    #[command(flatten)]
    pub access: RegistryArgs,
}

/// `--serving`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ServingArg {
    /// Deployment + Service + HPA.
    Deployment,
    /// serving.knative.dev/v1 Service.
    Knative,
}

/// The bytes of documents the controller keeps in memory (of its 256 MiB limit): the
/// manifests and configs of a few thousand Functions' images (about 5 KiB each; 15 KiB with
/// signatures and provenance).
const CONTROLLER_DOCUMENTS: usize = 32 << 20;

pub(super) async fn run(args: ControllerArgs) -> Result<String, Failure> {
    let config = config(&args).map_err(Failure::Usage)?;
    let client = kube_client(args.kubeconfig.as_deref())
        .await
        .map_err(Failure::Usage)?;
    let mut registry_config = args.access.client_config().map_err(Failure::Usage)?;
    // The CAs the builds trust are the controller's too, for its own registry lookups (is
    // the image built? which digest is the base?). Read once, at start.
    if let Some(name) = &config.ca_bundle_configmap {
        let pem = crate::controller::lookup::ca_bundle(&client, &config.namespace, name)
            .await
            .map_err(|e| Failure::Usage(anyhow::anyhow!("{}", e.chain())))?;
        registry_config.extra_ca_pem.push(pem);
    }
    // What it pushed or read (an image it rebased, its signatures) is read again by digest:
    // kept in memory, so the next patch's rebase of the Function reads nothing back.
    registry_config.memory_documents = CONTROLLER_DOCUMENTS;
    let registry = Client::new(registry_config)
        .context("setting up the registry client")
        .map_err(Failure::Usage)?;
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_str()
                .ok()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "kiln-controller".into());
    let opts = Options {
        client,
        config,
        registry,
        git: Arc::new(GitLsRemote),
        metrics_address: args
            .metrics_address
            .unwrap_or_else(|| SocketAddr::new(args.listen_ip, 8080)),
        lease: (!args.no_leader_election).then(|| args.leader_lease.clone()),
        lease_duration: Duration::from_secs(args.leader_lease_duration),
        identity,
        workers: args.workers,
        resync: (args.resync > 0).then(|| Duration::from_secs(args.resync)),
    };
    runner::run(opts)
        .await
        .map_err(|e| Failure::Build(anyhow::Error::new(e)))?;
    Ok(String::new())
}

async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using --kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "finding the Kubernetes API: set KUBECONFIG or --kubeconfig, or run in a Pod",
        )?,
    };
    kube::Client::try_from(config).context("setting up the Kubernetes client")
}

fn config(args: &ControllerArgs) -> anyhow::Result<Config> {
    let catalog = Catalog::embedded();
    let pairs = |flag: &str, values: &[String]| -> anyhow::Result<BTreeMap<String, String>> {
        let mut map = BTreeMap::new();
        for v in values {
            let (runtime, reference) = v
                .split_once('=')
                .filter(|(r, i)| !r.is_empty() && !i.is_empty())
                .ok_or_else(|| anyhow!("invalid {flag} {v:?}: expected RUNTIME=REF"))?;
            catalog
                .get(runtime)
                .with_context(|| format!("{flag} {v:?}"))?;
            reference
                .parse::<crate::registry::Reference>()
                .with_context(|| format!("{flag} {v:?}"))?;
            map.insert(runtime.to_string(), reference.to_string());
        }
        Ok(map)
    };
    let bases = pairs("--base-image", &args.base_images)?;
    let mut builders = pairs("--builder-image", &args.builder_images)?;
    let mut runtimes = BTreeMap::new();
    for (runtime, base) in bases {
        let missing =
            || anyhow!("--base-image {runtime}=… has no --builder-image: builds need both");
        let builder = builders.remove(&runtime).ok_or_else(missing)?;
        runtimes.insert(runtime, RuntimeImages { base, builder });
    }
    if let Some(runtime) = builders.keys().next() {
        return Err(anyhow!(
            "--builder-image {runtime}=… has no --base-image {runtime}=…"
        ));
    }
    let profile = |flag: &str, value: &str, table: &[crate::controller::presets::Preset]| {
        crate::controller::presets::find(table, value)
            .map(|p| p.name.to_string())
            .ok_or_else(|| {
                let known: Vec<&str> = table.iter().map(|p| p.name).collect();
                anyhow!("invalid {flag} {value:?}: one of {}", known.join(", "))
            })
    };
    let registry_host = crate::controller::render::job::registry_host(&args.registry);
    let mut config = Config::new(args.registry.trim_end_matches('/').to_string(), runtimes);
    config.pull_registry = args.pull_registry.clone();
    config.insecure_registry = args.access.insecure_hosts().contains(&registry_host);
    config.namespace = args.namespace.clone();
    config.registry_secret = args.registry_secret.clone();
    crate::controller::validate::dns1123_label(&args.build_namespace)
        .map_err(|e| anyhow!("invalid --build-namespace {:?}: {e}", args.build_namespace))?;
    config.build_namespace = args.build_namespace.clone();
    config.pull_secret = args
        .pull_secret
        .clone()
        .filter(|name| !name.trim().is_empty());
    // An empty name (an empty ConfigMap key in deploy/config.env) means none.
    config.ca_bundle_configmap = args
        .ca_bundle_configmap
        .clone()
        .filter(|name| !name.trim().is_empty());
    config.package_registry_secret = args.package_registry_secret.clone();
    config.max_build_jobs = usize::from(args.max_build_jobs);
    config.max_rollouts = usize::from(args.max_concurrent_rollouts);
    config.max_rollouts_per_namespace = usize::from(
        args.max_rollouts_per_namespace
            .unwrap_or(args.max_concurrent_rollouts),
    );
    config.rebase_dry_run = args.rebase_dry_run;
    config.rebase = !args.no_rebase;
    config.image_cache_ttl = Duration::from_secs(args.image_cache_ttl);
    config.build_deadline = Duration::from_secs(args.build_deadline);
    config.build_retry_base = Duration::from_secs(args.build_retry_base);
    config.build_retry_max = Duration::from_secs(args.build_retry_max.max(args.build_retry_base));
    config.git_poll_interval = Duration::from_secs(args.git_poll_interval);
    config.default_function_profile = profile(
        "--default-function-profile",
        &args.default_function_profile,
        &crate::controller::presets::FUNCTION_PRESETS,
    )?;
    config.default_build_profile = profile(
        "--default-build-profile",
        &args.default_build_profile,
        &crate::controller::presets::BUILD_PRESETS,
    )?;
    config.serving = match args.serving {
        ServingArg::Deployment => Serving::Deployment,
        ServingArg::Knative => Serving::Knative,
    };
    config.target_cpu_utilization = args.target_cpu_utilization;
    config.function_service_account = args.function_service_account.clone();
    config.trace_collector_endpoint = args.trace_collector_endpoint.clone();
    config.publisher_proxy_address = args.publisher_proxy_address.clone();
    config.cache_scope = match args.cache_scope {
        CacheScopeArg::Shared => CacheScope::Shared,
        CacheScopeArg::Namespace => CacheScope::Namespace,
    };
    config.cache_signing_secret = args.cache_signing_secret.clone();
    config.image_signing_secret = args.image_signing_secret.clone().filter(|s| !s.is_empty());
    config.require_provenance = args.require_provenance;
    config.platforms = match args.platforms.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(list) => Some(
            crate::oci::Platform::parse_list(list)
                .map_err(|why| anyhow!("--platforms {list:?}: {why}"))?,
        ),
    };
    if config.require_provenance && config.image_signing_secret.is_none() {
        bail!(
            "--require-provenance checks images against the public key of \
             --image-signing-secret, which is empty: name the Secret (config.env's \
             image-signing-secret), or turn --require-provenance off"
        );
    }
    config.cache_repo = match args.cache_repo.as_str() {
        "none" => None,
        "REGISTRY/kiln-cache" => Some(format!("{}/kiln-cache", config.registry)),
        repo => {
            super::build::cache_repo(repo).context("--cache-repo")?;
            Some(repo.to_string())
        }
    };
    Ok(config)
}

/// `--cache-scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheScopeArg {
    /// One cache repository for every Function.
    Shared,
    /// One per Function namespace.
    Namespace,
}

/// Git references resolved with kiln's git client (the ref listing only, no clone).
struct GitLsRemote;

impl CommitResolver for GitLsRemote {
    fn resolve(
        &self,
        url: &str,
        reference: &str,
        access: &crate::git::Access,
    ) -> Result<String, String> {
        crate::git::resolve_reference(url, reference, access)
            .map_err(|e| format!("{:#}", anyhow::Error::new(e)))
    }
}
