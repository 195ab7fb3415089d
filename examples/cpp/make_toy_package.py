"""Writes a toy AOTInductor package with the exported detector's signature, for checking a build of
redet_infer without a trained model (and for its tests).

    python examples/cpp/make_toy_package.py toy.pt2 [--size H W]

The toy takes a uint8 (H, W, 3) BGR image and returns (boxes (N, 5) le90, scores (N,), labels (N,)
int64, count), as the real package does. It calls two of the plugin's ops (roi_pool, then
nms_keep_mask), so a program that runs it proves the op library is linked and registered. It
"detects" bright colours: each cell of a 4 x 4 grid (and the grid shifted by half a cell) is a
candidate; its score is its brightest pixel in its brightest channel, and its class that channel.
"""
import argparse
import json

import torch

import redet_plugin.ops  # noqa: F401  (registers torch.ops.redet.* and their fake kernels)

CLASSES = ["blue", "green", "red"]  # the channels in BGR order
GRID = 4


class ToyColourDetector(torch.nn.Module):
    def __init__(self, input_size):
        super().__init__()
        height, width = input_size
        cell_h, cell_w = height / GRID, width / GRID
        rows = []
        for shift in (0.0, 0.5):  # the shifted grid overlaps the first one: NMS has work to do
            for i in range(GRID):
                for j in range(GRID):
                    x1, y1 = (j + shift) * cell_w, (i + shift) * cell_h
                    rows.append([x1, y1, min(x1 + cell_w, width) - 1, min(y1 + cell_h, height) - 1])
        corners = torch.tensor(rows, dtype=torch.float32)
        self.register_buffer("rois", torch.cat([torch.zeros(len(rows), 1), corners], dim=1))
        centres = (corners[:, :2] + corners[:, 2:] + 1) / 2
        sizes = corners[:, 2:] - corners[:, :2] + 1
        # A different angle per candidate, in le90's [-pi/2, pi/2), so the printout shows them.
        angles = torch.linspace(-1.2, 1.2, len(rows)).unsqueeze(1)
        self.register_buffer("candidate_boxes", torch.cat([centres, sizes, angles], dim=1))

    def forward(self, image_bgr: torch.Tensor):
        features = image_bgr.permute(2, 0, 1).unsqueeze(0).float()
        pooled, _ = torch.ops.redet.roi_pool(features, self.rois, 1.0, 1, 1)  # (K, 3, 1, 1)
        best, labels = pooled.flatten(1).max(dim=1)
        scores = best / 255.0
        keep = torch.ops.redet.nms_keep_mask(self.candidate_boxes, scores, 0.1, labels)
        # Kept candidates first, by score; the rest after them (the exporter's padded layout).
        rank = torch.where(keep, scores, scores - 2.0)
        order = torch.sort(rank, descending=True, stable=True).indices
        count = keep.sum()
        return self.candidate_boxes[order], scores[order], labels[order], count


def make_toy_package(path, input_size=(64, 96)):
    """Compiles the toy for the CPU into the AOTInductor package `path`; returns `path`."""
    model = ToyColourDetector(input_size).eval()
    example = torch.zeros(*input_size, 3, dtype=torch.uint8)
    with torch.no_grad():
        program = torch.export.export(model, (example,))
    metadata = json.dumps({"classes": CLASSES, "input_size": list(input_size),
                           "torch": torch.__version__, "plugin": "toy", "device": "cpu"})
    return torch._inductor.aoti_compile_and_package(
        program, package_path=str(path),
        inductor_configs={"aot_inductor.metadata": {"redet": metadata}})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="the .pt2 file to write")
    parser.add_argument("--size", type=int, nargs=2, default=(64, 96), metavar=("H", "W"))
    args = parser.parse_args()
    print(make_toy_package(args.package, tuple(args.size)))


if __name__ == "__main__":
    main()
