#!/usr/bin/env python3
"""Cold start of a Function image under `kiln run`, before and after a change: with the image
already unpacked (the first `kiln run` unpacks it into kiln's cache), the time from starting
`kiln run IMAGE` to the first 200 on /healthz — sandbox set-up, interpreter start, server and
Function load. Interleaved runs, medians.

    python3 bench/image_cold_start.py BEFORE_KILN AFTER_KILN

Each kiln binary builds its own runtime base images (`kiln base build`, from the lock compiled
into it) and a one-line hello Function on them (nodejs22, python313), and runs them. Build a
"before" binary from another revision with, for example:

    git worktree add /tmp/kiln-before REV && (cd /tmp/kiln-before && cargo build)
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

RUNS = int(os.environ.get('RUNS', 15))


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def build(kiln, work, name, env):
    """The hello Function's image on `kiln`'s own bases, for both runtimes: {runtime: ref}."""
    bases = os.path.join(work, f'{name}-bases')
    refs = {}
    for runtime, file, text in (
            ('nodejs22', 'handler.js', "module.exports = { main: () => 'hi' };\n"),
            ('python313', 'handler.py', "def main(event, context):\n    return 'hi'\n")):
        subprocess.run([kiln, 'base', 'build', runtime, '--output', f'oci:{bases}'], env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        fn = os.path.join(work, f'{name}-{runtime}')
        os.makedirs(fn)
        with open(os.path.join(fn, file), 'w') as f:
            f.write(text)
        out = os.path.join(work, f'{name}-{runtime}-out')
        refs[runtime] = subprocess.run(
            [kiln, 'build', fn, '--runtime', runtime, '--base', f'oci:{bases}:{runtime}',
             '--output', f'oci:{out}'], env=env, check=True, capture_output=True,
            text=True).stdout.strip()
    return refs


def once(kiln, ref, env):
    port = free_port()
    start = time.monotonic()
    proc = subprocess.Popen([kiln, 'run', ref, '--port', str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        while True:
            if proc.poll() is not None:
                sys.exit(f'kiln run {ref} exited with {proc.returncode}')
            try:
                if opener.open(f'http://127.0.0.1:{port}/healthz', timeout=1).status == 200:
                    return time.monotonic() - start
            except OSError:
                time.sleep(0.002)
    finally:
        proc.terminate()
        proc.wait()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kilns = {'before': os.path.abspath(sys.argv[1]), 'after': os.path.abspath(sys.argv[2])}
    work = tempfile.mkdtemp(prefix='kiln-cold-')
    env = dict(os.environ, KILN_CACHE_DIR=os.path.join(work, 'cache'))
    refs = {name: build(kiln, work, name, env) for name, kiln in kilns.items()}
    for runtime in ('nodejs22', 'python313'):
        times = {name: [] for name in kilns}
        for name, kiln in kilns.items():
            once(kiln, refs[name][runtime], env)  # unpacks the image into the cache
        for _ in range(RUNS):
            for name, kiln in kilns.items():
                times[name].append(once(kiln, refs[name][runtime], env))
        before, after = (statistics.median(times[n]) for n in ('before', 'after'))
        print(f'{runtime}: kiln run -> first /healthz 200 (image unpacked), median of {RUNS}: '
              f'before {before * 1000:.0f} ms, after {after * 1000:.0f} ms, '
              f'ratio {after / before:.2f}')


if __name__ == '__main__':
    main()
