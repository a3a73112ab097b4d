/* Building and checking the byte-level grammar (grammar.h). */
#include "grammar/grammar.h"
#include "base/status.h"

#include <stdlib.h>
#include <string.h>

void gir_init(gir *g) {
    memset(g, 0, sizeof *g);
    g->root = -1;
}

void gir_free(gir *g) {
    for (int i = 0; i < g->n_rules; i++) {
        free(g->rules[i].name);
        free(g->rules[i].alts);
    }
    free(g->rules);
    free(g->el);
    free(g->sets);
    free(g->set_slots);
    memset(g, 0, sizeof *g);
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

int gir_rule(gir *g, const char *name) {
    if (grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules)) { g->oom = 1; return 0; }
    grule *r = &g->rules[g->n_rules];
    memset(r, 0, sizeof *r);
    if (name && !(r->name = strdup(name))) g->oom = 1;
    return g->n_rules++;
}

int gir_find(const gir *g, const char *name) {
    for (int i = 0; i < g->n_rules; i++)
        if (g->rules[i].name && !strcmp(g->rules[i].name, name)) return i;
    return -1;
}

void gseq_free(gseq *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

void gseq_push(gseq *s, int kind, int arg) {
    if (grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) { s->oom = 1; return; }
    s->v[s->n++] = (gelem){.kind = (uint32_t)kind, .arg = (uint32_t)arg};
}

void gir_alt(gir *g, int r, gseq *seq) {
    if (seq->oom) g->oom = 1;
    grule *ru = &g->rules[r];
    if (grow((void **)&g->el, &g->cap_el, g->n_el + seq->n + 1, sizeof *g->el) ||
        grow((void **)&ru->alts, &ru->cap_alts, ru->n_alts + 1, sizeof *ru->alts)) {
        g->oom = 1;
        seq->n = 0;
        return;
    }
    ru = &g->rules[r];
    ru->alts[ru->n_alts++] = g->n_el;
    ru->defined = 1;
    if (seq->n) memcpy(g->el + g->n_el, seq->v, (size_t)seq->n * sizeof *seq->v);
    g->n_el += seq->n;
    g->el[g->n_el++] = (gelem){.kind = GE_END, .arg = 0};
    seq->n = 0;
}

static uint64_t set_hash(const gbyteset *s) {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 4; i++) h = (h ^ s->w[i]) * 0xff51afd7ed558ccdULL;
    return h ^ (h >> 29);
}

int gir_set(gir *g, const gbyteset *s) {
    if (g->n_sets * 2 >= g->set_mask) {
        int m = g->set_mask ? (g->set_mask + 1) * 2 : 256;
        int32_t *slots = malloc((size_t)m * sizeof *slots);
        if (!slots) { g->oom = 1; return 0; }
        for (int i = 0; i < m; i++) slots[i] = -1;
        for (int i = 0; i < g->n_sets; i++) {
            uint64_t h = set_hash(&g->sets[i]) & (uint64_t)(m - 1);
            while (slots[h] >= 0) h = (h + 1) & (uint64_t)(m - 1);
            slots[h] = i;
        }
        free(g->set_slots);
        g->set_slots = slots;
        g->set_mask = m - 1;
    }
    uint64_t h = set_hash(s) & (uint64_t)g->set_mask;
    while (g->set_slots[h] >= 0) {
        if (!memcmp(&g->sets[g->set_slots[h]], s, sizeof *s)) return g->set_slots[h];
        h = (h + 1) & (uint64_t)g->set_mask;
    }
    if (grow((void **)&g->sets, &g->cap_sets, g->n_sets + 1, sizeof *g->sets)) { g->oom = 1; return 0; }
    g->sets[g->n_sets] = *s;
    g->set_slots[h] = g->n_sets;
    return g->n_sets++;
}

void gseq_byteset(gir *g, gseq *s, const gbyteset *set) { gseq_push(s, GE_BYTES, gir_set(g, set)); }

