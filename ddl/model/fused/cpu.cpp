// The Delta residual's state ops on CPU: the loops of eager.py, each one pass over its tensors per
// direction, parallel over tokens. native.py builds this file once per machine on first use.
//
// All tensors share one floating dtype. Shapes: X (B,T,dv,d) the state, the paper's d x d_v per
// token stored transposed; h (B,T,d) the raw key k~; beta, rho (B,T,1); v, w, q (B,T,dv); A (dv,d,L)
// a compressor's taps and E (dv,d,L) the EC expander's, tap L-1 weighing the current token (lag 0). With rho = 1/sqrt(|k~|^2 + eps^2)
// the unit key is k = rho k~, and the update X + beta k (v^T - k^T X) is X + w k~^T with
// w = beta rho (v - rho q), q = X k~ (the per-channel dot products). update_steps applies a DeltaProduct
// sublayer's S updates in turn, one k~, beta, v a step, its w, rho, q stacked by step: (B,T,S,dv), (B,T,S).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using at::Tensor;

template <typename T>
inline T dot(const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Explicit SIMD through the compiler's vector extension (GCC, Clang): Vec<T> is one vector register of T for the
// build's vector level (native.py's flags). simd_for(d, body) runs body(i, Lanes<U>{}) over a row, U = Vec<T> for
// whole vectors from i, then U = T for the remainder: one body written for both, with load<U>/store and scalars
// broadcast in arithmetic. A body keeps its values in registers across a loop the compiler would not vectorise (over
// lags, over channels).
#if defined(__AVX512F__)
constexpr int kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int kVectorBytes = 32;
#else
constexpr int kVectorBytes = 16;
#endif

template <typename T>
struct VectorOf { typedef T type __attribute__((vector_size(kVectorBytes))); };

template <typename T>
using Vec = typename VectorOf<T>::type;

template <typename U>
struct Lanes { using type = U; };

template <typename U, typename T>
inline U load(const T* p) {
  U u;
  std::memcpy(&u, p, sizeof u);
  return u;
}

template <typename U, typename T>
inline void store(T* p, const U& u) { std::memcpy(p, &u, sizeof u); }

// A sum over a row taken in a simd_for: a vector of partial sums from its whole vectors, a scalar from the rest.
template <typename T>
struct LaneSum {
  Vec<T> lanes{};
  T rest = 0;
  void add(const Vec<T>& u) { lanes += u; }
  void add(T u) { rest += u; }
  T total() const {
    T s = rest;
    for (size_t l = 0; l < sizeof(Vec<T>) / sizeof(T); ++l) s += lanes[l];
    return s;
  }
};

template <typename T, typename F>
inline void simd_for(int64_t d, const F& body) {
  constexpr int64_t W = sizeof(Vec<T>) / sizeof(T);
  int64_t i = 0;
  for (; i + W <= d; i += W) body(i, Lanes<Vec<T>>{});
  for (; i < d; ++i) body(i, Lanes<T>{});
}

// At one lag of a depthwise conv over T with output y: the input's gradient out += taps * y and
// the taps' gradient g_taps += own * y (own: the input the taps weighed).
template <typename T>
inline void conv_grads_at_lag(T* __restrict__ out, T* __restrict__ g_taps, const T* taps, const T* own, const T* y,
                              int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) {
    out[i] += taps[i] * y[i];
    g_taps[i] += own[i] * y[i];
  }
}

// Sums over tokens (the taps' and the norm's weight gradients): body(first, last, partial) adds
// tokens [first, last) into a zeroed partial, per chunk of tokens, and the partials are then summed
// in chunk order into `sums`: contiguous tensors that lay out a partial one after another. The chunks
// depend on n alone, so the result is the same bits whatever the thread count (a run resumed on
// another node continues the same curve).
template <typename T, typename F>
void sum_over_tokens(int64_t n, std::initializer_list<Tensor> sums, const Tensor& like, const F& body) {
  constexpr int64_t kTokensPerChunk = 256, kMaxChunks = 64;
  const int64_t chunks = std::clamp<int64_t>((n + kTokensPerChunk - 1) / kTokensPerChunk, 1, kMaxChunks);
  int64_t size = 0;
  for (const Tensor& sum : sums) size += sum.numel();
  Tensor partials = at::zeros({chunks, size}, like.options());
  T* base = partials.data_ptr<T>();
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) body(n * c / chunks, n * (c + 1) / chunks, base + c * size);
  });
  int64_t offset = 0;
  for (const Tensor& sum : sums) {
    T* out = sum.data_ptr<T>();
    at::parallel_for(0, sum.numel(), 1024, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        T s = 0;
        for (int64_t c = 0; c < chunks; ++c) s += base[c * size + offset + i];
        out[i] = s;
      }
    });
    offset += sum.numel();
  }
}

// sum_over_tokens into one new tensor of `shape`.
template <typename T, typename F>
Tensor sum_over_tokens(int64_t n, at::IntArrayRef shape, const Tensor& like, const F& body) {
  Tensor total = at::empty(shape, like.options());
  sum_over_tokens<T>(n, {total}, like, body);
  return total;
}

// (dv,d,L) taps -> (L,dv,d) in dtype: by lag (lag l is tap L-1-l), d contiguous. One pass, where flip, permute and
// contiguous were three op calls and two copies: a dispatch-bound step makes four such calls a block.
Tensor taps_by_lag(const Tensor& A, at::ScalarType dtype) {
  const Tensor taps = A.to(dtype);
  const int64_t dv = taps.size(0), d = taps.size(1), L = taps.size(2);
  Tensor A_lag = at::empty({L, dv, d}, taps.options());
  AT_DISPATCH_FLOATING_TYPES(dtype, "ddl_delta::taps_by_lag", [&] {
    const auto tap = taps.accessor<scalar_t, 3>();
    scalar_t* out = A_lag.data_ptr<scalar_t>();
    for (int64_t lag = 0; lag < L; ++lag)
      for (int64_t j = 0; j < dv; ++j)
        for (int64_t i = 0; i < d; ++i) *out++ = tap[j][i][L - 1 - lag];
  });
  return A_lag;
}

// The taps' gradient by lag, (L,dv,d) contiguous, back to the taps' (dv,d,L).
Tensor taps_from_lags(const Tensor& g_lag) {
  const int64_t L = g_lag.size(0), dv = g_lag.size(1), d = g_lag.size(2);
  Tensor g = at::empty({dv, d, L}, g_lag.options());
  AT_DISPATCH_FLOATING_TYPES(g_lag.scalar_type(), "ddl_delta::taps_from_lags", [&] {
    const scalar_t* by_lag = g_lag.data_ptr<scalar_t>();
    scalar_t* out = g.data_ptr<scalar_t>();
    for (int64_t j = 0; j < dv; ++j)
      for (int64_t i = 0; i < d; ++i)
        for (int64_t tap = 0; tap < L; ++tap) *out++ = by_lag[((L - 1 - tap) * dv + j) * d + i];
  });
  return g;
}

// ---- the loops, per token; n is the flat token index b*T + t ----

// w_j = beta rho (v_j - rho q_j): one channel's write, in the forward and where a backward recomputes it.
template <typename T>
inline T write_coefficient(T b, T r, T v, T q) { return b * r * (v - r * q); }

// One token's update, Y = X + w k~^T, with its rho, w and q: X and Y its (dv, d) rows (Y may be X; null: only
// w, rho and q), Y_copy (or null) a second place Y's rows are written in the same pass.
template <typename T>
inline void update_token(const T* X, const T* k, T b, const T* v, T eps2, T* Y, T* w, T* rho, T* q, int64_t dv,
                         int64_t d, T* Y_copy = nullptr) {
  const T r = 1 / std::sqrt(dot(k, k, d) + eps2);
  *rho = r;
  for (int64_t j = 0; j < dv; ++j) {
    const T* Xj = X + j * d;
    const T qj = dot(Xj, k, d);
    const T wj = write_coefficient(b, r, v[j], qj);
    q[j] = qj;
    w[j] = wj;
    if (!Y) continue;
    T* Yj = Y + j * d;
    if (!Y_copy) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) Yj[i] = Xj[i] + wj * k[i];
      continue;
    }
    T* Cj = Y_copy + j * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) Cj[i] = Yj[i] = Xj[i] + wj * k[i];
  }
}

// Y = X + w k^T: a token's (dv, d) row rebuilt from a state and a write; X_next (or null): the row the
// caller reads next, fetched into cache meanwhile (a row of 4 KB is a page, which the hardware does not
// prefetch across).
template <typename T>
inline void add_write(const T* X, const T* w, const T* k, T* Y, int64_t dv, int64_t d, const T* X_next) {
  for (int64_t j = 0; j < dv; ++j) {
    const T *Xj = X + j * d, wj = w[j];
    T* Yj = Y + j * d;
    simd_for<T>(d, [&](int64_t i, auto lanes) {
      using U = typename decltype(lanes)::type;
      if (X_next) __builtin_prefetch(X_next + j * d + i);
      store(Yj + i, load<U>(Xj + i) + wj * load<U>(k + i));
    });
  }
}

