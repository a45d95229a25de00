//! Provisional: the checks the controller needs before planning (runtime, one source). The
//! full validator replaces this file.

use super::crd::Function;
use crate::runtime::Catalog;

/// Errors and warnings about a Function.
#[derive(Debug, Default)]
pub struct Verdict {
    /// What must change.
    pub errors: Vec<String>,
    /// What may stay but should change.
    pub warnings: Vec<String>,
}

/// Checks `f`.
pub fn validate(f: &Function, catalog: &Catalog) -> Verdict {
    let mut v = Verdict::default();
    match catalog.resolve(&f.spec.runtime) {
        Ok((_, Some(alias))) => v.warnings.push(alias.warning()),
        Ok(_) => {}
        Err(e) => v.errors.push(format!("spec.runtime: {e}")),
    }
    let s = &f.spec.source;
    if s.inline.is_some() == s.git_repository.is_some() {
        v.errors
            .push("spec.source: needs exactly one of inline and gitRepository".into());
    }
    v
}
