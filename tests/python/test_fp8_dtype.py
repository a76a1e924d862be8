"""The float8 dtypes from Python: td.float8_e4m3fn / td.float8_e5m2, conversions both ways,
tolist / numpy, printing, safetensors interop with the reference `safetensors` package, and the
refusal of arithmetic.

The Debian torch (1.13) has no float8, so the oracle here is an independent decoder and encoder
written from the OCP FP8 definitions in exact rational arithmetic (fractions.Fraction): every one
of the 256 codes of each format is checked, and float32 -> fp8 rounding on values chosen around
every rounding boundary. All comparisons are exact.
"""
import bisect
import functools
import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from safetensors import TensorSpec, deserialize, serialize

import tardelli as td

# name -> (dtype, exponent bits, mantissa bits, bias, has infinities, max finite)
FORMATS = {
    "e4m3fn": (td.float8_e4m3fn, 4, 3, 7, False, 448.0),
    "e5m2": (td.float8_e5m2, 5, 2, 15, True, 57344.0),
}


def decode(code, fmt):
    """The value of an fp8 code (a float; NaN for NaN codes), from the format's definition."""
    _, e_bits, m_bits, bias, has_inf, _ = FORMATS[fmt]
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if has_inf and e == top:
        return sign * math.inf if m == 0 else math.nan
    if not has_inf and e == top and m == (1 << m_bits) - 1:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + m, e - bias - m_bits)


@functools.lru_cache(maxsize=None)
def finite_codes(fmt):
    """(value as a Fraction, code) for every finite non-negative code, in increasing order."""
    out = []
    for c in range(128):
        v = decode(c, fmt)
        if math.isfinite(v):
            out.append((Fraction(v), c))
    return tuple(out)


def encode(x, fmt, saturate):
    """The fp8 code of float x: the nearest finite value, ties to the even code; beyond the
    largest finite value's rounding range +-max (saturate) or NaN / +-inf; NaN -> S.1111111."""
    _, _, _, _, has_inf, fmax = FORMATS[fmt]
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return sign | 0x7F
    max_code = 0x7B if has_inf else 0x7E
    overflow = max_code if saturate else (0x7C if has_inf else 0x7F)
    if math.isinf(x):
        return sign | overflow
    a = Fraction(abs(x))
    cands = list(finite_codes(fmt))
    # The value one step above max (the code after max's) bounds max's rounding range: a value
    # rounding to it overflows.
    step = cands[-1][0] - cands[-2][0]
    cands.append((cands[-1][0] + step, max_code + 1))
    if a >= cands[-1][0]:
        return sign | overflow
    i = bisect.bisect_right([v for v, _ in cands], a)  # cands[i - 1] <= a < cands[i]
    (lo, lo_code), (hi, hi_code) = cands[i - 1], cands[i]
    if a - lo != hi - a:
        code = lo_code if a - lo < hi - a else hi_code
    else:  # a tie: the even code
        code = lo_code if lo_code % 2 == 0 else hi_code
    return sign | (overflow if code > max_code else code)


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def boundary_floats(fmt, n_random=2000):
    """float32 values at, just above and just below every midpoint between neighbouring codes,
    the codes themselves, values beyond the range, and random values over every binade."""
    vals = set()
    cands = [v for v, _ in finite_codes(fmt)]
    cands = sorted(cands)
    step = cands[-1] - cands[-2]
    cands.append(cands[-1] + step)
    for lo, hi in zip(cands, cands[1:]):
        for v in (lo, (lo + hi) / 2):
            b = struct.unpack("<I", struct.pack("<f", float(v)))[0]
            for d in (-1, 0, 1):
                if 0 <= b + d < 0x7F800000:
                    vals.add(f32(b + d))
    vals.update([0.0, 1e30, 3.4e38, math.inf, 1e-45, 1e-30])
    rng = np.random.default_rng(3)
    vals.update(float(v) for v in np.exp2(rng.uniform(-20, 17, n_random)).astype(np.float32))
    vals = sorted(vals)
    return vals + [-v for v in vals]


def code_tensor(fmt, tmp_path):
    """A [256] tensor of the fp8 dtype holding codes 0..255, written by the reference safetensors
    package (Python has no other way to hand tardelli raw fp8 bytes)."""
    buf = np.arange(256, dtype=np.uint8)
    name = "float8_e4m3fn" if fmt == "e4m3fn" else "float8_e5m2"
    data = serialize({"c": TensorSpec(dtype=name, shape=[256], data_ptr=buf.ctypes.data,
                                      data_len=256)}, None)
    p = tmp_path / f"codes_{fmt}.safetensors"
    p.write_bytes(data)
    return td.io.load_safetensors(p)["c"]


def codes_of(t, tmp_path):
    """The bytes of an fp8 tensor, through tardelli's writer and the reference reader."""
    p = tmp_path / "out.safetensors"
    td.io.save_safetensors({"t": t}, p)
    ((_, info),) = deserialize(p.read_bytes())
    return list(info["data"]), info["dtype"]


