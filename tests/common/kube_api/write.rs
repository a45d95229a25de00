//! Creates and updates as kube-apiserver runs them: type, namespace and name checks,
//! generateName, system fields, status subresource isolation, decoding normalisation (a
//! Secret's `stringData`; CRD pruning and defaults), generation bumps, validation (names and
//! labels; the CRD schema and CEL rules for custom kinds), optimistic concurrency and no-op
//! detection, and finalization of objects whose last finalizer went.

use serde_json::{Value, json};

use super::apply;
use super::error::{Cause, Error, Result};
use super::kinds::Kind;
use super::lifecycle::is_core;
use super::meta;
use super::schema::{Crd, register_crd};
use super::store::{EventType, Key, Store};

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The main resource: `.status` is kept as stored when the kind has a status subresource.
    Main,
    /// The `/status` subresource: only `.status` changes.
    Status,
    /// A test seeding the store: everything as given, status included.
    Seed,
}

/// How a write is done.
#[derive(Debug, Clone, Copy)]
pub struct Write {
    /// The part of the object written.
    pub target: Target,
    /// `dryRun=All`: validate and answer, store nothing.
    pub dry_run: bool,
    /// Take `metadata.managedFields` from the new object (server-side apply computed it);
    /// otherwise they stay as stored.
    pub managed_fields: bool,
    /// `fieldValidation=Strict`: a field a CRD's schema does not declare is an error, not
    /// pruned.
    pub strict: bool,
    /// Validate (names, labels, the CRD schema) and run validating admission (PodSecurity);
    /// off only to compute what mutating webhooks see, which comes before validation.
    pub validate: bool,
}

impl Write {
    /// An ordinary write of `target`.
    pub fn to(target: Target) -> Self {
        Self {
            target,
            dry_run: false,
            managed_fields: false,
            strict: false,
            validate: true,
        }
    }
}

impl Store {
    /// The validator of a custom kind.
    fn crd(&self, kind: &Kind) -> Option<&Crd> {
        self.crds.iter().find(|c| std::ptr::eq(c.kind, kind))
    }

    /// What server-side apply knows of `kind`'s lists and maps: its CRD's schema, or the
    /// built-in table.
    pub fn field_schema(&self, kind: &Kind) -> Box<dyn apply::Schema> {
        match self.crd(kind) {
            Some(crd) => Box::new(apply::CrdSchema::new(crd.schema().clone())),
            None => Box::new(apply::Builtin::new(kind.kind)),
        }
    }

    /// `new` with `manager`'s `Update` entry in its managedFields, for a create (`old` is
    /// `None`), PUT or non-apply patch of `route`'s object.
    pub(super) fn record_update(
        &self,
        route: &super::kinds::Route,
        old: Option<&Value>,
        new: Value,
        target: Target,
        manager: &str,
    ) -> Value {
        let scope = match target {
            Target::Status => apply::Scope::Status,
            Target::Main | Target::Seed => apply::Scope::Main {
                status_subresource: route.kind.status,
            },
        };
        let schema = self.field_schema(route.kind);
        apply::update(
            old,
            &new,
            manager,
            scope,
            &route.kind.api_version(),
            schema.as_ref(),
        )
    }

