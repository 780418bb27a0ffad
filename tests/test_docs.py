"""Every command and example in README.md and docs/ runs as written and prints what the
page shows.

Pages hold two kinds of runnable examples:
- ```console blocks: `$ command` lines, each followed by its output. Commands run in order
  in one scratch directory per page (with samples/ and benchmarks/ of the checkout linked
  in); each must exit 0, unless the line ends in `# exit N`. Output is compared like a
  doctest with ELLIPSIS: `...` stands for any text. A fit (`hipipe calibrate` writing a
  topology) and what reads its output may differ in their numbers by 2 % (percentages by 0.3
  points): its last digits follow the machine's floating point (BLAS kernels), not the model.
- >>> examples (Python API), run with doctest in that same scratch directory.

Refresh the shown outputs after a deliberate change with `python tests/test_docs.py --update`.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
EXIT = re.compile(r"\s+# exit (\d+)$")
#: Commands that read the built-in layer profiles need ../shared beside the checkout.
SHARED_DATA = SHARED / "data" / "layer-profiles.json"
BUILTIN_PROFILE = re.compile(r"--profile (vgg16|resnet50|densenet201|bert_base|gpt2)\b")


def commands(text: str) -> list[tuple[str, int, str]]:
    """(command, expected exit code, expected output) of every console block, in order."""
    out = []
    for block in BLOCK.findall(text):
        current: list | None = None
        for line in block.splitlines():
            if line.startswith("$ "):
                cmd = line[2:]
                m = EXIT.search(cmd)
                code = int(m.group(1)) if m else 0
                current = [EXIT.sub("", cmd), code, []]
                out.append(current)
            elif current is not None:
                current[2].append(line)
    return [(c, code, "\n".join(lines)) for c, code, lines in out]


def scratch(tmp: Path) -> Path:
    """A working directory where the pages' relative paths resolve as in the checkout, with
    ../shared beside it."""
    work = tmp / "checkout"
    work.mkdir(exist_ok=True)
    for name in ("samples", "benchmarks"):
        link = work / name
        if not link.exists():
            link.symlink_to(REPO / name)
    if not (tmp / "shared").exists():
        (tmp / "shared").symlink_to(SHARED)
    return work


#: The file a documented command writes (`-o FILE`, `--output FILE`).
OUTPUT = re.compile(r"(?:^|\s)(?:-o|--output)\s+(\S+)")


def run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "COLUMNS": "120"}
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def shown(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line.rstrip() for line in (done.stdout + done.stderr).rstrip("\n").splitlines())


def matches(expected: str, got: str) -> bool:
    checker = doctest.OutputChecker()
    return checker.check_output(expected.rstrip() + "\n", got.rstrip() + "\n", doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)


#: A number as the CLI prints it (thousands separated by commas).
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def close(expected: str, got: str, rel: float = 0.02, points: float = 0.3) -> bool:
    """The same words, with numbers within `rel` of each other (percentages within `points`)."""
    want, have = expected.split(), got.split()
    if len(want) != len(have):
        return False
    for a, b in zip(want, have):
        if a == b:
            continue
        if NUMBER.sub("#", a) != NUMBER.sub("#", b):
            return False
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
            x, y = float(x.replace(",", "")), float(y.replace(",", ""))
            if abs(x - y) > (points if a.endswith("%") else rel * max(abs(x), abs(y))):
                return False
    return True


def fitted(cmd: str, fits: set[str]) -> bool:
    """Whether a command fits a topology, or reads one that a fit on this page wrote."""
    words = cmd.split()
    return words[:2] == ["hipipe", "calibrate"] and "--check" not in words or any(f in words for f in fits)


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


CONSOLE_PAGES = [p for p in PAGES if commands(p.read_text())]
PYTHON_PAGES = [p for p in PAGES if ">>> " in p.read_text()]


@pytest.mark.slow
@pytest.mark.parametrize("page", CONSOLE_PAGES, ids=page_id)
def test_console_examples_run_as_written(page, tmp_path):
    cwd = scratch(tmp_path)
    skipped = []
    missing: set[str] = set()  # what the skipped commands would have written: later commands reading it skip too
    fits: set[str] = set()  # what the fits wrote
    for cmd, code, expected in commands(page.read_text()):
        if ((BUILTIN_PROFILE.search(cmd) and not SHARED_DATA.is_file()) or ("../shared/" in cmd and not SHARED.is_dir())
                or any(name in cmd.split() for name in missing)):
            skipped.append(cmd)
            missing.update(OUTPUT.findall(cmd))
            continue
        done = run(cmd, cwd)
        assert done.returncode == code, f"{page_id(page)}: `{cmd}` exited {done.returncode}, expected {code}\n{done.stderr}"
        fit = fitted(cmd, fits)
        if fit:
            fits.update(OUTPUT.findall(cmd))
        assert matches(expected, shown(done)) or fit and close(expected, shown(done)), \
            f"{page_id(page)}: `{cmd}` printed\n{shown(done)}\n---expected---\n{expected}"
    if skipped:
        pytest.skip(f"{page_id(page)}: the other commands ran as shown; skipped {len(skipped)} that read "
                    f"{SHARED}, absent beside this clone")


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=page_id)
def test_python_examples_run_as_written(page, tmp_path, monkeypatch):
    text = page.read_text()
    monkeypatch.chdir(scratch(tmp_path))
    parser = doctest.DocTestParser()
    test = parser.get_doctest(text, {"__name__": "docs"}, page_id(page), str(page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} Python example(s) of {page_id(page)} failed (see the output above)"


def test_a_fit_may_differ_in_its_last_digits_only():
    assert close("nvlink bandwidth 370.8 385 fitted; error +3.2%", "nvlink bandwidth 370.8 382.6 fitted; error +3.1%")
    assert not close("nvlink bandwidth 385 fitted", "nvlink bandwidth 370 fitted")
    assert not close("error +3.2%", "error +3.9%")
    assert not close("nvlink bandwidth 385 fitted", "nvlink bandwidth 385 default kept")
    assert not close("size 8B", "size 8KiB")
    assert fitted("hipipe calibrate a.log -o x.yaml", set()) and not fitted("hipipe calibrate --check t a.log", set())
    assert fitted("hipipe topo x.yaml", {"x.yaml"}) and not fitted("hipipe topo y.yaml", {"x.yaml"})


def test_every_page_has_runnable_examples():
    docs = [p for p in PAGES if p.parent.name == "docs"]
    assert {p.name for p in docs} >= {"user-guide.md", "deployment.md", "python-api.md"}
    for page in docs:
        text = page.read_text()
        assert commands(text) or ">>> " in text, f"{page_id(page)} has nothing the tests can run"


def update(pages: list[Path]) -> None:
    """Rewrite each console block's outputs with what the commands print now."""
    import tempfile
    for page in pages:
        text = page.read_text()
        with tempfile.TemporaryDirectory() as tmp:
            cwd = scratch(Path(tmp))

            def fill(match: re.Match) -> str:
                lines = []
                for cmd, code, _ in commands(match.group(0) + "\n"):
                    done = run(cmd, cwd)
                    if done.returncode != code:
                        raise SystemExit(f"{page_id(page)}: `{cmd}` exited {done.returncode}:\n{done.stderr}")
                    suffix = f"  # exit {code}" if code else ""
                    lines += [f"$ {cmd}{suffix}", *([shown(done)] if shown(done) else [])]
                return "```console\n" + "\n".join(lines) + "\n```"

            text = BLOCK.sub(lambda m: fill(m), text)
        page.write_text(text)
        print(f"updated {page_id(page)}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--update"]:
        raise SystemExit("usage: python tests/test_docs.py --update [PAGE ...]")
    update([Path(p).resolve() for p in sys.argv[2:]] or PAGES)
