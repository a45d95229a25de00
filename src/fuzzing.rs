//! Entry points for the `cargo fuzz` targets in `fuzz/` (not an API: hidden from the docs).
//! Each takes untrusted bytes the way kiln meets them and checks what must always hold
//! beyond "no panic": a printed reference parses back to itself, an unpacked layer writes
//! nothing outside its root.

use std::path::Path;

use crate::oci::{Document, Index, MediaType, sniff_media_type};
use crate::registry::Reference;
use crate::runtime::Language;

/// A `WWW-Authenticate` header value.
pub fn challenge(header: &[u8]) {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(value) = reqwest::header::HeaderValue::from_bytes(header) {
        headers.append(reqwest::header::WWW_AUTHENTICATE, value);
        let _ = crate::registry::challenge_from_headers(&headers);
    }
}

/// An image reference (`--image`, `--base`, `kiln run`'s argument): whatever parses prints as
/// a reference that parses back to the same thing.
pub fn reference(text: &str) {
    if let Ok(r) = text.parse::<Reference>() {
        let printed = r.to_string();
        let again: Reference = printed
            .parse()
            .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which fails: {e}"));
        assert_eq!(again, r, "{text:?} -> {printed:?}");
    }
    let _ = text.parse::<crate::run::ImageRef>();
    let _ = crate::image::resolve::BaseRef::parse(text);
}

/// A manifest (or index) and a config from a registry: media-type sniffing, index parsing and
/// platform selection, and the image checks kiln runs before it trusts a base.
pub fn documents(manifest: &[u8], config: &[u8]) {
    let kind = sniff_media_type(manifest).unwrap_or(MediaType::OciManifest);
    let manifest = Document::new(kind, manifest.to_vec());
    let config = Document::new(MediaType::OciConfig, config.to_vec());
    if let Ok(index) = manifest.parse::<Index>() {
        let _ = index.select(&crate::oci::Platform::linux_amd64());
    }
    let _ = crate::oci::validate::check_image(&manifest, &config);
}

/// Debian index files: a Release, a Packages index, control paragraphs, relation fields,
/// versions, copyright files.
pub fn debian(text: &str) {
    use crate::base::debian;
    let _ = debian::Release::parse(text);
    let _ = debian::PackageIndex::parse(text);
    let _ = debian::parse_licenses(text);
    for line in text.lines() {
        let _ = debian::parse_relations(line);
        if let (Ok(a), Ok(b)) = (
            line.parse::<debian::Version>(),
            text.lines()
                .next()
                .unwrap_or_default()
                .parse::<debian::Version>(),
        ) {
            // A total order: never both less and greater.
            assert!(!(a < b && b < a));
        }
    }
}

/// A Function's `requirements.txt` or `package.json`, through every check a build runs.
pub fn dependency_manifest(text: &str) {
    for (language, file) in [
        (Language::Python, "requirements.txt"),
        (Language::Nodejs, "package.json"),
    ] {
        let valid = crate::runtime::validate_manifest(language, file, text).is_ok();
        let _ = crate::runtime::check_registry_only(language, file, text);
        if valid {
            let _ = crate::runtime::has_dependencies(language, text);
        }
    }
}

