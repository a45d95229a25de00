//! How failures are worded: the `reason (detail)` result of a check and the formatting helpers
//! that reproduce upstream's quoting (`%q`, `joinQuote`), pluralization and sorting.

use std::collections::BTreeSet;

/// One failed check: upstream's `CheckResult` with `Allowed == false`.
pub(super) struct Violation {
    reason: String,
    detail: String,
}

impl Violation {
    pub(super) fn new(reason: impl Into<String>, detail: impl Into<String>) -> Option<Violation> {
        Some(Violation {
            reason: reason.into(),
            detail: detail.into(),
        })
    }

    /// One item of `AggregateCheckResult.ForbiddenDetail()`.
    pub(super) fn render(self) -> String {
        if self.detail.is_empty() {
            self.reason
        } else {
            format!("{} ({})", self.reason, self.detail)
        }
    }
}

/// Go's `%q` for a string, close enough for label and annotation values: quotes, backslashes and
/// control characters are escaped, other characters are kept.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Upstream `joinQuote`: wraps without escaping.
pub(super) fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let parts: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    format!("\"{}\"", parts.join("\", \""))
}

pub(super) fn pluralize<'s>(singular: &'s str, plural: &'s str, count: usize) -> &'s str {
    if count == 1 { singular } else { plural }
}

/// `container "a"` / `containers "a", "b"`.
pub(super) fn containers_phrase(names: &[&str]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

pub(super) fn sorted(set: BTreeSet<&str>) -> Vec<&str> {
    set.into_iter().collect()
}
