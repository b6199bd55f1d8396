"""Slow workers and slow links, from one string, the same for the simulator and the cluster.

Grammar (parts joined by ``+``)::

    none                      nobody is slow
    random:F[:P]              each worker, each iteration, is F times slower with probability P
                              (default 1/n: the paper's random slowdown, Sec. 7.3.1)
    fixed:F@W[,W...]          the listed workers are F times slower every iteration (Sec. 7.3.5)
    link:MS[/BW]@I-J          messages between workers I and J take MS milliseconds longer, both
                              ways (on top of the simulator's --latency, which is in seconds),
                              plus their bytes / BW with a bandwidth
    machines:A,B,...@MS[/BW]  the workers sit on machines of A, B, ... workers, in id order
                              (0..A-1 on the first), and each machine reaches the others
                              through one shared link (Sec. 7.3.6): a message to another
                              machine takes MS milliseconds (plus its bytes / BW) longer for
                              every message the busier of its two ends carries each iteration
                              (the sender's uplink, the receiver's downlink)

A bandwidth BW is a number and a unit per second: ``bit``, ``kbit``, ``Mbit``, ``Gbit`` (bits;
or ``bps``, ``kbps``, ``Mbps``, ``Gbps``) or ``B``, ``kB``, ``MB``, ``GB`` (bytes), powers of 1000:
``1Gbit`` = ``1Gbps`` = ``125MB``. A message's
bytes are its update's parameters (an ACK has none): the real ones where a worker's inbox holds
it, the run's model's snapshot in the simulator, or ``--message-bytes`` in both
(``message_delay``).

A factor below 1 makes a worker faster (fixed:0.5@3: worker 3 computes in half the time).
Factors of parts that apply to the same worker multiply.

e.g. ``random:6`` or ``fixed:4@0`` or ``random:6:0.1+link:50@0-1`` or ``machines:4,2,2@20`` or
``machines:4,4,4,4@0.1/1Gbit``.

What a factor slows (``--slowdown-scope``, ``SlowdownScope``): ``compute``, the worker's
Compute only; ``iteration``, everything the worker does in that iteration: its Compute takes F
times as long, and so does every message it sends in it (its update, its ACK), from leaving the
worker to arriving (``message_delay``: F x the message's normal time).

``machines:`` models a shared link, not just distance: in an iteration every worker sends to
every out-neighbour at about the same time, so a machine with k graph edges to other machines
shares its uplink among k transfers, and one with k edges from other machines shares its
downlink among k. A message between machines takes k x (MS + bytes / BW), k the larger of its
sender machine's uplink share and its receiver machine's downlink share (fair sharing, counted
once from the graph when the slowdown is bound to it; on a two-way graph each machine's
uplink and downlink carry as many).
That is what makes a graph with fewer edges between machines (``hierarchical:...``) faster on
such a cluster than one with a larger spectral gap.

A parameter server (``--mode ps-*``) sits on a machine of its own with the same link as the
others (the paper's Sec. 7.3.2: "one additional machine as the parameter server"). Every worker
pushes to it and it answers every worker, so its link carries n messages each way per
iteration: with snapshots large enough, the server's link is the run's bottleneck
(``links_graph``).

The cluster applies link delays where a message arrives: the receiver's inbox holds it for the
extra time before handing it over (``hopbus.transport.inbox``), computed by ``message_delay``
as the simulator computes it.

The random draws depend only on (seed, part, worker, iteration), never on the order in which
they are asked for, so a simulated run and a real one with the same seed slow down the same
workers in the same iterations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

from hopbus.errors import ConfigError, SlowdownSpecError
from hopbus.modes import Family, Mode

_BLOCK = 1024  # random draws are made this many iterations at a time, per worker

_NUM = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"  # ASCII digits only
_RANDOM = re.compile(rf"random:(?P<f>{_NUM})(?::(?P<p>{_NUM}))?")
_FIXED = re.compile(rf"fixed:(?P<f>{_NUM})@(?P<w>[0-9]+(?:,[0-9]+)*)")
_LINK = re.compile(rf"link:(?P<ms>{_NUM})(?:/(?P<bw>[^@]*))?@(?P<i>[0-9]+)-(?P<j>[0-9]+)")
_MACHINES = re.compile(rf"machines:(?P<sizes>[0-9]+(?:,[0-9]+)*)@(?P<ms>{_NUM})(?:/(?P<bw>.*))?")
_AMOUNT = re.compile(rf"(?P<x>{_NUM})(?P<unit>[A-Za-z]*)")
MAX_FACTOR = 1e6  # a worker a million times slower is as good as stopped
MAX_LINK_MS = 1e9
MIN_BYTES_PER_S = 1 / 8  # 1 bit/s: below it, link times overflow any run (1e-300Gbit)

BANDWIDTH_UNITS = {  # bytes per second of one unit per second
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "Mbit": 1e6 / 8,
    "Gbit": 1e9 / 8,
    "B": 1.0,
    "kB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
}
BANDWIDTH_UNITS |= {"bps": 1 / 8, "kbps": 1e3 / 8, "Mbps": 1e6 / 8, "Gbps": 1e9 / 8}
"""What a bandwidth may be spelled in: bits or bytes per second, powers of 1000."""
BANDWIDTH_HELP = (
    "a number and one of bit, kbit, Mbit, Gbit (bits per second; also bps, kbps, Mbps, Gbps) "
    "or B, kB, MB, GB (bytes per second), e.g. 1Gbit or 125MB"
)
SIZE_UNITS = {"": 1, "B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
SIZE_UNITS |= {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
"""What a message size (``--message-bytes``) may be spelled in."""
SIZE_HELP = "a number of bytes, or a number and one of B, kB, MB, GB, KiB, MiB, GiB (e.g. 36.9MB)"
MAX_MESSAGE_BYTES = 1 << 40

GRAMMAR = (  # no word longer than --help's narrowest column (25 characters at 80 wide)
    "none | random:F[:P] | fixed:F@W[,W..] | link:MS[/BW]@I-J | machines:A,B,..@MS[/BW] "
    "(parts joined by '+')"
)


class SlowdownScope(StrEnum):
    """What a slowdown factor stretches (``--slowdown-scope``)."""

    COMPUTE = "compute"  # the worker's Compute only; its messages take their normal time
    ITERATION = "iteration"  # its Compute and every message it sends in that iteration


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
    """A link between workers ``a`` and ``b``: ``extra_s`` per message plus ``s_per_byte`` for
    each of its bytes (1 / the bandwidth; 0 without one)."""

    extra_s: float
    a: int
    b: int
    s_per_byte: float = 0.0


@dataclass(frozen=True)
class MachineLinks:
    """Workers in consecutive blocks of ``sizes`` share a machine; a message between machines
    takes ``transfer_s`` (plus ``s_per_byte`` for each of its bytes) longer per message its
    machine's uplink carries each iteration."""

    sizes: tuple[int, ...]
    transfer_s: float
    s_per_byte: float = 0.0


