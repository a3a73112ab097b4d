#!/usr/bin/env python3
"""Expected token ids for tests/test_tokenizer.c, from the real Hugging Face `tokenizers`
(and `transformers` AutoTokenizer), never from gerbil.

Inputs (copied into a git-ignored folder that travels to the machine with Python):
  TOKDIR/qwen3, TOKDIR/llama3, TOKDIR/gemma3, TOKDIR/stories260K: tokenizer.json + tokenizer_config.json
  TOKDIR/llamacpp/*.inp: llama.cpp test strings (added to the corpus)
Outputs in OUTDIR:
  tokenizer_expected.json  every case (compact), committed as tests/tokenizer/expected.json
  synth_*.json             small tokenizers trained/constructed here (Unigram, WordPiece, BPE),
                           committed under tests/tokenizer/
  debug.json               normalizer / pre-tokenizer outputs and token strings (not committed)

Usage: python3 scripts/gen_tokenizer_expected.py TOKDIR OUTDIR      (on a machine with tokenizers)
       python3 scripts/gen_tokenizer_expected.py --compact OUTDIR/tokenizer_expected.json \
               tests/tokenizer/expected.json                        (anywhere: the committed form)
Strings holding U+0000 are written as {"hex": "<utf-8 bytes>"} (cJSON strings stop at NUL).
Committed form (after --compact): "texts" holds every input once; each case has t (index into
texts); ids (add_special_tokens=False); the ids with add_special_tokens=True as sp_pre + ids +
sp_post, or ids_special in full, or neither when equal to ids; decode = decode(ids) (left out when
equal to the text); decode_special = decode(ids with specials) and decode_skip = the same with
skip_special_tokens=True (each left out when equal to decode).
"""
import glob
import json
import os
import random
import sys
import time
import traceback


def compact(e, n_random_texts=40, n_random_ids_real=25, n_random_ids_synth=10, n_synth_texts=70):
    """Shrink the raw output for committing: every text once in a top-level "texts" list
    (cases refer to it by index "t"; the corpus comes first, in order), fewer random
    strings / id lists (the first ones of the same deterministic sequences)."""
    texts, index = [], {}

    def tid(t):
        key = json.dumps(t, ensure_ascii=False)
        if key not in index:
            index[key] = len(texts)
            texts.append(t)
        return index[key]

    n_corpus = next(iter(e["real"].values()))["n_corpus"]
    for v in e["real"].values():
        v["cases"] = v["cases"][:n_corpus + n_random_texts]
        v["random_ids"] = v["random_ids"][:n_random_ids_real]
        v.pop("hf_load_s", None)
        v.pop("hf_big_encode_s", None)
    for v in e["synth"].values():
        if "cases" in v:
            v["cases"] = v["cases"][:n_synth_texts]
            v["random_ids"] = v["random_ids"][:n_random_ids_synth]
    for group in ("real", "synth"):
        for v in e[group].values():
            for c in v.get("cases", []):
                if "ids" not in c:
                    continue
                ids, text = c["ids"], c["text"]
                dec = c.get("decode", text)
                sp = c.get("ids_special", ids)
                d1 = c.get("decode_special", dec)
                d2 = c.get("decode_skip", d1)
                for k in ("ids_special", "decode_special", "decode_skip"):
                    c.pop(k, None)
                if sp != ids:
                    pre = next((i for i in range(len(sp) - len(ids) + 1) if sp[i:i + len(ids)] == ids), None)
                    if pre is not None:
                        c["sp_pre"], c["sp_post"] = sp[:pre], sp[pre + len(ids):]
                    else:
                        c["ids_special"] = sp
                if d1 != dec:
                    c["decode_special"] = d1
                if d2 != dec:
                    c["decode_skip"] = d2
    for group in ("real", "synth", "auto"):
        for v in e[group].values():
            for c in v.get("cases", []):
                c["t"] = tid(c.pop("text"))
    e["texts"] = texts
    e.pop("log", None)
    return e


