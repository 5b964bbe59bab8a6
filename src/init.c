/*
 * init.c — the composition root: the one place that knows every layer and
 * joins them. Lower layers never call upward; each upper layer's services
 * are installed here into the layer below (see docs/ARCHITECTURE.md).
 *
 * kl_init runs once (pthread_once) from the entry points that need the
 * upper layers, never from a load-time constructor, so a static and a shared
 * link behave the same whatever the static link pulls in.
 */
#include "kernel.h"

#ifdef KL_HAVE_LLVM
#include "cg_llvm.h"
#endif

#include <pthread.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    /* Kernel backends, by device. Registration cannot fail here (distinct
     * names, a table with room), so a failure is a bug worth stopping on. */
    KE_ASSERT(ir_backend_register(&ir_interp_backend) == 0);
#ifdef KL_HAVE_LLVM
    KE_ASSERT(ir_backend_register(&cg_llvm_backend) == 0);
#endif
}

void kl_init(void) { pthread_once(&once, init_once); }
