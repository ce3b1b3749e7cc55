/* One decode step of a Llama-family model with 4-bit weights, fused into one call.

   Every row of the batch adds one token. Per layer: RMSNorm, q/k/v, RoPE, the new K/V written into the paged
   cache, attention over the row's cached context, o, RMSNorm, gate/up, SiLU, down, each residual added; then
   the final norm and the head. The Python engine (engine/model/native_decode.py) owns every buffer and decides the
   batch; this file only computes.

   Weights are multiplied the way llama.cpp multiplies Q4_1 and Q8_0 weights on CPU: each activation row is
   rounded to 8-bit integers in groups of 32 with one float scale per group, and a group's dot product is
   an integer sum (VNNI `vpdpbusd` where the CPU has it, else AVX2 `vpmaddubsw` + `vpmaddwd`) scaled once.
   A 4-bit group is 20 bytes: 16 bytes of codes (byte j: code j in the low nibble, code j + 16 in the high
   one), then bfloat16 scale s and zero z; the value of code c is (c - 8) * s + z, as `Int4Linear` reads it.
   Groups are stored four output features at a time, (n / 4, k / 32, 4) blocks, which is the order the
   kernel reads them in: the weights stream through memory strictly forward.
   The head is int8 codes with one bfloat16 scale per group of 32 (GGUF's Q8_0).

   Norms, RoPE, attention, SiLU, the residual stream and the KV cache are float32.

   Two forms of the integer dot product, one per build (`-DKVGATE_I16_DOTS` or not), chosen per CPU by
   measuring both at first start (engine/model/native_forms.py); both sum the same integers exactly:
   - byte pairs: the weights' codes as unsigned bytes against the two int8 activation codes, two products
     per group (VNNI `vpdpbusd`, else AVX2 `vpmaddubsw` + `vpmaddwd`), the high one shifted by 8;
   - 16-bit: the codes widened to int16 once per output feature, against the activation as one int16
     (256 q + r), one product per group (VNNI `vpdpwssd`, else AVX2 `vpmaddwd`): fewer instructions per row,
     one more widening per feature. Which is faster depends on the CPU's ports, so it is measured. */

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 32
#define Q4_BLOCK_BYTES 20
#define ROWS_PER_PASS 4
#define Q4_INTERLEAVE 4 /* output features whose groups are stored side by side */

typedef struct {
    const uint8_t *blocks; /* (n / 4, k / 32, 4) blocks of Q4_BLOCK_BYTES */
    const float *bias;     /* (n,) or NULL */
    int64_t n, k;
} q4_weight;

typedef struct {
    const int8_t *codes;     /* (n, k) */
    const uint16_t *scales;  /* (n, k / 32) bfloat16 */
    int64_t n, k;
} q8_weight;

typedef struct {
    const float *attention_norm, *feed_forward_norm; /* (hidden,) */
    q4_weight qkv, o, gate_up, down;
    float *key_cache, *value_cache; /* (slots, kv_heads, head_dim) */
} layer_weights;

typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate, num_layers, block_size;
    float eps;
    const layer_weights *layers;
    const float *norm;
    q8_weight head;
} model_weights;

/* An activation row in groups of 32 as two int8 codes per value: x ~ d (256 q + r), with q = round(x / 256 d),
   d = max|x| / (127 * 256), and r the rounded remainder; a dot product is (dot(w, q) << 8) + dot(w, r).
   That is 16-bit precision (finer than the bfloat16 inputs of torch's int4 kernel) from 8-bit products. */
typedef struct {
    int8_t *q;     /* (rows, k) */
    int8_t *r;     /* (rows, k) */
    int16_t *w;    /* (rows, k): 256 q + r, the 16-bit form's operand */
    float *d;      /* (rows, k / 32) */
    float *dsum;   /* (rows, k / 32): d * sum(256 q + r) of the group */
} quantized_rows;

static inline float bf16_to_float(uint16_t bits) {
    uint32_t widened = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &widened, sizeof value);
    return value;
}

static inline float hsum(__m256 v) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
}

