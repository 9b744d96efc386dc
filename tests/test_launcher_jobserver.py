"""The GNU make jobserver client (offload_builders.launcher.jobserver), against real pipes, FIFOs and real make.

The make tests run recipes that use the module under ``make -jN`` and check that what the recipes hold together
never passes N, that every token goes back (a later recipe takes them all again; make reports no token lost), and
what make 4.3 really gives a recipe that is not marked ``+``: ``MAKEFLAGS`` names descriptors that are closed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from offload_builders.launcher.jobserver import (
    JobServer,
    Slots,
    job_slots,
    jobserver_from_environment,
    makeflags_auth,
)

#: A safety net against a hang (a test fails rather than waits for ever): never a measure of speed.
LIVENESS_S = 120


# --- MAKEFLAGS, as make writes it -----------------------------------------------------------------------------

@pytest.mark.parametrize(("makeflags", "auth"), [
    (" -j3 --jobserver-auth=3,4", "3,4"),
    ("k -j3 --jobserver-auth=3,4 -- FOO=x\\ y", "3,4"),  # single-letter group first, assignments last
    (" -j8 --jobserver-auth=fifo:/tmp/GMfifo123", "fifo:/tmp/GMfifo123"),
    (" -j3 --jobserver-fds=5,6", "5,6"),  # make 4.1
    (" -j3 --jobserver-fds=5,6 --jobserver-auth=7,8", "7,8"),  # the last one counts
    (" -j3 --jobserver-auth=3,4 --jobserver-auth=fifo:/x", "fifo:/x"),
    ("-j --jobserver-fds=3,4 --jobserver-auth=3,4", "3,4"),  # as cargo writes it: -j with no number
    (" -j3 --jobserver-auth=-1,-1", "-1,-1"),  # read here; jobserver_from_environment says none
    # Variable assignments follow " -- ": their values are not options, however they look.
    (" -j3 --jobserver-auth=3,4 -- X=--jobserver-auth=9,9", "3,4"),
    (" -j3 --jobserver-auth=3,4 -- --jobserver-auth=9,9", "3,4"),
    (" -- X=a\\ --jobserver-auth=9,9", None),
    ("k -- --jobserver-auth=9,9", None),
    # A quoted blank does not end a word: an option value holding " --jobserver-auth=" is not one.
    (" -j3 --jobserver-auth=3,4 -Ia\\ --jobserver-auth=9,9", "3,4"),
    ("", None),
    (" -j1", None),
    (" -j4", None),  # -j with no jobserver (the top make with -j and no limit, or a non-GNU make)
    (" -j1 --jobserver-auth=3,4", None),  # a sub-make forced serial
    (" --jobs=1 --jobserver-auth=3,4", None),
    (" -j4 --jobserver-auth=3,4 -j1", None),
    (" -j1 -j4 --jobserver-auth=3,4", "3,4"),
])
def test_makeflags_auth_reads_options_as_make_does(makeflags, auth):
    assert makeflags_auth(makeflags) == auth


def _environ(auth: str) -> dict[str, str]:
    return {"MAKEFLAGS": f" -j4 --jobserver-auth={auth}"}


@pytest.fixture
def inherited_pipe():
    """A pipe as make 4.3 hands it to a ``+`` recipe: both ends inheritable (no close-on-exec)."""
    read_fd, write_fd = os.pipe()
    os.set_inheritable(read_fd, True)
    os.set_inheritable(write_fd, True)
    yield read_fd, write_fd
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass


def _drain(read_fd: int) -> bytes:
    """Every byte now in the pipe (tokens not taken)."""
    blocking = os.get_blocking(read_fd)
    os.set_blocking(read_fd, False)
    data = b""
    try:
        while chunk := os.read(read_fd, 64):
            data += chunk
    except BlockingIOError:
        pass
    finally:
        os.set_blocking(read_fd, blocking)
    return data


def test_an_inherited_pipe_is_the_jobserver(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert isinstance(server, JobServer)
    with server:
        assert server.write_fd == write_fd
        assert not server.acquire(timeout=0)  # no token in the pipe
        os.write(write_fd, b"+")
        assert server.acquire(timeout=0)
        assert server.held == 1
    assert _drain(read_fd) == b"+"  # close gave it back


def test_the_shared_read_end_keeps_its_blocking_mode(inherited_pipe):
    """make 4.4 asks that the read end's mode not be changed (it is shared with make and every other client)."""
    read_fd, write_fd = inherited_pipe
    assert os.get_blocking(read_fd)
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    with server:
        os.write(write_fd, b"+")
        assert server.acquire(timeout=0)
        assert not server.acquire(timeout=0)  # reads non-blocking all the same
    assert os.get_blocking(read_fd)


