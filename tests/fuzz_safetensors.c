/*
 * fuzz_safetensors.c — fuzzes the safetensors reader from memory
 * (kl_load_safetensors_buffer). Every input loads or fails with a clean
 * error; a loaded file's tensors, names and metadata are all read back (each
 * tensor's bytes fit in the input, every name and key is a C string, find
 * by name returns the same tensor), then the file is saved and loaded again
 * and must give equal tensors; nothing leaks. Plain build: replays
 * tests/fuzz/safetensors/; libFuzzer: scripts/kiln.sh fuzz.
 */
#include "fuzz_replay.h"

#include <unistd.h>

#include "kiln.h"

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_safetensors: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1:max_allocation_size_mb=256"; }

static char save_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(save_path, sizeof save_path, "/tmp/kt_fuzz_st_%d.safetensors", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kl_clear_error();
    kl_scope_begin();
    kl_safetensors *f = kl_load_safetensors_buffer(data, size);
    if (!f) {
        if (kl_last_status() == KL_OK || !kl_last_error()[0]) finding("NULL without an error", NULL);
        if (kl_last_status() != KL_ERR_FORMAT && kl_last_status() != KL_ERR_OOM && kl_last_status() != KL_ERR_OVERFLOW &&
            kl_last_status() != KL_ERR_DTYPE && kl_last_status() != KL_ERR_SHAPE && kl_last_status() != KL_ERR_UNSUPPORTED)
            finding("unexpected status", kl_status_name(kl_last_status()));
    } else {
        int n = kl_safetensors_count(f);
        if (n < 0) finding("negative count", NULL);
        int64_t bytes = 0;
        const char *names[64];
        kl_tensor *ts[64];
        for (int i = 0; i < n; i++) {
            const char *name = kl_safetensors_name(f, i);
            kl_tensor *t = kl_safetensors_get(f, i);
            if (!name || !t) finding("a listed tensor cannot be read", kl_last_error());
            if (kl_safetensors_find(f, name) != t) finding("find by name gives another tensor", name);
            bytes += kl_numel(t) * (int64_t)kl_dtype_size(kl_dtype_of(t));
            if (i < 64) names[i] = name, ts[i] = t;
        }
        if (bytes > (int64_t)size) finding("tensors hold more bytes than the input", NULL);
        for (int i = 0; i < kl_safetensors_metadata_count(f); i++) {
            const char *k = kl_safetensors_metadata_key(f, i);
            if (!k || !kl_safetensors_metadata(f, k)) finding("a listed metadata key has no value", k);
        }
        /* a round trip through the writer gives the same tensors */
        if (n > 0 && n <= 64) {
            if (kl_save_safetensors(save_path, n, names, ts, NULL) == 0) {
                kl_safetensors *g = kl_load_safetensors(save_path);
                if (!g) finding("a saved file does not load", kl_last_error());
                for (int i = 0; i < n; i++) {
                    kl_tensor *u = kl_safetensors_find(g, names[i]);
                    /* bytes, not values: NaNs and odd bool bytes must survive too */
                    size_t nb = (size_t)kl_numel(ts[i]) * kl_dtype_size(kl_dtype_of(ts[i]));
                    kl_tensor *a = kl_contiguous(ts[i]), *b = u ? kl_contiguous(u) : NULL;
                    if (!b || kl_dtype_of(u) != kl_dtype_of(ts[i]) || kl_numel(u) != kl_numel(ts[i]) ||
                        (nb && memcmp(kl_data_ptr(a), kl_data_ptr(b), nb) != 0))
                        finding("the round trip changed a tensor", names[i]);
                }
                kl_safetensors_free(g);
            } else {
                kl_clear_error(); /* e.g. a name the writer refuses: fine if reported */
            }
        }
        kl_safetensors_free(f);
    }
    kl_scope_end();
    kl_clear_error();
    if (kl_live_tensors() != 0 || kl_live_storages() != 0) finding("leaked a tensor or storage", NULL);
    return 0;
}
