"""kiln's Python function server: Kyma's runtime contract on the standard library only.

No bottle, cheroot or prometheus_client: the image needs nothing but CPython (3.11+) and this
file. Runs as user 1000 on a read-only root filesystem and writes nothing. The contract and
the decisions behind it are in runtimes/_servers/README.md.
"""

import datetime
import importlib
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl


def _num(name, default):
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


PORT = int(_num('FUNC_PORT', 8080))
TIMEOUT = _num('FUNC_TIMEOUT', 180.0)
if os.environ.get('REQ_MB_LIMIT'):
    BODY_LIMIT = int(_num('REQ_MB_LIMIT', 1) * 1024 * 1024)
else:  # Kyma's Python runtimes used FUNC_MEMFILE_MAX (bytes)
    BODY_LIMIT = int(_num('FUNC_MEMFILE_MAX', 100 * 1024 * 1024))
MOD_NAME = os.environ.get('MOD_NAME') or 'handler'
FUNC_HANDLER = os.environ.get('FUNC_HANDLER') or 'main'
FUNCTION_PATH = os.environ.get('FUNCTION_PATH') or '/kubeless'
ACCESS_LOG = bool(os.environ.get('KYMA_INTERNAL_LOGGER_ENABLED'))
PUBLISHER = os.environ.get('PUBLISHER_PROXY_ADDRESS') or \
    'http://eventing-publisher-proxy.kyma-system.svc.cluster.local/publish'
# Drain on SIGTERM: in-flight calls end by FUNC_TIMEOUT anyway (408); stay under k8s's 30 s.
GRACE = min(TIMEOUT + 1, 25)

JSON_TYPE = 'application/json'
TEXT_TYPE = 'text/plain; charset=utf-8'

# ---- metrics (Prometheus text format 0.0.4) ----
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_lock = threading.Lock()
_m = {'calls': 0, 'failures': 0, 'buckets': [0] * len(BUCKETS), 'sum': 0.0, 'count': 0}


def _observe(seconds, failed):
    with _lock:
        _m['failures'] += failed
        _m['sum'] += seconds
        _m['count'] += 1
        for i, le in enumerate(BUCKETS):
            if seconds <= le:
                _m['buckets'][i] += 1


def render_metrics():
    with _lock:
        out = [
            '# HELP function_calls_total Number of calls to the user function.',
            '# TYPE function_calls_total counter', f"function_calls_total {_m['calls']}",
            '# HELP function_failures_total Number of failed calls (exception or timeout).',
            '# TYPE function_failures_total counter', f"function_failures_total {_m['failures']}",
            '# HELP function_duration_seconds Duration of user function calls in seconds.',
            '# TYPE function_duration_seconds histogram',
        ]
        out += [f'function_duration_seconds_bucket{{le="{le}"}} {n}'
                for le, n in zip(BUCKETS, _m['buckets'])]
        out += [f"function_duration_seconds_bucket{{le=\"+Inf\"}} {_m['count']}",
                f"function_duration_seconds_sum {_m['sum']}",
                f"function_duration_seconds_count {_m['count']}"]
    return ('\n'.join(out) + '\n').encode()


# ---- what the Function sees ----
class MultiDict(dict):
    """Query or form parameters: `d[k]`/`d.get(k)` give the last value (as bottle's FormsDict),
    `d.getall(k)` every value; JSON-serialisable as a plain dict."""

    def __init__(self, pairs=()):
        super().__init__()
        self._all = {}
        for k, v in pairs:
            self[k] = v
            self._all.setdefault(k, []).append(v)

    def getall(self, key):
        return list(self._all.get(key, []))


class Request:
    """`event['extensions']['request']`: the parts of the HTTP request, already read."""

    def __init__(self, method, path, query_string, headers, body, remote_addr):
        self.method, self.path, self.query_string = method, path, query_string
        self.url = path + ('?' + query_string if query_string else '')
        self.query = MultiDict(parse_qsl(query_string, keep_blank_values=True))
        self.headers = headers  # http.client.HTTPMessage: case-insensitive get()/[]/in
        self.body = body  # bytes
        self.remote_addr = remote_addr

    def get_header(self, name, default=None):
        return self.headers.get(name, default)

    @property
    def json(self):
        return json.loads(self.body) if self.body else None


