//! Reading and unpacking one wheel as pip does into `--target`: its `.dist-info`, its
//! metadata headers, its members by scheme, the entry points' scripts and the `RECORD` pip
//! writes. Whatever pip could read differently is a [`Skip::Pip`].

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::Path;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use super::{Requirement, Target};
use crate::build::memtree::Building;
use crate::build::pep440::{self, Version};

/// The largest wheel member kiln reads (into memory); a bigger one is left to pip, which
/// streams it to disk.
const MEMBER_LIMIT: u64 = 256 << 20;

/// A wheel's metadata, as read from its `.dist-info`.
pub(super) struct Wheel {
    /// The file name.
    pub(super) filename: String,
    pub(super) dist_info: String,
    pub(super) name: String,
    pub(super) version: String,
    pub(super) requires: Vec<pep440::Dependency>,
    pub(super) requires_python: Option<String>,
    /// The archive's URL and SHA-256 (hex), recorded in its `provenance.json`.
    pub(super) archive: Option<(String, String)>,
}

/// Why a wheel is not installed by kiln: pip decides, or it is broken.
pub(super) enum Skip {
    Pip(String),
    Bad(String),
}

impl From<std::io::Error> for Skip {
    fn from(e: std::io::Error) -> Self {
        Skip::Bad(e.to_string())
    }
}

pub(super) fn read_member(
    zip: &mut zip::ZipArchive<std::fs::File>,
    name: &str,
) -> Result<Option<Vec<u8>>, Skip> {
    let mut member = match zip.by_name(name) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(Skip::Bad(e.to_string())),
    };
    let mut bytes = Vec::new();
    (&mut member)
        .take(MEMBER_LIMIT + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MEMBER_LIMIT {
        return Err(Skip::Pip(format!("{name} is over 256 MiB")));
    }
    Ok(Some(bytes))
}

/// The wheel's one `.dist-info` directory and what its `WHEEL` and `METADATA` say.
pub(super) fn read_wheel(
    zip: &mut zip::ZipArchive<std::fs::File>,
    filename: &str,
    r: &Requirement,
) -> Result<Wheel, Skip> {
    let dist_info = dist_info_dir(zip, filename)?;
    if !pep440::normalize(&dist_info).starts_with(&r.key) {
        return Err(Skip::Pip(format!(
            "{filename}'s {dist_info} is not named for {}",
            r.name
        )));
    }
    let text = |bytes: Option<Vec<u8>>, what: &str| -> Result<String, Skip> {
        let bytes = bytes.ok_or_else(|| Skip::Pip(format!("{filename} has no {what}")))?;
        String::from_utf8(bytes).map_err(|_| Skip::Pip(format!("{filename}'s {what} is not UTF-8")))
    };
    let wheel_file = text(read_member(zip, &format!("{dist_info}/WHEEL"))?, "WHEEL")?;
    let wheel_version = headers(&wheel_file)
        .into_iter()
        .find(|(k, _)| k == "wheel-version")
        .map(|(_, v)| v);
    let parts: Option<Vec<u64>> = wheel_version
        .as_deref()
        .map(|v| v.split('.').map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    let version_ok = parts.is_some_and(|p| p.first() == Some(&1));
    if !version_ok {
        return Err(Skip::Pip(format!("{filename} is not a version 1 wheel")));
    }
    let metadata = text(
        read_member(zip, &format!("{dist_info}/METADATA"))?,
        "METADATA",
    )?;
    let (mut name, mut version, mut requires, mut requires_python) =
        (String::new(), String::new(), Vec::new(), None);
    for (key, value) in headers(&metadata) {
        match key.as_str() {
            "name" => name = value,
            "version" => version = value,
            "requires-dist" => requires.push(pep440::dependency(&value).map_err(Skip::Pip)?),
            "requires-python" => requires_python = Some(value),
            _ => {}
        }
    }
    if pep440::normalize(&name) != r.key {
        return Err(Skip::Pip(format!("{filename} is the package {name:?}")));
    }
    let same = Version::parse(&version)
        .ok()
        .zip(Version::parse(&r.version).ok())
        .is_some_and(|(a, b)| a == b);
    if !same {
        return Err(Skip::Pip(format!("{filename} is version {version:?}")));
    }
    for installer_file in ["INSTALLER", "REQUESTED", "direct_url.json"] {
        if zip
            .index_for_name(&format!("{dist_info}/{installer_file}"))
            .is_some()
        {
            return Err(Skip::Pip(format!("{filename} carries {installer_file}")));
        }
    }
    Ok(Wheel {
        filename: filename.to_string(),
        dist_info,
        name,
        version,
        requires,
        requires_python,
        archive: None,
    })
}

/// The wheel's one top-level `.dist-info` directory (pip refuses a wheel with none or more).
pub(super) fn dist_info_dir(
    zip: &zip::ZipArchive<std::fs::File>,
    filename: &str,
) -> Result<String, Skip> {
    let mut dist_infos = BTreeSet::new();
    for name in zip.file_names().filter_map(Result::ok) {
        if let Some((top, _)) = name.split_once('/')
            && top.ends_with(".dist-info")
        {
            dist_infos.insert(top.to_string());
        }
    }
    match dist_infos.into_iter().collect::<Vec<_>>().as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(Skip::Pip(format!(
            "{filename} has not exactly one .dist-info"
        ))),
    }
}

