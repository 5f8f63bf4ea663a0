// A C++17 program that uses only include/ferrotron.h and libferrotron, with
// the handles wrapped in RAII types: runs every exposed op on the emulator
// (bf16 and fp32) and checks it against its own reference, including the
// tensor-parallel layers, blocks, mappings and cross-entropy on two ranks
// (one thread each) against double-precision references of its own.
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
    want_db[i % cols] += from_bf16(to_bf16(static_cast<float>(want_dx[i])));
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
    collectives();
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
