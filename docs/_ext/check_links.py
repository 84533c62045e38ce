"""Check every internal link of a built HTML site: the page exists and so does its anchor.

Usage: ``python docs/_ext/check_links.py docs/_build/html``. Prints one line per broken link and
exits with status 1 if there is any. External links (with a scheme) are not followed: the build
machine may have no network.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        target = attrs.get("href") if tag in ("a", "link") else None
        if target is None and tag in ("img", "script"):
            target = attrs.get("src")
        if target:
            self.links.append(target)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def broken_links(root: Path) -> list[str]:
    """``'page: link (why)'`` for each internal link of the site under ``root`` that is broken."""
    root = root.resolve()
    # the site's pages; _static/ holds the theme's templates, whose links are filled in per page
    pages = {
        path: _parse(path)
        for path in root.rglob("*.html")
        if "_static" not in path.relative_to(root).parts
    }
    problems = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            where = path.relative_to(root)
            if not target.exists():
                problems.append(f"{where}: {link} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where}: {link} (no anchor #{parts.fragment})")
    return problems


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    if not (root / "index.html").exists():
        print(f"{root}: no built site (index.html missing)", file=sys.stderr)
        return 1
    problems = broken_links(root)
    for line in problems:
        print(line, file=sys.stderr)
    print(f"checked the internal links of the site's pages: {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
