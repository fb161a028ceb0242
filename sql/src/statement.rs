//! Parsing: which statements Nyala handles itself and which go to DataFusion.
//!
//! Everything is tokenized and parsed with sqlparser (GenericDialect). Nyala's own syntax is
//! handled on top of it: `CREATE TABLE ... DISTRIBUTE BY HASH ... , RANGE ...` (Kudu/Impala;
//! Impala's `PARTITION BY HASH (...) PARTITIONS n` too) is split at the partitioning clause, the
//! table part parsed by sqlparser and the clause by [`crate::partitioning`]; `ALTER TABLE ...
//! ADD|DROP RANGE PARTITION` is ours too; `UPSERT INTO` is parsed as an INSERT and
//! marked as a replace, which DataFusion plans as `InsertOp::Replace`. Catalog statements
//! (`SHOW TABLES`, `DESCRIBE`, `DROP TABLE`) are answered from Nyala's catalog.

use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, CharacterLength, ColumnDef, ColumnOption, CreateTable, DataType,
    ExactNumberInfo, Expr, Ident, ObjectName, ObjectNamePart, ObjectType, RenameTableNameKind,
    ShowCreateObject, Statement, TableConstraint, TimezoneInfo, Update,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Span;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use nyala_engine::{ColumnChange, PartitionSchema, RangeSpec};
use nyala_storage::{ColumnCompression, ColumnEncoding, ColumnSchema, ColumnType, Schema};

use crate::partitioning::{parse_range_partition, PartitionSpec};
use crate::{Result, SqlError};

/// A statement, classified.
#[derive(Debug)]
pub enum NyalaStatement {
    CreateTable(CreateTableSpec),
    DropTable {
        name: String,
        if_exists: bool,
    },
    ShowTables,
    Describe {
        name: String,
    },
    ShowCreateTable {
        name: String,
    },
    ShowPartitions {
        name: String,
    },
    RenameTable {
        name: String,
        new_name: String,
    },
    /// `ALTER TABLE t ADD|DROP|RENAME COLUMN ...`.
    AlterColumns {
        name: String,
        changes: Vec<ColumnAlteration>,
    },
    /// `ALTER TABLE t ADD|DROP RANGE PARTITION ...`.
    AlterRangePartition {
        name: String,
        add: bool,
        range: RangeSpec,
    },
    /// `CREATE TABLE t PRIMARY KEY (...) [DISTRIBUTE BY ...] AS <query>`: the columns come from
    /// the query, planned by the session.
    CreateTableAs(CreateTableAsSpec),
    /// Planned by DataFusion: queries, INSERT/UPSERT/UPDATE/DELETE, EXPLAIN.
    DataFusion(Box<Statement>),
    /// `INSERT IGNORE INTO ...` (possibly under EXPLAIN), parsed as the plain INSERT.
    InsertIgnore(Box<Statement>),
    /// `UPDATE t SET ... FROM s [WHERE ...]`, which DataFusion 55 does not plan, possibly
    /// under `EXPLAIN [ANALYZE] [VERBOSE]` (`explain`: Some((verbose, analyze))).
    UpdateFrom {
        update: Box<Update>,
        explain: Option<(bool, bool)>,
    },
}

/// One column change of an ALTER TABLE.
#[derive(Debug)]
pub struct ColumnAlteration {
    pub change: ColumnChange,
    /// `ADD ... IF NOT EXISTS` / `DROP ... IF EXISTS`: nothing to do when the column already
    /// exists / does not exist.
    pub if_exists: bool,
}

#[derive(Debug)]
pub struct CreateTableAsSpec {
    pub name: String,
    pub if_not_exists: bool,
    /// `WITH (replicas = n)`; 0: the default.
    pub replicas: usize,
    pub key: Vec<String>,
    pub partition: PartitionSpec,
    pub query: Box<Statement>,
}

#[derive(Debug)]
pub struct CreateTableSpec {
    pub name: String,
    pub if_not_exists: bool,
    /// `WITH (replicas = n)`; 0: the default.
    pub replicas: usize,
    pub schema: Schema,
    pub partition: PartitionSchema,
}

/// How [`CreateTableSpec::from_arrow`] sets the NULL-ability of non-key columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nullability {
    /// As the Arrow fields say (a query's result).
    FromFields,
    /// Always nullable (loaded data, whose fields often claim NOT NULL by accident).
    Nullable,
}

impl CreateTableSpec {
    /// A table holding the columns of `fields` (from `source`, named in errors) keyed by the
    /// `key` columns (NOT NULL) and partitioned by `partition`.
    pub fn from_arrow(
        name: &str,
        fields: &arrow::datatypes::Fields,
        source: &str,
        nullability: Nullability,
        key: &[String],
        partition: &PartitionSpec,
    ) -> Result<Self> {
        let index = |name: &String, what: &str| {
            fields.iter().position(|f| f.name() == name).ok_or_else(|| {
                SqlError::Invalid(format!(
                    "{what} column '{name}' is not a column of {source}"
                ))
            })
        };
        let key_columns = key
            .iter()
            .map(|k| index(k, "primary key"))
            .collect::<Result<Vec<_>>>()?;
        let columns = fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let column_type = ColumnType::from_arrow(f.data_type()).ok_or_else(|| {
                    SqlError::Invalid(format!(
                        "column '{}' of {source} has type {}, which a table cannot store; cast it",
                        f.name(),
                        f.data_type()
                    ))
                })?;
                let nullable = !key_columns.contains(&i)
                    && (nullability == Nullability::Nullable || f.is_nullable());
                Ok(ColumnSchema::new(f.name().clone(), column_type, nullable))
            })
            .collect::<Result<Vec<_>>>()?;
        let schema =
            Schema::new(columns, key_columns).map_err(|e| SqlError::Invalid(e.to_string()))?;
        Ok(CreateTableSpec {
            name: name.to_string(),
            if_not_exists: false,
            replicas: 0,
            partition: partition.resolve(&schema)?,
            schema,
        })
    }
}

