"""kiln's Python function server: Kyma's runtime contract, served as Kyma's was — bottle on
cheroot's threaded WSGI server — so a Function's `event['extensions']['request']` and
`bottle.response` are bottle's own.

Needs CPython (3.11+), this file, and bottle and cheroot, which the base image's Kyma runtime
packages provide (/usr/local/lib/python3.X/dist-packages). Nothing else is imported at start.
Runs as user 1000 on a read-only root filesystem and writes nothing. The contract and the
decisions behind it are in runtimes/_servers/README.md.
"""

import bisect
import datetime
import importlib
import itertools
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from urllib.parse import parse_qsl

import bottle  # with cheroot, from the image's Kyma runtime packages


def _num(name, default):
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


PORT = int(_num('FUNC_PORT', 8080))
TIMEOUT = _num('FUNC_TIMEOUT', 180.0)
LIMIT_VAR = 'REQ_MB_LIMIT'  # what the 413 names (the Flask server sets Kyma's new name)
if os.environ.get('REQ_MB_LIMIT'):
    BODY_LIMIT = int(_num('REQ_MB_LIMIT', 1) * 1024 * 1024)
else:  # Kyma's Python runtimes used FUNC_MEMFILE_MAX (bytes)
    BODY_LIMIT = int(_num('FUNC_MEMFILE_MAX', 100 * 1024 * 1024))
# bottle parses `request.json` and `.forms` only up to this, and buffers a larger body in a
# temporary file (Kyma set it from FUNC_MEMFILE_MAX); its default, 100 KiB, failed a Function
# reading a larger JSON body with a 413 of bottle's own.
bottle.BaseRequest.MEMFILE_MAX = BODY_LIMIT
MOD_NAME = os.environ.get('MOD_NAME') or 'handler'
FUNC_HANDLER = os.environ.get('FUNC_HANDLER') or 'main'
FUNCTION_PATH = os.environ.get('FUNCTION_PATH') or '/kubeless'
ACCESS_LOG = bool(os.environ.get('KYMA_INTERNAL_LOGGER_ENABLED'))
PUBLISHER = os.environ.get('PUBLISHER_PROXY_ADDRESS') or \
    'http://eventing-publisher-proxy.kyma-system.svc.cluster.local/publish'
# `context`, a copy per call.
CONTEXT = {
    'function-name': os.environ.get('FUNC_NAME'),
    'namespace': os.environ.get('SERVICE_NAMESPACE'),
    'runtime': os.environ.get('FUNC_RUNTIME'),
    'timeout': TIMEOUT,
    'memory-limit': os.environ.get('FUNC_MEMORY_LIMIT'),
    'body-size-limit': BODY_LIMIT,
}
# Drain on SIGTERM: in-flight calls end by FUNC_TIMEOUT anyway (408); stay under k8s's 30 s.
GRACE = min(TIMEOUT + 1, 25)

JSON_TYPE = 'application/json'
TEXT_TYPE = 'text/plain; charset=utf-8'

# ---- metrics (Prometheus text format 0.0.4) ----
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_lock = threading.Lock()
# 'buckets': calls per bucket (the last: over the largest bound); cumulated when rendered.
_m = {'calls': 0, 'failures': 0, 'buckets': [0] * (len(BUCKETS) + 1), 'sum': 0.0, 'count': 0}


def _observe(seconds, failed):
    i = bisect.bisect_left(BUCKETS, seconds)
    with _lock:
        _m['failures'] += failed
        _m['sum'] += seconds
        _m['count'] += 1
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
                for le, n in zip(BUCKETS, itertools.accumulate(_m['buckets']))]
        out += [f"function_duration_seconds_bucket{{le=\"+Inf\"}} {_m['count']}",
                f"function_duration_seconds_sum {_m['sum']}",
                f"function_duration_seconds_count {_m['count']}"]
    return ('\n'.join(out) + '\n').encode()


# ---- what the Function sees ----
class MultiDict(dict):
    """Form parameters in `event['data']`: `d[k]`/`d.get(k)` give the last value (as bottle's
    FormsDict), `d.getall(k)` every value; JSON-serialisable as a plain dict."""

    def __init__(self, pairs=()):
        super().__init__()
        self._all = {}
        for k, v in pairs:
            self[k] = v
            self._all.setdefault(k, []).append(v)

    def getall(self, key):
        return list(self._all.get(key, []))


