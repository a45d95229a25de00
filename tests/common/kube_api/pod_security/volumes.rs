//! Checks on the volume sources a pod mounts: hostPath at baseline, and only the allowed
//! (ephemeral or API-backed) sources at restricted.

use std::collections::BTreeSet;

use super::message::{Violation, join_quote, pluralize, sorted};
use super::pod::{Pod, field, items, text};

pub(super) fn host_path_volumes(pod: &Pod<'_>) -> Option<Violation> {
    let names: Vec<&str> = items(field(pod.spec, "volumes"))
        .iter()
        .filter(|v| field(v, "hostPath").is_some())
        .map(|v| text(field(v, "name")))
        .collect();
    if names.is_empty() {
        return None;
    }
    Violation::new(
        "hostPath volumes",
        format!(
            "{} {}",
            pluralize("volume", "volumes", names.len()),
            join_quote(&names)
        ),
    )
}

/// Volume sources a restricted pod may use.
const ALLOWED_VOLUME_SOURCES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The other volume sources, in upstream's switch order: the first one set names the type.
const RESTRICTED_VOLUME_SOURCES: &[&str] = &[
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

pub(super) fn restricted_volumes(pod: &Pod<'_>) -> Option<Violation> {
    let mut bad_volumes = Vec::new();
    let mut bad_types = BTreeSet::new();
    for volume in items(field(pod.spec, "volumes")) {
        if ALLOWED_VOLUME_SOURCES
            .iter()
            .any(|key| field(volume, key).is_some())
        {
            continue;
        }
        bad_volumes.push(text(field(volume, "name")));
        let kind = RESTRICTED_VOLUME_SOURCES
            .iter()
            .find(|key| field(volume, key).is_some())
            .copied()
            .unwrap_or("unknown");
        bad_types.insert(kind);
    }
    if bad_volumes.is_empty() {
        return None;
    }
    let types = sorted(bad_types);
    Violation::new(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad_volumes.len()),
            join_quote(&bad_volumes),
            pluralize("uses", "use", bad_volumes.len()),
            pluralize(
                "restricted volume type",
                "restricted volume types",
                types.len()
            ),
            join_quote(&types)
        ),
    )
}
