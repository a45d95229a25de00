//! The controller's errors: what failed talking to the API server, the registry or a git
//! server. A reconcile that fails is retried with backoff by the error policy.

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API request.
    #[error("{action}")]
    Kube {
        /// What was being done (`applying Deployment team/hello`).
        action: String,
        /// The cause.
        #[source]
        source: Box<kube::Error>,
    },
    /// A registry request.
    #[error("{action}")]
    Registry {
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: Box<crate::registry::Error>,
    },
    /// Resolving a git reference.
    #[error("resolving {reference} of {url}: {message}")]
    Git {
        /// The repository (redacted).
        url: String,
        /// The reference.
        reference: String,
        /// What went wrong.
        message: String,
    },
    /// A resource the controller needs is missing or malformed.
    #[error("{0}")]
    Missing(String),
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short label for the errors metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Registry { .. } => "registry",
            Error::Git { .. } => "git",
            Error::Missing(_) => "missing",
        }
    }

    /// Wraps a kube error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube {
            action,
            source: Box::new(source),
        }
    }

    /// Wraps a registry error with what was being done.
    pub fn registry(action: impl Into<String>) -> impl FnOnce(crate::registry::Error) -> Error {
        let action = action.into();
        move |source| Error::Registry {
            action,
            source: Box::new(source),
        }
    }
}