// One token's update backward: G its dL/dY rows, g_w its dL/dw (or null); writes dL/dX (g_X, which may be G),
// dL/dk~ (g_k), dL/dbeta and dL/dv. w and g_q: dv numbers of scratch.
template <typename T>
inline void update_token_backward(const T* G, const T* g_w, const T* X, const T* k, T b, const T* v, T r, const T* q,
                                  T* g_X, T* g_k, T* g_beta, T* g_v, T* w, T* g_q, int64_t dv, int64_t d) {
  T g_b = 0, g_r = 0;                                         // dL/dbeta, dL/drho
  for (int64_t j = 0; j < dv; ++j) {
    const T g_wj = dot(G + j * d, k, d) + (g_w ? g_w[j] : 0);  // G_j . k~ + dL/dw_j
    const T res = v[j] - r * q[j];                             // v_j - k^T X_j
    const T g_res = g_wj * b * r;
    w[j] = b * r * res;
    g_q[j] = -g_res * r;
    g_v[j] = g_res;
    g_b += g_wj * r * res;
    g_r += g_wj * b * res - g_res * q[j];
  }
  *g_beta = g_b;
  const T g_kr = -g_r * r * r * r;                            // through rho = (|k~|^2 + eps^2)^(-1/2): -rho^3 k~
  simd_for<T>(d, [&](int64_t i, auto lanes) {                 // dL/dk~ in registers across the channels
    using U = typename decltype(lanes)::type;
    const U ki = load<U>(k + i);
    U gk = g_kr * ki;
    for (int64_t j = 0; j < dv; ++j) {
      const U Gj = load<U>(G + j * d + i);
      gk += w[j] * Gj + g_q[j] * load<U>(X + j * d + i);
      store(g_X + j * d + i, Gj + g_q[j] * ki);                // after reading G: g_X may be G
    }
    store(g_k + i, gk);
  });
}

template <typename T>
void update_forward_loop(const T* X, const T* h, const T* beta, const T* v, T eps2, T* X_new, T* w, T* rho, T* q,
                         int64_t N, int64_t dv, int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n)
      update_token(X + n * dv * d, h + n * d, beta[n], v + n * dv, eps2, X_new + n * dv * d, w + n * dv, rho + n,
                   q + n * dv, dv, d);
  });
}

template <typename T>
void update_backward_loop(const T* G, const T* g_w, const T* X, const T* h, const T* beta, const T* v, const T* rho,
                          const T* q, T* g_X, T* g_h, T* g_beta, T* g_v, int64_t N, int64_t dv, int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    std::vector<T> w(dv), g_q(dv);
    for (int64_t n = first; n < last; ++n)
      update_token_backward(G + n * dv * d, g_w ? g_w + n * dv : nullptr, X + n * dv * d, h + n * d, beta[n],
                            v + n * dv, rho[n], q + n * dv, g_X + n * dv * d, g_h + n * d, g_beta + n, g_v + n * dv,
                            w.data(), g_q.data(), dv, d);
  });
}

// A block's first update when its state has d_v > 1: w, rho, q of update_forward, the new state not written.
template <typename T>
void key_forward_loop(const T* X, const T* h, const T* beta, const T* v, T eps2, T* w, T* rho, T* q, int64_t N,
                      int64_t dv, int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n)
      update_token(X + n * dv * d, h + n * d, beta[n], v + n * dv, eps2, static_cast<T*>(nullptr), w + n * dv, rho + n,
                   q + n * dv, dv, d);
  });
}

// Its second update, of the mid state X + w_a k~_a^T (rebuilt per token, never stored), and the next read of the
// result, x_next[t] = sum over lag, j of A[lag, j] * X_out[t-lag, j] (A by lag). Each thread walks its tokens in order
// with the last L rows of X_out in a ring, after rebuilding the rows of the L-1 tokens before its first; X_out is
// written when X_new is not null.
template <typename T>
void write_forward_loop(const T* X, const T* h_a, const T* w_a, const T* h, const T* beta, const T* v, const T* A,
                        T eps2, T* X_new, T* w, T* rho, T* q, T* x_next, int64_t N, int64_t T_, int64_t L, int64_t dv,
                        int64_t d) {
  const int64_t row = dv * d;
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    std::vector<T> ring(L * row), mid(row), scratch(2 * dv + 1);
    std::vector<const T*> rows(L);                               // X_out at t, t-1, .. in the ring
    const int64_t start = std::max(first - (L - 1), first - first % T_);  // the earliest token the reads need
    for (int64_t n = start; n < last; ++n) {
      T* out = ring.data() + (n % L) * row;
      const bool own = n >= first;
      add_write(X + n * row, w_a + n * dv, h_a + n * d, mid.data(), dv, d, n + 1 < last ? X + (n + 1) * row : nullptr);
      T *wn = own ? w + n * dv : scratch.data(), *qn = own ? q + n * dv : scratch.data() + dv;
      update_token(mid.data(), h + n * d, beta[n], v + n * dv, eps2, out, wn, own ? rho + n : scratch.data() + 2 * dv,
                   qn, dv, d, own && X_new ? X_new + n * row : nullptr);
      if (!own) continue;
      const int64_t lags = std::min(L, n % T_ + 1);
      for (int64_t lag = 0; lag < lags; ++lag) rows[lag] = ring.data() + ((n - lag) % L) * row;
      simd_for<T>(d, [&](int64_t i, auto lanes) {             // x_next's row in registers across lags and channels
        using U = typename decltype(lanes)::type;
        U y{};
        for (int64_t lag = 0; lag < lags; ++lag)
          for (int64_t j = 0; j < dv; ++j) y += load<U>(A + (lag * dv + j) * d + i) * load<U>(rows[lag] + j * d + i);
        store(x_next + n * d + i, y);
      });
    }
  });
}

// Its backward for tokens [first, last): with G_tot = dL/dX_out (G, or zero) plus the read's
// sum over lag of A[lag] * g_next[t+lag], the update's backward of the rebuilt mid state gives dL/dX_mid (G_mid),
// dL/dk~, dL/dbeta, dL/dv; the taps' partial g_A[lag, j] gets X_out[t, j] * g_next[t+lag].
template <typename T>
void write_backward_loop(const T* G, const T* g_w, const T* g_next, const T* X, const T* h_a, const T* w_a, const T* h,
                         const T* beta, const T* v, const T* rho, const T* q, const T* A, T* G_mid, T* g_h, T* g_beta,
                         T* g_v, T* g_A, int64_t first, int64_t last, int64_t T_, int64_t L, int64_t dv, int64_t d) {
  const int64_t row = dv * d;
  std::vector<T> mid(row), G_tot(row), w(dv), g_q(dv), w_new(dv);
  for (int64_t n = first; n < last; ++n) {
    for (int64_t j = 0; j < dv; ++j) w_new[j] = write_coefficient(beta[n], rho[n], v[n * dv + j], q[n * dv + j]);
    const int64_t lags = std::min(L, T_ - n % T_);            // X_out[n] feeds the reads at n .. n + lags - 1
    for (int64_t j = 0; j < dv; ++j) {
      const T *Xj = X + n * row + j * d, *ka = h_a + n * d, *k = h + n * d, *Gj = G ? G + n * row + j * d : nullptr;
      const T wa = w_a[n * dv + j], wn = w_new[j];
      T *mj = mid.data() + j * d, *Gt = G_tot.data() + j * d;
      const bool prefetch = n + 1 < last;                       // the next token's rows (a page each) meanwhile
      simd_for<T>(d, [&](int64_t i, auto lanes) {             // X_mid, X_out and G_tot in registers across the lags
        using U = typename decltype(lanes)::type;
        if (prefetch) {
          __builtin_prefetch(Xj + row + i);
          if (Gj) __builtin_prefetch(Gj + row + i);
        }
        const U m = load<U>(Xj + i) + wa * load<U>(ka + i), out = m + wn * load<U>(k + i);
        U gt = Gj ? load<U>(Gj + i) : U{};
        for (int64_t lag = 0; lag < lags; ++lag) {
          const U gn = load<U>(g_next + (n + lag) * d + i);
          T* ga = g_A + (lag * dv + j) * d + i;
          gt += load<U>(A + (lag * dv + j) * d + i) * gn;
          store(ga, load<U>(ga) + out * gn);
        }
        store(mj + i, m), store(Gt + i, gt);
      });
    }
    update_token_backward(G_tot.data(), g_w ? g_w + n * dv : nullptr, mid.data(), h + n * d, beta[n], v + n * dv,
                          rho[n], q + n * dv, G_mid + n * row, g_h + n * d, g_beta + n, g_v + n * dv, w.data(),
                          g_q.data(), dv, d);
  }
}

