#!/usr/bin/env python3
"""Speculative decoding, measured: output tokens per second of kvserve with
--speculative ngram (and draft, with --draft-model) against kvserve without
speculation and llama-server with and without its n-gram speculation, on the
same GGUF, at 1 to N concurrent streams.

Tasks (the model's chat template around one user turn; the default 135M
model does copy from these): grounded ones, where the answer repeats the
prompt's text, "copy", "rewrite" (present tense), "answer" (quote a
passage), "summary", "code" (rename a function in 17 lines of Python), and
"open" (a story, nothing to copy: speculation's cost side). Every request is
greedy (temperature 0, top_k 1) and streamed, prompts sent as the same token
ids to every server (tokenized by llama-server's /tokenize after its
/apply-template). Grounded tasks end where the model ends its answer (EOS, at
most 2 x --max-tokens: past its EOS a model writes a new conversation, which
is open-ended text, not the task); "open" generates exactly --max-tokens
(ignore_eos). Token counts are the servers' usage, checked against the
request.

At 1 stream each task is one request, rated by its decode rate: tokens after
the first over the time from the first to the last (prefill is the same work
with or without speculation); "grounded" is that rate over the five grounded
tasks together, "all" output tokens over the wall time (prefill included).
At N > 1, N requests at once cycling through the six tasks, rated by output
tokens over the wall time. Lanes (servers) run one at a time while the
others idle, in A B ... B A order per repeat after a warm-up. Reported per
point: median and range over --repeats, the ratio of medians to kvserve
without speculation, drafts accepted / proposed, and kvserve's engine
thread CPU seconds per output token (thread "kv-engine"). The
greedy outputs of kvserve with and without speculation must be identical
(a difference fails the run); those of llama-server are compared with
kvserve's (agreement of the first 32 tokens, counted, not required: the two
engines round differently near ties).

    .venv/bin/python tools/spec_bench.py --binary build/server/kvserve \\
        --source-dir . --model build-llama/models/smollm2-135m-Q8_0.gguf \\
        [--draft-model weights/SmolLM2-135M-Instruct.Q4_1.gguf] \\
        [--streams 1,8,32] [--repeats 5] [--max-tokens 128] [--json OUT]

llama-server: build-llama/bin/llama-server (tools/build_llama_cpp.sh), -t/-tb
as --threads, -fa on, f16 KV, -np = streams, its prompt cache off;
speculation: --llama-spec (default: ngram-simple with a 4-token lookup and
8-token drafts, the best of its n-gram modes on these tasks; see
docs/PERFORMANCE.md), and with --draft-model --spec-type draft-simple
--model-draft (its defaults otherwise). Without the binary the llama lanes
are skipped.
"""
import argparse
import asyncio
import concurrent.futures
import json
import os
import shlex
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "server"))
import sse_client  # noqa: E402
from bench_vs_llama_server import LlamaServerProcess, post_json  # noqa: E402
from kvserve_process import KvserveProcess, thread_cpu_seconds  # noqa: E402

PASSAGE = (
    "The lighthouse at Saint Mara stands on a granite point at the mouth of "
    "the harbour. It was built in 1842 by the engineer Thomas Hale, who used "
    "stone cut from the cliffs behind the town. The tower is thirty-one "
    "metres tall and its light can be seen from twenty nautical miles away. "
    "For ninety years three keepers lived in the cottage at its foot and "
    "took turns to tend the lamp through the night. In 1932 the light was "
    "electrified, and in 1987 the last keeper, Ada Pryce, left the station "
    "when it became automatic. Today the cottage is a small museum that "
    "opens from April to October, and visitors can climb the one hundred "
    "and twelve steps to the lantern room on summer afternoons.")
CODE = '''def compute_total(items, tax_rate):
    """Returns the price of all items with tax."""
    total = 0.0
    for item in items:
        if item.quantity <= 0:
            continue
        price = item.unit_price * item.quantity
        if item.discount:
            price = price * (1.0 - item.discount)
        total = total + price
    return total * (1.0 + tax_rate)


def print_receipt(items, tax_rate):
    for item in items:
        print(item.name, item.quantity, item.unit_price)
    print("Total:", compute_total(items, tax_rate))
'''
TASKS = {
    "copy": f"Copy the following text exactly, word for word.\n\n{PASSAGE}",
    "rewrite": "Rewrite the following text in the present tense, keeping "
               f"everything else the same.\n\n{PASSAGE}",
    "answer": f"{PASSAGE}\n\nQuoting the text above, when was the light "
              "electrified and who was the last keeper?",
    "summary": f"Summarise the following text.\n\n{PASSAGE}",
    "code": "Rename the function compute_total to sum_prices everywhere in "
            f"this code and show the whole code.\n\n```python\n{CODE}```",
    "open": "Write a long story about a dragon who learns to cook.",
}
GROUNDED = ["copy", "rewrite", "answer", "summary", "code"]
LLAMA_SPEC = ("--spec-type ngram-simple --spec-ngram-simple-size-n 4 "
              "--spec-ngram-simple-size-m 8")


