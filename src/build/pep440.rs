//! What a pinned-requirements install ([`super::pinned`]) must decide as pip does: PEP 440
//! versions and specifiers, PEP 508 dependency lines and their environment markers. Only as
//! much as the decision needs: whatever this does not understand is an `Err` (a reason),
//! and then pip runs instead of kiln, so a gap costs speed, never a wrong install.

use std::cmp::Ordering;

/// A PEP 440 version.
#[derive(Clone, Debug)]
pub struct Version {
    epoch: u64,
    release: Vec<u64>,
    /// `a`, `b` or `rc` and its number.
    pre: Option<(u8, u64)>,
    post: Option<u64>,
    dev: Option<u64>,
    /// Lower-cased segments after `+`.
    local: Vec<String>,
}

impl Version {
    /// Parses `text` in PEP 440's normalized or accepted forms.
    ///
    /// One piece on purpose: it reads the text left to right once, segment after segment
    /// (epoch, release, pre, post, dev, local) in the order PEP 440's grammar gives them, and
    /// each step consumes what the one before left; split up, the steps would pass the
    /// remaining text and the half-built version back and forth.
    ///
    /// # Errors
    /// Text that is no PEP 440 version.
    pub fn parse(text: &str) -> Result<Version, String> {
        let bad = || format!("{text:?} is not a PEP 440 version");
        let lower = text.trim().to_ascii_lowercase();
        let s = lower.strip_prefix('v').unwrap_or(&lower);
        let (public, local) = match s.split_once('+') {
            Some((p, l)) => (p, Some(l)),
            None => (s, None),
        };
        let (epoch, rest) = match public.split_once('!') {
            Some((e, r)) => (e.parse().map_err(|_| bad())?, r),
            None => (0, public),
        };
        let bytes = rest.as_bytes();
        let mut release = Vec::new();
        let mut end = 0;
        loop {
            let start = end;
            while bytes.get(end).is_some_and(u8::is_ascii_digit) {
                end += 1;
            }
            if start == end {
                return Err(bad());
            }
            release.push(rest[start..end].parse().map_err(|_| bad())?);
            if bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) {
                end += 1;
            } else {
                break;
            }
        }
        let mut tail = &rest[end..];
        // PEP 440's normalisation allows one separator before each part and its number.
        fn one_separator(t: &str) -> &str {
            t.strip_prefix(['.', '-', '_']).unwrap_or(t)
        }
        let take_number = |tail: &mut &str| -> u64 {
            let t = tail.strip_prefix(['.', '-', '_']).unwrap_or(tail);
            let digits = t.chars().take_while(char::is_ascii_digit).count();
            let n = t[..digits].parse().unwrap_or(0);
            *tail = &t[digits..];
            n
        };
        let mut pre = None;
        let t = one_separator(tail);
        for (word, kind) in [
            ("alpha", 0),
            ("beta", 1),
            ("preview", 2),
            ("pre", 2),
            ("rc", 2),
            ("a", 0),
            ("b", 1),
            ("c", 2),
        ] {
            if let Some(after) = t.strip_prefix(word) {
                tail = after;
                pre = Some((kind, take_number(&mut tail)));
                break;
            }
        }
        let mut post = None;
        let t = one_separator(tail);
        for word in ["post", "rev", "r"] {
            if let Some(after) = t.strip_prefix(word) {
                tail = after;
                post = Some(take_number(&mut tail));
                break;
            }
        }
        if post.is_none()
            && let Some(after) = tail.strip_prefix('-')
            && after.starts_with(|c: char| c.is_ascii_digit())
        {
            tail = after;
            post = Some(take_number(&mut tail));
        }
        let mut dev = None;
        let t = one_separator(tail);
        if let Some(after) = t.strip_prefix("dev") {
            tail = after;
            dev = Some(take_number(&mut tail));
        }
        if !tail.is_empty() {
            return Err(bad());
        }
        let local = match local {
            Some("") => return Err(bad()),
            Some(l)
                if !l
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)) =>
            {
                return Err(bad());
            }
            Some(l) => l.split(['.', '-', '_']).map(str::to_string).collect(),
            None => Vec::new(),
        };
        Ok(Version {
            epoch,
            release,
            pre,
            post,
            dev,
            local,
        })
    }

    fn is_prerelease(&self) -> bool {
        self.pre.is_some() || self.dev.is_some()
    }

    /// The version without its local part.
    fn public(&self) -> Version {
        Version {
            local: Vec::new(),
            ..self.clone()
        }
    }

    /// Epoch and release only (`1.2.post1` → `1.2`).
    fn base(&self) -> Version {
        Version {
            epoch: self.epoch,
            release: self.release.clone(),
            pre: None,
            post: None,
            dev: None,
            local: Vec::new(),
        }
    }

    /// The release padded with zeros to `n` segments.
    fn release_padded(&self, n: usize) -> Vec<u64> {
        let mut r = self.release.clone();
        r.resize(n.max(r.len()), 0);
        r
    }
}

