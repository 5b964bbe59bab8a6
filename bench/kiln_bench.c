/*
 * kiln_bench.c — the kiln-bench command: shared/WORKLOADS.md's standard
 * workloads (defined once in src/bench/workloads.c) timed with kl_bench in
 * eager mode and each kl_compile mode, against the machine's own limits
 * (STREAM copy/add on 64 MiB arrays, cblas_sgemm 1024^3, measured at start
 * and cached for the day in the kernel cache folder), optionally beside
 * PyTorch (bench/torch_workloads.py). Output: a table, --json (docs/BENCH.md
 * documents the schema), --svg. Usage: kiln-bench --help.
 */
#include "kiln.h"

#include "diskcache.h"
#include "fused_ref.h"
#include "workloads.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef KB_TORCH_SCRIPT_SRC
#define KB_TORCH_SCRIPT_SRC ""
#endif
#ifndef KB_TORCH_SCRIPT_INSTALLED
#define KB_TORCH_SCRIPT_INSTALLED ""
#endif

enum { MAX_ROWS = 256, NMODES = 4 };

static const char *mode_names[NMODES] = {"eager", "TRACE_ONLY", "NO_FUSE", "FUSE"};
static const kl_compile_mode mode_of[NMODES] = {KL_COMPILE_OFF, KL_COMPILE_TRACE_ONLY, KL_COMPILE_NO_FUSE,
                                                KL_COMPILE_FUSE};
static const char *torch_systems[3] = {"torch_eager", "torchscript", "torch_compile"};

typedef struct row {
    char workload[24], size[32], mode[24];
    const char *status; /* "ok", "not installed", "error" */
    char note[200];
    bool standard, matmul_heavy;
    kl_bench_result r;
    double speedup;                          /* eager median / this median; NAN: none */
    int64_t kernels, library_calls;          /* -1: not applicable */
    double compile_cold_ms, compile_cached_ms, first_call_ms; /* NAN: not applicable */
    const char *check;                       /* "ok", "mismatch", NULL */
    double floor_bytes, flops, achieved, roofline; /* 0 / NAN where not applicable */
} row;

static row rows[MAX_ROWS];
static int nrows;

static struct {
    double copy_gbs, add_gbs, sgemm_gflops;
    bool from_cache;
} lim;

static struct {
    int threads, min_runs, warmup, json, quiet;
    double min_time;
    kw_size size;
    const char *svg, *device;
    bool torch;
    bool want_mode[NMODES];
    const char *workloads[16];
    int nworkloads;
} opt;

static struct {
    char name[3][64], status[3][24], detail[3][160];
    int n;
} torch_sys;

/* ---- small helpers --------------------------------------------------------------- */

static void die(const char *what) {
    fprintf(stderr, "kiln-bench: %s: %s\n", what, kl_last_status() ? kl_last_error() : "failed");
    exit(1);
}

static row *new_row(const kw_case *c, const char *mode) {
    if (nrows == MAX_ROWS) {
        fprintf(stderr, "kiln-bench: more than %d rows\n", MAX_ROWS);
        exit(1);
    }
    row *r = &rows[nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->workload, sizeof r->workload, "%s", c->def->id);
    snprintf(r->size, sizeof r->size, "%s", c->size_name);
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    r->status = "ok";
    r->standard = c->standard, r->matmul_heavy = c->def->matmul_heavy;
    r->speedup = r->compile_cold_ms = r->compile_cached_ms = r->first_call_ms = r->achieved = r->roofline = NAN;
    r->kernels = r->library_calls = -1;
    r->floor_bytes = c->floor_bytes, r->flops = c->flops;
    return r;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Achieved rate and its fraction of the machine's limit. */
static void rate(row *r) {
    if (!(r->r.median_s > 0)) return;
    bool cpu_limits = !strcmp(opt.device, "cpu") || !strncmp(r->mode, "torch", 5);
    if (r->matmul_heavy && r->flops > 0) {
        r->achieved = r->flops / r->r.median_s / 1e9;
        if (lim.sgemm_gflops > 0 && cpu_limits) r->roofline = r->achieved / lim.sgemm_gflops;
    } else if (r->floor_bytes > 0) {
        r->achieved = r->floor_bytes / r->r.median_s / 1e9;
        double bw = fmax(lim.copy_gbs, lim.add_gbs);
        if (bw > 0 && cpu_limits) r->roofline = r->achieved / bw;
    }
}

/* ---- progress bar (stderr, only on a terminal) ------------------------------------ */

static int progress_total, progress_done, progress_on;

static void progress(const char *what) {
    if (!progress_on) return;
    enum { W = 30 };
    int fill = progress_total ? progress_done * W / progress_total : 0;
    char bar[W + 1];
    for (int i = 0; i < W; i++) bar[i] = i < fill ? '#' : '.';
    bar[W] = 0;
    fprintf(stderr, "\r\033[K[%s] %d/%d %s", bar, progress_done, progress_total, what);
    fflush(stderr);
}

static void progress_end(void) {
    if (progress_on) fprintf(stderr, "\r\033[K");
}

/* ---- machine limits ------------------------------------------------------------------ */

typedef struct stream_ctx {
    float *a, *b, *c;
    int64_t n;
} stream_ctx;

static int copy_fn(void *u) {
    stream_ctx *s = u;
    fr_stream_copy(s->a, s->c, s->n);
    return 0;
}

static int add_fn(void *u) {
    stream_ctx *s = u;
    fr_stream_add(s->a, s->b, s->c, s->n);
    return 0;
}

static int sgemm_fn(void *u) {
    stream_ctx *s = u;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1.0f, s->a, 1024, s->b, 1024, 0.0f,
                s->c, 1024);
    return 0;
}

