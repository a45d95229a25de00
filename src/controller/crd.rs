//! The `Function` custom resource, `serverless.kyma-project.io/v1alpha2`, field for field as
//! Kyma Serverless defined it, so existing manifests apply unchanged. `kiln crd` prints the CRD
//! generated from these types; the CEL rules below are what the API server checks on its own,
//! and `validate` checks the rest. Plain data: no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, PodSecurityContext, ResourceRequirements, SecurityContext,
};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "serverless.kyma-project.io";
/// The API version.
pub const VERSION: &str = "v1alpha2";
/// `apiVersion` of a Function.
pub const API_VERSION: &str = "serverless.kyma-project.io/v1alpha2";

/// Env names the runtime sets itself; a Function may not override them (Kyma's CEL rule).
pub const RESERVED_ENV: [&str; 6] = [
    "FUNC_RUNTIME",
    "FUNC_HANDLER",
    "FUNC_PORT",
    "MOD_NAME",
    "NODE_PATH",
    "PYTHONPATH",
];

/// Env the runtime contract fixes in every Function's container, after the Function's own
/// (whose same names are dropped): the webhook refuses them in a spec, as it does
/// [`RESERVED_ENV`], rather than let a value be silently ignored.
pub const CONTRACT_ENV: [&str; 6] = [
    "FUNC_NAME",
    "SERVICE_NAMESPACE",
    "FUNC_RUNTIME",
    "FUNC_HANDLER",
    "MOD_NAME",
    "FUNC_PORT",
];

/// Prefix of the labels and annotations the controller owns on what it creates.
pub const RESERVED_PREFIX: &str = "serverless.kyma-project.io/";

/// A Function: handler source and dependencies, the runtime to run them on, and how to run
/// them (Kyma's v1alpha2 `spec`, field for field).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "serverless.kyma-project.io",
    version = "v1alpha2",
    kind = "Function",
    namespaced,
    status = "FunctionStatus",
    derive = "PartialEq",
    derive = "Default",
    category = "kyma-serverless",
    shortname = "fn",
    doc = "A serverless Function: source and dependencies built into an image by kiln, then \
        deployed",
    scale = "{\"specReplicasPath\":\".spec.replicas\",\"statusReplicasPath\":\".status.replicas\",\
        \"labelSelectorPath\":\".status.podSelector\"}",
    printcolumn = "{\"name\":\"Configured\",\"type\":\"string\",\"jsonPath\":\
        \".status.conditions[?(@.type=='ConfigurationReady')].status\"}",
    printcolumn = "{\"name\":\"Built\",\"type\":\"string\",\"jsonPath\":\
        \".status.conditions[?(@.type=='BuildReady')].status\"}",
    printcolumn = "{\"name\":\"Running\",\"type\":\"string\",\"jsonPath\":\
        \".status.conditions[?(@.type=='Running')].status\"}",
    printcolumn = r#"{"name":"Runtime","type":"string","jsonPath":".spec.runtime"}"#,
    printcolumn = r#"{"name":"Built As","type":"string","jsonPath":".status.runtime"}"#,
    printcolumn = r#"{"name":"Version","type":"integer","jsonPath":".metadata.generation"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new(
    "!has(self.template) || (!has(self.template.labels) && !has(self.template.annotations))"
).message("spec.template is no longer supported: use spec.labels and spec.annotations"))]
#[serde(rename_all = "camelCase")]
pub struct FunctionSpec {
    /// The runtime: nodejs22, nodejs24, nodejs26 (Kyma's new `main(req, res)` API), python313
    /// or python314 (Kyma's new Flask `main()` API). Kyma's nodejs20 and python312 are accepted
    /// and built on the nearest kiln runtime.
    #[schemars(length(min = 1))]
    pub runtime: String,
    /// A base image to build on instead of the runtime's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_image_override: Option<String>,
    /// The code: inline, or from a git repository.
    pub source: Source,
    /// The Function Pod's security context. Fields left out keep kiln's (user and group
    /// 10001, non-root, the RuntimeDefault seccomp profile); what the restricted Pod Security
    /// Standard forbids is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// The Function container's security context. Fields left out keep kiln's (not
    /// privileged, no privilege escalation, all capabilities dropped, a read-only root
    /// filesystem, non-root); what the restricted Pod Security Standard forbids is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_security_context: Option<SecurityContext>,
    /// Environment variables of the Function's container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new(
        "self.all(e, !(e.name in ['FUNC_RUNTIME', 'FUNC_HANDLER', 'FUNC_PORT', 'MOD_NAME', \
            'NODE_PATH', 'PYTHONPATH']))"
    ).message("the env names FUNC_RUNTIME, FUNC_HANDLER, FUNC_PORT, MOD_NAME, NODE_PATH and \
        PYTHONPATH are reserved"))]
    pub env: Vec<EnvVar>,
    /// Resources of the Function's Pods and of its build Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_configuration: Option<ResourceConfiguration>,
    /// Autoscaling bounds (deprecated in Kyma, still honoured): an HPA when min ≠ max.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_config: Option<ScaleConfig>,
    /// Replicas; written by an HPA or any scaler through the scale subresource.
    #[serde(default = "default_replicas", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// Deprecated and rejected: use `labels` and `annotations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<Template>,
    /// Secrets mounted read-only into the Function's container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_mounts: Vec<SecretMount>,
    /// Labels for the Function's Pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256))]
    #[x_kube(validation = Rule::new(
        "self.all(k, !k.startsWith('serverless.kyma-project.io/'))"
    ).message("labels with the prefix serverless.kyma-project.io/ are reserved"))]
    #[x_kube(validation = Rule::new("self.all(k, size(self[k]) < 64)")
        .message("label values must be shorter than 64 characters"))]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the Function's Pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256))]
    #[x_kube(validation = Rule::new(
        "self.all(k, !k.startsWith('serverless.kyma-project.io/'))"
    ).message("annotations with the prefix serverless.kyma-project.io/ are reserved"))]
    pub annotations: BTreeMap<String, String>,
}

