//! The build key: one digest over every input that decides a Function's image, computed by
//! the controller before anything runs. The image is tagged with it, so "is it built?" is one
//! manifest HEAD, and an unchanged Function is never rebuilt. Pure.
//!
//! Inputs, in order (each on its own line, so no two different input sets hash alike):
//! the key format version; the kiln runtime; the base image digest; the builder image digest
//! (which names the toolchain and the kiln that builds); the Function's namespace and name
//! (the image's `SERVICE_NAMESPACE`/`FUNC_NAME`); the source — inline: the handler source and
//! the dependency manifest as the build sees them; git: the URL, the resolved commit and
//! the base directory — the digest of the package-registry config (`.npmrc`/`pip.conf`:
//! hashed, never in clear), or `none`; and the platforms built for, comma-separated.

use crate::oci::{Digest, Hasher, Platform};

/// The code of a build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourcePlan {
    /// From the manifest: the handler and the sanitized dependency manifest.
    Inline {
        /// The handler source.
        source: String,
        /// The dependency manifest (an empty Node.js one becomes `{}`, as in Kyma).
        dependencies: String,
    },
    /// From git, at a resolved commit.
    Git {
        /// The repository URL.
        url: String,
        /// The commit.
        commit: String,
        /// The Function's directory in the repository.
        base_dir: String,
        /// The Secret with `username` and `password`, if any.
        auth_secret: Option<String>,
    },
}

/// Bump when the image kiln builds from the same inputs changes shape.
const FORMAT: &str = "kiln-function-key-v1";

/// Every input of the build key.
#[derive(Clone, Debug)]
pub struct KeyInputs<'a> {
    /// The kiln runtime (after mapping a Kyma name).
    pub runtime: &'a str,
    /// The base image's manifest digest.
    pub base: &'a Digest,
    /// The builder image's manifest digest.
    pub builder: &'a Digest,
    /// The Function's namespace.
    pub namespace: &'a str,
    /// The Function's name.
    pub name: &'a str,
    /// The code. Which Secret holds git credentials is not part of it: it does not change
    /// the image.
    pub source: &'a SourcePlan,
    /// Digest of the package-registry config, if the namespace has one.
    pub registry_config: Option<&'a Digest>,
    /// The platforms built for: one image, or an index over one image each.
    pub platforms: &'a [Platform],
}

/// The build key as 64 hex digits (it is also the image tag).
pub fn build_key(inputs: &KeyInputs<'_>) -> String {
    let mut h = Hasher::new();
    let mut line = |part: &str| {
        // Length-prefixed: a part containing a newline cannot imitate two parts.
        h.update(format!("{}:", part.len()).as_bytes());
        h.update(part.as_bytes());
        h.update(b"\n");
    };
    line(FORMAT);
    line(inputs.runtime);
    line(&inputs.base.to_string());
    line(&inputs.builder.to_string());
    line(inputs.namespace);
    line(inputs.name);
    match inputs.source {
        SourcePlan::Inline {
            source,
            dependencies,
        } => {
            line("inline");
            line(source);
            line(dependencies);
        }
        SourcePlan::Git {
            url,
            commit,
            base_dir,
            auth_secret: _,
        } => {
            line("git");
            line(url);
            line(commit);
            line(base_dir);
        }
    }
    line(
        &inputs
            .registry_config
            .map_or("none".into(), ToString::to_string),
    );
    let platforms: Vec<String> = inputs.platforms.iter().map(ToString::to_string).collect();
    line(&platforms.join(","));
    h.finish().0.hex().to_string()
}

/// The image repository of a Function: `<registry>/<namespace>/<name>`. One path component
/// per namespace, so that a registry's access rules (a token server's, a cloud registry's
/// IAM) can give each tenant its own prefix; Kyma's `<namespace>-<name>` gave Function `c`
/// in namespace `a-b` and Function `b-c` in namespace `a` one repository.
pub fn repository(registry: &str, namespace: &str, name: &str) -> String {
    format!("{}/{namespace}/{name}", registry.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(c: char) -> Digest {
        format!("sha256:{}", c.to_string().repeat(64))
            .parse()
            .unwrap()
    }

    #[test]
    fn every_input_changes_the_key_and_equal_inputs_give_equal_keys() {
        let (a, b) = (digest('a'), digest('b'));
        let amd64 = [Platform::linux_amd64()];
        let both = [Platform::linux_amd64(), Platform::linux("arm64")];
        let inline = SourcePlan::Inline {
            source: "s".into(),
            dependencies: "{}".into(),
        };
        let base = KeyInputs {
            runtime: "nodejs22",
            base: &a,
            builder: &a,
            namespace: "ns",
            name: "f",
            source: &inline,
            registry_config: None,
            platforms: &amd64,
        };
        let key = build_key(&base);
        assert_eq!(key.len(), 64);
        assert_eq!(key, build_key(&base.clone()));
        let other_source = SourcePlan::Inline {
            source: "s2".into(),
            dependencies: "{}".into(),
        };
        let git = SourcePlan::Git {
            url: "https://x/r.git".into(),
            commit: "c".into(),
            base_dir: "/".into(),
            auth_secret: None,
        };
        let variants = [
            KeyInputs {
                runtime: "nodejs24",
                ..base.clone()
            },
            KeyInputs {
                base: &b,
                ..base.clone()
            },
            KeyInputs {
                builder: &b,
                ..base.clone()
            },
            KeyInputs {
                namespace: "ns2",
                ..base.clone()
            },
            KeyInputs {
                name: "g",
                ..base.clone()
            },
            KeyInputs {
                source: &other_source,
                ..base.clone()
            },
            KeyInputs {
                source: &git,
                ..base.clone()
            },
            KeyInputs {
                registry_config: Some(&b),
                ..base.clone()
            },
            KeyInputs {
                platforms: &both,
                ..base.clone()
            },
            // A part may not run into the next one.
            KeyInputs {
                namespace: "n",
                name: "sf",
                ..base.clone()
            },
        ];
        let mut keys: Vec<String> = variants.iter().map(build_key).collect();
        keys.push(key);
        let unique: std::collections::BTreeSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "two input sets share a key");
    }

    #[test]
    fn each_namespace_is_a_repository_prefix_of_its_own() {
        assert_eq!(
            repository("reg:5000/fn/", "team", "hello"),
            "reg:5000/fn/team/hello"
        );
        // Kyma's `<namespace>-<name>` made these one repository.
        assert_ne!(repository("r", "a-b", "c"), repository("r", "a", "b-c"));
    }
}
