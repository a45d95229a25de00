//! Paths inside a root filesystem directory, resolved the way a process chrooted there would see
//! them: symlinks are followed by hand, absolute targets start again at the root, and a `..`
//! that would climb above the root is refused. The result names a host path whose directory
//! components are real directories, so writing there can never land outside the root.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed before a path counts as a loop (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Why a path cannot be resolved inside the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// The path, or a symlink on the way, climbs above the root with `..`.
    AboveRoot,
    /// Too many symlinks (a loop).
    Loop,
    /// The path is absolute or otherwise not a plain relative path.
    NotRelative,
}

/// Splits a relative archive path into its names, dropping `.` components. Absolute paths and
/// `..` components are refused.
pub fn normal_components(path: &Path) -> Result<Vec<OsString>, Escape> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => names.push(name.to_os_string()),
            Component::CurDir => {}
            Component::ParentDir => return Err(Escape::AboveRoot),
            Component::RootDir | Component::Prefix(_) => return Err(Escape::NotRelative),
        }
    }
    Ok(names)
}

/// Resolves the names `names` below `root`, following every symlink met on the way (the last
/// name too when `follow_last`). Names that do not exist yet are kept as they are.
pub fn resolve(root: &Path, names: &[OsString], follow_last: bool) -> Result<PathBuf, Escape> {
    let mut todo: VecDeque<(OsString, bool)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.clone(), follow_last || i + 1 < names.len()))
        .collect();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut followed = 0;
    while let Some((name, follow)) = todo.pop_front() {
        if name == ".." {
            resolved.pop().ok_or(Escape::AboveRoot)?;
            continue;
        }
        if name == "." {
            continue;
        }
        let host = root.join(resolved.iter().collect::<PathBuf>()).join(&name);
        let target = match fs::symlink_metadata(&host) {
            Ok(meta) if follow && meta.file_type().is_symlink() => fs::read_link(&host).ok(),
            _ => None,
        };
        let Some(target) = target else {
            resolved.push(name);
            continue;
        };
        followed += 1;
        if followed > MAX_SYMLINKS {
            return Err(Escape::Loop);
        }
        if target.is_absolute() {
            resolved.clear();
        }
        // The target's names replace this one and are followed like any other component (this
        // name was followed, so its replacement is too).
        let parts: Vec<OsString> = target
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                Component::ParentDir => Some(OsString::from("..")),
                _ => None,
            })
            .collect();
        for part in parts.into_iter().rev() {
            todo.push_front((part, true));
        }
    }
    Ok(root.join(resolved.iter().collect::<PathBuf>()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn names(path: &str) -> Vec<OsString> {
        normal_components(Path::new(path)).unwrap()
    }

    #[test]
    fn relative_and_absolute_symlinks_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("/usr/lib", root.join("abs")).unwrap();
        symlink("../lib/x", root.join("usr/rel")).unwrap();
        assert_eq!(
            resolve(root, &names("./lib/a.so"), false).unwrap(),
            root.join("usr/lib/a.so")
        );
        assert_eq!(
            resolve(root, &names("abs/a.so"), false).unwrap(),
            root.join("usr/lib/a.so")
        );
        assert_eq!(
            resolve(root, &names("usr/rel"), true).unwrap(),
            root.join("usr/lib/x")
        );
        assert_eq!(
            resolve(root, &names("usr/rel"), false).unwrap(),
            root.join("usr/rel")
        );
        assert_eq!(
            resolve(root, &names("new/dir/f"), false).unwrap(),
            root.join("new/dir/f")
        );
    }

    #[test]
    fn escapes_and_loops_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        symlink("../../..", root.join("up")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        assert_eq!(
            resolve(root, &names("up/etc/passwd"), false),
            Err(Escape::AboveRoot)
        );
        assert_eq!(resolve(root, &names("loop/x"), false), Err(Escape::Loop));
        assert_eq!(
            normal_components(Path::new("/etc/passwd")),
            Err(Escape::NotRelative)
        );
        assert_eq!(
            normal_components(Path::new("a/../../b")),
            Err(Escape::AboveRoot)
        );
        assert_eq!(
            names("./usr/./bin/"),
            [OsString::from("usr"), OsString::from("bin")]
        );
    }
}
