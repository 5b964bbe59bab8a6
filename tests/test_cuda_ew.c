/*
 * test_cuda_ew.c — eager elementwise ops on CUDA tensors (cn_eager.c: each
 * call is a one-op generated kernel). Every elementwise op of the table, in
 * every compute dtype it has a loop for, is dispatched once with CPU inputs
 * and once with the same values on cuda:0, and the results must be equal bit
 * for bit (NaN to NaN): contiguous operands in every dtype; a transposed
 * first operand and broadcast others (including a 0-dim CPU scalar) in
 * float32 and int64; in-place variants in float32. Every differing case is
 * listed (with its distance in ulp) before the test fails. On the emulated
 * device f64 transcendental functions use the host's libm on both sides; on
 * a GPU, CUDA's libm, which may differ in the last bits (docs/GPU.md): there
 * f64 results within 2 ulp are counted, not failed.
 * Runs on the emulated device in CI (test_cuda_ew_emu); without a device
 * every test skips with the reason.
 */
#include "harness.h"

#include "cuda_harness.h"
#include "../src/codegen_nvrtc/cn.h"
#include "../src/eager/dispatch.h"
#include "../src/eager/ew.h"

#include <pthread.h>

static const char *OP = "cuda_ew_test";

static int ncases, nskipped;


/* A CPU tensor of dtype dt: signs, fractions, a zero, values in (0, 1) for
 * the functions with a narrow domain. */
static kl_tensor *sample(int ndim, const int64_t *shape, kl_dtype dt, int which) {
    kl_tensor *x = kl_mul_scalar(kl_randn(ndim, shape, KL_F64), which == 0 ? 2.0 : 0.7);
    if (dt == KL_BOOL) return kl_gt_scalar(x, 0.0);
    if (dt == KL_U8) return kl_to_dtype(kl_abs(kl_mul_scalar(x, 20)), dt);
    if (!kl_dtype_is_floating(dt)) return kl_add_scalar(kl_to_dtype(kl_mul_scalar(x, 20), dt), which ? 0 : 1);
    return kl_to_dtype(x, dt);
}

/* Default attributes: the declared default, else 0.5 for floats and 0 for
 * integers; a dtype attribute (to_dtype) asks for `target`. */
static void set_attrs(int op, ke_attrs *a, kl_dtype target) {
    memset(a, 0, sizeof *a);
    const ke_attr_set *as = &ke_op_attrs[op];
    for (int i = 0; i < as->n; i++) {
        const ke_attr_desc *d = &as->attr[i];
        int nodef = d->def == KE_NODEF || d->def == KE_HIDDEN;
        if (d->type == KE_AT_FLOAT) a->f[d->slot] = nodef ? 0.5 : d->def;
        else if (d->type == KE_AT_DTYPE) a->i[d->slot] = target;
        else if (d->type != KE_AT_LIST && d->type != KE_AT_LIST2) a->i[d->slot] = nodef ? 0 : (int64_t)d->def;
    }
}

/* Distance in units in the last place between two floats of es bytes
 * (bit patterns as sign-magnitude integers; opposite signs count through 0). */
static int64_t ulps(const unsigned char *p, const unsigned char *q, size_t es) {
    uint64_t a = 0, b = 0;
    memcpy(&a, p, es), memcpy(&b, q, es);
    const uint64_t sign = (uint64_t)1 << (8 * es - 1);
    int64_t oa = (a & sign) ? -(int64_t)(a & (sign - 1)) : (int64_t)a;
    int64_t ob = (b & sign) ? -(int64_t)(b & (sign - 1)) : (int64_t)b;
    return oa > ob ? oa - ob : ob - oa;
}

/* 1 if equal bit for bit (NaN to NaN); else 0, the first differing element
 * printed and *maxulp the largest distance (floats; INT64_MAX otherwise). */
static int same_bits(kl_tensor *a, kl_tensor *b, int64_t *maxulp) {
    *maxulp = INT64_MAX;
    if (kl_dtype_of(a) != kl_dtype_of(b) || kl_numel(a) != kl_numel(b)) return 0;
    size_t es = kl_dtype_size(kl_dtype_of(a));
    const int fl = kl_dtype_is_floating(kl_dtype_of(a));
    const unsigned char *p = kl_data_ptr(a), *q = kl_data_ptr(b);
    int same = 1;
    *maxulp = 0;
    for (int64_t i = 0; i < kl_numel(a); i++) {
        if (!memcmp(p + i * es, q + i * es, es)) continue;
        if (fl && isnan(kt_get(a, i)) && isnan(kt_get(b, i))) continue;
        if (same) print_error("element %lld: cpu %.17g cuda %.17g\n", (long long)i, kt_get(a, i), kt_get(b, i));
        same = 0;
        int64_t u = fl && !isnan(kt_get(a, i)) && !isnan(kt_get(b, i)) ? ulps(p + i * es, q + i * es, es) : INT64_MAX;
        if (u > *maxulp) *maxulp = u;
    }
    return same;
}