static kl_bench_options method(const char *label) {
    kl_bench_options o = kl_bench_options_default();
    o.label = label;
    o.min_runs = opt.min_runs, o.min_time_s = opt.min_time, o.warmup = opt.warmup, o.threads = opt.threads;
    return o;
}

static void measure_limits(void) {
    const int64_t n = 16 << 20; /* 64 MiB of f32 per array */
    stream_ctx s = {aligned_alloc(64, (size_t)n * 4), aligned_alloc(64, (size_t)n * 4), aligned_alloc(64, (size_t)n * 4), n};
    if (!s.a || !s.b || !s.c) {
        fprintf(stderr, "kiln-bench: out of memory for the STREAM arrays\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) s.a[i] = 1, s.b[i] = 2, s.c[i] = 0;
    kl_bench_result r;
    kl_bench_options o = method("stream_copy");
    if (kl_bench(copy_fn, &s, &o, &r)) die("STREAM copy");
    lim.copy_gbs = 8.0 * n / r.median_s / 1e9;
    o = method("stream_add");
    if (kl_bench(add_fn, &s, &o, &r)) die("STREAM add");
    lim.add_gbs = 12.0 * n / r.median_s / 1e9;
    for (int64_t i = 0; i < 1024 * 1024; i++) s.a[i] = (float)(i % 7) * 0.1f, s.b[i] = (float)(i % 5) * 0.1f;
    openblas_set_num_threads(opt.threads);
    o = method("sgemm");
    if (kl_bench(sgemm_fn, &s, &o, &r)) die("sgemm");
    lim.sgemm_gflops = 2.0 * 1024 * 1024 * 1024 / r.median_s / 1e9;
    free(s.a), free(s.b), free(s.c);
}

/* The day's limits for this thread count, from the kernel cache folder
 * (measured and stored there when absent). Quick runs (min_time below
 * WORKLOADS.md's 0.5 s) neither read nor write the cache. */
static void limits(const char *cache_dir) {
    char path[1024] = "";
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    bool cacheable = cache_dir && opt.min_time >= 0.5 && opt.min_runs >= 10;
    if (cacheable) {
        snprintf(path, sizeof path, "%s/kiln-bench-limits-%04d-%02d-%02d-t%d.txt", cache_dir, tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, opt.threads);
        FILE *f = fopen(path, "r");
        if (f) {
            int got = fscanf(f, "stream_copy_gbs %lf stream_add_gbs %lf sgemm_gflops %lf", &lim.copy_gbs, &lim.add_gbs,
                             &lim.sgemm_gflops);
            fclose(f);
            if (got == 3 && lim.copy_gbs > 0 && lim.add_gbs > 0 && lim.sgemm_gflops > 0) {
                lim.from_cache = true;
                return;
            }
        }
    }
    progress("machine limits (STREAM, sgemm)");
    measure_limits();
    if (!cacheable) return;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", cache_dir);
    if (ke_make_dirs(dir)) return;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "stream_copy_gbs %.6g\nstream_add_gbs %.6g\nsgemm_gflops %.6g\n", lim.copy_gbs, lim.add_gbs,
            lim.sgemm_gflops);
    if (fclose(f) == 0) rename(tmp, path);
    else unlink(tmp);
}

/* ---- Kiln rows ---------------------------------------------------------------------- */

typedef struct call_ctx {
    kw_case *c;
    kl_fn *f;
    int cuda;
} call_ctx;

static int call_case(void *u) {
    call_ctx *x = u;
    if (kw_case_run(x->c, x->f, NULL)) return -1;
    return x->cuda ? kl_cuda_synchronize(0) : 0;
}

/* First call of a fresh kl_compile: returns its wall time, fills *compile_ms. */
static double first_call(call_ctx *x, kl_fn *f, double *compile_ms) {
    call_ctx y = *x;
    y.f = f;
    kl_scope_begin();
    double t0 = now_s();
    int rc = call_case(&y);
    double t = (now_s() - t0) * 1e3;
    kl_scope_end();
    if (rc) return NAN;
    kl_fn_stats st;
    kl_fn_get_stats(f, &st);
    *compile_ms = st.compile_ms;
    return t;
}

static void bench_mode(kw_case *c, int m, const row *eager, int cuda) {
    row *r = new_row(c, mode_names[m]);
    call_ctx x = {c, NULL, cuda};
    char label[64];
    snprintf(label, sizeof label, "%s %s", c->def->id, mode_names[m]);
    progress(label);
    if (m > 0) {
        /* cold: the first compile of the run; released, so its JIT code
         * goes too and the second compile loads from the disk cache */
        kl_fn *cold = kw_case_compile(c, mode_of[m]);
        if (!cold) die("kl_compile");
        r->first_call_ms = first_call(&x, cold, &r->compile_cold_ms);
        kl_fn_release(cold);
        x.f = kw_case_compile(c, mode_of[m]);
        if (!x.f) die("kl_compile");
        double t = first_call(&x, x.f, &r->compile_cached_ms);
        if (isnan(t)) r->first_call_ms = NAN;
        if (isnan(r->first_call_ms)) {
            r->status = "error";
            snprintf(r->note, sizeof r->note, "%s", kl_last_error());
            kl_clear_error();
            kl_fn_release(x.f);
            return;
        }
        char what[96] = "";
        int ok = kw_case_check(c, x.f, what, sizeof what);
        r->check = ok == 1 ? "ok" : ok == 0 ? "mismatch" : NULL;
        if (ok == 0) snprintf(r->note, sizeof r->note, "%s", what);
        if (ok < 0) snprintf(r->note, sizeof r->note, "not checked: %.180s", kl_last_error());
        kl_clear_error();
    }
    kl_bench_options o = method(c->def->id);
    o.sub_label = c->size_name, o.description = mode_names[m];
    if (kl_bench(call_case, &x, &o, &r->r)) {
        r->status = "error";
        snprintf(r->note, sizeof r->note, "%s", kl_last_error());
        kl_clear_error();
    } else {
        if (x.f) {
            kl_fn_stats st;
            kl_fn_get_stats(x.f, &st);
            r->kernels = st.kernels, r->library_calls = st.library_calls;
            if (st.eager_calls) {
                snprintf(r->note, sizeof r->note, "ran eagerly: %.180s", st.last_reason);
            }
        }
        if (m == 0) r->speedup = 1;
        else if (eager && eager->r.median_s > 0) r->speedup = eager->r.median_s / r->r.median_s;
        rate(r);
    }
    kl_fn_release(x.f);
    progress_done++;
}

/* ---- PyTorch rows ---------------------------------------------------------------------- */

static const char *torch_script(void) {
    const char *e = getenv("KILN_BENCH_TORCH_SCRIPT");
    if (e && e[0]) return e;
    if (KB_TORCH_SCRIPT_SRC[0] && access(KB_TORCH_SCRIPT_SRC, R_OK) == 0) return KB_TORCH_SCRIPT_SRC;
    if (KB_TORCH_SCRIPT_INSTALLED[0] && access(KB_TORCH_SCRIPT_INSTALLED, R_OK) == 0) return KB_TORCH_SCRIPT_INSTALLED;
    return NULL;
}

static void torch_unavailable(const char *why) {
    torch_sys.n = 3;
    for (int i = 0; i < 3; i++) {
        snprintf(torch_sys.name[i], sizeof torch_sys.name[i], "%s", torch_systems[i]);
        snprintf(torch_sys.status[i], sizeof torch_sys.status[i], "not installed");
        snprintf(torch_sys.detail[i], sizeof torch_sys.detail[i], "%s", why);
    }
}

static const char *torch_status(const char *sys, const char **detail) {
    for (int i = 0; i < torch_sys.n; i++)
        if (!strcmp(torch_sys.name[i], sys)) {
            if (detail) *detail = torch_sys.detail[i];
            return torch_sys.status[i];
        }
    if (detail) *detail = "the script did not report it";
    return "not installed";
}

/* Runs bench/torch_workloads.py over the same workloads, size, threads and
 * method; adds its rows after each workload's Kiln rows. */
static void run_torch(kw_case **cases, int ncases) {
    const char *script = torch_script();
    if (!script) {
        torch_unavailable("bench/torch_workloads.py not found (set KILN_BENCH_TORCH_SCRIPT)");
        return;
    }
    const char *py = getenv("KILN_BENCH_PYTHON");
    if (!py || !py[0]) py = "python3";
    char cmd[4096];
    int k = snprintf(cmd, sizeof cmd,
                     "'%s' '%s' --device %s --size %s --threads %d --min-time %g --min-runs %d --warmup %d --workloads ", py,
                     script, opt.device, kw_size_name(opt.size), opt.threads, opt.min_time, opt.min_runs, opt.warmup);
    for (int i = 0; i < ncases && k < (int)sizeof cmd - 32; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, "%s%s", i ? "," : "", cases[i]->def->id);
    snprintf(cmd + k, sizeof cmd - (size_t)k, " 2>&1");
    progress("PyTorch (bench/torch_workloads.py)");
    FILE *p = popen(cmd, "r");
    if (!p) {
        torch_unavailable("could not start python3");
        return;
    }
    char line[1024];
    int got_sys = 0;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        char a[64], b[64], c3[64];
        double med, q1, q3;
        int runs, off = 0;
        if (sscanf(line, "SYS %63s %63s %n", a, b, &off) == 2 && torch_sys.n < 3) {
            int i = torch_sys.n++;
            got_sys = 1;
            snprintf(torch_sys.name[i], sizeof torch_sys.name[i], "%s", a);
            snprintf(torch_sys.status[i], sizeof torch_sys.status[i], "%s", !strcmp(b, "ok") ? "ok" : "not installed");
            snprintf(torch_sys.detail[i], sizeof torch_sys.detail[i], "%s", line + off);
        } else if (sscanf(line, "RES %63s %63s %63s %lf %lf %lf %d", a, b, c3, &med, &q1, &q3, &runs) == 7) {
            for (int i = 0; i < ncases; i++) {
                if (strcmp(cases[i]->def->id, a)) continue;
                row *r = new_row(cases[i], b);
                r->r.median_s = med, r->r.q1_s = q1, r->r.q3_s = q3, r->r.iqr_s = q3 - q1, r->r.runs = runs;
                r->r.threads = opt.threads;
                r->r.noisy = r->r.iqr_s > 0.1 * med;
                if (strcmp(c3, r->size)) snprintf(r->note, sizeof r->note, "size %s differs from Kiln's %s", c3, r->size);
                for (int j = 0; j < nrows; j++)
                    if (!strcmp(rows[j].workload, a) && !strcmp(rows[j].mode, "eager") && rows[j].r.median_s > 0)
                        r->speedup = rows[j].r.median_s / med;
                rate(r);
            }
        } else if (sscanf(line, "ERR %63s %63s %n", a, b, &off) == 2) {
            for (int i = 0; i < ncases; i++) {
                if (strcmp(cases[i]->def->id, a)) continue;
                row *r = new_row(cases[i], b);
                r->status = "error";
                snprintf(r->note, sizeof r->note, "%s", line + off);
            }
        } else if (!got_sys) {
            /* python3 itself missing, or torch not importable: the first line says why */
            if (!torch_sys.n) torch_unavailable(line[0] ? line : "python3 printed nothing");
        }
    }
    int st = pclose(p);
    if (!torch_sys.n) torch_unavailable(st ? "python3 or torch not available" : "no output from the script");
}