# ---- tracing: W3C Trace Context and B3 in, both out; the OpenTelemetry SDK loaded when used ----
# Every request is traced, as Kyma's runtimes trace it. One that carries `traceparent`, `b3` or
# `X-B3-TraceId`/`X-B3-SpanId` continues that trace; any other starts a new one, sampled as its
# `X-B3-Sampled`/`X-B3-Flags` say, else always (Kyma's ParentBased(AlwaysOn)). The request gets
# a span id of its own (a child of the caller's), and every outgoing HTTP request the Function
# makes while handling it (requests, urllib: anything on http.client) carries `traceparent` and
# the B3 headers. The ids are made when something needs them. Once anything has imported the
# OpenTelemetry API (the Function, a library, `event.tracer`; an import hook notices it, even in
# the middle of a call), the API's active span while the Function runs is the request's, so a
# library the Function instruments itself (`RequestsInstrumentor().instrument()`) continues the
# request's trace; the global propagator is W3C Trace Context plus B3 multi, as Kyma's runtime
# sets it. The API is not imported for that (it costs about 8 MiB). `event.tracer` loads
# the SDK on first use; its spans are children of the request's. With TRACE_COLLECTOR_ENDPOINT
# the SDK loads at start and every request becomes a SERVER span exported over OTLP/HTTP.
import contextvars
import http.client

# Read by opentelemetry.propagate when it is first imported (by the SDK or an instrumentation).
os.environ.setdefault('OTEL_PROPAGATORS', 'tracecontext,b3multi')
_api = {}  # the OpenTelemetry API's `trace` and `context` modules, once anything imported them


def _otel_api():
    if not _api:
        tr, cx = sys.modules.get('opentelemetry.trace'), sys.modules.get('opentelemetry.context')
        if tr is None or cx is None or not hasattr(tr, 'NonRecordingSpan'):
            return None
        _api.update(trace=tr, context=cx)
    return _api


def _enter_api_context(t):
    """Makes the request's span the API's active one, if the API is loaded."""
    api = _otel_api()
    if api is None or t.otel_token is not None:
        return
    t.ensure_ids()
    span = api['trace'].NonRecordingSpan(api['trace'].SpanContext(
        int(t.trace_id, 16), int(t.span_id, 16), is_remote=True,
        trace_flags=api['trace'].TraceFlags(1 if t.sampled else 0)))
    t.otel_token = api['context'].attach(api['trace'].set_span_in_context(span))


class _ApiImportHook:
    """Notices the first import of `opentelemetry.trace`: a call running then gets the
    request's span as the active one at once. Removed after that import."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != 'opentelemetry.trace':
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            t = _current_trace.get()
            if t is not None and t.context is None:
                _enter_api_context(t)
        spec.loader.exec_module = exec_module
        return spec


if 'opentelemetry.trace' not in sys.modules:
    sys.meta_path.insert(0, _ApiImportHook())

COLLECTOR = os.environ.get('TRACE_COLLECTOR_ENDPOINT') or ''
_current_trace = contextvars.ContextVar('kiln_trace', default=None)
_otel = {}
_otel_lock = threading.Lock()
_HEX16 = re.compile(r'[0-9a-f]{16}')
_TRACE_ID = re.compile(r'[0-9a-f]{16}|[0-9a-f]{32}')
_TRACEPARENT = re.compile(r'([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})')


class Trace:
    """One request's place in a trace: ids as lower-case hex, made on first use
    (`ensure_ids`); a new trace has no trace id until then."""

    def __init__(self, trace_id, parent_id, sampled):
        self.trace_id, self.parent_id, self.sampled = trace_id, parent_id, sampled
        self.span_id = None
        self.span = self.context = self.otel_token = None

    def ensure_ids(self):
        if self.span_id is None:
            if self.trace_id is None:
                self.trace_id = os.urandom(16).hex()
            self.span_id = os.urandom(8).hex()
        return self


def _root_sampled(env):
    """Whether a new trace is sampled: as the request's B3 sampling headers (in its WSGI
    environ) say, else always."""
    if env.get('HTTP_X_B3_FLAGS') == '1':
        return True
    sampled = env.get('HTTP_X_B3_SAMPLED')
    return sampled is None or sampled in ('1', 'true')


def _ids(trace_id, span_id):
    t, s = (trace_id or '').strip().lower(), (span_id or '').strip().lower()
    if not _TRACE_ID.fullmatch(t) or not _HEX16.fullmatch(s) or not int(t, 16) or not int(s, 16):
        return None
    return t.rjust(32, '0'), s


def incoming_trace(headers):
    """The caller's trace from W3C Trace Context, B3 single or B3 multi headers, or None."""
    tp = _TRACEPARENT.match((headers.get('traceparent') or '').strip())
    if tp and tp.group(1) != 'ff':
        ids = _ids(tp.group(2), tp.group(3))
        if ids:
            return Trace(*ids, int(tp.group(4), 16) & 1 == 1)
    b3 = headers.get('b3')
    if b3:  # traceid-spanid[-sampling[-parentspanid]]
        parts = b3.split('-')
        ids = _ids(parts[0], parts[1] if len(parts) > 1 else '')
        if ids:
            return Trace(*ids, len(parts) < 3 or parts[2] != '0')
    ids = _ids(headers.get('x-b3-traceid'), headers.get('x-b3-spanid'))
    if ids:
        return Trace(*ids, headers.get('x-b3-sampled') != '0' and headers.get('x-b3-flags') != '0')
    return None


