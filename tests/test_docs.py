"""The README and docs/ stay true: quoted outputs are what the commands print today.

Every command output quoted in README.md and docs/*.md is a marked block that
``experiments/regen_docs.py`` regenerates by running it; here every block not marked
``slow`` is run and compared with what the page quotes. The README stays short, every
relative link and ``#anchor`` resolves, and the drift check is shown to catch a number
edited by hand.
"""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("regen_docs", ROOT / "experiments" / "regen_docs.py")
regen = importlib.util.module_from_spec(_spec)
sys.modules["regen_docs"] = regen
_spec.loader.exec_module(regen)

DOCS = regen.documents()
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_at_most_300_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines; move detail into docs/"


def _links(path: Path) -> list[str]:
    """Relative link targets of a Markdown file, outside fenced blocks and inline code."""
    out, fence = [], False
    for line in path.read_text().splitlines():
        if regen.FENCE.match(line):
            fence = not fence
            continue
        if not fence:
            out += [t for t in LINK.findall(re.sub(r"`[^`]*`", "", line)) if not re.match(r"[a-z]+:", t)]
    return out


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in _links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md":
            anchors = {a for _, _, a in regen.headings(dest.read_text().splitlines())}
            if anchor not in anchors:
                broken.append(f"{target} (no heading with anchor #{anchor})")
    assert broken == [], f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_no_page_keeps_a_placeholder_for_text_still_to_write():
    # a whole line of capitals and underscores (H100_PLACEHOLDER) is a marker someone meant to
    # replace; prose never is one
    marker = re.compile(r"^[A-Z0-9]+(_[A-Z0-9]+)+$")
    left = [f"{p.relative_to(ROOT)}:{i}" for p in DOCS for i, line in enumerate(p.read_text().splitlines(), 1)
            if marker.match(line.strip())]
    assert left == []


def test_every_page_is_reached_from_the_index_and_has_a_table_of_contents():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
        if page.name not in ("settings.md", "architecture.md"):
            assert "<!-- toc -->" in page.read_text(), f"{page.name} has no table of contents"


def test_every_picture_in_docs_img_is_used():
    used = {(p.parent / t).resolve() for p in DOCS for t in _links(p)}
    unused = [p.name for p in sorted((ROOT / "docs" / "img").iterdir()) if p.resolve() not in used]
    assert unused == []


def test_quoted_outputs_are_what_the_commands_print():
    # Every block not marked slow, run for real; tables of contents too.
    drift = regen.regenerate(DOCS, check=True, quick=True, images=False, log=lambda *a: None)
    assert drift == [], "\n\n".join(drift) + "\n\nrun: python experiments/regen_docs.py"


def test_every_page_quotes_at_least_one_run_and_few_are_slow():
    blocks = [b for p in DOCS for b in regen.find_blocks(p)]
    assert [b for b in blocks if b.slow], "the demo is quoted as a slow block"
    assert len([b for b in blocks if b.slow]) <= 5  # the demo, the MoE fit rows, a 128-GPU FP8 run, strong
    # scaling, the NVL72 experiment
    assert {b.path.name for b in blocks} >= {"README.md", "cli.md", "python-api.md", "search.md"}


def test_every_command_block_is_run_or_says_why_not():
    # A fenced block of commands or Python code is a marked block the harness runs, or is
    # marked `<!-- not run: REASON -->` (issue 54: README's "Choose a plan" steps had
    # neither, and two of them failed as written).
    assert [x for p in DOCS for x in regen.unmarked_blocks(p)] == []


def test_the_readme_plan_steps_are_run_as_written():
    blocks = {b.command.split()[1]: b for b in regen.find_blocks(ROOT / "README.md") if b.command.startswith("trainsim ")}
    assert "--nodes 2" in blocks["estimate"].command and "--nodes 2" in blocks["search"].command
    assert "--schedules 1f1b,interleaved,zb-h2" in blocks["compare"].command
    assert not any(b.slow for b in blocks.values())


