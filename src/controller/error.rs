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

    /// The error and its causes, `what failed: why: …` (thiserror's `Display` shows only
    /// the first; `{:#}` chains causes for anyhow errors, not for these).
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        text
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

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn the_chain_names_the_api_servers_answer() {
        let status =
            kube::core::Status::failure("deployments.apps \"x\" is forbidden", "Forbidden")
                .with_code(403);
        let e = Error::kube("applying Deployment team/x")(kube::Error::Api(Box::new(status)));
        let chain = e.chain();
        assert!(
            chain.starts_with("applying Deployment team/x: ") && chain.contains("is forbidden"),
            "{chain}"
        );
    }
}
