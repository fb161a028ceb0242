//! The partitioning clause of CREATE TABLE and the range partitions of ALTER TABLE, in Kudu's
//! and Impala's syntax:
//!
//! ```text
//! DISTRIBUTE BY HASH (a, b) INTO 16 BUCKETS, HASH (c) INTO 4 BUCKETS,
//!               RANGE (ts) (PARTITION VALUES < '2026-01-01',
//!                           PARTITION '2026-01-01' <= VALUES < '2027-01-01',
//!                           PARTITION VALUE = '2030-01-01')
//! PARTITION BY HASH (a) PARTITIONS 4, RANGE (ts) SPLIT ROWS (('2026-01-01'), ('2027-01-01'))
//! ```
//!
//! A hash level without columns hashes the whole primary key; `RANGE (ts)` without partitions
//! is one unbounded range. The clause is parsed from sqlparser tokens and turned into the
//! engine's [`PartitionSchema`] once the table's columns are known.

use datafusion::sql::sqlparser::tokenizer::Token;
use nyala_engine::{BoundSpec, HashLevel, PartitionSchema, RangeSpec};
use nyala_storage::Schema;

use crate::{Result, SqlError};

const CLAUSE: &str = "DISTRIBUTE BY HASH (column, ...) INTO n BUCKETS [, HASH ...] \
     [, RANGE (column, ...) (PARTITION lower <= VALUES < upper, ...) | SPLIT ROWS ((value), ...)]";

/// A partitioning clause by column names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionSpec {
    /// Hash levels: column names (empty: the primary key) and bucket count.
    pub hash: Vec<(Vec<String>, u32)>,
    /// The range level: column names and range partitions.
    pub range: Option<(Vec<String>, Vec<RangeSpec>)>,
}

impl PartitionSpec {
    /// One hash level over the primary key (or a single tablet for 1 bucket).
    pub fn hash_key(buckets: u32) -> Self {
        Self {
            hash: if buckets > 1 {
                vec![(vec![], buckets)]
            } else {
                vec![]
            },
            range: None,
        }
    }

    /// Parses `DISTRIBUTE BY ...` or `PARTITION BY ...` (the whole rest of the statement).
    pub fn parse(tokens: &[Token]) -> Result<Self> {
        let mut c = Cursor::new(tokens, CLAUSE);
        if !(c.eat_word("DISTRIBUTE") || c.eat_word("PARTITION")) {
            return Err(c.syntax());
        }
        c.expect_word("BY")?;
        let mut spec = Self::default();
        loop {
            if spec.range.is_some() {
                return Err(SqlError::Invalid(
                    "the range level must be the last level of the partitioning".into(),
                ));
            }
            if c.eat_word("HASH") {
                let columns = match c.peek() == Some(&Token::LParen) {
                    true => c.names()?,
                    false => vec![],
                };
                let buckets = if c.eat_word("PARTITIONS") {
                    c.number()?
                } else {
                    c.expect_word("INTO")?;
                    let n = c.number()?;
                    c.expect_word("BUCKETS")?;
                    n
                };
                spec.hash.push((columns, buckets));
            } else if c.eat_word("RANGE") {
                let columns = c.names()?;
                let ranges = range_partitions(&mut c)?;
                spec.range = Some((columns, ranges));
            } else {
                return Err(c.syntax());
            }
            if !c.eat(&Token::Comma) {
                break;
            }
        }
        match c.next() {
            None => Ok(spec),
            Some(t) => Err(SqlError::Parse(format!(
                "unexpected {t} after the partitioning clause"
            ))),
        }
    }

