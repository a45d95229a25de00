#!/usr/bin/env python3
"""Requests per second of kiln's function servers against a bare server, side by side.

    python3 bench/server_rps.py            # 5 rounds; ROUNDS=9 REQUESTS=100000 for more
    CASES=node:hello python3 bench/server_rps.py   # one runtime, or one runtime's Function

For each runtime (Node.js, Python) and each Function — a JSON hello (a GET), `post` (the common
Kyma shape: an async handler in Node.js reading a POSTed JSON body), and a Mandelbrot Function
in the manner of Kyma's performance scenario (the size in request headers, the escape
counts as JSON) — it starts kiln's server (`runtimes/_servers/*`, no image) with that Function
and a bare server that does the same work with nothing around it (Node: `http.createServer`;
Python: a plain WSGI app on cheroot, the WSGI server kiln's Python server runs on), and loads
each in turn in interleaved rounds, with oha when it is installed (`cargo install oha`; HTTP/1.1
keep-alive) or else ApacheBench (`ab -k`, HTTP/1.0 keep-alive). It prints the median requests
per second of each and kiln's share of the bare rate, and the server's CPU time per request
(its whole process tree, from /proc, around the measured load) with the bare server's share
of it: with the load generator on the same cores the rate ratio moves from run to run more
than the server's cost does, and the CPU time does not.

The server runs on the last CPU and the load generator on the others (PIN=0: anywhere), and
both ratios are medians of each round's own ratio (kiln and bare run back to back in a round).
Without pinning, how the two shared 2 cores moved the bare Node.js server's CPU time per request
from 42 to 62 µs between runs, more than the difference measured; and cheroot's hand-offs of a
connection between its threads then cost both Python servers about three times their pinned
CPU time, which hid what kiln's server adds.

The async `post` Function has a second reference: a bare server that calls the Function's own
`async main` and awaits it, with nothing else around it (`await` in the output). The promise
and its continuation are the Function's cost, paid by any server that calls it; the first bare
server computes the answer inline and pays none of it.

The new handler API (nodejs26, python314) has cases of its own, `express` and `flask`: kiln's
`express/server.js` and `flask/server.py` against a bare Express app (express.json() and one
route) and a bare Flask app on cheroot. NODE26=PATH names the Node.js for the express cases
(Kyma's nodejs26 server wants Node.js 26; default `node`), NODE=PATH the one for the legacy
Node.js cases (default `node`; the images run Node.js 22 and 24, whose AsyncLocalStorage costs
less than Node.js 20's).

With KYMA_SERVERLESS=DIR (a checkout of kyma-project/serverless) it also runs Kyma's own
runtime servers from their source — `components/runtimes/nodejs22/server.mjs`,
`python312/server.py`, `nodejs26/server.mjs` and `python314/server.py` with the packages of
their package.json and requirements.txt, installed here with npm and pip — on the same node and
python3, and prints kiln's rate over Kyma's and the servers' resident memory at idle. Kyma's
legacy servers listen on the fixed port 8080, which must be free.

IMAGE=1 runs the legacy cases inside built images instead, under `kiln run` (KILN=PATH, default
target/debug/kiln): the Function is built with `kiln build` on the runtime's base (nodejs22,
python313), and the bare server runs in the same image and sandbox, put over the function
server's file with `kiln run --volume`.

Needs node, python3 with pip (bottle and cheroot at the versions the python313 lock pins are
installed into a temporary directory), and oha or ab (apache2-utils).
"""

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(os.environ.get('ROUNDS', 5))
REQUESTS = int(os.environ.get('REQUESTS', 60000))
# The server on one core and the load generator on another, so neither takes the other's core
# (PIN=0 turns it off). Without it, how the two share 2 cores moved the bare server's cost per
# request from 42 to 62 µs between runs, more than the difference being measured.
CPUS = sorted(os.sched_getaffinity(0))
PIN = os.environ.get('PIN', '1') != '0' and len(CPUS) >= 2
SERVER_CPUS = {CPUS[-1]} if PIN else set(CPUS)
LOAD_CPUS = set(CPUS[:-1]) if PIN else set(CPUS)