def test_dtypes_exposed():
    assert repr(td.float8_e4m3fn) == "tardelli.float8_e4m3fn"
    assert repr(td.float8_e5m2) == "tardelli.float8_e5m2"
    assert td.float8_e4m3fn.itemsize == 1 and td.float8_e5m2.itemsize == 1
    # Note [FP8 dtypes]: storage only, so not "floating point" here (torch says True).
    assert not td.float8_e4m3fn.is_floating_point
    assert td.zeros(2, 3, dtype=td.float8_e5m2).dtype == td.float8_e5m2
    assert td.ones(2).to(dtype=td.float8_e4m3fn).dtype == td.float8_e4m3fn


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_every_code_round_trips_through_float32(fmt, tmp_path):
    # Property: each of the 256 codes decodes to its value by the format's definition (tolist,
    # .float(), .to(td.float32)) and converts back to itself (NaN codes to S.1111111).
    dtype = FORMATS[fmt][0]
    t = code_tensor(fmt, tmp_path)
    assert t.dtype == dtype and t.shape == (256,)
    assert codes_of(t, tmp_path) == (list(range(256)), "F8_E4M3" if fmt == "e4m3fn" else "F8_E5M2")
    want = [decode(c, fmt) for c in range(256)]
    for got in (t.tolist(), t.float().tolist(), t.to(td.float32).tolist()):
        for c, (g, w) in enumerate(zip(got, want)):
            if math.isnan(w):
                assert math.isnan(g), (fmt, c)
            else:
                assert g == w and math.copysign(1, g) == math.copysign(1, w), (fmt, c, g, w)
    back, _ = codes_of(t.float().to(dtype), tmp_path)
    nan_code = [c for c in range(256) if math.isnan(want[c])]
    assert back == [(c & 0x80) | 0x7F if c in nan_code else c for c in range(256)]


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_float32_to_fp8_rounds_to_nearest_even(fmt, tmp_path):
    # Property: .to(fp8) is the nearest-even rounding without saturation (torch's semantics);
    # td.to_fp8(x, dtype) saturates to +-max instead; both equal the exact-arithmetic reference.
    dtype = FORMATS[fmt][0]
    xs = boundary_floats(fmt)
    x = td.tensor(np.array(xs, dtype=np.float32))
    plain, _ = codes_of(x.to(dtype), tmp_path)
    sat, _ = codes_of(td.to_fp8(x, dtype), tmp_path)
    nosat, _ = codes_of(td.to_fp8(x, dtype, saturate=False), tmp_path)
    for i, v in enumerate(xs):
        assert plain[i] == encode(v, fmt, saturate=False), (fmt, v, plain[i])
        assert sat[i] == encode(v, fmt, saturate=True), (fmt, v, sat[i])
    assert nosat == plain
    # bf16 / f16 sources round once from their exact values
    for src in (td.bfloat16, td.float16):
        xv = x.to(src)
        got, _ = codes_of(xv.to(dtype), tmp_path)
        assert got == [encode(v, fmt, False) for v in xv.tolist()]


def test_numpy_refuses_tolist_converts_and_printing():
    t = td.tensor([1.0, -2.0, 0.3], dtype=td.float8_e4m3fn)
    with pytest.raises(td.TardelliError, match="numpy has no float8_e4m3fn dtype"):
        t.numpy()
    assert t.tolist() == [1.0, -2.0, 0.3125]  # 0.3 rounds to 0.3125 = 1.010 x 2^-2
    assert np.asarray(t).dtype == np.float32
    assert repr(t) == "tensor([1.0000, -2.0000, 0.3125], dtype=float8_e4m3fn)"
    assert t[1].item() == -2.0
    assert math.isnan(td.tensor([448.0, 500.0], dtype=td.float8_e4m3fn).float().tolist()[1])
    assert math.isinf(td.tensor([1e6], dtype=td.float8_e5m2).item())


def test_views_and_copies_move_fp8_bytes():
    # values exact in both formats (e5m2 has 2 mantissa bits: 9 and 11 are not)
    v = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, -14], dtype=np.float32).reshape(3, 4)
    x = td.tensor(v, dtype=td.float8_e5m2)
    assert x.tolist() == v.tolist()
    assert x.t().contiguous().tolist() == v.T.tolist()
    assert x[:, 1::2].tolist() == v[:, 1::2].tolist()
    assert td.cat([x, x[:1]]).tolist() == np.concatenate([v, v[:1]]).tolist()
    assert x.reshape(2, 6).tolist() == v.reshape(2, 6).tolist()
    y = td.zeros(3, 4, dtype=td.float8_e4m3fn)
    y.copy_(x)  # converts e5m2 -> e4m3fn
    assert y.dtype == td.float8_e4m3fn and y.tolist() == v.tolist()


def test_arithmetic_is_refused():
    a = td.ones(2, dtype=td.float8_e4m3fn)
    with pytest.raises(td.TardelliError, match="add: unsupported dtype float8_e4m3fn"):
        a + a
    with pytest.raises(td.TardelliError, match="promotion between float8_e4m3fn and float32"):
        a + td.ones(2)
    with pytest.raises(td.TardelliError, match="exp: unsupported dtype float8_e4m3fn"):
        a.exp()
    with pytest.raises(td.TardelliError, match="float8_e4m3fn"):
        a.requires_grad_(True)
