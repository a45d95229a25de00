//! `WWW-Authenticate` challenge parsing (RFC 7235): `Basic realm="…"` and
//! `Bearer realm="…",service="…",scope="…"`, with quoted values that may contain commas, and
//! several challenges in one header or across headers.

use reqwest::header::{HeaderMap, WWW_AUTHENTICATE};

/// What a 401 response asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Challenge {
    /// HTTP Basic authentication.
    Basic,
    /// A token from `realm` (the distribution token protocol).
    Bearer(BearerChallenge),
}

/// The parameters of a `Bearer` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BearerChallenge {
    /// The token endpoint.
    pub realm: String,
    /// The `service` to ask the token for.
    pub service: Option<String>,
    /// The scopes the failed request needed (`repository:a:pull,push`).
    pub scopes: Vec<String>,
    /// `invalid_token`, `insufficient_scope`, … when given.
    pub error: Option<String>,
}

/// One raw challenge: lowercase scheme plus parameters (names lowercased).
#[derive(Clone, Debug, PartialEq, Eq)]
struct RawChallenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl RawChallenge {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The challenge to answer from a response's headers: Bearer (with a realm) is preferred over
/// Basic; other schemes are ignored.
pub(crate) fn from_headers(headers: &HeaderMap) -> Option<Challenge> {
    let raw: Vec<RawChallenge> = headers
        .get_all(WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(parse)
        .collect();
    let bearer = raw.iter().find(|c| c.scheme == "bearer").and_then(|c| {
        let realm = c.param("realm").filter(|r| !r.is_empty())?;
        Some(Challenge::Bearer(BearerChallenge {
            realm: realm.to_string(),
            service: c.param("service").map(str::to_string),
            scopes: c
                .params
                .iter()
                .filter(|(k, _)| k == "scope")
                .flat_map(|(_, v)| v.split_whitespace().map(str::to_string))
                .collect(),
            error: c.param("error").map(str::to_string),
        }))
    });
    bearer.or_else(|| {
        raw.iter()
            .any(|c| c.scheme == "basic")
            .then_some(Challenge::Basic)
    })
}

/// Parses one header value into its challenges.
fn parse(header: &str) -> Vec<RawChallenge> {
    let mut out: Vec<RawChallenge> = Vec::new();
    let mut p = Parser {
        s: header.as_bytes(),
        i: 0,
    };
    loop {
        p.skip(|b| b == b',' || b.is_ascii_whitespace());
        if p.done() {
            return out;
        }
        let token = p.token();
        if token.is_empty() {
            // A stray '=' or a quoted string without a name: skip it.
            if p.peek() == Some(b'"') {
                p.quoted();
            } else {
                p.i += 1;
            }
            continue;
        }
        p.skip(|b| b.is_ascii_whitespace());
        match (p.peek(), out.last_mut()) {
            (Some(b'='), Some(current)) => {
                p.i += 1;
                p.skip(|b| b.is_ascii_whitespace());
                let value = if p.peek() == Some(b'"') {
                    p.quoted()
                } else {
                    p.token()
                };
                current.params.push((token.to_ascii_lowercase(), value));
            }
            _ => out.push(RawChallenge {
                scheme: token.to_ascii_lowercase(),
                params: Vec::new(),
            }),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip(&mut self, pred: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&pred) {
            self.i += 1;
        }
    }

    /// Characters up to whitespace, ',', '=' or '"'.
    fn token(&mut self) -> String {
        let start = self.i;
        self.skip(|b| !(b.is_ascii_whitespace() || matches!(b, b',' | b'=' | b'"')));
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    /// A quoted string starting at the current '"', with backslash escapes.
    fn quoted(&mut self) -> String {
        let mut out = Vec::new();
        self.i += 1;
        while let Some(b) = self.peek() {
            self.i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    if let Some(next) = self.peek() {
                        out.push(next);
                        self.i += 1;
                    }
                }
                _ => out.push(b),
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(WWW_AUTHENTICATE, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn bearer_challenges_with_quoted_commas_and_several_scopes_parse() {
        let h = headers(&[
            "Bearer realm=\"https://auth.example/token\",service=\"reg.example\",scope=\
                \"repository:a/b:pull,push repository:c:pull\",error=\"insufficient_scope\"",
        ]);
        let Some(Challenge::Bearer(b)) = from_headers(&h) else {
            panic!("no bearer")
        };
        assert_eq!(b.realm, "https://auth.example/token");
        assert_eq!(b.service.as_deref(), Some("reg.example"));
        assert_eq!(b.scopes, ["repository:a/b:pull,push", "repository:c:pull"]);
        assert_eq!(b.error.as_deref(), Some("insufficient_scope"));
    }

    #[test]
    fn basic_and_unusual_spacing_parse() {
        assert_eq!(
            from_headers(&headers(&[r#"Basic realm="basic-realm""#])),
            Some(Challenge::Basic)
        );
        assert_eq!(from_headers(&headers(&["basic"])), Some(Challenge::Basic));
        let h = headers(&[r#"BEARER  realm = "http://t/x" , Scope=repository:a:pull"#]);
        let Some(Challenge::Bearer(b)) = from_headers(&h) else {
            panic!("no bearer")
        };
        assert_eq!(
            (b.realm.as_str(), b.scopes.len(), b.service),
            ("http://t/x", 1, None)
        );
    }

    #[test]
    fn bearer_is_preferred_over_basic_across_and_within_headers() {
        let one = headers(&[r#"Basic realm="r", Bearer realm="http://t/token",service="s""#]);
        assert!(matches!(from_headers(&one), Some(Challenge::Bearer(_))));
        let two = headers(&[r#"Basic realm="r""#, r#"Bearer realm="http://t/token""#]);
        assert!(matches!(from_headers(&two), Some(Challenge::Bearer(_))));
    }

    #[test]
    fn escapes_and_garbage_do_not_break_parsing() {
        let raw = parse(r#"Bearer realm="a\"b,c", ="x", service=svc"#);
        assert_eq!(raw.len(), 1);
        assert_eq!(raw[0].param("realm"), Some("a\"b,c"));
        assert_eq!(raw[0].param("service"), Some("svc"));
        assert!(from_headers(&headers(&["Negotiate abc"])).is_none());
        assert!(from_headers(&headers(&[r#"Bearer service="s""#])).is_none());
        assert!(from_headers(&HeaderMap::new()).is_none());
    }
}
