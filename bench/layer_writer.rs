//! The layer writer: MB/s of uncompressed tar for a real tree, kiln on one thread and on
//! every core (the blob is the same), against `tar | gzip -6` and, when installed,
//! `tar | pigz -6`, all in one run; and peak RSS while kiln writes a 1 GB layer. Run with
//!
//!     KILN_BENCH_TREE=DIR cargo test --release --features bench --test bench_layer_writer \
//!         -- --ignored --nocapture --test-threads 1
//!
//! DIR defaults to `/usr/lib` (real binaries, scripts and data; set it to a `node_modules`
//! for the case). Record the medians in bench/RESULTS.md.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use kiln::oci::MediaType;
use kiln::oci::layer::write_layer_with_threads;
use kiln::oci::source::{WalkRules, walk};

const RUNS: usize = 5;

fn tree() -> PathBuf {
    std::env::var_os("KILN_BENCH_TREE").map_or_else(|| PathBuf::from("/usr/lib"), PathBuf::from)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Bytes of the uncompressed tar kiln writes for `dir` (its diff ID's input).
fn tar_size(dir: &Path) -> u64 {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -C '{}' -cf - . 2>/dev/null | wc -c",
            dir.display()
        ))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn kiln_seconds(dir: &Path, threads: usize, scratch: &Path) -> (f64, String) {
    let tree = walk(dir, &WalkRules::default()).unwrap();
    let start = Instant::now();
    let blob = write_layer_with_threads(
        tree.to_layer_entries("x"),
        0,
        MediaType::OciLayerGzip,
        scratch,
        threads,
    )
    .unwrap();
    (
        start.elapsed().as_secs_f64(),
        blob.descriptor.digest.to_string(),
    )
}

fn shell_seconds(pipeline: &str) -> f64 {
    let start = Instant::now();
    let status = Command::new("sh").arg("-c").arg(pipeline).status().unwrap();
    assert!(status.success(), "{pipeline}");
    start.elapsed().as_secs_f64()
}

#[test]
#[ignore]
fn layer_writer_rate_against_gzip_and_pigz() {
    let dir = tree();
    let scratch = tempfile::tempdir().unwrap();
    let mb = tar_size(&dir) as f64 / 1e6;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let pigz = Command::new("pigz").arg("--version").output().is_ok();
    let (mut one, mut all, mut gzip, mut pigz_t) = (vec![], vec![], vec![], vec![]);
    let mut digests = std::collections::BTreeSet::new();
    for _ in 0..RUNS {
        let (t, d) = kiln_seconds(&dir, 1, scratch.path());
        one.push(t);
        digests.insert(d);
        let (t, d) = kiln_seconds(&dir, cores, scratch.path());
        all.push(t);
        digests.insert(d);
        let tar = format!("tar -C '{}' -cf - . 2>/dev/null", dir.display());
        gzip.push(shell_seconds(&format!("{tar} | gzip -6 > /dev/null")));
        if pigz {
            pigz_t.push(shell_seconds(&format!("{tar} | pigz -6 > /dev/null")));
        }
    }
    assert_eq!(digests.len(), 1, "one blob for 1 and {cores} threads");
    let rate = |v: Vec<f64>| mb / median(v);
    let (one, all, gzip) = (rate(one), rate(all), rate(gzip));
    println!(
        "tree {} ({mb:.0} MB of tar), {RUNS} runs each, interleaved, medians:",
        dir.display()
    );
    println!("  kiln, 1 thread:        {one:7.1} MB/s");
    println!(
        "  kiln, {cores} threads:       {all:7.1} MB/s  ({:.2}x one thread)",
        all / one
    );
    println!(
        "  tar | gzip -6:         {gzip:7.1} MB/s  (kiln {cores} threads: {:.2}x)",
        all / gzip
    );
    if pigz {
        let p = rate(pigz_t);
        println!(
            "  tar | pigz -6:         {p:7.1} MB/s  (kiln {cores} threads: {:.2}x)",
            all / p
        );
    } else {
        println!("  tar | pigz -6:         not installed (apt-get install pigz)");
    }
}

/// Peak RSS (VmHWM) of this process, in MB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 1024.0
}

#[test]
#[ignore]
fn peak_rss_while_writing_a_one_gigabyte_layer() {
    // 1,024 files of 1 MiB, half random and half text: about 1 GB of tar.
    let dir = tempfile::tempdir().unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..1024 {
        let bytes: Vec<u8> = (0..1 << 20)
            .map(|j: usize| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if j.is_multiple_of(2) {
                    x as u8
                } else {
                    b"node_modules "[j % 13]
                }
            })
            .collect();
        std::fs::write(dir.path().join(format!("f{i:04}")), bytes).unwrap();
    }
    let before = peak_rss_mb();
    let scratch = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let (secs, _) = kiln_seconds(dir.path(), cores, scratch.path());
    println!(
        "1 GB layer on {cores} threads: {secs:.1} s, peak RSS {:.0} MB (before writing: \
            {before:.0} MB)",
        peak_rss_mb()
    );
}
