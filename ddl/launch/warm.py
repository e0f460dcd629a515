"""Warm starts: local jobs forked from a process that imported the heavy libraries once.

A local job is a new Python process (`python -u -m submitit.core._submit FOLDER`) that spends ~5 s of CPU
importing torch, torch._dynamo (torch's optimizers import it), MLflow and its SQL store before it trains.
A sweep of short jobs pays that once a job. The warm server imports them once, then forks a child for each
job, which runs as `python ARGS` would have:

    python -m ddl.launch.warm serve SOCKET           # the server (a local sweep starts it; it ends when
                                                     # its stdin closes and its children have ended)
    python -S .../ddl/launch/warm.py SOCKET ARGS...  # the client: what submitit starts in place of `python`

The client is a stdlib-only script (its start-up ~40 ms). It sends the server its argv, environment,
working directory, umask, blocked and ignored signals and its stdin/stdout/stderr (SCM_RIGHTS); the forked
child takes them all, so it writes where the job's own process would, sees the job's environment and keeps
the job's signal mask (a sweep's jobs start with SIGINT blocked). The client forwards the signals it gets
(submitit's SIGTERM, SIGUSR2 before a timeout) to the child and exits with the child's status; if the
client is killed, the server kills the child. Without a server (none started, or it has ended) the client
execs `python ARGS`, the cold start. Linux only: forking a process that imported torch is not safe on macOS.

Only third-party libraries that read no environment of the job's at import are preloaded: ddl's own
modules, lm-eval, datasets and matplotlib are imported by the child, after it has taken the job's
environment. Since the child is a fork, numpy's global random state is re-seeded in it (Python's own
`random` re-seeds itself after a fork).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import sys
import time

SOCKET_ENV = "DDL_WARM_SOCKET"       # a server already running (the test suite's): local sweeps fork from it
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PRELOAD = ("torch", "torch._dynamo", "mlflow", "mlflow.store.tracking.sqlalchemy_store", "hydra", "omegaconf",
           "submitit", "hydra_plugins.hydra_submitit_launcher.submitit_launcher",
           "mlflow.tracing.processor.base_mlflow", "mlflow.tracing.processor.otel",  # mlflow.set_tracking_uri's first
           "rich.console", "rich.table")                                             # ddl.launch.table's live lines
# Where installed (lm-eval's sacrebleu brings it): torch._dynamo's exit handler imports it in every process that
# imported dynamo, every job (it reads WCWIDTH_PYTHON, which no job sets).
OPTIONAL_PRELOAD = ("tabulate",)
STDIO = 3
MESSAGE = 1 << 20                    # the largest request (argv and environment), bytes
# What torch, OpenMP, BLAS and Python read of the environment as the server imports them: a job whose values differ
# would run with the server's, so it starts cold.
STARTUP_ENV = ("TORCH_LOGS", "TORCHDYNAMO_", "TORCHINDUCTOR_", "OMP_", "MKL_", "OPENBLAS_", "PYTHONHASHSEED",
               "PYTHONWARNINGS")
# ... but for what inductor reads as it compiles, and sets then in its own process's environment.
READ_WHEN_USED = ("TORCHINDUCTOR_CACHE_DIR",)
# Libraries that start a thread as they are imported, asked not to in the server (a fork keeps only the thread that
# forks): numpy's OpenBLAS pool (the children's numpy BLAS then runs on one thread; torch's own is unaffected) and
# pyarrow's jemalloc background thread.
ONE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


def supported() -> bool:
    return sys.platform == "linux"


def client_command(path: str) -> str:
    """What submitit's local executor runs in place of its python (`python` parameter): the client."""
    import shlex
    return " ".join(shlex.quote(part) for part in (sys.executable, "-S", os.path.abspath(__file__), path))


