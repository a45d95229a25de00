//! The controller's record of the images its own build Jobs built: one ConfigMap per Function
//! in the build namespace (`<namespace>.<name>`), mapping build keys to the manifest digest
//! the build container reported. The controller deploys a digest only if it is recorded
//! here: an image that someone else pushed under a build key's tag (a tenant with push
//! access, a registry shared with another cluster) is never taken for a build. Tenants
//! cannot write the build namespace. The record keeps the latest [`MAX_ENTRIES`] keys, so
//! reverting a Function to an earlier version deploys the image built then. Each entry also
//! names the base and builder digests the image was made with, which tell a later base
//! change from a change of the Function (see `rebases`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;

use super::apply;
use super::context::Context;
use super::crd::Function;
use super::error::{Error, Result};
use super::names;
use super::render::stamp;
use super::stores::object_ref;

/// How many build keys a Function's record keeps.
pub const MAX_ENTRIES: usize = 16;

/// The base and builder image digests a build ran on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltOn {
    /// The base image's manifest digest.
    pub base: String,
    /// The builder image's manifest digest.
    pub builder: String,
    /// Made by a rebase onto them, not by a build: a later pass that finds the entry before
    /// the status shows it (its status write lost a race) says so too.
    pub rebased: bool,
}

/// The entries this controller wrote, kept until its watch cache of the records shows them:
/// a pass right after a write finds what it wrote. Without it, a Function whose builder
/// image changed (its image kept for the new key) and whose base changed a moment later did
/// not find the entry it had just written, took the change for a change of its own, and ran
/// a build Job (`bench/fleet_rebase.rs`, 2 of 100 Functions).
#[derive(Debug, Default)]
pub struct Written(std::sync::Mutex<std::collections::HashMap<(String, String), String>>);

/// How many entries [`Written`] keeps at most (each goes once the cache shows it).
const WRITTEN_KEPT: usize = 4096;

impl Written {
    fn keep(&self, record: &str, key: &str, value: String) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= WRITTEN_KEPT {
            kept.clear(); // a cache that far behind is read again from the API anyway
        }
        kept.insert((record.to_string(), key.to_string()), value);
    }

    /// The value of `key` in `record`: the one written here until `cached` (the watch
    /// cache's) shows it, when it is forgotten; else the cache's.
    fn get(&self, record: &str, key: &str, cached: Option<&String>) -> Option<String> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let id = (record.to_string(), key.to_string());
        match (kept.get(&id), cached) {
            (Some(ours), Some(theirs)) if ours == theirs => {
                kept.remove(&id);
                Some(theirs.clone())
            }
            (Some(ours), _) => Some(ours.clone()),
            (None, cached) => cached.cloned(),
        }
    }
}

/// The digest recorded for `f`'s build `key`, from the watch cache.
pub fn recorded(ctx: &Context, f: &Function, key: &str) -> Option<String> {
    recorded_on(ctx, f, key).map(|(digest, _)| digest)
}

/// The digest recorded for `f`'s build `key`, and what it was built on when the entry says.
pub fn recorded_on(ctx: &Context, f: &Function, key: &str) -> Option<(String, Option<BuiltOn>)> {
    let name = names::records_name(f);
    let record = ctx
        .stores
        .config_maps
        .get(&object_ref(&ctx.config.build_namespace, &name));
    let cached = record.as_ref().and_then(|r| r.data.as_ref()?.get(key));
    let value = ctx.written.get(&name, key, cached)?;
    let (digest, _) = entry(&value)?;
    Some((digest.to_string(), built_on(&value)))
}

/// Records that `f`'s build `key` made `digest` on `on`, at `now` (Unix seconds).
///
/// # Errors
/// The API request failed.
pub async fn record(
    ctx: &Context,
    f: &Function,
    key: &str,
    digest: &str,
    on: &BuiltOn,
    now: u64,
) -> Result<()> {
    let ns = &ctx.config.build_namespace;
    let name = names::records_name(f);
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    // Read, not from the cache: a record written a moment ago may not be there yet, and
    // applying without its entries would drop them.
    let live = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {ns}/{name}")))?;
    let held = live
        .as_ref()
        .and_then(|cm| cm.data.as_ref()?.get(key))
        .and_then(|v| entry(v))
        .is_some_and(|(d, _)| d == digest);
    if held {
        return Ok(());
    }
    let desired = render(f, ns, live.as_ref(), key, (digest, Some(on)), now);
    apply::apply(&api, "ConfigMap", &desired, live.as_ref(), &ctx.verified).await?;
    ctx.written.keep(&name, key, value(digest, now, Some(on)));
    Ok(())
}

/// Whether `cm` is a record of built images.
pub fn is_record(cm: &ConfigMap) -> bool {
    cm.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::RESOURCE))
        .is_some_and(|r| r == "images")
}

/// When the latest entry of a record was written (Unix seconds).
pub fn latest(cm: &ConfigMap) -> Option<u64> {
    cm.data
        .as_ref()?
        .values()
        .filter_map(|v| entry(v).map(|(_, at)| at))
        .max()
}

/// `(digest, recorded at)` of an entry's value
/// `"<digest> <unix seconds>[ <base> <builder>[ rebased]]"`.
fn entry(value: &str) -> Option<(&str, u64)> {
    let mut parts = value.split(' ');
    let (digest, at) = (parts.next()?, parts.next()?);
    digest
        .starts_with("sha256:")
        .then_some(())
        .and_then(|()| Some((digest, at.parse().ok()?)))
}