def _load_otel():
    with _otel_lock:
        if _otel:
            return _otel
        from opentelemetry import context, trace
        from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        provider = TracerProvider(resource=Resource.create(
            {'service.name': os.environ.get('FUNC_NAME') or 'function'}))
        if COLLECTOR:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=COLLECTOR)))
        trace.set_tracer_provider(provider)
        _otel.update(trace=trace, context=context, suppressed=_SUPPRESS_INSTRUMENTATION_KEY,
                     tracer=provider.get_tracer('io.kyma-project.serverless'))
        return _otel


def _span_context(trace_id, span_id, sampled):
    o = _otel
    return o['trace'].NonRecordingSpan(o['trace'].SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True,
        trace_flags=o['trace'].TraceFlags(1 if sampled else 0)))


def start_trace(req):
    """This request's trace: the caller's continued, or a new one."""
    env = req.environ
    t = None
    if 'HTTP_TRACEPARENT' in env or 'HTTP_B3' in env or 'HTTP_X_B3_TRACEID' in env:
        t = incoming_trace(req.headers)
    if t is None:
        t = Trace(None, None, _root_sampled(env))
        if COLLECTOR and not t.sampled:
            # A new trace the caller asked not to sample: a non-recording root.
            t.ensure_ids()
            t.parent_id = t.span_id
    if COLLECTOR:
        o = _load_otel()
        parent = None
        if t.parent_id:
            parent = o['trace'].set_span_in_context(
                _span_context(t.trace_id, t.parent_id, t.sampled))
        t.span = o['tracer'].start_span(
            f'{req.method} {req.path}', context=parent, kind=o['trace'].SpanKind.SERVER,
            attributes={'http.request.method': req.method, 'url.path': req.path})
        sc = t.span.get_span_context()
        t.trace_id, t.span_id = f'{sc.trace_id:032x}', f'{sc.span_id:016x}'
        t.context = o['trace'].set_span_in_context(t.span, parent)
    return t


def end_trace(t, status):
    if t is not None and t.span is not None:
        t.span.set_attribute('http.response.status_code', status)
        t.span.end()


def _parent_context():
    """Where a Function's span starts: the active span if it made one active, else the
    request's span."""
    o = _load_otel()
    current = o['context'].get_current()
    t = _current_trace.get()
    if o['trace'].get_current_span(current).get_span_context().is_valid or t is None:
        return current
    if t.context is not None:
        return t.context
    t.ensure_ids()
    return o['trace'].set_span_in_context(_span_context(t.trace_id, t.span_id, t.sampled))


class _Tracer:
    """`event.tracer`: an OpenTelemetry tracer whose spans are children of the request's."""

    def start_span(self, name, context=None, *args, **kwargs):
        return _load_otel()['tracer'].start_span(name, context or _parent_context(), *args,
                                                 **kwargs)

    def start_as_current_span(self, name, context=None, *args, **kwargs):
        return _load_otel()['tracer'].start_as_current_span(
            name, context or _parent_context(), *args, **kwargs)

    def __getattr__(self, name):
        return getattr(_load_otel()['tracer'], name)


_TRACER = _Tracer()


def outgoing_trace_headers():
    t = _current_trace.get()
    if t is None:
        return None
    t.ensure_ids()
    span_id, sampled = t.span_id, t.sampled
    if _otel:
        # The SDK's own exports (to the collector) run with instrumentation suppressed.
        if _otel['context'].get_value(_otel['suppressed']):
            return None
        sc = _otel['trace'].get_current_span().get_span_context()
        if sc.is_valid and f'{sc.trace_id:032x}' == t.trace_id:
            span_id, sampled = f'{sc.span_id:016x}', sc.trace_flags.sampled
    headers = {'traceparent': f"00-{t.trace_id}-{span_id}-{'01' if sampled else '00'}",
               'x-b3-traceid': t.trace_id, 'x-b3-spanid': span_id,
               'x-b3-sampled': '1' if sampled else '0'}
    if span_id == t.span_id and t.parent_id:
        headers['x-b3-parentspanid'] = t.parent_id
    return headers


