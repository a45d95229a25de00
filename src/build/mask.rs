//! Masking credentials in what an install prints before kiln quotes it in an error. Two
//! layers: every secret value the install was given (from its `.npmrc`/`pip.conf`: the values
//! of keys that name a token, password, auth or key, the user and password of any URL, the
//! halves of a base64 `_auth`) is replaced wherever and however often it appears; then the
//! shapes credentials take anyway (URL user info, `_authToken=`, `"_authToken": "…"`,
//! `Authorization: Bearer …`) are masked for values kiln never saw.

use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::function::NamedBytes;

/// What replaces a secret.
const MASK: &str = "***";
/// Values shorter than this are not masked by value (they would mask ordinary words); the
/// shape rules still apply to them.
const MIN_SECRET: usize = 4;

/// A secret this long at least is looked for in what an install leaves
/// ([`Secrets::first_file_holding`]): a shorter one could be any word in a package.
const MIN_LOOKED_FOR: usize = 10;

/// The secret values an install was given.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    /// Every value masked in what the install prints.
    all: Vec<String>,
    /// Those a credential is made of (not user names), looked for in what it leaves.
    strong: Vec<String>,
}

impl Secrets {
    /// The secrets in `configs` (`key=value` or `key: value` lines).
    pub fn from_configs(configs: &[NamedBytes]) -> Secrets {
        let mut found = Vec::new();
        let mut names = Vec::new();
        for config in configs {
            let text = String::from_utf8_lossy(&config.bytes);
            for line in text.lines().map(str::trim) {
                if line.starts_with(['#', ';', '[']) {
                    continue;
                }
                // `//host/:_authToken=…`: the key is everything before the last '=' that is
                // followed by the value; pip.conf also allows `key: value`.
                let Some((key, value)) = line.split_once('=').or_else(|| line.split_once(": "))
                else {
                    continue;
                };
                let value = value.trim().trim_matches(['"', '\'']);
                let key = key.trim().to_ascii_lowercase();
                for part in value.split_whitespace() {
                    userinfo(part, &mut found, &mut names);
                }
                if ["auth", "token", "pass", "secret", "key", "cred"]
                    .iter()
                    .any(|k| key.contains(k))
                {
                    found.push(value.to_string());
                    if key.ends_with("_auth")
                        && let Ok(plain) = base64::engine::general_purpose::STANDARD.decode(value)
                    {
                        let plain = String::from_utf8_lossy(&plain).into_owned();
                        if let Some((_, password)) = plain.split_once(':') {
                            found.push(password.to_string());
                        }
                        found.push(plain);
                    }
                }
            }
        }
        let strong: Vec<String> = found
            .iter()
            .filter(|s| s.len() >= MIN_LOOKED_FOR)
            .cloned()
            .collect();
        found.extend(names);
        found.retain(|s| s.len() >= MIN_SECRET);
        // Longest first, so a value containing another is masked whole.
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        found.dedup();
        Secrets { all: found, strong }
    }

    /// The first file under `root` (relative to it) whose bytes hold one of the secrets a
    /// credential is made of (a token, a password, `user:password`; not a user name alone,
    /// which may well appear in a package), walked without following links. `None` when
    /// there are no such secrets, or no file holds one.
    ///
    /// # Errors
    /// Reading the tree.
    pub fn first_file_holding(&self, root: &Path) -> std::io::Result<Option<PathBuf>> {
        let finders: Vec<memchr::memmem::Finder<'_>> = self
            .strong
            .iter()
            .map(|s| memchr::memmem::Finder::new(s.as_bytes()))
            .collect();
        let Some(longest) = self.strong.iter().map(String::len).max() else {
            return Ok(None);
        };
        let mut dirs = vec![root.to_path_buf()];
        let mut buf = vec![0u8; CHUNK + longest];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let kind = entry.file_type()?;
                if kind.is_dir() {
                    dirs.push(entry.path());
                } else if kind.is_file() && holds(&entry.path(), &finders, longest, &mut buf)? {
                    let path = entry.path();
                    return Ok(Some(path.strip_prefix(root).unwrap_or(&path).to_path_buf()));
                }
            }
        }
        Ok(None)
    }

    /// `text` with every known secret and every credential shape masked.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.all {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), MASK);
            }
        }
        out.lines().map(redact).collect::<Vec<_>>().join("\n")
    }
}

/// The bytes read from a file at a time when looking for secrets in it.
const CHUNK: usize = 1 << 20;

/// Whether the file at `path` holds what one of `finders` finds; `buf` holds a chunk and the
/// `longest - 1` bytes before it, so a secret across two chunks is found.
fn holds(
    path: &Path,
    finders: &[memchr::memmem::Finder<'_>],
    longest: usize,
    buf: &mut [u8],
) -> std::io::Result<bool> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let keep = longest - 1;
    let mut kept = 0;
    loop {
        let n = file.read(&mut buf[kept..])?;
        if n == 0 {
            return Ok(false);
        }
        let filled = kept + n;
        if finders.iter().any(|f| f.find(&buf[..filled]).is_some()) {
            return Ok(true);
        }
        kept = keep.min(filled);
        buf.copy_within(filled - kept..filled, 0);
    }
}