// serde's `default` needs a function; the CRD default (1) comes from the same place.
#[allow(clippy::unnecessary_wraps)]
fn default_replicas() -> Option<i32> {
    Some(1)
}

/// Where the code comes from: exactly one of `inline` and `gitRepository`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.inline) != has(self.gitRepository)")
    .message("spec.source needs exactly one of inline and gitRepository"))]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// The code in the manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<InlineSource>,
    /// The code in a git repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_repository: Option<GitRepositorySource>,
}

/// Code and dependency manifest written in the Function itself.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct InlineSource {
    /// The handler: handler.js or handler.py.
    #[schemars(length(min = 1))]
    pub source: String,
    /// package.json or requirements.txt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<String>,
}

/// A git repository, a reference in it, and the directory holding the Function.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GitRepositorySource {
    /// The repository's URL (https://…).
    #[schemars(length(min = 1))]
    pub url: String,
    /// Credentials for the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<RepositoryAuth>,
    /// The directory of the Function inside the repository.
    #[x_kube(validation = Rule::new("self.trim().size() != 0").message("baseDir is required"))]
    pub base_dir: String,
    /// A branch, tag or commit.
    #[x_kube(validation = Rule::new("self.trim().size() != 0").message("reference is required"))]
    pub reference: String,
}

/// How to authenticate to a git repository.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryAuth {
    /// `basic` (Secret keys `username`, `password`) or `key` (SSH: Secret keys `key`, and
    /// `password` for an encrypted key, `knownHosts` to verify the host).
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["basic", "key"]))]
    pub type_: String,
    /// The Secret holding the credentials, in the Function's namespace.
    #[x_kube(validation = Rule::new("self.trim().size() != 0").message("secretName is required"))]
    pub secret_name: String,
}

/// Resources of the Function's Pods and its build.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ResourceConfiguration {
    /// The Function's Pods: a profile (XS, S, M, L, XL) or explicit resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionResources>,
    /// The build Job: a profile (local-dev, slow, normal, fast) or explicit resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildResources>,
}

/// The Function's Pods' resources: exactly one of a profile and explicit resources.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.profile) != has(self.resources)")
    .message("use either profile or resources"))]
pub struct FunctionResources {
    /// XS, S, M, L or XL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["XS", "S", "M", "L", "XL"]))]
    pub profile: Option<String>,
    /// Explicit requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// The build Job's resources: exactly one of a profile and explicit resources.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.profile) != has(self.resources)")
    .message("use either profile or resources"))]
pub struct BuildResources {
    /// local-dev, slow, normal or fast.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["local-dev", "slow", "normal", "fast"]))]
    pub profile: Option<String>,
    /// Explicit requests and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Replica bounds for the HPA.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas")
    .message("minReplicas must not exceed maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct ScaleConfig {
    /// At least 1.
    #[schemars(range(min = 1))]
    pub min_replicas: i32,
    /// At least 1, not below minReplicas.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,
}

/// Deprecated Pod template settings (rejected; kept so old manifests get a clear message).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Template {
    /// Use spec.labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Use spec.annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// A Secret mounted read-only into the Function's container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretMount {
    /// The Secret, in the Function's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Where its keys appear as files.
    #[schemars(length(min = 1))]
    pub mount_path: String,
}

