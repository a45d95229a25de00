//! The build step of a reconcile: is the image of this build key in the registry, is its Job
//! running, finished or failed, may a new Job start (the cluster-wide cap), when may a failed
//! build run again (exponential backoff; a new build key retries at once), and the cleanup of
//! superseded builds' Jobs and ConfigMaps. BuildReady follows each step.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams};

use super::apply;
use super::conditions::{Kind, State, reason};
use super::context::Context;
use super::crd::Function;
use super::error::{Error, Result};
use super::names;
use super::plan::{Plan, SourcePlan};
use super::rebases::{self, Attempt, BaseChange};
use super::records;
use super::render;
use super::render::source::Copied;
use super::slots::{is_active, waiter};
use super::status::Working;
use super::stores::object_ref;
use crate::oci::Digest;

/// Where the build of the current key stands.
pub enum Build {
    /// The image exists: its manifest digest.
    Built(String),
    /// Not yet; look again after this.
    Pending(Option<Duration>),
}

/// Advances the build of `plan.key`. Only a digest in the controller's records (what its
/// own build Jobs reported) is ever taken as built: an image under the build key's tag that
/// the records do not hold is built again, whoever pushed it.
///
/// # Errors
/// API or registry failures (retried by the error policy).
pub async fn step(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    base_change: Option<&BaseChange>,
) -> Result<Build> {
    let ns = ctx.config.build_namespace.as_str();
    // The runtime's images changed and nothing else: the image built last is rebased when
    // that is safe. Until that has happened the status keeps the last build key, so a queued
    // rebase is tried again.
    if let Some(change) = base_change
        && records::recorded(ctx, f, &plan.key).is_none()
    {
        match rebases::attempt(f, plan, ctx, st, change).await? {
            Attempt::Rebased(digest) => {
                st.status.build_key = Some(plan.key.clone());
                st.status.failed_builds = None;
                cleanup(f, plan, ctx).await?;
                return Ok(Build::Built(digest));
            }
            Attempt::Queued(after) => return Ok(Build::Pending(Some(after))),
            Attempt::Build => {}
        }
    }
    let job_name = names::build_name(f, &plan.key);
    let new_key = st.status.build_key.as_deref() != Some(plan.key.as_str());
    if new_key {
        // A new build key: a new build, whatever happened to the last one.
        st.status.build_key = Some(plan.key.clone());
        st.status.failed_builds = None;
        cleanup(f, plan, ctx).await?;
    }
    if let Some((digest, on)) = records::recorded_on(ctx, f, &plan.key) {
        if !new_key && built(st) && st.status.digest.as_deref() == Some(digest.as_str()) {
            return Ok(Build::Built(digest));
        }
        // Built before (a revert, a Function created again): deployed if the registry still
        // has it.
        let image = format!("{}@{digest}", plan.repository());
        // Taken by this controller a moment ago (a rebase, proven then): there, and proven.
        let taken = ctx.taken.holds(&image);
        let found = taken || ctx.images.find(&image).await?.is_some();
        let why = if found && !taken {
            unproven(ctx, plan, &image, None).await?
        } else {
            None
        };
        if let Some(why) = &why {
            // Built again: an honest build signs what it pushes, also an image that exists.
            tracing::info!(%image, why, "not deploying the image built before");
        } else if found {
            ctx.slots.forget(&waiter(f));
            let rebased = on.is_some_and(|on| on.rebased);
            // A rebase whose status write lost a race to another write of the Function.
            let (why, message) = match rebased {
                true => (
                    reason::IMAGE_REBASED,
                    "was rebased onto the new base image, no build",
                ),
                false => (reason::IMAGE_FOUND, "was built for this build key before"),
            };
            st.set(
                Kind::BuildReady,
                State::True,
                why,
                format!("image {image} {message}"),
            );
            return Ok(Build::Built(digest));
        }
    }
    let job = ctx.stores.jobs.get(&object_ref(ns, &job_name));
    match job {
        Some(job) if is_active(&job) => {
            st.set(
                Kind::BuildReady,
                State::Unknown,
                reason::JOB_RUNNING,
                format!("Job {ns}/{job_name} is building the image"),
            );
            Ok(Build::Pending(Some(Duration::from_secs(60))))
        }
        Some(job) if succeeded(&job) => finished(f, plan, ctx, st, &job).await,
        Some(job) => failed(ctx, st, &job).await,
        None => start(f, plan, ctx, st).await,
    }
}

