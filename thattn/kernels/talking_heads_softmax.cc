// Fused talking-heads softmax for CPU: mix, softmax and mix again while a
// block of query rows is in cache.
//
// Letters as in thattn/core/dims.py. Per example and query row n:
//   L[h, n, m]   = einsum(J[h_k, n, m], P_l[h_k, h]) + B[h, n, m]
//   W[h, n, m]   = softmax over m of (mask ? L : -1e9)
//   U[h_v, n, m] = einsum(W[h, n, m], P_w[h, h_v])
//
// Why a kernel: done as TensorFlow ops, each of these steps reads and writes
// a whole [b, heads, n, m] tensor, and on CPU those passes are bound by
// memory traffic, not multiplies (benchmarks/RESULTS.md, issue 3). Here a
// block of query rows goes through all three steps in cache and only U is
// written. The gradient op recomputes L and W from J the same way, so the
// forward pass keeps neither: a training step stores J and U only.
//
// Dynamic projections (the paper's Appendix A) add per-query and per-memory
// mixing matrices to P_l and P_w:
//   L[h, n, m]   += einsum(J[h_k, n, m], R_Xl[n, h_k, h] + R_Ml[m, h_k, h])
//   U[h_v, n, m] += einsum(W[h, n, m],   R_Xw[n, h, h_v] + R_Mw[m, h, h_v])
// The per-query terms join P_l (P_w) in one matrix per query row, (P_l +
// R_Xl[n]), so they cost one product per row; the per-memory terms are
// multiply-adds along m, vectorized over m, from R_Ml stored [h_k, h, m].
// Neither ever forms a [n, m, h_k, h] tensor.
//
// Ops (thattn/kernels/talking_heads_softmax.py wraps them and registers the
// gradient):
//   ThattnTalkingHeadsSoftmax(dots J, pre P_l, post P_w, mask, bias B,
//                             x2l R_Xl, m2l R_Ml, x2w R_Xw, m2w R_Mw) -> U
//   ThattnTalkingHeadsSoftmaxGrad(the same nine, dU)
//       -> dJ, dP_l, dP_w, dB, dR_Xl, dR_Ml, dR_Xw, dR_Mw
// P_l (P_w) is an [h_k, h] matrix, or, for grouped talking heads, the G
// diagonal blocks [G, h_k/G, h/G] of a block-diagonal one: each group's
// heads mix among themselves, one product per group, and dP_l comes back
// as its blocks. (Dynamic projections take dense P_l and P_w only.)
// `mask` is boolean [b, n, m] (true: may attend) or has no elements (no
// mask). `bias` (e.g. T5's relative position bias) is [1 or b, h, n, m] or
// has no elements; dB is [b, h, n, m] (for a shared bias the caller sums it
// over the batch) or has no elements. R_Xl is [b, n, h_k, h], R_Ml [b, h_k,
// h, m] (m last), R_Xw [b, n, h, h_v], R_Mw [b, h, h_v, m], each or no
// elements (absent); their gradients have their shapes, or no elements.
// J, U (and dU, dJ) are float32, bfloat16 or float16 (attr T), for mixed
// precision: a block of J is widened to float32 in cache, everything runs
// in float32 (the softmax too, as on the TensorFlow-ops path), and U is
// rounded to T when written. The projections, the bias and every other
// gradient are float32.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/lib/core/threadpool.h"

