/* A C99 program that uses only include/ferrotron.h and libferrotron: runs
 * every exposed op on the emulator and checks it against its own reference,
 * then feeds bad input through the ABI and checks the statuses and messages.
 * Usage: consumer SEED. Exit 0 on success. */
#define _POSIX_C_SOURCE 200809L /* setenv under -std=c99 */
#include "check.h"

static float *rand_vec(size_t n) {
  float *v = (float *)malloc(n * sizeof(float) + 1);
  for (size_t i = 0; i < n; i++) v[i] = frand();
  return v;
}
static float *nan_vec(size_t n) {
  float *v = (float *)malloc(n * sizeof(float) + 1);
  memset(v, 0xFF, n * sizeof(float)); /* poisoned: NaN until written */
  return v;
}

static void test_bias_gelu(ftnStream_t s, int erf_kind) {
  const int64_t rows = 7, cols = 37;
  size_t n = (size_t)(rows * cols);
  float *x = rand_vec(n), *b = rand_vec((size_t)cols), *dy = rand_vec(n);
  float *out = nan_vec(n), *dx = nan_vec(n), *db = nan_vec((size_t)cols);
  ftnBiasGeluDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.dtype = ftnFloat32;
  d.gelu = erf_kind ? ftnGeluErf : ftnGeluTanh;
  d.rows = rows;
  d.cols = cols;
  CHECK(ftn_bias_gelu_forward(s, &d, x, b, out));
  CHECK(ftn_bias_gelu_backward(s, &d, dy, x, b, dx, db));
  CHECK(ftn_stream_synchronize(s));
  double *wy = malloc(n * sizeof(double)), *wdx = malloc(n * sizeof(double)), *wdb = calloc((size_t)cols, sizeof(double));
  for (size_t i = 0; i < n; i++) {
    double v = (double)x[i] + b[i % (size_t)cols];
    wy[i] = gelu(erf_kind, v);
    wdx[i] = dy[i] * gelu_grad(erf_kind, v);
    wdb[i % (size_t)cols] += (float)wdx[i];
  }
  close_all(erf_kind ? "bias_gelu fwd erf" : "bias_gelu fwd tanh", out, wy, n, 1e-5);
  close_all("bias_gelu bwd dx", dx, wdx, n, 1e-5);
  close_all("bias_gelu bwd dbias", db, wdb, (size_t)cols, 1e-4);
  /* in place (out == x), no bias */
  for (size_t i = 0; i < n; i++) wy[i] = gelu(erf_kind, (double)x[i]);
  CHECK(ftn_bias_gelu_forward(s, &d, x, NULL, x));
  CHECK(ftn_stream_synchronize(s));
  close_all("bias_gelu fwd in place, no bias", x, wy, n, 1e-5);
  free(x); free(b); free(dy); free(out); free(dx); free(db); free(wy); free(wdx); free(wdb);
}

static void test_norms(ftnStream_t s, int rms) {
  const int64_t rows = 5, hidden = 19;
  size_t n = (size_t)(rows * hidden), h = (size_t)hidden, R = (size_t)rows;
  float *x = rand_vec(n), *g = rand_vec(h), *be = rand_vec(h), *dy = rand_vec(n);
  float *y = nan_vec(n), *mean = nan_vec(R), *rstd = nan_vec(R), *dx = nan_vec(n), *dg = nan_vec(h), *db = nan_vec(h);
  ftnNormDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.dtype = ftnFloat32;
  d.rows = rows;
  d.hidden = hidden;
  d.eps = 1e-5f;
  if (rms) {
    CHECK(ftn_rms_norm_forward(s, &d, x, g, y, rstd));
    CHECK(ftn_rms_norm_backward(s, &d, dy, x, rstd, g, dx, dg));
  } else {
    CHECK(ftn_layer_norm_forward(s, &d, x, g, be, y, mean, rstd));
    CHECK(ftn_layer_norm_backward(s, &d, dy, x, mean, rstd, g, dx, dg, db));
  }
  CHECK(ftn_stream_synchronize(s));
  double *wy = malloc(n * sizeof(double)), *wdx = malloc(n * sizeof(double));
  double *wdg = calloc(h, sizeof(double)), *wdb = calloc(h, sizeof(double));
  double *wmean = malloc(R * sizeof(double)), *wrstd = malloc(R * sizeof(double));
  for (size_t r = 0; r < R; r++) {
    const float *xr = x + r * h;
    double mu = 0, var = 0;
    if (!rms) {
      for (size_t c = 0; c < h; c++) mu += xr[c];
      mu /= (double)h;
    }
    for (size_t c = 0; c < h; c++) var += (xr[c] - mu) * (xr[c] - mu);
    var /= (double)h;
    double rs = 1.0 / sqrt(var + 1e-5);
    wmean[r] = mu;
    wrstd[r] = rs;
    double m1 = 0, m2 = 0;
    for (size_t c = 0; c < h; c++) {
      double xhat = (xr[c] - mu) * rs;
      wy[r * h + c] = xhat * g[c] + (rms ? 0.0 : be[c]);
      double dxhat = dy[r * h + c] * (double)g[c];
      m1 += dxhat;
      m2 += dxhat * xhat;
      wdg[c] += dy[r * h + c] * xhat;
      wdb[c] += dy[r * h + c];
    }
    m1 /= (double)h;
    m2 /= (double)h;
    for (size_t c = 0; c < h; c++) {
      double xhat = (xr[c] - mu) * rs;
      double dxhat = dy[r * h + c] * (double)g[c];
      wdx[r * h + c] = rs * (dxhat - (rms ? 0.0 : m1) - xhat * m2);
    }
  }
  close_all(rms ? "rms_norm y" : "layer_norm y", y, wy, n, 1e-5);
  close_all(rms ? "rms_norm rstd" : "layer_norm rstd", rstd, wrstd, R, 1e-5);
  if (!rms) close_all("layer_norm mean", mean, wmean, R, 1e-5);
  close_all(rms ? "rms_norm dx" : "layer_norm dx", dx, wdx, n, 1e-4);
  close_all(rms ? "rms_norm dgamma" : "layer_norm dgamma", dg, wdg, h, 1e-4);
  if (!rms) close_all("layer_norm dbeta", db, wdb, h, 1e-4);
  free(x); free(g); free(be); free(dy); free(y); free(mean); free(rstd); free(dx); free(dg); free(db);
  free(wy); free(wdx); free(wdg); free(wdb); free(wmean); free(wrstd);
}

/* mask: 0 none, 1 padding (per batch; row 1 of batch 0 fully masked), 2 causal */
static void test_softmax(ftnStream_t s, int mask) {
  const int64_t B = 2, H = 3, SQ = 5, SK = mask == 2 ? 5 : 37;
  size_t n = (size_t)(B * H * SQ * SK), rows = (size_t)(B * H * SQ), sk = (size_t)SK;
  float *x = rand_vec(n), *y = nan_vec(n), *dy = rand_vec(n), *dx = nan_vec(n);
  unsigned char *m = malloc((size_t)(B * SQ * SK));
  for (size_t i = 0; i < (size_t)(B * SQ * SK); i++) m[i] = urand() < 0.3;
  for (size_t c = 0; c < sk; c++) m[1 * sk + c] = 1; /* batch 0, row 1: all masked */
  ftnSoftmaxDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.dtype = ftnFloat32;
  d.mask = mask == 0 ? ftnSoftmaxMaskNone : mask == 1 ? ftnSoftmaxMaskPadding : ftnSoftmaxMaskCausal;
  d.batch = B;
  d.heads = H;
  d.sq = SQ;
  d.sk = SK;
  d.scale = 0.37f;
  CHECK(ftn_softmax_forward(s, &d, x, mask == 1 ? m : NULL, y));
  CHECK(ftn_stream_synchronize(s));
  CHECK(ftn_softmax_backward(s, &d, y, dy, dx));
  CHECK(ftn_stream_synchronize(s));
  double *wy = malloc(n * sizeof(double)), *wdx = malloc(n * sizeof(double));
  for (size_t r = 0; r < rows; r++) {
    size_t b = r / (size_t)(H * SQ), i = r % (size_t)SQ;
    double mx = -INFINITY, sum = 0, dot = 0;
    int all_masked = 1;
    for (size_t c = 0; c < sk; c++) {
      double v = (double)(0.37f * x[r * sk + c]);
      int masked = mask == 1 && m[(b * (size_t)SQ + i) * sk + c];
      if (masked) v = -10000.0; else all_masked = 0;
      if (mask == 2 && c > i) v = -INFINITY;
      wy[r * sk + c] = v;
      if (v > mx) mx = v;
    }
    for (size_t c = 0; c < sk; c++) sum += (wy[r * sk + c] = exp(wy[r * sk + c] - mx));
    for (size_t c = 0; c < sk; c++) {
      wy[r * sk + c] = (mask == 1 && all_masked) ? 0.0 : wy[r * sk + c] / sum;
      dot += dy[r * sk + c] * (double)y[r * sk + c];
    }
    for (size_t c = 0; c < sk; c++)
      wdx[r * sk + c] = 0.37 * (dy[r * sk + c] * (double)y[r * sk + c] - (double)y[r * sk + c] * dot);
  }
  const char *names[3] = {"softmax fwd", "softmax fwd padding", "softmax fwd causal"};
  close_all(names[mask], y, wy, n, 1e-5);
  close_all("softmax bwd", dx, wdx, n, 1e-5);
  free(x); free(y); free(dy); free(dx); free(m); free(wy); free(wdx);
}

