#!/usr/bin/env python3
"""Sluice's filter in a real Nginx with ngx_wasm_module: the by-hand checks, scripted.

Not part of CI (the Nginx build needs sources CI cannot reach): build Nginx by
docs/real-nginx.md into $RH (default /tmp/rh), build the project's debug binaries
(`cargo build --workspace --bins`) and the filter (`cargo build -p sluice-filter --target
wasm32-wasip1 --profile wasm`), then run `python3 scripts/real-nginx-check.py`. It starts
the demo upstream, check services (examples/rules.toml, over TCP and over a Unix socket; a
leased rule; the step-around rules), a fake service that answers `{}`, and Nginx with a
server for each, sends hostile and ordinary traffic, and prints one PASS/FAIL line per
check and a closing line `N passed, M failed`; exits 1 when a check failed (or the run
stopped early), 0 when all passed. Ports 28080-28098, 29000 and 29001 on 127.0.0.1; source
addresses 127.0.x.y stand for clients.
"""
import json, os, re, shutil, signal, socket, subprocess, sys, threading, time, urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

RH = os.environ.get("RH", "/tmp/rh"); RUN = f"{RH}/run"
P = os.path.dirname(os.path.dirname(os.path.abspath(__file__))); T = f"{P}/target"
NGINX = f"{RH}/nginx-install/sbin/nginx"
procs = []
def start(args, **kw):
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(f"{RUN}/logs/{os.path.basename(args[0])}-{len(procs)}.log", "w"), **kw)
    procs.append(p); return p
def wait_port(port):
    for _ in range(200):
        try: socket.create_connection(("127.0.0.1", port), 0.2).close(); return
        except OSError: time.sleep(0.1)
    sys.exit(f"port {port} did not open")

def raw(port, head, src="127.0.0.1", body=b"", keep=None):
    s = socket.socket(); s.bind((src, 0)); s.settimeout(10); s.connect(("127.0.0.1", port))
    s.sendall(head + body); data = b""
    while True:
        try: c = s.recv(65536)
        except socket.timeout: break
        if not c: break
        data += c
        if b"\r\n\r\n" in data:
            h, _, rest = data.partition(b"\r\n\r\n")
            m = re.search(rb"content-length: *(\d+)", h, re.I)
            if m and len(rest) >= int(m.group(1)): break
    s.close()
    m = re.match(rb"HTTP/1\.[01] (\d+)", data)
    return (int(m.group(1)) if m else None), data

def get(port, path="/api/hello", src="127.0.0.1", headers=b"", method=b"GET"):
    return raw(port, method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n", src)

NGINX_CONF = """worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;
events { worker_connections 1024; }
wasm { module sluice __WASM__; backtraces on; shm_kv sluice 32m eviction=none; }
http {
    access_log logs/access.log;
    proxy_wasm_request_headers_in_access on;
    upstream api { server 127.0.0.1:29000; }
    server {
        listen 127.0.0.1:28080;
        keepalive_requests 100;
        location / {
            proxy_wasm sluice '__CONFIG__';
            proxy_pass http://api;
        }
    }
    server {
        listen 127.0.0.1:28090;
        keepalive_requests 100;
        add_header x-worker $pid always;
        location / {
            proxy_wasm sluice '__LEASECONFIG__';
            proxy_pass http://api;
        }
    }
}
"""

results = []
def check(name, ok, detail=""):
    results.append((name, ok)); print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)

