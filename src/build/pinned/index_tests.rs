//! The index tests: pip's tag order, a release's files on its project page, the wheel pip
//! would take, and the page cache.

#![allow(clippy::unwrap_used)]
use super::tests::plan_of;
use super::*;

fn target() -> Target {
    plan_of("six==1.17.0\n").unwrap().target
}

#[test]
fn tags_come_in_pips_order() {
    let tags = target().tags();
    let at = |t: &str| {
        tags.iter()
            .position(|x| x == t)
            .unwrap_or_else(|| panic!("{t}"))
    };
    assert_eq!(tags[0], "cp313-cp313-manylinux_2_41_x86_64");
    assert!(at("cp313-cp313-manylinux_2_17_x86_64") < at("cp313-cp313-manylinux2014_x86_64"));
    assert!(at("cp313-cp313-manylinux2014_x86_64") < at("cp313-cp313-manylinux_2_16_x86_64"));
    assert!(at("cp313-cp313-manylinux1_x86_64") < at("cp313-cp313-linux_x86_64"));
    assert!(at("cp313-cp313-linux_x86_64") < at("cp313-abi3-manylinux_2_41_x86_64"));
    assert!(at("cp313-none-linux_x86_64") < at("cp312-abi3-manylinux_2_41_x86_64"));
    assert!(at("cp32-abi3-linux_x86_64") < at("py313-none-manylinux_2_41_x86_64"));
    assert!(at("py30-none-linux_x86_64") < at("cp313-none-any"));
    assert!(at("cp313-none-any") < at("py313-none-any"));
    assert!(at("py3-none-any") < at("py312-none-any"));
    assert_eq!(tags.last().unwrap(), "py30-none-any");
    assert!(
        !tags
            .iter()
            .any(|t| t.contains("cp314") || t.contains("manylinux_2_42") || t.contains("musl"))
    );
}

fn file(name: &str, sha: char, requires_python: Option<&str>, yanked: bool) -> IndexFile {
    IndexFile {
        filename: name.into(),
        url: format!("https://files.example/{name}"),
        sha256: sha.to_string().repeat(64),
        requires_python: requires_python.map(str::to_string),
        yanked,
        limit: 1 << 20,
    }
}

#[test]
fn a_release_is_its_wheels_on_the_project_page_with_their_sizes() {
    let r = plan_of("pyyaml==6.0.2\n").unwrap().requirements.remove(0);
    let page = serde_json::json!({
        "meta": {"api-version": "1.1"},
        "files": [
            {"filename": "PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.whl",
             "url": "../../packages/a/PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.whl",
             "hashes": {"sha256": "AB".repeat(32)}, "size": 759_457, "yanked": false},
            {"filename": "PyYAML-6.0.2-py3-none-any.whl", "url": "https://files.example/b.whl",
             "hashes": {"sha256": "cd".repeat(32)}, "yanked": "broken"},
            {"filename": "PyYAML-6.0.2.0-py3-none-any.whl", "url": "https://files.example/c.whl",
             "hashes": {"sha256": "ef".repeat(32)}, "size": null, "requires-python": ">=3.8"},
            {"filename": "PyYAML-6.0.2-py2-none-any.whl", "url": "https://files.example/d.whl",
             "hashes": {"sha256": "01".repeat(32)}, "size": 0},
            {"filename": "PyYAML-6.0.1-py3-none-any.whl", "url": "https://files.example/e.whl",
             "hashes": {"sha256": "23".repeat(32)}, "size": 10},
            {"filename": "PyYAML-6.0.2.tar.gz", "url": "https://files.example/f.tar.gz",
             "hashes": {"sha256": "45".repeat(32)}, "size": 10}
        ]
    });
    let project: Project = serde_json::from_value(page).unwrap();
    let files = release_files(project, "https://pypi.org/simple/pyyaml/", &r);
    let got: Vec<(&str, &str, u64, bool)> = files
        .iter()
        .map(|f| (f.url.as_str(), &f.sha256[..4], f.limit, f.yanked))
        .collect();
    assert_eq!(
        got,
        [
            (
                "https://pypi.org/packages/a/PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.whl",
                "abab",
                759_457,
                false
            ),
            ("https://files.example/b.whl", "cdcd", download::LIMIT, true),
            (
                "https://files.example/c.whl",
                "efef",
                download::LIMIT,
                false
            ),
            (
                "https://files.example/d.whl",
                "0101",
                download::LIMIT,
                false
            ),
        ]
    );
    assert_eq!(files[2].requires_python.as_deref(), Some(">=3.8"));
}

