/*
 * kiln/nn.h — module-free neural-network helpers above autograd: parameter
 * initialisers, a named parameter collection, optimizers and safetensors
 * files. Included by kiln.h; may also be included on its own.
 *
 * A training loop reads:
 *
 *     kl_params *p = kl_params_new();
 *     kl_tensor *w1, *b1, *w2, *b2;
 *     kl_params_add_linear(p, "fc1", 64, 256, true, &w1, &b1);  // "fc1.weight", "fc1.bias"
 *     kl_params_add_linear(p, "fc2", 256, 10, true, &w2, &b2);
 *     kl_adam_options o = kl_adamw_options_default();
 *     o.lr = 1e-3;
 *     kl_optim *opt = kl_optim_adamw(p, &o);
 *     for (int step = 0; step < n; step++) {
 *         kl_scope_begin();
 *         kl_tensor *h = kl_gelu(kl_linear(x, w1, b1));
 *         kl_tensor *loss = kl_cross_entropy(kl_linear(h, w2, b2), y, KL_REDUCE_MEAN, 0);
 *         kl_optim_zero_grad(opt);
 *         kl_backward(loss, NULL, NULL);
 *         kl_optim_step(opt);
 *         kl_scope_end();
 *     }
 *     kl_params_save_safetensors(p, "model.safetensors");
 *     kl_optim_free(opt);
 *     kl_params_free(p);
 *
 * Ownership: a kl_params and a kl_optim hold their own references to the
 * tensors they were given (arguments stay borrowed as everywhere in Kiln);
 * tensors they hand out are borrowed from them and stay valid until they are
 * freed. Errors follow kiln.h: NULL or -1 and a thread-local record.
 */
#ifndef KILN_NN_H
#define KILN_NN_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Initialisers (torch.nn.init). Each fills an existing floating tensor in   */
/* place without recording autograd (also on a leaf that requires grad) and */
/* returns it, or NULL with KL_ERR_DTYPE for a non-floating tensor. Random   */
/* ones draw from Kiln's default generator (kl_manual_seed): the same       */
/* distributions as PyTorch, not the same numbers. A tensor with no         */
/* elements is left as is.                                                   */
/* ------------------------------------------------------------------------ */

/* Nonlinearities for kl_init_calculate_gain and kaiming. Enums only grow at the end. */
typedef enum kl_nonlinearity {
    KL_NONLIN_LINEAR,             /* gain 1 (also conv*, conv_transpose*) */
    KL_NONLIN_SIGMOID,            /* 1 */
    KL_NONLIN_TANH,               /* 5/3 */
    KL_NONLIN_RELU,               /* sqrt(2) */
    KL_NONLIN_LEAKY_RELU,         /* sqrt(2 / (1 + negative_slope^2)) */
    KL_NONLIN_SELU,               /* 3/4 */
    KL_NONLIN_CONV1D,             /* 1 */
    KL_NONLIN_CONV2D,             /* 1 */
    KL_NONLIN_CONV3D,             /* 1 */
    KL_NONLIN_CONV_TRANSPOSE1D,   /* 1 */
    KL_NONLIN_CONV_TRANSPOSE2D,   /* 1 */
    KL_NONLIN_CONV_TRANSPOSE3D,   /* 1 */
    KL_NUM_NONLINS
} kl_nonlinearity;

/* Which fan kaiming preserves: the forward pass's variance or the backward's. */
typedef enum kl_fan_mode { KL_FAN_IN, KL_FAN_OUT } kl_fan_mode;

/* torch.nn.init.calculate_gain; param is leaky_relu's negative slope
 * (PyTorch's default when none is given is 0.01), ignored otherwise.
 * NaN and KL_ERR_ARG for an unknown nonlinearity. */
KL_API double kl_init_calculate_gain(kl_nonlinearity nl, double param);
/* fan_in = size(1) * receptive field, fan_out = size(0) * receptive field
 * (receptive field = product of dims 2..), as torch's
 * _calculate_fan_in_and_fan_out. Either pointer may be NULL. Returns 0, or -1
 * with KL_ERR_SHAPE for fewer than 2 dims. */