/// What the controller observed and did: Kyma's status fields plus the built image.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FunctionStatus {
    /// The kiln runtime built on (after mapping a Kyma name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The Function profile used, or `custom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_resource_profile: Option<String>,
    /// The build profile used, or `custom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_resource_profile: Option<String>,
    /// ConfigurationReady, BuildReady and Running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Git: the directory built (deprecated in Kyma for `gitRepository.baseDir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_dir: Option<String>,
    /// Git: the reference resolved (deprecated in Kyma for `gitRepository.reference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// Git: the commit built (deprecated in Kyma for `gitRepository.commit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// A git source: its URL, directory, reference and the commit built (Kyma's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_repository: Option<GitRepositoryStatus>,
    /// The security context the Function's Pod runs with (Kyma's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,
    /// The security context the Function's container runs with (Kyma's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_security_context: Option<SecurityContext>,
    /// Replicas running (the scale subresource's status path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// The Pods' label selector (the scale subresource's selector path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// The base image built on, by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_image: Option<String>,
    /// The override in effect (deprecated in Kyma; kept for tools that read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_image_override: Option<String>,
    /// The build key: a digest over every input of the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_key: Option<String>,
    /// The image deployed: `REPO@sha256:…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The built image's manifest digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Failed builds in a row for the current build key (the retry backoff grows with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_builds: Option<u32>,
    /// The generation these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Where a git Function's code came from, in Kyma's shape.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GitRepositoryStatus {
    /// The repository's URL.
    pub url: String,
    /// The Function's directory in the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_dir: Option<String>,
    /// The branch, tag or commit the spec names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The commit built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// One condition, in Kyma's shape.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// ConfigurationReady, BuildReady or Running.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// A CamelCase reason (JobFinished, DeploymentReady, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Function {
    /// The namespace (every Function has one: the resource is namespaced).
    pub fn namespace_or_default(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The name.
    pub fn name_or_empty(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The CRD as YAML, as `kiln crd` prints it.
///
/// # Errors
/// Never in practice: the CRD is plain data.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&Function::crd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_crd_is_kymas_functions_v1alpha2_with_status_and_scale() {
        let crd = serde_json::to_value(Function::crd()).unwrap();
        assert_eq!(
            crd["metadata"]["name"],
            "functions.serverless.kyma-project.io"
        );
        assert_eq!(crd["spec"]["names"]["categories"][0], "kyma-serverless");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha2");
        assert_eq!(
            (version["served"].as_bool(), version["storage"].as_bool()),
            (Some(true), Some(true))
        );
        let scale = &version["subresources"]["scale"];
        assert_eq!(scale["specReplicasPath"], ".spec.replicas");
        assert_eq!(scale["statusReplicasPath"], ".status.replicas");
        assert_eq!(scale["labelSelectorPath"], ".status.podSelector");
        assert!(version["subresources"]["status"].is_object());
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            columns,
            [
                "Configured",
                "Built",
                "Running",
                "Runtime",
                "Built As",
                "Version",
                "Age"
            ]
        );
        let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert_eq!(spec["properties"]["replicas"]["default"], 1);
        let text = crd.to_string();
        for rule in [
            "has(self.inline) != has(self.gitRepository)",
            "self.minReplicas <= self.maxReplicas",
            "'PYTHONPATH'",
        ] {
            assert!(text.contains(rule), "missing CEL rule {rule}");
        }
    }

    #[test]
    fn a_kyma_manifest_deserialises_field_for_field() {
        let yaml = r#"
apiVersion: serverless.kyma-project.io/v1alpha2
kind: Function
metadata: {name: hello, namespace: team}
spec:
  runtime: nodejs20
  source:
    gitRepository:
      url: https://github.com/kyma-project/examples.git
      baseDir: /orders-service/function
      reference: main
      auth: {type: basic, secretName: git-creds}
  env:
    - name: GREETING
      value: hi
    - name: TOKEN
      valueFrom: {secretKeyRef: {name: s, key: token}}
  resourceConfiguration:
    function: {profile: S}
    build: {resources: {requests: {cpu: 300m, memory: 300Mi}}}
  scaleConfig: {minReplicas: 1, maxReplicas: 3}
  secretMounts: [{secretName: creds, mountPath: /creds}]
  labels: {app: hello}
  annotations: {note: x}
"#;
        let f: Function = serde_yaml::from_str(yaml).unwrap();
        let git = f.spec.source.git_repository.as_ref().unwrap();
        assert_eq!(git.auth.as_ref().unwrap().type_, "basic");
        assert_eq!(f.spec.replicas, Some(1), "replicas default to 1");
        assert_eq!(
            f.spec.env[1]
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap()
                .key,
            "token"
        );
        let back = serde_json::to_value(&f).unwrap();
        assert_eq!(
            back["spec"]["resourceConfiguration"]["function"]["profile"],
            "S"
        );
        assert_eq!(back["spec"]["scaleConfig"]["maxReplicas"], 3);
    }
}
