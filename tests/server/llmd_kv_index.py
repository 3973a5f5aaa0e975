"""A stand-in for llm-d's KV cache indexer (Go, which cannot be built
here), written from its source, for kvserve's KV event tests and the routing
benchmark. It decodes and applies a vLLM-format KV event stream as llm-d
does; where llm-d has options, the defaults (cbor-fnv keys, hash seed "").

Followed (repository@commit:path, read through the public code index):
  llm-d/llm-d-router@0854a27dfafc990cc41b6c627ee681a089c0685c:
      pkg/kvevents/engineadapter/vllm_adapter.go   event shapes, positions
  llm-d/llm-d-router@1c5d5987396a32fab6b40cf05b84224183842504:
      pkg/kvevents/engineadapter/vllm_msgpack.go   the batch: an array
  llm-d/llm-d-router@8f74b6eb60613c6e0ad0c7a4eb329f2f0 (common.go)
      topic "kv@<pod>@<model>", hashes as uint64
  llm-d/llm-d-router@0557f29683fa67cf493aa5a4bf29f915809ff92c:
      pkg/kvevents/pool.go                         how events apply
  llm-d/llm-d-router@baa620904af75a05104ef520aa6e8122cb719f89:
      pkg/kvcache/kvblock/token_processor.go       block keys

The rules it keeps:
  - a batch is a msgpack array of at least 3: [ts (float), events, rank];
    an event is an array with its tag first, or a map with "type"; an
    unknown tag or a malformed event fails the whole batch;
  - BlockStored: the tier is lower(medium) or "gpu"; the model is
    lora_name or the topic's; the parent engine hash (nil or 0: the root)
    must map to a request key seen before, else the event is dropped;
    request keys are llm-d's own, FNV-64a over canonical CBOR of
    [parent key, block tokens, extra], chained from a root that hashes the
    seed and the model name; engine keys map 1:1 to them here (equal block
    sizes);
  - BlockRemoved evicts each engine hash's entry for that pod and tier; the
    engine hash's mapping goes with the key's last entry (llm-d-kv-cache
    pkg/kvcache/kvblock/in_memory.go: one map of engine to request keys,
    entries per (pod, tier)); AllBlocksCleared clears the pod;
  - sequence numbers: a repeat is dropped, a lower one is a publisher
    restart (the pod is cleared first), a gap asks the replay socket for
    the missing batches.
"""

import functools

import cbor2
import msgpack

FNV_OFFSET = 0xcbf29ce484222325
FNV_PRIME = 0x100000001b3
MASK = (1 << 64) - 1


def fnv64a(data):
    h = FNV_OFFSET
    for b in data:
        h ^= b
        h = (h * FNV_PRIME) & MASK
    return h


@functools.lru_cache(maxsize=1 << 16)
def _hash_plain(parent, tokens):
    # Memoized: shared prefixes hash the same blocks again and again, and
    # FNV in Python costs ~50 us a block (llm-d's Go does not need this).
    return fnv64a(cbor2.dumps([parent, list(tokens), None], canonical=True))


class TokenProcessor:
    """llm-d's TokensToKVBlockKeys (cbor-fnv)."""

    def __init__(self, block_size, hash_seed=""):
        self.block_size = block_size
        self.init_hash = fnv64a(hash_seed.encode())

    @staticmethod
    def hash(parent, tokens, extra):
        if extra is None:
            return _hash_plain(parent, tuple(tokens))
        return fnv64a(cbor2.dumps([parent, tokens, extra], canonical=True))

    def root(self, model):
        return self.hash(self.init_hash, None, model)

    def keys(self, parent, tokens, model):
        """Keys of the full blocks of `tokens` after `parent` (None: the
        model's root); a trailing partial block has none."""
        prev = self.root(model) if parent is None else parent
        out = []
        for i in range(len(tokens) // self.block_size):
            chunk = list(tokens[i * self.block_size:(i + 1) * self.block_size])
            prev = self.hash(prev, chunk, None)
            out.append(prev)
        return out


class DecodeError(Exception):
    pass


STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids",
                 "block_size", "lora_id", "medium", "lora_name")


