"""A Dask cluster started the ordinary way: ``dask scheduler`` and ``dask worker``.

Each is its own process (in its own session, so the whole group is ended at
``stop``), listening on 127.0.0.1 on free ports, started in a temporary
folder outside the checkout, with an environment in which only the kiln
package is importable (``PYTHONPATH`` is a folder holding a link to
``kiln/`` and nothing else: not the tests, not the checkout), no preload,
and an empty Dask configuration folder.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from _util import ROOT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask_command():
    script = os.path.join(os.path.dirname(sys.executable), "dask")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "dask"]


def plain_env(folder):
    """The environment of a process that imports nothing of ours but kiln."""
    pkg = os.path.join(folder, "pkg")
    os.makedirs(pkg, exist_ok=True)
    link = os.path.join(pkg, "kiln")
    if not os.path.exists(link):
        # the package this test process imports: the checkout's or an installed wheel's
        import kiln
        os.symlink(os.path.dirname(os.path.realpath(kiln.__file__)), link)
    conf = os.path.join(folder, "dask-config")
    os.makedirs(conf, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DASK_", "KILN_", "PYTHON"))}
    env.update(PYTHONPATH=pkg, DASK_CONFIG=conf, PYTHONUNBUFFERED="1")
    return env


class Cluster:
    """``dask scheduler`` plus ``workers`` ``dask worker`` processes (one worker
    process each, under its nanny, one thread)."""

    def __init__(self, workers=2):
        self.workers = workers
        self.folder = tempfile.mkdtemp(prefix="kiln-cluster-")
        self.env = plain_env(self.folder)
        self.procs = []
        self.address = None

    def _start(self, args, name):
        log = open(os.path.join(self.folder, name + ".log"), "wb")
        p = subprocess.Popen(_dask_command() + args, cwd=self.folder, env=self.env,
                             stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def start(self, timeout=120):
        port = free_port()
        self.address = "tcp://127.0.0.1:%d" % port
        self._start(["scheduler", "--host", "127.0.0.1", "--port", str(port),
                     "--no-dashboard"], "scheduler")
        for i in range(self.workers):
            self._start(["worker", self.address, "--host", "127.0.0.1", "--nworkers", "1",
                         "--nthreads", "1", "--no-dashboard", "--local-directory",
                         os.path.join(self.folder, "w%d" % i)], "worker%d" % i)
        deadline = time.monotonic() + timeout
        while True:   # the scheduler's port answers
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError("a dask process exited at start:\n" + self.logs())
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the scheduler did not start:\n" + self.logs())
                time.sleep(0.1)
        return self

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.folder)):
            if name.endswith(".log"):
                with open(os.path.join(self.folder, name), "rb") as f:
                    out.append("== %s\n%s" % (name, f.read()[-4000:].decode(errors="replace")))
        return "\n".join(out)

    def stop(self):
        """End every process group started here: SIGTERM, then SIGKILL."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:   # the group: a nanny's worker process too
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