static uint16_t *rand_bf16(size_t n) {
  uint16_t *v = malloc(n * 2 + 2);
  for (size_t i = 0; i < n; i++) v[i] = to_bf16(frand());
  return v;
}

/* D = gelu(A B^T + bias) (aux = pre-activation), then D2 = A2^T B2 * gelu'(aux); bf16 in, fp32 out, batch 2 */
static void test_gemm(ftnStream_t s) {
  const int64_t M = 19, N = 23, K = 40, BATCH = 2;
  size_t mk = (size_t)(M * K), nk = (size_t)(N * K), mn = (size_t)(M * N);
  uint16_t *a = rand_bf16(BATCH * mk), *b = rand_bf16(BATCH * nk), *bias = rand_bf16((size_t)N);
  float *d = nan_vec(BATCH * mn), *aux = nan_vec(BATCH * mn), *d2 = nan_vec(BATCH * mn);
  ftnGemmDesc_t g;
  memset(&g, 0, sizeof g);
  g.size = sizeof g;
  g.dtype = ftnBfloat16;
  g.out_dtype = ftnFloat32;
  g.trans_b = 1;
  g.epilogue = ftnGemmEpilogueBiasGelu;
  g.gelu = ftnGeluTanh;
  g.m = M;
  g.n = N;
  g.k = K;
  g.batch = BATCH;
  g.alpha = 1.0f;
  CHECK(ftn_gemm(s, &g, a, b, bias, NULL, aux, d));
  /* second: A2 stored [K, M] (trans_a) = a reinterpreted, B2 [K, N] = b reinterpreted, DGelu with aux */
  ftnGemmDesc_t g2 = g;
  g2.trans_a = 1;
  g2.trans_b = 0;
  g2.epilogue = ftnGemmEpilogueDGelu;
  g2.alpha = 0.5f;
  CHECK(ftn_gemm(s, &g2, a, b, NULL, NULL, aux, d2));
  CHECK(ftn_stream_synchronize(s));
  double *wd = malloc(BATCH * mn * sizeof(double)), *wx = malloc(BATCH * mn * sizeof(double));
  double *wd2 = malloc(BATCH * mn * sizeof(double));
  for (int64_t bt = 0; bt < BATCH; bt++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double acc = 0, acc2 = 0;
        for (int64_t q = 0; q < K; q++) {
          acc += (double)from_bf16(a[bt * mk + i * K + q]) * from_bf16(b[bt * nk + j * K + q]);
          acc2 += (double)from_bf16(a[bt * mk + q * M + i]) * from_bf16(b[bt * nk + q * N + j]);
        }
        size_t o = (size_t)(bt * (int64_t)mn + i * N + j);
        wx[o] = acc + from_bf16(bias[j]);
        wd[o] = gelu(0, wx[o]);
        wd2[o] = 0.5 * acc2 * gelu_grad(0, (double)aux[o]);
      }
  close_all("gemm bias+gelu aux", aux, wx, BATCH * mn, 1e-5);
  close_all("gemm bias+gelu d", d, wd, BATCH * mn, 1e-5);
  close_all("gemm dgelu (trans_a)", d2, wd2, BATCH * mn, 1e-5);
  /* bias gradient of a bf16 [13, 21] matrix with ld 24 */
  uint16_t *dy = rand_bf16(13 * 24), *db = malloc(21 * 2);
  ftnBiasGradDesc_t bd;
  memset(&bd, 0, sizeof bd);
  bd.size = sizeof bd;
  bd.dtype = ftnBfloat16;
  bd.rows = 13;
  bd.cols = 21;
  bd.ld = 24;
  CHECK(ftn_gemm_bias_grad(s, &bd, dy, db));
  CHECK(ftn_stream_synchronize(s));
  float got[21];
  double want[21];
  for (int c = 0; c < 21; c++) {
    want[c] = 0;
    for (int r = 0; r < 13; r++) want[c] += from_bf16(dy[r * 24 + c]);
    got[c] = from_bf16(db[c]);
  }
  close_all("gemm bias_grad bf16", got, want, 21, 1e-2);
  /* bad input: fp32 inputs, ld below the row length, an overflowing layout */
  g.dtype = ftnFloat32;
  expect_error(ftn_gemm(s, &g, a, b, bias, NULL, aux, d), ftnInvalidArgument, "gemm fp32 in", "desc.dtype", NULL);
  g.dtype = ftnBfloat16;
  g.lda = 3;
  expect_error(ftn_gemm(s, &g, a, b, bias, NULL, aux, d), ftnInvalidArgument, "gemm lda", "lda", NULL);
  g.lda = 0;
  g.batch = INT64_MAX / 2;
  expect_error(ftn_gemm(s, &g, a, b, bias, NULL, aux, d), ftnInvalidArgument, "gemm overflow", "`desc`", "overflow");
  g.batch = BATCH;
  g.epilogue = ftnGemmEpilogueDGelu;
  expect_error(ftn_gemm(s, &g, a, b, NULL, NULL, NULL, d), ftnInvalidArgument, "dgelu without aux", "aux", NULL);
  free(a); free(b); free(bias); free(d); free(aux); free(d2); free(wd); free(wx); free(wd2); free(dy); free(db);
}

/* The header's NULL rules of ftn_gemm, every combination: `bias` required
 * by Bias, optional for BiasGelu, NULL otherwise; `c` NULL when beta == 0
 * (with beta != 0 NULL means C is D); `aux` required by DGelu, optional for
 * BiasGelu, NULL otherwise. A call succeeds exactly when all three hold;
 * a refused one names the pointer at fault. Then zero sizes (no-ops),
 * misaligned data pointers and a non-finite beta. */
