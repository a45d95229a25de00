//! The code's shape, checked. Layering: src/lib.rs lists which top-level module may import
//! which ("# Layers"), and every `crate::` path in src/ must follow that list. Width: no line
//! of Rust is over 100 columns, rustfmt's limit, which it silently gives up on inside
//! macros and long strings. A small reader of
//! its own rather than cargo-modules (a tool CI would have to install, whose output changes
//! between versions) or a workspace split (which would move every file): it needs only the
//! top-level module of each file and the first segment after each `crate::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Who may import whom: a module's allowed targets, `None` for anything.
type Rules = BTreeMap<String, Option<BTreeSet<String>>>;

/// The "# Layers" list of lib.rs: `- `a`, `b`: `x` `y`.` entries, continued on indented lines.
fn rules(lib_rs: &str) -> Rules {
    let doc: Vec<&str> = lib_rs
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != "# Layers")
        .collect();
    let mut entries: Vec<String> = Vec::new();
    for line in doc {
        if let Some(entry) = line.strip_prefix(" - ") {
            entries.push(entry.to_string());
        } else if line.starts_with("   ") && !entries.is_empty() {
            let last = entries.last_mut().unwrap();
            last.push(' ');
            last.push_str(line.trim());
        } else if !entries.is_empty() {
            break;
        }
    }
    let names = |s: &str| -> BTreeSet<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let mut out = Rules::new();
    for entry in entries {
        let (modules, allowed) = entry.split_once(':').expect("`module`: `allowed`…");
        let allowed = match allowed.trim() {
            "anything." => None,
            "nothing." => Some(BTreeSet::new()),
            list => Some(names(list)),
        };
        for module in names(modules) {
            assert!(
                out.insert(module.clone(), allowed.clone()).is_none(),
                "{module} is listed twice"
            );
        }
    }
    out
}

/// The top-level modules lib.rs declares.
fn modules(lib_rs: &str) -> BTreeSet<String> {
    lib_rs
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(str::to_string)
        })
        .collect()
}

/// One import: the file and line, the module it is in and the module it names.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Arrow {
    from: String,
    to: String,
    at: String,
}

/// The module a file under src/ belongs to: its first path component, with `foo_tests.rs`
/// (included by `#[path]`) belonging to `foo`. `None` for lib.rs and main.rs.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    match name {
        "lib" | "main" => None,
        _ => Some(name.strip_suffix("_tests").unwrap_or(name).to_string()),
    }
}

/// The first segments of the paths after `crate::` in `code`: `crate::a::b` gives `a`, and
/// `crate::{a::{b, c}, d}` gives `a` and `d`.
fn targets(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let macro_path = rest[..i].ends_with('$');
        rest = &rest[i + "crate::".len()..];
        if macro_path {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // The top-level items of a (possibly nested) group.
            let (mut depth, mut item_start) = (0usize, true);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        rest = &group[j..];
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        item_start = false;
                        out.push(ident(&group[j..]));
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Every `crate::` arrow between top-level modules in the .rs files under `src`, comment
/// lines left out.
fn arrows(src: &Path, modules: &BTreeSet<String>) -> Vec<Arrow> {
    let files = rust_files(src);
    let mut out = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let Some(from) = module_of(relative) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        // A `use crate::{…}` group may span lines: read statements, not lines, keeping the
        // line each starts on.
        let mut statement = String::new();
        let mut start = 0;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if statement.is_empty() {
                start = n + 1;
            }
            statement.push_str(line);
            statement.push('\n');
            let group = statement.find("crate::{").map(|i| &statement[i..]);
            if group.is_some_and(|g| g.matches('{').count() > g.matches('}').count()) {
                continue;
            }
            for to in targets(&statement) {
                if to != from && modules.contains(&to) {
                    out.push(Arrow {
                        from: from.clone(),
                        to,
                        at: format!("{}:{start}", relative.display()),
                    });
                }
            }
            statement.clear();
        }
    }
    out.sort();
    out
}

