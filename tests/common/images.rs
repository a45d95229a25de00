//! Base images built by the tests themselves: Debian's static busybox, packed with umoci.
//!
//! The image is deterministic (fixed mtimes and timestamps): the same busybox binary gives the
//! same layer, config and manifest digests on every call.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::registry::Registry;
use super::{jq, jq_raw, require_tool, run, sha256_digest};

/// Timestamp used for file mtimes, `created` and history entries (2000-01-01T00:00:00Z).
pub const EPOCH: u64 = 946_684_800;
const CREATED: &str = "2000-01-01T00:00:00Z";
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// OCI image manifest media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index media type.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// Full references (`127.0.0.1:PORT/repo:tag`) of the pushed base images.
#[derive(Debug, Clone)]
pub struct BaseImages {
    /// `repo:oci`: OCI media types (manifest without a top-level `mediaType`, as umoci writes).
    pub oci: String,
    /// `repo:docker`: Docker v2 schema 2 media types.
    pub docker: String,
    /// `repo:multi`: an OCI image index with linux/amd64 and linux/arm64 entries.
    pub index: String,
}

/// Whether the current process runs as root (umoci needs `--rootless` otherwise).
fn is_root() -> bool {
    run(Command::new("id").arg("-u")).trim() == "0"
}

/// A `umoci ARGS` command (panics, naming the package, when umoci is not installed).
pub fn umoci(args: &[&str]) -> Command {
    require_tool("umoci", "umoci");
    let mut cmd = Command::new("umoci");
    cmd.args(args);
    cmd
}

/// Fills `root` with /bin/busybox, /bin/sh -> busybox, /etc/passwd (root and user 1000),
/// /etc/group and a sticky, world-writable /tmp; every mtime is [`EPOCH`].
pub fn fill_rootfs(root: &Path) {
    require_tool("busybox", "busybox-static");
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .expect("busybox binary (Debian package busybox-static)");
    for d in ["bin", "etc", "tmp"] {
        fs::create_dir_all(root.join(d)).expect("mkdir in rootfs");
    }
    fs::copy(busybox, root.join("bin/busybox")).expect("copy busybox");
    fs::set_permissions(root.join("bin/busybox"), fs::Permissions::from_mode(0o755))
        .expect("chmod busybox");
    symlink("busybox", root.join("bin/sh")).expect("symlink /bin/sh");
    fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
    )
    .expect("write passwd");
    fs::write(root.join("etc/group"), "root:x:0:\nuser:x:1000:\n").expect("write group");
    fs::set_permissions(root.join("etc/passwd"), fs::Permissions::from_mode(0o644)).expect("chmod");
    fs::set_permissions(root.join("etc/group"), fs::Permissions::from_mode(0o644)).expect("chmod");
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).expect("chmod");
    for d in ["bin", "etc"] {
        fs::set_permissions(root.join(d), fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).expect("chmod rootfs");
    let stamp = format!("@{EPOCH}");
    run(Command::new("find")
        .arg(root)
        .args(["-exec", "touch", "-h", "-d", &stamp, "{}", "+"]));
}

/// Creates an OCI image layout at `dir/layout` with one image tagged `base` (single layer,
/// Cmd /bin/sh, Env PATH=/bin:/usr/bin, linux/amd64). Returns the layout path, usable as
/// `oci:<path>:base`.
pub fn make_layout(dir: &Path) -> PathBuf {
    let layout = dir.join("layout");
    let bundle = dir.join("umoci-bundle");
    let l = layout.to_str().expect("utf-8 path");
    let image = format!("{l}:base");
    let rootless: &[&str] = if is_root() { &[] } else { &["--rootless"] };
    run(&mut umoci(&["init", "--layout", l]));
    run(&mut umoci(&["new", "--image", &image]));
    let b = bundle.to_str().expect("utf-8 path");
    run(umoci(&["unpack", "--image", &image]).args(rootless).arg(b));
    fill_rootfs(&bundle.join("rootfs"));
    run(
        umoci(&["repack", "--image", &image, "--history.created", CREATED])
            .args(["--history.created_by", "kiln-test: busybox base layer"])
            .arg(b),
    );
    run(umoci(&[
        "config",
        "--image",
        &image,
        "--created",
        CREATED,
        "--no-history",
    ])
    .args([
        "--config.cmd",
        "/bin/sh",
        "--config.env",
        "PATH=/bin:/usr/bin",
    ])
    .args(["--architecture", "amd64", "--os", "linux"]));
    run(&mut umoci(&["gc", "--layout", l]));
    fs::remove_dir_all(&bundle).expect("remove umoci bundle");
    layout
}