class Response:
    """`event['extensions']['response']`: status and headers the server will send."""

    def __init__(self):
        self.status, self.headers = None, {}

    def set_header(self, name, value):
        self.headers = {k: v for k, v in self.headers.items() if k.lower() != name.lower()}
        self.headers[name] = str(value)


class _NoopTracer:
    """Kyma passed an OpenTelemetry tracer; without OTel this keeps `event.tracer` calls working:
    every method returns the tracer itself, which also serves as span and context manager."""

    def __getattr__(self, _name):
        return lambda *args, **kwargs: self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Event(dict):
    """Kyma's event: a dict (`event['data']`, `event.get('ce-type')`) with response helpers."""

    tracer = _NoopTracer()

    def __init__(self, data, request, response):
        super().__init__()
        self['data'] = data
        self['extensions'] = {'request': request, 'response': response}
        self._response = response

    @property
    def ceHeaders(self):  # noqa: N802 (Kyma's name)
        return self

    def setResponseHeader(self, name, value):  # noqa: N802 (Kyma's names)
        self._response.set_header(name, value)

    def setResponseContentType(self, content_type):  # noqa: N802
        self._response.set_header('Content-Type', content_type)

    def setResponseStatus(self, status):  # noqa: N802
        self._response.status = int(status)

    def emitCloudEvent(self, type, source, data, optionalCloudEventAttributes=None):  # noqa: N802
        """A structured CloudEvent to the publisher proxy, completed and checked as the
        CloudEvents SDK does (ValueError naming the attribute; nothing sent)."""
        ce = {'specversion': '1.0', 'id': _new_id(), 'time': _now(),
              'datacontenttype': 'text/plain' if isinstance(data, str) else JSON_TYPE}
        ce.update(optionalCloudEventAttributes or {})
        ce.update({'type': type, 'source': source})
        _check_cloud_event(ce)
        ce['data'] = data
        return _publish(ce, 'application/cloudevents+json; charset=utf-8')

    def publishCloudEvent(self, data):  # noqa: N802 (deprecated in Kyma, still used)
        print('publishCloudEvent is deprecated: use emitCloudEvent', file=sys.stderr, flush=True)
        return _publish(data, 'application/cloudevents+json')

    def buildResponseCloudEvent(self, event_id, event_type, event_data):  # noqa: N802
        print('buildResponseCloudEvent is deprecated: use emitCloudEvent', file=sys.stderr,
              flush=True)
        content_type = None
        if isinstance(event_data, dict):
            content_type = JSON_TYPE
        elif isinstance(event_data, str):
            content_type = 'text/plain'
        return {'type': event_type, 'source': self.get('ce-source'),
                'eventtypeversion': self.get('ce-eventtypeversion'),
                'specversion': self.get('ce-specversion'), 'id': event_id, 'data': event_data,
                'datacontenttype': content_type}


CE_NAME = re.compile(r'[a-z0-9]{1,20}')


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _new_id():
    import uuid  # on first use: it costs milliseconds at start-up
    return str(uuid.uuid4())


def _check_cloud_event(ce):
    for name in ('id', 'type', 'source', 'specversion'):
        if not isinstance(ce.get(name), str) or not ce[name]:
            raise ValueError(f'invalid CloudEvent: attribute "{name}" must be a non-empty string')
    if ce['specversion'] != '1.0':
        raise ValueError(f'invalid CloudEvent: specversion {ce["specversion"]!r} is not 1.0')
    try:
        datetime.datetime.fromisoformat(str(ce.get('time')).replace('Z', '+00:00'))
    except ValueError:
        raise ValueError(f'invalid CloudEvent attribute "time": {ce.get("time")!r} is not a '
                         'RFC 3339 timestamp') from None
    for name in ce:
        if name not in ('data', 'data_base64') and not CE_NAME.fullmatch(name):
            raise ValueError(f'invalid CloudEvent attribute name "{name}": use 1-20 lower-case '
                             'letters or digits')


