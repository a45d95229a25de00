//! Authorization scopes: [`Scope`] (`repository:team/app:pull,push`), one access a request
//! needs, and [`ScopeSet`], the union a token carries, merged per resource. It names no other
//! file of the registry client: requests, sessions and tokens build on it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One access request: `type:name:actions`, e.g. `repository:team/app:pull,push`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    resource_type: String,
    name: String,
    actions: BTreeSet<String>,
}

impl Scope {
    /// Pull access to `repository` (the path inside the registry, without host).
    pub fn pull(repository: &str) -> Scope {
        Scope::repository(repository, &["pull"])
    }

    /// Push access to `repository`, which includes pull (needed for HEAD and mounts).
    pub fn push(repository: &str) -> Scope {
        Scope::repository(repository, &["pull", "push"])
    }

    fn repository(name: &str, actions: &[&str]) -> Scope {
        Scope {
            resource_type: "repository".into(),
            name: name.into(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// Parses `type:name:action[,action…]` as found in a challenge's `scope`.
    pub fn parse(s: &str) -> Option<Scope> {
        let (resource_type, rest) = s.split_once(':')?;
        let (name, actions) = rest.rsplit_once(':')?;
        if resource_type.is_empty() || name.is_empty() {
            return None;
        }
        let actions: BTreeSet<String> = actions
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect();
        Some(Scope {
            resource_type: resource_type.into(),
            name: name.into(),
            actions,
        })
    }

    /// The resource name (the repository for repository scopes).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this is a repository's `pull` and/or `push`, nothing more.
    pub fn is_plain_repository_access(&self) -> bool {
        self.resource_type == "repository"
            && !self.actions.is_empty()
            && self.actions.iter().all(|a| a == "pull" || a == "push")
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let actions: Vec<&str> = self.actions.iter().map(String::as_str).collect();
        write!(
            f,
            "{}:{}:{}",
            self.resource_type,
            self.name,
            actions.join(",")
        )
    }
}

/// The union of scopes granted or wanted, merged per resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ScopeSet(BTreeMap<(String, String), BTreeSet<String>>);

impl ScopeSet {
    /// Adds a scope, merging its actions into an existing entry for the same resource.
    pub fn insert(&mut self, scope: &Scope) {
        let key = (scope.resource_type.clone(), scope.name.clone());
        self.0
            .entry(key)
            .or_default()
            .extend(scope.actions.iter().cloned());
    }

    /// Whether every action of `scope` is in the set (or the resource has `*`).
    pub fn covers(&self, scope: &Scope) -> bool {
        let key = (scope.resource_type.clone(), scope.name.clone());
        self.0
            .get(&key)
            .is_some_and(|have| have.contains("*") || scope.actions.is_subset(have))
    }

    /// Whether every scope is covered.
    pub fn covers_all(&self, scopes: &[Scope]) -> bool {
        scopes.iter().all(|s| self.covers(s))
    }

    /// One `type:name:actions` string per resource, in a stable order.
    pub fn to_strings(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|((t, n), a)| {
                let actions: Vec<&str> = a.iter().map(String::as_str).collect();
                format!("{t}:{n}:{}", actions.join(","))
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_a_repositorys_pull_and_push_are_plain_access() {
        for plain in ["repository:a/b:pull", "repository:a/b:pull,push"] {
            assert!(
                Scope::parse(plain).unwrap().is_plain_repository_access(),
                "{plain}"
            );
        }
        for broad in [
            "repository:a/b:*",
            "repository:a/b:delete",
            "registry:catalog:*",
        ] {
            assert!(
                !Scope::parse(broad).unwrap().is_plain_repository_access(),
                "{broad}"
            );
        }
    }

    #[test]
    fn scopes_render_and_parse() {
        assert_eq!(Scope::pull("a/b").to_string(), "repository:a/b:pull");
        assert_eq!(Scope::push("a").to_string(), "repository:a:pull,push");
        let s = Scope::parse("repository:team/app:push,pull").unwrap();
        assert_eq!(s, Scope::push("team/app"));
        assert_eq!(
            Scope::parse("registry:catalog:*").unwrap().name(),
            "catalog"
        );
        assert!(Scope::parse("nocolons").is_none());
        assert!(Scope::parse(":x:pull").is_none());
    }

    #[test]
    fn scope_sets_merge_per_resource_and_check_coverage() {
        let mut set = ScopeSet::default();
        set.insert(&Scope::pull("target"));
        assert!(!set.covers(&Scope::push("target")));
        set.insert(&Scope::push("target"));
        set.insert(&Scope::pull("source"));
        assert!(set.covers_all(&[
            Scope::push("target"),
            Scope::pull("source"),
            Scope::pull("target")
        ]));
        assert!(!set.covers(&Scope::pull("other")));
        assert_eq!(
            set.to_strings(),
            ["repository:source:pull", "repository:target:pull,push"]
        );
        set.insert(&Scope::parse("repository:any:*").unwrap());
        assert!(set.covers(&Scope::push("any")));
    }
}
