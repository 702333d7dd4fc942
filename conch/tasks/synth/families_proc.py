"""Process and service families: get a misconfigured long-running program up, with a script that starts it.

The tests run in a fresh verifier box over the agent's final filesystem, where nothing the agent started is
still running (docs/safety.md, *Verification*). So the agent writes a start script at a stated path, and the
tests' module fixture runs it once (`bash START`), waits for the service's heartbeat or health endpoint, and
then proves the service is alive by talking to it: the worker must pick up a job the test drops into its
queue, the HTTP server must answer on its port. Both programs ship with the task and refuse to start until the
agent fixes their configuration, whose error message is the clue. A missing or failing start script is
recorded by the fixture, never raised, so every test that needs the service fails with the reason.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import (
    HELDOUT,
    TRAIN,
    TaskDraft,
    compose,
    family,
    heredoc,
    literal,
    pick,
    q,
    say,
    sed_replace,
    words,
)

_WORKER = '''#!/usr/bin/env python3
"""NAME worker: turns job files in a queue directory into result files, and writes a heartbeat."""
import os
import sys
import time

REQUIRED = ("name", "queue_dir", "done_dir", "heartbeat", "pidfile", "interval")


def load_config(path):
    cfg = {}
    for raw in open(path):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            sys.exit(f"config error: line without '=': {line!r}")
        cfg[key.strip()] = value.strip()
    for key in REQUIRED:
        if key not in cfg:
            sys.exit(f"config error: missing key {key!r}")
    try:
        cfg["interval"] = float(cfg["interval"])
    except ValueError:
        sys.exit(f"config error: interval must be a number of seconds, got {cfg['interval']!r}")
    if not os.path.isdir(cfg["queue_dir"]):
        sys.exit(f"config error: queue_dir {cfg['queue_dir']} is not a directory")
    return cfg


def run_job(path):
    out = []
    for line in open(path):
        parts = line.split()
        if parts:
            op, a, b = parts[0], int(parts[1]), int(parts[2])
            out.append(str({"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b)}[op]))
    return "\\n".join(out) + "\\n"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: worker.py CONFIG")
    cfg = load_config(sys.argv[1])
    os.makedirs(cfg["done_dir"], exist_ok=True)
    os.makedirs(os.path.dirname(cfg["pidfile"]) or ".", exist_ok=True)
    with open(cfg["pidfile"], "w") as f:
        f.write(f"{os.getpid()}\\n")
    print(f"started name={cfg['name']} pid={os.getpid()}", flush=True)
    beat = 0
    while True:
        for job in sorted(os.listdir(cfg["queue_dir"])):
            src = os.path.join(cfg["queue_dir"], job)
            if not job.endswith(".job") or not os.path.isfile(src):
                continue
            result = run_job(src)
            with open(os.path.join(cfg["done_dir"], job[:-4] + ".result"), "w") as f:
                f.write(result)
            os.remove(src)
            print(f"done {job}", flush=True)
        beat += 1
        with open(cfg["heartbeat"], "w") as f:
            f.write(f"{cfg['name']} {beat} {time.time():.3f}\\n")
        time.sleep(cfg["interval"])


if __name__ == "__main__":
    main()
'''


def _start_prelude(start: str, wait: str, forget: str = "") -> str:
    """Test-module code that runs the agent's start script once, before the first test, and waits for the service.

    `wait` is the body of `_ready()` (true once the service is up); `forget` the statements run before the
    script (removing state files left by the agent's stopped service). The outcome is recorded in `STARTED`,
    never raised: `up()` at the top of a test fails it with the reason (a fixture error would not be a failure).
    The prelude must import pytest.
    """
    return (f"START = {start!r}\nSTART_LOG = '/tmp/start-script.log'\nSTARTED = {{}}\n\n\n"
            "def _ready():\n" + wait + "\n\n"
            "def _log():\n"
            "    try:\n"
            "        return read(START_LOG)[-2000:]\n"
            "    except OSError:\n"
            "        return ''\n\n\n"
            "def _start():\n"
            "    if not os.path.isfile(START):\n"
            "        return f'{START} does not exist'\n" + forget +
            "    try:\n"
            "        with open(START_LOG, 'w') as log:\n"
            "            done = subprocess.run(['bash', START], stdin=subprocess.DEVNULL, stdout=log,\n"
            "                                  stderr=subprocess.STDOUT, timeout=30)\n"
            "    except subprocess.TimeoutExpired:\n"
            "        return f'bash {START} did not return within 30 s (it must start the service in the background)'\n"
            "    except Exception as e:\n"
            "        return f'bash {START} could not run: {e!r}'\n"
            "    if done.returncode != 0:\n"
            "        return f'bash {START} exited with status {done.returncode}; its output:\\n{_log()}'\n"
            "    deadline = time.time() + 10\n"
            "    while time.time() < deadline:\n"
            "        try:\n"
            "            if _ready():\n"
            "                return ''\n"
            "        except Exception:\n"
            "            pass\n"
            "        time.sleep(0.2)\n"
            "    return f'the service was not up 10 s after bash {START} returned; its output:\\n{_log()}'\n\n\n"
            "@pytest.fixture(scope='module', autouse=True)\n"
            "def started_service():\n"
            "    try:\n"
            "        STARTED['error'] = _start()\n"
            "    except Exception as e:  # whatever the agent left, a failure of the tests, not an error\n"
            "        STARTED['error'] = f'starting the service failed: {e!r}'\n"
            "    yield\n\n\n"
            "def up():\n"
            "    assert not STARTED.get('error'), STARTED.get('error')\n\n\n")


def _job(rng: random.Random) -> tuple[str, str]:
    rows, res = [], []
    for _ in range(rng.randint(1, 5)):
        op, a, b = pick(rng, ["add", "sub", "mul", "max"]), rng.randint(-99, 999), rng.randint(-99, 999)
        rows.append(f"{op} {a} {b}")
        res.append(str({"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b)}[op]))
    return "\n".join(rows) + "\n", "\n".join(res) + "\n"


@family("service-daemon", TRAIN, "processes", "fix a worker's config and script its start in the background")
def service_daemon(rng: random.Random) -> TaskDraft:
    name = pick(rng, words(rng, "animal", 6))
    svc = f"/app/{pick(rng, ['service', 'worker', 'daemon'])}"
    conf = f"{svc}/{pick(rng, ['worker.conf', 'settings.conf', name + '.conf'])}"
    queue = f"/app/{pick(rng, ['queue', 'jobs', 'spool'])}"
    done = f"/app/{pick(rng, ['done', 'results', 'processed'])}"
    run = pick(rng, ["/app/run", "/app/var/run", "/app/state"])
    interval = pick(rng, ["0.2", "0.3", "0.5"])
    good = {"name": name, "queue_dir": queue, "done_dir": done, "heartbeat": f"{run}/heartbeat",
            "pidfile": f"{run}/{name}.pid", "interval": interval}
    faults = rng.sample(["interval", "queue", "name"], rng.randint(1, 2))
    broken = dict(good)
    if "interval" in faults:
        broken["interval"] = pick(rng, [f"{interval}s", "fast", f"{int(float(interval) * 1000)}ms"])
    if "queue" in faults:
        broken["queue_dir"] = queue + pick(rng, ["/incoming", "s", "-new"])
    if "name" in faults:
        del broken["name"]
    text = f"# {name} worker configuration\n" + "".join(f"{k} = {v}\n" for k, v in broken.items())
    jobs = {f"{pick(rng, ['job', 'task', 'batch'])}-{i:03d}.job": _job(rng) for i in range(rng.randint(2, 8))}
    start = f"{svc}/{pick(rng, ['start.sh', 'run.sh', 'start-worker.sh', 'launch.sh'])}"
    log = f"{run}/{name}.log"
    files = {f"{svc[5:]}/worker.py": _WORKER.replace("NAME", name), conf[5:]: text}
    files.update({f"{queue[5:]}/{j}": body for j, (body, _r) in jobs.items()})
    items = [f"The worker is `{svc}/worker.py` and takes its configuration file as its only argument: "
             f"`python3 {svc}/worker.py {conf}`. It currently refuses to start; find out why and fix `{conf}`.",
             f"The configuration must name the worker `{name}`, read jobs from `{queue}` and poll every {interval} "
             "seconds (a plain number of seconds)." if "name" in faults or "interval" in faults else
             f"Jobs live in `{queue}`; the worker must read them from there.",
             f"Write a start script `{start}` that starts the worker in the background and returns at once (the "
             f"worker writes its pid to `{good['pidfile']}` and a heartbeat to `{good['heartbeat']}`). Exactly one "
             "instance should run. " + pick(rng, [
                 f"It will be run as `bash {start}` after a restart, when the worker is not running; try it yourself.",
                 f"After a reboot the worker is started with `bash {start}` alone, so run it to check that it works.",
                 f"Nothing you start now survives a restart: the machine runs `bash {start}` to bring the worker up, "
                 "so make sure that works."]),
             f"Once started, the worker must process every job already queued (results appear in `{done}`) and keep "
             "processing jobs that arrive later."]
    intro = pick(rng, [
        f"A queue worker called `{name}` should be running on this machine, but it is not.",
        f"{say(rng, 'task')} is to bring the `{name}` job worker back up.",
        f"The `{name}` service processes job files; nobody has been able to start it since a config change.",
    ])
    # the heartbeat and pidfile of the agent's stopped worker are removed first, so both must be the new one's
    prelude = (f"import pytest\n\nCONF = {conf!r}\nQUEUE = {queue!r}\nDONE = {done!r}\n"
               f"HEARTBEAT = {good['heartbeat']!r}\n"
               f"PIDFILE = {good['pidfile']!r}\nRESULTS = {literal({j[:-4]: r for j, (_b, r) in jobs.items()})}\n"
               + _start_prelude(start, "    return os.path.exists(HEARTBEAT)\n",
                                "    for stale in (HEARTBEAT, PIDFILE):\n"
                                "        if os.path.exists(stale):\n"
                                "            os.remove(stale)\n") +
               "def config():\n"
               "    out = {}\n"
               "    for ln in lines(CONF):\n"
               "        k, sep, v = ln.partition('=')\n"
               "        if sep and not ln.lstrip().startswith('#'):\n"
               "            out[k.strip()] = v.strip()\n"
               "    return out\n\n\n"
               "def beat():\n"
               "    for _ in range(20):  # the worker rewrites the file in place: retry a torn read\n"
               "        parts = read(HEARTBEAT).split()\n"
               "        if len(parts) >= 2:\n"
               "            return int(parts[1])\n"
               "        time.sleep(0.05)\n"
               "    raise AssertionError(f'{HEARTBEAT} holds no beat count')\n\n\n"
               "def workers():\n"
               "    found = []\n"
               "    for pid in os.listdir('/proc'):\n"
               "        try:\n"
               "            argv = pathlib.Path('/proc', pid, 'cmdline').read_bytes().split(b'\\0')\n"
               "        except OSError:\n"
               "            continue\n"
               "        if b'python' in os.path.basename(argv[0]) and \\\n"
               "                any(os.path.basename(a) == b'worker.py' for a in argv):\n"
               "            found.append(int(pid))\n"
               "    return found\n")
    tests = [
        "def test_queued_jobs_processed():\n"
        "    for job, result in RESULTS.items():\n"
        "        assert read(os.path.join(DONE, job + '.result')) == result, job\n"
        "    assert not [j for j in os.listdir(QUEUE) if j.endswith('.job')]\n",
        f"def test_config_fixed():\n    cfg = config()\n    assert cfg.get('name') == {name!r}\n"
        f"    assert float(cfg['interval']) == {float(interval)!r}\n    assert cfg['queue_dir'].rstrip('/') == QUEUE\n",
        "def test_worker_alive():\n"
        "    up()\n"
        "    first = beat()\n"
        "    time.sleep(2.5)\n"
        "    assert beat() > first\n",
        "def test_pidfile_names_running_worker():\n"
        "    up()\n"
        "    pid = int(read(PIDFILE).strip())\n"
        "    cmdline = pathlib.Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\\0', b' ').decode()\n"
        "    assert 'worker.py' in cmdline\n"
        "    assert workers() == [pid]  # exactly one instance\n",
        "def test_new_job_is_processed():\n"
        "    up()\n"
        "    pathlib.Path(QUEUE, 'zz-probe.job').write_text('add 40 2\\nmul 6 7\\n')\n"
        "    deadline = time.time() + 8\n"
        "    result = pathlib.Path(DONE, 'zz-probe.result')\n"
        "    while time.time() < deadline and not result.exists():\n"
        "        time.sleep(0.2)\n"
        "    time.sleep(0.3)\n"
        "    assert result.read_text() == '42\\n42\\n'\n",
    ]
    sol = [f"ls -la {svc} {queue}", f"cat {conf}", f"python3 {svc}/worker.py {conf}; echo exit=$?"]
    if "interval" in faults:
        sol.append(sed_replace(conf, f"interval = {broken['interval']}", f"interval = {interval}"))
    if "queue" in faults:
        sol.append(sed_replace(conf, f"queue_dir = {broken['queue_dir']}", f"queue_dir = {queue}"))
    if "name" in faults:
        sol.append(f"echo 'name = {name}' >> {conf}")
    script = (f"#!/bin/bash\n# Start the {name} worker in the background, unless it is already running.\n"
              f"pidfile={good['pidfile']}\n"
              'if [ -f "$pidfile" ] && grep -qs worker.py "/proc/$(cat "$pidfile")/cmdline"; then\n'
              '  echo "already running: pid $(cat "$pidfile")"\n'
              "  exit 0\n"
              "fi\n"
              f"mkdir -p {run}\n"
              f"setsid nohup python3 {svc}/worker.py {conf} > {log} 2>&1 < /dev/null &\n"
              "sleep 1\n"
              f'kill -0 $! 2>/dev/null || {{ echo "worker exited:"; cat {log}; exit 1; }}\n'
              'echo "started: pid $(cat "$pidfile")"\n')
    sol += [f"cat {conf}", heredoc(start, script), f"chmod +x {start}", f"bash {start}",
            f"sleep 1; cat {log}; cat {good['heartbeat']}",
            f"ls {done}; bash {start}"]
    return TaskDraft(instruction=compose(rng, intro, items), tests=tests, solution=sol, files=files,
                     test_prelude=prelude, difficulty="medium", verifier_timeout_sec=120.0,
                     tags=("background", "daemon"))


# ----------------------------------------------------------------------------------------------- http-service

_SERVER = '''#!/usr/bin/env python3
"""A small item server: GET /health, GET /items (JSON list), GET /items/<name> (the file's bytes)."""
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def load(path):
    cfg = {}
    for raw in open(path):
        line = raw.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            cfg[key.strip()] = value.strip()
    for key in ("bind", "port", "data_dir", "token"):
        if not cfg.get(key):
            sys.exit(f"{path}: missing setting {key!r}")
    if not os.path.isdir(cfg["data_dir"]):
        sys.exit(f"{path}: data_dir {cfg['data_dir']!r} is not a directory")
    return cfg


CFG = load(sys.argv[1] if len(sys.argv) > 1 else "CONF")


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, body, kind="text/plain"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, f"ok {CFG['token']}\\n")
        if self.path == "/items":
            return self.reply(200, json.dumps(sorted(os.listdir(CFG["data_dir"]))), "application/json")
        if self.path.startswith("/items/"):
            path = os.path.join(CFG["data_dir"], os.path.basename(self.path[7:]))
            if os.path.isfile(path):
                return self.reply(200, open(path).read())
        return self.reply(404, "not found\\n")

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\\n" % (self.address_string(), fmt % args))


if __name__ == "__main__":
    print(f"listening on {CFG['bind']}:{CFG['port']}", flush=True)
    ThreadingHTTPServer((CFG["bind"], int(CFG["port"])), Handler).serve_forever()
'''


@family("http-service", HELDOUT, "processes", "configure a small HTTP service on loopback and script its start")
def http_service(rng: random.Random) -> TaskDraft:
    app = f"/app/{pick(rng, ['server', 'web', 'itemsvc'])}"
    conf = f"{app}/{pick(rng, ['server.conf', 'app.conf', 'service.ini'])}"
    data = f"/app/{pick(rng, ['items', 'content', 'store'])}"
    port = rng.randint(18000, 29999)
    token = f"{pick(rng, words(rng, 'project', 4))}-{rng.randint(100, 999)}"
    items = {w: f"{w} {pick(rng, words(rng, 'color', 3))} {rng.randint(1, 999)}\n" for w in words(rng, "fruit", 4)}
    new_item, new_body = pick(rng, ["motd", "banner", "notice", "welcome"]), \
        f"{pick(rng, ['Hello', 'Welcome', 'Greetings'])} from {token}\n"
    wrong_port = rng.randint(30000, 39999)
    text = (f"# item server settings\nbind = 0.0.0.0\nport = {wrong_port}\n"
            f"data_dir = {data}{pick(rng, ['-old', '/v1', '.bak'])}\ntoken =\n")
    start = f"{app}/{pick(rng, ['start.sh', 'run.sh', 'start-server.sh', 'serve.sh'])}"
    files = {f"{app[5:]}/server.py": _SERVER.replace("CONF", conf), conf[5:]: text}
    files.update({f"{data[5:]}/{k}": v for k, v in items.items()})
    reqs = [f"The server is `{app}/server.py` (run it with `python3 {app}/server.py {conf}`); its settings are "
            f"in `{conf}`.",
            f"It must listen on `127.0.0.1` port {port}, serve the items in `{data}`, and use the token `{token}` "
            f"(so `GET /health` answers `ok {token}`). Put these settings in `{conf}`.",
            f"Add an item named `{new_item}` whose content is exactly `{new_body.strip()}` followed by a newline.",
            f"Write `{start}`, a script that starts the server in the background and returns (one instance). "
            + pick(rng, [
                f"It will be run as `bash {start}` when the server is not running; run it yourself to check.",
                f"After a restart the server is brought up by `bash {start}` alone, so make sure that works.",
                f"Nothing you start now keeps running: `bash {start}` is how the server gets started, so test it."])]
    intro = pick(rng, [
        "A small HTTP item service needs to be configured and started on this machine.",
        f"{say(rng, 'task')} is to get the item server up and serving on the loopback interface.",
        "The team's item server is down and its config file is half-finished.",
    ])
    prelude = (f"import urllib.request\n\nimport pytest\n\nBASE = 'http://127.0.0.1:{port}'\nCONF = {conf!r}\n"
               + _start_prelude(start, "    return fetch('/health').startswith('ok')\n") +
               "def fetch(path):\n"
               "    with urllib.request.urlopen(BASE + path, timeout=10) as r:\n"
               "        return r.read().decode()\n\n\n"
               "def get(path):\n"
               "    up()\n"
               "    return fetch(path)\n")
    first = sorted(items)[0]
    tests = [
        f"def test_health():\n    assert get('/health') == {f'ok {token}' + chr(10)!r}\n",
        f"def test_existing_item():\n    assert get('/items/{first}') == {items[first]!r}\n",
        f"def test_new_item():\n    assert get('/items/{new_item}') == {new_body!r}\n",
        f"def test_listing():\n    assert json.loads(get('/items')) == {sorted([*items, new_item])!r}\n",
        "def test_config_persisted():\n"
        "    cfg = dict(l.split('=', 1) for l in lines(CONF) if '=' in l and not l.startswith('#'))\n"
        "    cfg = {k.strip(): v.strip() for k, v in cfg.items()}\n"
        f"    assert cfg['port'] == {str(port)!r} and cfg['bind'] == '127.0.0.1'\n"
        f"    assert cfg['data_dir'].rstrip('/') == {data!r} and cfg['token'] == {token!r}\n",
    ]
    sol = [f"cat {conf}", f"ls {data}", f"python3 {app}/server.py {conf}; echo exit=$?",
           heredoc(conf, f"# item server settings\nbind = 127.0.0.1\nport = {port}\ndata_dir = {data}\n"
                         f"token = {token}\n"),
           f"printf '%s\\n' {q(new_body.strip())} > {data}/{new_item}",
           heredoc(start, "#!/bin/bash\n# Start the item server in the background, unless it already answers.\n"
                          f"health=http://127.0.0.1:{port}/health\n"
                          "up() { python3 -c \"import sys, urllib.request as u; u.urlopen(sys.argv[1], timeout=2)\" "
                          '"$health" 2>/dev/null; }\n'
                          'if up; then echo "already running"; exit 0; fi\n'
                          f"setsid nohup python3 {app}/server.py {conf} > /tmp/server.log 2>&1 < /dev/null &\n"
                          "for _ in 1 2 3 4 5 6 7 8 9 10; do\n"
                          '  if up; then echo "started: pid $!"; exit 0; fi\n'
                          "  sleep 0.5\n"
                          "done\n"
                          'echo "server did not come up:"; cat /tmp/server.log; exit 1\n'),
           f"bash {start}",
           f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/health')"
           ".read().decode())\"",
           f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/items').read().decode())\""]
    return TaskDraft(instruction=compose(rng, intro, reqs), tests=tests, solution=sol, files=files,
                     test_prelude=prelude, difficulty="medium", tags=("http", "background"))
