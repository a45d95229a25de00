//! The exact subset of the Job, Deployment, Knative Service and pod-spec API the test kubelet
//! implements, as an allowlist of fields walked over the object's JSON (a flat data table):
//! any other field is [`Unsupported`], named by its path.

use serde_json::Value;

use super::spec::{Unsupported, unsupported};

/// The shape of the JSON a field may hold.
#[derive(Clone, Copy)]
enum Shape {
    /// Any value, used as it is (a scalar, or a free-form map such as labels).
    Any,
    /// An object with only these fields.
    Object(&'static [(&'static str, Shape)]),
    /// A list of this shape.
    List(&'static Shape),
}

use Shape::{Any, List, Object};

const KEY_REF: Shape = Object(&[("name", Any), ("key", Any), ("optional", Any)]);
const ENV_VAR: Shape = Object(&[
    ("name", Any),
    ("value", Any),
    (
        "valueFrom",
        Object(&[
            ("configMapKeyRef", KEY_REF),
            ("secretKeyRef", KEY_REF),
            (
                "fieldRef",
                Object(&[("fieldPath", Any), ("apiVersion", Any)]),
            ),
            (
                "fileKeyRef",
                Object(&[
                    ("volumeName", Any),
                    ("path", Any),
                    ("key", Any),
                    ("optional", Any),
                ]),
            ),
        ]),
    ),
]);
const PROBE: Shape = Object(&[
    (
        "httpGet",
        Object(&[("path", Any), ("port", Any), ("scheme", Any)]),
    ),
    ("initialDelaySeconds", Any),
    ("periodSeconds", Any),
    ("timeoutSeconds", Any),
    ("successThreshold", Any),
    ("failureThreshold", Any),
]);
const SECCOMP: Shape = Object(&[("type", Any)]);
const CONTAINER_SECURITY: Shape = Object(&[
    ("runAsUser", Any),
    ("runAsGroup", Any),
    ("runAsNonRoot", Any),
    ("readOnlyRootFilesystem", Any),
    ("allowPrivilegeEscalation", Any),
    ("privileged", Any),
    ("capabilities", Object(&[("drop", Any), ("add", Any)])),
    ("seccompProfile", SECCOMP),
]);
const CONTAINER: Shape = Object(&[
    ("name", Any),
    ("image", Any),
    ("imagePullPolicy", Any),
    ("command", Any),
    ("args", Any),
    ("env", List(&ENV_VAR)),
    (
        "ports",
        List(&Object(&[
            ("name", Any),
            ("containerPort", Any),
            ("protocol", Any),
        ])),
    ),
    ("resources", Any),
    ("securityContext", CONTAINER_SECURITY),
    (
        "volumeMounts",
        List(&Object(&[
            ("name", Any),
            ("mountPath", Any),
            ("readOnly", Any),
            ("subPath", Any),
        ])),
    ),
    ("terminationMessagePath", Any),
    ("terminationMessagePolicy", Any),
    ("startupProbe", PROBE),
    ("readinessProbe", PROBE),
    ("livenessProbe", PROBE),
]);
const ITEMS: Shape = List(&Object(&[("key", Any), ("path", Any), ("mode", Any)]));
const VOLUME: Shape = Object(&[
    ("name", Any),
    (
        "configMap",
        Object(&[
            ("name", Any),
            ("items", ITEMS),
            ("optional", Any),
            ("defaultMode", Any),
        ]),
    ),
    (
        "secret",
        Object(&[
            ("secretName", Any),
            ("items", ITEMS),
            ("optional", Any),
            ("defaultMode", Any),
        ]),
    ),
    ("emptyDir", Object(&[("medium", Any), ("sizeLimit", Any)])),
    (
        "projected",
        Object(&[
            ("defaultMode", Any),
            (
                "sources",
                List(&Object(&[
                    (
                        "serviceAccountToken",
                        Object(&[("path", Any), ("expirationSeconds", Any), ("audience", Any)]),
                    ),
                    (
                        "configMap",
                        Object(&[("name", Any), ("items", ITEMS), ("optional", Any)]),
                    ),
                    (
                        "secret",
                        Object(&[("name", Any), ("items", ITEMS), ("optional", Any)]),
                    ),
                    (
                        "downwardAPI",
                        Object(&[(
                            "items",
                            List(&Object(&[
                                ("path", Any),
                                (
                                    "fieldRef",
                                    Object(&[("fieldPath", Any), ("apiVersion", Any)]),
                                ),
                            ])),
                        )]),
                    ),
                ])),
            ),
        ]),
    ),
]);
const POD_SPEC: Shape = Object(&[
    ("containers", List(&CONTAINER)),
    ("initContainers", List(&CONTAINER)),
    ("volumes", List(&VOLUME)),
    ("restartPolicy", Any),
    (
        "securityContext",
        Object(&[
            ("runAsUser", Any),
            ("runAsGroup", Any),
            ("runAsNonRoot", Any),
            ("seccompProfile", SECCOMP),
        ]),
    ),
    ("automountServiceAccountToken", Any),
    ("imagePullSecrets", List(&Object(&[("name", Any)]))),
    ("serviceAccountName", Any),
    ("serviceAccount", Any),
    ("terminationGracePeriodSeconds", Any),
    ("dnsPolicy", Any),
    ("enableServiceLinks", Any),
    ("hostNetwork", Any),
    ("schedulerName", Any),
    ("nodeSelector", Any),
]);
const TEMPLATE: Shape = Object(&[("metadata", Any), ("spec", POD_SPEC)]);
const JOB_SPEC: Shape = Object(&[
    ("template", TEMPLATE),
    ("backoffLimit", Any),
    ("activeDeadlineSeconds", Any),
    ("completions", Any),
    ("parallelism", Any),
    ("ttlSecondsAfterFinished", Any),
    ("selector", Any),
    ("manualSelector", Any),
    ("completionMode", Any),
    ("suspend", Any),
    ("podReplacementPolicy", Any),
]);
const DEPLOYMENT_SPEC: Shape = Object(&[
    ("replicas", Any),
    ("selector", Any),
    ("template", TEMPLATE),
    ("strategy", Any),
    ("revisionHistoryLimit", Any),
    ("minReadySeconds", Any),
    ("progressDeadlineSeconds", Any),
    ("paused", Any),
]);
const KNATIVE_SPEC: Shape = Object(&[("template", TEMPLATE)]);

