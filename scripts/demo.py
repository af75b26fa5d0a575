"""The main job (`make demo`): a short tour of the library, then build the course and grade sample submissions.

1. The library on real objects: the length ledger, a packing plan, the token-budget microbatch table and the
   throughput accounting of the source documents (docs/sources.md), each printed from a real computation.
2. Build every chapter (jupytext source -> nbgrader source -> release) in `notebooks/`.
3. Grade four sample submissions per chapter with `course grade` into a scratch copy of the built course,
   `build/demo/course/` (nbgrader's own layout and gradebook, grades.csv, feedback/): the instructor's solution, the untouched release, a release filled
   with the solutions except one wrong answer (`demo_wrong_answers.json`, taken from the tests' wrong-answer
   catalogue; a test keeps the two equal), and a release whose every TODO holds a correct answer written otherwise
   than the instructor's (`demo_right_answers.json`, from the catalogue's alternatives). Print the gradebook, and
   exit 1 unless every solution and every alternative has full marks, every blank release zero, and each wrong
   answer lost exactly its own TODO's cells.
"""  # noqa: E501

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WRONG_ANSWERS = Path(__file__).resolve().with_name("demo_wrong_answers.json")  # chapter -> {todo, name, source}
RIGHT_ANSWERS = Path(__file__).resolve().with_name("demo_right_answers.json")  # chapter -> {todo: {name, source}}
FULL_MARKS = ("sample-solution", "sample-alternative")


def library_tour() -> None:
    import course_lib as cl

    tokenizer = cl.load_course_tokenizer()
    chat = [
        {"role": "system", "content": "You are a patient tutor."},
        {"role": "user", "content": "Why pack samples?"},
        {"role": "assistant", "content": "To fill each row with real tokens instead of padding."},
    ]
    print("== length ledger (one rendering, course tokenizer, chatml) ==")
    print(cl.measure_sample(tokenizer, chat))
    print(cl.summarize_length_distribution([64, 128, 300, 900], 128, 512))

    print("\n== packing plan: 10 lengths into rows of 256 (BFD, deterministic) ==")
    lengths = [200, 31, 120, 90, 60, 250, 16, 130, 70, 40]
    bins = cl.plan_packing(lengths, 256)
    for row, members in enumerate(bins):
        print(f"row {row}: samples {members} -> {sum(lengths[i] for i in members)} / 256 tokens")

    print("\n== token-budget microbatches on Agent RL §14's 512 lognormal lengths ==")
    agent_lengths = cl.agent_trajectory_lengths()
    order = cl.agent_trajectory_order()
    sorted_order = agent_lengths.argsort().tolist()
    plans = {
        "8 per microbatch, random": cl.fixed_count_batches(order.tolist(), 8),
        "8 per microbatch, sorted": cl.fixed_count_batches(sorted_order, 8),
        "token budget 128k, sorted": cl.token_budget_batches(agent_lengths, 131_072),
    }
    for name, batches in plans.items():
        print(cl.format_microbatch_summary(name, cl.describe_microbatches(agent_lengths, batches)))

    print("\n== throughput accounting (Agent RL §14.6: Qwen3-8B on an H200) ==")
    kv = cl.kv_bytes_per_token(cl.load_model_config("Qwen3-8B"))
    h200 = cl.load_hardware("H200")
    print(f"KV cache: {kv / 1e3:.0f} KB per token")
    for batch, context in [(64, 2048), (64, 16_384), (256, 16_384)]:
        rate = cl.decode_tokens_per_s(8.2e9, batch, context, kv, h200["memory_bandwidth"])
        print(f"decode, batch {batch:3d}, context {context:6d}: {rate:7.0f} tokens/s per GPU")
    decode_rate = cl.decode_tokens_per_s(8.2e9, 64, 16_384, kv, h200["memory_bandwidth"])
    hours = cl.gpu_hours_per_step(8.2e9, 512, 24_000, 6_000, decode_rate, h200["dense_flops"], 0.4, 0.5)
    print(" | ".join(f"{key} {value:.2f}" for key, value in hours.items()), "GPU-hours per step")