# Outgoing requests made while a traced request is handled carry its trace: requests (urllib3)
# and urllib both send through http.client's putrequest/putheader/endheaders.
_putrequest = http.client.HTTPConnection.putrequest
_putheader = http.client.HTTPConnection.putheader
_endheaders = http.client.HTTPConnection.endheaders


def _traced_putrequest(self, *args, **kwargs):
    self._kiln_sent = set()
    return _putrequest(self, *args, **kwargs)


def _traced_putheader(self, header, *values):
    sent = getattr(self, '_kiln_sent', None)
    if sent is not None:
        sent.add((header.decode('latin-1') if isinstance(header, bytes) else str(header)).lower())
    return _putheader(self, header, *values)


def _traced_endheaders(self, *args, **kwargs):
    extra = outgoing_trace_headers()
    if extra:
        sent = getattr(self, '_kiln_sent', set())
        for name, value in extra.items():
            if name not in sent:
                _putheader(self, name, value)
    return _endheaders(self, *args, **kwargs)


http.client.HTTPConnection.putrequest = _traced_putrequest
http.client.HTTPConnection.putheader = _traced_putheader
http.client.HTTPConnection.endheaders = _traced_endheaders


class Event(dict):
    """Kyma's event: a dict (`event['data']`, `event.get('ce-type')`) with response helpers."""

    @property
    def tracer(self):
        return _TRACER

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
        return emit_cloud_event(type, source, data, optionalCloudEventAttributes)

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


def emit_cloud_event(type, source, data, attributes=None):  # noqa: A002 (Kyma's name)
    """A structured CloudEvent to the publisher proxy, completed and checked as the
    CloudEvents SDK does (ValueError naming the attribute; nothing sent)."""
    ce = {'specversion': '1.0', 'id': _new_id(), 'time': _now(),
          'datacontenttype': 'text/plain' if isinstance(data, str) else JSON_TYPE}
    ce.update(attributes or {})
    ce.update({'type': type, 'source': source})
    _check_cloud_event(ce)
    ce['data'] = data
    return _publish(ce, 'application/cloudevents+json; charset=utf-8')


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


def _json_default(value):
    if isinstance(value, bottle.MultiDict):  # request.query, .forms, .params
        return dict(value.items())
    return str(value)


def to_body(result):
    """A handler's return value → (status or None, headers, content type or None, body bytes).
    A returned (or raised) `bottle.HTTPResponse` gives its status, headers and body."""
    status, headers = None, []
    if isinstance(result, bottle.HTTPResponse):
        status = result.status_code
        headers = [(k, v) for k, v in result.headerlist if k.lower() != 'content-length']
        result = result.body
    if result is None or result == '':
        return status, headers, None, b''
    if isinstance(result, (bytes, bytearray, memoryview)):
        return status, headers, 'application/octet-stream', bytes(result)
    if isinstance(result, str):
        return status, headers, TEXT_TYPE, result.encode()
    return status, headers, JSON_TYPE, json.dumps(result, default=_json_default).encode()


# ---- the user's Function ----
sys.path.append(FUNCTION_PATH)
_function = None  # set in main()


# A call runs on the server thread that read its request. Handing it to another thread (so
# that this one could answer 408 while the Function runs on) cost a sixth of a hello's rate:
# two thread switches per call. FUNC_TIMEOUT is kept by one watchdog thread instead. Calls are
# kept in start order, which is deadline order (every call has the same timeout), so the
# watchdog sleeps until the oldest call's deadline and needs no wake-up when a call starts or
# ends. Whoever takes a call out of `_calls` answers it: the call's own thread when the
# Function returns in time, else the watchdog, which writes the 408 on the call's connection
# and closes it (a call cannot be killed), and gives the server a thread in place of the one
# still running the Function. That thread serves on when the Function returns, and one idle
# thread then leaves, so the pool keeps its size.
_calls = {}  # call id -> (deadline, environ, trace, started), in start order
_calls_lock = threading.Lock()
_call_ids = itertools.count()
_hung = set()  # server threads still running a call that timed out
_server = None  # set in main()
_state = {'stopping': False}
_pool_lock = threading.Lock()
TIMEOUT_BODY = b'Timeout while processing the function\n'


