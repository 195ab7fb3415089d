"""ReResNet-50 + ReFPN (e2cnn, C8) on one GPU against mmdet's ResNet-50 + FPN in the same run.

Measures construction time, a training step (forward + backward; e2cnn expands its filters from
the basis every step), eval forward with e2cnn's cached filters, the forward after export to plain
convolutions (with the export's error), and the same with fp16 autocast.
Usage (repo root): python -m benchmarks.ops.bench_re_resnet --out benchmarks/results/re_resnet_h200.json
Without CUDA it runs on the CPU (wall-clock medians, no memory, no amp): a smoke check, e.g.
  python -m benchmarks.ops.bench_re_resnet --out /tmp/re_resnet_cpu.json --size 64 --batch 1 --repeats 2
"""
import argparse
import time

import torch
from mmdet.models.backbones import ResNet
from mmdet.models.necks import FPN

from benchmarks._timing import (environment, median_wall_ms, peak_extra_memory_mb, time_cuda,
                                write_json)
from redet_plugin.models.backbones import ReResNet
from redet_plugin.models.necks import ReFPN

IN_CHANNELS = [256, 512, 1024, 2048]
CUDA = torch.cuda.is_available()


def time_ms(fn, repeats, warmup=3):
    if CUDA:
        return time_cuda(fn, repeats=repeats, warmup=warmup)
    return median_wall_ms(fn, repeats, warmup)


def build(equivariant):
    start = time.perf_counter()
    if equivariant:
        backbone, neck = ReResNet(depth=50), ReFPN(IN_CHANNELS, 256, num_outs=5)
    else:
        backbone, neck = ResNet(depth=50, norm_eval=False), FPN(IN_CHANNELS, 256, num_outs=5)
    model = torch.nn.Sequential(backbone, neck)
    return model, time.perf_counter() - start


def train_step(model, x):
    def step():
        outs = model(x)
        sum(o.float().mean() for o in outs).backward()
    return step


def measure(model, x, repeats, amp):
    row = {}
    model.train()
    with torch.autocast(x.device.type, dtype=torch.float16, enabled=amp):
        step = train_step(model, x)
        row["train_step_ms"] = time_ms(step, repeats)
        row["train_step_peak_mb"] = peak_extra_memory_mb(step) if CUDA else None
        model.zero_grad(set_to_none=True)
        model.eval()
        with torch.no_grad():
            row["eval_forward_ms"] = time_ms(lambda: model(x), repeats)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if CUDA else "cpu"
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    env = environment() if CUDA else dict(device="cpu", torch=torch.__version__)
    results = dict(environment=env, input=list(x.shape), rows=[])
    for name, equivariant in (("ReResNet50+ReFPN", True), ("ResNet50+FPN (mmdet)", False)):
        model, build_s = build(equivariant)
        model = model.to(device)
        for amp in ((False, True) if CUDA else (False,)):
            row = dict(model=name, equivariant=equivariant, amp=amp, build_s=build_s, **measure(model, x, args.repeats, amp))
            if equivariant and not amp:
                with torch.no_grad():
                    before = model.eval()(x)
                    model[0].export(), model[1].export()
                    after = model(x)
                    row["exported_eval_forward_ms"] = time_ms(lambda: model(x), args.repeats)
                row["export_max_rel_err"] = max(((a - b).norm() / b.norm()).item()
                                                for a, b in zip(after, before))
                model, _ = build(True)  # a fresh e2cnn model for the amp row
                model = model.to(device)
            results["rows"].append(row)
            print(row, flush=True)
    eq = {r["amp"]: r for r in results["rows"] if r["equivariant"]}
    plain = {r["amp"]: r for r in results["rows"] if not r["equivariant"]}
    results["ratios"] = {
        f"{key}_equivariant_over_plain{'_amp' if amp else ''}": eq[amp][key] / plain[amp][key]
        for amp in eq for key in ("train_step_ms", "eval_forward_ms", "train_step_peak_mb")
        if eq[amp][key] is not None}
    results["ratios"]["exported_over_plain_eval_forward"] = (
        eq[False]["exported_eval_forward_ms"] / plain[False]["eval_forward_ms"])
    write_json(args.out, results)


if __name__ == "__main__":
    main()