KL_API int kl_init_calculate_fans(const kl_tensor *t, int64_t *fan_in, int64_t *fan_out);

/* Uniform on [a, b). */
KL_API kl_tensor *kl_init_uniform(kl_tensor *t, double a, double b);
/* Normal(mean, std^2). */
KL_API kl_tensor *kl_init_normal(kl_tensor *t, double mean, double std);
KL_API kl_tensor *kl_init_constant(kl_tensor *t, double value);
KL_API kl_tensor *kl_init_zeros(kl_tensor *t);
KL_API kl_tensor *kl_init_ones(kl_tensor *t);
/* Glorot: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)). >= 2 dims (KL_ERR_SHAPE). */
KL_API kl_tensor *kl_init_xavier_uniform(kl_tensor *t, double gain);
/* Glorot: N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)). */
KL_API kl_tensor *kl_init_xavier_normal(kl_tensor *t, double gain);
/* He: U(-b, b), b = sqrt(3) * gain(nl, a) / sqrt(fan); a is leaky_relu's
 * negative slope. PyTorch's defaults: a = 0, KL_FAN_IN, KL_NONLIN_LEAKY_RELU. */
KL_API kl_tensor *kl_init_kaiming_uniform(kl_tensor *t, double a, kl_fan_mode mode, kl_nonlinearity nl);
/* He: N(0, std^2), std = gain(nl, a) / sqrt(fan). */
KL_API kl_tensor *kl_init_kaiming_normal(kl_tensor *t, double a, kl_fan_mode mode, kl_nonlinearity nl);

/* ------------------------------------------------------------------------ */
/* Parameter collections                                                     */
/* ------------------------------------------------------------------------ */

/* An ordered set of named parameters (PyTorch's named_parameters()). */
typedef struct kl_params kl_params;

/* An empty collection (NULL and KL_ERR_OOM on failure). Free with kl_params_free. */
KL_API kl_params *kl_params_new(void);
/* Drops the collection's references to its tensors and frees it. NULL is a no-op. */
KL_API void kl_params_free(kl_params *p);
/* Adds t under name (copied) and marks it as requiring grad; the collection
 * takes its own reference. t must be a floating leaf (KL_ERR_DTYPE /
 * KL_ERR_ARG); a name already present is KL_ERR_ARG. Returns t's index or -1. */
KL_API int kl_params_add(kl_params *p, const char *name, kl_tensor *t);
/* Number of parameters (0 for NULL). */
KL_API int kl_params_count(const kl_params *p);
/* Parameter i in insertion order (borrowed), or NULL and KL_ERR_INDEX. */
KL_API kl_tensor *kl_params_get(const kl_params *p, int i);
/* Name of parameter i (owned by p), or NULL and KL_ERR_INDEX. */
KL_API const char *kl_params_name(const kl_params *p, int i);
/* The parameter called name (borrowed), or NULL (no error recorded: absence
 * is an answer, not a failure). */
KL_API kl_tensor *kl_params_find(const kl_params *p, const char *name);
/* Index of name, or -1 (no error recorded). */
KL_API int kl_params_index(const kl_params *p, const char *name);
/* Drops every parameter's gradient (zero_grad(set_to_none=True)). Returns 0 or -1. */
KL_API int kl_params_zero_grad(kl_params *p);
/* Total number of elements over all parameters (-1 on NULL). */
KL_API int64_t kl_params_numel(const kl_params *p);
/* A linear layer's parameters with nn.Linear's default init, in the default
 * dtype: "<prefix>.weight" [out_features, in_features] from
 * kaiming_uniform(a = sqrt(5)) and, if bias, "<prefix>.bias" [out_features]
 * from U(-1/sqrt(in), 1/sqrt(in)). *weight / *bias (either pointer may be
 * NULL; *bias is set to NULL without bias) are borrowed from p. Use with
 * kl_linear(x, weight, bias). Returns 0 or -1 (nothing added on failure). */
KL_API int kl_params_add_linear(kl_params *p, const char *prefix, int64_t in_features,
                                int64_t out_features, bool bias, kl_tensor **weight, kl_tensor **b);

