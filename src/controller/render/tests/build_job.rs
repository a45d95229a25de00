//! The build Job: its containers, mounts, arguments and volumes.

use super::*;

#[test]
fn the_build_job_is_unprivileged_and_keeps_push_credentials_from_the_install() {
    let (f, config) = (function(), config());
    let plan = plan_of(&f, &config);
    let job = job::job(&f, &plan, &config);
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.active_deadline_seconds, Some(1800));
    let pod: &PodSpec = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let ps = pod.security_context.as_ref().unwrap();
    assert_eq!(
        (ps.run_as_non_root, ps.run_as_user),
        (Some(true), Some(1000))
    );
    assert_eq!(ps.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let deps = &pod.init_containers.as_ref().unwrap()[0];
    let build = &pod.containers[0];
    for c in [deps, build] {
        assert_restricted(c);
        assert_eq!(
            c.image.as_deref(),
            Some(format!("reg/kiln/nodejs22-builder@{}", digest('c')).as_str())
        );
        assert_eq!(
            c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].0,
            "1100Mi"
        );
        assert!(mounts(c).contains(&"/workspace/src/handler.js".to_string()));
    }
    assert!(args(deps).contains("--stage deps"), "{}", args(deps));
    assert!(!args(deps).contains("--image") && !args(deps).contains("--registry-auth"));
    assert!(
        !mounts(deps).contains(&"/kiln/registry".to_string()),
        "the install must not see push credentials"
    );
    assert!(mounts(deps).contains(&"/kiln/package-registry".to_string()));
    assert!(args(build).contains("--stage publish"));
    assert!(args(build).contains(&format!("--image {}", plan.push_image)));
    assert!(args(build).contains("--insecure-registry reg:5000"));
    assert!(mounts(build).contains(&"/kiln/registry".to_string()));
    assert!(!mounts(build).contains(&"/kiln/package-registry".to_string()));
    let ro = |c: &Container, path: &str| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == path)
            .unwrap()
            .read_only
    };
    assert_eq!(ro(deps, "/workspace/deps"), Some(false));
    assert_eq!(
        ro(build, "/workspace/deps"),
        Some(true),
        "publish only reads the install's output"
    );
    let tmp = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/tmp")
            .unwrap()
            .name
            .clone()
    };
    assert_ne!(tmp(deps), tmp(build), "each stage has its own /tmp");
    assert!(
        plan.push_image
            .starts_with("reg:5000/functions/team/hello:")
    );
}

#[test]
fn a_git_function_is_fetched_once_and_only_the_fetch_sees_the_git_credentials() {
    let mut f = function();
    f.spec.source = Source {
        inline: None,
        git_repository: Some(GitRepositorySource {
            url: "https://git.example.com/fns.git".into(),
            auth: Some(RepositoryAuth {
                type_: "basic".into(),
                secret_name: "git-creds".into(),
            }),
            base_dir: "/hello".into(),
            reference: "main".into(),
        }),
    };
    let mut config = config();
    config.cache_repo = Some("reg:5000/functions/kiln-cache".into());
    let mut plan = plan_of(&f, &config);
    if let plan::SourcePlan::Git { commit, .. } = &mut plan.source {
        *commit = "a".repeat(40);
    }
    let job = job::job(&f, &plan, &config);
    let pod = job.spec.unwrap().template.spec.unwrap();
    let inits = pod.init_containers.unwrap();
    let names: Vec<&str> = inits.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["source", "lookup", "deps"]);
    let source = &inits[0];
    assert_restricted(source);
    let fetch = format!(
        "build --git https://git.example.com/fns.git --git-ref {} --git-base-dir /hello \
            --git-auth-dir /kiln/git",
        "a".repeat(40)
    );
    assert!(args(source).starts_with(&fetch), "{}", args(source));
    assert!(args(source).contains("--stage source --source-dir /workspace/git/function"));
    assert!(mounts(source).contains(&"/kiln/git".to_string()));
    assert!(
        !mounts(source).contains(&"/kiln/registry".to_string()),
        "the fetch needs no registry credentials"
    );
    for c in inits[1..].iter().chain(&pod.containers) {
        assert!(
            args(c).starts_with("build /workspace/git/function --runtime nodejs22"),
            "{}: {}",
            c.name,
            args(c)
        );
        assert!(!args(c).contains("--git"), "{}: {}", c.name, args(c));
        assert!(
            !mounts(c).contains(&"/kiln/git".to_string()),
            "{} must not see the git credentials",
            c.name
        );
        let fetched = c.volume_mounts.iter().flatten();
        let fetched = fetched
            .filter(|m| m.name == "git-source")
            .collect::<Vec<_>>();
        assert_eq!(fetched.len(), 1, "{}", c.name);
        assert_eq!(
            fetched[0].read_only,
            Some(true),
            "{} only reads the source",
            c.name
        );
    }
    let volumes = pod.volumes.unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v.name == name).unwrap();
    assert!(volume("git-source").empty_dir.is_some());
    // The build's own copy of the Function namespace's Secret, next to the Job.
    assert_eq!(
        volume("git-auth")
            .secret
            .as_ref()
            .unwrap()
            .secret_name
            .as_deref(),
        Some(
            format!(
                "{}-git",
                crate::controller::names::build_name(&f, &plan.key)
            )
            .as_str()
        )
    );
}

