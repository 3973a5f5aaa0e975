#!/usr/bin/env python3
"""End-to-end test of kvserve's OpenAI-compatible API with the official
`openai` Python client (pinned: pip install openai==3.57.0).

Starts the real binary on free ports and checks /v1/completions and
/v1/chat/completions (streaming and not, logprobs), /v1/models, the error
shape and HTTP codes (400 naming the field, 404 for an unknown model or
route, 503 while draining), and that a client disconnect aborts a stream.

    openai_api_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when the openai package is missing.
"""

import argparse
import http.client
import json
import os
import re
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess  # noqa: E402

ARGS = None
PROMPT = "The capital of France is"


class Server(KvserveProcess):
    """The default model on free ports (see kvserve_process.py)."""

    def __init__(self, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, *extra)

    def request(self, method, path, body=None):
        """(status, parsed JSON or raw text) over plain http.client."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port,
                                          timeout=30)
        try:
            data = body if isinstance(body, (bytes, type(None))) else (
                json.dumps(body).encode())
            conn.request(method, path, body=data,
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8", "replace")
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw
        finally:
            conn.close()



class OpenAiApiTest(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        import openai
        cls.openai = openai
        cls.server = Server("--max-model-len", "512", "--kv-cache-bytes",
                            "64MiB", "--served-model-name", "tiny,tiny-alias")
        cls.client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{cls.server.http_port}/v1",
            api_key="unused", timeout=30, max_retries=0)
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.kill()

    def greedy_completion(self, **kw):
        return self.client.completions.create(
            model=self.model, prompt=PROMPT, temperature=0, max_tokens=8,
            extra_body={"ignore_eos": True}, **kw)

    def test_models(self):
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].object, "model")
        self.assertEqual(models[0].owned_by, "kvserve")
        self.assertTrue(models[0].id)

    def test_completion(self):
        c = self.greedy_completion()
        self.assertTrue(c.id.startswith("cmpl-"))
        self.assertEqual(c.object, "text_completion")
        self.assertEqual(c.model, self.model)
        self.assertEqual(len(c.choices), 1)
        self.assertEqual(c.choices[0].finish_reason, "length")
        self.assertTrue(c.choices[0].text)
        self.assertEqual(c.usage.completion_tokens, 8)
        self.assertGreater(c.usage.prompt_tokens, 0)
        self.assertEqual(c.usage.total_tokens,
                         c.usage.prompt_tokens + c.usage.completion_tokens)
        self.assertIsNotNone(c.usage.prompt_tokens_details)
        self.assertGreaterEqual(c.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(self.greedy_completion().choices[0].text,
                         c.choices[0].text)

    def test_completion_token_ids_and_logprobs(self):
        c = self.client.completions.create(
            model=self.model, prompt=[1, 504, 3575, 282], temperature=0,
            max_tokens=4, logprobs=2, extra_body={"ignore_eos": True})
        lp = c.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual(len(lp.token_logprobs), 4)
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs))
        self.assertTrue(all(len(t) == 2 for t in lp.top_logprobs))
        self.assertEqual(c.usage.prompt_tokens, 4)

    def test_return_token_ids(self):
        """vLLM's return_token_ids: each choice's output ids, streamed or
        not, the same greedy ids; absent unless asked for."""
        body = {"prompt": [1, 504, 3575, 282], "max_tokens": 6,
                "temperature": 0, "ignore_eos": True}
        status, plain = self.server.request("POST", "/v1/completions", body)
        self.assertEqual(status, 200, plain)
        self.assertNotIn("token_ids", plain["choices"][0])
        status, whole = self.server.request(
            "POST", "/v1/completions", {**body, "return_token_ids": True})
        self.assertEqual(status, 200, whole)
        ids = whole["choices"][0]["token_ids"]
        self.assertEqual(len(ids), 6)
        self.assertTrue(all(isinstance(t, int) and t >= 0 for t in ids))
        self.assertEqual(whole["choices"][0]["text"],
                         plain["choices"][0]["text"])
        status, raw = self.server.request(
            "POST", "/v1/completions",
            {**body, "return_token_ids": True, "stream": True})
        self.assertEqual(status, 200)
        streamed = []
        for event in raw.split("\n\n"):
            if event.startswith("data: {"):
                for choice in json.loads(event[6:])["choices"]:
                    streamed += choice.get("token_ids", [])
        self.assertEqual(streamed, ids)
        status, err = self.server.request(
            "POST", "/v1/completions", {**body, "return_token_ids": "yes"})
        self.assertEqual(status, 400)
        self.assertEqual(err["error"]["param"], "return_token_ids")

    def test_streaming_completion_matches(self):
        text = self.greedy_completion().choices[0].text
        chunks = list(self.greedy_completion(
            stream=True, stream_options={"include_usage": True}))
        streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        self.assertEqual(streamed, text)
        finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        self.assertEqual(finals[-1], "length")
        self.assertEqual(chunks[-1].usage.completion_tokens, 8)

    def test_stream_done_terminator(self):
        status, raw = self.server.request("POST", "/v1/completions", {
            "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "stream": True})
        self.assertEqual(status, 200)
        events = [e for e in raw.split("\n\n") if e]
        self.assertTrue(all(e.startswith("data: ") for e in events), raw)
        self.assertEqual(events[-1], "data: [DONE]")
        self.assertEqual(raw.count("[DONE]"), 1)

    def test_chat(self):
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Name a color."}]
        c = self.client.chat.completions.create(
            model=self.model, messages=messages, temperature=0,
            max_completion_tokens=8)
        self.assertTrue(c.id.startswith("chatcmpl-"))
        self.assertEqual(c.object, "chat.completion")
        msg = c.choices[0].message
        self.assertEqual(msg.role, "assistant")
        self.assertTrue(msg.content)
        self.assertIn(c.choices[0].finish_reason, ("stop", "length"))
        self.assertLessEqual(c.usage.completion_tokens, 8)
        chunks = list(self.client.chat.completions.create(
            model=self.model, messages=messages, temperature=0, max_tokens=8,
            stream=True))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        streamed = "".join(ch.choices[0].delta.content or ""
                           for ch in chunks)
        self.assertEqual(streamed, msg.content)
        self.assertEqual(chunks[-1].choices[0].finish_reason,
                         c.choices[0].finish_reason)
        self.assertTrue(all(ch.object == "chat.completion.chunk"
                            for ch in chunks))

    def test_chat_logprobs(self):
        c = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Hi"}],
            temperature=0, max_tokens=3, logprobs=True, top_logprobs=2)
        content = c.choices[0].logprobs.content
        self.assertEqual(len(content), c.usage.completion_tokens)
        self.assertEqual(len(content[0].top_logprobs), 2)

    def assert_bad_request(self, param, **kw):
        with self.assertRaises(self.openai.BadRequestError) as ctx:
            self.client.completions.create(model=self.model, prompt=PROMPT,
                                           max_tokens=2, **kw)
        err = ctx.exception
        self.assertEqual(err.status_code, 400)
        self.assertIn(param, err.body["message"])
        self.assertEqual(err.body["param"], param)
        self.assertEqual(err.body["type"], "invalid_request_error")

    def test_errors_bad_request(self):
        self.assert_bad_request("temperature", temperature=-1)
        self.assert_bad_request("top_p", top_p=1.5)
        self.assert_bad_request("n", n=17)  # n is 1..16
        self.assert_bad_request("echo", echo=True)
        self.assert_bad_request("temperature",
                                extra_body={"temperature": "hot"})
        with self.assertRaises(self.openai.BadRequestError) as ctx:
            self.client.chat.completions.create(
                model=self.model, max_tokens=2,
                messages=[{"role": "wizard", "content": "hi"}])
        self.assertEqual(ctx.exception.body["param"], "messages[0].role")

    def test_seed_takes_the_whole_uint64_range(self):
        def sample(seed):
            status, body = self.server.request("POST", "/v1/completions", {
                "prompt": "Once", "max_tokens": 10, "temperature": 1.5,
                "seed": seed, "ignore_eos": True})
            self.assertEqual(status, 200, body)
            return body["choices"][0]["text"]
        top = sample(2**64 - 1)
        self.assertEqual(sample(2**64 - 1), top)  # reproducible
        self.assertNotEqual(sample(2**63 - 1), top)  # not saturated
        for bad in (-1, 2**64, 1.5):
            status, body = self.server.request("POST", "/v1/completions", {
                "prompt": "Once", "max_tokens": 2, "seed": bad})
            self.assertEqual((status, body["error"]["param"]), (400, "seed"))

    def test_chat_has_refusal_fields(self):
        req = {"messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 3, "temperature": 0, "logprobs": True}
        status, body = self.server.request("POST", "/v1/chat/completions", req)
        self.assertEqual(status, 200, body)
        choice = body["choices"][0]
        self.assertIn("refusal", choice["message"])
        self.assertIsNone(choice["message"]["refusal"])
        self.assertIn("refusal", choice["logprobs"])
        self.assertIsNone(choice["logprobs"]["refusal"])
        status, raw = self.server.request("POST", "/v1/chat/completions",
                                          dict(req, stream=True))
        deltas = [json.loads(e[len("data: "):])["choices"][0]
                  for e in raw.split("\n\n") if e and "[DONE]" not in e]
        with_content = [d for d in deltas if "content" in d["delta"]]
        self.assertTrue(with_content)
        self.assertTrue(all(d["delta"]["refusal"] is None
                            for d in with_content), raw)
        self.assertTrue(all(d["logprobs"]["refusal"] is None
                            for d in with_content if d["logprobs"]), raw)

    def test_chat_default_max_tokens_is_the_rest_of_the_context(self):
        status, body = self.server.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}],
            "temperature": 0, "ignore_eos": True})
        self.assertEqual(status, 200, body)
        usage = body["usage"]
        # --max-model-len 512: the whole context, not 16 tokens.
        self.assertEqual(usage["prompt_tokens"] + usage["completion_tokens"],
                         512)
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        status, body = self.server.request("POST", "/v1/completions", {
            "prompt": PROMPT, "temperature": 0, "ignore_eos": True})
        self.assertEqual(body["usage"]["completion_tokens"], 16)

    def test_vllm_extensions_are_honoured(self):
        chat = {"messages": [{"role": "user", "content": "Hi"}],
                "temperature": 0, "max_tokens": 96}
        status, free = self.server.request("POST", "/v1/chat/completions",
                                           chat)
        self.assertEqual(status, 200, free)
        n = free["usage"]["completion_tokens"]
        self.assertEqual(free["choices"][0]["finish_reason"], "stop")
        # min_tokens: EOS cannot come before it.
        status, body = self.server.request(
            "POST", "/v1/chat/completions", dict(chat, min_tokens=n + 3))
        self.assertGreaterEqual(body["usage"]["completion_tokens"], n + 3)
        # stop_token_ids (2 is <|im_end|>) still stops with ignore_eos on,
        # and skip_special_tokens off shows it in the text.
        ended = dict(chat, ignore_eos=True, stop_token_ids=[2])
        status, body = self.server.request("POST", "/v1/chat/completions",
                                           ended)
        self.assertEqual(body["choices"][0]["finish_reason"], "stop", body)
        self.assertEqual(body["usage"]["completion_tokens"], n)
        status, body = self.server.request(
            "POST", "/v1/chat/completions",
            dict(chat, ignore_eos=True, max_tokens=n + 2,
                 skip_special_tokens=False))
        self.assertIn("<|im_end|>", body["choices"][0]["message"]["content"])
        # include_stop_str_in_output keeps the matched stop string.
        text = free["choices"][0]["message"]["content"]
        stop = text[len(text) // 2:len(text) // 2 + 2]
        for include in (False, True):
            status, body = self.server.request(
                "POST", "/v1/chat/completions",
                dict(chat, stop=[stop], include_stop_str_in_output=include))
            got = body["choices"][0]["message"]["content"]
            cut = text[:text.index(stop)]
            self.assertEqual(got, cut + stop if include else cut)
        for field, value in (("response_format", {"type": "xml"}),
                             ("guided_json", 7),
                             ("prompt_logprobs", 1)):
            status, body = self.server.request(
                "POST", "/v1/chat/completions", dict(chat, **{field: value}))
            self.assertEqual(status, 400, body)
            self.assertTrue(body["error"]["param"].startswith(field), body)

    def test_served_model_name_and_aliases(self):
        self.assertEqual(self.model, "tiny")
        for name in ("tiny", "tiny-alias", self.server.model_path):
            status, body = self.server.request("POST", "/v1/completions", {
                "model": name, "prompt": PROMPT, "max_tokens": 1})
            self.assertEqual(status, 200, (name, body))
            self.assertEqual(body["model"], "tiny")
        status, body = self.server.request("POST", "/v1/completions", {
            "model": "other", "prompt": PROMPT, "max_tokens": 1})
        self.assertEqual(status, 404, body)

    def test_developer_role_is_system(self):
        def prompt_tokens(role):
            status, body = self.server.request(
                "POST", "/v1/chat/completions", {
                    "messages": [{"role": role, "content": "Be brief."},
                                 {"role": "user", "content": "Hi"}],
                    "max_tokens": 1, "temperature": 0})
            self.assertEqual(status, 200, body)
            return body["usage"]["prompt_tokens"]
        self.assertEqual(prompt_tokens("developer"), prompt_tokens("system"))

    def test_deeply_nested_body_is_refused(self):
        body = ('{"prompt": "x", "user": ' + "[" * 100000 + "]" * 100000
                + "}").encode()
        status, err = self.server.request("POST", "/v1/completions", body)
        self.assertEqual((status, err["error"]["param"]), (400, "body"))

    def test_batch_prompts_are_one_request_each(self):
        def complete(prompt, **kw):
            status, body = self.server.request("POST", "/v1/completions", dict(
                {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                 "ignore_eos": True}, **kw))
            self.assertEqual(status, 200, body)
            return body
        a, b = complete("The capital of France is"), complete("Once upon a")
        both = complete(["The capital of France is", "Once upon a"], n=2)
        # Prompt-major choices: prompt i's completion j is choice i * n + j.
        self.assertEqual([c["index"] for c in both["choices"]], [0, 1, 2, 3])
        texts = [c["text"] for c in both["choices"]]
        self.assertEqual(texts, [a["choices"][0]["text"]] * 2
                         + [b["choices"][0]["text"]] * 2)
        self.assertEqual(both["usage"]["prompt_tokens"],
                         a["usage"]["prompt_tokens"]
                         + b["usage"]["prompt_tokens"])
        self.assertEqual(both["usage"]["completion_tokens"], 16)
        ids = complete([[504, 3575, 282], [1, 504]])
        self.assertEqual(len(ids["choices"]), 2)
        self.assertEqual(ids["usage"]["prompt_tokens"], 5)
        # Streamed: the same text per choice, one usage chunk, one [DONE].
        status, raw = self.server.request("POST", "/v1/completions", {
            "prompt": ["The capital of France is", "Once upon a"],
            "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}})
        self.assertEqual(status, 200, raw)
        events = [e[len("data: "):] for e in raw.split("\n\n") if e]
        self.assertEqual(events.count("[DONE]"), 1)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        streamed = {}
        for ch in chunks:
            for c in ch["choices"]:
                streamed[c["index"]] = streamed.get(c["index"], "") + c["text"]
        self.assertEqual(streamed, {0: a["choices"][0]["text"],
                                    1: b["choices"][0]["text"]})
        usage = [ch["usage"] for ch in chunks if ch.get("usage")]
        self.assertEqual(len(usage), 1)
        self.assertEqual(usage[0]["completion_tokens"], 8)
        # A bad prompt fails the whole call, naming it.
        status, body = self.server.request("POST", "/v1/completions", {
            "prompt": [[504], [10**7]], "max_tokens": 2})
        self.assertEqual((status, body["error"]["param"]),
                         (400, "prompt[1][0]"))
        self.assertIn("unknown token id", body["error"]["message"])
        status, body = self.server.request("POST", "/v1/completions", {
            "prompt": ["x"] * 65, "max_tokens": 2})
        self.assertEqual((status, body["error"]["param"]), (400, "prompt"))

    def test_errors_not_found(self):
        with self.assertRaises(self.openai.NotFoundError) as ctx:
            self.client.completions.create(model="no-such-model",
                                           prompt=PROMPT, max_tokens=2)
        self.assertEqual(ctx.exception.body["code"], "model_not_found")
        status, body = self.server.request("POST", "/v1/nothing", {})
        self.assertEqual(status, 404)
        self.assertIn("error", body)

    def test_model_path_alias(self):
        path = os.path.join(ARGS.source_dir, "weights",
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
        c = self.client.completions.create(model=path, prompt=PROMPT,
                                           max_tokens=1)
        self.assertEqual(c.model, self.model)

    def cancelled_count(self):
        _, text = self.server.request("GET", "/metrics")
        m = re.search(r'^kvserve_requests_finished_total\{reason="cancelled"\} '
                      r'(\S+)$', text, re.M)
        return float(m.group(1))

    def test_client_disconnect_aborts(self):
        before = self.cancelled_count()
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port,
                                          timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({
            "prompt": PROMPT, "max_tokens": 480, "ignore_eos": True,
            "stream": True}), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        self.assertEqual(resp.read(6), b"data: ")
        resp.close()
        conn.close()
        deadline = time.monotonic() + 20
        while self.cancelled_count() == before:
            self.assertLess(time.monotonic(), deadline, "request not aborted")
            time.sleep(0.05)  # poll interval, not synchronization

    def test_malformed_json(self):
        status, body = self.server.request("POST", "/v1/completions",
                                           b"{not json")
        self.assertEqual(status, 400)
        self.assertEqual(body["error"]["type"], "invalid_request_error")


class DrainTest(unittest.TestCase):
    def test_drain_answers_503_and_finishes_streams(self):
        server = Server("--max-model-len", "512", "--kv-cache-bytes",
                        "64MiB", "--drain-timeout", "60")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port,
                                              timeout=60)
            conn.request("POST", "/v1/completions", body=json.dumps({
                "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True,
                "stream": True}), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.assertEqual(resp.read(6), b"data: ")  # running now
            server.proc.send_signal(signal.SIGTERM)
            # "draining: N running" is logged after admission stopped; the signal
            # thread's "Terminated: draining" line may come before it.
            self.assertIsNotNone(server.wait_for(
                re.compile(r"draining: \d+ running"), 10))
            status, body = server.request("POST", "/v1/completions", {
                "prompt": PROMPT, "max_tokens": 2})
            self.assertEqual(status, 503, body)
            self.assertEqual(body["error"]["type"], "service_unavailable")
            probe = http.client.HTTPConnection("127.0.0.1", server.http_port,
                                               timeout=30)
            probe.request("POST", "/v1/completions", body=json.dumps({
                "prompt": PROMPT, "max_tokens": 2}),
                headers={"Content-Type": "application/json"})
            refused = probe.getresponse()
            refused.read()
            self.assertEqual(refused.status, 503)
            self.assertEqual(refused.getheader("Retry-After"), "1")
            probe.close()
            rest = resp.read().decode()
            self.assertTrue(rest.endswith("data: [DONE]\n\n"), rest[-200:])
            self.assertIn('"finish_reason":"length"', rest)
            conn.close()
            self.assertEqual(server.proc.wait(timeout=60), 0, server.text())
        finally:
            server.kill()


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    try:
        import openai  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (pip install openai==3.57.0)")
        return 77
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