def test_a_pipe_this_process_opened_is_not_the_jobserver():
    """A pipe Python opened (close-on-exec) on the numbers MAKEFLAGS names was not inherited from make: a make 4.3
    recipe not marked ``+`` whose own pipe reused the closed numbers."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"+")
        assert jobserver_from_environment(_environ(f"{read_fd},{write_fd}")) is None
        assert _drain(read_fd) == b"+"  # never read
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_closed_descriptors_are_no_jobserver():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    os.close(write_fd)
    assert jobserver_from_environment(_environ(f"{read_fd},{write_fd}")) is None


def test_regular_files_are_no_jobserver(tmp_path):
    path = tmp_path / "tokens"
    path.write_bytes(b"++++")
    read_fd = os.open(path, os.O_RDONLY)
    write_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.set_inheritable(read_fd, True)
        os.set_inheritable(write_fd, True)
        assert jobserver_from_environment(_environ(f"{read_fd},{write_fd}")) is None
        assert path.read_bytes() == b"++++"
        assert os.lseek(read_fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_ends_swapped_or_of_two_pipes_are_no_jobserver(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    other_read, other_write = os.pipe()
    try:
        os.set_inheritable(other_read, True)
        os.set_inheritable(other_write, True)
        assert jobserver_from_environment(_environ(f"{write_fd},{read_fd}")) is None
        assert jobserver_from_environment(_environ(f"{read_fd},{other_write}")) is None
        assert jobserver_from_environment(_environ(f"{other_read},{write_fd}")) is None
    finally:
        os.close(other_read)
        os.close(other_write)


@pytest.mark.parametrize("auth", [
    "-1,-1", "-1,{w}", "{r},-1", "", "{r}", "{r},", ",{w}", "{r},{w},{w}", "{r} ,{w}", "+{r},{w}", "{r}.0,{w}",
    "{wide_r},{wide_w}",  # full-width digits: Python's int() reads them, make does not
    "99999999999999999999999,{w}", "fifo:", "fifo", "sem:foo", "FIFO:/tmp/x", "{r};{w}",
])
def test_malformed_or_disabled_values_are_no_jobserver(auth, inherited_pipe):
    """Values around a real inherited pipe's numbers, so that a loose reading would find it."""
    read_fd, write_fd = inherited_pipe
    wide = str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19")
    value = auth.format(r=read_fd, w=write_fd, wide_r=str(read_fd).translate(wide),
                        wide_w=str(write_fd).translate(wide))
    assert jobserver_from_environment(_environ(value)) is None
    assert jobserver_from_environment(_environ(f"{read_fd},{write_fd}")) is not None  # the pipe itself is one


def test_no_makeflags_is_no_jobserver():
    assert jobserver_from_environment({}) is None
    assert jobserver_from_environment({"MFLAGS": "-j3 --jobserver-auth=3,4"}) is None


