"""Checkpoints of Hop workers: parameters, optimizer state, minibatch stream and iteration.

A checkpoint of worker I in iteration k is one ``.npz`` file, ``<folder>/worker-<I>/iter-<k>.npz``
(k with 8 digits), holding the state worker I had on *entering* iteration k:

* ``param/<name>``: the parameters x_k;
* ``opt/<name>``: the optimizer's momentum buffers;
* ``data/order``: the permutation of the worker's shard in use (with the position and the
  generator's state in the metadata, the minibatch stream continues exactly where it was);
* ``meta``: a JSON string (worker, iteration, run, model, layout, hopbus version, time, the
  minibatch position), so that a file explains itself.

Only plain arrays: loading never needs ``allow_pickle``. A file is written to a temporary name in
the same folder, flushed and fsynced, renamed over its final name (atomic on POSIX) and the folder
fsynced: a crash at any point leaves either the previous checkpoints or the new one, never a
half-written file under a final name. Readers ignore temporary files and skip unreadable ones.

A *checkpoint set* is every worker 0..N-1 at the same iteration; ``newest_complete`` finds the
newest one, the iteration ``hopbus train --resume`` restarts every worker from. Pure file I/O:
no Redis, no network.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hopbus import __version__
from hopbus.data.batches import position_problem
from hopbus.errors import UserError

FORMAT = 1
KEEP_MIN = 3  # checkpoints kept per worker at least: the newest, and two to fall back on
_NAME = re.compile(r"^iter-(\d{8,})\.npz$")
_TMP_SUFFIX = ".tmp"

Layout = tuple[tuple[str, str, tuple[int, ...]], ...]

FOLDER = "checkpoints"
"""The checkpoint folder inside a results folder: where hopbus train has its workers write
them, and a worker started by hand does by default (``default_folder``)."""


def default_folder(run: str) -> Path:
    """A worker's --checkpoint-dir when none is given: FOLDER in the results folder that
    hopbus watch writes by default, ``runs/RUN`` (which watch therefore accepts holding it)."""
    return Path("runs") / run / FOLDER


class CheckpointError(UserError):
    """A checkpoint that is missing, unreadable, or of another model."""


@dataclass
class WorkerState:
    """What a worker needs to continue from an iteration: see the module docstring."""

    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    order: np.ndarray | None = None  # the minibatch stream's current permutation
    stream: dict[str, Any] = field(default_factory=dict)  # its position and generator (JSON)


@dataclass
class Checkpoint:
    """A checkpoint as read back: the state and its metadata."""

    worker: int
    iteration: int
    run: str
    state: WorkerState
    meta: dict[str, Any]


def layout_of(arrays: Mapping[str, np.ndarray]) -> Layout:
    """(name, dtype, shape) of every array, in order: what a checkpoint must match to load."""
    return tuple((name, a.dtype.name, tuple(int(d) for d in a.shape)) for name, a in arrays.items())


def worker_folder(folder: Path, worker: int) -> Path:
    return Path(folder) / f"worker-{worker}"


def path_of(folder: Path, worker: int, iteration: int) -> Path:
    """Where worker ``worker``'s checkpoint of ``iteration`` lives."""
    return worker_folder(folder, worker) / f"iter-{iteration:08d}.npz"


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save(
    folder: Path,
    worker: int,
    iteration: int,
    state: WorkerState,
    *,
    run: str,
    model: str = "",
) -> Path:
    """Write worker ``worker``'s checkpoint of ``iteration`` atomically; returns its path.
    Raises OSError (disk full, no permission) with nothing left under the final name, and
    ValueError for an object array (it would need pickle to load)."""
    final = path_of(folder, worker, iteration)
    final.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "worker": worker,
        "iteration": iteration,
        "run": run,
        "model": model,
        "layout": [list(x) for x in layout_of(state.params)],
        "hopbus": __version__,
        "time": time.time(),
        "stream": state.stream,
    }
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta))}
    arrays.update({f"param/{k}": np.asarray(v) for k, v in state.params.items()})
    arrays.update({f"opt/{k}": np.asarray(v) for k, v in state.optimizer.items()})
    if state.order is not None:
        arrays["data/order"] = np.asarray(state.order)
    for name, a in arrays.items():
        if a.dtype.hasobject:  # would need pickle to load back
            raise ValueError(f"checkpoint array {name} has dtype object: not saved")
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=_TMP_SUFFIX, dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(final.parent)
    return final


def iterations(folder: Path, worker: int) -> list[int]:
    """Iterations worker ``worker`` has a checkpoint file of (not checked), oldest first."""
    try:
        names = os.listdir(worker_folder(folder, worker))
    except OSError:
        return []
    found = (_NAME.match(n) for n in names)
    return sorted(int(m.group(1)) for m in found if m)


def _read_meta(zf: zipfile.ZipFile) -> dict[str, Any]:
    with zf.open("meta.npy") as fh:
        raw = np.lib.format.read_array(fh, allow_pickle=False)
    meta = json.loads(str(raw))
    if not isinstance(meta, dict):
        raise ValueError("metadata is not an object")
    return meta