class Slow(BaseHTTPRequestHandler):  # an upstream that holds every request 1 s
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        time.sleep(1)
        self.send_response(200); self.send_header("content-length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass

class Empty(BaseHTTPRequestHandler):  # a "check service" that answers 200 {}
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass

def main():
    os.makedirs(f"{RUN}/logs", exist_ok=True); os.makedirs(f"{RUN}/conf", exist_ok=True)
    for f in os.listdir(f"{RUN}/logs"): os.remove(f"{RUN}/logs/{f}")
    subprocess.run(["cp", f"{T}/wasm32-wasip1/wasm/sluice_filter.wasm", f"{RUN}/sluice_filter.wasm"], check=True)
    leased = '''
[[rule]]
name = "leased-per-ip"
by = "ip"
path = "/leased*"
algorithm = "token_bucket"
limit = 200
window = "1s"
lease = true
lease_ttl = "5s"
'''
    open(f"{RUN}/conf/rules-leased.toml", "w").write(leased)
    open(f"{RUN}/conf/rules-around.toml", "w").write(AROUND_RULES)
    open(f"{RUN}/conf/data-token", "w").write(DATA_TOKEN)
    start([f"{T}/debug/sluice-demo-upstream", "--listen", "127.0.0.1:29000"])
    start([f"{T}/debug/sluice-service", "--rules", f"{P}/examples/rules.toml", "--listen", "127.0.0.1:28081"])
    start([f"{T}/debug/sluice-service", "--rules", f"{RUN}/conf/rules-leased.toml", "--listen", "127.0.0.1:28082"])
    start([f"{T}/debug/sluice-service", "--rules", f"{RUN}/conf/rules-around.toml", "--listen", "127.0.0.1:28084",
           "--data-token-file", f"{RUN}/conf/data-token"])
    start([f"{T}/debug/sluice-service", "--rules", f"{P}/examples/rules.toml", "--listen", f"unix:{SOCKET}",
           "--admin-listen", "127.0.0.1:28085"])
    threading.Thread(target=HTTPServer(("127.0.0.1", 28083), Empty).serve_forever, daemon=True).start()
    threading.Thread(target=ThreadingHTTPServer(("127.0.0.1", 29001), Slow).serve_forever, daemon=True).start()
    for p in (29000, 28081, 28082, 28084, 28085): wait_port(p)
    # Nginx's workers run as nobody when it starts as root: let them reach the socket.
    os.chmod(RUN, 0o755); os.chmod(SOCKET, 0o666)
    base = json.load(open(f"{P}/examples/filter.json"))
    base["check"]["cluster"] = "127.0.0.1:28081"
    base["check"]["timeout_ms"] = 500  # debug service binaries
    base["share"] = "process"  # as examples/nginx.conf says it, beside its zone
    lease = json.loads(json.dumps(base)); lease["check"]["cluster"] = "127.0.0.1:28082"
    lease["lease"] = {"poll_ms": 200, "tick_ms": 20}
    empty = json.loads(json.dumps(base)); empty["check"]["cluster"] = "127.0.0.1:28083"
    empty["failure"]["mode"] = "closed"
    around = json.loads(json.dumps(base)); around["check"]["cluster"] = "127.0.0.1:28084"
    around["check"]["token"] = DATA_TOKEN
    around["identities"]["ip"] = {"header": "x-forwarded-for", "trusted_hops": 1}
    around["identities"]["api_key"] = {"header": "x-api-key"}
    unix = json.loads(json.dumps(base)); unix["check"]["cluster"] = f"unix:{SOCKET}"
    # The local prefilter of 1/s, burst 5 in front of a service that never refuses /api/hello
    # (the leased rules limit /leased* only): the prefilter alone decides.
    tight = json.loads(json.dumps(base)); tight["local"] = {"by": "ip", "rate_per_s": 1, "burst": 5}
    tight["check"]["cluster"] = "127.0.0.1:28082"
    tight_worker = json.loads(json.dumps(tight)); tight_worker["share"] = "worker"
    # The leased server's twin whose every worker keeps its own book of leases (28096).
    lease_worker = json.loads(json.dumps(lease)); lease_worker["share"] = "worker"
    # examples/rules.toml's concurrency rule (4 of a user's /api/generate* at once) in front
    # of an upstream holding each request 1 s, the slots given back on the root's tick (28097).
    slots = json.loads(json.dumps(base)); slots["concurrency"] = {"tick_ms": 10}
    # The filter's own limit of 3 of a user's requests at once, no concurrency rule
    # (/api/hello), in front of the same upstream (28098).
    own = json.loads(json.dumps(base)); own["concurrency"] = {"local": {"by": "user", "limit": 3, "expiry_ms": 2000}}
    open(f"{RUN}/conf/zone.conf", "w").write(NGINX_CONF)
    for name, cfg in (("base", base), ("lease", lease), ("empty", empty), ("around", around), ("unix", unix),
                      ("tight", tight), ("tight_worker", tight_worker), ("lease_worker", lease_worker),
                      ("slots", slots), ("own", own)):
        open(f"{RUN}/conf/{name}.json", "w").write(json.dumps(cfg))
        r = subprocess.run([f"{T}/debug/sluice-harness", "check-config", "--wasm", f"{RUN}/sluice_filter.wasm",
                            "--config", f"{RUN}/conf/{name}.json", "--nginx-conf", f"{RUN}/conf/zone.conf"], capture_output=True, text=True,
                           env=dict(os.environ, RUST_BACKTRACE="0"))
        check(f"check-config accepts the {name} configuration", r.returncode == 0, (r.stdout + r.stderr).strip()[-200:])
    bad = dict(base); bad["local"] = {"by": "ip", "rate_per_s": -5}
    open(f"{RUN}/conf/bad.json", "w").write(json.dumps(bad))
    r = subprocess.run([f"{T}/debug/sluice-harness", "check-config", "--wasm", f"{RUN}/sluice_filter.wasm",
                        "--config", f"{RUN}/conf/bad.json", "--host-flavor", "nginx"], capture_output=True, text=True,
                       env=dict(os.environ, RUST_BACKTRACE="0"))
    check("check-config refuses a bad configuration, naming the field", r.returncode == 1 and "rate_per_s" in (r.stdout + r.stderr), (r.stdout + r.stderr).strip()[-200:])
    conf = NGINX_CONF.replace("__WASM__", f"{RUN}/sluice_filter.wasm")
    conf = conf.replace("__CONFIG__", json.dumps(base)).replace("__LEASECONFIG__", json.dumps(lease))
    conf = conf.replace("    server {\n        listen 127.0.0.1:28090;", "    server {\n        listen 127.0.0.1:28091;\n        location / {\n            proxy_wasm sluice '" + json.dumps(empty) + "';\n            proxy_pass http://api;\n        }\n    }\n    server {\n        listen 127.0.0.1:28090;", 1)
    conf = conf.replace("    server {\n        listen 127.0.0.1:28090;", "    server {\n        listen 127.0.0.1:28092;\n        location / {\n            proxy_wasm sluice '" + json.dumps(around) + "';\n            proxy_pass http://api;\n        }\n    }\n    server {\n        listen 127.0.0.1:28090;", 1)
    conf = conf.replace("    server {\n        listen 127.0.0.1:28090;", "    server {\n        listen 127.0.0.1:28093;\n        location / {\n            proxy_wasm sluice '" + json.dumps(unix) + "';\n            proxy_pass http://api;\n        }\n    }\n    server {\n        listen 127.0.0.1:28090;", 1)
    # The tight prefilter on both workers, the process's (28094) and each worker's (28095),
    # and the leased rule with each worker's leases (28096; the process's is 28090);
    # each answer names its worker.
    for port, cfg in ((28094, tight), (28095, tight_worker), (28096, lease_worker)):
        conf = conf.replace("    server {\n        listen 127.0.0.1:28090;", "    server {\n        listen 127.0.0.1:" + str(port) + ";\n        add_header x-worker $pid always;\n        location / {\n            proxy_wasm sluice '" + json.dumps(cfg) + "';\n            proxy_pass http://api;\n        }\n    }\n    server {\n        listen 127.0.0.1:28090;", 1)
    conf = conf.replace("    server {\n        listen 127.0.0.1:28090;", "    server {\n        listen 127.0.0.1:28097;\n        location / {\n            proxy_wasm sluice '" + json.dumps(slots) + "';\n            proxy_pass http://127.0.0.1:29001;\n        }\n    }\n    server {\n        listen 127.0.0.1:28090;", 1)
    conf = conf.replace("    server {\n        listen 127.0.0.1:28090;", "    server {\n        listen 127.0.0.1:28098;\n        add_header x-worker $pid always;\n        location / {\n            proxy_wasm sluice '" + json.dumps(own) + "';\n            proxy_pass http://127.0.0.1:29001;\n        }\n    }\n    server {\n        listen 127.0.0.1:28090;", 1)
    open(f"{RUN}/conf/nginx.conf", "w").write(conf)
    subprocess.run([NGINX, "-p", f"{RUN}/", "-c", "conf/nginx.conf"], check=True)
    wait_port(28080); time.sleep(0.5)
    master = int(open(f"{RUN}/logs/nginx.pid").read())
    workers0 = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    workers1, killed = None, []
    try:
        run_checks()
        share_checks()
        lease_share_check()
        concurrency_check()
        no_zone_check(base)
        workers1 = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
        killed = dead_workers_check(master)
    finally:
        if workers1 is None:
            workers1 = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
        log = open(f"{RUN}/logs/error.log", errors="replace").read()
        # The workers the last check killed are the only ones that may have exited on a signal.
        expected = [f"{pid} exited on signal 9" for pid in killed]
        bad_lines = [l for l in log.splitlines() if re.search(r"panicked|trap|exited on signal|\[emerg\]|\[alert\]|\[crit\]", l)
                     and not any(e in l for e in expected)]
        check("no trap, panic or worker crash in error.log", not bad_lines, "; ".join(bad_lines[:5])[:600])
        # The host's own errors about the module's calls (not the filter's logs, which are
        # `[proxy-wasm]` lines): e.g. a property read ngx_wasm_module refuses outside a request.
        host_errors = [l for l in log.splitlines() if re.search(r"\[error\].*\[wasm\]", l)]
        check("no host error about the module's calls in error.log", not host_errors, "; ".join(host_errors[:5])[:600])
        check("the same worker process throughout", workers0 == workers1, f"{workers0} -> {workers1}")
        subprocess.run([NGINX, "-p", f"{RUN}/", "-c", "conf/nginx.conf", "-s", "stop"])
        for p in procs: p.terminate()
        print(f"\n{sum(ok for _, ok in results)} passed, {sum(not ok for _, ok in results)} failed")

DATA_TOKEN = "real-nginx-data-token"
SOCKET = f"{RUN}/check.sock"
AROUND_RULES = open(f"{P}/tests/step-around.toml").read()

def around_checks():
    xff = lambda ip: f"X-Forwarded-For: {ip}\r\n".encode()
    codes = [get(28092, path="/api/search", headers=xff("203.0.113.1"))[0] for _ in range(3)]
    variants = ["/api/search/", "//api/search", "/api//search", "/api/%73earch", "/api/./search", "/api/x/../search", "/%61pi/search", "/API/../api/search"]
    vcodes = [get(28092, path=v, headers=xff("203.0.113.1"))[0] for v in variants]
    check("path variants share the limit of /api/search", codes == [200]*3 and vcodes == [429]*len(variants), f"{codes} then {dict(zip(variants, vcodes))}")
    a, b = "k" * 300 + "A", "k" * 300 + "B"
    ka = [get(28092, path="/keyed", headers=xff("198.51.100.1") + f"X-Api-Key: {a}\r\n".encode())[0] for _ in range(4)]
    kb = get(28092, path="/keyed", headers=xff("198.51.100.1") + f"X-Api-Key: {b}\r\n".encode())[0]
    check("two 301-byte keys sharing 300 bytes are two clients", ka == [200]*3 + [429] and kb == 200, f"{ka}, other key {kb}")
    v6 = [get(28092, path="/v6", headers=xff(f"2001:db8:1:2::{i}"))[0] for i in range(1, 6)]
    other = get(28092, path="/v6", headers=xff("2001:db8:1:3::1"))[0]
    mapped = [get(28092, path="/v6", headers=xff(ip))[0] for ip in ["::ffff:198.51.100.9", "198.51.100.9", "::ffff:198.51.100.9", "198.51.100.9"]]
    check("one IPv6 /64 is one client; ::ffff:a.b.c.d is a.b.c.d", v6 == [200]*3 + [429]*2 and other == 200 and mapped == [200]*3 + [429], f"{v6}, next /64 {other}, mapped {mapped}")
    body = b'{"identities": {"ip": "9.9.9.9"}, "method": "GET", "path": "/api/search"}'
    st, _ = raw(28084, b"POST /v1/check HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body), body=body)
    through = get(28092, path="/api/search", headers=xff("203.0.113.77"))[0]
    check("the service asks for the data token; the filter sends it", st == 401 and through == 200, f"direct {st}, through Nginx {through}")

def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))