/// The paths one wheel installs into `--target` (every file with bytes going to `spill`,
/// none kept in memory, so the disk path is exercised): for the fuzz target. `Err` is why
/// kiln would not install it.
pub(crate) fn unpack_for_checks(whl: &Path, spill: &Path) -> Result<Vec<String>, String> {
    let f = std::fs::File::open(whl).map_err(|e| e.to_string())?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| e.to_string())?;
    let why = |s: Skip| match s {
        Skip::Pip(w) | Skip::Bad(w) => w,
    };
    let dist_info = dist_info_dir(&zip, "fuzz.whl").map_err(why)?;
    let wheel = Wheel {
        filename: "fuzz.whl".into(),
        dist_info,
        name: String::new(),
        version: String::new(),
        requires: Vec::new(),
        requires_python: None,
        archive: None,
    };
    let target = Target {
        python: (3, 13),
        glibc: (2, 41),
        machine: "x86_64".into(),
        executable: "/usr/bin/python3".into(),
    };
    let mut tree = Building::new(spill, 0);
    unpack(&mut zip, &wheel, &target, &mut tree).map_err(why)?;
    Ok(tree.entries.into_keys().collect())
}

pub(crate) use crate::sbom::metadata_headers as headers;

/// Adds a file to the tree; a second file at one path is for pip to decide.
pub(super) fn put_file(
    tree: &mut Building,
    path: String,
    bytes: Vec<u8>,
    executable: bool,
) -> Result<(), Skip> {
    match tree.put_file(path.clone(), bytes, executable) {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(Skip::Pip(format!("two files would be {path}"))),
        Err(e) => Err(Skip::Bad(format!("{:#}", anyhow::Error::new(e)))),
    }
}

/// pip's `RECORD` hash: `sha256=` and the URL-safe Base64 digest without padding.
pub(super) fn record_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    format!(
        "sha256={}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
    )
}

/// The script pip (distlib's `ScriptMaker`, as pip configures it) writes for an entry point.
pub(super) fn entry_point_script(executable: &str, module: &str, func: &str) -> String {
    let import_name = func.split('.').next().unwrap_or(func);
    format!(
        "#!{executable}\n\
         # -*- coding: utf-8 -*-\n\
         import re\n\
         import sys\n\
         from {module} import {import_name}\n\
         if __name__ == '__main__':\n\
         \x20   sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n\
         \x20   sys.exit({func}())\n"
    )
}

