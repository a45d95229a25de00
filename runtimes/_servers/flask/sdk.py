"""The `sdk` module of Kyma's new handler API (python314), as kiln's server provides it: the
tracer, CloudEvents in and out, and the Function's metadata. The server configures it at start.
"""

_core = None
_meta = {'name': '', 'namespace': '', 'runtime': 'python314', 'timeout': 180,
         'body_size_limit': 1}


def _configure(core, meta):
    global _core
    _core = core
    _meta.update(meta)


def get_tracer():
    """An OpenTelemetry tracer whose spans are children of the request's (the SDK loads on
    first use)."""
    return _core._TRACER


def get_cloud_event():
    """The current Flask request's CloudEvent (binary or structured mode, as the CloudEvents
    SDK reads it), or None when the request is not one."""
    from flask import request
    content_type = request.content_type or ''
    structured = 'application/cloudevents+json' in [p.strip() for p in content_type.split(';')]
    if not structured and not ('ce-type' in request.headers and 'ce-source' in request.headers):
        return None
    from cloudevents.core.bindings.http import HTTPMessage, from_http_event
    return from_http_event(HTTPMessage(headers=dict(request.headers), body=request.get_data()))


def emit_cloud_event(type, source, data, optional_attributes=None):  # noqa: A002 (Kyma's name)
    """Builds a structured CloudEvent and POSTs it to the eventing publisher
    (PUBLISHER_PROXY_ADDRESS), checked as the CloudEvents SDK checks it (ValueError naming the
    attribute; nothing sent). Returns the publisher's answer (status_code, headers, text)."""
    return _core.emit_cloud_event(type, source, data, optional_attributes)


def get_function_name():
    return _meta['name']


def get_namespace():
    return _meta['namespace']


def get_runtime():
    return _meta['runtime']


def get_timeout():
    """The call timeout in seconds (FUNC_TIMEOUT)."""
    return _meta['timeout']


def get_body_size_limit():
    """The request body limit in MiB (FUNC_BODY_MB_LIMIT), as Kyma's server gives it (its
    documentation says bytes; its code, and its nodejs26 sdk, give the MB figure)."""
    return _meta['body_size_limit']