/* 16 int16 products summed in pairs and added to acc (exact: every operand pair here fits in int32). */
static inline __m256i dot_i16_add(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* sum over 4-byte lanes of unsigned a * signed b, as 8 int32 */
static inline __m256i dot_u8_s8(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

/* exp of 8 floats (Cephes' polynomial, as in avx_mathfun): relative error ~1e-7 over the range used. */
static inline __m256 exp8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, one));
    __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
}

static void exp_in_place(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] = expf(x[i]);
}

static void quantize_rows(const float *x, int64_t rows, int64_t k, quantized_rows out) {
    const int64_t groups = k / GROUP;
    for (int64_t row = 0; row < rows; row++) {
        for (int64_t g = 0; g < groups; g++) {
            const float *src = x + row * k + g * GROUP;
            int8_t *q = out.q + row * k + g * GROUP, *r = out.r + row * k + g * GROUP;
            float amax = 0.0f;
            for (int i = 0; i < GROUP; i++) {
                const float magnitude = fabsf(src[i]);
                amax = magnitude > amax ? magnitude : amax; /* not fmaxf: a call into libm here */
            }
            const float coarse = amax / 127.0f, fine = coarse / 256.0f;
            const float inverse_coarse = amax > 0.0f ? 1.0f / coarse : 0.0f;
            const float inverse_fine = amax > 0.0f ? 1.0f / fine : 0.0f;
            int sum = 0;
            for (int i = 0; i < GROUP; i++) {
                const int high = (int)nearbyintf(src[i] * inverse_coarse);
                int low = (int)nearbyintf((src[i] - (float)high * coarse) * inverse_fine);
                low = low > 127 ? 127 : (low < -127 ? -127 : low);
                q[i] = (int8_t)high;
                r[i] = (int8_t)low;
                out.w[row * k + g * GROUP + i] = (int16_t)(256 * high + low);
                sum += 256 * high + low;
            }
            out.d[row * groups + g] = fine;
            out.dsum[row * groups + g] = fine * (float)sum;
        }
    }
}

/* Weights are read once per pass over up to ROWS_PER_PASS activation rows; OUTS output features are computed
   side by side so that their accumulators are independent chains held in registers. Both counts are
   compile-time constants in every instantiation below (always_inline), so the loops over them unroll. */

#define PREFETCH_BYTES 3072

/* The dot product's form: how a group of 32 activations and a group of 32 weight codes are held in registers,
   and their exact integer dot product as 8 int32 lanes (to be summed). */
#ifdef KVGATE_I16_DOTS
typedef struct { __m256i first, second; } activation_group; /* 256 q + r as int16 */
typedef struct { __m256i first, second; } q4_group;         /* the codes as int16 */
typedef q4_group q8_group;

static inline activation_group load_activation(quantized_rows x, int64_t at) {
    return (activation_group){_mm256_loadu_si256((const __m256i *)(x.w + at)),
                              _mm256_loadu_si256((const __m256i *)(x.w + at + 16))};
}

/* byte j as int16: its low nibble is code j, its high nibble code j + 16 */
static inline q4_group load_q4_group(const uint8_t *block) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)block));
    return (q4_group){_mm256_and_si256(bytes, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16(bytes, 4)};
}

static inline q8_group load_q8_group(const int8_t *codes) {
    return (q8_group){_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)codes)),
                      _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 16)))};
}

static inline __m256i q4_dot(q4_group w, activation_group a) {
    return dot_i16_add(_mm256_madd_epi16(w.first, a.first), w.second, a.second);
}

static inline __m256i q8_dot(q8_group w, activation_group a) { return q4_dot(w, a); }
#else
typedef struct { __m256i q, r; } activation_group;   /* the two int8 codes */
typedef __m256i q4_group;                             /* the codes as unsigned bytes, in order */
typedef struct { __m256i magnitude, sign; } q8_group; /* |c| as unsigned bytes, and c for its sign */

static inline activation_group load_activation(quantized_rows x, int64_t at) {
    return (activation_group){_mm256_loadu_si256((const __m256i *)(x.q + at)),
                              _mm256_loadu_si256((const __m256i *)(x.r + at))};
}

static inline q4_group load_q4_group(const uint8_t *block) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)block), low_nibbles = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles), _mm_and_si128(packed, low_nibbles));
}