namespace thattn {
namespace {

namespace tf = ::tensorflow;

using Matrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// One block of a [b, heads, n, m] tensor: `heads` rows of rows*m floats, each
// row a contiguous run of one head's query rows, n*m floats apart.
using BlockView = Eigen::Map<Matrix, 0, Eigen::OuterStride<>>;
using ConstBlockView = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using ConstMatrixView = Eigen::Map<const Matrix>;
// A run along m, as a row (the blocks' rows are runs along m).
using RowArray = Eigen::Array<float, 1, Eigen::Dynamic>;

// A projection P[in, out] as a dense matrix: the matrix itself, or the
// block-diagonal matrix of its G blocks [G, in/G, out/G] (zero elsewhere).
// The products below use only its diagonal blocks.
Matrix DenseProjection(const tf::Tensor& projection) {
  const int64_t groups = projection.dims() == 3 ? projection.dim_size(0) : 1;
  const int64_t rows = projection.dim_size(projection.dims() - 2);
  const int64_t cols = projection.dim_size(projection.dims() - 1);
  Matrix dense = Matrix::Zero(groups * rows, groups * cols);
  const float* data = projection.flat<float>().data();
  for (int64_t group = 0; group < groups; ++group) {
    dense.block(group * rows, group * cols, rows, cols) =
        ConstMatrixView(data + group * rows * cols, rows, cols);
  }
  return dense;
}

// The [G, in/G, out/G] blocks of a block-diagonal gradient, or the matrix.
void WriteProjection(const Matrix& dense, int64_t groups, tf::Tensor* out) {
  const int64_t rows = dense.rows() / groups;
  const int64_t cols = dense.cols() / groups;
  float* data = out->flat<float>().data();
  for (int64_t group = 0; group < groups; ++group) {
    Eigen::Map<Matrix>(data + group * rows * cols, rows, cols) =
        dense.block(group * rows, group * cols, rows, cols);
  }
}

// out = lhs * in, for lhs block-diagonal in `groups` blocks: one product
// per group (the zero blocks cost nothing). Eigen views are passed by value.
template <typename Lhs, typename In, typename Out>
void BlockDiagonalProduct(int64_t groups, const Lhs& lhs, const In& in,
                          Out out) {
  if (groups == 1) {
    out.noalias() = lhs * in;
    return;
  }
  const int64_t rows = lhs.rows() / groups;
  const int64_t cols = lhs.cols() / groups;
  for (int64_t group = 0; group < groups; ++group) {
    out.middleRows(group * rows, rows).noalias() =
        lhs.block(group * rows, group * cols, rows, cols) *
        in.middleRows(group * cols, cols);
  }
}

// gradient += first * second^T, on the diagonal blocks only.
template <typename First, typename Second>
void AddBlockDiagonalOuter(int64_t groups, const First& first,
                           const Second& second, Matrix* gradient) {
  if (groups == 1) {
    gradient->noalias() += first * second.transpose();
    return;
  }
  const int64_t rows = gradient->rows() / groups;
  const int64_t cols = gradient->cols() / groups;
  for (int64_t group = 0; group < groups; ++group) {
    gradient->block(group * rows, group * cols, rows, cols).noalias() +=
        first.middleRows(group * rows, rows) *
        second.middleRows(group * cols, cols).transpose();
  }
}

// The same constant as thattn.layers.attention_ops.MASKED_LOGIT, so a fully
// masked row is uniform exactly as in the TensorFlow-ops path.
constexpr float kMaskedLogit = -1e9f;

// Aim for blocks whose widest score matrix stays within this many floats
// (64 KiB * 4 bytes = 256 KiB, about half of a core's L2 on recent x86).
constexpr int64_t kBlockFloats = 64 * 1024;

struct Geometry {
  int64_t batch, key_heads, heads, value_heads, length, memory;
  int64_t bias_batch;  // 0 (no bias), 1 (shared by the batch) or batch
  // G of a block-diagonal P_l (P_w) given as its [G, in/G, out/G] blocks
  // (grouped talking heads), or 1 for a dense matrix.
  int64_t pre_groups, post_groups;
  // Blocks that one thread handles together: 1, or a whole example when a
  // per-memory term sums its gradient over every query row of the example.
  int64_t blocks_per_unit;
  int64_t rows_per_block, blocks_per_example;

