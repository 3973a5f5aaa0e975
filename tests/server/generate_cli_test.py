#!/usr/bin/env python3
"""`kvserve generate` runs a request as the server does.

The command's text must equal the daemon's for the same request over gRPC:
greedy, raw and chat prompts; and sampled with nothing but a seed, which
holds only when the command's sampling defaults are the server's. Also: a
seed makes sampling reproducible; `--device cuda` fails where the daemon's
does, with its message naming --device (no CUDA device or no CUDA build);
`--max-tokens` past the context is refused naming the flag.

    generate_cli_test.py --binary build/server/kvserve --source-dir .
"""

import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, run_unittests  # noqa: E402

ARGS = None
PB = None
PB_GRPC = None
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NO_DEVICE = ("no CUDA device is visible", "has no CUDA support")


def generate(*flags, timeout=300):
    """Runs `kvserve generate` on the default model; the finished process."""
    model = os.path.join(ARGS.source_dir, "weights", MODEL_FILE)
    return subprocess.run([ARGS.binary, "generate", "--model", model, *flags],
                          cwd=ARGS.source_dir, capture_output=True, text=True,
                          timeout=timeout)


def generated_text(test, *flags):
    """The text `kvserve generate` prints (stdout ends with one newline)."""
    out = generate(*flags)
    test.assertEqual(out.returncode, 0, out.stderr)
    test.assertTrue(out.stdout.endswith("\n"), out.stdout)
    return out.stdout[:-1], out.stderr


class GenerateCli(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        import grpc
        cls.server = KvserveProcess(ARGS.binary, ARGS.source_dir)
        cls.channel = grpc.insecure_channel(
            f"127.0.0.1:{cls.server.grpc_port}")
        cls.stub = PB_GRPC.KvServeStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.kill()

    def served_text(self, prompt, chat, **sampling):
        """The daemon's text for `prompt` with only `sampling` set."""
        req = PB.GenerateRequest(sampling=PB.SamplingParams(**sampling))
        if chat:
            req.chat.messages.append(
                PB.ChatMessage(role="user", content=prompt))
        else:
            req.prompt = prompt
        return "".join(m.text for m in self.stub.Generate(req, timeout=120))

    def test_greedy_text_equals_the_servers(self):
        # The last prompt takes two prefill steps (the engine's 512-token
        # budget) and many KV blocks of the pool sized for the sequence.
        cases = [("The capital of France is", False, 8),
                 ("What is 2+2?", True, 16),
                 ("Write a short poem about the sea.", True, 40),
                 (" ".join(["The quick brown fox jumps over the lazy dog."]
                           * 70) + " Then the fox", False, 12)]
        for prompt, chat, n in cases:
            with self.subTest(prompt=prompt[:40]):
                text, err = generated_text(
                    self, "--chat" if chat else "--no-chat",
                    "--temperature", "0", "--max-tokens", str(n),
                    "--prompt", prompt)
                self.assertEqual(
                    text, self.served_text(prompt, chat, temperature=0,
                                           max_tokens=n))
                self.assertNotEqual(text, "")
                prefill = re.search(r"prefill: (\d+) tokens", err)
                if len(prompt) > 1000:
                    self.assertGreater(int(prefill[1]), 512)

    def test_unset_flags_take_the_servers_defaults(self):
        # Only a seed: temperature, top-k, top-p, min-p, repetition penalty
        # and (for a raw prompt) max_tokens come from the defaults of both
        # sides. Chat's default max_tokens is the rest of the context, too
        # long to sample here: it is given.
        for prompt, chat in [("Once upon a time", False),
                             ("Tell me about cats.", True)]:
            with self.subTest(prompt=prompt):
                limit = {"max_tokens": 16} if chat else {}
                flags = ["--max-tokens", "16"] if chat else []
                text, err = generated_text(
                    self, "--chat" if chat else "--no-chat", "--seed", "7",
                    *flags, "--prompt", prompt)
                self.assertEqual(
                    text, self.served_text(prompt, chat, seed=7, **limit))
                decoded = int(re.search(r"decode: (\d+) tokens", err)[1])
                self.assertLessEqual(decoded + 1, 16)  # max_tokens 16

    def test_seed_makes_sampling_reproducible(self):
        flags = ("--no-chat", "--temperature", "1", "--ignore-eos",
                 "--max-tokens", "24", "--prompt", "My favourite food is")
        first, err = generated_text(self, "--seed", "7", *flags)
        again, _ = generated_text(self, "--seed", "7", *flags)
        other, _ = generated_text(self, "--seed", "8", *flags)
        self.assertEqual(first, again)
        self.assertNotEqual(first, other)
        self.assertIn(", seed 7\n", err)
        self.assertRegex(err, r"prefill: \d+ tokens in [\d.]+ s")
        self.assertIn("decode: 23 tokens in ", err)

    def test_device_cuda_fails_as_the_daemon_does(self):
        # The daemon on --device cuda, as the probe of this machine: where
        # it refuses, generate must refuse with the same message.
        try:
            daemon = KvserveProcess(ARGS.binary, ARGS.source_dir, "--device",
                                    "cuda", timeout=900)
            daemon.kill()
            refusal = None
        except RuntimeError as e:
            refusal = re.search(r"--device=cuda: [^\n]*", str(e))
            self.assertIsNotNone(refusal, str(e))
            self.assertTrue(any(why in refusal[0] for why in NO_DEVICE), e)
        out = generate("--device", "cuda", "--temperature", "0",
                       "--max-tokens", "4", "--prompt", "Hi")
        if refusal is None:  # a CUDA device (or the SIMT emulator)
            self.assertEqual(out.returncode, 0, out.stderr)
        else:
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn(refusal[0], out.stderr)
            self.assertEqual(out.stdout, "")
        bad = generate("--device", "tpu", "--prompt", "Hi")
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("--device: must be cpu, cuda, auto, or sim:", bad.stderr)

    def test_values_the_server_refuses_name_the_flag(self):
        cases = [(["--max-tokens", "9000"],
                  r"--max-tokens: prompt \(\d+ tokens\) \+ max_tokens "
                  r"\(9000\) exceeds the model's context of 8192"),
                 (["--top-p", "0"], r"--top-p: must be in \(0, 1\], got 0"),
                 (["--max-tokens", "0"], r"invalid value '0' for "
                                         r"--max-tokens"),
                 (["--temperature", "-1"], r"--temperature")]
        for flags, message in cases:
            with self.subTest(flags=flags):
                out = generate("--no-chat", *flags, "--prompt",
                               "The capital of France is")
                self.assertEqual(out.returncode, 2, out.stderr)
                self.assertRegex(out.stderr, message)
                self.assertEqual(out.stdout, "")


def main():
    def setup(args, pb, pb_grpc):
        global ARGS, PB, PB_GRPC
        ARGS, PB, PB_GRPC = args, pb, pb_grpc

    return run_unittests(__doc__, setup)


if __name__ == "__main__":
    sys.exit(main())
