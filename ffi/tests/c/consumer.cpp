// A C++17 program that uses only include/ferrotron.h and libferrotron, with
// the handles wrapped in RAII types: runs every exposed op on the emulator
// (bf16 and fp32) and checks it against its own reference, including the
// tensor-parallel layers, blocks, mappings and cross-entropy (with and
// without ignore_index) on two ranks (one thread each), the fused AdamW
// step, DDP with the distributed optimizer on two data-parallel ranks and
// the memory accounting, against double-precision references of its own.
// Usage: consumer_cpp SEED. Exit 0 on success.
#include "ferrotron.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ftn {

struct Error : std::runtime_error {
  ftnResult_t status;
  Error(ftnResult_t s, const std::string& what)
      : std::runtime_error(what + ": " + ftn_get_error_string(s) + ": " + ftn_get_last_error()), status(s) {}
};

inline void check(ftnResult_t r, const char* what) {
  if (r != ftnSuccess) throw Error(r, what);
}
#define FTN_CHECK(call) ::ftn::check((call), #call)

// A move-only owner of one handle, destroyed with its destroy function.
template <typename H, ftnResult_t (*Destroy)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(o.h_) { o.h_ = nullptr; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = o.h_;
      o.h_ = nullptr;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  H get() const { return h_; }
  H* out() {
    reset();
    return &h_;
  }
  void reset() {
    if (h_) (void)Destroy(h_);  // destructors never throw
    h_ = nullptr;
  }

 private:
  H h_ = nullptr;
};

using Context = Handle<ftnContext_t, ftn_context_destroy>;
using Stream = Handle<ftnStream_t, ftn_stream_destroy>;
using Event = Handle<ftnEvent_t, ftn_event_destroy>;
using Comm = Handle<ftnComm_t, ftn_comm_destroy>;
using GradScaler = Handle<ftnGradScaler_t, ftn_grad_scaler_destroy>;
using ColumnParallelLinear = Handle<ftnColumnParallelLinear_t, ftn_column_parallel_linear_destroy>;
using RowParallelLinear = Handle<ftnRowParallelLinear_t, ftn_row_parallel_linear_destroy>;
using TpMlp = Handle<ftnTpMlp_t, ftn_tp_mlp_destroy>;
using TpAttention = Handle<ftnTpAttention_t, ftn_tp_attention_destroy>;
using CrossEntropySaved = Handle<ftnCrossEntropySaved_t, ftn_cross_entropy_saved_destroy>;
using Adam = Handle<ftnAdam_t, ftn_adam_destroy>;
using ParamRegistry = Handle<ftnParamRegistry_t, ftn_param_registry_destroy>;
using Ddp = Handle<ftnDdp_t, ftn_ddp_destroy>;
using DistOpt = Handle<ftnDistOpt_t, ftn_dist_opt_destroy>;

inline Context make_context(ftnBackend_t b) {
  Context c;
  FTN_CHECK(ftn_context_create(b, 0, c.out()));
  return c;
}
inline Stream make_stream(const Context& c) {
  Stream s;
  FTN_CHECK(ftn_stream_create(c.get(), s.out()));
  return s;
}

// Zero-initialised descriptor with its size field set.
template <typename D>
D desc() {
  D d;
  std::memset(&d, 0, sizeof d);
  d.size = sizeof d;
  return d;
}

}  // namespace ftn

static unsigned long long g_seed = 1;
static int g_failures = 0;
static std::mutex g_failures_mutex;  // the rank threads check their own results

static void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::lock_guard<std::mutex> lock(g_failures_mutex);
    std::fprintf(stderr, "FAILED: %s [seed %llu]\n", what.c_str(), g_seed);
    g_failures++;
  }
}

// bf16: the top 16 bits of an fp32, rounded to nearest even.
static uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static void close_all(const std::string& what, const std::vector<float>& got, const std::vector<double>& want,
                      double tol) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double e = std::fabs(got[i] - want[i]) / std::fmax(1.0, std::fabs(want[i]));
    if (!(e <= worst)) {
      worst = std::isnan(e) ? INFINITY : e;
      at = i;
    }
  }
  expect(worst <= tol, what + ": rel error " + std::to_string(worst) + " at " + std::to_string(at));
}

static std::mt19937_64 rng;
static std::vector<float> rand_vec(size_t n) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

static double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double gelu_tanh_grad(double x) {
  double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

static void bias_gelu_bf16(const ftn::Stream& s) {
  const int64_t rows = 9, cols = 33;
  size_t n = rows * cols;
  std::vector<uint16_t> x(n), b(cols), dy(n), out(n, 0xFFFF), dx(n, 0xFFFF), db(cols, 0xFFFF);
  for (auto& v : x) v = to_bf16(rand_vec(1)[0]);
  for (auto& v : b) v = to_bf16(rand_vec(1)[0]);
  for (auto& v : dy) v = to_bf16(rand_vec(1)[0]);
  auto d = ftn::desc<ftnBiasGeluDesc_t>();
  d.dtype = ftnBfloat16;
  d.gelu = ftnGeluTanh;
  d.rows = rows;
  d.cols = cols;
  FTN_CHECK(ftn_bias_gelu_forward(s.get(), &d, x.data(), b.data(), out.data()));
  FTN_CHECK(ftn_bias_gelu_backward(s.get(), &d, dy.data(), x.data(), b.data(), dx.data(), db.data()));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  std::vector<float> got_y(n), got_dx(n), got_db(cols);
  std::vector<double> want_y(n), want_dx(n), want_db(cols, 0.0);
  for (size_t i = 0; i < n; i++) {
    double v = static_cast<double>(from_bf16(x[i])) + from_bf16(b[i % cols]);  // fp32 add in the kernel
    v = static_cast<float>(v);
    want_y[i] = gelu_tanh(v);
    want_dx[i] = from_bf16(dy[i]) * gelu_tanh_grad(v);
    want_db[i % cols] += want_dx[i];  // the kernel sums dx in fp32 before rounding it to bf16
    got_y[i] = from_bf16(out[i]);
    got_dx[i] = from_bf16(dx[i]);
  }
  for (int64_t c = 0; c < cols; c++) got_db[c] = from_bf16(db[c]);
  close_all("bf16 bias_gelu fwd", got_y, want_y, 1e-2);
  close_all("bf16 bias_gelu bwd dx", got_dx, want_dx, 1e-2);
  close_all("bf16 bias_gelu bwd dbias", got_db, want_db, 2e-2);
}

static void norms(const ftn::Stream& s, bool rms) {
  const int64_t rows = 3, hidden = 1100;  // > 1024: the block-per-row path
  size_t n = rows * hidden;
  auto x = rand_vec(n), g = rand_vec(hidden), be = rand_vec(hidden), dy = rand_vec(n);
  std::vector<float> y(n, NAN), mean(rows, NAN), rstd(rows, NAN), dx(n, NAN), dg(hidden, NAN), db(hidden, NAN);
  auto d = ftn::desc<ftnNormDesc_t>();
  d.dtype = ftnFloat32;
  d.rows = rows;
  d.hidden = hidden;
  d.eps = 1e-5f;
  d.zero_centered_gamma = 1;
  if (rms) {
    FTN_CHECK(ftn_rms_norm_forward(s.get(), &d, x.data(), g.data(), y.data(), rstd.data()));
    FTN_CHECK(ftn_rms_norm_backward(s.get(), &d, dy.data(), x.data(), rstd.data(), g.data(), dx.data(), dg.data()));
  } else {
    FTN_CHECK(ftn_layer_norm_forward(s.get(), &d, x.data(), g.data(), be.data(), y.data(), mean.data(), rstd.data()));
    FTN_CHECK(ftn_layer_norm_backward(s.get(), &d, dy.data(), x.data(), mean.data(), rstd.data(), g.data(), dx.data(),
                                      dg.data(), db.data()));
  }
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  std::vector<double> wy(n), wdx(n), wdg(hidden, 0.0), wdb(hidden, 0.0);
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = &x[r * hidden];
    double mu = 0, var = 0;
    if (!rms) {
      for (int64_t c = 0; c < hidden; c++) mu += xr[c];
      mu /= hidden;
    }
    for (int64_t c = 0; c < hidden; c++) var += (xr[c] - mu) * (xr[c] - mu);
    double rs = 1.0 / std::sqrt(var / hidden + 1e-5), m1 = 0, m2 = 0;
    for (int64_t c = 0; c < hidden; c++) {
      double xh = (xr[c] - mu) * rs, gg = g[c] + 1.0, dxh = dy[r * hidden + c] * gg;
      wy[r * hidden + c] = xh * gg + (rms ? 0.0 : be[c]);
      m1 += dxh;
      m2 += dxh * xh;
      wdg[c] += dy[r * hidden + c] * xh;
      wdb[c] += dy[r * hidden + c];
    }
    m1 /= hidden;
    m2 /= hidden;
    for (int64_t c = 0; c < hidden; c++) {
      double xh = (xr[c] - mu) * rs, dxh = dy[r * hidden + c] * (g[c] + 1.0);
      wdx[r * hidden + c] = rs * (dxh - (rms ? 0.0 : m1) - xh * m2);
    }
  }
  std::string k = rms ? "rms_norm " : "layer_norm ";
  close_all(k + "y", y, wy, 1e-5);
  close_all(k + "dx", dx, wdx, 1e-4);
  close_all(k + "dgamma", dg, wdg, 1e-4);
  if (!rms) close_all(k + "dbeta", db, wdb, 1e-4);
}

