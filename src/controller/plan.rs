//! A Function's plan: everything the renderers need, resolved once per reconcile (runtime,
//! images by digest, source, resources, build key, image reference). Pure data and the pure
//! steps that make it from a Function and what the reconciler looked up.

use crate::runtime::{Language, RuntimeSpec};

use super::config::Config;
use super::crd::Function;
pub use super::key::SourcePlan;
use super::key::{self, KeyInputs};
use super::presets::{self, Resolved};
use crate::oci::{Digest, Platform};

/// What the reconciler resolved for a Function.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The kiln runtime.
    pub runtime: RuntimeSpec,
    /// The base image, `REPO@sha256:…`.
    pub base: String,
    /// The builder image, `REPO@sha256:…`.
    pub builder: String,
    /// The code.
    pub source: SourcePlan,
    /// The build key (64 hex; the image tag).
    pub key: String,
    /// Where the build pushes: `REPO:KEY`.
    pub push_image: String,
    /// The repository nodes pull from (the Deployment adds `@digest`).
    pub pull_repository: String,
    /// The Function container's resources.
    pub function_resources: Resolved,
    /// The build Job's resources.
    pub build_resources: Resolved,
    /// The platforms built for: one image, or an index over one image each.
    pub platforms: Vec<Platform>,
}

impl Plan {
    /// The repository the image is pushed to (`push_image` without its tag).
    pub fn repository(&self) -> &str {
        self.push_image.rsplit_once(':').map_or("", |(r, _)| r)
    }

    /// The base and builder digests the plan builds on.
    pub fn built_on(&self) -> super::records::BuiltOn {
        let digest = |r: &str| r.rsplit_once('@').map_or(r, |(_, d)| d).to_string();
        super::records::BuiltOn {
            base: digest(&self.base),
            builder: digest(&self.builder),
            rebased: false,
        }
    }
}

/// The lookups a plan needs besides the Function.
#[derive(Clone, Debug)]
pub struct Lookups {
    /// The base image, pinned: repository and digest.
    pub base: (String, Digest),
    /// The builder image, pinned.
    pub builder: (String, Digest),
    /// The git commit, for a git source.
    pub commit: Option<String>,
    /// What the status says about the git source besides its commit: that the SSH host key
    /// was not verified (the Secret has no `knownHosts`).
    pub git_note: Option<String>,
    /// Digest of the namespace's package-registry config, if any.
    pub registry_config: Option<Digest>,
    /// The platforms to build for: the Function's annotation, the controller's flag, or the
    /// Nodes'.
    pub platforms: Vec<Platform>,
}

/// The dependency manifest an inline Function builds with: Kyma turns an empty Node.js one
/// into `{}`; a Python one stays as written.
pub fn sanitized_dependencies(language: Language, dependencies: Option<&str>) -> String {
    match (language, dependencies.map(str::trim)) {
        (Language::Nodejs, None | Some("")) => "{}".into(),
        (_, _) => dependencies.unwrap_or_default().to_string(),
    }
}

/// Makes the plan of `f` on `runtime`.
pub fn plan(f: &Function, runtime: &RuntimeSpec, config: &Config, found: &Lookups) -> Plan {
    let source = match (&f.spec.source.inline, &f.spec.source.git_repository) {
        (Some(inline), _) => SourcePlan::Inline {
            source: inline.source.clone(),
            dependencies: sanitized_dependencies(runtime.language, inline.dependencies.as_deref()),
        },
        (None, Some(git)) => SourcePlan::Git {
            url: git.url.clone(),
            commit: found.commit.clone().unwrap_or_default(),
            base_dir: git.base_dir.clone(),
            auth_secret: git.auth.as_ref().map(|a| a.secret_name.clone()),
        },
        // Validation refuses a Function without a source before a plan is made.
        (None, None) => SourcePlan::Inline {
            source: String::new(),
            dependencies: String::new(),
        },
    };
    let (namespace, name) = (f.namespace_or_default(), f.name_or_empty());
    let key = key::build_key(&KeyInputs {
        runtime: &runtime.name,
        base: &found.base.1,
        builder: &found.builder.1,
        namespace,
        name,
        source: &source,
        registry_config: found.registry_config.as_ref(),
        platforms: &found.platforms,
    });
    let resources = f.spec.resource_configuration.as_ref();
    Plan {
        runtime: runtime.clone(),
        base: format!("{}@{}", found.base.0, found.base.1),
        builder: format!("{}@{}", found.builder.0, found.builder.1),
        push_image: format!(
            "{}:{key}",
            key::repository(&config.registry, namespace, name)
        ),
        pull_repository: key::repository(config.pull_registry(), namespace, name),
        key,
        source,
        function_resources: presets::function_resources(
            resources.and_then(|r| r.function.as_ref()),
            &config.default_function_profile,
        ),
        build_resources: presets::build_resources(
            resources.and_then(|r| r.build.as_ref()),
            &config.default_build_profile,
        ),
        platforms: found.platforms.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_node_dependencies_become_an_empty_object_and_python_ones_stay() {
        assert_eq!(sanitized_dependencies(Language::Nodejs, None), "{}");
        assert_eq!(sanitized_dependencies(Language::Nodejs, Some("  \n")), "{}");
        assert_eq!(sanitized_dependencies(Language::Python, None), "");
        assert_eq!(
            sanitized_dependencies(Language::Python, Some("requests==2.32.3\n")),
            "requests==2.32.3\n"
        );
    }
}
