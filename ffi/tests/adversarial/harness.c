/* Adversarial C ABI suite: fixtures and the fork-per-case runner.
 *
 * The parent never calls the library: it forks one child per case (up to
 * ADV_JOBS at once), each child builds the fixtures it needs on a fresh
 * emulator context, makes one call and stores the status and last error in
 * shared memory. A child killed by a signal is a crash (a sanitizer report
 * too: it aborts), one still running after ADV_TIMEOUT seconds a hang.
 * Output, one line per case on stdout:
 *   R <index> <outcome> <status> <last error>      (tab-separated)
 * outcome: done | crash:<signal> | exit:<code> | hang | setup.
 * Env: ADV_JOBS (2), ADV_TIMEOUT (20), ADV_ONLY (one case index, run in
 * process: for a debugger), ADV_LIMIT (run only the first N cases),
 * ADV_LOGDIR (children's stderr, one file per slot), ADV_PLANT_* (below). */
#define _GNU_SOURCE
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG_BYTES 480

typedef struct {
  int done;
  int setup_failed;
  int status;
  char msg[MSG_BYTES];
} adv_record;

static adv_record *g_rec; /* this child's record */

static void setup_failed(const char *what, ftnResult_t r) {
  if (g_rec) {
    g_rec->setup_failed = 1;
    snprintf(g_rec->msg, MSG_BYTES, "fixture %s failed: %d %s", what, (int)r, ftn_get_last_error());
  }
  fprintf(stderr, "fixture %s failed: %d %s\n", what, (int)r, ftn_get_last_error());
  _exit(42);
}

#define FX_CHECK(what, call)                  \
  do {                                        \
    ftnResult_t r_ = (call);                  \
    if (r_ != ftnSuccess) setup_failed(what, r_); \
  } while (0)

void *adv_buf(void) {
  void *p = aligned_alloc(256, 65536);
  if (!p) setup_failed("adv_buf", ftnBackendError);
  memset(p, 0, 65536);
  return p;
}

void *adv_malloc(void) {
  void *p = NULL;
  FX_CHECK("ftn_malloc", ftn_malloc((ftnContext_t)fx(FX_ftnContext_t), &p, 65536));
  return p;
}

/* A valid DLPack 1.x tensor on the CPU: a DLManagedTensorVersioned
 * (declared here as its bytes: ferrotron.h takes it as void *) of 2 x 2
 * float32 elements with explicit compact strides {2, 1}, no deleter. The
 * generator's DLPACK_FIELDS (ffi/tests/adversarial.rs) use these offsets:
 * keep the two in step. */
void *adv_dlpack(void) {
  unsigned char *m = (unsigned char *)adv_buf();
  const int64_t shape_v[2] = {2, 2}, strides_v[2] = {2, 1};
  uint32_t major = 1;
  int32_t cpu = 1, ndim = 2;
  uint8_t code = 2, bits = 32;
  uint16_t lanes = 1;
  void *data = m + 1024;
  int64_t *shape = (int64_t *)(m + 512);
  int64_t *strides = (int64_t *)(m + 528);
  memcpy(shape, shape_v, sizeof shape_v);
  memcpy(strides, strides_v, sizeof strides_v);
  memcpy(m + 64, &strides, 8);      /* dl_tensor.strides */
  memcpy(m + 0, &major, 4);         /* version.major */
  memcpy(m + 32, &data, 8);         /* dl_tensor.data */
  memcpy(m + 40, &cpu, 4);          /* dl_tensor.device.device_type */
  memcpy(m + 48, &ndim, 4);         /* dl_tensor.ndim */
  memcpy(m + 52, &code, 1);         /* dl_tensor.dtype */
  memcpy(m + 53, &bits, 1);
  memcpy(m + 54, &lanes, 2);
  memcpy(m + 56, &shape, 8);        /* dl_tensor.shape; byte_offset 0 */
  return m;
}

