//! One AdmissionReview v1 in, one out: pure, so every decision is testable without a socket.
//! `/mutate` answers with the defaulting patch (base64 JSON patch, `patchType: JSONPatch`)
//! and the validator's warnings; `/validate` allows, or denies with `code: 422`,
//! `reason: Invalid` and a message naming every field. Other kinds, subresources and
//! DELETE/CONNECT pass untouched.

use base64::Engine;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use serde_json::{Value, json};

use super::{Error, Result};
use crate::controller::crd::{Function, GROUP};
use crate::controller::defaults::{DefaultProfiles, defaults};
use crate::controller::validate::{Verdict, check_managed_secrets, validate};
use crate::runtime::Catalog;

const API_VERSION: &str = "admission.k8s.io/v1";

/// Which webhook was called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /mutate`: defaulting.
    Mutate,
    /// `POST /validate`: validation.
    Validate,
}

/// What the log line says about one review.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// `Function`, or the other kind passed through.
    pub kind: String,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name (its generateName prefix before it has one).
    pub name: String,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: String,
    /// Whether the request was allowed.
    pub allowed: bool,
    /// Patch operations returned.
    pub patched: usize,
    /// Warnings returned.
    pub warnings: usize,
    /// The denial message.
    pub message: Option<String>,
}

/// The decisions, with the catalog and default profiles they need.
#[derive(Clone, Debug)]
pub struct Reviewer {
    catalog: Catalog,
    profiles: DefaultProfiles,
    managed_secrets: Vec<String>,
    /// The CRD's schema of `spec`, for the fields no Function has.
    spec_schema: Value,
}

impl Reviewer {
    /// A reviewer for `catalog`'s runtimes, completing explicit requests from `profiles`.
    pub fn new(catalog: Catalog, profiles: DefaultProfiles) -> Reviewer {
        let crd =
            serde_json::to_value(<Function as kube::CustomResourceExt>::crd()).unwrap_or_default();
        let spec_schema =
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone();
        Reviewer {
            catalog,
            profiles,
            managed_secrets: Vec::new(),
            spec_schema,
        }
    }

    /// Refusing Functions that read one of `names`, the Secrets the controller keeps
    /// ([`crate::controller::validate::check_managed_secrets`]).
    pub fn with_managed_secrets(self, names: Vec<String>) -> Reviewer {
        Reviewer {
            managed_secrets: names,
            ..self
        }
    }

    /// Answers the AdmissionReview in `body`: the response review and the log record.
    ///
    /// # Errors
    /// [`Error::MalformedReview`], [`Error::WrongReviewVersion`] or [`Error::NoRequest`]
    /// when `body` is not an AdmissionReview v1 request (the caller answers 400).
    pub fn review(&self, endpoint: Endpoint, body: &[u8]) -> Result<(Value, Record)> {
        // Its size in every dimension before anything is built from it.
        super::shape::check(body).map_err(|source| Error::MalformedReview { source })?;
        // The version first: another version's request need not parse as v1's.
        let types: Types =
            serde_json::from_slice(body).map_err(|source| Error::MalformedReview { source })?;
        if types.api_version != API_VERSION || types.kind != "AdmissionReview" {
            return Err(Error::WrongReviewVersion {
                api_version: types.api_version,
                kind: types.kind,
            });
        }
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_slice(body).map_err(|source| Error::MalformedReview { source })?;
        let request: AdmissionRequest<DynamicObject> =
            review.try_into().map_err(|_| Error::NoRequest)?;
        let mut record = Record {
            kind: request.kind.kind.clone(),
            namespace: request.namespace.clone().unwrap_or_default(),
            name: request.name.clone(),
            operation: format!("{:?}", request.operation).to_uppercase(),
            allowed: true,
            ..Record::default()
        };
        let ours = request.kind.group == GROUP
            && request.kind.kind == "Function"
            && request.sub_resource.is_none()
            && matches!(request.operation, Operation::Create | Operation::Update);
        let object = match (ours, &request.object) {
            (true, Some(object)) => object_json(object, &request)?,
            _ => return Ok((response(&request.uid, Answer::default()), record)),
        };
        if record.name.is_empty() {
            record.name = ["name", "generateName"]
                .iter()
                .find_map(|k| object["metadata"][k].as_str())
                .unwrap_or_default()
                .to_string();
        }
        let answer = match endpoint {
            Endpoint::Mutate => self.mutate(&object),
            Endpoint::Validate => self.validate(&object, &request)?,
        };
        record.allowed = answer.denied.is_none();
        record.patched = answer.patch.as_ref().map_or(0, |p| p.0.len());
        record.warnings = answer.warnings.len();
        record.message = answer.denied.as_ref().map(|d| d.message.clone());
        Ok((response(&request.uid, answer), record))
    }

