//! What a build mounts besides its image, in the build namespace next to its Job: the source
//! ConfigMap of an inline Function (keys `source` and `dependencies`, Kyma's keys), mounted
//! as the handler file and the dependency manifest; and copies of the Function namespace's
//! Secrets the build needs (git credentials, the package-registry config), since a Pod
//! mounts Secrets of its own namespace only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::{build_meta, stamp};
use crate::controller::config::Config;
use crate::controller::crd::Function;
use crate::controller::names;
use crate::controller::plan::{Plan, SourcePlan};

/// The ConfigMap key holding the handler source.
pub const SOURCE_KEY: &str = "source";
/// The ConfigMap key holding the dependency manifest.
pub const DEPENDENCIES_KEY: &str = "dependencies";

/// The ConfigMap of `plan`'s build, or `None` for a git source (the build clones).
pub fn config_map(f: &Function, plan: &Plan, config: &Config) -> Option<ConfigMap> {
    let SourcePlan::Inline {
        source,
        dependencies,
    } = &plan.source
    else {
        return None;
    };
    let mut cm = ConfigMap {
        metadata: build_meta(f, plan, config, &names::build_name(f, &plan.key)),
        data: Some(BTreeMap::from([
            (SOURCE_KEY.to_string(), source.clone()),
            (DEPENDENCIES_KEY.to_string(), dependencies.clone()),
        ])),
        // The source of a build never changes: a new source is a new build key.
        immutable: Some(true),
        ..ConfigMap::default()
    };
    stamp(&mut cm, |c| &mut c.metadata);
    Some(cm)
}

/// Which of the Function namespace's Secrets a build copy holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copied {
    /// The git credentials (`spec.source.gitRepository.auth.secretName`).
    Git,
    /// The package-registry config (`.npmrc`, `pip.conf`).
    Packages,
}

/// The name of a build's copy of a Secret: `<build name>-git` or `<build name>-packages`.
pub fn copy_name(f: &Function, plan: &Plan, which: Copied) -> String {
    let suffix = match which {
        Copied::Git => "git",
        Copied::Packages => "packages",
    };
    format!("{}-{suffix}", names::build_name(f, &plan.key))
}

/// The build's immutable copy of `original`'s data, as [`copy_name`] names it.
pub fn secret_copy(
    f: &Function,
    plan: &Plan,
    config: &Config,
    which: Copied,
    original: &Secret,
) -> Secret {
    let mut copy = Secret {
        metadata: build_meta(f, plan, config, &copy_name(f, plan, which)),
        type_: Some("Opaque".into()),
        data: original.data.clone(),
        immutable: Some(true),
        ..Secret::default()
    };
    stamp(&mut copy, |s| &mut s.metadata);
    copy
}
