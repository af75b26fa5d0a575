"""Wrong answers for chapter 2 (chat templates and label masks): the LlamaFactory walkthrough's classic bugs and
their cousins."""

from tests.mutants import mutate

CHAPTER = "02_templates_and_labels"

_BUILD = """
def build_labels(tokenizer, messages, *, supervise_eos=True, max_length=None, chat_template=None):
    if max_length is not None:
        max_length = CHECKED_MAX_LENGTH
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    input_ids, roles = rendered["input_ids"], rendered["roles"]
    kept = SUPERVISED
    labels = LABELS
    if max_length is not None:
        input_ids, labels = CUT
    return {"input_ids": input_ids, "labels": labels}
"""


def _build(
    labels="[i if r in kept else IGNORE_INDEX for i, r in zip(input_ids, roles)]",
    supervised='("assistant", "eos") if supervise_eos else ("assistant",)',
    cut="input_ids[:max_length], labels[:max_length]",
    checked='require_positive_int("max_length", max_length)',
):
    return (
        _BUILD.replace("LABELS", labels)
        .replace("SUPERVISED", supervised)
        .replace("CUT", cut)
        .replace("CHECKED_MAX_LENGTH", checked)
    )


_PAD = """
def pad_batch(features, pad_token_id, *, pad_to_multiple_of=None):
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    multiple = 1 if pad_to_multiple_of is None else require_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    if not len(features):
        raise ValueError("features must be a non-empty list")
    rows = []
    for index, feature in enumerate(features):
        require_keys(f"features[{index}]", feature, ("input_ids", "labels"))
        ids = [int(token_id) for token_id in feature["input_ids"]]
        labels = [int(label) for label in feature["labels"]]
        if LENGTH_CHECK:
            raise ValueError(f"features[{index}]: input_ids and labels differ in length")
        if not ids:
            raise ValueError(f"features[{index}] has empty input_ids")
        rows.append((ids, labels))
    width = -(-max(len(ids) for ids, _ in rows) // multiple) * multiple
    batch = {"input_ids": [], "labels": [], "attention_mask": []}
    for ids, labels in rows:
        fill = width - len(ids)
        batch["input_ids"].append(PAD_IDS)
        batch["labels"].append(PAD_LABELS)
        batch["attention_mask"].append(MASK)
    return {key: torch.tensor(value, dtype=torch.long) for key, value in batch.items()}
"""


def _pad(
    ids="ids + [pad_token_id] * fill",
    labels="labels + [IGNORE_INDEX] * fill",
    mask="[1] * len(ids) + [0] * fill",
    length_check="len(ids) != len(labels)",
):
    return (
        _PAD.replace("PAD_IDS", ids)
        .replace("PAD_LABELS", labels)
        .replace("MASK", mask)
        .replace("LENGTH_CHECK", length_check)
    )


MUTANTS = {
    "build_labels": {
        # LlamaFactory walkthrough: the single-turn habit masks only what comes before the first answer, so later
        # user turns and role headers are trained on (the model learns to echo its users).
        "user_turns_supervised": _build(
            labels='[IGNORE_INDEX] * roles.index("assistant") + input_ids[roles.index("assistant"):]'
        ),
        # The end-of-turn token never carries loss, whatever supervise_eos says: the model never learns to stop.
        "eos_never_supervised": _build(supervised='("assistant",)'),
        # LlamaFactory walkthrough: max_length cuts input_ids but the labels stay long.
        "labels_not_truncated": _build(cut="input_ids[:max_length], labels"),
        # Truncation keeps the end of the sequence instead of its beginning.
        "truncated_from_the_left": _build(cut="input_ids[-max_length:], labels[-max_length:]"),
        # Labels shifted by hand although the model shifts them itself: every target is off by one.
        "labels_pre_shifted": _build(
            labels="[i if r in kept else IGNORE_INDEX for i, r in zip(input_ids, roles)][1:] + [IGNORE_INDEX]"
        ),
        # Everything but system and user supervised: role headers and separators become targets.
        "template_tokens_supervised": _build(
            labels='[IGNORE_INDEX if r in ("system", "user") else i for i, r in zip(input_ids, roles)]'
        ),
        # max_length is used without a check: 0 gives an empty sample instead of an error.
        "max_length_unchecked": _build(checked="max_length"),
    },
    "pad_batch": {
        # LlamaFactory walkthrough: labels padded with the pad id, so padding becomes a target.
        "pad_id_in_labels": _pad(labels="labels + [pad_token_id] * fill"),
        # Left padding: the right thing for generation, the wrong contract for this collator.
        "left_padding": _pad(
            ids="[pad_token_id] * fill + ids",
            labels="[IGNORE_INDEX] * fill + labels",
            mask="[0] * fill + [1] * len(ids)",
        ),
        # Attention mask from the ids: every real token equal to the pad id (pad = eos) is hidden.
        "attention_mask_from_pad_id": _pad(mask="[int(i != pad_token_id) for i in ids + [pad_token_id] * fill]"),
        # The two masks confused: attention only where the labels are supervised.
        "attention_mask_from_labels": _pad(mask="[int(label != IGNORE_INDEX) for label in labels] + [0] * fill"),
        # No length check: a feature whose labels were not truncated with its inputs goes through.
        "no_length_check": _pad(length_check="False"),
    },
}

