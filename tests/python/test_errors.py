"""Errors surface as Python exceptions carrying the C++ message: td::Error becomes
tardelli.TardelliError (a RuntimeError) whose text names the op, the shapes and the dtypes;
index errors are also IndexErrors; unsupported torch features are NotImplementedErrors."""
import numpy as np
import pytest

import tardelli as td


def test_error_class():
    assert issubclass(td.TardelliError, RuntimeError)
    assert issubclass(td.TardelliIndexError, td.TardelliError)
    assert issubclass(td.TardelliIndexError, IndexError)
    assert issubclass(td.TardelliNotImplementedError, NotImplementedError)


def test_add_shape_mismatch():
    with pytest.raises(td.TardelliError) as e:
        td.zeros(2, 3) + td.zeros(4)
    msg = str(e.value)
    assert msg.startswith("add: ") and "[2, 3]" in msg and "[4]" in msg


def test_matmul_shape_mismatch():
    with pytest.raises(td.TardelliError, match="matmul") as e:
        td.zeros(2, 3) @ td.zeros(4, 5)
    assert "[2, 3]" in str(e.value) and "[4, 5]" in str(e.value)
    with pytest.raises(td.TardelliError, match="mm"):
        td.mm(td.zeros(2, 3), td.zeros(2, 3))


def test_view_errors():
    with pytest.raises(td.TardelliError, match="view") as e:
        td.zeros(2, 3).view(4, 2)
    assert "[4, 2]" in str(e.value)
    with pytest.raises(td.TardelliError, match="view"):
        td.zeros(3, 4).t().view(12)  # not viewable without a copy
    assert td.zeros(3, 4).t().reshape(12).shape == (12,)


def test_bad_dtype():
    with pytest.raises(td.TardelliError, match="floating"):
        td.zeros(2, dtype=td.int64).requires_grad_()
    with pytest.raises(td.TardelliError, match="gelu.*int64"):
        td.nn.functional.gelu(td.zeros(2, dtype=td.int64))
    with pytest.raises(td.TardelliError, match=r"\.float\(\)"):
        td.ones(2, dtype=td.bfloat16).numpy()
    with pytest.raises(td.TardelliError, match="float64.*astype"):
        td.from_numpy(np.zeros(3))
    with pytest.raises(td.TardelliError, match="bool"):
        td.ones(2, dtype=td.bool) + td.ones(2, dtype=td.bool)


def test_index_out_of_range():
    x = td.zeros(3, 4)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        x[3]
    with pytest.raises(td.TardelliIndexError):
        x[:, -5]
    with pytest.raises(IndexError, match="out of bounds"):
        x[td.tensor([0, 7])]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(td.TardelliError, match="select.*out of range"):
        x.select(1, 9)
    with pytest.raises(td.TardelliError, match="embedding"):
        td.nn.functional.embedding(td.tensor([5]), td.zeros(3, 2))
    with pytest.raises(IndexError):
        x.size(2)


def test_cat_mismatches():
    with pytest.raises(td.TardelliError, match="cat") as e:
        td.cat([td.zeros(2, 3), td.zeros(2, 4)], 0)
    assert "[2, 3]" in str(e.value) and "[2, 4]" in str(e.value)
    with pytest.raises(td.TardelliError, match="cat"):
        td.cat([td.zeros(2, 3), td.zeros(2, 3, 1)], 0)
    with pytest.raises(td.TardelliError, match="cat"):
        td.cat([], 0)
    with pytest.raises(td.TardelliError, match="stack"):
        td.stack([td.zeros(2), td.zeros(3)])


def test_backward_twice_without_retain_graph():
    x = td.ones(3, requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(td.TardelliError, match="second time.*retain_graph"):
        y.backward()


def test_backward_misuse():
    with pytest.raises(td.TardelliError, match="does not require grad"):
        td.ones(2).sum().backward()
    x = td.ones(2, requires_grad=True)
    with pytest.raises(td.TardelliError, match="one-element"):
        (x * 2).backward()
    with pytest.raises(td.TardelliError, match="shape"):
        (x * 2).backward(td.ones(3))
    with pytest.raises(td.TardelliError, match="in-place"):
        x.add_(td.ones(2))
    with pytest.raises(td.TardelliError, match="in-place"):
        x[0] = 1.0
    with pytest.raises(td.TardelliError, match="detach"):
        x.numpy()
    with pytest.raises(td.TardelliError, match="allow_unused"):
        td.autograd.grad((x * 2).sum(), [x, td.ones(1, requires_grad=True)])


def test_misc_errors():
    with pytest.raises(td.TardelliError, match="one-element|only one"):
        td.ones(3).item()
    with pytest.raises(td.TardelliError, match="ambiguous"):
        bool(td.ones(3))
    with pytest.raises(td.TardelliError, match="CUDA"):
        td.ones(2).to("cuda")
    with pytest.raises(td.TardelliNotImplementedError, match="dropout_p"):
        q = td.zeros(1, 1, 2, 4)
        td.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="reduction"):
        td.nn.functional.cross_entropy(td.zeros(2, 3), td.tensor([0, 1]), reduction="avg")
    with pytest.raises(td.TardelliError, match="approx|gelu"):
        td.nn.functional.gelu(td.zeros(2), approximate="erf")
    with pytest.raises(TypeError):
        len(td.tensor(1.0))
    with pytest.raises(ValueError, match="step"):
        td.zeros(4)[::-1]
