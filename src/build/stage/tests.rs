//! Unit tests of the stage directory: round trip, mismatched records, planted FIFOs.

use super::*;
use crate::build::function::NamedBytes;
use crate::oci::{Content, EntryKind, LayerEntry, layer::write_layer};

fn inputs(manifest: &str) -> DepInputs {
    DepInputs {
        manifest: NamedBytes {
            name: "package.json".into(),
            bytes: manifest.as_bytes().to_vec(),
        },
        lock: None,
        configs: vec![NamedBytes {
            name: ".npmrc".into(),
            bytes: b"//reg/:_authToken=secret".to_vec(),
        }],
    }
}

/// A stage with a real (tiny) layer, and what a build of the same Function expects.
fn staged(dir: &Path, inputs: &DepInputs) -> Record {
    let entry = LayerEntry {
        path: "node_modules/x/index.js".into(),
        kind: EntryKind::File {
            content: Content::Bytes(b"module.exports = 1;\n".to_vec()),
            executable: false,
        },
    };
    let blob = write_layer(vec![entry], 0, MediaType::OciLayerGzip, dir).unwrap();
    let key = Digest::of(b"key");
    let record = Record {
        format: FORMAT.into(),
        runtime: "nodejs22".into(),
        epoch: 0,
        manifest_digest: Some(manifest_digest(inputs)),
        dependencies: Some(StagedLayer {
            created_by: created_by("npm install", &key),
            toolchain: None,
            key,
            media_type: MediaType::OciLayerGzip,
            digest: blob.descriptor.digest.clone(),
            diff_id: blob.diff_id.clone(),
            size: blob.descriptor.size,
            in_cache_repo: false,
        }),
    };
    write(&dir.join("stage"), &record, Some(&blob.file)).unwrap();
    record
}

fn expected(inputs: &DepInputs) -> Expected<'_> {
    Expected {
        runtime: "nodejs22",
        epoch: 0,
        inputs: Some(inputs),
        install_command: "npm install".into(),
        compression: crate::oci::Compression::Gzip,
    }
}

#[test]
fn a_written_stage_reads_back_verified_and_holds_no_registry_config() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = inputs("{}");
    let record = staged(dir.path(), &inputs);
    let text = std::fs::read_to_string(dir.path().join("stage").join(RECORD_FILE)).unwrap();
    assert!(
        !text.contains("secret") && !text.contains("npmrc"),
        "{text}"
    );
    let verified = read(&dir.path().join("stage"), &expected(&inputs), dir.path()).unwrap();
    assert_eq!(verified.record, record);
    let copy = std::fs::read(verified.blob.unwrap()).unwrap();
    assert_eq!(Digest::of(&copy), record.dependencies.unwrap().digest);
}

#[test]
fn a_record_of_another_build_is_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = inputs("{}");
    staged(dir.path(), &inputs);
    let stage = dir.path().join("stage");
    let other = self::inputs("{\"dependencies\":{}}");
    let cases = [
        (
            Expected {
                runtime: "nodejs24",
                ..expected(&inputs)
            },
            "runtime",
        ),
        (
            Expected {
                epoch: 7,
                ..expected(&inputs)
            },
            "SOURCE_DATE_EPOCH",
        ),
        (expected(&other), "dependency manifest digest"),
        (
            Expected {
                install_command: "npm ci".into(),
                ..expected(&inputs)
            },
            "history text",
        ),
    ];
    for (expected, field) in cases {
        let err = read(&stage, &expected, dir.path()).unwrap_err();
        assert!(
            matches!(&err, Error::Mismatch { field: f, .. } if *f == field),
            "{field}: {err}"
        );
    }
}

#[test]
fn a_fifo_in_place_of_the_blob_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = inputs("{}");
    staged(dir.path(), &inputs);
    let blob = dir.path().join("stage").join(BLOB_FILE);
    std::fs::remove_file(&blob).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &blob,
        rustix::fs::FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let err = read(&dir.path().join("stage"), &expected(&inputs), dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotRegular {
                kind: "a special file",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_lookup_reads_back_only_for_its_own_function_and_never_through_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = inputs("{}");
    let found = Found {
        digest: Digest::of(b"layer"),
        diff_id: Digest::of(b"tar"),
        size: 5,
    };
    let lookup = Lookup::new(
        "nodejs22",
        0,
        Some(&inputs),
        Some(Digest::of(b"key")),
        "registry.example/kiln-cache".into(),
        Some(found),
    );
    let at = dir.path().join("lookup");
    write_lookup(&at, &lookup).unwrap();
    let text = std::fs::read_to_string(at.join(LOOKUP_FILE)).unwrap();
    assert!(!text.contains("secret"), "{text}");
    assert_eq!(
        read_lookup(&at, "nodejs22", 0, Some(&inputs)).unwrap(),
        lookup
    );
    for (runtime, epoch, manifest, field) in [
        ("nodejs24", 0, "{}", "runtime"),
        ("nodejs22", 3, "{}", "SOURCE_DATE_EPOCH"),
        ("nodejs22", 0, "{\"x\":1}", "dependency manifest digest"),
    ] {
        let err = read_lookup(&at, runtime, epoch, Some(&self::inputs(manifest))).unwrap_err();
        assert!(
            matches!(&err, Error::Mismatch { field: f, .. } if *f == field),
            "{field}: {err}"
        );
    }
    let planted = dir.path().join("planted");
    std::fs::create_dir(&planted).unwrap();
    std::os::unix::fs::symlink(at.join(LOOKUP_FILE), planted.join(LOOKUP_FILE)).unwrap();
    let err = read_lookup(&planted, "nodejs22", 0, Some(&inputs)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotRegular {
                kind: "a symlink",
                ..
            }
        ),
        "{err}"
    );
}
