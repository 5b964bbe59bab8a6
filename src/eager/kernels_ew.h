/* kernels_ew.h — the macros ew_unary.c, ew_binary.c and ew_other.c share to
 * expand one formula over dtype groups. What the rows of ops_unary.def,
 * ops_binary.def and ops_ew_other.def name is declared by optable.h. */
#ifndef KE_KERNELS_EW_H
#define KE_KERNELS_EW_H
#include "optable.h"

/* The rows' shape rules, kernels and loops (ke_ew_<op>) are declared in
 * optable.h from the table. ke_infer_ew_same and ke_infer_ew_bcast (ew_other.c),
 * the rules of most rows, are the shared same-shape / broadcast rules followed
 * by a check that the row's impl has a loop for the compute dtype, so an
 * unsupported dtype fails in the shape rule (also on Meta tensors), not in the
 * kernel. */

/* The loop generators over dtype groups (KE_GEN_*, KE_LOOPS_*), KE_WRAP_*
 * and ke_ew_f2i: shared with the CUDA device build of the same files. */
#include "ew_gen.h"

/* An impl table: const ke_ew_impl ke_ew_<name> = {fields}. A macro so the
 * device build, which compiles these files for NVRTC, can drop the tables
 * (C++ has no array designators; device code needs the formulas only). */
#define KE_EW_IMPL(name, ...) const ke_ew_impl ke_ew_##name = {__VA_ARGS__};

#endif
