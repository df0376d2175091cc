"""Every example in README.md and docs/**/*.md runs as written, so none can go stale.

Each page's fenced blocks run in order in a directory of their own that holds copies of the
repository's data folders (profiles/, topologies/, experiments/), so the examples read as a user
types them at the repository root and their outputs (and `experiment run`'s rewrites) stay out
of the checkout:

- ```sh blocks run line by line under bash: `syncopate` and `cargo run --release --` run
  conftest.syncopate_bin(), `python` runs this interpreter, `torchrun` runs
  torch.distributed.run on a free port; other commands run as written. Every line must exit 0.
- ```python blocks whose first line is `# NAME.py: ...` are written to NAME.py for a later line
  of the page to run (and one must); other ```python blocks run as scripts.
- A fence whose info string carries a tag of NOT_RUN (```sh needs-lab) is not run: it needs
  what CI lacks. Its `syncopate SUB --flag` uses are checked against `syncopate SUB --help`
  instead, as are those of every run block and of every inline `syncopate ... --flag` span.
- Other fences (```json, ```text, a bare ```) are left alone.
"""

import atexit
import functools
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

import conftest

REPO = conftest.REPO
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Why a fence with this tag is not run here.
NOT_RUN = {
    "needs-lab": "root and an emulated cluster (syncopate lab) for minutes",
    "needs-mpi": "a build with --features mpi, started under mpirun",
    "needs-gpu": "an NVIDIA GPU",
    "long": "takes many minutes on 2 cores in a debug build",
    "install": "builds or installs software on this machine",
}
# Lines of run blocks that are not run, and why.
SKIPPED_LINES = {"./test": "the whole test suite, of which this test is a part"}
# What a page's working directory holds: copies, so that examples may write into them.
DATA = ("profiles", "topologies", "experiments")
LINE_TIMEOUT_S = 600
# A fence's language written another way runs nowhere: refuse it rather than skip it.
SPELLED_OTHERWISE = {"bash": "sh", "shell": "sh", "console": "sh", "zsh": "sh", "py": "python", "python3": "python"}

PRELUDE = r"""
set -eo pipefail
syncopate() { "$DOCS_SYNCOPATE" "$@"; }
python() { "$DOCS_PYTHON" "$@"; }
python3() { "$DOCS_PYTHON" "$@"; }
torchrun() { "$DOCS_PYTHON" -m torch.distributed.run --master-port "$DOCS_PORT" "$@"; }
cargo() {
    if [ "$1 $2 $3" = "run --release --" ]; then shift 3; "$DOCS_SYNCOPATE" "$@"; return; fi
    echo "docs test: only 'cargo run --release -- ...' runs here; put '$*' in a not-run fence" >&2; return 90
}
sudo() { echo "docs test: '$*' needs root: put it in a 'needs-lab' fence" >&2; return 90; }
pip() { echo "docs test: '$*' installs software: put it in an 'install' fence" >&2; return 90; }
"""


class Block:
    def __init__(self, page, line, lang, tags, code):
        self.page, self.line, self.lang, self.tags, self.code = page, line, lang, tags, code

    def where(self):
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def not_run(self):
        return [tag for tag in self.tags if tag in NOT_RUN]