static void test_gemm_null_rules(ftnStream_t s) {
  enum { D = 8 };
  uint16_t *a = rand_bf16(D * D), *b = rand_bf16(D * D), *bias = rand_bf16(D), *c = rand_bf16(D * D);
  uint16_t *aux = rand_bf16(D * D), *d = rand_bf16(D * D);
  const int epis[4] = {ftnGemmEpilogueNone, ftnGemmEpilogueBias, ftnGemmEpilogueBiasGelu, ftnGemmEpilogueDGelu};
  int tried = 0;
  for (int e = 0; e < 4; e++)
    for (int beta = 0; beta < 2; beta++)
      for (int mask = 0; mask < 8; mask++) {
        int has_bias = mask & 1, has_c = (mask >> 1) & 1, has_aux = (mask >> 2) & 1;
        ftnGemmDesc_t g;
        memset(&g, 0, sizeof g);
        g.size = sizeof g;
        g.dtype = ftnBfloat16;
        g.out_dtype = ftnBfloat16;
        g.epilogue = epis[e];
        g.gelu = ftnGeluTanh;
        g.m = g.n = g.k = D;
        g.batch = 1;
        g.alpha = 1.0f;
        g.beta = (float)beta;
        int bias_ok = epis[e] == ftnGemmEpilogueBias ? has_bias : epis[e] == ftnGemmEpilogueBiasGelu ? 1 : !has_bias;
        int c_ok = beta ? 1 : !has_c;
        int aux_ok = epis[e] == ftnGemmEpilogueDGelu ? has_aux : epis[e] == ftnGemmEpilogueBiasGelu ? 1 : !has_aux;
        ftnResult_t r = ftn_gemm(s, &g, a, b, has_bias ? bias : NULL, has_c ? c : NULL, has_aux ? aux : NULL, d);
        const char *msg = ftn_get_last_error();
        tried++;
        if (bias_ok && c_ok && aux_ok) {
          EXPECT(r == ftnSuccess, "gemm epilogue %d beta %d bias %d c %d aux %d: refused: %s", epis[e], beta, has_bias,
                 has_c, has_aux, msg);
        } else {
          /* several may be wrong at once: the error names one of them */
          int named = (!bias_ok && strstr(msg, "`bias`")) || (!c_ok && strstr(msg, "`c`")) ||
                      (!aux_ok && strstr(msg, "`aux`"));
          EXPECT(r == ftnInvalidArgument && named,
                 "gemm epilogue %d beta %d bias %d c %d aux %d: status %d, want ftnInvalidArgument naming a pointer "
                 "at fault: %s",
                 epis[e], beta, has_bias, has_c, has_aux, (int)r, msg);
        }
      }
  EXPECT(tried == 64, "gemm NULL rules: %d combinations", tried);
  CHECK(ftn_stream_synchronize(s));
  ftnGemmDesc_t g;
  memset(&g, 0, sizeof g);
  g.size = sizeof g;
  g.dtype = ftnBfloat16;
  g.out_dtype = ftnBfloat16;
  g.m = g.n = g.k = D;
  g.batch = 1;
  g.alpha = 1.0f;
  /* zero sizes: no-ops after the checks, NULL operands that span nothing */
  g.m = 0;
  CHECK(ftn_gemm(s, &g, NULL, b, NULL, NULL, NULL, NULL));
  g.m = D;
  g.batch = 0;
  CHECK(ftn_gemm(s, &g, NULL, NULL, NULL, NULL, NULL, NULL));
  g.batch = 1;
  /* misaligned data pointers are refused on every backend */
  expect_error(ftn_gemm(s, &g, (const char *)a + 1, b, NULL, NULL, NULL, d), ftnInvalidArgument, "gemm misaligned a",
               "`a`", "aligned");
  expect_error(ftn_gemm(s, &g, a, b, NULL, NULL, NULL, (char *)d + 1), ftnInvalidArgument, "gemm misaligned d",
               "`d`", "aligned");
  g.beta = NAN;
  expect_error(ftn_gemm(s, &g, a, b, NULL, c, NULL, d), ftnInvalidArgument, "gemm NaN beta", "beta", NULL);
  CHECK(ftn_stream_synchronize(s));
  free(a); free(b); free(bias); free(c); free(aux); free(d);
}

static void test_multi_tensor(ftnStream_t s) {
  size_t sizes[3] = {1, 1000, 70001};
  float *t[3], *orig[3];
  ftnTensor_t list[3];
  for (int i = 0; i < 3; i++) {
    t[i] = rand_vec(sizes[i]);
    orig[i] = malloc(sizes[i] * sizeof(float));
    memcpy(orig[i], t[i], sizes[i] * sizeof(float));
    list[i].data = t[i];
    list[i].numel = (int64_t)sizes[i];
    list[i].dtype = ftnFloat32;
    list[i].reserved = 0;
  }
  float found_inf = 0.0f, norm = NAN;
  ftnMultiTensorDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.num_tensors = 3;
  d.scale = 1024.0f;
  d.max_norm = 1.0;
  CHECK(ftn_multi_tensor_unscale(s, &d, list, NULL, &found_inf));
  CHECK(ftn_multi_tensor_l2_norm(s, &d, list, &norm));
  CHECK(ftn_stream_synchronize(s));
  float inv = (float)(1.0 / 1024.0);
  double sq = 0;
  for (int i = 0; i < 3; i++) {
    double *w = malloc(sizes[i] * sizeof(double));
    for (size_t j = 0; j < sizes[i]; j++) {
      w[j] = (double)(orig[i][j] * inv);
      sq += w[j] * w[j];
    }
    close_all("multi_tensor unscale", t[i], w, sizes[i], 0);
    free(w);
  }
  EXPECT(found_inf == 0.0f, "found_inf %g with finite grads", found_inf);
  double wnorm = sqrt(sq);
  close_all("multi_tensor l2_norm", &norm, &wnorm, 1, 1e-5);
  /* clip_grad_norm with max_norm below the norm scales by max/(norm+1e-6) */
  d.max_norm = wnorm / 4.0;
  for (int i = 0; i < 3; i++) memcpy(orig[i], t[i], sizes[i] * sizeof(float));
  float norm2 = NAN;
  CHECK(ftn_multi_tensor_clip_grad_norm(s, &d, list, &norm2));
  CHECK(ftn_stream_synchronize(s));
  close_all("multi_tensor clip_grad_norm norm", &norm2, &wnorm, 1, 1e-5);
  double coeff = d.max_norm / ((double)norm2 + 1e-6);
  for (int i = 0; i < 3; i++) {
    double *w = malloc(sizes[i] * sizeof(double));
    for (size_t j = 0; j < sizes[i]; j++) w[j] = orig[i][j] * coeff;
    close_all("multi_tensor clip", t[i], w, sizes[i], 1e-6);
    free(w);
  }
  /* clip_by_norm with a norm below max_norm leaves the tensors alone */
  for (int i = 0; i < 3; i++) memcpy(orig[i], t[i], sizes[i] * sizeof(float));
  float small = 0.5f;
  d.max_norm = 10.0;
  CHECK(ftn_multi_tensor_clip_by_norm(s, &d, list, &small));
  CHECK(ftn_stream_synchronize(s));
  for (int i = 0; i < 3; i++) {
    double *w = malloc(sizes[i] * sizeof(double));
    for (size_t j = 0; j < sizes[i]; j++) w[j] = orig[i][j];
    close_all("multi_tensor clip (no-op)", t[i], w, sizes[i], 0);
    free(w);
  }
  /* an inf sets found_inf */
  t[1][17] = INFINITY;
  CHECK(ftn_multi_tensor_unscale(s, &d, list, NULL, &found_inf));
  CHECK(ftn_stream_synchronize(s));
  EXPECT(found_inf == 1.0f, "found_inf %g after an inf", found_inf);
  for (int i = 0; i < 3; i++) { free(t[i]); free(orig[i]); }
}

/* Megatron's DynamicGradScaler.update, the C reference. */
typedef struct { float scale; int growth, hyst; } RefScaler;
static void ref_update(const ftnGradScalerConfig_t *c, RefScaler *s, int found_inf) {
  if (found_inf) {
    s->growth = 0;
    s->hyst -= 1;
    if (s->hyst <= 0) s->scale = fmaxf(s->scale * c->backoff_factor, c->min_scale);
  } else {
    s->growth += 1;
    if (s->growth == (int)c->growth_interval) {
      s->growth = 0;
      s->hyst = (int)c->hysteresis;
      s->scale *= c->growth_factor;
    }
  }
}