def run_checks():
    around_checks()
    # 1. the basic limit: per-ip 5 per 10 s
    codes = [get(28080, src="127.0.0.10")[0] for _ in range(8)]
    check("per-ip limit: 5 admitted then 429", codes == [200]*5 + [429]*3, str(codes))
    before = metric(28085, "sluice_checks_total")
    codes = [get(28093, src="127.0.0.10")[0] for _ in range(8)]
    after = metric(28085, "sluice_checks_total")
    check("checks over a Unix socket (unix:PATH): 5 admitted then 429, decided by that service",
          codes == [200]*5 + [429]*3 and after > before, f"{codes}, rule evaluations {before:.0f} -> {after:.0f}")
    st, data = get(28080, src="127.0.0.10")
    heads = data.split(b"\r\n\r\n")[0].decode(errors="replace").lower()
    want = ["retry-after:", "x-ratelimit-limit:", "x-ratelimit-remaining:", "ratelimit-policy:", "\nratelimit:"]
    check("a 429 carries Retry-After, X-RateLimit-*, RateLimit, RateLimit-Policy", st == 429 and all(w in heads for w in want), heads.replace("\r\n", " | ")[:400])
    # 2. header bytes that are not UTF-8
    hostile = [b"X-User-Id: \xff\xfe\r\n", b"X-Api-Key: caf\xe9\r\n", b"X-Forwarded-For: 10.0.0.\xff, 1.2.3.4\r\n",
               b"X-User-Tier: \x80\x81\r\n", b"X-User-Id: " + bytes(range(0x80, 0x100)) + b"\r\n"]
    codes = [get(28080, src=f"127.0.1.{i}", headers=h)[0] for i, h in enumerate(hostile, 1)]
    check("non-UTF-8 header values: answered, never 500", all(c in (200, 429) for c in codes), str(codes))
    codes = [get(28080, src="127.0.2.1", headers=b"X-Api-Key: caf\xe9\r\n")[0] for _ in range(8)]
    check("a non-UTF-8 identity is still limited as itself", codes.count(429) >= 3 and 500 not in codes, str(codes))
    # 3. shaping: uploads-shaped, 10/s burst 2, held up to 2 s
    out = []
    def up(i):
        t = time.time(); st, _ = raw(28080, b"POST /api/upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-User-Id: shaper\r\nContent-Length: 0\r\n\r\n", src=f"127.0.3.{i}")
        out.append((st, time.time() - t))
    ths = [threading.Thread(target=up, args=(i,)) for i in range(1, 7)]
    t0 = time.time(); [t.start() for t in ths]; [t.join() for t in ths]
    sts = sorted(s for s, _ in out); spread = max(d for _, d in out) - min(d for _, d in out)
    check("shaping: 6 uploads at once all pass, spaced out (no trap)", sts == [200]*6 and spread >= 0.25, f"{sts}, spread {spread*1000:.0f} ms")
    # 4. keep-alive: 1000 requests on one connection
    s = socket.socket(); s.bind(("127.0.4.1", 0)); s.connect(("127.0.0.1", 28080)); s.settimeout(10)
    f = s.makefile("rb"); n = 0; statuses = {}; reconnects = 0
    i = 0
    while i < 1000:
        try:
            s.sendall(b"GET /api/hello HTTP/1.1\r\nHost: x\r\n\r\n")
            line = f.readline()
            if not line: raise OSError("closed")
            code = int(line.split()[1]); clen = 0
            while True:
                h = f.readline()
                if h in (b"\r\n", b""): break
                if h.lower().startswith(b"content-length:"): clen = int(h.split(b":")[1])
            f.read(clen); statuses[code] = statuses.get(code, 0) + 1; n += 1; i += 1
        except (OSError, ValueError, IndexError):  # the server closed after keepalive_requests: resend on a new one
            if reconnects > 50: break
            reconnects += 1; s.close(); s = socket.socket(); s.bind(("127.0.4.1", 0)); s.connect(("127.0.0.1", 28080)); s.settimeout(10); f = s.makefile("rb")
    s.close()
    check("1,000 requests on keep-alive connections: all answered, no 5xx", n == 1000 and not any(c >= 500 for c in statuses), f"{statuses}, {reconnects} reconnects (keepalive_requests 100)")
    # 5. the breaker cannot be steered by a client
    before = metric(28081, "sluice_checks_total")
    for i in range(20):
        get(28080, src="127.0.5.1", method=b"X" * 40)
        get(28080, src="127.0.5.1", path="/" + "a" * 9000)
    st, _ = get(28080, src="127.0.5.9")
    after = metric(28081, "sluice_checks_total")
    check("40 hostile methods and paths: the next request is still checked by the service", st == 200 and after > before, f"status {st}, service rule evaluations {before:.0f} -> {after:.0f}")
    # 6. an answer of {} is no allow (failure closed)
    codes = [get(28091, src="127.0.6.1")[0] for _ in range(3)]
    check("an answer of {} is a failure, never an allow (fails closed)", all(c in (429, 503) for c in codes), str(codes))
    # 7. leasing: rules polled, leases from the root's timer
    time.sleep(1.0)
    calls0 = metric(28082, "sluice_checks_total"); leases0 = metric(28082, "sluice_leases_granted_total")
    codes = {}
    t0 = time.time()
    for i in range(300):  # 100 a second, half the leased limit of 200 a second
        c = get(28090, path="/leased/x", src="127.0.7.1")[0]; codes[c] = codes.get(c, 0) + 1
        time.sleep(max(0, t0 + (i + 1) / 100 - time.time()))
    dt = time.time() - t0
    calls1 = metric(28082, "sluice_checks_total"); leases1 = metric(28082, "sluice_leases_granted_total")
    check("leasing in Nginx: requests decided on leases, few checks", codes.get(200, 0) == 300 and leases1 > leases0 and (calls1 - calls0) < 30,
          f"{codes} in {dt:.1f}s; rule evaluations +{calls1-calls0:.0f}, leases granted +{leases1-leases0:.0f}")
    codes = [get(28090, path="/leased/x", src="127.0.7.2", headers=h)[0] for h in hostile]
    check("leasing + non-UTF-8 headers: answered, never 500", all(c in (200, 429) for c in codes), str(codes))