def readable(folder: Path, worker: int, iteration: int) -> bool:
    """Is that checkpoint complete and intact (every member's CRC checks, the metadata names
    this worker and iteration)? A truncated or corrupt file is False, never an exception."""
    path = path_of(folder, worker, iteration)
    try:
        with zipfile.ZipFile(path) as zf:
            if zf.testzip() is not None:
                return False
            meta = _read_meta(zf)
            _check_sizes(zf)
    except (OSError, ValueError, KeyError, RecursionError, zipfile.BadZipFile, EOFError):
        return False
    return meta.get("worker") == worker and meta.get("iteration") == iteration


def newest_complete(
    folder: Path, workers: int, skipped: list[str] | None = None, *, full: bool = False
) -> int | None:
    """The largest iteration for which every worker 0..workers-1 has a readable checkpoint;
    None if there is no such iteration. Unreadable files are skipped, not fatal; ``skipped``
    collects why each was (for the one line that says so). ``full``: read every file of a
    candidate set whole (``problem``: CRCs, finite numbers, a sane position), as a resume
    must, instead of its metadata and CRCs only."""
    common: set[int] | None = None
    for w in range(workers):
        have = set(iterations(folder, w))
        common = have if common is None else common & have
        if not common:
            return None
    for k in sorted(common or (), reverse=True):
        why = [
            problem(folder, w, k)
            if full
            else None
            if readable(folder, w, k)
            else str(path_of(folder, w, k))
            for w in range(workers)
        ]
        bad = [x for x in why if x is not None]
        if not bad:
            return k
        if skipped is not None:
            skipped.extend(bad)
    return None


DEFLATE_RATIO = 1100
"""More than deflate can shrink anything (some 1032:1): a member that says it unpacks to more is
no zip hopbus or numpy wrote."""


MAX_UNPACKED = 1 << 30
"""What one checkpoint file may unpack to, all its arrays together: many times the largest a
hopbus model writes (vgg11's parameters and momentum: some 74 MB, its data order 0.4 MB). A
2.3 MB file whose order unpacked to 2.4 GB passed the ratio check and exhausted memory."""

