/*
 * cuda_emu.h — what the two halves of the emulated driver share: cuda_emu.c
 * (memory, streams, events, errors) and cuda_emu_module.c (modules compiled
 * for the host and launches run as fibers).
 */
#ifndef KU_CUDA_EMU_H
#define KU_CUDA_EMU_H

#include "cuda_api.h"

/* Returns r and keeps the formatted detail for this thread's next
 * cuGetErrorString(r) (shown as "... (emulated device: <detail>)"). */
CUresult ku_emu_fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The module entry points of the emulated table (cuda_emu_module.c). */
CUresult ku_emu_module_load(CUmodule *m, const void *image);
CUresult ku_emu_module_get_function(CUfunction *f, CUmodule m, const char *name);
CUresult ku_emu_module_unload(CUmodule m);
CUresult ku_emu_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shmem, CUstream s, void **params, void **extra);
/* 1 if s is the default stream (NULL) or a live emulated stream. */
int ku_emu_stream_ok(CUstream s);

#endif