static void softmax_causal(const ftn::Stream& s) {
  const int64_t rows = 2 * 4 * 9, sk = 9;  // batch 2, heads 4, sq = sk = 9
  auto x = rand_vec(rows * sk), dy = rand_vec(rows * sk);
  std::vector<float> y(rows * sk, NAN), dx(rows * sk, NAN);
  auto d = ftn::desc<ftnSoftmaxDesc_t>();
  d.dtype = ftnFloat32;
  d.mask = ftnSoftmaxMaskCausal;
  d.batch = 2;
  d.heads = 4;
  d.sq = d.sk = sk;
  d.scale = 0.125f;
  FTN_CHECK(ftn_softmax_forward(s.get(), &d, x.data(), nullptr, y.data()));
  FTN_CHECK(ftn_softmax_backward(s.get(), &d, y.data(), dy.data(), dx.data()));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  std::vector<double> wy(rows * sk, 0.0), wdx(rows * sk);
  for (int64_t r = 0; r < rows; r++) {
    int64_t i = r % sk;
    double mx = -INFINITY, sum = 0, dot = 0;
    for (int64_t c = 0; c <= i; c++) mx = std::fmax(mx, static_cast<double>(0.125f * x[r * sk + c]));
    for (int64_t c = 0; c <= i; c++) sum += std::exp(static_cast<double>(0.125f * x[r * sk + c]) - mx);
    for (int64_t c = 0; c <= i; c++) wy[r * sk + c] = std::exp(static_cast<double>(0.125f * x[r * sk + c]) - mx) / sum;
    for (int64_t c = 0; c < sk; c++) dot += static_cast<double>(dy[r * sk + c]) * y[r * sk + c];
    for (int64_t c = 0; c < sk; c++) wdx[r * sk + c] = 0.125 * (dy[r * sk + c] * static_cast<double>(y[r * sk + c]) - y[r * sk + c] * dot);
  }
  close_all("causal softmax fwd", y, wy, 1e-5);
  close_all("causal softmax bwd", dx, wdx, 1e-5);
}

// D (bf16) += A B with D as C (beta = 1, c = NULL), then the bias gradient of D.
static void gemm_accumulate(const ftn::Stream& s) {
  const int64_t m = 17, n = 12, k = 33;
  std::vector<uint16_t> a(m * k), b(k * n), d(m * n), db(n, 0xFFFF);
  for (auto& v : a) v = to_bf16(rand_vec(1)[0]);
  for (auto& v : b) v = to_bf16(rand_vec(1)[0]);
  for (auto& v : d) v = to_bf16(rand_vec(1)[0]);
  auto d0 = d;
  auto g = ftn::desc<ftnGemmDesc_t>();
  g.dtype = g.out_dtype = ftnBfloat16;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = 1;
  g.alpha = 1.0f;
  g.beta = 1.0f;
  FTN_CHECK(ftn_gemm(s.get(), &g, a.data(), b.data(), nullptr, nullptr, nullptr, d.data()));
  auto bd = ftn::desc<ftnBiasGradDesc_t>();
  bd.dtype = ftnBfloat16;
  bd.rows = m;
  bd.cols = n;
  FTN_CHECK(ftn_gemm_bias_grad(s.get(), &bd, d.data(), db.data()));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  std::vector<float> got(m * n), gotb(n);
  std::vector<double> want(m * n), wantb(n, 0.0);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double acc = from_bf16(d0[i * n + j]);
      for (int64_t q = 0; q < k; q++) acc += static_cast<double>(from_bf16(a[i * k + q])) * from_bf16(b[q * n + j]);
      want[i * n + j] = acc;
      got[i * n + j] = from_bf16(d[i * n + j]);
      wantb[j] += from_bf16(d[i * n + j]);
    }
  for (int64_t j = 0; j < n; j++) gotb[j] = from_bf16(db[j]);
  close_all("bf16 gemm accumulate", got, want, 1e-2);
  close_all("bf16 bias_grad", gotb, wantb, 1e-2);
}

static void multi_tensor_and_scaler(const ftn::Context& ctx, const ftn::Stream& s) {
  // a mixed fp32 + bf16 list
  auto a = rand_vec(3000);
  std::vector<uint16_t> b(777);
  for (auto& v : b) v = to_bf16(rand_vec(1)[0]);
  auto a0 = a;
  auto b0 = b;
  ftnTensor_t list[2] = {{a.data(), (int64_t)a.size(), ftnFloat32, 0}, {b.data(), (int64_t)b.size(), ftnBfloat16, 0}};
  auto cfg = ftn::desc<ftnGradScalerConfig_t>();
  FTN_CHECK(ftn_grad_scaler_config_default(&cfg));
  cfg.initial_scale = 8.0f;
  ftn::GradScaler sc;
  FTN_CHECK(ftn_grad_scaler_create(ctx.get(), &cfg, nullptr, sc.out()));
  float* found_inf = nullptr;
  FTN_CHECK(ftn_malloc(ctx.get(), reinterpret_cast<void**>(&found_inf), sizeof(float)));
  auto md = ftn::desc<ftnMultiTensorDesc_t>();
  md.num_tensors = 2;
  md.max_norm = 1.0;
  float norm = NAN;
  FTN_CHECK(ftn_multi_tensor_unscale(s.get(), &md, list, sc.get(), found_inf));
  FTN_CHECK(ftn_multi_tensor_clip_grad_norm(s.get(), &md, list, &norm));
  FTN_CHECK(ftn_grad_scaler_update(sc.get(), s.get(), found_inf, 1));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  double sq = 0;
  std::vector<double> ua(a.size()), ub(b.size());
  for (size_t i = 0; i < a.size(); i++) sq += (ua[i] = a0[i] * 0.125f) * ua[i];
  for (size_t i = 0; i < b.size(); i++) sq += (ub[i] = from_bf16(to_bf16(from_bf16(b0[i]) * 0.125f))) * ub[i];
  double wn = std::sqrt(sq), coeff = std::fmin(1.0, 1.0 / (wn + 1e-6));
  close_all("l2 norm of the unscaled list", {norm}, {wn}, 1e-5);
  std::vector<float> ga(a.begin(), a.end()), gb(b.size());
  for (size_t i = 0; i < b.size(); i++) gb[i] = from_bf16(b[i]);
  for (auto& v : ua) v *= coeff;
  for (auto& v : ub) v *= coeff;
  close_all("unscale + clip fp32", ga, ua, 1e-5);
  close_all("unscale + clip bf16", gb, ub, 1e-2);
  auto st = ftn::desc<ftnGradScalerState_t>();
  FTN_CHECK(ftn_grad_scaler_get_state(sc.get(), &st));
  expect(st.scale == 8.0f && st.growth_tracker == 1 && st.hysteresis_tracker == 2, "scaler after one clean step");
  // the host state machine agrees
  auto hs = ftn::desc<ftnGradScalerState_t>();
  FTN_CHECK(ftn_grad_scaler_host_init(&cfg, &hs));
  FTN_CHECK(ftn_grad_scaler_host_update(&cfg, &hs, 0));
  expect(hs.scale == st.scale && hs.growth_tracker == st.growth_tracker && hs.hysteresis_tracker == st.hysteresis_tracker,
         "host and device scalers agree");
  // l2 norm and clip_by_norm on their own
  float n2 = NAN;
  FTN_CHECK(ftn_multi_tensor_l2_norm(s.get(), &md, list, &n2));
  md.max_norm = 100.0;
  FTN_CHECK(ftn_multi_tensor_clip_by_norm(s.get(), &md, list, &n2));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  expect(std::fabs(n2 - std::fmin(wn, 1.0)) < 1e-4, "norm after clipping: " + std::to_string(n2));
  FTN_CHECK(ftn_free(ctx.get(), found_inf));
}

