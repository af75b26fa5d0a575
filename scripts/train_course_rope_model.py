"""Train chapter 12's RoPE model (course_lib/data/models/course-rope/) and run its RoPE-scaling study.

python scripts/train_course_rope_model.py train            # rewrite the shipped checkpoint and its training log
python scripts/train_course_rope_model.py train --out DIR  # write elsewhere
python scripts/train_course_rope_model.py study            # the study on the shipped checkpoint -> rope_study.json

`train` runs COURSE_ROPE_RECIPE on one thread: two runs give byte-identical weights (on one machine and torch build).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import transformers

from course_lib import __version__
from course_lib.lab.ropemodel import (
    COURSE_ROPE_RECIPE,
    COURSE_ROPE_TRAINED_LENGTH,
    course_rope_model_files,
    format_rope_study,
    new_course_rope_model,
    rope_scaling_study,
    train_on_retrieval,
)
from course_lib.longeval import needle_report

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
SAMPLES_PER_CELL = 100


def versions() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "course_lib": __version__,
        "machine": platform.machine(),
    }


def train(out_dir: Path) -> dict:
    """Train with COURSE_ROPE_RECIPE, save model.safetensors + config.json and training_log.json into out_dir."""
    recipe = dict(COURSE_ROPE_RECIPE)
    model = new_course_rope_model(recipe["seed"])
    started = time.perf_counter()
    losses = train_on_retrieval(model, **recipe)
    seconds = time.perf_counter() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    (out_dir / "generation_config.json").unlink(missing_ok=True)  # a retrieval model generates nothing
    report = needle_report(model, [COURSE_ROPE_TRAINED_LENGTH], DEPTHS, SAMPLES_PER_CELL, seed=0)
    log = {
        "recipe": {**recipe, "schedule": [list(stage) for stage in recipe["schedule"]], "init_seed": recipe["seed"]},
        "lengths": [length for length, steps in recipe["schedule"] for _ in range(steps)],
        "losses": losses,
        "seconds": round(seconds, 1),
        "threads": recipe["threads"],
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "needle_report_at_trained_length": report,
        "versions": versions(),
    }
    (out_dir / "training_log.json").write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    return log


def study(out_dir: Path) -> dict:
    """Run rope_scaling_study with its defaults on the shipped checkpoint; write rope_study.json into out_dir."""
    started = time.perf_counter()
    result = rope_scaling_study()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["threads"] = torch.get_num_threads()
    result["versions"] = versions()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "rope_study.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["train", "study"])
    parser.add_argument("--out", type=Path, default=Path(str(course_rope_model_files())))
    args = parser.parse_args()
    if args.command == "train":
        log = train(args.out)
        accuracy = log["needle_report_at_trained_length"]["accuracy"][0]
        print(f"trained in {log['seconds']} s; retrieval at {COURSE_ROPE_TRAINED_LENGTH} tokens by depth: {accuracy}")
    else:
        result = study(args.out)
        print(format_rope_study(result))
        print(f"{result['seconds']} s on {result['threads']} threads")


if __name__ == "__main__":
    main()
