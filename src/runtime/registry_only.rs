//! The registry-only rule of a Function's dependencies: every place npm or pip accepts a
//! source — the manifest's specs, options and overrides, and the lock file's URLs — must
//! name the configured package registries, unless the build allows direct dependencies.
//! The webhook and the build run the same checks.

use super::Language;
use super::manifest::{ManifestError, line_of, requirement_lines, section_line};

/// Refuses dependencies that bypass the package registry the build is configured for: in
/// `requirements.txt`, `-e`/`-r`/`-c`/`--index-url`/`--extra-index-url`/`--find-links` lines,
/// URL and path requirements; in `package.json`, git, URL, `file:`, `link:` and path
/// specs wherever npm (or yarn) takes one — dependencies of every kind, `overrides` at any
/// depth, `resolutions` — and bundled dependencies that are not registry dependencies. Each is
/// a door to dependency confusion or to files outside the Function, so a build allows them
/// only when told to (`kiln build --allow-direct-deps`). The lock file's sources are checked
/// by [`check_lock_registry_only`].
///
/// # Errors
/// The first such dependency, with its line.
pub fn check_registry_only(
    language: Language,
    file: &str,
    text: &str,
) -> Result<(), ManifestError> {
    let err = |line, problem: String| ManifestError {
        file: file.into(),
        line,
        problem: format!(
            "{problem}; it bypasses the package registry (use a registry package, or pass \
             --allow-direct-deps)"
        ),
    };
    match language {
        Language::Python => {
            for (line, req) in requirement_lines(text) {
                if let Some(what) = direct_requirement(&req) {
                    return Err(err(line, format!("{req:?} {what}")));
                }
            }
        }
        Language::Nodejs => {
            let Ok(serde_json::Value::Object(obj)) = serde_json::from_str(text) else {
                return Ok(());
            };
            for key in [
                "dependencies",
                "optionalDependencies",
                "devDependencies",
                "peerDependencies",
                "overrides",
                "resolutions",
            ] {
                let Some(section) = obj.get(key) else {
                    continue;
                };
                let mut specs = Vec::new();
                npm_specs(key, section, &mut specs);
                for (path, name, spec) in specs {
                    if let Some(what) = direct_npm_spec(spec) {
                        // The name's first mention after the section's key.
                        let at = text.find(&format!("\"{key}\"")).unwrap_or(0);
                        let line = section_line(text, at, &format!("\"{name}\""));
                        return Err(err(line, format!("{path} {spec:?} {what}")));
                    }
                }
            }
            bundled_are_registry_dependencies(&obj, text).map_err(|(line, p)| err(line, p))?;
        }
    }
    Ok(())
}

/// Every spec string under `value` (a section of package.json), with its path
/// (`overrides.a.b`) and its own key: overrides nest objects (`"pkg": {".": "1", "dep": …}`).
fn npm_specs<'a>(
    path: &str,
    value: &'a serde_json::Value,
    out: &mut Vec<(String, &'a str, &'a str)>,
) {
    let serde_json::Value::Object(map) = value else {
        return;
    };
    for (name, inner) in map {
        let at = format!("{path}.{name}");
        match inner {
            serde_json::Value::String(spec) => out.push((at, name, spec)),
            serde_json::Value::Object(_) => npm_specs(&at, inner, out),
            _ => {}
        }
    }
}