static void test_scaler(ftnContext_t ctx, ftnStream_t s) {
  ftnGradScalerConfig_t c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  CHECK(ftn_grad_scaler_config_default(&c));
  EXPECT(c.initial_scale == 4294967296.0f && c.growth_interval == 1000 && c.hysteresis == 2,
         "Megatron defaults (got %g %u %u)", c.initial_scale, c.growth_interval, c.hysteresis);
  c.initial_scale = 65536.0f;
  c.growth_interval = 3;
  c.hysteresis = 2;
  ftnGradScalerState_t host, dev;
  memset(&host, 0, sizeof host);
  host.size = sizeof host;
  memset(&dev, 0, sizeof dev);
  dev.size = sizeof dev;
  CHECK(ftn_grad_scaler_host_init(&c, &host));
  RefScaler ref = {65536.0f, 0, 2};
  ftnGradScaler_t sc;
  CHECK(ftn_grad_scaler_create(ctx, &c, NULL, &sc));
  float *found_inf = NULL;
  CHECK(ftn_malloc(ctx, (void **)&found_inf, sizeof(float)));
  for (int step = 0; step < 40; step++) {
    int inf = urand() < 0.3;
    float v = inf ? 1.0f : 0.0f;
    CHECK(ftn_memcpy_htod(s, found_inf, &v, sizeof v));
    CHECK(ftn_grad_scaler_update(sc, s, found_inf, 1));
    CHECK(ftn_grad_scaler_host_update(&c, &host, inf));
    ref_update(&c, &ref, inf);
    CHECK(ftn_grad_scaler_get_state(sc, &dev));
    float after = -1.0f;
    CHECK(ftn_memcpy_dtoh(s, &after, found_inf, sizeof after));
    EXPECT(after == 0.0f, "found_inf reset by the update (got %g)", after);
    EXPECT(host.scale == ref.scale && host.growth_tracker == ref.growth && host.hysteresis_tracker == ref.hyst,
           "host scaler step %d: (%g %d %d) vs ref (%g %d %d)", step, host.scale, host.growth_tracker,
           host.hysteresis_tracker, ref.scale, ref.growth, ref.hyst);
    EXPECT(dev.scale == ref.scale && dev.growth_tracker == ref.growth && dev.hysteresis_tracker == ref.hyst,
           "device scaler step %d: (%g %d %d) vs ref (%g %d %d)", step, dev.scale, dev.growth_tracker,
           dev.hysteresis_tracker, ref.scale, ref.growth, ref.hyst);
  }
  /* unscale with the device scaler uses its current scale */
  float g[5] = {1, 2, 3, 4, 5};
  ftnTensor_t t = {g, 5, ftnFloat32, 0};
  ftnMultiTensorDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.num_tensors = 1;
  CHECK(ftn_multi_tensor_unscale(s, &d, &t, sc, found_inf));
  CHECK(ftn_stream_synchronize(s));
  float inv = (float)(1.0 / (double)ref.scale);
  for (int i = 0; i < 5; i++) EXPECT(g[i] == (float)(i + 1) * inv, "unscale by the scaler: %g", g[i]);
  CHECK(ftn_free(ctx, found_inf));
  CHECK(ftn_grad_scaler_destroy(sc));
}

static void test_memory_and_events(ftnContext_t ctx, ftnStream_t s) {
  int backend = -1;
  CHECK(ftn_context_get_backend(ctx, &backend));
  EXPECT(backend == ftnBackendEmu, "backend %d", backend);
  char name[64];
  CHECK(ftn_context_get_name(ctx, name, sizeof name));
  EXPECT(strlen(name) > 0, "a device name");
  unsigned char *a = NULL, *b = NULL;
  CHECK(ftn_malloc(ctx, (void **)&a, 1000));
  CHECK(ftn_malloc(ctx, (void **)&b, 1000));
  unsigned char host[1000], back[1000];
  for (int i = 0; i < 1000; i++) host[i] = (unsigned char)(urand() * 256);
  ftnStream_t s2;
  ftnEvent_t ev, e0, e1;
  CHECK(ftn_stream_create(ctx, &s2));
  CHECK(ftn_event_create(ctx, &ev));
  CHECK(ftn_event_create(ctx, &e0));
  CHECK(ftn_event_create(ctx, &e1));
  CHECK(ftn_event_record(e0, s));
  CHECK(ftn_memcpy_htod(s, a, host, 1000));
  CHECK(ftn_memset(s, b, 0x5A, 1000));
  CHECK(ftn_event_record(ev, s));
  CHECK(ftn_stream_wait_event(s2, ev));
  CHECK(ftn_memcpy_dtod(s2, b, a, 500));
  CHECK(ftn_event_record(e1, s2));
  CHECK(ftn_event_synchronize(e1));
  int done = 0;
  CHECK(ftn_event_query(e1, &done));
  EXPECT(done == 1, "event complete after synchronize");
  float ms = -1;
  CHECK(ftn_event_elapsed_ms(e0, e1, &ms));
  EXPECT(ms >= 0, "elapsed %g ms", ms);
  CHECK(ftn_memcpy_dtoh(s2, back, b, 1000));
  int ok = memcmp(back, host, 500) == 0;
  for (int i = 500; i < 1000; i++) ok = ok && back[i] == 0x5A;
  EXPECT(ok, "memcpy/memset/event ordering");
  CHECK(ftn_event_destroy(ev));
  CHECK(ftn_event_destroy(e0));
  CHECK(ftn_event_destroy(e1));
  /* a stream-ordered free after s2's work; a second free of it is refused */
  CHECK(ftn_free_async(ctx, a, s2));
  expect_error(ftn_free(ctx, a), ftnInvalidArgument, "free after free_async", "ftn_malloc", NULL);
  CHECK(ftn_free_async(ctx, NULL, s2));
  CHECK(ftn_stream_destroy(s2));
  CHECK(ftn_free(ctx, b));
}