if len(sys.argv) == 4 and sys.argv[1] == "--compact":
    with open(sys.argv[2], encoding="utf-8") as f:
        raw = json.load(f)
    with open(sys.argv[3], "w", encoding="utf-8") as f:
        json.dump(compact(raw), f, ensure_ascii=False, separators=(",", ":"))
    sys.exit(0)

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer  # noqa: E402
from tokenizers import decoders as D  # noqa: E402
from tokenizers import models as M  # noqa: E402
from tokenizers import normalizers as N  # noqa: E402
from tokenizers import pre_tokenizers as P  # noqa: E402
from tokenizers import processors as PP  # noqa: E402
from tokenizers import trainers as T  # noqa: E402

TOKDIR, OUTDIR = sys.argv[1], sys.argv[2]
os.makedirs(OUTDIR, exist_ok=True)
LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def enc_text(s):
    return {"hex": s.encode("utf-8").hex()} if "\x00" in s else s


# ---------------------------------------------------------------- corpus
CORPUS = [
    "Hello world",
    " Hello world",
    "Hello World!",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we've got 12 apples, they'll say I'd've.",
    "In 1492, Columbus sailed the ocean blue. Numbers: 1234567 3.14159 -42 1,000,000 0x1F 2024-06-01.",
    "def f(x):\n\treturn x * 2\n\n\nclass A:\n    def __init__(self):\n        self.v = [1, 2, 3]  # comment\n",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "    leading spaces and trailing spaces    ",
    "tabs\tand\t\ttabs\t\t\t and \t mixed \t\n\t",
    "\n\n\nnewlines\n\n\n\n\nmany\r\nwindows\r\n\r\nline endings\r",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    " \n \n ",
    "a",
    "ab",
    "I",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'M 'LL 'D",
    "你好，世界！这是一个测试。我们来看看中文分词怎么样。",
    "日本語のテキストです。カタカナとひらがな、漢字。",
    "한국어 텍스트 테스트입니다.",
    "مرحبا بالعالم! هذا نص عربي للاختبار.",
    "שלום עולם",
    "नमस्ते दुनिया",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Ελληνικά: ΣΊΣΥΦΟΣ σίσυφος ς",
    "emoji: 😀😃😄 👍🏽 🦙 🇺🇸 🏳️‍🌈 👨‍👩‍👧‍👦 ❤️ ✨",
    "👩🏽‍💻👨‍🔬🧑‍🚀",
    "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m",
    "e\u0301",
    "\u00e9",
    "ﬁne ﬂour ２０２４ Ａｂｃ ① ² ½ Ⅻ ㎏ ℌ",
    "İstanbul ıi ß ẞ ǅ Σ",
    "non\u00a0breaking\u2009thin\u3000ideographic\u200bzero\u2028ls\u0085nel",
    "control\x07bell\x1besc\x7fdel\x01\x02",
    "replacement \ufffd char",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<s>[INST] hello [/INST]</s>",
    "text<s>inside</s>text <unk> <pad> <mask> [CLS] [SEP] [UNK] [MASK]",
    "<|im_start|><|im_start|><|im_end|>",
    "<|im_start",
    "|im_start|>",
    "<|endoftext|>",
    "< |im_start| >",
    "<0x41><0xE2><0x82><0xAC> <0xZZ>",
    "▁▁hello▁world ĠHello Ċ ## ##ing",
    "<unused0><unused99> [multimodal] <start_of_image>",
    "hello world hello  world Hello World HELLO WORLD",
    "<mask> hello<mask>world  <mask>  end [RS]  x  [RS]y",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "٠١٢٣٤٥٦٧٨٩ ١٢٣ ४२ 〇一二",
    "$100 €50 £20 ¥1000 ₹500 @user #hashtag 100% a&b a|b a~b a^b `code`",
    "!!!???...,,,;;;:::---___===+++***///\\\\\\|||",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "{\"json\": [1, 2.5, true, null], \"k\": \"v\"}",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "Mixed CASE wORDS, CamelCase, snake_case, kebab-case, SCREAMING_CASE.",
    "\u0000nul\u0000 inside",
    "trailing space ",
    "word\u200d\u200cjoiners",
    "\U0001F600",
    "\U00010348 gothic \U0001D11E music \U00020000 cjk-ext-b",
    "Tiếng Việt có dấu: Đây là một câu.",
    "ภาษาไทยไม่มีช่องว่าง",
    "Zero-width: a\ufeffb BOM",
    "a" * 1000,
    " " * 300 + "x",
    "\n" * 200,
    "ab" * 400,
    "🦙" * 50,
]

