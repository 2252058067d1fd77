"""The ahead-of-time check compiles each configuration as a launch on contiguous, aligned tensors
does (triton_common.launch_like): innermost strides as the constant 1, pointers and strides
divisible by 16. Without that, a kernel's loads are neither contiguous nor vectorized, Triton
pipelines fewer of them through shared memory, and the check under-reports the shared memory a
real launch needs (the attention dq kernel: 98,304 bytes against the 262,144 an H100 asked for)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gpuparity.backends import triton_common  # noqa: E402
from gpuparity.backends.triton_attention.aot import aot_specs  # noqa: E402


@triton.jit
def _tile_sum(A, Out, n_tiles, stride_m, stride_d, BLOCK: tl.constexpr):
    """A loop of (BLOCK x BLOCK) tile loads into a product: Triton pipelines the loads through
    shared memory when they are contiguous (stride_d == 1) and aligned."""
    rows = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for i in range(n_tiles):
        tile = tl.load(A + (i * BLOCK + rows)[:, None] * stride_m + rows[None, :] * stride_d)
        acc = tl.dot(tile, tile, acc)
    tl.store(Out + rows[:, None] * BLOCK + rows[None, :], acc)


def _spec(unit_params=(), aligned_params=()):
    return triton_common.AotSpec(
        name="tile_sum", kernel=_tile_sum,
        signature={"A": "*bf16", "Out": "*fp32", "n_tiles": "i32", "stride_m": "i32", "stride_d": "i32",
                   "BLOCK": "constexpr"},
        constexprs={"BLOCK": 64}, num_warps=4, num_stages=3, unit_params=unit_params,
        aligned_params=aligned_params)


def test_launch_like_specializes_as_a_contiguous_aligned_launch():
    signature, constexprs, attrs = triton_common.launch_like(_spec(("stride_d",)))
    assert signature["stride_d"] == "constexpr" and constexprs["stride_d"] == 1
    names = list(signature)
    marked = {names[index[0]] for index in attrs}
    assert marked == {"A", "Out", "stride_m"}          # pointers and the other strides; not n_tiles
    assert all(value == [["tt.divisibility", 16]] for value in attrs.values())
    with pytest.raises(ValueError, match="unit_params names 'n_tile'"):
        triton_common.launch_like(_spec(("n_tile",)))
    # aligned_params: integers not named stride* that launches pass as multiples of 16
    signature, _, attrs = triton_common.launch_like(_spec(("stride_d",), ("n_tiles",)))
    assert {list(signature)[index[0]] for index in attrs} == {"A", "Out", "stride_m", "n_tiles"}
    with pytest.raises(ValueError, match="aligned_params names 'BLOCK'"):
        triton_common.launch_like(_spec((), ("BLOCK",)))


def _shared_bytes_plain_and_contiguous() -> dict:
    plain = triton_common.compile_spec(_spec(), "cuda:90", binary=False)
    contiguous = triton_common.compile_spec(_spec(("stride_d",)), "cuda:90", binary=False)
    return {"plain": [plain.ok, plain.shared_bytes, plain.error],
            "contiguous": [contiguous.ok, contiguous.shared_bytes, contiguous.error]}


def test_the_check_sees_the_pipeline_a_contiguous_launch_builds():
    """The same kernel reports more shared memory when built as a contiguous launch: fails if
    compile_spec stopped passing launch_like's specialization to Triton. In a fresh process
    without TRITON_INTERPRET (a kernel decorated under the interpreter cannot be compiled)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["plain"][0] and result["contiguous"][0], result
    assert result["contiguous"][1] > result["plain"][1], result


def test_builds_stay_out_of_the_cache_launches_read(tmp_path):
    """An AOT build is keyed as a real launch is (launch_like): it must not land in the Triton
    cache that launches read, or a GPU machine's launch of that kernel would load a binary built
    for another target or a placeholder. Binary and IR-only builds, in a fresh process."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, __file__, "--binary"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["binary"][0]
    main = tmp_path / "cache"
    assert not main.exists() or not any(path.is_file() for path in main.rglob("*")), sorted(main.rglob("*"))
    assert any(path.is_file() for path in (tmp_path / "cache-gpuparity-aot").rglob("*"))
    assert any(path.is_file() for path in (tmp_path / "cache-gpuparity-ir-only").rglob("*"))


def test_every_attention_spec_names_its_unit_strides():
    specs = aot_specs()
    assert specs
    for spec in specs:
        assert {"stride_qd", "stride_kd", "stride_vd"} <= set(spec.unit_params), spec.name
        triton_common.launch_like(spec)    # every name is an i32 parameter of its kernel


def test_decode_specs_build_with_their_strides_aligned():
    """Decode's strides are not named stride*: its specs name them, or the check builds loads of
    K and V that are not vectorized (71,680 bytes of shared memory at d128 g8q1 on sm_90 as a
    launch builds it, 22,528 without)."""
    from gpuparity.backends import triton_decode
    specs = triton_decode.aot_specs()
    assert specs
    for spec in specs:
        signature, _, attrs = triton_common.launch_like(spec)
        marked = {list(signature)[index[0]] for index in attrs}
        strides = {name for name in signature if name.startswith(("sq", "sk", "sv", "so_"))}
        assert strides and strides <= marked, (spec.name, strides - marked)


if __name__ == "__main__":
    result = _shared_bytes_plain_and_contiguous()
    if "--binary" in sys.argv:
        built = triton_common.compile_spec(_spec(("stride_d",)), "cuda:90", binary=True)
        result["binary"] = [built.ok, built.shared_bytes, built.error]
    print(json.dumps(result))