fn tokenize(sql: &str) -> Result<Vec<Token>> {
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| SqlError::Parse(e.to_string()))
}

pub(crate) fn is_trivia(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_))
}

fn render(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(Token::to_string)
        .collect::<String>()
        .trim()
        .to_string()
}

/// Splits a script at top-level `;` into non-empty statements (comments and quotes respected).
pub fn split_statements(sql: &str) -> Result<Vec<String>> {
    let tokens = tokenize(sql)?;
    Ok(tokens
        .split(|t| *t == Token::SemiColon)
        .filter(|part| part.iter().any(|t| !is_trivia(t)))
        .map(render)
        .collect())
}

/// True if `token` is the unquoted keyword or word `word`.
pub(crate) fn is_word(token: &Token, word: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// Parses exactly one statement (a trailing `;` is allowed).
pub fn parse(sql: &str) -> Result<NyalaStatement> {
    let mut tokens = crate::as_of::rewrite(tokenize(sql)?)?;
    number_placeholders(&mut tokens);
    // Drop trailing semicolons and trivia; reject several statements.
    while tokens
        .last()
        .is_some_and(|t| is_trivia(t) || *t == Token::SemiColon)
    {
        tokens.pop();
    }
    if tokens.contains(&Token::SemiColon) {
        return Err(SqlError::Parse(
            "expected one statement, found several".into(),
        ));
    }
    let words: Vec<&Token> = tokens.iter().filter(|t| !is_trivia(t)).collect();
    if words.is_empty() {
        return Err(SqlError::Parse("empty statement".into()));
    }
    if is_word(words[0], "SHOW") && words.len() == 2 && is_word(words[1], "TABLES") {
        return Ok(NyalaStatement::ShowTables);
    }
    if is_word(words[0], "SHOW") && words.len() == 3 && is_word(words[1], "PARTITIONS") {
        return match words[2] {
            Token::Word(w) => Ok(NyalaStatement::ShowPartitions {
                name: normalize_ident(&Ident {
                    value: w.value.clone(),
                    quote_style: w.quote_style,
                    span: Span::empty(),
                }),
            }),
            _ => Err(SqlError::Parse("expected SHOW PARTITIONS table".into())),
        };
    }
    // UPSERT, possibly under EXPLAIN [ANALYZE] [VERBOSE]: parsed as INSERT, marked as replacing.
    let explained = words
        .iter()
        .take_while(|w| {
            ["EXPLAIN", "ANALYZE", "VERBOSE"]
                .iter()
                .any(|k| is_word(w, k))
        })
        .count();
    if words.get(explained).is_some_and(|w| is_word(w, "UPSERT"))
        && (explained == 0 || is_word(words[0], "EXPLAIN"))
    {
        let upsert = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !is_trivia(t))
            .nth(explained)
            .map_or(0, |(i, _)| i);
        tokens[upsert] = Token::make_keyword("INSERT");
        let mut statement = parse_one(tokens)?;
        let insert = match &mut statement {
            Statement::Explain { statement, .. } => statement.as_mut(),
            other => other,
        };
        match insert {
            Statement::Insert(insert) => insert.replace_into = true,
            _ => return Err(SqlError::Parse("expected UPSERT INTO table ...".into())),
        }
        return Ok(NyalaStatement::DataFusion(Box::new(statement)));
    }
    // INSERT IGNORE, possibly under EXPLAIN: parsed without IGNORE, planned to skip duplicates.
    if words.get(explained).is_some_and(|w| is_word(w, "INSERT"))
        && words
            .get(explained + 1)
            .is_some_and(|w| is_word(w, "IGNORE"))
        && (explained == 0 || is_word(words[0], "EXPLAIN"))
    {
        let ignore = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !is_trivia(t))
            .nth(explained + 1)
            .map_or(0, |(i, _)| i);
        tokens.remove(ignore);
        return Ok(NyalaStatement::InsertIgnore(Box::new(parse_one(tokens)?)));
    }
    if let Some(alter) = alter_range_partition(&tokens)? {
        return Ok(alter);
    }
    if is_word(words[0], "CREATE") && words.len() > 1 && is_word(words[1], "TABLE") {
        let replicas = take_replicas(&mut tokens)?;
        if let Some(at) = query_start(&tokens) {
            let mut spec = create_table_as(tokens, at)?;
            spec.replicas = replicas;
            return Ok(NyalaStatement::CreateTableAs(spec));
        }
        let mut spec = create_table(tokens)?;
        spec.replicas = replicas;
        return Ok(NyalaStatement::CreateTable(spec));
    }
    let attributes = match is_word(words[0], "ALTER") {
        true => take_storage_attributes(&mut tokens, 0)?,
        false => vec![],
    };
    match parse_one(tokens)? {
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
            Ok(NyalaStatement::DropTable {
                name: object_name(name)?,
                if_exists,
            })
        }
        Statement::Drop { object_type, .. } => {
            Err(SqlError::NotSupported(format!("DROP {object_type}")))
        }
        Statement::ExplainTable { table_name, .. } => Ok(NyalaStatement::Describe {
            name: object_name(&table_name)?,
        }),
        Statement::AlterTable(alter) => match alter.operations.as_slice() {
            [AlterTableOperation::RenameTable {
                table_name: RenameTableNameKind::To(new) | RenameTableNameKind::As(new),
            }] => Ok(NyalaStatement::RenameTable {
                name: object_name(&alter.name)?,
                new_name: object_name(new)?,
            }),
            operations => Ok(NyalaStatement::AlterColumns {
                name: object_name(&alter.name)?,
                changes: alter_columns(operations, &attributes)?,
            }),
        },
        Statement::Update(update) if update.from.is_some() => Ok(NyalaStatement::UpdateFrom {
            update: Box::new(update),
            explain: None,
        }),
        Statement::Explain {
            statement,
            analyze,
            verbose,
            ..
        } if matches!(statement.as_ref(), Statement::Update(u) if u.from.is_some()) => {
            let Statement::Update(update) = *statement else {
                return Err(SqlError::Parse("expected EXPLAIN UPDATE".into()));
            };
            Ok(NyalaStatement::UpdateFrom {
                update: Box::new(update),
                explain: Some((verbose, analyze)),
            })
        }
        Statement::ShowCreate {
            obj_type: ShowCreateObject::Table,
            obj_name,
        } => Ok(NyalaStatement::ShowCreateTable {
            name: object_name(&obj_name)?,
        }),
        statement => Ok(NyalaStatement::DataFusion(Box::new(statement))),
    }
}

