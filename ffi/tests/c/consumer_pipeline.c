/* A C99 program that uses only include/ferrotron.h and libferrotron: the
 * pipeline-parallel part of the C ABI (host-only, no device). Fetches the
 * 1F1B schedule for pp 4, 8 micro-batches on every rank (size query first),
 * checks the warm-up of every rank and that every send has the matching
 * receive on its peer (per rank pair, in posting order, as NCCL matches
 * them), simulates it (F = 1, B = 2: bubble 3/8), checks ZB-H1 and
 * interleaved bubbles, then bad input through the ABI, checking statuses
 * and messages. Usage: consumer_pipeline SEED. Exit 0 on success. */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layouts the header promises: plain int32 fields, no padding. */
typedef char ftn_check_op_size[sizeof(ftnPipelineOp_t) == 14 * sizeof(int32_t) ? 1 : -1];
typedef char ftn_check_span_size[sizeof(ftnPipelineSpan_t) == 6 * sizeof(int32_t) + 2 * sizeof(double) ? 1 : -1];
typedef char ftn_check_desc_size[sizeof(ftnPipelineDesc_t) == sizeof(size_t) + 6 * sizeof(int32_t) ? 1 : -1];
typedef char ftn_check_costs_size[sizeof(ftnPipelineCosts_t) == sizeof(size_t) + 5 * sizeof(double) ? 1 : -1];

enum { PP = 4, M = 8, MAX_OPS = 64 };

static ftnPipelineDesc_t pipeline(ftnPipelineSchedule_t schedule, int pp, int vp, int microbatches) {
  ftnPipelineDesc_t d;
  memset(&d, 0, sizeof d);
  d.size = sizeof d;
  d.schedule = (int32_t)schedule;
  d.pp = pp;
  d.vp = vp;
  d.group = 0; /* the default: pp */
  d.microbatches = microbatches;
  return d;
}

static ftnPipelineCosts_t costs(double f, double b, double bi, double bw) {
  ftnPipelineCosts_t c;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  c.forward = f;
  c.backward = b;
  c.backward_input = bi;
  c.backward_weight = bw;
  c.p2p_latency = 0.0;
  return c;
}

/* ops[r][0..count[r]) */
static ftnPipelineOp_t g_ops[PP][MAX_OPS];
static size_t g_count[PP];

