"""A run's trace files read in worker processes, each file once.

Why one job per file, started before the ranks are known: ``discover`` must
peek into every file to place it (its ``distributedInfo``), and for a gzip
file that means inflating all of it. Done in the notebook's process, one file
after another, that cost as much as summarising the ranks. Here each worker
inflates a file once (``formats.kineto.peek.read_json``), answers the peek
from those bytes and summarises the trace straight away (``figures_of``);
``discover`` gets the peeks (``RunReader.peek_all``), places the files, and
the run takes each placed file's figures (``RunReader.rank``). A file that
turns out to be a duplicate or has no rank was summarised for nothing; that
is rare, and the figures are dropped.

Beyond one machine: any ``concurrent.futures.Executor`` may read the files
instead (``executor``), such as a Dask cluster's (``dask_executor``): each
file is read and summarised where the executor runs the job, and only its
peek and figures travel back. Dask, because it is the engine of this kind a
Python data team most often has already (a scheduler any process can join,
``pip install distributed``, no service to run), its ``Client`` is a
``concurrent.futures`` executor, so the reading code is the same one, and its
workers are plain Python processes that import torchlens; Ray would need its
own runtime for the same map. The workers must see the files at the same
paths (a shared file system), and have torchlens installed.

Start method: ``forkserver`` (``spawn`` where missing), not fork: a notebook
kernel has threads, and forking it is unsafe; the command line, which has
none, asks for fork (``RunReader``'s ``fork``). Files go to the workers in
chunks (fewer round trips); only the peek (a few top-level members) and the
figures (a few KB) come back.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from itertools import repeat
from typing import Any

import msgspec

from torchlens.formats.kineto.peek import Peek
from torchlens.formats.run_folder.sources import Problem
from torchlens.model.run_figures import TraceFigures

#: What a worker computes from one readable trace: ``figures_of(trace, top)``.
FiguresOf = Callable[[Any, int], TraceFigures]


class FileResult(msgspec.Struct):
    """What a worker sends back for one file: its ``peek`` verdict and, for a
    usable trace, its ``figures`` or the ``problem`` that stopped them."""

    peek: Peek
    figures: TraceFigures | None = None
    problem: Problem | None = None


def file_job(path: str, figures_of: FiguresOf, top: int) -> FileResult:
    """In a worker: one file's ``FileResult``."""
    from torchlens.formats.kineto import load_trace
    from torchlens.formats.kineto.peek import read_json
    from torchlens.formats.kineto.reader import ingest_bytes

    data, seen = read_json(path)
    out = FileResult(seen)
    if seen.kind is not None:
        return out
    try:
        trace = ingest_bytes(data, path) if data is not None else load_trace(path)
        out.figures = figures_of(trace, top)
    except Exception as exc:  # noqa: BLE001 - named, the other traces go on
        out.problem = Problem("unreadable", path, f"{type(exc).__name__}: {str(exc)[:300]}; "
                              "left out of the run")
    return out


def _context(fork: bool = False) -> Any:
    """The workers' start method, or None: read in this process.

    A script (``__main__`` is a file) is imported again by every forkserver or
    spawn worker, which fails without an ``if __name__ == "__main__":`` guard
    (a screen of RuntimeErrors for a plain ``torchlens.load(folder)``): a
    script forks when no other Python thread could hold a lock, else reads in
    this process. A notebook's ``__main__`` is no file, so forkserver is safe."""
    methods = multiprocessing.get_all_start_methods()
    script = getattr(sys.modules.get("__main__"), "__file__", None) is not None
    if (fork or script) and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if script:
        return None
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def dask_executor(address: str) -> tuple[Executor, Any]:
    """An executor on the Dask cluster whose scheduler is at ``address``
    (``tcp://host:8786``; its TLS, if any, from Dask's own configuration), and
    the client to close when done. ``InputError`` without ``distributed``
    installed, or when the scheduler cannot be reached."""
    from torchlens.model import InputError

    try:
        from distributed import Client
    except ImportError:
        raise InputError("--dask needs Dask's distributed package: pip install "
                         "'torchlens[dask]' (or distributed) where torchlens runs, and "
                         "torchlens on every worker") from None
    try:
        client = Client(address, timeout=30)
    except (OSError, TimeoutError) as exc:
        raise InputError(f"--dask {address}: no Dask scheduler answered there ({exc}); "
                         "give the address its scheduler prints (tcp://host:8786)") from None
    return client.get_executor(), client


class RunReader:
    """Reads files with ``file_job`` (in ``workers`` processes, default the CPU
    count; in this process when that is 1 or there is one file) and keeps
    each file's result for ``rank``. Use as a context manager: the pool is
    shut down on exit. ``fork``: start the workers with ``fork`` when this
    process runs no other Python thread (the command line: workers then
    need not import numpy and torchlens again, about 0.3 s of CPU each)."""

    def __init__(self, figures_of: FiguresOf, top: int, workers: int | None = None,
                 fork: bool = False, executor: Executor | None = None) -> None:
        self.figures_of, self.top, self.fork = figures_of, top, fork
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.results: dict[str, FileResult] = {}
        self._pool: ProcessPoolExecutor | None = None
        #: the caller's executor (a Dask cluster's): used, never shut down here
        self.executor = executor

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def peek_all(self, paths: list[str]) -> list[Peek]:
        """``discover``'s ``peek_all``: every file read once, its peek returned."""
        todo = [p for p in dict.fromkeys(paths) if p not in self.results]
        if self.executor is not None and todo:
            n = len(todo)
            done = list(self.executor.map(file_job, todo, [self.figures_of] * n,
                                          [self.top] * n))
            self.results.update(zip(todo, done, strict=True))
            return [self.results[p].peek for p in paths]
        workers = min(self.workers, len(todo))
        context = _context(self.fork) if workers > 1 and self._pool is None else None
        if workers > 1 and self._pool is None and context is None:
            workers = 1  # a script with threads: its workers could not import it
        if workers <= 1:
            done = [file_job(p, self.figures_of, self.top) for p in todo]
        else:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
            # a few chunks per worker: fewer round trips, still balanced at the end
            chunk = max(1, min(16, len(todo) // (4 * workers)))
            done = list(self._pool.map(file_job, todo, repeat(self.figures_of),
                                       repeat(self.top), chunksize=chunk))
        self.results.update(zip(todo, done, strict=True))
        return [self.results[p].peek for p in paths]

    def rank(self, paths: list[str]) -> tuple[list[TraceFigures], list[Problem]]:
        """One rank's figures (``trace``: the file's place among ``paths``) and
        problems, as ``_rank_job`` gave them: files in order, an unreadable one
        a problem and skipped."""
        figures, problems = [], []
        for i, path in enumerate(paths):
            res = self.results.get(path)
            if res is None:  # not peeked through this reader: read it here
                res = file_job(path, self.figures_of, self.top)
            if res.figures is not None:
                figures.append(msgspec.structs.replace(res.figures, trace=i))
            elif res.problem is not None:
                problems.append(res.problem)
        return figures, problems