  int64_t num_blocks() const { return batch * blocks_per_example; }
};

// G of a projection: [G, in/G, out/G] blocks, or 1 for an [in, out] matrix.
int64_t Groups(const tf::Tensor& projection) {
  return projection.dims() == 3 ? projection.dim_size(0) : 1;
}

// Reads the shapes, checks them against each other, and picks the block size.
// On a mismatch it sets the context's status (and the caller returns).
void PlanBlocks(tf::OpKernelContext* context, int64_t rows_per_block_attr,
                Geometry* geometry) {
  const tf::Tensor& dots = context->input(0);
  const tf::Tensor& pre = context->input(1);
  const tf::Tensor& post = context->input(2);
  const tf::Tensor& mask = context->input(3);
  const tf::Tensor& bias = context->input(4);
  OP_REQUIRES(context, dots.dims() == 4,
              tf::errors::InvalidArgument(
                  "dots must be [b, h_k, n, m], got shape ",
                  dots.shape().DebugString()));
  OP_REQUIRES(context,
              (pre.dims() == 2 || pre.dims() == 3) &&
                  (post.dims() == 2 || post.dims() == 3),
              tf::errors::InvalidArgument(
                  "pre and post must be matrices or [G, in/G, out/G] "
                  "blocks, got shapes ",
                  pre.shape().DebugString(), " and ",
                  post.shape().DebugString()));
  Geometry& g = *geometry;
  g.batch = dots.dim_size(0);
  g.key_heads = dots.dim_size(1);
  g.length = dots.dim_size(2);
  g.memory = dots.dim_size(3);
  g.pre_groups = Groups(pre);
  g.post_groups = Groups(post);
  g.heads = g.pre_groups * pre.dim_size(pre.dims() - 1);
  g.value_heads = g.post_groups * post.dim_size(post.dims() - 1);
  OP_REQUIRES(context,
              g.pre_groups * pre.dim_size(pre.dims() - 2) == g.key_heads,
              tf::errors::InvalidArgument(
                  "pre must be [h_k, h] or [G, h_k/G, h/G] with h_k = ",
                  g.key_heads, " (dots' dimension 1), got shape ",
                  pre.shape().DebugString()));
  OP_REQUIRES(context,
              g.post_groups * post.dim_size(post.dims() - 2) == g.heads,
              tf::errors::InvalidArgument(
                  "post must be [h, h_v] or [G, h/G, h_v/G] with h = ",
                  g.heads, " (pre's output heads), got shape ",
                  post.shape().DebugString()));
  const bool mask_ok =
      mask.NumElements() == 0 ||
      (mask.dims() == 3 && mask.dim_size(0) == g.batch &&
       mask.dim_size(1) == g.length && mask.dim_size(2) == g.memory);
  OP_REQUIRES(context, mask_ok,
              tf::errors::InvalidArgument(
                  "mask must be [b, n, m] = [", g.batch, ", ", g.length, ", ",
                  g.memory, "] or empty, got shape ",
                  mask.shape().DebugString()));
  const bool bias_ok =
      bias.NumElements() == 0 ||
      (bias.dims() == 4 &&
       (bias.dim_size(0) == 1 || bias.dim_size(0) == g.batch) &&
       bias.dim_size(1) == g.heads && bias.dim_size(2) == g.length &&
       bias.dim_size(3) == g.memory);
  OP_REQUIRES(context, bias_ok,
              tf::errors::InvalidArgument(
                  "bias must be [1 or b, h, n, m] with b = ", g.batch,
                  ", h = ", g.heads, ", n = ", g.length, ", m = ", g.memory,
                  ", or empty, got shape ", bias.shape().DebugString()));
  g.bias_batch = bias.NumElements() == 0 ? 0 : bias.dim_size(0);
  // The dynamic projections: each absent, or of exactly its shape.
  const struct {
    int index;
    const char* name;
    tf::TensorShape shape;
  } dynamic[] = {
      {5, "x2l [b, n, h_k, h]", {g.batch, g.length, g.key_heads, g.heads}},
      {6, "m2l [b, h_k, h, m]", {g.batch, g.key_heads, g.heads, g.memory}},
      {7, "x2w [b, n, h, h_v]", {g.batch, g.length, g.heads, g.value_heads}},
      {8, "m2w [b, h, h_v, m]", {g.batch, g.heads, g.value_heads, g.memory}},
  };
  for (const auto& projection : dynamic) {
    const tf::Tensor& tensor = context->input(projection.index);
    OP_REQUIRES(context,
                tensor.NumElements() == 0 ||
                    (g.pre_groups == 1 && g.post_groups == 1),
                tf::errors::InvalidArgument(
                    "dynamic projections need dense pre and post ([h_k, h], "
                    "[h, h_v]), got head groups"));
    OP_REQUIRES(context,
                tensor.NumElements() == 0 || tensor.shape() == projection.shape,
                tf::errors::InvalidArgument(
                    projection.name, " must be ", projection.shape.DebugString(),
                    " or empty, got shape ", tensor.shape().DebugString()));
  }
  const int64_t widest = std::max({g.key_heads, g.heads, g.value_heads});
  g.rows_per_block =
      rows_per_block_attr > 0
          ? rows_per_block_attr
          : std::max<int64_t>(1, kBlockFloats / std::max<int64_t>(
                                     1, widest * g.memory));
  g.rows_per_block = std::min(g.rows_per_block, std::max<int64_t>(1, g.length));
  g.blocks_per_example =
      (g.length + g.rows_per_block - 1) / g.rows_per_block;
  const bool per_memory = context->input(6).NumElements() > 0 ||
                          context->input(8).NumElements() > 0;
  g.blocks_per_unit = per_memory ? g.blocks_per_example : 1;
}

// Where one block of query rows sits.
struct Block {
  int64_t example, first_row, rows;

  Block(const Geometry& g, int64_t index)
      : example(index / g.blocks_per_example),
        first_row((index % g.blocks_per_example) * g.rows_per_block),
        rows(std::min(g.rows_per_block, g.length - first_row)) {}

  // Offset of [example, head 0, first_row, 0] in a [b, heads, n, m] tensor.
  int64_t Offset(const Geometry& g, int64_t heads) const {
    return ((example * heads) * g.length + first_row) * g.memory;
  }