void gseq_byte(gir *g, gseq *s, unsigned b) {
    gbyteset set = {{0}};
    gbs_add(&set, b & 255);
    gseq_byteset(g, s, &set);
}

void gseq_lit(gir *g, gseq *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) gseq_byte(g, s, (unsigned char)p[i]);
}

int gir_rule_lit(gir *g, const char *p, size_t n) {
    int r = gir_rule(g, NULL);
    gseq s = {0};
    gseq_lit(g, &s, p, n);
    gir_alt(g, r, &s);
    gseq_free(&s);
    return r;
}

int gir_wrap_set(gir *g, const gbyteset *set) {
    int r = gir_rule(g, NULL);
    gseq s = {0};
    gseq_byteset(g, &s, set);
    gir_alt(g, r, &s);
    gseq_free(&s);
    return r;
}

int gir_repeat(gir *g, int x, int min, int max) {
    gseq s = {0};
    int tail; /* what follows the min mandatory copies */
    if (max < 0) {
        /* star ::= x star | "" */
        tail = gir_rule(g, NULL);
        gseq_rule(&s, x);
        gseq_rule(&s, tail);
        gir_alt(g, tail, &s);
        gir_alt(g, tail, &s);
    } else {
        /* opt_k ::= x opt_{k-1} | "" ; opt_0 ::= "" */
        tail = gir_rule(g, NULL);
        gir_alt(g, tail, &s);
        int at_horizon = -1; /* opt_{GIR_HORIZON + 1} */
        for (int k = 1; k <= max - min; k++) {
            int r = gir_rule(g, NULL);
            gseq_rule(&s, x);
            gseq_rule(&s, tail);
            gir_alt(g, r, &s);
            gir_alt(g, r, &s);
            tail = r;
            if (k == GIR_HORIZON + 1) at_horizon = r;
            /* each copy of x takes a byte or is empty, so under GIR_HORIZON bytes opt_k and
             * opt_{GIR_HORIZON + 1} are the same language prefix for prefix */
            if (k > GIR_HORIZON + 1 && !g->oom) g->rules[r].horizon_of = at_horizon + 1;
        }
    }
    if (min == 0) { gseq_free(&s); return tail; }
    int r = gir_rule(g, NULL);
    for (int i = 0; i < min; i++) gseq_rule(&s, x);
    gseq_rule(&s, tail);
    gir_alt(g, r, &s);
    gseq_free(&s);
    return r;
}

/* ---- UTF-8 ranges ---- */
static int utf8_enc(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)); o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

static void utf8_split(gir *g, int r, uint32_t lo, uint32_t hi, gbyteset *ascii) {
    if (lo > hi) return;
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            utf8_split(g, r, lo, bounds[i], ascii);
            utf8_split(g, r, bounds[i] + 1, hi, ascii);
            return;
        }
    if (hi < 0x80) { gbs_add_range(ascii, lo, hi); return; }
    unsigned char a[4], b[4];
    int n = utf8_enc(lo, a);
    utf8_enc(hi, b);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_split(g, r, lo, lo | m, ascii);
                utf8_split(g, r, (lo | m) + 1, hi, ascii);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(g, r, lo, (hi & ~m) - 1, ascii);
                utf8_split(g, r, hi & ~m, hi, ascii);
                return;
            }
        }
    }
    gseq s = {0};
    for (int i = 0; i < n; i++) {
        gbyteset set = {{0}};
        gbs_add_range(&set, a[i], b[i]);
        gseq_byteset(g, &s, &set);
    }
    gir_alt(g, r, &s);
    gseq_free(&s);
}