/* Each requested workload gets a row for every PyTorch system the script did
 * not time: "not installed", never a silent omission. */
static void torch_missing_rows(kw_case **cases, int ncases) {
    for (int i = 0; i < ncases; i++)
        for (int s = 0; s < 3; s++) {
            int have = 0;
            for (int j = 0; j < nrows; j++)
                if (!strcmp(rows[j].workload, cases[i]->def->id) && !strcmp(rows[j].mode, torch_systems[s])) have = 1;
            if (have) continue;
            const char *detail;
            const char *status = torch_status(torch_systems[s], &detail);
            row *r = new_row(cases[i], torch_systems[s]);
            r->status = !strcmp(status, "ok") ? "error" : "not installed";
            snprintf(r->note, sizeof r->note, "%s", !strcmp(status, "ok") ? "no result for this workload" : detail);
        }
}

/* ---- output ----------------------------------------------------------------------------- */

static void fmt_time(char *b, size_t n, double s) {
    if (!(s > 0)) snprintf(b, n, "-");
    else if (s < 1e-3) snprintf(b, n, "%.1f us", s * 1e6);
    else if (s < 1) snprintf(b, n, "%.3f ms", s * 1e3);
    else snprintf(b, n, "%.3f s", s);
}

static void fmt_num(char *b, size_t n, double v, const char *f) {
    if (isnan(v)) snprintf(b, n, "-");
    else snprintf(b, n, f, v);
}

