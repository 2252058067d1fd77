"""gpuparity.flash_attn's cross entropy (ops.triton.cross_entropy.cross_entropy_loss and
losses.cross_entropy.CrossEntropyLoss) against a float64 referee written from FlashAttention's
definition, forward and backward, on the Triton row kernel and its torch twin: ignored rows, one
row, one class, odd vocabularies, label smoothing, logit_scale, z-loss, precomputed_lse, every
reduction, inplace_backward, FlashAttention-shaped errors and torch.compile."""
from __future__ import annotations

import pytest
import torch
from device_env import TEST_DEVICE, require_device  # sets TRITON_INTERPRET=1 on the CPU

import gpuparity.flash_attn as flash_attn
from gpuparity.flash_attn.losses.cross_entropy import CrossEntropyLoss
from gpuparity.flash_attn.ops.triton.cross_entropy import cross_entropy_loss
from fa_reference import check

require_device()
DEVICE = torch.device(TEST_DEVICE)
IGNORE = -100


def reference(logits, labels, smoothing=0.0, logit_scale=1.0, lse_square_scale=0.0, precomputed_lse=None,
              ignore_index=IGNORE, dtype=torch.float64):
    """(losses, z_losses) per row in `dtype`: lse(s z) - (1 - eps) s z_y - eps mean(s z) + c lse^2,
    0 on ignored rows; with precomputed_lse (s = 1, eps = 0) its value in the forward and lse(z)'s
    derivative in the backward, as FlashAttention's kernels."""
    z = logits.to(dtype) * logit_scale
    valid = labels.cpu() != ignore_index
    safe = labels.cpu().long().masked_fill(~valid, 0).to(z.device)
    lse = torch.logsumexp(z, dim=-1)
    if precomputed_lse is not None:
        lse = lse + (precomputed_lse.to(dtype) - lse).detach()   # its value, lse's gradient
    picked = z.gather(1, safe[:, None])[:, 0]
    losses = lse - (1 - smoothing) * picked - smoothing * z.mean(dim=-1)
    z_losses = lse_square_scale * lse.square()
    zero = torch.zeros((), dtype=dtype, device=z.device)
    valid = valid.to(z.device)
    return torch.where(valid, losses + z_losses, zero), torch.where(valid, z_losses, zero)


