"""The docs hold together: every relative link in the README and docs/ resolves (to a file, and
to a heading where it names one), the README stays a door, and every benchmark script is named
beside its figures in docs/benchmarks.md."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"(?m)^#+\s+(.*)$", path.read_text())
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_every_relative_link_resolves():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not followed offline
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_check_itself_sees_a_broken_link(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n[x](missing.md) [y](#title) [z](#nowhere)\n")
    found = [t for t in LINK.findall(doc.read_text())]
    assert found == ["missing.md", "#title", "#nowhere"]
    assert "title" in anchors(doc) and "nowhere" not in anchors(doc)


def test_the_readme_is_a_door():
    text = (ROOT / "README.md").read_text()
    assert len(text) <= 8000, f"README.md is {len(text)} characters: move the manual to docs/"
    assert "bash start.sh" in text and "bash test.sh" in text


def test_every_benchmark_script_is_named_in_the_benchmarks_doc():
    named = (ROOT / "docs" / "benchmarks.md").read_text()
    scripts = [p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh")
               and p.name != "bench_results.py"]  # the shared writer of result files
    missing = [s for s in scripts if f"bench/{s}" not in named]
    assert not missing, f"bench scripts not named in docs/benchmarks.md: {missing}"
