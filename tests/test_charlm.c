/*
 * test_charlm.c — the charlm demo's model (examples/charlm) in a tiny
 * configuration (1 layer, 2 heads, embedding 16, context 16) on a built-in
 * text: the corpus split and the bigram baseline against values computed
 * independently in Python, eager against compiled training (the whole step
 * compiled, and the loss compiled with kl_backward from eager code; both must
 * really compile: one trace, no eager fallback), save/load and
 * resume against uninterrupted training, and sampling (deterministic for a
 * seed; top-k 1 is argmax decoding).
 */
#include "harness.h"

#include "charlm_data.h"
#include "charlm_model.h"

/* 13 fortunes: number 9 (0-based) is the validation text. */
static const char text[] =
    "A journey of a thousand miles begins with a single step.\n%\n"
    "The early bird gets the worm, but the second mouse gets the cheese.\n%\n"
    "Do not put off until tomorrow what you can do the day after tomorrow.\n%\n"
    "You will be hungry again in one hour.\n%\n"
    "A closed mouth gathers no feet.\n%\n"
    "Today is the first day of the rest of your life.\n%\n"
    "Never trust a computer you cannot throw out of a window.\n%\n"
    "The best way to predict the future is to invent it.\n%\n"
    "If it ain't broke, don't fix it.\n%\n"
    "You will meet a tall dark stranger.\n\tHe will be a programmer.\n%\n"
    "Time flies like an arrow; fruit flies like a banana.\n%\n"
    "There is no place like home.\n%\n"
    "All that glitters is not gold.\n%\n";

enum { BATCH = 4, STEPS = 6 };

static void load_corpus(charlm_corpus *c) {
    char err[256];
    assert_int_equal(charlm_corpus_from_text(text, sizeof text - 1, c, err, sizeof err), 0);
}

static charlm_config tiny(const charlm_corpus *c) {
    return (charlm_config){.vocab = c->vocab.size, .layers = 1, .heads = 2, .embed = 16, .context = 16};
}

static charlm_train_options schedule(bool compiled) {
    return (charlm_train_options){.lr = 1e-2, .min_lr = 1e-3, .warmup = 2, .total = STEPS, .weight_decay = 0.01,
                                  .beta2 = 0.99, .clip = 1.0, .compiled = compiled};
}

/* The batch of step s (the demo's scheme: a generator per step). */
static void batch_of(const charlm_corpus *c, int64_t s, int64_t *x, int64_t *y) {
    uint64_t rng = 1234 + (uint64_t)s * 7919;
    charlm_windows(c->train, c->n_train, BATCH, 16, &rng, x, y);
}

/* Trains steps [from, to) recording each loss. */
static void run_steps(charlm_trainer *t, const charlm_corpus *c, int from, int to, double *loss) {
    int64_t x[BATCH * 16], y[BATCH * 16];
    for (int s = from; s < to; s++) {
        batch_of(c, s, x, y);
        double norm;
        if (charlm_trainer_step(t, x, y, BATCH, &loss[s], &norm) < 0) fail_msg("step %d: %s", s, kl_last_error());
        assert_true(isfinite(loss[s]) && norm > 0);
    }
}

static void corpus_split_and_bigram(void **state) {
    (void)state;
    charlm_corpus c;
    load_corpus(&c);
    /* Python: same split (fortune i % 10 == 9 to validation), add-one bigram. */
    assert_int_equal(c.fortunes, 13);
    assert_int_equal(c.n_train, 593);
    assert_int_equal(c.n_val, 64);
    assert_int_equal(c.vocab.size, 39);
    const char *val = "You will meet a tall dark stranger.\n\tHe will be a programmer.\n%\n";
    for (int i = 0; i < 64; i++) assert_int_equal(c.vocab.byte_of[c.val[i]], (uint8_t)val[i]);
    assert_true(fabs(charlm_bigram_loss(&c) - 2.923312829121676) < 1e-12);
    /* Windows: y is x shifted by one, every start inside the text. */
    int64_t x[3 * 16], y[3 * 16];
    uint64_t rng = 5;
    charlm_windows(c.train, c.n_train, 3, 16, &rng, x, y);
    for (int b = 0; b < 3; b++) {
        int64_t s = 0;
        while (s + 16 < c.n_train && memcmp(c.train + s, x + b * 16, sizeof(int64_t) * 16)) s++;
        assert_true(s + 16 < c.n_train);
        assert_memory_equal(c.train + s + 1, y + b * 16, sizeof(int64_t) * 16);
    }
    charlm_corpus_free(&c);
    char err[256];
    assert_int_equal(charlm_corpus_from_text("", 0, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "empty"));
    assert_int_equal(charlm_corpus_from_text("one\n%\ntwo\n%\n", 12, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "no validation text"));
}

/* A folder of fortune files reads as fetch_fortunes.sh leaves it: regular
 * files by name, each ending its last fortune; no *.dat index, no SOURCES, no
 * link (the packages' *.u8 names of the same files). */
