"""No document points to a file that is not in the repository.

Checked in README.md and docs/*.md:
- every relative markdown link `[text](path)` outside fenced code blocks resolves to a file or folder inside the
  repository, and its `#anchor`, when it has one and points into a markdown file, names a heading of that file;
- every word of inline code and of fenced code blocks that is a plain repository path (one of the top-level
  folders below, then only letters, digits and `_./-`: no placeholders) names a file or folder that exists.
"""
import pathlib
import re
import shutil

REPO = pathlib.Path(__file__).resolve().parents[2]
TOP_LEVEL = ("autohet_ray", "jobs", "benchmarks", "tests", "docs")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"(?:%s)/[A-Za-z0-9_./-]*" % "|".join(TOP_LEVEL))
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
WORD_BREAK = re.compile(r"[\s\"'()=,;:\[\]]+")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def documents(root: pathlib.Path) -> list[pathlib.Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: pathlib.Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def references(doc: pathlib.Path) -> list[tuple[str, str]]:
    """(kind, target) of every relative link and backticked repository path in `doc`."""
    full = doc.read_text()
    text = FENCE.sub("", full)
    refs = [("link", m.group(1)) for m in LINK.finditer(text) if not SCHEME.match(m.group(1))]
    code = [m.group(1) for m in CODE_SPAN.finditer(LINK.sub("", text))] + FENCE.findall(full)
    words = [w for span in code for w in WORD_BREAK.split(span)]
    return refs + [("path", w) for w in words if REPO_PATH.fullmatch(w)]


def problem(root: pathlib.Path, doc: pathlib.Path, kind: str, target: str) -> str | None:
    """Why `target` (found in `doc`) does not resolve, or None when it does."""
    path_part, _, anchor = target.partition("#")
    base = root if kind == "path" else doc.parent
    resolved = (base / path_part).resolve() if path_part else doc
    if not resolved.is_relative_to(root.resolve()):
        return f"{target!r} points outside the repository"
    if not resolved.exists():
        return f"{target!r} does not exist"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target!r}: no heading #{anchor} in {resolved.name}"
    return None


def check(root: pathlib.Path) -> tuple[int, list[str]]:
    """(number of references checked, every broken one as 'doc: why')."""
    checked, broken = 0, []
    for doc in documents(root):
        for kind, target in references(doc):
            checked += 1
            why = problem(root, doc, kind, target)
            if why:
                broken.append(f"{doc.relative_to(root)}: {why}")
    return checked, broken


def test_every_link_and_repo_path_in_the_docs_resolves():
    checked, broken = check(REPO)
    assert broken == []
    assert checked >= 100, f"only {checked} references found: is the parser still reading the docs?"


def test_the_readme_links_every_document_and_stays_short():
    readme = (REPO / "README.md").read_text()
    docs = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert {"design.md", "planner.md", "training.md", "recovery.md", "ray.md", "benchmarks.md"} <= set(docs)
    assert [d for d in docs if f"(docs/{d}" not in readme] == []
    assert len(readme.splitlines()) <= 150


def test_a_broken_link_anchor_or_path_is_reported(tmp_path):
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.py").write_text("")
    (tmp_path / "README.md").write_text(
        "# Top\n\n[fine](docs/design.md#glossary) [fine too](#top) `jobs/train.py`\n"
        "[gone](docs/missing.md) [bad anchor](docs/design.md#no-such-heading) `jobs/nothing.yaml`\n"
        "[outside](../../etc/passwd)\n```\n[in a code block](ignored.md)\npython jobs/absent.py jobs/<name>.yaml\n```\n")
    checked, broken = check(tmp_path)
    readme_broken = [b for b in broken if b.startswith("README.md")]
    assert readme_broken == ["README.md: 'docs/missing.md' does not exist",
                             "README.md: 'docs/design.md#no-such-heading': no heading #no-such-heading in design.md",
                             "README.md: '../../etc/passwd' points outside the repository",
                             "README.md: 'jobs/nothing.yaml' does not exist",
                             "README.md: 'jobs/absent.py' does not exist"]
    assert checked > len(readme_broken)


def test_slugs_follow_github():
    assert slug("Exit paths and guarantees") == "exit-paths-and-guarantees"
    assert slug("`ray job submit`") == "ray-job-submit"
    assert slug("On Ray: job submit, Ray Train") == "on-ray-job-submit-ray-train"
