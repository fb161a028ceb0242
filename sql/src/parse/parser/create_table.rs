//! `CREATE TABLE`: columns with Nyala's and Kudu's options, the key, the partitioning and the
//! table options, and its `AS <query>` and `CLONE source [AS OF <time>]` forms.

use datafusion::sql::sqlparser::ast::{ColumnDef, Query, SetExpr, TableConstraint};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::parse::columns;
use crate::parse::table_options;

use crate::parse::parser::NyalaParser;
use crate::parse::partitioning::PartitionSpec;
use crate::parse::statement::{
    object_name, CreateTableAsSpec, CreateTableSpec, Ddl, NyalaStatement, TableOptions,
};
use crate::{Result, SqlError};

/// The table elements of a CREATE TABLE: columns and constraints, in any order.
#[derive(Default)]
struct TableElements {
    columns: Vec<ColumnDef>,
    constraints: Vec<TableConstraint>,
    /// `NON UNIQUE PRIMARY KEY` (Kudu 1.17).
    non_unique: bool,
}

impl NyalaParser<'_> {
    /// `CREATE TABLE ...`, plain, `AS <query>` or `CLONE source [AS OF <time>]`.
    pub(super) fn parse_create_table(&mut self) -> Result<NyalaStatement> {
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
        let mut options = None;
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
                if options.is_some() {
                    return Err(SqlError::Parse("WITH (...) is given twice".into()));
                }
                options = Some(self.parse_table_options()?);
            } else {
                break;
            }
        }
        let TableOptions {
            replicas,
            history_max_age_secs,
        } = options.unwrap_or_default();
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
                history_max_age_secs,
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
        let partition = partition.unwrap_or_default().resolve(&schema)?;
        Ok(NyalaStatement::Ddl(Ddl::CreateTable(CreateTableSpec {
            name,
            if_not_exists,
            replicas,
            schema: schema.with_history_max_age_secs(history_max_age_secs),
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

    /// `WITH (option = value, ...)`: see [`table_options`].
    fn parse_table_options(&mut self) -> Result<TableOptions> {
        self.parser.expect_keyword_is(Keyword::WITH)?;
        self.parser.expect_token(&Token::LParen)?;
        let options = self
            .parser
            .parse_comma_separated(Parser::parse_sql_option)?;
        self.parser.expect_token(&Token::RParen)?;
        table_options::table_options(&options, false)
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
        0 => vec![], // keyed by the hidden auto_incrementing_id alone
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
        history_max_age_secs: None,
        key,
        partition,
        query,
    })
}