/// `ALTER TABLE t {ADD | DROP} RANGE PARTITION <range>`, which sqlparser does not know.
fn alter_range_partition(tokens: &[Token]) -> Result<Option<NyalaStatement>> {
    let words: Vec<(usize, &Token)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !is_trivia(t))
        .collect();
    if words.len() < 2 || !is_word(words[0].1, "ALTER") || !is_word(words[1].1, "TABLE") {
        return Ok(None);
    }
    let Some(at) = words.windows(3).position(|w| {
        (is_word(w[0].1, "ADD") || is_word(w[0].1, "DROP"))
            && is_word(w[1].1, "RANGE")
            && is_word(w[2].1, "PARTITION")
    }) else {
        return Ok(None);
    };
    let name_tokens = tokens[words[2].0..words[at].0].to_vec();
    let mut parser = Parser::new(&GenericDialect {}).with_tokens(name_tokens);
    let name = parser
        .parse_object_name(false)
        .map_err(|e| SqlError::Parse(e.to_string()))?;
    if parser.peek_token().token != Token::EOF {
        return Err(SqlError::Parse(
            "expected ALTER TABLE name ADD|DROP RANGE PARTITION ...".into(),
        ));
    }
    Ok(Some(NyalaStatement::AlterRangePartition {
        name: object_name(&name)?,
        add: is_word(words[at].1, "ADD"),
        range: parse_range_partition(&tokens[words[at + 2].0 + 1..])?,
    }))
}

/// JDBC and ADBC send `?` placeholders; DataFusion binds `$1`, `$2`, ... in order.
fn number_placeholders(tokens: &mut [Token]) {
    let mut next = 0;
    for token in tokens.iter_mut() {
        if let Token::Placeholder(p) = token {
            if p == "?" {
                next += 1;
                *p = format!("${next}");
            } else if let Some(n) = p.strip_prefix('?') {
                *p = format!("${n}");
            }
        }
    }
}

fn parse_one(tokens: Vec<Token>) -> Result<Statement> {
    let mut parser = Parser::new(&GenericDialect {}).with_tokens(tokens);
    let statement = parser
        .parse_statement()
        .map_err(|e| SqlError::Parse(e.to_string()))?;
    if parser.peek_token().token != Token::EOF {
        return Err(SqlError::Parse(format!(
            "unexpected {} after the end of the statement",
            parser.peek_token().token
        )));
    }
    Ok(statement)
}

/// SQL identifier normalisation as DataFusion does it: unquoted → lowercase, quoted → verbatim.
pub fn normalize_ident(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_ascii_lowercase(),
    }
}

