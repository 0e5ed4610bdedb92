"""The README's examples run and print what the README says they print.

(``trainsim compare experiments/schedules.toml``'s quoted table is checked in
``tests/test_experiment_files.py::test_schedules_example``, which has it at hand; the
quickstart's ``trainsim demo`` takes minutes and is checked by hand.)"""

import contextlib
import io
import re
from pathlib import Path

from sim.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_examples(text: str) -> list[tuple[str, str]]:
    """Each ```python block with the output the README claims for it: ``prints `...` ``
    right after the block, or ``prints`` and a fenced block."""
    pairs = re.findall(r"```python\n(.*?)```\n\nprints(?: `([^`]*)`|\n\n```\n(.*?)```)", text, re.S)
    return [(code, inline or block) for code, inline, block in pairs]


def test_python_examples_run_and_print_what_the_readme_claims(tmp_path, monkeypatch):
    text = README.read_text()
    examples = _python_examples(text)
    assert len(examples) == len(re.findall(r"```python\n", text)) == 3
    monkeypatch.chdir(tmp_path)
    for code, claimed in examples:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, "README.md", "exec"), {})
        assert buf.getvalue().strip() == claimed.strip()
    assert (tmp_path / "out/api/trace.json").exists() and (tmp_path / "out/api/timeline.png").exists()
    for name in ("summary.json", "trace.json", "timeline.png", "memory.png"):
        assert (tmp_path / "out/zb-h1" / name).stat().st_size > 0


def test_quoted_trainsim_run_output_is_what_it_prints_today():
    text = README.read_text()
    block = re.search(r"```\ntrainsim run \[FILE\.toml\] (.*?)```", text, re.S).group(1)
    flags = " ".join(line.strip().rstrip("\\") for line in block.splitlines())
    argv = [a for a in re.sub(r"\[[^\]]*\]", " ", flags).split()]
    assert argv[:2] == ["--model", "gpt3-175b"], argv
    claimed = re.search(r"simulates one iteration .*? prints:\n\n```\n(.*?)```", text, re.S).group(1)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["run", *argv]) == 0
    assert buf.getvalue().strip() == claimed.strip()


def test_quoted_experiment_file_is_the_example_without_its_comments():
    import tomllib

    text = README.read_text()
    block = re.search(r"This is `experiments/schedules.toml` without its\ncomments:\n\n```toml\n(.*?)```", text,
                      re.S).group(1)
    example = README.parent / "experiments" / "schedules.toml"
    assert tomllib.loads(block) == tomllib.loads(example.read_text())