class PublishResponse:
    """The publisher proxy's answer, shaped like the `requests.Response` Kyma returned."""

    def __init__(self, status, headers, body):
        self.status_code = status
        self.ok = status < 400
        self.headers = headers
        self.content = body
        self.text = body.decode('utf-8', 'replace')

    def json(self):
        return json.loads(self.text)


def _publish(event, content_type):
    import urllib.error
    import urllib.request
    body = json.dumps(event, default=str).encode()
    req = urllib.request.Request(PUBLISHER, data=body, method='POST',
                                 headers={'Content-Type': content_type})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return PublishResponse(resp.status, dict(resp.headers), resp.read())
    except urllib.error.HTTPError as err:
        return PublishResponse(err.code, dict(err.headers), err.read())


def parse_body(mime, charset, raw):
    """The body as Kyma users expect it: JSON → object, text/* → str, form → MultiDict,
    anything else → bytes. No body (e.g. a plain GET) → None."""
    if not raw:
        return None
    if mime in ('application/json', 'application/cloudevents+json'):
        return json.loads(raw)
    if mime.startswith('text/'):
        try:
            return raw.decode(charset, 'replace')
        except LookupError:
            return raw.decode('utf-8', 'replace')
    if mime == 'application/x-www-form-urlencoded':
        return MultiDict(parse_qsl(raw.decode('utf-8', 'replace'), keep_blank_values=True))
    return raw


def fill_cloud_event(event, headers, mime):
    """A request is a CloudEvent only with the CloudEvents content type or both `ce-type` and
    `ce-source` (as Kyma's server decided); only then are `ce-*` keys set. Binary mode: every
    `ce-*` header (case-insensitive) and Content-Type as datacontenttype. Structured mode: the
    JSON envelope's attributes; its `data`/`data_base64` becomes data. A missing id is a new
    UUID and a missing time now, as the CloudEvents SDK does."""
    structured = mime == 'application/cloudevents+json'
    if not structured and not (headers.get('ce-type') and headers.get('ce-source')):
        return
    envelope = event['data']
    if structured and isinstance(envelope, dict):
        for name, value in envelope.items():
            if name not in ('data', 'data_base64'):
                event[f'ce-{name}'] = value
        if 'data_base64' in envelope and 'data' not in envelope:
            import base64
            event['data'] = base64.b64decode(envelope['data_base64'])
        else:
            event['data'] = envelope.get('data')
    else:
        for name, value in headers.items():
            if name.lower().startswith('ce-'):
                event[name.lower()] = value
        if not event.get('ce-datacontenttype') and headers.get('Content-Type'):
            event['ce-datacontenttype'] = headers.get('Content-Type')
    if not event.get('ce-id'):
        event['ce-id'] = _new_id()
    if not event.get('ce-time'):
        event['ce-time'] = _now()


def to_body(result, response):
    """A handler's return value → (content type or None, body bytes); may set the status."""
    if hasattr(result, 'status_code') and hasattr(result, 'body'):  # bottle.HTTPResponse-like
        for name, value in dict(getattr(result, 'headers', None) or {}).items():
            response.set_header(name, value)
        response.status = response.status or int(result.status_code)
        result = result.body
    if result is None:
        return None, b''
    if isinstance(result, (bytes, bytearray, memoryview)):
        return 'application/octet-stream', bytes(result)
    if isinstance(result, str):
        return TEXT_TYPE, result.encode()
    return JSON_TYPE, json.dumps(result, default=str).encode()


# ---- the user's Function ----
sys.path.append(FUNCTION_PATH)
_function = None  # set in main()