/// `packaging`'s order: a dev release of a final release before its pre-releases, and a
/// missing post-release before any.
fn order(a: &Version, b: &Version) -> Ordering {
    let trimmed = |v: &Version| {
        let mut r = v.release.clone();
        while r.len() > 1 && r.last() == Some(&0) {
            r.pop();
        }
        r
    };
    // (kind, number): dev-only below every pre-release, a final release above them.
    let pre = |v: &Version| match (v.pre, v.post, v.dev) {
        (None, None, Some(_)) => (-1i8, 0u64),
        (None, _, _) => (3, 0),
        (Some((k, n)), _, _) => (k as i8, n),
    };
    let post = |v: &Version| v.post.map_or(-1i128, i128::from);
    let dev = |v: &Version| v.dev.map_or(i128::MAX, i128::from);
    let local = |v: &Version| -> Vec<(i128, String)> {
        v.local
            .iter()
            .map(|s| match s.parse::<u64>() {
                Ok(n) => (i128::from(n), String::new()),
                Err(_) => (-1, s.clone()),
            })
            .collect()
    };
    a.epoch
        .cmp(&b.epoch)
        .then_with(|| trimmed(a).cmp(&trimmed(b)))
        .then_with(|| pre(a).cmp(&pre(b)))
        .then_with(|| post(a).cmp(&post(b)))
        .then_with(|| dev(a).cmp(&dev(b)))
        .then_with(|| match (a.local.is_empty(), b.local.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            (false, false) => local(a).cmp(&local(b)),
        })
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        order(self, other) == Ordering::Equal
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(order(self, other))
    }
}

