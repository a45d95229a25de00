#!/usr/bin/env python3
"""What signing, provenance and the SBOM add to a source-only rebuild, side by side in one run.

    python3 bench/sign_overhead.py [--runs N] [--kiln PATH]

Starts Debian's `docker-registry` on a free loopback port (as bench/vs_buildah.py does) and
builds the hello-node example Function on the nodejs22 base from kiln's local store into two
repositories of it: one plainly, one with `--sign-key` (an ECDSA P-256 key made here with
openssl), which adds the cosign-style signature, the signed SLSA provenance and SBOM. After one
untimed build of each, every run edits the handler (a new comment line, so only the source
layer changes) and times one build of each, alternating which goes first. It prints the
medians, their difference, their ratio, and the registry requests of each build (the
registry's access log): issue 31's target is at most 5 ms more, and no request that storing
the signature and the provenance does not need.

Needs docker-registry, openssl and a kiln binary (default target/release/kiln).

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--runs', type=int, default=15)
    ap.add_argument('--kiln', default=os.path.join(REPO, 'target', 'release', 'kiln'))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix='kiln-sign-bench-')
    reg = Registry(work)
    try:
        key = os.path.join(work, 'sign.key')
        subprocess.run(['openssl', 'genpkey', '-algorithm', 'EC', '-pkeyopt',
                        'ec_paramgen_curve:P-256', '-out', key], check=True,
                       stderr=subprocess.DEVNULL)
        fn = os.path.join(work, 'fn')
        shutil.copytree(os.path.join(REPO, 'examples', 'hello-node'), fn)
        handler = os.path.join(fn, 'handler.js')
        host = f'127.0.0.1:{reg.port}'
        env = {**os.environ, 'KILN_CACHE_DIR': os.path.join(work, 'cache')}
        # The store's nodejs22 base, assembled on first use (or already there).
        store = os.path.expanduser('~/.cache/kiln/store')
        subprocess.run([args.kiln, 'build', fn, '--runtime', 'nodejs22'], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f'oci:{store}:nodejs22'

        def build(signed):
            argv = [args.kiln, 'build', fn, '--runtime', 'nodejs22', '--base', base,
                    '--image', f'{host}/fns/{"signed" if signed else "plain"}',
                    '--insecure-registry', host, '--log-format', 'json']
            if signed:
                argv += ['--sign-key', key]
            before = reg.requests()
            start = time.perf_counter()
            subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            ms = (time.perf_counter() - start) * 1000
            time.sleep(0.05)  # the access log line of the last request
            return ms, reg.requests() - before

        build(False)
        build(True)
        times = {False: [], True: []}
        requests = {False: [], True: []}
        for run in range(args.runs):
            with open(handler, 'a') as f:
                f.write(f'// edit {run}\n')
            for signed in ((False, True) if run % 2 == 0 else (True, False)):
                ms, n = build(signed)
                times[signed].append(ms)
                requests[signed].append(n)
        plain, signed = statistics.median(times[False]), statistics.median(times[True])
        print(f'source-only rebuild, median of {args.runs} (alternating), {args.kiln}:')
        print(f'  plain   {plain:7.1f} ms  {statistics.median(requests[False]):.0f} requests')
        print(f'  signed  {signed:7.1f} ms  {statistics.median(requests[True]):.0f} requests'
              ' (signature, provenance and SBOM)')
        print(f'  signing adds {signed - plain:+.1f} ms; signed/plain {signed / plain:.2f}')
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    main()
