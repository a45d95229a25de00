//! What the controller copies onto the Function's Pod: `spec.secretMounts` (valid, unique
//! Secret names and mount paths that hide neither `/tmp` nor the runtime's code) and
//! `spec.labels` / `spec.annotations` (Kubernetes' metadata rules, and not the controller's
//! reserved prefix).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use super::{Verdict, dns1123_subdomain, label_value, qualified_name};
use crate::controller::crd::{RESERVED_PREFIX, SecretMount};
use crate::runtime::RuntimeSpec;

/// Kubernetes' limit on the total size of an object's annotations (keys and values).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// The Pod's writable scratch directory (an emptyDir).
const TMP: &str = "/tmp";

/// What the container runtime and the kubelet put in every container: a Secret mounted on,
/// in or over one of them would shadow the kernel's views or the Pod's own credentials.
const SYSTEM_DIRS: [&str; 5] = ["/proc", "/dev", "/sys", "/var/run/secrets", "/run/secrets"];

pub(super) fn check_secret_mounts(
    mounts: &[SecretMount],
    runtime: Option<&RuntimeSpec>,
    verdict: &mut Verdict,
) {
    let code_dirs: Vec<&str> = runtime.map_or_else(Vec::new, |r| {
        let mut dirs = vec![r.source.dir.as_str(), r.dependencies.dir.as_str()];
        dirs.extend(r.image.workdir.as_deref());
        dirs
    });
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut paths: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (i, mount) in mounts.iter().enumerate() {
        let field = format!("spec.secretMounts[{i}]");
        let name = mount.secret_name.as_str();
        if name.is_empty() {
            verdict.error(format!("{field}.secretName"), "a Secret name is required");
        } else if let Err(e) = dns1123_subdomain(name) {
            verdict.error(
                format!("{field}.secretName"),
                format!("{name:?} is not a valid Secret name ({e})"),
            );
        } else if let Some(first) = names.get(name) {
            verdict.error(
                format!("{field}.secretName"),
                format!(
                    "{name:?} is already mounted by spec.secretMounts[{first}]; mount each \
                    Secret once"
                ),
            );
        } else {
            names.insert(name, i);
        }
        let Some(path) = check_mount_path(&field, &mount.mount_path, &code_dirs, verdict) else {
            continue;
        };
        match paths.get(&path) {
            Some(first) => verdict.error(
                format!("{field}.mountPath"),
                format!(
                    "{:?} is already used by spec.secretMounts[{first}]; give each mount its own \
                        path",
                    mount.mount_path
                ),
            ),
            None => {
                paths.insert(path, i);
            }
        }
    }
}

/// The normalised path, when it is usable.
fn check_mount_path(
    field: &str,
    raw: &str,
    code_dirs: &[&str],
    verdict: &mut Verdict,
) -> Option<PathBuf> {
    let field = format!("{field}.mountPath");
    let path = Path::new(raw);
    if !path.is_absolute() {
        verdict.error(
            field,
            format!("{raw:?} is not an absolute path; use one such as /secrets/NAME"),
        );
        return None;
    }
    if path.components().any(|c| c == Component::ParentDir) {
        verdict.error(field, format!("{raw:?} must not contain '..'"));
        return None;
    }
    let normal: PathBuf = path.components().collect();
    let tmp = Path::new(TMP);
    if tmp.starts_with(&normal) {
        verdict.error(
            field,
            format!(
                "{raw:?} would hide {TMP}, the Function's writable scratch directory; use a \
                 path such as /secrets/NAME"
            ),
        );
        return None;
    }
    let dirs = code_dirs
        .iter()
        .map(|d| (d, "where the runtime keeps the Function's code"));
    let system = SYSTEM_DIRS
        .iter()
        .map(|d| (d, "which the container runtime provides"));
    for (dir, what) in dirs.chain(system) {
        let dir = Path::new(dir);
        let clash = if normal.starts_with(dir) {
            "is inside"
        } else if dir.starts_with(&normal) {
            "would hide"
        } else {
            continue;
        };
        verdict.error(
            field,
            format!(
                "{raw:?} {clash} {}, {what}; use a path such as /secrets/NAME",
                dir.display()
            ),
        );
        return None;
    }
    Some(normal)
}

pub(super) fn check_labels(labels: &BTreeMap<String, String>, verdict: &mut Verdict) {
    for (key, value) in labels {
        let field = format!("spec.labels[{key}]");
        if check_key(&field, key, key, "labels", verdict)
            && let Err(e) = label_value(value)
        {
            verdict.error(
                field,
                format!("value {value:?} is not a valid label value ({e})"),
            );
        }
    }
}

pub(super) fn check_annotations(annotations: &BTreeMap<String, String>, verdict: &mut Verdict) {
    for key in annotations.keys() {
        // Kubernetes checks annotation keys case-insensitively.
        check_key(
            &format!("spec.annotations[{key}]"),
            key,
            &key.to_ascii_lowercase(),
            "annotations",
            verdict,
        );
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_ANNOTATIONS_BYTES {
        verdict.error(
            "spec.annotations",
            format!(
                "{size} bytes in total exceed Kubernetes' limit of {MAX_ANNOTATIONS_BYTES} \
                 bytes; shorten or remove annotations"
            ),
        );
    }
}

/// Whether the key is acceptable; reports it otherwise.
fn check_key(field: &str, key: &str, checked: &str, what: &str, verdict: &mut Verdict) -> bool {
    if let Err(e) = qualified_name(checked) {
        verdict.error(
            field,
            format!("key {key:?} is not a valid qualified name ({e})"),
        );
        return false;
    }
    if key.starts_with(RESERVED_PREFIX) {
        verdict.error(
            field,
            format!(
                "{what} with the prefix {RESERVED_PREFIX} are reserved for the controller; \
                 choose another key"
            ),
        );
        return false;
    }
    true
}
