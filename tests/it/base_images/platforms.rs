//! Another platform's images, built on this machine: `kiln base build --platform linux/arm64`
//! from the lock's arm64 inputs, Functions built for it with dependencies kiln installs without
//! running anything built for arm64, or that npm and pip install under user-mode emulation
//! (qemu-user-static, registered in the sandbox's own binfmt_misc), and `kiln run` serving
//! them under emulation.

use crate::common;

use std::path::Path;
use std::process::Command;

use super::{base_build, base_build_with, functions};
use common::function_run::serve;
use common::http;
use common::kiln::{Kiln, copy_tree};

const ARM64: [&str; 2] = ["--platform", "linux/arm64"];

/// The config of image `name` in the layout `dir`, as skopeo reads it.
fn config(dir: &Path, name: &str) -> serde_json::Value {
    let text = common::run(
        Command::new("skopeo")
            .args(["inspect", "--config"])
            .arg(format!("oci:{}:{name}", dir.display())),
    );
    serde_json::from_str(&text).unwrap()
}

/// `kiln build DIR --runtime RUNTIME --platform PLATFORMS` on the images in `bases`, with
/// `kiln`'s own cache (so the install happens, rather than a layer another test left), into
/// what `target` names (`--output …` or `--image …` and its flags).
fn build_on(
    kiln: &Kiln,
    bases: &Path,
    runtime: &str,
    dir: &Path,
    platforms: &str,
    target: &[&str],
) -> common::kiln::Run {
    let (base, builder) = (
        format!("oci:{}:{runtime}", bases.display()),
        format!("oci:{}:{runtime}-builder", bases.display()),
    );
    let mut args = vec!["build", dir.to_str().unwrap(), "--runtime", runtime];
    args.extend([
        "--platform",
        platforms,
        "--base",
        &base,
        "--builder-image",
        &builder,
    ]);
    args.extend(target);
    kiln.run(&args)
}

/// [`build_on`] for linux/arm64, into a layout beside `dir`.
fn build_for_arm64(k: &Kiln, bases: &Path, runtime: &str, dir: &Path) -> common::kiln::Run {
    let out = format!("oci:{}", dir.with_extension("out").display());
    build_on(k, bases, runtime, dir, "linux/arm64", &["--output", &out])
}

