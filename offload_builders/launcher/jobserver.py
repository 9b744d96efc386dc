"""A GNU make jobserver client, so that a compile's jobs run several at once only within the build's own limit.

``make -jN`` shares N job slots among everything it runs: each running recipe holds one (its *implicit* slot),
and ``N - 1`` more are one-byte tokens in a pipe that any recipe may read (take) and must write back (give). A
launcher that ran a compile's jobs side by side on its own would run more processes than the build asked for;
with the jobserver, its first job runs on the compile's implicit slot and each further one on a token.

``MAKEFLAGS`` names the jobserver (``--jobserver-auth=``): ``fifo:PATH`` (make 4.4 and later: a named pipe that
any descendant may open) or ``R,W`` (make 4.3 and earlier: file descriptors inherited from make). make 4.3 gives
those descriptors only to recipes it knows to be recursive (a ``+`` line, or one naming ``$(MAKE)``) yet leaves
``--jobserver-auth=R,W`` in every recipe's ``MAKEFLAGS``; in the others (CMake's compile rules among them) the
numbers are closed, or by then name something else, which must never be read or written. So the descriptors are
used only where they are both ends of one pipe and were inherited; in any doubt there is no jobserver and the
jobs run one after another, as the driver runs them.

A token is written back as the byte that was read (make 4.4 gives meaning to a token's value), and never lost:
:class:`JobServer` and :class:`Slots` return every token they still hold when closed.

Use (a thread pool)::

    with job_slots(len(jobs), os.environ) as slots:              # enter before the pool, leave after it
        with ThreadPoolExecutor(max_workers=slots.limit) as pool:
            futures = [pool.submit(slots.run, run_job, job) for job in jobs]
            results = [future.result() for future in futures]

``Slots.run`` goes around the job's work only, never around a wait for another job: a slot held while waiting
could be the one the awaited job needs (with every token held elsewhere in the build, a deadlock).
"""
from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs every compile's start-up: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import ParamSpec, Self, TypeVar

    _P = ParamSpec("_P")
    _T = TypeVar("_T")

__all__ = ["JobServer", "Slots", "job_slots", "jobserver_from_environment", "makeflags_auth"]


def makeflags_auth(makeflags: str) -> str | None:
    """The jobserver ``MAKEFLAGS`` names, as make reads it: the value of the last ``--jobserver-auth=`` (or, from
    make 4.1 and earlier, ``--jobserver-fds=``) among its options. None: none, or ``-j1`` (a sub-make told to run
    serially).

    Words are split as make writes them (a backslash quotes the next character) and read only up to ``--``: what
    follows is the command line's variable assignments, whose values are not options."""
    auth: str | None = None
    serial = False
    for word in _make_words(makeflags):
        if word == "--":
            break
        if word.startswith(("--jobserver-auth=", "--jobserver-fds=")):
            auth = word.partition("=")[2]
        elif word.startswith("-j") and not word.startswith("--"):
            serial = word == "-j1"
        elif word.startswith("--jobs"):
            serial = word == "--jobs=1"
    return None if serial else auth


def _make_words(text: str) -> list[str]:
    """``text`` split at blanks that no backslash quotes (how make quotes blanks in ``MAKEFLAGS``)."""
    words: list[str] = []
    word: list[str] = []
    quoted = started = False
    for char in text:
        if quoted:
            word.append(char)
            quoted = False
        elif char == "\\":
            quoted = started = True
        elif char in " \t\n":
            if started:
                words.append("".join(word))
                word, started = [], False
        else:
            word.append(char)
            started = True
    if started:
        words.append("".join(word))
    return words


def jobserver_from_environment(environ: Mapping[str, str]) -> JobServer | None:
    """The jobserver of the make that runs this process, connected; None where there is none this process may
    use (no ``MAKEFLAGS`` jobserver, ``-j1``, ``-1,-1``, a malformed value, descriptors that are closed or are
    not both ends of one inherited pipe, a path that is not a FIFO): then run one job at a time."""
    auth = makeflags_auth(environ.get("MAKEFLAGS", ""))
    if auth is None:
        return None
    try:
        if auth.startswith("fifo:"):
            return _open_fifo(auth[len("fifo:"):])
        return _inherited_pipe(auth)
    except (OSError, ValueError, OverflowError):
        return None


def _open_fifo(path: str) -> JobServer | None:
    """make 4.4's named pipe, opened for reading and writing (its protocol) on a descriptor of this process's own,
    so it can be non-blocking without changing make's."""
    import stat

    if not path or not stat.S_ISFIFO(os.stat(path).st_mode):  # open() of a device or FIFO can block or act
        return None
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # replaced between stat() and open()
            os.close(fd)
            return None
    except BaseException:
        os.close(fd)
        raise
    return JobServer(fd, fd, owned=(fd,))


