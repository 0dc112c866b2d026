// The fused talking-heads softmax as XLA FFI custom calls, for JAX on CPU.
//
// The same computation as talking_heads_softmax.cc (the TensorFlow op), for
// its common case: dense projections, an optional boolean mask, float32.
// Letters as in thattn/core/dims.py. Per example and block of query rows:
//   L[h, n, m]   = einsum(J[h_k, n, m], P_l[h_k, h])
//   W[h, n, m]   = softmax over m of (mask ? L : -1e9)
//   U[h_v, n, m] = einsum(W[h, n, m], P_w[h, h_v])
// A block of query rows goes through the three steps in cache and only U is
// written; the gradient recomputes L and W from J, so a training step keeps
// J (and U for dV) only. As XLA compiles the mixes of the einsum form, each
// is a pass over a whole [b, heads, n, m] tensor, forward and backward
// (benchmarks/RESULTS.md, "thattn.keras3 against ...").
//
// Handlers (thattn/kernels/jax_kernel.py registers and calls them):
//   ThattnTalkingHeadsSoftmaxXla(J, P_l, P_w, mask) -> U
//   ThattnTalkingHeadsSoftmaxGradXla(J, P_l, P_w, mask, dU) -> dJ, dP_l, dP_w
// J [b, h_k, n, m], P_l [h_k, h], P_w [h, h_v], mask bool [b, n, m] (true:
// may attend) or with no elements (no mask), U and dU [b, h_v, n, m].
// Work is split over (example, block) pairs on std::threads, one per core.
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "Eigen/Core"
#include "xla/ffi/api/ffi.h"

namespace thattn {
namespace {

namespace ffi = ::xla::ffi;

using Matrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// A block of a [b, heads, n, m] tensor: `heads` rows of rows*m floats, each
// a run of one head's query rows, n*m floats apart.
using BlockView = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
using ConstBlockView = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using ConstMatrixView = Eigen::Map<const Matrix>;
using Run = Eigen::Map<Eigen::ArrayXf>;
using ConstRun = Eigen::Map<const Eigen::ArrayXf>;

constexpr int64_t kRowsPerBlock = 8;
constexpr float kMaskedLogit = -1e9f;  // as thattn.attention_spec

struct Geometry {
  int64_t batch, key_heads, heads, value_heads, length, memory;

