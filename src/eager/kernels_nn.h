/* kernels_nn.h — declarations for the rows of the nn family of the op table. */
#ifndef KE_KERNELS_NN_H
#define KE_KERNELS_NN_H
#include "ew.h"

#endif