static int bitwise(kl_tensor *a, kl_tensor *b) {
    int64_t u;
    return same_bits(a, b, &u);
}

/* Cases that differ from the CPU: every one is listed, then the test fails.
 * On a real GPU an f64 result within 2 ulp is CUDA's libm (docs/GPU.md:
 * f64 transcendental functions are each device's libm) and only counted. */
static int nmismatch, nlibm;

enum { CONTIG, STRIDED, INPLACE };

/* op with operands of compute dtype d (bool where the op reads bool), laid
 * out per `layout`, on the CPU and on CUDA: same bits. */
static void one_case(int op, kl_dtype d, int layout) {
    const ke_ew_impl *impl = ke_ops[op].impl;
    const int nin = ke_ops[op].nin;
    kl_scope_begin();
    kl_tensor *cin[4], *gin[4];
    for (int i = 0; i < nin; i++) {
        kl_dtype dt = (impl->bool_in >> i) & 1 ? KL_BOOL : d;
        if (layout == STRIDED && i == 0) {
            cin[i] = kl_transpose(sample(2, (int64_t[]){5, 3}, dt, i), 0, 1);
            gin[i] = kl_transpose(kl_to_device(kl_transpose(cin[i], 0, 1), CUDA0), 0, 1);
        } else if (layout == STRIDED && i == 1) {
            cin[i] = kl_to_dtype(kl_scalar_tensor(dt == KL_BOOL ? 1 : 2, KL_F64), dt); /* 0-dim: stays on the CPU */
            gin[i] = cin[i];
        } else if (layout == STRIDED) {
            cin[i] = sample(1, (int64_t[]){5}, dt, i);
            gin[i] = kl_to_device(cin[i], CUDA0);
        } else {
            cin[i] = sample(2, (int64_t[]){3, 5}, dt, i);
            gin[i] = kl_to_device(cin[i], CUDA0);
        }
        assert_non_null(cin[i]);
        assert_non_null(gin[i]);
    }
    ke_call c = {.op = op, .nin = nin, .in = cin, .device = KL_DEVICE_CPU, .inplace = layout == INPLACE};
    set_attrs(op, &c.a, d == KL_F64 ? KL_F32 : KL_F64);
    ke_call g = c;
    g.in = gin;
    g.device = CUDA0;
    if (ke_dispatch(&c)) { /* a combination eager refuses: nothing to compare */
        kl_clear_error();
        nskipped++;
        kl_scope_end();
        return;
    }
    int rc = ke_dispatch(&g);
    if (rc) print_error("kl_%s %s layout %d on CUDA: %s\n", ke_ops[op].name, ke_dtypes[d].name, layout, kl_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(kl_device_of(g.out[0]).type, KL_CUDA);
    if (layout == INPLACE) assert_ptr_equal(g.out[0], gin[0]);
    int64_t u;
    if (!same_bits(host(c.out[0]), host(g.out[0]), &u)) {
        int libm = d == KL_F64 && u <= 2 && !kt_cuda_emulated(OP);
        print_error("kl_%s in %s, layout %d: CUDA differs from the CPU by %s%lld ulp%s\n", ke_ops[op].name,
                    ke_dtypes[d].name, layout, u == INT64_MAX ? "more than " : "", (long long)(u == INT64_MAX ? 0 : u),
                    libm ? " (f64 libm on the GPU: counted, not failed)" : "");
        if (libm) nlibm++;
        else nmismatch++;
    }
    ncases++;
    kl_scope_end();
}

static int testable(int op) {
    return ke_ops[op].kind == KE_KIND_EW && ke_ops[op].impl && op != KE_OP_clone && ke_ops[op].nin >= 1;
}

static void every_op_every_dtype_contiguous(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(11);
    ncases = nskipped = nmismatch = nlibm = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        if (!testable(op)) continue;
        const ke_ew_impl *impl = ke_ops[op].impl;
        for (int d = 0; d < KL_NUM_DTYPES; d++)
            if (impl->loop[d]) one_case(op, (kl_dtype)d, CONTIG);
    }
    print_message("%d (op, dtype) cases run, %d refused by eager on the CPU too; %d differ, %d within f64 libm's "
                  "last bits\n", ncases, nskipped, nmismatch, nlibm);
    assert_int_equal(nmismatch, 0);
    assert_true(ncases > 200);
}

