"""Fingerprints equal the definition bit for bit, whatever path computes them.

The definition (fingerprint.py): elements read as signed integers of their width, b_1..b_n;
fingerprint = (sum b_i, sum i * b_i) modulo 2**64, as signed int64. The references below compute
exactly that from the raw bytes, with Python integers (small tensors) or numpy uint64 arithmetic
(large tensors), independently of the torch code under test.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import numpy as np
import pytest
import torch

from sdc_agent import fingerprint, fingerprints
from sdc_agent._fingerprint_plan import Tuning

FP = sys.modules["sdc_agent.fingerprint"]  # the module (the package exports the function)

ALL_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def _raw(tensor: torch.Tensor) -> tuple[bytes, int]:
    """The tensor's bytes in flattened (row-major) order and the width of one scalar."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).contiguous().reshape(-1)
    width = flat.element_size()
    return bytes(flat.view(torch.uint8).tolist()), width


def _signed64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


def reference(tensor: torch.Tensor | None) -> list[int]:
    """The definition with Python integers: obviously correct, slow."""
    if tensor is None:
        return [0, 0]
    raw, width = _raw(tensor)
    s0 = s1 = 0
    for i in range(len(raw) // width):
        b = int.from_bytes(raw[i * width : (i + 1) * width], sys.byteorder, signed=True)
        s0 += b
        s1 += (i + 1) * b
    return [_signed64(s0), _signed64(s1)]


def reference_numpy(tensor: torch.Tensor) -> list[int]:
    """The definition with numpy uint64 arithmetic (wraps modulo 2**64): fast enough for 10M."""
    raw, width = _raw(tensor)
    signed = np.frombuffer(raw, dtype=f"=i{width}").astype(np.int64).view(np.uint64)
    positions = np.arange(1, signed.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        s0 = int(signed.sum(dtype=np.uint64))
        s1 = int((signed * positions).sum(dtype=np.uint64))
    return [_signed64(s0), _signed64(s1)]


def random_tensor(dtype: torch.dtype, n: int, generator: torch.Generator) -> torch.Tensor:
    """n elements of ``dtype`` with uniformly random bit patterns (NaNs and all)."""
    width = torch.empty(0, dtype=dtype).element_size()
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=generator).bool()
    raw = torch.randint(0, 256, (n * width,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype)


@pytest.fixture
def tiny_tuning(monkeypatch: pytest.MonkeyPatch) -> Tuning:
    """CPU tuning with 4-lane rows and 3-row chunks: every boundary shows up in small tensors."""
    tuning = Tuning(lanes_per_row=4, rows_per_chunk=3, min_fast_lanes=8, generic_batch=5)
    monkeypatch.setattr(FP, "CPU_TUNING", tuning)
    monkeypatch.setattr(FP, "_PLANS", OrderedDict())
    return tuning


@pytest.fixture
def fresh_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default tuning with an empty plan cache (so plans are built inside the test)."""
    monkeypatch.setattr(FP, "_PLANS", OrderedDict())


SMALL_SIZES = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 23, 24, 25, 47, 48, 49, 97, 100]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_and_boundary_size_matches_the_definition(tiny_tuning, dtype):
    # Given tensors of every size around the (tiny) row, chunk and batch boundaries
    g = torch.Generator().manual_seed(1)
    tensors = [random_tensor(dtype, n, g) for n in SMALL_SIZES]
    # When they are fingerprinted together and one by one
    together = fingerprints(tensors)
    alone = [fingerprint(t).tolist() for t in tensors]
    # Then both equal the definition
    expected = [reference(t) for t in tensors]
    assert together.tolist() == expected
    assert alone == expected


def test_mixed_list_with_none_empty_and_views_matches_the_definition(tiny_tuning):
    # Given a list mixing dtypes, None, empty tensors and non-contiguous views
    g = torch.Generator().manual_seed(2)
    base16 = random_tensor(torch.bfloat16, 101, g)
    matrix = random_tensor(torch.float32, 7 * 9, g).view(7, 9)
    tensors = [
        None,
        random_tensor(torch.float32, 50, g),
        torch.empty(0, dtype=torch.bfloat16),
        matrix.t(),  # transposed: flattened in its own row-major order
        matrix[:, ::2],  # strided
        base16[1:],  # odd storage offset: 16-bit pairs cannot be viewed as int32
        base16[2:],
        random_tensor(torch.float64, 33, g).view(3, 11)[:, 1:],
        None,
        random_tensor(torch.int8, 40, g),
    ]
    # When fingerprinted
    table = fingerprints(tensors)
    # Then every row equals the definition, None rows are (0, 0), and the table is int64 [N, 2]
    assert table.dtype == torch.int64
    assert table.shape == (len(tensors), 2)
    assert table.tolist() == [reference(t) for t in tensors]


@pytest.mark.parametrize(
    "value", [0x7FFFFFFF, -0x80000000, -1, 0x7FFF0000, 0x0000FFFF, -0x7FFF0001], ids=hex
)
def test_extreme_32_bit_patterns_at_the_exactness_bounds(monkeypatch, value):
    # Given rows and chunks as long as the exactness bound allows (2**15 lanes, 2**15 rows)
    # and 32-bit elements whose halves are extreme (largest low-half sums, extreme high halves)
    monkeypatch.setattr(FP, "_PLANS", OrderedDict())
    wide = Tuning(lanes_per_row=2**15, rows_per_chunk=2, min_fast_lanes=2**15, generic_batch=7)
    tall = Tuning(lanes_per_row=2, rows_per_chunk=2**15, min_fast_lanes=2, generic_batch=7)
    tensor = torch.full((2**16 + 3,), value, dtype=torch.int32)
    for tuning in (wide, tall):
        monkeypatch.setattr(FP, "CPU_TUNING", tuning)
        FP._PLANS.clear()
        # When fingerprinted
        got = fingerprint(tensor).tolist()
        # Then the wrap-around arithmetic still equals the definition
        assert got == reference_numpy(tensor)


@pytest.mark.parametrize("value", [0x7FFF, -0x8000, -1, 0x00FF, -0x7F01], ids=hex)
def test_extreme_16_bit_patterns_at_the_exactness_bounds(monkeypatch, value):
    # Given 16-bit elements read as pairs in rows/chunks at the bound, with extreme values
    monkeypatch.setattr(FP, "_PLANS", OrderedDict())
    wide = Tuning(lanes_per_row=2**15, rows_per_chunk=2, min_fast_lanes=2**15, generic_batch=7)
    tall = Tuning(lanes_per_row=2, rows_per_chunk=2**15, min_fast_lanes=2, generic_batch=7)
    tensor = torch.full((2**17 + 5,), value, dtype=torch.int16)
    alternating = tensor.clone()
    alternating[1::2] = -1 - value  # the other extreme in the high element of each pair
    for tuning in (wide, tall):
        monkeypatch.setattr(FP, "CPU_TUNING", tuning)
        FP._PLANS.clear()
        # When fingerprinted
        got = fingerprints([tensor, alternating]).tolist()
        # Then it equals the definition
        assert got == [reference_numpy(tensor), reference_numpy(alternating)]


def test_default_tuning_on_realistic_sizes_matches_the_definition(fresh_plans):
    # Given a parameter-like list with sizes around the default row (1024 lanes), chunk
    # (1M lanes) and small-tensor (32K lanes) boundaries, in fp32, bf16 and fp16
    g = torch.Generator().manual_seed(3)
    sizes = [1, 1023, 2**15 - 1, 2**15, 2**15 + 1, 2**20 - 1, 2**20 + 1024, 2**21 + 3]
    tensors = [random_tensor(torch.float32, n, g) for n in sizes]
    tensors += [random_tensor(torch.bfloat16, 2 * n, g) for n in sizes[:5]]
    tensors += [random_tensor(torch.float16, 2**21 + 2049, g)]
    # When fingerprinted together
    table = fingerprints(tensors)
    # Then every row equals the definition
    assert table.tolist() == [reference_numpy(t) for t in tensors]


def test_cached_buffers_carry_no_state_between_calls(fresh_plans):
    # Given two different lists of the same shapes (so they share a cached plan and buffers)
    g = torch.Generator().manual_seed(4)
    a = [random_tensor(torch.float32, 2**16 + 5, g), random_tensor(torch.bfloat16, 3 * 2**15, g)]
    b = [torch.zeros_like(t) for t in a]
    # When they are fingerprinted alternately
    first = fingerprints(a)
    zeros = fingerprints(b)
    again = fingerprints(a)
    # Then each result depends only on its own input
    assert torch.equal(first, again)
    assert zeros.tolist() == [[0, 0], [0, 0]]
    assert first.tolist() == [reference_numpy(t) for t in a]


def test_nothing_is_read_back_to_the_host(tiny_tuning, monkeypatch):
    # Given tensors on both paths, and any read-back of a tensor value made to fail
    g = torch.Generator().manual_seed(5)
    tensors = [random_tensor(torch.float32, 40, g), random_tensor(torch.int64, 9, g), None]
    expected = [reference(t) for t in tensors]

    def forbidden(*_args, **_kwargs):
        raise AssertionError("the fingerprint read a value back to the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__index__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    # When fingerprinted (the first call also builds the plan)
    table = fingerprints(tensors)
    table_again = fingerprints(tensors)
    monkeypatch.undo()
    # Then it completed without reading anything back, and is right
    assert table.tolist() == expected
    assert table_again.tolist() == expected


def test_empty_and_none_inputs():
    # Given no tensors, only None, and one empty tensor
    # Then the shapes and zeros are as documented
    assert fingerprints([]).shape == (0, 2)
    assert fingerprints([None, None]).tolist() == [[0, 0], [0, 0]]
    assert fingerprint(None).tolist() == [0, 0]
    assert fingerprint(torch.empty(0)).tolist() == [0, 0]
    assert fingerprint(torch.empty(0, 5)).dtype == torch.int64


def test_table_digest_is_sha256_of_the_little_endian_table():
    # Given a small table
    table = torch.tensor([[1, -2], [2**62, -(2**63)]], dtype=torch.int64)
    # When digested
    digest = FP.table_digest(table)
    # Then it is the sha256 of the int64 values in native byte order (stable across versions)
    import hashlib

    raw = b"".join(v.to_bytes(8, sys.byteorder, signed=True) for v in [1, -2, 2**62, -(2**63)])
    assert digest == hashlib.sha256(raw).hexdigest()


def test_tuning_rejects_sizes_that_would_break_exactness():
    # The 2**15 bounds keep every low-half sum below 2**31; larger values must be refused.
    with pytest.raises(ValueError, match="lanes_per_row"):
        Tuning(lanes_per_row=2**15 + 1, rows_per_chunk=4, min_fast_lanes=2**16, generic_batch=4)
    with pytest.raises(ValueError, match="rows_per_chunk"):
        Tuning(lanes_per_row=4, rows_per_chunk=2**15 + 1, min_fast_lanes=4, generic_batch=4)
    with pytest.raises(ValueError, match="min_fast_lanes"):
        Tuning(lanes_per_row=8, rows_per_chunk=4, min_fast_lanes=4, generic_batch=4)


def test_backend_variable_is_validated_and_torch_is_always_available(monkeypatch, tiny_tuning):
    # Given a misspelt backend choice
    monkeypatch.setenv("SDC_FINGERPRINT_BACKEND", "cuda-fast")
    # Then fingerprinting fails with a message naming the variable and the choices
    with pytest.raises(ValueError, match="SDC_FINGERPRINT_BACKEND must be one of auto, torch"):
        fingerprints([torch.ones(3)])
    # And when the torch path is chosen explicitly, the result is the definition
    monkeypatch.setenv("SDC_FINGERPRINT_BACKEND", "torch")
    tensor = random_tensor(torch.bfloat16, 77, torch.Generator().manual_seed(6))
    assert fingerprint(tensor).tolist() == reference(tensor)


@pytest.mark.parametrize("threads", [1, 2])
def test_serial_and_threaded_chunk_loops_agree_with_the_definition(tiny_tuning, threads):
    # Given the chunk loop run in the caller's thread (1 intra-op thread) or on workers (2)
    g = torch.Generator().manual_seed(8)
    tensors = [random_tensor(torch.float32, 301, g), random_tensor(torch.float16, 402, g)]
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # When fingerprinted
        table = fingerprints(tensors)
    finally:
        torch.set_num_threads(saved)
    # Then the result is the definition either way
    assert table.tolist() == [reference(t) for t in tensors]
