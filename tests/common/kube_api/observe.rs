//! What tests observe and steer besides objects: the request log (every request with its
//! method, path, query, status, and whether it was a write and changed anything) and fault
//! injection (the next N requests matching a method and a path substring fail with a given
//! status, before they reach the store).

use std::sync::Mutex;

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// The path, e.g. `/apis/batch/v1/namespaces/default/jobs/build-1`.
    pub path: String,
    /// The raw query string (empty when none).
    pub query: String,
    /// The HTTP status answered (200 for a watch that started).
    pub status: u16,
    /// A write: POST, PUT, PATCH or DELETE (whatever its outcome).
    pub write: bool,
    /// Whether it changed stored state (a no-op write, a failure or a read did not).
    pub changed: bool,
    /// A watch (`?watch=true`).
    pub watch: bool,
    /// Failed by fault injection.
    pub injected: bool,
}

impl Request {
    /// Whether the query has `name=value` (not URL-decoded: use plain values).
    pub fn has_query(&self, name: &str, value: &str) -> bool {
        self.query
            .split('&')
            .any(|pair| pair.split_once('=') == Some((name, value)))
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query)?;
        }
        write!(f, " -> {}", self.status)?;
        if self.injected {
            write!(f, " (injected)")?;
        }
        Ok(())
    }
}

/// A failure to inject.
#[derive(Debug, Clone)]
struct Fault {
    method: String,
    path_contains: String,
    status: u16,
    remaining: usize,
}

/// The request log and the pending faults.
#[derive(Debug, Default)]
pub struct Observer {
    log: Mutex<Vec<Request>>,
    faults: Mutex<Vec<Fault>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A test that panicked while holding the lock must not hide the log from the others.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Observer {
    /// Appends a request to the log.
    pub fn record(&self, request: Request) {
        lock(&self.log).push(request);
    }

    /// The log so far.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.log).clone()
    }

    /// Empties the log.
    pub fn reset(&self) {
        lock(&self.log).clear();
    }

    /// Makes the next `count` requests with `method` (any method for `*`) whose path contains
    /// `path_contains` fail with `status`.
    pub fn fail_next(&self, count: usize, method: &str, path_contains: &str, status: u16) {
        lock(&self.faults).push(Fault {
            method: method.to_ascii_uppercase(),
            path_contains: path_contains.to_string(),
            status,
            remaining: count,
        });
    }

    /// The status to fail this request with, using up one of its fault's count.
    pub fn take_fault(&self, method: &str, path: &str) -> Option<u16> {
        let mut faults = lock(&self.faults);
        let fault = faults.iter_mut().find(|f| {
            f.remaining > 0
                && (f.method == "*" || f.method == method)
                && path.contains(&f.path_contains)
        })?;
        fault.remaining -= 1;
        let status = fault.status;
        faults.retain(|f| f.remaining > 0);
        Some(status)
    }

    /// Faults not used up yet (method, path substring, status, count left).
    pub fn pending_faults(&self) -> Vec<(String, String, u16, usize)> {
        lock(&self.faults)
            .iter()
            .map(|f| {
                (
                    f.method.clone(),
                    f.path_contains.clone(),
                    f.status,
                    f.remaining,
                )
            })
            .collect()
    }
}
