"""Checks of the benchmarks' results pipeline that need no server: each script's results
document (built from made-up figures) is valid, and bench/render.py renders and checks a page.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""
import importlib.util
import decimal
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import render  # noqa: E402
import results  # noqa: E402


def script(name):
    """bench/<name>.py as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def documents():
    """{name: results document} of every script, from made-up figures."""
    docs = {}
    tpch = script("tpch")
    docs["tpch"] = tpch.results_report(
        1.0, 3, 8, ("55.0.0", "1.4.1"), [("region", 5, 0.01), ("lineitem", 6001215, 20.5)],
        [["before the queries", 250.1, 0.0, 281.9, 0.82, 0.88]],
        [(1, 4, 0.41, 0.33, 0.2, "agree"), (2, 100, "error: x", 0.1, 0.1, "FAILED")],
        load_at_start=1.5).document()
    clone = script("clone")
    args = types.SimpleNamespace(rows=2_000_000, buckets=8, update_percent=1.0)
    docs["clone"] = clone.results_report(args, 71_800_000, 5.39, 0.132, 131072, 0.286, 900000,
                                         0).document()
    lookups = script("adbc_lookups")
    args = types.SimpleNamespace(rows=10_000, lookups=3, keys=1_000)
    means = {m: 50.0 for m in lookups.METHODS}
    docs["adbc_lookups"] = lookups.results_report(
        args, [("in memory", ([0.001, 0.0015, 0.002], means)),
               ("on disk", ([0.0012, 0.0016, 0.003], means))]).document()
    docs["bytes_per_row"] = script("bytes_per_row").results_report(
        1_000_000, 60_000_000, 26_700_000, 1_000_000, 29_000_000).document()
    queue = script("queue_bench")
    args = types.SimpleNamespace(cluster=False, queues=6, seconds=10.0, messages=None, rate=200.0,
                                 latency_seconds=5.0)
    report, enqueue_rows, latency_rows = queue.results_report(args, "one node")
    enqueue_rows.append(["bulk ingest (ADBC)", "one queue each", 48, 1_000_000, 100.0, 2.5, 9.1,
                         0.7])
    latency_rows.append(["ADBC", 1000, 1.4, 3.0, 2.6, 3.5, float("nan"), 12.0])
    docs["queue"] = report.document()
    return docs


class ResultsTest(unittest.TestCase):
    def test_every_script_writes_a_valid_document(self):
        for name, doc in documents().items():
            with self.subTest(name):
                self.assertEqual(results.validate(doc), [])
                self.assertEqual(doc["benchmark"], name)
                self.assertTrue(doc["tables"] and doc["tables"][0]["rows"])
                json.dumps(doc, allow_nan=False)  # NaN became null

    def test_invalid_documents_are_named(self):
        self.assertTrue(results.validate({"benchmark": "x"}))
        doc = documents()["clone"]
        doc["tables"][0]["rows"].append([1])
        self.assertTrue(any("cells expected" in p for p in results.validate(doc)))

    def test_written_documents_render_and_check(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name, doc in documents().items():
                path = os.path.join(tmp, f"{name}.json")
                results.write_document(doc, path)
            page = render.render(tmp)
            for _, heading, _ in render.BENCHMARKS:
                self.assertIn(f"\n## {heading}\n", page)
            self.assertIn("| q01 | 4 | 0.41 | 0.33 | 0.2 | 1.24 | 2.05 | agree |", page)
            self.assertIn("No results yet. Run `bench/serving.sh`", page)
            page_path = os.path.join(tmp, "benchmarks.md")
            check = [sys.executable, os.path.join(HERE, "render.py"), "--results", tmp,
                     "--page", page_path]
            self.assertNotEqual(subprocess.run(check + ["--check"], capture_output=True).returncode, 0)
            subprocess.run(check, check=True, capture_output=True)
            subprocess.run(check + ["--check"], check=True, capture_output=True)
            with open(page_path) as f:
                self.assertEqual(f.read(), page)

    def test_report_write_and_command(self):
        report = results.Report("example", "An example", command="python3 bench/example.py")
        report.table("t", ["a", "b"]).append([1, 2.5])
        report.table("figures from a database", ["n"]).append([decimal.Decimal("1.25")])
        report.note("a note")
        with tempfile.TemporaryDirectory() as tmp:
            path = report.write(os.path.join(tmp, "sub", "example.json"))
            with open(path) as f:
                doc = json.load(f)
        self.assertEqual(doc["tables"], [
            {"title": "t", "columns": ["a", "b"], "rows": [[1, 2.5]]},
            {"title": "figures from a database", "columns": ["n"], "rows": [[1.25]]},
        ])
        self.assertEqual(list(doc), list(results.KEYS))
        self.assertIsNone(report.write(""))
        self.assertEqual(results.command_line([os.path.join(HERE, "tpch.py"), "--scale", "0.1"]),
                         "python3 bench/tpch.py --scale 0.1")

    def test_scripts_take_a_json_option(self):
        for name in ("tpch", "queue_bench", "clone", "adbc_lookups", "bytes_per_row",
                     "changes_bench"):
            with self.subTest(name):
                done = subprocess.run([sys.executable, os.path.join(HERE, f"{name}.py"), "--help"],
                                      capture_output=True, text=True, timeout=60)
                self.assertEqual(done.returncode, 0, done.stderr)
                self.assertIn("--json", done.stdout)


if __name__ == "__main__":
    unittest.main()
