//! sqlparser's statements sorted: those Nyala answers itself (DROP TABLE, DESCRIBE, ALTER
//! TABLE, UPDATE ... FROM, ...) become [`NyalaStatement`]s of their own, the rest go to
//! DataFusion as they are.

use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, ConflictTarget, CopyTarget, Ident, ObjectType, OnConflictAction, OnInsert,
    RenameTableNameKind, ShowCreateObject, Statement,
};

use crate::parse::columns;
use crate::parse::parser::copy;
use crate::parse::table_options::table_options;

use crate::parse::statement::{
    normalize_ident, object_name, Ddl, NyalaStatement, OnConflictSpec, Show,
};
use crate::{Result, SqlError};

/// The statements sqlparser parsed that Nyala answers itself, classified; the others are
/// DataFusion's.
pub(crate) fn classify(statement: Statement) -> Result<NyalaStatement> {
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
            if view.materialized || view.if_not_exists {
                return Err(SqlError::NotSupported(
                    "materialized views and IF NOT EXISTS in CREATE VIEW".into(),
                ));
            }
            let name = object_name(&view.name)?;
            // `CREATE VIEW v (a, b) AS q` is the view of `q` with its columns renamed.
            let sql = match view.columns.as_slice() {
                [] => view.query.to_string(),
                columns => {
                    let names: Vec<String> = columns.iter().map(|c| c.name.to_string()).collect();
                    let alias = Ident::with_quote('"', &name);
                    format!(
                        "SELECT * FROM ({}) AS {alias} ({})",
                        view.query,
                        names.join(", ")
                    )
                }
            };
            NyalaStatement::Ddl(Ddl::CreateView {
                name,
                sql,
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
            [AlterTableOperation::SetOptionsParens { options }] => {
                let history_max_age_secs = table_options(options, true)?
                    .history_max_age_secs
                    .ok_or_else(|| SqlError::Parse("ALTER TABLE ... SET () sets nothing".into()))?;
                NyalaStatement::Ddl(Ddl::SetTableOptions {
                    name: object_name(&alter.name)?,
                    history_max_age_secs,
                })
            }
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
        Statement::Merge(merge) => NyalaStatement::Merge(Box::new(merge)),
        Statement::Copy {
            source,
            to,
            target: target @ (CopyTarget::File { .. } | CopyTarget::Program { .. }),
            options,
            legacy_options,
            ..
        } => NyalaStatement::CopyFile(copy::copy_file(
            source,
            to,
            target,
            options,
            legacy_options,
        )?),
        Statement::Explain { statement, .. } if matches!(*statement, Statement::Merge(_)) => {
            return Err(SqlError::NotSupported("EXPLAIN of MERGE".into()))
        }
        Statement::Insert(mut insert) if insert.on.is_some() => {
            let conflict =
                match insert.on.take() {
                    Some(OnInsert::OnConflict(conflict)) => conflict,
                    _ => return Err(SqlError::NotSupported(
                        "ON DUPLICATE KEY UPDATE (write INSERT ... ON CONFLICT (key) DO UPDATE \
                         SET ...)"
                            .into(),
                    )),
                };
            if insert.ignore || insert.replace_into {
                return Err(SqlError::Invalid(
                    "ON CONFLICT goes with a plain INSERT, not INSERT IGNORE or UPSERT".into(),
                ));
            }
            let target = match conflict.conflict_target {
                None => None,
                Some(ConflictTarget::Columns(columns)) => {
                    Some(columns.iter().map(normalize_ident).collect())
                }
                Some(ConflictTarget::OnConstraint(name)) => {
                    return Err(SqlError::NotSupported(format!(
                        "ON CONFLICT ON CONSTRAINT {name}: name the primary key's columns"
                    )))
                }
            };
            let update = match conflict.action {
                OnConflictAction::DoNothing => None,
                OnConflictAction::DoUpdate(update) => Some(update),
            };
            NyalaStatement::InsertOnConflict(OnConflictSpec {
                insert: Box::new(insert),
                target,
                update,
            })
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
