//! The run step of a reconcile: apply the Deployment, Service and HPA (or the Knative
//! Service) for the image digest, and set Running from what the cluster reports. Env,
//! replica, resource and label changes land here without a rebuild: they change the
//! rendered objects, not the build key.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DynamicObject};

use super::apply::{self, Outcome};
use super::conditions::{Kind, State, reason};
use super::config::Serving;
use super::context::Context;
use super::crd::Function;
use super::error::Result;
use super::names;
use super::plan::Plan;
use super::render;
use super::status::Working;
use super::stores::{knative_resource, object_ref};

/// Runs `digest` of `plan`'s image; returns when to look again.
///
/// # Errors
/// API failures.
pub async fn step(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    digest: &str,
) -> Result<Option<Duration>> {
    st.status.image = Some(format!("{}@{digest}", plan.pull_repository));
    st.status.pod_selector = Some(names::selector_string(&names::selector_labels(f)));
    super::plumbing::ensure_function_namespace(ctx, f.namespace_or_default()).await?;
    match ctx.config.serving {
        Serving::Deployment => deployment(f, plan, ctx, st, digest).await,
        Serving::Knative => knative(f, plan, ctx, st, digest).await,
    }
}

async fn deployment(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    digest: &str,
) -> Result<Option<Duration>> {
    let (ns, name) = (f.namespace_or_default(), f.name_or_empty());
    let desired = render::deployment::deployment(f, plan, &ctx.config, digest);
    let live = ctx.stores.deployments.get(&object_ref(ns, name));
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let outcome =
        apply::apply(&api, "Deployment", &desired, live.as_deref(), &ctx.verified).await?;
    let service = render::service::service(f);
    let live_service = ctx.stores.services.get(&object_ref(ns, name));
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), ns);
    apply::apply(
        &services,
        "Service",
        &service,
        live_service.as_deref(),
        &ctx.verified,
    )
    .await?;
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), ns);
    let live_hpa = ctx.stores.hpas.get(&object_ref(ns, name));
    match render::hpa::hpa(f, &ctx.config) {
        Some(hpa) => {
            apply::apply(
                &hpas,
                "HorizontalPodAutoscaler",
                &hpa,
                live_hpa.as_deref(),
                &ctx.verified,
            )
            .await?;
        }
        None if live_hpa.is_some() => apply::delete(&hpas, "HorizontalPodAutoscaler", name).await?,
        None => {}
    }
    match outcome {
        Outcome::Created => {
            st.set(
                Kind::Running,
                State::Unknown,
                reason::DEPLOYMENT_CREATED,
                format!("Deployment {name} created"),
            );
            Ok(Some(ctx.config.requeue))
        }
        Outcome::Updated => {
            st.set(
                Kind::Running,
                State::Unknown,
                reason::DEPLOYMENT_UPDATED,
                format!("Deployment {name} updated"),
            );
            Ok(Some(ctx.config.requeue))
        }
        Outcome::Unchanged => {
            let live = live.expect("an unchanged Deployment was live");
            st.status.replicas = live.status.as_ref().and_then(|s| s.replicas).or(Some(0));
            Ok(running(&live, st, ctx))
        }
    }
}

/// Running from a Deployment's status (Kyma's rules).
fn running(d: &Deployment, st: &mut Working, ctx: &Context) -> Option<Duration> {
    let name = d.metadata.name.clone().unwrap_or_default();
    let status = d.status.clone().unwrap_or_default();
    let condition = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .cloned()
    };
    let generation = d.metadata.generation.unwrap_or(0);
    if status.observed_generation.unwrap_or(0) < generation {
        st.set(
            Kind::Running,
            State::Unknown,
            reason::DEPLOYMENT_WAITING,
            format!("Deployment {name} is rolling out"),
        );
        return Some(ctx.config.requeue);
    }
    let progressing = condition("Progressing");
    if progressing.as_ref().is_some_and(|c| c.status == "False") {
        let conditions = serde_yaml::to_string(&status.conditions).unwrap_or_default();
        st.set(
            Kind::Running,
            State::False,
            reason::DEPLOYMENT_FAILED,
            format!("Deployment {name} failed:\n{conditions}"),
        );
        return Some(Duration::from_secs(60));
    }
    let available = condition("Available").is_some_and(|c| c.status == "True");
    let rolled_out =
        progressing.is_some_and(|c| c.reason.as_deref() == Some("NewReplicaSetAvailable"));
    let wanted = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    if available && rolled_out && updated >= wanted {
        st.set(
            Kind::Running,
            State::True,
            reason::DEPLOYMENT_READY,
            format!("Deployment {name} is ready"),
        );
        return None;
    }
    if condition("Available").is_some_and(|c| c.status == "False") {
        st.set(
            Kind::Running,
            State::Unknown,
            reason::MIN_REPLICAS_NOT_AVAILABLE,
            format!("Deployment {name}: fewer Pods available than wanted"),
        );
    } else {
        st.set(
            Kind::Running,
            State::Unknown,
            reason::DEPLOYMENT_WAITING,
            format!("Deployment {name} is rolling out"),
        );
    }
    Some(ctx.config.requeue)
}

async fn knative(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    digest: &str,
) -> Result<Option<Duration>> {
    let (ns, name) = (f.namespace_or_default(), f.name_or_empty());
    let resource = knative_resource();
    let value = render::knative::service(f, plan, &ctx.config, digest);
    let desired: DynamicObject = serde_json::from_value(value)
        .map_err(|e| super::error::Error::Missing(format!("rendering the Knative Service: {e}")))?;
    let live = ctx.stores.knative.as_ref().and_then(|s| {
        s.get(&kube::runtime::reflector::ObjectRef::new_with(name, resource.clone()).within(ns))
    });
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &resource);
    let outcome = apply::apply(
        &api,
        "Knative Service",
        &desired,
        live.as_deref(),
        &ctx.verified,
    )
    .await?;
    if outcome != Outcome::Unchanged {
        st.set(
            Kind::Running,
            State::Unknown,
            reason::SERVICE_WAITING,
            format!("Knative Service {name} applied"),
        );
        return Ok(Some(ctx.config.requeue));
    }
    let live = live.expect("an unchanged Knative Service was live");
    let ready = live.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned();
    let message = |c: &serde_json::Value| c["message"].as_str().unwrap_or_default().to_string();
    match ready {
        Some(c) if c["status"] == "True" => {
            st.set(
                Kind::Running,
                State::True,
                reason::SERVICE_READY,
                format!("Knative Service {name} is ready"),
            );
            Ok(None)
        }
        Some(c) if c["status"] == "False" => {
            st.set(
                Kind::Running,
                State::False,
                reason::SERVICE_FAILED,
                format!("Knative Service {name} failed: {}", message(&c)),
            );
            Ok(Some(Duration::from_secs(60)))
        }
        _ => {
            st.set(
                Kind::Running,
                State::Unknown,
                reason::SERVICE_WAITING,
                format!("Knative Service {name} is not ready yet"),
            );
            Ok(Some(ctx.config.requeue))
        }
    }
}