def call_function(run, environ, trace, answers=()):
    """Runs the Function (`run()`) on this thread: ('ok', result), ('error', exc) or
    ('timeout', None) — the last when the watchdog answered for it while it ran. An exception
    of a type in `answers` (a raised HTTP response) is an answer: ('ok', exc)."""
    started = time.monotonic()
    key = next(_call_ids)
    with _calls_lock:
        _calls[key] = (started + TIMEOUT, environ, trace, started)
    trace_token = _current_trace.set(trace)
    otel_token = None
    if trace is not None and trace.context is not None:
        otel_token = _otel['context'].attach(trace.context)
    elif trace is not None:
        # The API's active span is the request's: what a library the Function instruments
        # itself continues (or as soon as the API is imported: _ApiImportHook).
        _enter_api_context(trace)
    try:
        outcome = ('ok', run())
    except answers as res:  # `raise bottle.HTTPError(400, ...)`, `flask.abort(404)`
        outcome = ('ok', res)
    except BaseException as exc:  # noqa: BLE001 - report every failure as a 500
        import traceback
        traceback.print_exc()
        outcome = ('error', exc)
    finally:
        if otel_token is not None:
            _otel['context'].detach(otel_token)
        elif trace is not None and trace.otel_token is not None:
            _api['context'].detach(trace.otel_token)
            trace.otel_token = None
        _current_trace.reset(trace_token)
        with _calls_lock:
            answered = _calls.pop(key, None) is None
    if answered:
        # Until the 408 is out: this thread closes the connection when it returns.
        environ['kiln.answered'].wait()
        _late_return()
        return ('timeout', None)
    return outcome


def _watch():
    while True:
        now = time.monotonic()
        wait, due = TIMEOUT, None
        with _calls_lock:
            for key, call in _calls.items():  # the oldest only
                if call[0] <= now:
                    due = call
                    del _calls[key]
                    # Before the call's own thread can see that it lost: it writes nothing.
                    call[1]['kiln.answered'] = threading.Event()
                else:
                    wait = call[0] - now
                break
        if due is None:
            time.sleep(wait)
        else:
            _time_out(*due[1:])


def _time_out(environ, trace, started):
    """The watchdog's answer for a call past FUNC_TIMEOUT: 408 on its connection, which then
    closes; the call's own thread writes nothing more (see `Gateway` in `_server_classes`)."""
    req = environ['kiln.request']
    sys.stderr.write(f'Function timed out after {TIMEOUT:g}s: {environ["REQUEST_METHOD"]} '
                     f'{_printable(environ.get("PATH_INFO", ""))}\n')
    _observe(time.monotonic() - started, True)
    end_trace(trace, 408)
    head = (f'{req.server.protocol} 408 Request Timeout\r\nContent-Type: {TEXT_TYPE}\r\n'
            f'Access-Control-Allow-Origin: *\r\nContent-Length: {len(TIMEOUT_BODY)}\r\n'
            'Connection: close\r\n\r\n').encode('latin-1')
    req.sent_headers = req.close_connection = True
    _hung.add(environ['kiln.thread'])
    try:
        req.conn.wfile.write(head if environ['REQUEST_METHOD'] == 'HEAD' else head + TIMEOUT_BODY)
        req.conn.socket.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client is gone
    if ACCESS_LOG:
        _access_line(environ, '408')
    environ['kiln.answered'].set()
    with _pool_lock:
        if not _state['stopping']:
            # One more thread in the hung one's place, not waited for: cheroot's `grow` waits
            # until the new thread is `ready`, and one that at once takes a shutdown request a
            # late return left in the queue is ready only for an instant. `grow` then waited
            # for good, holding this lock: no more 408s, and SIGTERM hung on the lock.
            pool = _server.requests
            pool._threads.append(pool._spawn_worker())


def _late_return():
    """A timed-out call's Function returned: its thread serves on, and one idle thread leaves."""
    from cheroot.workers.threadpool import _SHUTDOWNREQUEST
    _hung.discard(threading.current_thread())
    with _pool_lock:
        if not _state['stopping']:
            _server.requests._clear_dead_threads()
            _server.requests._queue.put(_SHUTDOWNREQUEST)


# ---- server: bottle on cheroot's threaded WSGI server, as Kyma's ----
app = bottle.Bottle()


def _plain(status, text, headers=None):
    return bottle.HTTPResponse(text, status=status, headers=dict(
        {'Content-Type': TEXT_TYPE, 'Access-Control-Allow-Origin': '*'}, **(headers or {})))


# bottle's own errors (a malformed request, an over-long chunked body) as plain text.
app.default_error_handler = lambda res: (
    bottle.response.set_header('Content-Type', TEXT_TYPE) or f'{res.status_line}\n')


@app.route('/<:re:.*>', method='ANY')
def handle():
    return route(bottle.request, bottle.response)


_ROUTE = app.routes[0]


