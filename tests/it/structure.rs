//! The code's shape, checked. Layering: src/lib.rs lists which top-level module may import
//! which ("# Layers"), and every `crate::` path in src/ must follow that list; inside
//! src/registry/, mod.rs lists the files lowest first ("# Files"), and every `super::` and
//! `crate::registry::` use must point down that list, so the files form no loop. Width: no line
//! of Rust is over 100 columns, rustfmt's limit, which it silently gives up on inside
//! macros and long strings. A small reader of
//! its own rather than cargo-modules (a tool CI would have to install, whose output changes
//! between versions) or a workspace split (which would move every file): it needs only the
//! top-level module of each file and the first segment after each `crate::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Who may import whom: a module's allowed targets, `None` for anything.
type Rules = BTreeMap<String, Option<BTreeSet<String>>>;

/// The `- ` entries of the list under `heading` in a file's `//!` docs, each joined with its
/// indented continuation lines.
fn doc_list(text: &str, heading: &str) -> Vec<String> {
    let doc: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != heading)
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
    entries
}

/// The "# Layers" list of lib.rs: `- `a`, `b`: `x` `y`.` entries, continued on indented lines.
fn rules(lib_rs: &str) -> Rules {
    let entries = doc_list(lib_rs, "# Layers");
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
    segments_after(code, "crate::")
}

/// The first segments of the paths after `prefix` in `code`, as [`targets`] for `crate::`.
fn segments_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let macro_path = rest[..i].ends_with('$');
        rest = &rest[i + prefix.len()..];
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
        for (start, statement) in statements(&text) {
            for to in targets(&statement) {
                if to != from && modules.contains(&to) {
                    out.push(Arrow {
                        from: from.clone(),
                        to,
                        at: format!("{}:{start}", relative.display()),
                    });
                }
            }
        }
    }
    out.sort();
    out
}

/// The code of `text` as statements with the line each starts on, comment lines left out: a
/// `use crate::{…}` (or `super::{…}`) group may span lines, so lines are joined until it
/// closes.
fn statements(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
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
        let open = ["crate::{", "super::{"]
            .iter()
            .filter_map(|p| statement.find(p))
            .min();
        let group = open.map(|i| &statement[i..]);
        if group.is_some_and(|g| g.matches('{').count() > g.matches('}').count()) {
            continue;
        }
        out.push((start, std::mem::take(&mut statement)));
    }
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

/// The "# Files" list of a module's mod.rs: each listed file's level, 0 for the lowest entry.
fn file_levels(mod_rs: &str) -> BTreeMap<String, usize> {
    let entries = doc_list(mod_rs, "# Files");
    let mut out = BTreeMap::new();
    for (level, entry) in entries.iter().enumerate() {
        let (files, _) = entry
            .split_once(':')
            .expect("`file`, `file`: what they hold");
        for file in files.split('`').skip(1).step_by(2) {
            assert!(
                out.insert(file.to_string(), level).is_none(),
                "{file} is listed twice"
            );
        }
    }
    out
}

/// The items a mod.rs re-exports (`pub use file::{A, B as C};`), by name, with the file that
/// defines them.
fn reexports(mod_rs: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (_, statement) in statements(mod_rs) {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((file, items)) = path.split_once("::") else {
            continue;
        };
        let items = items.trim_end_matches([';', '\n', ' ', '}']);
        for item in items.trim_start_matches('{').split(',') {
            let name = item.rsplit(" as ").next().unwrap_or("").trim();
            if !name.is_empty() && name != "self" {
                out.insert(ident(name), file.to_string());
            }
        }
    }
    out
}

/// Every arrow between the files of the module directory `dir` (named `module` in the crate):
/// each `super::x` and `crate::<module>::x` where `x` is one of its files, or an item mod.rs
/// re-exports from one. A `foo_tests.rs` file is `foo`'s; mod.rs is left out.
fn file_arrows(dir: &Path, module: &str) -> (BTreeSet<String>, Vec<Arrow>) {
    let mod_rs = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    let reexported = reexports(&mod_rs);
    let mut names = BTreeMap::new();
    for path in std::fs::read_dir(dir).unwrap() {
        let path = path.unwrap().path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            let owner = stem.strip_suffix("_tests").unwrap_or(stem).to_string();
            names.insert(path, owner);
        }
    }
    let files: BTreeSet<String> = names.values().cloned().collect();
    let own_path = format!("crate::{module}::");
    let mut out = Vec::new();
    for (path, from) in &names {
        let text = std::fs::read_to_string(path).unwrap();
        for (start, statement) in statements(&text) {
            let mut named = segments_after(&statement, "super::");
            named.extend(segments_after(&statement, &own_path));
            for name in named {
                let to = reexported.get(&name).unwrap_or(&name);
                if to != from && files.contains(to) {
                    let file = path.file_name().unwrap().to_string_lossy();
                    out.push(Arrow {
                        from: from.clone(),
                        to: to.clone(),
                        at: format!("{module}/{file}:{start}"),
                    });
                }
            }
        }
    }
    out.sort();
    out.dedup();
    (files, out)
}

