/*
 * nn_internal.h — what the files of src/nn share: the safetensors dtype
 * table (reader and writer must agree on names, sizes and the reference
 * implementation's dtype order).
 */
#ifndef NN_INTERNAL_H
#define NN_INTERNAL_H

#include "core.h"

/* A safetensors dtype. Rows are in the reference implementation's enum order
 * (its writer sorts by that order, descending, then by name). */
typedef struct nn_st_dtype {
    const char *name;    /* "F32" */
    uint8_t size;        /* bytes per element */
    int8_t kiln;         /* kl_dtype, or -1 if Kiln has no such dtype */
} nn_st_dtype;

extern const nn_st_dtype nn_st_dtypes[];
extern const int nn_st_num_dtypes;

/* Row of the table for a Kiln dtype. */
int nn_st_dtype_row(kl_dtype dt);

#endif /* NN_INTERNAL_H */