/// A table name: `t` or `nyala.public.t` / `public.t`.
pub(crate) fn object_name(name: &ObjectName) -> Result<String> {
    let parts: Vec<&Ident> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(ident) => Ok(ident),
            other => Err(SqlError::Parse(format!("unexpected name part {other}"))),
        })
        .collect::<Result<_>>()?;
    let Some((table, qualifiers)) = parts.split_last() else {
        return Err(SqlError::Parse("missing table name".into()));
    };
    let expected = [crate::CATALOG_NAME, crate::SCHEMA_NAME];
    let qualifiers: Vec<String> = qualifiers.iter().map(|i| normalize_ident(i)).collect();
    let qualifiers_ref: Vec<&str> = qualifiers.iter().map(String::as_str).collect();
    if qualifiers.len() > 2 || !expected.ends_with(&qualifiers_ref) {
        return Err(SqlError::Invalid(format!(
            "unknown schema '{}': tables live in {}.{}",
            qualifiers.join("."),
            crate::CATALOG_NAME,
            crate::SCHEMA_NAME
        )));
    }
    Ok(normalize_ident(table))
}

/// Removes a top-level `WITH (replicas = n)` from a CREATE TABLE; returns n (0 without it).
/// Whether the deployment can place n replicas is the engine's to say.
fn take_replicas(tokens: &mut Vec<Token>) -> Result<usize> {
    let mut depth = 0i32;
    let mut start = None;
    for (i, token) in tokens.iter().enumerate() {
        match token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 0 && is_word(t, "WITH") => {
                let next = tokens[i + 1..].iter().find(|t| !is_trivia(t));
                if next == Some(&Token::LParen) {
                    start = Some(i);
                }
                break;
            }
            t if depth == 0 && is_word(t, "AS") => break,
            _ => {}
        }
    }
    let Some(start) = start else {
        return Ok(0);
    };
    let open = start
        + 1
        + tokens[start + 1..]
            .iter()
            .position(|t| *t == Token::LParen)
            .unwrap_or(0);
    let close = open
        + tokens[open..]
            .iter()
            .position(|t| *t == Token::RParen)
            .ok_or_else(|| SqlError::Parse("unclosed WITH (...)".into()))?;
    let options: Vec<&Token> = tokens[open + 1..close]
        .iter()
        .filter(|t| !is_trivia(t))
        .collect();
    let mut replicas = 0;
    for option in options.split(|t| **t == Token::Comma) {
        match option {
            [name, Token::Eq, Token::Number(n, _)] if is_word(name, "replicas") => {
                replicas = n.parse().ok().filter(|&n: &usize| n >= 1).ok_or_else(|| {
                    SqlError::Invalid(format!("replicas must be a whole number from 1, got {n}"))
                })?;
            }
            other => {
                let text: Vec<String> = other.iter().map(|t| t.to_string()).collect();
                return Err(SqlError::NotSupported(format!(
                    "table option '{}' (supported: replicas = n)",
                    text.join(" ")
                )));
            }
        }
    }
    tokens.drain(start..=close);
    Ok(replicas)
}

/// The position of the `AS` that starts the query of a CREATE TABLE ... AS SELECT, if any.
fn query_start(tokens: &[Token]) -> Option<usize> {
    let mut depth = 0i32;
    for (i, token) in tokens.iter().enumerate() {
        match token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 0 && is_word(t, "AS") => {
                let next = tokens[i + 1..].iter().find(|t| !is_trivia(t))?;
                let query = ["SELECT", "WITH", "VALUES"]
                    .iter()
                    .any(|w| is_word(next, w))
                    || *next == Token::LParen;
                return query.then_some(i);
            }
            _ => {}
        }
    }
    None
}

/// `CREATE TABLE [IF NOT EXISTS] t {PRIMARY KEY (...) | (PRIMARY KEY (...))}
/// [DISTRIBUTE BY ...] AS <query>` (Impala's form for Kudu tables).
fn create_table_as(tokens: Vec<Token>, at: usize) -> Result<CreateTableAsSpec> {
    let query = parse_one(tokens[at + 1..].to_vec())?;
    if !matches!(query, Statement::Query(_)) {
        return Err(SqlError::Parse("expected a query after AS".into()));
    }
    let head: Vec<&Token> = tokens[..at].iter().filter(|t| !is_trivia(t)).collect();
    let syntax = || {
        SqlError::Parse(
            "expected CREATE TABLE [IF NOT EXISTS] name PRIMARY KEY (column, ...) \
             [DISTRIBUTE BY ...] AS SELECT ..."
                .into(),
        )
    };
    let mut i = 2;
    let if_not_exists = head.len() > 4
        && is_word(head[2], "IF")
        && is_word(head[3], "NOT")
        && is_word(head[4], "EXISTS");
    if if_not_exists {
        i = 5;
    }
    let name = match head.get(i) {
        Some(Token::Word(w)) => word_name(w),
        _ => return Err(syntax()),
    };
    let rest = &head[i + 1..];
    // The key: PRIMARY KEY (a, b), bare or in parentheses.
    let primary = rest
        .windows(2)
        .position(|w| is_word(w[0], "PRIMARY") && is_word(w[1], "KEY"))
        .ok_or_else(|| {
            SqlError::Invalid(format!(
                "table '{name}' needs a primary key: CREATE TABLE {name} PRIMARY KEY (column, ...) AS SELECT ..."
            ))
        })?;
    let mut key = Vec::new();
    let mut j = primary + 2;
    if rest.get(j) != Some(&&Token::LParen) {
        return Err(syntax());
    }
    j += 1;
    loop {
        match rest.get(j) {
            Some(Token::Word(w)) => key.push(word_name(w)),
            _ => return Err(syntax()),
        }
        j += 1;
        match rest.get(j) {
            Some(Token::Comma) => j += 1,
            Some(Token::RParen) => break,
            _ => return Err(syntax()),
        }
    }
    let partitioning = rest
        .iter()
        .position(|t| is_word(t, "DISTRIBUTE") || is_word(t, "PARTITION"));
    let partition = match partitioning {
        Some(p) => {
            let tokens: Vec<Token> = rest[p..].iter().map(|t| (*t).clone()).collect();
            PartitionSpec::parse(&tokens)?
        }
        None => PartitionSpec::default(),
    };
    Ok(CreateTableAsSpec {
        name,
        if_not_exists,
        replicas: 0,
        key,
        partition,
        query: Box::new(query),
    })
}

