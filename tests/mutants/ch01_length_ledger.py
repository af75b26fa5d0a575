"""Wrong answers for chapter 1 (length ledger and window policy)."""

CHAPTER = "01_length_ledger"

_AUDIT = '''
def audit_context_fit(samples, target_context_len, template_tokens, min_kept_supervised_tokens=1,
                      max_supervision_loss_ratio=0.0):
    target = require_positive_int("target_context_len", target_context_len)
    min_kept = require_positive_int("min_kept_supervised_tokens", min_kept_supervised_tokens)
    max_ratio = require_ratio("max_supervision_loss_ratio", max_supervision_loss_ratio)
    template = require_nonnegative_int("template_tokens", template_tokens)
    records = []
    for index, sample in enumerate(samples):
        require_keys(f"samples[{index}]", sample, ("name", "prompt_tokens", "supervised_tokens"))
        prompt = require_nonnegative_int("prompt_tokens", sample["prompt_tokens"])
        supervised = require_positive_int("supervised_tokens", sample["supervised_tokens"])
        available = AVAILABLE
        kept = min(supervised, available)
        loss_ratio = (supervised - kept) / supervised
        if kept == supervised:
            decision = "fit"
        elif ADMITTED:
            decision = "truncate"
        else:
            decision, kept = "overflow", ZEROED
        records.append({"name": sample["name"], "total_tokens": template + prompt + supervised,
                        "kept_supervised_tokens": kept, "supervision_loss_ratio": loss_ratio, "decision": decision})
    return {"records": records,
            "fit_names": [r["name"] for r in records if r["decision"] == "fit"],
            "truncated_names": [r["name"] for r in records if r["decision"] == "truncate"],
            "overflow_names": [r["name"] for r in records if r["decision"] == "overflow"]}
'''


def _audit(available="max(0, target - template - prompt)", admitted="kept >= min_kept and loss_ratio <= max_ratio",
           zeroed="0"):
    return _AUDIT.replace("AVAILABLE", available).replace("ADMITTED", admitted).replace("ZEROED", zeroed)


_LEDGER = '''
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
'''


def _ledger(prompt_roles='("system", "user")', eos='sum(role == "eos" for role in roles) if supervise_eos else 0',
            total="len(roles)"):
    return _LEDGER.replace("PROMPT_ROLES", prompt_roles).replace("EOS_COUNT", eos).replace("TOTAL", total)


MUTANTS = {
    "audit_context_fit": {
        # `<` for `<=` at the window edge: a sample of exactly C tokens is treated as too long.
        "strict_window_edge": _audit(available="max(0, target - template - prompt - 1)"),
        # The template's tokens are forgotten: the prompt alone is charged against the window.
        "ignores_template_tokens": _audit(available="max(0, target - prompt)"),
        # Only the minimum-kept gate: any loss ratio is admitted.
        "one_gate_only": _audit(admitted="kept >= min_kept"),
        # An overflow still reports the tokens it would have kept.
        "kept_reported_on_overflow": _audit(zeroed="kept"),
        # A wrong answer that rebinds the library's names to itself, so a naive reference would be itself.
        "rebinds_the_library": _audit(available="max(0, target - prompt)") + """
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
