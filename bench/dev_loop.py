#!/usr/bin/env python3
"""Edit to first changed answer: how long after a handler file is saved the Function answers
with the change, for `kiln dev` and, in the same run, for what a developer would do without
it. Medians of EDITS saves each, for Node.js and Python:

- kiln dev: the Function (on the runtime's own base image) built, sandboxed and served;
- by hand: `kiln build` then `kiln run` of the new image, the old one stopped first, as one
  would retype them (fewer saves: each new image is unpacked);
- nodemon (Node.js) / watchfiles (Python) restarting a bare HTTP server on the host's node or
  python3 whose handler is the same file, with no image, no sandbox and no build at all.

    python3 bench/dev_loop.py [--kiln PATH] [--edits 20] [--by-hand-edits 5]

Needs the host's node, npm and python3 (nodemon and watchfiles are installed into a temporary
directory) and a kiln binary (default target/release/kiln, else target/debug/kiln). kiln's
cache is $KILN_CACHE_DIR or ~/.cache/kiln: its store assembles the runtimes' images once.
A save is a new file renamed over the old one, as editors write; each answer is polled for
every 2 ms through a fresh connection.
"""
import argparse
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each run's saves differ from every earlier run's (the nonce): a cached image or rootfs from
# before would make a new build look free.
NONCE = os.urandom(8).hex()
HANDLERS = {
    'nodejs22': ('handler.js', f"// {NONCE}\nmodule.exports = {{{{ main: () => 'v{{n}}' }}}};\n"),
    'python313': ('handler.py', f"# {NONCE}\ndef main(event, context):\n    return 'v{{n}}'\n"),
}

# The bare servers nodemon and watchfiles restart: the handler file's main(), over HTTP.
NODE_SERVER = """
const http = require('http');
const { main } = require(process.argv[2]);
http.createServer(async (req, res) => { res.end(String(await main({}, {}))); })
  .listen(Number(process.env.PORT), '127.0.0.1');
"""
PYTHON_SERVER = """
import http.server, importlib.util, os, sys
spec = importlib.util.spec_from_file_location('handler', sys.argv[1])
handler = importlib.util.module_from_spec(spec); spec.loader.exec_module(handler)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = str(handler.main({}, {})).encode()
        self.send_response(200); self.send_header('content-length', str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()
"""


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def get(port):
    try:
        with urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=5) as r:
            return r.read().decode()
    except (OSError, http.client.HTTPException):
        # Refused, reset, or cut off by a restart.
        return None


def wait_for(port, want, timeout=300):
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if get(port) == want:
            return time.perf_counter() - start
        time.sleep(0.002)
    raise SystemExit(f'no answer {want!r} on port {port} after {timeout}s')


