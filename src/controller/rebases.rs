//! Fleet rebases. When a runtime's base or builder image changes (the reconciler resolves
//! their tags with a TTL), every Function on it gets a new build key. For a Function whose
//! last build differs from the new one only in those images, the controller rebases the image
//! it built instead of building again, when that is safe (see [`crate::rebase`]): the new
//! base's layers and the Function's own, pushed with blob mounts, no Job (an image for
//! several platforms: each platform's image onto the new base's for it, and the index
//! last). Otherwise, or when the push fails, a build Job runs as for any change. Rebases
//! start at most `--max-concurrent-rollouts` at a time (and a per-namespace share), so a patch
//! does not roll every Deployment at once; a slot is held until the Function runs on the new
//! image ([`Rollouts`]).
//!
//! A Function with `runtimeImageOverride` is never rebased (its base is its own), and one
//! annotated [`AUTO_REBASE`]`: "false"` stays on the images it was built on, and says that a
//! newer base is available; so does every Function under `--rebase-dry-run`, which also says
//! what would happen.
//!
//! With `--image-signing-secret`, a rebase is signed as a build is (`rebases/signing.rs`).

mod memory;
mod rollouts;
mod signing;

pub use memory::{NewBases, Taken};
pub use rollouts::Rollouts;
pub use signing::SigningKeys;

use std::time::{Duration, Instant};

use super::conditions::{Kind, State, reason};
use super::context::Context;
use super::crd::Function;
use super::plan::{self, Lookups, Plan};
use super::records;
use super::status::Working;
use crate::rebase::{self, Decision};
use crate::registry::Reference;
use crate::runtime::RuntimeSpec;

/// The annotation that opts a Function out of automatic rebases (`"false"`; any value but
/// `"true"` is read so).
pub const AUTO_REBASE: &str = "kiln.io/auto-rebase";

/// A Function whose build key changed only because the runtime's images did.
#[derive(Clone, Debug)]
pub struct BaseChange {
    /// The plan on the images the Function was built on (its key is the status's).
    pub old_plan: Plan,
    /// The image that build made (manifest digest).
    pub digest: String,
}

/// The base change of `f`, if its new `plan` differs from its last build only in the base or
/// builder digest (and the controller recorded which those were).
pub fn base_change(
    f: &Function,
    runtime: &RuntimeSpec,
    ctx: &Context,
    found: &Lookups,
    plan: &Plan,
) -> Option<BaseChange> {
    let old_key = f.status.as_ref()?.build_key.as_deref()?;
    if old_key == plan.key || f.spec.runtime_image_override.is_some() {
        return None;
    }
    let (digest, on) = records::recorded_on(ctx, f, old_key)?;
    let on = on?;
    let old = Lookups {
        base: (found.base.0.clone(), on.base.parse().ok()?),
        builder: (found.builder.0.clone(), on.builder.parse().ok()?),
        ..found.clone()
    };
    let old_plan = plan::plan(f, runtime, &ctx.config, &old);
    (old_plan.key == old_key).then_some(BaseChange { old_plan, digest })
}

/// Who holds a rollout slot: `namespace/name`.
pub fn rollout_id(f: &Function) -> String {
    format!("{}/{}", f.namespace_or_default(), f.name_or_empty())
}

/// Whether `f` opted out of automatic rebases: [`AUTO_REBASE`] set to anything but `"true"`
/// (a misspelt `"false"` pins too; the webhook warns about it).
pub fn opted_out(f: &Function) -> bool {
    f.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(AUTO_REBASE))
        .is_some_and(|v| v != "true")
}

/// What a rebase attempt came to.
pub enum Attempt {
    /// Rebased and recorded: the new image's digest.
    Rebased(String),
    /// Waiting for a rollout slot; look again after this.
    Queued(Duration),
    /// Build it with a Job (the reason is in an Event).
    Build,
}