  // The same query rows in another example.
  Block AtExample(int64_t other) const {
    Block moved = *this;
    moved.example = other;
    return moved;
  }
};

// The float32 and boolean tensors every block reads, as raw pointers (null
// when absent). J is read as a block of T (`FloatBlock`).
struct Inputs {
  const bool* mask;
  const float* bias;
  const float* x2l;  // R_Xl[b, n, h_k, h]
  const float* m2l;  // R_Ml[b, h_k, h, m]
  const float* x2w;  // R_Xw[b, n, h, h_v]
  const float* m2w;  // R_Mw[b, h, h_v, m]
};

// R_X[example, n] as an [rows, cols] matrix, of a [b, n, rows, cols] tensor.
ConstMatrixView QueryMatrix(const float* projection, const Geometry& g,
                            const Block& block, int64_t row, int64_t rows,
                            int64_t cols) {
  return ConstMatrixView(
      projection +
          ((block.example * g.length + block.first_row + row) * rows * cols),
      rows, cols);
}

// For each (i, j) and query row of the block, along m:
//   target[j, row, :] += source[i, row, :] * R_M[example, i, j, :]
// (or target[i] += source[j] * R_M[i, j] with `transposed`), where R_M is
// [b, I, J, m]. `target` and `source` are blocks of [rows * m] columns.
template <typename Target, typename Source>
void AddMemoryMix(const Geometry& g, const Block& block, const float* projection,
                  int64_t inner, int64_t outer, bool transposed,
                  const Source& source, Target* target) {
  const float* matrices = projection + block.example * inner * outer * g.memory;
  for (int64_t i = 0; i < inner; ++i) {
    for (int64_t j = 0; j < outer; ++j) {
      Eigen::Map<const RowArray> along_m(
          matrices + (i * outer + j) * g.memory, g.memory);
      const int64_t from = transposed ? j : i;
      const int64_t to = transposed ? i : j;
      for (int64_t row = 0; row < block.rows; ++row) {
        const int64_t start = row * g.memory;
        target->row(to).segment(start, g.memory).array() +=
            source.row(from).segment(start, g.memory).array() * along_m;
      }
    }
  }
}

// The gradient of R_M[example] in `AddMemoryMix`, summed over the block's
// rows: d[i, j, :] += first[i, row, :] * second[j, row, :].
template <typename First, typename Second>
void AddMemoryGradient(const Geometry& g, const Block& block,
                       const First& first, const Second& second,
                       int64_t inner, int64_t outer, float* gradient) {
  float* matrices = gradient + block.example * inner * outer * g.memory;
  for (int64_t i = 0; i < inner; ++i) {
    for (int64_t j = 0; j < outer; ++j) {
      Eigen::Map<RowArray> along_m(
          matrices + (i * outer + j) * g.memory, g.memory);
      for (int64_t row = 0; row < block.rows; ++row) {
        const int64_t start = row * g.memory;
        along_m += first.row(i).segment(start, g.memory).array() *
                   second.row(j).segment(start, g.memory).array();
      }
    }
  }
}

// out = (static^T + R_X[n]^T) in per query row, or static^T in for the
// whole block without R_X: the mix of P_l (P_w) and its per-query term.
// `static_transposed` is [out heads, in heads]; `in` and `out` are blocks.
template <typename In, typename Out>
void MixPerQuery(const Geometry& g, const Block& block,
                 const Matrix& static_transposed, int64_t groups,
                 const float* query_term, const In& in, Out* out) {
  const int64_t columns = block.rows * g.memory;
  if (query_term == nullptr) {
    BlockDiagonalProduct(groups, static_transposed, in,
                         out->leftCols(columns));
    return;
  }
  const int64_t in_heads = static_transposed.cols();
  const int64_t out_heads = static_transposed.rows();
  Matrix mix(out_heads, in_heads);
  for (int64_t row = 0; row < block.rows; ++row) {
    mix = static_transposed +
          QueryMatrix(query_term, g, block, row, in_heads, out_heads)
              .transpose();
    out->middleCols(row * g.memory, g.memory).noalias() =
        mix * in.middleCols(row * g.memory, g.memory);
  }
}

// The gradient of `MixPerQuery` given d_out: d_in = (static + R_X[n]) d_out
// per row; static_gradient += in d_out^T, and, with R_X, dR_X[n] = in_n
// d_out_n^T, row by row. `static_matrix` is [in heads, out heads].
template <typename In, typename DOut, typename DIn>
void MixPerQueryGradient(const Geometry& g, const Block& block,
                         const Matrix& static_matrix, int64_t groups,
                         const float* query_term, const In& in,
                         const DOut& d_out, DIn* d_in, Matrix* static_gradient,
                         float* query_gradient) {
  if (query_term == nullptr) {
    BlockDiagonalProduct(groups, static_matrix, d_out, *d_in);
    AddBlockDiagonalOuter(groups, in, d_out, static_gradient);
    return;
  }
  const int64_t in_heads = static_matrix.rows();
  const int64_t out_heads = static_matrix.cols();
  Matrix mix(in_heads, out_heads);
  for (int64_t row = 0; row < block.rows; ++row) {
    const int64_t start = row * g.memory;
    mix = static_matrix +
          QueryMatrix(query_term, g, block, row, in_heads, out_heads);
    d_in->middleCols(start, g.memory).noalias() =
        mix * d_out.middleCols(start, g.memory);
    Eigen::Map<Matrix> d_row(
        query_gradient + ((block.example * g.length + block.first_row + row) *
                          in_heads * out_heads),
        in_heads, out_heads);
    d_row.noalias() = in.middleCols(start, g.memory) *
                      d_out.middleCols(start, g.memory).transpose();
    *static_gradient += d_row;
  }
}

// One block of a [b, heads, n, m] tensor (its rows n * m floats apart).
template <typename View, typename Pointer>
View TensorBlock(const Geometry& g, const Block& block, Pointer data,
                 int64_t heads) {
  return View(data + block.Offset(g, heads), heads, block.rows * g.memory,
              Eigen::OuterStride<>(g.length * g.memory));
}

// Room for one block of `heads` rows in float32 when T is narrower (none
// for float: its blocks are used in place).
template <typename T>
Matrix ConversionScratch(const Geometry& g, int64_t heads) {
  return std::is_same<T, float>::value
             ? Matrix()
             : Matrix(heads, g.rows_per_block * g.memory);
}

// A block of a [b, heads, n, m] tensor of T, as float32: the tensor itself
// for float, or the block widened into `scratch`.
template <typename T>
ConstBlockView FloatBlock(const Geometry& g, const Block& block,
                          const T* data, int64_t heads, Matrix* scratch) {
  if constexpr (std::is_same<T, float>::value) {
    return TensorBlock<ConstBlockView>(g, block, data, heads);
  } else {
    const int64_t columns = block.rows * g.memory;
    const T* first = data + block.Offset(g, heads);
    for (int64_t head = 0; head < heads; ++head) {
      scratch->row(head).head(columns).array() =
          Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>(
              first + head * g.length * g.memory, columns)
              .template cast<float>();
    }
    return ConstBlockView(scratch->data(), heads, columns,
                          Eigen::OuterStride<>(scratch->cols()));
  }
}

// Where a block of a [b, heads, n, m] tensor of T is computed in float32:
// in place for float, else in `scratch`, which `StoreBlock` then rounds
// into the tensor.
template <typename T>
BlockView FloatTarget(const Geometry& g, const Block& block, T* data,
                      int64_t heads, Matrix* scratch) {
  if constexpr (std::is_same<T, float>::value) {
    return TensorBlock<BlockView>(g, block, data, heads);
  } else {
    return BlockView(scratch->data(), heads, block.rows * g.memory,
                     Eigen::OuterStride<>(scratch->cols()));
  }
}

template <typename T>
void StoreBlock(const Geometry& g, const Block& block,
                const BlockView& computed, T* data) {
  if constexpr (!std::is_same<T, float>::value) {
    const int64_t columns = block.rows * g.memory;
    T* first = data + block.Offset(g, computed.rows());
    for (int64_t head = 0; head < computed.rows(); ++head) {
      Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>(
          first + head * g.length * g.memory, columns) =
          computed.row(head).array().template cast<T>();
    }
  }
}

// W for one block: L = P_l^T J + B, masked, softmax over each row of m.
// `dots_block` is J's block as float32; `weights` is [h, rows_per_block *
// m], and its first rows*m columns are written.
void ComputeWeights(const Geometry& g, const Block& block, const Inputs& in,
                    const Matrix& pre_transposed,
                    const ConstBlockView& dots_block, Matrix* weights) {
  const int64_t columns = block.rows * g.memory;
  MixPerQuery(g, block, pre_transposed, g.pre_groups, in.x2l, dots_block,
              weights);
  if (in.m2l != nullptr) {
    AddMemoryMix(g, block, in.m2l, g.key_heads, g.heads, /*transposed=*/false,
                 dots_block, weights);
  }
  if (in.bias != nullptr) {
    // A bias shared by the batch (T5's) is read at example 0.
    const Block bias_rows = g.bias_batch == 1 ? block.AtExample(0) : block;
    weights->leftCols(columns) +=
        TensorBlock<ConstBlockView>(g, bias_rows, in.bias, g.heads);
  }
  const bool* mask = in.mask;
  const bool* mask_block =
      mask == nullptr
          ? nullptr
          : mask + (block.example * g.length + block.first_row) * g.memory;
  for (int64_t head = 0; head < g.heads; ++head) {
    float* row_start = weights->row(head).data();
    for (int64_t row = 0; row < block.rows; ++row) {
      float* logits = row_start + row * g.memory;
      if (mask_block != nullptr) {
        const bool* allowed = mask_block + row * g.memory;
        for (int64_t j = 0; j < g.memory; ++j) {
          if (!allowed[j]) logits[j] = kMaskedLogit;
        }
      }
      Eigen::Map<Eigen::ArrayXf> values(logits, g.memory);
      values = (values - values.maxCoeff()).exp();
      values *= 1.0f / values.sum();
    }
  }
}

// Runs `work(slice, first_block, end_block)` over all blocks, split into at
// most `max_slices` contiguous slices on TensorFlow's CPU thread pool. Slices
// are numbered so that callers can keep one accumulator per slice.
// Slices hold whole units of `g.blocks_per_unit` blocks.
int64_t NumSlices(const Geometry& g, int64_t max_slices) {
  return std::max<int64_t>(
      1, std::min(g.num_blocks() / g.blocks_per_unit, max_slices));
}

void ForEachSlice(tf::OpKernelContext* context, const Geometry& g,
                  int64_t max_slices,
                  const std::function<void(int64_t, int64_t, int64_t)>& work) {
  const int64_t units = g.num_blocks() / g.blocks_per_unit;
  const int64_t slices = NumSlices(g, max_slices);
  const int64_t unit = g.blocks_per_unit;
  auto run = [&](int64_t first_slice, int64_t end_slice) {
    for (int64_t slice = first_slice; slice < end_slice; ++slice) {
      work(slice, unit * (units * slice / slices),
           unit * (units * (slice + 1) / slices));
    }
  };
  auto* threads = context->device()->tensorflow_cpu_worker_threads();
  // A large cost per slice: each slice is worth its own task.
  threads->workers->ParallelFor(slices, /*cost_per_unit=*/1 << 30, run);
}

int64_t SliceCount(tf::OpKernelContext* context) {
  // A few slices per thread balance uneven progress without many partial
  // accumulators to add up afterwards.
  return 4 * context->device()->tensorflow_cpu_worker_threads()->num_threads;
}

template <typename T>
const T* DataOrNull(const tf::Tensor& tensor) {
  return tensor.NumElements() == 0 ? nullptr : tensor.flat<T>().data();
}

Inputs ReadInputs(tf::OpKernelContext* context) {
  return {DataOrNull<bool>(context->input(3)),
          DataOrNull<float>(context->input(4)),
          DataOrNull<float>(context->input(5)),
          DataOrNull<float>(context->input(6)),
          DataOrNull<float>(context->input(7)),
          DataOrNull<float>(context->input(8))};
}

// What both ops share: the same first five inputs and the block-size attr.
class BlockedKernel : public tf::OpKernel {
 public:
  explicit BlockedKernel(tf::OpKernelConstruction* context)
      : OpKernel(context) {
    OP_REQUIRES_OK(context,
                   context->GetAttr("rows_per_block", &rows_per_block_));
  }