LLAMACPP = {}
for p in sorted(glob.glob(os.path.join(TOKDIR, "llamacpp", "*.inp"))):
    txt = open(p, encoding="utf-8").read()
    parts = txt.split("\n__ggml_vocab_test__\n")
    LLAMACPP[os.path.basename(p)] = parts
    for s in parts:
        if s not in CORPUS:
            CORPUS.append(s)


def random_strings(seed, n):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
        " ", "  ", "\t", "\n", "\r\n", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "éèêëàâäôöûüçñÅØæœß", "\u0301\u0308\u0327\u030a", "你好世界中文字符测试", "ひらがなカタカナ",
        "한국어", "مرحبابالعالم", "שלום", "नमस्ते", "Привет", "ΣσςΑα",
        "😀🦙👍🏽🇺🇸❤️", "\u200d\ufe0f\u200b", "\u00a0\u3000\u2009", "ﬁ２①²Ⅻ", "İıẞǅ",
        "▁Ġ#", "\x07\x1b\x7f", "\ufffd",
    ]
    frags = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "<bos>", "<unk>", "<mask>",
             "<|begin_of_text|>", "<0x41>", "[CLS]", "[SEP]", "'s", "'ll", " the", "ing", "1234567"]
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        s = []
        for _ in range(k):
            r = rng.random()
            if r < 0.08:
                s.append(rng.choice(frags))
            else:
                pool = rng.choice(pools)
                s.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(s))
    return out


RANDOM = random_strings(1234, 120)

# Training text for the small synthetic models.
TRAIN = []
words = ("the of and to in is was he for it with as his on be at by had are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what "
         "up its about into than them can only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where much "
         "your way well down should because each just those people how too little state good very make world still "
         "own see men work long get here between both life being under never day same another know while last might "
         "us great old year off come since against go came right used take three hello running jumped quickly "
         "tokenizer tokenization unbelievable happiness walked walking talks talked").split()
_rng = random.Random(7)
for _ in range(1500):
    n = _rng.randint(3, 14)
    sent = " ".join(_rng.choice(words) for _ in range(n))
    if _rng.random() < 0.3:
        sent = sent.capitalize() + _rng.choice([".", "!", "?", ",", ";"])
    if _rng.random() < 0.2:
        sent += " " + str(_rng.randint(0, 99999))
    TRAIN.append(sent)
TRAIN += CORPUS[:60] * 3