pub(crate) fn word_name(w: &datafusion::sql::sqlparser::tokenizer::Word) -> String {
    match w.quote_style {
        Some(_) => w.value.clone(),
        None => w.value.to_ascii_lowercase(),
    }
}

fn create_table(tokens: Vec<Token>) -> Result<CreateTableSpec> {
    let mut depth = 0i32;
    let mut split = tokens.len();
    for (i, token) in tokens.iter().enumerate() {
        match token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 0 && (is_word(t, "DISTRIBUTE") || is_word(t, "PARTITION")) => {
                split = i;
                break;
            }
            _ => {}
        }
    }
    let partitioning = tokens[split..].to_vec();
    let mut head = tokens;
    head.truncate(split);
    let attributes = take_storage_attributes(&mut head, 1)?;
    let non_unique = take_non_unique(&mut head);
    let Statement::CreateTable(create) = parse_one(head)? else {
        return Err(SqlError::Parse("expected CREATE TABLE".into()));
    };
    let (name, if_not_exists, mut schema) = table_schema(&create, &attributes)?;
    if non_unique {
        schema = schema
            .with_auto_increment()
            .map_err(|e| SqlError::Invalid(e.to_string()))?;
    }
    let partition = if partitioning.is_empty() {
        PartitionSchema::single()
    } else {
        PartitionSpec::parse(&partitioning)?.resolve(&schema)?
    };
    Ok(CreateTableSpec {
        name,
        if_not_exists,
        replicas: 0,
        schema,
        partition,
    })
}

/// Kudu's column attributes `ENCODING e` and `COMPRESSION c`, which sqlparser does not know:
/// removed from the column definitions and returned with their column's name. Column
/// definitions are the comma-separated parts at parenthesis depth `level` (1: the column list
/// of a CREATE TABLE, which ends at its closing parenthesis; 0: the changes of an ALTER TABLE,
/// where the column's name follows `ADD [COLUMN] [IF NOT EXISTS]`).
fn take_storage_attributes(
    tokens: &mut Vec<Token>,
    level: i32,
) -> Result<Vec<(String, StorageAttribute)>> {
    let mut attributes = Vec::new();
    let mut remove = Vec::new();
    let mut depth = 0i32;
    let mut column: Option<String> = None;
    // In an ALTER TABLE, the name of an added column follows ADD [COLUMN] [IF NOT EXISTS].
    let mut after_add = false;
    let before_name = |t: &Token| {
        ["COLUMN", "IF", "NOT", "EXISTS"]
            .iter()
            .any(|w| is_word(t, w))
    };
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !is_trivia(&tokens[i]))
        .collect();
    for (n, &i) in significant.iter().enumerate() {
        match &tokens[i] {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if level > 0 && depth == 0 {
                    break; // the end of the column list
                }
            }
            Token::Comma if depth == level => {
                column = None;
                after_add = false;
            }
            t if depth == level && (is_word(t, "ENCODING") || is_word(t, "COMPRESSION")) => {
                let name = column.clone().unwrap_or_default();
                let Some((at, Token::Word(value))) =
                    significant.get(n + 1).map(|&at| (at, &tokens[at]))
                else {
                    return Err(SqlError::Parse(format!(
                        "expected a name after {t} (column '{name}')"
                    )));
                };
                let attribute = if is_word(t, "ENCODING") {
                    ColumnEncoding::parse(&value.value)
                        .map(StorageAttribute::Encoding)
                        .ok_or_else(|| {
                            SqlError::Invalid(format!(
                                "unknown encoding {} (column '{name}'); use one of {}",
                                value.value,
                                ColumnEncoding::NAMES
                            ))
                        })?
                } else {
                    ColumnCompression::parse(&value.value)
                        .map(StorageAttribute::Compression)
                        .ok_or_else(|| {
                            SqlError::Invalid(format!(
                                "unknown compression {} (column '{name}'); use one of {}",
                                value.value,
                                ColumnCompression::NAMES
                            ))
                        })?
                };
                attributes.push((name, attribute));
                remove.extend([i, at]);
            }
            t @ Token::Word(w) if depth == level && column.is_none() => {
                if level > 0 || (after_add && !before_name(t)) {
                    column = Some(word_name(w));
                } else if is_word(t, "ADD") {
                    after_add = true;
                }
            }
            _ => {}
        }
    }
    for i in remove.into_iter().rev() {
        tokens.remove(i);
    }
    Ok(attributes)
}