static void fmt_int(char *b, size_t n, int64_t v) {
    if (v < 0) snprintf(b, n, "-");
    else snprintf(b, n, "%lld", (long long)v);
}

static void print_header(FILE *f) {
    time_t t = time(NULL);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%d %H:%M", localtime(&t));
    fprintf(f, "kiln-bench %s, device %s, size %s, %d threads\n", day, opt.device, kw_size_name(opt.size), opt.threads);
    fprintf(f, "config: %s\n", kl_config_string());
    fprintf(f, "method: %d warm-up calls, then >= %d runs and >= %g s; median, IQR (shared/WORKLOADS.md)\n",
            opt.warmup, opt.min_runs, opt.min_time);
    fprintf(f, "limits: STREAM copy %.1f GB/s, add %.1f GB/s (64 MiB arrays), sgemm 1024^3 %.1f GFLOP/s%s%s\n",
            lim.copy_gbs, lim.add_gbs, lim.sgemm_gflops, lim.from_cache ? " (cached today)" : "",
            strcmp(opt.device, "cpu") ? " (the CPU's: CUDA rows get no roofline)" : "");
    if (opt.torch)
        for (int i = 0; i < torch_sys.n; i++)
            fprintf(f, "%s: %s%s%s\n", torch_sys.name[i], torch_sys.status[i], torch_sys.detail[i][0] ? ", " : "",
                    torch_sys.detail[i]);
}