/// The arrows that do not point to a lower line of `levels`, and the files it does not list.
fn file_violations(
    levels: &BTreeMap<String, usize>,
    files: &BTreeSet<String>,
    arrows: &[Arrow],
) -> Vec<String> {
    let mut out: Vec<String> = files
        .iter()
        .filter(|f| !levels.contains_key(*f))
        .map(|f| format!("file {f}.rs is not in mod.rs's list of files"))
        .collect();
    for a in arrows {
        if let (Some(from), Some(to)) = (levels.get(&a.from), levels.get(&a.to))
            && to >= from
        {
            out.push(format!(
                "{}: {} uses {}, which is not on a line above it in mod.rs's list",
                a.at, a.from, a.to
            ));
        }
    }
    out
}

#[test]
fn the_files_of_registry_use_only_files_below_them_so_they_form_no_loop() {
    let dir = src().join("registry");
    let mod_rs = std::fs::read_to_string(dir.join("mod.rs")).unwrap();
    let levels = file_levels(&mod_rs);
    assert!(levels.len() >= 15, "the list was read: {levels:?}");
    let (files, arrows) = file_arrows(&dir, "registry");
    assert!(arrows.len() > 50, "the uses were read: {}", arrows.len());
    let wrong = file_violations(&levels, &files, &arrows);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for f in levels.keys() {
        assert!(files.contains(f), "mod.rs lists {f}, which is not a file");
    }
}

#[test]
fn a_file_that_uses_one_above_it_is_caught_however_it_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("reg");
    std::fs::create_dir_all(&reg).unwrap();
    let mod_rs = "//! # Files\n//!\n//! - `a`: the leaf.\n//! - `b`, `c`: in\n//!   between.\n\
                  //! - `d`: the top.\n\nmod a;\nmod b;\nmod c;\nmod d;\n\
                  pub use a::Leaf;\npub use d::{Top, Other as Renamed};\n";
    std::fs::write(reg.join("mod.rs"), mod_rs).unwrap();
    let levels = file_levels(mod_rs);
    assert_eq!(levels.len(), 4, "{levels:?}");
    assert_eq!((levels["b"], levels["c"]), (1, 1));
    let write = |file: &str, text: &str| std::fs::write(reg.join(file), text).unwrap();
    write(
        "a.rs",
        "pub struct Leaf;\n// super::d::Top in a comment is no use\n",
    );
    write("b.rs", "use super::a::Leaf;\n");
    write("b_tests.rs", "use crate::reg::Leaf;\n");
    write("c.rs", "fn f() -> crate::reg::a::Leaf { todo!() }\n");
    write(
        "d.rs",
        "use super::{\n    a::Leaf,\n    b,\n    c::{self, X},\n};\n",
    );
    let (files, arrows) = file_arrows(&reg, "reg");
    assert_eq!(arrows.len(), 6, "{arrows:?}");
    assert_eq!(
        file_violations(&levels, &files, &arrows),
        Vec::<String>::new()
    );
    // The leaf reaches up, in each way a use can be written; and two files on one line.
    for (file, bad) in [
        ("a.rs", "use super::b::X;\n"),
        ("a.rs", "use super::{\n    d::{Top, Y},\n};\n"),
        ("a.rs", "fn f() -> crate::reg::Top { todo!() }\n"),
        ("a.rs", "fn f() -> super::Renamed { todo!() }\n"),
        ("a.rs", "mod tests {\n    use super::super::c::X;\n}\n"),
        ("b_tests.rs", "use crate::reg::c::X;\n"),
    ] {
        let before = std::fs::read_to_string(reg.join(file)).unwrap();
        write(file, bad);
        let (files, arrows) = file_arrows(&reg, "reg");
        let wrong = file_violations(&levels, &files, &arrows);
        let from = &file[..1];
        assert!(
            wrong
                .iter()
                .any(|w| w.starts_with(&format!("reg/{file}:"))
                    && w.contains(&format!(" {from} uses "))),
            "{file}: {bad}: {wrong:?}"
        );
        write(file, &before);
    }
    // A loop of two files is caught on one of its arrows.
    write("a.rs", "use super::b::X;\n");
    let (files, arrows) = file_arrows(&reg, "reg");
    assert_eq!(file_violations(&levels, &files, &arrows).len(), 1);
    // A file the list leaves out is named.
    write("e.rs", "use super::a::Leaf;\n");
    let (files, arrows) = file_arrows(&reg, "reg");
    let wrong = file_violations(&levels, &files, &arrows);
    assert!(wrong.contains(&"file e.rs is not in mod.rs's list of files".to_string()));
}