#[test]
fn arm64_node_functions_installed_from_a_lock_file_or_by_emulated_npm_answer() {
    let k = Kiln::new();
    let tmp = tempfile::tempdir().unwrap();
    let bases = tmp.path().join("bases");
    let printed = base_build_with(&k, "nodejs22", &bases, &ARM64);
    assert_eq!(printed.len(), 2, "{printed:?}");
    for name in ["nodejs22", "nodejs22-builder"] {
        assert_eq!(config(&bases, name)["architecture"], "arm64", "{name}");
    }

    // chokidar's optional fsevents is for darwin: left out, as npm would.
    let dir = tmp.path().join("fn");
    copy_tree(&functions("node-lockfile"), &dir);
    std::fs::write(
        dir.join("handler.js"),
        "const semver = require('semver');\nconst ms = require('ms');\n\
         module.exports = { main: () => `${process.arch} ${semver.inc('1.2.3', 'minor')} \
         ${ms(60000)}` };\n",
    )
    .unwrap();
    let built = build_for_arm64(&k, &bases, "nodejs22", &dir);
    assert_eq!(built.code, 0, "{}", built.stderr);
    assert!(built.stderr.contains("without npm"), "{}", built.stderr);
    let reference = built.reference();
    let (port, _running) = serve(&k, &reference, &ARM64);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!((status, body.as_str()), (200, "arm64 1.3.0 1m"));

    // Without the lock file npm has to run, for arm64: under emulation, and so does every
    // program it starts: the Function's postinstall runs dash, node and uname, all arm64.
    // The binfmt_misc that makes that so is out of its reach.
    std::fs::remove_file(dir.join("package-lock.json")).unwrap();
    let manifest = dir.join("package.json");
    let mut package: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    package["scripts"] = serde_json::json!({
        "postinstall": "node -e \"const fs = require('fs'); \
            fs.writeFileSync('node_modules/.built', [process.arch, \
            require('child_process').execSync('uname -m').toString().trim(), \
            fs.readdirSync('/proc/sys/fs/binfmt_misc').length].join(' '))\""
    });
    std::fs::write(&manifest, package.to_string()).unwrap();
    std::fs::write(
        dir.join("handler.js"),
        "const semver = require('semver');\n\
         module.exports = { main: () => require('fs').readFileSync(__dirname + \
         '/node_modules/.built', 'utf8').trim() + ' ' + semver.inc('1.2.3', 'minor') };\n",
    )
    .unwrap();
    let emulated = build_for_arm64(&k, &bases, "nodejs22", &dir);
    assert_eq!(emulated.code, 0, "{}", emulated.stderr);
    assert!(
        emulated.stderr.contains("under emulation"),
        "{}",
        emulated.stderr
    );
    let (port, _running) = serve(&k, &emulated.reference(), &ARM64);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!((status, body.as_str()), (200, "arm64 aarch64 0 1.3.0"));

    // Told not to emulate, the same build is refused, saying why and what to do.
    let out = format!("oci:{}", dir.with_extension("refused").display());
    let refused = build_on(
        &k,
        &bases,
        "nodejs22",
        &dir,
        "linux/arm64",
        &["--output", &out, "--no-emulation"],
    );
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    for part in [
        "installing the dependencies for linux/arm64 needs npm",
        "no package-lock.json",
        "--no-emulation forbids",
        "a package-lock.json that decides every package",
    ] {
        assert!(refused.stderr.contains(part), "{part}: {}", refused.stderr);
    }
}