/// The console and GUI scripts of an `entry_points.txt`: name → (module, function).
pub(super) fn entry_points(
    text: &str,
    filename: &str,
) -> Result<BTreeMap<String, (String, String)>, Skip> {
    let odd = |line: &str| Skip::Pip(format!("{filename}'s entry point {line:?}"));
    let word = |s: &str| {
        !s.is_empty()
            && s.split('.')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_alphanumeric() || c == '_'))
    };
    let mut out = BTreeMap::new();
    let mut wanted = false;
    for line in text.split('\n').map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            wanted = matches!(section, "console_scripts" | "gui_scripts");
            if !wanted && matches!(section.trim(), "console_scripts" | "gui_scripts") {
                return Err(odd(line));
            }
            continue;
        }
        if !wanted {
            continue;
        }
        // Only `name = module:attr`: distlib and importlib read anything else apart.
        let (name, value) = line.split_once('=').ok_or_else(|| odd(line))?;
        let (name, mut value) = (name.trim(), value.trim());
        // Extras (`[a, b]`), which the script ignores.
        if let Some(i) = value.find('[') {
            let flags = value[i..]
                .strip_prefix('[')
                .and_then(|f| f.strip_suffix(']'));
            let well_formed = flags.is_some_and(|f| {
                f.split(',').all(|x| {
                    let x = x.trim();
                    !x.is_empty() && x.chars().all(|c| c.is_alphanumeric() || "_-".contains(c))
                })
            });
            if !well_formed {
                return Err(odd(line));
            }
            value = value[..i].trim_end();
        }
        let plain_name = !name.is_empty()
            && !name.starts_with('[')
            && !name.contains(|c: char| c.is_whitespace() || c == '/' || c == '\0')
            && name != "."
            && name != "..";
        let Some((module, func)) = value.split_once(':') else {
            return Err(odd(line));
        };
        if !plain_name || !word(module) || !word(func) {
            return Err(odd(line));
        }
        if matches!(name, "pip" | "easy_install") || name.starts_with("pip3") {
            return Err(Skip::Pip(format!("{filename} has pip's own scripts")));
        }
        if out
            .insert(name.to_string(), (module.to_string(), func.to_string()))
            .is_some()
        {
            return Err(Skip::Pip(format!(
                "{filename} has two scripts named {name}"
            )));
        }
    }
    Ok(out)
}

/// A `RECORD` row's fields (Python's `csv` reader, default dialect).
pub(super) fn csv_fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            '"' if quoted => quoted = false,
            '"' if field.is_empty() => quoted = true,
            ',' if !quoted => out.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    out.push(field);
    out
}

/// A `RECORD` row as Python's `csv` writer writes it (minimal quoting, CRLF).
pub(super) fn csv_row(fields: &[&str]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\r', '\n']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                (*f).to_string()
            }
        })
        .collect();
    quoted.join(",") + "\r\n"
}

