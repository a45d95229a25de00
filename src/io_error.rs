//! The one shape of a failed file-system operation: what was being done, to which path, and
//! the operating system's error. Every module's error type carries it as its `Io` variant
//! (transparently, so the message stays "ACTION PATH: CAUSE" wherever it comes from).

use std::io;
use std::path::{Path, PathBuf};

/// A file-system operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}")]
pub struct IoError {
    /// What was being done ("reading", "creating"…).
    pub action: &'static str,
    /// Where.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

impl IoError {
    /// For `map_err`: the error of `action` on `path`, as any error type that has an `Io`
    /// variant made from it.
    pub fn at<E: From<IoError>>(
        action: &'static str,
        path: &Path,
    ) -> impl FnOnce(io::Error) -> E + use<E> {
        let path = path.to_path_buf();
        move |source| {
            E::from(IoError {
                action,
                path,
                source,
            })
        }
    }
}

/// `.at(action, path)` on a failed file-system call: its error as an [`IoError`], which `?`
/// turns into the error of whichever module asks (each has an `Io` variant made from it).
pub trait IoContext<T> {
    /// The error of `action` on `path`.
    ///
    /// # Errors
    /// The call's error, as an [`IoError`].
    fn at(self, action: &'static str, path: impl AsRef<Path>) -> Result<T, IoError>;
}

impl<T, E: Into<io::Error>> IoContext<T> for Result<T, E> {
    fn at(self, action: &'static str, path: impl AsRef<Path>) -> Result<T, IoError> {
        self.map_err(|source| IoError {
            action,
            path: path.as_ref().to_path_buf(),
            source: source.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_action_and_the_path_and_the_cause_is_kept() {
        let e: IoError =
            IoError::at("reading", Path::new("/x/y"))(io::Error::from(io::ErrorKind::NotFound));
        assert_eq!(e.to_string(), "reading /x/y");
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn at_gives_the_same_error_from_any_error_convertible_to_io() {
        let failed: Result<(), rustix::io::Errno> = Err(rustix::io::Errno::NOENT);
        let e = failed.at("opening", "/x/y").unwrap_err();
        assert_eq!(e.to_string(), "opening /x/y");
        assert_eq!(e.source.kind(), io::ErrorKind::NotFound);
    }
}
