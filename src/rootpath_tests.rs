use super::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};

#[test]
fn member_names_are_cleaned_as_tar_and_containerd_clean_them() {
    let m = |s: &str| member(Path::new(s)).unwrap();
    assert_eq!(m("./a/./b"), Path::new("a/b"));
    assert_eq!(m("./"), Path::new(""));
    assert_eq!(m("/"), Path::new(""));
    assert_eq!(m("."), Path::new(""));
    assert_eq!(m("/etc/passwd"), Path::new("etc/passwd"));
    assert_eq!(m("a/../b"), Path::new("b"));
    for bad in ["..", "../x", "a/../../b", "/../etc", "./.."] {
        assert!(
            matches!(member(Path::new(bad)), Err(Error::AboveRoot(_))),
            "{bad}"
        );
    }
}

#[test]
fn symlinks_resolve_inside_the_root_never_outside() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    symlink("/usr/lib", root.join("abs")).unwrap();
    symlink("../../../../etc", root.join("usr/lib/up")).unwrap();
    symlink("loop", root.join("loop")).unwrap();
    let r = |p: &str, last| resolve(root, Path::new(p), last).unwrap();
    assert_eq!(r("lib/x", Last::Follow), root.join("usr/lib/x"));
    assert_eq!(r("abs/x", Last::Follow), root.join("usr/lib/x"));
    assert_eq!(
        r("usr/lib/up/passwd", Last::Follow),
        root.join("etc/passwd")
    );
    assert_eq!(r("/lib", Last::Keep), root.join("lib"));
    assert_eq!(r("lib", Last::Follow), root.join("usr/lib"));
    assert_eq!(r("missing/a/b", Last::Follow), root.join("missing/a/b"));
    assert!(matches!(
        resolve(root, Path::new("loop/x"), Last::Follow),
        Err(Error::SymlinkLoop(_))
    ));
}

#[test]
fn an_archives_own_links_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    symlink("/", root.join("evil")).unwrap();
    let own: HashSet<PathBuf> = [root.join("evil")].into();
    let err = resolve_for(root, Path::new("evil/etc"), Last::Follow, &own).unwrap_err();
    assert!(
        matches!(&err, Error::ThroughOwnLink { link, .. } if link == Path::new("evil")),
        "{err}"
    );
    // The link itself may be replaced, and a lower layer's link is followed.
    assert_eq!(
        resolve_for(root, Path::new("evil"), Last::Keep, &own).unwrap(),
        root.join("evil")
    );
    assert_eq!(
        resolve(root, Path::new("evil/etc"), Last::Follow).unwrap(),
        root.join("etc")
    );
}

#[test]
fn a_source_tree_refuses_what_leaves_it_through_the_real_tree() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fn");
    fs::create_dir_all(root.join("d")).unwrap();
    // Each link alone stays lexically inside; together they climb out.
    symlink("..", root.join("d/up")).unwrap();
    symlink("d/up/d/up/..", root.join("e")).unwrap();
    symlink("/etc", root.join("abs")).unwrap();
    symlink("d/up/d", root.join("fine")).unwrap();
    let err = resolve_beneath(&root, Path::new("e"), Last::Follow).unwrap_err();
    assert!(matches!(err, Error::Leaves { .. }), "{err}");
    let err = resolve_beneath(&root, Path::new("abs/passwd"), Last::Follow).unwrap_err();
    assert!(matches!(err, Error::Leaves { .. }), "{err}");
    assert_eq!(
        resolve_beneath(&root, Path::new("fine"), Last::Follow).unwrap(),
        root.join("d")
    );
}

#[test]
fn open_beneath_reads_files_and_refuses_any_symlink_on_the_way() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fn");
    fs::create_dir_all(root.join("d")).unwrap();
    fs::write(root.join("d/f"), "inside").unwrap();
    fs::write(dir.path().join("secret"), "host").unwrap();
    symlink("../secret", root.join("d/leaf")).unwrap();
    symlink("..", root.join("parent")).unwrap();
    let read = |p: &str| {
        let mut s = String::new();
        io::Read::read_to_string(&mut open_beneath(&root, Path::new(p))?, &mut s)?;
        Ok::<_, io::Error>(s)
    };
    assert_eq!(read("d/f").unwrap(), "inside");
    assert!(read("d/leaf").is_err());
    assert!(read("parent/secret").is_err());
    assert!(read("../secret").is_err());
    assert!(read("d").is_err(), "a directory is not a file");
}

