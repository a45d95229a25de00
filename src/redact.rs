//! URL redaction for errors and logs (registries and git remotes). URLs can carry secrets:
//! userinfo, the signed `_state` of an upload session, pre-signed storage redirects
//! (`X-Amz-Signature`, `sig`) and token query parameters. Only query keys known to be
//! harmless keep their values.

use url::Url;

/// Query keys whose values are safe to show (digests, repository names, paging, token scopes).
const SAFE_QUERY_KEYS: [&str; 8] = [
    "digest", "mount", "from", "service", "scope", "n", "last", "ns",
];

/// The URL as text without userinfo, fragment or any query value not on the safe list.
pub fn redact_url(url: &Url) -> String {
    let mut clean = url.clone();
    // Both setters only fail for URLs that cannot have credentials (`data:` etc.), which have
    // none to strip.
    let _ = clean.set_username("");
    let _ = clean.set_password(None);
    clean.set_fragment(None);
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let safe = SAFE_QUERY_KEYS.iter().any(|s| k.eq_ignore_ascii_case(s));
                let v = if safe {
                    v.into_owned()
                } else {
                    "REDACTED".to_string()
                };
                (k.into_owned(), v)
            })
            .collect();
        clean.set_query(None);
        if !pairs.is_empty() {
            clean.query_pairs_mut().extend_pairs(pairs);
        }
    }
    clean.to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_and_state_and_signatures_are_removed() {
        let url = Url::parse(
            "https://user:hunter2@reg.example/v2/a/blobs/uploads/u1?_state=SECRET&digest=\
                sha256%3Aab#frag",
        )
        .unwrap();
        let shown = redact_url(&url);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("user"), "{shown}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(!shown.contains("frag"), "{shown}");
        assert!(shown.contains("_state=REDACTED"), "{shown}");
        assert!(shown.contains("digest=sha256%3Aab"), "{shown}");
    }

    #[test]
    fn token_like_query_values_are_hidden_and_scopes_kept() {
        let url = Url::parse(
            "https://auth.example/token?service=reg&scope=repository%3Aa%3Apull&access_token=T0K&\
                X-Amz-Signature=S1G",
        )
        .unwrap();
        let shown = redact_url(&url);
        assert!(!shown.contains("T0K") && !shown.contains("S1G"), "{shown}");
        assert!(shown.contains("scope=repository%3Aa%3Apull"), "{shown}");
    }

    #[test]
    fn urls_without_query_are_unchanged() {
        let url = Url::parse("http://127.0.0.1:5000/v2/").unwrap();
        assert_eq!(redact_url(&url), "http://127.0.0.1:5000/v2/");
    }
}