fn built(st: &Working) -> bool {
    st.condition(Kind::BuildReady)
        .is_some_and(|c| c.status == "True")
        && st.status.digest.is_some()
}

fn succeeded(job: &Job) -> bool {
    job.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0
}

/// The Job succeeded: the digest is the termination message of its `build` container
/// (`repo@sha256:…`), which runs no third-party code; it goes into the records. No other
/// container's message and no tag lookup counts: an install script writes the first, and
/// anyone with push access the second.
async fn finished(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    job: &Job,
) -> Result<Build> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let repository = plan.repository();
    let message = termination_message(ctx, &name, Some(render::job::BUILD_CONTAINER)).await?;
    let reported = message
        .as_deref()
        .and_then(|m| m.trim().rsplit_once('@'))
        .filter(|(repo, digest)| *repo == repository && digest.parse::<Digest>().is_ok());
    let Some((_, digest)) = reported else {
        return refuse(ctx, st, &name, reason::JOB_FAILED, |delay| {
            format!(
                "Job {}/{name} succeeded but its build container reported no image of {repository} \
                    (termination message {:?}); it will be re-run in {}s",
                ctx.config.build_namespace,
                message.as_deref().unwrap_or_default().trim(),
                delay.as_secs()
            )
        })
        .await;
    };
    let digest = digest.to_string();
    if let Some(why) = unproven(ctx, plan, &format!("{repository}@{digest}"), None).await? {
        return refuse(ctx, st, &name, reason::PROVENANCE_INVALID, |delay| {
            format!(
                "Job {}/{name} pushed {repository}@{digest}, which is not deployed without a \
                    provenance signed by the image signing key for this build: {why}; it will be \
                    re-run in {}s",
                ctx.config.build_namespace,
                delay.as_secs()
            )
        })
        .await;
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let now = u64::try_from(now).unwrap_or(0);
    records::record(ctx, f, &plan.key, &digest, &plan.built_on(), now).await?;
    if let Some(took) = job_duration(job) {
        ctx.metrics.build_finished(took);
    }
    if st
        .condition(Kind::BuildReady)
        .is_none_or(|c| c.reason.as_deref() != Some(reason::JOB_FINISHED))
    {
        ctx.slots.wake(running_jobs(ctx));
    }
    st.status.failed_builds = None;
    st.set(
        Kind::BuildReady,
        State::True,
        reason::JOB_FINISHED,
        format!("Job {}/{name} finished", ctx.config.build_namespace),
    );
    Ok(Build::Built(digest))
}

/// A Job that succeeded gave no image to deploy: counted as a failed build, reported with
/// `reason` and the message `says` makes of the backoff, and deleted, so it runs again after
/// the backoff.
async fn refuse(
    ctx: &Context,
    st: &mut Working,
    name: &str,
    reason: &str,
    says: impl FnOnce(Duration) -> String,
) -> Result<Build> {
    st.status.failed_builds = Some(st.status.failed_builds.unwrap_or(0) + 1);
    let delay = backoff(ctx, st.status.failed_builds.unwrap_or(1));
    let message = super::status::truncate(&says(delay), 4096);
    st.set(Kind::BuildReady, State::False, reason, message);
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.config.build_namespace);
    apply::delete(&api, "Job", name).await?;
    ctx.slots.wake(running_jobs(ctx));
    Ok(Build::Pending(Some(delay)))
}

/// With `--require-provenance`, why `image` may not be deployed for `plan`: `None` when a
/// signature and a provenance by the image signing key name it as pushed under the build
/// key's tag (`plan.push_image`), and always without the flag. The key is the Secret's
/// `cosign.pub`: `known` when the caller read it already (a rebase it signed), else read now.
///
/// # Errors
/// The signing Secret cannot be read, or a registry failure.
pub(super) async fn unproven(
    ctx: &Context,
    plan: &Plan,
    image: &str,
    known: Option<crate::cosign::VerifyKey>,
) -> Result<Option<String>> {
    let config = &ctx.config;
    let (true, Some(secret)) = (config.require_provenance, &config.image_signing_secret) else {
        return Ok(None);
    };
    let key = match known {
        Some(key) => key,
        None => super::lookup::image_verify_key(&ctx.client, &config.namespace, secret).await?,
    };
    Ok(ctx
        .images
        .provenance(image, &key, &plan.push_image)
        .await?
        .err())
}