/* Convolution layers' parameters with nn.Conv1d / nn.Conv2d /
 * nn.ConvTranspose2d's default init, in the default dtype, as
 * kl_params_add_linear: "<prefix>.weight" from kaiming_uniform(a = sqrt(5))
 * (U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = weight dim 1 x kernel
 * elements) and "<prefix>.bias" [out_channels] from the same bound. Weights:
 * conv1d [out, in/groups, k], conv2d [out, in/groups, kh, kw],
 * conv_transpose2d [in, out/groups, kh, kw]. Channels must be positive and
 * divisible by groups (KL_ERR_ARG). Returns 0 or -1 (nothing added on failure). */
KL_API int kl_params_add_conv1d(kl_params *p, const char *prefix, int64_t in_channels, int64_t out_channels,
                                int64_t kernel_size, int64_t groups, bool bias, kl_tensor **weight, kl_tensor **b);
KL_API int kl_params_add_conv2d(kl_params *p, const char *prefix, int64_t in_channels, int64_t out_channels,
                                int64_t kh, int64_t kw, int64_t groups, bool bias, kl_tensor **weight,
                                kl_tensor **b);
KL_API int kl_params_add_conv_transpose2d(kl_params *p, const char *prefix, int64_t in_channels,
                                          int64_t out_channels, int64_t kh, int64_t kw, int64_t groups, bool bias,
                                          kl_tensor **weight, kl_tensor **b);
/* A batch-norm layer as nn.BatchNorm*d initialises it, in the default dtype:
 * if affine, parameters "<prefix>.weight" (ones) and "<prefix>.bias" (zeros)
 * [num_features] in p (borrowed, as above); and the running buffers, mean
 * zeros and variance ones [num_features], which are not parameters (no grad,
 * never stepped): new tensors owned by the caller's scope, like an op's
 * output (either pointer may be NULL; kl_keep or kl_retain them to keep them
 * beyond it). For kl_batch_norm. Returns 0 or -1. */
KL_API int kl_params_add_batch_norm(kl_params *p, const char *prefix, int64_t num_features, bool affine,
                                    kl_tensor **weight, kl_tensor **b, kl_tensor **running_mean,
                                    kl_tensor **running_var);
/* nn.PReLU's parameter "<prefix>.weight" [num_parameters] (1, or the
 * channels), every element init (PyTorch's default: 0.25), in the default
 * dtype, borrowed from p. For kl_prelu. Returns 0 or -1. */
KL_API int kl_params_add_prelu(kl_params *p, const char *prefix, int64_t num_parameters, double init,
                               kl_tensor **weight);

/* ------------------------------------------------------------------------ */
/* Optimizers (torch.optim 1.13 semantics, one parameter group). A step is   */
/* written only with kl_ in-place ops under no-grad, so it can be traced and */
/* compiled. Adam/AdamW on contiguous f32/f64 CPU tensors (no amsgrad, not   */
/* traced) run those ops as one pass per parameter, bit-identical to them.   */
/* Parameters whose grad is NULL are skipped; state tensors are              */
/* created on a parameter's first step and owned by the optimizer.           */
/* ------------------------------------------------------------------------ */

typedef struct kl_optim kl_optim;

typedef struct kl_sgd_options {
    double lr;            /* default 0.01 (PyTorch requires one) */
    double momentum;      /* 0: plain SGD */
    double dampening;     /* 0 */
    double weight_decay;  /* L2 penalty added to the gradient; 0 */
    bool nesterov;        /* needs momentum > 0 and dampening 0 */
    bool maximize;        /* ascend instead of descend */
} kl_sgd_options;
KL_API kl_sgd_options kl_sgd_options_default(void);