// Four ranks, each on its own thread: collectives and a split.
static void collectives() {
  const int N = 4;
  std::vector<ftn::Context> ctx;
  for (int r = 0; r < N; r++) ctx.push_back(ftn::make_context(ftnBackendEmu));
  std::vector<ftnContext_t> raw;
  for (auto& c : ctx) raw.push_back(c.get());
  std::vector<ftnComm_t> comm_raw(N);
  FTN_CHECK(ftn_comm_init_all(comm_raw.data(), N, raw.data()));
  std::vector<ftn::Comm> comm;
  for (auto h : comm_raw) comm.emplace_back(h);
  std::vector<std::string> errors(N);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; r++) {
    threads.emplace_back([&, r] {
      try {
        ftn::Stream s = ftn::make_stream(ctx[r]);
        std::vector<int64_t> v(5, r + 1), sum(5, -1);
        FTN_CHECK(ftn_all_reduce(v.data(), sum.data(), 5, ftnInt64, ftnSum, comm[r].get(), s.get()));
        // split into even / odd ranks, then an all-gather inside each half
        ftn::Comm half;
        FTN_CHECK(ftn_comm_split(comm[r].get(), r % 2, r, half.out()));
        int hr = -1, hn = -1;
        FTN_CHECK(ftn_comm_user_rank(half.get(), &hr));
        FTN_CHECK(ftn_comm_count(half.get(), &hn));
        float mine = static_cast<float>(r);
        float all[2] = {NAN, NAN};
        FTN_CHECK(ftn_all_gather(&mine, all, 1, ftnFloat32, half.get(), s.get()));
        float avg = static_cast<float>(r);
        FTN_CHECK(ftn_all_reduce(&avg, &avg, 1, ftnFloat32, ftnAvg, comm[r].get(), s.get()));
        FTN_CHECK(ftn_stream_synchronize(s.get()));
        bool ok = hn == 2 && hr == r / 2 && all[0] == static_cast<float>(r % 2) && all[1] == static_cast<float>(r % 2 + 2) &&
                  avg == 1.5f;
        for (auto x : sum) ok = ok && x == N * (N + 1) / 2;
        if (!ok) errors[r] = "wrong collective result on rank " + std::to_string(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) expect(e.empty(), e);
}

// ---- tensor parallelism: two ranks, one thread each ----

static const int TP = 2;

// Random bf16 values in [-2 scale, 2 scale).
static std::vector<uint16_t> rand_bf16(size_t n, float scale = 1.0f) {
  auto v = rand_vec(n);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; i++) h[i] = to_bf16(v[i] * scale);
  return h;
}
static std::vector<double> widen(const std::vector<uint16_t>& h) {
  std::vector<double> d(h.size());
  for (size_t i = 0; i < h.size(); i++) d[i] = from_bf16(h[i]);
  return d;
}
static std::vector<float> floats(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); i++) f[i] = from_bf16(h[i]);
  return f;
}
// Rows [r0, r1) of a row-major matrix of `cols` columns (a vector: cols = 1).
template <typename T>
static std::vector<T> row_block(const std::vector<T>& m, int64_t cols, int64_t r0, int64_t r1) {
  return std::vector<T>(m.begin() + r0 * cols, m.begin() + r1 * cols);
}
// Columns [c0, c1) of a row-major matrix of `cols` columns.
template <typename T>
static std::vector<T> col_block(const std::vector<T>& m, int64_t cols, int64_t c0, int64_t c1) {
  std::vector<T> out;
  const int64_t rows = static_cast<int64_t>(m.size()) / cols;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = c0; j < c1; j++) out.push_back(m[i * cols + j]);
  return out;
}

static double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
static double gelu_erf_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / 2.5066282746310002;  // sqrt(2 pi)
}

// y [rows, out] = x [rows, in] w^T + b, w row-major [out, in].
static std::vector<double> linear(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(rows * out);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t o = 0; o < out; o++) {
      double acc = b[o];
      for (int64_t k = 0; k < in; k++) acc += x[i * in + k] * w[o * in + k];
      y[i * out + o] = acc;
    }
  return y;
}

// Y = gelu(X W1^T + b1) W2^T + b2 and its gradients from dY, in double.
struct MlpReference {
  std::vector<double> pre, h, y, dpre, dx, dw1, db1, dw2, db2;
};
static MlpReference mlp_reference(int64_t tokens, int64_t hidden, int64_t ffn, const std::vector<double>& x,
                                  const std::vector<double>& w1, const std::vector<double>& b1,
                                  const std::vector<double>& w2, const std::vector<double>& b2,
                                  const std::vector<double>& dy, bool erf) {
  MlpReference r;
  r.pre = linear(x, w1, b1, tokens, hidden, ffn);
  r.h.resize(r.pre.size());
  for (size_t i = 0; i < r.pre.size(); i++) r.h[i] = erf ? gelu_erf(r.pre[i]) : gelu_tanh(r.pre[i]);
  r.y = linear(r.h, w2, b2, tokens, ffn, hidden);
  r.dpre.assign(tokens * ffn, 0.0);
  r.dx.assign(tokens * hidden, 0.0);
  r.dw1.assign(ffn * hidden, 0.0);
  r.db1.assign(ffn, 0.0);
  r.dw2.assign(hidden * ffn, 0.0);
  r.db2.assign(hidden, 0.0);
  for (int64_t t = 0; t < tokens; t++) {
    for (int64_t f = 0; f < ffn; f++) {
      double dh = 0;
      for (int64_t o = 0; o < hidden; o++) dh += dy[t * hidden + o] * w2[o * ffn + f];
      double p = r.pre[t * ffn + f];
      double dp = dh * (erf ? gelu_erf_grad(p) : gelu_tanh_grad(p));
      r.dpre[t * ffn + f] = dp;
      r.db1[f] += dp;
      for (int64_t k = 0; k < hidden; k++) {
        r.dx[t * hidden + k] += dp * w1[f * hidden + k];
        r.dw1[f * hidden + k] += dp * x[t * hidden + k];
      }
    }
    for (int64_t o = 0; o < hidden; o++) {
      r.db2[o] += dy[t * hidden + o];
      for (int64_t f = 0; f < ffn; f++) r.dw2[o * ffn + f] += dy[t * hidden + o] * r.h[t * ffn + f];
    }
  }
  return r;
}

// Ends the program if the ranks deadlock (a rank that threw leaves its peer
// waiting in a collective): a failure instead of a hung test.
class Watchdog {
 public:
  explicit Watchdog(int seconds)
      : thread_([this, seconds] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!cv_.wait_for(lock, std::chrono::seconds(seconds), [this] { return done_; })) {
            std::fprintf(stderr, "FAILED: the tensor-parallel checks hung for %d s [seed %llu]\n", seconds, g_seed);
            std::_Exit(1);
          }
        }) {}
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The ranks of one in-process communicator: a context, a communicator and a
// stream each (destroyed in the reverse order).
struct Ranks {
  std::vector<ftn::Context> ctx;
  std::vector<ftn::Comm> comm;
  std::vector<ftn::Stream> stream;

  explicit Ranks(int n) {
    for (int r = 0; r < n; r++) ctx.push_back(ftn::make_context(ftnBackendEmu));
    std::vector<ftnContext_t> raw;
    for (auto& c : ctx) raw.push_back(c.get());
    std::vector<ftnComm_t> comm_raw(n);
    FTN_CHECK(ftn_comm_init_all(comm_raw.data(), n, raw.data()));
    for (auto h : comm_raw) comm.emplace_back(h);
    for (auto& c : ctx) stream.push_back(ftn::make_stream(c));
  }
};

// Runs body(rank) on its own thread for every rank (the layers may block the
// host until a peer has enqueued its half of a collective); an exception
// fails the check with its message.
static void on_ranks(const std::string& what, const std::function<void(int)>& body) {
  std::vector<std::string> errors(TP);
  std::vector<std::thread> threads;
  for (int r = 0; r < TP; r++)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = what + " on rank " + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors) expect(e.empty(), e);
}

