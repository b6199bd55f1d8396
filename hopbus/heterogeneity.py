"""Slow workers and slow links, from one string, the same for the simulator and the cluster.

Grammar (parts joined by ``+``)::

    none                      nobody is slow
    random:F[:P]              each worker, each iteration, is F times slower with probability P
                              (default 1/n: the paper's random slowdown, Sec. 7.3.1)
    fixed:F@W[,W...]          the listed workers are F times slower every iteration (Sec. 7.3.5)
    link:MS@I-J               messages between workers I and J take MS milliseconds longer, both
                              ways (on top of the simulator's --latency, which is in seconds)

A factor below 1 makes a worker faster (fixed:0.5@3: worker 3 computes in half the time).
Factors of parts that apply to the same worker multiply.

e.g. ``random:6`` or ``fixed:4@0`` or ``random:6:0.1+link:50@0-1``.

The random draws depend only on (seed, part, worker, iteration), never on the order in which
they are asked for, so a simulated run and a real one with the same seed slow down the same
workers in the same iterations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hopbus.errors import SlowdownSpecError

_BLOCK = 1024  # random draws are made this many iterations at a time, per worker

_NUM = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"  # ASCII digits only
_RANDOM = re.compile(rf"random:(?P<f>{_NUM})(?::(?P<p>{_NUM}))?")
_FIXED = re.compile(rf"fixed:(?P<f>{_NUM})@(?P<w>[0-9]+(?:,[0-9]+)*)")
_LINK = re.compile(rf"link:(?P<ms>{_NUM})@(?P<i>[0-9]+)-(?P<j>[0-9]+)")
MAX_FACTOR = 1e6  # a worker a million times slower is as good as stopped
MAX_LINK_MS = 1e9

GRAMMAR = "none | random:F[:P] | fixed:F@W[,W...] | link:MS@I-J, joined by '+'"


@dataclass(frozen=True)
class RandomSlowdown:
    factor: float
    probability: float | None  # None: 1/n


@dataclass(frozen=True)
class FixedSlowdown:
    factor: float
    workers: tuple[int, ...]


@dataclass(frozen=True)
class LinkDelay:
    extra_s: float
    a: int
    b: int


Part = RandomSlowdown | FixedSlowdown | LinkDelay


def _bad(spec: str, why: str) -> SlowdownSpecError:
    return SlowdownSpecError(f"bad --slowdown {spec!r}: {why} (expected {GRAMMAR})")


def parse(spec: str) -> tuple[Part, ...]:
    """Parse a slowdown string; ``none`` (or empty) is no part at all."""
    text = spec.strip()
    if text in ("", "none"):
        return ()
    parts: list[Part] = []
    for raw in text.split("+"):
        item = raw.strip()
        if m := _RANDOM.fullmatch(item):
            p = None if m["p"] is None else float(m["p"])
            if p is not None and not 0 <= p <= 1:
                raise _bad(spec, f"probability {m['p']} is not between 0 and 1")
            parts.append(RandomSlowdown(_factor(spec, m["f"]), p))
        elif m := _FIXED.fullmatch(item):
            ws = tuple(int(w) for w in m["w"].split(","))
            if len(set(ws)) != len(ws):
                raise _bad(spec, f"{item!r} lists a worker twice")
            parts.append(FixedSlowdown(_factor(spec, m["f"]), ws))
        elif m := _LINK.fullmatch(item):
            if m["i"] == m["j"]:
                raise _bad(spec, f"{item!r} joins worker {m['i']} to itself")
            ms = float(m["ms"])
            if ms > MAX_LINK_MS:
                raise _bad(spec, f"{m['ms']} ms is more than {MAX_LINK_MS:g} ms")
            parts.append(LinkDelay(ms / 1000.0, int(m["i"]), int(m["j"])))
        elif item == "none":
            raise _bad(spec, "'none' cannot be combined with other parts")
        else:
            raise _bad(spec, f"cannot read {item!r}")
    return tuple(parts)


def _factor(spec: str, text: str) -> float:
    f = float(text)
    if not 0 < f <= MAX_FACTOR:
        raise _bad(spec, f"a slowdown factor must be above 0 and at most {MAX_FACTOR:g}")
    return f


class SlowdownModel(Protocol):
    """What drivers ask of a heterogeneity model (tests may supply their own schedules)."""

    def factor(self, worker: int, iteration: int) -> float: ...

    def link_delay(self, src: int, dst: int) -> float: ...

    @property
    def links(self) -> dict[tuple[int, int], float]: ...


@dataclass
class Heterogeneity:
    """A parsed slowdown bound to a number of workers and a seed."""

    parts: tuple[Part, ...]
    n: int
    seed: int = 0
    _fixed: list[float] = field(init=False)
    _links: dict[tuple[int, int], float] = field(init=False)
    _random: list[tuple[int, float, float]] = field(init=False)  # (part, factor, probability)
    _cache: dict[tuple[int, int], tuple[int, list[float]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._fixed = [1.0] * self.n
        self._links = {}
        for part in self.parts:
            if isinstance(part, FixedSlowdown):
                for w in part.workers:
                    self._check_worker(w)
                    self._fixed[w] *= part.factor
            elif isinstance(part, LinkDelay):
                self._check_worker(part.a)
                self._check_worker(part.b)
                for key in ((part.a, part.b), (part.b, part.a)):
                    self._links[key] = self._links.get(key, 0.0) + part.extra_s
        self._random = [
            (index, part.factor, 1.0 / self.n if part.probability is None else part.probability)
            for index, part in enumerate(self.parts)
            if isinstance(part, RandomSlowdown)
        ]

    def _check_worker(self, w: int) -> None:
        if not 0 <= w < self.n:
            raise SlowdownSpecError(
                f"bad --slowdown: worker {w} does not exist (workers are 0..{self.n - 1})"
            )

    @classmethod
    def from_spec(cls, spec: str, n: int, seed: int = 0) -> Heterogeneity:
        return cls(parse(spec), n, seed)

    def _draw(self, part: int, worker: int, iteration: int) -> float:
        block = iteration // _BLOCK
        key = (part, worker)
        hit = self._cache.get(key)
        if hit is None or hit[0] != block:
            rng = np.random.default_rng([self.seed, part, worker, block])
            hit = (block, rng.random(_BLOCK).tolist())
            self._cache[key] = hit
        return hit[1][iteration % _BLOCK]

    def factor(self, worker: int, iteration: int) -> float:
        """How many times slower than normal ``worker`` computes in ``iteration``."""
        f = self._fixed[worker]
        for part, slow, p in self._random:
            if self._draw(part, worker, iteration) < p:
                f *= slow
        return f

    def link_delay(self, src: int, dst: int) -> float:
        """Extra seconds a message from ``src`` to ``dst`` takes."""
        return self._links.get((src, dst), 0.0)

    @property
    def links(self) -> dict[tuple[int, int], float]:
        return dict(self._links)

    def check_links(self, has_edge: Callable[[int, int], bool], topology_name: str) -> None:
        """Refuse a ``link:`` part naming two workers that never talk to each other."""
        for a, b in self._links:
            if not (has_edge(a, b) or has_edge(b, a)):
                raise SlowdownSpecError(
                    f"bad --slowdown: workers {a} and {b} are not neighbours in {topology_name!r}"
                )