def test_an_unmarked_command_block_is_named_and_a_reason_is_required(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# P\n\n```sh\ntrainsim estimate --nodes 2\n```\n\n<!-- not run: a synopsis -->\n```\n"
                    "trainsim run [FILE]\n```\n\n<!-- not run: -->\n```python\nimport sim\n```\n\n"
                    "```toml\n[plan]\n```\n")
    assert regen.unmarked_blocks(page) == [f"{page}:3: trainsim estimate --nodes 2", f"{page}:13: import sim"]


def test_a_run_that_does_not_fit_says_so_in_the_text_after_it():
    # The quoted `trainsim run` outputs that end DOES NOT FIT (Mixtral, context parallelism)
    # are followed by a paragraph saying the plan does not fit, and only those are.
    seen = 0
    for page in DOCS:
        lines = page.read_text().split("\n")
        for b in regen.find_blocks(page):
            if not b.command.startswith("trainsim run "):
                continue
            after = "\n".join(lines[b.end + 1:]).strip().split("\n\n")[0]
            assert ("DOES NOT FIT" in b.quoted) == ("not fit" in after), f"{b.where}: {after[:200]}"
            seen += "DOES NOT FIT" in b.quoted
    assert seen >= 2


# ----------------------------------------------------------- the drift check itself
PAGE = """# A page

<!-- toc -->

## Estimate

<!-- run: trainsim estimate --model llama2-7b --gpu h100-sxm --gpus 8 --tensor-model-parallel-size 2 --global-batch-size 8
lines: 1-3, 14-
-->
```
```

## An error

<!-- run: trainsim estimate --model no-such-model
exit: 2
-->
```
```
"""


def test_drift_check_fails_when_a_quoted_number_is_edited_by_hand(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    assert regen.regenerate([page], check=False, quick=True, log=lambda *a: None) != []   # filled in
    text = page.read_text()
    assert "- [Estimate](#estimate)" in text and "$ trainsim estimate --model llama2-7b" in text
    assert "trainsim: error: --model" in text and "\n...\n" in text
    assert regen.regenerate([page], check=True, quick=True, log=lambda *a: None) == []  # and stable
    # edit one digit of the quoted tokens/s by hand: the check names the page and the block
    m = re.search(r"tokens/s (\d)", text)
    digit = m.group(1)
    edited = text[:m.start(1)] + str((int(digit) + 1) % 10) + text[m.end(1):]
    page.write_text(edited)
    drift = regen.regenerate([page], check=True, quick=True, log=lambda *a: None)
    marker = edited.split("\n").index(next(x for x in edited.split("\n") if x.startswith("<!-- run: trainsim estimate"))) + 1
    assert len(drift) == 1 and drift[0].startswith(f"{page}:{marker}: `trainsim estimate --model llama2-7b")
    assert re.search(r"^-tokens/s \d", drift[0], re.M) and re.search(r"^\+tokens/s \d", drift[0], re.M)
    assert page.read_text() == edited                                  # --check writes nothing
    assert regen.main(["--check", str(page)]) == 1


def test_masks_and_kept_lines_are_written_the_same_every_time():
    block = regen.Block(Path("p.md"), 1, "trainsim search --x 1",
                        {"mask": [r"in ([0-9.]+) s$"], "lines": "1, 3-"})
    out = "12 plans simulated in 9.2 s\nskipped\nkept\nlast line   \n\n"
    assert regen.format_output(block, out) == "$ trainsim search --x 1\n12 plans simulated in … s\n...\nkept\nlast line"
    assert regen.format_output(block, out.replace("9.2", "22.6")) == regen.format_output(block, out)


def test_a_marker_without_its_output_block_is_a_clear_error(tmp_path):
    page = tmp_path / "bad.md"
    page.write_text("<!-- run: trainsim --help -->\n\nno block here\n")
    with pytest.raises(regen.MarkerError, match=r"bad.md:1: the marker is not followed by a fenced block"):
        regen.find_blocks(page)
    page.write_text("<!-- run: trainsim --help\nshow: output\nmaks: x\n-->\n```\n```\n")
    with pytest.raises(regen.MarkerError, match=r"unknown option 'maks: x'"):
        regen.find_blocks(page)


def test_long_commands_are_wrapped_before_a_flag():
    cmd = "trainsim run " + " ".join(f"--flag-number-{i} {i}" for i in range(12))
    lines = regen.wrap_command(cmd).split("\n")
    assert all(len(line) <= regen.WIDTH for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1]) and all(l.startswith("    --") for l in lines[1:])
    assert " ".join(line.rstrip("\\").strip() for line in lines) == "$ " + cmd