    /// A CRD was stored: serve its kinds (the replaced definitions' validators go), and mark
    /// it Established, as kube-apiserver's apiextensions controllers do.
    fn crd_written(&mut self, crd_kind: &'static Kind, key: &Key) -> Result<()> {
        let Some(crd) = self.objects.get(key).cloned() else {
            return Ok(());
        };
        let group = crd["spec"]["group"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let plural = crd["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let new = register_crd(&crd, &mut self.kinds).map_err(|message| Error::BadRequest {
            message: format!("CustomResourceDefinition {}: {message}", key.name),
        })?;
        self.crds
            .retain(|c| !(c.kind.group == group && c.kind.plural == plural));
        self.crds.extend(new);
        let mut established = crd.clone();
        established["status"] = json!({
            "acceptedNames": crd["spec"]["names"],
            "storedVersions": crd["spec"]["versions"].as_array().into_iter().flatten()
                .filter(|v| v["storage"] == true).map(|v| v["name"].clone()).collect::<Vec<_>>(),
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": meta::now()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been \
                     accepted", "lastTransitionTime": meta::now()},
            ],
        });
        if established != crd {
            self.commit(crd_kind, EventType::Modified, &mut established, Some(&crd));
            self.objects.insert(key.clone(), established);
        }
        Ok(())
    }

    /// What decoding a request does to it: a Secret's `stringData` folded into `data`; a
    /// custom resource pruned and defaulted. Runs before generation and no-op checks.
    fn normalize(&mut self, kind: &'static Kind, obj: &mut Value, strict: bool) -> Result<()> {
        if kind.group.is_empty() && kind.kind == "Secret" {
            meta::fold_string_data(obj);
        }
        if let Some(crd) = self.crd(kind) {
            let unknown = crd.unknown_fields(obj);
            if strict && !unknown.is_empty() {
                let fields: Vec<String> = unknown
                    .iter()
                    .map(|f| format!("unknown field {f:?}"))
                    .collect();
                return Err(Error::BadRequest {
                    message: format!(
                        "{} in version {:?} cannot be handled as a {}: strict decoding error: {}",
                        kind.kind,
                        kind.version,
                        kind.kind,
                        fields.join(", ")
                    ),
                });
            }
            crd.normalize(obj);
        }
        Ok(())
    }

    /// Validation of a write: metadata for every kind, the CRD for custom kinds.
    fn admit(&mut self, kind: &'static Kind, obj: &Value, old: Option<&Value>) -> Result<()> {
        let mut causes = meta::validate(kind, obj);
        if is_core(kind, "Namespace")
            && let Err(message) =
                super::pod_security::Policy::from_labels(&obj["metadata"]["labels"])
        {
            // `metadata.labels[…]: Invalid value: "x": must be one of …`
            let (field, rest) = message
                .split_once(": ")
                .unwrap_or(("metadata.labels", &message));
            causes.push(Cause::new("FieldValueInvalid", field, rest));
        }
        if kind.group == "admissionregistration.k8s.io" {
            causes.extend(super::webhooks::validate_configuration(obj));
        }
        if let Some(crd) = self.crd(kind) {
            causes.extend(crd.validate(obj, old));
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid {
                kind,
                name: meta::name_of(obj).to_string(),
                causes,
            })
        }
    }

    /// Creates an object of `kind` in `namespace` (the URL's), as POST does.
    ///
    /// # Errors
    /// BadRequest for a mismatched namespace or type, Invalid, AlreadyExists.
    pub fn create(
        &mut self,
        kind: &'static Kind,
        namespace: Option<&str>,
        mut obj: Value,
        how: Write,
    ) -> Result<Value> {
        set_type(kind, &mut obj)?;
        set_namespace(kind, namespace, &mut obj)?;
        if kind.namespaced {
            self.check_namespace(namespace.unwrap_or_default())?;
        }
        if is_core(kind, "Pod") && how.target != Target::Seed {
            self.admit_pod_service_account(namespace.unwrap_or_default(), &mut obj)?;
        }
        if meta::name_of(&obj).is_empty()
            && let Some(prefix) = meta::meta_str(&obj, "generateName").map(str::to_string)
        {
            let name = loop {
                let name = format!("{prefix}{}", meta::name_suffix());
                if !self.objects.contains_key(&Key::new(kind, namespace, &name)) {
                    break name;
                }
            };
            meta::metadata_mut(&mut obj).insert("name".into(), json!(name));
        }
        let metadata = meta::metadata_mut(&mut obj);
        for field in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            metadata.remove(field);
        }
        metadata.insert("uid".into(), json!(meta::new_uid()));
        metadata.insert("creationTimestamp".into(), json!(meta::now()));
        metadata.insert("generation".into(), json!(1));
        if kind.status && how.target != Target::Seed {
            // kube-apiserver's PrepareForCreate: a new object has no status yet.
            if let Some(map) = obj.as_object_mut() {
                map.remove("status");
            }
        }
        self.normalize(kind, &mut obj, how.strict)?;
        if how.validate {
            self.admit(kind, &obj, None)?;
        }
        if is_core(kind, "Pod") && how.target != Target::Seed && how.validate {
            self.admit_pod_security(namespace.unwrap_or_default(), &obj, None)?;
        }
        let key = Key::new(kind, namespace, meta::name_of(&obj));
        if self.objects.contains_key(&key) {
            return Err(Error::AlreadyExists {
                kind,
                name: key.name,
            });
        }
        if !how.dry_run {
            self.commit(kind, EventType::Added, &mut obj, None);
            self.objects.insert(key.clone(), obj.clone());
            if is_crd(kind) {
                self.crd_written(kind, &key)?;
            }
            if is_core(kind, "Namespace") {
                self.namespace_created(&key.name);
            }
        }
        Ok(obj)
    }

    /// Updates a stored object to `new`, as PUT and PATCH do. Returns the stored object and
    /// whether anything changed (a no-op keeps the resourceVersion and makes no event).
    ///
    /// # Errors
    /// NotFound, Conflict (stale `resourceVersion`), BadRequest (name, namespace or type
    /// mismatch), Invalid.
    pub fn update(
        &mut self,
        kind: &'static Kind,
        key: &Key,
        new: Value,
        how: Write,
    ) -> Result<(Value, bool)> {
        let old = self
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| Error::NotFound {
                kind,
                name: key.name.clone(),
            })?;
        let sent_rv = meta::meta_str(&new, "resourceVersion").unwrap_or_default();
        if !sent_rv.is_empty()
            && sent_rv != meta::meta_str(&old, "resourceVersion").unwrap_or_default()
        {
            return Err(Error::Conflict {
                kind,
                name: key.name.clone(),
            });
        }
        let mut new = match how.target {
            Target::Status => {
                let mut merged = old.clone();
                merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
                if let (true, Some(fields)) =
                    (how.managed_fields, new.pointer("/metadata/managedFields"))
                {
                    meta::metadata_mut(&mut merged).insert("managedFields".into(), fields.clone());
                }
                if let Some(map) = merged.as_object_mut() {
                    map.retain(|_, v| !v.is_null());
                }
                merged
            }
            Target::Main | Target::Seed => new,
        };
        set_type(kind, &mut new)?;
        let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
        set_namespace(kind, namespace, &mut new)?;
        let name = meta::name_of(&new);
        if name != key.name {
            return Err(Error::BadRequest {
                message: format!(
                    "the name of the object ({name}) does not match the name on the URL ({})",
                    key.name
                ),
            });
        }
        let fields = new.pointer("/metadata/managedFields").cloned();
        meta::copy_system_fields(&old, &mut new);
        if how.managed_fields {
            let metadata = meta::metadata_mut(&mut new);
            match fields {
                Some(f) => metadata.insert("managedFields".into(), f),
                None => metadata.remove("managedFields"),
            };
        }
        if how.target == Target::Main && kind.status {
            match old.get("status") {
                Some(status) => new["status"] = status.clone(),
                None => {
                    if let Some(map) = new.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
        }
        self.normalize(kind, &mut new, how.strict)?;
        if meta::spec_changed(&old, &new) {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta::metadata_mut(&mut new).insert("generation".into(), json!(generation + 1));
        }
        if how.validate {
            self.admit(kind, &new, Some(&old))?;
        }
        if is_core(kind, "Pod") && how.target == Target::Main && how.validate {
            self.admit_pod_security(&key.namespace, &new, Some(&old))?;
        }
        if meta::same_object(&old, &new) || how.dry_run {
            return Ok((if how.dry_run { new } else { old }, false));
        }
        if finalized(&new) {
            return Ok((self.remove(kind, key, new), true));
        }
        self.commit(kind, EventType::Modified, &mut new, Some(&old));
        self.objects.insert(key.clone(), new.clone());
        if is_crd(kind) {
            self.crd_written(kind, key)?;
        }
        Ok((new, true))
    }

    /// Seeds an object (tests): created, or updated whatever its resourceVersion, status
    /// included. The kind comes from its `apiVersion` and `kind`.
    ///
    /// # Errors
    /// As create and update; BadRequest for an unknown type.
    pub fn insert(&mut self, mut obj: Value) -> Result<Value> {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let type_name = obj["kind"].as_str().unwrap_or_default();
        let kind = self
            .kinds
            .by_type(api_version, type_name)
            .ok_or_else(|| Error::BadRequest {
                message: format!("no kind {type_name:?} in {api_version:?} is served"),
            })?;
        let namespace = meta::meta_str(&obj, "namespace").map(str::to_string);
        if let (true, Some(ns)) = (kind.namespaced, &namespace) {
            self.ensure_namespace(ns);
        }
        let key = Key::new(kind, namespace.as_deref(), meta::name_of(&obj));
        if self.objects.contains_key(&key) {
            meta::metadata_mut(&mut obj).remove("resourceVersion");
            Ok(self.update(kind, &key, obj, Write::to(Target::Seed))?.0)
        } else {
            self.create(kind, namespace.as_deref(), obj, Write::to(Target::Seed))
        }
    }
}