    /// The engine's partitioning for a table with `schema`.
    pub fn resolve(&self, schema: &Schema) -> Result<PartitionSchema> {
        let indexes = |names: &[String], what: &str| {
            names
                .iter()
                .map(|n| {
                    schema.column_index(n).ok_or_else(|| {
                        SqlError::Invalid(format!("unknown column '{n}' in DISTRIBUTE BY {what}"))
                    })
                })
                .collect::<Result<Vec<_>>>()
        };
        let hash = self
            .hash
            .iter()
            .map(|(names, buckets)| {
                Ok(HashLevel {
                    columns: match names.is_empty() {
                        true => schema.declared_key_columns().to_vec(),
                        false => indexes(names, "HASH")?,
                    },
                    buckets: *buckets,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (range_columns, ranges) = match &self.range {
            Some((names, ranges)) => (indexes(names, "RANGE")?, ranges.clone()),
            None => (vec![], vec![]),
        };
        Ok(PartitionSchema::new(schema, hash, range_columns, ranges)?)
    }
}

/// Parses one range partition, the part after `PARTITION` in a range list or in
/// `ALTER TABLE ... ADD|DROP RANGE PARTITION`.
pub fn parse_range_partition(tokens: &[Token]) -> Result<RangeSpec> {
    let mut c = Cursor::new(
        tokens,
        "lower <= VALUES < upper, VALUES < upper, lower <= VALUES or VALUE = value",
    );
    let range = range_partition(&mut c)?;
    match c.next() {
        None => Ok(range),
        Some(t) => Err(SqlError::Parse(format!(
            "unexpected {t} after the range partition"
        ))),
    }
}

/// The partitioning clause that recreates `partition` (None: a single tablet).
pub fn render(schema: &Schema, partition: &PartitionSchema) -> Option<String> {
    let names = |columns: &[usize]| schema.column_list(columns);
    let mut levels: Vec<String> = partition
        .hash
        .iter()
        .map(|l| format!("HASH ({}) INTO {} BUCKETS", names(&l.columns), l.buckets))
        .collect();
    if !partition.range_columns.is_empty() {
        let mut range = format!("RANGE ({})", names(&partition.range_columns));
        if !matches!(partition.ranges.as_slice(), [only] if only.is_unbounded()) {
            let list: Vec<String> = partition
                .ranges
                .iter()
                .map(|r| format!("PARTITION {r}"))
                .collect();
            range.push_str(&format!(" ({})", list.join(", ")));
        }
        levels.push(range);
    }
    (!levels.is_empty()).then(|| format!("DISTRIBUTE BY {}", levels.join(", ")))
}

/// After `RANGE (columns)`: `(PARTITION ..., ...)`, `SPLIT ROWS (...)` or nothing (one
/// unbounded range).
fn range_partitions(c: &mut Cursor) -> Result<Vec<RangeSpec>> {
    if c.eat_word("SPLIT") {
        c.expect_word("ROWS")?;
        c.expect(&Token::LParen)?;
        let mut splits = Vec::new();
        loop {
            splits.push(c.value()?);
            if !c.eat(&Token::Comma) {
                break;
            }
        }
        c.expect(&Token::RParen)?;
        // Split points cut the key space into ranges: [s_i, s_i+1), unbounded at both ends.
        let bound = |values: &Vec<String>| BoundSpec {
            values: values.clone(),
            inclusive: true,
        };
        let mut ranges = Vec::with_capacity(splits.len() + 1);
        let mut lower = None;
        for split in &splits {
            ranges.push(RangeSpec {
                lower: lower.take(),
                upper: Some(BoundSpec {
                    inclusive: false,
                    ..bound(split)
                }),
            });
            lower = Some(bound(split));
        }
        ranges.push(RangeSpec { lower, upper: None });
        return Ok(ranges);
    }
    if !c.eat(&Token::LParen) {
        return Ok(vec![RangeSpec {
            lower: None,
            upper: None,
        }]);
    }
    let mut ranges = Vec::new();
    if c.eat(&Token::RParen) {
        return Ok(ranges);
    }
    loop {
        c.expect_word("PARTITION")?;
        ranges.push(range_partition(c)?);
        if !c.eat(&Token::Comma) {
            break;
        }
    }
    c.expect(&Token::RParen)?;
    Ok(ranges)
}

/// `VALUE = v`, `VALUES < v`, `v <= VALUES`, `v <= VALUES < w` (`<` or `<=` on either side).
fn range_partition(c: &mut Cursor) -> Result<RangeSpec> {
    if c.eat_word("VALUE") {
        c.expect(&Token::Eq)?;
        let values = c.value()?;
        let bound = BoundSpec {
            values,
            inclusive: true,
        };
        return Ok(RangeSpec {
            lower: Some(bound.clone()),
            upper: Some(bound),
        });
    }
    if c.eat_word("VALUES") {
        let inclusive = c.comparison()?;
        let values = c.value()?;
        return Ok(RangeSpec {
            lower: None,
            upper: Some(BoundSpec { values, inclusive }),
        });
    }
    let values = c.value()?;
    let inclusive = c.comparison()?;
    c.expect_word("VALUES")?;
    let lower = Some(BoundSpec { values, inclusive });
    let upper = match c.peek() {
        Some(Token::Lt | Token::LtEq) => {
            let inclusive = c.comparison()?;
            Some(BoundSpec {
                values: c.value()?,
                inclusive,
            })
        }
        _ => None,
    };
    Ok(RangeSpec { lower, upper })
}

/// The non-whitespace tokens of a clause, read left to right.
struct Cursor<'a> {
    tokens: Vec<&'a Token>,
    at: usize,
    expected: &'static str,
}

impl<'a> Cursor<'a> {
    fn new(tokens: &'a [Token], expected: &'static str) -> Self {
        Self {
            tokens: tokens
                .iter()
                .filter(|t| !matches!(t, Token::Whitespace(_)))
                .collect(),
            at: 0,
            expected,
        }
    }

    fn syntax(&self) -> SqlError {
        let found = match self.tokens.get(self.at) {
            Some(t) => format!("found {t}"),
            None => "found the end of the statement".into(),
        };
        SqlError::Parse(format!("expected {}; {found}", self.expected))
    }

    fn peek(&self) -> Option<&'a Token> {
        self.tokens.get(self.at).copied()
    }

    fn next(&mut self) -> Option<&'a Token> {
        let token = self.peek();
        self.at += usize::from(token.is_some());
        token
    }

    fn eat(&mut self, token: &Token) -> bool {
        let found = self.peek() == Some(token);
        self.at += usize::from(found);
        found
    }

    fn eat_word(&mut self, word: &str) -> bool {
        let found = self
            .peek()
            .is_some_and(|t| crate::statement::is_word(t, word));
        self.at += usize::from(found);
        found
    }

    fn expect(&mut self, token: &Token) -> Result<()> {
        match self.eat(token) {
            true => Ok(()),
            false => Err(self.syntax()),
        }
    }

    fn expect_word(&mut self, word: &str) -> Result<()> {
        match self.eat_word(word) {
            true => Ok(()),
            false => Err(self.syntax()),
        }
    }

    fn number(&mut self) -> Result<u32> {
        let Some(Token::Number(n, _)) = self.peek() else {
            return Err(self.syntax());
        };
        self.at += 1;
        n.parse()
            .map_err(|_| SqlError::Invalid(format!("invalid number of buckets {n}")))
    }

    /// `(a, b, ...)`: column names, normalised.
    fn names(&mut self) -> Result<Vec<String>> {
        self.expect(&Token::LParen)?;
        let mut names = Vec::new();
        loop {
            let Some(Token::Word(w)) = self.peek() else {
                return Err(self.syntax());
            };
            names.push(crate::statement::word_name(w));
            self.at += 1;
            if !self.eat(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RParen)?;
        Ok(names)
    }

    /// `<` (false) or `<=` (true).
    fn comparison(&mut self) -> Result<bool> {
        match self.peek() {
            Some(Token::Lt) => {
                self.at += 1;
                Ok(false)
            }
            Some(Token::LtEq) => {
                self.at += 1;
                Ok(true)
            }
            _ => Err(self.syntax()),
        }
    }

    /// A literal or a parenthesised tuple of literals, as text.
    fn value(&mut self) -> Result<Vec<String>> {
        if !self.eat(&Token::LParen) {
            return Ok(vec![self.literal()?]);
        }
        let mut values = Vec::new();
        loop {
            values.push(self.literal()?);
            if !self.eat(&Token::Comma) {
                break;
            }
        }
        self.expect(&Token::RParen)?;
        Ok(values)
    }

    /// A number (possibly negative), a string, TRUE/FALSE, or `DATE '...'`/`TIMESTAMP '...'`.
    fn literal(&mut self) -> Result<String> {
        let token = self.peek();
        let text = match token {
            Some(Token::Minus) => {
                self.at += 1;
                match self.peek() {
                    Some(Token::Number(n, _)) => format!("-{n}"),
                    _ => return Err(self.syntax()),
                }
            }
            Some(Token::Number(n, _)) => n.clone(),
            Some(Token::SingleQuotedString(s)) => s.clone(),
            Some(t)
                if ["TRUE", "FALSE"]
                    .iter()
                    .any(|w| crate::statement::is_word(t, w)) =>
            {
                t.to_string().to_ascii_lowercase()
            }
            Some(t)
                if ["DATE", "TIMESTAMP"]
                    .iter()
                    .any(|w| crate::statement::is_word(t, w)) =>
            {
                self.at += 1;
                match self.peek() {
                    Some(Token::SingleQuotedString(s)) => s.clone(),
                    _ => return Err(self.syntax()),
                }
            }
            Some(t) if crate::statement::is_word(t, "NULL") => {
                return Err(SqlError::Invalid("a range bound cannot be NULL".into()))
            }
            _ => return Err(self.syntax()),
        };
        self.at += 1;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(sql: &str) -> Result<PartitionSpec> {
        let tokens = datafusion::sql::sqlparser::tokenizer::Tokenizer::new(
            &datafusion::sql::sqlparser::dialect::GenericDialect {},
            sql,
        )
        .tokenize()
        .unwrap();
        PartitionSpec::parse(&tokens)
    }

    fn bound(v: &str, inclusive: bool) -> Option<BoundSpec> {
        Some(BoundSpec {
            values: vec![v.into()],
            inclusive,
        })
    }

    #[test]
    fn parses_hash_levels_and_range_partitions() {
        let spec = parse(
            "DISTRIBUTE BY HASH (a, b) INTO 16 BUCKETS, HASH INTO 4 BUCKETS, RANGE (ts) (\
             PARTITION VALUES < '2026-01-01', PARTITION '2026-01-01' <= VALUES < '2027-01-01', \
             PARTITION VALUE = (-5), PARTITION 7 < VALUES)",
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
                    lower: None,
                    upper: bound("2026-01-01", false)
                },
                RangeSpec {
                    lower: bound("2026-01-01", true),
                    upper: bound("2027-01-01", false)
                },
                RangeSpec {
                    lower: bound("-5", true),
                    upper: bound("-5", true)
                },
                RangeSpec {
                    lower: bound("7", false),
                    upper: None
                },
            ]
        );
    }

    #[test]
    fn split_rows_and_impala_synonyms() {
        let spec = parse("PARTITION BY HASH (a) PARTITIONS 3, RANGE (ts) SPLIT ROWS ((10), (20))")
            .unwrap();
        assert_eq!(spec.hash, vec![(vec!["a".to_string()], 3)]);
        let (_, ranges) = spec.range.unwrap();
        assert_eq!(
            ranges,
            vec![
                RangeSpec {
                    lower: None,
                    upper: bound("10", false)
                },
                RangeSpec {
                    lower: bound("10", true),
                    upper: bound("20", false)
                },
                RangeSpec {
                    lower: bound("20", true),
                    upper: None
                },
            ]
        );
        let bare = parse("DISTRIBUTE BY RANGE (ts)").unwrap();
        assert_eq!(
            bare.range.unwrap().1,
            vec![RangeSpec {
                lower: None,
                upper: None
            }]
        );
    }

    #[test]
    fn bad_clauses_get_clear_errors() {
        for (sql, needle) in [
            (
                "DISTRIBUTE BY HASH (a) INTO BUCKETS",
                "expected DISTRIBUTE BY",
            ),
            (
                "DISTRIBUTE BY RANGE (a), HASH (b) INTO 2 BUCKETS",
                "last level",
            ),
            ("DISTRIBUTE BY RANGE (a) (PARTITION VALUES > 3)", "found >"),
            ("DISTRIBUTE BY RANGE (a) (PARTITION NULL <= VALUES)", "NULL"),
            ("DISTRIBUTE BY HASH (a) INTO 2 BUCKETS extra", "unexpected"),
            ("DISTRIBUTE BY LIST (a)", "found LIST"),
        ] {
            let err = parse(sql).unwrap_err().to_string();
            assert!(err.contains(needle), "{sql}: {err}");
        }
    }
}
