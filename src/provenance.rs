//! SLSA v1.0 provenance for a built image: an in-toto Statement (v1) whose subject is the
//! image's manifest, signed in a DSSE envelope and attached the way `cosign attest` attaches
//! one (see [`crate::cosign::prepare`]).
//!
//! The build's start and end times are in the provenance, never in the image, so the image
//! stays reproducible; every input is named by digest ([`Inputs`]).

use serde_json::{Value, json};

use crate::oci::Digest;

/// What a build was made from, each by digest: its provenance's resolved dependencies.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// The base image as named.
    pub base_name: String,
    /// The base manifest's digest.
    pub base_digest: Digest,
    /// The source layer's diff ID: the digest of the Function's tree as the image has it.
    pub source_diff_id: Digest,
    /// The dependency manifest and lock file, by name.
    pub dependency_files: Vec<(String, Digest)>,
    /// The dependency key (manifest, lock, installer and toolchain), with dependencies.
    pub dependency_key: Option<Digest>,
    /// The builder image dependencies were installed in, when one was named.
    pub builder: Option<String>,
    /// The git repository (redacted URL) and commit, for a git source.
    pub git: Option<(String, String)>,
}

/// The in-toto Statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The SLSA provenance predicate type.
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// The DSSE payload type of an in-toto Statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// What a kiln Function build is, for `buildDefinition.buildType`.
pub const BUILD_TYPE: &str = "https://kiln.dev/provenance/function-build/v1";
/// Who built it, for `runDetails.builder.id`.
pub const BUILDER_ID: &str = "https://kiln.dev/builder/kiln";

/// What the provenance says about one build.
#[derive(Debug)]
pub struct Build<'a> {
    /// The image's repository (`host/path`).
    pub repository: &'a str,
    /// Its manifest digest.
    pub digest: &'a Digest,
    /// The build key (the image's `dev.kiln.build-key`).
    pub build_key: &'a Digest,
    /// What it was made from.
    pub inputs: &'a Inputs,
    /// The flags that change the image (runtime, names, platform, epoch, …).
    pub external: Value,
    /// When the build started and ended (RFC 3339).
    pub started: String,
    /// When it ended.
    pub finished: String,
}

/// The time now, RFC 3339 in UTC, to the second: a build's start or end.
pub fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    crate::oci::rfc3339(secs)
}

fn sha256(d: &Digest) -> Value {
    json!({"sha256": d.hex()})
}

/// The in-toto Statement.
pub fn statement(build: &Build<'_>) -> Value {
    let inputs = build.inputs;
    let mut resolved = vec![
        json!({"name": "base", "uri": format!("oci://{}", inputs.base_name),
               "digest": sha256(&inputs.base_digest)}),
        json!({"name": "source", "digest": sha256(&inputs.source_diff_id),
               "annotations": {"what": "the source layer's diff ID (its uncompressed tar)"}}),
    ];
    for (name, digest) in &inputs.dependency_files {
        resolved.push(json!({"name": name, "digest": sha256(digest)}));
    }
    if let Some(key) = &inputs.dependency_key {
        resolved.push(json!({"name": "dependencies", "digest": sha256(key),
            "annotations": {"what": "the dependency key: manifest, lock, installer, toolchain"}}));
    }
    if let Some(builder) = &inputs.builder {
        resolved.push(json!({"name": "builder", "uri": builder}));
    }
    if let Some((url, commit)) = &inputs.git {
        resolved.push(json!({"name": "git", "uri": format!("git+{url}"),
            "digest": {"gitCommit": commit}}));
    }
    skeleton(&Skeleton {
        repository: build.repository,
        digest: build.digest,
        build_type: BUILD_TYPE,
        external: build.external.clone(),
        build_key: build.build_key,
        resolved,
        started: &build.started,
        finished: &build.finished,
    })
}

/// What a rebase is, for `buildDefinition.buildType`: a Function image moved onto a new base
/// without a build ([`crate::rebase`]).
pub const REBASE_TYPE: &str = "https://kiln.dev/provenance/function-rebase/v1";

/// What the provenance says about one rebase.
#[derive(Debug)]
pub struct Rebase<'a> {
    /// The rebased image's repository (`host/path`).
    pub repository: &'a str,
    /// Its manifest digest.
    pub digest: &'a Digest,
    /// Its build key: the key a build on the new base has.
    pub build_key: &'a Digest,
    /// The image it was rebased from (`host/path@digest`), whose own provenance says what
    /// it was built from: its layers but the base's are this image's.
    pub from: (&'a str, &'a Digest),
    /// The new base, as named, and its manifest digest.
    pub base: (&'a str, &'a Digest),
    /// The builder image the new base pairs with, as named (as a build names it), when one
    /// was.
    pub builder: Option<String>,
    /// The flags: where it went (`image`), the base, the platform.
    pub external: Value,
    /// When the rebase started (RFC 3339).
    pub started: String,
    /// When it ended.
    pub finished: String,
}

