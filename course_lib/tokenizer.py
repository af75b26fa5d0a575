"""The course tokenizer and its chat templates (fully offline), a hub loader, and the one-rendering primitive.

`load_course_tokenizer()` loads a 2048-token byte-level BPE trained on the bilingual corpus shipped in
`course_lib/data/corpus/` (regenerate it with `scripts/train_course_tokenizer.py`). It carries three chat
templates: "chatml" (Qwen style, the default), "llama3" (header tokens) and "alpaca" (plain headers). Each
wraps an assistant answer and its end-of-turn token in `{% generation %}`, so transformers'
`return_assistant_tokens_mask` works; each also accepts `tracked_role="all"`, which wraps every message's
content instead, so `render_chat` can give every token of ONE rendering a role.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from ._checks import require_bool, require_real, require_sequence

__all__ = [
    "CHAT_TEMPLATES",
    "CHAT_TEMPLATE_SOURCES",
    "END_OF_TURN_TOKENS",
    "SPECIAL_TOKENS",
    "COURSE_VOCAB_SIZE",
    "ROLE_NAMES",
    "HubUnavailableError",
    "hub_commit",
    "course_tokenizer_dir",
    "corpus_files",
    "train_course_tokenizer",
    "build_course_tokenizer",
    "load_course_tokenizer",
    "load_tokenizer",
    "chat_template_source",
    "render_chat",
    "render_chats",
]

COURSE_VOCAB_SIZE = 2048
# Special tokens take ids 0..6 in this order; "<|endoftext|>" doubles as the pad token.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
CHAT_TEMPLATES = ("chatml", "llama3", "alpaca")
END_OF_TURN_TOKENS = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "alpaca": "<|endoftext|>"}
# Qwen2-style pre-tokenization: single digits, newline runs kept together, punctuation absorbs following newlines.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ROLE_NAMES = ("template", "system", "user", "assistant", "eos")
_MESSAGE_ROLES = ("system", "user", "assistant")
_DATA_DIR = Path(__file__).resolve().parent / "data"

# Shared skeleton: prefix (template) + body (content; an answer also carries its end-of-turn token) + suffix.
# The body sits in a generation block when its role is tracked: "assistant" by default, every role for "all".
_TEMPLATE_SKELETON = """\
{%- set tracked = tracked_role | default('assistant') -%}
{{- BEGIN -}}
{%- for message in messages -%}
{%- if message['role'] not in ('system', 'user', 'assistant') -%}
{{- raise_exception('unsupported role: ' + message['role']) -}}
{%- endif -%}
{%- set body = message['content'] + (END if message['role'] == 'assistant' else '') -%}
{{- PREFIX[message['role']] -}}
{%- if tracked == 'all' or tracked == message['role'] -%}
{% generation %}{{- body -}}{% endgeneration %}
{%- else -%}
{{- body -}}
{%- endif -%}
{{- SUFFIX[message['role']] -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- PREFIX['assistant'] -}}
{%- endif -%}"""


def _template(name: str, begin: str, end: str, prefix: dict[str, str], suffix: dict[str, str]) -> str:
    header = (
        f"{{#- course_lib chat template '{name}'. Assistant content + {end} is a generation block; "
        "tracked_role='all' marks every message's content (used by course_lib.render_chat). -#}\n"
    )
    constants = (
        f"{{%- set BEGIN = {begin!r} -%}}\n{{%- set END = {end!r} -%}}\n"
        f"{{%- set PREFIX = {prefix!r} -%}}\n{{%- set SUFFIX = {suffix!r} -%}}\n"
    )
    return header + constants + _TEMPLATE_SKELETON


CHAT_TEMPLATE_SOURCES = {
    "chatml": _template(
        "chatml",
        "",
        "<|im_end|>",
        {role: f"<|im_start|>{role}\n" for role in _MESSAGE_ROLES},
        {"system": "<|im_end|>\n", "user": "<|im_end|>\n", "assistant": "\n"},
    ),
    "llama3": _template(
        "llama3",
        "<|begin_of_text|>",
        "<|eot_id|>",
        {role: f"<|start_header_id|>{role}<|end_header_id|>\n\n" for role in _MESSAGE_ROLES},
        {"system": "<|eot_id|>", "user": "<|eot_id|>", "assistant": ""},
    ),
    "alpaca": _template(
        "alpaca",
        "",
        "<|endoftext|>",
        {"system": "", "user": "### Instruction:\n", "assistant": "### Response:\n"},
        {"system": "\n\n", "user": "\n\n", "assistant": "\n\n"},
    ),
}


class HubUnavailableError(OSError):
    """Raised when a tokenizer cannot be fetched from the model hub (offline, unreachable, or not cached)."""


def course_tokenizer_dir() -> Path:
    """The folder of the shipped course tokenizer (tokenizer.json, tokenizer_config.json, templates)."""
    return _DATA_DIR / "tokenizer"


def corpus_files() -> list[str]:
    """The shipped training corpus, sorted by name so training is reproducible."""
    folder = _DATA_DIR / "corpus"
    return [str(path) for path in sorted(folder.glob("*.txt"))]


def train_course_tokenizer(files: list[str] | None = None, vocab_size: int = COURSE_VOCAB_SIZE):
    """Train the byte-level BPE (tokenizers.Tokenizer) on `files` (default: the shipped corpus); deterministic."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Whole files, not lines, so blank lines ("\n\n") are seen and can become merges.
    texts = [Path(path).read_text(encoding="utf-8") for path in (files or corpus_files())]
    tokenizer.train_from_iterator(texts, trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"corpus too small: trained vocab_size = {tokenizer.get_vocab_size()}, wanted {vocab_size}")
    return tokenizer


