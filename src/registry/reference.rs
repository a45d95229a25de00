//! Image references, `host[:port]/repo/path[:tag][@sha256:…]`, parsed once and normalised the
//! way Docker does: a name without a registry is on Docker Hub (`docker.io`), and a one-part
//! Docker Hub name lives under `library/`.

use std::fmt;
use std::str::FromStr;

use super::error::{Error, Result};
use crate::oci::Digest;

/// The registry name used for Docker Hub in references.
pub const DOCKER_HUB: &str = "docker.io";
/// The host Docker Hub's registry API is served from.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A parsed, normalised image reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `host[:port]`, `docker.io` for Docker Hub.
    pub registry: String,
    /// The repository path inside the registry (`library/ubuntu`).
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// The digest, if any (it wins over the tag when fetching).
    pub digest: Option<Digest>,
}

impl Reference {
    /// The same repository pinned to `digest` (the tag is kept).
    pub fn with_digest(&self, digest: Digest) -> Reference {
        Reference {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// The same repository at `tag`, without a digest.
    ///
    /// # Errors
    /// [`Error::InvalidReference`] when `tag` is not a valid tag.
    pub fn with_tag(&self, tag: &str) -> Result<Reference> {
        check_tag(tag).map_err(|problem| Error::InvalidReference {
            input: tag.into(),
            problem,
        })?;
        Ok(Reference {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        })
    }

    /// The same repository without tag or digest.
    pub fn repository_only(&self) -> Reference {
        Reference {
            tag: None,
            digest: None,
            ..self.clone()
        }
    }

    /// `registry/repository`.
    pub fn repository_path(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The `host[:port]` serving the registry API (`registry-1.docker.io` for Docker Hub).
    pub fn api_host(&self) -> &str {
        api_host(&self.registry)
    }

    /// What identifies the manifest in `/v2/<repo>/manifests/<this>`: the digest if set, else
    /// the tag, else `latest`.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".to_string(),
        }
    }
}

/// The `host[:port]` serving the API of the registry named `registry` in references.
pub fn api_host(registry: &str) -> &str {
    if registry == DOCKER_HUB {
        DOCKER_HUB_API
    } else {
        registry
    }
}

impl FromStr for Reference {
    type Err = Error;

    fn from_str(input: &str) -> Result<Reference> {
        let bad = |problem| Error::InvalidReference {
            input: input.to_string(),
            problem,
        };
        if input.is_empty() {
            return Err(bad("it is empty"));
        }
        let (rest, digest) = match input.rsplit_once('@') {
            Some((rest, d)) => {
                let digest = d
                    .parse::<Digest>()
                    .map_err(|_| bad("the digest is not sha256:<64 lowercase hex>"))?;
                (rest, Some(digest))
            }
            None => (input, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(tag) = tag {
            check_tag(tag).map_err(bad)?;
        }
        if !name.contains('/') && looks_like_host(name) {
            return Err(bad(
                "it names a registry host but no repository: write HOST[:PORT]/REPOSITORY[:TAG] \
                 (a Docker Hub image is docker.io/library/NAME)",
            ));
        }
        let (registry, repository) = split_registry(name);
        check_registry(registry).map_err(bad)?;
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository.to_string()
        };
        check_repository(&repository).map_err(bad)?;
        if registry.len() + 1 + repository.len() > MAX_NAME_LEN {
            return Err(bad("the name is longer than 255 characters"));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository,
            tag: tag.map(str::to_string),
            digest,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Splits `name` into registry and repository using Docker's rule: the first component is a
/// registry when it contains `.` or `:`, is `localhost`, or has uppercase letters.
fn split_registry(name: &str) -> (&str, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            let registry = if first == "index.docker.io" {
                DOCKER_HUB
            } else {
                first
            };
            (registry, rest)
        }
        _ => (DOCKER_HUB, name),
    }
}

/// Whether a one-component name (`tag` split off) is a host rather than a Docker Hub image:
/// `localhost`, an IPv6 literal or a dotted name (`node:22` stays a Docker Hub image; official
/// images have no dots in their name). Docker reads `127.0.0.1:5000` as
/// `docker.io/library/127.0.0.1:5000`; kiln refuses it rather than dial Docker Hub for a
/// registry the user meant to name.
fn looks_like_host(name: &str) -> bool {
    name == "localhost" || name.starts_with('[') || name.contains('.')
}

fn check_tag(tag: &str) -> Result<(), &'static str> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = tag.chars();
    match chars.next() {
        None => Err("the tag is empty"),
        Some(c) if !word(c) => Err("a tag must start with a letter, digit or underscore"),
        _ if tag.len() > MAX_TAG_LEN => Err("a tag is at most 128 characters"),
        _ if !chars.all(|c| word(c) || c == '.' || c == '-') => {
            Err("a tag may only contain letters, digits, '_', '.' and '-'")
        }
        _ => Ok(()),
    }
}

/// Checks a registry name, `host[:port]`, as it appears in references and `--insecure-registry`.
///
/// # Errors
/// What is wrong with it.
pub fn check_registry(registry: &str) -> Result<(), &'static str> {
    const PROBLEM: &str = "the registry must be host[:port]";
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let (host_ok, port) = if let Some(rest) = registry.strip_prefix('[') {
        // An IPv6 literal: `[addr]` or `[addr]:port`.
        let (addr, after) = rest.split_once(']').ok_or(PROBLEM)?;
        let ok = !addr.is_empty() && addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':');
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(PROBLEM)?),
        };
        (ok, port)
    } else {
        let (host, port) = match registry.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (registry, None),
        };
        (host.split('.').all(label_ok), port)
    };
    if !host_ok {
        return Err(PROBLEM);
    }
    if let Some(port) = port
        && !port.bytes().all(|b| b.is_ascii_digit())
    {
        return Err("the registry port must be a number");
    }
    if let Some(port) = port
        && !matches!(port.parse::<u16>(), Ok(1..))
    {
        return Err("the registry port must be between 1 and 65535");
    }
    Ok(())
}