# ---------------------------------------------------------------- recording
def record_tok(tok, texts, want_random_ids=0, seed=0):
    cases = []
    dbg = []
    for s in texts:
        c = {"text": enc_text(s)}
        try:
            e0 = tok.encode(s, add_special_tokens=False)
            e1 = tok.encode(s, add_special_tokens=True)
            # compact: a field left out equals its fallback (see the module docstring)
            c["ids"] = e0.ids
            if e1.ids != e0.ids:
                c["ids_special"] = e1.ids
            d0 = tok.decode(e0.ids, skip_special_tokens=False)
            if d0 != s:
                c["decode"] = enc_text(d0)
            d1 = tok.decode(e1.ids, skip_special_tokens=False)
            if e1.ids != e0.ids:
                c["decode_special"] = enc_text(d1)
            d2 = tok.decode(e1.ids, skip_special_tokens=True)
            if d2 != d1:
                c["decode_skip"] = enc_text(d2)
            d = {"tokens": e0.tokens}
            try:
                if tok.normalizer is not None:
                    d["normalized"] = tok.normalizer.normalize_str(s)
                if tok.pre_tokenizer is not None:
                    d["pre"] = [p[0] for p in tok.pre_tokenizer.pre_tokenize_str(d.get("normalized", s))]
            except BaseException as ex:  # noqa
                d["dbg_error"] = repr(ex)
            dbg.append(d)
        except BaseException as ex:
            c["error"] = repr(ex)
            dbg.append({})
        cases.append(c)
    rnd = []
    if want_random_ids:
        rng = random.Random(seed)
        V = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(want_random_ids):
            ids = [rng.randrange(V) for _ in range(rng.randint(1, 24))]
            # bias towards low ids (bytes / specials) and a few high ones
            for j in range(len(ids)):
                if rng.random() < 0.3:
                    ids[j] = rng.randrange(min(V, 300))
            try:
                rnd.append({"ids": ids,
                            "decode": enc_text(tok.decode(ids, skip_special_tokens=False)),
                            "decode_skip": enc_text(tok.decode(ids, skip_special_tokens=True))})
            except BaseException as ex:
                rnd.append({"ids": ids, "error": repr(ex)})
    return cases, rnd, dbg


EXPECTED = {"tokenizers_version": tokenizers.__version__, "real": {}, "synth": {}, "auto": {}}
DEBUG = {}