def start_server():
    """(the server's process, its socket's path) for a server started now in a folder of its own; it stops
    listening when its stdin closes, and ends with its last child."""
    import subprocess
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="ddl-warm-"), "socket")
    return subprocess.Popen([sys.executable, "-m", "ddl.launch.warm", "serve", path], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path


@contextlib.contextmanager
def local_python(enabled: bool, jobs: int):
    """The `python` of submitit's local executor for a sweep of `jobs` jobs: the client of the server in
    DDL_WARM_SOCKET (a search's, the suite's), or of one started here until the `with` ends (its jobs keep it until
    they end); None (the cold start) when not `enabled`, off Linux, for a single job of its own (nothing to share),
    when the server is not listening within 10 s, or when it would start the jobs cold (`probe`: said in a line)."""
    if not (enabled and supported()):
        yield None
    elif os.environ.get(SOCKET_ENV):
        yield _if_warm(os.environ[SOCKET_ENV])
    elif jobs < 2:
        yield None
    else:
        with _server() as path:
            yield _if_warm(path) if path else None


@contextlib.contextmanager
def shared_server(enabled: bool):
    """One server for everything launched in the `with` (a search's rounds), in DDL_WARM_SOCKET meanwhile, rather
    than one a launch (each paying the ~5 s of imports again)."""
    if not (enabled and supported()) or os.environ.get(SOCKET_ENV):
        yield
        return
    with _server() as path:
        if path:
            os.environ[SOCKET_ENV] = path
        try:
            yield
        finally:
            os.environ.pop(SOCKET_ENV, None)


@contextlib.contextmanager
def _server():
    """A server started now: its socket's path once it listens (None if not within 10 s); when the `with` ends it
    stops listening, and this waits (30 s at most) for its last job."""
    import subprocess
    server, path = start_server()
    deadline = time.monotonic() + 10
    while not os.path.exists(path) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield path if os.path.exists(path) else None
    finally:
        server.stdin.close()              # the server stops listening, and ends with its last job
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=30)       # the sweep's jobs have ended: its CPU then counts in the sweep's
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))   # a server that never listened leaves its folder (one that did, not)


def _if_warm(path: str) -> str | None:
    """The client of the server at `path`, unless the server says a job of this environment would start cold: then
    one line saying why, and None (every job starts cold)."""
    reason = probe(path, dict(os.environ))
    if reason:
        print(f"ddl-run: jobs start cold, not forked from the warm server: {reason}", flush=True)
        return None
    return client_command(path)


