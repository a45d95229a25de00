//! The configs of the assembled images: the base's, the builder's (running kiln), and the
//! empty image both start from.

use std::collections::BTreeMap;

use super::super::recipe::Recipe;
use super::super::rootfs;
use super::KILN_IN_BUILDER;
use crate::oci::{Base, ConfigEdit, Document, MediaType, Platform};

/// The base image's config: the recipe's environment, user, working directory and
/// entrypoint, and labels naming the runtime, its SBOM and its binary interface (`abi`).
pub(super) fn config_edit(
    recipe: &Recipe,
    epoch: u64,
    sbom: &str,
    abi: &crate::runtime::abi::Abi,
) -> ConfigEdit {
    let created = crate::oci::rfc3339(epoch);
    let mut labels = BTreeMap::from([
        ("dev.kiln.runtime".to_string(), recipe.runtime.clone()),
        ("dev.kiln.sbom".to_string(), sbom.to_string()),
        (
            "org.opencontainers.image.created".to_string(),
            created.clone(),
        ),
        (
            "org.opencontainers.image.title".to_string(),
            format!("kiln {} runtime", recipe.runtime),
        ),
    ]);
    labels.extend(abi.labels());
    ConfigEdit {
        created,
        env: recipe
            .image
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        labels,
        user: Some(rootfs::IMAGE_UID.to_string()),
        working_dir: Some(recipe.image.workdir.clone()),
        entrypoint: Some(recipe.image.entrypoint.clone()),
        cmd: None,
        exposed_ports: vec!["8080/tcp".into()],
        annotations: BTreeMap::new(),
    }
}

/// The builder's config: the base's, but running kiln (a build Job runs `kiln build …` in it;
/// without arguments it prints `kiln build --help`) in `/tmp`, and `KILN_BUILDER` telling
/// `kiln build --deps-sandbox auto` that the toolchain is right here.
pub(super) fn builder_edit(mut edit: ConfigEdit, recipe: &Recipe) -> ConfigEdit {
    edit.entrypoint = Some(vec![KILN_IN_BUILDER.into()]);
    edit.cmd = Some(vec!["build".into(), "--help".into()]);
    // The base's working directory (the Function's) exists only once a Function is built on
    // it; /tmp exists, is the user's HOME and the one writable place under a read-only root.
    edit.working_dir = Some("/tmp".into());
    edit.env
        .push(("KILN_BUILDER".into(), recipe.runtime.clone()));
    edit
}

/// The kiln image's config: kiln as the entrypoint (`kiln controller …`, `kiln webhook …`),
/// as the nonroot user 65532 of distroless images, which the Deployments in deploy/ run as.
pub(super) fn kiln_edit(epoch: u64) -> ConfigEdit {
    let created = crate::oci::rfc3339(epoch);
    let labels = BTreeMap::from([
        (
            "org.opencontainers.image.created".to_string(),
            created.clone(),
        ),
        (
            "org.opencontainers.image.title".to_string(),
            "kiln".to_string(),
        ),
        (
            "org.opencontainers.image.version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ]);
    ConfigEdit {
        created,
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        labels,
        user: Some("65532:65532".into()),
        working_dir: Some("/tmp".into()),
        entrypoint: Some(vec![KILN_IN_BUILDER.into()]),
        cmd: Some(vec!["--help".into()]),
        exposed_ports: Vec::new(),
        annotations: BTreeMap::new(),
    }
}

/// An empty image for `platform` to append the first layers to.
pub(super) fn scratch(platform: &Platform) -> Base {
    let config = format!(
        r#"{{"architecture":"{}","os":"{}","rootfs":{{"type":"layers","diff_ids":[]}}}}"#,
        platform.architecture, platform.os
    )
    .into_bytes();
    let config = Document::new(MediaType::OciConfig, config);
    let manifest = format!(
        "{{\"schemaVersion\":2,\"mediaType\":\"{}\",\"config\":{{\"mediaType\":\"{}\",\"digest\":\
            \"{}\",\"size\":{}}},\"layers\":[]}}",
        MediaType::OciManifest,
        MediaType::OciConfig,
        config.digest,
        config.bytes.len()
    );
    Base {
        manifest: Document::new(MediaType::OciManifest, manifest.into_bytes()),
        config,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_builder_runs_kiln_while_the_base_keeps_the_function_server() {
        let (recipe, _) = crate::base::recipe::embedded("python313").unwrap();
        let base = config_edit(&recipe, 0, "", &Default::default());
        let builder = builder_edit(base.clone(), &recipe);
        assert_eq!(base.entrypoint, Some(recipe.image.entrypoint.clone()));
        assert_eq!(base.cmd, None);
        assert_eq!(builder.entrypoint, Some(vec!["/usr/local/bin/kiln".into()]));
        assert_eq!(builder.cmd, Some(vec!["build".into(), "--help".into()]));
        assert_eq!(builder.working_dir.as_deref(), Some("/tmp"));
        assert!(
            builder
                .env
                .contains(&("KILN_BUILDER".into(), "python313".into()))
        );
        assert!(!base.env.iter().any(|(k, _)| k == "KILN_BUILDER"));
    }
}
