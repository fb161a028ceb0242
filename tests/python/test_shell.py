"""The `nyala sql` shell as a user drives it: through a pseudo-terminal, keystroke by keystroke."""

import os
import subprocess
import tempfile

import pexpect
import pytest

from nyala_server import nyala_bin


@pytest.fixture(scope="module")
def url(server):
    return server


@pytest.fixture
def home():
    with tempfile.TemporaryDirectory() as home:
        yield home


def spawn(url, home):
    env = dict(os.environ, HOME=home, TERM="xterm", NO_COLOR="1")
    shell = pexpect.spawn(nyala_bin(), ["sql", "--connect", url], env=env, encoding="utf-8", timeout=60,
                          dimensions=(50, 200))
    shell.expect_exact("nyala> ")
    return shell


def run(shell, line, expect, prompt="nyala> "):
    shell.sendline(line)
    shell.expect_exact(expect)
    shell.expect_exact(prompt)


def test_statements_commands_and_output_modes(url, home):
    shell = spawn(url, home)
    run(shell, "CREATE TABLE shell_t (id BIGINT PRIMARY KEY, name STRING);", "OK")
    # A statement over several lines: the continuation prompt until the ';'.
    shell.sendline("INSERT INTO shell_t VALUES")
    shell.expect_exact("...> ")
    run(shell, "(1, 'ann'), (2, 'bob');", "OK, 2 rows")
    run(shell, "\\d", "shell_t")
    run(shell, "\\d shell_t", "STRING")
    run(shell, "SELECT * FROM shell_t ORDER BY id;", "(2 rows)")
    run(shell, "\\mode csv", "Output mode is csv.")
    run(shell, "SELECT * FROM shell_t ORDER BY id;", "id,name\r\n1,ann\r\n2,bob")
    run(shell, "\\mode json", "Output mode is json.")
    run(shell, "SELECT * FROM shell_t WHERE id = 1;", '[{"id":1,"name":"ann"}]')
    run(shell, "\\mode line", "Output mode is line.")
    run(shell, "SELECT * FROM shell_t WHERE id = 2;", "  id = 2\r\nname = bob")
    run(shell, "\\mode table", "Output mode is table.")
    # Each statement's time is shown, unless \timing turns it off.
    run(shell, "SELECT count(*) AS n FROM shell_t;", "Time: ")
    run(shell, "\\timing", "Timing is off.")
    shell.sendline("SELECT 41 + 1 AS answer;")
    shell.expect_exact("(1 row)")
    shell.expect_exact("nyala> ")
    assert "Time: " not in shell.before
    run(shell, "\\timing", "Timing is on.")
    # Errors are printed and the shell goes on.
    run(shell, "SELECT * FROM no_such_table;", "no_such_table")
    run(shell, "\\nonsense", "unknown command")
    shell.sendline("\\q")
    shell.expect(pexpect.EOF)
    shell.close()
    assert shell.exitstatus == 0


def test_history_include_and_copy(url, home, tmp_path):
    shell = spawn(url, home)
    run(shell, "CREATE TABLE shell_h (id BIGINT PRIMARY KEY, v DOUBLE);", "OK")
    script = tmp_path / "load.sql"
    script.write_text("INSERT INTO shell_h VALUES (1, 0.5);\nINSERT INTO shell_h VALUES (2, 1.5);\n")
    run(shell, f"\\i {script}", "OK, 1 rows")
    csv = tmp_path / "rows.csv"
    csv.write_text("id,v\n" + "".join(f"{i},{i / 2}\n" for i in range(10, 5010)))
    run(shell, f"\\copy shell_h FROM '{csv}'", "COPY 5000 rows")
    run(shell, "SELECT count(*) AS n FROM shell_h;", "5002")
    # Up-arrow recalls the previous statement; Enter runs it again.
    shell.send("\x1b[A")
    shell.send("\r")
    shell.expect_exact("5002")
    shell.expect_exact("nyala> ")
    # Ctrl-D at an empty prompt leaves; the history file keeps the statements.
    shell.sendeof()
    shell.expect(pexpect.EOF)
    shell.close()
    with open(os.path.join(home, ".nyala_history")) as f:
        assert "SELECT count(*) AS n FROM shell_h;" in f.read()


def test_ctrl_c_cancels_the_running_statement(url, home):
    shell = spawn(url, home)
    # Far too many rows to finish: only Ctrl-C ends it.
    shell.sendline("SELECT count(*) FROM generate_series(1, 100000000000) a;")
    shell.expect_exact("SELECT count(*)")
    # After a second a progress line says how long it has been running.
    shell.expect_exact("running for")
    shell.sendintr()
    shell.expect_exact("cancelled")
    shell.expect_exact("nyala> ")
    # Still alive and usable; Ctrl-C at the prompt just clears the line.
    shell.send("SELECT 'half")
    shell.sendintr()
    shell.expect_exact("nyala> ")
    run(shell, "SELECT 'still here' AS s;", "still here")
    shell.sendline("\\q")
    shell.expect(pexpect.EOF)


def test_scripts_exit_non_zero_on_error(url, tmp_path):
    good = subprocess.run([nyala_bin(), "sql", "--connect", url, "--mode", "csv", "-c", "SELECT 1 AS one, 'x' AS s"],
                          capture_output=True, text=True)
    assert good.returncode == 0 and good.stdout.strip() == "one,s\n1,x"
    script = tmp_path / "bad.sql"
    script.write_text("SELECT 'first' AS a;\nSELEC oops;\nSELECT 'third' AS c;\n")
    bad = subprocess.run([nyala_bin(), "sql", "--connect", url, "-f", str(script)], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "syntax" in bad.stderr.lower()
    assert "first" in bad.stdout and "third" not in bad.stdout
