#!/usr/bin/env python3
"""kvserve-bench: a load generator for kvserve's gRPC API and for any
OpenAI-compatible HTTP endpoint (--backend openai).

Streams `Generate` calls (grpc.aio) at an open-loop Poisson request rate or
all at once, capped at --concurrency in flight, bounded by --num-requests and
--duration, and reports request throughput, output and total tokens/s, time
to first token (TTFT), inter-token latency (ITL), time per output token
(TPOT) and end-to-end latency (E2E) at p50/p90/p99 and mean, errors by gRPC
code, preemptions and peak KV usage (both read from the server's /metrics),
and in --json `engine_time`: the run's engine step and forward-pass seconds
(kvserve_engine_forward_seconds_total) and the forward's share of wall time.

Flags follow `vllm bench serve`. Examples:

    tools/kvserve_bench.py --target 127.0.0.1:50051 --num-requests 32 \\
        --request-rate 4 --concurrency 8 --input-len 128 --output-len 64
    tools/kvserve_bench.py --target 127.0.0.1:50051 --dataset shared-prefix \\
        --num-prefixes 4 --prefix-len 256 --sweep 1,2,4,inf --plot sweep.png

Prompts are token ids (`prompt_token_ids`) drawn uniformly from
[0, vocab_size) by a generator seeded with --seed, so input lengths are
exact; `sampling.ignore_eos` is on by default (--no-ignore-eos turns it off)
so output lengths are exact too. Sampling is greedy unless --temperature > 0
(then --top-p / --top-k / --min-p apply, each request seeded from --seed).

Datasets (all seeded, synthetic):
  fixed               every request: --input-len prompt, --output-len output.
  sharegpt-synthetic  lengths ~ LogNormal with median --input-len /
                      --output-len and sigma SHAREGPT_INPUT_SIGMA (1.0) /
                      SHAREGPT_OUTPUT_SIGMA (0.8), rounded, clipped to
                      [SHAREGPT_MIN_LEN (4), max_context]. The shape is an
                      approximation of ShareGPT's heavy-tailed, right-skewed
                      lengths (not fitted to the data set); with
                      --input-len 256 --output-len 192 the means are about
                      420 and 265 tokens.
  shared-prefix       --num-prefixes (S) system prompts of --prefix-len tokens;
                      request i uses prefix i mod S followed by its own
                      --input-len tokens, so U = ceil(N / S) users per prefix
                      (exercises the prefix cache).
  long-context        a mix: a --long-fraction (0.1) share of the requests have
                      a --long-input-len (2048) prompt, the rest --input-len.
Every prompt is clipped so that prompt + output fits the model's max_context.

--duration bounds the run in seconds: no request is sent after it, and
requests still in flight when it ends are cancelled and counted as
incomplete (not in the latency statistics).

ITL is measured per streamed message: the server coalesces tokens when the
client reads slower than the engine produces, so one message may carry
several tokens; the gap before such a message counts once. TPOT,
(E2E - TTFT) / (output tokens - 1), is immune to that.

--backend openai streams POST /v1/completions (stream: true, ignore_eos,
stream_options.include_usage) to --target HOST:PORT, kvserve's --http-port
or any OpenAI-compatible server (vLLM, llama.cpp's llama-server, ...).
Prompts are token-id arrays drawn from [0, --vocab-size); --model defaults
to the first model GET /v1/models lists. TTFT is the first SSE chunk,
ITL the gaps between chunks, output tokens the usage chunk's
completion_tokens (chunk count when the server sends none); /metrics
defaults to the same HOST:PORT (kvserve serves both on one port).

Targets must be loopback addresses (127.0.0.0/8, ::1, localhost).

Needs grpcio and grpcio-tools (the .proto is compiled at start into a
temporary directory), numpy, and for --plot matplotlib.
"""

import argparse
import asyncio
import ipaddress
import json
import math
import os
import re
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SHAREGPT_INPUT_SIGMA = 1.0
SHAREGPT_OUTPUT_SIGMA = 0.8
SHAREGPT_MIN_LEN = 4
DATASETS = ("fixed", "sharegpt-synthetic", "shared-prefix", "long-context")
PERCENTILES = (50, 90, 99)


