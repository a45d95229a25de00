//! Kyma's resource presets (serverless@legacy `config/serverless/values.yaml`): the Function
//! profiles XS–XL and the build profiles local-dev–fast, and how a Function's
//! `resourceConfiguration` resolves to requests and limits. Pure data.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::crd::{BuildResources, FunctionResources};

/// Requests and limits of one profile: (cpu, memory) each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    /// The profile's name.
    pub name: &'static str,
    /// Requested (cpu, memory).
    pub requests: (&'static str, &'static str),
    /// Limits (cpu, memory).
    pub limits: (&'static str, &'static str),
    /// The `sizeLimit` of each of a build Pod's emptyDirs (build profiles only): what an
    /// install may write to one before the kubelet evicts the Pod.
    pub scratch: &'static str,
}

/// The Function profiles, Kyma's numbers.
pub const FUNCTION_PRESETS: [Preset; 5] = [
    preset("XS", ("50m", "64Mi"), ("150m", "256Mi"), ""),
    preset("S", ("100m", "128Mi"), ("200m", "256Mi"), ""),
    preset("M", ("200m", "256Mi"), ("400m", "512Mi"), ""),
    preset("L", ("400m", "512Mi"), ("800m", "1024Mi"), ""),
    preset("XL", ("800m", "1024Mi"), ("1600m", "2048Mi"), ""),
];

/// The build profiles, Kyma's numbers; the emptyDir limits are kiln's (Kyma set none),
/// below the 8 GiB a dependency layer may unpack to.
pub const BUILD_PRESETS: [Preset; 4] = [
    preset("local-dev", ("200m", "200Mi"), ("400m", "400Mi"), "1Gi"),
    preset("slow", ("200m", "200Mi"), ("700m", "700Mi"), "2Gi"),
    preset("normal", ("500m", "700Mi"), ("1100m", "1100Mi"), "4Gi"),
    preset("fast", ("900m", "1100Mi"), ("1700m", "1100Mi"), "8Gi"),
];

/// Kyma's default Function profile (module chart).
pub const DEFAULT_FUNCTION_PROFILE: &str = "L";
/// Kyma's default build profile (serverless #990).
pub const DEFAULT_BUILD_PROFILE: &str = "normal";
/// What `status.*ResourceProfile` says for explicit resources.
pub const CUSTOM: &str = "custom";

const fn preset(
    name: &'static str,
    requests: (&'static str, &'static str),
    limits: (&'static str, &'static str),
    scratch: &'static str,
) -> Preset {
    Preset {
        name,
        requests,
        limits,
        scratch,
    }
}

impl Preset {
    /// The profile as core resource requirements.
    pub fn requirements(&self) -> ResourceRequirements {
        let pair = |(cpu, memory): (&str, &str)| {
            BTreeMap::from([
                ("cpu".to_string(), Quantity(cpu.into())),
                ("memory".to_string(), Quantity(memory.into())),
            ])
        };
        ResourceRequirements {
            requests: Some(pair(self.requests)),
            limits: Some(pair(self.limits)),
            ..ResourceRequirements::default()
        }
    }
}

/// Looks a profile up by name in a table.
pub fn find(table: &[Preset], name: &str) -> Option<Preset> {
    table.iter().copied().find(|p| p.name == name)
}

/// Resources resolved from a Function's settings: the profile name (or `custom`) and the
/// requirements.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The profile used, or [`CUSTOM`].
    pub profile: String,
    /// Requests and limits.
    pub resources: ResourceRequirements,
    /// The `sizeLimit` of each emptyDir (builds): the profile's, or for explicit resources
    /// their `ephemeral-storage` limit, else the default profile's. Empty for Functions.
    pub scratch: String,
}

/// The Function container's resources: explicit ones, a named profile, or `default` (a
/// profile name); an unknown name falls back to `default` (validation reports it first).
pub fn function_resources(spec: Option<&FunctionResources>, default: &str) -> Resolved {
    resolve(
        &FUNCTION_PRESETS,
        spec.and_then(|s| s.profile.as_deref()),
        spec.and_then(|s| s.resources.as_ref()),
        default,
    )
}

/// The build Job's resources, like [`function_resources`] over the build profiles.
pub fn build_resources(spec: Option<&BuildResources>, default: &str) -> Resolved {
    resolve(
        &BUILD_PRESETS,
        spec.and_then(|s| s.profile.as_deref()),
        spec.and_then(|s| s.resources.as_ref()),
        default,
    )
}

fn resolve(
    table: &[Preset],
    profile: Option<&str>,
    resources: Option<&ResourceRequirements>,
    default: &str,
) -> Resolved {
    let fallback = find(table, default).unwrap_or(table[0]);
    if let Some(resources) = resources {
        let storage = resources
            .limits
            .as_ref()
            .and_then(|l| l.get("ephemeral-storage"))
            .map(|q| q.0.clone());
        return Resolved {
            profile: CUSTOM.into(),
            resources: resources.clone(),
            scratch: storage.unwrap_or_else(|| fallback.scratch.into()),
        };
    }
    let preset = profile.and_then(|p| find(table, p)).unwrap_or(fallback);
    Resolved {
        profile: preset.name.into(),
        resources: preset.requirements(),
        scratch: preset.scratch.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_resolve_to_kymas_numbers_and_explicit_resources_are_custom() {
        let s = FunctionResources {
            profile: Some("S".into()),
            resources: None,
        };
        let r = function_resources(Some(&s), DEFAULT_FUNCTION_PROFILE);
        assert_eq!(r.profile, "S");
        let limits = r.resources.limits.unwrap();
        assert_eq!(limits["memory"].0, "256Mi");
        let r = function_resources(None, DEFAULT_FUNCTION_PROFILE);
        assert_eq!(r.profile, "L");
        let b = build_resources(None, DEFAULT_BUILD_PROFILE);
        assert_eq!(b.resources.requests.unwrap()["cpu"].0, "500m");
        let explicit = BuildResources {
            profile: None,
            resources: Some(ResourceRequirements::default()),
        };
        let custom = build_resources(Some(&explicit), "slow");
        assert_eq!(
            (custom.profile.as_str(), custom.scratch.as_str()),
            (CUSTOM, "2Gi")
        );
        let storage = BuildResources {
            profile: None,
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "ephemeral-storage".to_string(),
                    Quantity("3Gi".into()),
                )])),
                ..ResourceRequirements::default()
            }),
        };
        assert_eq!(build_resources(Some(&storage), "slow").scratch, "3Gi");
        assert_eq!(b.scratch, "4Gi");
    }
}
