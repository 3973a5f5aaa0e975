#!/usr/bin/env python3
"""Keeps tools/tenant_flood_bench.py working: one --quick repeat of its
priority and prefill scenarios against the real binary, its JSON checked
for every configuration and figure (no timing is asserted: the figures are
the benchmark's, docs/PERFORMANCE.md).

    tenant_flood_bench_test.py --binary build/server/kvserve --source-dir .

Cost: five daemons of the default model, about 30 s on 2 vCPUs.
"""

import argparse
import json
import os
import subprocess
import sys
import unittest

ARGS = None


class TenantFloodBenchTest(unittest.TestCase):
    def test_quick_run_reports_every_configuration(self):
        tool = os.path.join(ARGS.source_dir, "tools", "tenant_flood_bench.py")
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        run = subprocess.run(
            [sys.executable, tool, "--binary", ARGS.binary, "--model", model,
             "--quick", "--scenarios", "priority,prefill", "--json"],
            capture_output=True, text=True, timeout=500)
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        out = json.loads(run.stdout)
        self.assertEqual(set(out["priority"]),
                         {"fcfs", "fcfs, 2 tenants", "priority, 2 tenants",
                          "priority, 1 tenant"})
        for config, values in out["priority"].items():
            self.assertEqual(len(values), 1, config)
            self.assertIsNotNone(values[0], f"{config}: the victim failed")
            self.assertGreater(values[0], 0)
        for key in ("idle", "busy", "step", "bound"):
            self.assertEqual(len(out["prefill"][key]), 1, key)
            self.assertGreater(out["prefill"][key][0], 0, key)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    model = os.path.join(ARGS.source_dir, "weights",
                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        print(f"SKIP: {model} missing (run deploy/setup.sh)")
        return 77
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
