/* kernels_reduce.h — declarations for the rows of the reduce family of the op table. */
#ifndef KE_KERNELS_REDUCE_H
#define KE_KERNELS_REDUCE_H
#include "ew.h"

#endif
