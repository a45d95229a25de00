//! `kiln base lock`: a recipe resolved into exact, hashed inputs — Debian packages against the
//! signed mirror, npm tarballs against the registry, and the runtime packages with npm and pip
//! (see [`super::packages`]).

use super::assemble::{Error, Sources};
use super::debian::{self, Keyring, Mirror};
use super::packages;
use super::recipe::{ArchInputs, FIRST_ARCHITECTURE, Lock, LockedDeb, LockedNpm, Recipe, Target};
use crate::fetch::npm::NpmTarball;
use crate::oci::Platform;

/// Resolves a recipe against the mirror (verified InRelease, Packages by hash) and the npm
/// registry into a lock, for each of the recipe's architectures.
///
/// # Errors
/// Unverifiable indexes, unsatisfiable dependencies, unknown npm versions.
pub async fn lock(src: &Sources, recipe: &Recipe) -> Result<Lock, Error> {
    let mut mirror = Mirror::new(src.mirror.clone(), &recipe.debian.suite);
    mirror.allow_expired_release = src.allow_expired_release;
    let keyring = Keyring::load(&src.keyring)?;
    let release = debian::fetch_release(&src.http, &mirror, &keyring).await?;
    let npm_lock = match recipe.packages.as_ref().filter(|p| !p.npm.is_empty()) {
        None => None,
        Some(p) => {
            let (deps, registry) = (p.npm.clone(), src.npm_registry.clone());
            Some(tokio::task::spawn_blocking(move || packages::lock_npm(&deps, &registry)).await??)
        }
    };
    let mut arches = recipe.architectures.iter();
    let first = arches.next().map(String::as_str);
    if first != Some(FIRST_ARCHITECTURE) {
        return Err(Error::Architectures {
            runtime: recipe.runtime.clone(),
        });
    }
    let mut lock = Lock::new(
        &recipe.runtime,
        &recipe.debian.suite,
        lock_arch(
            src,
            recipe,
            &mirror,
            &release,
            npm_lock.as_deref(),
            FIRST_ARCHITECTURE,
        )
        .await?,
    );
    for arch in arches {
        let inputs = lock_arch(src, recipe, &mirror, &release, npm_lock.as_deref(), arch).await?;
        lock.arch.insert(arch.clone(), inputs);
    }
    Ok(lock)
}

/// The inputs of one architecture: its Debian packages, npm tarballs (`{cpu}` in a name made
/// its own), the runtime packages' tree for its CPU (one npm resolution serves all) and its
/// wheels.
async fn lock_arch(
    src: &Sources,
    recipe: &Recipe,
    mirror: &Mirror,
    release: &debian::Release,
    npm_lock: Option<&str>,
    arch: &str,
) -> Result<ArchInputs, Error> {
    let platform = Platform::linux(arch);
    let mirror = Mirror {
        arch: arch.to_string(),
        ..mirror.clone()
    };
    let index = debian::fetch_packages(&src.http, &mirror, release).await?;
    let d = &recipe.debian;
    let base = index.resolve(&d.base, &d.exclude)?;
    let with_kiln: Vec<String> = d.base.iter().chain(&d.kiln).cloned().collect();
    let kiln = index.resolve(&with_kiln, &d.exclude)?;
    let roots: Vec<String> = with_kiln.iter().chain(&d.builder).cloned().collect();
    let all = index.resolve(&roots, &d.exclude)?;
    let mut seen: std::collections::BTreeSet<String> =
        base.iter().map(|p| p.name.clone()).collect();
    let mut debs: Vec<LockedDeb> = Vec::new();
    for (packages, image) in [
        (&base, Target::Base),
        (&kiln, Target::Kiln),
        (&all, Target::Builder),
    ] {
        for p in packages.iter() {
            if image == Target::Base || seen.insert(p.name.clone()) {
                debs.push(LockedDeb {
                    image,
                    package: p.clone(),
                });
            }
        }
    }
    let mut pinned = Vec::new();
    for n in &recipe.npm {
        let name = n.package.replace("{cpu}", platform.node_cpu());
        let tarball = NpmTarball::resolve(&src.http, &src.npm_registry, &name, &n.version).await?;
        pinned.push(LockedNpm {
            image: n.image,
            tarball,
        });
    }
    let npm_tree = match npm_lock {
        Some(text) => packages::parse_package_lock(text, platform.node_cpu())?,
        None => Vec::new(),
    };
    let mut wheel = Vec::new();
    if let Some(p) = recipe.packages.clone().filter(|p| !p.pip.is_empty()) {
        let Some(python) = p.python else {
            return Err(packages::Error::Output {
                what: "recipe",
                detail: "[packages] pip needs python (the image's Python version)".into(),
            }
            .into());
        };
        let Some(machine) = platform.machine() else {
            return Err(Error::Architectures {
                runtime: recipe.runtime.clone(),
            });
        };
        wheel = tokio::task::spawn_blocking(move || packages::lock_pip(&p.pip, &python, machine))
            .await??;
    }
    Ok(ArchInputs {
        debian: debs,
        npm: pinned,
        npm_tree,
        wheel,
    })
}