/// Removes `NON UNIQUE` before `PRIMARY KEY` (Kudu 1.17); true if it was there.
fn take_non_unique(tokens: &mut Vec<Token>) -> bool {
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !is_trivia(&tokens[i]))
        .collect();
    let found = significant.windows(4).find(|w| {
        is_word(&tokens[w[0]], "NON")
            && is_word(&tokens[w[1]], "UNIQUE")
            && is_word(&tokens[w[2]], "PRIMARY")
            && is_word(&tokens[w[3]], "KEY")
    });
    match found {
        Some(w) => {
            let (non, unique) = (w[0], w[1]);
            tokens.remove(unique);
            tokens.remove(non);
            true
        }
        None => false,
    }
}

fn apply_attributes(column: &mut ColumnSchema, attributes: &[(String, StorageAttribute)]) {
    for (_, attribute) in attributes.iter().filter(|(c, _)| *c == column.name) {
        match *attribute {
            StorageAttribute::Encoding(e) => column.encoding = e,
            StorageAttribute::Compression(c) => column.compression = c,
        }
    }
}

/// An attribute that matched no defined column was written somewhere other than after a
/// column's type.
fn check_attributes_used(
    attributes: &[(String, StorageAttribute)],
    columns: &[ColumnSchema],
) -> Result<()> {
    match attributes
        .iter()
        .find(|(name, _)| !columns.iter().any(|c| c.name == *name))
    {
        Some((name, _)) => Err(SqlError::Parse(format!(
            "ENCODING and COMPRESSION go after the type of a column being defined (near '{name}')"
        ))),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, Copy)]
enum StorageAttribute {
    Encoding(ColumnEncoding),
    Compression(ColumnCompression),
}

fn table_schema(
    create: &CreateTable,
    attributes: &[(String, StorageAttribute)],
) -> Result<(String, bool, Schema)> {
    if create.query.is_some() {
        return Err(SqlError::NotSupported("CREATE TABLE ... AS SELECT".into()));
    }
    if create.or_replace || create.temporary || create.external {
        return Err(SqlError::NotSupported(
            "CREATE OR REPLACE / TEMPORARY / EXTERNAL TABLE".into(),
        ));
    }
    let name = object_name(&create.name)?;
    let mut columns = Vec::new();
    let mut key: Vec<String> = Vec::new();
    for def in &create.columns {
        let (mut column, primary_key) = column_schema(def)?;
        if primary_key {
            key.push(column.name.clone());
        }
        apply_attributes(&mut column, attributes);
        columns.push(column);
    }
    check_attributes_used(attributes, &columns)?;
    for constraint in &create.constraints {
        match constraint {
            TableConstraint::PrimaryKey(pk) => {
                if !key.is_empty() {
                    return Err(SqlError::Invalid(
                        "the primary key is declared twice".into(),
                    ));
                }
                for column in &pk.columns {
                    match &column.column.expr {
                        Expr::Identifier(ident) => key.push(normalize_ident(ident)),
                        other => {
                            return Err(SqlError::Invalid(format!(
                                "primary key columns must be column names, got {other}"
                            )))
                        }
                    }
                }
            }
            other => return Err(SqlError::NotSupported(format!("table constraint {other}"))),
        }
    }
    if key.is_empty() {
        return Err(SqlError::Invalid(format!(
            "table '{name}' needs a primary key: add PRIMARY KEY (column, ...)"
        )));
    }
    let mut key_indexes = Vec::with_capacity(key.len());
    for k in &key {
        let Some(i) = columns.iter().position(|c| &c.name == k) else {
            return Err(SqlError::Invalid(format!(
                "primary key column '{k}' is not a column"
            )));
        };
        if key_indexes.contains(&i) {
            return Err(SqlError::Invalid(format!(
                "primary key column '{k}' is listed twice"
            )));
        }
        // Key columns are implicitly NOT NULL, as in Kudu.
        columns[i].nullable = false;
        key_indexes.push(i);
    }
    let schema = Schema::new(columns, key_indexes).map_err(|e| SqlError::Invalid(e.to_string()))?;
    Ok((name, create.if_not_exists, schema))
}

/// A column definition; true if it says PRIMARY KEY.
fn column_schema(def: &ColumnDef) -> Result<(ColumnSchema, bool)> {
    let column_name = normalize_ident(&def.name);
    let column_type = column_type(&def.data_type)?;
    let mut nullable = true;
    let mut default = None;
    let mut comment = None;
    let mut primary_key = false;
    for option in &def.options {
        match &option.option {
            ColumnOption::Null => nullable = true,
            ColumnOption::NotNull => nullable = false,
            ColumnOption::PrimaryKey(_) => {
                primary_key = true;
                nullable = false;
            }
            ColumnOption::Default(expr) => {
                default = default_value(expr, column_type, &column_name)?;
            }
            ColumnOption::Comment(text) => comment = Some(text.clone()),
            other => {
                return Err(SqlError::NotSupported(format!(
                    "column option {other} (column '{column_name}')"
                )))
            }
        }
    }
    Ok((
        ColumnSchema {
            default,
            comment,
            ..ColumnSchema::new(column_name, column_type, nullable)
        },
        primary_key,
    ))
}

