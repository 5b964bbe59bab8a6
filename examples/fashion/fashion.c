/*
 * fashion.c — issue 16's first demo: trains the CNN of fashion_model.h on
 * Fashion-MNIST (60,000 train / 10,000 test 28x28 images, Debian's
 * dataset-fashion-mnist; scripts/fetch_fashion.sh) with Kiln, eagerly and
 * with the whole training step compiled, printing per epoch the train loss,
 * test accuracy and training images/s of each. Exits non-zero if a full run
 * ends below --min-accuracy (90% by default).
 *
 * Defaults: 4 epochs of shuffled minibatches of 128, dropout 0.25, AdamW
 * (lr 2e-3, weight decay 0.01) with the rate decayed to 0 along a cosine
 * over the run.
 *
 *   fashion [--mode both|eager|compiled] [--epochs N] [--batch N] [--threads N]
 *           [--limit N] [--test-limit N] [--seed S] [--lr X] [--dropout P] [--data DIR]
 *           [--save FILE] [--load FILE] [--min-accuracy PCT] [--skip-missing]
 *           [--bench-steps N [--profile]]
 *
 * --mode both (the default) trains twice from the same seed (same init, same
 * batches, same dropout masks): once with the step's forward and backward run
 * eagerly, once with the step compiled by kl_compile; the losses agree to
 * rounding. --save FILE writes the parameters and batch-norm running
 * statistics to FILE and the AdamW state to FILE.optim after every epoch;
 * --load FILE resumes from them (the epoch count and schedule position come
 * from the optimizer's step count). --limit N trains on the first N images
 * and --test-limit N tests on the first N test images (the accuracy target
 * applies only to full runs unless --min-accuracy is given).
 * --bench-steps N times N training steps (after 3 warm-up steps) and prints
 * the median per step, eager and compiled, instead of training
 * (bench/run_fashion_bench.sh sets it beside PyTorch's); with --profile
 * also Kiln's profiler summary of the timed steps (where the time goes).
 */
#include "fashion_data.h"
#include "fashion_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct options {
    int epochs, batch, threads, bench_steps;
    int64_t limit, test_limit;
    double lr, dropout, min_accuracy;
    bool min_accuracy_set, skip_missing, profile;
    uint64_t seed;
    const char *data, *save, *load;
    enum { MODE_BOTH, MODE_EAGER, MODE_COMPILED } mode;
} options;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f, "usage: fashion [--mode both|eager|compiled] [--epochs N] [--batch N] [--threads N] [--limit N]\n"
               "               [--test-limit N] [--seed S] [--lr X] [--dropout P] [--data DIR] [--save FILE]\n"
               "               [--load FILE]\n"
               "               [--min-accuracy PCT] [--skip-missing] [--bench-steps N [--profile]]\n"
               "DIR holds the four IDX files (default $KILN_DATA_DIR/fashion, else ./data/fashion);\n"
               "scripts/fetch_fashion.sh puts them there.\n");
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.epochs = 4, .batch = 128, .lr = 2e-3, .dropout = 0.25, .min_accuracy = 90};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--skip-missing")) {
            o->skip_missing = true;
            continue;
        } else if (!strcmp(a, "--profile")) {
            o->profile = true;
            continue;
        }
        static const char *valued[] = {"--epochs", "--batch",        "--threads", "--seed", "--lr",
                                       "--dropout", "--min-accuracy", "--data",    "--save", "--mode",
                                       "--limit",  "--load",         "--bench-steps", "--test-limit"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(a, valued[k]);
        if (!known) {
            fprintf(stderr, "fashion: unknown option %s\n", a);
            usage(stderr);
            return -1;
        }
        if (!v) {
            fprintf(stderr, "fashion: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--epochs")) o->epochs = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--batch")) o->batch = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--threads")) o->threads = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--bench-steps")) o->bench_steps = (int)strtol(v, &end, 10);
        else if (!strcmp(a, "--limit")) o->limit = strtoll(v, &end, 10);
        else if (!strcmp(a, "--test-limit")) o->test_limit = strtoll(v, &end, 10);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, &end, 10);
        else if (!strcmp(a, "--lr")) o->lr = strtod(v, &end);
        else if (!strcmp(a, "--dropout")) o->dropout = strtod(v, &end);
        else if (!strcmp(a, "--min-accuracy")) o->min_accuracy = strtod(v, &end), o->min_accuracy_set = true;
        else if (!strcmp(a, "--data")) o->data = v, end = "";
        else if (!strcmp(a, "--load")) o->load = v, end = "";
        else if (!strcmp(a, "--mode")) {
            static const char *modes[] = {[MODE_BOTH] = "both", [MODE_EAGER] = "eager", [MODE_COMPILED] = "compiled"};
            end = "x"; /* an unknown mode is a bad value */
            for (int m = 0; m < 3; m++)
                if (!strcmp(v, modes[m])) o->mode = m, end = "";
        } else o->save = v, end = "";
        if (*end || end == v) {
            fprintf(stderr, "fashion: bad value '%s' for %s\n", v, a);
            return -1;
        }
    }
    if (o->epochs < 1 || o->batch < 1 || o->threads < 0 || o->limit < 0 || o->test_limit < 0 || o->bench_steps < 0 || !(o->lr > 0) ||
        !(o->dropout >= 0 && o->dropout < 1)) {
        fprintf(stderr, "fashion: need epochs >= 1, batch >= 1, threads >= 0, limits >= 0, bench-steps >= 0,\n"
                        "         lr > 0, 0 <= dropout < 1\n");
        return -1;
    }
    return 0;
}

