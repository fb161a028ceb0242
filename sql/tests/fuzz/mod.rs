//! Fuzz targets for the SQL front end: token soups, the valid statements of the SQL tests and
//! the sqllogictest files mutated token by token, and statements from a small grammar, through
//! NyalaParser and through planning and (bounded) execution on a database with tables and rows;
//! deeply nested expressions too. Any error is fine; a panic or a stack overflow is a bug. See
//! the `nyala-fuzzing` crate for the budget (`NYALA_FUZZ_SECS`, `NYALA_FUZZ_SEED`, ...):
//! `NYALA_FUZZ_SECS=600 cargo test --release -p nyala-sql --test sql fuzz_`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use datafusion::common::ScalarValue;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::StreamExt;
use nyala_fuzzing::{Fuzz, Unstructured};
use nyala_sql::parser::NyalaParser;
use nyala_sql::{Database, Session};

/// The string literals of a Rust source file (escapes resolved, `\` line continuations joined).
fn rust_strings(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                chars.by_ref().take_while(|&c| c != '\n').for_each(drop);
            }
            '\'' => {
                // A char literal ('"', '\'') or a lifetime: skip what could hide a quote.
                let mut ahead = chars.clone();
                if let (Some(a), Some(b)) = (ahead.next(), ahead.next()) {
                    if b == '\'' || (a == '\\' && ahead.next() == Some('\'')) {
                        chars = ahead;
                    }
                }
            }
            '"' => {
                let mut s = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('\n') => {
                                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                                    chars.next();
                                }
                            }
                            Some(other) => s.push(other),
                            None => {}
                        },
                        other => s.push(other),
                    }
                }
                out.push(s);
            }
            _ => {}
        }
    }
    out
}

/// The statements of a sqllogictest file: the lines after `statement ...` or `query ...`, up
/// to a blank line or the `----` before the expected rows.
fn slt_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("statement") || line.starts_with("query") {
            let sql: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.trim().is_empty() && *l != "----")
                .collect();
            out.push(sql.join("\n"));
        }
    }
    out
}

/// The valid statements of `sql/tests/sql.rs` and `tests/slt/*.slt`.
fn corpus() -> &'static [String] {
    static CORPUS: OnceLock<Vec<String>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        // Cargo sets the variable when it runs the test: the clone the test runs in, which a
        // shared target directory may have built the binary from another path of.
        let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
        let dir = std::path::Path::new(&dir);
        let starts = [
            "SELECT", "INSERT", "UPSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER", "SHOW",
            "DESCRIBE", "EXPLAIN", "SET", "WITH", "VALUES",
        ];
        let mut corpus: Vec<String> =
            rust_strings(&std::fs::read_to_string(dir.join("tests/sql.rs")).unwrap())
                .into_iter()
                .filter(|s| starts.iter().any(|k| s.starts_with(k)) && !s.contains('{'))
                .collect();
        let mut slt: Vec<_> = std::fs::read_dir(dir.join("../tests/slt"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        slt.sort();
        for path in slt {
            corpus.extend(slt_statements(&std::fs::read_to_string(path).unwrap()));
        }
        assert!(
            corpus.len() > 100,
            "the corpus has {} statements",
            corpus.len()
        );
        corpus
    })
}

fn tokens(sql: &str) -> Vec<String> {
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map(|tokens| tokens.iter().map(Token::to_string).collect())
        .unwrap_or_default()
}

/// The words and symbols of the corpus, without whitespace.
fn corpus_tokens() -> &'static [String] {
    static TOKENS: OnceLock<Vec<String>> = OnceLock::new();
    TOKENS.get_or_init(|| {
        let mut all: Vec<String> = corpus()
            .iter()
            .flat_map(|s| tokens(s))
            .filter(|t| !t.trim().is_empty())
            .collect();
        all.sort();
        all.dedup();
        all
    })
}

const SYMBOLS: &[&str] = &[
    "(", ")", ",", ";", ".", "*", "+", "-", "/", "%", "=", "<>", "!=", "<", "<=", ">", ">=", "||",
    "::", "[", "]", "?", "$1", "$2", "@", "->", "->>", "'", "\"", "`", "--", "/*", "*/", "e'\\'",
];

