#!/usr/bin/env python3
"""Checks the links of every Markdown file in the repository, with no network.

A relative link must name a file or folder that exists; a #anchor must match a heading of
the page it points to, slugged as GitHub slugs them (lowercase, punctuation dropped, spaces
to '-', a repeated heading gets -1, -2, ...). Links to other sites (http:, https:, mailto:)
are not followed. Code blocks and inline code are skipped. Exits 1 and lists every broken
link, or prints a count and exits 0.
"""
import os
import re
import subprocess
import sys
from urllib.parse import unquote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"""<a\s+(?:name|id)=["']([^"']+)["']""")


def markdown_files():
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.splitlines() if os.path.isfile(os.path.join(ROOT, p)))


def prose_lines(text):
    """(line number, line) outside fenced code blocks, inline code blanked."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            mark = m.group(1)
            if fence is None:
                fence = mark[0] * len(mark)
            elif mark.startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda c: " " * len(c.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link's text only
    text = re.sub(r"<[^>]+>", "", text)                         # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)                        # punctuation dropped
    return text.replace(" ", "-")


anchor_cache = {}


def anchors(path):
    if path not in anchor_cache:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fence = None
        for line in text.splitlines():
            m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
            if m:
                mark = m.group(1)
                if fence is None:
                    fence = mark[0] * len(mark)
                elif mark.startswith(fence):
                    fence = None
                continue
            if fence is not None:
                continue
            h = HEADING.match(line)
            if h:
                s = slug(h.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
            found.update(HTML_ID.findall(line))
        anchor_cache[path] = found
    return anchor_cache[path]


def check(page):
    errors = []
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    for n, line in prose_lines(text):
        targets = [m.group(1) for m in LINK.finditer(line)]
        d = REF_DEF.match(line)
        if d:
            targets.append(d.group(1))
        for target in targets:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # another site: not followed here
            path, _, frag = target.partition("#")
            path = unquote(path)
            if path.startswith("/"):
                dest = os.path.join(ROOT, path.lstrip("/"))
            elif path:
                dest = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path))
            else:
                dest = os.path.join(ROOT, page)
            where = f"{page}:{n}: {target}"
            if not os.path.exists(dest):
                errors.append(f"{where}: no such file")
            elif not os.path.realpath(dest).startswith(ROOT + os.sep) and dest != ROOT:
                errors.append(f"{where}: outside the repository")
            elif frag:
                if not dest.endswith(".md"):
                    errors.append(f"{where}: an anchor into a file that is not Markdown")
                elif unquote(frag) not in anchors(dest):
                    errors.append(f"{where}: no heading with anchor #{frag}")
    return errors


def main():
    pages = markdown_files()
    errors = [e for p in pages for e in check(p)]
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check-links: {len(errors)} broken link(s) in {len(pages)} Markdown files",
              file=sys.stderr)
        return 1
    print(f"check-links: every link in {len(pages)} Markdown files resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
