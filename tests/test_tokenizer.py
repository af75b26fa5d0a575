"""The course tokenizer: vocab 2048, reproducible training, three chat templates, render_chat roles, hub loader."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from course_lib import (
    CHAT_TEMPLATE_SOURCES,
    CHAT_TEMPLATES,
    SPECIAL_TOKENS,
    HubUnavailableError,
    course_tokenizer_dir,
    hub_commit,
    load_course_tokenizer,
    load_tokenizer,
    render_chat,
    render_chats,
    tiny_qwen2,
    train_course_tokenizer,
)
from tests.conftest import CHAT

REPO = Path(__file__).resolve().parents[1]
EXPECTED_TEXT = {
    "chatml": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is packing?<|im_end|>\n"
    "<|im_start|>assistant\nPacking puts samples in one row.<|im_end|>\n<|im_start|>user\n谢谢<|im_end|>\n"
    "<|im_start|>assistant\n不客气！<|im_end|>\n",
    "llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nWhat is packing?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nPacking puts samples in one row.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n谢谢<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n不客气！<|eot_id|>",
    "alpaca": "You are a helpful assistant.\n\n### Instruction:\nWhat is packing?\n\n### Response:\n"
    "Packing puts samples in one row.<|endoftext|>\n\n### Instruction:\n谢谢\n\n### Response:\n"
    "不客气！<|endoftext|>\n\n",
}
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "alpaca": "<|endoftext|>"}
GENERATION_PROMPT = {
    "chatml": "<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "alpaca": "### Response:\n",
}


def test_vocab_is_exactly_2048_with_single_id_special_tokens(tokenizers):
    tokenizer = tokenizers["chatml"]
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert len(tokenizer) == 2048 and tokenizer.vocab_size == 2048
    assert tokenizer.vocab_size == tiny_qwen2().config.vocab_size
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(len(SPECIAL_TOKENS)))
    for token in SPECIAL_TOKENS:
        ids = tokenizer(f"a{token}b", add_special_tokens=False)["input_ids"]
        assert ids[1] == tokenizer.convert_tokens_to_ids(token)
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    assert (
        tokenizer("hello", add_special_tokens=True)["input_ids"]
        == tokenizer("hello", add_special_tokens=False)["input_ids"]
    )  # no BOS/EOS added behind the template's back


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abcXYZ 019.,!?\n\t") + list("微调分词器，。你好")), max_size=60))
def test_bilingual_text_round_trips_and_ids_fit_the_tiny_model(tokenizers, text):
    tokenizer = tokenizers["chatml"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert all(0 <= token_id < 2048 for token_id in ids)
    assert tokenizer.decode(ids) == text


def test_tiny_model_runs_on_rendered_ids(tokenizers):
    ids = tokenizers["llama3"].apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    logits = tiny_qwen2()(input_ids=torch.tensor([ids])).logits  # [1, T, 2048]
    assert logits.shape == (1, len(ids), 2048) and torch.isfinite(logits).all()


def test_templates_are_selectable_by_name(tokenizers):
    assert CHAT_TEMPLATES == ("chatml", "llama3", "alpaca")
    assert load_course_tokenizer().chat_template == CHAT_TEMPLATE_SOURCES["chatml"]
    for name, tokenizer in tokenizers.items():
        assert tokenizer.chat_template == CHAT_TEMPLATE_SOURCES[name]
        assert "{% generation %}" in tokenizer.chat_template
        assert tokenizer.eos_token == END_OF_TURN[name]
        assert tokenizer.apply_chat_template(CHAT, tokenize=False) == EXPECTED_TEXT[name]
        prompt = tokenizer.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True)
        assert prompt.endswith(GENERATION_PROMPT[name])
    with pytest.raises(ValueError, match="template"):
        load_course_tokenizer("vicuna")


def test_saved_dir_carries_all_templates_by_name():
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(str(course_tokenizer_dir()), local_files_only=True)
    assert plain.chat_template == {
        "default": CHAT_TEMPLATE_SOURCES["chatml"],
        "llama3": CHAT_TEMPLATE_SOURCES["llama3"],
        "alpaca": CHAT_TEMPLATE_SOURCES["alpaca"],
    }
    assert plain.apply_chat_template(CHAT, tokenize=False, chat_template="llama3") == EXPECTED_TEXT["llama3"]


@pytest.mark.parametrize("name", CHAT_TEMPLATES)
def test_assistant_mask_covers_answers_and_end_of_turn(tokenizers, name):
    tokenizer = tokenizers[name]
    out = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [token_id for token_id, bit in zip(out["input_ids"], out["assistant_masks"], strict=True) if bit]
    answers = "".join(m["content"] + END_OF_TURN[name] for m in CHAT if m["role"] == "assistant")
    assert tokenizer.decode(masked) == answers
    assert masked.count(tokenizer.convert_tokens_to_ids(END_OF_TURN[name])) == 2


@pytest.mark.parametrize("name", CHAT_TEMPLATES)
def test_render_chat_roles_come_from_one_rendering(tokenizers, name):
    tokenizer = tokenizers[name]
    rendered = render_chat(tokenizer, CHAT)
    out = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert rendered["text"] == EXPECTED_TEXT[name]
    assert rendered["input_ids"] == out["input_ids"]
    assert [role in ("assistant", "eos") for role in rendered["roles"]] == [bool(b) for b in out["assistant_masks"]]
    eos_ids = [i for i, role in zip(rendered["input_ids"], rendered["roles"], strict=True) if role == "eos"]
    assert eos_ids == [tokenizer.convert_tokens_to_ids(END_OF_TURN[name])] * 2
    for role in ("system", "user"):
        ids = [i for i, r in zip(rendered["input_ids"], rendered["roles"], strict=True) if r == role]
        expected = "".join(m["content"] for m in CHAT if m["role"] == role)
        assert tokenizer.decode(ids).replace("\n", "") == expected  # alpaca: ".\n\n" can be one seam token
    assert render_chats(tokenizer, [CHAT, CHAT[:3]])[0] == rendered


def test_a_token_across_the_content_seam_belongs_to_the_content(tokenizers):
    # alpaca renders "packing?\n\n###": the pre-tokenizer keeps "?\n" together, one token spanning user and template
    rendered = render_chat(tokenizers["alpaca"], CHAT[1:3])
    tokens = tokenizers["alpaca"].convert_ids_to_tokens(rendered["input_ids"])
    seam = tokens.index("?Ċ")
    assert rendered["roles"][seam] == "user" and rendered["roles"][seam + 1] == "template"


def test_render_chat_rejects_bad_messages_and_foreign_templates(tokenizers):
    tokenizer = tokenizers["chatml"]
    bad = [[], "hello", [{"role": "tool", "content": "x"}], [{"role": "user"}], [{"role": "user", "content": 3}]]
    for messages in bad:
        with pytest.raises(ValueError, match="messages"):
            render_chat(tokenizer, messages)
    foreign = load_course_tokenizer()
    foreign.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="generation"):
        render_chat(foreign, CHAT)


def _script_module():
    script = REPO / "scripts" / "train_course_tokenizer.py"
    spec = importlib.util.spec_from_file_location("train_course_tokenizer", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_script_regenerates_the_shipped_files_byte_identically(tmp_path):
    written = _script_module().write_course_tokenizer(tmp_path / "fresh")
    shipped = sorted(p.relative_to(course_tokenizer_dir()) for p in course_tokenizer_dir().rglob("*") if p.is_file())
    assert sorted(p.relative_to(tmp_path / "fresh") for p in written) == shipped
    for relative in shipped:
        assert (tmp_path / "fresh" / relative).read_bytes() == (course_tokenizer_dir() / relative).read_bytes()
    model = json.loads((course_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    fresh = json.loads(train_course_tokenizer().to_str())["model"]
    assert fresh["vocab"] == model["vocab"] and fresh["merges"] == model["merges"]


def test_load_tokenizer_offline_raises_a_clear_error(tmp_path):
    with pytest.raises(HubUnavailableError, match="load_course_tokenizer") as caught:
        load_tokenizer("Qwen/Qwen2.5-0.5B", local_files_only=True, cache_dir=str(tmp_path))
    assert isinstance(caught.value, OSError) and "unreachable" in str(caught.value)


def test_load_tokenizer_with_hf_hub_offline_does_not_hang(tmp_path):
    code = (
        "from course_lib import load_tokenizer, HubUnavailableError\n"
        f"try:\n    load_tokenizer('Qwen/Qwen2.5-0.5B', cache_dir={str(tmp_path)!r})\n"
        "except HubUnavailableError as error:\n    print('CLEAR', type(error).__mro__[1].__name__)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "CLEAR OSError" in done.stdout, done.stderr[-2000:]


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:  # bound, never listening, closed: connecting to it is refused at once
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cached_hub_tokenizer(cache_dir: Path, model_id: str = "Qwen/Qwen2.5-0.5B") -> None:
    """The course tokenizer laid out as huggingface_hub caches a download of `model_id` (refs/main -> snapshot)."""
    import shutil

    repo = cache_dir / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    for item in course_tokenizer_dir().iterdir():
        if item.is_file():
            shutil.copy(item, snapshot / item.name)
    shutil.copy(
        Path(__file__).resolve().parents[1] / "course_lib/data/configs/Qwen2.5-0.5B.json", snapshot / "config.json"
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "not-cached"])
def test_load_tokenizer_offline_asks_the_hub_once_then_the_cache(tmp_path, cached):
    """An unreachable hub (connection refused) is asked once: the cache answers at once, or the error comes at once.

    transformers alone retries each file's request five times with back-off (2 min 24 s here for a cached
    tokenizer); huggingface_hub logs each retry, so a 'Retrying' line means the probe did not take effect.
    """
    if cached:
        _cached_hub_tokenizer(tmp_path)
    code = (
        "from course_lib import load_tokenizer, HubUnavailableError\n"
        "try:\n"
        f"    tokenizer = load_tokenizer('Qwen/Qwen2.5-0.5B', cache_dir={str(tmp_path)!r})\n"
        "    print('LOADED', type(tokenizer).__name__, len(tokenizer))\n"
        "except HubUnavailableError as error:\n"
        "    print('CLEAR', error)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "Retrying" not in done.stderr, done.stderr[-2000:]
    if cached:
        # the class name differs across transformers 5.x (Qwen2Tokenizer, TokenizersBackend at 5.0): the vocabulary not
        assert done.stdout.startswith("LOADED ") and done.stdout.split()[-1] == "2048", (
            done.stdout + done.stderr[-2000:]
        )
    else:
        assert "CLEAR" in done.stdout and "hub unreachable (ConnectError)" in done.stdout, done.stdout + done.stderr


@pytest.fixture
def fake_hub(monkeypatch):
    """A local stand-in for the hub's model-info API: Qwen/Qwen2.5-0.5B at commit d..d (e..e at revision v1);
    gated/model the same but only with `Authorization: Bearer hf_test` (401 without); anything else 404."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from huggingface_hub import constants

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            known = next(
                (m for m in ("Qwen/Qwen2.5-0.5B", "gated/model") if self.path.startswith(f"/api/models/{m}")), None
            )
            allowed = known != "gated/model" or self.headers.get("Authorization") == "Bearer hf_test"
            status = 404 if known is None else 200 if allowed else 401
            sha = ("e" if self.path.split("?")[0].endswith("/revision/v1") else "d") * 40
            body = json.dumps({"id": known, "sha": sha} if status == 200 else {"error": f"{status} for {self.path}"})
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    yield
    server.shutdown()


