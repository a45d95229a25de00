#!/usr/bin/env python3
"""kiln against buildah, side by side: the same Function, the same base and builder images, the
same loopback registry, build + push timed for each builder, interleaved run by run. Medians.

    python3 bench/vs_buildah.py [--runs N] [--json FILE] [--kiln PATH] [--only node|python]
                                [--buildah-cache all|cold-stateless|none]
                                [--lockfile-install auto|off] [--keep]

About 4 minutes per Function and run, plus a few minutes of set-up (the first time longer: the
runtime images are assembled). Run it as root on a quiet machine; it removes each run's state
as it goes, and everything else at exit.

What one invocation does:

- starts Debian's `docker-registry` on a free loopback port, with a small counting TCP proxy in
  front of it (in this script); both builders talk to the proxy's port, so "bytes uploaded"
  (client -> registry wire bytes, HTTP headers included) is measured the same way for both.
  "Requests" are the registry's access-log lines. Every server is stopped at exit.
- `kiln warm` copies the nodejs22 and python313 base and builder images into that registry
  (assembled once into a persistent store, `~/.cache/kiln-bench/warm`); both builders then
  name them by the digests warm printed (`REG/kiln/RUNTIME@sha256:…`), as the controller's
  build Jobs do. kiln pushes to a repository with `--tag-by-key` (the controller's mode),
  buildah to a tag.
- prepares two Functions: Node.js (12 npm dependencies pinned exactly, package-lock.json made
  once by the host's `npm install --package-lock-only`) and Python (requests, PyYAML,
  charset-normalizer, python-dateutil and their dependencies, pinned), each with a variant
  that has one more dependency, and a second Function with the same dependencies.
- buildah gets an equivalent two-stage Containerfile: the builder stage runs the runtime's own
  install command (exec form) on the manifest and lock with the host CA bundle (given as a
  `--build-context`), the final stage copies the installed dependencies, then the source, to
  the paths kiln uses. `buildah bud --isolation chroot --layers` then `buildah push`, overlay
  storage (vfs if overlay does not work). Its registry cache is used where it helps buildah:
  `--cache-to` on the cold build, `--cache-from` on the stateless one (`--buildah-cache all`
  puts both on every build, which costs buildah about 200 requests and seconds per warm
  build; `none` uses none). One untimed build + push of each Function checks that
  buildah works before anything is measured. Each buildah command runs in its own mount
  namespace with a per-state
  blob-info cache bound over /var/lib/containers/cache, so a "fresh storage root" really
  starts empty (buildah otherwise remembers blob locations there across builds).
- scenarios, each timed as the wall clock of the whole build + push:
  cold         empty caches: a fresh kiln --cache-dir, a fresh buildah storage root, fresh
               target and cache repositories (every run);
  source       the handler edited;
  nochange     the same inputs again;
  depadd       the manifest (+ lock) swapped for the variant with one more dependency;
  stateless    the second Function on an EMPTY local cache (a new kiln --cache-dir, a new
               buildah root), its dependencies available only in the cache repository the
               earlier builds filled (kiln --cache-repo, buildah --cache-from).
  Run 1 runs kiln first in each scenario, run 2 buildah first, and so on. A finished run's
  state is set aside and deleted only at the end (see `set_aside`), and before each step the
  kernel writes back what is dirty, untimed (see `measure`).
- per step: wall seconds (each command from its start until it is reaped; buildah's two
  commands added up), bytes uploaded (proxy), registry requests (access log), peak RSS:
  `ru_maxrss` from `os.wait4` on the started process, which on Linux is the largest single
  process of its tree (npm/pip inside the sandbox included), not a sum; and whether the
  package manager ran (kiln's log; the install's output in buildah's build log).
- kiln installs the Node.js Function's lock file itself (`--lockfile-install auto`, kiln's
  default: no builder image, no npm), and the Python Function's requirements.txt, which pins
  every package, likewise (no pip); `--lockfile-install off` makes it run npm and pip in the
  builder as buildah does. "pm" counts package-manager runs, so kiln's lock-file installs show as 0
  there and are counted apart (the stateless target wants neither).
- for kiln's cold build: how much of it is the package manager's own install. kiln's JSON log
  bounds the install from "installing dependencies" to "wrote dependency layer" (that window
  also holds writing the layer); the install alone is timed again, not as part of any build,
  by running the same command with `bwrap` in the same builder root file system kiln unpacked
  (fresh package cache, no egress proxy). kiln's overhead = its total minus that time; the
  cold build is also cut into phases at kiln's log lines. When kiln installed from the lock
  file, it unpacked no builder: the install alone then runs in a builder root kiln unpacks for
  it once, untimed (`alone_rootfs`), and the "overhead" compares kiln's whole cold build with
  npm's install alone (it can be negative).

Writes every raw sample, the medians, the targets, the machine and the tool versions to
`--json` (default bench/vs_buildah.json). Needs root (buildah, unshare), `buildah`,
`docker-registry`, `bwrap`, `npm`; the kiln binary from `--kiln` (default
target/release/kiln, else target/debug/kiln).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM_CACHE = os.path.expanduser('~/.cache/kiln-bench/warm')
CA_BUNDLE = os.environ.get('SSL_CERT_FILE', '/etc/ssl/certs/ca-certificates.crt')
SCENARIOS = ('cold', 'source', 'nochange', 'depadd', 'stateless')
# kiln's log lines when it installs from the lock file itself (`--lockfile-install auto`):
# Node.js's lock, Python's fully pinned requirements; and when the pinned wheels turn out to
# need pip after all (then pip runs and "installing dependencies" follows).
LOCKFILE_INSTALLS = ('installing dependencies from the lock file, without npm',
                     'installing the pinned requirements, without pip')
PINNED_FALLBACK = 'the dependencies need pip: the pinned wheels do not decide them alone'
BUILDERS = ('kiln', 'buildah')
BIC_DIR = '/var/lib/containers/cache'  # buildah's blob-info cache when run as root
CACHE_MODES = {
    'all': '--cache-from/--cache-to on every build',
    'cold-stateless': '--cache-to on the cold build, --cache-from on the stateless one',
    'none': 'no registry cache (the stateless build starts from an empty root)',
}

NODE_DEPS = {
    'axios': '1.7.9', 'chalk': '4.1.2', 'commander': '12.1.0', 'date-fns': '4.1.0',
    'dayjs': '1.11.13', 'debug': '4.4.0', 'express': '4.21.2', 'lodash': '4.17.21',
    'moment': '2.30.1', 'ms': '2.1.3', 'semver': '7.6.3', 'uuid': '11.0.5', 'yaml': '2.7.0',
}
NODE_ADDED = ('validator', '13.12.0')
PY_DEPS = [
    'requests==2.32.3', 'charset-normalizer==3.4.1', 'idna==3.10', 'urllib3==2.3.0',
    'certifi==2025.1.31', 'PyYAML==6.0.2', 'python-dateutil==2.9.0.post0', 'six==1.17.0',
]
PY_ADDED = 'packaging==24.2'

# (scenario, what, test(kiln median sample, buildah median sample)) -> (passed, shown value)
TARGETS = {
    'cold': [('>=2x buildah', lambda k, b: (b['seconds'] / k['seconds'] >= 2, f"{b['seconds'] / k['seconds']:.1f}x"))],
    'source': [
        ('<=40 ms', lambda k, b: (k['seconds'] <= 0.040, f"{k['seconds'] * 1000:.0f} ms")),
        ('>=50x buildah', lambda k, b: (b['seconds'] / k['seconds'] >= 50, f"{b['seconds'] / k['seconds']:.0f}x")),
        ('<=6 requests', lambda k, b: (k['requests'] <= 6, f"{k['requests']:.0f}")),
    ],
    'nochange': [
        ('<=25 ms', lambda k, b: (k['seconds'] <= 0.025, f"{k['seconds'] * 1000:.0f} ms")),
        ('>=100x buildah', lambda k, b: (b['seconds'] / k['seconds'] >= 100, f"{b['seconds'] / k['seconds']:.0f}x")),
        ('<=2 requests', lambda k, b: (k['requests'] <= 2, f"{k['requests']:.0f}")),
    ],
    'depadd': [('>=3x buildah', lambda k, b: (b['seconds'] / k['seconds'] >= 3, f"{b['seconds'] / k['seconds']:.1f}x"))],
    'stateless': [
        ('<=300 ms', lambda k, b: (k['seconds'] <= 0.300, f"{k['seconds'] * 1000:.0f} ms")),
        ('no package manager', lambda k, b: (k['pm_runs'] + k['lockfile_installs'] == 0,
                                             f"{k['pm_runs'] + k['lockfile_installs']:.0f} installs")),
    ],
}


def log(msg):
    print(f'[{time.strftime("%H:%M:%S")}] {msg}', file=sys.stderr, flush=True)


def fail(msg):
    raise SystemExit(f'vs_buildah: {msg}')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def tail(text, lines=30):
    return '\n'.join(text.rstrip().splitlines()[-lines:])


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


# --- servers ------------------------------------------------------------------------------


class Registry:
    """docker-registry on a free loopback port; its access log (one line per request) in a file.
    Storage as Debian's package configures it: the file system, with the in-memory cache of
    blob descriptors (without it, every blob check and manifest PUT reads the disk: a kiln
    source-only build took 22.6 instead of 20.3 ms)."""

    ACCESS = re.compile(rb'"(?:GET|HEAD|POST|PUT|PATCH|DELETE) /v2/')

    def __init__(self, work):
        self.port = free_port()
        root = os.path.join(work, 'registry')
        config = os.path.join(root, 'config.yml')
        write(config, f"""version: 0.1
