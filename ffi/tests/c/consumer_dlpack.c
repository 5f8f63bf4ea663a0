/* DLPack through the C ABI: ftn_dlpack_import of a caller's tensor
 * (versioned and unversioned), an op on the view, what the import refuses
 * (strides, device, dtype, alignment, version), and ftn_dlpack_export of
 * an ftn_malloc allocation whose deleter frees it. The import never calls
 * a deleter; the caller calls it exactly once.
 *
 * The DLPack 1.x structs are declared here, as a program with its own
 * dlpack.h would have them (ferrotron.h takes them as void *). */
#include "check.h"

typedef struct { uint32_t major, minor; } DLPackVersion;
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

enum { kDLCPU = 1, kDLCUDA = 2 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

static int g_deleted_v, g_deleted_legacy;
static void count_v(DLManagedTensorVersioned *self) { (void)self; g_deleted_v++; }
static void count_legacy(DLManagedTensor *self) { (void)self; g_deleted_legacy++; }

static ftnTensorView_t fresh_view(void) {
  ftnTensorView_t v;
  memset(&v, 0, sizeof v);
  v.size = sizeof v;
  return v;
}

int main(int argc, char **argv) {
  g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  g_state = g_seed * 2654435761ULL + 1;
  ftnContext_t ctx;
  ftnStream_t stream;
  CHECK(ftn_context_create(ftnBackendEmu, 0, &ctx));
  CHECK(ftn_stream_create(ctx, &stream));

  enum { R = 3, C = 5 };
  float x[R * C], bias[C], out[R * C];
  for (int i = 0; i < R * C; i++) x[i] = frand();
  for (int i = 0; i < C; i++) bias[i] = frand();
  int64_t shape[2] = {R, C}, bshape[1] = {C};
  int64_t row_major[2] = {C, 1};

  /* versioned x (strides given, compact), unversioned bias (strides NULL) */
  DLManagedTensorVersioned mx;
  memset(&mx, 0, sizeof mx);
  mx.version.major = 1;
  mx.deleter = count_v;
  mx.dl_tensor.data = x;
  mx.dl_tensor.device.device_type = kDLCPU;
  mx.dl_tensor.ndim = 2;
  mx.dl_tensor.dtype.code = kDLFloat;
  mx.dl_tensor.dtype.bits = 32;
  mx.dl_tensor.dtype.lanes = 1;
  mx.dl_tensor.shape = shape;
  mx.dl_tensor.strides = row_major;
  DLManagedTensor mb;
  memset(&mb, 0, sizeof mb);
  mb.deleter = count_legacy;
  mb.dl_tensor = mx.dl_tensor;
  mb.dl_tensor.data = bias;
  mb.dl_tensor.ndim = 1;
  mb.dl_tensor.shape = bshape;
  mb.dl_tensor.strides = NULL;
  DLManagedTensorVersioned mo = mx;
  mo.dl_tensor.data = out;

  ftnTensorView_t vx = fresh_view(), vb = fresh_view(), vo = fresh_view();
  CHECK(ftn_dlpack_import(ctx, &mx, 1, &vx));
  CHECK(ftn_dlpack_import(ctx, &mb, 0, &vb));
  CHECK(ftn_dlpack_import(ctx, &mo, 1, &vo));
  EXPECT(vx.data == (void *)x && vx.dtype == ftnFloat32 && vx.ndim == 2, "view of x");
  EXPECT(vx.shape[0] == R && vx.shape[1] == C && vx.shape[2] == 0 && vx.numel == R * C, "shape");
  EXPECT(vb.numel == C && vb.read_only == 0, "bias view");

  ftnBiasGeluDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.dtype = vx.dtype;
  d.gelu = ftnGeluTanh;
  d.rows = vx.shape[0];
  d.cols = vx.shape[1];
  CHECK(ftn_bias_gelu_forward(stream, &d, vx.data, vb.data, vo.data));
  CHECK(ftn_stream_synchronize(stream));
  double want[R * C];
  for (int i = 0; i < R * C; i++) want[i] = gelu(0, (double)x[i] + bias[i % C]);
  close_all("bias_gelu through DLPack views", out, want, R * C, 1e-5);
  EXPECT(g_deleted_v == 0 && g_deleted_legacy == 0, "the import called no deleter");
  /* the caller releases what it imported, once each */
  mx.deleter(&mx);
  mb.deleter(&mb);
  mo.deleter(&mo);
  EXPECT(g_deleted_v == 2 && g_deleted_legacy == 1, "deleters: %d %d", g_deleted_v, g_deleted_legacy);

  /* byte_offset: the view starts past it; read-only flag passed on */
  DLManagedTensorVersioned m = mx;
  m.dl_tensor.byte_offset = 4 * C;
  m.dl_tensor.shape[0] = R - 1;
  m.flags = 1;
  ftnTensorView_t v = fresh_view();
  CHECK(ftn_dlpack_import(ctx, &m, 1, &v));
  EXPECT(v.data == (void *)(x + C) && v.numel == (R - 1) * C && v.read_only == 1, "offset view");
  m.dl_tensor.shape[0] = R;
  m.dl_tensor.byte_offset = 0;
  m.flags = 0;

  /* size-1 dimensions may have any stride */
  {
    int64_t one[2] = {1, C}, st[2] = {12345, 1};
    DLManagedTensorVersioned q = mx;
    q.dl_tensor.shape = one;
    q.dl_tensor.strides = st;
    v = fresh_view();
    CHECK(ftn_dlpack_import(ctx, &q, 1, &v));
  }

  /* refused: each a named error, nothing written */
  {
    int64_t cols_major[2] = {1, R}; /* a transposed view */
    DLManagedTensorVersioned q = mx;
    q.dl_tensor.strides = cols_major;
    v = fresh_view();
    ftnResult_t r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "non-contiguous", "strides", "dimension 1");
    EXPECT(v.data == NULL, "nothing written on failure");

    q = mx;
    q.dl_tensor.device.device_type = kDLCUDA;
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnDeviceMismatch, "CUDA tensor on the emulator", "ftn_dlpack_import", "device");

