"""Benchmark results as data: what every benchmark script writes to bench/results/<name>.json.

A benchmark prints its figures as it runs and, at the end, writes the run as one JSON document
(the latest run only: the history is the file's history in git). `bench/render.py` turns every
such file into the guide's benchmarks page, docs/benchmarks.md. The document:

    {"benchmark": "tpch",                        # the file's name, bench/results/tpch.json
     "title": "TPC-H SF1 over Flight SQL against DataFusion and DuckDB",
     "command": "python3 bench/tpch.py --scale 1",
     "commit": "6e378e0",                        # git rev-parse --short HEAD ("-dirty": changed files)
     "date": "2026-11-28T10:00:00Z",             # UTC, when the run ended
     "machine": {"cpus": 2, "memory_gib": 23.4, "load_average": [1.2, 1.5]},  # at start, end
     "baseline": "DataFusion 55 and DuckDB 1.4 on the same Parquet files, same run",
     "tables": [{"title": "...", "columns": ["query", "Nyala s", ...], "rows": [["q01", 0.41, ...]]}],
     "notes": ["short factual lines, e.g. the targets"]}

Usage in a script:

    report = Report("clone", "Table clones against CTAS, 2 000 000 rows", baseline="...")
    rows = report.table("Clone against CTAS", ["statement", "seconds", "% of CTAS"])
    rows.append(["CLONE", 0.13, 2.4])
    report.note("target: a clone takes at most 10 % of a CTAS's time")
    report.write(args.json)     # --json PATH, added by add_json_argument(parser, "clone")
"""
import datetime
import decimal
import json
import math
import os
import shlex
import subprocess
import sys

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")

KEYS = ("benchmark", "title", "command", "commit", "date", "machine", "baseline", "tables",
        "notes")
# Keys a document may have besides: what each system measured is (serving_bench) and the run's
# parameters.
OPTIONAL_KEYS = ("systems", "parameters")


def default_path(name):
    """bench/results/<name>.json."""
    return os.path.join(RESULTS_DIR, f"{name}.json")


def add_json_argument(parser, name):
    """Adds `--json PATH` (default bench/results/<name>.json; an empty PATH writes nothing)."""
    parser.add_argument(
        "--json", metavar="PATH", default=default_path(name) if name else None,
        help="write the run's results here as JSON for docs/benchmarks.md (default: "
             + (f"bench/results/{name}.json" if name else "see above") + "; '' writes nothing)")


def command_line(argv=None):
    """The command that ran this script, as a user types it from the repository's root."""
    argv = sys.argv if argv is None else argv
    script = os.path.abspath(argv[0])
    if script.startswith(REPO_ROOT + os.sep):
        script = os.path.relpath(script, REPO_ROOT)
    return "python3 " + shlex.join([script, *argv[1:]])


def git_commit():
    """The checked-out commit (short), with "-dirty" when tracked files outside bench/results
    differ from it; None outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO_ROOT, *args], capture_output=True, text=True,
                              timeout=10)
    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return None
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)bench/results")
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


def memory_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def process_cpu_seconds(pid):
    """User and system CPU seconds process `pid` has used so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def clean(value):
    """`value` as JSON holds it: tuples as lists, decimals as floats, NaN and infinities as
    null."""
    if isinstance(value, decimal.Decimal):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    return value


class Report:
    """One run's results; see the module documentation."""

    def __init__(self, benchmark, title, baseline=None, command=None, load_at_start=None):
        """`load_at_start`: the 1-minute load average when the run began (default: now)."""
        self.benchmark = benchmark
        self.title = title
        self.baseline = baseline
        self.command = command or command_line()
        self.load_at_start = (load_average() if load_at_start is None
                              else round(load_at_start, 2))
        self.tables = []
        self.notes = []

    def table(self, title, columns):
        """Adds a table; returns its list of rows, to append rows (lists of cells) to."""
        rows = []
        self.tables.append({"title": title, "columns": list(columns), "rows": rows})
        return rows

    def note(self, text):
        self.notes.append(text)

    def document(self):
        """The JSON document of the run, as of now."""
        return clean({
            "benchmark": self.benchmark,
            "title": self.title,
            "command": self.command,
            "commit": git_commit(),
            "date": utc_now(),
            "machine": {"cpus": os.cpu_count(), "memory_gib": memory_gib(),
                        "load_average": [self.load_at_start, load_average()]},
            "baseline": self.baseline,
            "tables": [t for t in self.tables if t["rows"]],
            "notes": self.notes,
        })

    def write(self, path):
        """Writes the document to `path` (nothing for an empty path); returns the path."""
        if not path:
            return None
        doc = self.document()
        problems = validate(doc)
        if problems:
            raise ValueError(f"benchmark results for {path}: " + "; ".join(problems))
        write_document(doc, path)
        print(f"results written to {os.path.relpath(path)}", flush=True)
        return path


def write_document(doc, path):
    """Writes `doc` to `path` whole (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"
    with open(partial, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(partial, path)


def validate(doc):
    """What is wrong with a results document (an empty list: nothing)."""
    problems = []
    if not isinstance(doc, dict):
        return ["the document is not a JSON object"]
    for key in ("benchmark", "title", "command", "date"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            problems.append(f"'{key}' must be a non-empty string")
    for key in ("commit", "baseline"):
        if doc.get(key) is not None and not isinstance(doc.get(key), str):
            problems.append(f"'{key}' must be a string or null")
    unknown = sorted(set(doc) - set(KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        problems.append(f"unknown keys {unknown}")
    machine = doc.get("machine")
    if not isinstance(machine, dict):
        problems.append("'machine' must be an object")
    elif not isinstance(machine.get("load_average", []), list):
        problems.append("'machine.load_average' must be a list")
    tables = doc.get("tables")
    if not isinstance(tables, list):
        problems.append("'tables' must be a list")
        tables = []
    for i, table in enumerate(tables):
        where = f"table {i + 1}"
        if not isinstance(table, dict) or not isinstance(table.get("columns"), list) \
                or not isinstance(table.get("rows"), list):
            problems.append(f"{where} needs 'columns' and 'rows' lists")
            continue
        if not isinstance(table.get("title", ""), str):
            problems.append(f"{where}: 'title' must be a string")
        for j, row in enumerate(table["rows"]):
            if not isinstance(row, list) or len(row) != len(table["columns"]):
                problems.append(f"{where}, row {j + 1}: {len(table['columns'])} cells expected")
            elif any(isinstance(c, (list, dict)) for c in row):
                problems.append(f"{where}, row {j + 1}: cells are numbers, strings or null")
    notes = doc.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        problems.append("'notes' must be a list of strings")
    return problems