 protected:
  // False, with the context's status set, when the inputs do not fit.
  bool Plan(tf::OpKernelContext* context, Geometry* geometry) const {
    PlanBlocks(context, rows_per_block_, geometry);
    return context->status().ok();
  }

 private:
  int64_t rows_per_block_;
};

template <typename T>
class TalkingHeadsSoftmaxOp : public BlockedKernel {
 public:
  using BlockedKernel::BlockedKernel;

  void Compute(tf::OpKernelContext* context) override {
    Geometry g;
    if (!Plan(context, &g)) return;
    tf::Tensor* mixed = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0,
                                tf::TensorShape({g.batch, g.value_heads,
                                                 g.length, g.memory}),
                                &mixed));
    if (mixed->NumElements() == 0) return;
    const Inputs in = ReadInputs(context);
    const Matrix pre_transposed = DenseProjection(context->input(1)).transpose();
    const Matrix post_transposed =
        DenseProjection(context->input(2)).transpose();
    const T* dots = context->input(0).flat<T>().data();
    T* output = mixed->flat<T>().data();
    ForEachSlice(context, g, SliceCount(context),
                 [&](int64_t, int64_t first_block, int64_t end_block) {
      Matrix weights(g.heads, g.rows_per_block * g.memory);
      Matrix dots_scratch = ConversionScratch<T>(g, g.key_heads);
      Matrix mixed_scratch = ConversionScratch<T>(g, g.value_heads);
      for (int64_t index = first_block; index < end_block; ++index) {
        const Block block(g, index);
        const int64_t columns = block.rows * g.memory;
        ComputeWeights(
            g, block, in, pre_transposed,
            FloatBlock(g, block, dots, g.key_heads, &dots_scratch), &weights);
        BlockView mixed_block =
            FloatTarget(g, block, output, g.value_heads, &mixed_scratch);
        const auto w = weights.leftCols(columns);
        MixPerQuery(g, block, post_transposed, g.post_groups, in.x2w, w,
                    &mixed_block);
        if (in.m2w != nullptr) {
          AddMemoryMix(g, block, in.m2w, g.heads, g.value_heads,
                       /*transposed=*/false, w, &mixed_block);
        }
        StoreBlock(g, block, mixed_block, output);
      }
    });
  }
};