/// Walks `value` against `shape`; the first field outside it is the error.
fn walk(value: &Value, shape: Shape, path: &str) -> Result<(), Unsupported> {
    match (shape, value) {
        (_, Value::Null) | (Any, _) => Ok(()),
        (Object(fields), Value::Object(map)) => {
            for (key, child) in map {
                let here = format!("{path}.{key}");
                match fields.iter().find(|(name, _)| name == key) {
                    Some((_, inner)) => walk(child, *inner, &here)?,
                    None if child.is_null() => {}
                    None => return Err(unsupported(here, "field not in the implemented subset")),
                }
            }
            Ok(())
        }
        (List(inner), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, *inner, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        _ => Err(unsupported(path, format!("unexpected value {value}"))),
    }
}

/// Checks a Job's `spec` (as JSON): only the fields above, one pod, no retries.
pub fn check_job_spec(spec: &Value) -> Result<(), Unsupported> {
    walk(spec, JOB_SPEC, "spec")?;
    let int = |k: &str| spec[k].as_i64();
    if int("backoffLimit") != Some(0) {
        return Err(unsupported(
            "spec.backoffLimit",
            "only 0 (one pod, no retries)",
        ));
    }
    for field in ["completions", "parallelism"] {
        if int(field).is_some_and(|n| n != 1) {
            return Err(unsupported(format!("spec.{field}"), "only 1"));
        }
    }
    if spec["completionMode"]
        .as_str()
        .is_some_and(|m| m != "NonIndexed")
    {
        return Err(unsupported("spec.completionMode", "only NonIndexed"));
    }
    if spec["suspend"].as_bool() == Some(true) {
        return Err(unsupported(
            "spec.suspend",
            "suspended Jobs are not simulated",
        ));
    }
    Ok(())
}

/// Checks a Deployment's `spec` (as JSON).
pub fn check_deployment_spec(spec: &Value) -> Result<(), Unsupported> {
    walk(spec, DEPLOYMENT_SPEC, "spec")?;
    if spec["minReadySeconds"].as_i64().is_some_and(|n| n != 0) {
        return Err(unsupported("spec.minReadySeconds", "only 0"));
    }
    if spec["paused"].as_bool() == Some(true) {
        return Err(unsupported(
            "spec.paused",
            "paused rollouts are not simulated",
        ));
    }
    Ok(())
}

/// Checks a Knative Service's `spec` (as JSON): only `template`, no traffic splits.
pub fn check_knative_spec(spec: &Value) -> Result<(), Unsupported> {
    walk(spec, KNATIVE_SPEC, "spec")
}
