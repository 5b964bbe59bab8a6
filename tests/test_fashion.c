/*
 * test_fashion.c — issue 16's Fashion-MNIST CNN (examples/fashion) for a
 * few steps: eager and compiled training agree (losses, parameters, batch
 * norm running statistics), a saved and reloaded trainer resumes with the
 * losses an uninterrupted one has, eval mode reads the running statistics,
 * and the IDX reader rejects bad files with clear messages. Images are
 * synthetic, or the first 256 real ones when data/fashion is there
 * ($KT_FASHION_DIR): real data is never required.
 */
#include "harness.h"

#include "fashion_data.h"
#include "fashion_model.h"

#include <zlib.h>

enum { NIMG = 256, BATCH = 32, STEPS = 4 };

/* NIMG images [NIMG,1,28,28] and labels: real ones if available, else
 * blobs whose class decides where a bright square sits (learnable). */
static void make_data(kl_tensor **x, kl_tensor **y) {
    const char *dir = getenv("KT_FASHION_DIR");
    fashion_set s;
    char err[512];
    if (dir && fashion_load(dir, "train", NIMG, &s, err, sizeof err) == 0 && s.n == NIMG) {
        *x = kl_from_data(s.x, KL_SHAPE(NIMG, 1, FASHION_SIDE, FASHION_SIDE), KL_F32);
        *y = kl_from_data(s.y, KL_SHAPE(NIMG), KL_I64);
        fashion_free(&s);
        return;
    }
    static float px[NIMG * FASHION_PIXELS];
    static int64_t lab[NIMG];
    uint64_t rng = 12345;
    for (int i = 0; i < NIMG; i++) {
        lab[i] = (int64_t)(fashion_rand_next(&rng) % 10);
        for (int p = 0; p < FASHION_PIXELS; p++)
            px[i * FASHION_PIXELS + p] = (float)(fashion_rand_next(&rng) % 64) / 255.0f;
        int r0 = 2 + (int)lab[i] * 2, c0 = 4 + (int)(lab[i] % 3) * 6;
        for (int r = r0; r < r0 + 6; r++)
            for (int c = c0; c < c0 + 6; c++) px[i * FASHION_PIXELS + r * FASHION_SIDE + c] = 1.0f;
    }
    *x = kl_from_data(px, KL_SHAPE(NIMG, 1, FASHION_SIDE, FASHION_SIDE), KL_F32);
    *y = kl_from_data(lab, KL_SHAPE(NIMG), KL_I64);
}

static fashion_config config(bool compiled) {
    return (fashion_config){.lr = 2e-3, .weight_decay = 0.01, .dropout = 0.25, .total_steps = 20, .seed = 7,
                            .compiled = compiled};
}

/* Batch k of a fixed order (every 7th image, wrapping). */
static void batch_indices(int k, int64_t *idx) {
    for (int i = 0; i < BATCH; i++) idx[i] = ((k * BATCH + i) * 7) % NIMG;
}

static bool close_rel(double a, double b, double tol) { return fabs(a - b) <= tol * (1 + fabs(b)); }

static void assert_same_state(const fashion_trainer *a, const fashion_trainer *b, double rtol, double atol) {
    for (int i = 0; i < FASHION_NPARAMS; i++) {
        int ok = kl_allclose(a->net.p[i], b->net.p[i], rtol, atol, false);
        if (ok != 1) print_error("parameter %d differs\n", i);
        assert_int_equal(ok, 1);
    }
    for (int i = 0; i < FASHION_NBUFFERS; i++) {
        int ok = kl_allclose(a->net.buf[i], b->net.buf[i], rtol, atol, false);
        if (ok != 1) print_error("running buffer %d differs\n", i);
        assert_int_equal(ok, 1);
    }
}

