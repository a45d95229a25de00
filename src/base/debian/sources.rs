//! Finding the machine's configured Debian mirror in apt's sources (one-line `.list` and deb822
//! `.sources` files). The parser is pure and works on file contents; only
//! [`system_mirror_url`] and [`mirror_from_dir`] touch the file system. No host name is built in:
//! the mirror always comes from the machine's configuration or from the caller.

use std::fs;
use std::path::Path;

use url::Url;

use super::control;

/// One `deb` or `deb-src` source, from either file format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    /// `deb` or `deb-src`.
    pub kind: String,
    /// The archive root URI.
    pub uri: String,
    /// Suites (distributions), e.g. `trixie`, `trixie-updates`.
    pub suites: Vec<String>,
    /// Components, e.g. `main`.
    pub components: Vec<String>,
    /// The `signed-by` option, when given as a path or fingerprint list.
    pub signed_by: Option<String>,
}

/// How a sources file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcesFormat {
    /// `deb [options] URI suite component…`, one source per line (`*.list`).
    OneLine,
    /// deb822 paragraphs with `Types`, `URIs`, `Suites`, `Components` (`*.sources`).
    Deb822,
}

/// Parses the contents of one sources file into entries (disabled ones left out).
pub fn parse_sources(contents: &str, format: SourcesFormat) -> Vec<SourceEntry> {
    match format {
        SourcesFormat::OneLine => contents.lines().filter_map(parse_one_line).collect(),
        SourcesFormat::Deb822 => parse_deb822(contents),
    }
}

fn parse_one_line(line: &str) -> Option<SourceEntry> {
    let line = line.split('#').next().unwrap_or_default().trim();
    let (kind, rest) = line.split_once(char::is_whitespace)?;
    if kind != "deb" && kind != "deb-src" {
        return None;
    }
    let rest = rest.trim_start();
    let mut signed_by = None;
    let rest = match rest.strip_prefix('[') {
        Some(options) => {
            let (options, after) = options.split_once(']')?;
            for option in options.split_whitespace() {
                if let Some(value) = option.strip_prefix("signed-by=") {
                    signed_by = Some(value.to_string());
                }
            }
            after
        }
        None => rest,
    };
    let mut words = rest.split_whitespace();
    let uri = words.next()?.to_string();
    let suite = words.next()?.to_string();
    Some(SourceEntry {
        kind: kind.to_string(),
        uri,
        suites: vec![suite],
        components: words.map(str::to_string).collect(),
        signed_by,
    })
}

fn parse_deb822(contents: &str) -> Vec<SourceEntry> {
    let mut entries = Vec::new();
    for paragraph in control::paragraphs(contents) {
        let enabled = paragraph
            .get("Enabled")
            .is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        if !enabled {
            continue;
        }
        let words = |name: &str| -> Vec<String> {
            let value = paragraph.get(name).unwrap_or_default();
            value.split_whitespace().map(str::to_string).collect()
        };
        // An inline armored key is also a Signed-By value; only a one-line value is a reference.
        let signed_by = paragraph
            .get("Signed-By")
            .filter(|v| !v.contains('\n'))
            .map(str::to_string);
        for kind in words("Types") {
            for uri in words("URIs") {
                entries.push(SourceEntry {
                    kind: kind.clone(),
                    uri,
                    suites: words("Suites"),
                    components: words("Components"),
                    signed_by: signed_by.clone(),
                });
            }
        }
    }
    entries
}

/// Whether `suite` is a main archive suite rather than an overlay such as `-security`,
/// `-updates`, `-backports` or `-proposed-updates`.
fn is_main_suite(suite: &str) -> bool {
    !suite.contains(['-', '/'])
}

/// Whether an entry serves component `main` of the Debian archive: a binary source whose URI is
/// a `/debian` archive root (or that is signed by the Debian archive keyring) with a main suite.
fn is_debian_main(entry: &SourceEntry) -> bool {
    let Ok(url) = Url::parse(&entry.uri) else {
        return false;
    };
    let last_segment = url
        .path_segments()
        .and_then(|mut s| s.rfind(|s| !s.is_empty()));
    let debian_root = last_segment == Some("debian")
        || entry
            .signed_by
            .as_deref()
            .is_some_and(|s| s.contains("debian-archive-keyring"));
    entry.kind == "deb"
        && matches!(url.scheme(), "http" | "https")
        && debian_root
        && entry.components.iter().any(|c| c == "main")
        && entry.suites.iter().any(|s| is_main_suite(s))
}

