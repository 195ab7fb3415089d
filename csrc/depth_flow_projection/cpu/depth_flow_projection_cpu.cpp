// Depth-aware flow projection on the CPU. The scatter runs image by image (parallel over the batch),
// visiting source pixels in raster order, so it is deterministic. Finalize (normalize + hole
// filling) and the backward are gathers, parallel over pixels.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "common/flow_projection.h"
#include "depth_flow_projection/depth_flow_projection.h"

namespace redet {
namespace {

template <typename acc_t>
struct AccumulatorReader {
  const acc_t* acc;  // 4 values per pixel: sum_x, sum_y, count, unused
  void load(int64_t i, acc_t* sum_x, acc_t* sum_y, acc_t* count) const {
    *sum_x = acc[4 * i];
    *sum_y = acc[4 * i + 1];
    *count = acc[4 * i + 2];
  }
};

std::tuple<at::Tensor, at::Tensor> depth_flow_projection_cpu(const at::Tensor& flow_,
                                                             const at::Tensor& depth_, double t,
                                                             bool inverse_depth, bool fill_holes,
                                                             bool check_depth) {
  constexpr const char* op = "depth_flow_projection";
  check_depth_flow_projection_args(flow_, depth_, t, op);
  if (check_depth) check_depth_values(depth_, inverse_depth, op);
  const auto io = prepare_flow_projection_forward(flow_, depth_);
  const at::Tensor &flow = io.flow, &depth = io.depth, &output = io.output, &count = io.count;
  const int64_t batch = io.batch;
  const int height = io.height, width = io.width;
  const int64_t plane = static_cast<int64_t>(height) * width;
  if (flow.numel() == 0) return {output, count};
  const auto acc_type = flow_projection_acc_type(flow.scalar_type());
  auto acc = at::zeros({batch, height, width, 4}, flow.options().dtype(acc_type));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, flow.scalar_type(), "depth_flow_projection_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* f = flow.data_ptr<scalar_t>();
    const scalar_t* d = depth.data_ptr<scalar_t>();
    acc_t* a = acc.data_ptr<acc_t>();
    const acc_t tt = static_cast<acc_t>(t);
    // Rows/columns that received weight anywhere: the hole filling skips walks through the others.
    std::vector<char> row_occupied(batch * height, 0), column_occupied(batch * width, 0);
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const scalar_t* fx = f + b * 2 * plane;
        const scalar_t* dd = d + b * plane;
        acc_t* ab = a + b * plane * 4;
        for (int y = 0; y < height; ++y) {
          for (int x = 0; x < width; ++x) {
            const int64_t i = static_cast<int64_t>(y) * width + x;
            const acc_t gx = tt * static_cast<acc_t>(fx[i]);
            const acc_t gy = tt * static_cast<acc_t>(fx[plane + i]);
            ProjectionCorners c;
            if (!project_pixel(x, y, gx, gy, width, height, &c)) continue;
            const acc_t w = projection_weight(static_cast<acc_t>(dd[i]), inverse_depth);
            const int xs[4] = {c.left, c.right, c.left, c.right};
            const int ys[4] = {c.top, c.top, c.bottom, c.bottom};
            for (int k = 0; k < 4; ++k) {
              acc_t* target = ab + 4 * (static_cast<int64_t>(ys[k]) * width + xs[k]);
              target[0] -= w * gx;
              target[1] -= w * gy;
              target[2] += w;
            }
            if (w > acc_t(0)) {
              row_occupied[b * height + c.top] = row_occupied[b * height + c.bottom] = 1;
              column_occupied[b * width + c.left] = column_occupied[b * width + c.right] = 1;
            }
          }
        }
      }
    });

    scalar_t* out = output.data_ptr<scalar_t>();
    acc_t* cnt = count.data_ptr<acc_t>();
    const AccumulatorReader<acc_t> reader{a};
    at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t b = row / height;
        const int y = row % height;
        for (int x = 0; x < width; ++x) {
          acc_t ox, oy, c;
          finalize_pixel(reader, b * plane, x, y, width, height, fill_holes,
                         row_occupied[b * height + y] != 0, column_occupied[b * width + x] != 0,
                         &ox, &oy, &c);
          const int64_t i = static_cast<int64_t>(y) * width + x;
          out[b * 2 * plane + i] = static_cast<scalar_t>(ox);
          out[b * 2 * plane + plane + i] = static_cast<scalar_t>(oy);
          cnt[b * plane + i] = c;
        }
      }
    });
  });
  return {output, count};
}

