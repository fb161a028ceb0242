//! The SQL dialect Nyala parses: sqlparser's GenericDialect plus Nyala's syntax that sits
//! inside statements sqlparser parses.
//!
//! Whole statements of Nyala's own (CREATE TABLE ... DISTRIBUTE BY, ALTER TABLE ... RANGE
//! PARTITION, SHOW PARTITIONS) are parsed by [`crate::parse::parser::NyalaParser`] before sqlparser is
//! asked. Three extensions are nested where only sqlparser's own grammar reaches — a column
//! definition in an ALTER TABLE, an UPSERT under EXPLAIN, a table reference in any query — so
//! they are parsed through the hooks sqlparser gives a dialect, at the grammar position they
//! belong to, and land in sqlparser's AST as structured values:
//!
//! - `UPSERT INTO ...` is an INSERT with `replace_into` set, which DataFusion plans as
//!   `InsertOp::Replace` (`parse_statement`, so it works under EXPLAIN too);
//! - `ENCODING e` / `COMPRESSION c` after a column's type are column options
//!   ([`StorageOption`], `parse_column_option`), in CREATE TABLE and ALTER TABLE ADD COLUMN;
//! - `t AS OF <time>` and `t FOR SYSTEM_TIME AS OF <time>` become the table reference's
//!   [`TableVersion::ForSystemTimeAsOf`]. sqlparser parses table versions only for dialects
//!   whose versioning syntax (`AT (...)`, `BEFORE (...)`, `CHANGES ...`) would steal those
//!   words as table aliases, and knows no bare `AS OF`; so the clause is parsed where sqlparser
//!   asks whether the word after a table name is its alias (`is_table_factor_alias`): the time
//!   and the real alias are parsed there and kept by the position of that word, and
//!   [`NyalaDialect::attach_time_travel`] moves them into the AST once the statement is parsed.
//!
//! Everything else is GenericDialect's: its settings are forwarded one by one and it is
//! reported as GenericDialect, so sqlparser's dialect checks treat both alike.

use std::any::TypeId;
use std::cell::{Cell, RefCell};
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    ColumnOption, Expr, Statement, TableAlias, TableFactor, TableVersion, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::{Dialect, GenericDialect, Precedence};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Span, Token};

use crate::{Result, SqlError};

/// GenericDialect with Nyala's hooks. One per statement parsed: it keeps the AS OF clauses
/// found while parsing until they are attached to the AST, and bounds the parser's work.
#[derive(Debug)]
pub(crate) struct NyalaDialect {
    /// AS OF clauses by the position of the word sqlparser took for the table's alias.
    time_travel: RefCell<Vec<(Span, TimeTravel)>>,
    /// Expressions the parser may still begin to parse. sqlparser tries some nested shapes
    /// (`NOT (`, `CAST((`, `EXISTS (SELECT`) one way and then another at every level, which
    /// takes time exponential in their depth: 45 levels of `NOT (` would parse for hours. Its
    /// expressions are counted instead, up to a budget linear in the statement's length.
    expressions_left: Cell<usize>,
}

/// Expressions any statement may begin, and more per byte of its text.
const EXPRESSION_BUDGET: usize = 20_000;
const EXPRESSION_BUDGET_PER_BYTE: usize = 8;

impl Default for NyalaDialect {
    /// A dialect for tokenizing, and for parsing without a bound.
    fn default() -> Self {
        Self {
            time_travel: RefCell::default(),
            expressions_left: Cell::new(usize::MAX),
        }
    }
}

/// An AS OF clause: the time and the table's alias after it, or why they did not parse.
type TimeTravel = std::result::Result<(Expr, Option<TableAlias>), String>;

/// Kudu's storage attributes of a column, as a column option in sqlparser's AST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StorageOption {
    Encoding(String),
    Compression(String),
    /// `GENERATED ALWAYS AS POSITION`: a queue table's position column, assigned by the
    /// tablets in log order.
    Position,
}

impl StorageOption {
    fn to_column_option(&self) -> ColumnOption {
        let (keyword, name) = match self {
            StorageOption::Encoding(name) => ("ENCODING", name.as_str()),
            StorageOption::Compression(name) => ("COMPRESSION", name.as_str()),
            StorageOption::Position => ("GENERATED", "POSITION"),
        };
        ColumnOption::DialectSpecific(vec![
            Token::make_keyword(keyword),
            Token::make_word(name, None),
        ])
    }

    /// The storage attribute `option` holds, if it is one.
    pub(crate) fn from_column_option(option: &ColumnOption) -> Option<Self> {
        let ColumnOption::DialectSpecific(tokens) = option else {
            return None;
        };
        match tokens.as_slice() {
            [Token::Word(attribute), Token::Word(name)] => match attribute.keyword {
                Keyword::ENCODING => Some(StorageOption::Encoding(name.value.clone())),
                Keyword::COMPRESSION => Some(StorageOption::Compression(name.value.clone())),
                Keyword::GENERATED if name.value == "POSITION" => Some(StorageOption::Position),
                _ => None,
            },
            _ => None,
        }
    }
}

