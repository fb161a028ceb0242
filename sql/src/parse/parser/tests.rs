use datafusion::sql::sqlparser::ast::{Visit, Visitor};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use nyala_engine::ColumnChange;
use nyala_storage::{ColumnCompression, ColumnEncoding, ColumnType};

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;
use nyala_engine::{BoundSpec, RangeSpec};

use super::*;
use crate::parse::dialect::NyalaDialect;
use crate::parse::partitioning::PartitionSpec;
use crate::parse::statement::ColumnAlteration;
use crate::parse::statement::{CreateTableAsSpec, CreateTableSpec, Ddl, NyalaStatement, Show};
use crate::Result;

fn parse(sql: &str) -> Result<NyalaStatement> {
    NyalaParser::parse_sql(sql)
}

fn error(sql: &str) -> String {
    match parse(sql) {
        Ok(statement) => panic!("{sql} parsed: {statement:?}"),
        Err(e) => e.to_string(),
    }
}

fn create_table(sql: &str) -> CreateTableSpec {
    match parse(sql) {
        Ok(NyalaStatement::Ddl(Ddl::CreateTable(spec))) => spec,
        other => panic!("{sql}: not a CREATE TABLE: {other:?}"),
    }
}

fn create_table_as(sql: &str) -> CreateTableAsSpec {
    match parse(sql) {
        Ok(NyalaStatement::CreateTableAs(spec)) => spec,
        other => panic!("{sql}: not a CREATE TABLE AS: {other:?}"),
    }
}

fn datafusion(sql: &str) -> Statement {
    match parse(sql) {
        Ok(NyalaStatement::DataFusion(statement)) => *statement,
        other => panic!("{sql}: not for DataFusion: {other:?}"),
    }
}

/// Only the partitioning clause, after `DISTRIBUTE BY` / `PARTITION BY`.
fn partitioning(clause: &str) -> Result<PartitionSpec> {
    let dialect = NyalaDialect::default();
    let mut parser = NyalaParser::new(&dialect, clause)?;
    if !(parser
        .parser
        .parse_keywords(&[Keyword::DISTRIBUTE, Keyword::BY])
        || parser
            .parser
            .parse_keywords(&[Keyword::PARTITION, Keyword::BY]))
    {
        return Err(parser.unexpected("DISTRIBUTE BY or PARTITION BY"));
    }
    let spec = parser.parse_partitioning()?;
    match parser.parser.peek_token_ref().token {
        Token::EOF => Ok(spec),
        _ => Err(parser.unexpected("end of the partitioning clause")),
    }
}

/// Each table reference of `statement`: its name, its AS OF time and its alias.
fn table_references(statement: &Statement) -> Vec<(String, Option<String>, Option<String>)> {
    struct Tables(Vec<(String, Option<String>, Option<String>)>);
    impl Visitor for Tables {
        type Break = ();
        fn pre_visit_table_factor(
            &mut self,
            factor: &datafusion::sql::sqlparser::ast::TableFactor,
        ) -> ControlFlow<()> {
            if let datafusion::sql::sqlparser::ast::TableFactor::Table {
                name,
                version,
                alias,
                ..
            } = factor
            {
                self.0.push((
                    name.to_string(),
                    version.as_ref().map(ToString::to_string),
                    alias.as_ref().map(|a| a.name.to_string()),
                ));
            }
            ControlFlow::Continue(())
        }
    }
    let mut tables = Tables(vec![]);
    let _ = statement.visit(&mut tables);
    tables.0
}

fn bound(v: &str, inclusive: bool) -> Option<BoundSpec> {
    Some(BoundSpec {
        values: vec![v.into()],
        inclusive,
    })
}

#[test]
fn splits_scripts_respecting_quotes_and_comments() {
    let parts =
        NyalaParser::split_statements("SELECT ';' ; -- a ; comment\n INSERT INTO t VALUES (1);;")
            .unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0], "SELECT ';'");
    assert!(parts[1].ends_with("INSERT INTO t VALUES (1)"));
    assert!(NyalaParser::split_statements("SELECT 'unterminated").is_err());
}

