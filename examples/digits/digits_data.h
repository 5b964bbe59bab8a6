/*
 * digits_data.h — loads the UCI optical handwritten digits (scikit-learn's
 * digits.csv.gz: 1,797 lines of 64 pixel counts 0..16 then a label 0..9) and
 * splits them into fixed train and test sets. Plain C arrays: the program
 * turns them into tensors.
 */
#ifndef DIGITS_DATA_H
#define DIGITS_DATA_H

#include <stddef.h>
#include <stdint.h>

enum { DIGITS_FEATURES = 64, DIGITS_CLASSES = 10, DIGITS_ROWS = 1797 };

typedef struct digits_set {
    int64_t n;
    float *x;     /* n x 64, pixel counts divided by 16 (so in [0, 1]) */
    int64_t *y;   /* n labels in 0..9 */
} digits_set;

/* Reads a gzip-compressed (or plain) CSV. Returns 0, or -1 with a message
 * (file, line, what is wrong) in err. */
int digits_load(const char *path, digits_set *out, char *err, size_t errcap);

/* The fixed split: rows shuffled by a Fisher-Yates pass driven by splitmix64
 * with seed 0 (independent of the training seed), then the first 80% train
 * (1,437 rows) and the last 20% test (360, the count scikit-learn's
 * train_test_split(test_size=0.2) gives). Returns 0 or -1 (out of memory). */
int digits_split(const digits_set *all, digits_set *train, digits_set *test);

void digits_free(digits_set *d);

/* splitmix64: the program's own small generator for the split and the batch order. */
uint64_t digits_rand_next(uint64_t *state);

#endif