def spread(port, src):
    """40 requests from `src`, a new connection each (the kernel spreads them over the
    workers): how many were admitted, in how long, and by how many worker processes."""
    t0 = time.time(); codes = []; pids = set()
    for _ in range(40):
        st, data = get(port, src=src); codes.append(st)
        m = re.search(rb"x-worker: *(\d+)", data, re.I)
        if m: pids.add(m.group(1))
    return codes.count(200), codes.count(429), time.time() - t0, pids

def share_checks():
    # 8. one participant: the local prefilter's buckets in the shm_kv zone, both workers' own
    admitted, refused, dt, pids = spread(28094, "127.0.8.1")
    bound = 5 + int(dt) + 1
    check("one client over both workers: the local prefilter admits burst + rate x T for the process",
          len(pids) >= 2 and admitted <= bound and admitted + refused == 40,
          f"{admitted} admitted of 40 in {dt:.1f}s (bound {bound}), workers {sorted(pids)}")
    admitted, refused, dt, pids = spread(28095, "127.0.8.2")
    check("share: worker, the same client: each worker's own burst (past the process's bound)",
          len(pids) >= 2 and admitted > 5 + int(dt) + 1 and admitted + refused == 40,
          f"{admitted} admitted of 40 in {dt:.1f}s, workers {sorted(pids)}")