def test_a_named_fifo_is_the_jobserver(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    keep = os.open(path, os.O_RDWR | os.O_NONBLOCK)  # make's own end, holding the tokens
    try:
        os.write(keep, b"ab")
        server = jobserver_from_environment(_environ(f"fifo:{path}"))
        assert server is not None
        with server:
            assert server.acquire(timeout=0)
            assert server.acquire(timeout=0)
            assert not server.acquire(timeout=0)
        assert sorted(_drain(keep)) == sorted(b"ab")
    finally:
        os.close(keep)


def test_a_fifo_path_that_is_no_fifo_is_no_jobserver(tmp_path):
    regular = tmp_path / "regular"
    regular.write_bytes(b"++")
    assert jobserver_from_environment(_environ(f"fifo:{regular}")) is None
    assert regular.read_bytes() == b"++"
    assert jobserver_from_environment(_environ(f"fifo:{tmp_path / 'missing'}")) is None
    assert jobserver_from_environment(_environ(f"fifo:{tmp_path}")) is None


# --- Tokens ------------------------------------------------------------------------------------------------------

def test_tokens_go_back_as_the_bytes_read(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    os.write(write_fd, b"xyz")
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    with server:
        assert [server.acquire(timeout=0) for _ in range(4)] == [True, True, True, False]
        assert all(server.release() for _ in range(3))
        assert not server.release()  # none held: nothing written
        assert server.held == 0
    assert sorted(_drain(read_fd)) == sorted(b"xyz")


def test_close_gives_back_every_token_even_after_an_exception(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    os.write(write_fd, b"-+")
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    with pytest.raises(KeyError), server:
        assert server.acquire(timeout=0) and server.acquire(timeout=0)
        raise KeyError("a job failed")
    assert sorted(_drain(read_fd)) == sorted(b"-+")
    assert not server.release()  # after close: nothing more is written
    server.close()  # idempotent
    assert _drain(read_fd) == b""
    with pytest.raises(ValueError):
        server.acquire(timeout=0)


def test_acquire_waits_for_a_token_another_process_gives(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    giver = subprocess.Popen([sys.executable, "-c", f"import os, sys; sys.stdin.read(); os.write({write_fd}, b'q')"],
                             stdin=subprocess.PIPE, pass_fds=(write_fd,))
    try:
        with server:
            assert not server.acquire(timeout=0)
            giver.stdin.close()  # now it writes the token
            assert server.acquire(timeout=LIVENESS_S)
            assert server.held == 1
        assert giver.wait(LIVENESS_S) == 0
        assert _drain(read_fd) == b"q"
    finally:
        giver.kill()
        giver.wait()


# --- Slots -------------------------------------------------------------------------------------------------------

class _Concurrency:
    """Counts the callables running at once; ``barrier`` parties must all be running before any returns."""

    def __init__(self, parties: int) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.barrier = threading.Barrier(parties, timeout=LIVENESS_S) if parties > 1 else None

    def __call__(self, value: int) -> int:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            return value * 2
        finally:
            with self.lock:
                self.running -= 1


def test_slots_run_the_implicit_slot_and_each_token_at_once(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    os.write(write_fd, b"abc")  # three tokens: with the implicit slot, four jobs at once
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    counter = _Concurrency(4)
    with Slots(6, server) as slots, ThreadPoolExecutor(max_workers=8) as pool:
        assert slots.limit == 6
        results = list(pool.map(lambda value: slots.run(counter, value), range(8), timeout=LIVENESS_S))
    assert results == [value * 2 for value in range(8)]
    assert counter.most == 4  # the barrier needs four at once; a fifth would be counted
    assert sorted(_drain(read_fd)) == sorted(b"abc")


def test_slots_never_pass_their_limit(inherited_pipe):
    """Six tokens free, a limit of 3: three jobs run (holding their slots), the other five callers wait, and while
    they wait a job could start if the limit let it (then it would be counted)."""
    read_fd, write_fd = inherited_pipe
    os.write(write_fd, b"+" * 6)
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    gate = threading.Event()
    counter = _Concurrency(1)

    def gated(value: int) -> int:
        with counter.lock:
            counter.running += 1
            counter.most = max(counter.most, counter.running)
        try:
            assert gate.wait(LIVENESS_S)
            return value * 2
        finally:
            with counter.lock:
                counter.running -= 1

    try:
        with Slots(3, server) as slots, ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(slots.run, gated, value) for value in range(8)]
            deadline = time.monotonic() + LIVENESS_S
            while not (counter.running == 3 and slots.waiting == 5):
                assert counter.running <= 3 and time.monotonic() < deadline, (counter.running, slots.waiting)
                time.sleep(0.001)
            assert counter.most == 3
            assert server.held == 2  # the implicit slot and two tokens
            gate.set()
            assert [future.result(LIVENESS_S) for future in futures] == [value * 2 for value in range(8)]
    finally:
        gate.set()
    assert counter.most == 3
    assert _drain(read_fd) == b"+" * 6


def test_slots_with_no_token_free_run_on_the_implicit_slot_alone(inherited_pipe):
    """No token ever comes: every callable still runs, one at a time, each waiter woken by the freed slot."""
    read_fd, write_fd = inherited_pipe
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    counter = _Concurrency(1)
    rescued = False
    with Slots(4, server) as slots, ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(slots.run, counter, value) for value in range(10)]
        try:
            results = [future.result(timeout=LIVENESS_S) for future in futures]
        finally:
            if not all(future.done() for future in futures):  # a waiter never woken: free it, then fail
                os.write(write_fd, b"+" * 4)
                rescued = True
    assert not rescued
    assert results == [value * 2 for value in range(10)]
    assert counter.most == 1
    assert _drain(read_fd) == b""


def test_a_caller_waiting_for_a_token_takes_the_implicit_slot_when_freed(inherited_pipe):
    """While one job holds the implicit slot and no token is free, the next caller waits on the jobserver; when
    the implicit slot is freed it takes that, without a token ever coming (the wait sees both)."""
    read_fd, write_fd = inherited_pipe
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    started, gate = threading.Event(), threading.Event()

    def first() -> str:
        started.set()
        assert gate.wait(LIVENESS_S)
        return "first"

    rescued = False
    with Slots(2, server) as slots, ThreadPoolExecutor(max_workers=2) as pool:
        holder = pool.submit(slots.run, first)
        assert started.wait(LIVENESS_S)
        waiter = pool.submit(slots.run, lambda: "second")
        deadline = time.monotonic() + LIVENESS_S
        while not slots.waiting:  # the second caller waits, on the jobserver (the implicit slot is in use)
            assert time.monotonic() < deadline and not waiter.done()
            time.sleep(0.001)
        gate.set()
        try:
            assert (holder.result(LIVENESS_S), waiter.result(LIVENESS_S)) == ("first", "second")
        finally:
            if not waiter.done():  # never woken: free it with a token, then fail
                os.write(write_fd, b"+")
                rescued = True
    assert not rescued
    assert _drain(read_fd) == (b"+" if rescued else b"")


def test_a_failing_callable_gives_its_slot_back(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    os.write(write_fd, b"t")
    server = jobserver_from_environment(_environ(f"{read_fd},{write_fd}"))
    assert server is not None
    entered = threading.Barrier(2, timeout=LIVENESS_S)

    def fail() -> None:
        entered.wait()  # both slots (implicit and token) are in use at once
        raise OSError("job failed")

    with Slots(2, server) as slots, ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(slots.run, fail) for _ in range(2)]
        for future in futures:
            with pytest.raises(OSError, match="job failed"):
                future.result(timeout=LIVENESS_S)
        assert server.held == 0
        assert slots.run(lambda: 7) == 7
    assert _drain(read_fd) == b"t"
    with pytest.raises(RuntimeError):
        slots.run(lambda: 7)


def test_job_slots_without_a_jobserver_run_one_at_a_time(inherited_pipe):
    read_fd, write_fd = inherited_pipe
    with job_slots(8, {}) as slots:
        assert slots.limit == 1 and slots.server is None
    with job_slots(8, {"MAKEFLAGS": " -j8"}) as slots:
        assert slots.limit == 1
    with job_slots(1, _environ(f"{read_fd},{write_fd}")) as slots:
        assert slots.limit == 1 and slots.server is None  # one job: the jobserver is not even opened
    with job_slots(3, _environ(f"{read_fd},{write_fd}")) as slots:
        assert slots.limit == 3 and slots.server is not None


def test_slots_without_a_jobserver_are_local():
    counter = _Concurrency(3)
    with Slots(3) as slots, ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda value: slots.run(counter, value), range(6), timeout=LIVENESS_S))
    assert counter.most == 3


# --- Real GNU make -----------------------------------------------------------------------------------------------

def _make_version() -> tuple[int, int]:
    make = shutil.which("make")
    if make is None:
        pytest.fail("GNU make is required (the README's set-up installs it)")
    first = subprocess.run([make, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    found = re.match(r"GNU Make (\d+)\.(\d+)", first)
    assert found, first
    return int(found[1]), int(found[2])


#: Waits until every name of a group has written its file (a barrier between recipes that make runs at once).
_BARRIER = '''
import os, sys, time

def barrier(directory, names, suffix):
    deadline = time.monotonic() + LIVENESS
    while not all(os.path.exists(os.path.join(directory, name + suffix)) for name in names):
        if time.monotonic() > deadline:
            sys.exit("barrier " + suffix + " never met")
        time.sleep(0.01)

def publish(directory, name, suffix, text=""):
    with open(os.path.join(directory, name + suffix + ".tmp"), "w") as file:
        file.write(text)
    os.replace(os.path.join(directory, name + suffix + ".tmp"), os.path.join(directory, name + suffix))
'''.replace("LIVENESS", str(LIVENESS_S))

#: Takes every token it can once all the recipes run, writes how many, and holds them until all have counted.
_GREEDY = _BARRIER + '''
import json
from offload_builders.launcher.jobserver import jobserver_from_environment

directory, name, peers = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
server = jobserver_from_environment(os.environ)
if server is None:
    sys.exit("no jobserver: " + repr(os.environ.get("MAKEFLAGS")))
with server:
    publish(directory, name, ".started")
    barrier(directory, peers, ".started")
    taken = 0
    while server.acquire(timeout=0):
        taken += 1
    publish(directory, name, ".count", json.dumps(taken))
    barrier(directory, peers, ".count")
'''

#: Takes ``want`` tokens, each waited for (they come back only as the other recipes end).
_TAKE_ALL = '''
import json, os, sys
from offload_builders.launcher.jobserver import jobserver_from_environment

directory, want = sys.argv[1], int(sys.argv[2])
server = jobserver_from_environment(os.environ)
if server is None:
    sys.exit("no jobserver: " + repr(os.environ.get("MAKEFLAGS")))
with server:
    got = sum(server.acquire(timeout=LIVENESS) for _ in range(want))
    extra = server.acquire(timeout=0)
with open(os.path.join(directory, "final.json"), "w") as file:
    json.dump({"got": got, "extra": extra}, file)
'''.replace("LIVENESS", str(LIVENESS_S))

#: job_slots around a thread pool, as the launcher uses it; a barrier of ``parties`` threads inside each job.
_POOL = '''
import json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
from offload_builders.launcher.jobserver import job_slots

directory, requested, parties, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lock = threading.Lock()
state = {"running": 0, "most": 0}
barrier = threading.Barrier(parties, timeout=LIVENESS)

def job(index):
    with lock:
        state["running"] += 1
        state["most"] = max(state["most"], state["running"])
    try:
        barrier.wait()
    finally:
        with lock:
            state["running"] -= 1
    return index

with job_slots(requested, os.environ) as slots:
    limit = slots.limit
    with ThreadPoolExecutor(max_workers=slots.limit) as pool:
        done = list(pool.map(lambda index: slots.run(job, index), range(jobs)))
with open(os.path.join(directory, "pool.json"), "w") as file:
    json.dump({"limit": limit, "most": state["most"], "done": done}, file)
'''.replace("LIVENESS", str(LIVENESS_S))

#: What a recipe sees: MAKEFLAGS, the advertised descriptors' state, and what the module makes of it, also after
#: this process opened a pipe of its own (which takes the lowest free numbers: the advertised ones, if closed).
_LOOK = '''
import json, os, sys
from offload_builders.launcher.jobserver import jobserver_from_environment, makeflags_auth

directory, name = sys.argv[1], sys.argv[2]
auth = makeflags_auth(os.environ.get("MAKEFLAGS", ""))
state = {}
if auth and not auth.startswith("fifo:"):
    for fd in auth.split(","):
        try:
            os.fstat(int(fd))
            state[fd] = "open"
        except OSError:
            state[fd] = "closed"
server = jobserver_from_environment(os.environ)
found = server is not None
if server is not None:
    server.close()
own = os.pipe()
server = jobserver_from_environment(os.environ)
found_after_pipe = server is not None
if server is not None:
    server.close()
with open(os.path.join(directory, name + ".json"), "w") as file:
    json.dump({"makeflags": os.environ.get("MAKEFLAGS"), "auth": auth, "fds": state, "found": found,
               "own_pipe": list(own), "found_after_pipe": found_after_pipe}, file)
'''


def _run_make(directory: Path, makefile: str, jobs: int, scripts: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in scripts.items():
        (directory / name).write_text(textwrap.dedent(text))
    (directory / "Makefile").write_text(makefile)
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        ["make", f"-j{jobs}", f"PY={sys.executable}",
         # An assignment that looks like an option: in MAKEFLAGS after " -- ", never to be read as one.
         "DECOY=--jobserver-auth=fifo:/nonexistent/decoy"],
        cwd=directory, env=env, capture_output=True, text=True, timeout=4 * LIVENESS_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # make 4.x counts the tokens back at exit and says so where one was lost or made up.
    assert "jobserver tokens" not in done.stderr, done.stderr
    return done


def test_recipes_together_never_hold_more_than_make_j(tmp_path):
    """Two ``+`` recipes under ``make -j3`` each take every token they can once both run: make holds one token for
    the second recipe, so one is left, and the two implicit slots plus what they took is exactly 3. A last recipe,
    once they ended, takes the two tokens of -j3 again: none was lost (and make counts them at exit)."""
    makefile = textwrap.dedent("""\
        all: final
        a:
        \t+"$(PY)" greedy.py . a a,b
        b:
        \t+"$(PY)" greedy.py . b a,b
        final: a b
        \t+"$(PY)" take_all.py . 2
        .PHONY: all a b final
        """)
    _run_make(tmp_path, makefile, 3, {"greedy.py": _GREEDY, "take_all.py": _TAKE_ALL})
    taken = {name: json.loads((tmp_path / f"{name}.count").read_text()) for name in "ab"}
    assert 2 + sum(taken.values()) <= 3, taken  # the jobserver's bound, across processes
    assert sum(taken.values()) == 1, taken  # and the free token was really had
    assert json.loads((tmp_path / "final.json").read_text()) == {"got": 2, "extra": False}


def test_job_slots_under_make_run_as_many_jobs_as_make_j(tmp_path):
    """``job_slots(8)`` around a pool under ``make -j4``, with nothing else running: the implicit slot and the three
    tokens, four jobs at once (the jobs' barrier needs four; a fifth running would be counted), never more."""
    makefile = textwrap.dedent("""\
        all: final
        pool:
        \t+"$(PY)" pool.py . 8 4 12
        final: pool
        \t+"$(PY)" take_all.py . 3
        .PHONY: all pool final
        """)
    _run_make(tmp_path, makefile, 4, {"pool.py": _POOL, "take_all.py": _TAKE_ALL})
    assert json.loads((tmp_path / "pool.json").read_text()) == {"limit": 8, "most": 4, "done": list(range(12))}
    assert json.loads((tmp_path / "final.json").read_text()) == {"got": 3, "extra": False}


def test_what_make_gives_a_recipe_without_plus(tmp_path):
    """make 4.3 (pipe jobserver) advertises ``--jobserver-auth=R,W`` to every recipe but opens R and W only in one
    marked ``+`` (or naming $(MAKE)); elsewhere they are closed, and a pipe the recipe opens takes those very
    numbers: neither is taken for the jobserver. make 4.4 and later (a FIFO) give the path to every recipe."""
    makefile = textwrap.dedent("""\
        all: plain plus
        plain:
        \t"$(PY)" look.py . plain
        plus:
        \t+"$(PY)" look.py . plus
        .PHONY: all plain plus
        """)
    _run_make(tmp_path, makefile, 3, {"look.py": _LOOK})
    plain = json.loads((tmp_path / "plain.json").read_text())
    plus = json.loads((tmp_path / "plus.json").read_text())
    for seen in (plain, plus):
        assert "DECOY=" in seen["makeflags"]
        assert seen["auth"] != "fifo:/nonexistent/decoy"
    if _make_version() < (4, 4):
        read_text, write_text = plain["auth"].split(",")
        assert plain["fds"] == {read_text: "closed", write_text: "closed"}, plain
        assert plain["own_pipe"] == [int(read_text), int(write_text)], plain  # the very numbers, reused
        assert not plain["found"] and not plain["found_after_pipe"], plain
        assert plus["auth"] == plain["auth"]
        assert plus["fds"] == {read_text: "open", write_text: "open"}, plus
        assert plus["found"] and plus["found_after_pipe"], plus
    else:  # the FIFO is reachable from every recipe
        assert plain["auth"].startswith("fifo:") and plain["found"] and plus["found"], (plain, plus)
