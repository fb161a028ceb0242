//! Privileges: what a statement needs ([`Requirements`], read from the parsed statement before
//! anything is planned) and whether the session's user holds it ([`Session::authorize`]).
//!
//! Authorization is on as soon as the catalog holds a user (the administrator `nyala serve
//! --user/--password` creates at first start); before that every session may do everything.
//! The administrator may do everything; a table's or view's owner (its creator) everything on
//! it; other users what was granted to them. A statement needs SELECT on every table and view
//! it reads (joins, subqueries, `AS OF`), INSERT / UPDATE / DELETE on the table it writes
//! (UPSERT: INSERT and UPDATE), ownership for DDL on an object and for GRANT / REVOKE, and the
//! administrator for user management. A view is read with its owner's privileges, as in
//! PostgreSQL: SELECT on the view is all its reader needs.

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::resolve::resolve_table_references;
use datafusion::sql::sqlparser::ast::{
    visit_relations, Expr, FromTable, FunctionArg, FunctionArgExpr, MergeAction, MergeInsertKind,
    Statement, TableFactor, TableObject, Value, Visit, Visitor,
};
use nyala_engine::{Client, Privilege};
use parking_lot::RwLock;

use crate::functions::as_of;
use crate::functions::changes;
use crate::functions::tail;
use crate::parse::statement::{object_name, Ddl, NyalaStatement, Show};
use crate::Result;
use crate::SqlError;

/// The user a session runs as (shared with the session's schema providers, which list only
/// what the user may see). None: not authenticated (fine while there are no users).
#[derive(Debug, Default)]
pub struct Principal(RwLock<Option<Login>>);

/// A user as it logged in: its name and the hash of the password it logged in with (a new
/// password ends the sessions of the old one, but for the session that set it).
#[derive(Clone, PartialEq, Eq)]
pub struct Login {
    pub name: String,
    pub password_hash: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Principal {
    pub fn name(&self) -> Option<String> {
        self.0.read().as_ref().map(|login| login.name.clone())
    }

    pub fn login(&self) -> Option<Login> {
        self.0.read().clone()
    }

    pub fn set(&self, login: Option<Login>) {
        *self.0.write() = login;
    }
}

/// One thing a statement needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requirement {
    /// `privilege` on the table or view.
    Privilege(String, Privilege),
    /// Owning the table or view (DDL, GRANT, REVOKE).
    Owner(String),
    /// Any privilege on it (DESCRIBE, SHOW CREATE TABLE, SHOW PARTITIONS).
    Visible(String),
    /// Being the administrator (user management, backups): what only it does, for the error.
    Admin(&'static str),
    /// Being the administrator or the user named (ALTER USER of one's own password).
    AdminOrSelf(String),
}

/// What a statement needs, all of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Requirements(Vec<Requirement>);

impl Requirements {
    pub(crate) fn owner(name: &str) -> Self {
        Self(vec![Requirement::Owner(name.to_string())])
    }

    pub(crate) fn privilege(name: &str, privilege: Privilege) -> Self {
        Self(vec![Requirement::Privilege(name.to_string(), privilege)])
    }