def save(path, text):
    tmp = path + '.swp'
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def edits(runtime, fn_dir, port, count, first):
    """Saves `count` new handlers; for each, the time from the save to the new answer."""
    name, template = HANDLERS[runtime]
    times = []
    for n in range(first, first + count):
        time.sleep(0.3)
        started = time.perf_counter()
        save(os.path.join(fn_dir, name), template.format(n=n))
        wait_for(port, f'v{n}')
        times.append(time.perf_counter() - started)
    return times


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kiln_dev(kiln, runtime, fn_dir, count, env):
    port = free_port()
    proc = subprocess.Popen([kiln, 'dev', fn_dir, '--runtime', runtime, '--port', str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(port, 'v0')
        return edits(runtime, fn_dir, port, count, first=1)
    finally:
        stop(proc)


def by_hand(kiln, runtime, fn_dir, count, env):
    """Each save: kiln build, then the old kiln run stopped and a new one started."""
    name, template = HANDLERS[runtime]
    port = free_port()
    times, proc = [], None

    def build_and_run():
        nonlocal proc
        ref = subprocess.run([kiln, 'build', fn_dir, '--runtime', runtime], env=env,
                             check=True, capture_output=True, text=True).stdout.strip()
        if proc:
            stop(proc)
        proc = subprocess.Popen([kiln, 'run', ref, '--port', str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        build_and_run()
        wait_for(port, 'v0')
        for n in range(1, count + 1):
            time.sleep(0.3)
            started = time.perf_counter()
            save(os.path.join(fn_dir, name), template.format(n=n))
            build_and_run()
            wait_for(port, f'v{n}')
            times.append(time.perf_counter() - started)
        return times
    finally:
        if proc:
            stop(proc)


def restarter(runtime, fn_dir, tools, count):
    """nodemon or watchfiles restarting the bare server on every save."""
    name, _ = HANDLERS[runtime]
    port = free_port()
    server = os.path.join(tools, 'server.js' if runtime.startswith('node') else 'server.py')
    handler = os.path.join(fn_dir, name)
    env = dict(os.environ, PORT=str(port), PYTHONPATH=os.path.join(tools, 'py'))
    if runtime.startswith('node'):
        cmd = [os.path.join(tools, 'node_modules', '.bin', 'nodemon'), '--quiet', '--watch',
               fn_dir, '--ext', 'js', server, handler]
    else:
        cmd = [sys.executable, '-m', 'watchfiles', f'{sys.executable} {server} {handler}',
               fn_dir]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(port, 'v0')
        return edits(runtime, fn_dir, port, count, first=1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def install_tools(tools):
    with open(os.path.join(tools, 'server.js'), 'w') as f:
        f.write(NODE_SERVER)
    with open(os.path.join(tools, 'server.py'), 'w') as f:
        f.write(PYTHON_SERVER)
    subprocess.run(['npm', 'install', '--silent', '--prefix', tools, 'nodemon@3'], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--target',
                    os.path.join(tools, 'py'), 'watchfiles'], check=True)


def fresh_function(work, runtime, tag):
    fn_dir = os.path.join(work, f'{runtime}-{tag}')
    os.makedirs(fn_dir)
    name, template = HANDLERS[runtime]
    save(os.path.join(fn_dir, name), template.format(n=0))
    return fn_dir


def ms(xs):
    return f'{statistics.median(xs) * 1000:.0f} ms'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    default = os.path.join(REPO, 'target', 'release', 'kiln')
    if not os.path.exists(default):
        default = os.path.join(REPO, 'target', 'debug', 'kiln')
    ap.add_argument('--kiln', default=default)
    ap.add_argument('--edits', type=int, default=20)
    ap.add_argument('--by-hand-edits', type=int, default=5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix='kiln-dev-bench-')
    tools = os.path.join(work, 'tools')
    os.makedirs(tools)
    install_tools(tools)
    env = dict(os.environ, KILN_LOG_FORMAT='text')
    rows = []
    try:
        for runtime in HANDLERS:
            dev = kiln_dev(args.kiln, runtime, fresh_function(work, runtime, 'dev'), args.edits,
                           env)
            hand = by_hand(args.kiln, runtime, fresh_function(work, runtime, 'hand'),
                           args.by_hand_edits, env)
            peer = restarter(runtime, fresh_function(work, runtime, 'peer'), tools, args.edits)
            rows.append((runtime, dev, hand, peer))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f'kiln: {args.kiln}; medians, edit to first changed answer')
    print('| runtime | kiln dev | by hand (build + run) | hand/dev | nodemon or watchfiles, '
          'bare server | dev/restarter |')
    print('|---|---|---|---|---|---|')
    for runtime, dev, hand, peer in rows:
        d, h, p = (statistics.median(x) for x in (dev, hand, peer))
        print(f'| {runtime} | {ms(dev)} (n={len(dev)}, max {max(dev) * 1000:.0f} ms) | '
              f'{ms(hand)} (n={len(hand)}) | {h / d:.1f}x | {ms(peer)} (n={len(peer)}) | '
              f'{d / p:.2f} |')


if __name__ == '__main__':
    main()