static void print_table(FILE *f) {
    fprintf(f, "\n%-12s %-10s %-13s %10s %6s %8s %5s %4s %19s %11s %14s %5s %s\n", "workload", "size", "mode",
            "median", "IQR", "speedup", "kern", "lib", "compile cold/cached", "floor", "achieved", "roof", "check");
    const char *last = "";
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        if (strcmp(last, r->workload) && i) fputc('\n', f);
        last = r->workload;
        char med[24], iqr[16], sp[16], k[24], l[24], comp[40], floor_[24], ach[24], roof[16];
        if (strcmp(r->status, "ok")) {
            fprintf(f, "%-12s %-10s %-13s %s%s%s\n", r->workload, r->size, r->mode, r->status, r->note[0] ? ": " : "",
                    r->note);
            continue;
        }
        fmt_time(med, sizeof med, r->r.median_s);
        fmt_num(iqr, sizeof iqr, r->r.median_s > 0 ? 100 * r->r.iqr_s / r->r.median_s : NAN, "%.1f%%");
        fmt_num(sp, sizeof sp, r->speedup, "%.2fx");
        fmt_int(k, sizeof k, r->kernels);
        fmt_int(l, sizeof l, r->library_calls);
        if (isnan(r->compile_cold_ms)) snprintf(comp, sizeof comp, "-");
        else snprintf(comp, sizeof comp, "%.1f/%.1f ms", r->compile_cold_ms, r->compile_cached_ms);
        if (r->matmul_heavy && r->flops > 0) snprintf(floor_, sizeof floor_, "%.3g GFLOP", r->flops / 1e9);
        else if (r->floor_bytes > 0) snprintf(floor_, sizeof floor_, "%.3g MB", r->floor_bytes / 1e6);
        else snprintf(floor_, sizeof floor_, "-");
        if (isnan(r->achieved)) snprintf(ach, sizeof ach, "-");
        else snprintf(ach, sizeof ach, "%.1f %s", r->achieved, r->matmul_heavy && r->flops > 0 ? "GFLOP/s" : "GB/s");
        fmt_num(roof, sizeof roof, 100 * r->roofline, "%.0f%%");
        fprintf(f, "%-12s %-10s %-13s %10s %6s %8s %5s %4s %19s %11s %14s %5s %s%s%s%s\n", r->workload, r->size, r->mode,
                med, iqr, sp, k, l, comp, floor_, ach, roof, r->check ? r->check : "-", r->r.noisy ? "  noisy" : "",
                r->note[0] ? "  " : "", r->note);
    }
    fprintf(f, "\nspeedup: Kiln eager's median / the row's median. kern: launches per call (compiled kernels and\n"
               "library calls); lib: of those, ops run through the dispatcher (BLAS, eager kernels). compile: trace,\n"
               "passes and codegen of the first call, cold (empty kernel cache) and again from the cache. floor:\n"
               "WORKLOADS.md's bytes (GB/s against the better STREAM figure) or matmul FLOPs (GFLOP/s against\n"
               "sgemm); roof: achieved / that limit. check: compiled vs eager on copies (rtol 1e-3, atol 1e-4).\n");
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isnan(v) || isinf(v)) fprintf(f, "null");
    else fprintf(f, "%.9g", v);
}

static void json_int(FILE *f, int64_t v) {
    if (v < 0) fprintf(f, "null");
    else fprintf(f, "%lld", (long long)v);
}

