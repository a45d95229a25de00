//! Content digests (`sha256:<hex>`) and the hashing adapters that compute them while bytes
//! stream through a writer or reader. Only SHA-256 is produced or accepted: it is what every
//! registry and the OCI image-spec require
//! (<https://github.com/opencontainers/image-spec/blob/main/descriptor.md#digests>).

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A validated `sha256:<64 lowercase hex>` content digest.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

/// Why a string is not a digest kiln accepts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    /// The string has no `algorithm:` prefix.
    #[error("digest {0:?} has no algorithm prefix (expected sha256:<hex>)")]
    MissingAlgorithm(String),
    /// An algorithm other than sha256.
    #[error("digest {0:?} uses an unsupported algorithm (only sha256 is supported)")]
    UnsupportedAlgorithm(String),
    /// The encoded part is not 64 lowercase hex characters.
    #[error("digest {0:?} is not 64 lowercase hex characters after sha256:")]
    BadHex(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let mut hasher = Hasher::new();
        hasher.update(bytes);
        hasher.finish().0
    }

    /// The 64 hex characters without the `sha256:` prefix.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The algorithm name, always `sha256`.
    pub fn algorithm(&self) -> &'static str {
        "sha256"
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((algo, hex)) = s.split_once(':') else {
            return Err(DigestError::MissingAlgorithm(s.to_string()));
        };
        if algo != "sha256" {
            return Err(DigestError::UnsupportedAlgorithm(s.to_string()));
        }
        let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !valid {
            return Err(DigestError::BadHex(s.to_string()));
        }
        Ok(Digest {
            hex: hex.to_string(),
        })
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Incremental SHA-256 with a byte count; [`Hasher::finish`] gives the digest and size.
///
/// AWS-LC's SHA-256 (already linked for TLS): its assembly is about twice as fast as a
/// portable implementation on machines without SHA extensions, and hashing every layer
/// twice (compressed and not) is most of what unpacking an image costs.
#[derive(Clone)]
pub struct Hasher {
    sha: aws_lc_rs::digest::Context,
    len: u64,
}

impl Default for Hasher {
    fn default() -> Hasher {
        Hasher {
            sha: aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256),
            len: 0,
        }
    }
}

impl Hasher {
    /// A fresh hasher.
    pub fn new() -> Hasher {
        Hasher::default()
    }

    /// Feeds bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The digest and the number of bytes hashed.
    pub fn finish(self) -> (Digest, u64) {
        let digest = Digest {
            hex: hex::encode(self.sha.finish().as_ref()),
        };
        (digest, self.len)
    }
}

/// A writer that hashes everything written through it (the single-pass idea of
/// go-containerregistry's `stream.Layer`).
pub struct HashingWriter<W> {
    inner: W,
    hasher: Hasher,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Hasher::new(),
        }
    }

    /// The inner writer plus the digest and size of what passed through.
    pub fn finish(self) -> (W, Digest, u64) {
        let (digest, len) = self.hasher.finish();
        (self.inner, digest, len)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes everything read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Hasher::new(),
        }
    }

    /// The digest and size of what was read.
    pub fn finish(self) -> (Digest, u64) {
        self.hasher.finish()
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_of_empty_input_is_the_well_known_value() {
        assert_eq!(
            Digest::of(b"").to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn parsing_rejects_other_algorithms_and_bad_hex() {
        assert!(matches!(
            "md5:abc".parse::<Digest>(),
            Err(DigestError::UnsupportedAlgorithm(_))
        ));
        assert!(matches!(
            "sha256:ABC".parse::<Digest>(),
            Err(DigestError::BadHex(_))
        ));
        assert!(matches!(
            "nocolon".parse::<Digest>(),
            Err(DigestError::MissingAlgorithm(_))
        ));
        let d = Digest::of(b"x");
        assert_eq!(d.to_string().parse::<Digest>(), Ok(d));
    }

    #[test]
    fn hashing_writer_matches_one_shot_digest() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hello ").unwrap();
        w.write_all(b"world").unwrap();
        let (out, d, n) = w.finish();
        assert_eq!(out, b"hello world");
        assert_eq!(d, Digest::of(b"hello world"));
        assert_eq!(n, 11);
    }
}