def inputs(rows, vocab, ignored=(), seed=0, dtype=torch.float32, spread=3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * spread
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[list(ignored)] = IGNORE
    grad = torch.randn(rows, generator=gen)
    return logits.to(dtype), labels, grad


def losses_and_grad(fn, logits, grad):
    leaf = logits.detach().clone().requires_grad_()
    losses, z_losses = fn(leaf)
    losses.backward(grad.to(losses.dtype))
    return [losses.detach(), leaf.grad], z_losses.detach()


CASES = {
    "plain_ignored_rows": dict(rows=7, vocab=11, ignored=(2, 5)),
    "one_row": dict(rows=1, vocab=13),
    "one_class": dict(rows=3, vocab=1, ignored=(1,)),
    "smoothing": dict(rows=6, vocab=17, ignored=(0,), label_smoothing=0.1),
    "logit_scale": dict(rows=5, vocab=9, logit_scale=0.37),
    "z_loss": dict(rows=6, vocab=33, ignored=(4,), lse_square_scale=1e-2),
    "everything": dict(rows=9, vocab=70, ignored=(1, 8), label_smoothing=0.2, logit_scale=1.7, lse_square_scale=3e-3),
    "precomputed_lse": dict(rows=5, vocab=12, ignored=(3,), precomputed=True, lse_square_scale=1e-2),
}


@pytest.mark.parametrize("backend", ["composition", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_cross_entropy_loss_matches_float64(name, backend):
    case = dict(CASES[name])
    logits, labels, grad = inputs(case.pop("rows"), case.pop("vocab"), case.pop("ignored", ()))
    lse = torch.logsumexp(logits.double(), dim=-1) if case.pop("precomputed", False) else None
    options = dict(smoothing=case.get("label_smoothing", 0.0), logit_scale=case.get("logit_scale", 1.0),
                   lse_square_scale=case.get("lse_square_scale", 0.0))
    with flash_attn.backends(cross_entropy=backend):
        mine, z_mine = losses_and_grad(
            lambda t: cross_entropy_loss(t, labels.to(DEVICE), precomputed_lse=None if lse is None else
                                         lse.float().to(DEVICE), **case), logits.to(DEVICE), grad.to(DEVICE))
    ref, z_ref = losses_and_grad(lambda t: reference(t, labels, precomputed_lse=lse, **options), logits.double(),
                                 grad.double())
    base, _ = losses_and_grad(lambda t: reference(t, labels, precomputed_lse=lse, dtype=torch.float32, **options),
                              logits, grad)
    check([t.cpu() for t in mine], ref, base, torch.float32, names=("losses", "dlogits"))
    torch.testing.assert_close(z_mine.cpu().double(), z_ref, rtol=1e-5, atol=1e-6)
    ignored = labels == IGNORE
    assert not mine[0].cpu()[ignored].any() and not mine[1].cpu()[ignored].any()


def test_precomputed_lse_is_used_as_given_and_only_where_flash_attention_uses_it():
    logits, labels, _ = inputs(4, 10, seed=2)
    lse = torch.logsumexp(logits, dim=-1) + 0.5
    with flash_attn.backends(cross_entropy="triton"):
        plain, _ = cross_entropy_loss(logits.to(DEVICE), labels.to(DEVICE))
        given, _ = cross_entropy_loss(logits.to(DEVICE), labels.to(DEVICE), precomputed_lse=lse.to(DEVICE))
        smoothed_given, _ = cross_entropy_loss(logits.to(DEVICE), labels.to(DEVICE), precomputed_lse=lse.to(DEVICE),
                                               label_smoothing=0.1)
        smoothed, _ = cross_entropy_loss(logits.to(DEVICE), labels.to(DEVICE), label_smoothing=0.1)
    torch.testing.assert_close(given - plain, torch.full_like(plain, 0.5))
    torch.testing.assert_close(smoothed_given, smoothed)   # ignored with smoothing, as FlashAttention


def test_bf16_logits_on_the_kernel():
    logits, labels, grad = inputs(6, 40, ignored=(3,), seed=3, dtype=torch.bfloat16)
    options = dict(smoothing=0.1, lse_square_scale=1e-3)
    with flash_attn.backends(cross_entropy="triton"):
        mine, _ = losses_and_grad(lambda t: cross_entropy_loss(t, labels.to(DEVICE), label_smoothing=0.1,
                                                               lse_square_scale=1e-3), logits.to(DEVICE),
                                  grad.to(DEVICE))
    assert mine[0].dtype == torch.float32 and mine[1].dtype == torch.bfloat16
    ref, _ = losses_and_grad(lambda t: reference(t, labels, **options), logits.double(), grad.double())
    base, _ = losses_and_grad(lambda t: reference(t, labels, dtype=torch.float32, **options), logits, grad)
    base[1] = base[1].bfloat16()
    check([mine[0].cpu(), mine[1].cpu()], ref, base, torch.bfloat16, names=("losses", "dlogits"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_module_reductions_and_z_loss(reduction):
    logits, labels, _ = inputs(8, 19, ignored=(0, 6), seed=4)
    module = CrossEntropyLoss(reduction=reduction, label_smoothing=0.05, lse_square_scale=1e-2, return_z_loss=True)
    with flash_attn.backends(cross_entropy="composition"):
        leaf = logits.clone().to(DEVICE).requires_grad_()
        loss, z_loss = module(leaf, labels.to(DEVICE))
        loss.sum().backward()
    ref = logits.double().requires_grad_()
    losses, z_losses = reference(ref, labels, smoothing=0.05, lse_square_scale=1e-2)
    count = (labels != IGNORE).sum()
    want, want_z = {"mean": (losses.sum() / count, z_losses.sum() / count), "sum": (losses.sum(), z_losses.sum()),
                    "none": (losses, z_losses)}[reduction]
    want.sum().backward()
    torch.testing.assert_close(loss.detach().cpu().double(), want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z_loss.cpu().double(), want_z.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(leaf.grad.cpu().double(), ref.grad, rtol=1e-5, atol=1e-6)
    assert not module.__class__(reduction="none")(logits.to(DEVICE), labels.to(DEVICE)).isnan().any()


def test_mean_over_all_ignored_rows_is_nan_as_flash_attention():
    logits, labels, _ = inputs(3, 5, ignored=(0, 1, 2))
    with flash_attn.backends(cross_entropy="composition"):
        assert CrossEntropyLoss()(logits.to(DEVICE), labels.to(DEVICE)).isnan()


@pytest.mark.parametrize("backend", ["composition", "triton"])
def test_inplace_backward_writes_the_gradient_into_the_logits(backend):
    logits, labels, grad = inputs(5, 23, ignored=(2,), seed=5)
    with flash_attn.backends(cross_entropy=backend):
        source = logits.clone().to(DEVICE).requires_grad_()
        scaled = source * 1.0   # a non-leaf whose storage the backward may reuse
        losses, _ = cross_entropy_loss(scaled, labels.to(DEVICE), inplace_backward=True)
        losses.backward(grad.to(DEVICE))
    ref, _ = losses_and_grad(lambda t: reference(t, labels), logits.double(), grad.double())
    torch.testing.assert_close(source.grad.cpu().double(), ref[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scaled.detach(), source.grad)   # the logits now hold their gradient


def test_cross_entropy_errors_are_flash_attention_shaped():
    logits, labels, _ = inputs(4, 6)
    logits, labels = logits.to(DEVICE), labels.to(DEVICE)
    with flash_attn.backends(cross_entropy="composition"):
        with pytest.raises(NotImplementedError, match="process_group: gpuparity's cross entropy has no tensor-parallel"):
            cross_entropy_loss(logits, labels, process_group=object())
        with pytest.raises(NotImplementedError, match="process_group"):
            CrossEntropyLoss(process_group=object())
        with pytest.raises(NotImplementedError, match="reduction"):
            CrossEntropyLoss(reduction="batchmean")
        if DEVICE.type == "cpu":   # on a GPU the label check is a device-side assert (no host sync)
            bad = labels.clone()
            bad[1] = 6
            with pytest.raises(RuntimeError, match=r"labels: expected class indices in \[0, 6\) or ignore_index=-100, "
                                                   r"got 6 at 1"):
                cross_entropy_loss(logits, bad)
        with pytest.raises(flash_attn.FlashAttnArgumentError, match=r"labels: expected \(4,\)"):
            cross_entropy_loss(logits, labels[:3])
        with pytest.raises(ValueError, match="logit_scale: expected > 0"):
            cross_entropy_loss(logits, labels, logit_scale=0.0)
        with pytest.raises(ValueError, match="precomputed_lse: expected"):
            cross_entropy_loss(logits, labels, precomputed_lse=torch.zeros(3, device=DEVICE))
        with pytest.raises(ValueError, match="logits: expected a 2-D tensor"):
            cross_entropy_loss(logits[None], labels)


def test_cross_entropy_loss_under_torch_compile_fullgraph():
    """One tiny compiled call (backend aot_eager: inductor's CPU compile is too slow for the suite):
    the row step's torch twin while tracing, equal to eager."""
    torch._dynamo.reset()
    logits, labels, grad = inputs(5, 7, ignored=(1,), seed=6)
    labels = labels.to(DEVICE)

    def step(t):
        return cross_entropy_loss(t, labels, label_smoothing=0.1, lse_square_scale=1e-2)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with flash_attn.backends(cross_entropy="composition"):
        eager, _ = losses_and_grad(step, logits.to(DEVICE), grad.to(DEVICE))
        got, _ = losses_and_grad(compiled, logits.to(DEVICE), grad.to(DEVICE))
    torch.testing.assert_close(got[0], eager[0])
    torch.testing.assert_close(got[1], eager[1])


def test_cross_entropy_module_under_torch_compile_fullgraph():
    """CrossEntropyLoss (mean over the rows not ignored, z-loss returned) compiled (aot_eager)."""
    torch._dynamo.reset()
    logits, labels, _ = inputs(4, 9, ignored=(2,), seed=7)
    module = CrossEntropyLoss(logit_scale=0.5, lse_square_scale=1e-2, return_z_loss=True)

    def step(t):
        loss, z_loss = module(t, labels.to(DEVICE))
        return loss + 0 * z_loss

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    with flash_attn.backends(cross_entropy="composition"):
        eager = [logits.clone().to(DEVICE).requires_grad_() for _ in range(2)]
        want, got = step(eager[0]), compiled(eager[1])
        want.backward()
        got.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(eager[1].grad, eager[0].grad)


# ----------------------------------------------------------------------------- the loss kernels themselves
# Small blocks make the forward loop over several blocks with a ragged tail and the backward run
# several column blocks; (None) is the default configuration.
KERNEL_CONFIGS = {"default": (None, None), "looping": ((16, 1), (8, 1)), "wide": ((64, 2), (32, 2))}
KERNEL_CASES = {
    "plain": dict(rows=6, vocab=37, ignored=(2,)),
    "vocab_1": dict(rows=4, vocab=1, ignored=(3,)),
    "smoothing": dict(rows=5, vocab=53, ignored=(0, 4), smoothing=0.15),
    "z_loss": dict(rows=5, vocab=29, lse_square_scale=2e-2),
    "logit_scale": dict(rows=4, vocab=41, logit_scale=0.6),
    "everything": dict(rows=7, vocab=67, ignored=(1, 6), smoothing=0.25, logit_scale=1.9, lse_square_scale=5e-3),
    "precomputed_lse": dict(rows=5, vocab=31, ignored=(1,), precomputed=True, lse_square_scale=1e-2),
    "all_ignored": dict(rows=3, vocab=19, ignored=(0, 1, 2), smoothing=0.1),
}


@pytest.mark.parametrize("config", list(KERNEL_CONFIGS))
@pytest.mark.parametrize("name", list(KERNEL_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loss_kernels_match_float64(name, config, dtype):
    """loss_forward and loss_backward at each configuration: losses, lse, z-losses and the
    gradient (in the logits' dtype, grad_losses expanded from a scalar and given per row) against
    float64, int32 labels as well as int64."""
    from gpuparity.backends import triton_cross_entropy as kernels
    case = dict(KERNEL_CASES[name])
    rows, vocab = case.pop("rows"), case.pop("vocab")
    logits, labels, grad = inputs(rows, vocab, case.pop("ignored", ()), seed=11, dtype=dtype)
    eps, s, c = case.get("smoothing", 0.0), case.get("logit_scale", 1.0), case.get("lse_square_scale", 0.0)
    lse_given = torch.logsumexp(logits.double(), dim=-1) if case.get("precomputed") else None
    fwd, bwd = KERNEL_CONFIGS[config]
    valid = labels != IGNORE
    for label_dtype, dloss in ((torch.int64, grad), (torch.int32, torch.tensor(0.7).expand(rows))):
        losses, lse, z_losses = kernels.loss_forward(
            logits.to(DEVICE), labels.to(label_dtype).to(DEVICE), eps, s, c, IGNORE,
            None if lse_given is None else lse_given.float().to(DEVICE), config=fwd)
        leaf = logits.double().requires_grad_()
        want, want_z = reference(leaf, labels, eps, s, c, precomputed_lse=lse_given)
        want.backward(dloss.double())
        grad_out = torch.empty_like(logits).to(DEVICE)
        got = kernels.loss_backward(dloss.to(DEVICE), logits.to(DEVICE), lse, labels.to(label_dtype).to(DEVICE),
                                    eps, s, c, IGNORE, grad_out, config=bwd)
        assert got.dtype == dtype and got.data_ptr() == grad_out.data_ptr()
        torch.testing.assert_close(losses.cpu().double(), want.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(z_losses.cpu().double(), want_z, rtol=1e-5, atol=1e-6)
        want_lse = (torch.logsumexp(logits.double() * s, dim=-1) if lse_given is None else lse_given)
        torch.testing.assert_close(lse.cpu().double()[valid], want_lse[valid], rtol=1e-5, atol=1e-5)
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-3)
        torch.testing.assert_close(got.cpu().double(), leaf.grad.to(dtype).double(), **tol)
        assert not got.cpu()[~valid].any() and not losses.cpu()[~valid].any()


def test_loss_backward_writes_into_the_logits_and_fp16():
    """inplace_backward's form (out is the logits) on fp16 logits wider than one block."""
    from gpuparity.backends import triton_cross_entropy as kernels
    logits, labels, grad = inputs(4, 45, ignored=(1,), seed=12, dtype=torch.float16)
    device_logits = logits.clone().to(DEVICE)
    losses, lse, _ = kernels.loss_forward(device_logits, labels.to(DEVICE), 0.1, 1.3, 1e-3, IGNORE, config=(16, 1))
    got = kernels.loss_backward(grad.to(DEVICE), device_logits, lse, labels.to(DEVICE), 0.1, 1.3, 1e-3, IGNORE,
                                device_logits, config=(16, 1))
    assert got.data_ptr() == device_logits.data_ptr()
    leaf = logits.double().requires_grad_()
    want, _ = reference(leaf, labels, 0.1, 1.3, 1e-3)
    want.backward(grad.double())
    torch.testing.assert_close(losses.cpu().double(), want.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(device_logits.cpu().double(), leaf.grad.half().double(), rtol=2e-3, atol=1e-4)


def test_cross_entropy_loss_runs_the_loss_kernels_on_the_triton_backend(monkeypatch):
    """On the Triton backend the loss is the two loss kernels (no row-step call), strided logits
    made contiguous first, strided int32 labels read right."""
    from gpuparity.backends import triton_cross_entropy as kernels
    calls = []
    for fn in ("loss_forward", "loss_backward", "triton_rows"):
        original = getattr(kernels, fn)
        monkeypatch.setattr(kernels, fn, lambda *a, _f=original, _n=fn, **k: calls.append(_n) or _f(*a, **k))
    monkeypatch.setattr(kernels, "STEPS", kernels.STEPS._replace(rows=kernels.triton_rows))
    logits, labels, grad = inputs(5, 26, ignored=(0,), seed=13)
    pairs = torch.stack([logits, logits], dim=-1).to(DEVICE).requires_grad_()
    strided = pairs[..., 0]
    assert strided.stride(-1) == 2
    strided_labels = torch.stack([labels, labels + 1], dim=-1).int().to(DEVICE)[:, 0]   # int32, stride 2
    with flash_attn.backends(cross_entropy="triton"):
        losses, _ = cross_entropy_loss(strided, strided_labels, label_smoothing=0.05, logit_scale=0.8)
        losses.backward(grad.to(DEVICE))
    mine = [losses.detach(), pairs.grad[..., 0]]
    assert not pairs.grad[..., 1].any()
    assert calls == ["loss_forward", "loss_backward"]
    ref, _ = losses_and_grad(lambda t: reference(t, labels, 0.05, 0.8), logits.double(), grad.double())
    torch.testing.assert_close(mine[0].cpu().double(), ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine[1].cpu().double(), ref[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad_label", [-1, 19, 1000])
def test_the_forward_kernel_flags_labels_outside_the_vocabulary(bad_label):
    """The forward kernel's own label check (on a GPU a device-side assert after the kernel, the
    cross_entropy_loss call's only one there; a ValueError on the CPU), with or without a
    precomputed lse; a label equal to ignore_index is not flagged."""
    from gpuparity.backends import triton_cross_entropy as kernels
    logits, labels, _ = inputs(4, 19, ignored=(0,), seed=14)
    if DEVICE.type == "cuda":
        pytest.skip("a device-side assert ends the process's CUDA context")
    labels[2] = bad_label
    for lse in (None, torch.logsumexp(logits, dim=-1)):
        with pytest.raises(ValueError, match=r"labels: a class index outside \[0, 19\) that is not ignore_index=-100"):
            kernels.loss_forward(logits, labels, 0.0, 1.0, 0.0, IGNORE, lse, config=(8, 1))
    labels[0] = 3
    losses, _, _ = kernels.loss_forward(logits, labels, 0.0, 1.0, 0.0, bad_label, config=(8, 1))
    assert losses[2] == 0 and losses[0] > 0


def test_loss_kernel_configs_keep_columns_per_thread_and_fit_the_vendor():
    from gpuparity.backends import triton_cross_entropy as kernels
    assert kernels.loss_fwd_config(32000) == kernels.LOSS_FWD == kernels.loss_fwd_config(128256)
    assert kernels.loss_bwd_config(128256) == kernels.LOSS_BWD
    assert kernels.loss_fwd_config(50) == (64, 1) and kernels.loss_bwd_config(1) == (1, 1)
    for fn in (kernels.loss_fwd_config, kernels.loss_bwd_config):
        for vocab in (1, 7, 1000, 4096, 32000, 128256, 1 << 20):
            block, warps = fn(vocab)
            assert block <= max(1, 1 << (vocab - 1).bit_length()) and warps * 32 <= 1024
            assert fn(vocab, hip=True)[1] * 64 <= 1024


def test_labels_outside_the_vocabulary_on_the_triton_backend():
    """On the CPU (the interpreter) the Triton backend keeps the host check and its message."""
    if DEVICE.type == "cuda":
        pytest.skip("on a GPU the check is the forward kernel's device-side assert")
    logits, labels, _ = inputs(4, 6, seed=15)
    labels[3] = -2
    with flash_attn.backends(cross_entropy="triton"):
        with pytest.raises(RuntimeError, match=r"labels: expected class indices in \[0, 6\) or ignore_index=-100, "
                                               r"got -2 at 3"):
            cross_entropy_loss(logits, labels)