void adv_field(void *base, size_t size, const adv_case *c) {
  unsigned char *b = (unsigned char *)base;
  uint64_t v = c->value;
  switch (c->width) {
  case 1: { uint8_t x = (uint8_t)v; memcpy(b + c->off, &x, 1); break; }
  case 2: { uint16_t x = (uint16_t)v; memcpy(b + c->off, &x, 2); break; }
  case 4: { uint32_t x = (uint32_t)v; memcpy(b + c->off, &x, 4); break; }
  default: memcpy(b + c->off, &v, 8); break;
  }
  if (c->tail) memset(b + size, 0xAB, c->tail);
}

/* ---- fixtures: one rank on one emulator context ---- */

static void *g_fx[FX_COUNT];

static void *fx_new(int kind) {
  switch (kind) {
  case FX_ftnContext_t: {
    ftnContext_t c = NULL;
    FX_CHECK("context", ftn_context_create(ftnBackendEmu, 0, &c));
    return c;
  }
  case FX_ftnStream_t: {
    ftnStream_t s = NULL;
    FX_CHECK("stream", ftn_stream_create((ftnContext_t)fx(FX_ftnContext_t), &s));
    return s;
  }
  case FX_ftnEvent_t: {
    ftnEvent_t e = NULL;
    FX_CHECK("event", ftn_event_create((ftnContext_t)fx(FX_ftnContext_t), &e));
    return e;
  }
  case FX_ftnComm_t: {
    ftnComm_t cm = NULL;
    ftnContext_t c = (ftnContext_t)fx(FX_ftnContext_t);
    FX_CHECK("communicator", ftn_comm_init_all(&cm, 1, &c));
    return cm;
  }
  case FX_ftnGradScaler_t: {
    ftnGradScalerConfig_t cfg;
    ftnGradScaler_t g = NULL;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    FX_CHECK("grad scaler config", ftn_grad_scaler_config_default(&cfg));
    FX_CHECK("grad scaler", ftn_grad_scaler_create((ftnContext_t)fx(FX_ftnContext_t), &cfg, NULL, &g));
    return g;
  }
  case FX_ftnColumnParallelLinear_t: {
    ftnColumnParallelLinearDesc_t d;
    ftnColumnParallelLinear_t l = NULL;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.dtype = ftnBfloat16;
    d.bias = 1;
    d.in_features = 4;
    d.out_features = 4;
    d.activation = ftnActivationGeluTanh; /* so that `pre` is required */
    FX_CHECK("column-parallel linear",
             ftn_column_parallel_linear_create((ftnComm_t)fx(FX_ftnComm_t), &d, adv_buf(), adv_buf(), &l));
    return l;
  }
  case FX_ftnRowParallelLinear_t: {
    ftnRowParallelLinearDesc_t d;
    ftnRowParallelLinear_t l = NULL;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.dtype = ftnBfloat16;
    d.bias = 1;
    d.in_features = 4;
    d.out_features = 4;
    d.input_is_parallel = 1; /* so that a fused dgelu is allowed */
    FX_CHECK("row-parallel linear",
             ftn_row_parallel_linear_create((ftnComm_t)fx(FX_ftnComm_t), &d, adv_buf(), adv_buf(), &l));
    return l;
  }
  case FX_ftnTpMlp_t: {
    ftnTpMlpDesc_t d;
    ftnTpMlp_t m = NULL;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.dtype = ftnBfloat16;
    d.gelu = ftnGeluTanh;
    d.hidden = 4;
    d.ffn = 4;
    FX_CHECK("tp mlp", ftn_tp_mlp_create((ftnComm_t)fx(FX_ftnComm_t), &d, adv_buf(), adv_buf(), adv_buf(),
                                         adv_buf(), &m));
    return m;
  }
  case FX_ftnTpAttention_t: {
    ftnTpAttentionDesc_t d;
    ftnTpAttention_t a = NULL;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.dtype = ftnBfloat16;
    d.hidden = 4;
    d.heads = 1;
    d.head_dim = 4;
    FX_CHECK("tp attention", ftn_tp_attention_create((ftnComm_t)fx(FX_ftnComm_t), &d, adv_buf(), adv_buf(),
                                                     adv_buf(), adv_buf(), &a));
    return a;
  }
  case FX_ftnCrossEntropySaved_t: {
    ftnCrossEntropyDesc_t d;
    ftnCrossEntropySaved_t s = NULL;
    memset(&d, 0, sizeof d);
    d.size = sizeof d;
    d.dtype = ftnFloat32;
    d.label_dtype = ftnInt32;
    d.tokens = 4;
    d.shard_vocab = 4;
    d.ignore_index = -100; /* as the generated descriptors (adversarial.rs OVERRIDES) */
    d.has_ignore_index = 1;
    FX_CHECK("cross-entropy saved",
             ftn_vocab_parallel_cross_entropy_forward(&d, (ftnComm_t)fx(FX_ftnComm_t),
                                                      (ftnStream_t)fx(FX_ftnStream_t), adv_buf(), adv_buf(),
                                                      (float *)adv_buf(), &s));
    return s;
  }
  case FX_ftnAdam_t: {
    ftnAdamConfig_t cfg;
    ftnAdam_t a = NULL;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    FX_CHECK("adam config", ftn_adam_config_default(&cfg));
    FX_CHECK("adam", ftn_adam_create((ftnContext_t)fx(FX_ftnContext_t), &cfg, &a));
    return a;
  }
  case FX_ftnParamRegistry_t: {
    /* two parameters: ids 0 (a [4, 4] weight) and 1 (a [4] bias) */
    ftnParamRegistry_t r = NULL;
    int64_t w[2] = {4, 4}, b[1] = {4}, id = -1;
    FX_CHECK("param registry", ftn_param_registry_create(&r));
    FX_CHECK("param registry weight", ftn_param_registry_register(r, "w", w, 2, ftnFloat32, ftnFloat32, &id));
    FX_CHECK("param registry bias", ftn_param_registry_register(r, "b", b, 1, ftnBfloat16, ftnFloat32, &id));
    return r;
  }
  case FX_ftnDdp_t: {
    /* over the one-rank communicator; with the distributed optimizer (so
     * that ftn_ddp_get_param and ftn_dist_opt_create have one) */
    ftnDdpConfig_t cfg;
    ftnDdp_t d = NULL;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    cfg.distributed_optimizer = 1;
    cfg.averaging = ftnGradPreScale;
    FX_CHECK("ddp", ftn_ddp_create((ftnComm_t)fx(FX_ftnComm_t), (ftnParamRegistry_t)fx(FX_ftnParamRegistry_t),
                                   &cfg, &d));
    return d;
  }
  case FX_ftnDistOpt_t: {
    ftnDistOptConfig_t cfg;
    ftnDistOpt_t o = NULL;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    cfg.beta1 = 0.9f;
    cfg.beta2 = 0.999f;
    cfg.eps = 1e-8f;
    cfg.mode = ftnAdamDecoupled;
    cfg.weight_decay = 0.01f;
    cfg.max_grad_norm = 1.0;
    FX_CHECK("distributed optimizer", ftn_dist_opt_create((ftnDdp_t)fx(FX_ftnDdp_t), &cfg, &o));
    return o;
  }
  default:
    setup_failed("unknown fixture kind", ftnInternalError);
    return NULL;
  }
}