/// A tiny deterministic generator, so the property tests need no extra crate and a failure
/// repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }

    /// A path of 1–5 parts drawn from names, `..`, `.` and `/`, sometimes absolute.
    fn path(&mut self) -> String {
        let parts = ["a", "b", "c", "l1", "l2", "..", ".", "", "x"];
        let n = 1 + self.next() % 5;
        let body: Vec<&str> = (0..n).map(|_| self.pick(&parts)).collect();
        let lead = if self.next().is_multiple_of(4) {
            "/"
        } else {
            ""
        };
        let path = format!("{lead}{}", body.join("/"));
        if path.is_empty() { ".".into() } else { path }
    }
}

/// A random tree under `root`: directories `a`, `a/b`, `c`, files, and symlinks `l1`, `l2`
/// at random places with random targets (absolute, `..`-laden, chains, loops).
fn random_tree(rng: &mut Rng, root: &Path) {
    for d in ["a/b", "c"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("a/x"), "x").unwrap();
    fs::write(root.join("c/x"), "x").unwrap();
    for link in ["l1", "l2", "a/l1", "a/b/l2", "c/l2"] {
        if !rng.next().is_multiple_of(3) {
            symlink(rng.path(), root.join(link)).unwrap();
        }
    }
}

/// The (device, inode) the kernel reaches from `root` with chroot semantics.
fn kernel_in_root(root: &Path, path: &Path) -> Option<(u64, u64)> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let dir = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).ok()?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::PATH,
        Mode::empty(),
        ResolveFlags::IN_ROOT,
    )
    .ok()?;
    let meta = File::from(fd).metadata().ok()?;
    Some((meta.dev(), meta.ino()))
}

fn dev_ino(path: &Path) -> Option<(u64, u64)> {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[test]
fn property_nothing_ever_resolves_outside_the_root() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..300 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        // A decoy next to the root that an escape would reach.
        fs::create_dir_all(dir.path().join("a/b")).unwrap();
        random_tree(&mut rng, &root);
        for _ in 0..20 {
            let path = rng.path();
            let p = Path::new(&path);
            // Member names: refused, or plain relative names.
            if let Ok(name) = member(p) {
                assert!(
                    name.components().all(|c| matches!(c, Component::Normal(_))),
                    "case {case}: member({path}) = {name:?}"
                );
            }
            // Chroot semantics: always under the root, and the same object the kernel finds.
            match resolve(&root, p, Last::Follow) {
                Ok(host) => {
                    let rel = host.strip_prefix(&root).expect("under the root");
                    assert!(
                        rel.components().all(|c| matches!(c, Component::Normal(_))),
                        "case {case}: resolve({path}) = {host:?}"
                    );
                    // Where the kernel finds something, it is what `resolve` names (a
                    // missing component, which the kernel refuses, is taken literally).
                    if let Some(found) = kernel_in_root(&root, p) {
                        assert_eq!(
                            dev_ino(&host),
                            Some(found),
                            "case {case}: resolve({path}) = {host:?} differs from RESOLVE_IN_ROOT"
                        );
                    }
                }
                Err(Error::SymlinkLoop(_)) => {}
                Err(e) => panic!("case {case}: resolve({path}): {e}"),
            }
            // Source trees: refused, or the host's own resolution, inside the tree.
            if !p.is_absolute()
                && let Ok(host) = resolve_beneath(&root, p, Last::Follow)
            {
                assert!(host.starts_with(&root), "case {case}: {path} -> {host:?}");
                if let Ok(real) = fs::canonicalize(root.join(p)) {
                    assert_eq!(
                        real,
                        fs::canonicalize(&host).unwrap(),
                        "case {case}: {path}"
                    );
                    assert!(real.starts_with(fs::canonicalize(&root).unwrap()));
                }
            }
        }
    }
}

#[test]
fn read_beneath_reads_up_to_its_limit_and_refuses_past_it() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("small"), b"0123456789").unwrap();
    let read = |limit| read_beneath(root.path(), Path::new("small"), limit);
    assert_eq!(read(10).unwrap(), b"0123456789");
    let e = read(9).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    assert!(e.to_string().contains("over 9 bytes"), "{e}");
}