def blocks(page):
    """The fenced blocks of a page, in order."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^(`{3,})(.*)$", lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group(1), opening.group(2).split()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence) and not lines[j].strip("`")), None)
        assert end is not None, f"{page.relative_to(REPO)}:{i + 1}: fence never closed"
        found.append(Block(page, i + 1, info[0] if info else "", info[1:], "\n".join(lines[i + 1:end]) + "\n"))
        i = end + 1
    return found


def commands(code):
    """The command lines of a shell block: continuations joined, comments and blanks dropped."""
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            lines.append(line.strip())
    return lines


def named_script(block):
    """NAME.py for a python block that begins `# NAME.py: ...`, else None."""
    first = re.match(r"#\s*([\w.-]+\.py):", block.code)
    return first.group(1) if first else None


# --- what `syncopate SUB --flag` may say ------------------------------------------------------

@functools.lru_cache(maxsize=None)
def help_text(path):
    done = subprocess.run([str(conftest.syncopate_bin()), *path, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"syncopate {' '.join(path)} --help failed: {done.stderr}"
    return done.stdout


def subcommands(path):
    text = help_text(path)
    if "\nCommands:\n" not in text:
        return set()
    section = text.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
    return {line.split()[0] for line in section.splitlines() if line.strip()}


def invocations(words):
    """The argument lists of every syncopate invocation among the words of a command line:
    `syncopate`, a path ending in /syncopate, or `cargo run --release --`, each up to the next."""
    starts = []
    for i, word in enumerate(words):
        if word == "syncopate" or word.endswith("/syncopate"):
            starts.append((i, i + 1))
        elif words[i:i + 4] == ["cargo", "run", "--release", "--"]:
            starts.append((i, i + 4))
    return [words[first:(starts[k + 1][0] if k + 1 < len(starts) else len(words))]
            for k, (_, first) in enumerate(starts)]


def check_invocation(args, where):
    """The subcommand path of ARGS exists and every --flag before a bare `--` is in its help."""
    words = [w.strip("[]()") for w in args]
    assert words and words[0] in subcommands(()), f"{where}: `syncopate {' '.join(args)}`: no such subcommand"
    path = ()
    for word in words:
        if word in subcommands(path):
            path += (word,)
        else:
            break
    for word in words[len(path):]:
        if word == "--":
            break
        flag = re.match(r"\[?(--[a-z][a-z0-9-]*)", word)
        if flag and not re.search(rf"(?<![\w-]){re.escape(flag.group(1))}(?![\w-])", help_text(path)):
            pytest.fail(f"{where}: `syncopate {' '.join(path)}` has no {flag.group(1)} (see its --help)")


def shell_words(line):
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.split()


def check_flags(page):
    for block in blocks(page):
        if block.lang == "sh":
            for line in commands(block.code):
                for args in invocations(shell_words(line)):
                    check_invocation(args, block.where())
    # Inline spans that name flags, such as `syncopate validate --plan P --measured TRACE`.
    prose = re.sub(r"^(`{3,}).*?^\1\s*$", "", page.read_text(), flags=re.M | re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if re.match(r"(syncopate|cargo run --release --) ", span) and " --" in span:
            for args in invocations(span.replace("\\|", "|").split()):
                check_invocation(args, f"{page.relative_to(REPO)}: `{span}`")


# --- running a page ---------------------------------------------------------------------------

def run_line(line, cwd, where):
    env = dict(os.environ, DOCS_SYNCOPATE=str(conftest.syncopate_bin()), DOCS_PYTHON=sys.executable,
               DOCS_PORT=str(conftest.free_port()), SYNCOPATE_BIN=str(conftest.syncopate_bin()))
    done = subprocess.run(["bash", "-c", PRELUDE + line], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=LINE_TIMEOUT_S)
    assert done.returncode == 0, (f"{where}: `{line}` exited {done.returncode}\n"
                                  f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-3000:]}")


def runs_something(page):
    return any(b.lang in ("sh", "python") and not b.not_run() for b in blocks(page))


@functools.lru_cache(maxsize=None)
def run_page(relative):
    """Runs the examples of the page at RELATIVE (to the repository root); returns the directory
    they ran in, with what they wrote. Each page runs once per session."""
    page = REPO / relative
    work = pathlib.Path(tempfile.mkdtemp(prefix="syncopate-docs-"))
    atexit.register(shutil.rmtree, work, True)
    for name in DATA:
        shutil.copytree(REPO / name, work / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    scripts, ran = {}, []
    for block in blocks(page):
        lang = block.lang
        assert lang not in SPELLED_OTHERWISE, f"{block.where()}: write ```{SPELLED_OTHERWISE[lang]}, not ```{lang}"
        if lang not in ("sh", "python"):
            continue
        unknown = [tag for tag in block.tags if tag not in NOT_RUN]
        assert not unknown, f"{block.where()}: unknown fence tag {unknown}; known: {sorted(NOT_RUN)}"
        if lang == "python":
            compile(block.code, block.where(), "exec")
            if block.not_run():
                continue
            name = named_script(block)
            if name:
                (work / name).write_text(block.code)
                scripts[name] = block.where()
            else:
                (work / "block.py").write_text(block.code)
                run_line("python block.py", work, block.where())
            continue
        if block.not_run():
            continue
        for line in commands(block.code):
            if line in SKIPPED_LINES:
                continue
            run_line(line, work, block.where())
            ran.append(line)
    for name, where in scripts.items():
        # Run as a script (`python train.py`) or imported as a module (`--module mymodels:make`).
        used = rf"(?<![\w.-]){re.escape(name[:-3])}(\.py\b|:)"
        assert any(re.search(used, line) for line in ran), f"{where}: {name} is written but no line of the page uses it"
    return work


def pages_with_runs():
    return [p for p in PAGES if runs_something(p)]


@pytest.mark.parametrize("page", pages_with_runs(), ids=lambda p: str(p.relative_to(REPO)))
def test_page_examples_run(page):
    run_page(str(page.relative_to(REPO)))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_commands_on_page_exist_with_their_flags(page):
    check_flags(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_fences_say_how_they_run(page):
    """A shell or Python fence is spelled ```sh or ```python, and a tag says why it is not run."""
    for block in blocks(page):
        assert block.lang not in SPELLED_OTHERWISE, \
            f"{block.where()}: write ```{SPELLED_OTHERWISE[block.lang]}, not ```{block.lang}"
        unknown = [tag for tag in block.tags if tag not in NOT_RUN]
        assert not unknown, f"{block.where()}: unknown fence tag {unknown}; known: {sorted(NOT_RUN)}"


# --- links and the README's shape -------------------------------------------------------------

def anchors(page):
    """GitHub's heading anchors of a page."""
    prose = re.sub(r"^(`{3,}).*?^\1\s*$", "", page.read_text(), flags=re.M | re.S)
    found = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", prose, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_lead_somewhere(page):
    prose = re.sub(r"^(`{3,}).*?^\1\s*$", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(REPO)}: link to {target}: no such file"
        if anchor:
            assert anchor in anchors(linked), f"{page.relative_to(REPO)}: link to {target}: no such heading"


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (REPO / "README.md").read_bytes()
    assert len(text) < 10 * 1024, f"README.md is {len(text)} bytes; move detail to docs/guide/"
    assert text.startswith(b"```sh\ncargo run --release -- simulate --model resnet50 --cluster v100-10gbe "
                           b"--nodes 4 --strategy horovod\n./test\n```\n")
