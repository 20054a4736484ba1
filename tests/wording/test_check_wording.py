#!/usr/bin/env python3
"""CTest wording_check_fixture: check_wording.py finds every chronicle phrase planted in fixtures/planted.md (one a
line, one running on into the next line), passes on fixtures/clean.md (product text with the verb "issues", a
"training session", Catch::Session, "the first call"), honours --exclude, and excludes itself and its fixtures when
it scans the repository."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "check_wording.py")
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def check(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class CheckWording(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()  # not a git work tree: every file under the scanned paths counts
        os.makedirs(os.path.join(self.tmp, "docs"))
        os.makedirs(os.path.join(self.tmp, "src"))
        shutil.copy(os.path.join(HERE, "fixtures", "clean.md"), os.path.join(self.tmp, "docs", "clean.md"))
        shutil.copy(os.path.join(HERE, "fixtures", "clean.md"), os.path.join(self.tmp, "src", "clean.cpp"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def plant(self, where="docs/notes.md"):
        shutil.copy(os.path.join(HERE, "fixtures", "planted.md"), os.path.join(self.tmp, where))

    def test_a_planted_phrase_fails_with_file_and_line(self):
        self.plant()
        done = check("--root", self.tmp)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        lines = sorted({int(l.split(":")[1]) for l in done.stdout.splitlines() if l.startswith("docs/notes.md:")})
        self.assertEqual(lines, [4, 5, 6, 7, 8, 9, 10])  # line 9 runs on into line 10 ("seventeenth / session")
        self.assertIn("docs/notes.md:4: 'call 12'", done.stdout)
        self.assertIn("docs/notes.md:4: 'fifth session'", done.stdout)
        self.assertIn("docs/notes.md:9: 'seventeenth session'", done.stdout)
        self.assertNotIn("clean", done.stdout)
        self.assertIn("chronicle phrase", done.stderr)

    def test_product_text_passes(self):
        done = check("--root", self.tmp)
        self.assertEqual(done.returncode, 0, done.stdout)
        self.assertEqual(done.stdout, "")

    def test_exclude_and_paths(self):
        self.plant()
        self.assertEqual(check("--root", self.tmp, "--exclude", "docs/notes.md").returncode, 0)
        self.assertEqual(check("--root", self.tmp, "--exclude", "docs").returncode, 0)
        self.assertEqual(check("--root", self.tmp, "src").returncode, 0)  # only the paths given are scanned
        self.assertEqual(check("--root", self.tmp, "docs").returncode, 1)

    def test_the_checker_and_its_fixtures_are_excluded(self):
        done = check("--root", ROOT, "tests/wording")
        self.assertEqual(done.returncode, 0, done.stdout)


if __name__ == "__main__":
    unittest.main()