static void test_one_f_one_b_schedule(void) {
  ftnPipelineDesc_t d = pipeline(ftnPipelineSchedule1F1B, PP, 1, M);
  for (int r = 0; r < PP; r++) {
    size_t n = 12345;
    CHECK(ftn_pipeline_schedule(&d, r, NULL, 0, &n)); /* size query */
    EXPECT(n == 2 * M, "rank %d: %zu operations, want %d", r, n, 2 * M);
    if (n > MAX_OPS) exit(1);
    size_t got = 0;
    CHECK(ftn_pipeline_schedule(&d, r, g_ops[r], MAX_OPS, &got));
    EXPECT(got == n, "rank %d: count %zu after the query's %zu", r, got, n);
    g_count[r] = got;

    /* Warm-up: min(pp - 1 - r, m) forwards, then the steady (F, B) pairs
     * begin with a forward: the first backward is op #warmup + 1. */
    int warmup = PP - 1 - r < M ? PP - 1 - r : M;
    size_t lead = 0;
    while (lead < got && g_ops[r][lead].pass == ftnPipelineForward) lead++;
    EXPECT(lead == (size_t)warmup + 1, "rank %d: %zu forwards before the first backward, want %d warm-up + 1",
           r, lead, warmup);
    int fwd = 0, bwd = 0, in_flight = 0, peak = 0;
    for (size_t i = 0; i < got; i++) {
      const ftnPipelineOp_t *o = &g_ops[r][i];
      EXPECT(o->chunk == 0 && o->stage == r, "rank %d op %zu: chunk %d stage %d", r, i, o->chunk, o->stage);
      if (o->pass == ftnPipelineForward) {
        EXPECT(o->microbatch == fwd, "rank %d op %zu: forward of micro-batch %d, want %d", r, i, o->microbatch, fwd);
        fwd++;
        in_flight++;
        if (in_flight > peak) peak = in_flight;
        EXPECT(o->has_recv == (r > 0), "rank %d op %zu: has_recv %d", r, i, o->has_recv);
        EXPECT(o->has_send == (r < PP - 1), "rank %d op %zu: has_send %d", r, i, o->has_send);
        if (o->has_send)
          EXPECT(o->send_peer == r + 1 && o->send_payload == ftnPipelineActivation && o->send_from_stage == r &&
                     o->send_microbatch == o->microbatch,
                 "rank %d op %zu: forward sends to %d payload %d", r, i, o->send_peer, o->send_payload);
      } else {
        EXPECT(o->pass == ftnPipelineBackward, "rank %d op %zu: pass %d", r, i, o->pass);
        EXPECT(o->microbatch == bwd, "rank %d op %zu: backward of micro-batch %d, want %d", r, i, o->microbatch,
               bwd);
        bwd++;
        in_flight--;
        EXPECT(o->has_recv == (r < PP - 1), "rank %d op %zu: has_recv %d", r, i, o->has_recv);
        EXPECT(o->has_send == (r > 0), "rank %d op %zu: has_send %d", r, i, o->has_send);
        if (o->has_send)
          EXPECT(o->send_peer == r - 1 && o->send_payload == ftnPipelineGradient,
                 "rank %d op %zu: backward sends to %d payload %d", r, i, o->send_peer, o->send_payload);
      }
      if (!o->has_recv)
        EXPECT(o->recv_peer == 0 && o->recv_payload == 0 && o->recv_microbatch == 0 && o->recv_from_stage == 0,
               "rank %d op %zu: an absent receive has zero fields", r, i);
      if (!o->has_send)
        EXPECT(o->send_peer == 0 && o->send_payload == 0 && o->send_microbatch == 0 && o->send_from_stage == 0,
               "rank %d op %zu: an absent send has zero fields", r, i);
    }
    EXPECT(fwd == M && bwd == M && in_flight == 0, "rank %d: %d forwards, %d backwards", r, fwd, bwd);
    EXPECT(peak == PP - r, "rank %d: peak in flight %d, want %d", r, peak, PP - r);
  }

  /* Every send has the matching receive on its peer: the k-th send from s
   * to p and the k-th receive on p from s agree on payload, micro-batch and
   * producing stage; and no receive is left without a send. */
  int matched = 0;
  for (int s = 0; s < PP; s++) {
    for (int p = 0; p < PP; p++) {
      size_t i = 0, j = 0;
      for (;;) {
        while (i < g_count[s] && !(g_ops[s][i].has_send && g_ops[s][i].send_peer == p)) i++;
        while (j < g_count[p] && !(g_ops[p][j].has_recv && g_ops[p][j].recv_peer == s)) j++;
        int more_send = i < g_count[s], more_recv = j < g_count[p];
        EXPECT(more_send == more_recv, "pair %d -> %d: a %s without its match (op %zu / %zu)", s, p,
               more_send ? "send" : "receive", i, j);
        if (!more_send || !more_recv) break;
        const ftnPipelineOp_t *a = &g_ops[s][i], *b = &g_ops[p][j];
        EXPECT(a->send_payload == b->recv_payload && a->send_microbatch == b->recv_microbatch &&
                   a->send_from_stage == b->recv_from_stage && a->send_from_stage == a->stage,
               "pair %d -> %d: send op %zu (payload %d mb %d stage %d) vs receive op %zu (payload %d mb %d stage %d)",
               s, p, i, a->send_payload, a->send_microbatch, a->send_from_stage, j, b->recv_payload,
               b->recv_microbatch, b->recv_from_stage);
        matched++;
        i++;
        j++;
      }
    }
  }
  /* (pp - 1) boundaries, m activations and m gradients across each */
  EXPECT(matched == 2 * (PP - 1) * M, "%d matched messages, want %d", matched, 2 * (PP - 1) * M);
}

