/*
 * test_header.c — the public header lists every generated function exactly
 * once, and nothing else in the generated sections.
 *
 * The op table's `wrap` column generates the public unary and binary
 * functions (src/eager/wrappers.c), and include/kiln.h declares each one
 * literally. wrappers.c is compiled with -Werror=missing-prototypes, so a
 * row whose function the header lacks fails the build; this test covers the
 * other direction: it reads kiln.h and the kiln/ headers it includes and fails on
 *   - a function declared twice,
 *   - a generated function not declared exactly once,
 *   - a prototype in the generated sections ("Elementwise, unary" up to
 *     "Elementwise, other") that no row generates (an op whose row was
 *     removed or renamed), apart from the hand-written scalar-first forms.
 * The checker also runs on small made-up headers, so it is seen to fail.
 */
#include "harness.h"

#include "dispatch.h"

#include <ctype.h>

/* ---- the generated names, from the same rows and forms as wrappers.c ---------- */

#define HN_none(n)
#define HN_UNARY(n) "kl_" #n,
#define HN_UNARY_IP(n) "kl_" #n, "kl_" #n "_inplace",
#define HN_UNARY_F1_IP(n) HN_UNARY_IP(n)
#define HN_UNARY_F2_IP(n) HN_UNARY_IP(n)
#define HN_BINARY(n) "kl_" #n, "kl_" #n "_inplace", "kl_" #n "_scalar", "kl_" #n "_scalar_inplace",
static const char *const generated[] = {
#define KE_OP(name_, kind_, nin_, nout_, flags_, dt_, acc_, infer_, cpu_, view_, decomp_, impl_, wrap_, save_, \
              deriv_, ...)                                                                                  \
    HN_##wrap_(name_)
#include "optable.def"
#undef KE_OP
};
#define N_GENERATED (sizeof generated / sizeof generated[0])

/* Declared in the generated sections but written by hand (ew_binary.c). */
static const char *const hand_written[] = {"kl_rsub_scalar", "kl_rdiv_scalar"};

#define SECTION_BEGIN "Elementwise, unary"
#define SECTION_END "Elementwise, other"

/* ---- reading prototypes --------------------------------------------------------- */

#define MAX_PROTOS 1024
typedef struct protos {
    int n;
    char name[MAX_PROTOS][64];
    uint8_t in_section[MAX_PROTOS]; /* between SECTION_BEGIN and SECTION_END */
} protos;

/* Blanks comments and preprocessor lines (with their continuations) in
 * place, keeping offsets, so what is left is declarations. */
static void blank_non_code(char *s) {
    size_t n = strlen(s);
    int line_start = 1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '/' && s[i + 1] == '*') {
            size_t j = i + 2;
            while (j + 1 < n && !(s[j] == '*' && s[j + 1] == '/')) j++;
            for (size_t k = i; k < j + 2 && k < n; k++)
                if (s[k] != '\n') s[k] = ' ';
            i = j + 1;
            continue;
        }
        if (s[i] == '/' && s[i + 1] == '/') {
            while (i < n && s[i] != '\n') s[i++] = ' ';
            line_start = 1;
            continue;
        }
        if (line_start && s[i] == '#') {
            char prev = 0; /* the character before s[i], before blanking */
            while (i < n && !(s[i] == '\n' && prev != '\\')) {
                prev = s[i];
                if (s[i] != '\n') s[i] = ' ';
                i++;
            }
            line_start = 1;
            continue;
        }
        if (s[i] == '\n') line_start = 1;
        else if (!isspace((unsigned char)s[i])) line_start = 0;
    }
}

/* Appends the functions declared with KL_API in text (a whole header). */
static void read_protos(const char *text, protos *p) {
    const char *raw_begin = strstr(text, SECTION_BEGIN);
    const char *raw_end = raw_begin ? strstr(raw_begin, SECTION_END) : NULL;
    size_t sb = raw_begin ? (size_t)(raw_begin - text) : (size_t)-1;
    size_t se = raw_end ? (size_t)(raw_end - text) : (size_t)-1;
    char *s = strdup(text);
    assert_non_null(s);
    blank_non_code(s);
    for (char *k = strstr(s, "KL_API"); k; k = strstr(k + 6, "KL_API")) {
        if ((k > s && (isalnum((unsigned char)k[-1]) || k[-1] == '_')) || isalnum((unsigned char)k[6]) || k[6] == '_')
            continue;
        char *paren = strchr(k, '(');
        if (!paren) break;
        char *e = paren;
        while (e > k && isspace((unsigned char)e[-1])) e--;
        char *b = e;
        while (b > k && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
        assert_true(e > b && e - b < 64);
        assert_true(p->n < MAX_PROTOS);
        memcpy(p->name[p->n], b, (size_t)(e - b));
        p->name[p->n][e - b] = 0;
        size_t off = (size_t)(k - s);
        p->in_section[p->n] = sb != (size_t)-1 && off > sb && off < se;
        p->n++;
    }
    free(s);
}

static int quiet; /* the self-test's broken headers fail on purpose */
#define REPORT(...) (quiet ? (void)0 : print_message(__VA_ARGS__))

static int in_list(const char *name, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], name)) return 1;
    return 0;
}