/// Adds the password of `url` (and `user:password`) to `found`, its user name to `names`, if
/// it has them.
fn userinfo(url: &str, found: &mut Vec<String>, names: &mut Vec<String>) {
    let Ok(url) = url::Url::parse(url) else {
        return;
    };
    if let Some(password) = url.password() {
        found.push(password.to_string());
        found.push(percent_decode(password));
        found.push(format!("{}:{}", url.username(), password));
    }
    if !url.username().is_empty() {
        names.push(percent_decode(url.username()));
    }
}

/// `%XX` decoding (URL user info is percent-encoded; a tool may print either form).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Masks the shapes credentials take in one line: `user:password@` in URLs, every
/// `_authToken=`/`_auth=`/`_password=`/`password=` value, JSON `"_authToken": "…"` (and the
/// same keys), and the credentials of an `Authorization: Bearer|Basic …` header.
pub fn redact(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '/')
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str(MASK);
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    for key in ["_authToken", "_auth", "_password", "password", "token"] {
        out = mask_after(&out, &format!("{key}="), |c| c.is_whitespace());
        out = mask_after(&out, &format!("\"{key}\":\""), |c| c == '"');
        out = mask_after(&out, &format!("\"{key}\": \""), |c| c == '"');
    }
    for scheme in ["Bearer ", "Basic ", "bearer ", "basic "] {
        out = mask_after(&out, scheme, |c| c.is_whitespace() || c == '"' || c == '\'');
    }
    out
}

/// Masks what follows every occurrence of `key`, up to a character that `ends` accepts.
fn mask_after(text: &str, key: &str, ends: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(key) {
        let start = i + key.len();
        out.push_str(&rest[..start]);
        let end = rest[start..].find(&ends).map_or(rest.len(), |e| start + e);
        if end > start && &rest[start..end] != MASK {
            out.push_str(MASK);
        } else {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> Secrets {
        let npmrc = "registry=https://npm.example/\n\
                     //npm.example/:_authToken=npm_T0KEN_abc123\n\
                     //other.example/:_auth=dXNlcjpodW50ZXIy\n\
                     @acme:registry=https://bob:s3cr%40t@acme.example/\n\
                     always-auth=true\nloglevel=warn\n";
        let pip = "[global]\nindex-url = https://alice:pipPassw0rd@pypi.example/simple\n";
        Secrets::from_configs(&[
            NamedBytes {
                name: ".npmrc".into(),
                bytes: npmrc.into(),
            },
            NamedBytes {
                name: "pip.conf".into(),
                bytes: pip.into(),
            },
        ])
    }

    #[test]
    fn a_file_an_install_left_holding_a_credential_is_found_and_a_user_name_is_not() {
        let s = secrets();
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("node_modules");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        // User names are no secret: a package may name "alice" or "bob".
        std::fs::write(tree.join("a/names.js"), "alice bob npm.example").unwrap();
        // A link is not followed, whatever it points at.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "npm_T0KEN_abc123").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        assert_eq!(s.first_file_holding(&tree).unwrap(), None);
        // Across two chunks of the read.
        let mut big = vec![b'x'; CHUNK - 5];
        big.extend_from_slice(b"pipPassw0rd and more");
        std::fs::write(tree.join("a/b/big.bin"), &big).unwrap();
        assert_eq!(
            s.first_file_holding(&tree).unwrap(),
            Some(PathBuf::from("a/b/big.bin"))
        );
        assert_eq!(
            Secrets::default().first_file_holding(&tree).unwrap(),
            None,
            "nothing to look for"
        );
    }

    #[test]
    fn every_secret_from_the_configs_is_masked_in_every_shape_and_occurrence() {
        let s = secrets();
        let leaky = [
            "token npm_T0KEN_abc123 and again npm_T0KEN_abc123",
            "npm_T0KEN_abc123",
            "Authorization: Bearer npm_T0KEN_abc123",
            r#"{"_authToken":"npm_T0KEN_abc123","other":"x"}"#,
            "_auth=dXNlcjpodW50ZXIy decoded user:hunter2 or hunter2",
            "GET https://bob:s3cr%40t@acme.example/x then s3cr@t",
            "index https://alice:pipPassw0rd@pypi.example/simple pipPassw0rd",
        ];
        for line in leaky {
            let masked = s.mask(line);
            for secret in [
                "npm_T0KEN_abc123",
                "dXNlcjpodW50ZXIy",
                "hunter2",
                "s3cr%40t",
                "s3cr@t",
                "pipPassw0rd",
            ] {
                assert!(!masked.contains(secret), "{line:?} -> {masked:?}");
            }
        }
        // What is not secret stays readable.
        assert_eq!(
            s.mask("npm warn GET https://npm.example/pkg 404"),
            "npm warn GET https://npm.example/pkg 404"
        );
    }

    #[test]
    fn credential_shapes_are_masked_without_knowing_the_values() {
        assert_eq!(
            redact("GET https://user:s3cret@reg.example/pkg 401"),
            "GET https://***@reg.example/pkg 401"
        );
        assert_eq!(
            redact("//reg/:_authToken=abc123 x //r2/:_authToken=def456"),
            "//reg/:_authToken=*** x //r2/:_authToken=***"
        );
        assert_eq!(
            redact(r#"{"_authToken": "abc", "token":"def"}"#),
            r#"{"_authToken": "***", "token":"***"}"#
        );
        assert_eq!(
            redact("authorization: Bearer eyJabc.def"),
            "authorization: Bearer ***"
        );
        assert_eq!(redact("plain line"), "plain line");
    }
}