/// The arrows `rules` does not allow, and the modules it does not list.
fn violations(rules: &Rules, modules: &BTreeSet<String>, arrows: &[Arrow]) -> Vec<String> {
    let mut out: Vec<String> = modules
        .iter()
        .filter(|m| !rules.contains_key(*m))
        .map(|m| format!("module {m} is not in lib.rs's list of layers"))
        .collect();
    for a in arrows {
        let allowed = ["testing", "io_error"].contains(&a.to.as_str())
            || match rules.get(&a.from) {
                Some(None) => true,
                Some(Some(to)) => to.contains(&a.to),
                None => false,
            };
        if !allowed {
            out.push(format!(
                "{}: {} imports {}, which lib.rs's layers do not allow",
                a.at, a.from, a.to
            ));
        }
    }
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_crate_path_follows_the_layers_lib_rs_lists() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let (rules, modules) = (rules(&lib), modules(&lib));
    assert!(rules.len() >= 20, "the list was read: {rules:?}");
    let arrows = arrows(&src(), &modules);
    assert!(
        arrows.len() > 100,
        "the imports were read: {}",
        arrows.len()
    );
    let wrong = violations(&rules, &modules, &arrows);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every listed module is real.
    for m in rules.keys() {
        assert!(
            modules.contains(m),
            "lib.rs lists {m}, which it does not declare"
        );
    }
}

#[test]
fn an_arrow_against_the_layers_is_caught_however_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let lib = "//! # Layers\n//!\n//! - `cli`: anything.\n//! - `build`: `oci`\n//!   `registry`.\n\
               //! - `oci`, `registry`: nothing.\n\npub mod build;\npub mod cli;\npub mod oci;\n\
               pub mod registry;\n";
    let (rules, modules) = (rules(lib), modules(lib));
    std::fs::create_dir_all(dir.path().join("oci")).unwrap();
    std::fs::create_dir_all(dir.path().join("build")).unwrap();
    std::fs::write(dir.path().join("lib.rs"), lib).unwrap();
    let fine = "use crate::registry::Client;\nuse crate::{\n    oci::{self, Digest},\n    \
        registry,\n};\n\
                // crate::cli::Args in a comment is no import\nfn f() { crate::oci::x(); }\n";
    std::fs::write(dir.path().join("build/mod.rs"), fine).unwrap();
    std::fs::write(dir.path().join("oci/mod.rs"), "pub struct Digest;\n").unwrap();
    let arrows_now = arrows(dir.path(), &modules);
    assert_eq!(arrows_now.len(), 4, "{arrows_now:?}");
    assert_eq!(
        violations(&rules, &modules, &arrows_now),
        Vec::<String>::new()
    );
    // The pure module reaches up, in each way a path can be written.
    for bad in [
        "use crate::build::Options;\n",
        "use crate::{\n    registry,\n    build::{plan, Options},\n};\n",
        "fn f() -> crate::cli::Args { todo!() }\n",
        "pub(crate) use crate::{build, registry};\n",
    ] {
        std::fs::write(dir.path().join("oci/mod.rs"), bad).unwrap();
        let wrong = violations(&rules, &modules, &arrows(dir.path(), &modules));
        assert!(
            wrong
                .iter()
                .any(|w| w.starts_with("oci/mod.rs:1: oci imports ")),
            "{bad}: {wrong:?}"
        );
    }
    // A module the list leaves out is named.
    let unlisted = self::modules(&format!("{lib}pub mod sandbox;\n"));
    let wrong = violations(&rules, &unlisted, &[]);
    assert_eq!(wrong, ["module sandbox is not in lib.rs's list of layers"]);
}

/// Every .rs file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn no_line_of_rust_is_over_100_columns() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("build.rs")];
    for dir in ["src", "tests", "bench"] {
        files.extend(rust_files(&root.join(dir)));
    }
    assert!(files.len() > 100, "the files were found: {}", files.len());
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let width = line.chars().count();
            if width > 100 {
                let at = file.strip_prefix(root).unwrap().display().to_string();
                long.push(format!("{at}:{}: {width} columns", n + 1));
            }
        }
    }
    assert!(
        long.is_empty(),
        "lines over 100 columns (break strings with a `\\` continuation, macros by hand):\n{}",
        long.join("\n")
    );
}