static void strided_broadcast_and_scalars(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(12);
    ncases = nskipped = nmismatch = nlibm = 0;
    for (int op = 0; op < KE_OP_COUNT; op++) {
        if (!testable(op)) continue;
        const ke_ew_impl *impl = ke_ops[op].impl;
        if (impl->loop[KL_F32]) one_case(op, KL_F32, STRIDED);
        if (impl->loop[KL_I64]) one_case(op, KL_I64, STRIDED);
        if (impl->loop[KL_F32] && (ke_ops[op].flags & KE_F_INPLACE)) one_case(op, KL_F32, INPLACE);
    }
    print_message("%d strided / broadcast / in-place cases run; %d differ\n", ncases, nmismatch);
    assert_int_equal(nmismatch, 0);
    assert_true(ncases > 100);
}

static void public_ops_and_errors(void **s) {
    (void)s;
    NEED_CUDA();
    kl_tensor *a = kl_randn(KL_SHAPE(4, 6), KL_F32), *b = kl_randn(KL_SHAPE(6), KL_F32);
    kl_tensor *ga = kl_to_device(a, CUDA0), *gb = kl_to_device(b, CUDA0);
    kl_tensor *r = kl_add(kl_mul_scalar(ga, 3), gb);
    assert_non_null(r);
    assert_true(bitwise(host(kl_add(kl_mul_scalar(a, 3), b)), host(r)));
    /* in place through the public API */
    kl_tensor *ca = kl_clone(a), *cga = kl_clone(ga);
    assert_non_null(kl_sub_inplace(ca, b));
    assert_non_null(kl_sub_inplace(cga, gb));
    assert_true(bitwise(host(ca), host(cga)));
    /* other shapes and ranks of the same layout classes (run-time shapes: the
     * modules of the sweep serve them) */
    kl_tensor *shapes[] = {kl_randn(KL_SHAPE(7, 11), KL_F32), kl_randn(KL_SHAPE(2, 3, 4), KL_F32),
                           kl_randn(KL_SHAPE(1000), KL_F32), kl_scalar_tensor(0.25, KL_F32)};
    for (int i = 0; i < 4; i++) {
        kl_tensor *gx = kl_to_device(shapes[i], CUDA0);
        assert_true(bitwise(host(kl_exp(shapes[i])), host(kl_exp(gx))));
        kl_tensor *tx = kl_ndim(gx) == 2 ? kl_transpose(gx, 0, 1) : gx, *tc = kl_ndim(gx) == 2 ? kl_transpose(shapes[i], 0, 1) : shapes[i];
        assert_true(bitwise(host(kl_mul(tc, kl_exp(tc))), host(kl_mul(tx, kl_exp(tx)))));
    }
    /* to_dtype */
    assert_true(bitwise(host(kl_to_dtype(a, KL_BF16)), host(kl_to_dtype(ga, KL_BF16))));
    /* integer % 0: the CPU's error */
    kl_tensor *x = kl_to_device(kl_arange(0, 6, 1, KL_I32), CUDA0);
    assert_null(kl_remainder(x, x));
    KT_EXPECT_ERROR(KL_ERR_ARG, "kl_remainder: integer division by zero");
    /* empty tensors launch nothing */
    kl_tensor *e = kl_to_device(kl_zeros(KL_SHAPE(0, 3), KL_F32), CUDA0);
    r = kl_exp(e);
    assert_non_null(r);
    assert_int_equal(kl_numel(r), 0);
    /* an op without a CUDA kernel fails clearly: every op of the table has one now, so one is
     * unregistered for the check (and registered again) */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_multinomial, NULL);
    kl_tensor *nk = kl_multinomial(kl_abs(ga), 2, true);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_multinomial, ku_cuda_multinomial);
    assert_null(nk);
    KT_EXPECT_ERROR(KL_ERR_UNSUPPORTED, "kl_multinomial: no CUDA kernel for this op (on cuda:0)");
}

/* The call path neither copies a scalar to the device nor synchronizes:
 * with the current stream held (the emulator's knob), a tensor op and a
 * tensor-by-CPU-scalar op leave it pending; integer remainder, whose error
 * word is read back, synchronizes (so the check can fail). */
