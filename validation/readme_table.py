"""Refresh the README's fidelity tables from the suites: run ``python -m simulator validate
--markdown`` (every suite in validation/, a few minutes on 2 cores) and put its output between
the README's ``<!-- validate --markdown: begin -->`` and ``<!-- ... end -->`` markers.

    python validation/readme_table.py                 # run validate, then rewrite README.md
    python validation/readme_table.py --from out.md   # splice a saved `validate --markdown`

Above the tables it writes which commit and when they were computed (the checkout's HEAD and
the time now, or ``--at``). Nothing else in the README changes; the prose around the tables is
written by hand.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- validate --markdown: begin -->\n"
END = "<!-- validate --markdown: end -->"


def splice(readme: str, tables: str) -> str:
    """The README with the text between the markers replaced by ``tables``."""
    head, sep, rest = readme.partition(BEGIN)
    if not sep or END not in rest:
        raise SystemExit("error: README.md: no '<!-- validate --markdown: begin/end -->' markers")
    _, _, tail = rest.partition(END)
    return head + BEGIN + tables.rstrip("\n") + "\n" + END + tail


def stamp() -> str:
    """'at <commit> (<UTC time>)' of this checkout; '+ local changes' if it has any."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = " + local changes" if git("status", "--porcelain", "--untracked-files=no").strip() \
        else ""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{git('rev-parse', '--short', 'HEAD').strip()}{dirty} ({now})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", help="a saved `validate --markdown` output")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--at", help="which commit and when the figures were computed "
                                 "(default: this checkout's HEAD, now)")
    args = ap.parse_args()
    if args.source:
        tables = Path(args.source).read_text(encoding="utf-8")
    else:
        r = subprocess.run([sys.executable, "-m", "simulator", "validate", "--markdown"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if r.returncode not in (0, 1):  # 1: a suite outside its tolerance, still a table
            return r.returncode
        tables = r.stdout
    if not tables.strip():
        raise SystemExit("error: no tables to put in the README")
    readme = Path(args.readme)
    head = f"Figures of `python -m simulator validate --markdown` at {args.at or stamp()}.\n\n"
    new = splice(readme.read_text(encoding="utf-8"), head + tables)
    tmp = readme.with_name(readme.name + ".tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(readme)
    print(f"{readme}: fidelity tables refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