def _handle(environ):
    """Bottle's own `_handle` for kiln's one route, without what kiln does not use: the
    router (one catch-all route), the plugins (`route` never returns a dict) and the hooks
    (none). They cost a hello request a sixth of its time. The request a Function sees is
    bound as bottle binds it, with the same environ keys."""
    path = environ['bottle.raw_path'] = environ['PATH_INFO']
    environ['PATH_INFO'] = path.encode('latin1').decode('utf8', 'ignore')
    environ['bottle.app'] = app
    environ['route.handle'] = environ['bottle.route'] = _ROUTE
    environ['route.url_args'] = {}
    bottle.request.bind(environ)
    bottle.response.bind()
    try:
        out = route(bottle.request, bottle.response)
    except bottle.HTTPResponse as exc:
        out = exc
    except (KeyboardInterrupt, SystemExit, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - as bottle: a 500, the traceback to wsgi.errors
        import traceback
        stacktrace = traceback.format_exc()
        environ['wsgi.errors'].write(stacktrace)
        environ['wsgi.errors'].flush()
        environ['bottle.exc_info'] = sys.exc_info()
        out = bottle.HTTPError(500, 'Internal Server Error', exc, stacktrace)
    if isinstance(out, bottle.HTTPResponse):
        out.apply(bottle.response)
    return out


app._handle = _handle


def route(req, resp):
    env = req.environ
    # bottle's req.method and req.path, from the environ without its properties.
    method = env['REQUEST_METHOD'].upper()
    if method in ('GET', 'HEAD'):
        path = '/' + env['PATH_INFO'].lstrip('/')
        if path in ('/healthz', '/metrics', '/favicon.ico'):
            resp.set_header('Access-Control-Allow-Origin', '*')
        if path == '/healthz':
            resp.content_type = TEXT_TYPE
            return b'OK'
        if path == '/metrics':
            resp.content_type = 'text/plain; version=0.0.4; charset=utf-8'
            return render_metrics()
        if path == '/favicon.ico':
            return _plain(204, '')
    if method == 'OPTIONS':  # CORS preflight: allow whatever is asked for
        resp.set_header('Access-Control-Allow-Origin', '*')
        return _plain(204, '', {
            'Access-Control-Allow-Methods': req.get_header('Access-Control-Request-Method')
            or 'GET, POST, PUT, PATCH, DELETE, OPTIONS',
            'Access-Control-Allow-Headers': req.get_header('Access-Control-Request-Headers')
            or '*',
            'Access-Control-Max-Age': '86400'})
    # No body, or one within the limit (BodyLimit refused the rest, and sized a chunked one).
    raw = req.body.read() if env.get('CONTENT_LENGTH') else b''
    ctype = env.get('CONTENT_TYPE') or ''
    mime = ctype.split(';')[0].strip().lower()
    charset = 'utf-8'
    for param in ctype.split(';')[1:]:
        name, _, value = param.partition('=')
        if name.strip().lower() == 'charset' and value.strip():
            charset = value.strip().strip('"')
    try:
        data = parse_body(mime, charset, raw)
    except ValueError as exc:
        return _plain(400, f'Bad Request: cannot parse the {mime} body: {exc}\n')
    event = Event(data, bottle.request, bottle.response)
    if mime == 'application/cloudevents+json' or ('HTTP_CE_TYPE' in env
                                                   and 'HTTP_CE_SOURCE' in env):
        fill_cloud_event(event, req.headers, mime)
    with _lock:
        _m['calls'] += 1
    trace = start_trace(req)
    answer = _call(event, dict(CONTEXT), req, trace)
    if trace is not None and answer is not None:
        end_trace(trace, getattr(answer, 'status_code', resp.status_code))
    return answer


def _call(event, context, req, trace):
    """The Function's answer: the body, with the status and headers on `bottle.response`,
    or an HTTPResponse; None when the watchdog gave the 408."""
    started = time.monotonic()
    outcome, value = call_function(lambda: _function(event, context), req.environ, trace,
                                   (bottle.HTTPResponse,))
    if outcome == 'timeout':
        return None
    if outcome == 'ok':
        try:
            status, headers, content_type, body = to_body(value)
        except (TypeError, ValueError) as exc:
            sys.stderr.write(f'Cannot serialise the function result: {exc!r}\n')
            outcome = 'error'
    _observe(time.monotonic() - started, outcome != 'ok')
    if outcome == 'error':
        return _plain(500, 'Internal server error')
    out = bottle.response  # with what the Function set on it
    if status and out.status_code == 200:
        out.status = status
    for name, value in headers:
        out.add_header(name, value)
    typed = 'Content-Type' in out
    if content_type and not typed:
        out.content_type = content_type
        typed = True
    if 'Access-Control-Allow-Origin' not in out:  # the Function's own, if it set one
        out.set_header('Access-Control-Allow-Origin', '*')
    if out.status_code in (204, 304):
        body = b''
    if typed:
        return body
    # Nothing to describe (no body, no type set): without bottle's default type.
    answer = out.copy(cls=bottle.HTTPResponse)
    answer.body = body
    answer.default_content_type = None
    return answer


# An upload over the limit is read and discarded (never kept) before the 413 goes out, so a
# client that writes its whole body before it reads the answer (http.client, requests) reads
# the 413 rather than a reset; for at most 2 s and 64 MiB, then the connection is cut.
DRAIN_SECONDS = 2
DRAIN_BYTES = 64 << 20


def _drain(stream, left=None):
    """Reads and discards `stream` to its end (or `left` bytes) within the drain bounds."""
    deadline = time.monotonic() + DRAIN_SECONDS
    drained = 0
    try:
        while drained < DRAIN_BYTES and time.monotonic() < deadline:
            want = 65536 if left is None else min(65536, left - drained)
            if want <= 0:
                break
            chunk = stream.read(want)
            if not chunk:
                break
            drained += len(chunk)
    except (OSError, ValueError):
        pass


def _too_large(start_response, stream, left=None, head=False):
    """413, after the client's upload is drained (bounded) so it reads the 413 rather than a
    reset; the connection closes after it."""
    _drain(stream, left)
    msg = f'Request body larger than the limit ({BODY_LIMIT} bytes, {LIMIT_VAR})\n'.encode()
    start_response('413 Payload Too Large', [
        ('Content-Type', TEXT_TYPE), ('Access-Control-Allow-Origin', '*'),
        ('Content-Length', str(len(msg))), ('Connection', 'close')])
    return [] if head else [msg]


class BodyLimit:
    """WSGI middleware: a body over BODY_LIMIT gets its 413 before the app reads any of it.
    A chunked upload is read here (cheroot decodes it but passes the Transfer-Encoding header
    on, which would make the framework decode it a second time) and handed on as a plain,
    sized body."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        stream = environ['wsgi.input']
        if 'chunked' in environ.get('HTTP_TRANSFER_ENCODING', '').lower():
            import io
            chunks, size = [], 0
            while True:
                try:
                    chunk = stream.read(65536)
                except ValueError:  # a malformed chunk size
                    # Closed for good: what follows on the connection is no request.
                    if 'kiln.request' in environ:
                        environ['kiln.request'].close_connection = True
                    answer = b'Bad Request: malformed chunked body\n'
                    start_response('400 Bad Request', [('Content-Type', TEXT_TYPE),
                                                       ('Content-Length', str(len(answer))),
                                                       ('Connection', 'close')])
                    return [answer]
                if not chunk:
                    break
                size += len(chunk)
                if size > BODY_LIMIT:
                    chunks.clear()
                    return _too_large(start_response, stream, None,
                                      environ.get('REQUEST_METHOD') == 'HEAD')
                chunks.append(chunk)
            body = b''.join(chunks)
            del environ['HTTP_TRANSFER_ENCODING']
            environ['CONTENT_LENGTH'] = str(len(body))
            environ['wsgi.input'] = io.BytesIO(body)
        else:
            try:
                length = int(environ.get('CONTENT_LENGTH') or 0)
            except ValueError:
                length = 0
            if length > BODY_LIMIT:
                return _too_large(start_response, stream, length,
                                  environ.get('REQUEST_METHOD') == 'HEAD')
        return self.app(environ, start_response)


def _printable(text):
    """`text` with control characters escaped: a request's path (decoded from `%0a`) must not
    write a second log line."""
    return ''.join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _access_line(environ, status):
    sys.stdout.write('%s - "%s %s %s" %s\n' % (
        environ.get('REMOTE_ADDR', '-'), _printable(environ.get('REQUEST_METHOD')),
        _printable(environ.get('PATH_INFO')), _printable(environ.get('SERVER_PROTOCOL')),
        status))


class AccessLog:
    """WSGI middleware: one line per request on stdout (KYMA_INTERNAL_LOGGER_ENABLED)."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        def logged(status, headers, exc_info=None):
            if not environ.get('kiln.answered'):  # else the watchdog logged its 408
                _access_line(environ, status.split()[0])
            return start_response(status, headers, exc_info)
        return self.app(environ, logged)


def _server_classes():
    """cheroot's WSGI server, with three changes (cheroot is imported only here)."""
    import select

    from cheroot import wsgi
    from cheroot.workers.threadpool import _SHUTDOWNREQUEST

    class Gateway(wsgi.Gateway_10):
        """Gives the watchdog the request's connection, and writes nothing for a request it
        answered."""

        def get_environ(self):
            env = super().get_environ()
            env['kiln.request'] = self.req
            env['kiln.thread'] = threading.current_thread()
            return env

        def start_response(self, status, headers, exc_info=None):
            if self.env.get('kiln.answered'):
                self.started_response = True
                return self.write
            return super().start_response(status, headers, exc_info)

        def write(self, chunk):
            if not self.env.get('kiln.answered'):
                super().write(chunk)

    class Server(wsgi.Server):
        def put_conn(self, conn):
            """A keep-alive connection whose next request comes within 2 ms is served on by
            the same thread, unless connections wait for a thread: cheroot's way (the
            connection to its selector thread, then back to a worker) costs two thread
            switches per request."""
            while self.ready and not self.requests.qsize:
                if not conn.rfile.has_data():
                    poll = select.poll()
                    poll.register(conn.socket.fileno(), select.POLLIN)
                    if not poll.poll(2):
                        break
                try:
                    keep = conn.communicate()
                except Exception:  # noqa: BLE001 - as cheroot's worker: drop the connection
                    keep = False
                if not keep:
                    conn.close()
                    return
            super().put_conn(conn)

    def stop_pool(timeout):
        """cheroot's ThreadPool.stop joins a thread for ever once the timeout is spent, and
        a thread whose call timed out may run its Function for ever: wait for the others, up
        to the timeout."""
        pool = _server.requests
        with _pool_lock:
            _state['stopping'] = True
            threads = [t for t in pool._threads if t.is_alive()]
        for _ in threads:
            pool._queue.put(_SHUTDOWNREQUEST)
        deadline = time.monotonic() + timeout
        for t in threads:
            if t not in _hung:
                t.join(max(0, deadline - time.monotonic()))

    return Gateway, Server, stop_pool


def load_function():
    """The Function's FUNC_HANDLER from module MOD_NAME (on FUNCTION_PATH); exits if it cannot
    be loaded."""
    try:
        module = importlib.import_module(MOD_NAME)
        return getattr(module, FUNC_HANDLER)
    except Exception:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        sys.stderr.write(f'Cannot load {MOD_NAME}.{FUNC_HANDLER} from {FUNCTION_PATH}\n')
        sys.exit(1)


def main():
    global _function
    _function = load_function()
    serve(app, 'python')


def serve(wsgi_app, name, api=''):
    """Serves `wsgi_app` (behind the body limit and the access log) on cheroot until SIGTERM
    or SIGINT, then drains and exits."""
    global _server
    gateway, server_class, stop_pool = _server_classes()
    wsgi_app = BodyLimit(wsgi_app)
    if ACCESS_LOG:
        wsgi_app = AccessLog(wsgi_app)
    # Kyma's CHERRYPY_NUMTHREADS: requests served in parallel (default 50, as Kyma's).
    threads = max(1, int(_num('CHERRYPY_NUMTHREADS', 50)))
    server = _server = server_class(('0.0.0.0', PORT), wsgi_app, numthreads=threads,
                                    server_name=f'kiln-{name}', request_queue_size=128,
                                    timeout=60)
    # As Node.js answers 431 past 16 KiB: no header of 300 MB held in memory (cheroot's
    # default is no limit).
    server.max_request_header_size = 64 * 1024
    server.gateway = gateway
    server.shutdown_timeout = GRACE
    server.requests.stop = stop_pool
    server.prepare()
    threading.Thread(target=_watch, name='timeouts', daemon=True).start()
    stop = threading.Event()
    signals = []

    def on_signal(signum, _frame):
        signals.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=server.serve, daemon=True).start()
    print(f'kiln {name} function server listening on 0.0.0.0:{server.bind_addr[1]}, '
          f'function {MOD_NAME}.{FUNC_HANDLER} from {FUNCTION_PATH} {api}'
          f'(timeout {TIMEOUT:g}s, body limit {BODY_LIMIT} bytes, {threads} threads)',
          flush=True)
    # Poll, don't block: a signal the kernel delivers to another thread only sets a flag, and
    # Python runs the handler when the main thread next executes bytecode.
    while not stop.wait(0.2):
        pass

    def busy():
        return [t for t in server.requests._threads
                if t.is_alive() and t.conn is not None and t not in _hung]

    print(f'{signals[0]} received: no new connections, draining {len(busy())} '
          'connection(s)', flush=True)
    server.stop()  # closes the listener and idle connections, waits up to GRACE for the rest
    if busy():
        sys.stderr.write(f'Drain took over {GRACE:g}s, exiting with {len(busy())} '
                         'request(s) in flight\n')
    print('Server stopped', flush=True)
    sys.stderr.flush()
    os._exit(0)  # daemon function threads may still run: do not wait for them


if __name__ == '__main__':
    main()
