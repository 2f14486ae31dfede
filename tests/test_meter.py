"""The memory meter counts each storage once, frees with the last tensor, keeps a host pool and names
the op at its peak."""

from __future__ import annotations

import torch

from coop.graph_capture.cost import allocator_bytes
from coop.runtime.meter import MemoryMeter, host_pool


def test_counts_each_storage_once_and_tracks_the_peak() -> None:
    with MemoryMeter() as meter:
        a = torch.ones(1000)  # 4000 B
        view = a.view(10, 100).t()  # a view: no new bytes
        assert meter.current_bytes == 4000
        b = a * 2
        assert meter.current_bytes == 8000
        del a
        assert meter.current_bytes == 8000  # the view keeps a's storage alive
        del view
        assert meter.current_bytes == 4000
        del b
        assert meter.current_bytes == 0
    assert meter.peak_bytes == 8000


def test_tracked_tensors_count_until_they_die() -> None:
    weight = torch.zeros(250)
    with MemoryMeter() as meter:
        meter.track(weight, weight[:10])
        assert meter.current_bytes == 1000
        out = weight + 1
        assert meter.peak_bytes == 2000
        del out
    assert meter.current_bytes == 1000


def test_multi_output_ops_and_inplace_ops() -> None:
    with MemoryMeter() as meter:
        x = torch.randn(4, 8)  # 128 B
        values, indices = x.max(dim=1)  # 16 B + 32 B
        assert meter.current_bytes == 128 + 16 + 32
        x.add_(1)  # in place: same storage, no new bytes
        assert meter.current_bytes == 128 + 16 + 32
        del values, indices, x
    assert meter.current_bytes == 0


def test_host_pool_is_counted_apart() -> None:
    with MemoryMeter() as meter:
        x = torch.ones(100)
        with host_pool():
            host = x.clone()
        del x
        assert meter.current_bytes == 0 and meter.host_current_bytes == 400
        back = host.clone()
        del host
    assert meter.host_peak_bytes == 400 and meter.host_current_bytes == 0
    assert meter.peak_bytes == 400 and back.numel() == 100


def test_peak_of_a_training_step_is_at_least_the_parameters() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    params = list(model.parameters())
    with MemoryMeter() as meter:
        meter.track(*params)
        model(torch.randn(8, 16)).sum().backward()
    param_bytes = sum(p.untyped_storage().nbytes() for p in params)
    assert meter.peak_bytes >= 2 * param_bytes  # weights plus their gradients


def test_names_the_op_that_reaches_the_peak_and_records_a_timeline() -> None:
    with MemoryMeter(record=True) as meter:
        a = torch.ones(100)  # 400 B
        b = torch.cat([a, a])  # 800 B: the peak, 1200 B
        del a
        c = b.sum()  # 4 B
        del b
    assert meter.peak_bytes == 1200 and meter.peak_op == "aten.cat.default"
    ops = [op for op, _ in meter.timeline]
    assert ops[meter.peak_index] == "aten.cat.default"
    assert meter.timeline[-1] == ("aten.sum.default", 800 + 4) and c.item() == 200


def test_a_reduced_loss_that_keeps_its_elementwise_buffer_counts_the_whole_buffer() -> None:
    """CPU's mse_loss returns a 0-d loss whose storage is the 4 x 8 unreduced buffer: 128 bytes live,
    not the 4 bytes of one float, as long as the loss lives."""
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with MemoryMeter() as meter:
        loss = torch.ops.aten.mse_loss.default(x, y, 1)
        assert loss.dim() == 0 and meter.current_bytes == 4 * 8 * 4
    assert meter.peak_bytes == 128


def test_cuda_storages_count_whole_allocator_blocks() -> None:
    """The CUDA caching allocator hands out 512-byte blocks; CPU storages count their own bytes."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [allocator_bytes(n, cuda) for n in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]
    assert [allocator_bytes(n, cpu) for n in (0, 1, 513)] == [0, 1, 513]