static inline q8_group load_q8_group(const int8_t *codes) {
    const __m256i c = _mm256_loadu_si256((const __m256i *)codes);
    return (q8_group){_mm256_sign_epi8(c, c), c};
}

static inline __m256i q4_dot(q4_group w, activation_group a) {
    return _mm256_add_epi32(_mm256_slli_epi32(dot_u8_s8(w, a.q), 8), dot_u8_s8(w, a.r));
}

static inline __m256i q8_dot(q8_group w, activation_group a) {
    const __m256i high = dot_u8_s8(w.magnitude, _mm256_sign_epi8(a.q, w.sign));
    const __m256i low = dot_u8_s8(w.magnitude, _mm256_sign_epi8(a.r, w.sign));
    return _mm256_add_epi32(_mm256_slli_epi32(high, 8), low);
}
#endif

/* The four outputs' scales and zeros of group g as floats, with their offsets z - 8 s: one vector each, so the
   per-output work left in the loop below is the integer dot, its conversion and one multiply-add. */
static inline void q4_quad_scales(const uint8_t *interleaved, __m128 *scales, __m128 *offsets) {
    uint32_t words[Q4_INTERLEAVE];
    for (int o = 0; o < Q4_INTERLEAVE; o++) memcpy(&words[o], interleaved + o * Q4_BLOCK_BYTES + 16, 4);
    const __m128i scale_zero = _mm_loadu_si128((const __m128i *)words); /* lane o: zero << 16 | scale */
    *scales = _mm_castsi128_ps(_mm_slli_epi32(scale_zero, 16));
    const __m128 zeros = _mm_castsi128_ps(_mm_and_si128(scale_zero, _mm_set1_epi32((int)0xFFFF0000u)));
    *offsets = _mm_fnmadd_ps(_mm_set1_ps(8.0f), *scales, zeros); /* 8 s is exact: as z - 8 s in floats */
}

static inline __attribute__((always_inline)) void q4_outputs(const q4_weight *w, quantized_rows x, int64_t first,
                                                             const int rows, int64_t n, float *y) {
    const int outs = Q4_INTERLEAVE;
    const int64_t groups = w->k / GROUP;
    __m256 acc[ROWS_PER_PASS][4];
    float zero_terms[ROWS_PER_PASS][4]; /* each output's (z - 8 s) d sum(256 q + r) terms */
    __m128 zero_quad = _mm_setzero_ps(); /* the same, one row's four outputs in one vector */
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < outs; o++) {
            acc[r][o] = _mm256_setzero_ps();
            zero_terms[r][o] = 0.0f;
        }
    for (int64_t g = 0; g < groups; g++) {
        activation_group a[ROWS_PER_PASS];
        float d[ROWS_PER_PASS], dsum[ROWS_PER_PASS];
        for (int r = 0; r < rows; r++) {
            a[r] = load_activation(x, (first + r) * w->k + g * GROUP);
            d[r] = x.d[(first + r) * groups + g];
            dsum[r] = x.dsum[(first + r) * groups + g];
        }
        const uint8_t *interleaved = w->blocks + (n * groups + g * Q4_INTERLEAVE) * Q4_BLOCK_BYTES;
        _mm_prefetch((const char *)interleaved + PREFETCH_BYTES, _MM_HINT_T0);
        _mm_prefetch((const char *)interleaved + PREFETCH_BYTES + 64, _MM_HINT_T0);
        /* sum((c - 8) s + z) x = d (s sum(c (256 q + r)) + (z - 8 s) sum(256 q + r)) */
        if (rows == 1) {
            /* One row (a lone stream): the four outputs' scales decoded and multiplied together, each
               broadcast from memory (a load, not a shuffle): measured ~10% less time a step than per output. */
            __m128 scales, offsets;
            q4_quad_scales(interleaved, &scales, &offsets);
            float scaled[4];
            _mm_storeu_ps(scaled, _mm_mul_ps(scales, _mm_set1_ps(d[0])));
            zero_quad = _mm_fmadd_ps(offsets, _mm_set1_ps(dsum[0]), zero_quad);
            for (int o = 0; o < outs; o++) {
                const __m256 dot = _mm256_cvtepi32_ps(q4_dot(load_q4_group(interleaved + o * Q4_BLOCK_BYTES), a[0]));
                acc[0][o] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(&scaled[o]), acc[0][o]);
            }
            continue;
        }
        /* Several rows: one output at a time (its codes and scale in registers against every row; the
           four-output form above spills here, measured 10-20% slower at 4 and 16 rows). The same arithmetic
           as above, operation for operation, so that a row's bits never depend on its batch. */
        for (int o = 0; o < outs; o++) {
            const uint8_t *block = interleaved + o * Q4_BLOCK_BYTES;
            const q4_group codes = load_q4_group(block);
            uint32_t scale_zero;
            memcpy(&scale_zero, block + 16, sizeof scale_zero);
            const float scale = bf16_to_float((uint16_t)(scale_zero & 0xFFFF));
            const float offset = bf16_to_float((uint16_t)(scale_zero >> 16)) - 8.0f * scale; /* 8 s: exact */
            for (int r = 0; r < rows; r++) {
                const __m256 dot = _mm256_cvtepi32_ps(q4_dot(codes, a[r]));
                acc[r][o] = _mm256_fmadd_ps(dot, _mm256_set1_ps(scale * d[r]), acc[r][o]);
                zero_terms[r][o] = fmaf(offset, dsum[r], zero_terms[r][o]);
            }
        }
    }
    if (rows == 1) _mm_storeu_ps(zero_terms[0], zero_quad);
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < outs; o++) {
            const float bias = w->bias ? w->bias[n + o] : 0.0f;
            y[(first + r) * w->n + n + o] = hsum(acc[r][o]) + zero_terms[r][o] + bias;
        }
}