static void test_collectives(void) {
  enum { N = 3, C = 10 };
  ftnContext_t ctx[N];
  ftnStream_t st[N];
  ftnComm_t comm[N];
  /* N emulator contexts driven at once: the hardware threads shared among them */
  int workers = 0;
  CHECK(ftn_emu_workers_per_rank(N, &workers));
  EXPECT(workers >= 1 && workers <= 1024, "workers per rank %d", workers);
  for (int r = 0; r < N; r++) CHECK(ftn_context_create_emu(workers, &ctx[r]));
  for (int r = 0; r < N; r++) {
    char name[64];
    char want[64];
    CHECK(ftn_context_get_name(ctx[r], name, sizeof name));
    snprintf(want, sizeof want, "(%d worker thread%s)", workers, workers == 1 ? "" : "s");
    EXPECT(strstr(name, want) != NULL, "context %d is '%s', want '%s'", r, name, want);
  }
  for (int r = 0; r < N; r++) CHECK(ftn_stream_create(ctx[r], &st[r]));
  CHECK(ftn_comm_init_all(comm, N, ctx));
  for (int r = 0; r < N; r++) {
    int count = 0, rank = -1;
    CHECK(ftn_comm_count(comm[r], &count));
    CHECK(ftn_comm_user_rank(comm[r], &rank));
    EXPECT(count == N && rank == r, "rank %d of %d", rank, count);
  }
  float send[N][N * C], recv[N][N * C], gath[N][N * C], rs[N][C], bc[N][C];
  int32_t isend[N][C], irecv[N][C];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < N * C; i++) send[r][i] = (float)(int)(frand() * 8); /* integers: exact sums */
  for (int r = 0; r < N; r++)
    for (int i = 0; i < C; i++) {
      isend[r][i] = (int32_t)(urand() * 1000);
      bc[r][i] = (float)r;
    }
  for (int r = 0; r < N; r++) {
    CHECK(ftn_all_reduce(send[r], recv[r], N * C, ftnFloat32, ftnSum, comm[r], st[r]));
    CHECK(ftn_all_reduce(isend[r], irecv[r], C, ftnInt32, ftnMax, comm[r], st[r]));
    CHECK(ftn_all_gather(send[r], gath[r], C, ftnFloat32, comm[r], st[r]));
    CHECK(ftn_reduce_scatter(send[r], rs[r], C, ftnFloat32, ftnSum, comm[r], st[r]));
    CHECK(ftn_broadcast(bc[r], C, ftnFloat32, 1, comm[r], st[r]));
    CHECK(ftn_barrier(comm[r], st[r]));
  }
  for (int r = 0; r < N; r++) CHECK(ftn_stream_synchronize(st[r]));
  for (int r = 0; r < N; r++) {
    double want[N * C];
    for (int i = 0; i < N * C; i++) {
      want[i] = 0;
      for (int q = 0; q < N; q++) want[i] += send[q][i];
    }
    close_all("all_reduce sum", recv[r], want, N * C, 0);
    close_all("reduce_scatter sum", rs[r], want + r * C, C, 0);
    for (int q = 0; q < N; q++)
      for (int i = 0; i < C; i++) want[q * C + i] = send[q][i];
    close_all("all_gather", gath[r], want, N * C, 0);
    for (int i = 0; i < C; i++) {
      int32_t m = isend[0][i];
      for (int q = 1; q < N; q++) m = isend[q][i] > m ? isend[q][i] : m;
      EXPECT(irecv[r][i] == m, "all_reduce max int32 rank %d [%d]: %d vs %d", r, i, irecv[r][i], m);
      EXPECT(bc[r][i] == 1.0f, "broadcast from rank 1: %g", bc[r][i]);
    }
  }
  /* send/recv: rank 0 -> rank 2 */
  float p2p[C], got[C];
  for (int i = 0; i < C; i++) { p2p[i] = frand(); got[i] = NAN; }
  CHECK(ftn_send(p2p, C, ftnFloat32, 2, comm[0], st[0]));
  CHECK(ftn_recv(got, C, ftnFloat32, 0, comm[2], st[2]));
  CHECK(ftn_stream_synchronize(st[0]));
  CHECK(ftn_stream_synchronize(st[2]));
  EXPECT(memcmp(p2p, got, sizeof got) == 0, "send/recv delivers the data");
  /* a ring exchange in one group per rank */
  float ring_out[N][C], ring_in[N][C];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < C; i++) { ring_out[r][i] = frand(); ring_in[r][i] = NAN; }
  for (int r = 0; r < N; r++) {
    ftnP2pOp_t ops[2] = {{ring_out[r], C, (r + 1) % N, 0}, {ring_in[r], C, (r + N - 1) % N, 1}};
    CHECK(ftn_group_p2p(ops, 2, ftnFloat32, comm[r], st[r]));
  }
  for (int r = 0; r < N; r++) CHECK(ftn_stream_synchronize(st[r]));
  for (int r = 0; r < N; r++)
    EXPECT(memcmp(ring_in[r], ring_out[(r + N - 1) % N], sizeof ring_in[r]) == 0, "ring exchange into rank %d", r);
  expect_error(ftn_group_p2p(NULL, 2, ftnFloat32, comm[0], st[0]), ftnInvalidArgument, "NULL ops", "ops", "NULL");
  /* bad input: reduce_scatter count overflow, bad dtype, bad op, bad root */
  expect_error(ftn_reduce_scatter(send[0], rs[0], SIZE_MAX / 2, ftnFloat32, ftnSum, comm[0], st[0]),
               ftnInvalidArgument, "reduce_scatter overflow", "recvcount", NULL);
  expect_error(ftn_all_reduce(send[0], recv[0], C, 42, ftnSum, comm[0], st[0]), ftnInvalidArgument,
               "bad dtype", "datatype", NULL);
  expect_error(ftn_all_reduce(send[0], recv[0], C, ftnFloat32, 9, comm[0], st[0]), ftnInvalidArgument,
               "bad op", "`op`", NULL);
  expect_error(ftn_broadcast(bc[0], C, ftnFloat32, N, comm[0], st[0]), ftnInvalidArgument, "bad root",
               "root", NULL);
  expect_error(ftn_all_reduce(NULL, recv[0], C, ftnFloat32, ftnSum, comm[0], st[0]), ftnInvalidArgument,
               "NULL sendbuff", "sendbuff", "NULL");
  expect_error(ftn_send(p2p, C, ftnFloat32, 0, comm[0], st[0]), ftnInvalidArgument, "send to self", "peer",
               NULL);
  ftnComm_t sub = NULL;
  expect_error(ftn_comm_split(comm[0], -5, 0, &sub), ftnInvalidArgument, "bad color", "color", NULL);
  {
    /* A destroyed peer: the survivor's collective fails at synchronize
     * instead of hanging, every later call fails at once with the fault,
     * and the survivor is destroyed cleanly. */
    ftnComm_t pair[2];
    CHECK(ftn_comm_init_all_with_timeout(pair, 2, ctx, 60000));
    CHECK(ftn_comm_destroy(pair[1]));
    CHECK(ftn_all_reduce(send[0], recv[0], C, ftnFloat32, ftnSum, pair[0], st[0]));
    expect_error(ftn_stream_synchronize(st[0]), ftnBackendError, "collective with a destroyed peer", "left",
                 NULL);
    expect_error(ftn_barrier(pair[0], st[0]), ftnBackendError, "call on a broken communicator",
                 "communicator is broken", "left");
    CHECK(ftn_comm_destroy(pair[0]));
  }
  ftnUniqueId_t id;
  expect_error(ftn_get_unique_id(&id), ftnBackendUnavailable, "unique id without cuda", "cuda", NULL);
  for (int r = 0; r < N; r++) CHECK(ftn_comm_destroy(comm[r]));
  for (int r = 0; r < N; r++) CHECK(ftn_stream_destroy(st[r]));
  for (int r = 0; r < N; r++) CHECK(ftn_context_destroy(ctx[r]));
}