// Both ranks end with the host waiting for their stream (its collectives and
// what the layers enqueued on the communicator's stream).
static void finish(const Ranks& rk, int r) {
  FTN_CHECK(ftn_comm_wait(rk.comm[r].get(), rk.stream[r].get(), 10000));
  FTN_CHECK(ftn_stream_synchronize(rk.stream[r].get()));
}

template <typename T>
static std::vector<T> to_host(const ftn::Stream& s, const void* dev, size_t n) {
  std::vector<T> h(n);
  FTN_CHECK(ftn_memcpy_dtoh(s.get(), h.data(), dev, n * sizeof(T)));
  return h;
}

// A layer's parameters (device memory it owns) equal the expected shards exactly.
static void check_params(const ftn::Stream& s, const std::string& what, const ftnLinearParams_t& p,
                         const std::vector<uint16_t>& w, const std::vector<uint16_t>& b) {
  bool ok = p.weight && p.bias && p.weight_count == w.size() && p.bias_count == b.size();
  expect(ok, what + " params: counts " + std::to_string(p.weight_count) + " / " + std::to_string(p.bias_count) +
                 ", want " + std::to_string(w.size()) + " / " + std::to_string(b.size()));
  if (!ok) return;
  expect(to_host<uint16_t>(s, p.weight, w.size()) == w, what + " params: weight shard");
  expect(to_host<uint16_t>(s, p.bias, b.size()) == b, what + " params: bias");
}

// Where one layer's backward writes its gradients: an fp32 main_grad
// accumulated into (from a known non-zero start) or a stored bf16 weight
// gradient; the bias gradient is bf16.
struct GradBuffers {
  bool accumulate;
  std::vector<float> main_grad, start;
  std::vector<uint16_t> weight, bias;

  GradBuffers(bool acc, size_t nw, size_t nb) : accumulate(acc), weight(acc ? 0 : nw, 0xFFFF), bias(nb, 0xFFFF) {
    if (acc) {
      main_grad.resize(nw);
      for (size_t i = 0; i < nw; i++) main_grad[i] = 0.5f + 0.25f * static_cast<float>(i % 5);
      start = main_grad;
    }
  }
  ftnLinearGrads_t desc() {
    auto g = ftn::desc<ftnLinearGrads_t>();
    g.weight_mode = accumulate ? ftnWeightGradAccumulate : ftnWeightGradStore;
    g.weight = accumulate ? static_cast<void*>(main_grad.data()) : static_cast<void*>(weight.data());
    g.bias = bias.data();
    return g;
  }
  void check(const std::string& what, const std::vector<double>& dw, const std::vector<double>& db) const {
    if (accumulate) {
      std::vector<double> want = dw;
      for (size_t i = 0; i < want.size(); i++) want[i] += start[i];
      close_all(what + " weight grad (fp32 main_grad +=)", main_grad, want, 3e-2);
    } else {
      close_all(what + " weight grad (bf16 store)", floats(weight), dw, 3e-2);
    }
    close_all(what + " bias grad", floats(bias), db, 3e-2);
  }
};

static bool error_names(const ftn::Error& e, const char* word) {
  return e.status == ftnInvalidArgument && std::string(e.what()).find(word) != std::string::npos;
}

const int64_t kTokens = 8, kHidden = 16, kFfn = 32, kFfnShard = kFfn / TP;

// The MLP block (bf16, tanh GeLU), sequence parallelism off and on.
static void tp_mlp(const Ranks& rk) {
  const int64_t T = kTokens, H = kHidden, F = kFfn, Fp = kFfnShard;
  // Scales keep every tensor O(1): the tolerances are then about twice the
  // worst bf16 rounding (of h, of each rank's partial sums) over many seeds.
  auto x = rand_bf16(T * H, 0.5f), w1 = rand_bf16(F * H, 0.5f), b1 = rand_bf16(F, 0.25f), w2 = rand_bf16(H * F, 0.12f),
       b2 = rand_bf16(H, 0.25f), dy = rand_bf16(T * H, 0.35f);
  const MlpReference ref =
      mlp_reference(T, H, F, widen(x), widen(w1), widen(b1), widen(w2), widen(b2), widen(dy), false);
  for (int sp = 0; sp <= 1; sp++) {
    on_ranks("tp mlp sp=" + std::to_string(sp), [&](int r) {
      const ftn::Stream& s = rk.stream[r];
      ftnComm_t c = rk.comm[r].get();
      const std::string tag = "rank " + std::to_string(r) + " tp_mlp sp=" + std::to_string(sp) + " ";
      auto d = ftn::desc<ftnTpMlpDesc_t>();
      d.dtype = ftnBfloat16;
      d.gelu = ftnGeluTanh;
      d.hidden = H;
      d.ffn = F;
      d.sequence_parallel = sp;
      ftn::TpMlp mlp;
      // bad input first (rejected before any communication, on both ranks)
      try {
        auto bad = d;
        bad.size = sizeof bad - 8;
        ftn::check(ftn_tp_mlp_create(c, &bad, w1.data(), b1.data(), w2.data(), b2.data(), mlp.out()), "mlp create");
        expect(false, tag + "a short desc.size accepted");
      } catch (const ftn::Error& e) {
        expect(error_names(e, "desc.size"), tag + "error names desc.size: " + e.what());
      }
      FTN_CHECK(ftn_tp_mlp_create(c, &d, w1.data(), b1.data(), w2.data(), b2.data(), mlp.out()));
      auto p1 = ftn::desc<ftnLinearParams_t>(), p2 = ftn::desc<ftnLinearParams_t>();
      FTN_CHECK(ftn_tp_mlp_get_params(mlp.get(), &p1, &p2));
      check_params(s, tag + "fc1", p1, row_block(w1, H, r * Fp, (r + 1) * Fp), row_block(b1, 1, r * Fp, (r + 1) * Fp));
      check_params(s, tag + "fc2", p2, col_block(w2, F, r * Fp, (r + 1) * Fp), b2);

      const int64_t rows = sp ? T / TP : T, r0 = sp ? r * rows : 0;
      auto xin = row_block(x, H, r0, r0 + rows), dyin = row_block(dy, H, r0, r0 + rows);
      std::vector<uint16_t> y(rows * H, 0xFFFF), dx(rows * H, 0xFFFF);
      // fc1 accumulates into an fp32 main_grad and fc2 stores bf16; swapped with sp
      GradBuffers g1(sp == 0, Fp * H, Fp), g2(sp != 0, H * Fp, H);
      auto d1 = g1.desc(), d2 = g2.desc();
      FTN_CHECK(ftn_tp_mlp_forward(mlp.get(), c, s.get(), xin.data(), y.data(), T));
      FTN_CHECK(ftn_tp_mlp_backward(mlp.get(), c, s.get(), xin.data(), dyin.data(), dx.data(), &d1, &d2, T));
      // the communicator's own stream: the host waits for it through an event
      ftn::Stream cs;
      FTN_CHECK(ftn_comm_get_stream(c, cs.out()));
      ftn::Event ev;
      FTN_CHECK(ftn_event_create(rk.ctx[r].get(), ev.out()));
      FTN_CHECK(ftn_event_record(ev.get(), cs.get()));
      FTN_CHECK(ftn_stream_wait_event(s.get(), ev.get()));
      finish(rk, r);
      FTN_CHECK(ftn_stream_synchronize(cs.get()));
      close_all(tag + "forward", floats(y), row_block(ref.y, H, r0, r0 + rows), 2e-2);
      close_all(tag + "grad_input", floats(dx), row_block(ref.dx, H, r0, r0 + rows), 3e-2);
      g1.check(tag + "fc1", row_block(ref.dw1, H, r * Fp, (r + 1) * Fp), row_block(ref.db1, 1, r * Fp, (r + 1) * Fp));
      g2.check(tag + "fc2", col_block(ref.dw2, F, r * Fp, (r + 1) * Fp), ref.db2);

      // a NULL fc1 gradient descriptor (rejected before any communication)
      try {
        ftn::check(ftn_tp_mlp_backward(mlp.get(), c, s.get(), xin.data(), dyin.data(), dx.data(), nullptr, &d2, T),
                   "mlp backward");
        expect(false, tag + "NULL fc1 grads accepted");
      } catch (const ftn::Error& e) {
        expect(error_names(e, "fc1"), tag + "error names fc1: " + e.what());
      }
    });
  }
}

