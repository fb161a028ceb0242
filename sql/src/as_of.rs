//! Time travel: `SELECT ... FROM t AS OF <time>` (also `FOR SYSTEM_TIME AS OF <time>`).
//!
//! DataFusion's SQL planner ignores table versions, so the clause is rewritten before parsing:
//! `t AS OF <expr> [alias]` becomes `nyala_as_of('t', <expr>) AS alias` (the alias defaults to
//! the table name, so `t.column` keeps working). The table function evaluates `<expr>` (a
//! constant such as `TIMESTAMP '2026-11-23 10:00:00'` or `now() - INTERVAL '5 minutes'`, in
//! UTC) and returns the table with every scan of it pinned to that time. Storage refuses times
//! older than the history retention with a clear error.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, TimeUnit};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::ColumnarValue;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Word};
use nyala_engine::Client;
use nyala_storage::Timestamp;

use crate::statement::{is_trivia, is_word};
use crate::table::NyalaTable;
use crate::{Result, SqlError};

pub const FUNCTION: &str = "nyala_as_of";

/// Rewrites every `AS OF` clause after a table name into a call of [`FUNCTION`].
pub fn rewrite(tokens: Vec<Token>) -> Result<Vec<Token>> {
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let Some(expr_start) = clause_at(&tokens, i) else {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        };
        // Not after a table name (a column alias "of", say): left to the parser.
        let Some((name, alias_word)) = take_table_name(&mut out) else {
            out.push(tokens[i].clone());
            i += 1;
            continue;
        };
        let mut parser = Parser::new(&GenericDialect {}).with_tokens(tokens[expr_start..].to_vec());
        parser
            .parse_expr()
            .map_err(|e| SqlError::Parse(format!("AS OF needs a time: {e}")))?;
        let expr_end = expr_start + parser.index();
        out.push(Token::make_word(FUNCTION, None));
        out.push(Token::LParen);
        out.push(Token::SingleQuotedString(name));
        out.push(Token::Comma);
        out.extend(tokens[expr_start..expr_end].iter().cloned());
        out.push(Token::RParen);
        if !has_alias(&tokens[expr_end..]) {
            out.push(Token::Whitespace(
                datafusion::sql::sqlparser::tokenizer::Whitespace::Space,
            ));
            out.push(Token::make_keyword("AS"));
            out.push(Token::Whitespace(
                datafusion::sql::sqlparser::tokenizer::Whitespace::Space,
            ));
            out.push(Token::Word(alias_word));
        }
        i = expr_end;
    }
    Ok(out)
}

/// If `FOR SYSTEM_TIME AS OF` or `AS OF` starts at `i`, the index after it.
fn clause_at(tokens: &[Token], i: usize) -> Option<usize> {
    let mut j = i;
    let expect = |word: &str, j: &mut usize| -> bool {
        while *j < tokens.len() && is_trivia(&tokens[*j]) {
            *j += 1;
        }
        if *j < tokens.len() && is_word(&tokens[*j], word) {
            *j += 1;
            true
        } else {
            false
        }
    };
    if is_word(&tokens[i], "FOR") {
        j += 1;
        return (expect("SYSTEM_TIME", &mut j) && expect("AS", &mut j) && expect("OF", &mut j))
            .then_some(j);
    }
    if is_word(&tokens[i], "AS") {
        j += 1;
        return expect("OF", &mut j).then_some(j);
    }
    None
}

/// Pops a table name (`a`, `a.b` or `a.b.c`) and the trivia after it from the end of `out` if
/// it follows FROM, JOIN or a comma. Returns its text and its last part (the default alias).
fn take_table_name(out: &mut Vec<Token>) -> Option<(String, Word)> {
    let mut end = out.len();
    while end > 0 && is_trivia(&out[end - 1]) {
        end -= 1;
    }
    let mut start = end;
    loop {
        match out.get(start.checked_sub(1)?) {
            Some(Token::Word(_)) => start -= 1,
            _ => return None,
        }
        if start > 0 && out[start - 1] == Token::Period {
            start -= 1;
        } else {
            break;
        }
    }
    let mut before = start;
    while before > 0 && is_trivia(&out[before - 1]) {
        before -= 1;
    }
    let after_from = before > 0
        && (is_word(&out[before - 1], "FROM")
            || is_word(&out[before - 1], "JOIN")
            || out[before - 1] == Token::Comma);
    if !after_from {
        return None;
    }
    let Token::Word(last) = out[end - 1].clone() else {
        return None;
    };
    let name: String = out[start..end].iter().map(Token::to_string).collect();
    out.truncate(start);
    Some((name, last))
}

/// Whether the tokens after a table reference start with an alias.
fn has_alias(rest: &[Token]) -> bool {
    match rest.iter().find(|t| !is_trivia(t)) {
        Some(Token::Word(w)) => {
            w.keyword == Keyword::AS || w.quote_style.is_some() || w.keyword == Keyword::NoKeyword
        }
        _ => false,
    }
}

/// The `nyala_as_of(table, time)` table function.
#[derive(Debug)]
pub struct AsOfFunction {
    pub client: Client,
}

impl TableFunctionImpl for AsOfFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let [name, time] = args.exprs() else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION} takes a table name and a time"
            )));
        };
        let evaluate = |expr: &datafusion::logical_expr::Expr| -> DfResult<ScalarValue> {
            let physical = args
                .session()
                .create_physical_expr(expr.clone(), &DFSchema::empty())?;
            let one_row = RecordBatch::try_new_with_options(
                Arc::new(arrow::datatypes::Schema::empty()),
                vec![],
                &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
            )?;
            match physical.evaluate(&one_row)? {
                ColumnarValue::Scalar(value) => Ok(value),
                ColumnarValue::Array(array) => ScalarValue::try_from_array(&array, 0),
            }
        };
        let ScalarValue::Utf8(Some(name)) = evaluate(name)? else {
            return Err(DataFusionError::Plan(format!(
                "{FUNCTION}: the first argument is a table name"
            )));
        };
        let time = evaluate(time)?;
        let micros = match time.cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None)) {
            Ok(ScalarValue::TimestampMicrosecond(Some(micros), _)) => micros,
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "AS OF needs a time, got {time}"
                )))
            }
        };
        let reference = datafusion::common::TableReference::parse_str(&name);
        let table = self
            .client
            .table(reference.table())
            .map_err(|e| DataFusionError::Plan(e.to_string()))?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        if micros > now {
            return Err(DataFusionError::Plan(format!(
                "AS OF {} is in the future",
                Timestamp::from_micros(micros as u64).display()
            )));
        }
        // Every version written within that microsecond is included.
        let micros = u64::try_from(micros)
            .map_err(|_| DataFusionError::Plan(format!("AS OF {time} is before 1970")))?;
        let snapshot = Timestamp(Timestamp::from_micros(micros + 1).0 - 1);
        Ok(Arc::new(
            NyalaTable::new(self.client.clone(), table).pinned_at(snapshot),
        ))
    }
}
