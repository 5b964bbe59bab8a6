/*
 * scope.c — ownership scopes. Every tensor an op creates is adopted by the
 * innermost scope of the calling thread; closing the scope drops those
 * references. The root scope (depth 0) always exists and is never closed.
 * A tensor records its owning scope and slot so kl_keep and an early
 * kl_release are O(1).
 */
#include "core.h"

#include <pthread.h>
#include <stdlib.h>

#define KE_MAX_SCOPES 1024

typedef struct ke_scope_stack {
    ke_scope scopes[KE_MAX_SCOPES];
    int depth; /* index of the innermost scope; 0 = root */
    int over;  /* kl_scope_begin calls past the limit, each sharing the innermost scope */
} ke_scope_stack;

static _Thread_local ke_scope_stack tl_scopes;

/* Thread exit closes the thread's scopes as kl_scope_end would, innermost
 * first and the root scope last, so what they own is released (kiln.h: a
 * tensor outlives its thread only through kl_retain). Before, an exited
 * thread's tensors could never be released, and a new thread reusing its
 * thread-local block took them for its own. The item arrays are freed too
 * (they are kept between scopes of one depth so a loop of scopes does not
 * realloc). */
static pthread_key_t scope_key;
static pthread_once_t scope_key_once = PTHREAD_ONCE_INIT;
static _Thread_local int scope_key_set;

static void scope_clear(ke_scope *s);

static void scope_thread_exit(void *arg) {
    ke_scope_stack *st = arg;
    for (int d = st->depth; d >= 0; d--) scope_clear(&st->scopes[d]);
    st->depth = st->over = 0;
    for (int d = 0; d < KE_MAX_SCOPES; d++) {
        ke_scope *s = &st->scopes[d];
        free(s->items);
        s->items = NULL;
        s->n = s->cap = s->live = 0;
    }
    ke_tensor_thread_exit();
}
static void scope_key_init(void) { KE_ASSERT(pthread_key_create(&scope_key, scope_thread_exit) == 0); }

void ke_scope_thread_init(void) {
    if (scope_key_set) return;
    pthread_once(&scope_key_once, scope_key_init);
    pthread_setspecific(scope_key, &tl_scopes);
    scope_key_set = 1;
}

/* Depth of scope s on this thread, or -1 if s belongs to another thread. */
static int scope_depth_of(const ke_scope *s) {
    uintptr_t base = (uintptr_t)tl_scopes.scopes, p = (uintptr_t)s;
    if (p < base || p >= base + sizeof tl_scopes.scopes) return -1;
    return (int)((p - base) / sizeof(ke_scope));
}

static void scope_push_item(ke_scope *s, kl_tensor *t) {
    if (s->n == s->cap) {
        int32_t cap = s->cap ? s->cap * 2 : 64;
        kl_tensor **items = realloc(s->items, (size_t)cap * sizeof *items);
        KE_ASSERT(items); /* out of memory growing a scope: cannot report through NULL here */
        if (!s->items) ke_scope_thread_init();
        s->items = items;
        s->cap = cap;
    }
    t->scope = s;
    t->scope_slot = s->n;
    s->items[s->n++] = t;
    s->live++;
}

void ke_scope_adopt(kl_tensor *t) {
    scope_push_item(&tl_scopes.scopes[tl_scopes.depth], t);
}

static void scope_detach(kl_tensor *t) {
    ke_scope *s = t->scope;
    s->items[t->scope_slot] = NULL;
    s->live--;
    /* Trailing holes are trimmed so a loop of create/release stays O(1) in size. */
    while (s->n > 0 && s->items[s->n - 1] == NULL) s->n--;
    t->scope = NULL;
    t->scope_slot = -1;
}

static void scope_clear(ke_scope *s) {
    /* Release newest first: later tensors may hold references to earlier ones. */
    for (int32_t i = s->n - 1; i >= 0; i--) {
        kl_tensor *t = s->items[i];
        if (!t) continue;
        t->scope = NULL;
        t->scope_slot = -1;
        ke_tensor_decref(t);
    }
    s->n = 0;
    s->live = 0;
}

void kl_scope_begin(void) {
    if (tl_scopes.depth + 1 >= KE_MAX_SCOPES) {
        /* An error, not an abort (it used to abort): the level is counted so
         * begin/end stay balanced, and shares the innermost scope, which
         * frees its tensors when it ends. */
        tl_scopes.over++;
        ke_err(KL_ERR_STATE, "scope_begin", "more than %d nested scopes on this thread; the extra levels "
                   "share the innermost scope", KE_MAX_SCOPES - 1);
        return;
    }
    tl_scopes.depth++;
}

void kl_scope_end(void) {
    if (tl_scopes.over > 0) {
        tl_scopes.over--;
        return;
    }
    if (tl_scopes.depth == 0) {
        ke_assert_fail("kl_scope_end without a matching kl_scope_begin on this thread", __FILE__, __LINE__);
    }
    scope_clear(&tl_scopes.scopes[tl_scopes.depth]);
    tl_scopes.depth--;
}

int kl_scope_depth(void) { return tl_scopes.depth + tl_scopes.over; }

kl_tensor *kl_keep(kl_tensor *t) {
    if (ke_check_tensor(t, "keep", 1)) return NULL;
    ke_scope *s = t->scope;
    if (!s) return t;
    /* Find the owning scope's depth on this thread; only its parent can take it. */
    int d = scope_depth_of(s);
    if (d < 0) {
        ke_err(KL_ERR_STATE, "keep", "tensor is owned by a scope of another thread");
        return NULL;
    }
    if (d == 0) return t;
    scope_detach(t);
    scope_push_item(&tl_scopes.scopes[d - 1], t);
    return t;
}

kl_tensor *kl_retain(kl_tensor *t) {
    if (ke_check_tensor(t, "retain", 1)) return NULL;
    atomic_fetch_add_explicit(&t->user_refs, 1, memory_order_relaxed);
    ke_tensor_incref(t);
    return t;
}

void kl_release(kl_tensor *t) {
    if (ke_check_tensor(t, "release", 1)) return;
    int32_t u = atomic_load_explicit(&t->user_refs, memory_order_relaxed);
    while (u > 0) {
        if (atomic_compare_exchange_weak(&t->user_refs, &u, u - 1)) {
            ke_tensor_decref(t);
            return;
        }
    }
    ke_scope *s = t->scope;
    if (s) {
        if (scope_depth_of(s) < 0) {
            ke_err(KL_ERR_STATE, "release", "tensor is owned by a scope of another thread");
            return;
        }
        scope_detach(t);
        ke_tensor_decref(t);
        return;
    }
    ke_err(KL_ERR_STATE, "release", "the caller owns no reference to this tensor (released twice?)");
}