// The same MLP built by hand: a column-parallel layer with a fused erf GeLU,
// then a row-parallel layer whose backward fuses the GeLU's backward
// (dgelu) and feeds the column backward with pre = NULL.
static void tp_column_row(const Ranks& rk) {
  const int64_t T = kTokens, H = kHidden, F = kFfn, Fp = kFfnShard;
  auto x = rand_bf16(T * H, 0.5f), w1 = rand_bf16(F * H, 0.5f), b1 = rand_bf16(F, 0.25f), w2 = rand_bf16(H * F, 0.12f),
       b2 = rand_bf16(H, 0.25f), dy = rand_bf16(T * H, 0.35f);
  const MlpReference ref =
      mlp_reference(T, H, F, widen(x), widen(w1), widen(b1), widen(w2), widen(b2), widen(dy), true);
  for (int sp = 0; sp <= 1; sp++) {
    on_ranks("column + row parallel sp=" + std::to_string(sp), [&](int r) {
      const ftn::Stream& s = rk.stream[r];
      ftnComm_t c = rk.comm[r].get();
      const std::string tag = "rank " + std::to_string(r) + " column+row sp=" + std::to_string(sp) + " ";
      auto cd = ftn::desc<ftnColumnParallelLinearDesc_t>();
      cd.dtype = ftnBfloat16;
      cd.bias = 1;
      cd.in_features = H;
      cd.out_features = F;
      cd.sequence_parallel = sp;
      cd.activation = ftnActivationGeluErf;
      cd.serialize_comm = sp;  // overlapped without sequence parallelism, serialised with it
      auto rd = ftn::desc<ftnRowParallelLinearDesc_t>();
      rd.dtype = ftnBfloat16;
      rd.bias = 1;
      rd.in_features = F;
      rd.out_features = H;
      rd.input_is_parallel = 1;
      rd.sequence_parallel = sp;
      rd.serialize_comm = sp;
      ftn::ColumnParallelLinear col;
      ftn::RowParallelLinear row;
      FTN_CHECK(ftn_column_parallel_linear_create(c, &cd, w1.data(), b1.data(), col.out()));
      FTN_CHECK(ftn_row_parallel_linear_create(c, &rd, w2.data(), b2.data(), row.out()));
      auto pc = ftn::desc<ftnLinearParams_t>(), pr = ftn::desc<ftnLinearParams_t>();
      FTN_CHECK(ftn_column_parallel_linear_get_params(col.get(), &pc));
      FTN_CHECK(ftn_row_parallel_linear_get_params(row.get(), &pr));
      check_params(s, tag + "column", pc, row_block(w1, H, r * Fp, (r + 1) * Fp), row_block(b1, 1, r * Fp, (r + 1) * Fp));
      check_params(s, tag + "row", pr, col_block(w2, F, r * Fp, (r + 1) * Fp), b2);

      const int64_t rows = sp ? T / TP : T, r0 = sp ? r * rows : 0;
      auto xin = row_block(x, H, r0, r0 + rows), dyin = row_block(dy, H, r0, r0 + rows);
      std::vector<uint16_t> h(T * Fp, 0xFFFF), pre(T * Fp, 0xFFFF), y(rows * H, 0xFFFF), dpre(T * Fp, 0xFFFF),
          dx(rows * H, 0xFFFF);
      // a fused activation needs `pre` (rejected before any communication)
      try {
        ftn::check(ftn_column_parallel_linear_forward(col.get(), c, s.get(), xin.data(), h.data(), nullptr, T),
                   "column forward");
        expect(false, tag + "column forward without pre accepted");
      } catch (const ftn::Error& e) {
        expect(error_names(e, "pre"), tag + "error names pre: " + e.what());
      }
      GradBuffers gc(sp == 0, Fp * H, Fp), gr(sp != 0, H * Fp, H);
      auto dc = gc.desc(), dr = gr.desc();
      FTN_CHECK(ftn_column_parallel_linear_forward(col.get(), c, s.get(), xin.data(), h.data(), pre.data(), T));
      FTN_CHECK(ftn_row_parallel_linear_forward(row.get(), c, s.get(), h.data(), y.data(), T));
      FTN_CHECK(ftn_row_parallel_linear_backward(row.get(), c, s.get(), h.data(), dyin.data(), ftnActivationGeluErf,
                                                 pre.data(), dpre.data(), &dr, T));
      FTN_CHECK(ftn_column_parallel_linear_backward(col.get(), c, s.get(), xin.data(), dpre.data(), nullptr, dx.data(),
                                                    &dc, T));
      finish(rk, r);
      close_all(tag + "column pre-activation", floats(pre), col_block(ref.pre, F, r * Fp, (r + 1) * Fp), 2e-2);
      close_all(tag + "column output (erf gelu)", floats(h), col_block(ref.h, F, r * Fp, (r + 1) * Fp), 2e-2);
      close_all(tag + "forward", floats(y), row_block(ref.y, H, r0, r0 + rows), 2e-2);
      close_all(tag + "row grad_input through dgelu", floats(dpre), col_block(ref.dpre, F, r * Fp, (r + 1) * Fp), 3e-2);
      close_all(tag + "grad_input", floats(dx), row_block(ref.dx, H, r0, r0 + rows), 3e-2);
      gc.check(tag + "column", row_block(ref.dw1, H, r * Fp, (r + 1) * Fp), row_block(ref.db1, 1, r * Fp, (r + 1) * Fp));
      gr.check(tag + "row", col_block(ref.dw2, F, r * Fp, (r + 1) * Fp), ref.db2);
    });
  }
}

// The attention block's forward (bf16) and its parameter shards.
static void tp_attention(const Ranks& rk) {
  const int64_t seq = 4, batch = 2, heads = 2, hd = 8, H = kHidden, T = seq * batch, Q3 = 3 * heads * hd, hp = heads / TP;
  auto x = rand_bf16(T * H, 0.5f), wqkv = rand_bf16(Q3 * H, 0.35f), bqkv = rand_bf16(Q3, 0.25f),
       wo = rand_bf16(H * heads * hd, 0.15f), bo = rand_bf16(H, 0.25f);
  // QKV rows ordered (head, {q,k,v}, dim); token row i*batch + b.
  auto qkv = linear(widen(x), widen(wqkv), widen(bqkv), T, H, Q3);
  std::vector<double> ctxv(T * heads * hd, 0.0);
  for (int64_t b = 0; b < batch; b++)
    for (int64_t n = 0; n < heads; n++)
      for (int64_t i = 0; i < seq; i++) {
        const double* q = &qkv[(i * batch + b) * Q3 + n * 3 * hd];
        std::vector<double> sc(i + 1);
        double mx = -INFINITY, sum = 0;
        for (int64_t k = 0; k <= i; k++) {
          const double* kk = &qkv[(k * batch + b) * Q3 + n * 3 * hd + hd];
          double dot = 0;
          for (int64_t j = 0; j < hd; j++) dot += q[j] * kk[j];
          sc[k] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::fmax(mx, sc[k]);
        }
        for (auto& v : sc) sum += (v = std::exp(v - mx));
        for (int64_t k = 0; k <= i; k++) {
          const double* vv = &qkv[(k * batch + b) * Q3 + n * 3 * hd + 2 * hd];
          for (int64_t j = 0; j < hd; j++) ctxv[(i * batch + b) * heads * hd + n * hd + j] += sc[k] / sum * vv[j];
        }
      }
  const auto want = linear(ctxv, widen(wo), widen(bo), T, heads * hd, H);
  on_ranks("tp attention", [&](int r) {
    const ftn::Stream& s = rk.stream[r];
    ftnComm_t c = rk.comm[r].get();
    const std::string tag = "rank " + std::to_string(r) + " tp_attention ";
    auto d = ftn::desc<ftnTpAttentionDesc_t>();
    d.dtype = ftnBfloat16;
    d.hidden = H;
    d.heads = heads;
    d.head_dim = hd;
    ftn::TpAttention att;
    FTN_CHECK(ftn_tp_attention_create(c, &d, wqkv.data(), bqkv.data(), wo.data(), bo.data(), att.out()));
    auto pq = ftn::desc<ftnLinearParams_t>(), po = ftn::desc<ftnLinearParams_t>();
    FTN_CHECK(ftn_tp_attention_get_params(att.get(), &pq, &po));
    const int64_t q0 = r * 3 * hp * hd, q1 = (r + 1) * 3 * hp * hd;  // whole heads
    check_params(s, tag + "qkv", pq, row_block(wqkv, H, q0, q1), row_block(bqkv, 1, q0, q1));
    check_params(s, tag + "proj", po, col_block(wo, heads * hd, r * hp * hd, (r + 1) * hp * hd), bo);
    std::vector<uint16_t> y(T * H, 0xFFFF);
    FTN_CHECK(ftn_tp_attention_forward(att.get(), c, s.get(), x.data(), y.data(), seq, batch));
    finish(rk, r);
    close_all(tag + "forward", floats(y), want, 2e-2);
  });
}

