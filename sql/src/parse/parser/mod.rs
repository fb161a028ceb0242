//! Nyala's SQL parser: sqlparser's parser, with Nyala's own statements parsed in its grammar.
//!
//! Like DataFusion's `DFParser`, [`NyalaParser`] wraps a sqlparser [`Parser`] and looks at the
//! first words of a statement: the statements Nyala adds or shapes differently are parsed here
//! with the parser's own methods, everything else is sqlparser's. A statement is parsed once,
//! from its tokens in order, and no clause is cut out of the text to be parsed separately, so
//! errors are sqlparser's, with what was expected and where:
//! `Expected: literal int, found: BUCKETS at Line: 1, Column: 57`.
//!
//! Parsed here:
//! - `CREATE TABLE [IF NOT EXISTS] t (column TYPE [options], ..., [NON UNIQUE] PRIMARY KEY (a, ...))
//!   [DISTRIBUTE BY ...] [WITH (replicas = n)]` and `CREATE TABLE t {PRIMARY KEY (a, ...) |
//!   (PRIMARY KEY (a, ...))} [DISTRIBUTE BY ...] [WITH (...)] AS <query>`;
//! - the partitioning clause, Kudu's and Impala's (see [`crate::parse::partitioning`]):
//!   `DISTRIBUTE BY HASH (a) INTO n BUCKETS, ..., RANGE (b) (PARTITION lower <= VALUES < upper,
//!   ...)`, `PARTITION BY HASH (a) PARTITIONS n, RANGE (b) SPLIT ROWS ((v), ...)`;
//! - `ALTER TABLE t ADD|DROP RANGE PARTITION <range>`;
//! - `SHOW TABLES` and `SHOW PARTITIONS t`;
//! - `BACKUP DATABASE | TABLE a, ... TO 'dir' [INCREMENTAL FROM 'parent']`, `RESTORE DATABASE
//!   FROM 'dir'`, `RESTORE TABLE t FROM 'dir' [AS new]`.
//!
//! Syntax nested inside sqlparser's statements (UPSERT, column ENCODING/COMPRESSION, AS OF) is
//! parsed by the hooks of Nyala's dialect ([`crate::parse::dialect`]). Statements sqlparser parses are then
//! classified: the ones Nyala answers itself (DROP TABLE, DESCRIBE, ALTER TABLE, UPDATE ...
//! FROM, ...) become [`NyalaStatement`]s of their own, the rest go to DataFusion as they are,
//! with `?` placeholders numbered `$1, $2, ...` in the order they appear (JDBC and ADBC send
//! `?`, DataFusion binds `$n`).
//!
//! Expressions nest at most [`MAX_EXPRESSION_DEPTH`] levels, queries [`MAX_QUERY_DEPTH`]. sqlparser builds a chain of
//! binary operators (`a OR b OR ...`, `1 + 1 + ...`) without recursing, so a statement of
//! 10 000 terms parses into a tree 10 000 levels deep, which every recursive walk after it
//! (visitors, planning, dropping the tree) would follow into a stack overflow: such a
//! statement is refused right after sqlparser returns it, before anything walks it.
//!
//! The grammar is split by what it parses: `create_table.rs` (CREATE TABLE and its AS and
//! CLONE forms), `partitioning.rs` (DISTRIBUTE BY / PARTITION BY, ALTER TABLE's range
//! partitions), `users.rs` (users and privileges), `backup.rs` (BACKUP and RESTORE);
//! `classify.rs` sorts sqlparser's statements
//! into Nyala's, `depth.rs` refuses statements nested too deep and `placeholders.rs` numbers
//! `?` placeholders.

mod backup;
mod classify;
mod copy;
mod create_table;
mod depth;
mod partitioning;
mod placeholders;
#[cfg(test)]
mod tests;
mod users;

use datafusion::sql::sqlparser::ast::{Query, Statement, Visit, VisitMut};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

use crate::parse::dialect::NyalaDialect;
use crate::parse::parser::classify::classify;
use crate::parse::parser::depth::{too_deep, TooDeep};
use crate::parse::parser::placeholders::number_placeholders;

use crate::parse::statement::{object_name, NyalaStatement, Show};
use crate::{Result, SqlError};