#[test]
fn the_wheel_pip_would_take_is_chosen() {
    let t = target();
    let tags: BTreeMap<String, usize> = t
        .tags()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i))
        .collect();
    let r = plan_of("pyyaml==6.0.2\n").unwrap().requirements.remove(0);
    let files = [
        file(
            "PyYAML-6.0.2-cp313-cp313-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            'b',
            Some(">=3.8"),
            false,
        ),
        file(
            "PyYAML-6.0.2-cp313-cp313-musllinux_1_1_x86_64.whl",
            'c',
            None,
            false,
        ),
        file(
            "PyYAML-6.0.2-cp312-cp312-manylinux_2_28_x86_64.whl",
            'd',
            None,
            false,
        ),
        file(
            "PyYAML-6.0.2-cp313-cp313-macosx_11_0_arm64.whl",
            'e',
            None,
            false,
        ),
        file("PyYAML-6.0.2-py3-none-any.whl", 'f', None, false),
        file(
            "PyYAML-6.0.2-cp313-cp313-manylinux_2_28_x86_64.whl",
            '0',
            Some("<3.13"),
            false,
        ),
        file(
            "PyYAML-6.0.2-cp313-cp313-manylinux_2_34_x86_64.whl",
            '1',
            None,
            true,
        ),
    ];
    assert_eq!(
        choose(&r, &files, &tags, &t).unwrap().sha256,
        "b".repeat(64)
    );
    // A build number wins among equal tags.
    let built = file(
        "PyYAML-6.0.2-2-cp313-cp313-manylinux_2_17_x86_64.whl",
        '2',
        None,
        false,
    );
    let both = [files[0].clone(), built];
    assert_eq!(choose(&r, &both, &tags, &t).unwrap().sha256, "2".repeat(64));
    // A hash in requirements.txt narrows the choice to the file it names.
    let mut hashed = r.clone();
    hashed.hashes.insert("f".repeat(64));
    assert_eq!(
        choose(&hashed, &files, &tags, &t).unwrap().sha256,
        "f".repeat(64)
    );
    // Only wheels for other systems: pip builds the sdist.
    let why = choose(&r, &files[1..4], &tags, &t).unwrap_err();
    assert!(why.contains("no wheel"), "{why}");
    // No build tag ranks below build 0; tags are read lower-cased.
    let untagged = file("PyYAML-6.0.2-py3-none-any.whl", '3', None, false);
    let zero = file("PyYAML-6.0.2-0-PY3-none-any.whl", '4', None, false);
    assert_eq!(
        choose(&r, &[untagged.clone(), zero], &tags, &t)
            .unwrap()
            .sha256,
        "4".repeat(64)
    );
    // Two files that rank the same: pip's order among them is its own.
    let twin = file("PyYAML-6.0.2-py2.py3-none-any.whl", '5', None, false);
    let why = choose(&r, &[untagged, twin], &tags, &t).unwrap_err();
    assert!(why.contains("rank the same"), "{why}");
    // A Requires-Python that depends on the patch release is for pip to decide.
    let patchy = [file(
        "PyYAML-6.0.2-py3-none-any.whl",
        'f',
        Some("!=3.13.0"),
        false,
    )];
    assert!(
        choose(&r, &patchy, &tags, &t)
            .unwrap_err()
            .contains("patch release")
    );
}