/* Kiln's error if one is pending; the model's own checks (fashion_model.c) have printed theirs. */
static int fail_kiln(const char *what) {
    const char *e = kl_last_error();
    fprintf(stderr, "fashion: %s failed%s%s\n", what, *e ? ": " : "", e);
    return 1;
}

/* The epoch's batch order: a Fisher-Yates shuffle of 0..n-1 seeded by (seed,
 * epoch) alone, so a resumed run sees the batches an uninterrupted one would. */
static void shuffle(int64_t *order, int64_t n, uint64_t seed, int epoch) {
    uint64_t rng = seed ^ 0x66617368696f6e5fu ^ ((uint64_t)epoch * 0xd1b54a32d192ed03u);
    for (int64_t i = 0; i < n; i++) order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(fashion_rand_next(&rng) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

typedef struct run_result {
    double acc, loss, steady_ips, compile_ms;
    int64_t kernels;
} run_result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --bench-steps: times n steps after 3 warm-up steps (the compiled run's
 * trace and compile happen in those) and prints their median. */
static int bench(const options *o, fashion_trainer *t, int64_t ntrain, bool compiled) {
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)o->batch);
    double *ms = malloc(sizeof(double) * (size_t)o->bench_steps);
    int rc = 1;
    if (!idx || !ms) goto done;
    uint64_t rng = o->seed + 1;
    for (int s = -3; s < o->bench_steps; s++) {
        /* no timed step runs interpreted (the interpreter tier, on by default with two threads) */
        if (s == 0 && t->fn) kl_fn_wait_compiled(t->fn);
        if (s == 0 && o->profile && kl_profiler_start(NULL) < 0) {
            rc = fail_kiln("kl_profiler_start");
            goto done;
        }
        for (int i = 0; i < o->batch; i++) idx[i] = (int64_t)(fashion_rand_next(&rng) % (uint64_t)ntrain);
        double loss, t0 = now_s();
        if (fashion_trainer_step(t, idx, o->batch, &loss) < 0) {
            rc = fail_kiln("a training step");
            goto done;
        }
        if (s >= 0) ms[s] = 1e3 * (now_s() - t0);
    }
    if (o->profile && (kl_profiler_stop(NULL) < 0 || kl_profiler_summary(stdout) < 0)) {
        rc = fail_kiln("the profiler");
        goto done;
    }
    qsort(ms, (size_t)o->bench_steps, sizeof *ms, cmp_double);
    printf("kiln %-8s batch %d, %d threads: median %.2f ms/step over %d steps (min %.2f, max %.2f)\n",
           compiled ? "compiled" : "eager", o->batch, kl_get_num_threads(), ms[o->bench_steps / 2],
           o->bench_steps, ms[0], ms[o->bench_steps - 1]);
    rc = 0;
done:
    free(idx);
    free(ms);
    return rc;
}