/// `ALTER TABLE t ADD [COLUMN] [IF NOT EXISTS] c TYPE ..., DROP [COLUMN] [IF EXISTS] c,
/// RENAME COLUMN c TO d`, in order.
fn alter_columns(
    operations: &[AlterTableOperation],
    attributes: &[(String, StorageAttribute)],
) -> Result<Vec<ColumnAlteration>> {
    let mut changes = Vec::new();
    let mut added = Vec::new();
    for operation in operations {
        match operation {
            AlterTableOperation::AddColumn {
                if_not_exists,
                column_def,
                column_position: None,
                ..
            } => {
                let (mut column, primary_key) = column_schema(column_def)?;
                apply_attributes(&mut column, attributes);
                added.push(column.clone());
                if primary_key {
                    return Err(SqlError::Invalid(format!(
                        "column '{}': a column added to a table cannot join its primary key",
                        column.name
                    )));
                }
                changes.push(ColumnAlteration {
                    change: ColumnChange::Add(column),
                    if_exists: *if_not_exists,
                });
            }
            AlterTableOperation::DropColumn {
                column_names,
                if_exists,
                drop_behavior: None,
                ..
            } => changes.extend(column_names.iter().map(|c| ColumnAlteration {
                change: ColumnChange::Drop(normalize_ident(c)),
                if_exists: *if_exists,
            })),
            AlterTableOperation::RenameColumn {
                old_column_name,
                new_column_name,
            } => changes.push(ColumnAlteration {
                change: ColumnChange::Rename {
                    name: normalize_ident(old_column_name),
                    new_name: normalize_ident(new_column_name),
                },
                if_exists: false,
            }),
            other => {
                return Err(SqlError::NotSupported(format!(
                    "ALTER TABLE ... {other} (supported: RENAME TO, ADD/DROP/RENAME COLUMN, \
                     ADD/DROP RANGE PARTITION)"
                )))
            }
        }
    }
    check_attributes_used(attributes, &added)?;
    Ok(changes)
}

/// The text of a `DEFAULT` literal, checked against the column's type (None for NULL).
fn default_value(expr: &Expr, column_type: ColumnType, column: &str) -> Result<Option<String>> {
    use datafusion::sql::sqlparser::ast::{UnaryOperator, Value};
    let text = match expr {
        Expr::Value(v) => match &v.value {
            Value::Null => return Ok(None),
            Value::Number(n, _) => n.clone(),
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            Value::Boolean(b) => b.to_string(),
            _ => String::new(),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => format!("-{n}"),
                _ => String::new(),
            },
            _ => String::new(),
        },
        _ => String::new(),
    };
    let invalid = || {
        SqlError::Invalid(format!(
            "DEFAULT {expr} of column '{column}' is not a {} literal",
            column_type.sql_name()
        ))
    };
    if text.is_empty()
        && !matches!(
            column_type,
            ColumnType::String | ColumnType::Varchar { .. } | ColumnType::Binary
        )
    {
        return Err(invalid());
    }
    if let ColumnType::Varchar { length } = column_type {
        if text.chars().count() > length as usize {
            return Err(invalid());
        }
    }
    datafusion::common::ScalarValue::try_from_string(text.clone(), &column_type.arrow_type())
        .ok()
        .filter(|v| !v.is_null())
        .ok_or_else(invalid)?;
    Ok(Some(text))
}