/* Threads. Each matrix product is split among `threads` participants by output features: the caller and
   threads - 1 workers that this library starts once and keeps. A worker spins briefly for the next product
   (they come microseconds apart within a step) and then sleeps on a condition variable (between steps,
   while Python samples and schedules, it must not hold a core the gateway needs). Not OpenMP: libgomp
   throttles its spinning to almost nothing once more of its threads exist than cores, which torch's own
   team and the engine thread's already make, and each product then paid a futex wake-up (measured:
   66 against 153 tok/s at two threads with the step in a non-main thread). */

#define MAX_THREADS 64
#define SPINS_BEFORE_SLEEP 4000

typedef void (*job_function)(const void *job, int index, int count);

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_long generation; /* bumped once per product */
    atomic_int done;        /* workers finished with the current product */
    int workers;            /* started, never stopped */
    job_function function;
    const void *job;
    int count;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, NULL, NULL, 0};

static long started_at[MAX_THREADS]; /* the generation before a worker's first product */

static void *pool_worker(void *argument) {
    const int index = (int)(intptr_t)argument;
    long seen = started_at[index];
    for (;;) {
        long now;
        int spins = 0;
        while ((now = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            if (++spins < SPINS_BEFORE_SLEEP) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = now;
        if (index < pool.count) pool.function(pool.job, index, pool.count);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel);
    }
    return NULL;
}

/* A child of fork() has the caller's thread only: it starts its own workers when it needs them. */
static void pool_forget_workers(void) {
    pool.workers = 0;
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
}

__attribute__((constructor)) static void pool_register_fork_handler(void) {
    pthread_atfork(NULL, NULL, pool_forget_workers);
}

/* Run function(job, i, count) for i in 0..count-1, i = 0 on the caller; returns when all are done.
   Called from one thread at a time (the engine's step loop). */
static void run_parallel(job_function function, const void *job, int count) {
    count = count > MAX_THREADS ? MAX_THREADS : count;
    while (pool.workers < count - 1) {
        pthread_t thread;
        started_at[pool.workers + 1] = atomic_load_explicit(&pool.generation, memory_order_acquire);
        if (pthread_create(&thread, NULL, pool_worker, (void *)(intptr_t)(pool.workers + 1)) != 0) break;
        pthread_detach(thread);
        pool.workers++;
    }
    if (count > pool.workers + 1) count = pool.workers + 1;
    if (count <= 1) {
        function(job, 0, 1);
        return;
    }
    pool.function = function;
    pool.job = job;
    pool.count = count;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    function(job, 0, count);
    /* A worker that is not running (more threads than free cores) gets the core after a while. */
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < pool.workers; spins++) {
        if (spins < SPINS_BEFORE_SLEEP) _mm_pause();
        else sched_yield();
    }
}

