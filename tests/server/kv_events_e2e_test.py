#!/usr/bin/env python3
"""End-to-end tests of the KV cache events (--kv-events-endpoint) through
the real kvserve binary, decoded as llm-d decodes them (llmd_kv_index.py,
written from llm-d's source): after a workload with evictions,
preemptions, forks (n=2), 1% of the messages dropped on purpose (resynced
through the replay socket) and a restart, the index rebuilt from the
stream equals the daemon's residency (GET /v1/kv/blocks) block for block,
and the router's keys of a resident prompt's token ids find the pod;
salted blocks are never announced, private-scope ones only on request
(under the tenant's LoRA name), a shared scope's always; the disk tier's
blocks are announced as STORAGE and match its files; CURVE keeps plain
subscribers out; the endpoint picker's protocol metrics (vllm:*) parse as
a scraper reads them; bad flags are refused.

    kv_events_e2e_test.py --binary build/server/kvserve --source-dir .

Cost: about 25-45 s (seven daemon starts of the default model, ~150
requests).
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             free_port, metric_sum, run_unittests,
                             token_ids)

ARGS = None
BLOCK = 16
POD = "10.0.0.7:8000"
MODEL = "smollm2"
TOPIC = f"kv@{POD}@{MODEL}"



class Server(KvserveProcess):
    def __init__(self, pub, replay, *extra, pool="24MiB"):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", pool, "--max-model-len", "1024",
                         "--max-num-seqs", "16", "--kv-events-endpoint", pub,
                         "--kv-events-replay-endpoint", replay,
                         "--kv-events-topic", TOPIC,
                         "--kv-events-heartbeat-ms", "100", *extra)

    def post(self, path, body, token=None):
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.loads(resp.read())

    def complete(self, ids, max_tokens=8, n=1, token=None, **extra):
        return self.post("/v1/completions",
                         {"prompt": ids, "max_tokens": max_tokens, "n": n,
                          "temperature": 0.7 if n > 1 else 0,
                          "ignore_eos": True, **extra}, token)

    def blocks(self, token=None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/kv/blocks",
            headers=headers)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())


def endpoints():
    """A free loopback endpoint for the events and one for replays."""
    return (f"tcp://127.0.0.1:{free_port()}",
            f"tcp://127.0.0.1:{free_port()}")


def token_file(tmp, *lines):
    """An --auth-token-file of `lines` under `tmp` (mode 0600)."""
    path = os.path.join(tmp, "tokens")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    os.chmod(path, 0o600)
    return path


def disk_hashes(disk):
    """Wire hashes (low 64 bits of the key) of the block files under
    `disk`: <key hex>.<scope tag>.<salt tag>.kvb (kvtier/block_key.h)."""
    out = set()
    for _, _, files in os.walk(disk):
        for f in files:
            if f.endswith(".kvb"):
                out.add(int(f.split(".")[0][-16:], 16))
    return out


def import_index():
    import llmd_kv_index
    return llmd_kv_index


class Follower:
    """A subscriber thread keeping an llm-d index of the stream."""

    def __init__(self, endpoint, replay, drop_rate=0.0, curve=None,
                 bind=True):
        m = import_index()
        self.index = m.KvIndex(BLOCK)
        rng = random.Random(7)
        drop = (lambda: rng.random() < drop_rate) if drop_rate else None
        self.sub = m.Subscriber(self.index, endpoint, replay, bind=bind,
                                drop=drop, curve=curve)
        self.lock = threading.Lock()
        self.stop = False
        self.errors = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                with self.lock:
                    self.sub.poll(0)
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(repr(e))
            time.sleep(0.002)

    def heartbeats(self):
        with self.lock:
            return self.sub.heartbeats

    def settle(self, timeout=20):
        """Until two heartbeats arrived after now: every batch queued
        before has been applied (one publisher thread sends in order)."""
        start = self.heartbeats()
        deadline = time.monotonic() + timeout
        while self.heartbeats() < start + 2:
            if time.monotonic() > deadline:
                raise TimeoutError("no heartbeat from the daemon")
            time.sleep(0.02)

    def close(self):
        self.stop = True
        self.thread.join(timeout=10)
        self.sub.close()


class KvEventsTest(unittest.TestCase):
    def check_residency(self, server, follower, token=None):
        dump = server.blocks(token)
        follower.settle()
        self.assertEqual(dump["block_size"], BLOCK)
        resident = {int(h) for h in dump["hashes"]}
        with follower.lock:
            known = follower.index.engine_hashes(POD)
        missing, extra = resident - known, known - resident
        agree = len(resident & known) / max(len(resident | known), 1)
        self.assertGreaterEqual(agree, 0.999, (len(missing), len(extra)))
        self.assertEqual(follower.errors, [])
        return resident, agree

    def test_index_follows_residency_through_drops_and_a_restart(self):
        endpoint, replay_ep = endpoints()
        # The follower binds (llm-d's endpoint picker); the daemon connects.
        follower = Follower(endpoint, replay_ep, drop_rate=0.01)
        try:
            server = Server(endpoint, replay_ep)
            try:
                system = token_ids(40, 160)  # 10 shared blocks
                prompts = [system + token_ids(1000 + i, 40 + 7 * (i % 9))
                           for i in range(120)]

                def send(i):
                    n = 2 if i % 10 == 3 else 1  # forks
                    return server.complete(prompts[i], max_tokens=12, n=n)
                threads = []
                for i in range(len(prompts)):
                    t = threading.Thread(target=send, args=(i,))
                    t.start()
                    threads.append(t)
                    if len(threads) >= 12:
                        threads.pop(0).join()
                for t in threads:
                    t.join()
                # Ten long generations at once outgrow the pool (128
                # blocks): preemptions while blocks are being announced.
                long_ones = [token_ids(3000 + i, 64) for i in range(10)]
                threads = [threading.Thread(
                    target=server.complete, args=(ids,),
                    kwargs={"max_tokens": 200}) for ids in long_ones]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                # A salted prompt is never announced.
                salted = token_ids(77, 200)
                server.complete(salted, max_tokens=2, cache_salt="s1")
                last = prompts[-1]
                server.complete(last, max_tokens=2)
                m = server.metrics()
                resident, agree = self.check_residency(server, follower)
                self.assertGreater(len(resident), 20)
                with follower.lock:
                    idx, sub = follower.index, follower.sub
                    # The router's keys of the last prompt's ids find the
                    # pod for every full block of it.
                    self.assertEqual(idx.hits(POD, MODEL, last),
                                     len(last) // BLOCK)
                    self.assertEqual(idx.hits(POD, MODEL, salted), 0)
                    self.assertGreater(sub.dropped, 0)
                    self.assertGreater(sub.replays, 0)
                    self.assertEqual(sub.restarts, 0)
                    self.assertEqual(idx.dropped_events, 0)
                self.assertGreater(
                    counter(m, "kvserve_kv_events_removed_blocks_total"), 0,
                    "the workload evicted announced blocks")
                self.assertGreater(metric_sum(m, "kvserve_preemptions_total"),
                                   0, "the workload preempted")
                self.assertGreater(
                    counter(m, "kvserve_kv_events_unannounced_blocks_total"),
                    0)
                self.assertGreater(
                    counter(m, "kvserve_kv_events_replays_total"), 0)
                self.assertEqual(
                    counter(m, "kvserve_kv_events_dropped_batches_total"), 0)
            finally:
                server.terminate()
            # A restarted daemon starts at sequence 0 with AllBlocksCleared:
            # the pod's entries go, then its new blocks come.
            server = Server(endpoint, replay_ep)
            try:
                server.complete(prompts[0], max_tokens=4)
                resident, _ = self.check_residency(server, follower)
                with follower.lock:
                    self.assertGreaterEqual(follower.sub.restarts, 1)
                    self.assertEqual(
                        follower.index.hits(POD, MODEL, prompts[5]),
                        len(system) // BLOCK, "only the shared prefix")
                self.assertEqual(len(resident), len(prompts[0]) // BLOCK)
            finally:
                server.terminate()
        finally:
            follower.close()

    def test_a_replay_past_the_batch_in_hand_is_no_restart(self):
        # The publisher answers a replay up to its newest batch, which
        # may be past the one whose gap asked for it: the subscriber
        # applies [gap, batch in hand) and leaves the rest to the SUB
        # socket, else the batch in hand looks older than the last one
        # applied and the pod's entries are cleared as if it restarted.
        import struct
        import zmq
        m = import_index()
        endpoint, replay_ep = endpoints()
        ctx = zmq.Context()
        pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        pub.bind(endpoint)
        router.bind(replay_ep)
        sub = m.Subscriber(m.KvIndex(BLOCK), endpoint, replay_ep,
                           bind=False)
        topic = f"kv@{POD}@{MODEL}".encode()

        def batch(seq, t=topic):
            # [ts, [], dp_rank 0]: a heartbeat, 12 bytes.
            return [t, seq.to_bytes(8, "big"),
                    b"\x93\xcb" + struct.pack(">d", time.time()) +
                    b"\x90\x00"]

        def answer():
            frames = router.recv_multipart()
            ident, start = frames[0], int.from_bytes(frames[-1], "big")
            for seq in range(start, 6):  # newest is 5 by now
                router.send_multipart([ident, b""] + batch(seq))
            router.send_multipart([ident, b"", topic, m.Subscriber.END_SEQ,
                                   b""])
        try:
            # Until the SUB socket's subscription has reached PUB (a PUB
            # drops what nobody subscribed to yet): another pod's heartbeat
            # until one arrives, then the rest of them drained.
            deadline = time.monotonic() + 20
            while not sub.poll(100):
                self.assertLess(time.monotonic(), deadline, "no subscription")
                pub.send_multipart(batch(0, b"kv@warm-up@" + MODEL.encode()))
            while sub.poll(300):
                pass
            for seq in (0, 1, 3):  # 2 is lost on the way
                pub.send_multipart(batch(seq))
            server = threading.Thread(target=answer)
            server.start()
            for _ in range(3):
                self.assertTrue(sub.poll(5000))
            server.join()
            self.assertEqual(sub.replays, 1)
            self.assertEqual(sub.replayed, 1)  # 2 alone
            self.assertEqual(sub.restarts, 0)
            self.assertEqual(sub.last[POD], 3)
        finally:
            pub.close(linger=0)
            router.close(linger=0)
            ctx.term()
            sub.close()

    def test_scopes_private_shared_and_admin_only_dump(self):
        with tempfile.TemporaryDirectory() as tmp:
            tokens = token_file(tmp, "tok-alice tenant=alice",
                                "tok-carol tenant=carol cache_scope=team",
                                "tok-dave tenant=dave cache_scope=team",
                                "tok-ops tenant=ops admin")
            endpoint, replay_ep = endpoints()
            follower = Follower(endpoint, replay_ep)
            server = Server(endpoint, replay_ep, "--auth-token-file", tokens)
            try:
                private = token_ids(5, 100)
                shared = token_ids(6, 100)
                server.complete(private, max_tokens=2, token="tok-alice")
                server.complete(shared, max_tokens=2, token="tok-carol")
                with self.assertRaises(urllib.error.HTTPError) as e:
                    server.blocks("tok-alice")
                self.assertEqual(e.exception.code, 403)
                resident, _ = self.check_residency(server, follower,
                                                   "tok-ops")
                self.assertEqual(len(resident), len(shared) // BLOCK)
                with follower.lock:
                    idx = follower.index
                    self.assertEqual(idx.hits(POD, MODEL, private), 0)
                    self.assertEqual(idx.hits(POD, MODEL, shared),
                                     len(shared) // BLOCK)
                self.assertGreaterEqual(
                    server.blocks("tok-ops")["unannounced_blocks"],
                    len(private) // BLOCK)
            finally:
                server.terminate()
                follower.close()

    def test_private_scopes_opt_in_under_the_tenants_lora_name(self):
        """--kv-events-private-scopes: a private scope's blocks are keyed
        under "<model>@<scope>", so a router matches them only for requests
        it attributes to that tenant; salted blocks stay unannounced."""
        with tempfile.TemporaryDirectory() as tmp:
            tokens = token_file(tmp, "tok-alice tenant=alice",
                                "tok-ops tenant=ops admin")
            endpoint, replay_ep = endpoints()
            follower = Follower(endpoint, replay_ep)
            server = Server(endpoint, replay_ep, "--auth-token-file", tokens,
                            "--kv-events-private-scopes")
            try:
                private = token_ids(15, 100)
                salted = token_ids(16, 100)
                server.complete(private, max_tokens=2, token="tok-alice")
                server.complete(salted, max_tokens=2, token="tok-alice",
                                cache_salt="s1")
                resident, _ = self.check_residency(server, follower,
                                                   "tok-ops")
                self.assertEqual(len(resident), len(private) // BLOCK)
                with follower.lock:
                    idx = follower.index
                    self.assertEqual(idx.hits(POD, MODEL, private), 0)
                    self.assertEqual(
                        idx.hits(POD, f"{MODEL}@tenant:alice", private),
                        len(private) // BLOCK)
                    self.assertEqual(
                        idx.hits(POD, f"{MODEL}@tenant:alice", salted), 0)
            finally:
                server.terminate()
                follower.close()

    def test_disk_tier_blocks_are_announced_as_storage(self):
        """--kv-disk-cache: what the tier writes is announced with medium
        STORAGE, what it evicts is removed; the index's STORAGE entries
        equal the block files on disk (their names carry the keys)."""
        with tempfile.TemporaryDirectory() as tmp:
            disk = os.path.join(tmp, "kv")
            endpoint, replay_ep = endpoints()
            follower = Follower(endpoint, replay_ep)
            # Room for about 14 blocks: the later prompts evict the first's.
            server = Server(endpoint, replay_ep, "--kv-disk-cache", disk,
                            "--kv-disk-cache-bytes", "3MiB")
            try:
                prompts = [token_ids(60 + i, 100) for i in range(4)]
                for i, ids in enumerate(prompts):
                    server.complete(ids, max_tokens=2)
                    stored = server.wait_metrics(lambda m: counter(
                        m, "kvserve_kv_tier_stores_total",
                        tier="disk") >= 6 * (i + 1))
                    self.assertGreaterEqual(counter(
                        stored, "kvserve_kv_tier_stores_total", tier="disk"),
                        6 * (i + 1))
                    follower.settle()
                    with follower.lock:
                        announced = follower.index.engine_hashes(POD,
                                                                 "storage")
                    self.assertEqual(announced, disk_hashes(disk))
                m = server.metrics()
                self.assertGreater(
                    counter(m, "kvserve_kv_tier_evictions_total", tier="disk"),
                    0)
                with follower.lock:
                    idx = follower.index
                    # The last prompt is whole on disk and in the pool.
                    self.assertEqual(idx.hits(POD, MODEL, prompts[-1],
                                              tier="storage"), 6)
                    self.assertEqual(idx.hits(POD, MODEL, prompts[0],
                                              tier="storage"), 0)
                    self.assertEqual(idx.hits(POD, MODEL, prompts[0],
                                              tier="gpu"), 6)
                self.assertEqual(follower.errors, [])
            finally:
                server.terminate()
                follower.close()

    def test_curve_keeps_plain_subscribers_out(self):
        import zmq
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        with tempfile.TemporaryDirectory() as tmp:
            key = os.path.join(tmp, "curve.key")
            with open(key, "wb") as f:
                f.write(server_secret + b"\n")
            pub, replay = free_port(), free_port()
            # Bound by the daemon (a wildcard host), subscribers connect.
            server = Server(f"tcp://*:{pub}", f"tcp://127.0.0.1:{replay}",
                            "--kv-events-curve-secret-key-file", key)
            endpoint = f"tcp://127.0.0.1:{pub}"
            plain = Follower(endpoint, None, bind=False)
            secure = Follower(endpoint, None, bind=False,
                              curve=(client_public, client_secret,
                                     server_public))
            try:
                server.complete(token_ids(8, 64), max_tokens=2)
                secure.settle()
                self.assertEqual(plain.heartbeats(), 0)
                with secure.lock:
                    self.assertEqual(
                        secure.index.hits(POD, MODEL, token_ids(8, 64)), 4)
            finally:
                plain.close()
                secure.close()
                server.terminate()

    def test_gie_protocol_metrics_parse_as_a_scraper_reads_them(self):
        """GIE's model-server protocol (docs/proposals/003-model-server-
        protocol): names, types and labels, parsed by prometheus_client."""
        from prometheus_client.parser import text_string_to_metric_families
        server = Server(*endpoints())
        try:
            server.complete(token_ids(9, 40), max_tokens=2)
            # The reply is sent inside the step that finishes the request;
            # the gauges follow when that step ends: scrape until they do.
            url = f"http://127.0.0.1:{server.http_port}/metrics"
            deadline = time.monotonic() + 10
            while True:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    text = resp.read().decode()
                families = {f.name: f
                            for f in text_string_to_metric_families(text)}
                running = families.get("vllm:num_requests_running")
                if (running and running.samples[0].value == 0) or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.05)  # poll interval, not synchronization
        finally:
            server.terminate()
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                     "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                     "vllm:cache_config_info"):
            self.assertIn(name, families)
            self.assertEqual(families[name].type, "gauge", name)
        value = {n: families[n].samples[0].value for n in families}
        self.assertEqual(value["vllm:num_requests_running"], 0)
        self.assertEqual(value["vllm:num_requests_waiting"], 0)
        self.assertTrue(0 <= value["vllm:kv_cache_usage_perc"] <= 1)
        self.assertEqual(value["vllm:gpu_cache_usage_perc"],
                         value["vllm:kv_cache_usage_perc"])
        self.assertEqual(value["vllm:kv_cache_usage_perc"],
                         value["kvserve_kv_cache_usage_ratio"])
        info = families["vllm:cache_config_info"].samples[0]
        self.assertEqual(info.value, 1)
        self.assertEqual(info.labels["block_size"], str(BLOCK))
        blocks = families["kvserve_kv_blocks_capacity"].samples[0].value
        self.assertEqual(info.labels["num_gpu_blocks"], str(int(blocks)))

    def test_bad_flags_are_refused(self):
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        cases = [
            (["--kv-events-endpoint", "http://x:1"], "--kv-events-endpoint"),
            (["--kv-events-topic", "kv@a@b"], "--kv-events-topic"),
            (["--kv-events-private-scopes"], "--kv-events-private-scopes"),
            (["--kv-events-endpoint", "tcp://*:1",
              "--kv-events-curve-secret-key-file", "/nonexistent"],
             "--kv-events-curve-secret-key-file"),
        ]
        for flags, named in cases:
            r = subprocess.run([ARGS.binary, "--model", model, "--port", "0",
                                "--metrics-port", "0", *flags],
                               capture_output=True, text=True, timeout=60)
            self.assertNotEqual(r.returncode, 0, flags)
            self.assertIn(named, r.stderr + r.stdout, flags)


def setup(args, pb, pb_grpc):
    global ARGS
    ARGS = args


def skip_reason(_):
    try:
        import cbor2  # noqa: F401
        import msgpack  # noqa: F401
        import prometheus_client  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as e:
        return (f"{e} (deploy/setup.sh installs pyzmq, msgpack, cbor2, "
                "prometheus-client)")
    return None


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup, skip_reason))
