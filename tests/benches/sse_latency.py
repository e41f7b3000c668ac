"""How long an event takes from being appended to reaching SSE clients of
`warden serve`, and how many concurrent stream clients one server holds.

    python3 tests/benches/sse_latency.py target/debug/warden [RUNS] [CLIENTS_PER_RUN]

Submits RUNS queued runs of the demo agent (no worker), opens
CLIENTS_PER_RUN streams on each (RUNS x CLIENTS_PER_RUN connections held at
once), then cancels the runs one by one through the API and times each
`run_cancelled` event from the moment the cancel request is sent (an upper
bound of append -> client) to its arrival on every stream of that run. A
second pass cancels through `warden runs cancel` (another process: the
stream sees it at the next poll) and times from that command's exit.
"""

import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

warden = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 50
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 10
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
dir = tempfile.mkdtemp()
examples = os.path.join(root, "examples", "agents")
for f in ["notes.toml", "notes.transcript.toml"]:
    shutil.copy(os.path.join(examples, f), dir)
shutil.copytree(os.path.join(examples, "notes"), os.path.join(dir, "notes"))
os.mkdir(os.path.join(dir, "out"))
env = dict(os.environ, WARDEN_STORE="bench.db")


def w(*args):
    return subprocess.run([warden, *args], cwd=dir, env=env, check=True, capture_output=True, text=True).stdout


token = w("serve", "tokens", "add", "bench", "--role", "operator").strip()
for i in range(2 * runs):
    w("submit", "notes.toml", "--run-id", f"r{i}")
server = subprocess.Popen([warden, "--json", "serve", "--bind", "127.0.0.1:0"], cwd=dir, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
addr = json.loads(server.stdout.readline())["listening"].removeprefix("http://")
host, port = addr.rsplit(":", 1)

arrivals = {}
lock = threading.Lock()
ready = threading.Barrier(2 * runs * clients + 1)


def client(run):
    s = socket.create_connection((host, int(port)))
    s.sendall(f"GET /api/v1/runs/{run}/stream?after=1 HTTP/1.1\r\nHost: {addr}\r\n"
              f"Authorization: Bearer {token}\r\n\r\n".encode())
    f = s.makefile("rb")
    while f.readline() not in (b"\r\n", b""):
        pass
    ready.wait()
    for line in f:
        if line.startswith(b"data: ") and b"run_cancelled" in line:
            with lock:
                arrivals.setdefault(run, []).append(time.perf_counter())
            break
    s.close()


threads = [threading.Thread(target=client, args=(f"r{i}",), daemon=True)
           for i in range(2 * runs) for _ in range(clients)]
for t in threads:
    t.start()
ready.wait()
print(f"{len(threads)} concurrent streams open")


def percentiles(samples):
    samples = sorted(samples)
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.99) - 1] * 1000, samples[-1] * 1000


sent = {}
for i in range(runs):
    run = f"r{i}"
    conn = http.client.HTTPConnection(host, int(port))
    sent[run] = time.perf_counter()
    conn.request("POST", f"/api/v1/runs/{run}/cancel", body="{}", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    conn.close()
    while len(arrivals.get(run, [])) < clients:
        time.sleep(0.001)
api = [t - sent[r] for r in sent for t in arrivals[r]]
print("appended by the server: median %.2f ms, p99 %.2f ms, max %.2f ms over %d deliveries" % (*percentiles(api), len(api)))

sent = {}
for i in range(runs, 2 * runs):
    run = f"r{i}"
    w("runs", "cancel", run)
    sent[run] = time.perf_counter()
    while len(arrivals.get(run, [])) < clients:
        time.sleep(0.001)
other = [max(0.0, t - sent[r]) for r in sent for t in arrivals[r]]
print("appended by another process: median %.2f ms, p99 %.2f ms, max %.2f ms over %d deliveries" % (*percentiles(other), len(other)))
server.terminate()
server.wait()
shutil.rmtree(dir)
