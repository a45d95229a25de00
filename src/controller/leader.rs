//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several controller
//! replicas exactly one reconciles (two would race on build slots). The holder renews the
//! Lease every third of its duration; another replica takes it over only once it expired.
//! Every write carries the resourceVersion it read, so two candidates cannot both win.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use super::error::{Error, Result};

/// A candidate for the Lease.
pub struct Candidate {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl Candidate {
    /// Competes for Lease `name` in `namespace` as `identity` (the Pod's name).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Candidate {
        Candidate {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration,
        }
    }

    /// How often to renew or retry.
    pub fn period(&self) -> Duration {
        self.duration / 3
    }

    /// Waits until this candidate holds the Lease. `reachable` is set after every attempt:
    /// whether the API server answered it (a standby that can take over is ready).
    pub async fn acquire(&self, reachable: &AtomicBool) {
        loop {
            match self.try_hold().await {
                Ok(true) => {
                    reachable.store(true, Ordering::Relaxed);
                    tracing::info!(
                        lease = %self.name,
                        identity = %self.identity,
                        "became the leader",
                    );
                    return;
                }
                Ok(false) => reachable.store(true, Ordering::Relaxed),
                Err(e) => {
                    reachable.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        error = %e.chain(),
                        lease = %self.name,
                        "competing for the lease",
                    );
                }
            }
            tokio::time::sleep(self.period()).await;
        }
    }

    /// Holds the Lease: renews it until a renewal fails for longer than the Lease lasts,
    /// then returns (the caller must stop reconciling: another replica may take over).
    pub async fn keep(&self) {
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.period()).await;
            match self.try_hold().await {
                Ok(true) => last = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.name, "another replica holds the lease now");
                    return;
                }
                Err(e) => tracing::warn!(error = %e.chain(), "renewing the lease"),
            }
            if last.elapsed() > self.duration {
                tracing::error!(lease = %self.name, "could not renew the lease in time");
                return;
            }
        }
    }

    /// One attempt: create, renew, or take over an expired Lease. `Ok(false)` when someone
    /// else holds it (or won the race).
    ///
    /// # Errors
    /// API failures other than conflicts.
    pub async fn try_hold(&self) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(Error::kube(format!("reading Lease {}", self.name)))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return conflict_is_false(
                self.api.create(&PostParams::default(), &lease).await,
                &self.name,
            );
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        if !mine {
            let held_for = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(15)).unwrap_or(15),
            );
            let expired = spec.renew_time.as_ref().is_none_or(|t| {
                let age = now.0.duration_since(t.0);
                Duration::try_from(age).is_ok_and(|age| age > held_for)
            });
            if !expired {
                return Ok(false);
            }
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(seconds);
        conflict_is_false(
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await,
            &self.name,
        )
    }
}

fn conflict_is_false(result: Result<Lease, kube::Error>, name: &str) -> Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!("writing Lease {name}"))(e)),
    }
}
