#!/usr/bin/env python3
"""What KV cache events cost the engine (--kv-events-endpoint), through the
real daemon (gRPC): events on and off, alternated A B B A over --repeats
runs, each run on a freshly started daemon; each run sends --streams concurrent requests of unique
--prompt-tokens prompts (so every prompt block is announced) and
--max-tokens outputs. A subscriber (a SUB socket that binds, as llm-d's
endpoint picker does) receives the stream of the daemon with events on.

Reported per run: output tokens/s, the engine thread's CPU time (its
/proc/<pid>/task/<tid>/stat, the thread named kv-engine), and the part of
it spent batching and queuing events (kvserve_kv_events_engine_cpu_
seconds_total, thread CPU clocks around the relay). The ratio of the two
is the events' share of the engine thread; on/off throughput is paired per
run. The records the KV manager keeps during the step are not in the
relay's clock: the throughput ratio bounds them.

    tools/kv_events_bench.py --binary build/server/kvserve [--repeats 5]

Needs grpcio, grpcio-tools and pyzmq (deploy/setup.sh installs them).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
from kvserve_process import (KvserveProcess, compile_proto,  # noqa: E402
                             free_port, thread_cpu_seconds, token_ids)

PB = PB_GRPC = None



class Daemon(KvserveProcess):
    def __init__(self, args, events=None):
        extra = ["--threads", str(args.threads), "--kv-cache-bytes",
                 args.kv_cache_bytes, "--max-num-seqs", str(args.streams)]
        if events:
            extra += ["--kv-events-endpoint", events,
                      "--kv-events-topic", "kv@bench:0@smollm2"]
        super().__init__(args.binary, REPO, *extra)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def generate(self, ids, max_tokens):
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids),
            sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                       ignore_eos=True))
        n = 0
        for msg in self.stub.Generate(req, timeout=900):
            n += len(msg.token_ids)
        return n

    def engine_cpu_seconds(self):
        return thread_cpu_seconds(self.proc.pid, "kv-engine")

    def close(self):
        self.channel.close()
        self.kill()


def run_once(d, prompts, max_tokens):
    counts = [0] * len(prompts)

    def one(i):
        counts[i] = d.generate(prompts[i], max_tokens)
    cpu0 = d.engine_cpu_seconds()
    relay0 = d.metrics().get("kvserve_kv_events_engine_cpu_seconds_total", 0)
    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,))
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    relay = d.metrics().get("kvserve_kv_events_engine_cpu_seconds_total",
                            0) - relay0
    return {"tok_s": sum(counts) / wall, "engine_cpu": (
        d.engine_cpu_seconds() - cpu0), "relay_cpu": relay}


class Sink:
    """Receives (and counts) the stream, as a router's subscriber would."""

    def __init__(self, endpoint):
        import zmq
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.bind(endpoint)
        self.messages = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            if self.sub.poll(100):
                self.sub.recv_multipart()
                self.messages += 1

    def close(self):
        self.stop = True
        self.thread.join()
        self.sub.close(linger=0)
        self.ctx.term()


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "runs": xs}


def main():
    global PB, PB_GRPC
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-bytes", default="512MiB")
    p.add_argument("--json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        PB, PB_GRPC = compile_proto(os.path.join(REPO, "proto"), out)
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        sink = Sink(endpoint)
        res = {"on": [], "off": []}
        seed = [0]

        def prompts():
            seed[0] += 1
            return [token_ids(9_000_000 + seed[0] * 1000 + i,
                              args.prompt_tokens)
                    for i in range(args.streams)]
        try:
            for r in range(args.repeats):
                order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
                for name in order:
                    # A fresh daemon each run: no bias of one process (its
                    # memory, its cache's history) on one side.
                    d = Daemon(args, endpoint if name == "on" else None)
                    try:
                        res[name].append(
                            run_once(d, prompts(), args.max_tokens))
                    finally:
                        d.close()
                    print(name, res[name][-1], flush=True)
        finally:
            sink.close()
    share = [r["relay_cpu"] / r["engine_cpu"] for r in res["on"]]
    ratio = [a["tok_s"] / b["tok_s"] for a, b in zip(res["on"], res["off"])]
    result = {
        "args": vars(args), "runs": res, "messages": sink.messages,
        "relay_share_of_engine_cpu": summary(share),
        "tok_s_on_over_off": summary(ratio),
        "tok_s_on": summary([r["tok_s"] for r in res["on"]]),
        "tok_s_off": summary([r["tok_s"] for r in res["off"]]),
    }
    s, t = result["relay_share_of_engine_cpu"], result["tok_s_on_over_off"]
    print(f"events' share of the engine thread's CPU: {100 * s['median']:.3f}% "
          f"[{100 * s['min']:.3f}-{100 * s['max']:.3f}]; throughput on/off "
          f"{t['median']:.3f} [{t['min']:.3f}-{t['max']:.3f}] "
          f"({result['tok_s_on']['median']:.0f} vs "
          f"{result['tok_s_off']['median']:.0f} tok/s); "
          f"{sink.messages} messages received")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