impl NyalaDialect {
    /// The dialect to parse statement `sql` with (its work bounded).
    pub(crate) fn for_statement(sql: &str) -> Self {
        let budget = EXPRESSION_BUDGET.saturating_add(EXPRESSION_BUDGET_PER_BYTE * sql.len());
        Self {
            expressions_left: Cell::new(budget),
            ..Self::default()
        }
    }

    /// The first AS OF clause that did not parse: the error to report, whatever sqlparser
    /// made of the rest of the statement.
    pub(crate) fn time_travel_error(&self) -> Option<SqlError> {
        self.time_travel
            .borrow()
            .iter()
            .find_map(|(_, clause)| clause.as_ref().err())
            .map(|e| SqlError::Parse(e.clone()))
    }

    /// Moves the AS OF clauses parsed for tables in `node` into their table references.
    pub(crate) fn attach_time_travel<V: VisitMut>(&self, node: &mut V) -> Result<()> {
        struct Attach<'a>(&'a RefCell<Vec<(Span, TimeTravel)>>);
        impl VisitorMut for Attach<'_> {
            type Break = Box<SqlError>;
            fn pre_visit_table_factor(
                &mut self,
                factor: &mut TableFactor,
            ) -> ControlFlow<Self::Break> {
                let TableFactor::Table { alias, version, .. } = factor else {
                    return ControlFlow::Continue(());
                };
                let Some(at) = alias
                    .as_ref()
                    .filter(|a| a.name.quote_style.is_none())
                    .map(|a| a.name.span)
                else {
                    return ControlFlow::Continue(());
                };
                let mut clauses = self.0.borrow_mut();
                // The same words may have been parsed more than once (sqlparser backtracks);
                // the last parse is the one the AST holds.
                let mut found = None;
                let mut i = 0;
                while i < clauses.len() {
                    match clauses[i].0 == at {
                        true => found = Some(clauses.remove(i).1),
                        false => i += 1,
                    }
                }
                match found {
                    Some(Ok((time, real_alias))) => {
                        *version = Some(TableVersion::ForSystemTimeAsOf(time));
                        *alias = real_alias;
                        ControlFlow::Continue(())
                    }
                    Some(Err(e)) => ControlFlow::Break(Box::new(SqlError::Parse(e))),
                    None => ControlFlow::Continue(()),
                }
            }
        }
        match node.visit(&mut Attach(&self.time_travel)) {
            ControlFlow::Break(e) => Err(*e),
            ControlFlow::Continue(()) => Ok(()),
        }
    }

    /// Fails if an AS OF clause was parsed that no table reference took (it followed a
    /// subquery or a table function, say).
    pub(crate) fn check_time_travel_attached(&self) -> Result<()> {
        match self.time_travel.borrow().first() {
            Some(_) => Err(SqlError::Parse(
                "AS OF and FOR SYSTEM_TIME AS OF follow a table name".into(),
            )),
            None => Ok(()),
        }
    }

    /// `UPSERT INTO ...`: the INSERT it is, marked as replacing rows.
    fn parse_upsert(parser: &mut Parser) -> std::result::Result<Statement, ParserError> {
        let upsert = parser.next_token();
        let mut statement = parser.parse_insert(upsert)?;
        match &mut statement {
            Statement::Insert(insert) => {
                insert.replace_into = true;
                Ok(statement)
            }
            _ => Err(ParserError::ParserError(
                "expected UPSERT INTO table ...".into(),
            )),
        }
    }
}

/// Forwards GenericDialect's settings (all of them flags).
macro_rules! generic_flags {
    ($($name:ident),* $(,)?) => {
        $(fn $name(&self) -> bool {
            GenericDialect.$name()
        })*
    };
}

impl Dialect for NyalaDialect {
    fn dialect(&self) -> TypeId {
        TypeId::of::<GenericDialect>()
    }

    /// The generic dialect's precedences, except that PostgreSQL's other operators (JSON's
    /// `->` and `->>`) bind tighter than comparisons, as in PostgreSQL: `doc->>'a' = 'x'`.
    fn prec_value(&self, prec: Precedence) -> u8 {
        match prec {
            Precedence::PgOther => 25,
            other => GenericDialect.prec_value(other),
        }
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        GenericDialect.is_delimited_identifier_start(ch)
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        GenericDialect.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        GenericDialect.is_identifier_part(ch)
    }

