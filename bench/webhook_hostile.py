#!/usr/bin/env python3
"""`kiln webhook` under issue 29's hostile clients, one binary or two side by side.

For each binary: start `kiln webhook` on a fresh certificate (openssl), then at once
  - 300 TLS connections that never finish their request head,
  - 40 requests announcing a 3 MiB body and sending it a kilobyte at a time,
  - one 2.8 MB review whose spec holds an array of 1.4 million numbers,
while a valid review is sent every 250 ms for 15 s. Reports the webhook's peak resident
memory (VmHWM), the slowest valid review, how many failed, and what the attackers got.
Targets (issue 29): peak under half of deploy/webhook.yaml's 128 MiB limit, every valid
review answered within 1 s.

    cargo build --release
    python3 bench/webhook_hostile.py                      # target/release/kiln
    python3 bench/webhook_hostile.py --before /tmp/kiln-old/target/release/kiln
"""

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

LIMIT_KIB = 64 * 1024


def certs(directory):
    def run(*args):
        subprocess.run(args, check=True, cwd=directory, capture_output=True)

    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=bench-ca")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(directory, "ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "ext")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def review(spec_extra=""):
    spec = '{"runtime": "nodejs22", "replicas": 1, "source": {"inline": {"source": ' \
           '"module.exports = { main: () => 1 }"}}' + spec_extra + "}"
    return ('{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
            '{"uid": "u", "kind": {"group": "serverless.kyma-project.io", "version": '
            '"v1alpha2", "kind": "Function"}, "resource": {"group": '
            '"serverless.kyma-project.io", "version": "v1alpha2", "resource": "functions"}, '
            '"name": "hello", "namespace": "team", "operation": "CREATE", "userInfo": '
            '{"username": "bench"}, "object": {"apiVersion": '
            '"serverless.kyma-project.io/v1alpha2", "kind": "Function", "metadata": '
            '{"name": "hello", "namespace": "team"}, "spec": ' + spec + '}, "oldObject": null, '
            '"dryRun": false}}')


def connect(context, port):
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def post(context, port, body, timeout=10):
    body = body.encode()
    tls = connect(context, port)
    tls.settimeout(timeout)
    tls.sendall(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
                + body)
    answer = b""
    while True:
        chunk = tls.recv(65536)
        if not chunk:
            break
        answer += chunk
    tls.close()
    return answer.decode("latin-1")


def peak_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def attack(binary, seconds):
    directory = tempfile.mkdtemp(prefix="kiln-webhook-bench-")
    certs(directory)
    port = free_port()
    log = open(os.path.join(directory, "log"), "w")
    proc = subprocess.Popen([binary, "webhook", "--address", "127.0.0.1", "--port", str(port),
                             "--tls-cert", os.path.join(directory, "tls.crt"),
                             "--tls-key", os.path.join(directory, "tls.key")],
                            stdout=log, stderr=log)
    context = ssl.create_default_context(cafile=os.path.join(directory, "ca.pem"))
    deadline = time.time() + 10
    while True:
        try:
            post(context, port, review(), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                proc.kill()
                sys.exit(f"{binary} did not start; see {directory}/log")
            time.sleep(0.1)
    stop = threading.Event()
    held, outcomes = [], {"heads closed": 0, "bodies": {}, "huge": ""}
    lock = threading.Lock()

    def slow_head():
        try:
            tls = connect(context, port)
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            held.append(tls)
            tls.settimeout(seconds + 5)
            tls.recv(1024)  # returns when the server answers (408) or closes
            with lock:
                outcomes["heads closed"] += 1
        except socket.timeout:
            pass  # still open at the end
        except OSError:
            with lock:
                outcomes["heads closed"] += 1

    def slow_body():
        status = "held to the end"
        try:
            tls = connect(context, port)
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                        b"application/json\r\nContent-Length: 3145728\r\n\r\n")
            tls.settimeout(0.2)
            while not stop.is_set():
                tls.sendall(b" " * 1024)
                try:
                    answer = tls.recv(1024)
                    status = answer.decode("latin-1").split("\r\n")[0] if answer else "closed"
                    break
                except socket.timeout:
                    pass
        except OSError as e:
            status = f"closed ({e.__class__.__name__})"
        with lock:
            outcomes["bodies"][status] = outcomes["bodies"].get(status, 0) + 1

    def huge():
        body = review(', "padding": [' + "0," * 1_400_000 + "0]")
        try:
            answer = post(context, port, body, timeout=30)
            outcomes["huge"] = answer.split("\r\n")[0]
        except OSError as e:
            outcomes["huge"] = f"failed ({e})"

    threads = [threading.Thread(target=slow_head, daemon=True) for _ in range(300)]
    threads += [threading.Thread(target=slow_body, daemon=True) for _ in range(40)]
    threads.append(threading.Thread(target=huge, daemon=True))
    for t in threads:
        t.start()
    latencies, failures = [], 0
    end = time.time() + seconds
    while time.time() < end:
        started = time.time()
        try:
            answer = post(context, port, review(), timeout=5)
            ok = answer.startswith("HTTP/1.1 200") and '"allowed":true' in answer
        except OSError:
            ok = False
        latencies.append(time.time() - started)
        failures += 0 if ok else 1
        time.sleep(0.25)
    stop.set()
    peak = peak_kib(proc.pid)
    with lock:
        heads_closed = outcomes["heads closed"]
    for tls in held:
        try:
            tls.close()
        except OSError:
            pass
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    latencies.sort()
    return {
        "binary": binary,
        "peak_rss_kib": peak,
        "valid_reviews": len(latencies),
        "valid_failed": failures,
        "valid_median_s": latencies[len(latencies) // 2],
        "valid_slowest_s": latencies[-1],
        "huge_review": outcomes["huge"],
        "slow_bodies": outcomes["bodies"],
        "slow_heads_closed": heads_closed,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", default="target/release/kiln")
    parser.add_argument("--before", help="another kiln binary, run first, to compare")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--json", help="where to write the results")
    args = parser.parse_args()
    results = [attack(b, args.seconds) for b in ([args.before] if args.before else []) + [args.kiln]]
    for r in results:
        print(f"{r['binary']}: peak RSS {r['peak_rss_kib'] / 1024:.1f} MiB; valid reviews "
              f"{r['valid_reviews']}, {r['valid_failed']} failed, median "
              f"{r['valid_median_s'] * 1000:.0f} ms, slowest {r['valid_slowest_s'] * 1000:.0f} ms; "
              f"huge review: {r['huge_review']}; slow heads closed by the server: "
              f"{r['slow_heads_closed']} of 300; slow bodies: {r['slow_bodies']}")
    if len(results) == 2:
        before, after = results
        print(f"peak RSS before/after: {before['peak_rss_kib'] / max(after['peak_rss_kib'], 1):.2f}x")
    after = results[-1]
    memory = after["peak_rss_kib"] < LIMIT_KIB
    latency = after["valid_failed"] == 0 and after["valid_slowest_s"] < 1.0
    print(f"targets: peak < 64 MiB {'PASS' if memory else 'MISS'} "
          f"({after['peak_rss_kib'] / 1024:.1f} MiB); every valid review within 1 s "
          f"{'PASS' if latency else 'MISS'} ({after['valid_slowest_s'] * 1000:.0f} ms, "
          f"{after['valid_failed']} failed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