    /// What `statement` needs (nothing is planned: names not in the catalog are left for
    /// planning to report).
    pub(crate) fn of(statement: &NyalaStatement) -> Result<Self> {
        let mut needs = Requirements::default();
        match statement {
            NyalaStatement::Ddl(ddl) => needs.ddl(ddl)?,
            // A clone holds the source's rows: reading them is what it needs.
            NyalaStatement::CloneTable { source, .. } => needs
                .0
                .push(Requirement::Privilege(source.clone(), Privilege::Select)),
            NyalaStatement::CreateTableAs(ctas) => {
                needs.reads(&Statement::Query(ctas.query.clone()), None)?
            }
            NyalaStatement::Show(show) => match show {
                Show::Describe(name) | Show::CreateTable(name) | Show::Partitions(name) => {
                    needs.0.push(Requirement::Visible(name.clone()))
                }
                Show::Tables | Show::Setting(_) | Show::Grants => {}
            },
            NyalaStatement::DataFusion(statement) | NyalaStatement::InsertIgnore(statement) => {
                needs.statement(statement)?
            }
            NyalaStatement::UpdateFrom { update, .. } => {
                let statement = Statement::Update(update.as_ref().clone());
                needs.statement(&statement)?
            }
            // DO UPDATE also changes rows that exist, as PostgreSQL's needs UPDATE for.
            NyalaStatement::InsertOnConflict(spec) => {
                needs.statement(&Statement::Insert(spec.insert.as_ref().clone()))?;
                if let (Some(update), TableObject::TableName(name)) =
                    (&spec.update, &spec.insert.table)
                {
                    needs.push(&object_name(name)?, Privilege::Update);
                    // What its expressions read (subqueries).
                    let values = update.assignments.iter().map(|a| a.value.to_string());
                    let mut sql = format!("SELECT {}", values.collect::<Vec<_>>().join(", "));
                    if let Some(selection) = &update.selection {
                        sql.push_str(&format!(" WHERE {selection}"));
                    }
                    needs.query_reads(&sql)?;
                }
            }
            // MERGE reads its target's rows (its ON condition), changes them as its clauses
            // say, and reads its source and what its expressions read (subqueries).
            NyalaStatement::Merge(merge) => {
                if let Some(target) = table_factor_name(&merge.table)? {
                    needs.push(&target, Privilege::Select);
                    for clause in &merge.clauses {
                        let privilege = match clause.action {
                            MergeAction::Insert(_) => Privilege::Insert,
                            MergeAction::Update(_) => Privilege::Update,
                            MergeAction::Delete { .. } => Privilege::Delete,
                        };
                        needs.push(&target, privilege);
                    }
                }
                let mut read = vec![merge.on.to_string()];
                for clause in &merge.clauses {
                    read.extend(clause.predicate.iter().map(ToString::to_string));
                    match &clause.action {
                        MergeAction::Insert(insert) => {
                            if let MergeInsertKind::Values(values) = &insert.kind {
                                read.extend(
                                    values
                                        .rows
                                        .iter()
                                        .flat_map(|r| r.content.iter())
                                        .map(ToString::to_string),
                                );
                            }
                        }
                        MergeAction::Update(update) => {
                            read.extend(update.assignments.iter().map(|a| a.value.to_string()))
                        }
                        MergeAction::Delete { .. } => {}
                    }
                }
                needs.query_reads(&format!("SELECT {} FROM {}", read.join(", "), merge.source))?;
            }
            NyalaStatement::CopyFile(_) => {
                (needs.0).push(Requirement::Admin("copies to and from files on the server"))
            }
            NyalaStatement::Backup(_) => needs.0.push(Requirement::Admin("takes backups")),
            NyalaStatement::Restore(_) => needs.0.push(Requirement::Admin("restores backups")),
        }
        Ok(needs)
    }

    fn ddl(&mut self, ddl: &Ddl) -> Result<()> {
        match ddl {
            Ddl::CreateTable(_) => {}
            Ddl::CloneTable { source, .. } => {
                (self.0).push(Requirement::Privilege(source.clone(), Privilege::Select))
            }
            Ddl::DropTable { name, .. }
            | Ddl::RenameTable { name, .. }
            | Ddl::AlterColumns { name, .. }
            | Ddl::SetTableOptions { name, .. }
            | Ddl::AlterRangePartition { name, .. }
            | Ddl::DropView { name, .. }
            | Ddl::Privileges { object: name, .. } => self.0.push(Requirement::Owner(name.clone())),
            Ddl::CreateView { name, sql, .. } => {
                // Replacing a view needs owning it; its creator must read what it reads.
                self.0.push(Requirement::Owner(name.clone()));
                self.query_reads(sql)?;
            }
            Ddl::CreateUser { .. } | Ddl::DropUser { .. } => {
                self.0.push(Requirement::Admin("manages users"))
            }
            Ddl::AlterUser { name, .. } => self.0.push(Requirement::AdminOrSelf(name.clone())),
        }
        Ok(())
    }

    /// SELECT on what the query `sql` (a view's) reads.
    fn query_reads(&mut self, sql: &str) -> Result<()> {
        for statement in datafusion::sql::parser::DFParser::parse_sql(sql)? {
            if let DFStatement::Statement(statement) = statement {
                self.reads(&statement, None)?;
            }
        }
        Ok(())
    }

    /// A statement DataFusion plans: the table it writes, and what it reads.
    fn statement(&mut self, statement: &Statement) -> Result<()> {
        let target = match statement {
            Statement::Explain { statement, .. } => return self.statement(statement),
            Statement::Insert(insert) => match &insert.table {
                TableObject::TableName(name) => {
                    let name = object_name(name)?;
                    self.push(&name, Privilege::Insert);
                    if insert.replace_into {
                        // UPSERT replaces rows.
                        self.push(&name, Privilege::Update);
                    }
                    Some(name)
                }
                TableObject::TableFunction(_) | TableObject::TableQuery(_) => None,
            },
            Statement::Update(update) => {
                let name = table_factor_name(&update.table.relation)?;
                if let Some(name) = &name {
                    self.push(name, Privilege::Update);
                }
                name
            }
            Statement::Delete(delete) => {
                let from = match &delete.from {
                    FromTable::WithFromKeyword(tables) | FromTable::WithoutKeyword(tables) => {
                        tables
                    }
                };
                let name = match from.as_slice() {
                    [table] => table_factor_name(&table.relation)?,
                    _ => None,
                };
                if let Some(name) = &name {
                    self.push(name, Privilege::Delete);
                }
                name
            }
            _ => None,
        };
        self.reads(statement, target.as_deref())
    }

