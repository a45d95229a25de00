//! The Function's HorizontalPodAutoscaler (autoscaling/v2): it scales the **Function**
//! through its scale subresource (Kyma's design: any scaler can target the Function), between
//! `scaleConfig.minReplicas` and `maxReplicas`, at the configured CPU utilization. Only when
//! scaleConfig is set and min ≠ max; otherwise none.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};

use super::{child_meta, stamp};
use crate::controller::config::Config;
use crate::controller::crd::{API_VERSION, Function};
use crate::controller::names;

/// The HPA of `f`, or `None` when it should have none.
pub fn hpa(f: &Function, config: &Config) -> Option<HorizontalPodAutoscaler> {
    let scale = f.spec.scale_config.as_ref()?;
    if scale.min_replicas == scale.max_replicas {
        return None;
    }
    let mut h = HorizontalPodAutoscaler {
        metadata: child_meta(f, f.name_or_empty(), names::object_labels(f)),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(API_VERSION.into()),
                kind: "Function".into(),
                name: f.name_or_empty().into(),
            },
            min_replicas: Some(scale.min_replicas),
            // Kyma raises max to min when it is smaller (CEL refuses that, but be safe).
            max_replicas: scale.max_replicas.max(scale.min_replicas),
            metrics: Some(vec![MetricSpec {
                type_: "Resource".into(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".into(),
                    target: MetricTarget {
                        type_: "Utilization".into(),
                        average_utilization: Some(config.target_cpu_utilization),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: None,
        }),
        status: None,
    };
    stamp(&mut h, |h| &mut h.metadata);
    Some(h)
}
