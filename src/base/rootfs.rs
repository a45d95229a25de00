//! What Debian's maintainer scripts would have done, done by hand for a distroless root
//! filesystem: users and groups, name service config, the CA bundle (update-ca-certificates),
//! OpenSSL's certificate paths, the time zone, interpreter links, and trimming documentation
//! (copyright files stay, for the licenses).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// The image user (`USER 1000`, as Kyma's runtime images).
pub const IMAGE_UID: u32 = 1000;

/// Why synthesising failed: a file-system operation.
pub use crate::io_error::IoError as Error;

fn err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    crate::io_error::IoError::at(action, path)
}

fn write(root: &Path, rel: &str, text: &str) -> Result<(), Error> {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(err("creating", parent))?;
    }
    fs::write(&path, text).map_err(err("writing", &path))
}

fn link(root: &Path, rel: &str, target: &str) -> Result<(), Error> {
    let path = root.join(rel);
    if fs::symlink_metadata(&path).is_ok() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(err("creating", parent))?;
    }
    symlink(target, &path).map_err(err("linking", &path))
}

/// Adds the files every kiln base image has.
///
/// # Errors
/// File system trouble.
pub fn synthesize(root: &Path) -> Result<(), Error> {
    write(
        root,
        "etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/\
                usr/sbin/nologin\napp:x:{IMAGE_UID}:{IMAGE_UID}:function:/tmp:/usr/sbin/nologin\n\
                nonroot:x:65532:65532:kiln:/tmp:/usr/sbin/nologin\n"
        ),
    )?;
    write(
        root,
        "etc/group",
        &format!("root:x:0:\nnogroup:x:65534:\napp:x:{IMAGE_UID}:\nnonroot:x:65532:\n"),
    )?;
    write(
        root,
        "etc/nsswitch.conf",
        "passwd: files\ngroup: files\nhosts: files dns\n",
    )?;
    write(
        root,
        "etc/hosts",
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    )?;
    fs::create_dir_all(root.join("tmp")).map_err(err("creating", &root.join("tmp")))?;
    fs::create_dir_all(root.join("root")).map_err(err("creating", &root.join("root")))?;
    ca_bundle(root)?;
    if root.join("usr/share/zoneinfo/Etc/UTC").exists() {
        link(root, "etc/localtime", "/usr/share/zoneinfo/Etc/UTC")?;
        write(root, "etc/timezone", "Etc/UTC\n")?;
    }
    if let Some(python) = versioned_python(root)? {
        link(root, "usr/bin/python3", &python)?;
    }
    if root.join("usr/bin/dash").exists() {
        link(root, "usr/bin/sh", "dash")?;
    }
    trim_docs(root)
}

/// The one `python3.N` interpreter in `usr/bin`, which `python3` links to (python3-minimal
/// would have made the link; the recipe's Debian packages name the version).
fn versioned_python(root: &Path) -> Result<Option<String>, Error> {
    let bin = root.join("usr/bin");
    let Ok(entries) = fs::read_dir(&bin) else {
        return Ok(None);
    };
    let mut found: Vec<String> = Vec::new();
    for entry in entries {
        let name = entry.map_err(err("reading", &bin))?.file_name();
        let name = name.to_string_lossy();
        let minor = name.strip_prefix("python3.");
        if minor.is_some_and(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit())) {
            found.push(name.into_owned());
        }
    }
    Ok(match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    })
}

/// The builder's extra packages: only the links their scripts would have made.
///
/// # Errors
/// File system trouble.
pub fn synthesize_builder(root: &Path) -> Result<(), Error> {
    if root.join("usr/bin/dash").exists() {
        link(root, "usr/bin/sh", "dash")?;
    }
    trim_docs(root)
}

/// Concatenates the CA certificates in sorted order (what `update-ca-certificates` builds)
/// and points OpenSSL's default paths at them.
fn ca_bundle(root: &Path) -> Result<(), Error> {
    let dir = root.join("usr/share/ca-certificates");
    if !dir.is_dir() {
        return Ok(());
    }
    let mut certs = Vec::new();
    collect_crts(&dir, &mut certs)?;
    certs.sort();
    let mut bundle = String::new();
    for cert in &certs {
        let text = fs::read_to_string(cert).map_err(err("reading", cert))?;
        bundle.push_str(text.trim_end());
        bundle.push('\n');
    }
    write(root, "etc/ssl/certs/ca-certificates.crt", &bundle)?;
    link(
        root,
        "usr/lib/ssl/cert.pem",
        "/etc/ssl/certs/ca-certificates.crt",
    )?;
    link(root, "usr/lib/ssl/certs", "/etc/ssl/certs")
}

fn collect_crts(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    for entry in fs::read_dir(dir).map_err(err("reading", dir))? {
        let path = entry.map_err(err("reading", dir))?.path();
        if path.is_dir() {
            collect_crts(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "crt") {
            out.push(path);
        }
    }
    Ok(())
}

/// Drops manuals, info pages and everything in `/usr/share/doc` but the copyright files.
fn trim_docs(root: &Path) -> Result<(), Error> {
    for rel in [
        "usr/share/man",
        "usr/share/info",
        "usr/share/lintian",
        "usr/share/bug",
    ] {
        let path = root.join(rel);
        if path.exists() {
            fs::remove_dir_all(&path).map_err(err("removing", &path))?;
        }
    }
    let docs = root.join("usr/share/doc");
    let Ok(entries) = fs::read_dir(&docs) else {
        return Ok(());
    };
    for entry in entries {
        let pkg = entry.map_err(err("reading", &docs))?.path();
        if !pkg.is_dir() || pkg.is_symlink() {
            continue;
        }
        for file in fs::read_dir(&pkg).map_err(err("reading", &pkg))? {
            let file = file.map_err(err("reading", &pkg))?.path();
            if file.file_name().is_some_and(|n| n != "copyright") {
                let removed = if file.is_dir() && !file.is_symlink() {
                    fs::remove_dir_all(&file)
                } else {
                    fs::remove_file(&file)
                };
                removed.map_err(err("removing", &file))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthesis_builds_the_ca_bundle_in_order_and_keeps_only_copyright_docs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "usr/share/ca-certificates/mozilla/B.crt",
            "-----B-----\n",
        )
        .unwrap();
        write(
            root,
            "usr/share/ca-certificates/mozilla/A.crt",
            "-----A-----",
        )
        .unwrap();
        write(root, "usr/share/doc/libc6/copyright", "License: LGPL").unwrap();
        write(root, "usr/share/doc/libc6/changelog.Debian.gz", "x").unwrap();
        write(root, "usr/share/man/man1/x.1", "x").unwrap();
        synthesize(root).unwrap();
        assert_eq!(
            fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap(),
            "-----A-----\n-----B-----\n"
        );
        assert!(root.join("usr/share/doc/libc6/copyright").exists());
        assert!(
            !root
                .join("usr/share/doc/libc6/changelog.Debian.gz")
                .exists()
        );
        assert!(!root.join("usr/share/man").exists());
        assert!(
            fs::read_to_string(root.join("etc/passwd"))
                .unwrap()
                .contains(":1000:1000:")
        );
        assert_eq!(
            fs::read_link(root.join("usr/lib/ssl/cert.pem")).unwrap(),
            Path::new("/etc/ssl/certs/ca-certificates.crt")
        );
    }
}
