"""Wrong answers for chapter 1 (length ledger and window policy)."""

from tests.mutants import mutate

CHAPTER = "01_length_ledger"

_AUDIT = "course_lib.window.audit_context_fit"
_AVAILABLE = "available = max(0, target - template - prompt)"


_LEDGER = """
def ledger_from_roles(roles, *, supervise_eos=True):
    allowed = ("template", "system", "user", "assistant", "eos")
    for role in roles:
        if role not in allowed:
            raise ValueError(f"roles must be among {allowed}, got {role!r}")
    prompt = sum(role in PROMPT_ROLES for role in roles)
    supervised = sum(role == "assistant" for role in roles) + (EOS_COUNT)
    total = TOTAL
    return {"template_tokens": total - prompt - supervised, "prompt_tokens": prompt,
            "supervised_tokens": supervised, "total_tokens": total}
"""


def _ledger(
    prompt_roles='("system", "user")',
    eos='sum(role == "eos" for role in roles) if supervise_eos else 0',
    total="len(roles)",
):
    return _LEDGER.replace("PROMPT_ROLES", prompt_roles).replace("EOS_COUNT", eos).replace("TOTAL", total)


MUTANTS = {
    "audit_context_fit": {
        # `<` for `<=` at the window edge: a sample of exactly C tokens is treated as too long.
        "strict_window_edge": mutate(_AUDIT, (_AVAILABLE, "available = max(0, target - template - prompt - 1)")),
        # The template's tokens are forgotten: the prompt alone is charged against the window.
        "ignores_template_tokens": mutate(_AUDIT, (_AVAILABLE, "available = max(0, target - prompt)")),
        # Only the minimum-kept gate: any loss ratio is admitted.
        "one_gate_only": mutate(
            _AUDIT, ("elif kept >= min_kept and loss_ratio <= max_ratio:", "elif kept >= min_kept:")
        ),
        # An overflow still reports the tokens it would have kept.
        "kept_reported_on_overflow": mutate(_AUDIT, ('decision, kept = "overflow", 0', 'decision = "overflow"')),
        # A wrong answer that rebinds the library's names to itself, so a naive reference would be itself.
        "rebinds_the_library": mutate(_AUDIT, (_AVAILABLE, "available = max(0, target - prompt)"))
        + """
import course_lib
import course_lib.window
course_lib.audit_context_fit = audit_context_fit
course_lib.window.audit_context_fit = audit_context_fit
""",
    },
    "ledger_from_roles": {
        # The end-of-turn token is never supervised, whatever supervise_eos says.
        "eos_never_supervised": _ledger(eos="0"),
        # The end-of-turn token is always supervised, whatever supervise_eos says.
        "eos_always_supervised": _ledger(eos='sum(role == "eos" for role in roles)'),
        # System prompt tokens counted as template.
        "system_counted_as_template": _ledger(prompt_roles='("user",)'),
        # Total counted from content tokens only: the template's own tokens vanish from the window.
        "template_tokens_dropped": _ledger(total='sum(role != "template" for role in roles)'),
    },
}

# Wrong answers a review of the grading found keeping full points (before the grader compared types and the
# chapter's hidden tests gained the cases that catch them). The input checks are given to the student, so the
# catalogue holds mistakes in the mechanism below them.
_LEDGER_TARGET = "course_lib.ledger.ledger_from_roles"
MUTANTS["ledger_from_roles"].update(
    {
        # One end-of-turn token per sample assumed: a multi-turn chat's later answers lose their EOS.
        "eos_counted_once": mutate(
            _LEDGER_TARGET, ('eos = int((role_array == "eos").sum())', 'eos = int("eos" in role_array.tolist())')
        ),
    }
)
MUTANTS["audit_context_fit"].update(
    {
        # LCFT's literal formula: a whole sample below the minimum is called "fit" but reports 0 kept tokens.
        "lcft_formula_fit_below_minimum": mutate(
            _AUDIT,
            (
                '            decision = "fit"\n',
                '            decision = "fit"\n            kept = kept if kept >= min_kept else 0\n',
            ),
        ),
        # Records kept in a dict keyed by name: two samples with one name become one record.
        "records_keyed_by_name": mutate(
            _AUDIT,
            (
                '    return {\n        "records": records,',
                '    records = list({r["name"]: r for r in records}.values())\n'
                '    return {\n        "records": records,',
            ),
        ),
        # A "sensible" default of 32 kept tokens instead of the signature's 1.
        "default_min_kept_32": mutate(
            _AUDIT, ("min_kept_supervised_tokens: int = 1", "min_kept_supervised_tokens: int = 32")
        ),
        # The gates read as strict: a cut that keeps exactly the minimum, or loses exactly the allowed share, fails.
        "strict_gates": mutate(
            _AUDIT,
            ("elif kept >= min_kept and loss_ratio <= max_ratio:", "elif kept > min_kept and loss_ratio < max_ratio:"),
        ),
        # An overflow records the whole supervision as lost (1.0), not the ratio of the cut the gates refused.
        "overflow_ratio_one": mutate(
            _AUDIT, ('decision, kept = "overflow", 0', 'decision, kept, loss_ratio = "overflow", 0, 1.0')
        ),
        # The room left for supervision may go negative: a prompt past the window "keeps" a negative count.
        "negative_room": mutate(_AUDIT, (_AVAILABLE, "available = target - template - prompt")),
    }
)