// The S updates of a sublayer, X_s = X_{s-1} + w_s k~_s^T, one token at a time: its rows stay in cache from
// step to step. Step s's inputs: h[s] (B,T,d), beta[s] (B,T,1), v[s] (B,T,dv); its w, rho, q are [.., s, ..]
// of w (B,T,S,dv), rho (B,T,S), q (B,T,S,dv).
template <typename T>
void update_steps_forward_loop(const T* X, const std::vector<const T*>& h, const std::vector<const T*>& beta,
                               const std::vector<const T*>& v, T eps2, T* X_new, T* w, T* rho, T* q, int64_t N,
                               int64_t dv, int64_t d) {
  const int64_t S = h.size();
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      T* Y = X_new + n * dv * d;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t ns = n * S + s;
        update_token(s == 0 ? X + n * dv * d : Y, h[s] + n * d, beta[s][n], v[s] + n * dv, eps2, Y, w + ns * dv,
                     rho + ns, q + ns * dv, dv, d);
      }
    }
  });
}

// Its backward: X_1 .. X_{S-1} recomputed from X (the forward's bits), then the steps' backwards in reverse,
// dL/dX_s carried in g_X's rows. g_h (B,T,S,d), g_beta (B,T,S), g_v (B,T,S,dv); g_w (B,T,S,dv) or null.
template <typename T>
void update_steps_backward_loop(const T* G, const T* g_w, const T* X, const std::vector<const T*>& h,
                                const std::vector<const T*>& beta, const std::vector<const T*>& v, const T* rho,
                                const T* q, T* g_X, T* g_h, T* g_beta, T* g_v, int64_t N, int64_t dv, int64_t d) {
  const int64_t S = h.size();
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    std::vector<T> states((S - 1) * dv * d), w(dv), g_q(dv);
    for (int64_t n = first; n < last; ++n) {
      auto state = [&](int64_t s) { return s == 0 ? X + n * dv * d : states.data() + (s - 1) * dv * d; };
      for (int64_t s = 1; s < S; ++s) {                       // X_s = X_{s-1} + w_s k~_s^T
        const int64_t ns = n * S + s - 1;
        const T *k = h[s - 1] + n * d, *Xp = state(s - 1);
        T* Xs = states.data() + (s - 1) * dv * d;
        for (int64_t j = 0; j < dv; ++j) {
          const T wj = write_coefficient(beta[s - 1][n], rho[ns], v[s - 1][n * dv + j], q[ns * dv + j]);
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) Xs[j * d + i] = Xp[j * d + i] + wj * k[i];
        }
      }
      T* gX = g_X + n * dv * d;
      for (int64_t s = S - 1; s >= 0; --s) {
        const int64_t ns = n * S + s;
        update_token_backward(s == S - 1 ? G + n * dv * d : gX, g_w ? g_w + ns * dv : nullptr, state(s), h[s] + n * d,
                              beta[s][n], v[s] + n * dv, rho[ns], q + ns * dv, gX, g_h + ns * d, g_beta + ns,
                              g_v + ns * dv, w.data(), g_q.data(), dv, d);
      }
    }
  });
}

// x[t] = sum over lag, j of A[lag, j] * X[t-lag, j], with A by lag (L,dv,d).
template <typename T>
void read_forward_loop(const T* X, const T* A, T* x, int64_t N, int64_t T_, int64_t L, int64_t dv, int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      T* y = x + n * d;
      std::fill(y, y + d, T(0));
      for (int64_t lag = 0; lag < std::min(L, n % T_ + 1); ++lag) {
        for (int64_t j = 0; j < dv; ++j) {
          const T *a = A + (lag * dv + j) * d, *s = X + ((n - lag) * dv + j) * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) y[i] += a[i] * s[i];
        }
      }
    }
  });
}

template <typename T>
void read_backward_loop(const T* g, const T* X, const T* A, T* g_X, T* g_A, int64_t first, int64_t last, int64_t T_,
                        int64_t L, int64_t dv, int64_t d) {
  for (int64_t n = first; n < last; ++n) {
    const int64_t lags = std::min(L, T_ - n % T_);            // token n feeds the reads at n .. n + lags - 1
    for (int64_t j = 0; j < dv; ++j) {
      const T* s = X + (n * dv + j) * d;
      T* gs = g_X + (n * dv + j) * d;
      std::fill(gs, gs + d, T(0));
      for (int64_t lag = 0; lag < lags; ++lag)
        conv_grads_at_lag(gs, g_A + (lag * dv + j) * d, A + (lag * dv + j) * d, s, g + (n + lag) * d, d);
    }
  }
}

// The read of the rank-1 state w k~^T from its factors w (B,T,dv), h = k~ (B,T,d).
template <typename T>
void rank_one_forward_loop(const T* w, const T* h, const T* A, T* x, int64_t N, int64_t T_, int64_t L, int64_t dv,
                           int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const int64_t lags = std::min(L, n % T_ + 1);
      simd_for<T>(d, [&](int64_t i, auto lanes) {             // x's row in registers across lags and channels
        using U = typename decltype(lanes)::type;
        U y{};
        for (int64_t lag = 0; lag < lags; ++lag) {
          const U k = load<U>(h + (n - lag) * d + i);
          for (int64_t j = 0; j < dv; ++j) y += w[(n - lag) * dv + j] * load<U>(A + (lag * dv + j) * d + i) * k;
        }
        store(x + n * d + i, y);
      });
    }
  });
}

template <typename T>
void rank_one_backward_loop(const T* g, const T* w, const T* h, const T* A, T* g_w, T* g_h, T* g_A, int64_t first,
                            int64_t last, int64_t T_, int64_t L, int64_t dv, int64_t d) {
  // With R_j = sum over lag of A[lag, j] * g[t+lag]: dL/dw_j = k~ . R_j, dL/dk~ = sum over j of w_j R_j, and
  // g_A[lag, j] gets w_j g[t+lag] * k~. R_j and dL/dk~ stay in registers.
  std::vector<LaneSum<T>> g_w_sums(dv);
  for (int64_t n = first; n < last; ++n) {
    const int64_t lags = std::min(L, T_ - n % T_);
    const T *k = h + n * d, *c = w + n * dv;
    std::fill(g_w_sums.begin(), g_w_sums.end(), LaneSum<T>{});
    simd_for<T>(d, [&](int64_t i, auto lanes) {
      using U = typename decltype(lanes)::type;
      const U ki = load<U>(k + i);
      U gk{};
      for (int64_t j = 0; j < dv; ++j) {
        U R{};
        for (int64_t lag = 0; lag < lags; ++lag) {
          const U gy = load<U>(g + (n + lag) * d + i), a = load<U>(A + (lag * dv + j) * d + i);
          T* ga = g_A + (lag * dv + j) * d + i;
          R += a * gy;
          store(ga, load<U>(ga) + c[j] * gy * ki);
        }
        gk += c[j] * R;
        g_w_sums[j].add(ki * R);
      }
      store(g_h + n * d + i, gk);
    });
    for (int64_t j = 0; j < dv; ++j) g_w[n * dv + j] = g_w_sums[j].total();
  }
}

// X[t, j] = sum over lag of E[lag, j] * x[t-lag]: the EC expansion of x (B,T,d) into the state.
template <typename T>
void expand_forward_loop(const T* x, const T* E, T* X, int64_t N, int64_t T_, int64_t L, int64_t dv, int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      for (int64_t j = 0; j < dv; ++j) {
        T* y = X + (n * dv + j) * d;
        std::fill(y, y + d, T(0));
        for (int64_t lag = 0; lag < std::min(L, n % T_ + 1); ++lag) {
          const T *e = E + (lag * dv + j) * d, *s = x + (n - lag) * d;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) y[i] += e[i] * s[i];
        }
      }
    }
  });
}

template <typename T>
void expand_backward_loop(const T* g, const T* x, const T* E, T* g_x, T* g_E, int64_t first, int64_t last,
                          int64_t T_, int64_t L, int64_t dv, int64_t d) {
  for (int64_t n = first; n < last; ++n) {
    const T* s = x + n * d;
    T* gs = g_x + n * d;
    std::fill(gs, gs + d, T(0));
    for (int64_t lag = 0; lag < std::min(L, T_ - n % T_); ++lag) {  // x[n] feeds the state at n + lag
      for (int64_t j = 0; j < dv; ++j)
        conv_grads_at_lag(gs, g_E + (lag * dv + j) * d, E + (lag * dv + j) * d, s, g + ((n + lag) * dv + j) * d, d);
    }
  }
}

// A gate's activation: a map l of the norm's output or input is gated where it has biases b,
// y = s sigmoid(l + b) (beta = 2 sigmoid(.), v = s sigmoid(.)); else y = l (the MLP estimator's hidden layer).
template <typename T>
struct Gate {
  const T* b;  // (width,) or nullptr: ungated
  T s;
  T forward(T l, int64_t j) const { return b ? s / (1 + std::exp(-(l + b[j]))) : l; }
  // dL/dl from dL/dy and the saved y: s sigmoid' = y (1 - y / s)
  T backward(T g_y, T y) const { return b ? g_y * y * (1 - y / s) : g_y; }
};

