"""Op identity across steps: which occurrence in one step is the same call in another.

An op is named by its event name and its occurrence number on its lane in the step
(``aten::resolve_conj#4``). Counting alone is wrong where a step has a call more or
less than the others: every later occurrence of that name then shifts by one, and the
DAG's edges, the per-op medians and the missing-record check compare different calls.
Real traces do this. In integer-microsecond Kineto traces a zero-length child that
starts in its parent's last microsecond reads as the parent's sibling in some steps
and as nested in others (HTA ``trace_diff/control``: the outermost
``aten::resolve_conj`` runs 5-7 times a step, ``aten::zero_`` after ``aten::zeros``
comes and goes the same way), and data-dependent code runs a call only in some steps.

So each lane's steps are aligned to one reference step, the lane's most common
sequence of op names (of those, the one of median length): an edit alignment of the
names pairs each occurrence with an equal one of the reference, and a paired
occurrence takes the reference's number. rapidfuzz's Levenshtein edit operations
align in linear memory (a 100,000-op lane differing near both ends: 0.4 s, 22 MB; its
LCS operations keep the whole traceback, 1.2 GB; `bench/bench_identity.py`); only
runs of equal names are paired, so a substitution pairs nothing. An occurrence
the reference lacks is named after the paired op it follows, ``<name>@<op>#<k>``
(``aten::zero_@aten::zeros#12``: the ``aten::zero_`` that came after the reference's
``aten::zeros#12``; ``@start`` before any), with ``.<j>`` for the j-th (j >= 2) such
call there: the same extra call has the same name in every step that makes it, and
one op's name never stands for calls at different places of the step.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import numpy as np
from rapidfuzz.distance import Levenshtein

from planner.ingest.kineto_steps import cumcount


class Aligned(NamedTuple):
    """Per occurrence: `k`, its number where the reference step has it; else `extra`
    j >= 1 (0: paired) and the paired op it follows (`after_name`, a name code, -1 at
    the step's start; `after_k`, that op's number)."""

    k: np.ndarray
    extra: np.ndarray
    after_name: np.ndarray
    after_k: np.ndarray


def op_suffixes(aligned: Aligned, names: list[str]) -> list[str]:
    """Each occurrence's identity suffix: ``#<k>``, or ``@<op>#<k>[.<j>]`` for a call
    the reference lacks (`names`: the event names its name codes index). (speed) One
    f-string per occurrence, as counting had: only the extra calls take more."""
    out = [f"#{k}" for k in aligned.k.tolist()]
    for i in np.flatnonzero(aligned.extra).tolist():
        code, j = int(aligned.after_name[i]), int(aligned.extra[i])
        at = f"@{names[code]}#{int(aligned.after_k[i])}" if code >= 0 else "@start"
        out[i] = at if j == 1 else f"{at}.{j}"
    return out


def aligned_occurrence(step: np.ndarray, lane: np.ndarray, name: np.ndarray) -> Aligned:
    """Each occurrence's number among the ops of its name on its lane, counted in the
    lane's reference step, or where the reference lacks it, the op it follows there.

    The occurrences must be sorted by step, then lane, then start.
    """
    k = cumcount(step, lane, name)
    none = np.zeros(len(k), dtype=np.int64)
    out = Aligned(k, none, np.full(len(k), -1, dtype=np.int64), none.copy())
    if len(k) == 0:
        return out
    new = np.ones(len(k), dtype=bool)
    new[1:] = (step[1:] != step[:-1]) | (lane[1:] != lane[:-1])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(k))
    run_lane = lane[starts]
    for la in np.unique(run_lane).tolist():
        runs = np.flatnonzero(run_lane == la)
        if len(runs) < 2:
            continue
        spans = [(int(starts[r]), int(ends[r])) for r in runs.tolist()]
        keys = [name[a:b].tobytes() for a, b in spans]
        counts = Counter(keys)
        if len(counts) == 1:
            continue
        _align_lane(name, out, spans, keys, _reference(spans, keys, counts))
    return out


def _reference(spans: list[tuple[int, int]], keys: list[bytes], counts: Counter) -> int:
    """The index of the lane's reference step: its most common sequence, and of those
    sequences (ties) the one of median length, first in step order."""
    top = max(counts.values())
    # `counts` holds the sequences in step order; a set here would order the ties by
    # the process's string hash, and a lane's names with it (issue #47)
    tied = sorted((key for key, n in counts.items() if n == top), key=len)
    wanted = tied[(len(tied) - 1) // 2]
    return keys.index(wanted)


def _align_lane(
    name: np.ndarray, out: Aligned, spans: list[tuple[int, int]], keys: list[bytes], ref: int
) -> None:
    """Renumber the steps of one lane (`spans`) that differ from the reference `ref`."""
    ra, rb = spans[ref]
    ref_names = name[ra:rb]
    ref_k = out.k[ra:rb].copy()
    ref_list = ref_names.tolist()
    for (a, b), key in zip(spans, keys, strict=True):
        if key == keys[ref]:
            continue
        seq = name[a:b]
        paired = np.full(b - a, -1, dtype=np.int64)  # reference index of each occurrence
        for block in Levenshtein.editops(ref_list, seq.tolist()).as_matching_blocks():
            paired[block.b : block.b + block.size] = np.arange(block.a, block.a + block.size)
        hit = paired >= 0
        out.k[a:b][hit] = ref_k[paired[hit]]
        # an unpaired occurrence follows the reference op paired last before it
        after = np.maximum.accumulate(np.where(hit, paired, -1))
        seen: Counter = Counter()
        for i in np.flatnonzero(~hit).tolist():
            p = int(after[i])
            seen[(int(seq[i]), p)] += 1
            out.extra[a + i] = seen[(int(seq[i]), p)]
            if p >= 0:
                out.after_name[a + i] = ref_names[p]
                out.after_k[a + i] = ref_k[p]
