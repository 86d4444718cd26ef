"""Deferred weight gradients: the TP linears with a WeightGradStore give the same input, weight and bias
gradients as plain F.linear autograd, whether captured and flushed later (in any micro-batch order) or not."""
import pytest
import torch
import torch.nn.functional as F

from autohet_ray.runtime.tp import ColumnParallelLinear, RowParallelLinear, TPContext
from autohet_ray.runtime.wgrad import WeightGradStore

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
SHAPE = (2, 3)              # leading dims of every input: [micro_batch, seq]


def _model(dtype):
    """Column (with bias) -> gelu -> row (with bias), random weights; store attached."""
    g = torch.Generator().manual_seed(0)
    col = ColumnParallelLinear(5, 6, bias=True, tp=TPContext(), dtype=dtype)
    row = RowParallelLinear(6, 4, bias=True, tp=TPContext(), dtype=dtype)
    with torch.no_grad():
        for p in (*col.parameters(), *row.parameters()):
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    store = WeightGradStore()
    col.wgrad_store = row.wgrad_store = store
    return col, row, store


def _inputs(n, dtype):
    g = torch.Generator().manual_seed(1)
    return ([torch.randn(*SHAPE, 5, generator=g, dtype=dtype) for _ in range(n)],
            [torch.randn(*SHAPE, 4, generator=g, dtype=dtype) for _ in range(n)])


def _reference(col, row, xs, rs):
    """Plain autograd on copies: per micro-batch input gradients, summed parameter gradients."""
    params = {n: p.detach().clone().requires_grad_(True) for n, p in
              (("col.weight", col.weight), ("col.bias", col.bias), ("row.weight", row.weight), ("row.bias", row.bias))}
    x_grads = []
    for x, r in zip(xs, rs):
        x = x.clone().requires_grad_(True)
        h = F.gelu(F.linear(x, params["col.weight"], params["col.bias"]))
        (F.linear(h, params["row.weight"], params["row.bias"]) * r).sum().backward()
        x_grads.append(x.grad)
    return x_grads, {n: p.grad for n, p in params.items()}


def _backward(col, row, x, r):
    x = x.clone().requires_grad_(True)
    (row(F.gelu(col(x))) * r).sum().backward()
    return x.grad


def _close(a, b, dtype):
    assert float((a - b).abs().max()) <= TOL[dtype] * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_captured_then_flushed_out_of_order_matches_autograd(dtype):
    col, row, store = _model(dtype)
    xs, rs = _inputs(3, dtype)
    ref_x, ref = _reference(col, row, xs, rs)
    for i in range(3):
        with store.capture(i):
            _close(_backward(col, row, xs[i], rs[i]), ref_x[i], dtype)      # input gradient right away
    assert col.weight.grad is None and row.weight.grad is None
    _close(col.bias.grad, ref["col.bias"], dtype)                           # and the biases'
    _close(row.bias.grad, ref["row.bias"], dtype)
    assert store.pending() == [0, 1, 2]

    finals = []
    store.flush(2)
    store.flush(0)
    assert store.pending() == [1]
    store.flush(1, on_final=finals.append)
    assert store.pending() == []
    assert [id(p) for p in finals] == [id(row.weight), id(col.weight)]     # later layer first, once each
    _close(col.weight.grad, ref["col.weight"], dtype)
    _close(row.weight.grad, ref["row.weight"], dtype)


def test_flush_adds_to_gradients_already_there():
    col, row, store = _model(torch.float64)
    xs, rs = _inputs(2, torch.float64)
    _, ref = _reference(col, row, xs, rs)
    _backward(col, row, xs[0], rs[0])                  # not captured: weight gradients at once
    with store.capture(1):
        _backward(col, row, xs[1], rs[1])
    calls = []
    store.flush(7, on_final=calls.append)              # nothing captured for micro-batch 7
    assert calls == []
    store.flush(1)
    _close(col.weight.grad, ref["col.weight"], torch.float64)
    _close(row.weight.grad, ref["row.weight"], torch.float64)


def test_uncaptured_matches_autograd_and_fires_hooks():
    col, row, store = _model(torch.float64)
    xs, rs = _inputs(2, torch.float64)
    ref_x, ref = _reference(col, row, xs, rs)
    fired = []
    for name, p in (("col.weight", col.weight), ("row.weight", row.weight)):
        p.register_post_accumulate_grad_hook(lambda p, name=name: fired.append((name, p.grad is not None)))
    for i in range(2):
        _close(_backward(col, row, xs[i], rs[i]), ref_x[i], torch.float64)
    assert store.pending() == []
    assert sorted(fired) == [("col.weight", True)] * 2 + [("row.weight", True)] * 2
    for name, p in (("col.weight", col.weight), ("col.bias", col.bias), ("row.weight", row.weight),
                    ("row.bias", row.bias)):
        _close(p.grad, ref[name], torch.float64)


def test_the_store_switches_the_linear_function():
    col, _, store = _model(torch.float64)
    x = torch.randn(*SHAPE, 5, dtype=torch.float64, requires_grad=True)
    assert type(col(x).grad_fn).__name__ == "_DeferredLinearBackward"
    col.wgrad_store = None
    assert "Deferred" not in type(col(x).grad_fn).__name__
    with store.capture(0), pytest.raises(AssertionError):
        with store.capture(1):
            pass
