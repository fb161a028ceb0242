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
//! - `SHOW TABLES` and `SHOW PARTITIONS t`.
//!
//! Syntax nested inside sqlparser's statements (UPSERT, column ENCODING/COMPRESSION, AS OF) is
//! parsed by the hooks of Nyala's dialect (`dialect.rs`). Statements sqlparser parses are then
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

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, AlterTableOperation, ColumnDef, Expr, ObjectType, Query,
    RenameTableNameKind, SetExpr, ShowCreateObject, SqlOption, Statement, TableConstraint, Value,
    ValueWithSpan, Visit, VisitMut, Visitor,
};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{IsOptional, Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Location, Token, TokenWithSpan, Tokenizer};
use nyala_engine::{BoundSpec, PartitionSchema, Privilege, RangeSpec};

use crate::parse::columns;
use crate::parse::dialect::NyalaDialect;
use crate::parse::partitioning::PartitionSpec;
use crate::parse::statement::{
    normalize_ident, object_name, CreateTableAsSpec, CreateTableSpec, Ddl, NyalaStatement, Secret,
    Show,
};
use crate::{Result, SqlError};

/// Most levels of expressions and queries nested in one another in a statement.
pub const MAX_EXPRESSION_DEPTH: usize = 512;

/// Most queries nested in one another in a statement (the statement's own query, subqueries,
/// derived tables): DataFusion's checks of a plan take time exponential in it (23 levels of
/// scalar subqueries took 11 s to plan, each level more doubles that).
pub const MAX_QUERY_DEPTH: usize = 16;

/// Stack for tearing down a statement refused for its depth: dropping a tree is recursive,
/// and a 1 MiB statement can nest a few hundred thousand levels.
const TEARDOWN_STACK: usize = 256 << 20;

/// Parses Nyala's SQL; see the module documentation.
pub struct NyalaParser<'a> {
    parser: Parser<'a>,
    dialect: &'a NyalaDialect,
}

/// The table elements of a CREATE TABLE: columns and constraints, in any order.
#[derive(Default)]
struct TableElements {
    columns: Vec<ColumnDef>,
    constraints: Vec<TableConstraint>,
    /// `NON UNIQUE PRIMARY KEY` (Kudu 1.17).
    non_unique: bool,
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