def _inherited_pipe(auth: str) -> JobServer | None:
    """make 4.3's ``R,W``, where they are really the jobserver: open, inherited (no close-on-exec: what this
    process opened itself has it, as Python opens everything, so a reused number is refused), R readable and W
    writable, both ends of one pipe or FIFO."""
    import fcntl
    import stat

    read_text, comma, write_text = auth.partition(",")
    if not comma or not (_is_number(read_text) and _is_number(write_text)):  # "-1,-1": make says none
        return None
    read_fd, write_fd = int(read_text), int(write_text)
    ends = []
    for fd, modes in ((read_fd, (os.O_RDONLY, os.O_RDWR)), (write_fd, (os.O_WRONLY, os.O_RDWR))):
        status = os.fstat(fd)
        if (not stat.S_ISFIFO(status.st_mode) or fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
                or fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE not in modes):
            return None
        ends.append((status.st_dev, status.st_ino))
    if ends[0] != ends[1]:
        return None
    # Read on a description of our own, non-blocking: the inherited one is shared with make and the other
    # clients (make 4.4 asks that its blocking mode not be changed; make 4.3 made it non-blocking).
    try:
        own = os.open(f"/proc/self/fd/{read_fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        own = -1
    if own >= 0:
        status = os.fstat(own)
        if (status.st_dev, status.st_ino) == ends[0]:
            return JobServer(own, write_fd, owned=(own,))
        os.close(own)
    if fcntl.fcntl(read_fd, fcntl.F_GETFL) & os.O_NONBLOCK:
        return JobServer(read_fd, write_fd, owned=())
    return None  # a blocking read could wait past a token another client took first, and not be interrupted


def _is_number(text: str) -> bool:
    return bool(text) and text.isascii() and text.isdigit()


class JobServer:
    """A connected jobserver: take tokens (:meth:`acquire`) and give them back (:meth:`release`), from any
    thread. The process's own (implicit) slot is not a token: n jobs at once need n - 1 tokens.

    Closing (:meth:`close`, or leaving ``with``) writes back every token still held; close only when no other
    thread is in :meth:`acquire`."""

    def __init__(self, read_fd: int, write_fd: int, owned: tuple[int, ...] = ()) -> None:
        import threading

        self.read_fd = read_fd
        self.write_fd = write_fd
        self._owned = owned
        self._held: list[int] = []  # the byte of every token held (given back as read)
        self._lock = threading.Lock()
        self._closed = False
        #: The jobserver stopped working (make gone, pipe closed): no token is taken any more.
        self.broken = False

    @property
    def held(self) -> int:
        """How many tokens this process holds."""
        return len(self._held)

    def acquire(self, timeout: float | None = None) -> bool:
        """Take one token, waiting at most ``timeout`` seconds (None: until there is one; 0: only if one is
        there now). False: none was had (or the jobserver broke)."""
        return self._acquire(timeout, -1)

    def _acquire(self, timeout: float | None, wake_fd: int) -> bool:
        """:meth:`acquire`, also returning False as soon as ``wake_fd`` (>= 0) is readable.

        Waits for the pipe to be readable, then reads it non-blocking: another client may have taken the token in
        between (EAGAIN), then it waits again (make's own way; EINTR is retried by Python)."""
        import select
        import time

        if self._closed:
            raise ValueError("the jobserver client is closed")
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        if wake_fd >= 0:
            poller.register(wake_fd, select.POLLIN)
        while not self.broken:
            wait_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000 + 0.999))
            events = dict(poller.poll(wait_ms))
            if wake_fd >= 0 and events.get(wake_fd):
                return False
            if events.get(self.read_fd, 0) & select.POLLNVAL:
                self.broken = True
            elif events.get(self.read_fd):
                try:
                    token = os.read(self.read_fd, 1)
                except BlockingIOError:
                    token = None  # another client was first
                except OSError:
                    self.broken = True
                    return False
                if token == b"":  # end of file: every writer, make too, is gone
                    self.broken = True
                elif token is not None:
                    with self._lock:
                        if self._closed:  # closed meanwhile (a misuse): the token goes straight back
                            self._write(token[0])
                            return False
                        self._held.append(token[0])
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return False

    def release(self) -> bool:
        """Give back one held token, the byte that was read. False, writing nothing, where none is held (so a
        release after :meth:`close` cannot add a token that make never gave)."""
        with self._lock:
            if not self._held:
                return False
            token = self._held.pop()
            self._write(token)
        return True

    def _write(self, token: int) -> None:
        import select

        while True:
            try:
                os.write(self.write_fd, bytes((token,)))
                return
            except BlockingIOError:  # a full pipe (never with make's few tokens): wait until it has room
                poller = select.poll()
                poller.register(self.write_fd, select.POLLOUT)
                poller.poll()
            except OSError:  # nothing reads the pipe any more: nobody to give it back to
                self.broken = True
                return

    def close(self) -> None:
        """Give back every token still held and close the descriptors this client opened. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held, self._held = self._held, []
            try:
                for token in held:
                    self._write(token)
            finally:
                for fd in self._owned:
                    os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LOCAL = 0
_TOKEN = 1


class Slots:
    """Run callables at most ``limit`` at once, from any threads: each runs on a local slot (with a jobserver:
    the process's own implicit slot, one; without: ``limit`` of them) or on a jobserver token, taken before it
    starts and given back when it returns or raises. A caller waiting for a slot takes whichever comes first:
    a local slot freed by this process, or a token freed by any process of the build.

    Owns ``server``: leaving ``with`` (or :meth:`close`) closes it, giving back the tokens. Close only once no
    callable runs any more (after the thread pool's own ``with``)."""

    def __init__(self, limit: int, server: JobServer | None = None) -> None:
        import threading

        #: The most callables that run at once: the size for the thread pool (1: run them one by one).
        self.limit = max(1, limit)
        self.server = server
        self._local = 1 if server is not None else self.limit
        self._running = 0  # callables running, and the one caller reading a token
        self._waiting = 0
        self._reading = False
        self._closed = False
        self._cond = threading.Condition()
        self._wake_read = self._wake_write = -1
        if server is not None and self.limit > 1:
            # Wakes the caller that waits for a token when a local slot is freed (no polling).
            self._wake_read, self._wake_write = os.pipe()
            os.set_blocking(self._wake_read, False)
            os.set_blocking(self._wake_write, False)

    def run(self, function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``function(*args, **kwargs)`` on a slot: waits for one, runs, gives the slot back (even on an
        exception). Raises RuntimeError once the slots are closed."""
        slot = self._take()
        try:
            return function(*args, **kwargs)
        finally:
            self._give(slot)

    @property
    def waiting(self) -> int:
        """How many callers of :meth:`run` wait for a slot (for the jobserver's token or for this process's)."""
        return self._waiting

    def _take(self) -> int:
        counted = False
        try:
            while True:
                with self._cond:
                    if not counted:  # counted in the same hold of the lock as the first look for a slot
                        self._waiting += 1
                        counted = True
                    while True:
                        if self._closed:
                            raise RuntimeError("the job slots are closed")
                        if self._running < self.limit:
                            if self._local:
                                self._local -= 1
                                self._running += 1
                                return _LOCAL
                            if self.server is not None and not self.server.broken and not self._reading:
                                self._reading = True  # this caller waits for a token, the others for it
                                self._running += 1
                                break
                        self._cond.wait()
                slot = self._read_token()
                if slot is not None:
                    return slot
        finally:
            if counted:
                with self._cond:
                    self._waiting -= 1

    def _read_token(self) -> int | None:
        """As the one caller reading the jobserver: a token, or the local slot if that is freed first. None: the
        jobserver broke (then only the local slot is left)."""
        assert self.server is not None
        slot = None
        try:
            while True:
                if self.server._acquire(None, self._wake_read):
                    slot = _TOKEN
                    return slot
                with self._cond:
                    self._drain_wake()
                    if self._closed:
                        raise RuntimeError("the job slots are closed")
                    if self._local:
                        self._local -= 1
                        slot = _LOCAL
                        return slot
                    if self.server.broken:
                        return None
        finally:
            with self._cond:
                self._reading = False
                if slot is None:
                    self._running -= 1
                self._cond.notify_all()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_read, 64):
                pass
        except BlockingIOError:
            pass

    def _give(self, slot: int) -> None:
        with self._cond:
            self._running -= 1
            if slot == _LOCAL:
                self._local += 1
                if self._reading:
                    self._wake()
            elif self.server is not None:
                self.server.release()
            self._cond.notify_all()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b"!")
        except BlockingIOError:  # full: the reader has wake-ups enough
            pass

    def close(self) -> None:
        """Give back every token (closing the jobserver client) and stop; waits for a caller reading a token to
        notice. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            if self._reading:
                self._wake()
            self._cond.notify_all()
            while self._reading:
                self._cond.wait()
        if self.server is not None:
            self.server.close()
        for fd in (self._wake_read, self._wake_write):
            if fd >= 0:
                os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def job_slots(requested: int, environ: Mapping[str, str]) -> Slots:
    """Slots for up to ``requested`` jobs at once within the jobserver of ``environ``'s make: the implicit slot
    and up to ``requested - 1`` tokens. Without a jobserver this process may use, ``limit`` is 1 (the jobs run one
    after another, as the driver runs them). A context manager: see :class:`Slots`."""
    server = jobserver_from_environment(environ) if requested > 1 else None
    return Slots(requested, server) if server is not None else Slots(1)