# The demo's wrong answer for this chapter (scripts/demo_wrong_answers.json), written out in full as a student
# would: the given checks kept, then the window read as an admission filter. A sample either fits whole or is
# dropped; no sample is ever cut, so every truncation the gates allow becomes an overflow.
MUTANTS["audit_context_fit"]["all_or_nothing_window"] = """from typing import Any
from course_lib.window import ContextAudit
from collections.abc import Mapping
from collections.abc import Sequence
from course_lib._checks import require_nonnegative_int
from course_lib._checks import require_positive_int
from course_lib._checks import require_ratio
from course_lib.window import require_ledger_rows


def audit_context_fit(
    samples: Sequence[Mapping[str, Any]],
    target_context_len: int,
    template_tokens: int,
    min_kept_supervised_tokens: int = 1,
    max_supervision_loss_ratio: float = 0.0,
) -> ContextAudit:
    target = require_positive_int("target_context_len", target_context_len)
    min_kept = require_positive_int("min_kept_supervised_tokens", min_kept_supervised_tokens)
    max_ratio = require_ratio("max_supervision_loss_ratio", max_supervision_loss_ratio)
    template = require_nonnegative_int("template_tokens", template_tokens)
    rows = require_ledger_rows("samples", samples)
    records = []
    for sample in rows:
        total = template + sample["prompt_tokens"] + sample["supervised_tokens"]
        fits = total <= target
        records.append(
            {
                "name": sample["name"],
                "total_tokens": total,
                "kept_supervised_tokens": sample["supervised_tokens"] if fits else 0,
                "cut_loss_ratio": 0.0 if fits else 1.0,
                "decision": "fit" if fits else "overflow",
            }
        )
    return {
        "records": records,
        "fit_names": [r["name"] for r in records if r["decision"] == "fit"],
        "truncated_names": [],
        "overflow_names": [r["name"] for r in records if r["decision"] == "overflow"],
    }
"""