    /// SELECT on every table and view `statement` reads, and on `target` (the table it writes)
    /// where the statement names it again (`INSERT INTO t SELECT ... FROM t`, a subquery).
    fn reads(&mut self, statement: &Statement, target: Option<&str>) -> Result<()> {
        if let Some(target) = target {
            let mut named = 0;
            let _ = visit_relations(statement, |relation| {
                if object_name(relation).is_ok_and(|n| n == target) {
                    named += 1;
                }
                std::ops::ControlFlow::<()>::Continue(())
            });
            if named > 1 {
                self.push(target, Privilege::Select);
            }
        }
        let (tables, _ctes) =
            resolve_table_references(&DFStatement::Statement(Box::new(statement.clone())), true)?;
        for table in tables {
            let public = table.schema().is_none_or(|s| s == crate::SCHEMA_NAME);
            let name = table.table();
            let reads_by_name =
                name == as_of::FUNCTION || name == tail::FUNCTION || name == changes::FUNCTION;
            if public && !reads_by_name && Some(name) != target {
                self.push(name, Privilege::Select);
            }
        }
        // `nyala_as_of('t', time)` written out, `tail('t', ...)` and `changes('t', ...)` read t.
        let mut direct = AsOfCalls::default();
        let _ = statement.visit(&mut direct);
        for name in direct.tables {
            self.push(&name?, Privilege::Select);
        }
        Ok(())
    }

    fn push(&mut self, name: &str, privilege: Privilege) {
        let requirement = Requirement::Privilege(name.to_string(), privilege);
        if !self.0.contains(&requirement) {
            self.0.push(requirement);
        }
    }
}

/// The table a DML statement names, if it is a plain table reference.
fn table_factor_name(factor: &TableFactor) -> Result<Option<String>> {
    match factor {
        TableFactor::Table {
            name, args: None, ..
        } => object_name(name).map(Some),
        _ => Ok(None),
    }
}

/// The tables named in calls of the table functions that read a table named by their first
/// argument (`nyala_as_of`, written out, and `tail`).
#[derive(Default)]
struct AsOfCalls {
    tables: Vec<Result<String>>,
}

impl Visitor for AsOfCalls {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> std::ops::ControlFlow<()> {
        if let TableFactor::Table {
            name,
            args: Some(args),
            ..
        } = factor
        {
            let function = object_name(name).ok();
            let function = function
                .filter(|n| n == as_of::FUNCTION || n == tail::FUNCTION || n == changes::FUNCTION);
            if let Some(function) = function {
                let table = match args.args.first() {
                    Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(value)))) => {
                        match &value.value {
                            Value::SingleQuotedString(name) => Ok(name.clone()),
                            _ => Err(()),
                        }
                    }
                    _ => Err(()),
                };
                self.tables.push(table.map_err(|()| {
                    SqlError::Invalid(format!("{function} takes a table name as a string literal"))
                }));
            }
        }
        std::ops::ControlFlow::Continue(())
    }
}

/// The catalog's answer to "may this user do that".
pub(crate) struct Authorizer<'a> {
    pub client: &'a Client,
}

