"""The hidden tests' comparison helpers: types count, and a student's function must leave its arguments alone."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import course_lib
from course_lib import grading
from tests.support.messages import long_checker_message


def _as_student(function):
    function.__module__ = "__main__"  # as if defined in the notebook
    return function


def _library_copy(name: str):
    """A second function object with the library's code: it keeps working while the grader trips the original."""
    original = grading.reference(name)
    copy = types.FunctionType(
        original.__code__, original.__globals__, name, original.__defaults__, original.__closure__
    )
    copy.__kwdefaults__ = original.__kwdefaults__
    return copy


class _AlwaysEqual:
    """What a submission can return to pass any == or != comparison."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


class _AlwaysEqualText(str):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


@pytest.mark.parametrize(
    ("got", "expected"),
    [
        (_AlwaysEqual(), "advance"),
        (_AlwaysEqual(), None),
        (_AlwaysEqual(), b"x"),  # text and None: by their own ==
        ({"decision": _AlwaysEqual()}, {"decision": "hold"}),
        (_AlwaysEqualText("advance"), "hold"),
        (3.0, "3.0"),
        (np.float64(1.0), "1"),
        (1.0, "advance"),
        (0.0, None),  # a float where text or None is promised
        (3.0, 3),  # a float where an int is promised (a true division)
        (np.float64(3.0), 3),
        (torch.tensor(3.0), 3),
        (True, 1),
        (1, True),  # bool and int are different answers
        (np.bool_(True), 1),
        (np.int64(1), True),
        (np.timedelta64(3, "ns"), 3),  # numpy counts a duration as an integer; it is not a count
        (np.array([3]), 3),  # one element, but not a number
        ({"n": np.int64(3)}, {"n": 2}),  # deep: inside dicts, lists and tuples too
        ([1, np.int64(3)], [1, 2]),
        (torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 2])),  # dtype
        (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64)),
        ([1, 2], torch.tensor([1, 2])),  # a list where a tensor is promised
    ],
)
def test_assert_same_refuses_the_wrong_type(got, expected):
    with pytest.raises(AssertionError):
        grading.assert_same(got, expected)


@pytest.mark.parametrize(
    ("got", "expected"),
    [
        (3, 3),
        (3, 3.0),
        (np.float64(0.5), 0.5),
        # a number held by numpy or torch is the number: a right value is right in any of them
        (np.int64(3), 3),
        (torch.tensor(3), 3),
        (torch.tensor(3, dtype=torch.int32), 3),
        ({"n": np.int64(2)}, {"n": 2}),
        ([1, np.int64(2)], [1, 2]),
        (np.bool_(True), True),
        (torch.tensor(False), False),
        (np.float32(0.5), 0.5),
        (np.array(3), 3),  # a 0-d array holds its number too
        (torch.tensor(0.25, dtype=torch.float64), 0.25),
        (0.1 + 0.2, 0.3),
        ((1, 2), [1, 2]),
        ([True], [True]),
        (torch.tensor([1, 2]), torch.tensor([1, 2])),
        ([1, 2], np.array([1, 2])),
        ("fit", "fit"),
        (None, None),
        (np.str_("fit"), "fit"),
        (_AlwaysEqualText("fit"), "fit"),
        (b"x", b"x"),
    ],
)
def test_assert_same_accepts_equal_values_of_the_promised_type(got, expected):
    grading.assert_same(got, expected)


def test_a_function_that_changes_its_input_loses_even_with_the_right_result():
    reference = _library_copy("block_causal_mask")

    @_as_student
    def block_causal_mask(segment_ids):
        result = reference(segment_ids)
        segment_ids[segment_ids < 0] = 99  # "reuses" the caller's tensor
        return result

    cases = [((torch.tensor([0, 0, 1, -1]),), {})]
    with pytest.raises(AssertionError, match=r"changed its input in place: argument 0 \(values\)"):
        grading.assert_matches_reference(block_causal_mask, "block_causal_mask", cases)


def test_a_function_that_pads_the_callers_lists_loses():
    reference = _library_copy("pad_batch")

    @_as_student
    def pad_batch(features, pad_token_id):
        batch = reference(features, pad_token_id)
        for feature, row in zip(features, batch["input_ids"], strict=True):
            feature["input_ids"] = row.tolist()
        return batch

    features = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8], "labels": [8]}]
    with pytest.raises(AssertionError, match=r"argument 0\[1\]\['input_ids'\] \(length\)"):
        grading.assert_matches_reference(pad_batch, "pad_batch", [((features, 0), {})])


def test_switching_on_requires_grad_is_a_change_of_the_input():
    reference = _library_copy("checkpointed_log_probs")

    @_as_student
    def checkpointed_log_probs(hidden, weight, ids, chunk_size=1024):
        hidden.requires_grad_()
        return reference(hidden, weight, ids, chunk_size)

    generator = torch.Generator().manual_seed(0)
    case = (
        (
            torch.randn(1, 6, 4, generator=generator),
            torch.randn(9, 4, generator=generator),
            torch.randint(9, (1, 6), generator=generator),
        ),
        {"chunk_size": 4},
    )
    with pytest.raises(AssertionError, match="requires_grad switched on"):
        grading.assert_matches_reference(checkpointed_log_probs, "checkpointed_log_probs", [case])


def test_an_untouched_input_with_nan_is_not_a_change():
    reference = _library_copy("aggregate_loss")

    @_as_student
    def aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None):
        return reference(token_losses.clone(), mask.clone(), mode, norm_const)

    losses = torch.tensor([[1.0, float("nan")], [2.0, float("inf")]])
    mask = torch.tensor([[True, False], [True, False]])
    grading.assert_matches_reference(aggregate_loss, "aggregate_loss", [((losses, mask), {})])


def test_the_library_itself_leaves_every_graded_input_alone():
    """The rule the grader applies to students holds for the reference on the same kinds of input."""
    features = [
        {"input_ids": np.array([5, 6, 7]), "labels": torch.tensor([-100, 6, 7])},
        {"input_ids": [8], "labels": [8]},
    ]
    segment_ids = torch.tensor([[0, 0, 1, -1, -1]])
    samples = [{"input_ids": [1, 2], "labels": [-100, 2]}, {"input_ids": [3], "labels": [3]}]
    for name, args in (
        ("pad_batch", (features, 0)),
        ("block_causal_mask", (segment_ids,)),
        ("build_boundary_isolated_packing", (samples,)),
    ):
        before = [grading.testing._snapshot(arg) for arg in args]
        getattr(course_lib, name)(*args)
        assert not any(
            grading.testing._changed(old, grading.testing._snapshot(arg), name)
            for old, arg in zip(before, args, strict=True)
        )


def test_a_python_loop_over_tokens_is_seen_without_timing_anything():
    notebook = {"__name__": "__main__", "torch": torch, "reference": _library_copy("block_causal_mask")}
    exec(
        compile(
            """