def _pct_range(xs) -> str:
    lo, hi = (f"{v * 100:+.1f}" for v in (min(xs), max(xs)))
    return (f"{lo}%" if lo == hi else f"{lo} to {hi}%").replace("-", "−")


def test_the_readme_accuracy_table_quotes_the_fit_reports():
    # Every row of README's accuracy table (previous preset, fitted, held out) is the range over one or
    # more of a committed fit report's groups of that GPU and framework, with as many rows; the
    # headline held-out means and the presets' fitted values are the reports'.
    import itertools
    import json

    reports = {"H100": "h100-sxm-fit-report-2026-12-07-mla-fp8.json", "A100": "a100-80gb-fit-report-2026-12-06-night.json"}
    # the H100's held-out errors are those of the same fit held out again with the corrected held-out fits
    held_out = {"H100": "h100-sxm-fit-report-2026-12-08-held-out.json"}
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (H100|A100) \| ([a-z-]+): [^|]* \((?:\d+ groups, )?(\d+)\) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$",
                      readme, re.M)
    assert len(rows) == 14
    for gpu, file in reports.items():
        rep = json.loads((ROOT / "experiments" / "fit-cache" / file).read_text())
        if gpu in held_out:
            again = json.loads((ROOT / "experiments" / "fit-cache" / held_out[gpu]).read_text())
            fitted = {p["name"]: p["fitted"] for p in rep["parameters"]}  # the same fit, from its preset's values
            assert {p["name"]: pytest.approx(fitted[p["name"]], abs=5e-7) for p in again["parameters"]} == fitted
            where = {(r.get("file"), r["line"]): r["held_out_error"] for r in again["rows"]}
            rep["rows"] = [{**r, "held_out_error": where[(r.get("file"), r["line"])]} for r in rep["rows"]]
            rep["by_gpu"] = again["by_gpu"]
        by_group = {g["id"]: [r for r in rep["rows"] if r["group"] == g["id"]] for g in rep["groups"]}
        frameworks = {g["id"]: g["framework"] for g in rep["groups"]}
        mine = [r for r in rows if r[0] == gpu]
        assert sum(int(r[2]) for r in mine) == rep["row_count"]
        for _, framework, n, *cells in mine:
            ids = [g for g in by_group if frameworks[g] == framework]
            found = any(
                len(rs) == int(n) and [c.strip() for c in cells] == [
                    _pct_range([r[key] for r in rs]) for key in ("initial_error", "fitted_error", "held_out_error")]
                for k in range(1, len(ids) + 1) for pick in itertools.combinations(ids, k)
                for rs in [[r for g in pick for r in by_group[g]]])
            assert found, (gpu, framework, n, cells)
        loo = rep["by_gpu"][rep["gpu"]]
        assert (f"{gpu} {loo['loo_mean_abs_error'] * 100:.1f}% over {rep['row_count']} rows (max "
                f"{loo['loo_max_abs_error'] * 100:.1f}%)") in " ".join(readme.replace("**", "").split())
        profile = json.loads((ROOT / "sim" / "profiles" / f"{rep['gpu']}.json").read_text())
        for p in rep["parameters"]:
            assert profile[p["name"]] == pytest.approx(p["fitted"], abs=5e-7), p["name"]


def test_the_readme_moe_sentence_quotes_the_checked_summary():
    blocks = [b for b in regen.find_blocks(ROOT / "docs" / "accuracy.md") if "moe_runs.csv" in b.command]
    m = re.search(r"^h100-sxm, automodel: 4 rows, mean \|error\| [\d.]+%, ([-+][\d.]+)% to ([-+][\d.]+)%$",
                  blocks[0].quoted, re.M)
    low, high = float(m[1]), float(m[2])

    def said(error: float) -> str:  # -22.8 -> "23% fast", +6.9 -> "7% slow"
        return f"{round(abs(error))}% {'fast' if error < 0 else 'slow'}"

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"come out between {said(low)} and {said(high)}" in readme