log: {{level: error, accesslog: {{disabled: false}}}}
storage:
  filesystem: {{rootdirectory: {root}/data}}
  cache: {{blobdescriptor: inmemory}}
  delete: {{enabled: true}}
http: {{addr: 127.0.0.1:{self.port}, secret: kiln-vs-buildah}}
""")
        self.log_path = os.path.join(root, 'access.log')
        self._log = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(['docker-registry', 'serve', config], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._offset, self._count = 0, 0
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                fail(f'docker-registry exited with {self.proc.returncode}:\n'
                     f'{tail(open(self.log_path).read())}')
            try:
                if opener.open(f'http://127.0.0.1:{self.port}/v2/', timeout=1).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    fail(f'docker-registry did not answer on 127.0.0.1:{self.port}/v2/')
                time.sleep(0.05)
        self.opener = opener

    def requests(self):
        """Access-log lines so far (counted incrementally)."""
        with open(self.log_path, 'rb') as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b'\n') + 1
        self._count += len(self.ACCESS.findall(data[:end]))
        self._offset += end
        return self._count

    def has_manifest(self, repo, ref):
        req = urllib.request.Request(
            f'http://127.0.0.1:{self.port}/v2/{repo}/manifests/{ref}', method='HEAD',
            headers={'Accept': 'application/vnd.oci.image.manifest.v1+json, '
                               'application/vnd.docker.distribution.manifest.v2+json'})
        try:
            return self.opener.open(req, timeout=5).status == 200
        except OSError:
            return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class CountingProxy:
    """A threaded TCP forwarder to the registry that counts the bytes in each direction."""

    def __init__(self, upstream_port):
        self.upstream = ('127.0.0.1', upstream_port)
        self.sent = 0  # client -> registry
        self.received = 0  # registry -> client
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(('127.0.0.1', 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def counts(self):
        with self._lock:
            return self.sent, self.received

    def _accept(self):
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        back = threading.Thread(target=self._pipe, args=(upstream, client, 'received'),
                                daemon=True)
        back.start()
        self._pipe(client, upstream, 'sent')
        back.join()
        client.close()
        upstream.close()

    def _pipe(self, src, dst, counter):
        buf = bytearray(1 << 18)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + n)
                dst.sendall(view[:n])
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stop(self):
        self._closed = True
        self._sock.close()


# --- processes ----------------------------------------------------------------------------


class CommandFailed(Exception):
    def __init__(self, argv, code, stdout, stderr):
        super().__init__(f'{shlex.join(argv)}\nexited with {code}; last output:\n'
                         f'{tail(stdout, 15)}\n{tail(stderr, 30)}')
        self.argv, self.code, self.stdout, self.stderr = argv, code, stdout, stderr


def run(argv, env=None, cwd=None, scratch=None):
    """Runs `argv` to completion: (seconds, peak RSS KiB of its tree, stdout, stderr, the
    wall-clock time it started). Only the process is timed, from just before it is started
    until it has been reaped. Output goes through files, so nothing blocks on a pipe. Raises
    CommandFailed."""
    scratch = scratch or tempfile.gettempdir()
    with tempfile.TemporaryFile(dir=scratch) as out, tempfile.TemporaryFile(dir=scratch) as err:
        started = time.time()
        start = time.monotonic()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors='replace')
        stderr = err.read().decode(errors='replace')
    if proc.returncode != 0:
        raise CommandFailed(argv, proc.returncode, stdout, stderr)
    return seconds, usage.ru_maxrss, stdout, stderr, started


def output(argv, **kw):
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True,
                              **kw).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        return f'unavailable ({e})'


# --- Functions ----------------------------------------------------------------------------


class Function:
    """One benchmarked Function: its files for each scenario and the install kiln runs."""

    def __init__(self, key, runtime, handler, manifest, lock, install, output_dir, source_dir,
                 ca_env, pm_pattern, ignore):
        self.key, self.runtime, self.handler = key, runtime, handler
        self.manifest, self.lock, self.install = manifest, lock, install
        self.output, self.source_dir = output_dir, source_dir
        self.deps_dir = f'{source_dir}/{output_dir}'
        self.ca_env, self.pm_pattern, self.ignore = ca_env, re.compile(pm_pattern), ignore
        self.deps = {}  # variant ('base', 'added') -> {file name: text}
        self.handlers = {}  # 'v1', 'v2', 'second' -> text

    def files(self, deps, handler):
        return {self.handler: self.handlers[handler], **self.deps[deps]}

    def containerfile(self, images):
        files = ' '.join([self.manifest] + ([self.lock] if self.lock else []))
        env = ' '.join(f'{var}=/tmp/kiln-ca.crt' for var in self.ca_env)
        argv = json.dumps(self.install)
        return f"""# The builder stage: the runtime's install, as kiln runs it (in /tmp/work, as root,