def probe(path: str, env: dict) -> str | None:
    """Why the server at `path` would start a job of environment `env` cold (`why_cold`), or None; None too when
    it does not answer (each client then finds out for itself)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps({"probe": True, "env": env}).encode()], list(range(STDIO)))
        answer = _receive(conn) or {}
    except OSError:
        return None
    finally:
        conn.close()
    return answer.get("cold")


def why_cold(job_env: dict, server_env: dict, threads: int) -> str | None:
    """Why a job of environment `job_env` cannot be forked from a server started in `server_env`, running `threads`
    threads: a start-up variable of torch, OpenMP, BLAS or Python that differs, or a second thread."""
    keys = sorted({k for env in (job_env, server_env) for k in env
                   if k.startswith(STARTUP_ENV) and k not in READ_WHEN_USED})
    differ = [k for k in keys if job_env.get(k) != server_env.get(k)]
    if differ:
        k = differ[0]
        return (f"the job's {k}={job_env.get(k, '(unset)')} differs from the server's {k}="
                f"{server_env.get(k, '(unset)')}, which torch, OpenMP, BLAS or Python read as it started")
    if threads > 1:
        return f"the server runs {threads} threads, and a fork keeps one"
    return None


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


# -- the client ---------------------------------------------------------------------------------------------
def _python_args(args: list[str]) -> dict | None:
    """{'unbuffered', 'module' or 'script', 'argv'} for `python [-u] (-m MODULE | SCRIPT) ARGS`; None for any
    other form (the client then starts cold)."""
    unbuffered = False
    while args and args[0] == "-u":
        unbuffered, args = True, args[1:]
    if len(args) >= 2 and args[0] == "-m":
        return dict(unbuffered=unbuffered, module=args[1], argv=args[2:])
    if args and not args[0].startswith("-"):
        return dict(unbuffered=unbuffered, script=args[0], argv=args[1:])
    return None


def _cold(args: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *args])


def _receive(conn: socket.socket) -> dict | None:
    data = conn.recv(MESSAGE)
    return json.loads(data) if data else None


def client(path: str, args: list[str]) -> None:
    """Run `python ARGS` as a child of the server at `path`; exit as that child did."""
    request = _python_args(args)
    if request is None:
        _cold(args)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)   # held until they can be forwarded
    request.update(env=dict(os.environ), cwd=os.getcwd(), umask=os.umask(0o022),
                   blocked=sorted(int(s) for s in mask),
                   ignored=[int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN])
    os.umask(request["umask"])
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        socket.send_fds(conn, [json.dumps(request).encode()], list(range(STDIO)))
        started = _receive(conn)
    except OSError:
        started = None
    if not started or "cold" in started:  # no server, one that ended, or one that would not fork this job
        conn.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if started:
            print(f"ddl warm start: this job starts cold: {started['cold']}", file=sys.stderr, flush=True)
        _cold(args)
    child = started["pid"]
    for sig in FORWARDED:
        if sig not in request["ignored"]:
            signal.signal(sig, lambda signum, frame: _forward(child, signum))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        ended = _receive(conn)
    except OSError:
        ended = None
    if ended is None:                     # the server died: the child's status is lost with it
        while _alive(child):
            time.sleep(0.2)
        os._exit(1)
    status = ended["status"]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _forward(child: int, signum: int) -> None:
    try:
        os.kill(child, signum)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- the server ---------------------------------------------------------------------------------------------
def serve(path: str) -> dict | None:
    """Listen at `path`, preload, fork a child per request; in a child, return its request (the caller runs
    it). Returns None in the server once its stdin has closed (or SIGTERM came) and its children have ended."""
    return _Server(path).run()


class _Server:
    """The server's state: its listener, selector, children (pid -> its client's connection) and the environment
    it started in (what a job's start-up variables are compared with)."""

    def __init__(self, path: str):
        signal.signal(signal.SIGINT, signal.SIG_IGN)        # a terminal's Ctrl-C is the sweep's to handle
        self.path, self.env = path, dict(os.environ)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(64)                            # clients queue while the imports run
        self.children: dict[int, socket.socket] = {}
        self.stopping: list[bool] = []

    def preload(self) -> None:
        """The imports, one-threaded (ONE_THREAD_ENV where the environment sets none of it), then frozen."""
        import inspect
        os.environ.update({k: v for k, v in ONE_THREAD_ENV.items() if k not in os.environ})
        for module in PRELOAD:
            __import__(module)
        for module in OPTIONAL_PRELOAD:
            with contextlib.suppress(ImportError):
                __import__(module)
        os.environ.clear()
        os.environ.update(self.env)
        # torch.library.register_fake (the C++ kernels' fakes) reads its caller's line through inspect, whose first
        # lookup finds the real path of every module imported: found here once for the preloaded ones (~60 ms a job)
        inspect.getmodule(None, _filename="")
        gc.freeze()     # a child's collections skip the preloaded heap, which then stays shared (no copy on write)

    def run(self) -> dict | None:
        import selectors
        self.preload()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.append(True))
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in self.selector.select(timeout=1.0):
                request = self.handle(key.data)
                if request is not None:
                    return request                          # in a forked child
            self.reap()
            if self.stopping:
                self.stop_listening()
                if not self.children:
                    return None

    def handle(self, what) -> dict | None:
        if what == "accept":
            return self.accept()
        if isinstance(what, int):                           # a client that ended (or was killed) before its child
            with contextlib.suppress(ProcessLookupError):
                os.kill(what, signal.SIGKILL)
        elif what == "stdin":
            if not os.read(sys.stdin.fileno(), 4096):
                self.selector.unregister(sys.stdin.fileno())
                self.stopping.append(True)
        else:
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 4096)
        return None

    def accept(self) -> dict | None:
        """A client's request: answered cold (why_cold), or a child forked for it; in the child, the request."""
        import selectors
        conn, _ = self.listener.accept()
        request = _take_request(conn)
        if request is None:
            conn.close()
            return None
        cold = why_cold(request["env"], self.env, _threads())
        pid = None
        if not cold and not request.get("probe"):
            with contextlib.suppress(OSError):                  # else the client starts cold
                pid = os.fork()
        if pid == 0:
            self.close_in_child(conn)
            return request
        for fd in request["fds"]:
            os.close(fd)
        if pid is None:
            answer = cold if request.get("probe") else cold or "the server could not fork"
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"cold": answer}).encode())
            conn.close()
            return None
        self.children[pid] = conn
        conn.send(json.dumps({"pid": pid}).encode())
        self.selector.register(conn, selectors.EVENT_READ, pid)
        return None

    def close_in_child(self, conn: socket.socket) -> None:
        self.selector.close()
        self.listener.close()
        for other in [*self.children.values(), conn]:
            other.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wake_r), os.close(self.wake_w)

    def reap(self) -> None:
        """Each child that ended: its status to its client."""
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.send(json.dumps({"status": status}).encode())
                conn.close()

    def stop_listening(self) -> None:
        if self.listener.fileno() >= 0:
            self.selector.unregister(self.listener)
            self.listener.close()
            os.unlink(self.path)
            with contextlib.suppress(OSError):          # the folder local_python made for it
                os.rmdir(os.path.dirname(self.path))