    /// `CREATE USER [IF NOT EXISTS] name [WITH] PASSWORD 'p'`, `ALTER USER name [WITH] PASSWORD
    /// 'p'`, `DROP USER [IF EXISTS] name`.
    fn parse_user_statement(&mut self) -> Result<Ddl> {
        let verb = self
            .parser
            .next_token()
            .token
            .to_string()
            .to_ascii_uppercase();
        self.parser.next_token(); // USER
        let if_exists = match verb.as_str() {
            "CREATE" => self
                .parser
                .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]),
            "DROP" => self.parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]),
            _ => false,
        };
        let name = normalize_ident(&self.parser.parse_identifier()?);
        if verb == "DROP" {
            return Ok(Ddl::DropUser { name, if_exists });
        }
        let _ = self.parser.parse_keyword(Keyword::WITH);
        if !self.parse_word("PASSWORD") {
            return Err(self.unexpected("PASSWORD 'password'"));
        }
        let password = Secret(self.parser.parse_literal_string()?);
        Ok(match verb.as_str() {
            "CREATE" => Ddl::CreateUser {
                name,
                password,
                if_not_exists: if_exists,
            },
            _ => Ddl::AlterUser { name, password },
        })
    }

    /// `GRANT privileges ON [TABLE] object TO user` or `REVOKE privileges ON [TABLE] object
    /// FROM user`; privileges: `ALL [PRIVILEGES]` or a list of SELECT, INSERT, UPDATE, DELETE.
    fn parse_privileges(&mut self) -> Result<Ddl> {
        let grant = self.parse_word("GRANT");
        if !grant {
            self.parser.next_token(); // REVOKE
        }
        let privileges = if self.parse_word("ALL") {
            self.parse_word("PRIVILEGES");
            Privilege::ALL.to_vec()
        } else {
            let mut privileges = Vec::new();
            loop {
                let privilege = match self.parser.parse_one_of_keywords(&[
                    Keyword::SELECT,
                    Keyword::INSERT,
                    Keyword::UPDATE,
                    Keyword::DELETE,
                ]) {
                    Some(Keyword::SELECT) => Privilege::Select,
                    Some(Keyword::INSERT) => Privilege::Insert,
                    Some(Keyword::UPDATE) => Privilege::Update,
                    Some(Keyword::DELETE) => Privilege::Delete,
                    _ => {
                        return Err(self.unexpected("ALL, SELECT, INSERT, UPDATE or DELETE"));
                    }
                };
                privileges.push(privilege);
                if !self.parser.consume_token(&Token::Comma) {
                    break;
                }
            }
            privileges
        };
        self.parser.expect_keyword_is(Keyword::ON)?;
        let _ = self.parser.parse_keyword(Keyword::TABLE);
        let object = object_name(&self.parser.parse_object_name(false)?)?;
        match grant {
            true => self.parser.expect_keyword_is(Keyword::TO)?,
            false => self.parser.expect_keyword_is(Keyword::FROM)?,
        }
        let user = normalize_ident(&self.parser.parse_identifier()?);
        Ok(Ddl::Privileges {
            object,
            user,
            privileges,
            grant,
        })
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

    /// `CREATE TABLE ...`, plain, `AS <query>` or `CLONE source [AS OF <time>]`.
    fn parse_create_table(&mut self) -> Result<NyalaStatement> {
        self.parser
            .expect_keywords(&[Keyword::CREATE, Keyword::TABLE])?;
        let if_not_exists =
            self.parser
                .parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name = object_name(&self.parser.parse_object_name(false)?)?;
        if self.parser.parse_keyword(Keyword::CLONE) {
            let source = object_name(&self.parser.parse_object_name(false)?)?;
            let as_of = match self.parser.parse_keywords(&[Keyword::AS, Keyword::OF]) {
                true => Some(Box::new(self.parser.parse_expr()?)),
                false => None,
            };
            return Ok(NyalaStatement::CloneTable {
                name,
                source,
                if_not_exists,
                as_of,
            });
        }
        let mut elements = TableElements::default();
        // CREATE TABLE t PRIMARY KEY (...) AS SELECT: the key without a column list.
        let bare_key = match self.parser.peek_token_ref().token {
            Token::LParen => {
                self.parse_table_elements(&mut elements)?;
                false
            }
            _ => self.parse_table_constraint(&mut elements)?,
        };
        let mut partition = None;
        let mut replicas = None;
        loop {
            if self
                .parser
                .parse_keywords(&[Keyword::DISTRIBUTE, Keyword::BY])
                || self
                    .parser
                    .parse_keywords(&[Keyword::PARTITION, Keyword::BY])
            {
                if partition.is_some() {
                    return Err(SqlError::Parse("the partitioning is given twice".into()));
                }
                partition = Some(self.parse_partitioning()?);
            } else if self.peek_keyword_and(Keyword::WITH, &Token::LParen) {
                if replicas.is_some() {
                    return Err(SqlError::Parse("WITH (...) is given twice".into()));
                }
                replicas = Some(self.parse_table_options()?);
            } else {
                break;
            }
        }
        let replicas = replicas.unwrap_or(0);
        if self.parser.parse_keyword(Keyword::AS) {
            let query = self.sql_query()?;
            // sqlparser reads a DML statement as a query body too.
            if let SetExpr::Insert(dml)
            | SetExpr::Update(dml)
            | SetExpr::Delete(dml)
            | SetExpr::Merge(dml) = query.body.as_ref()
            {
                return Err(SqlError::Parse(format!(
                    "expected a query after AS, found {dml}"
                )));
            }
            let spec = create_table_as(name, elements, partition.unwrap_or_default(), query)?;
            return Ok(NyalaStatement::CreateTableAs(CreateTableAsSpec {
                if_not_exists,
                replicas,
                ..spec
            }));
        }
        if bare_key {
            return Err(self.unexpected(
                "AS followed by a query (CREATE TABLE t PRIMARY KEY (...) AS SELECT ...)",
            ));
        }
        let schema = columns::table_schema(
            &name,
            &elements.columns,
            &elements.constraints,
            elements.non_unique,
        )?;
        let partition = match partition {
            Some(spec) => spec.resolve(&schema)?,
            None => PartitionSchema::single(),
        };
        Ok(NyalaStatement::Ddl(Ddl::CreateTable(CreateTableSpec {
            name,
            if_not_exists,
            replicas,
            schema,
            partition,
        })))
    }

    /// `(element, ...)`: column definitions (sqlparser's, with the dialect's ENCODING and
    /// COMPRESSION) and table constraints, as sqlparser reads a CREATE TABLE's, plus Kudu's
    /// `NON UNIQUE PRIMARY KEY (...)`.
    fn parse_table_elements(&mut self, elements: &mut TableElements) -> Result<()> {
        self.parser.expect_token(&Token::LParen)?;
        if self.parser.consume_token(&Token::RParen) {
            return Ok(());
        }
        loop {
            if !self.parse_table_constraint(elements)? {
                match self.parser.peek_token_ref().token {
                    Token::Word(_) => elements.columns.push(self.parser.parse_column_def()?),
                    _ => return Err(self.unexpected("column name or constraint definition")),
                }
            }
            if self.parser.consume_token(&Token::Comma) {
                continue;
            }
            if self.parser.consume_token(&Token::RParen) {
                return Ok(());
            }
            return Err(self.unexpected("',' or ')' after column definition"));
        }
    }

    /// A table constraint (`[NON UNIQUE] PRIMARY KEY (a, ...)`, or another for the schema to
    /// refuse), if one starts here.
    fn parse_table_constraint(&mut self, elements: &mut TableElements) -> Result<bool> {
        if self.peek_words(&["NON", "UNIQUE", "PRIMARY", "KEY"]) {
            self.parser.next_token();
            self.parser.next_token();
            elements.non_unique = true;
        }
        match self.parser.parse_optional_table_constraint()? {
            Some(constraint) => {
                elements.constraints.push(constraint);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// `WITH (replicas = n)`: n (Whether the deployment can place n replicas is the engine's
    /// to say.)
    fn parse_table_options(&mut self) -> Result<usize> {
        self.parser.expect_keyword_is(Keyword::WITH)?;
        self.parser.expect_token(&Token::LParen)?;
        let options = self
            .parser
            .parse_comma_separated(Parser::parse_sql_option)?;
        self.parser.expect_token(&Token::RParen)?;
        let mut replicas = 0;
        for option in options {
            match &option {
                SqlOption::KeyValue { key, value }
                    if key.quote_style.is_none() && key.value.eq_ignore_ascii_case("replicas") =>
                {
                    replicas = match value {
                        Expr::Value(ValueWithSpan {
                            value: Value::Number(n, _),
                            ..
                        }) => n.parse::<usize>().ok().filter(|&n| n >= 1),
                        _ => None,
                    }
                    .ok_or_else(|| {
                        SqlError::Invalid(format!(
                            "replicas must be a whole number from 1, got {value}"
                        ))
                    })?;
                }
                other => {
                    return Err(SqlError::NotSupported(format!(
                        "table option '{other}' (supported: replicas = n)"
                    )))
                }
            }
        }
        Ok(replicas)
    }

    /// The levels after `DISTRIBUTE BY` / `PARTITION BY`: hash levels, then at most one range
    /// level, separated by commas.
    fn parse_partitioning(&mut self) -> Result<PartitionSpec> {
        let mut spec = PartitionSpec::default();
        loop {
            if spec.range.is_some() {
                return Err(SqlError::Invalid(
                    "the range level must be the last level of the partitioning".into(),
                ));
            }
            if self.parser.parse_keyword(Keyword::HASH) {
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
                spec.hash.push((columns, buckets));
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
            ranges.push(RangeSpec { lower, upper: None });
            return Ok(ranges);
        }
        if !self.parser.consume_token(&Token::LParen) {
            return Ok(vec![RangeSpec {
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

    /// One range partition, after `PARTITION`: `VALUE = v`, `VALUES < v`, `v <= VALUES`,
    /// `v <= VALUES < w` (`<` or `<=` on either side).
    fn parse_range_partition(&mut self) -> Result<RangeSpec> {
        if self.parser.parse_keyword(Keyword::VALUE) {
            self.parser.expect_token(&Token::Eq)?;
            let bound = BoundSpec {
                values: self.parse_bound()?,
                inclusive: true,
            };
            return Ok(RangeSpec {
                lower: Some(bound.clone()),
                upper: Some(bound),
            });
        }
        if self.parser.parse_keyword(Keyword::VALUES) {
            let inclusive = self.parse_comparison()?;
            let values = self.parse_bound()?;
            return Ok(RangeSpec {
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
        Ok(RangeSpec { lower, upper })
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
    fn parse_alter_table(&mut self) -> Result<NyalaStatement> {
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
fn expected(parser: &Parser, what: &str, found: TokenWithSpan) -> SqlError {
    match parser.expected::<()>(what, found) {
        Err(e) => e.into(),
        Ok(()) => SqlError::Parse(format!("expected {what}")),
    }
}

/// `CREATE TABLE t {PRIMARY KEY (...) | (PRIMARY KEY (...))} [DISTRIBUTE BY ...] AS <query>`
/// (Impala's form for Kudu tables): the key, the partitioning and the query; the columns come
/// from the query when it is planned.
fn create_table_as(
    name: String,
    elements: TableElements,
    partition: PartitionSpec,
    query: Box<Query>,
) -> Result<CreateTableAsSpec> {
    if !elements.columns.is_empty() {
        return Err(SqlError::Invalid(format!(
            "CREATE TABLE ... AS SELECT takes its columns from the query; declare only the key: \
             CREATE TABLE {name} PRIMARY KEY (column, ...) AS SELECT ..."
        )));
    }
    if elements.non_unique {
        return Err(SqlError::NotSupported(
            "NON UNIQUE PRIMARY KEY in CREATE TABLE ... AS SELECT".into(),
        ));
    }
    let mut keys = elements
        .constraints
        .iter()
        .map(columns::primary_key_names)
        .collect::<Result<Vec<_>>>()?;
    let key = match keys.len() {
        0 => {
            return Err(SqlError::Invalid(format!(
                "table '{name}' needs a primary key: CREATE TABLE {name} PRIMARY KEY (column, ...) AS SELECT ..."
            )))
        }
        1 => keys.remove(0),
        _ => {
            return Err(SqlError::Invalid(
                "the primary key is declared twice".into(),
            ))
        }
    };
    Ok(CreateTableAsSpec {
        name,
        if_not_exists: false,
        replicas: 0,
        key,
        partition,
        query,
    })
}

/// The statements sqlparser parsed that Nyala answers itself, classified; the others are
/// DataFusion's.
fn classify(statement: Statement) -> Result<NyalaStatement> {
    Ok(match statement {
        Statement::Drop {
            object_type: ObjectType::Table,
            if_exists,
            names,
            ..
        } => {
            let [name] = names.as_slice() else {
                return Err(SqlError::NotSupported(
                    "DROP TABLE of several tables".into(),
                ));
            };
            NyalaStatement::Ddl(Ddl::DropTable {
                name: object_name(name)?,
                if_exists,
            })
        }
        Statement::Drop {
            object_type: ObjectType::View,
            if_exists,
            names,
            ..
        } => {
            let [name] = names.as_slice() else {
                return Err(SqlError::NotSupported("DROP VIEW of several views".into()));
            };
            NyalaStatement::Ddl(Ddl::DropView {
                name: object_name(name)?,
                if_exists,
            })
        }
        Statement::Drop { object_type, .. } => {
            return Err(SqlError::NotSupported(format!("DROP {object_type}")))
        }
        Statement::CreateView(view) => {
            if view.materialized || !view.columns.is_empty() || view.if_not_exists {
                return Err(SqlError::NotSupported(
                    "materialized views, column lists and IF NOT EXISTS in CREATE VIEW".into(),
                ));
            }
            NyalaStatement::Ddl(Ddl::CreateView {
                name: object_name(&view.name)?,
                sql: view.query.to_string(),
                or_replace: view.or_replace,
            })
        }
        Statement::CreateTable(_) => {
            return Err(SqlError::NotSupported(
                "CREATE OR REPLACE / TEMPORARY / EXTERNAL TABLE".into(),
            ))
        }
        Statement::AlterTable(alter) => match alter.operations.as_slice() {
            [AlterTableOperation::RenameTable {
                table_name: RenameTableNameKind::To(new) | RenameTableNameKind::As(new),
            }] => NyalaStatement::Ddl(Ddl::RenameTable {
                name: object_name(&alter.name)?,
                new_name: object_name(new)?,
            }),
            operations => NyalaStatement::Ddl(Ddl::AlterColumns {
                name: object_name(&alter.name)?,
                changes: columns::alter_columns(operations)?,
            }),
        },
        Statement::ExplainTable { table_name, .. } => {
            NyalaStatement::Show(Show::Describe(object_name(&table_name)?))
        }
        Statement::ShowCreate {
            obj_type: ShowCreateObject::Table,
            obj_name,
        } => NyalaStatement::Show(Show::CreateTable(object_name(&obj_name)?)),
        Statement::ShowVariable { variable } => {
            let name = variable
                .iter()
                .map(normalize_ident)
                .collect::<Vec<_>>()
                .join(".");
            match name.starts_with("nyala.") {
                true => NyalaStatement::Show(Show::Setting(name)),
                false => NyalaStatement::DataFusion(Box::new(Statement::ShowVariable { variable })),
            }
        }
        Statement::Update(update) if update.from.is_some() => NyalaStatement::UpdateFrom {
            update: Box::new(update),
            explain: None,
        },
        Statement::Explain {
            statement,
            analyze,
            verbose,
            ..
        } if matches!(statement.as_ref(), Statement::Update(u) if u.from.is_some()) => {
            let Statement::Update(update) = *statement else {
                return Err(SqlError::Parse("expected EXPLAIN UPDATE".into()));
            };
            NyalaStatement::UpdateFrom {
                update: Box::new(update),
                explain: Some((verbose, analyze)),
            }
        }
        // INSERT IGNORE, possibly under EXPLAIN: planned as the INSERT, skipping duplicates.
        mut statement => {
            let insert = match &mut statement {
                Statement::Explain { statement, .. } => statement.as_mut(),
                other => other,
            };
            match insert {
                Statement::Insert(insert) if insert.ignore => {
                    insert.ignore = false;
                    NyalaStatement::InsertIgnore(Box::new(statement))
                }
                _ => NyalaStatement::DataFusion(Box::new(statement)),
            }
        }
    })
}

/// What a statement nests too deeply.
enum TooDeep {
    /// Expressions and queries together, beyond [`MAX_EXPRESSION_DEPTH`].
    Expressions,
    /// Queries, beyond [`MAX_QUERY_DEPTH`].
    Queries,
}

/// What `node` nests too deeply, if anything. The walk stops at the first excess, so its own
/// recursion is bounded.
fn too_deep<V: Visit>(node: &V) -> Option<TooDeep> {
    #[derive(Default)]
    struct Depth {
        all: usize,
        queries: usize,
    }
    impl Depth {
        fn enter(&mut self) -> ControlFlow<TooDeep> {
            self.all += 1;
            match self.all > MAX_EXPRESSION_DEPTH {
                true => ControlFlow::Break(TooDeep::Expressions),
                false => ControlFlow::Continue(()),
            }
        }
        fn leave(&mut self) -> ControlFlow<TooDeep> {
            self.all -= 1;
            ControlFlow::Continue(())
        }
    }
    impl Visitor for Depth {
        type Break = TooDeep;
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<TooDeep> {
            self.enter()
        }
        fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<TooDeep> {
            self.leave()
        }
        fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<TooDeep> {
            // UNION / INTERSECT / EXCEPT chains nest too, in the query's body, which the
            // visitor would follow recursively before reaching an expression.
            if set_operation_depth(&query.body) > MAX_EXPRESSION_DEPTH {
                return ControlFlow::Break(TooDeep::Expressions);
            }
            self.queries += 1;
            if self.queries > MAX_QUERY_DEPTH {
                return ControlFlow::Break(TooDeep::Queries);
            }
            self.enter()
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<TooDeep> {
            self.queries -= 1;
            self.leave()
        }
    }
    // The walk recurses a few frames per level: room for MAX_EXPRESSION_DEPTH levels.
    let walk = || node.visit(&mut Depth::default()).break_value();
    stacker::maybe_grow(64 << 10, 16 << 20, walk)
}

/// How deep set operations nest in a query body (1: none), walked without recursion.
fn set_operation_depth(body: &SetExpr) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(body, 1)];
    while let Some((expr, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        if let SetExpr::SetOperation { left, right, .. } = expr {
            pending.push((left, depth + 1));
            pending.push((right, depth + 1));
        }
    }
    deepest
}

/// JDBC and ADBC send `?` placeholders; DataFusion binds `$1`, `$2`, ...: each `?` is numbered
/// by its place in the text, and `?n` is `$n`.
fn number_placeholders<V: VisitMut>(node: &mut V) {
    fn placeholder(expr: &mut Expr) -> Option<(&mut String, Location)> {
        match expr {
            Expr::Value(ValueWithSpan {
                value: Value::Placeholder(p),
                span,
            }) => Some((p, span.start)),
            _ => None,
        }
    }
    let mut positions = Vec::new();
    let _ = visit_expressions_mut(node, |expr| {
        if let Some((p, at)) = placeholder(expr) {
            if p == "?" {
                positions.push(at);
            }
        }
        ControlFlow::<()>::Continue(())
    });
    positions.sort();
    let _ = visit_expressions_mut(node, |expr| {
        if let Some((p, at)) = placeholder(expr) {
            if p == "?" {
                let n = positions.partition_point(|&other| other < at) + 1;
                *p = format!("${n}");
            } else if let Some(n) = p.strip_prefix('?') {
                *p = format!("${n}");
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

#[cfg(test)]
mod tests {
    use datafusion::sql::sqlparser::ast::{Visit, Visitor};
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use nyala_engine::ColumnChange;
    use nyala_storage::{ColumnCompression, ColumnEncoding, ColumnType};

    use super::*;
    use crate::parse::statement::ColumnAlteration;

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
        let parts = NyalaParser::split_statements(
            "SELECT ';' ; -- a ; comment\n INSERT INTO t VALUES (1);;",
        )
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

        for (sql, needle) in [
            (
                "CREATE TABLE nokey AS SELECT id FROM facts",
                "table 'nokey' needs a primary key: CREATE TABLE nokey PRIMARY KEY",
            ),
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
            ("CREATE TABLE t (a INT)", "table 't' needs a primary key"),
            ("CREATE TABLE t", "table 't' needs a primary key"),
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
                RangeSpec {
                    lower: None,
                    upper: bound("2020-01-01", true)
                },
                RangeSpec {
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
        let bare = partitioning("DISTRIBUTE BY RANGE (ts)").unwrap();
        assert_eq!(
            bare.range.unwrap().1,
            vec![RangeSpec {
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
        let NyalaStatement::Ddl(Ddl::AlterRangePartition { name, add, range }) =
            parse("ALTER TABLE nyala.public.Events ADD RANGE PARTITION '2026-03-01' <= VALUES < '2026-04-01'").unwrap()
        else {
            panic!("not a range partition")
        };
        assert_eq!((name.as_str(), add), ("events", true));
        assert_eq!(
            range,
            RangeSpec {
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
}
