/*
 * fuzz_replay.h — the plain-program side of the libFuzzer targets
 * (tests/fuzz_*.c). Built without -DKT_LIBFUZZER, a target is a regression
 * test: main replays every file named on argv, and every file inside a folder
 * named on argv (the seed corpus tests/fuzz/<target>/, plus any crash inputs
 * committed there), through LLVMFuzzerTestOneInput, which aborts on a finding.
 * Built with -DKT_LIBFUZZER (scripts/kiln.sh fuzz), libFuzzer supplies main.
 */
#ifndef KT_FUZZ_REPLAY_H
#define KT_FUZZ_REPLAY_H

/* include first: strdup, setenv, mkstemp */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#ifndef KT_LIBFUZZER
static int kt_replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) return -1;
    /* an exact-size copy, so ASan sees a read past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int kt_name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Files of a folder in name order (a stable replay order), or the file itself. */
static int kt_replay_path(const char *path, int *count) {
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return kt_replay_file(path);
    }
    DIR *d = opendir(path);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, kt_name_cmp);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", path, names[i]);
        if (kt_replay_path(full, count) != 0) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    LLVMFuzzerInitialize(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS-FOLDER-OR-FILE...\n", argv[0]);
        return 2;
    }
    int count = 0, rc = 0;
    for (int i = 1; i < argc; i++)
        if (kt_replay_path(argv[i], &count) != 0) rc = 1;
    printf("%s: replayed %d input(s)%s\n", argv[0], count, rc ? " (some unreadable)" : ", no findings");
    return rc || count == 0;
}
#endif
#endif