static void test_bad_input(ftnContext_t ctx, ftnStream_t s) {
  float buf[64];
  memset(buf, 0, sizeof buf);
  ftnBiasGeluDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.dtype = ftnFloat32;
  d.rows = 2;
  d.cols = 3;
  /* NULL handle / descriptor / buffer */
  expect_error(ftn_bias_gelu_forward(NULL, &d, buf, NULL, buf), ftnInvalidArgument, "NULL stream", "stream", "NULL");
  expect_error(ftn_bias_gelu_forward(s, NULL, buf, NULL, buf), ftnInvalidArgument, "NULL desc", "desc", "NULL");
  expect_error(ftn_bias_gelu_forward(s, &d, NULL, NULL, buf), ftnInvalidArgument, "NULL x", "`x`", "NULL");
  expect_error(ftn_bias_gelu_backward(s, &d, buf, buf, NULL, NULL, NULL), ftnInvalidArgument, "NULL dx", "`dx`",
               "NULL");
  /* a handle of the wrong kind */
  expect_error(ftn_stream_synchronize((ftnStream_t)(void *)ctx), ftnInvalidArgument, "wrong handle kind",
               "ftnStream_t", NULL);
  /* wrong size field: 0, too small, implausibly large, larger with non-zero trailing bytes */
  d.size = 0;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "size 0", "desc.size", "sizeof");
  d.size = 16;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "size 16", "desc.size", "got 16");
  d.size = (size_t)1 << 40;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "huge size", "desc.size", NULL);
  struct { ftnBiasGeluDesc_t d; int64_t future; } big;
  memset(&big, 0, sizeof big);
  big.d = d;
  big.d.size = sizeof big;
  big.future = 7;
  expect_error(ftn_bias_gelu_forward(s, &big.d, buf, NULL, buf), ftnInvalidArgument, "trailing", "trailing", NULL);
  big.future = 0; /* a newer caller's zeroed extra field is accepted */
  CHECK(ftn_bias_gelu_forward(s, &big.d, buf, NULL, buf));
  d.size = sizeof d;
  /* overflowing and negative dims, bad enums */
  d.rows = INT64_MAX;
  d.cols = 2;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "rows*cols overflow", "rows * cols",
               "overflows");
  d.rows = -1;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "negative rows", "desc.rows", NULL);
  d.rows = (int64_t)1 << 62;
  d.cols = 1;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "bytes overflow", "isize", NULL);
  d.rows = 2;
  d.cols = 3;
  d.dtype = 9;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "bad dtype", "desc.dtype", NULL);
  d.dtype = ftnFloat32;
  d.gelu = 5;
  expect_error(ftn_bias_gelu_forward(s, &d, buf, NULL, buf), ftnInvalidArgument, "bad gelu", "desc.gelu", NULL);
  d.gelu = ftnGeluTanh;
  /* misaligned pointer */
  expect_error(ftn_bias_gelu_forward(s, &d, (const char *)buf + 1, NULL, buf), ftnInvalidArgument, "misaligned",
               "aligned", NULL);
  /* norms: eps 0, hidden 0, reserved */
  ftnNormDesc_t nd;
  memset(&nd, 0, sizeof nd);
  nd.size = sizeof nd;
  nd.dtype = ftnFloat32;
  nd.rows = 2;
  nd.hidden = 4;
  expect_error(ftn_rms_norm_forward(s, &nd, buf, NULL, buf + 8, buf + 16), ftnInvalidArgument, "eps 0", "eps", NULL);
  nd.eps = 1e-5f;
  nd.reserved = 1;
  expect_error(ftn_layer_norm_forward(s, &nd, buf, NULL, NULL, buf + 8, buf + 16, buf + 20), ftnInvalidArgument,
               "reserved", "desc.reserved", NULL);
  nd.reserved = 0;
  expect_error(ftn_layer_norm_forward(s, &nd, buf, NULL, NULL, buf + 8, NULL, buf + 20), ftnInvalidArgument,
               "NULL mean", "mean", "NULL");
  /* softmax: sk 0, overflowing batch*heads*sq*sk, NULL padding mask, bad mask kind */
  ftnSoftmaxDesc_t sd;
  memset(&sd, 0, sizeof sd);
  sd.size = sizeof sd;
  sd.dtype = ftnFloat32;
  sd.batch = sd.heads = sd.sq = 1;
  sd.scale = 1.0f;
  expect_error(ftn_softmax_forward(s, &sd, buf, NULL, buf), ftnInvalidArgument, "sk 0", "sk", NULL);
  sd.sk = 4;
  sd.batch = (int64_t)1 << 40;
  sd.heads = (int64_t)1 << 30;
  expect_error(ftn_softmax_forward(s, &sd, buf, NULL, buf), ftnInvalidArgument, "softmax overflow", "overflows", NULL);
  sd.batch = sd.heads = 1;
  sd.mask = ftnSoftmaxMaskPadding;
  expect_error(ftn_softmax_forward(s, &sd, buf, NULL, buf + 8), ftnInvalidArgument, "NULL mask", "mask", "NULL");
  sd.mask = 3;
  expect_error(ftn_softmax_forward(s, &sd, buf, NULL, buf + 8), ftnInvalidArgument, "mask 3", "desc.mask", NULL);
  /* multi-tensor: NULL list, negative numel, bad dtype, scale 0 */
  ftnMultiTensorDesc_t md;
  memset(&md, 0, sizeof md);
  md.size = sizeof md;
  md.num_tensors = 2;
  md.scale = 2.0f;
  float fi = 0;
  expect_error(ftn_multi_tensor_unscale(s, &md, NULL, NULL, &fi), ftnInvalidArgument, "NULL tensors", "tensors",
               "NULL");
  ftnTensor_t ts[2] = {{buf, 4, ftnFloat32, 0}, {buf + 4, -3, ftnFloat32, 0}};
  expect_error(ftn_multi_tensor_unscale(s, &md, ts, NULL, &fi), ftnInvalidArgument, "negative numel", "numel",
               "tensor 1");
  ts[1].numel = 3;
  ts[1].dtype = ftnInt32;
  expect_error(ftn_multi_tensor_l2_norm(s, &md, ts, &fi), ftnInvalidArgument, "int tensor", "dtype", NULL);
  ts[1].dtype = ftnFloat32;
  md.scale = 0.0f;
  expect_error(ftn_multi_tensor_unscale(s, &md, ts, NULL, &fi), ftnInvalidArgument, "scale 0", "scale", NULL);
  md.max_norm = -1.0;
  expect_error(ftn_multi_tensor_clip_grad_norm(s, &md, ts, &fi), ftnInvalidArgument, "max_norm", "max_norm", NULL);
  md.num_tensors = SIZE_MAX / 8;
  expect_error(ftn_multi_tensor_l2_norm(s, &md, ts, &fi), ftnInvalidArgument, "num_tensors overflow",
               "num_tensors", NULL);
  /* scaler config validation */
  ftnGradScalerConfig_t c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  CHECK(ftn_grad_scaler_config_default(&c));
  c.backoff_factor = 2.0f;
  ftnGradScalerState_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  expect_error(ftn_grad_scaler_host_init(&c, &st), ftnInvalidArgument, "backoff 2", "backoff_factor", NULL);
  st.size = 3;
  c.backoff_factor = 0.5f;
  expect_error(ftn_grad_scaler_host_init(&c, &st), ftnInvalidArgument, "state.size", "size", NULL);
  /* context, memory */
  ftnContext_t bad;
  expect_error(ftn_context_create(7, 0, &bad), ftnInvalidArgument, "bad backend", "backend", NULL);
  expect_error(ftn_context_create(ftnBackendCuda, 0, &bad), ftnBackendUnavailable, "cuda", "cuda", NULL);
  expect_error(ftn_context_create_emu(0, &bad), ftnInvalidArgument, "0 workers", "ftn_context_create_emu", "got 0");
  expect_error(ftn_context_create_emu(1025, &bad), ftnInvalidArgument, "1025 workers", "`workers`", "got 1025");
  expect_error(ftn_context_create_emu(-3, &bad), ftnInvalidArgument, "-3 workers", "ftn_context_create_emu", "got -3");
  int per_rank = -1;
  expect_error(ftn_emu_workers_per_rank(0, &per_rank), ftnInvalidArgument, "0 ranks", "ranks", NULL);
  EXPECT(per_rank == -1, "nothing written on bad input, got %d", per_rank);
  expect_error(ftn_free(ctx, buf), ftnInvalidArgument, "foreign free", "ftn_malloc", NULL);
  expect_error(ftn_free_async(ctx, buf, s), ftnInvalidArgument, "foreign free_async", "ftn_malloc", NULL);
  expect_error(ftn_free_async(ctx, buf, NULL), ftnInvalidArgument, "free_async NULL stream", "stream", NULL);
  expect_error(ftn_memset(s, buf, 300, 4), ftnInvalidArgument, "memset 300", "value", NULL);
  expect_error(ftn_get_version(NULL), ftnInvalidArgument, "NULL version", "version", NULL);
  /* statuses have strings, unknown ones too */
  EXPECT(strcmp(ftn_get_error_string(ftnInvalidArgument), "invalid argument") == 0, "error string");
  EXPECT(strcmp(ftn_get_error_string(12345), "unknown status") == 0, "unknown status string");
  /* the stream still works after all that */
  CHECK(ftn_stream_synchronize(s));
}

/* Hardening regressions, one block per defect class: NULL out-pointers,
 * no abort on huge sizes, parents with live children, stale handles,
 * inconsistent input, truncating shapes, the +inf loss scale, and the
 * names errors give. */
