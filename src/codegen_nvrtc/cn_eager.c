/*
 * cn_eager.c — eager elementwise ops on CUDA tensors from the code path of
 * compiled kernels: each call is the one-op kernel IR the fuse pass would
 * make for that op alone (a LOAD per input, the OP, a STORE), which cn_emit.c
 * turns into CUDA C (the eager formula itself, compiled for the device). So
 * an eager CUDA op and a compiled one give the same bits, and both the CPU's.
 *
 * The per-call cost is a hash lookup and a launch. The kernel is generated
 * in its run-time-shape form (cn_emit_kernel_dyn_byval): shape and strides
 * are a kernel parameter, only the layout class is in the source; the loaded
 * CUfunction is cached under a small key — op, the buffers' dtypes, compute
 * dtype, attribute values, broadcast bits, layout class (flat: rank-free;
 * strided: its rank), which inputs are one element / host scalars, device —
 * made from the tensors without building IR or source. Only a miss builds
 * the IR, generates the source and loads the module (ku_module_get: the
 * module cache by source, then the disk cache). A 0-dim CPU operand (a C
 * scalar) is a kernel parameter by value: no device copy, no synchronize.
 * Only ops whose formula can raise an error (integer remainder / fmod by 0)
 * zero a status word on the device and read it back, which waits for the
 * kernel, as on the CPU the error is raised by the call itself.
 *
 * Thread-safe: readers walk the table without a lock (entries are published
 * with a release store and never change or leave before exit); a miss
 * compiles outside the lock and the first insert of a key wins.
 * docs/GPU.md, "What runs on CUDA".
 */
#include "cn.h"

#include "cuda_device.h"

#include "cuda_api.h"
#include "dispatch.h"
#include "ew.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef cn_ekey ce_key;

typedef struct ce_entry {
    ce_key key;
    uint64_t hash;
    CUfunction fn;
    struct ce_entry *next;
} ce_entry;