def on(cpus):
    """A preexec_fn that runs the child on `cpus`."""
    return lambda: os.sched_setaffinity(0, cpus)
CONCURRENCY = int(os.environ.get('CONCURRENCY', 16))
MANDEL_HEADERS = {'width': '32', 'height': '32', 'iterations': '50', 'zoom': '1'}

# `module.exports = { main }`: Kyma's server import()s the file, and Node sees CommonJS exports
# only in forms its lexer recognises.
NODE_HELLO = """function main() { return { hello: 'world' }; }
module.exports = { main };
"""
# The common Kyma shape: an async handler reading a POSTed JSON body.
NODE_POST = """async function main(event) { return { hello: event.data.name }; }
module.exports = { main };
"""
POST_BODY = b'{"name": "world", "items": [1, 2, 3]}'
NODE_MANDEL = """
function escape(cr, ci, max) {
  let x = 0, y = 0, n = 0;
  for (; n < max && x * x + y * y < 4; n++) { const t = x * x - y * y + cr; y = 2 * x * y + ci; x = t; }
  return n;
}
function mandel(h) {
  const w = parseInt(h.width, 10), ht = parseInt(h.height, 10), max = parseInt(h.iterations, 10);
  const zoom = parseFloat(h.zoom), rows = [];
  for (let j = 0; j < ht; j++) {
    const row = [], ci = (j / ht - 0.5) / zoom;
    for (let i = 0; i < w; i++) row.push(escape((i / w - 0.5) / zoom - 0.7, ci, max));
    rows.push(row);
  }
  return { type: 'mandelbrot', width: w, height: ht, maxIterations: max, zoom, values: rows };
}
function main(event) { return mandel(event.extensions.request.headers); }
module.exports = { main, mandel };
"""
# The new API (nodejs26): Kyma's "Hello World" shape, JSON out.
EXPRESS_HELLO = """function main(req, res) { res.json({ hello: 'world' }); }
module.exports = { main };
"""
EXPRESS_POST = """async function main(req, res) { res.json({ hello: req.body.name }); }
module.exports = { main };
"""
EXPRESS_BARE = """
const express = require('express');
const app = express();
app.use(express.json());
app.all('/', (req, res) => res.json(req.method === 'POST' ? { hello: req.body.name } : { hello: 'world' }));
app.listen(Number(process.env.FUNC_PORT), '127.0.0.1');
"""
# The new API (python314).
FLASK_HELLO = """
def main():
    return {'hello': 'world'}
"""
FLASK_POST = """
import flask


def main():
    return {'hello': flask.request.get_json()['name']}
"""
FLASK_BARE = """
import os
import flask
from cheroot import wsgi
app = flask.Flask('bare')
@app.route('/', methods=['GET', 'POST'])
def root():
    if flask.request.method == 'POST':
        return {'hello': flask.request.get_json()['name']}
    return {'hello': 'world'}
server = wsgi.Server(('127.0.0.1', int(os.environ['FUNC_PORT'])), app, numthreads=50)
server.safe_start()
"""
NODE_BARE = """
const http = require('http');
const mode = process.argv[2] || process.env.BARE_MODE;
const work = mode === 'mandel' ? require(process.argv[3]).mandel : () => ({ hello: 'world' });
const post = mode === 'post' || mode === 'post-await';
// post-await: the Function's own async main, called and awaited, and nothing else.
const main = mode === 'post-await' && require(process.env.HANDLER_PATH
  || require('path').join(__dirname, 'function', 'handler.js')).main;
const answer = (res, value) => {
  const body = JSON.stringify(value);
  res.writeHead(200, { 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': Buffer.byteLength(body) });
  res.end(body);
};
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => { if (post) chunks.push(c); });
  req.on('end', () => {
    if (main) {
      main({ data: JSON.parse(Buffer.concat(chunks).toString('utf8')) }).then((v) => answer(res, v));
      return;
    }
    answer(res, post
      ? { hello: JSON.parse(Buffer.concat(chunks).toString('utf8')).name } : work(req.headers));
  });
});
server.listen(Number(process.env.FUNC_PORT), '127.0.0.1');
"""

