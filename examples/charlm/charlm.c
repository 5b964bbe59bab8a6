/*
 * charlm.c — issue 16's second demo: a character-level transformer trained on
 * Debian's fortune cookie files (scripts/fetch_fortunes.sh), eagerly and
 * with its training step compiled, against a count-based bigram model.
 *
 * Model (charlm_model.h): 4 layers, 4 heads, embedding 128, context 128;
 * token + learned position embeddings, pre-LayerNorm, causal
 * kl_scaled_dot_product_attention, 4x GELU MLP, final LayerNorm, untied
 * output layer with bias (839,026 parameters with the fortunes' 114-byte
 * vocabulary). AdamW (betas 0.9/0.99, weight decay 0.01), linear
 * warm-up then cosine decay of the learning rate, gradient norm clipped to 1.
 * Data (charlm_data.h): bytes of the fortunes, a fixed 90/10 split by
 * fortune, random windows of context + 1 characters.
 *
 * Prints the corpus, the bigram model's validation loss, then for each mode
 * a loss curve (the batch losses' mean since the last row; train and
 * validation loss on fixed sets of windows; nats per character) with
 * tokens/s, the final comparison, and a sample of generated text (temperature
 * and top-k). Exits non-zero if a run's validation loss is not below the
 * bigram model's (or with --max-val-loss, above that).
 *
 *   charlm [--mode both|eager|compiled] [--steps N] [--batch N] [--threads N] [--seed S]
 *          [--layers N] [--heads N] [--embed N] [--context N] [--lr X] [--warmup N]
 *          [--eval-every N] [--eval-windows N] [--save FILE] [--load FILE]
 *          [--sample N] [--temperature X] [--top-k K] [--data PATH] [--skip-missing]
 *          [--max-val-loss X] [--bench-steps N] [--profile] [--compile step|forward]
 *          [--mask-attention]
 *
 * --mode both (the default) trains twice from the same seed (same
 * initialisation, same windows): once with the step's forward, loss and
 * backward run eagerly, once with that function compiled by kl_compile as a
 * whole (one trace, one graph with the backward, fused kernels); the
 * optimizer step, clipping and schedule are eager in both. --compile forward
 * compiles the loss only instead (the parameters captured, requiring grad:
 * kl_compile's compiled forward and backward behind one autograd node) and
 * calls kl_backward from eager code. --bench-steps times all three, or
 * those --mode and --compile name (--mode compiled --compile step: only the
 * compiled step, for a profile of that alone).
 */