/// A PyPI stand-in answering every request with one project page, `Cache-Control:
/// max-age=<max_age>` and an ETag, or a bodiless 304 when asked with that ETag. Returns the
/// index URL and the requests so far, as (had If-None-Match, answered 304).
async fn page_server(
    max_age: u64,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<(bool, bool)>>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let index = format!("http://{}/simple/", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = std::sync::Arc::clone(&seen);
    tokio::spawn(async move {
        let page = b"{\"meta\": {\"api-version\": \"1.1\"}, \"files\": [{\"filename\": \
            \"six-1.17.0-py2.py3-none-any.whl\", \"url\": \"https://files.example/six.whl\", \
            \"hashes\": {\"sha256\": \"abab\"}, \"size\": 11}]}";
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
            let revalidating = head.contains("if-none-match: \"v1\"");
            log.lock()
                .unwrap()
                .push((head.contains("if-none-match"), revalidating));
            let answer = match revalidating {
                true => format!(
                    "HTTP/1.1 304 Not Modified\r\nCache-Control: \
                    max-age={max_age}\r\nConnection: close\r\n\r\n"
                )
                .into_bytes(),
                false => {
                    let mut a = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: \
                        application/vnd.pypi.simple.v1+json\r\nCache-Control: max-age={max_age}, \
                        public\r\nETag: \"v1\"\r\nContent-Length: {}\r\nConnection: \
                        close\r\n\r\n",
                        page.len()
                    )
                    .into_bytes();
                    a.extend_from_slice(page);
                    a
                }
            };
            let _ = conn.write_all(&answer).await;
        }
    });
    (index, seen)
}

#[tokio::test]
async fn a_project_page_is_taken_from_the_cache_while_fresh_and_revalidated_after() {
    let r = plan_of("six==1.17.0\n").unwrap().requirements.remove(0);
    let http = reqwest::Client::new();
    let cache = tempfile::tempdir().unwrap();
    let wheels = |files: Option<Vec<IndexFile>>| -> Vec<String> {
        files.unwrap().into_iter().map(|f| f.filename).collect()
    };

    // PyPI's 600 s: the second build asks nothing.
    let (index, seen) = page_server(600).await;
    for _ in 0..2 {
        let files = release(&http, &index, cache.path(), &r).await.unwrap();
        assert_eq!(wheels(files), ["six-1.17.0-py2.py3-none-any.whl"]);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [(false, false)],
        "one request for two builds"
    );

    // max-age=0: every build asks, with the ETag, and a 304 serves the cached page.
    let cache = tempfile::tempdir().unwrap();
    let (index, seen) = page_server(0).await;
    for _ in 0..3 {
        let files = release(&http, &index, cache.path(), &r).await.unwrap();
        assert_eq!(wheels(files), ["six-1.17.0-py2.py3-none-any.whl"]);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [(false, false), (true, true), (true, true)]
    );

    // A kept page that does not parse is neither used nor revalidated (the stand-in would
    // answer 304 to its ETag): the index is asked for the page anew.
    let (index, seen) = page_server(600).await;
    let cache = tempfile::tempdir().unwrap();
    release(&http, &index, cache.path(), &r).await.unwrap();
    let url = format!("{index}six/");
    let h = reqwest::header::HeaderMap::from_iter([
        (
            reqwest::header::CACHE_CONTROL,
            reqwest::header::HeaderValue::from_static("max-age=600"),
        ),
        (
            reqwest::header::ETAG,
            reqwest::header::HeaderValue::from_static("\"v1\""),
        ),
    ]);
    pages::write(cache.path(), &url, &h, b"{not json", None);
    let files = release(&http, &index, cache.path(), &r).await.unwrap();
    assert_eq!(wheels(files), ["six-1.17.0-py2.py3-none-any.whl"]);
    assert_eq!(
        *seen.lock().unwrap(),
        [(false, false), (false, false)],
        "asked again, without the ETag"
    );
}