# the CA bundle for the install only: it never reaches the final image).
FROM {images[self.runtime + '-builder']} AS deps
USER 0:0
WORKDIR /tmp/work
COPY --from=ca ca.crt /tmp/kiln-ca.crt
ENV {env} HOME=/tmp
COPY {files} ./
RUN {argv}

# The final stage: the dependencies, then the source, where kiln puts them.
FROM {images[self.runtime]}
COPY --from=deps /tmp/work/{self.output} {self.deps_dir}
COPY . {self.source_dir}/
"""


def node_function(work):
    fn = Function('node', 'nodejs22', 'handler.js', 'package.json', 'package-lock.json',
                  ['npm', 'ci', '--omit=dev', '--no-audit', '--no-fund', '--no-update-notifier'],
                  'node_modules', '/usr/src/app/function', ['NODE_EXTRA_CA_CERTS', 'SSL_CERT_FILE'],
                  r'added \d+ packages?', ['node_modules', '.git', '.npmrc'])
    for variant, deps in (('base', NODE_DEPS), ('added', {**NODE_DEPS, NODE_ADDED[0]: NODE_ADDED[1]})):
        dir = os.path.join(work, 'setup', f'node-{variant}')
        manifest = json.dumps({'name': 'bench-node', 'version': '1.0.0', 'private': True,
                               'dependencies': dict(sorted(deps.items()))}, indent=2) + '\n'
        write(os.path.join(dir, 'package.json'), manifest)
        # No user .npmrc: the lock gets the usual `resolved` URLs whatever this machine says.
        write(os.path.join(dir, 'npmrc'), '')
        try:
            run(['npm', 'install', '--package-lock-only', '--ignore-scripts', '--no-audit',
                 '--no-fund', '--userconfig', os.path.join(dir, 'npmrc')], cwd=dir)
        except CommandFailed as e:
            fail(f'generating the lock file failed:\n{e}')
        with open(os.path.join(dir, 'package-lock.json')) as f:
            fn.deps[variant] = {'package.json': manifest, 'package-lock.json': f.read()}
    requires = ''.join(f"  {json.dumps(name)}: require({json.dumps(name)}),\n" for name in NODE_DEPS)
    for name, version in (('v1', 'v1'), ('v2', 'v2'), ('second', 'second')):
        fn.handlers[name] = (
            f"const deps = {{\n{requires}}};\nconst VERSION = '{version}';\n\n"
            "module.exports = {\n  main: (event, context) =>\n"
            "    `${VERSION} ${Object.keys(deps).length} ${deps.lodash.camelCase('hello world')}`,\n};\n")
    return fn


def python_function(work):
    fn = Function('python', 'python313', 'handler.py', 'requirements.txt', None,
                  ['python3', '-m', 'pip', 'install', '--no-compile', '--no-warn-script-location',
                   '--disable-pip-version-check', '--target', 'site-packages', '-r',
                   'requirements.txt'],
                  'site-packages', '/kubeless', ['PIP_CERT', 'REQUESTS_CA_BUNDLE', 'SSL_CERT_FILE'],
                  r'Successfully installed', ['__pycache__', '*.pyc', '.git', '.venv',
                                              'site-packages', 'pip.conf'])
    fn.deps['base'] = {'requirements.txt': '\n'.join(PY_DEPS) + '\n'}
    fn.deps['added'] = {'requirements.txt': '\n'.join(PY_DEPS + [PY_ADDED]) + '\n'}
    for name, version in (('v1', 'v1'), ('v2', 'v2'), ('second', 'second')):
        fn.handlers[name] = (
            "import certifi, charset_normalizer, dateutil.parser, idna, requests, six, urllib3, yaml\n\n"
            f"VERSION = '{version}'\n\n\n"
            "def main(event, context):\n"
            "    year = dateutil.parser.parse('2024-01-02').year\n"
            "    return f\"{VERSION} {year} {yaml.safe_dump({'ok': True}).strip()}\"\n")
    return fn


def put_files(dir, files):
    """Writes `files` ({name: text}) into `dir`, replacing those already there."""
    os.makedirs(dir, exist_ok=True)
    for name, text in files.items():
        write(os.path.join(dir, name), text)


# --- builders -----------------------------------------------------------------------------


class Bench:
    """The shared environment: registry, proxy, tools, and how each builder runs."""

    def __init__(self, args, work):
        self.args, self.work, self.kiln = args, work, args.kiln
        self.registry = Registry(work)
        self.proxy = CountingProxy(self.registry.port)
        self.reg = f'127.0.0.1:{self.proxy.port}'
        self.driver = None
        self.buildah_cache = args.buildah_cache
        # name ('nodejs22', 'nodejs22-builder', …) -> REG/kiln/NAME@sha256:…, from `kiln warm`
        self.images = {}
        self.notes = []
        # fn.key -> a builder root file system for the install alone (see `alone_rootfs`)
        self.alone_rootfs = {}
        self.ca_dir = os.path.join(work, 'ca')
        os.makedirs(self.ca_dir)
        shutil.copyfile(CA_BUNDLE, os.path.join(self.ca_dir, 'ca.crt'))

    def stop(self):
        self.proxy.stop()
        self.registry.stop()

    def settled(self):
        """(requests, bytes sent, bytes received) once the access log and the proxy are quiet:
        the registry writes a request's line after its response."""
        last = None
        for _ in range(100):
            now = (self.registry.requests(), *self.proxy.counts())
            if now == last:
                return now
            last = now
            time.sleep(0.05)
        return last

    def measure(self, argvs, env=None, scratch=None):
        """Runs `argvs` one after the other as one step: its seconds are the sum of the
        commands' own times (this script's bookkeeping between them is not counted).

        First, untimed, the kernel writes back what is dirty (`sync`): what a build leaves
        to write back (buildah's storage, the registry's blobs) otherwise slows whatever
        runs next, which is the other builder every other step. A no-change kiln build took
        11.4 ms instead of 7.4 ms while a large file was being written, 13.5 ms before kiln
        stopped syncing its source layer."""
        os.sync()
        before = self.settled()
        parts, rss, outs, started = [], 0, [], None
        for argv in argvs:
            seconds, peak, stdout, stderr, t0 = run(argv, env=env, scratch=scratch)
            started = started or t0
            parts.append(seconds)
            rss = max(rss, peak)
            outs.append((stdout, stderr))
        after = self.settled()
        return {'seconds': sum(parts), 'parts': [round(p, 4) for p in parts],
                'requests': after[0] - before[0], 'bytes_up': after[1] - before[1],
                'bytes_down': after[2] - before[2], 'rss_kib': rss, 'started': started}, outs

    # kiln

    def kiln_build(self, fn, st, cache_dir, image, fn_dir):
        report = os.path.join(st['dir'], 'report.json')
        argv = [self.kiln, 'build', fn_dir, '--runtime', fn.runtime,
                '--base', self.images[fn.runtime],
                '--builder-image', self.images[f'{fn.runtime}-builder'],
                '--image', image, '--insecure-registry', self.reg, '--tag-by-key',
                '--cache-dir', cache_dir, '--cache-repo', st['cache_repo'],
                '--report', report, '--log-format', 'json',
                '--lockfile-install', self.args.lockfile_install]
        env = dict(os.environ, SSL_CERT_FILE=CA_BUNDLE)
        sample, [(stdout, stderr)] = self.measure([argv], env=env, scratch=st['dir'])
        ref = stdout.strip()
        repo = image
        if not re.fullmatch(re.escape(repo) + r'@sha256:[0-9a-f]{64}', ref):
            fail(f'kiln printed {ref!r}, not {repo}@sha256:…\n{shlex.join(argv)}\n{tail(stderr)}')
        if not self.registry.has_manifest(repo.split('/', 1)[1], ref.split('@', 1)[1]):
            fail(f'kiln said {ref} but the registry has no such manifest')
        events = kiln_log(stderr)
        sample['digest'] = ref.split('@', 1)[1]
        # What kiln logged, in seconds since the process started.
        sample['log'] = [[round(e['t'] - sample['started'], 4), e['message']]
                         for e in events if e['t'] is not None]
        sample['pm_runs'] = sum(1 for e in events if e['message'] == 'installing dependencies')
        # kiln's own install from the lock file: no package manager runs.
        sample['lockfile_installs'] = (
            sum(1 for e in events if e['message'] in LOCKFILE_INSTALLS)
            - sum(1 for e in events if e['message'] == PINNED_FALLBACK))
        sample['install_log_s'] = (log_window(events, 'installing dependencies',
                                              'wrote dependency layer')
                                   or next((w for m in LOCKFILE_INSTALLS
                                            if (w := log_window(events, m,
                                                                'wrote dependency layer'))),
                                           None))
        sample['builder_rootfs'] = builder_rootfs(events, cache_dir)
        try:
            with open(report) as f:
                rep = json.load(f)
            sample['kiln_report_registry'] = rep.get('registry')
            sample['unchanged'] = rep.get('unchanged', False)
        except (OSError, ValueError) as e:
            sample['kiln_report_registry'] = f'unreadable: {e}'
        return sample

    # buildah

    def cache_flags(self, st, scenario, mode):
        """buildah's registry-cache flags for `scenario` under `--buildah-cache mode`."""
        to, frm = f'--cache-to={st["buildah_cache"]}', f'--cache-from={st["buildah_cache"]}'
        if mode == 'all' or (mode != 'none' and scenario == 'verify'):
            return [frm, to]
        if mode == 'cold-stateless':
            return {'cold': [to], 'stateless': [frm]}.get(scenario, [])
        return []

    def buildah_argvs(self, fn, st, root, image, ctx, scenario, driver=None, mode=None):
        driver = driver or self.driver
        mode = mode or self.buildah_cache
        g = ['--root', os.path.join(root, 'root'), '--runroot', os.path.join(root, 'run'),
             '--storage-driver', driver]
        bic = os.path.join(root, 'blob-info-cache')
        os.makedirs(bic, exist_ok=True)
        # A private mount namespace with this state's own blob-info cache.
        ns = ['unshare', '--mount', '--propagation', 'private', '--', '/bin/sh', '-c',
              f'mount --bind "$0" {BIC_DIR} && exec "$@"', bic, 'buildah']
        flags = self.cache_flags(st, scenario, mode)
        bud = ns + g + ['bud', '--isolation', 'chroot', '--layers', '--tls-verify=false',
                        '-f', os.path.join(ctx, 'Containerfile'), '-t', image,
                        '--build-context', f'ca={self.ca_dir}', *flags, ctx]
        digest = os.path.join(root, 'digest')
        push = ns + g + ['push', '--tls-verify=false', '--digestfile', digest, image,
                         f'docker://{image}']
        return [bud, push], digest

    def buildah_build(self, fn, st, root, image, ctx, scenario, driver=None, mode=None):
        argvs, digest_file = self.buildah_argvs(fn, st, root, image, ctx, scenario, driver, mode)
        env = dict(os.environ, BUILDAH_ISOLATION='chroot')
        sample, outs = self.measure(argvs, env=env, scratch=root)
        with open(digest_file) as f:
            digest = f.read().strip()
        repo, tag = image.split('/', 1)[1].rsplit(':', 1)
        if not self.registry.has_manifest(repo, tag):
            fail(f'buildah pushed {image}, but the registry has no such tag')
        bud_out = outs[0][0] + outs[0][1]
        sample['digest'] = digest
        sample['pm_runs'] = len(fn.pm_pattern.findall(bud_out))
        sample['cache_hits'] = bud_out.count('Using cache')
        return sample

    def write_context(self, fn, ctx, files):
        put_files(ctx, files)
        write(os.path.join(ctx, 'Containerfile'), fn.containerfile(self.images))
        write(os.path.join(ctx, '.containerignore'),
              '\n'.join(fn.ignore + ['Containerfile', '.containerignore']) + '\n')


