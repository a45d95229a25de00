//! The cluster-wide cap on running build Jobs. Counting active Jobs from the watch cache and
//! creating one more must not race between concurrent reconciles (Kyma forced its
//! controller down to one worker for this, kyma #10037): [`BuildSlots::try_take`] counts and
//! reserves under one lock, and a reservation stands in for a Job the cache has not seen yet.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;

/// How long a reservation stands in for a created Job the watch has not delivered yet.
const RESERVATION: Duration = Duration::from_secs(60);

/// At most `max` build Jobs at a time.
pub struct BuildSlots {
    max: usize,
    reserved: Mutex<HashMap<String, Instant>>,
}

/// Whether a Job still runs (neither Complete nor Failed).
pub fn is_active(job: &Job) -> bool {
    let Some(status) = &job.status else {
        return true;
    };
    let done = status
        .conditions
        .iter()
        .flatten()
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
    !done && status.succeeded.unwrap_or(0) == 0 && status.failed.unwrap_or(0) == 0
}

impl BuildSlots {
    /// A cap of `max` Jobs.
    pub fn new(max: usize) -> BuildSlots {
        BuildSlots {
            max,
            reserved: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves a slot for the Job `key` (`namespace/name`) given the active Jobs the cache
    /// knows (their keys); `Err(running)` when all slots are taken.
    ///
    /// # Errors
    /// The number of builds running or reserved, when that is the cap.
    pub fn try_take(
        &self,
        key: &str,
        active: impl IntoIterator<Item = String>,
    ) -> Result<(), usize> {
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        let active: std::collections::HashSet<String> = active.into_iter().collect();
        // A reservation ends when the cache shows the Job, or after a while (a create that
        // failed without telling us, a Job deleted before it was seen).
        reserved.retain(|k, at| !active.contains(k) && at.elapsed() < RESERVATION);
        if active.contains(key) || reserved.contains_key(key) {
            return Ok(());
        }
        let running = active.len() + reserved.len();
        if running >= self.max {
            return Err(running);
        }
        reserved.insert(key.to_string(), Instant::now());
        Ok(())
    }

    /// Gives a reservation back (the create failed).
    pub fn release(&self, key: &str) {
        let mut reserved = self.reserved.lock().unwrap_or_else(|e| e.into_inner());
        reserved.remove(key);
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_until_the_cache_shows_the_job() {
        let slots = BuildSlots::new(2);
        assert_eq!(slots.try_take("ns/a", []), Ok(()));
        assert_eq!(slots.try_take("ns/b", []), Ok(()));
        assert_eq!(slots.try_take("ns/c", []), Err(2));
        // The cache now shows a; b is still reserved: still full.
        assert_eq!(slots.try_take("ns/c", ["ns/a".to_string()]), Err(2));
        slots.release("ns/b");
        assert_eq!(slots.try_take("ns/c", ["ns/a".to_string()]), Ok(()));
        // Taking again for a Job that exists or is reserved is no new slot.
        assert_eq!(slots.try_take("ns/c", ["ns/a".to_string()]), Ok(()));
        assert_eq!(slots.try_take("ns/a", ["ns/a".to_string()]), Ok(()));
    }
}
