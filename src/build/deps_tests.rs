//! Tests of `build::deps`.
use super::*;

#[test]
fn a_toolchain_on_path_that_is_not_the_runtimes_is_refused() {
    let runtime = crate::runtime::Catalog::embedded()
        .get("nodejs22")
        .unwrap()
        .clone();
    assert!(check_toolchain(&runtime, "v22.11.0\n10.9.0\n").is_ok());
    let err = check_toolchain(&runtime, "v20.20.2\n11.19.1\n").unwrap_err();
    assert!(
        matches!(&err, Error::ToolchainMismatch { found, .. } if found == "v20.20.2"),
        "{err}"
    );
}

#[test]
fn the_cache_key_changes_with_every_input_but_never_holds_the_config() {
    use super::super::function::NamedBytes;
    let runtime = crate::runtime::Catalog::embedded()
        .get("nodejs22")
        .unwrap()
        .clone();
    let nb = |n: &str, b: &str| NamedBytes {
        name: n.into(),
        bytes: b.as_bytes().to_vec(),
    };
    let base = DepInputs {
        manifest: nb("package.json", "{}"),
        lock: None,
        configs: vec![],
    };
    let k0 = cache_key(&runtime, "v22", &base, 0, crate::oci::Compression::Gzip);
    assert_eq!(
        k0,
        cache_key(&runtime, "v22", &base, 0, crate::oci::Compression::Gzip)
    );
    assert_ne!(
        k0,
        cache_key(&runtime, "v24", &base, 0, crate::oci::Compression::Gzip)
    );
    let with_lock = DepInputs {
        lock: Some(nb("package-lock.json", "{}")),
        ..base.clone()
    };
    assert_ne!(
        k0,
        cache_key(
            &runtime,
            "v22",
            &with_lock,
            0,
            crate::oci::Compression::Gzip
        )
    );
    assert_ne!(
        k0,
        cache_key(&runtime, "v22", &base, 1, crate::oci::Compression::Gzip)
    );
    assert_ne!(
        k0,
        cache_key(&runtime, "v22", &base, 0, crate::oci::Compression::Zstd)
    );
    let with_npmrc = DepInputs {
        configs: vec![nb(".npmrc", "token")],
        ..base
    };
    assert_ne!(
        k0,
        cache_key(
            &runtime,
            "v22",
            &with_npmrc,
            0,
            crate::oci::Compression::Gzip
        )
    );
}