// Vocab-parallel cross-entropy (fp32 logits, int64 labels), label smoothing
// 0 (gradient into its own buffer) and 0.1 (gradient in place of the logits).
static void tp_cross_entropy(const Ranks& rk) {
  const int64_t T = kTokens, Vs = 32, V = TP * Vs;
  auto logits = rand_vec(T * V);
  for (auto& v : logits) v *= 2.0f;
  std::vector<int64_t> labels(T);
  std::uniform_int_distribution<int64_t> pick(0, V - 1);
  for (auto& l : labels) l = pick(rng);
  const auto dloss = rand_vec(T);
  const int64_t kIgnore = -100;  // PyTorch's default ignore_index
  for (int k = 0; k < 4; k++) {
    const int ignore = k / 2;
    const float eps = k % 2 ? 0.1f : 0.0f;
    const double e = eps;
    auto lab = labels;
    if (ignore) lab[1] = lab[T - 2] = kIgnore;
    std::vector<double> wl(T, 0.0), wg(T * V, 0.0);
    for (int64_t t = 0; t < T; t++) {
      if (lab[t] == kIgnore) continue;  // ignored: loss 0, gradient row 0
      const float* xr = &logits[t * V];
      double mx = -INFINITY, sum = 0, mean = 0;
      for (int64_t v = 0; v < V; v++) mx = std::fmax(mx, static_cast<double>(xr[v]));
      for (int64_t v = 0; v < V; v++) sum += std::exp(xr[v] - mx);
      for (int64_t v = 0; v < V; v++) mean += xr[v];
      mean /= V;
      const double lse = mx + std::log(sum);
      wl[t] = (1 - e) * (lse - xr[lab[t]]) + e * (lse - mean);
      for (int64_t v = 0; v < V; v++)
        wg[t * V + v] = dloss[t] * (std::exp(xr[v] - lse) - (1 - e) * (v == lab[t] ? 1.0 : 0.0) - e / V);
    }
    const std::string name = "cross-entropy eps=" + std::to_string(eps) + (ignore ? " ignore_index=-100" : "");
    on_ranks(name, [&](int r) {
      const ftn::Stream& s = rk.stream[r];
      ftnComm_t c = rk.comm[r].get();
      const std::string tag = "rank " + std::to_string(r) + " " + name + " ";
      const bool in_place = eps > 0;
      auto d = ftn::desc<ftnCrossEntropyDesc_t>();
      d.dtype = ftnFloat32;
      d.label_dtype = ftnInt64;
      d.tokens = T;
      d.shard_vocab = Vs;
      d.label_smoothing = eps;
      d.has_ignore_index = ignore;
      d.ignore_index = kIgnore;
      auto shard = col_block(logits, V, r * Vs, (r + 1) * Vs);
      std::vector<float> loss(T, NAN), grad(T * Vs, NAN);
      ftn::CrossEntropySaved saved;
      FTN_CHECK(ftn_vocab_parallel_cross_entropy_forward(&d, c, s.get(), shard.data(), lab.data(), loss.data(),
                                                         saved.out()));
      FTN_CHECK(ftn_vocab_parallel_cross_entropy_backward(&d, c, s.get(), shard.data(), lab.data(), saved.get(),
                                                          dloss.data(), in_place ? shard.data() : grad.data()));
      finish(rk, r);
      close_all(tag + "loss", loss, wl, 1e-5);
      close_all(tag + (in_place ? "grad (in place)" : "grad"), in_place ? shard : grad,
                col_block(wg, V, r * Vs, (r + 1) * Vs), 1e-5);
    });
  }
}

// Mappings on int32 data (exact): gather_from_sp (all-gather rows; backward
// reduce-scatter rows) and scatter_to_tp (split columns; backward all-gather
// columns), sized with ftn_tp_mapping_shape.
static void tp_mappings(const Ranks& rk) {
  const int64_t rows = 4, cols = 3, srows = 4, scols = 6;
  int64_t fr = -1, fc = -1, br = -1, bc = -1;
  FTN_CHECK(ftn_tp_mapping_shape(ftnGatherFromSp, 0, rows, cols, TP, &fr, &fc));
  FTN_CHECK(ftn_tp_mapping_shape(ftnGatherFromSp, 1, fr, fc, TP, &br, &bc));
  const bool gather_ok = fr == TP * rows && fc == cols && br == rows && bc == cols;
  expect(gather_ok, "gather_from_sp shapes");
  int64_t sfr = -1, sfc = -1, sbr = -1, sbc = -1;
  FTN_CHECK(ftn_tp_mapping_shape(ftnScatterToTp, 0, srows, scols, TP, &sfr, &sfc));
  FTN_CHECK(ftn_tp_mapping_shape(ftnScatterToTp, 1, sfr, sfc, TP, &sbr, &sbc));
  const bool scatter_ok = sfr == srows && sfc == scols / TP && sbr == srows && sbc == scols;
  expect(scatter_ok, "scatter_to_tp shapes");
  if (!gather_ok || !scatter_ok) return;
  // element i of tensor k on rank r
  auto val = [](int k, int r, int64_t i) { return static_cast<int32_t>(100000 * k + 1000 * (r + 1) + 7 * i); };
  on_ranks("tp mappings", [&](int r) {
    const ftn::Stream& s = rk.stream[r];
    ftnComm_t c = rk.comm[r].get();
    const std::string tag = "rank " + std::to_string(r) + " ";
    std::vector<int32_t> in(rows * cols), out(fr * fc, -1), go(fr * fc), gi(br * bc, -1);
    for (int64_t i = 0; i < rows * cols; i++) in[i] = val(0, r, i);
    for (int64_t i = 0; i < fr * fc; i++) go[i] = val(1, r, i);
    std::vector<int32_t> sin(srows * scols), sout(sfr * sfc, -1), sgo(sfr * sfc), sgi(sbr * sbc, -1);
    for (int64_t i = 0; i < srows * scols; i++) sin[i] = val(2, 0, i);  // replicated
    for (int64_t i = 0; i < sfr * sfc; i++) sgo[i] = val(3, r, i);
    FTN_CHECK(ftn_tp_mapping_forward(ftnGatherFromSp, in.data(), out.data(), rows, cols, ftnInt32, c, s.get()));
    FTN_CHECK(ftn_tp_mapping_backward(ftnGatherFromSp, go.data(), gi.data(), fr, fc, ftnInt32, c, s.get()));
    FTN_CHECK(ftn_tp_mapping_forward(ftnScatterToTp, sin.data(), sout.data(), srows, scols, ftnInt32, c, s.get()));
    FTN_CHECK(ftn_tp_mapping_backward(ftnScatterToTp, sgo.data(), sgi.data(), sfr, sfc, ftnInt32, c, s.get()));
    finish(rk, r);
    std::vector<int32_t> want_out(fr * fc), want_gi(br * bc, 0), want_sout(sfr * sfc), want_sgi(sbr * sbc);
    for (int q = 0; q < TP; q++)
      for (int64_t i = 0; i < rows * cols; i++) {
        want_out[q * rows * cols + i] = val(0, q, i);
        want_gi[i] += val(1, q, r * rows * cols + i);
      }
    for (int64_t i = 0; i < srows; i++)
      for (int64_t j = 0; j < sfc; j++) {
        want_sout[i * sfc + j] = sin[i * scols + r * sfc + j];
        for (int q = 0; q < TP; q++) want_sgi[i * scols + q * sfc + j] = val(3, q, i * sfc + j);
      }
    expect(out == want_out, tag + "gather_from_sp forward (all-gather rows)");
    expect(gi == want_gi, tag + "gather_from_sp backward (reduce-scatter rows)");
    expect(sout == want_sout, tag + "scatter_to_tp forward (split columns)");
    expect(sgi == want_sgi, tag + "scatter_to_tp backward (all-gather columns)");
  });
}

// ---- optimizer, data parallelism, memory accounting ----

