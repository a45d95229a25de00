//! The build step of a reconcile: is the image of this build key in the registry, is its Job
//! running, finished or failed, may a new Job start (the cluster-wide cap), when may a failed
//! build run again (exponential backoff; a new build key retries at once), and the cleanup of
//! superseded builds' Jobs and ConfigMaps. BuildReady follows each step.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};

use super::apply;
use super::conditions::{Kind, State, reason};
use super::crd::Function;
use super::error::Result;
use super::names;
use super::plan::Plan;
use super::reconcile::Context;
use super::render;
use super::slots::{is_active, waiter};
use super::status::Working;
use super::stores::object_ref;

/// Where the build of the current key stands.
pub enum Build {
    /// The image exists: its manifest digest.
    Built(String),
    /// Not yet; look again after this.
    Pending(Option<Duration>),
}

/// Advances the build of `plan.key`.
///
/// # Errors
/// API or registry failures (retried by the error policy).
pub async fn step(f: &Function, plan: &Plan, ctx: &Context, st: &mut Working) -> Result<Build> {
    let ns = f.namespace_or_default();
    let job_name = names::build_name(f, &plan.key);
    if st.status.build_key.as_deref() != Some(plan.key.as_str()) {
        // A new build key: a new build, whatever happened to the last one.
        st.status.build_key = Some(plan.key.clone());
        st.status.failed_builds = None;
        cleanup(f, plan, ctx).await?;
        if let Some(digest) = ctx.images.find(&plan.push_image).await? {
            ctx.slots.forget(&waiter(f));
            st.set(
                Kind::BuildReady,
                State::True,
                reason::IMAGE_FOUND,
                format!("image {} already built", plan.push_image),
            );
            return Ok(Build::Built(digest.to_string()));
        }
    } else if built(st)
        && let Some(d) = &st.status.digest
    {
        return Ok(Build::Built(d.clone()));
    }
    let job = ctx.stores.jobs.get(&object_ref(ns, &job_name));
    match job {
        Some(job) if is_active(&job) => {
            st.set(
                Kind::BuildReady,
                State::Unknown,
                reason::JOB_RUNNING,
                format!("Job {job_name} is building the image"),
            );
            Ok(Build::Pending(Some(Duration::from_secs(60))))
        }
        Some(job) if succeeded(&job) => finished(f, plan, ctx, st, &job).await,
        Some(job) => failed(f, ctx, st, &job).await,
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

/// The Job succeeded: the digest is its termination message (`repo@sha256:…`).
async fn finished(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    job: &Job,
) -> Result<Build> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let message = termination_message(ctx, f.namespace_or_default(), &name).await?;
    let repository = plan.push_image.rsplit_once(':').map_or("", |(r, _)| r);
    let digest = match message.as_deref().and_then(|m| m.trim().rsplit_once('@')) {
        Some((repo, digest)) if repo == repository && digest.starts_with("sha256:") => {
            digest.to_string()
        }
        // No usable message: the registry knows what the tag names.
        _ => match ctx.images.find(&plan.push_image).await? {
            Some(d) => d.to_string(),
            None => {
                st.set(
                    Kind::BuildReady,
                    State::False,
                    reason::JOB_FAILED,
                    format!(
                        "Job {name} succeeded but {} is not in the registry",
                        plan.push_image
                    ),
                );
                return Ok(Build::Pending(Some(ctx.config.build_retry_base)));
            }
        },
    };
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
        format!("Job {name} finished"),
    );
    Ok(Build::Built(digest))
}

/// The Job failed: report why, and run it again once the backoff has passed.
async fn failed(f: &Function, ctx: &Context, st: &mut Working, job: &Job) -> Result<Build> {
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
            let why = termination_message(ctx, f.namespace_or_default(), &name)
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
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), f.namespace_or_default());
    apply::delete(&api, "Job", &name).await?;
    Ok(Build::Pending(Some(Duration::from_secs(1))))
}

/// No Job for this key: take a build slot and create the ConfigMap and the Job.
async fn start(f: &Function, plan: &Plan, ctx: &Context, st: &mut Working) -> Result<Build> {
    let ns = f.namespace_or_default();
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
        super::plumbing::ensure(ctx, ns).await?;
        if let Some(cm) = render::source::config_map(f, plan) {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
            apply::create(&api, "ConfigMap", &cm).await?;
            st.set(
                Kind::ConfigurationReady,
                State::True,
                reason::CONFIGMAP_CREATED,
                format!("ConfigMap {job_name} holds the source"),
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
        format!("Job {job_name} created to build {}", plan.push_image),
    );
    Ok(Build::Pending(Some(Duration::from_secs(60))))
}

/// Deletes the Jobs and ConfigMaps of `f`'s other build keys.
async fn cleanup(f: &Function, plan: &Plan, ctx: &Context) -> Result<()> {
    let label = names::key_label(&plan.key);
    let ns = f.namespace_or_default();
    let stale = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels
            .and_then(|l| l.get(names::BUILD_KEY))
            .is_some_and(|k| *k != label)
    };
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for job in ctx.stores.jobs_of(f) {
        if stale(job.metadata.labels.as_ref()) {
            apply::delete(
                &jobs,
                "Job",
                job.metadata.name.as_deref().unwrap_or_default(),
            )
            .await?;
        }
    }
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    for cm in ctx.stores.config_maps_of(f) {
        if stale(cm.metadata.labels.as_ref()) {
            apply::delete(
                &cms,
                "ConfigMap",
                cm.metadata.name.as_deref().unwrap_or_default(),
            )
            .await?;
        }
    }
    Ok(())
}

/// The termination message of the Job's Pod: the container that failed, else the build.
async fn termination_message(ctx: &Context, ns: &str, job: &str) -> Result<Option<String>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .map_err(super::error::Error::kube(format!(
            "listing the Pods of Job {ns}/{job}"
        )))?;
    let mut messages = Vec::new();
    for pod in list.items {
        let status = pod.status.unwrap_or_default();
        let all = status
            .init_container_statuses
            .into_iter()
            .flatten()
            .chain(status.container_statuses.into_iter().flatten());
        for c in all {
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
