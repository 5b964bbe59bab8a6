/*
 * cuda_module.c — the one way Kiln loads and launches a kernel, on a GPU or
 * on the emulated device: CUDA C source -> image (ku_module_image: a CUBIN
 * for the device's exact sm from NVRTC, or the marked source the emulator
 * compiles for the host) -> cuModuleLoadData, cached in memory per (source,
 * device) for the life of the process; cuModuleGetFunction; cuLaunchKernel.
 * The on-disk cache of images plugs in at ku_module_image.
 */
#include "cuda_api.h"

#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct ku_module {
    uint64_t hash;
    int dev;
    char *src; /* compared in full: the hash only picks the bucket */
    CUmodule mod;
    struct ku_module *next;
};

#define N_BUCKETS 256
static struct ku_module *buckets[N_BUCKETS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t hash_src(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static struct ku_module *find_locked(uint64_t h, const char *src, int dev) {
    for (struct ku_module *m = buckets[h % N_BUCKETS]; m; m = m->next)
        if (m->hash == h && m->dev == dev && strcmp(m->src, src) == 0) return m;
    return NULL;
}

int ku_module_image(const char *op, const char *src, int dev, void **image, size_t *size) {
    *image = NULL;
    *size = 0;
    const ku_driver *d = ku_driver_get(op);
    if (!d || ku_device_enter(op, dev)) return -1;
    if (d->emulated) {
        size_t lm = strlen(KU_EMU_IMAGE_MAGIC), ls = strlen(src);
        char *img = malloc(lm + ls + 1);
        if (!img) return ke_err(KL_ERR_OOM, op, "out of host memory for a module image");
        memcpy(img, KU_EMU_IMAGE_MAGIC, lm);
        memcpy(img + lm, src, ls + 1);
        *image = img;
        *size = lm + ls + 1;
        return 0;
    }
    CUdevice cd;
    int maj = 0, min = 0;
    if (KU_CALL(op, d, DeviceGet, &cd, dev) ||
        KU_CALL(op, d, DeviceGetAttribute, &maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cd) ||
        KU_CALL(op, d, DeviceGetAttribute, &min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cd))
        return -1;
    ku_cubin c;
    if (ku_nvrtc_compile_cached(op, src, op, maj * 10 + min, &c)) return -1;
    *image = c.image;
    *size = c.size;
    c.image = NULL;
    ku_cubin_free(&c);
    return 0;
}

static _Atomic int64_t g_loads, g_counts[KU_N_COUNT];
void ku_count(int what) { atomic_fetch_add_explicit(&g_counts[what], 1, memory_order_relaxed); }
void ku_counts(int64_t out[KU_N_COUNT]) {
    for (int i = 0; i < KU_N_COUNT; i++) out[i] = atomic_load_explicit(&g_counts[i], memory_order_relaxed);
}
int64_t ku_module_loads(void) { return atomic_load(&g_loads); }

int ku_module_get(const char *op, const char *src, int dev, ku_module **out) {
    *out = NULL;
    if (!src) return ke_err(KL_ERR_NULL_ARG, op, "module source is NULL");
    uint64_t h = hash_src(src);
    pthread_mutex_lock(&mu);
    struct ku_module *m = find_locked(h, src, dev);
    pthread_mutex_unlock(&mu);
    if (m) {
        *out = m;
        return 0;
    }
    /* Compiled outside the lock (a compile takes tens to hundreds of ms);
     * when two threads race, the first to insert wins. */
    void *img;
    size_t n;
    if (ku_module_image(op, src, dev, &img, &n)) return -1;
    const ku_driver *d = ku_driver_get(op);
    CUmodule mod = NULL;
    int r = KU_CALL(op, d, ModuleLoadData, &mod, img);
    free(img);
    if (r) return -1;
    struct ku_module *nm = calloc(1, sizeof *nm);
    char *copy = nm ? malloc(strlen(src) + 1) : NULL;
    if (!copy) {
        free(nm);
        d->ModuleUnload(mod);
        return ke_err(KL_ERR_OOM, op, "out of host memory for a module");
    }
    strcpy(copy, src);
    *nm = (struct ku_module){.hash = h, .dev = dev, .src = copy, .mod = mod};
    pthread_mutex_lock(&mu);
    m = find_locked(h, src, dev);
    if (!m) {
        atomic_fetch_add(&g_loads, 1);
        nm->next = buckets[h % N_BUCKETS];
        buckets[h % N_BUCKETS] = nm;
        m = nm;
        nm = NULL;
    }
    pthread_mutex_unlock(&mu);
    if (nm) {
        d->ModuleUnload(nm->mod);
        free(nm->src);
        free(nm);
    }
    *out = m;
    return 0;
}

int ku_module_function(const char *op, ku_module *m, const char *name, CUfunction *f) {
    *f = NULL;
    if (!m || !name) return ke_err(KL_ERR_NULL_ARG, op, "module or kernel name is NULL");
    const ku_driver *d = ku_driver_get(op);
    if (!d || ku_device_enter(op, m->dev)) return -1;
    return KU_CALL(op, d, ModuleGetFunction, f, m->mod, name);
}

int ku_launch(const char *op, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
              CUstream stream, void **args) {
    const ku_driver *d = ku_driver_get(op);
    if (!d) return -1;
    ku_count(KU_N_LAUNCH);
    return KU_CALL(op, d, LaunchKernel, f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shmem, stream,
                   args, NULL);
}
