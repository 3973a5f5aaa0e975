#!/usr/bin/env python3
"""Serving throughput and latency: the kvserve daemon vs llama.cpp's
llama-server, the same GGUF, threads, context and KV type, one client,
by the rules of ../shared/FAIR-BENCH.md (statistics in tools/fair_bench.py).

The servers run as real processes on free loopback ports: kvserve's daemon
(build/server/kvserve, started as the tests start it) and llama-server in
each of its builds (tools/build_llama_cpp.sh: llama.cpp's own defaults in
build-llama/, and without OpenMP in build-llama-noomp/), each with flash
attention on and off where the KV type allows both (-fa: on a CPU, off is
2.7x faster at batch 1 past a 4K context, on can win at short ones); at each
point each figure is compared with the peer configuration best at it (best
median output tok/s, TTFT, TPOT: a ratio row names the configuration where
it is not the throughput best). For each
prompt length and stream count, all are started with matching settings:

  threads      kvserve --threads N; llama-server -t N -tb N
  context      kvserve --max-model-len L, KV pool sized by `kvserve plan` for
               S sequences of L tokens; llama-server -np S -c S*L, L = prompt
               + output + 16 rounded up to a multiple of 256 (llama.cpp's slot
               granule, so neither pads more than the other)
  RoPE         --rope-scale F: kvserve --rope-scale F; llama-server
               --rope-scaling linear --rope-scale F --override-kv
               ARCH.context_length=int:F*trained (its slots are capped at
               the GGUF's trained context): contexts past the model's own,
               e.g. 16K on an 8K model
  KV type      kvserve --kv-cache-dtype fp16|int8|int4|f32; llama-server
               -ctk/-ctv f16|q8_0|q4_0|f32; -fa on and off for f16/f32
               (--llama-flash-attn), on alone for q8_0/q4_0 (llama.cpp
               needs it for a quantized V cache)
  caching      kvserve prefix caching on (its default); llama-server's default
               cache_prompt, with its host-memory prompt cache off
               (--cache-ram 0). Every request's prompt starts with random
               tokens, so neither server reuses a cached prefix; the tool
               checks each server's cached-token count.

Then --repeats runs (default 5) go in A B B A order (kvserve, peer builds;
then reversed): all stay up, one is driven at a time. A run opens S streams at
once (tools/sse_client.py), each a streaming POST /v1/completions, greedy
(temperature 0 and top_k 1, so no sampler chain is measured), exactly
--max-tokens out (ignore_eos); all servers get the
same S prompts in a repeat, new ones each repeat. Prompts are token ids, sent
as such to both servers (no server tokenizes text in a run): GPL-3.0 text
(tests/data/eval/gpl-3.0.txt) tokenized once by llama-server's /tokenize,
taken from a random offset after 4 random tokens of it, exactly
--prompt-tokens long; each server's reported prompt and output token
counts are checked.

Recorded per server and configuration: output tokens/s of each run (all
output tokens over its wall time; median and range over runs), TTFT p50 and
TPOT p50 of each run (TPOT per request: (last token time - first token time)
/ (tokens - 1)), and each server process's peak RSS (VmHWM of
/proc/PID/status after the runs); the kvserve / peer ratios are paired per
repeat (median and range). Then the outputs are compared: up to 4 of the
point's prompts, greedy, non-streamed, kvserve's token ids
(return_token_ids) against the peer's (/completion return_tokens); a table
row says how many streams agree on every token and where the others first
differ. Prints one Markdown table; --json OUT writes the raw per-request
records. --llama-bench first runs `llama-bench -p 512 -n 128 -t N` of each
peer build on the same file: llama.cpp's kernels without the server.

--request-rate R[,R...] runs the Poisson sweep instead of all-at-once
streams: per run --num-requests requests sent at exponential gaps of mean
1/R (tools/fair_bench.py poisson_arrivals; open loop: a send does not wait
for earlier answers), the same schedule and prompts for every server of a
run, on servers sized for --streams concurrent sequences (llama-server -np,
kvserve --max-num-seqs; more queue). Recorded per run: TTFT and TPOT p50
and p99, output tok/s.

--prefix-hits K measures prefix-cache hits instead, at 1 stream: per run a
new prompt, sent once cold and then K times again exactly (the multi-turn
case: the whole prompt re-sent), each server in turn; recorded per server are
the cold TTFT, the hits' TTFT p50/p90 and the cached prompt tokens each
server reports for the hits (llama-server's timings.cache_n, kvserve's
usage.prompt_tokens_details.cached_tokens).

    .venv/bin/python tools/bench_vs_llama_server.py --llama-bench \\
        --streams 1,4,16,32,64 --prompt-tokens 64,4096 --max-tokens 64
    .venv/bin/python tools/bench_vs_llama_server.py --streams 8 \\
        --request-rate 0.5,1,2 --num-requests 32 --prompt-tokens 256
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
import fair_bench  # noqa: E402
import sse_client  # noqa: E402
from http_stream_loadtest import percentile  # noqa: E402
from kvserve_process import KvserveProcess  # noqa: E402

DEFAULT_GGUF = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_KVSERVE = os.path.join(ROOT, "build", "server", "kvserve")
DEFAULT_LLAMAS = [os.path.join(ROOT, d, "bin", "llama-server")
                  for d in ("build-llama", "build-llama-noomp")]
CORPUS = os.path.join(ROOT, "tests", "data", "eval", "gpl-3.0.txt")
LLAMA_KV_TYPE = {"fp16": "f16", "int8": "q8_0", "int4": "q4_0", "f32": "f32"}
PREFIX_TOKENS = 4
CONTEXT_MARGIN = 16
IDS_CHECKED = 4  # prompts whose greedy ids are compared per point


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


def parse_rates(text):
    """--request-rate: comma-separated requests per second, each > 0."""
    if not text:
        return []
    try:
        rates = [float(x) for x in text.split(",") if x]
    except ValueError as e:
        raise BenchError(f"--request-rate: {e}") from e
    if any(r <= 0 for r in rates):
        raise BenchError("--request-rate: every rate must be > 0")
    return rates


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


def peer_name(binary):
    """A llama-server build's name: its build folder ("build-llama")."""
    return os.path.basename(os.path.dirname(os.path.dirname(binary)))