/* A product's output features are claimed in chunks from a shared counter rather than split in fixed shares:
   a participant that runs slower (a core taken by another thread of the process for a moment, the other
   core's memory traffic) takes fewer chunks instead of holding every other participant at the barrier.
   About CLAIMS_PER_PARTICIPANT chunks each, in whole units of `unit` features; one participant claims all at
   once. Which participant computes a feature never changes its value: results are the same bits. With
   more than ROWS_PER_PASS rows, each chunk's weights are read from memory once and from cache for the
   later passes. */
#define CLAIMS_PER_PARTICIPANT 8

static int64_t claim_size(int64_t total, int64_t unit, int count) {
    const int64_t claims = count <= 1 ? 1 : (int64_t)count * CLAIMS_PER_PARTICIPANT;
    const int64_t units = (total / unit + claims - 1) / claims;
    return (units < 1 ? 1 : units) * unit;
}

/* The next chunk [*begin, *end) of `total` features, or 0 when all are claimed. */
static inline int claim(atomic_long *next, int64_t size, int64_t total, int64_t *begin, int64_t *end) {
    *begin = atomic_fetch_add_explicit(next, 1, memory_order_relaxed) * size;
    if (*begin >= total) return 0;
    *end = *begin + size < total ? *begin + size : total;
    return 1;
}

static inline __attribute__((always_inline)) void q4_pass(const q4_weight *w, quantized_rows x, int64_t first,
                                                          const int rows, int64_t begin, int64_t end, float *y) {
    for (int64_t n = begin; n < end; n += Q4_INTERLEAVE) q4_outputs(w, x, first, rows, n, y);
}

typedef struct {
    const q4_weight *w;
    int64_t rows;
    quantized_rows x;
    float *y;
    int64_t chunk;
    atomic_long next;
} q4_job;

static void q4_share(const void *argument, int index, int count) {
    q4_job *job = (q4_job *)argument;
    (void)index, (void)count;
    int64_t begin, end;
    while (claim(&job->next, job->chunk, job->w->n, &begin, &end)) {
        for (int64_t first = 0; first < job->rows; first += ROWS_PER_PASS) {
            switch (job->rows - first < ROWS_PER_PASS ? job->rows - first : ROWS_PER_PASS) {
                case 1: q4_pass(job->w, job->x, first, 1, begin, end, job->y); break;
                case 2: q4_pass(job->w, job->x, first, 2, begin, end, job->y); break;
                case 3: q4_pass(job->w, job->x, first, 3, begin, end, job->y); break;
                default: q4_pass(job->w, job->x, first, 4, begin, end, job->y); break;
            }
        }
    }
}

/* y (rows, n) = x (rows, k) @ W^T (+ bias), x given as quantized rows. */
static void matmul_q4(const q4_weight *w, int64_t rows, quantized_rows x, float *y, int threads) {
    q4_job job = {w, rows, x, y, claim_size(w->n, Q4_INTERLEAVE, threads), 0};
    run_parallel(q4_share, &job, threads);
}

static inline __attribute__((always_inline)) void q8_outputs(const q8_weight *w, quantized_rows x, int64_t first,
                                                             const int rows, const int outs, int64_t n, float *y) {
    const int64_t groups = w->k / GROUP;
    __m256 acc[ROWS_PER_PASS][4];
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < outs; o++) acc[r][o] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        activation_group a[ROWS_PER_PASS];
        float d[ROWS_PER_PASS];
        for (int r = 0; r < rows; r++) {
            a[r] = load_activation(x, (first + r) * w->k + g * GROUP);
            d[r] = x.d[(first + r) * groups + g];
        }
        _mm_prefetch((const char *)(w->codes + n * w->k + g * GROUP) + 4 * PREFETCH_BYTES, _MM_HINT_T0);
        for (int o = 0; o < outs; o++) {
            const q8_group codes = load_q8_group(w->codes + (n + o) * w->k + g * GROUP);
            const float scale = bf16_to_float(w->scales[(n + o) * groups + g]);
            for (int r = 0; r < rows; r++) {
                const __m256 dot = _mm256_cvtepi32_ps(q8_dot(codes, a[r]));
                acc[r][o] = _mm256_fmadd_ps(dot, _mm256_set1_ps(scale * d[r]), acc[r][o]);
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int o = 0; o < outs; o++) y[(first + r) * w->n + n + o] = hsum(acc[r][o]);
}