template <typename T>
class TalkingHeadsSoftmaxGradOp : public BlockedKernel {
 public:
  using BlockedKernel::BlockedKernel;

  void Compute(tf::OpKernelContext* context) override {
    Geometry g;
    if (!Plan(context, &g)) return;
    const tf::Tensor& grad_mixed = context->input(9);
    OP_REQUIRES(
        context,
        grad_mixed.shape() == tf::TensorShape({g.batch, g.value_heads,
                                               g.length, g.memory}),
        tf::errors::InvalidArgument("grad_mixed must be [b, h_v, n, m], got ",
                                    grad_mixed.shape().DebugString()));
    tf::Tensor* grad_dots = nullptr;
    tf::Tensor* grad_pre = nullptr;
    tf::Tensor* grad_post = nullptr;
    tf::Tensor* grad_bias = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(
                                0, context->input(0).shape(), &grad_dots));
    OP_REQUIRES_OK(context, context->allocate_output(
                                1, context->input(1).shape(), &grad_pre));
    OP_REQUIRES_OK(context, context->allocate_output(
                                2, context->input(2).shape(), &grad_post));
    // dB per example, even for a shared bias: blocks of different examples
    // run on different threads, so summing here would race.
    OP_REQUIRES_OK(
        context,
        context->allocate_output(
            3,
            g.bias_batch == 0
                ? tf::TensorShape({0})
                : tf::TensorShape({g.batch, g.heads, g.length, g.memory}),
            &grad_bias));
    // dR_X and dR_M: the inputs' shapes (no elements when absent). dR_M
    // sums over the query rows of an example; each example is one slice's
    // (blocks_per_unit), so it is accumulated in place from zero.
    float* d_dynamic[4];
    for (int i = 0; i < 4; ++i) {
      tf::Tensor* output = nullptr;
      OP_REQUIRES_OK(context, context->allocate_output(
                                  4 + i, context->input(5 + i).shape(),
                                  &output));
      output->flat<float>().setZero();
      d_dynamic[i] = output->NumElements() == 0
                         ? nullptr
                         : output->flat<float>().data();
    }
    const Inputs in = ReadInputs(context);
    const Matrix pre = DenseProjection(context->input(1));
    const Matrix post = DenseProjection(context->input(2));
    const Matrix pre_transposed = pre.transpose();
    const T* dots = context->input(0).flat<T>().data();
    const T* d_mixed = grad_mixed.flat<T>().data();
    T* d_dots = grad_dots->flat<T>().data();
    float* d_bias = g.bias_batch == 0 ? nullptr
                                      : grad_bias->flat<float>().data();