#[test]
fn arm64_python_functions_with_compiled_wheels_and_an_sdist_answer_and_bytecode_is_sound() {
    let k = Kiln::new();
    let tmp = tempfile::tempdir().unwrap();
    let bases = tmp.path().join("bases");
    base_build_with(&k, "python313", &bases, &ARM64);
    assert_eq!(config(&bases, "python313")["architecture"], "arm64");

    // PyYAML and charset-normalizer are compiled: their aarch64 wheels must be the ones taken.
    let dir = tmp.path().join("fn");
    copy_tree(&functions("python-pinned"), &dir);
    std::fs::write(
        dir.join("handler.py"),
        "import platform\nimport charset_normalizer.md\nimport yaml\n\n\
         def main(event, context):\n    \
         return f\"{platform.machine()} {yaml.__with_libyaml__} {yaml.safe_load('a: [1, 2]')} \
         {charset_normalizer.md.__file__.rsplit('.', 1)[-1]}\"\n",
    )
    .unwrap();
    let built = build_for_arm64(&k, &bases, "python313", &dir);
    assert_eq!(built.code, 0, "{}", built.stderr);
    assert!(built.stderr.contains("without pip"), "{}", built.stderr);
    let (port, _running) = serve(&k, &built.reference(), &ARM64);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    // `md` is a compiled module in the aarch64 wheel (a .so), a .py file in a pure one.
    assert_eq!(
        (status, body.as_str()),
        (200, "aarch64 True {'a': [1, 2]} so")
    );
    drop(_running);

    // docopt has only an sdist: pip builds it, running setuptools in a Python it starts. Both
    // run under emulation.
    let sdist = tmp.path().join("sdist");
    copy_tree(&functions("hello-python"), &sdist);
    std::fs::write(sdist.join("requirements.txt"), "docopt==0.6.2\n").unwrap();
    std::fs::write(
        sdist.join("handler.py"),
        "import platform\nimport docopt\n\n\
         def main(event, context):\n    \
         return f\"{platform.machine()} {docopt.__version__}\"\n",
    )
    .unwrap();
    let built = build_for_arm64(&k, &bases, "python313", &sdist);
    assert_eq!(built.code, 0, "{}", built.stderr);
    assert!(built.stderr.contains("under emulation"), "{}", built.stderr);
    let (port, _running) = serve(&k, &built.reference(), &ARM64);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!((status, body.as_str()), (200, "aarch64 0.6.2"));
    drop(_running);

    // The arm64 base's bytecode is compiled by this machine's python3.13 (the same Debian
    // version) over the arm64 tree, since emulating the image's own takes minutes. That is
    // sound only if both interpreters write the same bytes for the same files in the same
    // process history: checked on the json package, compiled by each in one process.
    let amd64 = tmp.path().join("amd64");
    base_build(&k, "python313", &amd64);
    let compile = |bases: &Path, extra: &[&str]| -> Vec<(String, Vec<u8>)> {
        let out = bases.with_extension("pyc");
        std::fs::create_dir_all(&out).unwrap();
        let entrypoint = r#"["/usr/bin/python3.13","-S","-m","compileall","-q","-j","1",
            "--invalidation-mode","unchecked-hash","/usr/lib/python3.13/json"]"#;
        let run = k.run_cmd(
            k.command_with_shared_downloads()
                // The builder: the base's working directory comes with a Function.
                .args(["run", &format!("oci:{}:python313-builder", bases.display())])
                .args(["--entrypoint", entrypoint, "--volume"])
                .arg(format!("{}:/out", out.display()))
                .args(["-e", "PYTHONPYCACHEPREFIX=/out", "-e", "PYTHONHASHSEED=0"])
                .args(["-e", "PYTHONDONTWRITEBYTECODE=1"])
                .args(extra),
        );
        assert_eq!(run.code, 0, "{}", run.stderr);
        let mut files: Vec<(String, Vec<u8>)> = walkdir(&out)
            .into_iter()
            .map(|p| {
                let name = p.strip_prefix(&out).unwrap().display().to_string();
                (name, std::fs::read(&p).unwrap())
            })
            .collect();
        files.sort();
        files
    };
    let native = compile(&amd64, &[]);
    let emulated = compile(&bases, &ARM64);
    assert!(native.len() >= 5, "{:?}", native.iter().map(|f| &f.0));
    let names = |files: &[(String, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&native), names(&emulated));
    for ((name, a), (_, b)) in native.iter().zip(&emulated) {
        assert!(a == b, "{name} differs");
    }
}

