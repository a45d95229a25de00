//! Pure renderers: a Function and its [`Plan`] in, the Kubernetes objects that run it out —
//! the source ConfigMap, the build Job, and the Deployment, Service and HPA (or a Knative
//! Service). No I/O: the reconciler applies what these return. Every object carries the
//! owner reference to its Function and an annotation with the digest of its own content, so
//! an unchanged object is never written again.
//!
//! [`Plan`]: super::plan::Plan

pub mod deployment;
pub mod hpa;
pub mod job;
pub mod knative;
pub mod service;
pub mod source;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Capabilities, SeccompProfile, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use super::config::Config;
use super::crd::Function;
use super::names;
use super::plan::Plan;
use crate::oci::Hasher;

/// Where the Function's Pods may run: for a one-platform image, Nodes of that platform, by
/// the labels every kubelet sets. An image index runs on a Node of any platform it has, and
/// by default it has every Node's: no selector.
pub fn node_selector(plan: &Plan) -> Option<BTreeMap<String, String>> {
    match plan.platforms.as_slice() {
        [one] => Some(platform_selector(one)),
        _ => None,
    }
}

/// Where a build Job runs: on a Node of the platform it builds for; with several, of the
/// controller's own platform when it is one of them, else of the first. The runtimes'
/// builder images carry kiln for the platform kiln was built for (another platform's builder
/// has it only when `kiln base build` was given a kiln for it), and the install is native
/// there.
pub fn build_node_selector(plan: &Plan) -> Option<BTreeMap<String, String>> {
    let own = crate::oci::Platform::host();
    let platform = plan
        .platforms
        .iter()
        .find(|p| p.os == own.os && p.architecture == own.architecture)
        .or_else(|| plan.platforms.first())?;
    Some(platform_selector(platform))
}

fn platform_selector(platform: &crate::oci::Platform) -> BTreeMap<String, String> {
    use super::lookup::{NODE_ARCH, NODE_OS};
    BTreeMap::from([
        (NODE_OS.to_string(), platform.os.clone()),
        (NODE_ARCH.to_string(), platform.architecture.clone()),
    ])
}

/// Metadata of a child of `f`: its name, the Function's namespace, labels, the owner
/// reference.
pub fn child_meta(f: &Function, name: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(f.namespace_or_default().into()),
        labels: Some(labels),
        owner_references: Some(vec![names::owner_reference(f)]),
        ..ObjectMeta::default()
    }
}

/// Metadata of what a build of `plan` keeps in the build namespace: `name`, the build labels
/// and the build key. No owner reference: one cannot cross namespaces (the garbage collector
/// would take it for a missing owner and delete the object).
pub fn build_meta(f: &Function, plan: &Plan, config: &Config, name: &str) -> ObjectMeta {
    let mut labels = names::build_labels(f, "build");
    labels.insert(names::BUILD_KEY.into(), names::key_label(&plan.key));
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(config.build_namespace.clone()),
        labels: Some(labels),
        ..ObjectMeta::default()
    }
}

/// Stamps `object` with the digest of its content in [`names::APPLIED_HASH`], computed over
/// the object as rendered (with no hash annotation yet).
///
/// # Panics
/// Never: the objects are plain data and always serialise.
pub fn stamp<T: Serialize>(object: &mut T, meta: impl Fn(&mut T) -> &mut ObjectMeta) {
    let bytes = serde_json::to_vec(&*object).expect("rendered objects serialise");
    let mut h = Hasher::new();
    h.update(&bytes);
    let digest = h.finish().0;
    meta(object)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(names::APPLIED_HASH.into(), digest.hex()[..32].to_string());
}

/// The applied-hash annotation of live metadata, if any.
pub fn applied_hash(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(names::APPLIED_HASH))
        .map(String::as_str)
}

/// The container security context of every container kiln renders: no privilege, no
/// escalation, no capabilities, a read-only root filesystem, not root, the runtime's default
/// seccomp profile.
pub fn restricted_container() -> SecurityContext {
    SecurityContext {
        privileged: Some(false),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..SecurityContext::default()
    }
}

/// `seccompProfile: {type: RuntimeDefault}`.
pub fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

#[cfg(test)]
mod tests;