const LITERALS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "7",
    "38",
    "39",
    "65535",
    "65536",
    "2147483648",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999999999999999999999999",
    "0.5",
    "-0.0",
    "1e308",
    "1e-400",
    "'NaN'",
    "''",
    "'a'",
    "'%'",
    "'2026-01-01'",
    "'2026-01-01T00:00:00'",
    "'9999-99-99'",
    "'not a time'",
    "NULL",
    "TRUE",
    "FALSE",
    "INTERVAL '1' DAY",
    "INTERVAL '-1000000 years'",
    "DATE '2026-01-01'",
    "TIMESTAMP '2026-01-01 00:00:00'",
    "X'00ff'",
    "now()",
    "'\u{1F980}'",
];

/// One token: mostly the corpus's, else a keyword, a symbol or a literal.
fn token(u: &mut Unstructured) -> arbitrary::Result<String> {
    Ok(match u.int_in_range(0..=9)? {
        0..=4 => u.choose(corpus_tokens())?.clone(),
        5 | 6 => u.choose(ALL_KEYWORDS)?.to_string(),
        7 => u.choose(SYMBOLS)?.to_string(),
        _ => u.choose(LITERALS)?.to_string(),
    })
}

/// Random tokens separated by spaces.
fn soup(u: &mut Unstructured) -> arbitrary::Result<String> {
    let n = u.int_in_range(1..=40)?;
    let words = (0..n)
        .map(|_| token(u))
        .collect::<arbitrary::Result<Vec<_>>>()?;
    Ok(words.join(" "))
}

/// A corpus statement with up to `edits` of its tokens deleted, repeated, swapped, replaced,
/// or with tokens inserted, or a run of another statement's tokens spliced in.
fn mutated(u: &mut Unstructured, edits: usize) -> arbitrary::Result<String> {
    let mut t = tokens(u.choose(corpus())?);
    for _ in 0..u.int_in_range(0..=edits)? {
        if t.is_empty() {
            break;
        }
        let i = u.choose_index(t.len())?;
        let j = u.choose_index(t.len())?;
        match u.int_in_range(0..=6)? {
            0 => {
                t.remove(i);
            }
            1 => t.insert(i, t[i].clone()),
            2 => t.swap(i, j),
            3 => t[i] = format!(" {} ", token(u)?),
            4 => t.insert(i, format!(" {} ", token(u)?)),
            5 => {
                let other = tokens(u.choose(corpus())?);
                if !other.is_empty() {
                    let a = u.choose_index(other.len())?;
                    let b = u.int_in_range(a..=other.len())?;
                    t.splice(i..i, other[a..b].iter().cloned());
                }
            }
            _ => {
                let (a, b) = (i.min(j), i.max(j) + 1);
                let run = t[a..b].to_vec();
                for _ in 0..u.int_in_range(1..=3)? {
                    t.splice(b..b, run.iter().cloned());
                }
            }
        }
    }
    Ok(t.concat())
}

/// Tables the grammar writes statements against (created by [`database`]).
const TABLES: &[(&str, &[&str])] = &[
    ("f_hash", &["k", "s", "v", "d"]),
    ("f_range", &["day", "seq", "amount"]),
    ("f_nonunique", &["a", "b", "auto_incrementing_id"]),
];

const TYPES: &[&str] = &[
    "INT8",
    "TINYINT",
    "INT16",
    "INT32",
    "INT",
    "BIGINT",
    "FLOAT",
    "REAL",
    "DOUBLE",
    "BOOL",
    "STRING",
    "TEXT",
    "VARCHAR",
    "VARCHAR(0)",
    "VARCHAR(3)",
    "VARCHAR(70000)",
    "BINARY",
    "BYTEA",
    "TIMESTAMP",
    "DATE",
    "DECIMAL(38, 0)",
    "DECIMAL(39, 2)",
    "DECIMAL(5, 9)",
    "NUMERIC(10, -3)",
    "DECIMAL(0, 0)",
    "INTERVAL",
    "JSON",
];

