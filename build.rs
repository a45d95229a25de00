//! The runtime table: every `runtimes/<name>/runtime.toml`, and every
//! `base-images/<name>/{recipe,lock}.toml`, found by listing the folders and compiled into
//! the binary (`src/runtime/table.rs` includes what this writes). A new runtime is a new
//! folder in each, and nothing else.

use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("runtimes.rs");
    println!("cargo::rerun-if-changed=runtimes");
    println!("cargo::rerun-if-changed=base-images");
    let mut text = String::from(
        "/// `(name, runtime.toml)` of every folder in runtimes/, by name.\n\
         pub const RUNTIMES: &[(&str, &str)] = &[\n",
    );
    for (name, dir) in folders(&root.join("runtimes"), &["runtime.toml"]) {
        let file = dir.join("runtime.toml");
        text += &format!(
            "    ({name:?}, include_str!({:?})),\n",
            file.display().to_string()
        );
    }
    text += "];\n\n/// `(name, recipe.toml, lock.toml)` of every folder in base-images/, by name.\n\
             pub const BASE_IMAGES: &[(&str, &str, &str)] = &[\n";
    for (name, dir) in folders(&root.join("base-images"), &["recipe.toml", "lock.toml"]) {
        let (recipe, lock) = (dir.join("recipe.toml"), dir.join("lock.toml"));
        text += &format!(
            "    ({name:?}, include_str!({:?}), include_str!({:?})),\n",
            recipe.display().to_string(),
            lock.display().to_string()
        );
    }
    text += "];\n";
    fs::write(&out, text).expect("writing the runtime table");
}

/// The folders of `dir` that hold every file of `files`, by name; `_`-prefixed folders
/// (shared parts such as `runtimes/_servers`) are not runtimes.
fn folders(dir: &Path, files: &[&str]) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?.to_string();
            let complete = files.iter().all(|f| path.join(f).is_file());
            (!name.starts_with('_') && complete).then_some((name, path))
        })
        .collect();
    out.sort();
    out
}
