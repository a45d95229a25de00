//! Rollout slots: how many Functions may be between their rebase and running on its image at
//! once (`--max-concurrent-rollouts`, and a per-namespace share), and who waits for one.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;

use super::super::crd::Function;

/// How long a rollout slot is held at most: a Deployment that never becomes ready does not
/// hold the fleet back.
const SLOT_TIMEOUT: Duration = Duration::from_secs(600);

/// Rollout slots: at most `max` Functions (and `per_namespace` of one namespace) between a
/// rebase and running on its image. A Function refused a slot waits in line, and is
/// reconciled (through `wake`) when one frees up for it, oldest first.
pub struct Rollouts {
    max: usize,
    per_namespace: usize,
    state: Mutex<SlotState>,
    wake: Option<UnboundedSender<ObjectRef<Function>>>,
}

#[derive(Default)]
struct SlotState {
    /// Holders: namespace, and since when.
    held: HashMap<String, (String, Instant)>,
    /// Waiters, oldest first: id and namespace.
    waiting: VecDeque<(String, String)>,
}

impl Rollouts {
    /// Slots for `max` rollouts, `per_namespace` of them in one namespace; `wake` receives
    /// the waiters to reconcile when slots free up.
    pub fn new(
        max: usize,
        per_namespace: usize,
        wake: Option<UnboundedSender<ObjectRef<Function>>>,
    ) -> Rollouts {
        Rollouts {
            max: max.max(1),
            per_namespace: per_namespace.clamp(1, max.max(1)),
            state: Mutex::default(),
            wake,
        }
    }

    /// Takes a slot for Function `id` in `namespace` (or finds the one it holds); `false` when
    /// every slot it may have is taken (it then waits in line).
    pub fn take(&self, id: &str, namespace: &str) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.held.retain(|_, (_, at)| at.elapsed() < SLOT_TIMEOUT);
        if state.held.contains_key(id) {
            return true;
        }
        let in_namespace = state
            .held
            .values()
            .filter(|(ns, _)| ns == namespace)
            .count();
        if state.held.len() >= self.max || in_namespace >= self.per_namespace {
            if !state.waiting.iter().any(|(w, _)| w == id) {
                state
                    .waiting
                    .push_back((id.to_string(), namespace.to_string()));
            }
            return false;
        }
        state.waiting.retain(|(w, _)| w != id);
        state
            .held
            .insert(id.to_string(), (namespace.to_string(), Instant::now()));
        true
    }

    /// Gives Function `id`'s slot back (it runs on its new image, was not rebased, or is
    /// gone), and wakes the waiters that may take the free slots.
    pub fn release(&self, id: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.waiting.retain(|(w, _)| w != id);
        if state.held.remove(id).is_none() {
            return;
        }
        tracing::debug!(
            function = id,
            held = state.held.len(),
            waiting = state.waiting.len(),
            "rollout slot released"
        );
        let Some(wake) = &self.wake else {
            return;
        };
        let mut free = self.max.saturating_sub(state.held.len());
        let mut per_namespace: HashMap<&str, usize> = HashMap::new();
        for (ns, _) in state.held.values() {
            *per_namespace.entry(ns).or_default() += 1;
        }
        for (waiter, ns) in &state.waiting {
            if free == 0 {
                break;
            }
            let taken = per_namespace.entry(ns).or_default();
            if *taken >= self.per_namespace {
                continue;
            }
            *taken += 1;
            free -= 1;
            let name = waiter.rsplit_once('/').map_or(waiter.as_str(), |(_, n)| n);
            let _ = wake.send(ObjectRef::new(name).within(ns));
        }
    }

    /// Whether Function `id` holds a slot.
    pub fn holds(&self, id: &str) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.held.contains_key(id)
    }

    /// How many slots are held.
    pub fn held(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_slots_cap_the_fleet_and_each_namespace() {
        let (wake, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let slots = Rollouts::new(3, 2, Some(wake));
        assert!(slots.take("a/1", "a"));
        assert!(slots.take("a/1", "a"), "a holder finds its slot");
        assert!(slots.take("a/2", "a"));
        assert!(!slots.take("a/3", "a"), "namespace a has its share");
        assert!(slots.take("b/1", "b"));
        assert!(!slots.take("c/1", "c"), "every slot is taken");
        slots.release("a/1");
        // Two wait: a/3 (its namespace had its share), then c/1; one slot is free, and a/3
        // may take it now.
        assert_eq!(woken.try_recv().unwrap(), ObjectRef::new("3").within("a"));
        assert!(woken.try_recv().is_err(), "one free slot wakes one waiter");
        assert!(slots.take("c/1", "c"));
        assert_eq!(slots.held(), 3);
        assert!(slots.holds("c/1") && !slots.holds("a/1"));
    }
}