def write_samples(root: Path, inbox: Path) -> dict[str, list[str]]:
    """<student>_<chapter>.ipynb files: the solution, the untouched release, one wrong answer and one submission of
    correct alternatives per chapter."""
    from course_lib.instructor import build, cells

    wrong_answers = json.loads(WRONG_ANSWERS.read_text(encoding="utf-8"))
    right_answers = json.loads(RIGHT_ANSWERS.read_text(encoding="utf-8"))
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    students = {}
    for chapter_py in build.chapter_sources(root / "chapters"):
        chapter = chapter_py.stem
        source = root / "source" / chapter / f"{chapter}.ipynb"
        release = root / "release" / chapter / f"{chapter}.ipynb"
        shutil.copy2(source, inbox / f"sample-solution_{chapter}.ipynb")
        shutil.copy2(release, inbox / f"sample-blank_{chapter}.ipynb")
        students[chapter] = ["sample-solution", "sample-blank"]
        if chapter in wrong_answers:
            wrong = wrong_answers[chapter]
            solutions = {**cells.solution_cells(cells.read(source)), f"todo_{wrong['todo']}": wrong["source"]}
            student = f"sample-mutant-{wrong['name']}".replace("_", "-")
            cells.with_answers(release, solutions, inbox / f"{student}_{chapter}.ipynb")
            students[chapter].append(student)
        if chapter in right_answers:
            solutions = cells.solution_cells(cells.read(source))
            solutions.update({f"todo_{todo}": right["source"] for todo, right in right_answers[chapter].items()})
            cells.with_answers(release, solutions, inbox / f"sample-alternative_{chapter}.ipynb")
            students[chapter].append("sample-alternative")
    return students


def print_gradebook(run) -> None:
    from course_lib.instructor.outcome import Status

    print(f"\n{'chapter':<26} {'student':<44} {'score':>9}   cells")
    for outcome in sorted(run.outcomes, key=lambda o: (o.chapter or "", o.student or "")):
        if outcome.status != Status.GRADED:
            print(f"{outcome.chapter or '?':<26} {outcome.display:<44} {outcome.status}: {outcome.reason}")
            continue
        cells = " ".join(f"{c.grade_id}={c.score:g}/{c.max_score:g}" for c in outcome.cells)
        print(f"{outcome.chapter:<26} {outcome.student:<44} {outcome.score:>4g} / {outcome.max_score:<3g}  {cells}")


def surprises(run, wrong_todos: dict[str, str]) -> list[str]:
    """What the gradebook should not show: a solution or a submission of alternatives short of full marks, a blank
    release with a point, a wrong answer that keeps the points of every one of its TODO's own cells (a TODO's cells
    each grade one property: the wrong answer must lose at least one) or loses one of another TODO's (`wrong_todos`:
    chapter -> the TODO its wrong answer is for), a submission not graded."""
    from course_lib.instructor.cells import belongs_to_todo
    from course_lib.instructor.outcome import Status

    found = []
    for outcome in run.outcomes:
        who = f"{outcome.student}/{outcome.chapter}"
        if outcome.status != Status.GRADED:
            found.append(f"{who}: {outcome.status}")
            continue
        wrong_todo = wrong_todos.get(outcome.chapter, "")
        own = [cell for cell in outcome.cells if belongs_to_todo(cell.grade_id, wrong_todo)]
        loses_one = any(cell.score == 0 for cell in own)
        for cell in outcome.cells:
            if outcome.student in FULL_MARKS:
                expected = cell.max_score
            elif outcome.student == "sample-blank":
                expected = 0.0
            elif cell in own:
                expected = cell.score if loses_one else 0.0
            else:
                expected = cell.max_score
            if cell.score != expected:
                found.append(f"{who}: {cell.grade_id} scored {cell.score:g}, expected {expected:g}")
    return found


def main() -> int:
    from course_lib.instructor import build

    library_tour()
    print("\n== building the course ==")
    builds = build.build_course(build.NOTEBOOKS_DIR)
    for chapter in builds:
        print(f"{chapter.name:<28} {len(chapter.graded_cells)} graded cells, {chapter.points:.0f} points")
    print(
        "\n== grading sample submissions (course grade: each submission confined by bubblewrap, "
        "nbgrader's gradebook) =="
    )
    from course_lib.instructor import grade, report

    # Grade in a scratch copy of the built course: nbgrader refuses to rebuild a chapter whose gradebook holds
    # submissions, and the repository's notebooks/ must stay rebuildable.
    course = REPO / "build" / "demo" / "course"
    shutil.rmtree(course, ignore_errors=True)
    shutil.copytree(
        build.NOTEBOOKS_DIR,
        course,
        ignore=shutil.ignore_patterns(
            "submitted", "autograded", "feedback", "grades.csv", "grading_log.json", ".grading-*"
        ),
    )
    inbox = REPO / "build" / "demo" / "inbox"
    write_samples(course, inbox)
    run = grade.grade_submissions(inbox, course, force=True)
    print(report.summary(run))
    print_gradebook(run)
    wrong_answers = json.loads(WRONG_ANSWERS.read_text(encoding="utf-8"))
    wrong_todos = {chapter: answer["todo"] for chapter, answer in wrong_answers.items()}
    unexpected = surprises(run, wrong_todos)
    for line in unexpected:
        print(f"UNEXPECTED {line}")
    if not unexpected:
        print(
            "\nas expected: every solution and every submission of alternatives full marks, every blank release "
            "zero, each wrong answer losing exactly its own TODO's cells"
        )
    return 1 if unexpected else 0


if __name__ == "__main__":
    raise SystemExit(main())
