//! The cluster-wide cap on running build Jobs, first come first served. Counting active Jobs
//! from the watch cache and creating one more must not race between concurrent reconciles
//! (Kyma forced its controller down to one worker for this, kyma #10037):
//! [`BuildSlots::try_take`] counts and reserves under one lock, a reservation stands in for a
//! Job the cache has not seen yet, and a Function that finds no slot waits in a queue ordered
//! by creation time. When a build ends, [`BuildSlots::wake`] reconciles the oldest waiters at
//! once instead of leaving them to their next periodic look.
//!
//! A waiter that no longer waits leaves the queue at once, before anyone is counted behind
//! it: a Function deleted (it is never reconciled again), being deleted, or whose spec
//! changed since it queued (it may be invalid now, or wait for another build key; its next
//! reconcile queues it again, in the same place). Otherwise such ghosts, `--max-build-jobs`
//! of them, would stop every build until the controller restarts.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;

use super::crd::Function;

/// How long a reservation stands in for a created Job the watch has not delivered yet.
const RESERVATION: Duration = Duration::from_secs(60);

/// A waiting Function: creation time, namespace, name (ordered oldest first).
pub type Waiter = (String, String, String);

/// Whether a Function (namespace, name) at a generation still waits: it exists, is not
/// being deleted, and its spec is the one it queued with.
pub type StillWaiting = Box<dyn Fn(&str, &str, Option<i64>) -> bool + Send + Sync>;

/// At most `max` build Jobs at a time.
pub struct BuildSlots {
    max: usize,
    state: Mutex<State>,
    wake: Option<UnboundedSender<ObjectRef<Function>>>,
    still_waiting: Option<StillWaiting>,
}

#[derive(Default)]
struct State {
    reserved: HashMap<String, Instant>,
    /// Each waiter, with the generation of the Function when it queued.
    waiting: BTreeMap<Waiter, Option<i64>>,
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

/// The queue position of a Function.
pub fn waiter(f: &Function) -> Waiter {
    (
        f.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        f.namespace_or_default().to_string(),
        f.name_or_empty().to_string(),
    )
}

impl BuildSlots {
    /// A cap of `max` Jobs; `wake` receives the Functions to reconcile when slots free up.
    pub fn new(max: usize, wake: Option<UnboundedSender<ObjectRef<Function>>>) -> BuildSlots {
        BuildSlots {
            max,
            state: Mutex::default(),
            wake,
            still_waiting: None,
        }
    }

    /// Drops waiters for which `check` says they no longer wait (see the module's doc).
    pub fn with_check(mut self, check: StillWaiting) -> BuildSlots {
        self.still_waiting = Some(check);
        self
    }

    /// The state, without the waiters that no longer wait.
    fn live_state(&self) -> std::sync::MutexGuard<'_, State> {
        let mut state = self.state();
        if let Some(check) = &self.still_waiting {
            state
                .waiting
                .retain(|(_, ns, name), generation| check(ns, name, *generation));
        }
        state
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reserves a slot for the Job `key` (`namespace/name`) of `who` (at `generation`),
    /// given every build Job the cache knows (its key, and whether it is still active). A
    /// Function waits while all slots are taken, or while as many older Functions wait as
    /// there are free slots.
    ///
    /// # Errors
    /// The number of builds running or reserved, when `who` must wait.
    pub fn try_take(
        &self,
        key: &str,
        who: &Waiter,
        generation: Option<i64>,
        jobs: impl IntoIterator<Item = (String, bool)>,
    ) -> Result<(), usize> {
        self.try_take_with(key, who, generation, || jobs)
    }

