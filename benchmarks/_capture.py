"""CUDA graph capture for the sanitize drivers: warm up on a side stream, capture, replay."""
import torch


def capture(step, *inputs):
    """Warms `step` up on a side stream (as torch.cuda.graph's documentation asks), captures it on
    the static `inputs` and returns (graph, static outputs). Replay with graph.replay()."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*inputs)
    return graph, outputs
