/*
 * charlm_data.h — the text side of the charlm demo: reads the fortune cookie
 * files (or any text), splits them into fixed train and validation texts,
 * maps bytes to a small vocabulary, draws training windows, and scores the
 * count-based bigram model the transformer has to beat. Plain C arrays: the
 * model code turns them into tensors.
 */
#ifndef CHARLM_DATA_H
#define CHARLM_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Byte-level vocabulary: the distinct bytes of the whole corpus, in byte
 * order, so the ids depend only on the text. */
typedef struct charlm_vocab {
    int size;
    int16_t id_of[256];   /* byte -> id, -1 for bytes the corpus lacks */
    uint8_t byte_of[256]; /* id -> byte */
} charlm_vocab;

typedef struct charlm_corpus {
    charlm_vocab vocab;
    int64_t fortunes;          /* in the whole corpus */
    int64_t n_train, n_val;    /* tokens */
    int64_t *train, *val;      /* token ids */
} charlm_corpus;

/* Builds a corpus from text in memory: fortunes are separated by lines that
 * hold only "%" (text without such lines is one fortune); fortune i goes to
 * validation when i % 10 == 9, else to train: a fixed 90/10 split by fortune
 * (so no fortune is in both). Each split is its fortunes' text, each ended by
 * "%\n" as in the files. Returns 0, or -1 with a message in err (empty text,
 * a split too short, out of memory). */
int charlm_corpus_from_text(const char *text, size_t len, charlm_corpus *out, char *err, size_t errcap);

/* Reads path: a file, or a folder whose regular files (not *.dat indexes,
 * not SOURCES, names sorted bytewise) are concatenated; then as
 * charlm_corpus_from_text. */
int charlm_corpus_load(const char *path, charlm_corpus *out, char *err, size_t errcap);

void charlm_corpus_free(charlm_corpus *c);

/* splitmix64: the program's own small generator for windows (the model's
 * initialisation and sampling use Kiln's generator). */
uint64_t charlm_rand_next(uint64_t *state);

/* Fills x and y ([batch, context] row-major) with batch windows of text:
 * x = text[s .. s+context), y = text[s+1 .. s+context+1), the starts s drawn
 * uniformly from state. text must hold more than context tokens. */
void charlm_windows(const int64_t *text, int64_t n, int batch, int context, uint64_t *state, int64_t *x,
                    int64_t *y);

/* Validation loss (nats per character) of the bigram model counted on the
 * train text with add-one (Laplace) smoothing over the vocabulary:
 * p(b | a) = (count(a b) + 1) / (count(a) + V), averaged over every
 * consecutive pair of the validation text. NaN if out of memory. */
double charlm_bigram_loss(const charlm_corpus *c);

#endif