/// Statements from a small grammar of what Nyala takes: queries with joins, subqueries and AS
/// OF; writes; CREATE TABLE with partitioning and column attributes; ALTER TABLE.
fn generated(u: &mut Unstructured) -> arbitrary::Result<String> {
    let (table, columns) = *u.choose(TABLES)?;
    let g = Grammar { columns };
    let values = Grammar { columns: &[] };
    Ok(match u.int_in_range(0..=7)? {
        0..=2 => format!(
            "{}{}",
            u.choose(&[
                "",
                "",
                "",
                "EXPLAIN ",
                "EXPLAIN ANALYZE ",
                "EXPLAIN VERBOSE "
            ])?,
            Grammar::query(u, 3)?
        ),
        3 => format!(
            "{} INTO {table} ({}) VALUES ({}), ({})",
            u.choose(&["INSERT", "UPSERT", "INSERT IGNORE"])?,
            columns.join(", "),
            values.list(u, 2, columns.len(), columns.len())?,
            values.list(u, 2, columns.len(), columns.len())?
        ),
        4 => format!(
            "UPDATE {table} SET {} = {} WHERE {}",
            u.choose(columns)?,
            g.expr(u, 3)?,
            g.expr(u, 3)?
        ),
        5 => format!("DELETE FROM {table} WHERE {}", g.expr(u, 3)?),
        6 => g.create_table(u)?,
        _ => format!(
            "ALTER TABLE {table} {}",
            match u.int_in_range(0..=3)? {
                0 => format!(
                    "ADD COLUMN c{} {} DEFAULT {}",
                    u.int_in_range(0..=3)?,
                    u.choose(TYPES)?,
                    u.choose(LITERALS)?
                ),
                1 => format!("DROP COLUMN {}", u.choose(columns)?),
                2 => format!(
                    "RENAME COLUMN {} TO {}",
                    u.choose(columns)?,
                    u.choose(columns)?
                ),
                _ => format!(
                    "{} RANGE PARTITION {} <= VALUES < {}",
                    u.choose(&["ADD", "DROP"])?,
                    u.choose(LITERALS)?,
                    u.choose(LITERALS)?
                ),
            }
        ),
    })
}

struct Grammar<'a> {
    columns: &'a [&'a str],
}

