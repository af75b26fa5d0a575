"""Regenerate course_lib/data/tokenizer/ from the shipped corpus; running it twice gives identical bytes.

python scripts/train_course_tokenizer.py            # rewrite the shipped tokenizer
python scripts/train_course_tokenizer.py --out DIR  # write elsewhere (tests compare the two)
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from course_lib.tokenizer import build_course_tokenizer, course_tokenizer_dir, train_course_tokenizer


def write_course_tokenizer(out_dir: Path) -> list[Path]:
    """Train on the shipped corpus and save the PreTrainedTokenizerFast files into out_dir (replaced)."""
    with tempfile.TemporaryDirectory() as scratch:
        build_course_tokenizer(train_course_tokenizer()).save_pretrained(scratch)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(scratch, out_dir)
    return sorted(path for path in out_dir.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=course_tokenizer_dir())
    for path in write_course_tokenizer(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