class Lane:
    """One server: kvserve (kind "kv") or llama-server ("llama")."""

    def __init__(self, name, kind, server):
        self.name, self.kind, self.server = name, kind, server

    def complete(self, prompt, max_tokens, ignore_eos):
        """One streamed greedy completion: its text, token count, drafts,
        and the times of its request, first and last text events."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "top_k": 1, "ignore_eos": ignore_eos, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.kind == "llama":
            body["cache_prompt"] = False
        return asyncio.run(self._stream(body))

    async def _stream(self, body):
        r = {"text": "", "tokens": None, "drafted": 0, "accepted": 0,
             "start": time.perf_counter(), "first": None, "last": None}
        async for now, data in sse_client.stream_events(
                "127.0.0.1", self.server.http_port, "/v1/completions", body):
            if data == "[DONE]":
                break
            event = json.loads(data)
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    r["text"] += choice["text"]
                    r["first"] = r["first"] or now
                    r["last"] = now
            usage = event.get("usage") or {}
            if usage:
                r["tokens"] = usage.get("completion_tokens")
                spec = (usage.get("kvserve") or {}).get("speculative") or {}
                r["drafted"] = spec.get("draft_tokens", r["drafted"])
                r["accepted"] = spec.get("accepted_tokens", r["accepted"])
            timings = event.get("timings") or {}
            if "draft_n" in timings:
                r["drafted"] = timings["draft_n"]
                r["accepted"] = timings.get("draft_n_accepted", 0)
        r["end"] = time.perf_counter()
        return r

    def engine_cpu(self):
        if self.kind != "kv":
            return 0.0
        return thread_cpu_seconds(self.server.proc.pid, "kv-engine")

    def close(self):
        self.server.terminate()


def start_lanes(args, streams):
    lanes = []
    common = ["--threads", str(args.threads), "--max-num-seqs",
              str(max(streams, 1)), "--kv-cache-dtype", "fp16",
              "--max-model-len", "2048", "--swap-space-bytes", "0",
              "--no-prefix-caching"]
    modes = [("kv-off", ["--speculative", "off"]),
             ("kv-ngram", ["--speculative", "ngram", *args.kv_spec_flags])]
    if args.draft_model:
        modes.append(("kv-draft", ["--speculative", "draft",
                                   "--speculative-draft-model",
                                   args.draft_model, *args.kv_spec_flags]))
    for name, flags in modes:
        proc = KvserveProcess(args.binary, args.source_dir, "--model",
                              args.model, *common, *flags)
        lanes.append(Lane(name, "kv", proc))
    if os.path.exists(args.llama_server):
        base = [args.llama_server, "-m", args.model, "-t", str(args.threads),
                "-tb", str(args.threads), "-fa", "on", "-c",
                str(2048 * max(streams, 1)), "-np", str(max(streams, 1)),
                "--cache-ram", "0", "--no-webui"]
        lanes.append(Lane("llama-off", "llama", LlamaServerProcess(base)))
        lanes.append(Lane("llama-ngram", "llama", LlamaServerProcess(
            base + shlex.split(args.llama_spec))))
        if args.draft_model:
            lanes.append(Lane("llama-draft", "llama", LlamaServerProcess(
                base + ["--spec-type", "draft-simple", "--model-draft",
                        args.draft_model])))
    return lanes


def chat_prompts(lanes):
    """Each task's chat-formatted prompt as token ids (llama-server)."""
    llama = next((ln for ln in lanes if ln.kind == "llama"), None)
    if llama is None:
        sys.exit("spec_bench: needs llama-server to tokenize the prompts "
                 "(tools/build_llama_cpp.sh)")
    port = llama.server.http_port
    out = {}
    for name, text in TASKS.items():
        templ = post_json(port, "/apply-template", {
            "messages": [{"role": "user", "content": text}]})["prompt"]
        out[name] = post_json(port, "/tokenize", {
            "content": templ, "add_special": True,
            "parse_special": True})["tokens"]
    return out


def run_point(lane, prompts, streams, max_tokens):
    """One measurement: wall seconds, the results, engine CPU seconds.
    Grounded tasks stop where the model ends its answer (at most
    2 x max_tokens); "open" generates exactly max_tokens (ignore_eos)."""
    names = (list(prompts) if streams == 1 else
             [list(TASKS)[i % len(TASKS)] for i in range(streams)])

    def one(name):
        grounded = name in GROUNDED
        r = lane.complete(prompts[name],
                          2 * max_tokens if grounded else max_tokens,
                          not grounded)
        if not r["tokens"] or (not grounded and r["tokens"] != max_tokens):
            sys.exit(f"spec_bench: {lane.name} {name}: {r['tokens']} "
                     f"tokens, asked {max_tokens}")
        return r

    cpu0 = lane.engine_cpu()
    t0 = time.monotonic()
    if streams == 1:
        results = {name: one(name) for name in names}
    else:
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            futs = [pool.submit(one, n) for n in names]
            results = {f"{n}#{i}": f.result()
                       for i, (n, f) in enumerate(zip(names, futs))}
    return time.monotonic() - t0, results, lane.engine_cpu() - cpu0


