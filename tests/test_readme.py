"""The README's Python example runs and prints what the README says it prints."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_python_example_runs_and_prints_what_the_readme_claims(tmp_path, monkeypatch):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    claimed = re.search(r"prints `([^`]*)`", text).group(1)
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(blocks[0], "README.md", "exec"), {})
    assert buf.getvalue().strip() == claimed
    assert (tmp_path / "out/api/trace.json").exists() and (tmp_path / "out/api/timeline.png").exists()