def kiln_log(stderr):
    """kiln's JSON log lines: [{'t': seconds since the epoch, 'message': …, 'fields': …}]."""
    events = []
    for line in stderr.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        fields = obj.get('fields', {})
        events.append({'t': parse_time(obj.get('timestamp', '')),
                       'message': fields.get('message', ''), 'fields': fields})
    return events


def parse_time(stamp):
    m = re.match(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?$', stamp)
    if not m:
        return None
    base = datetime.datetime.fromisoformat(m.group(1))
    zone = m.group(3) or 'Z'
    tz = datetime.timezone.utc if zone == 'Z' else datetime.datetime.strptime(
        zone.replace(':', ''), '%z').tzinfo
    frac = float('0.' + m.group(2)) if m.group(2) else 0.0
    return base.replace(tzinfo=tz).timestamp() + frac


def log_window(events, first, last):
    start = next((e['t'] for e in events if e['message'] == first), None)
    end = next((e['t'] for e in events if e['message'] == last), None)
    if start is None or end is None:
        return None
    return end - start


def builder_rootfs(events, cache_dir):
    for e in events:
        if e['message'] == 'dependencies install inside the builder image':
            algo, hex = str(e['fields'].get('builder', '')).split(':', 1)
            return os.path.join(cache_dir, 'rootfs', algo, hex)
    return None


# --- the install alone --------------------------------------------------------------------


def alone_rootfs(bench, fn):
    """A builder root file system for timing the install alone when kiln's cold build unpacked
    none (it installed from the lock file): kiln unpacks the same builder image once, into a
    cache of its own, by installing the dependencies with `--lockfile-install off --stage deps`
    (not timed). The entry's directory, or None."""
    if fn.key in bench.alone_rootfs:
        return bench.alone_rootfs[fn.key]
    scratch = tempfile.mkdtemp(prefix=f'alone-{fn.key}-', dir=bench.work)
    src, cache = os.path.join(scratch, 'fn'), os.path.join(scratch, 'cache')
    put_files(src, fn.files('base', 'v1'))
    argv = [bench.kiln, 'build', src, '--runtime', fn.runtime,
            '--builder-image', bench.images[f'{fn.runtime}-builder'],
            '--insecure-registry', bench.reg, '--cache-dir', cache, '--log-format', 'json',
            '--lockfile-install', 'off', '--stage', 'deps',
            '--stage-dir', os.path.join(scratch, 'stage')]
    env = dict(os.environ, SSL_CERT_FILE=CA_BUNDLE)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    entry = builder_rootfs(kiln_log(proc.stderr), cache) if proc.returncode == 0 else None
    if not entry:
        log(f'no builder root file system for the install alone:\n{tail(proc.stderr)}')
    bench.alone_rootfs[fn.key] = entry
    return entry


def install_alone(fn, entry, files, scratch):
    """The install as kiln runs it, but by itself: the same command in the same builder root
    file system, under bwrap as kiln's sandbox sets it up (uid 0, read-only root, tmpfs /tmp,
    the staging directory at /tmp/work, a fresh package cache, the CA bundle), with the host
    network instead of kiln's egress proxy. Seconds."""
    work = tempfile.mkdtemp(prefix='install-', dir=scratch)
    stage, cache = os.path.join(work, 'work'), os.path.join(work, 'cache')
    os.makedirs(cache)
    put_files(stage, files)
    with open(os.path.join(entry, 'config.json')) as f:
        config = json.load(f)
    image_env = (config.get('config') or {}).get('Env') or []
    env = [v.split('=', 1) for v in image_env if '=' in v]
    env += [['HOME', '/tmp'], ['LANG', 'C.UTF-8']]
    env += [[var, '/tmp/kiln-ca.crt'] for var in
            ('NODE_EXTRA_CA_CERTS', 'SSL_CERT_FILE', 'PIP_CERT', 'REQUESTS_CA_BUNDLE')]
    env += [['npm_config_cache' if fn.key == 'node' else 'PIP_CACHE_DIR', '/tmp/cache']]
    argv = ['bwrap', '--unshare-user', '--uid', '0', '--gid', '0', '--unshare-pid',
            '--unshare-ipc', '--unshare-uts', '--die-with-parent', '--cap-drop', 'ALL',
            '--bind', os.path.join(entry, 'rootfs'), '/', '--proc', '/proc', '--dev', '/dev',
            '--tmpfs', '/tmp', '--bind', stage, '/tmp/work', '--bind', cache, '/tmp/cache',
            '--ro-bind', CA_BUNDLE, '/tmp/kiln-ca.crt',
            '--ro-bind-try', '/etc/resolv.conf', '/etc/resolv.conf',
            '--remount-ro', '/', '--chdir', '/tmp/work', '--clearenv']
    for name, value in env:
        argv += ['--setenv', name, value]
    argv += ['--', *fn.install]
    try:
        seconds = run(argv, scratch=work)[0]
    except CommandFailed as e:
        log(f'the install alone failed (ignored):\n{e}')
        seconds = None
    return seconds  # `work` is in the run's directory, set aside with it


# --- scenarios ----------------------------------------------------------------------------


def one_run(bench, fn, r, order, results):
    """Run `r` of every scenario for `fn`, both builders, fresh state."""
    rdir = os.path.join(bench.work, f'run{r}-{fn.key}')
    st = {'dir': rdir, 'cache_repo': f'{bench.reg}/bench/kiln-cache-{fn.key}-r{r}',
          'buildah_cache': f'{bench.reg}/bench/buildah-cache-{fn.key}-r{r}'}
    kiln_fn, kiln_fn2 = os.path.join(rdir, 'kiln-fn'), os.path.join(rdir, 'kiln-fn2')
    ctx, ctx2 = os.path.join(rdir, 'buildah-ctx'), os.path.join(rdir, 'buildah-ctx2')
    # kiln: a repository and --tag-by-key (what the controller's builds do); buildah: a tag.
    image = {'kiln': f'{bench.reg}/bench/kiln-{fn.key}-r{r}',
             'buildah': f'{bench.reg}/bench/buildah-{fn.key}-r{r}:v1'}
    image2 = {'kiln': f'{bench.reg}/bench/kiln-{fn.key}2-r{r}',
              'buildah': f'{bench.reg}/bench/buildah-{fn.key}2-r{r}:v1'}
    steps = {
        'cold': ('base', 'v1'), 'source': ('base', 'v2'), 'nochange': ('base', 'v2'),
        'depadd': ('added', 'v2'), 'stateless': ('base', 'second'),
    }
    for scenario in SCENARIOS:
        deps, handler = steps[scenario]
        files = fn.files(deps, handler)
        second = scenario == 'stateless'
        put_files(kiln_fn2 if second else kiln_fn, files)
        bench.write_context(fn, ctx2 if second else ctx, files)
        for builder in order:
            log(f'run {r} {fn.key} {scenario}: {builder}')
            if builder == 'kiln':
                cache = os.path.join(rdir, 'kiln-cache2' if second else 'kiln-cache')
                sample = bench.kiln_build(fn, st, cache, (image2 if second else image)['kiln'],
                                          kiln_fn2 if second else kiln_fn)
            else:
                root = os.path.join(rdir, 'buildah2' if second else 'buildah')
                sample = bench.buildah_build(fn, st, root, (image2 if second else image)['buildah'],
                                             ctx2 if second else ctx, scenario)
            installs = sample['pm_runs'] + sample.get('lockfile_installs', 0)
            if scenario in ('cold', 'depadd') and installs != 1:
                # These builds must install: if the log does not show it, the detection (and
                # the stateless "no package manager" verdict) cannot be trusted.
                fail(f'{builder} {scenario} build of {fn.key}: no install found in its output '
                     f"(kiln's log line 'installing dependencies' renamed?)")
            sample.update(run=r, order=order.index(builder))
            results[fn.key]['samples'][scenario][builder].append(sample)
            log(f'  {sample["seconds"]:.3f} s, {sample["requests"]} requests, '
                f'{sample["bytes_up"]} B up, {sample["rss_kib"] // 1024} MiB')
        if scenario == 'cold':
            cold = results[fn.key]['samples']['cold']['kiln'][-1]
            entry = cold.get('builder_rootfs') or alone_rootfs(bench, fn)
            if entry:
                log(f'run {r} {fn.key}: the install alone in the builder root file system')
                alone = install_alone(fn, entry, fn.deps['base'], rdir)
                cold['install_alone_s'] = alone
    set_aside(bench, rdir)
    log(f'run {r} {fn.key}: its state set aside')


def set_aside(bench, path):
    """Moves `path` out of the way; it is deleted with the work directory at the end. Deleting
    a run's gigabytes between runs slowed the next cold builds several times over (ext4 with
    `discard` on this VM: an unpack of the Node.js builder image took 1.8 s alone and 5.5 s
    just after an `rm -rf` of a like tree), which is the benchmark's doing, not a build's."""
    done = os.path.join(bench.work, 'done')
    os.makedirs(done, exist_ok=True)
    os.rename(path, tempfile.mkdtemp(dir=done))  # replaces the new empty directory


# --- setup --------------------------------------------------------------------------------


def warm(bench, fns):
    os.makedirs(WARM_CACHE, exist_ok=True)
    env = dict(os.environ, KILN_CACHE_DIR=WARM_CACHE)
    argv = [bench.kiln, 'warm', '--registry', bench.reg, '--insecure-registry', bench.reg,
            *[fn.runtime for fn in fns]]
    log(f'kiln warm ({WARM_CACHE}; the first time assembles the images, 1-2 min)')
    try:
        seconds, _, stdout, _, _ = run(argv, env=env)
    except CommandFailed as e:
        fail(f'kiln warm failed:\n{e}')
    log(f'  {seconds:.1f} s\n{stdout}')
    # Both builders name the images by digest, as the controller's build Jobs do.
    for line in stdout.splitlines():
        ref = line.split()[0]
        name = ref.split('@')[0].rsplit('/', 1)[1].split(':')[0]
        bench.images[name] = f'{bench.reg}/kiln/{name}@{ref.split("@")[1]}'


def verify_buildah(bench, fn):
    """A full buildah build + push of `fn`, untimed, before anything is measured: picks the
    storage driver (overlay, else vfs) and whether --cache-from/--cache-to work."""
    ctx = os.path.join(bench.work, f'verify-{fn.key}', 'ctx')
    bench.write_context(fn, ctx, fn.files('base', 'v1'))
    st = {'buildah_cache': f'{bench.reg}/bench/buildah-verify-cache-{fn.key}'}
    drivers = [bench.driver] if bench.driver else (
        ['overlay', 'vfs'] if bench.args.storage_driver == 'auto' else [bench.args.storage_driver])
    mode = bench.buildah_cache
    caches = [mode] if bench.driver or mode == 'none' else [mode, 'none']
    errors = []
    for driver in drivers:
        for cache in caches:
            root = os.path.join(bench.work, f'verify-{fn.key}', f'{driver}-{cache}')
            image = f'{bench.reg}/bench/buildah-verify-{fn.key}:{driver}'
            log(f'verifying buildah on {fn.key}: {driver} storage, '
                f'{"without" if cache == "none" else "with"} --cache-from/--cache-to')
            try:
                sample = bench.buildah_build(fn, st, root, image, ctx, 'verify', driver, cache)
            except CommandFailed as e:
                log(f'  failed:\n{e}')
                errors.append(f'{driver}, cache {cache}: {e}')
                set_aside(bench, root)
                continue
            set_aside(bench, root)
            if sample['pm_runs'] == 0:
                fail(f'the buildah build of {fn.key} did not run the install '
                     f'(no {fn.pm_pattern.pattern!r} in its output)')
            log(f'  ok: {sample["seconds"]:.1f} s, pushed {sample["digest"]}')
            if not bench.driver:
                bench.driver, bench.buildah_cache = driver, cache
                if driver != 'overlay' and bench.args.storage_driver == 'auto':
                    bench.notes.append(f'buildah overlay storage failed; using {driver}')
                if cache != mode:
                    bench.notes.append('buildah --cache-from/--cache-to failed; buildah '
                                       'builds use no registry cache (stateless = empty root)')
            return
    fail('no buildah configuration worked:\n' + '\n'.join(errors))


def versions(kiln):
    return {
        'kiln': output([kiln, '--version']),
        'buildah': output(['buildah', '--version']),
        'docker-registry': output(['docker-registry', '--version']),
        'bwrap': output(['bwrap', '--version']),
        'host npm (lock files)': output(['npm', '--version']),
        'python': platform.python_version(),
    }


def machine():
    mem = ''
    with open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('MemTotal:'):
                mem = line.split(':', 1)[1].strip()
    model = ''
    with open('/proc/cpuinfo') as f:
        for line in f:
            if line.startswith('model name'):
                model = line.split(':', 1)[1].strip()
                break
    return {'nproc': os.cpu_count(), 'memory': mem, 'cpu': model, 'kernel': platform.release()}


# --- results ------------------------------------------------------------------------------


def medians(samples):
    keys = ('seconds', 'requests', 'bytes_up', 'bytes_down', 'rss_kib', 'pm_runs')
    out = {k: statistics.median(s[k] for s in samples) for k in keys} if samples else None
    if out:
        out['lockfile_installs'] = statistics.median(s.get('lockfile_installs', 0) for s in samples)
    return out


def summarize(results):
    for res in results.values():
        res['medians'] = {sc: {b: medians(res['samples'][sc][b]) for b in BUILDERS}
                          for sc in SCENARIOS}
        res['targets'] = {}
        for sc, targets in TARGETS.items():
            k, b = res['medians'][sc]['kiln'], res['medians'][sc]['buildah']
            if not k or not b:
                continue
            res['targets'][sc] = [dict(zip(('target', 'pass', 'value'), (what, *test(k, b))))
                                  for what, test in targets]
        cold = res['samples']['cold']['kiln']
        total = [s['seconds'] for s in cold]
        alone = [s['install_alone_s'] for s in cold if s.get('install_alone_s')]
        window = [s['install_log_s'] for s in cold if s.get('install_log_s')]
        if total:
            share = {'kiln_cold_s': statistics.median(total)}
            phases = [p for p in map(cold_phases, cold) if p]
            if phases:
                share['phases_s'] = {k: statistics.median(p[k] for p in phases)
                                     for k in phases[0]}
            if window:
                share['log_window_s'] = statistics.median(window)
            if alone:
                share['install_alone_s'] = statistics.median(alone)
                share['overhead_s'] = share['kiln_cold_s'] - share['install_alone_s']
                share['overhead_share'] = share['overhead_s'] / share['kiln_cold_s']
            res['install_share'] = share


def cold_phases(sample):
    """kiln's cold build cut at its log lines: until the builder image is unpacked, the install
    plus writing the layer, and the rest (blobs, manifest, cache entry)."""
    at = {}
    for t, message in sample.get('log', []):
        at.setdefault(message, t)
    try:
        ready = at['dependencies install inside the builder image']
        begin, end = at['installing dependencies'], at['wrote dependency layer']
    except KeyError:
        return None
    return {'until the builder image is unpacked': ready, 'install + layer write': end - begin,
            'after the layer (push, cache entry)': sample['seconds'] - end}


def mb(n):
    return f'{n / 1e6:.2f} MB' if n >= 1e5 else f'{n / 1e3:.1f} kB'


def print_table(fn, res, runs, notes):
    print(f'\n{fn.key} ({fn.runtime}), build + push, medians of {runs} run(s)')
    head = ('scenario', 'kiln s', 'buildah s', 'b/k', 'req k', 'req b', 'up k', 'up b',
            'RSS k', 'RSS b', 'pm k/b', 'targets')
    rows = [head]
    for sc in SCENARIOS:
        k, b = res['medians'][sc]['kiln'], res['medians'][sc]['buildah']
        if not k or not b:
            continue
        targets = ', '.join(f"{t['target']} {'PASS' if t['pass'] else 'MISS'} ({t['value']})"
                            for t in res['targets'].get(sc, []))
        rows.append((sc, f"{k['seconds']:.3f}", f"{b['seconds']:.3f}",
                     f"{b['seconds'] / k['seconds']:.1f}x", f"{k['requests']:.0f}",
                     f"{b['requests']:.0f}", mb(k['bytes_up']), mb(b['bytes_up']),
                     f"{k['rss_kib'] / 1024:.0f} MiB", f"{b['rss_kib'] / 1024:.0f} MiB",
                     f"{k['pm_runs']:.0f}/{b['pm_runs']:.0f}", targets))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    for row in rows:
        print('  '.join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths))) + '  ' + row[-1])
    share = res.get('install_share')
    if share:
        line = f"kiln cold {share['kiln_cold_s']:.2f} s"
        if 'log_window_s' in share:
            line += (f"; its log from 'installing dependencies' to 'wrote dependency layer' "
                     f"(install + layer write) {share['log_window_s']:.2f} s")
        if 'phases_s' in share:
            line += '; phases: ' + ', '.join(f'{k} {v:.2f} s' for k, v in share['phases_s'].items())
        if 'install_alone_s' in share and share['overhead_s'] < 0:
            # kiln installed from the lock file: no package manager in its build at all.
            tool = 'pip' if res.get('runtime', '').startswith('python') else 'npm'
            line += (f"; {tool}'s install alone (same command, in the builder root, bwrap) "
                     f"{share['install_alone_s']:.2f} s: kiln's whole cold build is "
                     f"{share['kiln_cold_s'] / share['install_alone_s'] * 100:.0f}% of it")
        elif 'install_alone_s' in share:
            line += (f"; the install alone (same command, same builder root, bwrap) "
                     f"{share['install_alone_s']:.2f} s -> kiln's overhead beyond the install "
                     f"{share['overhead_s']:.2f} s = {share['overhead_share'] * 100:.0f}% of the total")
        print(line)
    print('b/k = buildah s / kiln s; req = registry access-log lines; up = client->registry bytes '
          'through the proxy;\nRSS = ru_maxrss of the largest process of the tree; pm = package-'
          'manager runs (kiln: its log; buildah: the install\'s output in the build log)')
    for note in notes:
        print(f'note: {note}')