static void test_simulate(void) {
  ftnPipelineDesc_t d = pipeline(ftnPipelineSchedule1F1B, PP, 1, M);
  ftnPipelineCosts_t c = costs(1.0, 2.0, 1.0, 1.0);
  double makespan = -1, bubble = -1;
  int32_t peak[PP];
  ftnPipelineSpan_t spans[PP * MAX_OPS];
  size_t n = 0;
  CHECK(ftn_pipeline_simulate(&d, &c, &makespan, &bubble, peak, spans, PP * MAX_OPS, &n));
  EXPECT(fabs(bubble - 3.0 / 8.0) < 1e-12, "1F1B pp 4 m 8 bubble %.17g, want 3/8", bubble);
  EXPECT(makespan == 33.0, "1F1B makespan %g, want 8 * 3 + 3 * 3 = 33", makespan);
  for (int r = 0; r < PP; r++) EXPECT(peak[r] == PP - r, "rank %d: peak in flight %d", r, (int)peak[r]);
  size_t want = 0;
  for (int r = 0; r < PP; r++) want += g_count[r];
  EXPECT(n == want, "%zu spans, want %zu", n, want);
  for (size_t k = 0; k < n && k < PP * MAX_OPS; k++) {
    const ftnPipelineSpan_t *s = &spans[k];
    int r = s->rank, i = s->index;
    if (r < 0 || r >= PP || i < 0 || (size_t)i >= g_count[r]) {
      EXPECT(0, "span %zu: rank %d index %d out of range", k, r, i);
      continue;
    }
    const ftnPipelineOp_t *o = &g_ops[r][i];
    EXPECT(s->pass == o->pass && s->microbatch == o->microbatch && s->stage == o->stage,
           "span %zu is not op %d of rank %d", k, i, r);
    double cost = s->pass == ftnPipelineForward ? 1.0 : 2.0;
    EXPECT(s->end - s->start == cost, "span %zu lasts %g", k, s->end - s->start);
    if (k > 0 && spans[k - 1].rank == r)
      EXPECT(s->index == spans[k - 1].index + 1 && s->start >= spans[k - 1].end, "span %zu overlaps", k);
  }
  /* Spans skipped: count optional. */
  makespan = -1;
  CHECK(ftn_pipeline_simulate(&d, &c, &makespan, &bubble, NULL, NULL, 0, NULL));
  EXPECT(makespan == 33.0, "makespan without spans %g", makespan);

  /* ZB-H1 with F = B = W = 1, m >= pp: makespan 3m + pp - 1, bubble (pp - 1) / 3m. */
  ftnPipelineDesc_t zb = pipeline(ftnPipelineScheduleZBH1, PP, 0, M);
  ftnPipelineCosts_t unit = costs(1.0, 2.0, 1.0, 1.0);
  CHECK(ftn_pipeline_simulate(&zb, &unit, &makespan, &bubble, NULL, NULL, 0, NULL));
  EXPECT(makespan == 3.0 * M + PP - 1, "ZB-H1 makespan %g", makespan);
  EXPECT(fabs(bubble - (PP - 1) / (3.0 * M)) < 1e-12, "ZB-H1 bubble %.17g", bubble);

  /* Interleaved, vp 2, per-chunk costs halved: bubble (pp - 1) / (vp m). */
  ftnPipelineDesc_t il = pipeline(ftnPipelineScheduleInterleaved, PP, 2, M);
  ftnPipelineCosts_t half = costs(0.5, 1.0, 0.5, 0.5);
  size_t count = 0;
  CHECK(ftn_pipeline_schedule(&il, 0, NULL, 0, &count));
  EXPECT(count == 2 * 2 * M, "interleaved rank 0: %zu operations", count);
  CHECK(ftn_pipeline_simulate(&il, &half, &makespan, &bubble, NULL, NULL, 0, NULL));
  EXPECT(fabs(bubble - (PP - 1) / (2.0 * M)) < 1e-12, "interleaved bubble %.17g, want 3/16", bubble);
}

