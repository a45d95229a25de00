'use strict';
// kiln's Node.js function server: Kyma's runtime contract on Node's standard library; the
// OpenTelemetry packages of the image's Kyma runtime packages load only when tracing is used.
// Runs on Node 20, 22 and 24 as user 1000 on a read-only root filesystem; it writes nothing.
// Contract and decisions: runtimes/_servers/README.md.

const http = require('http');
const path = require('path');

const env = process.env;
const num = (name, dflt) => {
  const v = Number(env[name]);
  return env[name] !== undefined && env[name] !== '' && Number.isFinite(v) ? v : dflt;
};
const PORT = num('FUNC_PORT', 8080);
const TIMEOUT_S = num('FUNC_TIMEOUT', 180);
// Loaded as the new API's core (express/), Kyma's nodejs26 name FUNC_BODY_MB_LIMIT wins.
const LIMIT_VAR = require.main !== module && env.FUNC_BODY_MB_LIMIT ? 'FUNC_BODY_MB_LIMIT'
  : 'REQ_MB_LIMIT';
const MB_LIMIT = num(LIMIT_VAR, 1);
const BODY_LIMIT = Math.floor(MB_LIMIT * 1024 * 1024);
// Relative to this file (Kyma: `import('./function/handler.js')` from server.mjs); absolute works.
const HANDLER_FILE = path.resolve(__dirname, env.HANDLER_PATH || './function/handler.js');
const HANDLER_NAME = env.FUNC_HANDLER || 'main';
const ACCESS_LOG = Boolean(env.KYMA_INTERNAL_LOGGER_ENABLED);
// The context's names, read once: every read of process.env is a call into the C++ side.
const FUNC_NAME = env.FUNC_NAME;
const FUNC_RUNTIME = env.FUNC_RUNTIME;
const NAMESPACE = env.SERVICE_NAMESPACE;
const PUBLISHER = env.PUBLISHER_PROXY_ADDRESS ||
  'http://eventing-publisher-proxy.kyma-system.svc.cluster.local/publish';
// Drain on SIGTERM: in-flight calls end by FUNC_TIMEOUT anyway (408); stay under k8s's 30 s.
const GRACE_MS = Math.min(TIMEOUT_S + 1, 25) * 1000;

// ---- metrics (Prometheus text format 0.0.4) ----
const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
const m = { calls: 0, failures: 0, buckets: BUCKETS.map(() => 0), sum: 0, count: 0 };
function observe(seconds) {
  for (let i = 0; i < BUCKETS.length; i++) if (seconds <= BUCKETS[i]) m.buckets[i]++;
  m.sum += seconds;
  m.count++;
}
function renderMetrics() {
  const out = [
    '# HELP function_calls_total Number of calls to the user function.',
    '# TYPE function_calls_total counter', `function_calls_total ${m.calls}`,
    '# HELP function_failures_total Number of failed calls (exception, rejection or timeout).',
    '# TYPE function_failures_total counter', `function_failures_total ${m.failures}`,
    '# HELP function_duration_seconds Duration of user function calls in seconds.',
    '# TYPE function_duration_seconds histogram',
  ];
  const bucket = (le, n) => `function_duration_seconds_bucket{le="${le}"} ${n}`;
  BUCKETS.forEach((le, i) => out.push(bucket(le, m.buckets[i])));
  out.push(bucket('+Inf', m.count));
  out.push(`function_duration_seconds_sum ${m.sum}`, `function_duration_seconds_count ${m.count}`);
  return out.join('\n') + '\n';
}

// ---- request/response with the Express helpers Kyma Functions use (Kyma served with express) ----
const fs = require('fs');

// Extension → media type, for attachment(), sendFile() and is()/accepts() shorthands.
const MIME = {
  json: 'application/json', html: 'text/html', htm: 'text/html', txt: 'text/plain',
  text: 'text/plain', css: 'text/css', js: 'text/javascript', mjs: 'text/javascript',
  csv: 'text/csv', xml: 'application/xml', pdf: 'application/pdf', zip: 'application/zip',
  png: 'image/png', jpg: 'image/jpeg', jpeg: 'image/jpeg', gif: 'image/gif', svg: 'image/svg+xml',
  ico: 'image/x-icon', webp: 'image/webp', wasm: 'application/wasm', bin: 'application/octet-stream',
  urlencoded: 'application/x-www-form-urlencoded', multipart: 'multipart/*', form: 'multipart/form-data',
};
const mimeOf = (t) => (String(t).includes('/') ? String(t).toLowerCase() : MIME[String(t).replace(/^\./, '').toLowerCase()]);
const byExtension = (file) => MIME[path.extname(String(file)).slice(1).toLowerCase()] || 'application/octet-stream';

// Does media type `actual` match `wanted` ('json', 'text/*', '*/json', '+json', 'application/json')?
function typeMatches(actual, wanted) {
  if (wanted.startsWith('+')) return actual.endsWith(wanted);
  const want = mimeOf(wanted);
  if (!want) return false;
  const [wt, ws] = want.split('/');
  const [at, as] = actual.split('/');
  return (wt === '*' || wt === at) && (ws === '*' || ws === as ||
    (ws.startsWith('*+') && as.endsWith(ws.slice(1))));
}

