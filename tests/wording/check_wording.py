#!/usr/bin/env python3
"""The repository speaks of the product only: fails when its documents or sources narrate the work that made them.

Scans docs/, README.md and every text file under include/ capi/ src/ cuda/ bench/ tests/ examples/ (their
comments, docstrings and strings alike) for chronicle phrases: work periods ("the fifth session", "this session",
"work period"), numbered runs of a GPU runner ("call 12", "calls 9, 11", "device call"), the runner's own terms
("device tool", "transfer cap", "s29/call3") and issue numbers ("issue 7", "issue #7", "gemm_issue12"). Prints
PATH:LINE: TEXT for every hit and exits 1 if there is one, 0 if none. Case-insensitive.

Excluded, so that the patterns and the planted phrases that test them do not count: the paths in EXCLUDED below
(this script, its test and the test's fixtures under tests/wording/), plus any --exclude PATH given (a file, or a
folder and everything under it, relative to --root). In a git work tree only tracked and untracked-but-not-ignored
files are scanned (git ls-files), so build trees are skipped; elsewhere every file under the scanned paths.

usage: python3 tests/wording/check_wording.py [--root DIR] [--exclude PATH ...] [PATH ...]
  PATH: what to scan, relative to --root (default: the list above); --root: the repository (default: two folders
  above this script).
"""
import argparse
import os
import re
import subprocess
import sys

SCANNED = ("docs", "README.md", "include", "capi", "src", "cuda", "bench", "tests", "examples")
EXCLUDED = ("tests/wording/check_wording.py", "tests/wording/test_check_wording.py", "tests/wording/fixtures")

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
            "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|[0-9]+(?:st|nd|rd|th)")
PATTERNS = [
    (rf"\b(?:{ORDINALS})(?: work)? (?:session|period)s?\b", "a numbered work period"),
    (r"\b(?:this|that|the|each|every|previous|next|last|same|one|a later|an earlier) (?:work )?session\b",
     "a work session"),
    (r"\bsession(?:'s)? (?:notes|calls?|head)\b", "a work session"),
    (r"\bwork periods?\b", "a work period"),
    (r"\bcalls? [0-9]+\b", "a numbered call of the GPU runner"),
    (r"\bdevice calls?\b", "a call of the GPU runner"),
    (r"\bdevice tool\b", "the GPU runner's name"),
    (r"\btransfer cap\b", "the GPU runner's limit"),
    (r"\bs[0-9]+/call", "a run's output folder"),
    # An issue number: "issue 7", "(issue 5)", "Issue 3's", "issues 3 and 4", "issue #7", "issue12", "gemm_issue12".
    # Spelt with a space, the number must end a phrase (punctuation, "'s" or a function word after it), so that the
    # verb does not count ("each thread issues 8 row loads", "the warps issue 4 TMA boxes").
    (r"(?<![a-z])issue[_-]?#?[0-9]+|(?<![a-z])issues? #?[0-9]+(?![0-9])(?=\s*(?:$|[^\w\s]|'s\b|(?:of|and|or|in|"
     r"at|is|was|for|from|on|with|that|which|the|a|an|its|it|this|these|since|until|when|where|as|by|to)\b))",
     "an issue number"),
]
COMPILED = [(re.compile(pattern, re.IGNORECASE), why) for pattern, why in PATTERNS]
CONTINUATION = re.compile(r"^\s*(?:/\*+|\*+|//+|#+|--|;+)?\s*")  # a comment line's marker


def listed_files(root, paths):
    """Files under paths (relative to root): git's view of them in a work tree, else a walk of the folders."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                              "--", *paths], capture_output=True, check=True).stdout
        return sorted({name for name in out.decode().split("\0") if name and os.path.isfile(os.path.join(root, name))})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for path in paths:
            full = os.path.join(root, path)
            if os.path.isfile(full):
                files.append(path)
            for folder, _, names in os.walk(full):
                files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
        return sorted(set(files))


def excluded(path, exclusions):
    path = path.replace(os.sep, "/")
    return any(path == e or path.startswith(e.rstrip("/") + "/") for e in exclusions)


def scan(root, paths, exclusions):
    hits = []
    for path in listed_files(root, paths):
        if excluded(path, exclusions):
            continue
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (UnicodeDecodeError, OSError):
            continue  # not a text file
        for number, line in enumerate(lines, 1):
            # A phrase may run on into the next line: join the two (the next one without its comment marker) and
            # count the matches that cross the break.
            line = line.rstrip()
            following = CONTINUATION.sub("", lines[number]) if number < len(lines) else ""
            joined = line + " " + following
            for pattern, why in COMPILED:
                match = pattern.search(line) or next(
                    (m for m in pattern.finditer(joined) if m.start() < len(line) < m.end()), None)
                if match:
                    hits.append((path, number, match.group(0), why, line.strip()))
    return hits


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="what to scan, relative to --root")
    parser.add_argument("--root", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "..", "..")))
    parser.add_argument("--exclude", action="append", default=[], help="a file or folder not to scan (repeatable)")
    args = parser.parse_args()
    hits = scan(args.root, args.paths or list(SCANNED), list(EXCLUDED) + args.exclude)
    for path, number, text, why, line in hits:
        print(f"{path}:{number}: '{text}' ({why}): {line[:160]}")
    if hits:
        files = len({h[0] for h in hits})
        print(f"check_wording.py: {len(hits)} chronicle phrase(s) in {files} file(s); say what the product does, "
              "not when or in which run it was made", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