static ftnResult_t fx_destroy(int kind, void *h) {
  switch (kind) {
  case FX_ftnContext_t: return ftn_context_destroy((ftnContext_t)h);
  case FX_ftnStream_t: return ftn_stream_destroy((ftnStream_t)h);
  case FX_ftnEvent_t: return ftn_event_destroy((ftnEvent_t)h);
  case FX_ftnComm_t: return ftn_comm_destroy((ftnComm_t)h);
  case FX_ftnGradScaler_t: return ftn_grad_scaler_destroy((ftnGradScaler_t)h);
  case FX_ftnColumnParallelLinear_t: return ftn_column_parallel_linear_destroy((ftnColumnParallelLinear_t)h);
  case FX_ftnRowParallelLinear_t: return ftn_row_parallel_linear_destroy((ftnRowParallelLinear_t)h);
  case FX_ftnTpMlp_t: return ftn_tp_mlp_destroy((ftnTpMlp_t)h);
  case FX_ftnTpAttention_t: return ftn_tp_attention_destroy((ftnTpAttention_t)h);
  case FX_ftnCrossEntropySaved_t: return ftn_cross_entropy_saved_destroy((ftnCrossEntropySaved_t)h);
  case FX_ftnAdam_t: return ftn_adam_destroy((ftnAdam_t)h);
  case FX_ftnParamRegistry_t: return ftn_param_registry_destroy((ftnParamRegistry_t)h);
  case FX_ftnDdp_t: return ftn_ddp_destroy((ftnDdp_t)h);
  case FX_ftnDistOpt_t: return ftn_dist_opt_destroy((ftnDistOpt_t)h);
  default: return ftnInternalError;
  }
}

