#!/usr/bin/env python3
"""Tests tools/fair_bench.py, the statistics and checks of the comparison
with llama.cpp (tools/bench_vs_llama_server.py): ABBA order, contexts in
llama.cpp's 256s, median and range, paired ratios, the peer's best build,
greedy-id agreement and goals judged on ranges. Pure Python, no server
(well under a second).

    fair_bench_test.py --binary build/server/kvserve --source-dir .
"""

import argparse
import os
import sys
import unittest

ARGS = None


def load():
    sys.path.insert(0, os.path.join(ARGS.source_dir, "tools"))
    import fair_bench  # noqa: E402
    return fair_bench


class FairBenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fb = load()

    def test_abba_order_alternates(self):
        order = [self.fb.abba_order(["a", "b", "c"], r) for r in range(4)]
        self.assertEqual(order, [["a", "b", "c"], ["c", "b", "a"],
                                 ["a", "b", "c"], ["c", "b", "a"]])
        # Over two repeats every server runs once in each half.
        first = [o[0] for o in order[:2]]
        self.assertEqual(sorted(first), ["a", "c"])

    def test_context_is_whole_slots(self):
        self.assertEqual(self.fb.context_per_slot(64, 64), 256)
        self.assertEqual(self.fb.context_per_slot(240, 0), 256)
        self.assertEqual(self.fb.context_per_slot(241, 0), 512)
        self.assertEqual(self.fb.context_per_slot(4096, 64), 4352)
        for n in (1, 100, 1000, 5000):
            c = self.fb.context_per_slot(n, 64)
            self.assertEqual(c % 256, 0)
            self.assertGreaterEqual(c, n + 64 + 16)

    def test_spread_and_format(self):
        self.assertEqual(self.fb.spread([3, 1, 2, 5, 4]), (3, 1, 5))
        self.assertEqual(self.fb.spread([1, 2]), (1.5, 1, 2))
        self.assertIsNone(self.fb.spread([]))
        self.assertEqual(self.fb.spread([None, 2.0]), (2.0, 2.0, 2.0))
        self.assertEqual(self.fb.fmt_spread([1, 2, 4]), "2.00 [1.00-4.00]")
        self.assertEqual(self.fb.fmt_spread([]), "-")

    def test_paired_ratios_pair_by_repeat(self):
        self.assertEqual(self.fb.paired_ratios([2, 6], [1, 3]), [2.0, 2.0])
        # A zero or missing figure drops its pair, not the others.
        self.assertEqual(self.fb.paired_ratios([2, 6, None], [1, 0, 2]),
                         [2.0])
        with self.assertRaises(ValueError):
            self.fb.paired_ratios([1, 2], [1])

    def test_best_peer_by_median(self):
        figures = {"omp": [10, 30, 11], "noomp": [12, 12, 13]}
        self.assertEqual(self.fb.best_peer(figures), "noomp")
        self.assertEqual(self.fb.best_peer(figures, higher_is_better=False),
                         "omp")
        self.assertEqual(self.fb.best_peer({"a": [1], "b": [1]}), "a")
        self.assertIsNone(self.fb.best_peer({"a": []}))

    def test_compare_ids(self):
        agree, n, first = self.fb.compare_ids(
            [[1, 2, 3], [1, 2, 3], [1, 2]], [[1, 2, 3], [1, 9, 3], [1, 2, 5]])
        self.assertEqual((agree, n), (1, 3))
        self.assertEqual(first, [None, 1, 2])
        with self.assertRaises(ValueError):
            self.fb.compare_ids([[1]], [])

    def test_verdict_on_the_range(self):
        self.assertEqual(self.fb.verdict([2.6, 2.7, 2.9], 2.5), "met")
        self.assertEqual(self.fb.verdict([2.4, 2.6, 2.7], 2.5),
                         "at the goal, within noise")
        self.assertEqual(self.fb.verdict([2.0, 2.1], 2.5), "not met")
        # Lower is better (a TPOT ratio against a ceiling of 1.0).
        self.assertEqual(self.fb.verdict([0.9, 0.95], 1.0,
                                         higher_is_better=False), "met")
        self.assertEqual(self.fb.verdict([0.95, 1.05], 1.0,
                                         higher_is_better=False),
                         "at the goal, within noise")
        self.assertEqual(self.fb.verdict([1.1, 1.2], 1.0,
                                         higher_is_better=False), "not met")

    def test_poisson_arrivals(self):
        times = self.fb.poisson_arrivals(4.0, 4000, seed=1)
        self.assertEqual(len(times), 4000)
        self.assertEqual(times[0], 0.0)
        self.assertEqual(times, sorted(times))
        # Mean gap 1/rate: 4,000 gaps put the mean within ~5% of 0.25 s.
        self.assertAlmostEqual(times[-1] / 3999, 0.25, delta=0.0125)
        self.assertEqual(times, self.fb.poisson_arrivals(4.0, 4000, seed=1))
        self.assertNotEqual(times, self.fb.poisson_arrivals(4.0, 4000, 2))
        with self.assertRaises(ValueError):
            self.fb.poisson_arrivals(0.0, 4, seed=1)


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary")
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