# --- main ---------------------------------------------------------------------------------


def default_kiln():
    for profile in ('release', 'debug'):
        path = os.path.join(REPO, 'target', profile, 'kiln')
        if os.path.exists(path):
            return path
    return os.path.join(REPO, 'target', 'release', 'kiln')


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--runs', type=int, default=5, help='runs per scenario (default 5)')
    p.add_argument('--json', default=os.path.join(REPO, 'bench', 'vs_buildah.json'),
                   help='where to write every sample (default bench/vs_buildah.json)')
    p.add_argument('--kiln', default=None,
                   help='the kiln binary (default target/release/kiln, else target/debug/kiln)')
    p.add_argument('--only', choices=('node', 'python'), help='benchmark one Function only')
    p.add_argument('--storage-driver', choices=('auto', 'overlay', 'vfs'), default='auto',
                   help="buildah's storage driver (default: overlay, vfs if overlay fails)")
    p.add_argument('--buildah-cache', choices=tuple(CACHE_MODES), default='cold-stateless',
                   help="buildah's registry cache: --cache-from/--cache-to on every build "
                        "(all, the default), --cache-to on the cold build and --cache-from on "
                        "the stateless one (cold-stateless), or none")
    p.add_argument('--lockfile-install', choices=('auto', 'off'), default='auto',
                   help="kiln build --lockfile-install: auto (the default; kiln installs a "
                        "Node.js lock file itself when it decides everything) or off (npm in "
                        "the builder image, as before)")
    p.add_argument('--keep', action='store_true', help='keep the work directory')
    args = p.parse_args()
    args.kiln = os.path.abspath(args.kiln or default_kiln())
    if not os.access(args.kiln, os.X_OK):
        p.error(f'no kiln binary at {args.kiln} (build one, or pass --kiln PATH)')
    if args.runs < 1:
        p.error('--runs must be at least 1')
    return args