    // dP_l and dP_w sum over every position: one partial sum per slice,
    // added up below, so no two threads write the same accumulator.
    const int64_t slices = NumSlices(g, SliceCount(context));
    std::vector<Matrix> pre_partials(slices,
                                     Matrix::Zero(g.key_heads, g.heads));
    std::vector<Matrix> post_partials(slices,
                                      Matrix::Zero(g.heads, g.value_heads));
    ForEachSlice(context, g, slices,
                 [&](int64_t slice, int64_t first_block, int64_t end_block) {
      Matrix weights(g.heads, g.rows_per_block * g.memory);
      Matrix d_weights(g.heads, g.rows_per_block * g.memory);
      Matrix dots_scratch = ConversionScratch<T>(g, g.key_heads);
      Matrix d_dots_scratch = ConversionScratch<T>(g, g.key_heads);
      Matrix d_mixed_scratch = ConversionScratch<T>(g, g.value_heads);
      for (int64_t index = first_block; index < end_block; ++index) {
        const Block block(g, index);
        const int64_t columns = block.rows * g.memory;
        const ConstBlockView dots_block =
            FloatBlock(g, block, dots, g.key_heads, &dots_scratch);
        ComputeWeights(g, block, in, pre_transposed, dots_block, &weights);
        const ConstBlockView d_mixed_block =
            FloatBlock(g, block, d_mixed, g.value_heads, &d_mixed_scratch);
        auto w = weights.leftCols(columns);
        auto d_w = d_weights.leftCols(columns);
        // U = P_w^T W:  dW = P_w dU,  dP_w += W dU^T; per query row with
        // R_Xw; and R_Mw's term along m.
        MixPerQueryGradient(g, block, post, g.post_groups, in.x2w, w,
                            d_mixed_block, &d_w, &post_partials[slice],
                            d_dynamic[2]);
        if (in.m2w != nullptr) {
          AddMemoryMix(g, block, in.m2w, g.heads, g.value_heads,
                       /*transposed=*/true, d_mixed_block, &d_w);
          AddMemoryGradient(g, block, w, d_mixed_block, g.heads,
                            g.value_heads, d_dynamic[3]);
        }
        // Softmax: dL = W * (dW - sum_m W dW); masked logits were replaced
        // by a constant, so they get no gradient.
        for (int64_t head = 0; head < g.heads; ++head) {
          for (int64_t row = 0; row < block.rows; ++row) {
            const int64_t start = row * g.memory;
            auto probabilities = w.row(head).segment(start, g.memory).array();
            auto gradient = d_w.row(head).segment(start, g.memory).array();
            const float weighted_sum = (probabilities * gradient).sum();
            gradient = probabilities * (gradient - weighted_sum);
            if (in.mask != nullptr) {
              const bool* allowed =
                  in.mask + (block.example * g.length + block.first_row +
                             row) * g.memory;
              for (int64_t j = 0; j < g.memory; ++j) {
                if (!allowed[j]) gradient[j] = 0.0f;
              }
            }
          }
        }
        // L = P_l^T J + B:  dB = dL,  dJ = P_l dL,  dP_l += J dL^T.
        if (d_bias != nullptr) {
          TensorBlock<BlockView>(g, block, d_bias, g.heads) = d_w;
        }
        BlockView d_dots_block =
            FloatTarget(g, block, d_dots, g.key_heads, &d_dots_scratch);
        MixPerQueryGradient(g, block, pre, g.pre_groups, in.x2l, dots_block,
                            d_w, &d_dots_block, &pre_partials[slice],
                            d_dynamic[0]);
        if (in.m2l != nullptr) {
          AddMemoryMix(g, block, in.m2l, g.key_heads, g.heads,
                       /*transposed=*/true, d_w, &d_dots_block);
          AddMemoryGradient(g, block, dots_block, d_w, g.key_heads, g.heads,
                            d_dynamic[1]);
        }
        StoreBlock(g, block, d_dots_block, d_dots);
      }
    });
    Matrix d_pre = Matrix::Zero(g.key_heads, g.heads);
    Matrix d_post = Matrix::Zero(g.heads, g.value_heads);
    for (int64_t slice = 0; slice < slices; ++slice) {
      d_pre += pre_partials[slice];
      d_post += post_partials[slice];
    }
    // Grouped: only the diagonal blocks were accumulated, and are returned.
    WriteProjection(d_pre, g.pre_groups, grad_pre);
    WriteProjection(d_post, g.post_groups, grad_post);
  }
};