static int cmp_range(const void *x, const void *y) {
    const uint32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

int gir_char_class(gir *g, const uint32_t *lo, const uint32_t *hi, int n, int negate) {
    /* normalize: sorted, merged, surrogates removed, complemented if asked */
    uint32_t (*rg)[2] = malloc(((size_t)n * 2 + 4) * sizeof *rg);
    if (!rg) { g->oom = 1; return gir_rule(g, NULL); }
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t a = lo[i], b = hi[i] > 0x10FFFF ? 0x10FFFF : hi[i];
        if (a > b) continue;
        rg[m][0] = a;
        rg[m][1] = b;
        m++;
    }
    qsort(rg, (size_t)m, sizeof *rg, cmp_range);
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k && rg[i][0] <= rg[k - 1][1] + 1) {
            if (rg[i][1] > rg[k - 1][1]) rg[k - 1][1] = rg[i][1];
        } else {
            rg[k][0] = rg[i][0];
            rg[k][1] = rg[i][1];
            k++;
        }
    }
    if (negate) {
        uint32_t (*cg)[2] = malloc(((size_t)k + 2) * sizeof *cg);
        if (!cg) { free(rg); g->oom = 1; return gir_rule(g, NULL); }
        int c = 0;
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (rg[i][0] > next) { cg[c][0] = next; cg[c][1] = rg[i][0] - 1; c++; }
            next = rg[i][1] + 1;
        }
        if (next <= 0x10FFFF) { cg[c][0] = next; cg[c][1] = 0x10FFFF; c++; }
        free(rg);
        rg = cg;
        k = c;
    }
    int r = gir_rule(g, NULL);
    gbyteset ascii = {{0}};
    for (int i = 0; i < k; i++) {
        uint32_t a = rg[i][0], b = rg[i][1];
        /* skip the surrogates */
        if (a <= 0xDFFF && b >= 0xD800) {
            if (a < 0xD800) utf8_split(g, r, a, 0xD7FF, &ascii);
            if (b > 0xDFFF) utf8_split(g, r, 0xE000, b, &ascii);
        } else {
            utf8_split(g, r, a, b, &ascii);
        }
    }
    if (ascii.w[0] | ascii.w[1]) {
        gseq s = {0};
        gseq_byteset(g, &s, &ascii);
        gir_alt(g, r, &s);
        gseq_free(&s);
    }
    free(rg);
    g->rules[r].defined = 1; /* an empty class is a rule without alternatives: matches nothing */
    return r;
}

