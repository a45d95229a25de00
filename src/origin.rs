//! Who may receive a credential: the origin it was given for — scheme, host and port — and
//! no one else. Not another host, not the same host on another port, not plain HTTP when it
//! was given for HTTPS; a redirect never widens it. One rule for registries and git servers
//! alike, so that what one client refuses the other does too.

use url::Url;

/// The scheme, host and port of a URL, the port spelled out (`https://h` is `https://h:443`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    /// The origin of `url`; `None` for one without a host (`file:`, `data:`), which no
    /// credential is for.
    pub fn of(url: &Url) -> Option<Origin> {
        Some(Origin {
            scheme: url.scheme().to_ascii_lowercase(),
            host: url.host_str()?.to_ascii_lowercase(),
            port: url.port_or_known_default(),
        })
    }

    /// Whether a credential given for this origin may go with a request to `url`.
    pub fn admits(&self, url: &Url) -> bool {
        Origin::of(url).as_ref() == Some(self)
    }

    /// [`Origin::admits`] for a URL as text; one that does not parse is not admitted.
    pub fn admits_str(&self, url: &str) -> bool {
        Url::parse(url).is_ok_and(|url| self.admits(&url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one table: where a credential for `https://git.example/team/fns` (or a registry
    /// at `https://reg.example`) may go.
    #[test]
    fn a_credential_goes_to_its_scheme_host_and_port_only() {
        let cases = [
            (
                "https://git.example/team/fns",
                "https://git.example/team/fns/info/refs",
                true,
            ),
            (
                "https://git.example/team/fns",
                "https://git.example:443/other",
                true,
            ),
            (
                "https://git.example/team/fns",
                "https://GIT.example/team/fns",
                true,
            ),
            (
                "http://reg.example:5000/v2/",
                "http://reg.example:5000/v2/x/blobs/y",
                true,
            ),
            // Another host: a redirect target, the registry's storage.
            (
                "https://git.example/team/fns",
                "https://evil.example/team/fns",
                false,
            ),
            (
                "https://reg.example/v2/",
                "https://storage.example/blob",
                false,
            ),
            (
                "https://git.example/",
                "https://git.example.evil.example/",
                false,
            ),
            ("https://git.example/", "https://sub.git.example/", false),
            // A downgrade to plain HTTP, or another scheme.
            ("https://git.example/", "http://git.example/", false),
            ("https://git.example/", "http://git.example:443/", false),
            ("https://git.example/", "ssh://git.example/", false),
            // Another port on the same host.
            ("https://git.example/", "https://git.example:8443/", false),
            ("http://127.0.0.1:5000/", "http://127.0.0.1:5001/", false),
            // What no credential is for.
            ("https://git.example/", "file:///etc/passwd", false),
        ];
        for (given_for, asked, admitted) in cases {
            let origin = Origin::of(&Url::parse(given_for).unwrap()).unwrap();
            assert_eq!(origin.admits_str(asked), admitted, "{given_for} → {asked}");
        }
        assert!(
            !Origin::of(&Url::parse("https://a.example/").unwrap())
                .unwrap()
                .admits_str("not a url")
        );
        assert_eq!(Origin::of(&Url::parse("file:///x").unwrap()), None);
    }
}