typedef struct kl_adam_options {
    double lr;            /* 1e-3 */
    double beta1, beta2;  /* 0.9, 0.999; each in [0, 1) */
    double eps;           /* 1e-8 */
    double weight_decay;  /* Adam: 0, added to the gradient; AdamW: 1e-2, decoupled */
    bool amsgrad;         /* keep the max of the second moment */
    bool maximize;
} kl_adam_options;
KL_API kl_adam_options kl_adam_options_default(void);
/* The same with weight_decay = 1e-2 (torch.optim.AdamW's default). */
KL_API kl_adam_options kl_adamw_options_default(void);

/* Optimizers over the parameters p holds now (later additions to p are not
 * seen; the optimizer keeps its own references, so p may be freed first).
 * opts NULL = defaults. Invalid options (negative lr, eps, weight decay or
 * momentum, betas outside [0, 1), nesterov without momentum or with
 * dampening) are KL_ERR_ARG. NULL on failure. */
KL_API kl_optim *kl_optim_sgd(const kl_params *p, const kl_sgd_options *opts);
KL_API kl_optim *kl_optim_adam(const kl_params *p, const kl_adam_options *opts);
KL_API kl_optim *kl_optim_adamw(const kl_params *p, const kl_adam_options *opts);
/* One update of every parameter that has a grad. Returns 0 or -1; with an
 * error already pending (a failed forward or backward) it updates nothing. */
KL_API int kl_optim_step(kl_optim *o);
/* Drops the gradients of the optimizer's parameters (set_to_none). 0 or -1. */
KL_API int kl_optim_zero_grad(kl_optim *o);
/* Learning rate for schedulers: the next step uses it. set: 0 or -1 (KL_ERR_ARG
 * for lr < 0); get: NaN and an error on NULL. */
KL_API int kl_optim_set_lr(kl_optim *o, double lr);
KL_API double kl_optim_get_lr(const kl_optim *o);
/* Steps taken by kl_optim_step so far (-1 on NULL). */
KL_API int64_t kl_optim_steps(const kl_optim *o);
/* Frees the optimizer and its state. NULL is a no-op. */
KL_API void kl_optim_free(kl_optim *o);

/* Optimizer state in a safetensors file beside the parameters, so training
 * resumes where it stopped: per parameter of p (the collection o was made
 * from) "<name>.step" (int64 []) and its moments ("<name>.exp_avg",
 * "<name>.exp_avg_sq", "<name>.max_exp_avg_sq", "<name>.momentum_buffer",
 * those that exist), and metadata "kiln.optim" (sgd, adam, adamw), "steps"
 * and "lr". Loading requires the same kind and matching names, shapes and
 * dtypes (KL_ERR_ARG / KL_ERR_SHAPE / KL_ERR_DTYPE), copies into fresh or
 * existing state and sets the step counts and lr; nothing changes unless
 * every check passes. 0 or -1. */
KL_API int kl_optim_save_safetensors(const kl_optim *o, const kl_params *p, const char *path);
KL_API int kl_optim_load_safetensors(kl_optim *o, const kl_params *p, const char *path);

/* ------------------------------------------------------------------------ */
/* Training helpers                                                          */
/* ------------------------------------------------------------------------ */

/* torch.nn.utils.clip_grad_norm_ (1.13): the norm of the gradients of p's
 * parameters taken together (norm_type 2, any p > 0, or INFINITY: the
 * largest |g|), then every gradient is multiplied in place by
 * min(1, max_norm / (total + 1e-6)). Parameters without a gradient are
 * skipped (0 when none has one). Returns the total norm before clipping
 * (a non-finite norm is returned, gradients scaled as PyTorch does), or NaN
 * with an error (NULL p, max_norm < 0 or NaN, norm_type <= 0). */
KL_API double kl_clip_grad_norm(kl_params *p, double max_norm, double norm_type);
/* Learning rate at step (0-based) of a linear warm-up to base_lr over warmup
 * steps (base_lr * (step + 1) / warmup), then cosine annealing to min_lr over
 * the remaining total - warmup steps, as CosineAnnealingLR's closed form
 * (min_lr + (base_lr - min_lr) (1 + cos(pi (step - warmup) / (total - warmup))) / 2);
 * min_lr from step total on. NaN and KL_ERR_ARG for negative counts or
 * total < warmup. */
