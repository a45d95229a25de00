#!/usr/bin/env python3
"""Function server start-up, before and after a change: process start -> first 200 on
/healthz, for runtimes/_servers/node/server.js and python/server.py on the host's node and
python3, interleaved runs, medians. No image is involved (kiln run's unpacking is separate).

    python3 bench/server_start.py [BASE_REVISION]   # default: HEAD~1

The "before" servers come from `git show BASE_REVISION:…`, the "after" ones from the tree.
Both Python servers get bottle and cheroot on PYTHONPATH (the image's dist-packages carry them;
pip installs them into a temporary directory here). As in the image, where the root file system
is read-only and no .pyc files exist, Python compiles every module it imports from source:
bytecode is looked up in an empty PYTHONPYCACHEPREFIX and never written.
"""
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

RUNS = 21


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def once(cmd, env):
    port = free_port()
    env = dict(env, FUNC_PORT=str(port))
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except OSError:
                time.sleep(0.001)
    finally:
        proc.kill()
        proc.wait()


def main():
    base_rev = sys.argv[1] if len(sys.argv) > 1 else 'HEAD~1'
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp()
    for name in ('before', 'after', 'fn'):
        os.makedirs(os.path.join(work, name))
    for rel, file in (('node/server.js', 'server.js'), ('python/server.py', 'server.py')):
        old = subprocess.run(['git', '-C', repo, 'show', f'{base_rev}:runtimes/_servers/{rel}'],
                             check=True, capture_output=True).stdout
        with open(os.path.join(work, 'before', file), 'wb') as f:
            f.write(old)
        with open(os.path.join(repo, 'runtimes/_servers', rel), 'rb') as src:
            with open(os.path.join(work, 'after', file), 'wb') as f:
                f.write(src.read())
    with open(os.path.join(work, 'fn', 'handler.js'), 'w') as f:
        f.write("module.exports = { main: () => 'hi' };\n")
    with open(os.path.join(work, 'fn', 'handler.py'), 'w') as f:
        f.write("def main(event, context):\n    return 'hi'\n")
    site = os.path.join(work, 'site')
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-compile', '--target',
                    site, 'bottle==0.13.4', 'cheroot==11.1.2'], check=True)
    env = {'PATH': os.environ['PATH'], 'FUNC_NAME': 'bench', 'FUNC_RUNTIME': 'bench',
           'FUNC_HANDLER': 'main', 'MOD_NAME': 'handler', 'no_proxy': '*',
           'PYTHONPATH': site, 'PYTHONDONTWRITEBYTECODE': '1',
           'PYTHONPYCACHEPREFIX': os.path.join(work, 'no-pycache')}
    runtimes = [('node', 'node', 'server.js', {'HANDLER_PATH': os.path.join(work, 'fn/handler.js')}),
                ('python', 'python3', 'server.py', {'FUNCTION_PATH': os.path.join(work, 'fn')})]
    for lang, interpreter, file, extra in runtimes:
        times = {'before': [], 'after': []}
        for _ in range(RUNS):
            for which in times:
                cmd = [interpreter, os.path.join(work, which, file)]
                times[which].append(once(cmd, dict(env, **extra)))
        before, after = (statistics.median(times[w]) for w in ('before', 'after'))
        print(f'{lang}: start -> first /healthz 200, median of {RUNS}: before ({base_rev}) '
              f'{before * 1000:.1f} ms, after {after * 1000:.1f} ms, ratio {after / before:.2f}')


if __name__ == '__main__':
    main()
