//! Pure build planning: the config edit a Function's image gets (runtime env, user, labels,
//! annotations) and the build key that identifies a build's inputs. No I/O.

use std::collections::BTreeMap;

use crate::oci::{ConfigEdit, Digest, Hasher};
use crate::runtime::RuntimeSpec;

/// Label carrying the build key.
pub const BUILD_KEY_LABEL: &str = "dev.kiln.build-key";
/// Label carrying the runtime name.
pub const RUNTIME_LABEL: &str = "dev.kiln.runtime";

/// Everything the config edit depends on.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// The runtime.
    pub runtime: &'a RuntimeSpec,
    /// `FUNC_NAME`.
    pub function_name: &'a str,
    /// `SERVICE_NAMESPACE`.
    pub namespace: &'a str,
    /// `SOURCE_DATE_EPOCH`: the only timestamp in the image.
    pub epoch: u64,
    /// The base image's registry reference; `None` for a local layout, whose path is not a
    /// portable name (and would make the digest depend on where the checkout lives).
    pub base_name: Option<&'a str>,
    /// The base manifest digest.
    pub base_digest: &'a Digest,
    /// The build key.
    pub build_key: &'a Digest,
}

/// The build key: a digest over the runtime, the exact base manifest, the dependency key and
/// the source layer. Same key, same image.
pub fn build_key(
    runtime: &str,
    base: &Digest,
    deps: Option<&Digest>,
    source_diff_id: &Digest,
) -> Digest {
    let mut h = Hasher::new();
    let none = String::from("none");
    for part in [
        "kiln-build-v1",
        runtime,
        &base.to_string(),
        &deps.map_or(none, ToString::to_string),
        &source_diff_id.to_string(),
    ] {
        h.update(part.as_bytes());
        h.update(b"\n");
    }
    h.finish().0
}

/// The config edit for a Function image.
pub fn config_edit(input: &PlanInput<'_>) -> ConfigEdit {
    let created = rfc3339(input.epoch);
    let mut env: Vec<(String, String)> = input
        .runtime
        .image
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.push(("FUNC_NAME".into(), input.function_name.into()));
    env.push(("SERVICE_NAMESPACE".into(), input.namespace.into()));
    let oci = |k: &str| format!("org.opencontainers.image.{k}");
    let mut labels = BTreeMap::from([
        (BUILD_KEY_LABEL.to_string(), input.build_key.to_string()),
        (RUNTIME_LABEL.to_string(), input.runtime.name.clone()),
        (oci("created"), created.clone()),
        (oci("title"), input.function_name.to_string()),
        (oci("base.digest"), input.base_digest.to_string()),
    ]);
    let mut annotations = BTreeMap::from([
        (oci("created"), created.clone()),
        (oci("base.digest"), input.base_digest.to_string()),
    ]);
    if let Some(name) = input.base_name {
        labels.insert(oci("base.name"), name.to_string());
        annotations.insert(oci("base.name"), name.to_string());
    }
    ConfigEdit {
        created,
        env,
        labels,
        user: input.runtime.image.user.clone(),
        working_dir: input.runtime.image.workdir.clone(),
        entrypoint: input.runtime.image.entrypoint.clone(),
        cmd: None,
        exposed_ports: input.runtime.image.ports.clone(),
        annotations,
    }
}

/// Formats seconds since the epoch as RFC 3339 UTC (`1970-01-01T00:00:00Z`).
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm), valid for the whole u64 seconds range
    // anyone will pass.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn the_edit_carries_the_runtime_contract_env_and_labels() {
        let catalog = crate::runtime::Catalog::embedded();
        let runtime = catalog.get("nodejs22").unwrap();
        let d = Digest::of(b"base");
        let key = build_key("nodejs22", &d, None, &Digest::of(b"src"));
        let edit = config_edit(&PlanInput {
            runtime,
            function_name: "hello",
            namespace: "team",
            epoch: 0,
            base_name: Some("reg/base:1"),
            base_digest: &d,
            build_key: &key,
        });
        let env: BTreeMap<_, _> = edit.env.iter().cloned().collect();
        assert_eq!(env["FUNC_NAME"], "hello");
        assert_eq!(env["SERVICE_NAMESPACE"], "team");
        assert_eq!(env["FUNC_RUNTIME"], "nodejs22");
        assert_eq!(env["FUNC_PORT"], "8080");
        assert_eq!(edit.labels[BUILD_KEY_LABEL], key.to_string());
        assert_eq!(edit.user.as_deref(), Some("1000"));
        assert_ne!(
            key,
            build_key("nodejs22", &d, Some(&d), &Digest::of(b"src"))
        );
    }
}
