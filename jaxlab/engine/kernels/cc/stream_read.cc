// The most this machine's memory gives the kernels' threads when they only read: the read-bandwidth ceiling of
// `jaxlab bench` (a decode step reads its weights and writes next to nothing, so a copy's read-plus-write rate is not
// its limit; benchmarks/NOTES.md 30). jaxlab/engine/kernels/cpu.py builds, loads and registers it with the kernels.
//
//   sums[c] = sum of x's chunk c        x: float32 [n], sums: float32 [chunks], chunk c = x[c * per, (c + 1) * per)
//
// The calling thread and the helpers (threads.h, the same threads as the products') claim the chunks; each reads its
// chunk front to back, 64 floats at a time into four independent accumulators, so the adds never wait on each other
// and the loads are the limit. The sums are written out so that no read can be skipped.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "threads.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Read {
  const float* x;
  int64_t n, per;
  float* sums;
};

void ReadChunk(const void* context, int64_t c) {
  const Read& r = *static_cast<const Read*>(context);
  const int64_t lo = c * r.per, hi = std::min(r.n, lo + r.per);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = lo;
  for (; i + 64 <= hi; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(r.x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(r.x + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(r.x + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(r.x + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < hi; ++i) s += r.x[i];
  r.sums[c] = s;
}

ffi::Error ReadSum(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> sums) {
  const int64_t n = static_cast<int64_t>(x.element_count()), chunks = static_cast<int64_t>(sums->element_count());
  if (chunks < 1) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jaxlab_read_sum: expected sums [chunks >= 1]");
  Read r{x.typed_data(), n, (n + chunks - 1) / chunks, sums->typed_data()};
  jaxlab::Job job(ReadChunk, &r, chunks);
  jaxlab::RunSized(&job, n, 0);  // always with the helpers: the ceiling is what all the kernels' threads read
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxlabReadSum, ReadSum,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x [n]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // sums [chunks]
);