    /// [`BuildSlots::try_take`] with the Jobs read from the cache under the lock. A snapshot
    /// read before it could be older than the one that let another reconcile drop a
    /// reservation: the Job reserved would then be counted by neither, and one more build
    /// would start than the cap allows (seen as 6 of 5 with 16 workers).
    ///
    /// # Errors
    /// As [`BuildSlots::try_take`].
    pub fn try_take_with<I: IntoIterator<Item = (String, bool)>>(
        &self,
        key: &str,
        who: &Waiter,
        generation: Option<i64>,
        jobs: impl FnOnce() -> I,
    ) -> Result<(), usize> {
        let mut state = self.live_state();
        let mut known = HashSet::new();
        let jobs = jobs();
        let mut active = HashSet::new();
        for (job, running) in jobs {
            if running {
                active.insert(job.clone());
            }
            known.insert(job);
        }
        // A reservation ends once the cache shows the Job, running or already finished (a
        // quick build can end before any reconcile saw it run), or after a while (a create
        // that failed without telling us, a Job deleted before it was seen).
        state
            .reserved
            .retain(|k, at| !known.contains(k) && at.elapsed() < RESERVATION);
        if active.contains(key) || state.reserved.contains_key(key) {
            state.waiting.remove(who);
            return Ok(());
        }
        let running = active.len() + state.reserved.len();
        let free = self.max.saturating_sub(running);
        let older = state.waiting.range(..who.clone()).count();
        if free == 0 || older >= free {
            state.waiting.insert(who.clone(), generation);
            return Err(running);
        }
        state.waiting.remove(who);
        state.reserved.insert(key.to_string(), Instant::now());
        Ok(())
    }

    /// Gives a reservation back (the create failed).
    pub fn release(&self, key: &str) {
        self.state().reserved.remove(key);
    }

    /// Forgets `who` (it was built without a Job, is invalid, or is being deleted).
    pub fn forget(&self, who: &Waiter) {
        self.state().waiting.remove(who);
    }

    /// A build ended: reconcile the oldest waiters now, as many as slots may be free.
    pub fn wake(&self, running: usize) {
        let Some(wake) = &self.wake else {
            return;
        };
        let free = self.max.saturating_sub(running).max(1);
        let waiters: Vec<Waiter> = self
            .live_state()
            .waiting
            .keys()
            .take(free)
            .cloned()
            .collect();
        for (_, ns, name) in waiters {
            let _ = wake.send(ObjectRef::new(&name).within(&ns));
        }
    }