/// The URI of the first entry serving `main` of the Debian archive, in the order given.
pub fn find_debian_mirror(entries: &[SourceEntry]) -> Option<Url> {
    let entry = entries.iter().find(|e| is_debian_main(e))?;
    Url::parse(entry.uri.trim_end_matches('/')).ok()
}

/// The Debian mirror configured in the apt directory `etc_apt` (normally `/etc/apt`):
/// `sources.list` first, then `sources.list.d/*.list` and `*.sources` in name order, as apt
/// reads them. Unreadable files are skipped.
pub fn mirror_from_dir(etc_apt: &Path) -> Option<Url> {
    let mut files = vec![(etc_apt.join("sources.list"), SourcesFormat::OneLine)];
    let mut parts: Vec<_> = fs::read_dir(etc_apt.join("sources.list.d"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    parts.sort();
    for path in parts {
        match path.extension().and_then(|e| e.to_str()) {
            Some("list") => files.push((path, SourcesFormat::OneLine)),
            Some("sources") => files.push((path, SourcesFormat::Deb822)),
            _ => {}
        }
    }
    let entries: Vec<SourceEntry> = files
        .iter()
        .filter_map(|(path, format)| Some(parse_sources(&fs::read_to_string(path).ok()?, *format)))
        .flatten()
        .collect();
    find_debian_mirror(&entries)
}

/// The machine's configured Debian mirror: the first `deb` URI serving component `main` of the
/// Debian archive in `/etc/apt/sources.list` and `/etc/apt/sources.list.d/*.{list,sources}`.
pub fn system_mirror_url() -> Option<Url> {
    mirror_from_dir(Path::new("/etc/apt"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# a comment between fields
URIs: http://mirror.example/debian-security
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://mirror.example/debian/
Suites: trixie trixie-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://other.example/debian
Suites: trixie
Components: main
Enabled: no
";

    #[test]
    fn deb822_sources_skip_security_and_pick_the_main_archive() {
        let entries = parse_sources(DEB822, SourcesFormat::Deb822);
        assert_eq!(entries.len(), 3, "{entries:?}");
        assert_eq!(entries[1].suites, ["trixie", "trixie-updates"]);
        assert_eq!(entries[2].kind, "deb-src");
        let url = find_debian_mirror(&entries).unwrap();
        assert_eq!(url.as_str(), "http://mirror.example/debian");
    }

    #[test]
    fn one_line_sources_with_options_and_overlay_suites() {
        let list = "\
# deb http://commented.example/debian trixie main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
    http://mirror.example/debian-security trixie-security main
deb https://vendor.example/apt nodistro main
deb [ signed-by=/usr/share/keyrings/debian-archive-keyring.gpg ] http://mirror.example/debian \
    trixie-updates main
deb-src http://mirror.example/debian trixie main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://mirror.example/debian trixie \
    main non-free-firmware # tail
";
        let entries = parse_sources(list, SourcesFormat::OneLine);
        assert_eq!(entries.len(), 5, "{entries:?}");
        assert_eq!(
            entries[0].signed_by.as_deref(),
            Some("/usr/share/keyrings/debian-archive-keyring.gpg")
        );
        assert_eq!(entries[4].components, ["main", "non-free-firmware"]);
        let url = find_debian_mirror(&entries).unwrap();
        assert_eq!(url.as_str(), "http://mirror.example/debian");
    }

    #[test]
    fn a_third_party_repository_is_not_taken_for_debian() {
        let entries = parse_sources(
            "deb [signed-by=/usr/share/keyrings/vendor.gpg] http://vendor.example/apt stable \
                main\n",
            SourcesFormat::OneLine,
        );
        assert_eq!(find_debian_mirror(&entries), None);
    }

    #[test]
    fn the_directory_reader_reads_list_and_sources_files_in_order() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sources.list.d")).unwrap();
        fs::write(dir.path().join("sources.list"), "# empty\n").unwrap();
        fs::write(dir.path().join("sources.list.d/a.sources"), DEB822).unwrap();
        fs::write(
            dir.path().join("sources.list.d/b.list"),
            "deb http://later.example/debian trixie main\n",
        )
        .unwrap();
        let url = mirror_from_dir(dir.path()).unwrap();
        assert_eq!(url.as_str(), "http://mirror.example/debian");
        assert_eq!(mirror_from_dir(&dir.path().join("absent")), None);
    }
}