def llama_command(args, binary, flash_attn, context, streams):
    kv = LLAMA_KV_TYPE[args.kv_dtype]
    return [binary, "-m", args.model, "-t", str(args.threads),
            "-tb", str(args.threads), "-c", str(context * streams), "-np",
            str(streams), "-ctk", kv, "-ctv", kv, "-fa", flash_attn,
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
            "top_k": 1, "ignore_eos": True, "stream": True,
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


async def drive(port, prompts, max_tokens, timeout, arrivals=None):
    """All prompts at once, or each at its time in `arrivals` (seconds from
    the start: an open-loop load that does not wait for answers)."""
    if arrivals is None:
        return await asyncio.gather(*(one_request(port, p, max_tokens, timeout)
                                      for p in prompts))
    start = time.perf_counter()

    async def at(when, prompt):
        await asyncio.sleep(max(0.0, start + when - time.perf_counter()))
        return await one_request(port, prompt, max_tokens, timeout)

    return await asyncio.gather(*(at(t, p) for t, p in zip(arrivals, prompts)))


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


def peer_variants(args):
    """(name, binary, -fa) of every peer configuration: each build, with
    each --llama-flash-attn setting ("build-llama", or "build-llama fa=off"
    where several settings are compared)."""
    fas = args.flash_attn_settings
    return [(peer_name(b) + (f" fa={fa}" if len(fas) > 1 else ""), b, fa)
            for b in args.llama_servers for fa in fas]


def start_servers(args, context, streams):
    """kvserve and every peer configuration, by name ("kvserve",
    "build-llama", ...)."""
    servers = {}
    try:
        for name, binary, fa in peer_variants(args):
            servers[name] = LlamaServerProcess(
                llama_command(args, binary, fa, context, streams))
        servers["kvserve"] = start_kvserve(args, context, streams)
    except BaseException:
        for server in servers.values():
            server.kill()
        raise
    if args.corpus is None:
        args.corpus = corpus_tokens(next(iter(servers.values())).http_port)
    for server in servers.values():
        warm_up(server.http_port, args.corpus, args.max_tokens)
    return servers


def kvserve_ids(port, prompt, max_tokens):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "top_k": 1, "ignore_eos": True, "return_token_ids": True}
    return post_json(port, "/v1/completions", body,
                     timeout=600)["choices"][0]["token_ids"]