    fn mutate(&self, object: &Value) -> Answer {
        let patch = defaults(object, &self.catalog, &self.profiles);
        let mut patched = object.clone();
        // The patch was made for this very object; should it not apply, warn from the
        // original.
        if json_patch::patch(&mut patched, &patch).is_err() {
            patched = object.clone();
        }
        let warnings = serde_json::from_value::<Function>(patched)
            .map(|f| validate(&f, &self.catalog).warnings)
            .unwrap_or_default();
        Answer {
            patch: (!patch.0.is_empty()).then_some(patch),
            warnings,
            denied: None,
        }
    }

    fn validate(
        &self,
        object: &Value,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Result<Answer> {
        if object["metadata"]["deletionTimestamp"].is_string() {
            // Finalizers must come off even a Function that no longer passes.
            return Ok(Answer::default());
        }
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let function: Function = match serde_json::from_value(object.clone()) {
            Ok(f) => f,
            Err(e) => {
                let message = format!("Function {name:?} is invalid: {e}");
                return Ok(Answer::deny(name, message, Vec::new()));
            }
        };
        let mut verdict = validate(&function, &self.catalog);
        for field in super::shape::unknown_fields("spec", &object["spec"], &self.spec_schema) {
            verdict.error(
                field,
                "unknown field: a Function (serverless.kyma-project.io/v1alpha2) has none such; \
                 remove it",
            );
        }
        check_managed_secrets(&function, &self.managed_secrets, &mut verdict);
        if !verdict.is_valid() && unchanged_spec(object, request)? {
            // Ratcheting: an update that leaves the spec alone (labels, finalizers) is not
            // blocked by problems the stored Function already had.
            verdict = Verdict {
                warnings: verdict
                    .warnings
                    .into_iter()
                    .chain(verdict.errors.iter().map(|e| format!("not blocking: {e}")))
                    .collect(),
                errors: Vec::new(),
            };
        }
        if verdict.is_valid() {
            return Ok(Answer {
                warnings: verdict.warnings,
                ..Answer::default()
            });
        }
        let message = format!("Function {name:?} is invalid: {}", verdict.message());
        let causes = verdict
            .errors
            .iter()
            .map(|e| json!({"reason": "FieldValueInvalid", "field": e.field, "message": e.message}))
            .collect();
        Ok(Answer {
            warnings: verdict.warnings,
            ..Answer::deny(name, message, causes)
        })
    }
}

/// The request's object as JSON, its namespace filled in from the request (on CREATE the
/// object may not carry one).
fn object_json(object: &DynamicObject, request: &AdmissionRequest<DynamicObject>) -> Result<Value> {
    let mut value =
        serde_json::to_value(object).map_err(|source| Error::MalformedReview { source })?;
    if let (Some(ns), Some(meta)) = (&request.namespace, value["metadata"].as_object_mut()) {
        meta.entry("namespace").or_insert_with(|| ns.clone().into());
    }
    Ok(value)
}

fn unchanged_spec(object: &Value, request: &AdmissionRequest<DynamicObject>) -> Result<bool> {
    let Some(old) = request
        .old_object
        .as_ref()
        .filter(|_| request.operation == Operation::Update)
    else {
        return Ok(false);
    };
    let old = serde_json::to_value(old).map_err(|source| Error::MalformedReview { source })?;
    Ok(old.get("spec") == object.get("spec"))
}

/// A review's `apiVersion` and `kind`, whatever the rest holds.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Types {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

/// What to answer.
#[derive(Default)]
struct Answer {
    patch: Option<json_patch::Patch>,
    warnings: Vec<String>,
    denied: Option<Denial>,
}

/// Why a Function is refused.
struct Denial {
    /// The Function's name (kubectl prints `The Function "NAME" is invalid: …`).
    name: String,
    message: String,
    /// Per field: `{reason, field, message}`.
    causes: Vec<Value>,
}

impl Answer {
    fn deny(name: &str, message: String, causes: Vec<Value>) -> Answer {
        Answer {
            denied: Some(Denial {
                name: name.to_string(),
                message,
                causes,
            }),
            ..Answer::default()
        }
    }
}

/// The AdmissionReview v1 response. Written here rather than with kube's `AdmissionResponse`,
/// whose `patch` serialises as an array of numbers: Go's `[]byte` is a base64 string.
fn response(uid: &str, answer: Answer) -> Value {
    let mut response = json!({"uid": uid, "allowed": answer.denied.is_none()});
    if let Some(patch) = &answer.patch {
        let bytes = serde_json::to_vec(patch).unwrap_or_default();
        response["patchType"] = "JSONPatch".into();
        response["patch"] = base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .into();
    }
    if !answer.warnings.is_empty() {
        response["warnings"] = answer.warnings.into();
    }
    if let Some(Denial {
        name,
        message,
        causes,
    }) = answer.denied
    {
        response["status"] = json!({
            "status": "Failure",
            "code": 422,
            "reason": "Invalid",
            "message": message,
            "details": {"name": name, "group": GROUP, "kind": "Function", "causes": causes},
        });
    }
    json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response})
}

#[cfg(test)]
mod tests;
