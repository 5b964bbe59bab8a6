/*
 * srcloc.c — the caller's source locations (-DKL_TRACK_SOURCE, kiln.h).
 *
 * The header's macros bracket every public op call with kl__loc /
 * kl__loc_end, which push and pop the caller's __FILE__:__LINE__ on a
 * per-thread stack; the top is "where the user is" for whatever runs inside
 * the call, the ops a composite or an nn helper runs included. A stack (not
 * one slot) because the arguments of a call are calls themselves,
 * kl_add(a, kl_mul(b, c)): the inner pop gives the outer call its location
 * back, and nothing stays behind once the outermost call returns. Nothing
 * here is on the dispatcher's path: a program built without the macros
 * pays nothing.
 */
#include "core.h"

#define LOC_DEPTH 32

static _Thread_local ke_loc stack[LOC_DEPTH];
static _Thread_local int depth; /* may pass LOC_DEPTH: deeper calls keep the last stored location */

void kl__loc(const char *file, int line) {
    if (depth < LOC_DEPTH) stack[depth] = (ke_loc){file, line};
    depth++;
}

static void pop(void) {
    if (depth > 0) depth--;
}

kl_tensor *kl__loc_end(kl_tensor *r) {
    pop();
    return r;
}

int kl__loc_end_int(int r) {
    pop();
    return r;
}

ke_loc ke_loc_now(void) {
    if (depth == 0) return (ke_loc){NULL, 0};
    return stack[(depth < LOC_DEPTH ? depth : LOC_DEPTH) - 1];
}

const char *ke_loc_fmt(char *buf, size_t cap, ke_loc l, const char *prev_file) {
    if (!l.file) {
        if (cap) buf[0] = 0;
        return buf;
    }
    if (prev_file && !strcmp(prev_file, l.file)) snprintf(buf, cap, ":%d", l.line);
    else snprintf(buf, cap, "%s:%d", l.file, l.line);
    return buf;
}