static void scalar_calls_do_not_synchronize(void **s) {
    (void)s;
    NEED_EMULATOR();
    const ku_driver *d = ku_driver_get(OP);
    assert_non_null(d);
    kl_tensor *a = kl_randn(KL_SHAPE(3, 4), KL_F32), *ga = kl_to_device(a, CUDA0);
    kl_tensor *half = kl_scalar_tensor(0.5, KL_F32);
    kl_tensor *xi = kl_to_device(kl_arange(1, 7, 1, KL_I32), CUDA0);
    assert_non_null(ga);
    assert_non_null(xi);
    /* warm: the modules are loaded before the stream is held */
    assert_non_null(kl_mul(ga, half));
    assert_non_null(kl_add(ga, ga));
    assert_non_null(kl_remainder(xi, xi));
    CUstream st;
    assert_int_equal(KU_CALL(OP, d, StreamCreate, &st, 0), 0);
    CUstream old = ku_current_stream(0);
    ku_set_current_stream(0, st);
    ku_emu_hold_stream(st, 1);
    kl_tensor *r1 = kl_mul(ga, half), *r2 = kl_add(ga, ga), *r3 = kl_mul_scalar(ga, 3);
    assert_int_equal(d->StreamQuery(st), CUDA_ERROR_NOT_READY);
    assert_non_null(kl_remainder(xi, xi));
    assert_int_equal(d->StreamQuery(st), CUDA_SUCCESS);
    ku_emu_hold_stream(st, 0);
    assert_true(bitwise(host(kl_mul(a, half)), host(r1)));
    assert_true(bitwise(host(kl_add(a, a)), host(r2)));
    assert_true(bitwise(host(kl_mul_scalar(a, 3)), host(r3)));
    ku_set_current_stream(0, old);
    assert_int_equal(KU_CALL(OP, d, StreamDestroy, st), 0);
}

/* Eager CUDA calls from several host threads at once: each thread's results
 * equal the CPU's (the function cache is read without a lock and filled by
 * whichever thread misses first). */
enum { NTHR = 6, NITER = 40 };
typedef struct thr_arg {
    int id, bad;
    kl_tensor *x, *y, *want;
} thr_arg;

static kl_tensor *thr_op(kl_tensor *x, kl_tensor *y, int id) {
    switch (id % 3) {
    case 0: return kl_add(kl_mul_scalar(x, 1.5), y);
    case 1: return kl_sub(kl_exp(x), kl_transpose(y, 0, 1));
    default: return kl_to_dtype(kl_mul(x, y), KL_F64);
    }
}

static void *thr_main(void *p) {
    thr_arg *t = p;
    for (int i = 0; i < NITER && !t->bad; i++) {
        kl_scope_begin();
        kl_tensor *r = thr_op(t->x, t->y, t->id);
        kl_tensor *h = r ? kl_contiguous(kl_to_device(r, KL_DEVICE_CPU)) : NULL;
        if (!h || kl_equal(h, t->want) != 1) t->bad = 1 + !h;
        kl_scope_end();
    }
    return NULL;
}

static void threads_share_the_cache(void **s) {
    (void)s;
    NEED_CUDA();
    kl_manual_seed(21);
    pthread_t th[NTHR];
    thr_arg args[NTHR];
    for (int i = 0; i < NTHR; i++) {
        int64_t n = 4 + i; /* square, so case 1's transpose fits */
        kl_tensor *x = kl_randn(KL_SHAPE(n, n), KL_F32), *y = kl_randn(KL_SHAPE(n, n), KL_F32);
        args[i] = (thr_arg){.id = i, .x = kl_retain(kl_to_device(x, CUDA0)), .y = kl_retain(kl_to_device(y, CUDA0)),
                            .want = kl_retain(kl_contiguous(thr_op(x, y, i)))};
        assert_non_null(args[i].x);
        assert_non_null(args[i].want);
    }
    for (int i = 0; i < NTHR; i++) assert_int_equal(pthread_create(&th[i], NULL, thr_main, &args[i]), 0);
    for (int i = 0; i < NTHR; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < NTHR; i++) {
        if (args[i].bad) print_error("thread %d: %s\n", i, args[i].bad > 1 ? "failed" : "differs from the CPU");
        assert_int_equal(args[i].bad, 0);
        kl_release(args[i].x);
        kl_release(args[i].y);
        kl_release(args[i].want);
    }
}

int main(void) {
    if (kl_cuda_is_available()) print_message("device: %s\n", kt_cuda_emulated(OP) ? "emulated" : "GPU");
    const struct CMUnitTest tests[] = {
        KT_TEST(public_ops_and_errors),
        KT_TEST(every_op_every_dtype_contiguous),
        KT_TEST(strided_broadcast_and_scalars),
        KT_TEST(scalar_calls_do_not_synchronize),
        KT_TEST(threads_share_the_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
