#!/usr/bin/env python3
"""The README's examples, run as the README writes them, on the default model.

Reads README.md and runs: every `build/server/kvserve generate ...` line
(with the built binary), the gRPC Python client snippet (its protoc line
and its heredoc, pointed at a daemon on free ports), and the four OpenAI
`curl` calls (their route and JSON body, sent with urllib; the structured
output one's answer must validate against its schema, the tool-calling
one's must be a call with the arguments shown). Each is greedy;
its output must contain what the README promises for that prompt (EXPECTED
below). A README example whose prompt has no entry here fails: add what the
model answers, checked against llama.cpp on the same GGUF if in doubt.

    readme_examples_test.py --binary build/server/kvserve --source-dir .
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, run_unittests  # noqa: E402

ARGS = None

# Prompt -> text its greedy answer must contain (the README shows it).
EXPECTED = {
    "The capital of France is": " Paris",
    "What is 2+2?": "is 4",
    "What color is the sky?": "blue",
    "What is the capital of France? Answer in JSON.": '"capital": "Paris"',
    "What is the weather like in Paris today?": '"city":"Paris"',
}


def readme():
    with open(os.path.join(ARGS.source_dir, "README.md"),
              encoding="utf-8") as f:
        return f.read()


def expected_for(test, prompt):
    test.assertIn(prompt, EXPECTED,
                  f"README example prompt {prompt!r}: add its expected "
                  "answer to EXPECTED in this test")
    return EXPECTED[prompt]


class ReadmeExamples(unittest.TestCase):
    server = None

    @classmethod
    def setUpClass(cls):
        cls.text = readme()
        cls.server = KvserveProcess(ARGS.binary, ARGS.source_dir)

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()

    def test_generate_lines(self):
        lines = re.findall(r"^    build/server/kvserve generate (.+)$",
                           self.text, re.M)
        self.assertGreaterEqual(len(lines), 2, "README lost its examples")
        for line in lines:
            argv = shlex.split(line)
            self.assertIn("--temperature", argv, f"not greedy: {line}")
            prompt = argv[argv.index("--prompt") + 1]
            want = expected_for(self, prompt)
            out = subprocess.run([ARGS.binary, "generate", *argv],
                                 cwd=ARGS.source_dir, capture_output=True,
                                 text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn(want, out.stdout, f"{line}\nprinted {out.stdout!r}")

    def test_grpc_python_snippet(self):
        protoc = re.search(r"^    (python3 -m grpc_tools\.protoc .+)$",
                           self.text, re.M)
        body = re.search(r"^    python3 - <<'PY'\n(.*?)^    PY$", self.text,
                         re.M | re.S)
        self.assertIsNotNone(protoc, "README lost its protoc line")
        self.assertIsNotNone(body, "README lost its Python snippet")
        code = "\n".join(line[4:] for line in body.group(1).splitlines())
        self.assertIn("localhost:50051", code)
        code = code.replace("localhost:50051",
                            f"127.0.0.1:{self.server.grpc_port}")
        prompt = re.search(r'content="([^"]+)"', code).group(1)
        want = expected_for(self, prompt)
        with tempfile.TemporaryDirectory() as out:
            # As from the checkout: its proto/ beside the generated code.
            os.symlink(os.path.abspath(os.path.join(ARGS.source_dir, "proto")),
                       os.path.join(out, "proto"))
            argv = shlex.split(protoc.group(1))
            argv[0] = sys.executable
            gen = subprocess.run(argv, cwd=out, capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(gen.returncode, 0, gen.stderr)
            run = subprocess.run([sys.executable, "-"], input=code, cwd=out,
                                 capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(want, run.stdout)
        self.assertIn("completion_tokens", run.stdout)  # usage printed

    def test_openai_curl_calls(self):
        calls = re.findall(
            r"^    curl (?:-N )?localhost:9090(/v1/\S+) .*?\\\n\s+-d '(.+)'$",
            self.text, re.M)
        self.assertEqual(len(calls), 4, "README's OpenAI curl examples")
        for route, body in calls:
            req = json.loads(body)
            self.assertEqual(req.get("temperature"), 0, f"not greedy: {body}")
            prompt = (req["prompt"] if "prompt" in req
                      else req["messages"][-1]["content"])
            want = expected_for(self, prompt)
            http = urllib.request.Request(
                f"http://127.0.0.1:{self.server.http_port}{route}",
                data=body.encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(http, timeout=120) as resp:
                raw = resp.read().decode()
            if req.get("stream"):
                self.assertTrue(raw.rstrip().endswith("data: [DONE]"), raw)
                text = ""
                for line in raw.splitlines():
                    if line.startswith("data: {"):
                        choice = json.loads(line[6:])["choices"]
                        if choice:
                            text += choice[0].get("delta", {}).get(
                                "content") or ""
            else:
                choice = json.loads(raw)["choices"][0]
                text = (choice["message"]["content"] if "message" in choice
                        else choice["text"])
            if req.get("tools"):  # the tool-calling example: its calls
                self.assertEqual(choice["finish_reason"], "tool_calls", raw)
                text = "".join(c["function"]["arguments"]
                               for c in choice["message"]["tool_calls"])
            self.assertIn(want, text, f"{route} {body}")
            fmt = req.get("response_format")
            if fmt:  # the structured-output example: its output validates
                import jsonschema
                jsonschema.validate(json.loads(text),
                                    fmt["json_schema"]["schema"])


def main():
    def setup(args, pb, pb_grpc):
        global ARGS
        ARGS = args

    return run_unittests(__doc__, setup)


if __name__ == "__main__":
    sys.exit(main())