def llama_ids(port, prompt, max_tokens):
    body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0,
            "top_k": 1, "ignore_eos": True, "return_tokens": True,
            "cache_prompt": False}
    return post_json(port, "/completion", body, timeout=600)["tokens"]


def compare_outputs(servers, peer, prompts, max_tokens):
    """Greedy token ids of kvserve and `peer` on the same prompts."""
    ours = [kvserve_ids(servers["kvserve"].http_port, p, max_tokens)
            for p in prompts]
    theirs = [llama_ids(servers[peer].http_port, p, max_tokens)
              for p in prompts]
    agree, n, first = fair_bench.compare_ids(ours, theirs)
    return {"agree": agree, "compared": n, "first_divergence": first}


def measure_config(args, streams, prompt_len, rng, raw, rate=0.0):
    """One point: `streams` requests at once per run, or, with `rate`,
    --num-requests arriving as a Poisson process on `streams` slots."""
    context = fair_bench.context_per_slot(prompt_len, args.max_tokens,
                                          CONTEXT_MARGIN)
    servers = start_servers(args, context, streams)
    names = list(servers)
    runs = {name: [] for name in names}
    try:
        prompts = []
        for rep_i in range(args.repeats):
            count = args.num_requests if rate else streams
            prompts = [make_prompt(args.corpus, prompt_len, rng)
                       for _ in range(count)]
            arrivals = (fair_bench.poisson_arrivals(
                rate, count, rng.randrange(1 << 30)) if rate else None)
            for name in fair_bench.abba_order(
                    ["kvserve"] + [n for n in names if n != "kvserve"],
                    rep_i):
                records = asyncio.run(drive(servers[name].http_port, prompts,
                                            args.max_tokens, args.timeout,
                                            arrivals))
                check_run(name, records, prompt_len, args.max_tokens)
                summary = run_summary(records)
                runs[name].append(summary)
                raw.append({"server": name, "streams": streams,
                            "prompt_tokens": prompt_len, "rate": rate,
                            "repeat": rep_i,
                            "tok_s": summary["tok_s"],
                            "wall_s": summary["wall_s"], "requests": records})
                print(f"streams {streams} prompt {prompt_len} rate {rate:g} "
                      f"rep {rep_i} {name}: {summary['tok_s']:.1f} tok/s",
                      flush=True)
        rss = {name: peak_rss_mib(servers[name].proc.pid) for name in names}
        peer = fair_bench.best_peer(
            {n: [r["tok_s"] for r in runs[n]] for n in names
             if n != "kvserve"})
        ids = compare_outputs(servers, peer, prompts[:IDS_CHECKED],
                              args.max_tokens)
    finally:
        for server in servers.values():
            server.kill()
    result = {name: aggregate(runs[name], rss[name]) for name in names}
    result["peer"] = peer
    # Each figure against the peer configuration best at it: the fastest
    # output is not always the fastest decode (flash attention on prefills
    # faster and decodes slower past a few thousand tokens of context).
    peers = [n for n in names if n != "kvserve"]
    result["peer_for"] = {
        "tok_s": peer,
        "ttft": fair_bench.best_peer(
            {n: result[n]["ttft_runs"] for n in peers}, False),
        "tpot": fair_bench.best_peer(
            {n: result[n]["tpot_runs"] for n in peers}, False)}
    result["ratios"] = {
        key: fair_bench.paired_ratios(result["kvserve"][f"{key}_runs"],
                                      result[who][f"{key}_runs"])
        for key, who in result["peer_for"].items()}
    result["ids"] = ids
    return result


