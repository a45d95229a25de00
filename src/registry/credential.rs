//! [`Credential`]: a secret that proves who we are to a registry (user name and password, or
//! an identity token). Its `Debug` output hides the secret. It names no other file of the
//! registry client: the credential store, its helpers and the token fetch build on it.

use std::fmt;

/// A secret that proves who we are to a registry. Its `Debug` output hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// User name and password (or an access token used as the password).
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: String,
    },
    /// An OAuth2 refresh token (`identitytoken` in a docker config), exchanged at the token
    /// endpoint with `grant_type=refresh_token`.
    IdentityToken(String),
}

impl Credential {
    /// A user name and password.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Credential {
        Credential::Basic {
            username: username.into(),
            password: password.into(),
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Credential::IdentityToken(_) => {
                f.debug_tuple("IdentityToken").field(&"<redacted>").finish()
            }
        }
    }
}
