//! `kiln controller --serving knative`: a Knative Serving `Service` (serving.knative.dev/v1)
//! instead of the Deployment, Service and HPA — the flow Kyma had in 2019–2020. Cluster-local,
//! the image by digest, the same env, probes and security context as the Deployment, and the
//! replica bounds as Knative's autoscaling annotations. Rendered as JSON: k8s-openapi has no
//! Knative types.

use serde_json::{Value, json};

use super::deployment::{self, FUNCTION_PORT};
use crate::controller::config::Config;
use crate::controller::crd::Function;
use crate::controller::names;
use crate::controller::plan::Plan;

/// `apiVersion` of a Knative Service.
pub const API_VERSION: &str = "serving.knative.dev/v1";

/// The Knative Service of `f` running `digest`.
///
/// # Panics
/// Never: the k8s-openapi types always serialise.
pub fn service(f: &Function, plan: &Plan, config: &Config, digest: &str) -> Value {
    let (min, max) = match &f.spec.scale_config {
        Some(s) => (s.min_replicas, s.max_replicas.max(s.min_replicas)),
        None => {
            let n = f.spec.replicas.unwrap_or(1);
            (n, n.max(1))
        }
    };
    let mut container = deployment::container(f, plan, config, digest);
    // Knative routes to the one port it is told about (named for HTTP/1) and owns startup.
    container.ports = Some(vec![k8s_openapi::api::core::v1::ContainerPort {
        name: Some("http1".into()),
        container_port: FUNCTION_PORT,
        ..Default::default()
    }]);
    container.startup_probe = None;
    let mut pod = deployment::pod_spec(f, plan, config, digest);
    // Knative accepts the security context on the container, not (by default) on the Pod.
    pod.security_context = None;
    pod.containers = vec![container];
    let mut labels = serde_json::to_value(names::object_labels(f)).expect("labels serialise");
    labels["networking.knative.dev/visibility"] = json!("cluster-local");
    let mut template_labels = names::selector_labels(f);
    template_labels.extend(f.spec.labels.clone());
    template_labels.extend(names::selector_labels(f));
    template_labels.insert(names::APP_NAME.into(), f.name_or_empty().into());
    let mut annotations = f.spec.annotations.clone();
    annotations.insert("autoscaling.knative.dev/min-scale".into(), min.to_string());
    annotations.insert("autoscaling.knative.dev/max-scale".into(), max.to_string());
    let mut object = json!({
        "apiVersion": API_VERSION,
        "kind": "Service",
        "metadata": {
            "name": f.name_or_empty(),
            "namespace": f.namespace_or_default(),
            "labels": labels,
            "ownerReferences": [names::owner_reference(f)],
        },
        "spec": {
            "template": {
                "metadata": {"labels": template_labels, "annotations": annotations},
                "spec": pod,
            }
        }
    });
    let hash = {
        let mut h = crate::oci::Hasher::new();
        h.update(object.to_string().as_bytes());
        h.finish().0.hex()[..32].to_string()
    };
    object["metadata"]["annotations"] = json!({ names::APPLIED_HASH: hash });
    object
}
