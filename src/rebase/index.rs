//! Rebasing an image index (a build for several platforms): each platform's image is planned
//! on the new base's image for the same platform, and the index over the results is written
//! exactly as `kiln build --platform …` writes its index ([`Index::document`]), so that a
//! rebase gives the index digest a full build on the new base gives. All platforms move, or
//! none: one that is not safe makes the whole index a rebuild.

use std::path::Path;

use super::{Decision, Error, Planned, Request, plan, publish};
use crate::image::publish::Published;
use crate::image::resolve::{self, BaseRef, ResolvedBase};
use crate::oci::{Descriptor, Digest, Document, Index, MediaType, Platform};
use crate::registry::{Client, Reference};

/// One platform's image of the index, and its plan.
#[derive(Debug)]
pub struct PlatformPlan {
    /// The platform, as the index lists it.
    pub platform: Platform,
    /// Its manifest in the index now.
    pub current: Descriptor,
    /// The decision and the new base for this platform.
    pub planned: Planned,
}

/// What a rebase of an index would do.
#[derive(Debug)]
pub enum IndexDecision {
    /// Every platform's image is on the new base already.
    Current,
    /// Safe for every platform: the new index, and each platform's plan.
    Rebase {
        /// The index over the rebased (or current) manifests.
        index: Document,
        /// Each platform's plan, in the index's order.
        platforms: Vec<PlatformPlan>,
    },
    /// Not safe for one platform at least, or not an index kiln wrote: why.
    Rebuild(String),
}

/// Images already read by pinned reference and platform, which the rebases of a fleet
/// share: the controller keeps the new base and builder it read for one Function's index for
/// the next (`kiln rebase` passes `&()`, which keeps nothing).
pub trait KnownBases: Sync {
    /// `reference` read for `platform` before.
    fn get(&self, reference: &str, platform: &Platform) -> Option<ResolvedBase>;
    /// Keeps `base`, `reference` read for `platform`.
    fn keep(&self, reference: &str, platform: &Platform, base: &ResolvedBase);
}

impl KnownBases for () {
    fn get(&self, _: &str, _: &Platform) -> Option<ResolvedBase> {
        None
    }

    fn keep(&self, _: &str, _: &Platform, _: &ResolvedBase) {}
}

/// Plans the rebase of the index `index` (its document, read at `req.image`): each platform's
/// image by digest, on the new base for its platform, its builder (`builder`, as given) read
/// for that platform; the platforms side by side, each image read once and each base and
/// builder taken from `known` when it has them.
///
/// # Errors
/// An image, base or builder that cannot be read.
pub async fn plan_index(
    client: &Client,
    req: Request<'_>,
    index: &Document,
    builder: Option<(&BaseRef, &str)>,
    known: &dyn KnownBases,
) -> Result<IndexDecision, Error> {
    let shown = req.image.to_string();
    let parsed = match kiln_index(index) {
        Ok(parsed) => parsed,
        Err(why) => return Ok(IndexDecision::Rebuild(format!("{shown} {why}"))),
    };
    // A Job records its builder by the digest it was named by (the index over the builder's
    // platforms); each platform's image is the builder for that platform.
    let builder_index = builder.and_then(|(reference, _)| super::pinned_digest(reference));
    let plans = parsed.manifests.into_iter().map(|entry| async move {
        let Some(platform) = entry.platform.clone() else {
            unreachable!("kiln_index checked every entry's platform");
        };
        let builder = match builder {
            Some((reference, name)) => {
                let found = read(client, known, reference, name, &platform).await?;
                Some(found.base.manifest.digest)
            }
            None => None,
        };
        let new_base = known.get(req.base_name, &platform);
        let image = req
            .image
            .repository_only()
            .with_digest(entry.digest.clone());
        let one = Request {
            image: &image,
            platform: &platform,
            builder: builder.as_ref(),
            builder_index,
            resolved: new_base.as_ref(),
            ..req
        };
        let planned = plan(client, one).await?;
        if new_base.is_none() {
            known.keep(req.base_name, &platform, &planned.new_base);
        }
        Ok::<_, Error>(PlatformPlan {
            platform,
            current: entry,
            planned,
        })
    });
    let platforms = futures_util::future::try_join_all(plans).await?;
    if let Some((platform, reason)) = platforms.iter().find_map(|p| match &p.planned.decision {
        Decision::Rebuild(reason) => Some((&p.platform, reason)),
        _ => None,
    }) {
        return Ok(IndexDecision::Rebuild(format!("for {platform}: {reason}")));
    }
    if platforms
        .iter()
        .all(|p| matches!(p.planned.decision, Decision::Current))
    {
        return Ok(IndexDecision::Current);
    }
    let manifests = platforms
        .iter()
        .map(|p| match &p.planned.decision {
            Decision::Rebase(rebased) => Descriptor {
                platform: Some(p.platform.clone()),
                ..rebased.image.manifest.descriptor()
            },
            _ => p.current.clone(),
        })
        .collect();
    let index = Index::document(manifests).map_err(|e| Error::Image {
        image: shown.clone(),
        source: Box::new(resolve::Error::Malformed {
            reference: shown,
            problem: format!("the new index cannot be written: {e}"),
        }),
    })?;
    Ok(IndexDecision::Rebase { index, platforms })
}