impl Grammar<'_> {
    /// Between `min` and `max` expressions, comma-separated.
    fn list(
        &self,
        u: &mut Unstructured,
        depth: u32,
        min: usize,
        max: usize,
    ) -> arbitrary::Result<String> {
        let n = u.int_in_range(min..=max)?;
        let items = (0..n)
            .map(|_| self.expr(u, depth))
            .collect::<arbitrary::Result<Vec<_>>>()?;
        Ok(items.join(", "))
    }

    fn expr(&self, u: &mut Unstructured, depth: u32) -> arbitrary::Result<String> {
        if depth == 0 || u.ratio(1, 3)? {
            return Ok(match u.int_in_range(0..=2)? {
                0 if !self.columns.is_empty() => u.choose(self.columns)?.to_string(),
                _ => u.choose(LITERALS)?.to_string(),
            });
        }
        let d = depth - 1;
        Ok(match u.int_in_range(0..=9)? {
            0 => format!(
                "{} {} {}",
                self.expr(u, d)?,
                u.choose(&["+", "-", "*", "/", "%", "||"])?,
                self.expr(u, d)?
            ),
            1 => format!(
                "({} {} {})",
                self.expr(u, d)?,
                u.choose(&["=", "<>", "<", "<=", ">", ">=", "LIKE", "IS DISTINCT FROM"])?,
                self.expr(u, d)?
            ),
            2 => format!(
                "({} {} {})",
                self.expr(u, d)?,
                u.choose(&["AND", "OR"])?,
                self.expr(u, d)?
            ),
            3 => format!("{} {}", u.choose(&["NOT", "-", "+"])?, self.expr(u, d)?),
            4 => format!(
                "{}({})",
                u.choose(&[
                    "abs",
                    "upper",
                    "lower",
                    "length",
                    "coalesce",
                    "sum",
                    "count",
                    "avg",
                    "min",
                    "max",
                    "date_trunc",
                    "substr",
                    "round",
                    "nullif",
                    "concat",
                    "to_timestamp",
                    "row_number"
                ])?,
                self.list(u, d, 0, 3)?
            ),
            5 => format!("CAST({} AS {})", self.expr(u, d)?, u.choose(TYPES)?),
            6 => format!(
                "CASE WHEN {} THEN {} ELSE {} END",
                self.expr(u, d)?,
                self.expr(u, d)?,
                self.expr(u, d)?
            ),
            7 => format!("{} IN ({})", self.expr(u, d)?, self.list(u, d, 1, 4)?),
            8 => format!(
                "{} BETWEEN {} AND {}",
                self.expr(u, d)?,
                self.expr(u, d)?,
                self.expr(u, d)?
            ),
            _ => format!("({})", Grammar::query(u, d)?),
        })
    }

    /// A query of one of the tables (with their columns in its expressions).
    fn query(u: &mut Unstructured, depth: u32) -> arbitrary::Result<String> {
        let (table, columns) = *u.choose(TABLES)?;
        let g = Grammar { columns };
        let mut q = format!(
            "SELECT {}{} FROM {table}",
            u.choose(&["", "DISTINCT "])?,
            match u.ratio(1, 4)? {
                true => "*".to_string(),
                false => g.list(u, depth, 1, 3)?,
            }
        );
        if u.ratio(1, 4)? {
            q += &format!(
                " AS OF {}",
                u.choose(&[
                    "now()",
                    "now() - INTERVAL '1 minute'",
                    "TIMESTAMP '2000-01-01 00:00:00'",
                    "'soon'",
                    "1"
                ])?
            );
        }
        if u.ratio(1, 4)? {
            let (other, _) = *u.choose(TABLES)?;
            q += &format!(
                " AS x JOIN {other} AS y ON {}",
                g.expr(u, depth.saturating_sub(1))?
            );
        }
        for clause in [" WHERE", " GROUP BY", " HAVING", " ORDER BY"] {
            if u.ratio(1, 3)? {
                q += &format!("{clause} {}", g.expr(u, depth.saturating_sub(1))?);
            }
        }
        if u.ratio(1, 4)? {
            q += &format!(
                " LIMIT {}",
                u.choose(&["0", "1", "10", "-1", "9223372036854775807"])?
            );
        }
        Ok(q)
    }

    fn create_table(&self, u: &mut Unstructured) -> arbitrary::Result<String> {
        let n = u.int_in_range(1..=4)?;
        let mut columns = Vec::new();
        for i in 0..n {
            let mut c = format!("c{i} {}", u.choose(TYPES)?);
            for attribute in [
                "NOT NULL",
                "NULL",
                "PRIMARY KEY",
                "DEFAULT 1",
                "COMMENT 'x'",
                "ENCODING PLAIN_ENCODING",
                "ENCODING RLE",
                "ENCODING DELTA",
                "COMPRESSION ZSTD",
            ] {
                if u.ratio(1, 8)? {
                    c += &format!(" {attribute}");
                }
            }
            columns.push(c);
        }
        let key = format!("c{}", u.int_in_range(0..=n)?);
        let mut sql = format!(
            "CREATE TABLE {}f_new{} ({}, {}PRIMARY KEY ({key}))",
            u.choose(&["", "IF NOT EXISTS "])?,
            u.int_in_range(0..=3)?,
            columns.join(", "),
            u.choose(&["", "NON UNIQUE "])?
        );
        if u.ratio(1, 2)? {
            sql += &match u.int_in_range(0..=3)? {
                0 => format!(
                    " DISTRIBUTE BY HASH ({key}) INTO {} BUCKETS",
                    u.choose(&["0", "1", "3", "2000", "-1"])?
                ),
                1 => format!(
                    " DISTRIBUTE BY RANGE ({key}) (PARTITION VALUES < {}, PARTITION {} <= VALUES)",
                    u.choose(LITERALS)?,
                    u.choose(LITERALS)?
                ),
                2 => format!(
                    " PARTITION BY HASH PARTITIONS 2, RANGE ({key}) SPLIT ROWS (({}))",
                    u.choose(LITERALS)?
                ),
                _ => format!(
                    " DISTRIBUTE BY HASH ({key}) INTO 2 BUCKETS, HASH ({key}) INTO 2 BUCKETS"
                ),
            };
        }
        if u.ratio(1, 4)? {
            sql += &format!(" WITH (replicas = {})", u.choose(&["1", "3", "0", "x"])?);
        }
        if u.ratio(1, 4)? {
            sql += &format!(" AS {}", Grammar::query(u, 1)?);
        }
        Ok(sql)
    }
}