_NPY_HEADERS = {  # the two npy versions numpy.savez writes
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _check_sizes(z: zipfile.ZipFile) -> None:
    """Every array of the file holds the bytes its header declares, before any is read: numpy
    allocates what the header says first, so a header that declares 10**12 elements (in a
    64-byte member) would ask for terabytes. Raises ValueError for one that does not, and
    for a file that unpacks to more than ``MAX_UNPACKED``."""
    if sum(info.file_size for info in z.infolist()) > MAX_UNPACKED:
        raise ValueError(f"it unpacks to more than {MAX_UNPACKED >> 20} MiB")
    for info in z.infolist():
        if info.file_size > max(info.compress_size, 1) * DEFLATE_RATIO:
            raise ValueError(f"{info.filename}: declares more than it can unpack to")
        with z.open(info) as fh:
            version = np.lib.format.read_magic(fh)
            if version not in _NPY_HEADERS:
                raise ValueError(f"{info.filename}: npy format {version}")
            shape, _, dtype = _NPY_HEADERS[version](fh, max_header_size=10_000)
        if int(np.prod(shape, dtype=object)) * dtype.itemsize > info.file_size:
            raise ValueError(f"{info.filename}: its header declares more than it holds")


def load(folder: Path, worker: int, iteration: int, layout: Layout | None = None) -> Checkpoint:
    """Read worker ``worker``'s checkpoint of ``iteration``. With ``layout`` (the model's
    parameters' names, dtypes and shapes), refuse a checkpoint of another model. Every problem
    is one CheckpointError line naming the file."""
    path = path_of(folder, worker, iteration)
    if not path.is_file():
        raise CheckpointError(
            f"{path} is {_what(path)}, not a checkpoint file: move it away"
            if path.exists() or path.is_symlink()
            else f"no checkpoint of worker {worker} at iteration {iteration}: {path}"
        )
    try:
        with zipfile.ZipFile(path) as z:
            _check_sizes(z)
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (
        OSError, ValueError, KeyError, RecursionError, zipfile.BadZipFile, EOFError, MemoryError,
    ) as exc:  # fmt: skip
        raise CheckpointError(
            f"checkpoint {path} is unreadable (truncated or corrupt: {type(exc).__name__})"
        ) from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {path} is unreadable (its metadata is not an object)")
    if meta.get("worker") != worker or meta.get("iteration") != iteration:
        raise CheckpointError(
            f"checkpoint {path} holds worker {meta.get('worker')} at iteration "
            f"{meta.get('iteration')}, not worker {worker} at {iteration}"
        )
    params = {k[len("param/") :]: v for k, v in arrays.items() if k.startswith("param/")}
    stored = layout_of(params)
    if layout is not None and stored != tuple(layout):
        raise CheckpointError(
            f"checkpoint {path} holds another model's parameters ({_brief(stored)}; this run's "
            f"model has {_brief(tuple(layout))}): it cannot resume this run"
        )
    optimizer = {k[len("opt/") :]: v for k, v in arrays.items() if k.startswith("opt/")}
    for kind, group in (("parameters", params), ("optimizer state", optimizer)):
        for name, a in group.items():
            if a.dtype.kind != "f" or not np.isfinite(a).all():
                raise CheckpointError(
                    f"checkpoint {path} holds {kind} {name!r} that are not all finite numbers "
                    "(the run had diverged): resume from an older set (remove this one)"
                )
    for name, a in optimizer.items():  # momentum for parameters it holds, shaped like them
        if name not in params or a.shape != params[name].shape:
            raise CheckpointError(
                f"checkpoint {path} holds optimizer state {name!r} that fits none of its "
                "parameters: resume from an older set (remove this one)"
            )
    order = arrays.get("data/order")
    stream = meta.get("stream") or {}
    if not isinstance(stream, dict) or (order is not None and position_problem(order, stream)):
        raise CheckpointError(
            f"checkpoint {path} holds a malformed minibatch position: resume from an older set "
            "(remove this one)"
        )
    state = WorkerState(params=params, optimizer=optimizer, order=order, stream=dict(stream))
    return Checkpoint(worker, iteration, str(meta.get("run", "")), state, meta)


def problem(folder: Path, worker: int, iteration: int) -> str | None:
    """Why worker ``worker``'s checkpoint of ``iteration`` cannot be resumed from (the whole
    file read and checked, as ``load`` does); None if it can."""
    try:
        load(folder, worker, iteration)
    except CheckpointError as exc:
        return str(exc)
    return None


def _brief(layout: Layout) -> str:
    shown = ", ".join(f"{n} {d}{list(s)}" for n, d, s in layout[:3])
    return shown + (f" and {len(layout) - 3} more" if len(layout) > 3 else "")


def run_of(folder: Path, worker: int, iteration: int) -> str:
    """The run id a checkpoint was written by (from its metadata)."""
    try:
        with zipfile.ZipFile(path_of(folder, worker, iteration)) as zf:
            return str(_read_meta(zf).get("run", ""))
    except (OSError, ValueError, KeyError, RecursionError, zipfile.BadZipFile, EOFError) as exc:
        path = path_of(folder, worker, iteration)
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from None


def keep_for(gap_bound: float | None, every: int) -> int | None:
    """How many checkpoints each worker keeps so that pruning never removes the newest
    complete set: a worker may be up to ``gap_bound`` iterations (Table 1, any pair) ahead of
    the slowest, i.e. ceil(gap_bound / every) + 1 checkpoints ahead of the newest common one,
    plus one being written. None (keep all) when the gap is unbounded."""
    if gap_bound is None or not np.isfinite(gap_bound):
        return None
    return max(KEEP_MIN, -(-int(gap_bound) // every) + 2)


def prune(folder: Path, worker: int, keep: int | None) -> list[Path]:
    """Remove all but worker ``worker``'s newest ``keep`` checkpoints (``None``: keep all) and
    any temporary file a crash left behind. Returns what was removed."""
    d = worker_folder(folder, worker)
    gone = [d / n for n in _listdir(d) if n.startswith(".iter-") and n.endswith(_TMP_SUFFIX)]
    if keep is not None:
        gone += [path_of(folder, worker, k) for k in iterations(folder, worker)[:-keep]]
    for path in gone:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return gone


def _what(path: Path) -> str:
    """What stands at ``path`` where a checkpoint file should, in words."""
    kind = "a directory" if path.is_dir() else "a special file (a FIFO, a socket or a device)"
    if path.is_symlink():
        return f"a symbolic link to {kind}" if path.exists() else "a dangling symbolic link"
    return kind


def newer_than(folder: Path, workers: Sequence[int], iteration: int) -> list[Path]:
    """The checkpoints of ``workers`` newer than ``iteration`` (what ``discard_after`` takes);
    a CheckpointError, before any is removed, if one of them is a directory named like one:
    a resume cannot take it away, and a worker could not write its checkpoint there."""
    found = [path_of(folder, w, k) for w in workers for k in iterations(folder, w) if k > iteration]
    for path in found:
        if path.is_dir() and not path.is_symlink():  # unlink takes anything else
            raise CheckpointError(
                f"{path} is {_what(path)}, named like a checkpoint newer than iteration "
                f"{iteration}, which a resume from there removes: move it away"
            )
    return found


def discard_after(folder: Path, workers: Sequence[int], iteration: int) -> list[Path]:
    """Remove the checkpoints newer than ``iteration``: after a resume from ``iteration`` they
    belong to the abandoned timeline and must never join a set with the new one's."""
    gone = newer_than(folder, workers, iteration)
    for path in gone:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return gone


def _listdir(d: Path) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "WorkerState",
    "discard_after",
    "keep_for",
    "layout_of",
    "load",
    "newer_than",
    "newest_complete",
    "path_of",
    "prune",
    "readable",
    "run_of",
    "save",
]