static void corpus_from_folder(void **state) {
    (void)state;
    const char *dir = kt_tmp_path("fortunes");
    assert_int_equal(mkdir(dir, 0700), 0);
    static const struct {
        const char *name, *text;
    } files[] = {
        {"b", "two\n%\nthree\n%\nfour\n%\nfive\n%\nsix\n%\nseven\n%\neight\n%\nnine\n%\nten, the held-out one\n%\n"},
        {"a", "one\n%\n"},
        {"a.dat", "binary index"},
        {"SOURCES", "fortunes 1:1.99.1-7.3"},
        {"c", "eleven, no final newline"},
    };
    char path[600];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(files[i].text, f);
        fclose(f);
    }
    char target[600];
    snprintf(target, sizeof target, "%s/a", dir);
    snprintf(path, sizeof path, "%s/a.u8", dir);
    assert_int_equal(symlink(target, path), 0);
    charlm_corpus c;
    char err[256];
    assert_int_equal(charlm_corpus_load(dir, &c, err, sizeof err), 0);
    assert_int_equal(c.fortunes, 11);
    char val[64] = {0}, train[256] = {0};
    for (int64_t i = 0; i < c.n_val; i++) val[i] = (char)c.vocab.byte_of[c.val[i]];
    for (int64_t i = 0; i < c.n_train; i++) train[i] = (char)c.vocab.byte_of[c.train[i]];
    assert_string_equal(val, "ten, the held-out one\n%\n");
    assert_string_equal(train, "one\n%\ntwo\n%\nthree\n%\nfour\n%\nfive\n%\nsix\n%\nseven\n%\neight\n%\nnine\n%\n"
                               "eleven, no final newline\n%\n");
    charlm_corpus_free(&c);
    assert_int_equal(charlm_corpus_load(kt_tmp_path("nothing-here"), &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "not found"));
}

static void bad_configs_are_refused(void **state) {
    (void)state;
    charlm_config bad = {.vocab = 10, .layers = 1, .heads = 3, .embed = 16, .context = 8};
    assert_null(charlm_params_new(&bad)); /* 16 is not a multiple of 3 heads */
    bad.heads = 2, bad.context = 0;
    assert_null(charlm_params_new(&bad));
}

/* Eager, the compiled step and the compiled loss + kl_backward train alike. */
static void eager_and_compiled_train_alike(void **state) {
    (void)state;
    charlm_corpus c;
    load_corpus(&c);
    charlm_config cfg = tiny(&c);
    static const char *name[3] = {"eager", "compiled step", "compiled forward"};
    double loss[3][STEPS];
    charlm_trainer t[3];
    for (int m = 0; m < 3; m++) {
        kl_manual_seed(7);
        charlm_train_options o = schedule(m > 0);
        o.forward_only = m == 2;
        assert_int_equal(charlm_trainer_init(&t[m], &cfg, &o), 0);
        assert_int_equal(t[m].n_params, charlm_n_params(&cfg));
        run_steps(&t[m], &c, 0, STEPS, loss[m]);
    }
    for (int m = 1; m < 3; m++)
        for (int s = 0; s < STEPS; s++)
            if (fabs(loss[0][s] - loss[m][s]) > 1e-4 * (1 + fabs(loss[0][s])))
                fail_msg("step %d: eager loss %.7f, %s %.7f", s, loss[0][s], name[m], loss[m][s]);
    /* Training does something: the loss falls from about ln(vocab). */
    assert_true(fabs(loss[0][0] - log(39.0)) < 0.3);
    assert_true(loss[0][STEPS - 1] < loss[0][0] - 0.3);
    kl_scope_begin();
    for (int m = 1; m < 3; m++)
        for (int i = 0; i < t[0].n_params; i++)
            if (kl_allclose(t[0].param[i], t[m].param[i], 1e-3, 1e-4, false) != 1)
                fail_msg("%s: parameter %s differs after %d steps", name[m], kl_params_name(t[0].params, i), STEPS);
    kl_scope_end();
    /* Both compiled ways really compile: one trace, every later call a cache
     * hit, nothing run eagerly; the forward-only one through the compiled
     * forward and backward graphs (one autograd node per call). */
    kl_fn_stats st;
    for (int m = 1; m < 3; m++) {
        assert_int_equal(kl_fn_get_stats(t[m].fn, &st), 0);
        assert_int_equal(st.calls, STEPS);
        assert_int_equal(st.traces, 1);
        assert_int_equal(st.eager_calls, 0);
        assert_int_equal(st.cache_hits, STEPS - 1);
    }
    assert_int_equal(st.aot_calls, STEPS);
    assert_int_equal(st.opbyop_grad_calls, 0);
    assert_int_equal(st.backward_calls, STEPS);
    /* The held-out loss is a real number near the batch losses. */
    double v = charlm_eval(&t[1], c.val, c.n_val, 8, 3, 1);
    assert_true(isfinite(v) && fabs(v - loss[1][STEPS - 1]) < 1.5);
    for (int m = 0; m < 3; m++) charlm_trainer_free(&t[m]);
    charlm_corpus_free(&c);
}

