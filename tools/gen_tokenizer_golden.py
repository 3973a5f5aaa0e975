#!/usr/bin/env python3
"""Regenerates the tokenizer golden data in tests/data/tokenizer/.

Outputs (all small, checked in):
  smollm2_golden.json       ids for a multilingual corpus from the SmolLM2 GGUF
                            vocab, by HF `tokenizers` (SmolLM2's pre-tokenizer:
                            Digits(individual) + ByteLevel) and by llama.cpp
                            (llama_cpp, vocab_only); the two must agree.
  chat_golden.json          the GGUF's chat template and Meta's Llama-3 and
                            Llama-2 templates rendered with jinja2.
  spm_small_tokenizer.json  a SentencePiece-style BPE (byte_fallback, Metaspace)
                            trained here on a generated corpus.
  spm_small_golden.json     its ids by `tokenizers` (rank-driven merges, HF
                            Metaspace prefix rules) and by llama.cpp on a GGUF
                            "llama" vocab with scores = -rank (score-driven
                            merges, llama.cpp prefix rules).
  bytelevel_small_tokenizer.json / bytelevel_small_golden.json
                            a small byte-level BPE with the Llama-3 Split regex.

Usage: tools/gen_tokenizer_golden.py [--gguf PATH] [--out DIR]
Needs: gguf, tokenizers, jinja2; llama_cpp (llama-cpp-python) optional but
recommended (cross-checks the references).
"""

import argparse
import json
import os
import random
import sys
import tempfile

import gguf
import jinja2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
from tokenizers import pre_tokenizers
from tokenizers import trainers

try:
    import llama_cpp
except ImportError:  # Cross-check is skipped without llama.cpp.
    llama_cpp = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CORPUS = [
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "def foo(x):\n    if x > 0:\n        return x * 2\n\treturn None\n",
    "int main() {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "    indented code\n        more indented\n",
    "a  b   c    d     e",
    "\n\n\n",
    "line one\n\n\nline two\n",
    "trailing spaces   ",
    "   leading spaces",
    "\t\ttabs\tand\t\ttabs\t",
    " \n \n ",
    "x\r\ny\r\n",
    " ",
    "  ",
    "1234567",
    "3.14159 and 2,718 and 1e10 and 0x1F",
    "Order #42: $19.99 (save 15%)",
    "Year 2024, 12345678901234567890",
    "你好，世界！这是一个测试。",
    "日本語のテキストです。カタカナも。",
    "한국어 텍스트입니다",
    "I love 🍕 and 🎉!",
    "👨‍👩‍👧‍👦 family emoji",
    "flags 🇺🇸🇫🇷 and skin 👍🏽",
    "Café naïve résumé façade Zürich Ångström",
    "mañana über straße",
    "مرحبا بالعالم",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "नमस्ते दुनिया",
    "สวัสดีครับ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|im_end|>more text",
    "<|im_start|><|im_end|>",
    "<|im_start partial <|im_end",
    " <|im_start|> spaced <|im_end|> ",
    "I'm don't you'll we've they're it's he'd",
    "I'M DON'T YOU'LL",
    "Mix: English, 中文, العربية, 🙂 and numbers 42!",
    "non\u00a0breaking and ideographic\u3000space",
    "zero\u200bwidth",
    "ctrl\x04char\x1d end",  # bytes 0x04 and 0x1d have no SmolLM2 token
    "bell\x07 \x00nul",
    "\U000F0000 plane15",
    "!!!???...",
    "-----====>>>> <== ->",
    "<html><body>Hi</body></html>",
    "https://example.com/path?q=1&r=2#frag",
    'JSON {"key": [1, 2, 3], "b": null}',
    "antidisestablishmentarianism supercalifragilisticexpialidocious",
    "  \n  \n\n  x  ",
    "",
]

SPM_CORPUS_EXTRA = [
    " leading space",
    "  two leading",
    "<s>",
    "hello</s>",
    "<s> after bos",
    "Hello<s>world",
]

CHAT_CASES = [
    ([{"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Hi"}], False),
    ([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "user", "content": "Hello"},
      {"role": "assistant", "content": "Hi! How can I help?"},
      {"role": "user", "content": "Tell me a joke.\nA short one."}], True),
    ([{"role": "system", "content": ""},
      {"role": "user", "content": "  spaces  "}], True),
    ([{"role": "user", "content": "émoji 🎉 and 中文"}], True),
]


# Meta's published chat templates (tokenizer_config.json of
# Meta-Llama-3-8B-Instruct and Llama-2-7b-chat-hf).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}"
    "{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}"
    "{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")


def render_chat_cases(template, bos, eos, cases):
    """Renders with jinja2; the leading BOS is removed (our renderer leaves
    it to the tokenizer's add_bos)."""
    env = jinja2.Environment()

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.globals["raise_exception"] = raise_exception
    tmpl = env.from_string(template)
    out = []
    for msgs, gen in cases:
        text = tmpl.render(messages=msgs, add_generation_prompt=gen,
                           bos_token=bos, eos_token=eos)
        if bos and text.startswith(bos):
            text = text[len(bos):]
        out.append({"messages": msgs, "add_generation_prompt": gen,
                    "expected": text})
    return out