std::tuple<at::Tensor, at::Tensor> depth_flow_projection_backward_cpu(
    const at::Tensor& grad_, const at::Tensor& flow_, const at::Tensor& depth_,
    const at::Tensor& output_, const at::Tensor& count_, double t, bool inverse_depth,
    bool fill_holes) {
  check_depth_flow_projection_backward_args(grad_, flow_, depth_, output_, count_, t);
  const auto io = prepare_flow_projection_backward(grad_, flow_, depth_, output_, count_);
  const at::Tensor &grad = io.grad, &flow = io.flow, &depth = io.depth, &output = io.output,
                   &count = io.count, &grad_flow = io.grad_flow, &grad_depth = io.grad_depth;
  const int64_t batch = io.batch;
  const int height = io.height, width = io.width;
  const int64_t plane = static_cast<int64_t>(height) * width;
  if (flow.numel() == 0) return {grad_flow, grad_depth};
  const auto acc_type = flow_projection_acc_type(flow.scalar_type());
  // With hole filling, first carry the holes' gradient to the pixels they were filled from.
  const auto grad_projected = fill_holes ? at::empty(flow.sizes(), flow.options().dtype(acc_type)) : grad;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, flow.scalar_type(), "depth_flow_projection_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t* cnt = count.data_ptr<acc_t>();
    if (fill_holes) {
      const scalar_t* g = grad.data_ptr<scalar_t>();
      acc_t* gp = grad_projected.data_ptr<acc_t>();
      at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t b = row / height;
          const int y = row % height;
          for (int x = 0; x < width; ++x) {
            const int64_t i = b * 2 * plane + static_cast<int64_t>(y) * width + x;
            fill_holes_transpose_pixel(g + b * 2 * plane, cnt + b * plane, plane, x, y, width,
                                       height, gp + i, gp + i + plane);
          }
        }
      });
    }
    const scalar_t* f = flow.data_ptr<scalar_t>();
    const scalar_t* d = depth.data_ptr<scalar_t>();
    const scalar_t* out = output.data_ptr<scalar_t>();
    scalar_t* gf = grad_flow.data_ptr<scalar_t>();
    scalar_t* gd = grad_depth.data_ptr<scalar_t>();
    const acc_t tt = static_cast<acc_t>(t);
    auto gather = [&](auto* gp) {
      at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t b = row / height;
          const int y = row % height;
          for (int x = 0; x < width; ++x) {
            const int64_t i = static_cast<int64_t>(y) * width + x;
            const int64_t fi = b * 2 * plane + i;
            const acc_t depth_value = static_cast<acc_t>(d[b * plane + i]);
            const acc_t w = projection_weight(depth_value, inverse_depth);
            acc_t gfx, gfy, gw;
            source_gradient(x, y, width, height, tt, static_cast<acc_t>(f[fi]),
                            static_cast<acc_t>(f[fi + plane]), w, gp + b * 2 * plane,
                            out + b * 2 * plane, cnt + b * plane, plane, &gfx, &gfy, &gw);
            gf[fi] = static_cast<scalar_t>(gfx);
            gf[fi + plane] = static_cast<scalar_t>(gfy);
            // w = 1/D: dw/dD = −w².
            gd[b * plane + i] = static_cast<scalar_t>(inverse_depth ? gw : -gw * w * w);
          }
        }
      });
    };
    if (fill_holes) {
      gather(grad_projected.data_ptr<acc_t>());
    } else {
      gather(grad.data_ptr<scalar_t>());
    }
  });
  return {grad_flow, grad_depth};
}

}  // namespace

TORCH_LIBRARY_IMPL(redet, CPU, m) {
  register_depth_flow_projection_kernels(m, &depth_flow_projection_cpu,
                                         &depth_flow_projection_backward_cpu);
}

}  // namespace redet