/// Text for the parser: a token soup, a mutated corpus statement, a generated one, or any.
fn text(u: &mut Unstructured) -> arbitrary::Result<String> {
    match u.int_in_range(0..=9)? {
        0 | 1 => soup(u),
        2..=5 => mutated(u, 4),
        6..=8 => generated(u),
        _ => u.arbitrary(),
    }
}

/// A statement for the planner: mostly one that parses (a corpus statement with a few
/// mutations or none, a generated one), sometimes a token soup.
fn statement(u: &mut Unstructured) -> arbitrary::Result<String> {
    match u.int_in_range(0..=9)? {
        0 => soup(u),
        1..=4 => mutated(u, 2),
        _ => generated(u),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A database with the grammar's tables and a few rows, some of them flushed.
async fn database(dir: &std::path::Path) -> Arc<Database> {
    let (db, session) = super::open(dir).await;
    for sql in [
        "CREATE TABLE f_hash (k BIGINT, s STRING, v DOUBLE, d DECIMAL(10, 2), PRIMARY KEY (k)) \
         DISTRIBUTE BY HASH (k) INTO 2 BUCKETS",
        "INSERT INTO f_hash VALUES (1, 'a', 0.5, 1.25), (2, NULL, -1, NULL), \
         (3, 'c', 1e300, 99.99)",
        "CREATE TABLE f_range (day DATE, seq BIGINT, amount VARCHAR(8), PRIMARY KEY (day, seq)) \
         DISTRIBUTE BY RANGE (day) (PARTITION VALUES < '2026-01-01', \
         PARTITION '2026-01-01' <= VALUES)",
        "INSERT INTO f_range VALUES ('2025-06-01', 1, 'x'), ('2026-02-01', 2, NULL)",
        "CREATE TABLE f_nonunique (a INT, b TIMESTAMP, NON UNIQUE PRIMARY KEY (a))",
        "INSERT INTO f_nonunique VALUES (1, now()), (1, NULL)",
    ] {
        super::run(&session, sql).await;
    }
    // The corpus's tables, so that its statements find them (some fail: they are meant to).
    for sql in corpus() {
        if sql.starts_with("CREATE TABLE") || sql.starts_with("INSERT") {
            let _ = plan_and_run(&db, sql).await;
        }
    }
    db
}

/// Plans `sql` in a new session of `db` (with parameters if it has placeholders) and runs it
/// for a bounded time, reading a bounded number of batches. Errors are fine.
async fn plan_and_run(db: &Arc<Database>, sql: &str) {
    let session: Session = db.session();
    let params = match sql.contains('?') || sql.contains('$') {
        true => vec![ScalarValue::Int64(Some(1)), ScalarValue::Utf8(None)],
        false => vec![],
    };
    let Ok(planned) = session.plan_with_params(sql, &params).await else {
        return;
    };
    let limit = Duration::from_secs(3);
    let Ok(Ok(stream)) = tokio::time::timeout(limit, planned.execute()).await else {
        return;
    };
    let _ = tokio::time::timeout(limit, stream.take(16).for_each(|_| async {})).await;
}

#[test]
fn fuzz_parser_takes_any_text() {
    Fuzz::new("sql_parser", 20_000).run(text, |sql| {
        let _ = NyalaParser::parse_sql(&sql);
        let _ = NyalaParser::split_statements(&sql);
    });
}

#[test]
fn fuzz_planner_takes_any_statement() {
    let runtime = runtime();
    let dir = tempfile::tempdir().unwrap();
    let db = runtime.block_on(database(dir.path()));
    Fuzz::new("sql_planner", 2000)
        .watch_threads(&["tokio-rt-worker"])
        .run(statement, |sql| {
            runtime.block_on(plan_and_run(&db, &sql));
        });
}

/// Parses, plans and runs `sql` as a server does: in a task on a runtime worker thread (the
/// default 2 MiB stack). An error or a result is fine; a stack overflow aborts the test binary.
fn deep(sql: String) {
    let runtime = runtime();
    let dir = tempfile::tempdir().unwrap();
    let db = runtime.block_on(database(dir.path()));
    let task = runtime.spawn(async move {
        let _ = NyalaParser::parse_sql(&sql);
        plan_and_run(&db, &sql).await;
    });
    runtime.block_on(task).unwrap();
}

/// 10 000 levels: sqlparser's recursion limit (50) refuses nested parentheses, calls,
/// subqueries, NOT and unary minus; left-associative chains (`1 + 1 + ...`, `a OR a OR ...`,
/// casts, `||`, UNION) parse without recursion into trees that deep.
const DEPTH: usize = 10_000;

#[test]
fn fuzz_deep_parentheses() {
    deep(format!(
        "SELECT {}1{}",
        "(".repeat(DEPTH),
        ")".repeat(DEPTH)
    ));
}

// The chains below overflowed the stack while they were planned (DataFusion's `Expr::clone`
// in `SqlToRel::select_to_plan`, `set_expr_to_plan` and sqlparser's `Spanned for SetExpr` for
// UNION, `dml::plan_mutations` for the DELETE); the parser now refuses statements nesting
// deeper than `MAX_EXPRESSION_DEPTH` before anything walks them.

#[test]
fn fuzz_deep_sums() {
    deep(format!("SELECT {}1", "1 + ".repeat(DEPTH)));
}

#[test]
fn fuzz_deep_ors() {
    deep(format!(
        "SELECT * FROM f_hash WHERE {}k = 1",
        "k = 1 OR ".repeat(DEPTH)
    ));
}

#[test]
fn fuzz_deep_ands_in_a_delete() {
    deep(format!(
        "DELETE FROM f_hash WHERE {}k = 1",
        "k > 0 AND ".repeat(DEPTH)
    ));
}

#[test]
fn fuzz_deep_casts() {
    deep(format!("SELECT 1{}", "::BIGINT".repeat(DEPTH)));
}

#[test]
fn fuzz_deep_concatenations() {
    deep(format!("SELECT {}s FROM f_hash", "s || ".repeat(DEPTH)));
}

#[test]
fn fuzz_deep_unions() {
    deep(format!("SELECT 1{}", " UNION ALL SELECT 1".repeat(DEPTH)));
}

#[test]
fn fuzz_deep_nots() {
    deep(format!("SELECT {}true", "NOT ".repeat(DEPTH)));
}

#[test]
fn fuzz_deep_negations() {
    deep(format!("SELECT {}1", "- ".repeat(DEPTH)));
}

#[test]
fn fuzz_deep_function_calls() {
    deep(format!(
        "SELECT {}1{}",
        "abs(".repeat(DEPTH),
        ")".repeat(DEPTH)
    ));
}

#[test]
fn fuzz_deep_subqueries() {
    deep(format!(
        "SELECT * FROM {}f_hash{}",
        "(SELECT * FROM ".repeat(DEPTH),
        ")".repeat(DEPTH)
    ));
}

#[test]
fn fuzz_long_in_list() {
    let list: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    deep(format!(
        "SELECT * FROM f_hash WHERE k IN ({})",
        list.join(", ")
    ));
}
