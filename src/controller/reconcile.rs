//! The reconcile of one Function, Kyma's state machine with kiln as the builder: validate →
//! resolve the runtime's images and the source → compute the build key → build (or find the
//! image) → deploy by digest → write the status once. Each step sets its condition; a step
//! that must wait ends the pass with a requeue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::controller::Action;
use tracing::Instrument;

use super::builds::{self, Build};
use super::conditions::{Kind, State, reason};
use super::context::Context;
use super::crd::{Function, GitRepositoryStatus};
use super::deploy;
use super::error::{Error, Result};
use super::lookup;
use super::plan::{self, Lookups};
use super::rebases;
use super::render;
use super::slots::waiter;
use super::status::{Working, Written};

/// When a pass whose Function was stale runs again at the latest.
const STALE_RETRY: Duration = Duration::from_secs(1);

/// Kyma's annotation: resolve a git source on every pass, not every few minutes.
pub const CONTINUOUS_GIT_CHECKOUT: &str = "serverless.kyma-project.io/continuousGitCheckout";

/// Reconciles `f`.
///
/// # Errors
/// API, registry or git failures; the error policy retries them with backoff.
pub async fn reconcile(f: Arc<Function>, ctx: Arc<Context>) -> Result<Action> {
    let span = tracing::info_span!(
        "reconcile",
        namespace = %f.namespace_or_default(),
        function = %f.name_or_empty(),
    );
    async move {
        ctx.stores.wait_ready().await;
        let started = Instant::now();
        let outcome = run(&f, &ctx).await;
        let result = if outcome.is_ok() { "ok" } else { "error" };
        ctx.metrics.reconciled(result, started.elapsed());
        if let Err(e) = &outcome {
            ctx.metrics.error(e.metric_label());
        }
        outcome
    }
    .instrument(span)
    .await
}

/// The error policy: log, and try again after a while.
pub fn error_policy(f: Arc<Function>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(
        namespace = %f.namespace_or_default(),
        function = %f.name_or_empty(),
        error = %error.chain(),
        "reconcile failed",
    );
    Action::requeue(Duration::from_secs(15))
}

async fn run(f: &Function, ctx: &Context) -> Result<Action> {
    if f.metadata.deletion_timestamp.is_some() {
        // Owner references garbage-collect every child.
        ctx.slots.forget(&waiter(f));
        ctx.rollouts.release(&rebases::rollout_id(f));
        return Ok(Action::await_change());
    }
    let mut st = Working::new(f);
    let action = steps(f, ctx, &mut st).await;
    st.status.observed_generation = f.metadata.generation;
    match st.write(&ctx.client, &ctx.recorder, f).await? {
        // The watch brings the newer Function, which is reconciled then; this is the
        // fallback.
        Written::Stale => Ok(Action::requeue(STALE_RETRY)),
        Written::Unchanged | Written::Written => action,
    }
}