def measure_hits(args, prompt_len, rng):
    """Cold and exact-repeat TTFT at 1 stream (see --prefix-hits)."""
    context = fair_bench.context_per_slot(prompt_len, args.max_tokens,
                                          CONTEXT_MARGIN)
    servers = start_servers(args, context, 1)
    names = list(servers)
    cold = {name: [] for name in names}
    hits = {name: [] for name in names}
    cached = {name: [] for name in names}
    try:
        for rep_i in range(args.repeats):
            prompt = make_prompt(args.corpus, prompt_len, rng)
            for name in fair_bench.abba_order(names, rep_i):
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
                   "cached_max": max(cached[name])} for name in names}


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
        for name, r in res.items():
            span = (f"{r['cached_min']}" if r["cached_min"] == r["cached_max"]
                    else f"{r['cached_min']}-{r['cached_max']}")
            print(f"| {prompt_len} | {name} | " + " | ".join(
                cell(r[k], 1) for k in keys) + f" | {span} |")
        peer = min((n for n in res if n != "kvserve"),
                   key=lambda n: res[n]["hit_ttft_p50"])
        print(f"| {prompt_len} | kvserve/{peer} | " + " | ".join(
            ratio(res["kvserve"][k], res[peer][k]) for k in keys) + " | |")


def aggregate(runs, rss):
    """One server's runs: per-run figures (for ranges and paired ratios)
    and percentiles over every request."""
    tpot = [t for r in runs for t in r["tpot_s"]]
    return {"tok_s_runs": [r["tok_s"] for r in runs],
            "ttft_runs": [percentile(r["ttft_s"], 50) for r in runs],
            "tpot_runs": [percentile(r["tpot_s"], 50) for r in runs],
            "ttft_p99_runs": [percentile(r["ttft_s"], 99) for r in runs],
            "tpot_p99_runs": [percentile(r["tpot_s"], 99) for r in runs],
            "tpot_p90": percentile(tpot, 90), "peak_rss_mib": rss}