#[test]
fn a_build_runs_in_the_build_namespace_with_bounded_scratch_and_no_tenant_labels() {
    let (f, config) = (function(), config());
    let plan = plan_of(&f, &config);
    let job = job::job(&f, &plan, &config);
    assert_eq!(job.metadata.namespace.as_deref(), Some("kiln-builds"));
    assert!(
        job.metadata.owner_references.is_none(),
        "an owner reference cannot cross namespaces"
    );
    let labels = job.metadata.labels.clone().unwrap();
    assert_eq!(labels[crate::controller::names::FUNCTION_NAMESPACE], "team");
    assert_eq!(labels[crate::controller::names::FUNCTION_NAME], "hello");
    assert!(
        !labels.contains_key("team"),
        "the Function's own labels stay out"
    );
    let pod = job.spec.unwrap().template.spec.unwrap();
    for v in pod.volumes.iter().flatten() {
        if let Some(e) = &v.empty_dir {
            assert_eq!(
                e.size_limit.as_ref().map(|q| q.0.as_str()),
                Some("4Gi"),
                "{}: the normal build profile's limit",
                v.name
            );
        }
    }
    let secret = |name: &str| {
        pod.volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .and_then(|v| v.secret.clone())
            .unwrap()
    };
    let build = crate::controller::names::build_name(&f, &plan.key);
    assert_eq!(
        secret("package-registry").secret_name,
        Some(format!("{build}-packages"))
    );
    assert_eq!(
        secret("registry-auth").secret_name.as_deref(),
        Some("kiln-registry")
    );
    let cm = source::config_map(&f, &plan, &config).unwrap();
    assert_eq!(cm.metadata.namespace.as_deref(), Some("kiln-builds"));
    assert_eq!(cm.metadata.name.as_deref(), Some(build.as_str()));
}

#[test]
fn only_the_publishing_container_holds_the_cache_signing_key_and_the_scope_picks_the_repo() {
    let f = function();
    let mut config = config();
    config.cache_repo = Some("reg:5000/kiln-cache".into());
    let plan = plan_of(&f, &config);
    let pod = |config: &crate::controller::config::Config| {
        job::job(&f, &plan, config)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
    };
    let spec = pod(&config);
    let all: Vec<_> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let by_name = |name: &str| *all.iter().find(|c| c.name == name).unwrap();
    let key_volume = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/kiln/cache-key")
            .map(|m| m.name.clone())
    };
    let (lookup, deps, build) = (by_name("lookup"), by_name("deps"), by_name("build"));
    assert_eq!(key_volume(lookup).as_deref(), Some("cache-trust"));
    assert_eq!(key_volume(deps), None, "the install never sees a key");
    assert_eq!(key_volume(build).as_deref(), Some("cache-sign"));
    assert!(args(lookup).contains("--cache-trust-key /kiln/cache-key/public.pem"));
    assert!(!args(lookup).contains("--cache-sign-key"));
    assert!(args(build).contains("--cache-sign-key /kiln/cache-key/signing.pem"));
    let volumes = spec.volumes.unwrap();
    let items = |name: &str| {
        let secret = volumes
            .iter()
            .find(|v| v.name == name)
            .unwrap()
            .secret
            .clone()
            .unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("kiln-cache-signing"));
        secret
            .items
            .unwrap()
            .into_iter()
            .map(|i| i.key)
            .collect::<Vec<_>>()
    };
    assert_eq!(items("cache-trust"), ["public.pem"]);
    assert_eq!(items("cache-sign"), ["signing.pem"]);
    assert!(args(lookup).contains("--cache-repo reg:5000/kiln-cache "));
    // A repository per Function namespace.
    config.cache_scope = crate::controller::config::CacheScope::Namespace;
    let spec = pod(&config);
    let ns = f.metadata.namespace.clone().unwrap();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        if c.name == "lookup" || c.name == "build" {
            assert!(
                args(c).contains(&format!("--cache-repo reg:5000/kiln-cache/{ns} ")),
                "{}",
                args(c)
            );
        }
    }
    assert!(config.managed_secrets().contains(&"kiln-cache-signing"));
}