LEASE_SHARE_N = 200

def leased_run(port, src, n=LEASE_SHARE_N):
    """`n` requests to /leased/x from `src` at 100 a second, a new connection each (spread
    over the workers): the statuses, the answers each worker gave, how long it took, and the
    leases the leased service (28082) granted meanwhile (counted half a second after, when
    the last lease call is back)."""
    time.sleep(0.5)
    l0 = metric(28082, "sluice_leases_granted_total")
    codes = {}; pids = {}; t0 = time.time()
    for i in range(n):
        st, data = get(port, path="/leased/x", src=src); codes[st] = codes.get(st, 0) + 1
        m = re.search(rb"x-worker: *(\d+)", data, re.I)
        if m: pids[m.group(1).decode()] = pids.get(m.group(1).decode(), 0) + 1
        time.sleep(max(0, t0 + (i + 1) / 100 - time.time()))
    dt = time.time() - t0
    time.sleep(0.5)
    return codes, pids, dt, metric(28082, "sluice_leases_granted_total") - l0

def lease_share_check():
    # 9. the process's one book of leases: one client over both workers leases for both
    # at once, so about half the grants of `share: worker`, where each worker leases for
    # itself (+4 against +7 to +9 for 200 requests in 2 s; with a book per worker both
    # servers take about as many, and the check fails). Every answer of the process's is a
    # 200 (the client sends half its limit); each worker's book sometimes refuses a few
    # (8 and 23 of 200 in 2 of 8 runs on 2026-11-28: the two books split the quota, and
    # one's grant falls short), so there 429s are counted, not failed.
    pc, pp, pdt, pl = leased_run(28090, "127.0.9.1")
    wc, wp, wdt, wl = leased_run(28096, "127.0.9.2")
    n = LEASE_SHARE_N
    check("leases, share: process: one client over both workers takes at most 0.7x the lease grants of share: worker",
          pc == {200: n} and set(wc) <= {200, 429} and wc.get(200, 0) > 0 and len(pp) >= 2 and len(wp) >= 2
          and 0 < pl <= 0.7 * wl,
          f"process: {pc} in {pdt:.1f}s by workers {pp}, leases granted +{pl:.0f}; "
          f"worker: {wc} in {wdt:.1f}s by workers {wp}, leases granted +{wl:.0f} (ratio {pl / wl if wl else float('nan'):.2f})")

