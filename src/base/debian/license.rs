//! License names of an unpacked package, read from its machine-readable (DEP-5)
//! `usr/share/doc/<package>/copyright`. Only the short names are taken (the first line of each
//! `License:` field, split at `and`/`or`); a free-form copyright file yields nothing rather than
//! a guess.
//! Spec: <https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/>.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::control;
use crate::rootpath::{self, Last};

/// The distinct `License:` short names of a DEP-5 copyright file, sorted, with expressions
/// split into their names; empty when the file is not in the machine-readable format.
pub fn parse_licenses(copyright: &str) -> Vec<String> {
    let mut paragraphs = control::paragraphs(copyright).peekable();
    let is_dep5 = paragraphs
        .peek()
        .and_then(|header| header.get("Format"))
        .is_some_and(|format| format.contains("copyright-format"));
    if !is_dep5 {
        return Vec::new();
    }
    let names: BTreeSet<String> = paragraphs
        .filter_map(|p| Some(p.get("License")?.lines().next()?.to_string()))
        .flat_map(|expression| split_expression(&expression))
        .collect();
    names.into_iter().collect()
}

/// Splits a DEP-5 license expression (`GPL-2+ or Artistic, and BSD-3-clause`) into its short
/// names; an exception clause stays with its license (`GPL-2+ with OpenSSL exception`).
fn split_expression(expression: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for word in expression.split_whitespace() {
        if word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or") {
            names.push(current.join(" "));
            current.clear();
        } else {
            current.push(word.trim_end_matches(','));
        }
    }
    names.push(current.join(" "));
    names.retain(|name| !name.is_empty());
    names
}

/// The license short names of `package` as unpacked in `rootfs` (see [`parse_licenses`]);
/// empty when the copyright file is missing, unreadable or free-form. The path is resolved
/// inside `rootfs`, so a doc directory that is a symlink to another package's is followed.
pub fn licenses(rootfs: &Path, package: &str) -> Vec<String> {
    if package.is_empty() || package.contains('/') || package.starts_with('.') {
        return Vec::new();
    }
    let names: PathBuf = ["usr", "share", "doc", package, "copyright"]
        .iter()
        .collect();
    let Ok(path) = rootpath::resolve(rootfs, &names, Last::Follow) else {
        return Vec::new();
    };
    fs::read_to_string(path)
        .map(|text| parse_licenses(&text))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP5: &str = "\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: example
Source: https://example.invalid/

Files: *
Copyright: 2001 Someone
License: PSF-2
 The long text of the license
 continues here.

Files: debian/*
Copyright: 2020 Someone Else
License: GPL-2+

Files: Modules/_decimal/*
Copyright: 2008 Stefan Krah
License: BSD-2-clause

Files: Lib/ssl.py
Copyright: 2010 Someone
License: GPL-2+ with OpenSSL exception or PSF-2, and BSD-2-clause

License: GPL-2+
 On Debian systems, see /usr/share/common-licenses/GPL-2.

License: PSF-2
 PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2
";

    #[test]
    fn dep5_license_short_names_are_collected_once_each() {
        assert_eq!(
            parse_licenses(DEP5),
            [
                "BSD-2-clause",
                "GPL-2+",
                "GPL-2+ with OpenSSL exception",
                "PSF-2"
            ]
        );
    }

    #[test]
    fn free_form_copyright_files_give_no_names() {
        let text = "This package was debianized by someone.\n\nLicense: GPL\n";
        assert!(parse_licenses(text).is_empty());
    }

    #[test]
    fn licenses_are_read_from_the_rootfs_through_doc_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let doc = dir.path().join("usr/share/doc");
        fs::create_dir_all(doc.join("libpython3.13-stdlib")).unwrap();
        fs::write(doc.join("libpython3.13-stdlib/copyright"), DEP5).unwrap();
        std::os::unix::fs::symlink("libpython3.13-stdlib", doc.join("python3.13")).unwrap();
        assert_eq!(licenses(dir.path(), "python3.13"), parse_licenses(DEP5));
        assert!(licenses(dir.path(), "absent").is_empty());
        assert!(licenses(dir.path(), "../etc").is_empty());
    }
}