Part = RandomSlowdown | FixedSlowdown | LinkDelay | MachineLinks


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
            parts.append(
                LinkDelay(
                    _link_s(spec, m["ms"]), int(m["i"]), int(m["j"]), _per_byte(spec, m["bw"])
                )
            )
        elif m := _MACHINES.fullmatch(item):
            sizes = tuple(int(x) for x in m["sizes"].split(","))
            if 0 in sizes:
                raise _bad(spec, f"{item!r} has a machine with no worker")
            if any(isinstance(q, MachineLinks) for q in parts):
                raise _bad(spec, "only one machines:... part")
            parts.append(MachineLinks(sizes, _link_s(spec, m["ms"]), _per_byte(spec, m["bw"])))
        elif item == "none":
            raise _bad(spec, "'none' cannot be combined with other parts")
        else:
            raise _bad(spec, f"cannot read {item!r}{_near_miss(item)}")
    return tuple(parts)


def _near_miss(item: str) -> str:
    """What a part that almost reads most likely lacks, for its error line."""
    if re.search(rf"{_NUM}\s*ms\b", item, re.IGNORECASE):
        return ": milliseconds are a bare number (20, not 20ms)"
    examples = {"link": "link:50@0-1, 50 ms between workers 0 and 1", "machines": "machines:4,4@20"}
    kind = item.split(":", 1)[0].strip()
    if kind in examples and "@" not in item:
        return f": {kind}:... needs its @ part (e.g. {examples[kind]})"
    return ""