def cell(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"


def ids_cell(ids):
    first = [f for f in ids["first_divergence"] if f is not None]
    where = f"; others differ first at token {sorted(first)}" if first else ""
    return f"{ids['agree']}/{ids['compared']} streams agree{where}"


def ratio_cells(res, key):
    """A paired ratio's spread, naming the peer configuration it is
    against where that is not the output-throughput best."""
    who = res["peer_for"][key]
    cell_text = fair_bench.fmt_spread(res["ratios"][key])
    return cell_text if who == res["peer"] else f"{cell_text} (vs {who})"


SERVER_KEYS = ("kvserve", "peer", "peer_for", "ratios", "ids")


def server_rows(res):
    """(row label, figures) of kvserve then each peer configuration of a
    point, the output-throughput best marked."""
    for name in ["kvserve"] + [n for n in res if n not in SERVER_KEYS]:
        yield name + (" (best)" if name == res["peer"] else ""), res[name]


def print_table(args, results):
    print(f"\nkvserve vs llama-server: {os.path.basename(args.model)}, "
          f"{args.threads} threads, KV {args.kv_dtype} (llama.cpp "
          f"{LLAMA_KV_TYPE[args.kv_dtype]}, -fa {args.llama_flash_attn}), "
          f"{args.max_tokens} tokens out, {args.repeats} runs each in A B B A "
          "order; median [min-max] over runs; ratios paired per run against "
          "the peer configuration best at each figure\n")
    fmt = fair_bench.fmt_spread
    print("| streams | prompt | server | out tok/s | TTFT p50 ms | "
          "TPOT p50 ms | TPOT p90 ms | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for (streams, prompt_len, _), res in results:
        lead = f"| {streams} | {prompt_len} |"
        for label, r in server_rows(res):
            print(f"{lead} {label} | {fmt(r['tok_s_runs'], 1)} | "
                  f"{fmt(r['ttft_runs'], 1)} | {fmt(r['tpot_runs'], 2)} | "
                  f"{cell(r['tpot_p90'], 2)} | {cell(r['peak_rss_mib'], 0)} |")
        print(f"{lead} kvserve/{res['peer']} | {ratio_cells(res, 'tok_s')} | "
              f"{ratio_cells(res, 'ttft')} | {ratio_cells(res, 'tpot')} | | "
              f"{ratio(res['kvserve']['peak_rss_mib'], res[res['peer']]['peak_rss_mib'])} |")
        print(f"{lead} greedy ids | {ids_cell(res['ids'])} | | | | |")


def print_rate_table(args, results):
    """The Poisson sweep: latency percentiles at each arrival rate."""
    print(f"\nkvserve vs llama-server, Poisson arrivals: "
          f"{os.path.basename(args.model)}, {args.threads} threads, KV "
          f"{args.kv_dtype}, {args.num_requests} requests per run, "
          f"{args.max_tokens} tokens out, {args.repeats} runs each in A B B A "
          "order (the same arrivals and prompts for every server of a "
          "run); median [min-max] over runs\n")
    fmt = fair_bench.fmt_spread
    print("| rate req/s | slots | prompt | server | out tok/s | TTFT p50 ms | "
          "TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (streams, prompt_len, rate), res in results:
        lead = f"| {rate:g} | {streams} | {prompt_len} |"
        for label, r in server_rows(res):
            print(f"{lead} {label} | {fmt(r['tok_s_runs'], 1)} | "
                  f"{fmt(r['ttft_runs'], 1)} | {fmt(r['ttft_p99_runs'], 1)} | "
                  f"{fmt(r['tpot_runs'], 2)} | {fmt(r['tpot_p99_runs'], 2)} |")
        print(f"{lead} kvserve/{res['peer']} | {ratio_cells(res, 'tok_s')} | "
              f"{ratio_cells(res, 'ttft')} | | {ratio_cells(res, 'tpot')} | |")


def run_llama_bench(args):
    """llama-bench -p 512 -n 128 of each peer build and -fa setting on the
    model: prompt and generation tokens/s of llama.cpp's kernels alone."""
    fa = ",".join(args.flash_attn_settings)
    print(f"\nllama-bench -p 512 -n 128 -t {args.threads} -fa {fa} -r "
          f"{args.llama_bench_repeats}: {os.path.basename(args.model)}\n")
    print("| build | -fa | pp512 tok/s | tg128 tok/s |")
    print("|---|---|---|---|")
    for binary in args.llama_servers:
        bench = os.path.join(os.path.dirname(binary), "llama-bench")
        if not os.path.isfile(bench):
            raise BenchError(f"{bench} missing: run tools/build_llama_cpp.sh")
        out = subprocess.run(
            [bench, "-m", args.model, "-p", "512", "-n", "128", "-t",
             str(args.threads), "-fa", fa, "-r",
             str(args.llama_bench_repeats), "-o", "json"],
            capture_output=True, text=True, check=False, timeout=3600)
        if out.returncode != 0:
            raise BenchError(f"llama-bench failed: {out.stderr[-500:]}")
        speed = {}
        for r in json.loads(out.stdout):
            on = "on" if r.get("flash_attn") in (True, 1, "on") else "off"
            speed.setdefault(on, {})["pp" if r["n_prompt"] else "tg"] = (
                r["avg_ts"])
        for on, sp in speed.items():
            print(f"| {peer_name(binary)} | {on} | {cell(sp.get('pp'), 1)} | "
                  f"{cell(sp.get('tg'), 1)} |")


def check_binaries(args):
    if args.llama_server:
        args.llama_servers = [os.path.abspath(b)
                              for b in args.llama_server.split(",") if b]
    else:
        args.llama_servers = [b for b in DEFAULT_LLAMAS if os.path.isfile(b)]
    if not args.llama_servers:
        raise BenchError(f"no llama-server in {', '.join(DEFAULT_LLAMAS)}: "
                         "run tools/build_llama_cpp.sh all")
    needed = [(args.kvserve, "build it: cmake --build build --target kvserve"),
              (args.model, "run deploy/setup.sh")]
    needed += [(b, "run tools/build_llama_cpp.sh all")
               for b in args.llama_servers]
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
    p.add_argument("--llama-server", default="",
                   help="llama-server binaries, comma-separated: the peer's "
                   "builds, its best one compared at each point (default: "
                   "those of build-llama/ and build-llama-noomp/ that exist)")
    p.add_argument("--llama-bench", action="store_true",
                   help="first run llama-bench -p 512 -n 128 of each build "
                   "on the model (llama.cpp's kernels without the server)")
    p.add_argument("--llama-bench-repeats", type=int, default=5,
                   help="llama-bench -r: its repetitions per test (default "
                   "%(default)s, llama-bench's own)")
    p.add_argument("--threads", type=int, default=2,
                   help="compute threads of each server (default 2)")
    p.add_argument("--kv-dtype", choices=sorted(LLAMA_KV_TYPE), default="fp16",
                   help="KV cache type (default fp16 = llama.cpp f16)")
    p.add_argument("--llama-flash-attn", default="",
                   help="llama-server -fa settings compared, comma-separated "
                   "(on, off, auto), each a peer configuration of every "
                   "build (default: on,off with --kv-dtype fp16 or f32, on "
                   "otherwise: llama.cpp's quantized V cache needs flash "
                   "attention)")
    p.add_argument("--streams", default="1,4,16,32,64",
                   help="concurrent streams per run, comma-separated "
                   "(default %(default)s)")
    p.add_argument("--prompt-tokens", default="64,4096",
                   help="prompt lengths in tokens, comma-separated "
                   "(default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="output tokens per request (default %(default)s)")
    p.add_argument("--repeats", type=int, default=5,
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
    p.add_argument("--request-rate", default="", metavar="R[,R...]",
                   help="Poisson sweep: per run --num-requests requests "
                   "arriving at R per second (open loop), on --streams "
                   "slots; prints TTFT and TPOT p50/p99 (default: off)")
    p.add_argument("--num-requests", type=int, default=32,
                   help="requests per run of the Poisson sweep (default "
                   "%(default)s)")
    p.add_argument("--json", metavar="OUT",
                   help="write the raw results (every request) to OUT")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        streams = parse_ints("--streams", args.streams)
        prompts = parse_ints("--prompt-tokens", args.prompt_tokens)
        rates = parse_rates(args.request_rate)
        if rates and args.num_requests < 1:
            raise BenchError("--num-requests must be >= 1")
        if not args.llama_flash_attn:
            args.llama_flash_attn = ("on,off" if args.kv_dtype in
                                     ("fp16", "f32") else "on")
        args.flash_attn_settings = [
            x for x in args.llama_flash_attn.split(",") if x]
        if (not args.flash_attn_settings or
                set(args.flash_attn_settings) - {"on", "off", "auto"}):
            raise BenchError("--llama-flash-attn: on, off, auto or a "
                             "comma-separated list of them")
        if (args.flash_attn_settings != ["on"] and
                args.kv_dtype in ("int8", "int4")):
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
        if args.llama_bench:
            run_llama_bench(args)
        if args.prefix_hits > 0:
            hit_results = [(n, measure_hits(args, n, rng)) for n in prompts]
            print_hits_table(args, hit_results)
            return 0
        for prompt_len in prompts:
            for n in streams:
                for rate in rates or [0.0]:
                    results.append(((n, prompt_len, rate), measure_config(
                        args, n, prompt_len, rng, raw, rate)))
    except BenchError as e:
        print(f"bench_vs_llama_server: error: {e}", file=sys.stderr)
        return 2
    (print_rate_table if rates else print_table)(args, results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()
                                if k != "corpus"},
                       "results": [{"streams": n, "prompt_tokens": p,
                                    "rate": q, **r}
                                   for (n, p, q), r in results],
                       "runs": raw}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