/// Every file below `dir`.
fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walkdir(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn a_build_for_two_platforms_pushes_a_signed_index_reproducibly_and_each_image_runs() {
    let k = Kiln::new();
    let tmp = tempfile::tempdir().unwrap();
    let bases = tmp.path().join("bases");
    let both = ["--platform", "linux/amd64,linux/arm64"];
    let printed = base_build_with(&k, "nodejs22", &bases, &both);
    assert_eq!(printed.len(), 2, "{printed:?}");
    let platforms_of = |raw: &str| -> Vec<String> {
        let index: serde_json::Value = serde_json::from_str(raw).unwrap();
        assert_eq!(
            index["mediaType"],
            "application/vnd.oci.image.index.v1+json"
        );
        let manifests = index["manifests"].as_array().unwrap();
        manifests
            .iter()
            .map(|m| format!("{}/{}", m["platform"]["os"], m["platform"]["architecture"]))
            .collect()
    };
    for name in ["nodejs22", "nodejs22-builder"] {
        let layout = format!("oci:{}:{name}", bases.display());
        let raw = common::run(Command::new("skopeo").args(["inspect", "--raw", &layout]));
        assert_eq!(
            platforms_of(&raw),
            [r#""linux"/"amd64""#, r#""linux"/"arm64""#]
        );
    }

    let reg = common::registry::Registry::start(common::registry::RegistryKind::Plain);
    let host = reg.host();
    crate::sign::check(&["keys", tmp.path().to_str().unwrap()]);
    let key = |name: &str| tmp.path().join(name).display().to_string();
    let dir = tmp.path().join("fn");
    copy_tree(&functions("node-lockfile"), &dir);
    std::fs::write(
        dir.join("handler.js"),
        "const semver = require('semver');\n\
         module.exports = { main: () => `${process.arch} ${semver.inc('1.2.3', 'minor')}` };\n",
    )
    .unwrap();
    // Push to `repo`, signed with a.key.
    let target = |repo: &str| {
        let (image, sign) = (reg.reference(repo), key("a.key"));
        [
            "--image",
            &image,
            "--insecure-registry",
            &host,
            "--sign-key",
            &sign,
        ]
        .map(String::from)
    };
    let build = |kiln: &Kiln, repo: &str| {
        let target = target(repo);
        let target: Vec<&str> = target.iter().map(String::as_str).collect();
        build_on(
            kiln,
            &bases,
            "nodejs22",
            &dir,
            "linux/amd64,linux/arm64",
            &target,
        )
        .reference()
    };
    let reference = build(&k, "fns/multi:1");
    let digest = reference.split_once('@').unwrap().1.to_string();
    let inspect = |what: &str| {
        common::run(Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{host}/fns/multi{what}"),
        ]))
    };
    let raw = inspect(":1");
    assert_eq!(kiln::oci::Digest::of(raw.as_bytes()).to_string(), digest);
    assert_eq!(
        platforms_of(&raw),
        [r#""linux"/"amd64""#, r#""linux"/"arm64""#]
    );
    // One source layer for both images (the last one), each image's own config; and every
    // manifest pushed is signed, the index too (cryptography checks it).
    let index: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let mut sources = Vec::new();
    for entry in index["manifests"].as_array().unwrap() {
        let at = entry["digest"].as_str().unwrap();
        let manifest: serde_json::Value =
            serde_json::from_str(&inspect(&format!("@{at}"))).unwrap();
        sources.push(manifest["layers"].as_array().unwrap().last().unwrap()["digest"].clone());
        assert_eq!(
            crate::sign::check(&["verify", &host, "fns/multi", at, &key("a.pub")]),
            "1"
        );
    }
    assert_eq!(sources[0], sources[1]);
    assert_eq!(
        crate::sign::check(&["verify", &host, "fns/multi", &digest, &key("a.pub")]),
        "1"
    );

    // kiln verify checks the index and each image in it.
    let verify = |public: &str| {
        k.run(&[
            "verify",
            &reg.reference("fns/multi:1"),
            "--key",
            public,
            "--insecure-registry",
            &host,
        ])
    };
    let verified = verify(&key("a.pub"));
    assert_eq!(
        verified
            .stderr
            .matches("verified the platform's image")
            .count(),
        2
    );
    assert_eq!(verified.reference(), reference);
    let err = verify(&key("b.pub")).failure(1).to_string();
    assert!(err.contains("not this key's"), "{err}");

    // Reproducible: another machine's kiln (its own cache) gives the same index.
    let again = build(&Kiln::new(), "fns/again:1");
    assert_eq!(again.split_once('@').unwrap().1, digest);

    // Split as a build Job splits it: --stage deps keeps each platform's layer in a directory
    // of its own, --stage publish pushes the same index, and the termination log says so.
    let staged = tmp.path().join("staged");
    let log = tmp.path().join("termination-log");
    let stage = |stage: &str, target: &[&str]| {
        let mut args = vec!["--stage", stage, "--stage-dir", staged.to_str().unwrap()];
        args.extend(["--termination-log", log.to_str().unwrap()]);
        args.extend(target);
        build_on(
            &k,
            &bases,
            "nodejs22",
            &dir,
            "linux/amd64,linux/arm64",
            &args,
        )
        .reference()
    };
    let deps = stage("deps", &[]);
    let layers: Vec<&str> = deps.split(' ').collect();
    assert!(
        layers.len() == 2
            && layers[0].starts_with("linux/amd64=sha256:")
            && layers[1].starts_with("linux/arm64=sha256:"),
        "{deps}"
    );
    for platform in ["linux-amd64", "linux-arm64"] {
        assert!(staged.join(platform).is_dir(), "{platform}");
    }
    let target = target("fns/staged:1");
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    let published = stage("publish", &target);
    assert_eq!(published.split_once('@').unwrap().1, digest);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), published);

    // The tag serves each platform: arm64 under emulation.
    let tagged = reg.reference("fns/multi:1");
    for (platform, arch) in [("linux/amd64", "x64"), ("linux/arm64", "arm64")] {
        let (port, _running) = serve(
            &k,
            &tagged,
            &["--platform", platform, "--insecure-registry", &host],
        );
        let (status, body) = http::request(port, "GET", "/", &[], b"");
        assert_eq!((status, body), (200, format!("{arch} 1.3.0")));
    }
}