// c = x rho * g with rho = 1/sqrt(mean(x^2) + eps) (an RMSNorm), and the gates' maps y_c = gate_c(c W_c^T),
// y_x = gate_x(x W_x^T) (B,T,nc), (B,T,nx): the gates that read the norm's output and input.
template <typename T>
void norm_forward_loop(const T* x, const T* g, const T* W_c, const T* W_x, Gate<T> gate_c, Gate<T> gate_x, T eps,
                       T* c, T* y_c, T* y_x, T* rho, int64_t N, int64_t nc, int64_t nx, int64_t d) {
  at::parallel_for(0, N, 16, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      const T* xn = x + n * d;
      T* cn = c + n * d;
      const T r = 1 / std::sqrt(dot(xn, xn, d) / d + eps);
      rho[n] = r;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) cn[i] = xn[i] * r * g[i];
      for (int64_t j = 0; j < nc; ++j) y_c[n * nc + j] = gate_c.forward(dot(cn, W_c + j * d, d), j);
      for (int64_t j = 0; j < nx; ++j) y_x[n * nx + j] = gate_x.forward(dot(xn, W_x + j * d, d), j);
    }
  });
}

// partials: (d + (nc + nx) * d + nc + nx) sums over tokens: dL/dg, dL/dW_c, dL/dW_x, the gates' dL/db.
template <typename T>
void norm_backward_loop(const T* g_c, const T* g_yc, const T* g_yx, const T* x, const T* g, const T* W_c,
                        const T* W_x, const T* rho, const T* y_c, const T* y_x, Gate<T> gate_c, Gate<T> gate_x,
                        T* g_x, T* partials, int64_t first, int64_t last, int64_t nc, int64_t nx, int64_t d) {
  T *g_g = partials, *g_Wc = partials + d, *g_Wx = partials + (1 + nc) * d;
  T *g_bc = partials + (1 + nc + nx) * d, *g_bx = g_bc + nc;
  std::vector<T> G(d), a_c(nc), a_x(nx);                        // dL/dc (the incoming gradient and the gates'), dL/dl
  for (int64_t n = first; n < last; ++n) {
    const T *xn = x + n * d, *gc = g_c + n * d, r = rho[n];
    for (int64_t j = 0; j < nc; ++j) g_bc[j] += a_c[j] = gate_c.backward(g_yc[n * nc + j], y_c[n * nc + j]);
    for (int64_t j = 0; j < nx; ++j) g_bx[j] += a_x[j] = gate_x.backward(g_yx[n * nx + j], y_x[n * nx + j]);
    LaneSum<T> s;
    simd_for<T>(d, [&](int64_t i, auto lanes) {               // G, and s = sum_i G_i g_i x_i
      using U = typename decltype(lanes)::type;
      U Gi = load<U>(gc + i);
      for (int64_t j = 0; j < nc; ++j) Gi += a_c[j] * load<U>(W_c + j * d + i);
      store(G.data() + i, Gi);
      s.add(Gi * load<U>(g + i) * load<U>(xn + i));
    });
    const T slope = -r * r * r * s.total() / d;                       // through rho: -rho^3 x s / d
    simd_for<T>(d, [&](int64_t i, auto lanes) {               // dL/dx in registers across the gates' rows
      using U = typename decltype(lanes)::type;
      const U Gi = load<U>(G.data() + i), gi = load<U>(g + i), xi = load<U>(xn + i);
      U gx = r * Gi * gi + slope * xi;
      store(g_g + i, load<U>(g_g + i) + r * Gi * xi);
      for (int64_t j = 0; j < nc; ++j) store(g_Wc + j * d + i, load<U>(g_Wc + j * d + i) + a_c[j] * r * xi * gi);
      for (int64_t j = 0; j < nx; ++j) {
        gx += a_x[j] * load<U>(W_x + j * d + i);
        store(g_Wx + j * d + i, load<U>(g_Wx + j * d + i) + a_x[j] * xi);
      }
      store(g_x + n * d + i, gx);
    });
  }
}

// ---- the ops: contiguous inputs, dtype dispatch ----

template <typename T>
const T* ptr(const Tensor& t) { return t.const_data_ptr<T>(); }

// The dtype an op computes in: its state's (or first input's), at least float.
at::ScalarType computing_type(const Tensor& t) { return at::promote_types(t.scalar_type(), at::kFloat); }

// t contiguous in the computing dtype acc: itself where it already is (no copy, no op call).
Tensor computed(const Tensor& t, at::ScalarType acc) { return (t.scalar_type() == acc ? t : t.to(acc)).contiguous(); }

// The loops index raw memory: every op first checks the shapes it relies on.
void check_shape(const Tensor& t, at::IntArrayRef shape, const char* name) {
  TORCH_CHECK(t.sizes() == shape, "ddl_delta: ", name, " has shape ", t.sizes(), ", expected ", shape);
}

void check_rows(const Tensor& t, int64_t rows, int64_t width, const char* name) {
  TORCH_CHECK(t.numel() == rows * width && (t.dim() == 0 || t.size(-1) == width), "ddl_delta: ", name,
              " has shape ", t.sizes(), ", expected ", rows, " rows of ", width);
}

void check_state(const Tensor& X, const Tensor& h) {
  TORCH_CHECK(X.dim() == 4 && h.dim() == 3, "ddl_delta: the state is (B,T,dv,d) and k~ (B,T,d)");
  check_shape(h, {X.size(0), X.size(1), X.size(3)}, "k~");
}

void check_taps(const Tensor& A, int64_t dv, int64_t d) {
  TORCH_CHECK(A.dim() == 3 && A.size(0) == dv && A.size(1) == d, "ddl_delta: taps have shape ", A.sizes(),
              ", expected (", dv, ", ", d, ", L)");
}

std::tuple<Tensor, Tensor, Tensor, Tensor> update_forward(const Tensor& X_, const Tensor& h_, const Tensor& beta_,
                                                          const Tensor& v_, double eps2) {
  const at::ScalarType acc = computing_type(X_);
  const Tensor X = computed(X_, acc), h = computed(h_, acc), beta = computed(beta_, acc), v = computed(v_, acc);
  check_state(X, h);
  const int64_t d = X.size(-1), dv = X.size(-2);
  check_shape(beta, {X.size(0), X.size(1), 1}, "beta");
  check_shape(v, {X.size(0), X.size(1), dv}, "v");
  Tensor X_new = at::empty_like(X), w = at::empty_like(v), rho = at::empty_like(beta), q = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::update_forward", [&] {
    update_forward_loop<scalar_t>(ptr<scalar_t>(X), ptr<scalar_t>(h), ptr<scalar_t>(beta), ptr<scalar_t>(v), eps2,
                                  X_new.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), rho.data_ptr<scalar_t>(),
                                  q.data_ptr<scalar_t>(), h.numel() / d, dv, d);
  });
  return {X_new, w, rho, q};
}

// Gradients of update_forward's (X_new, w) given G = dL/dX_new and g_w = dL/dw (absent: zero).
std::tuple<Tensor, Tensor, Tensor, Tensor> update_backward(const Tensor& G_, const std::optional<Tensor>& g_w_,
                                                           const Tensor& X_, const Tensor& h_, const Tensor& beta_,
                                                           const Tensor& v_, const Tensor& rho_, const Tensor& q_) {
  const at::ScalarType acc = computing_type(X_);
  const Tensor G = computed(G_, acc), X = computed(X_, acc), h = computed(h_, acc), beta = computed(beta_, acc);
  const Tensor v = computed(v_, acc), rho = computed(rho_, acc), q = computed(q_, acc);
  const Tensor g_w = g_w_ ? computed(*g_w_, acc) : Tensor();
  check_state(X, h);
  const int64_t d = X.size(-1), dv = X.size(-2);
  check_shape(G, X.sizes(), "dL/dX");
  for (const Tensor& t : {v, q}) check_shape(t, {X.size(0), X.size(1), dv}, "v, q");
  for (const Tensor& t : {beta, rho}) check_shape(t, {X.size(0), X.size(1), 1}, "beta, rho");
  if (g_w.defined()) check_shape(g_w, v.sizes(), "dL/dw");
  Tensor g_X = at::empty_like(X), g_h = at::empty_like(h), g_beta = at::empty_like(beta), g_v = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::update_backward", [&] {
    update_backward_loop<scalar_t>(ptr<scalar_t>(G), g_w.defined() ? ptr<scalar_t>(g_w) : nullptr, ptr<scalar_t>(X),
                                   ptr<scalar_t>(h), ptr<scalar_t>(beta), ptr<scalar_t>(v), ptr<scalar_t>(rho),
                                   ptr<scalar_t>(q), g_X.data_ptr<scalar_t>(), g_h.data_ptr<scalar_t>(),
                                   g_beta.data_ptr<scalar_t>(), g_v.data_ptr<scalar_t>(), h.numel() / d, dv, d);
  });
  return {g_X, g_h, g_beta, g_v};
}