/// Installs one wheel into `tree` as pip does into `--target`: the archive root and
/// `<dist>.data/purelib|platlib` at the top, `<dist>.data/scripts` (a `#!python` line made
/// the interpreter's) and the entry points' scripts in `bin/`, `INSTALLER` and `REQUESTED`
/// added and `RECORD` rewritten with the installed paths. Executable when the archive marks
/// a member so.
pub(super) fn unpack(
    zip: &mut zip::ZipArchive<std::fs::File>,
    wheel: &Wheel,
    target: &Target,
    tree: &mut Building,
) -> Result<(), Skip> {
    let name = &wheel.filename;
    let dist_info = &wheel.dist_info;
    // Record path in the wheel → record path installed (relative to the library directory,
    // as pip's home scheme puts it: scripts at `../../bin/`).
    let mut installed: BTreeMap<String, String> = BTreeMap::new();
    // Record path → (hash, size) of the files pip rewrites (a `#!python` script).
    let mut changed: BTreeMap<String, (String, String)> = BTreeMap::new();
    let (mut old_record, mut entry_points_txt) = (None, None);
    let record_path = format!("{dist_info}/RECORD");
    let mut scripts = Vec::new();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| Skip::Bad(e.to_string()))?;
        let zip_name = member
            .name()
            .map_err(|e| Skip::Bad(e.to_string()))?
            .into_owned();
        if zip_name.ends_with('/') {
            continue;
        }
        let steps: Vec<&str> = zip_name.split('/').collect();
        if zip_name.starts_with('/') || steps.contains(&"..") {
            return Err(Skip::Bad(format!(
                "member {zip_name:?} leaves its directory"
            )));
        }
        // pip normalises `a//b` and `a/./b`; kiln leaves such names to it.
        if steps.iter().any(|s| s.is_empty() || *s == ".") {
            return Err(Skip::Pip(format!("{name} has the member {zip_name:?}")));
        }
        if member.is_symlink() {
            return Err(Skip::Pip(format!("{name} has the symlink {zip_name:?}")));
        }
        let (dest, script) = destination(name, &zip_name, &steps)?;
        // pip's `--target` moves the library's top level first: a `bin` there takes the
        // place of the scripts directory.
        if !script && dest.split('/').next() == Some("bin") {
            return Err(Skip::Pip(format!("{name} installs a top-level bin/")));
        }
        // pip's test: a regular file with an execute bit, whatever system made the zip.
        let mode = member.external_attributes() >> 16;
        let executable = mode != 0 && mode & 0o170000 == 0o100000 && mode & 0o111 != 0;
        if member.size() > MEMBER_LIMIT {
            return Err(Skip::Pip(format!("{name} has a member over 256 MiB")));
        }
        let mut bytes = Vec::with_capacity(member.size().try_into().unwrap_or(0));
        (&mut member)
            .take(MEMBER_LIMIT + 1)
            .read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MEMBER_LIMIT {
            return Err(Skip::Pip(format!("{name} has a member over 256 MiB")));
        }
        installed.insert(zip_name, record_of(&dest, script));
        if script {
            scripts.push(dest.clone());
        }
        if script && bytes.starts_with(b"#!python") {
            let end = bytes
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| i + 1);
            let mut fixed = format!("#!{}\n", target.executable).into_bytes();
            fixed.extend_from_slice(&bytes[end..]);
            bytes = fixed;
            changed.insert(
                record_of(&dest, true),
                (record_hash(&bytes), bytes.len().to_string()),
            );
        }
        if dest == record_path {
            // Replaced by the RECORD written below.
            old_record = Some(bytes);
            continue;
        }
        if dest == format!("{dist_info}/entry_points.txt") {
            entry_points_txt = Some(bytes.clone());
        }
        put_file(tree, dest, bytes, executable)?;
    }
    let old_record = old_record.ok_or_else(|| Skip::Pip(format!("{name} has no RECORD")))?;
    let old_record = String::from_utf8(old_record)
        .map_err(|_| Skip::Pip(format!("{name}'s RECORD is not UTF-8")))?;
    let generated = generated_files(name, dist_info, target, entry_points_txt, &scripts)?;
    let mut record = rewritten_record(name, &old_record, installed, &changed, &generated)?;
    for (path, bytes) in generated {
        let executable = path.starts_with("bin/");
        put_file(tree, path, bytes, executable)?;
    }
    if let Some((url, sha256)) = &wheel.archive {
        let document = super::provenance::document(url, sha256);
        super::provenance::add_row(&mut record, dist_info, &document);
        let path = format!("{dist_info}/{}", super::provenance::FILE);
        put_file(tree, path, document, false)?;
    }
    put_file(tree, record_path, record.into_bytes(), false)?;
    Ok(())
}

/// A script's record path: pip's home scheme puts scripts at `../../bin/` from the library
/// directory; everything else is relative to it.
fn record_of(dest: &str, script: bool) -> String {
    if script {
        format!("../../{dest}")
    } else {
        dest.to_string()
    }
}