def _link_s(spec: str, text: str) -> float:
    ms = float(text)
    if ms > MAX_LINK_MS:
        raise _bad(spec, f"{text} ms is more than {MAX_LINK_MS:g} ms")
    return ms / 1000.0


def _per_byte(spec: str, text: str | None) -> float:
    """Seconds per byte of the bandwidth ``text`` (None: no bandwidth given, 0)."""
    if text is None:
        return 0.0
    m = _AMOUNT.fullmatch(text)
    unit = BANDWIDTH_UNITS.get(m["unit"]) if m else None
    if m is None or unit is None:
        raise _bad(spec, f"bandwidth {text!r} is not {BANDWIDTH_HELP}")
    rate = float(m["x"]) * unit
    if rate == float("inf"):
        raise _bad(spec, f"bandwidth {text!r} is not finite: leave out /BW for no bandwidth cost")
    if not rate > 0:
        raise _bad(spec, f"bandwidth {text!r} must be above 0")
    if rate < MIN_BYTES_PER_S:
        raise _bad(spec, f"bandwidth {text!r} is below 1 bit per second")
    return 1.0 / rate


def parse_size(text: str | float) -> int:
    """A message size in bytes, from an integer or from ``SIZE_HELP``'s spellings ("36.9MB");
    a ValueError saying what is expected otherwise."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):  # a TOML table, a list
        raise ValueError(f"expected {SIZE_HELP}")
    if isinstance(text, int | float):
        value: float = text
        in_bytes = True
    else:
        m = _AMOUNT.fullmatch(text.strip())
        if m is None or m["unit"] not in SIZE_UNITS:
            raise ValueError(f"expected {SIZE_HELP}")
        value = float(m["x"]) * SIZE_UNITS[m["unit"]]
        in_bytes = m["unit"] in ("", "B")
        tiny = 0 <= value < 0.5 and any(d in "123456789" for d in m["x"].lower().split("e")[0])
        if tiny:  # 1e-400, 1e-7MB: not zero as typed, yet less than a byte
            raise ValueError(f"{text.strip()!r} is less than a byte: a unit left out?")
    if not 0 <= value <= MAX_MESSAGE_BYTES:  # NaN too
        raise ValueError(f"expected 0 to {MAX_MESSAGE_BYTES} bytes")
    if in_bytes and value != int(value):  # 1.5 bytes: a unit left out?
        raise ValueError("not a whole number of bytes: a unit left out? (e.g. 1.5MB)")
    return round(value)


def _factor(spec: str, text: str) -> float:
    f = float(text)
    if not 0 < f <= MAX_FACTOR:
        raise _bad(spec, f"a slowdown factor must be above 0 and at most {MAX_FACTOR:g}")
    return f


class SlowdownModel(Protocol):
    """What drivers ask of a heterogeneity model (tests may supply their own schedules)."""

    def factor(self, worker: int, iteration: int) -> float: ...

    def link_delay(self, src: int, dst: int, nbytes: int = 0) -> float: ...

    @property
    def has_link_delays(self) -> bool: ...


def links_graph(mode: Mode, graph: nx.DiGraph, name: str) -> tuple[nx.DiGraph, str]:
    """The graph a run's bytes travel, which its slowdown is bound to: the topology's, except
    for ring all-reduce, whose bytes go round the ring 0 -> 1 -> ... -> n-1 -> 0 whatever
    --topology says (gloo's ring, in one direction), and for a parameter server's modes, whose
    bytes go from every worker to the server (node n) and back."""
    if mode.family not in (Family.ALLREDUCE, Family.PS):
        return graph, name
    import networkx as nx

    n = graph.number_of_nodes()
    links = nx.DiGraph()
    links.add_nodes_from(range(n))
    if mode.family is Family.PS:
        links.add_node(n)
        links.add_edges_from(e for w in range(n) for e in ((w, n), (n, w)))
        return links, "the parameter server's links"
    links.add_edges_from((i, (i + 1) % n) for i in range(n) if n > 1)
    return links, "the all-reduce ring"


def ring_allreduce_s(
    model: SlowdownModel, n: int, iteration: int, nbytes: int, scope: SlowdownScope
) -> float:
    """Seconds the emulated links add to one ring all-reduce of ``nbytes`` over ``n`` workers
    (``model`` bound to ``links_graph``'s ring): 2 (n - 1) steps in which every worker sends
    an n-th of the buffer to the next, each step as long as its slowest message
    (``message_delay``, the rule every message follows). gloo's own transfer is real and
    comes first; this is charged after it, the same on every worker."""
    if n < 2 or not model.has_link_delays:
        return 0.0
    chunk = -(-nbytes // n)
    step = max(
        message_delay(model, i, (i + 1) % n, iteration, chunk, scope=scope) for i in range(n)
    )
    return 2 * (n - 1) * step


def message_delay(
    model: SlowdownModel,
    src: int,
    dst: int,
    iteration: int,
    nbytes: int = 0,
    *,
    scope: SlowdownScope = SlowdownScope.COMPUTE,
    base: float = 0.0,
) -> float:
    """Seconds a message of ``nbytes`` that worker ``src`` sends in ``iteration`` takes to
    reach ``dst``: ``base`` (the simulator's --latency; a real network's own time is not
    emulated) plus the link's delay for its bytes, and with ``iteration`` scope all of it
    times the sender's slowdown factor in that iteration. The one rule both drivers follow:
    the simulator schedules the arrival this much later, a real worker's inbox holds the
    message this long."""
    d = base + model.link_delay(src, dst, nbytes)
    if d and scope is SlowdownScope.ITERATION:
        d *= model.factor(src, iteration)
    return d


@dataclass
class Heterogeneity:
    """A parsed slowdown bound to a number of workers and a seed."""

    parts: tuple[Part, ...]
    n: int
    seed: int = 0
    _fixed: list[float] = field(init=False)
    _links: dict[tuple[int, int], tuple[float, float]] = field(init=False)  # (s, s per byte)
    _random: list[tuple[int, float, float]] = field(init=False)  # (part, factor, probability)
    _machine: list[int] | None = field(init=False, default=None)  # each worker's machine
    _transfer_s: float = field(init=False, default=0.0)
    _uplink_s_per_byte: float = field(init=False, default=0.0)
    _uplink: list[int] = field(init=False, default_factory=list)  # messages out, per machine
    _downlink: list[int] = field(init=False, default_factory=list)  # messages in, per machine
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
                for key in ((part.a, part.b), (part.b, part.a)):  # links on one pair add up
                    s, per_byte = self._links.get(key, (0.0, 0.0))
                    self._links[key] = (s + part.extra_s, per_byte + part.s_per_byte)
            elif isinstance(part, MachineLinks):
                if sum(part.sizes) != self.n:
                    raise SlowdownSpecError(
                        f"bad --slowdown: machines of {'+'.join(map(str, part.sizes))} = "
                        f"{sum(part.sizes)} workers, but the run has {self.n}"
                    )
                self._machine = [m for m, size in enumerate(part.sizes) for _ in range(size)]
                self._transfer_s = part.transfer_s
                self._uplink_s_per_byte = part.s_per_byte
                self._uplink = [1] * len(part.sizes)  # until bind() counts the graph's edges
                self._downlink = [1] * len(part.sizes)
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

    @classmethod
    def for_run(
        cls, spec: str, mode: Mode, graph: nx.DiGraph, name: str, seed: int = 0
    ) -> Heterogeneity:
        """A run's slowdown: parsed, checked against its mode (``check_mode``) and bound to the
        graph its bytes travel (``links_graph``). What every driver builds."""
        het = cls.from_spec(spec, graph.number_of_nodes(), seed)
        het.check_mode(mode)
        return het.bind(*links_graph(mode, graph, name))

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
        """How many times slower than normal ``worker`` computes in ``iteration`` (1 for a node
        that is not a worker: a parameter server is never slowed)."""
        if not 0 <= worker < self.n:
            return 1.0
        f = self._fixed[worker]
        for part, slow, p in self._random:
            if self._draw(part, worker, iteration) < p:
                f *= slow
        return f

    def link_delay(self, src: int, dst: int, nbytes: int = 0) -> float:
        """Extra seconds a message of ``nbytes`` from ``src`` to ``dst`` takes on its emulated
        links: a ``link:`` part's, plus between machines its share of the busier of the
        sender's uplink and the receiver's downlink (a parameter server is on a machine of its
        own once bound to ``links_graph``'s star). The sender's slowdown does not enter here
        (``message_delay``)."""
        d = 0.0
        link = self._links.get((src, dst))
        if link is not None:
            d = link[0] + nbytes * link[1]
        m = self._machine
        if m is not None and 0 <= src < len(m) and 0 <= dst < len(m) and m[src] != m[dst]:
            share = max(self._uplink[m[src]], self._downlink[m[dst]])
            d += (self._transfer_s + nbytes * self._uplink_s_per_byte) * share
        return d

    def machine_of(self, worker: int) -> int | None:
        """The emulated machine ``worker`` sits on (``machines:`` part), None without one."""
        return None if self._machine is None else self._machine[worker]

    @property
    def has_link_delays(self) -> bool:
        """Whether any message takes longer than others (``link:`` or ``machines:``)."""
        return bool(self._links) or (
            self._machine is not None and (self._transfer_s > 0 or self._uplink_s_per_byte > 0)
        )

    @property
    def charges_bytes(self) -> bool:
        """Whether some link has a bandwidth, so that a message's size matters."""
        return any(per_byte for _, per_byte in self._links.values()) or (
            self._machine is not None and self._uplink_s_per_byte > 0
        )

    def bind(self, graph: nx.DiGraph, topology_name: str) -> Heterogeneity:
        """Tie the slowdown to the run's graph: refuse a ``link:`` part naming two workers that
        never talk to each other, and count each machine's uplink and downlink messages (its
        graph edges to and from other machines) for ``machines:``. A node past the workers
        (a parameter server: ``links_graph``) gets a machine of its own. Returns self."""
        for a, b in self._links:
            if not (graph.has_edge(a, b) or graph.has_edge(b, a)):
                raise SlowdownSpecError(
                    f"bad --slowdown: workers {a} and {b} are not neighbours in {topology_name!r}"
                )
        m = self._machine
        if m is not None:
            workers = m[: self.n]
            machines = max(workers) + 1
            extra = sorted(v for v in graph.nodes if v >= self.n)
            m = self._machine = workers + list(range(machines, machines + len(extra)))
            self._uplink = [0] * (machines + len(extra))
            self._downlink = [0] * (machines + len(extra))
            for u, v in graph.edges:
                if u != v and m[u] != m[v]:
                    self._uplink[m[u]] += 1
                    self._downlink[m[v]] += 1
        return self

    def check_mode(self, mode: Mode) -> None:
        """Refuse link delays where hopbus cannot apply them, rather than run without them or
        charge what the run does not send: a parameter server's workers send only to the
        server, so a ``link:`` between two workers carries nothing (``machines:`` does: the
        server is on a machine of its own); wagma's groups change every iteration (a
        butterfly, and a global average every --sync-period), which no fixed graph's shares
        describe. An all-reduce's links are charged after gloo's real transfer
        (``ring_allreduce_s``)."""
        if mode.family is Family.PS and self._links:
            raise ConfigError(
                f"--slowdown link:... has no meaning with --mode {mode} (its workers exchange "
                "only with the parameter server); machines:... puts the server on a machine "
                "of its own"
            )
        if mode.family is Family.WAGMA and self.has_link_delays:
            raise ConfigError(
                f"--slowdown link:... and machines:... are not emulated for --mode {mode}: its "
                "groups change every iteration, so no fixed link shares describe its traffic; "
                "slow workers (random:, fixed:) apply"
            )

    def uplink_messages(self) -> list[int]:
        """Per machine, the messages its uplink carries each iteration (after ``bind``)."""
        return list(self._uplink)

    def downlink_messages(self) -> list[int]:
        """Per machine, the messages its downlink carries each iteration (after ``bind``)."""
        return list(self._downlink)