/// Whether `version` meets every clause of the comma-separated `specifiers` (empty: any), as
/// `packaging` decides with pre-releases allowed (pip's resolver checks a candidate so).
///
/// # Errors
/// A clause this does not understand (`===`, a `.*` after a pre-release).
pub fn satisfies(version: &Version, specifiers: &str) -> Result<bool, String> {
    for clause in specifiers
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
    {
        if !clause_holds(version, clause)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn clause_holds(v: &Version, clause: &str) -> Result<bool, String> {
    let op_len = clause
        .find(|c: char| !matches!(c, '<' | '>' | '=' | '!' | '~'))
        .unwrap_or(clause.len());
    let (op, text) = (&clause[..op_len], clause[op_len..].trim());
    if let Some(prefix) = text.strip_suffix(".*") {
        let p = Version::parse(prefix)?;
        if p.pre.is_some() || p.post.is_some() || p.dev.is_some() || !p.local.is_empty() {
            return Err(format!("the specifier {clause:?}"));
        }
        let n = p.release.len();
        let matches = v.epoch == p.epoch && v.release_padded(n)[..n] == p.release[..];
        return match op {
            "==" => Ok(matches),
            "!=" => Ok(!matches),
            _ => Err(format!("the specifier {clause:?}")),
        };
    }
    let s = Version::parse(text)?;
    let candidate = if s.local.is_empty() {
        v.public()
    } else {
        v.clone()
    };
    Ok(match op {
        "==" => candidate == s,
        "!=" => candidate != s,
        "<=" => v.public() <= s,
        ">=" => v.public() >= s,
        "<" => *v < s && !(!s.is_prerelease() && v.is_prerelease() && v.base() == s.base()),
        ">" => {
            *v > s
                && !(s.post.is_none() && v.post.is_some() && v.base() == s.base())
                && (v.local.is_empty() || v.base() != s.base())
        }
        "~=" => {
            if s.release.len() < 2 {
                return Err(format!("the specifier {clause:?}"));
            }
            let prefix = &s.release[..s.release.len() - 1];
            v.public() >= s
                && v.epoch == s.epoch
                && v.release_padded(prefix.len())[..prefix.len()] == *prefix
        }
        _ => return Err(format!("the specifier {clause:?}")),
    })
}

/// PEP 503's normalized project name: lower case, runs of `-`, `_`, `.` made one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// A PEP 508 dependency line: `name[extras] specifiers ; marker`.
#[derive(Debug, PartialEq)]
pub struct Dependency {
    /// Normalized name.
    pub name: String,
    /// Normalized extras.
    pub extras: Vec<String>,
    /// Comma-separated clauses (without parentheses), possibly empty.
    pub specifiers: String,
    /// The marker text, if any.
    pub marker: Option<String>,
}

/// Parses a `Requires-Dist` value.
///
/// # Errors
/// A URL dependency or text that is not PEP 508.
pub fn dependency(line: &str) -> Result<Dependency, String> {
    let bad = || format!("the dependency {line:?}");
    let (spec, marker) = match line.split_once(';') {
        Some((s, m)) => (s.trim(), Some(m.trim().to_string())),
        None => (line.trim(), None),
    };
    let name_len = spec
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(spec.len());
    if name_len == 0 {
        return Err(bad());
    }
    let name = normalize(&spec[..name_len]);
    let mut rest = spec[name_len..].trim_start();
    let mut extras = Vec::new();
    if let Some(after) = rest.strip_prefix('[') {
        let (list, after) = after.split_once(']').ok_or_else(bad)?;
        extras = list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(normalize)
            .collect();
        rest = after.trim_start();
    }
    if rest.starts_with('@') {
        return Err(format!("{name} is a URL dependency"));
    }
    let rest = rest.trim();
    let specifiers = match rest.strip_prefix('(') {
        Some(inner) => inner.strip_suffix(')').ok_or_else(bad)?.trim(),
        None => rest,
    };
    Ok(Dependency {
        name,
        extras,
        specifiers: specifiers.to_string(),
        marker,
    })
}

/// The environment markers are evaluated in.
#[derive(Clone, Debug)]
pub struct Environment {
    /// `python_full_version`.
    pub python_full_version: String,
    /// `platform_machine` (`x86_64`).
    pub machine: String,
    /// `extra`, normalized; empty when no extra is asked for.
    pub extra: String,
}

impl Environment {
    fn value(&self, name: &str) -> Result<String, String> {
        let python_version = || {
            let mut parts = self.python_full_version.split('.');
            format!(
                "{}.{}",
                parts.next().unwrap_or(""),
                parts.next().unwrap_or("")
            )
        };
        Ok(match name {
            "python_version" => python_version(),
            "python_full_version" | "implementation_version" => self.python_full_version.clone(),
            "os_name" => "posix".into(),
            "sys_platform" => "linux".into(),
            "platform_system" => "Linux".into(),
            "platform_machine" => self.machine.clone(),
            "platform_python_implementation" => "CPython".into(),
            "implementation_name" => "cpython".into(),
            "extra" => self.extra.clone(),
            other => return Err(format!("the marker variable {other}")),
        })
    }
}

/// Evaluates a PEP 508 marker in `env` as `packaging` does.
///
/// # Errors
/// A variable whose value kiln cannot know (`platform_release`) or a malformed marker.
pub fn marker_holds(marker: &str, env: &Environment) -> Result<bool, String> {
    let tokens = tokenize(marker)?;
    let mut p = MarkerParser {
        tokens: &tokens,
        at: 0,
        env,
        depth: 0,
    };
    let value = p.or()?;
    if p.at != tokens.len() {
        return Err(format!("the marker {marker:?}"));
    }
    Ok(value)
}

#[derive(Debug, PartialEq)]
enum Token {
    Open,
    Close,
    Str(String),
    Word(String),
    Op(String),
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let bad = || format!("the marker {text:?}");
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            ' ' | '\t' => {
                chars.next();
            }
            '(' | ')' => {
                chars.next();
                out.push(if c == '(' { Token::Open } else { Token::Close });
            }
            '\'' | '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(x) => s.push(x),
                        None => return Err(bad()),
                    }
                }
                out.push(Token::Str(s));
            }
            '<' | '>' | '=' | '!' | '~' => {
                let mut op = String::new();
                while let Some(&x) = chars.peek().filter(|x| "<>=!~".contains(**x)) {
                    op.push(x);
                    chars.next();
                }
                out.push(Token::Op(op));
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '.' => {
                let mut w = String::new();
                while let Some(&x) = chars
                    .peek()
                    .filter(|x| x.is_ascii_alphanumeric() || **x == '_' || **x == '.')
                {
                    w.push(x);
                    chars.next();
                }
                out.push(Token::Word(w));
            }
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

struct MarkerParser<'a> {
    tokens: &'a [Token],
    at: usize,
    env: &'a Environment,
    /// Parentheses open around the current position.
    depth: usize,
}

