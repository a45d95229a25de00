#!/usr/bin/env python3
"""A git smart-HTTP server for kiln's integration tests: `git http-backend` behind a small
stdlib HTTP(S) server with optional HTTP Basic auth.

Usage: gitsrv.py STATE_DIR PROJECT_ROOT [--basic USER PASSWORD] [--forbid USER PASSWORD]
                 [--tls CERT KEY] [--redirect-to BASE_URL]

Listens on 127.0.0.1 on a port picked by the kernel and writes STATE_DIR/port (atomically,
last) once it is ready. Every repository under PROJECT_ROOT is served (GIT_HTTP_EXPORT_ALL);
git http-backend answers protocol v0 and v2 (the Git-Protocol header is passed through).

With --basic, every request without the right `Authorization: Basic` header gets 401 and a
`WWW-Authenticate: Basic` challenge, as a real git host does. With --forbid, those
credentials authenticate but are denied access: 403, as for a user who may not read the
repository. With --redirect-to, every request is answered `302 Found` to the same path and
query under BASE_URL (a host that moved its repositories), whatever it carries.

Every request appends one line to STATE_DIR/access.log:
  METHOD<TAB>PATH<TAB>STATUS<TAB>RESPONSE_BODY_BYTES<TAB>AUTH
where AUTH is `none`, `ok`, `bad` or `forbidden` (never the credentials themselves). Request bodies that
the client sends for git-upload-pack are appended, decompressed, to STATE_DIR/upload-pack.log
(pkt-lines as text: `want …`, `deepen 1`, …), so a test can see what the client asked for.
"""

import base64
import gzip
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

STATE_DIR, PROJECT_ROOT = sys.argv[1:3]
OPTIONS = sys.argv[3:]
BASIC = None
FORBID = None
TLS = None
REDIRECT_TO = None
while OPTIONS:
    if OPTIONS[0] == "--basic":
        BASIC = (OPTIONS[1], OPTIONS[2])
        OPTIONS = OPTIONS[3:]
    elif OPTIONS[0] == "--forbid":
        FORBID = (OPTIONS[1], OPTIONS[2])
        OPTIONS = OPTIONS[3:]
    elif OPTIONS[0] == "--tls":
        TLS = (OPTIONS[1], OPTIONS[2])
        OPTIONS = OPTIONS[3:]
    elif OPTIONS[0] == "--redirect-to":
        REDIRECT_TO = OPTIONS[1].rstrip("/")
        OPTIONS = OPTIONS[2:]
    else:
        sys.exit("unknown option " + OPTIONS[0])
LOG_LOCK = threading.Lock()


def log(name, line):
    with LOG_LOCK:
        with open(os.path.join(STATE_DIR, name), "a") as f:
            f.write(line + "\n")


def auth_state(header):
    if not header:
        return "none"
    if BASIC is None:
        return "ok"
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return "bad"
    try:
        user, _, password = base64.b64decode(value).decode("utf-8").partition(":")
    except Exception:
        return "bad"
    if (user, password) == FORBID:
        return "forbidden"
    return "ok" if (user, password) == BASIC else "bad"


def pkt_lines(body):
    """The pkt-line payloads of a request body, as text (flush packets as `0000`)."""
    out, i = [], 0
    while i + 4 <= len(body):
        try:
            n = int(body[i : i + 4], 16)
        except ValueError:
            break
        if n < 4:
            out.append("%04d" % n)
            i += 4
            continue
        out.append(body[i + 4 : i + n].decode("utf-8", "replace").rstrip("\n"))
        i += n
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send(self, status, headers, body):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        auth = auth_state(self.headers.get("Authorization"))
        log("access.log", "\t".join([self.command, self.path, str(status), str(len(body)), auth]))

    def serve(self):
        body = self.read_body() if self.command == "POST" else b""
        auth = auth_state(self.headers.get("Authorization"))
        if REDIRECT_TO is not None:
            self.send(302, [("Location", REDIRECT_TO + self.path)], b"")
            return
        if auth == "forbidden":
            self.send(403, [], b"forbidden\n")
            return
        if BASIC is not None and auth != "ok":
            self.send(401, [("WWW-Authenticate", 'Basic realm="kiln-test-git"')], b"unauthorized\n")
            return
        url = urlsplit(self.path)
        if self.command == "POST" and url.path.endswith("/git-upload-pack"):
            plain = body
            if self.headers.get("Content-Encoding", "").lower() == "gzip":
                plain = gzip.decompress(body)
            log("upload-pack.log", "\n".join(pkt_lines(plain)))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": PROJECT_ROOT,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": "127.0.0.1",
            "REMOTE_USER": BASIC[0] if BASIC else "",
            "HTTP_GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
        }
        proc = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        )
        head, _, payload = proc.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = proc.stdout.partition(b"\n\n")
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        if proc.returncode != 0 and status == 200 and not payload:
            status, payload = 500, proc.stderr
        self.send(status, headers, payload)

    do_GET = serve
    do_POST = serve


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if TLS:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(TLS[0], TLS[1])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    port_file = os.path.join(STATE_DIR, "port")
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