async fn steps(f: &Function, ctx: &Context, st: &mut Working) -> Result<Action> {
    let mut verdict = super::validate::validate(f, &ctx.catalog);
    super::validate::check_managed_secrets(f, &ctx.config.managed_secrets(), &mut verdict);
    for warning in &verdict.warnings {
        tracing::debug!("{warning}");
    }
    if !verdict.errors.is_empty() {
        ctx.slots.forget(&waiter(f));
        st.set(
            Kind::ConfigurationReady,
            State::False,
            reason::INVALID_FUNCTION_SPEC,
            verdict.message(),
        );
        return Ok(Action::await_change());
    }
    let Ok((runtime, alias)) = ctx.catalog.resolve(&f.spec.runtime) else {
        // validate refuses unknown runtimes; this keeps the type system honest.
        return Ok(Action::await_change());
    };
    if let Some(alias) = alias
        && st.runtime_before() != Some(runtime.name.as_str())
    {
        // Said once, when the Function first runs on the stand-in (the webhook warned at
        // apply time; status.runtime and `kubectl get` show it from now on).
        st.note(reason::RUNTIME_SUBSTITUTED, alias.warning(&ctx.catalog));
    }
    st.status.runtime = Some(runtime.name.clone());
    let Some(found) = lookups(f, ctx, st, &runtime.name).await? else {
        return Ok(Action::requeue(ctx.config.build_retry_base));
    };
    let mut plan = plan::plan(f, runtime, &ctx.config, &found);
    // A base change the Function opted out of (or the dry run) keeps it on its images.
    let mut change = ctx
        .config
        .rebase
        .then(|| rebases::base_change(f, runtime, ctx, &found, &plan))
        .flatten();
    let mut held = None;
    if let Some(c) = change.take_if(|_| rebases::opted_out(f) || ctx.config.rebase_dry_run) {
        held = Some(match ctx.config.rebase_dry_run {
            true => rebases::would(&plan, ctx, &c).await,
            false => rebases::moved(
                &c,
                &plan,
                &format!(
                    "a newer base is available; the Function stays on its images (annotation \
                     {}: \"false\")",
                    rebases::AUTO_REBASE
                ),
            ),
        });
        plan = c.old_plan;
    }
    st.status.function_resource_profile = Some(plan.function_resources.profile.clone());
    st.status.build_resource_profile = Some(plan.build_resources.profile.clone());
    st.status.runtime_image = Some(plan.base.clone());
    st.status.runtime_image_override = f.spec.runtime_image_override.clone();
    st.status.pod_security_context = Some(render::deployment::pod_security_context(f));
    st.status.container_security_context = Some(render::deployment::container_security_context(f));
    match &plan.source {
        plan::SourcePlan::Git {
            commit, base_dir, ..
        } => {
            let git = f.spec.source.git_repository.as_ref();
            let message = match &found.git_note {
                Some(note) => format!("commit {commit}; {note}"),
                None => format!("commit {commit}"),
            };
            let said = st
                .condition(Kind::ConfigurationReady)
                .and_then(|c| c.message.as_deref());
            if st.status.commit.as_deref() != Some(commit.as_str())
                || said != Some(message.as_str())
            {
                st.set(
                    Kind::ConfigurationReady,
                    State::True,
                    reason::SOURCE_UPDATED,
                    message,
                );
            }
            st.status.commit = Some(commit.clone());
            st.status.base_dir = Some(base_dir.clone());
            st.status.reference = git.map(|g| g.reference.clone());
            st.status.git_repository = git.map(|g| GitRepositoryStatus {
                url: g.url.clone(),
                base_dir: Some(base_dir.clone()),
                reference: Some(g.reference.clone()),
                commit: Some(commit.clone()),
            });
        }
        plan::SourcePlan::Inline { .. } => {
            st.status.git_repository = None;
            if st
                .condition(Kind::ConfigurationReady)
                .is_none_or(|c| c.status != "True")
            {
                st.set(
                    Kind::ConfigurationReady,
                    State::True,
                    reason::CONFIGMAP_CREATED,
                    "source configured",
                );
            }
        }
    }
    let build = builds::step(f, &plan, ctx, st, change.as_ref()).await?;
    if let (Some(message), Build::Built(_)) = (held, &build) {
        st.set(
            Kind::BuildReady,
            State::True,
            reason::NEWER_BASE_AVAILABLE,
            message,
        );
    }
    let (digest, waiting) = match build {
        Build::Built(digest) => {
            st.status.digest = Some(digest.clone());
            (Some(digest), None)
        }
        // The image built last keeps running while the next one builds.
        Build::Pending(after) => (st.status.digest.clone(), after),
    };
    let Some(digest) = digest else {
        st.set(
            Kind::Running,
            State::Unknown,
            reason::WAITING_FOR_BUILD,
            "waiting for the first image",
        );
        return Ok(earliest([waiting.or(Some(ctx.config.requeue))]));
    };
    let deployed = deploy::step(f, &plan, ctx, st, &digest).await?;
    let id = rebases::rollout_id(f);
    if ctx.rollouts.holds(&id)
        && st
            .condition(Kind::Running)
            .is_some_and(|c| c.status == "True")
    {
        ctx.rollouts.release(&id);
    }
    // A git source is looked at again after the poll interval, or at once with Kyma's
    // continuousGitCheckout annotation (then every few seconds).
    let git_poll = f.spec.source.git_repository.as_ref().map(|_| {
        if continuous_checkout(f) {
            ctx.config.requeue
        } else {
            ctx.config.git_poll_interval
        }
    });
    Ok(earliest([waiting, deployed, git_poll]))
}

/// The first of several requeue times; waiting for a change only when none is set.
fn earliest(after: impl IntoIterator<Item = Option<Duration>>) -> Action {
    after
        .into_iter()
        .flatten()
        .min()
        .map_or_else(Action::await_change, Action::requeue)
}