void *fx(int kind) {
  if (kind < 0 || kind >= FX_COUNT) setup_failed("fixture kind", ftnInternalError);
  if (!g_fx[kind]) g_fx[kind] = fx_new(kind);
  return g_fx[kind];
}

void adv_ddp_grads_ready(int finish) {
  ftnDdp_t d = (ftnDdp_t)fx(FX_ftnDdp_t);
  ftnStream_t s = (ftnStream_t)fx(FX_ftnStream_t);
  FX_CHECK("ddp: marking parameter 1 ready", ftn_ddp_mark_grad_ready(d, s, 1));
  FX_CHECK("ddp: marking parameter 0 ready", ftn_ddp_mark_grad_ready(d, s, 0));
  if (finish) FX_CHECK("ddp: finishing the gradient sync", ftn_ddp_finish_grad_sync(d, s));
}

void *fx_bad(int kind, uint64_t how) {
  if (how == 1) { /* stale: a real handle of this kind, destroyed */
    void *h = fx_new(kind);
    FX_CHECK("destroying the stale fixture", fx_destroy(kind, h));
    return h;
  }
  if (how == 2) return fx((kind + 1) % FX_COUNT); /* live, of another kind */
  return (void *)(uintptr_t)0x7ffd1230u;          /* never issued */
}

/* ---- runner ---- */

/* The index in environment variable `name`, or -1. */
static long env_index(const char *name) {
  const char *v = getenv(name);
  return v ? atol(v) : -1;
}

/* Planted faults, for the suite's check of its own runner: case
 * ADV_PLANT_CRASH dies of SIGSEGV, ADV_PLANT_HANG never returns,
 * ADV_PLANT_ASAN writes past a heap block (caught under AddressSanitizer). */
static void plant(size_t i) {
  if ((long)i == env_index("ADV_PLANT_CRASH")) raise(SIGSEGV);
  if ((long)i == env_index("ADV_PLANT_HANG"))
    for (;;) pause();
  if ((long)i == env_index("ADV_PLANT_ASAN")) {
    volatile char *p = (volatile char *)malloc(8);
    size_t past = ADV_NCASES > 0 ? 8 : 0; /* not a constant: no compile-time warning */
    p[past] = 1;
    free((void *)p);
  }
}

static void run_child(size_t i, adv_record *rec, unsigned timeout) {
  g_rec = rec;
  alarm(timeout);
  plant(i);
  ftnResult_t r = adv_dispatch(&ADV_CASES[i]);
  const char *m = ftn_get_last_error();
  rec->status = (int)r;
  snprintf(rec->msg, MSG_BYTES, "%s", m ? m : "(NULL last error)");
  __atomic_store_n(&rec->done, 1, __ATOMIC_SEQ_CST);
  _exit(0);
}

static void print_result(size_t i, const char *outcome, const adv_record *rec) {
  char msg[MSG_BYTES];
  snprintf(msg, sizeof msg, "%s", rec->msg);
  for (char *p = msg; *p; p++)
    if (*p == '\t' || *p == '\n' || *p == '\r') *p = ' ';
  printf("R\t%zu\t%s\t%d\t%s\n", i, outcome, rec->done ? rec->status : -1, msg);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void dump_log(const char *path) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0;
  if (!f) return;
  while (n < 40 && fgets(line, sizeof line, f)) {
    printf("L\t%s", line);
    n++;
  }
  fclose(f);
}

