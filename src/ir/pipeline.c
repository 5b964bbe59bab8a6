/*
 * pipeline.c — the pass pipeline: one readable list, the verifier after every
 * pass, and KL_DEBUG_DIR dumps (graph before and after each pass).
 */
#include "ir.h"
#include "log.h"

#include <stdlib.h>
#include <sys/stat.h>

typedef struct ir_pass {
    const char *name;
    int (*run)(ir_graph *g);   /* >= 0 on success (a count of changes), -1 on error */
} ir_pass;

/* Decomposition first: the primitives it splices in are what every later
 * pass (and fusion) works on. Functionalization next, so the passes after it
 * see pure ops (they leave values over storage still written in place
 * alone); simplification before folding and CSE exposes more of both; dce
 * last sweeps what they orphaned. */
static const ir_pass pipeline[] = {
    {"decompose", ir_pass_decompose},
    {"functionalize", ir_pass_functionalize},
    {"simplify", ir_pass_simplify},
    {"fold", ir_pass_fold},
    {"cse", ir_pass_cse},
    {"pool_mask", ir_pass_pool_mask}, /* after cse: one max_pool2d node per pooled value */
    {"dce", ir_pass_dce},
    {"fuse", ir_pass_fuse}, /* FUSE mode only (g->fuse): it sees the final graph */
    {"writeback", ir_pass_writeback}, /* FUSE mode only: kernels write updates in place */
    {"plan", ir_pass_plan}, /* last: liveness and buffers of the final graph */
};

static _Atomic int dump_counter;

static void dump(const ir_graph *g, int seq, int step, const char *name) {
    const char *dir = getenv("KL_DEBUG_DIR");
    if (!dir || !*dir) return;
    mkdir(dir, 0777);
    char path[1024];
    snprintf(path, sizeof path, "%s/graph%03d_%02d_%s.txt", dir, seq, step, name);
    FILE *f = fopen(path, "w");
    if (!f) return;
    ir_print(g, f);
    fclose(f);
}

int ir_optimize(ir_graph *g) {
    int seq = atomic_fetch_add(&dump_counter, 1);
    dump(g, seq, 0, "traced");
    for (size_t p = 0; p < sizeof pipeline / sizeof pipeline[0]; p++) {
        if (pipeline[p].run(g) < 0) return -1;
#ifndef NDEBUG
        if (ir_verify(g, pipeline[p].name)) return -1;
#endif
        dump(g, seq, (int)p + 1, pipeline[p].name);
        if (ke_log_at(KE_LOG_GRAPH, KL_LOG_DEBUG)) {
            char *text = ir_to_string(g);
            if (text) ke_logl(KE_LOG_GRAPH, KL_LOG_DEBUG, "after %s:\n%s", pipeline[p].name, text);
            free(text);
        }
    }
    return 0;
}