/// SQL type → Nyala column type. Kudu's names (INT8..INT64, STRING) and the usual SQL synonyms.
fn column_type(data_type: &DataType) -> Result<ColumnType> {
    use ColumnType as C;
    Ok(match data_type {
        // INT8 is Kudu's 1-byte integer here, not PostgreSQL's 8-byte one.
        DataType::Int8(_) | DataType::TinyInt(_) => C::Int8,
        DataType::Int16 | DataType::SmallInt(_) | DataType::Int2(_) => C::Int16,
        DataType::Int32 | DataType::Int(_) | DataType::Integer(_) | DataType::Int4(_) => C::Int32,
        DataType::Int64 | DataType::BigInt(_) => C::Int64,
        DataType::Float(_) | DataType::Real | DataType::Float4 | DataType::Float32 => C::Float,
        DataType::Double(ExactNumberInfo::None)
        | DataType::DoublePrecision
        | DataType::Float8
        | DataType::Float64 => C::Double,
        DataType::Bool | DataType::Boolean => C::Bool,
        DataType::Varchar(Some(length))
        | DataType::CharVarying(Some(length))
        | DataType::CharacterVarying(Some(length)) => {
            let length = match length {
                CharacterLength::IntegerLength { length, .. } => *length,
                CharacterLength::Max => 65_535,
            };
            if !(1..=65_535).contains(&length) {
                return Err(SqlError::Invalid(format!(
                    "VARCHAR({length}): the length must be 1 to 65535"
                )));
            }
            C::Varchar {
                length: length as u32,
            }
        }
        DataType::String(_)
        | DataType::Text
        | DataType::Varchar(None)
        | DataType::CharVarying(None)
        | DataType::CharacterVarying(None) => C::String,
        DataType::Binary(_) | DataType::Varbinary(_) | DataType::Bytea | DataType::Blob(_) => {
            C::Binary
        }
        DataType::Timestamp(None | Some(6), TimezoneInfo::None | TimezoneInfo::WithTimeZone)
        | DataType::Datetime(None) => C::Timestamp,
        DataType::Date => C::Date,
        DataType::Decimal(info) | DataType::Numeric(info) | DataType::Dec(info) => {
            let (precision, scale) =
                match info {
                    ExactNumberInfo::Precision(p) => (*p, 0),
                    ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
                    ExactNumberInfo::None => return Err(SqlError::Invalid(
                        "DECIMAL needs a precision: DECIMAL(p) or DECIMAL(p, s), p from 1 to 38"
                            .into(),
                    )),
                };
            if !(1..=38).contains(&precision) || scale < 0 || scale as u64 > precision {
                return Err(SqlError::Invalid(format!(
                    "DECIMAL({precision}, {scale}): the precision must be 1 to 38 and the scale 0 to the precision"
                )));
            }
            C::Decimal {
                precision: precision as u8,
                scale: scale as i8,
            }
        }
        DataType::Custom(name, args) if args.is_empty() => {
            match name.to_string().to_ascii_uppercase().as_str() {
                "INT8" => C::Int8,
                "INT16" => C::Int16,
                "INT32" => C::Int32,
                "INT64" => C::Int64,
                "BINARY" => C::Binary,
                other => return Err(SqlError::NotSupported(format!("column type {other}"))),
            }
        }
        other => return Err(SqlError::NotSupported(format!("column type {other}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_scripts_respecting_quotes_and_comments() {
        let parts =
            split_statements("SELECT ';' ; -- a ; comment\n INSERT INTO t VALUES (1);;").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], "SELECT ';'");
        assert!(parts[1].ends_with("INSERT INTO t VALUES (1)"));
    }

    #[test]
    fn parses_create_table_with_hash_distribution() {
        let NyalaStatement::CreateTable(spec) = parse(
            "CREATE TABLE Metrics (host STRING, ts TIMESTAMP, metric STRING, value DOUBLE, \
             PRIMARY KEY (host, metric, ts)) DISTRIBUTE BY HASH (host, metric) INTO 4 BUCKETS;",
        )
        .unwrap() else {
            panic!("not a create table")
        };
        assert_eq!(spec.name, "metrics");
        assert_eq!(spec.partition.hash.len(), 1);
        assert_eq!(spec.partition.hash[0].buckets, 4);
        assert_eq!(spec.partition.hash[0].columns, vec![0, 2]);
        assert_eq!(spec.schema.key_columns(), &[0, 2, 1]);
        assert!(!spec.schema.columns()[1].nullable);
        assert!(spec.schema.columns()[3].nullable);
    }

    #[test]
    fn impala_synonym_and_column_primary_key() {
        let NyalaStatement::CreateTable(spec) = parse(
            "create table t (id bigint primary key, v int8) partition by hash (id) partitions 3",
        )
        .unwrap() else {
            panic!("not a create table")
        };
        assert_eq!(spec.partition.num_tablets(), 3);
        assert_eq!(spec.schema.columns()[1].column_type, ColumnType::Int8);
    }

    #[test]
    fn rejects_bad_ddl_with_clear_errors() {
        for (sql, needle) in [
            ("CREATE TABLE t (a INT)", "primary key"),
            ("CREATE TABLE t (a INT, PRIMARY KEY (b))", "'b'"),
            (
                "CREATE TABLE t (a INT PRIMARY KEY) DISTRIBUTE BY HASH (z) INTO 2 BUCKETS",
                "'z'",
            ),
            (
                "CREATE TABLE t (a INT PRIMARY KEY) DISTRIBUTE BY HASH (a) INTO BUCKETS",
                "expected",
            ),
            ("CREATE TABLE t (a INT PRIMARY KEY, b GEOMETRY)", "GEOMETRY"),
        ] {
            let err = parse(sql).unwrap_err().to_string();
            assert!(err.contains(needle), "{sql}: {err}");
        }
    }

    #[test]
    fn upsert_becomes_replace_insert() {
        let NyalaStatement::DataFusion(explained) =
            parse("EXPLAIN ANALYZE UPSERT INTO t VALUES (1, 2)").unwrap()
        else {
            panic!("not a DataFusion statement")
        };
        assert!(
            explained
                .to_string()
                .starts_with("EXPLAIN ANALYZE REPLACE INTO t"),
            "{explained}"
        );
        let NyalaStatement::DataFusion(statement) = parse("UPSERT INTO t VALUES (1, 2)").unwrap()
        else {
            panic!("not planned by DataFusion")
        };
        let Statement::Insert(insert) = *statement else {
            panic!("not an insert")
        };
        assert!(insert.replace_into);
    }

    #[test]
    fn question_marks_become_numbered_placeholders() {
        let NyalaStatement::DataFusion(statement) =
            parse("SELECT * FROM t WHERE a = ? AND b IN (?, '?') AND c = ?7").unwrap()
        else {
            panic!("not planned by DataFusion")
        };
        assert_eq!(
            statement.to_string(),
            "SELECT * FROM t WHERE a = $1 AND b IN ($2, '?') AND c = $7"
        );
    }
}