int main(void) {
  const char *only = getenv("ADV_ONLY");
  int jobs = getenv("ADV_JOBS") ? atoi(getenv("ADV_JOBS")) : 2;
  unsigned timeout = getenv("ADV_TIMEOUT") ? (unsigned)atoi(getenv("ADV_TIMEOUT")) : 20;
  const char *logdir = getenv("ADV_LOGDIR");
  if (jobs < 1) jobs = 1;
  if (jobs > 64) jobs = 64;
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* A one-process torchrun job, so that the baselines of
   * ftn_job_env_from_environment and ftn_rendezvous_share_unique_id are
   * valid calls (a port of our own: other suites may run beside this one). */
  char port[16];
  snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port, 1);
  if (only) {
    static adv_record rec;
    size_t i = (size_t)strtoul(only, NULL, 10);
    if (i >= ADV_NCASES) return 2;
    g_rec = &rec;
    ftnResult_t r = adv_dispatch(&ADV_CASES[i]);
    printf("case %zu: status %d, last error: %s\n", i, (int)r, ftn_get_last_error());
    fflush(stdout);
    _exit(0); /* as a child does: the fixtures are not freed (no leak report) */
  }
  adv_record *recs = mmap(NULL, ADV_NCASES * sizeof(adv_record), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (recs == MAP_FAILED) {
    perror("mmap");
    return 2;
  }
  pid_t pid[64];
  size_t idx[64];
  double start[64];
  char logs[64][512];
  int busy = 0;
  for (int s = 0; s < jobs; s++) {
    pid[s] = 0;
    snprintf(logs[s], sizeof logs[s], "%s/slot%d.err", logdir ? logdir : "/tmp", s);
  }
  size_t next = 0, ncases = ADV_NCASES;
  if (getenv("ADV_LIMIT") && (size_t)atol(getenv("ADV_LIMIT")) < ncases) ncases = (size_t)atol(getenv("ADV_LIMIT"));
  printf("N\t%zu\n", ncases);
  while (next < ncases || busy > 0) {
    for (int s = 0; s < jobs && next < ncases; s++) {
      if (pid[s]) continue;
      size_t i = next++;
      fflush(stdout);
      pid_t p = fork();
      if (p < 0) {
        perror("fork");
        return 2;
      }
      if (p == 0) {
        int fd = open(logs[s], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
          dup2(fd, 2);
          close(fd);
        }
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0) dup2(nul, 1);
        run_child(i, &recs[i], timeout);
      }
      pid[s] = p;
      idx[s] = i;
      start[s] = now_s();
      busy++;
    }
    int progressed = 0;
    for (int s = 0; s < jobs; s++) {
      if (!pid[s]) continue;
      int st = 0;
      pid_t w = waitpid(pid[s], &st, WNOHANG);
      adv_record *rec = &recs[idx[s]];
      char outcome[64];
      if (w == 0) {
        if (now_s() - start[s] < (double)timeout + 2.0) continue;
        kill(pid[s], SIGKILL);
        waitpid(pid[s], &st, 0);
        snprintf(outcome, sizeof outcome, "hang");
      } else if (w < 0) {
        snprintf(outcome, sizeof outcome, "exit:waitpid-%d", errno);
      } else if (WIFSIGNALED(st)) {
        if (WTERMSIG(st) == SIGALRM)
          snprintf(outcome, sizeof outcome, "hang");
        else
          snprintf(outcome, sizeof outcome, "crash:%d", WTERMSIG(st));
      } else if (WEXITSTATUS(st) == 0 && rec->done) {
        snprintf(outcome, sizeof outcome, "done");
      } else if (WEXITSTATUS(st) == 42 && rec->setup_failed) {
        snprintf(outcome, sizeof outcome, "setup");
      } else {
        snprintf(outcome, sizeof outcome, "exit:%d", WEXITSTATUS(st));
      }
      print_result(idx[s], outcome, rec);
      if (strcmp(outcome, "done") != 0) dump_log(logs[s]);
      pid[s] = 0;
      busy--;
      progressed = 1;
    }
    if (!progressed) {
      struct timespec t = {0, 500000};
      nanosleep(&t, NULL);
    }
  }
  printf("E\n");
  return 0;
}
