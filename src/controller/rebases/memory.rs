//! What the controller remembers between passes of a fleet's rebases, in memory: the images
//! it took for a build key a moment ago ([`Taken`]), and the new bases it read ([`NewBases`]).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::rebase;

/// The images (`repository@digest`) this controller rebased or kept for a build key in the
/// last [`TAKEN_FOR`], each there and proven (`--require-provenance`) as it took it. A pass
/// that finds the record entry before the status shows it (the status write lost a race with
/// another write of the Function) deploys such an image without asking the registry again
/// whether it has it and checking its provenance: about a third of a fleet's rebases, each a
/// `HEAD`, and under `--require-provenance` the cosign tags and envelopes read back
/// (`bench/fleet_rebase.rs`).
#[derive(Default)]
pub struct Taken(Mutex<VecDeque<(String, Instant)>>);

/// How long [`Taken`] vouches for an image: a registry's clean-up does not remove an image
/// pushed that recently.
const TAKEN_FOR: Duration = Duration::from_secs(600);
/// How many images [`Taken`] keeps (a fleet's rebases in flight).
const TAKEN_KEPT: usize = 4096;

impl Taken {
    pub(super) fn note(&self, image: &str) {
        let mut taken = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if taken.len() >= TAKEN_KEPT {
            taken.pop_front();
        }
        taken.push_back((image.to_string(), Instant::now()));
    }

    /// Whether this controller took `image` (`repository@digest`) in the last [`TAKEN_FOR`].
    pub fn holds(&self, image: &str) -> bool {
        let mut taken = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while taken
            .front()
            .is_some_and(|(_, at)| at.elapsed() > TAKEN_FOR)
        {
            taken.pop_front();
        }
        taken.iter().any(|(i, _)| i == image)
    }
}

/// The new bases rebases were made onto, by their reference pinned by digest: the rebases of
/// a fleet onto one base read it once, not once per Function. What a digest names never
/// changes; the last [`NEW_BASES_KEPT`] are kept.
#[derive(Default)]
pub struct NewBases(Mutex<VecDeque<(String, rebase::ResolvedBase)>>);

/// How many resolved new bases [`NewBases`] keeps (a few runtimes' patches at once, for
/// each platform of an index its base and builder).
const NEW_BASES_KEPT: usize = 16;

impl NewBases {
    fn get(&self, reference: &str) -> Option<rebase::ResolvedBase> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .find(|(r, _)| r == reference)
            .map(|(_, base)| base.clone())
    }

    fn keep(&self, reference: &str, base: &rebase::ResolvedBase) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.iter().any(|(r, _)| r == reference) {
            return;
        }
        if kept.len() >= NEW_BASES_KEPT {
            kept.pop_front();
        }
        kept.push_back((reference.to_string(), base.clone()));
    }
}

/// The bases and builders of an index's platforms, by pinned reference and platform.
impl rebase::KnownBases for NewBases {
    fn get(
        &self,
        reference: &str,
        platform: &crate::oci::Platform,
    ) -> Option<rebase::ResolvedBase> {
        reference
            .contains('@')
            .then(|| NewBases::get(self, &format!("{reference} {platform}")))
            .flatten()
    }

    fn keep(&self, reference: &str, platform: &crate::oci::Platform, base: &rebase::ResolvedBase) {
        if reference.contains('@') {
            NewBases::keep(self, &format!("{reference} {platform}"), base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_taken_is_held_and_no_other() {
        let taken = Taken::default();
        taken.note("reg/fns/a@sha256:1");
        assert!(taken.holds("reg/fns/a@sha256:1"));
        assert!(!taken.holds("reg/fns/a@sha256:2"));
        assert!(!taken.holds("reg/fns/b@sha256:1"));
        // One taken too long ago is not vouched for.
        let old = Instant::now().checked_sub(TAKEN_FOR + Duration::from_secs(1));
        if let Some(old) = old {
            let taken = Taken(Mutex::new(VecDeque::from([(
                "reg/fns/a@sha256:1".into(),
                old,
            )])));
            assert!(!taken.holds("reg/fns/a@sha256:1"));
        }
    }
}
