/* kv_cache.h: the paged-cache checks that kv_cache.c shares with attention.c (as the Python
 * package's attention imports kvcache.api.check_cache / check_scale). Internal, not installed. */
#ifndef KS_OPS_KV_CACHE_H_
#define KS_OPS_KV_CACHE_H_

#include "ks_internal.h"

/* dtypes a paged cache may hold (kvcache.api.CACHE_DTYPES) */
#define KS_CACHE_DTYPES (KS_FLOATS | KS_FP8)

/* "[a, b, c]" into buf */
const char *ks_ops_shape_str(const ks_view *v, char *buf, size_t n);

/* A paged cache [num_blocks, block_size, Hkv, D]: a cache dtype, 4-D, block_size and D >= 1,
 * unit-stride last dim (else KS_ERR_UNSUPPORTED_LAYOUT). */
ks_status_t ks_kv_check_cache(ks_call *c, ks_view *v, const char *name, const DLTensor *t);

/* The per-tensor fp32 scale of an fp8 cache (0-d or one element); it must be NULL for other
 * caches. s->present says whether there is one. */
ks_status_t ks_kv_check_scale(ks_call *c, ks_view *s, const char *name, const DLTensor *t, const ks_view *cache,
                              const char *cache_name);

/* The scale's value on the CPU (1 when absent). */
float ks_kv_scale_value(const ks_view *s);

#endif /* KS_OPS_KV_CACHE_H_ */