def _take_request(conn: socket.socket) -> dict | None:
    try:
        data, fds, _, _ = socket.recv_fds(conn, MESSAGE, STDIO)
    except OSError:
        return None
    if not data or len(fds) != STDIO:
        for fd in fds:
            os.close(fd)
        return None
    return {**json.loads(data), "fds": fds}


def become(request: dict) -> None:
    """In the forked child: take the client's stdio, environment, directory, umask and signals, run its module
    or script as `python` would, as __main__, and exit as a fork's child does (multiprocessing's way): Python's
    exit steps (threads joined, atexit, stdio flushed), then os._exit. The interpreter's teardown of the
    preloaded heap, ~2 s that frees nothing a process's end would not, is skipped."""
    import runpy

    from . import interpreter_private
    _take_process(request)
    code, interrupted = 0, False
    try:
        if "module" in request:
            sys.argv, sys.path[0] = [request["module"], *request["argv"]], os.getcwd()
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [request["script"], *request["argv"]]
            sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
            runpy.run_path(request["script"], run_name="__main__")
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException as err:            # as the interpreter reports an uncaught exception, from the job's frame
        trace = err.__traceback__
        while trace.tb_next and trace.tb_frame.f_code.co_filename in (__file__, runpy.__file__, "<frozen runpy>"):
            trace = trace.tb_next
        sys.excepthook(type(err), err, err.with_traceback(trace).__traceback__)
        code, interrupted = 1, isinstance(err, KeyboardInterrupt)
    finally:
        interpreter_private.finish_as_at_exit()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    if interrupted:                         # killed by SIGINT, as Python reports an uncaught Ctrl-C
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _take_process(request: dict) -> None:
    """The forked child takes the client's stdio, environment, directory, umask, signal dispositions and mask, and
    buffering; numpy's global random state is re-seeded (Python's `random` re-seeds itself after a fork)."""
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in FORWARDED:
        handler = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        signal.signal(sig, signal.SIG_IGN if sig in request["ignored"] else handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, request["blocked"])
    unbuffered = request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=stream.isatty(), write_through=unbuffered or stream is sys.stderr)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _exit_code(code) -> int:
    """sys.exit's argument as the process's status: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"] and len(argv) == 2:
        request = serve(argv[1])
        if request is not None:
            become(request)
        os._exit(0)                       # its last child has ended; skip the teardown of the preloaded heap
    if len(argv) < 2:
        sys.exit("usage: python -m ddl.launch.warm serve SOCKET | python warm.py SOCKET PYTHON-ARGS...")
    client(argv[0], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