NO_ZONE_CONF = """worker_processes 2;
error_log logs/error.log info;
pid logs/nginx.pid;
events { worker_connections 256; }
wasm { module sluice __WASM__; }
http {
    access_log off;
    proxy_wasm_request_headers_in_access on;
    upstream api { server 127.0.0.1:29000; }
    server {
        listen 127.0.0.1:28180;
        location / {
            proxy_wasm sluice '__CONFIG__';
            proxy_pass http://api;
        }
    }
}
"""

def concurrency_check():
    # 12. A concurrency rule (issue 67) over both workers: six of one user's requests at once,
    # each from its own address (the per-IP rule apart), take the rule's four slots and two
    # are refused; once they ended, four more all pass: the slots came back on the tick.
    def at_once(port, path, user, first, n):
        out = [None] * n
        def one(i):
            out[i] = get(port, path=path, src=f"127.0.12.{first + i}", headers=b"x-user-id: " + user + b"\r\n")[:2]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads: t.start()
        for t in threads: t.join()
        return out
    first = [s for s, _ in at_once(28097, "/api/generate", b"gen-user", 1, 6)]
    time.sleep(0.3)
    again = [s for s, _ in at_once(28097, "/api/generate", b"gen-user", 20, 4)]
    check("a concurrency rule: 4 of 6 at once pass, and 4 more pass once they ended (slots given back)",
          sorted(first) == [200, 200, 200, 200, 429, 429] and again == [200] * 4,
          f"at once {first}, after {again}")
    # 13. The filter's own limit (concurrency.local, share: process) over both workers: five
    # of one user's requests at once take its three slots and two are refused at once, saying
    # a limit on requests at once; three more pass as soon as those ended (given back with
    # the stream).
    first = at_once(28098, "/api/hello", b"own-user", 40, 5)
    statuses = sorted(s for s, _ in first)
    refusal = next((h.decode(errors="replace") for s, h in first if s == 429), "")
    second = at_once(28098, "/api/hello", b"own-user", 60, 3)
    again = [s for s, _ in second]
    workers = {m.group(1) for _, h in first + second for m in [re.search(rb"x-worker: (\d+)", h, re.I)] if m}
    check("the filter's own in-flight limit: 3 of 5 at once pass across both workers, 3 more pass at once after",
          statuses == [200, 200, 200, 429, 429] and again == [200] * 3 and len(workers) == 2
          and 'qu="concurrent-requests"' in refusal.lower() and "retry-after: 1" in refusal.lower(),
          f"at once {statuses}, after {again}, workers {sorted(workers)}; {refusal[:300]!r}")

