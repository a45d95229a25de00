//! The source ConfigMap of an inline Function's build: keys `source` and `dependencies`
//! (Kyma's keys), mounted into the build Job as the handler file and the dependency manifest.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::{child_meta, stamp};
use crate::controller::crd::Function;
use crate::controller::names;
use crate::controller::plan::{Plan, SourcePlan};

/// The ConfigMap key holding the handler source.
pub const SOURCE_KEY: &str = "source";
/// The ConfigMap key holding the dependency manifest.
pub const DEPENDENCIES_KEY: &str = "dependencies";

/// The ConfigMap of `plan`'s build, or `None` for a git source (the build clones).
pub fn config_map(f: &Function, plan: &Plan) -> Option<ConfigMap> {
    let SourcePlan::Inline {
        source,
        dependencies,
    } = &plan.source
    else {
        return None;
    };
    let mut labels = names::object_labels(f);
    labels.insert(names::BUILD_KEY.into(), names::key_label(&plan.key));
    let mut cm = ConfigMap {
        metadata: child_meta(f, &names::build_name(f, &plan.key), labels),
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