static void test_hardening(ftnContext_t ctx, ftnStream_t s) {
  float buf[64];
  memset(buf, 0, sizeof buf);
  ftnGradScalerConfig_t c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  CHECK(ftn_grad_scaler_config_default(&c));
  ftnGradScalerState_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK(ftn_grad_scaler_host_init(&c, &st));

  /* 1. every out-pointer is checked (NULL and misaligned) before any write */
  expect_error(ftn_grad_scaler_host_update(&c, NULL, 1), ftnInvalidArgument, "host_update NULL state", "`state`",
               "NULL");
  expect_error(ftn_grad_scaler_get_state(NULL, NULL), ftnInvalidArgument, "get_state NULL", "scaler", "NULL");
  expect_error(ftn_context_create(ftnBackendEmu, 0, NULL), ftnInvalidArgument, "context_create NULL", "`ctx`", "NULL");
  expect_error(ftn_context_get_backend(ctx, NULL), ftnInvalidArgument, "get_backend NULL", "`backend`", "NULL");
  expect_error(ftn_context_get_name(ctx, NULL, 8), ftnInvalidArgument, "get_name NULL", "`name`", "NULL");
  expect_error(ftn_malloc(ctx, NULL, 16), ftnInvalidArgument, "malloc NULL", "`ptr`", "NULL");
  expect_error(ftn_stream_create(ctx, NULL), ftnInvalidArgument, "stream_create NULL", "`stream`", "NULL");
  expect_error(ftn_event_create(ctx, NULL), ftnInvalidArgument, "event_create NULL", "`event`", "NULL");
  expect_error(ftn_grad_scaler_create(ctx, &c, NULL, NULL), ftnInvalidArgument, "scaler_create NULL", "`scaler`",
               "NULL");
  int64_t r64 = 0, c64 = 0;
  expect_error(ftn_tp_mapping_shape(ftnCopyToTp, 0, 4, 4, 1, &r64, NULL), ftnInvalidArgument, "shape NULL cols",
               "`out_cols`", "NULL");
  expect_error(ftn_tp_mapping_shape(ftnCopyToTp, 0, 4, 4, 1, NULL, &c64), ftnInvalidArgument, "shape NULL rows",
               "`out_rows`", "NULL");
  expect_error(ftn_vocab_padded_size(100, 1, NULL), ftnInvalidArgument, "padded NULL", "`padded`", "NULL");
  expect_error(ftn_vocab_range(100, 1, 0, NULL, &r64), ftnInvalidArgument, "range NULL start", "`start`", "NULL");
  expect_error(ftn_get_version((int *)((char *)buf + 1)), ftnInvalidArgument, "misaligned version", "`version`",
               "aligned");
  ftnEvent_t ev;
  CHECK(ftn_event_create(ctx, &ev));
  CHECK(ftn_event_record(ev, s));
  CHECK(ftn_stream_synchronize(s));
  expect_error(ftn_event_query(ev, NULL), ftnInvalidArgument, "query NULL", "`complete`", "NULL");
  expect_error(ftn_event_elapsed_ms(ev, ev, NULL), ftnInvalidArgument, "elapsed NULL", "`ms`", "NULL");
  ftnComm_t comm;
  CHECK(ftn_comm_init_all(&comm, 1, &ctx));
  expect_error(ftn_comm_count(comm, NULL), ftnInvalidArgument, "comm_count NULL", "`count`", "NULL");
  expect_error(ftn_comm_user_rank(comm, NULL), ftnInvalidArgument, "user_rank NULL", "`rank`", "NULL");
  expect_error(ftn_comm_split(comm, 0, 0, NULL), ftnInvalidArgument, "split NULL", "`newcomm`", "NULL");
  expect_error(ftn_comm_get_stream(comm, NULL), ftnInvalidArgument, "get_stream NULL", "`stream`", "NULL");
  expect_error(ftn_comm_init_all(NULL, 1, &ctx), ftnInvalidArgument, "init_all NULL", "`comms`", "NULL");

  /* 2. huge sizes are errors, never an abort */
  void *small = NULL;
  CHECK(ftn_malloc(ctx, &small, 16));
  expect_error(ftn_memcpy_htod(s, small, buf, (size_t)1 << 62), ftnInvalidArgument, "htod past allocation",
               "`bytes`", "ftn_malloc allocation of 16");
  expect_error(ftn_memcpy_htod(s, (char *)small + 8, buf, 9), ftnInvalidArgument, "htod past the end", "`bytes`",
               "at most 8");
  expect_error(ftn_memcpy_dtoh(s, buf, small, 17), ftnInvalidArgument, "dtoh past allocation", "`bytes`", NULL);
  expect_error(ftn_memset(s, small, 0, 17), ftnInvalidArgument, "memset past allocation", "`bytes`", NULL);
  expect_error(ftn_memcpy_dtod(s, small, small, 32), ftnInvalidArgument, "dtod past allocation", "`bytes`", NULL);
  /* memory the library did not allocate: the host staging allocation fails with an error */
  expect_error(ftn_memcpy_htod(s, buf, buf, (size_t)1 << 62), ftnBackendError, "htod staging", "cannot allocate",
               NULL);
  void *huge = NULL;
  EXPECT(ftn_malloc(ctx, &huge, (size_t)1 << 62) != ftnSuccess && huge == NULL, "malloc of 2^62 bytes fails");
  CHECK(ftn_stream_synchronize(s));

  /* 3. a context with live children is not destroyed */
  ftnContext_t c2;
  ftnStream_t s2;
  ftnEvent_t e2;
  ftnGradScaler_t sc2;
  ftnComm_t cm2;
  CHECK(ftn_context_create(ftnBackendEmu, 0, &c2));
  CHECK(ftn_stream_create(c2, &s2));
  CHECK(ftn_event_create(c2, &e2));
  CHECK(ftn_grad_scaler_create(c2, &c, NULL, &sc2));
  CHECK(ftn_comm_init_all(&cm2, 1, &c2));
  expect_error(ftn_context_destroy(c2), ftnInvalidArgument, "destroy with children", "1 streams, 1 events",
               "1 communicators, 1 grad scalers");
  CHECK(ftn_stream_synchronize(s2)); /* still alive: nothing was freed */
  CHECK(ftn_stream_destroy(s2));
  CHECK(ftn_event_destroy(e2));
  CHECK(ftn_grad_scaler_destroy(sc2));
  ftnStream_t cs2;
  CHECK(ftn_comm_get_stream(cm2, &cs2));
  CHECK(ftn_comm_destroy(cm2));
  expect_error(ftn_context_destroy(c2), ftnInvalidArgument, "destroy with a comm stream", "1 streams", NULL);
  CHECK(ftn_stream_destroy(cs2));
  CHECK(ftn_context_destroy(c2));
  expect_error(ftn_context_destroy(c2), ftnInvalidArgument, "context destroyed twice", "stale", NULL);

  /* 4. stale handles are detected, never aliased to a newer handle */
  ftnEvent_t old, young;
  CHECK(ftn_event_create(ctx, &old));
  CHECK(ftn_event_destroy(old));
  CHECK(ftn_event_create(ctx, &young));
  EXPECT(old != young, "a new handle never reuses a destroyed one's value");
  expect_error(ftn_event_destroy(old), ftnInvalidArgument, "stale destroy", "stale", NULL);
  expect_error(ftn_event_record(old, s), ftnInvalidArgument, "stale record", "`event`", "stale");
  CHECK(ftn_event_record(young, s)); /* the new event survived */
  CHECK(ftn_event_synchronize(young));
  CHECK(ftn_event_destroy(young));
  expect_error(ftn_event_synchronize((ftnEvent_t)(void *)s), ftnInvalidArgument, "stream as event", "ftnEvent_t",
               "ftnStream_t");

  /* 5. inconsistent input is rejected */
  ftnGradScaler_t bad_sc = NULL;
  st.reserved = 1;
  expect_error(ftn_grad_scaler_create(ctx, &c, &st, &bad_sc), ftnInvalidArgument, "state.reserved",
               "state.reserved", NULL);
  expect_error(ftn_grad_scaler_host_update(&c, &st, 0), ftnInvalidArgument, "host state.reserved", "state.reserved",
               NULL);
  st.reserved = 0;
  st.hysteresis_tracker = (int32_t)c.hysteresis + 1;
  expect_error(ftn_grad_scaler_create(ctx, &c, &st, &bad_sc), ftnInvalidArgument, "hysteresis above config",
               "hysteresis_tracker", NULL);
  st.hysteresis_tracker = -3; /* reachable after repeated overflows */
  CHECK(ftn_grad_scaler_create(ctx, &c, &st, &bad_sc));
  CHECK(ftn_grad_scaler_destroy(bad_sc));
  st.scale = NAN;
  expect_error(ftn_grad_scaler_host_update(&c, &st, 0), ftnInvalidArgument, "NaN scale", "scale", NULL);
  CHECK(ftn_grad_scaler_host_init(&c, &st));
  ftnBlock2d_t blk = {0, 4};
  expect_error(ftn_copy_2d(s, ftnFloat32, buf, blk, buf, blk, 2, 4), ftnInvalidArgument, "copy_2d same block",
               "overlap", NULL);
  ftnBlock2d_t shifted = {2, 4};
  expect_error(ftn_copy_2d(s, ftnFloat32, buf, blk, buf, shifted, 2, 4), ftnInvalidArgument, "copy_2d overlap",
               "overlap", NULL);
  ftnBlock2d_t left = {0, 8}, right = {4, 8}; /* interleaved, disjoint column blocks */
  CHECK(ftn_copy_2d(s, ftnFloat32, buf, left, buf, right, 2, 4));
  /* norms: y sharing bytes with x (in place, or shifted) is refused */
  ftnNormDesc_t nrm;
  memset(&nrm, 0, sizeof nrm);
  nrm.size = sizeof nrm;
  nrm.dtype = ftnFloat32;
  nrm.rows = 2;
  nrm.hidden = 4;
  nrm.eps = 1e-5f;
  float stats[4];
  expect_error(ftn_layer_norm_forward(s, &nrm, buf, NULL, NULL, buf, stats, stats + 2), ftnInvalidArgument,
               "layer norm in place", "`y`", "overlap `x`");
  expect_error(ftn_rms_norm_forward(s, &nrm, buf, NULL, buf + 4, stats), ftnInvalidArgument, "rms norm overlap",
               "`y`", "overlap `x`");
  CHECK(ftn_rms_norm_forward(s, &nrm, buf, NULL, buf + 8, stats)); /* adjacent: disjoint */
  expect_error(ftn_tp_mapping_forward(ftnCopyToTp, buf, buf, 2, 4, ftnFloat32, comm, s), ftnInvalidArgument,
               "mapping in place", "`output`", "overlap");
  expect_error(ftn_tp_mapping_backward(ftnCopyToTp, buf, buf + 4, 2, 4, ftnFloat32, comm, s), ftnInvalidArgument,
               "mapping backward overlap", "`grad_input`", "overlap");
  CHECK(ftn_tp_mapping_forward(ftnCopyToTp, buf, buf + 8, 2, 4, ftnFloat32, comm, s));
  CHECK(ftn_stream_synchronize(s));

  /* 6. shapes that do not divide are errors, never truncated */
  expect_error(ftn_tp_mapping_shape(ftnScatterToTp, 0, 4, 7, 2, &r64, &c64), ftnInvalidArgument, "scatter 7 / 2",
               "`cols`", "multiple");
  expect_error(ftn_tp_mapping_shape(ftnGatherFromTp, 1, 4, 7, 2, &r64, &c64), ftnInvalidArgument,
               "gather backward 7 / 2", "`cols`", "multiple");
  expect_error(ftn_tp_mapping_shape(ftnScatterToSp, 0, 5, 4, 2, &r64, &c64), ftnInvalidArgument, "sp scatter 5 / 2",
               "`rows`", "multiple");
  expect_error(ftn_tp_mapping_shape(ftnReduceScatterToSp, 0, 5, 4, 2, &r64, &c64), ftnInvalidArgument,
               "reduce-scatter 5 / 2", "`rows`", "multiple");
  expect_error(ftn_tp_mapping_shape(ftnGatherFromSp, 1, 3, 4, 2, &r64, &c64), ftnInvalidArgument,
               "gather sp backward 3 / 2", "`rows`", "multiple");
  CHECK(ftn_tp_mapping_shape(ftnScatterToTp, 0, 4, 8, 2, &r64, &c64));
  EXPECT(r64 == 4 && c64 == 4, "scatter 8 / 2: %lld x %lld", (long long)r64, (long long)c64);

  /* 7. host and device scalers agree on every reachable state: +inf too */
  ftnGradScalerConfig_t big = c;
  big.initial_scale = 3.0e38f;
  big.growth_interval = 1;
  ftnGradScalerState_t hs, ds;
  memset(&hs, 0, sizeof hs);
  hs.size = sizeof hs;
  memset(&ds, 0, sizeof ds);
  ds.size = sizeof ds;
  CHECK(ftn_grad_scaler_host_init(&big, &hs));
  ftnGradScaler_t dsc;
  CHECK(ftn_grad_scaler_create(ctx, &big, NULL, &dsc));
  float *fi = NULL;
  CHECK(ftn_malloc(ctx, (void **)&fi, sizeof(float)));
  const int steps[] = {0, 0, 1, 1, 1, 0, 0};
  for (int i = 0; i < (int)(sizeof steps / sizeof steps[0]); i++) {
    float v = (float)steps[i];
    CHECK(ftn_memcpy_htod(s, fi, &v, sizeof v));
    CHECK(ftn_grad_scaler_update(dsc, s, fi, 1));
    CHECK(ftn_grad_scaler_host_update(&big, &hs, steps[i]));
    CHECK(ftn_grad_scaler_get_state(dsc, &ds));
    EXPECT(hs.scale == ds.scale && hs.growth_tracker == ds.growth_tracker &&
               hs.hysteresis_tracker == ds.hysteresis_tracker,
           "step %d: host (%g %d %d) vs device (%g %d %d)", i, hs.scale, hs.growth_tracker, hs.hysteresis_tracker,
           ds.scale, ds.growth_tracker, ds.hysteresis_tracker);
    if (i == 0) EXPECT(isinf(hs.scale) && hs.scale > 0, "grew past fp32 max to +inf (got %g)", hs.scale);
  }
  /* a device scaler resumes from the +inf state the host reached */
  ftnGradScaler_t resumed;
  CHECK(ftn_grad_scaler_create(ctx, &big, &hs, &resumed));
  CHECK(ftn_grad_scaler_get_state(resumed, &ds));
  EXPECT(ds.scale == hs.scale, "resumed scale %g vs %g", ds.scale, hs.scale);
  CHECK(ftn_grad_scaler_destroy(resumed));
  CHECK(ftn_grad_scaler_destroy(dsc));

  /* 8. errors name the right argument */
  expect_error(ftn_tp_mapping_backward(ftnCopyToTp, NULL, buf, 2, 4, ftnFloat32, comm, s), ftnInvalidArgument,
               "backward NULL grad_output", "`grad_output`", "NULL");
  expect_error(ftn_tp_mapping_backward(ftnCopyToTp, buf, NULL, 2, 4, ftnFloat32, comm, s), ftnInvalidArgument,
               "backward NULL grad_input", "`grad_input`", "NULL");
  ftnContext_t c3;
  ftnStream_t s3;
  CHECK(ftn_context_create(ftnBackendEmu, 0, &c3));
  CHECK(ftn_stream_create(c3, &s3));
  expect_error(ftn_free_async(ctx, small, s3), ftnDeviceMismatch, "free_async other stream", "`stream`",
               "than `ctx`");
  expect_error(ftn_tp_mapping_forward(ftnCopyToTp, buf, buf + 8, 2, 4, ftnFloat32, comm, s3), ftnDeviceMismatch,
               "mapping other stream", "`stream`", "than the communicator");
  ftnEvent_t e3;
  CHECK(ftn_event_create(c3, &e3));
  expect_error(ftn_event_elapsed_ms(ev, e3, (float *)buf), ftnDeviceMismatch, "elapsed across contexts", "`end`",
               "than `start`");
  CHECK(ftn_event_destroy(e3));
  CHECK(ftn_stream_destroy(s3));
  CHECK(ftn_context_destroy(c3));
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  ftnJobEnv_t env;
  memset(&env, 0, sizeof env);
  env.size = sizeof env;
  expect_error(ftn_job_env_from_environment(&env), ftnInvalidArgument, "WORLD_SIZE=0", "`WORLD_SIZE`", "at least 1");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");

  CHECK(ftn_free(ctx, small));
  CHECK(ftn_free(ctx, fi));
  CHECK(ftn_event_destroy(ev));
  CHECK(ftn_comm_destroy(comm));
  CHECK(ftn_stream_synchronize(s));
}