REAL = ["qwen3", "llama3", "gemma3", "stories260K"]
# A ~1 MB text the C test rebuilds from the corpus (the first n_corpus cases): "\n".join(CORPUS)
# repeated, joined by "\n". Its ids are checked through their count and an FNV-1a hash.
UNIT = "\n".join(CORPUS)
BIG = "\n".join([UNIT] * (1 + (1 << 20) // len(UNIT.encode("utf-8"))))


def fnv_ids(ids):
    h = 2166136261
    for i in ids:
        h = ((h ^ (i & 0xffffffff)) * 16777619) & 0xffffffff
    return h


for name in REAL:
    path = os.path.join(TOKDIR, name, "tokenizer.json")
    try:
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        t1 = time.perf_counter()
        big = tok.encode(BIG, add_special_tokens=False).ids
        t2 = time.perf_counter()
        log("real", name, "load %.3f s, encode %.2f MB in %.3f s" % (t1 - t0, len(BIG.encode()) / 1e6, t2 - t1))
        cases, rnd, dbg = record_tok(tok, CORPUS + RANDOM, want_random_ids=60, seed=sum(map(ord, name)))
        EXPECTED["real"][name] = {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
                                  "n_corpus": len(CORPUS), "big_bytes": len(BIG.encode("utf-8")),
                                  "big_n_ids": len(big), "big_fnv": fnv_ids(big),
                                  "hf_load_s": t1 - t0, "hf_big_encode_s": t2 - t1,
                                  "cases": cases, "random_ids": rnd}
        DEBUG[name] = dbg
        log("real", name, "ok", len(cases))
    except BaseException:
        log("real", name, "FAILED", traceback.format_exc())

# transformers AutoTokenizer on the real folders (pins add_bos_token and friends)
try:
    import transformers
    from transformers import AutoTokenizer
    EXPECTED["transformers_version"] = transformers.__version__
    auto_texts = CORPUS[:45] + ["Hello", " Hello", ""]
    for name in REAL:
        try:
            at = AutoTokenizer.from_pretrained(os.path.join(TOKDIR, name))
            rec = {"class": type(at).__name__, "bos_token": at.bos_token, "eos_token": at.eos_token,
                   "bos_token_id": at.bos_token_id, "eos_token_id": at.eos_token_id, "cases": []}
            for s in auto_texts:
                ids1 = at(s)["input_ids"]
                ids0 = at(s, add_special_tokens=False)["input_ids"]
                rec["cases"].append({"text": enc_text(s), "ids_special": ids1, "ids": ids0,
                                     "decode": enc_text(at.decode(ids1)),
                                     "decode_skip": enc_text(at.decode(ids1, skip_special_tokens=True))})
            EXPECTED["auto"][name] = rec
            log("auto", name, "ok", rec["class"], rec["bos_token_id"], rec["eos_token_id"])
        except BaseException:
            log("auto", name, "FAILED", traceback.format_exc())
except BaseException:
    log("transformers import FAILED", traceback.format_exc())


# ---------------------------------------------------------------- synthetic bases
def save_base(tok, fname):
    p = os.path.join(OUTDIR, fname)
    tok.save(p)
    return p


SPECIAL_WP = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
bases = {}
try:
    wp = Tokenizer(M.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    wp.normalizer = N.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = P.BertPreTokenizer()
    wp.train_from_iterator(TRAIN, T.WordPieceTrainer(vocab_size=700, special_tokens=SPECIAL_WP, min_frequency=1, show_progress=False))
    wp.post_processor = PP.BertProcessing(("[SEP]", wp.token_to_id("[SEP]")), ("[CLS]", wp.token_to_id("[CLS]")))
    wp.decoder = D.WordPiece(prefix="##", cleanup=True)
    bases["synth_wordpiece.json"] = save_base(wp, "synth_wordpiece.json")
except BaseException:
    log("wordpiece base FAILED", traceback.format_exc())

try:
    un = Tokenizer(M.Unigram())
    un.normalizer = N.NFKC()
    un.pre_tokenizer = P.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    un.train_from_iterator(TRAIN, T.UnigramTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                                   unk_token="<unk>", shrinking_factor=0.75, show_progress=False))
    un.post_processor = PP.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                              special_tokens=[("<s>", un.token_to_id("<s>")),
                                                              ("</s>", un.token_to_id("</s>"))])
    un.decoder = D.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    p = save_base(un, "synth_unigram.json")
    bases["synth_unigram.json"] = p
    # a byte-fallback twin: <0x00>..<0xFF> appended with low scores
    j = json.load(open(p, encoding="utf-8"))
    vocab = j["model"]["vocab"]
    have = {v[0] for v in vocab}
    for b in range(256):
        t = "<0x%02X>" % b
        if t not in have:
            vocab.append([t, -20.0])
    j["model"]["byte_fallback"] = True
    p2 = os.path.join(OUTDIR, "synth_unigram_bytes.json")
    json.dump(j, open(p2, "w", encoding="utf-8"), ensure_ascii=False)
    Tokenizer.from_file(p2)
    bases["synth_unigram_bytes.json"] = p2
except BaseException:
    log("unigram base FAILED", traceback.format_exc())

try:
    bp = Tokenizer(M.BPE())
    bp.pre_tokenizer = P.ByteLevel(add_prefix_space=False, use_regex=True)
    bp.train_from_iterator(TRAIN, T.BpeTrainer(vocab_size=520, initial_alphabet=P.ByteLevel.alphabet(),
                                               special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                               min_frequency=2, show_progress=False))
    bp.post_processor = PP.ByteLevel(trim_offsets=True)
    bp.decoder = D.ByteLevel()
    bases["synth_bpe.json"] = save_base(bp, "synth_bpe.json")
except BaseException:
    log("bpe base FAILED", traceback.format_exc())

try:
    bs = Tokenizer(M.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    bs.pre_tokenizer = P.Whitespace()
    bs.normalizer = N.Lowercase()
    bs.train_from_iterator(TRAIN, T.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"], min_frequency=2,
                                               continuing_subword_prefix="##", end_of_word_suffix="</w>", show_progress=False))
    bs.decoder = D.BPEDecoder(suffix="</w>")
    bases["synth_bpe_suffix.json"] = save_base(bs, "synth_bpe_suffix.json")
except BaseException:
    log("bpe suffix base FAILED", traceback.format_exc())


def added(content, **kw):
    d = {"id": kw.pop("id"), "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
    d.update(kw)
    return d


# Variants: (name, base, override). Override keys replace top-level keys; "model" merges key by key;
# "added_tokens_extra" appends added tokens (ids past the vocab).
def S(pattern, behavior, invert=False, regex=False):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


BL_NOREGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
VARIANTS = [
    ("wordpiece_bert", "synth_wordpiece.json", {}),
    ("wordpiece_cased", "synth_wordpiece.json", {
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": False,
                       "strip_accents": False, "lowercase": False},
        "model": {"max_input_chars_per_word": 8},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                                      {"SpecialToken": {"id": "[MASK]", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                                              "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]},
                                              "[MASK]": {"id": "[MASK]", "ids": [4, 1], "tokens": ["[MASK]", "[UNK]"]}}}}),
    ("wordpiece_ws_digits", "synth_wordpiece.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"},
                                                           {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"},
                                                                {"type": "Digits", "individual_digits": True}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}]}}),
    ("wordpiece_wssplit_punct", "synth_wordpiece.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Lowercase"},
                                                           {"type": "Replace", "pattern": {"Regex": "[0-9]+"},
                                                            "content": "0"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
                                                                {"type": "Punctuation", "behavior": "Contiguous"},
                                                                {"type": "Digits", "individual_digits": False}]},
        "post_processor": None, "decoder": None}),
    ("wordpiece_punct_removed", "synth_wordpiece.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Strip", "strip_left": True, "strip_right": True},
                                                           {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
                                                                {"type": "Punctuation", "behavior": "Removed"}]}}),
    ("wordpiece_punct_prev", "synth_wordpiece.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
                                                                {"type": "Punctuation", "behavior": "MergedWithPrevious"}]}}),
    ("wordpiece_punct_next", "synth_wordpiece.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
                                                                {"type": "Punctuation", "behavior": "MergedWithNext"}]}}),
    ("unigram_meta", "synth_unigram.json", {}),
    ("unigram_first_nosplit", "synth_unigram.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "StripAccents"}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}}),
    ("unigram_never", "synth_unigram.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"Regex": "\\s+"},
                                                            "content": " "},
                                                           {"type": "Strip", "strip_left": False, "strip_right": True},
                                                           {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}}),
    ("unigram_spm_style", "synth_unigram_bytes.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                           {"type": "Replace", "pattern": {"String": " "},
                                                            "content": "▁"}]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}),
    ("unigram_bytes_meta", "synth_unigram_bytes.json", {
        "normalizer": {"type": "NFC"},
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                                     {"type": "Metaspace", "replacement": "▁",
                                                      "prepend_scheme": "always", "split": True}]}}),
    ("unigram_nmt_nfkc", "synth_unigram.json", {
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Nmt"}, {"type": "NFKC"}]}}),
    ("bpe_bytelevel", "synth_bpe.json", {}),
    ("bpe_gpt2_prefix", "synth_bpe.json", {
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                           "trim_offsets": True, "add_prefix_space": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "added_tokens_extra": [
            added("<mask>", id=4, special=True, lstrip=True),
            added("Hello World", id=520, normalized=True, single_word=True),
            added("[RS]", id=521, rstrip=True),
            added("xx", id=522, single_word=True),
            added("ab", id=523, lstrip=True, rstrip=True, special=True),
        ],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}}),
    ("bpe_split_isolated", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S(" ", "Isolated"), BL_NOREGEX]}}),
    ("bpe_split_removed_regex", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S("\\s+", "Removed", regex=True), BL_NOREGEX]}}),
    ("bpe_split_prev", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S(" ", "MergedWithPrevious"), BL_NOREGEX]}}),
    ("bpe_split_next", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S(" ", "MergedWithNext"), BL_NOREGEX]}}),
    ("bpe_split_contig", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S("[a-z]", "Contiguous", regex=True), BL_NOREGEX]}}),
    ("bpe_split_invert", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S("\\p{L}+", "Isolated", invert=True, regex=True),
                                                                BL_NOREGEX]}}),
    ("bpe_split_invert_removed", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [S("\\w+|[^\\w\\s]+", "Removed", invert=True,
                                                                  regex=True), BL_NOREGEX]}}),
    ("bpe_bytelevel_norm", "synth_bpe.json", {
        "normalizer": {"type": "ByteLevel"},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "Ġ"}, "behavior": "MergedWithNext", "invert": False}}),
    ("bpe_charsplit", "synth_bpe.json", {
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "CharDelimiterSplit", "delimiter": "e"},
                                                                BL_NOREGEX]}}),
    ("bpe_suffix", "synth_bpe_suffix.json", {}),
    ("bpe_suffix_fuse", "synth_bpe_suffix.json", {"model": {"fuse_unk": True}}),
    # the real Llama 3 files upstream: ByteLevel then TemplateProcessing adding <|begin_of_text|>
    ("llama3_template", "../shared/data/tokenizers/llama3/tokenizer.json", {
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}}),
    # Llama-2 style Metaspace pre-tokenizer on the tiny stories260K vocab (no normalizer)
    ("stories_metaspace", "../shared/data/models/stories260K/hf/tokenizer.json", {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"},
                                                     {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}}),
    ("stories_nofuse", "../shared/data/models/stories260K/hf/tokenizer.json", {
        "model": {"byte_fallback": False, "fuse_unk": False}}),
    ("stories_fuse_nobytes", "../shared/data/models/stories260K/hf/tokenizer.json", {
        "model": {"byte_fallback": False, "fuse_unk": True}}),
]