/* The checks of the file comment; prints each problem, returns how many. */
static int check_protos(const protos *p, int need_section) {
    int bad = 0;
    int section_seen = 0;
    for (int i = 0; i < p->n; i++) {
        section_seen |= p->in_section[i];
        for (int j = 0; j < i; j++)
            if (!strcmp(p->name[i], p->name[j])) {
                REPORT("header: %s is declared twice\n", p->name[i]);
                bad++;
                break;
            }
        if (p->in_section[i] && !in_list(p->name[i], generated, N_GENERATED) &&
            !in_list(p->name[i], hand_written, sizeof hand_written / sizeof hand_written[0])) {
            REPORT("header: %s is declared among the generated functions but no op table row "
                          "generates it\n",
                          p->name[i]);
            bad++;
        }
    }
    for (size_t g = 0; g < N_GENERATED; g++) {
        int count = 0;
        for (int i = 0; i < p->n; i++) count += !strcmp(p->name[i], generated[g]);
        if (count != 1) {
            REPORT("header: %s (generated from the op table) is declared %d times, not once\n", generated[g],
                          count);
            bad++;
        }
    }
    if (need_section && !section_seen) {
        REPORT("header: no prototypes between \"" SECTION_BEGIN "\" and \"" SECTION_END "\"\n");
        bad++;
    }
    return bad;
}

static void read_header(const char *rel, protos *p) {
    const char *dir = getenv("KT_INCLUDE_DIR");
    assert_non_null(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    char *text = kt_read_text(path);
    if (!text) fail_msg("cannot read %s", path);
    read_protos(text, p);
    free(text);
}

/* ---- tests ------------------------------------------------------------------------- */

static protos P; /* large: not on the stack */

static void the_header_declares_each_generated_function_once(void **state) {
    (void)state;
    memset(&P, 0, sizeof P);
    read_header("kiln.h", &P);
    read_header("kiln/nn.h", &P);
    read_header("kiln/compile.h", &P);
    read_header("kiln/profiler.h", &P);
    read_header("kiln/bench.h", &P);
    assert_true(P.n > 300); /* the reader found the header's functions */
    assert_true(N_GENERATED > 100);
    assert_int_equal(check_protos(&P, 1), 0);
}

/* A made-up header: the generated prototypes (all but `skip`), then
 * `inside` within the section and `after` past its end. */
static char *made_up_header(long skip, const char *inside, const char *after) {
    size_t cap = 64 * N_GENERATED + 4096, len = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    /* a #define with a continuation line, which must not be read */
    len += (size_t)snprintf(h + len, cap - len, "/* " SECTION_BEGIN " */\n#define X(a) \\\n  KL_API int bogus(a);\n");
    for (size_t g = 0; g < N_GENERATED; g++)
        if ((long)g != skip) len += (size_t)snprintf(h + len, cap - len, "KL_API kl_tensor *%s(kl_tensor *x);\n", generated[g]);
    snprintf(h + len, cap - len, "%s/* " SECTION_END " */\n%s", inside, after);
    return h;
}

static int check_made_up(long skip, const char *inside, const char *after) {
    char *h = made_up_header(skip, inside, after);
    memset(&P, 0, sizeof P);
    read_protos(h, &P);
    free(h);
    return check_protos(&P, 1);
}

static void the_checker_fails_on_broken_headers(void **state) {
    (void)state;
    quiet = 1;
    char dup[128];
    snprintf(dup, sizeof dup, "KL_API kl_tensor *%s(kl_tensor *a);\n", generated[0]);
    assert_int_equal(check_made_up(-1, "", ""), 0);                  /* complete: passes */
    assert_int_equal(check_made_up(-1, "", "KL_API int kl_other(void);\n"), 0);
    assert_int_equal(check_made_up(-1, "KL_API kl_tensor *kl_no_such_op(kl_tensor *x);\n", ""), 1); /* no row */
    assert_int_equal(check_made_up(-1, "", dup), 2);  /* declared twice (and so not once) */
    assert_int_equal(check_made_up(1, "", ""), 1);    /* a generated function missing */
    char *h = made_up_header(-1, "", "");
    memset(&P, 0, sizeof P);
    read_protos(strstr(h, "KL_API kl_tensor"), &P); /* no section markers at all */
    free(h);
    assert_int_equal(check_protos(&P, 1), 1);
    quiet = 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_header_declares_each_generated_function_once),
        cmocka_unit_test(the_checker_fails_on_broken_headers),
    };
    return cmocka_run_group_tests_name("header", tests, NULL, NULL);
}