static void eager_and_compiled_steps_agree(void **state) {
    (void)state;
    kl_tensor *x, *y;
    make_data(&x, &y);
    fashion_trainer e, c;
    fashion_config ce = config(false), cc = config(true);
    assert_int_equal(fashion_trainer_init(&e, &ce, x, y), 0);
    assert_int_equal(fashion_trainer_init(&c, &cc, x, y), 0);
    assert_non_null(c.fn);
    assert_null(e.fn);
    assert_same_state(&e, &c, 0, 0); /* same seed, same init */
    int64_t idx[BATCH];
    double first = 0, le = 0, lc = 0;
    for (int k = 0; k < STEPS; k++) {
        batch_indices(k, idx);
        assert_int_equal(fashion_trainer_step(&e, idx, BATCH, &le), 0);
        assert_int_equal(fashion_trainer_step(&c, idx, BATCH, &lc), 0);
        if (!close_rel(lc, le, 1e-4)) print_error("step %d: compiled loss %.9g, eager %.9g\n", k, lc, le);
        assert_true(close_rel(lc, le, 1e-4));
        if (k == 0) first = le;
        /* the running statistics are updated in place, eagerly and compiled */
        assert_same_state(&e, &c, 1e-3, 1e-5);
    }
    assert_true(first > 1.5 && first < 4); /* about log(10) at the start */
    /* they moved away from their init (mean 0, var 1) */
    assert_true(kl_item(kl_amax(kl_abs(e.net.buf[0]), KL_ALL_DIMS, false)) > 1e-3);
    assert_true(kl_item(kl_amax(kl_abs(kl_sub_scalar(e.net.buf[3], 1)), KL_ALL_DIMS, false)) > 1e-3);
    kl_fn_stats st;
    assert_int_equal(kl_fn_get_stats(c.fn, &st), 0);
    assert_int_equal(st.traces, 1);      /* one batch size, one trace */
    assert_int_equal(st.eager_calls, 0); /* and no fallback */
    assert_int_equal(st.cache_hits, STEPS - 1);
    /* eval mode uses the running statistics: same accuracy from both */
    double ae = fashion_accuracy(&e.net, x, y, 100), ac = fashion_accuracy(&c.net, x, y, 100);
    assert_true(ae >= 0 && ac >= 0);
    assert_true(fabs(ae - ac) <= 100.0 * 2 / NIMG); /* at most a near-tie or two flips */
    fashion_trainer_free(&e);
    fashion_trainer_free(&c);
}

/* Eval-mode logits follow the running statistics: changing them changes the output. */
static void eval_reads_running_statistics(void **state) {
    (void)state;
    kl_tensor *x, *y;
    make_data(&x, &y);
    fashion_net m;
    kl_manual_seed(3);
    assert_int_equal(fashion_net_init(&m), 0);
    kl_tensor *xb = kl_narrow(x, 0, 0, 8);
    kl_no_grad_begin();
    kl_tensor *a = fashion_forward(m.p, m.buf, xb, 0.5, false);
    kl_tensor *a2 = fashion_forward(m.p, m.buf, xb, 0.5, false); /* no dropout in eval: deterministic */
    assert_int_equal(kl_allclose(a, a2, 0, 0, false), 1);
    kl_fill_inplace(m.buf[1], 4.0); /* bn1's running variance */
    kl_tensor *b = fashion_forward(m.p, m.buf, xb, 0.5, false);
    kl_no_grad_end();
    assert_int_equal(kl_allclose(a, b, 1e-3, 1e-3, false), 0);
    fashion_net_free(&m);
}

