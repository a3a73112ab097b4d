/* kind byte, flags byte, constraint SEP walk -> compile a JSON Schema / GBNF / regex /
 * json_object constraint against a small byte-level BPE vocabulary (built here: the 256
 * bytes, JSON-ish merged pieces, a two-byte UTF-8 piece and an EOS), then walk it: each
 * walk byte is one step — take an allowed token, try an arbitrary one, check the forced
 * token, or feed raw bytes. Invariants checked on every step (abort on violation):
 *   - a token is accepted iff its mask bit is set, and a rejected one leaves the state as it was;
 *   - an accepted token's bytes are accepted byte by byte from the same state;
 *   - the EOS bit is set iff the grammar may end here (unless finished);
 *   - the forced token, when there is one, is the mask's only bit.
 */
#include "fuzz_common.h"
#include "gerbil.h"

enum { N_BYTE = 256, MAX_VOCAB = 512, MAX_STEPS = 96 };

static gerbil_tokenizer_t tok;
static gerbil_grammar_vocab_t vocab;
static int n_vocab, eos_id;
static char *piece[MAX_VOCAB]; /* each id's bytes (NUL-terminated; no id holds a NUL but byte 0's) */
static size_t piece_len[MAX_VOCAB];

/* GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the others for 256 + n. */
static int byte_char(int b) {
    static int map[256], made;
    if (!made) {
        int n = 0;
        for (int c = 0; c < 256; c++) {
            int keep = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
            map[c] = keep ? c : 256 + n++;
        }
        made = 1;
    }
    return map[b];
}

static size_t put_utf8(char *o, int cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63)), o[2] = (char)(0x80 | (cp & 63)), 3;
}

/* The piece's GPT-2 form as a JSON string body (escaped). */
static void json_piece(char **w, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char u[4];
        size_t k = put_utf8(u, byte_char((unsigned char)bytes[i]));
        for (size_t j = 0; j < k; j++) {
            if (u[j] == '"' || u[j] == '\\') *(*w)++ = '\\';
            *(*w)++ = u[j];
        }
    }
}

static int add_piece(const char *b, size_t n) {
    for (int i = 0; i < n_vocab; i++)
        if (piece_len[i] == n && !memcmp(piece[i], b, n)) return i;
    if (n_vocab >= MAX_VOCAB) abort();
    piece[n_vocab] = malloc(n + 1);
    if (!piece[n_vocab]) abort();
    memcpy(piece[n_vocab], b, n);
    piece[n_vocab][n] = 0;
    piece_len[n_vocab] = n;
    return n_vocab++;
}

static void setup(void) {
    static const char *merged[] = {"{\"", "\":", "\",", "\"}", "true", "false", "null", "12", "0.5", "  ", "\n ",
                                   "ab", "abc", "\\\"", "[1", "],", "-1", "e+", "\xc3\xa9", "\xe4\xbd\xa0"};
    size_t cap = 1 << 16, nm = 0;
    char *js = malloc(cap), *w = js, *merges = malloc(cap), *mw = merges;
    if (!js || !merges) abort();
    for (int b = 0; b < N_BYTE; b++) {
        char c = (char)b;
        add_piece(&c, 1);
    }
    /* each merged piece grows left to right: prefix + next byte, every prefix a piece */
    for (size_t m = 0; m < sizeof merged / sizeof merged[0]; m++) {
        size_t n = strlen(merged[m]);
        for (size_t k = 2; k <= n; k++) {
            int before = n_vocab;
            add_piece(merged[m], k);
            if (n_vocab == before) continue;
            mw += sprintf(mw, nm++ ? ",\"" : "\"");
            json_piece(&mw, merged[m], k - 1);
            *mw++ = ' ';
            json_piece(&mw, merged[m] + k - 1, 1);
            *mw++ = '"';
        }
    }
    w += sprintf(w, "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":%d,\"content\":\"<eos>\",\"single_word\":false,"
                    "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
                    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                    "\"trim_offsets\":false,\"use_regex\":false},\"post_processor\":null,"
                    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":false,"
                    "\"use_regex\":false},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
                    "\"byte_fallback\":false,\"vocab\":{",
                 n_vocab);
    for (int i = 0; i < n_vocab; i++) {
        *w++ = i ? ',' : ' ';
        *w++ = '"';
        json_piece(&w, piece[i], piece_len[i]);
        w += sprintf(w, "\":%d", i);
    }
    *mw = 0;
    w += sprintf(w, "},\"merges\":[%s]}}", merges);
    eos_id = n_vocab;
    fz_write(0, "tokenizer.json", js, (size_t)(w - js));
    fz_remove("tokenizer_config.json");
    free(js);
    free(merges);
    if (gerbil_tokenizer_load(fz_dir(), &tok) != GERBIL_OK) {
        fprintf(stderr, "fuzz_grammar: the built-in tokenizer does not load: %s\n", gerbil_last_error());
        abort();
    }
    if (gerbil_grammar_vocab_new(tok, n_vocab + 1, &eos_id, 1, &vocab) != GERBIL_OK) abort();
}