def decode_rate(r):
    """Output tokens per second after the first (the decode rate)."""
    span = r["last"] - r["first"]
    return (r["tokens"] - 1) / span if span > 0 else 0.0


def med_range(values):
    v = sorted(values)
    return statistics.median(v), v[0], v[-1]


def measure(args, streams, records):
    lanes = start_lanes(args, streams)
    try:
        prompts = chat_prompts(lanes)
        for lane in lanes:  # warm-up
            run_point(lane, prompts, min(streams, 2), 16)
        rates = {}  # (lane, key) -> [tok/s]
        texts = {}
        for rep in range(args.repeats):
            order = lanes if rep % 2 == 0 else list(reversed(lanes))
            for lane in order:
                wall, results, cpu = run_point(lane, prompts, streams,
                                               args.max_tokens)
                total = sum(r["tokens"] for r in results.values())
                drafted = sum(r["drafted"] or 0 for r in results.values())
                accepted = sum(r["accepted"] or 0 for r in results.values())
                if streams == 1:
                    for name, r in results.items():
                        rates.setdefault((lane.name, name), []).append(
                            decode_rate(r))
                    g = [results[n] for n in GROUNDED]
                    rates.setdefault((lane.name, "grounded"), []).append(
                        sum(r["tokens"] - 1 for r in g) /
                        sum(r["last"] - r["first"] for r in g))
                rates.setdefault((lane.name, "all"), []).append(total / wall)
                rates.setdefault((lane.name, "cpu"), []).append(cpu / total)
                rates.setdefault((lane.name, "acc"), []).append(
                    (accepted, drafted))
                for key, r in results.items():
                    texts.setdefault((lane.name, key), set()).add(r["text"])
                records.append({"streams": streams, "rep": rep,
                                "lane": lane.name, "wall": wall,
                                "tokens": total, "engine_cpu": cpu,
                                "drafted": drafted, "accepted": accepted,
                                "per_task": {k: r for k, r in results.items()}})
    finally:
        for lane in lanes:
            lane.close()
    return [ln.name for ln in lanes], rates, texts


def check_outputs(names, texts):
    ok = True
    keys = {k for (_, k) in texts}
    for key in sorted(keys):
        base = texts.get(("kv-off", key))
        for lane in names:
            if not lane.startswith("kv-") or lane == "kv-off":
                continue
            got = texts.get((lane, key))
            if got != base or len(base) != 1:
                print(f"OUTPUTS DIFFER: {lane} {key}", file=sys.stderr)
                ok = False
    agree = total = 0
    for key in keys:
        for lane in names:
            if lane.startswith("llama") and (lane, key) in texts:
                total += 1
                a = next(iter(texts[("kv-off", key)]))[:100]
                b = next(iter(texts[(lane, key)]))[:100]
                agree += a == b
    return ok, agree, total


def report(streams, names, rates):
    rows = []
    keys = list(TASKS) + ["grounded", "all"] if streams == 1 else ["all"]
    for key in keys:
        base = med_range(rates[("kv-off", key)])[0]
        cells = []
        for lane in names:
            m, lo, hi = med_range(rates[(lane, key)])
            cells.append(f"{m:.0f} ({lo:.0f}-{hi:.0f}) {m / base:.2f}x")
        rows.append(f"| {streams} | {key} | " + " | ".join(cells) + " |")
    acc = []
    for lane in names:
        a = sum(x for x, _ in rates[(lane, "acc")])
        d = sum(y for _, y in rates[(lane, "acc")])
        cpu = med_range(rates[(lane, "cpu")])[0] * 1e3
        acc.append(f"{a}/{d}" + (f", {cpu:.2f} ms" if lane.startswith("kv")
                                 else ""))
    rows.append(f"| {streams} | accepted/drafted, engine CPU per token | "
                + " | ".join(acc) + " |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", default="")
    ap.add_argument("--llama-server", default=os.path.join(
        HERE, "..", "build-llama", "bin", "llama-server"))
    ap.add_argument("--llama-spec", default=LLAMA_SPEC)
    ap.add_argument("--kv-spec", default="",
                    help="extra kvserve flags for the speculating lanes")
    ap.add_argument("--streams", default="1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.kv_spec_flags = shlex.split(args.kv_spec)
    records, table, ok = [], [], True
    for streams in [int(s) for s in args.streams.split(",")]:
        names, rates, texts = measure(args, streams, records)
        good, agree, total = check_outputs(names, texts)
        ok = ok and good
        if not table:
            table.append("| streams | task | " + " | ".join(names) + " |")
            table.append("|---" * (len(names) + 2) + "|")
        table += report(streams, names, rates)
        print(f"streams {streams}: llama-server's first 100 characters equal "
              f"kvserve's in {agree} of {total} outputs", file=sys.stderr)
    print("\n".join(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
