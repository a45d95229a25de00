//! The checks on a Function that the CRD's CEL rules cannot express (and, again, the ones they
//! can, so the controller applies the same rules to objects that never met the API server's
//! CEL: older CRDs, `kubectl apply --validate=false` with the CRD missing a rule). Used by the
//! validating webhook (deny with these messages) and by the controller (ConfigurationReady=False,
//! reason InvalidFunctionSpec, same messages). Pure: no I/O.
//!
//! Kyma's rules (legacy controller `validation.go`, v1alpha1 webhook) plus kiln's: the name is a
//! DNS-1035 label and `<namespace>/<name>` a repository path; the runtime is one of
//! the catalog's (or a Kyma name it maps, with a warning); resource minimums, requests ≤
//! limits; env, secretMount, label and annotation rules; the dependency manifest's syntax;
//! git sources over HTTP(S) (anonymous or Basic) or SSH with a key; a valid
//! runtimeImageOverride; scaling bounds.
//!
//! A finding is data, not a Rust error: validation itself cannot fail, so there is no
//! `Error` enum here; a [`Verdict`] lists [`Violation`]s (field path + message) and warnings.

mod env;
pub use crate::k8s_names as names;
mod pod;
mod resources;
mod security;
mod source;

use std::fmt;

use super::crd::Function;
use crate::oci::Platform;
use crate::registry::Reference;
use crate::runtime::{Catalog, RuntimeSpec};

pub use names::{
    config_map_key, dns1035_label, dns1123_label, dns1123_subdomain, env_var_name, label_value,
    qualified_name,
};
pub use pod::MAX_ANNOTATIONS_BYTES;

/// One thing wrong with a Function: where, and what (including what to do about it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The field path, `spec.env[2].name`.
    pub field: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The outcome: valid when there are no errors; warnings never block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// What must change before the Function can be built.
    pub errors: Vec<Violation>,
    /// What the user should know (a Kyma runtime name mapped to a kiln runtime, …).
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Whether the Function may be admitted and built.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// Every error, `field: message`, joined with `; ` (the condition and denial message).
    pub fn message(&self) -> String {
        self.errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub(crate) fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    pub(crate) fn warn(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }
}

/// Checks `function` against every rule; `catalog` says which runtimes exist.
pub fn validate(function: &Function, catalog: &Catalog) -> Verdict {
    let mut verdict = Verdict::default();
    check_name(function, &mut verdict);
    let runtime = check_runtime(function, catalog, &mut verdict);
    let spec = &function.spec;
    if let Some(image) = &spec.runtime_image_override
        && let Err(e) = image.parse::<Reference>()
    {
        verdict.error(
            "spec.runtimeImageOverride",
            format!("{e}; give a base image reference such as registry.example.com/team/base:1"),
        );
    }
    resources::check(spec.resource_configuration.as_ref(), &mut verdict);
    env::check(&spec.env, &mut verdict);
    pod::check_secret_mounts(&spec.secret_mounts, runtime, &mut verdict);
    pod::check_labels(&spec.labels, &mut verdict);
    pod::check_annotations(&spec.annotations, &mut verdict);
    security::check(
        spec.pod_security_context.as_ref(),
        spec.container_security_context.as_ref(),
        &mut verdict,
    );
    source::check(&spec.source, runtime, &mut verdict);
    check_scaling(function, &mut verdict);
    if let Some(Err(why)) = platforms(function) {
        let field = format!("metadata.annotations[{}]", super::names::PLATFORMS);
        verdict.error(field, why);
    }
    check_auto_rebase(function, &mut verdict);
    verdict
}

/// The opt-out of automatic rebases ([`super::rebases::AUTO_REBASE`]): `"true"` or `"false"`.
/// Any other value pins the Function as `"false"` does (the safe reading of a misspelt opt-out,
/// `"False"` or `"no"`), with a warning that says so. A warning, not an error: an annotation
/// changes with `kubectl annotate`, which the webhook's ratchet lets through, and an error
/// would stop the Function's reconciling altogether.
fn check_auto_rebase(function: &Function, verdict: &mut Verdict) {
    let name = super::rebases::AUTO_REBASE;
    let Some(value) = function
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
    else {
        return;
    };
    if value != "true" && value != "false" {
        verdict.warn(format!(
            "metadata.annotations[{name}]: {value:?} is neither \"true\" nor \"false\", and \
             is read as \"false\": the Function stays on the images it was built on when the \
             runtime's base changes. Write \"false\" to mean that, or \"true\"."
        ));
    }
}

/// The platforms the Function's annotation ([`super::names::PLATFORMS`]) names, if it has
/// the annotation: Linux platforms, each once.
///
/// # Errors
/// What is wrong with the annotation's value.
pub fn platforms(function: &Function) -> Option<Result<Vec<Platform>, String>> {
    let value = function
        .metadata
        .annotations
        .as_ref()?
        .get(super::names::PLATFORMS)?;
    let parsed =
        Platform::parse_list(value).and_then(|list| match list.iter().find(|p| p.os != "linux") {
            Some(p) => Err(format!(
                "{p} is not a Linux platform: Functions run on Linux"
            )),
            None => Ok(list),
        });
    Some(parsed.map_err(|why| {
        format!("{why}; name the platforms to build for, e.g. linux/amd64,linux/arm64")
    }))
}

