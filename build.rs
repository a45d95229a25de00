//! The runtime table: every `runtimes/<name>/runtime.toml`, and every
//! `base-images/<name>/{recipe,lock}.toml`, found by listing the folders and compiled into
//! the binary (`src/runtime/table.rs` includes what this writes). A new runtime is a new
//! folder in each, and nothing else.

use std::fs;
use std::hash::{Hash, Hasher};
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
    text += "];\n\n";
    // What each runtime's base and builder images are assembled from: its recipe and lock, the
    // function servers and kiln's version. The image store re-assembles a runtime whose images
    // another kiln made (src/base/store.rs).
    let mut servers = Vec::new();
    files_under(&root.join("runtimes/_servers"), &mut servers);
    servers.sort();
    text += "/// `(name, fingerprint)` of what each base-images/ runtime is assembled from.\n\
             pub const ASSEMBLY_INPUTS: &[(&str, &str)] = &[\n";
    for (name, dir) in folders(&root.join("base-images"), &["recipe.toml", "lock.toml"]) {
        let mut hasher = std::hash::DefaultHasher::new();
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        for file in [dir.join("recipe.toml"), dir.join("lock.toml")]
            .iter()
            .chain(&servers)
        {
            file.strip_prefix(&root).unwrap_or(file).hash(&mut hasher);
            fs::read(file)
                .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()))
                .hash(&mut hasher);
        }
        text += &format!("    ({name:?}, \"{:016x}\"),\n", hasher.finish());
    }
    text += "];\n";
    fs::write(&out, text).expect("writing the runtime table");
}

/// Every file under `dir`, recursively, without Python's bytecode caches.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("listing runtimes/_servers").path();
        if path.file_name().is_some_and(|n| n == "__pycache__") {
            continue;
        }
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
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