/// `reference` (named `name`) for `platform`, from `known` or read and kept there.
async fn read(
    client: &Client,
    known: &dyn KnownBases,
    reference: &BaseRef,
    name: &str,
    platform: &Platform,
) -> Result<ResolvedBase, Error> {
    if let Some(found) = known.get(name, platform) {
        return Ok(found);
    }
    let found = resolve::resolve(client, reference, name, platform)
        .await
        .map_err(|e| Error::Base {
            base: name.to_string(),
            source: Box::new(e),
        })?;
    known.keep(name, platform, &found);
    Ok(found)
}

/// The index parsed, when it is one kiln writes: an OCI index of image manifests, each with
/// its platform, no platform twice, and no annotations; else what is not.
fn kiln_index(doc: &Document) -> Result<Index, String> {
    if doc.media_type != MediaType::OciIndex {
        return Err(format!("is a {}, not an OCI image index", doc.media_type));
    }
    let index: Index = doc
        .parse()
        .map_err(|e| format!("is an index that does not parse: {e}"))?;
    if index.annotations.is_some() {
        return Err("is an index with annotations, which kiln's builds do not write".into());
    }
    let mut seen = Vec::new();
    for entry in &index.manifests {
        let Some(platform) = entry
            .platform
            .as_ref()
            .filter(|_| entry.media_type.is_manifest())
        else {
            return Err(format!(
                "lists {} without a platform or as no image manifest, which kiln's builds do \
                 not write",
                entry.digest
            ));
        };
        if seen.contains(&platform) {
            return Err(format!("lists {platform} twice"));
        }
        seen.push(platform);
    }
    if index.manifests.is_empty() {
        return Err("lists no image".into());
    }
    Ok(index)
}

/// Pushes each platform's rebased image by digest to `target`'s repository (its own layers
/// from `from`, the index's repository; an image kept as it is, when that is another
/// repository, by mounts), then the index at `target`: the index goes last, so a failure
/// leaves the tag where it was. `key_tags`: each rebased image also gets its build key's tag,
/// as `kiln build --tag-by-key` gives it.
///
/// # Errors
/// A registry failure.
pub async fn publish_index(
    client: &Client,
    index: &Document,
    platforms: &[PlatformPlan],
    from: &Reference,
    target: &Reference,
    key_tags: bool,
    scratch: &Path,
) -> Result<(Digest, Vec<Published>), Error> {
    let mut published = Vec::new();
    let elsewhere = (&from.registry, &from.repository) != (&target.registry, &target.repository);
    for plan in platforms {
        let Decision::Rebase(rebased) = &plan.planned.decision else {
            if elsewhere {
                let at = from.with_digest(plan.current.digest.clone());
                super::copy_by_mounts(client, &at, target).await?;
            }
            continue;
        };
        let key_tag = key_tags.then(|| crate::build::plan::key_tag(&rebased.image_key));
        let repository = target.repository_only();
        let new_base = &plan.planned.new_base;
        let one = publish(
            client,
            rebased,
            new_base,
            from,
            &repository,
            key_tag,
            scratch,
        );
        published.push(one.await?);
    }
    let destination = match target.tag {
        Some(_) => target.clone(),
        None => target.with_digest(index.digest.clone()),
    };
    let what = format!("index {}", index.digest);
    client
        .put_manifest(&destination, index)
        .await
        .map_err(crate::image::publish::registry_err(what, target))?;
    Ok((index.digest.clone(), published))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(platform: Option<&str>) -> Descriptor {
        let mut d = Descriptor::new(MediaType::OciManifest, Digest::of(b"m"), 10);
        d.platform = platform.and_then(Platform::parse);
        d
    }

    #[test]
    fn only_an_index_as_kiln_writes_it_is_rebased() {
        let two = vec![entry(Some("linux/amd64")), entry(Some("linux/arm64"))];
        let doc = Index::document(two.clone()).unwrap();
        assert_eq!(kiln_index(&doc).unwrap().manifests, two);
        let twice = Index::document(vec![entry(Some("linux/amd64")); 2]).unwrap();
        assert!(kiln_index(&twice).unwrap_err().contains("twice"));
        let attestation = Index::document(vec![two[0].clone(), entry(None)]).unwrap();
        assert!(
            kiln_index(&attestation)
                .unwrap_err()
                .contains("without a platform")
        );
        let mut annotated: Index = doc.parse().unwrap();
        annotated.annotations = Some([("a".to_string(), "b".to_string())].into());
        let bytes = crate::oci::canonical::to_vec(&annotated).unwrap();
        let annotated = Document::new(MediaType::OciIndex, bytes);
        assert!(kiln_index(&annotated).unwrap_err().contains("annotations"));
        let list = Document::new(MediaType::DockerManifestList, doc.bytes.clone());
        assert!(
            kiln_index(&list)
                .unwrap_err()
                .contains("not an OCI image index")
        );
    }
}
