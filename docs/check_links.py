#!/usr/bin/env python3
"""Checks the links of the built guide: every relative link reaches a file, every #anchor an
element of its page.

    mdbook build docs -d "$CARGO_TARGET_DIR/book"
    python3 docs/check_links.py "$CARGO_TARGET_DIR/book"

Reads every HTML file under the book's directory and checks the `href` of `a` and `link` and
the `src` of `img`, `script` and `iframe`. Links with a scheme (https:, mailto:, ...) are not
fetched. A path starting with `/` is taken from the book's root. Exits 1 listing every broken
link. Python's standard library only.
"""
import html.parser
import os
import sys
import urllib.parse

LINK_ATTRIBUTES = {"a": "href", "link": "href", "img": "src", "script": "src", "iframe": "src"}


class Page(html.parser.HTMLParser):
    """The ids (and `a name`s) a page defines and the links it holds."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []  # (line, target)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        attribute = LINK_ATTRIBUTES.get(tag)
        if attribute and attrs.get(attribute):
            self.links.append((self.getpos()[0], attrs[attribute]))


def parse(path):
    page = Page()
    with open(path, encoding="utf-8") as f:
        page.feed(f.read())
    page.close()
    return page


def check(root):
    """The broken links under `root`, as lines of text; and how many links were checked."""
    root = os.path.abspath(root)
    pages = {}
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(".html"):
                path = os.path.join(directory, name)
                pages[path] = parse(path)
    broken, checked = [], 0
    for path, page in sorted(pages.items()):
        for line, link in page.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or parts.netloc:
                continue  # external: not fetched
            checked += 1
            target_path = urllib.parse.unquote(parts.path)
            if not target_path:
                target = path
            elif target_path.startswith("/"):
                target = os.path.join(root, target_path.lstrip("/"))
            else:
                target = os.path.normpath(os.path.join(os.path.dirname(path), target_path))
            if os.path.isdir(target):
                target = os.path.join(target, "index.html")
            where = f"{os.path.relpath(path, root)}:{line}: {link}"
            if not os.path.isfile(target):
                broken.append(f"{where}: no file {os.path.relpath(target, root)}")
                continue
            anchor = urllib.parse.unquote(parts.fragment)
            if anchor and target.endswith(".html"):
                ids = pages[target].ids if target in pages else parse(target).ids
                if anchor not in ids:
                    broken.append(f"{where}: no anchor #{anchor} in {os.path.relpath(target, root)}")
    return broken, checked, len(pages)


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit(f"usage: {sys.argv[0]} BOOK_DIRECTORY (the output of mdbook build)")
    broken, checked, pages = check(sys.argv[1])
    if broken:
        print("\n".join(broken), file=sys.stderr)
        sys.exit(f"check_links: {len(broken)} broken of {checked} links in {pages} pages")
    print(f"check_links: {checked} links in {pages} pages, none broken")


if __name__ == "__main__":
    main()