/// Writes `bytes` as a sha256 blob into `layout`, returning `(digest, size)`.
pub fn write_blob(layout: &Path, bytes: &[u8]) -> (String, usize) {
    let digest = sha256_digest(bytes);
    let dir = layout.join("blobs/sha256");
    fs::create_dir_all(&dir).expect("mkdir blobs");
    fs::write(dir.join(&digest["sha256:".len()..]), bytes).expect("write blob");
    (digest, bytes.len())
}

/// Reads the blob `sha256:<hex>` from `layout`.
pub fn read_blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    fs::read(layout.join("blobs/sha256").join(hex)).expect("read blob")
}

/// The digest of the manifest tagged `tag` in `layout/index.json`.
pub fn tagged_digest(layout: &Path, tag: &str) -> String {
    let index = fs::read(layout.join("index.json")).expect("read index.json");
    let filter =
        format!(".manifests[] | select(.annotations[\"{REF_NAME}\"] == \"{tag}\") | .digest");
    let digest = jq_raw(&filter, &index);
    assert!(
        digest.starts_with("sha256:"),
        "no tag {tag} in {}",
        layout.display()
    );
    digest
}

/// Adds to `layout` an image index tagged `index_tag` with two entries: the image tagged
/// `base_tag` as linux/amd64, and a linux/arm64 variant that reuses its layers with a config
/// whose `architecture` is `arm64`. Returns the index digest.
pub fn add_multi_platform_index(layout: &Path, base_tag: &str, index_tag: &str) -> String {
    let amd_digest = tagged_digest(layout, base_tag);
    let amd_manifest = read_blob(layout, &amd_digest);
    let config_digest = jq_raw(".config.digest", &amd_manifest);
    let arm_config = jq(
        ".architecture = \"arm64\"",
        &read_blob(layout, &config_digest),
    );
    let (arm_cfg_digest, arm_cfg_size) = write_blob(layout, arm_config.as_bytes());
    let arm_manifest = jq(
        &format!(
            "{{schemaVersion, mediaType: \"{OCI_MANIFEST}\", config: (.config | \
             .digest = \"{arm_cfg_digest}\" | .size = {arm_cfg_size}), layers}}"
        ),
        &amd_manifest,
    );
    let (arm_digest, arm_size) = write_blob(layout, arm_manifest.as_bytes());
    let entry = |digest: &str, size: usize, arch: &str| {
        format!(
            "{{\"mediaType\":\"{OCI_MANIFEST}\",\"digest\":\"{digest}\",\"size\":{size},\
             \"platform\":{{\"architecture\":\"{arch}\",\"os\":\"linux\"}}}}"
        )
    };
    let index = format!(
        "{{\"schemaVersion\":2,\"mediaType\":\"{OCI_INDEX}\",\"manifests\":[{},{}]}}",
        entry(&amd_digest, amd_manifest.len(), "amd64"),
        entry(&arm_digest, arm_size, "arm64")
    );
    let (index_digest, index_size) = write_blob(layout, index.as_bytes());
    let top = fs::read(layout.join("index.json")).expect("read index.json");
    let top = jq(
        &format!(
            ".manifests += [{{mediaType: \"{OCI_INDEX}\", digest: \"{index_digest}\", \
             size: {index_size}, annotations: {{\"{REF_NAME}\": \"{index_tag}\"}}}}]"
        ),
        &top,
    );
    fs::write(layout.join("index.json"), top).expect("write index.json");
    index_digest
}

/// Builds the busybox base image (once per call, in a temp dir) and pushes it to `reg` as
/// `repo:oci` (OCI), `repo:docker` (Docker v2s2) and `repo:multi` (amd64 + arm64 index).
pub fn push_base_images(reg: &Registry, repo: &str) -> BaseImages {
    let tmp = tempfile::Builder::new()
        .prefix("kiln-base-")
        .tempdir()
        .expect("tempdir");
    let layout = make_layout(tmp.path());
    add_multi_platform_index(&layout, "base", "multi");
    let images = BaseImages {
        oci: reg.reference(&format!("{repo}:oci")),
        docker: reg.reference(&format!("{repo}:docker")),
        index: reg.reference(&format!("{repo}:multi")),
    };
    reg.skopeo_copy_from_layout(&layout, "base", &images.oci, None);
    reg.skopeo_copy_from_layout(&layout, "base", &images.docker, Some("v2s2"));
    reg.skopeo_copy_all_from_layout(&layout, "multi", &images.index);
    images
}