/// Whether an object marked for deletion has no finalizers left, so it goes now.
fn finalized(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
        && obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

/// Sets `apiVersion` and `kind`, refusing an object of another type.
fn set_type(kind: &Kind, obj: &mut Value) -> Result<()> {
    if !obj.is_object() {
        return Err(Error::BadRequest {
            message: "the object must be a JSON object".into(),
        });
    }
    let api_version = kind.api_version();
    for (field, expected) in [("apiVersion", api_version.as_str()), ("kind", kind.kind)] {
        match obj.get(field).and_then(Value::as_str) {
            None | Some("") => obj[field] = json!(expected),
            Some(sent) if sent == expected => {}
            Some(sent) => {
                return Err(Error::BadRequest {
                    message: format!(
                        "the {field} of the object ({sent}) does not match the {field} of the \
                         request ({expected})"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Sets the URL's namespace on a namespaced object; a different one in the body is a 400.
fn set_namespace(kind: &Kind, namespace: Option<&str>, obj: &mut Value) -> Result<()> {
    let metadata = meta::metadata_mut(obj);
    if !kind.namespaced {
        metadata.remove("namespace");
        return Ok(());
    }
    let url_ns = namespace.unwrap_or_default();
    match metadata.get("namespace").and_then(Value::as_str) {
        Some(sent) if !sent.is_empty() && sent != url_ns => Err(Error::BadRequest {
            message: "the namespace of the provided object does not match the namespace sent \
                      on the request"
                .into(),
        }),
        _ if url_ns.is_empty() => Err(Error::BadRequest {
            message: "the namespace of the object is required".into(),
        }),
        _ => {
            metadata.insert("namespace".into(), json!(url_ns));
            Ok(())
        }
    }
}

/// Whether `kind` is CustomResourceDefinition.
fn is_crd(kind: &Kind) -> bool {
    kind.group == "apiextensions.k8s.io" && kind.kind == "CustomResourceDefinition"
}