def vectorized(segment_ids):
    return reference(segment_ids)

def looped(segment_ids):
    length = segment_ids.shape[-1]
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for query in range(length):
        for key in range(query + 1):
            allowed[query, key] = bool(segment_ids[query] == segment_ids[key])
    return allowed
""",
            "<notebook cell>",
            "exec",
        ),
        notebook,
    )  # as a notebook defines them: module __main__
    vectorized, looped = notebook["vectorized"], notebook["looped"]

    def make_input(length):
        return (torch.arange(length) // 3,)

    assert grading.notebook_lines_run(looped, *make_input(8)) == grading.notebook_lines_run(looped, *make_input(8))
    assert grading.notebook_lines_run(looped, *make_input(64)) > 40 * grading.notebook_lines_run(looped, *make_input(8))
    assert grading.notebook_lines_run(vectorized, *make_input(8)) == grading.notebook_lines_run(
        vectorized, *make_input(512)
    )
    grading.assert_no_python_loop_over_tokens(vectorized, "block_causal_mask", make_input)
    with pytest.raises(AssertionError, match="Python loop over tokens"):
        grading.assert_no_python_loop_over_tokens(looped, "block_causal_mask", make_input)


def test_failure_messages_name_the_call_that_failed():
    """A wrong value, an exception from the student's code, or the wrong exception: each message shows the input."""
    reference = _library_copy("sliding_windows")

    @_as_student
    def sliding_windows(length, window, stride):
        windows = reference(length, window, stride)
        return windows[:-1] if length == 10 else windows  # wrong on one input only

    with pytest.raises(AssertionError, match=r"sliding_windows\(case 1\).*\n  called with: 10, 4, 2$"):
        grading.assert_matches_reference(sliding_windows, "sliding_windows", [(9, 4, 2), (10, 4, 2)])

    @_as_student
    def sliding_windows(length, window, stride):  # noqa: F811  (the next student's answer)
        return list(range(0, length - window + 1, stride))[: length // (length - 10)]  # ZeroDivisionError at 10

    with pytest.raises(
        AssertionError,
        match=r"sliding_windows\(case 0\) raised ZeroDivisionError: integer division or "
        r"modulo by zero\n  called with: 10, 4, 2",
    ):
        grading.assert_matches_reference(sliding_windows, "sliding_windows", [(10, 4, 2)])
    with pytest.raises(AssertionError, match=r"expected ValueError, got ZeroDivisionError.*\n  called with: 10, 4, 2"):
        grading.expect_value_error(sliding_windows, 10, 4, 2)
    with pytest.raises(AssertionError, match=r"expected ValueError, nothing was raised\n  called with: 9, 4, 2"):
        grading.expect_value_error(sliding_windows, 9, 4, 2)


def test_shown_arguments_keeps_messages_short():
    shown = grading.shown_arguments(
        ([list(range(100))] * 50, [list(range(100))] * 50, torch.zeros(4, 5), torch.tensor([1, 2])), {"pad_token_id": 0}
    )
    assert (
        len(shown) <= 800 and " ..., " in shown and shown.endswith("pad_token_id=0")
    )  # long arguments cut, keywords kept
    assert grading.shown_arguments((torch.zeros(4, 5), torch.tensor([1, 2])), {"pad_token_id": 0}) == (
        "Tensor(shape=[4, 5], dtype=torch.float32), [1, 2] (Tensor, torch.int64), pad_token_id=0"
    )


def test_a_failed_checks_keywords_reach_the_feedback_page():
    """A student's page once read `... called with: [{'input_ids': [...]}, ..., {'input_id` and stopped there: the
    page cut messages at 400 characters while the checker's message, whose keywords are what a case varies, runs
    longer. One cut now governs the checker's message, nbgrader's error line (tests/test_feedback_safety.py, which
    needs nbgrader) and the page."""
    import nbformat

    from course_lib.instructor import feedback

    output = nbformat.v4.new_output("error", ename="AssertionError", evalue=long_checker_message(), traceback=[])
    cell = nbformat.v4.new_code_cell("", outputs=[output])
    assert len(output.evalue) > 400 and feedback.cell_message(cell).endswith("pad_to_multiple_of=5"), output.evalue
    endless = feedback.one_line_cut("x" * 5000)
    assert len(endless) == feedback.MAX_MESSAGE and endless.endswith(" ...")


def test_shown_arguments_name_a_tokenizer_and_keep_every_keyword():
    """A build_labels failure once read `TokenizersBackend(name_or_path='/tmp/...cour...lse, single_word=False, …})`
    and lost max_length and supervise_eos, the very arguments the failing case varied."""
    from course_lib.tokenizer import load_course_tokenizer

    chat = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"}]
    shown = grading.shown_arguments((load_course_tokenizer(), chat), {"max_length": 20, "supervise_eos": False})
    assert shown.startswith("<TokenizersBackend 'tokenizer', eos '<|im_end|>'>, "), shown
    assert "name_or_path" not in shown and "single_word" not in shown, shown
    assert shown.endswith("max_length=20, supervise_eos=False"), shown
    assert len(shown) < 450


def test_shown_arguments_tell_model_configs_apart_by_their_shape():
    """hf_config objects have no name: chapter 6's hidden cases differ in the fields kv_bytes_per_token reads."""
    from course_lib import hf_config

    shown = grading.shown_arguments((hf_config("tiny-qwen2", num_key_value_heads=1),), {"dtype_bytes": 2})
    assert shown.startswith("<Qwen2Config num_hidden_layers=") and "num_key_value_heads=1 " in shown, shown
    assert shown.endswith(", dtype_bytes=2"), shown
    assert shown != grading.shown_arguments((hf_config("tiny-qwen2"),), {"dtype_bytes": 2})


def test_the_arguments_shown_are_those_before_the_call():
    @_as_student
    def sliding_windows(length, window, stride):
        window.clear()  # a student's function that empties its input, then fails on it
        return window[0]

    with pytest.raises(AssertionError, match=r"called with: 10, \[4, 2\], 2$"):
        grading.expect_value_error(sliding_windows, 10, [4, 2], 2)


def test_an_answer_equal_to_the_derived_value_passes():
    grading.assert_answer(1645, "chunk", 1645)
    grading.assert_answer(1645.0, "chunk", 1645)
    grading.assert_answer(np.int64(1645), "chunk", 1645)  # a number is a number here; a test cell may ask for int
    grading.assert_answer(torch.tensor(1645), "chunk", 1645)  # a 0-d tensor holds its number
    grading.assert_answer(0.2489, "share", 0.249, rtol=0.01)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (..., "chunk is not answered yet"),
        (1646, "chunk = 1646 is not the value"),
        (True, "must be a number"),
        ("1645", "must be a number"),
        ([1645], "must be a number"),
        (float("nan"), "must be a finite number"),
        (float("inf"), "must be a finite number"),
    ],
)
def test_a_wrong_or_missing_answer_fails_without_showing_the_expected_value(answer, message):
    with pytest.raises(AssertionError, match=message) as failure:
        grading.assert_answer(answer, "chunk", 1645)
    assert "1645" not in str(failure.value).replace(repr(answer), "")


