"""Which tokens stay full precision, and how an append moves tokens from the fp buffer to pages.

Policy (one for all layers, K and V alike, so every layer shares one block table):

* positions [0, sink) stay full precision for good (attention sinks);
* positions [sink, sink + nq) are quantized, in order, into the sequence's pages
  (quantized index i = position - sink lives at slot pages[i // P] * P + i % P);
* the rest, the recent tokens, stay full precision: nq = floor((n - sink - window) / Gc) * Gc,
  where Gc is the lcm of the channel-axis groups of all specs (1 without chan specs), so a
  channel group is quantized only once it is complete and has left the window (KIVI's residual).

The fp buffer of a sequence holds at most `sink + window + Gc - 1` tokens, in any row order
(softmax attention does not care); `plan_append` keeps its rows compact: leaving tokens free
their rows, new tokens fill freed rows first, and remaining holes are filled from the tail.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def chan_group(scheme, n_layers: int) -> int:
    """lcm of the channel-axis group sizes over every layer's K and V spec (1 if none)."""
    return scheme.chan_group(n_layers)


@dataclass(frozen=True)
class FpPolicy:
    sink: int
    window: int
    group: int = 1

    @classmethod
    def of(cls, scheme, n_layers: int) -> "FpPolicy":
        return cls(scheme.sink, scheme.window, chan_group(scheme, n_layers))

    @property
    def capacity(self) -> int:
        """Most full-precision tokens one sequence can hold (rows of its fp buffer)."""
        return self.sink + self.window + self.group - 1

    def n_quantized(self, n: int) -> int:
        """Tokens held in pages once a sequence has n tokens."""
        return max(0, n - self.sink - self.window) // self.group * self.group


@dataclass
class AppendPlan:
    """What one append of tokens [n0, n1) to one (sequence, layer) does.

    quant_rows: fp rows (old tokens) quantized now, in position order; they precede the new
    tokens `quant_new` = (start, stop) indices into the appended tokens, also quantized now.
    q_range: quantized indices [nq0, nq1) written. moves: (src_row, dst_row) inside the fp buffer.
    writes: (new token index, dst_row). rows: the position held by each row afterwards.
    """
    q_range: tuple[int, int]
    quant_rows: list[int] = field(default_factory=list)
    quant_new: tuple[int, int] = (0, 0)
    moves: list[tuple[int, int]] = field(default_factory=list)
    writes: list[tuple[int, int]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)


def plan_append(policy: FpPolicy, rows: list[int], n0: int, n_new: int) -> AppendPlan:
    """Plan appending n_new tokens (positions n0 .. n0 + n_new - 1) to a sequence whose fp buffer
    holds positions `rows` (row r holds position rows[r]). Pure Python; nothing is mutated."""
    n1 = n0 + n_new
    nq0, nq1 = policy.n_quantized(n0), policy.n_quantized(n1)
    qlo, qhi = policy.sink + nq0, policy.sink + nq1  # positions that enter the pages now
    row_of = {p: r for r, p in enumerate(rows)}
    quant_rows = [row_of[p] for p in range(qlo, min(qhi, n0))]
    quant_new = (max(qlo, n0) - n0, max(qhi, n0) - n0)
    holes = sorted(quant_rows)
    new = list(rows)
    for r in holes:
        new[r] = None
    writes = []
    adds = [p for p in range(n0, n1) if p < policy.sink or p >= qhi]
    for j, p in enumerate(adds):
        if j < len(holes):
            r = holes[j]
        else:
            r = len(new)
            new.append(None)
        new[r] = p
        writes.append((p - n0, r))
    moves = []
    for h in holes[len(adds):]:  # compact: fill remaining holes from the tail
        while new and new[-1] is None:
            new.pop()
        if h < len(new):
            moves.append((len(new) - 1, h))
            new[h] = new.pop()
    while new and new[-1] is None:
        new.pop()
    return AppendPlan((nq0, nq1), quant_rows, quant_new, moves, writes, new)
