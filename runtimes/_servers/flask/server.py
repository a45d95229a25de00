"""kiln's function server for Kyma's new handler API (python314): `main()` takes no arguments,
reads Flask's `request` context-local and returns what a Flask view returns (a string, a dict,
a tuple, a Response), and `import sdk` gives the tracer, CloudEvents and the Function's
metadata. Flask is the image's Kyma runtime package, as in Kyma's image. What both APIs share —
cheroot's threaded server, metrics, tracing and its propagation into outgoing calls, CloudEvents
out, the body limit's drained 413, FUNC_TIMEOUT's watchdog, the SIGTERM drain — is the legacy
server's, imported as a module (kiln_core.py beside this file). Contract and decisions:
runtimes/_servers/README.md.
"""

import os
import sys
import time

# Kyma's python314 server reads these names; they win over the legacy ones the shared core
# reads, which the image also sets. The port stays FUNC_PORT's: the contract fixes it.
for _new, _old in (('FUNC_BODY_MB_LIMIT', 'REQ_MB_LIMIT'), ('HANDLER_PATH', 'FUNCTION_PATH'),
                   ('HANDLER_MOD_NAME', 'MOD_NAME'), ('HANDLER_FUNC_NAME', 'FUNC_HANDLER'),
                   ('SERVER_NUMTHREADS', 'CHERRYPY_NUMTHREADS'),
                   ('SERVER_INTERNAL_LOGGER', 'KYMA_INTERNAL_LOGGER_ENABLED')):
    if os.environ.get(_new):
        os.environ[_old] = os.environ[_new]
if not os.environ.get('FUNC_PORT') and os.environ.get('SERVER_PORT'):
    os.environ['FUNC_PORT'] = os.environ['SERVER_PORT']

import flask  # noqa: E402 - after the environment is settled
from werkzeug.exceptions import HTTPException  # noqa: E402

import kiln_core as core  # noqa: E402
import sdk  # noqa: E402

if os.environ.get('FUNC_BODY_MB_LIMIT'):
    core.LIMIT_VAR = 'FUNC_BODY_MB_LIMIT'  # what the 413 names

sdk._configure(core, {
    'name': os.environ.get('FUNC_NAME') or '',
    'namespace': os.environ.get('SERVICE_NAMESPACE') or '',
    'runtime': os.environ.get('FUNC_RUNTIME') or 'python314',
    'timeout': int(core.TIMEOUT) if core.TIMEOUT == int(core.TIMEOUT) else core.TIMEOUT,
    # In MiB, as FUNC_BODY_MB_LIMIT says it.
    'body_size_limit': _mb if (_mb := core._num('REQ_MB_LIMIT', core.BODY_LIMIT / (1 << 20))) % 1
    else int(_mb),
})

# No static route: Flask would otherwise serve /static/<path> from the working directory (the
# Function's own, /kubeless) itself, and those requests would never reach main(). Kyma's app sits
# beside its server, where there is no static folder.
app = flask.Flask('function', static_folder=None, root_path=os.path.dirname(__file__))
METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS']
_function = None  # set in main()


@app.get('/healthz')
def healthz():
    return 'OK', 200, {'Content-Type': core.TEXT_TYPE}


@app.get('/metrics')
def metrics():
    return core.render_metrics(), 200, {
        'Content-Type': 'text/plain; version=0.0.4; charset=utf-8'}


@app.get('/favicon.ico')
def favicon():
    return '', 204


@app.route('/', defaults={'path': ''}, methods=METHODS, provide_automatic_options=False)
@app.route('/<path:path>', methods=METHODS, provide_automatic_options=False)
def function(path):  # noqa: ARG001 - the Function reads flask.request
    req = flask.request
    if req.method == 'OPTIONS' and req.headers.get('Access-Control-Request-Method'):
        # A CORS preflight: allow whatever is asked for.
        return '', 204, {
            'Access-Control-Allow-Origin': '*',
            'Access-Control-Allow-Methods': req.headers['Access-Control-Request-Method'],
            'Access-Control-Allow-Headers': req.headers.get('Access-Control-Request-Headers')
            or '*',
            'Access-Control-Max-Age': '86400'}
    with core._lock:
        core._m['calls'] += 1
    trace = core.start_trace(req)
    started = time.monotonic()
    outcome, value = core.call_function(_function, req.environ, trace, (HTTPException,))
    if outcome == 'timeout':  # the watchdog answered 408; nothing more is written
        return flask.Response(status=408)
    answer, failed = None, outcome != 'ok'
    if isinstance(value, HTTPException):  # flask.abort(…), or an HTTP error raised
        if value.code is not None:
            answer = value.get_response()
        failed = value.code is None or value.code >= 500
    elif outcome == 'ok':
        try:
            answer = app.make_response(value)
        except (TypeError, ValueError) as exc:  # None, or what no Flask view may return
            sys.stderr.write(f'The function returned no valid response: {exc}\n')
    failed = failed or answer is None
    core._observe(time.monotonic() - started, failed)
    if answer is None:
        answer = flask.Response('Internal server error', 500, mimetype='text/plain')
    answer.headers.setdefault('Access-Control-Allow-Origin', '*')
    core.end_trace(trace, answer.status_code)
    return answer


@app.errorhandler(500)
def internal_error(_error):
    return 'Internal server error', 500, {'Content-Type': core.TEXT_TYPE}


def main():
    global _function
    _function = core.load_function()
    core.serve(app, 'flask', '(main() with Flask) ')


if __name__ == '__main__':
    main()