#include "charlm_data.h"
#include "charlm_model.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct options {
    enum { MODE_BOTH, MODE_EAGER, MODE_COMPILED } mode;
    int steps, batch, threads, warmup, eval_every, eval_windows, sample, top_k, bench_steps;
    charlm_config cfg;
    double lr, temperature, max_val_loss;
    uint64_t seed;
    const char *data, *save, *load;
    bool skip_missing, profile;
    bool forward_only; /* --compile forward */
    bool compile_given; /* --compile was on the command line (--bench-steps times only that one) */
} options;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: charlm [--mode both|eager|compiled] [--steps N] [--batch N] [--threads N] [--seed S]\n"
            "              [--layers N] [--heads N] [--embed N] [--context N] [--lr X] [--warmup N]\n"
            "              [--eval-every N] [--eval-windows N] [--save FILE] [--load FILE]\n"
            "              [--sample N] [--temperature X] [--top-k K] [--data PATH] [--skip-missing]\n"
            "              [--max-val-loss X] [--bench-steps N] [--profile] [--compile step|forward]\n"
            "              [--mask-attention]\n"
            "PATH is the folder of fortune files or one text file (default $KILN_DATA_DIR/fortunes, else\n"
            "./data/fortunes); scripts/fetch_fortunes.sh puts them there. --save FILE writes the parameters\n"
            "to FILE and the optimizer state to FILE.optim; --load reads both and resumes at their step.\n"
            "--bench-steps N only times N training steps per mode (medians) and exits; the modes are those\n"
            "--mode and --compile name, all three by default. --compile step (the\n"
            "default) compiles the whole loss-and-gradients function, forward the loss only (then kl_backward).\n"
            "--mask-attention passes attention an explicit causal mask (sdpa's decomposition, not the fused\n"
            "causal kernel): the same model, for timing the two side by side.\n");
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.steps = 600, .batch = 32, .warmup = 60, .eval_every = 100, .eval_windows = 128,
                   .sample = 400, .top_k = 10, .lr = 2e-3, .temperature = 0.8, .max_val_loss = NAN,
                   .cfg = {.layers = 4, .heads = 4, .embed = 128, .context = 128}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--skip-missing") || !strcmp(a, "--profile")) {
            *(a[2] == 's' ? &o->skip_missing : &o->profile) = true;
            continue;
        } else if (!strcmp(a, "--mask-attention")) {
            o->cfg.mask_attention = true;
            continue;
        }
        static const struct {
            const char *name;
            char kind; /* i: int, d: double, u: uint64, s: string, m: mode */
            size_t off;
        } opts[] = {
            {"--mode", 'm', 0},
            {"--compile", 'c', 0},
            {"--steps", 'i', offsetof(options, steps)},
            {"--batch", 'i', offsetof(options, batch)},
            {"--threads", 'i', offsetof(options, threads)},
            {"--seed", 'u', offsetof(options, seed)},
            {"--layers", 'i', offsetof(options, cfg.layers)},
            {"--heads", 'i', offsetof(options, cfg.heads)},
            {"--embed", 'i', offsetof(options, cfg.embed)},
            {"--context", 'i', offsetof(options, cfg.context)},
            {"--lr", 'd', offsetof(options, lr)},
            {"--warmup", 'i', offsetof(options, warmup)},
            {"--eval-every", 'i', offsetof(options, eval_every)},
            {"--eval-windows", 'i', offsetof(options, eval_windows)},
            {"--save", 's', offsetof(options, save)},
            {"--load", 's', offsetof(options, load)},
            {"--sample", 'i', offsetof(options, sample)},
            {"--temperature", 'd', offsetof(options, temperature)},
            {"--top-k", 'i', offsetof(options, top_k)},
            {"--data", 's', offsetof(options, data)},
            {"--max-val-loss", 'd', offsetof(options, max_val_loss)},
            {"--bench-steps", 'i', offsetof(options, bench_steps)},
        };
        size_t k = 0;
        while (k < sizeof opts / sizeof opts[0] && strcmp(a, opts[k].name)) k++;
        if (k == sizeof opts / sizeof opts[0]) {
            fprintf(stderr, "charlm: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
        if (!v) {
            fprintf(stderr, "charlm: %s needs a value\n", a);
            return -1;
        }
        i++;
        char *field = (char *)o + opts[k].off;
        switch (opts[k].kind) {
        case 'i': {
            long n = strtol(v, &end, 10);
            *(int *)field = (int)n;
            if (n < -1000000000L || n > 1000000000L) end = (char *)v;
            break;
        }
        case 'd': *(double *)field = strtod(v, &end); break;
        case 'u': *(uint64_t *)field = strtoull(v, &end, 10); break;
        case 's': *(const char **)field = v, end = ""; break;
        case 'c':
            end = strcmp(v, "step") && strcmp(v, "forward") ? "x" : "";
            o->forward_only = !strcmp(v, "forward");
            o->compile_given = true;
            break;
        default: {
            static const char *modes[] = {[MODE_BOTH] = "both", [MODE_EAGER] = "eager", [MODE_COMPILED] = "compiled"};
            end = "x"; /* an unknown mode is a bad value */
            for (int m = 0; m < 3; m++)
                if (!strcmp(v, modes[m])) o->mode = m, end = "";
        }
        }
        if (*end || end == v) {
            fprintf(stderr, "charlm: bad value '%s' for %s\n", v, a);
            return -1;
        }
    }
    if (o->steps < 1 || o->batch < 1 || o->threads < 0 || o->warmup < 0 || o->warmup > o->steps ||
        o->eval_every < 1 || o->eval_windows < 1 || o->sample < 0 || o->top_k < 0 || o->bench_steps < 0 ||
        !(o->lr > 0) || !(o->temperature > 0)) {
        fprintf(stderr, "charlm: need steps >= 1, batch >= 1, threads >= 0, 0 <= warmup <= steps, eval-every >= 1,\n"
                        "        eval-windows >= 1, sample >= 0, top-k >= 0, bench-steps >= 0, lr > 0, temperature > 0\n");
        return -1;
    }
    return 0;
}

static int fail_kiln(const char *what) {
    fprintf(stderr, "charlm: %s failed: %s\n", what, kl_last_error());
    return 1;
}

static charlm_train_options train_options(const options *o, bool compiled, bool forward_only) {
    return (charlm_train_options){.lr = o->lr, .min_lr = o->lr / 10, .warmup = o->warmup, .total = o->steps,
                                  .weight_decay = 0.01, .beta2 = 0.99, .clip = 1.0, .compiled = compiled,
                                  .forward_only = forward_only};
}