def test_an_answer_outside_its_tolerance_fails():
    with pytest.raises(AssertionError, match="within a relative 0.001 of"):
        grading.assert_answer(0.25, "share", 0.249, rtol=1e-3)


def test_call_as_graded_switches_the_library_off_only_while_the_todo_runs():
    """`course check`'s rule: a TODO that delegates to course_lib fails, the student's own code runs, the library
    works again between calls, and a name that is not a TODO's counterpart is left alone."""

    def borrowed(length, window=256, overlap=64):
        return course_lib.sliding_windows(length, window, overlap)

    def own(a, b):
        return a + b

    namespace = {"windows": borrowed, "sliding_windows": borrowed, "block_causal_mask": own, "x": 3}
    grading.call_as_graded(namespace, ["sliding_windows", "block_causal_mask", "x", "unbound"])
    grading.call_as_graded(namespace, ["sliding_windows"])  # twice: wrapped once
    with pytest.raises(AssertionError, match="this calls course_lib.sliding_windows"):
        namespace["sliding_windows"](600)
    assert len(namespace["windows"](600)) == 3  # the library works again after the call
    assert namespace["block_causal_mask"](2, 3) == 5 and namespace["block_causal_mask"].__name__ == "own"
    assert namespace["sliding_windows"].__wrapped__ is borrowed and namespace["x"] == 3 and "unbound" not in namespace
    assert namespace["windows"] is borrowed  # not a TODO name: untouched