/// Where a wheel member goes (relative to the library directory, scripts under `bin/`), and
/// whether it is a script.
fn destination(name: &str, zip_name: &str, steps: &[&str]) -> Result<(String, bool), Skip> {
    Ok(match steps {
        [top, scheme, rest @ ..] if top.ends_with(".data") && !rest.is_empty() => match *scheme {
            "purelib" | "platlib" => (rest.join("/"), false),
            "scripts" => (format!("bin/{}", rest.join("/")), true),
            other => {
                return Err(Skip::Pip(format!("{name} installs {other} files")));
            }
        },
        [top, ..] if top.ends_with(".data") => {
            return Err(Skip::Pip(format!("{name} has {zip_name:?}")));
        }
        _ => (zip_name.to_string(), false),
    })
}

/// What pip generates beside the wheel's own files: the entry points' scripts, INSTALLER and
/// REQUESTED.
fn generated_files(
    name: &str,
    dist_info: &str,
    target: &Target,
    entry_points_txt: Option<Vec<u8>>,
    scripts: &[String],
) -> Result<Vec<(String, Vec<u8>)>, Skip> {
    let mut generated: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(text) = entry_points_txt {
        let text = String::from_utf8(text)
            .map_err(|_| Skip::Pip(format!("{name}'s entry_points.txt is not UTF-8")))?;
        let points = entry_points(&text, name)?;
        // pip leaves out a script that wraps an entry point (setuptools' `NAME-script.py`,
        // `NAME.exe`, `NAME.pya`, or `NAME` itself).
        for script in scripts {
            let base = script.rsplit('/').next().unwrap_or(script);
            let lower = base.to_ascii_lowercase();
            let stem = [".exe", "-script.py", ".pya"]
                .iter()
                .find(|s| lower.ends_with(*s))
                .map_or(base, |s| &base[..base.len() - s.len()]);
            if points.contains_key(stem) {
                return Err(Skip::Pip(format!(
                    "{name}'s script {base} wraps an entry point"
                )));
            }
        }
        for (name_, (module, func)) in points {
            let script = entry_point_script(&target.executable, &module, &func);
            generated.push((format!("bin/{name_}"), script.into_bytes()));
        }
    }
    generated.push((format!("{dist_info}/INSTALLER"), b"pip\n".to_vec()));
    generated.push((format!("{dist_info}/REQUESTED"), Vec::new()));
    Ok(generated)
}

/// The RECORD pip writes: the wheel's rows with installed paths (and the hashes of files it
/// rewrote), then the generated files', sorted.
fn rewritten_record(
    name: &str,
    old_record: &str,
    mut installed: BTreeMap<String, String>,
    changed: &BTreeMap<String, (String, String)>,
    generated: &[(String, Vec<u8>)],
) -> Result<String, Skip> {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    // Python's `splitlines` breaks at more than `\n`; and pip fails on a blank row.
    let odd_break = |c: char| {
        matches!(
            c,
            '\x0b' | '\x0c' | '\x1c'..='\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}'
        )
    };
    let body = old_record.strip_suffix('\n').unwrap_or(old_record);
    let lines: Vec<&str> = body
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    if old_record.contains(odd_break)
        || lines
            .iter()
            .any(|l| l.contains('\r') || l.trim().is_empty())
    {
        return Err(Skip::Pip(format!("{name}'s RECORD has blank or odd lines")));
    }
    for line in lines {
        let fields = csv_fields(line);
        let old = fields[0].clone();
        let new = installed.remove(&old).unwrap_or(old);
        let (hash, size) = match changed.get(&new) {
            Some(fixed) => fixed.clone(),
            None => (
                fields.get(1).cloned().unwrap_or_default(),
                fields.get(2).cloned().unwrap_or_default(),
            ),
        };
        rows.push((new, hash, size));
    }
    for (path, bytes) in generated {
        let script = path.starts_with("bin/");
        rows.push((
            record_of(path, script),
            record_hash(bytes),
            bytes.len().to_string(),
        ));
    }
    rows.extend(
        installed
            .into_values()
            .map(|p| (p, String::new(), String::new())),
    );
    rows.sort();
    let record: String = rows.iter().map(|(p, h, s)| csv_row(&[p, h, s])).collect();
    Ok(record)
}