PY_HELLO = """
def main(event, context):
    return {'hello': 'world'}
"""
PY_POST = """
def main(event, context):
    return {'hello': event['data']['name']}
"""
PY_MANDEL = """
def escape(cr, ci, limit):
    x = y = 0.0
    n = 0
    while n < limit and x * x + y * y < 4:
        x, y = x * x - y * y + cr, 2 * x * y + ci
        n += 1
    return n


def mandel(h):
    w, ht, limit = int(h.get('width')), int(h.get('height')), int(h.get('iterations'))
    zoom = float(h.get('zoom'))
    rows = [[escape((i / w - 0.5) / zoom - 0.7, (j / ht - 0.5) / zoom, limit) for i in range(w)]
            for j in range(ht)]
    return {'type': 'mandelbrot', 'width': w, 'height': ht, 'maxIterations': limit,
            'zoom': zoom, 'values': rows}


def main(event, context):
    return mandel(event['extensions']['request'].headers)
"""
PY_BARE = """
import json, os, sys
from cheroot import wsgi
mode = sys.argv[1] if len(sys.argv) > 1 else os.environ.get('BARE_MODE')
if mode == 'mandel':
    sys.path.insert(0, sys.argv[2])
    from handler import mandel
    def work(environ):
        return mandel({k: environ.get('HTTP_' + k.upper()) for k in
                       ('width', 'height', 'iterations', 'zoom')})
elif mode == 'post':
    def work(environ):
        size = int(environ.get('CONTENT_LENGTH') or 0)
        return {'hello': json.loads(environ['wsgi.input'].read(size))['name']}
else:
    def work(environ):
        return {'hello': 'world'}
def app(environ, start_response):
    body = json.dumps(work(environ)).encode()
    start_response('200 OK', [('Content-Type', 'application/json'),
                              ('Content-Length', str(len(body)))])
    return [body]
server = wsgi.Server(('127.0.0.1', int(os.environ['FUNC_PORT'])), app, numthreads=50)
server.safe_start()
"""


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def wait_port(port, proc):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f'server exited: {proc.args}')
        try:
            socket.create_connection(('127.0.0.1', port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f'server did not listen: {proc.args}')


OHA = shutil.which('oha') or (os.path.expanduser('~/.cargo/bin/oha')
                              if os.path.exists(os.path.expanduser('~/.cargo/bin/oha')) else None)


def load(port, path, headers, requests, body=None):
    """Requests per second of GETs, or of POSTs of the JSON `body`."""
    url = f'http://127.0.0.1:{port}{path}'
    if OHA:
        import json
        args = [OHA, '--no-tui', '--output-format', 'json', '-c', str(CONCURRENCY),
                '-n', str(requests)]
        if body is not None:
            args += ['-m', 'POST', '-T', 'application/json', '-d', body.decode()]
        for k, v in headers.items():
            args += ['-H', f'{k}: {v}']
        report = json.loads(subprocess.run(args + [url], capture_output=True, text=True,
                                           check=True, preexec_fn=on(LOAD_CPUS)).stdout)
        codes = report.get('statusCodeDistribution', {})
        if set(codes) != {'200'} or report.get('errorDistribution'):
            sys.exit(f'errors under load on {url}: {codes} {report.get("errorDistribution")}')
        return float(report['summary']['requestsPerSec'])
    args = ['ab', '-q', '-k', '-c', str(CONCURRENCY), '-n', str(requests)]
    if body is not None:
        body_file = os.path.join(tempfile.gettempdir(), f'kiln-rps-body-{os.getpid()}.json')
        with open(body_file, 'wb') as f:
            f.write(body)
        args += ['-p', body_file, '-T', 'application/json']
    for k, v in headers.items():
        args += ['-H', f'{k}: {v}']
    out = subprocess.run(args + [url], capture_output=True, text=True, check=True,
                         preexec_fn=on(LOAD_CPUS)).stdout
    failed = int(re.search(r'Failed requests:\s+(\d+)', out).group(1))
    non2xx = re.search(r'Non-2xx responses:\s+(\d+)', out)
    if failed or non2xx:
        sys.exit(f'errors under load on {path}:\n{out}')
    return float(re.search(r'Requests per second:\s+([\d.]+)', out).group(1))


def tree(pid):
    """A process and all its descendants (Kyma's Python server forks; `kiln run` has the
    sandbox and the server under it)."""
    pids, seen = [str(pid)], []
    while pids:
        p = pids.pop()
        if p in seen:
            continue
        seen.append(p)
        try:
            pids += subprocess.run(['pgrep', '-P', p], capture_output=True,
                                   text=True).stdout.split()
        except OSError:
            pass
    return seen


def rss_kib(pid):
    """Resident memory of a process and its descendants, KiB."""
    total = 0
    for p in tree(pid):
        try:
            with open(f'/proc/{p}/status') as f:
                total += int(re.search(r'VmRSS:\s+(\d+)', f.read()).group(1))
        except (OSError, AttributeError):
            pass
    return total


TICK = os.sysconf('SC_CLK_TCK')


def cpu_seconds(pids):
    """CPU time (user + system) the processes `pids` have used so far, seconds."""
    total = 0
    for p in pids:
        try:
            with open(f'/proc/{p}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / TICK


def paired(values, runtime, fn, against='bare'):
    """The median over rounds of kiln's value over `against`'s in the same round."""
    return statistics.median(k / b for k, b in zip(values[(runtime, fn, 'kiln')],
                                                  values[(runtime, fn, against)]))


def setup_kyma(checkout, work, node26):
    """Kyma's Node.js 22, Python 3.12, Node.js 26 and Python 3.14 servers from `checkout`,
    with their packages."""
    runtimes = os.path.join(checkout, 'components', 'runtimes')
    dirs = {}
    for name in ('nodejs22', 'nodejs26'):
        d = os.path.join(work, f'kyma-{name}')
        shutil.copytree(os.path.join(runtimes, name), d)
        npm_env = dict(os.environ)
        if name == 'nodejs26' and os.path.dirname(node26):
            npm_env['PATH'] = os.path.dirname(node26) + os.pathsep + npm_env['PATH']
        subprocess.run(['npm', 'install', '--no-audit', '--no-fund', '--loglevel=error',
                        '--engine-strict=false'], cwd=d, check=True, stdout=subprocess.DEVNULL,
                       env=npm_env)
        dirs[name] = d
    for name in ('python312', 'python314'):
        d = os.path.join(work, f'kyma-{name}')
        shutil.copytree(os.path.join(runtimes, name), d)
        subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--target',
                        os.path.join(d, 'site'), '-r', os.path.join(d, 'requirements.txt')],
                       check=True)
        dirs[name] = d
    return dirs