def _fields(event):
    if isinstance(event, list):
        if not event or not isinstance(event[0], str):
            raise DecodeError(f"event without a tag: {event!r:.80}")
        return event
    if isinstance(event, dict):
        tag = event.get("type")
        if tag == "BlockStored":
            for k in ("block_hashes", "token_ids", "block_size"):
                if k not in event:
                    raise DecodeError(f"BlockStored without {k}")
            return [tag] + [event.get(k) for k in STORED_FIELDS]
        if tag == "BlockRemoved":
            return [tag, event.get("block_hashes"), event.get("medium")]
        if tag == "AllBlocksCleared":
            return [tag]
        raise DecodeError(f"unknown vLLM event tag {tag!r}")
    raise DecodeError(f"event is neither an array nor a map: {type(event)}")


def decode_batch(payload):
    """[(tag, fields...)] of one payload, or DecodeError."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # noqa: BLE001 - any decode failure
        raise DecodeError(str(e)) from e
    if not isinstance(batch, list) or len(batch) < 3:
        raise DecodeError(f"batch is not an array of >= 3: {batch!r:.80}")
    if not isinstance(batch[0], float):
        raise DecodeError(f"ts is not a float: {batch[0]!r}")
    if not isinstance(batch[1], list):
        raise DecodeError("events is not an array")
    events = []
    for e in batch[1]:
        f = _fields(e)
        if f[0] == "BlockStored":
            if len(f) < 5:
                raise DecodeError("BlockStored with fewer than 5 fields")
            f = list(f) + [None] * (8 - len(f))
        elif f[0] == "BlockRemoved":
            if len(f) < 2:
                raise DecodeError("BlockRemoved without hashes")
            f = list(f) + [None] * (3 - len(f))
        elif f[0] != "AllBlocksCleared":
            raise DecodeError(f"unknown vLLM event tag {f[0]!r}")
        events.append(f)
    return events


def parse_topic(topic):
    parts = topic.split("@")
    if len(parts) == 3:
        return parts[1], parts[2]
    return topic, ""


def as_hash(v):
    if isinstance(v, int):
        return v & MASK
    if isinstance(v, (bytes, bytearray)):
        if not v:
            raise DecodeError("empty hash")
        return int.from_bytes(bytes(v[-8:]).rjust(8, b"\0"), "big")
    raise DecodeError(f"hash of type {type(v)}")


class KvIndex:
    """The index of (pod, tier) entries by llm-d request key."""

    def __init__(self, block_size, hash_seed=""):
        self.tp = TokenProcessor(block_size, hash_seed)
        self.entries = {}        # request key -> {(pod, tier)}
        self.engine_to_req = {}  # engine hash -> request key
        self.dropped_events = 0  # unknown parent
        self.failed_batches = 0

    def clear_pod(self, pod):
        for key in list(self.entries):
            self.entries[key] = {e for e in self.entries[key] if e[0] != pod}
            if not self.entries[key]:
                del self.entries[key]
        self.engine_to_req = {k: v for k, v in self.engine_to_req.items()
                              if v in self.entries}

    def apply(self, topic, payload):
        pod, model = parse_topic(topic)
        try:
            events = decode_batch(payload)
        except DecodeError:
            self.failed_batches += 1
            raise
        for f in events:
            if f[0] == "AllBlocksCleared":
                self.clear_pod(pod)
            elif f[0] == "BlockRemoved":
                tier = (f[2] or "gpu").lower()
                for h in f[1]:
                    key = self.engine_to_req.get(as_hash(h))
                    if key is None:
                        continue
                    entry = self.entries.get(key, set())
                    entry.discard((pod, tier))
                    if not entry:
                        self.entries.pop(key, None)
                        self.engine_to_req.pop(as_hash(h), None)
            else:
                self._stored(pod, model, f)

    def _stored(self, pod, model, f):
        _, hashes, parent, tokens, block_size, _, medium, lora_name = f[:8]
        tier = (medium or "gpu").lower()
        model = lora_name or model
        parent_key = None
        if parent is not None and as_hash(parent) != 0:
            parent_key = self.engine_to_req.get(as_hash(parent))
            if parent_key is None:
                self.dropped_events += 1
                return
        if block_size != self.tp.block_size:
            raise DecodeError(f"engine block size {block_size} is not "
                              f"{self.tp.block_size} (1:1 mapping only)")
        keys = self.tp.keys(parent_key, tokens, model)
        if len(keys) != len(hashes):
            raise DecodeError(f"{len(hashes)} hashes for {len(keys)} blocks")
        for h, key in zip(hashes, keys):
            self.engine_to_req[as_hash(h)] = key
            self.entries.setdefault(key, set()).add((pod, tier))

    def engine_hashes(self, pod, tier="gpu"):
        """The engine hashes the index places on `pod` in `tier`."""
        return {h for h, key in self.engine_to_req.items()
                if (pod, tier) in self.entries.get(key, ())}

    def hits(self, pod, model, tokens=None, keys=None, tier=None):
        """Leading full blocks of `tokens` (or of their `keys`) the index
        places on `pod` (in `tier`, or in any)."""
        if keys is None:
            keys = self.tp.keys(None, tokens, model)
        n = 0
        for key in keys:
            if not any(e[0] == pod and (tier is None or e[1] == tier)
                       for e in self.entries.get(key, ())):
                break
            n += 1
        return n


class Subscriber:
    """A SUB socket feeding a KvIndex with llm-d's sequence rules. `bind`:
    the subscriber binds `endpoint` (llm-d's endpoint picker; the daemon
    connects), else connects to it. `drop`: a function deciding whether to
    lose a received message (tests of the replay)."""

    END_SEQ = b"\xff" * 8

    def __init__(self, index, endpoint, replay_endpoint=None, bind=True,
                 drop=None, curve=None):
        import zmq
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        if curve:
            public, secret, server_public = curve
            self.sub.curve_publickey = public
            self.sub.curve_secretkey = secret
            self.sub.curve_serverkey = server_public
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        # A list: connects to each (llm-d's pod discovery, one SUB socket
        # for every pod's bound publisher).
        for e in endpoint if isinstance(endpoint, list) else [endpoint]:
            (self.sub.bind if bind else self.sub.connect)(e)
        self.index = index
        self.replay_endpoint = replay_endpoint
        self.drop = drop
        self.last = {}  # pod -> last applied sequence
        self.dropped = self.replays = self.replayed = self.heartbeats = 0
        self.restarts = 0
        self.gaps = 0  # batches lost before this socket read them
        self.lags = []  # seconds from a batch's ts to its application

    def close(self):
        self.sub.close(linger=0)
        self.ctx.term()

    def _apply(self, pod, topic, seq, payload):
        last = self.last.get(pod)
        if last is not None and seq == last:
            return
        if last is not None and seq < last:
            self.restarts += 1
            self.index.clear_pod(pod)
        self.index.apply(topic, payload)
        # [ts, events, dp_rank]: a fixarray, then ts as a float64.
        if payload[:2] == b"\x93\xcb":
            import struct
            import time
            self.lags.append(time.time() - struct.unpack(">d",
                                                         payload[2:10])[0])
        self.last[pod] = seq
        if len(payload) == 12:
            self.heartbeats += 1

    def _replay(self, pod, start, stop):
        """Applies the publisher's retained batches [start, stop). The
        answer runs to the publisher's newest batch, which may be past
        `stop` by then: those arrive on the SUB socket too, and applying
        them here would make the batch in hand look like a restart."""
        zmq = self.zmq
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        self.replays += 1
        try:
            while True:
                if not dealer.poll(5000):
                    raise TimeoutError("replay: no answer in 5 s")
                frames = dealer.recv_multipart()
                _, topic, seq, payload = frames
                if seq == self.END_SEQ:
                    return
                seq = int.from_bytes(seq, "big")
                if seq >= stop:
                    continue
                self.replayed += 1
                self._apply(pod, topic.decode(), seq, payload)
        finally:
            dealer.close(linger=0)

    def poll(self, timeout_ms):
        """Receives and applies one message; False on a timeout."""
        if not self.sub.poll(timeout_ms):
            return False
        topic, seq_b, payload = self.sub.recv_multipart()
        if self.drop and self.drop():
            self.dropped += 1
            return True
        topic = topic.decode()
        pod, _ = parse_topic(topic)
        seq = int.from_bytes(seq_b, "big")
        last = self.last.get(pod)
        if last is not None and seq > last + 1:
            self.gaps += seq - last - 1
            if self.replay_endpoint is not None:
                self._replay(pod, last + 1, seq)
        self._apply(pod, topic, seq, payload)
        return True

    def run_until(self, pred, timeout):
        import time
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll(50)
            if pred():
                return True
        return False