    /// How many Functions wait.
    pub fn waiting(&self) -> usize {
        self.live_state().waiting.len()
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(t: &str) -> Waiter {
        (t.into(), "ns".into(), t.into())
    }

    #[test]
    fn a_snapshot_read_under_the_lock_never_undercounts_a_reserved_job() {
        let slots = BuildSlots::new(1, None);
        let cache = std::sync::Mutex::new(Vec::<(String, bool)>::new());
        let read = || cache.lock().unwrap().clone();
        // A worker read the cache before `a` was created...
        let stale = read();
        assert_eq!(slots.try_take_with("ns/a", &who("1"), None, read), Ok(()));
        cache.lock().unwrap().push(("ns/a".into(), true));
        // ...another saw `a` in the cache, which ends its reservation...
        assert_eq!(slots.try_take_with("ns/b", &who("2"), None, read), Err(1));
        // ...so the stale snapshot would count nothing and start a second build.
        assert_eq!(slots.try_take("ns/c", &who("0"), None, stale), Ok(()));
        slots.release("ns/c");
        // Read under the lock, the snapshot is never older than the one that dropped it.
        assert_eq!(slots.try_take_with("ns/c", &who("3"), None, read), Err(1));
    }

    #[test]
    fn reservations_count_until_the_cache_shows_the_job() {
        let slots = BuildSlots::new(2, None);
        let none = Vec::<(String, bool)>::new;
        assert_eq!(slots.try_take("ns/a", &who("1"), None, none()), Ok(()));
        assert_eq!(slots.try_take("ns/b", &who("2"), None, none()), Ok(()));
        assert_eq!(slots.try_take("ns/c", &who("3"), None, none()), Err(2));
        // The cache now shows a; b is still reserved: still full.
        assert_eq!(
            slots.try_take("ns/c", &who("3"), None, [("ns/a".to_string(), true)]),
            Err(2)
        );
        slots.release("ns/b");
        assert_eq!(
            slots.try_take("ns/c", &who("3"), None, [("ns/a".to_string(), true)]),
            Ok(())
        );
        // Taking again for a Job that exists or is reserved is no new slot.
        assert_eq!(
            slots.try_take("ns/c", &who("3"), None, [("ns/a".to_string(), true)]),
            Ok(())
        );
        assert_eq!(
            slots.try_take("ns/a", &who("1"), None, [("ns/a".to_string(), true)]),
            Ok(())
        );
        assert_eq!(slots.waiting(), 0);
    }

    #[test]
    fn a_reserved_job_the_cache_first_shows_finished_frees_its_slot() {
        let slots = BuildSlots::new(1, None);
        assert_eq!(slots.try_take("ns/a", &who("1"), None, Vec::new()), Ok(()));
        assert_eq!(slots.try_take("ns/b", &who("2"), None, Vec::new()), Err(1));
        // a ran and ended between two looks at the cache: its slot is free at once.
        assert_eq!(
            slots.try_take("ns/b", &who("2"), None, [("ns/a".to_string(), false)]),
            Ok(())
        );
    }

    #[test]
    fn a_newcomer_does_not_overtake_older_waiters() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let slots = BuildSlots::new(1, Some(tx));
        assert_eq!(slots.try_take("ns/a", &who("1"), None, Vec::new()), Ok(()));
        assert_eq!(
            slots.try_take("ns/b", &who("2"), None, [("ns/a".to_string(), true)]),
            Err(1)
        );
        assert_eq!(
            slots.try_take("ns/c", &who("3"), None, [("ns/a".to_string(), true)]),
            Err(1)
        );
        // a finished: the slot is free, but c is younger than b.
        assert_eq!(slots.try_take("ns/c", &who("3"), None, Vec::new()), Err(0));
        slots.wake(0);
        assert_eq!(rx.try_recv().unwrap().name, "2");
        assert!(rx.try_recv().is_err(), "one free slot wakes one waiter");
        assert_eq!(slots.try_take("ns/b", &who("2"), None, Vec::new()), Ok(()));
        assert_eq!(slots.waiting(), 1);
    }

    #[test]
    fn waiters_that_no_longer_wait_leave_the_queue_before_anyone_is_counted_behind_them() {
        // Functions 2 and 3 queued at generation 1; then 2 was deleted and 3's spec changed.
        let alive = |_: &str, name: &str, generation: Option<i64>| match name {
            "2" => false,
            "3" => generation == Some(2),
            _ => true,
        };
        let slots = BuildSlots::new(1, None).with_check(Box::new(alive));
        assert_eq!(
            slots.try_take("ns/a", &who("1"), Some(1), Vec::new()),
            Ok(())
        );
        let running = [("ns/a".to_string(), true)];
        assert_eq!(
            slots.try_take("ns/b", &who("2"), Some(1), running.clone()),
            Err(1)
        );
        assert_eq!(
            slots.try_take("ns/c", &who("3"), Some(1), running.clone()),
            Err(1)
        );
        assert_eq!(slots.waiting(), 0, "both ghosts are gone");
        // a finished; a newcomer is not held behind the ghosts.
        assert_eq!(
            slots.try_take("ns/d", &who("4"), Some(1), Vec::new()),
            Ok(())
        );
        // 3 queues again with its new spec, and keeps its place ahead of younger ones.
        assert_eq!(
            slots.try_take("ns/c2", &who("3"), Some(2), [("ns/d".to_string(), true)]),
            Err(1)
        );
        assert_eq!(slots.waiting(), 1);
        assert_eq!(
            slots.try_take("ns/e", &who("5"), Some(1), Vec::new()),
            Err(0)
        );
        assert_eq!(
            slots.try_take("ns/c2", &who("3"), Some(2), Vec::new()),
            Ok(())
        );
    }
}
