/*
 * init.c — the composition root: the one file that knows every layer and
 * joins them. Lower layers never call upward; what an upper layer offers the
 * one below goes in through one hook struct per lower layer, installed here:
 *
 *   eager  <- ke_hooks   Autograd and Trace dispatch handlers, the tensor
 *                        free hook (autograd metadata), the data-access hook
 *                        (a data read while tracing breaks the trace)
 *   ir     <- ir_hooks   the decomposition pass's subgraph tracer
 *   ir     <- registry   kernel backends, by name and device (kernel.h): the
 *                        interpreter, LLVM (CPU), NVRTC (CUDA)
 *   eager  <- devices    the CUDA device's data movers (ke_device_ops) and
 *                        eager's CUDA kernels; eager calls kl_init at its
 *                        first CUDA request, so CPU-only programs never join CUDA
 *
 * kl_init runs this once (pthread_once) from the entry points that need the
 * upper layers (the first autograd metadata, tr_trace, kl_compile, anomaly
 * mode), never from a load-time constructor, so a static and a shared link
 * behave the same whatever the static link pulls in.
 */
#include "autograd.h"
#include "cuda_api.h"
#include "cuda_device.h"
#include "dispatch.h"
#include "cn.h"
#include "kernel.h"
#include "trace.h"

#ifdef KL_HAVE_LLVM
#include "cg_llvm.h"
#endif

#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    ke_install_hooks(&(ke_hooks){
        .handler = {[KE_KEY_AUTOGRAD] = ag_record_handler, [KE_KEY_TRACE] = tr_trace_handler},
        .autograd_free = ag_meta_free,
        .trace_data = tr_data_hook,
        .trace_device = tr_device_hook,
        .trace_backward = tr_backward_hook,
    });
    ir_install_hooks(&(ir_hooks){.subtrace = tr_subtrace});
    /* Kernel backends, by device. Registration cannot fail here (distinct
     * names, a table with room), so a failure is a bug worth stopping on. */
    KE_ASSERT(ir_backend_register(&ir_interp_backend) == 0);
#ifdef KL_HAVE_LLVM
    KE_ASSERT(ir_backend_register(&cg_llvm_backend) == 0);
#endif
    KE_ASSERT(ir_backend_register(&cn_nvrtc_backend) == 0);
    ag_anomaly_from_env();
    /* CUDA: kernels first, then the device, whose publication (release) is
     * what eager waits for. Nothing is loaded here: the driver comes with
     * the first allocation. */
    ke_register_device_kernels();
    ke_register_kernel(KE_KEY_CUDA, KE_OP_matmul, ku_cuda_matmul);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_mm, ku_cuda_matmul);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_bmm, ku_cuda_matmul);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_addmm, ku_cuda_addmm);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_linear, ku_cuda_linear);
    /* every elementwise op (in-place variants included) as a one-op
     * generated kernel; clone: a plain device copy when it can, else the
     * identity kernel (eager's own device clone stages strided sources
     * through the host) */
    for (int op = 0; op < KE_OP_COUNT; op++)
        if (ke_ops[op].kind == KE_KIND_EW && ke_ops[op].impl && op != KE_OP_clone)
            ke_register_kernel(KE_KEY_CUDA, op, ku_cuda_ew);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_clone, ku_cuda_clone);
    /* the reductions a row kernel folds (cn_reduce.c) */
    for (int op = 0; op < KE_OP_COUNT; op++)
        if (ke_ops[op].kind == KE_KIND_REDUCE && ku_cuda_reduce_supported(op))
            ke_register_kernel(KE_KEY_CUDA, op, ku_cuda_reduce);
    /* max / min with positions: a row kernel of (value, position) pairs (cn_argreduce.c) */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_argmax, ku_cuda_argreduce);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_argmin, ku_cuda_argreduce);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_max_dim, ku_cuda_argreduce);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_min_dim, ku_cuda_argreduce);
    /* indexing: hand-written kernels, indices checked on the device (cn_index.c) */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_gather, ku_cuda_gather);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_index_select, ku_cuda_index_select);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_embedding, ku_cuda_embedding);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_scatter_add, ku_cuda_scatter_add);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_scatter, ku_cuda_scatter_add);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_scatter_reduce, ku_cuda_scatter_add);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_one_hot, ku_cuda_one_hot);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_softmax, ku_cuda_softmax);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_log_softmax, ku_cuda_softmax);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_layer_norm, ku_cuda_norm);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_rms_norm, ku_cuda_norm);
    /* random ops drawn on the device (cn_rng.c) */
    static const int rng_ops[] = {KE_OP_rand, KE_OP_randn, KE_OP_randint, KE_OP_bernoulli, KE_OP_dropout,
                                  KE_OP_dropout2d};
    for (size_t i = 0; i < sizeof rng_ops / sizeof rng_ops[0]; i++)
        ke_register_kernel(KE_KEY_CUDA, rng_ops[i], ku_cuda_rng);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_cumsum, ku_cuda_scan); /* cn_scan.c */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_cumprod, ku_cuda_scan);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_conv2d, ku_cuda_conv2d); /* cn_conv.c */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_max_pool2d, ku_cuda_pool2d);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_avg_pool2d, ku_cuda_pool2d);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_adaptive_avg_pool2d, ku_cuda_pool2d);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_max_pool2d_indices, ku_cuda_pool2d);
    /* moves by per-dim index arithmetic (cn_join.c); stack and roll decompose into cat */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_cat, ku_cuda_cat);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_pad, ku_cuda_pad);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_flip, ku_cuda_flip);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_repeat, ku_cuda_repeat);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_tril, ku_cuda_tri);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_triu, ku_cuda_tri);
    /* sort, topk (argsort decomposes into sort): bitonic rows in shared memory (cn_sort.c) */
    ke_register_kernel(KE_KEY_CUDA, KE_OP_sort, ku_cuda_sort);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_topk, ku_cuda_sort);
    ke_register_kernel(KE_KEY_CUDA, KE_OP_multinomial, ku_cuda_multinomial); /* cn_multinomial.c */
    ke_register_device(KL_CUDA, &ku_cuda_device_ops);
}

void kl_init(void) { pthread_once(&once, init_once); }
