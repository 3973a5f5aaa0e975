#!/usr/bin/env python3
"""Browser test of the KV cache page (GET /ui, server/ui/kv.html) against the
real kvserve binary, in Debian's headless chromium driven over the Chrome
DevTools Protocol (the websocket-client package):

  - /ui answers 200 with the page file byte for byte and a
    Content-Security-Policy that allows no external resource;
  - the page polls /v1/kv/state: no active block at first; a request sent
    from its chat box (ignore_eos, 200 tokens, every engine step slowed so
    the request is seen whatever the machine's speed) shows active blocks in
    the numbers and on the canvas (window.kvDrawnActive), in the running
    table, then streams to "done", after which its blocks are cached, not
    active; a screenshot of the running request goes to
    <build dir>/test-artifacts/kv_ui.png;
  - with --auth-token-file, /ui loads without a token, the page asks for one
    when /v1/kv/state answers 401, refuses a wrong one, and polls and
    streams with the right one;
  - with --kv-disk-cache, the tiers table shows the disk tier's row and
    its stores growing as a request's blocks are written through;
  - no script error, console error or CSP violation on the page.

    kv_ui_browser_test.py --binary build/server/kvserve --source-dir .

Fails (not skips) when chromium or websocket-client is missing: both are
installed by deploy/setup.sh --test.
"""

import argparse
import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess  # noqa: E402

ARGS = None
PROMPT = ("The KV cache of a language model server holds the keys and values "
          "of every token that a running request has seen, block by block.")
STEP_DELAY_MS = 20  # 200 decode steps take at least 4 s: several polls


class Server(KvserveProcess):
    """The default model with a small KV pool (91 blocks of 16 fp16 tokens)
    and swap space, so the grid and the swap row are small."""

    def __init__(self, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "32MiB", "--kv-cache-dtype",
                         "fp16", "--max-model-len", "512",
                         "--swap-space-bytes", "8MiB", *extra)

    def get(self, path, token=None):
        """(status, headers, body bytes) of a plain GET."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port,
                                          timeout=30)
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()


class Browser:
    """Headless chromium on a fresh profile, and a DevTools Protocol session
    with its first page. Console errors, script exceptions and CSP
    violations of the page are collected in `errors`."""

    def __init__(self, timeout=30):
        self.profile = tempfile.mkdtemp(prefix="kv_ui_chromium_")
        cmd = [shutil.which("chromium"), "--headless=new", "--no-sandbox",
               "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
               "--no-first-run", "--no-default-browser-check",
               "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-extensions", "--window-size=1280,1100",
               "about:blank"]
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.ws = None
        self.next_id = 0
        self.errors = []
        try:
            self._connect(timeout)
        except Exception:
            self.close()
            raise

    def _connect(self, timeout):
        import websocket
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + timeout
        port = None
        while port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("chromium exited with "
                                   f"{self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError("chromium wrote no DevToolsActivePort in "
                                   f"{timeout} s:\n{self.output()}")
            try:
                with open(port_file, encoding="ascii") as f:
                    port = int(f.readline().strip())
            except (OSError, ValueError):
                time.sleep(0.1)  # poll interval for the file to appear
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                    timeout=10) as resp:
            targets = json.loads(resp.read())
        page = next(t for t in targets if t["type"] == "page")
        # No Origin header: chromium accepts DevTools clients without one.
        self.ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=10, suppress_origin=True)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    def output(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def _event(self, msg):
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled" and p["type"] == "error":
            self.errors.append("console.error: " + " ".join(
                str(a.get("value", a.get("description", "")))
                for a in p["args"]))
        elif method == "Log.entryAdded":
            e = p["entry"]
            # A 401 or a failed fetch is logged by the network layer: the
            # page handles those itself.
            if e["level"] == "error" and e["source"] != "network":
                self.errors.append(f"{e['source']}: {e['text']}")

    def call(self, method, params=None, timeout=30):
        """Sends one DevTools command and returns its result."""
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method,
                                 "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{method}: no answer in {timeout} s")
            self.ws.settimeout(left)
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def js(self, expression):
        """The value of a JavaScript expression in the page."""
        r = self.call("Runtime.evaluate", {"expression": expression,
                                           "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression, timeout, what):
        """Re-evaluates until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not within {timeout} s; page: "
                    f"{self.js(STATE_JS)}; errors: {self.errors}")
            time.sleep(0.1)  # poll interval, not synchronization

    def navigate(self, url):
        self.call("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete' && "
                  f"location.href === {json.dumps(url)}", 30, f"load {url}")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        if self.ws is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