# Correct answers that differ from the library's code: each must keep every point (the grader must not be stricter
# than the TODO text).
ALTERNATIVES = {
    "ledger_from_roles": {
        # A Counter filled in a plain loop; supervise_eos checked first, with require_bool.
        "counter_loop": """
from collections import Counter

from course_lib._checks import require_bool


def ledger_from_roles(roles, *, supervise_eos=True):
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    allowed = {"template", "system", "user", "assistant", "eos"}
    counts = Counter()
    for role in roles:
        if role not in allowed:
            raise ValueError(f"unknown role {role!r}")
        counts[role] += 1
    prompt = counts["system"] + counts["user"]
    supervised = counts["assistant"] + (counts["eos"] if supervise_eos else 0)
    total = sum(counts.values())
    return {"template_tokens": total - prompt - supervised, "prompt_tokens": prompt,
            "supervised_tokens": supervised, "total_tokens": total}
""",
        # if/elif counting; the roles checked before supervise_eos, which is checked by hand (type is bool).
        "elif_chain_own_bool_check": """
def ledger_from_roles(roles, *, supervise_eos=True):
    template = prompt = supervised = 0
    for role in roles:
        if role == "template":
            template += 1
        elif role in ("system", "user"):
            prompt += 1
        elif role == "assistant":
            supervised += 1
        elif role == "eos":
            if supervise_eos is True:
                supervised += 1
            else:
                template += 1
        else:
            raise ValueError(f"bad role: {role!r}")
    if type(supervise_eos) is not bool:
        raise ValueError(f"supervise_eos must be True or False, not {supervise_eos!r}")
    return {"template_tokens": template, "prompt_tokens": prompt, "supervised_tokens": supervised,
            "total_tokens": template + prompt + supervised}
""",
        # numpy: np.unique counts, converted with int().
        "numpy_unique_counts": """
import numpy as np

from course_lib._checks import require_bool


def ledger_from_roles(roles, *, supervise_eos=True):
    names, counts = np.unique(np.array(list(roles), dtype=object), return_counts=True)
    found = dict(zip(names.tolist(), counts.tolist(), strict=True))
    for name in found:
        if name not in ("template", "system", "user", "assistant", "eos"):
            raise ValueError(f"role {name!r} is not one of template, system, user, assistant, eos")
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    total = int(sum(found.values()))
    prompt = int(found.get("system", 0) + found.get("user", 0))
    supervised = int(found.get("assistant", 0) + (found.get("eos", 0) if supervise_eos else 0))
    return {"template_tokens": total - prompt - supervised, "prompt_tokens": prompt,
            "supervised_tokens": supervised, "total_tokens": total}
""",
    },
    "audit_context_fit": {
        # Own checks with numbers.Integral / numbers.Real; the ratio as 1 - kept / supervised; names built in the loop.
        "own_checks_one_minus_kept_share": """
import math
from numbers import Integral, Real


def _integer(name, value, smallest):
    if isinstance(value, bool) or not isinstance(value, Integral) or value < smallest:
        raise ValueError(f"{name} must be an integer >= {smallest}, got {value!r}")
    return int(value)


def audit_context_fit(samples, target_context_len, template_tokens, min_kept_supervised_tokens=1,
                      max_supervision_loss_ratio=0.0):
    window = _integer("target_context_len", target_context_len, 1)
    template = _integer("template_tokens", template_tokens, 0)
    minimum = _integer("min_kept_supervised_tokens", min_kept_supervised_tokens, 1)
    ratio = max_supervision_loss_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, Real) or math.isnan(ratio) or not 0 <= ratio <= 1:
        raise ValueError(f"max_supervision_loss_ratio must be a number in [0, 1], got {ratio!r}")
    plan = {"records": [], "fit_names": [], "truncated_names": [], "overflow_names": []}
    for sample in samples:
        for key in ("name", "prompt_tokens", "supervised_tokens"):
            if key not in sample:
                raise ValueError(f"sample {sample!r} has no {key!r}")
        prompt = _integer("prompt_tokens", sample["prompt_tokens"], 0)
        supervised = _integer("supervised_tokens", sample["supervised_tokens"], 1)
        kept = min(supervised, max(0, window - template - prompt))
        loss = 1 - kept / supervised
        if kept == supervised:
            decision = "fit"
        elif kept >= minimum and loss <= ratio:
            decision = "truncate"
        else:
            decision = "overflow"
        plan[{"fit": "fit_names", "truncate": "truncated_names", "overflow": "overflow_names"}[decision]].append(
            sample["name"])
        plan["records"].append({"name": sample["name"], "total_tokens": template + prompt + supervised,
                                "kept_supervised_tokens": 0 if decision == "overflow" else kept,
                                "cut_loss_ratio": loss, "decision": decision})
    return plan
""",
        # The fit test on the total; the gates as early returns from a helper; the setup's validators.
        "fit_by_total_helper": """
from course_lib._checks import (require_keys, require_nonnegative_int, require_positive_int, require_ratio,
                                require_sequence)


def _decide(total, window, supervised, kept, min_kept, max_ratio):
    if total <= window:
        return "fit"
    if kept < min_kept:
        return "overflow"
    if (supervised - kept) / supervised > max_ratio:
        return "overflow"
    return "truncate"


def audit_context_fit(samples, target_context_len, template_tokens, min_kept_supervised_tokens=1,
                      max_supervision_loss_ratio=0.0):
    samples = require_sequence("samples", samples)
    template = require_nonnegative_int("template_tokens", template_tokens)
    window = require_positive_int("target_context_len", target_context_len)
    max_ratio = require_ratio("max_supervision_loss_ratio", max_supervision_loss_ratio)
    min_kept = require_positive_int("min_kept_supervised_tokens", min_kept_supervised_tokens)
    records = []
    for number, sample in enumerate(samples):
        require_keys(f"sample {number}", sample, ["name", "prompt_tokens", "supervised_tokens"])
        supervised = require_positive_int(f"sample {number} supervised_tokens", sample["supervised_tokens"])
        prompt = require_nonnegative_int(f"sample {number} prompt_tokens", sample["prompt_tokens"])
        total = template + prompt + supervised
        room = window - template - prompt
        kept = supervised if total <= window else max(room, 0)
        decision = _decide(total, window, supervised, kept, min_kept, max_ratio)
        records.append({"name": sample["name"], "total_tokens": total,
                        "kept_supervised_tokens": 0 if decision == "overflow" else kept,
                        "cut_loss_ratio": (supervised - kept) / supervised, "decision": decision})
    by = {decision: [r["name"] for r in records if r["decision"] == decision]
          for decision in ("fit", "truncate", "overflow")}
    return {"records": records, "fit_names": by["fit"], "truncated_names": by["truncate"],
            "overflow_names": by["overflow"]}
""",
        # numpy integers accepted for the lengths (np.integer), a ratio compared as a float, a dataclass per record.
        "dataclass_records": """
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class _Record:
    name: object
    total_tokens: int
    kept_supervised_tokens: int
    cut_loss_ratio: float
    decision: str


def _whole(name, value, low):
    if type(value) is bool or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name}: expected at least {low}, got {value}")
    return int(value)


def audit_context_fit(samples, target_context_len, template_tokens, min_kept_supervised_tokens=1,
                      max_supervision_loss_ratio=0.0):
    window = _whole("target_context_len", target_context_len, 1)
    minimum = _whole("min_kept_supervised_tokens", min_kept_supervised_tokens, 1)
    template = _whole("template_tokens", template_tokens, 0)
    if type(max_supervision_loss_ratio) not in (int, float) or not (0.0 <= max_supervision_loss_ratio <= 1.0):
        raise ValueError(f"max_supervision_loss_ratio: expected a number in [0, 1], got {max_supervision_loss_ratio!r}")
    limit = float(max_supervision_loss_ratio)  # nan failed the range test above
    records = []
    for sample in list(samples):
        missing = {"name", "prompt_tokens", "supervised_tokens"} - set(sample)
        if missing:
            raise ValueError(f"a sample lacks the field(s) {sorted(missing)}")
        prompt = _whole("prompt_tokens", sample["prompt_tokens"], 0)
        supervised = _whole("supervised_tokens", sample["supervised_tokens"], 1)
        kept = max(0, min(supervised, window - template - prompt))
        lost = (supervised - kept) / supervised
        if kept == supervised:
            record = _Record(sample["name"], template + prompt + supervised, kept, lost, "fit")
        elif kept >= minimum and lost <= limit:
            record = _Record(sample["name"], template + prompt + supervised, kept, lost, "truncate")
        else:
            record = _Record(sample["name"], template + prompt + supervised, 0, lost, "overflow")
        records.append(record)
    return {"records": [asdict(record) for record in records],
            "fit_names": [record.name for record in records if record.decision == "fit"],
            "truncated_names": [record.name for record in records if record.decision == "truncate"],
            "overflow_names": [record.name for record in records if record.decision == "overflow"]}
""",
    },
}
ALTERNATIVES["audit_context_fit"].update(
    {
        # A helper named _window: the graded cell once had a global of that name, which replaced the student's helper.
        "helper_named_window": """
from course_lib._checks import (require_keys, require_nonnegative_int, require_positive_int, require_ratio,
                                require_sequence)


def _window(target, template, prompt, supervised):
    return min(supervised, max(0, target - template - prompt))


def audit_context_fit(samples, target_context_len, template_tokens, min_kept_supervised_tokens=1,
                      max_supervision_loss_ratio=0.0):
    target = require_positive_int("target_context_len", target_context_len)
    template = require_nonnegative_int("template_tokens", template_tokens)
    min_kept = require_positive_int("min_kept_supervised_tokens", min_kept_supervised_tokens)
    max_ratio = require_ratio("max_supervision_loss_ratio", max_supervision_loss_ratio)
    out = {"records": [], "fit_names": [], "truncated_names": [], "overflow_names": []}
    for index, sample in enumerate(require_sequence("samples", samples)):
        require_keys(f"samples[{index}]", sample, ("name", "prompt_tokens", "supervised_tokens"))
        prompt = require_nonnegative_int("prompt_tokens", sample["prompt_tokens"])
        supervised = require_positive_int("supervised_tokens", sample["supervised_tokens"])
        kept = _window(target, template, prompt, supervised)
        ratio = (supervised - kept) / supervised
        if kept == supervised:
            decision, key = "fit", "fit_names"
        elif kept >= min_kept and ratio <= max_ratio:
            decision, key = "truncate", "truncated_names"
        else:
            decision, key, kept = "overflow", "overflow_names", 0
        out[key].append(sample["name"])
        out["records"].append({"name": sample["name"], "total_tokens": template + prompt + supervised,
                               "kept_supervised_tokens": kept, "cut_loss_ratio": ratio, "decision": decision})
    return out
""",
    }
)

# A count held by numpy is the count: the value is the lesson, not the type that holds it (issue 31).
ALTERNATIVES["ledger_from_roles"]["numpy_int_counts"] = mutate(
    _LEDGER_TARGET,
    (
        'prompt = int(np.isin(role_array, ("system", "user")).sum())',
        'prompt = np.isin(role_array, ("system", "user")).sum()',
    ),
)