def test_hub_commit_tells_an_answer_from_no_answer(fake_hub, monkeypatch):
    """A hub that answers (a commit, or an HTTP error) is reachable; a refused connection or HF_HUB_OFFLINE is not."""
    from huggingface_hub import constants

    assert hub_commit("Qwen/Qwen2.5-0.5B") == ("d" * 40, "resolved on the hub", True)
    commit, note, answered = hub_commit("nobody/nothing")
    assert (commit, answered) == (None, True) and note.startswith("hub answered:"), note
    assert "nobody/nothing" in note and "\n" not in note, note  # the error's first line, whole
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert hub_commit("Qwen/Qwen2.5-0.5B", timeout_s=2.0) == (None, "hub unreachable (ConnectError)", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_commit("Qwen/Qwen2.5-0.5B") == (None, "HF_HUB_OFFLINE is set", False)


def test_a_mistyped_folder_is_not_an_unreachable_hub(fake_hub, tmp_path):
    """'./my_tokenizer' that does not exist is no repository id: hub_commit says so (an answer, not 'unreachable'),
    and load_tokenizer does not switch to the cache and blame the network."""
    missing = str(tmp_path / "my_tokenizer")
    commit, note, answered = hub_commit(missing)
    assert (commit, answered) == (None, True) and note.startswith("not a hub model id:"), note
    with pytest.raises(HubUnavailableError) as caught:
        load_tokenizer(missing)
    assert "looked in the local cache only" not in str(caught.value) and "local_files_only=False" in str(caught.value)


def test_hub_commit_asks_for_the_revision_and_sends_the_token(fake_hub):
    assert hub_commit("Qwen/Qwen2.5-0.5B", "v1") == ("e" * 40, "resolved on the hub", True)
    assert hub_commit("gated/model", token="hf_test") == ("d" * 40, "resolved on the hub", True)
    commit, note, answered = hub_commit("gated/model")  # no token: the hub answers 401, which is an answer
    assert (commit, answered) == (None, True) and "401" in note, note


@pytest.mark.parametrize("value", ["TRUE", "1", "yes", "On"])
def test_hub_commit_reads_hf_hub_offline_as_huggingface_hub_does(fake_hub, monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub_commit("Qwen/Qwen2.5-0.5B") == (None, "HF_HUB_OFFLINE is set", False)


def test_hub_commit_gives_up_after_timeout_s(monkeypatch):
    """A hub that accepts the connection and never answers: huggingface_hub's client waits without a limit unless
    given one, so timeout_s must reach it."""
    import socket
    import threading

    from huggingface_hub import constants

    silent = socket.socket()  # listens and accepts (the kernel's backlog), never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    result = []
    asking = threading.Thread(target=lambda: result.append(hub_commit("Qwen/Qwen2.5-0.5B", timeout_s=0.5)), daemon=True)
    asking.start()
    asking.join(30)
    silent.close()
    assert result and result[0][0] is None and result[0][2] is False, result


def test_hub_commit_without_huggingface_hub(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import huggingface_hub raises ImportError
    commit, note, answered = hub_commit("Qwen/Qwen2.5-0.5B")
    assert (commit, answered) == (None, False) and note.startswith("huggingface_hub is not importable"), note


def test_load_tokenizer_asks_no_hub_for_a_folder_or_with_local_files_only(monkeypatch, tmp_path):
    import course_lib.tokenizer

    def no_hub(*args, **kwargs):
        raise AssertionError(f"hub_commit{args} was called")

    monkeypatch.setattr(course_lib.tokenizer, "hub_commit", no_hub)
    assert len(load_tokenizer(str(course_tokenizer_dir()))) == 2048
    with pytest.raises(HubUnavailableError):
        load_tokenizer("Qwen/Qwen2.5-0.5B", local_files_only=True, cache_dir=str(tmp_path))


def test_load_tokenizer_goes_local_only_when_the_hub_does_not_answer(monkeypatch):
    import transformers

    import course_lib.tokenizer

    asked, loaded = [], []

    def unreachable(*args, **kwargs):
        asked.append((args, kwargs))
        return None, "hub unreachable (ConnectError)", False

    def from_pretrained(model_id, **kwargs):
        loaded.append(kwargs)
        raise OSError("not in the cache")

    monkeypatch.setattr(course_lib.tokenizer, "hub_commit", unreachable)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    with pytest.raises(HubUnavailableError, match=r"hub unreachable \(ConnectError\); looked in the local cache only"):
        load_tokenizer("Qwen/Qwen2.5-0.5B", revision="v1", token="hf_test")
    assert asked == [(("Qwen/Qwen2.5-0.5B", "v1"), {"timeout_s": 10.0, "token": "hf_test"})]
    assert [kwargs.get("local_files_only") for kwargs in loaded] == [True]


@pytest.mark.parametrize(
    "arguments, field",
    [
        ((None,), "model_id"),
        (("",), "model_id"),
        (("a/b", " "), "revision"),
        (("a/b", "main", 0), "timeout_s"),
        (("a/b", "main", math.nan), "timeout_s"),
    ],
)
def test_hub_commit_refuses_bad_arguments_before_asking(arguments, field):
    with pytest.raises(ValueError, match=field):
        hub_commit(*arguments[:2], **({"timeout_s": arguments[2]} if len(arguments) > 2 else {}))


def test_an_old_transformers_gets_a_clear_message(monkeypatch):
    """transformers 4.x reads the shipped files wrongly ('list' object has no attribute 'keys'): say what to do."""
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.57.6")
    with pytest.raises(RuntimeError, match=r"transformers >= 5.0, found 4.57.6"):
        load_course_tokenizer()


# --- what the library survey found untested (tests/mutants/library_survey.py) -------------------------------------


def test_rendering_never_adds_the_tokenizers_own_special_tokens():
    """The chat template writes every special token itself: a tokenizer whose post-processor prepends a BOS (as
    Llama's do) must give the same ids, or every rendered chat would start with two BOS tokens."""
    from tokenizers.processors import TemplateProcessing

    from course_lib import load_course_tokenizer, render_chat

    plain, with_bos = load_course_tokenizer("llama3"), load_course_tokenizer("llama3")
    bos = with_bos.convert_tokens_to_ids("<|begin_of_text|>")
    with_bos.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    assert with_bos("hi")["input_ids"][0] == bos  # the post-processor is live
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    ours, reference = render_chat(with_bos, chat), render_chat(plain, chat)
    assert list(ours["input_ids"]) == list(reference["input_ids"]) and ours["roles"] == reference["roles"]
    assert list(ours["input_ids"]).count(bos) == 1


def test_a_generation_prompt_appends_the_assistant_header_as_template():
    from course_lib import load_course_tokenizer, render_chat

    tokenizer = load_course_tokenizer("chatml")
    question = [{"role": "user", "content": "hi"}]
    plain, prompted = render_chat(tokenizer, question), render_chat(tokenizer, question, add_generation_prompt=True)
    assert prompted["text"] == plain["text"] + "<|im_start|>assistant\n"
    assert list(prompted["input_ids"][: len(plain["input_ids"])]) == list(plain["input_ids"])
    assert set(prompted["roles"][len(plain["roles"]) :]) == {"template"} and len(prompted["roles"]) > len(
        plain["roles"]
    )


def test_render_chats_refuses_what_is_not_a_tokenizer():
    from course_lib import render_chats

    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    for bad in (object(), len, "chatml"):
        with pytest.raises(ValueError, match=r"^tokenizer must be a transformers tokenizer"):
            render_chats(bad, [chat])


def test_corpus_files_come_in_name_order_and_a_small_corpus_is_refused(tmp_path):
    """Chapters index the corpus files (chapter 5 reads corpus_files()[1]): their order must not depend on the
    file system. Training on a corpus too small for the vocabulary must say so instead of shipping a smaller one."""
    from course_lib.tokenizer import corpus_files, train_course_tokenizer

    files = corpus_files()
    assert files == sorted(files) and len(files) >= 2
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a b c", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^corpus too small: trained vocab_size = \d+, wanted 2048"):
        train_course_tokenizer([str(tiny)])