/// A layer blob (tar, gzip or zstd) unpacked into a fresh root inside a scratch directory:
/// whatever it holds, nothing appears outside the root.
pub fn unpack(layer: &[u8]) {
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let root = scratch.path().join("root");
    std::fs::create_dir(&root).expect("the root");
    let mut unpacker = crate::run::unpack::Unpacker::with_limit(&root, 1 << 20);
    let _ = unpacker.apply(layer);
    let _ = unpacker.finish();
    let outside: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("the scratch directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n != "root")
        .collect();
    assert!(outside.is_empty(), "written outside the root: {outside:?}");
    make_writable(&root);
}

/// A Function's `package.json` and `package-lock.json`, and an npm tarball, as kiln's own
/// lock-file install meets them: whatever the lock says, a planned package's place and its
/// bins stay inside `node_modules`; whatever the tarball holds, its files land below the
/// package and nowhere else on disk but the scratch directory.
pub fn npm_lock(manifest: &[u8], lock: &[u8], tarball: &[u8]) {
    use crate::build::function::{DepInputs, NamedBytes};
    let named = |name: &str, bytes: &[u8]| NamedBytes {
        name: name.into(),
        bytes: bytes.to_vec(),
    };
    let inputs = DepInputs {
        manifest: named("package.json", manifest),
        lock: Some(named("package-lock.json", lock)),
        configs: vec![],
    };
    let runtime = crate::runtime::Catalog::embedded()
        .get("nodejs22")
        .expect("the nodejs22 runtime")
        .clone();
    let clean = clean_path;
    let platform = crate::oci::Platform::linux_amd64();
    // The registry-only check of the lock, on whatever it is given.
    let registry = ["registry.npmjs.org:443".to_string()];
    let text = String::from_utf8_lossy(lock);
    let _ = crate::runtime::check_lock_registry_only("package-lock.json", &text, &registry);
    if let Ok(plan) = crate::build::lockfile::plan(&runtime, &inputs, &platform) {
        for (path, bins) in plan.paths() {
            assert!(clean(path), "package path {path:?}");
            for (name, target) in bins {
                assert!(clean(name) && !name.contains('/'), "bin name {name:?}");
                assert!(clean(target), "bin target {target:?}");
            }
        }
    }
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let tgz = scratch.path().join("package.tgz");
    std::fs::write(&tgz, tarball).expect("the tarball");
    let spill = scratch.path().join("spill");
    if let Ok(paths) = crate::build::lockfile::unpack_for_checks(&tgz, &spill) {
        for path in paths {
            assert!(
                path.starts_with("p/") && clean(&path),
                "unpacked to {path:?}"
            );
        }
    }
    nothing_else_in(scratch.path(), &["package.tgz", "spill"]);
}

/// A Function's requirements.txt, a wheel's `METADATA` and a wheel, as kiln's own install of
/// pinned requirements meets them: parsing a requirements file, PEP 440 versions, specifiers
/// and markers never panics and versions order consistently; whatever the wheel holds, its
/// files land below the target directory and nowhere else on disk but the scratch files.
pub fn pinned_wheel(requirements: &[u8], metadata: &[u8], wheel: &[u8]) {
    use crate::build::function::{DepInputs, NamedBytes};
    use crate::build::pep440;
    let inputs = DepInputs {
        manifest: NamedBytes {
            name: "requirements.txt".into(),
            bytes: requirements.to_vec(),
        },
        lock: None,
        configs: vec![],
    };
    let runtime = crate::runtime::Catalog::embedded()
        .get("python313")
        .expect("the python313 runtime")
        .clone();
    let _ = crate::build::pinned::plan(&runtime, &inputs, &crate::oci::Platform::linux_amd64());
    let text = String::from_utf8_lossy(metadata);
    let env = pep440::Environment {
        python_full_version: "3.13.5".into(),
        machine: "x86_64".into(),
        extra: "socks".into(),
    };
    let mut versions = Vec::new();
    for (_, value) in crate::build::pinned::headers(&text) {
        if let Ok(dep) = pep440::dependency(&value)
            && let Some(marker) = &dep.marker
        {
            let _ = pep440::marker_holds(marker, &env);
        }
        let _ = pep440::marker_holds(&value, &env);
        if let Ok(v) = pep440::Version::parse(&value) {
            let _ = pep440::satisfies(&v, &value);
            versions.push(v);
        }
    }
    for a in &versions {
        for b in &versions {
            assert_eq!(
                a.partial_cmp(b),
                b.partial_cmp(a).map(std::cmp::Ordering::reverse),
                "{a:?} and {b:?} order both ways"
            );
        }
    }
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let whl = scratch.path().join("fuzz.whl");
    std::fs::write(&whl, wheel).expect("the wheel");
    let spill = scratch.path().join("spill");
    if let Ok(paths) = crate::build::pinned::unpack_for_checks(&whl, &spill) {
        for path in paths {
            assert!(clean_path(&path), "installed as {path:?}");
        }
    }
    nothing_else_in(scratch.path(), &["fuzz.whl", "spill"]);
}

/// A relative `/`-separated path of plain steps (no empty, `.` or `..` step).
fn clean_path(p: &str) -> bool {
    !p.is_empty() && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Asserts that `dir` holds only the entries named `expected`.
fn nothing_else_in(dir: &Path, expected: &[&str]) {
    let outside: Vec<_> = std::fs::read_dir(dir)
        .expect("the scratch directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| !expected.iter().any(|x| n == x))
        .collect();
    assert!(
        outside.is_empty(),
        "written outside the scratch files: {outside:?}"
    );
}

/// Unpacked directories may be read-only; the scratch directory must still be removable.
fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}

/// Runs `target`'s entry point over one input, as its fuzz target does.
pub fn run(target: &str, data: &[u8]) {
    let text = || std::str::from_utf8(data).ok();
    match target {
        "unpack" => unpack(data),
        "challenge" => challenge(data),
        "documents" => {
            let (manifest, config) = match data.iter().position(|&b| b == 0) {
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (data, &b"{}"[..]),
            };
            documents(manifest, config);
        }
        "reference" => text().map_or((), reference),
        "debian" => text().map_or((), debian),
        "dependency_manifest" => text().map_or((), dependency_manifest),
        "npm_lock" => {
            // package.json, NUL, package-lock.json, NUL, the tarball.
            let mut parts = data.splitn(3, |&b| b == 0);
            let (manifest, lock) = (parts.next().unwrap_or_default(), parts.next());
            npm_lock(
                manifest,
                lock.unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
        }
        "pinned_wheel" => {
            // requirements.txt, NUL, METADATA, NUL, the wheel.
            let mut parts = data.splitn(3, |&b| b == 0);
            let (requirements, metadata) = (parts.next().unwrap_or_default(), parts.next());
            pinned_wheel(
                requirements,
                metadata.unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
        }
        other => panic!("no fuzz target {other}"),
    }
}

#[cfg(test)]
mod tests {
    /// The committed seeds and past findings (`fuzz/seeds/TARGET/`) pass every target's
    /// checks on every build, without nightly: a regression of a fixed finding fails here.
    #[test]
    fn every_seed_and_past_finding_passes() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        let mut count = 0;
        for target in std::fs::read_dir(&seeds).expect("fuzz/seeds") {
            let target = target.expect("a seed directory").path();
            let name = target
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            for seed in std::fs::read_dir(&target).expect("seeds") {
                let seed = seed.expect("a seed").path();
                let data = std::fs::read(&seed).expect("a seed file");
                super::run(&name, &data);
                count += 1;
            }
        }
        assert!(count >= 20, "{count} seeds");
    }
}