  int64_t blocks() const {
    return (length + kRowsPerBlock - 1) / kRowsPerBlock;
  }
  int64_t offset(int64_t example, int64_t heads_count, int64_t row) const {
    return (example * heads_count * length + row) * memory;
  }
};

struct Block {
  int64_t example, first_row, rows;
};

Geometry ReadGeometry(const ffi::Buffer<ffi::F32>& dots,
                      const ffi::Buffer<ffi::F32>& pre,
                      const ffi::Buffer<ffi::F32>& post) {
  const auto d = dots.dimensions();
  return {d[0], d[1], pre.dimensions()[1], post.dimensions()[1], d[2], d[3]};
}

// Runs body(thread, block) over every (example, block of rows) pair.
template <typename Body>
int64_t ForEachBlock(const Geometry& g, Body body) {
  const int64_t tasks = g.batch * g.blocks();
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(
      tasks, std::thread::hardware_concurrency()));
  auto work = [&](int64_t thread) {
    for (int64_t task = thread; task < tasks; task += threads) {
      const int64_t first_row = (task % g.blocks()) * kRowsPerBlock;
      body(thread, Block{task / g.blocks(), first_row,
                         std::min(kRowsPerBlock, g.length - first_row)});
    }
  };
  std::vector<std::thread> pool;
  for (int64_t thread = 1; thread < threads; ++thread) {
    pool.emplace_back(work, thread);
  }
  work(0);
  for (auto& thread : pool) thread.join();
  return threads;
}

// W = softmax(mask ? P_l^T J : -1e9) of one block, [h, rows * m].
Matrix Weights(const Geometry& g, const Block& block, const float* dots,
               const Matrix& pre_transposed, const bool* mask) {
  ConstBlockView j(dots + g.offset(block.example, g.key_heads,
                                   block.first_row),
                   g.key_heads, block.rows * g.memory,
                   Eigen::OuterStride<>(g.length * g.memory));
  Matrix weights = pre_transposed * j;
  for (int64_t head = 0; head < g.heads; ++head) {
    for (int64_t row = 0; row < block.rows; ++row) {
      Run logits(weights.row(head).data() + row * g.memory, g.memory);
      if (mask != nullptr) {
        const bool* allowed =
            mask + (block.example * g.length + block.first_row + row) *
                       g.memory;
        for (int64_t column = 0; column < g.memory; ++column) {
          if (!allowed[column]) logits[column] = kMaskedLogit;
        }
      }
      logits = (logits - logits.maxCoeff()).exp();
      logits /= logits.sum();
    }
  }
  return weights;
}

const bool* MaskOrNull(const ffi::Buffer<ffi::PRED>& mask) {
  return mask.element_count() == 0 ? nullptr : mask.typed_data();
}

ffi::Error Forward(ffi::Buffer<ffi::F32> dots, ffi::Buffer<ffi::F32> pre,
                   ffi::Buffer<ffi::F32> post, ffi::Buffer<ffi::PRED> mask,
                   ffi::ResultBuffer<ffi::F32> value_weights) {
  const Geometry g = ReadGeometry(dots, pre, post);
  const Matrix pre_transposed =
      ConstMatrixView(pre.typed_data(), g.key_heads, g.heads).transpose();
  const Matrix post_transposed =
      ConstMatrixView(post.typed_data(), g.heads, g.value_heads).transpose();
  ForEachBlock(g, [&](int64_t, const Block& block) {
    const Matrix weights = Weights(g, block, dots.typed_data(),
                                   pre_transposed, MaskOrNull(mask));
    BlockView u(value_weights->typed_data() +
                    g.offset(block.example, g.value_heads, block.first_row),
                g.value_heads, block.rows * g.memory,
                Eigen::OuterStride<>(g.length * g.memory));
    u.noalias() = post_transposed * weights;
  });
  return ffi::Error::Success();
}

ffi::Error Gradient(ffi::Buffer<ffi::F32> dots, ffi::Buffer<ffi::F32> pre,
                    ffi::Buffer<ffi::F32> post, ffi::Buffer<ffi::PRED> mask,
                    ffi::Buffer<ffi::F32> d_value_weights,
                    ffi::ResultBuffer<ffi::F32> d_dots,
                    ffi::ResultBuffer<ffi::F32> d_pre,
                    ffi::ResultBuffer<ffi::F32> d_post) {
  const Geometry g = ReadGeometry(dots, pre, post);
  const ConstMatrixView pre_matrix(pre.typed_data(), g.key_heads, g.heads);
  const ConstMatrixView post_matrix(post.typed_data(), g.heads,
                                    g.value_heads);
  const Matrix pre_transposed = pre_matrix.transpose();
  const int64_t max_threads = std::max<int64_t>(
      1, std::thread::hardware_concurrency());
  // Each thread sums its blocks' projection gradients; added up after.
  std::vector<Matrix> d_pre_parts(max_threads,
                                  Matrix::Zero(g.key_heads, g.heads));
  std::vector<Matrix> d_post_parts(max_threads,
                                   Matrix::Zero(g.heads, g.value_heads));
  const Eigen::OuterStride<> stride(g.length * g.memory);
  ForEachBlock(g, [&](int64_t thread, const Block& block) {
    const Matrix weights = Weights(g, block, dots.typed_data(),
                                   pre_transposed, MaskOrNull(mask));
    const int64_t width = block.rows * g.memory;
    ConstBlockView du(d_value_weights.typed_data() +
                          g.offset(block.example, g.value_heads,
                                   block.first_row),
                      g.value_heads, width, stride);
    d_post_parts[thread].noalias() += weights * du.transpose();
    // dW = P_w dU, then the softmax's gradient in place: dL = W (dW - <dW, W>),
    // zero where masked (a masked logit is a constant; this matters in a
    // fully masked row, whose weights are uniform, not zero).
    Matrix d_logits = post_matrix * du;
    const bool* mask_data = MaskOrNull(mask);
    for (int64_t head = 0; head < g.heads; ++head) {
      for (int64_t row = 0; row < block.rows; ++row) {
        Run gradient(d_logits.row(head).data() + row * g.memory, g.memory);
        ConstRun weight(weights.row(head).data() + row * g.memory, g.memory);
        gradient = weight * (gradient - (gradient * weight).sum());
        if (mask_data == nullptr) continue;
        const bool* allowed =
            mask_data + (block.example * g.length + block.first_row + row) *
                            g.memory;
        for (int64_t column = 0; column < g.memory; ++column) {
          if (!allowed[column]) gradient[column] = 0.0f;
        }
      }
    }
    ConstBlockView j(dots.typed_data() + g.offset(block.example, g.key_heads,
                                                  block.first_row),
                     g.key_heads, width, stride);
    d_pre_parts[thread].noalias() += j * d_logits.transpose();
    BlockView dj(d_dots->typed_data() + g.offset(block.example, g.key_heads,
                                                 block.first_row),
                 g.key_heads, width, stride);
    dj.noalias() = pre_matrix * d_logits;
  });
  Eigen::Map<Matrix> d_pre_out(d_pre->typed_data(), g.key_heads, g.heads);
  Eigen::Map<Matrix> d_post_out(d_post->typed_data(), g.heads,
                                g.value_heads);
  d_pre_out.setZero();
  d_post_out.setZero();
  for (const Matrix& part : d_pre_parts) d_pre_out += part;
  for (const Matrix& part : d_post_parts) d_post_out += part;
  return ffi::Error::Success();
}

}  // namespace
}  // namespace thattn

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    ThattnTalkingHeadsSoftmaxXla, thattn::Forward,
    xla::ffi::Ffi::Bind()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    ThattnTalkingHeadsSoftmaxGradXla, thattn::Gradient,
    xla::ffi::Ffi::Bind()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
        .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
        .Ret<xla::ffi::Buffer<xla::ffi::F32>>());