KL_API double kl_lr_cosine_warmup(int64_t step, double base_lr, int64_t warmup, int64_t total, double min_lr);
/* StepLR: base_lr * gamma^floor(step / step_size) (step_size >= 1, else NaN and KL_ERR_ARG). */
KL_API double kl_lr_step(int64_t step, double base_lr, int64_t step_size, double gamma);

/* ------------------------------------------------------------------------ */
/* safetensors files (https://github.com/huggingface/safetensors): an        */
/* 8-byte little-endian header length N, N bytes of JSON                    */
/* {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,           */
/* "__metadata__": {"key": "value"}}, then the data. dtypes F32 F64 F16 BF16 */
/* I32 I64 U8 BOOL map to Kiln's; other spec dtypes, more than 8 dims and  */
/* names holding NUL are KL_ERR_UNSUPPORTED.                                */
/* Reading checks everything (header length and bounds, JSON, dtypes,       */
/* shapes, offsets that must tile the data exactly, duplicate names) and    */
/* fails with KL_ERR_FORMAT naming the problem; KL_ERR_IO if unreadable.     */
/* ------------------------------------------------------------------------ */

/* The tensors of a safetensors file, copied into Kiln tensors. */
typedef struct kl_safetensors kl_safetensors;

/* Writes n named tensors (any device, dtype and layout; copied to CPU and
 * contiguous) to path atomically (a temporary file renamed over path), laid
 * out as the reference writer does: by dtype size, largest first, then by
 * name, header padded with spaces to 8 bytes. metadata: NULL or a
 * NULL-terminated list of key, value strings ({"format", "pt", NULL}).
 * Duplicate or empty names and "__metadata__" are KL_ERR_ARG. Returns 0 or -1. */
KL_API int kl_save_safetensors(const char *path, int n, const char *const *names,
                               kl_tensor *const *tensors, const char *const *metadata);
/* Reads a whole file. NULL on failure. Free with kl_safetensors_free. */
KL_API kl_safetensors *kl_load_safetensors(const char *path);
/* The same from memory (len bytes at buf, not kept). */
KL_API kl_safetensors *kl_load_safetensors_buffer(const void *buf, size_t len);
/* Number of tensors (0 for NULL). */
KL_API int kl_safetensors_count(const kl_safetensors *f);
/* Name / tensor i in file (data offset) order, owned by f; NULL and KL_ERR_INDEX. */
KL_API const char *kl_safetensors_name(const kl_safetensors *f, int i);
KL_API kl_tensor *kl_safetensors_get(const kl_safetensors *f, int i);
/* The tensor called name (owned by f) or NULL (no error recorded). */
KL_API kl_tensor *kl_safetensors_find(const kl_safetensors *f, const char *name);
/* Value of a "__metadata__" key (owned by f) or NULL. */
KL_API const char *kl_safetensors_metadata(const kl_safetensors *f, const char *key);
/* Number of metadata entries, and the key of entry i (NULL out of range). */
KL_API int kl_safetensors_metadata_count(const kl_safetensors *f);
KL_API const char *kl_safetensors_metadata_key(const kl_safetensors *f, int i);
/* Frees f and its tensors (tensors the caller kl_retain'ed survive). */
KL_API void kl_safetensors_free(kl_safetensors *f);

/* Saves every parameter of p under its name (no metadata). Returns 0 or -1. */
KL_API int kl_params_save_safetensors(const kl_params *p, const char *path);
/* Copies the tensors of a file into the parameters of p with the same names
 * (under no-grad, so parameters stay leaves; version counters bump). Shapes
 * and dtypes must match exactly (KL_ERR_SHAPE / KL_ERR_DTYPE). strict: every
 * parameter must be in the file and every tensor of the file must be a
 * parameter (KL_ERR_ARG naming the first missing / unexpected one); not
 * strict: the names in both are loaded, others ignored. Nothing is written
 * unless every check passes. Returns the number of parameters loaded, or -1. */
KL_API int kl_params_load_safetensors(kl_params *p, const char *path, bool strict);

#ifdef __cplusplus
}
#endif
#endif /* KILN_NN_H */
