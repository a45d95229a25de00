//! Which `runtimeImageOverride` the controller may pull. The build Job pulls the base with the
//! platform's push credentials, so an override on the platform's own registry must name an
//! image the Function's namespace could read anyway: one of its own (`<registry>/<namespace>/…`)
//! or a runtime image the platform configured. Otherwise a tenant could have another tenant's
//! image (or any private image the push account reads) pulled into its own, and read it there.
//! An image on any other registry is pulled as it is today.

use super::config::Config;
use crate::registry::Reference;

/// Whether `f`'s namespace may build on `reference` ([`self`]).
///
/// # Errors
/// Why not, for the Function's status.
pub fn check(reference: &str, config: &Config, namespace: &str) -> Result<(), String> {
    let parsed: Reference = reference.parse().map_err(|e| {
        format!("runtimeImageOverride {reference:?} is not an image reference: {e}")
    })?;
    let image = format!("{}/{}", parsed.registry, parsed.repository);
    let platform = [
        Some(config.registry.as_str()),
        config.pull_registry.as_deref(),
    ];
    let on_platform = platform.iter().flatten().any(|r| {
        let host = r.split('/').next().unwrap_or(r);
        host.eq_ignore_ascii_case(&parsed.registry)
    });
    if !on_platform {
        return Ok(());
    }
    let own = platform
        .iter()
        .flatten()
        .any(|r| image.starts_with(&format!("{}/{namespace}/", r.trim_end_matches('/'))));
    let configured = config.runtimes.values().any(|images| {
        let repository = |r: &str| {
            r.parse::<Reference>()
                .ok()
                .map(|p| format!("{}/{}", p.registry, p.repository))
        };
        repository(&images.base).as_deref() == Some(image.as_str())
    });
    if own || configured {
        return Ok(());
    }
    Err(format!(
        "runtimeImageOverride {reference} is on the platform's registry but is neither one of \
         this namespace's images ({}/{namespace}/…) nor a runtime base image the platform \
         configured: build Jobs pull it with the platform's credentials, so kiln does not; \
         push the base image to this namespace's repositories or to another registry",
        config.registry.trim_end_matches('/')
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::config::RuntimeImages;

    fn config() -> Config {
        let mut config = Config::new(
            "registry.platform:5000/fns".into(),
            [(
                "nodejs22".to_string(),
                RuntimeImages {
                    base: "registry.platform:5000/kiln/nodejs22:1".into(),
                    builder: "registry.platform:5000/kiln/nodejs22-builder:1".into(),
                },
            )]
            .into(),
        );
        config.pull_registry = Some("localhost:32137/fns".into());
        config
    }

    #[test]
    fn an_override_on_the_platforms_registry_must_be_the_namespaces_own_or_configured() {
        let c = config();
        for fine in [
            "docker.io/library/node:22",
            &format!("ghcr.io/team/base@sha256:{}", "0".repeat(64)),
            "registry.platform:5000/fns/team/mybase:1",
            "localhost:32137/fns/team/mybase:1",
            "registry.platform:5000/kiln/nodejs22:2",
        ] {
            assert_eq!(check(fine, &c, "team"), Ok(()), "{fine}");
        }
        for refused in [
            "registry.platform:5000/fns/victim/hello:kiln-abc",
            "registry.platform:5000/fns/teamx/hello:1",
            "REGISTRY.platform:5000/private/secret:1",
            "localhost:32137/fns/victim/hello:1",
            "registry.platform:5000/kiln/nodejs22-builder:1",
        ] {
            let err = check(refused, &c, "team").unwrap_err();
            assert!(err.contains("platform's credentials"), "{refused}: {err}");
        }
    }
}