impl Authorizer<'_> {
    /// Whether `user` is the administrator (authorization off: everyone is).
    pub(crate) fn is_admin(&self, user: Option<&str>) -> bool {
        let users = self.client.users();
        users.is_empty() || user.is_some_and(|user| users.iter().any(|u| u.name == user && u.admin))
    }

    /// Whether `user` may see the table or view `name` (it owns it, or holds a privilege on it).
    pub(crate) fn sees(&self, user: Option<&str>, name: &str) -> bool {
        if self.is_admin(user) {
            return true;
        }
        let Some(user) = user else { return false };
        match self.client.table(name) {
            Ok(table) => table.access.sees(user),
            Err(_) => self
                .client
                .view(name)
                .is_some_and(|view| view.access.sees(user)),
        }
    }

    /// Ok if `user` holds everything `needs` asks; else an error naming what is missing.
    pub(crate) fn check(&self, user: Option<&str>, needs: &Requirements) -> Result<()> {
        if self.is_admin(user) {
            return Ok(());
        }
        let Some(user) = user else {
            return Err(denied("the session has not authenticated".into()));
        };
        if self.client.user(user).is_none() {
            return Err(denied(format!("user {user} no longer exists")));
        }
        for need in &needs.0 {
            self.check_one(user, need)?;
        }
        Ok(())
    }

    fn check_one(&self, user: &str, need: &Requirement) -> Result<()> {
        match need {
            Requirement::Admin(what) => Err(denied(format!(
                "only the administrator {what}, and {user} is not it"
            ))),
            Requirement::AdminOrSelf(name) if name == user => Ok(()),
            Requirement::AdminOrSelf(name) => Err(denied(format!(
                "only the administrator changes the password of {name}"
            ))),
            Requirement::Owner(name) => {
                let owner = match self.client.table(name) {
                    Ok(table) => table.access.owner.clone(),
                    Err(_) => match self.client.view(name) {
                        Some(view) => view.access.owner.clone(),
                        // Missing: the statement itself reports it.
                        None => return Ok(()),
                    },
                };
                match owner.as_deref() == Some(user) {
                    true => Ok(()),
                    false => Err(denied(format!(
                        "{name} belongs to {}; only its owner or the administrator may change \
                         it or grant privileges on it",
                        owner.as_deref().unwrap_or("the administrator")
                    ))),
                }
            }
            Requirement::Visible(name) => match self.sees(Some(user), name) {
                true => Ok(()),
                false => Err(denied(format!(
                    "user {user} holds no privilege on table {name}"
                ))),
            },
            Requirement::Privilege(name, privilege) => self.check_privilege(user, name, *privilege),
        }
    }

    /// `privilege` on a table, or SELECT on a view and, with its owner's privileges, on what
    /// the view reads.
    fn check_privilege(&self, user: &str, name: &str, privilege: Privilege) -> Result<()> {
        if let Ok(table) = self.client.table(name) {
            return match table.access.allows(user, privilege) {
                true => Ok(()),
                false => Err(denied(format!(
                    "user {user} lacks the {privilege} privilege on table {name}"
                ))),
            };
        }
        let Some(view) = self.client.view(name) else {
            return Ok(());
        };
        if privilege != Privilege::Select {
            return Err(SqlError::Invalid(format!(
                "{name} is a view: it cannot be written to"
            )));
        }
        if !view.access.allows(user, privilege) {
            return Err(denied(format!(
                "user {user} lacks the SELECT privilege on view {name}"
            )));
        }
        // A view created while authorization was off reads as the administrator.
        let Some(owner) = view.access.owner.clone() else {
            return Ok(());
        };
        let mut needs = Requirements::default();
        needs.query_reads(&view.sql)?;
        // The view reads with its owner's privileges (the catalog has no cycles of views).
        self.check(Some(&owner), &needs).map_err(|e| match e {
            SqlError::PermissionDenied(why) => denied(format!("view {name} cannot be read: {why}")),
            other => other,
        })
    }
}

fn denied(why: String) -> SqlError {
    SqlError::PermissionDenied(why)
}

/// `sql` with the string after every `PASSWORD` replaced by `'***'`, for whatever shows or
/// logs statement text (`CREATE USER ... PASSWORD '...'`).
pub fn redact_passwords(sql: &str) -> std::borrow::Cow<'_, str> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    if !sql.to_ascii_uppercase().contains("PASSWORD") {
        return sql.into();
    }
    let Ok(mut tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        // Not even tokens: nothing a password could be told apart in.
        return "(a statement with PASSWORD that does not parse; not shown)".into();
    };
    let mut after_password = false;
    for token in &mut tokens {
        match token {
            Token::Whitespace(_) | Token::Eq => continue,
            Token::Word(w) if w.value.eq_ignore_ascii_case("PASSWORD") => after_password = true,
            Token::SingleQuotedString(secret) if after_password => {
                *secret = "***".into();
                after_password = false;
            }
            _ => after_password = false,
        }
    }
    tokens
        .iter()
        .map(Token::to_string)
        .collect::<String>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_from_statement_text() {
        let sql = "CREATE USER bob WITH PASSWORD 'hunter2 and more'";
        assert_eq!(redact_passwords(sql), "CREATE USER bob WITH PASSWORD '***'");
        assert_eq!(
            redact_passwords("alter user x password='it''s'"),
            "alter user x password='***'"
        );
        assert_eq!(redact_passwords("SELECT 'x'"), "SELECT 'x'");
        assert!(!redact_passwords("CREATE USER b PASSWORD 'unterminated").contains("unterm"));
    }
}
