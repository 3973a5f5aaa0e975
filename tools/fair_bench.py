"""The statistics and checks of a comparison with another engine, as
../shared/FAIR-BENCH.md asks for them, kept apart from the harness
(tools/bench_vs_llama_server.py; tools/abba_bench.py uses the order and
the spread too) so that they are tested on their own
(tests/tools/fair_bench_test.py):

  - abba_order: the servers of one repeat, in A B B A order over repeats;
  - context_per_slot: a sequence's context, rounded up to llama.cpp's 256;
  - spread: median, min and max of repeated figures;
  - paired_ratios: per repeat, one engine's figure over the other's;
  - best_peer: the peer build with the best median figure at a point;
  - compare_ids: where two engines' greedy token ids agree;
  - verdict: a goal judged on a range ("met", "at the goal, within
    noise", "not met");
  - poisson_arrivals: the send times of an open-loop load at a rate.
"""

import random
import statistics

SLOT_ALIGN = 256  # llama.cpp rounds each slot's context up to this


def abba_order(names, repeat):
    """The servers of repeat `repeat` (0-based): as given on even repeats,
    reversed on odd ones, so that over two repeats each server runs as
    often early as late (A B, B A; A B C, C B A)."""
    names = list(names)
    return names if repeat % 2 == 0 else names[::-1]


def context_per_slot(prompt_tokens, max_tokens, margin=16):
    """The context of one sequence, prompt + output + margin rounded up to a
    multiple of SLOT_ALIGN, given to both engines (llama.cpp pads each slot
    to it and zero-fills it: unequal padding distorts memory figures)."""
    need = prompt_tokens + max_tokens + margin
    return -(-need // SLOT_ALIGN) * SLOT_ALIGN


def spread(values):
    """(median, min, max) of repeated figures; None for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def paired_ratios(ours, theirs):
    """Per repeat, ours[i] / theirs[i]: a ratio within one repeat compares
    runs made minutes apart on the same machine state. The two lists are
    of equal length (one figure per repeat)."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} figures against {len(theirs)}")
    return [a / b for a, b in zip(ours, theirs) if a is not None and b]


def best_peer(figures, higher_is_better=True):
    """The peer build whose median figure is best: `figures` maps a build's
    name to its figures over repeats. Ties go to the first name."""
    best, best_median = None, None
    for name, values in figures.items():
        s = spread(values)
        if s is None:
            continue
        better = best_median is None or (
            s[0] > best_median if higher_is_better else s[0] < best_median)
        if better:
            best, best_median = name, s[0]
    return best


def compare_ids(ours, theirs):
    """For two lists of greedy outputs (token id lists, stream by stream):
    (streams that agree on every token, streams, the first divergence per
    stream: the index of the first differing token, or None where they
    agree). Outputs of unequal length diverge where the shorter ends."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} outputs against {len(theirs)}")
    first = []
    for a, b in zip(ours, theirs):
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if at is None and len(a) != len(b):
            at = min(len(a), len(b))
        first.append(at)
    return sum(1 for f in first if f is None), len(first), first


def verdict(values, goal, higher_is_better=True):
    """A goal judged on the range of `values`: "met" when the whole range
    is on the goal's side, "not met" when none of it is, "at the goal,
    within noise" when the range crosses it."""
    _, lo, hi = spread(values)
    if not higher_is_better:
        lo, hi, goal = -hi, -lo, -goal
    if lo >= goal:
        return "met"
    if hi < goal:
        return "not met"
    return "at the goal, within noise"


def fmt_spread(values, digits=2):
    """"median [min-max]" of `values`, or "-"."""
    s = spread(values)
    if s is None:
        return "-"
    med, lo, hi = s
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def poisson_arrivals(rate, count, seed):
    """`count` send times in seconds from 0, a Poisson process of `rate`
    requests per second (exponential gaps, the first at 0): the open-loop
    load of vLLM's and SGLang's serving benchmarks. The same seed gives the
    same schedule, so every server of a repeat gets the same arrivals."""
    if rate <= 0 or count < 1:
        raise ValueError(f"rate {rate} and count {count} must be positive")
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times