static void print_json(FILE *f) {
    time_t t = time(NULL);
    char day[32];
    strftime(day, sizeof day, "%Y-%m-%d", localtime(&t));
    fprintf(f, "{\n  \"schema\": \"kiln-bench/1\",\n  \"kiln_version\": ");
    json_str(f, kl_version());
    fprintf(f, ",\n  \"config\": ");
    json_str(f, kl_config_string());
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"device\": ", day);
    json_str(f, opt.device);
    fprintf(f, ",\n  \"threads\": %d,\n  \"size\": \"%s\",\n", opt.threads, kw_size_name(opt.size));
    fprintf(f, "  \"method\": {\"warmup\": %d, \"min_runs\": %d, \"min_time_s\": ", opt.warmup, opt.min_runs);
    json_num(f, opt.min_time);
    fprintf(f, "},\n  \"limits\": {\"stream_copy_gbs\": ");
    json_num(f, lim.copy_gbs);
    fprintf(f, ", \"stream_add_gbs\": ");
    json_num(f, lim.add_gbs);
    fprintf(f, ", \"sgemm_gflops\": ");
    json_num(f, lim.sgemm_gflops);
    fprintf(f, ", \"from_cache\": %s},\n", lim.from_cache ? "true" : "false");
    fprintf(f, "  \"torch\": {\"requested\": %s, \"systems\": [", opt.torch ? "true" : "false");
    for (int i = 0; opt.torch && i < torch_sys.n; i++) {
        fprintf(f, "%s{\"name\": ", i ? ", " : "");
        json_str(f, torch_sys.name[i]);
        fprintf(f, ", \"status\": ");
        json_str(f, torch_sys.status[i]);
        fprintf(f, ", \"detail\": ");
        json_str(f, torch_sys.detail[i]);
        fprintf(f, "}");
    }
    fprintf(f, "]},\n  \"rows\": [\n");
    for (int i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        bool ok = !strcmp(r->status, "ok");
        fprintf(f, "    {\"workload\": \"%s\", \"size\": \"%s\", \"standard_size\": %s, \"mode\": \"%s\", \"status\": ",
                r->workload, r->size, r->standard ? "true" : "false", r->mode);
        json_str(f, r->status);
        fprintf(f, ", \"note\": ");
        json_str(f, r->note);
        fprintf(f, ",\n     \"median_s\": ");
        json_num(f, ok ? r->r.median_s : NAN);
        fprintf(f, ", \"q1_s\": ");
        json_num(f, ok ? r->r.q1_s : NAN);
        fprintf(f, ", \"q3_s\": ");
        json_num(f, ok ? r->r.q3_s : NAN);
        fprintf(f, ", \"iqr_s\": ");
        json_num(f, ok ? r->r.iqr_s : NAN);
        fprintf(f, ", \"runs\": %d, \"noisy\": %s, \"speedup_vs_eager\": ", ok ? r->r.runs : 0,
                r->r.noisy ? "true" : "false");
        json_num(f, r->speedup);
        fprintf(f, ",\n     \"kernels\": ");
        json_int(f, r->kernels);
        fprintf(f, ", \"library_calls\": ");
        json_int(f, r->library_calls);
        fprintf(f, ", \"compile_cold_ms\": ");
        json_num(f, r->compile_cold_ms);
        fprintf(f, ", \"compile_cached_ms\": ");
        json_num(f, r->compile_cached_ms);
        fprintf(f, ", \"first_call_ms\": ");
        json_num(f, r->first_call_ms);
        fprintf(f, ", \"check\": ");
        if (r->check) json_str(f, r->check);
        else fprintf(f, "null");
        fprintf(f, ",\n     \"floor_bytes\": ");
        json_num(f, r->floor_bytes > 0 ? r->floor_bytes : NAN);
        fprintf(f, ", \"flops\": ");
        json_num(f, r->flops > 0 ? r->flops : NAN);
        fprintf(f, ", \"achieved\": ");
        json_num(f, r->achieved);
        fprintf(f, ", \"achieved_unit\": ");
        if (isnan(r->achieved)) fprintf(f, "null");
        else json_str(f, r->matmul_heavy && r->flops > 0 ? "GFLOP/s" : "GB/s");
        fprintf(f, ", \"roofline_fraction\": ");
        json_num(f, r->roofline);
        fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

/* ---- SVG: grouped bars of speedup over eager per workload and mode ----------------------- */

static const char *mode_colour(const char *m) {
    static const char *names[] = {"eager", "TRACE_ONLY", "NO_FUSE", "FUSE", "torch_eager", "torchscript", "torch_compile"};
    static const char *colours[] = {"#9e9e9e", "#90caf9", "#42a5f5", "#0d47a1", "#ffb74d", "#f57c00", "#bf360c"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(names[i], m)) return colours[i];
    return "#000000";
}

static int write_svg(const char *path) {
    const char *modes[8];
    int nm = 0;
    const char *wls[16];
    int nw = 0;
    double ymax = 1;
    for (int i = 0; i < nrows; i++) {
        int k;
        for (k = 0; k < nm && strcmp(modes[k], rows[i].mode); k++) {}
        if (k == nm && nm < 8) modes[nm++] = rows[i].mode;
        for (k = 0; k < nw && strcmp(wls[k], rows[i].workload); k++) {}
        if (k == nw && nw < 16) wls[nw++] = rows[i].workload;
        if (rows[i].speedup > ymax) ymax = rows[i].speedup;
    }
    /* a log axis: speedups span 0.1x to 50x */
    double lo = 0.1, hi = 1, ymin = 1;
    for (int i = 0; i < nrows; i++)
        if (rows[i].speedup > 0 && rows[i].speedup < ymin) ymin = rows[i].speedup;
    while (hi < ymax * 1.15) hi *= hi < 1.5 ? 2 : 2.5;
    while (lo > ymin / 1.2) lo /= 10;
    const int bw = 16, gap = 24, left = 70, top = 60, ph = 320, bottom = 130;
    int gw = nm * bw + gap, width = left + nw * gw + 190, height = top + ph + bottom;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
#define Y(v) (top + ph - (log10(v) - log10(lo)) / (log10(hi) - log10(lo)) * ph)
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\">\n",
            width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">kiln-bench: speedup over Kiln eager "
               "(size %s, %d thread%s, %s)</text>\n", left, kw_size_name(opt.size), opt.threads, opt.threads == 1 ? "" : "s", opt.device);
    fprintf(f, "<text x=\"%d\" y=\"40\" font-size=\"11\" fill=\"#444\">bar: eager median / median (log scale); "
               "number above a bar: achieved / machine limit (STREAM %.0f GB/s or sgemm %.0f GFLOP/s)</text>\n",
            left, fmax(lim.copy_gbs, lim.add_gbs), lim.sgemm_gflops);
    for (double v = lo; v <= hi * 1.001; v *= 10) {
        for (int m = 1; m < 10; m++) {
            double g = v * m;
            if (g > hi * 1.001) break;
            double y = Y(g);
            bool major = m == 1;
            fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", left, left + nw * gw, y, y,
                    major ? "#bbb" : "#eee");
            if (major || m == 2 || m == 5)
                fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%gx</text>\n", left - 6,
                        y + 3, g);
        }
    }
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-dasharray=\"4,3\"/>\n", left,
            left + nw * gw, Y(1), Y(1));
    for (int w = 0; w < nw; w++) {
        int x0 = left + w * gw + gap / 2;
        for (int m = 0; m < nm; m++) {
            const row *r = NULL;
            for (int i = 0; i < nrows; i++)
                if (!strcmp(rows[i].workload, wls[w]) && !strcmp(rows[i].mode, modes[m])) r = &rows[i];
            int x = x0 + m * bw;
            if (!r || !(r->speedup > 0)) {
                if (r) /* a row without a time says why, as the table does */
                    fprintf(f, "<text transform=\"translate(%d,%.1f) rotate(-90)\" font-size=\"9\" fill=\"#999\">%s</text>\n",
                            x + bw / 2 + 3, Y(lo) - 4, r->status);
                continue;
            }
            double y = Y(r->speedup), yb = Y(lo);
            fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>%s %s: %.2fx</title></rect>\n",
                    x + 1, y, bw - 2, yb - y, mode_colour(modes[m]), r->workload, r->mode, r->speedup);
            if (!isnan(r->roofline))
                fprintf(f, "<text transform=\"translate(%d,%.1f) rotate(-90)\" font-size=\"9\">%.0f%%</text>\n",
                        x + bw / 2 + 3, y - 3, 100 * r->roofline);
        }
        fprintf(f, "<text transform=\"translate(%d,%d) rotate(-35)\" font-size=\"12\" text-anchor=\"end\">%s</text>\n",
                x0 + nm * bw / 2, top + ph + 16, wls[w]);
    }
    for (int m = 0; m < nm; m++) {
        int y = top + 10 + m * 18;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", left + nw * gw + 20, y,
                mode_colour(modes[m]));
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">%s</text>\n", left + nw * gw + 38, y + 10, modes[m]);
    }
    /* the config line, split at its "; " so it fits */
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s", kl_config_string());
    int line = 0;
    for (char *part = cfg, *next; part; part = next, line++) {
        next = strstr(part, "; ");
        if (next) *next = 0, next += 2;
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\" fill=\"#444\">%s</text>\n", left, height - 40 + 12 * line,
                part);
    }
    fprintf(f, "</svg>\n");
