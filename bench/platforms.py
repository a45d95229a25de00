#!/usr/bin/env python3
"""A two-platform build beside a one-platform build, side by side in one run.

    python3 bench/platforms.py [--runs N] [--kiln PATH]

Starts Debian's `docker-registry` on a free loopback port (as bench/vs_buildah.py does),
assembles the nodejs22 base and builder for linux/amd64 and linux/arm64 into a layout
(`kiln base build --platform linux/amd64,linux/arm64`, untimed), and builds the node-lockfile
test Function (six npm packages from its package-lock.json, installed by kiln itself for
either platform: nothing needs emulation) into two repositories: once for linux/amd64, once for
linux/amd64,linux/arm64 (two images and an index). Two cases, each build alternating which goes
first:

- cold: a fresh cache and a fresh repository for every build (the packages come from the
  npm registry each time, through the machine's network);
- source-only rebuild: the handler edited before each pair of builds.

It prints the medians and the ratio two/one of each, and the median of each back-to-back
pair's own ratio: issue 31's target is at most 1.3.

Needs docker-registry and a kiln binary (default target/release/kiln).

The registry keeps its storage in the run's temporary directory: `TMPDIR=/dev/shm` puts it in
memory. On a VM's disk its requests wait on the block device, and a run's figures can move by
half from one run to the next (bench/RESULTS.md, 2026-11-29).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_buildah import REPO, Registry  # noqa: E402

BOTH = 'linux/amd64,linux/arm64'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--runs', type=int, default=11)
    ap.add_argument('--cold-runs', type=int, default=5)
    ap.add_argument('--kiln', default=os.path.join(REPO, 'target', 'release', 'kiln'))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix='kiln-platforms-bench-')
    reg = Registry(work)
    try:
        host = f'127.0.0.1:{reg.port}'
        shared = {**os.environ, 'KILN_CACHE_DIR': os.path.join(work, 'base-cache')}
        bases = os.path.join(work, 'bases')
        subprocess.run([args.kiln, 'base', 'build', 'nodejs22', '--platform', BOTH,
                        '--output', f'oci:{bases}'], check=True, env=shared,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fn = os.path.join(work, 'fn')
        shutil.copytree(os.path.join(REPO, 'tests', 'fixtures', 'functions', 'node-lockfile'), fn)
        handler = os.path.join(fn, 'handler.js')
        counter = [0]
        requests = {'linux/amd64': [], BOTH: []}

        def build(platforms, cache, repo):
            argv = [args.kiln, 'build', fn, '--runtime', 'nodejs22', '--platform', platforms,
                    '--base', f'oci:{bases}:nodejs22',
                    '--builder-image', f'oci:{bases}:nodejs22-builder',
                    '--image', f'{host}/fns/{repo}', '--insecure-registry', host]
            env = {**os.environ, 'KILN_CACHE_DIR': cache}
            before = reg.requests()
            start = time.perf_counter()
            subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            ms = (time.perf_counter() - start) * 1000
            time.sleep(0.05)  # the access log line of the last request
            requests[platforms].append(reg.requests() - before)
            return ms

        def fresh():
            counter[0] += 1
            return os.path.join(work, f'cache-{counter[0]}'), f'cold-{counter[0]}'

        cold = {'one': [], 'two': []}
        for run in range(args.cold_runs):
            for which in (('one', 'two') if run % 2 == 0 else ('two', 'one')):
                cache, repo = fresh()
                cold[which].append(build('linux/amd64' if which == 'one' else BOTH, cache, repo))
        warm_cache = os.path.join(work, 'warm')
        build('linux/amd64', warm_cache, 'one')
        build(BOTH, warm_cache, 'two')
        rebuild = {'one': [], 'two': []}
        for run in range(args.runs):
            with open(handler, 'a') as f:
                f.write(f'// edit {run}\n')
            for which in (('one', 'two') if run % 2 == 0 else ('two', 'one')):
                platforms = 'linux/amd64' if which == 'one' else BOTH
                rebuild[which].append(build(platforms, warm_cache, which))
        print(f'{args.kiln}, medians (registry requests of a source-only rebuild: '
              f'{statistics.median(requests["linux/amd64"][-args.runs:]):.0f} for one platform, '
              f'{statistics.median(requests[BOTH][-args.runs:]):.0f} for two):')
        for name, times, runs in (('cold build', cold, args.cold_runs),
                                  ('source-only rebuild', rebuild, args.runs)):
            one, two = statistics.median(times['one']), statistics.median(times['two'])
            # Each pair ran back to back: the median of their own ratios is steadier than the
            # ratio of the medians when the machine's speed drifts during the run.
            paired = statistics.median(t / o for o, t in zip(times['one'], times['two']))
            print(f'  {name} ({runs} runs): linux/amd64 {one:8.1f} ms   {BOTH} {two:8.1f} ms'
                  f'   two/one {two / one:.2f} (median of the pairs\' ratios {paired:.2f})')
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
