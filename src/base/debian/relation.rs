//! Package relationship fields (`Depends`, `Pre-Depends`, `Provides`): comma-separated groups of
//! `|`-separated alternatives, each a name with an optional version constraint. Architecture
//! qualifiers (`python3:any`) and restriction lists are stripped: one architecture is resolved.
//! Spec: <https://www.debian.org/doc/debian-policy/ch-relationships.html>.

use std::fmt;

use super::version::Version;

/// A version comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<<`
    Lt,
    /// `<=` (and the obsolete `<`)
    Le,
    /// `=`
    Eq,
    /// `>=` (and the obsolete `>`)
    Ge,
    /// `>>`
    Gt,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "<<" => Op::Lt,
            "<=" | "<" => Op::Le,
            "=" => Op::Eq,
            ">=" | ">" => Op::Ge,
            ">>" => Op::Gt,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<<",
            Op::Le => "<=",
            Op::Eq => "=",
            Op::Ge => ">=",
            Op::Gt => ">>",
        }
    }
}

/// One alternative: a package name and an optional version constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Package (or virtual package) name, without architecture qualifier.
    pub name: String,
    /// The version constraint, if any.
    pub constraint: Option<(Op, Version)>,
}

impl Relation {
    /// Whether a package or provide of this relation's name with `version` satisfies it.
    /// `None` is an unversioned Provides, which satisfies only an unversioned relation.
    pub fn accepts(&self, version: Option<&Version>) -> bool {
        let Some((op, wanted)) = &self.constraint else {
            return true;
        };
        let Some(have) = version else {
            return false;
        };
        let ord = have.cmp(wanted);
        match op {
            Op::Lt => ord.is_lt(),
            Op::Le => ord.is_le(),
            Op::Eq => ord.is_eq(),
            Op::Ge => ord.is_ge(),
            Op::Gt => ord.is_gt(),
        }
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.constraint {
            Some((op, version)) => write!(f, "{} ({} {version})", self.name, op.as_str()),
            None => f.write_str(&self.name),
        }
    }
}

/// A group of alternatives; any one satisfies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group(pub Vec<Relation>);

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, relation) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            write!(f, "{relation}")?;
        }
        Ok(())
    }
}

/// Parses a relationship field; `None` when any part is malformed.
pub fn parse_relations(field: &str) -> Option<Vec<Group>> {
    field
        .split(',')
        .map(str::trim)
        .filter(|group| !group.is_empty())
        .map(|group| {
            group
                .split('|')
                .map(parse_relation)
                .collect::<Option<_>>()
                .map(Group)
        })
        .collect()
}

fn parse_relation(text: &str) -> Option<Relation> {
    // Drop build-profile (`<…>`) and architecture (`[…]`) restrictions: they only appear in
    // source stanzas, but cost nothing to tolerate.
    let mut depth = 0;
    let end = text
        .char_indices()
        .find(|&(_, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            depth == 0 && matches!(c, '[' | '<')
        })
        .map_or(text.len(), |(i, _)| i);
    let text = text[..end].trim();
    let (name, constraint) = match text.split_once('(') {
        Some((name, rest)) => (name.trim(), Some(rest.strip_suffix(')')?.trim())),
        None => (text, None),
    };
    let name = name.split(':').next()?.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let constraint = match constraint {
        Some(c) => {
            let split = c
                .find(|ch| !matches!(ch, '<' | '>' | '='))
                .unwrap_or(c.len());
            let op = Op::parse(&c[..split])?;
            Some((op, c[split..].trim().parse().ok()?))
        }
        None => None,
    };
    Some(Relation {
        name: name.to_string(),
        constraint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_alternatives_constraints_and_qualifiers_are_parsed() {
        let groups = parse_relations(
            "libc6 (>= 2.38), media-types | mime-support, python3:any (>>3.1~), \
                             0ad-data (<= 0.27.0-2), foo [amd64] <!nocheck>",
        )
        .unwrap();
        assert_eq!(groups.len(), 5);
        assert_eq!(groups[3].to_string(), "0ad-data (<= 0.27.0-2)");
        assert_eq!(groups[4].to_string(), "foo");
        assert_eq!(groups[0].0[0].name, "libc6");
        assert_eq!(groups[0].0[0].constraint.as_ref().unwrap().0, Op::Ge);
        assert_eq!(groups[1].0.len(), 2);
        assert_eq!(groups[2].0[0].name, "python3");
        assert_eq!(groups[2].to_string(), "python3 (>> 3.1~)");
        assert_eq!(groups[1].to_string(), "media-types | mime-support");
        assert_eq!(parse_relations("").unwrap().len(), 0);
    }

    #[test]
    fn malformed_relations_are_rejected() {
        for bad in ["a (>= )", "a (~ 1)", "a (>= 1", "| b", "a b"] {
            assert_eq!(parse_relations(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn constraints_accept_matching_versions_only() {
        let v = |s: &str| s.parse::<Version>().unwrap();
        let rel = &parse_relations("zlib1g (>= 1:1.2.0)").unwrap()[0].0[0];
        assert!(rel.accepts(Some(&v("1:1.3.dfsg-3"))));
        assert!(!rel.accepts(Some(&v("1.2.0"))));
        assert!(
            !rel.accepts(None),
            "an unversioned provide never satisfies a versioned relation"
        );
        let exact = &parse_relations("a (= 1.0-1)").unwrap()[0].0[0];
        assert!(exact.accepts(Some(&v("1.0-1"))) && !exact.accepts(Some(&v("1.0-2"))));
        let plain = &parse_relations("a").unwrap()[0].0[0];
        assert!(plain.accepts(None));
    }
}
