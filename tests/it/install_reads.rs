//! What a dependency's install script can read and reach: an npm `preinstall` script of the
//! Function's own package probes the credentials and directories kiln has at hand (the docker
//! config, a registry auth file, the Function's source directory, kiln's cache with other
//! Functions' dependency layers) and reports each one; none may be readable inside the install
//! sandbox. A `postinstall` script tries a loopback service on the host, the cloud metadata
//! address and a host that is no registry, directly and through the install's proxy: it gets
//! nothing, while the install itself still reaches the npm registry.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;

use common::kiln::{Kiln, copy_fixture, kiln_built_builder, tiny_base};

#[test]
fn an_install_script_reads_no_credentials_no_source_and_no_other_functions_cache() {
    common::require_tool("bwrap", "bubblewrap");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    // What a build has at hand on the host.
    let docker_config = kiln.home.path().join("docker/config.json");
    fs::write(
        &docker_config,
        r#"{"auths":{"registry.example":{"auth":"dXNlcjpkb2NrZXItc2VjcmV0"}}}"#,
    )
    .unwrap();
    let auth_file = work.path().join("registry-auth.json");
    fs::write(
        &auth_file,
        r#"{"auths":{"x":{"auth":"YXV0aC1maWxlLXNlY3JldA=="}}}"#,
    )
    .unwrap();
    let other = copy_fixture("hello-node", &work.path().join("other"));
    fs::write(
        other.join("package.json"),
        r#"{"dependencies":{"is-number":"7.0.0"}}"#,
    )
    .unwrap();
    let out = work.path().join("out");
    // Another Function's dependency layer is in the cache first.
    let first = build(&kiln, &other, &builder, &out, "auto");
    assert_eq!(first.code, 0, "{}", first.stderr);

    let function = copy_fixture("hello-node", &work.path().join("fn"));
    let probes = [
        docker_config.clone(),
        auth_file.clone(),
        function.join("handler.js"),
        kiln.cache_dir(),
        kiln.home.path().to_path_buf(),
    ];
    let list = serde_json::to_string(&probes).unwrap();
    // Reads each path (a directory is listed) and says on one line what it got; fails the
    // install so that kiln quotes the output.
    let script = format!(
        "const fs=require('fs');const out={{}};for(const p of {list}){{try{{out[p]=fs.statSync(p)\
         .isDirectory()?'LISTED '+fs.readdirSync(p).join(','):'READ '+fs.readFileSync(p,'utf8')}}\
         catch(e){{out[p]='NO \
             '+e.code}}}}console.error('probes='+JSON.stringify(out));process.exit(1)"
    );
    let manifest = serde_json::json!({
        "name": "probe",
        "version": "1.0.0",
        "scripts": {"preinstall": format!("node -e {}", shell_quote(&script))},
        "dependencies": {"is-number": "7.0.0"},
    });
    fs::write(function.join("package.json"), manifest.to_string()).unwrap();
    let run = build(&kiln, &function, &builder, &out, "auto");
    assert_eq!(run.code, 1, "the probe fails the install: {}", run.stderr);
    let line = run
        .stderr
        .lines()
        .find_map(|l| l.split_once("probes=").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("no probe output: {}", run.stderr));
    let found: serde_json::Value = serde_json::from_str(line).unwrap();
    for probe in &probes {
        let got = found[probe.to_str().unwrap()].as_str().unwrap();
        assert_eq!(
            got,
            "NO ENOENT",
            "{} is visible to the install",
            probe.display()
        );
    }
    for secret in [
        "docker-secret",
        "dXNlcjpkb2NrZXItc2VjcmV0",
        "YXV0aC1maWxlLXNlY3JldA",
    ] {
        assert!(!run.stderr.contains(secret), "{}", run.stderr);
    }
}

#[test]
fn an_install_reaches_the_package_registry_and_nothing_else_under_bwrap() {
    reaches_only_the_registry("bwrap");
}

#[test]
fn an_install_reaches_the_package_registry_and_nothing_else_in_the_built_in_sandbox() {
    reaches_only_the_registry("builtin");
}