# Wrong answers a review of the grading found keeping full points (before the grader compared types and checked
# that arguments are left unchanged, and the hidden tests gained the cases that catch them).

_PAD_TARGET = "course_lib.labels.pad_batch"
_RETURN = '    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}'
MUTANTS["pad_batch"].update(
    {
        # Writes the padded rows back into the caller's features: a second call on them sees no padding at all.
        "pads_the_callers_features": mutate(
            _PAD_TARGET,
            (
                _RETURN,
                "    for feature, id_row, label_row in zip(features, input_ids, labels, strict=True):\n"
                '        feature["input_ids"], feature["labels"] = id_row.tolist(), label_row.tolist()\n' + _RETURN,
            ),
        ),
    }
)
# Correct answers that differ from the library's code: each must keep every point. This one builds each row with
# torch.tensor (which warns when a feature already holds a tensor) and pads with pad_sequence; through nbgrader the
# warning once cost it the whole cell (stderr), now dropped before grading (notebooks/nbgrader_config.py).
ALTERNATIVES = {
    "pad_batch": {
        "tensor_rows_and_pad_sequence": """
import torch
from torch.nn.utils.rnn import pad_sequence


def _as_long(name, values):
    row = torch.tensor(values)
    if row.dtype == torch.bool or row.is_floating_point() or row.is_complex() or row.dim() != 1:
        raise ValueError(f"{name} must be one row of integers, got {row.dtype} of shape {tuple(row.shape)}")
    return row.long()


def pad_batch(features, pad_token_id, *, pad_to_multiple_of=None):
    require_int("pad_token_id", pad_token_id, minimum=0)
    if pad_to_multiple_of is not None:
        require_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    if len(features) == 0:
        raise ValueError("features must not be empty")
    ids, labels = [], []
    for feature in features:
        require_keys("feature", feature, ("input_ids", "labels"))
        row_ids, row_labels = _as_long("input_ids", feature["input_ids"]), _as_long("labels", feature["labels"])
        if len(row_ids) != len(row_labels) or len(row_ids) == 0:
            raise ValueError("input_ids and labels must be non-empty and of one length")
        ids.append(row_ids)
        labels.append(row_labels)
    if pad_to_multiple_of is not None:  # a zero-length row of the rounded width sets pad_sequence's width
        width = -(-max(len(row) for row in ids) // pad_to_multiple_of) * pad_to_multiple_of
        ids, labels = ids + [torch.zeros(width, dtype=torch.long)], labels + [torch.zeros(width, dtype=torch.long)]
    masks = [torch.ones(len(row), dtype=torch.long) for row in ids]
    batch = {"input_ids": pad_sequence(ids, batch_first=True, padding_value=pad_token_id),
             "labels": pad_sequence(labels, batch_first=True, padding_value=IGNORE_INDEX),
             "attention_mask": pad_sequence(masks, batch_first=True, padding_value=0)}
    rows = len(features)
    return {key: value[:rows] for key, value in batch.items()}
""",
    },
}