std::tuple<Tensor, Tensor, Tensor> key_forward(const Tensor& X_, const Tensor& h_, const Tensor& beta_, const Tensor& v_,
                                               double eps2) {
  const at::ScalarType acc = computing_type(X_);
  const Tensor X = computed(X_, acc), h = computed(h_, acc), beta = computed(beta_, acc), v = computed(v_, acc);
  check_state(X, h);
  const int64_t d = X.size(-1), dv = X.size(-2);
  check_shape(beta, {X.size(0), X.size(1), 1}, "beta");
  check_shape(v, {X.size(0), X.size(1), dv}, "v");
  Tensor w = at::empty_like(v), rho = at::empty_like(beta), q = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::key_forward", [&] {
    key_forward_loop<scalar_t>(ptr<scalar_t>(X), ptr<scalar_t>(h), ptr<scalar_t>(beta), ptr<scalar_t>(v), eps2,
                               w.data_ptr<scalar_t>(), rho.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), h.numel() / d,
                               dv, d);
  });
  return {w, rho, q};
}

// The inputs of write_forward and write_backward, contiguous and checked: X (B,T,dv,d), h_a and h (B,T,d),
// w_a and v (B,T,dv), beta (B,T,1), A (dv,d,L) as by lag (L,dv,d).
struct WriteInputs {
  Tensor X, h_a, w_a, h, beta, v, A_lag;

  WriteInputs(const Tensor& X_, const Tensor& h_a_, const Tensor& w_a_, const Tensor& h_, const Tensor& beta_,
              const Tensor& v_, const Tensor& A)
      : X(computed(X_, computing_type(X_))), h_a(computed(h_a_, X.scalar_type())),
        w_a(computed(w_a_, X.scalar_type())), h(computed(h_, X.scalar_type())), beta(computed(beta_, X.scalar_type())),
        v(computed(v_, X.scalar_type())) {
    check_state(X, h);
    check_state(X, h_a);
    const int64_t B = X.size(0), T = X.size(1), dv = X.size(2);
    for (const Tensor& t : {w_a, v}) check_shape(t, {B, T, dv}, "w_a, v");
    check_shape(beta, {B, T, 1}, "beta");
    check_taps(A, dv, X.size(3));
    A_lag = taps_by_lag(A, X.scalar_type());
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> write_forward(const Tensor& X_, const Tensor& h_a_, const Tensor& w_a_,
                                                                 const Tensor& h_, const Tensor& beta_, const Tensor& v_,
                                                                 const Tensor& A, double eps2, bool store_state) {
  const WriteInputs in(X_, h_a_, w_a_, h_, beta_, v_, A);
  const int64_t B = in.X.size(0), T = in.X.size(1), dv = in.X.size(2), d = in.X.size(3);
  Tensor X_new = at::empty(store_state ? in.X.sizes() : at::IntArrayRef{0}, in.X.options());
  Tensor w = at::empty_like(in.v), rho = at::empty_like(in.beta), q = at::empty_like(in.v);
  Tensor x_next = at::empty({B, T, d}, in.X.options());
  AT_DISPATCH_FLOATING_TYPES(in.X.scalar_type(), "ddl_delta::write_forward", [&] {
    write_forward_loop<scalar_t>(ptr<scalar_t>(in.X), ptr<scalar_t>(in.h_a), ptr<scalar_t>(in.w_a), ptr<scalar_t>(in.h),
                                 ptr<scalar_t>(in.beta), ptr<scalar_t>(in.v), ptr<scalar_t>(in.A_lag), eps2,
                                 store_state ? X_new.data_ptr<scalar_t>() : nullptr, w.data_ptr<scalar_t>(),
                                 rho.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), x_next.data_ptr<scalar_t>(), B * T, T,
                                 in.A_lag.size(0), dv, d);
  });
  return {X_new, w, rho, q, x_next};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> write_backward(
    const std::optional<Tensor>& G_, const std::optional<Tensor>& g_w_, const Tensor& g_next_, const Tensor& X_,
    const Tensor& h_a_, const Tensor& w_a_, const Tensor& h_, const Tensor& beta_, const Tensor& v_, const Tensor& rho_,
    const Tensor& q_, const Tensor& A) {
  const WriteInputs in(X_, h_a_, w_a_, h_, beta_, v_, A);
  const int64_t B = in.X.size(0), T = in.X.size(1), dv = in.X.size(2), d = in.X.size(3), L = in.A_lag.size(0);
  const at::ScalarType acc = in.X.scalar_type();
  const Tensor G = G_ ? computed(*G_, acc) : Tensor(), g_w = g_w_ ? computed(*g_w_, acc) : Tensor();
  const Tensor g_next = computed(g_next_, acc), rho = computed(rho_, acc), q = computed(q_, acc);
  if (G.defined()) check_shape(G, in.X.sizes(), "dL/dX_out");
  if (g_w.defined()) check_shape(g_w, in.v.sizes(), "dL/dw");
  check_shape(g_next, {B, T, d}, "dL/dx_next");
  check_shape(rho, in.beta.sizes(), "rho");
  check_shape(q, in.v.sizes(), "q");
  Tensor G_mid = at::empty_like(in.X), g_h = at::empty_like(in.h), g_beta = at::empty_like(in.beta);
  Tensor g_v = at::empty_like(in.v), g_A_lag;
  AT_DISPATCH_FLOATING_TYPES(in.X.scalar_type(), "ddl_delta::write_backward", [&] {
    g_A_lag = sum_over_tokens<scalar_t>(B * T, in.A_lag.sizes(), in.X, [&](int64_t first, int64_t last, scalar_t* g_A) {
      write_backward_loop<scalar_t>(G.defined() ? ptr<scalar_t>(G) : nullptr, g_w.defined() ? ptr<scalar_t>(g_w) : nullptr,
                                    ptr<scalar_t>(g_next), ptr<scalar_t>(in.X), ptr<scalar_t>(in.h_a),
                                    ptr<scalar_t>(in.w_a), ptr<scalar_t>(in.h), ptr<scalar_t>(in.beta),
                                    ptr<scalar_t>(in.v), ptr<scalar_t>(rho), ptr<scalar_t>(q), ptr<scalar_t>(in.A_lag),
                                    G_mid.data_ptr<scalar_t>(), g_h.data_ptr<scalar_t>(), g_beta.data_ptr<scalar_t>(),
                                    g_v.data_ptr<scalar_t>(), g_A, first, last, T, L, dv, d);
    });
  });
  return {G_mid, g_h, g_beta, g_v, taps_from_lags(g_A_lag)};
}

// The steps' inputs, each checked and contiguous: h[s] (B,T,d), beta[s] (B,T,1), v[s] (B,T,dv).
struct Steps {
  std::vector<Tensor> h, beta, v;

  Steps(const Tensor& X, at::TensorList h_, at::TensorList beta_, at::TensorList v_) {
    TORCH_CHECK(!h_.empty() && h_.size() == beta_.size() && h_.size() == v_.size(),
                "ddl_delta: one k~, beta and v per step");
    for (size_t s = 0; s < h_.size(); ++s) {
      const at::ScalarType acc = X.scalar_type();
      h.push_back(computed(h_[s], acc)), beta.push_back(computed(beta_[s], acc)), v.push_back(computed(v_[s], acc));
      check_state(X, h[s]);
      check_shape(beta[s], {X.size(0), X.size(1), 1}, "beta");
      check_shape(v[s], {X.size(0), X.size(1), X.size(2)}, "v");
    }
  }

  template <typename T>
  static std::vector<const T*> ptrs(const std::vector<Tensor>& ts) {
    std::vector<const T*> out;
    for (const Tensor& t : ts) out.push_back(t.const_data_ptr<T>());
    return out;
  }
};

// The S updates of a sublayer in one pass: X_new, and w (B,T,S,dv), rho (B,T,S), q (B,T,S,dv) by step.
std::tuple<Tensor, Tensor, Tensor, Tensor> update_steps_forward(const Tensor& X_, at::TensorList h_,
                                                                at::TensorList beta_, at::TensorList v_, double eps2) {
  const at::ScalarType acc = computing_type(X_);
  const Tensor X = computed(X_, acc);
  TORCH_CHECK(X.dim() == 4, "ddl_delta: the state is (B,T,dv,d)");
  const Steps steps(X, h_, beta_, v_);
  const int64_t B = X.size(0), T = X.size(1), dv = X.size(2), d = X.size(3), S = steps.h.size();
  Tensor X_new = at::empty_like(X), w = at::empty({B, T, S, dv}, X.options()), rho = at::empty({B, T, S}, X.options());
  Tensor q = at::empty_like(w);
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::update_steps_forward", [&] {
    update_steps_forward_loop<scalar_t>(ptr<scalar_t>(X), Steps::ptrs<scalar_t>(steps.h),
                                        Steps::ptrs<scalar_t>(steps.beta), Steps::ptrs<scalar_t>(steps.v), eps2,
                                        X_new.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), rho.data_ptr<scalar_t>(),
                                        q.data_ptr<scalar_t>(), B * T, dv, d);
  });
  return {X_new, w, rho, q};
}