/// Rebases `change.digest` onto `plan`'s images when safe, pushing to `plan.push_image`.
///
/// # Errors
/// Recording the rebased image failed (the API); a failed rebase itself falls back to a build.
pub async fn attempt(
    f: &Function,
    plan: &Plan,
    ctx: &Context,
    st: &mut Working,
    change: &BaseChange,
) -> super::error::Result<Attempt> {
    let id = rollout_id(f);
    if !ctx.rollouts.take(&id, f.namespace_or_default()) {
        st.set(
            Kind::BuildReady,
            State::Unknown,
            reason::REBASE_QUEUED,
            format!(
                "the runtime's base image changed: the rebase waits for one of the {} rollout \
                 slots (--max-concurrent-rollouts)",
                ctx.config.max_rollouts
            ),
        );
        // Woken when a slot frees up (Rollouts::release); the requeue is only a fallback, and
        // a short one would have every waiter of a large fleet reconciled again and again.
        return Ok(Attempt::Queued(Duration::from_secs(60)));
    }
    let started = Instant::now();
    // The image to take for the new key: rebased and pushed, or kept as it is (the image is
    // the new images' build already: a builder change its dependencies do not depend on),
    // signed for the new key when the controller signs.
    let taken = match decide(plan, ctx, change).await {
        Ok(Move::Rebase(rebased)) => push(plan, ctx, change, &rebased)
            .await
            .map(|(digest, check)| (digest, false, check))
            .map_err(|e| format!("rebasing failed ({e})")),
        Ok(Move::Current) => keep(plan, ctx, change)
            .await
            .map(|check| (change.digest.clone(), true, check))
            .map_err(|e| format!("keeping the image for the new key failed ({e})")),
        Ok(Move::Rebuild(why)) => {
            ctx.rollouts.release(&id);
            st.note(
                reason::REBUILD_FOR_BASE,
                format!("{}; building", moved(change, plan, &why)),
            );
            return Ok(Attempt::Build);
        }
        Err(e) => Err(format!("reading the image to rebase failed ({e})")),
    };
    let (digest, kept, check) = match taken {
        Ok(taken) => taken,
        Err(why) => return Ok(fall_back(ctx, &id, st, &why)),
    };
    // Checked as every image taken for a build key is (--require-provenance), unless this
    // rebase's own signing is the proof.
    let image = format!("{}@{digest}", plan.repository());
    if let Check::Against(key) = check
        && let Some(why) = super::builds::unproven(ctx, plan, &image, key).await?
    {
        let why = format!("the image {image} is not proven ({why})");
        return Ok(fall_back(ctx, &id, st, &why));
    }
    ctx.taken.note(&image);
    record_rebased(ctx, f, plan, &digest).await?;
    let message = if kept {
        // Nothing rolls out: the Deployment runs this image already.
        ctx.rollouts.release(&id);
        moved(change, plan, "the image is what a build would make: kept")
    } else {
        tracing::info!(
            %digest,
            took_ms = started.elapsed().as_millis(),
            held = ctx.rollouts.held(),
            "rebased onto the runtime's new base",
        );
        let then = moved(change, plan, "the image is safe to move");
        format!("{then}: rebased to {digest}, no build")
    };
    st.set(
        Kind::BuildReady,
        State::True,
        reason::IMAGE_REBASED,
        message,
    );
    Ok(Attempt::Rebased(digest))
}

/// A rebase that failed (`why`): its slot given back, a `RebaseFailed` note, and a build.
fn fall_back(ctx: &Context, id: &str, st: &mut Working, why: &str) -> Attempt {
    ctx.rollouts.release(id);
    let message = format!("{why}; building instead");
    tracing::warn!(function = %id, "{message}");
    st.note(reason::REBASE_FAILED, message);
    Attempt::Build
}

/// What a rebase would do, for `--rebase-dry-run` and an opted-out Function: one sentence.
pub async fn would(plan: &Plan, ctx: &Context, change: &BaseChange) -> String {
    match decide(plan, ctx, change).await {
        Ok(Move::Rebase(rebased)) => moved(
            change,
            plan,
            &format!("would rebase to {}, no build", rebased.digest()),
        ),
        Ok(Move::Current) => moved(change, plan, "the image stays as it is"),
        Ok(Move::Rebuild(why)) => moved(change, plan, &format!("would build: {why}")),
        Err(e) => moved(
            change,
            plan,
            &format!("would build: reading the image failed: {e}"),
        ),
    }
}

/// Records `digest` as the image of `plan`'s key, made by a rebase onto its images.
async fn record_rebased(
    ctx: &Context,
    f: &Function,
    plan: &Plan,
    digest: &str,
) -> super::error::Result<()> {
    let now = u64::try_from(k8s_openapi::jiff::Timestamp::now().as_second()).unwrap_or(0);
    let on = records::BuiltOn {
        rebased: true,
        ..plan.built_on()
    };
    records::record(ctx, f, &plan.key, digest, &on, now).await
}

/// "the base changed from X to Y: …".
pub fn moved(change: &BaseChange, plan: &Plan, then: &str) -> String {
    let (old, new) = (change.old_plan.built_on(), plan.built_on());
    let what = match (old.base == new.base, old.builder == new.builder) {
        (false, true) => format!("the base image changed ({} to {})", old.base, new.base),
        (true, false) => format!(
            "the builder image changed ({} to {})",
            old.builder, new.builder
        ),
        _ => format!(
            "the base and builder images changed (base {} to {})",
            old.base, new.base
        ),
    };
    format!("{what}: {then}")
}

/// What a rebase of a Function's image (one platform's, or an index) comes to.
enum Move {
    /// Safe: the image or index to push.
    Rebase(Box<Rebased>),
    /// The image is what a build on the new images makes.
    Current,
    /// Not safe: why.
    Rebuild(String),
}