fn check_repository(repository: &str) -> Result<(), &'static str> {
    if repository.is_empty() {
        return Err("the repository name is empty");
    }
    if repository.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("the repository name must be lowercase");
    }
    for component in repository.split('/') {
        if !component_ok(component) {
            return Err(
                "each repository path component must be lowercase letters and digits, \
                        separated by '.', '_', '__' or dashes",
            );
        }
    }
    Ok(())
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn component_ok(c: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = matches!(sep, "." | "_" | "__") || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Reference {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn docker_hub_names_are_normalised() {
        let r = parse("ubuntu");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("docker.io", "library/ubuntu")
        );
        assert_eq!(r.tag, None);
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.to_string(), "docker.io/library/ubuntu");
        assert_eq!(
            parse("bitnami/redis:7").to_string(),
            "docker.io/bitnami/redis:7"
        );
        assert_eq!(
            parse("index.docker.io/ubuntu:22.04").to_string(),
            "docker.io/library/ubuntu:22.04"
        );
        assert_eq!(
            parse("docker.io/library/node").repository_path(),
            "docker.io/library/node"
        );
    }

    #[test]
    fn registries_with_ports_tags_and_digests_parse() {
        let d = Digest::of(b"x");
        let r = parse(&format!("127.0.0.1:5000/a/b/c:v1.2-rc_3@{d}"));
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "a/b/c");
        assert_eq!(r.tag.as_deref(), Some("v1.2-rc_3"));
        assert_eq!(r.digest.as_ref(), Some(&d));
        assert_eq!(r.api_host(), "127.0.0.1:5000");
        assert_eq!(r.manifest_ref(), d.to_string());
        assert_eq!(r.to_string(), format!("127.0.0.1:5000/a/b/c:v1.2-rc_3@{d}"));
        let local = parse("localhost/app");
        assert_eq!((local.registry.as_str(), local.tag), ("localhost", None));
        assert_eq!(parse("localhost:5000/app").manifest_ref(), "latest");
        assert_eq!(parse("[::1]:5000/app:v").registry, "[::1]:5000");
        assert_eq!(parse("Reg.Example/app").registry, "Reg.Example");
        assert_eq!(parse("node:22").to_string(), "docker.io/library/node:22");
    }

    #[test]
    fn with_tag_and_with_digest_build_new_references() {
        let d = Digest::of(b"y");
        let r = parse("reg.example/app:old").with_digest(d.clone());
        assert_eq!(r.to_string(), format!("reg.example/app:old@{d}"));
        let t = r.with_tag("new").unwrap();
        assert_eq!(t.to_string(), "reg.example/app:new");
        assert!(r.with_tag("-bad").is_err());
        assert_eq!(r.repository_only().to_string(), "reg.example/app");
    }

    #[test]
    fn malformed_references_are_rejected_with_a_reason() {
        let cases = [
            ("", "empty"),
            ("reg.example/Upper/case", "lowercase"),
            ("UPPER", "lowercase"),
            ("reg.example/app:bad tag", "tag may only"),
            ("reg.example/app:", "tag is empty"),
            ("reg.example/app:.x", "must start"),
            ("reg.example/app@sha256:abc", "digest"),
            ("reg.example/a//b", "component"),
            ("reg.example/a-", "component"),
            ("reg.example:port/a", "port"),
            ("bad_host.example/a", "host[:port]"),
            ("reg.example/", "empty"),
            ("127.0.0.1:5000", "no repository"),
            ("localhost:5000", "no repository"),
            ("reg.example.com", "no repository"),
            ("localhost", "no repository"),
            ("[::1]:5000", "no repository"),
            ("reg.example:99999/a", "between 1 and 65535"),
            ("reg.example:0/a", "between 1 and 65535"),
            ("reg.example:/a", "between 1 and 65535"),
        ];
        for (input, needle) in cases {
            match input.parse::<Reference>() {
                Err(e @ Error::InvalidReference { .. }) => {
                    assert!(e.to_string().contains(needle), "{input:?}: {e}")
                }
                other => panic!("{input:?} gave {other:?}"),
            }
        }
        let long_tag = format!("a:{}", "t".repeat(129));
        assert!(long_tag.parse::<Reference>().is_err());
    }

    #[test]
    fn repository_components_follow_the_distribution_grammar() {
        for ok in ["a", "a.b", "a_b", "a__b", "a---b", "0x"] {
            assert!(component_ok(ok), "{ok}");
        }
        for bad in ["", "_a", "a.", "a..b", "a___b", "a.-b"] {
            assert!(!component_ok(bad), "{bad}");
        }
    }
}
