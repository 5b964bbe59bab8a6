/* kernels_index.h — declarations for the rows of the index family of the op table. */
#ifndef KE_KERNELS_INDEX_H
#define KE_KERNELS_INDEX_H
#include "ew.h"

#endif