def test_a_list_of_the_wrong_length_is_named_by_len_and_shown():
    """`sliding_windows(case 188): length 2 != expected 3` read as the function's `length` argument; the message now
    says len(...) and quotes both lists, cut where they are long."""
    with pytest.raises(AssertionError) as short:
        grading.assert_same([(0, 4), (2, 6)], [(0, 4), (2, 6), (4, 7)], path="sliding_windows(case 188)")
    assert str(short.value) == (
        "len(sliding_windows(case 188)) = 2 != expected 3: got [(0, 4), (2, 6)], expected [(0, 4), (2, 6), (4, 7)]"
    )
    with pytest.raises(AssertionError) as long:
        grading.assert_same(list(range(500)), list(range(501)), path="f(case 1)")
    assert str(long.value).count(" ...") == 2 and len(str(long.value)) < 400


def test_a_curriculum_stages_three_dicts_are_shown_whole():
    """`evaluate_length_curriculum_stage(case 168)` once showed its limits cut at `'max_failed_runs ...`, the very
    limit a student needed to see which gate should have held the stage."""
    baseline = {"long_context_score": 0.56, "short_context_score": 0.82, "supervised_tokens_per_optimizer_step": 8192}
    run = {
        **baseline,
        "long_context_score": 0.63,
        "loss_finite": True,
        "gradients_finite": True,
        "failed_runs": 0,
        "peak_memory_gb": 10.500000000001,
        "cost_per_supervised_token": 1.25,
    }
    limits = {
        "min_long_context_gain": 0.04,
        "max_short_context_regression": 0.02,
        "max_failed_runs": 0,
        "max_peak_memory_gb": 10.5,
        "max_cost_per_supervised_token": 1.4,
    }
    shown = grading.shown_arguments((baseline, run, limits), {})
    assert shown.endswith("'max_peak_memory_gb': 10.5, 'max_cost_per_supervised_token': 1.4}"), shown  # as passed
    failure = "evaluate_length_curriculum_stage(case 168)['decision']: 'advance' != expected 'hold'"
    from course_lib.instructor import feedback

    message = f"{failure}\n  called with: {shown}"
    assert feedback.one_line_cut(message) == message