class UsageError(Exception):
    pass


# ---------------------------------------------------------------- arguments


def split_host_port(target):
    """'HOST:PORT' or '[v6]:PORT' -> (host, port)."""
    m = re.fullmatch(r"\[([^\]]+)\]:(\d+)", target) or \
        re.fullmatch(r"([^:\[\]]+):(\d+)", target)
    if not m:
        raise UsageError(f"--target: expected HOST:PORT, got {target!r}")
    port = int(m.group(2))
    if not 0 < port < 65536:
        raise UsageError(f"--target: port must be in [1, 65535], got {port}")
    return m.group(1), port


def is_loopback(host):
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_loopback(flag, host):
    if not is_loopback(host):
        raise UsageError(
            f"{flag}: {host!r} is not a loopback address; kvserve-bench only "
            "targets 127.0.0.0/8, ::1 or localhost")


def parse_rate(text):
    text = text.strip().lower()
    if text in ("inf", "infinity"):
        return math.inf
    try:
        rate = float(text)
    except ValueError:
        raise UsageError(f"request rate: expected a number or inf, got {text!r}")
    if not rate > 0:
        raise UsageError(f"request rate: must be > 0, got {text}")
    return rate


def build_parser():
    p = argparse.ArgumentParser(
        prog="kvserve_bench.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("grpc", "openai"), default="grpc",
                   help="grpc: kvserve's gRPC API; openai: POST "
                   "/v1/completions with SSE streaming (default %(default)s)")
    p.add_argument("--target", default=None,
                   help="server address HOST:PORT, loopback only (default "
                   "127.0.0.1:50051 for grpc, 127.0.0.1:9090 for openai)")
    p.add_argument("--model", default=None,
                   help="openai: model name sent in requests (default: the "
                   "first one GET /v1/models lists)")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="openai: prompt token ids are drawn from [0, N) "
                   "(default: the server's, if /v1/models says, else 32000)")
    p.add_argument("--metrics-url", default=None,
                   help="Prometheus endpoint (default http://HOST:9090/metrics "
                   "with HOST from --target); loopback only")
    p.add_argument("--no-metrics", action="store_true",
                   help="do not scrape /metrics (no preemptions, no KV usage)")
    p.add_argument("--num-requests", type=int, default=100,
                   help="requests to send (default %(default)s)")
    p.add_argument("--request-rate", default="inf",
                   help="Poisson arrival rate in requests/s, or inf to send "
                   "all at once (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="most requests in flight (default: unlimited)")
    p.add_argument("--duration", type=float, default=None,
                   help="bound on the run in seconds (default: none)")
    p.add_argument("--input-len", type=int, default=128,
                   help="prompt tokens (median for sharegpt-synthetic; the "
                   "per-user part for shared-prefix) (default %(default)s)")
    p.add_argument("--output-len", type=int, default=128,
                   help="generated tokens (median for sharegpt-synthetic) "
                   "(default %(default)s)")
    p.add_argument("--dataset", choices=DATASETS, default="fixed")
    p.add_argument("--num-prefixes", type=int, default=4,
                   help="shared-prefix: system prompts S (default %(default)s)")
    p.add_argument("--prefix-len", type=int, default=256,
                   help="shared-prefix: tokens per system prompt "
                   "(default %(default)s)")
    p.add_argument("--long-input-len", type=int, default=2048,
                   help="long-context: prompt tokens of the long requests "
                   "(default %(default)s)")
    p.add_argument("--long-fraction", type=float, default=0.1,
                   help="long-context: share of long requests "
                   "(default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", dest="ignore_eos", action="store_true",
                   default=True, help="keep generating past EOS so output "
                   "lengths are exact (default on)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=600.0,
                   help="per-request gRPC deadline in seconds "
                   "(default %(default)s)")
    p.add_argument("--sweep", default=None, metavar="RATE1,RATE2,...",
                   help="run once per request rate (overrides --request-rate)")
    p.add_argument("--plot", default=None, metavar="OUT.png",
                   help="write throughput and latency against request rate "
                   "(needs matplotlib)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object on stdout")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress line on stderr")
    p.add_argument("--proto-dir", default=os.path.join(ROOT, "proto"),
                   help="where kvserve/v1/kvserve.proto is "
                   "(default %(default)s)")
    return p


def validate(args):
    if args.target is None:
        args.target = ("127.0.0.1:9090" if args.backend == "openai"
                       else "127.0.0.1:50051")
    host, port = split_host_port(args.target)
    check_loopback("--target", host)
    args.host, args.port = host, port
    if args.metrics_url is None:
        h = f"[{host}]" if ":" in host else host
        mport = port if args.backend == "openai" else 9090
        args.metrics_url = f"http://{h}:{mport}/metrics"
    url = urllib.parse.urlparse(args.metrics_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise UsageError(f"--metrics-url: expected http://HOST:PORT/PATH, got "
                         f"{args.metrics_url!r}")
    check_loopback("--metrics-url", url.hostname)
    if args.sweep:
        args.rates = [parse_rate(r) for r in args.sweep.split(",") if r.strip()]
        if not args.rates:
            raise UsageError("--sweep: no rates given")
    else:
        args.rates = [parse_rate(args.request_rate)]
    for name in ("num_requests", "input_len", "output_len", "num_prefixes",
                 "prefix_len", "long_input_len"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: must be >= 1")
    if args.vocab_size is not None and args.vocab_size < 1:
        raise UsageError("--vocab-size: must be >= 1")
    if args.concurrency is not None and args.concurrency < 1:
        raise UsageError("--concurrency: must be >= 1")
    if args.duration is not None and not args.duration > 0:
        raise UsageError("--duration: must be > 0")
    if not 0 <= args.long_fraction <= 1:
        raise UsageError("--long-fraction: must be in [0, 1]")
    if not args.timeout > 0:
        raise UsageError("--timeout: must be > 0")


# ------------------------------------------------------------------ dataset


def make_workload(args, vocab_size, max_context, rng):
    """A list of (prompt token ids, max_tokens), seeded and exact."""
    n = args.num_requests

    def ids(k):
        return rng.integers(0, vocab_size, size=k).tolist()

    def fit(prompt_len, out_len):
        out_len = max(1, min(out_len, max_context - 1))
        return max(1, min(prompt_len, max_context - out_len)), out_len

    work = []
    if args.dataset == "fixed":
        for _ in range(n):
            plen, olen = fit(args.input_len, args.output_len)
            work.append((ids(plen), olen))
    elif args.dataset == "sharegpt-synthetic":
        ins = rng.lognormal(math.log(args.input_len), SHAREGPT_INPUT_SIGMA, n)
        outs = rng.lognormal(math.log(args.output_len), SHAREGPT_OUTPUT_SIGMA,
                             n)
        for i in range(n):
            plen = max(SHAREGPT_MIN_LEN, int(round(ins[i])))
            olen = max(SHAREGPT_MIN_LEN, int(round(outs[i])))
            plen, olen = fit(plen, olen)
            work.append((ids(plen), olen))
    elif args.dataset == "shared-prefix":
        prefixes = [ids(args.prefix_len) for _ in range(args.num_prefixes)]
        for i in range(n):
            prompt = prefixes[i % args.num_prefixes] + ids(args.input_len)
            plen, olen = fit(len(prompt), args.output_len)
            work.append((prompt[:plen], olen))
    elif args.dataset == "long-context":
        long_mask = rng.random(n) < args.long_fraction
        for i in range(n):
            want = args.long_input_len if long_mask[i] else args.input_len
            plen, olen = fit(want, args.output_len)
            work.append((ids(plen), olen))
    return work


# ------------------------------------------------------------------ metrics


def scrape(url, timeout=5.0):
    """{series: value} from a Prometheus text endpoint."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read().decode("utf-8", "replace")
    out = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(metrics, name):
    """Sum of every series of `name` (all label sets), or None if absent."""
    vals = [v for k, v in metrics.items()
            if k == name or k.startswith(name + "{")]
    return sum(vals) if vals else None


class KvPoller:
    """Polls kvserve_kv_cache_usage_ratio every `interval` s; keeps the max."""

    def __init__(self, url, interval=0.1):
        self.url, self.interval = url, interval
        self.peak = None
        self.samples = 0
        self._stop = asyncio.Event()

    def _sample(self):
        try:
            v = metric_sum(scrape(self.url, timeout=2.0),
                           "kvserve_kv_cache_usage_ratio")
        except (OSError, urllib.error.URLError):
            return
        if v is not None:
            self.samples += 1
            self.peak = v if self.peak is None else max(self.peak, v)

    async def run(self):
        while not self._stop.is_set():
            await asyncio.to_thread(self._sample)
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval)
            except asyncio.TimeoutError:
                pass
        await asyncio.to_thread(self._sample)

    def stop(self):
        self._stop.set()


# -------------------------------------------------------------------- proto


def load_proto(proto_dir, out_dir):
    import grpc_tools
    from grpc_tools import protoc

    src = os.path.join(proto_dir, "kvserve/v1/kvserve.proto")
    if not os.path.exists(src):
        raise UsageError(f"--proto-dir: {src} not found")
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto_dir}", f"-I{well_known}",
                      f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
                      src])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed with {rc}")
    sys.path.insert(0, out_dir)
    from kvserve.v1 import kvserve_pb2, kvserve_pb2_grpc  # noqa: E402
    return kvserve_pb2, kvserve_pb2_grpc


# --------------------------------------------------------------------- run


class Progress:
    def __init__(self, total, enabled, label=""):
        self.total, self.enabled, self.label = total, enabled, label
        self.done = self.failed = self.in_flight = 0
        self.t0 = time.monotonic()
        self._last = 0.0

    def update(self, force=False):
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        width = 30
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        sys.stderr.write(
            f"\r{self.label}[{bar}] {self.done}/{self.total} done "
            f"({self.failed} failed), {self.in_flight} in flight, "
            f"{now - self.t0:6.1f} s ")
        sys.stderr.flush()

    def close(self):
        if self.enabled:
            self.update(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()


async def one_request(stub, pb, grpc, idx, prompt, max_tokens, args, progress):
    rec = {"prompt_tokens": len(prompt), "max_tokens": max_tokens,
           "output_tokens": 0, "ttft": None, "itl": [], "e2e": None,
           "finish_reason": None, "error": None, "cached_prompt_tokens": 0}
    req = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(
            max_tokens=max_tokens, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
            seed=args.seed * 100003 + idx, ignore_eos=args.ignore_eos),
        request_id=f"bench-{idx}")
    progress.in_flight += 1
    progress.update()
    start = time.perf_counter()
    last = None
    call = stub.Generate(req, timeout=args.timeout)
    try:
        async for msg in call:
            now = time.perf_counter()
            if msg.token_ids:
                if rec["ttft"] is None:
                    rec["ttft"] = now - start
                else:
                    rec["itl"].append(now - last)
                last = now
                rec["output_tokens"] += len(msg.token_ids)
            if msg.finish_reason:
                rec["finish_reason"] = pb.FinishReason.Name(msg.finish_reason)
                rec["cached_prompt_tokens"] = msg.usage.cached_prompt_tokens
        rec["e2e"] = time.perf_counter() - start
    except asyncio.CancelledError:
        call.cancel()
        rec["error"] = "CANCELLED_BY_BENCH"
        raise
    except grpc.aio.AioRpcError as e:
        rec["error"] = e.code().name
        rec["error_details"] = e.details()
    finally:
        progress.in_flight -= 1
        progress.done += 1
        if rec["error"]:
            progress.failed += 1
        progress.update()
    return rec


async def run_once(args, rate, send, work, label=""):
    """send(idx, prompt, max_tokens, progress) -> record (one request)."""
    import numpy as np

    rng = np.random.default_rng(args.seed + 1)  # arrivals, apart from prompts
    n = len(work)
    offsets = ([0.0] * n if math.isinf(rate)
               else np.cumsum(rng.exponential(1.0 / rate, n)).tolist())
    sem = asyncio.Semaphore(args.concurrency or n)
    progress = Progress(n, not args.no_progress, label)
    records = [None] * n
    stopped = asyncio.Event()

    before = None
    poller = None
    if not args.no_metrics:
        try:
            before = await asyncio.to_thread(scrape, args.metrics_url)
        except (OSError, urllib.error.URLError) as e:
            print(f"warning: cannot scrape {args.metrics_url} ({e}); "
                  "no preemption / KV usage figures", file=sys.stderr)
        if before is not None:
            poller = KvPoller(args.metrics_url)

    t0 = time.perf_counter()

    async def launch(i):
        delay = offsets[i] - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        async with sem:
            if stopped.is_set():
                return
            records[i] = await send(i, work[i][0], work[i][1], progress)

    poll_task = asyncio.create_task(poller.run()) if poller else None
    tasks = [asyncio.create_task(launch(i)) for i in range(n)]
    done, pending = await asyncio.wait(tasks, timeout=args.duration)
    cancelled_in_flight = 0
    if pending:
        stopped.set()
        cancelled_in_flight = progress.in_flight
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    elapsed = time.perf_counter() - t0
    progress.close()

    after = None
    if poller:
        poller.stop()
        await poll_task
        try:
            after = await asyncio.to_thread(scrape, args.metrics_url)
        except (OSError, urllib.error.URLError):
            pass
    return summarize(args, rate, records, elapsed, before, after, poller,
                     cancelled_in_flight)


def stats(values):
    import numpy as np

    if not values:
        return None
    arr = np.asarray(values, dtype=float) * 1000.0  # ms
    out = {"mean": float(arr.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def summarize(args, rate, records, elapsed, before, after, poller,
              cancelled_in_flight):
    ok = [r for r in records if r is not None and r["error"] is None]
    errors = {}
    for r in records:
        if r is not None and r["error"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    not_sent = sum(1 for r in records if r is None) - cancelled_in_flight
    out_tokens = sum(r["output_tokens"] for r in ok)
    in_tokens = sum(r["prompt_tokens"] for r in ok)
    tpot = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1)
            for r in ok if r["ttft"] is not None and r["output_tokens"] > 1]
    finish = {}
    for r in ok:
        finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
    preemptions = None
    if before is not None and after is not None:
        a = metric_sum(after, "kvserve_preemptions_total")
        b = metric_sum(before, "kvserve_preemptions_total")
        if a is not None and b is not None:
            preemptions = int(round(a - b))
    # Engine time split (kvserve only): the share of the run's wall time
    # spent in engine steps and, within them, in the model forward pass.
    engine = {}
    for key, name in (("step_s", "kvserve_engine_step_duration_seconds_sum"),
                      ("forward_s", "kvserve_engine_forward_seconds_total"),
                      ("steps", "kvserve_engine_step_duration_seconds_count")):
        if before is not None and after is not None:
            a, b = metric_sum(after, name), metric_sum(before, name)
            if a is not None and b is not None:
                engine[key] = a - b
    if elapsed > 0 and "forward_s" in engine:
        engine["forward_fraction_of_wall"] = engine["forward_s"] / elapsed
    if engine.get("step_s") and "forward_s" in engine:
        engine["forward_fraction_of_steps"] = (engine["forward_s"] /
                                               engine["step_s"])
    return {
        "engine_time": engine or None,
        "request_rate": "inf" if math.isinf(rate) else rate,
        "dataset": args.dataset,
        "num_requests": len(records),
        "concurrency": args.concurrency,
        "completed": len(ok),
        "failed": sum(errors.values()),
        "cancelled_at_duration": cancelled_in_flight,
        "not_sent": not_sent,
        "errors": errors,
        "finish_reasons": finish,
        "duration_s": elapsed,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "cached_prompt_tokens": sum(r["cached_prompt_tokens"] for r in ok),
        "request_throughput": len(ok) / elapsed if elapsed > 0 else 0.0,
        "output_throughput": out_tokens / elapsed if elapsed > 0 else 0.0,
        "total_token_throughput":
            (in_tokens + out_tokens) / elapsed if elapsed > 0 else 0.0,
        "ttft_ms": stats([r["ttft"] for r in ok if r["ttft"] is not None]),
        "itl_ms": stats([x for r in ok for x in r["itl"]]),
        "tpot_ms": stats(tpot),
        "e2e_ms": stats([r["e2e"] for r in ok]),
        "preemptions": preemptions,
        "peak_kv_usage": poller.peak if poller else None,
        "kv_usage_samples": poller.samples if poller else 0,
    }


async def run_all(args, pb, pb_grpc):
    import grpc
    import numpy as np

    async with grpc.aio.insecure_channel(args.target) as channel:
        try:
            await asyncio.wait_for(channel.channel_ready(), 10)
        except asyncio.TimeoutError:
            raise RuntimeError(f"cannot connect to {args.target} within 10 s")
        stub = pb_grpc.KvServeStub(channel)
        info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        work = make_workload(args, info.vocab_size, info.max_context,
                             np.random.default_rng(args.seed))
        results = []
        for rate in args.rates:
            label = (f"rate {rate:g} " if len(args.rates) > 1 else "")

            async def send(i, prompt, max_tokens, progress):
                return await one_request(stub, pb, grpc, i, prompt, max_tokens,
                                         args, progress)

            results.append(await run_once(args, rate, send, work, label))
        return info, results


# ------------------------------------------------------------------ output


def fmt(v, digits=2):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def print_table(info, r, out=sys.stdout):
    rows = [
        ("Model", info.name),
        ("Dataset", r["dataset"]),
        ("Request rate (req/s)", r["request_rate"]),
        ("Max concurrency", r["concurrency"] or "unlimited"),
        ("Successful requests", r["completed"]),
        ("Failed requests", r["failed"]),
    ]
    if r["errors"]:
        rows.append(("Errors by code", ", ".join(
            f"{k} {v}" for k, v in sorted(r["errors"].items()))))
    if r["cancelled_at_duration"] or r["not_sent"]:
        rows.append(("Cancelled at --duration", r["cancelled_at_duration"]))
        rows.append(("Not sent (--duration)", r["not_sent"]))
    rows += [
        ("Benchmark duration (s)", fmt(r["duration_s"])),
        ("Total input tokens", r["total_input_tokens"]),
        ("Total generated tokens", r["total_output_tokens"]),
        ("Cached prompt tokens", r["cached_prompt_tokens"]),
        ("Request throughput (req/s)", fmt(r["request_throughput"])),
        ("Output token throughput (tok/s)", fmt(r["output_throughput"])),
        ("Total token throughput (tok/s)", fmt(r["total_token_throughput"])),
        ("Preemptions", fmt(r["preemptions"])),
        ("Peak KV cache usage", "n/a" if r["peak_kv_usage"] is None
         else f"{100 * r['peak_kv_usage']:.1f}%"),
    ]
    width = 40
    title = " Serving Benchmark Result "
    print(f"{title:=^{width + 12}}", file=out)
    for k, v in rows:
        print(f"{k + ':':<{width}}{v!s:>12}", file=out)
    for key, name in (("ttft_ms", "Time to First Token"),
                      ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                      ("itl_ms", "Inter-token Latency (per message)"),
                      ("e2e_ms", "End-to-end Latency")):
        print(f"{' ' + name + ' ':-^{width + 12}}", file=out)
        s = r[key]
        for stat in ("mean", "p50", "p90", "p99"):
            label = f"{stat.capitalize() if stat == 'mean' else stat.upper()}"
            label = f"{label} {key.split('_')[0].upper()} (ms):"
            print(f"{label:<{width}}{fmt(s[stat] if s else None):>12}",
                  file=out)
    print("=" * (width + 12), file=out)


def print_sweep_table(results, out=sys.stdout):
    head = ("rate", "ok", "fail", "req/s", "out tok/s", "TTFT p50", "TTFT p99",
            "ITL p50", "E2E p50", "E2E p99", "preempt", "peak KV")
    print(" ".join(f"{h:>9}" for h in head), file=out)
    for r in results:
        def p(key, q):
            return fmt(r[key][q], 1) if r[key] else "n/a"
        kv = ("n/a" if r["peak_kv_usage"] is None
              else f"{100 * r['peak_kv_usage']:.1f}%")
        row = (r["request_rate"], r["completed"], r["failed"],
               fmt(r["request_throughput"]), fmt(r["output_throughput"], 1),
               p("ttft_ms", "p50"), p("ttft_ms", "p99"), p("itl_ms", "p50"),
               p("e2e_ms", "p50"), p("e2e_ms", "p99"), fmt(r["preemptions"]),
               kv)
        print(" ".join(f"{str(c):>9}" for c in row), file=out)
    print("(latencies in ms)", file=out)


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install matplotlib)")
    finite = [r["request_rate"] for r in results if r["request_rate"] != "inf"]
    inf_x = 2 * max(finite) if finite else 1.0
    xs = [inf_x if r["request_rate"] == "inf" else r["request_rate"]
          for r in results]
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    xs = [xs[i] for i in order]
    rs = [results[i] for i in order]

    def series(key, q):
        return [r[key][q] if r[key] else float("nan") for r in rs]

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(xs, [r["output_throughput"] for r in rs], "o-",
             label="output tok/s")
    ax1.plot(xs, [r["total_token_throughput"] for r in rs], "s--",
             label="total tok/s")
    ax1.set_xlabel("request rate (req/s)")
    ax1.set_ylabel("tokens/s")
    ax1b = ax1.twinx()
    ax1b.plot(xs, [r["request_throughput"] for r in rs], "^:", color="gray",
              label="req/s")
    ax1b.set_ylabel("requests/s")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax1b.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax1.set_title("Throughput vs request rate")
    for key, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E"),
                      ("itl_ms", "ITL")):
        ax2.plot(xs, series(key, "p50"), "o-", label=f"{name} p50")
        ax2.plot(xs, series(key, "p99"), "x--", label=f"{name} p99")
    ax2.set_xlabel("request rate (req/s)")
    ax2.set_ylabel("latency (ms)")
    ax2.set_yscale("log")
    ax2.legend(fontsize=8)
    ax2.set_title("Latency vs request rate")
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.set_xticklabels(["inf" if r["request_rate"] == "inf"
                            else f"{r['request_rate']:g}" for r in rs])
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------- main


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        validate(args)
        if args.plot:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise UsageError(
                    "--plot needs matplotlib (pip install matplotlib)")
        try:
            import numpy  # noqa: F401
            if args.backend == "grpc":
                import grpc  # noqa: F401
                import grpc_tools  # noqa: F401
        except ImportError as e:
            print(f"error: {e} (pip install grpcio==1.85.1 "
                  "grpcio-tools==1.85.1 numpy)", file=sys.stderr)
            return 1
        if args.backend == "openai":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import kvserve_bench_openai
            info, results = asyncio.run(kvserve_bench_openai.run_all(
                args, sys.modules[__name__]))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                pb, pb_grpc = load_proto(args.proto_dir, tmp)
                info, results = asyncio.run(run_all(args, pb, pb_grpc))
        if args.plot:
            plot(results, args.plot)
    except UsageError as e:
        print(f"kvserve_bench: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # connection failures, protoc errors
        print(f"kvserve_bench: error: {e}", file=sys.stderr)
        return 1

    model = {"name": info.name, "vocab_size": info.vocab_size,
             "max_context": info.max_context, "block_size": info.block_size,
             "num_blocks": info.num_blocks}
    if args.json:
        obj = {"backend": args.backend, "target": args.target,
               "model": model, "seed": args.seed,
               "ignore_eos": args.ignore_eos,
               "sampling": {"temperature": args.temperature,
                            "top_p": args.top_p, "top_k": args.top_k,
                            "min_p": args.min_p}}
        if args.sweep:
            obj["sweep"] = results
        else:
            obj.update(results[0])
        if args.plot:
            obj["plot"] = args.plot
        print(json.dumps(obj, indent=None, sort_keys=False))
    else:
        for r in results:
            print_table(info, r)
        if len(results) > 1:
            print_sweep_table(results)
        if args.plot:
            print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