# What the page shows, for assertion messages.
STATE_JS = """JSON.stringify({
  polls: document.getElementById('poll-count').textContent,
  active: document.getElementById('active-blocks').textContent,
  cached: document.getElementById('cached-blocks').textContent,
  drawn: window.kvDrawnActive,
  conn: document.getElementById('conn').textContent,
  auth: !document.getElementById('auth-bar').hidden,
  chat: document.getElementById('chat-status').textContent})"""


def text_of(element_id):
    return f"document.getElementById({json.dumps(element_id)}).textContent"


def int_of(element_id):
    return f"parseInt({text_of(element_id)}, 10)"


def send_js(prompt, max_tokens, ignore_eos=True):
    """Fills the chat box and clicks Send."""
    return f"""(() => {{
      document.getElementById('chat-input').value = {json.dumps(prompt)};
      document.getElementById('chat-max-tokens').value = '{max_tokens}';
      document.getElementById('chat-ignore-eos').checked = {
          'true' if ignore_eos else 'false'};
      document.getElementById('chat-send').click();
      return true;
    }})()"""


def artifacts_dir():
    """<build dir>/test-artifacts: the build dir is the one the binary
    lies in (build/server/kvserve -> build/)."""
    binary = os.path.abspath(ARGS.binary)
    return os.path.join(os.path.dirname(os.path.dirname(binary)),
                        "test-artifacts")