/* The windows of step s: a generator seeded from (seed, s), so a resumed run
 * sees the batches the uninterrupted one would have. */
static uint64_t step_rng(uint64_t seed, int64_t step) {
    uint64_t s = seed ^ 0x636861726c6d5f5fu ^ ((uint64_t)step * 0x9e3779b97f4a7c15u);
    charlm_rand_next(&s);
    return s;
}

/* Fixed evaluation windows, the same for every row and run. */
enum { EVAL_SEED_TRAIN = 1, EVAL_SEED_VAL = 2 };

typedef struct run_result {
    double val, train, tok_s, steady_tok_s, compile_ms;
    int64_t kernels, library_calls;
    bool ran;
} run_result;

static void print_text(const charlm_vocab *v, const int64_t *ids, int n) {
    for (int i = 0; i < n; i++) putchar(v->byte_of[ids[i]]);
}

/* Trains a fresh model (or the one --load names) from o->seed; compiled or eager step. */
static int train(const options *o, const charlm_corpus *c, bool compiled, run_result *res) {
    charlm_trainer t;
    charlm_train_options to = train_options(o, compiled, o->forward_only);
    const int B = o->batch, T = o->cfg.context;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)B * T), *y = malloc(sizeof(int64_t) * (size_t)B * T);
    int rc = 1;
    kl_manual_seed(o->seed);
    if (!x || !y || charlm_trainer_init(&t, &o->cfg, &to) < 0) {
        free(x), free(y);
        return fail_kiln("setting up the model");
    }
    if (o->load && charlm_load(&t, o->load) < 0) {
        rc = fail_kiln("loading");
        goto done;
    }
    int64_t first = charlm_trainer_steps(&t);
    printf("\n%s: loss and gradients %s; AdamW, clipping and schedule eager\n", compiled ? "compiled" : "eager",
           !compiled         ? "by eager ops and autograd"
           : o->forward_only ? "by a kl_compile'd loss (compiled forward and backward) and kl_backward"
                             : "by one kl_compile'd function (forward + backward traced once)");
    if (first) printf("resuming at step %lld (%s)\n", (long long)first, o->load);
    printf(" step   lr        batch loss  train loss  val loss   tokens/s\n");
    double train_s = 0, first_step_s = 0, since = 0, loss_sum = 0;
    int since_n = 0;
    for (int64_t s = first; s < o->steps; s++) {
        uint64_t rng = step_rng(o->seed, s);
        charlm_windows(c->train, c->n_train, B, T, &rng, x, y);
        double loss, t0 = now_s();
        if (charlm_trainer_step(&t, x, y, B, &loss, NULL) < 0) {
            rc = fail_kiln("a training step");
            goto done;
        }
        double dt = now_s() - t0;
        train_s += dt, since += dt;
        if (s == first) first_step_s = dt;
        loss_sum += loss, since_n++;
        if ((s + 1) % o->eval_every == 0 || s + 1 == o->steps) {
            double tr = charlm_eval(&t, c->train, c->n_train, o->eval_windows, B, EVAL_SEED_TRAIN);
            double va = charlm_eval(&t, c->val, c->n_val, o->eval_windows, B, EVAL_SEED_VAL);
            if (isnan(tr) || isnan(va)) {
                rc = fail_kiln("evaluation");
                goto done;
            }
            printf("%5lld  %.2e  %10.4f  %10.4f  %8.4f  %9.0f\n", (long long)(s + 1), kl_optim_get_lr(t.optim),
                   loss_sum / since_n, tr, va, (double)since_n * B * T / since);
            fflush(stdout);
            res->train = tr, res->val = va;
            since = 0, loss_sum = 0, since_n = 0;
        }
    }
    int64_t ran = o->steps - first;
    if (ran < 1) {
        fprintf(stderr, "charlm: nothing to train: the loaded state is at step %lld, --steps is %d\n",
                (long long)first, o->steps);
        goto done;
    }
    res->tok_s = (double)ran * B * T / train_s;
    res->steady_tok_s = ran > 1 ? (double)(ran - 1) * B * T / (train_s - first_step_s) : res->tok_s;
    if (t.fn) {
        kl_fn_stats st;
        if (kl_fn_get_stats(t.fn, &st) == 0) {
            res->compile_ms = st.compile_ms;
            res->kernels = st.traces ? st.kernels / st.traces : 0;
            res->library_calls = st.traces ? st.library_calls / st.traces : 0;
        }
    }
    printf("%lld steps in %.1f s: %.0f tokens/s (%.0f after the first step)\n", (long long)ran, train_s, res->tok_s,
           res->steady_tok_s);
    if (o->save) {
        if (charlm_save(&t, o->save) < 0) {
            rc = fail_kiln("saving");
            goto done;
        }
        printf("saved %s and %s.optim (%lld parameters, optimizer at step %lld)\n", o->save, o->save,
               (long long)kl_params_numel(t.params), (long long)charlm_trainer_steps(&t));
    }
    if (o->sample > 0) {
        int64_t prompt[2] = {c->vocab.id_of['%'], c->vocab.id_of['\n']}, *out = malloc(sizeof(int64_t) * o->sample);
        kl_manual_seed(o->seed);
        if (!out || prompt[0] < 0 || prompt[1] < 0 ||
            charlm_sample(&t, prompt, 2, o->sample, o->temperature, o->top_k, out) < 0) {
            free(out);
            rc = fail_kiln("sampling");
            goto done;
        }
        printf("sample (%d characters, temperature %g, top-k %d, after \"%%\\n\"):\n", o->sample, o->temperature,
               o->top_k);
        print_text(&c->vocab, out, o->sample);
        printf("\n");
        free(out);
    }
    res->ran = true;
    rc = 0;