static int bit(const uint64_t *m, int i) { return (int)(m[i >> 6] >> (i & 63) & 1); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vocab) setup();
    if (size < 2) return 0;
    const gerbil_grammar_kind kind = (gerbil_grammar_kind)(data[0] % 4);
    gerbil_grammar_params p = gerbil_grammar_default_params();
    p.compact = data[1] & 1;
    p.max_whitespace = data[1] >> 1 & 7;
    const uint8_t *part[2];
    size_t len[2];
    int k = fz_split(data + 2, size - 2, part, len, 2);
    gerbil_grammar_t g = NULL;
    if (gerbil_grammar_compile(vocab, kind, (const char *)part[0], len[0], &p, &g) != GERBIL_OK) return 0;
    const uint8_t *walk = k > 1 ? part[1] : (const uint8_t *)"\x00\x04\x08\x0c\x10\x14\x18\x1c";
    const size_t n_walk = k > 1 ? len[1] : 8;
    const int nw = gerbil_grammar_mask_words(g), nv = n_vocab + 1;
    uint64_t *mask = calloc((size_t)nw, 8), *again = calloc((size_t)nw, 8), *scratch = calloc((size_t)nw, 8);
    gerbil_grammar_state_t s = NULL, t = NULL;
    if (!mask || !again || !scratch || gerbil_grammar_state_new(g, &s) != GERBIL_OK ||
        gerbil_grammar_state_new(g, &t) != GERBIL_OK)
        abort();
    for (size_t i = 0; i < n_walk && i < MAX_STEPS && !gerbil_grammar_is_finished(s); i++) {
        const int op = walk[i] & 3, arg = walk[i] >> 2;
        if (gerbil_grammar_mask(s, mask) != GERBIL_OK) break;
        int n_allowed = 0;
        for (int id = 0; id < nv; id++) n_allowed += bit(mask, id);
        if (bit(mask, eos_id) != gerbil_grammar_is_accepting(s)) abort();
        if (op == 0 && n_allowed) { /* an allowed token, its bytes accepted one by one */
            int want = arg % n_allowed, id = 0;
            for (;; id++)
                if (bit(mask, id) && want-- == 0) break;
            if (id != eos_id) {
                gerbil_grammar_state_copy(t, s);
                if (gerbil_grammar_accept_bytes(t, piece[id], piece_len[id]) != piece_len[id]) abort();
            }
            if (gerbil_grammar_accept_token(s, id) != GERBIL_OK) abort();
        } else if (op == 1) { /* any token: accepted iff allowed; a refusal changes nothing */
            const int id = (int)(((unsigned)arg * 2654435761u) % (unsigned)nv);
            gerbil_status st = gerbil_grammar_accept_token(s, id);
            if ((st == GERBIL_OK) != bit(mask, id)) abort();
            if (st != GERBIL_OK) {
                if (gerbil_grammar_mask(s, again) != GERBIL_OK || memcmp(mask, again, (size_t)nw * 8)) abort();
            }
        } else if (op == 2) { /* the forced token is the only allowed one */
            const int32_t f = gerbil_grammar_forced_token(s, scratch);
            if (f >= 0 && (n_allowed != 1 || !bit(mask, f))) abort();
            if (f < 0 && n_allowed == 1) abort();
            char fb[64];
            (void)gerbil_grammar_forced_bytes(s, fb, sizeof fb);
        } else { /* raw bytes from the walk itself */
            size_t n = (size_t)(arg % 8) + 1;
            if (n > n_walk - i - 1) n = n_walk - i - 1;
            (void)gerbil_grammar_accept_bytes(s, (const char *)walk + i + 1, n);
            i += n;
        }
    }
    int n_states, n_nodes, n_rules;
    gerbil_grammar_stats(g, &n_states, &n_nodes, &n_rules);
    gerbil_grammar_state_free(t);
    gerbil_grammar_state_free(s);
    gerbil_grammar_free(g);
    free(mask);
    free(again);
    free(scratch);
    return 0;
}