def test_a_wrong_element_of_a_short_list_shows_both_whole_lists():
    """`allocate_group_sizes(case 67)[1]: 0 != expected 7` told a student one index; the message now quotes both
    whole results when they are short lists, and nothing more for long ones or tensors."""

    def allocate_group_sizes(pass_rates, budget):
        return [budget, *([0] * (len(pass_rates) - 1))]  # every rollout on the first task

    allocate_group_sizes.__module__ = "__main__"
    with pytest.raises(AssertionError) as failed:
        grading.assert_matches_reference(allocate_group_sizes, "allocate_group_sizes", [(([0.5, 0.5, 0.5], 6), {})])
    assert str(failed.value) == (
        "allocate_group_sizes(case 0)[0]: 6 != expected 3\n  called with: [0.5, 0.5, 0.5], 6\n"
        "  whole result: got [6, 0, 0], expected [3, 3, 0]"
    )
    error = AssertionError("f(case 0)[3]: 1 != expected 2")
    assert grading.whole_results("f(case 0)", error, list(range(100)), list(range(100))) == ""  # too long
    assert grading.whole_results("f(case 0)", error, torch.ones(3), torch.zeros(3)) == ""  # a tensor
    assert grading.whole_results("f(case 0)", AssertionError("f(case 0): 1 != expected 2"), [1], [2]) == ""


def test_shown_arguments_show_a_dicts_tensors_and_a_function_without_its_address():
    """A leak_report failure once read `<function _t_checks.<locals>.<lambda> at 0x7f7e...>, {'ids': tensor([[1565,
    … 1...70, 1518, …`: a memory address and a tensor cut mid-number. A dict's values now follow the same rules as
    arguments (a large tensor by shape and dtype) and a function shows its name only."""

    def _t_checks():
        return lambda ids: ids

    batch = {"ids": torch.arange(40).reshape(2, 20), "position_ids": torch.tensor([0, 1, 2])}
    assert grading.shown_arguments((_t_checks(), batch), {"tol": 1e-4}) == (
        "<function test_shown_arguments_show_a_dicts_tensors_and_a_function_without_its_address > _t_checks > "
        "<lambda>>, {'ids': Tensor(shape=[2, 20], dtype=torch.int64), "
        "'position_ids': [0, 1, 2] (Tensor, torch.int64)}, tol=0.0001"
    )


def test_a_long_failure_is_cut_before_the_calls_keywords_are():
    """A wrong-length failure quotes both lists (up to ~376 characters) and the call may take 800: together they
    passed the grader's 1,000-character cut, which fell on the keywords. with_call cuts the failure instead."""
    from course_lib.instructor import feedback

    assert grading.MESSAGE_LIMIT == feedback.MAX_MESSAGE
    rows = [{"input_ids": list(range(40 + row)), "labels": list(range(40 + row))} for row in range(12)]
    shown = grading.shown_arguments((rows, 0), {"pad_to_multiple_of": 5})
    with pytest.raises(AssertionError) as wrong_length:
        grading.assert_same([list(range(60))] * 2, [list(range(60))] * 3, path="pad_batch(case 7)['input_ids']")
    assert len(str(wrong_length.value)) + len(shown) > feedback.MAX_MESSAGE  # the case that used to lose them
    message = grading.with_call(str(wrong_length.value), shown)
    assert feedback.one_line_cut(message) == message and message.endswith("pad_to_multiple_of=5"), message
    assert message.startswith("len(pad_batch(case 7)['input_ids']) = 2 != expected 3")


def test_shown_arguments_stop_at_a_dict_inside_a_dict():
    loop: dict = {"k": 1}
    loop["self"] = loop
    shown = grading.shown_arguments((loop,), {})
    assert shown.startswith("{'k': 1, 'self': {'k': 1, 'self': {") and len(shown) < 200, shown
