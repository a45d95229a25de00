//! The image argument of `kiln run`: a registry reference (`REGISTRY/REPO[:TAG][@sha256:…]`)
//! or an OCI layout (`oci:DIR`, `oci:DIR:NAME`, `oci:DIR@sha256:…`), including exactly what
//! `kiln build` prints.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::oci::Digest;
use crate::registry::{self, Reference};

/// Which image of a layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// The layout's only image.
    Only,
    /// The image with this `org.opencontainers.image.ref.name`.
    Name(String),
    /// The manifest or index with this digest (it need not be named in `index.json`).
    Digest(Digest),
}

/// Where the image to run comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageRef {
    /// A registry.
    Registry(Reference),
    /// An OCI image layout directory (relative to the working directory, or absolute).
    Layout {
        /// The directory.
        dir: PathBuf,
        /// Which image in it.
        selector: Selector,
    },
}

/// Why an image argument does not parse.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed registry reference.
    #[error(transparent)]
    Registry(#[from] registry::Error),
    /// `oci:` without a directory.
    #[error("{0:?} names no layout directory (expected oci:DIR[:NAME] or oci:DIR@sha256:…)")]
    NoDirectory(String),
    /// `oci:DIR@…` with something that is not a digest after the `@`.
    #[error("{input:?} has an invalid digest")]
    Digest {
        /// The argument.
        input: String,
        /// The cause.
        #[source]
        source: crate::oci::DigestError,
    },
}

impl FromStr for ImageRef {
    type Err = Error;

    fn from_str(s: &str) -> Result<ImageRef, Error> {
        let Some(rest) = s.strip_prefix("oci:") else {
            return Ok(ImageRef::Registry(s.parse()?));
        };
        let (dir, selector) = match rest.rsplit_once('@') {
            Some((dir, digest)) if digest.contains(':') && !digest.contains('/') => {
                let digest = digest.parse().map_err(|source| Error::Digest {
                    input: s.into(),
                    source,
                })?;
                (dir, Selector::Digest(digest))
            }
            _ => split_name(rest),
        };
        if dir.is_empty() {
            return Err(Error::NoDirectory(s.into()));
        }
        Ok(ImageRef::Layout {
            dir: dir.into(),
            selector,
        })
    }
}

/// Splits `DIR[:NAME]` as [`crate::oci::layout::split_layout_ref`] does.
fn split_name(s: &str) -> (&str, Selector) {
    match crate::oci::layout::split_layout_ref(s) {
        (dir, Some(name)) => (dir, Selector::Name(name)),
        (dir, None) => (dir, Selector::Only),
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Registry(r) => write!(f, "{r}"),
            ImageRef::Layout { dir, selector } => {
                write!(f, "oci:{}", dir.display())?;
                match selector {
                    Selector::Only => Ok(()),
                    Selector::Name(n) => write!(f, ":{n}"),
                    Selector::Digest(d) => write!(f, "@{d}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";

    fn layout(s: &str) -> (PathBuf, Selector) {
        match s.parse().unwrap() {
            ImageRef::Layout { dir, selector } => (dir, selector),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_kiln_build_prints_parses_back() {
        let digest: Digest = format!("sha256:{HEX}").parse().unwrap();
        let (dir, sel) = layout(&format!("oci:./out/hello@sha256:{HEX}"));
        assert_eq!(dir, PathBuf::from("./out/hello"));
        assert_eq!(sel, Selector::Digest(digest.clone()));
        let r: ImageRef = format!("127.0.0.1:5000/team/hello@sha256:{HEX}")
            .parse()
            .unwrap();
        let ImageRef::Registry(r) = r else {
            panic!("not a registry reference")
        };
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/hello");
        assert_eq!(r.digest, Some(digest));
    }

    #[test]
    fn layout_names_and_plain_directories_parse() {
        assert_eq!(
            layout("oci:/a:b/img:v1"),
            ("/a:b/img".into(), Selector::Name("v1".into()))
        );
        assert_eq!(layout("oci:img"), ("img".into(), Selector::Only));
        assert_eq!(
            layout("oci:/x/we@ird/img"),
            ("/x/we@ird/img".into(), Selector::Only)
        );
        let r: ImageRef = "registry.example/app:1.0".parse().unwrap();
        assert_eq!(r.to_string(), "registry.example/app:1.0");
        assert_eq!(
            "oci:dir:v1".parse::<ImageRef>().unwrap().to_string(),
            "oci:dir:v1"
        );
    }

    #[test]
    fn a_name_with_slashes_in_an_existing_layout_splits_at_the_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("sto:re");
        std::fs::create_dir(&store).unwrap();
        std::fs::write(store.join("oci-layout"), "{}").unwrap();
        let arg = format!("oci:{}:functions/hello", store.display());
        assert_eq!(
            layout(&arg),
            (store.clone(), Selector::Name("functions/hello".into()))
        );
        // Not a layout (yet): the old rule.
        let other = tmp.path().join("out");
        assert_eq!(
            layout(&format!("oci:{}:functions/hello", other.display())),
            (
                format!("{}:functions/hello", other.display()).into(),
                Selector::Only
            )
        );
    }

    #[test]
    fn malformed_arguments_are_errors() {
        assert!(matches!(
            "oci:".parse::<ImageRef>(),
            Err(Error::NoDirectory(_))
        ));
        assert!(matches!(
            "oci:dir@sha256:zz".parse::<ImageRef>(),
            Err(Error::Digest { .. })
        ));
        assert!(matches!(
            "UPPER/Case".parse::<ImageRef>(),
            Err(Error::Registry(_))
        ));
    }
}
