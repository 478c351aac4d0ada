#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the relative links of lather's Markdown files: every linked file exists and every
#anchor names a heading (GitHub's slugs) or an explicit id in the file it points into. Also
checks the citations that are not links, in the docs and in code comments alike:
`docs/performance.md, "On a GPU"` (a Markdown file, then a quoted title) must name a Markdown
file of the tree whose headings or bold lead-ins (`**...**`) contain that title, so that a
section moved or renamed does not leave comments pointing at nothing.

    scripts/check-doc-links.py [ROOT] [--expect FILE]

ROOT (default: the repository) is searched, outside build directories and .git, for *.md (links
and citations) and for headers, sources, scripts and CMake files (citations in any text, comments
included). Each broken link is printed as `path:line: target: reason`, each broken citation as
`path:line: NAME "TITLE": reason`, paths relative to ROOT; the exit status is 1 if there is one.
With --expect, the exit status is 0 exactly when the problems are the lines of FILE (the
checker's own test, tests/docs_links/). External links (http, https, mailto) are not followed:
CI has no network.
"""
import bisect
import os
import re
import sys
import unicodedata

SKIP_DIRS = {".git", "node_modules"}
TOP_SKIP_DIRS = {"results"}  # lather-train's output under the repository root
# The checker's own test documents, broken on purpose (checked by the test with --expect).
FIXTURE = os.path.join("tests", "docs_links")

# [text](target) and [text](target "title"); images too. Reference-style definitions below.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"|\bid=\"([^\"]+)\"")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def slug(text):
    """GitHub's heading anchor: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def strip_code_spans(line):
    """Removes `code` spans so that links shown as code are not checked."""
    return re.sub(r"(`+)(?:(?!\1).)+\1", "", line)


BOLD = re.compile(r"\*\*(.+?)\*\*")
# `name.md, "Title"`, `name.md "Title"`, `name.md ("Title", ...)`, `[x](name.md), "Title"`,
# `` `name.md`, "Title" ``: a Markdown file's name, then a quoted title.
CITATION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)`?\)?(?:,\s*|\s+)\(?\s*"
                      r"\"([^\"]{2,160})\"")
# Lines of comments and Markdown wrap; a citation's title may go on in the next line.
CONTINUATION = re.compile(r"^[ \t]*(?:///?|#|\*|--)?[ \t]?")
SOURCE_SUFFIXES = (".md", ".hpp", ".h", ".cpp", ".cc", ".cu", ".sh", ".py", ".cmake", ".in")


def normalize_title(text):
    return " ".join(re.sub(r"[`*]", "", text).lower().split())