/// A safe rebase, ready to push.
enum Rebased {
    /// One platform's image, onto the new base.
    One(Box<rebase::Rebased>, rebase::ResolvedBase),
    /// An index: each platform's image onto the new base's for its platform.
    Index(crate::oci::Document, Vec<rebase::PlatformPlan>),
}

impl Rebased {
    fn digest(&self) -> &crate::oci::Digest {
        match self {
            Rebased::One(rebased, _) => &rebased.image.manifest.digest,
            Rebased::Index(index, _) => &index.digest,
        }
    }
}

async fn decide(plan: &Plan, ctx: &Context, change: &BaseChange) -> Result<Move, String> {
    let image: Reference = format!("{}@{}", plan.repository(), change.digest)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let base_ref: Reference = plan.base.parse().map_err(|e| format!("{e}"))?;
    let base = rebase::BaseRef::Registry(base_ref);
    // By platform: Functions of one runtime may each be for another.
    let platform = &plan.platforms[0];
    let known = rebase::KnownBases::get(&ctx.new_bases, &plan.base, platform);
    let builder: crate::oci::Digest = plan
        .built_on()
        .builder
        .parse()
        .map_err(|_| "the builder digest".to_string())?;
    let request = rebase::Request {
        image: &image,
        base: &base,
        base_name: &plan.base,
        builder: Some(&builder),
        builder_index: None,
        platform,
        catalog: &ctx.catalog,
        resolved: known.as_ref(),
    };
    let text = |e| format!("{:#}", anyhow::Error::new(e));
    let planned = match rebase::plan(ctx.images.client(), request).await {
        Ok(planned) => planned,
        Err(rebase::Error::Index { index, .. }) => {
            // Each platform's builder is read from the builder's reference (an index too).
            let builder_ref =
                rebase::BaseRef::Registry(plan.builder.parse().map_err(|e| format!("{e}"))?);
            let builder = Some((&builder_ref, plan.builder.as_str()));
            let client = ctx.images.client();
            let known = &ctx.new_bases;
            let decided = rebase::plan_index(client, request, &index, builder, known)
                .await
                .map_err(text)?;
            return Ok(match decided {
                rebase::IndexDecision::Rebase { index, platforms } => {
                    Move::Rebase(Box::new(Rebased::Index(index, platforms)))
                }
                rebase::IndexDecision::Current => Move::Current,
                rebase::IndexDecision::Rebuild(why) => Move::Rebuild(why),
            });
        }
        Err(e) => return Err(text(e)),
    };
    if known.is_none() {
        rebase::KnownBases::keep(&ctx.new_bases, &plan.base, platform, &planned.new_base);
    }
    Ok(match planned.decision {
        Decision::Rebase(rebased) => {
            Move::Rebase(Box::new(Rebased::One(rebased, planned.new_base)))
        }
        Decision::Current => Move::Current,
        Decision::Rebuild(why) => Move::Rebuild(why),
    })
}

/// How the image a rebase took is checked under `--require-provenance`.
#[derive(Debug)]
enum Check {
    /// As every image taken for a build key is ([`super::builds::unproven`]): against the
    /// Secret's `cosign.pub`, this one when it was read with the signing key, else read then.
    Against(Option<crate::cosign::VerifyKey>),
    /// Not again: the rebase itself put up each of its images' provenance, naming
    /// `plan.push_image`, signed with the key whose public half that `cosign.pub` was found
    /// to be. Reading them back would only check what the controller has just written.
    Attested,
}

impl Check {
    /// After signing with `signing`: `attested`, whether the signing put up every provenance.
    fn after(signing: Option<&signing::Signing>, attested: bool) -> Check {
        let key = signing.and_then(signing::Signing::verify_key);
        if attested && key.is_some() {
            Check::Attested
        } else {
            Check::Against(key)
        }
    }
}