// The double-precision AdamW reference (docs/semantics.md): step t, decoupled
// weight decay `wd`.
static void adamw_ref(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                      const std::vector<double>& g, double lr, int t, double b1, double b2, double eps, double wd) {
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  for (size_t i = 0; i < p.size(); i++) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    p[i] -= lr * ((m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wd * p[i]);
  }
}

static std::vector<double> doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// One fused AdamW step over two tensors (a 2-D weight with a bf16 model copy
// and weight decay, a 1-D bias with an fp32 copy and none, as
// ftn_adam_default_weight_decay says), the gradients unscaled by a device
// inv_scale; then a step with found_inf set changes nothing.
static void adam_step(const ftn::Context& ctx, const ftn::Stream& s) {
  auto cfg = ftn::desc<ftnAdamConfig_t>();
  FTN_CHECK(ftn_adam_config_default(&cfg));
  expect(cfg.beta1 == 0.9f && cfg.beta2 == 0.999f && cfg.eps == 1e-8f && cfg.mode == ftnAdamDecoupled,
         "adam defaults");
  ftn::Adam adam;
  FTN_CHECK(ftn_adam_create(ctx.get(), &cfg, adam.out()));
  const size_t nw = 48, nb = 6;
  const int64_t ndims[2] = {2, 1};
  float wd[2] = {NAN, NAN};
  FTN_CHECK(ftn_adam_default_weight_decay(ndims, 2, 0.01f, wd));
  expect(wd[0] == 0.01f && wd[1] == 0.0f, "default weight decay: 2-D decays, 1-D does not");
  auto pw = rand_vec(nw), gw = rand_vec(nw), pb = rand_vec(nb), gb = rand_vec(nb);
  std::vector<float> mw(nw, 0.0f), vw(nw, 0.0f), mb(nb, 0.0f), vb(nb, 0.0f), modelb(nb, NAN);
  std::vector<uint16_t> modelw(nw, 0xFFFF);
  std::vector<double> rpw = doubles(pw), rpb = doubles(pb), rmw(nw, 0), rvw(nw, 0), rmb(nb, 0), rvb(nb, 0);
  const float inv = 0.25f;
  std::vector<double> rgw(nw), rgb(nb);
  for (size_t i = 0; i < nw; i++) rgw[i] = static_cast<double>(gw[i]) * inv;
  for (size_t i = 0; i < nb; i++) rgb[i] = static_cast<double>(gb[i]) * inv;
  ftnAdamTensor_t t[2];
  std::memset(t, 0, sizeof t);
  t[0].param = pw.data(), t[0].exp_avg = mw.data(), t[0].exp_avg_sq = vw.data(), t[0].grad = gw.data();
  t[0].model = modelw.data(), t[0].numel = nw, t[0].grad_dtype = ftnFloat32, t[0].model_dtype = ftnBfloat16;
  t[0].weight_decay = wd[0];
  t[1].param = pb.data(), t[1].exp_avg = mb.data(), t[1].exp_avg_sq = vb.data(), t[1].grad = gb.data();
  t[1].model = modelb.data(), t[1].numel = nb, t[1].grad_dtype = ftnFloat32, t[1].model_dtype = ftnFloat32;
  t[1].weight_decay = wd[1];
  auto d = ftn::desc<ftnAdamStepDesc_t>();
  d.num_tensors = 2;
  // emulator: the "device" scalars are host memory
  float lr = 1e-2f, dinv = inv, found = 0.0f;
  int32_t step = 0;
  FTN_CHECK(ftn_adam_step(s.get(), adam.get(), &d, t, &lr, &step, &dinv, nullptr, &found));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  expect(step == 1, "adam step count " + std::to_string(step));
  adamw_ref(rpw, rmw, rvw, rgw, 1e-2, 1, 0.9, 0.999, 1e-8, 0.01);
  adamw_ref(rpb, rmb, rvb, rgb, 1e-2, 1, 0.9, 0.999, 1e-8, 0.0);
  close_all("adamw weight (fp32 master)", pw, rpw, 1e-5);
  close_all("adamw weight exp_avg", mw, rmw, 1e-5);
  close_all("adamw weight exp_avg_sq", vw, rvw, 1e-5);
  close_all("adamw weight bf16 model copy", floats(modelw), rpw, 1e-2);
  close_all("adamw bias", pb, rpb, 1e-5);
  close_all("adamw bias fp32 model copy", modelb, rpb, 1e-5);
  // an overflowing step writes nothing and does not advance the count
  const auto before = pw;
  found = 1.0f;
  FTN_CHECK(ftn_adam_step(s.get(), adam.get(), &d, t, &lr, &step, &dinv, nullptr, &found));
  FTN_CHECK(ftn_stream_synchronize(s.get()));
  expect(step == 1 && pw == before, "a step with found_inf set is skipped");
  // bad input: an exception naming the argument, nothing enqueued
  try {
    t[1].numel = -1;
    FTN_CHECK(ftn_adam_step(s.get(), adam.get(), &d, t, &lr, &step, nullptr, nullptr, nullptr));
    expect(false, "adam: negative numel accepted");
  } catch (const ftn::Error& e) {
    expect(error_names(e, "tensors[i].numel") && std::string(e.what()).find("tensor 1") != std::string::npos,
           std::string("adam error names tensors[i].numel of tensor 1: ") + e.what());
  }
}