def call_function(event, context):
    """Runs the Function in a worker thread; ('ok', result), ('error', exc) or ('timeout', None).
    A timed-out worker cannot be killed: it keeps running, its result is dropped."""
    box, done = [], threading.Event()

    def run():
        try:
            box.append(('ok', _function(event, context)))
        except BaseException as exc:  # noqa: BLE001 - report every failure as a 500
            import traceback
            traceback.print_exc()
            box.append(('error', exc))
        finally:
            done.set()

    threading.Thread(target=run, name='function', daemon=True).start()
    return box[0] if done.wait(TIMEOUT) else ('timeout', None)


# ---- server ----
_state = {'inflight': 0, 'stopping': False}
_idle = threading.Condition()


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'  # keep-alive; every response carries Content-Length
    timeout = 60  # seconds a socket may sit idle (between or inside requests)

    def version_string(self):
        return 'kiln-python'

    def log_message(self, fmt, *args):
        if ACCESS_LOG:
            sys.stdout.write('%s - %s\n' % (self.address_string(), fmt % args))

    def send(self, status, body=b'', content_type=None, headers=None):
        self.send_response(status)
        self.send_header('Access-Control-Allow-Origin', '*')
        headers = dict(headers or {})
        if content_type and not any(k.lower() == 'content-type' for k in headers):
            self.send_header('Content-Type', content_type)
        for name, value in headers.items():
            self.send_header(name, value)
        if status not in (204, 304):
            self.send_header('Content-Length', str(len(body)))
        if _state['stopping'] or self.close_connection:
            self.send_header('Connection', 'close')  # also sets self.close_connection
        self.end_headers()
        if self.command != 'HEAD' and body:
            self.wfile.write(body)

    def too_large(self):
        self.close_connection = True
        msg = f'Request body larger than the limit ({BODY_LIMIT} bytes, REQ_MB_LIMIT)\n'
        self.send(413, msg.encode(), TEXT_TYPE)
        # Discard (never buffer) what the client still sends for a moment, so it reads the 413
        # rather than a connection reset; then the connection closes.
        try:
            self.wfile.flush()
            self.connection.settimeout(1)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and self.connection.recv(65536):
                pass
        except OSError:
            pass

    def handle_expect_100(self):  # `Expect: 100-continue`: refuse big bodies before they are sent
        if int(self.headers.get('Content-Length') or 0) > BODY_LIMIT:
            self.too_large()
            return False
        return super().handle_expect_100()

    def read_body(self):
        """The request body, or None after answering 413. Chunked uploads are decoded here."""
        if 'chunked' in (self.headers.get('Transfer-Encoding') or '').lower():
            chunks, size = [], 0
            while True:
                n = int(self.rfile.readline(1024).split(b';')[0].strip() or b'0', 16)
                if n == 0:
                    while self.rfile.readline(8192).strip():  # trailers
                        pass
                    return b''.join(chunks)
                size += n
                if size > BODY_LIMIT:
                    self.too_large()
                    return None
                chunks.append(self.rfile.read(n))
                self.rfile.readline(8)
        length = int(self.headers.get('Content-Length') or 0)
        if length > BODY_LIMIT:
            self.too_large()
            return None
        return self.rfile.read(length) if length > 0 else b''

    def dispatch(self):
        with _idle:
            _state['inflight'] += 1
        try:
            self.route()
        finally:
            with _idle:
                _state['inflight'] -= 1
                _idle.notify_all()

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = dispatch

    def route(self):
        path, _, query = self.path.partition('?')
        if self.command in ('GET', 'HEAD'):
            if path == '/healthz':
                return self.send(200, b'OK', TEXT_TYPE)
            if path == '/metrics':
                return self.send(200, render_metrics(), 'text/plain; version=0.0.4; charset=utf-8')
            if path == '/favicon.ico':
                return self.send(204)
        if self.command == 'OPTIONS':  # CORS preflight: allow whatever is asked for
            return self.send(204, headers={
                'Access-Control-Allow-Methods': self.headers.get('Access-Control-Request-Method')
                or 'GET, POST, PUT, PATCH, DELETE, OPTIONS',
                'Access-Control-Allow-Headers': self.headers.get('Access-Control-Request-Headers')
                or '*',
                'Access-Control-Max-Age': '86400'})
        try:
            raw = self.read_body()
        except ValueError:  # a malformed chunk size
            self.close_connection = True
            return self.send(400, b'Bad Request: malformed chunked body\n', TEXT_TYPE)
        if raw is None:
            return None
        ctype = self.headers.get('Content-Type') or ''
        mime = ctype.split(';')[0].strip().lower()
        charset = self.headers.get_content_charset() or 'utf-8'
        try:
            data = parse_body(mime, charset, raw)
        except ValueError as exc:
            return self.send(400, f'Bad Request: cannot parse the {mime} body: {exc}\n'.encode(),
                             TEXT_TYPE)
        response = Response()
        request = Request(self.command, path, query, self.headers, raw, self.client_address[0])
        event = Event(data, request, response)
        fill_cloud_event(event, self.headers, mime)
        context = {
            'function-name': os.environ.get('FUNC_NAME'),
            'namespace': os.environ.get('SERVICE_NAMESPACE'),
            'runtime': os.environ.get('FUNC_RUNTIME'),
            'timeout': TIMEOUT,
            'memory-limit': os.environ.get('FUNC_MEMORY_LIMIT'),
            'body-size-limit': BODY_LIMIT,
        }
        with _lock:
            _m['calls'] += 1
        started = time.monotonic()
        outcome, value = call_function(event, context)
        if outcome == 'ok':
            try:
                content_type, body = to_body(value, response)
            except (TypeError, ValueError) as exc:
                sys.stderr.write(f'Cannot serialise the function result: {exc!r}\n')
                outcome = 'error'
        _observe(time.monotonic() - started, outcome != 'ok')
        if outcome == 'timeout':
            sys.stderr.write(f'Function timed out after {TIMEOUT:g}s: {self.command} {self.path}\n')
            return self.send(408, b'Timeout while processing the function\n', TEXT_TYPE)
        if outcome == 'error':
            return self.send(500, b'Internal server error', TEXT_TYPE)
        return self.send(response.status or 200, body, content_type, response.headers)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not block exit
    request_queue_size = 128