fn reaches_only_the_registry(sandbox: &str) {
    use std::io::Read as _;
    common::require_tool("bwrap", "bubblewrap");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    // A service on the host's loopback that records whoever reaches it.
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = service.local_addr().unwrap().port();
    let reached = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let reached = reached.clone();
        std::thread::spawn(move || {
            for conn in service.incoming().flatten() {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_millis(500)));
                let mut buf = [0u8; 512];
                let n = conn.read(&mut buf).unwrap_or(0);
                reached
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        });
    }
    let targets = serde_json::json!([
        [
            "direct-loopback",
            format!("http://127.0.0.1:{port}/direct"),
            false
        ],
        [
            "proxied-loopback",
            format!("http://127.0.0.1:{port}/proxied"),
            true
        ],
        [
            "direct-metadata",
            "http://169.254.169.254/latest/meta-data/",
            false
        ],
        [
            "proxied-metadata",
            "http://169.254.169.254/latest/meta-data/",
            true
        ],
        ["proxied-other-host", "http://example.com/", true],
    ]);
    // Each probe: an HTTP GET, direct or through the proxy the install is given; the outcome
    // goes into a file in node_modules, which is layered.
    let script = format!(
        "const http=require('http');const out={{}};const proxy=process.env.HTTP_PROXY||'';\
         const probe=([name,url,viaProxy])=>new Promise(done=>{{const u=new URL(url);\
         const p=viaProxy&&proxy?new URL(proxy):null;\
         const req=http.request({{host:p?p.hostname:u.hostname,port:p?p.port:(u.port||80),\
         path:p?url:u.pathname,timeout:3000}},res=>{{out[name]='HTTP \
             '+res.statusCode;res.resume();done()}});\
         req.on('timeout',()=>{{out[name]='timeout';req.destroy()}});\
         req.on('error',e=>{{out[name]=out[name]||e.code;done()}});req.end()}});\
         Promise.all({targets}.map(probe)).then(()=>{{out.proxy=proxy;\
         require('fs').writeFileSync('node_modules/probe.json',JSON.stringify(out))}})"
    );
    let function = copy_fixture("hello-node", &work.path().join("fn"));
    let manifest = serde_json::json!({
        "name": "probe",
        "version": "1.0.0",
        "scripts": {"postinstall": format!("node -e {}", shell_quote(&script))},
        "dependencies": {"is-number": "7.0.0"},
    });
    fs::write(function.join("package.json"), manifest.to_string()).unwrap();
    let out = work.path().join("out");
    let run = build(&kiln, &function, &builder, &out, sandbox);
    assert_eq!(
        run.code, 0,
        "npm still reaches its registry: {}",
        run.stderr
    );
    let probe = layer_file(&out, "probe.json");
    let probe: serde_json::Value = serde_json::from_slice(&probe).unwrap();
    assert!(
        probe["proxy"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{probe}"
    );
    for name in ["direct-loopback", "direct-metadata"] {
        let got = probe[name].as_str().unwrap();
        assert!(
            got == "ECONNREFUSED" || got == "ENETUNREACH" || got == "timeout",
            "{name}: {probe}"
        );
    }
    for name in ["proxied-loopback", "proxied-metadata", "proxied-other-host"] {
        assert_eq!(probe[name], "HTTP 403", "{name}: {probe}");
    }
    assert!(
        reached.lock().unwrap().is_empty(),
        "{:?}",
        reached.lock().unwrap()
    );
    assert!(layer_file(&out, "is-number/package.json").len() > 10);
}

/// The bytes of the file whose layer path ends with `suffix`, in the layout's only image.
fn layer_file(layout: &std::path::Path, suffix: &str) -> Vec<u8> {
    use std::io::Read as _;
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let blob = |d: &str| {
        fs::read(
            layout
                .join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .unwrap()
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(index["manifests"][0]["digest"].as_str().unwrap())).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let bytes = blob(layer["digest"].as_str().unwrap());
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        for entry in tar.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.path().unwrap().to_string_lossy().ends_with(suffix) {
                let mut content = Vec::new();
                entry.read_to_end(&mut content).unwrap();
                return content;
            }
        }
    }
    panic!("no {suffix} in the image");
}

/// `kiln build` of the Node.js Function in `dir` on the tiny base, installing in `builder`
/// with sandbox `sandbox` (`auto`, `bwrap`, `builtin`), into the layout `out`.
pub(crate) fn build(
    kiln: &Kiln,
    dir: &std::path::Path,
    builder: &str,
    out: &std::path::Path,
    sandbox: &str,
) -> common::kiln::Run {
    kiln.run_cmd(kiln.command().env("KILN_SANDBOX", sandbox).args([
        "build",
        dir.to_str().unwrap(),
        "--runtime",
        "nodejs22",
        "--base",
        &tiny_base(),
        "--builder-image",
        builder,
        "--output",
        &format!("oci:{}", out.display()),
    ]))
}

/// The Function `name` in `work`, with `script` (JavaScript) as its package's postinstall
/// and one dependency.
pub(crate) fn with_postinstall(
    work: &std::path::Path,
    name: &str,
    script: &str,
) -> std::path::PathBuf {
    let function = copy_fixture("hello-node", &work.join(name));
    let manifest = serde_json::json!({
        "name": name,
        "version": "1.0.0",
        "scripts": {"postinstall": format!("node -e {}", shell_quote(script))},
        "dependencies": {"is-number": "7.0.0"},
    });
    fs::write(function.join("package.json"), manifest.to_string()).unwrap();
    function
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn a_failing_install_that_prints_its_npmrc_token_in_any_shape_leaks_none_of_it() {
    common::require_tool("bwrap", "bubblewrap");
    const TOKEN: &str = "KILN-NPMRC-TOKEN-5f2a9c";
    const PASSWORD: &str = "KILN-URL-PASSWORD-77e1";
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let function = copy_fixture("hello-node", &work.path().join("fn"));
    fs::write(
        function.join(".npmrc"),
        format!(
            "//npm.secret.example/:_authToken={TOKEN}\n\
             @acme:registry=https://deploy:{PASSWORD}@npm.secret.example/\n"
        ),
    )
    .unwrap();
    // Two on one line, a bare value, an Authorization header, JSON, a URL's password alone.
    let script = format!(
        "console.error('tokens {TOKEN} and {TOKEN}');console.error('{TOKEN}');\
         console.error('Authorization: Bearer {TOKEN}');\
         console.error(JSON.stringify({{_authToken:'{TOKEN}',registry:'x'}}));\
         console.error('password {PASSWORD}');process.exit(1)"
    );
    let manifest = serde_json::json!({
        "name": "leaky",
        "version": "1.0.0",
        "scripts": {"preinstall": format!("node -e {}", shell_quote(&script))},
        "dependencies": {"is-number": "7.0.0"},
    });
    fs::write(function.join("package.json"), manifest.to_string()).unwrap();
    let run = build(&kiln, &function, &builder, &work.path().join("out"), "auto");
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("Authorization: Bearer ***"),
        "{}",
        run.stderr
    );
    for secret in [TOKEN, PASSWORD] {
        assert!(
            !run.stderr.contains(secret),
            "{secret} leaked: {}",
            run.stderr
        );
    }
}