class Request extends http.IncomingMessage {
  get(name) {
    const n = String(name).toLowerCase();
    if (n === 'referer' || n === 'referrer') return this.headers.referer || this.headers.referrer;
    return this.headers[n];
  }
  header(name) { return this.get(name); }
  // Getters, as express defines them: computed only when a Function reads them.
  get hostname() { return String(this.headers.host || '').replace(/:\d+$/, ''); }
  get ip() { return this.socket.remoteAddress; }
  // Express without 'trust proxy': https only on a TLS socket.
  get protocol() { return this.socket && this.socket.encrypted ? 'https' : 'http'; }
  get secure() { return this.protocol === 'https'; }
  // req.is(...types): the matching type (as given, or the actual one for wildcards), false, or
  // null when the request has no body, as express (type-is) answers.
  is(...types) {
    const list = types.flat();
    if (this.headers['content-length'] === undefined && this.headers['transfer-encoding'] === undefined) return null;
    const actual = String(this.headers['content-type'] || '').split(';')[0].trim().toLowerCase();
    if (!actual) return false;
    if (list.length === 0) return actual;
    for (const t of list) {
      if (typeMatches(actual, String(t))) return String(t).startsWith('+') || String(t).includes('*') ? actual : t;
    }
    return false;
  }
  // req.accepts(...types): the best of `types` for the Accept header (q-values, wildcards),
  // false when none is acceptable; without types, the accepted types by preference.
  accepts(...types) {
    const list = types.flat();
    const accepted = String(this.headers.accept || '*/*').split(',').map((part, i) => {
      const [type, ...params] = part.trim().split(';');
      const q = params.map((p) => p.trim().split('=')).find(([k]) => k === 'q');
      return { type: type.trim().toLowerCase(), q: q ? Number(q[1]) : 1, i };
    }).filter((a) => a.type && a.q > 0).sort((a, b) => b.q - a.q || a.i - b.i);
    if (list.length === 0) return accepted.map((a) => a.type);
    let best = false;
    let bestQ = 0;
    for (const t of list) {
      const want = mimeOf(t);
      if (!want) continue;
      const hit = accepted.find((a) => typeMatches(want, a.type));
      if (hit && hit.q > bestQ) { best = t; bestQ = hit.q; }
    }
    return best;
  }
}
class Response extends http.ServerResponse {
  // Whether anything has set a header. Until something does, kiln's own answers write their head
  // as one list (endWith): setHeader's bookkeeping per header cost a small JSON POST about a
  // fifth of its rate (bench/server_rps.py). On the prototype (Response.headerSet, below), not a
  // field: a subclass with fields runs its own constructor code for every response.
  setHeader(name, value) { this.headerSet = true; return super.setHeader(name, value); }
  appendHeader(name, value) { this.headerSet = true; return super.appendHeader(name, value); }
  // Every answer allows any origin, as Kyma's cors() did, unless the Function set its own: added
  // where each head is written (the Function's own writeHead and end included), not per request.
  writeHead(statusCode, reason, headers) {
    if (!this.hasHeader('access-control-allow-origin')) this.setHeader('Access-Control-Allow-Origin', '*');
    return super.writeHead(statusCode, reason, headers);
  }
  status(code) { this.statusCode = code; return this; }
  set(field, value) {
    if (typeof field === 'object') for (const k of Object.keys(field)) this.setHeader(k, field[k]);
    else this.setHeader(field, value);
    return this;
  }
  header(field, value) { return this.set(field, value); }
  get(field) { return this.getHeader(field); }
  type(t) { return this.set('Content-Type', mimeOf(t) || t); }
  json(body) { if (!this.hasHeader('Content-Type')) this.type(JSON_TYPE); return this.send(body); }
  send(body) { respond(this, body); return this; }
  sendStatus(code) { respond(this, http.STATUS_CODES[code] || String(code), code); return this; }
  append(field, value) {
    const prev = this.getHeader(field);
    const add = Array.isArray(value) ? value.map(String) : [String(value)];
    if (prev === undefined) return this.set(field, add.length === 1 ? add[0] : add);
    return this.set(field, [].concat(prev, add));
  }
  location(url) {
    const to = url === 'back' ? (this.req.headers.referer || this.req.headers.referrer || '/') : url;
    return this.set('Location', encodeURI(to));
  }
  redirect(a, b) {
    const [status, url] = b === undefined ? [302, a] : [a, b];
    this.location(url);
    respond(this, `${http.STATUS_CODES[status] || 'Redirecting'}. Redirecting to ${this.getHeader('Location')}`, status);
  }
  cookie(name, value, options = {}) {
    const opts = { path: '/', ...options };
    let v = typeof value === 'object' ? `j:${JSON.stringify(value)}` : String(value);
    v = (opts.encode || encodeURIComponent)(v);
    const parts = [`${name}=${v}`];
    if (opts.maxAge !== undefined) {
      const ms = Number(opts.maxAge);
      opts.expires = new Date(Date.now() + ms);
      parts.push(`Max-Age=${Math.floor(ms / 1000)}`);
    }
    if (opts.domain) parts.push(`Domain=${opts.domain}`);
    if (opts.path) parts.push(`Path=${opts.path}`);
    if (opts.expires) parts.push(`Expires=${new Date(opts.expires).toUTCString()}`);
    if (opts.httpOnly) parts.push('HttpOnly');
    if (opts.secure) parts.push('Secure');
    if (opts.partitioned) parts.push('Partitioned');
    if (opts.sameSite) {
      const same = opts.sameSite === true ? 'Strict' : String(opts.sameSite);
      parts.push(`SameSite=${same[0].toUpperCase()}${same.slice(1).toLowerCase()}`);
    }
    return this.append('Set-Cookie', parts.join('; '));
  }
  clearCookie(name, options = {}) {
    const { maxAge, ...rest } = options;
    return this.cookie(name, '', { expires: new Date(1), ...rest });
  }
  attachment(filename) {
    if (filename === undefined) return this.set('Content-Disposition', 'attachment');
    this.type(byExtension(filename));
    const base = path.basename(String(filename)).replace(/["\\]/g, '\\$&');
    return this.set('Content-Disposition', `attachment; filename="${base}"`);
  }
  // sendFile(path[, options][, callback]): streams a file (absolute, or relative to options.root)
  // with a type from its extension; 404 when it does not exist, as express did.
  sendFile(file, options, callback) {
    const [opts, done] = typeof options === 'function' ? [{}, options] : [options || {}, callback];
    const full = opts.root ? path.join(opts.root, String(file)) : String(file);
    this.pending = true; // the Function's return value must not end the response first
    const fail = (status, err) => {
      this.pending = false;
      if (done) return done(err);
      sendText(this, status, `${http.STATUS_CODES[status]}\n`);
    };
    if (!path.isAbsolute(full)) return fail(500, new TypeError('path must be absolute or specify root to res.sendFile'));
    fs.stat(full, (err, st) => {
      if (err || !st.isFile()) return fail(404, err || new Error(`${full} is not a file`));
      if (opts.headers) this.set(opts.headers);
      if (!this.hasHeader('Content-Type')) this.type(byExtension(full));
      this.setHeader('Content-Length', st.size);
      const stream = fs.createReadStream(full);
      stream.on('error', (e) => { this.pending = false; this.destroy(e); });
      stream.on('end', () => { this.pending = false; if (done) done(); });
      stream.pipe(this);
    });
    return this;
  }
}

Response.prototype.headerSet = false; // until setHeader or appendHeader

const JSON_TYPE = 'application/json; charset=utf-8';
const TEXT_TYPE = 'text/plain; charset=utf-8';
const METRICS_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

function sendText(res, status, text, type = TEXT_TYPE) {
  if (res.headersSent) return;
  res.statusCode = status;
  if (res.headerSet !== false) res.setHeader('Content-Type', type);
  endWith(res, text, type);
}

const writeHead = http.ServerResponse.prototype.writeHead;

// Ends the response with `body` and, unless the Function set one, the Content-Type `type`;
// sized: an HTTP/1.0 keep-alive client (ab, some proxies) can only reuse the connection when
// the length is known up front. When nothing has set a header (kiln's Response only), the head
// goes out as one list, with the CORS header that Response.writeHead would add.
function endWith(res, body, type) {
  const sized = res.statusCode !== 204 && res.statusCode !== 304;
  if (res.headerSet === false) {
    const head = ['Access-Control-Allow-Origin', '*'];
    if (type !== undefined) head.push('Content-Type', type);
    if (sized) head.push('Content-Length', body === undefined ? 0 : Buffer.byteLength(body));
    writeHead.call(res, res.statusCode, head);
    res.end(body);
    return;
  }
  if (type !== undefined && !res.hasHeader('Content-Type')) res.setHeader('Content-Type', type);
  if (sized && !res.hasHeader('Content-Length') && !res.hasHeader('Transfer-Encoding')) {
    res.setHeader('Content-Length', body === undefined ? 0 : Buffer.byteLength(body));
  }
  res.end(body);
}

// Turns a handler's result (or sendResponse's arguments) into the response, as Kyma did:
// object → JSON, string → text, Buffer → raw, undefined/null → empty 200 (or status text).
function respond(res, body, status, headers) {
  if (res.writableEnded) return; // the handler already answered (sendResponse or res.end)
  if (res.pending) return; // res.sendFile is streaming the answer
  if (res.headersSent) { res.end(); return; } // it wrote a partial response itself: finish it
  if (headers) for (const k of Object.keys(headers)) res.setHeader(k, headers[k]);
  if (status) res.statusCode = status;
  if (body === undefined || body === null) {
    if (status) sendText(res, status, http.STATUS_CODES[status] || '');
    else endWith(res);
    return;
  }
  let type = TEXT_TYPE;
  if (typeof body === 'string') { /* as is */ } else if (body instanceof Uint8Array) {
    type = 'application/octet-stream';
  } else {
    type = JSON_TYPE;
    body = JSON.stringify(body);
    if (body === undefined) body = ''; // a function or symbol
  }
  endWith(res, body, type);
}

// ---- body: streamed with a limit, parsed like Kyma's body-parser chain ----
// An upload over the limit is read to its end and discarded (never buffered) before the 413
// goes out, so a client that writes its whole body before it reads the answer (Python's
// http.client, requests) reads the 413 instead of a reset; but for at most 2 s and 64 MiB: a
// client streaming past either gets the 413 and the connection is cut. A client that waits
// for `100 Continue` gets the 413 at once: it sends nothing.
const DRAIN_MS = 2000;
const DRAIN_BYTES = 64 << 20;
function tooLarge(req, res, unsent = false) {
  // Once per request: the new-API server's byte count and Express's body parser may both find
  // the same upload over the limit.
  if (req.kilnTooLarge) return;
  req.kilnTooLarge = true;
  let drained = 0;
  let answered = false;
  const answer = (cut) => {
    if (answered) return;
    answered = true;
    clearTimeout(timer);
    if (res.headersSent) { // answered already (a Function that wrote before reading it all)
      if (cut) req.socket.destroy();
      return;
    }
    res.setHeader('Connection', 'close');
    if (cut) res.once('finish', () => req.socket.destroy());
    sendText(res, 413, `Request body larger than ${LIMIT_VAR} (${MB_LIMIT} MiB)\n`);
  };
  const timer = setTimeout(() => answer(true), DRAIN_MS);
  req.on('data', (chunk) => {
    drained += chunk.length;
    if (drained > DRAIN_BYTES) answer(true);
  });
  req.on('end', () => answer(false));
  req.on('error', () => { clearTimeout(timer); });
  req.resume();
  if (unsent) answer(true);
  // Already read to its end (Express's body parsers read the rest before they report the
  // limit): nothing is left to drain.
  else if (req.complete) answer(false);
}

function readBody(req, res, done) {
  const declared = req.headers['content-length'];
  // Like body-parser's type-is.hasBody: no Content-Length and no Transfer-Encoding = no body.
  if (declared === undefined && req.headers['transfer-encoding'] === undefined) return done();
  if (Number(declared) > BODY_LIMIT) return tooLarge(req, res);
  const chunks = [];
  let size = 0;
  let over = false;
  req.on('data', (chunk) => {
    if (over) return;
    size += chunk.length;
    if (size <= BODY_LIMIT) return void chunks.push(chunk);
    over = true;
    chunks.length = 0;
    tooLarge(req, res);
  });
  // A client that goes away mid-body ends nothing: 'end' never comes. (No 'error' listener:
  // with one, Node defers every request's destroy by a tick to report an abort to it.)
  req.on('end', () => { if (!over) done(Buffer.concat(chunks, size)); });
}

function mediaType(req) {
  const type = req.headers['content-type'];
  if (type === undefined) return { mime: '', charset: 'utf-8' };
  // The common case, a bare type (`application/json`), without splitting.
  if (type.indexOf(';') < 0) return { mime: type.trim().toLowerCase(), charset: 'utf-8' };
  const [mime, ...params] = String(req.headers['content-type'] || '').split(';');
  const charset = params.map((p) => p.trim().split('='))
    .find(([k]) => k.toLowerCase() === 'charset');
  return {
    mime: mime.trim().toLowerCase(),
    charset: charset && charset[1] ? charset[1].replace(/"/g, '') : 'utf-8',
  };
}

// Query strings and form bodies: repeated keys become arrays (flat, no `a[b]=c` nesting).
function formObject(params) {
  const out = {};
  for (const [k, v] of params) {
    if (!Object.prototype.hasOwnProperty.call(out, k)) out[k] = v;
    else out[k] = [].concat(out[k], v);
  }
  return out;
}

function parseBody(mime, charset, raw) {
  if (raw === undefined) return undefined;
  if (mime === 'application/json' || mime === 'application/cloudevents+json') {
    return raw.length === 0 ? {} : JSON.parse(raw.toString('utf8'));
  }
  if (mime.startsWith('text/')) {
    if (Buffer.isEncoding(charset)) return raw.toString(charset);
    try { // ISO-8859-1, windows-1252…: as body-parser (iconv-lite) decodes them
      return new TextDecoder(charset).decode(raw);
    } catch {
      return raw.toString('utf8');
    }
  }
  if (mime === 'application/x-www-form-urlencoded') {
    return formObject(new URLSearchParams(raw.toString('utf8')));
  }
  return raw;
}

// CloudEvents as the CloudEvents SDK reads and writes them (Kyma's server used it): a request
// is an event only with the CloudEvents content type or both `ce-type` and `ce-source`; `id`
// and `time` are filled in when missing and `time` is normalised to RFC 3339 in UTC.
const CE_NAME = /^[a-z0-9]{1,20}$/;

function rfc3339(value) {
  const t = new Date(value);
  if (value === undefined || value === null || value === '' || Number.isNaN(t.getTime())) {
    throw new TypeError(`invalid CloudEvent attribute "time": ${JSON.stringify(value)} is not a RFC 3339 timestamp`);
  }
  return t.toISOString();
}

// Checks and completes a CloudEvent's attributes; throws a TypeError naming the first problem.
function validCloudEvent(attrs) {
  const ce = { specversion: '1.0', id: crypto.randomUUID(), time: new Date().toISOString(), ...attrs };
  for (const name of ['id', 'type', 'source', 'specversion']) {
    if (typeof ce[name] !== 'string' || ce[name] === '') {
      throw new TypeError(`invalid CloudEvent: attribute "${name}" must be a non-empty string`);
    }
  }
  if (ce.specversion !== '1.0') {
    throw new TypeError(`invalid CloudEvent: specversion ${JSON.stringify(ce.specversion)} is not 1.0`);
  }
  ce.time = rfc3339(ce.time);
  for (const name of Object.keys(ce)) {
    if (name !== 'data' && name !== 'data_base64' && !CE_NAME.test(name)) {
      throw new TypeError(`invalid CloudEvent attribute name "${name}": use 1-20 lower-case letters or digits`);
    }
  }
  return ce;
}

const NO_EVENT = Object.freeze({});
function cloudEvent(req, mime, data) {
  const h = req.headers; // Node lower-cases header names
  const structured = mime === 'application/cloudevents+json';
  if (!structured && !(h['ce-type'] && h['ce-source'])) return NO_EVENT;
  const attrs = {};
  if (structured && data && typeof data === 'object' && !Array.isArray(data)) {
    for (const [k, v] of Object.entries(data)) if (k !== 'data' && k !== 'data_base64') attrs[k] = v;
  } else {
    for (const [k, v] of Object.entries(h)) if (k.startsWith('ce-')) attrs[k.slice(3)] = v;
    if (!attrs.datacontenttype && h['content-type']) attrs.datacontenttype = h['content-type'];
  }
  if (!attrs.id) attrs.id = crypto.randomUUID();
  let time;
  try {
    time = attrs.time ? rfc3339(attrs.time) : new Date().toISOString();
  } catch {
    time = attrs.time; // kept as sent rather than failing the call
  }
  attrs.time = time;
  const ce = {};
  for (const [k, v] of Object.entries(attrs)) ce[`ce-${k}`] = v;
  if (structured && data && typeof data === 'object' && !Array.isArray(data)) {
    if ('data' in data) ce.data = data.data;
    else if ('data_base64' in data) ce.data = Buffer.from(String(data.data_base64), 'base64');
    else ce.data = undefined;
  }
  return ce;
}

// POSTs to the publisher proxy; resolves like axios did for Kyma: { data, status, headers }.
async function post(body, headers) {
  const r = await fetch(PUBLISHER, { method: 'POST', headers, body });
  const text = await r.text();
  let data = text;
  try { data = text ? JSON.parse(text) : ''; } catch { /* not JSON: the text */ }
  const result = { data, status: r.status, statusText: r.statusText, headers: Object.fromEntries(r.headers) };
  if (!r.ok) {
    const err = new Error(`publishing the CloudEvent to ${PUBLISHER} failed: HTTP ${r.status} ${text.slice(0, 200)}`);
    err.response = result;
    throw err;
  }
  return result;
}

async function emitCloudEvent(type, source, data, attrs = {}) {
  const datacontenttype = typeof data === 'object' && data !== null ? 'application/json' : 'text/plain';
  const ce = validCloudEvent({ datacontenttype, ...(attrs || {}), type, source, data });
  return post(JSON.stringify(ce), { 'Content-Type': 'application/cloudevents+json; charset=utf-8' });
}

// Deprecated in Kyma, still used: publish an event object as it is.
async function publishCloudEvent(ce) {
  console.warn('publishCloudEvent is deprecated: use emitCloudEvent');
  return post(JSON.stringify(ce), { 'Content-Type': 'application/cloudevents+json' });
}

// Deprecated in Kyma, still used: a reply event built from the request's CloudEvent headers.
function buildResponseCloudEvent(req, id, type, data) {
  console.warn('buildResponseCloudEvent is deprecated: use emitCloudEvent');
  let datacontenttype;
  if (typeof data === 'object') datacontenttype = 'application/json';
  else if (typeof data === 'string') datacontenttype = 'text/plain';
  return {
    type,
    source: req.headers['ce-source'],
    eventtypeversion: req.headers['ce-eventtypeversion'],
    specversion: req.headers['ce-specversion'],
    id,
    data,
    datacontenttype,
  };
}

// ---- tracing: W3C Trace Context and B3 in, both out; OpenTelemetry loaded only when used ----
// Every request is traced, as Kyma's runtimes trace it. One that carries `traceparent`, `b3` or
// `X-B3-TraceId`/`X-B3-SpanId` continues that trace; any other starts a new one, sampled as its
// `X-B3-Sampled`/`X-B3-Flags` say, else always (the ParentBased(AlwaysOn) sampler Kyma's runtime
// uses). The request gets a span id of its own (a child of the caller's), and every outgoing
// request the Function makes while handling it (http/https — so axios — and fetch) carries
// `traceparent` and the B3 headers. The ids are made only when something needs them (an outgoing
// call, `event.tracer`), so a request that calls nothing costs no random bytes. Every request
// runs in `traceStore` (AsyncLocalStorage: about 8 % of the hello rate on Node.js 22, 1 % on
// 24, bench/RESULTS.md): a call can only carry its own request's trace, never a guess.
// `event.tracer` loads the OpenTelemetry SDK from the image's packages on first use; its spans are children of
// the request's. With TRACE_COLLECTOR_ENDPOINT the SDK loads at start and every request becomes
// a SERVER span exported over OTLP/HTTP.
const { AsyncLocalStorage } = require('async_hooks');
const crypto = require('crypto');

const COLLECTOR = env.TRACE_COLLECTOR_ENDPOINT || '';
const traceStore = new AsyncLocalStorage();
const ZERO = /^0+$/;
let otel = null; // { api, tracer } once loaded

function idPair(traceId, spanId) {
  const t = String(traceId || '').trim().toLowerCase();
  const s = String(spanId || '').trim().toLowerCase();
  if (!/^([0-9a-f]{16}|[0-9a-f]{32})$/.test(t) || !/^[0-9a-f]{16}$/.test(s)) return null;
  if (ZERO.test(t) || ZERO.test(s)) return null;
  return { traceId: t.padStart(32, '0'), parentId: s };
}

// The caller's trace, from W3C Trace Context, B3 single or B3 multi headers; null without one.
function incomingTrace(h) {
  if (h.traceparent === undefined && h.b3 === undefined && h['x-b3-traceid'] === undefined) return null;
  const tp = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})/.exec(String(h.traceparent || '').trim());
  if (tp && tp[1] !== 'ff') {
    const ids = idPair(tp[2], tp[3]);
    if (ids) return { ...ids, sampled: (parseInt(tp[4], 16) & 1) === 1 };
  }
  if (h.b3) { // traceid-spanid[-sampling[-parentspanid]]
    const [t, s, sampling] = String(h.b3).split('-');
    const ids = idPair(t, s);
    if (ids) return { ...ids, sampled: sampling !== '0' };
  }
  const ids = idPair(h['x-b3-traceid'], h['x-b3-spanid']);
  if (ids) return { ...ids, sampled: h['x-b3-sampled'] !== '0' && h['x-b3-flags'] !== '0' };
  return null;
}

function loadOtel() {
  if (otel) return otel;
  const api = require('@opentelemetry/api');
  const { BasicTracerProvider, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
  const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  const config = { spanProcessors: [] };
  if (COLLECTOR) {
    const { OTLPTraceExporter } = require('@opentelemetry/exporter-trace-otlp-http');
    config.spanProcessors.push(new SimpleSpanProcessor(new OTLPTraceExporter({ url: COLLECTOR })));
  }
  try {
    const { resourceFromAttributes } = require('@opentelemetry/resources');
    config.resource = resourceFromAttributes({ 'service.name': FUNC_NAME || 'function' });
  } catch { /* the SDK's default resource */ }
  const provider = new BasicTracerProvider(config);
  api.trace.setGlobalTracerProvider(provider);
  otel = {
    api,
    provider,
    tracer: provider.getTracer('io.kyma-project.serverless'),
    suppressed: api.createContextKey('OpenTelemetry SDK Context Key SUPPRESS_TRACING'),
  };
  return otel;
}

// Whether a new trace is sampled: as the request's B3 sampling headers say, else always.
function rootSampled(h) {
  if (h['x-b3-flags'] === '1') return true; // debug
  const s = h['x-b3-sampled'];
  return s === undefined ? true : s === '1' || s === 'true';
}

// The trace of the request this code runs for (none outside a request).
function currentTrace() {
  return traceStore.getStore() || null;
}

// A request's place in its trace. Its ids are made on first use (ensureIds).
function ensureIds(t) {
  if (t.spanId) return t;
  if (!t.traceId) t.traceId = crypto.randomBytes(16).toString('hex');
  t.spanId = crypto.randomBytes(8).toString('hex');
  return t;
}

// This request's trace: the caller's continued, or a new one.
function startTrace(req, reqPath) {
  const incoming = incomingTrace(req.headers);
  const t = incoming
    ? { traceId: incoming.traceId, parentId: incoming.parentId, sampled: incoming.sampled, spanId: null }
    : { traceId: null, parentId: null, sampled: rootSampled(req.headers), spanId: null };
  if (COLLECTOR) {
    const { api, tracer } = loadOtel();
    let parent = api.ROOT_CONTEXT;
    if (!incoming && !t.sampled) {
      // A new trace the caller asked not to sample: a non-recording root.
      ensureIds(t);
      parent = api.trace.setSpanContext(parent, {
        traceId: t.traceId, spanId: t.spanId, isRemote: true, traceFlags: api.TraceFlags.NONE,
      });
    }
    if (incoming) {
      parent = api.trace.setSpanContext(parent, {
        traceId: incoming.traceId, spanId: incoming.parentId, isRemote: true,
        traceFlags: incoming.sampled ? api.TraceFlags.SAMPLED : api.TraceFlags.NONE,
      });
    }
    const span = tracer.startSpan(`${req.method} ${reqPath}`, {
      kind: api.SpanKind.SERVER,
      attributes: { 'http.request.method': req.method, 'url.path': reqPath },
    }, parent);
    const sc = span.spanContext();
    Object.assign(t, { traceId: sc.traceId, spanId: sc.spanId, span, context: api.trace.setSpan(parent, span) });
  }
  return t;
}

function endTrace(t, status) {
  if (!t || !t.span) return;
  t.span.setAttribute('http.response.status_code', status);
  if (status >= 500) t.span.setStatus({ code: otel.api.SpanStatusCode.ERROR });
  t.span.end();
}

// The OpenTelemetry context a Function's span starts in: the active one if the Function made a
// span active, else the request's span.
function parentContext() {
  const { api } = loadOtel();
  const active = api.context.active();
  const t = currentTrace();
  if (api.trace.getSpan(active) || !t) return active;
  if (t.context) return t.context;
  ensureIds(t);
  return api.trace.setSpanContext(active, {
    traceId: t.traceId, spanId: t.spanId, isRemote: true,
    traceFlags: t.sampled ? api.TraceFlags.SAMPLED : api.TraceFlags.NONE,
  });
}

// `event.tracer`: an OpenTelemetry tracer whose spans are children of the request's.
const userTracer = {
  startSpan(name, options, ctx) {
    return loadOtel().tracer.startSpan(name, options, ctx || parentContext());
  },
  startActiveSpan(name, ...rest) { // (name, fn) | (name, options, fn) | (name, options, ctx, fn)
    const fn = rest.pop();
    return loadOtel().tracer.startActiveSpan(name, rest[0] || {}, rest[1] || parentContext(), fn);
  },
};

// The headers an outgoing request carries, from the innermost active span of this request.
function outgoingTraceHeaders() {
  const t = currentTrace();
  if (!t) return null;
  ensureIds(t);
  let spanId = t.spanId;
  let sampled = t.sampled;
  if (otel) {
    // The SDK's own exports (to the collector) run with tracing suppressed: never trace them.
    if (otel.api.context.active().getValue(otel.suppressed) === true) return null;
    const span = otel.api.trace.getSpan(otel.api.context.active());
    const sc = span && span.spanContext();
    if (sc && sc.traceId === t.traceId) {
      spanId = sc.spanId;
      sampled = (sc.traceFlags & 1) === 1;
    }
  }
  const h = {
    traceparent: `00-${t.traceId}-${spanId}-${sampled ? '01' : '00'}`,
    'x-b3-traceid': t.traceId,
    'x-b3-spanid': spanId,
    'x-b3-sampled': sampled ? '1' : '0',
  };
  if (spanId === t.spanId && t.parentId) h['x-b3-parentspanid'] = t.parentId;
  return h;
}

// Outgoing requests made while a traced request is handled carry its trace.
for (const mod of [http, require('https')]) {
  const request = mod.request;
  mod.request = function tracedRequest(...args) {
    const req = request.apply(this, args);
    const headers = outgoingTraceHeaders();
    if (headers) {
      for (const [k, v] of Object.entries(headers)) {
        try { if (!req.hasHeader(k)) req.setHeader(k, v); } catch { /* headers already sent */ }
      }
    }
    return req;
  };
  mod.get = function tracedGet(...args) {
    const req = mod.request(...args);
    req.end();
    return req;
  };
}
if (typeof globalThis.fetch === 'function') {
  const fetchImpl = globalThis.fetch;
  // fetch's own Request: `Request` in this file is the server's request class.
  const FetchRequest = globalThis.Request;
  globalThis.fetch = function tracedFetch(input, init) {
    const extra = outgoingTraceHeaders();
    if (!extra) return fetchImpl(input, init);
    // init.headers replace the Request's own, as fetch takes them.
    const headers = new Headers((init && init.headers) || (input instanceof FetchRequest ? input.headers : undefined));
    for (const [k, v] of Object.entries(extra)) if (!headers.has(k)) headers.set(k, v);
    return fetchImpl(input, { ...init, headers });
  };
}

// ---- the user's Function ----
let userFunction;

function invoke(req, res, reqPath, query, raw) {
  const { mime, charset } = mediaType(req);
  let data;
  try {
    data = parseBody(mime, charset, raw);
  } catch (err) {
    return sendText(res, 400, `Bad Request: cannot parse the ${mime} body: ${err.message}\n`);
  }
  req.path = reqPath;
  req.query = query;
  req.body = data;
  req.originalUrl = req.url;
  req.params = {};
  const event = {
    data,
    extensions: { request: req, response: res },
    tracer: userTracer, // its methods load the SDK on first use
    setResponseHeader: (k, v) => { if (!res.headersSent) res.setHeader(k, v); },
    setResponseContentType: (t) => { if (!res.headersSent) res.setHeader('Content-Type', t); },
    setResponseStatus: (code) => {
      // As Express's res.status throws for it: a status no answer can carry fails the call
      // here, not later where nothing answers.
      if (!Number.isInteger(code) || code < 100 || code > 999) throw new RangeError(`Invalid status code: ${code}`);
      if (!res.headersSent) res.statusCode = code;
    },
    emitCloudEvent,
    publishCloudEvent,
    buildResponseCloudEvent: (id, type, data) => buildResponseCloudEvent(req, id, type, data),
  };
  // The `ce-*` keys of an incoming CloudEvent (none otherwise). Added after the literal: a spread
  // inside it costs every call about 2 % of the hello rate (bench/server_rps.py).
  const ce = cloudEvent(req, mime, data);
  for (const k in ce) event[k] = ce[k];
  const context = {
    'function-name': FUNC_NAME,
    runtime: FUNC_RUNTIME,
    namespace: NAMESPACE,
    timeout: TIMEOUT_S,
    'body-size-limit': MB_LIMIT,
  };

  m.calls++;
  const c = new Call(req, res);
  const sendResponse = (body, status, headers) => respond(res, body, status, headers);
  return runTraced(startTrace(req, reqPath), res, () => c.run(event, context, sendResponse));
}

// Runs `call` as the request's of `trace`: in its trace (see above). Entered rather than run:
// `run` also makes a frame to restore the one before, which costs a small async POST about 4 %
// of its rate (bench/server_rps.py). Nothing needs it restored: the request's code runs inside a
// callback (the body's 'end', the request's parse) that Node leaves at once, and Node gives every
// later callback and continuation the frame it was created in, so the Function's own callbacks
// keep its request's trace and no other request's code sees it.
function runTraced(trace, res, call) {
  if (trace.span) res.on('finish', () => endTrace(trace, res.statusCode));
  if (trace.context) return otel.api.context.with(trace.context, () => traceStore.run(trace, call));
  traceStore.enterWith(trace);
  return call();
}

// One call of the Function. It settles once — with its result, its failure or FUNC_TIMEOUT —
// and is then answered and counted. The new-API server (express/) extends it: its calls
// settle when the response is done, and fail as Express answers.
class Call {
  constructor(req, res) {
    this.req = req;
    this.res = res;
    this.started = performance.now(); // ms; a BigInt clock costs more per call
    this.settled = false;
    this.deadline = 0;
    this.prev = null; // neighbours among the pending calls, while pending
    this.next = null;
  }

  run(event, context, sendResponse) {
    let out;
    try {
      out = userFunction(event, context, sendResponse);
    } catch (err) {
      return this.fail(err);
    }
    if (out && typeof out.then === 'function') {
      this.armTimeout();
      out.then((result) => this.ok(result), (err) => this.fail(err));
    } else {
      this.ok(out);
    }
  }

  settle(failed) {
    if (this.settled) return false;
    this.settled = true;
    if (this.deadline) {
      unlink(this);
      this.deadline = 0;
    }
    if (failed) m.failures++;
    observe((performance.now() - this.started) / 1000);
    return true;
  }

  ok(result) {
    if (!this.settle(false)) return;
    try {
      respond(this.res, result);
    } catch (err) { // a result that cannot be sent (a circular object, a BigInt): a 500
      console.error(err);
      m.failures++;
      const { res } = this;
      if (!res.headersSent) sendText(res, 500, 'Internal server error');
      else res.destroy();
    }
  }

  fail(err) {
    if (!this.settle(true)) return;
    console.error(err); // an Error prints with its stack
    if (!this.res.headersSent) this.res.removeHeader('Content-Type');
    respond(this.res, typeof err === 'string' ? err : 'Internal server error', 500);
  }

  // FUNC_TIMEOUT, counted from the call: stop waiting (a promise cannot be cancelled) and
  // answer 408. Armed only for a promise; a synchronous result has settled by then. One timer
  // sweeps every pending call (a timer per call costs an async handler about a tenth of its
  // rate): a call times out within SWEEP_MS after its deadline.
  armTimeout() {
    this.deadline = this.started + TIMEOUT_S * 1000;
    link(this);
    if (!sweeper) sweeper = setInterval(sweep, SWEEP_MS);
  }

  timeOut() {
    if (!this.settle(true)) return;
    const { req, res } = this;
    console.error(`Function timed out after ${TIMEOUT_S}s: ${req.method} ${req.url}`);
    if (res.headersSent) res.destroy();
    else sendText(res, 408, 'Timeout while processing the function\n');
  }
}

const SWEEP_MS = Math.min(100, TIMEOUT_S * 1000);
// Calls waiting on a promise, in start order: a list through the calls themselves (a Set's
// table is reallocated as it grows and shrinks with the load).
const pending = { first: null, last: null };
function link(call) {
  call.prev = pending.last;
  if (pending.last) pending.last.next = call;
  else pending.first = call;
  pending.last = call;
}
function unlink(call) {
  if (call.prev) call.prev.next = call.next;
  else pending.first = call.next;
  if (call.next) call.next.prev = call.prev;
  else pending.last = call.prev;
  call.prev = call.next = null;
}
let sweeper = null;
function sweep() {
  const now = performance.now();
  while (pending.first && pending.first.deadline <= now) {
    const call = pending.first;
    unlink(call);
    call.deadline = 0;
    call.timeOut();
  }
  if (pending.first === null) {
    clearInterval(sweeper);
    sweeper = null;
  }
}

// ---- server ----
let inflight = 0;
let shuttingDown = false;

function onClose() {
  inflight--;
  if (shuttingDown) { this.req.socket.end(); maybeExit(); }
}

function onRequest(req, res) {
  inflight++;
  res.on('close', onClose);
  if (shuttingDown) res.setHeader('Connection', 'close');
  if (ACCESS_LOG) res.on('finish', () => console.log(`${req.method} ${req.url} ${res.statusCode}`));
  const q = req.url.indexOf('?');
  const reqPath = q < 0 ? req.url : req.url.slice(0, q);
  if (req.method === 'GET' || req.method === 'HEAD') {
    if (reqPath === '/healthz') return sendText(res, 200, 'OK');
    if (reqPath === '/metrics') return sendText(res, 200, renderMetrics(), METRICS_TYPE);
    if (reqPath === '/favicon.ico') { res.statusCode = 204; return res.end(); }
  }
  if (req.method === 'OPTIONS') { // CORS preflight: allow whatever is asked for
    res.statusCode = 204;
    const ask = (name) => req.headers[`access-control-request-${name}`];
    res.setHeader('Access-Control-Allow-Methods', ask('method') || 'GET, POST, PUT, PATCH, DELETE');
    res.setHeader('Access-Control-Allow-Headers', ask('headers') || '*');
    res.setHeader('Access-Control-Max-Age', '86400');
    return res.end();
  }
  const query = q < 0 ? {} : formObject(new URLSearchParams(req.url.slice(q + 1)));
  readBody(req, res, (raw) => invoke(req, res, reqPath, query, raw));
}

function maybeExit() {
  if (inflight === 0) {
    console.log('Server stopped');
    setImmediate(() => process.exit(0));
  }
}

function shutdown(server, signal) {
  if (shuttingDown) return;
  shuttingDown = true;
  console.log(`${signal} received: no new connections, draining ${inflight} request(s)`);
  server.close(); // stop accepting
  server.closeIdleConnections(); // keep-alive sockets without a request in flight
  setTimeout(() => {
    console.error(`Drain took over ${GRACE_MS / 1000}s, exiting with ${inflight} in flight`);
    process.exit(0);
  }, GRACE_MS).unref();
  maybeExit();
}

async function loadFunction() {
  let mod;
  try {
    mod = require(HANDLER_FILE);
  } catch (err) {
    if (err.code !== 'ERR_REQUIRE_ESM' && err.code !== 'ERR_REQUIRE_ASYNC_MODULE') throw err;
    mod = await import(require('url').pathToFileURL(HANDLER_FILE).href); // an ES module on Node 20
  }
  // CommonJS `module.exports = { main }`, or an ES module's `export function main` / default.
  let fn = mod && mod[HANDLER_NAME];
  if (typeof fn !== 'function' && mod && mod.default) fn = mod.default[HANDLER_NAME];
  if (typeof fn !== 'function') {
    throw new Error(`${HANDLER_FILE} does not export a function '${HANDLER_NAME}'`);
  }
  return fn;
}

// User code may throw from its own callbacks or forget a rejection: log it, keep serving (as Kyma).
process.on('uncaughtException', (err) => console.error('Uncaught exception:', err));
process.on('unhandledRejection', (err) => console.error('Unhandled rejection:', err));

// Loaded as a module (`kiln-core.js` beside the new-API server, runtimes/_servers/express), this
// file serves nothing: it lends that server the parts of the contract both APIs share.
if (require.main !== module) {
  module.exports = {
    config: { PORT, TIMEOUT_S, MB_LIMIT, BODY_LIMIT, HANDLER_FILE, HANDLER_NAME, FUNC_NAME,
      FUNC_RUNTIME, NAMESPACE, GRACE_MS },
    metrics: m, observe, renderMetrics, METRICS_TYPE, sendText, tooLarge, Call,
    startTrace, runTraced, userTracer, emitCloudEvent, loadFunction,
  };
} else loadFunction().then((fn) => {
  userFunction = fn;
  const classes = { IncomingMessage: Request, ServerResponse: Response };
  const server = http.createServer(classes, onRequest);
  server.on('checkContinue', (req, res) => { // `Expect: 100-continue`: refuse big bodies unsent
    if (Number(req.headers['content-length']) > BODY_LIMIT) return tooLarge(req, res, true);
    res.writeContinue();
    onRequest(req, res);
  });
  server.listen(PORT, '0.0.0.0', () => {
    console.log(`kiln node function server listening on 0.0.0.0:${server.address().port}, ` +
      `function ${HANDLER_FILE} export ${HANDLER_NAME} ` +
      `(timeout ${TIMEOUT_S}s, body limit ${MB_LIMIT} MiB)`);
  });
  process.on('SIGTERM', () => shutdown(server, 'SIGTERM'));
  process.on('SIGINT', () => shutdown(server, 'SIGINT'));
}, (err) => {
  console.error(`Cannot load the function from ${HANDLER_FILE}:`, err);
  process.exit(1);
});