done:
    charlm_trainer_free(&t);
    free(x), free(y);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --bench-steps: median time of n training steps per mode after two warm-up
 * steps (the compiled one traces and compiles in the first), on the demo's
 * windows; with --profile the timed steps' profiler summary. */
static int bench(const options *o, const charlm_corpus *c) {
    const int B = o->batch, T = o->cfg.context, n = o->bench_steps;
    int64_t *x = malloc(sizeof(int64_t) * (size_t)B * T), *y = malloc(sizeof(int64_t) * (size_t)B * T);
    double *ms = malloc(sizeof(double) * (size_t)n), median[3] = {0};
    static const char *names[3] = {"eager", "compiled", "compiled-forward"};
    int rc = 0;
    for (int mode = 0; mode < 3 && !rc && x && y && ms; mode++) {
        if ((mode == 0 && o->mode == MODE_COMPILED) || (mode > 0 && o->mode == MODE_EAGER) ||
            (mode > 0 && o->compile_given && (mode == 2) != o->forward_only))
            continue;
        charlm_trainer t;
        charlm_train_options to = train_options(o, mode > 0, mode == 2);
        kl_manual_seed(o->seed);
        if (charlm_trainer_init(&t, &o->cfg, &to) < 0) return fail_kiln("setting up the model");
        for (int s = 0; s < n + 2 && !rc; s++) {
            uint64_t rng = step_rng(o->seed, s);
            charlm_windows(c->train, c->n_train, B, T, &rng, x, y);
            if (s == 2 && o->profile) kl_profiler_start(NULL);
            double loss, t0 = now_s();
            rc = charlm_trainer_step(&t, x, y, B, &loss, NULL) < 0 ? fail_kiln("a training step") : 0;
            if (s >= 2) ms[s - 2] = 1e3 * (now_s() - t0);
            /* no timed step runs interpreted (the interpreter tier, on by default with two threads) */
            if (s == 1 && t.fn) kl_fn_wait_compiled(t.fn);
        }
        if (o->profile && !rc) {
            kl_profiler_stop(NULL);
            printf("\nprofile of %d %s steps:\n", n, names[mode]);
            kl_profiler_summary(stdout);
        }
        if (!rc) {
            qsort(ms, (size_t)n, sizeof *ms, cmp_double);
            median[mode] = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
            printf("bench %-16s median %8.2f ms/step over %d steps (min %.2f, max %.2f), %.0f tokens/s", names[mode],
                   median[mode], n, ms[0], ms[n - 1], B * T / (median[mode] / 1e3));
            kl_fn_stats st;
            if (t.fn && kl_fn_get_stats(t.fn, &st) == 0 && st.traces && mode == 1)
                printf("; %lld launches per step (%lld library calls) + the eager optimizer",
                       (long long)(st.kernels / st.traces), (long long)(st.library_calls / st.traces));
            if (t.fn && kl_fn_get_stats(t.fn, &st) == 0 && st.traces && mode == 2)
                printf("; %lld forward + %lld backward launches per step + the eager optimizer (%lld aot calls%s%s)",
                       (long long)(st.kernels / st.traces), (long long)(st.backward_kernels / st.traces),
                       (long long)st.aot_calls, st.grad_fallback[0] ? "; fallback: " : "", st.grad_fallback);
            printf("\n");
        }
        charlm_trainer_free(&t);
    }
    if (!rc && median[0] > 0 && median[1] > 0 && median[2] > 0)
        printf("bench speed-up over eager: compiled step %.2fx, compiled forward + kl_backward %.2fx\n",
               median[0] / median[1], median[0] / median[2]);
    free(x), free(y), free(ms);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) < 0) return 2;
    if (o.threads > 0) kl_set_num_threads(o.threads);

    char path[4096], err[512];
    if (o.data) {
        snprintf(path, sizeof path, "%s", o.data);
    } else {
        const char *dir = getenv("KILN_DATA_DIR");
        snprintf(path, sizeof path, "%s/fortunes", dir && *dir ? dir : "data");
    }
    charlm_corpus c;
    if (charlm_corpus_load(path, &c, err, sizeof err) < 0) {
        bool missing = strstr(err, "not found") != NULL;
        fprintf(stderr, "charlm: %s%s%s\n", err, missing ? "; run scripts/fetch_fortunes.sh (or pass --data PATH)" : "",
                missing && o.skip_missing ? ": skipped" : "");
        return missing && o.skip_missing ? 77 : 1;
    }
    o.cfg.vocab = c.vocab.size;
    if (c.n_train <= o.cfg.context || c.n_val <= o.cfg.context) {
        fprintf(stderr, "charlm: the train (%lld) and validation (%lld) texts must be longer than the context (%d)\n",
                (long long)c.n_train, (long long)c.n_val, o.cfg.context);
        charlm_corpus_free(&c);
        return 1;
    }
    double bigram = charlm_bigram_loss(&c);
    printf("charlm: %lld fortunes from %s: %lld train / %lld validation characters, vocabulary %d bytes\n",
           (long long)c.fortunes, path, (long long)c.n_train, (long long)c.n_val, c.vocab.size);
    printf("        transformer: %d layers, %d heads, embedding %d, context %d, untied output; batch %d, %d steps,\n"
           "        AdamW lr %g (warm-up %d, cosine to %g), clip 1.0; %d threads\n",
           o.cfg.layers, o.cfg.heads, o.cfg.embed, o.cfg.context, o.batch, o.steps, o.lr, o.warmup, o.lr / 10,
           kl_get_num_threads());
    printf("bigram model (add-one smoothing, counted on train): validation loss %.4f nats/char\n", bigram);
    int rc = 0;
    if (o.bench_steps > 0) {
        rc = bench(&o, &c);
        charlm_corpus_free(&c);
        return rc;
    }
    run_result eager = {0}, comp = {0};
    if (o.mode != MODE_COMPILED) rc = train(&o, &c, false, &eager);
    if (!rc && o.mode != MODE_EAGER) rc = train(&o, &c, true, &comp);
    if (!rc) {
        printf("\n%-9s %10s %10s %10s\n", "", "train", "val", "tokens/s");
        printf("%-9s %10s %10.4f %10s\n", "bigram", "", bigram, "");
        if (eager.ran) printf("%-9s %10.4f %10.4f %10.0f\n", "eager", eager.train, eager.val, eager.steady_tok_s);
        if (comp.ran)
            printf("%-9s %10.4f %10.4f %10.0f   (%lld kernels + library calls per step, %.0f ms to trace and compile)\n",
                   "compiled", comp.train, comp.val, comp.steady_tok_s, (long long)comp.kernels, comp.compile_ms);
        if (eager.ran && comp.ran)
            printf("compiled/eager: %.2fx tokens/s; validation losses differ by %.2g\n",
                   comp.steady_tok_s / eager.steady_tok_s, fabs(comp.val - eager.val));
        const run_result *r[2] = {&eager, &comp};
        for (int i = 0; i < 2; i++) {
            if (!r[i]->ran) continue;
            double limit = isnan(o.max_val_loss) ? bigram : o.max_val_loss;
            if (!(r[i]->val < limit)) {
                fprintf(stderr, "charlm: FAILED: %s validation loss %.4f is not below %s %.4f\n", i ? "compiled" : "eager",
                        r[i]->val, isnan(o.max_val_loss) ? "the bigram model's" : "--max-val-loss", limit);
                rc = 1;
            }
        }
    }
    charlm_corpus_free(&c);
    return rc;
}