// Gradients of update_steps_forward's (X_new, w) for X and the steps' k~, beta, v (stacked by step, as w).
std::tuple<Tensor, Tensor, Tensor, Tensor> update_steps_backward(const Tensor& G_, const std::optional<Tensor>& g_w_,
                                                                 const Tensor& X_, at::TensorList h_,
                                                                 at::TensorList beta_, at::TensorList v_,
                                                                 const Tensor& rho_, const Tensor& q_) {
  const at::ScalarType acc = computing_type(X_);
  const Tensor G = computed(G_, acc), X = computed(X_, acc), rho = computed(rho_, acc), q = computed(q_, acc);
  const Tensor g_w = g_w_ ? computed(*g_w_, acc) : Tensor();
  TORCH_CHECK(X.dim() == 4, "ddl_delta: the state is (B,T,dv,d)");
  const Steps steps(X, h_, beta_, v_);
  const int64_t B = X.size(0), T = X.size(1), dv = X.size(2), d = X.size(3), S = steps.h.size();
  check_shape(G, X.sizes(), "dL/dX");
  check_shape(rho, {B, T, S}, "rho");
  check_shape(q, {B, T, S, dv}, "q");
  if (g_w.defined()) check_shape(g_w, q.sizes(), "dL/dw");
  Tensor g_X = at::empty_like(X), g_h = at::empty({B, T, S, d}, X.options()), g_beta = at::empty_like(rho);
  Tensor g_v = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::update_steps_backward", [&] {
    update_steps_backward_loop<scalar_t>(ptr<scalar_t>(G), g_w.defined() ? ptr<scalar_t>(g_w) : nullptr,
                                         ptr<scalar_t>(X), Steps::ptrs<scalar_t>(steps.h),
                                         Steps::ptrs<scalar_t>(steps.beta), Steps::ptrs<scalar_t>(steps.v),
                                         ptr<scalar_t>(rho), ptr<scalar_t>(q), g_X.data_ptr<scalar_t>(),
                                         g_h.data_ptr<scalar_t>(), g_beta.data_ptr<scalar_t>(),
                                         g_v.data_ptr<scalar_t>(), B * T, dv, d);
  });
  return {g_X, g_h, g_beta, g_v};
}

Tensor read_forward(const Tensor& X_, const Tensor& A) {
  const at::ScalarType acc = computing_type(X_);
  TORCH_CHECK(X_.dim() == 4, "ddl_delta: the state is (B,T,dv,d)");
  check_taps(A, X_.size(2), X_.size(3));
  const Tensor X = computed(X_, acc), A_lag = taps_by_lag(A, X.scalar_type());
  const int64_t T = X.size(1), dv = X.size(2), d = X.size(3);
  Tensor x = at::empty({X.size(0), T, d}, X.options());
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::read_forward", [&] {
    read_forward_loop<scalar_t>(ptr<scalar_t>(X), ptr<scalar_t>(A_lag), x.data_ptr<scalar_t>(), X.size(0) * T, T,
                                A_lag.size(0), dv, d);
  });
  return x;
}

std::tuple<Tensor, Tensor> read_backward(const Tensor& g_, const Tensor& X_, const Tensor& A) {
  const at::ScalarType acc = computing_type(X_);
  TORCH_CHECK(X_.dim() == 4, "ddl_delta: the state is (B,T,dv,d)");
  check_taps(A, X_.size(2), X_.size(3));
  check_shape(g_, {X_.size(0), X_.size(1), X_.size(3)}, "dL/dx");
  const Tensor g = computed(g_, acc), X = computed(X_, acc), A_lag = taps_by_lag(A, X.scalar_type());
  const int64_t T = X.size(1), dv = X.size(2), d = X.size(3), L = A_lag.size(0);
  Tensor g_X = at::empty_like(X), g_A_lag;
  AT_DISPATCH_FLOATING_TYPES(X.scalar_type(), "ddl_delta::read_backward", [&] {
    g_A_lag = sum_over_tokens<scalar_t>(X.size(0) * T, A_lag.sizes(), X, [&](int64_t first, int64_t last, scalar_t* g_A) {
      read_backward_loop<scalar_t>(ptr<scalar_t>(g), ptr<scalar_t>(X), ptr<scalar_t>(A_lag), g_X.data_ptr<scalar_t>(),
                                   g_A, first, last, T, L, dv, d);
    });
  });
  return {g_X, taps_from_lags(g_A_lag)};
}

Tensor rank_one_forward(const Tensor& w_, const Tensor& h_, const Tensor& A) {
  const at::ScalarType acc = computing_type(w_);
  TORCH_CHECK(w_.dim() == 3 && h_.dim() == 3, "ddl_delta: w is (B,T,dv) and k~ (B,T,d)");
  check_shape(w_, {h_.size(0), h_.size(1), w_.size(2)}, "w");
  check_taps(A, w_.size(2), h_.size(2));
  const Tensor w = computed(w_, acc), h = computed(h_, acc), A_lag = taps_by_lag(A, h.scalar_type());
  const int64_t T = h.size(1), d = h.size(2);
  Tensor x = at::empty_like(h);
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "ddl_delta::rank_one_forward", [&] {
    rank_one_forward_loop<scalar_t>(ptr<scalar_t>(w), ptr<scalar_t>(h), ptr<scalar_t>(A_lag), x.data_ptr<scalar_t>(),
                                    h.size(0) * T, T, A_lag.size(0), w.size(2), d);
  });
  return x;
}

std::tuple<Tensor, Tensor, Tensor> rank_one_backward(const Tensor& g_, const Tensor& w_, const Tensor& h_,
                                                     const Tensor& A) {
  const at::ScalarType acc = computing_type(w_);
  TORCH_CHECK(w_.dim() == 3 && h_.dim() == 3, "ddl_delta: w is (B,T,dv) and k~ (B,T,d)");
  check_shape(w_, {h_.size(0), h_.size(1), w_.size(2)}, "w");
  check_shape(g_, h_.sizes(), "dL/dx");
  check_taps(A, w_.size(2), h_.size(2));
  const Tensor g = computed(g_, acc), w = computed(w_, acc), h = computed(h_, acc), A_lag = taps_by_lag(A, h.scalar_type());
  const int64_t T = h.size(1), d = h.size(2), L = A_lag.size(0);
  Tensor g_w = at::empty_like(w), g_h = at::empty_like(h), g_A_lag;
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "ddl_delta::rank_one_backward", [&] {
    g_A_lag = sum_over_tokens<scalar_t>(h.size(0) * T, A_lag.sizes(), h, [&](int64_t first, int64_t last, scalar_t* g_A) {
      rank_one_backward_loop<scalar_t>(ptr<scalar_t>(g), ptr<scalar_t>(w), ptr<scalar_t>(h), ptr<scalar_t>(A_lag),
                                       g_w.data_ptr<scalar_t>(), g_h.data_ptr<scalar_t>(), g_A, first, last, T, L,
                                       w.size(2), d);
    });
  });
  return {g_w, g_h, taps_from_lags(g_A_lag)};
}

Tensor expand_forward(const Tensor& x_, const Tensor& E) {
  const at::ScalarType acc = computing_type(x_);
  TORCH_CHECK(x_.dim() == 3 && E.dim() == 3, "ddl_delta: x is (B,T,d) and the expander's taps (dv,d,L)");
  check_taps(E, E.size(0), x_.size(2));
  const Tensor x = computed(x_, acc), E_lag = taps_by_lag(E, x.scalar_type());
  const int64_t T = x.size(1), d = x.size(2), dv = E_lag.size(1);
  Tensor X = at::empty({x.size(0), T, dv, d}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ddl_delta::expand_forward", [&] {
    expand_forward_loop<scalar_t>(ptr<scalar_t>(x), ptr<scalar_t>(E_lag), X.data_ptr<scalar_t>(), x.size(0) * T, T,
                                  E_lag.size(0), dv, d);
  });
  return X;
}