// dp = 2 (one thread per rank): DDP with the distributed optimizer over a
// bf16 weight and an fp32 bias, several buckets, two steps; every rank must
// end with the parameters of AdamW on the mean gradients. Then plain DDP
// (no parameter buffer) and the memory table.
static void ddp_distributed_optimizer() {
  Watchdog watchdog(120);
  Ranks rk(TP);  // TP = 2 ranks, used here as the data-parallel group
  const int64_t rows = 6, cols = 5, nw = rows * cols, nb = 7;
  ftn::ParamRegistry reg;
  FTN_CHECK(ftn_param_registry_create(reg.out()));
  const int64_t wshape[2] = {rows, cols}, bshape[1] = {nb};
  int64_t wid = -1, bid = -1;
  FTN_CHECK(ftn_param_registry_register(reg.get(), "fc.weight", wshape, 2, ftnBfloat16, ftnFloat32, &wid));
  FTN_CHECK(ftn_param_registry_register(reg.get(), "fc.bias", bshape, 1, ftnFloat32, ftnFloat32, &bid));
  expect(wid == 0 && bid == 1, "parameter ids in registration order");
  std::vector<uint16_t> w0(nw);
  for (auto& x : w0) x = to_bf16(rand_vec(1)[0]);
  const auto b0 = rand_vec(nb);
  const int steps = 2;
  // grads[step][rank]
  std::vector<std::vector<std::vector<float>>> gw(steps), gb(steps);
  for (int st = 0; st < steps; st++)
    for (int r = 0; r < TP; r++) {
      gw[st].push_back(rand_vec(nw));
      gb[st].push_back(rand_vec(nb));
    }
  std::vector<std::vector<uint16_t>> got_w(TP);
  std::vector<std::vector<float>> got_b(TP);
  std::vector<int32_t> got_step(TP, -1);
  const float lr = 0.05f, wdecay = 0.1f;
  on_ranks("ddp + distributed optimizer", [&](int r) {
    const ftn::Stream& s = rk.stream[r];
    auto cfg = ftn::desc<ftnDdpConfig_t>();
    cfg.bucket_size = 8;  // several buckets
    cfg.distributed_optimizer = 1;
    cfg.averaging = ftnGradPreScale;
    ftn::Ddp ddp;
    FTN_CHECK(ftn_ddp_create(rk.comm[r].get(), reg.get(), &cfg, ddp.out()));
    void *pw = nullptr, *pb = nullptr, *dw = nullptr, *db = nullptr;
    FTN_CHECK(ftn_ddp_get_param(ddp.get(), wid, &pw));
    FTN_CHECK(ftn_ddp_get_param(ddp.get(), bid, &pb));
    FTN_CHECK(ftn_ddp_get_grad(ddp.get(), wid, &dw));
    FTN_CHECK(ftn_ddp_get_grad(ddp.get(), bid, &db));
    FTN_CHECK(ftn_memcpy_htod(s.get(), pw, w0.data(), nw * sizeof(uint16_t)));
    FTN_CHECK(ftn_memcpy_htod(s.get(), pb, b0.data(), nb * sizeof(float)));
    FTN_CHECK(ftn_stream_synchronize(s.get()));
    auto oc = ftn::desc<ftnDistOptConfig_t>();
    oc.beta1 = 0.9f, oc.beta2 = 0.999f, oc.eps = 1e-8f, oc.mode = ftnAdamDecoupled;
    oc.weight_decay = wdecay;
    oc.max_grad_norm = 0.0;  // no clipping
    ftn::DistOpt opt;
    FTN_CHECK(ftn_dist_opt_create(ddp.get(), &oc, opt.out()));
    float dlr = lr;  // emulator: device scalars are host memory
    int32_t step = 0;
    for (int st = 0; st < steps; st++) {
      FTN_CHECK(ftn_ddp_zero_grad_buffer(ddp.get(), s.get()));
      FTN_CHECK(ftn_ddp_set_is_last_microbatch(ddp.get(), 1));
      // backward, last layer first: the bias's gradient, then the weight's
      FTN_CHECK(ftn_memcpy_htod(s.get(), db, gb[st][r].data(), nb * sizeof(float)));
      FTN_CHECK(ftn_ddp_mark_grad_ready(ddp.get(), s.get(), bid));
      FTN_CHECK(ftn_memcpy_htod(s.get(), dw, gw[st][r].data(), nw * sizeof(float)));
      FTN_CHECK(ftn_ddp_mark_grad_ready(ddp.get(), s.get(), wid));
      FTN_CHECK(ftn_ddp_finish_grad_sync(ddp.get(), s.get()));
      FTN_CHECK(ftn_dist_opt_step(opt.get(), ddp.get(), s.get(), &dlr, &step, nullptr, nullptr));
      FTN_CHECK(ftn_stream_synchronize(s.get()));
    }
    got_step[r] = step;
    got_w[r] = to_host<uint16_t>(s, pw, nw);
    got_b[r] = to_host<float>(s, pb, nb);
    // the communicator refuses to go while the DDP uses it
    const ftnResult_t busy = ftn_comm_destroy(rk.comm[r].get());
    expect(busy == ftnInvalidArgument, "rank " + std::to_string(r) + ": comm destroyed under a live DDP");
    opt.reset();  // the optimizer before its DDP
  });
  std::vector<double> pw(nw), pb(b0.begin(), b0.end()), mw(nw, 0), vw(nw, 0), mb(nb, 0), vb(nb, 0);
  for (int64_t i = 0; i < nw; i++) pw[i] = from_bf16(w0[i]);
  for (int st = 0; st < steps; st++) {
    std::vector<double> meanw(nw), meanb(nb);
    for (int64_t i = 0; i < nw; i++) meanw[i] = 0.5 * (static_cast<double>(gw[st][0][i]) + gw[st][1][i]);
    for (int64_t i = 0; i < nb; i++) meanb[i] = 0.5 * (static_cast<double>(gb[st][0][i]) + gb[st][1][i]);
    adamw_ref(pw, mw, vw, meanw, lr, st + 1, 0.9, 0.999, 1e-8, wdecay);  // 2-D: decays
    adamw_ref(pb, mb, vb, meanb, lr, st + 1, 0.9, 0.999, 1e-8, 0.0);     // 1-D: no decay
  }
  for (int r = 0; r < TP; r++) {
    const std::string tag = "rank " + std::to_string(r) + " distributed optimizer ";
    expect(got_step[r] == steps, tag + "step count " + std::to_string(got_step[r]));
    close_all(tag + "weight (bf16, all-gathered)", floats(got_w[r]), pw, 1e-2);
    close_all(tag + "bias (fp32, all-gathered)", got_b[r], pb, 1e-5);
    expect(got_w[r] == got_w[0] && got_b[r] == got_b[0], tag + "parameters equal rank 0's bitwise");
  }

  // plain DDP: no parameter buffer, an error naming the handle
  on_ranks("plain ddp", [&](int r) {
    auto cfg = ftn::desc<ftnDdpConfig_t>();
    ftn::Ddp ddp;
    FTN_CHECK(ftn_ddp_create(rk.comm[r].get(), reg.get(), &cfg, ddp.out()));
    void* p = nullptr;
    try {
      FTN_CHECK(ftn_ddp_get_param(ddp.get(), wid, &p));
      expect(false, "plain DDP handed out a parameter buffer");
    } catch (const ftn::Error& e) {
      expect(error_names(e, "ddp"), std::string("error names ddp: ") + e.what());
    }
  });
}

// Megatron's memory table from the consumer's own formula: param + grad
// bytes, an fp32 master copy unless the params are fp32, an fp32 main-grad
// copy unless the grads are fp32, fp32 Adam moments (8); the distributed
// optimizer divides the last three by dp.
static void memory_accounting() {
  struct Row {
    int p, g, pbytes, gbytes;
  };
  for (const Row& row : {Row{ftnBfloat16, ftnFloat32, 2, 4}, Row{ftnFloat16, ftnFloat16, 2, 2},
                         Row{ftnFloat32, ftnFloat32, 4, 4}}) {
    const double opt = (row.pbytes == 4 ? 0 : 4) + (row.gbytes == 4 ? 0 : 4) + 8;
    for (int dp : {1, 2, 3, 4, 8, 64}) {
      for (int dist : {0, 1}) {
        double got = -1;
        FTN_CHECK(ftn_ddp_bytes_per_param(row.p, row.g, dp, dist, &got));
        const double want = row.pbytes + row.gbytes + (dist ? opt / dp : opt);
        expect(std::fabs(got - want) < 1e-12, "bytes per param (dtypes " + std::to_string(row.p) + "/" +
                                                  std::to_string(row.g) + ", dp " + std::to_string(dp) +
                                                  ", distributed " + std::to_string(dist) + "): " +
                                                  std::to_string(got) + ", want " + std::to_string(want));
      }
    }
  }
  // the table's anchors (Megatron's docs)
  double b = 0;
  FTN_CHECK(ftn_ddp_bytes_per_param(ftnBfloat16, ftnFloat32, 1, 0, &b));
  expect(b == 18.0, "bf16/fp32 plain DDP: 18 bytes");
  FTN_CHECK(ftn_ddp_bytes_per_param(ftnFloat16, ftnFloat16, 4, 1, &b));
  expect(b == 8.0, "fp16/fp16 distributed dp 4: 4 + 16/4 bytes");
  try {
    FTN_CHECK(ftn_ddp_bytes_per_param(ftnBfloat16, ftnFloat32, 0, 1, &b));
    expect(false, "dp 0 accepted");
  } catch (const ftn::Error& e) {
    expect(error_names(e, "`dp`"), std::string("error names dp: ") + e.what());
  }
}

static void tensor_parallel() {
  Watchdog watchdog(120);
  Ranks rk(TP);
  tp_mlp(rk);
  tp_column_row(rk);
  tp_attention(rk);
  tp_cross_entropy(rk);
  tp_mappings(rk);
}

int main(int argc, char** argv) {
  if (argc > 1) g_seed = std::strtoull(argv[1], nullptr, 10);
  rng.seed(g_seed);
  try {
    int v = 0;
    FTN_CHECK(ftn_get_version(&v));
    expect(v == FTN_VERSION, "version");
    ftn::Context ctx = ftn::make_context(ftnBackendAuto);  // no GPU here: the emulator
    ftn::Stream s = ftn::make_stream(ctx);
    bias_gelu_bf16(s);
    norms(s, false);
    norms(s, true);
    softmax_causal(s);
    gemm_accumulate(s);
    multi_tensor_and_scaler(ctx, s);
    adam_step(ctx, s);
    collectives();
    tensor_parallel();
    ddp_distributed_optimizer();
    memory_accounting();
    // errors surface as exceptions carrying the status and the message
    try {
      auto d = ftn::desc<ftnBiasGeluDesc_t>();
      d.rows = -4;
      FTN_CHECK(ftn_bias_gelu_forward(s.get(), &d, nullptr, nullptr, nullptr));
      expect(false, "negative rows accepted");
    } catch (const ftn::Error& e) {
      expect(e.status == ftnInvalidArgument && std::string(e.what()).find("desc.rows") != std::string::npos,
             std::string("error names desc.rows: ") + e.what());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s [seed %llu]\n", e.what(), g_seed);
    return 1;
  }
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed [seed %llu]\n", g_failures, g_seed);
    return 1;
  }
  std::printf("C++ consumer: all checks passed [seed %llu]\n", g_seed);
  return 0;
}
