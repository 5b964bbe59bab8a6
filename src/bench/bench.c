/*
 * bench.c — kl_bench: timing a callable the way torch.utils.benchmark's
 * Timer does (warm-up, enough runs for a stable median, quartiles, a noise
 * warning), and printing results one per line or grouped like its Compare.
 *
 * The clock is an option so tests can drive the statistics with a fake one:
 * no test asserts anything about real time.
 */
#include "kiln.h"

#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

kl_bench_options kl_bench_options_default(void) {
    return (kl_bench_options){
        .label = "",
        .sub_label = "",
        .description = "",
        .warmup = 3,
        .min_runs = 10,
        .max_runs = 100000,
        .min_time_s = 0.5,
    };
}

static double monotonic_s(void *unused) {
    (void)unused;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy's default percentile: the value at rank p*(n-1), interpolated */
static double at_rank(const double *t, int n, double p) {
    double r = p * (n - 1);
    int lo = (int)floor(r);
    if (lo >= n - 1) return t[n - 1];
    return t[lo] + (r - lo) * (t[lo + 1] - t[lo]);
}

void kl_bench_quartiles(double *t, int n, double *q1, double *median, double *q3) {
    if (!t || n < 1) {
        *q1 = *median = *q3 = NAN;
        return;
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    *q1 = at_rank(t, n, 0.25);
    *median = at_rank(t, n, 0.5);
    *q3 = at_rank(t, n, 0.75);
}

static void copy_str(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

/* One call inside its own scope, so its temporaries die before the next. */
static int call_scoped(kl_bench_callable fn, void *user) {
    kl_scope_begin();
    int rc = fn(user);
    kl_scope_end();
    return rc;
}

int kl_bench(kl_bench_callable fn, void *user, const kl_bench_options *opts, kl_bench_result *out) {
    kl_bench_options o = opts ? *opts : kl_bench_options_default();
    if (!fn || !out) return ke_err(KL_ERR_ARG, "bench", "NULL %s", !fn ? "callable" : "result");
    if (o.min_runs < 1 || o.max_runs < o.min_runs || o.warmup < 0 || o.threads < 0 || !(o.min_time_s >= 0))
        return ke_err(KL_ERR_ARG, "bench",
                      "invalid options: warmup %d, min_runs %d, max_runs %d, min_time_s %g, threads %d (want "
                      "warmup >= 0, 1 <= min_runs <= max_runs, min_time_s >= 0, threads >= 0)",
                      o.warmup, o.min_runs, o.max_runs, o.min_time_s, o.threads);
    kl_bench_clock clock = o.clock ? o.clock : monotonic_s;
    double *t = malloc(sizeof(double) * (size_t)o.max_runs);
    if (!t) return ke_err(KL_ERR_OOM, "bench", "out of memory for %d timings", o.max_runs);
    int saved_threads = kl_get_num_threads();
    if (o.threads) kl_set_num_threads(o.threads);
    memset(out, 0, sizeof *out);
    copy_str(out->label, sizeof out->label, o.label);
    copy_str(out->sub_label, sizeof out->sub_label, o.sub_label);
    copy_str(out->description, sizeof out->description, o.description);
    out->threads = kl_get_num_threads();
    int rc = 0, n = 0;
    for (int w = 0; w < o.warmup && rc == 0; w++) rc = call_scoped(fn, user);
    double total = 0;
    while (rc == 0 && n < o.max_runs && (n < o.min_runs || total < o.min_time_s)) {
        double s = clock(o.clock_user);
        rc = call_scoped(fn, user);
        t[n] = clock(o.clock_user) - s;
        total += t[n++];
    }
    if (o.threads) kl_set_num_threads(saved_threads);
    if (rc != 0) {
        free(t);
        if (kl_last_status() == KL_OK) ke_err(KL_ERR_STATE, "bench", "the callable returned %d without an error", rc);
        return -1;
    }
    out->runs = n;
    out->total_s = total;
    out->mean_s = total / n;
    kl_bench_quartiles(t, n, &out->q1_s, &out->median_s, &out->q3_s);
    out->min_s = t[0];
    out->iqr_s = out->q3_s - out->q1_s;
    out->noisy = out->iqr_s > 0.1 * out->median_s;
    if (out->noisy)
        snprintf(out->warning, sizeof out->warning, "IQR %.1f%% of the median: noisy measurement",
                 out->median_s > 0 ? 100 * out->iqr_s / out->median_s : INFINITY);
    free(t);
    return 0;
}

typedef struct fn_call {
    kl_fn *f;
    kl_tensor *const *in;
    int n_in, n_out;
} fn_call;

static int call_fn(void *u) {
    const fn_call *c = u;
    kl_tensor *out[64];
    return kl_fn_call(c->f, c->in, c->n_in, out, c->n_out);
}

int kl_bench_fn(kl_fn *f, kl_tensor *const *inputs, int n_in, int n_out, const kl_bench_options *opts,
                kl_bench_result *out) {
    if (!f || n_in < 0 || n_in > 64 || n_out < 0 || n_out > 64 || (n_in && !inputs))
        return ke_err(KL_ERR_ARG, "bench_fn", "%s (n_in %d, n_out %d: want 0..64, inputs for n_in > 0)",
                      !f ? "NULL function" : "bad counts", n_in, n_out);
    fn_call c = {f, inputs, n_in, n_out};
    return kl_bench(call_fn, &c, opts, out);
}

/* ---- printing ------------------------------------------------------------- */

/* One unit for a whole table, chosen by its smallest time (as Compare does). */
static void pick_unit(double smallest_s, double *scale, const char **name, const char **word) {
    if (smallest_s < 1e-3) *scale = 1e6, *name = "us", *word = "microseconds";
    else if (smallest_s < 1) *scale = 1e3, *name = "ms", *word = "milliseconds";
    else *scale = 1, *name = "s", *word = "seconds";
}

void kl_bench_print_row(const kl_bench_result *r, FILE *stream) {
    if (!r || !stream) return;
    double scale;
    const char *unit, *word;
    pick_unit(r->median_s, &scale, &unit, &word);
    fprintf(stream, "%s", r->label);
    if (r->sub_label[0]) fprintf(stream, " / %s", r->sub_label);
    if (r->description[0]) fprintf(stream, " / %s", r->description);
    fprintf(stream, ": median %.4g %s, IQR %.4g %s (%.1f%%), %d runs, %d threads", r->median_s * scale, unit,
            r->iqr_s * scale, unit, r->median_s > 0 ? 100 * r->iqr_s / r->median_s : 0.0, r->runs, r->threads);
    if (r->noisy) fprintf(stream, "  WARNING: %s", r->warning);
    fputc('\n', stream);
}

/* Index of s in names[0..n), appending it if absent. */
static int intern(const char **names, int *n, const char *s) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(names[i], s)) return i;
    names[*n] = s;
    return (*n)++;
}

static int print_table(const kl_bench_result *rows, int n, const char *label, FILE *f) {
    const char **cols = malloc(sizeof(char *) * (size_t)n), **subs = malloc(sizeof(char *) * (size_t)n);
    const kl_bench_result **cell = calloc((size_t)n * (size_t)n, sizeof *cell);
    if (!cols || !subs || !cell) {
        free(cols), free(subs), free(cell);
        return ke_err(KL_ERR_OOM, "bench_compare", "out of memory");
    }
    int nc = 0, ns = 0;
    double smallest = INFINITY;
    for (int i = 0; i < n; i++) {
        if (strcmp(rows[i].label, label)) continue;
        int c = intern(cols, &nc, rows[i].description), s = intern(subs, &ns, rows[i].sub_label);
        cell[s * n + c] = &rows[i]; /* a repeated (row, column): the last one wins */
        if (rows[i].median_s < smallest) smallest = rows[i].median_s;
    }
    double scale;
    const char *unit, *word;
    pick_unit(smallest, &scale, &unit, &word);
    /* about four significant digits for the smallest cell */
    int decimals = smallest * scale < 10 ? 3 : smallest * scale < 100 ? 2 : 1;
    int w0 = 1, cw = 10;
    for (int s = 0; s < ns; s++)
        if ((int)strlen(subs[s]) > w0) w0 = (int)strlen(subs[s]);
    for (int c = 0; c < nc; c++)
        if ((int)strlen(cols[c]) + 2 > cw) cw = (int)strlen(cols[c]) + 2;
    int width = w0 + 2 + nc * (cw + 5);
    int dashes = width - (int)strlen(label) - 4;
    if (dashes < 2) dashes = 2;
    fprintf(f, "[%.*s %s %.*s]\n", dashes / 2,
            "------------------------------------------------------------------------------------------", label,
            dashes - dashes / 2,
            "------------------------------------------------------------------------------------------");
    fprintf(f, "%*s  ", w0, "");
    for (int c = 0; c < nc; c++) fprintf(f, " | %*s  ", cw, cols[c]);
    fputc('\n', f);
    int noisy = 0;
    for (int s = 0; s < ns; s++) {
        fprintf(f, "%*s  ", w0, subs[s]);
        for (int c = 0; c < nc; c++) {
            const kl_bench_result *r = cell[s * n + c];
            if (!r) {
                fprintf(f, " | %*s  ", cw, "-");
                continue;
            }
            noisy |= r->noisy;
            fprintf(f, " | %*.*f%s", cw, decimals, r->median_s * scale, r->noisy ? " !" : "  ");
        }
        fputc('\n', f);
    }
    fprintf(f, "Times are in %s (%s).%s\n\n", word, unit, noisy ? " ! marks a noisy median (IQR > 10% of it)." : "");
    free(cols), free(subs), free(cell);
    return 0;
}

int kl_bench_compare(const kl_bench_result *rows, int n, FILE *stream) {
    if ((!rows && n > 0) || n < 0 || !stream)
        return ke_err(KL_ERR_ARG, "bench_compare", "%s", !stream ? "NULL stream" : n < 0 ? "negative count" : "NULL rows");
    const char **labels = malloc(sizeof(char *) * (size_t)(n ? n : 1));
    if (!labels) return ke_err(KL_ERR_OOM, "bench_compare", "out of memory");
    int nl = 0;
    for (int i = 0; i < n; i++) intern(labels, &nl, rows[i].label);
    int rc = 0;
    for (int l = 0; l < nl && rc == 0; l++) rc = print_table(rows, n, labels[l], stream);
    free(labels);
    return rc;
}
