//! What every reconcile shares: the API client, the settings, the caches and lookups, the
//! build slots and the watch stores. Its own file so that the steps (builds, deploy,
//! plumbing, records, sweep) and the reconcile that calls them all import it from here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::events::Recorder;

use super::apply::Verified;
use super::config::Config;
use super::lookup::{CommitResolver, Images, NodePlatforms, RegistryConfigs};
use super::metrics::Metrics;
use super::slots::BuildSlots;
use super::stores::Stores;
use crate::runtime::Catalog;

/// A git source's last resolution: `url#reference`, the commit, when, and the status's note.
pub type GitChecked = (String, String, Instant, Option<String>);

/// Everything a reconcile uses, shared by all of them.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// The settings.
    pub config: Config,
    /// The runtimes.
    pub catalog: Catalog,
    /// Image digests and "is it built?".
    pub images: Images,
    /// The Nodes' platforms (what Functions are built for by default).
    pub nodes: NodePlatforms,
    /// Package-registry config digests.
    pub registry_configs: RegistryConfigs,
    /// Git references to commits.
    pub git: Arc<dyn CommitResolver>,
    /// When each Function's git reference was last resolved, to what (source, commit, when,
    /// and the status's note on it).
    pub git_checked: Mutex<HashMap<String, GitChecked>>,
    /// The build cap.
    pub slots: BuildSlots,
    /// The rollout cap of rebases.
    pub rollouts: super::rebases::Rollouts,
    /// The new bases rebases were made onto, read once per base.
    pub new_bases: super::rebases::NewBases,
    /// The images this controller rebased or kept a moment ago, proven as it took them.
    pub taken: super::rebases::Taken,
    /// The image signing key rebases are signed with, as last read.
    pub signing_keys: super::rebases::SigningKeys,
    /// The record entries written, until the watch cache shows them.
    pub written: super::records::Written,
    /// The watch caches of what the controller made.
    pub stores: Stores,
    /// Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Namespaces whose registry Secret copy is fresh.
    pub plumbing: Checked,
    /// Children found to hold what was applied, and at which resourceVersion.
    pub verified: Verified,
}

/// How long a namespace's copies are trusted without a look.
const FRESH: Duration = Duration::from_secs(300);

/// Namespaces whose copies were checked, and when.
#[derive(Default)]
pub struct Checked(Mutex<HashMap<String, Instant>>);

impl Checked {
    pub(super) fn fresh(&self, namespace: &str) -> bool {
        let checked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        checked
            .get(namespace)
            .is_some_and(|at| at.elapsed() < FRESH)
    }

    pub(super) fn mark(&self, namespace: &str) {
        let mut checked = self.0.lock().unwrap_or_else(|e| e.into_inner());
        checked.insert(namespace.to_string(), Instant::now());
    }
}