/* ---- checks ---- */
gerbil_status gir_check(gir *g) {
    if (g->oom) return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
    if (g->root < 0 || g->root >= g->n_rules || !g->rules[g->root].defined)
        return err_set(GERBIL_ERR_FORMAT, "grammar: no root rule");
    for (int i = 0; i < g->n_el; i++)
        if (g->el[i].kind == GE_RULE) {
            const grule *r = &g->rules[g->el[i].arg];
            if (!r->defined) return err_set(GERBIL_ERR_FORMAT, "grammar: undefined rule \"%s\"", r->name ? r->name : "?");
        }
    const int n = g->n_rules;
    /* nullable rules, to a fixed point */
    uint8_t *nullable = calloc((size_t)n, 1);
    if (!nullable) return err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
                int p = g->rules[r].alts[a], ok = 1;
                for (; g->el[p].kind != GE_END; p++)
                    if (g->el[p].kind == GE_BYTES || !nullable[g->el[p].arg]) { ok = 0; break; }
                if (ok) { nullable[r] = 1; changed = 1; }
            }
        }
    }
    /* left recursion: rule r reaches rule s at its leftmost position; the edge is
     * "growing" unless s sits in tail position. A cycle through a growing edge would
     * push frames forever. DFS with colours over growing-or-not edges, tracking
     * whether the current path has a growing edge is costly; instead: a cycle in the
     * graph of all edges that contains a growing edge <=> some growing edge u->v with
     * v reaching u. Reachability by DFS per growing edge target is fine for grammar
     * sizes seen here (bounded by edges x rules, with a cap). */
    gerbil_status st = GERBIL_OK;
    int *stack = malloc((size_t)(n + 1) * sizeof *stack);
    uint8_t *seen = malloc((size_t)n);
    /* adjacency lists */
    int *deg = calloc((size_t)n + 1, sizeof *deg);
    if (!stack || !seen || !deg) { st = err_set(GERBIL_ERR_NOMEM, "grammar: out of memory"); goto done; }
    {
        /* edges: collect (u, v, growing) */
        int ne = 0, cap = 64;
        int (*E)[3] = malloc((size_t)cap * sizeof *E);
        if (!E) { st = err_set(GERBIL_ERR_NOMEM, "grammar: out of memory"); goto done; }
        for (int r = 0; r < n; r++)
            for (int a = 0; a < g->rules[r].n_alts; a++)
                for (int p = g->rules[r].alts[a]; g->el[p].kind == GE_RULE; p++) {
                    if (ne == cap) {
                        cap *= 2;
                        void *q = realloc(E, (size_t)cap * sizeof *E);
                        if (!q) { free(E); st = err_set(GERBIL_ERR_NOMEM, "grammar: out of memory"); goto done; }
                        E = q;
                    }
                    E[ne][0] = r;
                    E[ne][1] = (int)g->el[p].arg;
                    E[ne][2] = g->el[p + 1].kind != GE_END;
                    ne++;
                    if (!nullable[g->el[p].arg]) break;
                }
        /* CSR */
        for (int e = 0; e < ne; e++) deg[E[e][0] + 1]++;
        for (int i = 0; i < n; i++) deg[i + 1] += deg[i];
        int *adj = malloc((size_t)(ne ? ne : 1) * sizeof *adj), *fill = calloc((size_t)n, sizeof *fill);
        if (!adj || !fill) {
            free(adj); free(fill); free(E);
            st = err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
            goto done;
        }
        for (int e = 0; e < ne; e++) adj[deg[E[e][0]] + fill[E[e][0]]++] = E[e][1];
        /* strongly connected components (Tarjan, iterative): a growing edge inside one
         * component is a left-recursive cycle */
        int *idx = malloc((size_t)n * sizeof *idx), *low = malloc((size_t)n * sizeof *low);
        int *comp = malloc((size_t)n * sizeof *comp), *it = malloc((size_t)n * sizeof *it);
        int *call = malloc((size_t)n * sizeof *call);
        if (!idx || !low || !comp || !it || !call) {
            st = err_set(GERBIL_ERR_NOMEM, "grammar: out of memory");
        } else {
            for (int x = 0; x < n; x++) { idx[x] = -1; seen[x] = 0; }
            int counter = 0, sp = 0, ncomp = 0;
            for (int r0 = 0; r0 < n; r0++) {
                if (idx[r0] >= 0) continue;
                int cp = 0;
                call[cp++] = r0;
                idx[r0] = low[r0] = counter++;
                it[r0] = deg[r0];
                stack[sp++] = r0;
                seen[r0] = 1;
                while (cp) {
                    int x = call[cp - 1];
                    if (it[x] < deg[x + 1]) {
                        int y = adj[it[x]++];
                        if (idx[y] < 0) {
                            idx[y] = low[y] = counter++;
                            it[y] = deg[y];
                            stack[sp++] = y;
                            seen[y] = 1;
                            call[cp++] = y;
                        } else if (seen[y] && idx[y] < low[x]) {
                            low[x] = idx[y];
                        }
                        continue;
                    }
                    if (low[x] == idx[x]) {
                        int y;
                        do { y = stack[--sp]; seen[y] = 0; comp[y] = ncomp; } while (y != x);
                        ncomp++;
                    }
                    cp--;
                    if (cp && low[x] < low[call[cp - 1]]) low[call[cp - 1]] = low[x];
                }
            }
            for (int e = 0; e < ne; e++)
                if (E[e][2] && comp[E[e][0]] == comp[E[e][1]]) {
                    int u = E[e][0];
                    st = err_set(GERBIL_ERR_UNSUPPORTED, "grammar: rule \"%s\" is left-recursive (it can start with "
                                 "itself); rewrite it with repetition", g->rules[u].name ? g->rules[u].name : "(anonymous)");
                    break;
                }
        }
        free(idx);
        free(low);
        free(comp);
        free(it);
        free(call);
        free(adj);
        free(fill);
        free(E);
    }
done:
    free(stack);
    free(seen);
    free(deg);
    free(nullable);
    return st;
}
