//! Images kiln did not make, under `kiln run`: made by umoci (`insert DIR /`, whose layer has a
//! `/` member), by buildah (`from scratch` + commit, pushed to a real registry), round-tripped
//! through a Docker archive by skopeo, recompressed with zstd by skopeo — each runs. And
//! hostile layers: what would land outside the root, a decompression bomb, a layout blob under
//! a wrong digest — each refused, with the entry named, nothing written outside and nothing
//! left in the cache.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::images::{fill_rootfs, make_layout, read_blob, tagged_digest, umoci};
use common::kiln::Kiln;
use common::registry::{Registry, RegistryKind};
use common::{require_tool, run};

const SAY: &str = "echo hello-from-a-foreign-image; busybox ls /bin/busybox";

/// A busybox root filesystem directory.
fn rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    fs::create_dir_all(&root).unwrap();
    fill_rootfs(&root);
    root
}

fn oci(layout: &Path, tag: &str) -> String {
    format!("oci:{}:{tag}", layout.display())
}

fn assert_says_hello(out: &common::kiln::Run) {
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("hello-from-a-foreign-image"),
        "{}",
        out.stdout
    );
}

/// The member names of the tar (gzip or plain) `blob`.
fn members(blob: &[u8]) -> Vec<String> {
    let plain: Box<dyn std::io::Read> = if blob.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(blob))
    } else {
        Box::new(blob)
    };
    let mut archive = tar::Archive::new(plain);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            String::from_utf8_lossy(&e.path_bytes()).into_owned()
        })
        .collect()
}

