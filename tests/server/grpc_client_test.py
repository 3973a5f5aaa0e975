#!/usr/bin/env python3
"""End-to-end test of the kvserve daemon through Python grpcio.

grpcio is an independent gRPC implementation (the C++ tests use gRPC C++),
so this checks the wire contract: the .proto compiled at test time with
grpcio-tools, streaming Generate, Tokenize/Detokenize, GetModelInfo,
INVALID_ARGUMENT naming the field (also for invalid UTF-8 sent as raw
bytes), deadline and cancellation, grpc.health.v1 and reflection (raw
bytes, no extra packages), /metrics, /ready, and the SIGTERM drain.

    grpc_client_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import os
import signal
import sys
import unittest

import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, run_unittests  # noqa: E402

ARGS = None
PB = None  # kvserve_pb2
PB_GRPC = None  # kvserve_pb2_grpc


class Server(KvserveProcess):
    """The default model on free ports (see kvserve_process.py)."""

    def __init__(self, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, *extra)

    def channel(self):
        import grpc
        return grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")

    def http(self, path):
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

def greedy(prompt, max_tokens):
    return PB.GenerateRequest(
        prompt=prompt,
        sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                   ignore_eos=True))


def run_stream(stub, request, timeout=120):
    tokens, text, last = [], "", None
    for msg in stub.Generate(request, timeout=timeout):
        tokens += list(msg.token_ids)
        text += msg.text
        last = msg
    return tokens, text, last


class GrpcClientTest(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-model-len", "512", "--kv-cache-bytes",
                            "128MiB")
        cls.channel = cls.server.channel()
        cls.stub = PB_GRPC.KvServeStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.kill()

    def test_generate_streams_greedy_tokens(self):
        req = greedy("The capital of France is", 8)
        tokens, text, last = run_stream(self.stub, req)
        self.assertEqual(len(tokens), 8)
        self.assertTrue(text)
        self.assertEqual(last.finish_reason, PB.FINISH_REASON_LENGTH)
        self.assertEqual(last.usage.completion_tokens, 8)
        prompt_ids = self.stub.Tokenize(PB.TokenizeRequest(text=req.prompt))
        self.assertEqual(last.usage.prompt_tokens, len(prompt_ids.token_ids))
        self.assertGreaterEqual(last.timings.total_seconds,
                                last.timings.time_to_first_token_seconds)
        again, _, _ = run_stream(self.stub, req)
        self.assertEqual(tokens, again)

    def test_chat(self):
        req = PB.GenerateRequest(
            chat=PB.ChatMessages(messages=[
                PB.ChatMessage(role="system", content="Be brief."),
                PB.ChatMessage(role="user", content="Name a color."),
            ]),
            sampling=PB.SamplingParams(temperature=0, max_tokens=8))
        tokens, _, last = run_stream(self.stub, req)
        self.assertTrue(tokens)
        self.assertIn(last.finish_reason,
                      (PB.FINISH_REASON_LENGTH, PB.FINISH_REASON_STOP))

    def test_tokenize_detokenize_round_trip(self):
        text = "Grüße aus Köln, 東京 and emoji 🙂!"
        ids = self.stub.Tokenize(PB.TokenizeRequest(text=text)).token_ids
        self.assertTrue(ids)
        out = self.stub.Detokenize(
            PB.DetokenizeRequest(token_ids=ids, skip_special_tokens=True))
        self.assertEqual(out.text, text)

    def test_model_info(self):
        info = self.stub.GetModelInfo(PB.GetModelInfoRequest())
        self.assertEqual((info.num_layers, info.num_heads, info.num_kv_heads,
                          info.head_dim), (30, 9, 3, 64))
        self.assertEqual(info.max_context, 512)
        # The CPU's default KV dtype for head_dim 64: int8 (q8_0 groups of
        # 32 with an fp16 scale: 34 bytes per 32 elements).
        self.assertEqual(info.kv_dtype, "int8")
        self.assertEqual(info.kv_bytes_per_token, 2 * 30 * 3 * 64 * 34 // 32)
        self.assertGreater(info.num_blocks, 0)

    def assert_invalid(self, request, field):
        import grpc
        with self.assertRaises(grpc.RpcError) as cm:
            run_stream(self.stub, request, timeout=30)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(field, cm.exception.details())

    def test_bad_inputs_are_invalid_argument(self):
        def with_sampling(**kw):
            req = greedy("Hello", 4)
            for k, v in kw.items():
                setattr(req.sampling, k, v)
            return req

        self.assert_invalid(PB.GenerateRequest(prompt=""), "prompt")
        self.assert_invalid(with_sampling(top_p=1.5), "sampling.top_p")
        self.assert_invalid(with_sampling(top_k=-1), "sampling.top_k")
        self.assert_invalid(with_sampling(temperature=-1),
                            "sampling.temperature")
        self.assert_invalid(with_sampling(max_tokens=0), "sampling.max_tokens")
        self.assert_invalid(with_sampling(max_tokens=100000),
                            "sampling.max_tokens")
        self.assert_invalid(with_sampling(logprobs=50), "sampling.logprobs")
        self.assert_invalid(
            PB.GenerateRequest(prompt_token_ids=PB.TokenIds(ids=[1, 10**7])),
            "prompt_token_ids.ids[1]")
        self.assert_invalid(
            PB.GenerateRequest(chat=PB.ChatMessages(
                messages=[PB.ChatMessage(role="oracle", content="hi")])),
            "chat.messages[0].role")
        stop = greedy("Hello", 4)
        stop.sampling.stop.extend(["s"] * 17)
        self.assert_invalid(stop, "sampling.stop")

    def test_invalid_utf8_is_invalid_argument(self):
        import grpc
        # Python strings cannot carry invalid UTF-8; send raw bytes:
        # TokenizeRequest{text: 0xFF 0xFE}.
        tokenize = self.channel.unary_unary(
            "/kvserve.v1.KvServe/Tokenize",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        with self.assertRaises(grpc.RpcError) as cm:
            tokenize(b"\x0a\x02\xff\xfe", timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("text: invalid UTF-8", cm.exception.details())

    def test_deadline(self):
        import grpc
        with self.assertRaises(grpc.RpcError) as cm:
            run_stream(self.stub, greedy("Count slowly:", 480), timeout=0.3)
        self.assertEqual(cm.exception.code(),
                         grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_cancel_mid_stream_frees_blocks(self):
        import grpc
        call = self.stub.Generate(greedy("Tell me a story.", 480), timeout=60)
        next(call)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as cm:
            for _ in call:
                pass
        self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)
        m = self.server.wait_metrics(
            lambda m: m.get('kvserve_kv_blocks{state="active"}') == 0 and
            m.get('kvserve_requests{state="running"}') == 0)
        self.assertEqual(m.get('kvserve_kv_blocks{state="active"}'), 0)

    def test_health_and_reflection(self):
        check = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        self.assertEqual(check(b"", timeout=10), b"\x08\x01")  # SERVING
        svc = b"kvserve.v1.KvServe"
        self.assertEqual(check(b"\x0a" + bytes([len(svc)]) + svc, timeout=10),
                         b"\x08\x01")
        reflect = self.channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        replies = list(reflect(iter([b"\x3a\x01*"]), timeout=10))
        self.assertTrue(replies)
        self.assertIn(b"kvserve.v1.KvServe", replies[0])

    def test_metrics_and_ready(self):
        run_stream(self.stub, greedy("Hi", 2))
        status, body = self.server.http("/metrics")
        self.assertEqual(status, 200)
        for name in ("kvserve_kv_blocks{", "kvserve_generation_tokens_total",
                     "kvserve_grpc_requests_total{"):
            self.assertIn(name, body)
        self.assertEqual(self.server.http("/ready")[0], 200)
        self.assertEqual(self.server.http("/health")[0], 200)


class SigtermTest(unittest.TestCase):
    def test_sigterm_drains_in_flight_stream(self):
        server = Server("--kv-cache-bytes", "64MiB")
        try:
            channel = server.channel()
            stub = PB_GRPC.KvServeStub(channel)
            call = stub.Generate(greedy("Once upon a time", 40), timeout=60)
            first = next(call)
            tokens = list(first.token_ids)
            server.proc.send_signal(signal.SIGTERM)
            last = first
            for msg in call:
                tokens += list(msg.token_ids)
                last = msg
            self.assertEqual(len(tokens), 40)
            self.assertEqual(last.finish_reason, PB.FINISH_REASON_LENGTH)
            self.assertEqual(server.proc.wait(timeout=30), 0, server.text())
            channel.close()
        finally:
            server.kill()


def _setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


def main():
    return run_unittests(__doc__, _setup)


if __name__ == "__main__":
    sys.exit(main())