/// The Job failed: report why, and run it again once the backoff has passed.
async fn failed(ctx: &Context, st: &mut Working, job: &Job) -> Result<Build> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let already_counted = st.condition(Kind::BuildReady).is_some_and(|c| {
        c.reason.as_deref() == Some(reason::JOB_FAILED)
            && c.message
                .as_deref()
                .is_some_and(|m| m.starts_with(&format!("Job {name} failed")))
    });
    if !already_counted {
        st.status.failed_builds = Some(st.status.failed_builds.unwrap_or(0) + 1);
        if let Some(took) = job_duration(job) {
            ctx.metrics.build_finished(took);
        }
        ctx.slots.wake(running_jobs(ctx));
    }
    let failures = st.status.failed_builds.unwrap_or(1);
    let delay = backoff(ctx, failures);
    let since = failed_at(job).map_or(Duration::ZERO, |t| {
        let now = k8s_openapi::jiff::Timestamp::now();
        Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO)
    });
    if since < delay {
        if !already_counted {
            let why = termination_message(ctx, &name, None)
                .await?
                .unwrap_or_else(|| "no message; see the Job's logs".into());
            let message = format!(
                "Job {name} failed, it will be re-run in {}s: {}",
                delay.as_secs(),
                why.trim()
            );
            st.set(
                Kind::BuildReady,
                State::False,
                reason::JOB_FAILED,
                super::status::truncate(&message, 4096),
            );
        }
        return Ok(Build::Pending(Some(delay - since)));
    }
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.config.build_namespace);
    apply::delete(&api, "Job", &name).await?;
    Ok(Build::Pending(Some(Duration::from_secs(1))))
}

/// No Job for this key: take a build slot and create, in the build namespace, what the Job
/// mounts (the source ConfigMap, copies of the Function namespace's git and package-registry
/// Secrets) and the Job.
async fn start(f: &Function, plan: &Plan, ctx: &Context, st: &mut Working) -> Result<Build> {
    let ns = ctx.config.build_namespace.as_str();
    let job = render::job::job(f, plan, &ctx.config);
    let job_name = job.metadata.name.clone().unwrap_or_default();
    let key = format!("{ns}/{job_name}");
    let jobs = || {
        ctx.stores.jobs.state().into_iter().map(|j| {
            let key = format!(
                "{}/{}",
                j.metadata.namespace.as_deref().unwrap_or_default(),
                j.metadata.name.as_deref().unwrap_or_default()
            );
            (key, is_active(&j))
        })
    };
    let generation = f.metadata.generation;
    if let Err(running) = ctx.slots.try_take_with(&key, &waiter(f), generation, jobs) {
        // A fixed message: a count in it would rewrite every waiting Function's status
        // whenever a build starts or ends.
        tracing::debug!(running, "waiting for a build slot");
        let max = ctx.slots.max();
        let message = format!("waiting for a build slot: at most {max} builds run at once");
        st.set(
            Kind::BuildReady,
            State::Unknown,
            reason::JOB_QUEUED,
            message,
        );
        // A finished build wakes the oldest waiters at once; this is the fallback.
        return Ok(Build::Pending(Some(ctx.config.requeue * 6)));
    }
    let created = async {
        super::plumbing::ensure_build_namespace(ctx).await?;
        copy_secrets(f, plan, ctx).await?;
        if let Some(cm) = render::source::config_map(f, plan, &ctx.config) {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
            apply::create(&api, "ConfigMap", &cm).await?;
            st.set(
                Kind::ConfigurationReady,
                State::True,
                reason::CONFIGMAP_CREATED,
                format!("ConfigMap {ns}/{job_name} holds the source"),
            );
        }
        let api: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
        apply::create(&api, "Job", &job).await
    }
    .await;
    if let Err(e) = created {
        ctx.slots.release(&key);
        return Err(e);
    }
    ctx.metrics.build_started();
    st.set(
        Kind::BuildReady,
        State::Unknown,
        reason::JOB_CREATED,
        format!("Job {ns}/{job_name} created to build {}", plan.push_image),
    );
    Ok(Build::Pending(Some(Duration::from_secs(60))))
}