int main(int argc, char **argv) {
  g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  g_state = g_seed * 0x9E3779B97F4A7C15ULL + 1;
  int version = 0;
  CHECK(ftn_get_version(&version));
  EXPECT(version == FTN_VERSION, "runtime version %d vs header %d", version, FTN_VERSION);
  ftnContext_t ctx;
  ftnStream_t s;
  CHECK(ftn_context_create(ftnBackendEmu, 0, &ctx));
  CHECK(ftn_stream_create(ctx, &s));
  test_memory_and_events(ctx, s);
  test_bias_gelu(s, 0);
  test_bias_gelu(s, 1);
  test_norms(s, 0);
  test_norms(s, 1);
  test_softmax(s, 0);
  test_softmax(s, 1);
  test_softmax(s, 2);
  test_gemm(s);
  test_gemm_null_rules(s);
  test_multi_tensor(s);
  test_scaler(ctx, s);
  test_collectives();
  test_bad_input(ctx, s);
  test_hardening(ctx, s);
  CHECK(ftn_stream_destroy(s));
  CHECK(ftn_context_destroy(ctx));
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed [seed %llu]\n", g_failures, g_seed);
    return 1;
  }
  printf("C consumer: all checks passed [seed %llu]\n", g_seed);
  return 0;
}