def citations(path):
    """(line number, cited file, title) for each citation in a text file."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (UnicodeDecodeError, OSError):
        return []
    if path.endswith(".md"):  # a citation shown as code or in a fence is an example
        in_fence = False
        for i, line in enumerate(lines):
            fence = FENCE.match(line)
            in_fence = in_fence != bool(fence)
            lines[i] = "" if fence or in_fence else strip_code_spans(line)
    text, starts = "", []
    for i, line in enumerate(lines):
        starts.append(len(text))
        text += (line if i == 0 else " " + CONTINUATION.sub("", line, count=1))
    found = []
    for m in CITATION.finditer(text):
        number = bisect.bisect_right(starts, m.start())
        found.append((number, m.group(1), " ".join(m.group(2).split())))
    return found


def tree_files(root, accept):
    """The files under ROOT whose names `accept` takes, outside build directories, .git and the
    fixture."""
    root = os.path.abspath(root)
    for directory, subdirs, files in os.walk(root):
        top = os.path.samefile(directory, root)
        subdirs[:] = sorted(d for d in subdirs
                            if d not in SKIP_DIRS and not d.startswith("build")
                            and not (top and d in TOP_SKIP_DIRS)
                            and os.path.relpath(os.path.join(directory, d), root) != FIXTURE)
        for name in sorted(files):
            if accept(name):
                yield os.path.join(directory, name)


def markdown_files(root):
    return tree_files(root, lambda name: name.endswith(".md"))


def source_files(root):
    return tree_files(root, lambda name: name.endswith(SOURCE_SUFFIXES) or name == "CMakeLists.txt")


class Document:
    def __init__(self, path):
        self.path = path
        self.anchors = set()
        self.titles = []  # normalized heading and bold lead-in texts, for citations
        self.links = []  # (line number, target)
        counts = {}
        in_fence = False
        visible = []  # the text outside fences and code spans, a line per line of the file
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if FENCE.match(line):
                    in_fence = not in_fence
                    visible.append("")
                    continue
                if in_fence:
                    visible.append("")
                    continue
                for m in BOLD.finditer(line):
                    self.titles.append(normalize_title(m.group(1)))
                heading = HEADING.match(line)
                if heading:
                    self.titles.append(normalize_title(heading.group(2)))
                    base = slug(heading.group(2))
                    n = counts.get(base, 0)
                    counts[base] = n + 1
                    self.anchors.add(base if n == 0 else f"{base}-{n}")
                for m in EXPLICIT_ID.finditer(line):
                    self.anchors.add(m.group(1) or m.group(2))
                visible.append(strip_code_spans(line))
                m = REFERENCE_DEF.match(visible[-1])
                if m:
                    self.links.append((number, m.group(1)))
        # A link's text may wrap onto the next lines of its paragraph: match over the whole text,
        # and report the line that holds the target.
        text = "\n".join(visible)
        for m in INLINE_LINK.finditer(text):
            self.links.append((text.count("\n", 0, m.start(1)) + 1, m.group(1)))
        self.links.sort()


def check(root):
    root = os.path.abspath(root)
    docs = {}

    def document(path):
        if path not in docs:
            docs[path] = Document(path)
        return docs[path]

    problems = []
    for path in markdown_files(root):
        doc = document(path)
        for number, target in doc.links:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            where = f"{os.path.relpath(path, root)}:{number}: {target}"
            if file_part:
                linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if not os.path.exists(linked):
                    problems.append(f"{where}: no such file")
                    continue
            else:
                linked = path
            if anchor:
                if not linked.endswith(".md") or os.path.isdir(linked):
                    continue  # anchors into source files are line numbers on GitHub
                if anchor not in document(linked).anchors:
                    problems.append(f"{where}: no heading or id '{anchor}' in "
                                    f"{os.path.relpath(linked, root)}")
    for path in source_files(root):
        for number, name, title in citations(path):
            candidates = [os.path.join(os.path.dirname(path), name), os.path.join(root, name),
                          os.path.join(root, "docs", os.path.basename(name))]
            cited = next((os.path.normpath(c) for c in candidates if os.path.isfile(c)), None)
            if cited is None:
                continue  # not a file of this tree (a seed document, another project's README)
            wanted = normalize_title(title)
            if not any(wanted in t for t in document(cited).titles):
                problems.append(f'{os.path.relpath(path, root)}:{number}: {name} "{title}": no '
                                f"heading or bold lead-in of {os.path.relpath(cited, root)} "
                                "contains this title")
    return problems


def main(argv):
    args = argv[1:]
    expect = None
    if "--expect" in args:
        i = args.index("--expect")
        if i + 1 >= len(args):
            print("check-doc-links: --expect needs a file", file=sys.stderr)
            return 2
        expect = args[i + 1]
        del args[i:i + 2]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if expect is not None:
        with open(expect, encoding="utf-8") as f:
            wanted = [line.rstrip("\n") for line in f if line.strip()]
        if sorted(problems) == sorted(wanted):
            print(f"check-doc-links: the {len(wanted)} expected broken links and citations "
                  "found, nothing else")
            return 0
        for p in sorted(set(wanted) - set(problems)):
            print(f"check-doc-links: expected but not reported: {p}")
        for p in sorted(set(problems) - set(wanted)):
            print(f"check-doc-links: reported but not expected: {p}")
        return 1
    if problems:
        print(f"check-doc-links: {len(problems)} broken link(s) or citation(s); fix the target or "
              "the heading it points to (anchors are GitHub's heading slugs; a moved section keeps "
              "its heading, so point at the file it moved to)")
        return 1
    print(f"check-doc-links: every relative link of {len(list(markdown_files(root)))} Markdown "
          f"files and every citation of a section in {len(list(source_files(root)))} files "
          "resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
