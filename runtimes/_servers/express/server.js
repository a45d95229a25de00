'use strict';
// kiln's function server for Kyma's new handler API (nodejs26): `main(req, res)` gets Express's
// own request and response (the return value is ignored; async handlers allowed), and
// `require('sdk')` (or `import … from 'sdk'`) gives the tracer, CloudEvents and the Function's
// metadata. Express and its body parsers are the image's Kyma runtime packages, as in Kyma's
// image. What both APIs share — metrics, tracing and its propagation into outgoing calls,
// CloudEvents out, REQ_MB_LIMIT's drained 413, FUNC_TIMEOUT, the SIGTERM drain — is the legacy
// server's, loaded as a module (kiln-core.js beside this file). Contract and decisions:
// runtimes/_servers/README.md.

const path = require('path');
const core = require(path.join(__dirname, 'kiln-core.js'));
const sdk = require('sdk');

const env = process.env;
const { config, metrics } = core;
// Kyma's nodejs26 name for the access log (any value turns it on, as there).
const ACCESS_LOG = Boolean(env.SERVER_INTERNAL_LOGGER || env.KYMA_INTERNAL_LOGGER_ENABLED);
// Kyma's nodejs26 server reads SERVER_PORT and FUNC_BODY_MB_LIMIT. The port stays FUNC_PORT's
// when set (the contract fixes it); FUNC_BODY_MB_LIMIT, the name a nodejs26 Function sets, wins
// over the legacy REQ_MB_LIMIT (the core reads it so).
const PORT = env.FUNC_PORT !== undefined ? config.PORT : Number(env.SERVER_PORT || 8080);
const { MB_LIMIT, BODY_LIMIT } = config;

sdk.configure(core.userTracer, core.emitCloudEvent, {
  name: config.FUNC_NAME || '',
  namespace: config.NAMESPACE || '',
  runtime: config.FUNC_RUNTIME || 'nodejs26',
  timeout: config.TIMEOUT_S,
  bodySizeLimit: MB_LIMIT,
});

const express = require('express');
const app = express();
let userFunction;

// The body parsers Kyma's server runs, for a request that has a body (a GET without one skips
// them): JSON (and CloudEvents), text, forms, anything else raw.
const limit = BODY_LIMIT;
const parsers = express.Router();
parsers.use(express.json({ type: ['application/json', 'application/cloudevents+json'], limit, strict: false }));
parsers.use(express.text({ type: ['text/*'], limit }));
parsers.use(express.urlencoded({ limit, extended: true }));
parsers.use(express.raw({ limit, type: () => true }));

// One middleware before the Function: the built-in endpoints, CORS, and the body. A declared
// body over the limit is answered before the parsers read it (drained, then 413).
app.use((req, res, next) => {
  res.setHeader('Access-Control-Allow-Origin', '*');
  const { method, headers } = req;
  if (method === 'GET' || method === 'HEAD') {
    const path = req.path;
    if (path === '/healthz') return core.sendText(res, 200, 'OK');
    if (path === '/metrics') return core.sendText(res, 200, core.renderMetrics(), core.METRICS_TYPE);
    if (path === '/favicon.ico') return res.status(204).end();
  } else if (method === 'OPTIONS') { // CORS preflight: allow whatever is asked for
    const ask = (name) => headers[`access-control-request-${name}`];
    res.setHeader('Access-Control-Allow-Methods', ask('method') || 'GET, POST, PUT, PATCH, DELETE');
    res.setHeader('Access-Control-Allow-Headers', ask('headers') || '*');
    return res.status(204).end();
  }
  const length = headers['content-length'];
  if (length === undefined && headers['transfer-encoding'] === undefined) return next();
  if (Number(length) > BODY_LIMIT) return core.tooLarge(req, res);
  if (length === undefined) {
    // Chunked: body-parser reads an upload past its limit to the end before it reports it,
    // however long that is. Counted here, it gets the core's bounded drain and 413 instead.
    let seen = 0;
    const count = (chunk) => {
      seen += chunk.length;
      if (seen <= BODY_LIMIT) return;
      req.off('data', count);
      core.tooLarge(req, res);
    };
    req.on('data', count);
  }
  parsers(req, res, next);
});