def build_images(kiln, work):
    """The legacy hello and post Functions built into images with `kiln build` on the
    nodejs22 and python313 bases: {(runtime, fn): reference}."""
    refs = {}
    for runtime, kiln_runtime, files in [
            ('node', 'nodejs22', {'hello': NODE_HELLO, 'post': NODE_POST}),
            ('python', 'python313', {'hello': PY_HELLO, 'post': PY_POST})]:
        for fn, text in files.items():
            d = os.path.join(work, f'image-{runtime}-{fn}')
            os.makedirs(d)
            name = 'handler.js' if runtime == 'node' else 'handler.py'
            with open(os.path.join(d, name), 'w') as f:
                f.write(text)
            out = subprocess.run([kiln, 'build', d, '--runtime', kiln_runtime,
                                  '--output', f'oci:{work}/layout', '--log-format', 'json'],
                                 capture_output=True, text=True, check=True).stdout
            refs[(runtime, fn)] = out.strip().splitlines()[-1]
    return refs


def main():
    if not shutil.which('ab'):
        sys.exit('needs ab (apt-get install apache2-utils)')
    work = tempfile.mkdtemp(prefix='kiln-rps-')
    site = os.path.join(work, 'site')
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--target', site,
                    'bottle==0.13.4', 'cheroot==11.1.2', 'flask==3.1.3'], check=True)
    for name, text in [('hello.js', NODE_HELLO), ('mandel.js', NODE_MANDEL), ('bare.js', NODE_BARE),
                       ('bare.py', PY_BARE), ('post.js', NODE_POST),
                       ('express-hello.js', EXPRESS_HELLO), ('express-post.js', EXPRESS_POST),
                       ('express-bare.js', EXPRESS_BARE), ('flask-bare.py', FLASK_BARE)]:
        with open(os.path.join(work, name), 'w') as f:
            f.write(text)
    for name, text in [('hello', PY_HELLO), ('mandel', PY_MANDEL), ('post', PY_POST),
                       ('flask-hello', FLASK_HELLO), ('flask-post', FLASK_POST)]:
        os.makedirs(os.path.join(work, name))
        with open(os.path.join(work, name, 'handler.py'), 'w') as f:
            f.write(text)
    servers = os.path.join(ROOT, 'runtimes', '_servers')
    node = os.environ.get('NODE', 'node')
    node26 = os.environ.get('NODE26', 'node')
    base_env = {'PATH': os.environ['PATH'], 'FUNC_TIMEOUT': '30', 'PYTHONPATH': site,
                'PYTHONDONTWRITEBYTECODE': '1'}
    cases = [('node', 'hello', {}), ('node', 'post', {}), ('node', 'mandel', MANDEL_HEADERS),
             ('python', 'hello', {}), ('python', 'post', {}), ('python', 'mandel', MANDEL_HEADERS),
             ('express', 'hello', {}), ('express', 'post', {}),
             ('flask', 'hello', {}), ('flask', 'post', {})]
    image = os.environ.get('IMAGE') == '1'
    if image:
        cases = [c for c in cases if c[0] in ('node', 'python') and c[1] != 'mandel']
    # CASES=node,python:hello: only these runtimes or runtime:Function pairs.
    wanted = [c for c in os.environ.get('CASES', '').split(',') if c]
    if wanted:
        cases = [c for c in cases if c[0] in wanted or f'{c[0]}:{c[1]}' in wanted]
    if any(c[0] == 'express' for c in cases):
        subprocess.run(['npm', 'install', '--no-audit', '--no-fund', '--loglevel=error',
                        'express@5.1.0'], cwd=work, check=True, stdout=subprocess.DEVNULL)
    node_path = os.pathsep.join([os.path.join(servers, 'express'),
                                 os.path.join(work, 'node_modules')])

    def kiln_node(fn):
        return [node, os.path.join(servers, 'node', 'server.js')], {
            'HANDLER_PATH': os.path.join(work, f'{fn}.js')}

    def bare_node(fn):
        return [node, os.path.join(work, 'bare.js'), fn, os.path.join(work, 'mandel.js')], {}

    # The async post Function awaited by a bare server: what any server calling it must pay.
    def await_node(fn):
        if fn != 'post':
            return None
        return [node, os.path.join(work, 'bare.js'), 'post-await'], {
            'HANDLER_PATH': os.path.join(work, 'post.js')}

    def kiln_python(fn):
        return [sys.executable, os.path.join(servers, 'python', 'server.py')], {
            'FUNCTION_PATH': os.path.join(work, fn)}

    def bare_python(fn):
        return [sys.executable, os.path.join(work, 'bare.py'), fn, os.path.join(work, 'mandel')], {}

    def kiln_express(fn):
        return [node26, os.path.join(servers, 'express', 'server.js')], {
            'HANDLER_PATH': os.path.join(work, f'express-{fn}.js'), 'NODE_PATH': node_path}

    def bare_express(fn):
        return [node26, os.path.join(work, 'express-bare.js')], {'NODE_PATH': node_path}

    def kiln_flask(fn):
        return [sys.executable, os.path.join(servers, 'flask', 'server.py')], {
            'HANDLER_PATH': os.path.join(work, f'flask-{fn}')}

    def bare_flask(fn):
        return [sys.executable, os.path.join(work, 'flask-bare.py')], {}

    starters = {'node': [('kiln', kiln_node), ('bare', bare_node), ('await', await_node)],
                'python': [('kiln', kiln_python), ('bare', bare_python)],
                'express': [('kiln', kiln_express), ('bare', bare_express)],
                'flask': [('kiln', kiln_flask), ('bare', bare_flask)]}
    if image:
        kiln = os.environ.get('KILN', os.path.join(ROOT, 'target', 'debug', 'kiln'))
        refs = build_images(kiln, work)
        paths = {'node': '/usr/src/app/server.js', 'python': '/usr/lib/kiln/server.py'}
        bare_files = {'node': os.path.join(work, 'bare.js'), 'python': os.path.join(work, 'bare.py')}

        def in_image(runtime, bare, mode=None):
            def start(fn):
                if mode and fn != 'post':
                    return None
                argv = [kiln, 'run', refs[(runtime, fn)], '--env', 'FUNC_TIMEOUT=30']
                if bare:
                    argv += ['--volume', f'{bare_files[runtime]}:{paths[runtime]}:ro',
                             '--env', f'BARE_MODE={mode or fn}']
                return argv, {'KILN_PORT_FLAG': '1'}
            return start

        for runtime in ('node', 'python'):
            starters[runtime] = [('kiln', in_image(runtime, False)),
                                 ('bare', in_image(runtime, True))]
        starters['node'].append(('await', in_image('node', True, 'post-await')))
    fixed_port = {}
    checkout = os.environ.get('KYMA_SERVERLESS')
    if checkout:
        kyma = setup_kyma(checkout, work, node26)

        def kyma_node(fn):
            return [node, os.path.join(kyma['nodejs22'], 'server.mjs')], {
                'HANDLER_PATH': os.path.join(work, f'{fn}.js'), 'FUNC_NAME': 'bench'}

        def kyma_python(fn):
            return [sys.executable, os.path.join(kyma['python312'], 'server.py')], {
                'FUNCTION_PATH': os.path.join(work, fn), 'MOD_NAME': 'handler',
                'FUNC_HANDLER': 'main', 'FUNC_NAME': 'bench',
                'PYTHONPATH': os.path.join(kyma['python312'], 'site')}

        def kyma_express(fn):
            return [node26, os.path.join(kyma['nodejs26'], 'server.mjs')], {
                'HANDLER_PATH': os.path.join(work, f'express-{fn}.js'), 'FUNC_NAME': 'bench',
                'SERVER_HOST': '127.0.0.1', 'KYMA_PORT_ENV': 'SERVER_PORT'}

        def kyma_flask(fn):
            return [sys.executable, os.path.join(kyma['python314'], 'server.py')], {
                'HANDLER_PATH': os.path.join(work, f'flask-{fn}'), 'FUNC_NAME': 'bench',
                'SERVER_HOST': '127.0.0.1', 'KYMA_PORT_ENV': 'SERVER_PORT',
                'PYTHONPATH': os.path.join(kyma['python314'], 'site')}

        if not image:
            starters['node'].append(('kyma', kyma_node))
            starters['python'].append(('kyma', kyma_python))
            fixed_port['kyma'] = 8080
        starters['express'].append(('kyma', kyma_express))
        starters['flask'].append(('kyma', kyma_flask))
    idle = {}
    results = {}
    cpu = {}
    for rnd in range(ROUNDS):
        for runtime, fn, headers in cases:
            for who, start in starters[runtime]:
                started = start(fn)
                if started is None:
                    continue
                argv, env = started
                port = (fixed_port.get(who) if runtime in ('node', 'python') else None) \
                    or free_port()
                env = {**base_env, **env, 'FUNC_PORT': str(port)}
                if env.pop('KYMA_PORT_ENV', None):
                    env['SERVER_PORT'] = str(port)
                if env.pop('KILN_PORT_FLAG', None):
                    argv = argv[:3] + ['--port', str(port)] + argv[3:]
                    env = {**os.environ, 'FUNC_TIMEOUT': '30'}
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL,
                                        preexec_fn=on(SERVER_CPUS))
                try:
                    wait_port(port, proc)
                    time.sleep(0.5)  # settled: Kyma's servers load the Function after listening
                    if fn == 'hello':
                        idle.setdefault((runtime, who), []).append(rss_kib(proc.pid))
                    # The Mandelbrot Function is ~100x the work of a hello: fewer calls.
                    n = REQUESTS if fn != 'mandel' else max(200, REQUESTS // 50)
                    body = POST_BODY if fn == 'post' else None
                    load(port, '/', headers, max(100, n // 10), body)  # warm-up (JIT, threads)
                    # The server's own CPU time per request: unlike the rate, it does not
                    # move with what the load generator takes from the same cores.
                    pids = tree(proc.pid)
                    before = cpu_seconds(pids)
                    rps = load(port, '/', headers, n, body)
                    cpu_us = (cpu_seconds(pids) - before) / n * 1e6
                finally:
                    proc.terminate()
                    proc.wait()
                results.setdefault((runtime, fn, who), []).append(rps)
                cpu.setdefault((runtime, fn, who), []).append(cpu_us)
        print(f'round {rnd + 1}/{ROUNDS} done', file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{'oha (HTTP/1.1)' if OHA else 'ab -k (HTTP/1.0)'}, {CONCURRENCY} connections, "
          f'{REQUESTS} hello / {max(200, REQUESTS // 50)} Mandelbrot requests, median of '
          f'{ROUNDS} interleaved rounds{", in images under kiln run" if image else ""}')
    head = f"{'runtime':8} {'function':10} {'kiln req/s':>11} {'bare req/s':>11} {'kiln/bare':>9}"
    if checkout:
        head += f" {'Kyma req/s':>11} {'kiln/Kyma':>9}"
    print(head + f" {'kiln µs':>8} {'bare µs':>8} {'bare/kiln':>9}")
    for runtime, fn, _ in cases:
        k = statistics.median(results[(runtime, fn, 'kiln')])
        b = statistics.median(results[(runtime, fn, 'bare')])
        line = f"{runtime:8} {fn:10} {k:11.0f} {b:11.0f} {paired(results, runtime, fn):9.2f}"
        if (runtime, fn, 'kyma') in results:
            y = statistics.median(results[(runtime, fn, 'kyma')])
            line += f" {y:11.0f} {paired(results, runtime, fn, 'kyma'):9.2f}"
        elif checkout:
            line += f" {'':>11} {'':>9}"
        kc = statistics.median(cpu[(runtime, fn, 'kiln')])
        bc = statistics.median(cpu[(runtime, fn, 'bare')])
        print(line + f" {kc:8.1f} {bc:8.1f} {1 / paired(cpu, runtime, fn):9.2f}")
    print('(µs: the server\'s CPU time per request, its whole process tree; bare/kiln is the '
          'share of kiln\'s CPU time a bare server needs. Both ratios are medians of each '
          'round\'s own ratio: kiln and bare run back to back in a round, so a slow spell of '
          'the machine moves both)')
    for runtime, fn, _ in cases:
        if (runtime, fn, 'await') in results:
            k = statistics.median(results[(runtime, fn, 'kiln')])
            a = statistics.median(results[(runtime, fn, 'await')])
            kc = statistics.median(cpu[(runtime, fn, 'kiln')])
            ac = statistics.median(cpu[(runtime, fn, 'await')])
            print(f'{runtime} {fn} against a bare server that awaits the same async main: '
                  f"{a:.0f} req/s, kiln/bare {paired(results, runtime, fn, 'await'):.2f}; "
                  f"{ac:.1f} µs, bare/kiln {1 / paired(cpu, runtime, fn, 'await'):.2f}")
    print('resident memory at idle (hello Function, after start-up), median KiB:')
    for (runtime, who), values in sorted(idle.items()):
        print(f'  {runtime:8} {who:5} {statistics.median(values):8.0f}')


if __name__ == '__main__':
    main()