tf::Status GradientShapes(tf::shape_inference::InferenceContext* context) {
  for (int i = 0; i < 3; ++i) context->set_output(i, context->input(i));
  // dB: [b, h, n, m] with a bias, [0] without; not known statically.
  context->set_output(3, context->UnknownShape());
  for (int i = 0; i < 4; ++i) context->set_output(4 + i, context->input(5 + i));
  return tf::OkStatus();
}

}  // namespace

REGISTER_OP("ThattnTalkingHeadsSoftmax")
    .Input("dots: T")      // J[b, h_k, n, m]
    .Input("pre: float")   // P_l[h_k, h], or its blocks [G, h_k/G, h/G]
    .Input("post: float")  // P_w[h, h_v], or its blocks [G, h/G, h_v/G]
    .Input("mask: bool")   // [b, n, m], or no elements for no mask
    .Input("bias: float")  // B[1 or b, h, n, m], or no elements for none
    .Input("x2l: float")   // R_Xl[b, n, h_k, h], or no elements
    .Input("m2l: float")   // R_Ml[b, h_k, h, m], or no elements
    .Input("x2w: float")   // R_Xw[b, n, h, h_v], or no elements
    .Input("m2w: float")   // R_Mw[b, h, h_v, m], or no elements
    .Output("mixed: T")  // U[b, h_v, n, m]
    .Attr("T: {float, bfloat16, half} = DT_FLOAT")
    .Attr("rows_per_block: int = 0")  // 0: chosen from the sizes
    .SetShapeFn([](tf::shape_inference::InferenceContext* context) {
      tf::shape_inference::ShapeHandle dots;
      TF_RETURN_IF_ERROR(context->WithRank(context->input(0), 4, &dots));
      // h_v: post's output heads, times G for [G, h/G, h_v/G] blocks.
      tf::shape_inference::DimensionHandle value_heads = context->UnknownDim();
      const tf::shape_inference::ShapeHandle post = context->input(2);
      if (context->RankKnown(post)) {
        const int32_t rank = context->Rank(post);
        value_heads = context->Dim(post, rank - 1);
        if (rank == 3) {
          TF_RETURN_IF_ERROR(context->Multiply(
              context->Dim(post, 0), value_heads, &value_heads));
        }
      }
      context->set_output(
          0, context->MakeShape({context->Dim(dots, 0), value_heads,
                                 context->Dim(dots, 2),
                                 context->Dim(dots, 3)}));
      return tf::OkStatus();
    });

REGISTER_OP("ThattnTalkingHeadsSoftmaxGrad")
    .Input("dots: T")
    .Input("pre: float")
    .Input("post: float")
    .Input("mask: bool")
    .Input("bias: float")
    .Input("x2l: float")
    .Input("m2l: float")
    .Input("x2w: float")
    .Input("m2w: float")
    .Input("grad_mixed: T")  // dU[b, h_v, n, m]
    .Output("grad_dots: T")  // dJ[b, h_k, n, m]
    .Output("grad_pre: float")   // dP_l, as pre
    .Output("grad_post: float")  // dP_w, as post
    .Output("grad_bias: float")  // dB[b, h, n, m], or no elements
    .Output("grad_x2l: float")   // dR_Xl, as x2l
    .Output("grad_m2l: float")   // dR_Ml, as m2l
    .Output("grad_x2w: float")   // dR_Xw, as x2w
    .Output("grad_m2w: float")   // dR_Mw, as m2w
    .Attr("T: {float, bfloat16, half} = DT_FLOAT")
    .Attr("rows_per_block: int = 0")
    .SetShapeFn(GradientShapes);

#define THATTN_REGISTER_KERNELS(T)                                    \
  REGISTER_KERNEL_BUILDER(Name("ThattnTalkingHeadsSoftmax")            \
                              .Device(tf::DEVICE_CPU)                  \
                              .TypeConstraint<T>("T"),                 \
                          TalkingHeadsSoftmaxOp<T>);                   \
  REGISTER_KERNEL_BUILDER(Name("ThattnTalkingHeadsSoftmaxGrad")        \
                              .Device(tf::DEVICE_CPU)                  \
                              .TypeConstraint<T>("T"),                 \
                          TalkingHeadsSoftmaxGradOp<T>);
THATTN_REGISTER_KERNELS(float);
THATTN_REGISTER_KERNELS(tf::bfloat16);
THATTN_REGISTER_KERNELS(Eigen::half);
#undef THATTN_REGISTER_KERNELS

}  // namespace thattn
