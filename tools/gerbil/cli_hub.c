/* Models by name on the command line: hub parameters, reference resolution, and the
 * download progress: a bar redrawn in place on a terminal, a plain line every few
 * seconds otherwise (logs, CI). */
#include "cli.h"
#include "hub/hub.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct progress_view {
    int tty, started;
    double last_line_s;
};

static const char *fmt_eta(double s, char *buf, size_t cap) {
    if (s < 0 || s > 360000) snprintf(buf, cap, "--:--");
    else if (s >= 3600) snprintf(buf, cap, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else snprintf(buf, cap, "%d:%02d", (int)s / 60, (int)s % 60);
    return buf;
}

static void on_progress(void *user, const gerbil_hub_progress *p) {
    struct progress_view *v = user;
    char a[32], b[32], c[32], e[32];
    if (!v->started) {
        v->started = 1;
        fprintf(stderr, "pulling %s@%s (commit %.12s): %d file%s, %s\n", p->repo, p->revision, p->commit, p->n_files,
                p->n_files == 1 ? "" : "s", hub_fmt_bytes(p->bytes_total, a, sizeof a));
    }
    double speed = p->elapsed_s > 0.2 ? p->bytes_done / p->elapsed_s : 0;
    double eta = speed > 0 ? (p->bytes_total - p->bytes_done) / speed : -1;
    double pct = p->bytes_total ? 100.0 * p->bytes_done / p->bytes_total : 100.0;
    if (v->tty) {
        char bar[21];
        int fill = (int)(pct / 5);
        for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
        bar[20] = 0;
        fprintf(stderr, "\r[%s] %5.1f%%  %s / %s  %s/s  ETA %s  (%d/%d files)\033[K", bar, pct,
                hub_fmt_bytes(p->bytes_done, a, sizeof a), hub_fmt_bytes(p->bytes_total, b, sizeof b),
                hub_fmt_bytes((uint64_t)speed, c, sizeof c), fmt_eta(eta, e, sizeof e), p->n_files_done, p->n_files);
        if (p->done) fputc('\n', stderr);
    } else if (!p->done && p->elapsed_s - v->last_line_s >= 5.0) {
        v->last_line_s = p->elapsed_s;
        fprintf(stderr, "  %s / %s (%.0f%%), %s/s, ETA %s, %d/%d files\n", hub_fmt_bytes(p->bytes_done, a, sizeof a),
                hub_fmt_bytes(p->bytes_total, b, sizeof b), pct, hub_fmt_bytes((uint64_t)speed, c, sizeof c),
                fmt_eta(eta, e, sizeof e), p->n_files_done, p->n_files);
    }
    if (p->done)
        fprintf(stderr, "pulled %s: %s in %.1f s (%s/s)\n", p->repo, hub_fmt_bytes(p->bytes_total, a, sizeof a),
                p->elapsed_s, hub_fmt_bytes((uint64_t)(p->elapsed_s > 0 ? p->bytes_total / p->elapsed_s : 0), b, sizeof b));
    fflush(stderr);
}

static void on_notice(void *user, const char *msg) {
    (void)user;
    fprintf(stderr, "gerbil: %s\n", msg);
}

/* One view per process: the CLI pulls one reference at a time. */
static struct progress_view view;

gerbil_hub_params cli_hub_params(const char *token) {
    gerbil_hub_params p = gerbil_hub_default_params();
    if (token && token[0]) p.token = token;
    view = (struct progress_view){.tty = isatty(2)};
    p.progress = on_progress;
    p.notice = on_notice;
    p.user = &view;
    return p;
}

int cli_hub_transferred(void) { return view.started; }

int cli_resolve_ref(const char *ref, const char *token, char *out, size_t cap) {
    gerbil_hub_params p = cli_hub_params(token);
    char *path = NULL;
    gerbil_status st = gerbil_hub_resolve(ref, &p, &path);
    if (st != GERBIL_OK) {
        if (view.tty && view.started) fputc('\n', stderr);
        fprintf(stderr, "gerbil: cannot get model %s: %s: %s\n", ref, gerbil_status_name(st), gerbil_last_error());
        return 1;
    }
    int fits = strlen(path) < cap;
    if (fits) memcpy(out, path, strlen(path) + 1);
    else fprintf(stderr, "gerbil: model path too long: %s\n", path);
    free(path);
    return fits ? 0 : 1;
}
