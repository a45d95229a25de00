//! Proves the fake Kubernetes API server of the test harness (`tests/common/kube_api`) with
//! kube's own typed clients and runtime, the way the controller will use it.
//!
//! One module per area; the object and Function builders they share are here, the reading
//! of a refused call's `Status` in `common::kube_client`.

mod functions;
mod objects;
mod runtime;
mod watch;

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use serde_json::{Value, json};

/// A ConfigMap in the default namespace.
fn cm(name: &str, labels: Value, data: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "labels": labels }, "data": data,
    }))
    .unwrap()
}

/// The Functions of the default namespace, through the dynamic API.
fn function_api(client: kube::Client) -> (Api<DynamicObject>, ApiResource) {
    let gvk = GroupVersionKind::gvk("serverless.kyma-project.io", "v1alpha2", "Function");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "functions");
    (Api::namespaced_with(client, "default", &ar), ar)
}

/// A Kyma Function as users write it.
fn kyma_function(name: &str) -> Value {
    json!({
        "apiVersion": "serverless.kyma-project.io/v1alpha2",
        "kind": "Function",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "runtime": "nodejs22",
            "source": { "inline": {
                "source": "module.exports = { main: function (event, context) { return 'hi' } }",
                "dependencies": "{ \"name\": \"hello\", \"version\": \"1.0.0\" }",
            }},
            "env": [{ "name": "GREETING", "value": "hi" }],
            "resourceConfiguration": {
                "function": { "profile": "S" },
                "build": { "profile": "normal" },
            },
            "scaleConfig": { "minReplicas": 1, "maxReplicas": 3 },
            "labels": { "team": "a" },
        },
    })
}

/// The next event of a watcher stream, failing the test after a few seconds.
async fn next<S, T>(stream: &mut S) -> T
where
    S: futures_util::Stream<Item = T> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream goes on")
}

fn event_name(event: &watcher::Event<ConfigMap>) -> String {
    match event {
        watcher::Event::Init => "init".into(),
        watcher::Event::InitApply(o) => format!("init-apply {}", o.metadata.name.as_ref().unwrap()),
        watcher::Event::InitDone => "init-done".into(),
        watcher::Event::Apply(o) => {
            format!("apply {} {:?}", o.metadata.name.as_ref().unwrap(), o.data)
        }
        watcher::Event::Delete(o) => format!("delete {}", o.metadata.name.as_ref().unwrap()),
    }
}
