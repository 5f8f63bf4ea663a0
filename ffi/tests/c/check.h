/* What the C consumers share: fatal CHECK of a call, counted EXPECT
 * failures (thread-safe when FTN_CHECK_THREADS is defined before including
 * this), the seeded xorshift64* generator (one thread), bf16 conversion,
 * relative-error comparison, last-error checks and the f64 GeLU references.
 * Every failure message carries the seed. */
#ifndef FTN_TESTS_CHECK_H
#define FTN_TESTS_CHECK_H

#include "ferrotron.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FTN_CHECK_THREADS
#include <pthread.h>
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
#define FTN_LOCK() pthread_mutex_lock(&g_lock)
#define FTN_UNLOCK() pthread_mutex_unlock(&g_lock)
#else
#define FTN_LOCK() ((void)0)
#define FTN_UNLOCK() ((void)0)
#endif

static unsigned long long g_seed;
static int g_failures;

#define CHECK(call)                                                                      \
  do {                                                                                   \
    ftnResult_t r_ = (call);                                                             \
    if (r_ != ftnSuccess) {                                                              \
      fprintf(stderr, "%s:%d: %s -> %d (%s): %s [seed %llu]\n", __FILE__, __LINE__,      \
              #call, (int)r_, ftn_get_error_string(r_), ftn_get_last_error(), g_seed);   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define EXPECT(cond, ...)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      FTN_LOCK();                                                                  \
      fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                                \
      fprintf(stderr, " [seed %llu]\n", g_seed);                                   \
      g_failures++;                                                                \
      FTN_UNLOCK();                                                                \
    }                                                                              \
  } while (0)

/* xorshift64* (one thread: make every input before starting rank threads) */
static unsigned long long g_state;
static inline double urand(void) {
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return (double)((g_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}
static inline float frand(void) { return (float)(urand() * 4.0 - 2.0); }

/* bf16: the top 16 bits of an fp32, rounded to nearest even */
static inline uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Worst |got - want| / max(1, |want|) over n elements must be <= tol. */
static inline void close_all(const char *what, const float *got, const double *want, size_t n, double tol) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
    if (!(err <= worst)) { /* NaN counts as worst */
      worst = isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  EXPECT(worst <= tol, "%s: rel error %.3g at %zu (got %.9g, want %.9g)", what, worst, at,
         n ? (double)got[at] : 0.0, n ? want[at] : 0.0);
}

/* The status must be `want` and the last error must mention every given word. */
static inline void expect_error(ftnResult_t r, ftnResult_t want, const char *line, const char *w1,
                                const char *w2) {
  const char *msg = ftn_get_last_error();
  EXPECT(r == want, "%s: status %d (%s), want %d; last error: %s", line, (int)r, ftn_get_error_string(r),
         (int)want, msg);
  if (w1) EXPECT(strstr(msg, w1) != NULL, "%s: last error \"%s\" names \"%s\"", line, msg, w1);
  if (w2) EXPECT(strstr(msg, w2) != NULL, "%s: last error \"%s\" names \"%s\"", line, msg, w2);
}

/* ---- f64 references ---- */
static const double K0 = 0.7978845608028654, K1 = 0.044715;
static inline double gelu(int erf_kind, double x) {
  return erf_kind ? 0.5 * x * (1.0 + erf(x / sqrt(2.0))) : 0.5 * x * (1.0 + tanh(K0 * (x + K1 * x * x * x)));
}
static inline double gelu_grad(int erf_kind, double x) {
  if (erf_kind) return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * 3.14159265358979323846);
  double t = tanh(K0 * (x + K1 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K0 * (1.0 + 3.0 * K1 * x * x);
}

#endif /* FTN_TESTS_CHECK_H */
