'use strict';
// The `sdk` module of Kyma's new handler API (nodejs26), as kiln's server provides it: the
// tracer, CloudEvents in and out, and the Function's metadata. The server configures it at start.

let tracer = null;
let emit = null;
let meta = { name: '', namespace: '', runtime: 'nodejs26', timeout: 180, bodySizeLimit: 1 };

function configure(userTracer, emitCloudEvent, metadata) {
  tracer = userTracer;
  emit = emitCloudEvent;
  meta = { ...meta, ...metadata };
}

// An OpenTelemetry tracer whose spans are children of the request's (the SDK loads on first use).
function getTracer() {
  return tracer;
}

// The request's CloudEvent (binary or structured mode, as the CloudEvents SDK reads it), or null
// when the request is not one.
function getCloudEvent(req) {
  const structured = typeof req.is === 'function' && req.is('application/cloudevents+json');
  const binary = req.headers['ce-type'] && req.headers['ce-source'];
  if (!structured && !binary) return null;
  try {
    const { HTTP } = require('cloudevents'); // the image's Kyma runtime package, loaded when used
    return HTTP.toEvent({ headers: req.headers, body: req.body });
  } catch {
    return null;
  }
}

// Builds a CloudEvent and POSTs it to the eventing publisher (PUBLISHER_PROXY_ADDRESS); resolves
// to { data, status, headers } as axios did for Kyma.
function emitCloudEvent(type, source, data, optionalAttributes) {
  return emit(type, source, data, optionalAttributes);
}

function getFunctionName() { return meta.name; }
function getNamespace() { return meta.namespace; }
function getRuntime() { return meta.runtime; }
function getTimeout() { return meta.timeout; }
function getBodySizeLimit() { return meta.bodySizeLimit; }

// Names only, as Kyma's sdk exports them: an ES module's `import { getBodySizeLimit } from 'sdk'`
// sees the names Node's CommonJS export detection finds, and it stops at the first `name: value`.
module.exports = {
  configure,
  getTracer,
  getCloudEvent,
  emitCloudEvent,
  getFunctionName,
  getNamespace,
  getRuntime,
  getTimeout,
  getBodySizeLimit,
};