static void save_load_resumes_training(void **state) {
    (void)state;
    kl_tensor *x, *y;
    make_data(&x, &y);
    const char *path = kt_tmp_path("fashion_resume.safetensors");
    for (int compiled = 0; compiled < 2; compiled++) {
        fashion_config cfg = config(compiled);
        fashion_trainer a, b;
        assert_int_equal(fashion_trainer_init(&a, &cfg, x, y), 0);
        int64_t idx[BATCH];
        double la[STEPS], lb[STEPS];
        for (int k = 0; k < 2; k++) {
            batch_indices(k, idx);
            assert_int_equal(fashion_trainer_step(&a, idx, BATCH, &la[k]), 0);
        }
        assert_int_equal(fashion_trainer_save(&a, path), 0);
        for (int k = 2; k < STEPS; k++) {
            batch_indices(k, idx);
            assert_int_equal(fashion_trainer_step(&a, idx, BATCH, &la[k]), 0);
        }
        /* a fresh trainer from another seed's init: everything must come from the files */
        fashion_config other = cfg;
        other.seed = 99;
        assert_int_equal(fashion_trainer_init(&b, &other, x, y), 0);
        b.cfg.seed = cfg.seed; /* the run's seed (it picks the dropout masks), as the demo's --seed */
        assert_int_equal(fashion_trainer_load(&b, path), 0);
        assert_int_equal(fashion_trainer_steps(&b), 2);
        for (int k = 2; k < STEPS; k++) {
            batch_indices(k, idx);
            assert_int_equal(fashion_trainer_step(&b, idx, BATCH, &lb[k]), 0);
            if (!close_rel(lb[k], la[k], 1e-6))
                print_error("%s step %d: resumed loss %.9g, uninterrupted %.9g\n", compiled ? "compiled" : "eager", k,
                            lb[k], la[k]);
            assert_true(close_rel(lb[k], la[k], 1e-6));
        }
        assert_same_state(&a, &b, 1e-6, 1e-7);
        fashion_trainer_free(&a);
        fashion_trainer_free(&b);
    }
}

/* A file of the wrong model is refused and changes nothing. */
static void load_rejects_other_files(void **state) {
    (void)state;
    kl_tensor *x, *y;
    make_data(&x, &y);
    fashion_config cfg = config(false);
    fashion_trainer t;
    assert_int_equal(fashion_trainer_init(&t, &cfg, x, y), 0);
    kl_tensor *before = kl_clone(t.net.p[0]);
    const char *path = kt_tmp_path("not_fashion.safetensors");
    kl_tensor *w = kl_zeros(KL_SHAPE(3, 3), KL_F32);
    const char *name = "conv1.weight";
    assert_int_equal(kl_save_safetensors(path, 1, &name, &w, NULL), 0);
    assert_int_equal(fashion_trainer_load(&t, path), -1);
    assert_int_equal(kl_allclose(before, t.net.p[0], 0, 0, false), 1);
    assert_int_equal(fashion_trainer_load(&t, kt_tmp_path("absent.safetensors")), -1);
    KT_EXPECT_ERROR(KL_ERR_IO, "absent.safetensors");
    fashion_trainer_free(&t);
}

/* ---- the IDX reader ---------------------------------------------------------------------- */

static void write_gz(const char *path, const void *data, size_t len) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
    assert_int_equal(gzclose(f), Z_OK);
}

static void write_plain(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* An idx3 file of n 28x28 images with pixel i of image k = (k + i) % 256. */
static size_t make_images(uint8_t *buf, int n) {
    uint8_t head[16] = {0, 0, 8, 3, 0, 0, 0, (uint8_t)n, 0, 0, 0, 28, 0, 0, 0, 28};
    memcpy(buf, head, 16);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < FASHION_PIXELS; i++) buf[16 + k * FASHION_PIXELS + i] = (uint8_t)((k + i) % 256);
    return 16 + (size_t)n * FASHION_PIXELS;
}

static size_t make_labels(uint8_t *buf, int n) {
    uint8_t head[8] = {0, 0, 8, 1, 0, 0, 0, (uint8_t)n};
    memcpy(buf, head, 8);
    for (int k = 0; k < n; k++) buf[8 + k] = (uint8_t)(k * 3 % 10);
    return 8 + (size_t)n;
}

static void expect_idx_error(const char *path, int ndim, const char *needle) {
    idx_array a;
    char err[1024] = "";
    assert_int_equal(idx_load(path, ndim, &a, err, sizeof err), -1);
    assert_null(a.data);
    if (!strstr(err, needle) || !strstr(err, path)) print_error("want \"%s\" and the path in: %s\n", needle, err);
    assert_non_null(strstr(err, needle));
    assert_non_null(strstr(err, path));
}

