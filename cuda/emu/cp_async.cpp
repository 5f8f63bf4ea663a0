// cp.async under the emulator: the address checks a GPU would fault on, and
// in strict mode the asynchrony. A strict-mode cp.async reads its source at
// issue, poisons its destination (0xFF bytes, marked in-flight for the race
// check so any access reports itself), and keeps the data in the thread's
// pending list; cp.async.commit_group numbers the uncommitted copies as one
// group; cp.async.wait_group n lands every committed group but the newest n
// (a write by this thread, for the race check). Copies still in flight when
// the thread exits are dropped. Outside strict mode the copy happens at
// once, as before.
#include <cstring>

#include "emu_internal.h"

namespace ftn_emu {
using namespace detail;

namespace {
constexpr unsigned char kPoison = 0xFF;
}

void cp_async(void *dst, const void *src, int size, int src_bytes, const char *file,
              unsigned line) {
  if (size != 4 && size != 8 && size != 16)
    fail(strprintf("cp.async at %s:%u: copy size %d is not 4, 8 or 16", file, line, size));
  if (src_bytes < 0 || src_bytes > size)
    fail(strprintf("cp.async at %s:%u: src-size %d is outside [0, %d]", file, line, src_bytes,
                   size));
  Worker &w = *tl_worker;
  check_aligned(dst, size_t(size), "cp.async destination", file, line);
  if (!shared_contains(w, dst, size_t(size)))
    fail(strprintf("cp.async at %s:%u: destination %p is not in the block's shared memory "
                   "(cp.async writes .shared)",
                   file, line, dst));
  if (src_bytes > 0) {
    check_aligned(src, size_t(size), "cp.async source", file, line);
    if (shared_overlaps(w, src, size_t(src_bytes)))
      fail(strprintf("cp.async at %s:%u: source %p is in the block's shared memory "
                     "(cp.async reads .global)",
                     file, line, src));
  }
  if (!w.strict) {
    if (size == 16 && src_bytes == 16) {  // the common case, inlined
      std::memcpy(dst, src, 16);
      return;
    }
    if (src_bytes > 0) std::memcpy(dst, src, size_t(src_bytes));
    std::memset(static_cast<char *>(dst) + src_bytes, 0, size_t(size - src_bytes));
    return;
  }
  Thread &t = *w.cur;
  // Issuing the copy writes dst as far as other threads are concerned.
  race_access(w, dst, size_t(size), true, __builtin_return_address(0));
  PendingCopy c{dst, {}, size, 0, file, line};
  if (src_bytes > 0) std::memcpy(c.data, src, size_t(src_bytes));
  std::memset(c.data + src_bytes, 0, size_t(size - src_bytes));
  t.pending.push_back(c);
  std::memset(dst, kPoison, size_t(size));
  race_mark_pending(w, dst, size_t(size), true);
}

void cp_async_commit() {
  Worker &w = *tl_worker;
  if (!w.strict) return;
  Thread &t = *w.cur;
  bool any = false;
  for (PendingCopy &c : t.pending)
    if (c.group == 0) {
      if (!any) ++t.groups_committed;
      c.group = t.groups_committed;
      any = true;
    }
  if (!any) ++t.groups_committed;  // an empty group still counts for wait_group
}

void cp_async_wait(int n, const char *file, unsigned line) {
  Worker &w = *tl_worker;
  if (!w.strict) return;
  if (n < 0) fail(strprintf("cp.async.wait_group at %s:%u: n = %d is negative", file, line, n));
  Thread &t = *w.cur;
  // Groups numbered <= last may stay in flight only if they are among the n newest.
  const uint32_t last = t.groups_committed > uint32_t(n) ? t.groups_committed - uint32_t(n) : 0;
  size_t keep = 0;
  for (size_t i = 0; i < t.pending.size(); ++i) {
    PendingCopy &c = t.pending[i];
    if (c.group != 0 && c.group <= last) {
      race_mark_pending(w, c.dst, size_t(c.size), false);
      race_access(w, c.dst, size_t(c.size), true, __builtin_return_address(0));
      std::memcpy(c.dst, c.data, size_t(c.size));
    } else {
      t.pending[keep++] = c;
    }
  }
  t.pending.resize(keep);
}

}  // namespace ftn_emu

namespace ftn_emu::detail {
void cp_async_drop(Thread &t) {
  t.pending.clear();
  t.groups_committed = 0;
}
}  // namespace ftn_emu::detail