/// The base and builder digests of an entry's value, when it names them.
fn built_on(value: &str) -> Option<BuiltOn> {
    let mut parts = value.split(' ').skip(2);
    let (base, builder) = (parts.next()?, parts.next()?);
    let digest = |d: &str| d.parse::<crate::oci::Digest>().is_ok();
    (digest(base) && digest(builder)).then(|| BuiltOn {
        base: base.into(),
        builder: builder.into(),
        rebased: parts.next() == Some(REBASED),
    })
}

/// The last word of an entry made by a rebase.
const REBASED: &str = "rebased";

fn value(digest: &str, at: u64, on: Option<&BuiltOn>) -> String {
    let mut value = format!("{digest} {at}");
    if let Some(on) = on {
        value += &format!(" {} {}", on.base, on.builder);
        if on.rebased {
            value += &format!(" {REBASED}");
        }
    }
    value
}

/// The record with `key` → `digest` (built on `on`) added to what `live` holds, the oldest
/// entries dropped past [`MAX_ENTRIES`].
pub fn render(
    f: &Function,
    namespace: &str,
    live: Option<&ConfigMap>,
    key: &str,
    (digest, on): (&str, Option<&BuiltOn>),
    now: u64,
) -> ConfigMap {
    let mut entries: Vec<(String, String, u64)> = live
        .and_then(|cm| cm.data.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != key)
        .filter_map(|(k, v)| {
            let (d, at) = entry(v)?;
            Some((k.clone(), value(d, at, built_on(v).as_ref()), at))
        })
        .collect();
    entries.push((key.to_string(), value(digest, now, on), now));
    entries.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    entries.truncate(MAX_ENTRIES);
    let data: BTreeMap<String, String> = entries.into_iter().map(|(k, v, _)| (k, v)).collect();
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::records_name(f)),
            namespace: Some(namespace.into()),
            labels: Some(names::build_labels(f, "images")),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    };
    stamp(&mut cm, |c| &mut c.metadata);
    cm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_written_here_is_found_until_the_cache_shows_it() {
        let written = Written::default();
        let (ours, older) = ("sha256:bb 2".to_string(), "sha256:aa 1".to_string());
        assert_eq!(written.get("r", "k", Some(&older)), Some(older.clone()));
        written.keep("r", "k", ours.clone());
        assert_eq!(
            written.get("r", "k", None),
            Some(ours.clone()),
            "not cached yet"
        );
        assert_eq!(
            written.get("r", "k", Some(&older)),
            Some(ours.clone()),
            "cache behind"
        );
        assert_eq!(written.get("r", "k", Some(&ours)), Some(ours.clone()));
        assert!(
            written.0.lock().unwrap().is_empty(),
            "forgotten once cached"
        );
        assert_eq!(written.get("r", "k", None), None);
    }

    fn function() -> Function {
        let mut f = Function::new("hello", Default::default());
        f.metadata.namespace = Some("team".into());
        f.metadata.uid = Some("u-1".into());
        f
    }

    fn digest(i: usize) -> String {
        format!("sha256:{i:064x}")
    }

    #[test]
    fn the_record_keeps_the_latest_keys_and_ignores_what_it_did_not_write() {
        let f = function();
        let mut cm = render(&f, "kiln-builds", None, "k0", (&digest(0), None), 100);
        assert_eq!(cm.metadata.name.as_deref(), Some("team.hello"));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("kiln-builds"));
        let labels = cm.metadata.labels.clone().unwrap();
        assert_eq!(labels[names::FUNCTION_NAMESPACE], "team");
        assert_eq!(labels[names::RESOURCE], "images");
        assert!(cm.metadata.owner_references.is_none());
        for i in 1..=MAX_ENTRIES {
            cm = render(
                &f,
                "kiln-builds",
                Some(&cm),
                &format!("k{i}"),
                (&digest(i), None),
                100 + i as u64,
            );
        }
        let data = cm.data.clone().unwrap();
        assert_eq!(data.len(), MAX_ENTRIES);
        assert!(!data.contains_key("k0"), "the oldest entry goes");
        assert_eq!(data["k16"], format!("{} 116", digest(16)));
        // The same key again moves it to now; a value not in kiln's form is dropped.
        cm.data
            .as_mut()
            .unwrap()
            .insert("junk".into(), "latest".into());
        let on = BuiltOn {
            base: digest(100),
            builder: digest(101),
            rebased: false,
        };
        let cm = render(
            &f,
            "kiln-builds",
            Some(&cm),
            "k1",
            (&digest(1), Some(&on)),
            200,
        );
        let data = cm.data.clone().unwrap();
        let k1 = format!("{} 200 {} {}", digest(1), digest(100), digest(101));
        assert_eq!(data["k1"], k1);
        assert_eq!(built_on(&data["k1"]), Some(on.clone()));
        assert_eq!(built_on(&data["k16"]), None);
        assert!(!data.contains_key("junk"));
        // A rebase's entry says so, and keeps saying so as later entries are added.
        let rebased = BuiltOn {
            rebased: true,
            ..on.clone()
        };
        let cm = render(
            &f,
            "kiln-builds",
            Some(&cm),
            "k2",
            (&digest(2), Some(&rebased)),
            300,
        );
        let cm = render(&f, "kiln-builds", Some(&cm), "k3", (&digest(3), None), 400);
        let data = cm.data.unwrap();
        assert_eq!(
            data["k2"],
            format!("{} 300 {} {} rebased", digest(2), digest(100), digest(101))
        );
        assert_eq!(built_on(&data["k2"]), Some(rebased));
        assert_eq!(built_on(&data["k1"]), Some(on));
        assert_eq!(entry("sha256:ab 7"), Some(("sha256:ab", 7)));
        assert_eq!(entry("md5:ab 7"), None);
    }
}
