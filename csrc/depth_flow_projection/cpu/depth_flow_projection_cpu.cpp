// Depth-aware flow projection on the CPU. The scatter runs image by image (parallel over the batch),
// visiting source pixels in raster order, so it is deterministic. Normalisation and the hole
// filling's row pass run parallel over rows, its column pass parallel over columns (the linear
// sweeps of flow_hole_fill.h); the backward is a gather, parallel over rows.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "depth_flow_projection/depth_flow_projection.h"
#include "depth_flow_projection/flow_hole_fill.h"
#include "depth_flow_projection/flow_projection.h"

namespace redet {
namespace {

// Row pass of the hole filling (flow_hole_fill.h), or plain normalisation without it:
// output and count of every non-hole; left + right partial sums of the holes.
template <typename scalar_t, typename acc_t>
void normalize_rows(const PlainSlots<acc_t>& slots, int64_t batch, int height, int width,
                    bool fill_holes, scalar_t* out, acc_t* count) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t row = r * width;                      // slot of (b, y, 0)
      scalar_t* out_row = out + (r / height) * plane + row;  // (b, 0, y, 0) of the output
      for (int x = 0; x < width; ++x) {
        const auto p = load_projected<acc_t, acc_t>(slots, row + x);  // a hole gives (0, 0, 0)
        out_row[x] = static_cast<scalar_t>(p.x);
        out_row[plane + x] = static_cast<scalar_t>(p.y);
        count[row + x] = p.count;
      }
      if (!fill_holes) continue;
      for_each_hole_run(
          0, width, -1, -1,
          [&](int x0) { return hole_word(count + row, 1, x0, width); },
          [&](int first, int stop, int left, int right) {
            const auto l = projected_value_at<acc_t>(slots, left >= 0 ? row + left : -1);
            const auto r_ = projected_value_at<acc_t>(slots, right >= 0 ? row + right : -1);
            for (int x = first; x < stop; ++x) store_row_partial(slots, count, row + x, l, r_);
          });
    }
  });
}

// Column pass of the hole filling: top + bottom, the mean, output and count of the holes.
template <typename scalar_t, typename acc_t>
void fill_columns(const PlainSlots<acc_t>& slots, int64_t batch, int height, int width,
                  scalar_t* out, acc_t* count) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  at::parallel_for(0, batch * width, 16, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t b = c / width;
      const int64_t column = b * plane + (c - b * width);  // slot of (b, 0, x)
      for_each_hole_run(
          0, height, -1, -1,
          [&](int y0) { return hole_word(count + column, width, y0, height); },
          [&](int first, int stop, int top, int bottom) {
            fill_column_run<scalar_t, acc_t, acc_t>(slots, count, out + b * plane + column, plane,
                                                    column, width, first, stop, top, bottom);
          });
    }
  });
}

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
            const acc_t depth_value = static_cast<acc_t>(dd[i]);
            ProjectionCorners c;
            if (!depth_is_valid(depth_value, inverse_depth) ||
                !project_pixel(x, y, gx, gy, width, height, &c)) {
              continue;
            }
            const acc_t w = projection_weight(depth_value, inverse_depth);
            const int xs[4] = {c.left, c.right, c.left, c.right};
            const int ys[4] = {c.top, c.top, c.bottom, c.bottom};
            for (int k = 0; k < 4; ++k) {
              acc_t* target = ab + 4 * (static_cast<int64_t>(ys[k]) * width + xs[k]);
              target[0] -= w * gx;
              target[1] -= w * gy;
              target[2] += w;
            }
          }
        }
      }
    });

    const PlainSlots<acc_t> slots{a};
    scalar_t* out = output.data_ptr<scalar_t>();
    acc_t* cnt = count.data_ptr<acc_t>();
    normalize_rows(slots, batch, height, width, fill_holes, out, cnt);
    if (fill_holes) fill_columns(slots, batch, height, width, out, cnt);
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
            acc_t gfx, gfy, gd_value;
            source_pixel_gradient(x, y, width, height, tt, static_cast<acc_t>(f[fi]),
                                  static_cast<acc_t>(f[fi + plane]),
                                  static_cast<acc_t>(d[b * plane + i]), inverse_depth,
                                  gp + b * 2 * plane, out + b * 2 * plane, cnt + b * plane, plane,
                                  &gfx, &gfy, &gd_value);
            gf[fi] = static_cast<scalar_t>(gfx);
            gf[fi + plane] = static_cast<scalar_t>(gfy);
            gd[b * plane + i] = static_cast<scalar_t>(gd_value);
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
