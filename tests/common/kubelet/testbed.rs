//! A ready-made setting for kubelet tests: a real docker-registry on loopback holding the
//! busybox test image (by digest), and a kubelet that pulls from it with its own cache and
//! scratch directory.

use std::path::Path;

use serde_json::{Value, json};

use super::{Config, TestKubelet};
use crate::common::images::{make_layout, tagged_digest};
use crate::common::registry::{Registry, RegistryKind};

/// A registry, an image in it and a kubelet.
pub struct Testbed {
    /// The kubelet (dropped first: its pods stop before the registry does).
    pub kubelet: TestKubelet,
    /// `127.0.0.1:PORT/test/busybox@sha256:…`: Debian's static busybox (`/bin/busybox`,
    /// `/bin/sh`), Cmd `/bin/sh`, users root and 1000.
    pub image: String,
    /// The registry.
    pub registry: Registry,
    dir: tempfile::TempDir,
}

impl Testbed {
    /// Starts a plain-HTTP registry, pushes the busybox image and makes a kubelet running at
    /// most `max_jobs` Jobs at once.
    pub fn new(max_jobs: usize) -> Testbed {
        let registry = Registry::start(RegistryKind::Plain);
        let dir = tempfile::Builder::new()
            .prefix("kiln-kubelet-")
            .tempdir()
            .expect("tempdir");
        let layout = make_layout(dir.path());
        registry.skopeo_copy_from_layout(
            &layout,
            "base",
            &registry.reference("test/busybox:1"),
            None,
        );
        let digest = tagged_digest(&layout, "base");
        let image = registry.reference(&format!("test/busybox@{digest}"));
        let mut config = Config::new(
            env!("CARGO_BIN_EXE_kiln"),
            dir.path().join("cache"),
            dir.path().join("kubelet"),
        );
        config.run_args = vec!["--insecure-registry".into(), registry.host()];
        config.max_jobs = max_jobs;
        Testbed {
            kubelet: TestKubelet::new(config),
            image,
            registry,
            dir,
        }
    }

    /// Scratch space of the test.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A container running `script` with `sh -c`, hardened as the controller renders build
/// containers.
pub fn container(name: &str, image: &str, script: &str) -> Value {
    json!({
        "name": name, "image": image,
        "command": ["/bin/sh", "-c"], "args": [script],
        "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]}},
        "resources": {"limits": {"cpu": "200m", "memory": "64Mi"}},
    })
}

/// `value` with the top-level fields of `extra` set on it.
pub fn with(mut value: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        value[k] = v.clone();
    }
    value
}
