//! The partitioning clause, Kudu's and Impala's (see [`crate::parse::partitioning`]): hash
//! levels then at most one range level, with its partitions or split rows; and `ALTER TABLE t
//! ADD|DROP RANGE PARTITION <range>`.

use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::IsOptional;
use datafusion::sql::sqlparser::tokenizer::Token;
use nyala_engine::{BoundSpec, HashSpec, RangeSpec};

use crate::parse::parser::classify::classify;
use crate::parse::parser::{expected, NyalaParser};
use crate::parse::partitioning::PartitionSpec;
use crate::parse::statement::{normalize_ident, object_name, Ddl, NyalaStatement};
use crate::{Result, SqlError};

impl NyalaParser<'_> {
    /// The levels after `DISTRIBUTE BY` / `PARTITION BY`: hash levels, then at most one range
    /// level, separated by commas.
    pub(super) fn parse_partitioning(&mut self) -> Result<PartitionSpec> {
        let mut spec = PartitionSpec::default();
        loop {
            if spec.range.is_some() {
                return Err(SqlError::Invalid(
                    "the range level must be the last level of the partitioning".into(),
                ));
            }
            if self.parser.parse_keyword(Keyword::HASH) {
                spec.hash.push(self.parse_hash_level()?);
            } else if self.parser.parse_keyword(Keyword::RANGE) {
                let columns = self.parse_column_names()?;
                spec.range = Some((columns, self.parse_range_partitions()?));
            } else {
                return Err(self.unexpected("HASH or RANGE"));
            }
            if !self.parser.consume_token(&Token::Comma) {
                return Ok(spec);
            }
        }
    }

    /// A hash level after `HASH`: `[(columns)] INTO n BUCKETS` or `[(columns)] PARTITIONS n`.
    fn parse_hash_level(&mut self) -> Result<(Vec<String>, u32)> {
        let columns = match self.parser.peek_token_ref().token {
            Token::LParen => self.parse_column_names()?,
            _ => vec![],
        };
        let buckets = if self.parser.parse_keyword(Keyword::PARTITIONS) {
            self.parse_bucket_count()?
        } else {
            self.parser.expect_keyword_is(Keyword::INTO)?;
            let buckets = self.parse_bucket_count()?;
            self.parser.expect_keyword_is(Keyword::BUCKETS)?;
            buckets
        };
        Ok((columns, buckets))
    }

    /// A hash level's bucket count: a whole number the engine then checks against its limits.
    fn parse_bucket_count(&mut self) -> Result<u32> {
        let n = self.parser.parse_literal_uint()?;
        u32::try_from(n)
            .map_err(|_| SqlError::Invalid(format!("{n} is not a valid number of hash buckets")))
    }

    /// `(a, b, ...)`: column names, normalised.
    fn parse_column_names(&mut self) -> Result<Vec<String>> {
        Ok(self
            .parser
            .parse_parenthesized_column_list(IsOptional::Mandatory, false)?
            .iter()
            .map(normalize_ident)
            .collect())
    }

    /// After `RANGE (columns)`: `(PARTITION ..., ...)`, `SPLIT ROWS (...)` or nothing (one
    /// unbounded range).
    fn parse_range_partitions(&mut self) -> Result<Vec<RangeSpec>> {
        if self.parse_word("SPLIT") {
            self.parser.expect_keyword_is(Keyword::ROWS)?;
            self.parser.expect_token(&Token::LParen)?;
            let mut splits = Vec::new();
            loop {
                splits.push(self.parse_bound()?);
                if !self.parser.consume_token(&Token::Comma) {
                    break;
                }
            }
            self.parser.expect_token(&Token::RParen)?;
            // Split points cut the key space into ranges: [s_i, s_i+1), unbounded at both ends.
            let mut ranges = Vec::with_capacity(splits.len() + 1);
            let mut lower = None;
            for values in splits {
                ranges.push(RangeSpec {
                    hash: vec![],
                    lower: lower.take(),
                    upper: Some(BoundSpec {
                        values: values.clone(),
                        inclusive: false,
                    }),
                });
                lower = Some(BoundSpec {
                    values,
                    inclusive: true,
                });
            }
            ranges.push(RangeSpec {
                lower,
                upper: None,
                hash: vec![],
            });
            return Ok(ranges);
        }
        if !self.parser.consume_token(&Token::LParen) {
            return Ok(vec![RangeSpec {
                hash: vec![],
                lower: None,
                upper: None,
            }]);
        }
        let mut ranges = Vec::new();
        if self.parser.consume_token(&Token::RParen) {
            return Ok(ranges);
        }
        loop {
            self.parser.expect_keyword_is(Keyword::PARTITION)?;
            ranges.push(self.parse_range_partition()?);
            if !self.parser.consume_token(&Token::Comma) {
                break;
            }
        }
        self.parser.expect_token(&Token::RParen)?;
        Ok(ranges)
    }

    /// One range partition, after `PARTITION`: its bounds, then the hash levels of its own,
    /// if any (`HASH (a) INTO 8 BUCKETS [, HASH ...]`, Kudu 1.17's range-specific hash schema).
    fn parse_range_partition(&mut self) -> Result<RangeSpec> {
        let mut range = self.parse_range_bounds()?;
        while self.parser.parse_keyword(Keyword::HASH) {
            let (columns, buckets) = self.parse_hash_level()?;
            range.hash.push(HashSpec { columns, buckets });
            let next_is_hash = matches!(
                self.parser.peek_nth_token_ref(1).token,
                Token::Word(ref w) if w.keyword == Keyword::HASH
            );
            if !(next_is_hash && self.parser.consume_token(&Token::Comma)) {
                break;
            }
        }
        Ok(range)
    }

    /// A range partition's bounds: `VALUE = v`, `VALUES < v`, `v <= VALUES`, `v <= VALUES < w`
    /// (`<` or `<=` on either side).
    fn parse_range_bounds(&mut self) -> Result<RangeSpec> {
        if self.parser.parse_keyword(Keyword::VALUE) {
            self.parser.expect_token(&Token::Eq)?;
            let bound = BoundSpec {
                values: self.parse_bound()?,
                inclusive: true,
            };
            return Ok(RangeSpec {
                hash: vec![],
                lower: Some(bound.clone()),
                upper: Some(bound),
            });
        }
        if self.parser.parse_keyword(Keyword::VALUES) {
            let inclusive = self.parse_comparison()?;
            let values = self.parse_bound()?;
            return Ok(RangeSpec {
                hash: vec![],
                lower: None,
                upper: Some(BoundSpec { values, inclusive }),
            });
        }
        let values = self.parse_bound()?;
        let inclusive = self.parse_comparison()?;
        self.parser.expect_keyword_is(Keyword::VALUES)?;
        let lower = Some(BoundSpec { values, inclusive });
        let upper = match self.parser.peek_token_ref().token {
            Token::Lt | Token::LtEq => {
                let inclusive = self.parse_comparison()?;
                Some(BoundSpec {
                    values: self.parse_bound()?,
                    inclusive,
                })
            }
            _ => None,
        };
        Ok(RangeSpec {
            lower,
            upper,
            hash: vec![],
        })
    }

    /// `<` (false) or `<=` (true).
    fn parse_comparison(&mut self) -> Result<bool> {
        let token = self.parser.next_token();
        match token.token {
            Token::Lt => Ok(false),
            Token::LtEq => Ok(true),
            _ => Err(expected(&self.parser, "< or <=", token)),
        }
    }

    /// A range bound: a literal or a parenthesised tuple of literals, as text.
    fn parse_bound(&mut self) -> Result<Vec<String>> {
        if !self.parser.consume_token(&Token::LParen) {
            return Ok(vec![self.parse_bound_literal()?]);
        }
        let mut values = Vec::new();
        loop {
            values.push(self.parse_bound_literal()?);
            if !self.parser.consume_token(&Token::Comma) {
                break;
            }
        }
        self.parser.expect_token(&Token::RParen)?;
        Ok(values)
    }

    /// A number (possibly negative), a string, TRUE/FALSE, or `DATE '...'`/`TIMESTAMP '...'`;
    /// the column's type decides later what the text means.
    fn parse_bound_literal(&mut self) -> Result<String> {
        let token = self.parser.next_token();
        match &token.token {
            Token::Number(n, _) => Ok(n.clone()),
            Token::SingleQuotedString(s) => Ok(s.clone()),
            Token::Minus => {
                let number = self.parser.next_token();
                match number.token {
                    Token::Number(n, _) => Ok(format!("-{n}")),
                    _ => Err(expected(&self.parser, "a number after -", number)),
                }
            }
            Token::Word(w) if w.quote_style.is_none() => match w.keyword {
                Keyword::TRUE | Keyword::FALSE => Ok(w.value.to_ascii_lowercase()),
                Keyword::DATE | Keyword::TIMESTAMP => {
                    let text = self.parser.next_token();
                    match text.token {
                        Token::SingleQuotedString(s) => Ok(s),
                        _ => Err(expected(&self.parser, "a quoted date or time", text)),
                    }
                }
                Keyword::NULL => Err(SqlError::Invalid("a range bound cannot be NULL".into())),
                _ => Err(expected(&self.parser, "a literal range bound", token)),
            },
            _ => Err(expected(&self.parser, "a literal range bound", token)),
        }
    }

    /// `ALTER TABLE t ADD|DROP RANGE PARTITION <range>` is Nyala's; every other ALTER TABLE is
    /// sqlparser's (with the dialect's ENCODING and COMPRESSION in ADD COLUMN).
    pub(super) fn parse_alter_table(&mut self) -> Result<NyalaStatement> {
        let range = self.parser.maybe_parse(|p| {
            p.expect_keywords(&[Keyword::ALTER, Keyword::TABLE])?;
            let name = p.parse_object_name(false)?;
            let add = match p.parse_one_of_keywords(&[Keyword::ADD, Keyword::DROP]) {
                Some(keyword) => keyword == Keyword::ADD,
                None => return p.expected("ADD or DROP", p.peek_token()),
            };
            p.expect_keywords(&[Keyword::RANGE, Keyword::PARTITION])?;
            Ok((name, add))
        })?;
        match range {
            Some((name, add)) => Ok(NyalaStatement::Ddl(Ddl::AlterRangePartition {
                name: object_name(&name)?,
                add,
                range: self.parse_range_partition()?,
            })),
            None => classify(self.sql_statement()?),
        }
    }
}