/// Function A's install script plants a file and rewrites everything in the package cache it
/// is given; Function B, installed next, must see none of it, and get the genuine package.
#[test]
fn one_functions_install_script_cannot_plant_anything_in_the_next_ones_package_cache() {
    common::require_tool("bwrap", "bubblewrap");
    let kiln = Kiln::new();
    let work = tempfile::tempdir().unwrap();
    let builder = kiln_built_builder(&kiln, "nodejs22", &work.path().join("bases"));
    let install = |name: &str, script: &str| {
        let function = with_postinstall(work.path(), name, script);
        let out = work.path().join(format!("{name}-out"));
        let run = build(&kiln, &function, &builder, &out, "auto");
        assert_eq!(run.code, 0, "{name}: {}", run.stderr);
        out
    };
    // A: plant a marker, and overwrite every cached file with its own code.
    install(
        "poisoner",
        "const fs=require('fs'),path=require('path');const c=process.env.npm_config_cache;\
         fs.writeFileSync(path.join(c,'planted'),'A was here');\
         const walk=d=>{for(const e of fs.readdirSync(d,{withFileTypes:true})){const \
             p=path.join(d,e.name);\
         if(e.isDirectory())walk(p);else{try{fs.chmodSync(p,0o644);fs.writeFileSync(p,\
             'module.exports=()=>\"pwned\"')}catch(_){}}}};\
         walk(c)",
    );
    // B: report what its cache holds, and what is-number is.
    let out = install(
        "victim",
        "const fs=require('fs'),path=require('path');const c=process.env.npm_config_cache;\
         fs.writeFileSync('node_modules/probe.json',\
             JSON.stringify({planted:fs.existsSync(path.join(c,'planted')),\
         isNumber:require('is-number')(5)}))",
    );
    let probe: serde_json::Value = serde_json::from_slice(&layer_file(&out, "probe.json")).unwrap();
    assert_eq!(
        probe["planted"], false,
        "A's file reached B's cache: {probe}"
    );
    assert_eq!(probe["isNumber"], true, "B got A's code: {probe}");
    let index = String::from_utf8(layer_file(&out, "is-number/index.js")).unwrap();
    assert!(!index.contains("pwned"), "{index}");
}

/// bwrap reports the sandbox's pid as soon as the sandbox exists and brings its loopback up
/// only a little later: kiln's helper that puts the proxy's listener there waits for the
/// loopback address instead of failing with "Cannot assign requested address" (as it once
/// did in CI).
#[test]
fn the_listener_helper_waits_for_the_sandbox_loopback_to_come_up() {
    use std::os::fd::OwnedFd;
    use std::process::{Command, Stdio};
    common::require_tool("unshare", "util-linux");
    common::require_tool("busybox", "busybox-static");
    // A network namespace whose loopback address comes half a second late, as bwrap's does.
    let mut sandbox = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "busybox", "sh", "-c"])
        .arg(
            "busybox ip link set lo up && busybox ip addr del 127.0.0.1/8 dev lo && echo ready \
             && sleep 0.5 && busybox ip addr add 127.0.0.1/8 dev lo && exec sleep 30",
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = sandbox.id();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sandbox.stdout.take().unwrap()),
        &mut ready,
    )
    .unwrap();
    assert_eq!(ready, "ready\n", "the namespace was not set up");
    let (mut listener_from, helper_end) = std::os::unix::net::UnixStream::pair().unwrap();
    let helper = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["__kiln-netns-listen", &pid.to_string(), "3128"])
        .stdout(Stdio::from(OwnedFd::from(helper_end)))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    sandbox.kill().unwrap();
    sandbox.wait().unwrap();
    assert!(
        helper.status.success(),
        "the helper failed: {}",
        String::from_utf8_lossy(&helper.stderr)
    );
    // It sent the listener (one byte of data carries it).
    let mut byte = [0u8; 1];
    std::io::Read::read_exact(&mut listener_from, &mut byte).unwrap();
    assert_eq!(&byte, b"l");
}