/// The layer descriptors (media type, digest) of the manifest tagged `tag` in `layout`.
fn layers(layout: &Path, tag: &str) -> Vec<(String, String)> {
    let manifest: serde_json::Value =
        serde_json::from_slice(&read_blob(layout, &tagged_digest(layout, tag))).unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["mediaType"].as_str().unwrap().to_string(),
                l["digest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn an_image_made_with_umoci_insert_at_the_root_runs() {
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let root = rootfs(dir);
    let layout = dir.join("umoci");
    let l = layout.to_str().unwrap();
    let image = format!("{l}:inserted");
    run(&mut umoci(&["init", "--layout", l]));
    run(&mut umoci(&["new", "--image", &image]));
    run(umoci(&["insert", "--image", &image]).arg(&root).arg("/"));
    run(
        umoci(&["config", "--image", &image, "--config.entrypoint=/bin/sh"])
            .args([
                "--config.entrypoint=-c",
                &format!("--config.entrypoint={SAY}"),
            ])
            .args(["--os", "linux", "--architecture", "amd64"]),
    );
    // What made kiln refuse these layers before: umoci names the root `/`.
    let (_, digest) = layers(&layout, "inserted").pop().unwrap();
    let names = members(&read_blob(&layout, &digest));
    assert!(names.iter().any(|n| n == "/"), "{names:?}");
    assert_says_hello(&kiln.run(&["run", &oci(&layout, "inserted")]));
}

#[test]
fn an_image_built_by_buildah_from_scratch_and_pushed_runs() {
    require_tool("buildah", "buildah");
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let root = rootfs(dir);
    let reg = Registry::start(RegistryKind::Plain);
    let storage = dir.join("buildah");
    let buildah = |args: &[&str]| {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(storage.join("storage"))
            .arg("--runroot")
            .arg(storage.join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        run(&mut cmd).trim().to_string()
    };
    let container = buildah(&["from", "scratch"]);
    buildah(&["copy", &container, root.to_str().unwrap(), "/"]);
    let entrypoint = format!("[\"/bin/sh\",\"-c\",\"{SAY}\"]");
    buildah(&["config", "--entrypoint", &entrypoint, &container]);
    let target = format!("docker://{}", reg.reference("foreign/buildah:1"));
    buildah(&[
        "commit",
        "--format",
        "oci",
        "--tls-verify=false",
        &container,
        &target,
    ]);
    let out = kiln.run(&[
        "run",
        &reg.reference("foreign/buildah:1"),
        "--insecure-registry",
        &reg.host(),
    ]);
    assert_says_hello(&out);
}

#[test]
fn images_from_a_docker_archive_and_with_zstd_layers_run() {
    require_tool("skopeo", "skopeo");
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let layout = make_layout(dir);
    let l = layout.to_str().unwrap();
    run(
        umoci(&["config", "--image", &format!("{l}:base"), "--tag", "say"])
            .args(["--config.entrypoint=/bin/sh", "--config.entrypoint=-c"])
            .arg(format!("--config.entrypoint={SAY}")),
    );
    let archive = dir.join("image.tar");
    let skopeo = |src: String, dest: String, extra: &[&str]| {
        run(Command::new("skopeo")
            .args(["copy", "--quiet"])
            .args(extra)
            .args([&src, &dest]));
    };
    skopeo(
        format!("oci:{l}:say"),
        format!("docker-archive:{}:foreign/archived:1", archive.display()),
        &[],
    );
    let from_archive = dir.join("from-archive");
    skopeo(
        format!("docker-archive:{}", archive.display()),
        format!("oci:{}:archived", from_archive.display()),
        &[],
    );
    assert_says_hello(&kiln.run(&["run", &oci(&from_archive, "archived")]));

    let zstd = dir.join("zstd");
    skopeo(
        format!("oci:{l}:say"),
        format!("oci:{}:zstd", zstd.display()),
        &["--dest-compress", "--dest-compress-format", "zstd"],
    );
    let kinds: Vec<String> = layers(&zstd, "zstd").into_iter().map(|(t, _)| t).collect();
    assert!(
        kinds.iter().all(|t| t.ends_with("+zstd")),
        "skopeo wrote {kinds:?}"
    );
    assert_says_hello(&kiln.run(&["run", &oci(&zstd, "zstd")]));
}

/// A raw tar entry: name, kind, link target or content.
type Raw<'a> = (&'a str, tar::EntryType, &'a str);

/// A tar layer from raw entries.
fn raw_layer(entries: &[Raw<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, extra) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_mtime(946_684_800);
        let data = if kind.is_file() {
            extra.as_bytes()
        } else {
            b""
        };
        if matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link) {
            h.set_link_name(extra).unwrap();
        }
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// Adds `layer` (a plain tar) on top of the busybox base as tag `tag`.
fn add_layer(dir: &Path, layout: &Path, tag: &str, layer: &[u8]) {
    let file = dir.join(format!("{tag}.tar"));
    fs::write(&file, layer).unwrap();
    let l = layout.to_str().unwrap();
    run(umoci(&[
        "raw",
        "add-layer",
        "--image",
        &format!("{l}:base"),
        "--tag",
        tag,
    ])
    .args(["--history.created", "2000-01-01T00:00:00Z"])
    .arg(&file));
}

/// What the rootfs cache holds besides empty directories and the per-image lock files
/// (`locks/`, kept for the next run): nothing after a failed run.
fn cached_files(kiln: &Kiln) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![kiln.cache_dir().join("rootfs")];
    while let Some(dir) = todo.pop() {
        if dir.ends_with("locks") {
            continue;
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_type().unwrap().is_dir() {
                todo.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found
}

#[test]
fn layers_that_would_write_outside_the_root_are_refused_with_the_entrys_name() {
    use tar::EntryType::{Block, Link, Regular, Symlink};
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let layout = make_layout(dir);
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().to_str().unwrap();
    let cases: Vec<(&str, Vec<Raw<'_>>, &str)> = vec![
        (
            "through-own-link",
            vec![("evil", Symlink, "/"), ("evil/tmp/x", Regular, "x")],
            "evil/tmp/x",
        ),
        (
            "through-absolute-link",
            vec![("evil", Symlink, out), ("evil/x", Regular, "x")],
            "evil/x",
        ),
        ("above-root", vec![("../../x", Regular, "x")], "../../x"),
        (
            "hard-link-out",
            vec![("stolen", Link, "../../../../etc/passwd")],
            "stolen",
        ),
        ("whiteout-dot-dot", vec![(".wh...", Regular, "")], ".wh..."),
        ("device", vec![("dev/sda", Block, "")], "dev/sda"),
    ];
    for (tag, entries, named) in cases {
        add_layer(dir, &layout, tag, &raw_layer(&entries));
        let res = kiln.run(&["run", &oci(&layout, tag)]);
        assert_ne!(res.code, 0, "{tag}: {}", res.stdout);
        assert!(res.stderr.contains(named), "{tag}: {}", res.stderr);
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0, "{tag}");
        assert!(
            cached_files(&kiln).is_empty(),
            "{tag}: {:?}",
            cached_files(&kiln)
        );
    }
    // The base itself still runs: the refusals were the layers', not the cache's.
    let res = kiln.run(&[
        "run",
        &oci(&layout, "base"),
        "--",
        "/bin/sh",
        "-c",
        "echo fine",
    ]);
    assert_eq!(res.code, 0, "{}", res.stderr);
}

#[test]
fn a_decompression_bomb_stops_at_the_size_cap_and_leaves_nothing_cached() {
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let layout = make_layout(dir);
    // 256 MiB of zeros, which umoci compresses to a small blob.
    let file = dir.join("bomb.tar");
    {
        let mut b = tar::Builder::new(fs::File::create(&file).unwrap());
        let size = 256u64 << 20;
        let mut h = tar::Header::new_gnu();
        h.set_path("zeros").unwrap();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, std::io::Read::take(std::io::repeat(0), size))
            .unwrap();
        b.finish().unwrap();
    }
    let l = layout.to_str().unwrap();
    run(umoci(&[
        "raw",
        "add-layer",
        "--image",
        &format!("{l}:base"),
        "--tag",
        "bomb",
    ])
    .arg(&file));
    fs::remove_file(&file).unwrap();
    let (_, digest) = layers(&layout, "bomb").pop().unwrap();
    let blob = read_blob(&layout, &digest).len();
    assert!(blob < 4 << 20, "the bomb's blob is {blob} bytes");
    let res = kiln.run(&["run", &oci(&layout, "bomb"), "--max-unpacked-size", "64M"]);
    assert_ne!(res.code, 0, "{}", res.stdout);
    assert!(res.stderr.contains("--max-unpacked-size"), "{}", res.stderr);
    assert!(res.stderr.contains("zeros"), "{}", res.stderr);
    assert!(cached_files(&kiln).is_empty(), "{:?}", cached_files(&kiln));
    // Under the default cap it unpacks.
    let res = kiln.run(&[
        "run",
        &oci(&layout, "bomb"),
        "--",
        "/bin/sh",
        "-c",
        "busybox wc -c /zeros",
    ]);
    assert_eq!(res.code, 0, "{}", res.stderr);
    assert!(res.stdout.contains("268435456"), "{}", res.stdout);
}

#[test]
fn a_layout_blob_under_a_wrong_digest_is_refused_before_it_is_unpacked() {
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let layout = make_layout(dir);
    // Swap the base layer's bytes for a layer today's unpacker refuses as it reads: an error
    // about the entry means it was unpacked first.
    let (_, digest) = layers(&layout, "base").pop().unwrap();
    let hex = digest.trim_start_matches("sha256:");
    let swapped = raw_layer(&[("../../unpacked-first", tar::EntryType::Regular, "x")]);
    fs::write(layout.join("blobs/sha256").join(hex), swapped).unwrap();
    let res = kiln.run(&["run", &oci(&layout, "base")]);
    assert_ne!(res.code, 0, "{}", res.stdout);
    assert!(res.stderr.contains(&digest), "{}", res.stderr);
    assert!(!res.stderr.contains("unpacked-first"), "{}", res.stderr);
    assert!(cached_files(&kiln).is_empty(), "{:?}", cached_files(&kiln));
}

/// An image whose `/etc` is a symlink to a host directory: the sandbox's own binds (the
/// host's `resolv.conf`) and a `--volume` under `/etc` must land inside the root, never in
/// that host directory.
fn a_symlinked_etc_cannot_make_the_sandbox_write_on_the_host(sandbox: &str) {
    use tar::EntryType::{Regular, Symlink};
    let kiln = Kiln::new();
    let dir = kiln.home.path();
    let layout = make_layout(dir);
    let host = tempfile::tempdir().unwrap();
    let target = host.path().to_str().unwrap();
    let layer = raw_layer(&[(".wh.etc", Regular, ""), ("etc", Symlink, target)]);
    add_layer(dir, &layout, "etc-link", &layer);
    let volume = dir.join("volume");
    fs::create_dir(&volume).unwrap();
    fs::write(volume.join("data"), "volume").unwrap();
    let mut cmd = kiln.command();
    cmd.env("KILN_SANDBOX", sandbox).args([
        "run",
        &oci(&layout, "etc-link"),
        "--volume",
        &format!("{}:/etc/vol:ro", volume.display()),
        "--",
        "/bin/sh",
        "-c",
        "busybox cat /etc/vol/data; busybox test -e /etc/resolv.conf && echo resolv",
    ]);
    let res = kiln.run_cmd(&mut cmd);
    assert_eq!(res.code, 0, "{}", res.stderr);
    assert!(res.stdout.contains("volume"), "{}", res.stdout);
    let leaked: Vec<_> = fs::read_dir(host.path()).unwrap().flatten().collect();
    assert!(leaked.is_empty(), "{sandbox} wrote on the host: {leaked:?}");
}

#[test]
fn a_symlinked_etc_cannot_make_bwrap_write_on_the_host() {
    a_symlinked_etc_cannot_make_the_sandbox_write_on_the_host("bwrap");
}

#[test]
fn a_symlinked_etc_cannot_make_the_built_in_sandbox_write_on_the_host() {
    a_symlinked_etc_cannot_make_the_sandbox_write_on_the_host("builtin");
}

/// Inside a "container" whose /proc is masked the way Docker masks it (a file of /proc
/// bound over), a fresh /proc cannot be mounted: the built-in sandbox must fail and say why,
/// not bind the outer /proc, which shows every outer process and its command line.
#[test]
fn a_masked_proc_fails_the_built_in_sandbox_instead_of_showing_the_outer_processes() {
    require_tool("unshare", "util-linux");
    let kiln = Kiln::new();
    let layout = make_layout(kiln.home.path());
    let mask = "for f in /proc/timer_list /proc/keys /proc/kcore /proc/sched_debug; do \
                [ -e $f ] && mount --bind /dev/null $f && exec \"$@\"; done; exit 99";
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--user",
        "--map-root-user",
        "--mount",
        "--fork",
        "sh",
        "-c",
        mask,
        "sh",
    ])
    .arg(env!("CARGO_BIN_EXE_kiln"))
    .args([
        "run",
        &oci(&layout, "base"),
        "--",
        "/bin/sh",
        "-c",
        "echo ran",
    ])
    .env("KILN_SANDBOX", "builtin")
    .env("KILN_CACHE_DIR", kiln.cache_dir())
    .env("HOME", kiln.home.path());
    let res = kiln.run_cmd(&mut cmd);
    assert_ne!(res.code, 99, "no /proc file to mask here: {}", res.stderr);
    assert_ne!(res.code, 0, "ran with the outer /proc: {}", res.stdout);
    assert!(!res.stdout.contains("ran"), "{}", res.stdout);
    assert!(res.stderr.contains("unmasked /proc"), "{}", res.stderr);
}
