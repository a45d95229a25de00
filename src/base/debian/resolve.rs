//! The dependency closure of a set of root packages over `Depends` and `Pre-Depends`
//! (Recommends ignored), the way a minimal image wants it: for each group, keep what already
//! satisfies it, else take the first alternative that exists as a real package with a fitting
//! version, else the first provider of a virtual name. Deterministic: breadth-first from the
//! roots in order, providers in name order. Pure; no scoring, no conflicts, no scripts.

use std::collections::{BTreeMap, VecDeque};

use tracing::debug;

use super::packages::{LockedPackage, Package, PackageIndex};
use super::relation::{Group, Relation};
use super::{Error, Result};

/// The packages selected so far, and who pulled each in (for error chains).
struct Selection<'a> {
    index: &'a PackageIndex,
    selected: BTreeMap<&'a str, &'a Package>,
    parent: BTreeMap<&'a str, &'a str>,
    exclude: &'a [String],
}

impl<'a> Selection<'a> {
    /// Whether a selected package (or a selected package's Provides) satisfies `relation`.
    fn satisfies(&self, relation: &Relation) -> bool {
        if let Some(package) = self.selected.get(relation.name.as_str())
            && relation.accepts(Some(&package.version))
        {
            return true;
        }
        self.index.providers(&relation.name).iter().any(|provider| {
            self.selected.contains_key(provider.package.as_str())
                && relation.accepts(provider.version.as_ref())
        })
    }

    /// The package to select for `group`: the first real alternative with a fitting version,
    /// else the first provider (in name order) of the first alternative that has one.
    fn choose(&self, group: &Group) -> Option<&'a Package> {
        let real = group.0.iter().find_map(|relation| {
            let package = self.index.get(&relation.name)?;
            relation.accepts(Some(&package.version)).then_some(package)
        });
        real.or_else(|| {
            group.0.iter().find_map(|relation| {
                let provider = self.index.providers(&relation.name).iter().find(|p| {
                    relation.accepts(p.version.as_ref()) && !self.is_excluded(&p.package)
                })?;
                self.index.get(&provider.package)
            })
        })
    }

    fn is_excluded(&self, name: &str) -> bool {
        self.exclude.iter().any(|e| e == name)
    }

    /// The chain of packages from a root down to `name`.
    fn chain(&self, name: &'a str) -> Vec<String> {
        let mut chain = vec![name.to_string()];
        let mut current = name;
        while let Some(parent) = self.parent.get(current) {
            chain.push(parent.to_string());
            current = parent;
        }
        chain.reverse();
        chain
    }

    fn select(
        &mut self,
        package: &'a Package,
        parent: Option<&'a str>,
        queue: &mut VecDeque<&'a Package>,
    ) {
        if self.selected.insert(&package.name, package).is_none() {
            if let Some(parent) = parent {
                self.parent.insert(&package.name, parent);
            }
            queue.push_back(package);
        }
    }
}

