"""conch's pytest plugin in the verifier box (`-p conch_pytest_seal`): when the tests are done, nothing a test
started is left running.

Why: the task's tests run the agent's programs, and such a program can leave a process behind that waits for
pytest to finish and then rewrites the CTRF record or prints a forged summary into the test script's output.
At the end of the session (before the result record is written) this plugin kills every process in the box
that started after pytest did and is not pytest or one of its ancestors (the test script's chain), and resumes
those ancestors in case one was stopped. Services the test script started before pytest are left alone.

Copied into the verifier box's read-only run folder and imported by the tests' own Python, so it uses the
standard library only and keeps to old Pythons; it never raises (a failure here must not fail the tests).
"""

import os
import signal

import pytest


def _stat(pid):
    """(parent pid, start time in clock ticks) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[19])


def _table():
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def _ancestors(table, pid):
    chain = set()
    while pid in table and pid not in chain and pid > 0:
        chain.add(pid)
        pid = table[pid][0]
    return chain


def seal(keep_descendants=False):
    """Kill what started after this process and is not in its ancestry (nor, with `keep_descendants`, below it).
    Returns the pids killed."""
    table = _table()
    me = os.getpid()
    if me not in table:
        return []
    born = table[me][1]
    keep = _ancestors(table, me)
    victims = []
    for pid, (_, start) in table.items():
        if pid in keep or start <= born:
            continue
        if keep_descendants and me in _ancestors(table, pid):
            continue
        victims.append(pid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in keep - {me}:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    return victims


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller seals
        return
    try:
        seal(keep_descendants=config.pluginmanager.hasplugin("dsession"))
    except Exception:
        pass