def main():
    global _function
    try:
        module = importlib.import_module(MOD_NAME)
        _function = getattr(module, FUNC_HANDLER)
    except Exception:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        sys.stderr.write(f'Cannot load {MOD_NAME}.{FUNC_HANDLER} from {FUNCTION_PATH}\n')
        sys.exit(1)

    server = Server(('0.0.0.0', PORT), Handler)
    stop = threading.Event()
    signals = []

    def on_signal(signum, _frame):
        signals.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=server.serve_forever, kwargs={'poll_interval': 0.1},
                     daemon=True).start()
    print(f'kiln python function server listening on 0.0.0.0:{server.server_address[1]}, '
          f'function {MOD_NAME}.{FUNC_HANDLER} from {FUNCTION_PATH} '
          f'(timeout {TIMEOUT:g}s, body limit {BODY_LIMIT} bytes)', flush=True)
    # Poll, don't block: a signal the kernel delivers to another thread only sets a flag, and
    # Python runs the handler when the main thread next executes bytecode.
    while not stop.wait(0.2):
        pass

    _state['stopping'] = True
    print(f"{signals[0]} received: no new connections, draining {_state['inflight']} "
          'request(s)', flush=True)
    server.shutdown()  # stop the accept loop
    server.server_close()  # close the listening socket
    deadline = time.monotonic() + GRACE
    with _idle:
        while _state['inflight'] and time.monotonic() < deadline:
            _idle.wait(deadline - time.monotonic())
    if _state['inflight']:
        sys.stderr.write(f"Drain took over {GRACE:g}s, exiting with {_state['inflight']} "
                         'request(s) in flight\n')
    print('Server stopped', flush=True)
    sys.stderr.flush()
    sys.exit(0)


if __name__ == '__main__':
    main()