#[test]
fn one_statement_at_a_time() {
    assert!(parse("SELECT 1;;").is_ok());
    for (sql, needle) in [
        ("", "empty statement"),
        (" ; ;", "empty statement"),
        ("SELECT 1; SELECT 2", "found several"),
        ("; SELECT 1", "found several"),
        (
            "SELECT 1 2",
            "Expected: end of statement, found: 2 at Line: 1, Column: 10",
        ),
        ("SELEC 1", "Expected: an SQL statement, found: SELEC"),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn create_table_with_hash_distribution() {
    let spec = create_table(
        "CREATE TABLE Metrics (host STRING, ts TIMESTAMP, metric STRING, value DOUBLE, \
         PRIMARY KEY (host, metric, ts)) DISTRIBUTE BY HASH (host, metric) INTO 4 BUCKETS;",
    );
    assert_eq!(spec.name, "metrics");
    assert!(!spec.if_not_exists);
    assert_eq!(spec.replicas, 0);
    assert_eq!(spec.partition.hash.len(), 1);
    assert_eq!(spec.partition.hash[0].buckets, 4);
    assert_eq!(spec.partition.hash[0].columns, vec![0, 2]);
    assert_eq!(spec.schema.key_columns(), &[0, 2, 1]);
    assert!(!spec.schema.columns()[1].nullable);
    assert!(spec.schema.columns()[3].nullable);

    let plain = create_table("CREATE TABLE IF NOT EXISTS public.t (k INT PRIMARY KEY)");
    assert!(plain.if_not_exists);
    assert_eq!(plain.partition.num_tablets(), 1);
}

#[test]
fn impala_synonym_and_column_primary_key() {
    let spec = create_table(
        "create table t (id bigint primary key, v int8) partition by hash (id) partitions 3",
    );
    assert_eq!(spec.partition.num_tablets(), 3);
    assert_eq!(spec.schema.columns()[1].column_type, ColumnType::Int8);
}

#[test]
fn non_unique_primary_key() {
    let spec = create_table(
        "CREATE TABLE v (user_id BIGINT, page STRING, NON UNIQUE PRIMARY KEY (user_id)) \
         DISTRIBUTE BY HASH INTO 3 BUCKETS",
    );
    let hidden = spec.schema.auto_increment_column().unwrap();
    assert_eq!(spec.schema.columns()[hidden].name, "auto_incrementing_id");
    assert_eq!(spec.schema.declared_key_columns(), &[0]);
    assert_eq!(spec.partition.num_tablets(), 3);
    // A column may be called `non`.
    let spec = create_table("CREATE TABLE n (non INT PRIMARY KEY, unique_ INT)");
    assert_eq!(spec.schema.auto_increment_column(), None);
}

#[test]
fn storage_attributes_of_columns() {
    let spec = create_table(
        "CREATE TABLE s (id BIGINT ENCODING DELTA COMPRESSION ZSTD PRIMARY KEY, \
         host STRING NOT NULL COMPRESSION lz4 ENCODING \"PREFIX_ENCODING\", plain DOUBLE)",
    );
    let columns = spec.schema.columns();
    assert_eq!(columns[0].encoding, ColumnEncoding::parse("DELTA").unwrap());
    assert_eq!(
        columns[0].compression,
        ColumnCompression::parse("ZSTD").unwrap()
    );
    assert_eq!(
        columns[1].encoding,
        ColumnEncoding::parse("PREFIX_ENCODING").unwrap()
    );
    assert_eq!(
        columns[1].compression,
        ColumnCompression::parse("LZ4").unwrap()
    );
    assert!(!columns[1].nullable);
    assert_eq!(columns[2].encoding, ColumnEncoding::Auto);
    assert_eq!(columns[2].compression, ColumnCompression::Default);

    let NyalaStatement::Ddl(Ddl::AlterColumns { name, changes }) = parse(
        "ALTER TABLE s ADD COLUMN n BIGINT ENCODING DELTA, \
         ADD COLUMN IF NOT EXISTS t STRING DEFAULT 'z' COMPRESSION NO_COMPRESSION, \
         DROP COLUMN plain",
    )
    .unwrap() else {
        panic!("not an ALTER TABLE")
    };
    assert_eq!(name, "s");
    let [ColumnAlteration {
        change: ColumnChange::Add(n),
        if_exists: false,
    }, ColumnAlteration {
        change: ColumnChange::Add(t),
        if_exists: true,
    }, ColumnAlteration {
        change: ColumnChange::Drop(dropped),
        if_exists: false,
    }] = changes.as_slice()
    else {
        panic!("{changes:?}")
    };
    assert_eq!(n.encoding, ColumnEncoding::parse("DELTA").unwrap());
    assert_eq!(
        t.compression,
        ColumnCompression::parse("NO_COMPRESSION").unwrap()
    );
    assert_eq!(t.default.as_deref(), Some("z"));
    assert_eq!(dropped, "plain");

    for (sql, needle) in [
        (
            "ALTER TABLE s DROP COLUMN tag ENCODING RLE",
            "ENCODING and COMPRESSION go after the type of a column being defined",
        ),
        (
            "CREATE TABLE bad (n BIGINT, PRIMARY KEY (n) ENCODING PLAIN_ENCODING)",
            "ENCODING and COMPRESSION go after the type of a column being defined",
        ),
        (
            "CREATE TABLE bad (n BIGINT PRIMARY KEY ENCODING ZIGZAG)",
            "unknown encoding ZIGZAG (column 'n')",
        ),
        (
            "CREATE TABLE bad (n BIGINT PRIMARY KEY, s STRING COMPRESSION SNAPPY)",
            "unknown compression SNAPPY (column 's')",
        ),
        (
            "CREATE TABLE bad (n BIGINT PRIMARY KEY ENCODING 5)",
            "Expected: identifier, found: 5",
        ),
        (
            "CREATE TABLE bad (n BIGINT PRIMARY KEY ENCODING",
            "found: EOF",
        ),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn table_options() {
    let spec = create_table(
        "CREATE TABLE r (id BIGINT PRIMARY KEY) DISTRIBUTE BY HASH (id) INTO 2 BUCKETS \
         WITH (replicas = 3)",
    );
    assert_eq!(spec.replicas, 3);
    // The clauses may come in either order.
    let spec = create_table(
        "CREATE TABLE r (id BIGINT PRIMARY KEY) WITH (REPLICAS = 1) \
         DISTRIBUTE BY HASH (id) INTO 2 BUCKETS",
    );
    assert_eq!((spec.replicas, spec.partition.num_tablets()), (1, 2));
    for (sql, needle) in [
        (
            "WITH (colour = 2)",
            "not supported: table option 'colour = 2'",
        ),
        (
            "WITH (replicas = 0)",
            "replicas must be a whole number from 1, got 0",
        ),
        (
            "WITH (replicas = -1)",
            "replicas must be a whole number from 1, got -1",
        ),
        ("WITH (replicas = 1.5)", "got 1.5"),
        (
            "WITH (replicas = 99999999999999999999999)",
            "got 99999999999999999999999",
        ),
        ("WITH (replicas = 1", "Expected: ), found: EOF"),
        ("WITH (replicas = 1) WITH (replicas = 1)", "given twice"),
        (
            "WITH replicas = 1",
            "Expected: end of statement, found: WITH",
        ),
    ] {
        let sql = format!("CREATE TABLE r (id BIGINT PRIMARY KEY) {sql}");
        let e = error(&sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn create_table_as_select() {
    let spec = create_table_as(
        "CREATE TABLE IF NOT EXISTS \"Named\" PRIMARY KEY (ID) DISTRIBUTE BY HASH (id) INTO 2 \
         BUCKETS WITH (replicas = 1) AS SELECT f.id, d.name FROM facts f JOIN dim d ON f.id = d.id",
    );
    assert_eq!(spec.name, "Named");
    assert!(spec.if_not_exists);
    assert_eq!(spec.replicas, 1);
    assert_eq!(spec.key, vec!["id".to_string()]);
    assert_eq!(spec.partition.hash, vec![(vec!["id".to_string()], 2)]);
    assert_eq!(
        spec.query.to_string(),
        "SELECT f.id, d.name FROM facts f JOIN dim d ON f.id = d.id"
    );
    let spec = create_table_as("CREATE TABLE g (PRIMARY KEY (g)) AS (VALUES (1))");
    assert_eq!(spec.key, vec!["g".to_string()]);
    let spec = create_table_as(
        "CREATE TABLE w PRIMARY KEY (a) AS WITH x AS (SELECT 1 AS a) SELECT a FROM x",
    );
    assert_eq!(spec.key, vec!["a".to_string()]);
    // Without a key: keyed by the hidden auto_incrementing_id alone.
    let spec = create_table_as("CREATE TABLE nokey AS SELECT id FROM facts");
    assert!(spec.key.is_empty());

    for (sql, needle) in [
        (
            "CREATE TABLE c (a INT PRIMARY KEY) AS SELECT 1 AS a",
            "takes its columns from the query",
        ),
        (
            "CREATE TABLE c (a INT, NON UNIQUE PRIMARY KEY (a)) AS SELECT 1 AS a",
            "takes its columns from the query",
        ),
        (
            "CREATE TABLE c NON UNIQUE PRIMARY KEY (a) AS SELECT 1 AS a",
            "not supported: NON UNIQUE PRIMARY KEY in CREATE TABLE ... AS SELECT",
        ),
        (
            "CREATE TABLE c PRIMARY KEY (a)",
            "Expected: AS followed by a query",
        ),
        (
            "CREATE TABLE c PRIMARY KEY (a) AS INSERT INTO t VALUES (1)",
            "expected a query after AS, found INSERT INTO t VALUES (1)",
        ),
        (
            "CREATE TABLE c PRIMARY KEY (a AS SELECT 1",
            "Expected: ), found: SELECT",
        ),
        (
            "CREATE TABLE c (PRIMARY KEY (a), UNIQUE (a)) AS SELECT 1 AS a",
            "not supported: table constraint UNIQUE",
        ),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn bad_ddl_gets_clear_errors() {
    for (sql, needle) in [
        ("CREATE TABLE t", "table 't' needs columns"),
        ("CREATE TABLE t (a INT, PRIMARY KEY (b))", "'b'"),
        (
            "CREATE TABLE t (a INT PRIMARY KEY, PRIMARY KEY (a))",
            "declared twice",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY) DISTRIBUTE BY HASH (z) INTO 2 BUCKETS",
            "unknown column 'z' in DISTRIBUTE BY HASH",
        ),
        ("CREATE TABLE t (a INT PRIMARY KEY, b GEOMETRY)", "GEOMETRY"),
        (
            "CREATE TABLE t (a INT PRIMARY KEY, b VARCHAR(0))",
            "VARCHAR(0)",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY, b VARCHAR(99999999999))",
            "the length must be 1 to 65535",
        ),
        (
            "CREATE TABLE t (a DECIMAL(300, 2) PRIMARY KEY)",
            "precision must be 1 to 38",
        ),
        (
            "CREATE TABLE t (a DECIMAL(10, 11) PRIMARY KEY)",
            "precision must be 1 to 38",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY,)",
            "column name or constraint definition, found: )",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY",
            "',' or ')' after column definition, found: EOF",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY) garbage",
            "end of statement, found: garbage",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY, FOREIGN KEY (a) REFERENCES u (b))",
            "table constraint FOREIGN KEY",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY UNIQUE)",
            "column option UNIQUE",
        ),
        (
            "CREATE OR REPLACE TABLE t (a INT PRIMARY KEY)",
            "not supported: CREATE OR REPLACE",
        ),
        (
            "CREATE TEMPORARY TABLE t (a INT PRIMARY KEY)",
            "not supported: CREATE OR REPLACE",
        ),
        (
            "CREATE TABLE t (a INT DEFAULT 'x' PRIMARY KEY)",
            "DEFAULT 'x' of column 'a' is not a INT32 literal",
        ),
        (
            "CREATE TABLE t (a INT PRIMARY KEY) DISTRIBUTE BY HASH (a) INTO 2 BUCKETS \
             DISTRIBUTE BY HASH (a) INTO 2 BUCKETS",
            "given twice",
        ),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn range_partitions_with_hash_levels_of_their_own() {
    let spec = partitioning(
        "DISTRIBUTE BY HASH (a) INTO 2 BUCKETS, RANGE (ts) (\
         PARTITION VALUES < 1 HASH (a) INTO 4 BUCKETS, HASH (b) PARTITIONS 3, \
         PARTITION 1 <= VALUES < 2, PARTITION 2 <= VALUES HASH INTO 8 BUCKETS)",
    )
    .unwrap();
    let (_, ranges) = spec.range.unwrap();
    let level = |columns: &[&str], buckets| nyala_engine::HashSpec {
        columns: columns.iter().map(|c| c.to_string()).collect(),
        buckets,
    };
    let hashes: Vec<_> = ranges.iter().map(|r| r.hash.clone()).collect();
    assert_eq!(
        hashes,
        vec![
            vec![level(&["a"], 4), level(&["b"], 3)],
            vec![],
            vec![level(&[], 8)]
        ]
    );
    let e = partitioning("DISTRIBUTE BY RANGE (ts) (PARTITION VALUES < 1 HASH (a) INTO BUCKETS)")
        .unwrap_err()
        .to_string();
    assert!(!e.is_empty());
}

#[test]
fn hash_levels_and_range_partitions() {
    let spec = partitioning(
        "DISTRIBUTE BY HASH (a, B) INTO 16 BUCKETS, HASH INTO 4 BUCKETS, RANGE (ts) (\
         PARTITION VALUES < '2026-01-01', PARTITION '2026-01-01' <= VALUES < '2027-01-01', \
         PARTITION VALUE = (-5), PARTITION 7 < VALUES, PARTITION VALUES <= DATE '2020-01-01', \
         PARTITION (1, TRUE) <= VALUES < (2, false))",
    )
    .unwrap();
    assert_eq!(
        spec.hash,
        vec![(vec!["a".to_string(), "b".to_string()], 16), (vec![], 4)]
    );
    let (columns, ranges) = spec.range.unwrap();
    assert_eq!(columns, vec!["ts".to_string()]);
    assert_eq!(
        ranges,
        vec![
            RangeSpec {
                hash: vec![],
                lower: None,
                upper: bound("2026-01-01", false)
            },
            RangeSpec {
                hash: vec![],
                lower: bound("2026-01-01", true),
                upper: bound("2027-01-01", false)
            },
            RangeSpec {
                hash: vec![],
                lower: bound("-5", true),
                upper: bound("-5", true)
            },
            RangeSpec {
                hash: vec![],
                lower: bound("7", false),
                upper: None
            },
            RangeSpec {
                hash: vec![],
                lower: None,
                upper: bound("2020-01-01", true)
            },
            RangeSpec {
                hash: vec![],
                lower: Some(BoundSpec {
                    values: vec!["1".into(), "true".into()],
                    inclusive: true
                }),
                upper: Some(BoundSpec {
                    values: vec!["2".into(), "false".into()],
                    inclusive: false
                }),
            },
        ]
    );
}

#[test]
fn split_rows_and_impala_synonyms() {
    let spec =
        partitioning("PARTITION BY HASH (a) PARTITIONS 3, RANGE (ts) SPLIT ROWS ((10), (20))")
            .unwrap();
    assert_eq!(spec.hash, vec![(vec!["a".to_string()], 3)]);
    let (_, ranges) = spec.range.unwrap();
    assert_eq!(
        ranges,
        vec![
            RangeSpec {
                hash: vec![],
                lower: None,
                upper: bound("10", false)
            },
            RangeSpec {
                hash: vec![],
                lower: bound("10", true),
                upper: bound("20", false)
            },
            RangeSpec {
                hash: vec![],
                lower: bound("20", true),
                upper: None
            },
        ]
    );
    let bare = partitioning("DISTRIBUTE BY RANGE (ts)").unwrap();
    assert_eq!(
        bare.range.unwrap().1,
        vec![RangeSpec {
            hash: vec![],
            lower: None,
            upper: None
        }]
    );
    let empty = partitioning("DISTRIBUTE BY RANGE (ts) ()").unwrap();
    assert_eq!(empty.range.unwrap().1, vec![]);
}

#[test]
fn bad_partitioning_clauses_get_clear_errors() {
    for (sql, needle) in [
        (
            "DISTRIBUTE BY HASH (a) INTO BUCKETS",
            "Expected: literal int, found: BUCKETS at Line: 1, Column: 29",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO -1 BUCKETS",
            "Expected: literal int, found: -",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 1.5 BUCKETS",
            "Could not parse '1.5'",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 99999999999999999999 BUCKETS",
            "Could not parse '99999999999999999999' as u64",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 4294967296 BUCKETS",
            "4294967296 is not a valid number of hash buckets",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 2",
            "Expected: BUCKETS, found: EOF",
        ),
        (
            "DISTRIBUTE BY HASH (a) 2 BUCKETS",
            "Expected: INTO, found: 2",
        ),
        (
            "DISTRIBUTE BY HASH (a INTO 2 BUCKETS",
            "Expected: ), found: INTO",
        ),
        (
            "DISTRIBUTE BY HASH () INTO 2 BUCKETS",
            "Expected: identifier, found: )",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 2 BUCKETS,",
            "Expected: HASH or RANGE, found: EOF",
        ),
        (
            "DISTRIBUTE BY RANGE (a), HASH (b) INTO 2 BUCKETS",
            "the range level must be the last level",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION VALUES > 3)",
            "Expected: < or <=, found: >",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION NULL <= VALUES)",
            "cannot be NULL",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION VALUES < 5",
            "Expected: ), found: EOF",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION VALUES < (5, 6)",
            "Expected: ), found: EOF",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (VALUES < 5)",
            "Expected: PARTITION, found: VALUES",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION VALUES < x)",
            "Expected: a literal range bound, found: x",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION VALUES < - x)",
            "Expected: a number after -, found: x",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION VALUES < DATE 5)",
            "Expected: a quoted date or time, found: 5",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION 5 VALUES)",
            "Expected: < or <=, found: VALUES",
        ),
        (
            "DISTRIBUTE BY RANGE (a) (PARTITION 5 <= VALUE)",
            "Expected: VALUES, found: VALUE",
        ),
        (
            "DISTRIBUTE BY RANGE (a) SPLIT ROWS ((1), (2)",
            "Expected: ), found: EOF",
        ),
        (
            "DISTRIBUTE BY RANGE (a) SPLIT ((1))",
            "Expected: ROWS, found: (",
        ),
        (
            "DISTRIBUTE BY HASH (a) INTO 2 BUCKETS extra",
            "found: extra",
        ),
        (
            "DISTRIBUTE BY LIST (a)",
            "Expected: HASH or RANGE, found: LIST",
        ),
        ("DISTRIBUTE (a)", "Expected: DISTRIBUTE BY or PARTITION BY"),
    ] {
        let e = partitioning(sql).unwrap_err().to_string();
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn range_partitions_added_and_dropped() {
    let NyalaStatement::Ddl(Ddl::AlterRangePartition { name, add, range }) = parse(
        "ALTER TABLE nyala.public.Events ADD RANGE PARTITION '2026-03-01' <= VALUES < '2026-04-01'",
    )
    .unwrap() else {
        panic!("not a range partition")
    };
    assert_eq!((name.as_str(), add), ("events", true));
    assert_eq!(
        range,
        RangeSpec {
            hash: vec![],
            lower: bound("2026-03-01", true),
            upper: bound("2026-04-01", false)
        }
    );
    let NyalaStatement::Ddl(Ddl::AlterRangePartition { add, range, .. }) =
        parse("alter table events drop range partition value = 7;").unwrap()
    else {
        panic!("not a range partition")
    };
    assert!(!add);
    assert_eq!(range.lower, range.upper);

    let NyalaStatement::Ddl(Ddl::RenameTable { name, new_name }) =
        parse("ALTER TABLE codes RENAME TO country_codes").unwrap()
    else {
        panic!("not a rename")
    };
    assert_eq!(
        (name.as_str(), new_name.as_str()),
        ("codes", "country_codes")
    );

    for (sql, needle) in [
        (
            "ALTER TABLE t ADD RANGE PARTITION",
            "Expected: a literal range bound, found: EOF",
        ),
        (
            "ALTER TABLE t ADD RANGE PARTITION VALUES < 5 extra",
            "end of statement, found: extra",
        ),
        (
            "ALTER TABLE t ADD RANGE PARTITION VALUES < 5, VALUES < 6",
            "end of statement, found: ,",
        ),
        (
            "ALTER TABLE other.t DROP RANGE PARTITION VALUES < 5",
            "unknown schema 'other'",
        ),
        (
            "ALTER TABLE t ALTER COLUMN c SET DATA TYPE BIGINT",
            "not supported: ALTER TABLE ... ALTER COLUMN",
        ),
        (
            "ALTER TABLE t ADD COLUMN k INT PRIMARY KEY",
            "cannot join its primary key",
        ),
        ("ALTER TABLE t", "Expected"),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn catalog_statements() {
    for (sql, show) in [
        ("SHOW TABLES", Show::Tables),
        ("show tables;", Show::Tables),
        (
            "SHOW PARTITIONS Metrics",
            Show::Partitions("metrics".into()),
        ),
        ("SHOW PARTITIONS public.\"M\"", Show::Partitions("M".into())),
        ("SHOW CREATE TABLE t", Show::CreateTable("t".into())),
        ("DESCRIBE t", Show::Describe("t".into())),
        (
            "SHOW nyala.runtime_filters",
            Show::Setting("nyala.runtime_filters".into()),
        ),
    ] {
        match parse(sql) {
            Ok(NyalaStatement::Show(parsed)) => assert_eq!(parsed, show, "{sql}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    datafusion("SHOW TABLES LIKE 'x%'");
    datafusion("SHOW datafusion.execution.batch_size");
    let NyalaStatement::Ddl(Ddl::DropTable { name, if_exists }) =
        parse("DROP TABLE IF EXISTS t").unwrap()
    else {
        panic!("not a DROP TABLE")
    };
    assert_eq!((name.as_str(), if_exists), ("t", true));
    for (sql, needle) in [
        ("SHOW PARTITIONS", "Expected: identifier, found: EOF"),
        ("SHOW PARTITIONS a b", "end of statement, found: b"),
        (
            "DROP TABLE a, b",
            "not supported: DROP TABLE of several tables",
        ),
        (
            "DROP VIEW v, w",
            "not supported: DROP VIEW of several views",
        ),
        ("DROP INDEX i", "not supported: DROP INDEX"),
        (
            "CREATE MATERIALIZED VIEW v AS SELECT 1",
            "not supported: materialized views",
        ),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn upsert_becomes_replace_insert() {
    let explained = datafusion("EXPLAIN ANALYZE UPSERT INTO t VALUES (1, 2)");
    assert!(
        explained
            .to_string()
            .starts_with("EXPLAIN ANALYZE REPLACE INTO t"),
        "{explained}"
    );
    let Statement::Insert(insert) = datafusion("upsert into t select * from u") else {
        panic!("not an insert")
    };
    assert!(insert.replace_into);
    let e = error("UPSERT INTO");
    assert!(e.contains("Expected: identifier, found: EOF"), "{e}");
    // A quoted "upsert" is a name, not the statement.
    assert!(error("\"UPSERT\" INTO t VALUES (1)").contains("an SQL statement"));
}

#[test]
fn insert_ignore_is_planned_as_the_insert() {
    for (sql, text) in [
        (
            "INSERT IGNORE INTO t VALUES (1)",
            "INSERT INTO t VALUES (1)",
        ),
        (
            "EXPLAIN INSERT IGNORE INTO t SELECT * FROM u",
            "EXPLAIN INSERT INTO t SELECT * FROM u",
        ),
    ] {
        match parse(sql) {
            Ok(NyalaStatement::InsertIgnore(statement)) => {
                assert_eq!(statement.to_string(), text)
            }
            other => panic!("{sql}: {other:?}"),
        }
    }
    let Statement::Insert(insert) = datafusion("INSERT INTO t VALUES (1)") else {
        panic!("not an insert")
    };
    assert!(!insert.ignore);
}

#[test]
fn update_from_is_nyala_s() {
    for (sql, explain) in [
        ("UPDATE t SET v = s.v FROM s WHERE t.k = s.k", None),
        (
            "EXPLAIN ANALYZE VERBOSE UPDATE t SET v = 1 FROM s",
            Some((true, true)),
        ),
    ] {
        match parse(sql) {
            Ok(NyalaStatement::UpdateFrom {
                update,
                explain: parsed,
            }) => {
                assert_eq!(parsed, explain, "{sql}");
                assert_eq!(update.table.to_string(), "t");
            }
            other => panic!("{sql}: {other:?}"),
        }
    }
    datafusion("UPDATE t SET v = 1 WHERE k = 2");
}

#[test]
fn as_of_is_the_table_version() {
    let interval = "now() - INTERVAL '2 seconds'";
    let as_of = |alias: Option<&str>| {
        (
            "tt".to_string(),
            Some(format!("FOR SYSTEM_TIME AS OF {interval}")),
            alias.map(str::to_string),
        )
    };
    for (sql, tables) in [
        (
            format!("SELECT k FROM tt AS OF {interval} ORDER BY k"),
            vec![as_of(None)],
        ),
        (
            format!("SELECT k FROM tt FOR SYSTEM_TIME AS OF {interval} WHERE k = 2"),
            vec![as_of(None)],
        ),
        (
            format!("SELECT count(*) FROM tt AS OF {interval} AS old WHERE old.v = 'two'"),
            vec![as_of(Some("old"))],
        ),
        (
            format!("SELECT * FROM tt for system_time as of {interval} old, u"),
            vec![as_of(Some("old")), ("u".into(), None, None)],
        ),
        (
            format!(
                "SELECT tt.k, now_.v FROM tt AS OF {interval} LEFT JOIN tt AS now_ ON tt.k = now_.k"
            ),
            vec![as_of(None), ("tt".into(), None, Some("now_".into()))],
        ),
        (
            format!("SELECT * FROM (SELECT * FROM tt AS OF {interval}) AS sub"),
            vec![as_of(None)],
        ),
        (
            format!("SELECT * FROM u WHERE k IN (SELECT k FROM tt AS OF {interval})"),
            vec![("u".into(), None, None), as_of(None)],
        ),
        (
            format!("SELECT * FROM (tt AS OF {interval} JOIN u ON tt.k = u.k)"),
            vec![as_of(None), ("u".into(), None, None)],
        ),
        (
            format!("WITH c AS (SELECT * FROM tt AS OF {interval}) SELECT * FROM c"),
            vec![as_of(None), ("c".into(), None, None)],
        ),
        (
            format!("INSERT INTO x SELECT * FROM tt AS OF {interval} UNION SELECT * FROM tt"),
            vec![as_of(None), ("tt".into(), None, None)],
        ),
        // Aliases that sqlparser's own versioning syntax would take are still aliases.
        (
            "SELECT * FROM tt at, tt before, tt \"of\"".into(),
            vec![
                ("tt".into(), None, Some("at".into())),
                ("tt".into(), None, Some("before".into())),
                ("tt".into(), None, Some("\"of\"".into())),
            ],
        ),
    ] {
        assert_eq!(table_references(&datafusion(&sql)), tables, "{sql}");
    }
    let spec = create_table_as(&format!(
        "CREATE TABLE restored PRIMARY KEY (k) AS SELECT * FROM tt AS OF {interval}"
    ));
    assert_eq!(
        table_references(&Statement::Query(spec.query)),
        vec![as_of(None)]
    );
    // A column alias "of" is not a time.
    datafusion("SELECT 1 AS of");

    for (sql, needle) in [
        (
            "SELECT * FROM tt AS OF",
            "AS OF needs a time: sql parser error: Expected: an expression, found: EOF",
        ),
        ("SELECT * FROM tt AS OF (", "AS OF needs a time"),
        (
            "SELECT * FROM tt FOR SYSTEM_TIME AS OF",
            "AS OF needs a time",
        ),
        (
            "SELECT * FROM tt AS OF WHERE k = 1",
            "Expected: end of statement, found: =",
        ),
        (
            "SELECT * FROM tt AS OF now() AS",
            "syntax error: sql parser error: Expected: an identifier after AS, found: EOF",
        ),
        (
            "SELECT * FROM (SELECT 1) AS OF now()",
            "follow a table name",
        ),
        (
            "SELECT * FROM tt AS OF now() AS OF now()",
            "follow a table name",
        ),
        ("SELECT * FROM tt FOR SYSTEM_TIME now()", "Expected"),
    ] {
        let e = error(sql);
        assert!(e.contains(needle), "{sql}: {e}");
    }
}

#[test]
fn question_marks_become_numbered_placeholders() {
    for (sql, numbered) in [
        (
            "SELECT * FROM t WHERE a = ? AND b IN (?, '?') AND c = ?7",
            "SELECT * FROM t WHERE a = $1 AND b IN ($2, '?') AND c = $7",
        ),
        (
            "SELECT ? FROM t WHERE k IN (SELECT k FROM u WHERE v = ?) ORDER BY 1 LIMIT ? OFFSET ?",
            "SELECT $1 FROM t WHERE k IN (SELECT k FROM u WHERE v = $2) ORDER BY 1 LIMIT $3 OFFSET $4",
        ),
        (
            "UPDATE t SET a = ?, b = ? WHERE k = ?",
            "UPDATE t SET a = $1, b = $2 WHERE k = $3",
        ),
        (
            "INSERT INTO t VALUES (?, ?), ($3, ?)",
            "INSERT INTO t VALUES ($1, $2), ($3, $3)",
        ),
    ] {
        assert_eq!(datafusion(sql).to_string(), numbered, "{sql}");
    }
    let NyalaStatement::InsertIgnore(statement) =
        parse("INSERT IGNORE INTO t VALUES (?, ?)").unwrap()
    else {
        panic!("not an INSERT IGNORE")
    };
    assert_eq!(statement.to_string(), "INSERT INTO t VALUES ($1, $2)");
}

/// Nyala's dialect reads everything else exactly as GenericDialect does.
#[test]
fn the_dialect_is_generic_elsewhere() {
    for sql in [
        "SELECT a, count(*) AS n FROM t AS x JOIN u ON x.k = u.k WHERE a LIKE 'x%' GROUP BY a \
         HAVING count(*) > 1 ORDER BY n DESC LIMIT 10",
        "WITH c AS (SELECT 1 AS one) SELECT one FROM c UNION ALL SELECT 2",
        "SELECT `quoted`, \"double\", #hash, @at FROM t",
        "SELECT * EXCEPT (a) FROM t",
        "SELECT CAST(a AS BIGINT), a::TEXT, INTERVAL '1' DAY, x'00', ARRAY[1, 2] FROM t",
        "SELECT a FROM t WHERE b IN (SELECT b FROM u) AND EXISTS (SELECT 1)",
        "SELECT row_number() OVER (PARTITION BY a ORDER BY b) FROM t",
        "INSERT INTO t (a, b) VALUES (1, 'x'), (2, NULL)",
        "DELETE FROM t WHERE a = 1",
        "SET datafusion.execution.batch_size = 1024",
        "EXPLAIN ANALYZE SELECT 1",
        "SELECT 1 << 2, 'a' || 'b', {'k': 1}",
    ] {
        let generic =
            Parser::parse_sql(&GenericDialect, sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let nyala = Parser::parse_sql(&NyalaDialect::default(), sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(nyala, generic, "{sql}");
    }
}

/// No prefix of a statement makes the parser panic.
#[test]
fn truncated_statements_are_errors_not_panics() {
    for sql in [
        "CREATE TABLE IF NOT EXISTS t (a BIGINT ENCODING DELTA COMPRESSION ZSTD, b STRING \
         NOT NULL DEFAULT 'x' COMMENT 'c', NON UNIQUE PRIMARY KEY (a)) DISTRIBUTE BY HASH (a) \
         INTO 2 BUCKETS, RANGE (a) (PARTITION VALUES < (-5), PARTITION 1 <= VALUES < 2, \
         PARTITION VALUE = DATE '2020-01-01') WITH (replicas = 1)",
        "CREATE TABLE t (PRIMARY KEY (a)) PARTITION BY HASH PARTITIONS 2, RANGE (a) SPLIT \
         ROWS ((1), (2)) AS SELECT * FROM u FOR SYSTEM_TIME AS OF now() AS x",
        "ALTER TABLE t ADD RANGE PARTITION (1, 'a') <= VALUES < (2, 'b')",
        "ALTER TABLE t ADD COLUMN c INT ENCODING RLE, DROP COLUMN IF EXISTS d",
        "EXPLAIN ANALYZE UPSERT INTO t SELECT * FROM u AS OF now() - INTERVAL '1' MINUTE AS o",
        "SELECT * FROM t AS OF ? WHERE a = ? AND b IN (?, ?)",
        "SHOW PARTITIONS nyala.public.t",
    ] {
        for (end, _) in sql.char_indices() {
            let _ = parse(&sql[..end]);
        }
        let _ = parse(sql);
    }
}