// One call of the Function: the core's (counted once when it settles, FUNC_TIMEOUT kept by
// the core's sweep for a call still open when main() returns), settled here when the
// response is done, and failing as Express answers.
class Call extends core.Call {
  settle(failed) {
    const first = super.settle(failed);
    if (first) this.failed = failed;
    return first;
  }

  fail(err) {
    console.error(err); // logged even after the answer, as Kyma's server does
    if (!this.settle(true)) {
      // A failure after a good answer (a rejection once the response is done) is counted
      // too, as Kyma counts every failure; once per call.
      if (!this.failed) metrics.failures++;
      this.failed = true;
      return;
    }
    const { res } = this;
    // A thrown string is the answer's text, as in Kyma's handleError.
    if (!res.headersSent) res.status(500).type('text/plain').send(typeof err === 'string' ? err : 'Internal server error');
    // Part of an answer is out: cut it, so the client sees a broken answer, not a short one
    // that looks whole (Kyma's send after the head fails, and Express destroys the socket).
    else if (!res.writableEnded) res.destroy();
  }
}

// Every other request goes to the Function.
app.use((req, res) => {
  metrics.calls++;
  const call = new Call(req, res);
  core.runTraced(core.startTrace(req, req.path), res, () => {
    let out;
    try {
      out = userFunction(req, res);
    } catch (err) {
      return call.fail(err);
    }
    if (out && typeof out.then === 'function') out.then(undefined, (err) => call.fail(err));
    // Answered, or the client already gone: nothing to wait for.
    if (res.writableEnded || res.closed) return call.settle(false);
    res.kilnCall = call; // settled when the response closes (onClose)
    call.armTimeout();
  });
});

// A body the parsers refused: over the limit (drained, then 413), or malformed (400).
app.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
  if (err && err.type === 'entity.too.large') return core.tooLarge(req, res);
  const status = err && err.status >= 400 && err.status < 500 ? err.status : 500;
  if (status === 500) console.error(err);
  core.sendText(res, status, status === 500 ? 'Internal server error\n'
    : `Bad Request: ${err.message}\n`);
});

// Uncaught exceptions and unhandled rejections are logged by the core's handlers (loading it
// installed them); the server keeps running, as Kyma's does.
let inflight = 0;
let stopping = false;
function onClose() {
  inflight--;
  if (this.kilnCall) this.kilnCall.settle(false);
  if (stopping && inflight === 0) process.exit(0);
}
function onRequest(req, res) {
  inflight++;
  res.on('close', onClose);
  if (ACCESS_LOG) res.on('finish', () => console.log(`${req.method} ${req.url} ${res.statusCode}`));
  if (stopping) res.setHeader('Connection', 'close');
  app(req, res);
}

core.loadFunction().then((fn) => {
  userFunction = fn;
  const server = require('http').createServer(onRequest);
  server.on('checkContinue', (req, res) => { // `Expect: 100-continue`: refuse big bodies unsent
    if (Number(req.headers['content-length']) > BODY_LIMIT) return core.tooLarge(req, res, true);
    res.writeContinue();
    onRequest(req, res);
  });
  server.listen(PORT, '0.0.0.0', () => {
    console.log(`kiln express function server listening on 0.0.0.0:${server.address().port}, ` +
      `function ${config.HANDLER_FILE} export ${config.HANDLER_NAME} (main(req, res); timeout ` +
      `${config.TIMEOUT_S}s, body limit ${MB_LIMIT} MiB)`);
  });
  const stop = (signal) => {
    if (stopping) return;
    stopping = true;
    console.log(`${signal} received: no new connections, draining ${inflight} request(s)`);
    server.close();
    server.closeIdleConnections();
    setTimeout(() => process.exit(0), config.GRACE_MS).unref();
    if (inflight === 0) setImmediate(() => process.exit(0));
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
}, (err) => {
  console.error(`Cannot load the function from ${config.HANDLER_FILE}:`, err);
  process.exit(1);
});
