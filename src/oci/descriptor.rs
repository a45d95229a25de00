//! Content descriptors and platforms
//! (<https://github.com/opencontainers/image-spec/blob/main/descriptor.md>).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Digest, MediaType};

/// A reference to content by media type, digest and size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the content is.
    pub media_type: MediaType,
    /// Its digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Where else the content may be fetched (foreign layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
    /// Arbitrary metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    /// The platform of a manifest inside an index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// The artifact type of an artifact manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

impl Descriptor {
    /// A descriptor with only the three required fields.
    pub fn new(media_type: MediaType, digest: Digest, size: u64) -> Descriptor {
        Descriptor {
            media_type,
            digest,
            size,
            urls: None,
            annotations: None,
            platform: None,
            artifact_type: None,
        }
    }
}

/// The platform an image runs on
/// (<https://github.com/opencontainers/image-spec/blob/main/image-index.md>, "platform").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU architecture in GOARCH terms (`amd64`, `arm64`).
    pub architecture: String,
    /// Operating system in GOOS terms (`linux`).
    pub os: String,
    /// OS version (Windows).
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
    /// OS features (Windows).
    #[serde(
        rename = "os.features",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_features: Option<Vec<String>>,
    /// CPU variant (`v8` for arm64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// `linux/amd64`.
    pub fn linux_amd64() -> Platform {
        Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            os_version: None,
            os_features: None,
            variant: None,
        }
    }

    /// `linux/ARCH` for a GOARCH (which is also Debian's name for `amd64` and `arm64`).
    pub fn linux(architecture: &str) -> Platform {
        Platform {
            architecture: architecture.into(),
            ..Platform::linux_amd64()
        }
    }

    /// The machine kiln runs on, in GOARCH terms.
    pub fn host() -> Platform {
        Platform::linux(match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "loongarch64" => "loong64",
            other => other,
        })
    }

    /// Node.js's and npm's name for the architecture (`process.arch`: `x64`, `arm64`).
    pub fn node_cpu(&self) -> &str {
        match self.architecture.as_str() {
            "amd64" => "x64",
            "386" => "ia32",
            "ppc64le" => "ppc64",
            other => other,
        }
    }

    /// The kernel's name for the architecture (`uname -m`, Python's `platform.machine()`,
    /// wheel tags, `qemu-MACHINE-static`): `x86_64`, `aarch64`; `None` for one kiln does not
    /// know.
    pub fn machine(&self) -> Option<&'static str> {
        Some(match self.architecture.as_str() {
            "amd64" => "x86_64",
            "arm64" => "aarch64",
            _ => return None,
        })
    }

    /// Parses `os/arch[/variant]`, each part lower-case letters, digits, `_`, `.` or `-` (so
    /// a list such as `linux/amd64,linux/arm64` is not one platform).
    pub fn parse(s: &str) -> Option<Platform> {
        let word = |p: &&str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
        };
        let mut parts = s.split('/');
        let os = parts.next().filter(word)?;
        let architecture = parts.next().filter(word)?;
        let variant = match parts.next() {
            Some(v) if word(&v) => Some(v.to_string()),
            Some(_) => return None,
            None => None,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Platform {
            architecture: architecture.into(),
            os: os.into(),
            os_version: None,
            os_features: None,
            variant,
        })
    }

    /// Parses a comma-separated list of platforms (`linux/amd64,linux/arm64`), each once.
    ///
    /// # Errors
    /// Which part is not a platform, or which platform is named twice.
    pub fn parse_list(s: &str) -> Result<Vec<Platform>, String> {
        let mut platforms: Vec<Platform> = Vec::new();
        for part in s.split(',').map(str::trim) {
            let platform = Platform::parse(part).ok_or_else(|| {
                format!(
                    "{part:?} is not a platform: expected OS/ARCH[/VARIANT], e.g. linux/amd64, \
                     or a list such as linux/amd64,linux/arm64"
                )
            })?;
            if platforms.contains(&platform) {
                return Err(format!("{platform} is named twice"));
            }
            platforms.push(platform);
        }
        Ok(platforms)
    }

    /// The platform as one file name: `linux-amd64`, `linux-arm-v7`.
    pub fn file_name(&self) -> String {
        self.to_string().replace('/', "-")
    }

    /// Whether an index entry with platform `other` satisfies this wanted platform. A wanted
    /// platform without a variant accepts any variant.
    pub fn matches(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && (self.variant.is_none() || self.variant == other.variant)
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}
