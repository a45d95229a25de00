//! Kyma's runtime names that kiln has no runtime of its own for, each mapped to the nearest
//! kiln runtime: the one table `kiln build` and the controller both use, so manifests written
//! for Kyma apply unchanged (with a warning naming the substitution).

/// A Kyma runtime name and the kiln runtime that stands in for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alias {
    /// The name a manifest uses.
    pub kyma: &'static str,
    /// The kiln runtime that builds it.
    pub kiln: &'static str,
}

/// Kyma's runtime names, current and recently removed, that are not kiln runtimes. Same
/// language, nearest major version: the Function's code and dependency manifest carry over.
pub const ALIASES: &[Alias] = &[
    Alias {
        kyma: "nodejs18",
        kiln: "nodejs22",
    },
    Alias {
        kyma: "nodejs20",
        kiln: "nodejs22",
    },
    Alias {
        kyma: "python39",
        kiln: "python313",
    },
    Alias {
        kyma: "python312",
        kiln: "python313",
    },
];

/// The alias for `name`, if it is one of Kyma's names kiln maps.
pub fn lookup(name: &str) -> Option<Alias> {
    ALIASES.iter().copied().find(|a| a.kyma == name)
}

impl Alias {
    /// The warning shown when a manifest uses this name, with the version `catalog` builds.
    pub fn warning(&self, catalog: &super::Catalog) -> String {
        let what = catalog
            .get(self.kiln)
            .map(|r| format!(" ({})", r.description))
            .unwrap_or_default();
        format!(
            "runtime {} is built as {}{what}: kiln has no {} runtime; set spec.runtime: {} to \
                silence this",
            self.kyma, self.kiln, self.kyma, self.kiln
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Catalog;

    #[test]
    fn every_alias_names_a_kiln_runtime_of_the_same_language_and_no_kiln_name_is_an_alias() {
        let catalog = Catalog::embedded();
        for alias in ALIASES {
            let target = catalog.get(alias.kiln).expect("alias target exists");
            let family = alias.kyma.trim_end_matches(|c: char| c.is_ascii_digit());
            assert!(target.name.starts_with(family), "{alias:?}");
            assert!(
                catalog.get(alias.kyma).is_err(),
                "{alias:?} shadows a runtime"
            );
        }
        assert_eq!(lookup("nodejs20").map(|a| a.kiln), Some("nodejs22"));
        assert_eq!(lookup("python312").map(|a| a.kiln), Some("python313"));
        assert_eq!(lookup("nodejs22"), None);
        // The warning says which version really runs.
        assert_eq!(
            lookup("python312").unwrap().warning(&catalog),
            "runtime python312 is built as python313 (CPython 3.13): kiln has no python312 \
                runtime; set spec.runtime: python313 to silence this"
        );
    }
}
