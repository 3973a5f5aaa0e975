#!/usr/bin/env python3
"""Structured output end to end, through the real binary on the default model.

Generated schemas within OpenAI's strict subset (tests/server/
strict_schemas.py), at temperature 0 and 1: every constrained output that
stopped on its own parses and validates against its schema (`jsonschema`);
outputs cut at max_tokens are counted and printed. The other kinds (choice,
regex, EBNF, json_object) through vLLM's structured_outputs and guided_*
fields and through gRPC's StructuredOutput; errors that name the field;
the compile cache in /metrics; and greedy constrained outputs unchanged
when the requests speculate (n-gram), preempt each other in a tiny KV pool
and fork (n = 2), with the masks computed beside the forward
(--structured-output-overlap).

About 9 s here. KVSERVE_STRUCTURED_SCHEMAS sets how many schemas (default
24; the goal's measurement runs 1,000: about 200 s).

    structured_output_e2e_test.py --binary build/server/kvserve --source-dir .
"""
import json
import os
import re
import sys
import unittest
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             run_unittests)
import strict_schemas  # noqa: E402

ARGS = None
PB = None
NUM_SCHEMAS = int(os.environ.get("KVSERVE_STRUCTURED_SCHEMAS", "24"))
PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "city": {"type": "string"}},
    "required": ["name", "age", "city"], "additionalProperties": False}


class Server(KvserveProcess):
    def __init__(self, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "64MiB", "--kv-debug-invariants",
                         *extra)

    def post(self, path, body):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def chat(self, content, **extra):
        status, body = self.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": content}], **extra})
        assert status == 200, body
        return body

    def complete(self, prompt, **extra):
        status, body = self.post("/v1/completions",
                                 {"prompt": prompt, **extra})
        assert status == 200, body
        return body


WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIMEZONE = {"type": "object", "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": WEATHER}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a timezone",
        "parameters": TIMEZONE}}]
ASK = [{"role": "user", "content": "What's the weather like in Paris today?"}]


def schema_format(schema, name="record"):
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": True}}