# Wrong answers a second review tried on the edges (masks from token values, whole floats, ignored arguments).
MUTANTS["build_labels"].update(
    {
        # Supervision decided by token value: any token whose id also occurs in an answer is supervised, a user turn's
        # word or end-of-turn token included.
        "supervision_by_token_value": _build(
            labels="[i if i in {j for j, r in zip(input_ids, roles) if r in kept} else IGNORE_INDEX for i in input_ids]"
        ),
        # max_length read as padding="max_length": short samples are padded up to it instead of left alone.
        "pads_up_to_max_length": _build(
            cut="(input_ids + [0] * (max_length - len(input_ids)))[:max_length], "
            "(labels + [IGNORE_INDEX] * (max_length - len(labels)))[:max_length]"
        ),
    }
)
MUTANTS["pad_batch"].update(
    {
        # The rounding adds a whole extra multiple when the width is already one (8 -> 16 for m = 8).
        "round_adds_a_full_multiple": mutate(
            _PAD_TARGET,
            (
                "extra = -input_ids.shape[1] % pad_to_multiple_of",
                "extra = pad_to_multiple_of - input_ids.shape[1] % pad_to_multiple_of",
            ),
        ),
        # Pads input_ids with 0 whatever pad_token_id says.
        "pad_token_id_ignored": mutate(
            _PAD_TARGET, ("batch_first=True, padding_value=pad_token_id)", "batch_first=True, padding_value=0)")
        ),
        # The width taken from the first feature, as if the features came sorted longest first.
        "width_of_the_first_feature": mutate(
            _PAD_TARGET,
            (
                "    attention_mask = (torch.arange(input_ids.shape[1])",
                "    input_ids, labels = input_ids[:, :len(id_rows[0])], labels[:, :len(id_rows[0])]\n"
                "    attention_mask = (torch.arange(input_ids.shape[1])",
            ),
        ),
    }
)
MUTANTS["build_labels"].update(
    {
        # Tidies the caller's messages in place (strips every content) before rendering.
        "strips_the_callers_messages": _build().replace(
            "    rendered = render_chat(",
            "    for message in messages:\n"
            '        message["content"] = message["content"].strip()\n'
            "    rendered = render_chat(",
        ),
    }
)
MUTANTS["pad_batch"].update(
    {
        # Attention where the id is not the pad id or the label is supervised: a real prompt token that carries the pad
        # id (and label -100) is hidden.
        "attention_mask_from_ids_or_labels": mutate(
            _PAD_TARGET,
            (
                "attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()",
                "attention_mask = ((input_ids != pad_token_id) | (labels != IGNORE_INDEX)).long()",
            ),
        ),
    }
)

