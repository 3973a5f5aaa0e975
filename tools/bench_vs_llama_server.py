#!/usr/bin/env python3
"""Serving throughput and latency: the kvserve daemon vs llama.cpp's
llama-server, the same GGUF, threads, context and KV type, one client.

Both servers run as real processes on free loopback ports: kvserve's daemon
(build/server/kvserve, started as the tests start it) and llama-server
(build-llama/bin/llama-server, built by tools/build_llama_cpp.sh, which
`deploy/setup.sh --bench` runs). For each prompt length and stream count,
both are started with matching settings:

  threads      kvserve --threads N; llama-server -t N -tb N
  context      kvserve --max-model-len L, KV pool sized by `kvserve plan` for
               S sequences of L tokens; llama-server -np S -c S*L (it divides
               -c among its S slots, each rounded up to a multiple of 256),
               L = prompt + output + 16
  RoPE         --rope-scale F: kvserve --rope-scale F; llama-server
               --rope-scaling linear --rope-scale F --override-kv
               ARCH.context_length=int:F*trained (its slots are capped at
               the GGUF's trained context): contexts past the model's own,
               e.g. 16K on an 8K model
  KV type      kvserve --kv-cache-dtype fp16|int8|int4|f32; llama-server
               -ctk/-ctv f16|q8_0|q4_0|f32, with flash attention
               (-fa on: llama.cpp needs it for a quantized V cache;
               --llama-flash-attn off for fp16/f32)
  caching      kvserve prefix caching on (its default); llama-server's default
               cache_prompt, with its host-memory prompt cache off
               (--cache-ram 0). Every request's prompt starts with random
               tokens, so neither server reuses a cached prefix; the tool
               checks each server's cached-token count.

Then --repeats runs alternate between them (kvserve, llama-server,
kvserve, ...): both stay up, one is driven at a time. A run opens S streams at
once (tools/sse_client.py), each a streaming POST /v1/completions, greedy
(temperature 0), exactly --max-tokens out (ignore_eos); both servers get the
same S prompts in a repeat, new ones each repeat. Prompts are token ids, sent
as such to both servers (no server tokenizes text in a run): GPL-3.0 text
(tests/data/eval/gpl-3.0.txt) tokenized once by llama-server's /tokenize,
taken from a random offset after 4 random tokens of it, exactly
--prompt-tokens long; each server's reported prompt and output token
counts are checked.

Recorded per server and configuration: output tokens/s (all output tokens
of a run over its wall time, median over runs), TTFT p50/p90 and TPOT p50/p90
over every request of every run (TPOT per request: (last token time - first
token time) / (tokens - 1)), the prefill time of one prompt at batch 1 (the
median TTFT at 1 stream), and each server process's peak RSS (VmHWM of
/proc/PID/status after the runs). Prints one Markdown table with
kvserve / llama-server ratios; --json OUT writes the raw per-request records.

--prefix-hits K measures prefix-cache hits instead, at 1 stream: per run a
new prompt, sent once cold and then K times again exactly (the multi-turn
case: the whole prompt re-sent), each server in turn; recorded per server are
the cold TTFT, the hits' TTFT p50/p90 and the cached prompt tokens each
server reports for the hits (llama-server's timings.cache_n, kvserve's
usage.prompt_tokens_details.cached_tokens).

    .venv/bin/python tools/bench_vs_llama_server.py \\
        --streams 1,4,16,32,64 --prompt-tokens 64,4096 --max-tokens 64
    .venv/bin/python tools/bench_vs_llama_server.py --prefix-hits 8 \\
        --prompt-tokens 1300 --max-tokens 8 --repeats 3
"""

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import sse_client  # noqa: E402
from http_stream_loadtest import percentile  # noqa: E402
from kvserve_process import KvserveProcess  # noqa: E402

DEFAULT_GGUF = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_KVSERVE = os.path.join(ROOT, "build", "server", "kvserve")
DEFAULT_LLAMA = os.path.join(ROOT, "build-llama", "bin", "llama-server")
CORPUS = os.path.join(ROOT, "tests", "data", "eval", "gpl-3.0.txt")
LLAMA_KV_TYPE = {"fp16": "f16", "int8": "q8_0", "int4": "q4_0", "f32": "f32"}
PREFIX_TOKENS = 4
CONTEXT_MARGIN = 16
SERVERS = ("kvserve", "llama")