    q = mx;
    q.dl_tensor.dtype.bits = 64; /* float64 */
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "float64", "dl_tensor.dtype", "64 bits");

    q = mx;
    q.dl_tensor.dtype.lanes = 4;
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "lanes", "dl_tensor.dtype", "4 lanes");

    q = mx;
    q.dl_tensor.byte_offset = 2; /* misaligned for float32 */
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "misaligned", "dl_tensor.data", "aligned to 4");

    q = mx;
    q.version.major = 2;
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "version", "version.major", "got 2");

    q = mx;
    q.dl_tensor.ndim = 9;
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "ndim", "dl_tensor.ndim", "got 9");

    int64_t neg[2] = {-1, C};
    q = mx;
    q.dl_tensor.shape = neg;
    r = ftn_dlpack_import(ctx, &q, 1, &v);
    expect_error(r, ftnInvalidArgument, "negative dim", "dl_tensor.shape", "got -1");

    r = ftn_dlpack_import(ctx, &mx, 2, &v);
    expect_error(r, ftnInvalidArgument, "versioned", "versioned", "got 2");
    r = ftn_dlpack_import(ctx, NULL, 1, &v);
    expect_error(r, ftnInvalidArgument, "NULL", "managed", NULL);
    EXPECT(g_deleted_v == 2, "failed imports call no deleter");
  }

  /* export: ownership moves to the DLPack tensor */
  {
    void *p = NULL;
    CHECK(ftn_malloc(ctx, &p, R * C * sizeof(float)));
    CHECK(ftn_memcpy_htod(stream, p, x, sizeof x));
    int64_t sh[2] = {R, C};
    void *raw = NULL;
    CHECK(ftn_dlpack_export(ctx, p, ftnFloat32, 2, sh, 1, &raw));
    DLManagedTensorVersioned *e = (DLManagedTensorVersioned *)raw;
    EXPECT(e->version.major == 1 && e->flags == 0 && e->deleter != NULL, "versioned header");
    EXPECT(e->dl_tensor.data == p && e->dl_tensor.device.device_type == kDLCPU && e->dl_tensor.ndim == 2,
           "tensor");
    EXPECT(e->dl_tensor.shape[0] == R && e->dl_tensor.shape[1] == C && e->dl_tensor.strides == NULL,
           "shape");
    EXPECT(e->dl_tensor.dtype.code == kDLFloat && e->dl_tensor.dtype.bits == 32 && e->dl_tensor.dtype.lanes == 1,
           "dtype");
    sh[0] = 99; /* the tensor keeps its own copy of the shape */
    EXPECT(e->dl_tensor.shape[0] == R, "shape copied");
    /* its own import sees the data */
    v = fresh_view();
    CHECK(ftn_dlpack_import(ctx, e, 1, &v));
    CHECK(ftn_stream_synchronize(stream));
    EXPECT(memcmp(v.data, x, sizeof x) == 0, "exported data");
    /* the context no longer owns it */
    expect_error(ftn_free(ctx, p), ftnInvalidArgument, "ftn_free after export", "ptr", NULL);
    e->deleter(e);

    /* unversioned, bf16, 0-d */
    CHECK(ftn_malloc(ctx, &p, 2));
    CHECK(ftn_dlpack_export(ctx, p, ftnBfloat16, 0, NULL, 0, &raw));
    DLManagedTensor *l = (DLManagedTensor *)raw;
    EXPECT(l->dl_tensor.ndim == 0 && l->dl_tensor.dtype.code == kDLBfloat && l->dl_tensor.dtype.bits == 16,
           "legacy bf16 scalar");
    /* the deleter may run after the context is gone: kept for the end */

    /* refused: too large for the allocation, interior or foreign pointers */
    void *q = NULL;
    CHECK(ftn_malloc(ctx, &q, 16));
    int64_t big[1] = {5};
    raw = NULL;
    expect_error(ftn_dlpack_export(ctx, q, ftnFloat32, 1, big, 1, &raw), ftnInvalidArgument, "too large",
                 "shape", "at most 16 bytes");
    expect_error(ftn_dlpack_export(ctx, (char *)q + 4, ftnFloat32, 0, NULL, 1, &raw), ftnInvalidArgument,
                 "interior", "ptr", NULL);
    expect_error(ftn_dlpack_export(ctx, x, ftnFloat32, 0, NULL, 1, &raw), ftnInvalidArgument, "foreign",
                 "ptr", NULL);
    expect_error(ftn_dlpack_export(ctx, q, 6, 0, NULL, 1, &raw), ftnInvalidArgument, "dtype", "datatype",
                 NULL);
    EXPECT(raw == NULL, "nothing written on failure");
    CHECK(ftn_free(ctx, q)); /* still the context's */

    CHECK(ftn_stream_destroy(stream));
    CHECK(ftn_context_destroy(ctx));
    l->deleter(l);
  }

  if (g_failures) {
    fprintf(stderr, "%d checks failed [seed %llu]\n", g_failures, g_seed);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
