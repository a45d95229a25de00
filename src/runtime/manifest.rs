//! Checks a Function's dependency manifest before anything runs, so that a typo is reported
//! with its file and line instead of as an install failure, and tells whether there is
//! anything to install at all.

use super::Language;

/// What is wrong with a dependency manifest, and where.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{file} line {line}: {problem}")]
pub struct ManifestError {
    /// The file name (`package.json`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub problem: String,
}

/// Validates the manifest text for `language`.
///
/// # Errors
/// The first problem found, with its line.
pub fn validate_manifest(language: Language, file: &str, text: &str) -> Result<(), ManifestError> {
    match language {
        Language::Nodejs => validate_package_json(file, text),
        Language::Python => validate_requirements(file, text),
    }
}

/// Whether the (valid) manifest declares any dependency; without one no install runs and the
/// image gets no dependency layer.
pub fn has_dependencies(language: Language, text: &str) -> bool {
    match language {
        Language::Nodejs => serde_json::from_str::<serde_json::Value>(text).is_ok_and(|v| {
            [
                "dependencies",
                "optionalDependencies",
                "bundleDependencies",
                "bundledDependencies",
            ]
            .iter()
            .any(|k| match v.get(k) {
                Some(serde_json::Value::Object(m)) => !m.is_empty(),
                Some(serde_json::Value::Array(a)) => !a.is_empty(),
                _ => false,
            })
        }),
        Language::Python => requirement_lines(text).next().is_some(),
    }
}

fn validate_package_json(file: &str, text: &str) -> Result<(), ManifestError> {
    let err = |line, problem: String| ManifestError {
        file: file.into(),
        line,
        problem,
    };
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| err(e.line().max(1), format!("invalid JSON: {e}")))?;
    let Some(obj) = value.as_object() else {
        return Err(err(1, "must be a JSON object".into()));
    };
    for key in ["dependencies", "optionalDependencies"] {
        match obj.get(key) {
            None => {}
            Some(serde_json::Value::Object(deps)) => {
                if let Some((name, _)) = deps.iter().find(|(_, v)| !v.is_string()) {
                    let line = line_of(text, &format!("\"{name}\""));
                    return Err(err(line, format!("{key}.{name} must be a version string")));
                }
            }
            Some(_) => {
                return Err(err(
                    line_of(text, &format!("\"{key}\"")),
                    format!("{key} must be an object"),
                ));
            }
        }
    }
    Ok(())
}

/// The line of `needle`'s first occurrence at or after byte `from` (1 if it is not there).
pub(super) fn section_line(text: &str, from: usize, needle: &str) -> usize {
    text[from..]
        .find(needle)
        .map_or(1, |i| 1 + text[..from + i].matches('\n').count())
}

pub(super) fn line_of(text: &str, needle: &str) -> usize {
    section_line(text, 0, needle)
}

/// Requirement lines with comments and continuations resolved: (line number, text).
pub(super) fn requirement_lines(text: &str) -> impl Iterator<Item = (usize, String)> + '_ {
    let mut pending: Option<(usize, String)> = None;
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        // pip strips comments that start a line or follow white space.
        let line = match raw
            .find(" #")
            .or_else(|| raw.trim_start().starts_with('#').then_some(0))
        {
            Some(at) => &raw[..at],
            None => raw,
        };
        let (start, mut acc) = pending.take().unwrap_or((i + 1, String::new()));
        if let Some(body) = line.trim_end().strip_suffix('\\') {
            acc.push_str(body);
            pending = Some((start, acc));
            continue;
        }
        acc.push_str(line);
        if !acc.trim().is_empty() {
            out.push((start, acc.trim().to_string()));
        }
    }
    out.extend(pending.filter(|(_, s)| !s.trim().is_empty()));
    out.into_iter()
}

fn validate_requirements(file: &str, text: &str) -> Result<(), ManifestError> {
    for (line, req) in requirement_lines(text) {
        if let Err(problem) = check_requirement(&req) {
            return Err(ManifestError {
                file: file.into(),
                line,
                problem,
            });
        }
    }
    Ok(())
}

/// A light PEP 508 check: options, URLs and paths pass; otherwise a project name followed by
/// nothing, extras, a version specifier, a URL (`@`) or markers (`;`).
fn check_requirement(req: &str) -> Result<(), String> {
    if req.starts_with('-') || req.contains("://") || req.starts_with(['.', '/']) {
        return Ok(());
    }
    let name_len = req
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        .unwrap_or(req.len());
    let name = &req[..name_len];
    let valid_name = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !valid_name {
        return Err(format!(
            "{req:?} is not a requirement (expected NAME, NAME==VERSION, …)"
        ));
    }
    let rest = req[name_len..].trim_start();
    let Some(first) = rest.chars().next() else {
        return Ok(());
    };
    if !matches!(first, '[' | '(' | '=' | '!' | '<' | '>' | '~' | ';' | '@') {
        return Err(format!(
            "{req:?} is not a requirement: unexpected {rest:?} after {name:?}"
        ));
    }
    let version = rest.trim_start_matches(['=', '!', '<', '>', '~']).trim();
    if matches!(first, '=' | '!' | '<' | '>' | '~') && version.is_empty() {
        return Err(format!("{req:?} has a version operator but no version"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_json_errors_name_the_line() {
        let bad = "{\n  \"name\": \"x\",\n  \"dependencies\": {\"a\": 1}\n}";
        let err = validate_manifest(Language::Nodejs, "package.json", bad).unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.problem.contains("dependencies.a"));
        let err = validate_manifest(Language::Nodejs, "package.json", "{\n\"a\": ,}").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(
            err.to_string()
                .starts_with("package.json line 2: invalid JSON")
        );
        assert!(validate_manifest(Language::Nodejs, "package.json", "[]").is_err());
    }

    #[test]
    fn requirement_lines_are_checked() {
        let good = "# comment\nrequests==2.32.3  # pinned\nPyYAML>=6\nuvicorn[standard] ; \
            python_version>'3'\n-r other.txt\nfoo @ https://x/y.whl\nbar \\\n  ==1.0\n";
        validate_manifest(Language::Python, "requirements.txt", good).unwrap();
        let err = validate_manifest(
            Language::Python,
            "requirements.txt",
            "ok\nthis is not valid\n",
        )
        .unwrap_err();
        assert_eq!(err.line, 2);
        assert!(validate_manifest(Language::Python, "r.txt", "flask==\n").is_err());
        assert!(validate_manifest(Language::Python, "r.txt", "-bad-\n").is_ok());
        assert!(validate_manifest(Language::Python, "r.txt", "_x\n").is_err());
    }

    #[test]
    fn empty_manifests_have_no_dependencies() {
        assert!(!has_dependencies(Language::Nodejs, "{}"));
        assert!(!has_dependencies(
            Language::Nodejs,
            r#"{"dependencies":{}}"#
        ));
        assert!(has_dependencies(
            Language::Nodejs,
            r#"{"dependencies":{"a":"1"}}"#
        ));
        assert!(!has_dependencies(Language::Python, "# only a comment\n\n"));
        assert!(has_dependencies(Language::Python, "requests\n"));
    }
}