static int train(const options *o, const fashion_set *tr, const fashion_set *te, bool compiled, run_result *res) {
    fashion_trainer t = {0};
    bool have_trainer = false;
    int rc = 1;
    int64_t *order = malloc(sizeof(int64_t) * (size_t)tr->n);
    int64_t steps_per_epoch = (tr->n + o->batch - 1) / o->batch;
    kl_scope_begin(); /* owns the data tensors */
    kl_tensor *xtr = kl_from_data(tr->x, KL_SHAPE(tr->n, 1, FASHION_SIDE, FASHION_SIDE), KL_F32);
    kl_tensor *ytr = kl_from_data(tr->y, KL_SHAPE(tr->n), KL_I64);
    kl_tensor *xte = kl_from_data(te->x, KL_SHAPE(te->n, 1, FASHION_SIDE, FASHION_SIDE), KL_F32);
    kl_tensor *yte = kl_from_data(te->y, KL_SHAPE(te->n), KL_I64);
    fashion_config cfg = {.lr = o->lr, .weight_decay = 0.01, .dropout = o->dropout,
                          .total_steps = steps_per_epoch * o->epochs, .seed = o->seed, .compiled = compiled};
    if (!order || !xtr || !ytr || !xte || !yte || fashion_trainer_init(&t, &cfg, xtr, ytr) < 0) {
        rc = fail_kiln("setting up the model");
        goto done;
    }
    have_trainer = true;
    if (o->load) {
        if (fashion_trainer_load(&t, o->load) < 0) {
            rc = fail_kiln("loading the model");
            goto done;
        }
        printf("loaded %s (+ .optim): resuming after step %lld\n", o->load, (long long)fashion_trainer_steps(&t));
    }
    if (o->bench_steps) {
        rc = bench(o, &t, tr->n, compiled);
        goto done;
    }
    printf("\n%s: loss and gradients %s, AdamW eager\n", compiled ? "compiled" : "eager",
           compiled ? "by one kl_compile'd function (traced once per batch size)" : "by eager ops and autograd");
    printf("epoch  train loss  test acc  images/s\n");
    int64_t live_after_first = -1;
    double loss_sum = 0, ips_sum = 0;
    int ips_epochs = 0, first = (int)(fashion_trainer_steps(&t) / steps_per_epoch) + 1;
    res->acc = -1;
    for (int epoch = first; epoch <= o->epochs; epoch++) {
        shuffle(order, tr->n, o->seed, epoch);
        double t0 = now_s();
        int64_t seen = 0;
        loss_sum = 0;
        /* a run saved mid-epoch resumes at its next batch */
        for (int64_t s = (fashion_trainer_steps(&t) % steps_per_epoch) * o->batch; s < tr->n; s += o->batch) {
            int64_t bs = tr->n - s < o->batch ? tr->n - s : o->batch;
            double loss;
            if (fashion_trainer_step(&t, order + s, bs, &loss) < 0) {
                rc = fail_kiln("a training step");
                goto done;
            }
            loss_sum += loss * (double)bs;
            seen += bs;
        }
        double dt = now_s() - t0;
        double acc = fashion_accuracy(&t.net, xte, yte, 500);
        if (acc < 0) {
            rc = fail_kiln("evaluation");
            goto done;
        }
        if (epoch > first || o->epochs == first) ips_sum += (double)seen / dt, ips_epochs++;
        res->acc = acc;
        res->loss = loss_sum / (double)seen;
        printf("%5d  %10.4f  %7.2f%%  %8.0f\n", epoch, res->loss, acc, (double)seen / dt);
        fflush(stdout);
        if (o->save && fashion_trainer_save(&t, o->save) < 0) {
            rc = fail_kiln("saving the model");
            goto done;
        }
        /* Optimizer state and the compiled graphs appear during the first
         * epoch; after it nothing may grow. */
        if (live_after_first < 0) live_after_first = kl_live_tensors();
        else if (kl_live_tensors() != live_after_first) {
            fprintf(stderr, "fashion: live tensors went from %lld after epoch %d to %lld after epoch %d\n",
                    (long long)live_after_first, first, (long long)kl_live_tensors(), epoch);
            goto done;
        }
    }
    if (res->acc < 0) {
        printf("nothing to train: the loaded state is already at epoch %d\n", o->epochs);
        res->acc = fashion_accuracy(&t.net, xte, yte, 500);
    }
    res->steady_ips = ips_epochs ? ips_sum / ips_epochs : 0;
    if (t.fn) {
        kl_fn_stats st;
        if (kl_fn_get_stats(t.fn, &st) == 0) {
            res->compile_ms = st.compile_ms;
            res->kernels = st.traces ? st.kernels / st.traces : 0;
        }
    }
    if (o->save) printf("saved %s and %s.optim\n", o->save, o->save);
    rc = 0;
done:
    if (have_trainer) fashion_trainer_free(&t);
    kl_scope_end();
    free(order);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) < 0) return 2;
    if (o.threads > 0) kl_set_num_threads(o.threads);

    char dir[4096], err[4096 + 256];
    const char *base = getenv("KILN_DATA_DIR");
    if (o.data) snprintf(dir, sizeof dir, "%s", o.data);
    else snprintf(dir, sizeof dir, "%s/fashion", base && *base ? base : "data");
    char probe[4200];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", dir);
    if (stat(probe, &st) != 0 && (snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte", dir), stat(probe, &st) != 0)) {
        fprintf(stderr, "fashion: no Fashion-MNIST in %s; run scripts/fetch_fashion.sh (or pass --data DIR)%s\n", dir,
                o.skip_missing ? ": skipped" : "");
        return o.skip_missing ? 77 : 1;
    }
    fashion_set train_set, test_set;
    if (fashion_load(dir, "train", o.limit, &train_set, err, sizeof err) < 0) {
        fprintf(stderr, "fashion: %s\n", err);
        return 1;
    }
    if (fashion_load(dir, "t10k", o.test_limit, &test_set, err, sizeof err) < 0) {
        fprintf(stderr, "fashion: %s\n", err);
        fashion_free(&train_set);
        return 1;
    }
    printf("fashion: CNN conv32-bn-relu-pool conv64-bn-relu-pool dropout %.2f fc128 fc10, AdamW lr %g (cosine)\n"
           "         wd 0.01, batch %d, %d threads, %lld train / %lld test images\n",
           o.dropout, o.lr, o.batch, kl_get_num_threads(), (long long)train_set.n, (long long)test_set.n);
    run_result eager = {0}, comp = {0};
    int rc = 0;
    if (o.mode != MODE_COMPILED) rc = train(&o, &train_set, &test_set, false, &eager);
    if (!rc && o.mode != MODE_EAGER) rc = train(&o, &train_set, &test_set, true, &comp);
    if (!rc && !o.bench_steps) {
        if (o.mode != MODE_COMPILED)
            printf("\neager    %.2f%% test accuracy, final train loss %.4f, %.0f images/s\n", eager.acc, eager.loss,
                   eager.steady_ips);
        if (o.mode != MODE_EAGER)
            printf("%scompiled %.2f%% test accuracy, final train loss %.4f, %.0f images/s; %lld kernels and\n"
                   "         library calls per step, %.0f ms to trace and compile\n",
                   o.mode == MODE_COMPILED ? "\n" : "", comp.acc, comp.loss, comp.steady_ips, (long long)comp.kernels,
                   comp.compile_ms);
        if (o.mode == MODE_BOTH && eager.steady_ips > 0)
            printf("compiled / eager speed: %.2fx\n", comp.steady_ips / eager.steady_ips);
        /* The target is for full runs; --limit runs check it only when asked. */
        bool check = (o.limit == 0 && o.test_limit == 0) || o.min_accuracy_set;
        double worst = o.mode == MODE_BOTH ? fmin(eager.acc, comp.acc) : o.mode == MODE_EAGER ? eager.acc : comp.acc;
        if (check && worst < o.min_accuracy) {
            fprintf(stderr, "fashion: FAILED: test accuracy %.2f%% is below %.2f%%\n", worst, o.min_accuracy);
            rc = 1;
        }
    }
    fashion_free(&train_set);
    fashion_free(&test_set);
    return rc;
}
