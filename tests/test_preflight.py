"""Environment profiles and preflight: BASE-CPU passes here, PT-SFT-CUDA fails here on CUDA, each line decides."""

from __future__ import annotations

import pytest
import torch

from course_lib.preflight import (
    PreflightError,
    evaluate_profile,
    format_preflight,
    load_profile,
    load_profiles,
    main,
    preflight,
    probe_environment,
    profile_pins,
    require_preflight,
)

GIB = 1024**3


def _line(record: dict, name: str) -> dict:
    return next(line for line in record["checks"] if line["name"] == name)


def _gpu_snapshot(**changes) -> dict:
    """This machine's snapshot with a GPU described in it (the evaluation is a pure function of the snapshot)."""
    snapshot = probe_environment()
    snapshot.update(
        cuda_available=True,
        cuda_version="12.8",
        bf16_supported=True,
        gpu_name="Test GPU",
        free_gpu_memory_bytes=16 * GIB,
        total_gpu_memory_bytes=24 * GIB,
        sdpa_available=True,
    )
    snapshot.update(changes)
    return snapshot


def test_three_profiles_declared_with_capabilities():
    profiles = load_profiles()
    assert set(profiles) == {"BASE-CPU", "PT-CPU", "PT-SFT-CUDA"}
    cuda = profiles["PT-SFT-CUDA"]
    assert cuda["cuda"] == "required" and cuda["reference_free_gpu_memory_gib"] == 8
    assert cuda["attention_backend"] == "sdpa" and "real_gpu" in cuda["capabilities"]
    assert "trl" not in profiles["BASE-CPU"]["versions"] and "trl" in profiles["PT-CPU"]["versions"]


def test_profile_pins_follow_includes():
    pins = profile_pins(load_profile("PT-SFT-CUDA"))
    assert pins["torch"] == "2.13.0" and pins["trl"] == "1.16.0" and pins["datasets"] == "5.2.0"
    assert "trl" not in profile_pins(load_profile("BASE-CPU"))


def test_base_cpu_passes_here():
    record = preflight("BASE-CPU")
    assert record["passed"] and record["failed"] == []
    assert _line(record, "torch")["status"] in ("pass", "warn")
    assert _line(record, "cuda")["status"] == ("pass" if torch.cuda.is_available() else "skip")  # not required
    assert "verdict: PASS" in format_preflight(record)


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@NO_CUDA
def test_pt_sft_cuda_fails_here_with_a_cuda_line():
    record = preflight("PT-SFT-CUDA")
    assert not record["passed"] and "cuda" in record["failed"]
    cuda_row = next(row for row in format_preflight(record).splitlines() if row.startswith("cuda"))
    assert "FAIL" in cuda_row and "CUDA not available" in cuda_row
    if torch.version.cuda is None:  # this machine's CPU wheel: say so, not "no visible NVIDIA GPU"
        assert "a torch build without CUDA" in cuda_row
    with pytest.raises(PreflightError, match="cuda: expected available"):
        require_preflight("PT-SFT-CUDA")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pt_sft_cuda_cuda_lines_pass_on_a_gpu():
    record = preflight("PT-SFT-CUDA")
    assert _line(record, "cuda")["status"] == "pass" and "cuda" not in record["failed"]
    assert _line(record, "bf16")["status"] in ("pass", "warn")


def test_cli_exit_codes(capsys):
    assert main(["BASE-CPU"]) == 0
    assert "verdict: PASS" in capsys.readouterr().out
    assert main(["NO-SUCH"]) == 2
    assert "NO-SUCH" in capsys.readouterr().err


@NO_CUDA
def test_cli_exit_code_of_a_failed_profile(capsys):
    assert main(["PT-SFT-CUDA"]) == 1
    assert "FAIL: cuda" in capsys.readouterr().out


def test_unknown_profile_raises_value_error():
    with pytest.raises(ValueError, match="NO-SUCH"):
        preflight("NO-SUCH")


def test_gpu_with_enough_memory_passes():
    record = evaluate_profile(load_profile("PT-SFT-CUDA"), _gpu_snapshot())
    assert record["passed"], record["failed"]
    assert _line(record, "free_gpu_memory")["status"] == "pass"


def test_free_memory_below_reference_fails():
    record = evaluate_profile(load_profile("PT-SFT-CUDA"), _gpu_snapshot(free_gpu_memory_bytes=4 * GIB))
    assert record["failed"] == ["free_gpu_memory"]
    assert "only 4.00 GiB free" in _line(record, "free_gpu_memory")["detail"]


def test_missing_bf16_warns_but_passes():
    record = evaluate_profile(load_profile("PT-SFT-CUDA"), _gpu_snapshot(bf16_supported=False))
    assert record["passed"] and "bf16" in record["warned"]
    assert "fp16" in _line(record, "bf16")["detail"]


@pytest.mark.parametrize(
    "name, found, status",
    [
        ("trl", None, "fail"),  # not installed
        ("trl", "1.9.0", "fail"),  # below the profile's range (no cu_seq_lens from its padding-free collator)
        ("transformers", "4.57.6", "fail"),  # below: cannot load the course tokenizer saved by transformers 5
        ("transformers", "5.0.0", "warn"),  # in range (the tested lower bound), not the tested pin
        ("trl", "1.16.0", "pass"),  # the tested pin
        ("torch", "2.13.0+cu128", "pass"),  # a local build tag of the pinned version
    ],
)
def test_version_lines(name, found, status):
    record = evaluate_profile(load_profile("PT-SFT-CUDA"), _gpu_snapshot(**{name: found}))
    assert _line(record, name)["status"] == status
    assert record["passed"] == (status != "fail")


def test_native_bf16_is_not_a_t4s_emulated_bf16(monkeypatch):
    """torch.cuda.is_bf16_supported() says True on a T4 (compute capability 7.5), where bf16 is emulated: preflight
    and the runner ask for native bf16, so a T4 warns and the runner loads the model in fp16 there."""
    from course_lib.lab.gpu.runner import _device_and_dtype
    from course_lib.preflight import native_bf16

    assert native_bf16() in (True, False) and (torch.cuda.is_available() or native_bf16() is False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)  # T4
    assert native_bf16() is False
    assert _device_and_dtype("real_gpu") == (torch.device("cuda"), torch.float16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # sm80 on
    assert native_bf16() is True
    assert _device_and_dtype("real_gpu") == (torch.device("cuda"), torch.bfloat16)


def test_attention_line_says_why_sdpa_is_missing():
    from course_lib.preflight import _attention_line

    profile = load_profile("PT-SFT-CUDA")
    no_torch = _attention_line(profile, {"torch": None, "sdpa_available": False, "sdpa_kernels": None})
    assert (no_torch["status"], no_torch["detail"]) == ("fail", "torch is not installed")
    old_torch = _attention_line(profile, {"torch": "2.0.0", "sdpa_available": False, "sdpa_kernels": None})
    assert "scaled_dot_product_attention is missing" in old_torch["detail"]


def test_cuda_line_says_when_torch_is_missing():
    from course_lib.preflight import _cuda_line

    line = _cuda_line(load_profile("PT-SFT-CUDA"), {"torch": None, "cuda_available": False, "cuda_version": None})
    assert (line["status"], line["detail"]) == ("fail", "CUDA not available: torch is not installed")