def check_tools():
    missing = [t for t in ('buildah', 'docker-registry', 'bwrap', 'npm', 'unshare')
               if not shutil.which(t)]
    if missing:
        fail(f'missing tools: {", ".join(missing)}')
    if os.geteuid() != 0:
        fail('run as root: buildah storage and the mount namespace need it')
    if not os.path.isdir(BIC_DIR):
        os.makedirs(BIC_DIR)  # the mount point of each buildah's own blob-info cache


def main():
    args = parse_args()
    check_tools()
    # A plain `kill` still stops the servers and removes the work directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit('vs_buildah: terminated'))
    work = tempfile.mkdtemp(prefix='kiln-vs-buildah-')
    log(f'work directory {work}, kiln {args.kiln}')
    bench = None
    try:
        bench = Bench(args, work)
        log(f'registry 127.0.0.1:{bench.registry.port}, counting proxy {bench.reg}')
        fns = [f(work) for f in (node_function, python_function)
               if not args.only or f.__name__.startswith(args.only)]
        warm(bench, fns)
        for fn in fns:
            verify_buildah(bench, fn)
        results = {fn.key: {'runtime': fn.runtime,
                            'samples': {sc: {b: [] for b in BUILDERS} for sc in SCENARIOS}}
                   for fn in fns}
        for r in range(1, args.runs + 1):
            order = BUILDERS if r % 2 else tuple(reversed(BUILDERS))
            for fn in fns:
                one_run(bench, fn, r, order, results)
        summarize(results)
        notes = list(bench.notes)
        notes.append(f'buildah: {bench.driver} storage, chroot isolation, --layers, '
                     + CACHE_MODES[bench.buildah_cache])
        for fn in fns:
            print_table(fn, results[fn.key], args.runs, notes)
        doc = {
            'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
            'machine': machine(), 'tools': versions(args.kiln), 'runs': args.runs,
            'buildah': {'storage_driver': bench.driver, 'registry_cache': bench.buildah_cache},
            'notes': notes, 'functions': results,
            'dependencies': {'node': NODE_DEPS, 'node_added': dict([NODE_ADDED]),
                             'python': PY_DEPS, 'python_added': PY_ADDED},
        }
        with open(args.json, 'w') as f:
            json.dump(doc, f, indent=1)
        log(f'wrote {args.json}')
    except CommandFailed as e:
        fail(f'a command failed:\n{e}')
    finally:
        if bench:
            bench.stop()
        if args.keep:
            log(f'kept {work}')
        else:
            subprocess.run(['rm', '-rf', work])


if __name__ == '__main__':
    main()