pub use depth::{MAX_EXPRESSION_DEPTH, MAX_QUERY_DEPTH};

/// Stack for tearing down a statement refused for its depth: dropping a tree is recursive,
/// and a 1 MiB statement can nest a few hundred thousand levels.
const TEARDOWN_STACK: usize = 256 << 20;

/// Parses Nyala's SQL; see the module documentation.
pub struct NyalaParser<'a> {
    parser: Parser<'a>,
    dialect: &'a NyalaDialect,
}

impl<'a> NyalaParser<'a> {
    /// Parses exactly one statement (trailing semicolons are allowed).
    pub fn parse_sql(sql: &str) -> Result<NyalaStatement> {
        let dialect = NyalaDialect::for_statement(sql);
        let mut parser = NyalaParser::new(&dialect, sql)?;
        let statement = parser.parse_single()?;
        dialect.check_time_travel_attached()?;
        Ok(statement)
    }

    /// Splits a script at top-level `;` into non-empty statements (quotes and comments are
    /// respected; the statements need not parse).
    pub fn split_statements(sql: &str) -> Result<Vec<String>> {
        let tokens = Tokenizer::new(&NyalaDialect::default(), sql)
            .tokenize()
            .map_err(|e| SqlError::Parse(e.to_string()))?;
        Ok(tokens
            .split(|t| *t == Token::SemiColon)
            .filter(|part| part.iter().any(|t| !matches!(t, Token::Whitespace(_))))
            .map(|part| {
                part.iter()
                    .map(Token::to_string)
                    .collect::<String>()
                    .trim()
                    .to_string()
            })
            .collect())
    }

    fn new(dialect: &'a NyalaDialect, sql: &str) -> Result<Self> {
        Ok(Self {
            parser: Parser::new(dialect).try_with_sql(sql)?,
            dialect,
        })
    }

    /// One statement and the end of the text.
    fn parse_single(&mut self) -> Result<NyalaStatement> {
        let mut separated = false;
        while self.parser.consume_token(&Token::SemiColon) {
            separated = true;
        }
        match self.parser.peek_token_ref().token {
            Token::EOF => return Err(SqlError::Parse("empty statement".into())),
            _ if separated => {
                return Err(SqlError::Parse(
                    "expected one statement, found several".into(),
                ))
            }
            _ => {}
        }
        let statement = self.parse_statement()?;
        while self.parser.consume_token(&Token::SemiColon) {
            separated = true;
        }
        match self.parser.peek_token_ref().token {
            Token::EOF => Ok(statement),
            _ if separated => Err(SqlError::Parse(
                "expected one statement, found several".into(),
            )),
            _ => Err(self.unexpected("end of statement")),
        }
    }

    /// One statement: Nyala's by its first words, else sqlparser's.
    fn parse_statement(&mut self) -> Result<NyalaStatement> {
        if self.peek_keywords(&[Keyword::CREATE, Keyword::TABLE]) {
            return self.parse_create_table();
        }
        if self.peek_keywords(&[Keyword::ALTER, Keyword::TABLE]) {
            return self.parse_alter_table();
        }
        if self.peek_keywords(&[Keyword::SHOW, Keyword::TABLES])
            && matches!(
                self.parser.peek_nth_token_ref(2).token,
                Token::EOF | Token::SemiColon
            )
        {
            self.parser
                .expect_keywords(&[Keyword::SHOW, Keyword::TABLES])?;
            return Ok(NyalaStatement::Show(Show::Tables));
        }
        if self.peek_words(&["CREATE", "USER"])
            || self.peek_words(&["ALTER", "USER"])
            || self.peek_words(&["DROP", "USER"])
        {
            return self.parse_user_statement().map(NyalaStatement::Ddl);
        }
        if self.peek_words(&["BACKUP"]) {
            return self.parse_backup();
        }
        if self.peek_words(&["RESTORE"]) {
            return self.parse_restore();
        }
        if self.peek_words(&["GRANT"]) || self.peek_words(&["REVOKE"]) {
            return self.parse_privileges().map(NyalaStatement::Ddl);
        }
        if self.peek_words(&["SHOW", "GRANTS"]) {
            self.parser.next_token();
            self.parser.next_token();
            return Ok(NyalaStatement::Show(Show::Grants));
        }
        if self.peek_keywords(&[Keyword::SHOW, Keyword::PARTITIONS]) {
            self.parser
                .expect_keywords(&[Keyword::SHOW, Keyword::PARTITIONS])?;
            let name = object_name(&self.parser.parse_object_name(false)?)?;
            return Ok(NyalaStatement::Show(Show::Partitions(name)));
        }
        classify(self.sql_statement()?)
    }