class BenchError(Exception):
    """A problem to report in one line, exit status 2."""


def parse_ints(flag, text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchError(f"{flag}: expected positive integers, got {text!r}")
    return values


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(port, path, body, timeout=60.0):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def peak_rss_mib(pid):
    """VmHWM of a live process, in MiB."""
    with open(f"/proc/{pid}/status") as f:
        match = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.M)
    return int(match.group(1)) / 1024.0


class LlamaServerProcess(KvserveProcess):
    """llama-server on a free port, output collected as for kvserve; ready
    once GET /health answers 200 (the model is loaded)."""

    def __init__(self, cmd, timeout=180):
        self.http_port = free_port()
        self.proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(self.http_port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output, self.cond, self.eof = [], threading.Condition(), False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self._wait_healthy(timeout):
            self.kill()
            raise BenchError("llama-server did not start:\n" +
                             self.text()[-3000:])

    def _wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                asyncio.run(sse_client.get_json("127.0.0.1", self.http_port,
                                                "/health", timeout=2.0))
                return True
            except (OSError, sse_client.HttpError, ValueError,
                    asyncio.IncompleteReadError, TimeoutError):
                time.sleep(0.2)
        return False


def kv_pool_bytes(args, context, streams):
    """kvserve's KV pool for `streams` sequences of `context` tokens
    (`kvserve plan`), with a quarter of headroom."""
    out = subprocess.run(
        [args.kvserve, "plan", "--model", args.model, "--context",
         str(context), "--concurrency", str(streams), "--kv-dtype",
         args.kv_dtype, "--json"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BenchError(f"kvserve plan failed: {out.stderr.strip()}")
    need = json.loads(out.stdout)["requested"]["bytes"]
    return max(64 << 20, need + need // 4)


def start_kvserve(args, context, streams):
    extra = ["--model", args.model, "--threads", str(args.threads),
             "--max-model-len", str(context), "--max-num-seqs",
             str(max(streams, 1)), "--kv-cache-dtype", args.kv_dtype,
             "--kv-cache-bytes", str(kv_pool_bytes(args, context, streams)),
             "--swap-space-bytes", "0", "--prefix-caching"]
    if args.rope_scale != 1:
        extra += ["--rope-scale", f"{args.rope_scale:g}"]
    try:
        return KvserveProcess(args.kvserve, ROOT, *extra)
    except RuntimeError as e:
        raise BenchError(str(e)) from e


def llama_command(args, context, streams):
    kv = LLAMA_KV_TYPE[args.kv_dtype]
    return [args.llama_server, "-m", args.model, "-t", str(args.threads),
            "-tb", str(args.threads), "-c", str(context * streams), "-np",
            str(streams), "-ctk", kv, "-ctv", kv, "-fa", args.llama_flash_attn,
            "--cache-ram", "0", "--no-webui"] + llama_rope_flags(args)


def llama_rope_flags(args):
    """--rope-scale for llama-server: linear scaling and, as its slots are
    capped at the GGUF's trained context, that context raised by the same
    factor (kvserve's --rope-scale raises its own)."""
    if args.rope_scale == 1:
        return []
    import gguf  # the project's Python environment has it

    reader = gguf.GGUFReader(args.model)

    def field(name):
        f = reader.fields[name]
        return f.parts[f.data[0]]

    arch = bytes(field("general.architecture")).decode()
    trained = int(field(f"{arch}.context_length")[0])
    return ["--rope-scaling", "linear", "--rope-scale", f"{args.rope_scale:g}",
            "--override-kv",
            f"{arch}.context_length=int:{int(trained * args.rope_scale)}"]


def corpus_tokens(port):
    """The GPL-3.0 text as token ids (llama-server's /tokenize)."""
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    tokens = post_json(port, "/tokenize",
                       {"content": text, "add_special": False})["tokens"]
    if len(tokens) < 1000:
        raise BenchError(f"/tokenize returned only {len(tokens)} tokens")
    return tokens


def make_prompt(corpus, n, rng):
    """n token ids: PREFIX_TOKENS random corpus tokens, then the corpus from a
    random offset (wrapping around)."""
    head = [rng.choice(corpus) for _ in range(min(PREFIX_TOKENS, n))]
    start = rng.randrange(len(corpus))
    body = [corpus[(start + i) % len(corpus)] for i in range(n - len(head))]
    return head + body


def request_body(prompt, max_tokens):
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def cached_tokens(event):
    """Prompt tokens a server says it reused from its cache, if it says."""
    timings = event.get("timings") or {}
    if "cache_n" in timings:
        return timings["cache_n"]
    details = (event.get("usage") or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


def note_event(rec, now, event):
    for choice in event.get("choices") or []:
        if choice.get("text"):
            rec["first"] = rec["first"] or now
            rec["last"] = now
            rec["text_events"] += 1
    if event.get("usage"):
        rec["prompt_tokens"] = event["usage"].get("prompt_tokens")
        rec["output_tokens"] = event["usage"].get("completion_tokens")
    cached = cached_tokens(event)
    if cached is not None:
        rec["cached_tokens"] = cached
    if "timings" in event:
        rec["server_prompt_ms"] = event["timings"].get("prompt_ms")


async def one_request(port, prompt, max_tokens, timeout):
    rec = {"start": time.perf_counter(), "first": None, "last": None,
           "text_events": 0, "prompt_tokens": None, "output_tokens": None,
           "cached_tokens": None, "error": None}
    try:
        async with asyncio.timeout(timeout):
            async for now, data in sse_client.stream_events(
                    "127.0.0.1", port, "/v1/completions",
                    request_body(prompt, max_tokens)):
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if event.get("error"):
                    rec["error"] = str(event["error"])[:200]
                    break
                note_event(rec, now, event)
    except (OSError, asyncio.IncompleteReadError, ValueError,
            TimeoutError, sse_client.HttpError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:200]
    rec["end"] = time.perf_counter()
    return rec


async def drive(port, prompts, max_tokens, timeout):
    return await asyncio.gather(*(one_request(port, p, max_tokens, timeout)
                                  for p in prompts))


def check_run(name, records, prompt_len, max_tokens):
    for rec in records:
        if rec["error"]:
            raise BenchError(f"{name}: request failed: {rec['error']}")
        if rec["output_tokens"] is None:
            rec["output_tokens"] = rec["text_events"]
        if rec["output_tokens"] != max_tokens:
            raise BenchError(f"{name}: {rec['output_tokens']} output tokens, "
                             f"expected {max_tokens}")
        if rec["prompt_tokens"] not in (None, prompt_len):
            raise BenchError(f"{name}: {rec['prompt_tokens']} prompt tokens, "
                             f"expected {prompt_len}")
        if rec["cached_tokens"]:
            print(f"warning: {name} reused {rec['cached_tokens']} cached "
                  "prompt tokens", file=sys.stderr)


def run_summary(records):
    """Per run: output tokens/s over its wall time; per request TTFT, TPOT."""
    wall = max(r["end"] for r in records) - min(r["start"] for r in records)
    out_tokens = sum(r["output_tokens"] for r in records)
    ttft = [r["first"] - r["start"] for r in records]
    tpot = [(r["last"] - r["first"]) / (r["output_tokens"] - 1)
            for r in records if r["output_tokens"] > 1]
    return {"tok_s": out_tokens / wall, "wall_s": wall, "ttft_s": ttft,
            "tpot_s": tpot}


def warm_up(port, corpus, max_tokens):
    asyncio.run(drive(port, [corpus[:16]], min(4, max_tokens), 120))


def measure_config(args, streams, prompt_len, rng, raw):
    context = prompt_len + args.max_tokens + CONTEXT_MARGIN
    servers = {}
    try:
        servers["llama"] = LlamaServerProcess(
            llama_command(args, context, streams))
        servers["kvserve"] = start_kvserve(args, context, streams)
        if args.corpus is None:
            args.corpus = corpus_tokens(servers["llama"].http_port)
        for name in SERVERS:
            warm_up(servers[name].http_port, args.corpus, args.max_tokens)
        runs = {name: [] for name in SERVERS}
        for rep in range(args.repeats):
            prompts = [make_prompt(args.corpus, prompt_len, rng)
                       for _ in range(streams)]
            for name in SERVERS:
                records = asyncio.run(drive(servers[name].http_port, prompts,
                                            args.max_tokens, args.timeout))
                check_run(name, records, prompt_len, args.max_tokens)
                summary = run_summary(records)
                runs[name].append(summary)
                raw.append({"server": name, "streams": streams,
                            "prompt_tokens": prompt_len, "repeat": rep,
                            "tok_s": summary["tok_s"],
                            "wall_s": summary["wall_s"], "requests": records})
                print(f"streams {streams} prompt {prompt_len} rep {rep} "
                      f"{name}: {summary['tok_s']:.1f} tok/s", flush=True)
        rss = {name: peak_rss_mib(servers[name].proc.pid) for name in SERVERS}
    finally:
        for server in servers.values():
            server.kill()
    return {name: aggregate(runs[name], rss[name], streams) for name in SERVERS}


def measure_hits(args, prompt_len, rng):
    """Cold and exact-repeat TTFT at 1 stream (see --prefix-hits)."""
    context = prompt_len + args.max_tokens + CONTEXT_MARGIN
    servers = {}
    cold = {name: [] for name in SERVERS}
    hits = {name: [] for name in SERVERS}
    cached = {name: [] for name in SERVERS}
    try:
        servers["llama"] = LlamaServerProcess(llama_command(args, context, 1))
        servers["kvserve"] = start_kvserve(args, context, 1)
        if args.corpus is None:
            args.corpus = corpus_tokens(servers["llama"].http_port)
        for name in SERVERS:
            warm_up(servers[name].http_port, args.corpus, args.max_tokens)
        for _ in range(args.repeats):
            prompt = make_prompt(args.corpus, prompt_len, rng)
            for name in SERVERS:
                port = servers[name].http_port
                for i in range(args.prefix_hits + 1):
                    (rec,) = asyncio.run(drive(port, [prompt],
                                               args.max_tokens, args.timeout))
                    if rec["error"]:
                        raise BenchError(f"{name}: request failed: "
                                         f"{rec['error']}")
                    ttft = rec["first"] - rec["start"]
                    if i == 0:
                        cold[name].append(ttft)
                    else:
                        hits[name].append(ttft)
                        cached[name].append(rec["cached_tokens"] or 0)
    finally:
        for server in servers.values():
            server.kill()
    return {name: {"cold_ttft": percentile(cold[name], 50),
                   "hit_ttft_p50": percentile(hits[name], 50),
                   "hit_ttft_p90": percentile(hits[name], 90),
                   "cached_min": min(cached[name]),
                   "cached_max": max(cached[name])} for name in SERVERS}


def print_hits_table(args, results):
    print(f"\nprefix-cache hits, kvserve vs llama-server: "
          f"{os.path.basename(args.model)}, {args.threads} threads, KV "
          f"{args.kv_dtype}, 1 stream, {args.prefix_hits} exact repeats "
          f"after each cold prompt, {args.repeats} prompts\n")
    print("| prompt | server | cold TTFT ms | hit TTFT p50 ms | "
          "hit TTFT p90 ms | cached tokens per hit |")
    print("|---|---|---|---|---|---|")
    keys = ("cold_ttft", "hit_ttft_p50", "hit_ttft_p90")
    for prompt_len, res in results:
        for name, label in (("kvserve", "kvserve"), ("llama", "llama-server")):
            r = res[name]
            span = (f"{r['cached_min']}" if r["cached_min"] == r["cached_max"]
                    else f"{r['cached_min']}-{r['cached_max']}")
            print(f"| {prompt_len} | {label} | " + " | ".join(
                cell(r[k], 1) for k in keys) + f" | {span} |")
        print(f"| {prompt_len} | kvserve/llama | " + " | ".join(
            ratio(res["kvserve"][k], res["llama"][k]) for k in keys) + " | |")


def aggregate(runs, rss, streams):
    ttft = [t for r in runs for t in r["ttft_s"]]
    tpot = [t for r in runs for t in r["tpot_s"]]
    return {"tok_s": statistics.median(r["tok_s"] for r in runs),
            "ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
            "tpot_p50": percentile(tpot, 50), "tpot_p90": percentile(tpot, 90),
            "prefill_ms": percentile(ttft, 50) if streams == 1 else None,
            "peak_rss_mib": rss}


COLUMNS = (("tok_s", "out tok/s", 1), ("ttft_p50", "TTFT p50 ms", 1),
           ("ttft_p90", "TTFT p90 ms", 1), ("tpot_p50", "TPOT p50 ms", 2),
           ("tpot_p90", "TPOT p90 ms", 2), ("prefill_ms", "prefill ms", 1),
           ("peak_rss_mib", "peak RSS MiB", 0))


def cell(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"


def print_table(args, results):
    print(f"\nkvserve vs llama-server: {os.path.basename(args.model)}, "
          f"{args.threads} threads, KV {args.kv_dtype} (llama.cpp "
          f"{LLAMA_KV_TYPE[args.kv_dtype]}, -fa {args.llama_flash_attn}), "
          f"{args.max_tokens} tokens out, {args.repeats} runs each\n")
    print("| streams | prompt | server | " +
          " | ".join(c[1] for c in COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (streams, prompt_len), res in results:
        lead = f"| {streams} | {prompt_len} |"
        for name, label in (("kvserve", "kvserve"), ("llama", "llama-server")):
            print(f"{lead} {label} | " + " | ".join(
                cell(res[name][k], d) for k, _, d in COLUMNS) + " |")
        print(f"{lead} kvserve/llama | " + " | ".join(
            ratio(res["kvserve"][k], res["llama"][k]) for k, _, _ in COLUMNS)
            + " |")


def check_binaries(args):
    needed = ((args.kvserve, "build it: cmake --build build --target kvserve"),
              (args.llama_server, "run deploy/setup.sh --bench (or "
               "tools/build_llama_cpp.sh)"),
              (args.model, "run deploy/setup.sh"))
    for path, fix in needed:
        if not os.path.isfile(path):
            raise BenchError(f"{path} missing: {fix}")


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_GGUF,
                   help="GGUF both servers load (default %(default)s)")
    p.add_argument("--kvserve", default=DEFAULT_KVSERVE,
                   help="kvserve binary (default %(default)s)")
    p.add_argument("--llama-server", default=DEFAULT_LLAMA,
                   help="llama-server binary (default %(default)s)")
    p.add_argument("--threads", type=int, default=2,
                   help="compute threads of each server (default 2)")
    p.add_argument("--kv-dtype", choices=sorted(LLAMA_KV_TYPE), default="fp16",
                   help="KV cache type (default fp16 = llama.cpp f16)")
    p.add_argument("--llama-flash-attn", choices=("on", "off", "auto"),
                   default="on",
                   help="llama-server -fa (default on; off only with "
                   "--kv-dtype fp16 or f32: llama.cpp's quantized V cache "
                   "needs flash attention)")
    p.add_argument("--streams", default="1,4,16,32,64",
                   help="concurrent streams per run, comma-separated "
                   "(default %(default)s)")
    p.add_argument("--prompt-tokens", default="64,4096",
                   help="prompt lengths in tokens, comma-separated "
                   "(default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="output tokens per request (default %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="runs per server and configuration (default "
                   "%(default)s)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds one request may take (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random prompts (default 0)")
    p.add_argument("--prefix-hits", type=int, default=0, metavar="K",
                   help="measure prefix-cache hits instead: each prompt cold, "
                   "then K exact repeats, 1 stream (default 0: off)")
    p.add_argument("--rope-scale", type=float, default=1.0,
                   help="linear RoPE scaling of both servers (kvserve "
                   "--rope-scale F; llama-server --rope-scaling linear "
                   "--rope-scale F), to run prompts past the model's "
                   "context (default 1: off)")
    p.add_argument("--json", metavar="OUT",
                   help="write the raw results (every request) to OUT")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        streams = parse_ints("--streams", args.streams)
        prompts = parse_ints("--prompt-tokens", args.prompt_tokens)
        if args.llama_flash_attn != "on" and args.kv_dtype in ("int8", "int4"):
            raise BenchError(f"--kv-dtype {args.kv_dtype} needs "
                             "--llama-flash-attn on (quantized V cache)")
        if args.max_tokens < 2 or args.repeats < 1 or args.threads < 1:
            raise BenchError("--max-tokens >= 2, --repeats >= 1, "
                             "--threads >= 1")
        args.model = os.path.abspath(args.model)
        check_binaries(args)
        args.corpus = None
        rng = random.Random(args.seed)
        raw, results = [], []
        if args.prefix_hits > 0:
            hit_results = [(n, measure_hits(args, n, rng)) for n in prompts]
            print_hits_table(args, hit_results)
            return 0
        for prompt_len in prompts:
            for n in streams:
                results.append(((n, prompt_len),
                                measure_config(args, n, prompt_len, rng, raw)))
    except BenchError as e:
        print(f"bench_vs_llama_server: error: {e}", file=sys.stderr)
        return 2
    print_table(args, results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()
                                if k != "corpus"},
                       "results": [{"streams": n, "prompt_tokens": p, **r}
                                   for (n, p), r in results],
                       "runs": raw}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