static void test_bad_input(void) {
  ftnPipelineDesc_t d = pipeline(ftnPipelineSchedule1F1B, PP, 1, M);
  ftnPipelineOp_t few[4];
  size_t n = 0;

  /* capacity too small: an error naming it, *count still set */
  ftnResult_t r = ftn_pipeline_schedule(&d, 0, few, 4, &n);
  expect_error(r, ftnInvalidArgument, "capacity 4", "ftn_pipeline_schedule", "`capacity`");
  EXPECT(n == 2 * M, "a capacity error sets *count = %d, got %zu", 2 * M, n);

  /* bad schedule value */
  ftnPipelineDesc_t bad = d;
  bad.schedule = 7;
  r = ftn_pipeline_schedule(&bad, 0, few, 4, &n);
  expect_error(r, ftnInvalidArgument, "schedule 7", "`desc.schedule`", "ftnPipelineScheduleZBH1 (3)");

  /* ops NULL with a capacity, count NULL, rank out of range */
  r = ftn_pipeline_schedule(&d, 0, NULL, 16, &n);
  expect_error(r, ftnInvalidArgument, "ops NULL", "`ops`", NULL);
  r = ftn_pipeline_schedule(&d, 0, NULL, 0, NULL);
  expect_error(r, ftnInvalidArgument, "count NULL", "`count`", NULL);
  r = ftn_pipeline_schedule(&d, PP, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "rank pp", "`rank`", NULL);

  /* descriptor fields and size */
  bad = d;
  bad.size = 8;
  r = ftn_pipeline_schedule(&bad, 0, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "desc.size 8", "desc.size", NULL);
  bad = d;
  bad.vp = 2; /* only the interleaved schedule has chunks */
  r = ftn_pipeline_schedule(&bad, 0, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "1F1B vp 2", "`desc.vp`", NULL);
  bad = pipeline(ftnPipelineScheduleInterleaved, PP, 2, M);
  bad.group = 3; /* < pp */
  r = ftn_pipeline_schedule(&bad, 0, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "group 3", "`desc.group`", NULL);
  bad = pipeline(ftnPipelineScheduleNone, 2, 1, M);
  r = ftn_pipeline_schedule(&bad, 0, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "none with pp 2", "`desc.pp`", NULL);
  bad = pipeline(ftnPipelineSchedule1F1B, FTN_PIPELINE_MAX_RANKS + 1, 1, M);
  r = ftn_pipeline_schedule(&bad, 0, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "pp too large", "`desc.pp`", "FTN_PIPELINE_MAX_RANKS");
  bad = pipeline(ftnPipelineSchedule1F1B, PP, 1, FTN_PIPELINE_MAX_OPS);
  r = ftn_pipeline_schedule(&bad, 0, NULL, 0, &n);
  expect_error(r, ftnInvalidArgument, "too many ops", "FTN_PIPELINE_MAX_OPS", NULL);

  /* simulate: costs, outputs, span capacity */
  ftnPipelineCosts_t c = costs(1.0, -2.0, 1.0, 1.0);
  double makespan = 0, bubble = 0;
  r = ftn_pipeline_simulate(&d, &c, &makespan, &bubble, NULL, NULL, 0, NULL);
  expect_error(r, ftnInvalidArgument, "negative backward", "ftn_pipeline_simulate", "`costs.backward`");
  c = costs(1.0, 2.0, 1.0, 1.0);
  r = ftn_pipeline_simulate(&d, NULL, &makespan, &bubble, NULL, NULL, 0, NULL);
  expect_error(r, ftnInvalidArgument, "costs NULL", "`costs`", NULL);
  r = ftn_pipeline_simulate(&d, &c, &makespan, NULL, NULL, NULL, 0, NULL);
  expect_error(r, ftnInvalidArgument, "bubble NULL", "`bubble_fraction`", NULL);
  ftnPipelineSpan_t spans[4];
  n = 0;
  makespan = -1;
  r = ftn_pipeline_simulate(&d, &c, &makespan, &bubble, NULL, spans, 4, &n);
  expect_error(r, ftnInvalidArgument, "span capacity 4", "`capacity`", NULL);
  EXPECT(n == PP * 2 * M, "a span capacity error sets *count = %d, got %zu", PP * 2 * M, n);
  EXPECT(makespan == -1, "nothing but *count is written on an error (makespan %g)", makespan);
  r = ftn_pipeline_simulate(&d, &c, &makespan, &bubble, NULL, spans, 4, NULL);
  expect_error(r, ftnInvalidArgument, "spans without count", "`count`", NULL);
}

int main(int argc, char **argv) {
  g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
  test_one_f_one_b_schedule();
  test_simulate();
  test_bad_input();
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed [seed %llu]\n", g_failures, g_seed);
    return 1;
  }
  printf("C pipeline consumer: all checks passed [seed %llu]\n", g_seed);
  return 0;
}