REAL_PATHS = {
    "../shared/data/tokenizers/llama3/tokenizer.json": os.path.join(TOKDIR, "llama3", "tokenizer.json"),
    "../shared/data/models/stories260K/hf/tokenizer.json": os.path.join(TOKDIR, "stories260K",
                                                                               "tokenizer.json"),
}


def apply_override(j, ov):
    j = json.loads(json.dumps(j))
    for k, v in ov.items():
        if k == "model":
            j["model"].update(v)
        elif k == "added_tokens_extra":
            have = {a["id"] for a in j["added_tokens"]}
            for a in v:
                if a["id"] in have:
                    j["added_tokens"] = [x for x in j["added_tokens"] if x["id"] != a["id"]]
                j["added_tokens"].append(a)
        else:
            j[k] = v
    return j


SYN_TEXTS = CORPUS[:60] + RANDOM[:25]
for name, base, ov in VARIANTS:
    try:
        bpath = REAL_PATHS.get(base) or bases[base]
        j = apply_override(json.load(open(bpath, encoding="utf-8")), ov)
        tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
        cases, rnd, dbg = record_tok(tok, SYN_TEXTS, want_random_ids=20, seed=len(name))
        EXPECTED["synth"][name] = {"base": base, "override": ov,
                                   "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                                   "cases": cases, "random_ids": rnd}
        DEBUG[name] = dbg
        log("synth", name, "ok")
    except BaseException:
        log("synth", name, "FAILED", traceback.format_exc())
        EXPECTED["synth"][name] = {"base": base, "override": ov, "load_error": traceback.format_exc()}

EXPECTED["log"] = LOG
with open(os.path.join(OUTDIR, "tokenizer_expected.json"), "w", encoding="utf-8") as f:
    json.dump(EXPECTED, f, ensure_ascii=False, separators=(",", ":"))
with open(os.path.join(OUTDIR, "debug.json"), "w", encoding="utf-8") as f:
    json.dump(DEBUG, f, ensure_ascii=False, separators=(",", ":"))
log("done")