impl PackageIndex {
    /// The closure of `roots` under Depends and Pre-Depends, sorted by name. A dependency group
    /// naming an `exclude`d package is taken as satisfied (the caller supplies or omits it);
    /// excluded roots are dropped.
    ///
    /// # Errors
    /// [`Error::UnknownPackage`] for a root that is neither a package nor provided, and
    /// [`Error::Unsatisfiable`] with the chain of packages that needed an unsatisfiable group.
    pub fn resolve(&self, roots: &[String], exclude: &[String]) -> Result<Vec<LockedPackage>> {
        let mut selection = Selection {
            index: self,
            selected: BTreeMap::new(),
            parent: BTreeMap::new(),
            exclude,
        };
        let mut queue = VecDeque::new();
        for root in roots.iter().filter(|r| !exclude.contains(r)) {
            let group = Group(vec![Relation {
                name: root.clone(),
                constraint: None,
            }]);
            let package = selection
                .choose(&group)
                .ok_or_else(|| Error::UnknownPackage { name: root.clone() })?;
            selection.select(package, None, &mut queue);
        }
        while let Some(package) = queue.pop_front() {
            for group in &package.depends {
                let excluded = group.0.iter().any(|r| selection.is_excluded(&r.name));
                if excluded || group.0.iter().any(|r| selection.satisfies(r)) {
                    continue;
                }
                let Some(choice) = selection.choose(group) else {
                    return Err(Error::Unsatisfiable {
                        dependency: group.to_string(),
                        chain: selection.chain(&package.name),
                    });
                };
                debug!(
                    package = %package.name,
                    dependency = %group,
                    chose = %choice.name,
                    "resolved",
                );
                selection.select(choice, Some(&package.name), &mut queue);
            }
        }
        Ok(selection
            .selected
            .values()
            .map(|p| LockedPackage::from(*p))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(stanzas: &[(&str, &str, &str)]) -> PackageIndex {
        let sha = "0".repeat(64);
        let text: String = stanzas
            .iter()
            .map(|(name, version, extra)| {
                format!(
                    "Package: {name}\nVersion: {version}\nArchitecture: amd64\n{extra}\
                     Filename: pool/{name}.deb\nSize: 1\nSHA256: {sha}\n\n"
                )
            })
            .collect();
        PackageIndex::parse(&text).unwrap()
    }

    fn names(locked: &[LockedPackage]) -> Vec<&str> {
        locked.iter().map(|p| p.name.as_str()).collect()
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn synthetic() -> PackageIndex {
        index(&[
            (
                "app",
                "1.0",
                "Depends: libc6 (>= 2.38), media-types | mime-support, mta\n",
            ),
            ("libc6", "2.41-12", "Depends: libgcc-s1\n"),
            ("libgcc-s1", "14.2.0-19", ""),
            ("media-types", "13.0.0", ""),
            ("mime-support", "3.66", ""),
            ("postfix", "3.10", "Provides: mta\nDepends: dpkg\n"),
            ("exim4", "4.98", "Provides: mta\n"),
            ("dpkg", "1.22", "Depends: tar\n"),
            ("tar", "1.35", ""),
            ("old", "1.0", "Depends: libc6 (>= 3)\n"),
            ("uses-virtual", "1.0", "Depends: libssl3 (>= 3.0)\n"),
            ("libssl3t64", "3.5.1-1", "Provides: libssl3 (= 3.5.1-1)\n"),
            ("unversioned-need", "1.0", "Depends: mta (>= 1)\n"),
        ])
    }

    #[test]
    fn first_real_alternative_and_first_provider_are_chosen() {
        let locked = synthetic().resolve(&strings(&["app"]), &[]).unwrap();
        // exim4 sorts before postfix, so it provides `mta`; media-types is the first real
        // alternative.
        assert_eq!(
            names(&locked),
            ["app", "exim4", "libc6", "libgcc-s1", "media-types"]
        );
    }

    #[test]
    fn an_already_selected_alternative_or_provider_satisfies_a_group() {
        let locked = synthetic().resolve(&strings(&["mime-support", "postfix", "app"]), &[]);
        let names_ = names(locked.as_ref().unwrap()).join(" ");
        assert_eq!(names_, "app dpkg libc6 libgcc-s1 mime-support postfix tar");
    }

    #[test]
    fn versioned_virtual_dependencies_use_versioned_provides() {
        let locked = synthetic()
            .resolve(&strings(&["uses-virtual"]), &[])
            .unwrap();
        assert_eq!(names(&locked), ["libssl3t64", "uses-virtual"]);
        let err = synthetic()
            .resolve(&strings(&["unversioned-need"]), &[])
            .unwrap_err();
        assert!(matches!(err, Error::Unsatisfiable { .. }), "{err}");
    }

    #[test]
    fn excluded_packages_and_their_dependencies_are_left_out() {
        let exclude = strings(&["dpkg"]);
        let locked = synthetic()
            .resolve(&strings(&["postfix", "dpkg"]), &exclude)
            .unwrap();
        assert_eq!(names(&locked), ["postfix"]);
        let exclude = strings(&["exim4"]);
        let locked = synthetic().resolve(&strings(&["app"]), &exclude).unwrap();
        assert_eq!(
            names(&locked),
            [
                "app",
                "dpkg",
                "libc6",
                "libgcc-s1",
                "media-types",
                "postfix",
                "tar"
            ]
        );
    }

    #[test]
    fn an_unsatisfiable_dependency_names_the_chain() {
        let index = index(&[
            ("top", "1", "Depends: middle\n"),
            ("middle", "1", "Depends: old\n"),
            ("old", "1.0", "Depends: libc6 (>= 3) | libc7\n"),
            ("libc6", "2.41-12", ""),
        ]);
        let err = index.resolve(&strings(&["top"]), &[]).unwrap_err();
        let Error::Unsatisfiable { dependency, chain } = &err else {
            panic!("unexpected {err}");
        };
        assert_eq!(dependency, "libc6 (>= 3) | libc7");
        assert_eq!(chain, &["top", "middle", "old"]);
        assert_eq!(
            err.to_string(),
            "no package satisfies \"libc6 (>= 3) | libc7\", needed by top -> middle -> old"
        );
        let err = index.resolve(&strings(&["nonexistent"]), &[]).unwrap_err();
        assert!(matches!(err, Error::UnknownPackage { name } if name == "nonexistent"));
    }
}
