/* multinomial.h — multinomial sampling's rules shared with the CUDA kernel
 * (codegen_nvrtc/cn_multinomial.c), so both devices check and draw alike. */
#ifndef KE_MULTINOMIAL_H
#define KE_MULTINOMIAL_H

#include <stdint.h>

/* Checks row r of n probabilities (as doubles, w[0..n)): each finite and
 * >= 0, a positive sum, and without replacement (repl 0) at least ns non-zero
 * ones. 0, or -1 with op's error (KL_ERR_ARG, naming the row, the category
 * and its value). The CUDA kernel finds the first bad row on the device and
 * raises the error through this function. */
int ke_multinomial_check_row(const char *op, const double *w, int64_t r, int64_t n, int repl, int64_t ns);

#endif