static void idx_reader_reads_and_rejects(void **state) {
    (void)state;
    static uint8_t img[16 + 5 * FASHION_PIXELS], lab[8 + 5], bad[16 + 5 * FASHION_PIXELS + 1];
    size_t ni = make_images(img, 5), nl = make_labels(lab, 5);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", kt_tmp_path("idx"));
    assert_int_equal(mkdir(dir, 0700), 0);
    char ip[600], lp[600];
    snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte", dir); /* plain: the reader takes both */
    write_gz(ip, img, ni);
    write_plain(lp, lab, nl);

    /* good files: values, scaling, limit */
    fashion_set s;
    char err[1024] = "";
    int rc = fashion_load(dir, "train", 0, &s, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(s.n, 5);
    assert_true(fabsf(s.x[2 * FASHION_PIXELS + 10] - 12.0f / 255.0f) < 1e-7f);
    assert_true(s.y[4] == 2);
    fashion_free(&s);
    assert_int_equal(fashion_load(dir, "train", 3, &s, err, sizeof err), 0);
    assert_int_equal(s.n, 3);
    fashion_free(&s);

    char p[600];
    snprintf(p, sizeof p, "%s/x.gz", dir);
    /* truncated data (gzip'd and plain), header, magic */
    write_gz(p, img, ni - 100);
    expect_idx_error(p, 3, "truncated: 3820 of 3920 data bytes");
    write_plain(p, img, ni - 1);
    expect_idx_error(p, 3, "truncated");
    write_gz(p, img, 10);
    expect_idx_error(p, 3, "truncated header");
    write_gz(p, img, 2);
    expect_idx_error(p, 3, "truncated: 2 of the 4 magic bytes");
    memcpy(bad, img, ni);
    bad[2] = 0x0d; /* float elements */
    write_gz(p, bad, ni);
    expect_idx_error(p, 3, "bad magic 00 00 0d 03");
    expect_idx_error(ip, 1, "bad magic 00 00 08 03"); /* images where labels are wanted */
    memcpy(bad, img, ni);
    bad[11] = 0; /* a zero-sized dimension */
    write_gz(p, bad, ni);
    expect_idx_error(p, 3, "dimension 1 has size 0");
    memcpy(bad, img, ni);
    bad[4] = 0xff; /* 4 billion images */
    write_gz(p, bad, ni);
    expect_idx_error(p, 3, "dimension 0 has size");
    memcpy(bad, img, ni);
    bad[ni] = 1; /* one byte too many */
    write_gz(p, bad, ni + 1);
    expect_idx_error(p, 3, "trailing bytes");
    /* not gzip, not IDX: a text file */
    write_plain(p, "hello, world\n", 13);
    expect_idx_error(p, 3, "bad magic");
    /* a gzip stream corrupted in the middle */
    write_gz(p, img, ni);
    {
        FILE *f = fopen(p, "r+b");
        assert_non_null(f);
        fseek(f, 40, SEEK_SET);
        fputc(0xAA, f), fputc(0x55, f), fputc(0xAA, f);
        fclose(f);
    }
    idx_array a;
    assert_int_equal(idx_load(p, 3, &a, err, sizeof err), -1); /* corrupt or truncated, never a crash */
    assert_non_null(strstr(err, p));
    snprintf(p, sizeof p, "%s/absent.gz", dir);
    expect_idx_error(p, 3, "cannot open");

    /* whole-set checks: label count, label range, image size */
    uint8_t lab4[8 + 4];
    write_plain(lp, lab4, make_labels(lab4, 4));
    assert_int_equal(fashion_load(dir, "train", 0, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "has 4 labels for the 5 images"));
    lab[8 + 2] = 10;
    write_plain(lp, lab, nl);
    assert_int_equal(fashion_load(dir, "train", 0, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "label 2 is 10"));
    make_labels(lab, 5);
    write_plain(lp, lab, nl);
    memcpy(bad, img, ni);
    bad[11] = 14, bad[15] = 56; /* 14 x 56: same bytes, wrong shape */
    write_gz(ip, bad, ni);
    assert_int_equal(fashion_load(dir, "train", 0, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "images are 14x56, not 28x28"));
    assert_null(s.x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        KT_TEST(eager_and_compiled_steps_agree),
        KT_TEST(eval_reads_running_statistics),
        KT_TEST(save_load_resumes_training),
        KT_TEST(load_rejects_other_files),
        KT_TEST(idx_reader_reads_and_rejects),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kt_tmp_cleanup();
    return rc;
}