static inline __attribute__((always_inline)) void q8_pass(const q8_weight *w, quantized_rows x, int64_t first,
                                                          const int rows, int64_t begin, int64_t end, float *y) {
    const int outs = rows <= 2 ? 4 : 2;
    int64_t n = begin;
    for (; n + outs <= end; n += outs) q8_outputs(w, x, first, rows, outs, n, y);
    for (; n < end; n++) q8_outputs(w, x, first, rows, 1, n, y);
}

typedef struct {
    const q8_weight *w;
    int64_t rows;
    quantized_rows x;
    float *y;
    int64_t chunk;
    atomic_long next;
} q8_job;

static void q8_share(const void *argument, int index, int count) {
    q8_job *job = (q8_job *)argument;
    (void)index, (void)count;
    int64_t begin, end;
    while (claim(&job->next, job->chunk, job->w->n, &begin, &end)) {
        for (int64_t first = 0; first < job->rows; first += ROWS_PER_PASS) {
            switch (job->rows - first < ROWS_PER_PASS ? job->rows - first : ROWS_PER_PASS) {
                case 1: q8_pass(job->w, job->x, first, 1, begin, end, job->y); break;
                case 2: q8_pass(job->w, job->x, first, 2, begin, end, job->y); break;
                case 3: q8_pass(job->w, job->x, first, 3, begin, end, job->y); break;
                default: q8_pass(job->w, job->x, first, 4, begin, end, job->y); break;
            }
        }
    }
}

/* y (rows, n) = x (rows, k) @ W^T for the int8 head. */
static void matmul_q8(const q8_weight *w, int64_t rows, quantized_rows x, float *y, int threads) {
    q8_job job = {w, rows, x, y, claim_size(w->n, 4, threads), 0};
    run_parallel(q8_share, &job, threads);
}

static inline float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float sum = hsum(acc);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void rms_norm(const float *x, const float *weight, int64_t rows, int64_t n, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * n;
        const float mean_square = dot_f32(row, row, n) / (float)n;
        const float inverse = 1.0f / sqrtf(mean_square + eps);
        for (int64_t i = 0; i < n; i++) out[r * n + i] = weight[i] * (row[i] * inverse);
    }
}

/* Rotate one head in place: pairs (i, i + D/2), cos and signed sin (first half negated) over D. */
static void rotate(float *head, const float *cos, const float *signed_sin, int64_t dim) {
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const float first = head[i], second = head[i + half];
        head[i] = first * cos[i] + second * signed_sin[i];
        head[i + half] = second * cos[i + half] + first * signed_sin[i + half];
    }
}

