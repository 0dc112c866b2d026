// Prototype, not part of thattn: a fused talking-heads softmax, forward only.
//
// Computes, for each (example, block of 8 query rows) while the block is in
// cache (letters as in thattn/dims.py):
//   L[h, n, m]   = einsum(J[h_k, n, m], P_l[h_k, h])
//   W[h, n, m]   = softmax(L, over m)
//   U[h_v, n, m] = einsum(W[h, n, m], P_w[h, h_v])
// so L is never written to memory and W is mixed before it leaves cache.
// No mask, bias, gradient or dtype other than float32: it exists to measure
// how much fusing could save (benchmarks/RESULTS.md, issue 3), see
// fused_talking_heads_softmax.py for the build and the measurement.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"
#include "unsupported/Eigen/CXX11/Tensor"
#include <Eigen/Dense>

using namespace tensorflow;  // NOLINT: a prototype
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

REGISTER_OP("TalkingHeadsSoftmax")
    .Input("dots: float")      // [b, hk, n, m]
    .Input("pre: float")       // [hk, h]
    .Input("post: float")      // [h, hv]
    .Output("weights: float")  // [b, h, n, m]
    .Output("mixed: float")    // [b, hv, n, m]
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      auto d = c->input(0);
      c->set_output(0, c->MakeShape({c->Dim(d, 0), c->Dim(c->input(1), 1), c->Dim(d, 2), c->Dim(d, 3)}));
      c->set_output(1, c->MakeShape({c->Dim(d, 0), c->Dim(c->input(2), 1), c->Dim(d, 2), c->Dim(d, 3)}));
      return OkStatus();
    });

class TalkingHeadsSoftmaxOp : public OpKernel {
 public:
  explicit TalkingHeadsSoftmaxOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& dots = ctx->input(0);
    const Tensor& pre = ctx->input(1);
    const Tensor& post = ctx->input(2);
    const int64_t b = dots.dim_size(0), hk = dots.dim_size(1), n = dots.dim_size(2), m = dots.dim_size(3);
    const int64_t h = pre.dim_size(1), hv = post.dim_size(1);
    Tensor* weights; Tensor* mixed;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b, h, n, m}), &weights));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b, hv, n, m}), &mixed));
    const float* J = dots.flat<float>().data();
    float* W = weights->flat<float>().data();
    float* U = mixed->flat<float>().data();
    Eigen::Map<const RowMat> Pl(pre.flat<float>().data(), hk, h);
    Eigen::Map<const RowMat> Pw(post.flat<float>().data(), h, hv);
    const RowMat PlT = Pl.transpose(), PwT = Pw.transpose();
    const int64_t R = 8;  // query rows per block
    const int64_t blocks_per_example = (n + R - 1) / R;
    auto work = [&](int64_t start, int64_t end) {
      RowMat jbuf(hk, R * m), l(h, R * m), u(hv, R * m);
      for (int64_t blk = start; blk < end; ++blk) {
        const int64_t e = blk / blocks_per_example, r0 = (blk % blocks_per_example) * R;
        const int64_t rows = std::min(R, n - r0), cols = rows * m;
        for (int64_t i = 0; i < hk; ++i)
          std::memcpy(jbuf.data() + i * R * m, J + ((e * hk + i) * n + r0) * m, cols * sizeof(float));
        l.leftCols(cols).noalias() = PlT * jbuf.leftCols(cols);
        for (int64_t g = 0; g < h; ++g) {
          for (int64_t r = 0; r < rows; ++r) {
            auto row = l.row(g).segment(r * m, m).array();
            const float mx = row.maxCoeff();
            row = (row - mx).exp();
            row /= row.sum();
          }
          std::memcpy(W + ((e * h + g) * n + r0) * m, l.row(g).data(), cols * sizeof(float));
        }
        u.leftCols(cols).noalias() = PwT * l.leftCols(cols);
        for (int64_t j = 0; j < hv; ++j)
          std::memcpy(U + ((e * hv + j) * n + r0) * m, u.row(j).data(), cols * sizeof(float));
      }
    };
    auto pool = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(pool->num_threads, pool->workers, b * blocks_per_example, R * m * (hk * h + h * hv + 20 * h), work);
  }
};
REGISTER_KERNEL_BUILDER(Name("TalkingHeadsSoftmax").Device(DEVICE_CPU), TalkingHeadsSoftmaxOp);