def dead_workers_check(master):
    # 14. Both workers killed (SIGKILL) while three of one user's requests held the filter's
    # own in-flight slots (limit 3, expiry 2 s; the zone outlives the workers): the workers the
    # master starts again refuse that user while the dead ones' slots live, and admit again
    # once they expired. Returns the pids killed.
    def at_once(first):
        out = [None] * 3
        def one(i):
            try: out[i] = get(28098, path="/api/hello", src=f"127.0.13.{first + i}", headers=b"x-user-id: dead-user\r\n")[0]
            except OSError: out[i] = "reset"
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads: t.start()
        return threads, out
    holding, _ = at_once(1)
    taken = time.time()
    time.sleep(0.3)
    killed = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    for pid in killed: os.kill(int(pid), signal.SIGKILL)
    for t in holding: t.join()
    for _ in range(50):
        now = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
        if len(now) == 2 and not set(now) & set(killed): break
        time.sleep(0.1)
    threads, refused = at_once(20)
    for t in threads: t.join()
    time.sleep(max(0.0, taken + 2.3 - time.time()))
    threads, after = at_once(40)
    for t in threads: t.join()
    check("workers killed holding the filter's own in-flight slots: refused until the expiry (2 s), admitted after",
          refused == [429] * 3 and after == [200] * 3,
          f"killed {killed}, then {now}: while their slots lived {refused}, after the expiry {after}")
    return killed