/* Attention of one head `h` of a row over its context of `length` tokens. */
static void attend_head(const model_weights *m, const layer_weights *layer, const float *query,
                        const int64_t *block_table, int64_t length, int64_t h, float *scores, float *out) {
    const int64_t dim = m->head_dim, kv_heads = m->kv_heads, per_kv = m->heads / m->kv_heads;
    const float scale = 1.0f / sqrtf((float)dim);
    const int64_t kv = h / per_kv;
    const float *q = query + h * dim;
    float best = -INFINITY;
    for (int64_t t = 0; t < length; t++) {
        const int64_t slot = block_table[t / m->block_size] * m->block_size + t % m->block_size;
        scores[t] = dot_f32(q, layer->key_cache + (slot * kv_heads + kv) * dim, dim) * scale;
        best = scores[t] > best ? scores[t] : best;
    }
    for (int64_t t = 0; t < length; t++) scores[t] -= best;
    exp_in_place(scores, length);
    float total = 0.0f;
    for (int64_t t = 0; t < length; t++) total += scores[t];
    float *o = out + h * dim;
    for (int64_t i = 0; i < dim; i++) o[i] = 0.0f;
    for (int64_t t = 0; t < length; t++) {
        const int64_t slot = block_table[t / m->block_size] * m->block_size + t % m->block_size;
        const float *v = layer->value_cache + (slot * kv_heads + kv) * dim;
        const __m256 p = _mm256_set1_ps(scores[t] / total);
        int64_t i = 0;
        for (; i + 8 <= dim; i += 8)
            _mm256_storeu_ps(o + i, _mm256_fmadd_ps(p, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
        for (; i < dim; i++) o[i] += scores[t] / total * v[i];
    }
}

/* Every (row, head) of a step's attention, claimed one at a time by the participants (each head's result
   is computed the same way whoever computes it); `scores` holds one context-long scratch per participant. */
typedef struct {
    const model_weights *m;
    const layer_weights *layer;
    int64_t rows, qkv_width, q_width, max_blocks, longest;
    const float *qkv;
    const int64_t *block_tables, *context_lens;
    float *scores, *out;
    atomic_long next;
} attention_job;

static void attention_share(const void *argument, int index, int count) {
    attention_job *job = (attention_job *)argument;
    (void)count;
    const int64_t heads = job->m->heads, total = job->rows * heads;
    float *scores = job->scores + index * job->longest;
    for (int64_t pair; (pair = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed)) < total;) {
        const int64_t r = pair / heads, h = pair % heads;
        attend_head(job->m, job->layer, job->qkv + r * job->qkv_width, job->block_tables + r * job->max_blocks,
                    job->context_lens[r], h, scores, job->out + r * job->q_width);
    }
}

static void silu_times_up(const float *gate_up, int64_t rows, int64_t width, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * width, *up = gate + width;
        float *o = out + r * width;
        int64_t i = 0;
        for (; i + 8 <= width; i += 8) {
            const __m256 g = _mm256_loadu_ps(gate + i);
            const __m256 sigmoid_denominator = _mm256_add_ps(
                _mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(g, sigmoid_denominator), _mm256_loadu_ps(up + i)));
        }
        for (; i < width; i++) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    }
}

static int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

/* x: (rows, hidden) embeddings in, overwritten; cos, signed_sin: (rows, head_dim); slots: (rows,) where
   each row's new K/V goes; block_tables: (rows, max_blocks); context_lens: (rows,) including the new token;
   logits: (rows, head.n); threads: how many share each matrix product (1: only the caller). Returns 0,
   or -1 when scratch memory could not be allocated. */