std::tuple<Tensor, Tensor> expand_backward(const Tensor& g_, const Tensor& x_, const Tensor& E) {
  const at::ScalarType acc = computing_type(x_);
  TORCH_CHECK(x_.dim() == 3 && E.dim() == 3, "ddl_delta: x is (B,T,d) and the expander's taps (dv,d,L)");
  check_taps(E, E.size(0), x_.size(2));
  check_shape(g_, {x_.size(0), x_.size(1), E.size(0), x_.size(2)}, "dL/dX");
  const Tensor g = computed(g_, acc), x = computed(x_, acc), E_lag = taps_by_lag(E, x.scalar_type());
  const int64_t T = x.size(1), d = x.size(2), dv = E_lag.size(1), L = E_lag.size(0);
  Tensor g_x = at::empty_like(x), g_E_lag;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ddl_delta::expand_backward", [&] {
    g_E_lag = sum_over_tokens<scalar_t>(x.size(0) * T, E_lag.sizes(), x, [&](int64_t first, int64_t last, scalar_t* g_E) {
      expand_backward_loop<scalar_t>(ptr<scalar_t>(g), ptr<scalar_t>(x), ptr<scalar_t>(E_lag), g_x.data_ptr<scalar_t>(),
                                     g_E, first, last, T, L, dv, d);
    });
  });
  return {g_x, taps_from_lags(g_E_lag)};
}

// A gate's biases, checked and contiguous (undefined: the map is ungated).
Tensor gate_biases(const std::optional<Tensor>& b, int64_t width, const char* name, at::ScalarType acc) {
  if (!b.has_value()) return Tensor();
  check_shape(*b, {width}, name);
  return computed(*b, acc);
}

template <typename T>
Gate<T> make_gate(const Tensor& b, double s) { return {b.defined() ? ptr<T>(b) : nullptr, static_cast<T>(s)}; }

std::tuple<Tensor, Tensor, Tensor, Tensor> norm_forward(const Tensor& x_, const Tensor& g_, const Tensor& W_c_,
                                                        const Tensor& W_x_, const std::optional<Tensor>& b_c_,
                                                        const std::optional<Tensor>& b_x_, double s_c, double s_x,
                                                        double eps) {
  const at::ScalarType acc = computing_type(x_);
  const Tensor x = computed(x_, acc), g = computed(g_, acc), W_c = computed(W_c_, acc), W_x = computed(W_x_, acc);
  const int64_t d = x.size(-1), N = x.numel() / d, nc = W_c.size(0), nx = W_x.size(0);
  check_shape(g, {d}, "the norm's weight");
  check_shape(W_c, {nc, d}, "W_c");
  check_shape(W_x, {nx, d}, "W_x");
  const Tensor b_c = gate_biases(b_c_, nc, "b_c", acc), b_x = gate_biases(b_x_, nx, "b_x", acc);
  std::vector<int64_t> rows(x.sizes().begin(), x.sizes().end() - 1);
  auto with_last = [&](int64_t k) { auto shape = rows; shape.push_back(k); return shape; };
  Tensor c = at::empty_like(x), y_c = at::empty(with_last(nc), x.options()), y_x = at::empty(with_last(nx), x.options());
  Tensor rho = at::empty(with_last(1), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ddl_delta::norm_forward", [&] {
    norm_forward_loop<scalar_t>(ptr<scalar_t>(x), ptr<scalar_t>(g), ptr<scalar_t>(W_c), ptr<scalar_t>(W_x),
                                make_gate<scalar_t>(b_c, s_c), make_gate<scalar_t>(b_x, s_x), eps,
                                c.data_ptr<scalar_t>(), y_c.data_ptr<scalar_t>(), y_x.data_ptr<scalar_t>(),
                                rho.data_ptr<scalar_t>(), N, nc, nx, d);
  });
  return {c, y_c, y_x, rho};
}

// The gates' outputs y_c, y_x are norm_forward's (their activations' derivatives are taken from them); b_c, b_x the
// same biases or none. dL/db_c, dL/db_x are empty for an ungated map.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> norm_backward(
    const Tensor& g_c_, const Tensor& g_yc_, const Tensor& g_yx_, const Tensor& x_, const Tensor& g_, const Tensor& W_c_,
    const Tensor& W_x_, const std::optional<Tensor>& b_c_, const std::optional<Tensor>& b_x_, double s_c, double s_x,
    const Tensor& rho_, const Tensor& y_c_, const Tensor& y_x_) {
  const at::ScalarType acc = computing_type(x_);
  const Tensor g_c = computed(g_c_, acc), g_yc = computed(g_yc_, acc), g_yx = computed(g_yx_, acc), x = computed(x_, acc);
  const Tensor g = computed(g_, acc), W_c = computed(W_c_, acc), W_x = computed(W_x_, acc), rho = computed(rho_, acc);
  const Tensor y_c = computed(y_c_, acc), y_x = computed(y_x_, acc);
  const int64_t d = x.size(-1), N = x.numel() / d, nc = W_c.size(0), nx = W_x.size(0);
  check_shape(g, {d}, "the norm's weight");
  check_shape(W_c, {nc, d}, "W_c");
  check_shape(W_x, {nx, d}, "W_x");
  check_shape(g_c, x.sizes(), "dL/dc");
  check_rows(g_yc, N, nc, "dL/dy_c");
  check_rows(g_yx, N, nx, "dL/dy_x");
  check_rows(y_c, N, nc, "y_c");
  check_rows(y_x, N, nx, "y_x");
  check_rows(rho, N, 1, "rho");
  const Tensor b_c = gate_biases(b_c_, nc, "b_c", acc), b_x = gate_biases(b_x_, nx, "b_x", acc);
  Tensor g_x = at::empty_like(x), g_g = at::empty({d}, x.options()), g_Wc = at::empty({nc, d}, x.options());
  Tensor g_Wx = at::empty({nx, d}, x.options()), g_bc = at::empty({nc}, x.options()), g_bx = at::empty({nx}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ddl_delta::norm_backward", [&] {
    sum_over_tokens<scalar_t>(N, {g_g, g_Wc, g_Wx, g_bc, g_bx}, x, [&](int64_t first, int64_t last, scalar_t* partials) {
      norm_backward_loop<scalar_t>(ptr<scalar_t>(g_c), ptr<scalar_t>(g_yc), ptr<scalar_t>(g_yx), ptr<scalar_t>(x),
                                   ptr<scalar_t>(g), ptr<scalar_t>(W_c), ptr<scalar_t>(W_x), ptr<scalar_t>(rho),
                                   ptr<scalar_t>(y_c), ptr<scalar_t>(y_x), make_gate<scalar_t>(b_c, s_c),
                                   make_gate<scalar_t>(b_x, s_x), g_x.data_ptr<scalar_t>(), partials, first, last, nc,
                                   nx, d);
    });
  });
  auto gated = [&](const Tensor& b, const Tensor& g_b) { return b.defined() ? g_b : at::empty({0}, x.options()); };
  return {g_x, g_g, g_Wc, g_Wx, gated(b_c, g_bc), gated(b_x, g_bx)};
}

// Eager autograd in C++ for the ops every sublayer runs: what fused/__init__.py's FusedDeltaUpdate, DeltaKey,
// DeltaWrite and FusedNormProjections do with these loops (the same saved tensors, casts and gradients), without
// Python's Function machinery, which is most of a small step's time. torch.compile traces the Python Functions.
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Tensor in_dtype(const Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

std::optional<Tensor> given(const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; }

// A state-shaped zero that allocates nothing: the handle of DeltaKey's mid state, an unused state's gradient.
Tensor zeros_as(const Tensor& X) { return at::zeros({}, X.options()).expand(X.sizes()); }

// The gradients of an update's X, k~, beta, v from what its forward saved, {X, h, beta, v, rho, q, ...}.
std::tuple<Tensor, Tensor, Tensor, Tensor> update_grads(const Tensor& G, const Tensor& g_w, const variable_list& s) {
  return update_backward(G.defined() ? G : zeros_as(s[0]), given(g_w), s[0], s[1], s[2], s[3], s[4], s[5]);
}

class DeltaUpdate : public torch::autograd::Function<DeltaUpdate> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& X, const Tensor& h, const Tensor& beta,
                               const Tensor& v, double eps2) {
    auto [X_new, w, rho, q] = update_forward(X, h, beta, v, eps2);
    ctx->save_for_backward({X, h, beta, v, rho, q});
    ctx->set_materialize_grads(false);                    // w's gradient is undefined where w is unused (d_v = 1)
    return {in_dtype(X_new, X.scalar_type()), w};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto [g_X, g_h, g_beta, g_v] = update_grads(grads[0], grads[1], ctx->get_saved_variables());
    return {g_X, g_h, g_beta, g_v, Tensor()};
  }
};

std::tuple<Tensor, Tensor> update_autograd(const Tensor& X, const Tensor& h, const Tensor& beta, const Tensor& v,
                                           double eps2) {
  const variable_list out = DeltaUpdate::apply(X, h, beta, v, eps2);
  return {out[0], out[1]};
}