/// `bundleDependencies` (`bundledDependencies`) name packages to ship from `node_modules` on
/// disk: each must also be a registry dependency, or it would come from the Function's tree.
fn bundled_are_registry_dependencies(
    obj: &serde_json::Map<String, serde_json::Value>,
    text: &str,
) -> Result<(), (usize, String)> {
    for key in ["bundleDependencies", "bundledDependencies"] {
        let names: Vec<&str> = match obj.get(key) {
            Some(serde_json::Value::Array(list)) => {
                list.iter().filter_map(serde_json::Value::as_str).collect()
            }
            // `true`: every dependency, each checked above.
            _ => continue,
        };
        for name in names {
            let declared = ["dependencies", "optionalDependencies"]
                .iter()
                .any(|section| obj.get(*section).and_then(|d| d.get(name)).is_some());
            if !declared {
                let line = line_of(text, &format!("\"{key}\""));
                return Err((
                    line,
                    format!("{key} names {name:?}, which is no registry dependency"),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses a lock file that fetches from anywhere but `allowed` (`host:port` of the
/// configured registries): npm's `package-lock.json`, every `resolved` of `packages` (v2, v3)
/// and `dependencies` (v1, nested), and linked (local) packages. npm follows a lock's
/// `resolved` URLs as written, whatever `package.json` says.
///
/// # Errors
/// The first such entry, with its line.
pub fn check_lock_registry_only(
    file: &str,
    text: &str,
    allowed: &[String],
) -> Result<(), ManifestError> {
    let Ok(lock) = serde_json::from_str::<serde_json::Value>(text) else {
        return Ok(()); // npm reports a broken lock itself
    };
    let mut entries: Vec<(&str, &serde_json::Value)> = Vec::new();
    if let Some(packages) = lock.get("packages").and_then(|p| p.as_object()) {
        entries.extend(packages.iter().map(|(k, v)| (k.as_str(), v)));
    }
    lock_v1_entries(&lock, &mut entries);
    for (key, entry) in entries {
        let problem = if entry.get("link").and_then(|l| l.as_bool()) == Some(true) {
            Some("is a linked local package".to_string())
        } else {
            entry
                .get("resolved")
                .and_then(|r| r.as_str())
                .and_then(|resolved| lock_source_problem(resolved, allowed))
        };
        if let Some(problem) = problem {
            let line = line_of(text, &format!("\"{key}\""));
            return Err(ManifestError {
                file: file.into(),
                line,
                problem: format!(
                    "{key:?} {problem}; it bypasses the package registry (use a registry \
                     package, or pass --allow-direct-deps)"
                ),
            });
        }
    }
    Ok(())
}

/// The `dependencies` of a lockfile v1, at every depth.
fn lock_v1_entries<'a>(
    node: &'a serde_json::Value,
    out: &mut Vec<(&'a str, &'a serde_json::Value)>,
) {
    if let Some(deps) = node.get("dependencies").and_then(|d| d.as_object()) {
        for (name, entry) in deps {
            out.push((name, entry));
            lock_v1_entries(entry, out);
        }
    }
}

/// Why a lock entry's `resolved` is not on an allowed registry, if it is not.
fn lock_source_problem(resolved: &str, allowed: &[String]) -> Option<String> {
    let Ok(url) = url::Url::parse(resolved) else {
        return Some(format!("is resolved to {resolved:?}, a local path"));
    };
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    let port = url.port_or_known_default().unwrap_or(0);
    let at = format!("{host}:{port}");
    let on_registry = matches!(url.scheme(), "https" | "http") && allowed.contains(&at);
    (!on_registry).then(|| format!("is resolved to {resolved:?}, not a configured registry"))
}

/// Why a requirement line reaches outside the package index, if it does.
fn direct_requirement(req: &str) -> Option<&'static str> {
    // Long options may be written `--opt=value` or `--opt value`; short ones `-rfile` too.
    let option = req.split([' ', '=', '\t']).next().unwrap_or_default();
    let refused: &[(&str, &str)] = &[
        ("-e", "installs an editable (local or VCS) project"),
        ("--editable", "installs an editable (local or VCS) project"),
        ("-r", "reads another requirements file"),
        ("--requirement", "reads another requirements file"),
        ("-c", "reads a constraints file"),
        ("--constraint", "reads a constraints file"),
        ("-i", "changes the package index"),
        ("--index-url", "changes the package index"),
        ("--extra-index-url", "adds a package index"),
        ("--no-index", "turns the package index off"),
        ("-f", "adds a package location"),
        ("--find-links", "adds a package location"),
        ("--trusted-host", "turns TLS checks off for a host"),
    ];
    for (flag, what) in refused {
        let short_joined = flag.len() == 2 && !flag.starts_with("--") && option.starts_with(flag);
        if option == *flag || short_joined {
            return Some(what);
        }
    }
    if req.starts_with('-') {
        // Other options (--hash, --pre, --only-binary, …) change how, not where from.
        return None;
    }
    let spec = req.split(';').next().unwrap_or_default();
    // PEP 508: `@` only ever introduces a URL.
    if spec.contains("://") || spec.contains('@') {
        return Some("is a URL or VCS requirement");
    }
    if spec.starts_with(['.', '/', '~']) || spec.starts_with("file:") {
        return Some("is a local path");
    }
    None
}

/// Why an npm dependency spec is not a registry version range, if it is not.
fn direct_npm_spec(spec: &str) -> Option<&'static str> {
    let spec = spec.trim();
    if let Some(alias) = spec.strip_prefix("npm:") {
        // `npm:name@range`: another registry package under this name.
        return alias.contains("://").then_some("is a URL");
    }
    if spec.starts_with("file:")
        || spec.starts_with("link:")
        || spec.starts_with(['.', '/'])
        || spec.starts_with("~/")
    {
        return Some("is a local path");
    }
    if ["git+", "git://", "git@"]
        .iter()
        .any(|p| spec.starts_with(p))
        || spec.contains("://")
    {
        return Some("is a git or URL dependency");
    }
    // `user/repo`, `github:user/repo`, `workspace:*`: version ranges have neither.
    if spec.contains(['/', ':']) {
        return Some("is a git, hosted or workspace dependency");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_that_bypass_the_index_are_refused_with_their_line() {
        let ok = "requests==2.32.3 --hash=sha256:abc\n--only-binary \
            :all:\n--pre\nuvicorn[standard]>=0.30 ; python_version > '3.8'\nPyYAML\n";
        check_registry_only(Language::Python, "requirements.txt", ok).unwrap();
        let refused = [
            "-e git+https://github.com/a/b.git#egg=b",
            "-e /path/to/project",
            "--editable=./x",
            "-r other.txt",
            "-rother.txt",
            "--requirement other.txt",
            "-c constraints.txt",
            "--index-url https://evil.example/simple",
            "-i https://evil.example/simple",
            "--extra-index-url=https://evil.example/simple",
            "--find-links /tmp/wheels",
            "--no-index",
            "--trusted-host evil.example",
            "foo @ https://evil.example/foo.whl",
            "foo@git+https://evil.example/foo",
            "git+https://evil.example/foo.git",
            "https://evil.example/foo.tar.gz",
            "./local",
            "/abs/pkg",
            "file:///abs/pkg",
        ];
        for line in refused {
            let text = format!("ok==1\n{line}\n");
            let err =
                check_registry_only(Language::Python, "requirements.txt", &text).expect_err(line);
            assert_eq!(err.line, 2, "{line}");
            assert!(err.to_string().contains("--allow-direct-deps"), "{err}");
        }
    }

    #[test]
    fn npm_dependencies_that_bypass_the_registry_are_refused_with_their_line() {
        let ok = "{\"dependencies\": {\"a\": \"^1.2.3\", \"b\": \"~1.0\", \"c\": \"1.x || >=2\", \
            \"d\": \"latest\", \"e\": \"npm:@scope/real@^2\", \"f\": \"*\"}}";
        check_registry_only(Language::Nodejs, "package.json", ok).unwrap();
        for spec in [
            "git+https://github.com/a/b.git",
            "git://github.com/a/b",
            "github:a/b",
            "a/b",
            "a/b#v1",
            "https://evil.example/b.tgz",
            "file:../b",
            "link:../b",
            "../b",
            "/abs/b",
            "~/b",
            "workspace:*",
        ] {
            let text = format!(
                "{{\n  \"dependencies\": {{\n    \"ok\": \"1\",\n    \"bad\": \"{spec}\"\n  }}\n}}"
            );
            let err = check_registry_only(Language::Nodejs, "package.json", &text).expect_err(spec);
            assert_eq!(err.line, 4, "{spec}: {err}");
            assert!(err.problem.contains("dependencies.bad"), "{err}");
        }
    }

    #[test]
    fn every_place_npm_takes_a_source_is_checked_overrides_resolutions_and_bundles() {
        let check = |text: &str| check_registry_only(Language::Nodejs, "package.json", text);
        let ok = r#"{"dependencies": {"a": "^1"}, "overrides": {"b": "2.0.0",
            "c": {".": "1", "d": "$a"}}, "resolutions": {"e": "1.2.3"},
            "bundleDependencies": ["a"]}"#;
        check(ok).unwrap();
        for (text, path) in [
            (
                "{\"overrides\": {\"ms\": \"https://evil.example/ms.tgz\"}}",
                "overrides.ms",
            ),
            (
                "{\"overrides\": {\"a\": {\"ms\": \"github:evil/ms\"}}}",
                "overrides.a.ms",
            ),
            (
                "{\"resolutions\": {\"ms\": \"file:../ms\"}}",
                "resolutions.ms",
            ),
        ] {
            let err = check(text).expect_err(text);
            assert!(err.problem.starts_with(path), "{err}");
            assert!(
                err.problem.contains("bypasses the package registry"),
                "{err}"
            );
        }
        let err =
            check(r#"{"dependencies": {"a": "1"}, "bundleDependencies": ["a", "x"]}"#).unwrap_err();
        assert!(
            err.problem
                .starts_with("bundleDependencies names \"x\", which is no registry dependency"),
            "{err}"
        );
    }

    #[test]
    fn a_lock_resolved_anywhere_but_the_configured_registries_is_refused() {
        let allowed = ["registry.npmjs.org:443".to_string()];
        let check = |text: &str| check_lock_registry_only("package-lock.json", text, &allowed);
        check(
            r#"{"lockfileVersion": 3, "packages": {"": {},
            "node_modules/ms": {"resolved": "https://registry.npmjs.org/ms/-/ms-2.1.3.tgz"}}}"#,
        )
        .unwrap();
        let err = check(
            "{\"lockfileVersion\": 3, \"packages\": {\"\": {},\n\"node_modules/ms\": \
             {\"resolved\": \"https://evil.example/ms.tgz\"}}}",
        )
        .unwrap_err();
        assert_eq!(err.line, 2, "{err}");
        assert!(
            err.problem.starts_with(
                "\"node_modules/ms\" is resolved to \"https://evil.example/ms.tgz\", not a \
                 configured registry"
            ),
            "{err}"
        );
        // Version 1's nested dependencies, plain http to the registry's host on port 80,
        // and linked local packages.
        for text in [
            r#"{"lockfileVersion": 1, "dependencies": {"a": {"resolved":
                "https://registry.npmjs.org/a.tgz", "dependencies": {"b": {"resolved":
                "git+ssh://git@github.com/evil/b.git"}}}}}"#,
            r#"{"packages": {"node_modules/a": {"resolved": "http://registry.npmjs.org/a.tgz"}}}"#,
            r#"{"packages": {"node_modules/a": {"resolved": "../a", "link": true}}}"#,
        ] {
            check(text).expect_err(text);
        }
        // A registry the config names is allowed.
        let mirror = ["npm.corp.example:8443".to_string()];
        check_lock_registry_only(
            "package-lock.json",
            r#"{"packages": {"node_modules/a": {
                "resolved": "https://npm.corp.example:8443/a.tgz"}}}"#,
            &mirror,
        )
        .unwrap();
    }
}
