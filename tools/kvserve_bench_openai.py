"""kvserve-bench's OpenAI-compatible HTTP backend (--backend openai).

One streamed POST /v1/completions per request (tools/sse_client.py, no HTTP
package needed): prompt as a token-id array, max_tokens, temperature / top_p / seed (and
top_k / min_p, vLLM's extensions, only when set), ignore_eos, stream: true with stream_options.include_usage. The record it
returns has the same fields as the gRPC path's, so the run loop, summary,
table, JSON and plots in kvserve_bench.py are shared.
"""

import asyncio
import json
import time
import types

import sse_client

DEFAULT_VOCAB = 32000


async def model_info(args):
    """(name, vocab size, max context) from GET /v1/models and the flags."""
    try:
        models = await sse_client.get_json(args.host, args.port, "/v1/models")
    except (OSError, asyncio.TimeoutError, sse_client.HttpError) as e:
        raise RuntimeError(f"cannot GET /v1/models from {args.target}: {e}")
    data = models.get("data") or []
    name = args.model or (data[0].get("id") if data else None)
    if not name:
        raise RuntimeError(f"{args.target}/v1/models lists no model; pass "
                           "--model")
    entry = next((m for m in data if m.get("id") == name), {})
    max_context = int(entry.get("max_model_len") or (1 << 30))
    vocab = args.vocab_size or int(entry.get("vocab_size") or DEFAULT_VOCAB)
    return types.SimpleNamespace(name=name, vocab_size=vocab,
                                 max_context=max_context, block_size=None,
                                 num_blocks=None)


async def one_request(args, model, idx, prompt, max_tokens, progress):
    rec = {"prompt_tokens": len(prompt), "max_tokens": max_tokens,
           "output_tokens": 0, "ttft": None, "itl": [], "e2e": None,
           "finish_reason": None, "error": None, "cached_prompt_tokens": 0}
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": args.temperature, "top_p": args.top_p,
            "seed": args.seed * 100003 + idx,
            "ignore_eos": args.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True},
            "user": f"bench-{idx}"}
    if args.top_k > 0:
        body["top_k"] = args.top_k
    if args.min_p > 0:
        body["min_p"] = args.min_p
    progress.in_flight += 1
    progress.update()
    start = time.perf_counter()
    last = None
    chunks = 0
    usage = None
    try:
        async with asyncio.timeout(args.timeout):
            async for now, data in sse_client.stream_events(
                    args.host, args.port, "/v1/completions", body):
                if data == "[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("error"):
                    rec["error"] = "STREAM_ERROR"
                    rec["error_details"] = json.dumps(msg["error"])[:300]
                    break
                if msg.get("usage"):
                    usage = msg["usage"]
                for choice in msg.get("choices") or []:
                    if choice.get("finish_reason"):
                        rec["finish_reason"] = choice["finish_reason"]
                    if choice.get("text") or choice.get("finish_reason") is None:
                        if rec["ttft"] is None:
                            rec["ttft"] = now - start
                        else:
                            rec["itl"].append(now - last)
                        last = now
                        chunks += 1
        rec["e2e"] = time.perf_counter() - start
        if usage:
            rec["output_tokens"] = int(usage.get("completion_tokens", chunks))
            details = usage.get("prompt_tokens_details") or {}
            rec["cached_prompt_tokens"] = int(details.get("cached_tokens") or 0)
        else:
            rec["output_tokens"] = chunks
    except asyncio.CancelledError:
        rec["error"] = "CANCELLED_BY_BENCH"
        raise
    except TimeoutError:
        rec["error"] = "DEADLINE_EXCEEDED"
    except sse_client.HttpError as e:
        rec["error"] = f"HTTP_{e.status}"
        rec["error_details"] = e.body[:300]
    except (OSError, asyncio.IncompleteReadError, json.JSONDecodeError) as e:
        rec["error"] = type(e).__name__
        rec["error_details"] = str(e)[:300]
    finally:
        progress.in_flight -= 1
        progress.done += 1
        if rec["error"]:
            progress.failed += 1
        progress.update()
    return rec


async def run_all(args, bench):
    """Same contract as kvserve_bench.run_all: (info, [result per rate])."""
    import numpy as np

    info = await model_info(args)
    work = bench.make_workload(args, info.vocab_size, info.max_context,
                               np.random.default_rng(args.seed))

    async def send(i, prompt, max_tokens, progress):
        return await one_request(args, info.name, i, prompt, max_tokens,
                                 progress)

    results = []
    for rate in args.rates:
        label = f"rate {rate:g} " if len(args.rates) > 1 else ""
        results.append(await bench.run_once(args, rate, send, work, label))
    return info, results