class StructuredOutput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()

    def test_generated_schemas_validate(self):
        import jsonschema
        cases = [(d, s, t) for d, s in strict_schemas.schemas(1, NUM_SCHEMAS)
                 for t in (0, 1)]

        def run(case):
            description, schema, temperature = case
            out = self.server.chat(
                f"Reply with JSON: {description}.", max_tokens=160,
                temperature=temperature, seed=11,
                response_format=schema_format(schema))
            return out["choices"][0]

        with ThreadPoolExecutor(8) as pool:
            choices = list(pool.map(run, cases))
        stopped = cut = 0
        for (_, schema, temperature), choice in zip(cases, choices):
            text = choice["message"]["content"]
            if choice["finish_reason"] == "length":
                cut += 1
                continue
            self.assertEqual(choice["finish_reason"], "stop")
            stopped += 1
            jsonschema.validate(json.loads(text), schema)  # raises if not
        print(f"structured output: {stopped} of {len(cases)} outputs stopped "
              f"on their own, all valid; {cut} cut at max_tokens")
        self.assertGreaterEqual(stopped, len(cases) // 2)

    def test_schema_keeps_property_order(self):
        out = self.server.chat("Give me a person as JSON.", max_tokens=80,
                               temperature=0,
                               response_format=schema_format(PERSON))
        text = out["choices"][0]["message"]["content"]
        self.assertEqual(list(json.loads(text)), ["name", "age", "city"])

    def test_other_kinds(self):
        s = self.server
        out = s.complete("Is the sky blue? Answer:", max_tokens=10,
                         guided_choice=["yes", "no"])
        self.assertIn(out["choices"][0]["text"], ("yes", "no"))
        out = s.complete("Call me at", max_tokens=20, temperature=1, seed=3,
                         structured_outputs={"regex": r"\d{3}-\d{4}"})
        self.assertRegex(out["choices"][0]["text"], r"^\d{3}-\d{4}$")
        grammar = 'root ::= "The answer is " ("red" | "blue") "."'
        out = s.complete("Colour?", max_tokens=20, guided_grammar=grammar)
        self.assertRegex(out["choices"][0]["text"],
                         r"^The answer is (red|blue)\.$")
        out = s.complete("A JSON object:", max_tokens=200, temperature=0,
                         response_format={"type": "json_object"})
        choice = out["choices"][0]
        if choice["finish_reason"] == "stop":
            self.assertIsInstance(json.loads(choice["text"]), dict)
        else:
            self.assertTrue(choice["text"].startswith("{"))
        # Forks (n = 3, sampled) each follow the grammar.
        out = s.complete("Pick a name:", max_tokens=10, n=3, temperature=1.5,
                         seed=5, guided_choice=["Alice", "Bob", "Carol"])
        for c in out["choices"]:
            self.assertIn(c["text"], ("Alice", "Bob", "Carol"))

    def test_grpc_structured_output(self):
        import grpc
        with grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}") as ch:
            stub = PB_GRPC.KvServeStub(ch)
            req = PB.GenerateRequest(
                prompt="Zip code:",
                sampling=PB.SamplingParams(max_tokens=12, temperature=0),
                structured_output=PB.StructuredOutput(regex=r"[0-9]{5}"))
            text = "".join(m.text for m in stub.Generate(req, timeout=60))
            self.assertRegex(text, r"^[0-9]{5}$")
            bad = PB.GenerateRequest(
                prompt="x", structured_output=PB.StructuredOutput(
                    json_schema='{"type": "nonsense"}'))
            with self.assertRaises(grpc.RpcError) as e:
                list(stub.Generate(bad, timeout=60))
            self.assertEqual(e.exception.code(),
                             grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("structured_output.json_schema:",
                          e.exception.details())

    def test_errors_name_the_field(self):
        s = self.server
        fmt = schema_format({"type": "object", "properties": {
            "a": {"type": "nonsense"}}})
        for body, param in [
                ({"response_format": fmt}, "response_format.json_schema.schema"),
                ({"guided_regex": "(a"}, "guided_regex"),
                ({"structured_outputs": {"grammar": "root ::= missing"}},
                 "structured_outputs.grammar"),
                ({"guided_regex": "a" * 70000}, "guided_regex"),
                ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
                ({"guided_regex": "a", "min_tokens": 2}, "min_tokens"),
                ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice")]:
            status, out = s.post("/v1/completions", {"prompt": "x", **body})
            self.assertEqual(status, 400, (body, out))
            self.assertEqual(out["error"]["param"], param, out)
            self.assertNotIn("/", out["error"]["message"].split(": ", 1)[1]
                             if param.startswith("response_format") else "")

    def check_calls(self, calls, names):
        import jsonschema
        params = {"get_weather": WEATHER, "get_time": TIMEZONE}
        for c in calls:
            self.assertTrue(c["id"].startswith("call_"), c)
            self.assertEqual(c["type"], "function")
            self.assertIn(c["function"]["name"], names)
            jsonschema.validate(json.loads(c["function"]["arguments"]),
                                params[c["function"]["name"]])

    def test_tool_calls(self):
        s = self.server
        # A named function: exactly one call of it, no text.
        out = s.chat(ASK[0]["content"], tools=TOOLS, max_tokens=60,
                     temperature=0, tool_choice={"type": "function",
                                                 "function": {"name":
                                                              "get_time"}})
        choice = out["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls", choice)
        self.assertIsNone(choice["message"]["content"])
        self.assertEqual(len(choice["message"]["tool_calls"]), 1)
        self.check_calls(choice["message"]["tool_calls"], ["get_time"])
        # Required, not parallel: one call of either tool, sampled.
        for seed in range(3):
            out = s.chat(ASK[0]["content"], tools=TOOLS, max_tokens=60,
                         temperature=1, seed=seed, tool_choice="required",
                         parallel_tool_calls=False)
            choice = out["choices"][0]
            self.assertEqual(choice["finish_reason"], "tool_calls", choice)
            self.assertEqual(len(choice["message"]["tool_calls"]), 1)
            self.check_calls(choice["message"]["tool_calls"],
                             ["get_weather", "get_time"])
        # Auto (the default with tools): text or calls, whatever it is
        # parses; a tool's result goes back as a `tool` message.
        out = s.chat(ASK[0]["content"], tools=TOOLS, max_tokens=60,
                     temperature=0)
        self.check_calls(out["choices"][0]["message"].get("tool_calls", []),
                         ["get_weather", "get_time"])
        status, out = s.post("/v1/chat/completions", {
            "messages": ASK + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1",
                 "content": '{"temperature": 18}'}],
            "tools": TOOLS, "max_tokens": 20, "temperature": 0})
        self.assertEqual(status, 200, out)

    def test_tool_calls_stream(self):
        import asyncio
        sys.path.insert(0, os.path.join(ARGS.source_dir, "tools"))
        import sse_client

        async def run():
            events = []
            async for _, data in sse_client.stream_events(
                    "127.0.0.1", self.server.http_port,
                    "/v1/chat/completions",
                    {"messages": ASK, "tools": TOOLS, "max_tokens": 60,
                     "temperature": 0, "stream": True,
                     "tool_choice": {"type": "function",
                                     "function": {"name": "get_weather"}}}):
                if data != "[DONE]":
                    events.append(json.loads(data))
            return events
        events = asyncio.run(run())
        calls = [tc for e in events for c in e["choices"]
                 for tc in c["delta"].get("tool_calls", [])]
        self.assertEqual([c["index"] for c in calls], [0])
        self.check_calls(calls, ["get_weather"])
        self.assertEqual(events[-1]["choices"][0]["finish_reason"],
                         "tool_calls")
        text = "".join(c["delta"].get("content") or ""
                       for e in events for c in e["choices"])
        self.assertNotIn("<tool_call>", text)

    def test_tool_errors_name_the_field(self):
        s = self.server
        named = {"type": "function", "function": {"name": "nope"}}
        for path, body, param in [
                ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS,
                                          "tool_choice": named},
                 "tool_choice.function.name"),
                ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS,
                                          "response_format":
                                          {"type": "json_object"}},
                 "response_format"),
                ("/v1/chat/completions", {"messages": ASK, "tools": [
                    {"type": "function", "function": {
                        "name": "f", "parameters": {"type": "nonsense"}}}]},
                 "tools"),
                ("/v1/completions", {"prompt": "x", "tools": TOOLS}, "tools")]:
            status, out = s.post(path, body)
            self.assertEqual(status, 400, (body, out))
            self.assertEqual(out["error"]["param"], param, out)
        # tool_choice "none": plain text, nothing constrained or parsed.
        status, out = s.post("/v1/chat/completions", {
            "messages": ASK, "tools": TOOLS, "tool_choice": "none",
            "max_tokens": 8})
        self.assertEqual(status, 200, out)
        self.assertNotIn("tool_calls", out["choices"][0]["message"])

    def test_repeated_schema_compiles_once(self):
        schema = {"type": "object", "properties": {"k": {"type": "boolean"}},
                  "required": ["k"], "additionalProperties": False}
        before = self.server.metrics()
        for _ in range(3):
            self.server.complete("JSON:", max_tokens=12,
                                 response_format=schema_format(schema))
        m = self.server.metrics()

        def grew(result):
            name = "kvserve_structured_output_compiles_total"
            return (counter(m, name, result=result) -
                    counter(before, name, result=result))
        self.assertEqual(grew("compiled"), 1)
        self.assertEqual(grew("cached"), 2)
        self.assertGreater(
            counter(m, "kvserve_structured_output_masks_total"), 0)

    def test_a_slow_compile_times_out_and_lands_in_the_cache(self):
        """--structured-output-compile-timeout: the request gets 504 naming
        the field; the compile finishes anyway and serves the next one."""
        server = Server("--structured-output-compile-timeout", "0.001")
        try:
            body = {"prompt": "JSON:", "max_tokens": 8,
                    "response_format": schema_format(PERSON)}
            status, out = server.post("/v1/completions", body)
            self.assertEqual(status, 504, out)
            self.assertEqual(out["error"]["param"],
                             "response_format.json_schema.schema")
            m = server.wait_metrics(lambda m: counter(
                m, "kvserve_structured_output_compiles_total",
                result="timeout") == 1)
            for _ in range(200):  # the compile ends in the background
                status, out = server.post("/v1/completions", body)
                if status == 200:
                    break
            self.assertEqual(status, 200, out)
            m = server.metrics()
            self.assertEqual(counter(m, "kvserve_structured_output_compiles_"
                                     "total", result="compiled"), 1)
        finally:
            server.terminate()

    def test_speculation_preemption_and_forks_leave_outputs_unchanged(self):
        prompts = [f"Reply with JSON: {d}." for d, _ in
                   strict_schemas.schemas(7, 4)]
        formats = [schema_format(s) for _, s in strict_schemas.schemas(7, 4)]

        def outputs(server):
            def one(i):
                return server.chat(prompts[i], max_tokens=64, temperature=0,
                                   response_format=formats[i])
            with ThreadPoolExecutor(4) as pool:
                outs = list(pool.map(one, range(4)))
            n2 = server.complete("A person:", max_tokens=48, n=2,
                                 temperature=0.9, seed=4,
                                 response_format=schema_format(PERSON))
            return ([o["choices"][0]["message"]["content"] for o in outs] +
                    [c["text"] for c in n2["choices"]])

        want = outputs(self.server)
        # 12 int8 blocks of 16 tokens (12,240 bytes a token) for requests
        # that need about 24: they preempt each other (recompute).
        block = 12240 * 16
        # Masks computed beside the forward there (the base server computes
        # them as it samples).
        small = Server("--speculative", "ngram", "--kv-cache-bytes",
                       str(12 * block), "--swap-space-bytes", "0",
                       "--structured-output-overlap")
        try:
            got = outputs(small)
            m = small.metrics()
        finally:
            small.terminate()
        self.assertEqual(got, want)
        self.assertGreater(counter(m, "kvserve_preemptions_total",
                                   mode="recompute", reason="no_free_block"),
                           0, "no preemption")
        self.assertGreater(
            counter(m, "kvserve_spec_decode_draft_tokens_total"), 0)


def setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


PB_GRPC = None

if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
