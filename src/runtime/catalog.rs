//! The embedded runtime catalog: every `runtimes/*/runtime.toml` compiled into the binary.

use super::RuntimeSpec;
use super::alias::Alias;
// The files compiled in (build.rs lists the folders).
use super::table::RUNTIMES as EMBEDDED;

/// The raw text of an embedded runtime file.
#[cfg(test)]
pub(crate) fn embedded_text(name: &str) -> Option<&'static str> {
    EMBEDDED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// A set of runtimes, looked up by name.
#[derive(Clone, Debug)]
pub struct Catalog {
    runtimes: Vec<RuntimeSpec>,
}

/// The error for a runtime name the catalog does not know.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown runtime {name:?}{}; known runtimes: {}",
    self.suggestion().map(|s| format!(" (did you mean {s}?)")).unwrap_or_default(),
    known.join(", ")
)]
pub struct UnknownRuntime {
    /// The name asked for.
    pub name: String,
    /// The names known.
    pub known: Vec<String>,
}

impl UnknownRuntime {
    /// The known name nearest to the one asked for, when one is near enough to be a typo (by
    /// Jaro-Winkler similarity, as clap suggests flags).
    pub fn suggestion(&self) -> Option<&str> {
        self.known
            .iter()
            // An alias is listed as `kyma (as kiln)`: suggest the name one types.
            .map(|k| k.split(' ').next().unwrap_or(k))
            .map(|k| (strsim::jaro_winkler(&self.name, k), k))
            .filter(|(score, _)| *score > 0.8)
            // The first of equals: kiln's own runtimes come before Kyma's names.
            .fold(None, |best: Option<(f64, &str)>, (score, k)| match best {
                Some((top, _)) if top >= score => best,
                _ => Some((score, k)),
            })
            .map(|(_, k)| k)
    }
}

impl Catalog {
    /// The runtimes compiled into this binary.
    pub fn embedded() -> Catalog {
        let runtimes = EMBEDDED
            .iter()
            .map(|(name, text)| {
                // The files are part of the source tree and checked by the tests below, so a
                // malformed one is a build defect, not a user error.
                RuntimeSpec::parse(name, text).expect("embedded runtime files are valid")
            })
            .collect();
        Catalog { runtimes }
    }

    /// The runtime called `name`.
    ///
    /// # Errors
    /// [`UnknownRuntime`], listing the known names.
    pub fn get(&self, name: &str) -> Result<&RuntimeSpec, UnknownRuntime> {
        self.runtimes
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| UnknownRuntime {
                name: name.to_string(),
                known: self.names(),
            })
    }

    /// The runtime for a manifest's `runtime` name: a kiln runtime, or one of Kyma's names
    /// mapped to the nearest kiln runtime (then the [`Alias`] used is returned too, for the
    /// warning). A real runtime wins over an alias of the same name, so adding
    /// `runtimes/python314` builds 3.14, whatever the alias table still says.
    ///
    /// # Errors
    /// [`UnknownRuntime`] for a name that is neither.
    pub fn resolve(&self, name: &str) -> Result<(&RuntimeSpec, Option<Alias>), UnknownRuntime> {
        if let Some(runtime) = self.runtimes.iter().find(|r| r.name == name) {
            return Ok((runtime, None));
        }
        match super::alias::lookup(name) {
            Some(alias) => Ok((self.get(alias.kiln)?, Some(alias))),
            None => self.get(name).map(|r| (r, None)).map_err(|mut e| {
                e.known.extend(
                    super::alias::ALIASES
                        .iter()
                        .map(|a| format!("{} (as {})", a.kyma, a.kiln)),
                );
                e
            }),
        }
    }

    /// Every runtime name, in catalog order.
    pub fn names(&self) -> Vec<String> {
        self.runtimes.iter().map(|r| r.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_runtime_parses() {
        for (name, text) in EMBEDDED {
            RuntimeSpec::parse(name, text).unwrap();
        }
        assert_eq!(
            Catalog::embedded().names(),
            ["nodejs22", "nodejs24", "nodejs26", "python313", "python314"]
        );
    }

    #[test]
    fn kyma_names_resolve_to_the_nearest_kiln_runtime() {
        let catalog = Catalog::embedded();
        let (spec, alias) = catalog.resolve("python312").unwrap();
        assert_eq!(
            (spec.name.as_str(), alias.map(|a| a.kyma)),
            ("python313", Some("python312"))
        );
        let (spec, alias) = catalog.resolve("nodejs24").unwrap();
        assert_eq!((spec.name.as_str(), alias), ("nodejs24", None));
        let err = catalog.resolve("ruby3").unwrap_err().to_string();
        assert!(err.contains("nodejs20 (as nodejs22)"), "{err}");
    }

    #[test]
    fn python314_is_a_real_runtime_not_an_alias() {
        // It was an alias of python313 until runtimes/python314 existed.
        let catalog = Catalog::embedded();
        let (spec, alias) = catalog.resolve("python314").unwrap();
        assert_eq!(
            (spec.name.as_str(), spec.description.as_str(), alias),
            ("python314", "CPython 3.14", None)
        );
        let (spec, alias) = catalog.resolve("python312").unwrap();
        assert_eq!((spec.name.as_str(), alias.is_some()), ("python313", true));
    }

    #[test]
    fn a_misspelt_runtime_is_answered_with_the_nearest_name() {
        let catalog = Catalog::embedded();
        let err = catalog.resolve("nodejs2").unwrap_err();
        assert_eq!(err.suggestion(), Some("nodejs22"), "{err}");
        assert!(
            err.to_string().contains("(did you mean nodejs22?)"),
            "{err}"
        );
        let err = catalog.resolve("pyton313").unwrap_err();
        assert_eq!(err.suggestion(), Some("python313"), "{err}");
        // A Kyma name is suggested as it is typed, not as it is listed.
        let err = catalog.resolve("nodejs2O").unwrap_err();
        assert!(
            err.suggestion().is_some_and(|s| s.starts_with("nodejs2")),
            "{err}"
        );
        assert_eq!(catalog.resolve("ruby3").unwrap_err().suggestion(), None);
    }

    #[test]
    fn an_unknown_runtime_error_lists_the_known_ones() {
        let err = Catalog::embedded().get("ruby3").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown runtime \"ruby3\"; known runtimes: nodejs22, nodejs24, nodejs26, python313, \
             python314"
        );
    }
}