# More correct answers written differently (pure Python, torch, numpy; other check orders and messages).
ALTERNATIVES["build_labels"] = {
    # Plain Python lists; max_length checked before supervise_eos.
    "plain_lists": """
from course_lib import IGNORE_INDEX, render_chat
from course_lib._checks import require_bool, require_positive_int


def build_labels(tokenizer, messages, *, supervise_eos=True, max_length=None, chat_template=None):
    if max_length is not None:
        max_length = require_positive_int("max_length", max_length)
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    keep = {"assistant", "eos"} if supervise_eos else {"assistant"}
    input_ids = [int(token) for token in rendered["input_ids"]]
    labels = [token if role in keep else IGNORE_INDEX for token, role in zip(input_ids, rendered["roles"], strict=True)]
    if max_length is not None:
        input_ids, labels = input_ids[:max_length], labels[:max_length]
    return {"input_ids": input_ids, "labels": labels}
""",
    # torch.where on tensors, own checks with other messages, rendering first.
    "torch_where_own_checks": """
import torch

from course_lib import render_chat

IGNORE = -100


def build_labels(tokenizer, messages, *, supervise_eos=True, max_length=None, chat_template=None):
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    if not isinstance(supervise_eos, bool):
        raise ValueError(f"supervise_eos should be a bool, not {type(supervise_eos).__name__}")
    if max_length is not None and (type(max_length) is not int or max_length < 1):
        raise ValueError(f"max_length should be a positive int or None, got {max_length!r}")
    ids = torch.tensor(rendered["input_ids"], dtype=torch.long)
    wanted = ("assistant", "eos") if supervise_eos else ("assistant",)
    supervised = torch.tensor([role in wanted for role in rendered["roles"]], dtype=torch.bool)
    labels = torch.where(supervised, ids, torch.full_like(ids, IGNORE))
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids.tolist(), "labels": labels.tolist()}
""",
    # A loop that stops at max_length (itertools.islice), labels appended one by one.
    "islice_loop": """
from itertools import islice

from course_lib import IGNORE_INDEX, render_chat
from course_lib._checks import require_bool, require_positive_int


def build_labels(tokenizer, messages, *, supervise_eos=True, max_length=None, chat_template=None):
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    limit = None if max_length is None else require_positive_int("max_length", max_length)
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    input_ids, labels = [], []
    for token, role in islice(zip(rendered["input_ids"], rendered["roles"], strict=True), limit):
        input_ids.append(int(token))
        if role == "assistant" or (supervise_eos and role == "eos"):
            labels.append(int(token))
        else:
            labels.append(IGNORE_INDEX)
    return {"input_ids": input_ids, "labels": labels}
""",
}
ALTERNATIVES["pad_batch"].update(
    {
        # Plain Python rows checked element by element, padded as lists, one torch.tensor per key at the end.
        "python_lists_then_tensor": """
from numbers import Integral

import torch

from course_lib import IGNORE_INDEX


def _ints(what, values):
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise ValueError(f"{what} must hold integers, found {value!r}")
    return [int(value) for value in values]


def pad_batch(features, pad_token_id, *, pad_to_multiple_of=None):
    if not features:
        raise ValueError("pad_batch needs at least one feature")
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, Integral) or pad_token_id < 0:
        raise ValueError(f"pad_token_id must be an integer >= 0, got {pad_token_id!r}")
    multiple = 1 if pad_to_multiple_of is None else pad_to_multiple_of
    if isinstance(multiple, bool) or not isinstance(multiple, Integral) or multiple < 1:
        raise ValueError(f"pad_to_multiple_of must be None or an integer >= 1, got {pad_to_multiple_of!r}")
    rows = []
    for number, feature in enumerate(features):
        if "input_ids" not in feature or "labels" not in feature:
            raise ValueError(f"feature {number} needs both input_ids and labels")
        ids, labels = _ints(f"feature {number} input_ids", feature["input_ids"]), _ints(
            f"feature {number} labels", feature["labels"])
        if len(ids) != len(labels):
            raise ValueError(f"feature {number}: {len(ids)} input_ids but {len(labels)} labels")
        if not ids:
            raise ValueError(f"feature {number} is empty")
        rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    width += (multiple - width % multiple) % multiple
    return {
        "input_ids": torch.tensor([ids + [pad_token_id] * (width - len(ids)) for ids, _ in rows], dtype=torch.long),
        "labels": torch.tensor([labels + [IGNORE_INDEX] * (width - len(labels)) for _, labels in rows],
                               dtype=torch.long),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows],
                                       dtype=torch.long),
    }
""",
        # torch.full then row slices filled in place (the new tensors, not the caller's lists).
        "full_then_fill": """
import math

import torch

from course_lib import IGNORE_INDEX
from course_lib._checks import require_int, require_keys, require_positive_int, require_tensor


def pad_batch(features, pad_token_id, *, pad_to_multiple_of=None):
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    if pad_to_multiple_of is not None:
        pad_to_multiple_of = require_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    if len(features) == 0:
        raise ValueError("features is empty")
    rows = []
    for index, feature in enumerate(features):
        require_keys(f"features[{index}]", feature, ("input_ids", "labels"))
        ids = require_tensor("input_ids", feature["input_ids"], ndim=1, dtype_kind="i")
        labels = require_tensor("labels", feature["labels"], ndim=1, dtype_kind="i")
        if ids.numel() == 0 or ids.numel() != labels.numel():
            raise ValueError(f"features[{index}]: {ids.numel()} ids and {labels.numel()} labels")
        rows.append((ids, labels))
    batch, width = len(rows), max(len(ids) for ids, _ in rows)
    if pad_to_multiple_of is not None:
        width = math.ceil(width / pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    for row, (ids, row_labels) in enumerate(rows):
        input_ids[row, :len(ids)] = ids
        labels[row, :len(ids)] = row_labels
        attention_mask[row, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
""",
        # numpy arrays padded with np.full, handed to torch with torch.from_numpy.
        "numpy_full": """
import numpy as np
import torch

IGNORE = -100


def pad_batch(features, pad_token_id, *, pad_to_multiple_of=None):
    if type(pad_token_id) is bool or not isinstance(pad_token_id, (int, np.integer)) or pad_token_id < 0:
        raise ValueError(f"bad pad_token_id {pad_token_id!r}: need an integer >= 0")
    if pad_to_multiple_of is not None and (type(pad_to_multiple_of) is bool
                                           or not isinstance(pad_to_multiple_of, (int, np.integer))
                                           or pad_to_multiple_of < 1):
        raise ValueError(f"bad pad_to_multiple_of {pad_to_multiple_of!r}: need None or an integer >= 1")
    if len(features) == 0:
        raise ValueError("no features to pad")
    arrays = []
    for feature in features:
        try:
            ids, labels = np.asarray(feature["input_ids"]), np.asarray(feature["labels"])
        except KeyError as missing:
            raise ValueError(f"a feature has no {missing}") from None
        if ids.dtype.kind not in "iu" or labels.dtype.kind not in "iu":
            raise ValueError(f"input_ids and labels must be integer arrays, got {ids.dtype} and {labels.dtype}")
        if ids.shape != labels.shape or ids.ndim != 1 or len(ids) == 0:
            raise ValueError(f"input_ids {ids.shape} and labels {labels.shape} must be one non-empty length")
        arrays.append((ids, labels))
    width = max(len(ids) for ids, _ in arrays)
    if pad_to_multiple_of is not None:
        width = int(np.ceil(width / pad_to_multiple_of)) * int(pad_to_multiple_of)
    out_ids = np.full((len(arrays), width), pad_token_id, dtype=np.int64)
    out_labels = np.full((len(arrays), width), IGNORE, dtype=np.int64)
    out_mask = np.zeros((len(arrays), width), dtype=np.int64)
    for row, (ids, labels) in enumerate(arrays):
        out_ids[row, :len(ids)], out_labels[row, :len(ids)], out_mask[row, :len(ids)] = ids, labels, 1
    return {"input_ids": torch.from_numpy(out_ids), "labels": torch.from_numpy(out_labels),
            "attention_mask": torch.from_numpy(out_mask)}
""",
    }
)
ALTERNATIVES["pad_batch"].update(
    {
        # A helper named _pad: the graded cell once had a global of that name, which replaced the student's helper.
        "helper_named_pad": """
import torch

from course_lib import IGNORE_INDEX
from course_lib._checks import require_int, require_keys, require_positive_int, require_tensor


def _pad(row, width, value):
    return torch.cat([row, torch.full((width - len(row),), value, dtype=torch.long)])


def pad_batch(features, pad_token_id, *, pad_to_multiple_of=None):
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    step = 1 if pad_to_multiple_of is None else require_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    if len(features) == 0:
        raise ValueError("features must not be empty")
    rows = []
    for index, feature in enumerate(features):
        require_keys(f"features[{index}]", feature, ("input_ids", "labels"))
        ids = require_tensor("input_ids", feature["input_ids"], ndim=1, dtype_kind="i").long()
        labels = require_tensor("labels", feature["labels"], ndim=1, dtype_kind="i").long()
        if len(ids) == 0 or len(ids) != len(labels):
            raise ValueError(f"features[{index}]: {len(ids)} ids and {len(labels)} labels")
        rows.append((ids, labels))
    width = max(len(ids) for ids, _ in rows)
    while width % step:
        width += 1
    return {"input_ids": torch.stack([_pad(ids, width, pad_token_id) for ids, _ in rows]),
            "labels": torch.stack([_pad(labels, width, IGNORE_INDEX) for _, labels in rows]),
            "attention_mask": torch.stack([_pad(torch.ones(len(ids), dtype=torch.long), width, 0) for ids, _ in rows])}
""",
    }
)

# Any integer sequences are ids and labels (issue 31): the library's answer as tuples, and as numpy arrays.
for _name, _wrap in {
    "tuples": "tuple(values)",
    "numpy_arrays": "np.asarray(values, dtype=np.int64)",
}.items():
    ALTERNATIVES["build_labels"][_name] = mutate(
        "course_lib.labels.build_labels", ("def build_labels(", "def _build_labels_as_lists(")
    ) + (
        "\n\nimport numpy as np\n\n\ndef build_labels(*args, **kwargs):\n"
        "    built = _build_labels_as_lists(*args, **kwargs)\n"
        f"    return {{key: {_wrap} for key, values in built.items()}}\n"
    )