int kvgate_decode_step(const model_weights *m, int64_t rows, float *x, const float *cos,
                       const float *signed_sin, const int64_t *slots, const int64_t *block_tables,
                       int64_t max_blocks, const int64_t *context_lens, float *logits, int threads) {
    const int64_t hidden = m->hidden, dim = m->head_dim;
    const int64_t q_width = m->heads * dim, kv_width = m->kv_heads * dim;
    const int64_t qkv_width = q_width + 2 * kv_width;
    const int64_t widest = max_i64(max_i64(hidden, m->intermediate), q_width);
    int64_t longest = 1;
    for (int64_t r = 0; r < rows; r++) longest = max_i64(longest, context_lens[r]);

    float *normed = malloc(sizeof(float) * rows * hidden);
    float *wide = malloc(sizeof(float) * rows * max_i64(qkv_width, 2 * m->intermediate));
    float *narrow = malloc(sizeof(float) * rows * widest);
    float *projected = malloc(sizeof(float) * rows * hidden);
    float *scores = malloc(sizeof(float) * longest * (threads < 1 ? 1 : threads));
    quantized_rows quantized = {
        malloc(rows * widest), malloc(rows * widest), malloc(sizeof(int16_t) * rows * widest),
        malloc(sizeof(float) * rows * widest / GROUP), malloc(sizeof(float) * rows * widest / GROUP)};
    int status = 0;
    if (!normed || !wide || !narrow || !projected || !scores || !quantized.q || !quantized.r || !quantized.w ||
        !quantized.d || !quantized.dsum) {
        status = -1;
        goto done;
    }

    for (int64_t l = 0; l < m->num_layers; l++) {
        const layer_weights *layer = &m->layers[l];
        rms_norm(x, layer->attention_norm, rows, hidden, m->eps, normed);
        quantize_rows(normed, rows, hidden, quantized);
        matmul_q4(&layer->qkv, rows, quantized, wide, threads);
        for (int64_t r = 0; r < rows; r++) {
            float *qkv = wide + r * qkv_width;
            for (int64_t h = 0; h < m->heads + m->kv_heads; h++)  /* queries, then keys */
                rotate(qkv + h * dim, cos + r * dim, signed_sin + r * dim, dim);
            memcpy(layer->key_cache + slots[r] * kv_width, qkv + q_width, sizeof(float) * kv_width);
            memcpy(layer->value_cache + slots[r] * kv_width, qkv + q_width + kv_width, sizeof(float) * kv_width);
        }
        attention_job attention = {m,      layer,  rows,   qkv_width,    q_width, max_blocks, longest,
                                   wide,   block_tables, context_lens, scores, narrow, 0};
        run_parallel(attention_share, &attention, threads);
        quantize_rows(narrow, rows, q_width, quantized);
        matmul_q4(&layer->o, rows, quantized, projected, threads);
        for (int64_t i = 0; i < rows * hidden; i++) x[i] += projected[i];

        rms_norm(x, layer->feed_forward_norm, rows, hidden, m->eps, normed);
        quantize_rows(normed, rows, hidden, quantized);
        matmul_q4(&layer->gate_up, rows, quantized, wide, threads);
        silu_times_up(wide, rows, m->intermediate, narrow);
        quantize_rows(narrow, rows, m->intermediate, quantized);
        matmul_q4(&layer->down, rows, quantized, projected, threads);
        for (int64_t i = 0; i < rows * hidden; i++) x[i] += projected[i];
    }
    rms_norm(x, m->norm, rows, hidden, m->eps, normed);
    quantize_rows(normed, rows, hidden, quantized);
    matmul_q8(&m->head, rows, quantized, logits, threads);

done:
    free(normed);
    free(wide);
    free(narrow);
    free(projected);
    free(scores);
    free(quantized.q);
    free(quantized.r);
    free(quantized.w);
    free(quantized.d);
    free(quantized.dsum);
    return status;
}

/* Several greedy decode steps of one row in one call: the row's token is embedded from the head's own
   codes (a tied head is the embedding table: `Int8GroupLinear.embed`, the same products), decoded, and the
   next token is the first index of the largest logit (torch.argmax's choice), `steps` times or until a
   token of `stop_ids` comes. Step j reads cos / signed_sin row j and writes slot `slots[j]`, with
   `context_len + j` tokens of context. Writes the tokens to `tokens` and the last step's logits to
   `logits`; returns how many tokens it wrote, or -1 when scratch memory could not be had. The caller
   (engine.engine's burst) guarantees the slots exist: they lie in the block the row already holds. */
int64_t kvgate_decode_burst(const model_weights *m, int64_t steps, int64_t token, const float *cos,
                            const float *signed_sin, const int64_t *slots, const int64_t *block_table,
                            int64_t max_blocks, int64_t context_len, const int64_t *stop_ids, int64_t num_stop,
                            float *logits, int64_t *tokens, int threads) {
    const int64_t hidden = m->hidden, vocab = m->head.n, groups = hidden / GROUP;
    float *x = malloc(sizeof(float) * hidden);
    if (!x) return -1;
    int64_t produced = 0;
    for (int64_t j = 0; j < steps; j++) {
        const int8_t *codes = m->head.codes + token * hidden;
        const uint16_t *scales = m->head.scales + token * groups;
        for (int64_t i = 0; i < hidden; i++) x[i] = (float)codes[i] * bf16_to_float(scales[i / GROUP]);
        const int64_t context = context_len + j;
        if (kvgate_decode_step(m, 1, x, cos + j * m->head_dim, signed_sin + j * m->head_dim, slots + j, block_table,
                               max_blocks, &context, logits, threads) != 0) {
            free(x);
            return -1;
        }
        int64_t best = 0;
        for (int64_t v = 1; v < vocab; v++)
            if (logits[v] > logits[best]) best = v;
        tokens[produced++] = token = best;
        int stop = 0;
        for (int64_t s = 0; s < num_stop; s++) stop |= stop_ids[s] == best;
        if (stop) break;
    }
    free(x);
    return produced;
}