/// Copies the Function namespace's Secrets the build mounts (git credentials, the
/// package-registry config) next to the Job: a Pod mounts Secrets of its own namespace only.
async fn copy_secrets(f: &Function, plan: &Plan, ctx: &Context) -> Result<()> {
    let ns = f.namespace_or_default();
    let tenant: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let git = match &plan.source {
        SourcePlan::Git {
            auth_secret: Some(name),
            ..
        } => Some((Copied::Git, name.as_str(), true)),
        _ => None,
    };
    let packages = (
        Copied::Packages,
        ctx.config.package_registry_secret.as_str(),
        false,
    );
    let copies: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.config.build_namespace);
    for (which, name, required) in git.into_iter().chain([packages]) {
        let original = tenant
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("reading Secret {ns}/{name}")))?;
        match original {
            Some(original) => {
                let copy = render::source::secret_copy(f, plan, &ctx.config, which, &original);
                apply::create(&copies, "Secret", &copy).await?;
            }
            None if required => {
                return Err(Error::Missing(format!(
                    "the git credentials Secret {ns}/{name} does not exist"
                )));
            }
            None => {}
        }
    }
    Ok(())
}

/// Deletes what `f`'s other build keys keep in the build namespace: Jobs, ConfigMaps, and
/// Secret copies.
async fn cleanup(f: &Function, plan: &Plan, ctx: &Context) -> Result<()> {
    let label = names::key_label(&plan.key);
    let stale = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels
            .and_then(|l| l.get(names::BUILD_KEY))
            .is_some_and(|k| *k != label)
    };
    let ns = ctx.config.build_namespace.as_str();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for job in ctx.stores.jobs_of(f) {
        if stale(job.metadata.labels.as_ref()) {
            let name = job.metadata.name.as_deref().unwrap_or_default();
            apply::delete(&jobs, "Job", name).await?;
        }
    }
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    for cm in ctx.stores.config_maps_of(f) {
        if stale(cm.metadata.labels.as_ref()) {
            let name = cm.metadata.name.as_deref().unwrap_or_default();
            apply::delete(&cms, "ConfigMap", name).await?;
        }
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    for secret in ctx.stores.secrets_of(f) {
        if stale(secret.metadata.labels.as_ref()) {
            let name = secret.metadata.name.as_deref().unwrap_or_default();
            apply::delete(&secrets, "Secret", name).await?;
        }
    }
    Ok(())
}

/// The termination message of the Job's Pod: of container `only`, or else of the container
/// that failed, else of the last one that wrote one.
async fn termination_message(
    ctx: &Context,
    job: &str,
    only: Option<&str>,
) -> Result<Option<String>> {
    let ns = ctx.config.build_namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .map_err(Error::kube(format!("listing the Pods of Job {ns}/{job}")))?;
    let mut messages = Vec::new();
    for pod in list.items {
        let status = pod.status.unwrap_or_default();
        let all = status
            .init_container_statuses
            .into_iter()
            .flatten()
            .chain(status.container_statuses.into_iter().flatten());
        for c in all.filter(|c| only.is_none_or(|name| c.name == name)) {
            if let Some(t) = c.state.and_then(|s| s.terminated) {
                let message = t.message.unwrap_or_default();
                if t.exit_code != 0 {
                    return Ok(Some(message));
                }
                if !message.is_empty() {
                    messages.push(message);
                }
            }
        }
    }
    Ok(messages.pop())
}

/// Build Jobs running now, by the cache.
pub fn running_jobs(ctx: &Context) -> usize {
    ctx.stores
        .jobs
        .state()
        .iter()
        .filter(|j| is_active(j))
        .count()
}

fn backoff(ctx: &Context, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    ctx.config
        .build_retry_base
        .saturating_mul(1 << exp)
        .min(ctx.config.build_retry_max)
}

fn failed_at(job: &Job) -> Option<k8s_openapi::jiff::Timestamp> {
    let status = job.status.as_ref()?;
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Failed" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

fn job_duration(job: &Job) -> Option<Duration> {
    let status = job.status.as_ref()?;
    let start = status.start_time.as_ref()?.0;
    let end = status
        .completion_time
        .as_ref()
        .map(|t| t.0)
        .or_else(|| failed_at(job))?;
    Duration::try_from(end.duration_since(start)).ok()
}
