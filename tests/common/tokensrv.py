#!/usr/bin/env python3
"""A minimal Docker/OCI distribution token server for kiln's integration tests.

Usage: tokensrv.py STATE_DIR ISSUER USER PASSWORD [PULL_USER PULL_PASSWORD]

Listens on 127.0.0.1 on a port picked by the kernel. At start it creates a fresh RSA key and a
self-signed certificate, writes STATE_DIR/signcert.pem (the registry's rootcertbundle), then
writes STATE_DIR/port (atomically, last) so that the caller knows it is ready.

GET /token?service=S&scope=repository:NAME:pull,push&scope=...   (Basic USER:PASSWORD)
POST /token  (form: grant_type=password, username, password, service, scope; or
             grant_type=refresh_token, refresh_token=refresh-PASSWORD, service, scope)
  -> 200 {"token": JWT, "access_token": JWT, "expires_in": TTL, "issued_at": ...}
     (TTL: $KILN_TOKEN_TTL seconds, default 300)
  -> 401 without credentials or with wrong ones.
Scopes may be repeated parameters and/or space-separated within one parameter. The JWT grants
exactly the requested scopes to USER, and only their `pull` actions to PULL_USER (a robot with
read-only access, as registries give them): the registry then refuses its pushes. Every request appends one line "STATUS<TAB>SCOPES" (scopes
joined by one space, never credentials) to STATE_DIR/requests.log, and its grant (basic,
password, refresh_token or none) to STATE_DIR/grants.log.
"""

import base64
import datetime
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

STATE_DIR, ISSUER, USER, PASSWORD = sys.argv[1:5]
PULL_USER, PULL_PASSWORD = (sys.argv[5:7] + [None, None])[:2]
# Token lifetime in seconds (KILN_TOKEN_TTL, default 300).
TTL = int(os.environ.get("KILN_TOKEN_TTL", "300"))
# The OAuth2 refresh token (docker config `identitytoken`) this server accepts for USER.
REFRESH_TOKEN = "refresh-" + PASSWORD
LOG_LOCK = threading.Lock()


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def make_key_and_cert():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln-test-token-signer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


KEY, CERT = make_key_and_cert()
CERT_DER_B64 = base64.b64encode(CERT.public_bytes(serialization.Encoding.DER)).decode("ascii")


def parse_scopes(values):
    """['repository:a:pull,push repository:b:pull'] -> ordered scope strings."""
    out = []
    for v in values:
        out.extend(s for s in v.split(" ") if s)
    return out


def access_for(scopes):
    """Turn scope strings into the JWT `access` claim, merging actions per resource."""
    access = []
    index = {}
    for scope in scopes:
        parts = scope.split(":")
        if len(parts) < 3:
            continue
        typ, name, actions = parts[0], ":".join(parts[1:-1]), parts[-1]
        key = (typ, name)
        if key not in index:
            index[key] = {"type": typ, "name": name, "actions": []}
            access.append(index[key])
        for a in actions.split(","):
            if a and a not in index[key]["actions"]:
                index[key]["actions"].append(a)
    return access


def pull_only(scopes):
    """The scopes with every action but `pull` removed."""
    out = []
    for scope in scopes:
        parts = scope.split(":")
        if len(parts) < 3:
            continue
        actions = [a for a in parts[-1].split(",") if a == "pull"]
        out.append(":".join(parts[:-1] + [",".join(actions)]))
    return out


def make_jwt(service, scopes, subject):
    now = int(time.time())
    header = {"typ": "JWT", "alg": "RS256", "x5c": [CERT_DER_B64]}
    claims = {
        "iss": ISSUER,
        "sub": subject,
        "aud": service,
        "exp": now + TTL,
        "nbf": now - 30,
        "iat": now,
        "jti": uuid.uuid4().hex,
        "access": access_for(scopes),
    }
    signing_input = (
        b64url(json.dumps(header, separators=(",", ":")).encode())
        + "."
        + b64url(json.dumps(claims, separators=(",", ":")).encode())
    )
    sig = KEY.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + b64url(sig)


def basic_credentials(header):
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        user, _, pw = base64.b64decode(header[6:].strip()).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return user, pw


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the harness reads requests.log instead
        pass

    def reply(self, status, body, extra=None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def handle_token(self, params, creds, grant):
        scopes = parse_scopes(params.get("scope", []))
        service = (params.get("service") or [""])[0]
        puller = PULL_USER is not None and creds == (PULL_USER, PULL_PASSWORD)
        ok = creds == (USER, PASSWORD) or puller
        if puller:
            scopes = pull_only(scopes)
        with LOG_LOCK, open(os.path.join(STATE_DIR, "requests.log"), "a") as f:
            f.write(f"{200 if ok else 401}\t{' '.join(scopes)}\n")
        with LOG_LOCK, open(os.path.join(STATE_DIR, "grants.log"), "a") as f:
            f.write(f"{grant}\n")
        if not ok:
            self.reply(
                401,
                {"errors": [{"code": "UNAUTHORIZED", "message": "bad or missing credentials"}]},
                {"WWW-Authenticate": 'Basic realm="kiln-test-token"'},
            )
            return
        token = make_jwt(service, scopes, creds[0])
        self.reply(
            200,
            {
                "token": token,
                "access_token": token,
                "expires_in": TTL,
                "issued_at": datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            },
        )

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path != "/token":
            self.reply(404, {"error": "not found"})
            return
        params = parse_qs(url.query, keep_blank_values=True)
        creds = basic_credentials(self.headers.get("Authorization"))
        self.handle_token(params, creds, "basic" if creds else "none")

    def do_POST(self):
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        if url.path != "/token":
            self.reply(404, {"error": "not found"})
            return
        form = parse_qs(body, keep_blank_values=True)
        creds = basic_credentials(self.headers.get("Authorization"))
        grant = form.get("grant_type", [""])[0]
        if grant == "password":
            creds = (form.get("username", [""])[0], form.get("password", [""])[0])
        elif grant == "refresh_token":
            ok = form.get("refresh_token", [""])[0] == REFRESH_TOKEN
            creds = (USER, PASSWORD) if ok else None
        self.handle_token(form, creds, grant or "none")


def main():
    with open(os.path.join(STATE_DIR, "signcert.pem"), "wb") as f:
        f.write(CERT.public_bytes(serialization.Encoding.PEM))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_file = os.path.join(STATE_DIR, "port")
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