def no_zone_check(base):
    # 10. An nginx.conf written before `share` (no shm_kv zone) with a configuration that does
    # not say `share` (issue 65: it took every worker down): every request is answered,
    # decided per worker, and each worker says once, as an error, which zone to add.
    # check-config, told that nginx.conf, accepts it and refuses "share": "process" there.
    run = f"{RUN}/nozone"
    shutil.rmtree(run, ignore_errors=True)  # a log of an earlier run would count its lines
    for d in ("logs", "conf"): os.makedirs(f"{run}/{d}", exist_ok=True)
    os.chmod(run, 0o755)
    cfg = json.loads(json.dumps(base)); cfg.pop("share", None)
    conf = NO_ZONE_CONF.replace("__WASM__", f"{RUN}/sluice_filter.wasm").replace("__CONFIG__", json.dumps(cfg))
    open(f"{run}/conf/nginx.conf", "w").write(conf)
    open(f"{run}/conf/unsaid.json", "w").write(json.dumps(cfg))
    open(f"{run}/conf/process.json", "w").write(json.dumps(dict(cfg, share="process")))
    said = lambda name: subprocess.run([f"{T}/debug/sluice-harness", "check-config", "--wasm", f"{RUN}/sluice_filter.wasm",
                                        "--config", f"{run}/conf/{name}.json", "--nginx-conf", f"{run}/conf/nginx.conf"],
                                       capture_output=True, text=True, env=dict(os.environ, RUST_BACKTRACE="0"))
    unsaid, process = said("unsaid"), said("process")
    check("check-config --nginx-conf without the zone: accepts a configuration without share, refuses share: process",
          unsaid.returncode == 0 and "shm_kv sluice" in unsaid.stdout + unsaid.stderr
          and process.returncode == 1 and "shm_kv" in process.stdout + process.stderr,
          f"{(unsaid.stdout + unsaid.stderr).strip()[-200:]} | {(process.stdout + process.stderr).strip()[-200:]}")
    subprocess.run([NGINX, "-p", f"{run}/", "-c", "conf/nginx.conf"], check=True)
    try:
        wait_port(28180); time.sleep(0.5)
        codes = [get(28180)[0] for _ in range(40)]
        log = open(f"{run}/logs/error.log", errors="replace").read().splitlines()
        zone = [l for l in log if "[error]" in l and "shm_kv sluice" in l]
        fatal = [l for l in log if re.search(r"trap|exited with code [1-9]|exited on signal|\[emerg\]|\[alert\]|\[crit\]", l)]
        check("an nginx.conf without the shm_kv zone: every request answered, no worker down",
              codes.count(200) + codes.count(429) == 40 and not fatal,
              f"{ {c: codes.count(c) for c in set(codes)} }; {'; '.join(fatal[:3])[:400]}")
        check("... and each worker says once, as an error, which zone to add", 1 <= len(zone) <= 2,
              f"{len(zone)} lines: {zone[:1]}")
        # 11. A CORS request (issue 66): the headers the filter adds are named to the page,
        # read with the request's headers (Envoy lends none on the response; Nginx does).
        st, data = get(28180, src="127.0.11.1", headers=b"Origin: http://app.example\r\n")
        exposed = re.search(rb"access-control-expose-headers: *([^\r\n]*)", data, re.I)
        plain = get(28180, src="127.0.11.2")[1]
        check("a request with Origin gets the filter's headers named in Access-Control-Expose-Headers, one without none",
              st in (200, 429) and exposed is not None and b"X-RateLimit-Limit" in exposed.group(1)
              and b"access-control-expose-headers" not in plain.lower(),
              f"{st}: {exposed.group(1) if exposed else None}")
    finally:
        subprocess.run([NGINX, "-p", f"{run}/", "-c", "conf/nginx.conf", "-s", "stop"])

main()  # a check that raised has printed the count and leaves with the traceback (exit 1)
sys.exit(1 if any(not ok for _, ok in results) else 0)
