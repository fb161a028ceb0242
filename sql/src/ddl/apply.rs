//! DDL applied: the catalog changes a [`Ddl`] statement asks for, and CREATE TABLE ... AS
//! SELECT, which is a CREATE TABLE and an INSERT that succeed or fail together.
//!
//! DDL reaches the engine as the parser produced it; nothing is planned in between, so what a
//! statement means is decided in one place (the parser and [`crate::parse::columns`]), and only what
//! depends on the catalog at the moment it runs (does the table exist, does a column) is
//! decided here.

use datafusion::execution::SendableRecordBatchStream;
use datafusion::sql::sqlparser::ast::Statement;
use futures::TryStreamExt;
use nyala_engine::catalog::hash_password;
use nyala_engine::{Access, Client, ColumnChange, DdlOp, UserInfo, ViewInfo};

use crate::functions::as_of;
use crate::limits::interrupt::Interrupt;
use crate::parse::statement::{CreateTableAsSpec, CreateTableSpec, Ddl, Nullability};
use crate::plan::planned::Action;
use crate::results::{count_batch, one_stream};
use crate::session::Session;
use crate::{Result, SqlError};

impl Ddl {
    /// Applies the change to the catalog: the statement becomes the catalog's [`DdlOp`] once
    /// what depends on the catalog now (IF [NOT] EXISTS of a column) is decided.
    /// `user`: the session's, who owns what it creates.
    pub(crate) async fn apply(self, client: &Client, user: Option<String>) -> Result<()> {
        let op = match self {
            Ddl::CreateTable(spec) => create_op(spec, user),
            Ddl::CloneTable {
                name,
                source,
                if_not_exists,
                as_of,
            } => DdlOp::CloneTable {
                name,
                source,
                as_of,
                if_not_exists,
                owner: user,
            },
            Ddl::DropTable { name, if_exists } => DdlOp::DropTable { name, if_exists },
            Ddl::RenameTable { name, new_name } => DdlOp::RenameTable { name, new_name },
            Ddl::CreateView {
                name,
                sql,
                or_replace,
            } => DdlOp::CreateView {
                view: ViewInfo {
                    name,
                    sql,
                    access: Access::owned_by(user),
                },
                or_replace,
            },
            Ddl::CreateUser {
                name,
                password,
                if_not_exists,
            } if client.users().is_empty() => {
                let _ = (name, password, if_not_exists);
                return Err(SqlError::Invalid(
                    "authentication is off, so there is no administrator to manage users: start \
                     the server with --user and --password once to create the administrator"
                        .into(),
                ));
            }
            Ddl::CreateUser {
                name,
                password,
                if_not_exists,
            } => DdlOp::CreateUser {
                user: UserInfo::new(&name, &password.0, false)?,
                if_not_exists,
            },
            Ddl::AlterUser { name, password } => DdlOp::AlterUser {
                name,
                password_hash: hash_password(&password.0)?,
                scram: Some(nyala_engine::ScramVerifier::new(&password.0)),
            },
            Ddl::DropUser { name, if_exists } => {
                if !if_exists && client.user(&name).is_none() {
                    return Err(SqlError::Invalid(format!("no user {name}")));
                }
                DdlOp::DropUser { name, if_exists }
            }
            Ddl::Privileges {
                object,
                user,
                privileges,
                grant,
            } => DdlOp::Privileges {
                object,
                user,
                privileges,
                grant,
            },
            Ddl::DropView { name, if_exists } => DdlOp::DropView { name, if_exists },
            Ddl::AlterColumns { name, changes } => {
                let schema = client.table(&name)?.schema.clone();
                let changes: Vec<ColumnChange> = changes
                    .into_iter()
                    .filter(|c| {
                        let skip = match &c.change {
                            ColumnChange::Add(column) => {
                                schema.column_index(&column.name).is_some()
                            }
                            ColumnChange::Drop(column) => schema.column_index(column).is_none(),
                            ColumnChange::Rename { .. } => false,
                        };
                        !(c.if_exists && skip)
                    })
                    .map(|c| c.change)
                    .collect();
                if changes.is_empty() {
                    return Ok(());
                }
                DdlOp::AlterColumns { name, changes }
            }
            Ddl::SetTableOptions {
                name,
                history_max_age_secs,
            } => DdlOp::SetHistoryMaxAge {
                name,
                secs: history_max_age_secs,
            },
            Ddl::AlterRangePartition {
                name,
                add: true,
                range,
            } => DdlOp::AddRangePartition { name, range },
            Ddl::AlterRangePartition {
                name,
                add: false,
                range,
            } => DdlOp::DropRangePartition { name, range },
        };
        client.ddl(op).await?;
        Ok(())
    }
}

fn create_op(spec: CreateTableSpec, owner: Option<String>) -> DdlOp {
    DdlOp::CreateTable {
        owner,
        name: spec.name,
        schema: spec.schema,
        partition: spec.partition,
        if_not_exists: spec.if_not_exists,
        replicas: spec.replicas,
    }
}

impl Session {
    /// The table of a CREATE TABLE ... AS SELECT takes the query's column names, types and
    /// nullability; the key columns are NOT NULL.
    pub(crate) async fn plan_create_table_as(&self, ctas: CreateTableAsSpec) -> Result<Action> {
        let mut query = ctas.query;
        as_of::lower(&mut query)?;
        let text = query.to_string();
        let plan = self.logical_plan(Box::new(Statement::Query(query))).await?;
        let mut spec = CreateTableSpec::from_arrow(
            &ctas.name,
            plan.schema().fields(),
            "the query",
            Nullability::FromFields,
            &ctas.key,
            &ctas.partition,
        )?;
        spec.if_not_exists = ctas.if_not_exists;
        spec.replicas = ctas.replicas;
        spec.schema = spec
            .schema
            .with_history_max_age_secs(ctas.history_max_age_secs);
        Ok(Action::CreateTableAs {
            insert: format!("INSERT INTO \"{}\" {text}", ctas.name.replace('"', "\"\"")),
            spec,
        })
    }

    /// Creates the table, then inserts the query's rows; a failed insert drops the table again.
    pub(crate) async fn create_table_as(
        &self,
        spec: CreateTableSpec,
        insert: &str,
        interrupt: Interrupt,
    ) -> Result<SendableRecordBatchStream> {
        let client = &self.db.client;
        let name = spec.name.clone();
        if !client.ddl(create_op(spec, self.user())).await? {
            // IF NOT EXISTS and the table exists: nothing is inserted.
            return one_stream(vec![count_batch(0)]);
        }
        let inserted = async {
            let planned = self.plan(insert).await?;
            match planned.action {
                // Boxed: executing a statement may create a table as, statically, this does.
                Action::Plan(_) => Ok(Box::pin(planned.apply(interrupt))
                    .await?
                    .try_collect()
                    .await?),
                _ => Err(SqlError::Invalid(format!("cannot run {insert}"))),
            }
        }
        .await;
        match inserted {
            Ok(batches) => one_stream(batches),
            Err(e) => {
                // A failed CREATE TABLE ... AS SELECT leaves no table behind.
                let drop = DdlOp::DropTable {
                    name,
                    if_exists: true,
                };
                client.ddl(drop).await?;
                Err(e)
            }
        }
    }
}