def load_gguf_vocab(path):
    r = gguf.GGUFReader(path)
    f = r.fields

    def get(key, default=None):
        return f[key].contents() if key in f else default

    return {
        "tokens": get("tokenizer.ggml.tokens"),
        "types": get("tokenizer.ggml.token_type"),
        "merges": get("tokenizer.ggml.merges", []),
        "pre": get("tokenizer.ggml.pre", "default"),
        "template": get("tokenizer.chat_template", ""),
        "bos": get("tokenizer.ggml.bos_token_id", -1),
        "eos": get("tokenizer.ggml.eos_token_id", -1),
    }


def hf_from_gguf(v):
    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges))
    assert v["pre"] == "smollm", v["pre"]
    # SmolLM2's tokenizer.json pre-tokenizer; llama.cpp's "smollm" regexes
    # ("\p{N}" then the GPT-2 regex) implement the same split.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(v["tokens"], v["types"]) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def hf_encode(tok, text, parse_special):
    tok.encode_special_tokens = not parse_special
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return ids


def llama_encode(llm, text, parse_special):
    if llm is None:
        return None
    return llm.tokenize(text.encode(), add_bos=False, special=parse_special)


def open_llama(path):
    if llama_cpp is None:
        print("warning: llama_cpp not importable; no cross-check",
              file=sys.stderr)
        return None
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


def gen_cases(corpus, hf_encoders, llama_encoders, where):
    """Encodes each text with every reference; all must agree."""
    cases = []
    for text in corpus:
        case = {"text": text}
        for parse_special, key in ((True, "ids"), (False, "ids_no_special")):
            got = [(name, enc(text, parse_special))
                   for name, enc in hf_encoders + llama_encoders]
            got = [(n, g) for n, g in got if g is not None]
            first = got[0][1]
            for name, ids in got[1:]:
                if ids != first:
                    sys.exit(f"{where}: {got[0][0]} and {name} disagree on "
                             f"{text!r} (parse_special={parse_special}):\n"
                             f"  {first}\n  {ids}")
            case[key] = first
        cases.append(case)
    return cases


def write_json(path, obj):
    """One top-level key per line, one list element per line (diffable)."""
    parts = []
    for key, value in obj.items():
        if isinstance(value, list):
            items = ",\n  ".join(json.dumps(v, ensure_ascii=False)
                                 for v in value)
            parts.append(f" {json.dumps(key)}: [\n  {items}\n ]")
        else:
            parts.append(f" {json.dumps(key)}: "
                         f"{json.dumps(value, ensure_ascii=False)}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(parts) + "\n}\n")
    print("wrote", os.path.relpath(path, ROOT))


def gen_smollm2(gguf_path, out):
    v = load_gguf_vocab(gguf_path)
    tok = hf_from_gguf(v)
    llm = open_llama(gguf_path)
    hf = [("tokenizers", lambda t, p: hf_encode(tok, t, p))]
    lc = [("llama.cpp", lambda t, p: llama_encode(llm, t, p))] if llm else []
    cases = gen_cases(CORPUS, hf, lc, "smollm2")
    for c in cases:
        c["decoded_skip_special"] = tok.decode(c["ids"],
                                               skip_special_tokens=True)
        # The text minus the bytes that have no token (dropped by both).
        c["decoded"] = tok.decode(c["ids_no_special"],
                                  skip_special_tokens=False)
    write_json(os.path.join(out, "smollm2_golden.json"), {
        "source": os.path.basename(gguf_path),
        "pre": v["pre"],
        "references": [n for n, _ in hf + lc],
        "cases": cases,
    })
    llama2_cases = [(m, g) for m, g in CHAT_CASES
                    if [x["role"] for x in m if x["role"] != "system"] in
                    (["user"], ["user", "assistant", "user"])]
    write_json(os.path.join(out, "chat_golden.json"), {"templates": [
        {"name": "smollm2", "format": "chatml", "template": v["template"],
         "cases": render_chat_cases(v["template"], "", "", CHAT_CASES)},
        {"name": "llama3", "format": "llama3", "template": LLAMA3_TEMPLATE,
         "cases": render_chat_cases(LLAMA3_TEMPLATE, "<|begin_of_text|>",
                                    "<|eot_id|>", CHAT_CASES)},
        {"name": "llama2", "format": "llama2", "template": LLAMA2_TEMPLATE,
         "cases": render_chat_cases(LLAMA2_TEMPLATE, "<s>", "</s>",
                                    llama2_cases)},
    ]})
    return tok


