"""The shared validators: each refuses bad input with a ValueError naming the field and the value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from course_lib._checks import (
    require_bool,
    require_dataset,
    require_optional_positive_int,
    require_partition,
    require_sequence,
    require_tensor,
)


def test_require_sequence_accepts_list_likes_and_refuses_the_rest():
    assert require_sequence("xs", (1, 2)) == [1, 2]
    assert require_sequence("xs", []) == []
    assert len(require_sequence("xs", torch.ones(2, 3))) == 2  # rows of a tensor
    for junk in (None, 3, "ab", b"ab", {"a": 1}, {1, 2}, torch.tensor(3)):
        with pytest.raises(ValueError, match="xs must be a sequence"):
            require_sequence("xs", junk)
    with pytest.raises(ValueError, match="xs must not be empty"):
        require_sequence("xs", [], allow_empty=False)


def test_require_optional_positive_int_keeps_none_and_refuses_what_is_not_a_count():
    assert require_optional_positive_int("max_length", None) is None
    assert require_optional_positive_int("max_length", np.int64(8)) == 8
    for junk in (0, -3, True, 2.0, "8"):
        with pytest.raises(ValueError, match="max_length"):
            require_optional_positive_int("max_length", junk)


def test_require_tensor_converts_and_checks_shape_kind_and_range():
    assert require_tensor("ids", [[1, 2], [3, 4]], ndim=2, dtype_kind="i").dtype == torch.long
    assert require_tensor("ids", [], ndim=1, dtype_kind="i").dtype == torch.long  # an empty list takes the kind
    given = torch.ones(3)
    assert require_tensor("x", given, dtype_kind="f") is given
    assert require_tensor("x", np.arange(3), ndim=(1, 2)).tolist() == [0, 1, 2]
    # flags stay legal where booleans are: a mask given as a mixed list of True and 1
    assert require_tensor("mask", [True, 1, 0], dtype_kind="bi").tolist() == [1, 1, 0]
    cases = [
        (None, {}, "ids must be a tensor .* got None"),
        ([[1, 2], [3]], {}, r"ids must be a tensor .* got \[\[1, 2\], \[3\]\]"),
        ("12", {}, "ids must be a tensor"),
        ({"a": 1}, {}, "ids must be a tensor"),
        ([1.5], {"dtype_kind": "i"}, "ids must be an integer tensor, got dtype torch.float32"),
        ([True], {"dtype_kind": "if"}, "ids must be an integer or floating-point tensor"),
        ([1, 2], {"ndim": 2}, r"ids must have 2 dimension\(s\), got shape \(2,\)"),
        ([1, 7], {"maximum": 5}, "ids must hold values <= 5, got 7 at index 1"),
        ([[0, -3]], {"minimum": 0}, r"ids must hold values >= 0, got -3 at index \(0, 1\)"),
        ([float("nan")], {"minimum": 0}, "ids must be finite"),
        ([5, True, -100], {"dtype_kind": "i"}, r"ids must hold numbers, not True/False, got \[5, True, -100\]"),
        ([[5, 6], (False, 7)], {"dtype_kind": "if"}, "ids must hold numbers, not True/False"),
    ]
    for value, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            require_tensor("ids", value, **kwargs)


def test_require_partition_names_the_group_and_the_index():
    assert require_partition("rows", [[1], [0, 2]]) == [[1], [0, 2]]
    assert require_partition("batches", [torch.tensor([0, 1])], 2) == [[0, 1]]
    cases = [
        (None, None, "rows must be a sequence"),
        ([3], None, r"rows\[0\] must be a sequence of integers, got 3"),
        ([[0], []], None, r"rows\[1\] must not be empty"),
        ([[0], [0]], None, r"rows\[1\] repeats index 0"),
        ([[0, 2]], None, r"rows\[0\] holds index 2, beyond the last index 1"),
        ([[0]], 2, r"rows must cover every index in range\(2\); missing \[1\]"),
        ([[-1]], None, r"rows\[0\]\[0\] must be >= 0, got -1"),
    ]
    for groups, count, message in cases:
        with pytest.raises(ValueError, match=message):
            require_partition("rows", groups, count)


def test_require_bool_refuses_truthy_values():
    assert require_bool("flag", True) is True
    assert require_bool("flag", np.bool_(False)) is False
    assert require_bool("flag", torch.tensor(True)) is True
    for junk in (None, 0, 1, "yes", [True], torch.ones(2, dtype=torch.bool)):
        with pytest.raises(ValueError, match="flag must be True or False"):
            require_bool("flag", junk)


def test_require_dataset_names_the_column_field():
    from datasets import Dataset

    dataset = Dataset.from_dict({"messages": [[]]})
    require_dataset("dataset", dataset, column="messages")
    with pytest.raises(ValueError, match="dataset must be a datasets.Dataset, got None"):
        require_dataset("dataset", None)
    with pytest.raises(ValueError, match=r"messages_column = 'chat' is not a column of dataset: \['messages'\]"):
        require_dataset("dataset", dataset, column="chat", column_name="messages_column")
    with pytest.raises(ValueError, match="messages_column = 3"):
        require_dataset("dataset", dataset, column=3, column_name="messages_column")


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("bound", [0, 3, 2**40, 2**63 - 1, -(2**40), -(2**63)])
def test_integer_bounds_beyond_the_dtype_agree_with_python_comparisons(dtype, bound):
    """torch casts a Python int bound to the tensor's dtype (int32 [3] <= 2**63 - 1 reads False): the check decides
    such bounds itself, so an int8/16/32 tensor or array passes INT64_MAX as it should (a helper students import)."""
    values = torch.tensor([0, 3, 7], dtype=dtype)
    for keyword, inside in (("maximum", lambda v: v <= bound), ("minimum", lambda v: v >= bound)):
        expected = all(inside(v) for v in values.tolist())
        for given in (values, values.numpy()):
            if expected:
                require_tensor("x", given, **{keyword: bound})
            else:
                with pytest.raises(ValueError, match="must hold values"):
                    require_tensor("x", given, **{keyword: bound})


def test_require_ratio_closed_or_open_at_zero():
    """[0, 1] by default; (0, 1] with strict_minimum=True (a share that must not be zero, as an MFU)."""
    from course_lib._checks import require_ratio

    assert require_ratio("share", 0) == 0.0 and require_ratio("share", 1) == 1.0
    assert require_ratio("mfu", 0.4, strict_minimum=True) == 0.4
    with pytest.raises(ValueError, match=r"^mfu must be > 0.0, got 0.0"):
        require_ratio("mfu", 0.0, strict_minimum=True)
    for bad in (1.01, -0.1, float("nan"), True):
        with pytest.raises(ValueError, match="^share "):
            require_ratio("share", bad)