    fn parse_prefix(&self, _parser: &mut Parser) -> Option<std::result::Result<Expr, ParserError>> {
        match self.expressions_left.get().checked_sub(1) {
            Some(left) => {
                self.expressions_left.set(left);
                None
            }
            None => Some(Err(ParserError::ParserError(
                "the statement is too complex to parse (its expressions nest too deeply)".into(),
            ))),
        }
    }

    fn parse_statement(
        &self,
        parser: &mut Parser,
    ) -> Option<std::result::Result<Statement, ParserError>> {
        match &parser.peek_token_ref().token {
            Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("UPSERT") => {
                Some(Self::parse_upsert(parser))
            }
            _ => None,
        }
    }

    fn parse_column_option(
        &self,
        parser: &mut Parser,
    ) -> std::result::Result<
        Option<std::result::Result<Option<ColumnOption>, ParserError>>,
        ParserError,
    > {
        if parser.parse_keywords(&[
            Keyword::GENERATED,
            Keyword::ALWAYS,
            Keyword::AS,
            Keyword::POSITION,
        ]) {
            return Ok(Some(Ok(Some(StorageOption::Position.to_column_option()))));
        }
        let storage = match parser.parse_one_of_keywords(&[Keyword::ENCODING, Keyword::COMPRESSION])
        {
            Some(Keyword::ENCODING) => StorageOption::Encoding,
            Some(_) => StorageOption::Compression,
            None => return Ok(None),
        };
        let name = parser.parse_identifier()?;
        Ok(Some(Ok(Some(storage(name.value).to_column_option()))))
    }

    fn is_table_factor_alias(&self, explicit: bool, kw: &Keyword, parser: &mut Parser) -> bool {
        // sqlparser has just taken the word `kw` (after AS if `explicit`) as a possible alias.
        let at = parser.get_current_token().span;
        let clause = match (explicit, kw) {
            (true, Keyword::OF) => true,
            (false, Keyword::FOR) => {
                parser.parse_keywords(&[Keyword::SYSTEM_TIME, Keyword::AS, Keyword::OF])
            }
            _ => false,
        };
        if !clause {
            return GenericDialect.is_table_factor_alias(explicit, kw, parser);
        }
        let parsed = match parser.parse_expr() {
            Err(e) => Err(format!("AS OF needs a time: {e}")),
            Ok(time) => match parser.maybe_parse_table_alias() {
                Ok(alias) => Ok((time, alias)),
                Err(e) => Err(e.to_string()),
            },
        };
        self.time_travel.borrow_mut().push((at, parsed));
        // The word stands in for the alias until the clause is attached; if the clause did
        // not parse, the statement fails with its error.
        true
    }

    generic_flags!(
        supports_unicode_string_literal,
        supports_partition_by_after_order_by,
        supports_array_join_syntax,
        supports_group_by_expr,
        supports_group_by_with_modifier,
        supports_left_associative_joins_without_parens,
        supports_connect_by,
        supports_match_recognize,
        supports_pipe_operator,
        supports_start_transaction_modifier,
        supports_window_function_null_treatment_arg,
        supports_dictionary_syntax,
        supports_window_clause_named_window_reference,
        supports_parenthesized_set_variables,
        supports_select_wildcard_except,
        support_map_literal_syntax,
        allow_extract_custom,
        allow_extract_single_quotes,
        supports_extract_comma_syntax,
        supports_create_view_comment_syntax,
        supports_parens_around_table_factor,
        supports_values_as_table_factor,
        supports_create_index_with_clause,
        supports_explain_with_utility_options,
        supports_limit_comma,
        supports_update_order_by,
        supports_from_first_select,
        supports_projection_trailing_commas,
        supports_asc_desc_in_column_definition,
        supports_try_convert,
        supports_bitwise_shift_operators,
        supports_comment_on,
        supports_load_extension,
        supports_named_fn_args_with_assignment_operator,
        supports_struct_literal,
        supports_empty_projections,
        supports_nested_comments,
        supports_multiline_comment_hints,
        supports_user_host_grantee,
        supports_string_escape_constant,
        supports_array_typedef_with_brackets,
        supports_match_against,
        supports_set_names,
        supports_comma_separated_set_assignments,
        supports_filter_during_aggregation,
        supports_select_wildcard_exclude,
        supports_data_type_signed_suffix,
        supports_interval_options,
        supports_quote_delimited_string,
        supports_select_wildcard_replace,
        supports_select_wildcard_ilike,
        supports_select_wildcard_rename,
        supports_optimize_table,
        supports_install,
        supports_detach,
        supports_prewhere,
        supports_with_fill,
        supports_limit_by,
        supports_interpolate,
        supports_settings,
        supports_select_format,
        supports_comment_optimizer_hint,
        supports_constraint_keyword_without_name,
        supports_key_column_option,
        supports_comma_separated_trim,
        supports_cte_without_as,
        supports_select_item_multi_column_alias,
        supports_xml_expressions,
    );
}
