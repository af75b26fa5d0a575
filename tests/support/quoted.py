"""The numbers a chapter's prose quotes, and whether its own run printed them.

A quoted number is a numeral in running text: section numbers, list markers, references ("§14.3", "section 5",
"Step 5", "TODO 3"), dates, versions, inline code, math and link targets are not quotes. A quote matches a printed
number that rounds to it at the quote's own precision ("1.4x" matches a printed 1.43, "65,536" a printed 65536), and
"131k" matches a printed 131,072 (thousands, or binary thousands for 64k = 65,536).

>>> [q.value for q in quoted_numbers("## 5. Sorting\\nSorting cuts padding to 3.6% (`pad_to=8`, $2^{10}$), 64k.")]
['3.6', '64k']
>>> matches_printed("1.4", {"1.43"}), matches_printed("64k", {"65536"}), matches_printed("2.2", {"2.31"})
(True, True, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

NUMBER = re.compile(r"(?<![\w.§/^_-])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(k?)(?:x|×|%)?(?![\w])")
DATES_AND_VERSIONS = [re.compile(r"\b\d{4}-\d{2}-\d{2}\b"), re.compile(r"\b\d+\.\d+\.\d+\b")]  # 2026-11-30, 1.16.0
NOT_QUOTES = [
    *DATES_AND_VERSIONS,
    re.compile(r"\$\$.*?\$\$", re.DOTALL),  # display math
    re.compile(r"\$[^$\n]*\$"),  # inline math
    re.compile(r"```.*?```", re.DOTALL),  # fenced code
    re.compile(r"`[^`\n]*`"),  # inline code
    re.compile(r"^#+ *\d+(?:\.\d+)*\.?", re.MULTILINE),  # a heading's section number
    re.compile(r"^ *\d+\. ", re.MULTILINE),  # an ordered list's marker
    re.compile(
        r"(?:§|\b(?:Step|[Ss]ections?|[Cc]hapters?|TODO|[Ee]xercises?|[Pp]art|[Ff]igure)\s)[\d.]+(?:[,–-]\s*[\d.]+)*"
    ),
    re.compile(r"<[^>]+>"),  # HTML tags
    re.compile(r"\]\([^)]*\)"),  # link targets
]
EXERCISES = re.compile(r"^#+ *\d*\.? *Exercises.*?(?=^#+ |\Z)", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Quote:
    value: str  # the numeral without thousands separators, with its "k" if it has one: "65536", "1.4", "64k"
    context: str  # the running text around it, for a message


def running_text(markdown: str) -> str:
    """markdown without what is not a quote (see the module docstring); exercises are prompts, not claims."""
    text = EXERCISES.sub("", markdown)
    for pattern in NOT_QUOTES:
        text = pattern.sub(" ", text)
    return text


def quoted_numbers(markdown: str) -> list[Quote]:
    """Each numeral the running text quotes, in order."""
    text = running_text(markdown)
    return [
        Quote(
            match.group(1).replace(",", "") + (match.group(2) or "") + match.group(3),
            " ".join(text[max(0, match.start() - 80) : match.end() + 40].split()),
        )
        for match in NUMBER.finditer(text)
    ]


def printed_numbers(output: str) -> set[str]:
    """Every numeral in a run's output, thousands separators dropped; dates and versions (trl 1.16.0) are none."""
    for pattern in DATES_AND_VERSIONS:
        output = pattern.sub(" ", output)
    return {match.group(1).replace(",", "") + (match.group(2) or "") for match in NUMBER.finditer(output)}


def _rounds_to(printed: Decimal, quote: Decimal, places: int) -> bool:
    return printed.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP) == quote


def matches_printed(value: str, printed: set[str]) -> bool:
    """Whether a printed numeral, rounded at the quote's precision, is the quote ("64k": also 64 x 1000 or 1024)."""
    thousands = value.endswith("k")
    quote = Decimal(value.removesuffix("k"))
    places = max(0, -quote.as_tuple().exponent)
    for text in printed:
        number = Decimal(text)
        if _rounds_to(number, quote, places):
            return True
        if thousands and any(_rounds_to(number / unit, quote, places) for unit in (1000, 1024)):
            return True
    return False


def unprinted_quotes(markdown: str, output: str, code: str) -> list[Quote]:
    """The quotes that neither match the output nor appear in the code cells (where the prose names a given input)."""
    printed = printed_numbers(output)
    given = printed_numbers(code)
    return [
        quote
        for quote in quoted_numbers(markdown)
        if not matches_printed(quote.value, printed) and quote.value.removesuffix("k") not in given
    ]