#define CE_BUCKETS 1024
static ce_entry *g_tab[CE_BUCKETS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t key_hash(const ce_key *k) {
    /* FNV-1a over 64-bit words: the key is a few hundred bytes, mostly zero */
    const uint64_t *w = (const uint64_t *)k;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof *k / 8; i++) h = (h ^ w[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}
_Static_assert(sizeof(ce_key) % 8 == 0, "ce_key is hashed as 64-bit words");

static ce_entry *lookup(const ce_key *k, uint64_t h) {
    for (ce_entry *e = __atomic_load_n(&g_tab[h % CE_BUCKETS], __ATOMIC_ACQUIRE); e; e = e->next)
        if (e->hash == h && !memcmp(&e->key, k, sizeof *k)) return e;
    return NULL;
}

/* The layout a call's buffers have over the output's shape. */
typedef struct ce_layout {
    int64_t index[IR_KERNEL_MAX_IN + 1][KL_MAX_DIMS]; /* strides over the domain, 0 where broadcast */
} ce_layout;

static ce_entry *insert(ce_entry *e, uint64_t h) {
    e->hash = h;
    pthread_mutex_lock(&g_mu);
    ce_entry *had = lookup(&e->key, h);
    if (had) {
        /* another thread loaded the same kernel first (the same module) */
        pthread_mutex_unlock(&g_mu);
        free(e);
        return had;
    }
    e->next = g_tab[h % CE_BUCKETS];
    __atomic_store_n(&g_tab[h % CE_BUCKETS], e, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_mu);
    return e;
}

int cn_eager_fn(const char *op, const cn_ekey *key, cn_gen_fn gen, void *ctx, CUfunction *fn) {
    const uint64_t h = key_hash(key);
    ce_entry *e = lookup(key, h);
    if (e) {
        *fn = e->fn;
        return 0;
    }
    cn_kernel_src src;
    ku_module *m;
    CUfunction f;
    if (gen(ctx, &src)) return -1;
    int rc = ku_module_get(op, src.src, key->dev, &m) || ku_module_function(op, m, src.name, &f);
    cn_kernel_src_free(&src);
    if (rc) return -1;
    if (!(e = calloc(1, sizeof *e))) return ke_err(KL_ERR_OOM, op, "out of memory");
    memcpy(&e->key, key, sizeof *key); /* padding included: keys compare as bytes */
    e->fn = f;
    *fn = insert(e, h)->fn;
    return 0;
}

typedef struct ce_build {
    const ke_call *c;
    const ce_key *key;
    const ce_layout *lay;
    int64_t n;
    const char *op;
} ce_build;

/* The statements the fuse pass would make for op alone; on a miss only. */
static int build(void *ctx, cn_kernel_src *src) {
    const ce_build *bd = ctx;
    const ke_call *c = bd->c;
    const ce_key *key = bd->key;
    const ce_layout *lay = bd->lay;
    const int64_t n = bd->n;
    const char *op = bd->op;
    const kl_tensor *out = c->out[0];
    const int flat = key->cls == CN_DYN_FLAT, nd = flat ? 1 : out->ndim;
    ir_kbuf bufs[IR_KERNEL_MAX_IN + 1];
    memset(bufs, 0, sizeof bufs);
    ir_kernel k = {.ninputs = c->nin, .noutputs = 1, .bufs = bufs, .ndim = (uint8_t)nd, .device = c->device};
    /* the flat class as one dim of n: its source is the same for every rank */
    if (flat) k.shape[0] = n;
    else memcpy(k.shape, out->shape, sizeof(int64_t) * (size_t)nd);
    ir_kstmt st[IR_KERNEL_MAX_IN + 3];
    memset(st, 0, sizeof st);
    ir_kstmt *opst = &st[c->nin];
    *opst = (ir_kstmt){.kind = IR_K_OP, .dtype = out->dtype, .compute = (uint8_t)c->compute, .op = c->op, .buf = -1,
                       .nargs = c->nin, .a = key->a, .bcast = key->bcast};
    for (int b = 0; b <= c->nin; b++) {
        const kl_tensor *t = b < c->nin ? c->in[b] : out;
        ir_kbuf *kb = &bufs[b];
        kb->dtype = t->dtype;
        kb->ndim = t->ndim;
        kb->output = b == c->nin;
        memcpy(kb->shape, t->shape, sizeof(int64_t) * t->ndim);
        memcpy(kb->stride, t->stride, sizeof(int64_t) * t->ndim);
        if (flat) kb->index[0] = (key->one >> b) & 1 ? 0 : 1;
        else memcpy(kb->index, lay->index[b], sizeof(int64_t) * (size_t)nd);
        kb->contig_inner = kb->index[nd - 1] == 1;
        if (b == c->nin) break;
        st[b] = (ir_kstmt){.kind = IR_K_LOAD, .dtype = t->dtype, .buf = b, .op = -1};
        opst->args[b] = b;
    }
    st[c->nin + 1] = (ir_kstmt){.kind = IR_K_STORE, .dtype = out->dtype, .buf = c->nin, .op = -1, .nargs = 1,
                                .args = {c->nin}};
    k.stmts = st;
    k.nstmts = c->nin + 2;
    if (cn_dyn_class(&k) != key->cls)
        return ke_err(KL_ERR_INTERNAL, op, "nvrtc backend: layout class %d, expected %d", cn_dyn_class(&k), key->cls);
    return cn_emit_kernel_dyn_byval(&k, "kl_kernel", key->byval, src);
}

int ku_cuda_ew(ke_call *c) {
    kl_tensor *out = c->out[0];
    const ke_ew_impl *impl = ke_ops[c->op].impl;
    const char *op = ke_opname(c);
    if (!impl || c->nin > IR_KERNEL_MAX_IN || c->nin > CN_DYN_BUFS - 1 || c->nout != 1)
        return ke_err(KL_ERR_UNSUPPORTED, op, "no CUDA kernel for this op (on %s)", ke_device_name(c->device));
    const int nd = out->ndim, nb = c->nin + 1, dev = c->device.index;
    const int64_t n = ke_numel(nd, out->shape);
    if (n == 0) return 0;

    ce_key key;
    ce_layout lay;
    memset(&key, 0, sizeof key);
    key.kind = 1; /* elementwise */
    key.op = c->op;
    key.dev = dev;
    key.nin = (uint8_t)c->nin;
    key.compute = (uint8_t)c->compute;
    if (ke_op_attrs[c->op].n > 0) {
        key.a.nlist = c->a.nlist;
        memcpy(key.a.f, c->a.f, sizeof key.a.f);
        memcpy(key.a.i, c->a.i, sizeof key.a.i);
        if (c->a.nlist > 0 && c->a.nlist <= KE_MAX_LIST)
            memcpy(key.a.list, c->a.list, sizeof(int64_t) * (size_t)c->a.nlist);
    }
    int strided = 0;
    void *ptrs[CN_DYN_BUFS + 1];
    for (int b = 0; b < nb; b++) {
        const kl_tensor *t = b < c->nin ? c->in[b] : out;
        key.dt[b] = (uint8_t)t->dtype;
        ptrs[b] = ke_data(t);
        ke_broadcast_strides(t, nd, out->shape, lay.index[b]);
        int one = 1, flat = 1;
        int64_t st = 1;
        for (int d = nd - 1; d >= 0; d--) {
            if (out->shape[d] == 1) lay.index[b][d] = 0;
            if (lay.index[b][d]) one = 0;
            if (out->shape[d] != 1 && lay.index[b][d] != st) flat = 0;
            st *= out->shape[d];
        }
        if (b == c->nin) continue;
        if (one) key.one |= (uint8_t)(1u << b);
        else if (!flat) strided = 1;
        /* as eager hands the loop a one-element operand (and as lowering records it) */
        if (((impl->bcast_ok >> b) & 1) && ke_numel(t->ndim, t->shape) == 1 && n > 1) key.bcast |= (uint8_t)(1u << b);
        if (t->ndim == 0 && t->storage->device.type == KL_CPU) {
            key.byval |= (uint8_t)(1u << b);
            ptrs[b] = ke_data(t);  /* the parameter's bytes: the launch copies them */
        }
    }
    /* the output is never broadcast; a non-flat one makes the class strided */
    {
        int64_t st = 1;
        for (int d = nd - 1; d >= 0; d--) {
            if (out->shape[d] != 1 && lay.index[c->nin][d] != st) strided = 1;
            st *= out->shape[d];
        }
    }
    key.cls = strided ? CN_DYN_STRIDED : CN_DYN_FLAT;
    key.rank = strided ? (uint8_t)nd : 0;
    if (!strided) key.one &= (uint8_t)((1u << c->nin) - 1);

    CUfunction fn = NULL;
    ce_build bd = {c, &key, &lay, n, op};
    if (cn_eager_fn(op, &key, build, &bd, &fn)) return -1;
    /* the integer loops of remainder and fmod set the status word (x % 0) */
    const int err = (c->op == KE_OP_remainder || c->op == KE_OP_fmod) && !ke_is_float(c->compute);

    if (ku_device_enter(op, dev)) return -1;
    const ku_driver *d = ku_driver_get(op);
    if (!d) return -1;
    CUstream s = ku_current_stream(dev);
    cn_dims dims; /* the flat class reads only n; the strided one n, shape and its buffers' strides */
    dims.n = n;
    if (strided)
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < nd; i++) {
                dims.index[b][i] = lay.index[b][i];
                if (!b) dims.shape[i] = out->shape[i];
            }
    CUdeviceptr status = 0;
    if (err) {
        if (!(status = ku_malloc(op, dev, sizeof(int), s))) return -1;
        if (KU_CALL(op, d, MemsetD8Async, status, 0, sizeof(int), s)) {
            ku_free(op, status);
            return -1;
        }
    }
    void *sp = (void *)(uintptr_t)status, *args[CN_DYN_BUFS + 2];
    for (int b = 0; b < nb; b++) args[b] = (key.byval >> b) & 1 ? ptrs[b] : (void *)&ptrs[b];
    args[nb] = &sp;
    args[nb + 1] = &dims;
    const int64_t blocks = (n + CN_BLOCK - 1) / CN_BLOCK;
    /* a grid-stride loop: more blocks than the device runs at once buy nothing */
    /* a short domain gets whole warps only: idle threads cost nothing on a GPU, but each is run on the emulator */
    const unsigned grid[3] = {(unsigned)(blocks > 65535 ? 65535 : blocks), 1, 1},
                   block[3] = {n < CN_BLOCK ? (unsigned)(n + 31) / 32 * 32 : CN_BLOCK, 1, 1};
    int rc = ku_launch(op, fn, grid, block, 0, s, args);
    if (!rc && err) {
        int st = 0;
        rc = KU_CALL(op, d, MemcpyDtoHAsync, &st, status, sizeof st, s) || KU_CALL(op, d, StreamSynchronize, s);
        if (!rc && st == KE_EW_INT_DIV_ZERO) rc = ke_err(KL_ERR_ARG, ke_ops[c->op].name, "integer division by zero");
        else if (!rc && st) rc = ke_err(KL_ERR_INTERNAL, ke_ops[c->op].name, "elementwise loop failed");
    }
    /* stream-ordered: the block is reused only by work queued after the kernel */
    if (status) ku_free(op, status);
    return rc ? -1 : 0;
}

/* clone on CUDA (so kl_contiguous, and reshape of a view that cannot be
 * one): a contiguous source of the output's dtype is one device-to-device
 * copy; any other layout is the identity kernel (a strided one-op kernel),
 * never a round trip through the host (eager's staged path, which
 * synchronized twice per call: cuda_count_bench found one in attention). */
int ku_cuda_clone(ke_call *c) {
    kl_tensor *x = c->in[0], *out = c->out[0];
    if (x->dtype == out->dtype && cn_is_contiguous(x) && cn_is_contiguous(out)) {
        size_t n = (size_t)ke_numel(out->ndim, out->shape) * ke_dtypes[out->dtype].size;
        return n ? ku_cuda_device_ops.copy_d2d(ke_opname(c), out->storage->device.index, ke_data(out),
                                               x->storage->device.index, ke_data(x), n)
                 : 0;
    }
    return ku_cuda_ew(c);
}
