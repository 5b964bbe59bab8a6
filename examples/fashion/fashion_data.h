/*
 * fashion_data.h — reads Fashion-MNIST's IDX files (gzip-compressed or
 * plain, as scripts/fetch_fashion.sh puts them in data/fashion/) into plain
 * C arrays: the program turns them into tensors.
 *
 * IDX: a big-endian header (two zero bytes, a type code, 0x08 = unsigned
 * byte, the dimension count, then one uint32 size per dimension) followed by
 * the elements. Images are idx3 [n, 28, 28], labels idx1 [n].
 */
#ifndef FASHION_DATA_H
#define FASHION_DATA_H

#include <stddef.h>
#include <stdint.h>

enum { FASHION_SIDE = 28, FASHION_PIXELS = 28 * 28, FASHION_CLASSES = 10 };

/* One IDX file of unsigned bytes. */
typedef struct idx_array {
    int ndim;
    int64_t dims[3];
    uint8_t *data; /* dims[0] * dims[1] * ... bytes */
} idx_array;

/* Reads path (gzip or plain) and checks it is an unsigned-byte IDX file of
 * exactly want_ndim dimensions (1 to 3), each positive and at most 2^24, with
 * exactly the elements the header promises (a truncated file or trailing
 * bytes are errors). Returns 0, or -1 with a message naming the file and the
 * problem (bad magic, dims, size, truncation, not readable) in err. */
int idx_load(const char *path, int want_ndim, idx_array *out, char *err, size_t errcap);
void idx_free(idx_array *a);

typedef struct fashion_set {
    int64_t n;
    float *x;     /* n x 784, pixels divided by 255 (so in [0, 1]) */
    int64_t *y;   /* n labels in 0..9 */
} fashion_set;

/* Loads dir/<prefix>-images-idx3-ubyte.gz and dir/<prefix>-labels-idx1-ubyte.gz
 * (prefix "train" or "t10k"; the plain names without .gz are tried when the
 * .gz is absent): 28 x 28 images, as many labels as images, labels 0..9.
 * Keeps only the first limit images when 0 < limit < n. Returns 0, or -1
 * with a message in err. */
int fashion_load(const char *dir, const char *prefix, int64_t limit, fashion_set *out, char *err, size_t errcap);
void fashion_free(fashion_set *s);

/* splitmix64: the program's own small generator for the batch order. */
uint64_t fashion_rand_next(uint64_t *state);

#endif