/// Refuses the Secrets the controller keeps for the platform (`managed`: the push Secret's
/// and the pull Secret's names) as a Function's `secretMounts` or env `secretKeyRef`: they
/// carry the registry's credentials, never a tenant's.
pub fn check_managed_secrets<S: AsRef<str>>(
    function: &Function,
    managed: &[S],
    verdict: &mut Verdict,
) {
    let spec = &function.spec;
    let is_managed = |name: &str| managed.iter().any(|m| m.as_ref() == name);
    let refuse = |name: &str| {
        format!(
            "{name:?} is a Secret the kiln controller keeps for the platform's registry \
             credentials; a Function may not read it: use a Secret of your own"
        )
    };
    for (i, mount) in spec.secret_mounts.iter().enumerate() {
        if is_managed(&mount.secret_name) {
            let field = format!("spec.secretMounts[{i}].secretName");
            verdict.error(field, refuse(&mount.secret_name));
        }
    }
    for (i, var) in spec.env.iter().enumerate() {
        let secret = var
            .value_from
            .as_ref()
            .and_then(|f| f.secret_key_ref.as_ref());
        if let Some(secret) = secret
            && is_managed(&secret.name)
        {
            let field = format!("spec.env[{i}].valueFrom.secretKeyRef.name");
            verdict.error(field, refuse(&secret.name));
        }
    }
}

fn check_name(function: &Function, verdict: &mut Verdict) {
    let meta = &function.metadata;
    let name = match (meta.name.as_deref(), meta.generate_name.as_deref()) {
        (Some(name), _) if !name.is_empty() => name,
        // On CREATE with generateName the mutating webhook sees no name yet: the prefix plus
        // five random characters must make a DNS-1035 label.
        (_, Some(prefix)) if !prefix.is_empty() => {
            let sample = format!("{prefix}abcde");
            if let Err(e) = dns1035_label(&sample) {
                verdict.error(
                    "metadata.generateName",
                    format!(
                        "{prefix:?} cannot start a Function name: with 5 generated characters \
                         it {e}"
                    ),
                );
            }
            return;
        }
        _ => {
            verdict.error("metadata.name", "a Function needs a name");
            return;
        }
    };
    if let Err(e) = dns1035_label(name) {
        verdict.error(
            "metadata.name",
            format!(
                "{name:?} is not a valid Function name: it names the Function's Service, and \
                 {e}"
            ),
        );
        return;
    }
    let namespace = function.namespace_or_default();
    if let Err(e) = dns1123_label(namespace) {
        verdict.error(
            "metadata.namespace",
            format!("{namespace:?} is not a valid namespace: {e}"),
        );
        return;
    }
    // The image repository is `<registry>/<namespace>/<name>`.
    let repository = format!("{namespace}/{name}");
    if let Err(e) = format!("registry.invalid/{repository}").parse::<Reference>() {
        verdict.error(
            "metadata.name",
            format!("{repository:?} cannot name the Function's image repository: {e}"),
        );
    }
}

fn check_runtime<'c>(
    function: &Function,
    catalog: &'c Catalog,
    verdict: &mut Verdict,
) -> Option<&'c RuntimeSpec> {
    match catalog.resolve(&function.spec.runtime) {
        Ok((runtime, alias)) => {
            if let Some(alias) = alias {
                verdict.warn(alias.warning(catalog));
            }
            Some(runtime)
        }
        Err(e) => {
            verdict.error(
                "spec.runtime",
                format!(
                    "{:?} is not a supported runtime; use one of {}",
                    e.name,
                    e.known.join(", ")
                ),
            );
            None
        }
    }
}

fn check_scaling(function: &Function, verdict: &mut Verdict) {
    let spec = &function.spec;
    if let Some(replicas) = spec.replicas
        && replicas < 0
    {
        verdict.error(
            "spec.replicas",
            format!("{replicas} is negative; use 0 or more"),
        );
    }
    if let Some(scale) = &spec.scale_config {
        for (field, value) in [
            ("spec.scaleConfig.minReplicas", scale.min_replicas),
            ("spec.scaleConfig.maxReplicas", scale.max_replicas),
        ] {
            if value < 1 {
                verdict.error(field, format!("{value} is below 1; use 1 or more"));
            }
        }
        if scale.min_replicas > scale.max_replicas {
            verdict.error(
                "spec.scaleConfig",
                format!(
                    "minReplicas ({}) exceeds maxReplicas ({}); lower minReplicas or raise \
                     maxReplicas",
                    scale.min_replicas, scale.max_replicas
                ),
            );
        }
    }
    // Kyma's CEL rule: an empty template is tolerated, labels or annotations in it are not.
    match &spec.template {
        Some(t) if t.labels.is_some() || t.annotations.is_some() => verdict.error(
            "spec.template",
            "is no longer supported (deprecated in Kyma); move its labels to spec.labels and \
             its annotations to spec.annotations",
        ),
        Some(_) => verdict.warn("spec.template is deprecated and ignored; remove it"),
        None => {}
    }
}

#[cfg(test)]
mod pod_tests;
#[cfg(test)]
mod source_tests;
#[cfg(test)]
mod tests;