/// A kiln built for arm64 (`KILN_ARM64_BINARY`; see README, "Other platforms"), put into the
/// arm64 builder with `--kiln-binary`, builds a Function inside it as a build Job on an arm64
/// node would: kiln and npm both arm64, here under emulation. The image answers. Without the
/// variable the test says so and does nothing: a cross-compiled release kiln takes longer to
/// build than CI has.
#[test]
fn an_arm64_kiln_in_the_arm64_builder_builds_a_function_as_a_build_job_would() {
    let Some(binary) = std::env::var_os("KILN_ARM64_BINARY") else {
        eprintln!("skipped: KILN_ARM64_BINARY names no arm64 kiln");
        return;
    };
    let k = Kiln::new();
    let tmp = tempfile::tempdir().unwrap();
    let bases = tmp.path().join("bases");
    let kiln_binary = ["--kiln-binary", binary.to_str().unwrap()];
    base_build_with(&k, "nodejs22", &bases, &[&ARM64[..], &kiln_binary].concat());
    let builder = format!("oci:{}:nodejs22-builder", bases.display());
    let dir = tmp.path().join("fn");
    copy_tree(&functions("node-lockfile"), &dir);
    // No lock file: npm runs, natively for the kiln inside.
    std::fs::remove_file(dir.join("package-lock.json")).unwrap();
    std::fs::write(
        dir.join("handler.js"),
        "module.exports = { main: () => `${process.arch} ${require('semver').inc('1.2.3', \
         'major')}` };\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let entrypoint = serde_json::json!([
        "/usr/local/bin/kiln",
        "build",
        "/workspace/src",
        "--runtime",
        "nodejs22",
        "--platform",
        "linux/arm64",
        "--base",
        "oci:/bases:nodejs22",
        "--cache-dir",
        "/tmp/kiln-cache",
        "--ca-bundle",
        "/tmp/ca.crt",
        "--output",
        "oci:/out/img"
    ]);
    let volume = |host: &Path, inside: &str| format!("{}:{inside}", host.display());
    let built = k.run_cmd(
        k.command_with_shared_downloads()
            .args(["run", &builder])
            .args(ARM64)
            .args(["--volume", &volume(&dir, "/workspace/src:ro")])
            .args(["--volume", &volume(&bases, "/bases:ro")])
            .args(["--volume", &volume(&out, "/out")])
            .args([
                "--volume",
                &volume(&common::kiln::host_ca_bundle(), "/tmp/ca.crt:ro"),
            ])
            .args(["--entrypoint", &entrypoint.to_string()]),
    );
    assert_eq!(built.code, 0, "{}", built.stderr);
    let image = format!("oci:{}:latest", out.join("img").display());
    assert_eq!(config(&out.join("img"), "latest")["architecture"], "arm64");
    let (port, _running) = serve(&k, &image, &ARM64);
    let (status, body) = http::request(port, "GET", "/", &[], b"");
    assert_eq!((status, body.as_str()), (200, "arm64 2.0.0"));
}