def build_course_tokenizer(tokenizer_object):
    """Wrap a trained tokenizers.Tokenizer as the course PreTrainedTokenizerFast with all three templates."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=2048,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    wrapped.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    # The default template is saved as chat_template.jinja, the others under additional_chat_templates/.
    wrapped.chat_template = {
        "default": CHAT_TEMPLATE_SOURCES["chatml"],
        **{name: CHAT_TEMPLATE_SOURCES[name] for name in CHAT_TEMPLATES[1:]},
    }
    return wrapped


def chat_template_source(name: str) -> str:
    """The Jinja source of a course chat template by name ("chatml", "llama3" or "alpaca")."""
    if not isinstance(name, str) or name not in CHAT_TEMPLATE_SOURCES:
        raise ValueError(f"template must be one of {list(CHAT_TEMPLATES)}, got {name!r}")
    return CHAT_TEMPLATE_SOURCES[name]


def _require_transformers_5() -> None:
    """The shipped tokenizer files were saved by transformers 5; 4.x misreads them with an obscure AttributeError."""
    import transformers

    major = transformers.__version__.split(".", 1)[0]
    if not major.isdigit() or int(major) < 5:
        raise RuntimeError(
            f"the course tokenizer needs transformers >= 5.0, found {transformers.__version__}: run "
            "pip install -U 'transformers>=5.0' (on Colab, then restart the session)"
        )


def load_course_tokenizer(template: str = "chatml"):
    """The shipped course tokenizer (vocab 2048) with `template` as its chat template; no network."""
    from transformers import PreTrainedTokenizerFast

    source = chat_template_source(template)
    _require_transformers_5()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(course_tokenizer_dir()), local_files_only=True)
    tokenizer.chat_template = source
    tokenizer.eos_token = END_OF_TURN_TOKENS[template]  # generation stops at the template's end of turn
    tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


_OFFLINE_VALUES = ("1", "true", "yes", "on")


def hub_commit(
    model_id: str, revision: str = "main", *, timeout_s: float = 5.0, token: str | bool | None = None
) -> tuple[str | None, str, bool]:
    """Ask the model hub once, without retries -> (commit sha or None, note, whether the hub answered).

    (sha, "resolved on the hub", True) when it resolves; (None, "hub answered: ...", True) when it answered with
    an error (a missing or gated repository: loading would fail the same way), or (None, "not a hub model id: ...",
    True) for a name that is no repository id (a mistyped folder: loading says what is wrong); (None, why, False) when
    it cannot be reached within `timeout_s` or HF_HUB_OFFLINE is set. One request: huggingface_hub's file downloads
    retry a failed connection five times with back-off, about 45 s offline before the cache is even looked at.
    """
    for name, value in (("model_id", model_id), ("revision", revision)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in _OFFLINE_VALUES:  # huggingface_hub's reading, no strip
        return None, "HF_HUB_OFFLINE is set", False
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError
    except ImportError as error:
        return None, f"huggingface_hub is not importable ({error})", False
    try:
        info = HfApi().model_info(model_id, revision=revision, timeout=timeout_s, token=token)
    except HfHubHTTPError as error:  # a response came back: reachable, the repository or revision is the problem
        return None, f"hub answered: {type(error).__name__}: {str(error).splitlines()[0]}", True
    except HFValidationError as error:  # './my_tokenizer' mistyped: no request was made, and none would help
        return None, f"not a hub model id: {str(error).splitlines()[0]}", True
    except Exception as error:  # connection, DNS, proxy, timeout: not reachable now
        return None, f"hub unreachable ({type(error).__name__})", False
    return info.sha, "resolved on the hub", True


def load_tokenizer(model_id: str, *, local_files_only: bool = False, **kwargs: Any):
    """AutoTokenizer.from_pretrained(model_id) from the hub or its cache; HubUnavailableError when it cannot.

    The hub is asked once first (`hub_commit`); when it cannot be reached the tokenizer comes from the local cache
    at once (or the error is raised at once) instead of after huggingface_hub's ~45 s of retries. A local folder
    is loaded as is.
    """
    from transformers import AutoTokenizer

    why_offline = None
    if not local_files_only and not Path(str(model_id)).is_dir():
        _, note, answered = hub_commit(
            str(model_id), kwargs.get("revision") or "main", timeout_s=10.0, token=kwargs.get("token")
        )  # 10 s: a slow hub that answers is not offline
        if not answered:
            why_offline, local_files_only = note, True
    try:
        return AutoTokenizer.from_pretrained(model_id, local_files_only=local_files_only, **kwargs)
    except (OSError, ValueError, ConnectionError) as error:
        where = f" ({why_offline}; looked in the local cache only)" if why_offline else ""
        raise HubUnavailableError(
            f"could not load the tokenizer of {model_id!r}: the model hub was unreachable or the files are not "
            f"cached (local_files_only={local_files_only}){where}. Offline, use course_lib.load_course_tokenizer(). "
            f"Cause: {type(error).__name__}: {error}"
        ) from error


def _check_messages(messages: object) -> list[dict[str, str]]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r:.80}")
    for index, message in enumerate(messages):
        if not hasattr(message, "keys") or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{index}] must be a dict with 'role' and 'content', got {message!r:.80}")
        if message["role"] not in _MESSAGE_ROLES:
            raise ValueError(
                f"messages[{index}]['role'] must be one of {list(_MESSAGE_ROLES)}, got {message['role']!r}"
            )
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{index}]['content'] must be a string, got {message['content']!r:.80}")
    return [{"role": message["role"], "content": message["content"]} for message in messages]


def _render_text_and_spans(tokenizer, messages, chat_template, add_generation_prompt):
    """Render once with every message's content tracked -> (text, [(start, end)] per message)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    source = tokenizer.get_chat_template(chat_template_source(chat_template) if chat_template else None)
    kwargs = {**tokenizer.special_tokens_map, "tracked_role": "all"}
    rendered, spans = render_jinja_template(
        conversations=[messages],
        chat_template=source,
        return_assistant_tokens_mask=True,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    if len(spans[0]) != len(messages):
        raise ValueError(
            "chat template does not mark each message's content with {% generation %} under "
            f"tracked_role='all' ({len(spans[0])} spans for {len(messages)} messages); "
            "render_chat needs a course template (CHAT_TEMPLATES)"
        )
    return rendered[0], spans[0]


class RenderedChat(TypedDict):
    """A chat rendered once: its text, token ids [T], character offsets [T, 2] and each token's role [T]."""

    text: str
    input_ids: list[int]
    offsets: list[list[int]]
    roles: list[str]


def render_chat(
    tokenizer, messages, *, chat_template: str | None = None, add_generation_prompt: bool = False
) -> RenderedChat:
    """Render a chat ONCE and tokenize it once -> {"text", "input_ids" [T], "offsets" [T, 2], "roles" [T]}.

    A token's role is the role of the message content it overlaps (the same overlap rule as transformers'
    assistant mask), else "template"; the special token that closes an answer is "eos".
    """
    return render_chats(
        tokenizer, [messages], chat_template=chat_template, add_generation_prompt=add_generation_prompt
    )[0]


def render_chats(
    tokenizer, conversations, *, chat_template: str | None = None, add_generation_prompt: bool = False
) -> list[RenderedChat]:
    """A batch of chats -> one render_chat dict per chat; the tokenizer runs once over the whole batch."""
    if not callable(tokenizer) or not hasattr(tokenizer, "get_chat_template"):
        raise ValueError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    if chat_template is not None:
        chat_template_source(chat_template)  # names the field and the value when it is not a course template
    add_generation_prompt = require_bool("add_generation_prompt", add_generation_prompt)
    checked = [_check_messages(messages) for messages in require_sequence("conversations", conversations)]
    if not checked:
        return []
    rendered = [_render_text_and_spans(tokenizer, chat, chat_template, add_generation_prompt) for chat in checked]
    encodings = tokenizer([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
    special_ids = np.asarray(sorted(tokenizer.all_special_ids), dtype=np.int64)
    results = []
    for index, (text, spans) in enumerate(rendered):
        input_ids = np.asarray(encodings["input_ids"][index], dtype=np.int64)  # [T]
        offsets = np.asarray(encodings["offset_mapping"][index], dtype=np.int64).reshape(-1, 2)  # [T, 2]
        roles = _roles_from_spans(offsets, spans, [message["role"] for message in checked[index]])  # [T]
        answer_end = _span_last_token(roles == ROLE_NAMES.index("assistant"))  # [T] bool
        roles[answer_end & np.isin(input_ids, special_ids)] = ROLE_NAMES.index("eos")
        results.append(
            {
                "text": text,
                "input_ids": input_ids.tolist(),
                "offsets": offsets.tolist(),
                "roles": [ROLE_NAMES[code] for code in roles.tolist()],
            }
        )
    return results


def _roles_from_spans(offsets: np.ndarray, spans, span_roles: list[str]) -> np.ndarray:
    """offsets [T, 2], spans [S] (start, end) in order -> role codes [T] (0 = template)."""
    roles = np.zeros(len(offsets), dtype=np.int64)
    kept = [(start, end, role) for (start, end), role in zip(spans, span_roles, strict=True) if end > start]
    if not kept or not len(offsets):
        return roles
    starts = np.asarray([s for s, _, _ in kept])  # [S]
    ends = np.asarray([e for _, e, _ in kept])  # [S]
    codes = np.asarray([ROLE_NAMES.index(role) for _, _, role in kept])  # [S]
    first = np.searchsorted(ends, offsets[:, 0], side="right")  # [T] first span ending after the token starts
    inside = first < len(kept)
    overlaps = inside & (offsets[:, 1] > starts[np.minimum(first, len(kept) - 1)])  # [T]
    roles[overlaps] = codes[first[overlaps]]
    return roles


def _span_last_token(mask: np.ndarray) -> np.ndarray:
    """mask [T] bool -> [T] bool, True at the last token of each run of True."""
    following = np.append(mask[1:], False)  # [T]
    return mask & ~following