#undef Y
    return fclose(f) ? -1 : 0;
}

/* ---- main ------------------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln-bench [options]\n"
            "  --workload LIST   comma-separated ids or 'all' (default): chain5 gelu softmax layernorm xent\n"
            "                    mlp mlp_step digits_step adamw attention (shared/WORKLOADS.md)\n"
            "  --mode LIST       eager,TRACE_ONLY,NO_FUSE,FUSE (default: all four)\n"
            "  --size S          small | medium | large (default medium; medium and large are WORKLOADS.md's)\n"
            "  --threads N       Kiln's (and OpenBLAS's) threads (default: kl_get_num_threads())\n"
            "  --device D        cpu (default) | cuda\n"
            "  --min-time S      timed seconds per row, at least (default 0.5)\n"
            "  --min-runs N      timed calls per row, at least (default 10)\n"
            "  --warmup N        untimed calls first (default 3)\n"
            "  --compare torch   also PyTorch eager, TorchScript and torch.compile (bench/torch_workloads.py)\n"
            "  --json            print JSON (docs/BENCH.md) instead of the table\n"
            "  --svg FILE        draw speedup over eager per workload and mode\n"
            "  --quiet           no progress bar\n");
}

static int parse_modes(char *s) {
    memset(opt.want_mode, 0, sizeof opt.want_mode);
    for (char *t = strtok(s, ","); t; t = strtok(NULL, ",")) {
        int k;
        for (k = 0; k < NMODES && strcasecmp(t, mode_names[k]); k++) {}
        if (k == NMODES) {
            fprintf(stderr, "kiln-bench: unknown mode \"%s\" (eager, TRACE_ONLY, NO_FUSE, FUSE)\n", t);
            return -1;
        }
        opt.want_mode[k] = true;
    }
    return 0;
}

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[2048];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", path, e->d_name);
                rm_tree(p);
            }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

int main(int argc, char **argv) {
    opt.threads = kl_get_num_threads();
    opt.min_runs = 10, opt.min_time = 0.5, opt.warmup = 3;
    opt.size = KW_MEDIUM, opt.device = "cpu";
    for (int k = 0; k < NMODES; k++) opt.want_mode[k] = true;
    char *wl_arg = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE                                                                 \
    if (!v) {                                                                      \
        fprintf(stderr, "kiln-bench: %s needs a value (kiln-bench --help)\n", a);  \
        return 2;                                                                  \
    }                                                                              \
    i++
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--workload")) {
            NEED_VALUE;
            wl_arg = argv[i];
        } else if (!strcmp(a, "--mode")) {
            NEED_VALUE;
            if (parse_modes(argv[i])) return 2;
        } else if (!strcmp(a, "--size")) {
            NEED_VALUE;
            int s = kw_size_parse(v);
            if (s < 0) {
                fprintf(stderr, "kiln-bench: %s\n", kl_last_error());
                return 2;
            }
            opt.size = (kw_size)s;
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE;
            opt.threads = atoi(v);
            if (opt.threads < 1) {
                fprintf(stderr, "kiln-bench: --threads %s: want a count >= 1\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE;
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "kiln-bench: --device %s: want cpu or cuda\n", v);
                return 2;
            }
            opt.device = v;
        } else if (!strcmp(a, "--min-time")) {
            NEED_VALUE;
            opt.min_time = atof(v);
        } else if (!strcmp(a, "--min-runs")) {
            NEED_VALUE;
            opt.min_runs = atoi(v);
        } else if (!strcmp(a, "--warmup")) {
            NEED_VALUE;
            opt.warmup = atoi(v);
        } else if (!strcmp(a, "--compare")) {
            NEED_VALUE;
            if (strcmp(v, "torch")) {
                fprintf(stderr, "kiln-bench: --compare %s: only 'torch' is known\n", v);
                return 2;
            }
            opt.torch = true;
        } else if (!strcmp(a, "--json")) {
            opt.json = 1;
        } else if (!strcmp(a, "--svg")) {
            NEED_VALUE;
            opt.svg = v;
        } else if (!strcmp(a, "--quiet")) {
            opt.quiet = 1;
        } else {
            fprintf(stderr, "kiln-bench: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
#undef NEED_VALUE
    }
    if (opt.min_runs < 1 || !(opt.min_time >= 0) || opt.warmup < 0) {
        fprintf(stderr, "kiln-bench: want --min-runs >= 1, --min-time >= 0, --warmup >= 0\n");
        return 2;
    }
    int cuda = !strcmp(opt.device, "cuda");
    if (cuda && !kl_cuda_is_available()) {
        fprintf(stderr, "kiln-bench: --device cuda: no usable CUDA device here (%s); run with --device cpu\n",
                kl_cuda_unavailable_reason());
        return 2;
    }
    /* the workloads */
    kw_case *cases[16];
    int ncases = 0;
    if (!wl_arg || !strcmp(wl_arg, "all")) {
        for (int i = 0; i < kw_count(); i++) opt.workloads[opt.nworkloads++] = kw_at(i)->id;
    } else {
        for (char *t = strtok(wl_arg, ","); t && opt.nworkloads < 16; t = strtok(NULL, ",")) {
            if (!kw_find(t)) {
                fprintf(stderr, "kiln-bench: %s\n", kl_last_error());
                return 2;
            }
            opt.workloads[opt.nworkloads++] = t;
        }
    }
    kl_set_num_threads(opt.threads);
    progress_on = !opt.quiet && isatty(2);
    int nm = 0;
    for (int k = 0; k < NMODES; k++) nm += opt.want_mode[k];
    progress_total = opt.nworkloads * nm;

    /* The day's limits live in the kernel cache folder; compiles then go to
     * an empty folder of their own, so "cold" is cold. */
    const char *cd = ke_cache_dir();
    char *cache_dir = cd ? strdup(cd) : NULL;
    limits(cache_dir);
    char tmpdir[] = "/tmp/kiln-bench-XXXXXX";
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "kiln-bench: cannot make a temporary kernel cache: %s\n", strerror(errno));
        return 1;
    }
    setenv("KL_CACHE_DIR", tmpdir, 1);
    ke_cache_reset();

    for (int w = 0; w < opt.nworkloads; w++) {
        kw_case *c = kw_case_new_on(opt.workloads[w], opt.size, 0, cuda ? kl_cuda_device(0) : KL_DEVICE_CPU);
        if (!c && cuda) { /* a workload the CUDA backend cannot hold: one row says so */
            kw_case *cpu = kw_case_new(opt.workloads[w], opt.size, 0);
            if (!cpu) die(opt.workloads[w]);
            row *r = new_row(cpu, "eager");
            r->status = "error";
            snprintf(r->note, sizeof r->note, "on cuda: %s", kl_last_error());
            kl_clear_error();
            kw_case_free(cpu);
            progress_done += nm;
            continue;
        }
        if (!c) die(opt.workloads[w]);
        cases[ncases++] = c;
        int eager_row = -1;
        for (int m = 0; m < NMODES; m++) {
            if (!opt.want_mode[m]) continue;
            bench_mode(c, m, eager_row >= 0 ? &rows[eager_row] : NULL, cuda);
            if (m == 0) eager_row = nrows - 1;
        }
    }
    if (opt.torch) {
        run_torch(cases, ncases);
        torch_missing_rows(cases, ncases);
        /* keep each workload's rows together: a stable sort by workload order */
        row *sorted = malloc(sizeof(row) * (size_t)nrows);
        int k = 0;
        for (int w = 0; w < ncases; w++)
            for (int i = 0; i < nrows; i++)
                if (!strcmp(rows[i].workload, cases[w]->def->id)) sorted[k++] = rows[i];
        memcpy(rows, sorted, sizeof(row) * (size_t)k);
        free(sorted);
    }
    progress_end();
    rm_tree(tmpdir);
    for (int i = 0; i < ncases; i++) kw_case_free(cases[i]);
    if (opt.json) {
        print_json(stdout);
    } else {
        print_header(stdout);
        print_table(stdout);
    }
    if (opt.svg) {
        if (write_svg(opt.svg)) {
            fprintf(stderr, "kiln-bench: cannot write %s: %s\n", opt.svg, strerror(errno));
            return 1;
        }
        if (!opt.json) printf("\nSVG: %s\n", opt.svg);
    }
    free(cache_dir);
    int bad = 0;
    for (int i = 0; i < nrows; i++)
        bad |= !strcmp(rows[i].status, "error") || (rows[i].check && strcmp(rows[i].check, "ok"));
    return bad ? 1 : 0;
}