static void save_load_resumes(void **state) {
    (void)state;
    charlm_corpus c;
    load_corpus(&c);
    charlm_config cfg = tiny(&c);
    for (int way = 0; way < 3; way++) { /* eager, compiled step, compiled forward */
        charlm_train_options o = schedule(way > 0);
        o.forward_only = way == 2;
        double whole[STEPS], resumed[STEPS];
        charlm_trainer a, b;
        kl_manual_seed(3);
        assert_int_equal(charlm_trainer_init(&a, &cfg, &o), 0);
        run_steps(&a, &c, 0, STEPS, whole);
        charlm_trainer_free(&a);

        kl_manual_seed(3);
        assert_int_equal(charlm_trainer_init(&a, &cfg, &o), 0);
        run_steps(&a, &c, 0, STEPS / 2, resumed);
        const char *path = kt_tmp_path("charlm.safetensors");
        assert_int_equal(charlm_save(&a, path), 0);
        charlm_trainer_free(&a);

        kl_manual_seed(99); /* a different initialisation, overwritten by the load */
        assert_int_equal(charlm_trainer_init(&b, &cfg, &o), 0);
        assert_int_equal(charlm_load(&b, path), 0);
        assert_int_equal(charlm_trainer_steps(&b), STEPS / 2);
        run_steps(&b, &c, STEPS / 2, STEPS, resumed);
        for (int s = STEPS / 2; s < STEPS; s++)
            if (fabs(whole[s] - resumed[s]) > 1e-6)
                fail_msg("way %d step %d: uninterrupted %.9f, resumed %.9f", way, s, whole[s], resumed[s]);
        charlm_trainer_free(&b);

        /* A model of another shape does not load (and says why). */
        charlm_config other = cfg;
        other.embed = 8;
        assert_int_equal(charlm_trainer_init(&b, &other, &o), 0);
        assert_int_equal(charlm_load(&b, path), -1);
        assert_non_null(strstr(kl_last_error(), "but the file's tensor is"));
        kl_clear_error();
        charlm_trainer_free(&b);
    }
    charlm_corpus_free(&c);
}

/* Greedy decoding written out: argmax of the last position's logits. */
static void argmax_decode(const charlm_trainer *t, const int64_t *prompt, int n_prompt, int n, int64_t *out) {
    int64_t seq[64];
    memcpy(seq, prompt, sizeof(int64_t) * (size_t)n_prompt);
    int len = n_prompt;
    kl_no_grad_begin();
    for (int i = 0; i < n; i++) {
        int ctx = len < t->cfg.context ? len : t->cfg.context;
        kl_scope_begin();
        kl_tensor *logits = charlm_forward(&t->cfg, t->param, kl_from_data(seq + len - ctx, KL_SHAPE(1, ctx), KL_I64));
        const float *l = kl_data_ptr(kl_contiguous(kl_select(kl_select(logits, 0, 0), 0, ctx - 1)));
        assert_non_null(l);
        int best = 0;
        for (int v = 1; v < t->cfg.vocab; v++)
            if (l[v] > l[best]) best = v;
        seq[len++] = best;
        kl_scope_end();
    }
    kl_no_grad_end();
    memcpy(out, seq + n_prompt, sizeof(int64_t) * (size_t)n);
}

static void sampling(void **state) {
    (void)state;
    charlm_corpus c;
    load_corpus(&c);
    charlm_config cfg = tiny(&c);
    charlm_train_options o = schedule(false);
    charlm_trainer t;
    kl_manual_seed(11);
    assert_int_equal(charlm_trainer_init(&t, &cfg, &o), 0);
    double loss[STEPS];
    run_steps(&t, &c, 0, STEPS, loss);
    const int64_t prompt[2] = {c.vocab.id_of['%'], c.vocab.id_of['\n']};
    enum { N = 24 }; /* longer than the context: the window slides */
    int64_t a[N], b[N], greedy[N], k1[N];
    kl_manual_seed(5);
    assert_int_equal(charlm_sample(&t, prompt, 2, N, 0.8, 5, a), 0);
    kl_manual_seed(5);
    assert_int_equal(charlm_sample(&t, prompt, 2, N, 0.8, 5, b), 0);
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < N; i++) assert_true(a[i] >= 0 && a[i] < c.vocab.size);
    /* Another seed draws another text (39 symbols, 24 draws: a tie is all but impossible). */
    kl_manual_seed(6);
    assert_int_equal(charlm_sample(&t, prompt, 2, N, 1.5, 0, b), 0);
    assert_true(memcmp(a, b, sizeof a) != 0);
    argmax_decode(&t, prompt, 2, N, greedy);
    for (int seed = 0; seed < 3; seed++) {
        kl_manual_seed((uint64_t)seed);
        assert_int_equal(charlm_sample(&t, prompt, 2, N, 1.0 + seed, 1, k1), 0);
        assert_memory_equal(k1, greedy, sizeof k1);
    }
    charlm_trainer_free(&t);
    charlm_corpus_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(corpus_split_and_bigram),
        KT_TEST(corpus_from_folder),
        KT_TEST(bad_configs_are_refused),
        KT_TEST(eager_and_compiled_train_alike),
        KT_TEST(save_load_resumes),
        KT_TEST(sampling),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
