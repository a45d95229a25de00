//! The image configuration (<https://github.com/opencontainers/image-spec/blob/main/config.md>).
//! Fields kiln does not edit are kept through flattened maps, so a base image's metadata
//! (Docker's `container_config`, `os.version`, …) survives the rebuild untouched.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Digest;

/// An image config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// RFC 3339 creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// CPU architecture.
    pub architecture: String,
    /// Operating system.
    pub os: String,
    /// CPU variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// How to run a container from the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<RunConfig>,
    /// Uncompressed layer digests.
    pub rootfs: RootFs,
    /// One entry per build step, base first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<History>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// The `config` object: the execution parameters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    /// `user`, `uid`, `user:group` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Ports to expose, as `"8080/tcp": {}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_ports: Option<BTreeMap<String, Value>>,
    /// `KEY=value` entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    /// The entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// Default arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// Volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<BTreeMap<String, Value>>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Stop signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// Every other field (Docker's `Hostname`, `Image`, …), kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// The `rootfs` object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RootFs {
    /// Always `layers`.
    #[serde(rename = "type")]
    pub kind: String,
    /// One uncompressed digest per layer, base first.
    pub diff_ids: Vec<Digest>,
}

/// One history entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    /// When the step ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// What created the layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// Author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// True when the step made no layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_layer: Option<bool>,
}

impl ImageConfig {
    /// The number of history entries that made a layer.
    pub fn layer_history_len(&self) -> usize {
        self.history
            .iter()
            .filter(|h| h.empty_layer != Some(true))
            .count()
    }
}

impl RunConfig {
    /// Sets `KEY=value`, replacing an existing entry for `KEY` in place.
    pub fn set_env(&mut self, key: &str, value: &str) {
        let env = self.env.get_or_insert_with(Vec::new);
        let entry = format!("{key}={value}");
        match env.iter_mut().find(|e| e.split('=').next() == Some(key)) {
            Some(existing) => *existing = entry,
            None => env.push(entry),
        }
    }

    /// The `KEY=value` entries as pairs, in order (entries without `=` are skipped).
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        let entries = self.env.iter().flatten();
        let pairs = entries.filter_map(|e| e.split_once('='));
        pairs.map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The value of `KEY`, if set.
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env.as_ref()?.iter().find_map(|e| {
            let (k, v) = e.split_once('=')?;
            (k == key).then_some(v)
        })
    }
}

/// Formats seconds since the epoch as RFC 3339 UTC (`1970-01-01T00:00:00Z`).
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm), valid for the whole u64 seconds range
    // anyone will pass.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The epoch [`rfc3339`] wrote `text` for (`YYYY-MM-DDTHH:MM:SSZ` exactly); `None` for any
/// other text.
pub fn epoch_of(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let shape = b.len() == 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'Z';
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if !shape {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days-from-civil (Howard Hinnant's algorithm), the inverse of `rfc3339`'s.
    let y = y - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let epoch = u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()?;
    // Out-of-range fields (month 13, second 61) do not survive the round trip.
    (rfc3339(epoch) == text).then_some(epoch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn epoch_of_inverts_rfc3339() {
        for epoch in [
            0,
            59,
            951_782_400,
            1_700_000_000,
            4_102_444_800,
            253_402_300_799,
        ] {
            assert_eq!(epoch_of(&rfc3339(epoch)), Some(epoch), "{epoch}");
        }
        for bad in [
            "",
            "2023-13-01T00:00:00Z",
            "2023-11-14T22:13:20+01:00",
            "x023-11-14T22:13:20Z",
        ] {
            assert_eq!(epoch_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let raw = r#"{"architecture":"amd64","os":"linux","docker_version":"24",
            "config":{"Env":["PATH=/bin"],"Hostname":"x"},
            "rootfs":{"type":"layers","diff_ids":[]}}"#;
        let cfg: ImageConfig = serde_json::from_str(raw).unwrap();
        assert_eq!(cfg.extra["docker_version"], "24");
        let run = cfg.config.as_ref().unwrap();
        assert_eq!(run.extra["Hostname"], "x");
        let back = serde_json::to_value(&cfg).unwrap();
        assert_eq!(back["config"]["Hostname"], "x");
        assert_eq!(back["docker_version"], "24");
    }

    #[test]
    fn set_env_replaces_in_place() {
        let mut run = RunConfig {
            env: Some(vec!["A=1".into(), "B=2".into()]),
            ..Default::default()
        };
        run.set_env("A", "3");
        run.set_env("C", "4");
        assert_eq!(run.env.as_deref().unwrap(), ["A=3", "B=2", "C=4"]);
        assert_eq!(run.env_value("B"), Some("2"));
    }

    #[test]
    fn env_pairs_split_at_the_first_equals_sign_and_skip_malformed_entries() {
        let run = RunConfig {
            env: Some(vec!["A=1=2".into(), "junk".into(), "B=".into()]),
            ..Default::default()
        };
        let pairs = [("A", "1=2"), ("B", "")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(run.env_pairs(), pairs);
        assert!(RunConfig::default().env_pairs().is_empty());
    }
}
