/* kernels_ew.h — declarations for the rows of ops_unary.def, ops_binary.def
 * and ops_ew_other.def. */
#ifndef KE_KERNELS_EW_H
#define KE_KERNELS_EW_H
#include "ew.h"

extern const ke_ew_impl ke_ew_neg, ke_ew_exp;
extern const ke_ew_impl ke_ew_add, ke_ew_mul;
#endif
