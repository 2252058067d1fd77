"""A user's softmax, checked with `gpuparity check --op softmax --impl docs/examples/my_softmax.py:softmax`.

The battery calls the function with the op's public signature (`gpuparity check --op softmax
--signature` prints it: fn(x, dim=-1)) and checks the output and the gradient of x against a
float64 reference. Any callable works: a Triton kernel wrapped in a torch.autograd.Function,
a CUDA/HIP extension, or plain torch code as here.
"""
import torch


def softmax_naive(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The textbook formula: exp(x) / sum(exp(x)). Overflows to inf/inf = NaN on large logits."""
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The fix: subtract the row maximum first, and do the arithmetic in float32."""
    x32 = x.float()
    e = (x32 - x32.amax(dim=dim, keepdim=True)).exp()
    return (e / e.sum(dim=dim, keepdim=True)).to(x.dtype)