class KvUiBrowserTest(unittest.TestCase):
    def setUp(self):
        self.server = None
        self.browser = None
        self.tmp = tempfile.mkdtemp(prefix="kv_ui_test_")

    def tearDown(self):
        if self.browser is not None:
            self.browser.close()
        if self.server is not None:
            self.server.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, *extra):
        self.server = Server(*extra)
        self.browser = Browser()
        return f"http://127.0.0.1:{self.server.http_port}/ui"

    def check_ui_route(self, token=None):
        status, headers, body = self.server.get("/ui")
        self.assertEqual(status, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/html"),
                        headers["Content-Type"])
        # No directive allows anything but the page's own origin, inline
        # script and style, and data: images.
        csp = headers.get("Content-Security-Policy", "")
        directives = dict((d.split()[0], d.split()[1:])
                          for d in csp.split(";") if d.strip())
        self.assertIn(directives.get("default-src"), (["'none'"], ["'self'"]),
                      csp)
        for name, sources in directives.items():
            self.assertLessEqual(
                set(sources), {"'self'", "'none'", "'unsafe-inline'", "data:"},
                f"{name} in {csp}")
        path = os.path.join(ARGS.source_dir, "server", "ui", "kv.html")
        with open(path, "rb") as f:
            self.assertEqual(body, f.read(), "/ui is not server/ui/kv.html")
        status, _, _ = self.server.get("/v1/kv/state", token=token)
        self.assertEqual(status, 200)

    def test_request_blocks_appear_then_turn_cached(self):
        url = self.start("--fault-step-delay-ms", str(STEP_DELAY_MS))
        self.check_ui_route()
        b = self.browser
        b.navigate(url)
        b.wait(f"{int_of('poll-count')} >= 1", 15, "first poll")
        self.assertEqual(b.js(int_of("active-blocks")), 0)
        self.assertEqual(b.js("window.kvDrawnActive"), 0)
        self.assertEqual(b.js(text_of("kv-dtype")), "fp16")
        self.assertEqual(b.js(text_of("block-size")), "16")
        # No tiers configured: no tiers table.
        self.assertTrue(b.js("document.getElementById('tiers-section')"
                             ".hidden"))

        b.js(send_js(PROMPT, 200))
        # One evaluation reads the numbers and the frame of the same poll.
        seen = json.loads(b.wait(f"""(() => {{
          const active = {int_of('active-blocks')};
          const rows = document.getElementById('running').rows.length;
          return active > 0 && window.kvDrawnActive > 0 && rows > 0 &&
              JSON.stringify({{active, drawn: window.kvDrawnActive, rows}});
        }})()""", 30, "active blocks on the page"))
        self.assertEqual(seen["drawn"], seen["active"])
        # Prompt (~30 tokens) and up to 200 outputs: at most 15 blocks.
        self.assertLessEqual(seen["active"], 15)
        b.screenshot(os.path.join(artifacts_dir(), "kv_ui.png"))

        b.wait(f"['done', 'error'].includes({text_of('chat-status')}"
               ".split(':')[0])", 120, "the stream's end")
        self.assertEqual(b.js(text_of("chat-status")), "done")
        self.assertTrue(b.js(text_of("chat-output")))
        # The finished request's blocks stay in the prefix cache.
        b.wait(f"{int_of('active-blocks')} === 0 && "
               f"window.kvDrawnActive === 0 && {int_of('cached-blocks')} > 0",
               15, "blocks cached after the request")
        b.wait(f"{text_of('timeline')}.includes('finished 1 request')", 10,
               "the finished request in the timeline")
        self.assertEqual(b.errors, [])

    def test_the_disk_tier_shows_its_stores(self):
        disk = os.path.join(self.tmp, "kv")
        url = self.start("--kv-disk-cache", disk)
        b = self.browser
        b.navigate(url)
        b.wait(f"{int_of('poll-count')} >= 1", 15, "first poll")
        self.assertFalse(b.js("document.getElementById('tiers-section')"
                              ".hidden"))
        b.js(send_js(PROMPT * 3, 40))
        # The prompt's full blocks are written through: the row counts them.
        row = json.loads(b.wait("""(() => {
          const tr = document.querySelector('#tiers tr[data-tier=disk]');
          if (!tr) return false;
          const cells = [...tr.cells].map((c) => c.textContent);
          return Number(cells[7]) > 0 && JSON.stringify(cells);
        })()""", 30, "stores in the tiers table"))
        self.assertEqual(row[0], "disk")
        self.assertEqual(row[1], "yes")
        self.assertGreater(int(row[2]), 0)  # blocks
        self.assertIn(disk, b.js(text_of("tiers-note")))
        self.assertEqual(b.errors, [])

    def test_token_is_asked_for_on_401(self):
        token = "kv-ui-test-token-1234567890"
        path = os.path.join(self.tmp, "tokens.txt")
        with open(path, "w", encoding="ascii") as f:
            f.write(token + "\n")
        url = self.start("--auth-token-file", path)
        # The page needs no token; its data does.
        self.assertEqual(self.server.get("/v1/kv/state")[0], 401)
        self.check_ui_route(token=token)
        b = self.browser
        b.navigate(url)
        show = "!document.getElementById('auth-bar').hidden"
        b.wait(show, 15, "the token input after a 401")
        self.assertEqual(b.js(int_of("poll-count")), 0)

        enter = """(t => {
          document.getElementById('auth-token').value = t;
          document.getElementById('auth-save').click();
          return true;
        })"""
        b.js(f"{enter}('wrong-token')")
        b.wait(f"{show} && {text_of('auth-msg')}.includes('refused')", 15,
               "a wrong token refused")
        self.assertEqual(b.js(int_of("poll-count")), 0)

        b.js(f"{enter}({json.dumps(token)})")
        b.wait(f"{int_of('poll-count')} >= 2", 15, "polls with the token")
        self.assertFalse(b.js(show))
        self.assertEqual(b.js("sessionStorage.getItem('kvserve.token')"),
                         token)
        b.js(send_js("Paris is", 4))
        b.wait(f"{text_of('chat-status')} === 'done'", 60,
               "a streamed completion with the token")
        self.assertEqual(b.errors, [])


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    if shutil.which("chromium") is None:
        print("FAIL: chromium is not on PATH (deploy/setup.sh --test "
              "installs Debian's chromium)")
        return 1
    try:
        import websocket  # noqa: F401
    except ImportError as e:
        print(f"FAIL: {e} (deploy/setup.sh installs websocket-client from "
              "requirements.txt)")
        return 1
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