/// Pushes the rebased image (or index) to `plan.push_image`, signed when the controller signs
/// ([`signing`]): its digest, and how it is to be checked.
async fn push(
    plan: &Plan,
    ctx: &Context,
    change: &BaseChange,
    rebased: &Rebased,
) -> Result<(String, Check), String> {
    let signing = signing::signing(ctx).await?;
    let from: Reference = format!("{}@{}", plan.repository(), change.digest)
        .parse()
        .map_err(|e| format!("{e}"))?;
    let target: Reference = plan.push_image.parse().map_err(|e| format!("{e}"))?;
    let scratch = tempfile::tempdir().map_err(|e| format!("a scratch directory: {e}"))?;
    let client = ctx.images.client();
    let text = |e| format!("{:#}", anyhow::Error::new(e));
    let cache = signing::cache_dir();
    let signer = signing.as_ref().map(|s| s.signer(&cache));
    let builder = Some(plan.builder.as_str());
    let mut attested = false;
    let digest = match rebased {
        Rebased::One(rebased, new_base) => {
            let scratch = scratch.path();
            let one = rebase::publish(client, rebased, new_base, &from, &target, None, scratch);
            let digest = one.await.map_err(text)?.digest;
            if let Some(signer) = signer {
                let platform = &plan.platforms[0];
                let to = (&from, &target);
                let one = rebase::attest::Image::rebased(rebased, new_base, to, platform, builder);
                attested = rebase::attest::image(client, signer, one)
                    .await
                    .map_err(signing_text)?;
            }
            digest
        }
        Rebased::Index(index, platforms) => {
            let published = rebase::publish_index(
                client,
                index,
                platforms,
                &from,
                &target,
                false,
                scratch.path(),
            );
            let digest = published.await.map_err(text)?.0;
            if let Some(signer) = signer {
                let to = (&from, &target);
                let signed = rebase::attest::index(client, signer, platforms, to, &digest, builder);
                attested = signed.await.map_err(signing_text)?;
            }
            digest
        }
    };
    Ok((digest.to_string(), Check::after(signing.as_ref(), attested)))
}

fn signing_text(e: rebase::attest::Error) -> String {
    format!("{:#}", anyhow::Error::new(e))
}

/// For an image kept as it is for the new key, when the controller signs: a provenance that
/// names where the new key's build goes, beside the image's own (an index: each platform's
/// image's, and the index's signature, there already, is kept). How it is then checked, as
/// [`push`] says.
async fn keep(plan: &Plan, ctx: &Context, change: &BaseChange) -> Result<Check, String> {
    let text = |e| format!("{:#}", anyhow::Error::new(e));
    let client = ctx.images.client();
    let image: Reference = format!("{}@{}", plan.repository(), change.digest)
        .parse()
        .map_err(|e| format!("{e}"))?;
    // Still there: the image was read from the documents the controller keeps, which a
    // registry's clean-up does not touch. One gone is built again, not kept.
    if client.head_manifest(&image).await.map_err(text)?.is_none() {
        return Err(format!("the image {image} is no longer in the registry"));
    }
    let Some(signing) = signing::signing(ctx).await? else {
        return Ok(Check::Against(None));
    };
    let target: Reference = plan.push_image.parse().map_err(|e| format!("{e}"))?;
    let doc = client
        .get_manifest(&image, &crate::registry::DEFAULT_MANIFEST_TYPES)
        .await
        .map_err(text)?;
    let images: Vec<(crate::oci::Digest, crate::oci::Platform)> = if doc.media_type.is_index() {
        let index: crate::oci::Index = doc.parse().map_err(|e| format!("{e:#}"))?;
        index
            .manifests
            .into_iter()
            .filter_map(|d| Some((d.digest, d.platform?)))
            .collect()
    } else {
        vec![(doc.digest.clone(), plan.platforms[0].clone())]
    };
    let cache = signing::cache_dir();
    let signer = signing.signer(&cache);
    let on = plan.built_on();
    let base_digest: crate::oci::Digest =
        on.base.parse().map_err(|_| "the base digest".to_string())?;
    // An index's own signature is the one it has: checked, not attested here.
    let mut attested = !doc.media_type.is_index();
    for (digest, platform) in &images {
        let from = image.with_digest(digest.clone());
        // An index's platform image names its platform's base manifest, read when the rebase
        // was decided (else the base as the plan pins it).
        let known = rebase::KnownBases::get(&ctx.new_bases, &plan.base, platform);
        let base = known.map_or_else(|| base_digest.clone(), |b| b.base.manifest.digest);
        let on = (plan.base.as_str(), &base);
        let builder = Some(plan.builder.as_str());
        let one = rebase::attest::Image::kept((&from, &target), digest, platform, on, builder);
        attested &= rebase::attest::image(client, signer, one)
            .await
            .map_err(signing_text)?;
    }
    Ok(Check::after(Some(&signing), attested))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_auto_rebase_value_but_true_opts_out() {
        let annotated = |value: Option<&str>| {
            let mut f = serde_json::json!({
                "apiVersion": "serverless.kyma-project.io/v1alpha2",
                "kind": "Function",
                "metadata": {"name": "hello", "namespace": "team"},
                "spec": {"runtime": "nodejs22", "source": {"inline": {"source": "x"}}},
            });
            if let Some(v) = value {
                f["metadata"]["annotations"] = serde_json::json!({ AUTO_REBASE: v });
            }
            opted_out(&serde_json::from_value(f).unwrap())
        };
        assert!(!annotated(None) && !annotated(Some("true")));
        for pinned in ["false", "False", "no", ""] {
            assert!(annotated(Some(pinned)), "{pinned:?}");
        }
    }
}