def training_corpus(seed):
    rng = random.Random(seed)
    words = ("the of and to in is you that it he was for on are as with his "
             "they at be this have from or one had by word but not what all "
             "were we when your can said there use an each which she do how "
             "their if will up other about out many then them these so some "
             "her would make like him into time has look two more write go "
             "see number no way could people my than first water been call "
             "who oil its now find long down day did get come made may part "
             "hello world token tokenizer sentence piece café naïve über").split()
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 12)
        line = " ".join(rng.choice(words) for _ in range(n))
        if rng.random() < 0.3:
            line = line.capitalize() + rng.choice([".", "!", "?", ","])
        if rng.random() < 0.2:
            line += " " + str(rng.randint(0, 9999))
        lines.append(line)
    return lines


def byte_tokens():
    return [f"<0x{b:02X}>" for b in range(256)]


def train_spm(out):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="always", split=False)
    tok.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(),
        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=900, min_frequency=2, show_progress=False,
        special_tokens=specials + byte_tokens(),
        limit_alphabet=80)
    tok.train_from_iterator(training_corpus(1234), trainer)
    spec = json.loads(tok.to_str())
    # Byte tokens live in the model vocab (as in Llama's tokenizer.json), not
    # in added_tokens: otherwise "<0x41>" typed in text would match them.
    spec["added_tokens"] = [a for a in spec["added_tokens"]
                            if a["content"] in specials]
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1],
                                   "tokens": ["<s>"]}},
    }
    text = json.dumps(spec, ensure_ascii=False)
    path = os.path.join(out, "spm_small_tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote", os.path.relpath(path, ROOT))
    return Tokenizer.from_str(text), spec


def spm_gguf(spec, path):
    """A vocab-only GGUF "llama" tokenizer with scores = -merge rank."""
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    rank = {}
    for r, m in enumerate(spec["model"]["merges"]):
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        rank.setdefault(a + b, r)
    scores = [-float(rank.get(t, 0)) for t in tokens]
    types = []
    for i, t in enumerate(tokens):
        if t == "<unk>":
            types.append(2)
        elif t in ("<s>", "</s>"):
            types.append(3)
        elif t.startswith("<0x") and len(t) == 6:
            types.append(6)
        else:
            types.append(1)
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_unk_token_id(vocab["<unk>"])
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gen_spm(out):
    tok, spec = train_spm(out)
    corpus = CORPUS + SPM_CORPUS_EXTRA
    hf = [("tokenizers", lambda t, p: hf_encode(tok, t, p))]
    cases = gen_cases(corpus, hf, [], "spm_small")
    for c in cases:
        c["decoded_skip_special"] = tok.decode(c["ids"],
                                               skip_special_tokens=True)
    obj = {"tokenizer": "spm_small_tokenizer.json", "cases": cases}
    # Pipeline variants of the same model, as the C++ test rebuilds them.
    first = json.loads(json.dumps(spec))
    first["pre_tokenizer"]["prepend_scheme"] = "first"
    legacy = json.loads(json.dumps(spec))
    legacy["pre_tokenizer"] = None
    legacy["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "},
         "content": "\u2581"}]}
    for name, variant in (("first", first), ("legacy", legacy)):
        vtok = Tokenizer.from_str(json.dumps(variant))
        obj[f"{name}_cases"] = gen_cases(
            corpus, [("tokenizers", lambda t, p: hf_encode(vtok, t, p))],
            [], f"spm_small {name}")
    if llama_cpp is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "spm_small.gguf")
            spm_gguf(spec, path)
            llm = open_llama(path)
            obj["llama_cpp_scores_cases"] = [
                {"text": t,
                 "ids": llama_encode(llm, t, True),
                 "ids_no_special": llama_encode(llm, t, False)}
                for t in corpus]
            del llm
    write_json(os.path.join(out, "spm_small_golden.json"), obj)


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def gen_bytelevel(out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(
            Regex(LLAMA3_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                "<|start_header_id|>", "<|end_header_id|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=800, min_frequency=2, show_progress=False,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_corpus(99), trainer)
    tok.add_tokens([AddedToken("<user_defined>", special=False,
                               normalized=False)])
    text = tok.to_str()
    path = os.path.join(out, "bytelevel_small_tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote", os.path.relpath(path, ROOT))
    tok = Tokenizer.from_str(text)
    corpus = CORPUS + ["<|begin_of_text|><|start_header_id|>user"
                       "<|end_header_id|>\n\nhi<|eot_id|>",
                       "a <user_defined> b", "'S 'LL 'Re"]
    hf = [("tokenizers", lambda t, p: hf_encode(tok, t, p))]
    cases = gen_cases(corpus, hf, [], "bytelevel_small")
    write_json(os.path.join(out, "bytelevel_small_golden.json"),
               {"tokenizer": "bytelevel_small_tokenizer.json",
                "cases": cases})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=os.path.join(
        ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(
        ROOT, "tests", "data", "tokenizer"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    gen_smollm2(args.gguf, args.out)
    gen_spm(args.out)
    gen_bytelevel(args.out)


if __name__ == "__main__":
    main()