    /// A statement of sqlparser's grammar (with the dialect's extensions).
    fn sql_statement(&mut self) -> Result<Statement> {
        let parsed = self.parser.parse_statement();
        self.finish_sql(parsed)
    }

    /// A query of sqlparser's grammar (with the dialect's extensions).
    fn sql_query(&mut self) -> Result<Box<Query>> {
        let parsed = self.parser.parse_query();
        self.finish_sql(parsed)
    }

    /// What sqlparser parsed, with its AS OF clauses in place and its placeholders numbered.
    fn finish_sql<V: Visit + VisitMut + Send + 'static>(
        &self,
        parsed: std::result::Result<V, ParserError>,
    ) -> Result<V> {
        // An AS OF clause that did not parse is the error, whatever became of the rest.
        if let Some(e) = self.dialect.time_travel_error() {
            return Err(e);
        }
        let mut node = parsed?;
        if let Some(too_deep) = too_deep(&node) {
            // Dropped on a stack of its own: the drop recurses as deep as the tree.
            stacker::grow(TEARDOWN_STACK, move || drop(node));
            return Err(SqlError::Invalid(match too_deep {
                TooDeep::Expressions => format!(
                    "the statement nests expressions deeper than the {MAX_EXPRESSION_DEPTH} \
                     levels allowed; write long lists of alternatives as `x IN (...)`"
                ),
                TooDeep::Queries => format!(
                    "the statement nests queries (subqueries, derived tables) deeper than the \
                     {MAX_QUERY_DEPTH} levels allowed"
                ),
            }));
        }
        self.dialect.attach_time_travel(&mut node)?;
        number_placeholders(&mut node);
        Ok(node)
    }

    /// An error for the next token, which is not `expected`.
    fn unexpected(&self, expected: &str) -> SqlError {
        let found = self.parser.peek_token();
        if let Token::Word(w) = &found.token {
            if matches!(w.keyword, Keyword::ENCODING | Keyword::COMPRESSION) {
                return SqlError::Parse(format!(
                    "ENCODING and COMPRESSION go after the type of a column being defined, \
                     found {found}{}",
                    found.span.start
                ));
            }
        }
        self::expected(&self.parser, expected, found)
    }

    /// Whether the next tokens are the keywords `keywords`.
    fn peek_keywords(&self, keywords: &[Keyword]) -> bool {
        keywords.iter().enumerate().all(|(i, keyword)| {
            matches!(&self.parser.peek_nth_token_ref(i).token, Token::Word(w) if w.keyword == *keyword)
        })
    }

    /// Whether the next tokens are the keyword `keyword` and then `token`.
    fn peek_keyword_and(&self, keyword: Keyword, token: &Token) -> bool {
        self.peek_keywords(&[keyword]) && self.parser.peek_nth_token_ref(1).token == *token
    }

    /// Whether the next tokens are the unquoted words `words` (keywords or not).
    fn peek_words(&self, words: &[&str]) -> bool {
        words.iter().enumerate().all(|(i, word)| {
            matches!(&self.parser.peek_nth_token_ref(i).token,
                Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
        })
    }

    /// Consumes the unquoted word `word` if it comes next.
    fn parse_word(&mut self, word: &str) -> bool {
        let found = self.peek_words(&[word]);
        if found {
            self.parser.next_token();
        }
        found
    }
}

/// sqlparser's error for `found` where `what` was expected.
pub(crate) fn expected(parser: &Parser, what: &str, found: TokenWithSpan) -> SqlError {
    match parser.expected::<()>(what, found) {
        Err(e) => e.into(),
        Ok(()) => SqlError::Parse(format!("expected {what}")),
    }
}