/// The in-toto Statement of a rebase.
pub fn rebase_statement(rebase: &Rebase<'_>) -> Value {
    let (from, from_digest) = rebase.from;
    let (base, base_digest) = rebase.base;
    let mut resolved = vec![
        json!({"name": "base", "uri": format!("oci://{base}"), "digest": sha256(base_digest)}),
        json!({"name": "image", "uri": format!("oci://{from}"), "digest": sha256(from_digest),
               "annotations": {"what": "the image rebased: its own layers, as they were"}}),
    ];
    if let Some(builder) = &rebase.builder {
        resolved.push(json!({"name": "builder", "uri": builder}));
    }
    skeleton(&Skeleton {
        repository: rebase.repository,
        digest: rebase.digest,
        build_type: REBASE_TYPE,
        external: rebase.external.clone(),
        build_key: rebase.build_key,
        resolved,
        started: &rebase.started,
        finished: &rebase.finished,
    })
}

/// What a build's and a rebase's Statements share.
struct Skeleton<'a> {
    repository: &'a str,
    digest: &'a Digest,
    build_type: &'a str,
    external: Value,
    build_key: &'a Digest,
    resolved: Vec<Value>,
    started: &'a str,
    finished: &'a str,
}

fn skeleton(s: &Skeleton<'_>) -> Value {
    json!({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": s.repository, "digest": sha256(s.digest)}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": s.build_type,
                "externalParameters": s.external,
                "internalParameters": {"buildKey": s.build_key.to_string()},
                "resolvedDependencies": s.resolved,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"kiln": env!("CARGO_PKG_VERSION")}},
                "metadata": {
                    "invocationId": s.build_key.to_string(),
                    "startedOn": s.started,
                    "finishedOn": s.finished,
                },
            },
        },
    })
}

/// DSSE's pre-authentication encoding of `payload` of `payload_type`: what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// What a verified provenance says: its subject digest and build key.
#[derive(Debug, PartialEq, Eq)]
pub struct Claims {
    /// The subject's sha256 digests.
    pub subjects: Vec<String>,
    /// `buildDefinition.internalParameters.buildKey`.
    pub build_key: Option<String>,
    /// `buildDefinition.externalParameters.image`: the reference the build pushed to.
    pub image: Option<String>,
}

/// Reads a Statement's subject digests and build key; `Err` with the reason when it is not an
/// in-toto v1 Statement of SLSA v1 provenance.
///
/// # Errors
/// The reason, as text.
pub fn claims(statement: &[u8]) -> Result<Claims, String> {
    let doc: Value = serde_json::from_slice(statement)
        .map_err(|e| format!("a provenance that is not JSON: {e}"))?;
    if doc["_type"] != STATEMENT_TYPE || doc["predicateType"] != PREDICATE_TYPE {
        return Err(format!(
            "a statement of type {} with predicate {}",
            doc["_type"], doc["predicateType"]
        ));
    }
    let subjects = doc["subject"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|s| s["digest"]["sha256"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let build_key = doc["predicate"]["buildDefinition"]["internalParameters"]["buildKey"]
        .as_str()
        .map(str::to_string);
    let image = doc["predicate"]["buildDefinition"]["externalParameters"]["image"]
        .as_str()
        .map(str::to_string);
    Ok(Claims {
        subjects,
        build_key,
        image,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsses_encoding() {
        // The DSSE protocol document's example.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    #[test]
    fn a_rebase_says_what_it_was_rebased_from_and_reads_back_as_a_builds_claims() {
        let (image, key, from, base) = (
            Digest::of(b"image"),
            Digest::of(b"key"),
            Digest::of(b"from"),
            Digest::of(b"base"),
        );
        let statement = rebase_statement(&Rebase {
            repository: "reg/fns/a",
            digest: &image,
            build_key: &key,
            from: ("reg/fns/a", &from),
            base: ("reg/kiln/nodejs22:2", &base),
            builder: Some("reg/kiln/nodejs22-builder:2".into()),
            external: json!({"image": "reg/fns/a:kiln-1"}),
            started: now(),
            finished: now(),
        });
        let definition = &statement["predicate"]["buildDefinition"];
        assert_eq!(definition["buildType"], REBASE_TYPE);
        let resolved = definition["resolvedDependencies"].as_array().unwrap();
        let names: Vec<&str> = resolved
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["base", "image", "builder"]);
        assert_eq!(resolved[1]["uri"], "oci://reg/fns/a");
        assert_eq!(resolved[1]["digest"]["sha256"], from.hex());
        let claims = claims(&serde_json::to_vec(&statement).unwrap()).unwrap();
        assert_eq!(
            claims,
            Claims {
                subjects: vec![image.hex().to_string()],
                build_key: Some(key.to_string()),
                image: Some("reg/fns/a:kiln-1".into()),
            }
        );
    }
}
