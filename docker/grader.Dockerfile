# The image `course grade --sandbox container --image course-grader` runs each submission in: the course package and
# its pinned CPU stack, nothing of the course root. Build it from the repository root:
#   docker build -t course-grader -f docker/grader.Dockerfile .      (or: podman build ...)
# The grader starts `python -m course_lib.instructor.execute` and `python -m course_lib.grading.checker` in it, as user 65534,
# with --network none, --read-only and a tmpfs HOME (course_lib/instructor/sandbox.py).
FROM python:3.11-slim
WORKDIR /opt/course
COPY pyproject.toml README.md ./
COPY course_lib ./course_lib
COPY benchmarks ./benchmarks
# torch first and pinned, from the CPU index: an open range pulls a multi-GB CUDA build
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -r course_lib/data/environments/PT-CPU/requirements.txt \
 && pip install --no-cache-dir --no-deps . \
 && python -c "import course_lib, course_lib.grading.checker, course_lib.instructor.execute; course_lib.load_course_tokenizer()"
ENV PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
