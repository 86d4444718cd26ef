"""Cross-entropy over logits whose vocabulary is split across the TP ranks of the last stage."""
from __future__ import annotations

import torch
import torch.distributed as dist

from autohet_ray.runtime.tp import TPContext, all_reduce

IGNORE_INDEX = -100


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, vocab_start, tp):
        # logits [n, local vocab] in fp32 or wider, labels [n]; returns per-token loss [n] (0 where ignored)
        local_vocab = logits.shape[-1]
        logits_max = all_reduce(logits.max(dim=-1).values, tp, op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        local_labels = labels - vocab_start
        mine = (local_labels >= 0) & (local_labels < local_vocab)
        index = local_labels.masked_fill(~mine, 0).unsqueeze(-1)
        target = shifted.gather(-1, index).squeeze(-1).masked_fill(~mine, 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        reduced = all_reduce(torch.stack([target, sum_exp]), tp)
        valid = labels != IGNORE_INDEX
        loss = (reduced[1].log() - reduced[0]).masked_fill(~valid, 0.0)
        ctx.save_for_backward(exp.div_(reduced[1].unsqueeze(-1)), index, mine, valid)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, index, mine, valid = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, index, -mine.to(grad.dtype).unsqueeze(-1))
        grad.mul_((grad_loss * valid).unsqueeze(-1))
        return grad, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, *, tp: TPContext) -> torch.Tensor:
    """Per-token loss for logits [..., vocab / tp] (this rank's vocabulary slice) and global labels [...]."""
    compute = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    flat = compute.reshape(-1, logits.shape[-1])
    loss = _VocabParallelCE.apply(flat, labels.reshape(-1), tp.rank * logits.shape[-1], tp)
    return loss.view(labels.shape)
