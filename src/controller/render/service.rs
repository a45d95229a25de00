//! The Function's Service: `<name>`, port `http` 80 → 8080 (the name Istio needs), selecting
//! the runtime Pods, annotated for Prometheus scraping of `/metrics`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::deployment::FUNCTION_PORT;
use super::{child_meta, stamp};
use crate::controller::crd::Function;
use crate::controller::names;

/// The Service of `f`.
pub fn service(f: &Function) -> Service {
    let mut meta = child_meta(f, f.name_or_empty(), names::object_labels(f));
    meta.annotations = Some(BTreeMap::from([
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), FUNCTION_PORT.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
    ]));
    let mut s = Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(names::selector_labels(f)),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(FUNCTION_PORT)),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    };
    stamp(&mut s, |s| &mut s.metadata);
    s
}