class DeltaKey : public torch::autograd::Function<DeltaKey> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& X, const Tensor& h, const Tensor& beta,
                               const Tensor& v, const Tensor& x_in, const Tensor& A, double eps2) {
    auto [w, rho, q] = key_forward(X, h, beta, v, eps2);
    ctx->save_for_backward({X, h, beta, v, rho, q, w, A});
    ctx->set_materialize_grads(false);
    return {w, zeros_as(X), x_in + rank_one_forward(w, h, A)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &g_w = grads[0], &G_mid = grads[1], &g_read = grads[2];
    if (!g_read.defined()) {
      auto [g_X, g_h, g_beta, g_v] = update_grads(G_mid, g_w, s);
      return {g_X, g_h, g_beta, g_v, Tensor(), Tensor(), Tensor()};
    }
    auto [g_w_read, g_h_read, g_A] = rank_one_backward(g_read, s[6], s[1], s[7]);
    auto [g_X, g_h, g_beta, g_v] = update_grads(G_mid, g_w.defined() ? g_w + g_w_read : g_w_read, s);
    return {g_X, g_h + g_h_read, g_beta, g_v, g_read, g_A, Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> key_autograd(const Tensor& X, const Tensor& h, const Tensor& beta, const Tensor& v,
                                                const Tensor& x_in, const Tensor& A, double eps2) {
  const variable_list out = DeltaKey::apply(X, h, beta, v, x_in, A, eps2);
  return {out[0], out[1], out[2]};
}

// handle: DeltaKey's of the mid state, an input for its gradient (dL/dX_mid) alone.
class DeltaWrite : public torch::autograd::Function<DeltaWrite> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& handle, const Tensor& X, const Tensor& h_a,
                               const Tensor& w_a, const Tensor& h, const Tensor& beta, const Tensor& v, const Tensor& A,
                               double eps2, bool store_state) {
    auto [X_out, w, rho, q, x_next] = write_forward(X, h_a, w_a, h, beta, v, A, eps2, store_state);
    ctx->save_for_backward({X, h_a, w_a, h, beta, v, rho, q, A});
    ctx->set_materialize_grads(false);
    return {in_dtype(X_out, X.scalar_type()), w, x_next};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor& X = s[0];
    const Tensor G = grads[0].defined() && grads[0].numel() > 0 ? grads[0] : Tensor();   // the unstored state's
    const Tensor g_next = grads[2].defined() ? grads[2]
        : at::zeros({X.size(0), X.size(1), X.size(3)}, X.options().dtype(computing_type(X)));
    auto [G_mid, g_h, g_beta, g_v, g_A] =
        write_backward(given(G), given(grads[1]), g_next, X, s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]);
    return {G_mid, Tensor(), Tensor(), Tensor(), g_h, g_beta, g_v, g_A, Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> write_autograd(const Tensor& handle, const Tensor& X, const Tensor& h_a,
                                                  const Tensor& w_a, const Tensor& h, const Tensor& beta,
                                                  const Tensor& v, const Tensor& A, double eps2, bool store_state) {
  const variable_list out = DeltaWrite::apply(handle, X, h_a, w_a, h, beta, v, A, eps2, store_state);
  return {out[0], out[1], out[2]};
}

class NormProjections : public torch::autograd::Function<NormProjections> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& g, const Tensor& W_c,
                               const Tensor& W_x, const std::optional<Tensor>& b_c, const std::optional<Tensor>& b_x,
                               double s_c, double s_x, double eps) {
    const at::ScalarType c_dtype = at::autocast::is_autocast_enabled(at::kCPU)
                                       ? at::autocast::get_autocast_dtype(at::kCPU) : x.scalar_type();
    auto [c, y_c, y_x, rho] = norm_forward(x, g, W_c, W_x, b_c, b_x, s_c, s_x, eps);
    ctx->save_for_backward({x, g, W_c, W_x, b_c.value_or(Tensor()), b_x.value_or(Tensor()), rho, y_c, y_x});
    ctx->saved_data["s_c"] = s_c;
    ctx->saved_data["s_x"] = s_x;
    return {in_dtype(c, c_dtype), y_c, y_x};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    auto [g_x, g_g, g_Wc, g_Wx, g_bc, g_bx] =
        norm_backward(grads[0], grads[1], grads[2], s[0], s[1], s[2], s[3], given(s[4]), given(s[5]),
                      ctx->saved_data["s_c"].toDouble(), ctx->saved_data["s_x"].toDouble(), s[6], s[7], s[8]);
    return {g_x, g_g, g_Wc, g_Wx, s[4].defined() ? g_bc : Tensor(), s[5].defined() ? g_bx : Tensor(),
            Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> norm_autograd(const Tensor& x, const Tensor& g, const Tensor& W_c,
                                                 const Tensor& W_x, const std::optional<Tensor>& b_c,
                                                 const std::optional<Tensor>& b_x, double s_c, double s_x, double eps) {
  const variable_list out = NormProjections::apply(x, g, W_c, W_x, b_c, b_x, s_c, s_x, eps);
  return {out[0], out[1], out[2]};
}

}  // namespace

TORCH_LIBRARY(ddl_delta, m) {
  m.def("update_forward(Tensor X, Tensor h, Tensor beta, Tensor v, float eps2) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("update_backward(Tensor G, Tensor? g_w, Tensor X, Tensor h, Tensor beta, Tensor v, Tensor rho, Tensor q)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("key_forward(Tensor X, Tensor h, Tensor beta, Tensor v, float eps2) -> (Tensor, Tensor, Tensor)");
  m.def("write_forward(Tensor X, Tensor h_a, Tensor w_a, Tensor h, Tensor beta, Tensor v, Tensor A, float eps2,"
        " bool store_state) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("write_backward(Tensor? G, Tensor? g_w, Tensor g_next, Tensor X, Tensor h_a, Tensor w_a, Tensor h, Tensor beta,"
        " Tensor v, Tensor rho, Tensor q, Tensor A) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("update_steps_forward(Tensor X, Tensor[] h, Tensor[] beta, Tensor[] v, float eps2)"
        " -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("update_steps_backward(Tensor G, Tensor? g_w, Tensor X, Tensor[] h, Tensor[] beta, Tensor[] v, Tensor rho,"
        " Tensor q) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("read_forward(Tensor X, Tensor A) -> Tensor");
  m.def("read_backward(Tensor g, Tensor X, Tensor A) -> (Tensor, Tensor)");
  m.def("rank_one_forward(Tensor w, Tensor h, Tensor A) -> Tensor");
  m.def("rank_one_backward(Tensor g, Tensor w, Tensor h, Tensor A) -> (Tensor, Tensor, Tensor)");
  m.def("expand_forward(Tensor x, Tensor E) -> Tensor");
  m.def("expand_backward(Tensor g, Tensor x, Tensor E) -> (Tensor, Tensor)");
  m.def("norm_forward(Tensor x, Tensor g, Tensor W_c, Tensor W_x, Tensor? b_c, Tensor? b_x, float s_c, float s_x,"
        " float eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("norm_backward(Tensor g_c, Tensor g_yc, Tensor g_yx, Tensor x, Tensor g, Tensor W_c, Tensor W_x, Tensor? b_c,"
        " Tensor? b_x, float s_c, float s_x, Tensor rho, Tensor y_c, Tensor y_x)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("update(Tensor X, Tensor h, Tensor beta, Tensor v, float eps2) -> (Tensor, Tensor)");
  m.def("key(Tensor X, Tensor h, Tensor beta, Tensor v, Tensor x_in, Tensor A, float eps2)"
        " -> (Tensor, Tensor, Tensor)");
  m.def("write(Tensor handle, Tensor X, Tensor h_a, Tensor w_a, Tensor h, Tensor beta, Tensor v, Tensor A, float eps2,"
        " bool store_state) -> (Tensor, Tensor, Tensor)");
  m.def("norm(Tensor x, Tensor g, Tensor W_c, Tensor W_x, Tensor? b_c, Tensor? b_x, float s_c, float s_x, float eps)"
        " -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ddl_delta, CPU, m) {
  m.impl("update_forward", update_forward);
  m.impl("update_backward", update_backward);
  m.impl("key_forward", key_forward);
  m.impl("write_forward", write_forward);
  m.impl("write_backward", write_backward);
  m.impl("update_steps_forward", update_steps_forward);
  m.impl("update_steps_backward", update_steps_backward);
  m.impl("read_forward", read_forward);
  m.impl("read_backward", read_backward);
  m.impl("rank_one_forward", rank_one_forward);
  m.impl("rank_one_backward", rank_one_backward);
  m.impl("expand_forward", expand_forward);
  m.impl("expand_backward", expand_backward);
  m.impl("norm_forward", norm_forward);
  m.impl("norm_backward", norm_backward);
}

// One kernel for every dispatch key: the Function records its node where a gradient is wanted, none under no_grad or
// inference_mode. CPU tensors only (the loops'); never traced (torch.compile takes the Python Functions).
TORCH_LIBRARY_IMPL(ddl_delta, CompositeImplicitAutograd, m) {
  m.impl("update", update_autograd);
  m.impl("key", key_autograd);
  m.impl("write", write_autograd);
  m.impl("norm", norm_autograd);
}