/// Parentheses a marker may nest: more is refused (a stack that cannot overflow).
const MAX_DEPTH: usize = 32;

impl MarkerParser<'_> {
    fn word(&self, w: &str) -> bool {
        matches!(self.tokens.get(self.at), Some(Token::Word(x)) if x == w)
    }

    fn or(&mut self) -> Result<bool, String> {
        let mut value = self.and()?;
        while self.word("or") {
            self.at += 1;
            let rhs = self.and()?;
            value = value || rhs;
        }
        Ok(value)
    }

    fn and(&mut self) -> Result<bool, String> {
        let mut value = self.atom()?;
        while self.word("and") {
            self.at += 1;
            let rhs = self.atom()?;
            value = value && rhs;
        }
        Ok(value)
    }

    fn atom(&mut self) -> Result<bool, String> {
        if self.tokens.get(self.at) == Some(&Token::Open) {
            self.at += 1;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return Err("a marker nested too deep".into());
            }
            let value = self.or()?;
            self.depth -= 1;
            if self.tokens.get(self.at) != Some(&Token::Close) {
                return Err("an unclosed marker".into());
            }
            self.at += 1;
            return Ok(value);
        }
        let (lhs, lhs_var) = self.value()?;
        let op = match self.tokens.get(self.at) {
            Some(Token::Op(op)) => op.clone(),
            Some(Token::Word(w)) if w == "in" => "in".into(),
            Some(Token::Word(w)) if w == "not" => {
                self.at += 1;
                if !self.word("in") {
                    return Err("a marker with `not` but no `in`".into());
                }
                "not in".into()
            }
            _ => return Err("a marker without an operator".into()),
        };
        self.at += 1;
        let (rhs, rhs_var) = self.value()?;
        let is_extra = lhs_var.as_deref() == Some("extra") || rhs_var.as_deref() == Some("extra");
        let (lhs, rhs) = if is_extra {
            (normalize(&lhs), normalize(&rhs))
        } else {
            (lhs, rhs)
        };
        compare(&lhs, &op, &rhs)
    }

    /// A quoted string or a variable's value, with the variable's name.
    fn value(&mut self) -> Result<(String, Option<String>), String> {
        let token = self.tokens.get(self.at);
        self.at += 1;
        match token {
            Some(Token::Str(s)) => Ok((s.clone(), None)),
            Some(Token::Word(w)) => Ok((self.env.value(w)?, Some(w.clone()))),
            _ => Err("a marker without a value".into()),
        }
    }
}

/// `packaging`'s `_eval_op`: a version comparison when the right side is a version, else
/// string comparison.
fn compare(lhs: &str, op: &str, rhs: &str) -> Result<bool, String> {
    match op {
        "in" => return Ok(rhs.contains(lhs)),
        "not in" => return Ok(!rhs.contains(lhs)),
        "===" => return Err("the marker operator ===".into()),
        _ => {}
    }
    // `Specifier(op + rhs)` in packaging: a version, or a `.*` prefix after == and !=.
    let is_spec = Version::parse(rhs).is_ok()
        || (matches!(op, "==" | "!=")
            && rhs
                .strip_suffix(".*")
                .is_some_and(|p| Version::parse(p).is_ok()));
    if is_spec {
        let Ok(l) = Version::parse(lhs) else {
            return Err(format!(
                "the marker compares {lhs:?}, not a version, with {rhs:?}"
            ));
        };
        return satisfies(&l, &format!("{op}{rhs}"));
    }
    Ok(match op {
        "==" => lhs == rhs,
        "!=" => lhs != rhs,
        "<" => lhs < rhs,
        "<=" => lhs <= rhs,
        ">" => lhs > rhs,
        ">=" => lhs >= rhs,
        _ => return Err(format!("the marker operator {op} on {rhs:?}")),
    })
}

#[cfg(test)]
#[path = "pep440_tests.rs"]
mod tests;
