//! `kiln base lock`: a recipe resolved into exact, hashed inputs — Debian packages against the
//! signed mirror, npm tarballs against the registry, and the runtime packages with npm and pip
//! (see [`super::packages`]).

use super::assemble::{Error, Sources};
use super::debian::{self, Keyring, Mirror};
use super::packages;
use super::recipe::{Lock, LockedDeb, LockedNpm, Recipe, Target};
use crate::fetch::npm::NpmTarball;

/// Resolves a recipe against the mirror (verified InRelease, Packages by hash) and the npm
/// registry into a lock.
///
/// # Errors
/// Unverifiable indexes, unsatisfiable dependencies, unknown npm versions.
pub async fn lock(src: &Sources, recipe: &Recipe) -> Result<Lock, Error> {
    let mut mirror = Mirror::new(src.mirror.clone(), &recipe.debian.suite);
    mirror.allow_expired_release = src.allow_expired_release;
    let keyring = Keyring::load(&src.keyring)?;
    let release = debian::fetch_release(&src.http, &mirror, &keyring).await?;
    let index = debian::fetch_packages(&src.http, &mirror, &release).await?;
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
        let tarball =
            NpmTarball::resolve(&src.http, &src.npm_registry, &n.package, &n.version).await?;
        pinned.push(LockedNpm {
            image: n.image,
            tarball,
        });
    }
    let (mut npm_tree, mut wheel) = (Vec::new(), Vec::new());
    if let Some(p) = recipe.packages.clone() {
        let registry = src.npm_registry.clone();
        (npm_tree, wheel) = tokio::task::spawn_blocking(move || -> Result<_, Error> {
            let tree = if p.npm.is_empty() {
                Vec::new()
            } else {
                packages::lock_npm(&p.npm, &registry)?
            };
            let wheels = match (&p.pip[..], &p.python) {
                ([], _) => Vec::new(),
                (reqs, Some(python)) => packages::lock_pip(reqs, python)?,
                (_, None) => {
                    return Err(packages::Error::Output {
                        what: "recipe",
                        detail: "[packages] pip needs python (the image's Python version)".into(),
                    }
                    .into());
                }
            };
            Ok((tree, wheels))
        })
        .await??;
    }
    Ok(Lock {
        runtime: recipe.runtime.clone(),
        suite: recipe.debian.suite.clone(),
        debian: debs,
        npm: pinned,
        npm_tree,
        wheel,
    })
}
