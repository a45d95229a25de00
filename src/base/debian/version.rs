//! Debian package versions (`[epoch:]upstream[-revision]`) and dpkg's ordering of them:
//! numeric epochs, then `verrevcmp` on upstream and revision, where `~` sorts before everything
//! (even the end of the string) and letters sort before other symbols.
//! Spec: <https://www.debian.org/doc/debian-policy/ch-controlfields.html#version>.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A parsed Debian version. Equality follows dpkg's ordering, so `1.0` equals `0:1.0-0`.
#[derive(Debug, Clone)]
pub struct Version {
    epoch: u64,
    upstream: String,
    revision: String,
    text: String,
}

/// Why a string is not a Debian version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a Debian version")]
pub struct VersionError(pub String);

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let bad = || VersionError(s.to_string());
        if text.is_empty() || text.contains(char::is_whitespace) {
            return Err(bad());
        }
        let (epoch, rest) = match text.split_once(':') {
            Some((epoch, rest)) => (epoch.parse::<u64>().map_err(|_| bad())?, rest),
            None => (0, text),
        };
        let (upstream, revision) = rest.rsplit_once('-').unwrap_or((rest, ""));
        if upstream.is_empty() {
            return Err(bad());
        }
        Ok(Version {
            epoch,
            upstream: upstream.to_string(),
            revision: revision.to_string(),
            text: text.to_string(),
        })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then_with(|| verrevcmp(&self.upstream, &other.upstream))
            .then_with(|| verrevcmp(&self.revision, &other.revision))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

/// dpkg's weight of one character in a non-digit run; `None` is the end of the string.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(b'~') => -1,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(c) => i32::from(c) + 256,
    }
}

/// dpkg's `verrevcmp` (lib/dpkg/version.c): alternate non-digit runs, compared by [`order`],
/// and digit runs, compared numerically.
fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
    while i < a.len() || j < b.len() {
        while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
            let (ac, bc) = (order(a.get(i).copied()), order(b.get(j).copied()));
            if ac != bc {
                return ac.cmp(&bc);
            }
            i += 1;
            j += 1;
        }
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while digit(a, i) && digit(b, j) {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if digit(a, i) {
            return Ordering::Greater;
        }
        if digit(b, j) {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmp(a: &str, b: &str) -> Ordering {
        a.parse::<Version>()
            .unwrap()
            .cmp(&b.parse::<Version>().unwrap())
    }

    #[test]
    fn dpkg_test_vectors_compare_like_dpkg() {
        use Ordering::*;
        // From dpkg's lib/dpkg/t/t-version.c and the Debian policy examples.
        let cases = [
            ("0:0-0", "0:0-0", Equal),
            ("0:0-0", "0:0", Equal),
            ("0", "0:0-0", Equal),
            ("0:0.0-0", "0:0-0", Greater),
            ("0:0-0-0", "0:0-0", Greater),
            ("0:09", "0:9", Equal),
            ("0:9", "0:10", Less),
            ("0:0-00", "0:0-0", Equal),
            ("0:0-0", "0:0-1", Less),
            ("0:0-a", "0:0-b", Less),
            ("0:0-a", "0:0-0", Greater),
            ("1:0", "0:10", Greater),
            ("1:0.4", "10.3", Greater),
            ("1.0~rc1", "1.0", Less),
            ("1.0~rc1-1", "1.0~rc2-1", Less),
            ("1~~", "1~~a", Less),
            ("1~~a", "1~", Less),
            ("1~", "1", Less),
            ("1", "1a", Less),
            ("1.0a", "1.0+", Less),
            ("1.2.3", "1.2.10", Less),
            ("2.0.7pre1", "2.0.7r", Less),
            ("1.0+b1", "1.0", Greater),
            ("3.13.5-2+deb13u5", "3.13.5-2", Greater),
            ("3.13.5-2~bpo12+1", "3.13.5-2", Less),
            ("1:1.2.0", "1.2.13.dfsg-1", Greater),
            ("2.38", "2.41-12", Less),
        ];
        for (a, b, want) in cases {
            assert_eq!(cmp(a, b), want, "{a} vs {b}");
            assert_eq!(cmp(b, a), want.reverse(), "{b} vs {a}");
        }
    }

    #[test]
    fn malformed_versions_are_rejected_and_text_is_kept() {
        for bad in ["", "a:1", ":1", "1 2", "1:-1"] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?}");
        }
        let v: Version = "1:2.3-4".parse().unwrap();
        assert_eq!(v.to_string(), "1:2.3-4");
    }
}