/// The images, the commit and the registry config; `None` (with BuildReady or
/// ConfigurationReady False) when one cannot be had yet.
async fn lookups(
    f: &Function,
    ctx: &Context,
    st: &mut Working,
    runtime: &str,
) -> Result<Option<Lookups>> {
    let Some(images) = ctx.config.runtimes.get(runtime) else {
        st.set(
            Kind::BuildReady,
            State::False,
            reason::IMAGE_UNRESOLVED,
            format!(
                "the controller \
            has no base and builder images for runtime {runtime}: configure them \
            (--base-image/--builder-image {runtime}=REF)"
            ),
        );
        return Ok(None);
    };
    if let Some(image) = &f.spec.runtime_image_override
        && let Err(why) = super::override_image::check(image, &ctx.config, f.namespace_or_default())
    {
        st.set(
            Kind::BuildReady,
            State::False,
            reason::IMAGE_UNRESOLVED,
            why,
        );
        return Ok(None);
    }
    let base_ref = f
        .spec
        .runtime_image_override
        .clone()
        .unwrap_or_else(|| images.base.clone());
    let mut resolved = Vec::new();
    for (what, reference) in [("base", &base_ref), ("builder", &images.builder)] {
        match ctx.images.resolve(reference).await {
            Ok(r) => resolved.push(r),
            Err(e) => {
                st.set(
                    Kind::BuildReady,
                    State::False,
                    reason::IMAGE_UNRESOLVED,
                    format!("resolving the {what} image {reference}: {}", e.chain()),
                );
                return Ok(None);
            }
        }
    }
    let (commit, git_note) = match &f.spec.source.git_repository {
        Some(_) => match commit(f, ctx).await {
            Ok((c, note)) => (Some(c), note),
            Err(e) => {
                st.set(
                    Kind::ConfigurationReady,
                    State::False,
                    reason::SOURCE_UPDATE_FAILED,
                    e.chain(),
                );
                return Ok(None);
            }
        },
        None => (None, None),
    };
    let registry_config = ctx
        .registry_configs
        .digest(&ctx.client, f.namespace_or_default())
        .await?;
    let builder = resolved.pop().expect("two images resolved");
    let base = resolved.pop().expect("two images resolved");
    // Validation has refused an annotation that does not parse.
    let platforms = match super::validate::platforms(f) {
        Some(Ok(named)) => named,
        Some(Err(_)) | None => match &ctx.config.platforms {
            Some(flag) => flag.clone(),
            None => ctx.nodes.platforms(&ctx.client).await?,
        },
    };
    Ok(Some(Lookups {
        base,
        builder,
        commit,
        git_note,
        registry_config,
        platforms,
    }))
}

fn continuous_checkout(f: &Function) -> bool {
    f.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONTINUOUS_GIT_CHECKOUT))
        .is_some_and(|v| v == "true")
}

/// The commit a git source's reference names now: resolved again when the spec changed, the
/// poll interval passed, or the Function asks for continuous checkout. With it, what the
/// status should say besides (an SSH host key that was not verified).
async fn commit(f: &Function, ctx: &Context) -> Result<(String, Option<String>)> {
    let git = f
        .spec
        .source
        .git_repository
        .as_ref()
        .expect("called for git sources");
    let id = format!("{}/{}", f.namespace_or_default(), f.name_or_empty());
    let wanted = format!("{}#{}", git.url, git.reference);
    let continuous = continuous_checkout(f);
    {
        let checked = ctx.git_checked.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((source, commit, at, note)) = checked.get(&id)
            && *source == wanted
            && !continuous
            && at.elapsed() < ctx.config.git_poll_interval
        {
            return Ok((commit.clone(), note.clone()));
        }
    }
    let auth = match &git.auth {
        Some(auth) => {
            let key = auth.type_ == "key";
            let ns = f.namespace_or_default();
            Some(lookup::git_auth(&ctx.client, ns, &auth.secret_name, key).await?)
        }
        None => None,
    };
    let (credentials, ssh_key) = match auth {
        None => (None, None),
        Some(crate::git::Auth::Basic(c)) => (Some(c), None),
        Some(crate::git::Auth::Key(k)) => (None, Some(k)),
    };
    let note = match (&ssh_key, &git.auth) {
        (Some(key), Some(auth)) if key.known_hosts.is_none() => Some(format!(
            "the SSH host key was not verified: add a knownHosts entry to Secret {} to pin it",
            auth.secret_name
        )),
        _ => None,
    };
    // The build Job's `source` container trusts the CA bundle: so does the resolution.
    let extra_ca_pem = match &ctx.config.ca_bundle_configmap {
        Some(cm) => Some(lookup::ca_bundle(&ctx.client, &ctx.config.namespace, cm).await?),
        None => None,
    };
    let access = crate::git::Access {
        credentials,
        ssh_key,
        extra_ca_pem,
        ..crate::git::Access::default()
    };
    let (resolver, url, reference) = (ctx.git.clone(), git.url.clone(), git.reference.clone());
    let commit = tokio::task::spawn_blocking(move || resolver.resolve(&url, &reference, &access))
        .await
        .map_err(|e| Error::Missing(format!("git resolver task: {e}")))?
        .map_err(|message| Error::Git {
            // Parsed as the build parses it (an scp-like SSH URL too), so it holds no password.
            url: crate::git::RemoteUrl::parse(&git.url)
                .map_or_else(|e| e.to_string(), |u| u.to_string()),
            reference: git.reference.clone(),
            message,
        })?;
    let mut checked = ctx.git_checked.lock().unwrap_or_else(|e| e.into_inner());
    checked.insert(id, (wanted, commit.clone(), Instant::now(), note.clone()));
    Ok((commit, note))
}
